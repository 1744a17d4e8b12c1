use mqttbytes::{v4, v5};
use rosetta_mqtt::MqttConfig;
use rosetta_neutral::*;

use crate::fake::FakeBroker;
use crate::harness::*;

fn v5_disconnect_reason(h: &mut Harness) -> u8 {
    let p = h.v5_packets();
    assert!(h.conn.is_closed(), "closed after {p:?}");
    match p.as_slice() {
        [v5::Packet::Disconnect(d)] => d.reason_code as u8,
        other => panic!("expected one DISCONNECT, got {other:?}"),
    }
}

/// Sends `bytes` to a connected client of each version: v5 must answer
/// with DISCONNECT `reason`, 3.1.1 must close silently, and both must close
/// the session abnormally (will published).
fn check_both(v5_bytes: &[u8], v4_bytes: &[u8], reason: u8) {
    let mut h = Harness::connected(true);
    h.input(v5_bytes);
    assert_eq!(v5_disconnect_reason(&mut h), reason);
    assert_eq!(h.broker.state().closes, vec![CloseKind::Abnormal]);

    let mut h = Harness::connected(false);
    h.input(v4_bytes);
    assert!(h.conn.is_closed());
    assert!(h.raw_output().is_empty(), "3.1.1 gets a close, no packet");
    assert_eq!(h.broker.state().closes, vec![CloseKind::Abnormal]);
}

#[test]
fn byte_at_a_time_input_gives_the_same_session() {
    for v5 in [false, true] {
        let mut h = Harness::new(v5);
        let mut stream = Vec::new();
        if v5 {
            stream.extend(connect_v5(mqttbytes::v5::Connect::new("slow")));
            let mut sub = v5::Subscribe::new("a/b", qos(1));
            sub.pkid = 1;
            stream.extend(subscribe_v5(sub));
            stream.extend(pub_v5("a/b", 1, 3, b"payload"));
        } else {
            stream.extend(connect_v4("slow", true, 30, None));
            stream.extend(subscribe_v4(1, &[("a/b", 1)]));
            stream.extend(publish_v4("a/b", 1, 3, b"payload"));
        }
        stream.extend([0xC0, 0x00]);
        h.input_bytewise(&stream);
        let p = h.packets();
        assert_eq!(
            p.len(),
            4,
            "CONNACK, SUBACK, PUBACK, PINGRESP: {p:?} v5={v5}"
        );
        let s = h.broker.state();
        assert_eq!(s.published.len(), 1);
        assert_eq!(&s.published[0].1.body.bytes[..], b"payload");
        assert_eq!(s.queues["$mqtt/slow"].bindings.len(), 1);
    }
}

#[test]
fn many_packets_in_one_read() {
    let mut h = Harness::connected(false);
    let mut stream = Vec::new();
    for i in 1..=50u16 {
        stream.extend(publish_v4("t", 1, i, b"x"));
    }
    h.input(&stream);
    assert_eq!(h.v4_packets().len(), 50);
}

#[test]
fn malformed_packet() {
    // PUBACK with a zero packet id.
    check_both(&[0x40, 2, 0, 0], &[0x40, 2, 0, 0], 0x81);
    // Fixed-header flags wrong on PUBREL.
    check_both(&[0x60, 2, 0, 1], &[0x60, 2, 0, 1], 0x81);
}

#[test]
fn second_connect_is_a_protocol_error() {
    check_both(
        &connect_v5(v5::Connect::new("again")),
        &connect_v4("again", true, 30, None),
        0x82,
    );
}

#[test]
fn publish_to_a_wildcard_topic() {
    check_both(
        &pub_v5("a/+", 0, 0, b"x"),
        &publish_v4("a/#", 0, 0, b"x"),
        0x90,
    );
}

#[test]
fn invalid_utf8_topic() {
    let bad = [0x30, 5, 0, 2, 0xC3, 0x28, b'x'];
    check_both(&[0x30, 6, 0, 2, 0xC3, 0x28, 0, b'x'], &bad, 0x81);
}

#[test]
fn qos_3() {
    check_both(
        &[0x36, 6, 0, 1, b't', 0, 1, 0],
        &[0x36, 5, 0, 1, b't', 0, 1],
        0x81,
    );
}

#[test]
fn oversized_packet_is_refused_before_buffering() {
    let config = MqttConfig {
        packet_size_max_bytes: 128,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config.clone(), FakeBroker::new(), true);
    h.connect_ok("big", true);
    // Only the fixed header of a 1 MiB publish arrives.
    h.input(&[0x30, 0x80, 0x80, 0x40]);
    assert_eq!(v5_disconnect_reason(&mut h), 0x95);

    let mut h = Harness::with(config, FakeBroker::new(), false);
    h.connect_ok("big", true);
    h.input(&publish_v4("t", 0, 0, &[0u8; 200]));
    assert!(h.conn.is_closed());
    assert!(h.raw_output().is_empty());
}

#[test]
fn first_packet_must_be_connect() {
    let mut h = Harness::new(false);
    h.input(&publish_v4("t", 0, 0, b"x"));
    assert!(h.conn.is_closed());
    assert!(h.raw_output().is_empty());
    assert!(h.broker.state().sessions.is_empty());
}

#[test]
fn malformed_v5_connect_gets_connack_0x81() {
    let mut h = Harness::new(true);
    // Level 5 CONNECT with the reserved flag set.
    h.input(&[
        0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x03, 0, 30, 0, 0, 0,
    ]);
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::MalformedPacket,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
}

#[test]
fn auth_packet_without_a_method_is_a_protocol_error() {
    let mut h = Harness::connected(true);
    h.input(&[0xF0, 0]);
    assert_eq!(v5_disconnect_reason(&mut h), 0x82);
    let mut h = Harness::connected(false);
    h.input(&[0xF0, 0]);
    assert!(h.conn.is_closed());
}

#[test]
fn input_after_close_is_ignored() {
    let mut h = Harness::connected(false);
    h.input(&[0xE0, 0]);
    assert!(h.conn.is_closed());
    h.input(&publish_v4("t", 0, 0, b"x"));
    assert!(h.raw_output().is_empty());
    assert!(h.broker.state().published.is_empty());
    assert!(!h.conn.wants_input());
    let _ = v4::Packet::PingReq;
}
