//! The durable journal: an append-only, checksummed log of segment files
//! with group commit, crash recovery and compaction.
//!
//! # Shape
//!
//! - [`record`]: the record kinds and their versioned encoding;
//! - [`Opaque`]: what the store keeps without interpreting it: message
//!   bodies, encoded and decoded by the core (`rosetta_core::codec`). The
//!   store knows record kinds and keys (queue ids, message seqs), because
//!   liveness and replay depend on them, and never what a message is;
//! - [`wire`]: the little-endian primitives records (and the core's codec)
//!   are written with;
//! - [`segment`]: file naming, segment and entry headers, the verifying scanner;
//! - `writer`: the single writer thread (group commit, rollover, syncs);
//! - `index`: the live state and per-segment liveness (the replay rules);
//! - `recovery`: replay at open, re-synchronising after damage, missing
//!   segments (the cases table is there); `report`: what it found;
//! - `manifest`: the list of segments that should exist;
//! - `compaction`: deleting dead segments, rewriting mostly-dead ones;
//! - [`storage`]: every file operation, behind the [`Storage`] trait
//!   ([`OsStorage`] in production);
//! - [`log`]: stream logs (append-only, read without consuming, offsets,
//!   retention), next to the journal and on the same [`Storage`];
//! - [`sim`]: a simulated disk for tests (power loss, torn writes, EIO,
//!   corrupted reads, lost files), seeded and deterministic.
//!
//! # On-disk format
//!
//! The data directory holds segment files `NNNNNNNNNNNNNNNNNNNN.seg` (20-digit
//! zero-padded id, so names sort by age) and the manifest, `MANIFEST.0` and
//! `MANIFEST.1` (two alternating copies; see `manifest`). All integers are
//! little-endian with explicit widths; checksums are CRC32C.
//!
//! ```text
//! segment        = segment_header entry*
//! segment_header = magic "RSEG" u32 | version u16 | reserved u16 | segment_id u64
//!                  | first_entry_seq u64 | seq_floor u64 | queue_floor u64
//!                  | salt u32 | header_crc u32                           (48 bytes)
//! entry          = entry_header body
//! entry_header   = magic "RENT" u32 | version u16 | flags u16 | body_len u32
//!                  | body_crc u32 | entry_seq u64 | reserved u32 | header_crc u32  (32 bytes)
//! body           = record_count u32 | record*       (the records of ONE append call)
//! record         = tag u8 | version u8 | payload_len u32 | payload
//! ```
//!
//! Format version 2 (written now) salts the entry header checksum with
//! the journal's random salt, so that recovery can search damaged bytes
//! for the next entry without a client payload posing as one; version 1
//! journals are still read (see `segment`). The manifest lists every
//! segment with its entry-seq range and sealed length, so recovery can
//! tell a segment compaction deleted from one that was lost.
//!
//! One [`Store::append`] call is one entry, so its records are replayed all
//! together or not at all. The record payloads are listed in [`record`]; a
//! message body is opaque here (its encoding is versioned by the core's
//! codec, which writes a version byte first). Record kinds carry their own version byte,
//! so kinds can be added and layouts evolved.
//!
//! # Durability: what a completion (and so a producer's acknowledgement) means
//!
//! Appends never wait for the disk. The completion passed to
//! [`Store::append`] runs on a journal thread (in append order) once the
//! entry is as durable
//! as the [`SyncPolicy`] promises, and the core acknowledges a persistent
//! message to its producer only from that completion:
//!
//! - [`SyncPolicy::EveryCommit`] (default): the entry was written and
//!   `fdatasync`ed. An acknowledged message survives a process crash, a
//!   kernel crash and a power loss (as far as the disk honours flushes).
//! - [`SyncPolicy::Periodic`]`(d)`: the entry was handed to the kernel with
//!   `write(2)`; a timer syncs at most `d` after the first unsynced write.
//!   An acknowledged message survives a crash of the broker process, but a
//!   kernel crash or power loss may lose the last `d` of acknowledged
//!   writes. What is lost is always a suffix: recovery never shows a later
//!   entry without every earlier one (segments are synced before the next
//!   is created, and before compaction deletes anything).
//!
//! An `Err` completion means the entry may or may not be on disk; the store
//! then refuses every later append (see below), so nothing is acknowledged
//! past a failed write.
//!
//! # Group commit
//!
//! One writer thread owns the files. When it is idle, the next append is
//! written at once. While a `write` + `fdatasync` is in flight, everything
//! appended meanwhile queues up and becomes the next batch: one `write` of
//! all its entries and one `fdatasync`, then all its completions run. No
//! timer adds delay at low load; at high load the batch grows by itself.
//! A batch holds at most [`BATCH_BYTES_MAX`] bytes. Appended-but-unwritten
//! bytes are bounded by [`StoreConfig::pending_bytes_max`]: past it,
//! `append` blocks its caller until the writer has taken a batch (typically
//! one sync time). Appends made from inside a completion never block, so a
//! completion may append without deadlock (what completions append is not
//! counted against the bound before it is queued).
//!
//! Completions run in order on a second thread when a batch has many (so
//! waking the producers overlaps with the next batch's `write` +
//! `fdatasync` rather than delaying it), and on the writer thread itself
//! when a batch has only a few and nothing is queued before them (a lone
//! producer saves a thread hop).
//!
//! After a failed `write` or `fdatasync` the store fails closed: the failed
//! batch and every later append complete with [`StoreError::Failed`]. Linux
//! may have dropped the dirty pages of a failed fsync, so retrying could
//! acknowledge data that is gone; restart and recovery are the way out.
//!
//! # Recovery
//!
//! [`Store::open`] replays all segments oldest first, verifying every entry,
//! and returns the live state as [`Recovered`]. Queued messages are not held
//! in memory by replay: [`Recovered::messages`] is a [`RecoveredMessages`]
//! iterator that reads each one back from its location, in seq order, as
//! the core restores it (compaction rewrites wait until it is done), so a
//! restart costs memory per queued message only for the index, never for
//! the bodies.
//!
//! Recovery loses only what is damaged: after a bad entry it
//! re-synchronises on the next valid one, so a flipped byte costs that
//! entry, not the rest of the segment; a damaged segment header costs
//! nothing (its facts are re-derived); a torn tail of the newest segment
//! (a crash during a write) is cut. A segment the manifest lists but the
//! directory lacks, or one cut short, stops the start with
//! [`StoreError::Incomplete`] naming what is missing, unless
//! [`StoreConfig::accept_data_loss`]. Everything is logged and listed in
//! the [`RecoveryReport`], down to the entry seqs lost and the queues that
//! lost messages; [`Store::check`] (`rosetta store check`) produces the
//! same report without changing anything. Recovery never panics. The
//! cases are tabled in the docs of the `recovery` module. After recovery,
//! writing continues in a new segment.
//!
//! # Compaction
//!
//! The index knows, per segment, how many records are still live (see the
//! `index` module for the rules: state records live while current,
//! tombstones while an older segment still holds what they cancel).
//! Between batches, after a segment rollover or every
//! [`StoreConfig::compaction_interval`], the writer thread:
//!
//! 1. deletes every non-active segment with no live record (then fsyncs the
//!    directory), repeating while deletions release tombstones;
//! 2. rewrites a mostly-dead segment (live bytes at most
//!    `REWRITE_LIVE_PERCENT_MAX` % of the file) that holds no live
//!    tombstone — the oldest one always qualifies — by appending copies of
//!    its live records at the head and then deleting it. A copied `Message`
//!    carries only the queues that still hold it, followed by its delivery
//!    states. Replay treats a `Message` whose seq is already present as a
//!    no-op, so a crash between copy and delete is harmless.
//!
//! So one unconsumed message cannot pin old segments: it is copied forward.

