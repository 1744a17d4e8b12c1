//! Sessions (spec 2.5.5-2.7.4 Begin/End/Flow/Disposition): channels,
//! transfer-id windows both ways, several sessions per connection.
//!
//! We never begin sessions ourselves, so our channel number mirrors the
//! peer's and our link handles mirror the peer's handles; this keeps every
//! map keyed by what arrives on the wire.

use std::collections::VecDeque;

use fe2o3_amqp_types::definitions::{Handle, Role};
use fe2o3_amqp_types::messaging::{
    Accepted, DeliveryState, Modified, Outcome as AmqpOutcome, Rejected, Released,
};
use fe2o3_amqp_types::performatives::{Begin, Disposition, End, Flow};
use rosetta_neutral::{ConsumerId, Delivery, DeliveryTag, Outcome, TxnId};
use tracing::debug;

use crate::connection::{write_perf, AmqpConnection, Fault, PendingCommit};
use crate::error::AmqpError;
use crate::idmap::{IdMap, IdSet};
use crate::link::{Link, LinkKind};

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

/// One session.
#[derive(Debug)]
pub(crate) struct AmqpSession {
    pub(crate) local_channel: u16,
    /// We sent End with an error and wait for the peer's End.
    pub(crate) ending: bool,
    /// Transfer id the peer's next transfer carries.
    pub(crate) next_incoming_id: u32,
    /// Transfers the peer may still send before we re-open the window.
    pub(crate) incoming_window: u32,
    /// Transfer id of our next transfer frame (session flow control).
    pub(crate) next_outgoing_id: u32,
    /// Delivery id of our next delivery: a separate sequence from transfer
    /// ids, since a delivery may span several frames and receivers such as
    /// Proton check that delivery ids go up by one.
    pub(crate) next_delivery_id: u32,
    /// Transfers the peer can still take.
    pub(crate) remote_incoming_window: u32,
    pub(crate) links: IdMap<u32, Link>,
    /// Handles we detached with an error, awaiting the peer's Detach.
    pub(crate) detaching: IdSet<u32>,
    pub(crate) unsettled_out: IdMap<u32, OutDelivery>,
    pub(crate) queued: VecDeque<Queued>,
    /// Incoming delivery ids to dispose as accepted+settled at the next
    /// poll_transmit, coalesced into ranges.
    pub(crate) accepted: Vec<u32>,
    /// The same for links in rcv-settle-mode `second`: accepted, unsettled.
    pub(crate) accepted_second: Vec<u32>,
}

