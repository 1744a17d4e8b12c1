//! The connection state machine: protocol headers, SASL, Open/Close, idle
//! timeouts, and the frames and core events it hands to its sessions.
//!
//! ```text
//!  Header ──SASL hdr──▶ Sasl ──outcome ok──▶ SaslDone ──AMQP hdr──▶ AwaitOpen
//!    │                   │└─ outcome auth ──▶ Closed                  │ Open
//!    │                   └─ PLAIN: password check (input waits) ─▶ outcome
//!    └──AMQP hdr (anonymous or certificate allowed)───────────────────┘
//!  AwaitOpen ──Open──▶ Opened ──Close / error──▶ CloseSent ──Close──▶ Closed
//! ```
//!
//! States are types ([`State`]): each variant carries what exists in it.
//! The handshake states carry their deadline; `SaslDone` and `AwaitOpen`
//! carry the authenticated [`Principal`], which `Open` needs and nothing
//! else can produce. [`Opened`] exists only once Open was exchanged: it
//! owns the core [`Session`](rosetta_neutral::Session) and the sessions by
//! channel, so no handler of the opened state checks for a missing core.
//!
//! `Sasl` holds the SASL sub-machine ([`SaslServer`]), including its wait
//! for a PLAIN password check done elsewhere: then nothing is parsed and
//! [`AmqpConnection::wants_input`] is false, so what the client pipelined
//! (the AMQP header, Open, Begin...) waits in the decoder's buffer and is
//! handled after the outcome.
//!
//! Ownership follows the protocol: the connection owns [`Opened`], which
//! owns its sessions ([`AmqpSession`](crate::session::AmqpSession)), each
//! of which owns its links. Inner handlers get a
//! [`Ctx`](crate::context::Ctx) (output buffer, core session, config,
//! clock) and return a [`Fault`] saying what the error breaks (a link, a
//! session, the connection); `apply_fault` closes only that. Output frames
//! are appended to one buffer and handed to the driver in
//! [`AmqpConnection::poll_transmit`], which also coalesces the accepted
//! dispositions produced by a burst of commits into ranges.
//!
//! Submodules: `handshake` (headers, SASL, Open), `opened` (the opened
//! state: dispatch to sessions, core events, error scoping).

mod handshake;
mod opened;
mod placement;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fe2o3_amqp_types::performatives::{ChannelMax, Close, MaxFrameSize, Open, Performative};
use rosetta_neutral::{Broker, CloseKind, EventSink, KickReason, Principal, SessionEvent};
use tracing::{debug, trace, warn};

use crate::codec;
use crate::config::AmqpConfig;
use crate::context::Env;
use crate::error::{AmqpError, Fault};
use crate::frame::{self, write_perf, Frame, FrameDecoder, FrameError, FRAME_TYPE_AMQP};
use crate::sasl::SaslServer;

use opened::Opened;

/// Where the connection is; each variant holds what exists there.
enum State {
    /// Waiting for the first protocol header.
    Header { deadline: Instant },
    /// SASL frames (or, inside the exchange, a password check).
    Sasl {
        deadline: Instant,
        server: SaslServer,
    },
    /// SASL succeeded as `principal`; waiting for the AMQP protocol header.
    SaslDone {
        deadline: Instant,
        principal: Principal,
    },
    /// Headers exchanged; waiting for Open.
    AwaitOpen {
        deadline: Instant,
        principal: Principal,
    },
    /// Open exchanged: the core session and the AMQP sessions exist.
    Opened(Box<Opened>),
    /// We sent Close (the core session is closed) and wait for the peer's.
    CloseSent { deadline: Instant },
    /// Done: the driver flushes and closes the socket.
    Closed,
}

/// A sans-IO AMQP 1.0 server connection (see the crate docs for the shape).
///
/// One per connection, idle ones included: the configuration is shared and
/// the rarely set parts are boxed (issue 20).
pub struct AmqpConnection {
    /// Shared by every connection of a listener.
    cfg: Arc<AmqpConfig>,
    broker: Arc<dyn Broker>,
    sink: Arc<dyn EventSink>,
    conn_id: u64,
    decoder: FrameDecoder,
    out: Vec<u8>,
    state: State,
    now: Instant,
    /// Wall-clock ms for ttl <-> expiry, read once per entry call.
    now_ms: u64,
    /// When the last whole frame arrived (the idle timeout counts frames).
    last_recv: Instant,
    last_send: Instant,
    error: Option<Box<AmqpError>>,
    /// User named by a verified TLS client certificate, if any.
    certificate_user: Option<Box<str>>,
}

impl AmqpConnection {
    /// A connection that has accepted a socket and waits for the client's
    /// protocol header.
    pub fn new(
        config: impl Into<Arc<AmqpConfig>>,
        broker: Arc<dyn Broker>,
        sink: Arc<dyn EventSink>,
        conn_id: u64,
        now: Instant,
    ) -> Self {
        let config = config.into();
        let handshake = Duration::from_millis(config.handshake_timeout_ms);
        Self {
            cfg: config,
            broker,
            sink,
            conn_id,
            decoder: FrameDecoder::new(),
            out: Vec::new(),
            state: State::Header {
                deadline: now + handshake,
            },
            now,
            now_ms: rosetta_neutral::message::now_ms(),
            last_recv: now,
            last_send: now,
            error: None,
            certificate_user: None,
        }
    }

