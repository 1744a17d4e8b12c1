//! The conversion contract's standard fields over real sockets
//! (docs/conversion.md, "Standard fields"): AMQP message-id, subject,
//! user-id, group-id, group-sequence, content-encoding, creation-time and
//! priority as STOMP headers and MQTT 5 user properties, and back; a text
//! body without a content type announced to STOMP; an MQTT responder
//! answering a STOMP temporary queue through its `$queue/` response topic.

mod common;

use std::time::Duration;

use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::types::messaging::{Body, Header, Message as AmqpMessage, MessageId, Properties};
use fe2o3_amqp::types::primitives::{Binary, Timestamp, Value};
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

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

/// An MQTT 5 client whose event loop runs in the background; incoming
/// packets come out of the channel.
async fn mqtt5(
    broker: &TestBroker,
    id: &str,
) -> (AsyncClient, tokio::sync::mpsc::UnboundedReceiver<Packet>) {
    let addr = broker.mqtt();
    let mut opts = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut ev) = AsyncClient::new(opts, 64);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            match ev.poll().await {
                Ok(Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    (client, rx)
}

/// The next packet matching `want`, within 10 s.
async fn next<T>(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Packet>,
    mut want: impl FnMut(Packet) -> Option<T>,
) -> T {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let p = rx.recv().await.expect("mqtt connection open");
            if let Some(t) = want(p) {
                return t;
            }
        }
    })
    .await
    .expect("mqtt packet within 10 s")
}

async fn suback(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Packet>) {
    next(rx, |p| matches!(p, Packet::SubAck(_)).then_some(())).await;
}

async fn publish(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Packet>,
) -> rumqttc::v5::mqttbytes::v5::Publish {
    next(rx, |p| match p {
        Packet::Publish(p) => Some(p),
        _ => None,
    })
    .await
}

#[tokio::test]
async fn amqp_standard_fields_reach_stomp_and_mqtt_and_a_stomp_republish_keeps_them() {
    let broker = TestBroker::start().await;
    let mut s = StompClient::connect(broker.stomp(), &[]).await;
    s.subscribe("t", "/topic/orders/#", "auto", &[]).await;
    let (m, mut mrx) = mqtt5(&broker, "fields-sub").await;
    m.subscribe("orders/#", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    suback(&mut mrx).await;

    let url = format!("amqp://{}", broker.amqp());
    let mut conn = Connection::open("fields", url.as_str())
        .await
        .expect("amqp open");
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let mut sender = Sender::attach(&mut session, "s", "/topic/orders/new")
        .await
        .expect("attach sender");
    let mut back = Receiver::attach(&mut session, "back", "/queue/orders-back")
        .await
        .expect("attach receiver");
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
    sender
        .send(msg)
        .await
        .expect("send")
        .accepted_or_else(|o| o)
        .expect("accepted");

    let got = s.message().await;
    for (name, value) in FIELDS {
        assert_eq!(got.header(name), Some(value), "STOMP header {name}");
    }
    assert_ne!(got.header("message-id"), Some("77"), "STOMP's ack id");
    assert_eq!(got.header("content-type"), Some("text/plain;charset=utf-8"));

    let p = publish(&mut mrx).await;
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
    let d: fe2o3_amqp::link::delivery::Delivery<Body<Value>> =
        back.recv().await.expect("republished");
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
    let (m, mut mrx) = mqtt5(&broker, "txt-pub").await;
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
        next(&mut mrx, |p| matches!(p, Packet::PubAck(_)).then_some(())).await;
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
    let (m, mut mrx) = mqtt5(&broker, "responder").await;
    m.subscribe("rpc/svc", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    suback(&mut mrx).await;
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
    let req = publish(&mut mrx).await;
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
