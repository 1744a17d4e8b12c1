//! The per-connection STOMP state machine.
//!
//! States are types: before CONNECT there is no session at all
//! (`State::AwaitConnect`); authentication yields the `Open` state,
//! which owns the core [`Session`](rosetta_neutral::Session); `State::Closed` swallows everything.
//! Every error is fatal and reported once, as an ERROR frame, by
//! `StompConnection::fail`.
//!
//! A CONNECT whose passcode the broker checks elsewhere
//! ([`Broker::start_login`] answered `Pending`) waits in
//! `State::CheckingLogin`: no frame is decoded and
//! [`StompConnection::wants_input`] is false; bytes that arrived behind the
//! CONNECT stay buffered (at most [`StompConfig::frame_size_max_bytes`]
//! more than the decoder holds) and are handled, in order, once
//! [`SessionEvent::LoginChecked`] brings the result. Anonymous and
//! certificate logins are decided at once.
//!
//! Durability contract: a RECEIPT is written only when the frame's effect
//! is durable (the core's `Committed` event for every ticket the frame
//! produced) and every earlier frame's RECEIPT is out; SENDs of persistent
//! messages always ask the core for a confirm, so that journal commits
//! count towards [`StompConfig::pending_commits_max`] and stop reading when
//! the journal falls behind.
//!
//! Header conventions beyond the spec (all documented here for clients):
//! - prefetch: `activemq.prefetchSize` or `prefetch-count` on SUBSCRIBE
//!   (default [`crate::config::PREFETCH_DEFAULT`], capped by
//!   [`StompConfig::prefetch_max`]);
//! - durable topic subscription: `activemq.subscriptionName:<name>`
//!   (ActiveMQ), or `persistent:true` / `durable:true` with the `id` as the
//!   name (RabbitMQ). The queue is [`durable_subscription_queue`](rosetta_neutral::durable_subscription_queue) of the
//!   CONNECT `client-id` (else the login) and the name;
//! - UNSUBSCRIBE of a durable subscription keeps its queue unless it
//!   carries `persistent:true`, `durable:true` or
//!   `activemq.subscriptionName`, which delete it;
//! - redelivery: `redelivered:true` and `delivery-count:<n>` on MESSAGE;
//! - queue semantics on SUBSCRIBE (`selector`, `activemq.exclusive`,
//!   `activemq.priority`, `browser`): see `consumer_options`; a browser
//!   ends with ActiveMQ's `browser:end` MESSAGE and needs no ACK;
//! - `client-id` on CONNECT takes over a live session with the same id.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rosetta_neutral::{
    AuthError, Broker, CloseKind, Credentials, EventSink, LoginStart, Placement, PlacementRequest,
    Principal, Protocol, SessionEvent, SessionInfo,
};
use tracing::{debug, info, trace};

use crate::clock::Stamp;
use crate::config::StompConfig;
use crate::encoder::FrameWriter;
use crate::error::{error_frame, StompError};
use crate::frame::{Command, Frame, KnownHeader, Version};
use crate::heartbeat::{self, HeartBeat};
use crate::open::{Done, Open};
use crate::parser::{Decoder, FrameError};
use crate::receipts::ReceiptId;

/// Versions this server speaks, best first.
/// RECEIPT header by which the broker says that the ACK, NACK or RENEW it
/// answers came after the delivery's lease had run out: nothing was
/// settled, and the message was (or will be) delivered again.
pub const LEASE_EXPIRED_HEADER: &str = "lease-expired";

const SUPPORTED: [Version; 3] = [Version::V1_2, Version::V1_1, Version::V1_0];

/// Output one [`StompConnection::poll_transmit`] hands over once it holds
/// at least this much: deliveries beyond it wait, unencoded, for the next
/// call (after the transport took this), so a reader given a large credit
/// at once costs about this much output buffer, not its credit again.
pub const OUTPUT_CHUNK_BYTES: usize = 64 * 1024;

enum State {
    /// Accepted, no CONNECT yet.
    AwaitConnect(Box<AwaitConnect>),
    /// CONNECT read; the broker is checking its passcode.
    CheckingLogin(Box<Negotiated>),
    /// Authenticated, with a session.
    Open(Box<Open>),
    /// Finished: input and events are ignored. Why, if it failed with an
    /// ERROR frame (boxed: an error is 64 bytes, and most connections
    /// never fail).
    Closed(Option<Box<StompError>>),
}

