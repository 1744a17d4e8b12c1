//! The pool of targets a balancer chooses from: this node and the others
//! it knows of, each with its addresses, health and connection count.

use std::collections::{BTreeMap, BTreeSet};

/// One broker a connection may be steered to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its node name, unique in the cluster.
    pub name: String,
    /// Client-facing addresses by listener key (`mqtt`, `amqps`, ...), as
    /// `host:port`.
    pub addresses: BTreeMap<String, String>,
    /// At least one of its addresses passed the last health check (this
    /// node is always ready to itself).
    pub ready: bool,
    /// The listener keys whose address failed the last health check: a
    /// node whose MQTT port is wedged still takes AMQP clients, and is no
    /// candidate for MQTT ones.
    pub down: BTreeSet<String>,
    /// Connections it last said it holds (for `least_connections`).
    pub connections: u64,
}

impl Target {
    /// A target not yet health-checked.
    pub fn new(name: impl Into<String>, addresses: BTreeMap<String, String>) -> Self {
        Self {
            name: name.into(),
            addresses,
            ready: false,
            down: BTreeSet::new(),
            connections: 0,
        }
    }

    /// Whether it is ready when the listeners `down` do not answer: some
    /// address of its answers.
    pub fn ready_unless(&self, down: &BTreeSet<String>) -> bool {
        self.addresses.keys().any(|l| !down.contains(l))
    }

    /// Whether a client of the listener `listener` may be sent here: it
    /// has that listener and its address answered the last check.
    fn serves(&self, listener: &str) -> bool {
        self.ready && self.addresses.contains_key(listener) && !self.down.contains(listener)
    }
}

/// This node and the remote targets, by name.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub(crate) local: Target,
    /// Remote targets by name (sorted: every node sees the same order).
    pub(crate) remote: BTreeMap<String, Target>,
}

impl Pool {
    pub(crate) fn new(local: Target) -> Self {
        Self {
            local,
            remote: BTreeMap::new(),
        }
    }

    /// Replaces the remote targets with `seen` (from membership), keeping
    /// the health of those already known: a health check decides it.
    pub(crate) fn set_remote(&mut self, seen: Vec<Target>) {
        let mut next = BTreeMap::new();
        for mut t in seen {
            if t.name == self.local.name {
                continue;
            }
            if let Some(old) = self.remote.get_mut(&t.name) {
                // Same addresses: the last check still speaks for it.
                if old.addresses == t.addresses {
                    t.ready = old.ready;
                    t.down = std::mem::take(&mut old.down);
                }
            }
            next.insert(t.name.clone(), t);
        }
        self.remote = next;
    }

    /// The result of a health check of a remote target: the listener keys
    /// whose address did not answer. Ready when any address did. Unknown
    /// names are ignored (it left while being checked).
    pub(crate) fn set_down(&mut self, name: &str, down: BTreeSet<String>) {
        if let Some(t) = self.remote.get_mut(name) {
            t.ready = t.ready_unless(&down);
            t.down = down;
        }
    }

    /// Names of the targets a client of `listener` may be sent to, this
    /// node included when `with_local`, in name order.
    pub(crate) fn candidates(&self, listener: &str, with_local: bool) -> Vec<String> {
        let mut names: Vec<String> = self
            .remote
            .values()
            .filter(|t| t.serves(listener))
            .map(|t| t.name.clone())
            .collect();
        if with_local {
            names.push(self.local.name.clone());
            names.sort();
        }
        names
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Target> {
        if name == self.local.name {
            return Some(&self.local);
        }
        self.remote.get(name)
    }
}
