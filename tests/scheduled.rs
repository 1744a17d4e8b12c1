//! Scheduled delivery and redelivery delay (issue 16) with real clients
//! over real sockets: STOMP `AMQ_SCHEDULED_DELAY`, AMQP
//! `x-opt-delivery-delay`/`x-opt-delivery-time` (fe2o3-amqp), MQTT
//! `$delayed/<seconds>/<topic>` (rumqttc), a `[[queues]]` redelivery delay
//! seen by a STOMP consumer that NACKs, and scheduled messages that
//! survive a `kill -9` of the real broker binary and arrive within 100 ms
//! of their time.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::process::{frame, BrokerProcess, Stomp};
use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::types::messaging::{Message, MessageAnnotations};
use fe2o3_amqp::types::primitives::Timestamp;
use rosetta::config::Config;

/// How late a scheduled message may arrive: the bound.
const LATENESS_MAX: Duration = Duration::from_millis(100);

fn stats(broker: &TestBroker, q: &str) -> rosetta::core::QueueStats {
    broker.core().queue_stats(q).unwrap_or_default()
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The broker keeps due times in whole milliseconds of the wall clock, so
/// a message can come due up to this much before `delay` has passed on
/// the test's monotonic clock (seen: 399.82 ms of 400 on a loaded machine).
const CLOCK_GRANULARITY: Duration = Duration::from_millis(1);

/// Asserts `elapsed` is at least `delay` (within the broker's clock
/// granularity) and at most [`LATENESS_MAX`] past it.
fn on_time(what: &str, elapsed: Duration, delay: Duration) {
    assert!(
        elapsed + CLOCK_GRANULARITY >= delay,
        "{what}: early, after {elapsed:?} of {delay:?}"
    );
    assert!(
        elapsed <= delay + LATENESS_MAX,
        "{what}: late, after {elapsed:?} of {delay:?}"
    );
}

#[tokio::test]
async fn stomp_amq_scheduled_delay_holds_a_message_until_its_time() {
    let broker = TestBroker::start().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/later", "client-individual", &[])
        .await;
    let sent = Instant::now();
    c.send_persistent("/queue/later", &[("AMQ_SCHEDULED_DELAY", "700")], b"late")
        .await;
    c.send_persistent("/queue/later", &[], b"now").await;
    let now = c.message().await;
    assert_eq!(now.text(), "now", "the one behind it is not held up");
    c.ack(&now).await;
    let st = stats(&broker, "later");
    assert_eq!((st.depth, st.scheduled), (0, 1), "scheduled, not ready");
    let late = c.message().await;
    on_time(
        "AMQ_SCHEDULED_DELAY",
        sent.elapsed(),
        Duration::from_millis(700),
    );
    assert_eq!(late.text(), "late");
    assert_eq!(
        late.header("AMQ_SCHEDULED_DELAY"),
        None,
        "consumed, not carried as a property"
    );
    c.ack(&late).await;
    assert_eq!(stats(&broker, "later").scheduled, 0);
}

#[tokio::test]
async fn stomp_a_bad_or_too_long_scheduled_delay_is_an_error_frame() {
    let broker = TestBroker::start().await;
    for bad in ["soon", "-5", "31536000001"] {
        let mut c = StompClient::connect(broker.stomp(), &[]).await;
        c.send_frame(
            "SEND",
            &[("destination", "/queue/bad"), ("AMQ_SCHEDULED_DELAY", bad)],
            b"x",
        )
        .await;
        let e = c.expect_error_then_close().await;
        assert_eq!(e.header("message"), Some("invalid header"), "{bad}: {e:?}");
    }
    assert_eq!(stats(&broker, "bad").enqueued_total, 0, "nothing stored");
}

#[tokio::test]
async fn amqp_delivery_delay_and_delivery_time_annotations_schedule() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = common::amqp::connect_session(&broker, "sched").await;
    let mut s = common::amqp::sender(&mut session, "p", "/queue/amqp-later").await;
    let mut r = common::amqp::receiver(&mut session, "c", "/queue/amqp-later").await;
    let sent = Instant::now();
    let delayed = Message::builder()
        .message_annotations(
            MessageAnnotations::builder()
                .insert("x-opt-delivery-delay", 600i64)
                .build(),
        )
        .value("by delay".to_string())
        .build();
    common::amqp::send_accepted(&mut s, delayed).await;
    let at = Message::builder()
        .message_annotations(
            MessageAnnotations::builder()
                .insert(
                    "x-opt-delivery-time",
                    Timestamp::from_milliseconds((epoch_ms() + 300) as i64),
                )
                .build(),
        )
        .value("by time".to_string())
        .build();
    common::amqp::send_accepted(&mut s, at).await;
    assert_eq!(stats(&broker, "amqp-later").scheduled, 2);
    assert_eq!(common::amqp::recv_text(&mut r).await, "by time");
    assert!(sent.elapsed() >= Duration::from_millis(290));
    assert_eq!(common::amqp::recv_text(&mut r).await, "by delay");
    on_time(
        "x-opt-delivery-delay",
        sent.elapsed(),
        Duration::from_millis(600),
    );

    // A negative delay is malformed: the transfer is rejected, the link
    // and the connection stay up.
    let bad = Message::builder()
        .message_annotations(
            MessageAnnotations::builder()
                .insert("x-opt-delivery-delay", -1i64)
                .build(),
        )
        .value("bad".to_string())
        .build();
    let outcome = s.send(bad).await.expect("send");
    assert!(outcome.is_rejected(), "{outcome:?}");
    common::amqp::send_accepted(
        &mut s,
        Message::builder().value("after".to_string()).build(),
    )
    .await;
    assert_eq!(common::amqp::recv_text(&mut r).await, "after");
    conn.close().await.expect("close");
}

