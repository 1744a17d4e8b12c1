//! One stream consumer.
//!
//! A reader reads one log, or several: the partitions of a partitioned
//! stream, all of them without a group, those the group gives it with
//! one (see `members`). In each log it has a position (the next offset
//! it will be sent); it has credit as a
//! queue consumer has ([`CreditMode`]), and the deliveries it has not yet
//! settled, by tag. Reading does not delete: a settlement only tells a
//! group how far its reader got.
//!
//! # Acknowledgements and the group's offset
//!
//! Any settlement (accept, release, modify, reject: a log has no
//! redelivery) settles a delivery. The group's committed offset (of the
//! delivery's partition, for a partitioned stream) moves to the lowest
//! offset still unsettled there, or past everything sent when nothing
//! is: acknowledgements commit cumulatively, and an out-of-order
//! acknowledgement is remembered but moves nothing until the ones before
//! it are settled too. So a restarted reader of the group is sent again
//! whatever was unsettled (at-least-once). An auto-settled reader commits
//! as it is sent (at-most-once).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rosetta_neutral::{
    ConsumerId, CreditMode, Delivery, DeliveryTag, EventSink, MatchInfo, SessionEvent,
    StreamPosition,
};

use rosetta_store::Completion;

use super::groups::Groups;
use super::read_pool::ReadPool;
use super::unsettled::Unsettled;
use super::Stream;

/// Most records one pump pass reads for a reader: a reader with a large
/// credit still lets the others be served in between.
const PUMP_RECORDS_MAX: usize = 256;
/// About the most bytes of bodies one pump pass reads for a reader.
const PUMP_BYTES_MAX: usize = 1024 * 1024;

/// Where a reader is in one of the logs it reads.
struct PartState {
    /// The next offset to send.
    next: u64,
    /// This reader reads it now (a group member's partitions move on a
    /// rebalance; a reader without a group reads all of them).
    assigned: bool,
}

struct ReaderState {
    /// One per log read, in partition order.
    parts: Vec<PartState>,
    /// The part the next pump pass starts at, so that one partition's
    /// backlog does not starve the others of credit.
    cursor: usize,
    mode: CreditMode,
    /// Explicit credit left; for a window, the window.
    credit: u32,
    /// Deliveries sent in explicit mode (a credit limit counts from it).
    sent: u32,
    drain: bool,
    /// Tag → (part, offset) of what is sent and not yet settled.
    unsettled: Unsettled,
    /// The same by (part, offset, tag), kept only for a reader with a
    /// group: the lowest unsettled offset of a part, which a settlement
    /// commits, is its first entry there.
    unsettled_by_offset: BTreeSet<(usize, u64, u64)>,
    next_tag: u64,
    closed: bool,
}

/// What [`Reader::settle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settlement {
    /// Not an unsettled delivery of this reader.
    Unknown,
    /// Settled; the group's offset did not move (no group, an
    /// out-of-order settlement, or a partition moved to another member),
    /// so there is nothing to wait for.
    NoCommit,
    /// Settled, and the group's new offset is being journaled: the
    /// completion runs once it is durable.
    Committed,
}

/// What a reader reads: one stream, or the partitions of one.
pub(crate) struct ReadSource {
    /// The name it was asked for.
    pub(crate) name: Arc<str>,
    /// The logs: one, or a partitioned stream's, in partition order.
    pub(crate) streams: Vec<Arc<Stream>>,
    /// Deliveries carry their partition (a partitioned stream's reader).
    pub(crate) partitioned: bool,
    /// Where its reads that would wait for the device go.
    pub(crate) reads: Arc<ReadPool>,
}

/// A stream consumer; see the module docs.
pub(crate) struct Reader {
    pub(crate) consumer: ConsumerId,
    pub(crate) source: ReadSource,
    sink: Arc<dyn EventSink>,
    auto_settle: bool,
    pub(crate) group: Option<String>,
    state: Mutex<ReaderState>,
    /// One pump at a time per reader (the pump thread, a read thread, or
    /// a caller that granted credit), so positions never race.
    pumping: Mutex<()>,
    /// A pump was asked for while another held `pumping`: the holder
    /// pumps again before it lets go (see [`Reader::pump`]).
    again: AtomicBool,
    /// Queued in the read pool (see `read_pool`).
    pub(super) queued: AtomicBool,
}

