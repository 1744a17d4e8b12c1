//! The in-memory part of a backlog: one sequence-ordered [`Level`] per
//! message priority, highest priority first.
//!
//! Almost every message arrives with a higher sequence than any before it,
//! and leaves from the front: a ring buffer per level does that with no
//! allocation per message. (A `BTreeMap` alone allocated and freed a node
//! whenever a queue went between empty and one message, which is every
//! message for a consumer that keeps up, and moved whole entries on each
//! pop.) Released messages, and the rare message whose enqueue overtook a
//! newer one, go to an ordered map beside the ring; a level's head is the
//! lower of the two heads.
//!
//! A queue whose messages all have one priority uses one level; finding the
//! highest non-empty level is one bit operation on [`Levels::occupied`], so
//! the single-priority path costs what it did before priorities. A level is
//! allocated the first time a message of its priority arrives and kept for
//! the queue's life (no allocation per message): every MQTT session has a
//! queue, and ten inline levels cost 640 bytes per idle connection.
//!
//! Taking a message from the middle (a consumer with a selector, a message
//! group) leaves a tombstone in the ring, found by binary search on the
//! sequence: O(log n). Tombstones at either end are trimmed at once; the
//! ring is compacted when they outnumber the live entries, so they cost
//! O(1) amortized and never more than the live entries' own slots.

use std::collections::{BTreeMap, VecDeque};

use rosetta_store::MessageSeq;

use crate::queue::Entry;

/// Message priorities, 0 (lowest) to 9 (highest), as JMS and AMQP have them.
pub(crate) const PRIORITY_LEVELS: usize = 10;

/// Tombstones a ring may hold before compaction is considered at all: a
/// few tombstones are cheaper to keep than to compact away.
const TOMBSTONES_COMPACT_MIN: usize = 64;

/// Where a waiting message sits in queue order: higher priority first,
/// then by sequence. Ordering `Place`s orders messages the way a queue
/// delivers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Place {
    /// `9 - priority`, so that a higher priority sorts first.
    rank: u8,
    pub(crate) seq: MessageSeq,
}

impl Place {
    pub(crate) fn of(entry: &Entry) -> Self {
        Self {
            rank: rank_of(entry),
            seq: entry.seq,
        }
    }
}

/// The level a message waits in: its priority, values above 9 counting as 9
/// (as STOMP's and JMS's priorities clamp).
fn rank_of(entry: &Entry) -> u8 {
    (PRIORITY_LEVELS as u8 - 1) - entry.message.priority.min(PRIORITY_LEVELS as u8 - 1)
}

/// One slot of a ring: a live entry, or the tombstone of one taken from the
/// middle (its sequence kept for the binary search).
#[derive(Debug)]
struct Slot {
    seq: MessageSeq,
    entry: Option<Entry>,
}

/// The messages of one priority, in sequence order.
#[derive(Debug, Default)]
pub(crate) struct Level {
    /// Sorted by `seq`; its first and last slots are always live.
    in_order: VecDeque<Slot>,
    /// Live entries in `in_order`.
    in_order_live: usize,
    out_of_order: BTreeMap<MessageSeq, Entry>,
}

