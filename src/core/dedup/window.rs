//! One queue's duplicate-detection window, sans IO: the caller passes the
//! time (`now_ms`, milliseconds since the Unix epoch) to every call.
//!
//! The window maps a [`DedupKey`] (a fixed-size hash of the dedup id, never
//! the id itself) to the time it was admitted, and keeps the same keys in
//! admission order in a queue, so expiry pops from the front until the
//! first key still inside the window: O(1) amortised per key, no scan.
//! A key admitted again after it expired (but before a sweep popped it)
//! leaves a stale entry in the order queue; the sweep skips entries whose
//! time no longer matches the map.
//!
//! At most `ids_max` keys are kept. Admitting one more forgets the oldest
//! at once, before its window has passed (counted in `evicted_total`): a
//! send of that old id is then admitted again. This bounds memory however
//! fast producers send new ids.
//!
//! Times are kept non-decreasing: a wall clock stepping back admits at the
//! latest time seen, so the order queue stays sorted.
//!
//! Each key carries a `T` from its first send, handed to every duplicate
//! of it (the core keeps there what a duplicate must wait for).

use std::collections::{HashMap, VecDeque};

/// Bytes of a dedup key: 128 bits of SHA-256, so accidental collisions
/// among even billions of ids are out of reach (about 2^-64 at 2^32 ids)
/// while a key costs 16 bytes.
pub(crate) const DEDUP_KEY_BYTES: usize = 16;

/// A hash of one dedup id (or of a body, in content mode).
pub(crate) type DedupKey = [u8; DEDUP_KEY_BYTES];

/// What the window says about a send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admission<T> {
    /// Not seen within the window: admitted now. `evicted` is the oldest
    /// key forgotten to make room (past `ids_max`), when it was journaled.
    New {
        /// The time the key was admitted at (non-decreasing).
        admitted_ms: u64,
        /// The key forgotten early, when the window was full.
        evicted: Option<DedupKey>,
    },
    /// Seen within the window.
    Duplicate {
        /// When the first send was admitted.
        admitted_ms: u64,
        /// What the first send left for its duplicates.
        first: T,
    },
}

#[derive(Debug, Clone)]
struct Seen<T> {
    admitted_ms: u64,
    journaled: bool,
    first: T,
}

/// The window of one queue.
#[derive(Debug)]
pub(crate) struct DedupWindow<T = ()> {
    window_ms: u64,
    ids_max: usize,
    seen: HashMap<DedupKey, Seen<T>>,
    /// Keys in admission order, with the time they were admitted at.
    order: VecDeque<(DedupKey, u64)>,
    latest_ms: u64,
    duplicates_total: u64,
    evicted_total: u64,
}

impl<T: Clone + Default> DedupWindow<T> {
    /// A window of `window_ms` keeping at most `ids_max` keys (at least one).
    pub(crate) fn new(window_ms: u64, ids_max: usize) -> Self {
        Self {
            window_ms,
            ids_max: ids_max.max(1),
            seen: HashMap::new(),
            order: VecDeque::new(),
            latest_ms: 0,
            duplicates_total: 0,
            evicted_total: 0,
        }
    }

    fn clamp(&mut self, now_ms: u64) -> u64 {
        self.latest_ms = self.latest_ms.max(now_ms);
        self.latest_ms
    }

    fn live(&self, admitted_ms: u64, now_ms: u64) -> bool {
        admitted_ms.saturating_add(self.window_ms) > now_ms
    }

    /// The first send of `key` within the window, without admitting it.
    pub(crate) fn peek(&self, key: &DedupKey, now_ms: u64) -> Option<Admission<T>> {
        let now_ms = self.latest_ms.max(now_ms);
        self.seen
            .get(key)
            .filter(|s| self.live(s.admitted_ms, now_ms))
            .map(|s| Admission::Duplicate {
                admitted_ms: s.admitted_ms,
                first: s.first.clone(),
            })
    }

