//! Accept loops: one task per listener, one task per accepted connection.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use rosetta_config::ListenerKind;

use super::admission::HandshakeDeadline;
use super::protocols::{self, Peer};
use super::{refuse, ConnectionGuard, Shared};

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
    let connect_timeout = Duration::from_millis(shared.config.broker.connect_timeout_ms);
    let tail = TaskTail {
        deadline: HandshakeDeadline::new(ticket.clone(), connect_timeout),
        _guard: shared.track(),
        conn_id,
        listener: kind,
    };
    let shared = Arc::clone(shared);
    protocols::spawn(
        kind,
        stream,
        Peer::new(peer, ticket, kind),
        conn_id,
        shared,
        tail,
    );
}

/// What the task of an accepted connection holds besides the connection:
/// the backstop against a connection that never authenticates, and its
/// place in the server's count of open connections (for the shutdown).
pub(crate) struct TaskTail {
    deadline: HandshakeDeadline,
    _guard: ConnectionGuard,
    conn_id: u64,
    listener: ListenerKind,
}

/// The task of one accepted connection: the connection's own future
/// (for plain TCP its driver, see [`protocols::spawn`]) until it ends or
/// the connection is still unauthenticated at its deadline.
///
/// A hand-written future rather than an `async` block over `select!`:
/// the block kept the peer's address, the admission handle and the
/// listener kind in every connection's task for the one log line of a
/// deadline that rarely fires; here that line takes them from the
/// admission ticket.
pub(crate) struct ConnectionTask<F> {
    connection: F,
    tail: TaskTail,
}

impl<F> ConnectionTask<F> {
    pub(crate) fn new(connection: F, tail: TaskTail) -> Self {
        Self { connection, tail }
    }
}

impl<F: Future<Output = ()> + Unpin> Future for ConnectionTask<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Pin::new(&mut this.connection).poll(cx).is_ready() {
            return Poll::Ready(());
        }
        if this.tail.poll_expired(cx) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl TaskTail {
    /// Whether the connection is past its handshake deadline, still
    /// unauthenticated (logged). To be polled after the connection: a
    /// poll in which it authenticated frees the deadline's timer now, not
    /// at some later wake-up an idle connection may never get (a STOMP
    /// connection kept it, 112 B).
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if Pin::new(&mut self.deadline).poll(cx).is_ready() {
            self.deadline.log_expired(self.listener.key(), self.conn_id);
            return true;
        }
        false
    }

    /// Whether the connection has authenticated (its deadline is over).
    pub(crate) fn is_authenticated(&self) -> bool {
        self.deadline.is_authenticated()
    }

    /// What an authenticated connection's tail keeps while the connection
    /// is parked (`parking`): the admission ticket without its spent
    /// deadline, and the count; the id is the driver's.
    pub(crate) fn park(self) -> ParkedTail {
        ParkedTail {
            ticket: self.deadline.into_ticket(),
            _guard: self._guard,
            listener: self.listener,
        }
    }
}

/// A parked connection's [`TaskTail`].
pub(crate) struct ParkedTail {
    ticket: super::admission::Ticket,
    _guard: ConnectionGuard,
    listener: ListenerKind,
}

impl ParkedTail {
    /// The tail again, for the connection `conn_id`.
    pub(crate) fn resume(self, conn_id: u64) -> TaskTail {
        TaskTail {
            deadline: HandshakeDeadline::authenticated(self.ticket),
            _guard: self._guard,
            conn_id,
            listener: self.listener,
        }
    }
}
