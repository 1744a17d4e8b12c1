//! The transaction coordinator (spec part 4): a link whose target is a
//! `coordinator` receives `declare` and `discharge` messages.
//!
//! - declare -> [`Session::begin`](rosetta_neutral::Session::begin); the
//!   reply is a `declared` outcome carrying the txn-id (the core's
//!   [`TxnId`](rosetta_neutral::TxnId) as 8 big-endian bytes);
//! - discharge(fail=false) -> `Session::commit`; the `accepted` outcome is
//!   sent only on the commit's `Committed` event, so a client that sees it
//!   knows the work is on disk; a failed commit gets `rejected` with
//!   `amqp:transaction:rollback`;
//! - discharge(fail=true) -> `Session::rollback`, accepted at once.
//!
//! Transactional transfers and dispositions carry a `transactional-state`
//! naming the txn-id; the sessions stage them with the core and record
//! what each transaction holds in [`Transactions`](crate::transactions).
//!
//! The connection owns the transactions, so it is the one that calls in
//! here: a session hands it a coordinator link's complete transfer as a
//! [`Control`], and this module answers on that session's link. A
//! transaction that does not commit gives back what it holds across all
//! the connection's sessions ([`undo_work`]), which is why the handlers
//! take the sessions by channel.

use std::collections::HashSet;

use fe2o3_amqp_types::messaging::Accepted;
use fe2o3_amqp_types::messaging::{DeliveryState, Rejected};
use fe2o3_amqp_types::transaction::{Declare, Declared, Discharge};
use rosetta_neutral::BrokerError;
use tracing::debug;

use crate::codec;
use crate::context::{Ctx, DischargeWait, PendingCommit};
use crate::descriptor;
use crate::error::AmqpError;
use crate::session::{Control, Sessions};

const DESCRIPTOR_DECLARE: u64 = 0x31;
const DESCRIPTOR_DISCHARGE: u64 = 0x32;
const SECTION_AMQP_VALUE: u64 = 0x77;

/// The transaction control message in a coordinator transfer.
enum ControlMessage {
    Declare(Declare),
    Discharge(Discharge),
}

/// Finds the amqp-value section and decodes the declare/discharge in it.
fn decode_control(payload: &[u8]) -> Result<ControlMessage, AmqpError> {
    let mut pos = 0;
    while pos < payload.len() {
        let rest = &payload[pos..];
        let len = codec::value_len(rest)?;
        if descriptor::descriptor_code(rest) == Some(SECTION_AMQP_VALUE) {
            let off = codec::described_value_offset(&rest[..len])?;
            let value = &rest[off..len];
            return match descriptor::descriptor_code(value) {
                Some(DESCRIPTOR_DECLARE) => {
                    Ok(ControlMessage::Declare(codec::decode("declare", value)?))
                }
                Some(DESCRIPTOR_DISCHARGE) => Ok(ControlMessage::Discharge(codec::decode(
                    "discharge",
                    value,
                )?)),
                _ => Err(AmqpError::InvalidField(
                    "coordinator message is neither declare nor discharge".into(),
                )),
            };
        }
        pos += len;
    }
    Err(AmqpError::InvalidField(
        "coordinator message without an amqp-value".into(),
    ))
}

/// Open transactions per connection: each holds state here and in the core
/// until discharged. Qpid JMS uses one per session.
pub(crate) const TXNS_PER_CONNECTION_MAX: usize = 1_024;

