//! Streams in the core: queues kept as logs ([`rosetta_store::log`]),
//! read without being consumed, from a chosen offset, by any number of
//! readers, with consumer groups whose committed offsets live in the
//! journal.
//!
//! # Shape
//!
//! - this module: the configuration (`[[streams]]` rules), the open
//!   streams by name, the pump thread that serves readers when appends
//!   become durable, and retention runs;
//! - `reader`: one stream consumer: its position, credit and unsettled
//!   deliveries, and the pump that reads its next records from the log;
//! - `groups`: committed offsets as journal `State` records under
//!   `$stream/<stream>/<group>`;
//! - `partition`: partitioned streams (`partitions = N`): `N` logs named
//!   `<name>-<n>`, and the key hash that routes a publish to one;
//! - `assign` and `members`: a group's partitions spread over its
//!   members, and the rebalance when one comes or goes;
//! - `commits`: a group commit's receipts, one event per session;
//! - `stats`: each log's offsets, size, readers and groups' lag, for
//!   operators.
//!
//! # One copy, readers that cost only their credit
//!
//! A stream's messages are on disk once, in its log. A reader holds only
//! its position and the deliveries it has not settled (at most its
//! credit): each delivery is read from the log (the log's in-memory tail
//! for a reader near the end, else the page cache or the disk). Readers
//! near the end share one decoded message per record (`decoded`); a
//! reader deep in history decodes its own.
//!
//! # Declaration
//!
//! A name is a stream when a `[[streams]]` rule names it (exactly, or by
//! a prefix pattern ending in `*`), when its log directory exists (it was
//! declared before), or when a consumer asks for one
//! ([`rosetta_neutral::ConsumerOptions::stream`]) or
//! [`rosetta_neutral::Session::declare_stream`] is called and no queue of
//! that name exists: declaration at first use, as RabbitMQ does.

mod assign;
mod commits;
mod decoded;
mod groups;
mod members;
mod partition;
#[cfg(test)]
mod partition_tests;
mod read_pool;
mod reader;
mod stats;
#[cfg(test)]
mod tests;
mod unsettled;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rosetta_neutral::{
    BrokerError, EventSink, Message, SessionEvent, StreamOffset, StreamRead, Ticket,
};
use rosetta_store::log::{DurableHook, LogCompletion, LogConfig, StreamLog, TailCacheBudget};
use rosetta_store::{OsStorage, Storage, SyncPolicy};

pub(crate) use groups::Groups;
pub(crate) use partition::Partitioned;
pub(crate) use reader::{ReadSource, Reader, Settlement};
pub use stats::{StreamGroupStats, StreamStats};

/// Most streams open at once: each holds open files and an index in
/// memory, and a client must not be able to create them without end.
pub const STREAMS_MAX: usize = 10_000;
/// How often retention looks at every open stream: age limits are in
/// seconds, and a run only compares timestamps until something is due.
const RETENTION_INTERVAL: Duration = Duration::from_secs(10);
/// Longest stream name accepted, in bytes (it names a directory).
pub const STREAM_NAME_BYTES_MAX: usize = 200;
/// Most partitions of one stream: each is a log with open files.
pub const STREAM_PARTITIONS_MAX: u32 = 256;
/// Memory all streams' tail caches share (see `rosetta_store::log`'s
/// `tail`): readers at the tail of busy streams read the newest batches
/// from memory, one copy however many they are.
const STREAMS_TAIL_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// One stream's share of it at most: a few write batches.
const STREAM_TAIL_CACHE_BYTES: u64 = 8 * 1024 * 1024;

/// One `[[streams]]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRule {
    /// A stream name, or a prefix followed by `*` (`orders.*`, `*`).
    pub pattern: String,
    /// Retention by age, in seconds (`None`: none).
    pub max_age_s: Option<u64>,
    /// Retention by size, in bytes (`None`: none).
    pub max_bytes: Option<u64>,
    /// Segment size in bytes.
    pub segment_bytes: u64,
    /// Partitions: more than 1 makes it a partitioned stream of logs
    /// `<name>-0` … (see `partition`).
    pub partitions: u32,
    /// The property whose value is a publish's partition key, looked at
    /// before the message group (`JMSXGroupID`, AMQP `group-id`).
    pub partition_key: Option<String>,
}

impl StreamRule {
    fn matches(&self, name: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => self.pattern == name,
        }
    }
}

