//! `[broker]`, `[security]` and `[[bindings]]`: delivery policy, access and
//! static topic-to-queue bindings (`[[queues]]` is in `queues.rs`).

use std::path::PathBuf;

use rosetta_neutral::address::validate_topic_filter;
use rosetta_neutral::Address;
use serde::{Deserialize, Deserializer};

/// Dead-letter address: see [`rosetta_core::DEAD_LETTER_ADDRESS_DEFAULT`].
pub const DEAD_LETTER_QUEUE_DEFAULT: &str = rosetta_core::DEAD_LETTER_ADDRESS_DEFAULT;
/// Delivery attempts before dead-lettering: see
/// [`rosetta_core::DELIVERY_ATTEMPTS_MAX_DEFAULT`].
pub const DELIVERY_ATTEMPTS_MAX_DEFAULT: u32 = rosetta_core::DELIVERY_ATTEMPTS_MAX_DEFAULT;
/// Queues created on first use: see [`rosetta_core::AUTO_CREATE_QUEUES_DEFAULT`].
pub const AUTO_CREATE_QUEUES_DEFAULT: bool = rosetta_core::AUTO_CREATE_QUEUES_DEFAULT;
/// Messages one queue may hold: see [`rosetta_core::QUEUE_DEPTH_MAX_DEFAULT`].
pub const QUEUE_DEPTH_MAX_DEFAULT: u64 = rosetta_core::QUEUE_DEPTH_MAX_DEFAULT;
/// Authenticated connections across all listeners: each costs a file
/// descriptor and a few KiB, so this bounds both.
pub const CONNECTIONS_MAX_DEFAULT: u32 = 100_000;
/// Connections accepted and not yet authenticated, all listeners together.
/// They have their own cap, apart from `connections_max`, so sockets that
/// never log in cannot lock out clients that do: OpenSSH's `MaxStartups`
/// is the model. Mosquitto, EMQX, NATS and RabbitMQ count such sockets
/// against their one connection limit and only bound how long they may
/// stay (NATS' auth timeout, RabbitMQ's 10 s handshake timeout) or how
/// fast they come (EMQX's `max_conn_rate`). A thousand logins in progress
/// is more than the broker verifies within `connect_timeout_ms` when each
/// password check costs milliseconds of CPU by design (argon2), so a
/// larger cap would only hold sockets that time out; a reconnect storm
/// beyond it is told "server busy" and retries.
pub const UNAUTHENTICATED_CONNECTIONS_MAX_DEFAULT: u32 = 1_024;
/// Connections not yet authenticated from one source address: an eighth
/// of the above, so one host cannot take them all, while a NAT gateway in
/// front of many devices, or a load tool opening a hundred connections at
/// once, still fits.
pub const UNAUTHENTICATED_PER_ADDRESS_MAX_DEFAULT: u32 = 128;
/// Queues all clients together may create (see
/// [`rosetta_core::QUEUES_MAX_DEFAULT`] for why this many).
pub const QUEUES_MAX_DEFAULT: u64 = rosetta_core::QUEUES_MAX_DEFAULT as u64;
/// Topic bindings all clients together may create (see
/// [`rosetta_core::BINDINGS_MAX_DEFAULT`] for why this many).
pub const BINDINGS_MAX_DEFAULT: u64 = rosetta_core::BINDINGS_MAX_DEFAULT as u64;
/// Time from accept to an authenticated session: a client that has not
/// finished its handshake by then is closed, so idle sockets cannot hold
/// connection slots.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Time clients get to finish on shutdown before the journal is flushed
/// and the process exits.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 5_000;
/// Largest message payload (body) every protocol and transport accepts:
/// what mosquitto and RabbitMQ users send without tuning (they accept 10 MiB
/// and more by default) with room to spare. A message in flight costs about
/// twice its size while it is read and journaled (see the README).
pub const PAYLOAD_SIZE_MAX_BYTES_DEFAULT: u32 = 16 * 1024 * 1024;
/// Highest payload limit accepted: 256 MiB (MQTT itself stops a little
/// short of it: its packets are at most 256 MiB including the topic).
pub const PAYLOAD_SIZE_MAX_BYTES_LIMIT: u32 = 256 * 1024 * 1024;
/// Lowest payload limit accepted.
pub const PAYLOAD_SIZE_MAX_BYTES_MIN: u32 = 1024;
/// Bytes of deliveries one connection may have waiting to be written:
/// plenty for a reader that keeps up (the driver writes in 64 KiB
/// batches), small enough that thousands of stalled readers stay cheap.
/// One message larger than this still goes, alone.
pub const DELIVERY_BUFFER_BYTES_MAX_DEFAULT: u64 = 4 * 1024 * 1024;
/// How long a connection may leave its delivery buffer full without
/// reading before it is closed as a slow consumer: long enough for a GC
/// pause or a laptop's network hiccup, short enough that a dead reader's
/// connection does not linger (NATS closes after a 10 s write deadline).
pub const SLOW_CONSUMER_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Anonymous access is on so that a first run just works; turn it off for
/// anything reachable by others.
pub const ANONYMOUS_DEFAULT: bool = true;
/// File name of the users file, looked up next to the configuration file
/// (or in the working directory without one).
pub const USERS_FILE_NAME_DEFAULT: &str = "users.toml";
/// Most password-hashing threads a configuration may ask for: each holds
/// 8 MiB while it hashes, and more threads than cores only add waiting.
pub const PASSWORD_CHECK_THREADS_MAX: usize = 64;
/// Password checks that may wait for a thread by default: at ~14 ms each,
/// 512 are about 7 s of one thread's work, inside the 10 s connect
/// timeout, so a queued login is answered before its client gives up.
/// Each waiting check holds a user name and a password (at most ~1.3 KiB).
pub const PASSWORD_CHECK_QUEUE_MAX_DEFAULT: usize = 512;
/// Most waiting password checks a configuration may ask for (~85 MiB of
/// queued credentials at worst).
pub const PASSWORD_CHECK_QUEUE_MAX_LIMIT: usize = 65_536;

