//! Streams in the core, on a real store and real logs in a temp dir:
//! declaration at first use, reading from every kind of start, credit,
//! consumer groups across a restart, retention under a live reader.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rosetta_neutral::*;

use crate::tests::{core_on_store, info, open, text, Budgeted, Events};
use crate::{Core, CoreConfig, ManualClock};

use super::{StreamRule, StreamsConfig};

pub(super) fn config(dir: &std::path::Path, rules: Vec<StreamRule>) -> CoreConfig {
    CoreConfig {
        streams: StreamsConfig {
            dir: Some(dir.join("streams")),
            rules,
            ..StreamsConfig::default()
        },
        ..CoreConfig::default()
    }
}

pub(super) fn start(
    dir: &std::path::Path,
    rules: Vec<StreamRule>,
    clock: &Arc<ManualClock>,
) -> Core {
    core_on_store(&dir.join("journal"), config(dir, rules), clock).0
}

pub(super) fn read(offset: Option<StreamOffset>, group: Option<&str>) -> ConsumerOptions {
    ConsumerOptions {
        stream: Some(StreamRead {
            offset,
            group: group.map(str::to_owned),
            declare: true,
        }),
        ..ConsumerOptions::default()
    }
}

pub(super) fn consume(
    s: &mut Box<dyn Session>,
    name: &str,
    window: u32,
    options: ConsumerOptions,
) -> Result<ConsumerId, BrokerError> {
    s.consume(ConsumerSpec {
        queue: name.into(),
        credit: CreditMode::Window(window),
        auto_settle: false,
        options,
    })
}

/// Publishes `bodies` to stream `name` and waits until each is durable.
pub(super) fn publish(s: &mut Box<dyn Session>, events: &Events, name: &str, bodies: &[&str]) {
    let messages = bodies.iter().map(|b| Message::text(*b)).collect();
    publish_messages(s, events, name, messages);
}

