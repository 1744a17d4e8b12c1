//! One queue: its messages, its consumers and its dispatch.
//!
//! A queue is the unit of ownership in the core (as in a distributed queue
//! service, one place owns each queue's state). Everything about it sits
//! behind one mutex that is held only for in-memory work: never across IO,
//! never across an `.await`. Journal records produced while it is held are
//! collected in a [`Batch`](super::batch::Batch) and written after.
//!
//! Messages wait in the [`Backlog`], ordered by priority and then by their
//! global sequence number, so a released message goes back to its original
//! place (FIFO per priority); past the memory budget it pages them to disk.
//! Delivered-but-unsettled messages sit in `inflight`, keyed by their
//! delivery tag (unique per delivery, see `QueueState::next_tag`), until
//! settled, returned, or their lease runs out (`lease`).
//!
//! Who gets which message (priorities, exclusive consumers, consumer
//! priority, selectors, browsers, message groups) is the `dispatch`
//! module's job; message groups' assignments are in `groups`.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use rosetta_neutral::id_hash::BuildIdHasher;
use rosetta_neutral::{ConsumerId, CreditMode, EventSink, MatchInfo, Message, QueueLifetime};

pub(crate) use super::backlog::MemoryGauge;
use super::backlog::{Backlog, Place};
use super::dedup::DedupWindow;
use super::dispatch::DispatchPolicy;
use super::groups::Groups;
use super::last_value::{Arrival, LastValues};
use super::lease::Leases;
use super::queue_settings::QueueSettings;
use super::schedule::{Schedule, Timers, SCHEDULE_RELEASE_BATCH_MAX};
use super::selector::Selector;
use rosetta_neutral::LazyMap;
use rosetta_store::{MessageSeq, QueueId, Record};

/// A consumer, globally unique: the session id and the session's consumer id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ConsumerKey {
    pub(crate) session: u64,
    pub(crate) consumer: ConsumerId,
}

/// A message waiting in (or in flight from) a queue.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) seq: MessageSeq,
    pub(crate) message: Arc<Message>,
    pub(crate) delivery_count: u32,
    pub(crate) redelivered: bool,
    pub(crate) from_retained: bool,
    pub(crate) matched: MatchInfo,
    pub(crate) annotation: Option<Bytes>,
    /// The message record for this queue is in the journal.
    pub(crate) journaled: bool,
    /// When it was enqueued, by the core's clock (ms since the epoch): the
    /// clock the caller read once for its whole batch, not a reading of
    /// its own per message.
    pub(crate) enqueued_at_ms: u64,
    /// Not to be redelivered to this consumer (AMQP undeliverable-here).
    pub(crate) excluded: Option<ConsumerKey>,
    /// In flight on a lease that runs out at this time (see `lease`).
    pub(crate) lease_until: Option<u64>,
}

impl Entry {
    pub(crate) fn new(
        seq: MessageSeq,
        message: Arc<Message>,
        journaled: bool,
        enqueued_at_ms: u64,
    ) -> Self {
        Self {
            seq,
            message,
            delivery_count: 0,
            redelivered: false,
            from_retained: false,
            matched: MatchInfo::default(),
            annotation: None,
            journaled,
            enqueued_at_ms,
            excluded: None,
            lease_until: None,
        }
    }
}

pub(crate) struct ConsumerSlot {
    pub(crate) key: ConsumerKey,
    pub(crate) mode: CreditMode,
    /// Deliveries the consumer may still receive now.
    pub(crate) credit: u32,
    /// Deliveries handed to the consumer since it attached, wrapping: what
    /// an explicit credit limit is counted against (see
    /// `Session::set_credit`).
    pub(crate) sent: u32,
    pub(crate) auto_settle: bool,
    pub(crate) drain: bool,
    pub(crate) sink: Arc<dyn EventSink>,
    /// Consumer priority: higher ones get messages first.
    pub(crate) priority: i32,
    /// An exclusive consumer: while attached, the first of them in attach
    /// order is the only receiver.
    pub(crate) exclusive: bool,
    /// Only messages its selector matches are offered. Boxed with what it
    /// matched: most consumers (every MQTT subscriber's) have none.
    pub(crate) selector: Option<Box<Selecting>>,
    /// Message groups assigned to it.
    pub(crate) groups: u32,
    /// A browser's walk through the queue. Boxed: browsers are rare.
    pub(crate) browse: Option<Box<BrowseCursor>>,
    /// Its deliveries' lease, in ms (its own or the queue's); `None`: held
    /// until settled or it goes.
    pub(crate) visibility_timeout_ms: Option<NonZeroU32>,
}

/// A consumer's selector and what it matched.
pub(crate) struct Selecting {
    pub(crate) selector: Selector,
    /// The places of the waiting (in memory, not reserved) messages it
    /// matches, each evaluated once.
    pub(crate) matches: BTreeSet<Place>,
}