#[tokio::test]
async fn mqtt_delayed_topic_delivers_to_the_topic_after_its_seconds() {
    use common::mqtt::*;
    let broker = TestBroker::start().await;
    let (_sub, mut sub_ev) =
        subscriber4(&broker, "sub", true, "d/t", rumqttc::QoS::AtLeastOnce).await;
    let (p, mut p_ev, _) = connected4(&broker, "pub", true).await;
    let sent = Instant::now();
    publish_and_ack4(
        &p,
        &mut p_ev,
        "$delayed/1/d/t",
        rumqttc::QoS::AtLeastOnce,
        false,
        b"hi",
    )
    .await;
    let got = publish4(&mut sub_ev).await;
    on_time("$delayed/1/", sent.elapsed(), Duration::from_secs(1));
    assert_eq!(got.topic, "d/t", "the prefix is stripped");
    assert_eq!(&got.payload[..], b"hi");
}

#[tokio::test]
async fn mqtt_a_malformed_delayed_topic_is_refused() {
    use common::mqtt::*;
    let broker = TestBroker::start().await;
    let (p, mut ev, _) = connected4(&broker, "pub-bad", true).await;
    p.publish(
        "$delayed/soon/d/t",
        rumqttc::QoS::AtLeastOnce,
        false,
        b"x".to_vec(),
    )
    .await
    .expect("publish");
    // MQTT 3.1.1 has no negative PUBACK: the broker closes the connection.
    let closed = loop {
        match next4(&mut ev).await {
            Err(_) => break true,
            Ok(rumqttc::Packet::PubAck(_)) => break false,
            Ok(_) => {}
        }
    };
    assert!(closed, "no PUBACK for an invalid topic name");
    assert!(broker
        .core()
        .queue_names()
        .iter()
        .all(|q| !q.contains("delayed")));
}

#[tokio::test]
async fn mqtt5_a_malformed_delayed_topic_is_topic_name_invalid() {
    use common::mqtt::{v5, Raw};
    use rumqttc::v5::mqttbytes::v5 as p5;
    let broker = TestBroker::start().await;
    for bad in ["$delayed/1/", "$delayed/1.5/t", "$delayed/31536001/t"] {
        let (mut raw, ack) = Raw::connect5_clean(broker.mqtt(), "pub5-bad", None).await;
        assert_eq!(ack.code, v5::ConnectReturnCode::Success);
        let mut publish =
            p5::Publish::new(bad, rumqttc::v5::mqttbytes::QoS::AtLeastOnce, "x", None);
        publish.pkid = 1;
        raw.send5(p5::Packet::Publish(publish)).await;
        raw.expect_disconnect5(v5::DisconnectReasonCode::TopicNameInvalid)
            .await;
    }
}