/// What logging in needs and an open connection does not: the broker
/// (login, placement, [`Broker::open_session`]) and the sink the session
/// takes, carried by the states before [`Open`]. Once the session is open
/// the sink is the session's and the broker handle is dropped, so a
/// parked connection holds neither (issue 20, as MQTT's `Opening`).
struct Opening {
    broker: Arc<dyn Broker>,
    sink: Arc<dyn EventSink>,
    /// When a client that has not logged in is closed; `None` when the
    /// configured timeout is too large to represent.
    deadline: Option<Instant>,
}

/// Waiting for CONNECT.
struct AwaitConnect {
    opening: Opening,
    /// The user named by a verified TLS client certificate, if any (only
    /// the login needs it).
    certificate_user: Option<Box<str>>,
}

/// What a CONNECT settled besides who the client is.
struct Negotiated {
    version: Version,
    heart: HeartBeat,
    client_id: Option<String>,
    host: String,
    /// The CONNECT's `receipt` header, for a refusal's ERROR frame.
    receipt: Option<String>,
    /// Bytes that arrived while the login was checked and did not fit in
    /// the decoder; fed to it once the result is in.
    held_input: Vec<u8>,
    opening: Opening,
}

/// A STOMP server connection, driven by bytes, core events and time.
///
/// One per connection, idle ones included, so what only some states need
/// is in the states (issue 20): the broker handle, the sink and the
/// connect deadline until CONNECTED, the liveness stamps and heart-beats
/// in [`Open`]. 128 B, inline in the server's parked connection.
pub struct StompConnection {
    /// Shared by every connection of a listener.
    config: Arc<StompConfig>,
    conn_id: u64,
    decoder: Decoder,
    state: State,
    out: Vec<u8>,
}

