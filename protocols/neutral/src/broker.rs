//! The handle an adapter uses to talk to the broker core.
//!
//! An adapter logs a client in with [`Broker::start_login`] (the identity
//! rule and the asynchronous password check are in [`crate::login`]),
//! opens a [`Session`] for it with [`Broker::open_session`], and from then on calls
//! the session synchronously: declare and bind queues, publish, consume,
//! settle, run transactions. Calls return at once. Work that finishes later
//! (a durable commit, a delivery, a drained consumer) comes back as a
//! [`SessionEvent`] through the [`EventSink`] the adapter's driver handed in.
//! The driver feeds those events into the adapter's state machine, so the
//! adapter itself does no IO and can be tested without sockets.
//!
//! ## Composition recipes
//! - *Queue consumer* (`/queue/q`): [`Session::consume`] on `q`.
//! - *Non-durable topic subscription*: declare a queue with
//!   [`QueueLifetime::Consumer`] and no name, [`Session::bind`] the filter,
//!   consume it.
//! - *Durable subscription*: declare a durable queue named with
//!   [`durable_subscription_queue`], bind, consume. A reconnecting client
//!   declares the same name and finds what it missed.
//! - *MQTT session*: one queue per client id (durable when the session
//!   outlives the connection), one binding per subscription; overlapping
//!   bindings deliver once, with [`Delivery::matched`] describing all matches.
//! - *Shared subscription* `$share/g/f`: a queue named `$share/g/f` bound to
//!   `f`, one consumer per member.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::address::Address;
use crate::budget::{DeliveryBudget, DeliveryCharge};
use crate::login::{self, Credentials, LoginPlan, LoginStart};
use crate::message::{Guarantee, Message};
use crate::placement::{Placement, PlacementRequest};

/// Which wire protocol a session speaks. Used for logs, metrics and to keep
/// client-id namespaces apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// MQTT 3.1.1 or 5.0.
    Mqtt,
    /// STOMP 1.0–1.2.
    Stomp,
    /// AMQP 1.0.
    Amqp,
    /// In-process (tests, admin).
    Internal,
}

impl Protocol {
    /// Short lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Mqtt => "mqtt",
            Protocol::Stomp => "stomp",
            Protocol::Amqp => "amqp",
            Protocol::Internal => "internal",
        }
    }
}

/// Who a client is after authentication.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    /// The user name; `None` for an anonymous client.
    pub user: Option<Box<str>>,
}

impl Principal {
    /// The anonymous principal.
    pub fn anonymous() -> Self {
        Self { user: None }
    }
}

/// Stored SCRAM-SHA-256 credentials of a user (RFC 5802 / RFC 7677).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramCredentials {
    /// The salt.
    pub salt: Vec<u8>,
    /// PBKDF2 iteration count.
    pub iterations: u32,
    /// `H(ClientKey)`.
    pub stored_key: [u8; 32],
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: [u8; 32],
}

/// Why authentication failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Unknown user or wrong password (deliberately not told apart).
    #[error("bad user name or password")]
    BadCredentials,
    /// No credentials given and anonymous access is off.
    #[error("anonymous access is disabled")]
    AnonymousDisabled,
    /// A user name other than the verified client certificate's user
    /// (see [`crate::login`]): the client is who its certificate says, and
    /// may not log in as anyone else.
    #[error("the user name is not the client certificate's user")]
    CertificateMismatch,
    /// Too many password checks are waiting: try again later.
    #[error("too many logins in progress; try again later")]
    ServerBusy,
}

/// Identity of a connection, for the session being opened.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// Process-unique connection id (also in every log line).
    pub conn_id: u64,
    /// The protocol spoken.
    pub protocol: Protocol,
    /// The authenticated principal.
    pub principal: Principal,
    /// Protocol client id (MQTT client id, STOMP `client-id`, AMQP container
    /// id). A second session with the same protocol and client id takes the
    /// first one over when `take_over` is set: the old session is closed and
    /// gets [`SessionEvent::Kicked`]. Shared: the core keys its client
    /// map with it and an adapter may keep the same string.
    pub client_id: Option<Arc<str>>,
    /// Close any live session with the same protocol and client id.
    pub take_over: bool,
}

