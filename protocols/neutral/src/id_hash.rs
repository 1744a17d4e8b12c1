//! A hash for maps keyed by ids the broker hands out itself: delivery tags,
//! packet ids.
//!
//! The standard library's SipHash resists keys chosen to collide, which
//! only matters for keys a peer chooses; it was about 8% of the
//! instructions of an MQTT QoS 1 message (issue 20: the in-flight map of a
//! queue is written and read once per delivery, an MQTT connection's packet
//! ids twice). These keys are counters the broker allocates, so a peer
//! cannot pick them, and one multiplication spreads them: consecutive ids
//! land in consecutive-free buckets (an odd multiplier permutes the low
//! bits) and fill the high bits hashbrown keeps as its tag.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The hasher of maps keyed by broker-allocated integer ids.
pub type BuildIdHasher = BuildHasherDefault<IdHasher>;

/// A map keyed by broker-allocated integer ids.
pub type IdHashMap<K, V> = HashMap<K, V, BuildIdHasher>;

/// Multiplies the id by 2^64 / φ (Fibonacci hashing). For integer keys
/// only: other input is folded in eight bytes at a time, correct but
/// without care for its quality.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher {
    hash: u64,
}

const FIBONACCI: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.hash
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u16(&mut self, id: u16) {
        self.write_u64(u64::from(id));
    }

    fn write_u32(&mut self, id: u32) {
        self.write_u64(u64::from(id));
    }

    fn write_u64(&mut self, id: u64) {
        self.hash = (self.hash.rotate_left(5) ^ id).wrapping_mul(FIBONACCI);
    }

    fn write_usize(&mut self, id: usize) {
        self.write_u64(id as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_ids_get_distinct_buckets_and_tags() {
        let hash = |id: u64| {
            let mut h = IdHasher::default();
            h.write_u64(id);
            h.finish()
        };
        // Low bits pick the bucket: 1,024 consecutive ids in 1,024 buckets
        // all differ.
        let buckets: std::collections::HashSet<u64> = (0..1024).map(|i| hash(i) & 1023).collect();
        assert_eq!(buckets.len(), 1024);
        // The top seven bits (hashbrown's tag) are not all alike.
        let tags: std::collections::HashSet<u64> = (0..1024).map(|i| hash(i) >> 57).collect();
        assert!(tags.len() > 100, "{} tags", tags.len());
    }

    #[test]
    fn a_map_keyed_by_ids_works_as_a_map() {
        let mut m: IdHashMap<u16, u32> = IdHashMap::default();
        for i in 0..5000u16 {
            m.insert(i, u32::from(i) * 2);
        }
        assert_eq!(m.len(), 5000);
        assert_eq!(m.get(&4999), Some(&9998));
        assert_eq!(m.remove(&7), Some(14));
        assert!(!m.contains_key(&7));
    }
}
