//! Delivery helpers for the session and link levels: the complete
//! incoming delivery a link hands up, the hand-written transfer frames of
//! outgoing deliveries (the hot path: no serde, no allocation), and the
//! dispositions and outcome mappings both directions share.
//!
//! Nothing here owns state: windows, ids and unsettled maps are the
//! session's, credit and partial transfers the link's.

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::{
    Accepted, DeliveryState, Modified, Outcome as AmqpOutcome, Rejected, Released,
};
use fe2o3_amqp_types::performatives::Disposition;
use rosetta_neutral::Outcome;

use crate::frame::{self, write_perf};

/// A complete incoming delivery.
pub(crate) struct Incoming {
    pub(crate) delivery_id: u32,
    pub(crate) settled: bool,
    pub(crate) txn: Option<Vec<u8>>,
    pub(crate) payload: Bytes,
}

/// Writes `accepted` dispositions for `ids`, coalesced into ranges, and
/// empties `ids`.
pub(crate) fn write_accepted(out: &mut Vec<u8>, channel: u16, ids: &mut Vec<u32>, settled: bool) {
    if ids.is_empty() {
        return;
    }
    ids.sort_unstable();
    let mut i = 0;
    while i < ids.len() {
        let first = ids[i];
        let mut last = first;
        i += 1;
        while i < ids.len() && ids[i] == last.wrapping_add(1) {
            last = ids[i];
            i += 1;
        }
        let d = Disposition {
            role: Role::Receiver,
            first,
            last: (last != first).then_some(last),
            settled,
            state: Some(DeliveryState::Accepted(Accepted {})),
            batchable: false,
        };
        write_perf(out, channel, &d, &[]);
    }
    ids.clear();
}

/// Our settling disposition (role sender) for a delivery whose receiver
/// left its outcome unsettled; it repeats the outcome the core applied.
pub(crate) fn write_settle_back(out: &mut Vec<u8>, channel: u16, delivery_id: u32, o: Outcome) {
    let state = match o {
        Outcome::Accept => DeliveryState::Accepted(Accepted {}),
        Outcome::Release => DeliveryState::Released(Released {}),
        Outcome::Reject => DeliveryState::Rejected(Rejected { error: None }),
        Outcome::Modify {
            delivery_failed,
            undeliverable_here,
        } => DeliveryState::Modified(Modified {
            delivery_failed: Some(delivery_failed),
            undeliverable_here: Some(undeliverable_here),
            message_annotations: None,
        }),
    };
    let d = Disposition {
        role: Role::Sender,
        first: delivery_id,
        last: None,
        settled: true,
        state: Some(state),
        batchable: false,
    };
    write_perf(out, channel, &d, &[]);
}

/// The core outcome for a terminal delivery state; `None` for non-terminal.
pub(crate) fn delivery_state_outcome(state: &DeliveryState) -> Option<Outcome> {
    match state {
        DeliveryState::Accepted(_) => Some(Outcome::Accept),
        DeliveryState::Released(_) => Some(Outcome::Release),
        DeliveryState::Rejected(_) => Some(Outcome::Reject),
        DeliveryState::Modified(m) => Some(modify(m)),
        DeliveryState::Received(_)
        | DeliveryState::Declared(_)
        | DeliveryState::TransactionalState(_) => None,
    }
}

pub(crate) fn outcome_of(o: &AmqpOutcome) -> Option<Outcome> {
    match o {
        AmqpOutcome::Accepted(_) => Some(Outcome::Accept),
        AmqpOutcome::Released(_) => Some(Outcome::Release),
        AmqpOutcome::Rejected(_) => Some(Outcome::Reject),
        AmqpOutcome::Modified(m) => Some(modify(m)),
        AmqpOutcome::Declared(_) => None,
    }
}

fn modify(m: &Modified) -> Outcome {
    Outcome::Modify {
        delivery_failed: m.delivery_failed.unwrap_or(false),
        undeliverable_here: m.undeliverable_here.unwrap_or(false),
    }
}

