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
use crate::store::{decode_message_exact, encode_message, MessageSeq, PageFile, PageRef, QueueId};

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
}

impl MemoryGauge {
    pub(crate) fn new(budget: u64, page_dir: Option<PathBuf>) -> Self {
        Self {
            used: AtomicU64::new(0),
            budget,
            page_dir,
            paged: AtomicU64::new(0),
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
    memory: BTreeMap<MessageSeq, Entry>,
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
        match self.memory.first_key_value() {
            Some((_, e)) => Some(e.enqueued_at),
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
            match self.page_out(&entry, dir, queue) {
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
        self.memory.insert(entry.seq, entry);
    }

    /// A message that was in flight comes back (released, or redelivered):
    /// it is in memory and counted already.
    pub(crate) fn put_back(&mut self, entry: Entry) {
        self.memory.insert(entry.seq, entry);
    }

    /// The message at the head, read back from disk if the in-memory part
    /// is empty. Counted in the gauge while the caller holds it.
    pub(crate) fn pop_front(&mut self, gauge: &MemoryGauge, queue: QueueId) -> Option<Entry> {
        if self.memory.is_empty() && !self.paged.is_empty() {
            self.page_in(gauge, queue);
        }
        self.memory.pop_first().map(|(_, e)| e)
    }

    /// Empties the backlog (the queue is deleted); returns the in-memory
    /// entries so their accounting can be undone.
    pub(crate) fn take_all(&mut self, gauge: &MemoryGauge) -> Vec<Entry> {
        gauge
            .paged
            .fetch_sub(self.paged.len() as u64, Ordering::Relaxed);
        self.paged.clear();
        self.file = None;
        std::mem::take(&mut self.memory).into_values().collect()
    }

    fn page_out(
        &mut self,
        entry: &Entry,
        dir: &std::path::Path,
        queue: QueueId,
    ) -> Result<PageRef, crate::store::PageError> {
        let file = match &mut self.file {
            Some(f) => f,
            None => {
                let file = PageFile::create(&dir.join(format!("{queue}.page")))?;
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
            self.memory.insert(entry.seq, entry);
        }
        if self.paged.is_empty() {
            if let Err(e) = file.clear() {
                tracing::warn!(queue, error = %e, "cannot truncate the page file");
            }
        }
    }
}
