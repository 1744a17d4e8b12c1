//! Who gets a queue's next message.
//!
//! ## Rules, in the order they apply
//! - **Exclusive**: when the queue is exclusive (`QueueSettings::exclusive`)
//!   or any attached consumer is, one consumer receives: the first
//!   exclusive consumer in attach order (the first consumer at all for an
//!   exclusive queue without exclusive consumers). The others stand by;
//!   when the active one goes, its unsettled messages return to their
//!   places at the front and the next in attach order takes over (Artemis
//!   exclusive queues and consumers). Message groups do not apply while a
//!   queue is exclusive: one consumer gets every group anyway.
//! - **Message groups** (`groups`): a message of an assigned group goes to
//!   that group's consumer, through the consumer's own reserved list.
//! - **Consumer priority**: of the consumers that may take a message now
//!   (credit, room in their connection, selector), those of the highest
//!   priority get it, round-robin among them; lower ones only get what
//!   none of the higher ones can take.
//! - **Selectors**: a consumer with a selector is offered only what it
//!   matches; what no consumer matches waits for one that does.
//! - **Browsers** see every waiting message once, in arrival order,
//!   without taking it: their deliveries are copies (no in-flight entry, no
//!   delivery count, no ack record), and they never hold up or reorder the
//!   other consumers. Past the last waiting message a browser is told
//!   [`SessionEvent::BrowseEnded`] once and gets nothing more.
//!
//! Where rules meet:
//! - A browser walks in arrival (sequence) order, not priority order: that
//!   is the order in which "each message once" holds while new messages
//!   of any priority keep arriving.
//! - A group's reserved messages go to the group's consumer whatever its
//!   selector says; and a selecting consumer that takes a group's message
//!   from its matches first becomes the group's consumer, though earlier
//!   messages of the group it does not match may still wait. Order within
//!   a group holds when the group's messages all match its consumer (or it
//!   has no selector).
//! - Exclusive queues and consumers, and who was active, are not persisted:
//!   after a restart the first (exclusive) consumer to attach is active.
//!
//! ## What is indexed, and what is bounded
//! A consumer's selector is evaluated once per message: when the message
//! arrives in memory (enqueued, put back after a delivery, read back from
//! a page file) or, for messages already waiting, once when the consumer
//! attaches. The consumer keeps the places of its matches in its own
//! ordered set (`ConsumerSlot::matches`), and a message leaving the queue
//! is removed from each selecting consumer's set (O(log n) each). The
//! backlog takes a message from its middle in O(log n) (`backlog::levels`).
//! So a pass costs O(log n) per message delivered and O(1) per consumer
//! looked at, never a scan of the backlog: the head of the queue goes to a
//! consumer that may take it (plain consumers take anything), and a
//! selecting consumer takes its first match wherever it is. Consumers with
//! no selector, all of one priority, on a queue without groups, browsers or
//! exclusivity, take the round-robin path the broker always had: no
//! allocation, no scan, no per-message work per consumer.
//!
//! Paged messages are evaluated when they are read back. A selecting
//! consumer with credit and no match in memory reads the next page batch
//! back while the broker is under its memory budget. Past the budget it
//! waits until the messages in memory move on: a queue whose memory is full
//! of messages no consumer with credit matches does not reach the matches
//! on disk behind them (Artemis states the same limit for filtered
//! consumers of a paging address). Browsers see paged messages the same
//! way: read back within the budget; past it, their browse ends at the
//! last message in memory.

use std::num::NonZeroU32;
use std::sync::Arc;

use rosetta_neutral::{CreditMode, Delivery, DeliveryTag, SessionEvent};

use crate::backlog::Place;
use crate::queue::{ConsumerKey, ConsumerSlot, DispatchOutput, Entry, Queue, QueueState};
use crate::queue_settings::QueueSettings;

/// The round-robin position among consumers.
#[derive(Debug, Default)]
pub(crate) struct DispatchPolicy {
    next: usize,
}

