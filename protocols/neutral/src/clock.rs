//! One clock anchor for the process: the driver's monotonic `Instant`s
//! mapped to wall-clock milliseconds, and 4-byte [`Stamp`]s of them.
//!
//! A connection that kept an `Instant` (16 B) for every time it tracks,
//! or its own wall-clock base (24 B), paid for it once per idle
//! connection (issue 20). The anchor is taken once, at first use: an
//! `Instant` and the system clock's milliseconds at that moment.
//! Differences between `Instant`s map exactly (whole milliseconds, rounded
//! down either side of the anchor), so a test with a virtual clock stays
//! deterministic relative to its start.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Wall-clock milliseconds since the Unix epoch at `now` (for message
/// expiry and ttl), from the process anchor rather than a system call.
pub fn epoch_ms(now: Instant) -> u64 {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let &(base, base_ms) = ANCHOR.get_or_init(|| (Instant::now(), crate::message::now_ms()));
    match now.checked_duration_since(base) {
        Some(after) => base_ms.saturating_add(millis(after)),
        None => {
            // Rounded up before the anchor, so that `now` rounds down.
            let before = base.duration_since(now);
            let whole = millis(before);
            let up = u64::from(before > Duration::from_millis(whole));
            base_ms.saturating_sub(whole.saturating_add(up))
        }
    }
}

/// A time a connection tracks, in 4 bytes: the low 32 bits of its
/// [`epoch_ms`], so it wraps every 49.7 days. Two stamps compare with
/// [`Stamp::elapsed_ms`], which is right while they are less than 24.8
/// days apart (a connection's idle and heartbeat clocks are reset far
/// more often); an owner that needs an `Instant` back counts from a
/// current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp(u32);

impl Stamp {
    /// The stamp of the instant whose [`epoch_ms`] is `ms`.
    pub fn of_epoch_ms(ms: u64) -> Self {
        // Keeping the low bits is the wrapping the type documents.
        Self(ms as u32)
    }

    /// Milliseconds from `earlier` to `self`; 0 if `earlier` is later.
    pub fn elapsed_ms(self, earlier: Stamp) -> u32 {
        let d = self.0.wrapping_sub(earlier.0);
        if d > u32::MAX / 2 {
            0
        } else {
            d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(t: Instant) -> Stamp {
        Stamp::of_epoch_ms(epoch_ms(t))
    }

    #[test]
    fn whole_milliseconds_apart_either_side_of_the_anchor() {
        // `t0` is taken before the anchor (if this test is the first to
        // use it) and `later` after it.
        let t0 = Instant::now() - Duration::from_micros(500);
        let later = t0 + Duration::from_millis(1500);
        assert_eq!(epoch_ms(later) - epoch_ms(t0), 1500);
        assert_eq!(stamp(later).elapsed_ms(stamp(t0)), 1500);
        let just_before = later - Duration::from_millis(1);
        assert_eq!(stamp(just_before).elapsed_ms(stamp(t0)), 1499);
        assert_eq!(stamp(t0).elapsed_ms(stamp(later)), 0);
    }

    #[test]
    fn stamps_wrap() {
        let a = Stamp::of_epoch_ms(u64::from(u32::MAX) - 5);
        let b = Stamp::of_epoch_ms(u64::from(u32::MAX) + 10);
        assert_eq!(b.elapsed_ms(a), 15);
    }
}
