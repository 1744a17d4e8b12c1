//! Seeded simulation of the journal on a simulated disk.
//!
//! Each seed drives one store (a manual writer, so every file operation
//! happens in an order the seed fixes) on a [`SimDisk`] with random
//! appends of every record kind, acknowledgements, writer steps (batches
//! of different sizes), compactions, segment rollovers (small segments),
//! clean restarts, power losses at random operations and injected `EIO`s,
//! and after every restart checks the recovered state against a model:
//!
//! - every unit whose completion was reported `Ok` is there, byte for
//!   byte, and so is everything it changed (nothing reported is lost);
//! - nothing acknowledged, deleted or replaced by a reported unit comes
//!   back;
//! - the recovered state is exactly the model after all reported units and
//!   some of the units whose outcome was unknown (in flight at the power
//!   loss, or in the batch whose write or sync failed), in order; units
//!   refused after a failure are not there;
//! - after a failed `write` or `fdatasync` the store writes nothing more
//!   and reports no later unit as durable.
//!
//! Replay one seed: `SIM_SEED=1234 cargo test --test journal_sim -- --nocapture`.
//! Run new random seeds for a while: `scripts/simulate.sh [seconds]` (sets
//! `SIM_SECONDS`); a failure prints the seed to replay.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use rosetta::store::sim::{SimDisk, SimOp, SimRng};
use rosetta::store::{
    BindingDef, MessageSeq, Opaque, QueueDef, QueueId, Record, Store, StoreConfig, StoreError,
};

use common::journal_model::JournalModel;

/// Seeds CI runs (debug build, well under the two-minute budget).
const CI_SEEDS: std::ops::Range<u64> = 0..40;
/// Operations per seed.
const STEPS_PER_SEED: usize = 600;
/// Uncertain units up to which the recovered state is checked exactly
/// (against every subset of them); past it, the other checks still run.
const UNCERTAIN_EXACT_MAX: usize = 12;
const QUEUES: [QueueId; 4] = [1, 2, 3, 4];
const FILTERS: [&str; 3] = ["a/#", "a/+/c", "b"];
const TOPICS: [&str; 3] = ["t/1", "t/2", "t/3"];
const KEYS: [&str; 3] = ["k1", "k2", "k3"];

/// What became of one append.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// No completion yet.
    Pending,
    Ok,
    /// Failed in the batch that hit the error: may or may not be on disk.
    Failed,
    /// Refused: the store had failed before; never written.
    Refused,
}

struct Unit {
    records: Vec<Record>,
    outcome: Arc<Mutex<Outcome>>,
}

/// One seed's run.
struct Sim {
    seed: u64,
    rng: SimRng,
    disk: SimDisk,
    dir: PathBuf,
    segment_size: u64,
    store: Option<Store>,
    /// The state the last recovery was checked to hold.
    base: JournalModel,
    /// Units appended since that recovery, in order.
    units: Vec<Unit>,
    /// Everything appended since, as if all of it succeeds (picks what
    /// acks and delivery states refer to).
    optimistic: JournalModel,
    next_seq: MessageSeq,
    /// Disk writes and power losses when the store first reported a
    /// failure since it was opened.
    writes_at_failure: Option<(u64, u64)>,
    restarts: u64,
    exact_checks: u64,
    /// Damage the last recovery reported.
    last_report: String,
    /// Index in `units` of the first unit appended to the open store.
    first_unit_of_store: usize,
}

