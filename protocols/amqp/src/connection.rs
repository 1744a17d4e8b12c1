//! The connection state machine: protocol headers, SASL, Open/Close, idle
//! timeouts, frame dispatch to sessions, and the core's events.
//!
//! ```text
//!  Header ──SASL hdr──▶ Sasl ──outcome ok──▶ SaslDone ──AMQP hdr──▶ AwaitOpen
//!    │                   │└─ outcome auth ──▶ Closed                  │ Open
//!    │                   └─ PLAIN ──▶ SaslChecking ──LoginChecked──▶ (outcome)
//!    └──AMQP hdr (anonymous allowed)──────────────────────────────────┘
//!  AwaitOpen ──Open──▶ Opened ──Close / error──▶ CloseSent ──Close──▶ Closed
//! ```
//!
//! In `SaslChecking` the broker checks a PLAIN password elsewhere: nothing
//! is parsed and [`AmqpConnection::wants_input`] is false, so what the
//! client pipelined (the AMQP header, Open, Begin...) waits in the
//! decoder's buffer and is handled after the outcome.
//!
//! Every handler returns `Result<(), Fault>`; [`Fault`] says what the error
//! breaks (a link, a session, the connection), and `apply_fault` closes only
//! that. Output frames are appended to one buffer and handed to the driver in
//! [`AmqpConnection::poll_transmit`], which also coalesces the accepted
//! dispositions produced by a burst of commits into ranges.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fe2o3_amqp_types::definitions::Handle;
use fe2o3_amqp_types::performatives::{
    ChannelMax, Close, Detach, End, MaxFrameSize, Open, Performative,
};
use fe2o3_amqp_types::primitives::{Array, Symbol};
use fe2o3_amqp_types::sasl::{SaslCode, SaslInit, SaslMechanisms, SaslOutcome, SaslResponse};
use rosetta_neutral::{
    Broker, CloseKind, ConsumerId, EventSink, KickReason, Principal, Protocol, Session,
    SessionEvent, SessionInfo, Ticket, TxnId,
};
use serde::Serialize;
use tracing::{debug, trace, warn};

use crate::codec;
use crate::config::AmqpConfig;
use crate::descriptor;
use crate::error::AmqpError;
use crate::frame::{
    self, Frame, FrameDecoder, FrameError, ProtocolHeader, FRAME_TYPE_AMQP, FRAME_TYPE_SASL,
    MIN_MAX_FRAME_SIZE, PROTOCOL_ID_AMQP, PROTOCOL_ID_SASL,
};
use crate::idmap::IdMap;
use crate::sasl::{self, SaslServer, SaslStep};
use crate::session::AmqpSession;

/// Capability offered in Open so Qpid JMS uses one anonymous-relay link for
/// all producers without a fixed destination.
const ANONYMOUS_RELAY: &str = "ANONYMOUS-RELAY";

/// What an error breaks.
#[derive(Debug)]
pub(crate) enum Fault {
    /// Close the connection.
    Connection(AmqpError),
    /// End the session the frame arrived on.
    Session(AmqpError),
    /// Detach this link (by handle) with the error.
    Link(u32, AmqpError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first protocol header.
    Header,
    /// SASL frames.
    Sasl,
    /// A PLAIN password is being checked; input waits.
    SaslChecking,
    /// SASL succeeded; waiting for the AMQP protocol header.
    SaslDone,
    /// Headers exchanged; waiting for Open.
    AwaitOpen,
    /// Open exchanged.
    Opened,
    /// We sent Close and wait for the peer's.
    CloseSent,
    /// Done: the driver flushes and closes the socket.
    Closed,
}

/// A durable operation whose [`SessionEvent::Committed`] we wait for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PendingCommit {
    /// An unsettled transfer: dispose it accepted.
    Transfer {
        channel: u16,
        handle: u32,
        serial: u64,
        delivery_id: u32,
    },
    /// A receiver's unsettled outcome (rcv-settle-mode second): settle it
    /// once the outcome is on disk.
    SettleBack {
        channel: u16,
        delivery_id: u32,
        outcome: rosetta_neutral::Outcome,
    },
    /// A discharge on a coordinator link: dispose it once the commit is on disk.
    Discharge {
        channel: u16,
        handle: u32,
        serial: u64,
        delivery_id: u32,
        /// The transaction's wire id (its work is undone if the commit fails).
        txn: u64,
    },
}

