//! Message groups under load (issue 15): 100 consumers, 10,000 groups,
//! durable 1 KiB messages, one durable queue, against the same workload
//! without groups in the same run.
//!
//! Each run opens a fresh [`rosetta_store::Store`] in a temp dir (default
//! sync policy: every commit is fsynced, appends are group-committed) and a
//! [`Core`] over it, declares the durable queue `q`, and attaches
//! `CONSUMERS` consumers, one session each (one connection each), with a
//! window credit of `CONSUMER_WINDOW`, settling (accept) every delivery as
//! it arrives the way a client acks. `CONSUMER_THREADS` threads drive the
//! consumer sessions, as a few runtime workers drive many connections.
//! `PRODUCERS` producers, one session and thread each, publish durable
//! messages with a confirm and at most `PRODUCER_CONFIRMS_IN_FLIGHT_MAX`
//! unconfirmed, like an AMQP sender with credit or an MQTT QoS 1 client
//! with a receive maximum. In the grouped run every message carries a
//! `group_id` out of `GROUPS`, each producer owning its share of the groups
//! and cycling through them round-robin, so a group's order is its
//! producer's order.
//!
//! Measured per run:
//! - throughput: messages / (first publish .. last accept);
//! - CPU per message: the process's user + system time over the run
//!   (`/proc/self/stat`) divided by the messages, the figure a shared,
//!   noisy machine disturbs least;
//! - latency p50/p99/max from publish (a timestamp in the message's
//!   properties) to the consumer thread taking the delivery off its
//!   connection's channel;
//! - correctness while measuring: every message accepted exactly once
//!   (missing, duplicates, redelivered), and with groups, deliveries out
//!   of order within their group, deliveries of a group to a consumer that
//!   is not the group's, and the spread of groups over consumers (min/max
//!   groups per consumer).
//!
//! Columns: `cpu_us` CPU microseconds per message; `dup/err` the sum of
//! duplicates, redeliveries, unconfirmed publishes and failed settles;
//! `order/off` deliveries out of order within their group / to a consumer
//! not the group's; `grp/cons` min..max groups per consumer. The process
//! exits 1 when any of the correctness counts is not 0.
//!
//! Grouped and ungrouped runs alternate, the order swapped every round
//! (A B, B A, ...), so machine noise and warm-up hit both alike; the
//! summary gives the medians of each kind and the ratios grouped /
//! ungrouped.
//!
//! `cargo bench -p rosetta-core --bench groups_queue`. Environment:
//! `GROUPS_BENCH_MESSAGES` (default 100,000; a multiple of `PRODUCERS`),
//! `GROUPS_BENCH_ROUNDS` (default 2: each round is one run of each kind),
//! `GROUPS_BENCH_DIR` (default: the system temp dir), `GROUPS_BENCH_KINDS`
//! (`groups`, `plain`, or both, the default: one kind alone is for a
//! profiler, not for the ratio). Not run in CI: a measurement, not a test.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use rosetta_core::{AllowAll, Core, CoreConfig};
use rosetta_neutral::{
    Address, Broker, ConsumerId, ConsumerOptions, ConsumerSpec, CreditMode, Delivery, EventSink,
    Message, Outcome, Principal, Protocol, PublishOptions, QueueLifetime, QueueSpec, Session,
    SessionEvent, SessionInfo, Value,
};
use rosetta_store::{Store, StoreConfig};

/// Consumers on the one queue (issue 15).
const CONSUMERS: usize = 100;
/// Distinct group ids in the grouped run (issue 15).
const GROUPS: usize = 10_000;
/// Body size of every message (issue 15).
const PAYLOAD_BYTES: usize = 1024;
/// Each consumer's window credit: unsettled deliveries it may hold.
const CONSUMER_WINDOW: u32 = 100;
/// Threads driving the consumer sessions: a few workers for many
/// connections, as the server's runtime does, on a 2-CPU machine.
const CONSUMER_THREADS: usize = 4;
/// Producer sessions, one thread each.
const PRODUCERS: usize = 4;
/// Unconfirmed publishes one producer may have: enough to fill a group
/// commit, bounded like a sender's credit.
const PRODUCER_CONFIRMS_IN_FLIGHT_MAX: usize = 250;
/// Messages per run unless `GROUPS_BENCH_MESSAGES` says otherwise.
const MESSAGES_DEFAULT: usize = 100_000;
/// Rounds (one grouped and one ungrouped run each) unless
/// `GROUPS_BENCH_ROUNDS` says otherwise.
const ROUNDS_DEFAULT: usize = 2;
/// No progress for this long ends a run as stalled (a bug, not noise).
const STALL_TIMEOUT_S: u64 = 60;
/// How often an idle consumer thread looks whether the run is over.
const CONSUMER_POLL_MS: u64 = 50;

