//! The pool of targets a balancer chooses from: this node and the others
//! it knows of, each with its addresses, readiness and connection count.

use std::collections::BTreeMap;

/// One broker a connection may be steered to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its node name, unique in the cluster.
    pub name: String,
    /// Client-facing addresses by listener key (`mqtt`, `amqps`, ...), as
    /// `host:port`.
    pub addresses: BTreeMap<String, String>,
    /// Passed its last health check (this node is always ready to itself).
    pub ready: bool,
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
            connections: 0,
        }
    }
}

/// This node and the remote targets, by name.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub(crate) local: Target,
    /// Remote targets by name (sorted: every node sees the same order).
    pub(crate) remote: BTreeMap<String, Target>,
    /// Bumped on every change of who is ready, so the ring is rebuilt once.
    pub(crate) generation: u64,
}

impl Pool {
    pub(crate) fn new(local: Target) -> Self {
        Self {
            local,
            remote: BTreeMap::new(),
            generation: 0,
        }
    }

    /// Replaces the remote targets with `seen` (from membership), keeping
    /// the readiness of those already known: a health check decides it.
    pub(crate) fn set_remote(&mut self, seen: Vec<Target>) {
        let mut next = BTreeMap::new();
        for mut t in seen {
            if t.name == self.local.name {
                continue;
            }
            if let Some(old) = self.remote.get(&t.name) {
                // Same addresses: the last check still speaks for it.
                t.ready = old.ready && old.addresses == t.addresses;
            }
            next.insert(t.name.clone(), t);
        }
        let ready_before = self.ready_names(true);
        self.remote = next;
        if self.ready_names(true) != ready_before {
            self.generation += 1;
        }
    }

    /// Marks a remote target ready or not; unknown names are ignored (it
    /// left while being checked).
    pub(crate) fn set_ready(&mut self, name: &str, ready: bool) {
        if let Some(t) = self.remote.get_mut(name) {
            if t.ready != ready {
                t.ready = ready;
                self.generation += 1;
            }
        }
    }

    /// Names of the ready targets, this node included when `with_local`,
    /// in name order.
    pub(crate) fn ready_names(&self, with_local: bool) -> Vec<String> {
        let mut names: Vec<String> = self
            .remote
            .values()
            .filter(|t| t.ready)
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
