//! The counting behind AMQP flow control and settlement, without IO:
//! the sender's unsettled deliveries and credit, the session's transfer
//! window, and the receiver's credit top-up and coalesced dispositions.
//!
//! Delivery ids, transfer ids and delivery counts are RFC 1982 serial
//! numbers: every comparison here is a wrapping difference.

use std::collections::VecDeque;

/// A peer's count did not fit ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FlowError {
    #[error("disposition settles delivery {id}, which was never sent")]
    UnknownDelivery { id: u32 },
    #[error("disposition range {first}..={last} ends before it starts")]
    BackwardRange { first: u32, last: u32 },
    #[error("transfer beyond the credit granted")]
    NoCredit,
}

/// The sender's deliveries that wait for their disposition, by delivery id.
#[derive(Debug)]
pub(crate) struct Outstanding {
    /// Delivery id of `slots[0]`.
    base: u32,
    /// Whether each id from `base` on is settled; settled ids at the front
    /// are dropped, so `slots[0]` is always an unsettled delivery.
    slots: VecDeque<bool>,
    /// Unsettled ids among `slots`.
    open: usize,
}

impl Outstanding {
    /// Tracks deliveries from `first_id` on (0 on a new session).
    pub(crate) fn new(first_id: u32) -> Self {
        Self {
            base: first_id,
            slots: VecDeque::new(),
            open: 0,
        }
    }

    /// Deliveries sent and not yet settled.
    pub(crate) fn open(&self) -> usize {
        self.open
    }

    /// Takes the next delivery id for a transfer about to be sent.
    pub(crate) fn push(&mut self) -> u32 {
        // u32 ids: more than 2^31 outstanding would make the serial
        // arithmetic ambiguous; callers bound this by their window.
        assert!(self.slots.len() < (1 << 31), "2^31 deliveries outstanding");
        let id = self.base.wrapping_add(self.slots.len() as u32);
        self.slots.push_back(false);
        self.open += 1;
        id
    }

    /// Settles `first..=last`; returns how many deliveries that newly
    /// settled. Ids in the range that are settled already are skipped:
    /// RabbitMQ 3.10 settles a delivery alone and then again inside a later
    /// range, and qpid-proton skips such ids too. An id never sent is an
    /// error: the broker then counts different deliveries than we do.
    pub(crate) fn settle(&mut self, first: u32, last: u32) -> Result<usize, FlowError> {
        let len = self.slots.len() as i64;
        // Offsets from `base` as serial-number differences: negative means
        // before `base`, i.e. settled and forgotten.
        let offset = |id: u32| i64::from(id.wrapping_sub(self.base) as i32);
        let (from, to) = (offset(first), offset(last));
        if to < from {
            return Err(FlowError::BackwardRange { first, last });
        }
        if to >= len {
            let id = self.base.wrapping_add(from.max(len) as u32);
            return Err(FlowError::UnknownDelivery { id });
        }
        if to < 0 {
            return Ok(0);
        }
        // 0 <= from.max(0) <= to < len: within the slots.
        let range = from.max(0) as usize..=to as usize;
        let mut newly = 0;
        for settled in self.slots.range_mut(range) {
            if !*settled {
                *settled = true;
                newly += 1;
            }
        }
        self.open -= newly;
        while self.slots.front() == Some(&true) {
            self.slots.pop_front();
            self.base = self.base.wrapping_add(1);
        }
        Ok(newly)
    }
}

/// A sending link's credit, from the receiver's flow frames.
#[derive(Debug)]
pub(crate) struct SenderCredit {
    delivery_count: u32,
    credit: u32,
}

impl SenderCredit {
    /// A link whose attach said initial-delivery-count `initial`.
    pub(crate) fn new(initial: u32) -> Self {
        Self {
            delivery_count: initial,
            credit: 0,
        }
    }

    #[cfg(test)]
    fn delivery_count(&self) -> u32 {
        self.delivery_count
    }

    pub(crate) fn available(&self) -> u32 {
        self.credit
    }

    /// A flow for this link: credit = receiver's delivery-count +
    /// link-credit − ours (spec 2.6.7). A receiver that has not seen our
    /// attach yet sends no delivery-count, which means our initial one.
    pub(crate) fn on_flow(&mut self, delivery_count: Option<u32>, link_credit: u32) {
        let theirs = delivery_count.unwrap_or(self.delivery_count);
        let credit = theirs
            .wrapping_add(link_credit)
            .wrapping_sub(self.delivery_count);
        // A receiver that counted deliveries we have not sent: trust no
        // more than the credit it states.
        self.credit = credit.min(link_credit);
    }

