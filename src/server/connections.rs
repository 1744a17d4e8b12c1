//! The registry of live protocol connections, for the admin API: who is
//! connected over what (listing), and a way to close one with a reason
//! the client is shown (`DELETE /api/v1/connections/{id}`).
//!
//! A connection is entered once its protocol is known (`run_wire`) and
//! leaves when its task ends: one short lock at each end, none per
//! message. What only the session knows (user, client id) is asked of the
//! core when a listing is made ([`rosetta_core::Core::session_identities`]),
//! so the hot path pays nothing for it. What it does pay for is
//! [`ConnectionTraffic`]: two relaxed atomic adds per message, in the
//! connection's event sink (no allocation of its own), from which the
//! admin API computes each listed connection's rates.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rosetta_neutral::{EventSink, KickReason, SessionEvent};

use crate::driver::ChannelSink;
use crate::slots::Slots;

/// What the registry knows of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// The connection id (as in the logs' `conn` field).
    pub id: u64,
    /// `mqtt`, `stomp` or `amqp`.
    pub protocol: &'static str,
    /// `tcp`, `tls`, `ws` or `wss`.
    pub transport: &'static str,
    /// The peer's socket address.
    pub peer: SocketAddr,
    /// Whether the connection runs over TLS.
    pub tls: bool,
    /// When the connection was accepted, in ms since the Unix epoch.
    pub connected_at_ms: u64,
}

/// Messages a connection's client published (accepted by the core) and
/// was delivered, since it connected. Kept in the connection's event sink,
/// which the core already reaches on both paths: a delivery is an event
/// sent to it, and the core tells it of each accepted publish
/// ([`EventSink::published`]). 16 bytes per connection, no allocation.
#[derive(Debug, Default)]
pub(crate) struct ConnectionTraffic {
    messages_in: AtomicU64,
    messages_out: AtomicU64,
}

impl ConnectionTraffic {
    /// One publish of the client accepted.
    pub(crate) fn received(&self) {
        self.messages_in.fetch_add(1, Ordering::Relaxed);
    }

    /// One message handed to the client's connection.
    pub(crate) fn sent(&self) {
        self.messages_out.fetch_add(1, Ordering::Relaxed);
    }

    fn counts(&self) -> MessageCounts {
        MessageCounts {
            messages_in: self.messages_in.load(Ordering::Relaxed),
            messages_out: self.messages_out.load(Ordering::Relaxed),
        }
    }
}

/// A connection's message counts at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageCounts {
    /// The client's publishes the core accepted (a transaction's at its
    /// commit), as the overview's `published_total` counts them.
    pub messages_in: u64,
    /// Messages delivered to the client, redeliveries included.
    pub messages_out: u64,
}

/// What the registry keeps of one connection: the fields of its
/// [`ConnectionInfo`] packed (the protocol and transport one byte, the
/// address without the IPv6 flow and scope), 48 B where the info itself
/// is 88 (issue 20: the entry with its map slot was 172 B of an idle
/// connection, then 80 in a hash map, and is 48 in a page of slots).
struct Entry {
    id: u64,
    /// The connection's event sink: a kick travels the way the core's
    /// take-over and shutdown kicks do, so each adapter says goodbye in its
    /// own protocol; the end of the shutdown grace period wakes the task
    /// through it.
    sink: Arc<ChannelSink>,
    connected_at_ms: u64,
    /// The peer's address, an IPv4 one mapped into IPv6 (see `kind`).
    ip: [u8; 16],
    port: u16,
    kind: Kind,
}

/// The protocols and transports a connection may have, by index.
const PROTOCOLS: [&str; 4] = ["mqtt", "stomp", "amqp", "unknown"];
const TRANSPORTS: [&str; 5] = ["tcp", "tls", "ws", "wss", "unknown"];

/// Protocol (bits 0-2), transport (bits 3-5), TLS (bit 6), an IPv4 peer
/// (bit 7).
#[derive(Clone, Copy)]
struct Kind(u8);

impl Kind {
    fn of(info: &ConnectionInfo) -> Self {
        let index = |names: &[&str], name: &str| {
            names
                .iter()
                .position(|n| *n == name)
                .unwrap_or(names.len() - 1) as u8
        };
        Self(
            index(&PROTOCOLS, info.protocol)
                | index(&TRANSPORTS, info.transport) << 3
                | u8::from(info.tls) << 6
                | u8::from(info.peer.is_ipv4()) << 7,
        )
    }

    fn protocol(self) -> &'static str {
        PROTOCOLS[usize::from(self.0 & 7).min(PROTOCOLS.len() - 1)]
    }

    fn transport(self) -> &'static str {
        TRANSPORTS[usize::from(self.0 >> 3 & 7).min(TRANSPORTS.len() - 1)]
    }

    fn tls(self) -> bool {
        self.0 & 1 << 6 != 0
    }

    fn ipv4(self) -> bool {
        self.0 & 1 << 7 != 0
    }
}

impl Entry {
    fn new(info: &ConnectionInfo, sink: Arc<ChannelSink>) -> Self {
        let ip = match info.peer.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Self {
            id: info.id,
            sink,
            connected_at_ms: info.connected_at_ms,
            ip: ip.octets(),
            port: info.peer.port(),
            kind: Kind::of(info),
        }
    }

    fn info(&self) -> ConnectionInfo {
        let v6 = Ipv6Addr::from(self.ip);
        let ip = match v6.to_ipv4_mapped() {
            Some(v4) if self.kind.ipv4() => IpAddr::V4(v4),
            _ => IpAddr::V6(v6),
        };
        ConnectionInfo {
            id: self.id,
            protocol: self.kind.protocol(),
            transport: self.kind.transport(),
            peer: SocketAddr::new(ip, self.port),
            tls: self.kind.tls(),
            connected_at_ms: self.connected_at_ms,
        }
    }
}

