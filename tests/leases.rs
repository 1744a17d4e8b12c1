//! Lease delivery (visibility timeout, issue 16) over real sockets: a lease
//! that runs out while its consumer stays connected, the late
//! acknowledgement that is refused, and renewal, with the raw STOMP client
//! and fe2o3-amqp; and for MQTT `$queue/` members (rumqttc, manual acks),
//! the lease that runs out while connected, goes to another member, and
//! whose late PUBACK is ignored. The broker runs on the system clock, so
//! these wait out short leases for real; the timer logic itself is tested
//! on a manual clock in the core (`src/core/lease_tests.rs`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::amqp::{self, recv_any, send_accepted, text_of, AnyDelivery, WAIT};
use common::stomp::{Frame, StompClient};
use common::TestBroker;
use fe2o3_amqp::types::definitions::Fields;
use fe2o3_amqp::types::messaging::Message;
use fe2o3_amqp::types::primitives::{Symbol, Value};
use fe2o3_amqp::Receiver;
use rosetta::config::Config;

/// Lease of the queue `leased`, in ms.
const LEASE_MS: u64 = 300;

/// A broker whose queue `leased` has a `LEASE_MS` visibility timeout.
async fn leasing_broker() -> TestBroker {
    TestBroker::start_with(
        |c| {
            c.queues = Config::parse(
                &format!("[[queues]]\nname = \"leased\"\nvisibility_timeout_ms = {LEASE_MS}\n"),
                "test.toml",
            )
            .unwrap_or_else(|e| panic!("{e}"))
            .queues;
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await
}

/// Sends `command` with a receipt and returns the RECEIPT (MESSAGEs that
/// come first are kept for later reads).
async fn receipt_of(c: &mut StompClient, command: &str, headers: &[(&str, &str)]) -> Frame {
    let mut h = headers.to_vec();
    h.push(("receipt", "r-lease"));
    c.send_frame(command, &h, b"").await;
    let mut held = Vec::new();
    let f = loop {
        let f = c.recv().await.expect("a RECEIPT, not a close");
        if f.command != "MESSAGE" {
            break f;
        }
        held.push(f);
    };
    assert!(
        held.is_empty(),
        "no MESSAGE expected before the RECEIPT: {held:?}"
    );
    assert_eq!(
        (f.command.as_str(), f.header("receipt-id")),
        ("RECEIPT", Some("r-lease")),
        "{f:?}"
    );
    f
}

#[tokio::test]
async fn stomp_a_lease_expires_while_connected_and_the_late_ack_is_refused() {
    let broker = leasing_broker().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/leased", "client-individual", &[])
        .await;
    c.send_persistent("/queue/leased", &[], b"job").await;
    let first = c.message().await;
    assert_eq!(first.header("delivery-count").unwrap_or("0"), "0");

    // Not acknowledged: after the lease it comes again, to the same
    // connected consumer, counted.
    let again = c
        .recv_within(Duration::from_millis(LEASE_MS * 10))
        .await
        .expect("redelivered");
    assert_eq!(again.command, "MESSAGE");
    assert_eq!(again.text(), "job");
    assert_eq!(again.header("delivery-count"), Some("1"));
    assert_ne!(
        again.ack_id(),
        first.ack_id(),
        "a redelivery has its own ack id"
    );

    let late = receipt_of(&mut c, "ACK", &[("id", &first.ack_id())]).await;
    assert_eq!(late.header("lease-expired"), Some("true"), "{late:?}");
    assert_eq!(
        broker.depth("leased"),
        (0, 1),
        "the copy is still in flight"
    );

    let on_time = receipt_of(&mut c, "ACK", &[("id", &again.ack_id())]).await;
    assert_eq!(on_time.header("lease-expired"), None);
    assert_eq!(broker.depth("leased"), (0, 0));
    c.expect_nothing().await;
    c.disconnect().await;
}

#[tokio::test]
async fn stomp_renew_keeps_a_consumers_own_lease_and_a_late_renew_is_told() {
    let broker = TestBroker::start().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe(
        "s",
        "/queue/work",
        "client-individual",
        &[("visibility-timeout", "300")],
    )
    .await;
    c.send_persistent("/queue/work", &[], b"long job").await;
    let m = c.message().await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let r = receipt_of(&mut c, "RENEW", &[("id", &m.ack_id())]).await;
        assert_eq!(r.header("lease-expired"), None, "renewed in time");
    }
    // 750 ms in, well past the first 300 ms deadline: still ours.
    assert_eq!(broker.depth("work"), (0, 1));
    let acked = receipt_of(&mut c, "ACK", &[("id", &m.ack_id())]).await;
    assert_eq!(acked.header("lease-expired"), None);
    assert_eq!(broker.depth("work"), (0, 0));

    c.send_persistent("/queue/work", &[], b"forgotten").await;
    let m = c.message().await;
    let again = c
        .recv_within(Duration::from_secs(3))
        .await
        .expect("redelivered");
    assert_eq!(again.text(), "forgotten");
    let late = receipt_of(&mut c, "RENEW", &[("id", &m.ack_id())]).await;
    assert_eq!(late.header("lease-expired"), Some("true"));
    c.ack(&again).await;
    c.disconnect().await;
}

/// A receiver from `queue` with `visibility-timeout` (ms) as a link
/// property, or none.
async fn leased_receiver(
    session: &mut fe2o3_amqp::session::SessionHandle<()>,
    name: &str,
    queue: &str,
    lease_ms: Option<u32>,
) -> Receiver {
    let mut b = Receiver::builder().name(name).source(queue);
    if let Some(ms) = lease_ms {
        let mut props = Fields::new();
        props.insert(Symbol::from("visibility-timeout"), Value::Uint(ms));
        b = b.properties(props);
    }
    b.attach(session).await.expect("attach receiver")
}

#[tokio::test]
async fn amqp_an_expired_lease_is_released_redelivered_and_the_late_accept_not_applied() {
    let broker = TestBroker::start().await;
    let (_conn, mut session) = amqp::connect_session(&broker, "lease-amqp").await;
    let mut s = amqp::sender(&mut session, "p", "work").await;
    // Long enough that the copy's own lease outlasts the checks below.
    let mut r = leased_receiver(&mut session, "c", "work", Some(1_000)).await;
    send_accepted(&mut s, Message::builder().value("job".to_string()).build()).await;
    let first: AnyDelivery = recv_any(&mut r).await;
    assert_eq!(text_of(&first), "job");

    let again: AnyDelivery = tokio::time::timeout(WAIT, r.recv())
        .await
        .expect("redelivered within the wait")
        .expect("a delivery");
    assert_eq!(text_of(&again), "job");
    assert_eq!(
        again.message().header.as_ref().map(|h| h.delivery_count),
        Some(1),
        "the expiry counts as a failed attempt"
    );
    // The late accept (fe2o3 may or may not still send it: the broker
    // settled the first delivery as released) is never applied.
    let _ = r.accept(&first).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(broker.depth("work"), (0, 1), "the copy is still in flight");
    r.accept(&again).await.expect("accept the copy");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("work"), (0, 0));
    // The link is still up.
    send_accepted(&mut s, Message::builder().value("next".to_string()).build()).await;
    let next: AnyDelivery = recv_any(&mut r).await;
    assert_eq!(text_of(&next), "next");
    r.accept(&next).await.expect("accept");
}

