//! The broker core: addresses, queues, subscriptions, delivery,
//! acknowledgement and redelivery, over the journal.
//!
//! The core knows no wire format. Adapters reach it through the
//! [`rosetta_neutral::Broker`] and [`rosetta_neutral::Session`] traits that
//! [`Core`] implements.
//!
//! ## Shape
//! - [`routing`]: the topic trie of bindings and the queue map, behind one
//!   read-mostly lock (publishes only read it);
//! - [`queue`]: each queue owns its messages and consumers behind its own
//!   mutex, so two queues never contend;
//! - [`session`]: one per connection, holding its consumers, transactions
//!   and will;
//! - [`batch`]: journal records and the in-memory changes that follow them.
//!
//! Lock order, always: session → routing → queue. A queue lock is never held
//! while taking the routing lock; work that needs both (dead-lettering,
//! expiry) collects entries under the queue lock and routes them after.

mod admin;
mod admin_messages;
mod admin_streams;
mod admin_topics;
mod backlog;
mod batch;
mod clock;
pub mod codec;
mod dead_letter;
mod dedup;
mod disk;
mod dispatch;
mod groups;
mod last_value;
mod lease;
mod queue;
mod queue_settings;
mod routing;
mod schedule;
pub mod selector;
mod session;
mod session_index;
pub mod stream;
mod system_topics;
mod tables;
mod traffic;
mod trie;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use rosetta_neutral::login::{self, Credentials, LoginPlan, LoginStart, PasswordCheck};
use rosetta_neutral::{
    Address, AuthError, Broker, EventSink, KickReason, Message, Principal, Protocol,
    ScramCredentials, Session, SessionEvent, SessionInfo,
};

use rosetta_store::{
    Completion, MessageSeq, OsStorage, QueueId, Record, Recovered, Storage, Store, StoreError,
};

pub use admin::{Purged, QueuePage, SessionIdentity};
pub use admin_messages::{MoveTarget, Moved, Peeked, PeekedMessage};
pub use admin_topics::{Page, Subscription};
pub use clock::{Clock, ManualClock, SystemClock};
pub use dead_letter::{
    DeadLetterReason, DEAD_LETTER_REASON_PROPERTY, DELIVERY_COUNT_PROPERTY, ORIGINAL_QUEUE_PROPERTY,
};
pub use dedup::{DedupMode, TopicDedupRule, TopicDedupStats, DEDUP_ID_BYTES_MAX};
pub use disk::DiskFreeMin;
pub use queue::QueueStats;
pub use queue_settings::VISIBILITY_TIMEOUT_MS_MAX;
pub use queue_settings::{
    QueueMatch, QueueOverrides, QueuePattern, QueuePatternError, QueueRule, QueueRules,
    QueueSettings, RedeliveryMultiplier, DEDUP_IDS_MAX_DEFAULT, GROUPS_MAX_DEFAULT,
    QUEUE_PATTERN_WORDS_MAX, REDELIVERY_DELAY_MAX_FACTOR_DEFAULT, REDELIVERY_DELAY_MS_MAX,
    REDELIVERY_MULTIPLIER_MAX,
};
pub use stream::{StreamGroupStats, StreamStats};
pub use traffic::TrafficTotals;

use batch::Batch;
use dead_letter::DeadLetter;
use disk::DiskWatch;
use queue::{DispatchOutput, Entry, MemoryGauge, Queue, QueueLinks};
use routing::{Duplicates, Routing};
use schedule::Timers;
use session::CoreSession;

// The defaults of the core's settings live here, once; `[broker]` and
// `[store]` in `rosetta-config` name these constants rather than repeat them.

/// Dead-letter address: the queue `DLQ`, the name ActiveMQ and Artemis use,
/// so operators find it where they look.
pub const DEAD_LETTER_ADDRESS_DEFAULT: &str = "DLQ";
/// Delivery attempts before a message is dead-lettered (as ActiveMQ and
/// Artemis do by default): enough to ride out a consumer restart loop, few
/// enough that a poison message stops soon.
pub const DELIVERY_ATTEMPTS_MAX_DEFAULT: u32 = 10;
/// Queues named by a producer or consumer spring into being, as STOMP and
/// AMQP clients expect from ActiveMQ and RabbitMQ.
pub const AUTO_CREATE_QUEUES_DEFAULT: bool = true;
/// Payload bytes of queued messages kept in memory; the rest pages to disk.
/// A quarter GiB leaves room on small machines, and a million queued 1 KiB
/// messages fit.
pub const MEMORY_BUDGET_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// Messages one queue may hold: past this, producers get a resource-limit
/// error instead of the broker running out of disk or memory.
pub const QUEUE_DEPTH_MAX_DEFAULT: u64 = 10_000_000;
/// Queues all clients together may create when no configuration says
/// otherwise: ten per connection at the default 100,000 connections (a
/// session queue and a few shared, durable and temporary ones each).
/// RabbitMQ (vhost `max-queues`) and Artemis set no cap by default; every
/// queue holds memory even empty, so clients must not create them without
/// end.
pub const QUEUES_MAX_DEFAULT: usize = 1_000_000;
/// Topic bindings (MQTT subscriptions, STOMP and AMQP topic subscriptions)
/// all clients together may create when no configuration says otherwise:
/// a hundred per connection at the default 100,000 connections, and a
/// hundred times the routing benchmark's table. Each costs a trie entry
/// and a copy of its filter in its queue.
pub const BINDINGS_MAX_DEFAULT: usize = 10_000_000;
/// How often the housekeeping thread looks at wills and idle queues: fine
/// enough for second-granularity MQTT timers. Scheduled messages do not
/// wait for it: the thread wakes at the earliest armed due time.
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(100);
/// How often the housekeeping thread forgets dedup ids whose window has
/// passed: windows are whole seconds, and a sweep walks the queue map.
const DEDUP_EXPIRY_INTERVAL: Duration = Duration::from_secs(1);

