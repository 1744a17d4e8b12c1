//! STOMP over real sockets against a real broker.

mod common;

use common::stomp::StompClient;
use common::TestBroker;

#[tokio::test]
async fn send_and_receive_on_a_queue_with_receipts() {
    let broker = TestBroker::start().await;
    let mut consumer = StompClient::connect(broker.stomp(), &[]).await;
    consumer
        .send_frame(
            "SUBSCRIBE",
            &[
                ("id", "s1"),
                ("destination", "/queue/work"),
                ("ack", "client-individual"),
                ("receipt", "r-sub"),
            ],
            b"",
        )
        .await;
    assert_eq!(
        consumer.recv().await.expect("receipt").header("receipt-id"),
        Some("r-sub")
    );

    let mut producer = StompClient::connect(broker.stomp(), &[]).await;
    producer
        .send_frame(
            "SEND",
            &[
                ("destination", "/queue/work"),
                ("persistent", "true"),
                ("receipt", "r1"),
                ("x-custom", "v"),
            ],
            b"hello\0world",
        )
        .await;
    let receipt = producer.recv().await.expect("receipt");
    assert_eq!(
        (receipt.command.as_str(), receipt.header("receipt-id")),
        ("RECEIPT", Some("r1"))
    );

    let msg = consumer.recv().await.expect("message");
    assert_eq!(msg.command, "MESSAGE");
    assert_eq!(msg.body, b"hello\0world");
    assert_eq!(msg.header("destination"), Some("/queue/work"));
    assert_eq!(msg.header("x-custom"), Some("v"));
    let ack = msg.header("ack").expect("ack header").to_owned();
    consumer
        .send_frame("ACK", &[("id", &ack), ("receipt", "r-ack")], b"")
        .await;
    assert_eq!(
        consumer
            .recv()
            .await
            .expect("ack receipt")
            .header("receipt-id"),
        Some("r-ack")
    );
    assert_eq!(broker.queue("work"), Some((0, 0)));
    broker.stop().await;
}
