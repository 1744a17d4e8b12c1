//! `[store]`: the durable journal.

use std::time::Duration;

use serde::Deserialize;

/// When the journal calls `fdatasync`, and so what a producer's
/// acknowledgement promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SyncPolicy {
    /// Every commit is synced before it is acknowledged: an acknowledged
    /// message survives power loss. Group commit shares one sync among
    /// all writers waiting at the same time.
    EveryCommit,
    /// Commits are acknowledged once written to the OS; a sync runs every
    /// `sync_interval_ms`. A crash of the process loses nothing, a power
    /// loss or kernel crash loses up to that interval.
    Periodic,
}

/// The safe policy: an acknowledgement means the message is on disk.
pub const SYNC_POLICY_DEFAULT: SyncPolicy = SyncPolicy::EveryCommit;
/// Periodic sync interval: bounds what a power loss can take under
/// `periodic` to about one second of messages.
pub const SYNC_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// Segment file size: see [`rosetta_store::SEGMENT_SIZE_DEFAULT_BYTES`].
pub const SEGMENT_SIZE_BYTES_DEFAULT: u64 = rosetta_store::SEGMENT_SIZE_DEFAULT_BYTES;
/// Smallest segment: a segment must hold at least a few maximal records.
pub const SEGMENT_SIZE_MIN_BYTES: u64 = 64 * 1024;
/// Largest segment: record offsets within a segment stay below 2^30.
pub const SEGMENT_SIZE_MAX_BYTES: u64 = 1024 * 1024 * 1024;
/// Memory budget of queued messages: see
/// [`rosetta_core::MEMORY_BUDGET_BYTES_DEFAULT`].
pub const MEMORY_BUDGET_BYTES_DEFAULT: u64 = rosetta_core::MEMORY_BUDGET_BYTES_DEFAULT;
/// Smallest memory budget: enough for a window of in-flight messages.
pub const MEMORY_BUDGET_MIN_BYTES: u64 = 1024 * 1024;
/// Free disk space below which producers are held back: room for the
/// journal to roll to two more default-size segments and for compaction to
/// copy forward, so consumers and compaction can make room again.
pub const DISK_FREE_MIN_BYTES_DEFAULT: u64 = 2 * SEGMENT_SIZE_BYTES_DEFAULT;
/// How often compaction looks for dead segments: see
/// [`rosetta_store::COMPACTION_INTERVAL_DEFAULT`].
pub const COMPACTION_INTERVAL_MS_DEFAULT: u64 =
    rosetta_store::COMPACTION_INTERVAL_DEFAULT.as_millis() as u64;

/// A missing segment stops the start: losing acknowledged messages must be
/// a decision, not a side effect of restarting.
pub const ACCEPT_DATA_LOSS_DEFAULT: bool = false;

/// `[store]`: journal settings. The journal lives in `data_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `"every-commit"` (default) or `"periodic"`.
    pub sync: SyncPolicy,
    /// Interval between syncs under `periodic`, in milliseconds (unused
    /// under `every-commit`).
    pub sync_interval_ms: u64,
    /// Size at which a segment file is closed and a new one started.
    pub segment_size_bytes: u64,
    /// Payload bytes of queued messages held in memory before paging.
    pub memory_budget_bytes: u64,
    /// Interval between compaction passes, in milliseconds.
    pub compaction_interval_ms: u64,
    /// Producers are held back while the data directory's filesystem has
    /// fewer free bytes than this (0: never).
    pub disk_free_min_bytes: u64,
    /// Start even when journal segments are missing or cut short (or the
    /// manifest listing them is lost): the loss is logged and accepted.
    /// Off: the broker refuses to start and names what is missing.
    pub accept_data_loss: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            sync: SYNC_POLICY_DEFAULT,
            sync_interval_ms: SYNC_INTERVAL_MS_DEFAULT,
            segment_size_bytes: SEGMENT_SIZE_BYTES_DEFAULT,
            memory_budget_bytes: MEMORY_BUDGET_BYTES_DEFAULT,
            compaction_interval_ms: COMPACTION_INTERVAL_MS_DEFAULT,
            disk_free_min_bytes: DISK_FREE_MIN_BYTES_DEFAULT,
            accept_data_loss: ACCEPT_DATA_LOSS_DEFAULT,
        }
    }
}

impl StoreConfig {
    /// [`Self::sync_interval_ms`] as a duration.
    pub fn sync_interval(&self) -> Duration {
        Duration::from_millis(self.sync_interval_ms)
    }

    /// [`Self::compaction_interval_ms`] as a duration.
    pub fn compaction_interval(&self) -> Duration {
        Duration::from_millis(self.compaction_interval_ms)
    }
}
