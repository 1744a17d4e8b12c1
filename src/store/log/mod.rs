//! Stream logs: append-only, checksummed, per-stream logs with dense 64-bit
//! offsets and a timestamp per record, which readers read without
//! consuming.
//!
//! The journal ([`crate::Store`]) keeps what a queue holds until it is
//! consumed; a [`StreamLog`] keeps everything appended until retention
//! drops it, and any number of readers read the one copy on disk, each
//! from its own position. The broker keeps one log per stream, in its own
//! directory; what a consumer group has committed lives in the journal,
//! not here (see `rosetta_core::stream`).
//!
//! # Shape
//!
//! - `format`: segment names, the segment header, the record frame;
//! - `writer`: group commit (one `write` and one `fdatasync` per batch);
//! - `recovery`: opening a log: sealed segments from their index files,
//!   the others by a scan that verifies every record, cuts a torn tail and
//!   rebuilds the indexes (cases table there);
//! - `index_file`: a sealed segment's sparse index kept in a file;
//! - `retention`: deleting whole segments by age and size;
//! - `tail`: the newest batches kept in memory, as written, for readers
//!   at the tail;
//! - this module: the shared state, the indexes and the read path.
//!
//! # Files
//!
//! The log's directory holds segments `NNNNNNNNNNNNNNNNNNNN.log`, named by
//! the offset of their first record (20 digits, so names sort by offset).
//! Only the newest segment is written; it rolls over when the next record
//! would take it past [`LogConfig::segment_bytes`].
//!
//! # Offsets, timestamps, indexes
//!
//! Offsets are dense: the first record is offset 0 and each append takes
//! the next. (Only damage found at recovery can leave a gap; readers step
//! over it.) A record's timestamp is the caller's (the broker's clock at
//! publish), raised to the previous record's when the clock went back, so
//! timestamps never decrease along the log and a seek by time is a binary
//! search. Each segment keeps in memory a sparse index: one
//! (offset, timestamp, file position) entry at its first record and then
//! at least every [`LOG_INDEX_INTERVAL_BYTES`], so a seek by offset or by
//! time reads at most that many bytes before the record it wants. A
//! sealed segment's index is also written to a file next to it (when the
//! writer seals it, or when recovery scanned it), so that opening a log
//! with many segments reads their indexes, not their records; a missing
//! or damaged index file costs only a scan of its segment
//! (`index_file`).
//!
//! # Durability: what an append's completion means
//!
//! As for the journal, under the store's [`SyncPolicy`]:
//! [`SyncPolicy::EveryCommit`] runs a completion only after the batch
//! holding the record was written and `fdatasync`ed;
//! [`SyncPolicy::Periodic`] after `write(2)`, with a sync at most the
//! period later. Readers see a record only once its completion may run: a
//! reader never sees what a crash can take back (under `EveryCommit`).
//! After a failed write or sync the log fails closed: that batch and every
//! later append complete with [`StoreError::Failed`].

mod format;
mod index_file;
mod recovery;
mod retention;
mod tail;
#[cfg(test)]
mod tests;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use crate::storage::{OsStorage, Storage, StorageFile};
use crate::{io_error, Opaque, StoreError, SyncPolicy};

pub use format::LOG_RECORD_BODY_MAX_BYTES;
use format::{RecordHeader, RECORD_HEADER_BYTES};
pub use recovery::LogRecovery;
pub use retention::RetentionReport;
use tail::TailCache;
pub use tail::TailCacheBudget;
use writer::{Job, WriterState};

/// Default segment size: RabbitMQ's stream default (500 MB) is for
/// dedicated hosts; a quarter of it keeps retention's granularity fine on
/// small disks while rollover stays rare.
pub const LOG_SEGMENT_DEFAULT_BYTES: u64 = 128 * 1024 * 1024;
/// Smallest segment size accepted (tests use tiny segments).
pub const LOG_SEGMENT_MIN_BYTES: u64 = 1024;
/// Bytes of a segment between two sparse index entries: a seek reads at
/// most this much before its record, and the index costs 24 bytes per
/// 4 KiB of log (0.6%).
pub const LOG_INDEX_INTERVAL_BYTES: u64 = 4096;
/// Most bytes one read call takes from the file at a time: large enough
/// for sequential throughput, small enough that a reader's buffer is not
/// a second copy of the log.
pub const LOG_READ_CHUNK_BYTES: usize = 256 * 1024;
/// Most bytes of one write + fdatasync batch: bounds one batch's latency
/// when producers are far ahead of the disk (as the journal's batches).
pub const LOG_BATCH_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Default bound on appended-but-unwritten bytes before `append` blocks
/// its caller: a few batches' worth, so the writer never starves.
pub const LOG_PENDING_BYTES_MAX_DEFAULT: u64 = 32 * 1024 * 1024;
/// Default bound on one log's tail cache (see `tail`): a few batches of a
/// busy producer, so readers a credit's worth behind the writer are served
/// from memory.
pub const LOG_TAIL_CACHE_BYTES_DEFAULT: u64 = 4 * 1024 * 1024;

