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
//! States are types ([`State`], and before Open [`Step`]): each variant
//! carries what exists in it. The handshake ([`Handshake`], boxed and
//! freed at Open) carries its deadline, the broker and the sink the core
//! session will take, and the certificate user; `SaslDone` and `AwaitOpen`
//! carry the authenticated [`Principal`], which `Open` needs and nothing
//! else can produce. [`Opened`] exists only once Open was exchanged: it
//! owns the core [`Session`](rosetta_neutral::Session), the sessions by
//! channel and the idle clocks, so no handler of the opened state checks
//! for a missing core.
//!
//! What an idle connection holds is kept small (issue 20, docs/scaling.md):
//! the connection itself sits in the server's parked state, so it holds
//! only what every state needs; the handshake's things are gone once open;
//! what only traffic uses is boxed at first use below [`Opened`].
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
    /// Before Open: headers, SASL, Open (see [`Step`]).
    Handshake(Box<Handshake>),
    /// Open exchanged: the core session and the AMQP sessions exist.
    Opened(Box<Opened>),
    /// We sent Close (the core session is closed) and wait for the peer's.
    CloseSent { deadline: Instant },
    /// Done: the driver flushes and closes the socket.
    Closed,
}

/// What the connection has before Open and not after: boxed in
/// [`State::Handshake`], so an open connection carries none of it (the
/// broker handle, the sink, the certificate user: 48 B, issue 20).
struct Handshake {
    /// The whole handshake, headers to Open, must be done by then.
    deadline: Instant,
    /// For SASL, certificate and anonymous logins, the balancer's word on
    /// the Open, and [`Broker::open_session`].
    broker: Arc<dyn Broker>,
    /// What the core session takes at Open (and a password check answers).
    sink: Arc<dyn EventSink>,
    /// User named by a verified TLS client certificate, if any.
    certificate_user: Option<Box<str>>,
    step: Step,
}

/// Where the handshake is.
enum Step {
    /// Waiting for the first protocol header.
    Header,
    /// SASL frames (or, inside the exchange, a password check).
    Sasl(SaslServer),
    /// SASL succeeded as this principal; waiting for the AMQP header.
    SaslDone(Principal),
    /// Headers exchanged as this principal; waiting for Open.
    AwaitOpen(Principal),
}

