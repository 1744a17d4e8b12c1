//! Limits a peer could otherwise grow without bound, over real sockets:
//! MQTT subscriptions per session (SUBACK 0x80 for 3.1.1, 0x97 for 5.0),
//! shared and `$queue/` subscriptions per session, queues and bindings in
//! total (the core: each protocol reports its own resource-limit error),
//! STOMP subscriptions per connection (ERROR frame) and AMQP links per
//! connection (attach refused with `amqp:resource-limit-exceeded`) and per
//! session (handle-max advertised; a handle above it closes the connection
//! with `amqp:connection:framing-error`, as spec 2.7.2 requires). Past each
//! limit only the offending request fails: other clients go on and nothing
//! stored is lost.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::amqp::{self, RawAmqp};
use common::mqtt::*;
use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::{Receiver, Sender};
use rosetta::config::Config;
use rumqttc::{QoS, SubscribeFilter, SubscribeReasonCode as Code4};

async fn broker_with(tweak: impl FnOnce(&mut Config)) -> TestBroker {
    TestBroker::start_with(tweak, Arc::new(rosetta::core::AllowAll)).await
}

fn granted4(ack: &rumqttc::SubAck) -> Vec<bool> {
    ack.return_codes
        .iter()
        .map(|c| matches!(c, Code4::Success(_)))
        .collect()
}

async fn subscribe_many4(
    c: &rumqttc::AsyncClient,
    ev: &mut rumqttc::EventLoop,
    filters: &[&str],
) -> rumqttc::SubAck {
    c.subscribe_many(
        filters
            .iter()
            .map(|f| SubscribeFilter::new((*f).to_owned(), QoS::AtLeastOnce)),
    )
    .await
    .expect("subscribe");
    suback4(ev).await
}

fn ok5() -> v5::SubscribeReasonCode {
    v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)
}

// ---- MQTT subscriptions per session ----------------------------------------

#[tokio::test]
async fn mqtt_subscriptions_per_session_are_capped() {
    let broker = broker_with(|c| c.mqtt.subscriptions_max = 2).await;

    // 3.1.1: the filter past the cap fails with 0x80, the others are granted.
    let (c, mut ev, _) = connected4(&broker, "cap4", false).await;
    let ack = subscribe_many4(&c, &mut ev, &["cap/a", "cap/b", "cap/c"]).await;
    assert_eq!(granted4(&ack), [true, true, false], "{ack:?}");
    // Subscribing again to a filter the session has replaces it: no new one.
    let ack = subscribe4(&c, &mut ev, "cap/a", QoS::AtMostOnce).await;
    assert_eq!(ack.return_codes, [Code4::Success(QoS::AtMostOnce)]);
    // Granted filters deliver; the refused one does not.
    publish_once4(&broker, "cap/c", QoS::AtLeastOnce, false, b"refused").await;
    publish_once4(&broker, "cap/b", QoS::AtLeastOnce, false, b"granted").await;
    assert_eq!(&publish4(&mut ev).await.payload[..], b"granted");
    // Unsubscribing frees a place.
    unsubscribe4(&c, &mut ev, "cap/b").await;
    let ack = subscribe4(&c, &mut ev, "cap/c", QoS::AtLeastOnce).await;
    assert_eq!(granted4(&ack), [true]);
    // A resumed session counts the subscriptions it kept.
    disconnect4(&c, &mut ev).await;
    let (c, mut ev, ack) = connected4(&broker, "cap4", false).await;
    assert!(ack.session_present);
    let ack = subscribe4(&c, &mut ev, "cap/d", QoS::AtLeastOnce).await;
    assert_eq!(granted4(&ack), [false], "{ack:?}");

    // 5.0: 0x97 Quota exceeded. The cap is per session: this client gets
    // its own two although "cap4" holds two.
    let (c5, mut ev5, _) = connected5(opts5(&broker, "cap5")).await;
    let codes = subscribe_many5(&c5, &mut ev5, &["cap/x", "cap/y", "cap/z"]).await;
    assert_eq!(
        codes,
        [ok5(), ok5(), v5::SubscribeReasonCode::QuotaExceeded],
        "{codes:?}"
    );
    // The 3.1.1 session still works.
    publish_once4(&broker, "cap/a", QoS::AtLeastOnce, false, b"still").await;
    assert_eq!(&publish4(&mut ev).await.payload[..], b"still");
    disconnect5(&c5, &mut ev5).await;
    disconnect4(&c, &mut ev).await;
    broker.stop().await;
}

#[tokio::test]
async fn mqtt_shared_and_queue_subscriptions_cap_is_configurable() {
    let broker = broker_with(|c| c.mqtt.shared_subscriptions_max = 1).await;
    let (c, mut ev, _) = connected5(opts5(&broker, "own")).await;
    let codes = subscribe_many5(
        &c,
        &mut ev,
        &["$share/g/own/a", "$queue/own-q", "own/plain"],
    )
    .await;
    assert_eq!(
        codes,
        [ok5(), v5::SubscribeReasonCode::QuotaExceeded, ok5()],
        "{codes:?}"
    );
    disconnect5(&c, &mut ev).await;
    broker.stop().await;
}

