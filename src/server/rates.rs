//! Message rates and journal sync latency over the last few seconds, for
//! the admin API's overview.
//!
//! One timer ([`spawn_sampler`]) copies the core's message totals and the
//! journal's sync-latency histogram once a second into a short ring; a
//! reader divides the difference between the oldest and the newest sample
//! by the time between them. Publishing, delivering and syncing pay only
//! the atomic adds they already make; the ring's lock is taken once a
//! second by the timer and once per overview request.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rosetta_core::TrafficTotals;
use rosetta_store::LatencyHistogram;
use tokio::sync::watch;

use crate::Shared;

/// How often the timer samples.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Samples kept: the window is this many minus one sample periods (10 s).
const SAMPLES_KEPT: usize = 11;

struct Sample {
    at: Instant,
    traffic: TrafficTotals,
    sync_latency: LatencyHistogram,
}

/// The ring of recent samples.
#[derive(Default)]
pub(crate) struct RateWindow {
    samples: parking_lot::Mutex<VecDeque<Sample>>,
}

/// What the last window saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecentActivity {
    /// Seconds between the oldest and the newest sample (0 until two
    /// samples exist).
    pub window_s: f64,
    /// Publishes accepted per second.
    pub published_per_s: f64,
    /// Deliveries to consumers per second.
    pub delivered_per_s: f64,
    /// Acknowledgements per second.
    pub acknowledged_per_s: f64,
    /// Journal syncs in the window.
    pub syncs: u64,
    /// Median sync time in the window, microseconds (a bucket's upper
    /// bound: within a factor of two); `None` without syncs.
    pub sync_p50_us: Option<u64>,
    /// 99th percentile sync time, likewise.
    pub sync_p99_us: Option<u64>,
}

impl RateWindow {
    fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock();
        if samples.len() == SAMPLES_KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Rates and latencies between the oldest and the newest sample.
    pub(crate) fn recent(&self) -> RecentActivity {
        let samples = self.samples.lock();
        let (Some(first), Some(last)) = (samples.front(), samples.back()) else {
            return RecentActivity::default();
        };
        let window_s = last.at.duration_since(first.at).as_secs_f64();
        let per_s = |now: u64, then: u64| {
            if window_s > 0.0 {
                now.saturating_sub(then) as f64 / window_s
            } else {
                0.0
            }
        };
        let (a, b) = (&first.traffic, &last.traffic);
        let syncs = last.sync_latency.since(&first.sync_latency);
        RecentActivity {
            window_s,
            published_per_s: per_s(b.published, a.published),
            delivered_per_s: per_s(b.delivered, a.delivered),
            acknowledged_per_s: per_s(b.acknowledged, a.acknowledged),
            syncs: syncs.count(),
            sync_p50_us: syncs.quantile_us(0.5),
            sync_p99_us: syncs.quantile_us(0.99),
        }
    }
}

fn sample(shared: &Shared) {
    shared.rates.push(Sample {
        at: Instant::now(),
        traffic: shared.core.traffic(),
        sync_latency: shared.store.stats().sync_latency,
    });
}

/// Samples every [`SAMPLE_EVERY`] until the broker stops accepting or is
/// gone.
pub(crate) fn spawn_sampler(shared: &Arc<Shared>, stopping: watch::Receiver<bool>) {
    crate::periodic::spawn(shared, SAMPLE_EVERY, stopping, sample);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, s: u64, published: u64, delivered: u64) -> Sample {
        Sample {
            at: base + Duration::from_secs(s),
            traffic: TrafficTotals {
                published,
                delivered,
                acknowledged: delivered / 2,
            },
            sync_latency: LatencyHistogram::default(),
        }
    }

    #[test]
    fn rates_divide_the_window_and_old_samples_fall_out() {
        let w = RateWindow::default();
        assert_eq!(w.recent(), RecentActivity::default());
        let base = Instant::now();
        w.push(at(base, 0, 100, 0));
        assert_eq!(w.recent().published_per_s, 0.0, "one sample: no window");
        w.push(at(base, 2, 300, 40));
        let r = w.recent();
        assert_eq!(r.window_s, 2.0);
        assert_eq!(r.published_per_s, 100.0);
        assert_eq!(r.delivered_per_s, 20.0);
        assert_eq!(r.acknowledged_per_s, 10.0);
        assert_eq!(r.sync_p50_us, None);
        for s in 3..=20 {
            w.push(at(base, s, 300, 40));
        }
        // Only the last SAMPLES_KEPT remain, all with the same totals.
        let r = w.recent();
        assert_eq!(r.window_s, (SAMPLES_KEPT - 1) as f64);
        assert_eq!(r.published_per_s, 0.0);
    }
}