/// How the core keeps streams.
#[derive(Debug, Clone)]
pub struct StreamsConfig {
    /// The directory holding one subdirectory per stream; `None` turns
    /// streams off (asking for one fails with not-found).
    pub dir: Option<PathBuf>,
    /// The broker's sync policy, the journal's.
    pub sync: SyncPolicy,
    /// `[[streams]]`, first match wins.
    pub rules: Vec<StreamRule>,
    /// Settings of a stream declared at first use that no rule names.
    pub defaults: StreamRule,
    /// Where the files are (a simulated disk in tests).
    pub storage: Arc<dyn Storage>,
}

impl Default for StreamsConfig {
    fn default() -> Self {
        Self {
            dir: None,
            sync: SyncPolicy::EveryCommit,
            rules: Vec::new(),
            defaults: StreamRule {
                pattern: "*".into(),
                max_age_s: None,
                max_bytes: None,
                segment_bytes: rosetta_store::log::LOG_SEGMENT_DEFAULT_BYTES,
                partitions: 1,
                partition_key: None,
            },
            storage: Arc::new(OsStorage),
        }
    }
}

/// One open stream.
pub(crate) struct Stream {
    pub(crate) name: Arc<str>,
    pub(crate) log: StreamLog,
    readers: Mutex<Vec<Weak<Reader>>>,
    /// The newest records' messages, decoded once for all readers.
    pub(crate) decoded: Mutex<decoded::Decoded>,
    /// The receipts of the batch being completed, sent once it is.
    commits: Arc<commits::CommitRuns>,
}

impl Stream {
    /// Serves every reader that has credit and something to read.
    fn pump_all(&self, groups: &groups::Groups) {
        let readers: Vec<Arc<Reader>> = {
            let mut rs = self.readers.lock();
            rs.retain(|r| r.strong_count() > 0);
            rs.iter().filter_map(Weak::upgrade).collect()
        };
        for r in readers {
            r.pump(groups);
        }
    }
}

/// What a stream name stands for.
#[derive(Clone)]
pub(crate) enum Target {
    /// One log.
    One(Arc<Stream>),
    /// The logs of a partitioned stream.
    Parts(Arc<Partitioned>),
}

impl Target {
    /// The log a publish of `message` is appended to.
    pub(crate) fn for_publish(&self, message: &Message) -> &Arc<Stream> {
        match self {
            Target::One(s) => s,
            Target::Parts(p) => p.route(message),
        }
    }

    /// What a reader of it reads, its reads from the device done by
    /// `reads`.
    pub(crate) fn source(&self, reads: &Arc<read_pool::ReadPool>) -> ReadSource {
        let reads = Arc::clone(reads);
        match self {
            Target::One(s) => ReadSource {
                name: Arc::clone(&s.name),
                streams: vec![Arc::clone(s)],
                partitioned: false,
                reads,
            },
            Target::Parts(p) => ReadSource {
                name: Arc::clone(&p.name),
                streams: p.parts.clone(),
                partitioned: true,
                reads,
            },
        }
    }
}

/// The streams of one core.
pub(crate) struct Streams {
    config: StreamsConfig,
    /// The core's clock: record timestamps and retention by age.
    clock: Arc<dyn crate::Clock>,
    open: Mutex<HashMap<String, Arc<Stream>>>,
    /// Partitioned streams opened, by name (their logs are in `open`).
    partitioned: Mutex<HashMap<String, Arc<Partitioned>>>,
    /// The members of partitioned streams' groups.
    members: members::Members,
    /// Streams whose log directory was there at start (declared before a
    /// restart): listed once, so that telling a queue from a stream costs
    /// a publish no file system call.
    known: HashSet<String>,
    pump: Arc<PumpQueue>,
    /// The threads that read history for readers (see `read_pool`).
    pub(crate) reads: Arc<read_pool::ReadPool>,
    tail_cache: Arc<TailCacheBudget>,
    pub(crate) groups: groups::Groups,
}

#[derive(Default)]
struct PumpQueue {
    dirty: Mutex<(VecDeque<Weak<Stream>>, bool)>,
    wake: Condvar,
}

impl PumpQueue {
    fn mark(&self, stream: &Arc<Stream>) {
        let mut d = self.dirty.lock();
        if !d
            .0
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(stream)))
        {
            d.0.push_back(Arc::downgrade(stream));
        }
        drop(d);
        self.wake.notify_one();
    }
}