/// The broker as a whole, shared by every connection.
pub trait Broker: Send + Sync + 'static {
    /// Checks a user name and password against the users file. With no
    /// user name, succeeds only when anonymous access is on.
    fn authenticate(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<Principal, AuthError>;

    /// SCRAM-SHA-256 credentials of `user`, if the user exists.
    fn scram_credentials(&self, user: &str) -> Option<ScramCredentials>;

    /// Whether clients may connect without credentials.
    fn anonymous_allowed(&self) -> bool;

    /// Accepts a user named by a verified TLS client certificate.
    fn authenticate_certificate(&self, subject: &str) -> Result<Principal, AuthError>;

    /// The one rule every adapter applies to a new connection
    /// ([`login::plan`]), checked on the caller's thread: a verified TLS
    /// client certificate (`certificate_user`) names the user, a user name
    /// sent next to it must be the same name, and a password sent is
    /// checked. Without a certificate, the user name and password are
    /// checked as such.
    fn authenticate_connection(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
        certificate_user: Option<&str>,
    ) -> Result<Principal, AuthError> {
        let credentials = Credentials {
            user,
            password,
            certificate_user,
        };
        match login::plan(&credentials) {
            LoginPlan::Cheap(cheap) => cheap.answer(self),
            LoginPlan::Password { user, password } => self.authenticate(user, Some(password)),
        }
    }

    /// Starts logging a new connection in, under the same rule as
    /// [`Broker::authenticate_connection`]. What costs nothing (anonymous,
    /// certificate, a refusal by the rule) is answered at once; a password
    /// check may run elsewhere, and then the answer is
    /// [`LoginStart::Pending`] and the result arrives as
    /// [`SessionEvent::LoginChecked`] through `sink`, the connection's
    /// sink. A broker with no room for another check answers
    /// [`AuthError::ServerBusy`] at once.
    ///
    /// The provided method checks everything at once, on the caller's
    /// thread.
    fn start_login(&self, credentials: Credentials<'_>, sink: &Arc<dyn EventSink>) -> LoginStart {
        let _ = sink;
        login::answer_now(self, &credentials)
    }

    /// Opens a session. Events for it go to `sink`.
    fn open_session(&self, info: SessionInfo, sink: Arc<dyn EventSink>) -> Box<dyn Session>;

    /// Where a connection belongs, asked once the client is known and
    /// before its session opens ([`crate::placement`]). The provided
    /// method keeps everyone here: one node, or a test double.
    fn place_connection(&self, request: &PlacementRequest<'_>) -> Placement {
        let _ = request;
        Placement::Local
    }
}

/// Where the core sends a session's asynchronous events. Implemented by the
/// server's connection driver (a channel into the connection task); must
/// not block.
pub trait EventSink: Send + Sync {
    /// Queues one event for the session's connection.
    fn send(&self, event: SessionEvent);

    /// Queues every event of `events`, in order, as [`Self::send`] would
    /// one at a time, and leaves `events` empty (its capacity kept for the
    /// caller's next run). A sink behind a lock overrides it to take the
    /// lock once per run (a stream reader sends a read's worth of
    /// deliveries at once); the default sends them one by one.
    fn send_many(&self, events: &mut Vec<SessionEvent>) {
        for event in events.drain(..) {
            self.send(event);
        }
    }

    /// The connection's budget for deliveries it has not written yet; the
    /// core charges every delivery to it and stops dispatching to the
    /// connection while it is full. `None`: no bound (in-process sinks).
    fn budget(&self) -> Option<&DeliveryBudget> {
        None
    }

    /// The budget's notice for the connection's driver: the core now
    /// waits for room, or a returned charge made room while it waits (see
    /// [`crate::budget`]). Must not block; the default ignores it.
    fn budget_notice(&self) {}

    /// [`crate::budget::has_room`] through one dynamic call: provided
    /// methods are compiled per sink type, so the budget's own checks
    /// inline into them (a delivery's path, issue 20). Not to override.
    #[doc(hidden)]
    fn budget_has_room(&self) -> bool {
        self.budget()
            .is_none_or(|budget| budget.try_room(|| self.budget_notice()))
    }

    /// Adds `bytes` to the budget, if there is one (whether there is);
    /// see [`Self::budget_has_room`]. Not to override.
    #[doc(hidden)]
    fn budget_charge(&self, bytes: u64) -> bool {
        self.budget().map(|budget| budget.add(bytes)).is_some()
    }

    /// Returns `bytes` to the budget; see [`Self::budget_has_room`]. Not
    /// to override.
    #[doc(hidden)]
    fn budget_uncharge(&self, bytes: u64) {
        if let Some(budget) = self.budget() {
            budget.uncharge(bytes, || self.budget_notice());
        }
    }

