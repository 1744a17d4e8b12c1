//! Engine settings. Every default is a named constant with the reason for
//! its value; `AmqpConfig::default()` works without a configuration file.

/// Our max-frame-size: 256 KiB keeps a 1 KiB-message batch in one frame
/// each while bounding what one peer can make us buffer.
pub const FRAME_SIZE_MAX_BYTES: u32 = 256 * 1024;
/// Frames before the peer's Open (SASL and Open itself) come from an
/// unauthenticated peer; 64 KiB fits any real Open with properties.
pub const HANDSHAKE_FRAME_SIZE_MAX_BYTES: u32 = 64 * 1024;
/// Highest channel number (sessions per connection minus one): clients use
/// one or a few sessions; 255 bounds per-connection session state.
pub const CHANNEL_MAX: u16 = 255;
/// Links per session (handle-max + 1, advertised in Begin); JMS opens one
/// per producer/consumer. RabbitMQ allows 256 (`link_max_per_session`).
pub const LINKS_PER_SESSION_MAX: u32 = 1024;
/// Links across all sessions of one connection: each holds a consumer or
/// credit state in the core, so one client cannot exhaust it. An attach
/// past it is refused with `amqp:resource-limit-exceeded`. Four sessions'
/// worth of links; RabbitMQ's defaults (64 sessions of 256 links) allow
/// 16,384.
pub const LINKS_PER_CONNECTION_MAX: usize = 4_096;
/// Our idle timeout: a peer silent this long is closed. Half of it is
/// advertised in Open (AMQP 1.0 §2.4.5), so a peer that keeps alive at the
/// advertised period is never cut off.
pub const IDLE_TIMEOUT_MS: u32 = 60_000;
/// Time allowed from accept to the peer's Open (SASL included), so that
/// half-open or stalled handshakes do not hold a connection forever.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 30_000;
/// How long we wait for the peer's Close after sending ours.
pub const CLOSE_TIMEOUT_MS: u64 = 5_000;
/// Session incoming window in transfer frames: re-opened at half, so a
/// producer is never stalled by it while credit is the real bound.
pub const SESSION_WINDOW_FRAMES: u32 = 8_192;
/// Credit granted to each client sender and refilled as durable commits
/// complete: 1000 in flight per link saturates group commit without
/// unbounded buffering.
pub const SENDER_CREDIT_WINDOW: u32 = 1_000;
/// Highest credit honoured on a broker -> client link; bounds what the core
/// may push into this connection's output.
pub const LINK_CREDIT_MAX: u32 = 10_000;
/// Largest message assembled from several transfer frames.
pub const MESSAGE_SIZE_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// How often withheld sender credit is re-checked while the core reports
/// producer flow control (there is no "unblocked" event).
pub const BLOCKED_RECHECK_MS: u64 = 100;
/// Durable publishes awaiting their commit across the connection before we
/// ask the driver to stop reading.
pub const PENDING_COMMITS_MAX: usize = 16_384;
/// Deliveries held back because the peer's session window is closed.
pub const PENDING_DELIVERIES_MAX: usize = 65_536;

/// Settings of one AMQP connection.
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    /// Our container id, sent in Open.
    pub container_id: String,
    /// See [`FRAME_SIZE_MAX_BYTES`].
    pub frame_size_max_bytes: u32,
    /// See [`HANDSHAKE_FRAME_SIZE_MAX_BYTES`].
    pub handshake_frame_size_max_bytes: u32,
    /// See [`CHANNEL_MAX`].
    pub channel_max: u16,
    /// See [`LINKS_PER_SESSION_MAX`].
    pub links_per_session_max: u32,
    /// See [`LINKS_PER_CONNECTION_MAX`].
    pub links_per_connection_max: usize,
    /// See [`IDLE_TIMEOUT_MS`]: the timeout enforced (half is advertised);
    /// 0 disables our idle check.
    pub idle_timeout_ms: u32,
    /// See [`HANDSHAKE_TIMEOUT_MS`].
    pub handshake_timeout_ms: u64,
    /// See [`CLOSE_TIMEOUT_MS`].
    pub close_timeout_ms: u64,
    /// See [`SESSION_WINDOW_FRAMES`].
    pub session_window_frames: u32,
    /// See [`SENDER_CREDIT_WINDOW`].
    pub sender_credit_window: u32,
    /// See [`LINK_CREDIT_MAX`].
    pub link_credit_max: u32,
    /// See [`MESSAGE_SIZE_MAX_BYTES`].
    pub message_size_max_bytes: u64,
    /// See [`BLOCKED_RECHECK_MS`].
    pub blocked_recheck_ms: u64,
    /// See [`PENDING_COMMITS_MAX`].
    pub pending_commits_max: usize,
    /// See [`PENDING_DELIVERIES_MAX`].
    pub pending_deliveries_max: usize,
}

