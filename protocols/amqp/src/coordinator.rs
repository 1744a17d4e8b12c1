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
//! naming the txn-id; `delivery` and `session` stage them with the core.

use fe2o3_amqp_types::messaging::Accepted;
use fe2o3_amqp_types::messaging::{DeliveryState, Rejected};
use fe2o3_amqp_types::transaction::{Declare, Declared, Discharge};
use tracing::debug;

use crate::codec;
use crate::connection::{AmqpConnection, Fault, PendingCommit};
use crate::delivery::Incoming;
use crate::descriptor;
use crate::error::AmqpError;

const DESCRIPTOR_DECLARE: u64 = 0x31;
const DESCRIPTOR_DISCHARGE: u64 = 0x32;
const SECTION_AMQP_VALUE: u64 = 0x77;

/// The transaction control message in a coordinator transfer.
enum Control {
    Declare(Declare),
    Discharge(Discharge),
}

/// Finds the amqp-value section and decodes the declare/discharge in it.
fn decode_control(payload: &[u8]) -> Result<Control, AmqpError> {
    let mut pos = 0;
    while pos < payload.len() {
        let rest = &payload[pos..];
        let len = codec::value_len(rest)?;
        if descriptor::descriptor_code(rest) == Some(SECTION_AMQP_VALUE) {
            let off = codec::described_value_offset(&rest[..len])?;
            let value = &rest[off..len];
            return match descriptor::descriptor_code(value) {
                Some(DESCRIPTOR_DECLARE) => Ok(Control::Declare(codec::decode("declare", value)?)),
                Some(DESCRIPTOR_DISCHARGE) => {
                    Ok(Control::Discharge(codec::decode("discharge", value)?))
                }
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

/// Deliveries one transaction may hold (acquired under it or settled in
/// it); the core caps staged settlements the same way.
pub(crate) const TXN_DELIVERIES_MAX: usize = 100_000;

impl AmqpConnection {
    /// A transaction that did not commit: the deliveries it acquired or
    /// settled go back to their queues, counted as failed attempts (as a
    /// JMS rollback redelivers them). Their link-level deliveries are
    /// forgotten: the client considers them settled (transactional
    /// disposition) or, if acquired and never disposed, gets them again.
    pub(crate) fn undo_txn_work(&mut self, txn: u64) {
        let Some(work) = self.txn_work.remove(&txn) else {
            return;
        };
        let held: std::collections::HashSet<_> = work.iter().copied().collect();
        for s in self.sessions.values_mut() {
            s.unsettled_out.retain(|_, od| {
                let undone = held.contains(&(od.consumer, od.tag));
                if undone {
                    if let Some(crate::link::LinkKind::Outgoing(o)) =
                        s.links.get_mut(&od.handle).map(|l| &mut l.kind)
                    {
                        o.unsettled = o.unsettled.saturating_sub(1);
                    }
                }
                !undone
            });
        }
        let Some(core) = self.core.as_deref_mut() else {
            return;
        };
        for (consumer, tag) in work {
            let back = rosetta_neutral::Outcome::Modify {
                delivery_failed: true,
                undeliverable_here: false,
            };
            // Unknown: already back (link closed) or consumed outside the
            // transaction; either way there is nothing to return.
            if let Err(e) = core.settle(consumer, tag, back, None, false) {
                debug!(conn = self.conn_id, error = %e, "return after rollback");
            }
        }
    }

    /// A complete transfer on a coordinator link.
    pub(crate) fn on_control(&mut self, ch: u16, handle: u32, d: Incoming) -> Result<(), Fault> {
        let control = match decode_control(&d.payload) {
            Ok(c) => c,
            Err(e) => {
                self.reject(ch, handle, &d, &e);
                self.refill_credit(ch, handle);
                return Ok(());
            }
        };
        let discharged = match &control {
            Control::Discharge(dis) => self.txn_for(dis.txn_id.as_slice()),
            Control::Declare(_) => None,
        };
        let Some(core) = self.core.as_deref_mut() else {
            return Ok(());
        };
        match control {
            Control::Declare(decl) => {
                if decl.global_id.is_some() {
                    self.reject(
                        ch,
                        handle,
                        &d,
                        &AmqpError::NotImplemented("distributed transactions".into()),
                    );
                } else if self.txns.len() >= TXNS_PER_CONNECTION_MAX {
                    self.reject(
                        ch,
                        handle,
                        &d,
                        &AmqpError::ResourceLimit(format!(
                            "more than {TXNS_PER_CONNECTION_MAX} open transactions"
                        )),
                    );
                } else {
                    let txn = core.begin();
                    self.txns.insert(txn.0, txn);
                    debug!(conn = self.conn_id, ?txn, "declared");
                    let state = DeliveryState::Declared(Declared {
                        txn_id: txn.0.to_be_bytes().to_vec().into(),
                    });
                    self.dispose(ch, handle, d.delivery_id, state);
                }
            }
            Control::Discharge(dis) => {
                let Some(txn) = discharged else {
                    self.reject(
                        ch,
                        handle,
                        &d,
                        &AmqpError::UnknownTxn(format!("{:02x?}", dis.txn_id.as_slice())),
                    );
                    self.refill_credit(ch, handle);
                    return Ok(());
                };
                self.txns.remove(&txn.0);
                if dis.fail.unwrap_or(false) {
                    let state = match core.rollback(txn) {
                        Ok(()) => DeliveryState::Accepted(Accepted {}),
                        Err(e) => DeliveryState::Rejected(Rejected {
                            error: Some(AmqpError::Broker(e).to_wire()),
                        }),
                    };
                    debug!(conn = self.conn_id, ?txn, "rolled back");
                    self.undo_txn_work(txn.0);
                    self.dispose(ch, handle, d.delivery_id, state);
                } else {
                    match core.commit(txn) {
                        Ok(ticket) => {
                            let serial = self.link_mut(ch, handle).map_or(0, |l| l.serial);
                            self.tickets.insert(
                                ticket,
                                PendingCommit::Discharge {
                                    channel: ch,
                                    handle,
                                    serial,
                                    delivery_id: d.delivery_id,
                                    txn: txn.0,
                                },
                            );
                            debug!(conn = self.conn_id, ?txn, ?ticket, "commit pending");
                            return Ok(());
                        }
                        Err(e) => {
                            self.undo_txn_work(txn.0);
                            self.reject(ch, handle, &d, &AmqpError::TxnRollback(e.to_string()));
                        }
                    }
                }
            }
        }
        self.refill_credit(ch, handle);
        Ok(())
    }
}