/// A sans-IO AMQP 1.0 server connection (see the crate docs for the shape).
pub struct AmqpConnection {
    pub(crate) cfg: AmqpConfig,
    pub(crate) broker: Arc<dyn Broker>,
    sink: Arc<dyn EventSink>,
    pub(crate) conn_id: u64,
    decoder: FrameDecoder,
    pub(crate) out: Vec<u8>,
    /// Reused buffer for the non-body sections of outgoing messages.
    pub(crate) scratch: Vec<u8>,
    /// Deliveries the peer accepted and settled in the frames read so far
    /// and not yet settled in the core: settled together (one
    /// `settle_many`) at the end of the read, or before any frame that
    /// could observe them unsettled.
    pub(crate) accepted_in: Vec<(rosetta_neutral::ConsumerId, rosetta_neutral::DeliveryTag)>,
    phase: Phase,
    sasl: SaslServer,
    principal: Option<Principal>,
    pub(crate) core: Option<Box<dyn Session>>,
    /// The peer's container id, from its Open.
    pub(crate) container_id: String,
    /// The peer's max-frame-size: our outgoing frames stay within it.
    pub(crate) peer_max_frame: u32,
    channel_max: u16,
    peer_idle: Option<Duration>,
    pub(crate) now: Instant,
    /// Wall-clock ms for ttl <-> expiry, read once per entry call.
    pub(crate) now_ms: u64,
    /// When the last whole frame arrived (the idle timeout counts frames).
    last_recv: Instant,
    last_send: Instant,
    handshake_deadline: Option<Instant>,
    close_deadline: Option<Instant>,
    pub(crate) blocked_recheck: Option<Instant>,
    /// Sessions by the peer's channel (we mirror it as our channel).
    pub(crate) sessions: IdMap<u16, AmqpSession>,
    /// Where each consumer's deliveries go: (channel, handle).
    pub(crate) consumers: IdMap<ConsumerId, (u16, u32)>,
    pub(crate) tickets: IdMap<Ticket, PendingCommit>,
    /// Declared transactions by their wire id.
    pub(crate) txns: IdMap<u64, TxnId>,
    /// Per declared transaction (wire id), the deliveries it holds: those
    /// acquired under it (flow `txn-id`, spec 4.4.3) and those settled
    /// inside it. A rollback returns them to their queues.
    pub(crate) txn_work: IdMap<u64, Vec<(ConsumerId, rosetta_neutral::DeliveryTag)>>,
    pub(crate) next_link_serial: u64,
    error: Option<AmqpError>,
    /// User named by a verified TLS client certificate, if any.
    certificate_user: Option<String>,
}

impl AmqpConnection {
    /// A connection that has accepted a socket and waits for the client's
    /// protocol header.
    pub fn new(
        config: AmqpConfig,
        broker: Arc<dyn Broker>,
        sink: Arc<dyn EventSink>,
        conn_id: u64,
        now: Instant,
    ) -> Self {
        let handshake = Duration::from_millis(config.handshake_timeout_ms);
        Self {
            peer_max_frame: MIN_MAX_FRAME_SIZE,
            channel_max: config.channel_max,
            cfg: config,
            broker,
            sink,
            conn_id,
            decoder: FrameDecoder::new(),
            out: Vec::new(),
            scratch: Vec::new(),
            accepted_in: Vec::new(),
            phase: Phase::Header,
            sasl: SaslServer::default(),
            principal: None,
            core: None,
            container_id: String::new(),
            peer_idle: None,
            now,
            now_ms: rosetta_neutral::message::now_ms(),
            last_recv: now,
            last_send: now,
            handshake_deadline: Some(now + handshake),
            close_deadline: None,
            blocked_recheck: None,
            sessions: IdMap::default(),
            consumers: IdMap::default(),
            tickets: IdMap::default(),
            txns: IdMap::default(),
            txn_work: IdMap::default(),
            next_link_serial: 0,
            error: None,
            certificate_user: None,
        }
    }

    /// The user named by the verified TLS client certificate of this
    /// connection (the server's TLS layer extracts it). With it, SASL
    /// EXTERNAL is offered first, and a client that skips SASL is that user.
    #[must_use]
    pub fn with_certificate_user(mut self, user: Option<String>) -> Self {
        self.certificate_user = user;
        self
    }

