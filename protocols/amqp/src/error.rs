//! Errors of the engine and their one mapping to AMQP error conditions.
//!
//! Every failure is an [`AmqpError`]; [`AmqpError::to_wire`] is the single
//! place that turns one into the `error` field of a close, end, detach or
//! rejected outcome, and [`broker_condition`] the single place that maps a
//! core [`BrokerError`].

use fe2o3_amqp_types::definitions::{
    AmqpError as Cond, ConnectionError, Error as WireError, ErrorCondition, LinkError, SessionError,
};
use fe2o3_amqp_types::primitives::Symbol;
use fe2o3_amqp_types::transaction::TransactionError;
use rosetta_neutral::BrokerError;

use crate::codec::CodecError;
use crate::frame::FrameError;

/// The condition for a frame larger than the negotiated max-frame-size.
/// AMQP 1.0 only names `frame-size-too-small`; peers recognise this symbol
/// (used by Qpid and RabbitMQ) as a framing failure.
pub const FRAME_SIZE_TOO_LARGE: &str = "amqp:frame-size-too-large";

/// What an error breaks: the scope a handler's failure closes, and only
/// that (the connection applies it; see `connection`).
#[derive(Debug)]
pub(crate) enum Fault {
    /// Close the connection.
    Connection(AmqpError),
    /// End the session the frame arrived on.
    Session(AmqpError),
    /// Detach this link (by handle) with the error.
    Link(u32, AmqpError),
}

