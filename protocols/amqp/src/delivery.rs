//! Transfers both ways: client publishes (single or multi-frame, settled
//! or not, transactional) and broker deliveries (split at the peer's
//! max-frame-size), plus the core's Committed and Drained events.
//!
//! An unsettled publish is disposed `accepted` only when its commit ticket
//! comes back; a pre-settled one is published with no confirmation.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState, Outcome as AmqpOutcome, Rejected};
use fe2o3_amqp_types::performatives::{Disposition, Transfer};
use fe2o3_amqp_types::transaction::TransactionalState;
use rosetta_neutral::address::validate_topic_name;
use rosetta_neutral::{
    Address, BrokerError, ConsumerId, Delivery, Guarantee, Outcome, PublishOptions, Ticket,
};
use tracing::{debug, trace};

use crate::connection::{write_perf, AmqpConnection, Fault, PendingCommit};
use crate::error::AmqpError;
use crate::frame;
use crate::link::{LinkKind, Partial};
use crate::message;
use crate::session::{OutDelivery, Queued};

/// A complete incoming delivery.
pub(crate) struct Incoming {
    pub(crate) delivery_id: u32,
    pub(crate) settled: bool,
    pub(crate) txn: Option<Vec<u8>>,
    pub(crate) payload: Bytes,
}

impl AmqpConnection {
    pub(crate) fn on_transfer(
        &mut self,
        ch: u16,
        t: Transfer,
        payload: Bytes,
    ) -> Result<(), Fault> {
        let size_max = self.cfg.message_size_max_bytes;
        let window_full = self.cfg.session_window_frames;
        let Some(s) = self.sessions.get_mut(&ch) else {
            return Ok(());
        };
        if s.incoming_window == 0 {
            return Err(Fault::Session(AmqpError::WindowViolation(
                "transfer beyond the incoming window".into(),
            )));
        }
        s.incoming_window -= 1;
        s.next_incoming_id = s.next_incoming_id.wrapping_add(1);
        let reopen_window = s.incoming_window <= window_full / 2;
        if reopen_window {
            s.incoming_window = window_full;
            let flow = s.flow();
            write_perf(&mut self.out, s.local_channel, &flow, &[]);
        }
        let handle = t.handle.0;
        let Some(link) = s.links.get_mut(&handle) else {
            if s.detaching.contains(&handle) {
                return Ok(());
            }
            return Err(Fault::Session(AmqpError::UnattachedHandle(handle)));
        };
        let LinkKind::Incoming(i) = &mut link.kind else {
            return Err(Fault::Link(
                handle,
                AmqpError::IllegalState("transfer on a link where the broker sends".into()),
            ));
        };
        let coordinator = i.coordinator;
        let complete = match i.partial.take() {
            None => {
                let Some(delivery_id) = t.delivery_id else {
                    return Err(Fault::Link(
                        handle,
                        AmqpError::InvalidField("first transfer without delivery-id".into()),
                    ));
                };
                if i.credit_limit == i.delivery_count {
                    return Err(Fault::Link(
                        handle,
                        AmqpError::TransferLimitExceeded("transfer without link credit".into()),
                    ));
                }
                i.delivery_count = i.delivery_count.wrapping_add(1);
                if t.aborted {
                    return Ok(());
                }
                let settled = i.presettled || t.settled.unwrap_or(false);
                let txn = match t.state {
                    Some(DeliveryState::TransactionalState(ts)) => Some(ts.txn_id.into_vec()),
                    _ => None,
                };
                if payload.len() as u64 > size_max {
                    return Err(Fault::Link(
                        handle,
                        AmqpError::MessageSizeExceeded(format!("{} bytes", payload.len())),
                    ));
                }
                if t.more {
                    let mut buf = BytesMut::with_capacity(payload.len() * 2);
                    buf.extend_from_slice(&payload);
                    i.partial = Some(Partial {
                        delivery_id,
                        settled,
                        txn,
                        buf,
                    });
                    return Ok(());
                }
                Incoming {
                    delivery_id,
                    settled,
                    txn,
                    payload,
                }
            }
            Some(mut p) => {
                if t.aborted {
                    trace!(conn = self.conn_id, handle, "delivery aborted");
                    return Ok(());
                }
                if (p.buf.len() + payload.len()) as u64 > size_max {
                    return Err(Fault::Link(
                        handle,
                        AmqpError::MessageSizeExceeded(format!("more than {size_max} bytes")),
                    ));
                }
                p.buf.extend_from_slice(&payload);
                p.settled |= t.settled.unwrap_or(false);
                if t.more {
                    i.partial = Some(p);
                    return Ok(());
                }
                Incoming {
                    delivery_id: p.delivery_id,
                    settled: p.settled,
                    txn: p.txn,
                    payload: exact_payload(p.buf),
                }
            }
        };
        if coordinator {
            self.on_control(ch, handle, complete)
        } else {
            self.publish(ch, handle, complete)?;
            self.refill_credit(ch, handle);
            Ok(())
        }
    }

