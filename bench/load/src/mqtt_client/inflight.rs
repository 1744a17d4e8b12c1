//! The publisher's QoS 1 window: which packet ids await their PUBACK, and
//! the next free id. No IO, so the accounting is tested on its own.

/// Why a PUBACK does not fit what we sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InflightError {
    #[error("PUBACK for packet id {0}, which is not in flight")]
    Unknown(u16),
    #[error("the window is full")]
    Full,
}

/// Packet ids of unacknowledged QoS 1 publishes, at most `window` of them.
#[derive(Debug)]
pub(crate) struct Inflight {
    /// One flag per packet id (index 0 unused: id 0 is reserved).
    open: Vec<bool>,
    count: usize,
    window: usize,
    /// The id the next publish gets, if free.
    next: u16,
}

impl Inflight {
    /// A window of `window` publishes (1..=65,535).
    pub(crate) fn new(window: usize) -> Self {
        Self {
            open: vec![false; usize::from(u16::MAX) + 1],
            count: 0,
            window: window.clamp(1, usize::from(u16::MAX)),
            next: 1,
        }
    }

    /// Publishes awaiting their PUBACK.
    pub(crate) fn open(&self) -> usize {
        self.count
    }

    pub(crate) fn has_room(&self) -> bool {
        self.count < self.window
    }

    /// A packet id for the next publish, now in flight. Ids cycle through
    /// 1..=65,535 and skip those still in flight (PUBACKs may come out of
    /// order from a broker that acks as it stores).
    pub(crate) fn take(&mut self) -> Result<u16, InflightError> {
        if !self.has_room() {
            return Err(InflightError::Full);
        }
        loop {
            let id = self.next;
            self.next = if id == u16::MAX { 1 } else { id + 1 };
            let slot = &mut self.open[usize::from(id)];
            if !*slot {
                *slot = true;
                self.count += 1;
                return Ok(id);
            }
        }
    }

    /// Settles publish `id` on its PUBACK.
    pub(crate) fn ack(&mut self, id: u16) -> Result<(), InflightError> {
        let slot = &mut self.open[usize::from(id)];
        if !*slot {
            return Err(InflightError::Unknown(id));
        }
        *slot = false;
        self.count -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_bounds_publishes_in_flight() {
        let mut w = Inflight::new(3);
        let ids: Vec<u16> = (0..3).map(|_| w.take().expect("room")).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert!(!w.has_room());
        assert_eq!(w.take(), Err(InflightError::Full));
        // Out of order acks free their slots.
        w.ack(2).expect("in flight");
        assert_eq!(w.open(), 2);
        assert_eq!(w.take(), Ok(4));
        assert_eq!(w.ack(2), Err(InflightError::Unknown(2)), "acked twice");
        assert_eq!(w.ack(99), Err(InflightError::Unknown(99)), "never sent");
        assert_eq!(w.ack(0), Err(InflightError::Unknown(0)));
        for id in [1, 3, 4] {
            w.ack(id).expect("in flight");
        }
        assert_eq!(w.open(), 0);
    }

    #[test]
    fn ids_wrap_and_skip_those_in_flight() {
        let mut w = Inflight::new(2);
        let first = w.take().expect("room");
        assert_eq!(first, 1);
        // Cycle through every other id while id 1 stays unacknowledged.
        for _ in 0..u16::MAX - 1 {
            let id = w.take().expect("room");
            assert_ne!(id, 0);
            w.ack(id).expect("in flight");
        }
        // Wrapped past 65,535: 0 and the still open 1 are skipped.
        assert_eq!(w.take(), Ok(2));
        assert_eq!(w.open(), 2);
    }
}