/// Runs after each batch became readable, with the log's new readable end
/// (on the writer thread, after the batch's completions ran): one call per
/// batch, for whoever serves readers, and for whoever gathered what the
/// completions reported to send it as one (the core's receipts).
#[derive(Clone)]
pub struct DurableHook(pub Arc<dyn Fn(u64) + Send + Sync>);

impl std::fmt::Debug for DurableHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DurableHook")
    }
}

/// Runs once an append is durable (or failed), with the record's offset;
/// on the writer thread, in offset order: keep it short.
pub type LogCompletion = Box<dyn FnOnce(Result<u64, StoreError>) + Send + 'static>;

/// How a log is kept. Build with [`LogConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// The log's own directory (created if missing).
    pub dir: PathBuf,
    /// When appends are synced (the broker's policy, as for the journal).
    pub sync: SyncPolicy,
    /// Roll to a new segment when the next record would pass this size.
    pub segment_bytes: u64,
    /// Retention by age: a sealed segment whose newest record is older
    /// than this is deleted. `None`: no limit.
    pub max_age_s: Option<u64>,
    /// Retention by size: the oldest sealed segments are deleted while the
    /// log is larger than this. `None`: no limit.
    pub max_bytes: Option<u64>,
    /// Appended-but-unwritten bytes above which `append` blocks.
    pub pending_bytes_max: u64,
    /// Where the files are.
    pub storage: Arc<dyn Storage>,
    /// Run the writer on its own thread (default). When `false` it runs
    /// only inside [`StreamLog::step`] and the blocking calls, on the
    /// calling thread: for deterministic simulations.
    pub background_writer: bool,
    /// Most bytes of this log's newest batches kept in memory for readers
    /// at the tail (0: none).
    pub tail_cache_bytes: u64,
    /// The memory the tail cache shares with other logs' (by default its
    /// own, of `tail_cache_bytes`).
    pub tail_cache_budget: Arc<TailCacheBudget>,
    /// Called once per batch made readable (see [`DurableHook`]).
    pub on_durable: Option<DurableHook>,
}

impl LogConfig {
    /// Defaults: sync every commit, 128 MiB segments, no retention limit.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            sync: SyncPolicy::EveryCommit,
            segment_bytes: LOG_SEGMENT_DEFAULT_BYTES,
            max_age_s: None,
            max_bytes: None,
            pending_bytes_max: LOG_PENDING_BYTES_MAX_DEFAULT,
            storage: Arc::new(OsStorage),
            background_writer: true,
            tail_cache_bytes: LOG_TAIL_CACHE_BYTES_DEFAULT,
            tail_cache_budget: TailCacheBudget::new(LOG_TAIL_CACHE_BYTES_DEFAULT),
            on_durable: None,
        }
    }

    fn validate(&self) -> Result<(), StoreError> {
        if self.segment_bytes < LOG_SEGMENT_MIN_BYTES {
            return Err(StoreError::Config(format!(
                "stream segment_bytes {} is below {LOG_SEGMENT_MIN_BYTES}",
                self.segment_bytes
            )));
        }
        if let SyncPolicy::Periodic(d) = self.sync {
            if d.is_zero() {
                return Err(StoreError::Config(
                    "periodic sync interval must be above zero".into(),
                ));
            }
        }
        if self.pending_bytes_max == 0 {
            return Err(StoreError::Config(
                "stream pending_bytes_max must be above zero".into(),
            ));
        }
        Ok(())
    }
}

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Its offset.
    pub offset: u64,
    /// When it was appended (ms since the epoch, never below the previous
    /// record's).
    pub timestamp_ms: u64,
    /// What was appended.
    pub body: Bytes,
}

