//! `[mqtt]`, `[stomp]` and `[amqp]`: per-protocol limits. The server maps
//! these onto each adapter's own config struct.

use serde::Deserialize;

/// What a frame may carry besides its payload when its wire limit is
/// derived from `broker.payload_size_max_bytes`: MQTT topic and properties,
/// STOMP headers, AMQP header, properties and annotations. Generous, so
/// that a payload at the limit is never refused for its headers.
pub const HEADERS_ALLOWANCE_BYTES: u32 = 1024 * 1024;

// ---- MQTT ----------------------------------------------------------------

/// Longest keep-alive granted (v5 Server Keep Alive): a client that vanished
/// without a FIN is noticed within 15 minutes (1.5 x 600 s).
pub const MQTT_KEEP_ALIVE_MAX_S_DEFAULT: u16 = 600;
/// QoS 1/2 publishes a client may have unacknowledged toward us: enough to
/// keep a fast link busy, bounded so one client cannot queue up unbounded
/// commits.
pub const MQTT_RECEIVE_MAXIMUM_DEFAULT: u16 = 1024;
/// Smallest packet limit that still fits a CONNECT with credentials.
pub const MQTT_PACKET_SIZE_MIN_BYTES: u32 = 1024;
/// MQTT's own maximum packet size (1 + 4 + 268,435,455 bytes).
pub const MQTT_PACKET_SIZE_PROTOCOL_MAX_BYTES: u32 = 268_435_460;
/// Highest QoS granted: all three levels are supported.
pub const MQTT_QOS_MAX_DEFAULT: u8 = 2;
/// Retained messages are supported (and durable).
pub const MQTT_RETAIN_AVAILABLE_DEFAULT: bool = true;
/// Wildcard subscriptions are supported (the core matches them in a trie).
pub const MQTT_WILDCARD_AVAILABLE_DEFAULT: bool = true;
/// Shared subscriptions (`$share/group/filter`) are supported.
pub const MQTT_SHARED_AVAILABLE_DEFAULT: bool = true;
/// Topic aliases per connection and direction: saves bandwidth for the
/// usual handful of hot topics at a bounded table size.
pub const MQTT_TOPIC_ALIAS_MAX_DEFAULT: u16 = 64;
/// Longest session expiry granted: one week, so abandoned persistent
/// sessions do not hold queued messages on disk forever.
pub const MQTT_SESSION_EXPIRY_MAX_S_DEFAULT: u32 = 7 * 24 * 3600;

/// Plain subscriptions per session (see
/// [`rosetta_mqtt::config::SUBSCRIPTIONS_MAX`] for why this many).
pub const MQTT_SUBSCRIPTIONS_MAX_DEFAULT: u32 = rosetta_mqtt::config::SUBSCRIPTIONS_MAX as u32;
/// Shared and `$queue/` subscriptions per session (see
/// [`rosetta_mqtt::config::OWN_SUBSCRIPTIONS_MAX`] for why this many).
pub const MQTT_SHARED_SUBSCRIPTIONS_MAX_DEFAULT: u32 =
    rosetta_mqtt::config::OWN_SUBSCRIPTIONS_MAX as u32;

/// `[mqtt]`: MQTT 3.1.1/5.0 server limits, advertised in the v5 CONNACK.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// Longest keep-alive granted, in seconds (v5: sent as Server Keep Alive
    /// to a client that asks for more or for none).
    pub keep_alive_max_s: u16,
    /// Receive Maximum: unacknowledged QoS 1/2 publishes a client may send.
    pub receive_maximum: u16,
    /// Maximum Packet Size accepted, in bytes. Unset (the default): the
    /// payload limit `broker.payload_size_max_bytes` plus
    /// [`HEADERS_ALLOWANCE_BYTES`], within MQTT's own maximum.
    pub packet_size_max_bytes: Option<u32>,
    /// Maximum QoS (0, 1 or 2).
    pub qos_max: u8,
    /// Retain Available.
    pub retain_available: bool,
    /// Wildcard Subscription Available.
    pub wildcard_available: bool,
    /// Shared Subscription Available.
    pub shared_available: bool,
    /// Topic Alias Maximum (0 = no aliases).
    pub topic_alias_max: u16,
    /// Longest session expiry granted, in seconds; also the expiry of
    /// 3.1.1 persistent sessions.
    pub session_expiry_max_s: u32,
    /// Most plain subscriptions per session (SUBACK 0x97 / 0x80 past it).
    pub subscriptions_max: u32,
    /// Most shared and `$queue/` subscriptions per session (SUBACK 0x97 /
    /// 0x80 past it).
    pub shared_subscriptions_max: u32,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            keep_alive_max_s: MQTT_KEEP_ALIVE_MAX_S_DEFAULT,
            receive_maximum: MQTT_RECEIVE_MAXIMUM_DEFAULT,
            packet_size_max_bytes: None,
            qos_max: MQTT_QOS_MAX_DEFAULT,
            retain_available: MQTT_RETAIN_AVAILABLE_DEFAULT,
            wildcard_available: MQTT_WILDCARD_AVAILABLE_DEFAULT,
            shared_available: MQTT_SHARED_AVAILABLE_DEFAULT,
            topic_alias_max: MQTT_TOPIC_ALIAS_MAX_DEFAULT,
            session_expiry_max_s: MQTT_SESSION_EXPIRY_MAX_S_DEFAULT,
            subscriptions_max: MQTT_SUBSCRIPTIONS_MAX_DEFAULT,
            shared_subscriptions_max: MQTT_SHARED_SUBSCRIPTIONS_MAX_DEFAULT,
        }
    }
}

