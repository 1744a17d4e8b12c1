//! Latency percentiles, the publish timestamp carried in each payload, and
//! the one-line report every scenario prints.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Bytes at the start of each payload holding the publish time.
pub(crate) const STAMP_BYTES: usize = 8;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since this process's first call. Producers and consumers run
/// in the same process, so a monotonic clock is enough for end-to-end
/// latency and no wall-clock skew enters.
pub(crate) fn now_ns() -> u64 {
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A payload of `size` bytes (at least [`STAMP_BYTES`]) stamped with now.
pub(crate) fn stamped_payload(size: usize) -> Vec<u8> {
    let mut p = vec![b'x'; size.max(STAMP_BYTES)];
    p[..STAMP_BYTES].copy_from_slice(&now_ns().to_le_bytes());
    p
}

/// Stamps a payload made by [`stamped_payload`] with now again, so that a
/// producer reuses one buffer instead of making one per message.
pub(crate) fn restamp(payload: &mut [u8]) {
    if let Some(stamp) = payload.get_mut(..STAMP_BYTES) {
        stamp.copy_from_slice(&now_ns().to_le_bytes());
    }
}

/// When a payload made by [`stamped_payload`] was published, on the
/// [`now_ns`] clock; `None` if the payload is too short to carry a stamp.
pub(crate) fn stamp_ns(payload: &[u8]) -> Option<u64> {
    let stamp: [u8; STAMP_BYTES] = payload.get(..STAMP_BYTES)?.try_into().ok()?;
    Some(u64::from_le_bytes(stamp))
}

/// Latency in ns of a payload made by [`stamped_payload`]; `None` if the
/// payload is too short to carry a stamp.
pub(crate) fn latency_ns(payload: &[u8]) -> Option<u64> {
    Some(now_ns().saturating_sub(stamp_ns(payload)?))
}

/// Nearest-rank percentile (`p` in 0..=100) of sorted samples.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    // Nearest rank: the smallest value with at least p% of samples <= it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// What one scenario measured.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) scenario: String,
    pub(crate) broker: String,
    /// Messages the consumers were expected to receive.
    pub(crate) expected: u64,
    /// Messages the consumers received (deliveries, for fan-out).
    pub(crate) received: u64,
    pub(crate) elapsed: Duration,
    /// End-to-end latency samples in ns (unsorted).
    pub(crate) latencies_ns: Vec<u64>,
    /// Broker CPU time over the run, µs; `None` without `--broker-pid`.
    pub(crate) broker_cpu_us: Option<u64>,
    /// The load generator's own CPU time over the run, µs.
    pub(crate) load_cpu_us: Option<u64>,
    /// Extra scenario-specific fields for the JSON line.
    pub(crate) extra: Vec<(&'static str, serde_json::Value)>,
    /// First error seen, if the run did not complete.
    pub(crate) error: Option<String>,
}

impl Report {
    pub(crate) fn msg_per_s(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.received as f64 / s
        } else {
            0.0
        }
    }

    pub(crate) fn cpu_us_per_msg(&self) -> Option<f64> {
        let cpu = self.broker_cpu_us?;
        (self.received > 0).then(|| cpu as f64 / self.received as f64)
    }

    /// Prints the JSON line (prefixed `RESULT `, for scripts) and a line for
    /// people.
    pub(crate) fn print(mut self) {
        self.latencies_ns.sort_unstable();
        let us = |p: f64| percentile(&self.latencies_ns, p).map(|ns| ns as f64 / 1000.0);
        let (p50, p99) = (us(50.0), us(99.0));
        let mut json = serde_json::json!({
            "scenario": self.scenario,
            "broker": self.broker,
            "expected": self.expected,
            "received": self.received,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "msg_per_s": self.msg_per_s(),
            "p50_us": p50,
            "p99_us": p99,
            // The tail around p99, for telling a few slow messages from a
            // slow one percent.
            "p90_us": us(90.0),
            "p999_us": us(99.9),
            "broker_cpu_us": self.broker_cpu_us,
            "cpu_us_per_msg": self.cpu_us_per_msg(),
            "load_cpu_us": self.load_cpu_us,
            "error": self.error,
        });
        if let Some(obj) = json.as_object_mut() {
            for (k, v) in &self.extra {
                obj.insert((*k).to_owned(), v.clone());
            }
        }
        println!("RESULT {json}");
        if self.extra.iter().any(|(k, _)| *k == "rss_per_conn_bytes") {
            // The idle scenario moves no messages and prints its own line.
            return;
        }
        let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
        println!(
            "{} on {}: {}/{} msgs in {:.2} s = {:.0} msg/s, p50 {} µs, p99 {} µs, broker CPU {} µs/msg{}",
            self.scenario,
            self.broker,
            self.received,
            self.expected,
            self.elapsed.as_secs_f64(),
            self.msg_per_s(),
            fmt(p50),
            fmt(p99),
            self.cpu_us_per_msg().map_or("-".to_owned(), |v| format!("{v:.1}")),
            self.error.as_ref().map_or(String::new(), |e| format!(" ERROR: {e}")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[7], 99.0), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
        // 10 samples: p99 is the largest, p50 the 5th.
        let v: Vec<u64> = (10..20).collect();
        assert_eq!(percentile(&v, 99.0), Some(19));
        assert_eq!(percentile(&v, 50.0), Some(14));
    }

    #[test]
    fn stamp_round_trip() {
        let p = stamped_payload(256);
        assert_eq!(p.len(), 256);
        std::thread::sleep(Duration::from_millis(2));
        let l = latency_ns(&p).expect("stamped");
        assert!(l >= 2_000_000, "latency {l} ns below the 2 ms slept");
        assert_eq!(latency_ns(&[1, 2, 3]), None);
    }

    #[test]
    fn rates() {
        let r = Report {
            received: 1000,
            elapsed: Duration::from_millis(500),
            broker_cpu_us: Some(3000),
            ..Report::default()
        };
        assert_eq!(r.msg_per_s(), 2000.0);
        assert_eq!(r.cpu_us_per_msg(), Some(3.0));
    }
}