mod compaction;
mod index;
mod latency;
pub mod log;
mod manifest;
mod opaque;
pub mod page_file;
mod reader;
pub mod record;
mod recovery;
mod report;
pub mod segment;
pub mod sim;
pub mod storage;
pub mod wire;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

pub use latency::{bucket_bound_us, LatencyHistogram, SYNC_LATENCY_BOUNDS};
pub use manifest::ManifestState;
pub use opaque::{EncodeOpaque, Opaque};
pub use page_file::{PageError, PageFile, PageRef};
pub use reader::RecoveredMessages;
pub use record::{BindingDef, MessageSeq, QueueDef, QueueId, Record};
pub use report::{DamagedRange, LostSummary, MissingSegment, RecoveryReport, SuspectRecords};
pub use segment::{Damage, ENTRY_BODY_MAX_BYTES};
pub use storage::{LockGuard, OsStorage, Storage, StorageFile};
pub use wire::DecodeError;

use writer::{Job, Shared, WriterHandle};

/// Default segment size: big enough that rollover and per-file overhead are
/// rare, small enough that compaction moves little at a time.
pub const SEGMENT_SIZE_DEFAULT_BYTES: u64 = 64 * 1024 * 1024;
/// Smallest segment size accepted (tests use tiny segments).
pub const SEGMENT_SIZE_MIN_BYTES: u64 = 1024;
/// Default time between compaction checks when no rollover triggers one.
pub const COMPACTION_INTERVAL_DEFAULT: Duration = Duration::from_secs(30);
/// How long a closed segment is left to die before compaction may copy its
/// live records forward. Consumers are still working through a segment that
/// has just closed: under a lagging consumer it is mostly live for a
/// moment, then mostly dead. Copying it in between scanned the whole
/// segment (64 MiB by default) on the writer thread, holding up appends, to
/// save records about to be acknowledged anyway: 6.5% of the broker's CPU
/// in the durable AMQP benchmark. Segments found at startup count as old.
pub const REWRITE_MIN_AGE_DEFAULT: Duration = Duration::from_secs(10);
/// Default bound on appended-but-not-yet-written bytes before `append`
/// blocks its caller: a few batches' worth, so the writer never starves.
pub const PENDING_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;
/// Most bytes written by one `write` + `fdatasync` batch: keeps one batch's
/// latency bounded when producers are far ahead of the disk.
pub const BATCH_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// When appended entries are synced. See the module docs for exactly what
/// each promises a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// `fdatasync` before any completion runs (default).
    #[default]
    EveryCommit,
    /// Completion after `write(2)`; a timer syncs within this period.
    Periodic(Duration),
}