    /// Admits `key` unless it was seen within the window; a duplicate is
    /// counted. `journaled` says whether the caller journals the key (its
    /// expiry then needs a tombstone); `first` goes to its duplicates.
    pub(crate) fn admit(
        &mut self,
        key: DedupKey,
        now_ms: u64,
        journaled: bool,
        first: T,
    ) -> Admission<T> {
        let now_ms = self.clamp(now_ms);
        if let Some(dup) = self.peek(&key, now_ms) {
            self.duplicates_total += 1;
            return dup;
        }
        let evicted = if self.seen.contains_key(&key) {
            // Expired but not yet swept: admitted afresh in place.
            None
        } else {
            self.make_room()
                .filter(|(_, s)| s.journaled)
                .map(|(k, _)| k)
        };
        self.insert(key, now_ms, journaled, first);
        Admission::New {
            admitted_ms: now_ms,
            evicted,
        }
    }

    /// Puts back a key recovered from the journal. Call in admission order.
    /// Returns false (and keeps nothing) when its window has passed; a key
    /// forgotten to make room is returned in `evicted`.
    pub(crate) fn restore(
        &mut self,
        key: DedupKey,
        admitted_ms: u64,
        now_ms: u64,
        evicted: &mut Vec<DedupKey>,
    ) -> bool {
        if !self.live(admitted_ms, now_ms) || self.seen.contains_key(&key) {
            return false;
        }
        if let Some((old, s)) = self.make_room() {
            if s.journaled {
                evicted.push(old);
            }
        }
        // Restored keys keep their own time; the order stays sorted since
        // the caller restores in admission order.
        self.latest_ms = self.latest_ms.max(admitted_ms);
        self.insert(key, admitted_ms, true, T::default());
        true
    }

    fn insert(&mut self, key: DedupKey, admitted_ms: u64, journaled: bool, first: T) {
        self.seen.insert(
            key,
            Seen {
                admitted_ms,
                journaled,
                first,
            },
        );
        self.order.push_back((key, admitted_ms));
    }

    /// Forgets the oldest live key when the window is full.
    fn make_room(&mut self) -> Option<(DedupKey, Seen<T>)> {
        if self.seen.len() < self.ids_max {
            return None;
        }
        while let Some((key, at)) = self.order.pop_front() {
            if self.seen.get(&key).is_some_and(|s| s.admitted_ms == at) {
                let seen = self.seen.remove(&key)?;
                self.evicted_total += 1;
                return Some((key, seen));
            }
        }
        None
    }

    /// Forgets every key whose window has passed at `now_ms`, appending the
    /// journaled ones to `expired` (their records can go).
    pub(crate) fn expire(&mut self, now_ms: u64, expired: &mut Vec<DedupKey>) {
        while let Some(&(key, at)) = self.order.front() {
            if at.saturating_add(self.window_ms) > now_ms {
                break;
            }
            self.order.pop_front();
            if let Some(seen) = self.seen.get(&key) {
                if seen.admitted_ms == at {
                    if seen.journaled {
                        expired.push(key);
                    }
                    self.seen.remove(&key);
                }
            }
        }
    }

    /// Every key kept, journaled or not (a deleted queue's records go).
    pub(crate) fn drain_journaled(&mut self) -> Vec<DedupKey> {
        self.order.clear();
        self.seen
            .drain()
            .filter(|(_, s)| s.journaled)
            .map(|(k, _)| k)
            .collect()
    }

    /// Keys kept now.
    pub(crate) fn len(&self) -> usize {
        self.seen.len()
    }

    /// Sends dropped as duplicates since start.
    pub(crate) fn duplicates_total(&self) -> u64 {
        self.duplicates_total
    }