// ---- STOMP ---------------------------------------------------------------

/// Smallest frame limit that still fits a CONNECT with credentials.
pub const STOMP_FRAME_SIZE_MIN_BYTES: u32 = 1024;
/// Headers per frame: real clients send a dozen; this leaves room for
/// application headers and stops header floods.
pub const STOMP_HEADER_COUNT_MAX_DEFAULT: u32 = 128;
/// Longest single header line, in bytes: long JWT-style tokens fit.
pub const STOMP_HEADER_SIZE_MAX_BYTES_DEFAULT: u32 = 8 * 1024;
/// Fastest heart-beat we agree to, either way: a client asking for faster
/// beats gets this, so heart-beats cannot become a CPU load.
pub const STOMP_HEARTBEAT_MIN_MS_DEFAULT: u32 = 1_000;
/// Heart-beat interval we offer to send (CONNECTED `heart-beat` sx).
pub const STOMP_HEARTBEAT_SEND_MS_DEFAULT: u32 = 10_000;
/// Heart-beat interval we ask the client for (CONNECTED `heart-beat` sy):
/// a silent client is found within about 15 s.
pub const STOMP_HEARTBEAT_RECEIVE_MS_DEFAULT: u32 = 10_000;
/// Unacknowledged messages per subscription without a prefetch header:
/// keeps a consumer busy without flooding a slow one.
pub const STOMP_PREFETCH_DEFAULT: u32 = 100;
/// Highest prefetch a client may ask for.
pub const STOMP_PREFETCH_MAX_DEFAULT: u32 = 10_000;
/// Subscriptions per connection: each is a consumer in the core (and a
/// queue and binding for a topic). Real clients hold a few; ActiveMQ,
/// Artemis and RabbitMQ set no cap by default. Past it, STOMP's only answer
/// is an ERROR frame and the close.
pub const STOMP_SUBSCRIPTIONS_MAX_DEFAULT: u32 = 1_024;
/// Open transactions per connection.
pub const STOMP_TRANSACTIONS_MAX_DEFAULT: u32 = 16;

/// `[stomp]`: STOMP 1.0-1.2 limits.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StompConfig {
    /// Largest frame (headers and body), in bytes. Unset (the default): the
    /// payload limit `broker.payload_size_max_bytes` plus what
    /// `header_count_max` headers of `header_size_max_bytes` take.
    pub frame_size_max_bytes: Option<u32>,
    /// Most headers in one frame.
    pub header_count_max: u32,
    /// Longest header line, in bytes.
    pub header_size_max_bytes: u32,
    /// Fastest heart-beat agreed, in milliseconds.
    pub heartbeat_min_ms: u32,
    /// Heart-beat interval offered for our side, in milliseconds (0 = none).
    pub heartbeat_send_ms: u32,
    /// Heart-beat interval wanted from the client, in milliseconds (0 = none).
    pub heartbeat_receive_ms: u32,
    /// Unacknowledged messages per subscription without a prefetch header.
    pub prefetch_default: u32,
    /// Highest prefetch a subscription may ask for.
    pub prefetch_max: u32,
    /// Subscriptions per connection.
    pub subscriptions_max: u32,
    /// Open transactions per connection.
    pub transactions_max: u32,
}