/// How far a browser has seen the queue, in arrival (sequence) order.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct BrowseCursor {
    /// The lowest sequence it has not been offered yet.
    pub(crate) next_seq: MessageSeq,
    /// It has been told it saw everything; it gets nothing more.
    pub(crate) ended: bool,
}

/// A binding as the queue remembers it (the routing trie holds the other
/// half).
#[derive(Debug, Clone)]
pub(crate) struct QueueBinding {
    pub(crate) filter: String,
    pub(crate) options: rosetta_neutral::BindingOptions,
}

/// Counters an operator asks for first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages waiting, paged ones included.
    pub depth: u64,
    /// Messages waiting on disk because the broker is over its memory
    /// budget (part of `depth`).
    pub paged: u64,
    /// Scheduled messages waiting on disk because the broker is over its
    /// memory budget (part of `scheduled`).
    pub scheduled_paged: u64,
    /// Messages delivered and not yet settled.
    pub in_flight: u64,
    /// Age of the oldest waiting message.
    pub oldest_age: Option<Duration>,
    /// Consumers attached.
    pub consumers: u64,
    /// Messages enqueued since start.
    pub enqueued_total: u64,
    /// Deliveries made since start, redeliveries included.
    pub deliveries_total: u64,
    /// Redeliveries since start.
    pub redeliveries_total: u64,
    /// Messages settled as accepted since start.
    pub acked_total: u64,
    /// Messages moved to the dead-letter address.
    pub dead_lettered_total: u64,
    /// Messages dropped or moved because they expired.
    pub expired_total: u64,
    /// Topic messages this queue missed because it was full
    /// (`queue_depth_max`).
    pub dropped_full_total: u64,
    /// Sum of time-in-queue of acknowledged messages, in milliseconds.
    pub time_in_queue_ms_total: u64,
    /// Consumer selectors evaluated against a message since start: once
    /// per message and selecting consumer, not once per dispatch.
    pub selector_evaluations_total: u64,
    /// Message groups with an assigned consumer now.
    pub groups: u64,
    /// Messages waiting for a time, not ready and not part of `depth`:
    /// scheduled for later (delivery time) or coming back after a
    /// redelivery delay.
    pub scheduled: u64,
    /// Sends dropped (and acknowledged) as duplicates within the dedup
    /// window, since start.
    pub duplicates_total: u64,
    /// Dedup ids remembered now.
    pub dedup_ids: u64,
    /// Dedup ids forgotten before their window passed, to stay within
    /// `dedup_ids_max`, since start.
    pub dedup_evicted_total: u64,
    /// Waiting messages a last-value queue dropped for a newer one of the
    /// same value, since start.
    pub replaced_total: u64,
}

/// The counters a queue keeps as messages pass; what [`QueueStats`]
/// reports besides them (depth, in flight, consumers, ages) is read from
/// the queue's state when asked. Kept apart from `QueueStats` so that every
/// queue (one per MQTT subscriber) does not carry the snapshot's fields.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueCounters {
    pub(crate) enqueued_total: u64,
    pub(crate) deliveries_total: u64,
    pub(crate) redeliveries_total: u64,
    pub(crate) acked_total: u64,
    pub(crate) dead_lettered_total: u64,
    pub(crate) expired_total: u64,
    pub(crate) dropped_full_total: u64,
    pub(crate) time_in_queue_ms_total: u64,
    pub(crate) selector_evaluations_total: u64,
    pub(crate) replaced_total: u64,
}

/// A queue's counters, made at the first thing it counts: an idle queue
/// (most MQTT session queues are) carries a pointer, not 80 bytes of
/// zeros (issue 20).
#[derive(Default)]
pub(crate) struct LazyCounters(Option<Box<QueueCounters>>);

impl LazyCounters {
    /// The counters, to count something.
    pub(crate) fn get_mut(&mut self) -> &mut QueueCounters {
        self.0.get_or_insert_with(Box::default)
    }

    /// The counters as they stand (all zero when nothing was counted).
    pub(crate) fn snapshot(&self) -> QueueCounters {
        self.0.as_deref().cloned().unwrap_or_default()
    }
}

impl ConsumerSlot {
    /// Whether the consumer can take a delivery now: it has credit, and its
    /// connection has room in its delivery budget. A consumer turned away
    /// for lack of room is resumed by its connection once there is room.
    pub(crate) fn can_take(&self) -> bool {
        self.credit > 0 && rosetta_neutral::budget::has_room(&*self.sink)
    }

