//! Partitioned streams: one name over `N` logs, and how a publish picks one.
//!
//! A stream declared with `partitions = N` (N > 1) has no log of its own:
//! its partitions are the streams `<name>-0` … `<name>-<N-1>` (RabbitMQ
//! super streams' naming), each its own log, readable directly as a plain
//! stream too. A publish to `<name>` goes to one partition:
//!
//! - by its key when it has one: the application property named by the
//!   rule's `partition_key` (STOMP header, MQTT 5 user property, AMQP
//!   application property of that name) if set and present, else the
//!   message group (AMQP `properties.group-id`, STOMP header and MQTT 5
//!   user property `JMSXGroupID`, the ActiveMQ/Artemis spelling);
//! - round-robin when it has none.
//!
//! The key's partition is `murmur3_32(key, seed 104729) mod N`, RabbitMQ
//! super streams' hash: fixed, so a key keeps its partition across
//! restarts (as long as `N` is not changed), and the same as a RabbitMQ
//! client routing by hash would pick.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rosetta_neutral::Message;

use super::Stream;

/// The seed RabbitMQ's super stream hash routing uses.
const HASH_SEED: u32 = 104_729;

/// The name of partition `n` of stream `name`.
pub(crate) fn partition_name(name: &str, n: u32) -> String {
    format!("{name}-{n}")
}

/// A stream of `N` partitions.
pub(crate) struct Partitioned {
    pub(crate) name: Arc<str>,
    /// Partition `n` is `parts[n]`.
    pub(crate) parts: Vec<Arc<Stream>>,
    /// The configured key property, looked at before the message group.
    key_property: Option<String>,
    /// Where the next keyless publish goes.
    round_robin: AtomicU64,
}

impl Partitioned {
    pub(crate) fn new(
        name: &str,
        parts: Vec<Arc<Stream>>,
        key_property: Option<String>,
    ) -> Partitioned {
        Partitioned {
            name: Arc::from(name),
            parts,
            key_property,
            round_robin: AtomicU64::new(0),
        }
    }

    /// The partition `message` goes to (see the module docs).
    pub(crate) fn route(&self, message: &Message) -> &Arc<Stream> {
        let n = self.parts.len().max(1) as u64;
        let at = match self.key(message) {
            Some(key) => u64::from(murmur3_32(key.as_bytes(), HASH_SEED)) % n,
            None => self.round_robin.fetch_add(1, Ordering::Relaxed) % n,
        };
        // `at < parts.len()` whenever there are parts; a configuration
        // never has none (partitions >= 1).
        &self.parts[at as usize % self.parts.len()]
    }

    fn key(&self, message: &Message) -> Option<String> {
        let configured = self
            .key_property
            .as_deref()
            .and_then(|k| message.properties.get(k))
            .map(|v| v.to_text());
        configured.or_else(|| message.group_id.clone())
    }
}

/// MurmurHash3, x86 32-bit variant.
pub(crate) fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        let k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        h ^= k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, b) in tail.iter().enumerate() {
            k |= u32::from(*b) << (8 * i);
        }
        h ^= k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[cfg(test)]
mod tests {
    use super::murmur3_32;

    #[test]
    fn murmur3_matches_the_reference_vectors() {
        // SMHasher's MurmurHash3_x86_32 on well-known inputs.
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"hello", 0), 0x248b_fa47);
        assert_eq!(
            murmur3_32(b"The quick brown fox jumps over the lazy dog", 0),
            0x2e4f_f723
        );
        assert_eq!(murmur3_32(b"abc", 0), 0xb3dd_93fa);
    }
}
