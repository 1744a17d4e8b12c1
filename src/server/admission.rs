//! Admission: which connections the broker takes, and which it refuses.
//!
//! A connection is *unauthenticated* from accept until its protocol adapter
//! opens a core session (every adapter calls [`Broker::open_session`] once,
//! right after authentication), then *authenticated* until it closes.
//! Each kind has its own limits, so sockets that never log in cannot lock
//! out clients that do:
//!
//! | limit (`[broker]`)                | counts                                 | default |
//! | --------------------------------- | -------------------------------------- | ------- |
//! | `connections_max`                 | authenticated connections              | 100,000 |
//! | `unauthenticated_connections_max` | connections still connecting, in total | 1,024   |
//! | `unauthenticated_per_address_max` | the same, from one source IP address   | 128     |
//!
//! and `connect_timeout_ms` bounds how long a connection may stay
//! unauthenticated (see [`HandshakeDeadline`]). A connection is checked at
//! accept; one over a limit is refused with the protocol's own reason when
//! it has one (see [`super::refuse`]). Since the check is at accept, a burst
//! of logins can take the authenticated count past `connections_max` by at
//! most `unauthenticated_connections_max`; sockets are bounded by the sum.
//!
//! The signal "this connection has authenticated" is the [`Ticket`] itself,
//! as the broker handle the server gives each adapter
//! ([`Ticket::broker`]): it forwards everything to the core and moves to
//! the authenticated count when the adapter opens its session. No adapter
//! or driver code knows about it. One allocation per connection for the
//! ticket and the handle (64 B; two of 48 and 40 B before, issue 20).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use rosetta_neutral::{
    AuthError, Broker, Credentials, EventSink, LoginStart, Principal, ScramCredentials, Session,
};
use rosetta_neutral::{Placement, PlacementRequest, SessionInfo};
use tokio::time::Sleep;

use rosetta_config::BrokerConfig;
use rosetta_core::Core;

use super::cluster::{ClusterNode, Transport};
use super::log_throttle::LogThrottle;
use super::protocols::Peer;

/// Time past `connect_timeout_ms` before the server cuts a connection that
/// is still unauthenticated: the adapters close such a connection
/// politely at `connect_timeout_ms` after they start (with the protocol's
/// error), and this backstop must not beat them to it on a plain port.
/// It catches what happens before an adapter starts (TLS handshake,
/// WebSocket upgrade, protocol detection), which it counts from accept.
pub(crate) const HANDSHAKE_DEADLINE_SLACK: Duration = Duration::from_secs(1);

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// `connections_max` authenticated connections are open.
    #[error("connections_max ({0}) reached")]
    Full(usize),
    /// `unauthenticated_connections_max` connections are still connecting.
    #[error("unauthenticated_connections_max ({0}) reached")]
    TooManyConnecting(usize),
    /// `unauthenticated_per_address_max` connections from this address are
    /// still connecting.
    #[error("unauthenticated_per_address_max ({0}) reached for this address")]
    TooManyFromAddress(usize),
}

/// The limits, from `[broker]`.
#[derive(Debug, Clone, Copy)]
struct Limits {
    authenticated_max: usize,
    unauthenticated_max: usize,
    per_address_max: usize,
}