    /// The user named by the verified TLS client certificate of this
    /// connection (the server's TLS layer extracts it). With it, SASL
    /// EXTERNAL is offered first, and a client that skips SASL is that user.
    #[must_use]
    pub fn with_certificate_user(mut self, user: Option<String>) -> Self {
        self.certificate_user = user.map(String::into_boxed_str);
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
        loop {
            let max = match &self.state {
                State::Closed => return,
                // Waiting for a password check: what is buffered stays
                // there until its result (`on_login_checked`).
                State::Sasl { server, .. } if server.checking_password() => return,
                State::Header { .. } | State::SaslDone { .. } => {
                    match self.decoder.next_protocol_header() {
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
                    }
                    continue;
                }
                State::Opened(_) | State::CloseSent { .. } => self.cfg.frame_size_max_bytes,
                State::Sasl { .. } | State::AwaitOpen { .. } => {
                    self.cfg.handshake_frame_size_max_bytes
                }
            };
            match self.decoder.next_frame(max) {
                Ok(None) => {
                    if let State::Opened(o) = &mut self.state {
                        o.settle_accepted_in(self.conn_id);
                    }
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

    /// An event the core sent to this connection's sink.
    pub fn handle_event(&mut self, now: Instant, event: SessionEvent) {
        self.now = now;
        self.now_ms = rosetta_neutral::message::now_ms();
        match event {
            _ if self.is_closed() => {}
            SessionEvent::LoginChecked { result } => self.on_login_checked(result),
            SessionEvent::Kicked { reason } => {
                let why = match reason {
                    KickReason::TakenOver => "container id taken over by another connection",
                    KickReason::ServerShutdown => "broker shutting down",
                    KickReason::Administrative(text) => {
                        return self.fail(AmqpError::Administrative(text));
                    }
                };
                self.fail(AmqpError::Forced(why.into()));
            }
            event => {
                // Deliveries, commits and the like: only an opened
                // connection has the links and tickets they are for.
                let Some((o, env)) = self.opened() else {
                    return;
                };
                if let Err(e) = o.on_event(env, event) {
                    self.fail(e);
                }
            }
        }
    }

    /// Timers: handshake, idle (both ways), close wait, credit re-check.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        match &self.state {
            State::Closed => {}
            State::CloseSent { deadline } => {
                if now >= *deadline {
                    debug!(conn = self.conn_id, "peer did not answer our close");
                    self.state = State::Closed;
                }
            }
            State::Opened(_) => self.opened_timeout(now),
            State::Header { deadline }
            | State::Sasl { deadline, .. }
            | State::SaslDone { deadline, .. }
            | State::AwaitOpen { deadline, .. } => {
                if now >= *deadline {
                    debug!(conn = self.conn_id, "handshake timeout");
                    self.fail(AmqpError::ResourceLimit("handshake timeout".into()));
                    self.state = State::Closed;
                }
            }
        }
    }

    fn opened_timeout(&mut self, now: Instant) {
        if self
            .our_idle()
            .is_some_and(|idle| now >= self.last_recv + idle)
        {
            // A silent peer is probably gone: say why once and stop,
            // without waiting for a Close it cannot send.
            self.fail(AmqpError::ResourceLimit(
                "local-idle-timeout expired".into(),
            ));
            self.state = State::Closed;
            return;
        }
        let last_send = self.last_send;
        let Some((o, env)) = self.opened() else {
            return;
        };
        let heartbeat = o
            .peer_idle()
            .is_some_and(|idle| now >= last_send + idle / 2);
        if heartbeat {
            trace!(conn = env.conn_id, "heartbeat");
            frame::write_empty_frame(env.out);
        }
        o.on_timeout(env);
        if heartbeat {
            self.last_send = now;
        }
    }

    /// The next instant [`Self::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Closed => None,
            State::CloseSent { deadline } => Some(*deadline),
            State::Opened(o) => [
                self.our_idle().map(|d| self.last_recv + d),
                o.peer_idle().map(|d| self.last_send + d / 2),
                o.blocked_recheck(),
            ]
            .into_iter()
            .flatten()
            .min(),
            State::Header { deadline }
            | State::Sasl { deadline, .. }
            | State::SaslDone { deadline, .. }
            | State::AwaitOpen { deadline, .. } => Some(*deadline),
        }
    }