    /// Sets an explicit credit from a limit counted like `sent`.
    pub(crate) fn set_credit_limit(&mut self, limit: u32) {
        let credit = limit.wrapping_sub(self.sent);
        // A limit behind what was sent (the client lowered its credit while
        // deliveries were in transit) wraps to a huge number: no credit.
        self.credit = if credit > i32::MAX as u32 { 0 } else { credit };
    }
}

/// A [`QueueLifetime`] in one word: the three plain kinds are 0-2, and
/// `IdleFor(d)` is 3 plus `d` in milliseconds (saturating; an idle limit of
/// half a billion years is as good as none).
fn encode_lifetime(lifetime: QueueLifetime) -> u64 {
    match lifetime {
        QueueLifetime::Permanent => 0,
        QueueLifetime::Session => 1,
        QueueLifetime::Consumer => 2,
        QueueLifetime::IdleFor(d) => {
            3u64.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }
    }
}

fn decode_lifetime(word: u64) -> QueueLifetime {
    match word {
        0 => QueueLifetime::Permanent,
        1 => QueueLifetime::Session,
        2 => QueueLifetime::Consumer,
        ms => QueueLifetime::IdleFor(Duration::from_millis(ms - 3)),
    }
}

/// Since when a queue has had no consumer, to the millisecond: an
/// `Option<Instant>` in 8 bytes rather than 16 (every queue has one). The
/// time is counted from one anchor for the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdleSince(u64);

impl IdleSince {
    /// It has a consumer.
    pub(crate) const BUSY: Self = Self(u64::MAX);

    /// It lost its last consumer at `at`.
    pub(crate) fn at(at: Instant) -> Self {
        Self(Self::millis(at).min(u64::MAX - 1))
    }

    /// How long it has been without a consumer at `now`; `None` while it
    /// has one.
    pub(crate) fn idle_for(self, now: Instant) -> Option<Duration> {
        (self != Self::BUSY)
            .then(|| Duration::from_millis(Self::millis(now).saturating_sub(self.0)))
    }

    /// On the process's clock anchor, which rounds instants down on
    /// either side of it: an anchor of its own, taken at first use, made
    /// every instant before it 0, and a difference across it 1 ms short.
    fn millis(at: Instant) -> u64 {
        rosetta_neutral::clock::epoch_ms(at)
    }
}

/// `QueueState::armed_ms` when the queue has not armed the core's timer
/// (no due time is ever this late).
const NOT_ARMED: u64 = u64::MAX;

pub(crate) struct QueueState {
    pub(crate) backlog: Backlog,
    /// Messages waiting for a time (see `schedule`).
    pub(crate) schedule: Schedule,
    /// The earliest due time this queue armed the core-wide timer with,
    /// while that is still to come; [`NOT_ARMED`] when none is (a plain
    /// u64 rather than an `Option`: 8 bytes of every queue).
    pub(crate) armed_ms: u64,
    /// Delivered and unsettled, by delivery tag (tags are ours: the cheap
    /// id hash, see `rosetta_neutral::id_hash`).
    /// Lazy: an idle queue (most session queues) has nothing in flight.
    pub(crate) inflight: LazyMap<u64, (ConsumerKey, Entry), BuildIdHasher>,
    /// The last delivery tag handed out: each delivery gets the next, so a
    /// redelivered message never has the tag of its earlier delivery.
    pub(crate) next_tag: u64,
    /// Lease deadlines of in-flight deliveries, and expired leases.
    pub(crate) leases: Leases,
    /// Message groups with a leased delivery in flight, and how many: a
    /// group's next message waits while one is leased, so that its order
    /// holds across an expiry and redelivery.
    pub(crate) leased_groups: LazyMap<String, u32>,
    /// Messages of an assigned group waiting out a redelivery delay, with
    /// their group and its consumer then. Each counts in `leased_groups`
    /// and holds its group (as an in-flight one does), so the group's later
    /// messages wait for it and per-group order holds across the delay.
    pub(crate) delayed_in_group: LazyMap<MessageSeq, (String, ConsumerKey)>,
    /// In attach order (exclusive consumers stand by in it).
    pub(crate) consumers: Vec<ConsumerSlot>,
    pub(crate) policy: DispatchPolicy,
    pub(crate) groups: Groups,
    /// Consumers with a selector, browsers excluded.
    pub(crate) selecting: u32,
    /// Exclusive consumers, browsers excluded.
    pub(crate) exclusive_consumers: u32,
    pub(crate) browsers: u32,
    /// Not all consumers have the same priority.
    pub(crate) priorities_differ: bool,
    pub(crate) bindings: Vec<QueueBinding>,
    pub(crate) deleted: bool,
    /// When the queue last lost its last consumer (for idle expiry).
    pub(crate) idle_since: IdleSince,
    pub(crate) stats: LazyCounters,
    /// A last-value queue's index (`last_value_key` is set). Boxed: few
    /// queues are last-value queues.
    pub(crate) last_values: Option<Box<LastValues>>,
}

