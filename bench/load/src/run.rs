//! What every scenario shares: the broker under test, the count of
//! messages consumed so far, and the supervisor that ends a run when all
//! messages arrived, or reports a stall or a timeout instead of hanging.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::procfs::{Broker, ProcError};
use crate::stats::Report;

/// The broker under test.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Name shown in reports ("rosetta", "mosquitto", ...).
    pub(crate) name: String,
    pub(crate) proc: Option<Broker>,
    /// No message received for this long ends the run with an error.
    pub(crate) stall: Duration,
    /// Longest a run may take.
    pub(crate) timeout: Duration,
    /// Producers stop after this long even if they have not sent their
    /// count; the run then waits for what was sent.
    pub(crate) duration: Option<Duration>,
}

impl Target {
    /// A TCP connection with Nagle off: the benchmarks measure the broker,
    /// not 40 ms delayed-ACK stalls.
    pub(crate) async fn connect(&self) -> std::io::Result<TcpStream> {
        let s = TcpStream::connect((self.host.as_str(), self.port)).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    /// Whether a producer that started at `started` should stop sending.
    pub(crate) fn send_time_over(&self, started: Instant) -> bool {
        self.duration.is_some_and(|d| started.elapsed() >= d)
    }

    pub(crate) fn cpu_us(&self) -> Result<Option<u64>, ProcError> {
        self.proc.as_ref().map(Broker::cpu_us).transpose()
    }
}

/// Messages consumed so far across all consumers, and the signal that the
/// run is over (all arrived, stalled, or timed out).
#[derive(Debug)]
pub(crate) struct Tally {
    received: AtomicU64,
    expected: AtomicU64,
    done_tx: watch::Sender<bool>,
}

impl Tally {
    pub(crate) fn new(expected: u64) -> Arc<Self> {
        let (done_tx, _) = watch::channel(false);
        Arc::new(Self {
            received: AtomicU64::new(0),
            expected: AtomicU64::new(expected),
            done_tx,
        })
    }

    /// Counts `n` received messages; the last one ends the run.
    pub(crate) fn add(&self, n: u64) {
        let now = self.received.fetch_add(n, Ordering::Relaxed) + n;
        if now >= self.expected() {
            self.finish();
        }
    }

    pub(crate) fn expected(&self) -> u64 {
        self.expected.load(Ordering::Relaxed)
    }

    /// Lowers the expected count to what producers actually sent when they
    /// stopped early (`--duration-s`).
    pub(crate) fn set_expected(&self, n: u64) {
        self.expected.store(n, Ordering::Relaxed);
        if self.received() >= n {
            self.finish();
        }
    }

    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    pub(crate) fn finish(&self) {
        self.done_tx.send_replace(true);
    }

    pub(crate) fn is_done(&self) -> bool {
        *self.done_tx.borrow()
    }

    /// Resolves once the run is over.
    pub(crate) async fn done(&self) {
        let mut rx = self.done_tx.subscribe();
        // Err only if the sender is gone, and it lives in self.
        let _ = rx.wait_for(|d| *d).await;
    }
}

/// Waits until every expected message arrived. Returns an error text when
/// nothing arrived for `target.stall` or the whole run exceeded
/// `target.timeout`; either way the run is over when this returns.
pub(crate) async fn supervise(tally: &Tally, target: &Target, started: Instant) -> Option<String> {
    let tick = Duration::from_millis(100);
    let mut last = tally.received();
    let mut last_change = Instant::now();
    loop {
        tokio::select! {
            () = tally.done() => return None,
            () = tokio::time::sleep(tick) => {}
        }
        let now = tally.received();
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        let error = if last_change.elapsed() >= target.stall {
            Some(format!(
                "stalled: nothing received for {} s at {now}/{}",
                target.stall.as_secs(),
                tally.expected()
            ))
        } else if started.elapsed() >= target.timeout {
            Some(format!(
                "timeout after {} s at {now}/{}",
                target.timeout.as_secs(),
                tally.expected()
            ))
        } else {
            None
        };
        if error.is_some() {
            tally.finish();
            return error;
        }
    }
}

/// A name unique to this run, so a queue never holds a previous run's
/// messages.
pub(crate) fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tally_ends_at_expected() {
        let t = Tally::new(3);
        t.add(2);
        assert!(!t.is_done());
        t.add(1);
        assert!(t.is_done());
        let t = Tally::new(10);
        t.add(4);
        t.set_expected(5);
        assert!(!t.is_done());
        t.set_expected(4);
        assert!(t.is_done());
        tokio::time::timeout(Duration::from_secs(1), t.done())
            .await
            .expect("done resolves");
    }
}

/// What a client's run measured, between the first send and the end.
#[derive(Debug, Default)]
pub(crate) struct Measured {
    pub(crate) elapsed: Duration,
    pub(crate) latencies_ns: Vec<u64>,
    pub(crate) broker_cpu_us: Option<u64>,
    pub(crate) load_cpu_us: Option<u64>,
    pub(crate) error: Option<String>,
    /// Client-specific fields for the report.
    pub(crate) extra: Vec<(&'static str, serde_json::Value)>,
}

impl Measured {
    /// The report of `scenario`: `params` (the scenario's settings) come
    /// first among the extra fields, then the client's own.
    pub(crate) fn into_report(
        self,
        scenario: String,
        target: &Target,
        tally: &Tally,
        params: Vec<(&'static str, serde_json::Value)>,
    ) -> Report {
        Report {
            scenario,
            broker: target.name.clone(),
            expected: tally.expected(),
            received: tally.received(),
            elapsed: self.elapsed,
            latencies_ns: self.latencies_ns,
            broker_cpu_us: self.broker_cpu_us,
            load_cpu_us: self.load_cpu_us,
            extra: params.into_iter().chain(self.extra).collect(),
            error: self.error,
        }
    }
}

/// CPU counters and the clock at the first send.
pub(crate) struct Meter {
    /// The first send: the run's clock starts here.
    pub(crate) started: Instant,
    cpu0: Option<u64>,
    load0: Option<u64>,
}

impl Meter {
    pub(crate) fn start(target: &Target) -> anyhow::Result<Self> {
        let load0 = crate::procfs::self_cpu_us();
        let cpu0 = target.cpu_us()?;
        Ok(Self {
            started: Instant::now(),
            cpu0,
            load0,
        })
    }

    /// Elapsed time and the broker's and our CPU time since `start`.
    pub(crate) fn stop(&self, target: &Target) -> anyhow::Result<Measured> {
        let elapsed = self.started.elapsed();
        let cpu1 = target.cpu_us()?;
        let load1 = crate::procfs::self_cpu_us();
        Ok(Measured {
            elapsed,
            broker_cpu_us: self.cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
            load_cpu_us: self.load0.zip(load1).map(|(a, b)| b.saturating_sub(a)),
            ..Measured::default()
        })
    }
}
