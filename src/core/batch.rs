//! A unit of work: journal records plus the in-memory changes that must
//! become visible only after those records are handed to the journal.
//!
//! The rule the batch enforces: **append before making visible**. A message
//! is handed to the journal before any consumer can see it, so a consumer's
//! acknowledgement record always lands after the message record it cancels,
//! and replay after a crash can never resurrect an acknowledged message
//! because of a reordering.

use std::sync::Arc;

use rosetta_store::{Completion, Record};

use super::queue::{Entry, Queue};
use super::Inner;

#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) records: Vec<Record>,
    pub(crate) enqueues: Vec<(Arc<Queue>, Entry)>,
}

impl Batch {
    /// Appends the records (as one atomic journal unit), then applies the
    /// enqueues. `done` runs once the records are durable; at once when
    /// there are none.
    pub(crate) fn commit(self, inner: &Inner, done: Option<Completion>) {
        let Batch { records, enqueues } = self;
        if records.is_empty() {
            if let Some(done) = done {
                done(Ok(()));
            }
        } else {
            inner.journal.append(records, done);
        }
        let now_ms = inner.now_ms();
        for (queue, entry) in enqueues {
            let out = queue.enqueue(entry, now_ms);
            inner.after_dispatch(out);
        }
    }

    pub(crate) fn has_records(&self) -> bool {
        !self.records.is_empty()
    }
}
