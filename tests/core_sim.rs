//! Seeded simulation of the core over the journal over a simulated disk.
//!
//! A producer session publishes persistent messages (with confirm) to two
//! durable queues, a consumer session receives them and accepts some
//! (with confirm), the journal's manual writer is stepped at random
//! points, and the power fails at random operations (or the broker
//! restarts cleanly, or a write or sync fails with `EIO`). After each
//! restart a new core is built from the recovered journal and the queues
//! are read out. Checked, by message:
//!
//! - a publish the core confirmed (`Committed` Ok), and whose accept was
//!   not confirmed, is in its queue, once, byte for byte;
//! - a message whose accept was confirmed is not;
//! - nothing is there that was never published;
//! - after a failure no later publish or accept is confirmed.
//!
//! Replay: `SIM_SEED=1234 cargo test --test core_sim -- --nocapture`;
//! `scripts/simulate.sh` runs new seeds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use rosetta::core::{AllowAll, Core, CoreConfig};
use rosetta::store::sim::{SimDisk, SimRng};
use rosetta::store::{Store, StoreConfig};
use rosetta_neutral::{
    Address, Broker, ConsumerId, ConsumerSpec, CreditMode, DeliveryTag, Message, Outcome,
    Principal, Protocol, PublishOptions, QueueLifetime, QueueSpec, Session, SessionEvent,
    SessionInfo, Ticket,
};

#[path = "common/sim.rs"]
mod sim;

use sim::EventQueue;

const CI_SEEDS: std::ops::Range<u64> = 0..25;
/// Small enough that restored queues page (the budget is per broker).
const MEMORY_BUDGET_BYTES: u64 = 8 * 1024;
const STEPS_PER_SEED: usize = 500;
const QUEUES: [&str; 2] = ["orders", "billing"];
/// Deliveries a consumer may hold unsettled: more than a queue ever holds
/// here, so that after a restart every queued message is delivered and
/// can be checked.
const WINDOW: u32 = 100_000;

/// What is known of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Published; its commit not reported yet (or failed): may or may not
    /// be in the journal.
    Unconfirmed,
    /// The core confirmed the publish: it must be there until accepted.
    Durable,
    /// An accept was sent and not confirmed: may be gone or not.
    Accepting,
    /// The accept was confirmed: it must never come back.
    Accepted,
    /// Recovery showed it is not there (it never became durable).
    Gone,
}

#[derive(Debug)]
enum Pending {
    Publish(u64),
    Accept(u64),
}

struct Broker1 {
    store: Arc<Store>,
    core: Core,
    producer: Box<dyn Session>,
    consumer: Box<dyn Session>,
    psink: Arc<EventQueue>,
    csink: Arc<EventQueue>,
    consumers: BTreeMap<ConsumerId, usize>,
}

struct Sim {
    seed: u64,
    rng: SimRng,
    disk: SimDisk,
    dir: PathBuf,
    broker: Option<Broker1>,
    next_id: u64,
    /// message id -> (queue index, what is known)
    messages: BTreeMap<u64, (usize, Known)>,
    tickets: BTreeMap<Ticket, Pending>,
    /// Deliveries held by the consumer: message id -> (consumer, tag).
    held: BTreeMap<u64, (ConsumerId, DeliveryTag)>,
    /// A failure was reported by this broker run.
    failed: bool,
    restarts: u64,
    confirmed: u64,
    /// Messages the restores paged by reference, all restarts together.
    paged_at_restore: u64,
    /// Page files (a cache, on real files).
    paging: tempfile::TempDir,
}

fn body(id: u64) -> String {
    format!("message-{id}-{}", "x".repeat((id % 97) as usize * 7))
}

fn id_of(m: &Message) -> Option<u64> {
    sim::id_in(&String::from_utf8_lossy(&m.body.bytes), "message-", body)
}

impl Sim {
    fn new(seed: u64) -> Self {
        Self {
            seed,
            rng: SimRng::new(seed),
            disk: SimDisk::new(seed),
            dir: PathBuf::from("/sim/core/journal"),
            broker: None,
            next_id: 1,
            messages: BTreeMap::new(),
            tickets: BTreeMap::new(),
            held: BTreeMap::new(),
            failed: false,
            restarts: 0,
            confirmed: 0,
            paged_at_restore: 0,
            paging: match tempfile::tempdir() {
                Ok(d) => d,
                Err(e) => panic!("tempdir: {e}"),
            },
        }
    }

    fn fail(&self, what: String) -> ! {
        let trace = self.disk.trace();
        let from = trace.len().saturating_sub(40);
        panic!(
            "simulation seed {} failed: {what}\nreplay: SIM_SEED={} cargo test --test core_sim -- --nocapture\nlast disk operations:\n  {}",
            self.seed,
            self.seed,
            trace[from..].join("\n  ")
        );
    }

    fn config(&self) -> StoreConfig {
        let mut c = StoreConfig::new(&self.dir);
        c.storage = Arc::new(self.disk.attach());
        c.background_writer = false;
        c.segment_size_bytes = 4096;
        c.compaction_interval = std::time::Duration::from_secs(3600);
        c.rewrite_min_age = std::time::Duration::ZERO;
        c
    }