impl AmqpSession {
    /// The session fields of a Flow we send (link fields left empty).
    pub(crate) fn flow(&self) -> Flow {
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
}

/// `a` is in the closed serial-number range `[first, last]` (RFC 1982 style).
fn in_range(a: u32, first: u32, last: u32) -> bool {
    a.wrapping_sub(first) <= last.wrapping_sub(first)
}

impl AmqpConnection {
    pub(crate) fn on_begin(&mut self, ch: u16, b: Begin) -> Result<(), Fault> {
        if b.remote_channel.is_some() {
            return Err(Fault::Connection(AmqpError::NotAllowed(
                "begin answering a session we did not start".into(),
            )));
        }
        if ch > self.channel_max() {
            return Err(Fault::Connection(AmqpError::OutOfRange(format!(
                "channel {ch} above channel-max {}",
                self.channel_max()
            ))));
        }
        if self.sessions.contains_key(&ch) {
            return Err(Fault::Connection(AmqpError::NotAllowed(format!(
                "channel {ch} already in use"
            ))));
        }
        let session = AmqpSession {
            local_channel: ch,
            ending: false,
            next_incoming_id: b.next_outgoing_id,
            incoming_window: self.cfg.session_window_frames,
            next_outgoing_id: 0,
            next_delivery_id: 0,
            remote_incoming_window: b.incoming_window,
            links: IdMap::default(),
            detaching: IdSet::default(),
            unsettled_out: IdMap::default(),
            queued: VecDeque::new(),
            accepted: Vec::new(),
            accepted_second: Vec::new(),
        };
        let reply = Begin {
            remote_channel: Some(ch),
            next_outgoing_id: 0,
            incoming_window: session.incoming_window,
            outgoing_window: u32::MAX,
            handle_max: Handle(self.cfg.links_per_session_max.saturating_sub(1)),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        write_perf(&mut self.out, ch, &reply, &[]);
        self.sessions.insert(ch, session);
        debug!(conn = self.conn_id, channel = ch, "begin");
        Ok(())
    }

    pub(crate) fn on_end(&mut self, ch: u16, e: End) -> Result<(), Fault> {
        if let Some(err) = &e.error {
            debug!(conn = self.conn_id, channel = ch, error = ?err, "peer ended session with error");
        }
        self.cleanup_session_links(ch);
        if let Some(s) = self.sessions.remove(&ch) {
            write_perf(&mut self.out, s.local_channel, &End { error: None }, &[]);
        }
        Ok(())
    }

    /// Detaches every link of a session locally (no frames): consumers are
    /// cancelled so their unsettled deliveries go back to the queue.
    pub(crate) fn cleanup_session_links(&mut self, ch: u16) {
        let handles: Vec<u32> = self
            .sessions
            .get(&ch)
            .map(|s| s.links.keys().copied().collect())
            .unwrap_or_default();
        for h in handles {
            self.remove_link(ch, h, false);
        }
        if let Some(s) = self.sessions.get_mut(&ch) {
            s.queued.clear();
            s.unsettled_out.clear();
            s.accepted.clear();
            s.accepted_second.clear();
        }
        // A settlement still waiting for its commit names a delivery id of
        // this session; a later session on the same channel must not get it.
        self.tickets.retain(
            |_, p| !matches!(p, PendingCommit::SettleBack { channel, .. } if *channel == ch),
        );
    }

    pub(crate) fn on_flow(&mut self, ch: u16, f: Flow) -> Result<(), Fault> {
        let Some(s) = self.sessions.get_mut(&ch) else {
            return Ok(());
        };
        // remote-incoming-window = next-incoming-id(peer) + incoming-window(peer) - next-outgoing-id(ours)
        let base = f.next_incoming_id.unwrap_or(0);
        s.remote_incoming_window = base
            .wrapping_add(f.incoming_window)
            .wrapping_sub(s.next_outgoing_id);
        if s.remote_incoming_window > f.incoming_window {
            // The peer counted transfers we have not sent: trust no more
            // than the window it states.
            s.remote_incoming_window = f.incoming_window;
        }
        match f.handle {
            Some(Handle(h)) => self.on_link_flow(ch, h, &f)?,
            None if f.echo => {
                let flow = s.flow();
                write_perf(&mut self.out, s.local_channel, &flow, &[]);
            }
            None => {}
        }
        self.flush_queued(ch);
        Ok(())
    }

    pub(crate) fn on_disposition(&mut self, ch: u16, d: Disposition) -> Result<(), Fault> {
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
                let txn = self.txn_for(ts.txn_id.as_slice());
                let Some(txn) = txn else {
                    return Err(Fault::Session(AmqpError::UnknownTxn(format!(
                        "{:02x?}",
                        ts.txn_id.as_slice()
                    ))));
                };
                (ts.outcome.as_ref().and_then(outcome_of), Some(txn))
            }
            Some(state) => (delivery_state_outcome(state), None),
        };
        let Some(outcome) = outcome else {
            return Ok(());
        };
        let last = d.last.unwrap_or(d.first);
        let Some(s) = self.sessions.get_mut(&ch) else {
            return Ok(());
        };
        // Walk whichever is smaller: the claimed range or our unsettled map.
        let span = u64::from(last.wrapping_sub(d.first)) + 1;
        let ids: Vec<u32> = if span <= s.unsettled_out.len() as u64 {
            (0..span as u32).map(|i| d.first.wrapping_add(i)).collect()
        } else {
            s.unsettled_out
                .keys()
                .copied()
                .filter(|id| in_range(*id, d.first, last))
                .collect()
        };
        let Some(core) = self.core.as_deref_mut() else {
            return Ok(());
        };
        // A receiver that leaves its terminal outcome unsettled (it runs in
        // rcv-settle-mode second, spec 2.8.2.2) waits for us to settle. We
        // settle once the outcome is durable, so that a receiver that sees
        // the settlement knows the message will not come back.
        let settle_back = !d.settled;
        let local_channel = s.local_channel;
        let mut settle_now = Vec::new();
        for id in ids {
            if let Some(od) = s.unsettled_out.remove(&id) {
                if let Some(LinkKind::Outgoing(o)) =
                    s.links.get_mut(&od.handle).map(|l| &mut l.kind)
                {
                    o.unsettled = o.unsettled.saturating_sub(1);
                }
                if !settle_back && txn.is_none() && outcome == Outcome::Accept {
                    // The common case (accepted, settled): batched.
                    self.accepted_in.push((od.consumer, od.tag));
                    continue;
                }
                let confirm = settle_back && txn.is_none();
                let result = core.settle(od.consumer, od.tag, outcome, txn, confirm);
                if let (Ok(_), Some(t)) = (&result, txn) {
                    // Bounded: the core refuses settlements past its own
                    // per-transaction limit.
                    self.txn_work
                        .entry(t.0)
                        .or_default()
                        .push((od.consumer, od.tag));
                }
                match result {
                    Ok(Some(ticket)) if settle_back => {
                        self.tickets.insert(
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
                        debug!(conn = self.conn_id, error = %e, "settle failed");
                        // Still settle: the delivery is gone from our side
                        // and the receiver must not wait for it forever.
                        if settle_back {
                            settle_now.push(id);
                        }
                    }
                }
            }
        }
        for id in settle_now {
            write_settle_back(&mut self.out, local_channel, id, outcome);
        }
        Ok(())
    }

