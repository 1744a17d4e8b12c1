//! A reader's deliveries sent and not yet settled, by tag.
//!
//! Tags are handed out in increasing order and settlements come mostly in
//! that order too (a cumulative acknowledgement settles a prefix), so the
//! set is a queue in tag order with a settled mark: sending appends,
//! settling finds its tag by binary search and marks it, and the settled
//! entries at the front go. No allocation per delivery, unlike a tree.
//!
//! An entry left unsettled at the front keeps the settled ones behind it
//! (a client that acknowledges all but one): those are compacted away
//! once they outnumber the live ones, so the queue holds at most about
//! twice the reader's credit.

use std::collections::VecDeque;

/// One delivery: its tag, the part (partition index) and offset it came
/// from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    tag: u64,
    part: usize,
    offset: u64,
    settled: bool,
}

/// Settled entries kept behind a live one before a compaction, at least.
const COMPACT_SLACK: usize = 64;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Unsettled {
    entries: VecDeque<Entry>,
    live: usize,
}

impl Unsettled {
    /// Deliveries not yet settled.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Records a delivery; `tag` is above every tag recorded before.
    pub(crate) fn insert(&mut self, tag: u64, part: usize, offset: u64) {
        assert!(
            self.entries.back().is_none_or(|e| e.tag < tag),
            "delivery tags only grow"
        );
        self.entries.push_back(Entry {
            tag,
            part,
            offset,
            settled: false,
        });
        self.live += 1;
    }

    /// Settles `tag`: its (part, offset), or `None` when it is not an
    /// unsettled delivery.
    pub(crate) fn remove(&mut self, tag: u64) -> Option<(usize, u64)> {
        // Tags are nearly always consecutive (one reader's deliveries, none
        // compacted away in between), and then the tag says where it is;
        // the search is for the rest. A cumulative acknowledgement of a
        // read's worth searched once per delivery before.
        let first = self.entries.front()?.tag;
        let guess = usize::try_from(tag.wrapping_sub(first)).unwrap_or(usize::MAX);
        let i = match self.entries.get(guess) {
            Some(e) if e.tag == tag => guess,
            _ => self.entries.binary_search_by_key(&tag, |e| e.tag).ok()?,
        };
        let e = self.entries.get_mut(i)?;
        if e.settled {
            return None;
        }
        e.settled = true;
        let found = (e.part, e.offset);
        self.live -= 1;
        while self.entries.front().is_some_and(|e| e.settled) {
            self.entries.pop_front();
        }
        if self.entries.len() > 2 * self.live + COMPACT_SLACK {
            self.entries.retain(|e| !e.settled);
        }
        Some(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settles_in_any_order_once_and_stays_bounded() {
        let mut u = Unsettled::default();
        for tag in 1..=10 {
            u.insert(tag, (tag % 2) as usize, tag * 100);
        }
        assert_eq!(u.remove(3), Some((1, 300)));
        assert_eq!(u.remove(3), None, "settled once");
        assert_eq!(u.remove(11), None, "never sent");
        assert_eq!(u.remove(1), Some((1, 100)));
        assert_eq!(u.len(), 8);
        for tag in [2, 4, 5, 6, 7, 8, 9, 10] {
            assert!(u.remove(tag).is_some());
        }
        assert_eq!(u.len(), 0);
        assert!(u.entries.is_empty());

        // One delivery never settled: the settled behind it are compacted.
        u.insert(100, 0, 0);
        for tag in 101..10_000 {
            u.insert(tag, 0, tag);
            assert!(u.remove(tag).is_some());
            assert!(u.entries.len() <= 2 * u.len() + COMPACT_SLACK + 1);
        }
        assert_eq!(u.len(), 1);
        assert_eq!(u.remove(100), Some((0, 0)));
    }
}
