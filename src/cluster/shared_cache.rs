//! `cache_in_etcd`: the balancers' choices shared through etcd, so every
//! node answers the same for a key while its entry lives.
//!
//! ```text
//! <key_prefix>cache/<balancer name>/<target key> = <node name>    (under a lease of the cache timeout)
//! ```
//!
//! One task per node runs a *session*: read every entry under the prefix
//! into the balancers' caches, watch the prefix (a put is remembered for
//! the balancer's cache timeout, a delete, which is how an expired lease
//! shows, is forgotten), and write each choice the balancers make here:
//!
//! - a new key is put only if absent (one etcd transaction): of two nodes
//!   choosing at once exactly one wins, and the other adopts the winner's
//!   choice for the clients after (the one connection it placed already
//!   stays where it went);
//! - a key whose remembered node is no longer a candidate is overwritten.
//!
//! Entries put within [`LEASE_REUSE_MS`] of each other share a lease, so
//! a burst of new keys costs one grant, not one per key; an entry may
//! thus expire up to that much before its full timeout.
//!
//! A failed session (etcd unreachable) leaves the caches as they are,
//! each node answering from its own, and starts again after
//! [`crate::membership::RETRY_MS`]. Choices made meanwhile are not shared.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::balancer::{Balancer, Placed};
use crate::balancers::Balancers;
use crate::etcd::{Client, EtcdError, KeyValue, WatchEvent};
use crate::membership::RETRY_MS;

/// Longest a lease is reused for new entries: well under any cache
/// timeout allowed (at least 1 s), so entries live nearly their timeout.
pub const LEASE_REUSE_MS: u64 = 100;

/// Runs sessions until `stop`.
pub(crate) async fn sync_loop(
    client: Client,
    key_prefix: String,
    balancers: Balancers,
    mut stop: watch::Receiver<bool>,
) {
    let prefix = format!("{key_prefix}cache/");
    loop {
        match session(&client, &prefix, &balancers, &mut stop).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(error = %e, "cluster: shared cache out of etcd; answering from this node's cache");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(RETRY_MS)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// A lease shared by the entries put shortly after each other.
struct Leases {
    current: Option<(i64, Instant, u64)>,
}

impl Leases {
    /// A lease of `ttl_s` granted within [`LEASE_REUSE_MS`], or a new one.
    async fn lease(&mut self, client: &Client, ttl_s: u64) -> Result<i64, EtcdError> {
        if let Some((id, at, ttl)) = self.current {
            if ttl == ttl_s && at.elapsed() < Duration::from_millis(LEASE_REUSE_MS) {
                return Ok(id);
            }
        }
        let id = client.grant(ttl_s).await?;
        self.current = Some((id, Instant::now(), ttl_s));
        Ok(id)
    }
}

async fn session(
    client: &Client,
    prefix: &str,
    balancers: &Balancers,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), EtcdError> {
    let (revision, kvs) = client.range_prefix(prefix.as_bytes()).await?;
    let now = Instant::now();
    for KeyValue { key, value } in &kvs {
        apply_put(prefix, balancers, key, value, now);
    }
    let mut watch = client.watch_prefix(prefix.as_bytes(), revision + 1).await?;
    let mut leases = Leases { current: None };
    // Choices made while the session was down were not shared; those
    // waiting now are written first.
    write_all(client, prefix, balancers, &mut leases).await?;
    loop {
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            events = watch.events() => {
                let Some(events) = events? else {
                    return Err(EtcdError::Malformed("the cache watch ended".into()));
                };
                let now = Instant::now();
                for e in events {
                    match e {
                        WatchEvent::Put { key, value } => apply_put(prefix, balancers, &key, &value, now),
                        WatchEvent::Delete { key } => {
                            if let Some((b, k)) = entry_of(prefix, balancers, &key) {
                                b.forget(k);
                            }
                        }
                    }
                }
            }
            () = any_placed(balancers) => {
                write_all(client, prefix, balancers, &mut leases).await?;
            }
        }
    }
}

/// Completes when any balancer has a choice to write.
async fn any_placed(balancers: &Balancers) {
    // One wait per sharing balancer (a node has a handful); none: the
    // future stays pending, as it should.
    let mut waits: Vec<_> = balancers
        .iter()
        .filter(|b| b.caches_in_etcd())
        .map(|b| Box::pin(b.placed_waiting()))
        .collect();
    std::future::poll_fn(|cx| {
        let ready = waits
            .iter_mut()
            .any(|w| std::future::Future::poll(w.as_mut(), cx).is_ready());
        if ready {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// Writes every waiting choice of every balancer.
async fn write_all(
    client: &Client,
    prefix: &str,
    balancers: &Balancers,
    leases: &mut Leases,
) -> Result<(), EtcdError> {
    for b in balancers.iter().filter(|b| b.caches_in_etcd()) {
        for placed in b.take_placed() {
            write(client, prefix, b, placed, leases).await?;
        }
    }
    Ok(())
}

async fn write(
    client: &Client,
    prefix: &str,
    balancer: &Balancer,
    placed: Placed,
    leases: &mut Leases,
) -> Result<(), EtcdError> {
    let timeout = balancer.cache_timeout();
    let ttl_s = timeout.as_millis().div_ceil(1000).max(1) as u64;
    let lease = leases.lease(client, ttl_s).await?;
    let key = format!("{prefix}{}/{}", balancer.name(), placed.key);
    if placed.replacing {
        return client
            .put(key.as_bytes(), placed.target.as_bytes(), lease)
            .await;
    }
    if let Some(winner) = client
        .put_if_absent(key.as_bytes(), placed.target.as_bytes(), lease)
        .await?
    {
        match String::from_utf8(winner) {
            Ok(w) if !w.is_empty() => {
                if w != placed.target {
                    tracing::debug!(key = %placed.key, ours = %placed.target, theirs = %w, "cluster: another node placed this key first; adopting its choice");
                }
                balancer.remember(&placed.key, &w, Instant::now() + timeout);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Remembers the entry `key` = `value`, if it is one of ours.
fn apply_put(prefix: &str, balancers: &Balancers, key: &[u8], value: &[u8], now: Instant) {
    let Some((b, k)) = entry_of(prefix, balancers, key) else {
        return;
    };
    match std::str::from_utf8(value) {
        Ok(target) if !target.is_empty() => b.remember(k, target, now + b.cache_timeout()),
        _ => {
            tracing::debug!(key = %String::from_utf8_lossy(key), "cluster: skipping a malformed cache entry")
        }
    }
}

/// The balancer and target key of an etcd key under `prefix`; `None` for
/// a key that is not `<prefix><balancer>/<key>` of a sharing balancer.
fn entry_of<'a>(
    prefix: &str,
    balancers: &'a Balancers,
    key: &'a [u8],
) -> Option<(&'a Balancer, &'a str)> {
    let rest = std::str::from_utf8(key).ok()?.strip_prefix(prefix)?;
    let (name, k) = rest.split_once('/')?;
    let b = balancers.by_name(name).filter(|b| b.caches_in_etcd())?;
    Some((b.as_ref(), k))
}
