//! The messages a queue holds for its consumers, in memory while the broker
//! is under its memory budget and paged to disk past it.
//!
//! In memory, messages wait by priority (0-9, higher first) and by
//! sequence within a priority, one ring per priority (`levels`): a
//! released message returns to its place within its priority. Messages of
//! a message group wait apart once their group's consumer is known, in
//! that consumer's own list (`reserve`), so nobody else passes over them.
//!
//! Paging works per queue, the way Artemis pages an address: once a queue
//! starts paging, every newer message goes to its page file too, so the
//! queue is "in memory first, then on disk", in sequence order. Paged
//! messages keep sequence order whatever their priority until they are read
//! back, and only then take their place by priority: a high-priority
//! message that was paged waits behind the lower-priority ones in memory
//! (Artemis behaves the same when paging). Only the
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

mod levels;
pub(crate) mod paged;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::Arc;

use rosetta_neutral::Message;

use super::codec::encode_message;
use levels::Levels;
pub(crate) use levels::Place;
pub(crate) use paged::Paged;

use super::queue::{ConsumerKey, Entry};
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

    /// Where page files go, when paging is on.
    pub(crate) fn page_dir(&self) -> Option<&std::path::Path> {
        self.page_dir.as_deref()
    }

    /// What page files are written through.
    pub(crate) fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The journal restored messages were paged into by reference.
    pub(crate) fn journal(&self) -> Option<&Arc<dyn Journal>> {
        self.journal.get().map(|j| &j.0)
    }

    /// Whether what is counted now is over the budget.
    pub(crate) fn over_budget(&self) -> bool {
        self.used() > self.budget
    }

    /// `count` more messages are paged out.
    pub(crate) fn add_paged(&self, count: u64) {
        self.paged.fetch_add(count, Ordering::Relaxed);
    }

    /// `count` fewer messages are paged out.
    pub(crate) fn sub_paged(&self, count: u64) {
        self.paged.fetch_sub(count, Ordering::Relaxed);
    }

    /// Whether a message being pushed now may be paged by reference.
    pub(crate) fn pages_into_journal(&self, entry: &Entry) -> bool {
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

/// A waiting message taken out by [`Backlog::withdraw`].
#[derive(Debug)]
pub(crate) struct Withdrawn {
    pub(crate) seq: MessageSeq,
    /// Its record for this queue is in the journal (to be acked).
    pub(crate) journaled: bool,
    /// The entry, when it was in memory and counted in the gauge (the
    /// caller uncounts it); `None` for a paged one.
    pub(crate) counted: Option<Entry>,
}

impl Withdrawn {
    fn of_counted(entry: Entry) -> Self {
        Self {
            seq: entry.seq,
            journaled: entry.journaled,
            counted: Some(entry),
        }
    }
}

/// The journal, as the gauge holds it (it has no `Debug`).
struct JournalRef(Arc<dyn Journal>);

impl std::fmt::Debug for JournalRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalRef")
    }
}

/// A queue's waiting messages.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    /// In memory, by priority then sequence (a released message returns to
    /// its place).
    memory: Levels,
    /// Messages on disk and their page file. Boxed at the first page-out:
    /// most queues never page, and there is a queue per MQTT subscriber
    /// (issue 20).
    paging: Option<Box<Paging>>,
    /// What message groups and selecting consumers keep. Boxed at first
    /// use, for the same reason.
    aside: Option<Box<Aside>>,
}

/// A backlog's paged part.
#[derive(Debug, Default)]
struct Paging {
    /// On disk, in sequence order, all newer than `Backlog::memory`.
    paged: VecDeque<Paged>,
    file: Option<PageFile>,
    /// A page file failed: this queue keeps everything in memory from now.
    off: bool,
}

/// A backlog's part for message groups and selectors.
#[derive(Debug, Default)]
struct Aside {
    /// Messages of a message group waiting for the consumer the group is
    /// assigned to, by consumer, in sequence order. In memory, counted in
    /// the gauge; out of `memory`, so that nobody else passes over them.
    reserved: HashMap<ConsumerKey, BTreeMap<MessageSeq, Entry>>,
    reserved_len: usize,
    /// Whether the places of messages arriving in `memory` are noted in
    /// `arrived` (the queue has consumers with selectors, or message
    /// groups, that must look at each message once).
    noting: bool,
    arrived: Vec<Place>,
}

