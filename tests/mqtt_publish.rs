//! MQTT PUBLISH over real sockets: the QoS 0/1/2 flows, ordering, packet
//! ids and in-flight windows (receive maximum both ways), retained messages
//! (also across a restart) and last wills (v5 will delay and properties).

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::mqtt::*;
use common::TestBroker;
use rumqttc::v5::mqttbytes::v5 as p5;
use rumqttc::v5::mqttbytes::QoS as Q5;
use rumqttc::QoS;

#[tokio::test]
async fn qos_0_1_2_flows_reach_v311_and_v5_subscribers() {
    let broker = TestBroker::start().await;
    let (_s4, mut ev4) = subscriber4(&broker, "flows4", true, "flows/#", QoS::ExactlyOnce).await;
    let (s5, mut ev5, _) = connected5(opts5(&broker, "flows5")).await;
    subscribe5(
        &s5,
        &mut ev5,
        v5::Filter::new("flows/#", Q5::ExactlyOnce),
        None,
    )
    .await;

    let (p, mut pev, _) = connected4(&broker, "flows-pub", true).await;
    for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        // publish_and_ack4 waits for PUBACK (QoS 1) or PUBREC+PUBCOMP (QoS 2).
        publish_and_ack4(&p, &mut pev, &format!("flows/{i}"), qos, false, b"x").await;
    }
    for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        let got = publish4(&mut ev4).await;
        assert_eq!(
            (got.topic.as_str(), got.qos),
            (format!("flows/{i}").as_str(), qos)
        );
        assert!(!got.retain);
        let got = publish5(&mut ev5).await;
        assert_eq!(got.topic, Bytes::from(format!("flows/{i}")));
        assert_eq!(got.qos as u8, qos as u8);
    }
    quiet4(&mut ev4).await;
    broker.stop().await;
}

#[tokio::test]
async fn order_is_kept_per_topic_and_subscriber() {
    let broker = TestBroker::start().await;
    let (_s, mut sev) = subscriber4(&broker, "order-sub", true, "order", QoS::ExactlyOnce).await;
    let (p, mut pev, _) = connected4(&broker, "order-pub", true).await;
    let qos = [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce];
    for i in 0..60u32 {
        p.publish("order", qos[i as usize % 3], false, i.to_string())
            .await
            .expect("publish");
    }
    // Drive the publisher while reading the subscriber.
    let mut got = Vec::new();
    let deadline = Instant::now() + WAIT;
    while got.len() < 60 {
        assert!(
            Instant::now() < deadline,
            "only {} of 60 arrived",
            got.len()
        );
        tokio::select! {
            r = pev.poll() => { r.expect("publisher up"); }
            r = sev.poll() => {
                if let rumqttc::Event::Incoming(rumqttc::Packet::Publish(m)) = r.expect("subscriber up") {
                    got.push(String::from_utf8(m.payload.to_vec()).expect("utf8"));
                }
            }
        }
    }
    let want: Vec<String> = (0..60).map(|i: u32| i.to_string()).collect();
    assert_eq!(got, want);
    broker.stop().await;
}

/// The broker never has more unacknowledged QoS 1/2 deliveries toward a
/// client than its Receive Maximum, and uses distinct non-zero packet ids.
#[tokio::test]
async fn outbound_window_is_the_client_receive_maximum() {
    let broker = TestBroker::start().await;
    let props = p5::ConnectProperties {
        receive_maximum: Some(3),
        ..p5::ConnectProperties::new()
    };
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "window", Some(props)).await;
    raw_subscribe5(&mut raw, 1, "win", Q5::AtLeastOnce).await;
    for i in 0..10u8 {
        publish_once4(&broker, "win", QoS::AtLeastOnce, false, &[i]).await;
    }
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(raw.recv5_publish().await);
    }
    raw.quiet5().await; // window full
    let ids: HashSet<u16> = first.iter().map(|p| p.pkid).collect();
    assert_eq!(ids.len(), 3, "distinct packet ids");
    assert!(!ids.contains(&0));
    // Each ack opens the window by one, in order.
    let mut seen: Vec<u8> = first.iter().map(|p| p.payload[0]).collect();
    let mut pending: Vec<u16> = first.iter().map(|p| p.pkid).collect();
    while seen.len() < 10 {
        let id = pending.remove(0);
        raw.send5(p5::Packet::PubAck(p5::PubAck::new(id, None)))
            .await;
        let next = raw.recv5_publish().await;
        assert!(
            !pending.contains(&next.pkid),
            "packet id {} still in flight",
            next.pkid
        );
        pending.push(next.pkid);
        seen.push(next.payload[0]);
        raw.quiet5_for(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, (0..10).collect::<Vec<u8>>());
    broker.stop().await;
}

