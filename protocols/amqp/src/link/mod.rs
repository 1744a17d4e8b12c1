//! Links (spec 2.6, 2.7.3 Attach, 2.7.6 Detach): one attached link, owned
//! by its session under its handle.
//!
//! A link owns its credit (both ways) and, on a link where the client
//! sends, the multi-frame delivery it is reassembling ([`Partial`]). Its
//! handlers get what they need from the session and the connection as
//! arguments (a [`Ctx`] where they reach the core) and return errors as
//! [`AmqpError`]; the session turns them into a detach of this link.
//! Attaching (terminus resolution, the consumer behind a broker -> client
//! link) is in `attach`; the consumer options a receiver asks for
//! (selector, exclusivity, priority, browsing) in `consumer_options`.

mod attach;
mod consumer_options;

pub(crate) use attach::{
    attach_incoming, attach_outgoing, rabbitmq_queue_address, refusal, Attached, SHARED_SUBS,
};

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::messaging::DeliveryState;
use fe2o3_amqp_types::performatives::{Flow, Transfer};
use fe2o3_amqp_types::primitives::Value;
use rosetta_neutral::{Address, ConsumerId};
use tracing::{debug, trace};

use crate::context::Ctx;
use crate::delivery::{exact_payload, Incoming};
use crate::error::AmqpError;
use crate::transactions::{Transactions, TXN_DELIVERIES_MAX};

/// Flow property naming the transaction a receiver acquires under (spec 4.4.3).
const TXN_ID_KEY: &str = "txn-id";

/// A partially received multi-frame delivery.
#[derive(Debug)]
pub(crate) struct Partial {
    pub(crate) delivery_id: u32,
    pub(crate) settled: bool,
    pub(crate) txn: Option<Vec<u8>>,
    pub(crate) buf: BytesMut,
}

/// A link on which the client sends and we receive.
#[derive(Debug)]
pub(crate) struct IncomingLink {
    /// Fixed destination; `None` routes by each message's `to`. Boxed:
    /// 8 B in every link rather than 32 (issue 20).
    pub(crate) target: Option<Box<Address>>,
    /// A transaction coordinator link.
    pub(crate) coordinator: bool,
    /// Sender settles everything first (pre-settled link).
    pub(crate) presettled: bool,
    /// Transfers received (the sender's delivery-count as we track it).
    pub(crate) delivery_count: u32,
    /// The delivery-count at which granted credit runs out.
    pub(crate) credit_limit: u32,
    /// Unsettled publishes waiting for their commit.
    pub(crate) in_flight: u32,
    /// rcv-settle-mode `second` (spec 2.8.2.2): our outcome goes out
    /// unsettled and the sender settles first (see `session::on_disposition`).
    pub(crate) settle_second: bool,
    /// Credit was withheld because the core is blocking producers.
    pub(crate) withheld: bool,
    /// Boxed: only a multi-frame delivery being received has one (72 B
    /// that every idle publisher's link held, issue 20).
    pub(crate) partial: Option<Box<Partial>>,
}

/// A link on which we send and the client receives.
#[derive(Debug)]
pub(crate) struct OutgoingLink {
    pub(crate) consumer: ConsumerId,
    pub(crate) delivery_count: u32,
    /// Credit left as we account for it.
    pub(crate) credit: u32,
    /// Deliveries queued behind the peer's session window.
    pub(crate) queued: u32,
    /// Deliveries received from the core for this link, wrapping: the base
    /// the credit limit we give the core is counted from (see
    /// `Session::set_credit`), so deliveries still on their way to us are
    /// inside the client's credit, not on top of it.
    pub(crate) core_seen: u32,
    /// Deliveries sent and not yet settled by the client; credit is capped
    /// so that this stays within `link_credit_max`.
    pub(crate) unsettled: u32,
    /// Deliveries are settled on send (sender-settle-mode settled).
    pub(crate) auto_settle: bool,
    /// The receiver's max-message-size; 0 for no limit (as on the wire,
    /// spec 2.7.3), 8 B where an `Option` took 16.
    pub(crate) max_message_size: u64,
    /// What few receiving links have (a durable subscription, a
    /// transaction): boxed, 8 B in every link rather than 32 (issue 20).
    pub(crate) rare: Option<Box<OutgoingRare>>,
    /// A browser that has seen everything: the core sends it nothing
    /// more, so credit the client grants later is drained at once.
    pub(crate) browse_ended: bool,
}