/// A queue. Shared by the routing table, its consumers' sessions and the
/// core's queue map.
pub(crate) struct Queue {
    pub(crate) id: QueueId,
    pub(crate) name: Arc<str>,
    pub(crate) durable: bool,
    /// How long the queue lives, as [`encode_lifetime`] writes it; a
    /// re-declare may change it (MQTT 5 session expiry set again on
    /// reconnect or DISCONNECT). An atomic rather than a lock: 8 bytes of
    /// every queue, not 24.
    lifetime: AtomicU64,
    /// The session that declared a session-lifetime queue; 0 for none
    /// (session ids start at 1): 8 bytes, not an `Option`'s 16.
    owner_session: u64,
    /// What the configuration says about this queue (shared by the queues
    /// no rule names, see `QueueRules::resolve_shared`).
    pub(crate) settings: Arc<QueueSettings>,
    pub(crate) state: Mutex<QueueState>,
    /// The memory gauge, the broker-wide message counters and the
    /// core-wide timer this queue arms with its earliest due time.
    links: Arc<QueueLinks>,
    /// This queue, for the timer to come back to.
    me: Weak<Queue>,
    /// The dedup window, when the settings give one. A leaf lock, never
    /// taken while another lock is wanted after it. Boxed: few queues
    /// deduplicate, and the window is 136 bytes.
    pub(crate) dedup: Option<Box<QueueDedup>>,
}

/// What every queue shares with the core: the memory gauge, the message
/// counters and the timer.
pub(crate) struct QueueLinks {
    pub(crate) memory: Arc<MemoryGauge>,
    pub(crate) timers: Arc<Timers>,
    pub(crate) traffic: Arc<crate::traffic::Traffic>,
}

/// A queue's duplicate detection.
pub(crate) struct QueueDedup {
    pub(crate) mode: super::DedupMode,
    pub(crate) window: Mutex<DedupWindow<super::dedup::FirstSend>>,
}

/// What a dispatch pass produced besides deliveries: journal records for
/// auto-settled or expired durable messages, and expired entries to move.
#[derive(Default)]
pub(crate) struct DispatchOutput {
    pub(crate) records: Vec<Record>,
    pub(crate) expired: Vec<Entry>,
    /// Entries for the dead-letter address (leases that ran out once too
    /// often); their ack records are in `records`.
    pub(crate) dead: Vec<Entry>,
}

impl Queue {
    pub(crate) fn new(
        id: QueueId,
        name: &str,
        durable: bool,
        lifetime: QueueLifetime,
        owner_session: Option<u64>,
        settings: impl Into<Arc<QueueSettings>>,
        links: Arc<QueueLinks>,
    ) -> Arc<Self> {
        let settings = settings.into();
        let dedup = settings.dedup_window_s.map(|window_s| {
            Box::new(QueueDedup {
                mode: settings.dedup,
                window: Mutex::new(DedupWindow::new(
                    window_s.saturating_mul(1_000),
                    settings.dedup_ids_max,
                )),
            })
        });
        Arc::new_cyclic(|me| Self {
            id,
            name: name.into(),
            durable,
            lifetime: AtomicU64::new(encode_lifetime(lifetime)),
            owner_session: owner_session.unwrap_or(0),
            links,
            me: me.clone(),
            dedup,
            state: Mutex::new(QueueState {
                backlog: Backlog::default(),
                schedule: Schedule::default(),
                armed_ms: NOT_ARMED,
                inflight: LazyMap::default(),
                next_tag: 0,
                leases: Leases::default(),
                leased_groups: LazyMap::default(),
                delayed_in_group: LazyMap::default(),
                consumers: Vec::new(),
                policy: DispatchPolicy::default(),
                groups: Groups::default(),
                selecting: 0,
                exclusive_consumers: 0,
                browsers: 0,
                priorities_differ: false,
                bindings: Vec::new(),
                deleted: false,
                idle_since: IdleSince::at(Instant::now()),
                stats: LazyCounters::default(),
                last_values: settings
                    .last_value_key
                    .as_deref()
                    .map(|key| Box::new(LastValues::new(key))),
            }),
            // After `state`, which reads it.
            settings,
        })
    }

    /// The session that declared a session-lifetime queue.
    pub(crate) fn owner_session(&self) -> Option<u64> {
        (self.owner_session != 0).then_some(self.owner_session)
    }

    pub(crate) fn lifetime(&self) -> QueueLifetime {
        decode_lifetime(self.lifetime.load(Ordering::Relaxed))
    }

    pub(crate) fn set_lifetime(&self, lifetime: QueueLifetime) {
        self.lifetime
            .store(encode_lifetime(lifetime), Ordering::Relaxed);
    }

