//! Addresses: the queue map, the binding trie, retained messages, and the
//! publish path that routes a message to its queues.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use rosetta_neutral::address::{
    validate_topic_filter, validate_topic_name, ADDRESS_LEN_MAX, TEMP_QUEUE_NAME_PREFIX,
};
use rosetta_neutral::{
    Address, BindInfo, BindingOptions, BrokerError, MatchInfo, Message, QueueInfo, QueueLifetime,
    QueueSpec, RetainedOnBind, SessionEvent,
};

use rosetta_neutral::message::DELIVERY_DELAY_MAX_MS;
use rosetta_store::Record;

use super::batch::{recycle, Batch};
use super::codec;
use super::dedup::{self, DedupKey, Screen, TopicScreen};
use super::queue::{Entry, Queue, QueueBinding};
use super::tables::QueuesByName;
use super::trie::TopicTrie;
use super::Inner;

/// One binding in the trie.
#[derive(Clone)]
pub(crate) struct RouteBinding {
    pub(crate) queue: Arc<Queue>,
    pub(crate) options: BindingOptions,
    pub(crate) owner: Option<Arc<str>>,
}

#[derive(Default)]
pub(crate) struct Routing {
    trie: TopicTrie<RouteBinding>,
    queues: QueuesByName,
    /// The queues' names in order, so that a page of a listing (the admin
    /// API's) is a walk from its start rather than a sort of every name.
    /// Beside `queues` (kept equal by `insert_queue` and `remove_queue`):
    /// the hash map stays the lookup of the routing hot path.
    names: BTreeSet<Arc<str>>,
    /// Binding caps of the queues declared with one
    /// (`QueueSpec::bindings_max`), by queue id.
    bindings_max_by_queue: HashMap<u64, usize>,
}

/// The error for a request that would pass a limit: one wording for every
/// count the core caps.
pub(crate) fn limit_exceeded(what: &str, max: usize) -> BrokerError {
    BrokerError::ResourceLimit(format!("at most {max} {what}"))
}