/// Core behaviour settings (the `[broker]` configuration section).
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Where rejected and too-often-redelivered messages go (a queue).
    pub dead_letter_address: String,
    /// Failed delivery attempts after which a message is dead-lettered.
    pub delivery_attempts_max: u32,
    /// Where expired messages go (a queue); dropped when `None`.
    pub expiry_address: Option<String>,
    /// Create a queue on first send or consume instead of failing with
    /// not-found.
    pub auto_create_queues: bool,
    /// Bytes of queued messages kept in memory. Past it, queues page new
    /// messages to `paging_dir`. Producers are held back (AMQP credit
    /// withheld, MQTT and STOMP reads paused) past twice the budget with
    /// paging, past the budget without.
    pub memory_budget_bytes: u64,
    /// Where queues page messages past the budget; `None` keeps everything
    /// in memory. Emptied when the core starts: page files are a cache of
    /// the journal.
    pub paging_dir: Option<std::path::PathBuf>,
    /// Most messages one queue may hold (waiting and in flight). A send to
    /// a full queue fails with `BrokerError::ResourceLimit`; a topic
    /// publish skips full subscriber queues (counted in their
    /// `dropped_full_total`) and reaches the others.
    pub queue_depth_max: u64,
    /// Producers are held back while the filesystem of this directory has
    /// less free space than this; `None` never checks.
    pub disk_free_min: Option<DiskFreeMin>,
    /// Most queues at once. A declare (or auto-creation) past it fails
    /// with `BrokerError::ResourceLimit`; the dead-letter and expiry queues
    /// are exempt, so no message is dropped for want of them. Queues
    /// recovered from the journal are kept even past it.
    pub queues_max: usize,
    /// Most topic bindings at once, all queues together; a bind of a new
    /// filter past it fails with `BrokerError::ResourceLimit`. Recovered
    /// bindings are kept even past it.
    pub bindings_max: usize,
    /// Per-queue settings (`[[queues]]`), resolved for each queue when it
    /// is created or recovered. A queue's own dead-letter address and
    /// delivery attempts take the place of `dead_letter_address` and
    /// `delivery_attempts_max` above for that queue.
    pub queue_rules: QueueRules,
    /// Streams (`[[streams]]` and the streams' directory): see [`stream`].
    pub streams: stream::StreamsConfig,
    /// Duplicate detection on topic addresses (`[[topics]]` entries with a
    /// dedup window), tried in order: the first whose filter matches a
    /// topic holds its window.
    pub topic_dedup: Vec<TopicDedupRule>,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            dead_letter_address: DEAD_LETTER_ADDRESS_DEFAULT.into(),
            delivery_attempts_max: DELIVERY_ATTEMPTS_MAX_DEFAULT,
            expiry_address: None,
            auto_create_queues: AUTO_CREATE_QUEUES_DEFAULT,
            memory_budget_bytes: MEMORY_BUDGET_BYTES_DEFAULT,
            paging_dir: None,
            queue_depth_max: QUEUE_DEPTH_MAX_DEFAULT,
            disk_free_min: None,
            queues_max: QUEUES_MAX_DEFAULT,
            bindings_max: BINDINGS_MAX_DEFAULT,
            queue_rules: QueueRules::default(),
            streams: stream::StreamsConfig::default(),
            topic_dedup: Vec::new(),
        }
    }
}

