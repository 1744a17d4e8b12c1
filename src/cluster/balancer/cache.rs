//! Stickiness: a key's chosen target, remembered for `cache_timeout_ms`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Most keys remembered: a flood of distinct client ids must not grow the
/// cache without bound; past it the oldest entry is forgotten first.
pub const CACHE_ENTRIES_MAX: usize = 100_000;

#[derive(Debug, Default)]
pub(crate) struct Cache {
    timeout: Duration,
    entries: HashMap<String, (String, Instant)>,
    /// Insertion order, for eviction past [`CACHE_ENTRIES_MAX`]; may hold
    /// keys already replaced or expired (skipped when popped).
    order: VecDeque<(String, Instant)>,
}

impl Cache {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            ..Self::default()
        }
    }

    /// The target remembered for `key`, if not expired.
    pub(crate) fn get(&mut self, key: &str, now: Instant) -> Option<&str> {
        if self.timeout.is_zero() {
            return None;
        }
        match self.entries.get(key) {
            Some((_, until)) if *until > now => self.entries.get(key).map(|(t, _)| t.as_str()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    pub(crate) fn put(&mut self, key: &str, target: &str, now: Instant) {
        self.put_until(key, target, now + self.timeout);
    }

    /// Remembers `target` for `key` until `until` (an entry another node
    /// made, learned from etcd).
    pub(crate) fn put_until(&mut self, key: &str, target: &str, until: Instant) {
        if self.timeout.is_zero() {
            return;
        }
        while self.entries.len() >= CACHE_ENTRIES_MAX && !self.entries.contains_key(key) {
            let Some((old, at)) = self.order.pop_front() else {
                break;
            };
            // Only the entry this order record was made for.
            if self.entries.get(&old).is_some_and(|(_, u)| *u == at) {
                self.entries.remove(&old);
            }
        }
        self.entries
            .insert(key.to_owned(), (target.to_owned(), until));
        self.order.push_back((key.to_owned(), until));
        // The order queue holds at most one record per insert; trim records
        // of replaced entries so it stays within twice the bound.
        if self.order.len() > 2 * CACHE_ENTRIES_MAX {
            let entries = &self.entries;
            self.order
                .retain(|(k, at)| entries.get(k).is_some_and(|(_, u)| u == at));
        }
    }

    pub(crate) fn forget(&mut self, key: &str) {
        self.entries.remove(key);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_for_the_timeout_only() {
        let t0 = Instant::now();
        let mut cache = Cache::new(Duration::from_millis(100));
        cache.put("k", "b", t0);
        assert_eq!(cache.get("k", t0 + Duration::from_millis(99)), Some("b"));
        assert_eq!(cache.get("k", t0 + Duration::from_millis(100)), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_zero_timeout_remembers_nothing() {
        let t0 = Instant::now();
        let mut cache = Cache::new(Duration::ZERO);
        cache.put("k", "b", t0);
        assert_eq!(cache.get("k", t0), None);
    }

    #[test]
    fn the_cache_is_bounded() {
        let t0 = Instant::now();
        let mut cache = Cache::new(Duration::from_secs(60));
        for i in 0..CACHE_ENTRIES_MAX + 10 {
            cache.put(&format!("k{i}"), "a", t0);
        }
        assert_eq!(cache.len(), CACHE_ENTRIES_MAX);
        assert_eq!(cache.get("k0", t0), None, "the oldest went first");
        assert_eq!(
            cache.get(&format!("k{}", CACHE_ENTRIES_MAX + 9), t0),
            Some("a")
        );
    }
}
