//! The sans-IO MQTT server connection.
//!
//! States are types: [`State::AwaitConnect`] accepts only CONNECT; the
//! [`Open`] state exists only once a CONNECT was authenticated and a core
//! session opened, so every other packet handler takes an `&mut Open` and
//! cannot run before authentication. A fatal error moves to
//! [`State::Closed`], after which input is ignored.
//!
//! A CONNECT naming SCRAM-SHA-256 passes through [`State::Authenticating`]
//! (only AUTH and DISCONNECT accepted) before `Open` exists.
//!
//! A CONNECT whose password the broker checks elsewhere
//! ([`Broker::start_login`] answered `Pending`) waits in
//! [`State::CheckingLogin`]: nothing more is parsed and
//! [`MqttConnection::wants_input`] is false, so packets pipelined behind
//! the CONNECT stay in the decoder's buffer. The result comes as
//! [`SessionEvent::LoginChecked`]; then the CONNACK is written and the
//! buffered packets are handled, in order. Anonymous, certificate and SCRAM
//! logins are decided at once.
//!
//! Submodules: [`handshake`] (CONNECT/CONNACK, sessions), [`auth`]
//! (enhanced authentication and re-authentication), [`inbound`]
//! (client PUBLISH, PUBREL, ack ordering), [`outbound`] (deliveries and
//! their acks), [`subscribe`] (SUBSCRIBE/UNSUBSCRIBE).

mod auth;
mod handshake;
mod inbound;
mod outbound;
mod placement;
mod subscribe;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
// Wall-clock ms from the process's one clock anchor, not one per
// connection (24 B each, issue 20).
use rosetta_neutral::clock::epoch_ms;
use rosetta_neutral::{
    Broker, CloseKind, ConsumerId, EventSink, KickReason, Session, SessionEvent,
};

use crate::codec::{encode, Decoder, Inbound, Version};
use crate::config::MqttConfig;
use crate::error::MqttError;
use crate::inflight::Outbound;
use crate::own_subs::OwnSub;

use inbound::PendingAck;

/// Buffer capacity kept between bursts; larger buffers are released once
/// empty, so 10,000 idle connections cost little memory each.
const IDLE_BUFFER_KEEP_BYTES: usize = 4096;

/// What opening the session needs and an open connection does not: the
/// broker (login, placement, [`Broker::open_session`]) and the sink the
/// session takes. Carried by the states before [`Open`]; once the session
/// is open the sink is the session's and the broker is dropped, unless
/// re-authentication needs it ([`Reauth`]). A parked connection so holds
/// neither: 32 B less in the connection and the adapter's broker handle
/// (one allocation per connection) freed (issue 20).
struct Opening {
    broker: Arc<dyn Broker>,
    sink: Arc<dyn EventSink>,
}

/// A subscription with a consumer of its own: a shared subscription's
/// queue, or a queue consumed directly through `$queue/<name>`.
#[derive(Debug, Clone)]
struct SharedSub {
    consumer: ConsumerId,
    /// QoS granted for a `$queue/` subscription, whose deliveries match no
    /// binding (a shared subscription's come with their binding's).
    queue_qos: Option<u8>,
    /// What a resumed session needs to re-create it (persisted).
    saved: OwnSub,
}

/// The subscriptions with a consumer of their own, by full filter: a
/// `BTreeMap` made at the first one (8 B in [`Open`] rather than 24; most
/// connections never have one, issue 20).
#[derive(Default)]
#[allow(clippy::box_collection)] // the box is the point: 8 B while empty
struct OwnSubs(Option<Box<BTreeMap<String, SharedSub>>>);