/// What one [`StreamLog::read`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogRead {
    /// The records, in offset order.
    pub records: Vec<LogRecord>,
    /// Records the reader asked for that retention had already deleted:
    /// `first_offset - from` when `from` was below the first offset, so a
    /// reader cut by retention learns how many it missed.
    pub missed: u64,
    /// Where the next read should start.
    pub next: u64,
    /// A [`StreamLog::read_cached`] stopped at bytes the page cache does
    /// not hold: the rest is for a read that may wait for the device.
    pub uncached: bool,
}

/// The readable range of a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBounds {
    /// The oldest offset still kept.
    pub first: u64,
    /// One past the newest readable (durable) record: where `next` readers
    /// start, and the offset the next append gets once all appended are
    /// written.
    pub next: u64,
}

/// Counters of a running log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Segment files.
    pub segments: u64,
    /// Bytes in all segment files.
    pub bytes: u64,
    /// Records appended and completed.
    pub records: u64,
    /// Write batches.
    pub batches: u64,
    /// `fdatasync` calls.
    pub syncs: u64,
    /// Segments deleted by retention.
    pub segments_deleted: u64,
}

/// A sparse index entry: the record at `pos` in its segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IndexEntry {
    offset: u64,
    timestamp_ms: u64,
    pos: u64,
}

/// A segment as readers see it: only what is readable (durable).
#[derive(Debug)]
struct Segment {
    base: u64,
    path: PathBuf,
    file: Arc<dyn StorageFile>,
    salt: u32,
    /// Readable bytes (header included).
    len: u64,
    /// One past the last readable record's offset.
    next: u64,
    /// Timestamp of the newest readable record (`None`: no record yet).
    last_ts: Option<u64>,
    index: Vec<IndexEntry>,
    /// Damaged byte ranges recovery stepped over: reads skip them.
    holes: Vec<(u64, u64)>,
}

/// A segment's damaged ranges, carried out of the view lock by a read.
struct Holes(Vec<(u64, u64)>);

impl Holes {
    /// Where a read that reached `pos` goes on: past the damaged range
    /// starting there, if one does.
    fn skip_hole(&self, pos: u64) -> Option<u64> {
        self.0
            .iter()
            .find(|(from, _)| *from == pos)
            .map(|&(_, to)| to)
    }
}

impl Segment {
    /// The holes, copied only when there are any (almost never).
    fn holes_of(seg: &Segment) -> Option<Holes> {
        (!seg.holes.is_empty()).then(|| Holes(seg.holes.clone()))
    }

    /// About the bytes `records` frames take here, from the segment's
    /// average frame: how much a read of that many needs to fetch.
    fn frames_bytes(&self, records: usize) -> u64 {
        let count = self.next.saturating_sub(self.base).max(1);
        let framed = self.len.saturating_sub(format::SEGMENT_HEADER_BYTES as u64);
        (framed / count + 1).saturating_mul(records as u64)
    }

    /// The index entry to start a read of `offset` from.
    fn seek_offset(&self, offset: u64) -> u64 {
        let i = self.index.partition_point(|e| e.offset <= offset);
        match i.checked_sub(1).and_then(|i| self.index.get(i)) {
            Some(e) => e.pos,
            None => format::SEGMENT_HEADER_BYTES as u64,
        }
    }

    /// The index entry to start a search for the first record at or after
    /// `ts` from: the last entry before it.
    fn seek_time(&self, ts: u64) -> (u64, u64) {
        let i = self.index.partition_point(|e| e.timestamp_ms < ts);
        match i.checked_sub(1).and_then(|i| self.index.get(i)) {
            Some(e) => (e.offset, e.pos),
            None => (self.base, format::SEGMENT_HEADER_BYTES as u64),
        }
    }
}

/// What readers, the writer and retention share.
#[derive(Debug)]
struct View {
    /// By base offset; the last is the one being written.
    segments: BTreeMap<u64, Segment>,
    stats: LogStats,
    /// The newest records, in memory.
    tail: TailCache,
}

impl View {
    fn bounds(&self) -> LogBounds {
        let first = self.segments.keys().next().copied().unwrap_or(0);
        let next = self.segments.values().next_back().map_or(first, |s| s.next);
        LogBounds { first, next }
    }
}