    /// The core accepted one publish of the session's client (counted as
    /// the broker-wide `published` total counts: once per publish, a
    /// transaction's at its commit). For per-connection statistics; the
    /// default ignores it.
    fn published(&self) {}
}

/// Identifies one consumer within its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerId(pub u64);

/// Identifies one delivery within its consumer, opaque to adapters. Each
/// delivery gets its own tag, a redelivery of the same message a new one,
/// so a late settlement of an expired lease can never settle the copy
/// delivered after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeliveryTag(pub u64);

/// Correlates a pending durable operation with its [`SessionEvent::Committed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// Identifies an open transaction within its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxnId(pub u64);

/// How long a queue lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueLifetime {
    /// Until deleted explicitly (or by the session-expiry timer below).
    Permanent,
    /// Deleted when the declaring session closes (temporary queues, dynamic
    /// AMQP nodes, MQTT clean sessions).
    Session,
    /// Deleted when its last consumer goes away (non-durable subscriptions).
    Consumer,
    /// Deleted once it has had no consumer for this long (MQTT 5 session
    /// expiry).
    IdleFor(Duration),
}

/// What to declare.
#[derive(Debug, Clone)]
pub struct QueueSpec {
    /// The queue name; `None` asks the core to generate a unique temporary
    /// name (returned in [`QueueInfo::name`]).
    pub name: Option<String>,
    /// Kept in the journal, with its bindings and persistent messages.
    pub durable: bool,
    /// When the queue goes away.
    pub lifetime: QueueLifetime,
    /// Most bindings the queue may have: binding one more filter fails with
    /// [`BrokerError::ResourceLimit`] (an MQTT session queue carries the
    /// session's subscription cap this way). Every declare that gives one
    /// sets it; `None` leaves the queue's cap as it is (none for a new
    /// queue). Not journaled: the owner declares it again after a restart.
    pub bindings_max: Option<usize>,
}

/// The result of a declare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// The queue's name.
    pub name: String,
    /// The queue existed before this declare (MQTT "session present").
    pub existed: bool,
    /// Messages waiting in it.
    pub depth: u64,
}

/// Options of a binding from a topic filter to a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingOptions {
    /// Highest guarantee granted to this binding (MQTT granted QoS);
    /// deliveries are downgraded to it.
    pub max_guarantee: Guarantee,
    /// MQTT 5 subscription identifier, reported on matching deliveries.
    pub subscription_id: Option<u32>,
    /// Do not route messages published by the binding's own client id.
    pub no_local: bool,
    /// Keep the publisher's retain flag on delivery (MQTT 5).
    pub retain_as_published: bool,
    /// Which retained messages to enqueue when the binding is made.
    pub retained: RetainedOnBind,
    /// Topic filters whose topics this binding does not receive, retained
    /// messages included: the subscriber's deny rules that overlap the
    /// filter (a subscription to `test/#` by a user denied
    /// `test/nosubscribe` is granted and never delivers that topic). The
    /// core adds those its access control names when it binds; what an
    /// adapter puts here is kept as well.
    pub excluded: ExcludedFilters,
}

/// The topic filters a binding does not receive (see
/// [`BindingOptions::excluded`]). Boxed, and nothing when empty: most
/// bindings have none, and every subscription keeps its options twice
/// (its route and its queue's binding), so this is 8 bytes rather than a
/// vector's 24 and keeps both in jemalloc's 48 B class (issue 20).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
// A box of a vector: one pointer when there are none.
#[allow(clippy::box_collection)]
pub struct ExcludedFilters(Option<Box<Vec<String>>>);

impl ExcludedFilters {
    /// The filters, in the order they were added.
    pub fn as_slice(&self) -> &[String] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether `filter` is one of them.
    pub fn contains(&self, filter: &str) -> bool {
        self.as_slice().iter().any(|f| f == filter)
    }

    /// Adds `filter`.
    pub fn push(&mut self, filter: String) {
        self.0.get_or_insert_with(Box::default).push(filter);
    }
}

impl From<Vec<String>> for ExcludedFilters {
    fn from(filters: Vec<String>) -> Self {
        Self((!filters.is_empty()).then(|| Box::new(filters)))
    }
}