    /// Keys forgotten before their window passed, to stay within `ids_max`.
    pub(crate) fn evicted_total(&self) -> u64 {
        self.evicted_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> DedupKey {
        [n; DEDUP_KEY_BYTES]
    }

    fn is_new(a: Admission<()>) -> bool {
        matches!(a, Admission::New { .. })
    }

    #[test]
    fn a_key_is_a_duplicate_within_the_window_and_new_after_it() {
        let mut w: DedupWindow = DedupWindow::new(1_000, 10);
        assert!(is_new(w.admit(key(1), 10_000, true, ())));
        assert_eq!(
            w.admit(key(1), 10_999, true, ()),
            Admission::Duplicate {
                admitted_ms: 10_000,
                first: ()
            }
        );
        assert_eq!(w.duplicates_total(), 1);
        // The window is measured from the first send, not the last
        // duplicate: at 11,000 it has passed.
        assert!(is_new(w.admit(key(1), 11_000, true, ())));
        assert!(is_new(w.admit(key(2), 11_000, true, ())));
    }

    #[test]
    fn expiry_pops_only_what_the_window_has_passed_in_order() {
        let mut w: DedupWindow = DedupWindow::new(1_000, 10);
        w.admit(key(1), 0, true, ());
        w.admit(key(2), 500, false, ());
        w.admit(key(3), 900, true, ());
        let mut expired = Vec::new();
        w.expire(999, &mut expired);
        assert!(expired.is_empty());
        assert_eq!(w.len(), 3);
        w.expire(1_500, &mut expired);
        // key 2 was never journaled: nothing to tombstone.
        assert_eq!(expired, vec![key(1)]);
        assert_eq!(w.len(), 1);
        assert!(is_new(w.admit(key(2), 1_500, true, ())));
        assert!(!is_new(w.admit(key(3), 1_500, true, ())));
    }

    #[test]
    fn a_key_readmitted_before_the_sweep_keeps_only_its_new_time() {
        let mut w: DedupWindow = DedupWindow::new(1_000, 10);
        w.admit(key(1), 0, true, ());
        // Expired, not yet swept, admitted again.
        assert!(is_new(w.admit(key(1), 1_200, true, ())));
        let mut expired = Vec::new();
        w.expire(1_300, &mut expired);
        // The stale first entry is skipped, not taken for the new one.
        assert!(expired.is_empty());
        assert!(!is_new(w.admit(key(1), 1_300, true, ())));
        w.expire(2_200, &mut expired);
        assert_eq!(expired, vec![key(1)]);
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn past_the_bound_the_oldest_key_is_forgotten_early_and_counted() {
        let mut w: DedupWindow = DedupWindow::new(60_000, 2);
        w.admit(key(1), 0, true, ());
        w.admit(key(2), 1, true, ());
        assert_eq!(
            w.admit(key(3), 2, true, ()),
            Admission::New {
                admitted_ms: 2,
                evicted: Some(key(1))
            }
        );
        assert_eq!(w.len(), 2);
        assert_eq!(w.evicted_total(), 1);
        // Forgotten: its next send is admitted (and evicts key 2).
        assert!(is_new(w.admit(key(1), 3, true, ())));
        assert!(!is_new(w.admit(key(3), 4, true, ())));
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn a_clock_stepping_back_keeps_the_order_sorted() {
        let mut w: DedupWindow = DedupWindow::new(1_000, 10);
        w.admit(key(1), 5_000, true, ());
        assert_eq!(
            w.admit(key(2), 4_000, true, ()),
            Admission::New {
                admitted_ms: 5_000,
                evicted: None
            }
        );
        let mut expired = Vec::new();
        w.expire(6_000, &mut expired);
        assert_eq!(expired, vec![key(1), key(2)]);
    }

    #[test]
    fn restore_skips_expired_keys_and_keeps_the_bound() {
        let mut w: DedupWindow = DedupWindow::new(1_000, 2);
        let mut evicted = Vec::new();
        assert!(!w.restore(key(1), 0, 5_000, &mut evicted));
        assert!(w.restore(key(2), 4_500, 5_000, &mut evicted));
        assert!(w.restore(key(3), 4_600, 5_000, &mut evicted));
        assert!(w.restore(key(4), 4_700, 5_000, &mut evicted));
        assert_eq!(evicted, vec![key(2)]);
        assert_eq!(
            w.peek(&key(3), 5_000),
            Some(Admission::Duplicate {
                admitted_ms: 4_600,
                first: ()
            })
        );
        assert_eq!(w.peek(&key(3), 5_600), None);
        assert_eq!(w.drain_journaled().len(), 2);
        assert_eq!(w.len(), 0);
    }
}
