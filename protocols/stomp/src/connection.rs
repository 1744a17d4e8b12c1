//! The per-connection STOMP state machine.
//!
//! States are types: before CONNECT there is no session at all
//! (`State::AwaitConnect`); authentication yields the `Open` state,
//! which owns the core [`Session`]; `State::Closed` swallows everything.
//! Every error is fatal and reported once, as an ERROR frame, by
//! `StompConnection::fail`.
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
//!   name (RabbitMQ). The queue is [`durable_subscription_queue`] of the
//!   CONNECT `client-id` (else the login) and the name;
//! - UNSUBSCRIBE of a durable subscription keeps its queue unless it
//!   carries `persistent:true`, `durable:true` or
//!   `activemq.subscriptionName`, which delete it;
//! - redelivery: `redelivered:true` and `delivery-count:<n>` on MESSAGE;
//! - `client-id` on CONNECT takes over a live session with the same id.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rosetta_neutral::address::{
    validate_topic_filter, validate_topic_name, TEMP_QUEUE_PREFIX, TOPIC_PREFIX,
};
use rosetta_neutral::{
    durable_subscription_queue, Address, BindingOptions, Broker, CloseKind, ConsumerId,
    ConsumerSpec, CreditMode, Delivery, DeliveryTag, EventSink, Outcome, Protocol, PublishOptions,
    QueueLifetime, QueueSpec, Session, SessionEvent, SessionInfo, Ticket, TxnId,
};
use tracing::{debug, info, trace};

use crate::config::StompConfig;
use crate::convert::{message_from_send, write_message};
use crate::encoder::FrameWriter;
use crate::error::{error_frame, StompError};
use crate::frame::{Command, Frame, Version};
use crate::heartbeat::{self, HeartBeat};
use crate::parser::{Decoder, FrameError};
use crate::receipts::Receipts;
use crate::subscription::{ack_id, parse_ack_id, AckMode, Subscription};

/// Versions this server speaks, best first.
const SUPPORTED: [Version; 3] = [Version::V1_2, Version::V1_1, Version::V1_0];

enum State {
    /// Accepted, no CONNECT yet.
    AwaitConnect,
    /// Authenticated, with a session.
    Open(Box<Open>),
    /// Finished: input and events are ignored.
    Closed,
}

/// An open transaction.
struct Txn {
    id: TxnId,
    /// Acks staged in it, to make them unacknowledged again on ABORT.
    acked: Vec<(ConsumerId, DeliveryTag)>,
}

/// State of an authenticated connection.
struct Open {
    conn_id: u64,
    session: Box<dyn Session>,
    version: Version,
    /// Key of durable subscriptions: `client-id`, else the login.
    client_key: Option<String>,
    heart: HeartBeat,
    subs: HashMap<String, Subscription>,
    by_consumer: HashMap<ConsumerId, String>,
    txns: HashMap<String, Txn>,
    /// `/temp-queue/x` name → the core's generated queue name.
    temp_queues: HashMap<String, String>,
    receipts: Receipts,
    /// DISCONNECT received: no more frames are read.
    disconnecting: bool,
}

/// A STOMP server connection, driven by bytes, core events and time.
pub struct StompConnection {
    config: StompConfig,
    broker: Arc<dyn Broker>,
    sink: Arc<dyn EventSink>,
    conn_id: u64,
    decoder: Decoder,
    state: State,
    out: Vec<u8>,
    /// Time of the call being handled (stamps writes for heart-beats).
    now: Instant,
    last_rx: Instant,
    last_tx: Instant,
    /// `None` when the configured timeout is too large to represent.
    connect_deadline: Option<Instant>,
    /// Why the connection failed, once it has.
    error: Option<StompError>,
}

impl std::fmt::Debug for StompConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StompConnection")
            .field("conn_id", &self.conn_id)
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// What a frame's handler hands back for the receipt queue.
struct Done {
    tickets: Vec<Ticket>,
    disconnect: bool,
}

impl Done {
    fn now() -> Self {
        Done {
            tickets: Vec::new(),
            disconnect: false,
        }
    }
}