impl<'a> IntoIterator for &'a ExcludedFilters {
    type Item = &'a String;
    type IntoIter = std::slice::Iter<'a, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl Default for BindingOptions {
    fn default() -> Self {
        Self {
            max_guarantee: Guarantee::ExactlyOnce,
            subscription_id: None,
            no_local: false,
            retain_as_published: false,
            retained: RetainedOnBind::None,
            excluded: ExcludedFilters::default(),
        }
    }
}

impl BindingOptions {
    /// Whether `topic`, which the binding's filter matches, is one it
    /// must not receive.
    pub fn excludes(&self, topic: &str) -> bool {
        self.excluded
            .as_slice()
            .iter()
            .any(|f| crate::address::topic_matches(f, topic))
    }
}

/// MQTT retain-handling, generalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainedOnBind {
    /// Send retained messages matching the filter.
    Send,
    /// Send them only if this binding did not already exist.
    SendIfNew,
    /// Send none.
    None,
}

/// What a bind did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindInfo {
    /// The binding already existed (its options were replaced).
    pub existed: bool,
    /// Retained messages enqueued by the bind.
    pub retained_sent: usize,
}

/// How a consumer's credit (prefetch) works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditMode {
    /// At most `n` unsettled deliveries; settling one frees a slot (MQTT
    /// receive-maximum, STOMP prefetch).
    Window(u32),
    /// Credit is granted explicitly with [`Session::set_credit`] and consumed
    /// by each delivery (AMQP link credit). Starts with a limit of the given
    /// value (see `set_credit`).
    Explicit(u32),
}

/// What to consume.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// The queue to consume from.
    pub queue: String,
    /// Credit model.
    pub credit: CreditMode,
    /// Settle each message as it is sent (STOMP `ack:auto`, MQTT QoS 0
    /// deliveries, AMQP pre-settled). Such deliveries need no `settle`.
    pub auto_settle: bool,
    /// What the client asked for beyond credit (selector, exclusivity,
    /// priority, browsing).
    pub options: ConsumerOptions,
}

/// Longest lease (visibility timeout) a queue or a consumer may ask for,
/// in ms: 12 hours, as SQS. A delivery held longer is better settled or
/// released by its consumer than forgotten in a timer.
pub const VISIBILITY_TIMEOUT_MS_MAX: u32 = 12 * 60 * 60 * 1000;

/// The options a client may give a consumer when it subscribes, the same
/// for every protocol (see `docs/semantics.md` for each protocol's
/// spelling). The queue's own settings win where both say something.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerOptions {
    /// A JMS message selector (JMS 2.0 §3.8) over the message's headers and
    /// properties: only matching messages are offered to this consumer; the
    /// others wait for another. A selector that does not parse fails
    /// `consume` with [`BrokerError::InvalidSelector`].
    pub selector: Option<String>,
    /// Exclusive consumer: while it is attached it is the only one that
    /// receives from the queue; other consumers stand by in attach order.
    pub exclusive: bool,
    /// Consumer priority: consumers of a higher priority get messages while
    /// they can take them; the others only get what they cannot. Default 0.
    pub priority: i32,
    /// A browser: sees the queue's messages without taking them. Its
    /// deliveries are copies that need no settlement, change no delivery
    /// count and leave the queue's order as it is; once it has seen
    /// everything queued it gets [`SessionEvent::BrowseEnded`] and nothing
    /// more.
    pub browse: bool,
    /// This consumer's lease (visibility timeout) in milliseconds: a
    /// delivery it has not settled (nor renewed, [`Session::renew_lease`])
    /// within it returns to the queue and the consumer gets
    /// [`SessionEvent::LeaseExpired`]. Overrides the queue's
    /// `visibility_timeout_ms`; `None` keeps the queue's.
    pub visibility_timeout_ms: Option<u32>,
    /// Read the queue as a stream (STOMP `x-queue-type:stream`, an offset
    /// spec, AMQP's `rabbitmq:stream-offset-spec`, MQTT `$stream/`): from
    /// where, in which group. A queue configured as a stream is read as one
    /// without this; an offset spec on a queue that exists and is not a
    /// stream fails with [`BrokerError::InvalidStreamOffset`].
    pub stream: Option<crate::StreamRead>,
}

