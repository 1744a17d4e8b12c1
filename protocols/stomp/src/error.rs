//! Connection errors and their one mapping to ERROR frames.
//!
//! Every [`StompError`] is fatal: STOMP has no way to refuse one frame and
//! go on, so the connection sends an ERROR frame and closes.
//! [`error_frame`] is the only place that decides what such a frame says.

use std::borrow::Cow;

use rosetta_neutral::{AddressError, AuthError, BrokerError, KickReason};

use crate::frame::{Command, Version};
use crate::parser::FrameError;

/// Why a STOMP connection is being closed with an ERROR frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StompError {
    // -- malformed bytes --
    /// The byte stream is not valid STOMP framing.
    #[error(transparent)]
    Frame(#[from] FrameError),

    // -- peer misbehaved --
    /// The first frame was not CONNECT or STOMP.
    #[error("expected CONNECT or STOMP, got {0}")]
    ExpectedConnect(Command),
    /// A frame a client may not send (a server frame, or a second CONNECT).
    #[error("{0} is not allowed from a client here")]
    UnexpectedFrame(Command),
    /// A required header is missing.
    #[error("{command} frame is missing the required '{header}' header")]
    MissingHeader {
        /// The frame.
        command: Command,
        /// The header.
        header: &'static str,
    },
    /// A header has a value the server cannot use.
    #[error("invalid '{header}' header: {value:?}")]
    BadHeader {
        /// The header.
        header: &'static str,
        /// Its value.
        value: String,
    },
    /// A destination that is not valid under the naming scheme.
    #[error("invalid destination {destination:?}: {source}")]
    BadDestination {
        /// The destination as sent.
        destination: String,
        /// Why it is invalid.
        source: AddressError,
    },
    /// ACK/NACK of an id that is not an unacknowledged message.
    #[error("no unacknowledged message with id {0:?} on this connection")]
    UnknownAckId(String),
    /// A `transaction` header naming no open transaction.
    #[error("no open transaction {0:?}")]
    UnknownTransaction(String),
    /// BEGIN of a transaction name already open.
    #[error("transaction {0:?} is already open")]
    DuplicateTransaction(String),
    /// SUBSCRIBE with an id already in use.
    #[error("subscription id {0:?} is already in use on this connection")]
    DuplicateSubscription(String),
    /// `browser:true` on a destination that is not a queue (ActiveMQ
    /// browses queues only).
    #[error("only a queue can be browsed, not {0:?}")]
    BrowseNotQueue(String),
    /// A durable subscription without a client id or login to key it by.
    #[error("a durable subscription needs a 'client-id' header (or a login) on CONNECT")]
    DurableWithoutClientId,

    // -- unsupported --
    /// No common protocol version.
    #[error("none of the requested versions {0:?} is supported")]
    UnsupportedVersion(String),
    /// A command the negotiated version lacks.
    #[error("{0} is not part of STOMP {1}")]
    UnsupportedCommand(Command, Version),

    // -- authentication --
    /// Login refused.
    #[error("authentication failed: {0}")]
    Auth(#[from] AuthError),

    // -- limits and timeouts --
    /// A per-connection limit was reached.
    #[error("too many {what} (limit {max})")]
    LimitExceeded {
        /// What was counted.
        what: &'static str,
        /// The limit.
        max: usize,
    },
    /// No CONNECT in time.
    #[error("no CONNECT frame within {0} ms")]
    ConnectTimeout(u64),
    /// The client stopped sending heart-beats.
    #[error("no data or heart-beat from the client for {0} ms")]
    HeartBeatTimeout(u64),
    /// The client stopped reading while its messages filled the
    /// connection's delivery buffer.
    #[error("slow consumer: the client stopped reading and its delivery buffer stayed full")]
    SlowConsumer,
    /// The cluster's balancer has no broker ready to take the client
    /// (`Broker::place_connection`).
    #[error("no broker of the cluster is ready to take this client")]
    ServerUnavailable,

    // -- the core --
    /// The core refused an operation.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The core closed a subscription's consumer.
    #[error("subscription {id:?} was closed by the broker: {reason}")]
    SubscriptionClosed {
        /// The subscription id.
        id: String,
        /// Why.
        reason: BrokerError,
    },
    /// The core closed the whole session.
    #[error("session closed by the broker: {}", kick_text(.0))]
    Kicked(KickReason),
}

fn kick_text(reason: &KickReason) -> &str {
    match reason {
        KickReason::TakenOver => "another connection with the same client-id took over",
        KickReason::ServerShutdown => "the broker is shutting down",
        KickReason::Administrative(text) => text,
    }
}

/// The content of an ERROR frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFrame {
    /// The short `message` header: a fixed text per error, or an
    /// operator's reason for closing the connection.
    pub message: Cow<'static, str>,
    /// Extra headers (e.g. `version` for a failed negotiation).
    pub headers: Vec<(&'static str, String)>,
    /// The explanatory body.
    pub body: String,
}

/// Short `message` header of an error from the core.
fn broker_message(e: &BrokerError) -> &'static str {
    match e {
        BrokerError::NotFound(_) => "destination not found",
        BrokerError::Unauthorized(_) => "not authorized",
        BrokerError::ResourceLimit(_) => "resource limit exceeded",
        BrokerError::InvalidAddress(_) => "invalid destination",
        BrokerError::Unknown(_) => "unknown reference",
        BrokerError::InUse(_) => "destination in use",
        BrokerError::InvalidSelector(_) => "invalid selector",
        BrokerError::InvalidStreamOffset(_) => "invalid stream offset",
        BrokerError::SessionClosed => "session closed",
        BrokerError::Storage(_) => "storage failure: the operation is not durable",
        // Answered with a RECEIPT, not an ERROR (see `open::Open::ack`);
        // reached only if a path forgets to.
        BrokerError::LeaseExpired => "lease expired",
    }
}