impl StompConnection {
    /// A connection that has just been accepted.
    pub fn new(
        config: StompConfig,
        broker: Arc<dyn Broker>,
        sink: Arc<dyn EventSink>,
        conn_id: u64,
        now: Instant,
    ) -> Self {
        let decoder = Decoder::new(config.limits(), Version::V1_0);
        let connect_deadline = now.checked_add(Duration::from_millis(config.connect_timeout_ms));
        Self {
            config,
            broker,
            sink,
            conn_id,
            decoder,
            state: State::AwaitConnect,
            out: Vec::new(),
            now,
            last_rx: now,
            last_tx: now,
            connect_deadline,
            error: None,
        }
    }

    /// Bytes read from the socket (any split: partial frames, many frames).
    pub fn handle_input(&mut self, now: Instant, data: &[u8]) {
        self.now = now;
        // Any byte proves the client alive, even while frames are ignored
        // (after DISCONNECT, waiting for its receipt).
        self.last_rx = now;
        if !self.reading() {
            trace!(conn_id = self.conn_id, len = data.len(), "input ignored");
            return;
        }
        let mut rest = data;
        loop {
            let taken = self.decoder.feed(rest);
            rest = rest.get(taken..).unwrap_or_default();
            let mut progressed = taken > 0;
            while self.reading() {
                match self.decoder.decode() {
                    Ok(Some(frame)) => {
                        progressed = true;
                        self.on_frame(frame);
                    }
                    Ok(None) => break,
                    Err(e) => return self.fail(e.into(), None),
                }
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

    /// An event the core sent to this connection's sink.
    pub fn handle_event(&mut self, now: Instant, event: SessionEvent) {
        self.now = now;
        let was_paused = !self.wants_input();
        self.on_event(now, event);
        if was_paused && self.wants_input() {
            // The client's bytes sat unread in the socket while we paused:
            // its silence was our doing, so its liveness clock restarts.
            self.last_rx = now;
        }
    }

    fn on_event(&mut self, now: Instant, event: SessionEvent) {
        let State::Open(open) = &mut self.state else {
            trace!(conn_id = self.conn_id, ?event, "event after close ignored");
            return;
        };
        match event {
            SessionEvent::Delivery(d) => {
                let version = open.version;
                Self::deliver(&mut self.out, open, version, d);
                self.last_tx = now;
            }
            SessionEvent::Committed { ticket, result } => {
                let receipt = open.receipts.committed(ticket);
                match (receipt, result) {
                    (None, _) => debug!(conn_id = self.conn_id, ?ticket, "unknown ticket"),
                    (Some(receipt), Err(e)) => self.fail(e.into(), receipt),
                    (Some(_), Ok(())) => self.flush_receipts(),
                }
            }
            SessionEvent::Drained { .. } => {}
            SessionEvent::ConsumerClosed { consumer, reason } => {
                let id = open.by_consumer.get(&consumer).cloned().unwrap_or_default();
                self.fail(StompError::SubscriptionClosed { id, reason }, None);
            }
            SessionEvent::Kicked { reason } => {
                // The core already closed the session: report, do not close it again.
                let version = open.version;
                self.state = State::Closed;
                self.write_error(version, &StompError::Kicked(reason), None);
            }
        }
    }

    /// Heart-beat and connect timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        match &self.state {
            State::Closed => {}
            State::AwaitConnect => {
                if self.connect_deadline.is_some_and(|d| now >= d) {
                    self.fail(
                        StompError::ConnectTimeout(self.config.connect_timeout_ms),
                        None,
                    );
                }
            }
            State::Open(open) => {
                let heart = open.heart;
                if !self.wants_input() {
                    // We stopped reading (back-pressure): the client's
                    // heart-beats are waiting in the socket, not missing.
                    self.last_rx = now;
                }
                if self.receive_due(&heart).is_some_and(|due| now >= due) {
                    let grace = heart.receive_deadline.unwrap_or_default();
                    let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
                    return self.fail(StompError::HeartBeatTimeout(ms), None);
                }
                if self.send_due(&heart).is_some_and(|due| now >= due) {
                    trace!(conn_id = self.conn_id, "heart-beat sent");
                    self.out.push(b'\n');
                    self.last_tx = now;
                }
            }
        }
    }

    /// When [`StompConnection::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Closed => None,
            State::AwaitConnect => self.connect_deadline,
            State::Open(open) => {
                match (self.send_due(&open.heart), self.receive_due(&open.heart)) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
        }
    }

