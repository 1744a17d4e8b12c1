//! AMQP 1.0 over real sockets with the fe2o3-amqp client against a real broker.

mod common;

use common::amqp::{self, recv_text, send_accepted};
use common::TestBroker;

#[tokio::test]
async fn send_and_receive_on_a_queue() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "test-conn").await;
    let mut sender = amqp::sender(&mut session, "sender", "/queue/orders").await;
    send_accepted(&mut sender, "hello amqp").await;

    let mut receiver = amqp::receiver(&mut session, "receiver", "/queue/orders").await;
    assert_eq!(recv_text(&mut receiver).await, "hello amqp");
    receiver.close().await.expect("close receiver");
    sender.close().await.expect("close sender");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    assert_eq!(broker.queue("orders"), Some((0, 0)));
    broker.stop().await;
}