/// Clock ticks per second of `/proc/self/stat` times (Linux's USER_HZ,
/// 100 on every architecture's /proc ABI).
const PROC_TICKS_PER_S: f64 = 100.0;

/// Message properties the bench reads back on delivery.
const PROP_NUMBER: &str = "n";
const PROP_SENT_NS: &str = "sent_ns";
const PROP_GROUP: &str = "g";
const PROP_GROUP_SEQ: &str = "gseq";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn long(m: &Message, name: &str) -> usize {
    match m.properties.get(name) {
        Some(Value::Long(v)) => usize::try_from(*v).expect("bench property is non-negative"),
        other => panic!("bench property {name} missing or of another type: {other:?}"),
    }
}

/// User + system CPU time of this process so far, in seconds; `None` off
/// Linux.
fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is the first, utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / PROC_TICKS_PER_S)
}

/// Where a consumer session's deliveries go: its thread's channel, tagged
/// with the consumer's number.
struct ConsumerSink {
    consumer: usize,
    tx: Sender<(usize, Delivery)>,
}

impl EventSink for ConsumerSink {
    fn send(&self, event: SessionEvent) {
        if let SessionEvent::Delivery(d) = event {
            let _ = self.tx.send((self.consumer, d));
        }
    }
}

/// Where a producer session's confirms go.
struct ProducerSink(Sender<bool>);

impl EventSink for ProducerSink {
    fn send(&self, event: SessionEvent) {
        if let SessionEvent::Committed { result, .. } = event {
            let _ = self.0.send(result.is_ok());
        }
    }
}

fn session_info(conn_id: u64) -> SessionInfo {
    SessionInfo {
        conn_id,
        protocol: Protocol::Internal,
        principal: Principal::anonymous(),
        client_id: None,
        take_over: false,
    }
}

/// What the consumers saw, shared by the consumer threads.
struct Tally {
    grouped: bool,
    messages: usize,
    seen: Vec<AtomicBool>,
    accepted: AtomicU64,
    duplicates: AtomicU64,
    redelivered: AtomicU64,
    settle_errors: AtomicU64,
    /// Per group: the group sequence number expected next.
    group_next: Vec<AtomicU32>,
    /// Per group: its consumer's number + 1 (0: not seen yet).
    group_owner: Vec<AtomicU32>,
    out_of_order: AtomicU64,
    off_owner: AtomicU64,
    last_accept: Mutex<Option<Instant>>,
    done: AtomicBool,
}

impl Tally {
    fn new(grouped: bool, messages: usize) -> Self {
        Self {
            grouped,
            messages,
            seen: (0..messages).map(|_| AtomicBool::new(false)).collect(),
            accepted: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            redelivered: AtomicU64::new(0),
            settle_errors: AtomicU64::new(0),
            group_next: (0..GROUPS).map(|_| AtomicU32::new(0)).collect(),
            group_owner: (0..GROUPS).map(|_| AtomicU32::new(0)).collect(),
            out_of_order: AtomicU64::new(0),
            off_owner: AtomicU64::new(0),
            last_accept: Mutex::new(None),
            done: AtomicBool::new(false),
        }
    }

