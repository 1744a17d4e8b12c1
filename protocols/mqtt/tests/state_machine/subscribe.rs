use mqttbytes::{v4, v5};
use rosetta_mqtt::MqttConfig;
use rosetta_neutral::*;

use crate::fake::FakeBroker;
use crate::harness::*;

fn v5_sub(pkid: u16, filters: Vec<v5::SubscribeFilter>, id: Option<usize>) -> Vec<u8> {
    subscribe_v5(v5::Subscribe {
        pkid,
        filters,
        properties: id.map(|id| v5::SubscribeProperties {
            id: Some(id),
            user_properties: Vec::new(),
        }),
    })
}

fn suback_codes(h: &mut Harness) -> Vec<u8> {
    match h.packets().as_slice() {
        [Pkt::V5(v5::Packet::SubAck(a))] => a.return_codes.iter().map(|c| *c as u8).collect(),
        [Pkt::V4(v4::Packet::SubAck(a))] => a
            .return_codes
            .iter()
            .map(|c| match c {
                v4::SubscribeReasonCode::Success(q) => *q as u8,
                v4::SubscribeReasonCode::Failure => 0x80,
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn v5_subscribe_binds_with_all_options() {
    let config = MqttConfig {
        qos_max: 1,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config, FakeBroker::new(), true);
    h.connect_ok("s", true);
    let mut f = v5::SubscribeFilter::new("a/+/c".into(), qos(2));
    f.set_nolocal(true)
        .set_preserve_retain(true)
        .set_retain_forward_rule(v5::RetainForwardRule::OnNewSubscribe);
    let g = v5::SubscribeFilter::new("z".into(), qos(0));
    let mut n = v5::SubscribeFilter::new("n".into(), qos(1));
    n.set_retain_forward_rule(v5::RetainForwardRule::Never);
    h.input(&v5_sub(3, vec![f, g, n], Some(77)));
    assert_eq!(
        suback_codes(&mut h),
        vec![1, 0, 1],
        "granted = min(requested, max)"
    );
    let s = h.broker.state();
    let b = &s.queues["$mqtt/s"].bindings;
    assert_eq!(b[0].0, "a/+/c");
    assert_eq!(
        b[0].1,
        BindingOptions {
            max_guarantee: Guarantee::AtLeastOnce,
            subscription_id: Some(77),
            no_local: true,
            retain_as_published: true,
            retained: RetainedOnBind::SendIfNew,
            excluded: Default::default(),
        }
    );
    assert_eq!(b[1].1.retained, RetainedOnBind::Send);
    assert_eq!(b[1].1.max_guarantee, Guarantee::AtMostOnce);
    assert_eq!(b[2].1.retained, RetainedOnBind::None);
}

#[test]
fn v311_subscribe_and_failures() {
    let mut h = Harness::connected(false);
    h.input(&subscribe_v4(1, &[("a/#", 2), ("a/#/b", 1), ("x", 1)]));
    assert_eq!(suback_codes(&mut h), vec![2, 0x80, 1]);
    let s = h.broker.state();
    let b = &s.queues["$mqtt/c1"].bindings;
    assert_eq!(b.len(), 2);
    assert_eq!(b[0].1.retained, RetainedOnBind::Send);
    assert!(!b[0].1.no_local);
}

#[test]
fn v5_suback_reason_codes() {
    let config = MqttConfig {
        wildcard_subscriptions_available: false,
        shared_subscriptions_available: false,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config, FakeBroker::new(), true);
    h.connect_ok("s", true);
    let filters = ["a/#/b", "a/+", "$share/g/a", "ok"]
        .iter()
        .map(|f| v5::SubscribeFilter::new((*f).into(), qos(1)))
        .collect();
    h.input(&v5_sub(1, filters, None));
    assert_eq!(suback_codes(&mut h), vec![0x8F, 0xA2, 0x9E, 1]);

    h.broker.state().fail_bind = Some(BrokerError::Unauthorized("ok".into()));
    h.input(&v5_sub(
        2,
        vec![v5::SubscribeFilter::new("ok".into(), qos(1))],
        None,
    ));
    assert_eq!(suback_codes(&mut h), vec![0x87]);
}

#[test]
fn subscription_identifiers_can_be_disabled() {
    let config = MqttConfig {
        subscription_identifiers_available: false,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config, FakeBroker::new(), true);
    h.connect_ok("s", true);
    h.input(&v5_sub(
        1,
        vec![v5::SubscribeFilter::new("a".into(), qos(1))],
        Some(5),
    ));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::SubscriptionIdentifiersNotSupported,
            ..
        })]
    ));
}

