//! Health checks of the remote targets: each published address of a
//! target is ready when a TCP connection to it opens within the timeout,
//! and a target is a candidate for a listener only while that listener's
//! address is (a node whose MQTT port is wedged keeps its AMQP clients).
//! Checked every interval, all targets and addresses at once (one dead
//! address's timeout does not delay the others), and at once when
//! membership sees a new node. A change is logged once, when it happens.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use crate::balancer::Target;
use crate::balancers::Balancers;

pub(crate) async fn check_loop(
    balancer: Balancers,
    interval: Duration,
    timeout: Duration,
    recheck: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let mut checks = JoinSet::new();
        for target in balancer.remote_targets() {
            checks.spawn(async move {
                let down = down_listeners(&target, timeout).await;
                (target, down)
            });
        }
        while let Some(done) = checks.join_next().await {
            if let Ok((target, down)) = done {
                log_change(&target, &down);
                balancer.set_down(&target.name, &down);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = recheck.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// The listener keys of `target` whose address does not accept a
/// connection now. Listeners that share an address are probed once.
pub async fn down_listeners(target: &Target, timeout: Duration) -> BTreeSet<String> {
    let mut by_address: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (listener, address) in &target.addresses {
        by_address.entry(address).or_default().push(listener);
    }
    let mut probes = JoinSet::new();
    for address in by_address.keys() {
        let address = (*address).to_owned();
        probes.spawn(async move {
            let answered = matches!(
                tokio::time::timeout(timeout, TcpStream::connect(address.as_str())).await,
                Ok(Ok(_))
            );
            (address, answered)
        });
    }
    let mut down = BTreeSet::new();
    while let Some(done) = probes.join_next().await {
        let Ok((address, answered)) = done else {
            continue;
        };
        if !answered {
            let listeners = by_address.get(address.as_str()).into_iter().flatten();
            down.extend(listeners.map(|l| (*l).to_owned()));
        }
    }
    down
}

/// Logs what changed since `before` was checked: a target that became
/// ready or not, or listeners that went down or came back.
fn log_change(before: &Target, down: &BTreeSet<String>) {
    let ready = before.ready_unless(down);
    if ready != before.ready {
        if ready {
            tracing::info!(node = %before.name, down = ?down, "cluster: target ready");
        } else {
            tracing::warn!(node = %before.name, addresses = ?before.addresses, "cluster: target not answering on any address");
        }
    } else if ready && *down != before.down {
        tracing::warn!(node = %before.name, down = ?down, "cluster: target's listeners not answering changed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against real sockets: a listening port answers, a closed one does
    /// not, and two listeners sharing an address share its answer.
    #[tokio::test]
    async fn each_address_is_checked_and_only_the_silent_ones_are_down() {
        let open = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let open_at = open.local_addr().expect("addr").to_string();
        let closed_at = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").to_string()
        };
        let target = Target::new(
            "b",
            BTreeMap::from([
                ("mqtt".to_owned(), open_at.clone()),
                ("ws".to_owned(), open_at),
                ("amqp".to_owned(), closed_at),
            ]),
        );
        let down = down_listeners(&target, Duration::from_secs(2)).await;
        assert_eq!(down, BTreeSet::from(["amqp".to_owned()]));
        drop(open);
        let down = down_listeners(&target, Duration::from_secs(2)).await;
        assert_eq!(down.len(), 3, "{down:?}");
    }
}