impl Reader {
    /// A reader of `source` starting part `i` at `starts[i]` (`None`: not
    /// assigned to it yet).
    pub(crate) fn new(
        consumer: ConsumerId,
        source: ReadSource,
        sink: Arc<dyn EventSink>,
        mode: CreditMode,
        auto_settle: bool,
        group: Option<String>,
        starts: &[Option<u64>],
    ) -> Reader {
        let credit = match mode {
            CreditMode::Window(n) | CreditMode::Explicit(n) => n,
        };
        let parts = starts
            .iter()
            .map(|s| PartState {
                next: s.unwrap_or(0),
                assigned: s.is_some(),
            })
            .collect();
        Reader {
            consumer,
            source,
            sink,
            auto_settle,
            group,
            state: Mutex::new(ReaderState {
                parts,
                cursor: 0,
                mode,
                credit,
                sent: 0,
                drain: false,
                unsettled: Unsettled::default(),
                unsettled_by_offset: BTreeSet::new(),
                next_tag: 1,
                closed: false,
            }),
            pumping: Mutex::new(()),
            again: AtomicBool::new(false),
            queued: AtomicBool::new(false),
        }
    }

    /// How many records it may be sent now.
    fn room(st: &ReaderState) -> usize {
        let n = match st.mode {
            CreditMode::Window(w) => (w as usize).saturating_sub(st.unsettled.len()),
            CreditMode::Explicit(_) => st.credit as usize,
        };
        n.min(PUMP_RECORDS_MAX)
    }

    /// Gives it part `part` from offset `at`, or (`None`) takes it away:
    /// nothing more of that part is sent, and settling what was sent of
    /// it no longer commits (its new reader resumes from the group's
    /// committed offset).
    pub(crate) fn assign(&self, part: usize, at: Option<u64>) {
        let mut st = self.state.lock();
        if let Some(p) = st.parts.get_mut(part) {
            p.assigned = at.is_some();
            if let Some(at) = at {
                p.next = at;
            }
        }
    }

