//! The broker's configuration: a TOML file, or embedded defaults.
//!
//! `rosetta` with no `--config` runs on [`Config::default`]: data in
//! `./data`, MQTT on 1883, STOMP on 61613, AMQP on 5672 and WebSocket on
//! 8080, anonymous access on, every listener on loopback only. `config/rosetta.toml` spells out exactly
//! these defaults with a comment on each key (a test keeps the two equal).
//!
//! Every key is optional: a missing key takes its default, so a file only
//! needs what it changes. Unknown keys are errors (a typo must not be
//! silently ignored). [`Config::load`] never panics: a missing file, a TOML
//! syntax error, an unknown key, a value of the wrong type or an invalid
//! value each give a [`ConfigError`] that names the file, the line and the
//! key, e.g.
//!
//! ```text
//! config/rosetta.toml:14:8: `listeners.mqtt`: `0.0.0.0:70000`: port 70000 is out of range (0-65535)
//! ```
//!
//! Constraints that involve several keys, or that types alone cannot state
//! (a zero segment size), are checked by [`Config::validate`] after
//! parsing; its errors are located in the file the same way.
//!
//! Each default is a named constant with the reason for its value, and
//! every key carries its unit in its name (`_ms`, `_s`, `_bytes`).
//!
//! Relative paths (`data_dir`, TLS files, `security.users_file`) are
//! relative to the working directory, except the *default* users file,
//! which is `users.toml` next to the configuration file.

mod admin;
mod broker;
mod cluster;
mod limits;
mod listeners;
/// Also for the users file's errors (`rosetta_server::users`), which point
/// at a key and line the same way.
#[doc(hidden)]
pub mod locate;
mod protocols;
mod queues;
mod store;
mod streams;
mod sys;
mod topics;
mod transport;

#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use admin::*;
pub use broker::*;
pub use cluster::*;
pub use listeners::*;
pub use protocols::*;
pub use queues::*;
pub use store::*;
pub use streams::*;
pub use sys::*;
pub use topics::*;
pub use transport::*;

/// Where data lives by default: next to where the broker was started, so a
/// first run in a checkout keeps its data beside it.
pub const DATA_DIR_DEFAULT: &str = "./data";

/// The whole configuration. See the module docs for the file format.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory of the journal and other durable state.
    pub data_dir: PathBuf,
    /// `[listeners]`: addresses per protocol and transport.
    pub listeners: Listeners,
    /// `[tls]`: certificate and key; TLS listeners run only with both.
    pub tls: TlsConfig,
    /// `[websocket]`: origin allow-list and message size.
    pub websocket: WebSocketConfig,
    /// `[store]`: the journal.
    pub store: StoreConfig,
    /// `[broker]`: delivery policy and resource limits.
    pub broker: BrokerConfig,
    /// `[security]`: anonymous access and the users file.
    pub security: SecurityConfig,
    /// `[mqtt]`: MQTT limits.
    pub mqtt: MqttConfig,
    /// `[stomp]`: STOMP limits.
    pub stomp: StompConfig,
    /// `[amqp]`: AMQP 1.0 limits.
    pub amqp: AmqpConfig,
    /// `[[bindings]]`: queues fed from topic filters.
    pub bindings: Vec<Binding>,
    /// `[[queues]]`: per-queue settings, by name or pattern.
    pub queues: Vec<QueueEntry>,
    /// `[[streams]]`: queues kept as logs, by name or prefix pattern.
    pub streams: Vec<StreamEntry>,
    /// `[[topics]]`: settings of topic addresses (duplicate detection), by
    /// topic filter.
    pub topics: Vec<TopicEntry>,
    /// `[admin]`: the admin HTTP API.
    pub admin: AdminConfig,
    /// `[sys]`: the `$SYS/broker/...` topics.
    pub sys: SysConfig,
    /// `[cluster]`: membership on etcd and the balancer; `None`: one node.
    pub cluster: Option<ClusterConfig>,
    /// Directory of the file this was loaded from (`None` for the embedded
    /// defaults or a string); the default users file is looked up there.
    #[serde(skip)]
    pub config_dir: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from(DATA_DIR_DEFAULT),
            listeners: Listeners::default(),
            tls: TlsConfig::default(),
            websocket: WebSocketConfig::default(),
            store: StoreConfig::default(),
            broker: BrokerConfig::default(),
            security: SecurityConfig::default(),
            mqtt: MqttConfig::default(),
            stomp: StompConfig::default(),
            amqp: AmqpConfig::default(),
            bindings: Vec::new(),
            queues: Vec::new(),
            streams: Vec::new(),
            topics: Vec::new(),
            admin: AdminConfig::default(),
            sys: SysConfig::default(),
            cluster: None,
            config_dir: None,
        }
    }
}