    fn publish(&mut self, ch: u16, handle: u32, d: Incoming) -> Result<(), Fault> {
        let Some(link) = self.link_mut(ch, handle) else {
            return Ok(());
        };
        let serial = link.serial;
        let LinkKind::Incoming(i) = &link.kind else {
            return Ok(());
        };
        let fixed_target = i.target.clone();
        let decoded = match message::decode(&d.payload, self.now_ms) {
            Ok(m) => m,
            Err(e) => {
                self.reject(ch, handle, &d, &AmqpError::Decode(e));
                return Ok(());
            }
        };
        let address = match (&fixed_target, &decoded.to) {
            (Some(a), _) => Cow::Borrowed(a),
            (None, Some(to)) => match Address::parse_destination(to) {
                Ok(a) => Cow::Owned(a),
                Err(e) => {
                    self.reject(
                        ch,
                        handle,
                        &d,
                        &AmqpError::InvalidField(format!("to {to:?}: {e}")),
                    );
                    return Ok(());
                }
            },
            (None, None) => {
                self.reject(
                    ch,
                    handle,
                    &d,
                    &AmqpError::InvalidField("anonymous relay message without `to`".into()),
                );
                return Ok(());
            }
        };
        if let Address::Topic(name) = &*address {
            if let Err(e) = validate_topic_name(name) {
                self.reject(ch, handle, &d, &AmqpError::InvalidField(e.to_string()));
                return Ok(());
            }
        }
        let txn = match &d.txn {
            Some(id) => match self.txn_for(id) {
                Some(t) => Some(t),
                None => {
                    self.reject(ch, handle, &d, &AmqpError::UnknownTxn(format!("{id:02x?}")));
                    return Ok(());
                }
            },
            None => None,
        };
        let mut msg = decoded.message;
        msg.guarantee = if d.settled {
            Guarantee::AtMostOnce
        } else {
            Guarantee::AtLeastOnce
        };
        let options = PublishOptions {
            txn,
            confirm: !d.settled && txn.is_none(),
        };
        let Some(core) = self.core.as_deref_mut() else {
            return Ok(());
        };
        match core.publish(&address, msg, options) {
            Ok(receipt) => {
                if d.settled {
                    return Ok(());
                }
                if let (Some(_), Some(id)) = (txn, &d.txn) {
                    let state = DeliveryState::TransactionalState(TransactionalState {
                        txn_id: id.clone().into(),
                        outcome: Some(AmqpOutcome::Accepted(Accepted {})),
                    });
                    self.dispose(ch, handle, d.delivery_id, state);
                } else if let Some(ticket) = receipt.pending {
                    self.tickets.insert(
                        ticket,
                        PendingCommit::Transfer {
                            channel: ch,
                            handle,
                            serial,
                            delivery_id: d.delivery_id,
                        },
                    );
                    if let Some(LinkKind::Incoming(i)) =
                        self.link_mut(ch, handle).map(|l| &mut l.kind)
                    {
                        i.in_flight += 1;
                    }
                } else {
                    self.accept_incoming(ch, handle, d.delivery_id);
                }
                Ok(())
            }
            Err(e) => {
                let fatal_for_link = fixed_target.is_some()
                    && matches!(
                        e,
                        BrokerError::NotFound(_)
                            | BrokerError::Unauthorized(_)
                            | BrokerError::InvalidAddress(_)
                    );
                let err = AmqpError::Broker(e);
                self.reject(ch, handle, &d, &err);
                if fatal_for_link {
                    return Err(Fault::Link(handle, err));
                }
                Ok(())
            }
        }
    }

