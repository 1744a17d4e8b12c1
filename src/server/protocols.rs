//! Wiring of the protocol adapters to transports: which state machine a
//! listener runs, built from which configuration section.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use rosetta_neutral::{Broker, SessionEvent};

use rosetta_config::ListenerKind;

use super::admission::Ticket;
use super::driver::{self, Driver, DriverParts, ProtocolConnection};
use super::listener::{ConnectionTask, TaskTail};
use super::parking::{ParkableIo, ParkableTask, Parker};
use super::Shared;

/// Who is on the other end of a connection, as far as the transport knows.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    /// The remote socket address.
    pub(crate) addr: SocketAddr,
    /// The user named by a verified TLS client certificate (mutual TLS):
    /// it stands in for a password ([`Broker::authenticate_connection`]).
    pub(crate) certificate_user: Option<String>,
    /// The connection's place in the admission counts: the adapter's
    /// broker handle moves it to the authenticated count.
    pub(crate) admission: Ticket,
    /// Set once a TLS handshake succeeded.
    pub(crate) tls: bool,
    /// Set once a WebSocket upgrade succeeded.
    pub(crate) websocket: bool,
    /// When the socket was accepted, in ms since the Unix epoch.
    pub(crate) accepted_at_ms: u64,
    /// The listener it came in on: a redirect sends the client to the
    /// same kind of listener on the target (`[cluster]`).
    pub(crate) listener: ListenerKind,
    /// The host name the client asked for in TLS SNI (a `[cluster]`
    /// balancer key).
    pub(crate) sni_host: Option<String>,
    /// Another node proxied this client here, already placed: it is not
    /// balanced again (`addr` is the client's, from the PROXY header).
    pub(crate) proxied: bool,
}

impl Peer {
    /// A peer the transport has not authenticated (yet).
    pub(crate) fn new(addr: SocketAddr, admission: Ticket, listener: ListenerKind) -> Self {
        Self {
            addr,
            certificate_user: None,
            admission,
            tls: false,
            websocket: false,
            accepted_at_ms: rosetta_neutral::message::now_ms(),
            listener,
            sni_host: None,
            proxied: false,
        }
    }

    /// The transport as the admin API names it.
    pub(crate) fn transport(&self) -> &'static str {
        match (self.websocket, self.tls) {
            (false, false) => "tcp",
            (false, true) => "tls",
            (true, false) => "ws",
            (true, true) => "wss",
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.addr.fmt(f)
    }
}

/// The wire protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    Mqtt,
    Stomp,
    Amqp,
}

impl Wire {
    fn name(self) -> &'static str {
        match self {
            Wire::Mqtt => "mqtt",
            Wire::Stomp => "stomp",
            Wire::Amqp => "amqp",
        }
    }
}

macro_rules! forward_protocol_connection {
    ($ty:ty) => {
        forward_protocol_connection!(@impl $ty, {});
    };
    // The adapter lends the driver its parse buffer.
    ($ty:ty, lends_input_buffer) => {
        forward_protocol_connection!(@impl $ty, {
            fn input_buffer(&mut self) -> Option<&mut bytes::BytesMut> {
                Some(<$ty>::input_buffer(self))
            }
            fn handle_buffered_input(&mut self, now: Instant) {
                <$ty>::handle_buffered_input(self, now)
            }
        });
    };
    ($ty:ty, lends_input_buffer, shrinks_when_parked) => {
        forward_protocol_connection!(@impl $ty, {
            fn input_buffer(&mut self) -> Option<&mut bytes::BytesMut> {
                Some(<$ty>::input_buffer(self))
            }
            fn handle_buffered_input(&mut self, now: Instant) {
                <$ty>::handle_buffered_input(self, now)
            }
            fn shrink_when_parked(&mut self) {
                <$ty>::shrink_when_parked(self)
            }
        });
    };
    (@impl $ty:ty, { $($extra:tt)* }) => {
        impl ProtocolConnection for $ty {
            fn handle_input(&mut self, now: Instant, data: &[u8]) {
                <$ty>::handle_input(self, now, data)
            }
            fn handle_event(&mut self, now: Instant, event: SessionEvent) {
                <$ty>::handle_event(self, now, event)
            }
            fn handle_timeout(&mut self, now: Instant) {
                <$ty>::handle_timeout(self, now)
            }
            fn poll_timeout(&self) -> Option<Instant> {
                <$ty>::poll_timeout(self)
            }
            fn poll_transmit(&mut self, out: &mut Vec<u8>) {
                <$ty>::poll_transmit(self, out)
            }
            fn wants_input(&self) -> bool {
                <$ty>::wants_input(self)
            }
            fn is_closed(&self) -> bool {
                <$ty>::is_closed(self)
            }
            fn handle_transport_closed(&mut self, now: Instant) {
                <$ty>::handle_transport_closed(self, now)
            }
            fn handle_slow_consumer(&mut self, now: Instant) {
                <$ty>::handle_slow_consumer(self, now)
            }
            fn resume_deliveries(&mut self) {
                <$ty>::resume_deliveries(self)
            }
            $($extra)*
        }
    };
}