    /// Whether the queue holds `max` messages or more (waiting and in
    /// flight).
    pub(crate) fn is_full(&self, max: u64) -> bool {
        let st = self.state.lock();
        (st.backlog.len() + st.schedule.len() + st.inflight.len()) as u64 >= max
    }

    /// Counts a topic message missed because the queue was full.
    pub(crate) fn count_dropped_full(&self) {
        let mut st = self.state.lock();
        let counters = st.stats.get_mut();
        counters.dropped_full_total += 1;
        if counters.dropped_full_total.is_power_of_two() {
            tracing::warn!(queue = %self.name, dropped = counters.dropped_full_total, "queue full: topic messages dropped for it");
        }
    }

    /// The memory accounting the queue shares with all others.
    pub(crate) fn memory(&self) -> &MemoryGauge {
        &self.links.memory
    }

    /// The broker-wide message counters.
    pub(crate) fn traffic(&self) -> &crate::traffic::Traffic {
        &self.links.traffic
    }

    /// Uncounts a message the queue no longer holds.
    pub(crate) fn release(&self, entry: &Entry) {
        self.links.memory.sub(entry);
    }

    /// The ack record for `entry` if it is journaled here.
    pub(crate) fn ack_record(&self, entry: &Entry) -> Option<Record> {
        entry.journaled.then_some(Record::Ack {
            queue: self.id,
            seq: entry.seq,
        })
    }

    /// Adds a message and dispatches what can go.
    pub(crate) fn enqueue(&self, entry: Entry, now_ms: u64) -> DispatchOutput {
        let mut st = self.state.lock();
        if st.deleted {
            // Routed concurrently with a delete: the message is gone with the queue.
            return DispatchOutput {
                records: self.ack_record(&entry).into_iter().collect(),
                expired: Vec::new(),
                dead: Vec::new(),
            };
        }
        st.stats.get_mut().enqueued_total += 1;
        if let Some(due) = entry.message.delivery_time.filter(|&t| t > now_ms) {
            // A last-value queue compares a scheduled message when it is
            // due, not before: until then it is not waiting.
            self.links.memory.add(&entry);
            self.schedule_locked(&mut st, due, entry);
            return DispatchOutput::default();
        }
        let mut acks = Vec::new();
        if self.admit_last_value(&mut st, &entry, &mut acks) {
            st.backlog.push(entry, &self.links.memory, self.id);
        }
        let mut out = self.dispatch_locked(&mut st, now_ms);
        out.records.append(&mut acks);
        out
    }

    /// Adds a message recovered from the journal (no dispatch: nobody is
    /// connected yet). One scheduled for later waits for its time again.
    /// Returns the ack records of what a last-value queue dropped for it
    /// (or of it), for the caller to journal.
    /// `redeliver_at_ms`: it came back with a redelivery delay that ends
    /// then.
    pub(crate) fn restore(
        &self,
        entry: Entry,
        redeliver_at_ms: Option<u64>,
        now_ms: u64,
    ) -> Vec<Record> {
        let mut st = self.state.lock();
        let due = entry.message.delivery_time.max(redeliver_at_ms);
        if let Some(due) = due.filter(|&t| t > now_ms) {
            self.links.memory.add(&entry);
            self.schedule_locked(&mut st, due, entry);
            return Vec::new();
        }
        let mut acks = Vec::new();
        if self.admit_last_value(&mut st, &entry, &mut acks) {
            st.backlog.push(entry, &self.links.memory, self.id);
        }
        acks
    }

    /// A last-value queue's rule for an arriving `entry` (see
    /// `last_value`): the waiting message it replaces is taken out, and
    /// false means a newer one waits and `entry` is dropped. The acks of
    /// either go to `acks`. True, with nothing done, on other queues.
    fn admit_last_value(&self, st: &mut QueueState, entry: &Entry, acks: &mut Vec<Record>) -> bool {
        let QueueState {
            last_values,
            backlog,
            stats,
            ..
        } = st;
        let Some(last_values) = last_values else {
            return true;
        };
        match last_values.arrive(entry, backlog, &self.links.memory) {
            Arrival::Queue(None) => true,
            Arrival::Queue(Some(replaced)) => {
                stats.get_mut().replaced_total += 1;
                if let Some(counted) = &replaced.counted {
                    self.release(counted);
                }
                acks.extend(replaced.journaled.then_some(Record::Ack {
                    queue: self.id,
                    seq: replaced.seq,
                }));
                true
            }
            Arrival::Superseded => {
                stats.get_mut().replaced_total += 1;
                acks.extend(self.ack_record(entry));
                false
            }
        }
    }

