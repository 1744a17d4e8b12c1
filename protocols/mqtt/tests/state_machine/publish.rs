use bytes::Bytes;
use mqttbytes::{v4, v5};
use rosetta_mqtt::MqttConfig;
use rosetta_neutral::*;

use crate::fake::FakeBroker;
use crate::harness::*;

fn committed(t: u64) -> SessionEvent {
    SessionEvent::Committed {
        ticket: Ticket(t),
        result: Ok(()),
    }
}

#[test]
fn qos0_publish_is_routed_without_confirm() {
    for v5 in [false, true] {
        let mut h = Harness::connected(v5);
        let pkt = if v5 {
            pub_v5("a/b", 0, 0, b"x")
        } else {
            publish_v4("a/b", 0, 0, b"x")
        };
        h.input(&pkt);
        assert!(h.raw_output().is_empty());
        let s = h.broker.state();
        let (addr, msg, opts) = &s.published[0];
        assert_eq!(addr, &Address::Topic("a/b".into()));
        assert_eq!(&msg.body.bytes[..], b"x");
        assert_eq!(msg.guarantee, Guarantee::AtMostOnce);
        assert!(!msg.durable && !opts.confirm);
    }
}

#[test]
fn qos1_puback_waits_for_commit_and_keeps_order() {
    for v5 in [false, true] {
        let mut h = Harness::connected(v5);
        h.broker.state().confirm_pending = true;
        let (a, b) = if v5 {
            (pub_v5("t", 1, 1, b"1"), pub_v5("t", 1, 2, b"2"))
        } else {
            (publish_v4("t", 1, 1, b"1"), publish_v4("t", 1, 2, b"2"))
        };
        h.input(&a);
        h.input(&b);
        assert!(h.raw_output().is_empty(), "no PUBACK before the commit");
        {
            let s = h.broker.state();
            assert!(s.published.iter().all(|(_, m, o)| m.durable && o.confirm));
        }
        // Second commit first: nothing may overtake the first PUBACK.
        h.event(committed(2));
        assert!(h.raw_output().is_empty());
        h.event(committed(1));
        let ids: Vec<u16> = h
            .packets()
            .into_iter()
            .map(|p| match p {
                Pkt::V4(v4::Packet::PubAck(a)) => a.pkid,
                Pkt::V5(v5::Packet::PubAck(a)) => a.pkid,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, vec![1, 2]);
    }
}

#[test]
fn v5_puback_says_no_matching_subscribers() {
    let mut h = Harness::connected(true);
    h.broker.state().routed = 0;
    h.input(&pub_v5("t", 1, 5, b"x"));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::PubAck(v5::PubAck {
            pkid: 5,
            reason: v5::PubAckReason::NoMatchingSubscribers,
            ..
        })]
    ));
}

#[test]
fn publish_refused_by_core_v5_acks_with_reason_v311_closes() {
    let mut h = Harness::connected(true);
    h.broker.state().fail_publish = Some(BrokerError::Unauthorized("t".into()));
    h.input(&pub_v5("t", 1, 5, b"x"));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::PubAck(v5::PubAck {
            pkid: 5,
            reason: v5::PubAckReason::NotAuthorized,
            ..
        })]
    ));
    assert!(!h.conn.is_closed());

    let mut h = Harness::connected(false);
    h.broker.state().fail_publish = Some(BrokerError::Unauthorized("t".into()));
    h.input(&publish_v4("t", 1, 5, b"x"));
    assert!(h.conn.is_closed());
    assert!(h.raw_output().is_empty());
}

#[test]
fn failed_commit_is_reported_v5_and_closes_v311() {
    let mut h = Harness::connected(true);
    h.broker.state().confirm_pending = true;
    h.input(&pub_v5("t", 1, 5, b"x"));
    h.event(SessionEvent::Committed {
        ticket: Ticket(1),
        result: Err(BrokerError::Storage("disk".into())),
    });
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::PubAck(v5::PubAck {
            pkid: 5,
            reason: v5::PubAckReason::UnspecifiedError,
            ..
        })]
    ));

    let mut h = Harness::connected(false);
    h.broker.state().confirm_pending = true;
    h.input(&publish_v4("t", 1, 5, b"x"));
    h.event(SessionEvent::Committed {
        ticket: Ticket(1),
        result: Err(BrokerError::Storage("disk".into())),
    });
    assert!(h.conn.is_closed());
    assert!(
        h.raw_output().is_empty(),
        "no PUBACK for a message that is not safe"
    );
}