impl std::fmt::Debug for StompConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StompConnection")
            .field("conn_id", &self.conn_id)
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl StompConnection {
    /// A connection that has just been accepted.
    pub fn new(
        config: impl Into<Arc<StompConfig>>,
        broker: Arc<dyn Broker>,
        sink: Arc<dyn EventSink>,
        conn_id: u64,
        now: Instant,
    ) -> Self {
        let config = config.into();
        let decoder = Decoder::new(config.limits(), Version::V1_0);
        let deadline = now.checked_add(Duration::from_millis(config.connect_timeout_ms));
        Self {
            config,
            conn_id,
            decoder,
            state: State::AwaitConnect(Box::new(AwaitConnect {
                opening: Opening {
                    broker,
                    sink,
                    deadline,
                },
                certificate_user: None,
            })),
            out: Vec::new(),
        }
    }

    /// The user named by the verified TLS client certificate of this
    /// connection (the server's TLS layer extracts it). With it, a client
    /// that sends no password is that user
    /// ([`Broker::authenticate_connection`]).
    #[must_use]
    pub fn with_certificate_user(mut self, user: Option<String>) -> Self {
        if let State::AwaitConnect(waiting) = &mut self.state {
            waiting.certificate_user = user.map(String::into_boxed_str);
        }
        self
    }

    /// Bytes read from the socket (any split: partial frames, many frames).
    pub fn handle_input(&mut self, now: Instant, data: &[u8]) {
        self.input_came(now);
        if matches!(self.state, State::CheckingLogin(_)) {
            return self.hold_input(data);
        }
        if !self.reading() {
            trace!(conn_id = self.conn_id, len = data.len(), "input ignored");
            return;
        }
        self.decode_input(now, data);
        self.decoder.release_if_idle(data.len());
    }

    /// The decoder's buffer, for a driver that reads straight into it (no
    /// copy of the input; SEND bodies are views of it); call
    /// [`Self::handle_buffered_input`] after appending.
    pub fn input_buffer(&mut self) -> &mut BytesMut {
        self.decoder.buffer_mut()
    }

    /// Bytes were appended to [`Self::input_buffer`]: handles every frame
    /// they complete, as [`Self::handle_input`] does. While a passcode is
    /// checked the bytes stay there (the driver reads no more meanwhile)
    /// and are decoded once the result is in.
    pub fn handle_buffered_input(&mut self, now: Instant) {
        self.input_came(now);
        if matches!(self.state, State::CheckingLogin(_)) {
            return;
        }
        if !self.reading() {
            trace!(
                conn_id = self.conn_id,
                len = self.decoder.buffered(),
                "input ignored"
            );
            return self.decoder.discard_buffered();
        }
        self.decode_buffered(now);
    }

    /// Any byte proves the client alive, even while frames are ignored
    /// (after DISCONNECT, waiting for its receipt). Only an open
    /// connection's liveness is watched.
    fn input_came(&mut self, now: Instant) {
        if let State::Open(open) = &mut self.state {
            open.last_rx = Stamp::of(now);
        }
    }

    /// Handles every frame the decoder's buffer holds, until frames must
    /// no longer be read; what follows DISCONNECT is dropped.
    fn decode_buffered(&mut self, now: Instant) {
        while self.reading() {
            match self.decoder.decode() {
                Ok(Some(frame)) => self.on_frame(now, frame),
                Ok(None) => return,
                Err(e) => return self.fail(e.into(), None),
            }
        }
        if !matches!(self.state, State::CheckingLogin(_)) {
            self.decoder.discard_buffered();
        }
    }

    /// Feeds `data` to the decoder and handles every frame it completes,
    /// until the input is used up or frames must no longer be read.
    fn decode_input(&mut self, now: Instant, data: &[u8]) {
        let mut rest = data;
        loop {
            let taken = self.decoder.feed(rest);
            rest = rest.get(taken..).unwrap_or_default();
            let mut progressed = taken > 0;
            while self.reading() {
                match self.decoder.decode() {
                    Ok(Some(frame)) => {
                        progressed = true;
                        self.on_frame(now, frame);
                    }
                    Ok(None) => break,
                    Err(e) => return self.fail(e.into(), None),
                }
            }
            if matches!(self.state, State::CheckingLogin(_)) {
                // A CONNECT started a password check: what follows it
                // waits for the result.
                return self.hold_input(rest);
            }
            if rest.is_empty() || !self.reading() {
                return;
            }
            if !progressed {
                // Cannot happen (the decoder errors on a full buffer), but
                // never spin on a peer's bytes.
                let max = self.config.frame_size_max_bytes;
                return self.fail(FrameError::FrameTooLarge { max }.into(), None);
            }
        }
    }

    /// Keeps bytes that arrived while a login is checked, within one more
    /// frame's worth.
    fn hold_input(&mut self, data: &[u8]) {
        let max = self.config.frame_size_max_bytes;
        let State::CheckingLogin(negotiated) = &mut self.state else {
            return;
        };
        if negotiated.held_input.len() + data.len() > max {
            let err = StompError::LimitExceeded {
                what: "bytes sent before CONNECTED",
                max,
            };
            return self.fail(err, None);
        }
        negotiated.held_input.extend_from_slice(data);
    }

    /// The result of the passcode check a CONNECT waited for: CONNECTED
    /// (then the frames that came behind the CONNECT) or an ERROR frame.
    fn on_login_checked(&mut self, now: Instant, result: Result<Principal, AuthError>) {
        if !matches!(self.state, State::CheckingLogin(_)) {
            debug!(
                conn_id = self.conn_id,
                "login result with no CONNECT waiting"
            );
            return;
        }
        let State::CheckingLogin(negotiated) =
            std::mem::replace(&mut self.state, State::Closed(None))
        else {
            return;
        };
        let mut negotiated = *negotiated;
        let held = std::mem::take(&mut negotiated.held_input);
        match result {
            Ok(principal) => self.open(now, negotiated, principal),
            Err(e) => return self.fail(e.into(), negotiated.receipt),
        }
        // Held here (`handle_input`), or still in the decoder's buffer
        // (read into it, `input_buffer`): decoded either way.
        self.decode_input(now, &held);
    }

    /// An event the core sent to this connection's sink.
    pub fn handle_event(&mut self, now: Instant, event: SessionEvent) {
        let was_paused = !self.wants_input();
        self.on_event(now, event);
        if was_paused && self.wants_input() {
            // The client's bytes sat unread in the socket while we paused:
            // its silence was our doing, so its liveness clock restarts.
            self.input_came(now);
        }
    }

    fn on_event(&mut self, now: Instant, event: SessionEvent) {
        if let SessionEvent::LoginChecked { result } = event {
            return self.on_login_checked(now, result);
        }
        let State::Open(open) = &mut self.state else {
            trace!(conn_id = self.conn_id, ?event, "event after close ignored");
            return;
        };
        match event {
            SessionEvent::Delivery(d) => {
                // Stamped by the first delivery of a run that waits to be
                // written, not by each (a stamp was about 1% of a stream
                // delivery's instructions): the run goes out together. A
                // run a slow reader leaves waiting past the heart-beat
                // interval gets an early heart-beat, which is harmless.
                if !open.has_pending() {
                    open.last_tx = Stamp::of(now);
                }
                open.deliver(d);
            }
            SessionEvent::Committed { ticket, result } => {
                let frame = open.receipts.committed(ticket);
                match (frame, result) {
                    (None, _) => debug!(conn_id = self.conn_id, ?ticket, "unknown ticket"),
                    (Some(seq), Err(e)) => {
                        let receipt = open.receipts.receipt_of(seq);
                        self.fail(e.into(), receipt)
                    }
                    (Some(_), Ok(())) => self.flush_receipts(now),
                }
            }
            SessionEvent::CommittedRun { tickets } => {
                for ticket in tickets {
                    if open.receipts.committed(ticket).is_none() {
                        debug!(conn_id = self.conn_id, ?ticket, "unknown ticket");
                    }
                }
                // The RECEIPTs the run completed, written together.
                self.flush_receipts(now);
            }
            SessionEvent::Drained { .. } => {}
            SessionEvent::LeaseExpired { consumer, tag } => open.lease_expired(consumer, tag),
            SessionEvent::BrowseEnded { consumer } => {
                let version = open.version;
                open.encode_pending(&mut self.out, version, usize::MAX);
                open.browse_ended(&mut self.out, version, consumer);
                open.last_tx = Stamp::of(now);
            }
            SessionEvent::ConsumerClosed { consumer, reason } => {
                let id = open
                    .subscription_id(consumer)
                    .unwrap_or_default()
                    .to_owned();
                self.fail(StompError::SubscriptionClosed { id, reason }, None);
            }
            SessionEvent::Kicked { reason } => {
                // The core already closed the session: report, do not close it again.
                let version = open.version;
                let err = StompError::Kicked(reason);
                self.write_error(version, &err, None);
                self.state = State::Closed(Some(Box::new(err)));
            }
            // Handled above: a session exists only after its login.
            SessionEvent::LoginChecked { .. } => {}
        }
    }

    /// Heart-beat and connect timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        let wants_input = self.wants_input();
        match &mut self.state {
            State::Closed(_) => {}
            State::AwaitConnect(_) | State::CheckingLogin(_) => {
                if self.connect_deadline().is_some_and(|d| now >= d) {
                    self.fail(
                        StompError::ConnectTimeout(self.config.connect_timeout_ms),
                        None,
                    );
                }
            }
            State::Open(open) => {
                let now = Stamp::of(now);
                if !wants_input {
                    // We stopped reading (back-pressure): the client's
                    // heart-beats are waiting in the socket, not missing.
                    open.last_rx = now;
                }
                if receive_due(open).is_some_and(|due| now >= due) {
                    let ms = u64::from(open.beats.receive_grace_ms);
                    return self.fail(StompError::HeartBeatTimeout(ms), None);
                }
                if send_due(open).is_some_and(|due| now >= due) {
                    trace!(conn_id = self.conn_id, "heart-beat sent");
                    if open.has_pending() {
                        open.encode_pending(&mut self.out, open.version, usize::MAX);
                    }
                    self.out.push(b'\n');
                    open.last_tx = now;
                }
            }
        }
    }

    /// When [`StompConnection::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Closed(_) => None,
            State::AwaitConnect(_) | State::CheckingLogin(_) => self.connect_deadline(),
            State::Open(open) => {
                let due = match (send_due(open), receive_due(open)) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                due.and_then(Stamp::instant)
            }
        }
    }

    /// When a client that has not logged in is closed.
    fn connect_deadline(&self) -> Option<Instant> {
        match &self.state {
            State::AwaitConnect(waiting) => waiting.opening.deadline,
            State::CheckingLogin(negotiated) => negotiated.opening.deadline,
            State::Open(_) | State::Closed(_) => None,
        }
    }

    /// Appends the bytes to write to the socket now: every frame written
    /// so far, and waiting deliveries encoded until the output holds
    /// [`OUTPUT_CHUNK_BYTES`]. Call it again once those are written: it
    /// gives the rest, and nothing once all is out.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) {
        if let State::Open(open) = &mut self.state {
            open.encode_pending(&mut self.out, open.version, OUTPUT_CHUNK_BYTES);
        }
        if out.is_empty() {
            // Hand the buffer over rather than copy it; ours becomes the
            // caller's empty one, so an idle connection keeps no output
            // buffer here (the driver frees small ones after writing).
            std::mem::swap(out, &mut self.out);
        } else {
            out.append(&mut self.out);
        }
    }

    /// Writes every waiting delivery: before any other frame, so that
    /// frames go out in the order they were made.
    fn encode_pending(&mut self) {
        if let State::Open(open) = &mut self.state {
            if open.has_pending() {
                open.encode_pending(&mut self.out, open.version, usize::MAX);
            }
        }
    }

    /// False while the driver should stop reading: a passcode check under
    /// way, too many durable commits pending, or the core holding producers
    /// back. (After DISCONNECT bytes are still read, and ignored, so that
    /// EOF and liveness are seen.)
    pub fn wants_input(&self) -> bool {
        match &self.state {
            State::AwaitConnect(_) => true,
            State::CheckingLogin(_) | State::Closed(_) => false,
            State::Open(open) => {
                open.receipts.outstanding() <= self.config.pending_commits_max
                    && !open.session.producer_blocked()
            }
        }
    }

    /// True once the connection is finished.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed(_))
    }

    /// The transport died: close the session abnormally.
    pub fn handle_transport_closed(&mut self, _now: Instant) {
        match std::mem::replace(&mut self.state, State::Closed(None)) {
            State::Open(mut open) => {
                info!(conn_id = self.conn_id, "transport closed");
                open.session.close(CloseKind::Abnormal);
            }
            // Keeps why it failed.
            closed @ State::Closed(_) => self.state = closed,
            State::AwaitConnect(_) | State::CheckingLogin(_) => {}
        }
    }

    /// Why the connection was closed with an ERROR frame (`None` while
    /// open, and after a clean DISCONNECT or a transport close).
    pub fn error(&self) -> Option<&StompError> {
        match &self.state {
            State::Closed(error) => error.as_deref(),
            _ => None,
        }
    }

    /// The negotiated version, once connected.
    pub fn version(&self) -> Option<Version> {
        match &self.state {
            State::Open(open) => Some(open.version),
            _ => None,
        }
    }

    /// Whether frames are decoded now.
    fn reading(&self) -> bool {
        match &self.state {
            State::AwaitConnect(_) => true,
            State::Open(open) => !open.disconnecting,
            State::CheckingLogin(_) | State::Closed(_) => false,
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

    /// The client stopped reading while its deliveries filled the
    /// connection's buffer for too long: ERROR (which it may never read)
    /// and close.
    pub fn handle_slow_consumer(&mut self, _now: Instant) {
        if !self.is_closed() {
            self.fail(StompError::SlowConsumer, None);
        }
    }

    /// Reports `err` in an ERROR frame and closes the connection.
    fn fail(&mut self, err: StompError, receipt: Option<String>) {
        let version = match &self.state {
            State::Open(open) => open.version,
            // Before negotiation write 1.0-safe headers (no escapes needed).
            _ => Version::V1_0,
        };
        self.write_error(version, &err, receipt);
        let closed = State::Closed(Some(Box::new(err)));
        if let State::Open(mut open) = std::mem::replace(&mut self.state, closed) {
            open.session.close(CloseKind::Abnormal);
        }
    }

    fn write_error(&mut self, version: Version, err: &StompError, receipt: Option<String>) {
        info!(conn_id = self.conn_id, error = %err, "closing connection with ERROR");
        self.encode_pending();
        let ef = error_frame(err);
        let mut w = FrameWriter::new(&mut self.out, version, Command::Error);
        w.header("message", &ef.message);
        if let Some(r) = &receipt {
            w.header("receipt-id", r);
        }
        for (name, value) in &ef.headers {
            w.header(name, value);
        }
        w.header("content-type", "text/plain");
        w.finish(ef.body.as_bytes());
    }

    fn on_frame(&mut self, now: Instant, frame: Frame) {
        trace!(conn_id = self.conn_id, command = %frame.command, "frame");
        let receipt = frame.known(KnownHeader::Receipt).map(ReceiptId::new);
        let is_connect = matches!(frame.command, Command::Connect | Command::Stomp);
        let result = match &mut self.state {
            State::Closed(_) | State::CheckingLogin(_) => return,
            State::AwaitConnect(_) => match frame.command {
                Command::Connect | Command::Stomp => self.connect(now, frame),
                other => Err(StompError::ExpectedConnect(other)),
            },
            State::Open(open) => open.handle_frame(&self.config, frame),
        };
        match result {
            Err(e) => self.fail(e, receipt.map(|r| r.as_str().to_owned())),
            // CONNECT takes no receipt (its answer is CONNECTED).
            Ok(_) if is_connect => {}
            Ok(done) => {
                if let State::Open(open) = &mut self.state {
                    open.receipts
                        .push(receipt, &done.tickets, done.disconnect, done.lease_expired);
                    if done.disconnect {
                        open.disconnecting = true;
                    }
                    self.flush_receipts(now);
                }
            }
        }
    }

    /// Writes every RECEIPT that is ready, and closes after DISCONNECT's.
    fn flush_receipts(&mut self, now: Instant) {
        let State::Open(open) = &mut self.state else {
            return;
        };
        let mut wrote = false;
        while let Some(p) = open.receipts.pop_ready() {
            if open.has_pending() {
                open.encode_pending(&mut self.out, open.version, usize::MAX);
            }
            if let Some(r) = &p.receipt {
                let mut w = FrameWriter::new(&mut self.out, open.version, Command::Receipt);
                w.header_own_bytes("receipt-id", r.as_bytes());
                if p.lease_expired {
                    w.header_const(LEASE_EXPIRED_HEADER, "true");
                }
                w.finish(b"");
                wrote = true;
            }
            if p.disconnect {
                info!(conn_id = self.conn_id, "client disconnected");
                open.session.close(CloseKind::Clean);
                self.state = State::Closed(None);
                return;
            }
        }
        if wrote {
            open.last_tx = Stamp::of(now);
        }
    }

    fn connect(&mut self, now: Instant, frame: Frame) -> Result<Done, StompError> {
        let version = match frame.header("accept-version") {
            None => Version::V1_0,
            Some(list) => {
                let offered: Vec<Version> = list.split(',').filter_map(Version::parse).collect();
                SUPPORTED
                    .into_iter()
                    .find(|v| offered.contains(v))
                    .ok_or_else(|| StompError::UnsupportedVersion(list.to_owned()))?
            }
        };
        let heart = if version >= Version::V1_1 {
            let client = match frame.header("heart-beat") {
                None => (0, 0),
                Some(v) => heartbeat::parse(v).ok_or_else(|| StompError::BadHeader {
                    header: "heart-beat",
                    value: v.to_owned(),
                })?,
            };
            heartbeat::negotiate(
                client,
                self.config.heart_beat_send_min_ms,
                self.config.heart_beat_receive_min_ms,
                self.config.heart_beat_grace_percent,
            )
        } else {
            HeartBeat::default()
        };
        let State::AwaitConnect(waiting) = std::mem::replace(&mut self.state, State::Closed(None))
        else {
            return Err(StompError::UnexpectedFrame(frame.command));
        };
        let AwaitConnect {
            opening,
            certificate_user,
        } = *waiting;
        let credentials = Credentials {
            user: frame.header("login"),
            password: frame.header("passcode").map(str::as_bytes),
            certificate_user: certificate_user.as_deref(),
        };
        let login = opening.broker.start_login(credentials, &opening.sink);
        let negotiated = Negotiated {
            version,
            heart,
            client_id: frame.header("client-id").map(str::to_owned),
            host: frame.header("host").unwrap_or("").to_owned(),
            receipt: frame.header("receipt").map(str::to_owned),
            held_input: Vec::new(),
            opening,
        };
        match login {
            LoginStart::Done(result) => self.open(now, negotiated, result?),
            LoginStart::Pending => {
                trace!(conn_id = self.conn_id, "passcode check started");
                self.state = State::CheckingLogin(Box::new(negotiated));
            }
        }
        Ok(Done::now())
    }

    /// Whether the cluster's balancer has no broker for this client. STOMP
    /// cannot redirect, so a client that belongs elsewhere is served here
    /// (docs/cluster.md).
    fn placement_unavailable(
        &self,
        broker: &dyn Broker,
        client_id: Option<&str>,
        principal: &Principal,
    ) -> bool {
        let request = PlacementRequest {
            protocol: Protocol::Stomp,
            client_id,
            user: principal.user.as_deref(),
        };
        match broker.place_connection(&request) {
            Placement::Local => false,
            Placement::Redirect(target) => {
                debug!(conn_id = self.conn_id, target = %target.authority(), "STOMP cannot be redirected; serving the client here");
                false
            }
            Placement::Unavailable => true,
        }
    }

    /// Opens the session of a logged-in client and answers CONNECTED.
    fn open(&mut self, now: Instant, negotiated: Negotiated, principal: Principal) {
        let Negotiated {
            version,
            heart,
            client_id,
            host,
            receipt: _,
            held_input: _,
            opening,
        } = negotiated;
        debug!(
            conn_id = self.conn_id,
            %version,
            host = %host,
            user = principal.user.as_deref().unwrap_or(""),
            "STOMP connect"
        );
        let Opening { broker, sink, .. } = opening;
        if self.placement_unavailable(broker.as_ref(), client_id.as_deref(), &principal) {
            return self.fail(StompError::ServerUnavailable, None);
        }
        let client_key = client_id
            .clone()
            .or_else(|| principal.user.as_deref().map(str::to_owned));
        let session = broker.open_session(
            SessionInfo {
                conn_id: self.conn_id,
                protocol: Protocol::Stomp,
                principal,
                take_over: client_id.is_some(),
                client_id: client_id.map(Arc::from),
            },
            sink,
        );
        self.decoder.set_version(version);
        let mut w = FrameWriter::new(&mut self.out, version, Command::Connected);
        if version >= Version::V1_1 {
            w.header("version", version.as_str());
            let hb = format!("{},{}", heart.send_ms, heart.receive_ms);
            w.header("heart-beat", &hb);
        }
        w.header("server", &self.config.server_name);
        w.header("session", &format!("rosetta-{}", self.conn_id));
        w.finish(b"");
        self.state = State::Open(Box::new(Open::new(
            self.conn_id,
            session,
            version,
            client_key,
            heart.into(),
            Stamp::of(now),
        )));
    }
}

/// When the next heart-beat is due; `None` when off or never.
fn send_due(open: &Open) -> Option<Stamp> {
    open.last_tx.after_ms(open.beats.send_every_ms()?)
}

/// When a silent client is declared dead.
fn receive_due(open: &Open) -> Option<Stamp> {
    open.last_rx.after_ms(open.beats.receive_within_ms()?)
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// What an idle connection holds (issue 20, docs/scaling.md): the
    /// connection inline in the server's parked state (its size test in
    /// `parking` holds that to jemalloc's 224 B class), and `Open` on its
    /// own in the 96 B class. A field more costs every idle connection.
    #[test]
    fn an_idle_connection_stays_within_its_size_classes() {
        let open = std::mem::size_of::<Open>();
        let conn = std::mem::size_of::<StompConnection>();
        let decoder = std::mem::size_of::<Decoder>();
        println!("Open {open} B, StompConnection {conn} B (Decoder {decoder} B)");
        assert!(open <= 96, "Open: {open} B");
        assert!(conn <= 128, "StompConnection: {conn} B");
    }
}
