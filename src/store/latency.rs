//! How long the journal's `fdatasync` calls take: a fixed-bucket
//! histogram the writer thread adds one sample to per sync.
//!
//! The buckets double from 16 µs to about 17 s (plus one for anything
//! slower), so recording is an index from the leading zeros of the
//! duration and two relaxed atomic adds: no lock, nothing allocated, and
//! readers ([`SyncLatency::snapshot`]) never hold the writer up. A
//! quantile read from buckets is the upper bound of the bucket it falls
//! in: within a factor of two, which is what an operator needs to tell a
//! 100 µs disk from a 20 ms one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bound of the first bucket, as a power of two of microseconds.
const FIRST_BOUND_LOG2_US: u32 = 4;
/// Buckets with a finite upper bound: 2^4 µs … 2^24 µs (16 µs … 16.8 s).
pub const SYNC_LATENCY_BOUNDS: usize = 21;
/// All buckets, the last one unbounded.
const BUCKETS: usize = SYNC_LATENCY_BOUNDS + 1;

/// The upper bound of finite bucket `i`, in microseconds.
pub fn bucket_bound_us(i: usize) -> u64 {
    1u64 << (FIRST_BOUND_LOG2_US as usize + i)
}

/// The histogram the writer records into.
#[derive(Default)]
pub(crate) struct SyncLatency {
    counts: [AtomicU64; BUCKETS],
    sum_us: AtomicU64,
}

impl SyncLatency {
    /// Adds one sync that took `took`.
    pub(crate) fn record(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn snapshot(&self) -> LatencyHistogram {
        LatencyHistogram {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_us: self.sum_us.load(Ordering::Relaxed),
        }
    }
}

/// The bucket of a duration of `us` microseconds: the first whose upper
/// bound is at least `us`.
fn bucket_of(us: u64) -> usize {
    // ceil(log2(us)) without floats: the bit length of us - 1.
    let log2_ceil = u64::BITS - us.saturating_sub(1).leading_zeros();
    (log2_ceil.saturating_sub(FIRST_BOUND_LOG2_US) as usize).min(BUCKETS - 1)
}

/// A copy of the histogram's counts, per bucket (not cumulative).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Samples per bucket; bucket `i < SYNC_LATENCY_BOUNDS` holds those up
    /// to [`bucket_bound_us`]`(i)`, the last one the slower ones.
    pub counts: Vec<u64>,
    /// Sum of all samples, microseconds.
    pub sum_us: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            sum_us: 0,
        }
    }
}

impl LatencyHistogram {
    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The samples recorded since `earlier` (a snapshot of the same
    /// histogram taken before): what happened in between.
    pub fn since(&self, earlier: &LatencyHistogram) -> LatencyHistogram {
        LatencyHistogram {
            counts: self
                .counts
                .iter()
                .zip(earlier.counts.iter().chain(std::iter::repeat(&0)))
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
        }
    }

    /// The upper bound, in microseconds, of the bucket holding quantile
    /// `q` (0 to 1); `None` without samples, `u64::MAX` if it is the
    /// unbounded bucket.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        // The rank of the sample at q, from 1: ceil(q * total), at least 1.
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(if i < SYNC_LATENCY_BOUNDS {
                    bucket_bound_us(i)
                } else {
                    u64::MAX
                });
            }
        }
        Some(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_land_in_the_first_bucket_that_bounds_them() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(16), 0);
        assert_eq!(bucket_of(17), 1);
        assert_eq!(bucket_of(32), 1);
        assert_eq!(bucket_of(1000), 6); // 1024 µs
        assert_eq!(bucket_bound_us(6), 1024);
        assert_eq!(bucket_of(1 << 24), SYNC_LATENCY_BOUNDS - 1);
        assert_eq!(bucket_of((1 << 24) + 1), SYNC_LATENCY_BOUNDS);
        assert_eq!(bucket_of(u64::MAX), SYNC_LATENCY_BOUNDS);
    }

    #[test]
    fn quantiles_come_from_the_counts_and_windows_subtract() {
        let h = SyncLatency::default();
        assert_eq!(h.snapshot().quantile_us(0.5), None);
        for _ in 0..98 {
            h.record(Duration::from_micros(100)); // bucket 128 µs
        }
        let before = h.snapshot();
        h.record(Duration::from_millis(3)); // 4096 µs
        h.record(Duration::from_secs(60)); // unbounded
        let all = h.snapshot();
        assert_eq!(all.count(), 100);
        assert_eq!(all.quantile_us(0.5), Some(128));
        assert_eq!(all.quantile_us(0.99), Some(4096));
        assert_eq!(all.quantile_us(1.0), Some(u64::MAX));
        assert_eq!(all.sum_us, 98 * 100 + 3000 + 60_000_000);
        let window = all.since(&before);
        assert_eq!(window.count(), 2);
        assert_eq!(window.quantile_us(0.5), Some(4096));
        assert_eq!(window.sum_us, 3000 + 60_000_000);
    }
}