/// Which consumers may receive (browsers never count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Receivers {
    All,
    /// Exclusive: only this one.
    One(usize),
    /// Exclusive, and no consumer that may receive.
    Nobody,
}

impl Receivers {
    fn includes(self, i: usize, slot: &ConsumerSlot) -> bool {
        slot.browse.is_none()
            && match self {
                Receivers::All => true,
                Receivers::One(j) => i == j,
                Receivers::Nobody => false,
            }
    }
}

impl DispatchPolicy {
    /// Index into `consumers` of the consumer for `entry` (at `place`), or
    /// `None` when no consumer can take it now. `new_group`: the entry
    /// starts a group, which goes to the consumer with the fewest groups.
    fn pick(
        &mut self,
        consumers: &[ConsumerSlot],
        receivers: Receivers,
        entry: &Entry,
        place: Place,
        full_scan: bool,
    ) -> Option<usize> {
        let n = consumers.len();
        let start = self.next % n.max(1);
        // An excluded message (AMQP undeliverable-here) goes elsewhere when
        // it can; when only excluded consumers can take it, it goes to them
        // rather than block the head of the queue forever.
        let mut best: Option<(usize, (bool, i32, i64))> = None;
        for i in (0..n).map(|k| (start + k) % n) {
            let c = &consumers[i];
            if !receivers.includes(i, c) {
                continue;
            }
            if c.selector
                .as_ref()
                .is_some_and(|s| !s.matches.contains(&place))
            {
                continue;
            }
            if let Some((_, (true, priority, _))) = best {
                if c.priority < priority {
                    continue;
                }
            }
            if !c.can_take() {
                continue;
            }
            let not_excluded = entry.excluded != Some(c.key);
            let fewer_groups = if full_scan { -i64::from(c.groups) } else { 0 };
            let score = (not_excluded, c.priority, fewer_groups);
            if best.is_none_or(|(_, b)| score > b) {
                best = Some((i, score));
                if not_excluded && !full_scan {
                    break;
                }
            }
        }
        let (i, _) = best?;
        self.next = i + 1;
        Some(i)
    }
}

impl QueueState {
    /// Attaches a consumer, indexing what waits for its selector.
    pub(crate) fn attach(&mut self, slot: ConsumerSlot) {
        self.index_arrivals();
        let mut slot = slot;
        if slot.browse.is_some() {
            self.browsers += 1;
        } else {
            if slot.exclusive {
                self.exclusive_consumers += 1;
                // One consumer gets everything now: groups are moot.
                self.drop_groups();
            }
            if let Some(selecting) = &mut slot.selector {
                self.selecting += 1;
                self.backlog.set_noting(true);
                let mut evaluated = 0u64;
                for entry in self.backlog.iter_memory() {
                    evaluated += 1;
                    if selecting.selector.matches(&entry.message) {
                        selecting.matches.insert(Place::of(entry));
                    }
                }
                self.stats.get_mut().selector_evaluations_total += evaluated;
            }
        }
        // Exactly sized for the first: most queues (a session's) have one
        // consumer, and a vector's first growth is to four (480 bytes).
        if self.consumers.capacity() == 0 {
            self.consumers.reserve_exact(1);
        }
        self.consumers.push(slot);
        self.note_priorities();
    }

    /// Detaches a consumer: its groups are forgotten and what was reserved
    /// for them returns to the queue. Its in-flight messages are the
    /// caller's to return.
    pub(crate) fn detach(&mut self, key: ConsumerKey) -> Option<ConsumerSlot> {
        let i = self.consumers.iter().position(|c| c.key == key)?;
        let slot = self.consumers.remove(i);
        if slot.browse.is_some() {
            self.browsers -= 1;
        } else {
            if slot.exclusive {
                self.exclusive_consumers -= 1;
            }
            if slot.selector.is_some() {
                self.selecting -= 1;
                self.backlog.set_noting(self.selecting > 0);
            }
        }
        if slot.groups > 0 {
            self.groups.forget_owner(key);
        }
        self.backlog.unreserve(key);
        self.note_priorities();
        Some(slot)
    }