    fn b(&mut self) -> &mut Broker1 {
        match self.broker.as_mut() {
            Some(b) => b,
            None => panic!("no broker"),
        }
    }

    /// Starts a broker on what the journal recovered, consumes every queue
    /// and checks what comes out.
    fn start(&mut self) {
        let (store, recovered) = match sim::open_store(&self.disk, || self.config()) {
            Ok(x) => x,
            Err(e) => self.fail(format!("open: {e}")),
        };
        let store = Arc::new(store);
        let losses_at_open = self.disk.stats().power_losses;
        // Every restart returns the held deliveries as a failed attempt;
        // dead-lettering after ten would move them out of sight.
        // A small memory budget: restored queues page most of their
        // messages by reference into the journal, and compaction moves
        // their records before they are read back.
        let config = CoreConfig {
            delivery_attempts_max: u32::MAX,
            memory_budget_bytes: MEMORY_BUDGET_BYTES,
            paging_dir: Some(self.paging.path().join("paging")),
            ..CoreConfig::default()
        };
        let core = Core::new(config, store.clone(), Arc::new(AllowAll), Some(recovered));
        // Sometimes compaction runs between the restore and the first read
        // of the paged messages, moving the records they refer to.
        if self.rng.coin() {
            let _ = store.compact();
        }
        self.paged_at_restore += core.messages_paged();
        let info = |conn_id| SessionInfo {
            conn_id,
            protocol: Protocol::Amqp,
            principal: Principal { user: None },
            client_id: None,
            take_over: false,
        };
        let psink = Arc::new(EventQueue::default());
        let csink = Arc::new(EventQueue::default());
        let mut producer = core.open_session(info(1), psink.clone());
        let mut consumer = core.open_session(info(2), csink.clone());
        for q in QUEUES {
            let spec = QueueSpec {
                name: Some(q.into()),
                durable: true,
                lifetime: QueueLifetime::Permanent,
                bindings_max: None,
            };
            if let Err(e) = producer.declare_queue(spec) {
                self.fail(format!("declare {q}: {e}"));
            }
        }
        let mut consumers = BTreeMap::new();
        for (i, q) in QUEUES.iter().enumerate() {
            let spec = ConsumerSpec {
                queue: (*q).into(),
                credit: CreditMode::Window(WINDOW),
                auto_settle: false,
                options: Default::default(),
            };
            match consumer.consume(spec) {
                Ok(c) => {
                    consumers.insert(c, i);
                }
                Err(e) => self.fail(format!("consume {q}: {e}")),
            }
        }
        self.broker = Some(Broker1 {
            store,
            core,
            producer,
            consumer,
            psink,
            csink,
            consumers,
        });
        self.tickets.clear();
        self.held.clear();
        self.failed = false;
        if self.disk.stats().power_losses > losses_at_open {
            // The power failed while starting (in that compaction): this
            // broker died with it; start again.
            self.stop();
            return self.start();
        }
        self.check_after_restart();
    }

    /// What the queues hold now (all of it delivered to the consumer)
    /// must agree with what was confirmed.
    fn check_after_restart(&mut self) {
        self.drain_events();
        let present: BTreeSet<u64> = self.held.keys().copied().collect();
        let mut verdict = None;
        for (id, (_, known)) in self.messages.iter_mut() {
            let here = present.contains(id);
            match (*known, here) {
                (Known::Durable, false) => {
                    verdict.get_or_insert(format!("confirmed message {id} is gone"));
                }
                (Known::Accepted, true) => {
                    verdict.get_or_insert(format!("accepted message {id} came back"));
                }
                (Known::Gone, true) => {
                    verdict.get_or_insert(format!("message {id} came back after it was gone"));
                }
                (Known::Unconfirmed | Known::Accepting, true) => *known = Known::Durable,
                (Known::Unconfirmed | Known::Accepting, false) => *known = Known::Gone,
                _ => {}
            }
        }
        if let Some(v) = verdict {
            self.fail(v);
        }
    }

    /// Handles every event of both sessions.
    fn drain_events(&mut self) {
        loop {
            let b = self.b();
            let mut events = b.psink.take();
            events.extend(b.csink.take());
            if events.is_empty() {
                return;
            }
            for e in events {
                self.event(e);
            }
        }
    }

