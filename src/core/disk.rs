//! The disk limit of producer flow control: producers are held back while
//! the filesystem holding the data directory has less free space than a
//! configured minimum, the way RabbitMQ's `disk_free_limit` and Artemis's
//! `max-disk-usage` do. A journal that fills its disk fails closed (every
//! later append is refused), so holding producers back early is what keeps
//! the broker serving: consumers still drain, compaction still frees
//! segments, and producers resume once there is room again.
//!
//! The housekeeping thread samples free space at most once per
//! [`DISK_CHECK_INTERVAL`], through the journal's [`Storage`] (one
//! `statvfs` on a real disk; a simulated disk reports what its test sets);
//! the hot path reads one atomic.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rosetta_store::Storage;

/// How often free space is sampled: a producer fills at most this much
/// time's worth of writes past the limit.
pub(crate) const DISK_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Where to watch, and the free space below which producers wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFreeMin {
    /// A directory on the watched filesystem (the data directory).
    pub dir: PathBuf,
    /// Free bytes (available to the broker's user) below which producers
    /// are held back.
    pub bytes: u64,
}

/// Free-space state, shared by the housekeeping thread and the sessions.
#[derive(Debug)]
pub(crate) struct DiskWatch {
    limit: Option<DiskFreeMin>,
    storage: Arc<dyn Storage>,
    low: AtomicBool,
    /// Last sampled free bytes; `u64::MAX` until sampled or unwatched.
    free: AtomicU64,
    last_check: Mutex<Option<Instant>>,
}

impl DiskWatch {
    pub(crate) fn new(limit: Option<DiskFreeMin>, storage: Arc<dyn Storage>) -> Self {
        let watch = Self {
            limit,
            storage,
            low: AtomicBool::new(false),
            free: AtomicU64::new(u64::MAX),
            last_check: Mutex::new(None),
        };
        watch.check(Instant::now());
        watch
    }

    /// Whether producers should wait for disk space.
    pub(crate) fn is_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// Free bytes at the last sample, if the disk is watched.
    pub(crate) fn free_bytes(&self) -> Option<u64> {
        self.limit
            .as_ref()
            .map(|_| self.free.load(Ordering::Relaxed))
            .filter(|f| *f != u64::MAX)
    }

    /// Samples free space if the last sample is older than
    /// [`DISK_CHECK_INTERVAL`].
    pub(crate) fn check_if_due(&self, now: Instant) {
        let due = self
            .last_check
            .lock()
            .is_none_or(|t| now.duration_since(t) >= DISK_CHECK_INTERVAL);
        if due {
            self.check(now);
        }
    }

    fn check(&self, now: Instant) {
        let Some(limit) = &self.limit else { return };
        *self.last_check.lock() = Some(now);
        let free = match self.storage.free_bytes(&limit.dir) {
            Ok(free) => free,
            Err(e) => {
                // Unknown is not "full": keep the last verdict, say why.
                tracing::warn!(dir = %limit.dir.display(), error = %e, "cannot read free disk space");
                return;
            }
        };
        self.free.store(free, Ordering::Relaxed);
        let low = free < limit.bytes;
        if low != self.low.swap(low, Ordering::Relaxed) {
            if low {
                tracing::warn!(free, limit = limit.bytes, dir = %limit.dir.display(), "disk space below the limit: producers are held back");
            } else {
                tracing::info!(
                    free,
                    limit = limit.bytes,
                    "disk space back above the limit: producers resume"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rosetta_store::sim::SimDisk;
    use rosetta_store::OsStorage;

    use super::*;

    fn watch(bytes: u64) -> DiskWatch {
        DiskWatch::new(
            Some(DiskFreeMin {
                dir: std::env::temp_dir(),
                bytes,
            }),
            Arc::new(OsStorage),
        )
    }

    #[test]
    fn producers_wait_while_the_journal_disk_is_short_and_resume_when_it_is_not() {
        let disk = SimDisk::new(7);
        let dir = PathBuf::from("/data");
        disk.create_dir_all(&dir).expect("mkdir");
        let w = DiskWatch::new(
            Some(DiskFreeMin { dir, bytes: 1_000 }),
            Arc::new(disk.clone()),
        );
        assert!(!w.is_low());
        // Sampled once at creation; the next sample is due an interval on.
        let start = Instant::now() + DISK_CHECK_INTERVAL;
        disk.set_free_bytes(999);
        w.check_if_due(start);
        assert!(w.is_low(), "one byte short of the limit");
        assert_eq!(w.free_bytes(), Some(999));
        disk.set_free_bytes(1_000);
        w.check_if_due(start + DISK_CHECK_INTERVAL);
        assert!(!w.is_low(), "at the limit again");
    }

    #[test]
    fn below_the_limit_is_low_above_it_is_not() {
        let never = watch(0);
        assert!(!never.is_low());
        let free = never.free_bytes().expect("sampled");
        assert!(free > 0);
        assert!(watch(u64::MAX).is_low(), "no disk has u64::MAX bytes free");
        assert!(!watch(free / 2).is_low());
    }

    #[test]
    fn unwatched_is_never_low_and_reports_nothing() {
        let w = DiskWatch::new(None, Arc::new(OsStorage));
        w.check_if_due(Instant::now());
        assert!(!w.is_low());
        assert_eq!(w.free_bytes(), None);
    }

    #[test]
    fn an_unreadable_directory_keeps_the_last_verdict() {
        let w = DiskWatch::new(
            Some(DiskFreeMin {
                dir: PathBuf::from("/nonexistent/rosetta-disk-watch"),
                bytes: u64::MAX,
            }),
            Arc::new(OsStorage),
        );
        assert!(!w.is_low(), "never sampled: not assumed full");
        assert_eq!(w.free_bytes(), None);
    }

    #[test]
    fn samples_at_most_once_per_interval() {
        let w = watch(0);
        let first = *w.last_check.lock();
        let start = first.expect("checked at creation");
        w.check_if_due(start + DISK_CHECK_INTERVAL / 2);
        assert_eq!(*w.last_check.lock(), first, "not due yet");
        w.check_if_due(start + DISK_CHECK_INTERVAL);
        assert_eq!(*w.last_check.lock(), Some(start + DISK_CHECK_INTERVAL));
    }
}