/// A consumer's verdict on a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Processed: remove it from the queue.
    Accept,
    /// Not processed, no fault: back to the queue, delivery count unchanged.
    Release,
    /// Not processed: back to the queue. `delivery_failed` raises the
    /// delivery count (and may dead-letter it).
    Modify {
        /// Count this as a failed delivery attempt.
        delivery_failed: bool,
        /// Do not redeliver to this consumer.
        undeliverable_here: bool,
    },
    /// Unprocessable: to the dead-letter address.
    Reject,
}

impl Outcome {
    /// The outcome for a negative acknowledgement (STOMP NACK).
    pub const NACK: Outcome = Outcome::Modify {
        delivery_failed: true,
        undeliverable_here: false,
    };
}

/// Options of a publish.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublishOptions {
    /// Stage in this transaction instead of publishing now.
    pub txn: Option<TxnId>,
    /// Wait for durability: return a [`Ticket`] when the message is durable
    /// and completes only after its commit is on disk.
    pub confirm: bool,
}

/// What a publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishReceipt {
    /// Queues the message was routed to (0: no subscriber; MQTT 5 reason
    /// 0x10). Always 0 for a staged transactional publish.
    pub routed: usize,
    /// Present when a confirm was requested and a journal commit is pending:
    /// answer the producer on [`SessionEvent::Committed`] with this ticket.
    /// Absent when the message is already as safe as it will get.
    pub pending: Option<Ticket>,
}

/// A will message (MQTT last will), published when the session ends
/// without a clean close.
#[derive(Debug, Clone)]
pub struct Will {
    /// Where to publish.
    pub address: Address,
    /// What to publish.
    pub message: Message,
    /// Wait this long first; cancelled if the same client id reconnects.
    pub delay: Duration,
    /// Lifetime of the will message counted from when it is published (MQTT 5
    /// message expiry interval); the core sets [`Message::expiry`] then.
    pub expiry_interval: Option<Duration>,
}

/// How a session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseKind {
    /// The client said goodbye: discard the will.
    Clean,
    /// The connection failed or was closed by the broker: publish the will.
    Abnormal,
    /// Like `Clean`, but publish the will anyway (MQTT 5 DISCONNECT 0x04).
    CleanWithWill,
}

/// Why the core errored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// No such queue (and auto-creation is off).
    #[error("not found: {0}")]
    NotFound(String),
    /// The principal may not do this.
    #[error("not authorized: {0}")]
    Unauthorized(String),
    /// A limit was reached (memory, disk, queue depth, consumers).
    #[error("resource limit exceeded: {0}")]
    ResourceLimit(String),
    /// A malformed address or filter.
    #[error("invalid address: {0}")]
    InvalidAddress(String),
    /// The consumer, delivery or transaction is not known to this session.
    #[error("unknown {0}")]
    Unknown(&'static str),
    /// The queue is owned by another session (exclusive, temporary).
    #[error("in use: {0}")]
    InUse(String),
    /// The session was closed (taken over or shut down).
    #[error("session closed")]
    SessionClosed,
    /// The journal failed; the operation is not durable.
    #[error("storage failure: {0}")]
    Storage(String),
    /// A consumer's message selector does not parse (the text says where
    /// and why).
    #[error("invalid selector: {0}")]
    InvalidSelector(String),
    /// The delivery's lease (visibility timeout) ran out before this
    /// settlement or renewal: the message went back to the queue and the
    /// settlement was not applied.
    #[error("lease expired")]
    LeaseExpired,
    /// A stream offset spec that is not valid here: unparsable, past the
    /// end of the stream, or given for a queue that is not a stream.
    #[error("invalid stream offset: {0}")]
    InvalidStreamOffset(String),
}

