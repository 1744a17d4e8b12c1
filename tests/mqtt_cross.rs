//! MQTT <-> AMQP 1.0 over real sockets (MQTT <-> STOMP is in
//! `cross_protocol.rs`): an MQTT publish reaches an AMQP receiver of
//! `/topic/<t>` and an AMQP send to `/topic/<t>` reaches MQTT subscribers,
//! with properties mapped as `docs/conversion.md` documents.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use bytes::Bytes;
use common::amqp;
use common::mqtt::*;
use common::TestBroker;
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Header, Message as AmqpMessage, MessageId, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, SimpleValue, Value};
use rumqttc::v5::mqttbytes::QoS as Q5;
use rumqttc::QoS;

#[tokio::test]
async fn mqtt5_publish_reaches_an_amqp_receiver() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "mqtt-cross").await;
    let mut receiver = amqp::receiver(&mut session, "r", "/topic/x/+/temp").await;
    // The AMQP attach may complete before its binding: give it a beat.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    let (p, mut pev, _) = connected5(opts5(&broker, "to-amqp")).await;
    let props = v5::PublishProperties {
        payload_format_indicator: Some(1),
        content_type: Some("text/plain".into()),
        response_topic: Some("x/replies".into()),
        correlation_data: Some(Bytes::from_static(&[0, 1, 0xfe])),
        message_expiry_interval: Some(60),
        user_properties: vec![
            ("k".into(), "first".into()),
            ("z".into(), "1".into()),
            ("k".into(), "second".into()),
        ],
        ..Default::default()
    };
    publish_and_ack5(
        &p,
        &mut pev,
        "x/k1/temp",
        Q5::AtLeastOnce,
        false,
        b"21.5",
        Some(props),
    )
    .await;
    let d = amqp::recv_any(&mut receiver).await;
    let m = d.message();
    match &m.body {
        Body::Value(v) => assert_eq!(v.0, Value::String("21.5".into())),
        other => panic!("UTF-8 payload expected as amqp-value string, got {other:?}"),
    }
    let ap = &m.application_properties.as_ref().expect("app props").0;
    assert_eq!(ap.get("k"), Some(&SimpleValue::String("first".into())));
    assert_eq!(ap.get("z"), Some(&SimpleValue::String("1".into())));
    let pr = m.properties.as_ref().expect("properties");
    assert_eq!(
        pr.content_type.as_ref().map(|s| s.as_str()),
        Some("text/plain")
    );
    assert_eq!(pr.reply_to.as_deref(), Some("/topic/x/replies"));
    assert_eq!(pr.to.as_deref(), Some("/topic/x/k1/temp"));
    assert_eq!(
        pr.correlation_id,
        Some(MessageId::Binary(Binary::from(vec![0u8, 1, 0xfe])))
    );
    let h = m.header.as_ref().expect("header");
    assert!(h.durable, "QoS 1 is durable");
    let ttl = h.ttl.expect("ttl from message expiry");
    assert!((55_000..=60_000).contains(&ttl), "ttl {ttl}");
    receiver.accept(&d).await.expect("accept");

    // QoS 0 binary: a data section, not durable.
    publish_and_ack5(
        &p,
        &mut pev,
        "x/k2/temp",
        Q5::AtMostOnce,
        false,
        &[0xff, 0],
        None,
    )
    .await;
    let d = amqp::recv_any(&mut receiver).await;
    match &d.message().body {
        Body::Data(batch) => {
            let bytes: Vec<u8> = batch.iter().flat_map(|b| b.0.to_vec()).collect();
            assert_eq!(bytes, [0xff, 0]);
        }
        other => panic!("binary payload expected as data, got {other:?}"),
    }
    assert!(!d.message().header.as_ref().is_some_and(|h| h.durable));
    receiver.accept(&d).await.expect("accept");
    receiver.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn amqp_send_reaches_mqtt_subscribers() {
    let broker = TestBroker::start().await;
    let (s5, mut ev5, _) = connected5(opts5(&broker, "from-amqp5")).await;
    subscribe5(&s5, &mut ev5, v5::Filter::new("y/#", Q5::AtLeastOnce), None).await;
    let (_s4, mut ev4) = subscriber4(&broker, "from-amqp4", true, "y/+", QoS::AtLeastOnce).await;

    let (mut conn, mut session) = amqp::connect_session(&broker, "amqp-cross").await;
    let mut sender = amqp::sender(&mut session, "s", "/topic/y/z").await;
    let msg = AmqpMessage::builder()
        .header(Header::builder().durable(true).ttl(Some(30_000)).build())
        .properties(
            Properties::builder()
                .content_type("text/plain")
                .correlation_id(String::from("corr-1"))
                .reply_to("/topic/y/back")
                .build(),
        )
        .application_properties(
            ApplicationProperties::builder()
                .insert("s", "v")
                .insert("n", 7i32)
                .insert("b", true)
                .build(),
        )
        .value("from amqp")
        .build();
    amqp::send_accepted(&mut sender, msg).await;

    let p = publish5(&mut ev5).await;
    assert_eq!(p.topic, Bytes::from_static(b"y/z"));
    assert_eq!(&p.payload[..], b"from amqp");
    assert_eq!(
        p.qos,
        Q5::AtLeastOnce,
        "durable -> QoS 1 at a QoS 1 subscription"
    );
    let pp = p.properties.expect("properties");
    assert_eq!(pp.payload_format_indicator, Some(1));
    assert_eq!(pp.content_type.as_deref(), Some("text/plain"));
    assert_eq!(pp.response_topic.as_deref(), Some("y/back"));
    assert_eq!(pp.correlation_data.as_deref(), Some(&b"corr-1"[..]));
    let left = pp.message_expiry_interval.expect("expiry from ttl");
    assert!((28..=30).contains(&left), "{left}");
    let mut user = pp.user_properties.clone();
    user.sort();
    assert_eq!(
        user,
        [
            ("b".to_owned(), "true".to_owned()),
            ("n".to_owned(), "7".to_owned()),
            ("s".to_owned(), "v".to_owned())
        ]
    );
    let p = publish4(&mut ev4).await;
    assert_eq!(
        (p.topic.as_str(), &p.payload[..]),
        ("y/z", &b"from amqp"[..])
    );
    sender.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}