/// A client with more unacknowledged inbound QoS 2 publishes than our
/// Receive Maximum gets DISCONNECT 0x93.
#[tokio::test]
async fn exceeding_the_receive_maximum_is_disconnect_0x93() {
    let broker = TestBroker::start_with(
        |c| c.mqtt.receive_maximum = 2,
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let (mut raw, ack) = Raw::connect5_clean(broker.mqtt(), "greedy", None).await;
    assert_eq!(ack.properties.and_then(|p| p.receive_max), Some(2));
    for id in 1..=2u16 {
        let mut p = p5::Publish::new("greedy", Q5::ExactlyOnce, "x", None);
        p.pkid = id;
        raw.send5(p5::Packet::Publish(p)).await;
        assert!(matches!(raw.recv5().await, p5::Packet::PubRec(r) if r.pkid == id));
    }
    let mut p = p5::Publish::new("greedy", Q5::ExactlyOnce, "x", None);
    p.pkid = 3;
    raw.send5(p5::Packet::Publish(p)).await;
    raw.expect_disconnect5(p5::DisconnectReasonCode::ReceiveMaximumExceeded)
        .await;
    broker.stop().await;
}

/// QoS 2 inbound within one connection: a re-sent PUBLISH with the same
/// packet id before PUBREL is the same message; after PUBCOMP the id is free
/// for a new message.
#[tokio::test]
async fn inbound_qos2_packet_ids_deduplicate_then_free() {
    let broker = TestBroker::start().await;
    let (_s, mut sev) = subscriber4(&broker, "ids-sub", true, "ids", QoS::ExactlyOnce).await;
    let (mut raw, _) = Raw::connect4(broker.mqtt(), "ids-pub", true, 10).await;
    let send = |payload: &'static [u8], dup: bool| {
        let mut p = p4::Publish::new("ids", QoS::ExactlyOnce, payload.to_vec());
        p.pkid = 1;
        p.dup = dup;
        p4::Packet::Publish(p)
    };
    raw.send4(send(b"first", false)).await;
    assert!(matches!(raw.recv4().await, p4::Packet::PubRec(r) if r.pkid == 1));
    raw.send4(send(b"first", true)).await;
    assert!(matches!(raw.recv4().await, p4::Packet::PubRec(r) if r.pkid == 1));
    raw.send4(p4::Packet::PubRel(p4::PubRel::new(1))).await;
    assert!(matches!(raw.recv4().await, p4::Packet::PubComp(c) if c.pkid == 1));
    raw.send4(send(b"second", false)).await;
    assert!(matches!(raw.recv4().await, p4::Packet::PubRec(r) if r.pkid == 1));
    raw.send4(p4::Packet::PubRel(p4::PubRel::new(1))).await;
    assert!(matches!(raw.recv4().await, p4::Packet::PubComp(c) if c.pkid == 1));

    assert_eq!(&publish4(&mut sev).await.payload[..], b"first");
    assert_eq!(&publish4(&mut sev).await.payload[..], b"second");
    quiet4(&mut sev).await;
    broker.stop().await;
}

// ---- retained messages -------------------------------------------------------

#[tokio::test]
async fn retained_messages_are_delivered_on_subscribe_and_cleared_by_empty_payload() {
    let broker = TestBroker::start().await;
    publish_once4(&broker, "ret/a/temp", QoS::AtLeastOnce, true, b"21").await;
    publish_once4(&broker, "ret/b/temp", QoS::AtLeastOnce, true, b"22").await;
    publish_once4(&broker, "ret/b/temp", QoS::AtLeastOnce, true, b"23").await; // replaces

    // Exact and wildcard subscriptions both get the retained messages, with
    // the retain flag set.
    let (_s, mut ev) =
        subscriber4(&broker, "ret-exact", true, "ret/a/temp", QoS::AtLeastOnce).await;
    let p = publish4(&mut ev).await;
    assert!(p.retain);
    assert_eq!(&p.payload[..], b"21");
    quiet4(&mut ev).await;
    let (_s, mut ev) = subscriber4(&broker, "ret-wild", true, "ret/+/temp", QoS::AtLeastOnce).await;
    let mut got = [publish4(&mut ev).await, publish4(&mut ev).await];
    got.sort_by(|a, b| a.topic.cmp(&b.topic));
    assert!(got.iter().all(|p| p.retain));
    assert_eq!(&got[0].payload[..], b"21");
    assert_eq!(&got[1].payload[..], b"23");
    quiet4(&mut ev).await;

    // A live retained publish reaches existing 3.1.1 subscribers with
    // RETAIN 0 (it is not a stored message to them).
    publish_once4(&broker, "ret/a/temp", QoS::AtLeastOnce, true, b"24").await;
    let p = publish4(&mut ev).await;
    assert!(!p.retain);
    assert_eq!(&p.payload[..], b"24");

    // An empty retained publish clears the topic (and is delivered live).
    publish_once4(&broker, "ret/a/temp", QoS::AtLeastOnce, true, b"").await;
    let p = publish4(&mut ev).await;
    assert!(p.payload.is_empty());
    let (_s, mut ev) = subscriber4(&broker, "ret-after", true, "ret/#", QoS::AtLeastOnce).await;
    let p = publish4(&mut ev).await;
    assert_eq!(p.topic, "ret/b/temp");
    quiet4(&mut ev).await;
    broker.stop().await;
}

