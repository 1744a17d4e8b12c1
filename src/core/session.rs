//! A connection's session on the core: its consumers, transactions, will
//! and client-id registration.

use std::borrow::Cow;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use rosetta_neutral::{
    Address, BindInfo, BindingOptions, BrokerError, CloseKind, ConsumerId, ConsumerSpec,
    CreditMode, DeliveryTag, EventSink, KickReason, Message, Outcome, PublishOptions,
    PublishReceipt, QueueInfo, QueueLifetime, QueueSpec, Session, SessionEvent, SessionInfo,
    Ticket, TxnId, Will,
};

use rosetta_store::{Completion, Record};

use super::batch::Batch;
use super::dead_letter::{DeadLetter, DeadLetterReason};
use super::queue::{ConsumerKey, ConsumerSlot, IdleSince, Queue, Selecting};
use super::queue_settings::VISIBILITY_TIMEOUT_MS_MAX;
use super::routing::Duplicates;
use super::selector::Selector;
use super::stream::{self, Reader};
use super::{Inner, PendingWill};
use rosetta_neutral::LazyMap;

/// Most transactions one session may have open at once.
const TRANSACTIONS_OPEN_MAX: usize = 64;
/// Most operations one transaction may stage: a bound on the memory a
/// client can pin without committing.
const TRANSACTION_OPS_MAX: usize = 100_000;
/// Most consumers per session.
const CONSUMERS_PER_SESSION_MAX: usize = 10_000;

enum Staged {
    Publish {
        address: Address,
        // Behind its pointer: a message is large next to a settlement.
        message: Arc<Message>,
    },
    Settle {
        consumer: ConsumerId,
        tag: DeliveryTag,
        outcome: Outcome,
    },
}

struct ConsumerRef {
    queue: Arc<Queue>,
}

/// A session's queue consumers by id, and the session-lifetime queues it
/// declared, in one box made at the first of either and freed with the
/// last: an idle connection's session holds one empty word (issue 20:
/// the two boxed slices inline cost every session 32 bytes and its size
/// class). A session has one or a few consumers and owns at most a
/// queue or two (an MQTT session with subscriptions owns one).
#[derive(Default)]
struct Subscriptions(Option<Box<SubscriptionLists>>);

/// Exactly sized slices, not `Vec`s: a consumer is added or removed far
/// less often than it is looked up.
#[derive(Default)]
struct SubscriptionLists {
    /// Sorted by id, searched by bisection; ids only grow, so an insert
    /// is a push.
    consumers: Box<[(ConsumerId, ConsumerRef)]>,
    /// Their names, shared with the queues.
    owned_queues: Box<[Arc<str>]>,
}

impl Subscriptions {
    fn consumers(&self) -> &[(ConsumerId, ConsumerRef)] {
        self.0.as_ref().map_or(&[], |l| &l.consumers)
    }

    fn owned_queues(&self) -> &[Arc<str>] {
        self.0.as_ref().map_or(&[], |l| &l.owned_queues)
    }

    fn lists(&mut self) -> &mut SubscriptionLists {
        self.0.get_or_insert_with(Box::default)
    }

    /// Frees the box once both lists are empty.
    fn free_if_empty(&mut self) {
        if self.consumers().is_empty() && self.owned_queues().is_empty() {
            self.0 = None;
        }
    }

    fn position(&self, id: ConsumerId) -> Result<usize, usize> {
        self.consumers().binary_search_by_key(&id, |(c, _)| *c)
    }

    fn get(&self, id: &ConsumerId) -> Option<&ConsumerRef> {
        let at = self.position(*id).ok()?;
        self.consumers().get(at).map(|(_, c)| c)
    }

    fn insert(&mut self, id: ConsumerId, consumer: ConsumerRef) {
        let at = self.position(id);
        let lists = self.lists();
        match at {
            Ok(at) => lists.consumers[at].1 = consumer,
            // Ids only grow: a push.
            Err(at) => resize(&mut lists.consumers, |all| all.insert(at, (id, consumer))),
        }
    }

    fn remove(&mut self, id: &ConsumerId) -> Option<ConsumerRef> {
        let at = self.position(*id).ok()?;
        let (_, removed) = resize(&mut self.lists().consumers, |all| all.remove(at));
        self.free_if_empty();
        Some(removed)
    }

    fn len(&self) -> usize {
        self.consumers().len()
    }

    fn values(&self) -> impl Iterator<Item = &ConsumerRef> {
        self.consumers().iter().map(|(_, c)| c)
    }

    fn iter(&self) -> impl Iterator<Item = (&ConsumerId, &ConsumerRef)> {
        self.consumers().iter().map(|(id, c)| (id, c))
    }

    fn add_owned_queue(&mut self, name: Arc<str>) {
        // Exactly sized for the first: an MQTT session owns one.
        resize(&mut self.lists().owned_queues, |owned| owned.push(name));
    }

    fn remove_owned_queue(&mut self, name: &str) {
        if !self.owned_queues().iter().any(|n| &**n == name) {
            return;
        }
        resize(&mut self.lists().owned_queues, |owned| {
            owned.retain(|n| &**n != name)
        });
        self.free_if_empty();
    }

    /// Everything, emptied: the consumers and the owned queues' names.
    fn take_all(&mut self) -> (Vec<(ConsumerId, ConsumerRef)>, Vec<Arc<str>>) {
        match self.0.take() {
            Some(lists) => (lists.consumers.into_vec(), lists.owned_queues.into_vec()),
            None => (Vec::new(), Vec::new()),
        }
    }
}

/// Runs `change` on `slice` as a `Vec` and leaves it exactly sized again:
/// a reallocation per change, in place while the allocator's block has
/// room.
fn resize<T, R>(slice: &mut Box<[T]>, change: impl FnOnce(&mut Vec<T>) -> R) -> R {
    let mut all = std::mem::take(slice).into_vec();
    let out = change(&mut all);
    *slice = all.into_boxed_slice();
    out
}

/// The last consumer id a session gave out, and whether the session is
/// closed (the top bit): one word, where a lone `bool` beside it cost
/// every session 8 bytes (issue 20). 2^63 ids never run out.
#[derive(Default, Clone, Copy)]
struct ConsumerIds(u64);