    /// Takes the in-flight delivery `tag` of consumer `key` out (settled,
    /// or returned), ending its lease, with one lookup; also says whether
    /// its delivery journaled a lease deadline (which a return must clear).
    /// `Err(None)`: no such delivery; `Err(Some(owner))`: it is another
    /// consumer's, and stays in flight.
    pub(crate) fn take_inflight_of(
        &mut self,
        tag: u64,
        key: ConsumerKey,
    ) -> Result<(bool, Entry), Option<ConsumerKey>> {
        let Some((owner, entry)) = self.inflight.remove(&tag) else {
            return Err(None);
        };
        if owner != key {
            self.inflight.insert(tag, (owner, entry));
            return Err(Some(owner));
        }
        let lease_journaled = entry.journaled && entry.lease_until.is_some();
        Ok((lease_journaled, self.end_inflight(tag, key, entry)))
    }

    /// Takes an in-flight delivery out (settled, or returned), ending its
    /// lease.
    pub(crate) fn take_inflight(&mut self, tag: u64) -> Option<(ConsumerKey, Entry)> {
        let (key, entry) = self.inflight.remove(&tag)?;
        Some((key, self.end_inflight(tag, key, entry)))
    }

    /// What leaving the in-flight map ends: the lease, the group's hold.
    fn end_inflight(&mut self, tag: u64, key: ConsumerKey, mut entry: Entry) -> Entry {
        if let Some(deadline) = entry.lease_until.take() {
            self.leases.end(deadline, tag);
            if let Some(group) = &entry.message.group_id {
                self.unlease_group(group);
            }
        }
        if let Some(group) = &entry.message.group_id {
            self.groups.unhold(group, key);
        }
        entry
    }

    pub(crate) fn unlease_group(&mut self, group: &str) {
        if let Some(n) = self.leased_groups.get_mut(group) {
            *n -= 1;
            if *n == 0 {
                self.leased_groups.remove(group);
            }
        }
    }

    /// Whether `entry` must wait: its group has a leased delivery in flight.
    pub(crate) fn waits_for_its_group(&self, entry: &Entry) -> bool {
        !self.leased_groups.is_empty()
            && entry
                .message
                .group_id
                .as_deref()
                .is_some_and(|g| self.leased_groups.contains_key(g))
    }

    fn note_priorities(&mut self) {
        let mut receivers = self.consumers.iter().filter(|c| c.browse.is_none());
        let first = receivers.next().map(|c| c.priority);
        self.priorities_differ = receivers.any(|c| Some(c.priority) != first);
    }

    /// Forgets every group assignment; reserved messages return.
    fn drop_groups(&mut self) {
        if self.groups.is_empty() {
            return;
        }
        self.groups.clear();
        for c in &mut self.consumers {
            c.groups = 0;
            self.backlog.unreserve(c.key);
        }
    }

    /// Evaluates the selecting consumers' selectors on the messages that
    /// arrived in memory since the last call.
    fn index_arrivals(&mut self) {
        if self.selecting == 0 {
            return;
        }
        let arrived = self.backlog.take_arrived();
        let mut evaluated = 0u64;
        for &place in &arrived {
            let Some(entry) = self.backlog.get(place) else {
                continue;
            };
            for c in &mut self.consumers {
                if c.browse.is_some() {
                    continue;
                }
                let Some(selecting) = c.selector.as_deref_mut() else {
                    continue;
                };
                evaluated += 1;
                if selecting.selector.matches(&entry.message) {
                    selecting.matches.insert(place);
                }
            }
        }
        self.stats.get_mut().selector_evaluations_total += evaluated;
        self.backlog.return_arrived(arrived);
    }