/// Connections still connecting: in total and per source address. An
/// address is in the map only while it has some, so the map holds at most
/// `unauthenticated_max` entries.
#[derive(Debug, Default)]
struct Connecting {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// The counts and limits every accept consults, and the core its
/// tickets forward to as broker handles.
pub(crate) struct Admission {
    core: Core,
    limits: Limits,
    authenticated: AtomicUsize,
    connecting: Mutex<Connecting>,
    refused_total: AtomicU64,
    /// Refused and timed-out connections are logged through this.
    pub(crate) log: LogThrottle,
}

fn as_usize(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl Admission {
    pub(crate) fn new(config: &BrokerConfig, core: Core) -> Arc<Self> {
        Arc::new(Self {
            core,
            limits: Limits {
                authenticated_max: as_usize(config.connections_max),
                unauthenticated_max: as_usize(config.unauthenticated_connections_max),
                per_address_max: as_usize(config.unauthenticated_per_address_max),
            },
            authenticated: AtomicUsize::new(0),
            connecting: Mutex::new(Connecting::default()),
            refused_total: AtomicU64::new(0),
            log: LogThrottle::default(),
        })
    }

    /// Takes a connection from `addr` in as unauthenticated, or says why
    /// not.
    pub(crate) fn admit(self: &Arc<Self>, addr: IpAddr) -> Result<Ticket, Refused> {
        self.admit_from(addr, true)
    }

    /// [`Self::admit`] for a connection from another node of the cluster,
    /// which counts against the totals only: the clients its proxy relays
    /// here were held to `unauthenticated_per_address_max` there, under
    /// their own addresses, and must not share one cap here under the
    /// node's.
    pub(crate) fn admit_member(self: &Arc<Self>, addr: IpAddr) -> Result<Ticket, Refused> {
        self.admit_from(addr, false)
    }

    fn admit_from(self: &Arc<Self>, addr: IpAddr, per_address: bool) -> Result<Ticket, Refused> {
        let addr = addr.to_canonical();
        let refused = |why| {
            self.refused_total.fetch_add(1, Ordering::Relaxed);
            Err(why)
        };
        let limits = self.limits;
        if self.authenticated.load(Ordering::Relaxed) >= limits.authenticated_max {
            return refused(Refused::Full(limits.authenticated_max));
        }
        let mut connecting = self.connecting.lock();
        if connecting.total >= limits.unauthenticated_max {
            return refused(Refused::TooManyConnecting(limits.unauthenticated_max));
        }
        if per_address {
            let from_address = connecting.by_address.entry(addr).or_insert(0);
            if *from_address >= limits.per_address_max {
                return refused(Refused::TooManyFromAddress(limits.per_address_max));
            }
            *from_address += 1;
        }
        connecting.total += 1;
        drop(connecting);
        Ok(Ticket(Arc::new(TicketState {
            admission: Arc::clone(self),
            addr: per_address.then_some(addr),
            authenticated: AtomicBool::new(false),
            placement: OnceLock::new(),
        })))
    }

    /// Connections that have authenticated and are open.
    pub(crate) fn authenticated(&self) -> usize {
        self.authenticated.load(Ordering::Relaxed)
    }

    /// Connections accepted and not yet authenticated.
    pub(crate) fn unauthenticated(&self) -> usize {
        self.connecting.lock().total
    }

    /// Connections refused at accept since start.
    pub(crate) fn refused_total(&self) -> u64 {
        self.refused_total.load(Ordering::Relaxed)
    }

    fn release_connecting(&self, addr: Option<IpAddr>) {
        let mut connecting = self.connecting.lock();
        connecting.total = connecting.total.saturating_sub(1);
        let Some(addr) = addr else {
            return;
        };
        if let Some(n) = connecting.by_address.get_mut(&addr) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                connecting.by_address.remove(&addr);
            }
        }
    }
}

/// One admitted connection's place in the counts; it gives the place back
/// when the last clone is dropped. Its adapter's broker handle too
/// ([`Ticket::broker`]).
#[derive(Clone)]
pub(crate) struct Ticket(Arc<TicketState>);

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("addr", &self.0.addr)
            .field("authenticated", &self.is_authenticated())
            .finish()
    }
}

/// 48 bytes: with `Arc`'s counts, jemalloc's 64 B class.
struct TicketState {
    admission: Arc<Admission>,
    /// The address it counts under; `None` for a cluster member's.
    addr: Option<IpAddr>,
    authenticated: AtomicBool,
    /// `[cluster]`'s balancer, and what it needs to know of the transport,
    /// set when the adapter starts (the transport is known then). Boxed:
    /// most nodes have no cluster.
    placement: OnceLock<Box<Placer>>,
}

impl Ticket {
    /// The connection has authenticated: it leaves the unauthenticated
    /// counts for the authenticated one. Idempotent.
    pub(crate) fn authenticated(&self) {
        Self::mark_authenticated(&self.0);
    }