/// Store configuration. Build with [`StoreConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Data directory (created if missing).
    pub dir: PathBuf,
    /// Sync policy.
    pub sync: SyncPolicy,
    /// Roll to a new segment when the next entry would pass this size. An
    /// entry larger than this gets a segment of its own.
    pub segment_size_bytes: u64,
    /// Time between compaction runs when no rollover triggers one.
    pub compaction_interval: Duration,
    /// Turns compaction off (tests that inspect the raw files).
    pub compaction_enabled: bool,
    /// A segment closed this recently is not rewritten, only deleted once
    /// dead; see [`REWRITE_MIN_AGE_DEFAULT`].
    pub rewrite_min_age: Duration,
    /// Appended-but-unwritten bytes above which `append` blocks.
    pub pending_bytes_max: u64,
    /// Where the files are: the operating system's file system, or a
    /// simulated disk in tests.
    pub storage: Arc<dyn Storage>,
    /// Run the writer on its own thread (and completions on a second
    /// one): the default. When `false` there are no journal threads: the
    /// writer runs only inside [`Store::step`] (and the blocking calls,
    /// which step it until they are done), on the calling thread, and the
    /// completions run there too. For deterministic simulations: the order
    /// of every file operation then follows the caller's.
    pub background_writer: bool,
    /// Start even when segments are missing or cut short (or the manifest
    /// that would tell is lost): the loss is logged, reported and accepted
    /// once, and the manifest rewritten. Off by default: `open` then fails
    /// with [`StoreError::Incomplete`], naming what is missing.
    pub accept_data_loss: bool,
}

