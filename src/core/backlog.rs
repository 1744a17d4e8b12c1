//! The messages a queue holds for its consumers, in memory while the broker
//! is under its memory budget and paged to disk past it.
//!
//! Paging works per queue, the way Artemis pages an address: once a queue
//! starts paging, every newer message goes to its page file too, so the
//! queue is "in memory first, then on disk", in sequence order. Only the
//! small [`Paged`] reference (about 56 bytes) stays in memory for a
//! paged message, so a million 1 KiB messages cost a million references,
//! not a gigabyte. When the in-memory part runs dry, dispatch reads back
//! the next batch with one read. Released and redelivered messages go back
//! to memory: they were in memory (in flight) already.
//!
//! Depaging reads under the queue lock. That is a deliberate exception to
//! "no IO under a queue lock": the read is of recently written bytes (the
//! OS page cache, usually), bounded to [`DEPAGE_BATCH_BYTES`], and only the
//! paging queue waits for it.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use rosetta_neutral::MatchInfo;

use super::queue::Entry;
use crate::store::{
    decode_message_exact, encode_message, MessageSeq, OsStorage, PageFile, PageRef, QueueId,
    Storage,
};

/// Most messages read back from a page file at once.
const DEPAGE_BATCH_MESSAGES: usize = 512;
/// Most bytes read back from a page file at once.
const DEPAGE_BATCH_BYTES: u64 = 1024 * 1024;

/// Bytes of messages held in memory by all queues, the budget they share,
/// and where queues page past it. Each queue's copy of a fanned-out message
/// counts (an over-estimate, on the safe side: the payload is shared).
#[derive(Debug)]
pub(crate) struct MemoryGauge {
    used: AtomicU64,
    budget: u64,
    /// Where page files go; `None` turns paging off (the in-memory core).
    page_dir: Option<PathBuf>,
    /// Messages currently paged out, all queues together.
    paged: AtomicU64,
    /// Where page files are written.
    storage: std::sync::Arc<dyn Storage>,
}

impl MemoryGauge {
    pub(crate) fn new(budget: u64, page_dir: Option<PathBuf>) -> Self {
        Self {
            used: AtomicU64::new(0),
            budget,
            page_dir,
            paged: AtomicU64::new(0),
            storage: std::sync::Arc::new(OsStorage),
        }
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Messages paged out now.
    pub(crate) fn paged(&self) -> u64 {
        self.paged.load(Ordering::Relaxed)
    }

    /// Whether producers should be held back. With paging, memory is bounded
    /// by paging, so only a large overshoot (many unsettled deliveries, or
    /// paging failing) holds producers back; without it, the budget itself.
    pub(crate) fn producers_blocked(&self) -> bool {
        let ceiling = if self.page_dir.is_some() {
            self.budget.saturating_mul(2)
        } else {
            self.budget
        };
        self.used() > ceiling
    }

    pub(crate) fn add(&self, entry: &Entry) {
        self.used
            .fetch_add(entry.message.memory_size() as u64, Ordering::Relaxed);
    }

    pub(crate) fn sub(&self, entry: &Entry) {
        let size = entry.message.memory_size() as u64;
        // Saturating: accounting must never wrap into "everything is free".
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(size))
            });
    }

    fn over_budget_with(&self, entry: &Entry) -> bool {
        self.used() + entry.message.memory_size() as u64 > self.budget
    }
}

/// What stays in memory of a paged message: everything but the message.
/// Kept small (about 56 bytes): there is one per paged message.
#[derive(Debug)]
struct Paged {
    at: PageRef,
    seq: MessageSeq,
    journaled: bool,
    enqueued_at: Instant,
    /// Delivery state, for the rare paged message that has any (a
    /// redelivered message recovered from the journal, a retained copy).
    state: Option<Box<DeliveryState>>,
}

/// The part of an [`Entry`] that is usually at its default.
#[derive(Debug, Default)]
struct DeliveryState {
    delivery_count: u32,
    redelivered: bool,
    from_retained: bool,
    matched: MatchInfo,
    annotation: Option<Bytes>,
}

impl Paged {
    fn of(entry: Entry, at: PageRef) -> Self {
        let state = DeliveryState {
            delivery_count: entry.delivery_count,
            redelivered: entry.redelivered,
            from_retained: entry.from_retained,
            matched: entry.matched,
            annotation: entry.annotation,
        };
        let usual = state.delivery_count == 0
            && !state.redelivered
            && !state.from_retained
            && state.matched == MatchInfo::default()
            && state.annotation.is_none();
        Self {
            at,
            seq: entry.seq,
            journaled: entry.journaled,
            enqueued_at: entry.enqueued_at,
            state: (!usual).then(|| Box::new(state)),
        }
    }

