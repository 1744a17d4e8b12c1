//! Shared and `$queue/` subscriptions of a persistent session: saved in the
//! session's durable state, re-attached on resume, forgotten on
//! unsubscribe, clean start and session end.

use std::time::Duration;

use mqttbytes::v5;
use rosetta_mqtt::MqttConfig;
use rosetta_neutral::*;

use crate::fake::FakeBroker;
use crate::harness::*;

const KEY: &str = "mqtt.own-subscriptions";

/// Connects `id`; v5 asks for a session expiry of `expiry` seconds.
fn connect(h: &mut Harness, id: &str, clean: bool, expiry: Option<u32>) -> bool {
    if !h.v5 {
        return h.connect_ok(id, clean);
    }
    let mut c = v5::Connect::new(id);
    c.clean_session = clean;
    c.keep_alive = 30;
    let mut props = connect_props();
    props.session_expiry_interval = expiry;
    c.properties = Some(props);
    h.input(&connect_v5(c));
    match h.v5_packets().as_slice() {
        [v5::Packet::ConnAck(a)] => {
            assert_eq!(a.code, v5::ConnectReturnCode::Success);
            a.session_present
        }
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

fn subscribe(h: &mut Harness, pkid: u16, filters: &[(&str, u8)]) {
    if h.v5 {
        let filters = filters
            .iter()
            .map(|(f, q)| v5::SubscribeFilter::new((*f).to_owned(), qos(*q)))
            .collect();
        h.input(&subscribe_v5(v5::Subscribe {
            pkid,
            filters,
            properties: None,
        }));
    } else {
        h.input(&subscribe_v4(pkid, filters));
    }
    h.packets();
}

/// Queues consumed by consumers not cancelled, sorted.
fn consumed(b: &FakeBroker) -> Vec<String> {
    let s = b.state();
    let mut q: Vec<String> = s
        .consumers
        .iter()
        .filter(|(id, _)| !s.cancelled.contains(id))
        .map(|(_, spec)| spec.queue.clone())
        .collect();
    q.sort();
    q
}

/// Forgets the consumers of a closed connection, as the core does.
fn close_connection(h: &mut Harness) {
    h.conn.handle_transport_closed(h.now);
    let mut s = h.broker.state();
    let ids: Vec<ConsumerId> = s.consumers.iter().map(|(id, _)| *id).collect();
    s.cancelled.extend(ids);
}

fn resumes_both_kinds(v5: bool) {
    let mut h = Harness::new(v5);
    assert!(!connect(&mut h, "p", false, Some(3600)));
    subscribe(
        &mut h,
        1,
        &[("$share/g/a/#", 1), ("$queue/jobs", 1), ("plain", 1)],
    );
    assert!(h.broker.state().kv.contains_key(KEY), "saved");
    {
        let s = h.broker.state();
        let group = &s.queues["$share/g/a/#"];
        assert!(
            group.durable,
            "a persistent member's group queue is durable"
        );
        assert!(matches!(group.lifetime, QueueLifetime::IdleFor(_)));
    }
    close_connection(&mut h);
    assert!(consumed(&h.broker).is_empty());

    // Resume: both consumers come back without a SUBSCRIBE.
    let mut h = h.reconnect(MqttConfig::default(), v5);
    assert!(connect(&mut h, "p", false, Some(3600)));
    assert_eq!(consumed(&h.broker), ["$mqtt/p", "$share/g/a/#", "jobs"]);

    // A `$queue/` delivery keeps the QoS granted before the restart.
    let jobs = h
        .broker
        .state()
        .consumers
        .iter()
        .rev()
        .find(|(_, spec)| spec.queue == "jobs")
        .map(|(id, _)| *id)
        .expect("jobs consumer");
    let mut msg = message("jobs", 2, b"j");
    msg.address = Some(Address::Queue("jobs".into()));
    let mut d = delivery(jobs.0, 1, msg, 2);
    d.matched = MatchInfo::default();
    h.event(SessionEvent::Delivery(d));
    let qos_sent = match h.packets().as_slice() {
        [Pkt::V5(v5::Packet::Publish(p))] => p.qos as u8,
        [Pkt::V4(mqttbytes::v4::Packet::Publish(p))] => p.qos as u8,
        other => panic!("{other:?}"),
    };
    assert_eq!(qos_sent, 1, "granted QoS 1 survives the resume");

    // Unsubscribing one leaves the other saved.
    h.input(&unsubscribe(2, &["$queue/jobs"], v5));
    h.packets();
    close_connection(&mut h);
    let mut h = h.reconnect(MqttConfig::default(), v5);
    assert!(connect(&mut h, "p", false, Some(3600)));
    assert_eq!(consumed(&h.broker), ["$mqtt/p", "$share/g/a/#"]);

    // A clean start ends them all.
    close_connection(&mut h);
    let mut h = h.reconnect(MqttConfig::default(), v5);
    assert!(!connect(&mut h, "p", true, Some(3600)));
    assert!(!h.broker.state().kv.contains_key(KEY), "forgotten");
    // A clean 3.1.1 session gets its queue with its first subscription;
    // a v5 one with an expiry lasts, so it has one at once.
    let expected: &[&str] = if v5 { &["$mqtt/p"] } else { &[] };
    assert_eq!(consumed(&h.broker), expected);
}

#[test]
fn v311_persistent_session_resumes_shared_and_queue_subscriptions() {
    resumes_both_kinds(false);
}

#[test]
fn v5_persistent_session_resumes_shared_and_queue_subscriptions() {
    resumes_both_kinds(true);
}

#[test]
fn clean_sessions_save_nothing_and_keep_consumer_lifetime_groups() {
    let mut h = Harness::new(false);
    connect(&mut h, "c", true, None);
    subscribe(&mut h, 1, &[("$share/g/x", 1), ("$queue/q", 1)]);
    let s = h.broker.state();
    assert!(!s.kv.contains_key(KEY));
    assert_eq!(s.queues["$share/g/x"].lifetime, QueueLifetime::Consumer);
    assert!(!s.queues["$share/g/x"].durable);
}

#[test]
fn expired_session_does_not_resume_its_subscriptions() {
    let mut h = Harness::new(true);
    connect(&mut h, "e", false, Some(60));
    subscribe(&mut h, 1, &[("$queue/q", 1)]);
    close_connection(&mut h);
    // The core expired the session queue while the client was away.
    h.broker.state().queues.remove("$mqtt/e");
    let mut h = h.reconnect(MqttConfig::default(), true);
    assert!(!connect(&mut h, "e", false, Some(60)));
    assert_eq!(consumed(&h.broker), ["$mqtt/e"]);
    assert!(!h.broker.state().kv.contains_key(KEY));
}

#[test]
fn session_ended_by_disconnect_forgets_its_subscriptions() {
    let mut h = Harness::new(true);
    connect(&mut h, "d", false, Some(60));
    subscribe(&mut h, 1, &[("$share/g/t", 1)]);
    assert!(h.broker.state().kv.contains_key(KEY));
    // DISCONNECT with session expiry 0.
    h.input(&[0xE0, 0x07, 0x00, 0x05, 0x11, 0, 0, 0, 0]);
    assert!(h.conn.is_closed());
    assert!(!h.broker.state().kv.contains_key(KEY));
}

#[test]
fn disconnect_with_a_new_expiry_updates_the_group_queue() {
    let mut h = Harness::new(true);
    connect(&mut h, "d", false, Some(60));
    subscribe(&mut h, 1, &[("$share/g/t", 1)]);
    // DISCONNECT with session expiry 300 s.
    h.input(&[0xE0, 0x07, 0x00, 0x05, 0x11, 0, 0, 0x01, 0x2C]);
    assert_eq!(
        h.broker.state().queues["$share/g/t"].lifetime,
        QueueLifetime::IdleFor(Duration::from_secs(300))
    );
}

#[test]
fn own_subscriptions_are_capped() {
    let config = MqttConfig {
        own_subscriptions_max: 2,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config, FakeBroker::new(), false);
    h.connect_ok("cap", false);
    h.input(&subscribe_v4(
        1,
        &[
            ("$queue/a", 1),
            ("$share/g/b", 1),
            ("$queue/c", 1),
            ("$queue/a", 0),
            ("plain", 1),
        ],
    ));
    match h.v4_packets().as_slice() {
        [mqttbytes::v4::Packet::SubAck(a)] => {
            use mqttbytes::v4::SubscribeReasonCode::*;
            assert_eq!(
                a.return_codes,
                vec![
                    Success(qos(1)),
                    Success(qos(1)),
                    Failure,
                    Success(qos(0)),
                    Success(qos(1))
                ],
                "the third is refused; re-subscribing and plain filters are not counted"
            );
        }
        other => panic!("{other:?}"),
    }
}
