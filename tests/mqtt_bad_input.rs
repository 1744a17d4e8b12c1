//! Bad MQTT input over real sockets: malformed packets, protocol violations
//! and oversized packets. MQTT 5 clients get a DISCONNECT with the right
//! reason code and then the close; 3.1.1 clients get a bare close. Other
//! clients carry on, and nothing stored (sessions, queued and retained
//! messages) is lost, also across a restart.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::sync::Arc;

use bytes::BytesMut;
use common::mqtt::*;
use common::TestBroker;
use rumqttc::v5::mqttbytes::v5 as p5;
use rumqttc::v5::mqttbytes::QoS as Q5;
use rumqttc::QoS;

/// Packet size limit of these tests' broker.
const LIMIT: u32 = 4096;

fn start() -> impl std::future::Future<Output = TestBroker> {
    TestBroker::start_with(
        |c| c.mqtt.packet_size_max_bytes = Some(LIMIT),
        Arc::new(rosetta::core::AllowAll),
    )
}

fn v4_bytes(p: p4::Packet) -> Vec<u8> {
    let mut b = BytesMut::new();
    p.write(&mut b, 1 << 28).expect("encode");
    b.to_vec()
}

fn v5_bytes(p: p5::Packet) -> Vec<u8> {
    let mut b = BytesMut::new();
    p.write(&mut b, None).expect("encode");
    b.to_vec()
}

/// One bad input, as sent after a successful CONNECT.
struct Case {
    name: &'static str,
    v4: Vec<u8>,
    v5: Vec<u8>,
    reason: p5::DisconnectReasonCode,
}

fn cases() -> Vec<Case> {
    use p5::DisconnectReasonCode as R;
    vec![
        Case {
            name: "PUBLISH whose topic length runs past the packet",
            v4: vec![0x32, 0x02, 0x00, 0x05],
            v5: vec![0x32, 0x02, 0x00, 0x05],
            reason: R::MalformedPacket,
        },
        Case {
            name: "remaining length with five length bytes",
            v4: vec![0x30, 0xff, 0xff, 0xff, 0xff, 0x01],
            v5: vec![0x30, 0xff, 0xff, 0xff, 0xff, 0x01],
            reason: R::MalformedPacket,
        },
        Case {
            name: "second CONNECT",
            v4: v4_bytes(p4::Packet::Connect(p4::Connect::new("again"))),
            v5: v5_bytes(p5::Packet::Connect(
                connect5_packet("again", true, None),
                None,
                None,
            )),
            reason: R::ProtocolError,
        },
        Case {
            name: "PUBLISH to a wildcard topic",
            v4: v4_bytes(p4::Packet::Publish(p4::Publish::new(
                "by/+",
                QoS::AtMostOnce,
                b"x".to_vec(),
            ))),
            v5: v5_bytes(p5::Packet::Publish(p5::Publish::new(
                "by/#",
                Q5::AtMostOnce,
                "x",
                None,
            ))),
            reason: R::TopicNameInvalid,
        },
        Case {
            name: "PUBLISH topic that is not UTF-8",
            v4: vec![0x30, 0x05, 0x00, 0x02, 0xff, 0xfe, b'x'],
            v5: vec![0x30, 0x06, 0x00, 0x02, 0xff, 0xfe, 0x00, b'x'],
            reason: R::MalformedPacket,
        },
        Case {
            name: "PUBLISH topic with U+0000",
            v4: vec![0x30, 0x05, 0x00, 0x02, b'a', 0x00, b'x'],
            v5: vec![0x30, 0x06, 0x00, 0x02, b'a', 0x00, 0x00, b'x'],
            reason: R::MalformedPacket,
        },
        Case {
            name: "PUBLISH with QoS 3",
            v4: vec![0x36, 0x06, 0x00, 0x01, b't', 0x00, 0x01, b'x'],
            v5: vec![0x36, 0x07, 0x00, 0x01, b't', 0x00, 0x01, 0x00, b'x'],
            reason: R::MalformedPacket,
        },
        Case {
            name: "packet above the maximum packet size",
            v4: v4_bytes(p4::Packet::Publish(p4::Publish::new(
                "by/big",
                QoS::AtMostOnce,
                vec![0u8; LIMIT as usize * 2],
            ))),
            v5: v5_bytes(p5::Packet::Publish(p5::Publish::new(
                "by/big",
                Q5::AtMostOnce,
                vec![0u8; LIMIT as usize * 2],
                None,
            ))),
            reason: R::PacketTooLarge,
        },
        Case {
            name: "reserved packet type 0",
            v4: vec![0x00, 0x00],
            v5: vec![0x00, 0x00],
            reason: R::MalformedPacket,
        },
        Case {
            name: "SUBSCRIBE with wrong fixed-header flags",
            v4: vec![0x80, 0x06, 0x00, 0x01, 0x00, 0x01, b't', 0x00],
            v5: vec![0x80, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b't', 0x00],
            reason: R::MalformedPacket,
        },
    ]
}

/// The state every bad client must leave alone: a persistent session with a
/// queued message, a retained message, a live subscriber.
struct World {
    live: rumqttc::EventLoop,
    _live_client: rumqttc::AsyncClient,
    sent: Vec<String>,
}

impl World {
    async fn new(broker: &TestBroker) -> World {
        let (c, mut ev) = subscriber4(broker, "keeper", false, "by/#", QoS::AtLeastOnce).await;
        disconnect4(&c, &mut ev).await;
        publish_once4(broker, "by/queued", QoS::AtLeastOnce, false, b"q").await;
        publish_once4(broker, "by/ret", QoS::AtLeastOnce, true, b"r").await;
        let (live_client, mut live) =
            subscriber4(broker, "live", true, "by/live/#", QoS::AtLeastOnce).await;
        quiet4(&mut live).await;
        World {
            live,
            _live_client: live_client,
            sent: Vec::new(),
        }
    }

