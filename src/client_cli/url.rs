//! The URLs of `rosetta pub` and `rosetta sub`: one spelling for every
//! protocol, whose path is Rosetta's canonical address (README, "Naming
//! scheme"), so that the same `/queue/q` or `/topic/a/b` can be tried from
//! any protocol:
//!
//! | URL | protocol, transport |
//! | --- | --- |
//! | `mqtt://user:pass@host:1883/topic/a/b` | MQTT 5 over TCP (`mqtts://`: TLS) |
//! | `stomp://user:pass@host:61613/queue/q` | STOMP 1.2 over TCP (`stomps://`: TLS) |
//! | `amqp://user:pass@host:5672/queue/q` | AMQP 1.0 over TCP (`amqps://`: TLS) |
//! | `ws://user:pass@host:8080/mqtt/topic/a/b` | MQTT over WebSocket, on the path `/mqtt` (`wss://`: TLS) |
//! | `ws://user:pass@host:8080/stomp/queue/q` | STOMP 1.2 over WebSocket, on the path `/stomp` (`wss://`: TLS) |
//! | `ws://user:pass@host:8080/amqp/queue/q` | AMQP 1.0 over WebSocket, on the path `/amqp` (`wss://`: TLS) |
//!
//! The address is `/topic/<name>` or `/queue/<name>`; each protocol's
//! client spells it its own way (MQTT: `a/b` and `$queue/q`). User and
//! password are percent-decoded; without them the client connects
//! anonymously.

use std::fmt;

use anyhow::{bail, Context};

/// The protocol a URL speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Mqtt,
    Stomp,
    Amqp,
}

/// How the bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Tcp,
    Tls,
    /// WebSocket on the path `/<protocol>`; `secure`: over TLS.
    WebSocket {
        secure: bool,
    },
}

/// What the address names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Address {
    /// `/topic/<name>`: a topic (MQTT wildcards allowed for `sub`).
    Topic(String),
    /// `/queue/<name>`: a queue.
    Queue(String),
}

impl Address {
    /// The canonical spelling, as STOMP and AMQP take it.
    pub(crate) fn canonical(&self) -> String {
        match self {
            Address::Topic(t) => format!("/topic/{t}"),
            Address::Queue(q) => format!("/queue/{q}"),
        }
    }

    /// MQTT's spelling: the topic itself, or `$queue/<name>`.
    pub(crate) fn mqtt_topic(&self) -> String {
        match self {
            Address::Topic(t) => t.clone(),
            Address::Queue(q) => format!("$queue/{q}"),
        }
    }
}

/// A parsed URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) protocol: Protocol,
    pub(crate) transport: Transport,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) address: Address,
}

/// Never prints the password (error messages and logs show endpoints).
impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match (self.protocol, self.transport) {
            (Protocol::Mqtt, Transport::Tcp) => "mqtt",
            (Protocol::Mqtt, Transport::Tls) => "mqtts",
            (Protocol::Stomp, Transport::Tcp) => "stomp",
            (Protocol::Stomp, Transport::Tls) => "stomps",
            (Protocol::Amqp, Transport::Tcp) => "amqp",
            (Protocol::Amqp, Transport::Tls) => "amqps",
            (_, Transport::WebSocket { secure: false }) => "ws",
            (_, Transport::WebSocket { secure: true }) => "wss",
        };
        write!(f, "{scheme}://")?;
        if let Some(user) = &self.user {
            write!(f, "{user}@")?;
        }
        write!(f, "{}:{}", self.host, self.port)?;
        if let Transport::WebSocket { .. } = self.transport {
            write!(f, "{}", self.ws_path())?;
        }
        write!(f, "{}", self.address.canonical())
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Endpoint {
    /// Parses `url` (see the module's table).
    pub(crate) fn parse(url: &str) -> anyhow::Result<Endpoint> {
        let (scheme, rest) = url
            .split_once("://")
            .with_context(|| format!("not a URL (no scheme://): {url}"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (protocol, transport, path) = match scheme.to_ascii_lowercase().as_str() {
            "mqtt" => (Protocol::Mqtt, Transport::Tcp, path),
            "mqtts" => (Protocol::Mqtt, Transport::Tls, path),
            "stomp" => (Protocol::Stomp, Transport::Tcp, path),
            "stomps" => (Protocol::Stomp, Transport::Tls, path),
            "amqp" => (Protocol::Amqp, Transport::Tcp, path),
            "amqps" => (Protocol::Amqp, Transport::Tls, path),
            ws @ ("ws" | "wss") => {
                let secure = ws == "wss";
                // The first path segment is the broker's WebSocket path of
                // the protocol (src/server/ws.rs), the rest the address.
                let spoken = [
                    ("/mqtt/", Protocol::Mqtt),
                    ("/stomp/", Protocol::Stomp),
                    ("/amqp/", Protocol::Amqp),
                ]
                .into_iter()
                .find_map(|(prefix, protocol)| {
                    path.strip_prefix(prefix.trim_end_matches('/'))
                        .filter(|rest| rest.starts_with('/'))
                        .map(|rest| (protocol, rest))
                });
                let Some((protocol, address)) = spoken else {
                    bail!(
                        "a WebSocket URL names its protocol as the first path segment: \
                         {ws}://host:port/mqtt/topic/<name>, .../stomp/queue/<name> or \
                         .../amqp/queue/<name> (got {url})"
                    );
                };
                (protocol, Transport::WebSocket { secure }, address)
            }
            other => bail!(
                "unknown scheme '{other}' (known: mqtt, mqtts, stomp, stomps, amqp, amqps, ws, wss)"
            ),
        };
        let (host, port) = split_host_port(hostport, default_port(protocol, transport))
            .with_context(|| format!("in {url}"))?;
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (u, p) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                (Some(decode(u)?), p.map(decode).transpose()?)
            }
        };
        let address = parse_address(path).with_context(|| format!("in {url}"))?;
        Ok(Endpoint {
            protocol,
            transport,
            host,
            port,
            user,
            password,
            address,
        })
    }

    /// The HTTP path of a WebSocket upgrade: the broker's path for the
    /// protocol (src/server/ws.rs).
    pub(crate) fn ws_path(&self) -> &'static str {
        match self.protocol {
            Protocol::Mqtt => "/mqtt",
            Protocol::Stomp => "/stomp",
            Protocol::Amqp => "/amqp",
        }
    }

    /// Whether the connection is wrapped in TLS.
    pub(crate) fn uses_tls(&self) -> bool {
        matches!(
            self.transport,
            Transport::Tls | Transport::WebSocket { secure: true }
        )
    }
}

