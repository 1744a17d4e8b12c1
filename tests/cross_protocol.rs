//! STOMP ↔ MQTT and STOMP ↔ AMQP over real sockets: what one protocol
//! sends, the others receive on the same address, with headers mapped to
//! properties as documented (STOMP custom headers ↔ MQTT 5 user
//! properties ↔ AMQP application-properties; `content-type`,
//! `correlation-id`, `reply-to` to their counterparts; a UTF-8 body
//! without `content-length` is text).

mod common;

use std::time::Duration;

use common::amqp;
use common::mqtt::{
    client5_with, connected4, driven5, driven5_with, opts5, publish4, publish5, suback5, subscribe4,
};
use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Data, Message as AmqpMessage, Properties,
};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use rumqttc::v5::mqttbytes::QoS;

#[tokio::test]
async fn stomp_send_reaches_an_mqtt5_subscriber() {
    let broker = TestBroker::start().await;
    let (sub, mut ev) = client5_with(opts5(&broker, "mqtt-sub"));
    sub.subscribe("sensors/+/temp", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    suback5(&mut ev).await;

    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    // No content-length: the UTF-8 body is text.
    s.send_raw(
        b"SEND\ndestination:/topic/sensors/k1/temp\npersistent:true\nx-unit:celsius\n\
          content-type:text/plain\ncorrelation-id:corr-1\nreply-to:/topic/replies/k1\nreceipt:r\n\n21.5\0",
    )
    .await;
    s.expect_receipt("r").await;
    let p = publish5(&mut ev).await;
    assert_eq!(&p.topic[..], b"sensors/k1/temp");
    assert_eq!(&p.payload[..], b"21.5");
    assert_eq!(p.qos, QoS::AtLeastOnce);
    let props = p.properties.expect("MQTT 5 properties");
    assert_eq!(props.payload_format_indicator, Some(1), "text body");
    assert_eq!(props.content_type.as_deref(), Some("text/plain"));
    assert_eq!(props.correlation_data.as_deref(), Some(&b"corr-1"[..]));
    assert_eq!(props.response_topic.as_deref(), Some("replies/k1"));
    assert!(
        props
            .user_properties
            .contains(&("x-unit".to_owned(), "celsius".to_owned())),
        "{:?}",
        props.user_properties
    );

    // With content-length and no text content type: binary.
    s.send_persistent("/topic/sensors/k2/temp", &[], &[0xff, 0x00, 0x01])
        .await;
    let p = publish5(&mut ev).await;
    assert_eq!(&p.payload[..], &[0xff, 0x00, 0x01]);
    assert_ne!(
        p.properties.and_then(|p| p.payload_format_indicator),
        Some(1),
        "binary body must not be marked UTF-8"
    );

    // With content-length but a text/* content type: text.
    s.send_persistent(
        "/topic/sensors/k3/temp",
        &[("content-type", "text/csv")],
        b"1,2,3",
    )
    .await;
    let p = publish5(&mut ev).await;
    assert_eq!(&p.payload[..], b"1,2,3");
    let props = p.properties.expect("MQTT 5 properties");
    assert_eq!(props.payload_format_indicator, Some(1), "text/* is text");
    assert_eq!(props.content_type.as_deref(), Some("text/csv"));
    broker.stop().await;
}

#[tokio::test]
async fn mqtt5_publish_reaches_a_stomp_subscriber() {
    let broker = TestBroker::start().await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.subscribe("s", "/topic/sensors/#", "client-individual", &[])
        .await;
    let (publ, mut incoming) = driven5(&broker, "mqtt-pub");
    let props = PublishProperties {
        content_type: Some("application/json".into()),
        correlation_data: Some(bytes::Bytes::from_static(b"c-9")),
        response_topic: Some("answers/here".into()),
        user_properties: vec![
            ("x-site".into(), "north".into()),
            ("x-line".into(), "a:b\nc".into()),
        ],
        payload_format_indicator: Some(1),
        ..Default::default()
    };
    publ.publish_with_properties(
        "sensors/k9/temp",
        QoS::AtLeastOnce,
        false,
        "{\"t\":3}",
        props,
    )
    .await
    .expect("publish");
    incoming.puback().await;
    let m = s.message().await;
    assert_eq!(m.header("destination"), Some("/topic/sensors/k9/temp"));
    assert_eq!(m.body, b"{\"t\":3}");
    assert_eq!(m.header("content-type"), Some("application/json"));
    assert_eq!(m.header("correlation-id"), Some("c-9"));
    assert_eq!(m.header("reply-to"), Some("/topic/answers/here"));
    assert_eq!(m.header("persistent"), Some("true"), "QoS 1 is durable");
    assert_eq!(m.header("x-site"), Some("north"));
    // Escaped per 1.2 on the way out.
    assert_eq!(m.header("x-line"), Some(r"a\cb\nc"));
    s.ack(&m).await;
    broker.stop().await;
}

fn app_prop<'a>(m: &'a AmqpMessage<Body<Value>>, key: &str) -> Option<&'a SimpleValue> {
    m.application_properties.as_ref()?.0.get(key)
}

