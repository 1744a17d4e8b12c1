//! The opened state: what exists once Open is exchanged.
//!
//! [`Opened`] owns the connection-wide [`Shared`] state (the core session,
//! consumer routes, pending commits, transactions) and the sessions by
//! channel. It dispatches each performative to the session of its
//! channel, routes the core's events to the session and link they are
//! for, and does what spans sessions: Begin (the channel limit), the
//! links-per-connection limit and link stealing on Attach, transactions
//! (through `coordinator`, which owns no state of its own), and the
//! scoped errors a handler returns.
//!
//! A channel is free, holds a session, or is `ending`: we ended its
//! session with an error, the session is gone, and the channel stays
//! taken (its frames dropped) until the peer's End.

use std::time::{Duration, Instant};

use bytes::Bytes;
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::performatives::{Attach, Begin, Performative};
use rosetta_neutral::clock::{epoch_ms, Stamp};
use rosetta_neutral::{BrokerError, CloseKind, SessionEvent, Ticket};
use tracing::{debug, trace};

use crate::config::AmqpConfig;
use crate::context::{Ctx, Env, PendingCommit, Shared};
use crate::coordinator;
use crate::error::{AmqpError, Fault};
use crate::frame::write_perf;
use crate::session::{AmqpSession, Sessions};

/// The opened connection (see the module docs). Boxed in the
/// connection, within jemalloc's 128 B size class (pinned by a test):
/// what only traffic uses is boxed below it (`Busy`, the transactions),
/// and its clocks are 4-byte stamps counted from `now` (issue 20).
pub(crate) struct Opened {
    shared: Shared,
    /// Sessions by the peer's channel (we mirror it as our channel).
    /// Bounded by `channel_max`. Channels whose session we ended with an
    /// error wait for the peer's End in `Busy::ending`.
    sessions: Sessions,
    /// The time of the current entry call: what the stamps count from
    /// when an `Instant` is due (a deadline, a credit re-check).
    now: Instant,
    /// When the last whole frame arrived (the idle timeout counts frames).
    last_recv: Stamp,
    /// When we last handed bytes to the driver (heartbeats count them).
    last_send: Stamp,
    /// The peer's idle timeout in ms, 0 for none: we send something at
    /// half of it.
    peer_idle_ms: u32,
    /// The channel-max in force: ours, or the peer's if lower.
    channel_max: u16,
}

impl Opened {
    pub(super) fn new(shared: Shared, channel_max: u16, peer_idle_ms: u32, now: Instant) -> Self {
        let stamp = Stamp::of_epoch_ms(epoch_ms(now));
        Self {
            shared,
            sessions: Sessions::default(),
            now,
            last_recv: stamp,
            last_send: stamp,
            peer_idle_ms,
            channel_max,
        }
    }

    /// An entry call's time.
    pub(super) fn set_now(&mut self, now: Instant) {
        self.now = now;
    }

    fn stamp(&self) -> Stamp {
        Stamp::of_epoch_ms(epoch_ms(self.now))
    }

    /// A whole frame arrived now.
    pub(super) fn frame_received(&mut self) {
        self.last_recv = self.stamp();
    }

    /// Bytes went to the driver now.
    pub(super) fn frames_sent(&mut self) {
        self.last_send = self.stamp();
    }

    /// Whether the peer sent no frame for our idle timeout (`idle_ms`, 0
    /// for none).
    pub(super) fn silent_for(&self, idle_ms: u32) -> bool {
        idle_ms > 0 && self.stamp().elapsed_ms(self.last_recv) >= idle_ms
    }

    /// Whether we must send something so that the peer's idle timeout
    /// does not expire (at half of it).
    pub(super) fn heartbeat_due(&self) -> bool {
        self.peer_idle_ms > 0 && self.stamp().elapsed_ms(self.last_send) >= self.peer_idle_ms / 2
    }

