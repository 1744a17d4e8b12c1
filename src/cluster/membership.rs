//! This node in etcd: registered under a lease it keeps alive, its
//! record (addresses and connection count) republished on every tick, and
//! the balancer's pool kept equal to the records under the prefix.
//!
//! ```text
//! <key_prefix>nodes/<node_name> = {"node": ..., "addresses": {"mqtt": "host:port", ...}, "connections": N}
//! ```
//!
//! One task runs a *session*: grant a lease of `lease_ttl_s`, put the
//! record, read the prefix, watch it; every `lease_ttl_s / 3` keep the
//! lease alive, republish, re-read. Any failure ends the session: the
//! remote targets are dropped (we can no longer tell who is there; this
//! node keeps serving its own clients), the failure is logged (once, then
//! at most every [`OUTAGE_LOG_INTERVAL_S`]), and a new session starts
//! after [`RETRY_MS`]: a node rejoins as soon as etcd is back. A lease
//! that expired meanwhile (etcd saw us as dead) is simply replaced.
//! [`Membership::leave`] revokes the lease, so the others see this node
//! go at once rather than after the TTL.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};

use crate::balancer::Target;
use crate::balancers::Balancers;
use crate::etcd::{Client, EtcdError, KeyValue};
use crate::health;
use crate::shared_cache;

/// Pause between a failed session and the next attempt: short, so a node
/// rejoins quickly, long enough not to hammer an etcd that is down.
pub const RETRY_MS: u64 = 1000;
/// While etcd stays unreachable, the failure is logged at most this often.
pub const OUTAGE_LOG_INTERVAL_S: u64 = 30;
/// Most nodes read from the prefix: a cluster of Rosetta nodes is a
/// handful to a few dozen; a prefix flooded by someone else must not
/// become an unbounded pool.
pub const MEMBERS_MAX: usize = 1024;

/// What membership needs to know.
#[derive(Debug, Clone)]
pub struct MembershipSettings {
    /// etcd endpoints, `http://host:port`.
    pub endpoints: Vec<String>,
    /// This node's name.
    pub node_name: String,
    /// The lease's TTL; a node that dies leaves after this long.
    pub lease_ttl_s: u64,
    /// Where the records live.
    pub key_prefix: String,
    /// This node's client-facing addresses by listener key.
    pub addresses: BTreeMap<String, String>,
    /// How long one etcd call may take.
    pub request_timeout_ms: u64,
    /// How often remote targets are checked.
    pub health_check_interval_ms: u64,
    /// How long a check's connect may take.
    pub health_check_timeout_ms: u64,
}

/// A node's record in etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node name.
    pub node: String,
    /// Client-facing addresses by listener key.
    pub addresses: BTreeMap<String, String>,
    /// Connections it holds.
    pub connections: u64,
}

/// The running membership: registration and health checks.
pub struct Membership {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Counts this node's connections, for its record.
pub type ConnectionCount = Arc<dyn Fn() -> u64 + Send + Sync>;

impl Membership {
    /// Starts registering this node and feeding `balancer`. Fails only on
    /// settings that can never work (a bad endpoint); an unreachable etcd
    /// is retried.
    pub fn spawn(
        settings: MembershipSettings,
        balancer: impl Into<Balancers>,
        connections: ConnectionCount,
    ) -> Result<Self, EtcdError> {
        let balancer = balancer.into();
        let client = Client::new(
            &settings.endpoints,
            Duration::from_millis(settings.request_timeout_ms),
        )?;
        let (stop, stop_rx) = watch::channel(false);
        let recheck = Arc::new(Notify::new());
        let registration = tokio::spawn(register_loop(
            client.clone(),
            settings.clone(),
            balancer.clone(),
            connections,
            Arc::clone(&recheck),
            stop_rx.clone(),
        ));
        let mut tasks = vec![registration];
        if balancer.iter().any(|b| b.caches_in_etcd()) {
            tasks.push(tokio::spawn(shared_cache::sync_loop(
                client,
                settings.key_prefix.clone(),
                balancer.clone(),
                stop_rx.clone(),
            )));
        }
        tasks.push(tokio::spawn(health::check_loop(
            balancer,
            Duration::from_millis(settings.health_check_interval_ms),
            Duration::from_millis(settings.health_check_timeout_ms),
            recheck,
            stop_rx,
        )));
        Ok(Self { stop, tasks })
    }

    /// A pool of the fixed `targets` (`[[cluster.targets]]`) instead of
    /// etcd: no registration, only the health checks. An entry named as
    /// this node is skipped by the pool, so that one list serves every
    /// node. Nothing publishes connection counts: every target counts 0.
    pub fn spawn_static(
        targets: Vec<Target>,
        balancer: impl Into<Balancers>,
        health_check_interval: Duration,
        health_check_timeout: Duration,
    ) -> Self {
        let balancer = balancer.into();
        balancer.set_remote_targets(targets);
        let (stop, stop_rx) = watch::channel(false);
        let checks = tokio::spawn(health::check_loop(
            balancer,
            health_check_interval,
            health_check_timeout,
            Arc::new(Notify::new()),
            stop_rx,
        ));
        Self {
            stop,
            tasks: vec![checks],
        }
    }