/// What went wrong, grouped by cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmqpError {
    /// Malformed framing (size, data offset, type, protocol header).
    #[error("framing error: {0}")]
    Frame(#[from] FrameError),
    /// A performative or section that does not decode.
    #[error("decode error: {0}")]
    Decode(#[from] CodecError),
    /// A performative out of order for the current state.
    #[error("illegal state: {0}")]
    IllegalState(String),
    /// A field with a value we cannot accept.
    #[error("invalid field: {0}")]
    InvalidField(String),
    /// Valid but not permitted here (unknown channel, second Open, ...).
    #[error("not allowed: {0}")]
    NotAllowed(String),
    /// A feature we do not implement.
    #[error("not implemented: {0}")]
    NotImplemented(String),
    /// A transfer beyond the session's incoming window.
    #[error("session window violation: {0}")]
    WindowViolation(String),
    /// A frame referencing a handle that is not attached.
    #[error("unattached handle {0}")]
    UnattachedHandle(u32),
    /// An attach on a handle already in use.
    #[error("handle {0} in use")]
    HandleInUse(u32),
    /// A channel or handle above the channel-max or handle-max we
    /// advertised: spec 2.7.1 and 2.7.2 make it a framing error of the
    /// connection.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// A transfer without link credit.
    #[error("transfer limit exceeded: {0}")]
    TransferLimitExceeded(String),
    /// A message larger than we assemble.
    #[error("message size exceeded: {0}")]
    MessageSizeExceeded(String),
    /// A limit of ours (sessions, links, idle timeout).
    #[error("resource limit exceeded: {0}")]
    ResourceLimit(String),
    /// The core refused.
    #[error("{0}")]
    Broker(#[from] BrokerError),
    /// A transaction id we did not declare.
    #[error("unknown transaction {0}")]
    UnknownTxn(String),
    /// A transaction failed to commit.
    #[error("transaction rolled back: {0}")]
    TxnRollback(String),
    /// The broker closes the connection (take-over, shutdown).
    #[error("connection forced: {0}")]
    Forced(String),
    /// An operator closed the connection: `amqp:connection:forced` with the
    /// operator's reason, as it was given, for the description.
    #[error("{0}")]
    Administrative(String),
    /// The link was attached again under the same name.
    #[error("link {0:?} attached elsewhere")]
    LinkStolen(String),
    /// What a link worked with went away (its queue was deleted).
    #[error("resource deleted: {0}")]
    ResourceDeleted(String),
}

impl AmqpError {
    /// The AMQP condition for this error.
    pub fn condition(&self) -> ErrorCondition {
        match self {
            AmqpError::Frame(FrameError::SizeTooLarge { .. }) => {
                ErrorCondition::Custom(Symbol::from(FRAME_SIZE_TOO_LARGE))
            }
            AmqpError::Frame(_) => ErrorCondition::ConnectionError(ConnectionError::FramingError),
            AmqpError::Decode(_) => Cond::DecodeError.into(),
            AmqpError::IllegalState(_) => Cond::IllegalState.into(),
            AmqpError::InvalidField(_) => Cond::InvalidField.into(),
            AmqpError::NotAllowed(_) => Cond::NotAllowed.into(),
            AmqpError::NotImplemented(_) => Cond::NotImplemented.into(),
            AmqpError::WindowViolation(_) => {
                ErrorCondition::SessionError(SessionError::WindowViolation)
            }
            AmqpError::UnattachedHandle(_) => {
                ErrorCondition::SessionError(SessionError::UnattachedHandle)
            }
            AmqpError::HandleInUse(_) => ErrorCondition::SessionError(SessionError::HandleInUse),
            AmqpError::OutOfRange(_) => {
                ErrorCondition::ConnectionError(ConnectionError::FramingError)
            }
            AmqpError::TransferLimitExceeded(_) => {
                ErrorCondition::LinkError(LinkError::TransferLimitExceeded)
            }
            AmqpError::MessageSizeExceeded(_) => {
                ErrorCondition::LinkError(LinkError::MessageSizeExceeded)
            }
            AmqpError::ResourceLimit(_) => Cond::ResourceLimitExceeded.into(),
            AmqpError::Broker(e) => broker_condition(e),
            AmqpError::UnknownTxn(_) => {
                ErrorCondition::TransactionError(TransactionError::UnknownId)
            }
            AmqpError::TxnRollback(_) => {
                ErrorCondition::TransactionError(TransactionError::Rollback)
            }
            AmqpError::Forced(_) | AmqpError::Administrative(_) => {
                ErrorCondition::ConnectionError(ConnectionError::ConnectionForced)
            }
            AmqpError::ResourceDeleted(_) => Cond::ResourceDeleted.into(),
            AmqpError::LinkStolen(_) => ErrorCondition::LinkError(LinkError::Stolen),
        }
    }

    /// The `error` field sent on the wire.
    pub fn to_wire(&self) -> WireError {
        WireError {
            condition: self.condition(),
            description: Some(self.to_string()),
            info: None,
        }
    }
}

/// The one mapping from a core error to an AMQP condition.
pub fn broker_condition(e: &BrokerError) -> ErrorCondition {
    match e {
        BrokerError::NotFound(_) | BrokerError::Unknown(_) => Cond::NotFound.into(),
        BrokerError::Unauthorized(_) => Cond::UnauthorizedAccess.into(),
        BrokerError::ResourceLimit(_) => Cond::ResourceLimitExceeded.into(),
        BrokerError::InvalidAddress(_)
        | BrokerError::InvalidSelector(_)
        | BrokerError::InvalidStreamOffset(_) => Cond::InvalidField.into(),
        BrokerError::InUse(_) => Cond::ResourceLocked.into(),
        BrokerError::SessionClosed => {
            ErrorCondition::ConnectionError(ConnectionError::ConnectionForced)
        }
        BrokerError::Storage(_) => Cond::InternalError.into(),
        // A late settlement is answered on the delivery (a `released`
        // disposition), never with an error that ends a link; this is for
        // a path that forgets to.
        BrokerError::LeaseExpired => Cond::PreconditionFailed.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_errors_map_to_their_conditions() {
        let cases = [
            (BrokerError::NotFound("q".into()), "amqp:not-found"),
            (
                BrokerError::Unauthorized("q".into()),
                "amqp:unauthorized-access",
            ),
            (
                BrokerError::ResourceLimit("mem".into()),
                "amqp:resource-limit-exceeded",
            ),
            (
                BrokerError::InvalidAddress("x".into()),
                "amqp:invalid-field",
            ),
            (BrokerError::Storage("io".into()), "amqp:internal-error"),
        ];
        for (e, want) in cases {
            let got = serde_amqp::to_vec(&broker_condition(&e)).unwrap();
            let want_bytes = serde_amqp::to_vec(&Symbol::from(want)).unwrap();
            assert_eq!(got, want_bytes, "{e}");
        }
        let too_large = AmqpError::Frame(FrameError::SizeTooLarge { size: 9, max: 8 });
        assert!(
            matches!(too_large.condition(), ErrorCondition::Custom(s) if s.as_str() == FRAME_SIZE_TOO_LARGE)
        );
    }
}