    /// When the next heart-beat is due. Intervals come from the client and
    /// may be absurd: an instant past the clock's range means "never".
    fn send_due(&self, heart: &HeartBeat) -> Option<Instant> {
        (heart.send_ms > 0)
            .then(|| {
                self.last_tx
                    .checked_add(Duration::from_millis(heart.send_ms))
            })
            .flatten()
    }

    /// When a silent client is declared dead.
    fn receive_due(&self, heart: &HeartBeat) -> Option<Instant> {
        heart
            .receive_deadline
            .and_then(|grace| self.last_rx.checked_add(grace))
    }

    /// Appends all bytes that should be written to the socket now.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.out);
    }

    /// False while the driver should stop reading: too many durable commits
    /// pending, or the core holding producers back. (After DISCONNECT bytes
    /// are still read, and ignored, so that EOF and liveness are seen.)
    pub fn wants_input(&self) -> bool {
        match &self.state {
            State::AwaitConnect => true,
            State::Closed => false,
            State::Open(open) => {
                open.receipts.outstanding() <= self.config.pending_commits_max
                    && !open.session.producer_blocked()
            }
        }
    }

    /// True once the connection is finished.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// The transport died: close the session abnormally.
    pub fn handle_transport_closed(&mut self, now: Instant) {
        self.now = now;
        if let State::Open(mut open) = std::mem::replace(&mut self.state, State::Closed) {
            info!(conn_id = self.conn_id, "transport closed");
            open.session.close(CloseKind::Abnormal);
        }
    }

    /// Why the connection was closed with an ERROR frame (`None` while
    /// open, and after a clean DISCONNECT or a transport close).
    pub fn error(&self) -> Option<&StompError> {
        self.error.as_ref()
    }

    /// The negotiated version, once connected.
    pub fn version(&self) -> Option<Version> {
        match &self.state {
            State::Open(open) => Some(open.version),
            _ => None,
        }
    }

    fn reading(&self) -> bool {
        match &self.state {
            State::AwaitConnect => true,
            State::Open(open) => !open.disconnecting,
            State::Closed => false,
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
        if let State::Open(mut open) = std::mem::replace(&mut self.state, State::Closed) {
            open.session.close(CloseKind::Abnormal);
        }
    }

    fn write_error(&mut self, version: Version, err: &StompError, receipt: Option<String>) {
        info!(conn_id = self.conn_id, error = %err, "closing connection with ERROR");
        let ef = error_frame(err);
        let mut w = FrameWriter::new(&mut self.out, version, Command::Error);
        w.header("message", ef.message);
        if let Some(r) = &receipt {
            w.header("receipt-id", r);
        }
        for (name, value) in &ef.headers {
            w.header(name, value);
        }
        w.header("content-type", "text/plain");
        w.finish(ef.body.as_bytes());
        self.last_tx = self.now;
        self.error = Some(err.clone());
    }

    fn on_frame(&mut self, frame: Frame) {
        trace!(conn_id = self.conn_id, command = %frame.command, "frame");
        let receipt = frame.header("receipt").map(str::to_owned);
        let is_connect = matches!(frame.command, Command::Connect | Command::Stomp);
        let result = match &mut self.state {
            State::Closed => return,
            State::AwaitConnect => match frame.command {
                Command::Connect | Command::Stomp => self.connect(frame),
                other => Err(StompError::ExpectedConnect(other)),
            },
            State::Open(open) => Self::on_open_frame(&self.config, open, frame),
        };
        match result {
            Err(e) => self.fail(e, receipt),
            // CONNECT takes no receipt (its answer is CONNECTED).
            Ok(_) if is_connect => {}
            Ok(done) => {
                if let State::Open(open) = &mut self.state {
                    open.receipts.push(receipt, &done.tickets, done.disconnect);
                    if done.disconnect {
                        open.disconnecting = true;
                    }
                    self.flush_receipts();
                }
            }
        }
    }

    /// Writes every RECEIPT that is ready, and closes after DISCONNECT's.
    fn flush_receipts(&mut self) {
        let State::Open(open) = &mut self.state else {
            return;
        };
        while let Some(p) = open.receipts.pop_ready() {
            if let Some(r) = &p.receipt {
                FrameWriter::new(&mut self.out, open.version, Command::Receipt)
                    .header("receipt-id", r)
                    .finish(b"");
                self.last_tx = self.now;
            }
            if p.disconnect {
                info!(conn_id = self.conn_id, "client disconnected");
                open.session.close(CloseKind::Clean);
                self.state = State::Closed;
                return;
            }
        }
    }

    fn connect(&mut self, frame: Frame) -> Result<Done, StompError> {
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
        let login = frame.header("login");
        let passcode = frame.header("passcode").map(str::as_bytes);
        let principal = self.broker.authenticate(login, passcode)?;
        let client_id = frame.header("client-id").map(str::to_owned);
        debug!(
            conn_id = self.conn_id,
            %version,
            host = frame.header("host").unwrap_or(""),
            user = principal.user.as_deref().unwrap_or(""),
            "STOMP connect"
        );
        let client_key = client_id.clone().or_else(|| principal.user.clone());
        let session = self.broker.open_session(
            SessionInfo {
                conn_id: self.conn_id,
                protocol: Protocol::Stomp,
                principal,
                take_over: client_id.is_some(),
                client_id,
            },
            Arc::clone(&self.sink),
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
        self.last_tx = self.now;
        self.state = State::Open(Box::new(Open {
            conn_id: self.conn_id,
            session,
            version,
            client_key,
            heart,
            subs: HashMap::new(),
            by_consumer: HashMap::new(),
            txns: HashMap::new(),
            temp_queues: HashMap::new(),
            receipts: Receipts::default(),
            disconnecting: false,
        }));
        Ok(Done::now())
    }

    fn on_open_frame(
        config: &StompConfig,
        open: &mut Open,
        frame: Frame,
    ) -> Result<Done, StompError> {
        match frame.command {
            Command::Send => open.send(config, frame),
            Command::Subscribe => open.subscribe(config, &frame),
            Command::Unsubscribe => open.unsubscribe(&frame),
            Command::Ack => open.ack(config, &frame, Outcome::Accept),
            Command::Nack if open.version == Version::V1_0 => {
                Err(StompError::UnsupportedCommand(Command::Nack, open.version))
            }
            Command::Nack => open.ack(config, &frame, Outcome::NACK),
            Command::Begin => open.begin(config, &frame),
            Command::Commit => open.commit(&frame),
            Command::Abort => open.abort(&frame),
            Command::Disconnect => Ok(Done {
                tickets: Vec::new(),
                disconnect: true,
            }),
            other => Err(StompError::UnexpectedFrame(other)),
        }
    }

    fn deliver(out: &mut Vec<u8>, open: &mut Open, version: Version, d: Delivery) {
        let Some(sub) = open
            .by_consumer
            .get(&d.consumer)
            .and_then(|id| open.subs.get_mut(id))
        else {
            // Raced with UNSUBSCRIBE: the cancel returns it to its queue.
            trace!(
                conn_id = open.conn_id,
                consumer = d.consumer.0,
                "delivery for a cancelled subscription"
            );
            return;
        };
        let id = ack_id(d.consumer, d.tag);
        write_message(out, version, sub, &d, &id);
        sub.delivered(d.tag);
    }
}

fn required<'f>(frame: &'f Frame, header: &'static str) -> Result<&'f str, StompError> {
    frame.header(header).ok_or(StompError::MissingHeader {
        command: frame.command,
        header,
    })
}

fn bad_destination(destination: &str, source: rosetta_neutral::AddressError) -> StompError {
    StompError::BadDestination {
        destination: destination.to_owned(),
        source,
    }
}

impl Open {
    fn txn_id(&self, frame: &Frame) -> Result<Option<TxnId>, StompError> {
        match frame.header("transaction") {
            None => Ok(None),
            Some(name) => self
                .txns
                .get(name)
                .map(|t| Some(t.id))
                .ok_or_else(|| StompError::UnknownTransaction(name.to_owned())),
        }
    }

    /// The core queue behind `/temp-queue/<local>`, declared on first use.
    fn temp_queue(&mut self, config: &StompConfig, local: &str) -> Result<String, StompError> {
        if let Some(name) = self.temp_queues.get(local) {
            return Ok(name.clone());
        }
        if local.is_empty() {
            return Err(bad_destination(
                &format!("{TEMP_QUEUE_PREFIX}{local}"),
                rosetta_neutral::AddressError::Empty,
            ));
        }
        if self.temp_queues.len() >= config.temp_queues_max {
            return Err(StompError::LimitExceeded {
                what: "temporary queues",
                max: config.temp_queues_max,
            });
        }
        let info = self.session.declare_queue(QueueSpec {
            name: None,
            durable: false,
            lifetime: QueueLifetime::Session,
        })?;
        self.temp_queues.insert(local.to_owned(), info.name.clone());
        Ok(info.name)
    }

    /// Where a SEND goes.
    fn send_address(&mut self, config: &StompConfig, dest: &str) -> Result<Address, StompError> {
        if let Some(local) = dest.strip_prefix(TEMP_QUEUE_PREFIX) {
            return Ok(Address::Queue(self.temp_queue(config, local)?));
        }
        let address = Address::parse_destination(dest).map_err(|e| bad_destination(dest, e))?;
        if let Address::Topic(name) = &address {
            validate_topic_name(name).map_err(|e| bad_destination(dest, e))?;
        }
        Ok(address)
    }

    fn send(&mut self, config: &StompConfig, frame: Frame) -> Result<Done, StompError> {
        let dest = required(&frame, "destination")?.to_owned();
        let txn = self.txn_id(&frame)?;
        let address = self.send_address(config, &dest)?;
        let reply_to = match frame.header("reply-to") {
            Some(r) => match r.strip_prefix(TEMP_QUEUE_PREFIX) {
                // Other protocols cannot resolve our local temp name.
                Some(local) => {
                    Some(Address::Queue(self.temp_queue(config, local)?).to_destination())
                }
                None => Some(r.to_owned()),
            },
            None => None,
        };
        let wants_receipt = frame.header("receipt").is_some();
        let message = message_from_send(frame, reply_to)?;
        let confirm = txn.is_none() && (message.durable || wants_receipt);
        let published = self
            .session
            .publish(&address, message, PublishOptions { txn, confirm })?;
        Ok(Done {
            tickets: published.pending.into_iter().collect(),
            disconnect: false,
        })
    }

    fn subscribe(&mut self, config: &StompConfig, frame: &Frame) -> Result<Done, StompError> {
        let dest = required(frame, "destination")?;
        let (id, id_given) = match frame.header("id") {
            Some(id) => (id.to_owned(), true),
            None if self.version == Version::V1_0 => (dest.to_owned(), false),
            None => {
                return Err(StompError::MissingHeader {
                    command: frame.command,
                    header: "id",
                })
            }
        };
        if self.subs.contains_key(&id) {
            return Err(StompError::DuplicateSubscription(id));
        }
        if self.subs.len() >= config.subscriptions_max {
            return Err(StompError::LimitExceeded {
                what: "subscriptions",
                max: config.subscriptions_max,
            });
        }
        let ack_header = frame.header("ack");
        let ack = AckMode::parse(ack_header).ok_or_else(|| StompError::BadHeader {
            header: "ack",
            value: ack_header.unwrap_or_default().to_owned(),
        })?;
        let prefetch = prefetch(config, frame)?;
        let mut durable_queue = None;
        let queue = if let Some(filter) = dest.strip_prefix(TOPIC_PREFIX) {
            validate_topic_filter(filter).map_err(|e| bad_destination(dest, e))?;
            let spec = match durable_name(frame, &id) {
                Some(name) => {
                    let key = self
                        .client_key
                        .as_deref()
                        .ok_or(StompError::DurableWithoutClientId)?;
                    let q = durable_subscription_queue(key, name);
                    durable_queue = Some(q.clone());
                    QueueSpec {
                        name: Some(q),
                        durable: true,
                        lifetime: QueueLifetime::Permanent,
                    }
                }
                None => QueueSpec {
                    name: None,
                    durable: false,
                    lifetime: QueueLifetime::Consumer,
                },
            };
            let info = self.session.declare_queue(spec)?;
            if let Err(e) = self
                .session
                .bind(&info.name, filter, BindingOptions::default())
            {
                self.drop_unused_queue(&info.name, durable_queue.is_none());
                return Err(e.into());
            }
            info.name
        } else if let Some(local) = dest.strip_prefix(TEMP_QUEUE_PREFIX) {
            self.temp_queue(config, local)?
        } else {
            match Address::parse_destination(dest).map_err(|e| bad_destination(dest, e))? {
                Address::Queue(q) => q,
                Address::Topic(_) => unreachable_topic(dest)?,
            }
        };
        let consumer = match self.session.consume(ConsumerSpec {
            queue: queue.clone(),
            credit: CreditMode::Window(prefetch),
            auto_settle: ack == AckMode::Auto,
        }) {
            Ok(c) => c,
            Err(e) => {
                if dest.starts_with(TOPIC_PREFIX) {
                    self.drop_unused_queue(&queue, durable_queue.is_none());
                }
                return Err(e.into());
            }
        };
        debug!(conn_id = self.conn_id, sub = %id, %dest, %queue, ?ack, prefetch, "subscribed");
        self.by_consumer.insert(consumer, id.clone());
        self.subs.insert(
            id.clone(),
            Subscription::new(id, id_given, dest.to_owned(), consumer, ack, durable_queue),
        );
        Ok(Done::now())
    }

    /// Deletes a subscription queue that never got its consumer.
    fn drop_unused_queue(&mut self, queue: &str, temporary: bool) {
        if temporary {
            if let Err(e) = self.session.delete_queue(queue) {
                debug!(conn_id = self.conn_id, %queue, error = %e, "could not delete unused subscription queue");
            }
        }
    }

    fn unsubscribe(&mut self, frame: &Frame) -> Result<Done, StompError> {
        let id = match frame.header("id") {
            Some(id) => id,
            None if self.version == Version::V1_0 => required(frame, "destination")?,
            None => required(frame, "id")?,
        };
        let remove = frame.header("activemq.subscriptionName").is_some()
            || is_true(frame.header("persistent"))
            || is_true(frame.header("durable"));
        let durable_queue = match self.subs.remove(id) {
            Some(sub) => {
                self.by_consumer.remove(&sub.consumer);
                self.session.cancel(sub.consumer)?;
                sub.durable_queue
            }
            // Not active here: ActiveMQ clients remove a durable
            // subscription offline by naming it.
            None => {
                debug!(conn_id = self.conn_id, sub = %id, "UNSUBSCRIBE of an inactive subscription");
                self.client_key
                    .as_deref()
                    .zip(durable_name(frame, id))
                    .map(|(key, name)| durable_subscription_queue(key, name))
            }
        };
        if remove {
            if let Some(q) = durable_queue {
                debug!(conn_id = self.conn_id, queue = %q, "durable subscription removed");
                match self.session.delete_queue(&q) {
                    Ok(()) | Err(rosetta_neutral::BrokerError::NotFound(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(Done::now())
    }

    fn ack(
        &mut self,
        config: &StompConfig,
        frame: &Frame,
        outcome: Outcome,
    ) -> Result<Done, StompError> {
        let id = if self.version == Version::V1_2 {
            frame.header("id").or_else(|| frame.header("message-id"))
        } else {
            frame.header("message-id").or_else(|| frame.header("id"))
        };
        let id = match id {
            Some(id) => id,
            None if self.version == Version::V1_2 => required(frame, "id")?,
            None => required(frame, "message-id")?,
        };
        let unknown = || StompError::UnknownAckId(id.to_owned());
        let (consumer, tag) = parse_ack_id(id).ok_or_else(unknown)?;
        let sub_id = self.by_consumer.get(&consumer).ok_or_else(unknown)?;
        if frame.header("subscription").is_some_and(|s| s != sub_id) {
            return Err(unknown());
        }
        let txn_name = frame.header("transaction");
        let txn = self.txn_id(frame)?;
        let sub = self.subs.get_mut(sub_id).ok_or_else(unknown)?;
        let tags = sub.take_acked(tag).ok_or_else(unknown)?;
        if let Some(t) = txn_name.and_then(|n| self.txns.get(n)) {
            if t.acked.len() + tags.len() > config.transaction_acks_max {
                return Err(StompError::LimitExceeded {
                    what: "acknowledgements in one transaction",
                    max: config.transaction_acks_max,
                });
            }
        }
        let confirm = txn.is_none() && frame.header("receipt").is_some();
        let mut tickets = Vec::new();
        for t in &tags {
            if let Some(ticket) = self.session.settle(consumer, *t, outcome, txn, confirm)? {
                tickets.push(ticket);
            }
        }
        if let Some(t) = txn_name.and_then(|n| self.txns.get_mut(n)) {
            t.acked.extend(tags.iter().map(|tag| (consumer, *tag)));
        }
        Ok(Done {
            tickets,
            disconnect: false,
        })
    }

    fn begin(&mut self, config: &StompConfig, frame: &Frame) -> Result<Done, StompError> {
        let name = required(frame, "transaction")?;
        if self.txns.contains_key(name) {
            return Err(StompError::DuplicateTransaction(name.to_owned()));
        }
        if self.txns.len() >= config.transactions_max {
            return Err(StompError::LimitExceeded {
                what: "open transactions",
                max: config.transactions_max,
            });
        }
        let id = self.session.begin();
        self.txns.insert(
            name.to_owned(),
            Txn {
                id,
                acked: Vec::new(),
            },
        );
        Ok(Done::now())
    }

    fn take_txn(&mut self, frame: &Frame) -> Result<Txn, StompError> {
        let name = required(frame, "transaction")?;
        self.txns
            .remove(name)
            .ok_or_else(|| StompError::UnknownTransaction(name.to_owned()))
    }

    fn commit(&mut self, frame: &Frame) -> Result<Done, StompError> {
        let txn = self.take_txn(frame)?;
        let ticket = self.session.commit(txn.id)?;
        Ok(Done {
            tickets: vec![ticket],
            disconnect: false,
        })
    }

    fn abort(&mut self, frame: &Frame) -> Result<Done, StompError> {
        let txn = self.take_txn(frame)?;
        self.session.rollback(txn.id)?;
        // The staged acks never happened: those messages are unacked again.
        let mut by_consumer: HashMap<ConsumerId, Vec<DeliveryTag>> = HashMap::new();
        for (c, t) in txn.acked {
            by_consumer.entry(c).or_default().push(t);
        }
        for (c, tags) in by_consumer {
            if let Some(sub) = self
                .by_consumer
                .get(&c)
                .and_then(|id| self.subs.get_mut(id))
            {
                sub.restore(&tags);
            }
        }
        Ok(Done::now())
    }
}

/// `parse_destination` only yields a topic for `/topic/…`, handled earlier.
fn unreachable_topic(dest: &str) -> Result<String, StompError> {
    Err(bad_destination(
        dest,
        rosetta_neutral::AddressError::MalformedFilter(dest.to_owned()),
    ))
}

fn is_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The durable subscription name a SUBSCRIBE/UNSUBSCRIBE asks for, if any.
fn durable_name<'f>(frame: &'f Frame, id: &'f str) -> Option<&'f str> {
    frame.header("activemq.subscriptionName").or_else(|| {
        (is_true(frame.header("persistent")) || is_true(frame.header("durable"))).then_some(id)
    })
}

/// The prefetch window of a SUBSCRIBE.
fn prefetch(config: &StompConfig, frame: &Frame) -> Result<u32, StompError> {
    let (header, value) = match (
        frame.header("activemq.prefetchSize"),
        frame.header("prefetch-count"),
    ) {
        (Some(v), _) => ("activemq.prefetchSize", v),
        (None, Some(v)) => ("prefetch-count", v),
        (None, None) => return Ok(config.prefetch_default.clamp(1, config.prefetch_max.max(1))),
    };
    let n: u32 = value.trim().parse().map_err(|_| StompError::BadHeader {
        header,
        value: value.to_owned(),
    })?;
    // 0 would mean "pull" in ActiveMQ, which STOMP cannot express: use 1.
    Ok(n.clamp(1, config.prefetch_max.max(1)))
}
