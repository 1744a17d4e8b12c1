//! AMQP 1.0 transactions over real sockets: a coordinator link with
//! declare/discharge; transactional sends and acquisitions commit atomically
//! (durably, across a restart) or roll back.

mod common;

use std::time::Duration;

use common::amqp::{self, durable, recv, send_accepted, WAIT};
use common::TestBroker;
use fe2o3_amqp::link::delivery::Delivery;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::transaction::{
    Controller, Transaction, TransactionAcquisition, TransactionDischarge, TransactionPosting,
    TransactionRetirement,
};

fn delivery_count(d: &Delivery<String>) -> u32 {
    d.message().header.as_ref().map_or(0, |h| h.delivery_count)
}

/// Attaches the transaction coordinator link (`ctrl`); panics if refused.
async fn coordinator(session: &mut SessionHandle<()>) -> Controller {
    Controller::attach(session, "ctrl")
        .await
        .expect("coordinator")
}

/// Declares a transaction on `controller`; panics if the broker refuses.
async fn declare(controller: &Controller) -> Transaction<'_> {
    Transaction::declare(controller, None)
        .await
        .expect("declare")
}

#[tokio::test]
async fn transactional_sends_commit_atomically_and_durably() {
    let mut broker = TestBroker::start().await;
    {
        let (mut conn, mut session) = amqp::connect_session(&broker, "txn-send").await;
        let controller = coordinator(&mut session).await;
        let mut a = amqp::sender(&mut session, "a", "/queue/ta").await;
        let mut b = amqp::sender(&mut session, "b", "/queue/tb").await;
        let txn = declare(&controller).await;
        for (to_a, text) in [(true, "a1"), (false, "b1"), (true, "a2")] {
            let s = if to_a { &mut a } else { &mut b };
            txn.post(s, durable(text))
                .await
                .expect("post")
                .accepted_or_else(|o| o)
                .expect("transactional accept");
        }
        // Staged: nothing visible before the discharge.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(broker.depth("ta").0 + broker.depth("tb").0, 0);
        txn.commit().await.expect("commit");
        assert_eq!(broker.depth("ta").0, 2);
        assert_eq!(broker.depth("tb").0, 1);
        controller.close().await.expect("close controller");
        conn.close().await.expect("close");
    }
    // The commit was durable.
    broker.restart().await;
    assert_eq!(broker.depth("ta").0, 2);
    assert_eq!(broker.depth("tb").0, 1);
    let (mut conn, mut session) = amqp::connect_session(&broker, "check").await;
    let mut r = amqp::receiver(&mut session, "r", "/queue/ta").await;
    for text in ["a1", "a2"] {
        let d = recv::<String>(&mut r).await;
        assert_eq!(d.body(), text);
        r.accept(&d).await.expect("accept");
    }
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn transactional_sends_roll_back() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "txn-rb").await;
    let controller = coordinator(&mut session).await;
    let mut s = amqp::sender(&mut session, "s", "/queue/rb").await;
    let txn = declare(&controller).await;
    for text in ["x", "y"] {
        txn.post(&mut s, durable(text)).await.expect("post");
    }
    txn.rollback().await.expect("rollback");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("rb"), (0, 0));
    // The link and the coordinator still work: a later transaction commits.
    let txn = declare(&controller).await;
    txn.post(&mut s, durable("z")).await.expect("post");
    txn.commit().await.expect("commit");
    assert_eq!(broker.depth("rb").0, 1);
    let mut r = amqp::receiver(&mut session, "r", "/queue/rb").await;
    let d = recv::<String>(&mut r).await;
    assert_eq!(d.body(), "z");
    r.accept(&d).await.expect("accept");
    controller.close().await.expect("close controller");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn transactional_acceptance_commits_or_rolls_back() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "txn-ack").await;
    let controller = coordinator(&mut session).await;
    let mut s = amqp::sender(&mut session, "s", "/queue/acq").await;
    for text in ["m1", "m2"] {
        send_accepted(&mut s, durable(text)).await;
    }
    let mut r = amqp::manual_receiver(&mut session, "r", "/queue/acq").await;
    r.set_credit(2).await.expect("credit");
    let d1 = recv::<String>(&mut r).await;
    let d2 = recv::<String>(&mut r).await;

    // Accepted inside a transaction that rolls back: not consumed.
    let txn = declare(&controller).await;
    txn.accept(&mut r, &d1).await.expect("txn accept");
    txn.accept(&mut r, &d2).await.expect("txn accept");
    txn.rollback().await.expect("rollback");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        broker.depth("acq"),
        (2, 0),
        "a rollback returns the messages its acknowledgements held"
    );
    // Redelivered as failed attempts, as a JMS rollback redelivers them.
    r.set_credit(2).await.expect("credit");
    let d1 = recv::<String>(&mut r).await;
    assert_eq!((d1.body().as_str(), delivery_count(&d1)), ("m1", 1));
    let d2 = recv::<String>(&mut r).await;
    assert_eq!((d2.body().as_str(), delivery_count(&d2)), ("m2", 1));

    // A committed transactional accept consumes.
    let txn = declare(&controller).await;
    txn.accept(&mut r, &d1).await.expect("txn accept");
    txn.commit().await.expect("commit");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("acq"), (0, 1), "m1 consumed, m2 still held");
    r.accept(&d2).await.expect("plain accept");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("acq"), (0, 0));
    controller.close().await.expect("close controller");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn transactional_acquisition_with_send_in_one_transaction() {
    // Move a message from one queue to another atomically: acquire and
    // accept from `src`, post to `dst`, commit.
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "txn-move").await;
    let controller = coordinator(&mut session).await;
    let mut s = amqp::sender(&mut session, "s", "/queue/src").await;
    send_accepted(&mut s, durable("moving")).await;
    let mut out = amqp::sender(&mut session, "out", "/queue/dst").await;
    let mut r = amqp::manual_receiver(&mut session, "r", "/queue/src").await;
    let txn = declare(&controller).await;
    txn.post(&mut out, durable("moved")).await.expect("post");
    let mut acq = txn
        .acquire(&mut r, 1)
        .await
        .expect("transactional acquisition");
    let d = tokio::time::timeout(WAIT, acq.recv::<String>())
        .await
        .expect("acquired in time")
        .expect("recv");
    assert_eq!(d.body(), "moving");
    acq.accept(&d).await.expect("txn accept");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("dst").0, 0, "staged send invisible");
    acq.commit().await.expect("commit");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("src"), (0, 0));
    assert_eq!(broker.depth("dst").0, 1);
    // Nothing more arrives on the acquisition link without new credit.
    amqp::recv_nothing(&mut r).await;
    controller.close().await.expect("close controller");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn transactional_acquisition_by_flow_rolls_back_to_the_queue() {
    // fe2o3's `acquire` puts the txn-id in the receiver's flow (spec
    // 4.4.3): everything delivered then belongs to the transaction, whether
    // or not the client disposed it, and a rollback gives it all back.
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "txn-acquire").await;
    let controller = coordinator(&mut session).await;
    let mut s = amqp::sender(&mut session, "s", "/queue/acq2").await;
    for text in ["a1", "a2"] {
        send_accepted(&mut s, durable(text)).await;
    }
    let mut r = amqp::manual_receiver(&mut session, "r", "/queue/acq2").await;
    let txn = declare(&controller).await;
    let mut acq = txn.acquire(&mut r, 2).await.expect("acquire");
    let a1 = tokio::time::timeout(WAIT, acq.recv::<String>())
        .await
        .expect("in time")
        .expect("recv");
    let a2 = tokio::time::timeout(WAIT, acq.recv::<String>())
        .await
        .expect("in time")
        .expect("recv");
    assert_eq!((a1.body().as_str(), a2.body().as_str()), ("a1", "a2"));
    // Only the first is accepted (inside the transaction); the second is
    // merely acquired.
    acq.accept(&a1).await.expect("txn accept");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("acq2"), (0, 2));
    acq.rollback().await.expect("rollback");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("acq2"), (2, 0), "both back on the queue");

    // Acquired again and committed: consumed.
    let txn = declare(&controller).await;
    let mut acq = txn.acquire(&mut r, 2).await.expect("acquire");
    for want in ["a1", "a2"] {
        let d = tokio::time::timeout(WAIT, acq.recv::<String>())
            .await
            .expect("in time")
            .expect("recv");
        assert_eq!((d.body().as_str(), delivery_count(&d)), (want, 1));
        acq.accept(&d).await.expect("txn accept");
    }
    acq.commit().await.expect("commit");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("acq2"), (0, 0));
    controller.close().await.expect("close controller");
    conn.close().await.expect("close");
    broker.stop().await;
}
