//! The balancer's byte-level proxy (`[cluster.balancer] proxy = true`):
//! MQTT 3.1.1 and STOMP cannot tell a client to connect elsewhere, so a
//! node relays such a client to the node its key belongs to.
//!
//! Before the adapter runs, the node reads the client's first frame
//! ([`sniff`]) far enough for its key (client id, login; the source
//! address and SNI host come from the transport) and asks the balancer. A
//! client that belongs on another node is connected there, to that node's
//! *plain* listener of the same protocol (a TLS client's TLS ends here);
//! the node sends a PROXY protocol v2 header naming the client's address,
//! replays the bytes it read, and copies both ways ([`splice`]).
//!
//! On the target, a connection from another member that starts with a
//! PROXY header is served as the client named there (its address is the
//! connection's source, for logs, the admin API and the `source_ip` key)
//! and is never balanced again, so two nodes whose views of the pool
//! differ cannot bounce a client between them. A PROXY header from any
//! other address is refused (the connection is closed): only members of
//! the cluster may speak for a client.
//!
//! A client that belongs here, one whose first frame cannot be read (MQTT
//! 5, malformed, larger than [`sniff::SNIFF_BYTES_MAX`]), or whose target
//! does not accept within `proxy_connect_timeout_ms`, is served here as
//! without the proxy; the adapter answers it in its protocol's words.

mod sniff;
mod splice;

use std::sync::Arc;

use rosetta_cluster::proxy_header::{self, Parsed};
use rosetta_config::ListenerKind;
use rosetta_neutral::{Placement, PlacementRequest, Protocol};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cluster::{ClusterNode, ProxyLimits, Transport};
use crate::detect::Rewind;
use crate::driver;
use crate::protocols::{Peer, Wire};
use crate::Shared;

use sniff::Sniffed;

/// Bytes read from the client per read while sniffing.
const SNIFF_READ_BYTES: usize = 4096;

/// What to do with a connection once its first bytes are read.
pub(crate) enum Verdict<T> {
    /// Proxied to its target, and over now; or closed (a bad header, the
    /// client left).
    Done,
    /// Serve it here, bytes read so far replayed first.
    ServeHere(Rewind<T>, Peer),
}

/// Whether connections of `wire` on this node are sniffed at all: only
/// with the proxy on, and for the protocols it relays.
pub(crate) fn applies(
    shared: &Shared,
    wire: Wire,
    listener: ListenerKind,
) -> Option<(Arc<ClusterNode>, ProxyLimits)> {
    let node = shared.cluster.as_ref()?;
    let limits = node.proxy(listener)?;
    matches!(wire, Wire::Mqtt | Wire::Stomp).then(|| (Arc::clone(node), limits))
}