#[tokio::test]
async fn a_nacked_message_comes_back_after_the_queue_redelivery_delay() {
    let entries = Config::parse(
        "[[queues]]\nname = \"/queue/retry\"\nredelivery_delay_ms = 400\nredelivery_multiplier = 2.0\n",
        "test.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .queues;
    let broker =
        TestBroker::start_with(|c| c.queues = entries, Arc::new(rosetta::core::AllowAll)).await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/retry", "client-individual", &[])
        .await;
    c.send_persistent("/queue/retry", &[], b"poison").await;
    c.send_persistent("/queue/retry", &[], b"fine").await;
    let first = c.message().await;
    assert_eq!(first.text(), "poison");
    let fine = c.message().await;
    assert_eq!(fine.text(), "fine");
    let nacked = Instant::now();
    c.request("NACK", &[("id", &first.ack_id())], b"").await;
    c.ack(&fine).await;
    assert_eq!(stats(&broker, "retry").scheduled, 1);
    let again = c.message().await;
    on_time(
        "first redelivery",
        nacked.elapsed(),
        Duration::from_millis(400),
    );
    assert_eq!(again.text(), "poison");
    assert_eq!(again.header("delivery-count"), Some("1"));
    let nacked = Instant::now();
    c.request("NACK", &[("id", &again.ack_id())], b"").await;
    let third = c.message().await;
    on_time(
        "second, doubled",
        nacked.elapsed(),
        Duration::from_millis(800),
    );
    c.ack(&third).await;
}

/// A STOMP SEND of a persistent message scheduled `delay_ms` from now,
/// with a receipt.
fn scheduled_send(id: &str, delay_ms: u64) -> Vec<u8> {
    let delay = delay_ms.to_string();
    frame(
        "SEND",
        &[
            ("destination", "/queue/restart"),
            ("persistent", "true"),
            ("AMQ_SCHEDULED_DELAY", &delay),
            ("receipt", id),
        ],
        id.as_bytes(),
    )
}

#[test]
fn scheduled_messages_survive_a_kill_and_arrive_within_100_ms_of_their_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let start = || BrokerProcess::start(dir.path(), &["stomp"], "");
    let io = Duration::from_secs(10);
    let delays_ms = [4_000u64, 5_000, 6_000];
    let mut broker = start();
    let mut s = Stomp::connect(broker.addr("stomp"), io).expect("connect");
    // Each message's time, by the client's clock before it sent it (the
    // broker's time is at most a round trip later).
    let mut due = Vec::new();
    for (i, delay) in delays_ms.iter().enumerate() {
        let id = format!("m{i}");
        due.push(epoch_ms() + delay);
        s.write(&scheduled_send(&id, *delay)).expect("send");
        let f = s.read().expect("read").expect("a frame");
        assert_eq!(
            (f.command.as_str(), f.header("receipt-id")),
            ("RECEIPT", Some(id.as_str()))
        );
    }
    // Durable once receipted: no shutdown, no flush.
    broker.kill();
    let broker = start();
    let mut c = Stomp::connect(broker.addr("stomp"), io).expect("connect");
    c.write(&frame(
        "SUBSCRIBE",
        &[
            ("id", "s"),
            ("destination", "/queue/restart"),
            ("ack", "client-individual"),
        ],
        b"",
    ))
    .expect("subscribe");
    assert!(
        epoch_ms() < due[0],
        "the restart took longer than the first delay"
    );
    for (i, due_ms) in due.iter().enumerate() {
        let f = c.read().expect("read").expect("a MESSAGE");
        let arrived = epoch_ms();
        assert_eq!(f.command, "MESSAGE");
        assert_eq!(f.body, format!("m{i}").into_bytes(), "in due order");
        assert!(arrived >= *due_ms, "m{i} early by {} ms", due_ms - arrived);
        assert!(
            arrived - due_ms <= LATENESS_MAX.as_millis() as u64,
            "m{i} late by {} ms",
            arrived - due_ms
        );
        let ack_id = f.header("ack").expect("ack id").to_owned();
        c.write(&frame("ACK", &[("id", &ack_id)], b""))
            .expect("ack");
    }
}
