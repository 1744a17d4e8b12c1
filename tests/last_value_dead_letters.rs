//! Last-value queues and dead-letter annotations over real sockets, with
//! each protocol's own client: STOMP headers, AMQP application properties
//! and message annotations (fe2o3-amqp), MQTT 5 user properties (rumqttc).

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::sync::Arc;

use common::amqp::{self, recv_any, send_accepted, text_of};
use common::mqtt::*;
use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::types::messaging::{
    AmqpValue as AmqpValueBody, ApplicationProperties, Header, Message,
};
use fe2o3_amqp::types::primitives::{Symbol, Value as AmqpValue};
use rosetta::config::{Config, QueueEntry};

fn queues(text: &str) -> Vec<QueueEntry> {
    Config::parse(text, "test.toml")
        .unwrap_or_else(|e| panic!("{e}"))
        .queues
}

/// `prices` is a last-value queue keyed by `symbol`; `jobs.stomp`,
/// `jobs.amqp` and `jobs.mqtt` dead-letter after 2 attempts into
/// `dead.stomp`, `dead.amqp` and `dead.mqtt`, so each protocol reads its
/// own dead letters.
async fn broker() -> TestBroker {
    let mut text = String::from("[[queues]]\nname = \"prices\"\nlast_value_key = \"symbol\"\n");
    for p in ["stomp", "amqp", "mqtt"] {
        text.push_str(&format!(
            "[[queues]]\nname = \"jobs.{p}\"\ndelivery_attempts_max = 2\ndead_letter_address = \"dead.{p}\"\n"
        ));
    }
    TestBroker::start_with(
        |c| c.queues = queues(&text),
        Arc::new(rosetta::core::AllowAll),
    )
    .await
}

fn replaced_total(broker: &TestBroker, queue: &str) -> u64 {
    broker
        .core()
        .queue_stats(queue)
        .map_or(0, |s| s.replaced_total)
}

#[tokio::test]
async fn stomp_last_value_queue_keeps_the_newest_per_header_across_a_restart() {
    let mut broker = broker().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    for (symbol, body) in [("ACME", "acme 1"), ("INIT", "init 1"), ("ACME", "acme 2")] {
        p.send_persistent("/queue/prices", &[("symbol", symbol)], body.as_bytes())
            .await;
    }
    p.send_persistent("/queue/prices", &[], b"no symbol").await;
    p.send_persistent("/queue/prices", &[("symbol", "ACME")], b"acme 3")
        .await;
    p.disconnect().await;
    assert_eq!(broker.queue("prices"), Some((3, 0)));
    assert_eq!(replaced_total(&broker, "prices"), 2);
    let metrics = broker.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l == "rosetta_queue_last_value_replaced_total{queue=\"prices\"} 2"),
        "{metrics}"
    );

    broker.restart().await;
    assert_eq!(
        broker.queue("prices"),
        Some((3, 0)),
        "only the newest came back"
    );
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/prices", "client-individual", &[])
        .await;
    let got: Vec<String> = c.messages(3).await.iter().map(|m| m.text()).collect();
    assert_eq!(got, ["init 1", "no symbol", "acme 3"]);
    c.expect_nothing().await;
    broker.stop().await;
}

#[tokio::test]
async fn stomp_last_value_queue_does_not_recall_a_message_in_flight() {
    let broker = broker().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe(
        "s",
        "/queue/prices",
        "client-individual",
        &[("activemq.prefetchSize", "1")],
    )
    .await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/queue/prices", &[("symbol", "ACME")], b"acme 1")
        .await;
    let first = c.message().await;
    assert_eq!(first.text(), "acme 1");
    for body in ["acme 2", "acme 3"] {
        p.send_persistent("/queue/prices", &[("symbol", "ACME")], body.as_bytes())
            .await;
    }
    assert_eq!(
        broker.queue("prices"),
        Some((1, 1)),
        "one waits, one in flight"
    );
    c.ack(&first).await;
    let next = c.message().await;
    assert_eq!(next.text(), "acme 3");
    c.ack(&next).await;
    c.expect_nothing().await;
    broker.stop().await;
}

fn priced(symbol: &str, text: &str) -> Message<AmqpValueBody<String>> {
    Message::builder()
        .header(Header {
            durable: true,
            ..Default::default()
        })
        .application_properties(
            ApplicationProperties::builder()
                .insert("symbol", symbol)
                .build(),
        )
        .value(text.to_owned())
        .build()
}

#[tokio::test]
async fn amqp_last_value_queue_keys_on_an_application_property() {
    let broker = broker().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "lvq-amqp").await;
    let mut s = amqp::sender(&mut session, "p", "/queue/prices").await;
    for (symbol, text) in [("ACME", "acme 1"), ("INIT", "init 1"), ("ACME", "acme 2")] {
        send_accepted(&mut s, priced(symbol, text)).await;
    }
    assert_eq!(replaced_total(&broker, "prices"), 1);
    let mut r = amqp::manual_receiver(&mut session, "r", "/queue/prices").await;
    r.set_credit(10).await.expect("credit");
    let mut got = Vec::new();
    for _ in 0..2 {
        let d = recv_any(&mut r).await;
        got.push(text_of(&d));
        r.accept(&d).await.expect("accept");
    }
    assert_eq!(got, ["init 1", "acme 2"]);
    amqp::recv_nothing(&mut r).await;
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn mqtt5_last_value_queue_keys_on_a_user_property() {
    let broker = broker().await;
    let (p, mut pev, _) = connected5(opts5(&broker, "lvq-pub")).await;
    for (symbol, body) in [("ACME", "acme 1"), ("INIT", "init 1"), ("ACME", "acme 2")] {
        let props = v5::PublishProperties {
            user_properties: vec![("symbol".into(), symbol.into())],
            ..Default::default()
        };
        publish_and_ack5(
            &p,
            &mut pev,
            "$queue/prices",
            v5::QoS::AtLeastOnce,
            false,
            body.as_bytes(),
            Some(props),
        )
        .await;
    }
    assert_eq!(replaced_total(&broker, "prices"), 1);
    let (c, mut cev, _) = connected5(opts5(&broker, "lvq-sub")).await;
    subscribe5(
        &c,
        &mut cev,
        v5::Filter::new("$queue/prices", v5::QoS::AtLeastOnce),
        None,
    )
    .await;
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(String::from_utf8_lossy(&publish5(&mut cev).await.payload).into_owned());
    }
    assert_eq!(got, ["init 1", "acme 2"]);
    quiet5(&mut cev).await;
    broker.stop().await;
}