impl Default for AmqpConfig {
    fn default() -> Self {
        Self {
            container_id: "rosetta".to_owned(),
            frame_size_max_bytes: FRAME_SIZE_MAX_BYTES,
            handshake_frame_size_max_bytes: HANDSHAKE_FRAME_SIZE_MAX_BYTES,
            channel_max: CHANNEL_MAX,
            links_per_session_max: LINKS_PER_SESSION_MAX,
            links_per_connection_max: LINKS_PER_CONNECTION_MAX,
            idle_timeout_ms: IDLE_TIMEOUT_MS,
            handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS,
            close_timeout_ms: CLOSE_TIMEOUT_MS,
            session_window_frames: SESSION_WINDOW_FRAMES,
            sender_credit_window: SENDER_CREDIT_WINDOW,
            link_credit_max: LINK_CREDIT_MAX,
            message_size_max_bytes: MESSAGE_SIZE_MAX_BYTES,
            blocked_recheck_ms: BLOCKED_RECHECK_MS,
            pending_commits_max: PENDING_COMMITS_MAX,
            pending_deliveries_max: PENDING_DELIVERIES_MAX,
        }
    }
}

/// A configuration value that cannot work, naming its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("amqp.{key}: {reason}")]
pub struct ConfigError {
    /// The offending key.
    pub key: &'static str,
    /// Why it is refused.
    pub reason: &'static str,
}

impl AmqpConfig {
    /// Checks the values; the server refuses to start on an error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let min_frame = crate::frame::MIN_MAX_FRAME_SIZE;
        let checks = [
            (
                self.frame_size_max_bytes >= min_frame,
                "frame_size_max_bytes",
                "must be at least 512 (the AMQP minimum)",
            ),
            (
                self.handshake_frame_size_max_bytes >= min_frame,
                "handshake_frame_size_max_bytes",
                "must be at least 512 (the AMQP minimum)",
            ),
            (
                self.links_per_session_max > 0,
                "links_per_session_max",
                "must be positive",
            ),
            (
                self.links_per_connection_max > 0,
                "links_per_connection_max",
                "must be positive",
            ),
            (
                self.session_window_frames > 0,
                "session_window_frames",
                "must be positive or no client can send",
            ),
            (
                self.sender_credit_window > 0,
                "sender_credit_window",
                "must be positive or no client can send",
            ),
            (
                self.link_credit_max > 0,
                "link_credit_max",
                "must be positive or no client can receive",
            ),
            (
                self.handshake_timeout_ms > 0,
                "handshake_timeout_ms",
                "must be positive",
            ),
            (
                self.pending_commits_max > 0,
                "pending_commits_max",
                "must be positive",
            ),
        ];
        match checks.into_iter().find(|(ok, _, _)| !ok) {
            Some((_, key, reason)) => Err(ConfigError { key, reason }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_name_their_key() {
        assert_eq!(AmqpConfig::default().validate(), Ok(()));
        let bad = AmqpConfig {
            frame_size_max_bytes: 100,
            ..AmqpConfig::default()
        };
        let err = bad.validate().unwrap_err();
        assert_eq!(err.key, "frame_size_max_bytes");
        assert!(err.to_string().starts_with("amqp.frame_size_max_bytes"));
    }
}