// STOMP's decoder takes bytes through `feed` (it scans for NUL as they
// come), so it keeps the copying path.
forward_protocol_connection!(rosetta_stomp::StompConnection, lends_input_buffer);
forward_protocol_connection!(
    rosetta_mqtt::MqttConnection,
    lends_input_buffer,
    shrinks_when_parked
);
forward_protocol_connection!(
    rosetta_amqp::AmqpConnection,
    lends_input_buffer,
    shrinks_when_parked
);

/// One stage of a connection's life, boxed: a TLS handshake, a WebSocket
/// upgrade, protocol detection, the proxy's look at the first frame, or
/// the protocol itself. A stage ends with the stage that follows, if any,
/// and the task drops each stage's box as it ends.
///
/// An `async` function that awaited the next stage instead kept its
/// largest state, the handshake's, for the connection's whole life: a
/// WebSocket connection carried 3.4 KB of upgrade state (issue 20).
pub(crate) struct Stage(Pin<Box<dyn Future<Output = Option<Stage>> + Send>>);

impl Stage {
    /// A stage that may hand over to another.
    pub(crate) fn new(stage: impl Future<Output = Option<Stage>> + Send + 'static) -> Self {
        Self(Box::pin(stage))
    }

    /// The last stage (the protocol's driver, or a page served).
    pub(crate) fn last(stage: impl Future<Output = ()> + Send + 'static) -> Self {
        Self::new(futures_util::FutureExt::map(stage, |()| None))
    }
}

impl Future for Stage {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match self.0.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(()),
                // The finished stage's box goes here.
                Poll::Ready(Some(next)) => *self = next,
            }
        }
    }
}

/// Starts the task of one accepted TCP connection on a listener of
/// `kind`; `tail` is what the task holds besides the connection (see
/// [`super::listener::ConnectionTask`]).
///
/// A plain MQTT, STOMP or AMQP connection's task is its driver itself:
/// one allocation for the tokio task, the driver and the protocol state
/// (issue 20: the task and the boxed driver beside it were the largest
/// items of an idle connection). Every other path (TLS, WebSocket,
/// protocol detection, the cluster's proxy) runs as a boxed future of its
/// own inside the task, which boxes its driver once the protocol is known.
pub(crate) fn spawn(
    kind: ListenerKind,
    stream: tokio::net::TcpStream,
    peer: Peer,
    conn_id: u64,
    shared: Arc<Shared>,
    tail: TaskTail,
) {
    let plain = match kind {
        ListenerKind::Mqtt => Some(Wire::Mqtt),
        ListenerKind::Stomp => Some(Wire::Stomp),
        ListenerKind::Amqp => Some(Wire::Amqp),
        _ => None,
    };
    match plain {
        Some(wire) if super::proxy::applies(&shared, wire, peer.listener).is_none() => {
            let parker = shared.parker.clone();
            serve_wire(wire, stream, peer, conn_id, shared, Spawn(tail, parker));
        }
        None if kind == ListenerKind::WebSocket && shared.parker.is_some() => {
            let parker = shared.parker.clone();
            let upgrade = Box::pin(super::ws::upgrade(stream, peer, conn_id, shared));
            tokio::spawn(WsTask {
                stage: WsStage::Upgrade(upgrade),
                tail: Some(tail),
                parker,
                conn_id,
            });
        }
        _ => {
            let connection = serve(kind, stream, peer, conn_id, shared);
            tokio::spawn(ConnectionTask::new(connection, tail));
        }
    }
}