    /// The next instant a timer of the opened state is due: our idle
    /// timeout (`idle_ms`, 0 for none), the heartbeat, the credit
    /// re-check.
    pub(super) fn poll_timeout(&self, idle_ms: u32) -> Option<Instant> {
        let now = self.stamp();
        let after = |since: Stamp, ms: u32| {
            let left = ms.saturating_sub(now.elapsed_ms(since));
            self.now + Duration::from_millis(left.into())
        };
        [
            (idle_ms > 0).then(|| after(self.last_recv, idle_ms)),
            (self.peer_idle_ms > 0).then(|| after(self.last_send, self.peer_idle_ms / 2)),
            self.shared.blocked_recheck(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// What the connection lends the handlers for one call.
    pub(super) fn env<'a>(
        &self,
        out: &'a mut Vec<u8>,
        cfg: &'a AmqpConfig,
        conn_id: u64,
    ) -> Env<'a> {
        Env {
            out,
            cfg,
            conn_id,
            now: self.now,
            now_ms: epoch_ms(self.now),
        }
    }

    /// Whether the boxes made at first use exist (see
    /// `AmqpConnection::busy_made`).
    #[cfg(test)]
    pub(super) fn busy_made(&self) -> (bool, bool) {
        (
            self.shared.busy_ref().is_some(),
            self.sessions.values().any(|s| s.busy_made()),
        )
    }

    /// Frees the busy boxes that are empty (see
    /// `AmqpConnection::shrink_when_parked`).
    pub(super) fn shrink_when_parked(&mut self) {
        self.shared.free_busy_if_empty();
        for s in self.sessions.values_mut() {
            s.free_busy_if_empty();
        }
    }

    /// See `AmqpConnection::resume_deliveries`.
    pub(super) fn resume_deliveries(&mut self) {
        self.shared.core.resume_deliveries();
    }

    /// Durable commits waited for (the driver stops reading past a limit).
    pub(super) fn pending_commits(&self) -> usize {
        self.shared.pending_commits()
    }

    /// Settles the batched accepted deliveries (see `Shared::accepted_in`).
    pub(super) fn settle_accepted_in(&mut self, conn_id: u64) {
        self.shared.settle_accepted_in(conn_id);
    }

    /// Sends the coalesced accepted dispositions of every session.
    pub(super) fn flush_dispositions(&mut self, out: &mut Vec<u8>) {
        for s in self.sessions.values_mut() {
            s.flush_dispositions(out);
        }
    }

    /// Ends the opened state: what the peer accepted stays accepted, and
    /// the core session closes (returning unsettled deliveries).
    pub(super) fn close(self, conn_id: u64, kind: CloseKind) {
        let mut shared = self.shared;
        shared.settle_accepted_in(conn_id);
        shared.core.close(kind);
    }

    /// The timers of the opened state: the credit re-check.
    pub(super) fn on_timeout(&mut self, env: Env<'_>) {
        let now = env.now;
        let mut ctx = env.ctx(&mut self.shared);
        if ctx.conn.blocked_recheck().is_some_and(|t| now >= t) {
            ctx.conn.busy().blocked_recheck = None;
            for s in self.sessions.values_mut() {
                s.recheck_withheld_credit(&mut ctx);
            }
        }
    }

    // ---- frames ----

    /// One performative (not Open or Close, which the connection handles)
    /// on channel `ch`.
    pub(super) fn dispatch(
        &mut self,
        env: Env<'_>,
        ch: u16,
        perf: Performative,
        payload: Bytes,
    ) -> Result<(), Fault> {
        let mut ctx = env.ctx(&mut self.shared);
        let sessions = &mut self.sessions;
        if !matches!(
            perf,
            Performative::Transfer(_) | Performative::Disposition(_) | Performative::Flow(_)
        ) {
            // A detach, end or close returns unsettled deliveries to their
            // queues: the batched accepted ones must be settled first.
            ctx.conn.settle_accepted_in(ctx.conn_id);
        }
        match perf {
            Performative::Open(_) => Err(Fault::Connection(AmqpError::IllegalState(
                "second open".into(),
            ))),
            // The connection's own (it ends this state).
            Performative::Close(_) => Ok(()),
            Performative::Begin(b) => on_begin(&mut ctx, sessions, self.channel_max, ch, &b),
            other if ending(ctx.conn, ch) => {
                // We ended its session with an error: drop frames until
                // its End.
                if let (Performative::End(_), Some(busy)) = (other, ctx.conn.busy_if_made()) {
                    busy.ending.remove(&ch);
                }
                Ok(())
            }
            other => {
                let Some(session) = sessions.get_mut(&ch) else {
                    return Err(Fault::Connection(AmqpError::NotAllowed(format!(
                        "frame on unmapped channel {ch}"
                    ))));
                };
                match other {
                    Performative::End(e) => {
                        if let Some(s) = sessions.remove(&ch) {
                            s.on_end(&mut ctx, &e);
                        }
                        Ok(())
                    }
                    Performative::Attach(a) => on_attach(&mut ctx, sessions, ch, &a),
                    Performative::Flow(fl) => session.on_flow(&mut ctx, fl),
                    Performative::Transfer(t) => {
                        if let Some(control) = session.on_transfer(&mut ctx, t, payload)? {
                            coordinator::on_control(&mut ctx, sessions, ch, control);
                        }
                        Ok(())
                    }
                    Performative::Disposition(d) => session.on_disposition(&mut ctx, d),
                    Performative::Detach(d) => session.on_detach(&mut ctx, d),
                    Performative::Open(_) | Performative::Close(_) | Performative::Begin(_) => {
                        Ok(())
                    }
                }
            }
        }
    }

    // ---- core events ----

    /// An event for the links and commits of this connection; an error
    /// closes the connection.
    pub(super) fn on_event(&mut self, env: Env<'_>, event: SessionEvent) -> Result<(), AmqpError> {
        let mut ctx = env.ctx(&mut self.shared);
        let sessions = &mut self.sessions;
        match event {
            SessionEvent::Delivery(d) => {
                let Some(&(ch, handle)) = ctx.conn.consumers.get(&d.consumer) else {
                    // The link went away; cancelling the consumer returned
                    // its deliveries to the queue, and this one goes back
                    // the same way.
                    trace!(conn = ctx.conn_id, consumer = ?d.consumer, "delivery for a gone consumer");
                    return Ok(());
                };
                match sessions.get_mut(&ch) {
                    Some(s) => s.on_delivery(&mut ctx, handle, d),
                    None => Ok(()),
                }
            }
            SessionEvent::Committed { ticket, result } => {
                on_committed(&mut ctx, sessions, ticket, result);
                Ok(())
            }
            SessionEvent::CommittedRun { tickets } => {
                for ticket in tickets {
                    on_committed(&mut ctx, sessions, ticket, Ok(()));
                }
                Ok(())
            }
            SessionEvent::Drained { consumer } => {
                let Some(&(ch, handle)) = ctx.conn.consumers.get(&consumer) else {
                    return Ok(());
                };
                if let Some(s) = sessions.get_mut(&ch) {
                    s.on_drained(&mut ctx, handle);
                }
                Ok(())
            }
            // A browser that has seen everything is told as a drain is
            // answered: its remaining credit is used up (delivery-count
            // advanced, link-credit 0), which is how the Proton queue
            // browser knows it is done (`receiver.drained`).
            SessionEvent::BrowseEnded { consumer } => {
                let Some(&(ch, handle)) = ctx.conn.consumers.get(&consumer) else {
                    return Ok(());
                };
                if let Some(s) = sessions.get_mut(&ch) {
                    s.on_browse_ended(&mut ctx, handle);
                }
                Ok(())
            }
            // The broker took the delivery back: the receiver is told by a
            // settled `released` disposition (see `Session::on_lease_expired`).
            SessionEvent::LeaseExpired { consumer, tag } => {
                let Some(&(ch, _)) = ctx.conn.consumers.get(&consumer) else {
                    return Ok(());
                };
                if let Some(s) = sessions.get_mut(&ch) {
                    s.on_lease_expired(&mut ctx, consumer, tag);
                }
                Ok(())
            }
            SessionEvent::ConsumerClosed { consumer, reason } => {
                let Some(&(ch, handle)) = ctx.conn.consumers.get(&consumer) else {
                    return Ok(());
                };
                // The core closes a consumer when its queue is deleted:
                // spec 2.8.15 names that amqp:resource-deleted.
                let e = AmqpError::ResourceDeleted(reason.to_string());
                if let Some(s) = sessions.get_mut(&ch) {
                    s.detach_with_error(&mut ctx, handle, &e);
                }
                Ok(())
            }
            // The connection's own: they are not about links.
            SessionEvent::LoginChecked { .. } | SessionEvent::Kicked { .. } => Ok(()),
        }
    }

    // ---- errors scoped below the connection ----

    pub(super) fn end_session_with_error(&mut self, env: Env<'_>, ch: u16, e: &AmqpError) {
        let mut ctx = env.ctx(&mut self.shared);
        if let Some(s) = self.sessions.remove(&ch) {
            s.end_with_error(&mut ctx, e);
            ctx.conn.busy().ending.insert(ch);
        }
    }

    pub(super) fn detach_with_error(&mut self, env: Env<'_>, ch: u16, handle: u32, e: &AmqpError) {
        let mut ctx = env.ctx(&mut self.shared);
        if let Some(s) = self.sessions.get_mut(&ch) {
            s.detach_with_error(&mut ctx, handle, e);
        }
    }
}

/// Whether we ended the session of channel `ch` with an error and wait
/// for the peer's End.
fn ending(conn: &Shared, ch: u16) -> bool {
    conn.busy_ref().is_some_and(|b| b.ending.contains(&ch))
}

fn on_begin(
    ctx: &mut Ctx<'_>,
    sessions: &mut Sessions,
    channel_max: u16,
    ch: u16,
    b: &Begin,
) -> Result<(), Fault> {
    if b.remote_channel.is_some() {
        return Err(Fault::Connection(AmqpError::NotAllowed(
            "begin answering a session we did not start".into(),
        )));
    }
    if ch > channel_max {
        return Err(Fault::Connection(AmqpError::OutOfRange(format!(
            "channel {ch} above channel-max {channel_max}"
        ))));
    }
    if sessions.contains_key(&ch) || ending(ctx.conn, ch) {
        return Err(Fault::Connection(AmqpError::NotAllowed(format!(
            "channel {ch} already in use"
        ))));
    }
    let (session, reply) = AmqpSession::begin(ch, b, ctx.cfg);
    write_perf(ctx.out, ch, &reply, &[]);
    sessions.insert(ch, Box::new(session));
    debug!(conn = ctx.conn_id, channel = ch, "begin");
    Ok(())
}

/// An Attach on session `ch`: the checks and the take-over that span the
/// connection's sessions, then the session attaches (or refuses) it.
fn on_attach(ctx: &mut Ctx<'_>, sessions: &mut Sessions, ch: u16, a: &Attach) -> Result<(), Fault> {
    let Some(session) = sessions.get(&ch) else {
        return Ok(());
    };
    session.check_attach(ctx.cfg, a)?;
    let links: usize = sessions.values().map(|s| s.link_count()).sum();
    if links >= ctx.cfg.links_per_connection_max {
        let e = AmqpError::ResourceLimit(format!(
            "more than {} links on one connection",
            ctx.cfg.links_per_connection_max
        ));
        if let Some(s) = sessions.get_mut(&ch) {
            s.refuse_attach(ctx, a, &e);
        }
        return Ok(());
    }
    // A link name is unique per pair of containers and direction (spec
    // 2.6.1): an attach naming a link this connection already has takes
    // it over, in whichever session it is. (Another connection with the
    // same container id takes over the whole connection; see `Kicked`.)
    let client_sends = a.role == Role::Sender;
    for s in sessions.values_mut() {
        s.yield_links_named(ctx, &a.name, client_sends);
    }
    if let Some(s) = sessions.get_mut(&ch) {
        s.on_attach(ctx, a);
    }
    Ok(())
}

/// The commit a ticket waited for, answered on the session it is for.
fn on_committed(
    ctx: &mut Ctx<'_>,
    sessions: &mut Sessions,
    ticket: Ticket,
    result: Result<(), BrokerError>,
) {
    let pending = ctx
        .conn
        .busy_if_made()
        .and_then(|b| b.tickets.remove(&ticket));
    let Some(pending) = pending else {
        trace!(conn = ctx.conn_id, ?ticket, "commit for nothing we wait on");
        return;
    };
    match pending {
        PendingCommit::Transfer {
            channel,
            handle,
            serial,
            delivery_id,
        } => {
            if let Some(s) = sessions.get_mut(&channel) {
                s.on_publish_committed(ctx, handle, serial, delivery_id, result);
            }
        }
        PendingCommit::SettleBack {
            channel,
            delivery_id,
            outcome,
        } => {
            // A failed journal write leaves the outcome applied in
            // memory; settling still ends the receiver's wait.
            if let Err(e) = &result {
                debug!(conn = ctx.conn_id, error = %e, "settlement commit failed");
            }
            if let Some(s) = sessions.get(&channel) {
                s.settle_back(ctx.out, delivery_id, outcome);
            }
        }
        PendingCommit::Discharge(wait) => coordinator::on_discharged(ctx, sessions, wait, result),
    }
}