    /// Bytes read from the socket (any split: partial frames, many frames).
    pub fn handle_input(&mut self, now: Instant, data: &[u8]) {
        self.decoder.push(data);
        self.handle_buffered_input(now);
    }

    /// The parse buffer, for a driver that reads straight into it; call
    /// [`Self::handle_buffered_input`] after appending.
    pub fn input_buffer(&mut self) -> &mut bytes::BytesMut {
        self.decoder.buffer_mut()
    }

    /// Parses what was appended to [`Self::input_buffer`].
    pub fn handle_buffered_input(&mut self, now: Instant) {
        self.now = now;
        self.now_ms = rosetta_neutral::message::now_ms();
        if matches!(self.phase, Phase::Closed) {
            return;
        }
        loop {
            match self.phase {
                // Waiting for a password check: what is buffered stays
                // there until its result (`on_login_checked`).
                Phase::Closed | Phase::SaslChecking => return,
                Phase::Header | Phase::SaslDone => match self.decoder.next_protocol_header() {
                    Ok(None) => return,
                    Ok(Some(h)) => self.on_protocol_header(h),
                    Err(e) => {
                        let requested = match &e {
                            FrameError::BadProtocolHeader(h) if h.starts_with(b"AMQP") => {
                                Some(h[4])
                            }
                            _ => None,
                        };
                        self.refuse_protocol_header(requested, AmqpError::Frame(e));
                    }
                },
                phase => {
                    let max = if matches!(phase, Phase::Opened | Phase::CloseSent) {
                        self.cfg.frame_size_max_bytes
                    } else {
                        self.cfg.handshake_frame_size_max_bytes
                    };
                    match self.decoder.next_frame(max) {
                        Ok(None) => {
                            self.settle_accepted_in();
                            return;
                        }
                        Ok(Some(f)) => {
                            // Only a whole frame counts against the idle
                            // timeout (spec 2.4.5): the bytes of one dribbled
                            // a byte at a time must not keep a peer alive.
                            self.last_recv = now;
                            self.on_frame(f);
                        }
                        Err(e) => self.fail(AmqpError::Frame(e)),
                    }
                }
            }
        }
    }

    /// An event the core sent to this connection's sink.
    pub fn handle_event(&mut self, now: Instant, event: SessionEvent) {
        self.now = now;
        self.now_ms = rosetta_neutral::message::now_ms();
        if matches!(self.phase, Phase::Closed) {
            return;
        }
        match event {
            SessionEvent::LoginChecked { result } => self.on_login_checked(result),
            SessionEvent::Delivery(d) => self.on_delivery(d),
            SessionEvent::Committed { ticket, result } => self.on_committed(ticket, result),
            SessionEvent::Drained { consumer } => self.on_drained(consumer),
            SessionEvent::ConsumerClosed { consumer, reason } => {
                if let Some(&(ch, handle)) = self.consumers.get(&consumer) {
                    // The core closes a consumer when its queue is deleted:
                    // spec 2.8.15 names that amqp:resource-deleted.
                    let e = AmqpError::ResourceDeleted(reason.to_string());
                    self.apply_fault(ch, Fault::Link(handle, e));
                }
            }
            SessionEvent::Kicked { reason } => {
                let why = match reason {
                    KickReason::TakenOver => "container id taken over by another connection",
                    KickReason::ServerShutdown => "broker shutting down",
                };
                self.fail(AmqpError::Forced(why.into()));
            }
        }
    }