/// Publishes `messages` to stream `name` and waits until each is durable.
pub(super) fn publish_messages(
    s: &mut Box<dyn Session>,
    events: &Events,
    name: &str,
    messages: Vec<Message>,
) {
    let mut tickets = Vec::new();
    for m in messages {
        let r = s.publish(
            &Address::Queue(name.into()),
            m,
            PublishOptions {
                confirm: true,
                ..PublishOptions::default()
            },
        );
        match r {
            Ok(PublishReceipt {
                pending: Some(t), ..
            }) => tickets.push(t),
            other => panic!("publish to a stream: {other:?}"),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut committed = Vec::new();
    while committed.len() < tickets.len() {
        assert!(Instant::now() < deadline, "appends not acknowledged");
        for (ticket, result) in events.take_committed() {
            assert!(result.is_ok(), "{result:?}");
            committed.push(ticket);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits for `n` deliveries.
pub(super) fn deliveries(events: &Events, n: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} deliveries",
            got.len()
        );
        got.extend(events.deliveries());
        std::thread::sleep(Duration::from_millis(2));
    }
    got
}

pub(super) fn quiet(events: &Events) -> Vec<Delivery> {
    std::thread::sleep(Duration::from_millis(100));
    events.deliveries()
}

pub(super) fn offsets(ds: &[Delivery]) -> Vec<u64> {
    ds.iter()
        .map(|d| d.stream.map_or(u64::MAX, |p| p.offset))
        .collect()
}

#[test]
fn a_stream_declared_at_first_use_is_read_from_first_offset_and_timestamp_without_being_consumed() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let core = start(d.path(), vec![], &clock);
    let (mut s, ev) = open(&core, "a");
    let tail = consume(&mut s, "s1", 100, read(None, None)).expect("declare by consuming");
    publish(&mut s, &ev, "s1", &["m0", "m1", "m2"]);
    clock.advance(5_000);
    publish(&mut s, &ev, "s1", &["m3", "m4"]);
    let got = deliveries(&ev, 5);
    assert_eq!(
        offsets(&got),
        vec![0, 1, 2, 3, 4],
        "a `next` reader sees what comes"
    );
    assert!(got.iter().all(|d| d.consumer == tail));
    assert_eq!(text(&got[3]), "m3");
    assert_eq!(got[0].stream.map(|p| p.timestamp_ms), Some(1_000_000));
    let (mut r, rev) = open(&core, "b");
    consume(&mut r, "s1", 100, read(Some(StreamOffset::First), None)).expect("first");
    assert_eq!(
        offsets(&deliveries(&rev, 5)),
        vec![0, 1, 2, 3, 4],
        "reading did not delete"
    );
    consume(&mut r, "s1", 100, read(Some(StreamOffset::Offset(3)), None)).expect("offset");
    assert_eq!(offsets(&deliveries(&rev, 2)), vec![3, 4]);
    consume(
        &mut r,
        "s1",
        100,
        read(Some(StreamOffset::TimestampMs(1_002_000)), None),
    )
    .expect("timestamp");
    assert_eq!(offsets(&deliveries(&rev, 2)), vec![3, 4]);
    consume(&mut r, "s1", 100, read(Some(StreamOffset::Last), None)).expect("last");
    assert_eq!(offsets(&deliveries(&rev, 1)), vec![4]);
    assert!(quiet(&rev).is_empty());
}

/// Readers at the tail share what they are sent: one decoded message per
/// record (and its body, a slice of the log's in-memory tail), however
/// many readers there are; a reader of old history decodes its own.
#[test]
fn readers_at_the_tail_share_one_decoded_message_per_record() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    let core = start(d.path(), vec![], &clock);
    let (mut s, ev) = open(&core, "a");
    let (mut r, rev) = open(&core, "b");
    consume(&mut s, "s1", 100, read(None, None)).expect("reader a");
    consume(&mut r, "s1", 100, read(None, None)).expect("reader b");
    publish(&mut s, &ev, "s1", &["m0", "m1", "m2"]);
    let a = deliveries(&ev, 3);
    let b = deliveries(&rev, 3);
    for (x, y) in a.iter().zip(&b) {
        assert!(
            Arc::ptr_eq(&x.message, &y.message),
            "offset {:?}: two decodes",
            x.stream
        );
    }
    assert_eq!(text(&b[2]), "m2");
}

#[test]
fn a_bad_start_or_a_stream_read_of_a_plain_queue_is_refused_and_nothing_else_changes() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    let core = start(d.path(), vec![], &clock);
    let (mut s, ev) = open(&core, "a");
    s.declare_stream("s1").expect("declare");
    publish(&mut s, &ev, "s1", &["a", "b"]);
    let past = consume(&mut s, "s1", 10, read(Some(StreamOffset::Offset(3)), None));
    assert!(
        matches!(past, Err(BrokerError::InvalidStreamOffset(_))),
        "{past:?}"
    );
    consume(&mut s, "s1", 10, read(Some(StreamOffset::Offset(2)), None))
        .expect("the end itself is fine: the next message");
    s.declare_queue(QueueSpec {
        name: Some("plain".into()),
        durable: true,
        lifetime: QueueLifetime::Permanent,
        bindings_max: None,
    })
    .expect("queue");
    let on_queue = consume(&mut s, "plain", 10, read(Some(StreamOffset::First), None));
    assert!(
        matches!(on_queue, Err(BrokerError::InvalidStreamOffset(_))),
        "{on_queue:?}"
    );
    assert!(matches!(
        s.declare_stream("plain"),
        Err(BrokerError::InvalidStreamOffset(_))
    ));
    // The stream still serves.
    consume(&mut s, "s1", 10, read(Some(StreamOffset::First), None)).expect("first");
    assert_eq!(offsets(&deliveries(&ev, 2)), vec![0, 1]);
}