/// An MQTT client consumes a queue through `$queue/<name>`: what an AMQP
/// sender put on `/queue/<name>` arrives with the topic `$queue/<name>` at
/// the granted QoS, is acknowledged, and leaves the queue; after
/// UNSUBSCRIBE nothing more is consumed.
#[tokio::test]
async fn mqtt_consumes_a_queue_through_the_queue_prefix() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "mqtt-queue").await;
    let mut sender = amqp::sender(&mut session, "s", "/queue/jobs").await;
    for i in 0..3 {
        amqp::send_accepted(&mut sender, format!("job {i}")).await;
    }
    let (c, mut ev, _) = connected5(opts5(&broker, "queue-worker")).await;
    let ack = subscribe5(
        &c,
        &mut ev,
        v5::Filter::new("$queue/jobs", Q5::AtLeastOnce),
        None,
    )
    .await;
    assert_eq!(
        ack.return_codes,
        vec![v5::SubscribeReasonCode::Success(Q5::AtLeastOnce)]
    );
    for i in 0..3 {
        let p = publish5(&mut ev).await;
        assert_eq!(&p.topic[..], b"$queue/jobs");
        assert_eq!(p.qos, Q5::AtLeastOnce);
        assert_eq!(&p.payload[..], format!("job {i}").as_bytes());
    }
    // rumqttc acknowledges as it polls; wait for the queue to drain.
    let drained = tokio::time::timeout(WAIT, async {
        loop {
            let _ = tokio::time::timeout(std::time::Duration::from_millis(50), ev.poll()).await;
            let stats = broker.core().queue_stats("jobs").expect("queue");
            if stats.depth == 0 && stats.in_flight == 0 {
                break;
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "acknowledged messages left the queue");

    unsubscribe5(&c, &mut ev, "$queue/jobs").await;
    amqp::send_accepted(&mut sender, "after unsubscribe").await;
    quiet5(&mut ev).await;
    assert_eq!(broker.core().queue_stats("jobs").expect("queue").depth, 1);
    sender.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}
