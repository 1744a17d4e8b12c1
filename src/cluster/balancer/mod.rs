//! The broker balancer, sans-IO: where does a connection belong?
//!
//! [`Balancer::decide`] takes what a connection says about itself
//! ([`ConnectionFacts`]), the listener it came in on and the time, and
//! answers with a [`Decision`]:
//!
//! 1. The target key is the fact named by `key` ([`KeySource`]), narrowed
//!    by `key_filter` (its first capture group, or the whole match). A
//!    connection without that fact, or whose key the filter does not
//!    match, has nothing to be steered by and stays here.
//! 2. A key matching `local_target_filter` stays here.
//! 3. The candidates are the targets whose address for the client's
//!    listener passed its last health check (this node among them when
//!    `local_target_enabled`). Fewer than `quorum_size`: the pool is not
//!    active and the answer is [`Decision::Unavailable`].
//! 4. A key chosen within `cache_timeout_ms` goes where it went, if that
//!    target is still a candidate; otherwise the [`Policy`] picks.
//! 5. The chosen target is this node ([`Decision::Local`]) or another,
//!    whose address for the same listener the client is sent to.
//!
//! The pool is fed from outside: [`Balancer::set_remote_targets`] by
//! membership (or a static list), [`Balancer::set_down`] by the health
//! checks and
//! [`Balancer::set_local_connections`] by the server.

mod cache;
mod key;
mod pool;
pub mod ring;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use regex::Regex;

pub use cache::CACHE_ENTRIES_MAX;
pub use key::{ConnectionFacts, KeySource};
pub use pool::Target;

use pool::Pool;
use ring::Ring;

/// How a target is picked among the candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `first_element`: the first ready target in name order.
    FirstElement,
    /// `round_robin`: each new key the next target in name order.
    RoundRobin,
    /// `consistent_hash`: a hash ring with virtual nodes; a key stays on
    /// its target while the target is ready, whatever else comes and goes.
    ConsistentHash,
    /// `least_connections`: the target holding the fewest connections, as
    /// the nodes publish them (ties to the lower name).
    LeastConnections,
}

impl Policy {
    /// From its configuration name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "first_element" => Self::FirstElement,
            "round_robin" => Self::RoundRobin,
            "consistent_hash" => Self::ConsistentHash,
            "least_connections" => Self::LeastConnections,
            _ => return None,
        })
    }
}

/// Where a connection belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Here.
    Local,
    /// On another node, at `address` (`host:port`).
    Redirect {
        /// The target's node name (for logs).
        node: String,
        /// Its client-facing address for the listener asked.
        address: String,
    },
    /// Nowhere now: too few targets serve the client's listener for the
    /// pool to be active (`quorum_size`).
    Unavailable,
}

/// What a balancer is configured with.
#[derive(Debug, Clone)]
pub struct BalancerSettings {
    /// Its name among this node's balancers (`default`, or the listeners
    /// it serves): the namespace of its entries in etcd.
    pub name: String,
    /// This node's name.
    pub local_name: String,
    /// This node's client-facing addresses by listener key.
    pub local_addresses: BTreeMap<String, String>,
    /// Which fact is the key.
    pub key: KeySource,
    /// Narrows the key (`key_filter`).
    pub key_filter: Option<String>,
    /// Keys matching it stay here (`local_target_filter`).
    pub local_target_filter: Option<String>,
    /// How a target is picked.
    pub policy: Policy,
    /// Fewest ready targets for the pool to be active.
    pub quorum_size: usize,
    /// This node is a target itself.
    pub local_target_enabled: bool,
    /// How long a key's target is remembered; 0: not at all.
    pub cache_timeout_ms: u64,
    /// Each new choice is also offered to etcd ([`Balancer::take_placed`]),
    /// and choices other nodes made are remembered ([`Balancer::remember`]).
    pub cache_in_etcd: bool,
    /// Points per target on the consistent-hash ring.
    pub virtual_nodes: u32,
}

/// A setting a balancer cannot run with; names the configuration key.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A filter that is not a valid regex.
    #[error("`{key}`: not a valid regular expression: {source}")]
    Regex {
        /// The configuration key.
        key: &'static str,
        /// What the regex parser said.
        #[source]
        source: regex::Error,
    },
    /// Virtual nodes out of range.
    #[error("`cluster.balancer.virtual_nodes`: {0} is not within 1-{max}", max = ring::VIRTUAL_NODES_MAX)]
    VirtualNodes(u32),
}

