//! Consumer groups' committed offsets, kept in the journal.
//!
//! A group's committed offset is the offset its next reader starts from:
//! every offset below it was acknowledged. It is journaled as a `State`
//! record under `$stream/<stream>/<group>` (8 bytes, little-endian), the
//! way dedup keeps its per-queue state, so a restart finds it in the
//! journal's replay. A newer record for the key replaces the older, and
//! compaction keeps only the current one.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use rosetta_store::{Completion, Record};

use crate::Journal;

/// Prefix of the journal state keys of consumer groups.
pub(crate) const GROUP_KEY_PREFIX: &str = "$stream/";

/// The journal key of `group` of `stream`.
pub(super) fn key(stream: &str, group: &str) -> String {
    format!("{GROUP_KEY_PREFIX}{stream}/{group}")
}

/// Every group's committed offset, and the journal that keeps them.
pub(crate) struct Groups {
    journal: Arc<dyn Journal>,
    committed: Mutex<HashMap<String, u64>>,
}

impl Groups {
    pub(crate) fn new(journal: Arc<dyn Journal>) -> Groups {
        Groups {
            journal,
            committed: Mutex::new(HashMap::new()),
        }
    }

    /// Takes the groups out of the journal's replayed state.
    pub(crate) fn restore<'a>(&self, state: impl Iterator<Item = (&'a String, &'a Bytes)>) {
        let mut c = self.committed.lock();
        for (k, v) in state {
            if !k.starts_with(GROUP_KEY_PREFIX) {
                continue;
            }
            match <[u8; 8]>::try_from(v.as_ref()) {
                Ok(b) => {
                    c.insert(k.clone(), u64::from_le_bytes(b));
                }
                Err(_) => tracing::warn!(key = %k, "stream group offset of a wrong size ignored"),
            }
        }
    }

    /// The group's committed offset, if the group exists.
    pub(crate) fn committed(&self, stream: &str, group: &str) -> Option<u64> {
        self.committed.lock().get(&key(stream, group)).copied()
    }

    /// Every group's journal key (`$stream/<stream>/<group>`) and
    /// committed offset, sorted by key: one copy of the map for a batch of
    /// figures (`stats`).
    pub(crate) fn all_sorted(&self) -> Vec<(String, u64)> {
        let mut all: Vec<(String, u64)> = self
            .committed
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        all.sort_unstable();
        all
    }

    /// Commits `offset` for the group (creating it), durably in the
    /// journal's next batch; `done` runs once it is durable. Never moves it
    /// back unless `reset`. `false` (and `done` dropped, never run): the
    /// offset did not move, so nothing was journaled.
    pub(crate) fn commit(
        &self,
        stream: &str,
        group: &str,
        offset: u64,
        reset: bool,
        done: Option<Completion>,
    ) -> bool {
        let k = key(stream, group);
        {
            let mut c = self.committed.lock();
            let old = c.get(&k).copied();
            if old == Some(offset) || (!reset && old.is_some_and(|o| o > offset)) {
                return false;
            }
            c.insert(k.clone(), offset);
        }
        self.journal.append(
            vec![Record::State {
                key: k,
                value: Some(Bytes::copy_from_slice(&offset.to_le_bytes())),
            }],
            done,
        );
        true
    }
}