    /// A delivered message comes back, after the queue's redelivery delay
    /// for its delivery count when it has one (see
    /// `QueueSettings::redelivery_delay_ms_for`), at once otherwise.
    /// `state_changed`: what the journal holds of its delivery state is
    /// out of date (this return raised its delivery count, or its delivery
    /// journaled a lease deadline). The journal learns the new count, and
    /// the time it may be offered again, so a restart neither forgets an
    /// attempt nor delivers it before its delay is over (nor holds it back
    /// for a lease that ended).
    pub(crate) fn put_back_later(
        &self,
        st: &mut QueueState,
        entry: Entry,
        now_ms: u64,
        state_changed: bool,
        records: &mut Vec<Record>,
    ) {
        let delay = self.settings.redelivery_delay_ms_for(entry.delivery_count);
        let due = (delay > 0).then(|| now_ms.saturating_add(delay));
        if state_changed || due.is_some() {
            records.extend(self.delivery_state_record(&entry, due));
        }
        match due {
            None => {
                if let Some(entry) = self.admit_returning(st, entry, records) {
                    st.backlog.put_back(entry);
                }
            }
            Some(due) => {
                hold_group_during_delay(st, &entry);
                self.schedule_locked(st, due, entry);
            }
        }
    }

    /// A message coming back to wait (released, or its scheduled time or
    /// redelivery delay over), under the last-value rule as an arriving one
    /// is: on a last-value queue it is dropped (acked, uncounted) when a
    /// newer message of its value waits, as Artemis drops it, and it
    /// replaces an older one. `None` when dropped.
    fn admit_returning(
        &self,
        st: &mut QueueState,
        entry: Entry,
        records: &mut Vec<Record>,
    ) -> Option<Entry> {
        if self.admit_last_value(st, &entry, records) {
            Some(entry)
        } else {
            self.release(&entry);
            None
        }
    }

    /// The DeliveryState record of `entry` if it is journaled here: its
    /// delivery count and saved annotation, and when it may be offered
    /// again.
    pub(crate) fn delivery_state_record(
        &self,
        entry: &Entry,
        redeliver_at_ms: Option<u64>,
    ) -> Option<Record> {
        entry.journaled.then(|| {
            super::codec::delivery_state_record(
                self.id,
                entry.seq,
                entry.delivery_count,
                entry.annotation.as_ref(),
                redeliver_at_ms,
            )
        })
    }

    /// Keeps `entry` (counted in the gauge already) until `due_ms`, and arms
    /// the core's timer when that is this queue's new earliest time.
    fn schedule_locked(&self, st: &mut QueueState, due_ms: u64, entry: Entry) {
        let due = st
            .schedule
            .insert(due_ms, entry, &self.links.memory, self.id);
        self.arm_if_earlier(st, due);
    }

    pub(crate) fn arm_if_earlier(&self, st: &mut QueueState, due_ms: u64) {
        if due_ms < st.armed_ms {
            st.armed_ms = due_ms;
            self.links.timers.arm(due_ms, self.me.clone());
        }
    }

    /// The core's timer came back for this queue: leases that ran out
    /// return their deliveries (see [`Self::expire_leases`]), what is due
    /// at `now_ms` moves to the backlog (what expired meanwhile to the
    /// expiry address) and is dispatched; the timer is armed again for
    /// what is left. `attempts_max`: the queue's delivery attempts in force.
    pub(crate) fn release_due(&self, now_ms: u64, attempts_max: u32) -> DispatchOutput {
        let mut st = self.state.lock();
        if st.armed_ms <= now_ms {
            st.armed_ms = NOT_ARMED;
        }
        if st.deleted {
            return DispatchOutput::default();
        }
        let mut out = DispatchOutput::default();
        if self.expire_leases(&mut st, now_ms, attempts_max, &mut out) {
            let more = self.dispatch_locked(&mut st, now_ms);
            out.records.extend(more.records);
            out.expired.extend(more.expired);
        }
        // Due messages on disk come back only while the queue has room
        // for them in memory, as the backlog reads its paged part back.
        let room = !self.links.memory.over_budget() || !st.backlog.has_ready_in_memory();
        let due = st.schedule.take_due(
            now_ms,
            SCHEDULE_RELEASE_BATCH_MAX,
            room,
            &self.links.memory,
            self.id,
        );
        let retry_at_ms = due.retry_at_ms;
        for seq in &due.dropped {
            end_group_delay(&mut st, *seq);
        }
        // A due message takes its original place in the queue (by sequence,
        // as a release does). Consumers that can take messages now get
        // them in due order even from a late pass: each run of one due
        // time is dispatched before the next is put back.
        let mut iter = due.entries.into_iter().peekable();
        while let Some((due_ms, entry)) = iter.next() {
            let held_group = end_group_delay(&mut st, entry.seq);
            if entry.message.is_expired(now_ms) {
                self.expire(&mut st, entry, &mut out);
            } else if let Some(entry) = self.admit_returning(&mut st, entry, &mut out.records) {
                // Back to its group's consumer ahead of the group's later
                // messages kept for it, as a lease expiry without a delay.
                let owner = held_group
                    .and_then(|g| st.groups.owner(&g))
                    .filter(|_| entry.message.group_id.is_some());
                match owner {
                    Some(owner) => super::dispatch::reserve_for(&mut st, owner, entry),
                    None => st.backlog.put_back(entry),
                }
            }
            if iter.peek().is_none_or(|(next, _)| *next != due_ms) {
                let more = self.dispatch_locked(&mut st, now_ms);
                out.records.extend(more.records);
                out.expired.extend(more.expired);
            }
        }
        // What was left due on disk is looked at again at the retry time,
        // not at once (that would spin the timer thread).
        let schedule_next = match (st.schedule.next_due(), retry_at_ms) {
            (Some(next), Some(retry)) if next <= now_ms => Some(retry),
            (next, _) => next,
        };
        let next = [schedule_next, st.leases.next_deadline()]
            .into_iter()
            .flatten()
            .min();
        if let Some(next) = next {
            self.arm_if_earlier(&mut st, next);
        }
        out
    }