impl Default for StompConfig {
    fn default() -> Self {
        Self {
            frame_size_max_bytes: None,
            header_count_max: STOMP_HEADER_COUNT_MAX_DEFAULT,
            header_size_max_bytes: STOMP_HEADER_SIZE_MAX_BYTES_DEFAULT,
            heartbeat_min_ms: STOMP_HEARTBEAT_MIN_MS_DEFAULT,
            heartbeat_send_ms: STOMP_HEARTBEAT_SEND_MS_DEFAULT,
            heartbeat_receive_ms: STOMP_HEARTBEAT_RECEIVE_MS_DEFAULT,
            prefetch_default: STOMP_PREFETCH_DEFAULT,
            prefetch_max: STOMP_PREFETCH_MAX_DEFAULT,
            subscriptions_max: STOMP_SUBSCRIPTIONS_MAX_DEFAULT,
            transactions_max: STOMP_TRANSACTIONS_MAX_DEFAULT,
        }
    }
}

// ---- AMQP ----------------------------------------------------------------

/// max-frame-size we offer: the common choice of Qpid and Artemis; larger
/// messages span several transfer frames.
pub const AMQP_FRAME_SIZE_MAX_BYTES_DEFAULT: u32 = 64 * 1024;
/// AMQP's MIN-MAX-FRAME-SIZE: no peer may ask for less.
pub const AMQP_FRAME_SIZE_MIN_BYTES: u32 = 512;
/// channel-max: sessions per connection beyond what any client uses.
pub const AMQP_CHANNEL_MAX_DEFAULT: u16 = 255;
/// handle-max: the highest link handle, so 1,024 links per session. JMS
/// opens one per producer and consumer; RabbitMQ allows 256
/// (`link_max_per_session`).
pub const AMQP_HANDLE_MAX_DEFAULT: u32 = 1_023;
/// Links across all sessions of a connection (see
/// [`rosetta_amqp::LINKS_PER_CONNECTION_MAX`] for why this many).
pub const AMQP_LINKS_PER_CONNECTION_MAX_DEFAULT: u32 =
    rosetta_amqp::LINKS_PER_CONNECTION_MAX as u32;
/// Idle timeout we enforce: a peer that sends nothing (an empty frame
/// will do) this long is closed, so dead peers are noticed within a
/// minute. Half of it is announced in Open (AMQP 1.0 §2.4.5).
pub const AMQP_IDLE_TIMEOUT_MS_DEFAULT: u32 = 60_000;
/// Shortest idle timeout accepted from a peer or configured: keeps
/// keep-alive traffic from becoming a load.
pub const AMQP_IDLE_TIMEOUT_MIN_MS: u32 = 1_000;
/// Link credit granted to a sending client and refilled as the store keeps
/// up: deep enough to hide a commit round trip at full speed.
pub const AMQP_LINK_CREDIT_WINDOW_DEFAULT: u32 = 1_000;

/// `[amqp]`: AMQP 1.0 limits.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpConfig {
    /// max-frame-size offered, in bytes.
    pub frame_size_max_bytes: u32,
    /// Largest message, in bytes, across its transfer frames (all sections).
    /// Unset (the default): the payload limit `broker.payload_size_max_bytes`
    /// plus [`HEADERS_ALLOWANCE_BYTES`].
    pub message_size_max_bytes: Option<u32>,
    /// channel-max offered (highest channel number).
    pub channel_max: u16,
    /// handle-max offered (highest link handle): `handle_max + 1` links
    /// per session.
    pub handle_max: u32,
    /// Most links across all sessions of a connection.
    pub links_per_connection_max: u32,
    /// Idle timeout enforced, in milliseconds (0 = none); half of it is
    /// announced in Open.
    pub idle_timeout_ms: u32,
    /// Credit granted to each client sender link.
    pub link_credit_window: u32,
}

impl Default for AmqpConfig {
    fn default() -> Self {
        Self {
            frame_size_max_bytes: AMQP_FRAME_SIZE_MAX_BYTES_DEFAULT,
            message_size_max_bytes: None,
            channel_max: AMQP_CHANNEL_MAX_DEFAULT,
            handle_max: AMQP_HANDLE_MAX_DEFAULT,
            links_per_connection_max: AMQP_LINKS_PER_CONNECTION_MAX_DEFAULT,
            idle_timeout_ms: AMQP_IDLE_TIMEOUT_MS_DEFAULT,
            link_credit_window: AMQP_LINK_CREDIT_WINDOW_DEFAULT,
        }
    }
}
