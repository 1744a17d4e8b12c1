//! Message groups: which consumer each group of a queue is assigned to.
//!
//! Messages with the same `group_id` go to one consumer, in order (Artemis
//! message grouping, JMSXGroupID). A group is assigned when its first
//! message is handed out: to the consumer, among those that may take it
//! now, with the fewest groups (ties in round-robin order), so groups
//! spread evenly and a new consumer takes new groups. While a group is
//! assigned, its messages that reach the head of the queue are moved to
//! its consumer's own list (`Backlog::reserve`): a consumer without credit
//! holds up its own groups only, and each message is moved once, never
//! rescanned.
//!
//! When a group's consumer goes (cancel, session closed, connection
//! killed) the group is forgotten; its reserved and in-flight messages
//! return to the queue at their places, so the next consumer starts with
//! the group's first unacknowledged message and sees the rest in order.
//!
//! A queue remembers at most `QueueSettings::groups_max` groups. Past it,
//! the group that has been idle (nothing reserved or in flight) the longest
//! is forgotten; its next message is assigned afresh. When every
//! remembered group is busy, a new group is not remembered: its messages go
//! out like ungrouped ones until a place frees up.
//!
//! Assignments live in memory only: a broker restart forgets them all, and
//! groups are assigned afresh as their messages are delivered again.
//!
//! A message with `JMSXGroupSeq = -1` closes its group (Artemis): it goes
//! to the group's consumer like the others, and the group is forgotten
//! after it, so the group's next message is assigned afresh. The neutral
//! `Message::group_sequence` is unsigned (AMQP's `group-sequence` is a
//! `uint`) and cannot carry -1; the STOMP and MQTT adapters leave a value
//! that does not fit as an application property named `JMSXGroupSeq`, and
//! that property is what is read here (see [`closes_group`]).

use std::collections::{BTreeMap, HashMap};

use rosetta_neutral::Message;

use crate::queue::ConsumerKey;

/// Whether `message` closes its group: an application property
/// `JMSXGroupSeq` of -1, as a number or as text.
pub(crate) fn closes_group(message: &Message) -> bool {
    message
        .properties
        .get(rosetta_neutral::fields::GROUP_SEQUENCE)
        .is_some_and(|v| v.to_text().trim() == "-1")
}

/// One remembered group.
#[derive(Debug)]
struct Group {
    owner: ConsumerKey,
    /// Messages of the group reserved for or in flight to `owner`.
    held: u32,
    /// When the group went idle (`held` reached 0), its key in `idle`.
    idle_since: Option<u64>,
}

/// The groups of one queue: a pointer until its first group (most queues
/// have none; the empty index cost every queue 80 bytes, issue 20).
#[derive(Debug, Default)]
pub(crate) struct Groups(Option<Box<GroupIndex>>);

impl Groups {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|g| g.by_id.is_empty())
    }

    /// Groups with an assigned consumer now.
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |g| g.by_id.len())
    }

    pub(crate) fn owner(&self, group: &str) -> Option<ConsumerKey> {
        self.0.as_ref()?.by_id.get(group).map(|g| g.owner)
    }

    /// See [`GroupIndex::assign`].
    pub(crate) fn assign(
        &mut self,
        group: &str,
        owner: ConsumerKey,
        max: usize,
    ) -> (bool, Option<ConsumerKey>) {
        self.0.get_or_insert_default().assign(group, owner, max)
    }

    /// One more message of `group` is reserved for or in flight to its owner.
    pub(crate) fn hold(&mut self, group: &str) {
        if let Some(index) = &mut self.0 {
            index.hold(group);
        }
    }

    /// A message of `group` held by `owner` is settled (or returned).
    pub(crate) fn unhold(&mut self, group: &str, owner: ConsumerKey) {
        if let Some(index) = &mut self.0 {
            index.unhold(group, owner);
        }
    }

    /// Forgets `group` (closed); returns who had it.
    pub(crate) fn close(&mut self, group: &str) -> Option<ConsumerKey> {
        self.0.as_mut()?.close(group)
    }

    /// Forgets every group of `owner` (it went); returns how many.
    pub(crate) fn forget_owner(&mut self, owner: ConsumerKey) -> usize {
        self.0.as_mut().map_or(0, |index| index.forget_owner(owner))
    }

    /// Forgets every group.
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }
}