    /// Deliveries whose lease ran out by `now_ms` leave their consumer (it
    /// is told, and a window consumer gets its credit back), count one
    /// failed attempt, and come back through the redelivery path (the
    /// redelivery delay applies), or go to the dead-letter address after
    /// `attempts_max` attempts. Returns whether any did.
    fn expire_leases(
        &self,
        st: &mut QueueState,
        now_ms: u64,
        attempts_max: u32,
        out: &mut DispatchOutput,
    ) -> bool {
        let due = st.leases.take_due(now_ms, SCHEDULE_RELEASE_BATCH_MAX);
        let any = !due.is_empty();
        for tag in due {
            let Some((key, mut entry)) = st.take_inflight(tag) else {
                continue;
            };
            if let Some(slot) = st.consumers.iter_mut().find(|c| c.key == key) {
                // A window refills as on a settlement; an explicit (AMQP
                // link) credit is the client's to grant again.
                if let CreditMode::Window(_) = slot.mode {
                    slot.credit += 1;
                }
                slot.sink.send(rosetta_neutral::SessionEvent::LeaseExpired {
                    consumer: key.consumer,
                    tag: rosetta_neutral::DeliveryTag(tag),
                });
            }
            entry.delivery_count += 1;
            tracing::debug!(queue = %self.name, seq = entry.seq, tag, delivery_count = entry.delivery_count, "lease expired");
            if entry.delivery_count >= attempts_max {
                // Dead-lettered by the caller with reason
                // `delivery-attempts` (`Inner::run_timers`).
                st.stats.get_mut().dead_lettered_total += 1;
                out.records.extend(self.ack_record(&entry));
                self.release(&entry);
                out.dead.push(entry);
                continue;
            }
            // The adapter forgot the delivery: its saved state goes too.
            entry.annotation = None;
            let owner = entry
                .message
                .group_id
                .as_deref()
                .and_then(|g| st.groups.owner(g));
            match owner {
                // Straight back to its group's consumer, ahead of the
                // group's later messages kept for it (kept in sequence
                // order), so per-group order holds.
                Some(owner) if self.settings.redelivery_delay_ms_for(entry.delivery_count) == 0 => {
                    out.records.extend(self.delivery_state_record(&entry, None));
                    super::dispatch::reserve_for(st, owner, entry);
                }
                _ => self.put_back_later(st, entry, now_ms, true, &mut out.records),
            }
        }
        any
    }

    /// Statistics snapshot at `now_ms`.
    pub(crate) fn stats(&self, now_ms: u64) -> QueueStats {
        let st = self.state.lock();
        let c = st.stats.snapshot();
        let mut s = QueueStats {
            enqueued_total: c.enqueued_total,
            deliveries_total: c.deliveries_total,
            redeliveries_total: c.redeliveries_total,
            acked_total: c.acked_total,
            dead_lettered_total: c.dead_lettered_total,
            expired_total: c.expired_total,
            dropped_full_total: c.dropped_full_total,
            time_in_queue_ms_total: c.time_in_queue_ms_total,
            selector_evaluations_total: c.selector_evaluations_total,
            replaced_total: c.replaced_total,
            ..QueueStats::default()
        };
        s.depth = st.backlog.len() as u64;
        s.scheduled = st.schedule.len() as u64;
        s.paged = st.backlog.paged_len() as u64;
        s.scheduled_paged = st.schedule.paged_len() as u64;
        s.in_flight = st.inflight.len() as u64;
        s.consumers = st.consumers.len() as u64;
        s.groups = st.groups.len() as u64;
        // The head is the oldest by sequence; a released message keeps its
        // original enqueue time, so this is the age an operator cares about.
        s.oldest_age = st
            .backlog
            .oldest_enqueued_at_ms()
            .map(|t| Duration::from_millis(now_ms.saturating_sub(t)));
        drop(st);
        if let Some(dedup) = &self.dedup {
            let w = dedup.window.lock();
            s.duplicates_total = w.duplicates_total();
            s.dedup_ids = w.len() as u64;
            s.dedup_evicted_total = w.evicted_total();
        }
        s
    }
}