/// Authentication and authorisation as the core needs them. The server
/// implements it over the users file; [`AllowAll`] is the anonymous,
/// unrestricted default.
pub trait AccessControl: Send + Sync + 'static {
    /// Checks a user name and password.
    fn authenticate(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<Principal, AuthError>;
    /// Checks a new connection's password where its cost stalls no other
    /// connection: [`LoginStart::Pending`] once the check is under way
    /// (its result then goes to [`PasswordCheck::finish`]), or an answer
    /// now, [`AuthError::ServerBusy`] included. The provided method checks
    /// on the caller's thread, which is right for checks that cost nothing
    /// ([`AllowAll`]).
    fn authenticate_later(&self, check: PasswordCheck) -> LoginStart {
        LoginStart::Done(self.authenticate(check.user(), Some(check.password())))
    }
    /// SCRAM-SHA-256 credentials of a user.
    fn scram_credentials(&self, user: &str) -> Option<ScramCredentials>;
    /// Whether anonymous clients are allowed.
    fn anonymous_allowed(&self) -> bool;
    /// Accepts a user named by a verified client certificate.
    fn authenticate_certificate(&self, subject: &str) -> Result<Principal, AuthError>;
    /// May `principal` publish to `address`?
    fn may_publish(&self, principal: &Principal, address: &Address) -> bool;
    /// May `principal` subscribe to (or consume from) `address`? For topics
    /// `address` may be a filter.
    fn may_subscribe(&self, principal: &Principal, address: &Address) -> bool;
    /// Topic filters whose topics a subscription of `principal` to
    /// `filter`, which [`Self::may_subscribe`] allowed, must not deliver:
    /// its deny rules that overlap the filter without covering it. The
    /// binding keeps them ([`rosetta_neutral::BindingOptions::excluded`]),
    /// in the journal too. None by default.
    fn excluded_topics(&self, _principal: &Principal, _filter: &str) -> Vec<String> {
        Vec::new()
    }
    /// The roles of `user` in the order its definition lists them (the
    /// balancer's `role_name` key takes the first); none unless the
    /// access control knows of roles.
    fn roles(&self, _user: &str) -> Vec<String> {
        Vec::new()
    }
}

/// Anonymous access to everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllowAll;

impl AccessControl for AllowAll {
    fn authenticate(
        &self,
        user: Option<&str>,
        _password: Option<&[u8]>,
    ) -> Result<Principal, AuthError> {
        Ok(Principal {
            user: user.map(Box::from),
        })
    }
    fn scram_credentials(&self, _user: &str) -> Option<ScramCredentials> {
        None
    }
    fn anonymous_allowed(&self) -> bool {
        true
    }
    fn authenticate_certificate(&self, subject: &str) -> Result<Principal, AuthError> {
        Ok(Principal {
            user: Some(subject.into()),
        })
    }
    fn may_publish(&self, _principal: &Principal, _address: &Address) -> bool {
        true
    }
    fn may_subscribe(&self, _principal: &Principal, _address: &Address) -> bool {
        true
    }
}

/// Where the core writes its records. The real one is the [`Store`];
/// [`NoJournal`] keeps nothing (tests and fully in-memory brokers).
pub trait Journal: Send + Sync + 'static {
    /// Appends records as one atomic unit; `done` runs once durable.
    fn append(&self, records: Vec<Record>, done: Option<Completion>);

    /// Reads journaled messages back by seq: restored queues page their
    /// messages by reference instead of copying them into page files (see
    /// `backlog`). A journal that keeps nothing has nothing to read.
    fn read_messages(&self, seqs: &[MessageSeq]) -> Vec<Result<Arc<Message>, ReadBackError>> {
        seqs.iter()
            .map(|_| Err(ReadBackError::Store(StoreError::Closed)))
            .collect()
    }

    /// The files the journal lives on: where the disk limit of producer
    /// flow control reads free space. A journal that keeps nothing has
    /// the host's files.
    fn storage(&self) -> Arc<dyn Storage> {
        Arc::new(OsStorage)
    }
}

impl Journal for Store {
    fn append(&self, records: Vec<Record>, done: Option<Completion>) {
        Store::append(self, records, done);
    }

    fn read_messages(&self, seqs: &[MessageSeq]) -> Vec<Result<Arc<Message>, ReadBackError>> {
        Store::read_messages(self, seqs)
            .into_iter()
            .zip(seqs)
            .map(|(read, seq)| decode_journaled(*seq, read?))
            .collect()
    }

    fn storage(&self) -> Arc<dyn Storage> {
        Arc::clone(Store::storage(self))
    }
}

/// Why a journaled message could not be had back.
#[derive(Debug, thiserror::Error)]
pub enum ReadBackError {
    /// The store could not read its record.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The record's checksum held but its body does not decode: a codec
    /// bug or a journal written by a newer build.
    #[error("journaled message {seq} does not decode: {source}")]
    Undecodable {
        /// The message.
        seq: MessageSeq,
        /// What the codec found.
        source: rosetta_store::DecodeError,
    },
}

/// A message body the store read back, decoded (never a panic).
fn decode_journaled(seq: MessageSeq, body: Bytes) -> Result<Arc<Message>, ReadBackError> {
    codec::decode_message_exact(body).map_err(|source| ReadBackError::Undecodable { seq, source })
}

