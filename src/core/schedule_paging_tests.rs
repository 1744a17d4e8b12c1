//! Scheduled messages past the memory budget (issue 16: "a million of them
//! cost memory proportional to a small index entry, not to their bodies"):
//! their bodies wait on disk, come back intact and never early, are not
//! read back into memory faster than the queue can hold them, and their
//! page files go once read back. On a manual clock: no real sleeps.

use super::*;
use crate::{Clock, ManualClock};

const BODY_BYTES: usize = 1_000;
const BUDGET_BYTES: u64 = 64 * 1024;
/// The read-back batch (`SCHEDULE_READ_BACK_BYTES_MAX`) and one message
/// over it: what may be in memory beyond the budget when due messages
/// come back to a queue nobody consumes.
const READ_BACK_SLACK_BYTES: u64 = 1024 * 1024 + 4 * 1024;

fn paging_config(dir: &std::path::Path) -> CoreConfig {
    CoreConfig {
        memory_budget_bytes: BUDGET_BYTES,
        paging_dir: Some(dir.to_owned()),
        ..CoreConfig::default()
    }
}

fn paging_core(dir: &std::path::Path) -> (Core, Arc<ManualClock>) {
    manual_core(paging_config(dir))
}

fn body(i: usize) -> String {
    format!("{i:06}-{}", "x".repeat(BODY_BYTES))
}

/// Message `i`'s delivery time: `count` messages spread over 10 s, sent in
/// an order that is not their time order.
fn due_of(i: usize, count: usize) -> u64 {
    T0_MS + 1 + ((i * 7_919) % count) as u64 * 10_000 / count as u64
}

fn schedule_all(s: &mut Box<dyn Session>, count: usize, durable: bool) {
    for i in 0..count {
        let mut m = Message::text(body(i));
        m.durable = durable;
        m.delivery_time = Some(due_of(i, count));
        s.publish(&queue("q"), m, PublishOptions::default())
            .expect("publish");
        assert!(!s.producer_blocked(), "blocked at message {i}");
    }
}

/// Bytes in the scheduled-message page files of `dir`.
fn scheduled_page_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("paging dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".scheduled."))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// Consumes everything, advancing the clock 10 ms at a time: every message
/// arrives once, with its bytes, never before its time.
fn consume_all_in_time(
    core: &Core,
    clock: &ManualClock,
    s: &mut Box<dyn Session>,
    e: &Events,
    count: usize,
) {
    let id = s
        .consume(ConsumerSpec {
            queue: "q".into(),
            credit: CreditMode::Window(100),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume");
    let mut seen = vec![false; count];
    let mut got = 0;
    let mut steps = 0;
    while got < count {
        steps += 1;
        assert!(steps < 10_000, "stalled at {got} of {count}");
        clock.advance(10);
        core.run_timers();
        for d in e.deliveries() {
            let n: usize = text(&d)[..6].parse().expect("numbered body");
            assert_eq!(text(&d), body(n), "message {n} bytes");
            assert!(
                d.message.delivery_time.is_some_and(|t| t <= clock.now_ms()),
                "message {n} delivered before its time"
            );
            assert!(!seen[n], "message {n} delivered twice");
            seen[n] = true;
            got += 1;
            s.settle(id, d.tag, Outcome::Accept, None, false)
                .expect("settle");
        }
    }
}

#[test]
fn scheduled_messages_past_the_budget_wait_on_disk_and_arrive_intact_never_early() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (core, clock) = paging_core(dir.path());
    let (mut s, e) = open(&core, "c");
    let count = 3_000;
    schedule_all(&mut s, count, false);

    let st = core.queue_stats("q").expect("queue");
    assert_eq!((st.depth, st.scheduled), (0, count as u64));
    assert!(
        st.scheduled_paged > count as u64 - 100,
        "only {} of {count} scheduled messages paged",
        st.scheduled_paged
    );
    assert_eq!(core.messages_paged(), st.scheduled_paged);
    assert!(
        core.memory_used() <= BUDGET_BYTES + 2 * 1024,
        "{} bytes in memory for a {BUDGET_BYTES} byte budget",
        core.memory_used()
    );
    assert!(scheduled_page_bytes(dir.path()) > (count * BODY_BYTES) as u64 * 9 / 10);

    consume_all_in_time(&core, &clock, &mut s, &e, count);
    assert_eq!(core.messages_paged(), 0);
    assert_eq!(
        core.memory_used(),
        0,
        "every byte accounted for is released"
    );
    assert_eq!(
        scheduled_page_bytes(dir.path()),
        0,
        "page files go once everything in them is read back"
    );
}

#[test]
fn due_messages_on_disk_come_back_no_faster_than_the_queue_can_hold_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (core, clock) = paging_core(dir.path());
    let (mut s, e) = open(&core, "c");
    let count = 3_000;
    schedule_all(&mut s, count, false);
    // All due, nobody consuming: a bounded batch comes into memory, the
    // rest waits on disk (as scheduled, not lost), however often the
    // timer comes back.
    for _ in 0..50 {
        clock.advance(1_000);
        core.run_timers();
    }
    let st = core.queue_stats("q").expect("queue");
    assert!(
        core.memory_used() <= BUDGET_BYTES + READ_BACK_SLACK_BYTES,
        "{} bytes in memory with {} ready and {} scheduled",
        core.memory_used(),
        st.depth,
        st.scheduled
    );
    assert!(st.depth > 0, "a first batch is ready");
    assert!(st.scheduled_paged > 0, "the rest waits on disk");
    assert_eq!(st.depth + st.scheduled, count as u64, "nothing lost");
    // A consumer drains it all (the held messages come back as room
    // appears, at each retry of the timer).
    consume_all_in_time(&core, &clock, &mut s, &e, count);
    assert_eq!(core.messages_paged(), 0);
}

#[test]
fn a_queue_deleted_with_scheduled_messages_on_disk_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (core, _clock) = paging_core(dir.path());
    let (mut s, _e) = open(&core, "c");
    schedule_all(&mut s, 1_000, false);
    assert!(core.messages_paged() > 900);
    s.delete_queue("q").expect("delete");
    assert_eq!(core.messages_paged(), 0);
    assert_eq!(core.memory_used(), 0);
    assert_eq!(scheduled_page_bytes(dir.path()), 0);
}

#[test]
fn a_restart_past_the_budget_keeps_scheduled_messages_on_disk_by_reference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join("store");
    let paging_dir = dir.path().join("paging");
    let clock = Arc::new(ManualClock::new(T0_MS));
    let count = 2_000;
    {
        let (core, store) = core_on_store(&store_dir, paging_config(&paging_dir), &clock);
        let (mut s, _e) = open(&core, "c");
        schedule_all(&mut s, count, true);
        store.flush().expect("flush");
        s.close(CloseKind::Clean);
    }
    let (core, _store) = core_on_store(&store_dir, paging_config(&paging_dir), &clock);
    let st = core.queue_stats("q").expect("queue");
    assert_eq!(
        (st.depth, st.scheduled),
        (0, count as u64),
        "all kept, none ready"
    );
    assert!(
        st.scheduled_paged > count as u64 - 100,
        "only {} paged at the restart",
        st.scheduled_paged
    );
    assert!(core.memory_used() <= BUDGET_BYTES + 2 * 1024);
    assert_eq!(
        scheduled_page_bytes(&paging_dir),
        0,
        "paged by reference into the journal, not copied"
    );
    let (mut s, e) = open(&core, "c");
    consume_all_in_time(&core, &clock, &mut s, &e, count);
}
