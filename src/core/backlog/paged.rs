//! What stays in memory of a message that waits on disk: everything but
//! the message itself. Shared by the backlog's paging and the schedule's.

use bytes::Bytes;
use rosetta_neutral::{MatchInfo, Message};
use rosetta_store::{MessageSeq, PageRef, QueueId};
use std::sync::Arc;

use crate::codec::decode_message_exact;
use crate::queue::{ConsumerKey, Entry};
use crate::Journal;

/// What stays in memory of a paged message: everything but the message.
/// Kept small (about 48 bytes): there is one per paged message.
#[derive(Debug)]
pub(crate) struct Paged {
    /// Where it is in the page file; for a message paged by reference, only
    /// `len` means something (its size, for the depaging batch bound).
    pub(crate) at: PageRef,
    pub(crate) seq: MessageSeq,
    pub(crate) journaled: bool,
    /// Paged by reference: read back from the journal, not the page file.
    pub(crate) in_journal: bool,
    pub(crate) enqueued_at_ms: u64,
    /// Delivery state, for the rare paged message that has any (a
    /// redelivered message recovered from the journal, a retained copy).
    pub(crate) state: Option<Box<DeliveryState>>,
}

/// The part of an [`Entry`] that is usually at its default.
#[derive(Debug, Default)]
pub(crate) struct DeliveryState {
    delivery_count: u32,
    redelivered: bool,
    from_retained: bool,
    matched: MatchInfo,
    annotation: Option<Bytes>,
    /// Not to be offered to this consumer again (a delivery that came back
    /// undeliverable-here and waits out a redelivery delay on disk).
    excluded: Option<ConsumerKey>,
}

impl Paged {
    pub(crate) fn of(entry: Entry, at: PageRef) -> Self {
        let state = DeliveryState {
            delivery_count: entry.delivery_count,
            redelivered: entry.redelivered,
            from_retained: entry.from_retained,
            matched: entry.matched,
            annotation: entry.annotation,
            excluded: entry.excluded,
        };
        let usual = state.delivery_count == 0
            && !state.redelivered
            && !state.from_retained
            && state.matched == MatchInfo::default()
            && state.annotation.is_none()
            && state.excluded.is_none();
        Self {
            at,
            seq: entry.seq,
            journaled: entry.journaled,
            in_journal: false,
            enqueued_at_ms: entry.enqueued_at_ms,
            state: (!usual).then(|| Box::new(state)),
        }
    }

    pub(crate) fn into_entry(self, message: Arc<Message>) -> Entry {
        let mut entry = Entry::new(self.seq, message, self.journaled, self.enqueued_at_ms);
        if let Some(state) = self.state {
            entry.delivery_count = state.delivery_count;
            entry.redelivered = state.redelivered;
            entry.from_retained = state.from_retained;
            entry.matched = state.matched;
            entry.annotation = state.annotation;
            entry.excluded = state.excluded;
        }
        entry
    }
}

/// A paged message's bytes, decoded; `None` (logged) when they do not
/// decode: dropped from memory, the journal keeps it until restart.
pub(crate) fn decode(queue: QueueId, seq: MessageSeq, body: Bytes) -> Option<Arc<Message>> {
    match decode_message_exact(body) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::error!(queue, seq, error = %e, "a paged message does not decode; dropped from memory (the journal keeps it until restart)");
            None
        }
    }
}

/// The messages `seqs`, paged by reference, read back from the journal;
/// `None` when none could be read (a failing disk: try again later),
/// `None` items for single messages that could not (logged).
pub(crate) fn read_from_journal(
    journal: &dyn Journal,
    queue: QueueId,
    seqs: &[MessageSeq],
) -> Option<Vec<Option<Arc<Message>>>> {
    let read = journal.read_messages(seqs);
    if read.iter().all(|r| r.is_err()) {
        if let Some(Err(e)) = read.first() {
            tracing::error!(queue, error = %e, "cannot read paged messages back from the journal");
        }
        return None;
    }
    Some(
        read.into_iter()
            .zip(seqs)
            .map(|(r, seq)| match r {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::error!(queue, seq, error = %e, "a paged message cannot be read back from the journal; dropped from memory (the journal keeps it until restart)");
                    None
                }
            })
            .collect(),
    )
}