/// Where in a configuration a problem is: the file (or `<configuration>`
/// for one built in memory), and the line and column when the key is in the
/// file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// File name as given, or `<configuration>`.
    pub origin: String,
    /// 1-based line.
    pub line: Option<usize>,
    /// 1-based column, in characters.
    pub column: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

/// Origin used for configurations that did not come from a file.
const IN_MEMORY_ORIGIN: &str = "<configuration>";

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read (missing, unreadable).
    #[error("cannot read configuration file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{location}: TOML syntax error: {message}")]
    Syntax {
        /// Where.
        location: Location,
        /// What the parser expected.
        message: String,
    },
    /// A key is unknown, has the wrong type or an invalid value.
    #[error("{location}: `{key}`: {message}")]
    Invalid {
        /// Where.
        location: Location,
        /// Dotted key path, e.g. `store.sync` or `bindings[0].filter`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    /// The key at fault, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The 1-based line at fault, if known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Syntax { location, .. } | ConfigError::Invalid { location, .. } => {
                location.line
            }
            ConfigError::Read { .. } => None,
        }
    }
}

/// A validation failure before it is located in a file.
struct Invalid {
    key: String,
    message: String,
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid {
        key: key.into(),
        message: message.into(),
    }
}

impl Config {
    /// Reads, parses and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::parse(&text, &path.display().to_string())?;
        config.config_dir = path.parent().map(Path::to_owned);
        Ok(config)
    }

    /// Parses and validates a configuration held in a string. `origin`
    /// names it in errors (a file name, or e.g. `<string>`).
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let locate = |pos: Option<usize>| {
            let (line, column) = match pos {
                Some(p) => {
                    let (l, c) = locate::line_col(text, p);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            Location {
                origin: origin.to_owned(),
                line,
                column,
            }
        };
        // Syntax first: a document that does not parse has no keys to name.
        let document = toml::de::DeTable::parse(text).map_err(|e| ConfigError::Syntax {
            location: locate(e.span().map(|s| s.start)),
            message: one_line(e.message()),
        })?;
        // From the document parsed above: `toml::from_str` would parse the
        // text a second time, which was half the cost of every parse.
        let config = Config::deserialize(toml::de::Deserializer::from(document)).map_err(|e| {
            let pos = e.span().map(|s| s.start);
            let key = pos
                .and_then(|p| locate::key_at(text, p))
                .unwrap_or_else(|| "(document)".to_owned());
            ConfigError::Invalid {
                location: locate(pos),
                key,
                message: one_line(&readable(e.message())),
            }
        })?;
        config.check().map_err(|Invalid { key, message }| {
            let span = locate::span_of(text, &key);
            ConfigError::Invalid {
                location: locate(span.map(|s| s.start)),
                key,
                message,
            }
        })?;
        Ok(config)
    }

    /// Checks the constraints that types alone do not express. Errors name
    /// the key; [`Config::load`] adds the file and line.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check()
            .map_err(|Invalid { key, message }| ConfigError::Invalid {
                location: Location {
                    origin: IN_MEMORY_ORIGIN.to_owned(),
                    line: None,
                    column: None,
                },
                key,
                message,
            })
    }

    /// The listeners to open: every configured one, except the TLS
    /// listeners when `[tls]` has no certificate and key.
    pub fn active_listeners(&self) -> Vec<(ListenerKind, ListenAddr)> {
        self.listeners
            .all()
            .into_iter()
            .filter(|(kind, _)| !kind.needs_tls() || self.tls.enabled())
            .collect()
    }

    /// The users file: `security.users_file` if set, else `users.toml`
    /// next to the configuration file (or in the working directory when
    /// running on defaults).
    pub fn users_file(&self) -> PathBuf {
        match &self.security.users_file {
            Some(path) => path.clone(),
            None => self
                .config_dir
                .as_deref()
                .unwrap_or(Path::new("."))
                .join(USERS_FILE_NAME_DEFAULT),
        }
    }

    fn check(&self) -> Result<(), Invalid> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        self.check_listeners()?;
        self.check_tls()?;
        self.check_websocket()?;
        self.check_store()?;
        self.check_broker()?;
        self.check_security()?;
        self.check_mqtt()?;
        self.check_stomp()?;
        self.check_amqp()?;
        self.check_bindings()?;
        self.check_queues()?;
        self.check_streams()?;
        self.check_topics()?;
        within("sys.interval_s", self.sys.interval_s, 0, SYS_INTERVAL_S_MAX)?;
        self.check_cluster()
    }

    fn check_listeners(&self) -> Result<(), Invalid> {
        let all = self.listeners.all();
        for (i, (kind, addr)) in all.iter().enumerate() {
            if addr.port == 0 {
                continue; // each port-0 listener gets its own free port
            }
            if let Some((other, _)) = all[..i].iter().find(|(_, a)| a == addr) {
                return Err(invalid(
                    format!("listeners.{}", kind.key()),
                    format!("`{addr}` is already used by `listeners.{}`", other.key()),
                ));
            }
        }
        Ok(())
    }

    fn check_tls(&self) -> Result<(), Invalid> {
        let tls = &self.tls;
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => {
                return Err(invalid(
                    "tls.key_file",
                    "`tls.cert_file` is set, so the key is needed too",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "tls.cert_file",
                    "`tls.key_file` is set, so the certificate is needed too",
                ))
            }
            _ => {}
        }
        if tls.client_ca_file.is_some() && !tls.enabled() {
            return Err(invalid(
                "tls.client_ca_file",
                "client certificates need TLS: set `tls.cert_file` and `tls.key_file`",
            ));
        }
        if tls.require_client_cert && tls.client_ca_file.is_none() {
            return Err(invalid(
                "tls.client_ca_file",
                "`tls.require_client_cert` is on, so a CA to verify client certificates is needed",
            ));
        }
        positive("tls.handshake_timeout_ms", tls.handshake_timeout_ms)
    }

    fn check_websocket(&self) -> Result<(), Invalid> {
        let ws = &self.websocket;
        for (i, origin) in ws.allowed_origins.iter().enumerate() {
            if !origin.contains("://") {
                return Err(invalid(
                    format!("websocket.allowed_origins[{i}]"),
                    format!("`{origin}` is not an origin: write scheme://host[:port]"),
                ));
            }
        }
        at_least(
            "websocket.message_size_max_bytes",
            self.websocket_message_size_max() as u64,
            WEBSOCKET_MESSAGE_SIZE_MIN_BYTES as u64,
        )
    }

    fn check_store(&self) -> Result<(), Invalid> {
        let s = &self.store;
        positive("store.sync_interval_ms", s.sync_interval_ms)?;
        within(
            "store.segment_size_bytes",
            s.segment_size_bytes,
            SEGMENT_SIZE_MIN_BYTES,
            SEGMENT_SIZE_MAX_BYTES,
        )?;
        at_least(
            "store.memory_budget_bytes",
            s.memory_budget_bytes,
            MEMORY_BUDGET_MIN_BYTES,
        )?;
        positive("store.compaction_interval_ms", s.compaction_interval_ms)
    }

    fn check_broker(&self) -> Result<(), Invalid> {
        let b = &self.broker;
        positive(
            "broker.delivery_attempts_max",
            b.delivery_attempts_max.into(),
        )?;
        positive("broker.queue_depth_max", b.queue_depth_max)?;
        positive("broker.connections_max", b.connections_max.into())?;
        positive("broker.connect_timeout_ms", b.connect_timeout_ms)?;
        within(
            "broker.payload_size_max_bytes",
            b.payload_size_max_bytes.into(),
            PAYLOAD_SIZE_MAX_BYTES_MIN.into(),
            PAYLOAD_SIZE_MAX_BYTES_LIMIT.into(),
        )?;
        positive(
            "broker.delivery_buffer_bytes_max",
            b.delivery_buffer_bytes_max,
        )?;
        positive(
            "broker.unauthenticated_connections_max",
            b.unauthenticated_connections_max.into(),
        )?;
        positive(
            "broker.unauthenticated_per_address_max",
            b.unauthenticated_per_address_max.into(),
        )?;
        positive("broker.queues_max", b.queues_max)?;
        positive("broker.bindings_max", b.bindings_max)
    }

    fn check_security(&self) -> Result<(), Invalid> {
        let s = &self.security;
        if let Some(threads) = s.password_check_threads {
            within(
                "security.password_check_threads",
                threads as u64,
                1,
                PASSWORD_CHECK_THREADS_MAX as u64,
            )?;
        }
        within(
            "security.password_check_queue_max",
            s.password_check_queue_max as u64,
            0,
            PASSWORD_CHECK_QUEUE_MAX_LIMIT as u64,
        )
    }

    fn check_mqtt(&self) -> Result<(), Invalid> {
        let m = &self.mqtt;
        positive("mqtt.keep_alive_max_s", m.keep_alive_max_s.into())?;
        positive("mqtt.receive_maximum", m.receive_maximum.into())?;
        within(
            "mqtt.packet_size_max_bytes",
            self.mqtt_packet_size_max().into(),
            MQTT_PACKET_SIZE_MIN_BYTES.into(),
            MQTT_PACKET_SIZE_PROTOCOL_MAX_BYTES.into(),
        )?;
        within("mqtt.qos_max", m.qos_max.into(), 0, 2)?;
        positive("mqtt.subscriptions_max", m.subscriptions_max.into())?;
        positive(
            "mqtt.shared_subscriptions_max",
            m.shared_subscriptions_max.into(),
        )
    }

    fn check_stomp(&self) -> Result<(), Invalid> {
        let s = &self.stomp;
        at_least(
            "stomp.frame_size_max_bytes",
            self.stomp_frame_size_max().into(),
            STOMP_FRAME_SIZE_MIN_BYTES.into(),
        )?;
        // CONNECT alone carries accept-version, host, login, passcode and
        // heart-beat.
        at_least("stomp.header_count_max", s.header_count_max.into(), 8)?;
        at_least(
            "stomp.header_size_max_bytes",
            s.header_size_max_bytes.into(),
            256,
        )?;
        if s.header_size_max_bytes > self.stomp_frame_size_max() {
            return Err(invalid(
                "stomp.header_size_max_bytes",
                "must not exceed `stomp.frame_size_max_bytes`",
            ));
        }
        positive("stomp.heartbeat_min_ms", s.heartbeat_min_ms.into())?;
        for (key, value) in [
            ("stomp.heartbeat_send_ms", s.heartbeat_send_ms),
            ("stomp.heartbeat_receive_ms", s.heartbeat_receive_ms),
        ] {
            if value != 0 && value < s.heartbeat_min_ms {
                return Err(invalid(
                    key,
                    format!(
                        "{value} is below `stomp.heartbeat_min_ms` ({}); use 0 for no heart-beats",
                        s.heartbeat_min_ms
                    ),
                ));
            }
        }
        positive("stomp.prefetch_max", s.prefetch_max.into())?;
        within(
            "stomp.prefetch_default",
            s.prefetch_default.into(),
            1,
            s.prefetch_max.into(),
        )?;
        positive("stomp.subscriptions_max", s.subscriptions_max.into())?;
        positive("stomp.transactions_max", s.transactions_max.into())
    }

    fn check_amqp(&self) -> Result<(), Invalid> {
        let a = &self.amqp;
        at_least(
            "amqp.frame_size_max_bytes",
            a.frame_size_max_bytes.into(),
            AMQP_FRAME_SIZE_MIN_BYTES.into(),
        )?;
        positive(
            "amqp.message_size_max_bytes",
            self.amqp_message_size_max().into(),
        )?;
        if a.idle_timeout_ms != 0 && a.idle_timeout_ms < AMQP_IDLE_TIMEOUT_MIN_MS {
            return Err(invalid(
                "amqp.idle_timeout_ms",
                format!(
                    "{} is below {AMQP_IDLE_TIMEOUT_MIN_MS}; use 0 for no idle timeout",
                    a.idle_timeout_ms
                ),
            ));
        }
        positive(
            "amqp.links_per_connection_max",
            a.links_per_connection_max.into(),
        )?;
        positive("amqp.link_credit_window", a.link_credit_window.into())
    }

    fn check_bindings(&self) -> Result<(), Invalid> {
        let repeat = first_repeat(&self.bindings);
        for (i, b) in self.bindings.iter().enumerate() {
            if let Err(e) = rosetta_neutral::Address::parse_destination(&b.queue) {
                return Err(invalid(format!("bindings[{i}].queue"), e.to_string()));
            }
            if let Err(e) = rosetta_neutral::address::validate_topic_filter(&b.filter) {
                return Err(invalid(format!("bindings[{i}].filter"), e.to_string()));
            }
            if repeat == Some(i) {
                return Err(invalid(
                    format!("bindings[{i}]"),
                    format!("binds `{}` to queue `{}` a second time", b.filter, b.queue),
                ));
            }
        }
        Ok(())
    }
}

