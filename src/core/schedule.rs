//! Messages waiting for a time, per queue, and the core-wide wakeup that
//! moves them into the backlog when their time comes.
//!
//! ## Per queue: [`Schedule`]
//! An ordered index of entries by `(due_ms, seq)`: a message scheduled for
//! later ([`rosetta_neutral::Message::delivery_time`]) and a delivery that
//! comes back after a redelivery delay wait here, not in the backlog, so
//! they are neither ready nor counted in `depth` (they are counted in
//! `QueueStats::scheduled`), and the messages behind them in the backlog
//! go on being delivered. An entry's due time is the earlier of when it
//! may be delivered and when it expires: a message whose expiry comes
//! before its delivery time leaves the index at its expiry and goes to the
//! expiry address, never to a consumer. Inserting and taking the earliest
//! are O(log n).
//!
//! Under the memory budget an entry holds its message in memory, counted
//! in the memory gauge like the backlog's in-memory part. Past the budget
//! the message goes to the schedule's page files (`pages`) and only a
//! small reference stays in the index (the backlog's [`Paged`], about 56
//! bytes, plus the index's own): a million scheduled messages cost a
//! million references, not their bodies (`benches/scheduled.rs` measures
//! it). Messages restored past the budget at a restart are paged by
//! reference into the journal, as the backlog's are. A due message on
//! disk is read back when the queue's in-memory part has room for it (it
//! is under the budget, or it holds nothing ready in memory), one bounded
//! batch at a time; until then it waits on disk and the queue looks again
//! [`SCHEDULE_HELD_RETRY_MS`] later, so a queue that nobody consumes never
//! reads its whole schedule back into memory when it falls due.
//!
//! ## Core-wide: [`Timers`]
//! One min-heap of `(due_ms, queue)` for the whole core. A queue arms it
//! only when its earliest due time moves earlier than what it armed (so a
//! million messages scheduled in time order arm it once per queue, not
//! once per message): the heap's lock is a leaf lock, taken from under a
//! queue lock only then, and never on the publish path of messages that
//! are not scheduled. The housekeeping thread sleeps until the heap's
//! earliest due time (or its regular interval), pops what is due, and each
//! such queue moves its due entries to the backlog and dispatches. No
//! queue is scanned that has nothing due. A stale heap entry (a queue
//! re-armed earlier, or deleted) costs one look at that queue.
//!
//! Later a delivery lease (visibility timeout) can use the same two
//! pieces: a deadline per in-flight entry in its queue, and the queue
//! arming the core-wide heap with its earliest deadline.

mod pages;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Weak;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, MutexGuard};
use rosetta_store::{MessageSeq, PageRef, QueueId};

use super::backlog::{paged, MemoryGauge, Paged};
use super::queue::{Entry, Queue};
use pages::{Generation, SchedulePages};

/// Most entries a queue moves from its schedule to its backlog under one
/// hold of its lock: a million messages due at the same millisecond must
/// not stall that queue's publishers and consumers for the whole move. The
/// queue re-arms at once for the rest.
pub(crate) const SCHEDULE_RELEASE_BATCH_MAX: usize = 4096;

/// Most bytes of paged scheduled messages read back under one hold of the
/// queue's lock (at least one message): as the backlog's depaging batch.
const SCHEDULE_READ_BACK_BYTES_MAX: u64 = 1024 * 1024;

/// How long a due message on disk waits before its queue looks again
/// whether it has room for it in memory (see the module docs).
pub(crate) const SCHEDULE_HELD_RETRY_MS: u64 = 100;

/// How long a due message whose page file could not be read waits before
/// it is tried again (a failing disk must not spin the timer thread).
const SCHEDULE_READ_RETRY_MS: u64 = 1_000;

/// Most heap entries one timer pass pops before it looks at the clock
/// again: a bound on one pass, however many queues are due.
const TIMER_PASS_QUEUES_MAX: usize = 4096;

/// The index key of an entry: when it is due, then its sequence.
type DueKey = (u64, MessageSeq);

