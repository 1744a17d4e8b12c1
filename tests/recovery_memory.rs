//! A restart of a deep queue under a small memory budget: recovery reads
//! the queued messages back from the journal one at a time and the queue
//! pages them as they come, so the restart never holds the queue in memory.
//! Every message comes back in order, exactly once, with its delivery count
//! and annotation, while compaction (which would move them) waits for the
//! restore and then catches up.
//!
//! The restart runs in a child process (this test binary again), so its
//! peak resident memory is its own. The bound asserted on it is loose (half
//! the queued payload, where the restart needs a few MiB), because RSS is
//! noisy; the exact checks are on the core's counters: memory gauge, paged
//! count, depth.

use std::process::Command;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rosetta::core::{AllowAll, Core, CoreConfig};
use rosetta::store::{Store, StoreConfig};
use rosetta_neutral::*;

/// Queued messages that survive the restart.
const MESSAGES: usize = 20_000;
/// Their body size: 20,000 x 4 KiB = 80 MiB of payload.
const BODY_BYTES: usize = 4096;
/// The smallest budget the server configuration accepts.
const BUDGET_BYTES: u64 = 1024 * 1024;
/// Slack over the budget: one dispatch batch read back from a page file.
const DEPAGE_SLACK_BYTES: u64 = 2 * 1024 * 1024;
/// Small segments, so there are many and compaction has work.
const SEGMENT_BYTES: u64 = 1024 * 1024;
/// The first messages get a failed delivery attempt before the restart.
const FAILED_ONCE: usize = 5;
/// The next ones are in flight with an annotation when their consumer goes
/// (which counts as a delivery attempt).
const ANNOTATED: usize = 5;
/// Env var naming the journal directory: set, the test is the child.
const CHILD_ENV: &str = "ROSETTA_RECOVERY_MEMORY_DIR";
const TEST_NAME: &str = "a_deep_queue_restarts_without_loading_it_and_delivers_all_in_order";

struct Sink(mpsc::Sender<SessionEvent>);

impl EventSink for Sink {
    fn send(&self, event: SessionEvent) {
        let _ = self.0.send(event);
    }
}

fn info() -> SessionInfo {
    SessionInfo {
        conn_id: 1,
        protocol: Protocol::Internal,
        principal: Principal::anonymous(),
        client_id: None,
        take_over: false,
    }
}

fn body(i: usize) -> Vec<u8> {
    let mut b = vec![(i % 251) as u8; BODY_BYTES];
    b[..8].copy_from_slice(&(i as u64).to_be_bytes());
    b
}

fn index_of(m: &Message) -> usize {
    let mut n = [0u8; 8];
    n.copy_from_slice(&m.body.bytes[..8]);
    u64::from_be_bytes(n) as usize
}

fn store_config(dir: &std::path::Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.segment_size_bytes = SEGMENT_BYTES;
    c.compaction_interval = Duration::from_millis(50);
    c
}

fn core_config(dir: &std::path::Path) -> CoreConfig {
    CoreConfig {
        memory_budget_bytes: BUDGET_BYTES,
        paging_dir: Some(dir.join("paging")),
        ..CoreConfig::default()
    }
}

fn durable_queue(session: &mut Box<dyn Session>, name: &str) {
    session
        .declare_queue(QueueSpec {
            name: Some(name.into()),
            durable: true,
            lifetime: QueueLifetime::Permanent,
            bindings_max: None,
        })
        .expect("declare");
}

fn publish(session: &mut Box<dyn Session>, queue: &str, body: Vec<u8>) {
    let mut m = Message::binary(body);
    m.durable = true;
    session
        .publish(&Address::Queue(queue.into()), m, PublishOptions::default())
        .expect("publish");
}

fn delivery(rx: &mpsc::Receiver<SessionEvent>) -> Delivery {
    loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(SessionEvent::Delivery(d)) => return d,
            Ok(_) => continue,
            Err(e) => panic!("no delivery: {e}"),
        }
    }
}