    /// Stops without leaving, as a node that dies would: the lease is not
    /// revoked and expires after its TTL (crash tests).
    #[doc(hidden)]
    pub fn abandon(self) {
        for t in &self.tasks {
            t.abort();
        }
    }

    /// Leaves the cluster: revokes the lease (when etcd is reachable) and
    /// stops the tasks (with a static pool: only the health checks).
    pub async fn leave(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

async fn register_loop(
    client: Client,
    settings: MembershipSettings,
    balancer: Balancers,
    connections: ConnectionCount,
    recheck: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let mut outage_since: Option<Instant> = None;
    let mut last_logged: Option<Instant> = None;
    loop {
        let mut joined = false;
        let result = session(
            &client,
            &settings,
            &balancer,
            &connections,
            &recheck,
            &mut stop,
            &mut joined,
        )
        .await;
        if joined {
            outage_since = None;
        }
        match result {
            Ok(()) => return,
            Err(e) => {
                balancer.drop_remote_targets();
                let now = Instant::now();
                let since = *outage_since.get_or_insert(now);
                let due = last_logged.is_none_or(|at| {
                    joined || now.duration_since(at) >= Duration::from_secs(OUTAGE_LOG_INTERVAL_S)
                });
                if due {
                    last_logged = Some(now);
                    tracing::warn!(
                        node = %settings.node_name,
                        error = %e,
                        outage_s = now.duration_since(since).as_secs(),
                        "cluster: etcd unreachable; serving local clients only, redirecting nowhere, retrying"
                    );
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(RETRY_MS)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One registration, until it fails or the node leaves.
async fn session(
    client: &Client,
    settings: &MembershipSettings,
    balancer: &Balancers,
    connections: &ConnectionCount,
    recheck: &Notify,
    stop: &mut watch::Receiver<bool>,
    joined: &mut bool,
) -> Result<(), EtcdError> {
    let key = format!("{}nodes/{}", settings.key_prefix, settings.node_name);
    let prefix = format!("{}nodes/", settings.key_prefix);
    let lease = client.grant(settings.lease_ttl_s).await?;
    publish(client, settings, &key, lease, connections, balancer).await?;
    let mut revision = refresh(client, &prefix, balancer, recheck).await?;
    *joined = true;
    tracing::info!(node = %settings.node_name, lease, "cluster: registered in etcd");
    let mut watch = client.watch_prefix(prefix.as_bytes(), revision + 1).await?;
    let tick_ms = (settings.lease_ttl_s * 1000 / 3).max(100);
    let mut tick = tokio::time::interval(Duration::from_millis(tick_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.changed() => {
                match client.revoke(lease).await {
                    Ok(()) => tracing::info!(node = %settings.node_name, "cluster: left (lease revoked)"),
                    Err(e) => tracing::warn!(error = %e, "cluster: could not revoke the lease; it expires by itself"),
                }
                return Ok(());
            }
            _ = tick.tick() => {
                if client.keep_alive(lease).await? <= 0 {
                    return Err(EtcdError::Malformed("the lease expired".into()));
                }
                publish(client, settings, &key, lease, connections, balancer).await?;
                revision = refresh(client, &prefix, balancer, recheck).await?;
            }
            changed = watch.changed() => {
                if !changed? {
                    watch = client.watch_prefix(prefix.as_bytes(), revision + 1).await?;
                }
                revision = refresh(client, &prefix, balancer, recheck).await?;
            }
        }
    }
}

async fn publish(
    client: &Client,
    settings: &MembershipSettings,
    key: &str,
    lease: i64,
    connections: &ConnectionCount,
    balancer: &Balancers,
) -> Result<(), EtcdError> {
    let count = connections();
    balancer.set_local_connections(count);
    let record = NodeRecord {
        node: settings.node_name.clone(),
        addresses: settings.addresses.clone(),
        connections: count,
    };
    let value = serde_json::to_vec(&record).map_err(|e| EtcdError::Malformed(e.to_string()))?;
    client.put(key.as_bytes(), &value, lease).await
}

/// Reads every record and hands the pool to the balancer; the revision.
async fn refresh(
    client: &Client,
    prefix: &str,
    balancer: &Balancers,
    recheck: &Notify,
) -> Result<i64, EtcdError> {
    let (revision, kvs) = client.range_prefix(prefix.as_bytes()).await?;
    let before: Vec<String> = balancer
        .remote_targets()
        .into_iter()
        .map(|t| t.name)
        .collect();
    let targets = targets_of(&kvs);
    let new_names = targets.iter().any(|t| !before.contains(&t.name));
    balancer.set_remote_targets(targets);
    if new_names {
        // A node that just joined gets checked now, not on the next round.
        recheck.notify_one();
    }
    Ok(revision)
}

/// The targets described by the records; malformed ones are skipped.
pub fn targets_of(kvs: &[KeyValue]) -> Vec<Target> {
    kvs.iter()
        .take(MEMBERS_MAX)
        .filter_map(|kv| match serde_json::from_slice::<NodeRecord>(&kv.value) {
            Ok(r) => {
                let mut t = Target::new(r.node, r.addresses);
                t.connections = r.connections;
                Some(t)
            }
            Err(e) => {
                tracing::debug!(key = %String::from_utf8_lossy(&kv.key), error = %e, "cluster: skipping a malformed record");
                None
            }
        })
        .collect()
}
