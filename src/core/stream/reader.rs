//! One stream consumer.
//!
//! A reader has a position (the next offset it will be sent), credit as a
//! queue consumer has ([`CreditMode`]), and the deliveries it has not yet
//! settled, by tag. Reading does not delete: a settlement only tells a
//! group how far its reader got.
//!
//! # Acknowledgements and the group's offset
//!
//! Any settlement (accept, release, modify, reject: a log has no
//! redelivery) settles a delivery. The group's committed offset moves to
//! the lowest offset still unsettled, or past everything sent when nothing
//! is: acknowledgements commit cumulatively, and an out-of-order
//! acknowledgement is remembered but moves nothing until the ones before
//! it are settled too. So a restarted reader of the group is sent again
//! whatever was unsettled (at-least-once). An auto-settled reader commits
//! as it is sent (at-most-once).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rosetta_neutral::{
    ConsumerId, CreditMode, Delivery, DeliveryTag, EventSink, MatchInfo, SessionEvent,
    StreamPosition,
};

use rosetta_store::Completion;

use super::groups::Groups;
use super::Stream;

/// Most records one pump pass reads for a reader: a reader with a large
/// credit still lets the others be served in between.
const PUMP_RECORDS_MAX: usize = 256;
/// About the most bytes of bodies one pump pass reads for a reader.
const PUMP_BYTES_MAX: usize = 1024 * 1024;

struct ReaderState {
    /// The next offset to send.
    next: u64,
    mode: CreditMode,
    /// Explicit credit left; for a window, the window.
    credit: u32,
    /// Deliveries sent in explicit mode (a credit limit counts from it).
    sent: u32,
    drain: bool,
    /// Tag → offset of what is sent and not yet settled.
    unsettled: BTreeMap<u64, u64>,
    next_tag: u64,
    closed: bool,
}

/// What [`Reader::settle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settlement {
    /// Not an unsettled delivery of this reader.
    Unknown,
    /// Settled; the group's offset did not move (no group, or an
    /// out-of-order settlement), so there is nothing to wait for.
    NoCommit,
    /// Settled, and the group's new offset is being journaled: the
    /// completion runs once it is durable.
    Committed,
}

/// A stream consumer; see the module docs.
pub(crate) struct Reader {
    pub(crate) consumer: ConsumerId,
    pub(crate) stream: Arc<Stream>,
    sink: Arc<dyn EventSink>,
    auto_settle: bool,
    group: Option<String>,
    state: Mutex<ReaderState>,
    /// One pump at a time per reader (the pump thread, or a caller that
    /// granted credit), so positions never race.
    pumping: Mutex<()>,
}

impl Reader {
    pub(crate) fn new(
        consumer: ConsumerId,
        stream: Arc<Stream>,
        sink: Arc<dyn EventSink>,
        mode: CreditMode,
        auto_settle: bool,
        group: Option<String>,
        start: u64,
    ) -> Reader {
        let credit = match mode {
            CreditMode::Window(n) | CreditMode::Explicit(n) => n,
        };
        Reader {
            consumer,
            stream,
            sink,
            auto_settle,
            group,
            state: Mutex::new(ReaderState {
                next: start,
                mode,
                credit,
                sent: 0,
                drain: false,
                unsettled: BTreeMap::new(),
                next_tag: 1,
                closed: false,
            }),
            pumping: Mutex::new(()),
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

    /// Sends what its credit allows from the log.
    pub(crate) fn pump(&self, stream: &Stream, groups: &Groups) {
        let _one = self.pumping.lock();
        loop {
            let (from, room) = {
                let mut st = self.state.lock();
                if st.closed {
                    return;
                }
                let room = Self::room(&st);
                if room == 0 && st.drain {
                    st.drain = false;
                    self.sink.send(SessionEvent::Drained {
                        consumer: self.consumer,
                    });
                }
                (st.next, room)
            };
            let has_room = self.sink.budget().is_none_or(|b| b.try_room());
            if room == 0 || !has_room {
                return;
            }
            let read = match stream.log.read(from, room, PUMP_BYTES_MAX) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(stream = %stream.name, offset = from, error = %e,
                        "stream read failed; the reader waits");
                    return;
                }
            };
            let mut st = self.state.lock();
            if st.closed {
                return;
            }
            if read.records.is_empty() {
                st.next = read.next.max(st.next);
                if st.drain {
                    st.drain = false;
                    st.credit = 0;
                    self.sink.send(SessionEvent::Drained {
                        consumer: self.consumer,
                    });
                }
                return;
            }
            let mut missed = read.missed;
            if missed > 0 {
                tracing::warn!(stream = %stream.name, missed, first = read.next,
                    "stream reader cut by retention skips ahead");
            }
            for rec in read.records {
                let message = match crate::codec::decode_message_exact(rec.body) {
                    Ok(m) => Arc::new(m),
                    Err(e) => {
                        tracing::error!(stream = %stream.name, offset = rec.offset, error = %e,
                            "stream record does not decode; skipped");
                        st.next = rec.offset + 1;
                        continue;
                    }
                };
                let tag = st.next_tag;
                st.next_tag += 1;
                st.next = rec.offset + 1;
                if !self.auto_settle {
                    st.unsettled.insert(tag, rec.offset);
                }
                if let CreditMode::Explicit(_) = st.mode {
                    st.credit = st.credit.saturating_sub(1);
                    st.sent = st.sent.wrapping_add(1);
                }
                let charge = match self.sink.budget() {
                    Some(b) => b.charge(message.memory_size() as u64),
                    None => rosetta_neutral::DeliveryCharge::none(),
                };
                self.sink.send(SessionEvent::Delivery(Delivery {
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
                        offset: rec.offset,
                        timestamp_ms: rec.timestamp_ms,
                        missed,
                    }),
                }));
                missed = 0;
            }
            if self.auto_settle {
                if let Some(g) = &self.group {
                    groups.commit(&stream.name, g, st.next, false, None);
                }
            }
        }
    }

    /// Settles `tag`; commits the group's offset as far as settled, with
    /// `done` run once that commit is durable (see [`Settlement`]).
    pub(crate) fn settle(
        &self,
        tag: DeliveryTag,
        groups: &Groups,
        done: Option<Completion>,
    ) -> Settlement {
        let mut st = self.state.lock();
        if st.unsettled.remove(&tag.0).is_none() {
            return Settlement::Unknown;
        }
        let Some(g) = &self.group else {
            return Settlement::NoCommit;
        };
        let upto = st.unsettled.values().min().copied().unwrap_or(st.next);
        if groups.commit(&self.stream.name, g, upto, false, done) {
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
}