/// The rarely set parts of an [`OutgoingLink`].
#[derive(Debug, Default)]
pub(crate) struct OutgoingRare {
    /// Durable subscription queue, deleted when the link is closed.
    pub(crate) durable_queue: Option<Box<str>>,
    /// Transaction (wire id) under which deliveries are acquired, set by a
    /// flow carrying `txn-id` (spec 4.4.3).
    pub(crate) acquire_txn: Option<u64>,
}

/// What a link does.
#[derive(Debug)]
pub(crate) enum LinkKind {
    /// Client -> broker.
    Incoming(IncomingLink),
    /// Broker -> client.
    Outgoing(OutgoingLink),
}

/// One attached link, held in its session's map (not boxed: 72 B, pinned
/// by a test, issue 20).
#[derive(Debug)]
pub(crate) struct Link {
    /// Exactly sized: link names are kept for link stealing and logs.
    pub(crate) name: Box<str>,
    /// Unique within the connection, so late commits for a detached link
    /// whose handle was reused are recognised.
    pub(crate) serial: u64,
    pub(crate) kind: LinkKind,
}

impl Link {
    /// The transaction an outgoing link acquires under, if any.
    pub(crate) fn acquire_txn(&self) -> Option<u64> {
        match &self.kind {
            LinkKind::Outgoing(o) => o.acquire_txn(),
            LinkKind::Incoming(_) => None,
        }
    }

    /// Fills in this link's fields of a Flow we send.
    pub(crate) fn flow_fields(&self, flow: &mut Flow) {
        match &self.kind {
            LinkKind::Outgoing(o) => {
                flow.delivery_count = Some(o.delivery_count);
                flow.link_credit = Some(o.credit);
                flow.available = Some(0);
            }
            LinkKind::Incoming(i) => {
                flow.delivery_count = Some(i.delivery_count);
                flow.link_credit = Some(i.credit_limit.wrapping_sub(i.delivery_count));
            }
        }
    }

    /// A finished browser holding credit the client granted after its
    /// end: the session answers with a drain flow.
    pub(crate) fn ended_browser_with_credit(&self) -> bool {
        matches!(&self.kind, LinkKind::Outgoing(o) if o.browse_ended && o.credit > 0)
    }

    /// A Flow naming this link; `acquire` is what it says about
    /// transactional acquisition (see [`flow_acquisition`]). The caller
    /// answers an `echo`.
    pub(crate) fn on_flow(
        &mut self,
        ctx: &mut Ctx<'_>,
        f: &Flow,
        acquire: Option<Option<u64>>,
    ) -> Result<(), AmqpError> {
        match &mut self.kind {
            LinkKind::Outgoing(o) => {
                let limit = o.on_flow(f, ctx.cfg.link_credit_max, acquire);
                if !o.browse_ended {
                    ctx.conn.core.set_credit(o.consumer, limit, f.drain)?;
                }
            }
            LinkKind::Incoming(i) => {
                // The sender may advance its delivery-count (after a drain);
                // credit we granted up to the limit stays granted.
                if let Some(dc) = f.delivery_count {
                    i.delivery_count = dc;
                }
            }
        }
        Ok(())
    }

    /// A transfer frame on this link; the whole delivery once its last
    /// frame is in.
    pub(crate) fn on_transfer(
        &mut self,
        t: Transfer,
        payload: Bytes,
        size_max: u64,
        conn_id: u64,
    ) -> Result<Option<Incoming>, AmqpError> {
        let LinkKind::Incoming(i) = &mut self.kind else {
            return Err(AmqpError::IllegalState(
                "transfer on a link where the broker sends".into(),
            ));
        };
        i.on_transfer(t, payload, size_max, conn_id)
    }

    /// Ends the link on our side (no frames): an outgoing link's consumer
    /// is cancelled, so its unsettled deliveries go back to the queue, and
    /// with `closed` its durable subscription is deleted (JMS unsubscribe).
    pub(crate) fn close(self, ctx: &mut Ctx<'_>, closed: bool) {
        let LinkKind::Outgoing(o) = self.kind else {
            return;
        };
        ctx.conn.consumers.remove(&o.consumer);
        let core = &mut ctx.conn.core;
        if let Err(e) = core.cancel(o.consumer) {
            debug!(conn = ctx.conn_id, error = %e, "cancel failed");
        }
        if let (true, Some(q)) = (closed, o.durable_queue()) {
            debug!(conn = ctx.conn_id, queue = %q, link = %self.name, "unsubscribing");
            if let Err(e) = core.delete_queue(q) {
                debug!(conn = ctx.conn_id, error = %e, "delete of durable subscription failed");
            }
        }
    }
}

