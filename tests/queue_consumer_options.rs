//! Consumer options of queue semantics over real sockets with the Rust
//! clients (message priority and groups are in `queue_semantics.rs`):
//! JMS selectors from a STOMP and an AMQP consumer on one queue
//! (fe2o3-amqp with the `apache.org:selector-filter:string` filter),
//! refused selectors, and a STOMP browser (`browser:true`) that sees
//! everything, ends with ActiveMQ's end-of-browse MESSAGE and leaves the
//! queue as it was. The AMQP browser is in `amqp_jms.rs` (Qpid JMS
//! `QueueBrowser`).

mod common;

use common::amqp::{self, WAIT};
use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::link::ReceiverAttachError;
use fe2o3_amqp::types::messaging::Source;
use fe2o3_amqp::types::primitives::{Symbol, Value};
use fe2o3_amqp::Receiver;
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;

/// A source on `address` with a JMS selector, as Qpid JMS sends it.
fn selector_source(address: &str, selector: &str) -> Source {
    Source::builder()
        .address(address)
        .add_to_filter(
            "jms-selector",
            Described {
                descriptor: Descriptor::Name(Symbol::from("apache.org:selector-filter:string")),
                value: Value::String(selector.to_owned()),
            },
        )
        .build()
}

/// STOMP-published text messages `<colour>-<i>` for `i` in `0..n`, colour
/// alternating red and green (STOMP headers are message properties,
/// which selectors read).
async fn publish_colours(broker: &TestBroker, dest: &str, n: usize) {
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    for i in 0..n {
        let colour = if i % 2 == 0 { "red" } else { "green" };
        // Text, so that an AMQP consumer gets an amqp-value string.
        p.send_persistent(
            dest,
            &[("colour", colour), ("content-type", "text/plain")],
            format!("{colour}-{i}").as_bytes(),
        )
        .await;
    }
    p.disconnect().await;
}

#[tokio::test]
async fn stomp_and_amqp_selectors_on_one_queue_each_get_exactly_their_matches() {
    let broker = TestBroker::start().await;
    publish_colours(&broker, "/queue/colours", 20).await;
    let mut stomp = StompClient::connect(broker.stomp(), &[]).await;
    stomp
        .subscribe(
            "reds",
            "/queue/colours",
            "client-individual",
            &[("selector", "colour = 'red'")],
        )
        .await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "green-reader").await;
    let mut greens = Receiver::builder()
        .name("greens")
        .source(selector_source("/queue/colours", "colour = 'green'"))
        .attach(&mut session)
        .await
        .expect("a selector the core parses is accepted");
    let mut got_green = Vec::new();
    for _ in 0..10 {
        got_green.push(amqp::recv_text(&mut greens).await);
    }
    amqp::recv_nothing(&mut greens).await;
    let mut got_red = Vec::new();
    for _ in 0..10 {
        let m = stomp.message().await;
        assert_eq!(m.header("colour"), Some("red"), "{m:?}");
        got_red.push(m.text());
        stomp.ack(&m).await;
    }
    assert!(stomp.message_or_none().await.is_none());
    let expect = |colour: &str, first: usize| -> Vec<String> {
        (first..20)
            .step_by(2)
            .map(|i| format!("{colour}-{i}"))
            .collect()
    };
    assert_eq!(got_red, expect("red", 0), "in order, nothing else");
    assert_eq!(got_green, expect("green", 1), "in order, nothing else");
    assert_eq!(broker.queue("colours"), Some((0, 0)));
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn a_malformed_selector_is_refused_by_each_protocol_and_nothing_is_taken() {
    let broker = TestBroker::start().await;
    publish_colours(&broker, "/queue/refused", 2).await;
    let mut stomp = StompClient::connect(broker.stomp(), &[]).await;
    stomp
        .send_frame(
            "SUBSCRIBE",
            &[
                ("id", "s"),
                ("destination", "/queue/refused"),
                ("selector", "colour = 'red' AND ("),
            ],
            b"",
        )
        .await;
    let e = stomp.expect_error_then_close().await;
    assert_eq!(e.header("message"), Some("invalid selector"), "{e:?}");
    let (mut conn, mut session) = amqp::connect_session(&broker, "bad-selector").await;
    let refused = Receiver::builder()
        .name("bad")
        .source(selector_source("/queue/refused", "colour = = 'red'"))
        .attach(&mut session)
        .await;
    match refused {
        Err(ReceiverAttachError::RemoteClosedWithError(e)) => assert_eq!(
            e.condition,
            fe2o3_amqp::types::definitions::AmqpError::InvalidField.into()
        ),
        Err(other) => panic!("refused with the wrong error: {other:?}"),
        Ok(_) => panic!("a malformed selector must refuse the link"),
    }
    assert_eq!(broker.queue("refused"), Some((2, 0)), "nothing consumed");
    let _ = conn.close().await;
    broker.stop().await;
}

#[tokio::test]
async fn a_stomp_browser_sees_everything_then_the_end_and_leaves_it_queued() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_numbered("/queue/browsed", 5).await;
    let mut browser = StompClient::connect(broker.stomp(), &[]).await;
    browser
        .subscribe("b", "/queue/browsed", "client", &[("browser", "true")])
        .await;
    let seen: Vec<String> = browser.messages(5).await.iter().map(|m| m.text()).collect();
    assert_eq!(seen, ["m0", "m1", "m2", "m3", "m4"]);
    let end = browser.message().await;
    assert_eq!(end.header("browser"), Some("end"), "{end:?}");
    assert_eq!(end.header("subscription"), Some("b"));
    assert!(end.body.is_empty());
    // Messages sent after the end are not browsed.
    p.send_numbered("/queue/browsed", 1).await;
    assert!(browser.message_or_none().await.is_none());
    assert_eq!(broker.queue("browsed"), Some((6, 0)), "all still queued");
    // A consumer takes them all, first delivery each.
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("c", "/queue/browsed", "client-individual", &[])
        .await;
    for m in c.messages(6).await {
        assert_eq!(m.header("redelivered"), None, "{m:?}");
        c.ack(&m).await;
    }
    tokio::time::timeout(WAIT, async {
        while broker.queue("browsed") != Some((0, 0)) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("queue emptied");
    broker.stop().await;
}
