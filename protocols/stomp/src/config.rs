//! Connection settings. Every default is a named constant with the reason
//! for its value; units are part of the names.

use crate::parser::Limits;

/// Largest body accepted: big enough for documents and images, small enough
/// that a thousand connections mid-frame cannot exhaust memory.
pub const BODY_SIZE_MAX_BYTES: usize = 8 * 1024 * 1024;
/// Largest frame: the body limit plus room for a generous head.
pub const FRAME_SIZE_MAX_BYTES: usize = BODY_SIZE_MAX_BYTES + 1024 * 1024;
/// Longest header line: a destination of `ADDRESS_LEN_MAX` (64 KiB) bytes
/// fits with room for its name; real headers are far shorter.
pub const HEADER_LINE_MAX_BYTES: usize = 128 * 1024;
/// Most headers per frame: far above what clients send (ActiveMQ allows
/// 1000), low enough that a header flood costs little.
pub const HEADERS_MAX: usize = 256;
/// Time allowed between accept and CONNECT, so idle sockets cannot pile up.
pub const CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Fastest heart-beat the server sends (`sx`): a client asking for faster
/// beats gets this, which keeps idle connections cheap.
pub const HEART_BEAT_SEND_MIN_MS: u64 = 1_000;
/// Fastest heart-beat the server asks of clients (`sy`); 0 would mean "do
/// not send me heart-beats". A client offering slower beats sets the pace.
pub const HEART_BEAT_RECEIVE_MIN_MS: u64 = 1_000;
/// A client is declared dead after silence of this percentage of the agreed
/// receive interval. 200 % tolerates one late or lost beat plus network
/// jitter, as the STOMP spec recommends some tolerance.
pub const HEART_BEAT_GRACE_PERCENT: u64 = 200;
/// Prefetch when SUBSCRIBE names none: enough to keep a consumer busy over a
/// fast link without holding much unacknowledged state per subscription.
pub const PREFETCH_DEFAULT: u32 = 256;
/// Highest prefetch a client may ask for: bounds in-flight tracking state.
pub const PREFETCH_MAX: u32 = 10_000;
/// Subscriptions per connection.
pub const SUBSCRIPTIONS_MAX: usize = 1_024;
/// Open transactions per connection.
pub const TRANSACTIONS_MAX: usize = 64;
/// Staged acknowledgements per transaction (publishes are bounded by the
/// core's memory limit; acks are tracked here to undo them on ABORT).
pub const TRANSACTION_ACKS_MAX: usize = 100_000;
/// Temporary queues per connection.
pub const TEMP_QUEUES_MAX: usize = 256;
/// Durable commits a connection may have pending before the driver stops
/// reading from it (back-pressure on producers faster than the journal).
pub const PENDING_COMMITS_MAX: usize = 4_096;

/// Settings of a STOMP connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StompConfig {
    /// See [`FRAME_SIZE_MAX_BYTES`].
    pub frame_size_max_bytes: usize,
    /// See [`BODY_SIZE_MAX_BYTES`].
    pub body_size_max_bytes: usize,
    /// See [`HEADER_LINE_MAX_BYTES`].
    pub header_line_max_bytes: usize,
    /// See [`HEADERS_MAX`].
    pub headers_max: usize,
    /// See [`CONNECT_TIMEOUT_MS`].
    pub connect_timeout_ms: u64,
    /// See [`HEART_BEAT_SEND_MIN_MS`].
    pub heart_beat_send_min_ms: u64,
    /// See [`HEART_BEAT_RECEIVE_MIN_MS`]; 0 disables client heart-beats.
    pub heart_beat_receive_min_ms: u64,
    /// See [`HEART_BEAT_GRACE_PERCENT`].
    pub heart_beat_grace_percent: u64,
    /// See [`PREFETCH_DEFAULT`].
    pub prefetch_default: u32,
    /// See [`PREFETCH_MAX`].
    pub prefetch_max: u32,
    /// See [`SUBSCRIPTIONS_MAX`].
    pub subscriptions_max: usize,
    /// See [`TRANSACTIONS_MAX`].
    pub transactions_max: usize,
    /// See [`TRANSACTION_ACKS_MAX`].
    pub transaction_acks_max: usize,
    /// See [`TEMP_QUEUES_MAX`].
    pub temp_queues_max: usize,
    /// See [`PENDING_COMMITS_MAX`].
    pub pending_commits_max: usize,
    /// The `server` header of CONNECTED.
    pub server_name: String,
}

impl Default for StompConfig {
    fn default() -> Self {
        Self {
            frame_size_max_bytes: FRAME_SIZE_MAX_BYTES,
            body_size_max_bytes: BODY_SIZE_MAX_BYTES,
            header_line_max_bytes: HEADER_LINE_MAX_BYTES,
            headers_max: HEADERS_MAX,
            connect_timeout_ms: CONNECT_TIMEOUT_MS,
            heart_beat_send_min_ms: HEART_BEAT_SEND_MIN_MS,
            heart_beat_receive_min_ms: HEART_BEAT_RECEIVE_MIN_MS,
            heart_beat_grace_percent: HEART_BEAT_GRACE_PERCENT,
            prefetch_default: PREFETCH_DEFAULT,
            prefetch_max: PREFETCH_MAX,
            subscriptions_max: SUBSCRIPTIONS_MAX,
            transactions_max: TRANSACTIONS_MAX,
            transaction_acks_max: TRANSACTION_ACKS_MAX,
            temp_queues_max: TEMP_QUEUES_MAX,
            pending_commits_max: PENDING_COMMITS_MAX,
            server_name: concat!("Rosetta/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }
}

impl StompConfig {
    /// The decoder limits of this configuration.
    pub fn limits(&self) -> Limits {
        Limits {
            frame_size_max_bytes: self.frame_size_max_bytes,
            header_line_max_bytes: self.header_line_max_bytes,
            headers_max: self.headers_max,
            body_size_max_bytes: self.body_size_max_bytes,
        }
    }
}