#[test]
fn credit_bounds_what_a_reader_is_sent_and_settling_frees_it() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    let core = start(d.path(), vec![], &clock);
    let (mut s, ev) = open(&core, "a");
    s.declare_stream("s1").expect("declare");
    publish(&mut s, &ev, "s1", &["0", "1", "2", "3", "4"]);
    let c = consume(&mut s, "s1", 2, read(Some(StreamOffset::First), None)).expect("consume");
    let first = deliveries(&ev, 2);
    assert_eq!(offsets(&first), vec![0, 1]);
    assert!(quiet(&ev).is_empty(), "a window of 2");
    s.settle(c, first[0].tag, Outcome::Accept, None, false)
        .expect("settle");
    assert_eq!(offsets(&deliveries(&ev, 1)), vec![2]);
    assert!(matches!(
        s.settle(c, first[0].tag, Outcome::Accept, None, false),
        Err(BrokerError::Unknown(_))
    ));
}

/// A reader of history with a large credit keeps only its read-ahead
/// waiting for its connection, not its credit (the log is there to read
/// again), and goes on as the connection writes what waits.
#[test]
fn a_reader_of_history_keeps_only_its_read_ahead_waiting_and_goes_on_as_its_connection_writes() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    let core = start(d.path(), vec![], &clock);
    let (mut s, ev) = open(&core, "producer");
    s.declare_stream("s1").expect("declare");
    // Further from the end than what all readers there share (the 8 MiB
    // tail cache, the newest 2,048 records decoded), which the
    // connection's budget bounds instead.
    let body = "x".repeat(4 * 1024);
    let messages = (0..2_500).map(|_| Message::text(body.clone())).collect();
    publish_messages(&mut s, &ev, "s1", messages);
    let one = Message::text(body).memory_size() as u64;
    let sink = Arc::new(Budgeted {
        events: Events::default(),
        budget: DeliveryBudget::new(64 << 20),
    });
    let mut reader = core.open_session(info("reader"), sink.clone());
    consume(
        &mut reader,
        "s1",
        1000,
        read(Some(StreamOffset::First), None),
    )
    .expect("consume");
    let ahead = rosetta_neutral::budget::READ_AHEAD_BYTES;
    let mut held = deliveries(&sink.events, (ahead / one) as usize);
    held.extend(quiet(&sink.events));
    let waiting = sink.budget.used_bytes();
    assert!(
        waiting >= ahead && waiting < ahead + one,
        "{waiting} B waiting for a read-ahead of {ahead} B ({} deliveries)",
        held.len()
    );
    assert!(sink.budget.held_back_since().is_some(), "the reader waits");
    assert!(sink.budget.full_since().is_none(), "not a full budget");
    // The connection writes (drops) what waits: the reader goes on where
    // it stopped once half the read-ahead is written.
    let first = held.len();
    drop(held);
    assert!(sink.budget.take_resume());
    reader.resume_deliveries();
    let next = deliveries(&sink.events, 1);
    assert_eq!(offsets(&next)[0], first as u64);
    drop(next);
    drop(sink.events.deliveries());
}

/// A sink that notes the thread each delivery was sent from.
#[derive(Default)]
struct ThreadNoting {
    events: Events,
    threads: parking_lot::Mutex<Vec<String>>,
}

impl EventSink for ThreadNoting {
    fn send(&self, event: SessionEvent) {
        if matches!(event, SessionEvent::Delivery(_)) {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            self.threads.lock().push(name);
        }
        self.events.send(event);
    }
}

