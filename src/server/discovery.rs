//! Where a client should connect, asked over HTTP rather than at connect
//! (a browser picking a WebSocket URL, a client that cannot follow a
//! redirect): the admin API's `GET /api/v1/balancer/target` answers from
//! here, with the same balancer a connection asks.

use super::view::BrokerView;

/// The balancer's answer for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// No `[cluster]`: there is no balancer to ask.
    Off,
    /// The protocol and transport name no listener.
    Unknown(String),
    /// No node is ready to take the client (below `quorum_size`, or the
    /// node chosen has no such listener).
    Unavailable,
    /// Connect there.
    Target(DiscoveredTarget),
}

/// A node's published address for a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    /// Its node name.
    pub node: String,
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The listener key the address is for (`mqtt`, `wss`, ...).
    pub listener: &'static str,
}

/// The listener a client of `protocol` over `transport` connects to:
/// `tcp`, `tls`, `ws` or `wss`; WebSocket listeners serve every protocol.
pub fn listener_for(protocol: &str, transport: &str) -> Option<&'static str> {
    Some(match (protocol, transport) {
        ("mqtt" | "stomp" | "amqp", "ws") => "websocket",
        ("mqtt" | "stomp" | "amqp", "wss") => "wss",
        ("mqtt", "tcp") => "mqtt",
        ("mqtt", "tls") => "mqtts",
        ("stomp", "tcp") => "stomp",
        ("stomp", "tls") => "stomps",
        ("amqp", "tcp") => "amqp",
        ("amqp", "tls") => "amqps",
        _ => return None,
    })
}

impl BrokerView {
    /// Where a client with target key `key`, speaking `protocol` over
    /// `transport`, belongs.
    pub fn balancer_target(&self, key: &str, protocol: &str, transport: &str) -> Discovery {
        let Some(node) = self.shared().cluster.as_ref() else {
            return Discovery::Off;
        };
        let Some(listener) = listener_for(protocol, transport) else {
            return Discovery::Unknown(format!(
                "no listener serves protocol {protocol:?} over transport {transport:?} (protocol: mqtt, stomp, amqp; transport: tcp, tls, ws, wss)"
            ));
        };
        let Some((name, authority)) = node.discover(key, listener) else {
            return Discovery::Unavailable;
        };
        match rosetta_neutral::RedirectTarget::parse(&authority, false) {
            Some(t) => Discovery::Target(DiscoveredTarget {
                node: name,
                host: t.host,
                port: t.port,
                listener,
            }),
            None => Discovery::Unavailable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::listener_for;

    #[test]
    fn each_protocol_and_transport_has_its_listener() {
        assert_eq!(listener_for("mqtt", "ws"), Some("websocket"));
        assert_eq!(listener_for("stomp", "tls"), Some("stomps"));
        assert_eq!(listener_for("amqp", "tcp"), Some("amqp"));
        assert_eq!(listener_for("mqtt", "udp"), None);
        assert_eq!(listener_for("http", "tcp"), None);
    }
}
