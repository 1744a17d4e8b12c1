//! Accept loops: one task per listener, one task per accepted connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::config::ListenerKind;

use super::{protocols, Shared};

/// Pause after an accept error (e.g. out of file descriptors) so the loop
/// does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Binds `addr` and spawns its accept loop, which ends when `stop` turns
/// true.
pub(crate) async fn spawn(
    kind: ListenerKind,
    addr: &str,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => accept(kind, stream, peer, &shared),
                    Err(e) => {
                        tracing::warn!(listener = kind.key(), error = %e, "accept failed");
                        tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    }
                },
                _ = stop.changed() => {
                    if *stop.borrow() {
                        break;
                    }
                }
            }
        }
    });
    Ok((bound, task))
}

fn accept(kind: ListenerKind, stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
    // `[broker] connections_max`: beyond it a socket is closed at once, so
    // a flood of connections cannot exhaust memory or file descriptors.
    let max = usize::try_from(shared.config.broker.connections_max).unwrap_or(usize::MAX);
    if shared.active_connections() >= max {
        tracing::warn!(listener = kind.key(), %peer, max, "connection refused: connections_max reached");
        return;
    }
    // Latency matters more than packet count for a broker: acks and small
    // messages must not wait for Nagle.
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    let conn_id = shared.next_conn_id();
    let guard = shared.track();
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let _guard = guard;
        protocols::serve(kind, stream, peer, conn_id, shared).await;
    });
}