#[tokio::test]
async fn stomp_send_reaches_an_amqp_receiver() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "cross").await;
    let mut receiver = amqp::receiver(&mut session, "r", "/queue/orders").await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.send_raw(
        b"SEND\ndestination:/queue/orders\npersistent:true\nx-order:42\ncorrelation-id:c-1\n\
          reply-to:/queue/replies\ncontent-type:text/plain\nreceipt:r\n\nhello amqp\0",
    )
    .await;
    s.expect_receipt("r").await;
    s.send_persistent(
        "/queue/orders",
        &[("content-type", "application/octet-stream")],
        b"\x00\x01bin",
    )
    .await;

    let d = amqp::recv_any(&mut receiver).await;
    let m = d.message();
    match &m.body {
        Body::Value(v) => assert_eq!(v.0, Value::String("hello amqp".into())),
        other => panic!("text body expected as amqp-value string, got {other:?}"),
    }
    assert_eq!(
        app_prop(m, "x-order"),
        Some(&SimpleValue::String("42".into()))
    );
    let props = m.properties.as_ref().expect("properties");
    assert_eq!(
        props.content_type.as_ref().map(|s| s.as_str()),
        Some("text/plain")
    );
    assert_eq!(
        props.correlation_id,
        Some(fe2o3_amqp::types::messaging::MessageId::String(
            "c-1".into()
        ))
    );
    assert_eq!(props.reply_to.as_deref(), Some("/queue/replies"));
    assert!(
        m.header.as_ref().is_some_and(|h| h.durable),
        "persistent → durable"
    );
    receiver.accept(&d).await.expect("accept");

    let d = amqp::recv_any(&mut receiver).await;
    match &d.message().body {
        Body::Data(batch) => {
            let bytes: Vec<u8> = batch.iter().flat_map(|Data(b)| b.to_vec()).collect();
            assert_eq!(bytes, b"\x00\x01bin");
        }
        other => panic!("binary body expected as data, got {other:?}"),
    }
    receiver.accept(&d).await.expect("accept");
    receiver.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    assert_eq!(broker.queue("orders"), Some((0, 0)));
    broker.stop().await;
}

#[tokio::test]
async fn amqp_send_reaches_a_stomp_subscriber() {
    let broker = TestBroker::start().await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.subscribe("q", "/queue/from-amqp", "client-individual", &[])
        .await;
    s.subscribe("t", "/topic/alerts/#", "auto", &[]).await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "cross").await;
    let mut sender = amqp::sender(&mut session, "s", "/queue/from-amqp").await;
    let msg = AmqpMessage::builder()
        .properties(
            Properties::builder()
                .content_type("text/plain")
                .correlation_id(String::from("corr-amqp"))
                .reply_to("/queue/back")
                .build(),
        )
        .application_properties(
            ApplicationProperties::builder()
                .insert("x-str", "v")
                .insert("x-int", 7i32)
                .insert("x-bool", true)
                .build(),
        )
        .value("from amqp")
        .build();
    amqp::send_accepted(&mut sender, msg).await;
    let m = s.message().await;
    assert_eq!(m.header("subscription"), Some("q"));
    assert_eq!(m.text(), "from amqp");
    assert_eq!(m.header("content-type"), Some("text/plain"));
    assert_eq!(m.header("correlation-id"), Some("corr-amqp"));
    assert_eq!(m.header("reply-to"), Some("/queue/back"));
    assert_eq!(m.header("x-str"), Some("v"));
    assert_eq!(m.header("x-int"), Some("7"));
    assert_eq!(m.header("x-bool"), Some("true"));
    s.ack(&m).await;

    // Binary data to a topic the STOMP client watches with a wildcard.
    let mut tsender = amqp::sender(&mut session, "s2", "/topic/alerts/fire").await;
    let bin = AmqpMessage::builder()
        .data(fe2o3_amqp::types::primitives::Binary::from(vec![
            0u8, 1, 2, 0,
        ]))
        .build();
    amqp::send_accepted(&mut tsender, bin).await;
    let m = s.message().await;
    assert_eq!(m.header("subscription"), Some("t"));
    assert_eq!(m.header("destination"), Some("/topic/alerts/fire"));
    assert_eq!(m.body, [0u8, 1, 2, 0]);
    assert_eq!(m.header("content-length"), Some("4"));
    tsender.close().await.expect("close");
    sender.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}

