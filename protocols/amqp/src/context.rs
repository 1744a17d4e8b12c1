//! What the levels below the connection get from it.
//!
//! Once Open is exchanged the connection owns the core session and the
//! bookkeeping that spans its sessions ([`Shared`]: which link a consumer
//! feeds, the commits waited for, the declared transactions). A handler of
//! a session or a link is handed that, with the output buffer, the
//! configuration and the clock, as one [`Ctx`] borrowed for the call; it
//! never sees the connection itself. Nothing here names a connection,
//! session or link type, so `connection` → `session` → `link` stays a tree.

use std::sync::Arc;
use std::time::Instant;

use rosetta_neutral::{ConsumerId, DeliveryTag, Outcome, Session, Ticket};
use tracing::debug;

use crate::config::AmqpConfig;
use crate::idmap::{IdMap, IdSet, SmallIdMap};
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
///
/// Part of every open connection, idle ones included, so what only
/// traffic uses is in [`Busy`], made at first use (issue 20).
pub(crate) struct Shared {
    /// The broker core's session for this connection.
    pub(crate) core: Box<dyn Session>,
    /// The peer's container id, from its Open (one allocation with the
    /// core session's client id).
    pub(crate) container_id: Arc<str>,
    /// Where each consumer's deliveries go: (channel, handle). A slice
    /// for the one or few links most connections have.
    pub(crate) consumers: SmallIdMap<ConsumerId, (u16, u32)>,
    /// Declared transactions (8 B until the first).
    pub(crate) txns: Transactions,
    busy: Option<Box<Busy>>,
    /// Last link serial handed out (see `Link::serial`).
    next_link_serial: u64,
    /// The peer's max-frame-size: our outgoing frames stay within it.
    pub(crate) peer_max_frame: u32,
}

/// What only a connection with traffic or trouble uses: commits waited
/// for, batched settlements, the encoding buffer, withheld credit, ended
/// sessions. Boxed apart from [`Shared`] and made at first use, one
/// branch away on the message path (issue 20: about 150 B that a silent
/// device does not hold). Kept once made: a busy connection empties it
/// after every read or write, so freeing it then would allocate it again
/// with the next message.
#[derive(Default)]
pub(crate) struct Busy {
    /// Durable operations whose `Committed` event we wait for. Bounded by
    /// `pending_commits_max`: past it the driver stops reading.
    pub(crate) tickets: IdMap<Ticket, PendingCommit>,
    /// Deliveries the peer accepted and settled in the frames read so far
    /// and not yet settled in the core: settled together (one
    /// `settle_many`) at the end of the read, or before any frame that
    /// could observe them unsettled.
    pub(crate) accepted_in: Vec<(ConsumerId, DeliveryTag)>,
    /// Reused buffer for the non-body sections of outgoing messages.
    pub(crate) scratch: Vec<u8>,
    /// When to re-try credit withheld while the core blocks producers.
    pub(crate) blocked_recheck: Option<Instant>,
    /// Channels whose session we ended with an error, until the peer's
    /// End (see `Opened`). Within `channel_max`.
    pub(crate) ending: IdSet<u16>,
}

impl Busy {
    /// Nothing waited for, batched or withheld, no channel ending.
    fn is_empty(&self) -> bool {
        self.tickets.is_empty()
            && self.accepted_in.is_empty()
            && self.blocked_recheck.is_none()
            && self.ending.is_empty()
    }
}

impl Shared {
    pub(crate) fn new(core: Box<dyn Session>, container_id: Arc<str>, peer_max_frame: u32) -> Self {
        Self {
            core,
            container_id,
            consumers: SmallIdMap::default(),
            txns: Transactions::default(),
            busy: None,
            next_link_serial: 0,
            peer_max_frame,
        }
    }

    /// The busy state, made at first use.
    pub(crate) fn busy(&mut self) -> &mut Busy {
        match &mut self.busy {
            Some(b) => b,
            none => none.insert(make_busy()),
        }
    }

    /// The busy state if it was made.
    pub(crate) fn busy_if_made(&mut self) -> Option<&mut Busy> {
        self.busy.as_deref_mut()
    }

    /// The busy state if it was made, to read.
    pub(crate) fn busy_ref(&self) -> Option<&Busy> {
        self.busy.as_deref()
    }

    /// Frees the busy state if nothing is in it (the encoding buffer's
    /// capacity goes with it).
    pub(crate) fn free_busy_if_empty(&mut self) {
        if self.busy.as_deref().is_some_and(Busy::is_empty) {
            self.busy = None;
        }
    }

    /// Durable commits waited for.
    pub(crate) fn pending_commits(&self) -> usize {
        self.busy_ref().map_or(0, |b| b.tickets.len())
    }

    /// When withheld credit is to be re-checked.
    pub(crate) fn blocked_recheck(&self) -> Option<Instant> {
        self.busy_ref().and_then(|b| b.blocked_recheck)
    }

    /// A number unique within the connection (link serials, temporary
    /// topic names).
    pub(crate) fn next_serial(&mut self) -> u64 {
        self.next_link_serial += 1;
        self.next_link_serial
    }

    /// Asks for a credit re-check at `at` (or earlier, if one is due).
    pub(crate) fn recheck_at(&mut self, at: Instant) {
        let busy = self.busy();
        busy.blocked_recheck = Some(busy.blocked_recheck.map_or(at, |t| t.min(at)));
    }

    /// Settles the batched accepted deliveries (see `Busy::accepted_in`).
    pub(crate) fn settle_accepted_in(&mut self, conn_id: u64) {
        let Some(busy) = self.busy.as_deref_mut() else {
            return;
        };
        let accepted = Outcome::Accept;
        if let Err(e) =
            rosetta_neutral::settle_batch(&mut *self.core, &mut busy.accepted_in, accepted)
        {
            debug!(conn = conn_id, error = %e, "settle failed");
        }
    }
}

/// Out of line: made once per connection, off the message path.
#[cold]
#[inline(never)]
fn make_busy() -> Box<Busy> {
    Box::default()
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