impl StoreConfig {
    /// Defaults: sync every commit, 64 MiB segments, compaction on.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            sync: SyncPolicy::EveryCommit,
            segment_size_bytes: SEGMENT_SIZE_DEFAULT_BYTES,
            compaction_interval: COMPACTION_INTERVAL_DEFAULT,
            compaction_enabled: true,
            rewrite_min_age: REWRITE_MIN_AGE_DEFAULT,
            pending_bytes_max: PENDING_BYTES_MAX_DEFAULT,
            storage: Arc::new(OsStorage),
            background_writer: true,
            accept_data_loss: false,
        }
    }

    fn validate(&self) -> Result<(), StoreError> {
        if self.segment_size_bytes < SEGMENT_SIZE_MIN_BYTES {
            return Err(StoreError::Config(format!(
                "segment_size_bytes {} is below {SEGMENT_SIZE_MIN_BYTES}",
                self.segment_size_bytes
            )));
        }
        if let SyncPolicy::Periodic(d) = self.sync {
            if d.is_zero() {
                return Err(StoreError::Config(
                    "periodic sync interval must be above zero".into(),
                ));
            }
        }
        if self.compaction_interval.is_zero() {
            return Err(StoreError::Config(
                "compaction_interval must be above zero".into(),
            ));
        }
        if self.pending_bytes_max == 0 {
            return Err(StoreError::Config(
                "pending_bytes_max must be above zero".into(),
            ));
        }
        Ok(())
    }
}

/// Runs once an append is durable (or failed), on a journal thread (the
/// writer or the completion thread), in append order: keep it short (signal, don't work). It may call
/// [`Store::append`] (never blocks there) but not [`Store::flush`],
/// [`Store::compact`] or [`Store::close`].
pub type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send + 'static>;

/// Store errors. `Clone`, so every completion of a failed batch gets one.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// An I/O operation failed.
    #[error("journal {op} failed on {path}: {source}")]
    Io {
        /// What was being done (read, write, fsync, ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: Arc<std::io::Error>,
    },
    /// Checksummed data that cannot be what we wrote.
    #[error("journal {path} is corrupt at offset {offset}: {reason}")]
    Corrupt {
        /// File.
        path: PathBuf,
        /// Offset of the bad entry.
        offset: u64,
        /// Why.
        reason: String,
    },
    /// Data written by a newer format.
    #[error("journal {path} at offset {offset} needs a newer build: {what}")]
    Unsupported {
        /// File.
        path: PathBuf,
        /// Offset.
        offset: u64,
        /// What is unknown.
        what: String,
    },
    /// One append is larger than [`ENTRY_BODY_MAX_BYTES`].
    #[error("append of {bytes} bytes exceeds the {max}-byte entry limit")]
    TooLarge {
        /// Encoded size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The store is closed (or closing).
    #[error("journal is closed")]
    Closed,
    /// An earlier write or sync failed; the store accepts no more appends.
    #[error("journal failed earlier and refuses appends: {0}")]
    Failed(Box<StoreError>),
    /// A blocking call was made from a completion (on a journal thread),
    /// which would wait for itself.
    #[error("blocking journal call from inside a journal completion")]
    WouldDeadlock,
    /// Invalid configuration.
    #[error("invalid journal configuration: {0}")]
    Config(String),
    /// Segments are missing or cut short (or the manifest that lists them
    /// is lost), and the loss was not accepted.
    #[error("journal is incomplete: {0}")]
    Incomplete(String),
    /// Another process (or another store in this one) has the directory.
    #[error("journal directory {0} is in use by another broker (its LOCK file is held)")]
    Locked(PathBuf),
}

pub(crate) fn io_error(op: &'static str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io {
        op,
        path: path.to_path_buf(),
        source: Arc::new(e),
    }
}

/// Counters and gauges of a running store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Segment files.
    pub segments: u64,
    /// Bytes in all segment files.
    pub bytes: u64,
    /// Records still live on disk.
    pub live_records: u64,
    /// Append calls made durable.
    pub commits: u64,
    /// `write` batches.
    pub batches: u64,
    /// `fdatasync` calls.
    pub syncs: u64,
    /// Records appended.
    pub records_appended: u64,
    /// Bytes appended but not yet taken by the writer.
    pub pending_bytes: u64,
    /// Segments deleted by compaction.
    pub segments_deleted: u64,
    /// Segments rewritten by compaction.
    pub segments_rewritten: u64,
    /// Records copied forward by compaction.
    pub records_rewritten: u64,
    /// Id of the segment being written.
    pub active_segment: u64,
    /// How long each `fdatasync` took, since the store opened.
    pub sync_latency: LatencyHistogram,
}

