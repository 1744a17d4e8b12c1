//! `[listeners]`: where the broker accepts connections.
//!
//! Each listener is a port, bound on the interface `bind` names, or a
//! whole `host:port` of its own. `bind` is loopback by default, as in
//! Mosquitto 2: a broker started without a configuration lets anonymous
//! clients do everything, so only clients on the same machine may reach
//! it until the operator opens it with `bind = "0.0.0.0"` (see
//! [`Listeners::bind`]).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

/// The interface listeners bind by default: loopback, so a first run is
/// reachable from this machine only (anonymous access is on by default).
pub const BIND_DEFAULT: &str = "127.0.0.1";
/// Plain MQTT: the IANA port for MQTT over TCP.
pub const MQTT_PORT_DEFAULT: u16 = 1883;
/// Plain STOMP: the port ActiveMQ and RabbitMQ use, which STOMP clients assume.
pub const STOMP_PORT_DEFAULT: u16 = 61613;
/// Plain AMQP 1.0: the IANA port for AMQP.
pub const AMQP_PORT_DEFAULT: u16 = 5672;
/// WebSocket (all three protocols, and the demo page): the conventional alternative HTTP port.
pub const WEBSOCKET_PORT_DEFAULT: u16 = 8080;
/// MQTT over TLS: the IANA port for secure MQTT (active only with `[tls]`).
pub const MQTTS_PORT_DEFAULT: u16 = 8883;
/// STOMP over TLS: the port ActiveMQ and RabbitMQ use (active only with `[tls]`).
pub const STOMPS_PORT_DEFAULT: u16 = 61614;
/// AMQP 1.0 over TLS: the IANA port for AMQPS (active only with `[tls]`).
pub const AMQPS_PORT_DEFAULT: u16 = 5671;
/// Secure WebSocket: the conventional alternative HTTPS port (active only with `[tls]`).
pub const WSS_PORT_DEFAULT: u16 = 8443;

/// A listening address: a port, on a host of its own or on
/// `[listeners] bind`.
///
/// Written `host:port` in the file, with IPv6 literals in brackets
/// (`[::]:1883`), or as the port alone (`1883` or `"1883"`), which binds
/// `[listeners] bind`. Port 0 asks the OS for a free port (tests use it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListenAddr {
    /// IP literal (without brackets) or host name to bind; `None`: the
    /// `[listeners] bind` interface.
    pub host: Option<String>,
    /// TCP port; 0 = any free port.
    pub port: u16,
}

impl ListenAddr {
    /// A listening address from its parts.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: Some(host.into()),
            port,
        }
    }

    /// A port on the `[listeners] bind` interface.
    pub fn port(port: u16) -> Self {
        Self { host: None, port }
    }

    /// This address with the host filled in from `bind` when it has none.
    pub fn on(&self, bind: &str) -> ListenAddr {
        ListenAddr::new(self.host.as_deref().unwrap_or(bind), self.port)
    }

    /// Whether the host is a loopback address (`127.0.0.0/8`, `::1`) or
    /// `localhost`: only clients on this machine can connect.
    pub fn is_loopback(&self) -> bool {
        match self.host.as_deref() {
            Some(h) if h.eq_ignore_ascii_case("localhost") => true,
            Some(h) => h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()),
            None => false,
        }
    }
}

/// Why a `host:port` string is not a listening address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenAddrError {
    /// No `:port` part.
    #[error("`{0}` has no port: write host:port, e.g. 0.0.0.0:1883")]
    MissingPort(String),
    /// Nothing before the colon.
    #[error("`{0}` has no host: write the port alone to use `listeners.bind`, or 0.0.0.0:port for every interface")]
    MissingHost(String),
    /// An IPv6 literal without brackets, or unbalanced brackets.
    #[error("`{0}`: write IPv6 addresses in brackets, e.g. [::]:1883")]
    BadIpv6(String),
    /// The port is not a decimal number.
    #[error("`{0}`: the port is not a number")]
    PortNotNumber(String),
    /// The port does not fit in 16 bits.
    #[error("`{addr}`: port {port} is out of range (0-65535)")]
    PortOutOfRange {
        /// The whole address as written.
        addr: String,
        /// The port as written.
        port: String,
    },
}

