//! Operations: the shutdown grace period, connection admission (caps on
//! connections that have not authenticated yet) and the metrics listener,
//! over real sockets with real clients.

mod common;

use std::time::{Duration, Instant};

use common::mqtt::{p4, Raw};
use common::TestBroker;
use rosetta::core::AllowAll;
use std::sync::Arc;

/// Payload of each message that fills a subscriber's socket.
const BIG_MESSAGE_BYTES: usize = 512 * 1024;
/// Messages published at a subscriber that does not read: far more than
/// the loopback socket buffers on both sides hold (a few MiB each).
const BIG_MESSAGES: usize = 64;
/// What `shutdown_grace_ms` was stuck at before it was honoured.
const OLD_GRACE_CONSTANT: Duration = Duration::from_secs(5);
/// Slack for the shutdown's own steps (accept loops, journal flush).
const SHUTDOWN_SLACK: Duration = Duration::from_millis(1500);

/// A subscriber that stops reading while a publisher fills its socket, so
/// the broker cannot write its goodbye: the shutdown must wait exactly the
/// configured grace, then cut it.
async fn shutdown_with_a_stuck_subscriber(grace_ms: u64) -> Duration {
    let broker = TestBroker::start_with(
        |c| c.broker.shutdown_grace_ms = grace_ms,
        Arc::new(AllowAll),
    )
    .await;
    let (mut stuck, ack) = Raw::connect4(broker.mqtt(), "stuck", true, 0).await;
    assert_eq!(ack.code, p4::ConnectReturnCode::Success);
    let mut subscribe = p4::Subscribe::new("fill/#", rumqttc::QoS::AtMostOnce);
    subscribe.pkid = 1;
    stuck.send4(p4::Packet::Subscribe(subscribe)).await;
    assert!(matches!(stuck.recv4().await, p4::Packet::SubAck(_)));

    let (mut publisher, ack) = Raw::connect4(broker.mqtt(), "filler", true, 0).await;
    assert_eq!(ack.code, p4::ConnectReturnCode::Success);
    let payload = vec![b'x'; BIG_MESSAGE_BYTES];
    for _ in 0..BIG_MESSAGES {
        let publish = p4::Publish::new("fill/it", rumqttc::QoS::AtMostOnce, payload.clone());
        publisher.send4(p4::Packet::Publish(publish)).await;
    }
    // The publisher's last bytes are routed once it is answered.
    publisher.send4(p4::Packet::PingReq).await;
    assert!(matches!(publisher.recv4().await, p4::Packet::PingResp));
    publisher.shutdown().await;

    let started = Instant::now();
    broker.stop().await;
    let took = started.elapsed();
    drop(stuck);
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_the_configured_grace_for_a_client_that_does_not_read() {
    for grace_ms in [300, 1200] {
        let grace = Duration::from_millis(grace_ms);
        let took = shutdown_with_a_stuck_subscriber(grace_ms).await;
        assert!(
            took >= grace,
            "grace {grace_ms} ms: shutdown took {took:?}, so the subscriber was not stuck"
        );
        assert!(
            took < grace + SHUTDOWN_SLACK && took < OLD_GRACE_CONSTANT,
            "grace {grace_ms} ms: shutdown took {took:?}"
        );
    }
}