    /// Timers: handshake, idle (both ways), close wait, credit re-check.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        match self.phase {
            Phase::Closed => {}
            Phase::CloseSent => {
                if self.close_deadline.is_some_and(|d| now >= d) {
                    debug!(conn = self.conn_id, "peer did not answer our close");
                    self.phase = Phase::Closed;
                }
            }
            Phase::Opened => {
                if let Some(idle) = self.our_idle() {
                    if now >= self.last_recv + idle {
                        // A silent peer is probably gone: say why once and
                        // stop, without waiting for a Close it cannot send.
                        self.fail(AmqpError::ResourceLimit(
                            "local-idle-timeout expired".into(),
                        ));
                        self.phase = Phase::Closed;
                        return;
                    }
                }
                if let Some(half) = self.peer_idle.map(|d| d / 2) {
                    if now >= self.last_send + half {
                        trace!(conn = self.conn_id, "heartbeat");
                        frame::write_empty_frame(&mut self.out);
                        self.last_send = now;
                    }
                }
                if self.blocked_recheck.is_some_and(|t| now >= t) {
                    self.blocked_recheck = None;
                    self.recheck_withheld_credit();
                }
            }
            _ => {
                if self.handshake_deadline.is_some_and(|d| now >= d) {
                    debug!(conn = self.conn_id, "handshake timeout");
                    self.fail(AmqpError::ResourceLimit("handshake timeout".into()));
                    self.phase = Phase::Closed;
                }
            }
        }
    }

    /// The next instant [`Self::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closed => None,
            Phase::CloseSent => self.close_deadline,
            Phase::Opened => [
                self.our_idle().map(|d| self.last_recv + d),
                self.peer_idle.map(|d| self.last_send + d / 2),
                self.blocked_recheck,
            ]
            .into_iter()
            .flatten()
            .min(),
            _ => self.handshake_deadline,
        }
    }

    /// Appends all bytes that should be written to the socket now.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) {
        self.flush_dispositions();
        if self.out.is_empty() {
            return;
        }
        self.last_send = self.now;
        if out.is_empty() {
            // Hand our buffer over and keep the caller's capacity: no copy.
            std::mem::swap(out, &mut self.out);
        } else {
            out.extend_from_slice(&self.out);
            self.out.clear();
        }
    }

    /// False while the driver should stop reading: a password check is
    /// under way, or too many durable commits are pending.
    pub fn wants_input(&self) -> bool {
        !matches!(self.phase, Phase::Closed | Phase::SaslChecking)
            && self.tickets.len() < self.cfg.pending_commits_max
    }

    /// True once the connection is finished.
    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }

    /// The fatal error that closed the connection, if any.
    pub fn error(&self) -> Option<&AmqpError> {
        self.error.as_ref()
    }

    /// The transport died: close the core session abnormally.
    pub fn handle_transport_closed(&mut self, now: Instant) {
        self.now = now;
        if let Err(e) = self.decoder.finish() {
            debug!(conn = self.conn_id, error = %e, "transport closed mid-frame");
        }
        if !matches!(self.phase, Phase::Closed) {
            debug!(conn = self.conn_id, "transport closed");
        }
        self.close_core(CloseKind::Abnormal);
        self.phase = Phase::Closed;
    }

    fn our_idle(&self) -> Option<Duration> {
        (self.cfg.idle_timeout_ms > 0)
            .then(|| Duration::from_millis(self.cfg.idle_timeout_ms.into()))
    }

    /// Settles the batched accepted deliveries (see `accepted_in`).
    pub(crate) fn settle_accepted_in(&mut self) {
        let Some(core) = self.core.as_deref_mut() else {
            // Nothing to settle in (on_disposition fills it only while
            // there is a core).
            self.accepted_in.clear();
            return;
        };
        let accepted = rosetta_neutral::Outcome::Accept;
        if let Err(e) = rosetta_neutral::settle_batch(core, &mut self.accepted_in, accepted) {
            debug!(conn = self.conn_id, error = %e, "settle failed");
        }
    }

    pub(crate) fn close_core(&mut self, kind: CloseKind) {
        // What the peer accepted before going stays accepted.
        self.settle_accepted_in();
        if let Some(mut core) = self.core.take() {
            core.close(kind);
        }
        self.consumers.clear();
        self.tickets.clear();
    }

    // ---- headers and SASL ----

    /// Who a client that skips SASL is: its certificate's user, else
    /// anonymous when that is allowed, else nobody (it must use SASL).
    fn principal_without_sasl(&self) -> Option<Principal> {
        match self.certificate_user.as_deref() {
            Some(user) => self.broker.authenticate_certificate(user).ok(),
            None => None,
        }
        .or_else(|| self.broker.anonymous_allowed().then(Principal::anonymous))
    }

    fn on_protocol_header(&mut self, h: ProtocolHeader) {
        let without_sasl = self.principal_without_sasl();
        match (self.phase, h.protocol_id) {
            (Phase::Header, PROTOCOL_ID_SASL) => {
                self.out
                    .extend_from_slice(&frame::protocol_header(PROTOCOL_ID_SASL));
                let mechs = SaslMechanisms {
                    sasl_server_mechanisms: Array(
                        sasl::mechanisms(&*self.broker, self.certificate_user.as_deref())
                            .into_iter()
                            .map(Symbol::from)
                            .collect(),
                    ),
                };
                write_frame(&mut self.out, FRAME_TYPE_SASL, 0, &mechs, &[]);
                self.phase = Phase::Sasl;
            }
            (Phase::Header, PROTOCOL_ID_AMQP) if without_sasl.is_some() => {
                self.principal = without_sasl;
                self.out
                    .extend_from_slice(&frame::protocol_header(PROTOCOL_ID_AMQP));
                self.phase = Phase::AwaitOpen;
            }
            (Phase::SaslDone, PROTOCOL_ID_AMQP) => {
                self.out
                    .extend_from_slice(&frame::protocol_header(PROTOCOL_ID_AMQP));
                self.phase = Phase::AwaitOpen;
            }
            (_, id) => self.refuse_protocol_header(
                Some(id),
                AmqpError::NotAllowed(format!("protocol id {id} not accepted here")),
            ),
        }
    }

    /// A protocol header we do not accept: a wrong version (AMQP 0-9-1's
    /// `AMQP 0 0 9 1`), a protocol id we do not serve here, or bytes that
    /// are no protocol header at all. AMQP 1.0 §2.2: the server "MUST send
    /// a protocol header with a supported protocol version and then close
    /// the socket". `requested` is the protocol id the client asked for,
    /// if it sent an `AMQP` header.
    fn refuse_protocol_header(&mut self, requested: Option<u8>, e: AmqpError) {
        let sasl_optional = self.principal_without_sasl().is_some();
        let answer = refusal_protocol_id(self.phase, requested, sasl_optional);
        debug!(conn = self.conn_id, ?requested, answer, error = %e, "protocol header refused");
        self.out.extend_from_slice(&frame::protocol_header(answer));
        self.error = Some(e);
        self.phase = Phase::Closed;
    }

    fn on_sasl_frame(&mut self, f: Frame) -> Result<(), Fault> {
        if f.frame_type != FRAME_TYPE_SASL {
            return Err(Fault::Connection(AmqpError::IllegalState(
                "AMQP frame during SASL".into(),
            )));
        }
        let body = &f.body[..];
        let len = codec::value_len(body).map_err(|e| Fault::Connection(e.into()))?;
        let step = match descriptor::descriptor_code(body) {
            Some(0x41) => {
                let init: SaslInit = codec::decode("sasl-init", &body[..len])
                    .map_err(|e| Fault::Connection(e.into()))?;
                let resp = init.initial_response.as_ref().map(|b| b.as_slice());
                self.sasl.on_init(
                    &*self.broker,
                    self.certificate_user.as_deref(),
                    &self.sink,
                    init.mechanism.as_str(),
                    resp,
                )
            }
            Some(0x43) => {
                let resp: SaslResponse = codec::decode("sasl-response", &body[..len])
                    .map_err(|e| Fault::Connection(e.into()))?;
                self.sasl.on_response(resp.response.as_slice())
            }
            _ => {
                return Err(Fault::Connection(AmqpError::IllegalState(
                    "unexpected SASL frame".into(),
                )))
            }
        };
        self.apply_sasl_step(step);
        Ok(())
    }

    /// The result of the PLAIN password check the connection waited for:
    /// the outcome, then whatever the client pipelined behind sasl-init.
    fn on_login_checked(&mut self, result: Result<Principal, rosetta_neutral::AuthError>) {
        if self.phase != Phase::SaslChecking {
            debug!(
                conn = self.conn_id,
                "login result with no SASL exchange waiting"
            );
            return;
        }
        self.apply_sasl_step(sasl::outcome(result));
        self.handle_buffered_input(self.now);
    }

    /// Answers one SASL step: a challenge, the outcome, or nothing yet.
    fn apply_sasl_step(&mut self, step: SaslStep) {
        match step {
            SaslStep::Pending => self.phase = Phase::SaslChecking,
            SaslStep::Challenge(c) => {
                let ch = fe2o3_amqp_types::sasl::SaslChallenge {
                    challenge: c.into(),
                };
                write_frame(&mut self.out, FRAME_TYPE_SASL, 0, &ch, &[]);
            }
            SaslStep::Success {
                principal,
                additional_data,
            } => {
                debug!(conn = self.conn_id, user = ?principal.user, "SASL ok");
                let outcome = SaslOutcome {
                    code: SaslCode::Ok,
                    additional_data: additional_data.map(Into::into),
                };
                write_frame(&mut self.out, FRAME_TYPE_SASL, 0, &outcome, &[]);
                self.principal = Some(principal);
                self.phase = Phase::SaslDone;
            }
            SaslStep::Failure(why) => self.refuse_sasl(SaslCode::Auth, why),
            SaslStep::Unavailable(why) => self.refuse_sasl(SaslCode::SysTemp, why),
        }
    }

    /// Sends a failed sasl-outcome and closes.
    fn refuse_sasl(&mut self, code: SaslCode, why: String) {
        debug!(conn = self.conn_id, %why, ?code, "SASL failed");
        let outcome = SaslOutcome {
            code,
            additional_data: None,
        };
        write_frame(&mut self.out, FRAME_TYPE_SASL, 0, &outcome, &[]);
        self.error = Some(AmqpError::Broker(
            rosetta_neutral::BrokerError::Unauthorized(why),
        ));
        self.phase = Phase::Closed;
    }

    // ---- frames ----

    fn on_frame(&mut self, f: Frame) {
        let channel = f.channel;
        let result = match self.phase {
            Phase::Sasl => self.on_sasl_frame(f),
            Phase::AwaitOpen | Phase::Opened | Phase::CloseSent => self.on_amqp_frame(f),
            Phase::Header | Phase::SaslChecking | Phase::SaslDone | Phase::Closed => Ok(()),
        };
        if let Err(fault) = result {
            self.apply_fault(channel, fault);
        }
    }

    fn on_amqp_frame(&mut self, f: Frame) -> Result<(), Fault> {
        if f.frame_type != FRAME_TYPE_AMQP {
            return Err(Fault::Connection(AmqpError::IllegalState(
                "SASL frame after SASL".into(),
            )));
        }
        if f.body.is_empty() {
            trace!(conn = self.conn_id, "empty frame");
            return Ok(());
        }
        let len = codec::value_len(&f.body).map_err(|e| Fault::Connection(e.into()))?;
        let bytes = &f.body[..len];
        // Transfers and dispositions, once per message, take a fast path.
        let perf: Performative = match crate::fast_decode::performative(bytes) {
            Some(perf) => perf,
            None => {
                codec::decode("performative", bytes).map_err(|e| Fault::Connection(e.into()))?
            }
        };
        let payload = f.body.slice(len..);
        trace!(conn = self.conn_id, channel = f.channel, ?perf, "recv");
        match self.phase {
            Phase::AwaitOpen => match perf {
                Performative::Open(open) if f.channel == 0 => self.on_open(open),
                _ => Err(Fault::Connection(AmqpError::IllegalState(
                    "expected open".into(),
                ))),
            },
            Phase::CloseSent => {
                if let Performative::Close(_) = perf {
                    self.phase = Phase::Closed;
                }
                Ok(())
            }
            _ => self.dispatch(f.channel, perf, payload),
        }
    }

    fn dispatch(&mut self, ch: u16, perf: Performative, payload: Bytes) -> Result<(), Fault> {
        if !matches!(
            perf,
            Performative::Transfer(_) | Performative::Disposition(_) | Performative::Flow(_)
        ) {
            // A detach, end or close returns unsettled deliveries to their
            // queues: the batched accepted ones must be settled first.
            self.settle_accepted_in();
        }
        match perf {
            Performative::Open(_) => Err(Fault::Connection(AmqpError::IllegalState(
                "second open".into(),
            ))),
            Performative::Close(close) => {
                if let Some(e) = &close.error {
                    debug!(conn = self.conn_id, error = ?e, "peer closed with error");
                }
                write_perf(&mut self.out, 0, &Close { error: None }, &[]);
                self.close_core(CloseKind::Clean);
                self.sessions.clear();
                self.phase = Phase::Closed;
                Ok(())
            }
            Performative::Begin(b) => self.on_begin(ch, b),
            other => {
                let Some(session) = self.sessions.get(&ch) else {
                    return Err(Fault::Connection(AmqpError::NotAllowed(format!(
                        "frame on unmapped channel {ch}"
                    ))));
                };
                if session.ending {
                    // We ended it with an error: drop frames until its End.
                    if let Performative::End(_) = other {
                        self.sessions.remove(&ch);
                    }
                    return Ok(());
                }
                match other {
                    Performative::End(e) => self.on_end(ch, e),
                    Performative::Attach(a) => self.on_attach(ch, a),
                    Performative::Flow(fl) => self.on_flow(ch, fl),
                    Performative::Transfer(t) => self.on_transfer(ch, t, payload),
                    Performative::Disposition(d) => self.on_disposition(ch, d),
                    Performative::Detach(d) => self.on_detach(ch, d),
                    Performative::Open(_) | Performative::Close(_) | Performative::Begin(_) => {
                        Ok(())
                    }
                }
            }
        }
    }

    fn on_open(&mut self, open: Open) -> Result<(), Fault> {
        self.peer_max_frame = open.max_frame_size.0.max(MIN_MAX_FRAME_SIZE);
        self.channel_max = self.cfg.channel_max.min(open.channel_max.0);
        self.peer_idle = open
            .idle_time_out
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(ms.into()));
        self.container_id = open.container_id.clone();
        let principal = self.principal.clone().unwrap_or_else(Principal::anonymous);
        let info = SessionInfo {
            conn_id: self.conn_id,
            protocol: Protocol::Amqp,
            principal,
            client_id: Some(open.container_id),
            take_over: false,
        };
        self.core = Some(self.broker.open_session(info, self.sink.clone()));
        let ours = Open {
            container_id: self.cfg.container_id.clone(),
            hostname: None,
            max_frame_size: MaxFrameSize(self.cfg.frame_size_max_bytes),
            channel_max: ChannelMax(self.cfg.channel_max),
            idle_time_out: advertised_idle_timeout_ms(self.cfg.idle_timeout_ms),
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: Some(Array(vec![
                Symbol::from(ANONYMOUS_RELAY),
                Symbol::from(crate::link::SHARED_SUBS),
            ])),
            desired_capabilities: None,
            properties: None,
        };
        write_perf(&mut self.out, 0, &ours, &[]);
        self.handshake_deadline = None;
        self.phase = Phase::Opened;
        debug!(conn = self.conn_id, container = %self.container_id, "open");
        Ok(())
    }

    pub(crate) fn channel_max(&self) -> u16 {
        self.channel_max
    }

    // ---- errors ----

    pub(crate) fn apply_fault(&mut self, ch: u16, fault: Fault) {
        match fault {
            Fault::Connection(e) => self.fail(e),
            Fault::Session(e) => self.end_session_with_error(ch, e),
            Fault::Link(handle, e) => self.detach_with_error(ch, handle, e),
        }
    }

    /// The client stopped reading while its deliveries filled the
    /// connection's buffer for too long: close with
    /// `amqp:resource-limit-exceeded` (which it may never read).
    pub fn handle_slow_consumer(&mut self, _now: Instant) {
        if !self.is_closed() {
            self.fail(AmqpError::ResourceLimit(
                "slow consumer: the client stopped reading and its delivery buffer stayed full"
                    .into(),
            ));
        }
    }

    /// Closes the connection with `e`, as far as the handshake allows.
    pub(crate) fn fail(&mut self, e: AmqpError) {
        warn!(conn = self.conn_id, error = %e, "closing connection");
        match self.phase {
            Phase::Opened => {
                write_perf(
                    &mut self.out,
                    0,
                    &Close {
                        error: Some(e.to_wire()),
                    },
                    &[],
                );
                self.phase = Phase::CloseSent;
                self.close_deadline =
                    Some(self.now + Duration::from_millis(self.cfg.close_timeout_ms));
            }
            Phase::AwaitOpen => {
                // An error before Open: send Open then Close (spec 2.4.3).
                let open = Open {
                    container_id: self.cfg.container_id.clone(),
                    hostname: None,
                    max_frame_size: MaxFrameSize(self.cfg.frame_size_max_bytes),
                    channel_max: ChannelMax(0),
                    idle_time_out: None,
                    outgoing_locales: None,
                    incoming_locales: None,
                    offered_capabilities: None,
                    desired_capabilities: None,
                    properties: None,
                };
                write_perf(&mut self.out, 0, &open, &[]);
                write_perf(
                    &mut self.out,
                    0,
                    &Close {
                        error: Some(e.to_wire()),
                    },
                    &[],
                );
                self.phase = Phase::Closed;
            }
            Phase::CloseSent | Phase::Closed => self.phase = Phase::Closed,
            Phase::Header | Phase::Sasl | Phase::SaslChecking | Phase::SaslDone => {
                self.phase = Phase::Closed
            }
        }
        self.close_core(CloseKind::Abnormal);
        self.sessions.clear();
        self.error.get_or_insert(e);
    }

    fn end_session_with_error(&mut self, ch: u16, e: AmqpError) {
        debug!(conn = self.conn_id, channel = ch, error = %e, "ending session");
        self.cleanup_session_links(ch);
        if let Some(s) = self.sessions.get_mut(&ch) {
            s.ending = true;
            write_perf(
                &mut self.out,
                s.local_channel,
                &End {
                    error: Some(e.to_wire()),
                },
                &[],
            );
        }
    }

    fn detach_with_error(&mut self, ch: u16, handle: u32, e: AmqpError) {
        debug!(conn = self.conn_id, channel = ch, handle, error = %e, "detaching link");
        self.remove_link(ch, handle, false);
        if let Some(s) = self.sessions.get_mut(&ch) {
            s.detaching.insert(handle);
            write_perf(
                &mut self.out,
                s.local_channel,
                &Detach {
                    handle: Handle(handle),
                    closed: true,
                    error: Some(e.to_wire()),
                },
                &[],
            );
        }
    }
}

