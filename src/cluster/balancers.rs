//! Every balancer of a node (`[cluster.balancer]` and each
//! `[[cluster.balancers]]` entry) over one view of the cluster:
//! membership and the health checks feed them all alike, so they differ
//! only in how they choose, never in whom they choose from.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::balancer::{Balancer, Target};

/// A node's balancers; the first is the default one.
#[derive(Debug, Clone)]
pub struct Balancers(Arc<[Arc<Balancer>]>);

impl Balancers {
    /// The balancers `all` (at least one: the default).
    pub fn new(all: Vec<Arc<Balancer>>) -> Self {
        assert!(!all.is_empty(), "a node has a default balancer");
        Self(all.into())
    }

    /// Each balancer.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Balancer>> {
        self.0.iter()
    }

    /// The balancer named `name`.
    pub fn by_name(&self, name: &str) -> Option<&Arc<Balancer>> {
        self.0.iter().find(|b| b.name() == name)
    }

    /// See [`Balancer::set_remote_targets`].
    pub fn set_remote_targets(&self, seen: Vec<Target>) {
        for b in self.0.iter() {
            b.set_remote_targets(seen.clone());
        }
    }

    /// See [`Balancer::drop_remote_targets`].
    pub fn drop_remote_targets(&self) {
        for b in self.0.iter() {
            b.drop_remote_targets();
        }
    }

    /// See [`Balancer::set_down`].
    pub fn set_down(&self, name: &str, down: &BTreeSet<String>) {
        for b in self.0.iter() {
            b.set_down(name, down.clone());
        }
    }

    /// See [`Balancer::set_local_connections`].
    pub fn set_local_connections(&self, connections: u64) {
        for b in self.0.iter() {
            b.set_local_connections(connections);
        }
    }

    /// The remote targets known now (the same in every balancer).
    pub fn remote_targets(&self) -> Vec<Target> {
        self.0[0].remote_targets()
    }
}

impl From<Arc<Balancer>> for Balancers {
    fn from(one: Arc<Balancer>) -> Self {
        Self::new(vec![one])
    }
}
