//! A restart pages a deep queue by reference into the journal: nothing is
//! copied into page files, and the messages read back after compaction
//! has moved their records are the right ones, in order.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rosetta::core::{codec, AllowAll, Core, CoreConfig};
use rosetta::store::{Record, Store, StoreConfig};
use rosetta_neutral::{
    Broker, ConsumerSpec, CreditMode, EventSink, Message, Outcome, Principal, Protocol,
    QueueLifetime, SessionEvent, SessionInfo,
};

/// Messages kept in the deep queue.
const KEPT: u64 = 3000;
const KEPT_BYTES: usize = 1024;
/// A second queue's messages, acknowledged: they make the segments mostly
/// dead, so compaction rewrites them (moving the kept records).
const DEAD_BYTES: usize = 3 * 1024;
const MEMORY_BUDGET_BYTES: u64 = 512 * 1024;

#[derive(Default)]
struct Sink(Mutex<VecDeque<SessionEvent>>);

impl EventSink for Sink {
    fn send(&self, event: SessionEvent) {
        self.0.lock().push_back(event);
    }
}

fn kept_body(i: u64) -> String {
    let mut s = format!("kept {i:05} ");
    s.push_str(&"k".repeat(KEPT_BYTES - s.len()));
    s
}

fn store_config(dir: &Path, compaction: bool) -> StoreConfig {
    let mut c = StoreConfig::new(dir.join("journal"));
    c.segment_size_bytes = 64 * 1024;
    c.compaction_enabled = compaction;
    c.compaction_interval = Duration::from_secs(3600);
    c.rewrite_min_age = Duration::ZERO;
    c
}

fn fill(dir: &Path) {
    let (store, _) = match Store::open(store_config(dir, false)) {
        Ok(x) => x,
        Err(e) => panic!("open: {e}"),
    };
    let declare = |id, name: &str| codec::queue_declare_record(id, name, QueueLifetime::Permanent);
    store.append(vec![declare(1, "deep"), declare(2, "busy")], None);
    for i in 0..KEPT {
        let mut kept = Message::text(kept_body(i));
        kept.durable = true;
        let mut dead = Message::text("d".repeat(DEAD_BYTES));
        dead.durable = true;
        store.append(
            vec![
                Record::Message {
                    seq: 2 * i + 1,
                    queues: vec![1],
                    body: codec::opaque(&Arc::new(kept)),
                },
                Record::Message {
                    seq: 2 * i + 2,
                    queues: vec![2],
                    body: codec::opaque(&Arc::new(dead)),
                },
            ],
            None,
        );
        store.append(
            vec![Record::Ack {
                queue: 2,
                seq: 2 * i + 2,
            }],
            None,
        );
    }
    if let Err(e) = store.close() {
        panic!("close: {e}");
    }
}

fn page_file_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn a_restart_pages_by_reference_and_reads_back_after_compaction_moved_the_records() {
    let tmp = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    fill(tmp.path());

    let (store, recovered) = match Store::open(store_config(tmp.path(), true)) {
        Ok(x) => x,
        Err(e) => panic!("reopen: {e}"),
    };
    let store = Arc::new(store);
    let paging = tmp.path().join("paging");
    let core = Core::new(
        CoreConfig {
            memory_budget_bytes: MEMORY_BUDGET_BYTES,
            paging_dir: Some(paging.clone()),
            ..CoreConfig::default()
        },
        store.clone(),
        Arc::new(AllowAll),
        Some(recovered),
    );
    let paged = core.messages_paged();
    assert!(
        paged > KEPT / 2,
        "most of the deep queue is paged: {paged} of {KEPT}"
    );
    assert_eq!(
        page_file_bytes(&paging),
        0,
        "the restart copied nothing into page files"
    );

    // The restore is over: compaction rewrites the mostly dead segments,
    // moving the records the paged references point at.
    // One run rewrites a few segments (REWRITE_SEGMENTS_PER_RUN_MAX); the
    // background run at open may or may not have happened yet, so run
    // until several have moved rather than count on it.
    for _ in 0..8 {
        if let Err(e) = store.compact() {
            panic!("compact: {e}");
        }
        if store.stats().segments_rewritten > 5 {
            break;
        }
    }
    let stats = store.stats();
    assert!(
        stats.segments_rewritten > 5,
        "compaction moved records: {stats:?}"
    );

    let sink = Arc::new(Sink::default());
    let mut session = core.open_session(
        SessionInfo {
            conn_id: 1,
            protocol: Protocol::Stomp,
            principal: Principal { user: None },
            client_id: None,
            take_over: false,
        },
        sink.clone(),
    );
    let consumer = match session.consume(ConsumerSpec {
        queue: "deep".into(),
        credit: CreditMode::Window(64),
        auto_settle: false,
        options: Default::default(),
    }) {
        Ok(c) => c,
        Err(e) => panic!("consume: {e}"),
    };
    let mut next = 0u64;
    while next < KEPT {
        let events: Vec<SessionEvent> = sink.0.lock().drain(..).collect();
        assert!(!events.is_empty(), "stalled after {next} messages");
        for e in events {
            let SessionEvent::Delivery(d) = e else {
                continue;
            };
            assert_eq!(
                d.message.body.bytes,
                kept_body(next).as_bytes(),
                "message {next} in order and intact"
            );
            next += 1;
            if let Err(e) = session.settle(consumer, d.tag, Outcome::Accept, None, false) {
                panic!("settle: {e}");
            }
        }
    }
    assert_eq!(core.messages_paged(), 0);
    assert_eq!(core.queue_stats("deep").map(|s| s.depth), Some(0));
    drop(session);
    core.shutdown();
}

#[test]
fn messages_paged_at_run_time_still_go_to_page_files() {
    let tmp = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    let (store, recovered) = match Store::open(store_config(tmp.path(), false)) {
        Ok(x) => x,
        Err(e) => panic!("open: {e}"),
    };
    let paging = tmp.path().join("paging");
    let core = Core::new(
        CoreConfig {
            memory_budget_bytes: MEMORY_BUDGET_BYTES,
            paging_dir: Some(paging.clone()),
            ..CoreConfig::default()
        },
        Arc::new(store),
        Arc::new(AllowAll),
        Some(recovered),
    );
    let sink = Arc::new(Sink::default());
    let mut session = core.open_session(
        SessionInfo {
            conn_id: 1,
            protocol: Protocol::Stomp,
            principal: Principal { user: None },
            client_id: None,
            take_over: false,
        },
        sink,
    );
    let address = rosetta_neutral::Address::Queue("fresh".into());
    for i in 0..1000 {
        let mut m = Message::text(kept_body(i));
        m.durable = true;
        let options = rosetta_neutral::PublishOptions {
            txn: None,
            confirm: false,
        };
        if let Err(e) = session.publish(&address, m, options) {
            panic!("publish: {e}");
        }
    }
    assert!(core.messages_paged() > 0);
    // A message paged before its record is written cannot be read back
    // from the journal: run-time paging keeps using page files.
    assert!(page_file_bytes(&paging) > 0);
    drop(session);
    core.shutdown();
}