impl Level {
    pub(crate) fn len(&self) -> usize {
        self.in_order_live + self.out_of_order.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn insert(&mut self, entry: Entry) {
        match self.in_order.back() {
            Some(last) if last.seq >= entry.seq => {
                self.out_of_order.insert(entry.seq, entry);
            }
            _ => {
                self.in_order.push_back(Slot {
                    seq: entry.seq,
                    entry: Some(entry),
                });
                self.in_order_live += 1;
            }
        }
    }

    /// Whether the head is in `out_of_order` rather than `in_order`.
    fn head_is_out_of_order(&self) -> bool {
        match (self.in_order.front(), self.out_of_order.first_key_value()) {
            (Some(a), Some((b, _))) => *b < a.seq,
            (None, Some(_)) => true,
            _ => false,
        }
    }

    pub(crate) fn first(&self) -> Option<&Entry> {
        if self.head_is_out_of_order() {
            self.out_of_order.first_key_value().map(|(_, e)| e)
        } else {
            self.in_order.front().and_then(|s| s.entry.as_ref())
        }
    }

    pub(crate) fn pop_first(&mut self) -> Option<Entry> {
        if self.head_is_out_of_order() {
            return self.out_of_order.pop_first().map(|(_, e)| e);
        }
        let entry = self.in_order.pop_front()?.entry;
        self.in_order_live -= 1;
        self.trim();
        entry
    }

    fn ring_index(&self, seq: MessageSeq) -> Option<usize> {
        self.in_order.binary_search_by_key(&seq, |s| s.seq).ok()
    }

    pub(crate) fn get(&self, seq: MessageSeq) -> Option<&Entry> {
        // A message taken from the middle and released again sits aside,
        // next to its own tombstone.
        self.ring_index(seq)
            .and_then(|i| self.in_order[i].entry.as_ref())
            .or_else(|| self.out_of_order.get(&seq))
    }

    /// Takes the entry of `seq` out, wherever it is.
    pub(crate) fn remove(&mut self, seq: MessageSeq) -> Option<Entry> {
        let Some(i) = self
            .ring_index(seq)
            .filter(|&i| self.in_order[i].entry.is_some())
        else {
            return self.out_of_order.remove(&seq);
        };
        let entry = self.in_order[i].entry.take()?;
        self.in_order_live -= 1;
        self.trim();
        let dead = self.in_order.len() - self.in_order_live;
        if dead > TOMBSTONES_COMPACT_MIN && dead > self.in_order_live {
            self.in_order.retain(|s| s.entry.is_some());
        }
        Some(entry)
    }

    /// Drops tombstones at both ends, so the ends are live.
    fn trim(&mut self) {
        while self.in_order.front().is_some_and(|s| s.entry.is_none()) {
            self.in_order.pop_front();
        }
        while self.in_order.back().is_some_and(|s| s.entry.is_none()) {
            self.in_order.pop_back();
        }
    }

    /// The entry with the lowest sequence at or after `seq`.
    pub(crate) fn first_from(&self, seq: MessageSeq) -> Option<&Entry> {
        let start = self.in_order.partition_point(|s| s.seq < seq);
        let in_ring = self.in_order.range(start..).find_map(|s| s.entry.as_ref());
        let aside = self.out_of_order.range(seq..).next().map(|(_, e)| e);
        match (in_ring, aside) {
            (Some(a), Some(b)) => Some(if b.seq < a.seq { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.in_order
            .iter()
            .filter_map(|s| s.entry.as_ref())
            .chain(self.out_of_order.values())
    }

    /// Every entry, in no particular order.
    pub(crate) fn into_entries(self) -> impl Iterator<Item = Entry> {
        self.in_order
            .into_iter()
            .filter_map(|s| s.entry)
            .chain(self.out_of_order.into_values())
    }
}

/// The in-memory messages of a queue, by priority then sequence.
#[derive(Debug, Default)]
pub(crate) struct Levels {
    /// The levels that messages have arrived in, by `rank` (`9 -
    /// priority`), in rank order: most queues use one priority, so a short
    /// vector (24 bytes) rather than a slot per priority (80; every
    /// session's queue has one, issue 20).
    levels: Vec<(u8, Box<Level>)>,
    /// Bit `rank` is set when that level has entries.
    occupied: u16,
    len: usize,
}

impl Levels {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The level of the head: the lowest occupied rank.
    fn head_rank(&self) -> Option<usize> {
        (self.occupied != 0).then(|| self.occupied.trailing_zeros() as usize)
    }

    fn level(&self, rank: usize) -> Option<&Level> {
        let rank = u8::try_from(rank).ok()?;
        let at = self.levels.binary_search_by_key(&rank, |(r, _)| *r).ok()?;
        self.levels.get(at).map(|(_, l)| &**l)
    }

    fn level_mut(&mut self, rank: usize) -> Option<&mut Level> {
        let rank = u8::try_from(rank).ok()?;
        let at = self.levels.binary_search_by_key(&rank, |(r, _)| *r).ok()?;
        self.levels.get_mut(at).map(|(_, l)| &mut **l)
    }

    fn level_or_insert(&mut self, rank: u8) -> &mut Level {
        let at = match self.levels.binary_search_by_key(&rank, |(r, _)| *r) {
            Ok(at) => at,
            Err(at) => {
                if self.levels.capacity() == 0 {
                    // Exactly sized: most queues use one priority.
                    self.levels.reserve_exact(1);
                }
                self.levels.insert(at, (rank, Box::default()));
                at
            }
        };
        &mut self.levels[at].1
    }

    fn note(&mut self, rank: usize) {
        if self.level(rank).is_none_or(Level::is_empty) {
            self.occupied &= !(1 << rank);
        } else {
            self.occupied |= 1 << rank;
        }
    }

    pub(crate) fn insert(&mut self, entry: Entry) -> Place {
        let place = Place::of(&entry);
        self.level_or_insert(place.rank).insert(entry);
        self.occupied |= 1 << place.rank;
        self.len += 1;
        place
    }

    pub(crate) fn first(&self) -> Option<&Entry> {
        self.level(self.head_rank()?)?.first()
    }

    pub(crate) fn pop_first(&mut self) -> Option<Entry> {
        let rank = self.head_rank()?;
        let entry = self.level_mut(rank)?.pop_first();
        self.note(rank);
        self.len -= usize::from(entry.is_some());
        entry
    }

    pub(crate) fn get(&self, place: Place) -> Option<&Entry> {
        self.level(usize::from(place.rank))?.get(place.seq)
    }

    pub(crate) fn remove(&mut self, place: Place) -> Option<Entry> {
        let rank = usize::from(place.rank);
        let entry = self.level_mut(rank)?.remove(place.seq);
        self.note(rank);
        self.len -= usize::from(entry.is_some());
        entry
    }

    /// The entry with the lowest sequence at or after `seq`, whatever its
    /// priority (a browser's walk in arrival order).
    pub(crate) fn first_from(&self, seq: MessageSeq) -> Option<&Entry> {
        self.levels
            .iter()
            .map(|(_, l)| l)
            .filter(|l| !l.is_empty())
            .filter_map(|l| l.first_from(seq))
            .min_by_key(|e| e.seq)
    }

    /// The oldest entry by sequence, whatever its priority.
    pub(crate) fn oldest(&self) -> Option<&Entry> {
        self.first_from(0)
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.levels.iter().flat_map(|(_, l)| l.iter())
    }

    /// Every entry, in no particular order.
    pub(crate) fn into_entries(self) -> Vec<Entry> {
        let mut all = Vec::with_capacity(self.len);
        for (_, level) in self.levels {
            all.extend(level.into_entries());
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rosetta_neutral::Message;

    use super::*;

    fn entry(seq: MessageSeq) -> Entry {
        Entry::new(seq, Arc::new(Message::default()), false, 0)
    }

    fn entry_at(seq: MessageSeq, priority: u8) -> Entry {
        let m = Message {
            priority,
            ..Message::default()
        };
        Entry::new(seq, Arc::new(m), false, 0)
    }

    fn drain(m: &mut Level) -> Vec<MessageSeq> {
        std::iter::from_fn(|| m.pop_first())
            .map(|e| e.seq)
            .collect()
    }

    #[test]
    fn an_idle_queue_holds_no_level_it_has_not_used() {
        // Every MQTT session has a queue: ten inline levels were 640 bytes
        // per idle connection, ten empty slots 80 (issue 20).
        assert!(
            std::mem::size_of::<Levels>() <= 48,
            "Levels is {} bytes",
            std::mem::size_of::<Levels>()
        );
        let mut levels = Levels::default();
        levels.insert(entry_at(1, 4));
        assert_eq!(levels.levels.len(), 1);
        assert_eq!(levels.levels.capacity(), 1);
        assert_eq!(levels.pop_first().map(|e| e.seq), Some(1));
        assert!(levels.first().is_none() && levels.is_empty());
    }

    #[test]
    fn a_level_pops_in_sequence_order_whatever_the_insert_order() {
        let mut m = Level::default();
        for seq in [3, 5, 4, 9, 1, 7, 8, 2] {
            m.insert(entry(seq));
        }
        assert_eq!(m.len(), 8);
        assert_eq!(m.first().map(|e| e.seq), Some(1));
        assert_eq!(drain(&mut m), vec![1, 2, 3, 4, 5, 7, 8, 9]);
        assert!(m.is_empty());
    }

    #[test]
    fn a_released_message_returns_ahead_of_newer_ones() {
        let mut m = Level::default();
        for seq in 10..15 {
            m.insert(entry(seq));
        }
        let taken: Vec<Entry> = (0..3).filter_map(|_| m.pop_first()).collect();
        m.insert(entry(15));
        // Released in reverse, as a detaching consumer may return them.
        for e in taken.into_iter().rev() {
            m.insert(e);
        }
        assert_eq!(drain(&mut m), vec![10, 11, 12, 13, 14, 15]);
    }

    #[test]
    fn higher_priorities_come_first_fifo_within_each() {
        let mut m = Levels::default();
        for (seq, priority) in [(1, 4), (2, 9), (3, 0), (4, 9), (5, 4), (6, 12)] {
            m.insert(entry_at(seq, priority));
        }
        let order: Vec<_> = std::iter::from_fn(|| m.pop_first())
            .map(|e| e.seq)
            .collect();
        // 12 counts as 9.
        assert_eq!(order, vec![2, 4, 6, 1, 5, 3]);
    }

    #[test]
    fn many_removals_from_the_middle_compact_the_ring() {
        let mut m = Level::default();
        for seq in 0..10_000 {
            m.insert(entry(seq));
        }
        for seq in (0..10_000).filter(|s| s % 10 != 0) {
            assert_eq!(m.remove(seq).map(|e| e.seq), Some(seq));
        }
        assert_eq!(m.len(), 1_000);
        assert!(m.in_order.len() <= 2 * m.len() + TOMBSTONES_COMPACT_MIN);
        assert_eq!(m.first_from(11).map(|e| e.seq), Some(20));
        assert_eq!(drain(&mut m), (0..10_000).step_by(10).collect::<Vec<_>>());
    }

    proptest::proptest! {
        #[test]
        fn levels_match_a_sorted_model(ops in proptest::collection::vec((0u8..4, 0u64..64, 0u8..10), 0..300)) {
            let mut m = Levels::default();
            let mut model = std::collections::BTreeSet::new();
            for (op, seq, priority) in ops {
                match op {
                    0 | 1 => {
                        let e = entry_at(seq, priority);
                        let place = Place::of(&e);
                        if !model.iter().any(|p: &Place| p.seq == seq) {
                            model.insert(place);
                            m.insert(e);
                        }
                    }
                    2 => {
                        proptest::prop_assert_eq!(m.pop_first().map(|e| Place::of(&e)), model.pop_first());
                    }
                    _ => {
                        let place = model.iter().find(|p| p.seq == seq).copied();
                        if let Some(place) = place {
                            model.remove(&place);
                            proptest::prop_assert_eq!(m.remove(place).map(|e| e.seq), Some(seq));
                        }
                    }
                }
                proptest::prop_assert_eq!(m.len(), model.len());
                proptest::prop_assert_eq!(m.first().map(Place::of), model.first().copied());
                let oldest = model.iter().map(|p| p.seq).min();
                proptest::prop_assert_eq!(m.oldest().map(|e| e.seq), oldest);
            }
        }
    }
}