// ---- queues and bindings in total ------------------------------------------

#[tokio::test]
async fn queues_in_total_are_capped() {
    let broker = broker_with(|c| c.broker.queues_max = 3).await;
    assert!(broker.core().queue_names().is_empty(), "no queue at start");

    // Two queues made by STOMP sends, a third by an MQTT clean session's
    // first subscription.
    let mut stomp = StompClient::connect(broker.stomp(), &[]).await;
    stomp.send_persistent("/queue/q1", &[], b"one").await;
    stomp.send_persistent("/queue/q2", &[], b"two").await;
    let (c, mut ev, _) = connected5(opts5(&broker, "q-holder")).await;
    assert_eq!(subscribe_many5(&c, &mut ev, &["held/#"]).await, [ok5()]);
    assert_eq!(broker.core().queue_names().len(), 3);

    // MQTT 5: a clean session's first subscription needs a queue: 0x97.
    let (c2, mut ev2, _) = connected5(opts5(&broker, "q-late")).await;
    assert_eq!(
        subscribe_many5(&c2, &mut ev2, &["late/#"]).await,
        [v5::SubscribeReasonCode::QuotaExceeded]
    );
    // MQTT 3.1.1: a persistent session's queue is made at CONNECT.
    let (_c3, mut ev3) = client4(&broker, "q-persistent", false);
    match next4(&mut ev3).await {
        Err(rumqttc::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, rumqttc::ConnectReturnCode::ServiceUnavailable)
        }
        other => panic!("CONNECT must be refused with 3, got {other:?}"),
    }
    // AMQP: a receiver of a queue that would have to be created.
    let (mut conn, mut session) = amqp::connect_session(&broker, "q-amqp").await;
    let e = Receiver::attach(&mut session, "r-new", "/queue/q-new")
        .await
        .expect_err("a fourth queue must be refused");
    assert!(format!("{e:?}").contains("ResourceLimitExceeded"), "{e:?}");
    // STOMP: a send that would create a queue gets an ERROR frame.
    stomp
        .send_frame("SEND", &[("destination", "/queue/q3")], b"three")
        .await;
    let error = stomp.expect_error_then_close().await;
    assert_eq!(error.header("message"), Some("resource limit exceeded"));

    // The existing queues keep working, and nothing stored is lost.
    let mut other = StompClient::connect(broker.stomp(), &[]).await;
    other.send_persistent("/queue/q1", &[], b"one more").await;
    assert_eq!(broker.depth("q1").0, 2);
    assert_eq!(broker.depth("q2").0, 1);
    let mut s = amqp::sender(&mut session, "s-q2", "/queue/q2").await;
    amqp::send_accepted(&mut s, "two more").await;
    // When the clean session ends, its queue goes and a place is free.
    disconnect5(&c, &mut ev).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(subscribe_many5(&c2, &mut ev2, &["late/#"]).await, [ok5()]);
    other.disconnect().await;
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn bindings_in_total_are_capped() {
    let broker = broker_with(|c| c.broker.bindings_max = 2).await;
    let (a, mut ev_a, _) = connected4(&broker, "bind-a", true).await;
    let ack = subscribe_many4(&a, &mut ev_a, &["bind/x", "bind/y"]).await;
    assert_eq!(granted4(&ack), [true, true]);

    // Every protocol's way to make a binding is refused now.
    let (b, mut ev_b, _) = connected5(opts5(&broker, "bind-b")).await;
    assert_eq!(
        subscribe_many5(&b, &mut ev_b, &["bind/z"]).await,
        [v5::SubscribeReasonCode::QuotaExceeded]
    );
    let (c, mut ev_c, _) = connected4(&broker, "bind-c", true).await;
    let ack = subscribe4(&c, &mut ev_c, "bind/z", QoS::AtLeastOnce).await;
    assert_eq!(granted4(&ack), [false], "3.1.1 gets 0x80: {ack:?}");
    let mut stomp = StompClient::connect(broker.stomp(), &[]).await;
    stomp
        .send_frame(
            "SUBSCRIBE",
            &[("id", "t"), ("destination", "/topic/bind/z")],
            b"",
        )
        .await;
    let error = stomp.expect_error_then_close().await;
    assert_eq!(error.header("message"), Some("resource limit exceeded"));
    let (mut conn, mut session) = amqp::connect_session(&broker, "bind-amqp").await;
    let e = Receiver::attach(&mut session, "r-topic", "/topic/bind/z")
        .await
        .expect_err("a topic subscription needs a binding");
    assert!(format!("{e:?}").contains("ResourceLimitExceeded"), "{e:?}");
    // The STOMP and AMQP refusals left no queue behind; each MQTT session
    // has its own (made before the binding was refused, gone with it).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut queues = broker.core().queue_names();
    queues.sort();
    assert_eq!(queues, ["$mqtt/bind-a", "$mqtt/bind-b", "$mqtt/bind-c"]);

    // The bindings that exist deliver; freeing one lets another in.
    publish_once4(&broker, "bind/x", QoS::AtLeastOnce, false, b"x").await;
    assert_eq!(&publish4(&mut ev_a).await.payload[..], b"x");
    unsubscribe4(&a, &mut ev_a, "bind/y").await;
    assert_eq!(subscribe_many5(&b, &mut ev_b, &["bind/z"]).await, [ok5()]);
    disconnect4(&a, &mut ev_a).await;
    disconnect4(&c, &mut ev_c).await;
    disconnect5(&b, &mut ev_b).await;
    conn.close().await.expect("close");
    broker.stop().await;
}