/// One queue holding a recovered message.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredPlacement {
    /// The queue.
    pub queue: QueueId,
    /// The latest delivery state the core journaled for it (attempts,
    /// annotations), as the core encoded it; `None` when it was never
    /// delivered.
    pub state: Option<Bytes>,
}

/// A recovered message with the queues that still hold it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredMessage {
    /// Its seq.
    pub seq: MessageSeq,
    /// The message as the core encoded it.
    pub body: Bytes,
    /// Holders, by queue id.
    pub queues: Vec<RecoveredPlacement>,
}

/// The live state rebuilt by [`Store::open`].
#[derive(Debug)]
pub struct Recovered {
    /// Queues, by id.
    pub queues: Vec<QueueDef>,
    /// Bindings, by (queue, filter).
    pub bindings: Vec<BindingDef>,
    /// Messages, by seq (which is also the order within each queue), read
    /// from the journal as they are taken: recovery never holds them all.
    /// Compaction rewrites wait until all are read or this is dropped.
    pub messages: RecoveredMessages,
    /// Retained messages: (topic, seq, message), by topic.
    pub retained: Vec<(String, MessageSeq, Bytes)>,
    /// Generic state, by key.
    pub state: Vec<(String, Bytes)>,
    /// Greater than any message seq ever journaled here.
    pub next_seq: MessageSeq,
    /// Greater than any queue id ever journaled here.
    pub next_queue_id: QueueId,
    /// What recovery did.
    pub report: RecoveryReport,
}

pub(crate) struct RecoveredState {
    pub(crate) queues: Vec<QueueDef>,
    pub(crate) bindings: Vec<BindingDef>,
    pub(crate) messages: Vec<reader::PendingMessage>,
    pub(crate) retained: Vec<(String, MessageSeq, Bytes)>,
    pub(crate) state: Vec<(String, Bytes)>,
}

