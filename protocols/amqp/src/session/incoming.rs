//! Client -> broker: transfers through the session's incoming window to
//! their link, publishes (settled or not, transactional), and the
//! dispositions that answer them.
//!
//! An unsettled publish is disposed `accepted` only when its commit ticket
//! comes back ([`AmqpSession::on_publish_committed`]); a pre-settled one is
//! published with no confirmation. A complete transfer on a coordinator
//! link is not ours to read: it goes up as a [`Control`] to whoever owns
//! the transactions.

use std::sync::Arc;

use bytes::Bytes;
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState, Outcome as AmqpOutcome, Rejected};
use fe2o3_amqp_types::performatives::{Disposition, Transfer};
use fe2o3_amqp_types::transaction::TransactionalState;
use rosetta_neutral::address::validate_topic_name;
use rosetta_neutral::{Address, BrokerError, Guarantee, PublishOptions};
use tracing::debug;

use super::AmqpSession;
use crate::context::{Ctx, PendingCommit};
use crate::delivery::Incoming;
use crate::error::{AmqpError, Fault};
use crate::frame::write_perf;
use crate::link::LinkKind;
use crate::message;

/// A complete transfer on a coordinator link (a declare or discharge),
/// for the owner of the connection's transactions.
pub(crate) struct Control {
    pub(crate) handle: u32,
    pub(crate) delivery: Incoming,
}

impl AmqpSession {
    /// A transfer frame: window, link, and once the delivery is complete
    /// its publish (or, on a coordinator link, the [`Control`] to act on).
    pub(crate) fn on_transfer(
        &mut self,
        ctx: &mut Ctx<'_>,
        t: Transfer,
        payload: Bytes,
    ) -> Result<Option<Control>, Fault> {
        if self.incoming_window == 0 {
            return Err(Fault::Session(AmqpError::WindowViolation(
                "transfer beyond the incoming window".into(),
            )));
        }
        self.incoming_window -= 1;
        self.next_incoming_id = self.next_incoming_id.wrapping_add(1);
        let window_full = ctx.cfg.session_window_frames;
        if self.incoming_window <= window_full / 2 {
            self.incoming_window = window_full;
            let flow = self.flow();
            write_perf(ctx.out, self.local_channel, &flow, &[]);
        }
        let handle = t.handle.0;
        let Some(link) = self.links.get_mut(&handle) else {
            if self.is_detaching(handle) {
                return Ok(None);
            }
            return Err(Fault::Session(AmqpError::UnattachedHandle(handle)));
        };
        let size_max = ctx.cfg.message_size_max_bytes;
        let complete = link
            .on_transfer(t, payload, size_max, ctx.conn_id)
            .map_err(|e| Fault::Link(handle, e))?;
        let Some(delivery) = complete else {
            return Ok(None);
        };
        if matches!(&link.kind, LinkKind::Incoming(i) if i.coordinator) {
            return Ok(Some(Control { handle, delivery }));
        }
        self.publish(ctx, handle, delivery)?;
        self.refill_credit(ctx, handle);
        Ok(None)
    }

