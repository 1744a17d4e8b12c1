//! What the levels below the connection get from it.
//!
//! Once Open is exchanged the connection owns the core session and the
//! bookkeeping that spans its sessions ([`Shared`]: which link a consumer
//! feeds, the commits waited for, the declared transactions). A handler of
//! a session or a link is handed that, with the output buffer, the
//! configuration and the clock, as one [`Ctx`] borrowed for the call; it
//! never sees the connection itself. Nothing here names a connection,
//! session or link type, so `connection` → `session` → `link` stays a tree.

use std::time::Instant;

use rosetta_neutral::{ConsumerId, DeliveryTag, Outcome, Session, Ticket};
use tracing::debug;

use crate::config::AmqpConfig;
use crate::idmap::IdMap;
use crate::transactions::Transactions;

/// A handler's view of its connection, for one call.
pub(crate) struct Ctx<'a> {
    /// Frames for the peer, handed to the driver at `poll_transmit`.
    pub(crate) out: &'a mut Vec<u8>,
    pub(crate) cfg: &'a AmqpConfig,
    pub(crate) conn_id: u64,
    pub(crate) now: Instant,
    /// Wall-clock ms for ttl <-> expiry, read once per entry call.
    pub(crate) now_ms: u64,
    /// The opened connection's state shared by its sessions.
    pub(crate) conn: &'a mut Shared,
}

/// The opened connection's state that every session reaches: it exists
/// only once Open is exchanged, so the core session is always there.
pub(crate) struct Shared {
    /// The broker core's session for this connection.
    pub(crate) core: Box<dyn Session>,
    /// The peer's container id, from its Open.
    pub(crate) container_id: String,
    /// The peer's max-frame-size: our outgoing frames stay within it.
    pub(crate) peer_max_frame: u32,
    /// Where each consumer's deliveries go: (channel, handle).
    pub(crate) consumers: IdMap<ConsumerId, (u16, u32)>,
    /// Durable operations whose `Committed` event we wait for. Bounded by
    /// `pending_commits_max`: past it the driver stops reading.
    pub(crate) tickets: IdMap<Ticket, PendingCommit>,
    pub(crate) txns: Transactions,
    /// Deliveries the peer accepted and settled in the frames read so far
    /// and not yet settled in the core: settled together (one
    /// `settle_many`) at the end of the read, or before any frame that
    /// could observe them unsettled.
    pub(crate) accepted_in: Vec<(ConsumerId, DeliveryTag)>,
    /// Last link serial handed out (see `Link::serial`).
    next_link_serial: u64,
    /// When to re-try credit withheld while the core blocks producers.
    pub(crate) blocked_recheck: Option<Instant>,
    /// Reused buffer for the non-body sections of outgoing messages.
    pub(crate) scratch: Vec<u8>,
}

impl Shared {
    pub(crate) fn new(core: Box<dyn Session>, container_id: String, peer_max_frame: u32) -> Self {
        Self {
            core,
            container_id,
            peer_max_frame,
            consumers: IdMap::default(),
            tickets: IdMap::default(),
            txns: Transactions::default(),
            accepted_in: Vec::new(),
            next_link_serial: 0,
            blocked_recheck: None,
            scratch: Vec::new(),
        }
    }

    /// A number unique within the connection (link serials, temporary
    /// topic names).
    pub(crate) fn next_serial(&mut self) -> u64 {
        self.next_link_serial += 1;
        self.next_link_serial
    }

    /// Asks for a credit re-check at `at` (or earlier, if one is due).
    pub(crate) fn recheck_at(&mut self, at: Instant) {
        self.blocked_recheck = Some(self.blocked_recheck.map_or(at, |t| t.min(at)));
    }

    /// Settles the batched accepted deliveries (see `accepted_in`).
    pub(crate) fn settle_accepted_in(&mut self, conn_id: u64) {
        let accepted = Outcome::Accept;
        if let Err(e) =
            rosetta_neutral::settle_batch(&mut *self.core, &mut self.accepted_in, accepted)
        {
            debug!(conn = conn_id, error = %e, "settle failed");
        }
    }
}

/// A durable operation whose [`rosetta_neutral::SessionEvent::Committed`]
/// we wait for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PendingCommit {
    /// An unsettled transfer: dispose it accepted.
    Transfer {
        channel: u16,
        handle: u32,
        serial: u64,
        delivery_id: u32,
    },
    /// A receiver's unsettled outcome (rcv-settle-mode second): settle it
    /// once the outcome is on disk.
    SettleBack {
        channel: u16,
        delivery_id: u32,
        outcome: Outcome,
    },
    /// A discharge on a coordinator link: dispose it once the commit is on disk.
    Discharge(DischargeWait),
}

/// Where the answer to a committing discharge goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DischargeWait {
    pub(crate) channel: u16,
    pub(crate) handle: u32,
    /// The coordinator link's serial: a link attached later under the
    /// same handle gets no answer meant for this one.
    pub(crate) serial: u64,
    pub(crate) delivery_id: u32,
    /// The transaction's wire id (its work is undone if the commit fails).
    pub(crate) txn: u64,
}

/// What the connection lends the opened state's handlers for one call;
/// with the [`Shared`] state it becomes a [`Ctx`].
pub(crate) struct Env<'a> {
    pub(crate) out: &'a mut Vec<u8>,
    pub(crate) cfg: &'a AmqpConfig,
    pub(crate) conn_id: u64,
    pub(crate) now: Instant,
    pub(crate) now_ms: u64,
}

impl<'a> Env<'a> {
    /// The context for handlers below the connection.
    pub(crate) fn ctx(self, conn: &'a mut Shared) -> Ctx<'a> {
        Ctx {
            out: self.out,
            cfg: self.cfg,
            conn_id: self.conn_id,
            now: self.now,
            now_ms: self.now_ms,
            conn,
        }
    }
}