    /// Another client publishes; the live subscriber gets it.
    async fn still_works(&mut self, broker: &TestBroker, case: &str) {
        let topic = format!("by/live/{}", self.sent.len());
        publish_once4(broker, &topic, QoS::AtLeastOnce, false, case.as_bytes()).await;
        let p = publish4(&mut self.live).await;
        assert_eq!(p.topic, topic, "live subscriber after {case}");
        self.sent.push(topic);
    }

    /// After a restart: the persistent session, its queued messages and the
    /// retained message are all there.
    async fn nothing_lost(self, broker: &mut TestBroker) {
        broker.restart().await;
        let (_c, mut ev, ack) = connected4(broker, "keeper", false).await;
        assert!(ack.session_present);
        let mut want = vec!["by/queued".to_owned(), "by/ret".to_owned()];
        want.extend(self.sent);
        for w in want {
            assert_eq!(publish4(&mut ev).await.topic, w);
        }
        let (_c, mut ev) = subscriber4(broker, "late", true, "by/ret", QoS::AtLeastOnce).await;
        let p = publish4(&mut ev).await;
        assert!(p.retain);
        assert_eq!(&p.payload[..], b"r");
    }
}

#[tokio::test]
async fn v5_bad_input_gets_disconnect_with_reason_then_close() {
    let mut broker = start().await;
    let mut world = World::new(&broker).await;
    for case in cases() {
        let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "bad5", None).await;
        raw.write(&case.v5).await;
        raw.expect_disconnect5(case.reason).await;
        world.still_works(&broker, case.name).await;
    }
    world.nothing_lost(&mut broker).await;
    broker.stop().await;
}

#[tokio::test]
async fn v311_bad_input_gets_a_close() {
    let mut broker = start().await;
    let mut world = World::new(&broker).await;
    for case in cases() {
        let (mut raw, _) = Raw::connect4(broker.mqtt(), "bad4", true, 10).await;
        raw.write(&case.v4).await;
        raw.expect_silent_close().await;
        world.still_works(&broker, case.name).await;
    }
    world.nothing_lost(&mut broker).await;
    broker.stop().await;
}

/// A bad packet ends the connection, not the persistent session of the
/// client that sent it.
#[tokio::test]
async fn bad_input_keeps_the_offenders_own_session() {
    let broker = start().await;
    let (mut raw, _) = Raw::connect4(broker.mqtt(), "offender", false, 10).await;
    raw_subscribe4(&mut raw, 1, "off/t", QoS::AtLeastOnce).await;
    raw.write(&[0x36, 0x06, 0x00, 0x01, b't', 0x00, 0x01, b'x'])
        .await;
    raw.expect_silent_close().await;
    publish_once4(&broker, "off/t", QoS::AtLeastOnce, false, b"kept").await;
    let (mut raw, ack) = Raw::connect4(broker.mqtt(), "offender", false, 10).await;
    assert!(ack.session_present);
    assert_eq!(&raw.recv4_publish().await.payload[..], b"kept");
    broker.stop().await;
}

/// Garbage or a non-CONNECT packet before CONNECT: closed without a CONNACK.
#[tokio::test]
async fn first_packet_must_be_connect() {
    let broker = start().await;
    for bytes in [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        v4_bytes(p4::Packet::Publish(p4::Publish::new(
            "t",
            QoS::AtMostOnce,
            b"x".to_vec(),
        ))),
        v4_bytes(p4::Packet::PingReq),
        // CONNECT with protocol level 6.
        vec![
            0x10, 0x0d, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x06, 0x02, 0x00, 0x0a, 0x00, 0x01,
            b'x',
        ],
    ] {
        let mut raw = Raw::open(broker.mqtt()).await;
        raw.write(&bytes).await;
        // A bare close, or a CONNACK refusal (unsupported protocol level)
        // followed by the close.
        match raw.recv4_opt(WAIT).await {
            None => {}
            Some(p4::Packet::ConnAck(a)) => {
                assert_eq!(a.code, rumqttc::ConnectReturnCode::RefusedProtocolVersion);
                raw.expect_silent_close().await;
            }
            Some(other) => panic!("unexpected answer {other:?} to {bytes:?}"),
        }
    }
    // The broker still serves.
    let (_raw, ack) = Raw::connect4(broker.mqtt(), "after", true, 10).await;
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
    broker.stop().await;
}

/// An invalid filter in SUBSCRIBE is a per-filter failure, not a close.
#[tokio::test]
async fn invalid_subscribe_filter_is_refused_per_filter() {
    let broker = start().await;
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "badfilter", None).await;
    let mut sub = p5::Subscribe::new_many(
        [
            p5::Filter::new("a/#/b", Q5::AtLeastOnce),
            p5::Filter::new("a/b+", Q5::AtLeastOnce),
            p5::Filter::new("ok/#", Q5::AtLeastOnce),
        ],
        None,
    );
    sub.pkid = 9;
    raw.send5(p5::Packet::Subscribe(sub)).await;
    match raw.recv5().await {
        p5::Packet::SubAck(a) => assert_eq!(
            a.return_codes,
            [
                p5::SubscribeReasonCode::TopicFilterInvalid,
                p5::SubscribeReasonCode::TopicFilterInvalid,
                p5::SubscribeReasonCode::Success(Q5::AtLeastOnce),
            ]
        ),
        other => panic!("expected SUBACK, got {other:?}"),
    }
    raw.send5(p5::Packet::PingReq(p5::PingReq)).await;
    assert!(matches!(raw.recv5().await, p5::Packet::PingResp(_)));
    broker.stop().await;
}