/// What [`IncomingLink::refill`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refill {
    /// Enough credit is outstanding: nothing to send.
    Enough,
    /// Credit is due but the core blocks producers; `newly` the first time.
    Withheld { newly: bool },
    /// New credit granted: send this link's flow.
    Granted,
}

impl IncomingLink {
    fn on_transfer(
        &mut self,
        t: Transfer,
        payload: Bytes,
        size_max: u64,
        conn_id: u64,
    ) -> Result<Option<Incoming>, AmqpError> {
        let complete = match self.partial.take() {
            None => {
                let Some(delivery_id) = t.delivery_id else {
                    return Err(AmqpError::InvalidField(
                        "first transfer without delivery-id".into(),
                    ));
                };
                if self.credit_limit == self.delivery_count {
                    return Err(AmqpError::TransferLimitExceeded(
                        "transfer without link credit".into(),
                    ));
                }
                self.delivery_count = self.delivery_count.wrapping_add(1);
                if t.aborted {
                    return Ok(None);
                }
                let settled = self.presettled || t.settled.unwrap_or(false);
                let txn = match t.state {
                    Some(DeliveryState::TransactionalState(ts)) => Some(ts.txn_id.into_vec()),
                    _ => None,
                };
                if payload.len() as u64 > size_max {
                    return Err(AmqpError::MessageSizeExceeded(format!(
                        "{} bytes",
                        payload.len()
                    )));
                }
                if t.more {
                    let mut buf = BytesMut::with_capacity(payload.len() * 2);
                    buf.extend_from_slice(&payload);
                    self.partial = Some(Box::new(Partial {
                        delivery_id,
                        settled,
                        txn,
                        buf,
                    }));
                    return Ok(None);
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
                    trace!(conn = conn_id, handle = t.handle.0, "delivery aborted");
                    return Ok(None);
                }
                if (p.buf.len() + payload.len()) as u64 > size_max {
                    return Err(AmqpError::MessageSizeExceeded(format!(
                        "more than {size_max} bytes"
                    )));
                }
                p.buf.extend_from_slice(&payload);
                p.settled |= t.settled.unwrap_or(false);
                if t.more {
                    self.partial = Some(p);
                    return Ok(None);
                }
                Incoming {
                    delivery_id: p.delivery_id,
                    settled: p.settled,
                    txn: p.txn,
                    payload: exact_payload(p.buf),
                }
            }
        };
        Ok(Some(complete))
    }

    /// Tops the client's credit back up to `window`, minus what is waiting
    /// for commits; withholds it while the core blocks producers.
    pub(crate) fn refill(&mut self, window: u32, blocked: bool) -> Refill {
        // Outstanding = credit not yet used + publishes not yet committed.
        // Refill only once half the window is free, so a steady stream
        // costs one flow per half window, not one per commit.
        let remaining = self.credit_limit.wrapping_sub(self.delivery_count);
        let outstanding = remaining.saturating_add(self.in_flight);
        let target = window.saturating_sub(self.in_flight);
        if outstanding > window / 2 || target <= remaining {
            return Refill::Enough;
        }
        if blocked {
            let newly = !self.withheld;
            self.withheld = true;
            return Refill::Withheld { newly };
        }
        self.withheld = false;
        self.credit_limit = self.delivery_count.wrapping_add(target);
        Refill::Granted
    }
}

impl OutgoingLink {
    /// The durable subscription queue this link consumes, if any.
    pub(crate) fn durable_queue(&self) -> Option<&str> {
        self.rare.as_ref()?.durable_queue.as_deref()
    }

    /// The transaction deliveries are acquired under, if any.
    pub(crate) fn acquire_txn(&self) -> Option<u64> {
        self.rare.as_ref()?.acquire_txn
    }