impl OwnSubs {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.len())
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn values(&self) -> impl Iterator<Item = &SharedSub> {
        self.0.iter().flat_map(|m| m.values())
    }

    fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().flat_map(|m| m.keys())
    }

    fn contains_key(&self, filter: &str) -> bool {
        self.0.as_ref().is_some_and(|m| m.contains_key(filter))
    }

    fn get_mut(&mut self, filter: &str) -> Option<&mut SharedSub> {
        self.0.as_mut()?.get_mut(filter)
    }

    fn insert(&mut self, filter: String, sub: SharedSub) {
        self.0.get_or_insert_with(Box::default).insert(filter, sub);
    }

    fn remove(&mut self, filter: &str) -> Option<SharedSub> {
        self.0.as_mut()?.remove(filter)
    }

    fn retain(&mut self, keep: impl FnMut(&String, &mut SharedSub) -> bool) {
        if let Some(m) = &mut self.0 {
            m.retain(keep);
        }
    }
}

/// The established state: authenticated, with a core session.
///
/// One per connection, idle ones included, so what only some sessions use
/// (topic aliases, enhanced authentication) is boxed apart and allocated
/// when first needed.
struct Open {
    version: Version,
    session: Box<dyn Session>,
    /// The client id, shared with the core session.
    client_id: Arc<str>,
    /// The consumer of the session queue (`$mqtt/<client id>`, see
    /// [`Open::session_queue`]); `None` until the first subscription of a
    /// clean, non-lasting session creates the queue.
    session_consumer: Option<ConsumerId>,
    /// Session expiry granted at CONNECT (v5); 0 for a clean 3.1.1 session.
    session_expiry_s: u32,
    /// Consumer window: min(client receive maximum, our cap). Also the
    /// most QoS 1/2 deliveries unacknowledged at once toward the client:
    /// consumer windows enforce it per consumer, the outbound flows across
    /// the session consumer and the shared-subscription consumers together.
    window: u32,
    /// Subscriptions with a consumer of their own (shared, `$queue/`), by
    /// full filter (`$share/g/f`, `$queue/q`). Ordered, so the persisted
    /// list is stable.
    shared: OwnSubs,
    /// 1.5 × the effective keep-alive, in milliseconds (at most 65,535 s
    /// × 1,500); 0 when disabled.
    keep_alive_timeout_ms: u32,
    /// When the last complete control packet arrived (bytes of an
    /// unfinished one do not count).
    last_input: Instant,
    /// Client's maximum packet size (v5), in bytes.
    client_packet_max: Option<u32>,
    /// Client's topic alias maximum (v5).
    client_alias_max: u16,
    /// Client's request-problem-information (v5): reason strings allowed.
    problem_info: bool,
    /// The QoS flows both ways, made by the first delivery or QoS 1/2
    /// PUBLISH (see [`Flows`]); `None` for a connection that has had no
    /// traffic, such as a silent device.
    flows: Option<Box<Flows>>,
    /// Topic aliases (v5), from the first one either side assigns.
    aliases: Option<Box<Aliases>>,
    /// The enhanced authentication of the CONNECT, if it had one.
    reauth: Option<Box<Reauth>>,
}

/// Topic aliases of a v5 connection.
#[derive(Default)]
struct Aliases {
    /// Aliases we assigned toward the client.
    outgoing: HashMap<String, u16>,
    /// Aliases the client assigned toward us.
    incoming: HashMap<u16, String>,
}

/// What only a connection with traffic uses: the packet ids and acks of
/// QoS 1/2 flows both ways and the settlements batched per read or write.
/// Boxed apart from [`Open`] and made at first use, one branch away on the
/// packet path (issue 20: about 190 B that a connection which never
/// carried a message, a silent device, does not hold). Kept once made: a
/// busy connection empties it after every write, so freeing it then would
/// allocate it again with the next message.
#[derive(Default)]
struct Flows {
    outbound: Outbound,
    /// Deliveries waiting for an in-flight slot, in arrival order. Bounded
    /// by the consumers' windows.
    held: VecDeque<rosetta_neutral::Delivery>,
    /// QoS 0 deliveries written to `out` but not yet handed to the driver:
    /// settled in `poll_transmit`, so a consumer's window stays taken
    /// while the socket is not draining (slow-consumer backpressure).
    unsent_qos0: Vec<(ConsumerId, rosetta_neutral::DeliveryTag)>,
    /// QoS 1 deliveries the client acknowledged in the current read,
    /// settled together at its end.
    acked: Vec<(ConsumerId, rosetta_neutral::DeliveryTag)>,
    /// Acks in PUBLISH arrival order, each waiting for its commits.
    acks: VecDeque<PendingAck>,
    /// Inbound QoS 1 publishes not yet acknowledged.
    qos1_pending: usize,
    /// Inbound QoS 2 packet ids routed and awaiting PUBREL (persisted).
    awaiting_rel: BTreeSet<u16>,
}