#[tokio::test]
async fn retained_messages_survive_a_restart() {
    let mut broker = TestBroker::start().await;
    publish_once4(&broker, "keep/ret", QoS::AtLeastOnce, true, b"stored").await;
    publish_once4(&broker, "keep/gone", QoS::AtLeastOnce, true, b"x").await;
    publish_once4(&broker, "keep/gone", QoS::AtLeastOnce, true, b"").await;
    broker.restart().await;
    let (_s, mut ev) = subscriber4(&broker, "ret-restart", true, "keep/#", QoS::AtLeastOnce).await;
    let p = publish4(&mut ev).await;
    assert!(p.retain);
    assert_eq!(
        (p.topic.as_str(), &p.payload[..]),
        ("keep/ret", &b"stored"[..])
    );
    quiet4(&mut ev).await;
    broker.stop().await;
}

// ---- last will ------------------------------------------------------------------

fn will4(id: &str, topic: &str) -> p4::Connect {
    let mut c = p4::Connect::new(id);
    c.keep_alive = 10;
    c.last_will = Some(p4::LastWill::new(
        topic,
        b"gone".to_vec(),
        QoS::AtLeastOnce,
        false,
    ));
    c
}

#[tokio::test]
async fn will_is_published_on_abnormal_disconnect_only() {
    let broker = TestBroker::start().await;
    let (_s, mut ev) = subscriber4(&broker, "will-watch", true, "will/#", QoS::AtLeastOnce).await;

    // Clean DISCONNECT: no will.
    let (mut raw, _) = Raw::connect4_with(broker.mqtt(), will4("polite", "will/polite")).await;
    raw.send4(p4::Packet::Disconnect).await;
    raw.expect_silent_close().await;
    quiet4(&mut ev).await;

    // Socket dropped without DISCONNECT: the will.
    let (raw, _) = Raw::connect4_with(broker.mqtt(), will4("rude", "will/rude")).await;
    drop(raw);
    let p = publish4(&mut ev).await;
    assert_eq!(
        (p.topic.as_str(), &p.payload[..]),
        ("will/rude", &b"gone"[..])
    );

    // Keep-alive expiry is abnormal too.
    let mut c = will4("sleepy", "will/sleepy");
    c.keep_alive = 1;
    let (_raw, _) = Raw::connect4_with(broker.mqtt(), c).await;
    let p = publish4(&mut ev).await;
    assert_eq!(p.topic, "will/sleepy");

    // Protocol violation is abnormal too (second CONNECT).
    let (mut raw, _) = Raw::connect4_with(broker.mqtt(), will4("twice", "will/twice")).await;
    raw.send4(p4::Packet::Connect(p4::Connect::new("twice")))
        .await;
    raw.expect_silent_close().await;
    let p = publish4(&mut ev).await;
    assert_eq!(p.topic, "will/twice");
    quiet4(&mut ev).await;
    broker.stop().await;
}

fn will5(delay_s: u32) -> p5::LastWill {
    p5::LastWill {
        topic: Bytes::from_static(b"will5/t"),
        message: Bytes::from_static(b"{\"state\":\"gone\"}"),
        qos: Q5::AtLeastOnce,
        retain: false,
        properties: Some(p5::LastWillProperties {
            delay_interval: Some(delay_s),
            payload_format_indicator: Some(1),
            message_expiry_interval: None,
            content_type: Some("application/json".into()),
            response_topic: Some("will5/reply".into()),
            correlation_data: Some(Bytes::from_static(b"corr")),
            user_properties: vec![("k".into(), "v1".into()), ("k".into(), "v2".into())],
        }),
    }
}