/// Reads a connection's first frame and proxies it if it belongs on
/// another node; see the module docs.
pub(crate) async fn intercept<T>(
    wire: Wire,
    mut io: T,
    mut peer: Peer,
    conn_id: u64,
    shared: &Arc<Shared>,
    node: &ClusterNode,
    limits: ProxyLimits,
) -> Verdict<T>
where
    T: driver::Transport,
{
    let mut buf = Vec::with_capacity(SNIFF_READ_BYTES);
    // A PROXY header first, from another node.
    loop {
        match proxy_header::parse(&buf) {
            Ok(Parsed::NeedMore) => {
                if !read_more(&mut io, &mut buf).await {
                    return Verdict::Done;
                }
            }
            Ok(Parsed::Absent) => break,
            Ok(Parsed::Header { len, source }) => {
                if !node.is_member_address(peer.addr.ip()) {
                    tracing::warn!(conn = conn_id, %peer, "PROXY header from an address that is no cluster member; closing");
                    return Verdict::Done;
                }
                let rest = buf.split_off(len);
                if let Some(source) = source {
                    tracing::debug!(conn = conn_id, via = %peer, client = %source, "proxied here by another node");
                    peer.addr = source;
                }
                peer.proxied = true;
                return Verdict::ServeHere(Rewind::new(rest, io), peer);
            }
            Err(e) => {
                tracing::warn!(conn = conn_id, %peer, error = %e, "closing");
                return Verdict::Done;
            }
        }
    }
    // The first frame, far enough for the key.
    let (client_id, user) = loop {
        match sniff::first_frame(wire, &buf) {
            Sniffed::NeedMore if buf.len() < sniff::SNIFF_BYTES_MAX => {
                if !read_more(&mut io, &mut buf).await {
                    return Verdict::Done;
                }
            }
            Sniffed::Unredirectable { client_id, user } => break (client_id, user),
            Sniffed::NeedMore | Sniffed::ServeHere => {
                return Verdict::ServeHere(Rewind::new(buf, io), peer);
            }
        }
    };
    let Some(target) = target_of(wire, node, &peer, client_id.as_deref(), user.as_deref()) else {
        return Verdict::ServeHere(Rewind::new(buf, io), peer);
    };
    let upstream = match connect(&target, limits).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(conn = conn_id, %peer, %target, error = %e, "proxy: target unreachable; serving the client here");
            return Verdict::ServeHere(Rewind::new(buf, io), peer);
        }
    };
    let mut upstream = upstream;
    let destination = upstream.peer_addr().unwrap_or(peer.addr);
    let header = proxy_header::encode(peer.addr, destination);
    let opened = async {
        upstream.write_all(&header).await?;
        upstream.write_all(&buf).await
    };
    if let Err(e) = opened.await {
        tracing::warn!(conn = conn_id, %peer, %target, error = %e, "proxy: target closed at once; serving the client here");
        return Verdict::ServeHere(Rewind::new(buf, io), peer);
    }
    // Proxied: this node's part of the handshake is over (its deadline
    // must not cut the client), and the target authenticates it.
    let _relayed = Relayed::count(shared);
    peer.admission.authenticated();
    tracing::debug!(conn = conn_id, %peer, %target, "proxy: relaying");
    let ended = splice::splice(io, upstream, limits.idle_timeout, shared.hard_stop.clone()).await;
    tracing::debug!(conn = conn_id, %peer, %target, ?ended, "proxy: closed");
    Verdict::Done
}

/// One connection in [`Shared::proxied_out`] while it lives.
struct Relayed<'a>(&'a Shared);

impl<'a> Relayed<'a> {
    fn count(shared: &'a Shared) -> Self {
        shared
            .proxied_out
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(shared)
    }
}

impl Drop for Relayed<'_> {
    fn drop(&mut self) {
        self.0
            .proxied_out
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Appends what the client sends next; false when it closed or failed.
async fn read_more<T: AsyncRead + Unpin>(io: &mut T, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; SNIFF_READ_BYTES];
    match io.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
            true
        }
    }
}

/// The target's plain listener for a client that belongs elsewhere.
fn target_of(
    wire: Wire,
    node: &ClusterNode,
    peer: &Peer,
    client_id: Option<&str>,
    user: Option<&str>,
) -> Option<String> {
    let (protocol, listener) = match wire {
        Wire::Mqtt => (Protocol::Mqtt, "mqtt"),
        Wire::Stomp => (Protocol::Stomp, "stomp"),
        Wire::Amqp => return None,
    };
    let request = PlacementRequest {
        protocol,
        client_id,
        // A certificate's user is who the client is, as for the adapter.
        user: peer.certificate_user.as_deref().or(user),
    };
    let transport = Transport {
        listener: peer.listener,
        source: peer.addr.ip(),
        sni_host: peer.sni_host.clone(),
    };
    match node.place_on(&request, &transport, listener) {
        Placement::Redirect(target) => Some(target.authority()),
        Placement::Local | Placement::Unavailable => None,
    }
}

/// Connects to `target` (`host:port`; a name is resolved here).
async fn connect(target: &str, limits: ProxyLimits) -> std::io::Result<TcpStream> {
    let stream = tokio::time::timeout(limits.connect_timeout, TcpStream::connect(target))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    // As for every client socket: small frames must not wait for Nagle.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}
