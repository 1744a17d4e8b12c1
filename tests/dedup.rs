//! Duplicate detection (issue 16) with real clients over real sockets: a
//! queue with `dedup_window_s` drops a retried send and acknowledges it as
//! a success, for STOMP (`dedup-id` header, RECEIPT), MQTT 5 (`dedup-id`
//! user property, PUBACK/PUBREC success) and AMQP 1.0 (`message-id`,
//! `accepted`); the window holds across a graceful restart and across a
//! SIGKILL of the broker binary; `/metrics` counts the duplicates. A
//! `[[topics]]` window drops a retry before it fans out, across a SIGKILL
//! too.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::amqp::{self, recv_nothing, recv_text, send_accepted};
use common::mqtt::{connected5, opts5, publish5, quiet5, subscribe5, v5, wait5};
use common::process::{frame, BrokerProcess, Stomp};
use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::types::messaging::{Header, Message, MessageId, Properties};
use fe2o3_amqp::types::primitives::Uuid;
use rosetta::config::{Config, QueueEntry, TopicEntry};

const DEDUP_QUEUES: &str = "[[queues]]\nname = \"orders\"\ndedup_window_s = 300\n\n[[queues]]\nname = \"bodies\"\ndedup_window_s = 300\ndedup = \"content\"\n";

fn queues(text: &str) -> Vec<QueueEntry> {
    Config::parse(text, "test.toml")
        .unwrap_or_else(|e| panic!("{e}"))
        .queues
}

async fn dedup_broker() -> TestBroker {
    TestBroker::start_with(
        |c| c.queues = queues(DEDUP_QUEUES),
        Arc::new(rosetta::core::AllowAll),
    )
    .await
}

fn duplicates(broker: &TestBroker, queue: &str) -> u64 {
    broker
        .core()
        .queue_stats(queue)
        .map_or(0, |s| s.duplicates_total)
}

#[tokio::test]
async fn stomp_a_resent_dedup_id_gets_its_receipt_and_is_delivered_once() {
    let broker = dedup_broker().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    // `request` asserts the RECEIPT: the retry is a success, not an ERROR.
    p.send_persistent("/queue/orders", &[("dedup-id", "order-1")], b"first")
        .await;
    p.send_persistent("/queue/orders", &[("dedup-id", "order-1")], b"retry")
        .await;
    p.send_persistent("/queue/orders", &[("dedup-id", "order-2")], b"second")
        .await;
    // In content mode the body decides, whatever the headers say.
    p.send_persistent("/queue/bodies", &[("dedup-id", "a")], b"same")
        .await;
    p.send_persistent("/queue/bodies", &[("dedup-id", "b")], b"same")
        .await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("o", "/queue/orders", "auto", &[]).await;
    let got: Vec<String> = c.messages(2).await.iter().map(|m| m.text()).collect();
    assert_eq!(got, vec!["first", "second"]);
    c.subscribe("b", "/queue/bodies", "auto", &[]).await;
    assert_eq!(c.message().await.text(), "same");
    c.expect_nothing().await;
    assert_eq!(duplicates(&broker, "orders"), 1);
    assert_eq!(duplicates(&broker, "bodies"), 1);
    let metrics = broker.metrics();
    assert!(
        metrics.contains("rosetta_queue_duplicates_total{queue=\"orders\"} 1\n"),
        "{metrics}"
    );
}

/// Publishes with a `dedup-id` user property and returns the PUBACK (QoS 1)
/// or PUBREC (QoS 2) reason as a byte.
async fn publish_mqtt(
    c: &v5::AsyncClient,
    ev: &mut v5::EventLoop,
    topic: &str,
    qos: v5::QoS,
    id: &str,
    body: &str,
) -> String {
    let props = v5::PublishProperties {
        user_properties: vec![("dedup-id".to_owned(), id.to_owned())],
        ..Default::default()
    };
    c.publish_with_properties(topic, qos, false, body.to_owned(), props)
        .await
        .expect("publish");
    wait5(ev, |p| match p {
        v5::Packet::PubAck(a) => Some(format!("{:?}", a.reason)),
        v5::Packet::PubRec(r) => Some(format!("{:?}", r.reason)),
        _ => None,
    })
    .await
}

