//! Instants kept as 8 bytes: nanoseconds on one process-wide timeline.
//!
//! A connection's liveness stamps (last byte in, last byte out) are read
//! on every timer and written on every read; as `Instant`s they cost 16 B
//! each in every connection, idle ones included (issue 20). A [`Stamp`] is
//! the offset from an anchor taken once per process, in nanoseconds, so
//! the round trip `Instant -> Stamp -> Instant` is exact and tests with a
//! virtual clock stay deterministic. The anchor sits in the middle of the
//! `u64` range, so instants taken before it (a test's start) map too;
//! either side spans 292 years.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The anchor's place on the timeline.
const MIDDLE: u64 = 1 << 63;

fn anchor() -> Instant {
    static ANCHOR: OnceLock<Instant> = OnceLock::new();
    *ANCHOR.get_or_init(Instant::now)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// An instant, as nanoseconds on the process's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp(u64);

impl Stamp {
    /// `at` on the timeline (saturating 292 years from the anchor).
    pub(crate) fn of(at: Instant) -> Stamp {
        let anchor = anchor();
        Stamp(match at.checked_duration_since(anchor) {
            Some(after) => MIDDLE.saturating_add(nanos(after)),
            None => MIDDLE.saturating_sub(nanos(anchor.duration_since(at))),
        })
    }

    /// `ms` milliseconds later; `None` past the timeline's end.
    pub(crate) fn after_ms(self, ms: u32) -> Option<Stamp> {
        self.0.checked_add(u64::from(ms) * 1_000_000).map(Stamp)
    }

    /// The instant again; `None` past the clock's range.
    pub(crate) fn instant(self) -> Option<Instant> {
        let anchor = anchor();
        match self.0.checked_sub(MIDDLE) {
            Some(after) => anchor.checked_add(Duration::from_nanos(after)),
            None => anchor.checked_sub(Duration::from_nanos(MIDDLE - self.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_round_trip_on_both_sides_of_the_anchor() {
        let before = Instant::now();
        let _ = Stamp::of(before); // sets the anchor, at or after `before`
        for at in [before, before + Duration::from_nanos(1), Instant::now()] {
            assert_eq!(Stamp::of(at).instant(), Some(at));
        }
        let later = before + Duration::from_millis(1500);
        assert_eq!(Stamp::of(before).after_ms(1500), Some(Stamp::of(later)));
        assert!(Stamp::of(before) < Stamp::of(later));
        assert_eq!(Stamp(u64::MAX).after_ms(1), None);
    }
}