impl FromStr for ListenAddr {
    type Err = ListenAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return s.parse::<u16>().map(ListenAddr::port).map_err(|_| {
                ListenAddrError::PortOutOfRange {
                    addr: s.to_owned(),
                    port: s.to_owned(),
                }
            });
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (host, after) = rest
                .split_once(']')
                .ok_or_else(|| ListenAddrError::BadIpv6(s.to_owned()))?;
            let port = after
                .strip_prefix(':')
                .ok_or_else(|| ListenAddrError::MissingPort(s.to_owned()))?;
            (host, port)
        } else {
            let (host, port) = s
                .rsplit_once(':')
                .ok_or_else(|| ListenAddrError::MissingPort(s.to_owned()))?;
            if host.contains([':', '[', ']']) {
                return Err(ListenAddrError::BadIpv6(s.to_owned()));
            }
            (host, port)
        };
        if host.is_empty() {
            return Err(ListenAddrError::MissingHost(s.to_owned()));
        }
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ListenAddrError::PortNotNumber(s.to_owned()));
        }
        let port = port
            .parse::<u16>()
            .map_err(|_| ListenAddrError::PortOutOfRange {
                addr: s.to_owned(),
                port: port.to_owned(),
            })?;
        Ok(Self::new(host, port))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host.as_deref() {
            Some(host) if host.contains(':') => write!(f, "[{host}]:{}", self.port),
            Some(host) => write!(f, "{host}:{}", self.port),
            None => write!(f, "{}", self.port),
        }
    }
}

/// Reads an optional listener: a port (integer or string), `host:port`, or
/// an empty string, which (like an absent key, through the section
/// default) turns it off.
pub(crate) fn deserialize_listen_opt<'de, D>(de: D) -> Result<Option<ListenAddr>, D::Error>
where
    D: Deserializer<'de>,
{
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Option<ListenAddr>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a port, \"host:port\" or \"\"")
        }

        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u16::try_from(v)
                .map(|p| Some(ListenAddr::port(p)))
                .map_err(|_| E::custom(format!("port {v} is out of range (0-65535)")))
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            if v.is_empty() {
                return Ok(None);
            }
            v.parse().map(Some).map_err(E::custom)
        }
    }
    de.deserialize_any(Visitor)
}

/// Reads `[listeners] bind`: a host without a port.
fn deserialize_bind<'de, D>(de: D) -> Result<String, D::Error>
where
    D: Deserializer<'de>,
{
    let s = String::deserialize(de)?;
    let host = s
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&s);
    let is_ip = host.parse::<IpAddr>().is_ok();
    let is_name = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !is_ip && !is_name {
        return Err(serde::de::Error::custom(format!(
            "`{s}` is not an interface address: write e.g. 127.0.0.1, 0.0.0.0 or ::, without a port"
        )));
    }
    Ok(host.to_owned())
}

/// Which protocol and transport a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListenerKind {
    /// MQTT over TCP.
    Mqtt,
    /// STOMP over TCP.
    Stomp,
    /// AMQP 1.0 over TCP.
    Amqp,
    /// HTTP: WebSocket for all protocols, and the demo page.
    WebSocket,
    /// MQTT over TLS.
    Mqtts,
    /// STOMP over TLS.
    Stomps,
    /// AMQP 1.0 over TLS.
    Amqps,
    /// WebSocket over TLS.
    Wss,
    /// One port for everything: the protocol is detected from the first bytes.
    Any,
    /// HTTP: Prometheus metrics at `/metrics` only.
    Metrics,
}

impl ListenerKind {
    /// The key naming this listener in `[listeners]`.
    pub fn key(self) -> &'static str {
        match self {
            ListenerKind::Mqtt => "mqtt",
            ListenerKind::Stomp => "stomp",
            ListenerKind::Amqp => "amqp",
            ListenerKind::WebSocket => "websocket",
            ListenerKind::Mqtts => "mqtts",
            ListenerKind::Stomps => "stomps",
            ListenerKind::Amqps => "amqps",
            ListenerKind::Wss => "wss",
            ListenerKind::Any => "any",
            ListenerKind::Metrics => "metrics",
        }
    }

    /// True for the listeners that need `[tls]` (`any` detects TLS itself,
    /// and serves it only when `[tls]` is configured).
    pub fn needs_tls(self) -> bool {
        matches!(
            self,
            ListenerKind::Mqtts | ListenerKind::Stomps | ListenerKind::Amqps | ListenerKind::Wss
        )
    }
}