// ---- STOMP subscriptions per connection ------------------------------------

#[tokio::test]
async fn stomp_subscriptions_per_connection_are_capped() {
    let broker = broker_with(|c| c.stomp.subscriptions_max = 2).await;
    let mut producer = StompClient::connect(broker.stomp(), &[]).await;
    producer
        .send_persistent("/queue/cap-s1", &[], b"kept")
        .await;

    let mut greedy = StompClient::connect(broker.stomp(), &[]).await;
    greedy.subscribe("s1", "/queue/cap-s1", "client", &[]).await;
    let unacked = greedy.message().await;
    assert_eq!(unacked.text(), "kept");
    greedy.subscribe("s2", "/queue/cap-s2", "auto", &[]).await;
    greedy
        .send_frame(
            "SUBSCRIBE",
            &[("id", "s3"), ("destination", "/queue/cap-s3")],
            b"",
        )
        .await;
    let error = greedy.expect_error_then_close().await;
    assert_eq!(error.header("message"), Some("limit exceeded"));
    assert!(error.text().contains("subscriptions"), "{error:?}");

    // Another connection has its own two; the unacknowledged message came
    // back to its queue.
    let mut fair = StompClient::connect(broker.stomp(), &[]).await;
    fair.subscribe("s1", "/queue/cap-s1", "auto", &[]).await;
    fair.subscribe("s2", "/queue/cap-s3", "auto", &[]).await;
    let again = fair.message().await;
    assert_eq!(again.text(), "kept");
    assert_eq!(again.header("redelivered"), Some("true"), "{again:?}");
    fair.disconnect().await;
    producer.disconnect().await;
    broker.stop().await;
}

// ---- AMQP links per connection and per session -----------------------------

#[tokio::test]
async fn amqp_links_per_connection_are_capped() {
    let broker = broker_with(|c| c.amqp.links_per_connection_max = 2).await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "links").await;
    let mut s = amqp::sender(&mut session, "s", "/queue/links").await;
    let mut r = amqp::receiver(&mut session, "r", "/queue/links").await;
    // A second session does not get more: the cap is per connection.
    let mut session2 = fe2o3_amqp::Session::begin(&mut conn).await.expect("begin");
    let e = Sender::attach(&mut session2, "s3", "/queue/links")
        .await
        .expect_err("a third link must be refused");
    assert!(format!("{e:?}").contains("ResourceLimitExceeded"), "{e:?}");
    // The refusal detached that link only: the others still work.
    amqp::send_accepted(&mut s, "through").await;
    assert_eq!(amqp::recv_text(&mut r).await, "through");
    // Another connection attaches its own.
    let (mut conn2, mut other) = amqp::connect_session(&broker, "links-2").await;
    let mut s2 = amqp::sender(&mut other, "s", "/queue/links").await;
    amqp::send_accepted(&mut s2, "from the other").await;
    assert_eq!(amqp::recv_text(&mut r).await, "from the other");
    conn2.close().await.expect("close");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn amqp_handle_max_is_advertised_and_enforced() {
    let broker = broker_with(|c| c.amqp.handle_max = 1).await;
    // fe2o3 opens two links on one session (handles 0 and 1).
    let (mut conn, mut session) = amqp::connect_session(&broker, "handles").await;
    let mut s = amqp::sender(&mut session, "s", "/queue/handles").await;
    let mut r = amqp::receiver(&mut session, "r", "/queue/handles").await;
    amqp::send_accepted(&mut s, "fits").await;
    assert_eq!(amqp::recv_text(&mut r).await, "fits");

    // A raw client sees handle-max 1 in Begin; a handle above it is a
    // framing error of the connection (spec 2.7.2).
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, None).await;
    assert!(raw.write(&amqp::frame(0, 0, &amqp::begin_body())).await);
    let begin = raw.expect(amqp::BEGIN).await;
    // handle-max is Begin's last field here: smalluint 1.
    assert!(
        begin.body.ends_with(&[0x52, 1]),
        "handle-max 1 in {begin:?}"
    );
    let attach = amqp::attach_sender_body("too-high", 2, "/queue/handles");
    assert!(raw.write(&amqp::frame(0, 0, &attach)).await);
    raw.expect_close_with("amqp:connection:framing-error").await;

    // The other connection is unaffected.
    amqp::send_accepted(&mut s, "still").await;
    assert_eq!(amqp::recv_text(&mut r).await, "still");
    conn.close().await.expect("close");
    broker.stop().await;
}