/// The protocol id of the header that answers one we refuse, before we
/// close (AMQP 1.0 §2.2). We support version 1.0.0 only, the highest
/// version not above any the client may ask for, so the version is always
/// that; the protocol id is the layer the client should start with here:
///
/// | where                  | client asked for                  | answer |
/// |------------------------|-----------------------------------|--------|
/// | after SASL             | anything                          | AMQP (0): only it may follow SASL (§5.3.2) |
/// | first header           | AMQP (0), SASL optional           | AMQP (0) |
/// | first header           | AMQP (0), SASL required           | SASL (3) |
/// | first header           | SASL (3), TLS (2), other, garbage | SASL (3) |
///
/// TLS is not negotiated inside an AMQP connection (§5.2): it is the
/// `amqps` port's, and the `any` port's detection takes it before AMQP
/// starts, so a TLS header is answered with the security layer we do
/// offer here, SASL, which every client may use.
fn refusal_protocol_id(phase: Phase, requested: Option<u8>, sasl_optional: bool) -> u8 {
    match (phase, requested) {
        (Phase::SaslDone, _) => PROTOCOL_ID_AMQP,
        (_, Some(PROTOCOL_ID_AMQP)) if sasl_optional => PROTOCOL_ID_AMQP,
        _ => PROTOCOL_ID_SASL,
    }
}

