//! Ordered tracking of frames whose effect is not yet durable.
//!
//! Each frame that is waiting for journal commits (its tickets), asked for a
//! RECEIPT, or is a DISCONNECT gets an entry in frame order. An entry is
//! released only when it and every entry before it are complete, so a
//! RECEIPT promises that this frame *and all earlier frames* are durable
//! (what a DISCONNECT receipt must mean).

use std::collections::VecDeque;

use rosetta_neutral::id_hash::BuildIdHasher;
use rosetta_neutral::{LazyMap, Ticket};
use smallvec::SmallVec;

/// The commits a frame waits for: almost always none or one (a durable
/// SEND's), kept inline; more (an ACK of several deliveries, a COMMIT)
/// spill to the heap. Not a `Vec`: that was an allocation per SEND.
pub(crate) type Tickets = SmallVec<[Ticket; 1]>;

/// A frame's `receipt` header, kept until its RECEIPT is written: inline
/// when short (a client's counter, a few digits), so that a receipted
/// SEND allocates nothing for it; on the heap when longer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReceiptId {
    /// The first `len` bytes of `bytes` (a whole `str`).
    Short {
        len: u8,
        bytes: [u8; RECEIPT_INLINE_BYTES],
    },
    /// A longer one.
    Long(Box<str>),
}

/// Longest receipt id kept inline: the enum is then as large as a
/// `String`.
const RECEIPT_INLINE_BYTES: usize = 22;

impl ReceiptId {
    /// `id`, inline when it fits.
    pub(crate) fn new(id: &str) -> Self {
        let mut bytes = [0u8; RECEIPT_INLINE_BYTES];
        match (bytes.get_mut(..id.len()), u8::try_from(id.len())) {
            (Some(room), Ok(len)) => {
                room.copy_from_slice(id.as_bytes());
                ReceiptId::Short { len, bytes }
            }
            _ => ReceiptId::Long(id.into()),
        }
    }

    /// The id's bytes (UTF-8): what a RECEIPT writes, without a UTF-8
    /// check (which costs a short id more than its copy).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            ReceiptId::Short { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            ReceiptId::Long(id) => id.as_bytes(),
        }
    }

    /// The id.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            // A whole `str` was copied in: always UTF-8.
            ReceiptId::Short { len, bytes } => bytes
                .get(..usize::from(*len))
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or_default(),
            ReceiptId::Long(id) => id,
        }
    }
}

/// One frame's pending completion.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    seq: u64,
    /// The frame's `receipt` header.
    pub(crate) receipt: Option<ReceiptId>,
    /// Tickets not yet committed.
    waiting: usize,
    /// The frame was a DISCONNECT: close once released.
    pub(crate) disconnect: bool,
    /// The frame acknowledged or renewed a delivery whose lease had run
    /// out: its RECEIPT carries `lease-expired:true`.
    pub(crate) lease_expired: bool,
}

/// The frames waiting, made by the first: an idle connection keeps 8 B
/// here, not 48 (issue 20). Dropped with the last frame unless a frame
/// has waited for a commit: a connection that only asked for receipts
/// (of a SUBSCRIBE, say) keeps nothing, a producer of durable messages
/// keeps its ticket map rather than make it again for every message (a
/// map made per receipt cost a STOMP message about 1% more instructions).
#[derive(Debug, Default)]
pub(crate) struct Receipts(Option<Box<Waiting>>);

#[derive(Debug, Default)]
struct Waiting {
    queue: VecDeque<Pending>,
    /// Lazy: most frames wait for no commit. Tickets are the broker's
    /// counters: the id hash, not SipHash.
    by_ticket: LazyMap<Ticket, u64, BuildIdHasher>,
    next_seq: u64,
    /// A frame has waited for a commit: kept once empty.
    committing: bool,
}

impl Receipts {
    /// Registers a processed frame and the tickets it waits for.
    pub(crate) fn push(
        &mut self,
        receipt: Option<ReceiptId>,
        tickets: &Tickets,
        disconnect: bool,
        lease_expired: bool,
    ) {
        if receipt.is_none() && tickets.is_empty() && !disconnect {
            return;
        }
        let waiting = self.0.get_or_insert_with(Box::default);
        let seq = waiting.next_seq;
        waiting.next_seq += 1;
        for &t in tickets {
            waiting.by_ticket.insert(t, seq);
        }
        waiting.committing |= !tickets.is_empty();
        waiting.queue.push_back(Pending {
            seq,
            receipt,
            waiting: tickets.len(),
            disconnect,
            lease_expired,
        });
    }