/// A journal that keeps nothing and completes at once.
#[derive(Debug, Default)]
pub struct NoJournal;

impl Journal for NoJournal {
    fn append(&self, _records: Vec<Record>, done: Option<Completion>) {
        if let Some(done) = done {
            done(Ok(()));
        }
    }
}

/// A client as take-over and delayed wills know it: its protocol and
/// client id (the session's own string, shared).
type ClientKey = (Protocol, Arc<str>);

struct PendingWill {
    due: Instant,
    client: ClientKey,
    will: rosetta_neutral::Will,
}

pub(crate) struct Inner {
    config: CoreConfig,
    journal: Arc<dyn Journal>,
    access: Arc<dyn AccessControl>,
    routing: RwLock<Routing>,
    retained: Mutex<HashMap<String, (MessageSeq, Arc<Message>)>>,
    client_state: Mutex<HashMap<String, Bytes>>,
    next_seq: AtomicU64,
    next_queue_id: AtomicU64,
    next_session: AtomicU64,
    next_ticket: AtomicU64,
    sessions: Mutex<session_index::SessionsById>,
    clients: Mutex<session_index::SessionsByClient>,
    wills: Mutex<Vec<PendingWill>>,
    /// Free disk space (producer flow control).
    disk: DiskWatch,
    /// The time messages are scheduled, delayed and expired by.
    clock: Arc<dyn Clock>,
    /// One timer pass at a time (the housekeeping thread's, or
    /// [`Core::run_timers`]), so a caller of the latter sees the pass done.
    timer_pass: Mutex<()>,
    /// Bytes held by all queues (producer flow control), messages
    /// published, delivered and acknowledged broker-wide, and the queues'
    /// earliest due times with the housekeeping thread's wakeup: behind
    /// one pointer that every queue holds too (8 bytes per queue, not 24).
    links: Arc<QueueLinks>,
    stopping: AtomicBool,
    /// Streams: logs read without consuming (see [`stream`]).
    streams: Arc<stream::Streams>,
    /// The dedup windows of topic addresses.
    topic_dedup: dedup::TopicWindows,
}

/// The broker core. Cheap to clone; all clones share one broker.
#[derive(Clone)]
pub struct Core {
    inner: Arc<Inner>,
}

impl Core {
    /// A core over `journal`, rebuilt from `recovered` (the journal's
    /// replay), with a housekeeping thread for wills, idle queues and
    /// scheduled messages, on the system clock.
    pub fn new(
        config: CoreConfig,
        journal: Arc<dyn Journal>,
        access: Arc<dyn AccessControl>,
        recovered: Option<Recovered>,
    ) -> Core {
        Core::with_clock(config, journal, access, recovered, Arc::new(SystemClock))
    }

