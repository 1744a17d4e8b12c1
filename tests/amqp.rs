//! AMQP 1.0 over real sockets with the fe2o3-amqp client against a real broker.

mod common;

use common::TestBroker;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};

fn url(broker: &TestBroker) -> String {
    format!("amqp://{}", broker.amqp())
}

#[tokio::test]
async fn send_and_receive_on_a_queue() {
    let broker = TestBroker::start().await;
    let mut conn = Connection::open("test-conn", url(&broker).as_str())
        .await
        .expect("open");
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let mut sender = Sender::attach(&mut session, "sender", "/queue/orders")
        .await
        .expect("attach sender");
    let outcome = sender.send("hello amqp").await.expect("send");
    outcome.accepted_or_else(|o| o).expect("accepted");

    let mut receiver = Receiver::attach(&mut session, "receiver", "/queue/orders")
        .await
        .expect("attach receiver");
    let delivery: fe2o3_amqp::link::delivery::Delivery<String> =
        receiver.recv().await.expect("recv");
    assert_eq!(delivery.body(), "hello amqp");
    receiver.accept(&delivery).await.expect("accept");
    receiver.close().await.expect("close receiver");
    sender.close().await.expect("close sender");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    assert_eq!(
        broker
            .core()
            .queue_stats("orders")
            .map(|s| (s.depth, s.in_flight)),
        Some((0, 0))
    );
    broker.stop().await;
}