/// An asynchronous event for a session.
#[derive(Debug, Clone)]
pub enum SessionEvent {
    /// A message for one of the session's consumers.
    Delivery(Delivery),
    /// A pending durable operation finished.
    Committed {
        /// The ticket from the call that started it.
        ticket: Ticket,
        /// `Err` if the journal failed: the producer must be told.
        result: Result<(), BrokerError>,
    },
    /// Several pending durable operations finished, all of them
    /// successfully: the same as one `Committed { ticket, result: Ok(()) }`
    /// per ticket, in this order. The core sends it where one journal or
    /// log write made many of a session's operations durable at once (a
    /// stream's group commit), so that a run of receipts costs the
    /// connection one event, not one each. Never empty; a failure is
    /// always a [`SessionEvent::Committed`] of its own.
    CommittedRun {
        /// The tickets from the calls that started them.
        tickets: Vec<Ticket>,
    },
    /// A drain request finished: the consumer's credit is now zero.
    Drained {
        /// The consumer.
        consumer: ConsumerId,
    },
    /// A browser has seen every message the queue held and will get no
    /// more deliveries (STOMP sends ActiveMQ's end-of-browse MESSAGE, AMQP
    /// drains the link's credit).
    BrowseEnded {
        /// The consumer.
        consumer: ConsumerId,
    },
    /// The consumer was closed by the broker (queue deleted).
    ConsumerClosed {
        /// The consumer.
        consumer: ConsumerId,
        /// Why.
        reason: BrokerError,
    },
    /// A delivery's lease ran out while its consumer stayed connected: the
    /// message went back to the queue (to come again under a new tag), and
    /// a settlement of `tag` now fails with [`BrokerError::LeaseExpired`].
    /// The adapter forgets the delivery (and may tell the client).
    LeaseExpired {
        /// The consumer.
        consumer: ConsumerId,
        /// The expired delivery.
        tag: DeliveryTag,
    },
    /// The session was closed by the broker: taken over by a new connection
    /// with the same client id, the broker is shutting down, or an operator
    /// closed the connection.
    Kicked {
        /// Why.
        reason: KickReason,
    },
    /// The password check a [`Broker::start_login`] started has finished
    /// (sent before any session exists, so there is at most one per
    /// connection).
    LoginChecked {
        /// Who the client is, or why it may not log in.
        result: Result<Principal, AuthError>,
    },
}

/// Why a session was closed by the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KickReason {
    /// Another connection with the same client id took the session.
    TakenOver,
    /// The broker is shutting down.
    ServerShutdown,
    /// An operator closed the connection (the admin API's `DELETE
    /// /api/v1/connections/{id}`), with the text the client is shown where
    /// its protocol carries one (MQTT 5 DISCONNECT 0x98 reason string,
    /// STOMP ERROR `message`, AMQP close description).
    Administrative(String),
}

/// Which bindings of a queue a message matched (for MQTT overlapping
/// subscriptions). Empty fields for plain queue deliveries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MatchInfo {
    /// The highest guarantee granted among the matching bindings.
    pub max_guarantee: Option<Guarantee>,
    /// Subscription identifiers of all matching bindings, ascending, each once.
    pub subscription_ids: Vec<u32>,
    /// Some matching binding asked for retain-as-published.
    pub retain_as_published: bool,
}

/// One message handed to a consumer.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The consumer.
    pub consumer: ConsumerId,
    /// Settle with this tag.
    pub tag: DeliveryTag,
    /// The message, shared with every other copy.
    pub message: Arc<Message>,
    /// Failed delivery attempts before this one (AMQP `delivery-count`).
    pub delivery_count: u32,
    /// The message may have been seen before (MQTT DUP, STOMP
    /// `redelivered`, AMQP `first-acquirer` false).
    pub redelivered: bool,
    /// Sent from the retained store because of a new subscription.
    pub from_retained: bool,
    /// Which bindings matched.
    pub matched: MatchInfo,
    /// The adapter's saved state for this in-flight delivery (see
    /// [`Session::annotate`]), e.g. an MQTT packet id. Survives restarts.
    pub annotation: Option<Bytes>,
    /// The delivery's bytes on its connection's [`DeliveryBudget`]: the
    /// adapter drops the delivery (or takes the charge out and drops it)
    /// once the delivery is written into its output.
    pub charge: DeliveryCharge,
    /// For a stream delivery: its offset and timestamp (adapters show them
    /// as `x-stream-offset`). `None` for queue deliveries.
    pub stream: Option<crate::StreamPosition>,
}

/// A connection's handle on the core.
///
/// Every method returns at once. Methods that change durable state and
/// take `confirm`/return a [`Ticket`] finish on [`SessionEvent::Committed`].
pub trait Session: Send {
    /// Declares a queue, or finds it. Declaring an existing permanent or
    /// idle-expiring queue with another of those two lifetimes changes its
    /// lifetime (durably for a durable queue); its durability never changes.
    fn declare_queue(&mut self, spec: QueueSpec) -> Result<QueueInfo, BrokerError>;

    /// Declares the stream `name` (a queue kept as a log, see
    /// [`crate::stream`]), or finds it: `Ok(true)` when it existed. Fails
    /// with [`BrokerError::InvalidStreamOffset`] when a queue that is not a
    /// stream has the name. A broker without streams says not-found.
    fn declare_stream(&mut self, name: &str) -> Result<bool, BrokerError> {
        Err(BrokerError::NotFound(format!(
            "stream '{name}': no streams here"
        )))
    }