    /// [`Core::new`] on `clock`: expiry, scheduled delivery and redelivery
    /// delays follow it. With a [`ManualClock`], advance it and call
    /// [`Core::run_timers`] to have what became due delivered.
    pub fn with_clock(
        config: CoreConfig,
        journal: Arc<dyn Journal>,
        access: Arc<dyn AccessControl>,
        recovered: Option<Recovered>,
        clock: Arc<dyn Clock>,
    ) -> Core {
        let paging_dir = config.paging_dir.clone().and_then(|dir| {
            // Leftovers of a previous run are stale: the journal rebuilds
            // every queue, and paging starts afresh.
            let _ = std::fs::remove_dir_all(&dir);
            match std::fs::create_dir_all(&dir) {
                Ok(()) => Some(dir),
                Err(e) => {
                    tracing::error!(dir = %dir.display(), error = %e, "cannot create the paging directory; paging is off");
                    None
                }
            }
        });
        let memory = Arc::new(MemoryGauge::new(config.memory_budget_bytes, paging_dir));
        let disk = DiskWatch::new(config.disk_free_min.clone(), journal.storage());
        let streams = stream::Streams::new(
            config.streams.clone(),
            stream::Groups::new(Arc::clone(&journal)),
            Arc::clone(&clock),
        );
        let topic_dedup = dedup::TopicWindows::new(&config.topic_dedup);
        let links = Arc::new(QueueLinks {
            memory,
            timers: Arc::new(Timers::default()),
            traffic: Arc::default(),
        });
        let inner = Arc::new(Inner {
            config,
            topic_dedup,
            streams,
            journal,
            access,
            routing: RwLock::new(Routing::default()),
            retained: Mutex::new(HashMap::new()),
            client_state: Mutex::new(HashMap::new()),
            next_seq: AtomicU64::new(1),
            next_queue_id: AtomicU64::new(1),
            next_session: AtomicU64::new(1),
            next_ticket: AtomicU64::new(1),
            sessions: Mutex::default(),
            clients: Mutex::default(),
            wills: Mutex::new(Vec::new()),
            disk,
            clock,
            timer_pass: Mutex::new(()),
            links,
            stopping: AtomicBool::new(false),
        });
        if let Some(recovered) = recovered {
            inner.restore(recovered);
        }
        let weak = Arc::downgrade(&inner);
        let spawned = std::thread::Builder::new()
            .name("rosetta-housekeeping".into())
            .spawn(move || housekeeping(weak));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the housekeeping thread; wills and idle-queue expiry are off");
        }
        Core { inner }
    }

    /// An in-memory core with no journal and anonymous access (tests).
    pub fn in_memory() -> Core {
        Core::new(
            CoreConfig::default(),
            Arc::new(NoJournal),
            Arc::new(AllowAll),
            None,
        )
    }

    /// Moves what is due by the core's clock now (scheduled messages,
    /// delayed redeliveries) into the queues' backlogs and dispatches it.
    /// The housekeeping thread does this on its own at each due time; a
    /// test on a [`ManualClock`] calls it after advancing the clock. When
    /// it returns, every queue due at the clock's time has been served.
    pub fn run_timers(&self) {
        self.inner.run_timers();
    }

    /// Statistics of every queue, by name.
    pub fn all_queue_stats(&self) -> Vec<(String, QueueStats)> {
        let queues: Vec<_> = self.inner.routing.read().queues().cloned().collect();
        let now_ms = self.inner.now_ms();
        queues
            .into_iter()
            .map(|q| (q.name.to_string(), q.stats(now_ms)))
            .collect()
    }

    /// Settings of every queue, by name, with the broker's dead-letter
    /// address and delivery attempts filled in where the queue has none of
    /// its own (what is in force, for `/metrics`).
    pub fn all_queue_settings(&self) -> Vec<(String, QueueSettings)> {
        let queues: Vec<_> = self.inner.routing.read().queues().cloned().collect();
        queues
            .into_iter()
            .map(|q| (q.name.to_string(), self.inner.settings_in_force(&q)))
            .collect()
    }

    /// Settings of one queue, as [`Core::all_queue_settings`] gives them.
    pub fn queue_settings(&self, name: &str) -> Option<QueueSettings> {
        let q = self.inner.routing.read().queue(name).cloned()?;
        Some(self.inner.settings_in_force(&q))
    }

    /// Figures of each topic dedup window, in configuration order.
    pub fn topic_dedup_stats(&self) -> Vec<TopicDedupStats> {
        self.inner.topic_dedup.stats()
    }

    /// Statistics of one queue.
    pub fn queue_stats(&self, name: &str) -> Option<QueueStats> {
        let now_ms = self.inner.now_ms();
        self.inner
            .routing
            .read()
            .queue(name)
            .map(|q| q.stats(now_ms))
    }

    /// Messages published, delivered and acknowledged since the core
    /// started, broker-wide.
    pub fn traffic(&self) -> TrafficTotals {
        self.inner.links.traffic.totals()
    }

    /// Bytes of messages held by all queues (each queue's copy counted).
    pub fn memory_used(&self) -> u64 {
        self.inner.links.memory.used()
    }

    /// Messages paged out to disk, all queues together.
    pub fn messages_paged(&self) -> u64 {
        self.inner.links.memory.paged()
    }

    /// Free bytes on the data directory's filesystem at the last sample,
    /// when a disk limit is configured.
    pub fn disk_free_bytes(&self) -> Option<u64> {
        self.inner.disk.free_bytes()
    }

    /// Whether producers are held back now (memory or disk limit).
    pub fn producers_blocked(&self) -> bool {
        self.inner.producers_blocked()
    }

    /// Applies the retention of every open stream now (the core does
    /// this on its own every few seconds; tests on a manual clock call it
    /// after advancing the clock).
    pub fn run_stream_retention(&self) {
        self.inner.streams.run_retention();
    }

    /// Names of all queues, in order.
    pub fn queue_names(&self) -> Vec<String> {
        self.inner.routing.read().queue_names()
    }

    /// Sends [`SessionEvent::Kicked`] with [`KickReason::ServerShutdown`] to
    /// every session and stops the housekeeping thread. The connections
    /// close their sessions themselves.
    pub fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        self.inner.links.timers.wake_all();
        let sessions: Vec<_> = self.inner.sessions.lock().iter().cloned().collect();
        for s in sessions {
            s.sink.send(SessionEvent::Kicked {
                reason: KickReason::ServerShutdown,
            });
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.streams.stop();
        self.stopping.store(true, Ordering::SeqCst);
    }
}