impl ConsumerIds {
    const CLOSED: u64 = 1 << 63;

    fn is_closed(self) -> bool {
        self.0 & Self::CLOSED != 0
    }

    fn close(&mut self) {
        self.0 |= Self::CLOSED;
    }

    /// A new consumer id (of an open session).
    fn next(&mut self) -> ConsumerId {
        self.0 += 1;
        ConsumerId(self.0 & !Self::CLOSED)
    }
}

/// What a session holds. One per connection, so its size counts for
/// every idle connection: what only some sessions use is lazy, and what
/// few use is in [`Rare`]. 32 bytes, which keeps `SessionShared` at 112
/// and its allocation at 128 B, a jemalloc size class (issue 20).
#[derive(Default)]
struct SessionState {
    /// Its consumers and the session-lifetime queues it declared.
    subs: Subscriptions,
    ids: ConsumerIds,
    /// Boxed: a `Will` holds a whole message, and most sessions have none
    /// (one per connection, so it counts for idle connections' memory).
    will: Option<Box<Will>>,
    /// Stream readers and transactions, allocated at first use.
    rare: Option<Box<Rare>>,
}

/// What few sessions use: stream readers and transactions.
#[derive(Default)]
struct Rare {
    /// Consumers of streams (see `stream`): they read a log, not a queue.
    stream_readers: LazyMap<ConsumerId, Arc<Reader>>,
    txns: LazyMap<TxnId, Vec<Staged>>,
    next_txn: u64,
    /// The stream this session last published to, by name: a producer
    /// publishes to one stream over and over, and finding it again cost
    /// every publish a rule match and a hash lookup under the streams'
    /// lock. Streams are never closed, so it stays valid; a name that is
    /// not a stream is not kept (it may be declared one later).
    last_stream: Option<(Box<str>, stream::Target)>,
}

impl SessionState {
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// The stream reader `consumer` is, if it is one.
    fn stream_reader(&self, consumer: &ConsumerId) -> Option<&Arc<Reader>> {
        self.rare.as_ref()?.stream_readers.get(consumer)
    }

    /// The stream `name` is, when this session last published to it.
    fn last_stream(&self, name: &str) -> Option<&stream::Target> {
        match &self.rare.as_ref()?.last_stream {
            Some((n, t)) if **n == *name => Some(t),
            _ => None,
        }
    }

    fn is_closed(&self) -> bool {
        self.ids.is_closed()
    }

    /// The staged operations of open transaction `txn`, with room for one
    /// more (refused past [`TRANSACTION_OPS_MAX`]).
    fn staging(&mut self, txn: TxnId) -> Result<&mut Vec<Staged>, BrokerError> {
        let ops = self
            .rare
            .as_mut()
            .and_then(|r| r.txns.get_mut(&txn))
            .ok_or(BrokerError::Unknown("transaction"))?;
        if ops.len() >= TRANSACTION_OPS_MAX {
            return Err(BrokerError::ResourceLimit(format!(
                "more than {TRANSACTION_OPS_MAX} operations in one transaction"
            )));
        }
        Ok(ops)
    }
}

/// The part of a session the core can reach from elsewhere (take-over,
/// shutdown).
pub(crate) struct SessionShared {
    pub(crate) id: u64,
    pub(crate) info: SessionInfo,
    pub(crate) sink: Arc<dyn EventSink>,
    state: Mutex<SessionState>,
}

impl SessionShared {
    pub(crate) fn new(id: u64, info: SessionInfo, sink: Arc<dyn EventSink>) -> Self {
        Self {
            id,
            info,
            sink,
            state: Mutex::new(SessionState::default()),
        }
    }
}

pub(crate) struct CoreSession {
    inner: Arc<Inner>,
    shared: Arc<SessionShared>,
}

impl CoreSession {
    /// One client publish accepted: the broker-wide total and the
    /// connection's own count (its sink's, for the admin API).
    fn count_publish(&self) {
        self.inner.links.traffic.published();
        self.shared.sink.published();
    }

    pub(crate) fn open(
        inner: Arc<Inner>,
        info: SessionInfo,
        sink: Arc<dyn EventSink>,
    ) -> CoreSession {
        let id = inner
            .next_session
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let shared = Arc::new(SessionShared::new(id, info, sink));
        inner.sessions.lock().insert(Arc::clone(&shared));
        if let Some(client_id) = &shared.info.client_id {
            let key = (shared.info.protocol, client_id.clone());
            let previous = inner.clients.lock().insert(Arc::clone(&shared));
            if let Some(old) = previous {
                if shared.info.take_over {
                    tracing::info!(client_id = %client_id, old_conn = old.info.conn_id, "session taken over");
                    close_shared(&inner, &old, CloseKind::Abnormal);
                    old.sink.send(SessionEvent::Kicked {
                        reason: KickReason::TakenOver,
                    });
                }
            }
            // A reconnect cancels a delayed will of the same client.
            inner.wills.lock().retain(|w| w.client != key);
        }
        CoreSession { inner, shared }
    }

    /// The client id, for no-local bindings.
    fn origin(&self) -> Option<Arc<str>> {
        self.shared.info.client_id.clone()
    }