/// One performative, encoded for a raw frame.
fn performative(p: fe2o3_amqp::types::performatives::Performative) -> Vec<u8> {
    serde_amqp::to_vec(&p).expect("encode performative")
}

/// fe2o3-amqp cannot send a `received` disposition (its receiver only
/// disposes with terminal states), so renewal is sent from a raw client.
#[tokio::test]
async fn amqp_a_received_disposition_renews_the_lease() {
    use common::amqp::{frame, RawAmqp, ATTACH, DISPOSITION, TRANSFER};
    use fe2o3_amqp::types::definitions::{Handle, ReceiverSettleMode, Role, SenderSettleMode};
    use fe2o3_amqp::types::messaging::{DeliveryState, Received, Source};
    use fe2o3_amqp::types::performatives::{Attach, Disposition, Flow, Performative};

    let broker = TestBroker::start().await;
    let (_conn, mut session) = amqp::connect_session(&broker, "lease-producer").await;
    let mut s = amqp::sender(&mut session, "p", "renewed").await;
    send_accepted(&mut s, Message::builder().value("job".to_string()).build()).await;

    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open_and_begin().await;
    let mut props = Fields::new();
    props.insert(Symbol::from("visibility-timeout"), Value::Uint(400));
    let attach = Attach {
        name: "leased".into(),
        handle: Handle(0),
        role: Role::Receiver,
        snd_settle_mode: SenderSettleMode::Unsettled,
        rcv_settle_mode: ReceiverSettleMode::First,
        source: Some(Box::new(Source::builder().address("renewed").build())),
        target: None,
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: None,
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: Some(props),
    };
    assert!(
        raw.write(&frame(0, 0, &performative(Performative::Attach(attach))))
            .await
    );
    raw.expect(ATTACH).await;
    let flow = Flow {
        next_incoming_id: Some(0),
        incoming_window: 100,
        next_outgoing_id: 0,
        outgoing_window: 100,
        handle: Some(Handle(0)),
        delivery_count: Some(0),
        link_credit: Some(10),
        available: None,
        drain: false,
        echo: false,
        properties: None,
    };
    assert!(
        raw.write(&frame(0, 0, &performative(Performative::Flow(flow))))
            .await
    );
    raw.expect(TRANSFER).await;
    // The session's first delivery has delivery id 0.
    let received = Disposition {
        role: Role::Receiver,
        first: 0,
        last: None,
        settled: false,
        state: Some(DeliveryState::Received(Received {
            section_number: 0,
            section_offset: 0,
        })),
        batchable: false,
    };
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let d = performative(Performative::Disposition(received.clone()));
        assert!(raw.write(&frame(0, 0, &d)).await);
    }
    // A second, 1 s in: renewed all along, never released or redelivered.
    match raw.read_frame_within(Duration::from_millis(100)).await {
        Err(common::amqp::RawEnd::Timeout) => {}
        other => panic!("nothing expected while renewed: {other:?}"),
    }
    assert_eq!(broker.depth("renewed"), (0, 1));
    // No more renewals: released, then delivered again.
    raw.expect(DISPOSITION).await;
    raw.expect(TRANSFER).await;
}