    /// Rejects an unsettled incoming delivery (a settled one is dropped).
    pub(crate) fn reject(&mut self, ch: u16, handle: u32, d: &Incoming, e: &AmqpError) {
        debug!(conn = self.conn_id, delivery = d.delivery_id, error = %e, "rejecting delivery");
        if d.settled {
            return;
        }
        let rejected = Rejected {
            error: Some(e.to_wire()),
        };
        // Inside a known transaction the outcome is wrapped in its
        // transactional state (spec 4.5.2); an unknown txn-id gets a bare
        // rejection, since there is no transaction to name.
        let state = match &d.txn {
            Some(id) if self.txn_for(id).is_some() => {
                DeliveryState::TransactionalState(TransactionalState {
                    txn_id: id.clone().into(),
                    outcome: Some(AmqpOutcome::Rejected(rejected)),
                })
            }
            _ => DeliveryState::Rejected(rejected),
        };
        self.dispose(ch, handle, d.delivery_id, state);
    }

    /// Whether the incoming link `handle` is in rcv-settle-mode second.
    fn settles_second(&self, ch: u16, handle: u32) -> bool {
        self.sessions
            .get(&ch)
            .and_then(|s| s.links.get(&handle))
            .is_some_and(|l| matches!(&l.kind, LinkKind::Incoming(i) if i.settle_second))
    }

    /// Queues the `accepted` disposition of an incoming delivery (sent
    /// coalesced at the next poll_transmit), unsettled in mode second.
    fn accept_incoming(&mut self, ch: u16, handle: u32, delivery_id: u32) {
        let second = self.settles_second(ch, handle);
        if let Some(s) = self.sessions.get_mut(&ch) {
            if second {
                s.accepted_second.push(delivery_id);
            } else {
                s.accepted.push(delivery_id);
            }
        }
    }

    /// Sends the disposition of one incoming delivery: settled, or in mode
    /// second unsettled until the sender settles.
    pub(crate) fn dispose(&mut self, ch: u16, handle: u32, delivery_id: u32, state: DeliveryState) {
        let second = self.settles_second(ch, handle);
        let Some(s) = self.sessions.get(&ch) else {
            return;
        };
        let d = Disposition {
            role: Role::Receiver,
            first: delivery_id,
            last: None,
            settled: !second,
            state: Some(state),
            batchable: false,
        };
        write_perf(&mut self.out, s.local_channel, &d, &[]);
    }

    pub(crate) fn on_committed(&mut self, ticket: Ticket, result: Result<(), BrokerError>) {
        let Some(pending) = self.tickets.remove(&ticket) else {
            trace!(
                conn = self.conn_id,
                ?ticket,
                "commit for nothing we wait on"
            );
            return;
        };
        match pending {
            PendingCommit::Transfer {
                channel,
                handle,
                serial,
                delivery_id,
            } => {
                let Some(link) = self
                    .link_mut(channel, handle)
                    .filter(|l| l.serial == serial)
                else {
                    return;
                };
                if let LinkKind::Incoming(i) = &mut link.kind {
                    i.in_flight = i.in_flight.saturating_sub(1);
                }
                match result {
                    Ok(()) => self.accept_incoming(channel, handle, delivery_id),
                    Err(e) => {
                        let state = DeliveryState::Rejected(Rejected {
                            error: Some(AmqpError::Broker(e).to_wire()),
                        });
                        self.dispose(channel, handle, delivery_id, state);
                    }
                }
                self.refill_credit(channel, handle);
            }
            PendingCommit::SettleBack {
                channel,
                delivery_id,
                outcome,
            } => {
                // A failed journal write leaves the outcome applied in
                // memory; settling still ends the receiver's wait.
                if let Err(e) = &result {
                    debug!(conn = self.conn_id, error = %e, "settlement commit failed");
                }
                if let Some(s) = self.sessions.get(&channel) {
                    crate::session::write_settle_back(
                        &mut self.out,
                        s.local_channel,
                        delivery_id,
                        outcome,
                    );
                }
            }
            PendingCommit::Discharge {
                channel,
                handle,
                serial,
                delivery_id,
                txn,
            } => {
                if result.is_ok() {
                    self.txn_work.remove(&txn);
                } else {
                    self.undo_txn_work(txn);
                }
                if self
                    .link_mut(channel, handle)
                    .is_none_or(|l| l.serial != serial)
                {
                    return;
                }
                let state = match result {
                    Ok(()) => DeliveryState::Accepted(Accepted {}),
                    Err(e) => DeliveryState::Rejected(Rejected {
                        error: Some(AmqpError::TxnRollback(e.to_string()).to_wire()),
                    }),
                };
                self.dispose(channel, handle, delivery_id, state);
                self.refill_credit(channel, handle);
            }
        }
    }

