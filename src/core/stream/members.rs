//! The members of the consumer groups of partitioned streams, and the
//! rebalance when one joins or leaves.
//!
//! The readers of one partitioned stream that name one group are its
//! members: each partition is read by exactly one of them at a time,
//! spread by [`assign`] (balanced within one, sticky). When a member joins
//! or leaves (cancel, disconnect, a killed client's connection closing),
//! the partitions are assigned again; a partition that moves is first
//! taken from its old owner (which sends nothing more of it, and whose
//! later settlements of it no longer commit), then given to its new owner
//! at the group's committed offset for that partition. So nothing
//! acknowledged is sent again as new, and whatever the old owner had
//! sent but not acknowledged is sent again to the new one
//! (at-least-once).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::assign::{assign, MemberId};
use super::groups::Groups;
use super::partition::Partitioned;
use super::reader::Reader;

/// One group of one partitioned stream.
#[derive(Default)]
struct Membership {
    /// Live members in the order they joined.
    members: Vec<(MemberId, Weak<Reader>)>,
    /// The member reading each partition.
    owners: Vec<Option<MemberId>>,
}

/// Every partitioned stream's groups' members.
#[derive(Default)]
pub(crate) struct Members {
    /// By (stream, group).
    groups: Mutex<HashMap<(String, String), Membership>>,
    next_member: Mutex<MemberId>,
}

impl Members {
    /// Adds `reader` to its group of `stream` and rebalances.
    pub(crate) fn join(
        &self,
        stream: &Partitioned,
        group: &str,
        reader: &Arc<Reader>,
        groups: &Groups,
    ) {
        let id = {
            let mut n = self.next_member.lock();
            *n += 1;
            *n
        };
        let mut all = self.groups.lock();
        let m = all
            .entry((stream.name.to_string(), group.to_owned()))
            .or_default();
        m.members.push((id, Arc::downgrade(reader)));
        Self::rebalance(m, stream, group, groups);
    }

    /// Takes `reader` out of its group of `stream` and rebalances.
    pub(crate) fn leave(
        &self,
        stream: &Partitioned,
        group: &str,
        reader: &Arc<Reader>,
        groups: &Groups,
    ) {
        let key = (stream.name.to_string(), group.to_owned());
        let mut all = self.groups.lock();
        let Some(m) = all.get_mut(&key) else {
            return;
        };
        m.members
            .retain(|(_, r)| !std::ptr::eq(r.as_ptr(), Arc::as_ptr(reader)));
        Self::rebalance(m, stream, group, groups);
        if m.members.is_empty() {
            all.remove(&key);
        }
    }

    fn rebalance(m: &mut Membership, stream: &Partitioned, group: &str, groups: &Groups) {
        m.members
            .retain(|(_, r)| r.upgrade().is_some_and(|r| !r.is_closed()));
        m.owners.resize(stream.parts.len(), None);
        let ids: Vec<MemberId> = m.members.iter().map(|(id, _)| *id).collect();
        let owners = assign(&m.owners, &ids);
        let reader_of = |id: Option<MemberId>| {
            id.and_then(|id| m.members.iter().find(|(x, _)| *x == id))
                .and_then(|(_, r)| r.upgrade())
        };
        // Take every moving partition away before giving any out, so its
        // committed offset is final when the new owner starts from it.
        for (p, (old, new)) in m.owners.iter().zip(&owners).enumerate() {
            if old != new {
                if let Some(r) = reader_of(*old) {
                    r.assign(p, None);
                }
            }
        }
        let mut moved = Vec::new();
        for (p, (old, new)) in m.owners.iter().zip(&owners).enumerate() {
            if old == new {
                continue;
            }
            if let Some(r) = reader_of(*new) {
                let at = groups
                    .committed(&stream.parts[p].name, group)
                    .unwrap_or_else(|| stream.parts[p].log.bounds().next);
                r.assign(p, Some(at));
                moved.push((p, r));
            }
        }
        for (p, r) in &moved {
            tracing::info!(stream = %stream.name, group, partition = p,
                consumer = r.consumer.0, "stream partition assigned");
        }
        m.owners = owners;
        // Serve the new owners outside no lock of theirs: pumps take only
        // their own reader's locks.
        for (_, r) in moved {
            r.pump(groups);
        }
    }
}
