//! A map for the few entries a connection usually has, that still scales
//! when it has many.
//!
//! A STOMP connection's subscriptions are the case in point: most devices
//! hold one, some clients thousands. A `HashMap`'s first table has four
//! slots and costs about 200 bytes for the one entry a device has (issue
//! 20: two of them were 392 bytes of every subscribed STOMP connection).
//! Up to [`FEW_MAX`] entries live in an exactly sized boxed slice searched
//! linearly (an entry's own bytes and nothing else); past that the map
//! moves to a `HashMap` and stays one.
//!
//! Inserting into the slice reallocates it: this map is for state that
//! changes when a client subscribes or unsubscribes, not per message.
//! Lookups, the per-message part, are a scan of at most eight keys or a
//! hash.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// Entries kept in the slice before the map becomes a `HashMap`.
pub const FEW_MAX: usize = 8;

/// See the module docs. `S`: the hasher once the map is a `HashMap`,
/// std's by default; maps keyed by ids the broker or a bounded peer
/// allocates use a cheaper one, as with [`crate::LazyMap`].
#[derive(Debug)]
pub struct SmallMap<K, V, S = RandomState>(Repr<K, V, S>);

#[derive(Debug)]
enum Repr<K, V, S> {
    /// Exactly sized; empty costs nothing on the heap.
    Few(Box<[(K, V)]>),
    // Boxed so that the map costs two words inline, not a `HashMap`'s six.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<K, V, S>>),
}

/// [`SmallMap::parts`]: the slice and the hash map.
type Parts<'a, K, V, S> = (&'a [(K, V)], Option<&'a HashMap<K, V, S>>);

impl<K, V, S> Default for SmallMap<K, V, S> {
    fn default() -> Self {
        Self(Repr::Few(Box::default()))
    }
}

impl<K: Hash + Eq, V, S: BuildHasher + Default> SmallMap<K, V, S> {
    /// The value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match &self.0 {
            Repr::Few(few) => few.iter().find(|(k, _)| k.borrow() == key).map(|(_, v)| v),
            Repr::Many(map) => map.get(key),
        }
    }

    /// The value of `key`, to change.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match &mut self.0 {
            Repr::Few(few) => few
                .iter_mut()
                .find(|(k, _)| k.borrow() == key)
                .map(|(_, v)| v),
            Repr::Many(map) => map.get_mut(key),
        }
    }

    /// Whether `key` has a value.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Sets `key`'s value; returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        if let Some(old) = self.get_mut(&key) {
            return Some(std::mem::replace(old, value));
        }
        match &mut self.0 {
            Repr::Few(few) if few.len() < FEW_MAX => {
                let mut entries = std::mem::take(few).into_vec();
                entries.reserve_exact(1);
                entries.push((key, value));
                *few = entries.into_boxed_slice();
            }
            Repr::Few(few) => {
                let mut map: HashMap<K, V, S> =
                    std::mem::take(few).into_vec().into_iter().collect();
                map.insert(key, value);
                self.0 = Repr::Many(Box::new(map));
            }
            Repr::Many(map) => {
                map.insert(key, value);
            }
        }
        None
    }

    /// Takes `key`'s value out.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match &mut self.0 {
            Repr::Few(few) => {
                let at = few.iter().position(|(k, _)| k.borrow() == key)?;
                let mut entries = std::mem::take(few).into_vec();
                let (_, value) = entries.swap_remove(at);
                *few = entries.into_boxed_slice();
                Some(value)
            }
            Repr::Many(map) => map.remove(key),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Few(few) => few.len(),
            Repr::Many(map) => map.len(),
        }
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slice's entries and the hash map, whichever holds them (the
    /// other side empty): every iterator chains the two.
    fn parts(&self) -> Parts<'_, K, V, S> {
        match &self.0 {
            Repr::Few(few) => (few, None),
            Repr::Many(map) => (&[], Some(map)),
        }
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        let (few, many) = self.parts();
        few.iter()
            .map(|(k, v)| (k, v))
            .chain(many.into_iter().flat_map(|m| m.iter()))
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    /// Every value, to change, in no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        let (few, many) = match &mut self.0 {
            Repr::Few(few) => (&mut few[..], None),
            Repr::Many(map) => (&mut [][..], Some(map)),
        };
        few.iter_mut()
            .map(|(_, v)| v)
            .chain(many.into_iter().flat_map(|m| m.values_mut()))
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn few_entries_cost_their_own_bytes_and_many_move_to_a_hash_map() {
        let mut map: SmallMap<String, u32> = SmallMap::default();
        assert_eq!(std::mem::size_of_val(&map), 16);
        map.insert("a".into(), 1);
        assert!(matches!(&map.0, Repr::Few(f) if f.len() == 1));
        for i in 1..FEW_MAX {
            map.insert(i.to_string(), 0);
        }
        assert!(matches!(&map.0, Repr::Few(_)));
        map.insert("last".into(), 9);
        assert!(matches!(&map.0, Repr::Many(_)));
        assert_eq!(
            (map.len(), map.get("a"), map.get("last")),
            (FEW_MAX + 1, Some(&1), Some(&9))
        );
    }

    proptest! {
        /// Any sequence of inserts and removes leaves it holding what a
        /// `HashMap` given the same sequence holds.
        #[test]
        fn behaves_as_a_hash_map(ops in proptest::collection::vec((any::<bool>(), 0u8..24, any::<u16>()), 0..200)) {
            let mut small: SmallMap<u8, u16> = SmallMap::default();
            let mut model: HashMap<u8, u16> = HashMap::new();
            for (insert, key, value) in ops {
                if insert {
                    prop_assert_eq!(small.insert(key, value), model.insert(key, value));
                } else {
                    prop_assert_eq!(small.remove(&key), model.remove(&key));
                }
                prop_assert_eq!(small.len(), model.len());
            }
            for key in 0u8..24 {
                prop_assert_eq!(small.get(&key), model.get(&key));
                prop_assert_eq!(small.contains_key(&key), model.contains_key(&key));
            }
            for v in small.values_mut() {
                *v = v.wrapping_add(1);
            }
            for v in model.values_mut() {
                *v = v.wrapping_add(1);
            }
            prop_assert!(small.iter().all(|(k, v)| model.get(k) == Some(v)));
            let mut keys: Vec<u8> = small.keys().copied().collect();
            let mut want_keys: Vec<u8> = model.keys().copied().collect();
            keys.sort_unstable();
            want_keys.sort_unstable();
            prop_assert_eq!(keys, want_keys);
            let mut values: Vec<u16> = small.values().copied().collect();
            let mut want: Vec<u16> = model.values().copied().collect();
            values.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(values, want);
        }
    }
}
