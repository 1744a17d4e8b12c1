//! Broker -> client: the core's deliveries for this session's links, sent
//! as transfers split at the peer's max-frame-size while the peer's
//! incoming window allows, queued behind it otherwise, and the drain
//! answers that must follow the deliveries before them.

use rosetta_neutral::{Delivery, Outcome};
use tracing::{debug, trace};

use super::{busy, AmqpSession, OutDelivery, Queued};
use crate::context::Ctx;
use crate::delivery::{write_transfers, write_txn_state, FirstFields, TXN_STATE_LEN};
use crate::error::AmqpError;
use crate::frame;
use crate::link::LinkKind;
use crate::message;

impl AmqpSession {
    /// A delivery from the core for the link with `handle`. An error (the
    /// queue behind the peer's window is full: the peer stopped reading)
    /// closes the connection.
    pub(crate) fn on_delivery(
        &mut self,
        ctx: &mut Ctx<'_>,
        handle: u32,
        d: Delivery,
    ) -> Result<(), AmqpError> {
        let Some(LinkKind::Outgoing(o)) = self.links.get_mut(&handle).map(|l| &mut l.kind) else {
            return Ok(());
        };
        if !o.admit() {
            trace!(conn = ctx.conn_id, consumer = ?d.consumer, "delivery past link credit released");
            give_back(ctx, &d, Outcome::Release);
            return Ok(());
        }
        let queued = self.busy.as_ref().map_or(0, |b| b.queued.len());
        if self.remote_incoming_window == 0 || queued > 0 {
            if queued >= ctx.cfg.pending_deliveries_max {
                return Err(AmqpError::ResourceLimit(
                    "peer stopped reading (session window closed)".into(),
                ));
            }
            o.queued += 1;
            busy(&mut self.busy)
                .queued
                .push_back(Queued::Delivery(handle, d));
            return Ok(());
        }
        self.write_delivery(ctx, handle, d);
        Ok(())
    }