    /// Spends one credit on a delivery; false if there is none.
    pub(crate) fn take(&mut self) -> bool {
        if self.credit == 0 {
            return false;
        }
        self.credit -= 1;
        self.delivery_count = self.delivery_count.wrapping_add(1);
        true
    }
}

/// The session's outgoing transfer window (spec 2.5.6): how many more
/// transfer frames the peer's session takes.
#[derive(Debug)]
pub(crate) struct SessionWindow {
    next_outgoing_id: u32,
    remote_incoming: u32,
}

impl SessionWindow {
    /// After the peer's begin, which states its incoming window.
    pub(crate) fn new(next_outgoing_id: u32, remote_incoming: u32) -> Self {
        Self {
            next_outgoing_id,
            remote_incoming,
        }
    }

    pub(crate) fn next_outgoing_id(&self) -> u32 {
        self.next_outgoing_id
    }

    pub(crate) fn available(&self) -> u32 {
        self.remote_incoming
    }

    /// A flow frame: remote-incoming-window = its next-incoming-id + its
    /// incoming-window − our next-outgoing-id.
    pub(crate) fn on_flow(&mut self, next_incoming_id: Option<u32>, incoming_window: u32) {
        // No next-incoming-id: the peer has not seen our begin; it counts
        // from our initial id, which is where we still are.
        let base = next_incoming_id.unwrap_or(self.next_outgoing_id);
        let w = base
            .wrapping_add(incoming_window)
            .wrapping_sub(self.next_outgoing_id);
        self.remote_incoming = w.min(incoming_window);
    }

    /// Counts one transfer frame sent.
    pub(crate) fn sent(&mut self) {
        self.next_outgoing_id = self.next_outgoing_id.wrapping_add(1);
        self.remote_incoming = self.remote_incoming.saturating_sub(1);
    }
}

/// A receiving link's credit: granted up front and topped up once half of
/// it is used, so the sender never waits for a flow frame at the end of
/// its credit yet one flow covers many messages.
#[derive(Debug)]
pub(crate) struct ReceiverCredit {
    grant: u32,
    remaining: u32,
    delivery_count: u32,
}

impl ReceiverCredit {
    /// `grant` credits (at least 1) on a link whose sender's attach said
    /// initial-delivery-count `initial`. Nothing is granted until the first
    /// [`ReceiverCredit::top_up`].
    pub(crate) fn new(grant: u32, initial: u32) -> Self {
        Self {
            grant: grant.max(1),
            remaining: 0,
            delivery_count: initial,
        }
    }

    /// Counts a delivery received (its first transfer frame).
    pub(crate) fn on_delivery(&mut self) -> Result<(), FlowError> {
        self.remaining = self.remaining.checked_sub(1).ok_or(FlowError::NoCredit)?;
        self.delivery_count = self.delivery_count.wrapping_add(1);
        Ok(())
    }

    /// The (delivery-count, link-credit) of a flow to send now, if at most
    /// half the grant is left.
    pub(crate) fn top_up(&mut self) -> Option<(u32, u32)> {
        if self.remaining > self.grant / 2 {
            return None;
        }
        self.remaining = self.grant;
        Some((self.delivery_count, self.grant))
    }
}

/// Delivery ids to accept, coalesced into runs of consecutive ids: one
/// disposition per run instead of one per message (what qpid-proton and
/// rhea do).
#[derive(Debug, Default)]
pub(crate) struct Ranges {
    runs: Vec<(u32, u32)>,
}

