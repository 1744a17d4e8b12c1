//! Health checks of the remote targets: a target is ready when a TCP
//! connection to its first published address opens within the timeout.
//! Checked every interval, all at once (one dead target's timeout does
//! not delay the others), and at once when membership sees a new node.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};

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
        let targets = balancer.remote_targets();
        let checks: Vec<_> = targets
            .into_iter()
            .map(|t| tokio::spawn(check(t, timeout)))
            .collect();
        for c in checks {
            if let Ok((name, ready)) = c.await {
                balancer.set_ready(&name, ready);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = recheck.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// Whether `target` accepts a connection now.
async fn check(target: Target, timeout: Duration) -> (String, bool) {
    let Some(address) = target.addresses.values().next() else {
        return (target.name, false);
    };
    let ready = matches!(
        tokio::time::timeout(timeout, TcpStream::connect(address.as_str())).await,
        Ok(Ok(_))
    );
    if !ready {
        tracing::debug!(node = %target.name, %address, "cluster: health check failed");
    }
    (target.name, ready)
}
