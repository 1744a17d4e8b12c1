//! A slab in fixed pages: values stored in place, each under the index
//! [`Slots::insert`] returned, freed slots reused first.
//!
//! For tables with one entry per connection, where a hash map's slot
//! (key, value and control byte, at a load of 7/8 at best and 7/16 just
//! after it doubles) cost more than the entry itself (issue 20). Pages
//! are allocated one at a time, so the slack is at most one page, not
//! the table's size, and growing never moves an entry.

/// Entries per page: at 48 B each, a page of 24 KiB.
const PAGE: usize = 512;

pub(crate) struct Slots<T> {
    pages: Vec<Box<[Option<T>]>>,
    /// Freed slots, reused last-freed first.
    free: Vec<u32>,
    /// Slots below this have been used (are occupied or in `free`).
    high_water: usize,
    len: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            pages: Vec::new(),
            free: Vec::new(),
            high_water: 0,
            len: 0,
        }
    }
}

impl<T> Slots<T> {
    /// Stores `value` and returns its index (stable until removed).
    ///
    /// # Panics
    /// Past `u32::MAX` entries: more than any process holds connections.
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        let index = match self.free.pop() {
            Some(index) => index as usize,
            None => {
                if self.high_water == self.pages.len() * PAGE {
                    self.pages.push((0..PAGE).map(|_| None).collect());
                }
                self.high_water += 1;
                self.high_water - 1
            }
        };
        let slot = &mut self.pages[index / PAGE][index % PAGE];
        debug_assert!(slot.is_none(), "slot {index} handed out twice");
        *slot = Some(value);
        self.len += 1;
        u32::try_from(index).expect("fewer than 2^32 slots")
    }

    /// Takes the value at `index` out, if one is there.
    pub(crate) fn remove(&mut self, index: u32) -> Option<T> {
        let i = index as usize;
        let value = self.pages.get_mut(i / PAGE)?[i % PAGE].take()?;
        self.free.push(index);
        self.len -= 1;
        Some(value)
    }

    /// Every stored value, in index order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.pages
            .iter()
            .flat_map(|page| page.iter())
            .take(self.high_water)
            .flatten()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_stay_under_their_index_and_freed_slots_are_reused() {
        let mut slots = Slots::default();
        let indexes: Vec<u32> = (0..1_200u32).map(|v| slots.insert(v)).collect();
        assert_eq!(indexes, (0..1_200).collect::<Vec<_>>());
        assert_eq!(slots.remove(700), Some(700));
        assert_eq!(slots.remove(700), None);
        assert_eq!(slots.remove(5_000), None);
        assert_eq!(slots.len(), 1_199);
        assert_eq!(slots.iter().count(), 1_199);
        assert!(!slots.iter().any(|&v| v == 700));
        // The freed slot is taken before a new one.
        assert_eq!(slots.insert(9_999), 700);
        assert_eq!(slots.insert(10_000), 1_200);
        assert_eq!(slots.pages.len(), 3);
        assert!(slots.iter().any(|&v| v == 9_999));
    }
}
