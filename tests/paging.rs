//! Paging over a real broker: past `[store] memory_budget_bytes`, a queue's
//! persistent messages wait on disk, memory stays within the budget, and
//! every message comes back, in order and byte for byte, also after a
//! restart (the journal rebuilds the queue, which pages again).

mod common;

use std::sync::Arc;

use common::stomp::StompClient;
use common::TestBroker;

/// The smallest budget the configuration accepts.
const BUDGET_BYTES: u64 = 1024 * 1024;
/// Four times the budget in 1 KiB bodies.
const MESSAGES: usize = 4_000;
/// Slack over the budget: a dispatch batch read back from disk.
const DEPAGE_SLACK_BYTES: u64 = 2 * 1024 * 1024;

fn body(i: usize) -> Vec<u8> {
    let mut b = format!("{i:06}:").into_bytes();
    b.extend((0..1024 - 7).map(|j| ((i * 31 + j) % 251) as u8));
    b
}

fn assert_paged(broker: &TestBroker, when: &str) {
    let core = broker.core();
    let stats = core.queue_stats("paging").expect("queue exists");
    assert_eq!(stats.depth, MESSAGES as u64, "{when}: depth");
    assert!(
        stats.paged as usize > MESSAGES / 2,
        "{when}: only {} of {MESSAGES} paged",
        stats.paged
    );
    assert!(
        core.memory_used() <= BUDGET_BYTES + DEPAGE_SLACK_BYTES,
        "{when}: {} bytes in memory for a {BUDGET_BYTES} byte budget",
        core.memory_used()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_over_the_memory_budget_pages_and_loses_nothing_across_a_restart() {
    let mut broker = TestBroker::start_with(
        |c| c.store.memory_budget_bytes = BUDGET_BYTES,
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let mut producer = StompClient::connect(broker.stomp(), &[]).await;
    // Pipelined: every SEND asks for a receipt, and all are awaited after.
    for i in 0..MESSAGES {
        let receipt = format!("p{i}");
        producer
            .send_frame(
                "SEND",
                &[
                    ("destination", "/queue/paging"),
                    ("persistent", "true"),
                    ("content-type", "application/octet-stream"),
                    ("receipt", &receipt),
                ],
                &body(i),
            )
            .await;
    }
    for i in 0..MESSAGES {
        producer.expect_receipt(&format!("p{i}")).await;
    }
    producer.disconnect().await;
    assert_paged(&broker, "before restart");

    broker.restart().await;
    assert_paged(&broker, "after restart");

    let mut consumer = StompClient::connect(broker.stomp(), &[]).await;
    consumer
        .subscribe(
            "s",
            "/queue/paging",
            "client-individual",
            &[("activemq.prefetchSize", "200")],
        )
        .await;
    for i in 0..MESSAGES {
        let m = consumer.message().await;
        assert!(m.body == body(i), "message {i} differs");
        consumer.ack(&m).await;
    }
    consumer.expect_nothing().await;
    consumer.disconnect().await;
    let stats = broker.core().queue_stats("paging").expect("queue");
    assert_eq!((stats.depth, stats.paged, stats.in_flight), (0, 0, 0));
    broker.stop().await;
}
