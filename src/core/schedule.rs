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
//! An entry here holds its message in memory, counted in the memory gauge
//! like the backlog's in-memory part. Scheduled messages are **not paged**
//! past the memory budget: a million scheduled messages cost their bodies
//! plus the message structure and the index entry, about 680 bytes each
//! besides the body (`benches/scheduled.rs` measures it). Paging them like the backlog's would need a page file
//! read by seq out of order; that is left for later, and producers are
//! held back by the budget as for any queued message meanwhile.
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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Weak;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};
use rosetta_store::MessageSeq;

use super::queue::{Entry, Queue};

/// Most entries a queue moves from its schedule to its backlog under one
/// hold of its lock: a million messages due at the same millisecond must
/// not stall that queue's publishers and consumers for the whole move. The
/// queue re-arms at once for the rest.
pub(crate) const SCHEDULE_RELEASE_BATCH_MAX: usize = 4096;

/// Most heap entries one timer pass pops before it looks at the clock
/// again: a bound on one pass, however many queues are due.
const TIMER_PASS_QUEUES_MAX: usize = 4096;

/// One queue's entries waiting for a time.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    by_due: BTreeMap<(u64, MessageSeq), Entry>,
}

impl Schedule {
    /// Entries waiting.
    pub(crate) fn len(&self) -> usize {
        self.by_due.len()
    }

    /// When the earliest entry is due.
    pub(crate) fn next_due(&self) -> Option<u64> {
        self.by_due.keys().next().map(|(due, _)| *due)
    }

    /// Keeps `entry` until `due_ms` (or its expiry, if that comes first).
    /// Returns the due time it is kept under.
    pub(crate) fn insert(&mut self, due_ms: u64, entry: Entry) -> u64 {
        let due = entry.message.expiry.map_or(due_ms, |e| e.min(due_ms));
        self.by_due.insert((due, entry.seq), entry);
        due
    }

    /// The entries due at `now_ms` with their due times, earliest first,
    /// at most `max`.
    pub(crate) fn take_due(&mut self, now_ms: u64, max: usize) -> Vec<(u64, Entry)> {
        let mut due = Vec::new();
        while due.len() < max {
            let Some(entry) = self.by_due.first_entry() else {
                break;
            };
            let due_ms = entry.key().0;
            if due_ms > now_ms {
                break;
            }
            due.push((due_ms, entry.remove()));
        }
        due
    }

    /// Empties the schedule (the queue is deleted).
    pub(crate) fn take_all(&mut self) -> Vec<Entry> {
        std::mem::take(&mut self.by_due).into_values().collect()
    }
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