/// The paged messages of a queue that has never paged.
static NOTHING_PAGED: VecDeque<Paged> = VecDeque::new();

impl Backlog {
    /// Messages waiting on disk, in sequence order.
    fn paged(&self) -> &VecDeque<Paged> {
        self.paging.as_ref().map_or(&NOTHING_PAGED, |p| &p.paged)
    }

    fn paging_mut(&mut self) -> &mut Paging {
        self.paging.get_or_insert_with(Box::default)
    }

    /// Messages kept for their groups' consumers, by consumer.
    fn reserved(&self) -> impl Iterator<Item = (&ConsumerKey, &BTreeMap<MessageSeq, Entry>)> {
        self.aside.iter().flat_map(|a| a.reserved.iter())
    }

    fn aside_mut(&mut self) -> &mut Aside {
        self.aside.get_or_insert_with(Box::default)
    }

    /// Frees the groups-and-selectors part once it keeps nothing.
    fn prune_aside(&mut self) {
        if self
            .aside
            .as_ref()
            .is_some_and(|a| !a.noting && a.reserved.is_empty())
        {
            self.aside = None;
        }
    }

    /// Messages waiting, paged and reserved ones included.
    pub(crate) fn len(&self) -> usize {
        self.memory.len() + self.paged().len() + self.reserved_len()
    }

    /// Whether messages wait ready in memory (not paged, not reserved).
    pub(crate) fn has_ready_in_memory(&self) -> bool {
        !self.memory.is_empty()
    }

    /// Whether nothing waits but what is reserved for groups' consumers.
    pub(crate) fn shared_is_empty(&self) -> bool {
        self.memory.is_empty() && self.paged().is_empty()
    }

    /// Notes (or stops noting) the places of messages as they arrive in
    /// memory, for [`Self::take_arrived`].
    pub(crate) fn set_noting(&mut self, noting: bool) {
        if noting {
            self.aside_mut().noting = true;
        } else if let Some(aside) = &mut self.aside {
            aside.noting = false;
            aside.arrived.clear();
            self.prune_aside();
        }
    }

    /// The places of messages that arrived in memory since the last call
    /// (pushed, put back or read back from disk), while noting. The vector
    /// is handed back with [`Self::return_arrived`] so its capacity is kept.
    pub(crate) fn take_arrived(&mut self) -> Vec<Place> {
        self.aside
            .as_mut()
            .map(|a| std::mem::take(&mut a.arrived))
            .unwrap_or_default()
    }

    /// Gives back the (emptied) vector of [`Self::take_arrived`].
    pub(crate) fn return_arrived(&mut self, mut arrived: Vec<Place>) {
        arrived.clear();
        if let Some(aside) = self.aside.as_mut().filter(|a| a.arrived.is_empty()) {
            aside.arrived = arrived;
        }
    }

    fn insert_in_memory(&mut self, entry: Entry) {
        let place = self.memory.insert(entry);
        if let Some(aside) = self.aside.as_mut().filter(|a| a.noting) {
            aside.arrived.push(place);
        }
    }

    /// The message at the head of the in-memory part, read back from disk
    /// first if that part is empty.
    pub(crate) fn front(&mut self, gauge: &MemoryGauge, queue: QueueId) -> Option<&Entry> {
        if self.memory.is_empty() && !self.paged().is_empty() {
            self.page_in(gauge, queue);
        }
        self.memory.first()
    }

    /// A message in memory, by place.
    pub(crate) fn get(&self, place: Place) -> Option<&Entry> {
        self.memory.get(place)
    }

    /// Takes a message out of memory, from wherever it is.
    pub(crate) fn remove(&mut self, place: Place) -> Option<Entry> {
        self.memory.remove(place)
    }

    /// Takes the waiting message at `place` out, wherever it waits: in
    /// memory, reserved for a group's consumer, or on disk (a paged one
    /// leaves only its reference, so nothing is read back). `None` when it
    /// does not wait here (in flight, or gone). A last-value queue's
    /// replacement; the caller acks it.
    pub(crate) fn withdraw(&mut self, place: Place, gauge: &MemoryGauge) -> Option<Withdrawn> {
        if let Some(entry) = self.memory.remove(place) {
            return Some(Withdrawn::of_counted(entry));
        }
        let owner = self
            .reserved()
            .find_map(|(owner, list)| list.contains_key(&place.seq).then_some(*owner));
        if let Some(owner) = owner {
            let entry = self.take_reserved(owner, |list| list.remove(&place.seq))?;
            return Some(Withdrawn::of_counted(entry));
        }
        let i = self.paged_index(place.seq)?;
        let paged = self.paging.as_mut()?.paged.remove(i)?;
        gauge.paged.fetch_sub(1, Ordering::Relaxed);
        Some(Withdrawn {
            seq: paged.seq,
            journaled: paged.journaled,
            counted: None,
        })
    }