/// Live connections. In slots rather than a map by id: the one lookup
/// by id (an administrator's close) scans them, which at a million
/// connections is milliseconds, while every connection saves the map's
/// key and slack.
#[derive(Default)]
pub struct Registry {
    entries: Mutex<Slots<Entry>>,
}

impl Registry {
    /// Enters a connection; it leaves when the guard is dropped.
    pub(crate) fn enter(
        self: &Arc<Self>,
        info: ConnectionInfo,
        sink: Arc<ChannelSink>,
    ) -> RegistryGuard {
        let slot = self.entries.lock().insert(Entry::new(&info, sink));
        RegistryGuard {
            registry: Arc::clone(self),
            slot,
        }
    }

    /// Every live connection, by ascending id.
    pub fn list(&self) -> Vec<ConnectionInfo> {
        let mut all: Vec<ConnectionInfo> = self.entries.lock().iter().map(Entry::info).collect();
        all.sort_unstable_by_key(|c| c.id);
        all
    }

    /// Every live connection with its message counts now, by ascending id.
    pub fn list_with_counts(&self) -> Vec<(ConnectionInfo, MessageCounts)> {
        let mut all: Vec<(ConnectionInfo, MessageCounts)> = self
            .entries
            .lock()
            .iter()
            .map(|e| (e.info(), e.sink.traffic().counts()))
            .collect();
        all.sort_unstable_by_key(|(c, _)| c.id);
        all
    }

    /// Each live connection's protocol and transport (for counts, without
    /// copying the entries).
    pub fn kinds(&self) -> Vec<(&'static str, &'static str)> {
        self.entries
            .lock()
            .iter()
            .map(|e| (e.kind.protocol(), e.kind.transport()))
            .collect()
    }

    /// Number of live connections.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// True when no connection is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wakes every live connection's task (the shutdown's hard stop: each
    /// then sees the flag and closes).
    pub(crate) fn wake_all(&self) {
        for entry in self.entries.lock().iter() {
            entry.sink.wake();
        }
    }

    /// Asks connection `id` to close with `reason` (shown to the client
    /// where its protocol allows). False if there is no such connection.
    /// A connection still logging in has no session to kick: its adapter
    /// ignores the event and the connect timeout closes it.
    pub fn close(&self, id: u64, reason: String) -> bool {
        let sink = self
            .entries
            .lock()
            .iter()
            .find(|e| e.id == id)
            .map(|e| Arc::clone(&e.sink));
        match sink {
            Some(sink) => {
                sink.send(SessionEvent::Kicked {
                    reason: KickReason::Administrative(reason),
                });
                true
            }
            None => false,
        }
    }
}

/// Removes its connection from the registry when dropped.
pub(crate) struct RegistryGuard {
    registry: Arc<Registry>,
    slot: u32,
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        // Dropped outside the lock: the entry holds the connection's sink.
        let entry = self.registry.entries.lock().remove(self.slot);
        drop(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::event_channel;

    fn info(id: u64) -> ConnectionInfo {
        ConnectionInfo {
            id,
            protocol: "mqtt",
            transport: "tcp",
            peer: SocketAddr::from(([127, 0, 0, 1], 4000)),
            tls: false,
            connected_at_ms: 1,
        }
    }

    #[test]
    fn an_entry_gives_back_the_info_it_was_made_from() {
        let (sink, _queue) = event_channel(None);
        let v6: SocketAddr = "[2001:db8::7]:4711".parse().expect("address");
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:1".parse().expect("address");
        for (peer, protocol, transport, tls) in [
            (info(1).peer, "mqtt", "tcp", false),
            (v6, "stomp", "wss", true),
            (mapped, "amqp", "tls", true),
            (info(1).peer, "amqp", "ws", false),
        ] {
            let original = ConnectionInfo {
                id: 9,
                protocol,
                transport,
                peer,
                tls,
                connected_at_ms: 1_765_000_000_123,
            };
            assert_eq!(Entry::new(&original, Arc::clone(&sink)).info(), original);
        }
        assert!(std::mem::size_of::<Option<Entry>>() <= 48);
    }

    #[test]
    fn entries_leave_with_their_guard_and_a_close_reaches_the_sink() {
        let registry = Arc::new(Registry::default());
        let (sink, _queue) = event_channel(None);
        let first = registry.enter(info(7), Arc::clone(&sink));
        let second = registry.enter(info(3), event_channel(None).0);
        assert_eq!(
            registry.list().iter().map(|c| c.id).collect::<Vec<_>>(),
            [3, 7]
        );
        sink.published();
        sink.send(SessionEvent::Drained {
            consumer: rosetta_neutral::ConsumerId(1),
        });
        let counts: Vec<MessageCounts> = registry
            .list_with_counts()
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        assert_eq!(
            counts,
            [
                MessageCounts::default(),
                MessageCounts {
                    messages_in: 1,
                    messages_out: 0
                }
            ],
            "only deliveries count out"
        );
        let _ = sink.queued();
        assert!(registry.close(7, "maintenance".into()));
        assert!(!registry.close(99, "nobody".into()));
        assert!(matches!(
            sink.queued().as_slice(),
            [SessionEvent::Kicked { reason: KickReason::Administrative(t) }] if t == "maintenance"
        ));
        drop(first);
        assert_eq!(registry.len(), 1);
        drop(second);
        assert!(registry.is_empty());
    }
}
