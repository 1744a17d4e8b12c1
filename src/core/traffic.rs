//! Broker-wide message counters: publishes accepted, deliveries made and
//! acknowledgements taken, all queues and sessions together.
//!
//! Each is one relaxed atomic add where the per-queue statistics are
//! already updated (under the queue's lock, which orders nothing here: the
//! counts are only ever read as totals). Rates are not computed here: the
//! server samples the totals on one timer and divides the differences by
//! the time between samples, so nothing per message reads a clock.
//!
//! The counters are kept per thread, in [`SHARDS`] slots a cache line
//! apart, and summed when read: every message bumps two or three of them,
//! from whichever worker thread handles its publisher or subscriber, and
//! one shared cache line would travel between the cores on each (issue
//! 20). A reading sums a handful of slots, a few times a second.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Slots the counters are spread over; threads share them round-robin
/// once there are more threads than slots.
const SHARDS: usize = 8;

/// One thread's share of the counters, alone on its cache line (two
/// lines: adjacent-line prefetch pairs them on x86).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    published: AtomicU64,
    delivered: AtomicU64,
    acknowledged: AtomicU64,
}

/// The counters the core adds to.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    shards: [Shard; SHARDS],
}

/// The slot of the calling thread: assigned on first use, round-robin.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<Option<usize>> = const { Cell::new(None) };
    }
    INDEX.with(|i| match i.get() {
        Some(index) => index,
        None => {
            let index = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
            i.set(Some(index));
            index
        }
    })
}

impl Traffic {
    fn shard(&self) -> &Shard {
        &self.shards[shard_index()]
    }

    pub(crate) fn published(&self) {
        self.shard().published.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn delivered(&self) {
        self.shard().delivered.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn acknowledged(&self) {
        self.shard().acknowledged.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn totals(&self) -> TrafficTotals {
        let sum = |count: fn(&Shard) -> &AtomicU64| {
            self.shards
                .iter()
                .map(|s| count(s).load(Ordering::Relaxed))
                .fold(0u64, u64::wrapping_add)
        };
        TrafficTotals {
            published: sum(|s| &s.published),
            delivered: sum(|s| &s.delivered),
            acknowledged: sum(|s| &s.acknowledged),
        }
    }
}

/// The counters' values at one moment, since the core started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficTotals {
    /// Clients' publishes and sends accepted (once per publish, however
    /// many queues it reached; a transaction's at its commit). The
    /// broker's own (dead letters, wills, moves, `$SYS`) are not counted.
    pub published: u64,
    /// Messages handed to consumers, redeliveries included.
    pub delivered: u64,
    /// Deliveries settled as consumed (acknowledged, or settled on
    /// sending for consumers that do not acknowledge).
    pub acknowledged: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts from many threads, more than there are slots, add up.
    #[test]
    fn counts_from_many_threads_add_up() {
        let traffic = std::sync::Arc::new(Traffic::default());
        let threads: Vec<_> = (0..2 * SHARDS + 3)
            .map(|_| {
                let t = std::sync::Arc::clone(&traffic);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        t.published();
                        t.delivered();
                        t.delivered();
                        t.acknowledged();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("counting thread");
        }
        let n = (2 * SHARDS + 3) as u64 * 1000;
        assert_eq!(
            traffic.totals(),
            TrafficTotals {
                published: n,
                delivered: 2 * n,
                acknowledged: n,
            }
        );
    }
}
