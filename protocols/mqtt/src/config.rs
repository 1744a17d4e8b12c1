//! Server-side limits and features, advertised to MQTT 5 clients in CONNACK.

/// Largest packet accepted (and advertised as Maximum Packet Size): bounds
/// the read buffer of each connection.
pub const PACKET_SIZE_MAX_BYTES: u32 = 1024 * 1024;
/// Longest keep-alive granted: a silent half-open connection pins its
/// session for at most 1.5 times this (15 minutes).
pub const KEEP_ALIVE_MAX_S: u16 = 600;
/// Inbound QoS 1/2 publishes a client may have unacknowledged (our Receive
/// Maximum): keeps a fast link busy while bounding the pending-commit
/// queue per connection.
pub const RECEIVE_MAXIMUM: u16 = 1024;
/// Most unacknowledged QoS 1/2 deliveries toward one client, whatever its
/// own receive maximum says; bounds in-flight state per consumer.
pub const OUTBOUND_INFLIGHT_MAX: u16 = 256;
/// Topic aliases a client may define toward us.
pub const TOPIC_ALIAS_MAX: u16 = 64;
/// Topic aliases we define toward a client (also capped by its maximum).
pub const OUTBOUND_TOPIC_ALIAS_MAX: u16 = 64;
/// Longest client identifier accepted; more than the 23 the spec
/// guarantees, because real clients use UUIDs and host names.
pub const CLIENT_ID_LEN_MAX_BYTES: usize = 256;
/// Longest session expiry granted to an MQTT 5 client (7 days); longer
/// requests are capped and the cap is returned in CONNACK.
pub const SESSION_EXPIRY_MAX_S: u32 = 7 * 24 * 3600;
/// How long a new connection may take to send CONNECT.
pub const CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Plain subscriptions per session (each a binding of the session queue,
/// which the core caps). Devices use a handful and AWS IoT Core allows 50;
/// 1,000 leaves room for bridges and dashboards while one client id cannot
/// fill the routing table (EMQX and mosquitto set no cap by default).
pub const SUBSCRIPTIONS_MAX: usize = 1_000;
/// Shared and `$queue/` subscriptions per session. Each is a consumer
/// of its own, and a persistent session rewrites the whole list in its
/// durable state on every change, so the list is kept short.
pub const OWN_SUBSCRIPTIONS_MAX: usize = 64;
/// Acks waiting for durable commits before we stop reading the socket
/// (the receive maximum bounds v5 clients; this bounds 3.1.1 clients).
pub const PENDING_ACKS_MAX: usize = 1024;

/// Configuration of the MQTT adapter. `Default` gives the constants above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttConfig {
    /// Maximum packet size in both directions' sense: larger inbound
    /// packets close the connection (v5: DISCONNECT 0x95).
    pub packet_size_max_bytes: u32,
    /// Maximum keep-alive; a v5 client asking more (or 0) gets this as
    /// Server Keep Alive. 0 means no maximum.
    pub keep_alive_max_s: u16,
    /// Our Receive Maximum (inbound QoS 1/2 in flight); exceeding it is
    /// DISCONNECT 0x93.
    pub receive_maximum: u16,
    /// Cap on the outbound in-flight window (the client's receive maximum
    /// is used when smaller; 3.1.1 clients get this).
    pub outbound_inflight_max: u16,
    /// Highest QoS accepted and granted (0–2).
    pub qos_max: u8,
    /// Retained messages supported.
    pub retain_available: bool,
    /// Wildcard subscriptions supported.
    pub wildcard_subscriptions_available: bool,
    /// Shared subscriptions (`$share/group/filter`) supported.
    pub shared_subscriptions_available: bool,
    /// Subscription identifiers supported.
    pub subscription_identifiers_available: bool,
    /// Topic Alias Maximum advertised to clients (0 disables inbound aliases).
    pub topic_alias_max: u16,
    /// Most aliases we assign toward one client.
    pub outbound_topic_alias_max: u16,
    /// Longest client identifier.
    pub client_id_len_max_bytes: usize,
    /// Longest MQTT 5 session expiry granted, in seconds.
    pub session_expiry_max_s: u32,
    /// Expiry of 3.1.1 persistent sessions (which cannot ask for one), in
    /// seconds; `None` keeps them until a clean-session connect
    /// (`QueueLifetime::Permanent`, the 3.1.1 behaviour).
    pub v311_session_expiry_s: Option<u32>,
    /// Time allowed between accept and CONNECT, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Pending acks (waiting for commits) before `wants_input` turns false.
    pub pending_acks_max: usize,
    /// Most shared and `$queue/` subscriptions per session; more are
    /// refused with 0x97 (quota exceeded).
    pub own_subscriptions_max: usize,
    /// Most plain subscriptions per session; more are refused with 0x97
    /// (3.1.1: 0x80).
    pub subscriptions_max: usize,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            packet_size_max_bytes: PACKET_SIZE_MAX_BYTES,
            keep_alive_max_s: KEEP_ALIVE_MAX_S,
            receive_maximum: RECEIVE_MAXIMUM,
            outbound_inflight_max: OUTBOUND_INFLIGHT_MAX,
            qos_max: 2,
            retain_available: true,
            wildcard_subscriptions_available: true,
            shared_subscriptions_available: true,
            subscription_identifiers_available: true,
            topic_alias_max: TOPIC_ALIAS_MAX,
            outbound_topic_alias_max: OUTBOUND_TOPIC_ALIAS_MAX,
            client_id_len_max_bytes: CLIENT_ID_LEN_MAX_BYTES,
            session_expiry_max_s: SESSION_EXPIRY_MAX_S,
            v311_session_expiry_s: None,
            connect_timeout_ms: CONNECT_TIMEOUT_MS,
            pending_acks_max: PENDING_ACKS_MAX,
            own_subscriptions_max: OWN_SUBSCRIPTIONS_MAX,
            subscriptions_max: SUBSCRIPTIONS_MAX,
        }
    }
}

/// A configuration value out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MQTT configuration: {key}: {why}")]
pub struct ConfigError {
    /// The offending key.
    pub key: &'static str,
    /// What is wrong.
    pub why: &'static str,
}

impl MqttConfig {
    /// Checks ranges the protocol imposes; the server calls this at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key, why| Err(ConfigError { key, why });
        if self.packet_size_max_bytes < 64 || self.packet_size_max_bytes > 268_435_460 {
            return err("packet_size_max_bytes", "must be 64 ..= 268435460");
        }
        if self.receive_maximum == 0 {
            return err("receive_maximum", "must be at least 1");
        }
        if self.outbound_inflight_max == 0 {
            return err("outbound_inflight_max", "must be at least 1");
        }
        if self.qos_max > 2 {
            return err("qos_max", "must be 0, 1 or 2");
        }
        if self.client_id_len_max_bytes < 23 {
            return err("client_id_len_max_bytes", "MQTT requires at least 23");
        }
        if self.pending_acks_max == 0 {
            return err("pending_acks_max", "must be at least 1");
        }
        if self.subscriptions_max == 0 {
            return err("subscriptions_max", "must be at least 1");
        }
        if self.own_subscriptions_max == 0 {
            return err("shared_subscriptions_max", "must be at least 1");
        }
        Ok(())
    }
}