    /// Sends coalesced accepted dispositions for completed publishes.
    pub(crate) fn flush_dispositions(&mut self) {
        for s in self.sessions.values_mut() {
            write_accepted(&mut self.out, s.local_channel, &mut s.accepted, true);
            write_accepted(
                &mut self.out,
                s.local_channel,
                &mut s.accepted_second,
                false,
            );
        }
    }

    /// Writes queued deliveries while the peer's window allows.
    pub(crate) fn flush_queued(&mut self, ch: u16) {
        loop {
            let Some(s) = self.sessions.get_mut(&ch) else {
                return;
            };
            if s.remote_incoming_window == 0 {
                return;
            }
            let Some(item) = s.queued.pop_front() else {
                return;
            };
            match item {
                Queued::Delivery(handle, d) => {
                    if let Some(LinkKind::Outgoing(o)) =
                        s.links.get_mut(&handle).map(|l| &mut l.kind)
                    {
                        o.queued = o.queued.saturating_sub(1);
                    }
                    self.write_delivery(ch, handle, d);
                }
                Queued::DrainFlow(handle) => self.write_drain_flow(ch, handle),
            }
        }
    }

    /// The link with `handle` on session `ch`, if attached.
    pub(crate) fn link_mut(&mut self, ch: u16, handle: u32) -> Option<&mut Link> {
        self.sessions.get_mut(&ch)?.links.get_mut(&handle)
    }

    pub(crate) fn txn_for(&self, id: &[u8]) -> Option<TxnId> {
        let bytes: [u8; 8] = id.try_into().ok()?;
        self.txns.get(&u64::from_be_bytes(bytes)).copied()
    }
}

/// Writes `accepted` dispositions for `ids`, coalesced into ranges, and
/// empties `ids`.
fn write_accepted(out: &mut Vec<u8>, channel: u16, ids: &mut Vec<u32>, settled: bool) {
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
fn delivery_state_outcome(state: &DeliveryState) -> Option<Outcome> {
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

fn outcome_of(o: &AmqpOutcome) -> Option<Outcome> {
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
