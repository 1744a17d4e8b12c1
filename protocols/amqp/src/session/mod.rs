//! Sessions (spec 2.5.5-2.7.4 Begin/End/Flow/Disposition): one session,
//! owned by the opened connection under its channel.
//!
//! A session owns its links (by handle, [`Link`]) and its delivery
//! bookkeeping: the transfer-id windows both ways, the deliveries we sent
//! that the client has not settled, the deliveries queued behind the
//! peer's window, and the accepted dispositions waiting to be coalesced.
//! Its handlers get the rest from the connection as a [`Ctx`] (the output
//! buffer, the core session, the configuration, the clock, the
//! connection-wide maps) and return a [`Fault`] for the connection to
//! apply; they never see the connection.
//!
//! Lifecycle: a session exists from the peer's Begin (answered at once)
//! until its End. One we end with an error is consumed by
//! [`AmqpSession::end_with_error`]: only its channel remains, with the
//! connection, until the peer's End. Likewise a link we detach with an
//! error is gone; only its handle waits in `detaching` for the peer's
//! Detach (so a link, when it exists, is attached).
//!
//! We never begin sessions ourselves, so our channel number mirrors the
//! peer's and our link handles mirror the peer's handles; this keeps every
//! map keyed by what arrives on the wire.
//!
//! Submodules: [`incoming`] (client -> broker transfers and their
//! dispositions), [`outgoing`] (broker -> client deliveries, the window
//! queue, drain).

mod incoming;
mod outgoing;

use std::collections::{HashSet, VecDeque};

use fe2o3_amqp_types::definitions::{Handle, Role};
use fe2o3_amqp_types::messaging::DeliveryState;
use fe2o3_amqp_types::performatives::{Attach, Begin, Detach, Disposition, End, Flow};
use rosetta_neutral::{ConsumerId, Delivery, DeliveryTag, Outcome};
use tracing::debug;

use crate::config::AmqpConfig;
use crate::context::{Ctx, PendingCommit};
use crate::delivery::{delivery_state_outcome, outcome_of, write_accepted, write_settle_back};
use crate::error::{AmqpError, Fault};
use crate::frame::write_perf;
use crate::idmap::{IdMap, IdSet, SmallIdMap};
use crate::link::{self, Attached, Link, LinkKind, Refill};
use crate::transactions::Held;

pub(crate) use incoming::Control;

/// A broker -> client delivery not yet settled by the client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutDelivery {
    pub(crate) handle: u32,
    pub(crate) consumer: ConsumerId,
    pub(crate) tag: DeliveryTag,
}

/// Work waiting for the peer's incoming window to open.
#[derive(Debug)]
pub(crate) enum Queued {
    /// A delivery for the link with this handle.
    Delivery(u32, Delivery),
    /// The drain answer for this link, after the deliveries before it.
    DrainFlow(u32),
}

/// A connection's sessions by channel. Boxed: the small map's slice moves
/// as sessions begin and end.
pub(crate) type Sessions = SmallIdMap<u16, Box<AmqpSession>>;

/// One session. Every open connection has one, idle devices included, so
/// what only traffic uses is in [`SessionBusy`], made at first use (issue
/// 20; the size is pinned by a test).
#[derive(Debug)]
pub(crate) struct AmqpSession {
    local_channel: u16,
    /// Transfer id the peer's next transfer carries.
    next_incoming_id: u32,
    /// Transfers the peer may still send before we re-open the window.
    incoming_window: u32,
    /// Transfer id of our next transfer frame (session flow control).
    next_outgoing_id: u32,
    /// Delivery id of our next delivery: a separate sequence from transfer
    /// ids, since a delivery may span several frames and receivers such as
    /// Proton check that delivery ids go up by one.
    next_delivery_id: u32,
    /// Transfers the peer can still take.
    remote_incoming_window: u32,
    /// Inline in the small map's slice: one allocation for the one link
    /// a device has, not a slice and a box (issue 20).
    links: SmallIdMap<u32, Link>,
    busy: Option<Box<SessionBusy>>,
}

