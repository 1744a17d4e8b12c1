//! Last-value queues: of the waiting messages that carry the same value of
//! the queue's `last_value_key` property, only the newest is kept.
//!
//! The key is a property name, looked up in `Message.properties`: an AMQP
//! application property, a STOMP header, an MQTT 5 user property. Values
//! compare as text ([`Value::to_text`]), so an AMQP `int` 5 and a STOMP
//! header `5` are the same value. A message without the property is queued
//! as on any queue.
//!
//! ## What is replaced
//! Only a *waiting* message: in memory, reserved for its group's consumer,
//! or paged (the paged reference is dropped; nothing is read back). A
//! message in flight is not recalled: the new one waits beside it and is
//! delivered after it. "Newest" is by sequence (publish order), not by
//! arrival at the queue: when two publishes of one value race, the older
//! one, should it arrive second, is the one dropped.
//!
//! A replaced message is acknowledged in the journal, in the dispatch
//! records of the enqueue that replaced it (the append right after the new
//! message's own), and counted in `QueueStats::replaced_total`. A crash
//! between the two appends leaves both in the journal; the restore applies
//! the same rule as it rebuilds the queue, so a restart still delivers only
//! the newest per value, and acknowledges the others then.
//!
//! ## Order
//! The replacement waits at the tail, in its own sequence place, not in
//! the replaced message's place as Artemis's holder does: a waiting
//! message's place is its journal sequence, which is also its delivery tag
//! and its key in the journal, so keeping the old place would need a queue
//! order apart from the sequence. The cost: a value updated faster than
//! the queue drains keeps moving to the back, behind values updated less
//! often (see docs/semantics.md).
//!
//! ## Bound
//! One index entry (the value's text and a place) per distinct value that
//! has a waiting message, so at most the queue's depth
//! (`queue_depth_max`). Entries whose message left (delivered, expired)
//! are found stale when their value comes again, and swept once they
//! outnumber the waiting messages (amortized O(1) per message).

use std::collections::HashMap;

use rosetta_neutral::Value;

use super::backlog::{Backlog, MemoryGauge, Place, Withdrawn};
use super::queue::Entry;

/// Stale entries tolerated beyond the waiting messages before a sweep: a
/// sweep looks at every entry, so it runs at most once per this many
/// arrivals.
const STALE_ENTRIES_SWEEP_MIN: usize = 1024;

/// What becomes of a message arriving in a last-value queue.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// Queue it; it replaced this waiting message, if any (to be acked).
    Queue(Option<Withdrawn>),
    /// A newer message of its value waits already: drop it (to be acked).
    Superseded,
}

/// A last-value queue's index: the place of the waiting message of each
/// value.
#[derive(Debug)]
pub(crate) struct LastValues {
    key: String,
    waiting: HashMap<String, Place>,
}

impl LastValues {
    pub(crate) fn new(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            waiting: HashMap::new(),
        }
    }

    /// Decides what `entry`, arriving now, does to the waiting messages of
    /// its value, and takes the replaced one out of `backlog`. The caller
    /// then pushes `entry` (for [`Arrival::Queue`]).
    pub(crate) fn arrive(
        &mut self,
        entry: &Entry,
        backlog: &mut Backlog,
        gauge: &MemoryGauge,
    ) -> Arrival {
        let Some(value) = entry.message.properties.get(&self.key).map(Value::to_text) else {
            return Arrival::Queue(None);
        };
        let place = Place::of(entry);
        let replaced = match self.waiting.get(&value) {
            Some(&newer) if newer.seq > entry.seq && backlog.holds(newer) => {
                return Arrival::Superseded;
            }
            Some(&older) => backlog.withdraw(older, gauge),
            None => None,
        };
        self.waiting.insert(value, place);
        if self.waiting.len() > backlog.len() + 1 + STALE_ENTRIES_SWEEP_MIN {
            // `+ 1`: the arriving message is not in the backlog yet.
            self.waiting.retain(|_, p| *p == place || backlog.holds(*p));
        }
        Arrival::Queue(replaced)
    }

    /// Values with an index entry (stale ones included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
#[path = "last_value_tests.rs"]
mod tests;
