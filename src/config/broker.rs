//! `[broker]`, `[security]` and `[[bindings]]`: delivery policy, access and
//! static topic-to-queue bindings.

use std::path::PathBuf;

use rosetta_neutral::address::validate_topic_filter;
use rosetta_neutral::Address;
use serde::{Deserialize, Deserializer};

/// Dead-letter address: the queue `DLQ`, the name ActiveMQ and Artemis use,
/// so operators find it where they look.
pub const DEAD_LETTER_QUEUE_DEFAULT: &str = "DLQ";
/// Delivery attempts before a message is dead-lettered: enough to ride out
/// a consumer restart loop, few enough that a poison message stops soon.
pub const DELIVERY_ATTEMPTS_MAX_DEFAULT: u32 = 10;
/// Queues named by a producer or consumer spring into being, as STOMP and
/// AMQP clients expect from ActiveMQ and RabbitMQ.
pub const AUTO_CREATE_QUEUES_DEFAULT: bool = true;
/// Messages one queue may hold: past this, producers get a resource-limit
/// error instead of the broker running out of disk or memory.
pub const QUEUE_DEPTH_MAX_DEFAULT: u64 = crate::core::QUEUE_DEPTH_MAX_DEFAULT;
/// Open connections across all listeners: each costs a file descriptor
/// and a few KiB, so this bounds both.
pub const CONNECTIONS_MAX_DEFAULT: u32 = 100_000;
/// Queues all clients together may create (see
/// [`crate::core::QUEUES_MAX_DEFAULT`] for why this many).
pub const QUEUES_MAX_DEFAULT: u64 = crate::core::QUEUES_MAX_DEFAULT as u64;
/// Topic bindings all clients together may create (see
/// [`crate::core::BINDINGS_MAX_DEFAULT`] for why this many).
pub const BINDINGS_MAX_DEFAULT: u64 = crate::core::BINDINGS_MAX_DEFAULT as u64;
/// Time from accept to an authenticated session: a client that has not
/// finished its handshake by then is closed, so idle sockets cannot hold
/// connection slots.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Time clients get to finish on shutdown before the journal is flushed
/// and the process exits.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 5_000;
/// Anonymous access is on so that a first run just works; turn it off for
/// anything reachable by others.
pub const ANONYMOUS_DEFAULT: bool = true;
/// File name of the users file, looked up next to the configuration file
/// (or in the working directory without one).
pub const USERS_FILE_NAME_DEFAULT: &str = "users.toml";

/// Reads a destination under the naming scheme (`/queue/q`, bare `q`,
/// `/topic/t`).
fn deserialize_address<'de, D>(de: D) -> Result<Address, D::Error>
where
    D: Deserializer<'de>,
{
    let s = String::deserialize(de)?;
    Address::parse_destination(&s).map_err(serde::de::Error::custom)
}

fn deserialize_address_opt<'de, D>(de: D) -> Result<Option<Address>, D::Error>
where
    D: Deserializer<'de>,
{
    deserialize_address(de).map(Some)
}

/// Reads a queue name: bare `q` or `/queue/q`, never a topic.
fn deserialize_queue_name<'de, D>(de: D) -> Result<String, D::Error>
where
    D: Deserializer<'de>,
{
    match deserialize_address(de)? {
        Address::Queue(q) => Ok(q),
        Address::Topic(t) => Err(serde::de::Error::custom(format!(
            "`/topic/{t}` is a topic; a binding feeds a queue (`q` or `/queue/q`)"
        ))),
    }
}

/// Reads an MQTT topic filter in core terms (`sensors/+/temp`).
fn deserialize_filter<'de, D>(de: D) -> Result<String, D::Error>
where
    D: Deserializer<'de>,
{
    let s = String::deserialize(de)?;
    validate_topic_filter(&s).map_err(serde::de::Error::custom)?;
    Ok(s)
}

/// `[broker]`: delivery policy and resource limits.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Where rejected messages and messages past `delivery_attempts_max`
    /// go (a destination under the naming scheme; bare `DLQ` = the queue).
    #[serde(deserialize_with = "deserialize_address")]
    pub dead_letter_address: Address,
    /// Delivery attempts before a message is dead-lettered.
    pub delivery_attempts_max: u32,
    /// Where expired messages go; absent = they are dropped.
    #[serde(deserialize_with = "deserialize_address_opt")]
    pub expiry_address: Option<Address>,
    /// Create a queue when a client names one that does not exist.
    pub auto_create_queues: bool,
    /// Most messages one queue may hold.
    pub queue_depth_max: u64,
    /// Most open connections across all listeners.
    pub connections_max: u32,
    /// Most queues, all clients together.
    pub queues_max: u64,
    /// Most topic bindings (MQTT subscriptions, STOMP and AMQP topic
    /// subscriptions), all clients together.
    pub bindings_max: u64,
    /// Time from accept to authenticated session, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Grace period for clients on shutdown, in milliseconds.
    pub shutdown_grace_ms: u64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            dead_letter_address: Address::Queue(DEAD_LETTER_QUEUE_DEFAULT.to_owned()),
            delivery_attempts_max: DELIVERY_ATTEMPTS_MAX_DEFAULT,
            expiry_address: None,
            auto_create_queues: AUTO_CREATE_QUEUES_DEFAULT,
            queue_depth_max: QUEUE_DEPTH_MAX_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            queues_max: QUEUES_MAX_DEFAULT,
            bindings_max: BINDINGS_MAX_DEFAULT,
            connect_timeout_ms: CONNECT_TIMEOUT_MS_DEFAULT,
            shutdown_grace_ms: SHUTDOWN_GRACE_MS_DEFAULT,
        }
    }
}

/// `[security]`: who may connect.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// Allow clients without credentials. They get the users file's
    /// `[anonymous]` permissions (everything by default).
    pub anonymous: bool,
    /// The users file (see [`crate::users`]). Absent = `users.toml` next
    /// to the configuration file; see [`crate::config::Config::users_file`].
    pub users_file: Option<PathBuf>,
}

impl Default for SecurityConfig {
    fn default() -> Self {
        Self {
            anonymous: ANONYMOUS_DEFAULT,
            users_file: None,
        }
    }
}

/// `[[bindings]]`: a queue fed with a copy of every message published to
/// topics matching `filter`, so MQTT publishers can feed queues that STOMP
/// and AMQP consumers compete on. The queue is created, durable, at start.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// The queue: bare `q` or `/queue/q` (stored as the core name `q`).
    #[serde(deserialize_with = "deserialize_queue_name")]
    pub queue: String,
    /// An MQTT topic filter in core terms: `sensors/+/temp`, `orders/#`.
    #[serde(deserialize_with = "deserialize_filter")]
    pub filter: String,
}