/// Out of line and cold, so that the packet path that reaches the flows
/// inlines one branch and no allocation: inlined, the allocation made the
/// compiler copy each delivery (about 30 instructions) on its way through
/// `handle_event` (callgrind, `bench/instructions.sh`).
#[cold]
#[inline(never)]
fn new_flows() -> Box<Flows> {
    Box::default()
}

/// What AUTH re-authentication needs: the connection authenticated with an
/// enhanced method at CONNECT.
struct Reauth {
    /// For the credentials of a re-authentication.
    broker: Arc<dyn Broker>,
    /// The method of the CONNECT (AUTH re-authentication uses it).
    method: String,
    /// The authenticated user (a re-authentication must prove the same).
    user: Option<String>,
    /// A re-authentication in progress: server-first sent.
    pending: Option<Box<crate::scram::ScramPending>>,
}

impl Open {
    /// The session queue's name, made when needed rather than kept: a
    /// subscription, an unsubscription or an expiry change asks for it.
    fn session_queue(&self) -> String {
        rosetta_neutral::mqtt_session_queue(&self.client_id)
    }

    fn aliases(&mut self) -> &mut Aliases {
        self.aliases.get_or_insert_with(Box::default)
    }

    /// The QoS flows, made at first use.
    #[inline]
    fn flows(&mut self) -> &mut Flows {
        self.flows.get_or_insert_with(new_flows)
    }

    /// Acks waiting for their commits (none before the first flow).
    fn acks_waiting(&self) -> usize {
        self.flows.as_ref().map_or(0, |f| f.acks.len())
    }

    /// Frees the flows if nothing is in them: nothing in flight either
    /// way, held, or waiting to be settled. A fresh box starts packet ids
    /// from 1 again, which MQTT allows once the earlier ones completed.
    fn free_idle_flows(&mut self) {
        if self.flows.as_deref().is_some_and(Flows::is_idle) {
            self.flows = None;
        }
    }
}

impl Flows {
    fn is_idle(&self) -> bool {
        self.outbound.len() == 0
            && self.held.is_empty()
            && self.unsent_qos0.is_empty()
            && self.acked.is_empty()
            && self.acks.is_empty()
            && self.qos1_pending == 0
            && self.awaiting_rel.is_empty()
    }
}

/// Waiting for CONNECT: what only the login needs, boxed so that the
/// connection does not carry it once open.
struct AwaitConnect {
    deadline: Instant,
    /// User named by a verified TLS client certificate, if any.
    certificate_user: Option<String>,
    opening: Opening,
}

enum State {
    AwaitConnect(Box<AwaitConnect>),
    /// CONNECT named SCRAM-SHA-256; the AUTH exchange is under way.
    Authenticating(Box<auth::Authenticating>),
    /// The broker is checking the CONNECT's password; input waits.
    CheckingLogin(Box<handshake::CheckingLogin>),
    Open(Box<Open>),
    Closed,
}

/// One MQTT 3.1.1/5.0 client connection, driven by bytes, events and time.
pub struct MqttConnection {
    /// Shared by every connection of a listener: a copy per connection
    /// cost each one 72 bytes.
    config: Arc<MqttConfig>,
    conn_id: u64,
    decoder: Decoder,
    out: BytesMut,
    state: State,
}

