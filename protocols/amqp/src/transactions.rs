//! The connection's declared transactions and the deliveries each holds.
//!
//! Plain bookkeeping, owned by the opened connection (see `context`):
//! `coordinator` declares and discharges, a session's dispositions and
//! deliveries name and fill them. It imports none of those modules, so
//! each may use it.

use rosetta_neutral::{ConsumerId, DeliveryTag, TxnId};

use crate::idmap::IdMap;

/// Deliveries one transaction may hold (acquired under it or settled in
/// it); the core caps staged settlements the same way.
pub(crate) const TXN_DELIVERIES_MAX: usize = 100_000;

/// A delivery a transaction holds: the consumer it came through and its tag.
pub(crate) type Held = (ConsumerId, DeliveryTag);

/// Declared transactions by their wire id (the core's [`TxnId`] as 8
/// big-endian bytes), and per transaction the deliveries it holds: those
/// acquired under it (flow `txn-id`, spec 4.4.3) and those settled inside
/// it. A rollback returns them to their queues.
///
/// Boxed and made by the first declare: most connections never use a
/// transaction, and two empty maps cost every one of them 64 B (issue 20).
#[derive(Debug, Default)]
pub(crate) struct Transactions(Option<Box<Declared>>);

#[derive(Debug, Default)]
struct Declared {
    declared: IdMap<u64, TxnId>,
    work: IdMap<u64, Vec<Held>>,
}

impl Transactions {
    /// The declared transaction a wire txn-id names.
    pub(crate) fn get(&self, wire_id: &[u8]) -> Option<TxnId> {
        let bytes: [u8; 8] = wire_id.try_into().ok()?;
        self.0
            .as_ref()?
            .declared
            .get(&u64::from_be_bytes(bytes))
            .copied()
    }

    /// Whether the transaction with this wire id is declared.
    pub(crate) fn contains(&self, wire_id: u64) -> bool {
        self.0
            .as_ref()
            .is_some_and(|d| d.declared.contains_key(&wire_id))
    }

    /// How many transactions are declared.
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |d| d.declared.len())
    }

    /// Records a transaction the core began.
    pub(crate) fn declare(&mut self, txn: TxnId) {
        self.0.get_or_insert_default().declared.insert(txn.0, txn);
    }

    /// Forgets a discharged transaction (its held work stays until
    /// [`Self::take_work`] or [`Self::forget_work`]).
    pub(crate) fn discharge(&mut self, txn: TxnId) {
        if let Some(d) = &mut self.0 {
            d.declared.remove(&txn.0);
        }
    }

    /// Records a delivery the transaction now holds. Bounded: the core
    /// refuses settlements past its own per-transaction limit, and flow
    /// credit under a transaction is capped at [`TXN_DELIVERIES_MAX`].
    pub(crate) fn hold(&mut self, wire_id: u64, held: Held) {
        let d = self.0.get_or_insert_default();
        d.work.entry(wire_id).or_default().push(held);
    }

    /// How many deliveries the transaction holds.
    pub(crate) fn held_len(&self, wire_id: u64) -> usize {
        self.0
            .as_ref()
            .and_then(|d| d.work.get(&wire_id))
            .map_or(0, Vec::len)
    }

    /// The work of a transaction that did not commit, to give back.
    pub(crate) fn take_work(&mut self, wire_id: u64) -> Option<Vec<Held>> {
        self.0.as_mut()?.work.remove(&wire_id)
    }

    /// Forgets the work of a committed transaction.
    pub(crate) fn forget_work(&mut self, wire_id: u64) {
        if let Some(d) = &mut self.0 {
            d.work.remove(&wire_id);
        }
    }
}