    fn into_entry(self, message: std::sync::Arc<rosetta_neutral::Message>) -> Entry {
        let mut entry = Entry::new(self.seq, message, self.journaled);
        entry.enqueued_at = self.enqueued_at;
        if let Some(state) = self.state {
            entry.delivery_count = state.delivery_count;
            entry.redelivered = state.redelivered;
            entry.from_retained = state.from_retained;
            entry.matched = state.matched;
            entry.annotation = state.annotation;
        }
        entry
    }
}

/// A queue's waiting messages.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    /// In memory, by sequence (a released message returns to its place).
    memory: InMemory,
    /// On disk, in sequence order, all newer than `memory`.
    paged: VecDeque<Paged>,
    file: Option<PageFile>,
    /// A page file failed: this queue keeps everything in memory from now.
    paging_off: bool,
}

impl Backlog {
    /// Messages waiting, paged ones included.
    pub(crate) fn len(&self) -> usize {
        self.memory.len() + self.paged.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.memory.is_empty() && self.paged.is_empty()
    }

    /// Messages waiting on disk.
    pub(crate) fn paged_len(&self) -> usize {
        self.paged.len()
    }

    /// When the message at the head of the queue was enqueued.
    pub(crate) fn oldest_enqueued_at(&self) -> Option<Instant> {
        match self.memory.first() {
            Some(e) => Some(e.enqueued_at),
            None => self.paged.front().map(|p| p.enqueued_at),
        }
    }

    /// A new message: kept in memory, or paged when the queue is already
    /// paging or the broker is over its memory budget.
    pub(crate) fn push(&mut self, entry: Entry, gauge: &MemoryGauge, queue: QueueId) {
        let page_dir = gauge.page_dir.as_deref().filter(|_| {
            !self.paging_off && (!self.paged.is_empty() || gauge.over_budget_with(&entry))
        });
        if let Some(dir) = page_dir {
            match self.page_out(&entry, gauge, dir, queue) {
                Ok(at) => {
                    gauge.paged.fetch_add(1, Ordering::Relaxed);
                    self.paged.push_back(Paged::of(entry, at));
                    return;
                }
                Err(e) => {
                    tracing::error!(queue, error = %e, "paging failed; this queue keeps its messages in memory");
                    self.paging_off = true;
                }
            }
        }
        gauge.add(&entry);
        self.memory.insert(entry);
    }

    /// A message that was in flight comes back (released, or redelivered):
    /// it is in memory and counted already.
    pub(crate) fn put_back(&mut self, entry: Entry) {
        self.memory.insert(entry);
    }

    /// The message at the head, read back from disk if the in-memory part
    /// is empty. Counted in the gauge while the caller holds it.
    pub(crate) fn pop_front(&mut self, gauge: &MemoryGauge, queue: QueueId) -> Option<Entry> {
        if self.memory.is_empty() && !self.paged.is_empty() {
            self.page_in(gauge, queue);
        }
        self.memory.pop_first()
    }

    /// Empties the backlog (the queue is deleted); returns the in-memory
    /// entries so their accounting can be undone.
    pub(crate) fn take_all(&mut self, gauge: &MemoryGauge) -> Vec<Entry> {
        gauge
            .paged
            .fetch_sub(self.paged.len() as u64, Ordering::Relaxed);
        self.paged.clear();
        self.file = None;
        std::mem::take(&mut self.memory).into_entries()
    }

    fn page_out(
        &mut self,
        entry: &Entry,
        gauge: &MemoryGauge,
        dir: &std::path::Path,
        queue: QueueId,
    ) -> Result<PageRef, crate::store::PageError> {
        let file = match &mut self.file {
            Some(f) => f,
            None => {
                let file = PageFile::create(
                    std::sync::Arc::clone(&gauge.storage),
                    &dir.join(format!("{queue}.page")),
                )?;
                tracing::info!(queue, "queue is over the memory budget: paging to disk");
                self.file.insert(file)
            }
        };
        let mut body = Vec::with_capacity(entry.message.memory_size());
        encode_message(&entry.message, &mut body);
        file.append(&body)
    }

    /// Reads the next batch of paged messages into memory.
    fn page_in(&mut self, gauge: &MemoryGauge, queue: QueueId) {
        let Some(file) = &mut self.file else {
            return;
        };
        let mut count = 0;
        let mut bytes = 0;
        for p in &self.paged {
            if count == DEPAGE_BATCH_MESSAGES
                || (count > 0 && bytes + u64::from(p.at.len) > DEPAGE_BATCH_BYTES)
            {
                break;
            }
            count += 1;
            bytes += u64::from(p.at.len);
        }
        let refs: Vec<PageRef> = self.paged.iter().take(count).map(|p| p.at).collect();
        let bodies = match file.read(&refs) {
            Ok(bodies) => bodies,
            Err(e) => {
                // The paged messages stay where they are: nothing is lost
                // from the journal, and the next dispatch tries again.
                tracing::error!(queue, error = %e, "cannot read paged messages back");
                return;
            }
        };
        gauge.paged.fetch_sub(count as u64, Ordering::Relaxed);
        for (p, body) in self.paged.drain(..count).zip(bodies) {
            let message = match decode_message_exact(body) {
                Ok(m) => std::sync::Arc::new(m),
                Err(e) => {
                    tracing::error!(queue, seq = p.seq, error = %e, "a paged message does not decode; dropped from memory (the journal keeps it until restart)");
                    continue;
                }
            };
            let entry = p.into_entry(message);
            gauge.add(&entry);
            self.memory.insert(entry);
        }
        if self.paged.is_empty() {
            if let Err(e) = file.clear() {
                tracing::warn!(queue, error = %e, "cannot truncate the page file");
            }
        }
    }
}