/// A stream directory's name: the stream name with every byte outside
/// `[A-Za-z0-9._-]` written `%XX`, so any name is one safe path component.
fn dir_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The stream name a directory name holds (the inverse of [`dir_name`]).
fn name_of_dir(dir: &str) -> Option<String> {
    let b = dir.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl Streams {
    pub(crate) fn new(
        config: StreamsConfig,
        groups: groups::Groups,
        clock: Arc<dyn crate::Clock>,
    ) -> Arc<Streams> {
        let known = config
            .dir
            .as_ref()
            .and_then(|d| config.storage.list(d).ok())
            .unwrap_or_default()
            .iter()
            .filter_map(|n| name_of_dir(n))
            .collect();
        let s = Arc::new(Streams {
            config,
            clock,
            known,
            open: Mutex::new(HashMap::new()),
            partitioned: Mutex::new(HashMap::new()),
            members: members::Members::default(),
            pump: Arc::new(PumpQueue::default()),
            reads: Arc::new(read_pool::ReadPool::default()),
            tail_cache: TailCacheBudget::new(STREAMS_TAIL_CACHE_BYTES),
            groups,
        });
        if s.config.dir.is_some() {
            let weak = Arc::downgrade(&s);
            let spawned = std::thread::Builder::new()
                .name("rosetta-stream-pump".into())
                .spawn(move || pump_loop(weak));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the stream pump thread; stream readers get only what they ask for");
            }
            s.reads.start(&s);
        }
        s
    }

    pub(crate) fn stop(&self) {
        self.pump.dirty.lock().1 = true;
        self.pump.wake.notify_all();
        self.reads.stop();
    }

    fn rule_for(&self, name: &str) -> Option<&StreamRule> {
        self.config.rules.iter().find(|r| r.matches(name))
    }

    /// The rule of a log that is partition `<n>` of a partitioned stream
    /// `<p>` (its name is `<p>-<n>`): the partitioned stream's.
    fn partition_rule(&self, name: &str) -> Option<&StreamRule> {
        let (parent, n) = name.rsplit_once('-')?;
        let n: u32 = n.parse().ok()?;
        self.rule_for(parent).filter(|r| r.partitions > n)
    }

    /// What `name` stands for, opening it when it is a stream (configured,
    /// or its log exists), or declaring it when `declare`: a partitioned
    /// stream when its rule says `partitions > 1` (and it is not itself
    /// one's partition), else one log.
    pub(crate) fn target(&self, name: &str, declare: bool) -> Result<Option<Target>, BrokerError> {
        if self.partition_rule(name).is_none() {
            if let Some(rule) = self.rule_for(name).filter(|r| r.partitions > 1) {
                return self.open_partitioned(name, rule).map(Some);
            }
        }
        Ok(self.get(name, declare)?.map(Target::One))
    }

    fn open_partitioned(&self, name: &str, rule: &StreamRule) -> Result<Target, BrokerError> {
        if let Some(p) = self.partitioned.lock().get(name) {
            return Ok(Target::Parts(Arc::clone(p)));
        }
        let parts = (0..rule.partitions)
            .map(|n| {
                let part = partition::partition_name(name, n);
                self.get(&part, true)?
                    .ok_or_else(|| BrokerError::NotFound(format!("stream partition '{part}'")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let p = Arc::new(Partitioned::new(name, parts, rule.partition_key.clone()));
        let p = Arc::clone(self.partitioned.lock().entry(name.to_owned()).or_insert(p));
        Ok(Target::Parts(p))
    }

    /// The open log `name`, opening it when it is one (configured, or
    /// its log exists), or declaring it when `declare`.
    fn get(&self, name: &str, declare: bool) -> Result<Option<Arc<Stream>>, BrokerError> {
        let Some(dir) = &self.config.dir else {
            return if declare {
                Err(BrokerError::NotFound(format!(
                    "stream '{name}': streams are off (no data directory)"
                )))
            } else {
                Ok(None)
            };
        };
        let mut open = self.open.lock();
        if let Some(s) = open.get(name) {
            return Ok(Some(Arc::clone(s)));
        }
        let rule = self.partition_rule(name).or_else(|| self.rule_for(name));
        let configured = rule.is_some();
        let exists = self.known.contains(name);
        if !(configured || exists || declare) {
            // A queue: every publish to one asks, so nothing is allocated.
            return Ok(None);
        }
        let log_dir = dir.join(dir_name(name));
        if name.is_empty() || name.len() > STREAM_NAME_BYTES_MAX {
            return Err(BrokerError::InvalidAddress(format!(
                "stream names are 1 to {STREAM_NAME_BYTES_MAX} bytes"
            )));
        }
        if open.len() >= STREAMS_MAX {
            return Err(BrokerError::ResourceLimit(format!(
                "more than {STREAMS_MAX} streams"
            )));
        }
        let rule = rule.unwrap_or(&self.config.defaults);
        let mut lc = LogConfig::new(log_dir);
        lc.sync = self.config.sync;
        lc.segment_bytes = rule.segment_bytes;
        lc.max_age_s = rule.max_age_s;
        lc.max_bytes = rule.max_bytes;
        lc.storage = Arc::clone(&self.config.storage);
        lc.tail_cache_bytes = STREAM_TAIL_CACHE_BYTES;
        lc.tail_cache_budget = Arc::clone(&self.tail_cache);
        // The readers are served once per durable batch, not per record,
        // and the batch's receipts go out in one event per session.
        let hook_stream: Arc<OnceLock<Weak<Stream>>> = Arc::new(OnceLock::new());
        let pump = Arc::clone(&self.pump);
        let hooked = Arc::clone(&hook_stream);
        let commits = Arc::new(commits::CommitRuns::default());
        let batch_commits = Arc::clone(&commits);
        lc.on_durable = Some(DurableHook(Arc::new(move |_next| {
            batch_commits.flush();
            if let Some(s) = hooked.get().and_then(Weak::upgrade) {
                pump.mark(&s);
            }
        })));
        let opening = Instant::now();
        let (log, report) = StreamLog::open(lc).map_err(|e| BrokerError::Storage(e.to_string()))?;
        tracing::info!(
            stream = name,
            first = report.first_offset,
            next = report.next_offset,
            segments = report.segments,
            from_index_files = report.indexes_used,
            torn_tail_bytes = report.torn_tail_bytes,
            lost = report.lost.len(),
            open_ms = opening.elapsed().as_millis(),
            "stream opened"
        );
        let s = Arc::new(Stream {
            name: Arc::from(name),
            log,
            readers: Mutex::new(Vec::new()),
            decoded: Mutex::new(decoded::Decoded::default()),
            commits,
        });
        let _ = hook_stream.set(Arc::downgrade(&s));
        open.insert(name.to_owned(), Arc::clone(&s));
        Ok(Some(s))
    }

    /// Appends `message` to `stream` at `now_ms`; with `confirm`, that
    /// sink is sent the ticket's commit once it is durable: a failure at
    /// once, a success with the others of its batch (one
    /// [`SessionEvent::CommittedRun`] per session, see `commits`). The
    /// stream's readers are served once per durable batch (the log's
    /// [`DurableHook`]).
    ///
    /// The message is encoded by the log's writer, straight into the batch
    /// it writes (`codec::stream_opaque`): no buffer of its own here.
    pub(crate) fn append(
        &self,
        stream: &Arc<Stream>,
        message: Arc<Message>,
        now_ms: u64,
        confirm: Option<(Arc<dyn EventSink>, Ticket)>,
    ) -> Result<u64, BrokerError> {
        let body = crate::codec::stream_opaque(message);
        // One box per confirmed append (the log's completion), none for
        // the others.
        let completion = confirm.map(|(sink, ticket)| -> LogCompletion {
            let runs = Arc::clone(&stream.commits);
            Box::new(move |r| match r {
                Ok(_) => runs.push(sink, ticket),
                Err(e) => sink.send(SessionEvent::Committed {
                    ticket,
                    result: Err(BrokerError::Storage(e.to_string())),
                }),
            })
        });
        stream
            .log
            .append(now_ms, body, completion)
            .map_err(|e| BrokerError::Storage(e.to_string()))
    }

    /// Registers `reader` with the logs it reads and serves it; a member
    /// of a partitioned stream's group joins it (and is given its share of
    /// the partitions).
    pub(crate) fn attach(&self, target: &Target, reader: &Arc<Reader>) {
        for s in &reader.source.streams {
            s.readers.lock().push(Arc::downgrade(reader));
        }
        match (target, &reader.group) {
            (Target::Parts(p), Some(g)) => self.members.join(p, g, reader, &self.groups),
            _ => reader.pump(&self.groups),
        }
    }

    /// Stops `reader`; a member of a partitioned stream's group leaves it,
    /// and its partitions go to the others.
    pub(crate) fn detach(&self, reader: &Arc<Reader>) {
        reader.close();
        let Some(g) = &reader.group else {
            return;
        };
        if !reader.source.partitioned {
            return;
        }
        let p = self.partitioned.lock().get(&*reader.source.name).cloned();
        if let Some(p) = p {
            self.members.leave(&p, g, reader, &self.groups);
        }
    }

    /// Applies every open stream's retention at the clock's now, then
    /// serves their readers (a reader cut by it learns on its next
    /// delivery how many it missed).
    pub(crate) fn run_retention(&self) {
        let now = self.clock.now_ms();
        for s in self.all() {
            if let Err(e) = s.log.apply_retention(now) {
                tracing::error!(stream = %s.name, error = %e, "stream retention failed");
            }
            s.pump_all(&self.groups);
        }
    }

    /// The core clock's now.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn all(&self) -> Vec<Arc<Stream>> {
        self.open.lock().values().cloned().collect()
    }
}

/// What the pump thread does next.
enum PumpStep {
    /// Apply retention: it is due.
    Retention,
    /// Serve the readers of a queued stream.
    Serve(Weak<Stream>),
}

/// Retention first when it is due, before any stream queued: every
/// durable batch queues its stream again, so while readers of busy
/// streams take longer to serve than a batch takes to commit, the queue
/// is never empty, and retention waiting for an empty queue would let the
/// logs grow past their limits for as long as the appends go on. `None`:
/// nothing until the thread is woken or retention falls due.
fn next_step(queued: &mut VecDeque<Weak<Stream>>, retention_due: bool) -> Option<PumpStep> {
    if retention_due {
        return Some(PumpStep::Retention);
    }
    queued.pop_front().map(PumpStep::Serve)
}

fn pump_loop(streams: Weak<Streams>) {
    let Some(pump) = streams.upgrade().map(|s| Arc::clone(&s.pump)) else {
        return;
    };
    let mut retention_at = Instant::now() + RETENTION_INTERVAL;
    loop {
        let step = {
            let mut d = pump.dirty.lock();
            loop {
                if d.1 {
                    return;
                }
                match next_step(&mut d.0, Instant::now() >= retention_at) {
                    Some(step) => break step,
                    None => {
                        pump.wake.wait_until(&mut d, retention_at);
                    }
                }
            }
        };
        let Some(streams) = streams.upgrade() else {
            return;
        };
        match step {
            PumpStep::Serve(w) => {
                if let Some(s) = w.upgrade() {
                    s.pump_all(&streams.groups);
                }
            }
            PumpStep::Retention => {
                retention_at = Instant::now() + RETENTION_INTERVAL;
                streams.run_retention();
            }
        }
    }
}

/// Where a new reader of `stream` starts, from its spec and group: a
/// committed offset wins when no spec is given, an explicit spec resets
/// the group, and a new group starts where the spec says (default
/// `next`). Creates or resets the group in the journal.
pub(crate) fn start_offset(
    stream: &Stream,
    read: &StreamRead,
    groups: &groups::Groups,
) -> Result<u64, BrokerError> {
    let bounds = stream.log.bounds();
    if let (None, Some(g)) = (read.offset, &read.group) {
        if let Some(at) = groups.committed(&stream.name, g) {
            return Ok(at);
        }
    }
    let at = match read.offset.unwrap_or(StreamOffset::Next) {
        StreamOffset::First => bounds.first,
        StreamOffset::Last => bounds.next.saturating_sub(1).max(bounds.first),
        StreamOffset::Next => bounds.next,
        StreamOffset::Offset(n) if n > bounds.next => {
            return Err(BrokerError::InvalidStreamOffset(format!(
                "offset {n} is past the end of stream '{}' (next offset {})",
                stream.name, bounds.next
            )));
        }
        StreamOffset::Offset(n) => n,
        StreamOffset::TimestampMs(t) => stream
            .log
            .offset_at_timestamp(t)
            .map_err(|e| BrokerError::Storage(e.to_string()))?,
    };
    if let Some(g) = &read.group {
        groups.commit(&stream.name, g, at, true, None);
    }
    Ok(at)
}