#[test]
fn shared_subscription_has_its_own_queue_and_consumer() {
    for v5 in [false, true] {
        let mut h = Harness::subscribed(v5);
        let pkt = if v5 {
            v5_sub(
                1,
                vec![v5::SubscribeFilter::new("$share/g/a/+".into(), qos(1))],
                None,
            )
        } else {
            subscribe_v4(1, &[("$share/g/a/+", 1)])
        };
        h.input(&pkt);
        assert_eq!(suback_codes(&mut h), vec![1]);
        {
            let s = h.broker.state();
            let q = &s.queues["$share/g/a/+"];
            assert!(!q.durable);
            assert_eq!(q.lifetime, QueueLifetime::Consumer);
            assert_eq!(q.bindings[0].0, "a/+");
            assert_eq!(q.bindings[0].1.retained, RetainedOnBind::None);
            assert_eq!(s.consumers[1].1.queue, "$share/g/a/+");
            assert!(!s.consumers[1].1.auto_settle);
        }
        // Deliveries from the shared consumer go out like any other.
        h.event(SessionEvent::Delivery(delivery(
            2,
            1,
            message("a/x", 1, b"m"),
            1,
        )));
        assert_eq!(h.packets().len(), 1);

        h.input(&unsubscribe(2, &["$share/g/a/+", "$share/g/a/+"], v5));
        let p = h.packets();
        if let [Pkt::V5(v5::Packet::UnsubAck(u))] = &p[..] {
            assert_eq!(
                u.reasons,
                vec![
                    v5::UnsubAckReason::Success,
                    v5::UnsubAckReason::NoSubscriptionExisted
                ]
            );
        } else {
            assert!(matches!(&p[..], [Pkt::V4(v4::Packet::UnsubAck(u))] if u.pkid == 2));
        }
        assert_eq!(h.broker.state().cancelled, vec![ConsumerId(2)]);
    }
}

#[test]
fn no_local_on_a_shared_subscription_is_a_protocol_error() {
    let mut h = Harness::connected(true);
    let mut f = v5::SubscribeFilter::new("$share/g/a".into(), qos(1));
    f.set_nolocal(true);
    h.input(&v5_sub(1, vec![f], None));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::ProtocolError,
            ..
        })]
    ));
}

#[test]
fn unsubscribe_unbinds() {
    let mut h = Harness::connected(true);
    h.input(&v5_sub(
        1,
        vec![v5::SubscribeFilter::new("a/b".into(), qos(1))],
        None,
    ));
    h.packets();
    h.input(&unsubscribe(2, &["a/b", "nope", "a/#/x"], true));
    let p = h.v5_packets();
    let [v5::Packet::UnsubAck(u)] = p.as_slice() else {
        panic!("{p:?}")
    };
    assert_eq!(
        u.reasons,
        vec![
            v5::UnsubAckReason::Success,
            v5::UnsubAckReason::NoSubscriptionExisted,
            v5::UnsubAckReason::TopicFilterInvalid
        ]
    );
    assert!(h.broker.state().queues["$mqtt/c1"].bindings.is_empty());
}

/// The session's subscription cap travels with its queue (the core counts
/// the queue's bindings), for a clean session's queue made on the first
/// SUBSCRIBE and a persistent one's made at CONNECT; the core's refusal
/// is 0x97 in v5 and 0x80 in 3.1.1.
#[test]
fn the_subscription_cap_is_declared_with_the_session_queue() {
    let config = MqttConfig {
        subscriptions_max: 7,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config.clone(), FakeBroker::new(), true);
    h.connect_ok("clean", true);
    assert!(!h.broker.state().queues.contains_key("$mqtt/clean"));
    h.subscribe_ok("a");
    assert_eq!(h.broker.state().queues["$mqtt/clean"].bindings_max, Some(7));
    h.broker.state().fail_bind = Some(BrokerError::ResourceLimit("7 bindings".into()));
    h.input(&v5_sub(
        2,
        vec![v5::SubscribeFilter::new("b".into(), qos(1))],
        None,
    ));
    assert_eq!(suback_codes(&mut h), vec![0x97]);

    let mut h = Harness::with(config, FakeBroker::new(), false);
    h.connect_ok("kept", false);
    assert_eq!(h.broker.state().queues["$mqtt/kept"].bindings_max, Some(7));
    h.broker.state().fail_bind = Some(BrokerError::ResourceLimit("7 bindings".into()));
    h.input(&subscribe_v4(1, &[("b", 1)]));
    let p = h.v4_packets();
    let [v4::Packet::SubAck(a)] = p.as_slice() else {
        panic!("{p:?}")
    };
    assert_eq!(a.return_codes, vec![v4::SubscribeReasonCode::Failure]);
}
