//! A unit of work: journal records plus the in-memory changes that must
//! become visible only after those records are handed to the journal.
//!
//! The rule the batch enforces: **append before making visible**. A message
//! is handed to the journal before any consumer can see it, so a consumer's
//! acknowledgement record always lands after the message record it cancels,
//! and replay after a crash can never resurrect an acknowledged message
//! because of a reordering.

use std::cell::Cell;
use std::sync::Arc;

use rosetta_store::{Completion, Record};

use super::dedup::{self, Durability};
use super::queue::{Entry, Queue};
use super::Inner;

thread_local! {
    /// A spare enqueue list per thread, so that routing a publish does not
    /// allocate one each time (issue 20).
    static ENQUEUES: Cell<Vec<(Arc<Queue>, Entry)>> = const { Cell::new(Vec::new()) };
}

/// Longest spare list kept per thread: a burst's long list is freed.
pub(crate) const SPARE_LIST_MAX: usize = 64;

/// Keeps `list` (emptied) as this thread's spare in `slot`, unless it grew
/// past [`SPARE_LIST_MAX`]. A nested use meanwhile (routing from inside a
/// commit) took the slot's spare or allocated its own; whichever returns
/// last stays.
pub(crate) fn recycle<T>(slot: &'static std::thread::LocalKey<Cell<Vec<T>>>, mut list: Vec<T>) {
    list.clear();
    if list.capacity() <= SPARE_LIST_MAX {
        slot.set(list);
    }
}

#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) records: Vec<Record>,
    pub(crate) enqueues: Vec<(Arc<Queue>, Entry)>,
    /// Completes with this batch's append: duplicates of the dedup keys it
    /// admitted wait for it.
    pub(crate) admitted: Option<Arc<Durability>>,
    /// Appends of first copies this batch's duplicates repeat: its
    /// completion waits for them too.
    pub(crate) waits: Vec<Arc<Durability>>,
    /// The core's clock, read once for the whole batch (see
    /// [`Batch::now_ms`]).
    pub(crate) now_ms: Option<u64>,
}

impl Batch {
    /// Appends the records (as one atomic journal unit), then applies the
    /// enqueues. `done` runs once the records are durable; at once when
    /// there are none.
    pub(crate) fn commit(self, inner: &Inner, done: Option<Completion>) {
        let Batch {
            records,
            enqueues,
            admitted,
            waits,
            now_ms,
        } = self;
        let done = dedup::after_all(done, waits);
        let done: Option<Completion> = match admitted {
            Some(admitted) => Some(Box::new(move |result| {
                admitted.finish(result.clone());
                if let Some(done) = done {
                    done(result);
                }
            })),
            None => done,
        };
        if records.is_empty() {
            if let Some(done) = done {
                done(Ok(()));
            }
        } else {
            inner.journal.append(records, done);
        }
        if enqueues.is_empty() {
            return;
        }
        let mut enqueues = enqueues;
        let now_ms = now_ms.unwrap_or_else(|| inner.now_ms());
        for (queue, entry) in enqueues.drain(..) {
            let out = queue.enqueue(entry, now_ms);
            inner.after_dispatch(out);
        }
        recycle(&ENQUEUES, enqueues);
    }

    /// The enqueue list for a route to `n` queues: this thread's spare one
    /// when the batch has none yet (see [`recycle`]).
    pub(crate) fn enqueues_for(&mut self, n: usize) -> &mut Vec<(Arc<Queue>, Entry)> {
        if self.enqueues.capacity() == 0 {
            self.enqueues = ENQUEUES.take();
        }
        self.enqueues.reserve(n);
        &mut self.enqueues
    }

    /// Now, by the core's clock, the same for everything the batch does:
    /// read on first use only. A clock read per message (routing, the
    /// enqueue stamp, expiry checks) was a measurable part of a publish
    /// (issue 20); a batch lives for one call into the core, so one
    /// reading is as good as several.
    pub(crate) fn now_ms(&mut self, inner: &Inner) -> u64 {
        *self.now_ms.get_or_insert_with(|| inner.now_ms())
    }

    /// Whether committing has anything to wait for: records to append, or
    /// first copies of duplicates still being appended.
    pub(crate) fn has_records(&self) -> bool {
        !self.records.is_empty() || !self.waits.is_empty()
    }

    /// The completion of this batch's append, for the dedup keys it admits.
    pub(crate) fn admitting(&mut self) -> Arc<Durability> {
        Arc::clone(self.admitted.get_or_insert_with(Durability::pending))
    }
}