/// Serves one accepted TCP connection on a listener of `kind`.
///
/// A plain function returning the first stage, not an `async fn`: a
/// task's allocation is the size of its future, and an `async fn` keeps
/// its arguments in its state for its whole life even once they are moved
/// on, so each level of `async` between the accept and the driver stored
/// the peer, the socket and the shared state again (the task measured
/// 896 B in a debug build, issue 20). Each path is boxed on its own too:
/// inline, a plain MQTT connection paid for the TLS handshake and
/// WebSocket states it never uses (the future measured 11.8 KB).
pub(crate) fn serve(
    kind: ListenerKind,
    stream: tokio::net::TcpStream,
    peer: Peer,
    conn_id: u64,
    shared: Arc<Shared>,
) -> Stage {
    match kind {
        ListenerKind::Mqtt => run_wire(Wire::Mqtt, stream, peer, conn_id, shared),
        ListenerKind::Stomp => run_wire(Wire::Stomp, stream, peer, conn_id, shared),
        ListenerKind::Amqp => run_wire(Wire::Amqp, stream, peer, conn_id, shared),
        ListenerKind::WebSocket => Stage::new(super::ws::serve(stream, peer, conn_id, shared)),
        ListenerKind::Metrics => {
            Stage::last(super::ws::serve_metrics(stream, peer, conn_id, shared))
        }
        ListenerKind::Any => {
            let tls = shared.tls.clone();
            Stage::new(super::detect::serve_any(stream, peer, conn_id, shared, tls))
        }
        _ => Stage::new(serve_tls(kind, stream, peer, conn_id, shared)),
    }
}

/// A TLS listener's connection: the handshake, then its protocol's stage.
async fn serve_tls(
    kind: ListenerKind,
    stream: tokio::net::TcpStream,
    mut peer: Peer,
    conn_id: u64,
    shared: Arc<Shared>,
) -> Option<Stage> {
    let Some(acceptor) = shared.tls.clone() else {
        tracing::warn!(listener = kind.key(), %peer, "TLS listener without [tls]; closing");
        return None;
    };
    let timeout = super::tls::handshake_timeout(&shared.config.tls);
    // A failed handshake is logged by `accept` and closes only this connection.
    let (stream, certificate_user) =
        super::tls::accept(&acceptor, stream, peer.addr, timeout, &shared.tls_log)
            .await
            .ok()?;
    peer.certificate_user = certificate_user;
    peer.tls = true;
    peer.sni_host = super::tls::sni_host(&stream);
    Some(match kind {
        ListenerKind::Mqtts => run_wire(Wire::Mqtt, stream, peer, conn_id, shared),
        ListenerKind::Stomps => run_wire(Wire::Stomp, stream, peer, conn_id, shared),
        ListenerKind::Amqps => run_wire(Wire::Amqp, stream, peer, conn_id, shared),
        _ => Stage::new(super::ws::serve(stream, peer, conn_id, shared)),
    })
}

/// Runs the state machine of `wire` over any byte transport; with the
/// cluster's proxy on, a client that belongs on another node is relayed
/// there instead (`proxy`).
///
/// A plain function returning the stage (see [`serve`]): the proxy's look
/// at the first frame is a stage of its own, so a connection served here
/// holds no proxy state.
pub(crate) fn run_wire<T>(wire: Wire, io: T, peer: Peer, conn_id: u64, shared: Arc<Shared>) -> Stage
where
    T: driver::Transport + 'static,
{
    if let Some((node, limits)) = super::proxy::applies(&shared, wire, peer.listener) {
        return Stage::new(async move {
            let verdict =
                super::proxy::intercept(wire, io, peer, conn_id, &shared, &node, limits).await;
            match verdict {
                super::proxy::Verdict::ServeHere(io, peer) => {
                    Some(serve_wire(wire, io, peer, conn_id, shared, Boxed))
                }
                _ => None,
            }
        });
    }
    serve_wire(wire, io, peer, conn_id, shared, Boxed)
}

/// What becomes of a connection's driver once it is built.
pub(crate) trait Launch<T> {
    type Output;
    fn launch<C: ProtocolConnection>(self, driver: Driver<C, T>) -> Self::Output;
}

/// Boxes the driver as the last stage of a connection whose task already
/// runs (TLS, WebSocket, protocol detection, the proxy's verdict).
struct Boxed;

impl<T: driver::Transport + 'static> Launch<T> for Boxed {
    type Output = Stage;
    fn launch<C: ProtocolConnection>(self, driver: Driver<C, T>) -> Stage {
        Stage::last(driver)
    }
}

/// Spawns the driver as the connection's task (plain TCP, or a plain
/// WebSocket once upgraded), one the server's parker can take over while
/// the connection is idle (see `parking`) if the server has one.
struct Spawn(TaskTail, Option<Arc<Parker>>);

