//! One queue: its messages, its consumers and its dispatch.
//!
//! A queue is the unit of ownership in the core (as in a distributed queue
//! service, one place owns each queue's state). Everything about it sits
//! behind one mutex that is held only for in-memory work: never across IO,
//! never across an `.await`. Journal records produced while it is held are
//! collected in a [`Batch`](super::batch::Batch) and written after.
//!
//! Messages wait in the [`Backlog`], ordered by their global sequence
//! number, so a released message goes back to its original place (FIFO per
//! queue); past the memory budget it pages them to disk.
//! Delivered-but-unsettled messages sit in `inflight` until settled.
//!
//! Dispatch is a pluggable [`DispatchPolicy`]; the default is round-robin
//! over consumers with credit. Later policies (exclusive consumer, message
//! groups) slot in there.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use rosetta_neutral::{
    ConsumerId, CreditMode, Delivery, DeliveryTag, EventSink, MatchInfo, Message, QueueLifetime,
    SessionEvent,
};

use super::backlog::Backlog;
pub(crate) use super::backlog::MemoryGauge;
use super::queue_settings::QueueSettings;
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
    pub(crate) enqueued_at: Instant,
    /// Not to be redelivered to this consumer (AMQP undeliverable-here).
    pub(crate) excluded: Option<ConsumerKey>,
}

impl Entry {
    pub(crate) fn new(seq: MessageSeq, message: Arc<Message>, journaled: bool) -> Self {
        Self {
            seq,
            message,
            delivery_count: 0,
            redelivered: false,
            from_retained: false,
            matched: MatchInfo::default(),
            annotation: None,
            journaled,
            enqueued_at: Instant::now(),
            excluded: None,
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
}

impl ConsumerSlot {
    /// Whether the consumer can take a delivery now: it has credit, and its
    /// connection has room in its delivery budget. A consumer turned away
    /// for lack of room is resumed by its connection once there is room.
    pub(crate) fn can_take(&self) -> bool {
        self.credit > 0 && self.sink.budget().is_none_or(|b| b.try_room())
    }

    /// Sets an explicit credit from a limit counted like `sent`.
    pub(crate) fn set_credit_limit(&mut self, limit: u32) {
        let credit = limit.wrapping_sub(self.sent);
        // A limit behind what was sent (the client lowered its credit while
        // deliveries were in transit) wraps to a huge number: no credit.
        self.credit = if credit > i32::MAX as u32 { 0 } else { credit };
    }
}

/// Chooses which consumer gets the next message. The default is round-robin
/// over consumers with credit.
pub(crate) trait DispatchPolicy: Send {
    /// Index into `consumers` of the consumer for `entry`, or `None` when no
    /// consumer can take it now.
    fn pick(&mut self, consumers: &[ConsumerSlot], entry: &Entry) -> Option<usize>;
}

#[derive(Default)]
pub(crate) struct RoundRobin {
    next: usize,
}

impl DispatchPolicy for RoundRobin {
    fn pick(&mut self, consumers: &[ConsumerSlot], entry: &Entry) -> Option<usize> {
        let n = consumers.len();
        let eligible = |c: &ConsumerSlot| entry.excluded != Some(c.key) && c.can_take();
        let start = self.next % n.max(1);
        // An excluded message (AMQP undeliverable-here) goes elsewhere when it
        // can; when only excluded consumers have credit it goes to them rather
        // than block the head of the queue forever.
        let found = (0..n)
            .map(|i| (start + i) % n)
            .find(|&i| eligible(&consumers[i]))
            .or_else(|| {
                (0..n)
                    .map(|i| (start + i) % n)
                    .find(|&i| consumers[i].can_take())
            });
        if let Some(i) = found {
            self.next = i + 1;
        }
        found
    }
}

pub(crate) struct QueueState {
    pub(crate) backlog: Backlog,
    pub(crate) inflight: HashMap<MessageSeq, (ConsumerKey, Entry)>,
    pub(crate) consumers: Vec<ConsumerSlot>,
    pub(crate) policy: Box<dyn DispatchPolicy>,
    pub(crate) bindings: Vec<QueueBinding>,
    pub(crate) deleted: bool,
    /// When the queue last lost its last consumer (for idle expiry).
    pub(crate) idle_since: Option<Instant>,
    pub(crate) stats: QueueStats,
}

/// A queue. Shared by the routing table, its consumers' sessions and the
/// core's queue map.
pub(crate) struct Queue {
    pub(crate) id: QueueId,
    pub(crate) name: Arc<str>,
    pub(crate) durable: bool,
    /// How long the queue lives; a re-declare may change it (MQTT 5 session
    /// expiry set again on reconnect or DISCONNECT). A leaf lock.
    lifetime: Mutex<QueueLifetime>,
    /// The session that declared a session-lifetime queue.
    pub(crate) owner_session: Option<u64>,
    /// What the configuration says about this queue.
    #[allow(dead_code)] // read by dispatch once exclusive queues and groups land
    pub(crate) settings: QueueSettings,
    pub(crate) state: Mutex<QueueState>,
    memory: Arc<MemoryGauge>,
}

/// What a dispatch pass produced besides deliveries: journal records for
/// auto-settled or expired durable messages, and expired entries to move.
#[derive(Default)]
pub(crate) struct DispatchOutput {
    pub(crate) records: Vec<Record>,
    pub(crate) expired: Vec<Entry>,
}

impl Queue {
    pub(crate) fn new(
        id: QueueId,
        name: &str,
        durable: bool,
        lifetime: QueueLifetime,
        owner_session: Option<u64>,
        settings: QueueSettings,
        memory: Arc<MemoryGauge>,
    ) -> Self {
        Self {
            id,
            name: name.into(),
            durable,
            lifetime: Mutex::new(lifetime),
            owner_session,
            settings,
            memory,
            state: Mutex::new(QueueState {
                backlog: Backlog::default(),
                inflight: HashMap::new(),
                consumers: Vec::new(),
                policy: Box::<RoundRobin>::default(),
                bindings: Vec::new(),
                deleted: false,
                idle_since: Some(Instant::now()),
                stats: QueueStats::default(),
            }),
        }
    }

    pub(crate) fn lifetime(&self) -> QueueLifetime {
        *self.lifetime.lock()
    }

    pub(crate) fn set_lifetime(&self, lifetime: QueueLifetime) {
        *self.lifetime.lock() = lifetime;
    }

    /// Whether the queue holds `max` messages or more (waiting and in
    /// flight).
    pub(crate) fn is_full(&self, max: u64) -> bool {
        let st = self.state.lock();
        (st.backlog.len() + st.inflight.len()) as u64 >= max
    }

    /// Counts a topic message missed because the queue was full.
    pub(crate) fn count_dropped_full(&self) {
        let mut st = self.state.lock();
        st.stats.dropped_full_total += 1;
        if st.stats.dropped_full_total.is_power_of_two() {
            tracing::warn!(queue = %self.name, dropped = st.stats.dropped_full_total, "queue full: topic messages dropped for it");
        }
    }

    /// The memory accounting the queue shares with all others.
    pub(crate) fn memory(&self) -> &MemoryGauge {
        &self.memory
    }

    /// Uncounts a message the queue no longer holds.
    pub(crate) fn release(&self, entry: &Entry) {
        self.memory.sub(entry);
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
            };
        }
        st.stats.enqueued_total += 1;
        st.backlog.push(entry, &self.memory, self.id);
        self.dispatch_locked(&mut st, now_ms)
    }

