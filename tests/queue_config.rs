//! `[[queues]]` end to end: a queue's own dead-letter address and delivery
//! attempts as a STOMP client sees them, and the settings in `/metrics`,
//! kept across a restart and changed by a changed configuration.

mod common;

use std::sync::Arc;

use common::stomp::StompClient;
use common::{http_get, TestBroker};
use rosetta::config::{Config, ListenAddr, ListenerKind, QueueEntry};

/// The `[[queues]]` entries of a configuration text (parsed as a file
/// would be, so the test goes through the same checks).
fn queues(text: &str) -> Vec<QueueEntry> {
    Config::parse(text, "test.toml")
        .unwrap_or_else(|e| panic!("{e}"))
        .queues
}

/// NACKs the next `times` messages.
async fn nack_times(c: &mut StompClient, times: usize) {
    for _ in 0..times {
        let m = c.message().await;
        c.request("NACK", &[("id", &m.ack_id())], b"").await;
    }
}

/// `orders` gives up after its own 2 attempts and dead-letters into its own
/// address; `other` keeps the broker's 3 attempts and `DLQ`.
#[tokio::test]
async fn a_queue_dead_letters_by_its_own_attempts_and_address() {
    let broker = TestBroker::start_with(
        |c| {
            c.broker.delivery_attempts_max = 3;
            c.queues = queues(
                "[[queues]]\nname = \"/queue/orders\"\ndelivery_attempts_max = 2\ndead_letter_address = \"/queue/orders.dead\"\n",
            );
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/queue/orders", &[("x-k", "o")], b"order")
        .await;
    p.send_persistent("/queue/other", &[], b"other").await;

    let mut orders = StompClient::connect(broker.stomp(), &[]).await;
    orders
        .subscribe("s", "/queue/orders", "client-individual", &[])
        .await;
    nack_times(&mut orders, 2).await;
    orders.expect_nothing().await;
    assert_eq!(broker.queue("orders"), Some((0, 0)));

    let mut other = StompClient::connect(broker.stomp(), &[]).await;
    other
        .subscribe("s", "/queue/other", "client-individual", &[])
        .await;
    nack_times(&mut other, 2).await;
    let third = other.message().await;
    assert_eq!(
        (third.text().as_str(), third.header("delivery-count")),
        ("other", Some("2")),
        "the broker's 3 attempts still hold for `other`"
    );
    assert_eq!(broker.queue("DLQ"), None, "nothing dead-lettered there yet");
    other.request("NACK", &[("id", &third.ack_id())], b"").await;

    let mut dead = StompClient::connect(broker.stomp(), &[]).await;
    dead.subscribe("d", "/queue/orders.dead", "client-individual", &[])
        .await;
    let m = dead.message().await;
    assert_eq!(m.text(), "order");
    assert_eq!(m.header("x-k"), Some("o"));
    assert_eq!(m.header("x-original-queue"), Some("orders"));
    dead.ack(&m).await;
    dead.expect_nothing().await;
    dead.subscribe("b", "/queue/DLQ", "client-individual", &[])
        .await;
    let m = dead.message().await;
    assert_eq!(m.text(), "other");
    assert_eq!(m.header("x-original-queue"), Some("other"));
    broker.stop().await;
}

/// The `rosetta_queue_settings_info` line of `queue` in a scrape.
fn settings_line<'a>(metrics: &'a str, queue: &str) -> Option<&'a str> {
    let prefix = format!("rosetta_queue_settings_info{{queue=\"{queue}\",");
    metrics.lines().find(|l| l.starts_with(&prefix))
}

async fn scrape(broker: &TestBroker) -> String {
    let answer = http_get(broker.addr(ListenerKind::Metrics), "/metrics").await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    answer
}

/// `/metrics` shows each queue's settings in force; a restart with the
/// same configuration gives the recovered queue the same ones, a changed
/// configuration new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_settings_in_force_across_restarts() {
    let mut broker = TestBroker::start_with(
        |c| {
            c.listeners.metrics = Some(ListenAddr::new("127.0.0.1", 0));
            c.queues = queues(
                "[[queues]]\npattern = \"jobs.*\"\nexclusive = true\ndead_letter_address = \"jobs.dead\"\n\n[[queues]]\nname = \"jobs.slow\"\ngroups_max = 50\nvisibility_timeout_ms = 30000\nredelivery_delay_ms = 250\nredelivery_multiplier = 1.5\ndedup_window_s = 60\nlast_value_key = \"sym\"\n",
            );
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    for q in ["/queue/jobs.slow", "/queue/plain"] {
        p.send_persistent(q, &[], b"m").await;
    }
    p.disconnect().await;
    let slow = "rosetta_queue_settings_info{queue=\"jobs.slow\",exclusive=\"true\",dead_letter_address=\"jobs.dead\",delivery_attempts_max=\"10\",groups_max=\"50\",visibility_timeout_ms=\"30000\",redelivery_delay_ms=\"250\",redelivery_multiplier=\"1.5\",redelivery_delay_max_ms=\"2500\",dedup_window_s=\"60\",dedup=\"id\",dedup_ids_max=\"100000\",last_value_key=\"sym\"} 1";
    let plain = "rosetta_queue_settings_info{queue=\"plain\",exclusive=\"false\",dead_letter_address=\"DLQ\",delivery_attempts_max=\"10\",groups_max=\"100000\",visibility_timeout_ms=\"\",redelivery_delay_ms=\"0\",redelivery_multiplier=\"1\",redelivery_delay_max_ms=\"0\",dedup_window_s=\"\",dedup=\"id\",dedup_ids_max=\"100000\",last_value_key=\"\"} 1";
    let metrics = scrape(&broker).await;
    assert!(
        metrics.contains("# TYPE rosetta_queue_settings_info gauge\n"),
        "{metrics}"
    );
    assert_eq!(
        settings_line(&metrics, "jobs.slow"),
        Some(slow),
        "{metrics}"
    );
    assert_eq!(settings_line(&metrics, "plain"), Some(plain), "{metrics}");
    // The queue-semantics counters are there for every queue too.
    for line in [
        "rosetta_queue_groups{queue=\"plain\"} 0",
        "rosetta_queue_selector_evaluations_total{queue=\"plain\"} 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}: {metrics}");
    }

    broker.restart().await;
    let metrics = scrape(&broker).await;
    assert_eq!(
        settings_line(&metrics, "jobs.slow"),
        Some(slow),
        "recovered with the same settings: {metrics}"
    );

    broker.config.queues = queues("[[queues]]\nname = \"jobs.slow\"\ndelivery_attempts_max = 4\n");
    broker.restart().await;
    let metrics = scrape(&broker).await;
    assert_eq!(
        settings_line(&metrics, "jobs.slow"),
        Some("rosetta_queue_settings_info{queue=\"jobs.slow\",exclusive=\"false\",dead_letter_address=\"DLQ\",delivery_attempts_max=\"4\",groups_max=\"100000\",visibility_timeout_ms=\"\",redelivery_delay_ms=\"0\",redelivery_multiplier=\"1\",redelivery_delay_max_ms=\"0\",dedup_window_s=\"\",dedup=\"id\",dedup_ids_max=\"100000\",last_value_key=\"\"} 1"),
        "the changed configuration applies at the restart: {metrics}"
    );
    assert_eq!(broker.queue("jobs.slow"), Some((1, 0)), "its message kept");
    broker.stop().await;
}
