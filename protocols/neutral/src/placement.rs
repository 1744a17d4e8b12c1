//! Where a connection belongs, when several nodes share the clients
//! (`rosetta-cluster`'s balancer): the question an adapter asks once it
//! knows who the client is ([`crate::Broker::place_connection`]), and the
//! answer, which each adapter turns into its protocol's words.
//!
//! | answer | MQTT 5 | MQTT 3.1.1 | AMQP 1.0 | STOMP |
//! |---|---|---|---|---|
//! | [`Placement::Local`] | CONNACK 0 | return code 0 | open | CONNECTED |
//! | [`Placement::Redirect`] | CONNACK 0x9C (or 0x9D when `permanent`) with Server Reference | accepted here (it cannot be told) | close `amqp:connection:redirect` | accepted here |
//! | [`Placement::Unavailable`] | CONNACK 0x88 | return code 3 | close `amqp:resource-limit-exceeded` | ERROR |

use crate::broker::Protocol;

/// What an adapter knows of a connection when it asks where it belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementRequest<'a> {
    /// The protocol spoken.
    pub protocol: Protocol,
    /// The client id (MQTT client id, AMQP container id, STOMP `client-id`).
    pub client_id: Option<&'a str>,
    /// The authenticated user.
    pub user: Option<&'a str>,
}

/// Another node's address for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectTarget {
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The client's data lives there for good (MQTT 5 0x9D Server moved)
    /// rather than for now (0x9C Use another server).
    pub permanent: bool,
}

impl RedirectTarget {
    /// `host:port`, with an IPv6 literal in brackets (MQTT 5 Server
    /// Reference).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// From `host:port` (`[v6]:port` too); `None` when it is not one.
    pub fn parse(authority: &str, permanent: bool) -> Option<Self> {
        let (host, port) = authority.rsplit_once(':')?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return None;
        }
        Some(Self {
            host: host.to_owned(),
            port: port.parse().ok()?,
            permanent,
        })
    }
}

/// Where a connection belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Here.
    Local,
    /// On another node.
    Redirect(RedirectTarget),
    /// Nowhere now: no node is ready to take it.
    Unavailable,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authority_round_trips() {
        let t = RedirectTarget::parse("[::1]:1883", false).expect("v6");
        assert_eq!((t.host.as_str(), t.port), ("::1", 1883));
        assert_eq!(t.authority(), "[::1]:1883");
        let t = RedirectTarget::parse("b.example:5672", true).expect("name");
        assert_eq!(t.authority(), "b.example:5672");
        assert!(RedirectTarget::parse("b.example", false).is_none());
        assert!(RedirectTarget::parse(":1", false).is_none());
    }
}