/// What only a session with traffic or trouble uses: deliveries in
/// flight both ways, the queue behind the peer's window, handles being
/// detached. Boxed apart from [`AmqpSession`] and made at first use (an
/// idle session is 48 B, not 184); kept once made, as a busy session
/// empties it after every write.
#[derive(Debug, Default)]
pub(crate) struct SessionBusy {
    /// Handles we detached with an error, awaiting the peer's Detach.
    detaching: IdSet<u32>,
    unsettled_out: IdMap<u32, OutDelivery>,
    /// Bounded by `pending_deliveries_max` (past it the connection closes).
    queued: VecDeque<Queued>,
    /// Incoming delivery ids to dispose as accepted+settled at the next
    /// poll_transmit, coalesced into ranges.
    accepted: Vec<u32>,
    /// The same for links in rcv-settle-mode `second`: accepted, unsettled.
    accepted_second: Vec<u32>,
}

/// A session's busy state, made at first use. A function of the field, so
/// that a caller may hold one of the session's links meanwhile.
fn busy(b: &mut Option<Box<SessionBusy>>) -> &mut SessionBusy {
    match b {
        Some(b) => b,
        none => none.insert(make_busy()),
    }
}

/// Out of line: made once per session, off the message path.
#[cold]
#[inline(never)]
fn make_busy() -> Box<SessionBusy> {
    Box::default()
}

/// `a` is in the closed serial-number range `[first, last]` (RFC 1982 style).
fn in_range(a: u32, first: u32, last: u32) -> bool {
    a.wrapping_sub(first) <= last.wrapping_sub(first)
}