/// Where a paged scheduled message is.
#[derive(Debug)]
enum OnDisk {
    /// In one of the schedule's page files.
    PageFile(Generation, Paged),
    /// In the journal, by its seq (paged by reference at a restart).
    Journal(Paged),
}

impl OnDisk {
    fn paged(&self) -> &Paged {
        match self {
            OnDisk::PageFile(_, p) | OnDisk::Journal(p) => p,
        }
    }
}

/// What [`Schedule::take_due`] moved out.
#[derive(Debug, Default)]
pub(crate) struct Due {
    /// Due entries with their due times, earliest first, counted in the
    /// gauge.
    pub(crate) entries: Vec<(u64, Entry)>,
    /// Due entries were left on disk (no room in memory, or a read
    /// failed): look again at this time.
    pub(crate) retry_at_ms: Option<u64>,
    /// Due entries read back from disk that did not decode (logged):
    /// dropped from memory, the journal keeps them until restart.
    pub(crate) dropped: Vec<MessageSeq>,
}

/// One queue's entries waiting for a time: a pointer until the first
/// (most queues never schedule; the empty index cost every queue 88 bytes,
/// issue 20). A queue that scheduled keeps its index, as a map keeps its
/// table, so a busy one does not allocate it again and again.
#[derive(Debug, Default)]
pub(crate) struct Schedule(Option<Box<ScheduleIndex>>);

impl Schedule {
    /// Entries waiting.
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.len())
    }

    /// Entries waiting on disk.
    pub(crate) fn paged_len(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.paged_len())
    }

    /// When the earliest entry is due.
    pub(crate) fn next_due(&self) -> Option<u64> {
        self.0.as_ref()?.next_due()
    }

    /// See [`ScheduleIndex::insert`].
    pub(crate) fn insert(
        &mut self,
        due_ms: u64,
        entry: Entry,
        gauge: &MemoryGauge,
        queue: QueueId,
    ) -> u64 {
        self.0
            .get_or_insert_default()
            .insert(due_ms, entry, gauge, queue)
    }

    /// See [`ScheduleIndex::take_due`].
    pub(crate) fn take_due(
        &mut self,
        now_ms: u64,
        max: usize,
        room: bool,
        gauge: &MemoryGauge,
        queue: QueueId,
    ) -> Due {
        match &mut self.0 {
            Some(index) => index.take_due(now_ms, max, room, gauge, queue),
            None => Due::default(),
        }
    }

    /// See [`ScheduleIndex::take_all`].
    pub(crate) fn take_all(
        &mut self,
        gauge: &MemoryGauge,
    ) -> (Vec<Entry>, Vec<(MessageSeq, bool)>) {
        match self.0.take() {
            Some(mut index) => index.take_all(gauge),
            None => (Vec::new(), Vec::new()),
        }
    }
}

/// The entries of a [`Schedule`] that has some.
#[derive(Debug, Default)]
struct ScheduleIndex {
    /// In memory, counted in the gauge.
    in_memory: BTreeMap<DueKey, Entry>,
    /// Past the memory budget: only a reference each.
    on_disk: BTreeMap<DueKey, OnDisk>,
    pages: SchedulePages,
}

impl ScheduleIndex {
    /// Entries waiting.
    pub(crate) fn len(&self) -> usize {
        self.in_memory.len() + self.on_disk.len()
    }

    /// Entries waiting on disk.
    pub(crate) fn paged_len(&self) -> usize {
        self.on_disk.len()
    }

    /// When the earliest entry is due.
    pub(crate) fn next_due(&self) -> Option<u64> {
        let first = |k: Option<&DueKey>| k.map(|(due, _)| *due);
        let memory = first(self.in_memory.keys().next());
        let disk = first(self.on_disk.keys().next());
        memory.into_iter().chain(disk).min()
    }

