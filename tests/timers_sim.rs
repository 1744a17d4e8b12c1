//! Seeded simulation of the core's timers (issue 16): scheduled delivery,
//! redelivery delay and leases, on a manual clock (no real sleeps) over
//! the journal over the simulated disk, with power losses, `EIO` and
//! clean restarts at random points.
//!
//! A producer publishes persistent messages (with confirm) to one durable
//! queue with a visibility timeout and a redelivery delay, half of them
//! scheduled for a time up to a few seconds ahead. A consumer accepts,
//! releases, fails or just holds what it gets; the clock moves in random
//! steps and the core's timers run. Checked, by message:
//!
//! - nothing is delivered before its delivery time, in any run of the
//!   broker (a restart never delivers early);
//! - a released, failed or lease-expired delivery does not come back
//!   before its redelivery delay is over (within one run of the broker,
//!   and across a clean restart, which journals when the delay ends);
//! - a delivery held past its lease comes back while the consumer stays
//!   connected, and settling it late is refused with `LeaseExpired`;
//! - a publish the core confirmed is delivered again after every restart
//!   (once its time comes), unless its accept was confirmed; an accepted
//!   one never comes back.
//!
//! Replay: `SIM_SEED=1234 cargo test --test timers_sim -- --nocapture`;
//! `SIM_SECONDS=600 cargo test --test timers_sim` runs new seeds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use rosetta::core::{
    AllowAll, Clock, Core, CoreConfig, ManualClock, QueueMatch, QueueOverrides, QueueRule,
    QueueRules,
};
use rosetta::store::sim::{SimDisk, SimRng};
use rosetta::store::{Store, StoreConfig};
use rosetta_neutral::{
    Address, Broker, BrokerError, ConsumerId, ConsumerSpec, CreditMode, DeliveryTag, Message,
    Outcome, Principal, Protocol, PublishOptions, QueueLifetime, QueueSpec, Session, SessionEvent,
    SessionInfo, Ticket,
};

#[path = "common/sim.rs"]
mod sim;

use sim::EventQueue;

const CI_SEEDS: std::ops::Range<u64> = 0..12;
const STEPS_PER_SEED: usize = 400;
const QUEUE: &str = "timed";
const T0_MS: u64 = 1_700_000_000_000;
const LEASE_MS: u32 = 700;
const REDELIVERY_DELAY_MS: u64 = 300;
/// Furthest ahead a message is scheduled.
const SCHEDULE_AHEAD_MS_MAX: u64 = 4_000;
/// Longest step of the clock.
const CLOCK_STEP_MS_MAX: u64 = 400;
const WINDOW: u32 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Published, its commit not reported yet (or failed).
    Unconfirmed,
    /// Confirmed: must be delivered after every restart, once due.
    Durable,
    /// An accept was sent and not confirmed.
    Accepting,
    /// The accept was confirmed: must never come back.
    Accepted,
}

#[derive(Debug)]
enum Pending {
    Publish(u64),
    Accept(u64),
}

/// What is known of one message.
#[derive(Debug)]
struct Tracked {
    known: Known,
    delivery_time: Option<u64>,
    /// Not to be delivered again before this time (a redelivery delay).
    not_before: u64,
    /// Delivered at least once by this run of the broker.
    seen_this_run: bool,
}

/// A delivery the consumer holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    consumer: ConsumerId,
    tag: DeliveryTag,
    at_ms: u64,
}

struct Broker1 {
    store: Arc<Store>,
    core: Core,
    producer: Box<dyn Session>,
    consumer: Box<dyn Session>,
    psink: Arc<EventQueue>,
    csink: Arc<EventQueue>,
}

struct Sim {
    seed: u64,
    rng: SimRng,
    disk: SimDisk,
    clock: Arc<ManualClock>,
    dir: PathBuf,
    broker: Option<Broker1>,
    next_id: u64,
    messages: BTreeMap<u64, Tracked>,
    tickets: BTreeMap<Ticket, Pending>,
    held: BTreeMap<u64, Held>,
    /// Tags whose lease ran out (the core said so), to settle late.
    expired: Vec<(u64, ConsumerId, DeliveryTag)>,
    failed: bool,
    restarts: u64,
    lease_expiries: u64,
    late_settles_refused: u64,
    scheduled_delivered: u64,
}