#[derive(Debug)]
struct Inner {
    config: LogConfig,
    view: Mutex<View>,
    /// Appends queued for the writer.
    queue: Mutex<writer::Queue>,
    /// Signalled when jobs are queued (the writer waits on it) and when a
    /// batch was taken (blocked appenders wait on it).
    queue_changed: Condvar,
    /// The writer's own state (files being written, sync debt).
    writer: Mutex<WriterState>,
    /// Serialises retention runs.
    retention: Mutex<()>,
}

/// An open stream log. See the module docs.
#[derive(Debug)]
pub struct StreamLog {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl StreamLog {
    /// Opens (or creates) the log in `config.dir`: recovers what is there
    /// (see `recovery`) and starts the writer.
    pub fn open(config: LogConfig) -> Result<(Self, LogRecovery), StoreError> {
        config.validate()?;
        let (view, writer_state, report) = recovery::recover(&config)?;
        let next_offset = view.bounds().next;
        let last_ts = view
            .segments
            .values()
            .filter_map(|s| s.last_ts)
            .next_back()
            .unwrap_or(0);
        let inner = Arc::new(Inner {
            queue: Mutex::new(writer::Queue::new(next_offset, last_ts)),
            view: Mutex::new(view),
            queue_changed: Condvar::new(),
            writer: Mutex::new(writer_state),
            retention: Mutex::new(()),
            config,
        });
        let thread = if inner.config.background_writer {
            let i = Arc::clone(&inner);
            let t = std::thread::Builder::new()
                .name("rosetta-stream-log".into())
                .spawn(move || writer::run(&i))
                .map_err(|e| io_error("spawn writer for", &inner.config.dir, e))?;
            inner.queue.lock().writer_thread = Some(t.thread().id());
            Some(t)
        } else {
            None
        };
        Ok((Self { inner, thread }, report))
    }

    /// Appends one record stamped `timestamp_ms` and returns its offset;
    /// `done` runs once it is durable (see the module docs). Blocks while
    /// too many bytes are waiting for the writer, unless called from a
    /// completion.
    ///
    /// A body given as [`Opaque::Deferred`] is encoded by the writer
    /// straight into the batch it writes (the payload copied once, into
    /// the batch, not first into a buffer of its own). Its
    /// [`EncodeOpaque::encoded_len_hint`](crate::EncodeOpaque::encoded_len_hint)
    /// must then be an upper bound of what it encodes to: a hint over
    /// [`LOG_RECORD_BODY_MAX_BYTES`] has it encoded here, and refused
    /// when it is too large, as a body of bytes is.
    pub fn append(
        &self,
        timestamp_ms: u64,
        body: impl Into<Opaque>,
        done: Option<LogCompletion>,
    ) -> Result<u64, StoreError> {
        let mut body = body.into();
        if body.len_hint() > LOG_RECORD_BODY_MAX_BYTES {
            body = Opaque::Bytes(body.to_bytes());
        }
        if body.len_hint() > LOG_RECORD_BODY_MAX_BYTES {
            return Err(StoreError::TooLarge {
                bytes: body.len_hint(),
                max: LOG_RECORD_BODY_MAX_BYTES,
            });
        }
        writer::enqueue(&self.inner, timestamp_ms, body, done)
    }

    /// Reads from offset `from`: up to `max_records` records and about
    /// `max_bytes` of bodies (always at least one record when there is
    /// one). A `from` below the first offset starts at the first offset
    /// and says how many were missed; one at or past the end returns no
    /// records.
    ///
    /// A record found damaged in a sealed segment (one opened from its
    /// index file, whose records recovery did not read) has that segment
    /// scanned again: the damage becomes a hole the read steps over, as
    /// recovery would have made it.
    pub fn read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<LogRead, StoreError> {
        self.read_with(from, max_records, max_bytes, false)
    }