    // ---- broker -> client ----

    pub(crate) fn on_delivery(&mut self, d: Delivery) {
        let Some(&(ch, handle)) = self.consumers.get(&d.consumer) else {
            // The link went away; cancelling the consumer returned its
            // deliveries to the queue, and this one goes back the same way.
            trace!(conn = self.conn_id, consumer = ?d.consumer, "delivery for a gone consumer");
            return;
        };
        let pending_max = self.cfg.pending_deliveries_max;
        let Some(s) = self.sessions.get_mut(&ch) else {
            return;
        };
        if let Some(LinkKind::Outgoing(o)) = s.links.get_mut(&handle).map(|l| &mut l.kind) {
            o.core_seen = o.core_seen.wrapping_add(1);
            if o.credit == 0 && !o.auto_settle {
                // The core dispatched this before it saw the client lower
                // its credit. Sending it would exceed the client's link
                // credit: it goes back to its place in the queue, uncounted.
                // (An auto-settled delivery is already gone from the queue,
                // so it is sent.)
                trace!(conn = self.conn_id, consumer = ?d.consumer, "delivery past link credit released");
                self.give_back(&d, Outcome::Release);
                return;
            }
            o.credit = o.credit.saturating_sub(1);
            if s.remote_incoming_window == 0 || !s.queued.is_empty() {
                if s.queued.len() >= pending_max {
                    self.fail(AmqpError::ResourceLimit(
                        "peer stopped reading (session window closed)".into(),
                    ));
                    return;
                }
                o.queued += 1;
                s.queued.push_back(Queued::Delivery(handle, d));
                return;
            }
        } else {
            return;
        }
        self.write_delivery(ch, handle, d);
    }