/// A reader whose next records must come from the device has them read
/// on a read thread, so the connection's task that asked (here the test's
/// thread) does not wait for the device; records in the page cache or the
/// tail cache are read where the reader asks.
#[test]
fn history_on_the_device_is_read_on_a_read_thread_and_what_memory_holds_where_the_reader_asks() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    // The streams on a simulated disk, whose page cache can be emptied.
    let disk = rosetta_store::sim::SimDisk::new(17);
    let mut cfg = config(d.path(), vec![]);
    cfg.streams.storage = Arc::new(disk.attach());
    let core = crate::tests::core_on_store(&d.path().join("journal"), cfg, &clock).0;
    let (mut s, ev) = open(&core, "producer");
    s.declare_stream("s1").expect("declare");
    // Past the 8 MiB tail cache.
    let body = "x".repeat(4 * 1024);
    let messages = (0..2_500).map(|_| Message::text(body.clone())).collect();
    publish_messages(&mut s, &ev, "s1", messages);
    let this = std::thread::current().name().unwrap_or("").to_owned();
    let read_from = |name: &str, offset: u64, n: usize| {
        let sink = Arc::new(ThreadNoting::default());
        let mut reader = core.open_session(info(name), sink.clone());
        consume(
            &mut reader,
            "s1",
            10,
            read(Some(StreamOffset::Offset(offset)), None),
        )
        .expect("consume");
        let got = deliveries(&sink.events, n);
        assert_eq!(
            offsets(&got),
            (offset..offset + n as u64).collect::<Vec<u64>>()
        );
        let threads = sink.threads.lock().clone();
        threads
    };

    disk.set_uncached(true);
    let threads = read_from("device", 0, 10);
    assert!(
        threads
            .iter()
            .all(|t| t.starts_with("rosetta-stream-read-")),
        "history on the device sent from {threads:?}"
    );
    assert_eq!(read_from("tail", 2_495, 5), vec![this.clone(); 5]);
    disk.set_uncached(false);
    assert_eq!(read_from("page cache", 0, 10), vec![this; 10]);
}

#[test]
fn a_group_resumes_from_its_cumulative_commit_after_a_restart_and_an_explicit_spec_resets_it() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    {
        let core = start(d.path(), vec![], &clock);
        let (mut s, ev) = open(&core, "a");
        s.declare_stream("s1").expect("declare");
        publish(&mut s, &ev, "s1", &["0", "1", "2", "3", "4", "5"]);
        let c =
            consume(&mut s, "s1", 10, read(Some(StreamOffset::First), Some("g"))).expect("consume");
        let got = deliveries(&ev, 6);
        // 0, 1, 2 in order, then 4 out of order: the commit stops at 3.
        for i in [0usize, 1, 2, 4] {
            s.settle(c, got[i].tag, Outcome::Accept, None, false)
                .expect("settle");
        }
        s.close(CloseKind::Clean);
    }
    let core = start(d.path(), vec![], &clock);
    let (mut s, ev) = open(&core, "b");
    consume(&mut s, "s1", 10, read(None, Some("g"))).expect("resume");
    assert_eq!(
        offsets(&deliveries(&ev, 3)),
        vec![3, 4, 5],
        "from the committed offset"
    );
    let (mut t, tev) = open(&core, "c");
    consume(
        &mut t,
        "s1",
        10,
        read(Some(StreamOffset::Offset(1)), Some("g")),
    )
    .expect("reset");
    assert_eq!(offsets(&deliveries(&tev, 5)), vec![1, 2, 3, 4, 5]);
    let (mut u, uev) = open(&core, "d");
    consume(&mut u, "s1", 10, read(None, Some("g"))).expect("after reset");
    assert_eq!(
        offsets(&deliveries(&uev, 5))[0],
        1,
        "the reset was committed"
    );
    let (mut n, nev) = open(&core, "e");
    consume(&mut n, "s1", 10, read(None, Some("new"))).expect("new group");
    assert!(quiet(&nev).is_empty(), "a new group starts at next");
}