/// The broker's default port of each listener (config/rosetta.toml).
fn default_port(protocol: Protocol, transport: Transport) -> u16 {
    match (protocol, transport) {
        (Protocol::Mqtt, Transport::Tcp) => 1883,
        (Protocol::Mqtt, Transport::Tls) => 8883,
        (Protocol::Stomp, Transport::Tcp) => 61613,
        (Protocol::Stomp, Transport::Tls) => 61614,
        (Protocol::Amqp, Transport::Tcp) => 5672,
        (Protocol::Amqp, Transport::Tls) => 5671,
        (_, Transport::WebSocket { secure: false }) => 8080,
        (_, Transport::WebSocket { secure: true }) => 8443,
    }
}

fn split_host_port(hostport: &str, default: u16) -> anyhow::Result<(String, u16)> {
    // `[::1]:1883`: an IPv6 literal keeps its brackets out of the host.
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']').context("unclosed '[' in the host")?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        bail!("no host");
    }
    let port = match port {
        None => default,
        Some(p) => p.parse().with_context(|| format!("bad port '{p}'"))?,
    };
    Ok((host.to_owned(), port))
}

fn parse_address(path: &str) -> anyhow::Result<Address> {
    let address = if let Some(topic) = path.strip_prefix("/topic/") {
        Address::Topic(decode(topic)?)
    } else if let Some(queue) = path.strip_prefix("/queue/") {
        Address::Queue(decode(queue)?)
    } else {
        bail!("the path must be /topic/<name> or /queue/<name> (got '{path}')");
    };
    match &address {
        Address::Topic(n) | Address::Queue(n) if n.is_empty() => bail!("an empty name"),
        _ => Ok(address),
    }
}

/// Percent-decoding (`%2F`, `%40`, ...), for names and credentials.
fn decode(s: &str) -> anyhow::Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .with_context(|| format!("bad percent escape in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).with_context(|| format!("'{s}' is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Endpoint {
        match Endpoint::parse(url) {
            Ok(e) => e,
            Err(e) => panic!("{url}: {e:#}"),
        }
    }

    #[test]
    fn every_scheme() {
        let e = parse("mqtt://u:p%40ss@example.org:1884/topic/a/b");
        assert_eq!(
            (e.protocol, e.transport, e.host.as_str(), e.port),
            (Protocol::Mqtt, Transport::Tcp, "example.org", 1884)
        );
        assert_eq!(
            (e.user.as_deref(), e.password.as_deref()),
            (Some("u"), Some("p@ss"))
        );
        assert_eq!(e.address.mqtt_topic(), "a/b");
        let e = parse("stomps://h/queue/orders");
        assert_eq!((e.transport, e.port), (Transport::Tls, 61614));
        assert_eq!(e.address.canonical(), "/queue/orders");
        let e = parse("amqp://[::1]:5673/queue/q%2Fx");
        assert_eq!((e.host.as_str(), e.port), ("::1", 5673));
        assert_eq!(e.address, Address::Queue("q/x".into()));
        assert_eq!(e.address.mqtt_topic(), "$queue/q/x");
        let e = parse("wss://h/mqtt/topic/s/#");
        assert_eq!(
            (e.protocol, e.transport, e.port),
            (Protocol::Mqtt, Transport::WebSocket { secure: true }, 8443)
        );
        assert_eq!(e.address, Address::Topic("s/#".into()));
        let e = parse("ws://h:9/stomp/queue/q");
        assert_eq!(
            (e.protocol, e.transport, e.ws_path()),
            (
                Protocol::Stomp,
                Transport::WebSocket { secure: false },
                "/stomp"
            )
        );
        assert_eq!(e.address, Address::Queue("q".into()));
        let e = parse("wss://h/amqp/topic/a/b");
        assert_eq!(
            (e.protocol, e.transport, e.port),
            (Protocol::Amqp, Transport::WebSocket { secure: true }, 8443)
        );
        assert_eq!(e.to_string(), "wss://h:8443/amqp/topic/a/b");
    }

    #[test]
    fn display_hides_the_password() {
        let e = parse("ws://u:secret@h:9/mqtt/queue/q");
        assert_eq!(e.to_string(), "ws://u@h:9/mqtt/queue/q");
    }

    #[test]
    fn refusals() {
        for bad in [
            "http://h/queue/q",
            "mqtt://h:1883",
            "mqtt://h:1883/a/b",
            "mqtt://h:port/topic/a",
            "stomp:///queue/q",
            "ws://h/stompish/queue/q",
            "ws://h/queue/q",
            "ws://h/amqp",
            "amqp://h/queue/",
            "amqp://h/queue/%zz",
            "queue/q",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