    /// Sends what its credit allows from its logs, a part at a time
    /// starting after the last one served, as far as memory serves it
    /// (the tail cache, the page cache): once a part's next record must
    /// be read from the device, the rest is left to a read thread
    /// (`read_pool`). Never waits for another pump of this reader: that
    /// one pumps again instead, so a connection's task is not held up
    /// behind a read of the device.
    pub(crate) fn pump(self: &Arc<Self>, groups: &Groups) {
        // Set before trying the lock: a holder that lets go after this
        // sees it (and pumps again), or lets go before our try succeeds.
        self.again.store(true, Ordering::SeqCst);
        while let Some(one) = self.pumping.try_lock() {
            self.again.store(false, Ordering::SeqCst);
            let deferred = self.pump_locked(groups, self.source.reads.is_running());
            drop(one);
            if deferred {
                self.source.reads.schedule(self);
                return;
            }
            if !self.again.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// [`Self::pump`] on a read thread: reads the files too, and waits
    /// for another pump of this reader to end first.
    pub(super) fn pump_here(&self, groups: &Groups) {
        loop {
            let one = self.pumping.lock();
            self.again.store(false, Ordering::SeqCst);
            self.pump_locked(groups, false);
            drop(one);
            if !self.again.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// One pump, under `pumping`; `true` when it stopped, `defer` asked,
    /// at a part whose next record must be read from the device.
    fn pump_locked(&self, groups: &Groups, defer: bool) -> bool {
        loop {
            let order = {
                let mut st = self.state.lock();
                if st.closed {
                    return false;
                }
                if Self::room(&st) == 0 && st.drain {
                    st.drain = false;
                    self.sink.send(SessionEvent::Drained {
                        consumer: self.consumer,
                    });
                }
                let n = st.parts.len();
                let cursor = st.cursor;
                (0..n)
                    .map(|i| (cursor + i) % n)
                    .filter(|&i| st.parts[i].assigned)
                    .collect::<Vec<_>>()
            };
            let mut sent_any = false;
            for part in order {
                match self.pump_part(part, groups, defer) {
                    PartPump::Sent => sent_any = true,
                    PartPump::Empty => {}
                    PartPump::Stop => return false,
                    PartPump::Files => return true,
                }
            }
            if !sent_any {
                let mut st = self.state.lock();
                if st.drain && !st.closed {
                    st.drain = false;
                    st.credit = 0;
                    self.sink.send(SessionEvent::Drained {
                        consumer: self.consumer,
                    });
                }
                return false;
            }
        }
    }

    /// One read of part `part`, sent; with `defer`, only what memory
    /// holds, and none when the next record is on the device
    /// ([`PartPump::Files`]).
    fn pump_part(&self, part: usize, groups: &Groups, defer: bool) -> PartPump {
        let (from, room) = {
            let st = self.state.lock();
            if st.closed {
                return PartPump::Stop;
            }
            (st.parts[part].next, Self::room(&st))
        };
        if room == 0 {
            return PartPump::Stop;
        }
        let stream = &self.source.streams[part];
        // Bytes of deliveries this pass may still charge (`None`: no bound
        // but the connection's budget and the pass's own limits).
        let mut ahead_left: Option<u64> = None;
        let (bounds, cached) = stream.log.bounds_from(from);
        let max_bytes = if cached || super::decoded::is_shared(from, bounds.next) {
            // Near the end what waits is mostly shared with the other
            // readers there (the tail cache's bytes, one decoded message
            // per record near the end): the connection's budget bounds it.
            if !rosetta_neutral::budget::has_room(&*self.sink) {
                return PartPump::Stop;
            }
            PUMP_BYTES_MAX
        } else {
            // In history every delivery is this reader's own, and the log
            // is there to read again: it keeps only a read-ahead waiting
            // for its socket, not its whole credit, so what it holds for a
            // slow socket stays below the credit (docs/streams.md, "Flow
            // and memory").
            let Some(ahead) = rosetta_neutral::budget::has_room_to_read_ahead(&*self.sink) else {
                return PartPump::Stop;
            };
            ahead_left = Some(ahead);
            // A delivery is charged its decoded message, about 1.4 times a
            // 1 KiB record: two thirds of the room in record bytes mostly
            // fills it without reading what cannot be sent.
            usize::try_from(ahead / 3 * 2)
                .unwrap_or(usize::MAX)
                .clamp(1, PUMP_BYTES_MAX)
        };
        // Where it must not block (`defer`), only what memory holds: a
        // read that would wait for the device is left to a read thread.
        let read = if defer {
            stream.log.read_cached(from, room, max_bytes)
        } else {
            stream.log.read(from, room, max_bytes)
        };
        let read = match read {
            Ok(r) if r.uncached && r.records.is_empty() => return PartPump::Files,
            Ok(r) => r,
            Err(e) => {
                tracing::error!(stream = %stream.name, offset = from, error = %e,
                    "stream read failed; the reader waits");
                return PartPump::Empty;
            }
        };
        // Decoded outside the reader's lock, and shared with the other
        // readers near the end of the log (see `decoded`; the end as it
        // was before the read is near enough).
        let end = bounds.next;
        let decoded: Vec<_> = {
            let mut shared = stream.decoded.lock();
            read.records
                .into_iter()
                .map(|rec| {
                    let m = shared.get(rec.offset, rec.body, end);
                    (rec.offset, rec.timestamp_ms, m)
                })
                .collect()
        };
        let mut st = self.state.lock();
        if st.closed {
            return PartPump::Stop;
        }
        // Moved away (or moved back, at another offset) while it was read.
        if !st.parts[part].assigned || st.parts[part].next != from {
            return PartPump::Empty;
        }
        if decoded.is_empty() {
            st.parts[part].next = read.next.max(from);
            return PartPump::Empty;
        }
        let mut missed = read.missed;
        if missed > 0 {
            tracing::warn!(stream = %stream.name, missed, first = read.next,
                "stream reader cut by retention skips ahead");
        }
        let partition = self.source.partitioned.then_some(part as u32);
        // Sent together at the end: one lock and one wake of the
        // connection for the read, not one per record.
        let mut events = Vec::with_capacity(decoded.len());
        for (offset, timestamp_ms, message) in decoded {
            if ahead_left == Some(0) {
                break; // the read-ahead is full; the rest is read again
            }
            let message = match message {
                Ok(m) => m,
                Err(e) => {
                    tracing::error!(stream = %stream.name, offset, error = %e,
                        "stream record does not decode; skipped");
                    st.parts[part].next = offset + 1;
                    continue;
                }
            };
            let tag = st.next_tag;
            st.next_tag += 1;
            st.parts[part].next = offset + 1;
            if !self.auto_settle {
                st.unsettled.insert(tag, part, offset);
                if self.group.is_some() {
                    st.unsettled_by_offset.insert((part, offset, tag));
                }
            }
            if let CreditMode::Explicit(_) = st.mode {
                st.credit = st.credit.saturating_sub(1);
                st.sent = st.sent.wrapping_add(1);
            }
            let bytes = message.memory_size() as u64;
            if let Some(left) = &mut ahead_left {
                *left = left.saturating_sub(bytes);
            }
            let charge = rosetta_neutral::DeliveryCharge::on(&self.sink, bytes);
            events.push(SessionEvent::Delivery(Delivery {
                consumer: self.consumer,
                tag: DeliveryTag(tag),
                message,
                delivery_count: 0,
                redelivered: false,
                from_retained: false,
                matched: MatchInfo::default(),
                annotation: None,
                charge,
                stream: Some(StreamPosition {
                    offset,
                    timestamp_ms,
                    missed,
                    partition,
                }),
            }));
            missed = 0;
        }
        self.sink.send_many(&mut events);
        st.cursor = (part + 1) % st.parts.len();
        if self.auto_settle {
            if let Some(g) = &self.group {
                groups.commit(&stream.name, g, st.parts[part].next, false, None);
            }
        }
        PartPump::Sent
    }

    /// Settles `tag`; commits the group's offset of its part as far as
    /// settled, with `done` run once that commit is durable (see
    /// [`Settlement`]).
    pub(crate) fn settle(
        &self,
        tag: DeliveryTag,
        groups: &Groups,
        done: Option<Completion>,
    ) -> Settlement {
        let mut st = self.state.lock();
        let Some((part, offset)) = st.unsettled.remove(tag.0) else {
            return Settlement::Unknown;
        };
        let Some(g) = &self.group else {
            return Settlement::NoCommit;
        };
        st.unsettled_by_offset.remove(&(part, offset, tag.0));
        if !st.parts[part].assigned {
            return Settlement::NoCommit;
        }
        let upto = st
            .unsettled_by_offset
            .range((part, 0, 0)..)
            .next()
            .filter(|(p, _, _)| *p == part)
            .map_or(st.parts[part].next, |&(_, o, _)| o);
        let name = &self.source.streams[part].name;
        if groups.commit(name, g, upto, false, done) {
            Settlement::Committed
        } else {
            Settlement::NoCommit
        }
    }

    /// Sets explicit credit from a limit counted like the queue
    /// consumers' (see `ConsumerSlot::set_credit_limit`); a window's size.
    pub(crate) fn set_credit(&self, limit: u32, drain: bool) {
        let mut st = self.state.lock();
        match st.mode {
            CreditMode::Explicit(_) => {
                let c = limit.wrapping_sub(st.sent);
                st.credit = if c > i32::MAX as u32 { 0 } else { c };
            }
            CreditMode::Window(_) => st.mode = CreditMode::Window(limit),
        }
        st.drain = drain;
    }

    /// Stops it: nothing more is sent.
    pub(crate) fn close(&self) {
        self.state.lock().closed = true;
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().closed
    }
}

/// What one read of one part did.
enum PartPump {
    Sent,
    /// Nothing to send from it now.
    Empty,
    /// No credit or room left, or closed: the pass ends.
    Stop,
    /// Its next record must be read from the device: for a read thread.
    Files,
}