impl Ranges {
    pub(crate) fn push(&mut self, id: u32) {
        match self.runs.last_mut() {
            Some((_, last)) if last.wrapping_add(1) == id => *last = id,
            _ => self.runs.push((id, id)),
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The runs as (first, last), oldest first; empties the set.
    pub(crate) fn drain(&mut self) -> std::vec::Drain<'_, (u32, u32)> {
        self.runs.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_coalesce_consecutive_ids_only() {
        let mut r = Ranges::default();
        assert!(r.is_empty());
        for id in [5, 6, 7, 9, 10, 12, 11] {
            r.push(id);
        }
        let runs: Vec<_> = r.drain().collect();
        assert_eq!(runs, vec![(5, 7), (9, 10), (12, 12), (11, 11)]);
        assert!(r.is_empty());
        // Across the u32 wrap.
        for id in [u32::MAX - 1, u32::MAX, 0, 1] {
            r.push(id);
        }
        assert_eq!(r.drain().collect::<Vec<_>>(), vec![(u32::MAX - 1, 1)]);
    }

    #[test]
    fn outstanding_settles_ranges_in_any_order() {
        let mut o = Outstanding::new(0);
        let ids: Vec<u32> = (0..10).map(|_| o.push()).collect();
        assert_eq!(ids, (0..10).collect::<Vec<_>>());
        assert_eq!(o.settle(3, 5), Ok(3));
        assert_eq!(o.open(), 7);
        assert_eq!(o.settle(0, 2), Ok(3));
        assert_eq!(o.open(), 4);
        // The settled prefix is dropped.
        assert_eq!(o.base, 6);
        assert_eq!(o.settle(9, 9), Ok(1));
        assert_eq!(o.settle(6, 8), Ok(3));
        assert_eq!(o.open(), 0);
        assert!(o.slots.is_empty());
        assert_eq!(o.push(), 10);
    }

    #[test]
    fn outstanding_skips_what_is_settled_and_refuses_what_was_not_sent() {
        let mut o = Outstanding::new(100);
        for _ in 0..6 {
            o.push();
        }
        assert_eq!(o.settle(101, 101), Ok(1));
        assert_eq!(o.settle(101, 101), Ok(0), "settled twice: skipped");
        // RabbitMQ's shape: 101 alone, then a range over it.
        assert_eq!(o.settle(100, 102), Ok(2));
        assert_eq!(o.base, 103, "the settled prefix is dropped");
        // Below the base: settled and forgotten, skipped.
        assert_eq!(o.settle(99, 99), Ok(0));
        assert_eq!(o.settle(98, 103), Ok(1));
        // Never sent: 100..=105 were.
        assert_eq!(
            o.settle(106, 106),
            Err(FlowError::UnknownDelivery { id: 106 })
        );
        assert_eq!(
            o.settle(104, 107),
            Err(FlowError::UnknownDelivery { id: 106 })
        );
        assert_eq!(
            o.settle(5, 4),
            Err(FlowError::BackwardRange { first: 5, last: 4 })
        );
        assert_eq!(o.open(), 2, "failed settlements changed nothing");
        assert_eq!(o.settle(104, 105), Ok(2));
        assert_eq!(o.open(), 0);
    }

    #[test]
    fn outstanding_wraps() {
        let mut o = Outstanding::new(u32::MAX - 1);
        let ids: Vec<u32> = (0..4).map(|_| o.push()).collect();
        assert_eq!(ids, vec![u32::MAX - 1, u32::MAX, 0, 1]);
        assert_eq!(o.settle(u32::MAX, 0), Ok(2));
        assert_eq!(o.settle(u32::MAX - 1, u32::MAX - 1), Ok(1));
        assert_eq!(o.settle(1, 1), Ok(1));
        assert_eq!(o.open(), 0);
    }

    #[test]
    fn receiver_tops_up_when_half_is_used() {
        let mut c = ReceiverCredit::new(10, 7);
        assert_eq!(c.top_up(), Some((7, 10)), "the first grant");
        assert_eq!(c.top_up(), None);
        for _ in 0..4 {
            c.on_delivery().unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(c.top_up(), None, "6 of 10 left");
        c.on_delivery().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.top_up(), Some((12, 10)), "5 left: top up to 10");
        for _ in 0..10 {
            c.on_delivery().unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(c.on_delivery(), Err(FlowError::NoCredit));
        assert_eq!(c.top_up(), Some((22, 10)));
        // A grant of 1 is topped up after every message.
        let mut c = ReceiverCredit::new(1, 0);
        assert_eq!(c.top_up(), Some((0, 1)));
        c.on_delivery().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.top_up(), Some((1, 1)));
    }

    #[test]
    fn sender_credit_follows_the_receivers_count() {
        let mut s = SenderCredit::new(0);
        assert!(!s.take());
        s.on_flow(None, 3);
        assert!(s.take() && s.take());
        assert_eq!(s.available(), 1);
        // The receiver saw 1 of our 2 deliveries and grants 3 from there:
        // 1 + 3 - 2 = 2 left.
        s.on_flow(Some(1), 3);
        assert_eq!(s.available(), 2);
        // A receiver counting past what we sent gets no more than it says.
        s.on_flow(Some(10), 3);
        assert_eq!(s.available(), 3);
        assert_eq!(s.delivery_count(), 2);
    }

    #[test]
    fn session_window_counts_frames() {
        let mut w = SessionWindow::new(0, 2);
        w.sent();
        w.sent();
        assert_eq!(w.available(), 0);
        w.sent();
        assert_eq!(w.available(), 0, "never below zero");
        // The peer took 2 of our 3 frames and opens 5 from there: 2 + 5 - 3.
        w.on_flow(Some(2), 5);
        assert_eq!((w.available(), w.next_outgoing_id()), (4, 3));
        w.on_flow(None, 5);
        assert_eq!(w.available(), 5);
    }
}