    /// Whether the message at `place` waits here (see [`Self::withdraw`]).
    pub(crate) fn holds(&self, place: Place) -> bool {
        self.memory.get(place).is_some()
            || self.reserved().any(|(_, r)| r.contains_key(&place.seq))
            || self.paged_index(place.seq).is_some()
    }

    /// Where `seq` is among the paged messages. They are in sequence order
    /// but for the rare enqueue that overtook a newer one, so a binary
    /// search finds it almost always, and a scan the rest. A message in
    /// flight left from memory, which holds the older messages, so the
    /// common miss is below the first paged seq and costs no scan.
    fn paged_index(&self, seq: MessageSeq) -> Option<usize> {
        let paged = self.paged();
        let first = paged.front()?.seq;
        let last = paged.back()?.seq;
        if seq < first.min(last) || seq > first.max(last) {
            return None;
        }
        let at = paged.partition_point(|p| p.seq < seq);
        if paged.get(at).is_some_and(|p| p.seq == seq) {
            return Some(at);
        }
        paged.iter().position(|p| p.seq == seq)
    }

    /// Reads the next batch of paged messages back while the broker is
    /// under its memory budget (for consumers whose messages may all be on
    /// disk behind messages they cannot take). False when nothing was read.
    pub(crate) fn page_in_within_budget(&mut self, gauge: &MemoryGauge, queue: QueueId) -> bool {
        if self.paged().is_empty() || gauge.used() >= gauge.budget {
            return false;
        }
        let before = self.paged().len();
        // At most what the budget has room for (at least one message), so
        // reading back for these consumers overshoots it by one message at
        // most.
        let room = gauge.budget.saturating_sub(gauge.used());
        self.page_in_at_most(gauge, queue, room.min(DEPAGE_BATCH_BYTES));
        self.paged().len() < before
    }

    /// Whether messages wait on disk.
    pub(crate) fn has_paged(&self) -> bool {
        !self.paged().is_empty()
    }

    /// Messages reserved for their groups' consumers.
    pub(crate) fn reserved_len(&self) -> usize {
        self.aside.as_ref().map_or(0, |a| a.reserved_len)
    }

    /// Whether messages are reserved for `consumer`.
    pub(crate) fn has_reserved(&self, consumer: ConsumerKey) -> bool {
        self.aside
            .as_ref()
            .is_some_and(|a| a.reserved.contains_key(&consumer))
    }

    /// Takes what `take` takes from the messages kept for `owner`, and
    /// tidies up after it.
    fn take_reserved(
        &mut self,
        owner: ConsumerKey,
        take: impl FnOnce(&mut BTreeMap<MessageSeq, Entry>) -> Option<Entry>,
    ) -> Option<Entry> {
        let aside = self.aside.as_mut()?;
        let list = aside.reserved.get_mut(&owner)?;
        let entry = take(list);
        if list.is_empty() {
            aside.reserved.remove(&owner);
        }
        aside.reserved_len -= usize::from(entry.is_some());
        self.prune_aside();
        entry
    }

    /// The shared messages in memory, in no particular order.
    pub(crate) fn iter_memory(&self) -> impl Iterator<Item = &Entry> {
        self.memory.iter()
    }

    /// Keeps `entry` for `consumer` alone (its message group's consumer).
    pub(crate) fn reserve(&mut self, consumer: ConsumerKey, entry: Entry) {
        let aside = self.aside_mut();
        aside
            .reserved
            .entry(consumer)
            .or_default()
            .insert(entry.seq, entry);
        aside.reserved_len += 1;
    }

    /// The first message kept for `consumer`.
    pub(crate) fn first_reserved(&self, consumer: ConsumerKey) -> Option<&Entry> {
        self.aside
            .as_ref()?
            .reserved
            .get(&consumer)
            .and_then(|r| r.first_key_value())
            .map(|(_, e)| e)
    }