/// Waits for the `Committed` event of `ticket`.
fn committed(events: &Events, ticket: Ticket) -> Result<(), BrokerError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "{ticket:?} never committed");
        if let Some((_, r)) = events
            .take_committed()
            .into_iter()
            .find(|(t, _)| *t == ticket)
        {
            return r;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_confirmed_settlement_that_moves_a_group_waits_for_its_commit_to_be_durable() {
    // A STOMP ACK with a receipt (an AMQP disposition a peer waits on)
    // promises what it acknowledged is durable, as for a queue: so the
    // group's new offset must be in the journal before the ticket ends.
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    {
        let core = start(d.path(), vec![], &clock);
        let (mut s, ev) = open(&core, "a");
        s.declare_stream("s1").expect("declare");
        publish(&mut s, &ev, "s1", &["0", "1", "2", "3"]);
        let c =
            consume(&mut s, "s1", 10, read(Some(StreamOffset::First), Some("g"))).expect("consume");
        let got = deliveries(&ev, 4);
        // Out of order: settling 1 before 0 moves nothing, so nothing waits.
        let none = s
            .settle(c, got[1].tag, Outcome::Accept, None, true)
            .expect("settle 1");
        assert_eq!(none, None, "nothing journaled, nothing to wait for");
        let ticket = s
            .settle(c, got[0].tag, Outcome::Accept, None, true)
            .expect("settle 0")
            .expect("a commit that moved the group has a ticket");
        assert_eq!(committed(&ev, ticket), Ok(()));
        // Not confirmed: no ticket, as for a queue.
        let unconfirmed = s
            .settle(c, got[2].tag, Outcome::Accept, None, false)
            .expect("settle 2");
        assert_eq!(unconfirmed, None);
        s.close(CloseKind::Clean);
    }
    let core = start(d.path(), vec![], &clock);
    let (mut s, ev) = open(&core, "b");
    consume(&mut s, "s1", 10, read(None, Some("g"))).expect("resume");
    assert_eq!(offsets(&deliveries(&ev, 1)), vec![3]);
}

/// Streams named by `pattern` whose records retention deletes after a
/// minute, in the smallest segments (so a few records fill one).
fn aged_after_a_minute(pattern: &str) -> StreamRule {
    StreamRule {
        pattern: pattern.into(),
        max_age_s: Some(60),
        max_bytes: None,
        segment_bytes: rosetta_store::log::LOG_SEGMENT_MIN_BYTES,
        partitions: 1,
        partition_key: None,
    }
}

/// Publishes 60 records of about 100 bytes (offsets 0 to 59) to `name`,
/// enough for several of [`aged_after_a_minute`]'s segments.
fn publish_many_segments(s: &mut Box<dyn Session>, events: &Events, name: &str) {
    let bodies: Vec<String> = (0..60)
        .map(|i| format!("{i:02}{}", "x".repeat(100)))
        .collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    publish(s, events, name, &refs);
}

#[test]
fn retention_under_a_live_reader_skips_it_ahead_and_says_how_many_it_missed() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let core = start(d.path(), vec![aged_after_a_minute("logs.*")], &clock);
    let (mut s, ev) = open(&core, "a");
    publish_many_segments(&mut s, &ev, "logs.app");
    // A configured stream is read as one without asking.
    let c = consume(
        &mut s,
        "logs.app",
        1,
        ConsumerOptions {
            stream: Some(StreamRead {
                offset: Some(StreamOffset::First),
                group: None,
                // A configured stream is read as one without declaring.
                declare: false,
            }),
            ..ConsumerOptions::default()
        },
    )
    .expect("consume");
    let first = deliveries(&ev, 1);
    assert_eq!(offsets(&first), vec![0]);
    clock.advance(120_000);
    publish(&mut s, &ev, "logs.app", &["new"]);
    core.run_stream_retention();
    s.settle(c, first[0].tag, Outcome::Accept, None, false)
        .expect("settle");
    let next = deliveries(&ev, 1);
    let p = next[0].stream.expect("position");
    assert!(p.offset > 1, "skipped ahead to {}", p.offset);
    assert_eq!(p.missed, p.offset - 1, "told how many it missed");
}

#[test]
fn stream_names_round_trip_through_their_directory_names() {
    for name in ["s1", "orders.eu", "a/b c", "ünï", "%41", ""] {
        let dir = super::dir_name(name);
        assert!(
            dir.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-%".contains(&b)),
            "{dir}"
        );
        assert_eq!(super::name_of_dir(&dir).as_deref(), Some(name));
    }
    assert_eq!(super::name_of_dir("bad%4"), None);
}