impl<T: ParkableIo> Launch<T> for Spawn {
    type Output = ();
    fn launch<C: ProtocolConnection>(self, driver: Driver<C, T>) {
        match self.1 {
            Some(parker) => {
                tokio::spawn(ParkableTask::new(driver, self.0, parker));
            }
            None => {
                tokio::spawn(ConnectionTask::new(driver, self.0));
            }
        }
    }
}

/// The task of a connection of the plain WebSocket listener while it is
/// upgraded (issue 20): the HTTP request, then, with the protocol known,
/// its driver spawned as a task of its own that the parker can take over
/// (see `parking`), as a plain TCP connection's is, and this task ends.
/// The upgrade's state is boxed and gone with it. A connection the
/// cluster's proxy relays goes on here, as a stage, and is not parked.
struct WsTask {
    stage: WsStage,
    tail: Option<TaskTail>,
    parker: Option<Arc<Parker>>,
    conn_id: u64,
}

type WsUpgrade = Pin<Box<dyn Future<Output = Option<WsUpgraded>> + Send>>;
type WsUpgraded = super::ws::Upgraded<tokio::net::TcpStream>;

enum WsStage {
    Upgrade(WsUpgrade),
    /// Relayed by the proxy (or the proxy's verdict served it here).
    Then(Stage),
}