impl MqttConnection {
    /// A connection waiting for CONNECT. `sink` is handed to
    /// [`Broker::open_session`] after authentication.
    pub fn new(
        config: impl Into<Arc<MqttConfig>>,
        broker: Arc<dyn Broker>,
        sink: Arc<dyn EventSink>,
        conn_id: u64,
        now: Instant,
    ) -> Self {
        let config = config.into();
        let packet_max = usize::try_from(config.packet_size_max_bytes).unwrap_or(usize::MAX);
        let deadline = now
            .checked_add(Duration::from_millis(config.connect_timeout_ms))
            .unwrap_or(now);
        Self {
            decoder: Decoder::new(packet_max),
            config,
            conn_id,
            out: BytesMut::new(),
            state: State::AwaitConnect(Box::new(AwaitConnect {
                deadline,
                certificate_user: None,
                opening: Opening { broker, sink },
            })),
        }
    }

    /// The user named by the verified TLS client certificate of this
    /// connection (the server's TLS layer extracts it). With it, a client
    /// that sends no password is that user
    /// ([`Broker::authenticate_connection`]).
    #[must_use]
    pub fn with_certificate_user(mut self, user: Option<String>) -> Self {
        if let State::AwaitConnect(waiting) = &mut self.state {
            waiting.certificate_user = user;
        }
        self
    }

    /// Bytes read from the socket (any split: partial frames, many frames).
    pub fn handle_input(&mut self, now: Instant, data: &[u8]) {
        if matches!(self.state, State::Closed) {
            return;
        }
        self.decoder.extend(data);
        self.handle_buffered_input(now);
    }

    /// The connection is quiet and about to park: its QoS flows go if they
    /// are empty, so a device that once had traffic sleeps as small as one
    /// that never had (issue 20: the box and its tables, 160 B and more).
    /// The next message makes them again.
    pub fn shrink_when_parked(&mut self) {
        if let State::Open(open) = &mut self.state {
            open.free_idle_flows();
        }
    }

    /// The connection's delivery budget has room again after the core held
    /// deliveries back for lack of it: the session dispatches to its
    /// consumers again (their deliveries arrive as events).
    pub fn resume_deliveries(&mut self) {
        if let State::Open(open) = &mut self.state {
            open.session.resume_deliveries();
        }
    }

    /// The parse buffer, for a driver that reads straight into it; call
    /// [`Self::handle_buffered_input`] after appending.
    pub fn input_buffer(&mut self) -> &mut BytesMut {
        self.decoder.buffer_mut()
    }

    /// Parses what was appended to [`Self::input_buffer`].
    ///
    /// Only a complete control packet restarts the keep-alive timer
    /// (MQTT-3.1.2-24): a packet dribbled a byte at a time must not keep a
    /// connection open forever.
    pub fn handle_buffered_input(&mut self, now: Instant) {
        loop {
            if matches!(self.state, State::Closed | State::CheckingLogin(_)) {
                // Closed, or waiting for a password check: what is buffered
                // stays there until the result (`on_login_checked`).
                return;
            }
            match self.decoder.next_packet() {
                Ok(Some(packet)) => {
                    tracing::trace!(conn_id = self.conn_id, ?packet, "packet in");
                    if let State::Open(open) = &mut self.state {
                        open.last_input = now;
                    }
                    self.handle_packet(now, packet);
                }
                Ok(None) => break,
                Err(e) => {
                    self.fail(MqttError::Codec(e));
                    return;
                }
            }
        }
        if let State::Open(open) = &mut self.state {
            open.settle_acked(self.conn_id);
        }
    }