impl Broker for Core {
    fn authenticate(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<Principal, AuthError> {
        self.inner.access.authenticate(user, password)
    }

    fn scram_credentials(&self, user: &str) -> Option<ScramCredentials> {
        self.inner.access.scram_credentials(user)
    }

    fn anonymous_allowed(&self) -> bool {
        self.inner.access.anonymous_allowed()
    }

    fn authenticate_certificate(&self, subject: &str) -> Result<Principal, AuthError> {
        self.inner.access.authenticate_certificate(subject)
    }

    /// Logins that need a password check go to the access control's
    /// [`AccessControl::authenticate_later`] (the users file's hashing
    /// pool); the rest are answered now.
    fn start_login(&self, credentials: Credentials<'_>, sink: &Arc<dyn EventSink>) -> LoginStart {
        match login::plan(&credentials) {
            LoginPlan::Cheap(cheap) => LoginStart::Done(cheap.answer(self)),
            LoginPlan::Password { user, password } => self
                .inner
                .access
                .authenticate_later(PasswordCheck::new(user, password, sink)),
        }
    }

    fn open_session(&self, info: SessionInfo, sink: Arc<dyn EventSink>) -> Box<dyn Session> {
        Box::new(CoreSession::open(Arc::clone(&self.inner), info, sink))
    }
}

impl Inner {
    fn next_seq(&self) -> MessageSeq {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Now, by the core's clock (ms since the Unix epoch).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// What every queue shares with the core.
    pub(crate) fn queue_links(&self) -> Arc<QueueLinks> {
        Arc::clone(&self.links)
    }

    /// One timer pass: every queue due now releases what is due, until
    /// none is (a queue with more than one batch due re-arms for now).
    fn run_timers(&self) {
        let _pass = self.timer_pass.lock();
        loop {
            let now = self.now_ms();
            let due = self.links.timers.take_due(now);
            if due.is_empty() {
                return;
            }
            for queue in due {
                let Some(queue) = queue.upgrade() else {
                    continue;
                };
                let mut out = queue.release_due(now, self.delivery_attempts_max(&queue));
                if !out.dead.is_empty() {
                    // The originals' acks and their copies commit together.
                    // Expired leases past their attempts: the only way a
                    // timer dead-letters.
                    let dead = std::mem::take(&mut out.dead)
                        .into_iter()
                        .map(|entry| dead_letter::DeadLetter {
                            entry,
                            from: Arc::clone(&queue),
                            reason: DeadLetterReason::DeliveryAttempts,
                        })
                        .collect();
                    let mut batch = Batch {
                        records: std::mem::take(&mut out.records),
                        ..Batch::default()
                    };
                    self.dead_letter(dead, &mut batch);
                    batch.commit(self, None);
                }
                self.after_dispatch(out);
            }
        }
    }

    fn next_ticket(&self) -> rosetta_neutral::Ticket {
        rosetta_neutral::Ticket(self.next_ticket.fetch_add(1, Ordering::Relaxed))
    }

    /// Journals what a dispatch pass produced and moves expired messages.
    /// Whether producers are held back: past the memory budget, or short
    /// of disk space.
    pub(crate) fn producers_blocked(&self) -> bool {
        self.links.memory.producers_blocked() || self.disk.is_low()
    }

    #[inline]
    fn after_dispatch(&self, out: DispatchOutput) {
        if out.records.is_empty() && out.expired.is_empty() {
            // The usual pass (nothing auto-settled durably, nothing
            // expired): no batch to build. Kept apart from the rest, whose
            // stack frame (a batch, a route) cost a cache miss on every
            // call when they were one function (issue 20: 3.6% of a fan-out
            // in perf).
            return;
        }
        self.journal_and_move(out);
    }

    /// [`Inner::after_dispatch`] when the pass produced something.
    #[inline(never)]
    fn journal_and_move(&self, out: DispatchOutput) {
        // Dead entries come only from `release_due`, whose caller routes
        // them (it knows their queue).
        let DispatchOutput {
            records, expired, ..
        } = out;
        let mut batch = Batch {
            records,
            ..Batch::default()
        };
        if let Some(expiry) = &self.config.expiry_address {
            let target = Address::Queue(expiry.clone());
            for entry in expired {
                let mut msg = (*entry.message).clone();
                // Expired copies must not expire again in the expiry queue,
                // nor wait there for a delivery time they never reached.
                msg.expiry = None;
                msg.delivery_time = None;
                if let Err(e) = self.route(&target, msg, None, &mut batch, Duplicates::Ignore) {
                    tracing::warn!(error = %e, "cannot move an expired message to the expiry address");
                }
            }
        }
        if batch.has_records() || !batch.enqueues.is_empty() {
            batch.commit(self, None);
        }
    }

    /// A queue's settings with the broker's values where it has none.
    fn settings_in_force(&self, queue: &Queue) -> QueueSettings {
        let mut settings = (*queue.settings).clone();
        settings.dead_letter_address = Some(
            settings
                .dead_letter_address_or(&self.config.dead_letter_address)
                .to_owned(),
        );
        settings.delivery_attempts_max =
            Some(settings.delivery_attempts_max_or(self.config.delivery_attempts_max));
        settings
    }

    /// Failed delivery attempts after which `queue` dead-letters a message.
    pub(crate) fn delivery_attempts_max(&self, queue: &Queue) -> u32 {
        queue
            .settings
            .delivery_attempts_max_or(self.config.delivery_attempts_max)
    }

    /// Moves dead entries (too many attempts, rejected) to the dead-letter
    /// address of the queue each came from, within `batch`, so the
    /// original's ack and the copy commit together.
    fn dead_letter(&self, entries: Vec<DeadLetter>, batch: &mut Batch) {
        for DeadLetter {
            entry,
            from,
            reason,
        } in entries
        {
            let target = Address::Queue(
                from.settings
                    .dead_letter_address_or(&self.config.dead_letter_address)
                    .to_owned(),
            );
            let mut msg = (*entry.message).clone();
            dead_letter::annotate(&mut msg, &from.name, reason, entry.delivery_count);
            if let Err(e) = self.route(&target, msg, None, batch, Duplicates::Ignore) {
                tracing::warn!(error = %e, seq = entry.seq, "cannot dead-letter a message; it is dropped");
            }
        }
    }

    fn restore(&self, recovered: Recovered) {
        let Recovered {
            queues,
            bindings,
            messages,
            retained,
            state,
            next_seq,
            next_queue_id,
            report,
        } = recovered;
        tracing::info!(
            ?report,
            queues = queues.len(),
            messages = messages.len(),
            "journal recovered; reading the queued messages back"
        );
        self.next_seq.store(next_seq.max(1), Ordering::SeqCst);
        self.next_queue_id
            .store(next_queue_id.max(1), Ordering::SeqCst);
        let mut routing = self.routing.write();
        let mut by_id: HashMap<QueueId, Arc<Queue>> = HashMap::new();
        for def in queues {
            let lifetime = match codec::decode_queue(def.attributes) {
                Ok(stored) => stored.lifetime,
                // Kept, and kept for good: an expiry we cannot read must not
                // delete what the queue holds.
                Err(e) => {
                    tracing::error!(queue = %def.name, error = %e, "a recovered queue's attributes do not decode; it is kept as a permanent queue");
                    rosetta_neutral::QueueLifetime::Permanent
                }
            };
            let q = Queue::new(
                def.id,
                &def.name,
                true,
                lifetime,
                None,
                self.config.queue_rules.resolve_shared(&def.name),
                self.queue_links(),
            );
            routing.insert_queue(Arc::clone(&q));
            by_id.insert(def.id, q);
        }
        for b in bindings {
            let Some(q) = by_id.get(&b.queue) else {
                continue;
            };
            match codec::decode_binding(b.options) {
                Ok(stored) => {
                    routing.bind(q, &b.filter, stored.options, stored.owner);
                }
                // Stays in the journal, so a build that can decode it still
                // finds it; the subscription is gone until then.
                Err(e) => {
                    tracing::error!(queue = %q.name, filter = %b.filter, error = %e, "a recovered binding does not decode; it stays in the journal");
                }
            }
        }
        // One message at a time, read from the journal as it goes: each
        // queue keeps it in memory or pages it (past the memory budget), so
        // a restart holds no more message bodies than the budget, however
        // deep the queues are. Paged messages stay where they are, in the
        // journal: a queue keeps only a reference (its seq) and reads them
        // back from there (see `backlog`). Compaction, paused while this
        // loop reads by recorded location, may then move their records; the
        // store finds them by seq wherever they are.
        self.links.memory.start_restore(Arc::clone(&self.journal));
        let now_ms = self.now_ms();
        let mut unreadable = 0u64;
        // Acks of what last-value queues dropped while rebuilding (a crash
        // came between a replacement's two appends).
        let mut replaced = Vec::new();
        for m in messages {
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    // Checksummed moments ago, so the disk failed now. The
                    // message stays in the journal (nothing acknowledges
                    // it) and comes back at the next restart; the rest go on.
                    unreadable += 1;
                    if unreadable.is_power_of_two() {
                        tracing::error!(error = %e, unreadable, "cannot read a recovered message back from the journal; it stays there until the next restart");
                    }
                    continue;
                }
            };
            let message = match decode_journaled(m.seq, m.body) {
                Ok(message) => message,
                Err(e) => {
                    // Stays in the journal (nothing acknowledges it), so a
                    // build that can decode it still finds it.
                    unreadable += 1;
                    tracing::error!(error = %e, "a recovered message does not decode; it stays in the journal");
                    continue;
                }
            };
            for placement in m.queues {
                let Some(q) = by_id.get(&placement.queue) else {
                    continue;
                };
                let mut entry = Entry::new(m.seq, Arc::clone(&message), true, now_ms);
                let mut redeliver_at_ms = None;
                if let Some(state) = placement.state {
                    // Undecodable state: delivered before, count unknown.
                    // Counted as one attempt rather than dropped.
                    let state = codec::decode_delivery_state(state).unwrap_or_else(|e| {
                        tracing::error!(seq = m.seq, error = %e, "a recovered delivery state does not decode; counted as one delivery");
                        codec::StoredDelivery {
                            delivery_count: 1,
                            annotation: None,
                            redeliver_at_ms: None,
                        }
                    });
                    entry.redelivered = state.delivery_count > 0 || state.annotation.is_some();
                    entry.delivery_count = state.delivery_count;
                    entry.annotation = state.annotation;
                    redeliver_at_ms = state.redeliver_at_ms;
                }
                if let Some(Address::Topic(topic)) = &message.address {
                    entry.matched = routing::match_info(&q.state.lock().bindings, topic);
                }
                replaced.extend(q.restore(entry, redeliver_at_ms, now_ms));
            }
        }
        self.links.memory.end_restore();
        if !replaced.is_empty() {
            tracing::info!(
                replaced = replaced.len(),
                "last-value queues kept only the newest message per value"
            );
            self.journal.append(replaced, None);
        }
        drop(routing);
        let (dedup_state, state): (Vec<_>, Vec<_>) = state
            .into_iter()
            .partition(|(key, _)| key.starts_with(dedup::DEDUP_STATE_PREFIX));
        let (topic_dedup_state, state): (Vec<_>, Vec<_>) = state
            .into_iter()
            .partition(|(key, _)| key.starts_with(dedup::TOPIC_DEDUP_STATE_PREFIX));
        let mut forget = dedup::restore(dedup_state, &by_id, self.now_ms());
        forget.extend(self.topic_dedup.restore(topic_dedup_state, self.now_ms()));
        if !forget.is_empty() {
            self.journal.append(forget, None);
        }
        let mut r = self.retained.lock();
        for (topic, seq, body) in retained {
            match decode_journaled(seq, body) {
                Ok(message) => {
                    r.insert(topic, (seq, message));
                }
                Err(e) => {
                    tracing::error!(topic, error = %e, "a retained message does not decode; not restored");
                }
            }
        }
        self.client_state.lock().extend(state);
        self.streams.groups.restore(self.client_state.lock().iter());
    }

