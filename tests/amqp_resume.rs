//! AMQP 1.0 link recovery over real sockets: a client re-attaching a
//! durable receiver after a broker restart or a reconnect (fe2o3-amqp's
//! `resume_on_session`, the way Qpid JMS re-attaches a durable subscriber),
//! and resuming a detached link on its session with a non-empty `unsettled`
//! map (fe2o3-amqp's `resume`; on a new session fe2o3 sends a null map, as
//! it treats that as a re-attach).
//!
//! The broker does not resume deliveries (spec 2.6.13): it answers with a
//! null `unsettled` map and `incomplete-unsettled` false, and the messages
//! the old link left unsettled come again as new, unsettled deliveries —
//! not lost, and not settled on the client's behalf.

mod common;

use std::time::Duration;

use common::amqp::{self, durable_source, recv, WAIT};
use common::TestBroker;
use fe2o3_amqp::link::receiver::ResumingReceiver;
use fe2o3_amqp::{Receiver, Session};

const SUB_QUEUE: &str = "$durable/resumer/sub";
const NEWS: &str = "/topic/resume/news";

#[tokio::test]
async fn durable_subscriber_reattached_after_a_restart() {
    let mut broker = TestBroker::start().await;
    let mut conn = amqp::connect(&broker, "resumer").await;
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let mut r = amqp::manual_receiver(&mut session, "sub", durable_source(NEWS)).await;
    amqp::publish_durable(&broker, "publisher", NEWS, &["m0", "m1", "m2", "m3"]).await;
    r.set_credit(3).await.expect("credit");
    let d0 = recv::<String>(&mut r).await;
    let d1 = recv::<String>(&mut r).await;
    let d2 = recv::<String>(&mut r).await;
    assert_eq!(
        (d0.body().as_str(), d1.body().as_str(), d2.body().as_str()),
        ("m0", "m1", "m2")
    );
    // m0 is done; m1 and m2 stay unsettled in the client's map; m3 is
    // still in the queue.
    r.accept(&d0).await.expect("accept");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(SUB_QUEUE), Some((1, 2)));

    broker.restart().await;
    // The old session is gone: detaching only gives us the link back.
    let detached = match tokio::time::timeout(WAIT, r.detach()).await {
        Ok(Ok(d)) | Ok(Err((d, _))) => d,
        Err(_) => panic!("detach of a dead link returns"),
    };
    let mut conn = amqp::connect(&broker, "resumer").await;
    let session = Session::begin(&mut conn).await.expect("begin");
    let resumed = tokio::time::timeout(WAIT, detached.resume_on_session(&session))
        .await
        .expect("resume in time")
        .expect("resume");
    // Our reply carries no unsettled map: nothing to resume, link complete.
    let ResumingReceiver::Complete(mut r) = resumed else {
        panic!("expected a complete re-attach, got another resumption state")
    };
    r.set_credit(10).await.expect("credit");
    // The two unsettled ones come again (new deliveries, unsettled),
    // then m3; nothing was lost or settled for the client.
    let got = amqp::recv_n::<String>(&mut r, 3).await;
    let bodies: Vec<&str> = got.iter().map(|d| d.body().as_str()).collect();
    assert_eq!(bodies, ["m1", "m2", "m3"]);
    // Nothing else: m0 was consumed before the restart.
    amqp::recv_nothing(&mut r).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        broker.queue(SUB_QUEUE),
        Some((0, 3)),
        "redelivered unsettled: held until the client decides"
    );
    for d in &got {
        r.accept(d).await.expect("accept");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(SUB_QUEUE), Some((0, 0)));
    // Detach (not close) keeps the subscription for the next time.
    if let Err((_, e)) = r.detach().await {
        panic!("detach: {e:?}");
    }
    conn.close().await.expect("close");
    assert!(broker.queue(SUB_QUEUE).is_some());
    broker.stop().await;
}

