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
//! A restart does not copy anything into page files. The queues a
//! restart rebuilds page what is over the budget *by reference*: such a
//! [`Paged`] points at the message's record in the journal (by seq), and
//! depaging reads it back from there ([`Journal::read_messages`]). The
//! journal keeps the reference valid: compaction may copy the record
//! forward and delete its old segment, but the store looks each seq up in
//! its index, which compaction keeps current (relocation, not pinning, so
//! an idle deep queue does not stop the journal from reclaiming the dead
//! messages around its own). Only messages paged at run time go to page
//! files: a new message may not be written to the journal yet when it is
//! paged.
//!
//! Depaging reads under the queue lock. That is a deliberate exception to
//! "no IO under a queue lock": the read is of recently written bytes (the
//! OS page cache, usually), bounded to [`DEPAGE_BATCH_BYTES`], and only the
//! paging queue waits for it.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use std::sync::Arc;

use bytes::Bytes;
use rosetta_neutral::{MatchInfo, Message};

use super::codec::{decode_message_exact, encode_message};
use super::queue::Entry;
use super::Journal;
use rosetta_store::{MessageSeq, OsStorage, PageFile, PageRef, QueueId, Storage};

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
    /// The journal that restored messages are paged into by reference,
    /// while [`Self::restoring`].
    journal: std::sync::OnceLock<JournalRef>,
    restoring: std::sync::atomic::AtomicBool,
}

impl MemoryGauge {
    pub(crate) fn new(budget: u64, page_dir: Option<PathBuf>) -> Self {
        Self {
            used: AtomicU64::new(0),
            budget,
            page_dir,
            paged: AtomicU64::new(0),
            storage: std::sync::Arc::new(OsStorage),
            journal: std::sync::OnceLock::new(),
            restoring: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now until [`Self::end_restore`], journaled messages pushed
    /// past the budget are paged by reference into `journal` (they are
    /// read back from it): the queues are being rebuilt from it.
    pub(crate) fn start_restore(&self, journal: std::sync::Arc<dyn Journal>) {
        let _ = self.journal.set(JournalRef(journal));
        self.restoring.store(true, Ordering::SeqCst);
    }

    /// The restore is over: new messages page to page files again.
    pub(crate) fn end_restore(&self) {
        self.restoring.store(false, Ordering::SeqCst);
    }

    /// Whether a message being pushed now may be paged by reference.
    fn pages_into_journal(&self, entry: &Entry) -> bool {
        entry.journaled && self.restoring.load(Ordering::Relaxed) && self.journal.get().is_some()
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

/// The journal, as the gauge holds it (it has no `Debug`).
struct JournalRef(Arc<dyn Journal>);

impl std::fmt::Debug for JournalRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalRef")
    }
}

/// What stays in memory of a paged message: everything but the message.
/// Kept small (about 56 bytes): there is one per paged message.
#[derive(Debug)]
struct Paged {
    /// Where it is in the page file; for a message paged by reference, only
    /// `len` means something (its size, for the depaging batch bound).
    at: PageRef,
    seq: MessageSeq,
    journaled: bool,
    /// Paged by reference: read back from the journal, not the page file.
    in_journal: bool,
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
            in_journal: false,
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
        if page_dir.is_some() && gauge.pages_into_journal(&entry) {
            let size = u32::try_from(entry.message.memory_size()).unwrap_or(u32::MAX);
            let mut paged = Paged::of(
                entry,
                PageRef {
                    offset: 0,
                    len: size,
                },
            );
            paged.in_journal = true;
            gauge.paged.fetch_add(1, Ordering::Relaxed);
            self.paged.push_back(paged);
            return;
        }
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
    ) -> Result<PageRef, rosetta_store::PageError> {
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

    /// Reads the next batch of paged messages into memory: a run of
    /// messages from the same place (the page file, or the journal).
    fn page_in(&mut self, gauge: &MemoryGauge, queue: QueueId) {
        let Some(in_journal) = self.paged.front().map(|p| p.in_journal) else {
            return;
        };
        let mut count = 0;
        let mut bytes = 0;
        for p in &self.paged {
            if count == DEPAGE_BATCH_MESSAGES
                || p.in_journal != in_journal
                || (count > 0 && bytes + u64::from(p.at.len) > DEPAGE_BATCH_BYTES)
            {
                break;
            }
            count += 1;
            bytes += u64::from(p.at.len);
        }
        let messages = if in_journal {
            self.read_from_journal(gauge, queue, count)
        } else {
            self.read_from_file(queue, count)
        };
        let Some(messages) = messages else {
            // The paged messages stay where they are: nothing is lost from
            // the journal, and the next dispatch tries again.
            return;
        };
        gauge.paged.fetch_sub(count as u64, Ordering::Relaxed);
        for (p, message) in self.paged.drain(..count).zip(messages) {
            let Some(message) = message else {
                continue;
            };
            let entry = p.into_entry(message);
            gauge.add(&entry);
            self.memory.insert(entry);
        }
        if self.paged.is_empty() {
            if let Some(file) = &mut self.file {
                if let Err(e) = file.clear() {
                    tracing::warn!(queue, error = %e, "cannot truncate the page file");
                }
            }
        }
    }

    /// The first `count` paged messages from the page file; `None` when the
    /// file cannot be read, `None` items for what does not decode.
    fn read_from_file(
        &mut self,
        queue: QueueId,
        count: usize,
    ) -> Option<Vec<Option<Arc<Message>>>> {
        let file = self.file.as_mut()?;
        let refs: Vec<PageRef> = self.paged.iter().take(count).map(|p| p.at).collect();
        let bodies = match file.read(&refs) {
            Ok(bodies) => bodies,
            Err(e) => {
                tracing::error!(queue, error = %e, "cannot read paged messages back");
                return None;
            }
        };
        Some(
            self.paged
                .iter()
                .zip(bodies)
                .map(|(p, body)| match decode_message_exact(body) {
                    Ok(m) => Some(Arc::new(m)),
                    Err(e) => {
                        tracing::error!(queue, seq = p.seq, error = %e, "a paged message does not decode; dropped from memory (the journal keeps it until restart)");
                        None
                    }
                })
                .collect(),
        )
    }

    /// The first `count` paged messages, read back from the journal; `None`
    /// when none could be read (a failing disk: try again later), `None`
    /// items for single messages that could not.
    fn read_from_journal(
        &self,
        gauge: &MemoryGauge,
        queue: QueueId,
        count: usize,
    ) -> Option<Vec<Option<Arc<Message>>>> {
        let journal = &gauge.journal.get()?.0;
        let seqs: Vec<MessageSeq> = self.paged.iter().take(count).map(|p| p.seq).collect();
        let read = journal.read_messages(&seqs);
        if read.iter().all(|r| r.is_err()) {
            if let Some(Err(e)) = read.first() {
                tracing::error!(queue, error = %e, "cannot read paged messages back from the journal");
            }
            return None;
        }
        Some(
            read.into_iter()
                .zip(&seqs)
                .map(|(r, seq)| match r {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::error!(queue, seq, error = %e, "a paged message cannot be read back from the journal; dropped from memory (the journal keeps it until restart)");
                        None
                    }
                })
                .collect(),
        )
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