    /// Forgets dedup ids whose window has passed, in every queue and topic
    /// entry with a window, and journals their tombstones in one append.
    fn expire_dedup_ids(&self) {
        let queues: Vec<Arc<Queue>> = self
            .routing
            .read()
            .queues()
            .filter(|q| q.dedup.is_some())
            .cloned()
            .collect();
        let now_ms = self.now_ms();
        let mut records = Vec::new();
        for q in &queues {
            dedup::expire(q, now_ms, &mut records);
        }
        self.topic_dedup.expire(now_ms, &mut records);
        if !records.is_empty() {
            self.journal.append(records, None);
        }
    }

    fn complete_ticket(sink: &Arc<dyn EventSink>, ticket: rosetta_neutral::Ticket) -> Completion {
        let sink = Arc::clone(sink);
        Box::new(move |result| {
            sink.send(SessionEvent::Committed {
                ticket,
                result: result.map_err(|e| rosetta_neutral::BrokerError::Storage(e.to_string())),
            })
        })
    }
}

/// Publishes due wills and deletes queues idle past their lifetime.
fn housekeeping(inner: Weak<Inner>) {
    let mut dedup_swept = Instant::now();
    loop {
        let Some(inner) = inner.upgrade() else { return };
        if inner.stopping.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        inner.disk.check_if_due(now);
        let due: Vec<PendingWill> = {
            let mut wills = inner.wills.lock();
            let (due, keep) = std::mem::take(&mut *wills)
                .into_iter()
                .partition(|w| w.due <= now);
            *wills = keep;
            due
        };
        for w in due {
            tracing::debug!(client = %w.client.1, "publishing delayed will");
            inner.publish_will(w.will);
        }
        // Collected first: the read guard must be gone before
        // `delete_queue` takes the write lock (a guard in the `for`
        // expression would live for the whole loop and deadlock).
        let expired = inner.routing.read().idle_expired(now);
        for name in expired {
            tracing::debug!(queue = %name, "deleting queue idle past its lifetime");
            if let Err(e) = inner.delete_queue(&name) {
                tracing::warn!(queue = %name, error = %e, "cannot delete idle queue");
            }
        }
        inner.run_timers();
        if now.duration_since(dedup_swept) >= DEDUP_EXPIRY_INTERVAL {
            dedup_swept = now;
            inner.expire_dedup_ids();
        }
        let timers = Arc::clone(&inner.links.timers);
        let now_ms = inner.now_ms();
        // Not holding the core while asleep: a dropped core ends the loop.
        drop(inner);
        timers.wait(now_ms, HOUSEKEEPING_INTERVAL);
    }
}

#[cfg(test)]
mod tests;
