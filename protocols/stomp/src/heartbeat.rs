//! Heart-beat negotiation (STOMP 1.1+).
//!
//! The client sends `heart-beat:cx,cy` (it can send every `cx` ms, wants a
//! beat every `cy` ms); the server answers `sx,sy`. Each direction is
//! active only when both sides' numbers are non-zero, at the larger of the
//! two. The server answers with the intervals it will actually use, so the
//! client's own computation (max of both) arrives at the same numbers.
//!
//! Enforcement: the server writes an EOL when it has sent nothing for the
//! send interval, and closes a client that was silent (no byte at all) for
//! the receive interval times the grace percentage (see
//! [`crate::config::HEART_BEAT_GRACE_PERCENT`]).

use std::time::Duration;

/// The agreed intervals of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct HeartBeat {
    /// Server → client interval (ms), 0 when off.
    pub(crate) send_ms: u64,
    /// Client → server interval (ms), 0 when off.
    pub(crate) receive_ms: u64,
    /// Silence allowed before the client is dropped, when receiving.
    pub(crate) receive_deadline: Option<Duration>,
}

/// What an open connection keeps of [`HeartBeat`]: both intervals in
/// `u32` milliseconds (8 B, not 32, in every connection, issue 20). The
/// client names the intervals and may name absurd ones: one of 49.7 days
/// or more is [`Beats::NEVER`], as one past the clock's range always was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Beats {
    /// Server → client interval (ms); 0 when off.
    pub(crate) send_ms: u32,
    /// Silence allowed before the client is dropped (ms); 0 when off.
    pub(crate) receive_grace_ms: u32,
}

impl Beats {
    /// An interval too long to ever come due.
    pub(crate) const NEVER: u32 = u32::MAX;

    /// Milliseconds to wait, `None` for off or never.
    fn due_in(ms: u32) -> Option<u32> {
        (ms != 0 && ms != Self::NEVER).then_some(ms)
    }

    /// The interval of heart-beats we send, if any come due.
    pub(crate) fn send_every_ms(self) -> Option<u32> {
        Self::due_in(self.send_ms)
    }

    /// The silence allowed to the client, if it can ever run out.
    pub(crate) fn receive_within_ms(self) -> Option<u32> {
        Self::due_in(self.receive_grace_ms)
    }
}

impl From<HeartBeat> for Beats {
    fn from(h: HeartBeat) -> Self {
        let ms = |n: u64| u32::try_from(n).unwrap_or(Beats::NEVER);
        let grace = h.receive_deadline.map_or(0, |d| {
            // A non-zero deadline stays non-zero (off is 0).
            ms(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).max(1)
        });
        Beats {
            send_ms: ms(h.send_ms),
            receive_grace_ms: grace,
        }
    }
}

/// Parses `cx,cy`.
pub(crate) fn parse(value: &str) -> Option<(u64, u64)> {
    let (a, b) = value.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// Negotiates from the client's `(cx, cy)` and the server's minimums.
pub(crate) fn negotiate(
    client: (u64, u64),
    send_min_ms: u64,
    receive_min_ms: u64,
    grace_percent: u64,
) -> HeartBeat {
    let (cx, cy) = client;
    let send_ms = if cy == 0 {
        0
    } else {
        cy.max(send_min_ms.max(1))
    };
    let receive_ms = if cx == 0 || receive_min_ms == 0 {
        0
    } else {
        cx.max(receive_min_ms)
    };
    let receive_deadline = (receive_ms > 0)
        .then(|| Duration::from_millis(receive_ms.saturating_mul(grace_percent.max(100)) / 100));
    HeartBeat {
        send_ms,
        receive_ms,
        receive_deadline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_takes_the_slower_side_and_zero_disables() {
        let hb = negotiate((5_000, 500), 1_000, 1_000, 200);
        assert_eq!((hb.send_ms, hb.receive_ms), (1_000, 5_000));
        assert_eq!(hb.receive_deadline, Some(Duration::from_secs(10)));
        let off = negotiate((0, 0), 1_000, 1_000, 200);
        assert_eq!(
            (off.send_ms, off.receive_ms, off.receive_deadline),
            (0, 0, None)
        );
        let no_rx = negotiate((100, 0), 1_000, 0, 200);
        assert_eq!((no_rx.send_ms, no_rx.receive_ms), (0, 0));
        assert_eq!(parse(" 10 , 20"), Some((10, 20)));
        assert_eq!(parse("10"), None);
        assert_eq!(parse("x,1"), None);
    }

    #[test]
    fn absurd_intervals_never_come_due() {
        let kept = Beats::from(negotiate((5_000, 500), 1_000, 1_000, 200));
        assert_eq!(kept.send_every_ms(), Some(1_000));
        assert_eq!(kept.receive_within_ms(), Some(10_000));
        let absurd = Beats::from(negotiate((u64::MAX, u64::MAX), 1_000, 1_000, 200));
        assert_eq!(
            (absurd.send_every_ms(), absurd.receive_within_ms()),
            (None, None)
        );
        let off = Beats::from(negotiate((0, 0), 1_000, 1_000, 200));
        assert_eq!(off, Beats::default());
    }
}
