//! A fast hasher for the engine's small integer keys (channels, handles,
//! delivery ids, tickets, consumer ids).
//!
//! SipHash showed up at several percent of the per-message profile. These
//! maps are either keyed by numbers we or the core assign (delivery ids,
//! tickets, consumers) or bounded by small limits (channels by
//! `channel_max`, handles by `links_per_session_max`), so collision
//! flooding by a peer cannot grow them: an unkeyed multiplicative hash is
//! safe here.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplier from the Fx hash (Firefox, rustc).
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// The hasher; see the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl IdHasher {
    #[inline]
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.add(u64::from(*b));
        }
    }
    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map with [`IdHasher`].
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A map of the few entries most connections have (sessions, links) with
/// [`IdHasher`] once it has many: an exactly sized slice up to eight, where
/// a hash map's first table cost about 80 bytes for one entry (issue 20).
pub(crate) type SmallIdMap<K, V> =
    rosetta_neutral::small_map::SmallMap<K, V, BuildHasherDefault<IdHasher>>;
/// A set with [`IdHasher`].
pub(crate) type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;