    /// Deletes a queue and drops its messages.
    fn delete_queue(&mut self, name: &str) -> Result<(), BrokerError>;

    /// Binds a topic filter to a queue: each message published to a
    /// matching topic gets copied into the queue once, however many of the
    /// queue's bindings match.
    fn bind(
        &mut self,
        queue: &str,
        filter: &str,
        options: BindingOptions,
    ) -> Result<BindInfo, BrokerError>;

    /// Removes a binding. Returns whether it existed.
    fn unbind(&mut self, queue: &str, filter: &str) -> Result<bool, BrokerError>;

    /// Publishes, or stages in a transaction.
    fn publish(
        &mut self,
        address: &Address,
        message: Message,
        options: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError>;

    /// [`Session::publish`] to the address the message names
    /// (`message.address`), which the core then keeps rather than copies:
    /// an adapter that builds the address for each publish anyway hands it
    /// over with the message. A message without an address is refused
    /// ([`BrokerError::InvalidAddress`]).
    ///
    /// The message comes in the `Arc` the core keeps it in: built there
    /// once by the adapter, it is not copied again on its way through the
    /// session and routing (a `Message` is over 400 bytes, and passing it
    /// by value through those layers copied it six times per publish).
    fn publish_addressed(
        &mut self,
        message: Arc<Message>,
        options: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError> {
        let Some(address) = message.address.clone() else {
            return Err(BrokerError::InvalidAddress(
                "a message without an address".to_owned(),
            ));
        };
        self.publish(&address, Arc::unwrap_or_clone(message), options)
    }

    /// Starts consuming a queue.
    fn consume(&mut self, spec: ConsumerSpec) -> Result<ConsumerId, BrokerError>;

    /// Stops a consumer. Its unsettled deliveries go back to the queue.
    fn cancel(&mut self, consumer: ConsumerId) -> Result<(), BrokerError>;

    /// Grants an explicit-credit consumer deliveries up to `limit`, counted
    /// as AMQP counts link credit: the core numbers the deliveries it hands
    /// this consumer from 0 (wrapping), and sends while that number is
    /// below `limit`. The adapter passes the number of deliveries it has
    /// *received* plus the credit it grants, so deliveries still on their
    /// way to it count against the grant and the consumer never gets more
    /// than it asked for (an absolute credit would let the core send that
    /// credit again on top of whatever was already in transit). A limit at
    /// or below what was sent grants nothing. With `drain`, the core sends
    /// what it has up to the limit, then gives up the rest and sends
    /// [`SessionEvent::Drained`].
    fn set_credit(
        &mut self,
        consumer: ConsumerId,
        limit: u32,
        drain: bool,
    ) -> Result<(), BrokerError>;

    /// Settles a delivery. Inside a transaction the outcome is staged.
    /// Returns a ticket when the settlement's journal write is pending and
    /// `confirm` is set.
    fn settle(
        &mut self,
        consumer: ConsumerId,
        tag: DeliveryTag,
        outcome: Outcome,
        txn: Option<TxnId>,
        confirm: bool,
    ) -> Result<Option<Ticket>, BrokerError>;

    /// Settles several deliveries, outside any transaction, with one
    /// outcome: what an adapter does with a run of acknowledgements read in
    /// one go (MQTT QoS 0 deliveries once written, an AMQP disposition
    /// range). Cheaper than one [`Session::settle`] each: the core locks
    /// each queue and dispatches once per run of one consumer's
    /// deliveries. Unknown deliveries are skipped; returns how many were
    /// settled. No ticket: use `settle` to wait for durability.
    ///
    /// The provided method settles one by one; a broker overrides it.
    fn settle_many(
        &mut self,
        deliveries: &[(ConsumerId, DeliveryTag)],
        outcome: Outcome,
    ) -> Result<usize, BrokerError> {
        let mut settled = 0;
        for &(consumer, tag) in deliveries {
            match self.settle(consumer, tag, outcome, None, false) {
                Ok(_) => settled += 1,
                Err(BrokerError::SessionClosed) => return Err(BrokerError::SessionClosed),
                Err(_) => {}
            }
        }
        Ok(settled)
    }

    /// Saves adapter state for an unsettled delivery (e.g. the MQTT packet
    /// id and PUBREL phase); returned in [`Delivery::annotation`] when the
    /// message is redelivered, across restarts for durable queues.
    fn annotate(
        &mut self,
        consumer: ConsumerId,
        tag: DeliveryTag,
        annotation: Bytes,
    ) -> Result<(), BrokerError>;

    /// Restarts the lease of an unsettled delivery from now (its consumer's
    /// or queue's visibility timeout). Fails with
    /// [`BrokerError::LeaseExpired`] when the lease already ran out, and
    /// with [`BrokerError::Unknown`] for a delivery that is not in flight.
    /// A delivery without a lease has nothing to renew: `Ok`.
    ///
    /// The provided method knows no leases (test doubles).
    fn renew_lease(&mut self, consumer: ConsumerId, tag: DeliveryTag) -> Result<(), BrokerError> {
        let _ = (consumer, tag);
        Err(BrokerError::Unknown("delivery"))
    }

    /// Starts a transaction.
    fn begin(&mut self) -> TxnId;

    /// Commits a transaction: all staged publishes and settlements take
    /// effect together, in one journal write. Finishes on the ticket.
    fn commit(&mut self, txn: TxnId) -> Result<Ticket, BrokerError>;

    /// Discards a transaction's staged work.
    fn rollback(&mut self, txn: TxnId) -> Result<(), BrokerError>;

    /// Reads durable per-client state saved with [`Session::put_state`]
    /// (keyed by protocol, client id and `key`).
    fn get_state(&mut self, key: &str) -> Option<Bytes>;

    /// Saves (or with `None`, deletes) durable per-client state.
    fn put_state(&mut self, key: &str, value: Option<Bytes>)
        -> Result<Option<Ticket>, BrokerError>;

    /// Sets or clears the will published on abnormal close. Fails with
    /// [`BrokerError::Unauthorized`] when the principal may not publish to
    /// the will's address (the will is then not set).
    fn set_will(&mut self, will: Option<Will>) -> Result<(), BrokerError>;

    /// True while producers should be held back (memory or disk limit):
    /// AMQP withholds credit, others stop reading.
    fn producer_blocked(&self) -> bool;

    /// Whether this session's principal may publish to `address`. Every
    /// publish is checked anyway; adapters ask first to refuse a producer
    /// early (an AMQP sending link at attach, as clients expect).
    fn may_publish(&self, address: &Address) -> bool {
        let _ = address;
        true
    }

    /// The connection's delivery budget has room again after the core held
    /// deliveries back for lack of it (see [`crate::budget`]): dispatch to
    /// this session's consumers again. Called by the connection's owner
    /// once per [`DeliveryBudget::take_resume`](crate::DeliveryBudget::take_resume)
    /// that says so, outside any other call into the session; a session
    /// whose sink has no budget is never held back and never resumed.
    fn resume_deliveries(&mut self);

    /// Ends the session (a no-op when already closed, e.g. after
    /// [`SessionEvent::Kicked`]): consumers are cancelled, unsettled deliveries go
    /// back to their queues, session-lifetime queues are deleted, open
    /// transactions roll back, and the will is handled per `kind`.
    fn close(&mut self, kind: CloseKind);
}

/// Settles `batch` with one [`Session::settle_many`] and empties it,
/// keeping its capacity for the next batch: what an adapter does with the
/// deliveries it collected over one read or one write. An empty batch
/// costs nothing.
pub fn settle_batch(
    session: &mut dyn Session,
    batch: &mut Vec<(ConsumerId, DeliveryTag)>,
    outcome: Outcome,
) -> Result<usize, BrokerError> {
    if batch.is_empty() {
        return Ok(0);
    }
    let settled = session.settle_many(batch, outcome);
    batch.clear();
    settled
}

/// Name of the durable queue behind a durable topic subscription. The same
/// scheme serves STOMP (client-id, subscription name) and AMQP (container
/// id, link name), so that a reconnecting client finds its queue again.
pub fn durable_subscription_queue(client_id: &str, subscription: &str) -> String {
    format!("$durable/{client_id}/{subscription}")
}

/// Name of the queue behind an MQTT session.
pub fn mqtt_session_queue(client_id: &str) -> String {
    format!("$mqtt/{client_id}")
}

/// Prefix of MQTT shared subscription filters, also the queue name scheme.
pub const SHARED_SUBSCRIPTION_PREFIX: &str = "$share/";