    fn handle_packet(&mut self, now: Instant, packet: Inbound) {
        let result = match &mut self.state {
            // No packet is parsed while a login is checked.
            State::Closed | State::CheckingLogin(_) => Ok(()),
            State::AwaitConnect(_) => match packet {
                Inbound::Connect(c) => {
                    if let State::AwaitConnect(waiting) =
                        std::mem::replace(&mut self.state, State::Closed)
                    {
                        self.on_connect(now, *waiting, *c);
                    }
                    Ok(())
                }
                _ => Err(MqttError::Protocol("first packet is not CONNECT")),
            },
            // MQTT 5 §4.12: only AUTH and DISCONNECT before CONNACK.
            State::Authenticating(_) => match packet {
                Inbound::Auth(a) => {
                    if let State::Authenticating(auth) =
                        std::mem::replace(&mut self.state, State::Closed)
                    {
                        self.continue_enhanced_auth(now, *auth, *a);
                    }
                    Ok(())
                }
                Inbound::Disconnect(_) => {
                    self.state = State::Closed;
                    Ok(())
                }
                _ => Err(MqttError::Protocol(
                    "only AUTH or DISCONNECT may follow a CONNECT with an authentication method",
                )),
            },
            State::Open(open) => {
                let ctx = Ctx {
                    config: &self.config,
                    conn_id: self.conn_id,
                    now_ms: epoch_ms(now),
                    out: &mut self.out,
                };
                if !matches!(
                    packet,
                    Inbound::Publish(_) | Inbound::PubAck(_) | Inbound::PingReq
                ) {
                    // Batched PUBACK settlements go first, so that nothing
                    // below (an UNSUBSCRIBE cancelling a consumer, say) sees
                    // an acknowledged delivery as still unsettled.
                    open.settle_acked(self.conn_id);
                }
                match packet {
                    Inbound::Connect(_) => Err(MqttError::Protocol("second CONNECT")),
                    Inbound::Publish(p) => open.on_publish(ctx, p),
                    Inbound::PubAck(a) => open.on_puback(ctx, a),
                    Inbound::PubRec(a) => open.on_pubrec(ctx, a),
                    Inbound::PubRel(a) => open.on_pubrel(ctx, a),
                    Inbound::PubComp(a) => open.on_pubcomp(ctx, a),
                    Inbound::Subscribe(s) => open.on_subscribe(ctx, *s),
                    Inbound::Unsubscribe(u) => open.on_unsubscribe(ctx, u),
                    Inbound::PingReq => {
                        encode::pingresp(ctx.out);
                        Ok(())
                    }
                    Inbound::Disconnect(d) => match open.on_disconnect(&self.config, &d) {
                        Ok(kind) => {
                            tracing::debug!(
                                conn_id = self.conn_id,
                                reason = d.reason,
                                "client DISCONNECT"
                            );
                            open.settle_before_close(self.conn_id);
                            open.session.close(kind);
                            self.state = State::Closed;
                            Ok(())
                        }
                        Err(e) => Err(e),
                    },
                    Inbound::Auth(a) => open.on_auth(ctx, *a),
                }
            }
        };
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// An event the core sent to this connection's sink.
    pub fn handle_event(&mut self, now: Instant, event: SessionEvent) {
        if let SessionEvent::LoginChecked { result } = event {
            return self.on_login_checked(now, result);
        }
        let State::Open(open) = &mut self.state else {
            // Events for a session already closed (late commits, deliveries
            // racing the close) have nobody to go to.
            return;
        };
        let ctx = Ctx {
            config: &self.config,
            conn_id: self.conn_id,
            now_ms: epoch_ms(now),
            out: &mut self.out,
        };
        let result = match event {
            SessionEvent::Delivery(d) => open.on_delivery(ctx, d),
            SessionEvent::Committed { ticket, result } => open.on_committed(ctx, ticket, result),
            SessionEvent::CommittedRun { tickets } => {
                let mut ctx = ctx;
                tickets
                    .into_iter()
                    .try_for_each(|t| open.on_committed(ctx.reborrow(), t, Ok(())))
            }
            // MQTT has no credit drain and no browsers.
            SessionEvent::Drained { .. } | SessionEvent::BrowseEnded { .. } => Ok(()),
            // A `$queue/` delivery's lease ran out and it went back to the
            // queue (to another member, or to us again under a new tag).
            // Its packet id stays in use until the client's PUBACK, which
            // MQTT requires and which the core then refuses to apply
            // (`settle_many` skips it): MQTT has no way to say "too late".
            SessionEvent::LeaseExpired { consumer, tag } => {
                tracing::debug!(
                    conn_id = ctx.conn_id,
                    ?consumer,
                    ?tag,
                    "lease expired: its PUBACK will be ignored"
                );
                Ok(())
            }
            SessionEvent::ConsumerClosed { consumer, reason } => {
                if Some(consumer) == open.session_consumer {
                    Err(MqttError::Broker(reason))
                } else {
                    // Its queue was deleted: the subscription is gone, for
                    // a resumed session too.
                    let before = open.shared.len();
                    open.shared.retain(|_, s| s.consumer != consumer);
                    if open.shared.len() != before {
                        open.persist_own_subs(ctx.conn_id);
                    }
                    Ok(())
                }
            }
            SessionEvent::Kicked { reason } => Err(match reason {
                KickReason::TakenOver => MqttError::SessionTakenOver,
                KickReason::ServerShutdown => MqttError::ServerShutdown,
                KickReason::Administrative(text) => MqttError::AdministrativeAction(text),
            }),
            // Handled above: a session is open only after its login.
            SessionEvent::LoginChecked { .. } => Ok(()),
        };
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// Fires the keep-alive or connect timeout when due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.wants_input() {
            if let State::Open(open) = &mut self.state {
                // We stopped reading (back-pressure): the client's packets,
                // PINGREQ included, wait in the socket; its silence is ours.
                open.last_input = now;
            }
        }
        match self.poll_timeout() {
            Some(due) if now >= due => {}
            _ => return,
        }
        let err = match self.state {
            State::AwaitConnect(_) | State::Authenticating(_) | State::CheckingLogin(_) => {
                MqttError::ConnectTimeout
            }
            _ => MqttError::KeepAliveTimeout,
        };
        self.fail(err);
    }