#[test]
fn retention_that_is_due_comes_before_the_streams_queued_to_be_served() {
    use std::collections::VecDeque;
    use std::sync::Weak;

    use super::{next_step, PumpStep, Stream};

    let mut queued: VecDeque<Weak<Stream>> = VecDeque::from([Weak::new()]);
    assert!(matches!(
        next_step(&mut queued, true),
        Some(PumpStep::Retention)
    ));
    assert_eq!(queued.len(), 1, "the stream stays queued for after it");
    assert!(matches!(
        next_step(&mut queued, false),
        Some(PumpStep::Serve(_))
    ));
    assert!(next_step(&mut queued, false).is_none());
}

/// The operator's figures (`stats`): a group's lag is what the log holds
/// past its committed offset, never what retention already cut; the
/// groups of a stream `a/b` are not listed as groups `b/...` of `a`.
#[test]
fn stream_figures_show_each_groups_lag_and_keep_nested_names_apart() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let core = start(d.path(), vec![aged_after_a_minute("a*")], &clock);
    let (mut s, ev) = open(&core, "a");
    publish_many_segments(&mut s, &ev, "a");
    publish(&mut s, &ev, "a/b", &["x"]);
    let ca = consume(&mut s, "a", 100, read(Some(StreamOffset::First), Some("g"))).expect("a");
    let got = deliveries(&ev, 60);
    for d in &got[..3] {
        s.settle(ca, d.tag, Outcome::Accept, None, false)
            .expect("settle");
    }
    consume(
        &mut s,
        "a/b",
        10,
        read(Some(StreamOffset::First), Some("h")),
    )
    .expect("a/b");
    deliveries(&ev, 1);
    let a = core.stream_stats("a").expect("stats").expect("a log");
    assert_eq!((a.first_offset, a.next_offset, a.messages), (0, 60, 60));
    assert_eq!(a.readers, 1);
    assert_eq!(
        a.groups,
        vec![super::StreamGroupStats {
            name: "g".into(),
            committed_offset: 3,
            lag: 57
        }],
        "h is a/b's group, not a's group b/h"
    );
    let ab = core.stream_stats("a/b").expect("stats").expect("a/b log");
    assert_eq!(ab.groups.len(), 1);
    assert_eq!(ab.groups[0].name, "h");
    // Retention cuts below the group's offset: lag counts only what is
    // still there.
    clock.advance(120_000);
    publish(&mut s, &ev, "a", &["new"]);
    core.run_stream_retention();
    let a = core.stream_stats("a").expect("stats").expect("a log");
    assert!(a.first_offset > 3, "retention cut: {a:?}");
    assert_eq!(a.groups[0].committed_offset, 3);
    assert_eq!(a.groups[0].lag, a.next_offset - a.first_offset);
    assert_eq!(core.stream_stats("nothing").expect("stats"), None);
}

/// A partitioned stream's figures: one a rule names is shown before its
/// first use (its logs not made yet); a name a pattern rule matches is a
/// stream only once used.
#[test]
fn a_partitioned_streams_figures_list_its_logs_once_it_is_one() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    let partitioned = |pattern: &str| StreamRule {
        partitions: 2,
        ..aged_after_a_minute(pattern)
    };
    let core = start(
        d.path(),
        vec![partitioned("orders"), partitioned("eu.*")],
        &clock,
    );
    let named = core.stream_partitions("orders").expect("figures");
    assert_eq!(named, Some(vec![None, None]), "configured, not used yet");
    assert_eq!(core.stream_partitions("eu.never").expect("figures"), None);
    let (mut s, ev) = open(&core, "a");
    publish(&mut s, &ev, "eu.sales", &["x"]);
    let used = core
        .stream_partitions("eu.sales")
        .expect("figures")
        .expect("a partitioned stream once used");
    let logs: Vec<(String, Option<String>)> = used
        .iter()
        .flatten()
        .map(|l| (l.name.clone(), l.partition_of.clone()))
        .collect();
    assert_eq!(
        logs,
        [
            ("eu.sales-0".to_owned(), Some("eu.sales".to_owned())),
            ("eu.sales-1".to_owned(), Some("eu.sales".to_owned()))
        ]
    );
    assert_eq!(used.iter().flatten().map(|l| l.messages).sum::<u64>(), 1);
}