/// The index of the first item equal to an earlier one. A set of the items
/// seen, not a scan of the earlier ones: that made a file of many bindings
/// cost quadratic time (FUZZING.md, finding 2).
fn first_repeat<T: Eq + Hash>(items: &[T]) -> Option<usize> {
    let mut seen = HashSet::with_capacity(items.len());
    items.iter().position(|item| !seen.insert(item))
}

fn positive(key: &str, value: u64) -> Result<(), Invalid> {
    if value == 0 {
        return Err(invalid(key, "must be greater than 0"));
    }
    Ok(())
}

fn at_least(key: &str, value: u64, min: u64) -> Result<(), Invalid> {
    if value < min {
        return Err(invalid(
            key,
            format!("{value} is below the minimum of {min}"),
        ));
    }
    Ok(())
}

fn within(key: &str, value: u64, min: u64, max: u64) -> Result<(), Invalid> {
    if value < min || value > max {
        return Err(invalid(
            key,
            format!("{value} is out of range ({min}-{max})"),
        ));
    }
    Ok(())
}

/// Words serde's messages in the file's terms: TOML has keys and tables,
/// not fields and structs.
fn readable(message: &str) -> String {
    let message = message.replacen("unknown field", "unknown key", 1);
    match message.find("expected struct ") {
        Some(i) => format!("{}expected a table", &message[..i]),
        None => message,
    }
}

/// Joins a multi-line parser message into one line, for log-friendly errors.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}