    /// [`Self::read`], but only as far as memory serves it (the tail
    /// cache, and the page cache as [`StorageFile::is_cached`] tells):
    /// it stops, with [`LogRead::uncached`] set, before a file read that
    /// would wait for the device. For a caller that must not block (a
    /// connection's task).
    pub fn read_cached(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<LogRead, StoreError> {
        self.read_with(from, max_records, max_bytes, true)
    }

    fn read_with(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        cached_only: bool,
    ) -> Result<LogRead, StoreError> {
        match self.read_once(from, max_records, max_bytes, cached_only) {
            Err(e @ StoreError::Corrupt { .. }) if self.rescan_for(&e)? => {
                self.read_once(from, max_records, max_bytes, cached_only)
            }
            r => r,
        }
    }

    /// Scans again the sealed segment a [`StoreError::Corrupt`] names;
    /// `true` when that found damage the view did not know of (so a read
    /// again steps over it).
    fn rescan_for(&self, e: &StoreError) -> Result<bool, StoreError> {
        let StoreError::Corrupt { path, .. } = e else {
            return Ok(false);
        };
        let (seg, holes_before) = {
            let view = self.inner.view.lock();
            let newest = view.segments.keys().next_back().copied();
            let Some(seg) = view
                .segments
                .values()
                .find(|s| s.path == *path && Some(s.base) != newest)
            else {
                return Ok(false);
            };
            (
                Segment {
                    base: seg.base,
                    path: seg.path.clone(),
                    file: Arc::clone(&seg.file),
                    salt: seg.salt,
                    len: seg.len,
                    next: seg.next,
                    last_ts: seg.last_ts,
                    index: Vec::new(),
                    holes: Vec::new(),
                },
                seg.holes.clone(),
            )
        };
        let scanned = recovery::rescan(&*self.inner.config.storage, &seg)?;
        if scanned.holes == holes_before {
            return Ok(false);
        }
        let mut view = self.inner.view.lock();
        if let Some(s) = view.segments.get_mut(&scanned.base) {
            s.len = scanned.len;
            s.next = scanned.next;
            s.last_ts = scanned.last_ts;
            s.index = scanned.index;
            s.holes = scanned.holes;
        }
        Ok(true)
    }

    fn read_once(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        cached_only: bool,
    ) -> Result<LogRead, StoreError> {
        let mut out = LogRead {
            next: from,
            ..LogRead::default()
        };
        let mut bytes = 0usize;
        loop {
            let (file, path, salt, mut pos, end, seg_next, holes, chunk_bytes) = {
                let view = self.inner.view.lock();
                let bounds = view.bounds();
                if out.next < bounds.first {
                    out.missed += bounds.first - out.next;
                    out.next = bounds.first;
                }
                // The newest records are in memory: no read call, no copy.
                if let Some(next) = view.tail.read(
                    out.next,
                    max_records,
                    max_bytes,
                    &mut out.records,
                    &mut bytes,
                ) {
                    out.next = next;
                    return Ok(out);
                }
                let Some(seg) = view.segments.range(..=out.next).next_back().map(|(_, s)| s) else {
                    return Ok(out);
                };
                if out.next >= seg.next {
                    // Past this segment's readable end: the next segment,
                    // if any, starts later (a gap) or we are at the tail.
                    match view.segments.range(out.next + 1..).next() {
                        Some((&base, _)) if out.next < bounds.next => {
                            out.next = base;
                            continue;
                        }
                        _ => return Ok(out),
                    }
                }
                // Fetch about what this read can return (plus the seek's
                // slack before `from`), not a whole chunk: the bodies are
                // slices of the chunk, so a reader sent one record at a
                // time (its credit freed one by one) would otherwise pin a
                // chunk per delivery, and read one per record. Bounded by
                // the bytes asked for too: a reader that keeps only a
                // read-ahead waiting asks for few bytes of many records,
                // and its deliveries pin the chunks they are slices of.
                let wanted = seg
                    .frames_bytes(max_records.saturating_sub(out.records.len()))
                    .min(seg.frames_bytes(1).saturating_add(
                        u64::try_from(max_bytes.saturating_sub(bytes)).unwrap_or(u64::MAX),
                    ));
                let chunk_bytes = usize::try_from(wanted.saturating_add(LOG_INDEX_INTERVAL_BYTES))
                    .unwrap_or(usize::MAX)
                    .min(LOG_READ_CHUNK_BYTES);
                (
                    Arc::clone(&seg.file),
                    seg.path.clone(),
                    seg.salt,
                    seg.seek_offset(out.next),
                    seg.len,
                    seg.next,
                    Segment::holes_of(seg),
                    chunk_bytes,
                )
            };
            while pos < end {
                let want = usize::try_from(end - pos)
                    .unwrap_or(usize::MAX)
                    .min(chunk_bytes);
                if cached_only && !file.is_cached(pos, want) {
                    out.uncached = true;
                    return Ok(out);
                }
                let chunk = read_readable(&*file, &path, pos, want)?;
                let mut at = 0usize;
                while at < chunk.len() {
                    if let Some(to) = holes.as_ref().and_then(|h| h.skip_hole(pos + at as u64)) {
                        at = usize::try_from(to - pos).unwrap_or(usize::MAX);
                        continue;
                    }
                    let frame = match frame_at(&*file, &path, salt, &chunk, at, pos, cached_only)? {
                        FrameAt::Whole(f) => f,
                        FrameAt::ChunkEnds => break,
                        FrameAt::NotCached => {
                            out.uncached = true;
                            return Ok(out);
                        }
                    };
                    at += frame.frame_bytes;
                    if frame.record.offset < out.next {
                        continue;
                    }
                    bytes += frame.record.body.len();
                    out.next = frame.record.offset + 1;
                    out.records.push(frame.record);
                    if out.records.len() >= max_records || bytes >= max_bytes {
                        return Ok(out);
                    }
                }
                if at == 0 {
                    // The record is larger than the chunk: frame_at read it
                    // whole, so this cannot happen for readable bytes.
                    return Err(corrupt(&path, pos, "record frame does not fit its segment"));
                }
                pos += at as u64;
            }
            // This segment is read to its readable end.
            out.next = out.next.max(seg_next);
        }
    }

    /// The first offset whose record is stamped at or after `ts_ms`; the
    /// end of the log when none is. Damage found on the way is handled as
    /// [`StreamLog::read`] handles it.
    pub fn offset_at_timestamp(&self, ts_ms: u64) -> Result<u64, StoreError> {
        match self.offset_at_timestamp_once(ts_ms) {
            Err(e @ StoreError::Corrupt { .. }) if self.rescan_for(&e)? => {
                self.offset_at_timestamp_once(ts_ms)
            }
            r => r,
        }
    }

    fn offset_at_timestamp_once(&self, ts_ms: u64) -> Result<u64, StoreError> {
        let (file, path, salt, mut pos, end, mut candidate, holes) = {
            let view = self.inner.view.lock();
            let bounds = view.bounds();
            let Some(seg) = view
                .segments
                .values()
                .find(|s| s.last_ts.is_some_and(|t| t >= ts_ms))
            else {
                return Ok(bounds.next);
            };
            let (offset, pos) = seg.seek_time(ts_ms);
            (
                Arc::clone(&seg.file),
                seg.path.clone(),
                seg.salt,
                pos,
                seg.len,
                offset,
                Segment::holes_of(seg),
            )
        };
        while pos < end {
            let want = usize::try_from(end - pos)
                .unwrap_or(usize::MAX)
                .min(LOG_READ_CHUNK_BYTES);
            let chunk = read_readable(&*file, &path, pos, want)?;
            let mut at = 0usize;
            loop {
                if let Some(to) = holes.as_ref().and_then(|h| h.skip_hole(pos + at as u64)) {
                    at = usize::try_from(to - pos).unwrap_or(usize::MAX);
                    continue;
                }
                // Not cached-only: a record is read whole from the file.
                let FrameAt::Whole(frame) = frame_at(&*file, &path, salt, &chunk, at, pos, false)?
                else {
                    break;
                };
                if frame.record.timestamp_ms >= ts_ms {
                    return Ok(frame.record.offset);
                }
                candidate = frame.record.offset + 1;
                at += frame.frame_bytes;
            }
            if at == 0 {
                return Err(corrupt(&path, pos, "record frame does not fit its segment"));
            }
            pos += at as u64;
        }
        Ok(candidate)
    }

    /// The readable range, and whether a read from `from` starts in the
    /// tail cache (memory every reader there shares) rather than in the
    /// segment files (a chunk of the reader's own).
    pub fn bounds_from(&self, from: u64) -> (LogBounds, bool) {
        let view = self.inner.view.lock();
        (view.bounds(), view.tail.holds(from))
    }

    /// The readable range.
    pub fn bounds(&self) -> LogBounds {
        self.inner.view.lock().bounds()
    }

    /// Counters.
    pub fn stats(&self) -> LogStats {
        let view = self.inner.view.lock();
        let mut s = view.stats;
        s.segments = view.segments.len() as u64;
        s.bytes = view.segments.values().map(|s| s.len).sum();
        s
    }

    /// Deletes the segments retention no longer keeps (by age, measured
    /// against `now_ms`, and by size). See `retention`.
    pub fn apply_retention(&self, now_ms: u64) -> Result<RetentionReport, StoreError> {
        retention::apply(&self.inner, now_ms)
    }

    /// Runs one writer batch on this thread when the log has no writer
    /// thread; `false` when there was nothing to do.
    pub fn step(&self) -> bool {
        assert!(
            self.thread.is_none(),
            "step is for logs opened without a background writer"
        );
        writer::step(&self.inner)
    }

    /// Waits until everything appended so far is written and synced.
    pub fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = std::sync::mpsc::channel();
        writer::push_job(
            &self.inner,
            Job::Sync(Box::new(move |r| {
                let _ = tx.send(r);
            })),
        );
        if self.thread.is_none() {
            while writer::step(&self.inner) {}
        }
        rx.recv().unwrap_or(Err(StoreError::Closed))
    }