fn body(id: u64) -> String {
    format!("message-{id}-{}", "x".repeat((id % 13) as usize * 11))
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
            clock: Arc::new(ManualClock::new(T0_MS)),
            dir: PathBuf::from("/sim/timers/journal"),
            broker: None,
            next_id: 1,
            messages: BTreeMap::new(),
            tickets: BTreeMap::new(),
            held: BTreeMap::new(),
            expired: Vec::new(),
            failed: false,
            restarts: 0,
            lease_expiries: 0,
            late_settles_refused: 0,
            scheduled_delivered: 0,
        }
    }

    fn fail(&self, what: String) -> ! {
        let trace = self.disk.trace();
        let from = trace.len().saturating_sub(30);
        panic!(
            "simulation seed {} failed at clock +{} ms: {what}\nreplay: SIM_SEED={} cargo test --test timers_sim -- --nocapture\nlast disk operations:\n  {}",
            self.seed,
            self.now() - T0_MS,
            self.seed,
            trace[from..].join("\n  ")
        );
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    fn store_config(&self) -> StoreConfig {
        let mut c = StoreConfig::new(&self.dir);
        c.storage = Arc::new(self.disk.attach());
        c.background_writer = false;
        c.segment_size_bytes = 4096;
        c.compaction_interval = std::time::Duration::from_secs(3600);
        c
    }

    fn core_config() -> CoreConfig {
        let overrides = QueueOverrides {
            visibility_timeout_ms: Some(LEASE_MS),
            redelivery_delay_ms: Some(REDELIVERY_DELAY_MS),
            // Attempts pile up over restarts and expiries: never dead-letter.
            delivery_attempts_max: Some(u32::MAX),
            ..QueueOverrides::default()
        };
        CoreConfig {
            queue_rules: QueueRules::new([QueueRule {
                target: QueueMatch::Name(QUEUE.into()),
                overrides,
            }]),
            delivery_attempts_max: u32::MAX,
            ..CoreConfig::default()
        }
    }

    fn b(&mut self) -> &mut Broker1 {
        match self.broker.as_mut() {
            Some(b) => b,
            None => panic!("no broker"),
        }
    }

    fn start(&mut self) {
        let (store, recovered) = match sim::open_store(&self.disk, || self.store_config()) {
            Ok(x) => x,
            Err(e) => self.fail(format!("open: {e}")),
        };
        let store = Arc::new(store);
        let core = Core::with_clock(
            Self::core_config(),
            store.clone(),
            Arc::new(AllowAll),
            Some(recovered),
            self.clock.clone(),
        );
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
        let spec = QueueSpec {
            name: Some(QUEUE.into()),
            durable: true,
            lifetime: QueueLifetime::Permanent,
            bindings_max: None,
        };
        if let Err(e) = producer.declare_queue(spec) {
            self.fail(format!("declare: {e}"));
        }
        let spec = ConsumerSpec {
            queue: QUEUE.into(),
            credit: CreditMode::Window(WINDOW),
            auto_settle: false,
            options: Default::default(),
        };
        if let Err(e) = consumer.consume(spec) {
            self.fail(format!("consume: {e}"));
        }
        self.broker = Some(Broker1 {
            store,
            core,
            producer,
            consumer,
            psink,
            csink,
        });
        self.tickets.clear();
        self.held.clear();
        self.expired.clear();
        self.failed = false;
        for m in self.messages.values_mut() {
            m.seen_this_run = false;
        }
        self.drain_events();
    }

    /// Stops the broker. `orderly`: closed in order; when the journal
    /// reported no failure and the close succeeded, whatever it journaled
    /// (the end of every redelivery delay) is on disk.
    fn stop(&mut self, orderly: bool) {
        let mut clean = orderly && !self.failed;
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
            match Arc::try_unwrap(store) {
                Ok(store) => clean &= store.close().is_ok(),
                Err(_) => clean = false,
            }
        }
        self.restarts += 1;
        for m in self.messages.values_mut() {
            // A delivery held when the broker went comes back at once; a
            // delay whose end may not have reached the disk is forgotten.
            if !clean {
                m.not_before = 0;
            }
        }
        for id in std::mem::take(&mut self.held).into_keys() {
            if let Some(m) = self.messages.get_mut(&id) {
                m.not_before = 0;
            }
        }
    }

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
        let now = self.now();
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
                match pending {
                    Pending::Publish(id) => {
                        if let Some(m) = self.messages.get_mut(&id) {
                            if m.known == Known::Unconfirmed {
                                m.known = Known::Durable;
                            }
                        }
                    }
                    Pending::Accept(id) => {
                        if let Some(m) = self.messages.get_mut(&id) {
                            m.known = Known::Accepted;
                        }
                    }
                }
            }
            SessionEvent::LeaseExpired { consumer, tag } => {
                let Some((&id, held)) = self
                    .held
                    .iter()
                    .find(|(_, h)| h.consumer == consumer && h.tag == tag)
                else {
                    self.fail(format!("lease expiry of a tag not held: {tag:?}"));
                };
                if now < held.at_ms + u64::from(LEASE_MS) {
                    self.fail(format!(
                        "lease of message {id} expired after {} ms, before its {LEASE_MS} ms",
                        now - held.at_ms
                    ));
                }
                self.held.remove(&id);
                self.expired.push((id, consumer, tag));
                self.lease_expiries += 1;
                if let Some(m) = self.messages.get_mut(&id) {
                    m.not_before = now + REDELIVERY_DELAY_MS;
                }
            }
            SessionEvent::Delivery(d) => {
                let Some(id) = id_of(&d.message) else {
                    self.fail("delivery of a message never published".into());
                };
                let Some(m) = self.messages.get_mut(&id) else {
                    self.fail(format!("message {id} was never published"));
                };
                if m.known == Known::Accepted {
                    self.fail(format!("accepted message {id} delivered again"));
                }
                if let Some(t) = m.delivery_time.filter(|&t| now < t) {
                    self.fail(format!("message {id} delivered {} ms early", t - now));
                }
                if now < m.not_before {
                    let early = m.not_before - now;
                    self.fail(format!(
                        "message {id} redelivered {early} ms before its delay was over"
                    ));
                }
                if m.delivery_time.is_some() && !m.seen_this_run {
                    self.scheduled_delivered += 1;
                }
                m.seen_this_run = true;
                let held = Held {
                    consumer: d.consumer,
                    tag: d.tag,
                    at_ms: now,
                };
                if self.held.insert(id, held).is_some() {
                    self.fail(format!("message {id} delivered twice at once"));
                }
            }
            _ => {}
        }
    }

    fn publish(&mut self) {
        let id = self.next_id;
        self.next_id += 1;
        let mut m = Message::text(body(id));
        m.durable = true;
        let delivery_time = self
            .rng
            .coin()
            .then(|| self.now() + 1 + self.rng.below(SCHEDULE_AHEAD_MS_MAX));
        m.delivery_time = delivery_time;
        let options = PublishOptions {
            txn: None,
            confirm: true,
        };
        let address = Address::Queue(QUEUE.into());
        if let Ok(receipt) = self.b().producer.publish(&address, m, options) {
            self.messages.insert(
                id,
                Tracked {
                    known: Known::Unconfirmed,
                    delivery_time,
                    not_before: 0,
                    seen_this_run: false,
                },
            );
            if let Some(t) = receipt.pending {
                self.tickets.insert(t, Pending::Publish(id));
            }
        }
    }

    fn pick_held(&mut self) -> Option<(u64, Held)> {
        if self.held.is_empty() {
            return None;
        }
        let k = self.rng.below(self.held.len() as u64) as usize;
        let (&id, &held) = self.held.iter().nth(k)?;
        // A delivery whose lease ran out by the clock may be returned by
        // the timers at any moment: settle only those still leased.
        (self.now() < held.at_ms + u64::from(LEASE_MS)).then_some((id, held))
    }

    fn accept(&mut self) {
        let Some((id, held)) = self.pick_held() else {
            return;
        };
        self.held.remove(&id);
        let r = self
            .b()
            .consumer
            .settle(held.consumer, held.tag, Outcome::Accept, None, true);
        match r {
            Ok(t) => {
                if let Some(m) = self.messages.get_mut(&id) {
                    if matches!(m.known, Known::Durable | Known::Unconfirmed) {
                        m.known = Known::Accepting;
                    }
                }
                if let Some(t) = t {
                    self.tickets.insert(t, Pending::Accept(id));
                }
            }
            Err(BrokerError::LeaseExpired) => {
                self.fail(format!("accept of message {id} inside its lease refused"))
            }
            Err(_) => {}
        }
    }

    /// Gives a delivery back (released, or failed): it waits out the delay.
    fn give_back(&mut self) {
        let Some((id, held)) = self.pick_held() else {
            return;
        };
        self.held.remove(&id);
        let outcome = if self.rng.coin() {
            Outcome::Release
        } else {
            Outcome::Modify {
                delivery_failed: true,
                undeliverable_here: false,
            }
        };
        let now = self.now();
        match self
            .b()
            .consumer
            .settle(held.consumer, held.tag, outcome, None, false)
        {
            Ok(_) => {
                if let Some(m) = self.messages.get_mut(&id) {
                    m.not_before = now + REDELIVERY_DELAY_MS;
                }
            }
            Err(e) => self.fail(format!("giving back message {id}: {e}")),
        }
    }

    /// Settles a delivery whose lease ran out: refused, and the copy
    /// delivered again (if it was) stays in flight.
    fn settle_late(&mut self) {
        let Some((id, consumer, tag)) = self.expired.pop() else {
            return;
        };
        match self
            .b()
            .consumer
            .settle(consumer, tag, Outcome::Accept, None, true)
        {
            Err(BrokerError::LeaseExpired) => self.late_settles_refused += 1,
            Ok(_) => self.fail(format!(
                "a late accept of message {id} was applied after its lease ran out"
            )),
            Err(e) => self.fail(format!("late accept of message {id}: {e}")),
        }
    }

    fn tick(&mut self) {
        let step = 1 + self.rng.below(CLOCK_STEP_MS_MAX);
        self.clock.advance(step);
        self.b().core.run_timers();
    }

    /// Moves the clock past every time and delay, stepping the journal,
    /// and checks that every confirmed message was delivered by this run.
    fn check_everything_comes(&mut self) {
        for _ in 0..200 {
            self.clock.advance(100);
            self.b().core.run_timers();
            self.b().store.step();
            self.drain_events();
        }
        let missing: Vec<u64> = self
            .messages
            .iter()
            .filter(|(_, m)| m.known == Known::Durable && !m.seen_this_run)
            .map(|(id, _)| *id)
            .collect();
        if !missing.is_empty() {
            self.fail(format!(
                "confirmed messages never delivered after the last restart: {missing:?}"
            ));
        }
    }

    fn run(&mut self) {
        self.start();
        let mut planned = false;
        for _ in 0..STEPS_PER_SEED {
            let losses = self.disk.stats().power_losses;
            match self.rng.below(100) {
                0..=24 => self.publish(),
                25..=44 => {
                    self.b().store.step();
                }
                45..=59 => self.tick(),
                60..=71 => self.accept(),
                72..=79 => self.give_back(),
                80..=83 => self.settle_late(),
                84..=85 if !planned => {
                    sim::plan_power_loss(&self.disk, &mut self.rng);
                    planned = true;
                }
                86 => self.disk.power_loss(),
                87 => sim::fail_next_write_or_sync(&self.disk, &mut self.rng),
                88..=89 => {
                    self.stop(true);
                    self.start();
                }
                _ => self.tick(),
            }
            self.drain_events();
            if self.disk.stats().power_losses > losses {
                planned = false;
                self.stop(false);
                self.start();
            } else if self.failed && self.rng.chance(300) {
                self.stop(false);
                self.start();
            }
        }
        // A last clean restart with a healthy disk: everything confirmed
        // comes, at its time or after its delay.
        self.disk.power_fails_at_op(u64::MAX);
        self.stop(true);
        self.start();
        self.check_everything_comes();
        self.stop(true);
    }
}