    fn mark_authenticated(state: &TicketState) {
        if !state.authenticated.swap(true, Ordering::AcqRel) {
            state.admission.release_connecting(state.addr);
            state
                .admission
                .authenticated
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn is_authenticated(&self) -> bool {
        self.0.authenticated.load(Ordering::Acquire)
    }

    /// The broker handle of the connection's adapter: the core, plus the
    /// signal that the connection has authenticated (its session is
    /// opened). With `cluster` (when there is one), it asks the cluster
    /// where the connection of `peer` belongs.
    pub(crate) fn broker(&self, cluster: Option<Arc<ClusterNode>>, peer: &Peer) -> Arc<dyn Broker> {
        // A client another node proxied here was placed there.
        if let Some(cluster) = cluster.filter(|_| !peer.proxied) {
            let _ = self.0.placement.set(Box::new(Placer {
                cluster,
                transport: Transport {
                    listener: peer.listener,
                    source: peer.addr.ip(),
                    sni_host: peer.sni_host.clone(),
                },
            }));
        }
        Arc::clone(&self.0) as Arc<dyn Broker>
    }
}

impl Drop for TicketState {
    fn drop(&mut self) {
        if *self.authenticated.get_mut() {
            self.admission.authenticated.fetch_sub(1, Ordering::Relaxed);
        } else {
            self.admission.release_connecting(self.addr);
        }
    }
}

/// Completes when a connection is still unauthenticated at its deadline;
/// never once it has authenticated (and then it frees its timer).
///
/// Polled beside the connection's own future (see
/// [`super::listener`]), which wakes the task whenever the connection
/// makes progress, so authentication is noticed on the next wake-up.
pub(crate) struct HandshakeDeadline {
    ticket: Ticket,
    timer: Option<Pin<Box<Sleep>>>,
}

impl HandshakeDeadline {
    /// A deadline `connect_timeout` (plus [`HANDSHAKE_DEADLINE_SLACK`]) from
    /// now.
    pub(crate) fn new(ticket: Ticket, connect_timeout: Duration) -> Self {
        let timer = Box::pin(tokio::time::sleep(
            connect_timeout.saturating_add(HANDSHAKE_DEADLINE_SLACK),
        ));
        Self {
            ticket,
            timer: Some(timer),
        }
    }
}

impl HandshakeDeadline {
    /// Whether the connection has authenticated: the deadline no longer
    /// applies.
    pub(crate) fn is_authenticated(&self) -> bool {
        self.ticket.is_authenticated()
    }

    /// The ticket, without the deadline (an authenticated connection
    /// parked, see `parking`).
    pub(crate) fn into_ticket(self) -> Ticket {
        self.ticket
    }

    /// The deadline of a connection that has authenticated: none.
    pub(crate) fn authenticated(ticket: Ticket) -> Self {
        Self {
            ticket,
            timer: None,
        }
    }

    /// Logs (throttled) that the connection is being closed for not
    /// authenticating in time. The address is the ticket's (without the
    /// port, which the task does not keep for this one line; none for a
    /// cluster member's connection).
    pub(crate) fn log_expired(&self, listener: &'static str, conn_id: u64) {
        let state = &self.ticket.0;
        if let Some(suppressed) = state.admission.log.admit(std::time::Instant::now()) {
            tracing::warn!(
                listener, peer = ?state.addr, conn = conn_id, suppressed,
                "closing a connection not authenticated within [broker] connect_timeout_ms"
            );
        }
    }
}

impl Future for HandshakeDeadline {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.ticket.is_authenticated() {
            self.timer = None;
            return Poll::Pending;
        }
        match self.timer.as_mut() {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

/// The balancer of a connection, and what the transport knows of it.
struct Placer {
    cluster: Arc<ClusterNode>,
    transport: Transport,
}

// Every method forwards to the core, the provided ones included, so that
// the core's own version of any of them is the one in force.
impl Broker for TicketState {
    fn authenticate(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<Principal, AuthError> {
        self.admission.core.authenticate(user, password)
    }

    fn scram_credentials(&self, user: &str) -> Option<ScramCredentials> {
        self.admission.core.scram_credentials(user)
    }

    fn anonymous_allowed(&self) -> bool {
        self.admission.core.anonymous_allowed()
    }

    fn authenticate_certificate(&self, subject: &str) -> Result<Principal, AuthError> {
        self.admission.core.authenticate_certificate(subject)
    }

    fn authenticate_connection(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
        certificate_user: Option<&str>,
    ) -> Result<Principal, AuthError> {
        self.admission
            .core
            .authenticate_connection(user, password, certificate_user)
    }

    fn start_login(&self, credentials: Credentials<'_>, sink: &Arc<dyn EventSink>) -> LoginStart {
        self.admission.core.start_login(credentials, sink)
    }

    fn open_session(&self, info: SessionInfo, sink: Arc<dyn EventSink>) -> Box<dyn Session> {
        Ticket::mark_authenticated(self);
        self.admission.core.open_session(info, sink)
    }

    fn place_connection(&self, request: &PlacementRequest<'_>) -> Placement {
        match self.placement.get() {
            Some(p) => p.cluster.place(request, &p.transport),
            None => self.admission.core.place_connection(request),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(authenticated: u32, unauthenticated: u32, per_address: u32) -> Arc<Admission> {
        Admission::new(
            &BrokerConfig {
                connections_max: authenticated,
                unauthenticated_connections_max: unauthenticated,
                unauthenticated_per_address_max: per_address,
                ..BrokerConfig::default()
            },
            Core::in_memory(),
        )
    }

    /// The ticket is the adapter's broker handle too: one allocation of
    /// jemalloc's 64 B class per connection.
    #[test]
    fn a_ticket_fits_its_size_class() {
        let size = std::mem::size_of::<TicketState>();
        assert!(size <= 48, "TicketState is {size} B");
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn the_per_address_cap_leaves_other_addresses_in() {
        let adm = admission(100, 10, 2);
        let a1 = adm.admit(A).expect("first");
        let _a2 = adm.admit(A).expect("second");
        assert_eq!(adm.admit(A).err(), Some(Refused::TooManyFromAddress(2)));
        let _b = adm.admit(B).expect("another address");
        // An IPv4-mapped IPv6 address is the same address.
        let mapped = IpAddr::V6(std::net::Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        assert_eq!(
            adm.admit(mapped).err(),
            Some(Refused::TooManyFromAddress(2))
        );
        drop(a1);
        let _a3 = adm.admit(A).expect("a place was given back");
        assert_eq!(adm.unauthenticated(), 3);
        assert_eq!(adm.refused_total(), 2);
    }

    #[test]
    fn a_members_connections_count_against_the_total_only() {
        let adm = admission(100, 3, 1);
        let _a = adm.admit(A).expect("first");
        assert_eq!(adm.admit(A).err(), Some(Refused::TooManyFromAddress(1)));
        let m1 = adm.admit_member(A).expect("a member past the address cap");
        let _m2 = adm.admit_member(A).expect("and again");
        assert_eq!(
            adm.admit_member(A).err(),
            Some(Refused::TooManyConnecting(3)),
            "the total still holds"
        );
        drop(m1);
        assert_eq!(adm.unauthenticated(), 2);
        assert_eq!(
            adm.admit(A).err(),
            Some(Refused::TooManyFromAddress(1)),
            "a member's place given back is no place of the address"
        );
    }

    #[test]
    fn authenticating_moves_a_connection_to_the_other_count() {
        let adm = admission(2, 2, 2);
        let a = adm.admit(A).expect("a");
        let b = adm.admit(A).expect("b");
        assert_eq!(adm.admit(A).err(), Some(Refused::TooManyConnecting(2)));
        a.authenticated();
        a.authenticated();
        assert_eq!((adm.authenticated(), adm.unauthenticated()), (1, 1));
        let c = adm.admit(A).expect("room again for one connecting");
        b.authenticated();
        assert_eq!(adm.admit(B).err(), Some(Refused::Full(2)));
        drop((a, b, c));
        assert_eq!((adm.authenticated(), adm.unauthenticated()), (0, 0));
        assert!(adm.connecting.lock().by_address.is_empty());
    }

    #[tokio::test]
    async fn the_deadline_fires_unless_authenticated() {
        let adm = admission(10, 10, 10);
        let timeout = Duration::from_millis(50);
        let late = HandshakeDeadline::new(adm.admit(A).expect("a"), timeout);
        let ticket = adm.admit(A).expect("b");
        let mut on_time = HandshakeDeadline::new(ticket.clone(), timeout);
        ticket.authenticated();
        let limit = timeout + HANDSHAKE_DEADLINE_SLACK + Duration::from_secs(2);
        tokio::time::timeout(limit, late).await.expect("fires");
        // Past its deadline too, yet it does not fire.
        let waited = tokio::time::timeout(Duration::from_millis(100), &mut on_time).await;
        assert!(
            waited.is_err(),
            "an authenticated connection has no deadline"
        );
        assert!(on_time.timer.is_none(), "its timer was freed");
    }
}