/// Most choices waiting to be written to etcd: past it new ones are not
/// shared (they stay in this node's cache); the writer drains them as
/// fast as etcd answers, so only a login storm against a slow etcd
/// reaches it.
pub const PLACED_WAITING_MAX: usize = 4096;
/// Longest key shared through etcd: a key is part of an etcd key, and a
/// client id may be 64 KiB; longer keys are cached on this node only.
pub const SHARED_KEY_LEN_MAX_BYTES: usize = 1024;

/// A choice made here, to be shared through etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The target key.
    pub key: String,
    /// The node chosen.
    pub target: String,
    /// It replaces an entry whose node is no longer a candidate (the
    /// entry in etcd is overwritten rather than adopted).
    pub replacing: bool,
}

/// A balancer: settings, pool, cache, shared by every connection.
#[derive(Debug)]
pub struct Balancer {
    name: String,
    cache_in_etcd: bool,
    cache_timeout: Duration,
    /// Signalled when [`State::placed`] gets an entry.
    placed_waiting: tokio::sync::Notify,
    key: KeySource,
    key_filter: Option<Regex>,
    local_target_filter: Option<Regex>,
    policy: Policy,
    quorum_size: usize,
    local_target_enabled: bool,
    virtual_nodes: u32,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    pool: Pool,
    cache: cache::Cache,
    round_robin_next: usize,
    /// The ring and the candidates it was built from: rebuilt when they
    /// change (a target comes, goes, or loses the client's listener).
    ring: Option<(Vec<String>, Ring)>,
    /// Choices not yet written to etcd (with `cache_in_etcd`).
    placed: std::collections::VecDeque<Placed>,
}