#[tokio::test]
async fn mqtt5_a_resent_dedup_id_user_property_is_acknowledged_with_success() {
    let broker = dedup_broker().await;
    let (p, mut pev, _) = connected5(opts5(&broker, "dedup-pub")).await;
    let q1 = v5::QoS::AtLeastOnce;
    let q2 = v5::QoS::ExactlyOnce;
    assert_eq!(
        publish_mqtt(&p, &mut pev, "$queue/orders", q1, "m-1", "first").await,
        "Success"
    );
    // Success, not 0x10 "no matching subscribers": the queue holds it.
    assert_eq!(
        publish_mqtt(&p, &mut pev, "$queue/orders", q1, "m-1", "retry").await,
        "Success"
    );
    assert_eq!(
        publish_mqtt(&p, &mut pev, "$queue/orders", q2, "m-1", "qos2").await,
        "Success"
    );
    assert_eq!(
        publish_mqtt(&p, &mut pev, "$queue/orders", q1, "m-2", "second").await,
        "Success"
    );
    let (s, mut sev, _) = connected5(opts5(&broker, "dedup-sub")).await;
    subscribe5(&s, &mut sev, v5::Filter::new("$queue/orders", q1), None).await;
    assert_eq!(&publish5(&mut sev).await.payload[..], b"first");
    assert_eq!(&publish5(&mut sev).await.payload[..], b"second");
    quiet5(&mut sev).await;
    assert_eq!(duplicates(&broker, "orders"), 2);
}

fn with_id(text: &str, id: MessageId) -> Message<fe2o3_amqp::types::messaging::AmqpValue<String>> {
    Message::builder()
        .header(Header {
            durable: true,
            ..Default::default()
        })
        .properties(Properties::builder().message_id(id).build())
        .value(text.to_owned())
        .build()
}

#[tokio::test]
async fn amqp_a_resent_message_id_is_accepted_and_delivered_once() {
    let mut broker = dedup_broker().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "dedup-amqp").await;
    let mut s = amqp::sender(&mut session, "p", "/queue/orders").await;
    // Every type a message-id can have; `send_accepted` asserts `accepted`.
    let ids = [
        MessageId::from("jms-1".to_owned()),
        MessageId::from(7u64),
        MessageId::from(Uuid::from([3u8; 16])),
    ];
    for (i, id) in ids.iter().enumerate() {
        send_accepted(&mut s, with_id(&format!("first {i}"), id.clone())).await;
        send_accepted(&mut s, with_id(&format!("retry {i}"), id.clone())).await;
    }
    let mut r = amqp::receiver(&mut session, "c", "/queue/orders").await;
    for i in 0..ids.len() {
        assert_eq!(recv_text(&mut r).await, format!("first {i}"));
    }
    recv_nothing(&mut r).await;
    assert_eq!(duplicates(&broker, "orders"), 3);
    conn.close().await.expect("close");

    // The window survives a restart, though the first copies were consumed.
    broker.restart().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "dedup-amqp").await;
    let mut s = amqp::sender(&mut session, "p", "/queue/orders").await;
    send_accepted(&mut s, with_id("after restart", ids[1].clone())).await;
    send_accepted(&mut s, with_id("new", MessageId::from(8u64))).await;
    let mut r = amqp::receiver(&mut session, "c", "/queue/orders").await;
    assert_eq!(recv_text(&mut r).await, "new");
    recv_nothing(&mut r).await;
    conn.close().await.expect("close");
}

const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn send_receipted(s: &mut Stomp, id: &str, body: &str) {
    send_receipted_to(s, "/queue/orders", id, body);
}

/// Sends `body` persistently to `destination` with `dedup-id: id` and
/// asserts its RECEIPT: a retry is a success, never an ERROR.
fn send_receipted_to(s: &mut Stomp, destination: &str, id: &str, body: &str) {
    s.write(&frame(
        "SEND",
        &[
            ("destination", destination),
            ("persistent", "true"),
            ("dedup-id", id),
            ("receipt", body),
        ],
        body.as_bytes(),
    ))
    .expect("send");
    let f = s.read().expect("read").expect("a frame");
    assert_eq!(
        (f.command.as_str(), f.header("receipt-id")),
        ("RECEIPT", Some(body)),
        "{f:?}"
    );
}

/// The "a dedup window that holds across `kill -9`": the broker
/// binary is killed with SIGKILL between two sends of the same ids; the
/// second sends are receipted and not delivered, both for a message still
/// queued and for one consumed and acknowledged before the kill.
#[test]
fn the_window_holds_across_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = format!("[store]\nsync = \"every-commit\"\n\n{DEDUP_QUEUES}");
    let mut broker = BrokerProcess::start(dir.path(), &["stomp"], &extra);
    let addr = broker.addr("stomp");
    let mut p = Stomp::connect(addr, IO_TIMEOUT).expect("connect");
    send_receipted(&mut p, "consumed", "c-first");
    let mut c = Stomp::connect(addr, IO_TIMEOUT).expect("connect");
    c.write(&frame(
        "SUBSCRIBE",
        &[
            ("id", "s"),
            ("destination", "/queue/orders"),
            ("ack", "client-individual"),
        ],
        b"",
    ))
    .expect("subscribe");
    let m = c.read().expect("read").expect("MESSAGE");
    assert_eq!(m.body, b"c-first");
    let ack = m.header("ack").expect("ack id").to_owned();
    c.write(&frame("ACK", &[("id", &ack), ("receipt", "acked")], b""))
        .expect("ack");
    let f = c.read().expect("read").expect("RECEIPT");
    assert_eq!(f.header("receipt-id"), Some("acked"), "{f:?}");
    drop(c);
    send_receipted(&mut p, "queued", "q-first");
    broker.kill();

    let broker = BrokerProcess::start(dir.path(), &["stomp"], &extra);
    let addr = broker.addr("stomp");
    let mut p = Stomp::connect(addr, IO_TIMEOUT).expect("connect");
    send_receipted(&mut p, "consumed", "c-retry");
    send_receipted(&mut p, "queued", "q-retry");
    send_receipted(&mut p, "fresh", "fresh");
    let mut c = Stomp::connect(addr, IO_TIMEOUT).expect("connect");
    c.write(&frame(
        "SUBSCRIBE",
        &[
            ("id", "s"),
            ("destination", "/queue/orders"),
            ("ack", "auto"),
        ],
        b"",
    ))
    .expect("subscribe");
    c.stream
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .expect("timeout");
    let mut got = Vec::new();
    while let Ok(Some(f)) = c.read() {
        got.push(String::from_utf8_lossy(&f.body).into_owned());
    }
    assert_eq!(got, vec!["q-first", "fresh"]);
    drop(broker);
}

