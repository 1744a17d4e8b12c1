//! Broker-wide message counters: publishes accepted, deliveries made and
//! acknowledgements taken, all queues and sessions together.
//!
//! Each is one relaxed atomic add where the per-queue statistics are
//! already updated (under the queue's lock, which orders nothing here: the
//! counts are only ever read as totals). Rates are not computed here: the
//! server samples the totals on one timer and divides the differences by
//! the time between samples, so nothing per message reads a clock.

use std::sync::atomic::{AtomicU64, Ordering};

/// The counters the core adds to.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    published: AtomicU64,
    delivered: AtomicU64,
    acknowledged: AtomicU64,
}

impl Traffic {
    pub(crate) fn published(&self) {
        self.published.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn delivered(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn acknowledged(&self) {
        self.acknowledged.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn totals(&self) -> TrafficTotals {
        TrafficTotals {
            published: self.published.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
            acknowledged: self.acknowledged.load(Ordering::Relaxed),
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