    fn state(&self) -> Result<parking_lot::MutexGuard<'_, SessionState>, BrokerError> {
        let st = self.shared.state.lock();
        if st.is_closed() {
            return Err(BrokerError::SessionClosed);
        }
        Ok(st)
    }

    /// The queue `consumer` consumes from.
    fn queue_of(&self, consumer: ConsumerId) -> Result<Arc<Queue>, BrokerError> {
        let st = self.state()?;
        st.subs
            .get(&consumer)
            .map(|c| Arc::clone(&c.queue))
            .ok_or(BrokerError::Unknown("consumer"))
    }

    /// The stream reader `consumer` is, if it is one.
    fn stream_reader(&self, consumer: ConsumerId) -> Result<Option<Arc<Reader>>, BrokerError> {
        Ok(self.state()?.stream_reader(&consumer).cloned())
    }

    /// The stream a consumer reads, when it reads one: a queue name that
    /// is a stream, or one the consumer asks to be a stream (declared at
    /// first use). Asking for a stream read of an existing queue that is
    /// not a stream is an error.
    fn stream_to_consume(
        &self,
        spec: &ConsumerSpec,
    ) -> Result<Option<stream::Target>, BrokerError> {
        let asked = spec.options.stream.as_ref().is_some_and(|r| r.declare);
        if asked && self.inner.routing.read().queue(&spec.queue).is_some() {
            return Err(BrokerError::InvalidStreamOffset(format!(
                "'{}' is a queue, not a stream",
                spec.queue
            )));
        }
        self.inner.streams.target(&spec.queue, asked)
    }

    fn consume_stream(
        &self,
        mut st: parking_lot::MutexGuard<'_, SessionState>,
        target: stream::Target,
        spec: ConsumerSpec,
    ) -> Result<ConsumerId, BrokerError> {
        let principal = &self.shared.info.principal;
        if !self
            .inner
            .access
            .may_subscribe(principal, &Address::Queue(spec.queue.clone()))
        {
            return Err(BrokerError::Unauthorized(format!(
                "consume from '{}'",
                spec.queue
            )));
        }
        let read = spec.options.stream.clone().unwrap_or_default();
        let groups = &self.inner.streams.groups;
        let source = target.source(&self.inner.streams.reads);
        // Every partition's start (and the group's offset there); a
        // partitioned group's member is given its partitions on joining.
        let mut starts = Vec::with_capacity(source.streams.len());
        for s in &source.streams {
            starts.push(stream::start_offset(s, &read, groups)?);
        }
        let member = source.partitioned && read.group.is_some();
        let starts: Vec<Option<u64>> = starts.into_iter().map(|s| (!member).then_some(s)).collect();
        let id = st.ids.next();
        let reader = Arc::new(Reader::new(
            id,
            source,
            Arc::clone(&self.shared.sink),
            spec.credit,
            spec.auto_settle,
            read.group,
            &starts,
        ));
        st.rare().stream_readers.insert(id, Arc::clone(&reader));
        drop(st);
        self.inner.streams.attach(&target, &reader);
        Ok(id)
    }

    /// The stream a publish to queue `name` goes to, if `name` is one
    /// (see [`Rare::last_stream`]).
    fn stream_to_publish(
        &self,
        st: &mut SessionState,
        name: &str,
    ) -> Result<Option<stream::Target>, BrokerError> {
        if let Some(t) = st.last_stream(name) {
            return Ok(Some(t.clone()));
        }
        let target = self.inner.streams.target(name, false)?;
        if let Some(t) = &target {
            st.rare().last_stream = Some((name.into(), t.clone()));
        }
        Ok(target)
    }

    fn publish_to_stream(
        &self,
        address: Cow<'_, Address>,
        target: &stream::Target,
        mut message: Arc<Message>,
        options: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError> {
        if options.txn.is_some() {
            let (Address::Queue(name) | Address::Topic(name)) = &*address;
            return Err(BrokerError::InvalidAddress(format!(
                "transactional publishes to a stream ('{name}') are not supported yet"
            )));
        }
        // Where it was published, as routing records it for a queue: MQTT
        // readers get it as their PUBLISH topic. Moved when handed over.
        // Unshared unless an adapter kept a clone (then this copies it).
        Arc::make_mut(&mut message).address = Some(address.into_owned());
        let s = target.for_publish(&message);
        let now = self.inner.streams.now_ms();
        let (pending, confirm) = if options.confirm {
            let ticket = self.inner.next_ticket();
            (Some(ticket), Some((Arc::clone(&self.shared.sink), ticket)))
        } else {
            (None, None)
        };
        self.inner.streams.append(s, message, now, confirm)?;
        Ok(PublishReceipt { routed: 1, pending })
    }

    fn completion(&self, ticket: Ticket) -> Completion {
        Inner::complete_ticket(&self.shared.sink, ticket)
    }

    /// Publishes to `address` (borrowed from the adapter, or handed over
    /// with the message: then routing keeps it rather than a copy).
    fn publish_to(
        &mut self,
        address: Cow<'_, Address>,
        message: Arc<Message>,
        options: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError> {
        let mut st = self.state()?;
        if !self
            .inner
            .access
            .may_publish(&self.shared.info.principal, &address)
        {
            return Err(BrokerError::Unauthorized(format!("publish to '{address}'")));
        }
        if let Address::Queue(name) = &*address {
            if let Some(t) = self.stream_to_publish(&mut st, name)? {
                drop(st);
                let receipt = self.publish_to_stream(address, &t, message, options)?;
                self.count_publish();
                return Ok(receipt);
            }
        }
        if let Some(txn) = options.txn {
            let ops = st.staging(txn)?;
            ops.push(Staged::Publish {
                address: address.into_owned(),
                message,
            });
            return Ok(PublishReceipt {
                routed: 0,
                pending: None,
            });
        }
        drop(st);
        let mut batch = Batch::default();
        let routed = self.inner.route_owned(
            address.into_owned(),
            message,
            self.shared.info.client_id.as_deref(),
            &mut batch,
            Duplicates::Detect,
        )?;
        let pending = self.commit_batch(batch, options.confirm);
        // A client's publish, once however many queues it reached; the
        // broker's own copies (dead letters, wills, moves) are not counted.
        self.count_publish();
        Ok(PublishReceipt { routed, pending })
    }

    /// Commits `batch`, with a ticket when `confirm` asks and there is
    /// something to wait for.
    fn commit_batch(&self, batch: Batch, confirm: bool) -> Option<Ticket> {
        if confirm && batch.has_records() {
            let ticket = self.inner.next_ticket();
            batch.commit(&self.inner, Some(self.completion(ticket)));
            Some(ticket)
        } else {
            batch.commit(&self.inner, None);
            None
        }
    }

    fn may_consume(&self, q: &Queue) -> bool {
        let name: &str = &q.name;
        let info = &self.shared.info;
        // Internal queues derive from the client's identity: only that client
        // may consume them.
        if let Some(rest) = name.strip_prefix("$mqtt/") {
            return info.protocol == rosetta_neutral::Protocol::Mqtt
                && info.client_id.as_deref() == Some(rest);
        }
        if let Some(rest) = name.strip_prefix("$durable/") {
            // Keyed by the client id, or (STOMP without `client-id`) by
            // the authenticated user name.
            let key = info.client_id.as_deref().or(info.principal.user.as_deref());
            return key.is_some_and(|c| rest.starts_with(&format!("{c}/")));
        }
        if name.starts_with("$share/") {
            return true; // the bind of the shared filter was authorised
        }
        if name.starts_with(rosetta_neutral::address::TEMP_QUEUE_NAME_PREFIX) {
            return q.owner_session().is_none_or(|o| o == self.shared.id);
        }
        self.inner
            .access
            .may_subscribe(&info.principal, &Address::Queue(name.to_owned()))
    }
}

/// Dispatches every queue the session consumes from: what its consumers
/// were turned away from while their connection had no room (its owner
/// resumes it once its delivery budget has room again, see
/// `rosetta_neutral::budget`).
fn dispatch_to_session(inner: &Inner, shared: &SessionShared) {
    let readers: Vec<Arc<Reader>> = shared
        .state
        .lock()
        .rare
        .as_ref()
        .map(|r| r.stream_readers.values().cloned().collect())
        .unwrap_or_default();
    for r in readers {
        r.pump(&inner.streams.groups);
    }
    let queues: Vec<Arc<Queue>> = {
        let st = shared.state.lock();
        let mut queues: Vec<Arc<Queue>> = Vec::with_capacity(st.subs.len());
        for c in st.subs.values() {
            if !queues.iter().any(|q| Arc::ptr_eq(q, &c.queue)) {
                queues.push(Arc::clone(&c.queue));
            }
        }
        queues
    };
    for q in queues {
        let out = {
            let mut qs = q.state.lock();
            q.dispatch_locked(&mut qs, inner.now_ms())
        };
        inner.after_dispatch(out);
    }
}

/// Takes `entry` out of `queue` on its way to the dead-letter address: the
/// queue's ack record joins `batch` (so the copy and the ack commit
/// together), its bytes leave the memory budget, and it waits in `dead`
/// until the queue lock is released and it can be routed.
fn retire_to_dead_letter(
    queue: &Arc<Queue>,
    stats: &mut super::queue::QueueCounters,
    entry: super::queue::Entry,
    reason: DeadLetterReason,
    batch: &mut Batch,
    dead: &mut Vec<DeadLetter>,
) {
    stats.dead_lettered_total += 1;
    batch.records.extend(queue.ack_record(&entry));
    queue.release(&entry);
    dead.push(DeadLetter {
        entry,
        from: Arc::clone(queue),
        reason,
    });
}

/// Settles one in-flight delivery in its queue. Dead entries are moved in
/// `batch`.
fn apply_settle(
    inner: &Inner,
    queue: &Arc<Queue>,
    key: ConsumerKey,
    tag: DeliveryTag,
    outcome: Outcome,
    batch: &mut Batch,
) -> Result<(), BrokerError> {
    let mut dead = Vec::new();
    let now_ms = batch.now_ms(inner);
    let out = {
        let mut st = queue.state.lock();
        let settle = Settle {
            key,
            outcome,
            now_ms,
        };
        settle_locked(inner, queue, &mut st, tag, settle, batch, &mut dead)?;
        queue.dispatch_locked(&mut st, now_ms)
    };
    finish_settles(inner, out, dead, batch);
    Ok(())
}

/// After settling under a queue's lock: the dispatch's records join
/// `batch`, dead entries are routed to the dead-letter address, and expired
/// ones to the expiry address.
fn finish_settles(
    inner: &Inner,
    out: super::queue::DispatchOutput,
    dead: Vec<DeadLetter>,
    batch: &mut Batch,
) {
    batch.records.extend(out.records);
    inner.dead_letter(dead, batch);
    if !out.expired.is_empty() {
        inner.after_dispatch(super::queue::DispatchOutput {
            records: Vec::new(),
            expired: out.expired,
            dead: Vec::new(),
        });
    }
}

/// What one settlement applies, and when (the core's clock, read once
/// for all the settlements of a call).
#[derive(Clone, Copy)]
struct Settle {
    key: ConsumerKey,
    outcome: Outcome,
    now_ms: u64,
}

/// Applies `outcome` to one in-flight delivery, under the queue's lock,
/// without dispatching what the freed credit allows (the caller does, once
/// for all the deliveries it settles).
fn settle_locked(
    inner: &Inner,
    queue: &Arc<Queue>,
    st: &mut super::queue::QueueState,
    tag: DeliveryTag,
    settle: Settle,
    batch: &mut Batch,
    dead: &mut Vec<DeadLetter>,
) -> Result<(), BrokerError> {
    let Settle {
        key,
        outcome,
        now_ms,
    } = settle;
    // One lookup: taken out, and put back in the rare case that it is
    // someone else's.
    let (lease_journaled, mut entry) = match st.take_inflight_of(tag.0, key) {
        Ok(taken) => taken,
        // Never applied elsewhere: the redelivered copy has its own tag.
        Err(None) if st.leases.take_expired(tag.0) => return Err(BrokerError::LeaseExpired),
        Err(_) => return Err(BrokerError::Unknown("delivery")),
    };
    if let Some(slot) = st.consumers.iter_mut().find(|c| c.key == key) {
        if let CreditMode::Window(_) = slot.mode {
            slot.credit += 1;
        }
    }
    match outcome {
        Outcome::Accept => {
            queue.release(&entry);
            st.stats.get_mut().acked_total += 1;
            queue.traffic().acknowledged();
            st.stats.get_mut().time_in_queue_ms_total +=
                now_ms.saturating_sub(entry.enqueued_at_ms);
            batch.records.extend(queue.ack_record(&entry));
        }
        Outcome::Release => {
            queue.put_back_later(st, entry, now_ms, lease_journaled, &mut batch.records);
        }
        Outcome::Modify {
            delivery_failed,
            undeliverable_here,
        } => {
            if delivery_failed {
                entry.delivery_count += 1;
            }
            if entry.delivery_count >= inner.delivery_attempts_max(queue) {
                let reason = DeadLetterReason::DeliveryAttempts;
                retire_to_dead_letter(queue, st.stats.get_mut(), entry, reason, batch, dead);
            } else {
                if undeliverable_here {
                    entry.excluded = Some(key);
                }
                entry.annotation = None;
                let changed = delivery_failed || lease_journaled;
                queue.put_back_later(st, entry, now_ms, changed, &mut batch.records);
            }
        }
        Outcome::Reject => {
            let reason = DeadLetterReason::Rejected;
            retire_to_dead_letter(queue, st.stats.get_mut(), entry, reason, batch, dead);
        }
    }
    Ok(())
}

/// Detaches a consumer; its unsettled deliveries count as failed attempts
/// and go back to the queue (or to the dead-letter address).
fn detach_consumer(inner: &Inner, queue: &Arc<Queue>, key: ConsumerKey) {
    let mut batch = Batch::default();
    let mut dead = Vec::new();
    let now_ms = inner.now_ms();
    let (out, delete_now) = {
        let mut st = queue.state.lock();
        st.detach(key);
        let returned: Vec<u64> = st
            .inflight
            .iter()
            .filter(|(_, (k, _))| *k == key)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in returned {
            let Some((_, mut entry)) = st.take_inflight(seq) else {
                continue;
            };
            entry.delivery_count += 1;
            if entry.delivery_count >= inner.delivery_attempts_max(queue) {
                let reason = DeadLetterReason::DeliveryAttempts;
                retire_to_dead_letter(
                    queue,
                    st.stats.get_mut(),
                    entry,
                    reason,
                    &mut batch,
                    &mut dead,
                );
            } else {
                // As Artemis: a consumer that goes with unsettled
                // deliveries failed them, and the delay applies.
                queue.put_back_later(&mut st, entry, now_ms, true, &mut batch.records);
            }
        }
        let no_consumers = st.consumers.is_empty();
        if no_consumers {
            st.idle_since = IdleSince::at(Instant::now());
        }
        let out = queue.dispatch_locked(&mut st, now_ms);
        (
            out,
            no_consumers && queue.lifetime() == QueueLifetime::Consumer && !st.deleted,
        )
    };
    batch.records.extend(out.records);
    inner.dead_letter(dead, &mut batch);
    batch.commit(inner, None);
    if delete_now {
        if let Err(e) = inner.delete_queue(&queue.name) {
            tracing::debug!(queue = %queue.name, error = %e, "consumer-lifetime queue already gone");
        }
    }
}

/// Closes a session from its own connection or from a take-over.
fn close_shared(inner: &Arc<Inner>, shared: &Arc<SessionShared>, kind: CloseKind) {
    let (consumers, owned, will, readers) = {
        let mut st = shared.state.lock();
        if st.is_closed() {
            return;
        }
        st.ids.close();
        let rare = st.rare.take().map(|r| *r).unwrap_or_default();
        // All closed before any leaves its group, so that a rebalance
        // gives no partition to another reader of this closing session.
        let readers: Vec<Arc<Reader>> = rare.stream_readers.into_values().collect();
        for r in &readers {
            r.close();
        }
        let (consumers, owned) = st.subs.take_all();
        (consumers, owned, st.will.take().map(|w| *w), readers)
    };
    // Outside the session's lock: a rebalance serves the other members.
    for r in &readers {
        inner.streams.detach(r);
    }
    for (id, c) in consumers {
        detach_consumer(
            inner,
            &c.queue,
            ConsumerKey {
                session: shared.id,
                consumer: id,
            },
        );
    }
    for name in owned {
        if let Err(e) = inner.delete_queue(&name) {
            tracing::debug!(queue = %name, error = %e, "session queue already gone");
        }
    }
    if let (Some(will), CloseKind::Abnormal | CloseKind::CleanWithWill) = (will, kind) {
        if will.delay.is_zero() {
            inner.publish_will(will);
        } else if let Some(client_id) = &shared.info.client_id {
            inner.wills.lock().push(PendingWill {
                due: Instant::now() + will.delay,
                client: (shared.info.protocol, client_id.clone()),
                will,
            });
        } else {
            inner.publish_will(will);
        }
    }
    // Dropped outside the locks (these are not the last references: the
    // caller holds one).
    let by_id = inner.sessions.lock().remove(shared.id);
    let by_client = match shared.info.client_id {
        Some(_) => inner.clients.lock().remove(shared),
        None => None,
    };
    drop((by_id, by_client));
}

impl Session for CoreSession {
    fn declare_queue(&mut self, spec: QueueSpec) -> Result<QueueInfo, BrokerError> {
        let mut st = self.state()?;
        let lifetime = spec.lifetime;
        let mut batch = Batch::default();
        let (q, existed) = self.inner.declare(spec, Some(self.shared.id), &mut batch)?;
        batch.commit(&self.inner, None);
        if lifetime == QueueLifetime::Session && !existed {
            st.subs.add_owned_queue(Arc::clone(&q.name));
        }
        Ok(Inner::queue_info(&q, existed))
    }

    fn declare_stream(&mut self, name: &str) -> Result<bool, BrokerError> {
        let _st = self.state()?;
        if self.inner.routing.read().queue(name).is_some() {
            return Err(BrokerError::InvalidStreamOffset(format!(
                "'{name}' is a queue, not a stream"
            )));
        }
        let existed = self.inner.streams.target(name, false)?.is_some();
        self.inner.streams.target(name, true)?;
        Ok(existed)
    }

    fn delete_queue(&mut self, name: &str) -> Result<(), BrokerError> {
        let mut st = self.state()?;
        st.subs.remove_owned_queue(name);
        self.inner.delete_queue(name)
    }

    fn bind(
        &mut self,
        queue: &str,
        filter: &str,
        mut options: BindingOptions,
    ) -> Result<BindInfo, BrokerError> {
        let _st = self.state()?;
        let principal = &self.shared.info.principal;
        if !self
            .inner
            .access
            .may_subscribe(principal, &Address::Topic(filter.to_owned()))
        {
            return Err(BrokerError::Unauthorized(format!(
                "subscribe to '{filter}'"
            )));
        }
        // Deny rules that reach part of what the filter matches: the
        // binding is made, and skips those topics.
        for excluded in self.inner.access.excluded_topics(principal, filter) {
            if !options.excluded.contains(&excluded) {
                options.excluded.push(excluded);
            }
        }
        let mut batch = Batch::default();
        let info = self
            .inner
            .bind(queue, filter, options, self.origin(), &mut batch)?;
        batch.commit(&self.inner, None);
        Ok(info)
    }

    fn unbind(&mut self, queue: &str, filter: &str) -> Result<bool, BrokerError> {
        let _st = self.state()?;
        self.inner.unbind(queue, filter)
    }

    fn publish(
        &mut self,
        address: &Address,
        message: Message,
        options: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError> {
        self.publish_to(Cow::Borrowed(address), Arc::new(message), options)
    }

    fn publish_addressed(
        &mut self,
        mut message: Arc<Message>,
        options: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError> {
        // Taken out while routing decides (it puts it back); an adapter
        // that kept a clone of the message leaves it shared, and then the
        // address is cloned instead.
        let address = match Arc::get_mut(&mut message) {
            Some(unshared) => unshared.address.take(),
            None => message.address.clone(),
        };
        let Some(address) = address else {
            return Err(BrokerError::InvalidAddress(
                "a message without an address".to_owned(),
            ));
        };
        self.publish_to(Cow::Owned(address), message, options)
    }

    fn consume(&mut self, spec: ConsumerSpec) -> Result<ConsumerId, BrokerError> {
        let mut st = self.state()?;
        if st.subs.len() >= CONSUMERS_PER_SESSION_MAX {
            return Err(BrokerError::ResourceLimit(format!(
                "more than {CONSUMERS_PER_SESSION_MAX} consumers"
            )));
        }
        if let Some(s) = self.stream_to_consume(&spec)? {
            return self.consume_stream(st, s, spec);
        }
        let q = match self.inner.routing.read().queue(&spec.queue) {
            Some(q) => Some(Arc::clone(q)),
            None => None,
        };
        let q = match q {
            Some(q) => q,
            None if self.inner.config.auto_create_queues && !spec.queue.starts_with('$') => {
                let mut batch = Batch::default();
                let qspec = QueueSpec {
                    name: Some(spec.queue.clone()),
                    durable: true,
                    lifetime: QueueLifetime::Permanent,
                    bindings_max: None,
                };
                let (q, _) = self
                    .inner
                    .declare(qspec, Some(self.shared.id), &mut batch)?;
                batch.commit(&self.inner, None);
                q
            }
            None => return Err(BrokerError::NotFound(format!("queue '{}'", spec.queue))),
        };
        if !self.may_consume(&q) {
            return Err(BrokerError::Unauthorized(format!(
                "consume from '{}'",
                spec.queue
            )));
        }
        let options = spec.options;
        let selector = match options.selector.as_deref().map(Selector::parse) {
            None => None,
            Some(Ok(s)) if s.is_empty() => None,
            Some(Ok(selector)) => Some(Box::new(Selecting {
                selector,
                matches: Default::default(),
            })),
            Some(Err(e)) => return Err(BrokerError::InvalidSelector(e.to_string())),
        };
        let visibility_timeout_ms = options
            .visibility_timeout_ms
            .or(q.settings.visibility_timeout_ms)
            // A browser's copies need no settlement, so no lease.
            .filter(|_| !options.browse && !spec.auto_settle);
        if let Some(ms) = visibility_timeout_ms {
            if ms == 0 || ms > VISIBILITY_TIMEOUT_MS_MAX {
                return Err(BrokerError::ResourceLimit(format!(
                    "visibility timeout {ms} ms: from 1 to {VISIBILITY_TIMEOUT_MS_MAX} ms"
                )));
            }
        }
        let id = st.ids.next();
        let credit = match spec.credit {
            CreditMode::Window(n) | CreditMode::Explicit(n) => n,
        };
        let slot = ConsumerSlot {
            key: ConsumerKey {
                session: self.shared.id,
                consumer: id,
            },
            mode: spec.credit,
            credit,
            sent: 0,
            auto_settle: spec.auto_settle,
            drain: false,
            sink: Arc::clone(&self.shared.sink),
            priority: options.priority,
            exclusive: options.exclusive,
            selector,
            groups: 0,
            browse: options.browse.then(Box::default),
            // Zero is refused above.
            visibility_timeout_ms: visibility_timeout_ms.and_then(NonZeroU32::new),
        };
        let out = {
            let mut qs = q.state.lock();
            if qs.deleted {
                return Err(BrokerError::NotFound(format!("queue '{}'", spec.queue)));
            }
            qs.attach(slot);
            qs.idle_since = IdleSince::BUSY;
            q.dispatch_locked(&mut qs, self.inner.now_ms())
        };
        st.subs.insert(id, ConsumerRef { queue: q });
        drop(st);
        self.inner.after_dispatch(out);
        Ok(id)
    }

    fn cancel(&mut self, consumer: ConsumerId) -> Result<(), BrokerError> {
        let mut st = self.state()?;
        let reader = st
            .rare
            .as_mut()
            .and_then(|r| r.stream_readers.remove(&consumer));
        if let Some(r) = reader {
            drop(st);
            self.inner.streams.detach(&r);
            return Ok(());
        }
        let c = st
            .subs
            .remove(&consumer)
            .ok_or(BrokerError::Unknown("consumer"))?;
        drop(st);
        detach_consumer(
            &self.inner,
            &c.queue,
            ConsumerKey {
                session: self.shared.id,
                consumer,
            },
        );
        Ok(())
    }

    fn set_credit(
        &mut self,
        consumer: ConsumerId,
        limit: u32,
        drain: bool,
    ) -> Result<(), BrokerError> {
        if let Some(r) = self.stream_reader(consumer)? {
            r.set_credit(limit, drain);
            r.pump(&self.inner.streams.groups);
            return Ok(());
        }
        let q = self.queue_of(consumer)?;
        let key = ConsumerKey {
            session: self.shared.id,
            consumer,
        };
        let out = {
            let mut qs = q.state.lock();
            let Some(slot) = qs.consumers.iter_mut().find(|c| c.key == key) else {
                return Err(BrokerError::Unknown("consumer"));
            };
            slot.set_credit_limit(limit);
            slot.drain = drain;
            q.dispatch_locked(&mut qs, self.inner.now_ms())
        };
        self.inner.after_dispatch(out);
        Ok(())
    }

    fn settle(
        &mut self,
        consumer: ConsumerId,
        tag: DeliveryTag,
        outcome: Outcome,
        txn: Option<TxnId>,
        confirm: bool,
    ) -> Result<Option<Ticket>, BrokerError> {
        let _ = outcome; // a log has no redelivery: every outcome settles
        if let Some(r) = self.stream_reader(consumer)? {
            // Not staged in a transaction: a stream settlement only moves
            // the group's offset (see `stream::reader`). Confirmed, it
            // waits for that offset to be durable, as a queue's does.
            let _ = txn;
            let ticket = confirm.then(|| self.inner.next_ticket());
            let done = ticket.map(|t| self.completion(t));
            let settled = r.settle(tag, &self.inner.streams.groups, done);
            if settled == stream::Settlement::Unknown {
                return Err(BrokerError::Unknown("delivery"));
            }
            r.pump(&self.inner.streams.groups);
            return Ok(ticket.filter(|_| settled == stream::Settlement::Committed));
        }
        let mut st = self.state()?;
        let q = Arc::clone(
            &st.subs
                .get(&consumer)
                .ok_or(BrokerError::Unknown("consumer"))?
                .queue,
        );
        if let Some(txn) = txn {
            let ops = st.staging(txn)?;
            {
                let qs = q.state.lock();
                if !qs.inflight.contains_key(&tag.0) {
                    if qs.leases.is_expired(tag.0) {
                        return Err(BrokerError::LeaseExpired);
                    }
                    return Err(BrokerError::Unknown("delivery"));
                }
            }
            ops.push(Staged::Settle {
                consumer,
                tag,
                outcome,
            });
            return Ok(None);
        }
        drop(st);
        let mut batch = Batch::default();
        apply_settle(
            &self.inner,
            &q,
            ConsumerKey {
                session: self.shared.id,
                consumer,
            },
            tag,
            outcome,
            &mut batch,
        )?;
        Ok(self.commit_batch(batch, confirm))
    }

    fn settle_many(
        &mut self,
        deliveries: &[(ConsumerId, DeliveryTag)],
        outcome: Outcome,
    ) -> Result<usize, BrokerError> {
        let mut batch = Batch::default();
        let mut settled = 0;
        let mut rest = deliveries;
        while let Some(&(consumer, _)) = rest.first() {
            // One queue lock and one dispatch per run of one consumer's
            // deliveries, instead of one per delivery.
            let run = rest.iter().take_while(|(c, _)| *c == consumer).count();
            let (this, next) = rest.split_at(run);
            rest = next;
            if let Some(r) = self.stream_reader(consumer)? {
                for &(_, tag) in this {
                    let done = r.settle(tag, &self.inner.streams.groups, None);
                    settled += usize::from(done != stream::Settlement::Unknown);
                }
                r.pump(&self.inner.streams.groups);
                continue;
            }
            let queue = match self.state()?.subs.get(&consumer) {
                Some(c) => Arc::clone(&c.queue),
                None => continue,
            };
            let key = ConsumerKey {
                session: self.shared.id,
                consumer,
            };
            let mut dead = Vec::new();
            let settle = Settle {
                key,
                outcome,
                now_ms: batch.now_ms(&self.inner),
            };
            let out = {
                let mut st = queue.state.lock();
                for &(_, tag) in this {
                    let r = settle_locked(
                        &self.inner,
                        &queue,
                        &mut st,
                        tag,
                        settle,
                        &mut batch,
                        &mut dead,
                    );
                    settled += usize::from(r.is_ok());
                }
                queue.dispatch_locked(&mut st, settle.now_ms)
            };
            finish_settles(&self.inner, out, dead, &mut batch);
        }
        self.commit_batch(batch, false);
        Ok(settled)
    }

    fn annotate(
        &mut self,
        consumer: ConsumerId,
        tag: DeliveryTag,
        annotation: Bytes,
    ) -> Result<(), BrokerError> {
        let q = self.queue_of(consumer)?;
        let record = {
            let mut qs = q.state.lock();
            let Some((_, entry)) = qs.inflight.get_mut(&tag.0) else {
                return Err(BrokerError::Unknown("delivery"));
            };
            entry.annotation = Some(annotation.clone());
            q.delivery_state_record(entry, None)
        };
        if let Some(record) = record {
            self.inner.journal.append(vec![record], None);
        }
        Ok(())
    }

    fn renew_lease(&mut self, consumer: ConsumerId, tag: DeliveryTag) -> Result<(), BrokerError> {
        let q = self.queue_of(consumer)?;
        let key = ConsumerKey {
            session: self.shared.id,
            consumer,
        };
        let now_ms = self.inner.now_ms();
        let mut guard = q.state.lock();
        let lease_ms = guard
            .consumers
            .iter()
            .find(|c| c.key == key)
            .and_then(|c| c.visibility_timeout_ms)
            .map(NonZeroU32::get);
        let qs = &mut *guard;
        let record = match qs.inflight.get_mut(&tag.0) {
            Some((owner, entry)) if *owner == key => {
                match (entry.lease_until, lease_ms) {
                    (Some(old), Some(lease_ms)) => {
                        let deadline = now_ms.saturating_add(u64::from(lease_ms));
                        entry.lease_until = Some(deadline);
                        qs.leases.end(old, tag.0);
                        qs.leases.start(deadline, tag.0);
                        // A later deadline: the armed timer fires early once
                        // and re-arms (no earlier arm needed). The journal
                        // learns it, as it learnt the first.
                        q.delivery_state_record(entry, Some(deadline))
                    }
                    _ => None,
                }
            }
            None if qs.leases.is_expired(tag.0) => return Err(BrokerError::LeaseExpired),
            _ => return Err(BrokerError::Unknown("delivery")),
        };
        drop(guard);
        if let Some(record) = record {
            let batch = Batch {
                records: vec![record],
                ..Batch::default()
            };
            batch.commit(&self.inner, None);
        }
        Ok(())
    }

    fn begin(&mut self) -> TxnId {
        let mut st = self.shared.state.lock();
        let rare = st.rare();
        rare.next_txn += 1;
        let id = TxnId(rare.next_txn);
        if rare.txns.len() < TRANSACTIONS_OPEN_MAX {
            rare.txns.insert(id, Vec::new());
        }
        // Past the limit the id is never registered, so every use of it
        // fails with "unknown transaction".
        id
    }

    fn commit(&mut self, txn: TxnId) -> Result<Ticket, BrokerError> {
        let mut st = self.state()?;
        let ops = st
            .rare
            .as_mut()
            .and_then(|r| r.txns.remove(&txn))
            .ok_or(BrokerError::Unknown("transaction"))?;
        let consumers: HashMap<ConsumerId, Arc<Queue>> = st
            .subs
            .iter()
            .map(|(id, c)| (*id, Arc::clone(&c.queue)))
            .collect();
        drop(st);
        let mut batch = Batch::default();
        let mut first_error = None;
        for op in ops {
            let result = match op {
                Staged::Publish { address, message } => self
                    .inner
                    .route_owned(
                        address,
                        message,
                        self.shared.info.client_id.as_deref(),
                        &mut batch,
                        Duplicates::Detect,
                    )
                    .map(|_| self.count_publish()),
                Staged::Settle {
                    consumer,
                    tag,
                    outcome,
                } => match consumers.get(&consumer) {
                    Some(q) => apply_settle(
                        &self.inner,
                        q,
                        ConsumerKey {
                            session: self.shared.id,
                            consumer,
                        },
                        tag,
                        outcome,
                        &mut batch,
                    ),
                    None => Err(BrokerError::Unknown("consumer")),
                },
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "transactional operation failed at commit");
                first_error.get_or_insert(e);
            }
        }
        // All records of the transaction go to the journal as one atomic unit.
        let ticket = self.inner.next_ticket();
        batch.commit(&self.inner, Some(self.completion(ticket)));
        match first_error {
            // Settlements of deliveries that vanished (consumer closed) are
            // reported; what did apply stays committed.
            Some(e @ BrokerError::Unknown(_)) => Err(e),
            _ => Ok(ticket),
        }
    }

    fn rollback(&mut self, txn: TxnId) -> Result<(), BrokerError> {
        let mut st = self.state()?;
        st.rare
            .as_mut()
            .and_then(|r| r.txns.remove(&txn))
            .map(|_| ())
            .ok_or(BrokerError::Unknown("transaction"))
    }

    fn get_state(&mut self, key: &str) -> Option<Bytes> {
        let full = state_key(&self.shared.info, key);
        self.inner.client_state.lock().get(&full).cloned()
    }

    fn put_state(
        &mut self,
        key: &str,
        value: Option<Bytes>,
    ) -> Result<Option<Ticket>, BrokerError> {
        let _st = self.state()?;
        let full = state_key(&self.shared.info, key);
        {
            let mut map = self.inner.client_state.lock();
            match &value {
                Some(v) => map.insert(full.clone(), v.clone()),
                None => map.remove(&full),
            };
        }
        let batch = Batch {
            records: vec![Record::State { key: full, value }],
            ..Batch::default()
        };
        Ok(self.commit_batch(batch, true))
    }

    fn set_will(&mut self, will: Option<Will>) -> Result<(), BrokerError> {
        if let Some(w) = &will {
            if !self
                .inner
                .access
                .may_publish(&self.shared.info.principal, &w.address)
            {
                return Err(BrokerError::Unauthorized(format!(
                    "will to '{}'",
                    w.address
                )));
            }
        }
        self.shared.state.lock().will = will.map(Box::new);
        Ok(())
    }

    fn producer_blocked(&self) -> bool {
        self.inner.producers_blocked()
    }

    fn may_publish(&self, address: &Address) -> bool {
        self.inner
            .access
            .may_publish(&self.shared.info.principal, address)
    }

    fn resume_deliveries(&mut self) {
        dispatch_to_session(&self.inner, &self.shared);
    }

    fn close(&mut self, kind: CloseKind) {
        close_shared(&self.inner, &self.shared, kind);
    }
}

impl Drop for CoreSession {
    fn drop(&mut self) {
        // A connection that vanished without closing counts as abnormal.
        close_shared(&self.inner, &self.shared, CloseKind::Abnormal);
    }
}

fn state_key(info: &SessionInfo, key: &str) -> String {
    format!(
        "{}/{}/{}",
        info.protocol.as_str(),
        info.client_id.as_deref().unwrap_or(""),
        key
    )
}

#[cfg(test)]
mod size_tests {
    use super::*;
    use rosetta_neutral::{Broker, ConsumerOptions};

    /// A session that stops consuming and deletes the queue it owned goes
    /// back to holding nothing for them (an idle connection's size).
    #[test]
    fn a_session_frees_its_subscriptions_box_with_its_last_consumer_and_owned_queue() {
        let core = crate::Core::in_memory();
        let events = Arc::new(crate::tests::Events::default());
        let mut s = core.open_session(crate::tests::info("c"), events);
        let shared = |core: &crate::Core| {
            let sessions = core.inner.sessions.lock();
            let first = sessions.iter().next().map(Arc::clone);
            first.expect("one session")
        };
        let held = |core: &crate::Core| shared(core).state.lock().subs.0.is_some();
        assert!(!held(&core), "a new session holds no box");
        s.declare_queue(QueueSpec {
            name: Some("owned".into()),
            durable: false,
            lifetime: QueueLifetime::Session,
            bindings_max: None,
        })
        .expect("declare");
        let id = s
            .consume(ConsumerSpec {
                queue: "owned".into(),
                credit: CreditMode::Window(10),
                auto_settle: false,
                options: ConsumerOptions::default(),
            })
            .expect("consume");
        {
            let sh = shared(&core);
            let st = sh.state.lock();
            assert_eq!((st.subs.len(), st.subs.owned_queues().len()), (1, 1));
        }
        s.cancel(id).expect("cancel");
        assert!(held(&core), "the owned queue is still there");
        s.delete_queue("owned").expect("delete");
        assert!(!held(&core), "both lists empty: the box is freed");
    }

    /// One per connection (issue 20): 112 bytes and Arc's two counts are
    /// jemalloc's 128 B class; a field more would take it to 160.
    #[test]
    fn a_session_fits_its_size_class() {
        assert_eq!(std::mem::size_of::<SessionState>(), 32);
        assert!(
            std::mem::size_of::<SessionShared>() <= 112,
            "SessionShared is {} B",
            std::mem::size_of::<SessionShared>()
        );
    }
}