    /// Appends all bytes that should be written to the socket now.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) {
        if let State::Opened(o) = &mut self.state {
            o.flush_dispositions(&mut self.out);
        }
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
        match &self.state {
            State::Closed => false,
            State::Sasl { server, .. } => !server.checking_password(),
            State::Opened(o) => o.pending_commits() < self.cfg.pending_commits_max,
            State::Header { .. }
            | State::SaslDone { .. }
            | State::AwaitOpen { .. }
            | State::CloseSent { .. } => true,
        }
    }

    /// True once the connection is finished.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// The fatal error that closed the connection, if any.
    pub fn error(&self) -> Option<&AmqpError> {
        self.error.as_deref()
    }

    /// The transport died: close the core session abnormally.
    pub fn handle_transport_closed(&mut self, now: Instant) {
        self.now = now;
        if let Err(e) = self.decoder.finish() {
            debug!(conn = self.conn_id, error = %e, "transport closed mid-frame");
        }
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Closed => {}
            State::Opened(o) => {
                debug!(conn = self.conn_id, "transport closed");
                o.close(self.conn_id, CloseKind::Abnormal);
            }
            _ => debug!(conn = self.conn_id, "transport closed"),
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

    fn our_idle(&self) -> Option<Duration> {
        (self.cfg.idle_timeout_ms > 0)
            .then(|| Duration::from_millis(self.cfg.idle_timeout_ms.into()))
    }

    /// The opened state and what its handlers need from the connection.
    fn opened(&mut self) -> Option<(&mut Opened, Env<'_>)> {
        let State::Opened(o) = &mut self.state else {
            return None;
        };
        let env = Env {
            out: &mut self.out,
            cfg: &self.cfg,
            conn_id: self.conn_id,
            now: self.now,
            now_ms: self.now_ms,
        };
        Some((o, env))
    }

    // ---- frames ----

    fn on_frame(&mut self, f: Frame) {
        let channel = f.channel;
        let result = match self.state {
            State::Sasl { .. } => self.on_sasl_frame(f),
            State::AwaitOpen { .. } | State::Opened(_) | State::CloseSent { .. } => {
                self.on_amqp_frame(f)
            }
            State::Header { .. } | State::SaslDone { .. } | State::Closed => Ok(()),
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
        match (&self.state, perf) {
            (State::AwaitOpen { .. }, Performative::Open(open)) if f.channel == 0 => {
                if let State::AwaitOpen { principal, .. } =
                    std::mem::replace(&mut self.state, State::Closed)
                {
                    self.on_open(principal, open);
                }
                Ok(())
            }
            (State::AwaitOpen { .. }, _) => Err(Fault::Connection(AmqpError::IllegalState(
                "expected open".into(),
            ))),
            (State::CloseSent { .. }, perf) => {
                if let Performative::Close(_) = perf {
                    self.state = State::Closed;
                }
                Ok(())
            }
            (State::Opened(_), Performative::Close(close)) => {
                self.on_close(&close);
                Ok(())
            }
            (State::Opened(_), perf) => match self.opened() {
                Some((o, env)) => o.dispatch(env, f.channel, perf, payload),
                None => Ok(()),
            },
            (State::Header { .. } | State::Sasl { .. } | State::SaslDone { .. }, _)
            | (State::Closed, _) => Ok(()),
        }
    }

    /// The peer's Close: answer it and close the core session cleanly.
    fn on_close(&mut self, close: &Close) {
        if let Some(e) = &close.error {
            debug!(conn = self.conn_id, error = ?e, "peer closed with error");
        }
        write_perf(&mut self.out, 0, &Close { error: None }, &[]);
        if let State::Opened(o) = std::mem::replace(&mut self.state, State::Closed) {
            o.close(self.conn_id, CloseKind::Clean);
        }
    }

    // ---- errors ----

    fn apply_fault(&mut self, ch: u16, fault: Fault) {
        match fault {
            Fault::Connection(e) => self.fail(e),
            Fault::Session(e) => {
                if let Some((o, env)) = self.opened() {
                    o.end_session_with_error(env, ch, &e);
                }
            }
            Fault::Link(handle, e) => {
                if let Some((o, env)) = self.opened() {
                    o.detach_with_error(env, ch, handle, &e);
                }
            }
        }
    }

    /// The Open sent only to carry the Close after it (a connection
    /// refused before it opened: spec 2.4.3).
    fn refusal_open(&self) -> Open {
        Open {
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
        }
    }

    /// Closes the connection with `e`, as far as the handshake allows.
    fn fail(&mut self, e: AmqpError) {
        warn!(conn = self.conn_id, error = %e, "closing connection");
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Opened(o) => {
                let close = Close {
                    error: Some(e.to_wire()),
                };
                write_perf(&mut self.out, 0, &close, &[]);
                o.close(self.conn_id, CloseKind::Abnormal);
                let wait = Duration::from_millis(self.cfg.close_timeout_ms);
                self.state = State::CloseSent {
                    deadline: self.now + wait,
                };
            }
            State::AwaitOpen { .. } => {
                // An error before Open: send Open then Close (spec 2.4.3).
                let open = self.refusal_open();
                write_perf(&mut self.out, 0, &open, &[]);
                let close = Close {
                    error: Some(e.to_wire()),
                };
                write_perf(&mut self.out, 0, &close, &[]);
            }
            State::Header { .. }
            | State::Sasl { .. }
            | State::SaslDone { .. }
            | State::CloseSent { .. }
            | State::Closed => {}
        }
        self.error.get_or_insert_with(|| Box::new(e));
    }
}