/// A 3.1.1 client that acknowledges only when told (rumqttc manual acks),
/// subscribed to `$queue/leased` at QoS 1.
async fn holding_mqtt_member(
    broker: &TestBroker,
    id: &str,
) -> (rumqttc::AsyncClient, rumqttc::EventLoop) {
    let mut opts = common::mqtt::opts4(broker, id);
    opts.set_manual_acks(true);
    let (c, mut ev) = rumqttc::AsyncClient::new(opts, 64);
    common::mqtt::connack4(&mut ev).await;
    common::mqtt::subscribe4(&c, &mut ev, "$queue/leased", rumqttc::QoS::AtLeastOnce).await;
    (c, ev)
}

/// The next PUBLISH within `within`, or `None`.
async fn publish_within(ev: &mut rumqttc::EventLoop, within: Duration) -> Option<rumqttc::Publish> {
    tokio::time::timeout(within, common::mqtt::publish4(ev))
        .await
        .ok()
}

#[tokio::test]
async fn mqtt_a_queue_members_lease_expires_while_connected_and_its_late_puback_is_ignored() {
    let broker = leasing_broker().await;
    let (c, mut ev) = holding_mqtt_member(&broker, "lease-a").await;
    common::mqtt::publish_once4(
        &broker,
        "$queue/leased",
        rumqttc::QoS::AtLeastOnce,
        false,
        b"job",
    )
    .await;
    let first = common::mqtt::publish4(&mut ev).await;
    assert_eq!(&first.payload[..], b"job");

    // Not acknowledged: after the lease it comes again, to the member that
    // is still connected (the only one), as a new PUBLISH.
    let again = publish_within(&mut ev, Duration::from_millis(LEASE_MS * 10))
        .await
        .expect("redelivered after the lease");
    assert_eq!(&again.payload[..], b"job");
    assert_ne!(
        again.pkid, first.pkid,
        "the first packet id is still in use"
    );

    // The late PUBACK is accepted by the protocol and ignored by the queue:
    // the redelivered copy stays in flight.
    c.ack(&first).await.expect("late puback");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        broker.depth("leased"),
        (0, 1),
        "the copy is still in flight"
    );
    c.ack(&again).await.expect("puback");
    let settled = async {
        while broker.depth("leased") != (0, 0) {
            let _ = tokio::time::timeout(Duration::from_millis(20), ev.poll()).await;
        }
    };
    tokio::time::timeout(WAIT, settled)
        .await
        .expect("settled by the on-time PUBACK");
}

#[tokio::test]
async fn mqtt_a_lease_that_runs_out_goes_to_another_queue_member() {
    let broker = leasing_broker().await;
    let (_holder, mut holder_ev) = holding_mqtt_member(&broker, "lease-holder").await;
    common::mqtt::publish_once4(
        &broker,
        "$queue/leased",
        rumqttc::QoS::AtLeastOnce,
        false,
        b"work",
    )
    .await;
    let held = common::mqtt::publish4(&mut holder_ev).await;
    assert_eq!(&held.payload[..], b"work");
    // A second member joins; the holder never acknowledges. Each time the
    // lease runs out the message is offered again, and the other member
    // gets it (its client acknowledges), with the holder still connected.
    let (_worker, mut worker_ev) = common::mqtt::subscriber4(
        &broker,
        "lease-worker",
        true,
        "$queue/leased",
        rumqttc::QoS::AtLeastOnce,
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(LEASE_MS * 20);
    let got = loop {
        tokio::select! {
            p = common::mqtt::publish4(&mut worker_ev) => break p,
            // The holder keeps polling (it stays connected) and keeps
            // ignoring what it gets.
            _ = common::mqtt::publish4(&mut holder_ev) => {}
            _ = tokio::time::sleep_until(deadline) => panic!("never offered to the other member"),
        }
    };
    assert_eq!(&got.payload[..], b"work");
    let acked = async {
        while broker.depth("leased") != (0, 0) {
            tokio::select! {
                _ = worker_ev.poll() => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    };
    tokio::time::timeout(WAIT, acked)
        .await
        .expect("settled by the other member's PUBACK");
}