/// A sans-IO AMQP 1.0 server connection (see the crate docs for the shape).
///
/// One per connection, idle ones included, inline in the server's parked
/// state: the configuration is shared, the handshake's state is boxed
/// until Open, and the opened state is boxed (issue 20; its size is
/// pinned by a test).
pub struct AmqpConnection {
    /// Shared by every connection of a listener.
    cfg: Arc<AmqpConfig>,
    conn_id: u64,
    decoder: FrameDecoder,
    out: Vec<u8>,
    state: State,
    error: Option<Box<AmqpError>>,
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
            conn_id,
            decoder: FrameDecoder::new(),
            out: Vec::new(),
            state: State::Handshake(Box::new(Handshake {
                deadline: now + handshake,
                broker,
                sink,
                certificate_user: None,
                step: Step::Header,
            })),
            error: None,
        }
    }

    /// The user named by the verified TLS client certificate of this
    /// connection (the server's TLS layer extracts it). With it, SASL
    /// EXTERNAL is offered first, and a client that skips SASL is that user.
    #[must_use]
    pub fn with_certificate_user(mut self, user: Option<String>) -> Self {
        if let State::Handshake(h) = &mut self.state {
            h.certificate_user = user.map(String::into_boxed_str);
        }
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
        self.set_now(now);
        loop {
            let max = match &self.state {
                State::Closed => return,
                State::Handshake(h) => match &h.step {
                    // Waiting for a password check: what is buffered
                    // stays there until its result (`on_login_checked`).
                    Step::Sasl(server) if server.checking_password() => return,
                    Step::Header | Step::SaslDone(_) => None,
                    Step::Sasl(_) | Step::AwaitOpen(_) => {
                        Some(self.cfg.handshake_frame_size_max_bytes)
                    }
                },
                State::Opened(_) | State::CloseSent { .. } => Some(self.cfg.frame_size_max_bytes),
            };
            let Some(max) = max else {
                // A protocol header is due, not a frame.
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
                    if let State::Opened(o) = &mut self.state {
                        o.frame_received();
                    }
                    self.on_frame(now, f);
                }
                Err(e) => self.fail(now, AmqpError::Frame(e)),
            }
        }
    }

    /// An event the core sent to this connection's sink.
    pub fn handle_event(&mut self, now: Instant, event: SessionEvent) {
        self.set_now(now);
        match event {
            _ if self.is_closed() => {}
            SessionEvent::LoginChecked { result } => self.on_login_checked(now, result),
            SessionEvent::Kicked { reason } => {
                let why = match reason {
                    KickReason::TakenOver => "container id taken over by another connection",
                    KickReason::ServerShutdown => "broker shutting down",
                    KickReason::Administrative(text) => {
                        return self.fail(now, AmqpError::Administrative(text));
                    }
                };
                self.fail(now, AmqpError::Forced(why.into()));
            }
            event => {
                // Deliveries, commits and the like: only an opened
                // connection has the links and tickets they are for.
                let Some((o, env)) = self.opened() else {
                    return;
                };
                if let Err(e) = o.on_event(env, event) {
                    self.fail(now, e);
                }
            }
        }
    }

    /// Timers: handshake, idle (both ways), close wait, credit re-check.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.set_now(now);
        match &self.state {
            State::Closed => {}
            State::CloseSent { deadline } => {
                if now >= *deadline {
                    debug!(conn = self.conn_id, "peer did not answer our close");
                    self.state = State::Closed;
                }
            }
            State::Opened(_) => self.opened_timeout(now),
            State::Handshake(h) => {
                if now >= h.deadline {
                    debug!(conn = self.conn_id, "handshake timeout");
                    self.fail(now, AmqpError::ResourceLimit("handshake timeout".into()));
                    self.state = State::Closed;
                }
            }
        }
    }

    fn opened_timeout(&mut self, now: Instant) {
        let idle_ms = self.cfg.idle_timeout_ms;
        let silent = matches!(&self.state, State::Opened(o) if o.silent_for(idle_ms));
        if silent {
            // A silent peer is probably gone: say why once and stop,
            // without waiting for a Close it cannot send.
            self.fail(
                now,
                AmqpError::ResourceLimit("local-idle-timeout expired".into()),
            );
            self.state = State::Closed;
            return;
        }
        let Some((o, env)) = self.opened() else {
            return;
        };
        if o.heartbeat_due() {
            trace!(conn = env.conn_id, "heartbeat");
            frame::write_empty_frame(env.out);
        }
        o.on_timeout(env);
    }

    /// The next instant [`Self::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Closed => None,
            State::CloseSent { deadline } => Some(*deadline),
            State::Opened(o) => o.poll_timeout(self.cfg.idle_timeout_ms),
            State::Handshake(h) => Some(h.deadline),
        }
    }

    /// Appends all bytes that should be written to the socket now.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) {
        if let State::Opened(o) = &mut self.state {
            o.flush_dispositions(&mut self.out);
            if !self.out.is_empty() {
                o.frames_sent();
            }
        }
        if self.out.is_empty() {
            return;
        }
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
            State::Handshake(h) => match &h.step {
                Step::Sasl(server) => !server.checking_password(),
                Step::Header | Step::SaslDone(_) | Step::AwaitOpen(_) => true,
            },
            State::Opened(o) => o.pending_commits() < self.cfg.pending_commits_max,
            State::CloseSent { .. } => true,
        }
    }

    /// The connection is quiet and about to park: the boxes of what only
    /// traffic uses (the connection's and each session's) go if they are
    /// empty, so a device that once had traffic sleeps as small as one
    /// that never had (issue 20). They are made again by the next
    /// message.
    pub fn shrink_when_parked(&mut self) {
        if let State::Opened(o) = &mut self.state {
            o.shrink_when_parked();
        }
    }

    /// The connection's delivery budget has room again after the core held
    /// deliveries back for lack of it: the session dispatches to its
    /// consumers again (their deliveries arrive as events).
    pub fn resume_deliveries(&mut self) {
        if let State::Opened(o) = &mut self.state {
            o.resume_deliveries();
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
        self.set_now(now);
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
    pub fn handle_slow_consumer(&mut self, now: Instant) {
        if !self.is_closed() {
            self.fail(
                now,
                AmqpError::ResourceLimit(
                    "slow consumer: the client stopped reading and its delivery buffer stayed full"
                        .into(),
                ),
            );
        }
    }

    /// An entry call's time, for the opened state's clocks.
    fn set_now(&mut self, now: Instant) {
        if let State::Opened(o) = &mut self.state {
            o.set_now(now);
        }
    }

    /// The opened state and what its handlers need from the connection.
    fn opened(&mut self) -> Option<(&mut Opened, Env<'_>)> {
        let State::Opened(o) = &mut self.state else {
            return None;
        };
        let env = o.env(&mut self.out, &self.cfg, self.conn_id);
        Some((o, env))
    }

    // ---- frames ----

    fn on_frame(&mut self, now: Instant, f: Frame) {
        let channel = f.channel;
        let result = match &self.state {
            State::Handshake(h) => match h.step {
                Step::Sasl(_) => self.on_sasl_frame(f),
                Step::AwaitOpen(_) => self.on_amqp_frame(now, f),
                Step::Header | Step::SaslDone(_) => Ok(()),
            },
            State::Opened(_) | State::CloseSent { .. } => self.on_amqp_frame(now, f),
            State::Closed => Ok(()),
        };
        if let Err(fault) = result {
            self.apply_fault(now, channel, fault);
        }
    }

    fn on_amqp_frame(&mut self, now: Instant, f: Frame) -> Result<(), Fault> {
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
            (State::Handshake(_), Performative::Open(open)) if f.channel == 0 => {
                if let State::Handshake(h) = std::mem::replace(&mut self.state, State::Closed) {
                    self.on_open(now, *h, open);
                }
                Ok(())
            }
            (State::Handshake(_), _) => Err(Fault::Connection(AmqpError::IllegalState(
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
            (State::Closed, _) => Ok(()),
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

    fn apply_fault(&mut self, now: Instant, ch: u16, fault: Fault) {
        match fault {
            Fault::Connection(e) => self.fail(now, e),
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
    fn fail(&mut self, now: Instant, e: AmqpError) {
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
                    deadline: now + wait,
                };
            }
            State::Handshake(h) if matches!(h.step, Step::AwaitOpen(_)) => {
                // An error before Open: send Open then Close (spec 2.4.3).
                let open = self.refusal_open();
                write_perf(&mut self.out, 0, &open, &[]);
                let close = Close {
                    error: Some(e.to_wire()),
                };
                write_perf(&mut self.out, 0, &close, &[]);
            }
            State::Handshake(_) | State::CloseSent { .. } | State::Closed => {}
        }
        self.error.get_or_insert_with(|| Box::new(e));
    }
}
#[cfg(test)]
impl AmqpConnection {
    /// Whether the boxes made at first use exist: the connection's
    /// (`Busy`) and any session's (`SessionBusy`).
    pub(crate) fn busy_made(&self) -> (bool, bool) {
        match &self.state {
            State::Opened(o) => o.busy_made(),
            _ => (false, false),
        }
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;
    use crate::context::Busy;
    use crate::link::Link;
    use crate::session::{AmqpSession, SessionBusy};

    /// What an idle connection holds (issue 20, docs/scaling.md): the
    /// connection inline in the server's parked state, the opened state
    /// in jemalloc's 128 B size class, a session in the 48 B one, a link
    /// inline in its session's map. What only traffic uses is boxed
    /// apart; a field more here costs every idle connection a size class.
    #[test]
    fn an_idle_connection_stays_within_its_size_classes() {
        let conn = std::mem::size_of::<AmqpConnection>();
        let opened = std::mem::size_of::<Opened>();
        let session = std::mem::size_of::<AmqpSession>();
        let link = std::mem::size_of::<Link>();
        println!(
            "AmqpConnection {conn} B, Opened {opened} B, AmqpSession {session} B, Link {link} B; \
             made at first use: Busy {} B, SessionBusy {} B, Handshake {} B until Open",
            std::mem::size_of::<Busy>(),
            std::mem::size_of::<SessionBusy>(),
            std::mem::size_of::<Handshake>(),
        );
        assert!(conn <= 96, "AmqpConnection: {conn} B");
        assert!(opened <= 128, "Opened: {opened} B");
        assert!(session <= 48, "AmqpSession: {session} B");
        assert!(link <= 72, "Link: {link} B");
    }
}