    /// A message left `place`: no selecting consumer may take it there.
    pub(crate) fn forget_place(&mut self, place: Place) {
        if self.selecting == 0 {
            return;
        }
        for selecting in self
            .consumers
            .iter_mut()
            .filter_map(|c| c.selector.as_deref_mut())
        {
            selecting.matches.remove(&place);
        }
    }

    fn receivers(&self, settings: &QueueSettings) -> Receivers {
        if self.exclusive_consumers == 0 && !settings.exclusive {
            return Receivers::All;
        }
        let pos = if self.exclusive_consumers > 0 {
            self.consumers
                .iter()
                .position(|c| c.exclusive && c.browse.is_none())
        } else {
            self.consumers.iter().position(|c| c.browse.is_none())
        };
        pos.map_or(Receivers::Nobody, Receivers::One)
    }
}

/// What one dispatch pass knows and produces.
struct Pass<'a> {
    receivers: Receivers,
    now_ms: u64,
    out: &'a mut DispatchOutput,
}

/// Where the entry being handed out came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum From {
    /// The shared part of the backlog.
    Shared,
    /// The consumer's own reserved list (its group's message; already
    /// counted as held by the group).
    Reserved,
}

impl Queue {
    /// Hands ready messages to consumers that can take them, in order, and
    /// lets browsers see what they have not seen.
    pub(crate) fn dispatch_locked(&self, st: &mut QueueState, now_ms: u64) -> DispatchOutput {
        let mut out = DispatchOutput::default();
        st.index_arrivals();
        let receivers = st.receivers(&self.settings);
        let mut pass = Pass {
            receivers,
            now_ms,
            out: &mut out,
        };
        loop {
            let mut progress = self.dispatch_reserved(st, &mut pass);
            progress |= self.dispatch_heads(st, &mut pass);
            if st.selecting > 0 {
                progress |= self.dispatch_matches(st, &mut pass);
            }
            // Only consumers' own lists can make more go after a pass.
            if !progress || (st.selecting == 0 && st.backlog.reserved_len() == 0) {
                break;
            }
        }
        if st.browsers > 0 {
            self.dispatch_browsers(st, now_ms);
        }
        self.finish_drains(st, receivers);
        out
    }

    /// The head of the queue, over and over, to whoever may take it.
    fn dispatch_heads(&self, st: &mut QueueState, pass: &mut Pass<'_>) -> bool {
        let Pass {
            receivers,
            now_ms,
            ref mut out,
        } = *pass;
        let mut progress = false;
        let groups_apply = receivers == Receivers::All;
        while !st.consumers.is_empty() {
            if st.backlog.front(self.memory(), self.id).is_none() {
                break;
            }
            // What was just read back from disk is indexed before the pick.
            st.index_arrivals();
            let QueueState {
                backlog,
                consumers,
                policy,
                groups,
                priorities_differ,
                ..
            } = &mut *st;
            let Some(head) = backlog.front(self.memory(), self.id) else {
                break;
            };
            let place = Place::of(head);
            let expired = head.message.is_expired(now_ms);
            let group = head.message.group_id.as_deref().filter(|_| groups_apply);
            let owner = group.and_then(|g| groups.owner(g));
            let new_group = group.is_some() && owner.is_none();
            let pick = if expired || owner.is_some() {
                None
            } else {
                policy.pick(
                    consumers,
                    receivers,
                    head,
                    place,
                    new_group || *priorities_differ,
                )
            };
            if !expired && owner.is_none() && pick.is_none() {
                break;
            }
            let Some(entry) = backlog.pop_front(self.memory(), self.id) else {
                break;
            };
            st.forget_place(place);
            progress = true;
            if expired {
                self.expire(st, entry, out);
            } else if let Some(owner) = owner {
                reserve_for(st, owner, entry);
            } else if let Some(i) = pick {
                self.deliver(st, i, entry, From::Shared, now_ms, out);
            }
        }
        progress
    }