/// The one mapping from an error to the ERROR frame that reports it.
pub fn error_frame(err: &StompError) -> ErrorFrame {
    let mut headers = Vec::new();
    let message = match err {
        StompError::Frame(FrameError::FrameTooLarge { .. })
        | StompError::Frame(FrameError::BodyTooLarge { .. }) => "frame too large",
        StompError::Frame(FrameError::HeaderLineTooLong { .. }) => "header too long",
        StompError::Frame(FrameError::TooManyHeaders { .. }) => "too many headers",
        StompError::Frame(FrameError::UnknownCommand(_)) => "unknown command",
        StompError::Frame(_) => "malformed frame",
        StompError::ExpectedConnect(_) => "not connected",
        StompError::UnexpectedFrame(_) => "unexpected frame",
        StompError::MissingHeader { .. } => "missing header",
        StompError::BadHeader { .. } => "invalid header",
        StompError::BadDestination { .. } | StompError::BrowseNotQueue(_) => "invalid destination",
        StompError::UnknownAckId(_) => "unknown message id",
        StompError::UnknownTransaction(_) | StompError::DuplicateTransaction(_) => {
            "invalid transaction"
        }
        StompError::DuplicateSubscription(_) => "duplicate subscription id",
        StompError::DurableWithoutClientId => "missing client-id",
        StompError::UnsupportedVersion(_) => {
            headers.push(("version", "1.0,1.1,1.2".to_owned()));
            "unsupported protocol version"
        }
        StompError::UnsupportedCommand(..) => "unsupported command",
        StompError::Auth(AuthError::ServerBusy) => "server busy",
        StompError::Auth(_) => "authentication failed",
        StompError::LimitExceeded { .. } => "limit exceeded",
        StompError::ConnectTimeout(_) => "connect timeout",
        StompError::HeartBeatTimeout(_) => "heart-beat timeout",
        StompError::SlowConsumer => "slow consumer",
        StompError::ServerUnavailable => "server unavailable",
        StompError::Broker(e) | StompError::SubscriptionClosed { reason: e, .. } => {
            broker_message(e)
        }
        // The operator's words are what the client is shown.
        StompError::Kicked(KickReason::Administrative(text)) => {
            return ErrorFrame {
                message: Cow::Owned(text.clone()),
                headers,
                body: format!("{err}\nThe connection is closed.\n"),
            };
        }
        StompError::Kicked(_) => "session closed",
    };
    ErrorFrame {
        message: Cow::Borrowed(message),
        headers,
        body: format!("{err}\nThe connection is closed.\n"),
    }
}