    /// A ticket committed. Returns its frame (for [`Receipts::receipt_of`]),
    /// `None` for an unknown ticket.
    pub(crate) fn committed(&mut self, ticket: Ticket) -> Option<u64> {
        let waiting = self.0.as_deref_mut()?;
        let seq = waiting.by_ticket.remove(&ticket)?;
        // Entries are queued with consecutive seqs and leave from the
        // front, so the seq says where it is (a run of commits, one
        // `CommittedRun` event, looked up each of a thousand frames
        // waiting behind one another from the front otherwise).
        let front = waiting.queue.front()?.seq;
        let at = usize::try_from(seq.wrapping_sub(front)).unwrap_or(usize::MAX);
        let entry = match waiting.queue.get(at) {
            Some(p) if p.seq == seq => waiting.queue.get_mut(at)?,
            _ => waiting.queue.iter_mut().find(|p| p.seq == seq)?,
        };
        entry.waiting = entry.waiting.saturating_sub(1);
        Some(seq)
    }

    /// The `receipt` header of a frame still waiting (a copy: only a
    /// failed commit needs it, for its ERROR; a commit that succeeded
    /// writes the RECEIPT from the entry itself).
    pub(crate) fn receipt_of(&self, seq: u64) -> Option<String> {
        let waiting = self.0.as_deref()?;
        let entry = waiting.queue.iter().find(|p| p.seq == seq)?;
        entry.receipt.as_ref().map(|r| r.as_str().to_owned())
    }

    /// The oldest entry, once it and all before it are complete.
    pub(crate) fn pop_ready(&mut self) -> Option<Pending> {
        let waiting = self.0.as_deref_mut()?;
        if waiting.queue.front()?.waiting != 0 {
            return None;
        }
        let pending = waiting.queue.pop_front();
        if waiting.queue.is_empty() {
            if waiting.committing {
                // An idle producer keeps no queue (its first growth is
                // to four entries, 192 bytes).
                waiting.queue = VecDeque::new();
            } else {
                // An idle connection keeps nothing.
                self.0 = None;
            }
        }
        pending
    }

    /// Tickets still pending.
    pub(crate) fn outstanding(&self) -> usize {
        self.0.as_ref().map_or(0, |w| w.by_ticket.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_ids_read_back_as_given_short_or_long() {
        let long = "r".repeat(RECEIPT_INLINE_BYTES + 1);
        let edge = "é".repeat(RECEIPT_INLINE_BYTES / 2);
        for id in ["", "1", "12345", "é€", edge.as_str(), &long[1..], &long] {
            let r = ReceiptId::new(id);
            assert_eq!(r.as_str(), id);
            assert_eq!(r.as_bytes(), id.as_bytes());
            let inline = id.len() <= RECEIPT_INLINE_BYTES;
            assert_eq!(matches!(r, ReceiptId::Short { .. }), inline, "{id}");
        }
        assert_eq!(
            std::mem::size_of::<Option<ReceiptId>>(),
            std::mem::size_of::<Option<String>>()
        );
    }

    #[test]
    fn receipts_release_in_frame_order() {
        let mut r = Receipts::default();
        r.push(
            Some(ReceiptId::new("a")),
            &[Ticket(1)].into_iter().collect(),
            false,
            false,
        );
        r.push(None, &Tickets::new(), false, false); // nothing to wait for: no entry
        r.push(Some(ReceiptId::new("b")), &Tickets::new(), false, false);
        assert_eq!(r.outstanding(), 1);
        assert!(r.pop_ready().is_none(), "b must wait for a");
        let seq = r.committed(Ticket(1));
        assert!(seq.is_some());
        assert_eq!(seq.and_then(|s| r.receipt_of(s)), Some("a".into()));
        assert_eq!(r.committed(Ticket(1)), None);
        assert_eq!(
            r.pop_ready().and_then(|p| p.receipt),
            Some(ReceiptId::new("a"))
        );
        assert_eq!(
            r.pop_ready().and_then(|p| p.receipt),
            Some(ReceiptId::new("b"))
        );
        assert!(r.pop_ready().is_none());
        assert!(r.0.is_some(), "a producer keeps its ticket map");
        let mut receipts_only = Receipts::default();
        receipts_only.push(Some(ReceiptId::new("s")), &Tickets::new(), false, false);
        assert!(receipts_only.pop_ready().is_some());
        assert!(receipts_only.0.is_none(), "nothing kept for receipts alone");
    }
}