impl Balancer {
    /// A balancer with only this node in its pool.
    pub fn new(settings: BalancerSettings) -> Result<Self, SettingsError> {
        let compile = |key: &'static str, pattern: &Option<String>| {
            pattern
                .as_deref()
                .map(Regex::new)
                .transpose()
                .map_err(|source| SettingsError::Regex { key, source })
        };
        if settings.virtual_nodes == 0 || settings.virtual_nodes > ring::VIRTUAL_NODES_MAX {
            return Err(SettingsError::VirtualNodes(settings.virtual_nodes));
        }
        let mut local = Target::new(settings.local_name, settings.local_addresses);
        local.ready = true;
        Ok(Self {
            name: settings.name,
            cache_in_etcd: settings.cache_in_etcd && settings.cache_timeout_ms > 0,
            cache_timeout: Duration::from_millis(settings.cache_timeout_ms),
            placed_waiting: tokio::sync::Notify::new(),
            key: settings.key,
            key_filter: compile("cluster.balancer.key_filter", &settings.key_filter)?,
            local_target_filter: compile(
                "cluster.balancer.local_target_filter",
                &settings.local_target_filter,
            )?,
            policy: settings.policy,
            quorum_size: settings.quorum_size,
            local_target_enabled: settings.local_target_enabled,
            virtual_nodes: settings.virtual_nodes,
            state: Mutex::new(State {
                pool: Pool::new(local),
                cache: cache::Cache::new(Duration::from_millis(settings.cache_timeout_ms)),
                round_robin_next: 0,
                ring: None,
                placed: std::collections::VecDeque::new(),
            }),
        })
    }

    /// This node's name.
    pub fn local_name(&self) -> String {
        self.state.lock().pool.local.name.clone()
    }

    /// Replaces the remote targets with those membership sees now.
    pub fn set_remote_targets(&self, seen: Vec<Target>) {
        self.state.lock().pool.set_remote(seen);
    }

    /// Forgets every remote target (etcd unreachable: we can no longer
    /// tell who is there).
    pub fn drop_remote_targets(&self) {
        self.state.lock().pool.set_remote(Vec::new());
    }

    /// The result of a health check of a remote target: the listener
    /// keys whose address did not answer (empty: all did).
    pub fn set_down(&self, name: &str, down: BTreeSet<String>) {
        self.state.lock().pool.set_down(name, down);
    }

    /// The connections this node holds now.
    pub fn set_local_connections(&self, connections: u64) {
        self.state.lock().pool.local.connections = connections;
    }

    /// The remote targets known now (for the health checks).
    pub fn remote_targets(&self) -> Vec<Target> {
        self.state.lock().pool.remote.values().cloned().collect()
    }

    /// Where a connection with `facts`, on the listener `listener` (its
    /// key: `mqtt`, `amqps`, ...), belongs.
    pub fn decide(&self, facts: &ConnectionFacts, listener: &str, now: Instant) -> Decision {
        let Some(key) = self.key.key(facts, self.key_filter.as_ref()) else {
            return Decision::Local;
        };
        if self
            .local_target_filter
            .as_ref()
            .is_some_and(|f| f.is_match(&key))
        {
            return Decision::Local;
        }
        let mut state = self.state.lock();
        let candidates = state.pool.candidates(listener, self.local_target_enabled);
        if candidates.is_empty() || candidates.len() < self.quorum_size {
            return Decision::Unavailable;
        }
        let remembered = state.cache.get(&key, now).map(str::to_owned);
        let cached = remembered
            .as_ref()
            .filter(|t| candidates.iter().any(|c| c == *t))
            .cloned();
        let chosen = match cached {
            Some(t) => t,
            None => {
                state.cache.forget(&key);
                let t = self.pick(&mut state, &candidates, &key);
                state.cache.put(&key, &t, now);
                self.share(&mut state, &key, &t, remembered.is_some());
                t
            }
        };
        if chosen == state.pool.local.name {
            return Decision::Local;
        }
        match state
            .pool
            .get(&chosen)
            .and_then(|t| t.addresses.get(listener))
        {
            Some(address) => Decision::Redirect {
                node: chosen,
                address: address.clone(),
            },
            // Not reached: a candidate serves the listener, and the pool
            // does not change while it is locked.
            None => Decision::Unavailable,
        }
    }

    /// This balancer's name (its namespace in etcd).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether its choices are shared through etcd.
    pub fn caches_in_etcd(&self) -> bool {
        self.cache_in_etcd
    }

    /// How long a choice is remembered.
    pub fn cache_timeout(&self) -> Duration {
        self.cache_timeout
    }

    /// Remembers a choice another node made (or this one, read back):
    /// `key` goes to `target` until `until`, if that node is a candidate
    /// when asked.
    pub fn remember(&self, key: &str, target: &str, until: Instant) {
        self.state.lock().cache.put_until(key, target, until);
    }

    /// Forgets a choice (its entry in etcd expired or was deleted).
    pub fn forget(&self, key: &str) {
        self.state.lock().cache.forget(key);
    }

    /// The choices made since the last call, to write to etcd.
    pub fn take_placed(&self) -> Vec<Placed> {
        self.state.lock().placed.drain(..).collect()
    }

    /// Completes when a choice waits to be written.
    pub async fn placed_waiting(&self) {
        self.placed_waiting.notified().await;
    }

    /// Queues a new choice for etcd (with `cache_in_etcd`, within the
    /// limits of [`PLACED_WAITING_MAX`] and [`SHARED_KEY_LEN_MAX_BYTES`]).
    fn share(&self, state: &mut State, key: &str, target: &str, replacing: bool) {
        if !self.cache_in_etcd || key.len() > SHARED_KEY_LEN_MAX_BYTES {
            return;
        }
        if state.placed.len() >= PLACED_WAITING_MAX {
            tracing::debug!(balancer = %self.name, "cluster: too many choices waiting for etcd; this one stays local");
            return;
        }
        state.placed.push_back(Placed {
            key: key.to_owned(),
            target: target.to_owned(),
            replacing,
        });
        self.placed_waiting.notify_one();
    }

    /// The policy's pick among `candidates` (non-empty, in name order).
    fn pick(&self, state: &mut State, candidates: &[String], key: &str) -> String {
        match self.policy {
            Policy::FirstElement => candidates[0].clone(),
            Policy::RoundRobin => {
                let i = state.round_robin_next % candidates.len();
                state.round_robin_next = state.round_robin_next.wrapping_add(1);
                candidates[i].clone()
            }
            Policy::ConsistentHash => {
                let stale = state.ring.as_ref().is_none_or(|(c, _)| c != candidates);
                if stale {
                    let ring = Ring::new(candidates.iter().cloned(), self.virtual_nodes);
                    state.ring = Some((candidates.to_vec(), ring));
                }
                state
                    .ring
                    .as_ref()
                    .and_then(|(_, r)| r.owner(key))
                    .map_or_else(|| candidates[0].clone(), str::to_owned)
            }
            Policy::LeastConnections => candidates
                .iter()
                .min_by_key(|name| {
                    let connections = state.pool.get(name).map_or(u64::MAX, |t| t.connections);
                    (connections, (*name).clone())
                })
                .cloned()
                .unwrap_or_else(|| candidates[0].clone()),
        }
    }
}

#[cfg(test)]
mod tests;
