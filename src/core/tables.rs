//! What the core's tables keyed by a field of their values share:
//! replacing an entry, and removing one and giving memory back.
//!
//! A `hashbrown::HashTable<Arc<T>>` keyed by a field of `T` costs one
//! pointer per slot, where a `HashMap` from a copy of the key to the
//! `Arc` costs the key too (issue 20: the session indexes and the queue
//! map, one entry per connection or per subscription). Like a `HashMap`,
//! a `HashTable` never shrinks by itself.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;

use crate::queue::Queue;

/// A table is shrunk when fewer than one slot in this many is used
/// (then to twice its count), so a shrink follows at least as many
/// removals as it moves entries.
const SHRINK_BELOW: usize = 4;

/// Tables this small are never shrunk: not worth a rehash.
const SHRINK_MIN_CAPACITY: usize = 1024;

/// Shrinks `table` after a removal if most of its slots are empty;
/// `hasher` is the table's hash of an entry.
fn shrink_if_sparse<T>(table: &mut HashTable<T>, hasher: impl Fn(&T) -> u64) {
    if table.capacity() > SHRINK_MIN_CAPACITY && table.len() * SHRINK_BELOW < table.capacity() {
        table.shrink_to(table.len() * 2, hasher);
    }
}

/// Puts `value` in place of the entry `eq` finds under `hash`, or beside
/// the others; returns the entry it replaced.
pub(crate) fn replace_or_insert<T>(
    table: &mut HashTable<T>,
    hash: u64,
    value: T,
    eq: impl FnMut(&T) -> bool,
    hasher: impl Fn(&T) -> u64,
) -> Option<T> {
    match table.entry(hash, eq, hasher) {
        hashbrown::hash_table::Entry::Occupied(mut same) => {
            Some(std::mem::replace(same.get_mut(), value))
        }
        hashbrown::hash_table::Entry::Vacant(free) => {
            free.insert(value);
            None
        }
    }
}

/// Removes the entry `eq` finds under `hash`, if there is one, then
/// shrinks the table if most of its slots are empty.
pub(crate) fn remove_and_shrink<T>(
    table: &mut HashTable<T>,
    hash: u64,
    eq: impl FnMut(&T) -> bool,
    hasher: impl Fn(&T) -> u64,
) -> Option<T> {
    let removed = table
        .find_entry(hash, eq)
        .ok()
        .map(|entry| entry.remove().0);
    shrink_if_sparse(table, hasher);
    removed
}

/// Queues by name: one pointer per slot (the name is the queue's own).
/// Names come from peers, so they are hashed with a keyed hash.
#[derive(Default)]
pub(crate) struct QueuesByName {
    table: HashTable<Arc<Queue>>,
    hasher: RandomState,
}

impl QueuesByName {
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    /// The queue named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<Queue>> {
        self.table.find(self.hash(name), |q| &*q.name == name)
    }

    /// Enters `queue` under its name, in place of one of the same name.
    pub(crate) fn insert(&mut self, queue: Arc<Queue>) {
        let hash = self.hash(&queue.name);
        let name = Arc::clone(&queue.name);
        let hasher = &self.hasher;
        replace_or_insert(
            &mut self.table,
            hash,
            queue,
            |q| q.name == name,
            |q| hasher.hash_one(&*q.name),
        );
    }

    /// Removes the queue named `name`, if present.
    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<Queue>> {
        let hash = self.hash(name);
        let hasher = &self.hasher;
        remove_and_shrink(
            &mut self.table,
            hash,
            |q| &*q.name == name,
            |q| hasher.hash_one(&*q.name),
        )
    }

    /// Every queue, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<Queue>> {
        self.table.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}
