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
}