/// One STOMP SEND to a topic reaches STOMP, MQTT and AMQP subscribers
/// of that topic at once.
#[tokio::test]
async fn one_topic_three_protocols() {
    let broker = TestBroker::start().await;
    let (sub, mut mqtt_in) = driven5(&broker, "fan-mqtt");
    sub.subscribe("fan/out", QoS::AtMostOnce)
        .await
        .expect("subscribe");
    mqtt_in.suback().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "cross").await;
    let mut receiver = amqp::receiver(&mut session, "r", "/topic/fan/out").await;
    let mut stomp_sub = StompClient::connect(broker.stomp(), &[]).await;
    stomp_sub
        .subscribe("s", "/topic/fan/out", "auto", &[])
        .await;
    // AMQP attach to a topic may complete before its binding: give it a beat.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.request(
        "SEND",
        &[("destination", "/topic/fan/out"), ("x-k", "v")],
        b"everyone",
    )
    .await;
    assert_eq!(stomp_sub.message().await.text(), "everyone");
    let p = mqtt_in.publish().await;
    assert_eq!(&p.payload[..], b"everyone");
    let d = amqp::recv_any(&mut receiver).await;
    assert_eq!(
        app_prop(d.message(), "x-k"),
        Some(&SimpleValue::String("v".into()))
    );
    receiver.accept(&d).await.expect("accept");
    receiver.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}

/// Request/reply across protocols: a STOMP requester's `/temp-queue/…`
/// reply-to becomes an address an AMQP responder can send to.
#[tokio::test]
async fn stomp_temp_queue_reply_from_amqp() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "cross").await;
    let mut requests = amqp::receiver(&mut session, "req", "/queue/rpc").await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.subscribe("replies", "/temp-queue/answers", "auto", &[])
        .await;
    s.request(
        "SEND",
        &[
            ("destination", "/queue/rpc"),
            ("reply-to", "/temp-queue/answers"),
            ("correlation-id", "q-1"),
        ],
        b"question",
    )
    .await;
    let d = amqp::recv_any(&mut requests).await;
    let props = d.message().properties.clone().expect("properties");
    let reply_to = props.reply_to.clone().expect("reply-to");
    assert!(reply_to.starts_with("/queue/"), "{reply_to}");
    requests.accept(&d).await.expect("accept");
    let mut replier = amqp::sender(&mut session, "rep", reply_to.as_str()).await;
    let reply = AmqpMessage::builder()
        .properties(
            Properties::builder()
                .correlation_id(String::from("q-1"))
                .build(),
        )
        .value("answer")
        .build();
    amqp::send_accepted(&mut replier, reply).await;
    let m = s.message().await;
    assert_eq!(m.header("subscription"), Some("replies"));
    assert_eq!(m.text(), "answer");
    assert_eq!(m.header("correlation-id"), Some("q-1"));
    replier.close().await.expect("close");
    requests.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}

/// An MQTT 3.1.1 client (no properties) gets the STOMP body as is.
#[tokio::test]
async fn stomp_send_reaches_an_mqtt311_subscriber() {
    let broker = TestBroker::start().await;
    let (sub, mut ev, _) = connected4(&broker, "v311", true).await;
    subscribe4(&sub, &mut ev, "plain/#", rumqttc::QoS::AtLeastOnce).await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.send_persistent("/topic/plain/x", &[("x-ignored", "1")], b"\x00raw\xff")
        .await;
    let p = publish4(&mut ev).await;
    assert_eq!(p.topic, "plain/x");
    assert_eq!(&p.payload[..], b"\x00raw\xff");
    assert_eq!(p.qos, rumqttc::QoS::AtLeastOnce);
    broker.stop().await;
}