    /// Each receiver's reserved messages (its groups'), while it can take
    /// them.
    fn dispatch_reserved(&self, st: &mut QueueState, pass: &mut Pass<'_>) -> bool {
        let Pass {
            receivers,
            now_ms,
            ref mut out,
        } = *pass;
        if st.backlog.reserved_len() == 0 {
            return false;
        }
        let mut progress = false;
        for i in 0..st.consumers.len() {
            let key = st.consumers[i].key;
            if !receivers.includes(i, &st.consumers[i]) {
                continue;
            }
            while st.backlog.first_reserved(key).is_some() && st.consumers[i].can_take() {
                let entry = if st.leased_groups.is_empty() {
                    st.backlog.pop_reserved(key)
                } else {
                    let QueueState {
                        backlog,
                        leased_groups,
                        ..
                    } = &mut *st;
                    backlog.pop_reserved_where(key, |e| {
                        e.message
                            .group_id
                            .as_deref()
                            .is_none_or(|g| !leased_groups.contains_key(g))
                    })
                };
                let Some(entry) = entry else {
                    break;
                };
                progress = true;
                if entry.message.is_expired(now_ms) {
                    if let Some(group) = &entry.message.group_id {
                        st.groups.unhold(group, key);
                    }
                    self.expire(st, entry, out);
                } else {
                    self.deliver(st, i, entry, From::Reserved, now_ms, out);
                }
            }
        }
        progress
    }