    /// Checks one delivery to `consumer` before it is settled.
    fn check(&self, consumer: usize, d: &Delivery) {
        let m = &d.message;
        if d.redelivered {
            self.redelivered.fetch_add(1, Ordering::Relaxed);
        }
        if self.seen[long(m, PROP_NUMBER)].swap(true, Ordering::Relaxed) {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
        }
        if !self.grouped {
            return;
        }
        let group = long(m, PROP_GROUP);
        let seq = u32::try_from(long(m, PROP_GROUP_SEQ)).expect("group seq fits");
        if self.group_next[group].swap(seq + 1, Ordering::Relaxed) != seq {
            self.out_of_order.fetch_add(1, Ordering::Relaxed);
        }
        let me = u32::try_from(consumer + 1).expect("consumer number fits");
        match self.group_owner[group].compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => {}
            Err(owner) if owner == me => {}
            Err(_) => {
                self.off_owner.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn accepted(&self) {
        let n = self.accepted.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.messages as u64 {
            *self.last_accept.lock() = Some(Instant::now());
            self.done.store(true, Ordering::Release);
        }
    }

    fn missing(&self) -> usize {
        self.seen
            .iter()
            .filter(|s| !s.load(Ordering::Relaxed))
            .count()
    }

    /// Min and max groups per consumer, counting each group at its first
    /// consumer.
    fn groups_per_consumer(&self) -> (usize, usize) {
        let mut per = [0usize; CONSUMERS];
        for owner in &self.group_owner {
            let o = owner.load(Ordering::Relaxed) as usize;
            if o > 0 {
                per[o - 1] += 1;
            }
        }
        let min = per.iter().copied().min().unwrap_or(0);
        let max = per.iter().copied().max().unwrap_or(0);
        (min, max)
    }
}

/// One consumer thread: takes deliveries off its channel, checks and
/// settles each. Returns the publish → delivery latencies (ns).
fn consume(
    mut sessions: Vec<(Box<dyn Session>, ConsumerId)>,
    rx: Receiver<(usize, Delivery)>,
    tally: Arc<Tally>,
    epoch: Instant,
) -> Vec<u64> {
    let mut latencies = Vec::with_capacity(tally.messages / CONSUMER_THREADS + 1);
    loop {
        match rx.recv_timeout(Duration::from_millis(CONSUMER_POLL_MS)) {
            Ok((consumer, d)) => {
                let taken = Instant::now();
                let sent_ns = long(&d.message, PROP_SENT_NS) as u64;
                let taken_ns = taken.duration_since(epoch).as_nanos() as u64;
                latencies.push(taken_ns.saturating_sub(sent_ns));
                tally.check(consumer, &d);
                let (session, id) = &mut sessions[consumer / CONSUMER_THREADS];
                match session.settle(*id, d.tag, Outcome::Accept, None, false) {
                    Ok(_) => tally.accepted(),
                    Err(_) => {
                        tally.settle_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) if tally.done.load(Ordering::Acquire) => break,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    latencies
}

/// One producer: `count` durable messages, at most
/// `PRODUCER_CONFIRMS_IN_FLIGHT_MAX` unconfirmed. Returns the publishes
/// not confirmed durable: the journal write failed, or there was none (the
/// message was not journaled, so the run would not measure what it says).
fn produce(
    core: Core,
    producer: usize,
    count: usize,
    grouped: bool,
    start: Arc<Barrier>,
    epoch: Instant,
) -> usize {
    let (tx, rx) = mpsc::channel();
    let mut s = core.open_session(
        session_info(1_000 + producer as u64),
        Arc::new(ProducerSink(tx)),
    );
    let address = Address::Queue("q".into());
    let payload = Bytes::from(vec![0x5Au8; PAYLOAD_BYTES]);
    let own_groups = GROUPS / PRODUCERS;
    let mut in_flight = 0;
    let mut unconfirmed = 0;
    // Whether the next confirm says the message is durable.
    let confirm = || {
        rx.recv_timeout(Duration::from_secs(STALL_TIMEOUT_S))
            .expect("a confirm within the stall timeout")
    };
    start.wait();
    for k in 0..count {
        while in_flight >= PRODUCER_CONFIRMS_IN_FLIGHT_MAX {
            in_flight -= 1;
            unconfirmed += usize::from(!confirm());
        }
        // Producer p owns groups p, p + PRODUCERS, ... and cycles through
        // them: the k-th message is number `seq` of its group.
        let group = (k % own_groups) * PRODUCERS + producer;
        let seq = k / own_groups;
        let mut m = Message::binary(payload.clone());
        m.durable = true;
        if grouped {
            m.group_id = Some(format!("group-{group}"));
        }
        let number = k * PRODUCERS + producer;
        m.properties.push(PROP_NUMBER, Value::Long(number as i64));
        m.properties.push(PROP_GROUP, Value::Long(group as i64));
        m.properties.push(PROP_GROUP_SEQ, Value::Long(seq as i64));
        let sent_ns = epoch.elapsed().as_nanos() as i64;
        m.properties.push(PROP_SENT_NS, Value::Long(sent_ns));
        let receipt = s
            .publish(
                &address,
                m,
                PublishOptions {
                    txn: None,
                    confirm: true,
                },
            )
            .expect("publish");
        if receipt.pending.is_some() {
            in_flight += 1;
        } else {
            unconfirmed += 1;
        }
    }
    while in_flight > 0 {
        in_flight -= 1;
        unconfirmed += usize::from(!confirm());
    }
    unconfirmed
}

/// What one run measured.
struct RunResult {
    grouped: bool,
    messages: usize,
    elapsed: Duration,
    /// CPU seconds the process spent from the first publish to the last
    /// accept (the idle consumer threads' last poll included).
    cpu_s: Option<f64>,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    missing: usize,
    duplicates: u64,
    redelivered: u64,
    unconfirmed: usize,
    settle_errors: u64,
    out_of_order: u64,
    off_owner: u64,
    groups_per_consumer: (usize, usize),
}

impl RunResult {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }

    fn cpu_us_per_message(&self) -> f64 {
        self.cpu_s
            .map_or(f64::NAN, |s| s * 1e6 / self.messages as f64)
    }

    fn faults(&self) -> u64 {
        self.missing as u64
            + self.duplicates
            + self.redelivered
            + self.unconfirmed as u64
            + self.settle_errors
            + self.out_of_order
            + self.off_owner
    }
}

fn percentile_us(sorted_ns: &[u64], p: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted_ns.len() as f64 * p).ceil() as usize).clamp(1, sorted_ns.len()) - 1;
    sorted_ns[i] as f64 / 1e3
}

fn open_core(dir: &std::path::Path) -> Core {
    let (store, recovered) = Store::open(StoreConfig::new(dir)).expect("open store");
    Core::new(
        CoreConfig::default(),
        Arc::new(store),
        Arc::new(AllowAll),
        Some(recovered),
    )
}

fn run(grouped: bool, messages: usize, base_dir: &std::path::Path) -> RunResult {
    let dir = tempfile::Builder::new()
        .prefix("groups-bench-")
        .tempdir_in(base_dir)
        .expect("temp dir");
    let core = open_core(dir.path());
    let mut admin = core.open_session(session_info(1), Arc::new(NoEvents));
    admin
        .declare_queue(QueueSpec {
            name: Some("q".into()),
            durable: true,
            lifetime: QueueLifetime::Permanent,
            bindings_max: None,
        })
        .expect("declare the queue");

    let tally = Arc::new(Tally::new(grouped, messages));
    let epoch = Instant::now();
    let mut per_thread: Vec<_> = (0..CONSUMER_THREADS)
        .map(|_| (mpsc::channel(), Vec::new()))
        .collect();
    for consumer in 0..CONSUMERS {
        let ((tx, _), sessions) = &mut per_thread[consumer % CONSUMER_THREADS];
        let sink = ConsumerSink {
            consumer,
            tx: tx.clone(),
        };
        let mut s = core.open_session(session_info(10_000 + consumer as u64), Arc::new(sink));
        let id = s
            .consume(ConsumerSpec {
                queue: "q".into(),
                credit: CreditMode::Window(CONSUMER_WINDOW),
                auto_settle: false,
                options: ConsumerOptions::default(),
            })
            .expect("consume");
        sessions.push((s, id));
    }
    let consumers: Vec<_> = per_thread
        .into_iter()
        .map(|((tx, rx), sessions)| {
            // The sinks hold the senders: the channel lives as long as
            // the sessions.
            drop(tx);
            let tally = Arc::clone(&tally);
            std::thread::spawn(move || consume(sessions, rx, tally, epoch))
        })
        .collect();

    assert_eq!(
        messages % PRODUCERS,
        0,
        "messages must divide by {PRODUCERS}"
    );
    let start = Arc::new(Barrier::new(PRODUCERS + 1));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let core = core.clone();
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                produce(core, p, messages / PRODUCERS, grouped, start, epoch)
            })
        })
        .collect();
    start.wait();
    let started = Instant::now();
    let cpu_started = process_cpu_s();
    let unconfirmed = producers
        .into_iter()
        .map(|p| p.join().expect("producer thread"))
        .sum();

    let mut last = tally.accepted.load(Ordering::Relaxed);
    let mut last_progress = Instant::now();
    while !tally.done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(CONSUMER_POLL_MS));
        let now = tally.accepted.load(Ordering::Relaxed);
        if now != last {
            last = now;
            last_progress = Instant::now();
        } else if last_progress.elapsed() > Duration::from_secs(STALL_TIMEOUT_S) {
            eprintln!("stalled: {now} of {messages} accepted");
            tally.done.store(true, Ordering::Release);
        }
    }
    let ended = tally.last_accept.lock().unwrap_or_else(Instant::now);
    let cpu_s = cpu_started.zip(process_cpu_s()).map(|(a, b)| b - a);
    let mut latencies: Vec<u64> = consumers
        .into_iter()
        .flat_map(|c| c.join().expect("consumer thread"))
        .collect();
    latencies.sort_unstable();
    core.shutdown();
    let result = RunResult {
        grouped,
        messages,
        elapsed: ended.duration_since(started),
        cpu_s,
        p50_us: percentile_us(&latencies, 0.50),
        p99_us: percentile_us(&latencies, 0.99),
        max_us: latencies.last().map_or(f64::NAN, |&v| v as f64 / 1e3),
        missing: tally.missing(),
        duplicates: tally.duplicates.load(Ordering::Relaxed),
        redelivered: tally.redelivered.load(Ordering::Relaxed),
        unconfirmed,
        settle_errors: tally.settle_errors.load(Ordering::Relaxed),
        out_of_order: tally.out_of_order.load(Ordering::Relaxed),
        off_owner: tally.off_owner.load(Ordering::Relaxed),
        groups_per_consumer: tally.groups_per_consumer(),
    };
    drop(admin);
    drop(core);
    result
}