/// The in-memory part of a backlog, in sequence order.
///
/// Almost every message arrives with a higher sequence than any before it,
/// and leaves from the front: a ring buffer does that with no allocation
/// per message. (A `BTreeMap` alone allocated and freed a node whenever a
/// queue went between empty and one message, which is every message for a
/// consumer that keeps up, and moved whole entries on each pop.) Released
/// messages, and the rare message whose enqueue overtook a newer one, go to
/// an ordered map beside it; the head is the lower of the two heads.
#[derive(Debug, Default)]
struct InMemory {
    in_order: VecDeque<Entry>,
    out_of_order: BTreeMap<MessageSeq, Entry>,
}

impl InMemory {
    fn len(&self) -> usize {
        self.in_order.len() + self.out_of_order.len()
    }

    fn is_empty(&self) -> bool {
        self.in_order.is_empty() && self.out_of_order.is_empty()
    }

    fn insert(&mut self, entry: Entry) {
        match self.in_order.back() {
            Some(last) if last.seq >= entry.seq => {
                self.out_of_order.insert(entry.seq, entry);
            }
            _ => self.in_order.push_back(entry),
        }
    }

    /// Whether the head is in `out_of_order` rather than `in_order`.
    fn head_is_out_of_order(&self) -> bool {
        match (self.in_order.front(), self.out_of_order.first_key_value()) {
            (Some(a), Some((b, _))) => *b < a.seq,
            (None, Some(_)) => true,
            _ => false,
        }
    }

    fn first(&self) -> Option<&Entry> {
        if self.head_is_out_of_order() {
            self.out_of_order.first_key_value().map(|(_, e)| e)
        } else {
            self.in_order.front()
        }
    }

    fn pop_first(&mut self) -> Option<Entry> {
        if self.head_is_out_of_order() {
            self.out_of_order.pop_first().map(|(_, e)| e)
        } else {
            self.in_order.pop_front()
        }
    }

    /// Every entry, in no particular order.
    fn into_entries(self) -> Vec<Entry> {
        let mut all: Vec<Entry> = self.in_order.into();
        all.extend(self.out_of_order.into_values());
        all
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rosetta_neutral::Message;

    use super::*;

    fn entry(seq: MessageSeq) -> Entry {
        Entry::new(seq, Arc::new(Message::default()), false)
    }

    fn drain(m: &mut InMemory) -> Vec<MessageSeq> {
        std::iter::from_fn(|| m.pop_first())
            .map(|e| e.seq)
            .collect()
    }

    #[test]
    fn in_memory_pops_in_sequence_order_whatever_the_insert_order() {
        let mut m = InMemory::default();
        for seq in [3, 5, 4, 9, 1, 7, 8, 2] {
            m.insert(entry(seq));
        }
        assert_eq!(m.len(), 8);
        assert_eq!(m.first().map(|e| e.seq), Some(1));
        assert_eq!(drain(&mut m), vec![1, 2, 3, 4, 5, 7, 8, 9]);
        assert!(m.is_empty());
    }

    #[test]
    fn a_released_message_returns_ahead_of_newer_ones() {
        let mut m = InMemory::default();
        for seq in 10..15 {
            m.insert(entry(seq));
        }
        let taken: Vec<Entry> = (0..3).filter_map(|_| m.pop_first()).collect();
        m.insert(entry(15));
        // Released in reverse, as a detaching consumer may return them.
        for e in taken.into_iter().rev() {
            m.insert(e);
        }
        assert_eq!(drain(&mut m), vec![10, 11, 12, 13, 14, 15]);
    }

    proptest::proptest! {
        #[test]
        fn in_memory_matches_a_sorted_model(ops in proptest::collection::vec((0u8..3, 0u64..64), 0..200)) {
            let mut m = InMemory::default();
            let mut model = std::collections::BTreeSet::new();
            for (op, seq) in ops {
                if op < 2 {
                    if model.insert(seq) {
                        m.insert(entry(seq));
                    }
                } else {
                    proptest::prop_assert_eq!(m.pop_first().map(|e| e.seq), model.pop_first());
                }
                proptest::prop_assert_eq!(m.len(), model.len());
                proptest::prop_assert_eq!(m.first().map(|e| e.seq), model.first().copied());
            }
        }
    }
}