/// `[listeners]`: the interface to bind, and one optional address per
/// protocol and transport.
///
/// An empty string turns a listener off. The TLS listeners have default
/// ports but run only when `[tls]` names a certificate and key (see
/// [`crate::Config::active_listeners`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Listeners {
    /// The interface (IP literal or host name, no port) of every listener
    /// given as a port alone: `127.0.0.1` by default (this machine only),
    /// `0.0.0.0` for every IPv4 interface, `::` for every IPv6 one.
    #[serde(deserialize_with = "deserialize_bind")]
    pub bind: String,
    /// MQTT over TCP.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub mqtt: Option<ListenAddr>,
    /// STOMP over TCP.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub stomp: Option<ListenAddr>,
    /// AMQP 1.0 over TCP.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub amqp: Option<ListenAddr>,
    /// WebSocket (HTTP) for all protocols.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub websocket: Option<ListenAddr>,
    /// MQTT over TLS.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub mqtts: Option<ListenAddr>,
    /// STOMP over TLS.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub stomps: Option<ListenAddr>,
    /// AMQP 1.0 over TLS.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub amqps: Option<ListenAddr>,
    /// WebSocket over TLS.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub wss: Option<ListenAddr>,
    /// One port for every protocol, detected from the first bytes. Off by
    /// default: the standard ports are what clients expect.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub any: Option<ListenAddr>,
    /// Prometheus metrics at `GET /metrics` on a port of their own (they
    /// are also on the `websocket` port while `[websocket] metrics` is on).
    /// Off by default.
    #[serde(deserialize_with = "deserialize_listen_opt")]
    pub metrics: Option<ListenAddr>,
}

impl Default for Listeners {
    fn default() -> Self {
        let port = |p| Some(ListenAddr::port(p));
        Self {
            bind: BIND_DEFAULT.to_owned(),
            mqtt: port(MQTT_PORT_DEFAULT),
            stomp: port(STOMP_PORT_DEFAULT),
            amqp: port(AMQP_PORT_DEFAULT),
            websocket: port(WEBSOCKET_PORT_DEFAULT),
            mqtts: port(MQTTS_PORT_DEFAULT),
            stomps: port(STOMPS_PORT_DEFAULT),
            amqps: port(AMQPS_PORT_DEFAULT),
            wss: port(WSS_PORT_DEFAULT),
            any: None,
            metrics: None,
        }
    }
}

impl Listeners {
    /// Every configured listener (TLS or not) in a fixed order, each with
    /// its host filled in from [`Listeners::bind`] where it names none.
    pub fn all(&self) -> Vec<(ListenerKind, ListenAddr)> {
        [
            (ListenerKind::Mqtt, &self.mqtt),
            (ListenerKind::Stomp, &self.stomp),
            (ListenerKind::Amqp, &self.amqp),
            (ListenerKind::WebSocket, &self.websocket),
            (ListenerKind::Mqtts, &self.mqtts),
            (ListenerKind::Stomps, &self.stomps),
            (ListenerKind::Amqps, &self.amqps),
            (ListenerKind::Wss, &self.wss),
            (ListenerKind::Any, &self.any),
            (ListenerKind::Metrics, &self.metrics),
        ]
        .into_iter()
        .filter_map(|(kind, addr)| addr.as_ref().map(|a| (kind, a.on(&self.bind))))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!("0.0.0.0:1883".parse(), Ok(ListenAddr::new("0.0.0.0", 1883)));
        assert_eq!("1883".parse(), Ok(ListenAddr::port(1883)));
        assert_eq!(ListenAddr::port(1883).on("::").to_string(), "[::]:1883");
        assert_eq!(
            ListenAddr::new("::1", 5).on("0.0.0.0").to_string(),
            "[::1]:5"
        );
        assert_eq!("localhost:0".parse(), Ok(ListenAddr::new("localhost", 0)));
        assert_eq!("[::]:8883".parse(), Ok(ListenAddr::new("::", 8883)));
        assert_eq!(ListenAddr::new("::1", 5).to_string(), "[::1]:5");
        assert_eq!(ListenAddr::new("127.0.0.1", 5).to_string(), "127.0.0.1:5");
        let bad = [
            ("0.0.0.0", "no port"),
            (":1883", "no host"),
            ("::1:1883", "brackets"),
            ("[::1]1883", "no port"),
            ("[::1:1883", "brackets"),
            ("host:abc", "not a number"),
            ("host:", "not a number"),
            ("host:-1", "not a number"),
            ("0.0.0.0:70000", "out of range"),
            ("70000", "out of range"),
        ];
        for (s, why) in bad {
            let err = s.parse::<ListenAddr>().expect_err(s).to_string();
            assert!(err.contains(why), "{s}: {err}");
        }
    }

    #[test]
    fn defaults_are_loopback_only() {
        let l = Listeners::default();
        let all = l.all();
        assert_eq!(all.len(), 8, "every default except `any` and `metrics`");
        assert!(l.any.is_none() && l.metrics.is_none());
        assert!(all.iter().all(|(_, a)| a.is_loopback()), "{all:?}");
        assert!(!ListenAddr::new("0.0.0.0", 1).is_loopback());
        assert!(ListenAddr::new("::1", 1).is_loopback());
        assert!(ListenAddr::new("localhost", 1).is_loopback());
    }
}