/// The groups of a queue that has some.
#[derive(Debug, Default)]
struct GroupIndex {
    by_id: HashMap<String, Group>,
    /// Idle groups by when they went idle, the oldest first.
    idle: BTreeMap<u64, String>,
    clock: u64,
}

impl GroupIndex {
    /// Assigns a new group to `owner`, making room past `max` by forgetting
    /// the longest-idle group. Returns whether it was remembered, and the
    /// owner of a group forgotten to make room.
    fn assign(
        &mut self,
        group: &str,
        owner: ConsumerKey,
        max: usize,
    ) -> (bool, Option<ConsumerKey>) {
        let mut forgotten = None;
        if self.by_id.len() >= max {
            let Some((_, oldest)) = self.idle.pop_first() else {
                return (false, None);
            };
            forgotten = self.by_id.remove(&oldest).map(|g| g.owner);
        }
        self.by_id.insert(
            group.to_owned(),
            Group {
                owner,
                held: 0,
                idle_since: None,
            },
        );
        self.went_idle(group);
        (true, forgotten)
    }

    fn went_idle(&mut self, group: &str) {
        self.clock += 1;
        if let Some(g) = self.by_id.get_mut(group) {
            g.idle_since = Some(self.clock);
            self.idle.insert(self.clock, group.to_owned());
        }
    }

    fn hold(&mut self, group: &str) {
        if let Some(g) = self.by_id.get_mut(group) {
            g.held += 1;
            if let Some(t) = g.idle_since.take() {
                self.idle.remove(&t);
            }
        }
    }

    fn unhold(&mut self, group: &str, owner: ConsumerKey) {
        let Some(g) = self.by_id.get_mut(group) else {
            return;
        };
        if g.owner != owner || g.held == 0 {
            return;
        }
        g.held -= 1;
        if g.held == 0 {
            self.went_idle(group);
        }
    }

    fn close(&mut self, group: &str) -> Option<ConsumerKey> {
        let g = self.by_id.remove(group)?;
        if let Some(t) = g.idle_since {
            self.idle.remove(&t);
        }
        Some(g.owner)
    }

    fn forget_owner(&mut self, owner: ConsumerKey) -> usize {
        let before = self.by_id.len();
        let idle = &mut self.idle;
        self.by_id.retain(|_, g| {
            let keep = g.owner != owner;
            if !keep {
                if let Some(t) = g.idle_since {
                    idle.remove(&t);
                }
            }
            keep
        });
        before - self.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use rosetta_neutral::ConsumerId;

    use super::*;

    fn key(n: u64) -> ConsumerKey {
        ConsumerKey {
            session: 1,
            consumer: ConsumerId(n),
        }
    }

    #[test]
    fn past_the_limit_the_longest_idle_group_is_forgotten_never_a_busy_one() {
        let mut g = Groups::default();
        assert_eq!(g.assign("a", key(1), 2), (true, None));
        assert_eq!(g.assign("b", key(2), 2), (true, None));
        g.hold("a");
        // "b" is the only idle group: it goes.
        assert_eq!(g.assign("c", key(1), 2), (true, Some(key(2))));
        assert_eq!(g.owner("b"), None);
        g.hold("c");
        // Both busy: a new group is not remembered.
        assert_eq!(g.assign("d", key(2), 2), (false, None));
        g.unhold("c", key(1));
        g.unhold("a", key(1));
        // "c" went idle first.
        assert_eq!(g.assign("e", key(2), 2), (true, Some(key(1))));
        assert_eq!(g.owner("c"), None);
        assert_eq!(g.owner("a"), Some(key(1)));
        assert_eq!(g.forget_owner(key(1)), 1);
        assert_eq!(g.len(), 1);
    }
}
