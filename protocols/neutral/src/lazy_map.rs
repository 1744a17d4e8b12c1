//! A hash map that costs a pointer until its first entry.
//!
//! Much state is per connection (its protocol state, its core session, a
//! device's session queue), and each carries maps that most connections
//! never use: transactions, topic aliases, message groups' leases,
//! reserved messages, stream readers. An empty `HashMap` is 48 bytes in
//! its owner; a [`LazyMap`] is 8 until the first insert (issue 20). Once
//! used it keeps its map, as a `HashMap` keeps its table, so a busy owner
//! does not allocate it again and again; [`LazyMap::clear`] frees it.
//!
//! The methods are `HashMap`'s, so a field can change type without its
//! users changing.

use std::borrow::Borrow;
use std::collections::hash_map::{self, HashMap, RandomState};
use std::hash::{BuildHasher, Hash};

/// See the module docs.
// Boxed so that an empty map costs a pointer (8 bytes), not a map (48).
#[allow(clippy::box_collection)]
#[derive(Debug)]
pub struct LazyMap<K, V, S = RandomState>(Option<Box<HashMap<K, V, S>>>);

impl<K, V, S> Default for LazyMap<K, V, S> {
    fn default() -> Self {
        Self(None)
    }
}

/// `S`: the map's hasher, std's by default; maps keyed by ids the broker
/// allocates use [`crate::id_hash::BuildIdHasher`].
impl<K: Hash + Eq, V, S: BuildHasher + Default> LazyMap<K, V, S> {
    /// The value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_ref()?.get(key)
    }

    /// The value of `key`, to change.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_mut()?.get_mut(key)
    }

    /// Whether `key` has a value.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_ref().is_some_and(|m| m.contains_key(key))
    }

    /// Sets `key`'s value (allocating the map on the first entry);
    /// returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.0.get_or_insert_default().insert(key, value)
    }

    /// `key`'s entry (allocating the map on the first use).
    pub fn entry(&mut self, key: K) -> hash_map::Entry<'_, K, V> {
        self.0.get_or_insert_default().entry(key)
    }

    /// Takes `key`'s value out.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_mut()?.remove(key)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.len())
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Empties the map and frees it.
    pub fn clear(&mut self) {
        self.0 = None;
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().flat_map(|m| m.iter())
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.0.iter().flat_map(|m| m.keys())
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().flat_map(|m| m.values())
    }

    /// Every value, taken out, in no particular order.
    pub fn into_values(self) -> impl Iterator<Item = V> {
        self.0.into_iter().flat_map(|m| m.into_values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_allocated_until_the_first_entry_and_clear_frees() {
        let mut map: LazyMap<String, u32> = LazyMap::default();
        assert!(map.0.is_none());
        assert_eq!(std::mem::size_of_val(&map), 8);
        assert!(map.get("a").is_none());
        assert!(map.remove("a").is_none());
        assert!(map.0.is_none(), "reads and misses allocate nothing");
        *map.entry("a".into()).or_default() += 2;
        map.insert("b".into(), 1);
        assert_eq!((map.get("a"), map.len()), (Some(&2), 2));
        assert!(map.contains_key("b"));
        map.clear();
        assert!(map.0.is_none() && map.is_empty());
    }
}