/// A reassembled message larger than this whose buffer grew well past its
/// size is copied into an allocation of its own size: the message lives on
/// in queues, and a frozen buffer would pin all its slack (up to as much
/// again, from doubling) for as long.
const SLACK_COPY_MIN_BYTES: usize = 64 * 1024;

/// The reassembled payload in `buf`, without the buffer's slack.
pub(crate) fn exact_payload(buf: BytesMut) -> Bytes {
    let slack = buf.capacity() - buf.len();
    if buf.len() >= SLACK_COPY_MIN_BYTES && slack > buf.len() / 4 {
        Bytes::copy_from_slice(&buf)
    } else {
        buf.freeze()
    }
}

const BOOL_TRUE: u8 = 0x41;
const BOOL_FALSE: u8 = 0x42;
const NULL: u8 = 0x40;

/// Encoded `transactional-state` with an 8-byte txn-id and no outcome:
/// descriptor 0x34, list8 (size 11, count 1), vbin8 of 8 bytes.
pub(crate) const TXN_STATE_LEN: usize = 3 + 3 + 2 + 8;

/// Writes the `transactional-state` of a delivery acquired under `txn`.
pub(crate) fn write_txn_state(out: &mut [u8; TXN_STATE_LEN], txn: u64) {
    out[..8].copy_from_slice(&[0x00, 0x53, 0x34, 0xc0, 11, 1, 0xa0, 8]);
    out[8..].copy_from_slice(&txn.to_be_bytes());
}

/// The fields of a delivery's first transfer frame.
pub(crate) struct FirstFields<'a> {
    pub(crate) delivery_id: u32,
    pub(crate) tag: &'a [u8; 8],
    pub(crate) settled: bool,
    /// An encoded delivery state (transactional acquisition), if any.
    pub(crate) state: Option<&'a [u8]>,
}

/// Appends a transfer performative by hand (the hot path: no allocation,
/// no serde), as a described list8 of handle, delivery-id, delivery-tag,
/// message-format, settled, more and, when there is one, rcv-settle-mode
/// (null) and state; trailing defaults are omitted, which the spec allows.
/// Continuation frames carry only handle and more. Returns the offset of
/// the `more` byte.
fn write_transfer(out: &mut Vec<u8>, handle: u32, first: Option<FirstFields<'_>>) -> usize {
    let count = if first.as_ref().is_some_and(|f| f.state.is_some()) {
        8
    } else {
        6
    };
    out.extend_from_slice(&[0x00, 0x53, 0x14, 0xc0, 0, count]);
    let size_at = out.len() - 2;
    write_uint(out, handle);
    let mut state = None;
    match first {
        Some(f) => {
            write_uint(out, f.delivery_id);
            out.extend_from_slice(&[0xa0, 8]);
            out.extend_from_slice(f.tag);
            out.push(0x43); // message-format uint0
            out.push(if f.settled { BOOL_TRUE } else { BOOL_FALSE });
            state = f.state;
        }
        None => out.extend_from_slice(&[NULL, NULL, NULL, NULL]),
    }
    let more_at = out.len();
    out.push(BOOL_FALSE);
    if let Some(state) = state {
        out.push(NULL); // rcv-settle-mode
        out.extend_from_slice(state);
    }
    // Our own invariant: at most 1 + 5 + 5 + 10 + 1 + 1 + 1 + 1 + 16 bytes.
    let size = out.len() - size_at - 1;
    assert!(size < 256, "transfer list8 overflow");
    out[size_at] = size as u8;
    more_at
}