    /// Adds a message recovered from the journal (no dispatch: nobody is
    /// connected yet).
    pub(crate) fn restore(&self, entry: Entry) {
        self.state.lock().backlog.push(entry, &self.memory, self.id);
    }

    /// A delivered message comes back to its place in the queue.
    pub(crate) fn put_back(st: &mut QueueState, entry: Entry) {
        st.backlog.put_back(entry);
    }

    /// Hands ready messages to consumers with credit, in order.
    pub(crate) fn dispatch_locked(&self, st: &mut QueueState, now_ms: u64) -> DispatchOutput {
        let mut out = DispatchOutput::default();
        while !st.consumers.is_empty() {
            let Some(mut entry) = st.backlog.pop_front(&self.memory, self.id) else {
                break;
            };
            if entry.message.is_expired(now_ms) {
                st.stats.expired_total += 1;
                out.records.extend(self.ack_record(&entry));
                self.release(&entry);
                out.expired.push(entry);
                continue;
            }
            let QueueState {
                consumers, policy, ..
            } = &mut *st;
            let Some(i) = policy.pick(consumers, &entry) else {
                st.backlog.put_back(entry);
                break;
            };
            let slot = &mut st.consumers[i];
            slot.credit -= 1;
            slot.sent = slot.sent.wrapping_add(1);
            let charge = match slot.sink.budget() {
                Some(budget) => budget.charge(entry.message.memory_size() as u64),
                None => rosetta_neutral::DeliveryCharge::none(),
            };
            let delivery = Delivery {
                consumer: slot.key.consumer,
                tag: DeliveryTag(entry.seq),
                message: Arc::clone(&entry.message),
                delivery_count: entry.delivery_count,
                redelivered: entry.redelivered,
                from_retained: entry.from_retained,
                matched: entry.matched.clone(),
                annotation: entry.annotation.clone(),
                charge,
            };
            let key = slot.key;
            let auto_settle = slot.auto_settle;
            slot.sink.send(SessionEvent::Delivery(delivery));
            st.stats.deliveries_total += 1;
            if entry.redelivered {
                st.stats.redeliveries_total += 1;
            }
            if auto_settle {
                if let CreditMode::Window(_) = st.consumers[i].mode {
                    st.consumers[i].credit += 1;
                }
                st.stats.acked_total += 1;
                st.stats.time_in_queue_ms_total += elapsed_ms(entry.enqueued_at);
                out.records.extend(self.ack_record(&entry));
                self.release(&entry);
            } else {
                entry.redelivered = true;
                st.inflight.insert(entry.seq, (key, entry));
            }
        }
        self.finish_drains(st);
        out
    }

    /// Consumers in drain mode with nothing left to send lose their credit
    /// and are told so.
    fn finish_drains(&self, st: &mut QueueState) {
        let nothing_ready = st.backlog.is_empty();
        for slot in st.consumers.iter_mut().filter(|c| c.drain) {
            if nothing_ready || slot.credit == 0 {
                slot.credit = 0;
                slot.drain = false;
                slot.sink.send(SessionEvent::Drained {
                    consumer: slot.key.consumer,
                });
            }
        }
    }

    /// Statistics snapshot.
    pub(crate) fn stats(&self) -> QueueStats {
        let st = self.state.lock();
        let mut s = st.stats.clone();
        s.depth = st.backlog.len() as u64;
        s.paged = st.backlog.paged_len() as u64;
        s.in_flight = st.inflight.len() as u64;
        s.consumers = st.consumers.len() as u64;
        // The head is the oldest by sequence; a released message keeps its
        // original enqueue time, so this is the age an operator cares about.
        s.oldest_age = st.backlog.oldest_enqueued_at().map(|t| t.elapsed());
        s
    }
}

pub(crate) fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