#[tokio::test]
async fn v5_will_delay_and_will_properties() {
    let broker = TestBroker::start().await;
    let (s, mut ev, _) = connected5(opts5(&broker, "will5-watch")).await;
    subscribe5(
        &s,
        &mut ev,
        v5::Filter::new("will5/#", Q5::AtLeastOnce),
        None,
    )
    .await;

    // Will delay 1 s, session expiry 10 s: nothing at once, the will after ~1 s.
    let props = p5::ConnectProperties {
        session_expiry_interval: Some(10),
        ..p5::ConnectProperties::new()
    };
    let (raw, _) = Raw::connect5(
        broker.mqtt(),
        connect5_packet("will5", true, Some(props.clone())),
        Some(will5(1)),
    )
    .await;
    let dropped = Instant::now();
    drop(raw);
    quiet5(&mut ev).await;
    let p = publish5(&mut ev).await;
    let after = dropped.elapsed();
    assert!(after >= Duration::from_millis(900), "will after {after:?}");
    assert_eq!(&p.payload[..], b"{\"state\":\"gone\"}");
    let props_got = p.properties.expect("will properties");
    assert_eq!(props_got.content_type.as_deref(), Some("application/json"));
    assert_eq!(props_got.payload_format_indicator, Some(1));
    assert_eq!(props_got.response_topic.as_deref(), Some("will5/reply"));
    assert_eq!(props_got.correlation_data.as_deref(), Some(&b"corr"[..]));
    assert_eq!(
        props_got.user_properties,
        vec![
            ("k".to_owned(), "v1".to_owned()),
            ("k".to_owned(), "v2".to_owned())
        ]
    );

    // Reconnecting within the delay cancels the will.
    let (raw, _) = Raw::connect5(
        broker.mqtt(),
        connect5_packet("will5b", true, Some(props.clone())),
        Some(will5(1)),
    )
    .await;
    drop(raw);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_back, ack) = Raw::connect5(
        broker.mqtt(),
        connect5_packet("will5b", false, Some(props)),
        None,
    )
    .await;
    assert!(ack.session_present);
    let watch = tokio::time::timeout(Duration::from_millis(1500), publish5(&mut ev)).await;
    assert!(
        watch.is_err(),
        "will must not fire after a reconnect: {watch:?}"
    );

    // DISCONNECT with reason 0x04 asks for the will even on a clean close.
    let (mut raw, _) = Raw::connect5(
        broker.mqtt(),
        connect5_packet("will5c", true, None),
        Some(will5(0)),
    )
    .await;
    raw.send5(p5::Packet::Disconnect(p5::Disconnect::new(
        p5::DisconnectReasonCode::DisconnectWithWillMessage,
    )))
    .await;
    let p = publish5(&mut ev).await;
    assert_eq!(p.topic, Bytes::from_static(b"will5/t"));
    // ...and a normal DISCONNECT does not.
    let (mut raw, _) = Raw::connect5(
        broker.mqtt(),
        connect5_packet("will5d", true, None),
        Some(will5(0)),
    )
    .await;
    raw.send5(p5::Packet::Disconnect(p5::Disconnect::new(
        p5::DisconnectReasonCode::NormalDisconnection,
    )))
    .await;
    quiet5(&mut ev).await;
    broker.stop().await;
}

/// A will with RETAIN becomes the retained message of its topic; a will
/// whose delay outlasts the session is published when the session ends.
#[tokio::test]
async fn retained_will_and_will_at_session_end() {
    let broker = TestBroker::start().await;
    let mut c = p4::Connect::new("ret-will");
    c.keep_alive = 10;
    c.last_will = Some(p4::LastWill::new(
        "rw/status",
        b"offline".to_vec(),
        QoS::AtLeastOnce,
        true,
    ));
    let (raw, _) = Raw::connect4_with(broker.mqtt(), c).await;
    drop(raw);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_s, mut ev) = subscriber4(&broker, "rw-late", true, "rw/#", QoS::AtLeastOnce).await;
    let p = publish4(&mut ev).await;
    assert!(p.retain);
    assert_eq!(
        (p.topic.as_str(), &p.payload[..]),
        ("rw/status", &b"offline"[..])
    );

    // Will delay 30 s, session expiry 1 s: the will comes with the end of
    // the session, after ~1 s.
    let (s, mut sev, _) = connected5(opts5(&broker, "wse-watch")).await;
    subscribe5(
        &s,
        &mut sev,
        v5::Filter::new("will5/#", Q5::AtLeastOnce),
        None,
    )
    .await;
    let props = p5::ConnectProperties {
        session_expiry_interval: Some(1),
        ..p5::ConnectProperties::new()
    };
    let (raw, _) = Raw::connect5(
        broker.mqtt(),
        connect5_packet("wse", true, Some(props)),
        Some(will5(30)),
    )
    .await;
    let dropped = Instant::now();
    drop(raw);
    let p = tokio::time::timeout(Duration::from_secs(4), publish5(&mut sev))
        .await
        .expect("will at session end, long before the 30 s delay");
    assert_eq!(p.topic, Bytes::from_static(b"will5/t"));
    assert!(dropped.elapsed() >= Duration::from_millis(900));
    broker.stop().await;
}