#[test]
fn qos2_exactly_once_with_persisted_state() {
    for v5 in [false, true] {
        let mut h = Harness::connected(v5);
        {
            let mut s = h.broker.state();
            s.confirm_pending = true;
            s.state_pending = true;
        }
        let pkt = if v5 {
            pub_v5("t", 2, 9, b"x")
        } else {
            publish_v4("t", 2, 9, b"x")
        };
        h.input(&pkt);
        // Ticket 1: the publish; ticket 2: the persisted awaiting-PUBREL set.
        assert_eq!(
            h.broker
                .state()
                .kv
                .get("mqtt.qos2-inbound")
                .map(|b| b.to_vec()),
            Some(vec![0, 9])
        );
        h.event(committed(1));
        assert!(
            h.raw_output().is_empty(),
            "PUBREC waits for the state commit too"
        );
        h.event(committed(2));
        let p = h.packets();
        assert_eq!(p.len(), 1);
        assert!(
            matches!(&p[0], Pkt::V4(v4::Packet::PubRec(a)) if a.pkid == 9)
                || matches!(&p[0], Pkt::V5(v5::Packet::PubRec(a)) if a.pkid == 9)
        );

        // A resend (DUP) is acknowledged again but not routed again.
        let mut dup = pkt.clone();
        dup[0] |= 0x08;
        h.input(&dup);
        assert_eq!(h.broker.state().published.len(), 1);
        assert_eq!(h.packets().len(), 1);

        // PUBREL: the id is forgotten durably, then PUBCOMP.
        h.input(&pubrel(9));
        assert!(h.raw_output().is_empty());
        assert!(!h.broker.state().kv.contains_key("mqtt.qos2-inbound"));
        h.event(committed(3));
        let p = h.packets();
        assert!(
            matches!(&p[..], [Pkt::V4(v4::Packet::PubComp(a))] if a.pkid == 9)
                || matches!(&p[..], [Pkt::V5(v5::Packet::PubComp(a))] if a.pkid == 9)
        );

        // After the flow, the same id is a new message.
        h.input(&pkt);
        assert_eq!(h.broker.state().published.len(), 2);
    }
}

#[test]
fn qos2_survives_a_restart_mid_flow() {
    let mut h = Harness::new(true);
    assert!(!h.connect_ok("q2", false));
    h.input(&pub_v5("t", 2, 4, b"x"));
    assert_eq!(h.v5_packets().len(), 1, "PUBREC");
    h.conn.handle_transport_closed(h.now);

    // "Restart": a new connection to the same (journaled) core state.
    let mut h2 = h.reconnect(MqttConfig::default(), true);
    assert!(h2.connect_ok("q2", false));
    let mut p = v5::Publish::new("t", qos(2), b"x".to_vec());
    p.pkid = 4;
    p.dup = true;
    h2.input(&publish_v5(p));
    assert_eq!(h2.broker.state().published.len(), 1, "not routed twice");
    assert!(matches!(h2.v5_packets().as_slice(), [v5::Packet::PubRec(a)] if a.pkid == 4));
    h2.input(&pubrel(4));
    assert!(
        matches!(h2.v5_packets().as_slice(), [v5::Packet::PubComp(a)] if a.pkid == 4 && a.reason == v5::PubCompReason::Success)
    );
}

#[test]
fn unknown_pubrel_gets_pubcomp_with_0x92() {
    let mut h = Harness::connected(true);
    h.input(&pubrel(77));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::PubComp(v5::PubComp {
            pkid: 77,
            reason: v5::PubCompReason::PacketIdentifierNotFound,
            ..
        })]
    ));
}

#[test]
fn v5_receive_maximum_exceeded_is_0x93() {
    let config = MqttConfig {
        receive_maximum: 2,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config, FakeBroker::new(), true);
    h.connect_ok("r", true);
    h.broker.state().confirm_pending = true;
    h.input(&pub_v5("t", 1, 1, b"x"));
    h.input(&pub_v5("t", 2, 2, b"x"));
    assert!(!h.conn.is_closed());
    h.input(&pub_v5("t", 1, 3, b"x"));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::ReceiveMaximumExceeded,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
}