#[tokio::test]
async fn durable_subscriber_taken_over_by_a_new_connection() {
    // The old connection dies (the client reconnects after a network
    // failure; the broker sees the socket close): its unsettled deliveries
    // go back to the queue and reach the resumed link.
    let broker = TestBroker::start().await;
    let mut conn = amqp::connect(&broker, "resumer").await;
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let mut r = amqp::manual_receiver(&mut session, "sub", durable_source(NEWS)).await;
    amqp::publish_durable(&broker, "publisher", NEWS, &["n0", "n1"]).await;
    r.set_credit(2).await.expect("credit");
    let _n0 = recv::<String>(&mut r).await;
    let _n1 = recv::<String>(&mut r).await;
    // A second connection with the same container id takes over: the
    // broker closes the first one (connection:forced), as a reconnecting
    // client whose old socket is half-dead would see.
    let mut conn2 = amqp::connect(&broker, "resumer").await;
    let session2 = Session::begin(&mut conn2).await.expect("begin");
    let detached = match tokio::time::timeout(WAIT, r.detach()).await {
        Ok(Ok(d)) | Ok(Err((d, _))) => d,
        Err(_) => panic!("detach returns"),
    };
    let resumed = tokio::time::timeout(WAIT, detached.resume_on_session(&session2))
        .await
        .expect("resume in time")
        .expect("resume");
    let ResumingReceiver::Complete(mut r) = resumed else {
        panic!("expected a complete re-attach")
    };
    r.set_credit(5).await.expect("credit");
    let a = recv::<String>(&mut r).await;
    let b = recv::<String>(&mut r).await;
    assert_eq!((a.body().as_str(), b.body().as_str()), ("n0", "n1"));
    r.accept(&a).await.expect("accept");
    r.accept(&b).await.expect("accept");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(SUB_QUEUE), Some((0, 0)));
    drop(session);
    let _ = conn.close().await;
    conn2.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn detached_link_resumed_with_a_non_empty_unsettled_map() {
    let broker = TestBroker::start().await;
    let mut conn = amqp::connect(&broker, "resumer").await;
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let mut r = amqp::manual_receiver(&mut session, "sub", durable_source(NEWS)).await;
    amqp::publish_durable(&broker, "publisher", NEWS, &["u0", "u1", "u2"]).await;
    r.set_credit(2).await.expect("credit");
    let _u0 = recv::<String>(&mut r).await;
    let _u1 = recv::<String>(&mut r).await;
    // A detach (closed=false) keeps the subscription; the two deliveries
    // stay in the client's unsettled map and go back to the queue here.
    let detached = match r.detach().await {
        Ok(d) => d,
        Err((_, e)) => panic!("detach: {e:?}"),
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(SUB_QUEUE), Some((3, 0)));
    // Resumed on the same session: the attach carries {u0, u1 -> received}.
    let resumed = tokio::time::timeout(WAIT, detached.resume())
        .await
        .expect("resume in time")
        .expect("resume");
    let ResumingReceiver::Complete(mut r) = resumed else {
        panic!("expected a complete re-attach: the broker resumes nothing")
    };
    r.set_credit(10).await.expect("credit");
    let got = amqp::recv_n::<String>(&mut r, 3).await;
    let bodies: Vec<&str> = got.iter().map(|d| d.body().as_str()).collect();
    assert_eq!(bodies, ["u0", "u1", "u2"]);
    // Each message once: nothing more.
    amqp::recv_nothing(&mut r).await;
    for d in &got {
        r.accept(d).await.expect("accept");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(SUB_QUEUE), Some((0, 0)));
    r.close().await.expect("close ends the subscription");
    conn.close().await.expect("close");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(SUB_QUEUE), None);
    broker.stop().await;
}

#[tokio::test]
async fn attaching_the_same_link_name_again_steals_the_old_link() {
    let broker = TestBroker::start().await;
    let mut conn = amqp::connect(&broker, "resumer").await;
    let mut s1 = Session::begin(&mut conn).await.expect("begin");
    let mut s2 = Session::begin(&mut conn).await.expect("begin");
    let mut old = Receiver::builder()
        .name("sub")
        .source(durable_source(NEWS))
        .attach(&mut s1)
        .await
        .expect("first attachment");
    let mut new = Receiver::builder()
        .name("sub")
        .source(durable_source(NEWS))
        .attach(&mut s2)
        .await
        .expect("second attachment of the same name");
    let err = tokio::time::timeout(WAIT, old.recv::<String>())
        .await
        .expect("the old link hears of it")
        .expect_err("the old link is detached");
    assert!(format!("{err:?}").contains("Stolen"), "{err:?}");
    // The subscription itself stays and feeds the new link.
    amqp::publish_durable(&broker, "publisher", NEWS, &["s0"]).await;
    let d = recv::<String>(&mut new).await;
    assert_eq!(d.body(), "s0");
    new.accept(&d).await.expect("accept");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(SUB_QUEUE), Some((0, 0)));
    conn.close().await.expect("close");
    broker.stop().await;
}