impl Routing {
    /// Every queue.
    pub(crate) fn queues(&self) -> impl Iterator<Item = &Arc<Queue>> + '_ {
        self.queues.values()
    }

    pub(crate) fn queue_count(&self) -> usize {
        self.queues.len()
    }

    pub(crate) fn queue(&self, name: &str) -> Option<&Arc<Queue>> {
        self.queues.get(name)
    }

    /// Every queue's name, in order.
    pub(crate) fn names_in_order(&self) -> impl Iterator<Item = &Arc<str>> + '_ {
        self.names.iter()
    }

    /// Every queue's name, in order (from the ordered set: the hash table
    /// beside it has no order and costs a pointer chase per queue).
    pub(crate) fn queue_names(&self) -> Vec<String> {
        self.names.iter().map(|name| name.to_string()).collect()
    }

    pub(crate) fn insert_queue(&mut self, q: Arc<Queue>) {
        self.names.insert(Arc::clone(&q.name));
        self.queues.insert(q);
    }

    /// Checks that binding `filter` to `queue` stays within the limits:
    /// `total_max` bindings in all and the queue's own cap. Replacing an
    /// existing binding always does.
    pub(crate) fn check_bind(
        &self,
        queue: &Queue,
        filter: &str,
        total_max: usize,
    ) -> Result<(), BrokerError> {
        let st = queue.state.lock();
        if st.bindings.iter().any(|b| b.filter == filter) {
            return Ok(());
        }
        if let Some(&max) = self.bindings_max_by_queue.get(&queue.id) {
            if st.bindings.len() >= max {
                return Err(limit_exceeded(
                    &format!("subscriptions on '{}'", queue.name),
                    max,
                ));
            }
        }
        if self.trie.len() >= total_max {
            return Err(limit_exceeded("bindings in the broker", total_max));
        }
        Ok(())
    }

    /// Sets the binding cap of `queue` (`QueueSpec::bindings_max`).
    fn set_bindings_max(&mut self, queue: &Queue, max: Option<usize>) {
        if let Some(max) = max {
            self.bindings_max_by_queue.insert(queue.id, max);
        }
    }

    /// Adds or replaces the binding of `filter` to `queue`, whatever the
    /// limits (see [`Self::check_bind`]). Returns whether it existed.
    pub(crate) fn bind(
        &mut self,
        queue: &Arc<Queue>,
        filter: &str,
        options: BindingOptions,
        owner: Option<Arc<str>>,
    ) -> bool {
        let id = queue.id;
        let existed = self.trie.remove_where(filter, |b| b.queue.id == id) > 0;
        self.trie.insert(
            filter,
            RouteBinding {
                queue: Arc::clone(queue),
                options: options.clone(),
                owner: owner.clone(),
            },
        );
        let mut st = queue.state.lock();
        st.bindings.retain(|b| b.filter != filter);
        // Exactly sized for the first: most queues have one binding.
        if st.bindings.capacity() == 0 {
            st.bindings.reserve_exact(1);
        }
        st.bindings.push(QueueBinding {
            filter: filter.to_owned(),
            options,
        });
        existed
    }

    pub(crate) fn unbind(&mut self, queue: &Arc<Queue>, filter: &str) -> bool {
        let id = queue.id;
        queue.state.lock().bindings.retain(|b| b.filter != filter);
        self.trie.remove_where(filter, |b| b.queue.id == id) > 0
    }

    fn remove_queue(&mut self, queue: &Arc<Queue>) {
        let filters: Vec<String> = queue
            .state
            .lock()
            .bindings
            .iter()
            .map(|b| b.filter.clone())
            .collect();
        for f in filters {
            self.unbind(queue, &f);
        }
        self.bindings_max_by_queue.remove(&queue.id);
        self.queues.remove(&queue.name);
        self.names.remove(&queue.name);
    }

    /// Queues whose idle lifetime has run out.
    pub(crate) fn idle_expired(&self, now: Instant) -> Vec<String> {
        self.queues
            .values()
            .filter_map(|q| {
                let QueueLifetime::IdleFor(limit) = q.lifetime() else {
                    return None;
                };
                let st = q.state.lock();
                let idle_for = st.idle_since.idle_for(now)?;
                (st.consumers.is_empty() && idle_for >= limit).then(|| q.name.to_string())
            })
            .collect()
    }
}

/// What the bindings of one queue say about a message on `topic`.
pub(crate) fn match_info(bindings: &[QueueBinding], topic: &str) -> MatchInfo {
    let mut info = MatchInfo::default();
    for b in bindings.iter().filter(|b| {
        rosetta_neutral::address::topic_matches(&b.filter, topic) && !b.options.excludes(topic)
    }) {
        add_match(&mut info, &b.options);
    }
    info
}

thread_local! {
    /// A spare target list per thread (see `batch::recycle`).
    static TARGETS: Cell<Vec<Target>> = const { Cell::new(Vec::new()) };
}

/// One queue a message is routed to: what its bindings matched, and the
/// dedup key to admit once the queue takes the message.
struct Target {
    queue: Arc<Queue>,
    matched: MatchInfo,
    key: Option<DedupKey>,
}

impl Target {
    fn new(queue: Arc<Queue>, matched: MatchInfo) -> Self {
        Target {
            queue,
            matched,
            key: None,
        }
    }
}

/// Folds the bindings a message matched (one target each, in no order)
/// into one target per queue, with what all of that queue's matches say.
/// Sorting by queue id keeps this O(m log m) in the m matches: one topic
/// with 10,000 subscribers costs 10,000 entries' work, not 10,000²
/// comparisons (`benches/routing.rs`). In place: the one match of the
/// usual publish costs no allocation beyond the list itself.
fn per_queue(targets: &mut Vec<Target>) {
    if targets.len() < 2 {
        return;
    }
    targets.sort_unstable_by_key(|t| t.queue.id);
    targets.dedup_by(|later, kept| {
        if later.queue.id != kept.queue.id {
            return false;
        }
        merge_match(&mut kept.matched, std::mem::take(&mut later.matched));
        true
    });
}

