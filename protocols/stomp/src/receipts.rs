//! Ordered tracking of frames whose effect is not yet durable.
//!
//! Each frame that is waiting for journal commits (its tickets), asked for a
//! RECEIPT, or is a DISCONNECT gets an entry in frame order. An entry is
//! released only when it and every entry before it are complete, so a
//! RECEIPT promises that this frame *and all earlier frames* are durable
//! (what a DISCONNECT receipt must mean).

use std::collections::VecDeque;

use rosetta_neutral::{LazyMap, Ticket};

/// One frame's pending completion.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    seq: u64,
    /// The frame's `receipt` header.
    pub(crate) receipt: Option<String>,
    /// Tickets not yet committed.
    waiting: usize,
    /// The frame was a DISCONNECT: close once released.
    pub(crate) disconnect: bool,
    /// The frame acknowledged or renewed a delivery whose lease had run
    /// out: its RECEIPT carries `lease-expired:true`.
    pub(crate) lease_expired: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Receipts {
    queue: VecDeque<Pending>,
    /// Lazy: most connections never wait for a commit.
    by_ticket: LazyMap<Ticket, u64>,
    next_seq: u64,
}

impl Receipts {
    /// Registers a processed frame and the tickets it waits for.
    pub(crate) fn push(
        &mut self,
        receipt: Option<String>,
        tickets: &[Ticket],
        disconnect: bool,
        lease_expired: bool,
    ) {
        if receipt.is_none() && tickets.is_empty() && !disconnect {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        for t in tickets {
            self.by_ticket.insert(*t, seq);
        }
        self.queue.push_back(Pending {
            seq,
            receipt,
            waiting: tickets.len(),
            disconnect,
            lease_expired,
        });
    }

    /// A ticket committed. Returns the `receipt` header of its frame
    /// (`Some(None)` for a frame without one), `None` for an unknown ticket.
    pub(crate) fn committed(&mut self, ticket: Ticket) -> Option<Option<String>> {
        let seq = self.by_ticket.remove(&ticket)?;
        let entry = self.queue.iter_mut().find(|p| p.seq == seq)?;
        entry.waiting = entry.waiting.saturating_sub(1);
        Some(entry.receipt.clone())
    }

    /// The oldest entry, once it and all before it are complete.
    pub(crate) fn pop_ready(&mut self) -> Option<Pending> {
        if self.queue.front()?.waiting != 0 {
            return None;
        }
        let pending = self.queue.pop_front();
        if self.queue.is_empty() {
            // An idle connection keeps no queue (its first growth is to
            // four entries, 192 bytes).
            self.queue = VecDeque::new();
        }
        pending
    }

    /// Tickets still pending.
    pub(crate) fn outstanding(&self) -> usize {
        self.by_ticket.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_release_in_frame_order() {
        let mut r = Receipts::default();
        r.push(Some("a".into()), &[Ticket(1)], false, false);
        r.push(None, &[], false, false); // nothing to wait for: no entry
        r.push(Some("b".into()), &[], false, false);
        assert_eq!(r.outstanding(), 1);
        assert!(r.pop_ready().is_none(), "b must wait for a");
        assert_eq!(r.committed(Ticket(1)), Some(Some("a".into())));
        assert_eq!(r.committed(Ticket(1)), None);
        assert_eq!(r.pop_ready().and_then(|p| p.receipt), Some("a".into()));
        assert_eq!(r.pop_ready().and_then(|p| p.receipt), Some("b".into()));
        assert!(r.pop_ready().is_none());
    }
}