/// Fills the journal: the deep queue, interleaved with as much churn that
/// is consumed again (so the segments are half dead and compaction wants
/// to rewrite them), plus delivery state on the first messages.
fn fill(dir: &std::path::Path) {
    let (store, recovered) = Store::open(store_config(dir)).expect("open store");
    let store = Arc::new(store);
    let core = Core::new(
        core_config(dir),
        store.clone(),
        Arc::new(AllowAll),
        Some(recovered),
    );
    let (tx, rx) = mpsc::channel();
    let mut session = core.open_session(info(), Arc::new(Sink(tx)));
    durable_queue(&mut session, "deep");
    durable_queue(&mut session, "churn");
    for i in 0..MESSAGES {
        publish(&mut session, "deep", body(i));
        publish(&mut session, "churn", body(i));
    }
    let churn = session
        .consume(ConsumerSpec {
            queue: "churn".into(),
            credit: CreditMode::Window(256),
            auto_settle: true,
            options: Default::default(),
        })
        .expect("consume churn");
    for _ in 0..MESSAGES {
        let d = delivery(&rx);
        assert_eq!(d.consumer, churn);
    }
    session.cancel(churn).expect("cancel churn");

    let deep = session
        .consume(ConsumerSpec {
            queue: "deep".into(),
            credit: CreditMode::Explicit((FAILED_ONCE + ANNOTATED) as u32),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume deep");
    for i in 0..FAILED_ONCE + ANNOTATED {
        let d = delivery(&rx);
        assert_eq!(index_of(&d.message), i);
        if i < FAILED_ONCE {
            let failed = Outcome::Modify {
                delivery_failed: true,
                undeliverable_here: false,
            };
            session
                .settle(deep, d.tag, failed, None, false)
                .expect("modify");
        } else {
            session
                .annotate(deep, d.tag, Bytes::from(format!("ann-{i}")))
                .expect("annotate");
        }
    }
    // The annotated ones go back unsettled.
    session.cancel(deep).expect("cancel deep");
    store.flush().expect("flush");
    let stats = core.queue_stats("deep").expect("deep");
    assert_eq!(stats.depth, MESSAGES as u64);
    drop(session);
    core.shutdown();
}

/// A field of /proc/self/status in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The child: restart on `dir`, check everything, print the peak growth.
fn restart_and_check(dir: &std::path::Path) {
    // Resets VmHWM to the current RSS (Linux 4.0+), so the peak read after
    // is the restart's own.
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
    let before_kib = status_kib("VmRSS:");
    let (store, recovered) = Store::open(store_config(dir)).expect("reopen store");
    assert_eq!(recovered.messages.len(), MESSAGES);
    let store = Arc::new(store);
    let core = Core::new(
        core_config(dir),
        store.clone(),
        Arc::new(AllowAll),
        Some(recovered),
    );
    let peak_growth_kib = status_kib("VmHWM:").saturating_sub(before_kib);

    let stats = core.queue_stats("deep").expect("deep recovered");
    assert_eq!(stats.depth, MESSAGES as u64, "every message is back");
    assert!(
        core.memory_used() <= BUDGET_BYTES + BODY_BYTES as u64 * 2,
        "restored queues hold {} bytes in memory for a {BUDGET_BYTES}-byte budget",
        core.memory_used()
    );
    let resident_max = (BUDGET_BYTES as usize / BODY_BYTES) + 1;
    assert!(
        stats.paged as usize >= MESSAGES - resident_max,
        "only {} of {MESSAGES} paged: more than the budget is resident",
        stats.paged
    );

    // Compaction was held off during the restore and catches up now: the
    // churn's half-dead segments are rewritten.
    store.compact().expect("compact");
    assert!(
        store.stats().segments_rewritten > 0,
        "compaction rewrote nothing after the restore: {:?}",
        store.stats()
    );

    let (tx, rx) = mpsc::channel();
    let mut session = core.open_session(info(), Arc::new(Sink(tx)));
    let deep = session
        .consume(ConsumerSpec {
            queue: "deep".into(),
            credit: CreditMode::Window(256),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume deep");
    for i in 0..MESSAGES {
        let d = delivery(&rx);
        let got = index_of(&d.message);
        assert_eq!(got, i, "message {i} out of order (got {got})");
        assert!(
            d.message.body.bytes[..] == body(i)[..],
            "message {i} differs"
        );
        if i < FAILED_ONCE {
            assert_eq!(d.delivery_count, 1, "message {i}: its failed attempt");
            assert!(d.redelivered);
        } else if i < FAILED_ONCE + ANNOTATED {
            // Its consumer went away with it unsettled: one attempt.
            assert_eq!(d.delivery_count, 1, "message {i}");
            assert_eq!(d.annotation, Some(Bytes::from(format!("ann-{i}"))));
            assert!(d.redelivered);
        } else {
            assert_eq!((d.delivery_count, d.redelivered), (0, false), "message {i}");
            assert!(d.annotation.is_none());
        }
        if i % 1000 == 0 {
            // The memory gauge stays bounded while the queue drains.
            assert!(core.memory_used() <= BUDGET_BYTES + DEPAGE_SLACK_BYTES);
        }
        session
            .settle(deep, d.tag, Outcome::Accept, None, false)
            .expect("ack");
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "nothing beyond the {MESSAGES} messages"
    );
    let stats = core.queue_stats("deep").expect("deep");
    assert_eq!((stats.depth, stats.paged, stats.in_flight), (0, 0, 0));
    store.flush().expect("flush");
    println!("peak_growth_kib={peak_growth_kib}");
    drop(session);
    core.shutdown();
}

#[test]
fn a_deep_queue_restarts_without_loading_it_and_delivers_all_in_order() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        restart_and_check(std::path::Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    fill(dir.path());
    let out = Command::new(std::env::current_exe().expect("current exe"))
        .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .output()
        .expect("run the restart child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "restart child failed:\n{stdout}\n{stderr}"
    );
    let peak_kib: u64 = stdout
        .lines()
        .find_map(|l| l.split("peak_growth_kib=").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("the child printed no peak:\n{stdout}\n{stderr}"));
    let payload_kib = (MESSAGES * BODY_BYTES / 1024) as u64;
    println!("restart of {MESSAGES} x {BODY_BYTES} B: peak RSS growth {peak_kib} KiB ({payload_kib} KiB of payload)");
    assert!(
        peak_kib < payload_kib / 2,
        "the restart grew the process by {peak_kib} KiB for {payload_kib} KiB of queued payload: it loaded the queue"
    );
}
