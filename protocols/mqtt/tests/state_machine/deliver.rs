use std::sync::Arc;

use bytes::Bytes;
use mqttbytes::{v4, v5};
use rosetta_neutral::*;

use crate::harness::*;

/// The annotation format the adapter stores: version 1, packet id, phase.
fn annotation(pkid: u16, phase: u8) -> Bytes {
    let [hi, lo] = pkid.to_be_bytes();
    Bytes::from(vec![1, hi, lo, phase])
}

/// The packet id is saved with the delivery only when the session outlives
/// the connection: a clean session's queue goes with it, so no redelivery
/// could ever resume it.
#[test]
fn qos1_delivery_is_settled_on_puback_and_annotated_when_the_session_lasts() {
    for (v5, clean) in [(false, false), (false, true), (true, true)] {
        let mut h = Harness::new(v5);
        h.connect_ok("c1", clean);
        h.subscribe_ok("harness/#");
        h.event(SessionEvent::Delivery(delivery(
            1,
            10,
            message("a/b", 1, b"hi"),
            2,
        )));
        let p = h.packets();
        let (pkid, dup, q) = match &p[..] {
            [Pkt::V4(v4::Packet::Publish(p))] => (p.pkid, p.dup, p.qos),
            [Pkt::V5(v5::Packet::Publish(p))] => (p.pkid, p.dup, p.qos),
            other => panic!("{other:?}"),
        };
        assert_eq!((pkid, dup, q), (1, false, mqttbytes::QoS::AtLeastOnce));
        {
            let s = h.broker.state();
            let expected = if clean {
                vec![]
            } else {
                vec![(ConsumerId(1), DeliveryTag(10), annotation(1, 1))]
            };
            assert_eq!(s.annotations, expected, "v5 {v5}, clean {clean}");
            assert!(s.settled.is_empty(), "not settled before PUBACK");
        }
        h.input(&puback(1));
        assert_eq!(
            h.broker.state().settled,
            vec![(ConsumerId(1), DeliveryTag(10), Outcome::Accept)]
        );
    }
}

#[test]
fn qos0_delivery_is_settled_at_once() {
    let mut h = Harness::subscribed(false);
    h.event(SessionEvent::Delivery(delivery(
        1,
        3,
        message("a", 0, b"x"),
        2,
    )));
    assert!(
        matches!(h.v4_packets().as_slice(), [v4::Packet::Publish(p)] if p.qos == mqttbytes::QoS::AtMostOnce)
    );
    assert_eq!(
        h.broker.state().settled,
        vec![(ConsumerId(1), DeliveryTag(3), Outcome::Accept)]
    );
}