    /// Selecting consumers take their first matches, wherever they are,
    /// higher priorities first.
    fn dispatch_matches(&self, st: &mut QueueState, pass: &mut Pass<'_>) -> bool {
        let Pass {
            receivers,
            now_ms,
            ref mut out,
        } = *pass;
        let mut order: Vec<usize> = (0..st.consumers.len())
            .filter(|&i| {
                let c = &st.consumers[i];
                c.selector.is_some() && receivers.includes(i, c)
            })
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(st.consumers[i].priority));
        let groups_apply = receivers == Receivers::All;
        let mut progress = false;
        for i in order {
            loop {
                let first_match = st.consumers[i]
                    .selector
                    .as_ref()
                    .and_then(|s| s.matches.first().copied());
                let Some(place) = first_match else {
                    // Its matches may be on disk behind what it cannot take.
                    if st.consumers[i].credit > 0
                        && st.backlog.page_in_within_budget(self.memory(), self.id)
                    {
                        st.index_arrivals();
                        progress = true;
                        continue;
                    }
                    break;
                };
                if !st.consumers[i].can_take() {
                    break;
                }
                let Some(entry) = st.backlog.remove(place) else {
                    if let Some(selecting) = st.consumers[i].selector.as_deref_mut() {
                        selecting.matches.remove(&place);
                    }
                    continue;
                };
                st.forget_place(place);
                progress = true;
                if entry.message.is_expired(now_ms) {
                    self.expire(st, entry, out);
                    continue;
                }
                let key = st.consumers[i].key;
                let owner = entry
                    .message
                    .group_id
                    .as_deref()
                    .filter(|_| groups_apply)
                    .and_then(|g| st.groups.owner(g));
                match owner {
                    Some(owner) if owner != key => reserve_for(st, owner, entry),
                    // Its group's previous message is leased: it waits.
                    Some(owner) if st.waits_for_its_group(&entry) => reserve_for(st, owner, entry),
                    _ => self.deliver(st, i, entry, From::Shared, now_ms, out),
                }
            }
        }
        progress
    }

    /// Browsers see what they have not seen, in arrival order.
    fn dispatch_browsers(&self, st: &mut QueueState, now_ms: u64) {
        for i in 0..st.consumers.len() {
            loop {
                let c = &st.consumers[i];
                let Some(cursor) = c.browse.as_deref().copied().filter(|b| !b.ended) else {
                    break;
                };
                if !c.can_take() {
                    break;
                }
                let Some(entry) = st.backlog.first_from(cursor.next_seq) else {
                    if st.backlog.has_paged()
                        && st.backlog.page_in_within_budget(self.memory(), self.id)
                    {
                        st.index_arrivals();
                        continue;
                    }
                    let c = &mut st.consumers[i];
                    if let Some(browse) = c.browse.as_deref_mut() {
                        browse.ended = true;
                    }
                    c.sink.send(SessionEvent::BrowseEnded {
                        consumer: c.key.consumer,
                    });
                    break;
                };
                let seq = entry.seq;
                let wanted = !entry.message.is_expired(now_ms)
                    && c.selector.as_deref().is_none_or(|s| {
                        st.stats.get_mut().selector_evaluations_total += 1;
                        s.selector.matches(&entry.message)
                    });
                let delivery = wanted.then(|| {
                    // A copy is never settled; its tag is unique all the same.
                    st.next_tag = st.next_tag.wrapping_add(1);
                    delivery_of(&st.consumers[i], entry, st.next_tag)
                });
                let c = &mut st.consumers[i];
                if let Some(browse) = c.browse.as_deref_mut() {
                    browse.next_seq = seq + 1;
                }
                if let Some(delivery) = delivery {
                    c.sent = c.sent.wrapping_add(1);
                    // A copy needs no settlement: a window refills at once.
                    if let CreditMode::Explicit(_) = c.mode {
                        c.credit -= 1;
                    }
                    c.sink.send(SessionEvent::Delivery(delivery));
                }
            }
        }
    }

    /// Hands `entry` to consumer `i`.
    fn deliver(
        &self,
        st: &mut QueueState,
        i: usize,
        mut entry: Entry,
        from: From,
        now_ms: u64,
        out: &mut DispatchOutput,
    ) {
        let key = st.consumers[i].key;
        if from == From::Shared {
            if let Some(group) = entry.message.group_id.as_deref() {
                self.note_group_delivery(st, i, group);
            }
        }
        if let Some(group) = entry.message.group_id.as_deref() {
            if crate::groups::closes_group(&entry.message) {
                if let Some(owner) = st.groups.close(group) {
                    if let Some(c) = st.consumers.iter_mut().find(|c| c.key == owner) {
                        c.groups = c.groups.saturating_sub(1);
                    }
                }
            }
        }
        st.next_tag = st.next_tag.wrapping_add(1);
        let tag = st.next_tag;
        let slot = &mut st.consumers[i];
        let delivery = delivery_of(slot, &entry, tag);
        let lease_ms = slot.visibility_timeout_ms.map(NonZeroU32::get);
        slot.credit -= 1;
        slot.sent = slot.sent.wrapping_add(1);
        let auto_settle = slot.auto_settle;
        slot.sink.send(SessionEvent::Delivery(delivery));
        st.stats.get_mut().deliveries_total += 1;
        self.traffic().delivered();
        if entry.redelivered {
            st.stats.get_mut().redeliveries_total += 1;
        }
        if auto_settle {
            if let CreditMode::Window(_) = st.consumers[i].mode {
                st.consumers[i].credit += 1;
            }
            if let Some(group) = &entry.message.group_id {
                if from == From::Reserved || st.groups.owner(group) == Some(key) {
                    // Held while reserved, or just now by the delivery.
                    st.groups.unhold(group, key);
                }
            }
            st.stats.get_mut().acked_total += 1;
            self.traffic().acknowledged();
            st.stats.get_mut().time_in_queue_ms_total +=
                now_ms.saturating_sub(entry.enqueued_at_ms);
            out.records.extend(self.ack_record(&entry));
            self.release(&entry);
        } else {
            entry.redelivered = true;
            if let Some(lease_ms) = lease_ms {
                let deadline = now_ms.saturating_add(u64::from(lease_ms));
                entry.lease_until = Some(deadline);
                if let Some(group) = &entry.message.group_id {
                    *st.leased_groups.entry(group.clone()).or_default() += 1;
                }
                st.leases.start(deadline, tag);
                self.arm_if_earlier(st, deadline);
                // The deadline goes to the journal with the delivery state,
                // so a restart does not offer the message again before its
                // lease would have run out.
                out.records
                    .extend(self.delivery_state_record(&entry, Some(deadline)));
            }
            st.inflight.insert(tag, (key, entry));
        }
    }

    /// A message of `group` from the shared backlog goes to consumer `i`:
    /// the group is assigned to it if it was not, and holds one more
    /// message in flight. (Reached only for groups not owned by someone
    /// else: those are reserved for their owner instead.)
    fn note_group_delivery(&self, st: &mut QueueState, i: usize, group: &str) {
        if st.exclusive_consumers > 0 || self.settings.exclusive {
            return;
        }
        let key = st.consumers[i].key;
        if st.groups.owner(group).is_none() {
            let (assigned, forgotten) = st.groups.assign(group, key, self.settings.groups_max);
            if let Some(old) = forgotten {
                if let Some(c) = st.consumers.iter_mut().find(|c| c.key == old) {
                    c.groups = c.groups.saturating_sub(1);
                }
            }
            if !assigned {
                tracing::debug!(queue = %self.name, group, "message groups at their limit, all busy: this group is not remembered");
                return;
            }
            st.consumers[i].groups += 1;
        }
        st.groups.hold(group);
    }

    /// Drops an expired entry (to the expiry address, after the lock).
    pub(crate) fn expire(&self, st: &mut QueueState, entry: Entry, out: &mut DispatchOutput) {
        st.stats.get_mut().expired_total += 1;
        out.records.extend(self.ack_record(&entry));
        self.release(&entry);
        out.expired.push(entry);
    }

    /// Consumers in drain mode with nothing left to send them lose their
    /// credit and are told so.
    fn finish_drains(&self, st: &mut QueueState, receivers: Receivers) {
        let nothing_shared = st.backlog.shared_is_empty();
        for (i, slot) in st.consumers.iter_mut().enumerate() {
            if !slot.drain {
                continue;
            }
            let nothing_for_it = match slot.browse.as_deref() {
                Some(b) => b.ended,
                None if !receivers.includes(i, slot) => true,
                None if slot.selector.is_some() => {
                    slot.selector.as_ref().is_some_and(|s| s.matches.is_empty())
                        && !st.backlog.has_reserved(slot.key)
                }
                None => nothing_shared && !st.backlog.has_reserved(slot.key),
            };
            if nothing_for_it || slot.credit == 0 {
                slot.credit = 0;
                slot.drain = false;
                slot.sink.send(SessionEvent::Drained {
                    consumer: slot.key.consumer,
                });
            }
        }
    }
}

/// Keeps `entry` for its group's consumer.
pub(crate) fn reserve_for(st: &mut QueueState, owner: ConsumerKey, entry: Entry) {
    if let Some(group) = &entry.message.group_id {
        st.groups.hold(group);
    }
    st.backlog.reserve(owner, entry);
}

/// The delivery of `entry` to `slot`, charged to its connection's budget.
fn delivery_of(slot: &ConsumerSlot, entry: &Entry, tag: u64) -> Delivery {
    let charge =
        rosetta_neutral::DeliveryCharge::on(&slot.sink, entry.message.memory_size() as u64);
    Delivery {
        consumer: slot.key.consumer,
        tag: DeliveryTag(tag),
        message: Arc::clone(&entry.message),
        delivery_count: entry.delivery_count,
        redelivered: entry.redelivered,
        from_retained: entry.from_retained,
        matched: entry.matched.clone(),
        annotation: entry.annotation.clone(),
        charge,
        stream: None,
    }
}
