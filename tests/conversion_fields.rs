//! The conversion contract's standard fields over real sockets
//! (docs/conversion.md, "Standard fields"): AMQP message-id, subject,
//! user-id, group-id, group-sequence, content-encoding, creation-time and
//! priority as STOMP headers and MQTT 5 user properties, and back; a text
//! body without a content type announced to STOMP; an MQTT responder
//! answering a STOMP temporary queue through its `$queue/` response topic.

mod common;

use common::amqp;
use common::mqtt::driven5;
use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::types::messaging::{Header, Message as AmqpMessage, MessageId, Properties};
use fe2o3_amqp::types::primitives::{Binary, Timestamp};
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use rumqttc::v5::mqttbytes::QoS;

/// The STOMP headers (and MQTT user properties) of the fields the AMQP
/// message below sets, as docs/conversion.md names them.
const FIELDS: [(&str, &str); 8] = [
    ("amqp-message-id", "77"),
    ("type", "order.created"),
    ("user-id", "alice"),
    ("JMSXGroupID", "g-1"),
    ("JMSXGroupSeq", "5"),
    ("content-encoding", "gzip"),
    ("timestamp", "1700000000123"),
    ("priority", "9"),
];

#[tokio::test]
async fn amqp_standard_fields_reach_stomp_and_mqtt_and_a_stomp_republish_keeps_them() {
    let broker = TestBroker::start().await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.subscribe("t", "/topic/orders/#", "auto", &[]).await;
    let (m, mut mrx) = driven5(&broker, "fields-sub");
    m.subscribe("orders/#", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    mrx.suback().await;

    let (mut conn, mut session) = amqp::connect_session(&broker, "fields").await;
    let mut sender = amqp::sender(&mut session, "s", "/topic/orders/new").await;
    let mut back = amqp::receiver(&mut session, "back", "/queue/orders-back").await;
    let msg = AmqpMessage::builder()
        .header(Header::builder().durable(true).priority(9).build())
        .properties(
            Properties::builder()
                .message_id(MessageId::Ulong(77))
                .subject("order.created")
                .user_id(Binary::from(b"alice".to_vec()))
                .group_id(Some("g-1".to_owned()))
                .group_sequence(5)
                .content_encoding("gzip")
                .creation_time(Timestamp::from_milliseconds(1_700_000_000_123))
                .build(),
        )
        .value("order")
        .build();
    amqp::send_accepted(&mut sender, msg).await;

    let got = s.message().await;
    for (name, value) in FIELDS {
        assert_eq!(got.header(name), Some(value), "STOMP header {name}");
    }
    assert_ne!(got.header("message-id"), Some("77"), "STOMP's ack id");
    assert_eq!(got.header("content-type"), Some("text/plain;charset=utf-8"));

    let p = mrx.publish().await;
    let props = p.properties.expect("MQTT 5 properties");
    let want: Vec<(String, String)> = FIELDS
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    assert_eq!(props.user_properties, want);

    // The STOMP consumer republishes with the headers it got.
    let mut headers: Vec<(&str, &str)> = vec![("destination", "/queue/orders-back")];
    for (name, _) in FIELDS {
        headers.push((name, got.header(name).expect("header")));
    }
    s.request("SEND", &headers, b"again").await;
    let d = amqp::recv_any(&mut back).await;
    back.accept(&d).await.expect("accept");
    let msg = d.message();
    let p = msg.properties.clone().expect("properties");
    assert_eq!(p.message_id, Some(MessageId::String("77".into())));
    assert_eq!(p.subject.as_deref(), Some("order.created"));
    assert_eq!(p.user_id, Some(Binary::from(b"alice".to_vec())));
    assert_eq!(p.group_id.as_deref(), Some("g-1"));
    assert_eq!(p.group_sequence, Some(5));
    assert_eq!(
        p.content_encoding.map(|e| e.into_inner()).as_deref(),
        Some("gzip")
    );
    assert_eq!(
        p.creation_time.map(|t| t.milliseconds()),
        Some(1_700_000_000_123)
    );
    assert_eq!(msg.header.as_ref().map(|h| h.priority.0), Some(9));
    assert!(
        msg.application_properties.is_none(),
        "fields, not properties: {:?}",
        msg.application_properties
    );

    back.close().await.expect("close");
    sender.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn mqtt_text_without_content_type_is_announced_to_stomp() {
    let broker = TestBroker::start().await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.subscribe("t", "/topic/txt/#", "auto", &[]).await;
    let (m, mut mrx) = driven5(&broker, "txt-pub");
    let text = PublishProperties {
        payload_format_indicator: Some(1),
        ..Default::default()
    };
    m.publish_with_properties("txt/a", QoS::AtLeastOnce, false, "héllo", text)
        .await
        .expect("publish");
    m.publish("txt/b", QoS::AtLeastOnce, false, &b"\x00\x01"[..])
        .await
        .expect("publish");
    for _ in 0..2 {
        mrx.puback().await;
    }
    let got = s.messages(2).await;
    assert_eq!(got[0].body, "héllo".as_bytes());
    assert_eq!(
        got[0].header("content-type"),
        Some("text/plain;charset=utf-8")
    );
    assert_eq!(got[1].body, b"\x00\x01");
    assert_eq!(got[1].header("content-type"), None, "binary: no type");
    broker.stop().await;
}

/// A STOMP requester's temporary queue reaches an MQTT 5 responder as
/// `$queue/$temp/…`; the responder's PUBLISH there lands in that queue.
#[tokio::test]
async fn mqtt_responder_answers_a_stomp_temp_queue() {
    let broker = TestBroker::start().await;
    let (m, mut mrx) = driven5(&broker, "responder");
    m.subscribe("rpc/svc", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    mrx.suback().await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.subscribe("r", "/temp-queue/answers", "auto", &[]).await;
    s.request(
        "SEND",
        &[
            ("destination", "/topic/rpc/svc"),
            ("reply-to", "/temp-queue/answers"),
            ("correlation-id", "q-7"),
        ],
        b"question",
    )
    .await;
    let req = mrx.publish().await;
    let rp = req.properties.expect("properties");
    let topic = rp.response_topic.expect("response topic");
    assert!(topic.starts_with("$queue/$temp/"), "{topic}");
    let answer = PublishProperties {
        correlation_data: rp.correlation_data.clone(),
        ..Default::default()
    };
    m.publish_with_properties(topic.clone(), QoS::AtLeastOnce, false, "answer", answer)
        .await
        .expect("publish");
    let got = s.message().await;
    assert_eq!(got.text(), "answer");
    assert_eq!(got.header("correlation-id"), Some("q-7"));
    assert_eq!(
        got.header("destination"),
        Some(format!("/queue/{}", &topic["$queue/".len()..]).as_str())
    );
    broker.stop().await;
}