#[test]
fn delivered_qos_is_the_lower_of_publish_and_grant() {
    let mut h = Harness::subscribed(true);
    h.event(SessionEvent::Delivery(delivery(
        1,
        1,
        message("a", 2, b"x"),
        1,
    )));
    h.event(SessionEvent::Delivery(delivery(
        1,
        2,
        message("a", 1, b"x"),
        2,
    )));
    h.event(SessionEvent::Delivery(delivery(
        1,
        3,
        message("a", 2, b"x"),
        0,
    )));
    let qos: Vec<_> = h
        .v5_packets()
        .into_iter()
        .map(|p| match p {
            v5::Packet::Publish(p) => p.qos as u8,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(qos, vec![1, 1, 0]);
}

#[test]
fn qos2_delivery_full_flow() {
    for v5 in [false, true] {
        let mut h = Harness::subscribed(v5);
        h.event(SessionEvent::Delivery(delivery(
            1,
            5,
            message("a", 2, b"x"),
            2,
        )));
        assert_eq!(h.packets().len(), 1);
        h.input(&pubrec(1));
        let p = h.packets();
        assert!(
            matches!(&p[..], [Pkt::V4(v4::Packet::PubRel(r))] if r.pkid == 1)
                || matches!(&p[..], [Pkt::V5(v5::Packet::PubRel(r))] if r.pkid == 1)
        );
        {
            let s = h.broker.state();
            assert_eq!(
                s.annotations.last().map(|a| a.2.clone()),
                Some(annotation(1, 2))
            );
            assert!(s.settled.is_empty(), "settled only on PUBCOMP");
        }
        h.input(&pubcomp(1));
        assert_eq!(
            h.broker.state().settled,
            vec![(ConsumerId(1), DeliveryTag(5), Outcome::Accept)]
        );
    }
}

#[test]
fn resumed_deliveries_reuse_the_packet_id_with_dup_or_pubrel() {
    let mut h = Harness::subscribed(false);
    let mut d = delivery(1, 8, message("a", 1, b"x"), 2);
    d.redelivered = true;
    d.annotation = Some(annotation(42, 1));
    h.event(SessionEvent::Delivery(d));
    let mut d = delivery(1, 9, message("a", 2, b"y"), 2);
    d.redelivered = true;
    d.annotation = Some(annotation(43, 2));
    h.event(SessionEvent::Delivery(d));
    let p = h.v4_packets();
    match &p[..] {
        [v4::Packet::Publish(p), v4::Packet::PubRel(r)] => {
            assert_eq!((p.pkid, p.dup), (42, true));
            assert_eq!(r.pkid, 43);
        }
        other => panic!("{other:?}"),
    }
    // A new delivery does not take an id in use.
    h.event(SessionEvent::Delivery(delivery(
        1,
        10,
        message("a", 1, b"z"),
        2,
    )));
    assert!(matches!(h.v4_packets().as_slice(), [v4::Packet::Publish(p)] if p.pkid == 1 && !p.dup));
    h.input(&pubcomp(43));
    h.input(&puback(42));
    let s = h.broker.state();
    assert_eq!(
        s.settled,
        vec![
            (ConsumerId(1), DeliveryTag(9), Outcome::Accept),
            (ConsumerId(1), DeliveryTag(8), Outcome::Accept)
        ]
    );
}

#[test]
fn packet_ids_skip_ids_in_flight() {
    let mut h = Harness::subscribed(false);
    let mut d = delivery(1, 1, message("a", 1, b"x"), 2);
    d.annotation = Some(annotation(2, 1));
    d.redelivered = true;
    h.event(SessionEvent::Delivery(d));
    h.event(SessionEvent::Delivery(delivery(
        1,
        2,
        message("a", 1, b"x"),
        2,
    )));
    h.event(SessionEvent::Delivery(delivery(
        1,
        3,
        message("a", 1, b"x"),
        2,
    )));
    let ids: Vec<u16> = h
        .v4_packets()
        .into_iter()
        .map(|p| match p {
            v4::Packet::Publish(p) => p.pkid,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, vec![2, 1, 3]);
}

#[test]
fn v5_delivery_larger_than_client_maximum_is_dropped_and_settled() {
    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("small");
    let mut props = connect_props();
    props.max_packet_size = Some(40);
    c.properties = Some(props);
    h.input(&connect_v5(c));
    h.packets();
    h.subscribe_ok("harness/#");
    h.event(SessionEvent::Delivery(delivery(
        1,
        1,
        message("a", 1, &[7u8; 64]),
        2,
    )));
    assert!(h.raw_output().is_empty());
    assert_eq!(
        h.broker.state().settled,
        vec![(ConsumerId(1), DeliveryTag(1), Outcome::Accept)]
    );
    h.event(SessionEvent::Delivery(delivery(
        1,
        2,
        message("a", 1, b"ok"),
        2,
    )));
    assert_eq!(h.v5_packets().len(), 1);
}

#[test]
fn v5_delivery_carries_properties_and_v311_only_payload() {
    let mut msg = message("req", 1, b"body");
    msg.body.kind = BodyKind::Text;
    msg.reply_to = Some("/topic/reply/1".into());
    msg.correlation_id = Some(MessageId::String("c-1".into()));
    msg.content_type = Some("text/plain".into());
    msg.expiry = Some(rosetta_neutral::message::now_ms() + 20_000);
    msg.properties.push("a", Value::Int(5));
    msg.properties.push("a", "x");
    let mut d = delivery(1, 1, msg.clone(), 2);
    d.matched.subscription_ids = vec![4, 9];

    let mut h = Harness::subscribed(true);
    h.event(SessionEvent::Delivery(d.clone()));
    let p = h.v5_packets();
    let [v5::Packet::Publish(p)] = p.as_slice() else {
        panic!("{p:?}")
    };
    let props = p.properties.as_ref().expect("props");
    assert_eq!(props.payload_format_indicator, Some(1));
    assert_eq!(props.response_topic.as_deref(), Some("reply/1"));
    assert_eq!(props.correlation_data.as_deref(), Some(&b"c-1"[..]));
    assert_eq!(props.content_type.as_deref(), Some("text/plain"));
    assert_eq!(props.subscription_identifiers, vec![4, 9]);
    assert_eq!(
        props.user_properties,
        vec![("a".into(), "5".into()), ("a".into(), "x".into())]
    );
    let left = props.message_expiry_interval.expect("remaining lifetime");
    assert!((19..=20).contains(&left), "{left}");

    let mut h = Harness::subscribed(false);
    h.event(SessionEvent::Delivery(d));
    let p = h.v4_packets();
    assert!(
        matches!(p.as_slice(), [v4::Packet::Publish(p)] if &p.payload[..] == b"body" && p.topic == "req")
    );
}

#[test]
fn retain_flag_on_delivery() {
    let mut retained = message("a", 0, b"x");
    retained.retain = true;
    let mut h = Harness::subscribed(true);
    // From the retained store: RETAIN set.
    let mut d = delivery(1, 1, retained.clone(), 2);
    d.from_retained = true;
    h.event(SessionEvent::Delivery(d));
    // Live, without retain-as-published: cleared.
    h.event(SessionEvent::Delivery(delivery(1, 2, retained.clone(), 2)));
    // Live, with retain-as-published: kept.
    let mut d = delivery(1, 3, retained.clone(), 2);
    d.matched.retain_as_published = true;
    h.event(SessionEvent::Delivery(d.clone()));
    let flags: Vec<bool> = h
        .v5_packets()
        .into_iter()
        .map(|p| match p {
            v5::Packet::Publish(p) => p.retain,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(flags, vec![true, false, true]);
    // 3.1.1 has no retain-as-published.
    let mut h = Harness::subscribed(false);
    h.event(SessionEvent::Delivery(d));
    assert!(matches!(h.v4_packets().as_slice(), [v4::Packet::Publish(p)] if !p.retain));
}

#[test]
fn v5_outbound_topic_aliases() {
    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("alias");
    let mut props = connect_props();
    props.topic_alias_max = Some(1);
    c.properties = Some(props);
    h.input(&connect_v5(c));
    h.packets();
    h.subscribe_ok("harness/#");
    for (tag, topic) in [(1, "x/y"), (2, "x/y"), (3, "other")] {
        h.event(SessionEvent::Delivery(delivery(
            1,
            tag,
            message(topic, 0, b"p"),
            2,
        )));
    }
    let seen: Vec<(String, Option<u16>)> = h
        .v5_packets()
        .into_iter()
        .map(|p| match p {
            v5::Packet::Publish(p) => (p.topic.clone(), p.properties.and_then(|p| p.topic_alias)),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("x/y".into(), Some(1)),
            ("".into(), Some(1)),
            ("other".into(), None)
        ]
    );
}

#[test]
fn client_refusing_a_delivery_rejects_it() {
    let mut h = Harness::subscribed(true);
    h.event(SessionEvent::Delivery(delivery(
        1,
        1,
        message("a", 1, b"x"),
        2,
    )));
    h.packets();
    h.input(&[0x40, 3, 0, 1, 0x80]);
    assert_eq!(
        h.broker.state().settled,
        vec![(ConsumerId(1), DeliveryTag(1), Outcome::Reject)]
    );
}

#[test]
fn session_queue_closed_disconnects() {
    let mut h = Harness::subscribed(true);
    h.event(SessionEvent::ConsumerClosed {
        consumer: ConsumerId(1),
        reason: BrokerError::NotFound("$mqtt/c1".into()),
    });
    assert!(h.conn.is_closed());
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(_)]
    ));
    // Events after the close are ignored.
    h.event(SessionEvent::Delivery(delivery(
        1,
        1,
        message("a", 1, b"x"),
        2,
    )));
    assert!(h.raw_output().is_empty());
    let _ = Arc::new(0);
}

#[test]
fn expired_messages_are_not_delivered() {
    let mut h = Harness::subscribed(true);
    let mut msg = message("a", 1, b"old");
    msg.expiry = Some(1);
    h.event(SessionEvent::Delivery(delivery(1, 1, msg, 2)));
    assert!(h.raw_output().is_empty());
    assert_eq!(
        h.broker.state().settled,
        vec![(ConsumerId(1), DeliveryTag(1), Outcome::Accept)]
    );
}

#[test]
fn in_flight_never_exceeds_the_client_receive_maximum_across_consumers() {
    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("rm");
    let mut props = connect_props();
    props.receive_maximum = Some(2);
    c.properties = Some(props);
    h.input(&connect_v5(c));
    h.packets();
    h.subscribe_ok("harness/#");
    assert_eq!(
        h.broker.state().consumers[0].1.credit,
        CreditMode::Window(2)
    );
    // Two consumers (session + a shared one) each within their window,
    // three QoS 1 deliveries in total: the third waits.
    let mut sub = v5::Subscribe::new("$share/g/a", qos(1));
    sub.pkid = 1;
    h.input(&subscribe_v5(sub));
    h.packets();
    h.event(SessionEvent::Delivery(delivery(
        1,
        1,
        message("a", 1, b"1"),
        2,
    )));
    h.event(SessionEvent::Delivery(delivery(
        2,
        1,
        message("a", 1, b"2"),
        2,
    )));
    h.event(SessionEvent::Delivery(delivery(
        1,
        2,
        message("a", 0, b"3"),
        2,
    )));
    assert_eq!(h.v5_packets().len(), 2);
    h.input(&puback(1));
    let p = h.v5_packets();
    assert!(matches!(p.as_slice(), [v5::Packet::Publish(p)] if &p.payload[..] == b"3"));
}

#[test]
fn will_expiry_is_left_to_publish_time() {
    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("w");
    let mut will = v5::LastWill::new("s/w", b"x".to_vec(), mqttbytes::QoS::AtMostOnce, false);
    will.properties = Some(v5::WillProperties {
        delay_interval: None,
        payload_format_indicator: None,
        message_expiry_interval: Some(60),
        content_type: None,
        response_topic: None,
        correlation_data: None,
        user_properties: Vec::new(),
    });
    c.last_will = Some(will);
    h.input(&connect_v5(c));
    h.packets();
    let s = h.broker.state();
    assert_eq!(s.wills[0].as_ref().map(|w| w.message.expiry), Some(None));
}

#[test]
fn qos0_window_slot_is_freed_only_when_bytes_leave() {
    let mut h = Harness::subscribed(false);
    h.event(SessionEvent::Delivery(delivery(
        1,
        1,
        message("a", 0, b"x"),
        2,
    )));
    h.event(SessionEvent::Delivery(delivery(
        1,
        2,
        message("a", 0, b"y"),
        2,
    )));
    assert!(
        h.broker.state().settled.is_empty(),
        "not settled while unsent"
    );
    assert_eq!(h.v4_packets().len(), 2);
    assert_eq!(
        h.broker.state().settled,
        vec![
            (ConsumerId(1), DeliveryTag(1), Outcome::Accept),
            (ConsumerId(1), DeliveryTag(2), Outcome::Accept)
        ]
    );
}

#[test]
fn closed_shared_consumer_is_forgotten_without_disconnecting() {
    let mut h = Harness::subscribed(true);
    let mut sub = v5::Subscribe::new("$share/g/a", qos(1));
    sub.pkid = 1;
    h.input(&subscribe_v5(sub));
    h.packets();
    h.event(SessionEvent::ConsumerClosed {
        consumer: ConsumerId(2),
        reason: BrokerError::NotFound("$share/g/a".into()),
    });
    assert!(!h.conn.is_closed());
    h.event(SessionEvent::Delivery(delivery(
        2,
        1,
        message("a", 1, b"x"),
        1,
    )));
    assert!(
        h.raw_output().is_empty(),
        "deliveries for a closed consumer are ignored"
    );
}

#[test]
fn pubrec_for_an_unknown_id_gets_pubrel_0x92() {
    let mut h = Harness::subscribed(true);
    h.input(&pubrec(12));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::PubRel(v5::PubRel {
            pkid: 12,
            reason: v5::PubRelReason::PacketIdentifierNotFound,
            ..
        })]
    ));
}