fn fail(seed: u64, disk: &SimDisk, what: String) -> ! {
    let trace = disk.trace();
    let from = trace.len().saturating_sub(60);
    panic!(
        "simulation seed {seed} failed: {what}\nreplay: SIM_SEED={seed} cargo test --test journal_sim -- --nocapture\nlast disk operations:\n  {}",
        trace[from..].join("\n  ")
    );
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = SimRng::new(seed);
        let segment_size = [1024, 2048, 4096, 16 * 1024][rng.below(4) as usize];
        Self {
            seed,
            rng,
            disk: SimDisk::new(seed),
            dir: PathBuf::from("/sim/journal"),
            segment_size,
            store: None,
            base: JournalModel::default(),
            units: Vec::new(),
            optimistic: JournalModel::default(),
            next_seq: 1,
            writes_at_failure: None,
            restarts: 0,
            exact_checks: 0,
            last_report: String::new(),
            first_unit_of_store: 0,
        }
    }

    fn fail(&self, what: String) -> ! {
        fail(
            self.seed,
            &self.disk,
            format!("{what}\nrecovery damage: {}", self.last_report),
        )
    }

    fn config(&self) -> StoreConfig {
        let mut c = StoreConfig::new(&self.dir);
        c.storage = Arc::new(self.disk.attach());
        c.background_writer = false;
        c.segment_size_bytes = self.segment_size;
        c.compaction_enabled = true;
        c.compaction_interval = std::time::Duration::from_secs(3600);
        c.rewrite_min_age = std::time::Duration::ZERO;
        c
    }

    fn store(&self) -> &Store {
        match &self.store {
            Some(s) => s,
            None => self.fail("no store open".into()),
        }
    }

    /// Opens the store and checks what it recovered. The recovered state
    /// becomes the new base when it is known to be durable: read after a
    /// power loss, or with no unit of unknown outcome behind it. (After a
    /// failed `fdatasync` and a restart without a power loss, recovery
    /// reads the failed batch back from the page cache: it may still be
    /// lost by a later power loss, so its units stay uncertain.)
    fn open_and_check(&mut self, mut after_power_loss: bool) {
        let mut attempts = 0;
        let (store, recovered) = loop {
            let before = self.disk.stats();
            attempts += 1;
            match Store::open(self.config()) {
                Ok(x) => break x,
                // The power failed during recovery: recover again.
                Err(_) if self.disk.stats().power_losses > before.power_losses => {
                    self.restarts += 1;
                    after_power_loss = true;
                }
                // An injected EIO failed the start: start again.
                Err(StoreError::Io { .. })
                    if self.disk.stats().faults > before.faults && attempts < 5 => {}
                Err(e) => self.fail(format!("open after restart {}: {e}", self.restarts)),
            }
        };
        self.last_report = format!("{:?}", recovered.report.damaged);
        let next_seq = recovered.next_seq;
        let messages = match recovered.messages.read_all() {
            Ok(m) => m,
            Err(e) => self.fail(format!("reading recovered messages: {e}")),
        };
        let got = JournalModel::from_recovered(
            &recovered.queues,
            &recovered.bindings,
            &messages,
            &recovered.retained,
            &recovered.state,
        );
        self.check(&got);
        if next_seq < got.messages.keys().next_back().map_or(0, |s| s + 1) {
            self.fail(format!(
                "next_seq {next_seq} is not above every recovered seq"
            ));
        }
        let uncertain = self
            .units
            .iter()
            .any(|u| matches!(*u.outcome.lock(), Outcome::Pending | Outcome::Failed));
        if after_power_loss || !uncertain {
            self.base = got.clone();
            self.units.clear();
        } else {
            // Refused units stay refused; the rest keep their outcome.
        }
        self.optimistic = got;
        self.writes_at_failure = None;
        self.first_unit_of_store = self.units.len();
        self.next_seq = self.next_seq.max(next_seq);
        self.store = Some(store);
    }

    /// The recovered state must be the base plus every reported unit plus
    /// some of the uncertain ones, in order.
    fn check(&mut self, got: &JournalModel) {
        let mut uncertain = Vec::new();
        for (i, u) in self.units.iter().enumerate() {
            match *u.outcome.lock() {
                Outcome::Ok => {}
                Outcome::Pending | Outcome::Failed => uncertain.push(i),
                Outcome::Refused => {}
            }
        }
        // Reported units survive byte for byte: each message a reported
        // unit placed, and no uncertain unit can have removed, is there.
        for (i, u) in self.units.iter().enumerate() {
            if *u.outcome.lock() != Outcome::Ok {
                continue;
            }
            for r in &u.records {
                let Record::Message { seq, body, .. } = r else {
                    continue;
                };
                let removed_later = self.units[i..].iter().any(|later| {
                    later.records.iter().any(|lr| match lr {
                        Record::Ack { seq: s, .. } => s == seq,
                        Record::QueueDelete { .. } => true,
                        _ => false,
                    })
                });
                let was_new = !self.base.messages.contains_key(seq);
                if was_new && !removed_later {
                    match got.messages.get(seq) {
                        Some((m, _)) if *m == body.to_bytes() => {}
                        Some(_) => self.fail(format!("message {seq} came back with other bytes")),
                        None => self.fail(format!("reported message {seq} was lost")),
                    }
                }
            }
        }
        if uncertain.len() > UNCERTAIN_EXACT_MAX {
            // Too many subsets to try: the checks above still held.
            return;
        }
        let n = uncertain.len();
        for mask in 0u32..(1u32 << n) {
            let mut m = self.base.clone();
            let mut k = 0;
            for (i, u) in self.units.iter().enumerate() {
                let take = match *u.outcome.lock() {
                    Outcome::Ok => true,
                    Outcome::Refused => false,
                    Outcome::Pending | Outcome::Failed => {
                        debug_assert_eq!(uncertain[k], i);
                        let t = mask & (1 << k) != 0;
                        k += 1;
                        t
                    }
                };
                if take {
                    m.apply_all(&u.records);
                }
            }
            if m == *got {
                self.exact_checks += 1;
                return;
            }
        }
        let mut all = self.base.clone();
        for u in &self.units {
            if *u.outcome.lock() == Outcome::Ok {
                all.apply_all(&u.records);
            }
        }
        let outcomes: Vec<String> = self
            .units
            .iter()
            .map(|u| format!("{:?}", *u.outcome.lock()))
            .collect();
        self.fail(format!(
            "recovered state matches no allowed outcome ({n} uncertain units)\n\
             units: {outcomes:?}\n\
             recovered: {}\n\
             reported only: {}",
            summary(got),
            summary(&all)
        ));
    }

    fn random_records(&mut self) -> Vec<Record> {
        let n = if self.rng.chance(50) {
            8 + self.rng.below(8)
        } else {
            1 + self.rng.below(3)
        };
        (0..n).map(|_| self.random_record()).collect()
    }

    fn random_queue(&mut self) -> QueueId {
        QUEUES[self.rng.below(QUEUES.len() as u64) as usize]
    }

    /// A seq the optimistic model holds on `queue`, if any.
    fn queued_seq(&mut self, queue: QueueId) -> Option<MessageSeq> {
        let seqs: Vec<MessageSeq> = self
            .optimistic
            .messages
            .iter()
            .filter(|(_, (_, p))| p.contains_key(&queue))
            .map(|(s, _)| *s)
            .collect();
        if seqs.is_empty() {
            return None;
        }
        Some(seqs[self.rng.below(seqs.len() as u64) as usize])
    }

    /// A message body as the store sees one: bytes, sometimes empty,
    /// sometimes past a sector.
    fn random_message(&mut self) -> Opaque {
        let len = match self.rng.below(10) {
            0 => 0,
            1 => 900 + self.rng.below(1200) as usize,
            _ => 1 + self.rng.below(200) as usize,
        };
        let fill = self.rng.next_u64();
        let body: Vec<u8> = (0..len)
            .map(|i| (fill >> (i % 8 * 8)) as u8 ^ i as u8)
            .collect();
        Opaque::Bytes(Bytes::from(body))
    }

    fn random_record(&mut self) -> Record {
        let q = self.random_queue();
        match self.rng.below(20) {
            0..=1 => Record::QueueDeclare(QueueDef {
                id: q,
                name: format!("q{q}"),
                // Opaque to the store: random bytes.
                attributes: Bytes::from(vec![
                    self.rng.below(256) as u8;
                    self.rng.below(10) as usize
                ]),
            }),
            2 => Record::QueueDelete { queue: q },
            3 => {
                // The options are opaque to the store: random bytes.
                let options = vec![self.rng.below(256) as u8; self.rng.below(12) as usize];
                Record::Bind(BindingDef {
                    queue: q,
                    filter: FILTERS[self.rng.below(3) as usize].into(),
                    options: Bytes::from(options),
                })
            }
            4 => Record::Unbind {
                queue: q,
                filter: FILTERS[self.rng.below(3) as usize].into(),
            },
            5..=10 => {
                let seq = self.next_seq;
                self.next_seq += 1;
                let mut queues: Vec<QueueId> = QUEUES
                    .iter()
                    .copied()
                    .filter(|_| self.rng.chance(350))
                    .collect();
                if queues.is_empty() {
                    queues.push(q);
                }
                Record::Message {
                    seq,
                    queues,
                    body: self.random_message(),
                }
            }
            11..=14 => match self.queued_seq(q) {
                Some(seq) => Record::Ack { queue: q, seq },
                None => Record::Ack {
                    queue: q,
                    seq: self.rng.below(self.next_seq.max(1)),
                },
            },
            15..=16 => {
                let seq = self
                    .queued_seq(q)
                    .unwrap_or_else(|| self.rng.below(self.next_seq.max(1)));
                // The state is opaque to the store: random bytes.
                let state = vec![self.rng.below(256) as u8; 1 + self.rng.below(8) as usize];
                Record::DeliveryState {
                    queue: q,
                    seq,
                    state: Bytes::from(state),
                }
            }
            17 => {
                let topic = TOPICS[self.rng.below(3) as usize].to_owned();
                if self.rng.below(3) == 0 {
                    Record::Retain {
                        topic,
                        message: None,
                    }
                } else {
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    Record::Retain {
                        topic,
                        message: Some((seq, self.random_message())),
                    }
                }
            }
            _ => {
                let key = KEYS[self.rng.below(3) as usize].to_owned();
                let value = (self.rng.below(3) != 0)
                    .then(|| Bytes::from(format!("v{}", self.rng.below(1000))));
                Record::State { key, value }
            }
        }
    }

    fn append(&mut self) {
        let records = self.random_records();
        self.optimistic.apply_all(&records);
        let outcome = Arc::new(Mutex::new(Outcome::Pending));
        let o = Arc::clone(&outcome);
        self.store().append(
            records.clone(),
            Some(Box::new(move |r: Result<(), StoreError>| {
                *o.lock() = match r {
                    Ok(()) => Outcome::Ok,
                    Err(StoreError::Failed(_)) | Err(StoreError::Closed) => Outcome::Refused,
                    Err(_) => Outcome::Failed,
                };
            })),
        );
        self.units.push(Unit { records, outcome });
    }

    /// Checks the fail-closed promises after any failure was reported.
    fn check_fail_closed(&mut self) {
        let from = self.first_unit_of_store;
        let first_failure = self.units[from..]
            .iter()
            .position(|u| matches!(*u.outcome.lock(), Outcome::Failed | Outcome::Refused));
        let Some(first) = first_failure.map(|i| from + i) else {
            return;
        };
        if let Some(i) = self.units[first..]
            .iter()
            .position(|u| *u.outcome.lock() == Outcome::Ok)
        {
            self.fail(format!(
                "unit {} reported durable after unit {first} failed",
                first + i
            ));
        }
        let now = (self.disk.stats().writes, self.disk.stats().power_losses);
        match self.writes_at_failure {
            None => self.writes_at_failure = Some(now),
            Some((writes, losses)) if losses == now.1 && writes != now.0 => self.fail(format!(
                "the store wrote {} times after it failed",
                now.0 - writes
            )),
            Some(_) => {}
        }
    }

    fn restart(&mut self) {
        if let Some(store) = self.store.take() {
            let _ = store.close();
        }
        self.restarts += 1;
        self.open_and_check(false);
    }

    fn run(&mut self) {
        self.open_and_check(true);
        let mut planned_power_loss = false;
        let power_losses = |s: &Sim| s.disk.stats().power_losses;
        for _ in 0..STEPS_PER_SEED {
            let losses_before = power_losses(self);
            match self.rng.below(100) {
                0..=44 => self.append(),
                45..=84 => {
                    self.store().step();
                }
                85..=87 => {
                    let _ = self.store().compact();
                }
                88..=89 => {
                    let _ = self.store().flush();
                }
                90..=92 if !planned_power_loss => {
                    let at = self.disk.stats().mutating_ops + 1 + self.rng.below(40);
                    self.disk.power_fails_at_op(at);
                    planned_power_loss = true;
                }
                93 => {
                    self.disk.power_loss();
                }
                94 => {
                    let op = if self.rng.coin() {
                        SimOp::Sync
                    } else {
                        SimOp::Write
                    };
                    self.disk.fail_next(op, None);
                }
                95..=96 => self.restart(),
                _ => self.append(),
            }
            self.check_fail_closed();
            if power_losses(self) > losses_before {
                planned_power_loss = false;
                // The broker died with the power: drop it, then restart.
                if let Some(store) = self.store.take() {
                    drop(store);
                }
                self.restarts += 1;
                self.open_and_check(true);
            } else if self.writes_at_failure.is_some() && self.rng.chance(300) {
                self.restart();
            }
        }
        self.restart();
    }
}