    /// Takes the first message kept for `consumer`.
    pub(crate) fn pop_reserved(&mut self, consumer: ConsumerKey) -> Option<Entry> {
        self.take_reserved(consumer, |list| list.pop_first().map(|(_, e)| e))
    }

    /// Takes the first message kept for `consumer` that `may_go` allows
    /// (messages of a group with a leased delivery in flight wait, see
    /// `lease`). Looks at the consumer's kept messages in order, at most
    /// all of them.
    pub(crate) fn pop_reserved_where(
        &mut self,
        consumer: ConsumerKey,
        may_go: impl Fn(&Entry) -> bool,
    ) -> Option<Entry> {
        self.take_reserved(consumer, |list| {
            let seq = list.values().find(|e| may_go(e)).map(|e| e.seq)?;
            list.remove(&seq)
        })
    }

    /// The consumer went: what was kept for it returns to the queue, to its
    /// place in queue order.
    pub(crate) fn unreserve(&mut self, consumer: ConsumerKey) {
        let Some(aside) = self.aside.as_mut() else {
            return;
        };
        let Some(list) = aside.reserved.remove(&consumer) else {
            return;
        };
        aside.reserved_len -= list.len();
        for entry in list.into_values() {
            self.insert_in_memory(entry);
        }
        self.prune_aside();
    }

    /// The waiting message (in memory, reserved or not) with the lowest
    /// sequence at or after `seq`: a browser's next message, in arrival
    /// order. Paged messages are not looked at (see the module docs).
    pub(crate) fn first_from(&self, seq: MessageSeq) -> Option<&Entry> {
        let shared = self.memory.first_from(seq);
        let reserved = self
            .reserved()
            .filter_map(|(_, r)| r.range(seq..).next().map(|(_, e)| e));
        shared.into_iter().chain(reserved).min_by_key(|e| e.seq)
    }

    /// Messages waiting on disk.
    pub(crate) fn paged_len(&self) -> usize {
        self.paged().len()
    }

    /// When the message at the head of the queue was enqueued.
    pub(crate) fn oldest_enqueued_at_ms(&self) -> Option<u64> {
        let waiting = self
            .memory
            .oldest()
            .map(|e| e.enqueued_at_ms)
            .or_else(|| self.paged().front().map(|p| p.enqueued_at_ms));
        let reserved = self
            .reserved()
            .filter_map(|(_, r)| r.first_key_value())
            .map(|(_, e)| e.enqueued_at_ms);
        waiting.into_iter().chain(reserved).min()
    }

