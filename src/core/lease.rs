//! Delivery leases (visibility timeout), per queue.
//!
//! A delivery to a consumer with a visibility timeout (its own, or its
//! queue's `visibility_timeout_ms`) is leased: if it is neither settled nor
//! renewed by its deadline, the core's timer takes it back while the
//! consumer stays connected, raises its delivery count, and the queue
//! offers it again through its redelivery path (see `Queue::release_due`).
//!
//! [`Leases`] is the queue's ordered index of deadlines, `(deadline_ms,
//! tag)`, so the due leases are found by taking the index's front, never
//! by scanning the in-flight deliveries; the queue arms the core-wide
//! `Timers` with its earliest deadline, as it does for its schedule.
//!
//! It also remembers the tags of recently expired leases (at most
//! [`EXPIRED_LEASES_REMEMBERED_MAX`]), so that a late settlement or renewal
//! gets `BrokerError::LeaseExpired` rather than "unknown delivery". Tags
//! are unique per delivery, so a late settlement past that memory is still
//! never applied to the redelivered copy: it is only reported as unknown.

use std::collections::{BTreeSet, HashSet, VecDeque};

/// Most expired-lease tags a queue remembers for late settlements: a bound
/// on the memory a consumer that never settles can make the queue hold;
/// the oldest is forgotten first.
pub(crate) const EXPIRED_LEASES_REMEMBERED_MAX: usize = 10_000;

/// One queue's lease deadlines and recently expired leases: nothing but a
/// pointer until the queue's first lease (most queues never lease; every
/// queue's empty indexes cost 104 bytes, issue 20). A queue that leased
/// keeps its index, as a map keeps its table.
#[derive(Debug, Default)]
pub(crate) struct Leases(Option<Box<LeaseIndex>>);

#[derive(Debug, Default)]
struct LeaseIndex {
    by_deadline: BTreeSet<(u64, u64)>,
    expired: HashSet<u64>,
    expired_order: VecDeque<u64>,
}

impl LeaseIndex {
    fn remember_expired(&mut self, tag: u64) {
        if self.expired_order.len() >= EXPIRED_LEASES_REMEMBERED_MAX {
            if let Some(oldest) = self.expired_order.pop_front() {
                self.expired.remove(&oldest);
            }
        }
        if self.expired.insert(tag) {
            self.expired_order.push_back(tag);
        }
    }
}

impl Leases {
    /// Delivery `tag` is leased until `deadline_ms`.
    pub(crate) fn start(&mut self, deadline_ms: u64, tag: u64) {
        self.0
            .get_or_insert_default()
            .by_deadline
            .insert((deadline_ms, tag));
    }

    /// Delivery `tag`'s lease ended (settled, returned or renewed).
    pub(crate) fn end(&mut self, deadline_ms: u64, tag: u64) {
        if let Some(index) = &mut self.0 {
            index.by_deadline.remove(&(deadline_ms, tag));
        }
    }

    /// The earliest deadline.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        let index = self.0.as_ref()?;
        index.by_deadline.first().map(|(deadline, _)| *deadline)
    }

    /// The tags whose lease ran out by `now_ms`, earliest first, at most
    /// `max`, taken off the index and remembered as expired.
    pub(crate) fn take_due(&mut self, now_ms: u64, max: usize) -> Vec<u64> {
        let mut due = Vec::new();
        let Some(index) = &mut self.0 else {
            return due;
        };
        while due.len() < max {
            match index.by_deadline.first() {
                Some(&(deadline, tag)) if deadline <= now_ms => {
                    index.by_deadline.pop_first();
                    index.remember_expired(tag);
                    due.push(tag);
                }
                _ => break,
            }
        }
        due
    }

    /// Whether `tag` is a remembered expired lease; it is forgotten then
    /// (a late settlement is answered once).
    pub(crate) fn take_expired(&mut self, tag: u64) -> bool {
        let Some(index) = &mut self.0 else {
            return false;
        };
        // The order queue keeps the tag until it ages out: a stale entry
        // there only makes room sooner.
        index.expired.remove(&tag)
    }

    /// Whether `tag` is a remembered expired lease (kept).
    pub(crate) fn is_expired(&self, tag: u64) -> bool {
        self.0.as_ref().is_some_and(|i| i.expired.contains(&tag))
    }

    /// Leases running.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |i| i.by_deadline.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_leases_come_earliest_first_and_are_remembered() {
        let mut l = Leases::default();
        l.start(30, 3);
        l.start(10, 1);
        l.start(20, 2);
        l.end(20, 2);
        assert_eq!(l.next_deadline(), Some(10));
        assert_eq!(l.take_due(25, 10), vec![1]);
        assert!(l.is_expired(1));
        assert!(l.take_expired(1));
        assert!(!l.take_expired(1));
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn expired_memory_is_bounded() {
        let mut l = Leases::default();
        for tag in 0..(EXPIRED_LEASES_REMEMBERED_MAX as u64 + 5) {
            l.start(1, tag);
        }
        l.take_due(1, usize::MAX);
        assert!(!l.is_expired(0));
        assert!(l.is_expired(EXPIRED_LEASES_REMEMBERED_MAX as u64 + 4));
        let remembered = l.0.as_ref().map_or(0, |i| i.expired.len());
        assert!(remembered <= EXPIRED_LEASES_REMEMBERED_MAX);
    }
}