    /// Keeps `entry` (counted in the gauge) until `due_ms`, or its expiry
    /// if that comes first: in memory, or on disk when the broker is over
    /// its memory budget (then it is uncounted). Returns the due time it
    /// is kept under.
    pub(crate) fn insert(
        &mut self,
        due_ms: u64,
        entry: Entry,
        gauge: &MemoryGauge,
        queue: QueueId,
    ) -> u64 {
        let due = entry.message.expiry.map_or(due_ms, |e| e.min(due_ms));
        let key = (due, entry.seq);
        let Some(dir) = gauge.page_dir().filter(|_| gauge.over_budget()) else {
            self.in_memory.insert(key, entry);
            return due;
        };
        let size = u32::try_from(entry.message.memory_size()).unwrap_or(u32::MAX);
        if gauge.pages_into_journal(&entry) {
            gauge.sub(&entry);
            gauge.add_paged(1);
            let mut paged = Paged::of(
                entry,
                PageRef {
                    offset: 0,
                    len: size,
                },
            );
            paged.in_journal = true;
            self.on_disk.insert(key, OnDisk::Journal(paged));
            return due;
        }
        if !self.pages.off {
            match self.pages.append(&entry, gauge.storage(), dir, queue) {
                Ok((generation, at)) => {
                    gauge.sub(&entry);
                    gauge.add_paged(1);
                    let paged = Paged::of(entry, at);
                    self.on_disk
                        .insert(key, OnDisk::PageFile(generation, paged));
                    return due;
                }
                Err(e) => {
                    tracing::error!(queue, error = %e, "paging scheduled messages failed; this queue keeps them in memory");
                    self.pages.off = true;
                }
            }
        }
        self.in_memory.insert(key, entry);
        due
    }

    /// The entries due at `now_ms`, earliest first, at most `max`, counted
    /// in the gauge. Those on disk are read back only while `room` (the
    /// queue has room for them in memory), at most
    /// [`SCHEDULE_READ_BACK_BYTES_MAX`] (and at least one) per call.
    pub(crate) fn take_due(
        &mut self,
        now_ms: u64,
        max: usize,
        room: bool,
        gauge: &MemoryGauge,
        queue: QueueId,
    ) -> Due {
        let is_due = |k: Option<&DueKey>| k.is_some_and(|(due, _)| *due <= now_ms);
        let mut taken: Vec<(DueKey, Taken)> = Vec::new();
        let mut disk_bytes = 0u64;
        let mut held = false;
        while taken.len() < max {
            let memory_due = is_due(self.in_memory.keys().next());
            let disk_due = is_due(self.on_disk.keys().next());
            let from_disk = match (memory_due, disk_due) {
                (false, false) => break,
                (true, false) => false,
                (false, true) => true,
                (true, true) => self.on_disk.keys().next() < self.in_memory.keys().next(),
            };
            if !from_disk {
                if let Some((key, entry)) = self.in_memory.pop_first() {
                    taken.push((key, Taken::Entry(entry)));
                }
                continue;
            }
            let next_len = self
                .on_disk
                .first_key_value()
                .map_or(0, |(_, d)| u64::from(d.paged().at.len));
            let batch_full = disk_bytes > 0 && disk_bytes + next_len > SCHEDULE_READ_BACK_BYTES_MAX;
            if !room || batch_full {
                // No room: look again later. A full batch: the queue
                // re-arms at once for the rest (they are due now).
                held |= !room;
                // What is on disk waits; what is in memory may still go.
                if !is_due(self.in_memory.keys().next()) {
                    break;
                }
                if let Some((key, entry)) = self.in_memory.pop_first() {
                    taken.push((key, Taken::Entry(entry)));
                }
                continue;
            }
            if let Some((key, on_disk)) = self.on_disk.pop_first() {
                disk_bytes += next_len;
                taken.push((key, Taken::OnDisk(on_disk)));
            }
        }
        let mut due = Due::default();
        let bodies = self.read_back(&taken, queue, gauge);
        let mut read_failed = false;
        for ((key, taken), body) in taken.into_iter().zip(bodies) {
            match (taken, body) {
                (Taken::Entry(entry), _) => due.entries.push((key.0, entry)),
                (Taken::OnDisk(on_disk), ReadBack::Failed) => {
                    // Kept on disk, and tried again later.
                    read_failed = true;
                    let retry = now_ms.saturating_add(SCHEDULE_READ_RETRY_MS);
                    self.on_disk.insert((retry, key.1), on_disk);
                }
                (Taken::OnDisk(on_disk), read) => {
                    gauge.sub_paged(1);
                    if let OnDisk::PageFile(generation, _) = &on_disk {
                        self.pages.forget(*generation, queue);
                    }
                    let paged = match on_disk {
                        OnDisk::PageFile(_, p) | OnDisk::Journal(p) => p,
                    };
                    let ReadBack::Message(message) = read else {
                        // Does not decode: logged, the journal keeps it.
                        due.dropped.push(key.1);
                        continue;
                    };
                    let entry = paged.into_entry(message);
                    gauge.add(&entry);
                    due.entries.push((key.0, entry));
                }
            }
        }
        due.retry_at_ms = match (held, read_failed) {
            (true, _) => Some(now_ms.saturating_add(SCHEDULE_HELD_RETRY_MS)),
            (false, true) => Some(now_ms.saturating_add(SCHEDULE_READ_RETRY_MS)),
            (false, false) => None,
        };
        due
    }