/// A large STOMP body (900 KiB, under every default limit) reaches an
/// AMQP receiver (split over 64 KiB transfer frames) and an MQTT
/// subscriber intact.
#[tokio::test]
async fn large_stomp_body_reaches_amqp_and_mqtt() {
    let broker = TestBroker::start().await;
    let mut opts = opts5(&broker, "big-mqtt");
    // rumqttc refuses incoming packets over 10 KiB unless told otherwise.
    opts.set_max_packet_size(Some(2 * 1024 * 1024));
    let (sub, mut mqtt_in) = driven5_with(opts);
    sub.subscribe("big/one", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    mqtt_in.suback().await;
    let mut stomp = StompClient::connect(broker.stomp(), &[]).await;
    // The same body to a queue, for the AMQP receiver.
    let body: Vec<u8> = (0..900 * 1024).map(|i| (i % 251) as u8).collect();
    stomp.send_persistent("/topic/big/one", &[], &body).await;
    stomp.send_persistent("/queue/big", &[], &body).await;
    let p = mqtt_in.publish().await;
    assert_eq!(p.payload.len(), body.len());
    assert!(p.payload[..] == body[..], "MQTT payload differs");
    let (mut conn, mut session) = amqp::connect_session(&broker, "cross").await;
    let mut receiver = amqp::receiver(&mut session, "big", "/queue/big").await;
    let d: fe2o3_amqp::link::delivery::Delivery<Body<Value>> =
        tokio::time::timeout(Duration::from_secs(10), receiver.recv())
            .await
            .expect("in time")
            .expect("recv");
    match &d.message().body {
        Body::Data(batch) => {
            let bytes: Vec<u8> = batch.iter().flat_map(|Data(b)| b.to_vec()).collect();
            assert!(bytes == body, "AMQP body differs ({} bytes)", bytes.len());
        }
        other => panic!(
            "data body expected, got {:?}",
            std::mem::discriminant(other)
        ),
    }
    receiver.accept(&d).await.expect("accept");
    receiver.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}

/// A STOMP message larger than an MQTT 5 subscriber's Maximum Packet Size
/// is not sent to it (MQTT 5 §3.1.2.11.4); the connection stays up and
/// later messages arrive.
#[tokio::test]
async fn oversized_for_the_mqtt_client_is_skipped() {
    let broker = TestBroker::start().await;
    let mut opts = opts5(&broker, "small-mqtt");
    opts.set_max_packet_size(Some(4096));
    let (sub, mut mqtt_in) = driven5_with(opts);
    sub.subscribe("small/one", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    mqtt_in.suback().await;
    let mut stomp = StompClient::connect(broker.stomp(), &[]).await;
    stomp
        .send_persistent("/topic/small/one", &[], &vec![b'x'; 64 * 1024])
        .await;
    stomp
        .send_persistent("/topic/small/one", &[], b"fits")
        .await;
    let p = mqtt_in.publish().await;
    assert_eq!(&p.payload[..], b"fits");
    broker.stop().await;
}

/// A structured AMQP body (an `amqp-value` long) reaches STOMP and MQTT 5
/// consumers as the section's raw AMQP encoding, marked with the
/// `x-amqp-body` property and a content type, never silently as bytes.
#[tokio::test]
async fn structured_amqp_bodies_arrive_raw_and_marked() {
    let broker = TestBroker::start().await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.subscribe("t", "/topic/structured", "auto", &[]).await;
    let (client, mut packets) = driven5(&broker, "structured-sub");
    client
        .subscribe("structured", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    packets.suback().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "cross").await;
    let mut sender = amqp::sender(&mut session, "structured", "/topic/structured").await;
    let msg = AmqpMessage::builder().value(42i64).build();
    amqp::send_accepted(&mut sender, msg).await;
    // amqp-value descriptor (0x00 0x53 0x77), then a long: smalllong 0x55 42.
    let encoded: &[u8] = &[0x00, 0x53, 0x77, 0x55, 42];
    let m = s.message().await;
    assert_eq!(m.body, encoded);
    assert_eq!(m.header("x-amqp-body"), Some("amqp-value"));
    assert_eq!(
        m.header("content-type"),
        Some("application/vnd.amqp-section")
    );
    let publish = packets.publish().await;
    assert_eq!(&publish.payload[..], encoded);
    let props: PublishProperties = publish.properties.expect("properties");
    assert!(props
        .user_properties
        .contains(&("x-amqp-body".to_owned(), "amqp-value".to_owned())));
    assert_eq!(
        props.content_type.as_deref(),
        Some("application/vnd.amqp-section")
    );
    assert_eq!(props.payload_format_indicator, None);
    sender.close().await.expect("close sender");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}