impl AmqpSession {
    /// The session the peer's Begin on channel `ch` starts, and our answer
    /// (the connection has checked the channel).
    pub(crate) fn begin(ch: u16, b: &Begin, cfg: &AmqpConfig) -> (Self, Begin) {
        let session = AmqpSession {
            local_channel: ch,
            next_incoming_id: b.next_outgoing_id,
            incoming_window: cfg.session_window_frames,
            next_outgoing_id: 0,
            next_delivery_id: 0,
            remote_incoming_window: b.incoming_window,
            links: SmallIdMap::default(),
            busy: None,
        };
        let reply = Begin {
            remote_channel: Some(ch),
            next_outgoing_id: 0,
            incoming_window: session.incoming_window,
            outgoing_window: u32::MAX,
            handle_max: Handle(cfg.links_per_session_max.saturating_sub(1)),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        (session, reply)
    }

    /// How many links are attached.
    pub(crate) fn link_count(&self) -> usize {
        self.links.len()
    }

    /// Frees the busy state if nothing is in it.
    pub(crate) fn free_busy_if_empty(&mut self) {
        let empty = self.busy.as_deref().is_some_and(|b| {
            b.detaching.is_empty()
                && b.unsettled_out.is_empty()
                && b.queued.is_empty()
                && b.accepted.is_empty()
                && b.accepted_second.is_empty()
        });
        if empty {
            self.busy = None;
        }
    }

    /// Whether this session made its busy state.
    #[cfg(test)]
    pub(crate) fn busy_made(&self) -> bool {
        self.busy.is_some()
    }

    /// Whether we detached `handle` with an error and wait for the peer's
    /// Detach.
    fn is_detaching(&self, handle: u32) -> bool {
        self.busy
            .as_ref()
            .is_some_and(|b| b.detaching.contains(&handle))
    }

    /// The session fields of a Flow we send (link fields left empty).
    fn flow(&self) -> Flow {
        Flow {
            next_incoming_id: Some(self.next_incoming_id),
            incoming_window: self.incoming_window,
            next_outgoing_id: self.next_outgoing_id,
            // We never hold transfers back on our side of the window.
            outgoing_window: u32::MAX,
            handle: None,
            delivery_count: None,
            link_credit: None,
            available: None,
            drain: false,
            echo: false,
            properties: None,
        }
    }

    /// The peer's End: the links go, and we answer.
    pub(crate) fn on_end(mut self, ctx: &mut Ctx<'_>, e: &End) {
        if let Some(err) = &e.error {
            debug!(conn = ctx.conn_id, channel = self.local_channel, error = ?err, "peer ended session with error");
        }
        self.close_links(ctx);
        write_perf(ctx.out, self.local_channel, &End { error: None }, &[]);
    }

    /// Ends the session with an error: the links go, and so does the
    /// session; the connection keeps its channel until the peer's End.
    pub(crate) fn end_with_error(mut self, ctx: &mut Ctx<'_>, e: &AmqpError) {
        debug!(conn = ctx.conn_id, channel = self.local_channel, error = %e, "ending session");
        self.close_links(ctx);
        let end = End {
            error: Some(e.to_wire()),
        };
        write_perf(ctx.out, self.local_channel, &end, &[]);
    }

    /// Detaches every link locally (no frames): consumers are cancelled
    /// so their unsettled deliveries go back to the queue.
    fn close_links(&mut self, ctx: &mut Ctx<'_>) {
        let handles: Vec<u32> = self.links.keys().copied().collect();
        for h in handles {
            self.remove_link(ctx, h, false);
        }
        // The session is going: so is what it had in flight.
        self.busy = None;
        // A settlement still waiting for its commit names a delivery id of
        // this session; a later session on the same channel must not get it.
        let ch = self.local_channel;
        if let Some(busy) = ctx.conn.busy_if_made() {
            busy.tickets.retain(
                |_, p| !matches!(p, PendingCommit::SettleBack { channel, .. } if *channel == ch),
            );
        }
    }

    pub(crate) fn on_flow(&mut self, ctx: &mut Ctx<'_>, f: Flow) -> Result<(), Fault> {
        // remote-incoming-window = next-incoming-id(peer) + incoming-window(peer) - next-outgoing-id(ours)
        let base = f.next_incoming_id.unwrap_or(0);
        self.remote_incoming_window = base
            .wrapping_add(f.incoming_window)
            .wrapping_sub(self.next_outgoing_id);
        if self.remote_incoming_window > f.incoming_window {
            // The peer counted transfers we have not sent: trust no more
            // than the window it states.
            self.remote_incoming_window = f.incoming_window;
        }
        match f.handle {
            Some(Handle(h)) => self.on_link_flow(ctx, h, &f)?,
            None if f.echo => {
                let flow = self.flow();
                write_perf(ctx.out, self.local_channel, &flow, &[]);
            }
            None => {}
        }
        self.flush_queued(ctx);
        Ok(())
    }

    /// A Flow naming a link.
    fn on_link_flow(&mut self, ctx: &mut Ctx<'_>, handle: u32, f: &Flow) -> Result<(), Fault> {
        let current = self.links.get(&handle).and_then(|l| l.acquire_txn());
        let acquire = link::flow_acquisition(&ctx.conn.txns, current, f)
            .map_err(|e| Fault::Link(handle, e))?;
        let Some(link) = self.links.get_mut(&handle) else {
            if self.is_detaching(handle) {
                return Ok(());
            }
            return Err(Fault::Session(AmqpError::UnattachedHandle(handle)));
        };
        link.on_flow(ctx, f, acquire)
            .map_err(|e| Fault::Link(handle, e))?;
        if link.ended_browser_with_credit() {
            // The answer is the drain flow, which also serves as the echo.
            self.on_drained(ctx, handle);
            return Ok(());
        }
        if f.echo {
            self.write_link_flow(ctx.out, handle, false);
        }
        Ok(())
    }

    /// Sends a Flow with the session state and this link's state.
    fn write_link_flow(&self, out: &mut Vec<u8>, handle: u32, drain: bool) {
        let Some(link) = self.links.get(&handle) else {
            return;
        };
        let mut flow = self.flow();
        flow.handle = Some(Handle(handle));
        flow.drain = drain;
        link.flow_fields(&mut flow);
        write_perf(out, self.local_channel, &flow, &[]);
    }

    pub(crate) fn on_disposition(
        &mut self,
        ctx: &mut Ctx<'_>,
        d: Disposition,
    ) -> Result<(), Fault> {
        if d.role == Role::Sender {
            // The peer settles its own transfers to us. Under rcv-settle-mode
            // first we settled them already. Under second this is the
            // settlement our unsettled outcome waited for, but we keep no
            // state for it: the message was committed before our outcome
            // went out, and we do not resume links, so there is nothing left
            // to do. Keeping none also means a sender that never settles
            // (fe2o3-amqp 0.18 in mode second does not echo the last run of
            // ids of a disposition) costs us nothing and does not stall its
            // credit.
            return Ok(());
        }
        let (outcome, txn) = match &d.state {
            None => (
                if d.settled {
                    Some(Outcome::Accept)
                } else {
                    None
                },
                None,
            ),
            Some(DeliveryState::TransactionalState(ts)) => {
                let Some(txn) = ctx.conn.txns.get(ts.txn_id.as_slice()) else {
                    return Err(Fault::Session(AmqpError::UnknownTxn(format!(
                        "{:02x?}",
                        ts.txn_id.as_slice()
                    ))));
                };
                (ts.outcome.as_ref().and_then(outcome_of), Some(txn))
            }
            Some(state) => (delivery_state_outcome(state), None),
        };
        if let (Some(DeliveryState::Received(_)), false) = (&d.state, d.settled) {
            self.renew_leases(ctx, d.first, d.last.unwrap_or(d.first));
            return Ok(());
        }
        let Some(outcome) = outcome else {
            return Ok(());
        };
        let last = d.last.unwrap_or(d.first);
        let Some(session_busy) = self.busy.as_deref_mut() else {
            // Nothing of ours is unsettled.
            return Ok(());
        };
        let unsettled_out = &mut session_busy.unsettled_out;
        // Walk whichever is smaller: the claimed range or our unsettled map.
        let span = u64::from(last.wrapping_sub(d.first)) + 1;
        let ids: Vec<u32> = if span <= unsettled_out.len() as u64 {
            (0..span as u32).map(|i| d.first.wrapping_add(i)).collect()
        } else {
            unsettled_out
                .keys()
                .copied()
                .filter(|id| in_range(*id, d.first, last))
                .collect()
        };
        // A receiver that leaves its terminal outcome unsettled (it runs in
        // rcv-settle-mode second, spec 2.8.2.2) waits for us to settle. We
        // settle once the outcome is durable, so that a receiver that sees
        // the settlement knows the message will not come back.
        let settle_back = !d.settled;
        let ch = self.local_channel;
        let mut settle_now = Vec::new();
        for id in ids {
            let Some(od) = unsettled_out.remove(&id) else {
                continue;
            };
            if let Some(LinkKind::Outgoing(o)) = self.links.get_mut(&od.handle).map(|l| &mut l.kind)
            {
                o.unsettled = o.unsettled.saturating_sub(1);
            }
            if !settle_back && txn.is_none() && outcome == Outcome::Accept {
                // The common case (accepted, settled): batched.
                ctx.conn.busy().accepted_in.push((od.consumer, od.tag));
                continue;
            }
            let confirm = settle_back && txn.is_none();
            let result = ctx
                .conn
                .core
                .settle(od.consumer, od.tag, outcome, txn, confirm);
            if let (Ok(_), Some(t)) = (&result, txn) {
                ctx.conn.txns.hold(t.0, (od.consumer, od.tag));
            }
            match result {
                Ok(Some(ticket)) if settle_back => {
                    ctx.conn.busy().tickets.insert(
                        ticket,
                        PendingCommit::SettleBack {
                            channel: ch,
                            delivery_id: id,
                            outcome,
                        },
                    );
                }
                Ok(_) if settle_back => settle_now.push(id),
                Ok(_) => {}
                Err(e) => {
                    debug!(conn = ctx.conn_id, error = %e, "settle failed");
                    // Still settle: the delivery is gone from our side
                    // and the receiver must not wait for it forever.
                    if settle_back {
                        settle_now.push(id);
                    }
                }
            }
        }
        for id in settle_now {
            write_settle_back(ctx.out, ch, id, outcome);
        }
        Ok(())
    }

    /// An unsettled `received` disposition (spec 3.4.1: the receiver has
    /// part of the delivery and has not decided) restarts the lease of
    /// each delivery it names. A lease that already ran out has been
    /// settled `released` by us (see [`Self::on_lease_expired`]), so it is
    /// no longer in `unsettled_out` and is skipped.
    fn renew_leases(&mut self, ctx: &mut Ctx<'_>, first: u32, last: u32) {
        let Some(busy) = self.busy.as_deref() else {
            return;
        };
        for (id, od) in busy.unsettled_out.iter() {
            if !in_range(*id, first, last) {
                continue;
            }
            if let Err(e) = ctx.conn.core.renew_lease(od.consumer, od.tag) {
                debug!(conn = ctx.conn_id, delivery_id = *id, error = %e, "lease not renewed");
            }
        }
    }

    /// The core took a delivery back when its lease ran out: we settle it
    /// with `released` (spec 3.4.4: not processed, may be redelivered), so
    /// the receiver knows, and a later disposition of it is not applied
    /// (its id is no longer unsettled here). The link stays attached; the
    /// credit the delivery used is the receiver's to grant again.
    pub(crate) fn on_lease_expired(
        &mut self,
        ctx: &mut Ctx<'_>,
        consumer: ConsumerId,
        tag: DeliveryTag,
    ) {
        // A scan of this session's unsettled deliveries, bounded by the
        // credit its receivers granted.
        let Some(busy) = self.busy.as_deref_mut() else {
            return;
        };
        let found = busy
            .unsettled_out
            .iter()
            .find(|(_, od)| od.consumer == consumer && od.tag == tag)
            .map(|(id, od)| (*id, od.handle));
        let Some((id, handle)) = found else {
            return;
        };
        busy.unsettled_out.remove(&id);
        if let Some(LinkKind::Outgoing(o)) = self.links.get_mut(&handle).map(|l| &mut l.kind) {
            o.unsettled = o.unsettled.saturating_sub(1);
        }
        debug!(
            conn = ctx.conn_id,
            delivery_id = id,
            "lease expired: delivery released"
        );
        write_settle_back(ctx.out, self.local_channel, id, Outcome::Release);
    }

    /// Settles our side of a delivery whose receiver left its outcome
    /// unsettled, once the outcome is durable.
    pub(crate) fn settle_back(&self, out: &mut Vec<u8>, delivery_id: u32, outcome: Outcome) {
        write_settle_back(out, self.local_channel, delivery_id, outcome);
    }

    /// Sends coalesced accepted dispositions for completed publishes.
    pub(crate) fn flush_dispositions(&mut self, out: &mut Vec<u8>) {
        if let Some(busy) = self.busy.as_deref_mut() {
            write_accepted(out, self.local_channel, &mut busy.accepted, true);
            write_accepted(out, self.local_channel, &mut busy.accepted_second, false);
        }
    }

    // ---- link lifecycle ----

    /// Whether an Attach may use `a.handle` (the connection checks the
    /// limits that span sessions).
    pub(crate) fn check_attach(&self, cfg: &AmqpConfig, a: &Attach) -> Result<(), Fault> {
        let handle = a.handle.0;
        if handle >= cfg.links_per_session_max {
            // What our Begin advertised; a peer that ignores it breaks the
            // framing contract, not a limit (spec 2.7.2).
            return Err(Fault::Connection(AmqpError::OutOfRange(format!(
                "handle {handle} above handle-max {}",
                cfg.links_per_session_max.saturating_sub(1)
            ))));
        }
        if self.links.contains_key(&handle) || self.is_detaching(handle) {
            return Err(Fault::Session(AmqpError::HandleInUse(handle)));
        }
        Ok(())
    }

    /// Attaches the link `a` asks for (after [`Self::check_attach`]), or
    /// refuses it.
    pub(crate) fn on_attach(&mut self, ctx: &mut Ctx<'_>, a: &Attach) {
        let result = match a.role {
            Role::Sender => link::attach_incoming(ctx, a),
            Role::Receiver => link::attach_outgoing(ctx, a),
        };
        let Attached { link, reply } = match result {
            Ok(attached) => attached,
            Err(e) => return self.refuse_attach(ctx, a, &e),
        };
        let handle = a.handle.0;
        write_perf(ctx.out, self.local_channel, &reply, &[]);
        let incoming = match &link.kind {
            LinkKind::Outgoing(o) => {
                ctx.conn
                    .consumers
                    .insert(o.consumer, (self.local_channel, handle));
                false
            }
            LinkKind::Incoming(_) => true,
        };
        self.links.insert(handle, link);
        if incoming {
            self.refill_credit(ctx, handle);
        }
    }

    /// Answers an attach we cannot honour (see [`link::refusal`]).
    pub(crate) fn refuse_attach(&mut self, ctx: &mut Ctx<'_>, a: &Attach, e: &AmqpError) {
        debug!(conn = ctx.conn_id, link = %a.name, error = %e, "refusing attach");
        let (reply, detach) = link::refusal(a, e);
        write_perf(ctx.out, self.local_channel, &reply, &[]);
        write_perf(ctx.out, self.local_channel, &detach, &[]);
        busy(&mut self.busy).detaching.insert(a.handle.0);
    }

    /// A link name is unique per pair of containers and direction (spec
    /// 2.6.1): an attach naming a link this connection already has in the
    /// same direction takes it over. This session's such links are
    /// detached, not closed, with `amqp:link:stolen`, so their terminus (a
    /// durable subscription) stays for the new one.
    pub(crate) fn yield_links_named(&mut self, ctx: &mut Ctx<'_>, name: &str, client_sends: bool) {
        let stolen: Vec<u32> = self
            .links
            .iter()
            .filter(|(_, l)| {
                &*l.name == name && matches!(l.kind, LinkKind::Incoming(_)) == client_sends
            })
            .map(|(h, _)| *h)
            .collect();
        for handle in stolen {
            debug!(conn = ctx.conn_id, link = %name, channel = self.local_channel, handle, "link stolen");
            self.remove_link(ctx, handle, false);
            busy(&mut self.busy).detaching.insert(handle);
            let detach = Detach {
                handle: Handle(handle),
                closed: false,
                error: Some(AmqpError::LinkStolen(name.to_owned()).to_wire()),
            };
            write_perf(ctx.out, self.local_channel, &detach, &[]);
        }
    }

    pub(crate) fn on_detach(&mut self, ctx: &mut Ctx<'_>, d: Detach) -> Result<(), Fault> {
        let handle = d.handle.0;
        if self
            .busy
            .as_deref_mut()
            .is_some_and(|b| b.detaching.remove(&handle))
        {
            // The answer to our own detach.
            return Ok(());
        }
        if !self.links.contains_key(&handle) {
            return Err(Fault::Session(AmqpError::UnattachedHandle(handle)));
        }
        if let Some(e) = &d.error {
            debug!(conn = ctx.conn_id, handle, error = ?e, "peer detached with error");
        }
        self.remove_link(ctx, handle, d.closed);
        let reply = Detach {
            handle: Handle(handle),
            closed: d.closed,
            error: None,
        };
        write_perf(ctx.out, self.local_channel, &reply, &[]);
        Ok(())
    }

    /// Detaches a link with an error and waits for the peer's Detach.
    pub(crate) fn detach_with_error(&mut self, ctx: &mut Ctx<'_>, handle: u32, e: &AmqpError) {
        debug!(conn = ctx.conn_id, channel = self.local_channel, handle, error = %e, "detaching link");
        self.remove_link(ctx, handle, false);
        busy(&mut self.busy).detaching.insert(handle);
        let detach = Detach {
            handle: Handle(handle),
            closed: true,
            error: Some(e.to_wire()),
        };
        write_perf(ctx.out, self.local_channel, &detach, &[]);
    }

    /// Forgets a link locally (see [`Link::close`]), with the deliveries
    /// of ours it had in flight.
    fn remove_link(&mut self, ctx: &mut Ctx<'_>, handle: u32, closed: bool) {
        let Some(link) = self.links.remove(&handle) else {
            return;
        };
        if let (LinkKind::Outgoing(_), Some(busy)) = (&link.kind, self.busy.as_deref_mut()) {
            busy.unsettled_out.retain(|_, od| od.handle != handle);
            busy.queued.retain(|q| match q {
                Queued::Delivery(h, _) | Queued::DrainFlow(h) => *h != handle,
            });
        }
        link.close(ctx, closed);
    }

    /// The serial of the link attached under `handle`, if any.
    pub(crate) fn link_serial(&self, handle: u32) -> Option<u64> {
        self.links.get(&handle).map(|l| l.serial)
    }

    /// Forgets the deliveries of ours in `held` (a transaction that did
    /// not commit returns them): the client considers them settled
    /// (transactional disposition) or, if acquired and never disposed,
    /// gets them again.
    pub(crate) fn forget_deliveries(&mut self, held: &HashSet<Held>) {
        let links = &mut self.links;
        let Some(busy) = self.busy.as_deref_mut() else {
            return;
        };
        busy.unsettled_out.retain(|_, od| {
            let undone = held.contains(&(od.consumer, od.tag));
            if undone {
                if let Some(LinkKind::Outgoing(o)) = links.get_mut(&od.handle).map(|l| &mut l.kind)
                {
                    o.unsettled = o.unsettled.saturating_sub(1);
                }
            }
            !undone
        });
    }

    // ---- credit for client senders ----

    /// Tops a client sender's credit back up to the window, minus what is
    /// waiting for commits; withholds it while the core blocks producers.
    pub(crate) fn refill_credit(&mut self, ctx: &mut Ctx<'_>, handle: u32) {
        let window = ctx.cfg.sender_credit_window;
        let blocked = ctx.conn.core.producer_blocked();
        let Some(Link {
            kind: LinkKind::Incoming(i),
            ..
        }) = self.links.get_mut(&handle)
        else {
            return;
        };
        match i.refill(window, blocked) {
            Refill::Enough => {}
            Refill::Withheld { newly } => {
                if newly {
                    debug!(
                        conn = ctx.conn_id,
                        handle, "producer blocked: withholding credit"
                    );
                }
                let recheck =
                    ctx.now + std::time::Duration::from_millis(ctx.cfg.blocked_recheck_ms);
                ctx.conn.recheck_at(recheck);
            }
            Refill::Granted => self.write_link_flow(ctx.out, handle, false),
        }
    }

    /// Re-tries credit withheld by producer flow control.
    pub(crate) fn recheck_withheld_credit(&mut self, ctx: &mut Ctx<'_>) {
        let withheld: Vec<u32> = self
            .links
            .iter()
            .filter_map(|(h, l)| match &l.kind {
                LinkKind::Incoming(i) if i.withheld => Some(*h),
                _ => None,
            })
            .collect();
        for h in withheld {
            self.refill_credit(ctx, h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::in_range;

    #[test]
    fn serial_ranges_wrap() {
        assert!(in_range(5, 1, 10));
        assert!(!in_range(11, 1, 10));
        assert!(in_range(1, u32::MAX - 1, 3));
        assert!(!in_range(4, u32::MAX - 1, 3));
    }
}