/// The sink of the session that only declares the queue.
struct NoEvents;

impl EventSink for NoEvents {
    fn send(&self, _event: SessionEvent) {}
}

fn print_row(round: usize, r: &RunResult) {
    let (kind, groups, order, spread) = if r.grouped {
        let (min, max) = r.groups_per_consumer;
        (
            "groups",
            GROUPS.to_string(),
            format!("{}/{}", r.out_of_order, r.off_owner),
            format!("{min}..{max}"),
        )
    } else {
        ("plain", "-".into(), "-".into(), "-".into())
    };
    println!(
        "{round:>5} {kind:<6} {groups:>6} {:>8.0} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7} {:>7} {:>9} {:>9}",
        r.rate(),
        r.cpu_us_per_message(),
        r.p50_us / 1e3,
        r.p99_us / 1e3,
        r.max_us / 1e3,
        r.missing,
        r.duplicates + r.redelivered + r.unconfirmed as u64 + r.settle_errors,
        order,
        spread,
    );
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn main() {
    let messages = env_usize("GROUPS_BENCH_MESSAGES", MESSAGES_DEFAULT);
    let rounds = env_usize("GROUPS_BENCH_ROUNDS", ROUNDS_DEFAULT).max(1);
    let kinds: Vec<bool> = match std::env::var("GROUPS_BENCH_KINDS").as_deref() {
        Ok("groups") => vec![true],
        Ok("plain") => vec![false],
        _ => vec![true, false],
    };
    let base_dir = std::env::var_os("GROUPS_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    println!(
        "one durable queue, {CONSUMERS} consumers (window {CONSUMER_WINDOW}, accept each), \
         {PRODUCERS} producers (confirmed, {PRODUCER_CONFIRMS_IN_FLIGHT_MAX} in flight each), \
         {messages} durable {PAYLOAD_BYTES}-byte messages per run, {rounds} rounds, store in {}",
        base_dir.display()
    );
    println!(
        "{:>5} {:<6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>9} {:>9}",
        "round",
        "kind",
        "groups",
        "msg/s",
        "cpu_us",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "missing",
        "dup/err",
        "order/off",
        "grp/cons"
    );
    let mut results = Vec::new();
    for round in 1..=rounds {
        // Alternate which kind goes first, so neither always runs on a
        // warmer (or more crowded) machine.
        let order = if round % 2 == 1 {
            [true, false]
        } else {
            [false, true]
        };
        for grouped in order.into_iter().filter(|&g| kinds.contains(&g)) {
            let r = run(grouped, messages, &base_dir);
            print_row(round, &r);
            results.push(r);
        }
    }
    let summary = |grouped: bool| {
        let of_kind: Vec<_> = results.iter().filter(|r| r.grouped == grouped).collect();
        (
            median(of_kind.iter().map(|r| r.rate()).collect()),
            median(of_kind.iter().map(|r| r.cpu_us_per_message()).collect()),
            median(of_kind.iter().map(|r| r.p99_us).collect()),
        )
    };
    let (g_rate, g_cpu, g_p99) = summary(true);
    let (p_rate, p_cpu, p_p99) = summary(false);
    println!(
        "median: groups {g_rate:.0} msg/s, {g_cpu:.1} us CPU/msg, p99 {:.1} ms; \
         plain {p_rate:.0} msg/s, {p_cpu:.1} us CPU/msg, p99 {:.1} ms",
        g_p99 / 1e3,
        p_p99 / 1e3,
    );
    println!(
        "grouped/plain: throughput {:.2}, CPU per message {:.2}, p99 {:.2}",
        g_rate / p_rate,
        g_cpu / p_cpu,
        g_p99 / p_p99,
    );
    let faults: u64 = results.iter().map(RunResult::faults).sum();
    println!("faults over all runs (missing, duplicate, redelivered, unconfirmed publish, failed settle, out of order, off the group's consumer): {faults}");
    if faults > 0 {
        std::process::exit(1);
    }
}