/// Adds what another binding of the same queue matched to `into`.
fn merge_match(into: &mut MatchInfo, other: MatchInfo) {
    into.max_guarantee = match (into.max_guarantee, other.max_guarantee) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    for id in other.subscription_ids {
        if let Err(pos) = into.subscription_ids.binary_search(&id) {
            into.subscription_ids.insert(pos, id);
        }
    }
    into.retain_as_published |= other.retain_as_published;
}

fn add_match(info: &mut MatchInfo, options: &BindingOptions) {
    info.max_guarantee = Some(
        info.max_guarantee
            .map_or(options.max_guarantee, |g| g.max(options.max_guarantee)),
    );
    if let Some(id) = options.subscription_id {
        // Kept sorted and unique: the trie visits bindings in no useful order.
        if let Err(pos) = info.subscription_ids.binary_search(&id) {
            info.subscription_ids.insert(pos, id);
        }
    }
    info.retain_as_published |= options.retain_as_published;
}

/// Whether a route checks dedup windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Duplicates {
    /// A producer's send: queues with a dedup window drop duplicates.
    Detect,
    /// The broker's own copy of a message already admitted once.
    Ignore,
}

impl Inner {
    /// Routes `message` to the queues of `address` inside `batch`. Returns
    /// how many queues it went to. `origin` is the publisher's client id
    /// (for no-local bindings). For a producer's send
    /// ([`Duplicates::Detect`]), a queue with a dedup window drops a
    /// duplicate, which still counts as routed to it (it holds the first
    /// copy), so the producer hears success; the broker's own copies (dead
    /// letters, expired messages, wills) are never taken for duplicates.
    pub(crate) fn route(
        &self,
        address: &Address,
        message: Message,
        origin: Option<&str>,
        batch: &mut Batch,
        duplicates: Duplicates,
    ) -> Result<usize, BrokerError> {
        self.route_owned(
            address.clone(),
            Arc::new(message),
            origin,
            batch,
            duplicates,
        )
    }