    /// Sets (or with `None` clears) the transaction deliveries are
    /// acquired under.
    pub(crate) fn set_acquire_txn(&mut self, txn: Option<u64>) {
        match (&mut self.rare, txn) {
            (None, None) => {}
            (rare, txn) => rare.get_or_insert_default().acquire_txn = txn,
        }
    }

    /// Takes in the receiver's flow; returns the credit limit for the core.
    fn on_flow(&mut self, f: &Flow, credit_max: u32, acquire: Option<Option<u64>>) -> u32 {
        // link-credit(snd) = delivery-count(rcv) + link-credit(rcv) - delivery-count(snd)
        //
        // The core gets it as a limit counted from the deliveries we
        // have received from it, so those still on their way count
        // against it. Only a client that lowers its credit while
        // deliveries are in transit gets some it no longer wants;
        // `admit` releases those back to the queue.
        let rcv_dc = f.delivery_count.unwrap_or(0);
        let limit = rcv_dc.wrapping_add(f.link_credit.unwrap_or(0));
        let sent = self.delivery_count.wrapping_add(self.queued);
        let diff = limit.wrapping_sub(sent);
        // Credit is capped so that sent-but-unsettled deliveries plus
        // credit never exceed the limit: a client that never settles
        // cannot make us track an unbounded number of deliveries.
        let cap = credit_max.saturating_sub(self.unsettled);
        let credit = if diff > i32::MAX as u32 { 0 } else { diff }.min(cap);
        self.credit = credit;
        if let Some(acquire) = acquire {
            self.set_acquire_txn(acquire);
        }
        self.core_seen.wrapping_add(credit)
    }

    /// A delivery arrived from the core for this link: false when it is
    /// past the client's credit and must go back to its queue.
    pub(crate) fn admit(&mut self) -> bool {
        self.core_seen = self.core_seen.wrapping_add(1);
        if self.credit == 0 && !self.auto_settle {
            // The core dispatched this before it saw the client lower
            // its credit. Sending it would exceed the client's link
            // credit: it goes back to its place in the queue, uncounted.
            // (An auto-settled delivery is already gone from the queue,
            // so it is sent.)
            return false;
        }
        self.credit = self.credit.saturating_sub(1);
        true
    }

    /// A delivery the client will never see gives its credit back;
    /// returns the new credit limit for the core.
    pub(crate) fn restore_credit(&mut self) -> u32 {
        self.credit = self.credit.saturating_add(1);
        self.core_seen.wrapping_add(self.credit)
    }

    /// Answers a drain: the unused credit is consumed by advancing the
    /// delivery-count, and the link reports zero credit.
    pub(crate) fn drain(&mut self) {
        self.delivery_count = self.delivery_count.wrapping_add(self.credit);
        self.credit = 0;
    }
}

/// What a receiver's flow says about transactional acquisition (spec
/// 4.4.3): `Some(Some(txn))` when its properties carry a known `txn-id`,
/// `Some(None)` when it has properties without one (the client left the
/// transaction; fe2o3-amqp clears it this way), `None` when it has no
/// properties (the association stays: credit top-ups carry none).
/// `current` is the transaction the link acquires under so far.
pub(crate) fn flow_acquisition(
    txns: &Transactions,
    current: Option<u64>,
    f: &Flow,
) -> Result<Option<Option<u64>>, AmqpError> {
    let acquire = match &f.properties {
        None => None,
        Some(props) => match props.get(TXN_ID_KEY) {
            None => Some(None),
            Some(Value::Binary(id)) => match txns.get(id.as_slice()) {
                Some(txn) => Some(Some(txn.0)),
                None => {
                    return Err(AmqpError::UnknownTxn(format!("{:02x?}", id.as_slice())));
                }
            },
            Some(_) => {
                return Err(AmqpError::InvalidField("flow txn-id is not binary".into()));
            }
        },
    };
    // The transaction this flow's credit acquires under: the new one,
    // or the one the link keeps from an earlier flow. Its held
    // deliveries plus this credit stay within the limit.
    if let Some(txn) = acquire.unwrap_or(current) {
        let held = txns.held_len(txn);
        let credit = f.link_credit.unwrap_or(0) as usize;
        if held.saturating_add(credit) > TXN_DELIVERIES_MAX {
            return Err(AmqpError::ResourceLimit(format!(
                "more than {TXN_DELIVERIES_MAX} deliveries in one transaction"
            )));
        }
    }
    Ok(acquire)
}