    fn event(&mut self, e: SessionEvent) {
        match e {
            SessionEvent::Committed { ticket, result } => {
                let Some(pending) = self.tickets.remove(&ticket) else {
                    return;
                };
                if result.is_err() {
                    self.failed = true;
                    return;
                }
                if self.failed {
                    self.fail(format!("{pending:?} confirmed after a failure"));
                }
                self.confirmed += 1;
                match pending {
                    Pending::Publish(id) => {
                        if let Some(m) = self.messages.get_mut(&id) {
                            if m.1 == Known::Unconfirmed {
                                m.1 = Known::Durable;
                            }
                        }
                    }
                    Pending::Accept(id) => {
                        if let Some(m) = self.messages.get_mut(&id) {
                            m.1 = Known::Accepted;
                        }
                    }
                }
            }
            SessionEvent::Delivery(d) => {
                let Some(id) = id_of(&d.message) else {
                    self.fail(format!(
                        "delivery of a message never published: {:?}",
                        String::from_utf8_lossy(&d.message.body.bytes)
                    ));
                };
                let queue = self.b().consumers.get(&d.consumer).copied();
                match self.messages.get(&id) {
                    None => self.fail(format!("message {id} was never published")),
                    Some((q, _)) if Some(*q) != queue => {
                        self.fail(format!("message {id} delivered from the wrong queue"))
                    }
                    Some((_, Known::Accepted)) => {
                        self.fail(format!("accepted message {id} delivered again"))
                    }
                    Some(_) => {}
                }
                if self.held.insert(id, (d.consumer, d.tag)).is_some() {
                    self.fail(format!("message {id} delivered twice at once"));
                }
            }
            _ => {}
        }
    }

    fn publish(&mut self) {
        let id = self.next_id;
        self.next_id += 1;
        let queue = self.rng.below(QUEUES.len() as u64) as usize;
        let mut m = Message::text(body(id));
        m.durable = true;
        let options = PublishOptions {
            txn: None,
            confirm: true,
        };
        let address = Address::Queue(QUEUES[queue].into());
        let r = self.b().producer.publish(&address, m, options);
        // An error is a refusal before anything was written (the journal
        // failed): nothing to track.
        if let Ok(receipt) = r {
            self.messages.insert(id, (queue, Known::Unconfirmed));
            if let Some(t) = receipt.pending {
                self.tickets.insert(t, Pending::Publish(id));
            }
        }
    }

    fn accept(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let k = self.rng.below(self.held.len() as u64) as usize;
        let Some((&id, &(consumer, tag))) = self.held.iter().nth(k) else {
            return;
        };
        self.held.remove(&id);
        let r = self
            .b()
            .consumer
            .settle(consumer, tag, Outcome::Accept, None, true);
        if let Ok(t) = r {
            if let Some(m) = self.messages.get_mut(&id) {
                if m.1 == Known::Durable || m.1 == Known::Unconfirmed {
                    m.1 = Known::Accepting;
                }
            }
            if let Some(t) = t {
                self.tickets.insert(t, Pending::Accept(id));
            }
        }
    }

    fn stop(&mut self) {
        if let Some(b) = self.broker.take() {
            let Broker1 {
                store,
                core,
                producer,
                consumer,
                ..
            } = b;
            drop(producer);
            drop(consumer);
            core.shutdown();
            drop(core);
            if let Ok(store) = Arc::try_unwrap(store) {
                let _ = store.close();
            }
        }
        self.restarts += 1;
    }

    fn run(&mut self) {
        self.start();
        let mut planned = false;
        for _ in 0..STEPS_PER_SEED {
            let losses = self.disk.stats().power_losses;
            match self.rng.below(100) {
                0..=34 => self.publish(),
                35..=69 => {
                    self.b().store.step();
                }
                70..=89 => self.accept(),
                90..=92 if !planned => {
                    sim::plan_power_loss(&self.disk, &mut self.rng);
                    planned = true;
                }
                93 => self.disk.power_loss(),
                94 => sim::fail_next_write_or_sync(&self.disk, &mut self.rng),
                95..=96 => {
                    self.stop();
                    self.start();
                }
                _ => self.publish(),
            }
            self.drain_events();
            if self.disk.stats().power_losses > losses {
                planned = false;
                self.stop();
                self.start();
            } else if self.failed && self.rng.chance(300) {
                self.stop();
                self.start();
            }
        }
        self.stop();
        self.start();
        self.stop();
    }
}

fn run_seed(seed: u64) -> (u64, u64, u64) {
    let mut sim = Sim::new(seed);
    sim.run();
    (sim.restarts, sim.confirmed, sim.paged_at_restore)
}

#[test]
fn core_over_the_journal_survives_random_crashes_and_failures() {
    if std::env::var_os("SIM_SEED").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter("warn").try_init();
    }
    let report = |seed, (restarts, confirmed, paged): (u64, u64, u64)| {
        println!(
            "seed {seed}: {restarts} restarts, {confirmed} confirmations, {paged} paged at restore"
        );
    };
    if sim::run_seeds_from_env(run_seed, report) {
        return;
    }
    let mut restarts = 0;
    let mut confirmed = 0;
    let mut paged = 0;
    for seed in CI_SEEDS {
        let (r, c, p) = run_seed(seed);
        restarts += r;
        confirmed += c;
        paged += p;
    }
    assert!(restarts > CI_SEEDS.end * 3, "restarts: {restarts}");
    assert!(confirmed > CI_SEEDS.end * 50, "confirmations: {confirmed}");
    assert!(
        paged > CI_SEEDS.end * 10,
        "paged by reference at restores: {paged}"
    );
}