/// The idle-time-out to advertise in our Open for the timeout we enforce
/// (`None`: no idle check). AMQP 1.0 §2.4.5: "To avoid spurious timeouts,
/// the value in idle-time-out SHOULD be half the peer's actual timeout
/// threshold." A peer that sends its keep-alives at the advertised period
/// (python-qpid-proton does) then still has a whole half period of slack
/// before we close.
fn advertised_idle_timeout_ms(enforced_ms: u32) -> Option<u32> {
    (enforced_ms > 0).then(|| (enforced_ms / 2).max(1))
}

/// Appends one frame: header, `body` encoded, then `payload`.
pub(crate) fn write_frame<T: Serialize>(
    out: &mut Vec<u8>,
    frame_type: u8,
    channel: u16,
    body: &T,
    payload: &[u8],
) {
    let start = frame::begin_frame(out, frame_type, channel);
    if let Err(e) = codec::encode_into(out, body) {
        // Our own values always encode; if one does not, drop the frame
        // rather than send garbage.
        tracing::error!(error = %e, "failed to encode a frame");
        out.truncate(start);
        return;
    }
    out.extend_from_slice(payload);
    frame::finish_frame(out, start);
}

/// Appends one AMQP performative frame.
pub(crate) fn write_perf<T: Serialize>(out: &mut Vec<u8>, channel: u16, perf: &T, payload: &[u8]) {
    write_frame(out, FRAME_TYPE_AMQP, channel, perf, payload);
}