/// Sends `body` to `queue` with STOMP and NACKs it until it is
/// dead-lettered (the queue's 2 attempts); returns the NACKing client.
async fn nack_until_dead(broker: &TestBroker, queue: &str, body: &[u8]) -> StompClient {
    let dest = format!("/queue/{queue}");
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent(&dest, &[], body).await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", &dest, "client-individual", &[]).await;
    for _ in 0..2 {
        let m = c.message().await;
        c.request("NACK", &[("id", &m.ack_id())], b"").await;
    }
    c
}

/// STOMP NACKs past the attempts: the dead letter's headers say why and
/// how often, under the same names AMQP and MQTT use.
#[tokio::test]
async fn stomp_dead_letters_carry_the_reason_and_count_headers() {
    let broker = broker().await;
    let mut c = nack_until_dead(&broker, "jobs.stomp", b"poison").await;
    c.subscribe("d", "/queue/dead.stomp", "client-individual", &[])
        .await;
    let m = c.message().await;
    assert_eq!(m.text(), "poison");
    assert_eq!(
        (
            m.header("x-opt-dead-letter-reason"),
            m.header("x-opt-delivery-count"),
            m.header("x-original-queue"),
        ),
        (Some("delivery-attempts"), Some("2"), Some("jobs.stomp"))
    );
    c.ack(&m).await;
    broker.stop().await;
}

/// An AMQP reject: the dead letter reaches an AMQP consumer with the
/// reason and count as message annotations (not application properties),
/// next to the publisher's own annotations.
#[tokio::test]
async fn amqp_dead_letters_carry_the_reason_and_count_as_message_annotations() {
    let broker = broker().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "dl-amqp").await;
    let mut s = amqp::sender(&mut session, "p", "/queue/jobs.amqp").await;
    let m = Message::builder()
        .message_annotations(
            fe2o3_amqp::types::messaging::MessageAnnotations::builder()
                .insert("x-opt-mine", 7i32)
                .build(),
        )
        .application_properties(ApplicationProperties::builder().insert("k", "v").build())
        .value("refused".to_owned())
        .build();
    send_accepted(&mut s, m).await;
    let mut r = amqp::manual_receiver(&mut session, "r", "/queue/jobs.amqp").await;
    r.set_credit(1).await.expect("credit");
    let d = recv_any(&mut r).await;
    r.reject(&d, None).await.expect("reject");
    let mut dead = amqp::manual_receiver(&mut session, "d", "/queue/dead.amqp").await;
    dead.set_credit(1).await.expect("credit");
    let d = recv_any(&mut dead).await;
    assert_eq!(text_of(&d), "refused");
    let ann = d
        .message()
        .message_annotations
        .as_ref()
        .expect("message annotations");
    let get = |k: &str| {
        ann.0
            .get(&fe2o3_amqp::types::messaging::annotations::OwnedKey::from(
                Symbol::from(k),
            ))
            .cloned()
    };
    assert_eq!(
        get("x-opt-dead-letter-reason"),
        Some(AmqpValue::String("rejected".into()))
    );
    assert_eq!(get("x-opt-delivery-count"), Some(AmqpValue::Uint(1)));
    assert_eq!(
        get("x-opt-mine"),
        Some(AmqpValue::Int(7)),
        "the publisher's kept"
    );
    let app = d
        .message()
        .application_properties
        .as_ref()
        .expect("application properties");
    assert!(app.0.contains_key("k"));
    assert_eq!(
        app.0.get("x-original-queue"),
        Some(&fe2o3_amqp::types::primitives::SimpleValue::String(
            "jobs.amqp".into()
        ))
    );
    assert!(!app.0.keys().any(|k| k.starts_with("x-opt-")), "{app:?}");
    dead.accept(&d).await.expect("accept");
    conn.close().await.expect("close");
    broker.stop().await;
}

/// An MQTT 5 consumer of a dead-letter queue sees the reason and count as
/// user properties.
#[tokio::test]
async fn mqtt5_dead_letters_carry_the_reason_and_count_user_properties() {
    let broker = broker().await;
    nack_until_dead(&broker, "jobs.mqtt", b"unlucky").await;
    let (m, mut mev, _) = connected5(opts5(&broker, "dl-mqtt")).await;
    subscribe5(
        &m,
        &mut mev,
        v5::Filter::new("$queue/dead.mqtt", v5::QoS::AtLeastOnce),
        None,
    )
    .await;
    let got = publish5(&mut mev).await;
    assert_eq!(&got.payload[..], b"unlucky");
    let user = got.properties.expect("properties").user_properties;
    let get = |k: &str| user.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(
        (
            get("x-opt-dead-letter-reason"),
            get("x-opt-delivery-count"),
            get("x-original-queue"),
        ),
        (Some("delivery-attempts"), Some("2"), Some("jobs.mqtt"))
    );
    broker.stop().await;
}
