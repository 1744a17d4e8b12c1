//! Connection errors and the one place they become MQTT reason codes.

use rosetta_neutral::{AuthError, BrokerError};

use crate::codec::encode::EncodeError;
use crate::codec::CodecError;

/// Why a connection is being closed by the server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MqttError {
    /// The bytes did not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The peer broke a protocol rule (0x82).
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    /// PUBLISH to a topic name that is not valid (0x90).
    #[error("invalid topic name: {0}")]
    TopicNameInvalid(String),
    /// Topic alias 0 or above our maximum (0x94); an unknown alias with an
    /// empty topic is a protocol error (0x82).
    #[error("invalid topic alias {0}")]
    TopicAliasInvalid(u16),
    /// More inbound QoS 1/2 in flight than our receive maximum (0x93).
    #[error("receive maximum {0} exceeded")]
    ReceiveMaximumExceeded(u16),
    /// PUBLISH above our maximum QoS (0x9B).
    #[error("QoS {0} not supported")]
    QosNotSupported(u8),
    /// Retained PUBLISH while retain is unavailable (0x9A).
    #[error("retain not supported")]
    RetainNotSupported,
    /// Payload format indicator 1 on a payload that is not UTF-8 (0x99).
    #[error("payload is not UTF-8 despite its format indicator")]
    PayloadFormatInvalid,
    /// SUBSCRIBE with an identifier while they are disabled (0xA1).
    #[error("subscription identifiers not supported")]
    SubscriptionIdsNotSupported,
    /// Nothing received for 1.5 times the keep-alive (0x8D).
    #[error("keep-alive timeout")]
    KeepAliveTimeout,
    /// No CONNECT within the connect timeout.
    #[error("no CONNECT within the connect timeout")]
    ConnectTimeout,
    /// Another connection took the session (0x8E).
    #[error("session taken over")]
    SessionTakenOver,
    /// The broker is shutting down (0x8B).
    #[error("server shutting down")]
    ServerShutdown,
    /// An operator closed the connection (0x98 Administrative action); the
    /// text is the DISCONNECT's reason string.
    #[error("{0}")]
    AdministrativeAction(String),
    /// The core failed an operation the connection cannot continue without.
    #[error("broker error: {0}")]
    Broker(BrokerError),
    /// A server packet could not be encoded (0x83).
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// Re-authentication failed (0x87).
    #[error("re-authentication failed: {0}")]
    ReauthenticationFailed(String),
    /// The client stopped reading while its messages filled the
    /// connection's delivery buffer (0x97 Quota exceeded: the buffer is
    /// the quota; 0x89 Server busy would invite an immediate retry).
    #[error("slow consumer: the client stopped reading and its delivery buffer stayed full")]
    SlowConsumer,
}

/// Where a broker error happened: the same error maps to a different code
/// in each packet's code space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonContext {
    /// CONNACK.
    Connect,
    /// PUBACK / PUBREC.
    Publish,
    /// SUBACK / UNSUBACK.
    Subscribe,
    /// DISCONNECT.
    Disconnect,
}

/// THE mapping from core errors to MQTT 5 reason codes.
pub fn broker_reason(err: &BrokerError, ctx: ReasonContext) -> u8 {
    match (err, ctx) {
        (BrokerError::Unauthorized(_), _) => 0x87,
        (BrokerError::ResourceLimit(_), _) => 0x97,
        (BrokerError::InvalidAddress(_), ReasonContext::Subscribe) => 0x8F,
        // A bad offset spec is in the filter (`$stream/s/<spec>`) or its
        // user property: the filter is not valid as given.
        (BrokerError::InvalidStreamOffset(_), ReasonContext::Subscribe) => 0x8F,
        (BrokerError::InvalidStreamOffset(_), _) => 0x83,
        (BrokerError::InvalidAddress(_), ReasonContext::Connect) => 0x85,
        (BrokerError::InvalidAddress(_), _) => 0x90,
        (BrokerError::SessionClosed, ReasonContext::Disconnect) => 0x8E,
        (BrokerError::SessionClosed, ReasonContext::Connect) => 0x88,
        (BrokerError::InUse(_), ReasonContext::Connect) => 0x88,
        // MQTT has no selectors: an MQTT consumer cannot give one, so this
        // is the implementation-specific error it would be.
        (BrokerError::Unknown(_), _) | (BrokerError::InvalidSelector(_), _) => 0x83,
        (BrokerError::NotFound(_), _)
        | (BrokerError::InUse(_), _)
        | (BrokerError::SessionClosed, _)
        | (BrokerError::Storage(_), _)
        // MQTT has nothing to say about a late PUBACK (it is ignored).
        | (BrokerError::LeaseExpired, _) => 0x80,
    }
}