    /// [`Inner::route`] with the address handed over: it becomes the
    /// message's own (`Message::address`) without a copy.
    pub(crate) fn route_owned(
        &self,
        address: Address,
        mut message: Arc<Message>,
        origin: Option<&str>,
        batch: &mut Batch,
        duplicates: Duplicates,
    ) -> Result<usize, BrokerError> {
        let now_ms = batch.now_ms(self);
        if let Some(at) = message.delivery_time {
            let latest = now_ms.saturating_add(DELIVERY_DELAY_MAX_MS);
            if at > latest {
                return Err(BrokerError::ResourceLimit(format!(
                    "delivery time more than {} days ahead",
                    DELIVERY_DELAY_MAX_MS / 86_400_000
                )));
            }
        }
        let mut targets: Vec<Target> = match &address {
            Address::Topic(topic) => {
                validate_topic_name(topic)
                    .map_err(|e| BrokerError::InvalidAddress(e.to_string()))?;
                let routing = self.routing.read();
                let mut targets = TARGETS.take();
                routing.trie.for_each_match(topic, |b| {
                    if b.options.no_local && origin.is_some() && b.owner.as_deref() == origin {
                        return;
                    }
                    if b.options.excludes(topic) {
                        return;
                    }
                    let mut matched = MatchInfo::default();
                    add_match(&mut matched, &b.options);
                    targets.push(Target::new(Arc::clone(&b.queue), matched));
                });
                drop(routing);
                per_queue(&mut targets);
                targets
            }
            Address::Queue(name) => {
                let queue = self.queue_for_send(name, batch)?;
                let mut targets = TARGETS.take();
                targets.push(Target::new(queue, MatchInfo::default()));
                targets
            }
        };
        // The topic's own window first: a duplicate reaches no subscriber,
        // present or joining later, and counts as routed where its first
        // copy would go.
        if let (Address::Topic(topic), Duplicates::Detect) = (&address, duplicates) {
            if let TopicScreen::Duplicate { wait } =
                self.topic_dedup.screen(topic, &message, now_ms, batch)?
            {
                batch.waits.extend(wait);
                return Ok(targets.len());
            }
        }
        // Duplicates first: a queue that holds the first copy takes a
        // retry even when full.
        let mut dropped = 0usize;
        if duplicates == Duplicates::Detect {
            let mut failed = None;
            targets.retain_mut(|t| {
                if failed.is_some() {
                    return true;
                }
                match dedup::screen(&t.queue, &message, now_ms) {
                    Ok(Screen::Pass) => true,
                    Ok(Screen::Candidate(key)) => {
                        t.key = Some(key);
                        true
                    }
                    Ok(Screen::Duplicate { wait }) => {
                        dropped += 1;
                        batch.waits.extend(wait);
                        false
                    }
                    Err(e) => {
                        failed = Some(e);
                        true
                    }
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
        }
        if let (Address::Queue(name), Some(t)) = (&address, targets.first()) {
            if t.queue.is_full(self.config.queue_depth_max) {
                return Err(BrokerError::ResourceLimit(format!(
                    "queue '{name}' holds its maximum of {} messages",
                    self.config.queue_depth_max
                )));
            }
        }
        // A full subscriber queue misses this message; the others get it.
        targets.retain(|t| {
            let full = t.queue.is_full(self.config.queue_depth_max);
            if full {
                t.queue.count_dropped_full();
            }
            !full
        });
        // Admitted only now that the queue takes the message, so a refused
        // send leaves no key behind; a concurrent send may have won.
        let journaled = |q: &Queue| q.durable && message.durable;
        targets.retain(|t| {
            let Some(key) = t.key else { return true };
            let admitted = dedup::admit(&t.queue, key, journaled(&t.queue), now_ms, batch);
            if !admitted {
                dropped += 1;
            }
            admitted
        });
        // Unshared unless an adapter kept a clone (then this copies it).
        Arc::make_mut(&mut message).address = Some(address);
        // A scheduled message is routed now and waits in each subscriber
        // queue; it does not become the topic's retained message, which a
        // new subscriber would get before its time.
        let scheduled = message.is_scheduled(now_ms);
        if let (Some(Address::Topic(topic)), true, false) =
            (&message.address, message.retain, scheduled)
        {
            self.update_retained(topic, &message, batch);
        }
        let seq = self.next_seq();
        let durable_queues: Vec<u64> = targets
            .iter()
            .filter(|t| t.queue.durable && message.durable)
            .map(|t| t.queue.id)
            .collect();
        if !durable_queues.is_empty() {
            batch.records.push(Record::Message {
                seq,
                queues: durable_queues,
                body: codec::opaque(&message),
            });
        }
        let routed = targets.len() + dropped;
        let enqueues = batch.enqueues_for(targets.len());
        for Target { queue, matched, .. } in targets.drain(..) {
            let journaled = queue.durable && message.durable;
            let mut entry = Entry::new(seq, Arc::clone(&message), journaled, now_ms);
            entry.matched = matched;
            enqueues.push((queue, entry));
        }
        recycle(&TARGETS, targets);
        Ok(routed)
    }

    fn update_retained(&self, topic: &str, message: &Arc<Message>, batch: &mut Batch) {
        let mut retained = self.retained.lock();
        if message.body.bytes.is_empty() {
            if retained.remove(topic).is_some() {
                batch.records.push(Record::Retain {
                    topic: topic.to_owned(),
                    message: None,
                });
            }
        } else {
            let seq = self.next_seq();
            retained.insert(topic.to_owned(), (seq, Arc::clone(message)));
            batch.records.push(Record::Retain {
                topic: topic.to_owned(),
                message: Some((seq, codec::opaque(message))),
            });
        }
    }

    /// The queue a send to `name` goes to, created on first use when
    /// auto-creation is on (never for internal `$` names).
    fn queue_for_send(&self, name: &str, batch: &mut Batch) -> Result<Arc<Queue>, BrokerError> {
        if let Some(q) = self.routing.read().queue(name) {
            return Ok(Arc::clone(q));
        }
        if !self.config.auto_create_queues || name.starts_with('$') {
            return Err(BrokerError::NotFound(format!("queue '{name}'")));
        }
        let spec = QueueSpec {
            name: Some(name.to_owned()),
            durable: true,
            lifetime: QueueLifetime::Permanent,
            bindings_max: None,
        };
        let (q, _) = self.declare(spec, None, batch)?;
        Ok(q)
    }

    /// Declares a queue (or finds it). Journal records go into `batch`.
    pub(crate) fn declare(
        &self,
        spec: QueueSpec,
        session: Option<u64>,
        batch: &mut Batch,
    ) -> Result<(Arc<Queue>, bool), BrokerError> {
        let name = match spec.name {
            // Queue names are opaque to routing: internal ones such as
            // `$share/g/a/#` legitimately contain wildcard characters.
            Some(name)
                if name.is_empty() || name.len() > ADDRESS_LEN_MAX || name.contains('\0') =>
            {
                return Err(BrokerError::InvalidAddress(format!(
                    "bad queue name '{}'",
                    name.escape_debug()
                )));
            }
            Some(name) => name,
            None => format!("{TEMP_QUEUE_NAME_PREFIX}{:016x}", rand::random::<u64>()),
        };
        let mut routing = self.routing.write();
        if let Some(q) = routing.queue(&name).cloned() {
            if q.lifetime() == QueueLifetime::Session
                && q.owner_session().is_some()
                && q.owner_session() != session
            {
                return Err(BrokerError::InUse(format!(
                    "temporary queue '{name}' belongs to another connection"
                )));
            }
            // Re-declaring a lasting queue may change how long it lasts (MQTT 5
            // session expiry is set again on every CONNECT and DISCONNECT).
            let lasting = |l: QueueLifetime| {
                matches!(l, QueueLifetime::Permanent | QueueLifetime::IdleFor(_))
            };
            if lasting(q.lifetime()) && lasting(spec.lifetime) && q.lifetime() != spec.lifetime {
                q.set_lifetime(spec.lifetime);
                if q.durable {
                    batch
                        .records
                        .push(codec::queue_declare_record(q.id, &name, spec.lifetime));
                }
            }
            routing.set_bindings_max(&q, spec.bindings_max);
            return Ok((q, true));
        }
        let exempt = name == self.config.dead_letter_address
            || self.config.queue_rules.is_dead_letter_address(&name)
            || self.config.expiry_address.as_deref() == Some(name.as_str());
        if routing.queues.len() >= self.config.queues_max && !exempt {
            return Err(limit_exceeded(
                "queues in the broker",
                self.config.queues_max,
            ));
        }
        // Queues that die with a session or consumer are never worth a journal record.
        let durable = spec.durable
            && matches!(
                spec.lifetime,
                QueueLifetime::Permanent | QueueLifetime::IdleFor(_)
            );
        let id = self
            .next_queue_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let owner = (spec.lifetime == QueueLifetime::Session)
            .then_some(session)
            .flatten();
        let q = Queue::new(
            id,
            &name,
            durable,
            spec.lifetime,
            owner,
            self.config.queue_rules.resolve_shared(&name),
            self.queue_links(),
        );
        if durable {
            batch
                .records
                .push(codec::queue_declare_record(id, &name, spec.lifetime));
        }
        routing.insert_queue(Arc::clone(&q));
        routing.set_bindings_max(&q, spec.bindings_max);
        tracing::debug!(queue = %name, durable, "queue declared");
        Ok((q, false))
    }

    /// Info about a declared queue.
    pub(crate) fn queue_info(q: &Queue, existed: bool) -> QueueInfo {
        QueueInfo {
            name: q.name.to_string(),
            existed,
            depth: q.state.lock().backlog.len() as u64,
        }
    }

    /// Deletes a queue: unbinds it, closes its consumers, drops its
    /// messages.
    pub(crate) fn delete_queue(&self, name: &str) -> Result<(), BrokerError> {
        let q = {
            let mut routing = self.routing.write();
            let q = routing
                .queue(name)
                .cloned()
                .ok_or_else(|| BrokerError::NotFound(format!("queue '{name}'")))?;
            routing.remove_queue(&q);
            q
        };
        let mut st = q.state.lock();
        st.deleted = true;
        for c in st.consumers.drain(..) {
            c.sink.send(SessionEvent::ConsumerClosed {
                consumer: c.key.consumer,
                reason: BrokerError::NotFound(format!("queue '{name}' was deleted")),
            });
        }
        for entry in st.backlog.take_all(q.memory()) {
            q.release(&entry);
        }
        super::queue::end_group_delays(&mut st);
        for entry in st.schedule.take_all(q.memory()).0 {
            q.release(&entry);
        }
        for (_, entry) in std::mem::take(&mut st.inflight).into_values() {
            q.release(&entry);
        }
        drop(st);
        if q.durable {
            let mut records = vec![Record::QueueDelete { queue: q.id }];
            dedup::forget_all(&q, &mut records);
            self.journal.append(records, None);
        }
        tracing::debug!(queue = %name, "queue deleted");
        Ok(())
    }

    /// Binds `filter` to `queue`, enqueueing retained messages as asked.
    pub(crate) fn bind(
        &self,
        queue: &str,
        filter: &str,
        options: BindingOptions,
        owner: Option<Arc<str>>,
        batch: &mut Batch,
    ) -> Result<BindInfo, BrokerError> {
        validate_topic_filter(filter).map_err(|e| BrokerError::InvalidAddress(e.to_string()))?;
        let (q, existed) = {
            let mut routing = self.routing.write();
            let q = routing
                .queue(queue)
                .cloned()
                .ok_or_else(|| BrokerError::NotFound(format!("queue '{queue}'")))?;
            routing.check_bind(&q, filter, self.config.bindings_max)?;
            let existed = routing.bind(&q, filter, options.clone(), owner.clone());
            (q, existed)
        };
        if q.durable {
            batch
                .records
                .push(codec::bind_record(q.id, filter, &options, owner.as_deref()));
        }
        let send_retained = match options.retained {
            RetainedOnBind::Send => true,
            RetainedOnBind::SendIfNew => !existed,
            RetainedOnBind::None => false,
        };
        let mut retained_sent = 0;
        if send_retained {
            let matching: Vec<Arc<Message>> = {
                let retained = self.retained.lock();
                let mut v: Vec<_> = retained
                    .iter()
                    .filter(|(topic, _)| {
                        rosetta_neutral::address::topic_matches(filter, topic)
                            && !options.excludes(topic)
                    })
                    .map(|(_, (seq, m))| (*seq, Arc::clone(m)))
                    .collect();
                v.sort_by_key(|(seq, _)| *seq);
                v.into_iter().map(|(_, m)| m).collect()
            };
            for message in matching {
                // Each copy gets its own sequence: the journal keys a message
                // record by sequence, and the retained original has its own.
                let seq = self.next_seq();
                let journaled = q.durable && message.durable;
                if journaled {
                    batch.records.push(Record::Message {
                        seq,
                        queues: vec![q.id],
                        body: codec::opaque(&message),
                    });
                }
                let mut entry = Entry::new(seq, message, journaled, batch.now_ms(self));
                entry.from_retained = true;
                let mut info = MatchInfo::default();
                add_match(&mut info, &options);
                entry.matched = info;
                batch.enqueues.push((Arc::clone(&q), entry));
                retained_sent += 1;
            }
        }
        Ok(BindInfo {
            existed,
            retained_sent,
        })
    }

    pub(crate) fn unbind(&self, queue: &str, filter: &str) -> Result<bool, BrokerError> {
        let (q, existed) = {
            let mut routing = self.routing.write();
            let q = routing
                .queue(queue)
                .cloned()
                .ok_or_else(|| BrokerError::NotFound(format!("queue '{queue}'")))?;
            let existed = routing.unbind(&q, filter);
            (q, existed)
        };
        if existed && q.durable {
            self.journal.append(
                vec![Record::Unbind {
                    queue: q.id,
                    filter: filter.to_owned(),
                }],
                None,
            );
        }
        Ok(existed)
    }

    /// Publishes a will now.
    pub(crate) fn publish_will(&self, will: rosetta_neutral::Will) {
        let mut batch = Batch::default();
        let mut message = will.message;
        if let Some(interval) = will.expiry_interval {
            let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
            message.expiry = Some(self.now_ms().saturating_add(interval_ms));
        }
        match self.route(&will.address, message, None, &mut batch, Duplicates::Ignore) {
            Ok(_) => batch.commit(self, None),
            Err(e) => tracing::warn!(error = %e, "cannot publish will"),
        }
    }
}