    /// Writes one delivery as one or more transfer frames.
    pub(crate) fn write_delivery(&mut self, ch: u16, handle: u32, d: Delivery) {
        let max_frame = self
            .peer_max_frame
            .min(self.cfg.frame_size_max_bytes.max(frame::MIN_MAX_FRAME_SIZE))
            as usize;
        let mut head = std::mem::take(&mut self.scratch);
        let body = match message::encode_head(&mut head, &d, self.now_ms) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(conn = self.conn_id, error = %e, "cannot encode a delivery");
                self.scratch = head;
                self.give_back(&d, Outcome::Release);
                return;
            }
        };
        let Some(s) = self.sessions.get_mut(&ch) else {
            self.scratch = head;
            return;
        };
        let Some(LinkKind::Outgoing(o)) = s.links.get_mut(&handle).map(|l| &mut l.kind) else {
            self.scratch = head;
            return;
        };
        let total = head.len() + body.len();
        if o.max_message_size.is_some_and(|m| total as u64 > m) {
            // The receiver said it cannot take it: leave it for another
            // consumer instead of sending what it would refuse.
            debug!(
                conn = self.conn_id,
                handle,
                size = total,
                "delivery over the receiver's max-message-size"
            );
            // The client never sees it, so its credit is still there: give
            // the core that credit back.
            o.credit = o.credit.saturating_add(1);
            let limit = o.core_seen.wrapping_add(o.credit);
            self.scratch = head;
            if let Some(core) = self.core.as_deref_mut() {
                if let Err(e) = core.set_credit(d.consumer, limit, false) {
                    debug!(conn = self.conn_id, error = %e, "credit restore failed");
                }
            }
            self.give_back(
                &d,
                Outcome::Modify {
                    delivery_failed: false,
                    undeliverable_here: true,
                },
            );
            return;
        }
        let delivery_id = s.next_delivery_id;
        s.next_delivery_id = s.next_delivery_id.wrapping_add(1);
        let settled = o.auto_settle;
        // Acquired under a transaction (spec 4.4.3): the transfer says so,
        // and a rollback returns the message. An auto-settled delivery has
        // already left its queue, so no transaction can give it back.
        let acquired = o
            .acquire_txn
            .filter(|t| !settled && self.txns.contains_key(t));
        if acquired.is_none() {
            o.acquire_txn = None;
        }
        let mut state = [0u8; TXN_STATE_LEN];
        if let Some(t) = acquired {
            write_txn_state(&mut state, t);
            self.txn_work
                .entry(t)
                .or_default()
                .push((d.consumer, d.tag));
        }
        o.delivery_count = o.delivery_count.wrapping_add(1);
        let tag = d.tag.0.to_be_bytes();
        // Concatenation of `head` and `body`, written in frame-sized chunks.
        let mut written = 0usize;
        let mut first = true;
        loop {
            let start = frame::begin_frame(&mut self.out, frame::FRAME_TYPE_AMQP, s.local_channel);
            let first_fields = first.then_some(FirstFields {
                delivery_id,
                tag: &tag,
                settled,
                state: acquired.map(|_| &state[..]),
            });
            let more_at = write_transfer(&mut self.out, handle, first_fields);
            let remaining = total - written;
            if remaining > max_frame.saturating_sub(self.out.len() - start) {
                // `more` is a one-byte boolean: flip it in place.
                self.out[more_at] = BOOL_TRUE;
            }
            let room = max_frame.saturating_sub(self.out.len() - start);
            if room == 0 {
                tracing::error!(
                    conn = self.conn_id,
                    "peer max-frame-size leaves no room for payload"
                );
                self.out.truncate(start);
                break;
            }
            let chunk = remaining.min(room);
            append_range(&mut self.out, &head, body, written, written + chunk);
            frame::finish_frame(&mut self.out, start);
            written += chunk;
            s.next_outgoing_id = s.next_outgoing_id.wrapping_add(1);
            s.remote_incoming_window = s.remote_incoming_window.saturating_sub(1);
            first = false;
            if written >= total {
                break;
            }
        }
        if !settled {
            if let Some(LinkKind::Outgoing(o)) = s.links.get_mut(&handle).map(|l| &mut l.kind) {
                o.unsettled += 1;
            }
            s.unsettled_out.insert(
                delivery_id,
                OutDelivery {
                    handle,
                    consumer: d.consumer,
                    tag: d.tag,
                },
            );
        }
        self.scratch = head;
    }

    /// Settles a delivery we will not send (auto-settled ones are gone).
    fn give_back(&mut self, d: &Delivery, outcome: Outcome) {
        if let Some(core) = self.core.as_deref_mut() {
            if let Err(e) = core.settle(d.consumer, d.tag, outcome, None, false) {
                debug!(conn = self.conn_id, error = %e, "settle of an unsendable delivery failed");
            }
        }
    }

    pub(crate) fn on_drained(&mut self, consumer: ConsumerId) {
        let Some(&(ch, handle)) = self.consumers.get(&consumer) else {
            return;
        };
        let Some(s) = self.sessions.get_mut(&ch) else {
            return;
        };
        if !s.queued.is_empty() || s.remote_incoming_window == 0 {
            s.queued.push_back(Queued::DrainFlow(handle));
            return;
        }
        self.write_drain_flow(ch, handle);
    }

    /// Answers a drain: the unused credit is consumed by advancing the
    /// delivery-count, and the link reports zero credit.
    pub(crate) fn write_drain_flow(&mut self, ch: u16, handle: u32) {
        if let Some(LinkKind::Outgoing(o)) = self.link_mut(ch, handle).map(|l| &mut l.kind) {
            o.delivery_count = o.delivery_count.wrapping_add(o.credit);
            o.credit = 0;
        } else {
            return;
        }
        self.write_link_flow(ch, handle, true);
    }
}

/// A reassembled message larger than this whose buffer grew well past its
/// size is copied into an allocation of its own size: the message lives on
/// in queues, and a frozen buffer would pin all its slack (up to as much
/// again, from doubling) for as long.
const SLACK_COPY_MIN_BYTES: usize = 64 * 1024;

/// The reassembled payload in `buf`, without the buffer's slack.
fn exact_payload(buf: BytesMut) -> Bytes {
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
const TXN_STATE_LEN: usize = 3 + 3 + 2 + 8;

/// Writes the `transactional-state` of a delivery acquired under `txn`.
fn write_txn_state(out: &mut [u8; TXN_STATE_LEN], txn: u64) {
    out[..8].copy_from_slice(&[0x00, 0x53, 0x34, 0xc0, 11, 1, 0xa0, 8]);
    out[8..].copy_from_slice(&txn.to_be_bytes());
}

/// The fields of a delivery's first transfer frame.
struct FirstFields<'a> {
    delivery_id: u32,
    tag: &'a [u8; 8],
    settled: bool,
    /// An encoded delivery state (transactional acquisition), if any.
    state: Option<&'a [u8]>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::performatives::Performative;

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