/// The CONNACK reason for a failed authentication.
///
/// A user name other than the client certificate's user is 0x87 (3.1.1:
/// 5, not authorized), not 0x86 (4, bad user name or password): nothing
/// the client sent is malformed, and its password is never checked; the
/// certificate proved who the client is, and that client may not connect
/// as someone else, an authorization decision. A full password-check queue
/// is 0x89, server busy (3.1.1: 3, server unavailable): try again later.
pub fn auth_reason(err: &AuthError) -> u8 {
    match err {
        AuthError::BadCredentials => 0x86,
        AuthError::AnonymousDisabled | AuthError::CertificateMismatch => 0x87,
        AuthError::ServerBusy => 0x89,
    }
}

/// Projects a v5 CONNACK reason code onto the six 3.1.1 return codes.
pub fn connack_v4_code(v5_code: u8) -> u8 {
    match v5_code {
        0x00 => 0,
        0x84 => 1,
        0x85 => 2,
        0x86 => 4,
        0x87 | 0x8C => 5,
        _ => 3,
    }
}

impl MqttError {
    /// The MQTT 5 DISCONNECT reason code.
    pub fn reason_code(&self) -> u8 {
        match self {
            MqttError::Codec(e) => e.reason_code(),
            MqttError::Protocol(_) => 0x82,
            MqttError::TopicNameInvalid(_) => 0x90,
            MqttError::TopicAliasInvalid(_) => 0x94,
            MqttError::ReceiveMaximumExceeded(_) => 0x93,
            MqttError::QosNotSupported(_) => 0x9B,
            MqttError::RetainNotSupported => 0x9A,
            MqttError::PayloadFormatInvalid => 0x99,
            MqttError::SubscriptionIdsNotSupported => 0xA1,
            MqttError::KeepAliveTimeout => 0x8D,
            MqttError::ConnectTimeout => 0x88,
            MqttError::SessionTakenOver => 0x8E,
            MqttError::ServerShutdown => 0x8B,
            MqttError::AdministrativeAction(_) => 0x98,
            MqttError::Broker(e) => broker_reason(e, ReasonContext::Disconnect),
            MqttError::Encode(_) => 0x83,
            MqttError::ReauthenticationFailed(_) => 0x87,
            MqttError::SlowConsumer => 0x97,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_errors_map_per_context() {
        let denied = BrokerError::Unauthorized("x".into());
        assert_eq!(broker_reason(&denied, ReasonContext::Subscribe), 0x87);
        assert_eq!(
            connack_v4_code(broker_reason(&denied, ReasonContext::Connect)),
            5
        );
        let bad = BrokerError::InvalidAddress("x".into());
        assert_eq!(broker_reason(&bad, ReasonContext::Subscribe), 0x8F);
        assert_eq!(broker_reason(&bad, ReasonContext::Publish), 0x90);
        let full = BrokerError::ResourceLimit("disk".into());
        assert_eq!(broker_reason(&full, ReasonContext::Publish), 0x97);
        assert_eq!(connack_v4_code(auth_reason(&AuthError::BadCredentials)), 4);
        let mismatch = AuthError::CertificateMismatch;
        assert_eq!((auth_reason(&mismatch), connack_v4_code(0x87)), (0x87, 5));
        let busy = AuthError::ServerBusy;
        assert_eq!((auth_reason(&busy), connack_v4_code(0x89)), (0x89, 3));
    }
}