const DEDUP_TOPICS: &str = "[[topics]]\nfilter = \"orders/#\"\ndedup_window_s = 300\n";

fn topics(text: &str) -> Vec<TopicEntry> {
    Config::parse(text, "test.toml")
        .unwrap_or_else(|e| panic!("{e}"))
        .topics
}

#[tokio::test]
async fn mqtt5_a_topic_window_drops_a_retry_for_every_subscriber() {
    let broker = TestBroker::start_with(
        |c| c.topics = topics(DEDUP_TOPICS),
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let q1 = v5::QoS::AtLeastOnce;
    let (all, mut all_ev, _) = connected5(opts5(&broker, "dedup-all")).await;
    subscribe5(&all, &mut all_ev, v5::Filter::new("orders/#", q1), None).await;
    let (eu, mut eu_ev, _) = connected5(opts5(&broker, "dedup-eu")).await;
    subscribe5(&eu, &mut eu_ev, v5::Filter::new("orders/eu", q1), None).await;
    let (p, mut pev, _) = connected5(opts5(&broker, "dedup-topic-pub")).await;
    for body in ["first", "retry"] {
        assert_eq!(
            publish_mqtt(&p, &mut pev, "orders/eu", q1, "t-1", body).await,
            "Success"
        );
    }
    // The same id on another topic of the entry is another send.
    assert_eq!(
        publish_mqtt(&p, &mut pev, "orders/us", q1, "t-1", "us").await,
        "Success"
    );
    assert_eq!(&publish5(&mut all_ev).await.payload[..], b"first");
    assert_eq!(&publish5(&mut all_ev).await.payload[..], b"us");
    assert_eq!(&publish5(&mut eu_ev).await.payload[..], b"first");
    quiet5(&mut all_ev).await;
    quiet5(&mut eu_ev).await;
    let metrics = broker.metrics();
    assert!(
        metrics.contains("rosetta_topic_duplicates_total{filter=\"orders/#\"} 1\n"),
        "{metrics}"
    );
}

/// A topic's window across SIGKILL: the first send reached no subscriber
/// (there was none), yet its retry after the restart reaches none either,
/// not even one that subscribed since.
#[test]
fn a_topic_window_holds_across_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = format!("[store]\nsync = \"every-commit\"\n\n{DEDUP_TOPICS}");
    let mut broker = BrokerProcess::start(dir.path(), &["stomp"], &extra);
    let mut p = Stomp::connect(broker.addr("stomp"), IO_TIMEOUT).expect("connect");
    send_receipted_to(&mut p, "/topic/orders/eu", "t-1", "first");
    broker.kill();

    let broker = BrokerProcess::start(dir.path(), &["stomp"], &extra);
    let addr = broker.addr("stomp");
    let mut c = Stomp::connect(addr, IO_TIMEOUT).expect("connect");
    c.write(&frame(
        "SUBSCRIBE",
        &[
            ("id", "s"),
            ("destination", "/topic/orders/eu"),
            ("ack", "auto"),
            ("receipt", "subscribed"),
        ],
        b"",
    ))
    .expect("subscribe");
    let f = c.read().expect("read").expect("RECEIPT");
    assert_eq!(f.header("receipt-id"), Some("subscribed"), "{f:?}");
    let mut p = Stomp::connect(addr, IO_TIMEOUT).expect("connect");
    send_receipted_to(&mut p, "/topic/orders/eu", "t-1", "retry");
    send_receipted_to(&mut p, "/topic/orders/eu", "t-2", "fresh");
    c.stream
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .expect("timeout");
    let mut got = Vec::new();
    while let Ok(Some(f)) = c.read() {
        got.push(String::from_utf8_lossy(&f.body).into_owned());
    }
    assert_eq!(got, vec!["fresh"]);
    drop(broker);
}
