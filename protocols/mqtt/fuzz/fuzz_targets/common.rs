//! Fuzz bodies, shared by the cargo-fuzz targets and by a smoke test in the
//! normal test suite (`tests/state_machine/fuzz_smoke.rs`), so they keep
//! compiling and run on every `cargo test`.
//!
//! Oracles: nothing panics; every byte the server writes decodes as a
//! server packet of the connection's version; a closed connection stays
//! closed and silent.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rosetta_mqtt::codec::Decoder;
use rosetta_mqtt::{MqttConfig, MqttConnection, Version};
use rosetta_neutral::{
    Address, ConsumerId, Delivery, DeliveryTag, Guarantee, MatchInfo, Message, SessionEvent, Ticket,
};

use crate::fake::{FakeBroker, NullSink};

/// A valid 3.1.1 CONNECT (client id "f", clean session, keep-alive 5 s).
pub const CONNECT_V4: &[u8] = &[
    0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 5, 0, 1, b'f',
];
/// A valid 5.0 CONNECT (client id "f", clean start, topic alias max 4).
pub const CONNECT_V5: &[u8] = &[
    0x10, 17, 0, 4, b'M', b'Q', b'T', b'T', 5, 2, 0, 5, 3, 0x22, 0, 4, 0, 1, b'f',
];

fn prefix(mode: u8) -> &'static [u8] {
    match mode % 3 {
        1 => CONNECT_V4,
        2 => CONNECT_V5,
        _ => &[],
    }
}

/// Decoder only: any split, any bytes.
pub fn run_decoder(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut d = Decoder::new(4096);
    d.extend(prefix(mode));
    let split = usize::from(mode >> 2).min(rest.len());
    let (a, b) = rest.split_at(split);
    for chunk in [a, b] {
        d.extend(chunk);
        loop {
            match d.next_packet() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

fn check_decodes(version: Option<Version>, out: &[u8]) -> usize {
    let mut buf = BytesMut::from(out);
    let mut packets = 0;
    while !buf.is_empty() {
        packets += 1;
        let ok = match version {
            Some(Version::V5) => mqttbytes::v5::read(&mut buf, 1 << 24).is_ok(),
            // Before/without a version, refusals are 3.1.1 CONNACKs.
            _ => mqttbytes::v4::read(&mut buf, 1 << 24).is_ok(),
        };
        assert!(ok, "server wrote bytes that do not decode: {out:?}");
    }
    packets
}

fn delivery(tag: u64, qos: u8, payload: &[u8]) -> SessionEvent {
    let msg = Message {
        address: Some(Address::Topic("f/t".into())),
        guarantee: Guarantee::from_qos(qos % 3).unwrap_or_default(),
        ..Message::binary(Bytes::copy_from_slice(payload))
    };
    SessionEvent::Delivery(Delivery {
        consumer: ConsumerId(1 + u64::from(qos >> 7)),
        tag: DeliveryTag(tag),
        message: Arc::new(msg),
        delivery_count: 0,
        redelivered: qos & 0x40 != 0,
        from_retained: qos & 0x20 != 0,
        matched: MatchInfo {
            max_guarantee: Guarantee::from_qos((qos >> 2) % 3),
            subscription_ids: Vec::new(),
            retain_as_published: qos & 0x10 != 0,
        },
        annotation: (qos & 0x08 != 0)
            .then(|| Bytes::copy_from_slice(&payload[..payload.len().min(4)])),
        charge: rosetta_neutral::DeliveryCharge::none(),
        stream: None,
    })
}

/// The connection: control bytes pick input chunks, timeouts and events.
/// Returns the number of packets the server wrote (for coverage checks).
pub fn run_connection(data: &[u8]) -> usize {
    let Some((&mode, rest)) = data.split_first() else {
        return 0;
    };
    let broker = FakeBroker::new();
    {
        let mut s = broker.state();
        s.confirm_pending = mode & 0x04 != 0;
        s.state_pending = mode & 0x08 != 0;
        s.routed = usize::from(mode & 0x10 != 0);
    }
    let config = MqttConfig {
        packet_size_max_bytes: 4096,
        receive_maximum: 4,
        outbound_inflight_max: 4,
        pending_acks_max: 8,
        ..MqttConfig::default()
    };
    let start = Instant::now();
    let mut now = start;
    let mut conn = MqttConnection::new(config, Arc::new(broker), Arc::new(NullSink), 1, now);
    conn.handle_input(now, prefix(mode));
    let mut out = Vec::new();
    conn.poll_transmit(&mut out);
    let mut packets = check_decodes(conn.version(), &out);
    let mut i = 0;
    let mut tag = 0;
    while i < rest.len() {
        let ctl = rest[i];
        i += 1;
        let end = (i + usize::from(ctl & 0x1F) + 1).min(rest.len());
        let chunk = &rest[i..end];
        match ctl >> 5 {
            0 => {
                now += Duration::from_millis(u64::from(ctl & 0x1F) * 500);
                conn.handle_timeout(now);
            }
            1 => {
                tag += 1;
                conn.handle_event(
                    now,
                    delivery(tag, chunk.first().copied().unwrap_or(1), chunk),
                );
            }
            2 => conn.handle_event(
                now,
                SessionEvent::Committed {
                    ticket: Ticket(u64::from(ctl & 0x1F)),
                    result: Ok(()),
                },
            ),
            _ => conn.handle_input(now, chunk),
        }
        i = end;
        out.clear();
        conn.poll_transmit(&mut out);
        packets += check_decodes(conn.version(), &out);
        if conn.is_closed() {
            conn.handle_input(now, &[0xC0, 0]);
            conn.handle_event(now, delivery(tag + 1, 1, b"late"));
            out.clear();
            conn.poll_transmit(&mut out);
            assert!(out.is_empty(), "a closed connection wrote {out:?}");
            assert!(!conn.wants_input());
            return packets;
        }
    }
    packets
}