#[test]
fn pending_acks_stop_reading() {
    let config = MqttConfig {
        pending_acks_max: 2,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config, FakeBroker::new(), false);
    h.connect_ok("r", true);
    h.broker.state().confirm_pending = true;
    h.input(&publish_v4("t", 1, 1, b"x"));
    assert!(h.conn.wants_input());
    h.input(&publish_v4("t", 1, 2, b"x"));
    assert!(!h.conn.wants_input());
    h.event(committed(1));
    assert!(h.conn.wants_input());
    h.broker.state().producer_blocked = true;
    assert!(!h.conn.wants_input());
}

#[test]
fn v5_topic_aliases_inbound() {
    let mut h = Harness::connected(true);
    let mut p = v5::Publish::new("long/topic", qos(0), b"1".to_vec());
    let mut props = publish_props();
    props.topic_alias = Some(3);
    p.properties = Some(props.clone());
    h.input(&publish_v5(p));
    let mut p = v5::Publish::new("", qos(0), b"2".to_vec());
    p.properties = Some(props);
    h.input(&publish_v5(p));
    {
        let s = h.broker.state();
        let topics: Vec<_> = s
            .published
            .iter()
            .map(|(a, _, _)| a.name().to_owned())
            .collect();
        assert_eq!(topics, vec!["long/topic", "long/topic"]);
    }
    // Alias above the maximum: 0x94.
    let mut p = v5::Publish::new("x", qos(0), b"3".to_vec());
    let mut props = publish_props();
    props.topic_alias = Some(65);
    p.properties = Some(props);
    h.input(&publish_v5(p));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::TopicAliasInvalid,
            ..
        })]
    ));
}

#[test]
fn v5_properties_reach_the_neutral_message() {
    let mut h = Harness::connected(true);
    let mut p = v5::Publish::new("req", qos(1), b"hello".to_vec());
    p.pkid = 1;
    p.retain = true;
    let mut props = publish_props();
    props.payload_format_indicator = Some(1);
    props.message_expiry_interval = Some(30);
    props.response_topic = Some("reply/1".into());
    props.correlation_data = Some(Bytes::from_static(b"\x01\x02"));
    props.content_type = Some("text/plain".into());
    props.user_properties = vec![
        ("a".into(), "1".into()),
        ("b".into(), "2".into()),
        ("a".into(), "3".into()),
    ];
    p.properties = Some(props);
    h.input(&publish_v5(p));
    let s = h.broker.state();
    let (_, m, _) = &s.published[0];
    assert_eq!(m.body.kind, BodyKind::Text);
    assert!(m.retain);
    assert_eq!(m.reply_to.as_deref(), Some("/topic/reply/1"));
    assert_eq!(
        m.correlation_id,
        Some(MessageId::Binary(Bytes::from_static(b"\x01\x02")))
    );
    assert_eq!(m.content_type.as_deref(), Some("text/plain"));
    let props: Vec<_> = m
        .properties
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_text()))
        .collect();
    assert_eq!(
        props,
        vec![
            ("a".into(), "1".into()),
            ("b".into(), "2".into()),
            ("a".into(), "3".into())
        ]
    );
    let expiry = m.expiry.expect("expiry");
    let now = rosetta_neutral::message::now_ms();
    assert!(
        expiry > now + 25_000 && expiry <= now + 30_000,
        "absolute expiry ~30 s ahead"
    );
}

#[test]
fn v5_qos_and_retain_limits() {
    let config = MqttConfig {
        qos_max: 1,
        retain_available: false,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config.clone(), FakeBroker::new(), true);
    h.connect_ok("l", true);
    h.input(&pub_v5("t", 2, 1, b"x"));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::QoSNotSupported,
            ..
        })]
    ));
    let mut h = Harness::with(config, FakeBroker::new(), true);
    h.connect_ok("l", true);
    let mut p = v5::Publish::new("t", qos(0), b"x".to_vec());
    p.retain = true;
    h.input(&publish_v5(p));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::RetainNotSupported,
            ..
        })]
    ));
}