/// The journal. `Send + Sync`; share it behind an `Arc`.
pub struct Store {
    shared: Arc<Shared>,
    writer: Mutex<Option<WriterHandle>>,
    /// The held lock on `<dir>/LOCK`: two brokers appending to one journal
    /// would interleave segments and corrupt it. Released when dropped.
    _lock: Box<dyn LockGuard>,
    /// Where messages are read back from ([`Store::read_messages`]).
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    salt: u32,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Store {
    /// Opens (or creates) the journal in `config.dir`, replays it and starts
    /// the writer thread. Returns the recovered live state.
    pub fn open(config: StoreConfig) -> Result<(Store, Recovered), StoreError> {
        config.validate()?;
        let storage = &*config.storage;
        storage
            .create_dir_all(&config.dir)
            .map_err(|e| io_error("create", &config.dir, e))?;
        let lock = lock_dir(storage, &config.dir)?;
        let replayed = recovery::replay(storage, &config.dir, config.accept_data_loss)?;
        let mut index = replayed.index;
        let state = recovery::collect(&mut index);
        let next_seq = index.next_seq;
        let next_queue_id = index.next_queue_id;
        // Recovered messages are read back by location, so compaction must
        // not rewrite (move) them until they are: the pause starts before
        // the writer's first compaction run.
        let paused = !state.messages.is_empty();
        let salt = replayed.salt.unwrap_or_else(|| storage.random_u32());
        let (shared, handle) = writer::start(
            &config,
            writer::Start {
                index,
                first_segment: replayed.last_segment.map_or(1, |s| s + 1),
                next_entry_seq: replayed.next_entry_seq,
                paused,
                salt,
                segments: replayed.segments,
                manifest_generation: replayed.manifest_generation,
                damaged_segments: replayed.damaged_segments,
            },
        )?;
        let pause = paused.then(|| writer::CompactionPause::adopt(Arc::clone(&shared)));
        let store = Store {
            shared,
            writer: Mutex::new(Some(handle)),
            _lock: lock,
            storage: Arc::clone(&config.storage),
            dir: config.dir.clone(),
            salt,
        };
        let recovered = Recovered {
            queues: state.queues,
            bindings: state.bindings,
            messages: RecoveredMessages::new(
                Arc::clone(&config.storage),
                config.dir.clone(),
                salt,
                state.messages,
                pause,
            ),
            retained: state.retained,
            state: state.state,
            next_seq,
            next_queue_id,
            report: replayed.report,
        };
        Ok((store, recovered))
    }

    /// Verifies the journal in `config.dir` without changing it and
    /// returns what recovery would find (`rosetta store check`). Takes the
    /// directory's lock, so the broker must be stopped.
    pub fn check(config: &StoreConfig) -> Result<RecoveryReport, StoreError> {
        let storage = &*config.storage;
        let _lock = lock_dir(storage, &config.dir)?;
        recovery::check(storage, &config.dir)
    }

    /// Reads journaled messages back by seq, from wherever their records
    /// are now: the core pages the messages of a restored queue by leaving
    /// them here instead of copying them into page files. Compaction may
    /// move a record (it copies live records forward and deletes the old
    /// segment); the location is looked up in the index, which compaction
    /// keeps current, and looked up again if the read fails because the
    /// record moved in between. Each message is verified as it is read.
    /// A seq no queue holds any more is an error.
    pub fn read_messages(&self, seqs: &[MessageSeq]) -> Vec<Result<Bytes, StoreError>> {
        let locate = |seq: MessageSeq| self.shared.index.lock().message(seq).map(|m| m.loc());
        let locs: Vec<_> = {
            let index = self.shared.index.lock();
            seqs.iter()
                .map(|s| index.message(*s).map(|m| m.loc()))
                .collect()
        };
        let mut reader =
            reader::MessageReader::new(Arc::clone(&self.storage), self.dir.clone(), self.salt);
        seqs.iter()
            .zip(locs)
            .map(|(&seq, loc)| {
                let first = match loc {
                    Some(at) => reader.read(seq, at),
                    None => Err(not_in_journal(&self.dir, seq)),
                };
                match (first, locate(seq)) {
                    (Ok(m), _) => Ok(m),
                    // Moved by compaction meanwhile: read it where it is now.
                    (Err(_), Some(now)) if Some(now) != loc => reader::MessageReader::new(
                        Arc::clone(&self.storage),
                        self.dir.clone(),
                        self.salt,
                    )
                    .read(seq, now),
                    (Err(e), _) => Err(e),
                }
            })
            .collect()
    }

    /// Appends `records` as one atomic unit: after a crash all of them are
    /// replayed or none. Never waits for the disk; `done` runs on a
    /// journal thread once the unit is durable per the [`SyncPolicy`], or
    /// with an error. Units are written in call order. Blocks briefly only when more
    /// than [`StoreConfig::pending_bytes_max`] bytes are waiting for the
    /// writer (never when called from a completion).
    pub fn append(&self, records: Vec<Record>, done: Option<Completion>) {
        let mut body = Vec::with_capacity(encoded_size_hint(&records));
        let sizes = if records.is_empty() {
            Vec::new()
        } else {
            record::encode_body(&records, &mut body)
        };
        if body.len() > ENTRY_BODY_MAX_BYTES {
            if let Some(done) = done {
                done(Err(StoreError::TooLarge {
                    bytes: body.len(),
                    max: ENTRY_BODY_MAX_BYTES,
                }));
            }
            return;
        }
        let job = Job::Append {
            body,
            records,
            sizes,
            done,
        };
        if let Err(refused) = self.shared.submit(job) {
            let (e, job) = *refused;
            job.fail(e);
        }
    }

    /// Blocks until everything appended before this call is durable (synced
    /// even under [`SyncPolicy::Periodic`]). Must not be called from a
    /// completion.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.blocking(Job::Sync)
    }

    /// Runs a compaction now (after everything appended before) and waits
    /// for it. Must not be called from a completion.
    pub fn compact(&self) -> Result<(), StoreError> {
        self.blocking(Job::Compact)
    }

