//! `[listeners]`: where the broker accepts connections.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

/// Plain MQTT: the IANA port for MQTT over TCP.
pub const MQTT_ADDR_DEFAULT: &str = "0.0.0.0:1883";
/// Plain STOMP: the port ActiveMQ and RabbitMQ use, which STOMP clients assume.
pub const STOMP_ADDR_DEFAULT: &str = "0.0.0.0:61613";
/// Plain AMQP 1.0: the IANA port for AMQP.
pub const AMQP_ADDR_DEFAULT: &str = "0.0.0.0:5672";
/// WebSocket (all three protocols, and the demo page): the conventional alternative HTTP port.
pub const WEBSOCKET_ADDR_DEFAULT: &str = "0.0.0.0:8080";
/// MQTT over TLS: the IANA port for secure MQTT (active only with `[tls]`).
pub const MQTTS_ADDR_DEFAULT: &str = "0.0.0.0:8883";
/// STOMP over TLS: the port ActiveMQ and RabbitMQ use (active only with `[tls]`).
pub const STOMPS_ADDR_DEFAULT: &str = "0.0.0.0:61614";
/// AMQP 1.0 over TLS: the IANA port for AMQPS (active only with `[tls]`).
pub const AMQPS_ADDR_DEFAULT: &str = "0.0.0.0:5671";
/// Secure WebSocket: the conventional alternative HTTPS port (active only with `[tls]`).
pub const WSS_ADDR_DEFAULT: &str = "0.0.0.0:8443";

/// A listening address: a host (IP literal or name) and a port.
///
/// Written `host:port` in the file, with IPv6 literals in brackets
/// (`[::]:1883`). Port 0 asks the OS for a free port (tests use it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListenAddr {
    /// IP literal (without brackets) or host name to bind.
    pub host: String,
    /// TCP port; 0 = any free port.
    pub port: u16,
}

impl ListenAddr {
    /// A listening address from its parts.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
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
    #[error("`{0}` has no host: write 0.0.0.0 to listen on every interface")]
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
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Reads an optional listener: an empty string (or an absent key, through
/// the section default) turns it off.
fn deserialize_listen_opt<'de, D>(de: D) -> Result<Option<ListenAddr>, D::Error>
where
    D: Deserializer<'de>,
{
    let s = String::deserialize(de)?;
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(serde::de::Error::custom)
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

/// `[listeners]`: one optional address per protocol and transport.
///
/// An empty string turns a listener off. The TLS listeners have default
/// addresses but run only when `[tls]` names a certificate and key (see
/// [`crate::config::Config::active_listeners`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Listeners {
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
}

fn default_addr(s: &str) -> Option<ListenAddr> {
    // The defaults are constants above; a typo there is caught by the
    // `defaults_are_valid` test, so falling back to "off" never happens
    // in a released build.
    s.parse().ok()
}

impl Default for Listeners {
    fn default() -> Self {
        Self {
            mqtt: default_addr(MQTT_ADDR_DEFAULT),
            stomp: default_addr(STOMP_ADDR_DEFAULT),
            amqp: default_addr(AMQP_ADDR_DEFAULT),
            websocket: default_addr(WEBSOCKET_ADDR_DEFAULT),
            mqtts: default_addr(MQTTS_ADDR_DEFAULT),
            stomps: default_addr(STOMPS_ADDR_DEFAULT),
            amqps: default_addr(AMQPS_ADDR_DEFAULT),
            wss: default_addr(WSS_ADDR_DEFAULT),
            any: None,
        }
    }
}

impl Listeners {
    /// Every configured listener (TLS or not), in a fixed order.
    pub fn all(&self) -> Vec<(ListenerKind, &ListenAddr)> {
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
        ]
        .into_iter()
        .filter_map(|(kind, addr)| addr.as_ref().map(|a| (kind, a)))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!("0.0.0.0:1883".parse(), Ok(ListenAddr::new("0.0.0.0", 1883)));
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
        ];
        for (s, why) in bad {
            let err = s.parse::<ListenAddr>().expect_err(s).to_string();
            assert!(err.contains(why), "{s}: {err}");
        }
    }

    #[test]
    fn defaults_are_valid() {
        let l = Listeners::default();
        assert_eq!(l.all().len(), 8, "every default except `any` parses");
        assert!(l.any.is_none());
    }
}