fn summary(m: &JournalModel) -> String {
    let msgs: Vec<String> = m
        .messages
        .iter()
        .map(|(s, (_, p))| format!("{s}@{:?}", p.keys().collect::<Vec<_>>()))
        .collect();
    format!(
        "queues {:?} bindings {} messages [{}] retained {:?} state {:?}",
        m.queues.keys().collect::<Vec<_>>(),
        m.bindings.len(),
        msgs.join(" "),
        m.retained.keys().collect::<Vec<_>>(),
        m.state
    )
}

fn run_seed(seed: u64) -> (u64, u64) {
    let mut sim = Sim::new(seed);
    sim.run();
    (sim.restarts, sim.exact_checks)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn journal_survives_random_crashes_and_failures() {
    if let Some(seed) = env_u64("SIM_SEED") {
        let (restarts, exact) = run_seed(seed);
        println!("seed {seed}: {restarts} restarts, {exact} exact checks");
        return;
    }
    if let Some(secs) = env_u64("SIM_SECONDS") {
        let start = std::time::Instant::now();
        let base = env_u64("SIM_SEED_BASE").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        let mut n = 0u64;
        while start.elapsed().as_secs() < secs {
            let seed = base.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            run_seed(seed);
            n += 1;
        }
        println!("{n} random seeds passed from base {base}");
        return;
    }
    let mut restarts = 0;
    let mut exact = 0;
    for seed in CI_SEEDS {
        let (r, e) = run_seed(seed);
        restarts += r;
        exact += e;
    }
    // The run must have exercised what it claims to.
    assert!(restarts > CI_SEEDS.end * 3, "restarts: {restarts}");
    assert!(exact > CI_SEEDS.end * 3, "exact checks: {exact}");
}
