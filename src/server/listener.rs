//! Accept loops: one task per listener, one task per accepted connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use rosetta_config::ListenerKind;

use super::admission::HandshakeDeadline;
use super::protocols::{self, Peer};
use super::{refuse, Shared};

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
    // Admission (see `admission`): authenticated connections count against
    // `connections_max`, those still connecting against their own caps, so
    // a flood of idle sockets cannot lock out clients that log in. A
    // refused socket is told why in its protocol's terms, then closed.
    // Another node's proxy speaks for many clients from one address.
    let member = shared
        .cluster
        .as_ref()
        .is_some_and(|c| c.proxies() && c.is_member_address(peer.ip()));
    let admitted = if member {
        shared.admission.admit_member(peer.ip())
    } else {
        shared.admission.admit(peer.ip())
    };
    let ticket = match admitted {
        Ok(ticket) => ticket,
        Err(why) => {
            if let Some(suppressed) = shared.admission.log.admit(Instant::now()) {
                tracing::warn!(listener = kind.key(), %peer, reason = %why, suppressed, "connection refused");
            }
            refuse::spawn(kind, stream, why, &shared.refusals);
            return;
        }
    };
    // Latency matters more than packet count for a broker: acks and small
    // messages must not wait for Nagle.
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    let conn_id = shared.next_conn_id();
    let guard = shared.track();
    let shared = Arc::clone(shared);
    let connect_timeout = Duration::from_millis(shared.config.broker.connect_timeout_ms);
    let deadline = HandshakeDeadline::new(ticket.clone(), connect_timeout);
    let admission = Arc::clone(&shared.admission);
    // Built here, not in the task: what the task captures it keeps for its
    // whole life (see `protocols::serve`).
    let connection = protocols::serve(kind, stream, Peer::new(peer, ticket, kind), conn_id, shared);
    tokio::spawn(async move {
        let _guard = guard;
        tokio::select! {
            () = connection => {}
            () = deadline => {
                if let Some(suppressed) = admission.log.admit(Instant::now()) {
                    tracing::warn!(
                        listener = kind.key(), %peer, conn = conn_id, suppressed,
                        "closing a connection not authenticated within [broker] connect_timeout_ms"
                    );
                }
            }
        }
    });
}
