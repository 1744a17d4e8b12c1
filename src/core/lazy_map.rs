//! A hash map that costs a pointer until its first entry.
//!
//! Queues and sessions are per connection (a device's session queue, its
//! session), and each carries maps that most never use: message groups'
//! leases, reserved messages, transactions, stream readers. An empty
//! `HashMap` is 48 bytes in its owner; this is 8 until the first insert
//! (issue 20). Once used it keeps its map, as a `HashMap` keeps its table,
//! so a busy owner does not allocate it again and again; `clear` frees it.
//!
//! The methods are `HashMap`'s, so a field can change type without its
//! users changing.

use std::borrow::Borrow;
use std::collections::hash_map::{self, HashMap};
use std::hash::Hash;

/// See the module docs.
// Boxed so that an empty map costs a pointer (8 bytes), not a map (48).
#[allow(clippy::box_collection)]
#[derive(Debug)]
pub(crate) struct LazyMap<K, V>(Option<Box<HashMap<K, V>>>);

impl<K, V> Default for LazyMap<K, V> {
    fn default() -> Self {
        Self(None)
    }
}

impl<K: Hash + Eq, V> LazyMap<K, V> {
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_ref()?.get(key)
    }

    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_mut()?.get_mut(key)
    }

    pub(crate) fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_ref().is_some_and(|m| m.contains_key(key))
    }

    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.0.get_or_insert_default().insert(key, value)
    }

    pub(crate) fn entry(&mut self, key: K) -> hash_map::Entry<'_, K, V> {
        self.0.get_or_insert_default().entry(key)
    }

    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_mut()?.remove(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.len())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Empties the map and frees it.
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().flat_map(|m| m.iter())
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.0.iter().flat_map(|m| m.keys())
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().flat_map(|m| m.values())
    }

    pub(crate) fn into_values(self) -> impl Iterator<Item = V> {
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