/// A message of an assigned group goes to wait out a redelivery delay: its
/// group stays held, and its later messages wait for it (see
/// `QueueState::delayed_in_group`).
fn hold_group_during_delay(st: &mut QueueState, entry: &Entry) {
    let Some(group) = entry.message.group_id.as_deref() else {
        return;
    };
    let Some(owner) = st.groups.owner(group) else {
        return;
    };
    st.groups.hold(group);
    *st.leased_groups.entry(group.to_owned()).or_default() += 1;
    st.delayed_in_group
        .insert(entry.seq, (group.to_owned(), owner));
}

/// Every message waiting out a redelivery delay is gone (the schedule was
/// emptied): their groups are no longer held for them.
pub(crate) fn end_group_delays(st: &mut QueueState) {
    let seqs: Vec<MessageSeq> = st.delayed_in_group.keys().copied().collect();
    for seq in seqs {
        end_group_delay(st, seq);
    }
}

/// The message `seq` is back from its redelivery delay (or gone): its group
/// is no longer held for it. Returns the group, when it was held.
fn end_group_delay(st: &mut QueueState, seq: MessageSeq) -> Option<String> {
    let (group, owner) = st.delayed_in_group.remove(&seq)?;
    st.groups.unhold(&group, owner);
    st.unlease_group(&group);
    Some(group)
}

#[cfg(test)]
mod size_tests {
    use super::*;
    use std::mem::size_of;

    /// One queue per MQTT subscriber: its allocation (the `Arc`'s two
    /// counts and the queue) stays within jemalloc's 320-byte class; what
    /// only paging, message groups, selectors, dedup or last-value queues
    /// use is boxed at first use, and the counters at the first count.
    #[test]
    fn a_queue_fits_the_320_byte_class() {
        let arc = 2 * size_of::<usize>();
        assert!(size_of::<Queue>() + arc <= 320, "{}", size_of::<Queue>());
    }

    /// A subscription keeps its binding twice, as its queue's record of
    /// the filter and as the route the topic trie holds, each in a vector
    /// exactly sized for the first: both in jemalloc's 48-byte class.
    #[test]
    fn a_binding_and_its_route_fit_the_48_byte_class() {
        let binding = size_of::<QueueBinding>();
        let route = size_of::<crate::routing::RouteBinding>();
        assert!(binding <= 48 && route <= 48, "{binding}, {route}");
    }

    /// A queue's consumers are a vector of slots, exactly sized for the
    /// first: one slot is jemalloc's 80-byte class (a selector and a
    /// browser's cursor are boxed).
    #[test]
    fn a_consumer_slot_fits_the_80_byte_class() {
        assert!(
            size_of::<ConsumerSlot>() <= 80,
            "{}",
            size_of::<ConsumerSlot>()
        );
    }

    #[test]
    fn a_lifetime_survives_its_encoding() {
        for lifetime in [
            QueueLifetime::Permanent,
            QueueLifetime::Session,
            QueueLifetime::Consumer,
            QueueLifetime::IdleFor(Duration::ZERO),
            QueueLifetime::IdleFor(Duration::from_secs(3_600)),
        ] {
            assert_eq!(decode_lifetime(encode_lifetime(lifetime)), lifetime);
        }
        assert_eq!(
            decode_lifetime(encode_lifetime(QueueLifetime::IdleFor(Duration::MAX))),
            QueueLifetime::IdleFor(Duration::from_millis(u64::MAX - 3))
        );
    }

    #[test]
    fn idle_time_is_counted_from_the_last_consumer_leaving() {
        let start = Instant::now();
        assert_eq!(IdleSince::BUSY.idle_for(start), None);
        let idle = IdleSince::at(start);
        assert_eq!(idle.idle_for(start), Some(Duration::ZERO));
        assert_eq!(
            idle.idle_for(start + Duration::from_millis(1_500)),
            Some(Duration::from_millis(1_500))
        );
        // A clock reading from before it went idle is no time at all.
        let later = IdleSince::at(start + Duration::from_secs(5));
        assert_eq!(later.idle_for(start), Some(Duration::ZERO));
    }
}