    fn blocking(&self, make: fn(Completion) -> Job) -> Result<(), StoreError> {
        if self.shared.on_writer_thread() {
            return Err(StoreError::WouldDeadlock);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let job = make(Box::new(move |r| {
            let _ = tx.send(r);
        }));
        if let Err(refused) = self.shared.submit(job) {
            return Err(refused.0);
        }
        if self.shared.manual() {
            loop {
                if let Ok(r) = rx.try_recv() {
                    return r;
                }
                if !self.step() {
                    return rx.try_recv().unwrap_or(Err(StoreError::Closed));
                }
            }
        }
        rx.recv().unwrap_or(Err(StoreError::Closed))
    }

    /// Runs one turn of a manual writer ([`StoreConfig::background_writer`]
    /// `false`): takes what is queued (up to a batch), writes and syncs
    /// it, runs its completions here, then compaction if due. `false` once
    /// the writer has stopped (closed or failed), and always with a
    /// background writer or from inside a completion.
    pub fn step(&self) -> bool {
        if !self.shared.manual() || self.shared.on_writer_thread() {
            return false;
        }
        let mut slot = self.writer.lock();
        let Some(WriterHandle::Manual(writer)) = slot.as_mut() else {
            return false;
        };
        self.shared.set_stepper(true);
        let going = writer.step(false);
        self.shared.set_stepper(false);
        if !going {
            *slot = None;
        }
        going
    }

    /// The files the journal is kept in.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Current counters.
    pub fn stats(&self) -> StoreStats {
        let c = &self.shared.stats;
        StoreStats {
            segments: c.segments.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            live_records: c.live_records.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
            records_appended: c.records_appended.load(Ordering::Relaxed),
            pending_bytes: self.shared.pending_bytes(),
            segments_deleted: c.segments_deleted.load(Ordering::Relaxed),
            segments_rewritten: c.segments_rewritten.load(Ordering::Relaxed),
            records_rewritten: c.records_rewritten.load(Ordering::Relaxed),
            active_segment: c.active_segment.load(Ordering::Relaxed),
            sync_latency: c.sync_latency.snapshot(),
        }
    }

    /// Writes and syncs everything appended, stops the writer thread and
    /// reports the first error the writer met, if any.
    pub fn close(self) -> Result<(), StoreError> {
        self.shutdown()
    }

    fn shutdown(&self) -> Result<(), StoreError> {
        if self.shared.manual() {
            if self.shared.on_writer_thread() {
                self.shared.begin_close();
                return Err(StoreError::WouldDeadlock);
            }
            self.shared.begin_close();
            while self.step() {}
            return self.shared.close_result();
        }
        let Some(WriterHandle::Thread(handle)) = self.writer.lock().take() else {
            return Ok(());
        };
        if self.shared.on_writer_thread() {
            // Dropped from a completion: the writer stops by itself once
            // it sees the phase change; it cannot join itself.
            self.shared.begin_close();
            return Err(StoreError::WouldDeadlock);
        }
        self.shared.begin_close();
        if handle.join().is_err() {
            return Err(StoreError::Failed(Box::new(StoreError::Closed)));
        }
        self.shared.close_result()
    }
}

/// How long [`Store::open`] waits for another store to let go of the
/// directory: a broker restarted in the same process, or right after the
/// previous one exited, may still be closing its store for a moment. A
/// second broker running on the directory is refused after it.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Takes the exclusive lock on `<dir>/LOCK` (an advisory `flock` on real
/// files, released by the OS when the process dies, so a crash never
/// leaves it stale).
fn lock_dir(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn LockGuard>, StoreError> {
    let path = dir.join("LOCK");
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match storage.try_lock(&path) {
            Ok(Some(guard)) => return Ok(guard),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => return Err(StoreError::Locked(dir.to_owned())),
            Err(e) => return Err(io_error("lock", &path, e)),
        }
    }
}

fn not_in_journal(dir: &Path, seq: MessageSeq) -> StoreError {
    StoreError::Corrupt {
        path: dir.to_path_buf(),
        offset: 0,
        reason: format!("message {seq} is held by no queue in the journal"),
    }
}

/// A capacity guess for an entry body, so encoding rarely reallocates.
fn encoded_size_hint(records: &[Record]) -> usize {
    records
        .iter()
        .map(|r| match r {
            Record::Message { body, .. }
            | Record::Retain {
                message: Some((_, body)),
                ..
            } => 256 + body.len_hint(),
            _ => 64,
        })
        .sum()
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

#[cfg(test)]
mod tests;