    fn publish(&mut self, ctx: &mut Ctx<'_>, handle: u32, d: Incoming) -> Result<(), Fault> {
        let Some(link) = self.links.get(&handle) else {
            return Ok(());
        };
        let serial = link.serial;
        let LinkKind::Incoming(i) = &link.kind else {
            return Ok(());
        };
        // The link's own address, copied once: it becomes the message's.
        let fixed_target = i.target.as_deref().cloned();
        let has_fixed_target = fixed_target.is_some();
        let decoded = match message::decode(&d.payload, ctx.now_ms) {
            Ok(m) => m,
            Err(e) => {
                self.reject(ctx, handle, &d, &AmqpError::Decode(e));
                return Ok(());
            }
        };
        let address = match (fixed_target, &decoded.to) {
            (Some(a), _) => a,
            (None, Some(to)) => {
                let resolved = crate::link::rabbitmq_queue_address(to).unwrap_or_else(|| {
                    Address::parse_destination(to)
                        .map_err(|e| AmqpError::InvalidField(format!("to {to:?}: {e}")))
                });
                match resolved {
                    Ok(a) => a,
                    Err(e) => {
                        self.reject(ctx, handle, &d, &e);
                        return Ok(());
                    }
                }
            }
            (None, None) => {
                let e = AmqpError::InvalidField("anonymous relay message without `to`".into());
                self.reject(ctx, handle, &d, &e);
                return Ok(());
            }
        };
        if let Address::Topic(name) = &address {
            if let Err(e) = validate_topic_name(name) {
                self.reject(ctx, handle, &d, &AmqpError::InvalidField(e.to_string()));
                return Ok(());
            }
        }
        let txn = match &d.txn {
            Some(id) => match ctx.conn.txns.get(id) {
                Some(t) => Some(t),
                None => {
                    let e = AmqpError::UnknownTxn(format!("{id:02x?}"));
                    self.reject(ctx, handle, &d, &e);
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
        // Handed over with its address, in the `Arc` the core keeps it in
        // (no further copy of either on the way to the queues).
        msg.address = Some(address);
        match ctx.conn.core.publish_addressed(Arc::new(msg), options) {
            Ok(receipt) => {
                if d.settled {
                    return Ok(());
                }
                if let (Some(_), Some(id)) = (txn, &d.txn) {
                    let state = DeliveryState::TransactionalState(TransactionalState {
                        txn_id: id.clone().into(),
                        outcome: Some(AmqpOutcome::Accepted(Accepted {})),
                    });
                    self.dispose(ctx.out, handle, d.delivery_id, state);
                } else if let Some(ticket) = receipt.pending {
                    ctx.conn.busy().tickets.insert(
                        ticket,
                        PendingCommit::Transfer {
                            channel: self.local_channel,
                            handle,
                            serial,
                            delivery_id: d.delivery_id,
                        },
                    );
                    if let Some(LinkKind::Incoming(i)) =
                        self.links.get_mut(&handle).map(|l| &mut l.kind)
                    {
                        i.in_flight += 1;
                    }
                } else {
                    self.accept_incoming(handle, d.delivery_id);
                }
                Ok(())
            }
            Err(e) => {
                let fatal_for_link = has_fixed_target
                    && matches!(
                        e,
                        BrokerError::NotFound(_)
                            | BrokerError::Unauthorized(_)
                            | BrokerError::InvalidAddress(_)
                    );
                let err = AmqpError::Broker(e);
                self.reject(ctx, handle, &d, &err);
                if fatal_for_link {
                    return Err(Fault::Link(handle, err));
                }
                Ok(())
            }
        }
    }

    /// Rejects an unsettled incoming delivery (a settled one is dropped).
    pub(crate) fn reject(&self, ctx: &mut Ctx<'_>, handle: u32, d: &Incoming, e: &AmqpError) {
        debug!(conn = ctx.conn_id, delivery = d.delivery_id, error = %e, "rejecting delivery");
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
            Some(id) if ctx.conn.txns.get(id).is_some() => {
                DeliveryState::TransactionalState(TransactionalState {
                    txn_id: id.clone().into(),
                    outcome: Some(AmqpOutcome::Rejected(rejected)),
                })
            }
            _ => DeliveryState::Rejected(rejected),
        };
        self.dispose(ctx.out, handle, d.delivery_id, state);
    }

    /// Whether the incoming link `handle` is in rcv-settle-mode second.
    fn settles_second(&self, handle: u32) -> bool {
        self.links
            .get(&handle)
            .is_some_and(|l| matches!(&l.kind, LinkKind::Incoming(i) if i.settle_second))
    }

    /// Queues the `accepted` disposition of an incoming delivery (sent
    /// coalesced at the next poll_transmit), unsettled in mode second.
    fn accept_incoming(&mut self, handle: u32, delivery_id: u32) {
        let second = self.settles_second(handle);
        let busy = super::busy(&mut self.busy);
        if second {
            busy.accepted_second.push(delivery_id);
        } else {
            busy.accepted.push(delivery_id);
        }
    }

    /// Sends the disposition of one incoming delivery: settled, or in mode
    /// second unsettled until the sender settles.
    pub(crate) fn dispose(
        &self,
        out: &mut Vec<u8>,
        handle: u32,
        delivery_id: u32,
        state: DeliveryState,
    ) {
        let d = Disposition {
            role: Role::Receiver,
            first: delivery_id,
            last: None,
            settled: !self.settles_second(handle),
            state: Some(state),
            batchable: false,
        };
        write_perf(out, self.local_channel, &d, &[]);
    }

    /// The commit an unsettled publish waited for: accept it (or reject it
    /// if the commit failed) and give its credit back. Nothing if the link
    /// with this `serial` is gone (its handle may be reused).
    pub(crate) fn on_publish_committed(
        &mut self,
        ctx: &mut Ctx<'_>,
        handle: u32,
        serial: u64,
        delivery_id: u32,
        result: Result<(), BrokerError>,
    ) {
        let Some(link) = self.links.get_mut(&handle).filter(|l| l.serial == serial) else {
            return;
        };
        if let LinkKind::Incoming(i) = &mut link.kind {
            i.in_flight = i.in_flight.saturating_sub(1);
        }
        match result {
            Ok(()) => self.accept_incoming(handle, delivery_id),
            Err(e) => {
                let state = DeliveryState::Rejected(Rejected {
                    error: Some(AmqpError::Broker(e).to_wire()),
                });
                self.dispose(ctx.out, handle, delivery_id, state);
            }
        }
        self.refill_credit(ctx, handle);
    }
}
