//! Packet-id bookkeeping for both directions.
//!
//! - Outbound: which QoS 1/2 delivery each packet id carries and where its
//!   flow is. The id and phase are also saved in the core with
//!   `Session::annotate`, so a resumed session resends PUBLISH (DUP) or
//!   PUBREL with the original id, even after a broker restart.
//! - Inbound QoS 2: packet ids routed but not yet released, persisted with
//!   `Session::put_state` so a restart mid-flow still drops duplicates.

use std::collections::BTreeSet;

use bytes::{BufMut, Bytes, BytesMut};
use rosetta_neutral::id_hash::BuildIdHasher;
use rosetta_neutral::{ConsumerId, DeliveryTag, LazyMap};

/// `put_state` key of the inbound QoS 2 packet ids awaiting PUBREL.
pub(crate) const QOS2_INBOUND_STATE_KEY: &str = "mqtt.qos2-inbound";

/// Where an outbound QoS 1/2 flow is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// PUBLISH sent, waiting for PUBACK/PUBREC.
    Published,
    /// PUBREL sent, waiting for PUBCOMP (QoS 2).
    Released,
}

/// One unacknowledged outbound delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutFlight {
    pub(crate) consumer: ConsumerId,
    pub(crate) tag: DeliveryTag,
    pub(crate) qos: u8,
    pub(crate) phase: Phase,
}

/// Outbound packet ids in use. The ids are ours (see [`Outbound::allocate`]):
/// the cheap id hash, not SipHash (`rosetta_neutral::id_hash`).
#[derive(Debug, Default)]
pub(crate) struct Outbound {
    /// Lazy: an idle connection has nothing in flight (issue 20).
    flights: LazyMap<u16, OutFlight, BuildIdHasher>,
    next: u16,
}

impl Outbound {
    pub(crate) fn get_mut(&mut self, pkid: u16) -> Option<&mut OutFlight> {
        self.flights.get_mut(&pkid)
    }

    pub(crate) fn in_use(&self, pkid: u16) -> bool {
        self.flights.contains_key(&pkid)
    }

    pub(crate) fn insert(&mut self, pkid: u16, flight: OutFlight) {
        self.flights.insert(pkid, flight);
    }

    pub(crate) fn remove(&mut self, pkid: u16) -> Option<OutFlight> {
        self.flights.remove(&pkid)
    }

    /// Deliveries in flight.
    pub(crate) fn len(&self) -> usize {
        self.flights.len()
    }

    /// A free packet id (1..=65535), skipping ids in use; `None` only when
    /// all 65,535 are in flight.
    pub(crate) fn allocate(&mut self) -> Option<u16> {
        for _ in 0..u16::MAX {
            self.next = if self.next == u16::MAX {
                1
            } else {
                self.next + 1
            };
            if !self.flights.contains_key(&self.next) {
                return Some(self.next);
            }
        }
        None
    }
}

const ANNOTATION_VERSION: u8 = 1;

/// Encodes the saved state of an outbound flight: version, packet id, phase.
pub(crate) fn encode_annotation(pkid: u16, phase: Phase) -> Bytes {
    let mut b = BytesMut::with_capacity(4);
    b.put_u8(ANNOTATION_VERSION);
    b.put_u16(pkid);
    b.put_u8(match phase {
        Phase::Published => 1,
        Phase::Released => 2,
    });
    b.freeze()
}

/// Decodes [`encode_annotation`]; `None` for anything else (an annotation
/// from an older format is ignored and the delivery gets a fresh id).
pub(crate) fn decode_annotation(b: &[u8]) -> Option<(u16, Phase)> {
    match b {
        [ANNOTATION_VERSION, hi, lo, phase] => {
            let pkid = u16::from_be_bytes([*hi, *lo]);
            let phase = match phase {
                1 => Phase::Published,
                2 => Phase::Released,
                _ => return None,
            };
            (pkid != 0).then_some((pkid, phase))
        }
        _ => None,
    }
}

/// Encodes the set of inbound QoS 2 packet ids awaiting PUBREL.
pub(crate) fn encode_qos2_set(set: &BTreeSet<u16>) -> Bytes {
    let mut b = BytesMut::with_capacity(set.len() * 2);
    for id in set {
        b.put_u16(*id);
    }
    b.freeze()
}

/// Decodes [`encode_qos2_set`], ignoring a trailing odd byte and id 0.
pub(crate) fn decode_qos2_set(b: &[u8]) -> BTreeSet<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .filter(|&id| id != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_skips_ids_in_use_and_wraps() {
        let mut o = Outbound::default();
        let flight = OutFlight {
            consumer: ConsumerId(1),
            tag: DeliveryTag(1),
            qos: 1,
            phase: Phase::Published,
        };
        o.insert(2, flight);
        assert_eq!(o.allocate(), Some(1));
        assert_eq!(o.allocate(), Some(3));
        o.next = u16::MAX - 1;
        assert_eq!(o.allocate(), Some(u16::MAX));
        assert_eq!(o.allocate(), Some(1), "wraps past 65535 to 1, never 0");
    }

    #[test]
    fn annotations_and_state_round_trip() {
        let a = encode_annotation(513, Phase::Released);
        assert_eq!(decode_annotation(&a), Some((513, Phase::Released)));
        assert_eq!(decode_annotation(b"junk"), None);
        let set: BTreeSet<u16> = [5, 1, 900].into_iter().collect();
        assert_eq!(decode_qos2_set(&encode_qos2_set(&set)), set);
    }
}
