//! Scheduled delivery at scale (issue 16): 1,000,000 messages scheduled
//! over 60 s on one queue, in shuffled time order, with a consumer
//! attached. Reports the memory the scheduled messages cost (the core's
//! memory gauge and the process RSS, per message) and the delivery-time
//! error (when the consumer got each message, minus its delivery time):
//! p50, p99, max.
//!
//! `cargo bench -p rosetta-core --bench scheduled`; scale it with
//! `SCHEDULED_COUNT` (messages), `SCHEDULED_SPAN_S` (seconds the times
//! spread over), `SCHEDULED_LEAD_S` (seconds from the start of publishing
//! to the first time, so publishing is over before delivering starts) and
//! `SCHEDULED_BODY_BYTES`. Past `SCHEDULED_BUDGET_BYTES` (default 16 MiB;
//! 0 turns paging off) the bodies wait in page files in a temporary
//! directory, as the broker's do past `memory_budget_bytes`, and only the
//! index entries stay in memory. Not run in CI: a measurement, not a test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rosetta_core::{AllowAll, Core, CoreConfig, NoJournal};
use rosetta_neutral::message::now_ms;
use rosetta_neutral::{
    Address, Broker, ConsumerSpec, CreditMode, EventSink, Message, Principal, Protocol,
    PublishOptions, SessionEvent, SessionInfo,
};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Delivery-time errors in ms, as the consumer sees them.
#[derive(Default)]
struct Lateness {
    errors_ms: Mutex<Vec<i64>>,
    received: AtomicUsize,
}

impl EventSink for Lateness {
    fn send(&self, event: SessionEvent) {
        if let SessionEvent::Delivery(d) = event {
            let now = now_ms() as i64;
            let due = d.message.delivery_time.unwrap_or(0) as i64;
            self.errors_ms.lock().push(now - due);
            self.received.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() {
    let count = env_or("SCHEDULED_COUNT", 1_000_000);
    let span_ms = env_or("SCHEDULED_SPAN_S", 60) * 1000;
    let lead_ms = env_or("SCHEDULED_LEAD_S", 10) * 1000;
    let body_bytes = env_or("SCHEDULED_BODY_BYTES", 100) as usize;
    let budget_bytes = env_or("SCHEDULED_BUDGET_BYTES", 16 * 1024 * 1024);
    let paging_dir = tempfile::tempdir().expect("paging dir");
    let config = CoreConfig {
        memory_budget_bytes: if budget_bytes == 0 {
            u64::MAX / 4
        } else {
            budget_bytes
        },
        paging_dir: (budget_bytes > 0).then(|| paging_dir.path().to_owned()),
        ..CoreConfig::default()
    };
    let core = Core::new(config, Arc::new(NoJournal), Arc::new(AllowAll), None);
    let sink = Arc::new(Lateness::default());
    let mut s = core.open_session(
        SessionInfo {
            conn_id: 1,
            protocol: Protocol::Internal,
            principal: Principal::anonymous(),
            client_id: Some("bench".into()),
            take_over: true,
        },
        Arc::clone(&sink) as Arc<dyn EventSink>,
    );
    s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(u32::MAX / 2),
        auto_settle: true,
        options: Default::default(),
    })
    .expect("consume");

    let rss_before = rss_bytes();
    let start_ms = now_ms();
    let first_due = start_ms + lead_ms;
    let address = Address::Queue("q".into());
    let body = vec![b'x'; body_bytes];
    let publishing = Instant::now();
    // Times spread evenly over the span, visited in a shuffled order (a
    // multiplicative permutation of 0..count) so the index is not fed in
    // time order.
    let stride = (0..)
        .map(|k| 7_919 + 2 * k)
        .find(|m| gcd(*m, count) == 1)
        .unwrap_or(1);
    for i in 0..count {
        let slot = (i * stride) % count;
        let mut m = Message::binary(body.clone());
        m.delivery_time = Some(first_due + slot * span_ms / count.max(1));
        s.publish(&address, m, PublishOptions::default())
            .expect("publish");
    }
    let published_in = publishing.elapsed();
    let stats = core.queue_stats("q").unwrap_or_default();
    let rss_scheduled = rss_bytes();
    let gauge = core.memory_used();
    println!(
        "scheduled {count} messages of {body_bytes} B over {} s in {published_in:.2?} (first due {} ms after start)",
        span_ms / 1000,
        lead_ms
    );
    println!(
        "  queue: scheduled {} (on disk {}) depth {}; memory gauge {} B ({} B/message); RSS +{} B ({} B/message)",
        stats.scheduled,
        stats.scheduled_paged,
        stats.depth,
        gauge,
        gauge / count.max(1),
        rss_scheduled.saturating_sub(rss_before),
        rss_scheduled.saturating_sub(rss_before) / count.max(1)
    );
    if now_ms() > first_due {
        println!("  warning: publishing ran past the first delivery time; raise SCHEDULED_LEAD_S");
    }
    let deadline = Instant::now() + Duration::from_millis(lead_ms + span_ms + 30_000);
    while sink.received.load(Ordering::Relaxed) < count as usize && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let rss_delivered = rss_bytes();
    let mut errors = std::mem::take(&mut *sink.errors_ms.lock());
    errors.sort_unstable();
    let early = errors.iter().filter(|e| **e < 0).count();
    println!(
        "  delivered {} of {count}; delivery-time error ms: p50 {} p99 {} max {} (early: {early})",
        errors.len(),
        percentile(&errors, 0.50),
        percentile(&errors, 0.99),
        errors.last().copied().unwrap_or(0),
    );
    println!(
        "  after delivery: memory gauge {} B, paged {}, RSS +{} B over the start",
        core.memory_used(),
        core.messages_paged(),
        rss_delivered.saturating_sub(rss_before)
    );
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