/// Reads a destination under the naming scheme (`/queue/q`, bare `q`,
/// `/topic/t`).
fn deserialize_address<'de, D>(de: D) -> Result<Address, D::Error>
where
    D: Deserializer<'de>,
{
    let s = String::deserialize(de)?;
    Address::parse_destination(&s).map_err(serde::de::Error::custom)
}

pub(crate) fn deserialize_address_opt<'de, D>(de: D) -> Result<Option<Address>, D::Error>
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
pub(crate) fn deserialize_filter<'de, D>(de: D) -> Result<String, D::Error>
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
    /// Most authenticated connections across all listeners.
    pub connections_max: u32,
    /// Most connections accepted and not yet authenticated, in total.
    pub unauthenticated_connections_max: u32,
    /// Most connections not yet authenticated from one source address.
    pub unauthenticated_per_address_max: u32,
    /// Most queues, all clients together.
    pub queues_max: u64,
    /// Most topic bindings (MQTT subscriptions, STOMP and AMQP topic
    /// subscriptions), all clients together.
    pub bindings_max: u64,
    /// Time from accept to authenticated session, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Grace period for clients on shutdown, in milliseconds.
    pub shutdown_grace_ms: u64,
    /// Largest message payload accepted from any client, in bytes; the
    /// protocols' frame limits are derived from it unless set.
    pub payload_size_max_bytes: u32,
    /// Bytes of deliveries one connection may have waiting to be written;
    /// past it the core stops dispatching to that connection.
    pub delivery_buffer_bytes_max: u64,
    /// A connection that does not read while its delivery buffer is full
    /// for this long is closed as a slow consumer; 0 = never.
    pub slow_consumer_timeout_ms: u64,
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
            unauthenticated_connections_max: UNAUTHENTICATED_CONNECTIONS_MAX_DEFAULT,
            unauthenticated_per_address_max: UNAUTHENTICATED_PER_ADDRESS_MAX_DEFAULT,
            queues_max: QUEUES_MAX_DEFAULT,
            bindings_max: BINDINGS_MAX_DEFAULT,
            connect_timeout_ms: CONNECT_TIMEOUT_MS_DEFAULT,
            shutdown_grace_ms: SHUTDOWN_GRACE_MS_DEFAULT,
            payload_size_max_bytes: PAYLOAD_SIZE_MAX_BYTES_DEFAULT,
            delivery_buffer_bytes_max: DELIVERY_BUFFER_BYTES_MAX_DEFAULT,
            slow_consumer_timeout_ms: SLOW_CONSUMER_TIMEOUT_MS_DEFAULT,
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
    /// The users file (see `rosetta_server::users`). Absent = `users.toml`
    /// next to the configuration file; see [`crate::Config::users_file`].
    pub users_file: Option<PathBuf>,
    /// Threads that check passwords (see `rosetta_server::hash_pool`).
    /// Absent = half the cores, at least one.
    pub password_check_threads: Option<usize>,
    /// Password checks that may wait for a thread; past this a login is
    /// refused as "server busy" (MQTT CONNACK 0x89/3, a STOMP ERROR, AMQP
    /// sasl-outcome sys-temp).
    pub password_check_queue_max: usize,
}

impl Default for SecurityConfig {
    fn default() -> Self {
        Self {
            anonymous: ANONYMOUS_DEFAULT,
            users_file: None,
            password_check_threads: None,
            password_check_queue_max: PASSWORD_CHECK_QUEUE_MAX_DEFAULT,
        }
    }
}

/// `[[bindings]]`: a queue fed with a copy of every message published to
/// topics matching `filter`, so MQTT publishers can feed queues that STOMP
/// and AMQP consumers compete on. The queue is created, durable, at start.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// The queue: bare `q` or `/queue/q` (stored as the core name `q`).
    #[serde(deserialize_with = "deserialize_queue_name")]
    pub queue: String,
    /// An MQTT topic filter in core terms: `sensors/+/temp`, `orders/#`.
    #[serde(deserialize_with = "deserialize_filter")]
    pub filter: String,
}
