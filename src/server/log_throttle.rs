//! Rate limits for log lines that a peer can trigger at will (refused
//! connections, failed TLS handshakes): a storm of them must not flood the
//! log, yet the operator must learn how many were left out.
//!
//! Each [`LogThrottle`] lets [`LOG_LINES_PER_WINDOW_MAX`] lines through per
//! [`LOG_WINDOW`] and counts the rest. The first line let through after
//! some were held back carries their count (`suppressed = N`), and
//! [`LogThrottle::take_suppressed`] hands over what is still counted (the
//! server reports it at shutdown), so no line is lost without a trace.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Lines of one kind logged per window at most: enough to see the pattern
/// (addresses, reasons) of a storm, few enough that it costs nothing.
pub(crate) const LOG_LINES_PER_WINDOW_MAX: u32 = 10;
/// The window: short enough that a new kind of trouble shows within
/// seconds of the last burst.
pub(crate) const LOG_WINDOW: Duration = Duration::from_secs(10);

/// A rate limit for one kind of log line.
#[derive(Debug, Default)]
pub(crate) struct LogThrottle {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    window_start: Option<Instant>,
    logged_in_window: u32,
    suppressed: u64,
}

impl LogThrottle {
    /// Whether a line may be logged at `now`: `Some(n)` with the number of
    /// lines held back since the last one logged, `None` to hold this one
    /// back (it is counted).
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        let window_over = s
            .window_start
            .is_none_or(|start| now.saturating_duration_since(start) >= LOG_WINDOW);
        if window_over {
            s.window_start = Some(now);
            s.logged_in_window = 0;
        }
        if s.logged_in_window >= LOG_LINES_PER_WINDOW_MAX {
            s.suppressed += 1;
            return None;
        }
        s.logged_in_window += 1;
        Some(std::mem::take(&mut s.suppressed))
    }

    /// The lines held back and not yet reported; the count starts again.
    pub(crate) fn take_suppressed(&self) -> u64 {
        std::mem::take(&mut self.state.lock().suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storm_is_cut_to_the_window_limit_and_counted() {
        let throttle = LogThrottle::default();
        let t0 = Instant::now();
        let logged = (0..1000)
            .filter(|i| throttle.admit(t0 + Duration::from_millis(*i)).is_some())
            .count();
        assert_eq!(logged, LOG_LINES_PER_WINDOW_MAX as usize);
        // The next window's first line reports what the first held back.
        let next = t0 + LOG_WINDOW + Duration::from_secs(1);
        assert_eq!(
            throttle.admit(next),
            Some(1000 - u64::from(LOG_LINES_PER_WINDOW_MAX))
        );
        assert_eq!(throttle.admit(next), Some(0), "reported once");
        assert_eq!(throttle.take_suppressed(), 0);
    }

    #[test]
    fn what_is_still_held_back_can_be_taken() {
        let throttle = LogThrottle::default();
        let now = Instant::now();
        for _ in 0..(LOG_LINES_PER_WINDOW_MAX + 5) {
            throttle.admit(now);
        }
        assert_eq!(throttle.take_suppressed(), 5);
        assert_eq!(throttle.take_suppressed(), 0);
    }
}