fn write_uint(out: &mut Vec<u8>, v: u32) {
    match v {
        0 => out.push(0x43),
        1..=255 => out.extend_from_slice(&[0x52, v as u8]),
        _ => {
            out.push(0x70);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// Appends bytes `[from, to)` of the concatenation `head ++ body`.
fn append_range(out: &mut Vec<u8>, head: &[u8], body: &[u8], from: usize, to: usize) {
    let h = head.len();
    if from < h {
        out.extend_from_slice(&head[from..to.min(h)]);
    }
    if to > h {
        out.extend_from_slice(&body[from.max(h) - h..to - h]);
    }
}

/// Writes one delivery as one or more transfer frames of at most
/// `max_frame` bytes on `channel`: `first` in the first frame, then the
/// concatenation of `head` and `body` in frame-sized chunks. Returns how
/// many frames it wrote (each takes a transfer id of the session's).
pub(crate) fn write_transfers(
    out: &mut Vec<u8>,
    channel: u16,
    handle: u32,
    first: FirstFields<'_>,
    head: &[u8],
    body: &[u8],
    max_frame: usize,
) -> u32 {
    let total = head.len() + body.len();
    let mut written = 0usize;
    let mut frames = 0u32;
    let mut first = Some(first);
    loop {
        let start = frame::begin_frame(out, frame::FRAME_TYPE_AMQP, channel);
        let more_at = write_transfer(out, handle, first.take());
        let remaining = total - written;
        if remaining > max_frame.saturating_sub(out.len() - start) {
            // `more` is a one-byte boolean: flip it in place.
            out[more_at] = BOOL_TRUE;
        }
        let room = max_frame.saturating_sub(out.len() - start);
        if room == 0 {
            tracing::error!("peer max-frame-size leaves no room for payload");
            out.truncate(start);
            break;
        }
        let chunk = remaining.min(room);
        append_range(out, head, body, written, written + chunk);
        frame::finish_frame(out, start);
        written += chunk;
        frames = frames.wrapping_add(1);
        if written >= total {
            break;
        }
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::performatives::{Performative, Transfer};

    fn decode(buf: &[u8]) -> Transfer {
        match crate::codec::decode::<Performative>("t", buf).unwrap() {
            Performative::Transfer(t) => t,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hand_written_transfer_decodes_as_the_types_crate_expects() {
        for (handle, id) in [(0u32, 0u32), (7, 300), (70_000, u32::MAX)] {
            let mut out = Vec::new();
            let tag = 42u64.to_be_bytes();
            let more_at = write_transfer(
                &mut out,
                handle,
                Some(FirstFields {
                    delivery_id: id,
                    tag: &tag,
                    settled: true,
                    state: None,
                }),
            );
            let t = decode(&out);
            assert_eq!(t.handle.0, handle);
            assert_eq!(t.delivery_id, Some(id));
            assert_eq!(t.delivery_tag.unwrap().as_slice(), &tag);
            assert_eq!(t.message_format, Some(0));
            assert_eq!(t.settled, Some(true));
            assert!(!t.more);
            out[more_at] = BOOL_TRUE;
            assert!(decode(&out).more);
            assert_eq!(crate::codec::value_len(&out), Ok(out.len()));
        }
        // With a transactional-state (acquisition).
        let mut out = Vec::new();
        let mut state = [0u8; TXN_STATE_LEN];
        write_txn_state(&mut state, 0x0102_0304_0506_0708);
        let tag = 9u64.to_be_bytes();
        write_transfer(
            &mut out,
            1,
            Some(FirstFields {
                delivery_id: 2,
                tag: &tag,
                settled: false,
                state: Some(&state),
            }),
        );
        let t = decode(&out);
        assert_eq!(
            (t.delivery_id, t.settled, t.more),
            (Some(2), Some(false), false)
        );
        assert_eq!(t.rcv_settle_mode, None);
        let Some(DeliveryState::TransactionalState(ts)) = t.state else {
            panic!("{:?}", t.state)
        };
        assert_eq!(ts.txn_id.as_slice(), &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(ts.outcome.is_none());
        assert_eq!(crate::codec::value_len(&out), Ok(out.len()));

        let mut out = Vec::new();
        write_transfer(&mut out, 3, None);
        let t = decode(&out);
        assert_eq!(
            (t.handle.0, t.delivery_id, t.delivery_tag, t.settled),
            (3, None, None, None)
        );
    }
}