/// The packet id of the one QoS 1 PUBLISH the connection wrote since the
/// last look.
fn sole_publish_id(h: &mut Harness) -> u16 {
    match h.v4_packets().as_slice() {
        [v4::Packet::Publish(p)] => p.pkid,
        other => panic!("{other:?}"),
    }
}

/// A connection about to park frees its QoS flows when nothing is in them
/// (issue 20): a fresh box numbers packet ids from 1 again, so the id
/// shows whether it went. One with a delivery in flight keeps them, and
/// the PUBACK still settles that delivery after the park.
#[test]
fn parking_frees_idle_flows_and_keeps_busy_ones() {
    let mut h = Harness::subscribed(false);
    h.event(SessionEvent::Delivery(delivery(
        1,
        1,
        message("a", 1, b"x"),
        1,
    )));
    assert_eq!(sole_publish_id(&mut h), 1);
    h.input(&puback(1));
    h.conn.shrink_when_parked();
    h.event(SessionEvent::Delivery(delivery(
        1,
        2,
        message("a", 1, b"y"),
        1,
    )));
    assert_eq!(sole_publish_id(&mut h), 1, "flows freed: ids start again");

    // In flight (no PUBACK yet): kept, and the next id follows on.
    h.conn.shrink_when_parked();
    h.event(SessionEvent::Delivery(delivery(
        1,
        3,
        message("a", 1, b"z"),
        1,
    )));
    assert_eq!(sole_publish_id(&mut h), 2, "flows kept while busy");
    h.input(&puback(1));
    h.input(&puback(2));
    assert_eq!(
        h.broker.state().settled,
        vec![
            (ConsumerId(1), DeliveryTag(1), Outcome::Accept),
            (ConsumerId(1), DeliveryTag(2), Outcome::Accept),
            (ConsumerId(1), DeliveryTag(3), Outcome::Accept),
        ]
    );
}