    /// A new message: kept in memory, or paged when the queue is already
    /// paging or the broker is over its memory budget.
    pub(crate) fn push(&mut self, entry: Entry, gauge: &MemoryGauge, queue: QueueId) {
        let page_dir = gauge.page_dir.as_deref().filter(|_| {
            let paging = self.paging.as_deref();
            !paging.is_some_and(|p| p.off)
                && (paging.is_some_and(|p| !p.paged.is_empty()) || gauge.over_budget_with(&entry))
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
            self.paging_mut().paged.push_back(paged);
            return;
        }
        if let Some(dir) = page_dir {
            match self.page_out(&entry, gauge, dir, queue) {
                Ok(at) => {
                    gauge.paged.fetch_add(1, Ordering::Relaxed);
                    self.paging_mut().paged.push_back(Paged::of(entry, at));
                    return;
                }
                Err(e) => {
                    tracing::error!(queue, error = %e, "paging failed; this queue keeps its messages in memory");
                    self.paging_mut().off = true;
                }
            }
        }
        gauge.add(&entry);
        self.insert_in_memory(entry);
    }

    /// A message that was in flight comes back (released, or redelivered):
    /// it is in memory and counted already.
    pub(crate) fn put_back(&mut self, entry: Entry) {
        self.insert_in_memory(entry);
    }

    /// The message at the head, read back from disk if the in-memory part
    /// is empty. Counted in the gauge while the caller holds it.
    pub(crate) fn pop_front(&mut self, gauge: &MemoryGauge, queue: QueueId) -> Option<Entry> {
        if self.memory.is_empty() && !self.paged().is_empty() {
            self.page_in(gauge, queue);
        }
        self.memory.pop_first()
    }

    /// Empties the backlog (the queue is deleted); returns the in-memory
    /// entries so their accounting can be undone.
    pub(crate) fn take_all(&mut self, gauge: &MemoryGauge) -> Vec<Entry> {
        self.take_waiting(gauge).0
    }

    /// Empties the backlog and keeps the queue (a purge): the in-memory
    /// entries (for their accounting to be undone and their acks), and
    /// the paged ones, which are not read back, as [`Withdrawn`] without
    /// an entry (their acks).
    pub(crate) fn take_waiting(&mut self, gauge: &MemoryGauge) -> (Vec<Entry>, Vec<Withdrawn>) {
        gauge
            .paged
            .fetch_sub(self.paged().len() as u64, Ordering::Relaxed);
        let mut paged = Vec::new();
        if let Some(paging) = &mut self.paging {
            paged = std::mem::take(&mut paging.paged)
                .into_iter()
                .map(|p| Withdrawn {
                    seq: p.seq,
                    journaled: p.journaled,
                    counted: None,
                })
                .collect();
            paging.file = None;
            // A queue whose paging failed keeps that in mind.
            if !paging.off {
                self.paging = None;
            }
        }
        let mut all = std::mem::take(&mut self.memory).into_entries();
        if let Some(aside) = &mut self.aside {
            for list in std::mem::take(&mut aside.reserved).into_values() {
                all.extend(list.into_values());
            }
            aside.reserved_len = 0;
            // Noted arrivals point at places that are gone now.
            aside.arrived.clear();
        }
        self.prune_aside();
        (all, paged)
    }

    fn page_out(
        &mut self,
        entry: &Entry,
        gauge: &MemoryGauge,
        dir: &std::path::Path,
        queue: QueueId,
    ) -> Result<PageRef, rosetta_store::PageError> {
        let paging = self.paging_mut();
        let file = match &mut paging.file {
            Some(f) => f,
            None => {
                let file = PageFile::create(
                    std::sync::Arc::clone(&gauge.storage),
                    &dir.join(format!("{queue}.page")),
                )?;
                tracing::info!(queue, "queue is over the memory budget: paging to disk");
                paging.file.insert(file)
            }
        };
        let mut body = Vec::with_capacity(entry.message.memory_size());
        encode_message(&entry.message, &mut body);
        file.append(&body)
    }

    /// Reads the next batch of paged messages into memory: a run of
    /// messages from the same place (the page file, or the journal).
    fn page_in(&mut self, gauge: &MemoryGauge, queue: QueueId) {
        self.page_in_at_most(gauge, queue, DEPAGE_BATCH_BYTES);
    }

    /// [`Self::page_in`] of at most `bytes_max` (and at least one message).
    fn page_in_at_most(&mut self, gauge: &MemoryGauge, queue: QueueId, bytes_max: u64) {
        let Some(in_journal) = self.paged().front().map(|p| p.in_journal) else {
            return;
        };
        let mut count = 0;
        let mut bytes = 0;
        for p in self.paged() {
            if count == DEPAGE_BATCH_MESSAGES
                || p.in_journal != in_journal
                || (count > 0 && bytes + u64::from(p.at.len) > bytes_max)
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
        let Self {
            memory,
            paging: Some(paging),
            aside,
        } = self
        else {
            return;
        };
        let mut noted = aside.as_deref_mut().filter(|a| a.noting);
        for (p, message) in paging.paged.drain(..count).zip(messages) {
            let Some(message) = message else {
                continue;
            };
            let entry = p.into_entry(message);
            gauge.add(&entry);
            let place = memory.insert(entry);
            if let Some(aside) = noted.as_mut() {
                aside.arrived.push(place);
            }
        }
        if paging.paged.is_empty() {
            if let Some(file) = &mut paging.file {
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
        let paging = self.paging.as_deref_mut()?;
        let file = paging.file.as_mut()?;
        let refs: Vec<PageRef> = paging.paged.iter().take(count).map(|p| p.at).collect();
        let bodies = match file.read(&refs) {
            Ok(bodies) => bodies,
            Err(e) => {
                tracing::error!(queue, error = %e, "cannot read paged messages back");
                return None;
            }
        };
        Some(
            paging
                .paged
                .iter()
                .zip(bodies)
                .map(|(p, body)| paged::decode(queue, p.seq, body))
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
        let seqs: Vec<MessageSeq> = self.paged().iter().take(count).map(|p| p.seq).collect();
        paged::read_from_journal(gauge.journal()?.as_ref(), queue, &seqs)
    }
}