struct Totals {
    restarts: u64,
    lease_expiries: u64,
    late_settles_refused: u64,
    scheduled_delivered: u64,
}

fn run_seed(seed: u64) -> Totals {
    let mut sim = Sim::new(seed);
    sim.run();
    Totals {
        restarts: sim.restarts,
        lease_expiries: sim.lease_expiries,
        late_settles_refused: sim.late_settles_refused,
        scheduled_delivered: sim.scheduled_delivered,
    }
}

#[test]
fn timers_hold_over_random_crashes_on_a_manual_clock() {
    let report = |seed, t: Totals| {
        println!(
            "seed {seed}: {} restarts, {} lease expiries, {} late settles refused, {} scheduled deliveries",
            t.restarts, t.lease_expiries, t.late_settles_refused, t.scheduled_delivered
        );
    };
    if sim::run_seeds_from_env(run_seed, report) {
        return;
    }
    let mut totals = Totals {
        restarts: 0,
        lease_expiries: 0,
        late_settles_refused: 0,
        scheduled_delivered: 0,
    };
    for seed in CI_SEEDS {
        let t = run_seed(seed);
        totals.restarts += t.restarts;
        totals.lease_expiries += t.lease_expiries;
        totals.late_settles_refused += t.late_settles_refused;
        totals.scheduled_delivered += t.scheduled_delivered;
    }
    // The simulation must have exercised what it checks.
    let seeds = CI_SEEDS.end;
    assert!(totals.restarts > seeds * 3, "restarts: {}", totals.restarts);
    assert!(
        totals.lease_expiries > seeds * 5,
        "lease expiries: {}",
        totals.lease_expiries
    );
    assert!(
        totals.late_settles_refused > seeds,
        "late settles refused: {}",
        totals.late_settles_refused
    );
    assert!(
        totals.scheduled_delivered > seeds * 10,
        "scheduled deliveries: {}",
        totals.scheduled_delivered
    );
}