impl Future for WsTask {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.tail.is_none() {
            return Poll::Ready(());
        }
        let ready = match &mut this.stage {
            WsStage::Upgrade(upgrade) => match upgrade.as_mut().poll(cx) {
                Poll::Pending => false,
                Poll::Ready(None) => true,
                Poll::Ready(Some(up)) => {
                    let wire = Wire::from(up.wire);
                    if super::proxy::applies(&up.shared, wire, up.peer.listener).is_some() {
                        let stage = run_wire(wire, up.stream, up.peer, this.conn_id, up.shared);
                        this.stage = WsStage::Then(stage);
                        // The new stage's first poll, with this one's waker.
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    if let Some(tail) = this.tail.take() {
                        let spawn = Spawn(tail, this.parker.take());
                        serve_wire(wire, up.stream, up.peer, this.conn_id, up.shared, spawn);
                    }
                    return Poll::Ready(());
                }
            },
            WsStage::Then(stage) => Pin::new(stage).poll(cx).is_ready(),
        };
        if ready || this.tail.as_mut().is_some_and(|tail| tail.poll_expired(cx)) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// Runs the state machine of `wire` over any byte transport, here.
///
/// The setup happens when this is called; `launch` gets the driver, which
/// owns what the connection needs while it runs (its registry entry
/// among them), not the arguments (see [`serve`]).
fn serve_wire<T, L>(
    wire: Wire,
    io: T,
    peer: Peer,
    conn_id: u64,
    shared: Arc<Shared>,
    launch: L,
) -> L::Output
where
    T: driver::Transport + 'static,
    L: Launch<T>,
{
    // A debug span, not an info one: an enabled span costs each connection
    // its slot in the subscriber's registry, an extension map and the
    // formatted fields, about 740 B (10,000 idle MQTT connections: 4,873 B
    // each at `info`, 4,135 B with the span disabled; issue 20), the largest
    // single item of an idle connection. The few info and warn lines a
    // connection logs name it by `conn_id` themselves; `ROSETTA_LOG=debug`
    // brings the span (id, protocol, peer) back on every line.
    let span = tracing::debug_span!("conn", id = conn_id, proto = wire.name(), %peer);
    let limits = &shared.config.broker;
    let (sink, events) = driver::event_channel_with(
        Some(limits.delivery_buffer_bytes_max),
        Arc::clone(&shared.hard_stop),
    );
    let registered = shared.connections.enter(
        crate::connections::ConnectionInfo {
            id: conn_id,
            protocol: wire.name(),
            transport: peer.transport(),
            peer: peer.addr,
            tls: peer.tls,
            connected_at_ms: peer.accepted_at_ms,
        },
        sink.clone(),
    );
    let parts = DriverParts {
        conn_id,
        events,
        slow_consumer_timeout: (limits.slow_consumer_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(limits.slow_consumer_timeout_ms)),
        span,
        registered: Some(registered),
    };
    // The adapter's broker: the core, and the signal that the connection
    // has authenticated (see `admission`).
    let broker: Arc<dyn Broker> = peer.admission.broker(shared.cluster.clone(), &peer);
    let now = Instant::now();
    let user = peer.certificate_user;
    match wire {
        Wire::Stomp => {
            let config = Arc::clone(&shared.adapters.stomp);
            let conn = rosetta_stomp::StompConnection::new(config, broker, sink, conn_id, now)
                .with_certificate_user(user);
            launch.launch(driver::drive(conn, io, parts))
        }
        Wire::Mqtt => {
            let config = Arc::clone(&shared.adapters.mqtt);
            let conn = rosetta_mqtt::MqttConnection::new(config, broker, sink, conn_id, now)
                .with_certificate_user(user);
            launch.launch(driver::drive(conn, io, parts))
        }
        Wire::Amqp => {
            let config = Arc::clone(&shared.adapters.amqp);
            let conn = rosetta_amqp::AmqpConnection::new(config, broker, sink, conn_id, now)
                .with_certificate_user(user);
            launch.launch(driver::drive(conn, io, parts))
        }
    }
}

/// The adapters' configurations, made once per server from its
/// configuration and shared by every connection (a copy each cost a
/// connection 72 to 136 bytes, issue 20).
pub(crate) struct AdapterConfigs {
    pub(crate) mqtt: Arc<rosetta_mqtt::MqttConfig>,
    pub(crate) stomp: Arc<rosetta_stomp::StompConfig>,
    pub(crate) amqp: Arc<rosetta_amqp::AmqpConfig>,
}

impl AdapterConfigs {
    pub(crate) fn new(config: &rosetta_config::Config) -> Self {
        Self {
            mqtt: Arc::new(mqtt_config(config)),
            stomp: Arc::new(stomp_config(config)),
            amqp: Arc::new(amqp_config(config)),
        }
    }
}

/// The `[stomp]` section applied over the adapter's defaults.
fn stomp_config(config: &rosetta_config::Config) -> rosetta_stomp::StompConfig {
    let c = &config.stomp;
    rosetta_stomp::StompConfig {
        frame_size_max_bytes: config.stomp_frame_size_max() as usize,
        body_size_max_bytes: config.stomp_body_size_max() as usize,
        headers_max: c.header_count_max as usize,
        header_line_max_bytes: c.header_size_max_bytes as usize,
        heart_beat_send_min_ms: u64::from(c.heartbeat_send_ms),
        heart_beat_receive_min_ms: u64::from(c.heartbeat_receive_ms),
        prefetch_default: c.prefetch_default,
        prefetch_max: c.prefetch_max,
        subscriptions_max: c.subscriptions_max as usize,
        transactions_max: c.transactions_max as usize,
        connect_timeout_ms: config.broker.connect_timeout_ms,
        ..Default::default()
    }
}

/// The `[mqtt]` section applied over the adapter's defaults.
fn mqtt_config(config: &rosetta_config::Config) -> rosetta_mqtt::MqttConfig {
    let c = &config.mqtt;
    rosetta_mqtt::MqttConfig {
        keep_alive_max_s: c.keep_alive_max_s,
        receive_maximum: c.receive_maximum,
        packet_size_max_bytes: config.mqtt_packet_size_max(),
        qos_max: c.qos_max,
        retain_available: c.retain_available,
        wildcard_subscriptions_available: c.wildcard_available,
        shared_subscriptions_available: c.shared_available,
        topic_alias_max: c.topic_alias_max,
        session_expiry_max_s: c.session_expiry_max_s,
        subscriptions_max: c.subscriptions_max as usize,
        own_subscriptions_max: c.shared_subscriptions_max as usize,
        connect_timeout_ms: config.broker.connect_timeout_ms,
        ..Default::default()
    }
}

/// The `[amqp]` section applied over the adapter's defaults.
fn amqp_config(config: &rosetta_config::Config) -> rosetta_amqp::AmqpConfig {
    let c = &config.amqp;
    rosetta_amqp::AmqpConfig {
        frame_size_max_bytes: c.frame_size_max_bytes,
        message_size_max_bytes: u64::from(config.amqp_message_size_max()),
        channel_max: c.channel_max,
        // handle-max is the highest handle, so one more link than it.
        links_per_session_max: c.handle_max.saturating_add(1),
        links_per_connection_max: c.links_per_connection_max as usize,
        idle_timeout_ms: c.idle_timeout_ms,
        sender_credit_window: c.link_credit_window,
        handshake_timeout_ms: config.broker.connect_timeout_ms,
        ..Default::default()
    }
}