    /// The messages of the `taken` entries that are on disk, read back
    /// with one read per run of consecutive records of one page file and
    /// one journal read; `ReadBack::InMemory` for the others.
    fn read_back(
        &mut self,
        taken: &[(DueKey, Taken)],
        queue: QueueId,
        gauge: &MemoryGauge,
    ) -> Vec<ReadBack> {
        let mut out: Vec<ReadBack> = taken.iter().map(|_| ReadBack::InMemory).collect();
        let mut in_files: Vec<(Generation, PageRef, usize)> = Vec::new();
        let mut in_journal: Vec<(MessageSeq, usize)> = Vec::new();
        for (i, (_, t)) in taken.iter().enumerate() {
            match t {
                Taken::OnDisk(OnDisk::PageFile(g, p)) => in_files.push((*g, p.at, i)),
                Taken::OnDisk(OnDisk::Journal(p)) => in_journal.push((p.seq, i)),
                Taken::Entry(_) => {}
            }
        }
        in_files.sort_by_key(|(g, at, _)| (*g, at.offset));
        for run in in_files.chunk_by(|a, b| a.0 == b.0 && a.1.end() == b.1.offset) {
            let refs: Vec<PageRef> = run.iter().map(|(_, at, _)| *at).collect();
            let generation = run.first().map_or(0, |(g, _, _)| *g);
            match self.pages.read(generation, &refs) {
                Ok(bodies) => {
                    for ((_, _, i), body) in run.iter().zip(bodies) {
                        out[*i] = decoded(queue, taken[*i].0 .1, body);
                    }
                }
                Err(e) => {
                    tracing::error!(queue, error = %e, "cannot read scheduled messages back; trying again later");
                    for (_, _, i) in run {
                        out[*i] = ReadBack::Failed;
                    }
                }
            }
        }
        if !in_journal.is_empty() {
            let seqs: Vec<MessageSeq> = in_journal.iter().map(|(seq, _)| *seq).collect();
            let read = gauge
                .journal()
                .and_then(|j| paged::read_from_journal(j.as_ref(), queue, &seqs));
            match read {
                Some(messages) => {
                    for ((_, i), message) in in_journal.iter().zip(messages) {
                        out[*i] = message.map_or(ReadBack::Undecodable, ReadBack::Message);
                    }
                }
                None => {
                    for (_, i) in &in_journal {
                        out[*i] = ReadBack::Failed;
                    }
                }
            }
        }
        out
    }