/// A complete transfer on the coordinator link `c.handle` of session `ch`.
pub(crate) fn on_control(ctx: &mut Ctx<'_>, sessions: &mut Sessions, ch: u16, c: Control) {
    let Control {
        handle,
        delivery: d,
    } = c;
    let Some(session) = sessions.get_mut(&ch) else {
        return;
    };
    let control = match decode_control(&d.payload) {
        Ok(c) => c,
        Err(e) => {
            session.reject(ctx, handle, &d, &e);
            session.refill_credit(ctx, handle);
            return;
        }
    };
    match control {
        ControlMessage::Declare(decl) => {
            if decl.global_id.is_some() {
                let e = AmqpError::NotImplemented("distributed transactions".into());
                session.reject(ctx, handle, &d, &e);
            } else if ctx.conn.txns.len() >= TXNS_PER_CONNECTION_MAX {
                let e = AmqpError::ResourceLimit(format!(
                    "more than {TXNS_PER_CONNECTION_MAX} open transactions"
                ));
                session.reject(ctx, handle, &d, &e);
            } else {
                let txn = ctx.conn.core.begin();
                ctx.conn.txns.declare(txn);
                debug!(conn = ctx.conn_id, ?txn, "declared");
                let state = DeliveryState::Declared(Declared {
                    txn_id: txn.0.to_be_bytes().to_vec().into(),
                });
                session.dispose(ctx.out, handle, d.delivery_id, state);
            }
        }
        ControlMessage::Discharge(dis) => {
            let Some(txn) = ctx.conn.txns.get(dis.txn_id.as_slice()) else {
                let e = AmqpError::UnknownTxn(format!("{:02x?}", dis.txn_id.as_slice()));
                session.reject(ctx, handle, &d, &e);
                session.refill_credit(ctx, handle);
                return;
            };
            ctx.conn.txns.discharge(txn);
            if dis.fail.unwrap_or(false) {
                let state = match ctx.conn.core.rollback(txn) {
                    Ok(()) => DeliveryState::Accepted(Accepted {}),
                    Err(e) => DeliveryState::Rejected(Rejected {
                        error: Some(AmqpError::Broker(e).to_wire()),
                    }),
                };
                debug!(conn = ctx.conn_id, ?txn, "rolled back");
                undo_work(ctx, sessions, txn.0);
                let Some(session) = sessions.get_mut(&ch) else {
                    return;
                };
                session.dispose(ctx.out, handle, d.delivery_id, state);
            } else {
                match ctx.conn.core.commit(txn) {
                    Ok(ticket) => {
                        let serial = session.link_serial(handle).unwrap_or(0);
                        let wait = DischargeWait {
                            channel: ch,
                            handle,
                            serial,
                            delivery_id: d.delivery_id,
                            txn: txn.0,
                        };
                        ctx.conn
                            .busy()
                            .tickets
                            .insert(ticket, PendingCommit::Discharge(wait));
                        debug!(conn = ctx.conn_id, ?txn, ?ticket, "commit pending");
                        return;
                    }
                    Err(e) => {
                        undo_work(ctx, sessions, txn.0);
                        let Some(session) = sessions.get_mut(&ch) else {
                            return;
                        };
                        let e = AmqpError::TxnRollback(e.to_string());
                        session.reject(ctx, handle, &d, &e);
                    }
                }
            }
        }
    }
    if let Some(session) = sessions.get_mut(&ch) {
        session.refill_credit(ctx, handle);
    }
}

/// The commit a discharge waited for: accept the discharge (or reject it
/// with `amqp:transaction:rollback`, giving the work back) on its link,
/// if the link is still the one that sent it.
pub(crate) fn on_discharged(
    ctx: &mut Ctx<'_>,
    sessions: &mut Sessions,
    wait: DischargeWait,
    result: Result<(), BrokerError>,
) {
    if result.is_ok() {
        ctx.conn.txns.forget_work(wait.txn);
    } else {
        undo_work(ctx, sessions, wait.txn);
    }
    let Some(session) = sessions.get_mut(&wait.channel) else {
        return;
    };
    if session.link_serial(wait.handle) != Some(wait.serial) {
        return;
    }
    let state = match result {
        Ok(()) => DeliveryState::Accepted(Accepted {}),
        Err(e) => DeliveryState::Rejected(Rejected {
            error: Some(AmqpError::TxnRollback(e.to_string()).to_wire()),
        }),
    };
    session.dispose(ctx.out, wait.handle, wait.delivery_id, state);
    session.refill_credit(ctx, wait.handle);
}

/// A transaction that did not commit: the deliveries it acquired or
/// settled go back to their queues, counted as failed attempts (as a JMS
/// rollback redelivers them). Their link-level deliveries are forgotten in
/// every session: the client considers them settled (transactional
/// disposition) or, if acquired and never disposed, gets them again.
pub(crate) fn undo_work(ctx: &mut Ctx<'_>, sessions: &mut Sessions, txn: u64) {
    let Some(work) = ctx.conn.txns.take_work(txn) else {
        return;
    };
    let held: HashSet<_> = work.iter().copied().collect();
    for s in sessions.values_mut() {
        s.forget_deliveries(&held);
    }
    for (consumer, tag) in work {
        let back = rosetta_neutral::Outcome::Modify {
            delivery_failed: true,
            undeliverable_here: false,
        };
        // Unknown: already back (link closed) or consumed outside the
        // transaction; either way there is nothing to return.
        if let Err(e) = ctx.conn.core.settle(consumer, tag, back, None, false) {
            debug!(conn = ctx.conn_id, error = %e, "return after rollback");
        }
    }
}