    /// When [`Self::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::AwaitConnect(waiting) => Some(waiting.deadline),
            State::Authenticating(a) => Some(a.deadline),
            State::CheckingLogin(c) => Some(c.deadline),
            State::Open(open) => (open.keep_alive_timeout_ms > 0).then(|| {
                open.last_input + Duration::from_millis(u64::from(open.keep_alive_timeout_ms))
            }),
            State::Closed => None,
        }
    }

    /// Appends all bytes that should be written to the socket now.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) {
        if out.is_empty() {
            // Hand the buffer over rather than copy it (a `BytesMut` that
            // was never split becomes a `Vec` without copying). The next
            // one starts at this one's size, so a busy connection does not
            // grow it again step by step.
            let next = BytesMut::with_capacity(self.out.len().min(IDLE_BUFFER_KEEP_BYTES));
            *out = Vec::from(std::mem::replace(&mut self.out, next));
        } else {
            out.extend_from_slice(&self.out);
            self.out.clear();
        }
        if let State::Open(open) = &mut self.state {
            open.settle_sent_qos0(self.conn_id);
        }
        // An idle connection should not keep a burst's buffer.
        if self.out.capacity() > IDLE_BUFFER_KEEP_BYTES {
            self.out = BytesMut::new();
        }
        self.decoder.shrink_if_idle(IDLE_BUFFER_KEEP_BYTES);
    }

    /// False while the driver should stop reading: a password check is
    /// under way, too many acks wait for durable commits, or the core holds
    /// producers back.
    pub fn wants_input(&self) -> bool {
        match &self.state {
            State::AwaitConnect(_) | State::Authenticating(_) => true,
            State::CheckingLogin(_) => false,
            State::Open(open) => {
                open.acks_waiting() < self.config.pending_acks_max
                    && !open.session.producer_blocked()
            }
            State::Closed => false,
        }
    }

    /// True once finished: write what `poll_transmit` gave, then close.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// The transport died: close the session abnormally (will published).
    pub fn handle_transport_closed(&mut self, _now: Instant) {
        if let State::Open(open) = &mut self.state {
            tracing::debug!(conn_id = self.conn_id, "transport closed");
            // What the client acknowledged is settled; what was written but
            // maybe never sent returns to the queue.
            open.settle_acked(self.conn_id);
            open.session.close(CloseKind::Abnormal);
        }
        self.state = State::Closed;
    }

    /// The client stopped reading while its deliveries filled the
    /// connection's buffer for too long: a v5 client is told why
    /// (DISCONNECT 0x97, which it may never read) and the session closes
    /// abnormally, as for any connection the server drops.
    pub fn handle_slow_consumer(&mut self, _now: Instant) {
        self.fail(MqttError::SlowConsumer);
    }

    /// The negotiated protocol version, once connected.
    pub fn version(&self) -> Option<Version> {
        match &self.state {
            State::Open(open) => Some(open.version),
            _ => self.decoder.version(),
        }
    }

    /// The client id of the session (assigned if the client sent none).
    pub fn client_id(&self) -> Option<&str> {
        match &self.state {
            State::Open(open) => Some(&open.client_id),
            _ => None,
        }
    }

    /// Closes because of `err`: tells a v5 client why (DISCONNECT), closes
    /// the session abnormally (so the will is published), logs once.
    fn fail(&mut self, err: MqttError) {
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Open(mut open) => {
                tracing::debug!(conn_id = self.conn_id, error = %err, "closing connection");
                if open.version == Version::V5 {
                    // A Reason String even when the client asked for no
                    // problem information: DISCONNECT is one of the two
                    // packets where that is allowed (MQTT 5 §3.1.2.11.7).
                    let text = err.to_string();
                    encode::disconnect_v5(
                        err.reason_code(),
                        Some(&text),
                        open.client_packet_max,
                        &mut self.out,
                    );
                }
                // Already written: the driver sends them before closing.
                open.settle_before_close(self.conn_id);
                open.session.close(CloseKind::Abnormal);
            }
            State::AwaitConnect(_) => {
                tracing::debug!(conn_id = self.conn_id, error = %err, "closing before CONNECT completed");
                self.reject_connect(&err);
            }
            State::Authenticating(auth) => {
                tracing::debug!(conn_id = self.conn_id, error = %err, "closing during authentication");
                // A v5 client mid-exchange gets a CONNACK with the reason;
                // one that let the deadline pass just loses the connection.
                if err != MqttError::ConnectTimeout {
                    let refusal = handshake::Refusal::new(err.reason_code(), err.to_string());
                    self.write_refusal(Version::V5, &refusal, auth.client_packet_max());
                }
            }
            State::CheckingLogin(_) => {
                // Only the connect deadline gets here (nothing is parsed
                // meanwhile): like any timeout before CONNACK, just close.
                tracing::debug!(conn_id = self.conn_id, error = %err, "closing while the password is checked");
            }
            State::Closed => {}
        }
    }
}

/// What packet handlers of the open state need besides the state itself.
struct Ctx<'a> {
    config: &'a MqttConfig,
    conn_id: u64,
    now_ms: u64,
    out: &'a mut BytesMut,
}

impl Ctx<'_> {
    /// A shorter-lived copy, to pass on while keeping this one.
    fn reborrow(&mut self) -> Ctx<'_> {
        Ctx {
            config: self.config,
            conn_id: self.conn_id,
            now_ms: self.now_ms,
            out: self.out,
        }
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// What an idle connection holds (issue 20, docs/scaling.md "A parked
    /// MQTT connection"): the connection inline in the server's parked
    /// state, and `Open` on its own in jemalloc's 128 B size class. A
    /// field more costs every idle connection a size class.
    #[test]
    fn an_idle_connection_stays_within_its_size_classes() {
        let open = std::mem::size_of::<Open>();
        let conn = std::mem::size_of::<MqttConnection>();
        println!(
            "Open {open} B, MqttConnection {conn} B, Flows (made at first use) {} B",
            std::mem::size_of::<Flows>()
        );
        assert!(open <= 128, "Open: {open} B");
        assert!(conn <= 104, "MqttConnection: {conn} B");
    }
}