    /// Flushes and stops the writer.
    pub fn close(mut self) -> Result<(), StoreError> {
        let r = self.flush();
        self.stop();
        r
    }

    fn stop(&mut self) {
        self.inner.queue.lock().closed = true;
        self.inner.queue_changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for StreamLog {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `len` readable bytes at `pos`: the caller knows they are there (below
/// the segment's readable length), so no call asks the file's size.
fn read_readable(
    file: &dyn StorageFile,
    path: &Path,
    pos: u64,
    len: usize,
) -> Result<Bytes, StoreError> {
    // Not zeroed first: the read fills it.
    let mut buf = Vec::with_capacity(len);
    file.read_at_into(&mut buf, len, pos)
        .map_err(|e| io_error("read", path, e))?;
    Ok(Bytes::from(buf))
}

/// One record decoded from a chunk.
struct Frame {
    record: LogRecord,
    frame_bytes: usize,
}

/// What [`frame_at`] found.
enum FrameAt {
    /// A whole record.
    Whole(Frame),
    /// The chunk ends inside the record, after at least one record of it
    /// was taken: the caller reads on from the record's start.
    ChunkEnds,
    /// The record is larger than the chunk and the rest of it is not in
    /// the page cache: a cached-only read stops before it.
    NotCached,
}

/// Decodes the record at `at` in `chunk` (read from `chunk_pos` of the
/// file). A record larger than the chunk, at its start, is read from the
/// file whole, unless `cached_only` and the page cache does not hold it
/// (the chunk's own probe looked at the chunk's range only). Readable
/// bytes were verified when written or recovered, so a bad checksum here
/// is damage since then: an error, never a panic.
fn frame_at(
    file: &dyn StorageFile,
    path: &Path,
    salt: u32,
    chunk: &Bytes,
    at: usize,
    chunk_pos: u64,
    cached_only: bool,
) -> Result<FrameAt, StoreError> {
    let file_pos = chunk_pos + at as u64;
    let Some(head) = chunk.get(at..at + RECORD_HEADER_BYTES) else {
        return if at > 0 {
            Ok(FrameAt::ChunkEnds)
        } else {
            Err(corrupt(path, file_pos, "record header cut short"))
        };
    };
    let h = RecordHeader::decode(salt, head)
        .ok_or_else(|| corrupt(path, file_pos, "record header checksum"))?;
    let frame_bytes = RECORD_HEADER_BYTES + h.body_len as usize;
    let body = match chunk.get(at + RECORD_HEADER_BYTES..at + frame_bytes) {
        Some(_) => chunk.slice(at + RECORD_HEADER_BYTES..at + frame_bytes),
        None if at > 0 => return Ok(FrameAt::ChunkEnds),
        None => {
            let body_pos = file_pos + RECORD_HEADER_BYTES as u64;
            if cached_only && !file.is_cached(body_pos, h.body_len as usize) {
                return Ok(FrameAt::NotCached);
            }
            let mut b = vec![0u8; h.body_len as usize];
            file.read_at(&mut b, body_pos)
                .map_err(|e| io_error("read", path, e))?;
            Bytes::from(b)
        }
    };
    if !h.body_matches(&body) {
        return Err(corrupt(path, file_pos, "record body checksum"));
    }
    Ok(FrameAt::Whole(Frame {
        record: LogRecord {
            offset: h.offset,
            timestamp_ms: h.timestamp_ms,
            body,
        },
        frame_bytes,
    }))
}

fn corrupt(path: &Path, offset: u64, reason: &str) -> StoreError {
    StoreError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}