    /// Empties the schedule (the queue is deleted or purged): returns the
    /// entries in memory, for the caller to uncount (and acknowledge), and
    /// the seq of each one on disk with whether it is journaled here (to
    /// acknowledge); their page files are deleted.
    pub(crate) fn take_all(
        &mut self,
        gauge: &MemoryGauge,
    ) -> (Vec<Entry>, Vec<(MessageSeq, bool)>) {
        gauge.sub_paged(self.on_disk.len() as u64);
        let on_disk = std::mem::take(&mut self.on_disk)
            .into_values()
            .map(|d| (d.paged().seq, d.paged().journaled))
            .collect();
        self.pages.clear();
        let in_memory = std::mem::take(&mut self.in_memory).into_values().collect();
        (in_memory, on_disk)
    }
}

/// An entry [`ScheduleIndex::take_due`] took out of the index.
#[derive(Debug)]
enum Taken {
    Entry(Entry),
    OnDisk(OnDisk),
}

/// What reading a taken entry back gave.
enum ReadBack {
    /// It was in memory: nothing to read.
    InMemory,
    Message(std::sync::Arc<rosetta_neutral::Message>),
    /// Read, but it does not decode (logged): dropped from memory.
    Undecodable,
    /// The read failed: it stays on disk and is tried again.
    Failed,
}

fn decoded(queue: QueueId, seq: MessageSeq, body: Bytes) -> ReadBack {
    paged::decode(queue, seq, body).map_or(ReadBack::Undecodable, ReadBack::Message)
}

/// A queue that armed the core-wide timer.
struct Armed {
    due_ms: u64,
    queue: Weak<Queue>,
}

impl PartialEq for Armed {
    fn eq(&self, other: &Self) -> bool {
        self.due_ms == other.due_ms
    }
}
impl Eq for Armed {}
impl PartialOrd for Armed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Armed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.due_ms.cmp(&other.due_ms)
    }
}

/// The core-wide heap of queues' earliest due times, and the wakeup of the
/// housekeeping thread that serves it.
#[derive(Default)]
pub(crate) struct Timers {
    heap: Mutex<BinaryHeap<Reverse<Armed>>>,
    wake: Condvar,
}

impl Timers {
    /// `queue` has something due at `due_ms`. Wakes the housekeeping thread
    /// when that is earlier than anything armed before.
    pub(crate) fn arm(&self, due_ms: u64, queue: Weak<Queue>) {
        let mut heap = self.heap.lock();
        let earliest = heap.peek().is_none_or(|Reverse(a)| due_ms < a.due_ms);
        heap.push(Reverse(Armed { due_ms, queue }));
        drop(heap);
        if earliest {
            self.wake.notify_all();
        }
    }

    /// The queues due at `now_ms` (at most [`TIMER_PASS_QUEUES_MAX`]),
    /// taken off the heap.
    pub(crate) fn take_due(&self, now_ms: u64) -> Vec<Weak<Queue>> {
        let mut heap = self.heap.lock();
        let mut due = Vec::new();
        while due.len() < TIMER_PASS_QUEUES_MAX {
            match heap.peek() {
                Some(Reverse(a)) if a.due_ms <= now_ms => {}
                _ => break,
            }
            if let Some(Reverse(a)) = heap.pop() {
                due.push(a.queue);
            }
        }
        due
    }

    /// Waits until `now_ms` reaches the earliest armed time, at most
    /// `longest`, or until woken ([`Self::arm`] of something earlier,
    /// [`Self::wake_all`]).
    pub(crate) fn wait(&self, now_ms: u64, longest: Duration) {
        let mut heap: MutexGuard<'_, _> = self.heap.lock();
        let until_due = heap
            .peek()
            .map(|Reverse(a)| Duration::from_millis(a.due_ms.saturating_sub(now_ms)));
        let timeout = until_due.map_or(longest, |d| d.min(longest));
        if timeout.is_zero() {
            return;
        }
        self.wake.wait_for(&mut heap, timeout);
    }

    /// Wakes the housekeeping thread (shutdown).
    pub(crate) fn wake_all(&self) {
        self.wake.notify_all();
    }

    /// Queues armed, stale entries included (tests).
    #[cfg(test)]
    pub(crate) fn armed(&self) -> usize {
        self.heap.lock().len()
    }
}