    /// Writes one delivery as one or more transfer frames.
    fn write_delivery(&mut self, ctx: &mut Ctx<'_>, handle: u32, d: Delivery) {
        let max_frame = ctx
            .conn
            .peer_max_frame
            .min(ctx.cfg.frame_size_max_bytes.max(frame::MIN_MAX_FRAME_SIZE))
            as usize;
        let mut head = std::mem::take(&mut ctx.conn.busy().scratch);
        let body = match message::encode_head(&mut head, &d, ctx.now_ms) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(conn = ctx.conn_id, error = %e, "cannot encode a delivery");
                ctx.conn.busy().scratch = head;
                give_back(ctx, &d, Outcome::Release);
                return;
            }
        };
        let Some(LinkKind::Outgoing(o)) = self.links.get_mut(&handle).map(|l| &mut l.kind) else {
            ctx.conn.busy().scratch = head;
            return;
        };
        let total = head.len() + body.len();
        if o.max_message_size > 0 && total as u64 > o.max_message_size {
            // The receiver said it cannot take it: leave it for another
            // consumer instead of sending what it would refuse.
            debug!(
                conn = ctx.conn_id,
                handle,
                size = total,
                "delivery over the receiver's max-message-size"
            );
            // The client never sees it, so its credit is still there: give
            // the core that credit back.
            let limit = o.restore_credit();
            ctx.conn.busy().scratch = head;
            if let Err(e) = ctx.conn.core.set_credit(d.consumer, limit, false) {
                debug!(conn = ctx.conn_id, error = %e, "credit restore failed");
            }
            let outcome = Outcome::Modify {
                delivery_failed: false,
                undeliverable_here: true,
            };
            give_back(ctx, &d, outcome);
            return;
        }
        let delivery_id = self.next_delivery_id;
        self.next_delivery_id = self.next_delivery_id.wrapping_add(1);
        let settled = o.auto_settle;
        // Acquired under a transaction (spec 4.4.3): the transfer says so,
        // and a rollback returns the message. An auto-settled delivery has
        // already left its queue, so no transaction can give it back.
        let acquired = o
            .acquire_txn()
            .filter(|t| !settled && ctx.conn.txns.contains(*t));
        if acquired.is_none() {
            o.set_acquire_txn(None);
        }
        let mut state = [0u8; TXN_STATE_LEN];
        if let Some(t) = acquired {
            write_txn_state(&mut state, t);
            ctx.conn.txns.hold(t, (d.consumer, d.tag));
        }
        o.delivery_count = o.delivery_count.wrapping_add(1);
        if !settled {
            o.unsettled += 1;
        }
        let tag = d.tag.0.to_be_bytes();
        let first = FirstFields {
            delivery_id,
            tag: &tag,
            settled,
            state: acquired.map(|_| &state[..]),
        };
        let frames = write_transfers(
            ctx.out,
            self.local_channel,
            handle,
            first,
            &head,
            body,
            max_frame,
        );
        self.next_outgoing_id = self.next_outgoing_id.wrapping_add(frames);
        self.remote_incoming_window = self.remote_incoming_window.saturating_sub(frames);
        if !settled {
            busy(&mut self.busy).unsettled_out.insert(
                delivery_id,
                OutDelivery {
                    handle,
                    consumer: d.consumer,
                    tag: d.tag,
                },
            );
        }
        ctx.conn.busy().scratch = head;
    }

    /// A browser has seen everything: its credit is drained now and
    /// whenever the client grants more.
    pub(crate) fn on_browse_ended(&mut self, ctx: &mut Ctx<'_>, handle: u32) {
        if let Some(LinkKind::Outgoing(o)) = self.links.get_mut(&handle).map(|l| &mut l.kind) {
            o.browse_ended = true;
        }
        self.on_drained(ctx, handle);
    }

    /// The core consumed the drained link's remaining credit.
    pub(crate) fn on_drained(&mut self, ctx: &mut Ctx<'_>, handle: u32) {
        let queued = self.busy.as_ref().is_some_and(|b| !b.queued.is_empty());
        if queued || self.remote_incoming_window == 0 {
            busy(&mut self.busy)
                .queued
                .push_back(Queued::DrainFlow(handle));
            return;
        }
        self.write_drain_flow(ctx.out, handle);
    }

    /// Answers a drain: the unused credit is consumed by advancing the
    /// delivery-count, and the link reports zero credit.
    fn write_drain_flow(&mut self, out: &mut Vec<u8>, handle: u32) {
        let Some(LinkKind::Outgoing(o)) = self.links.get_mut(&handle).map(|l| &mut l.kind) else {
            return;
        };
        o.drain();
        self.write_link_flow(out, handle, true);
    }

    /// Writes queued deliveries while the peer's window allows.
    pub(crate) fn flush_queued(&mut self, ctx: &mut Ctx<'_>) {
        while self.remote_incoming_window > 0 {
            let Some(item) = self.busy.as_mut().and_then(|b| b.queued.pop_front()) else {
                return;
            };
            match item {
                Queued::Delivery(handle, d) => {
                    if let Some(LinkKind::Outgoing(o)) =
                        self.links.get_mut(&handle).map(|l| &mut l.kind)
                    {
                        o.queued = o.queued.saturating_sub(1);
                    }
                    self.write_delivery(ctx, handle, d);
                }
                Queued::DrainFlow(handle) => self.write_drain_flow(ctx.out, handle),
            }
        }
    }
}

/// Settles a delivery we will not send (auto-settled ones are gone).
fn give_back(ctx: &mut Ctx<'_>, d: &Delivery, outcome: Outcome) {
    if let Err(e) = ctx
        .conn
        .core
        .settle(d.consumer, d.tag, outcome, None, false)
    {
        debug!(conn = ctx.conn_id, error = %e, "settle of an unsendable delivery failed");
    }
}
