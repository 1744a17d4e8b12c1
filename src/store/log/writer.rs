//! Group commit for a stream log, the way the journal's writer does it
//! (`crate::writer`): appenders queue records; the writer takes
//! everything queued (up to [`LOG_BATCH_BYTES_MAX`]), writes it with one
//! `write` and, under [`SyncPolicy::EveryCommit`], one `fdatasync`, then
//! makes the records readable and runs their completions in offset order.
//! No timer adds delay at low load; at high load the batch grows by
//! itself while the previous one is on disk.
//!
//! A rollover inside a batch writes and syncs the full segment before the
//! next one is created (its header written and synced, and the directory
//! synced), so that what a crash loses is always a suffix of the log.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Instant;

use tracing::{debug, error, warn};

use super::format::{self, LogSegmentHeader, RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES};
use super::index_file::{self, SegmentIndex};
use super::{
    IndexEntry, Inner, LogCompletion, Segment, LOG_BATCH_BYTES_MAX, LOG_INDEX_INTERVAL_BYTES,
};
use crate::storage::{Storage, StorageFile};
use crate::{io_error, Opaque, StoreError, SyncPolicy};

/// Runs when everything before a flush is durable.
pub(crate) type SyncCompletion = Box<dyn FnOnce(Result<(), StoreError>) + Send + 'static>;

/// Work for the writer.
pub(crate) enum Job {
    /// One record, its offset and timestamp already assigned; a deferred
    /// body is encoded into the batch (its hint an upper bound).
    Append {
        offset: u64,
        timestamp_ms: u64,
        body: Opaque,
        done: Option<LogCompletion>,
    },
    /// Sync everything before it, then complete.
    Sync(SyncCompletion),
}

impl Job {
    fn bytes(&self) -> u64 {
        match self {
            Job::Append { body, .. } => (RECORD_HEADER_BYTES + body.len_hint()) as u64,
            Job::Sync(_) => 0,
        }
    }
}

/// The queue between appenders and the writer.
pub(crate) struct Queue {
    jobs: VecDeque<Job>,
    pending_bytes: u64,
    /// The offset the next append gets.
    next_offset: u64,
    /// The newest timestamp handed out (timestamps never go back).
    last_ts: u64,
    pub(crate) closed: bool,
    pub(crate) writer_thread: Option<ThreadId>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("jobs", &self.jobs.len())
            .field("pending_bytes", &self.pending_bytes)
            .field("next_offset", &self.next_offset)
            .finish()
    }
}

impl Queue {
    pub(crate) fn new(next_offset: u64, last_ts: u64) -> Self {
        Self {
            jobs: VecDeque::new(),
            pending_bytes: 0,
            next_offset,
            last_ts,
            closed: false,
            writer_thread: None,
        }
    }
}

/// The segment being written, as the writer knows it.
#[derive(Debug)]
pub(crate) struct Active {
    pub(crate) base: u64,
    pub(crate) path: PathBuf,
    pub(crate) file: Arc<dyn StorageFile>,
    pub(crate) salt: u32,
    /// Bytes written (header included).
    pub(crate) len: u64,
    /// Position of the last index entry (`None`: no record yet).
    pub(crate) last_index_pos: Option<u64>,
}

/// What only the writer touches.
#[derive(Debug)]
pub(crate) struct WriterState {
    pub(crate) active: Active,
    /// When the first write not yet synced was made (periodic sync).
    pub(crate) unsynced_since: Option<Instant>,
    /// The error that closed the log for appends.
    pub(crate) failed: Option<StoreError>,
}

/// Queues one append; see [`super::StreamLog::append`].
pub(crate) fn enqueue(
    inner: &Inner,
    timestamp_ms: u64,
    body: Opaque,
    done: Option<LogCompletion>,
) -> Result<u64, StoreError> {
    let mut q = inner.queue.lock();
    let from_writer = q.writer_thread == Some(std::thread::current().id());
    while inner.config.background_writer
        && !from_writer
        && !q.closed
        && q.pending_bytes >= inner.config.pending_bytes_max
    {
        inner.queue_changed.wait(&mut q);
    }
    if q.closed {
        return Err(StoreError::Closed);
    }
    let offset = q.next_offset;
    q.next_offset += 1;
    let ts = timestamp_ms.max(q.last_ts);
    q.last_ts = ts;
    let job = Job::Append {
        offset,
        timestamp_ms: ts,
        body,
        done,
    };
    q.pending_bytes += job.bytes();
    q.jobs.push_back(job);
    drop(q);
    inner.queue_changed.notify_all();
    Ok(offset)
}

/// Queues a job that takes no offset.
pub(crate) fn push_job(inner: &Inner, job: Job) {
    let mut q = inner.queue.lock();
    if q.closed {
        drop(q);
        if let Job::Sync(done) = job {
            done(Err(StoreError::Closed));
        }
        return;
    }
    q.jobs.push_back(job);
    drop(q);
    inner.queue_changed.notify_all();
}

/// The writer thread's loop.
pub(crate) fn run(inner: &Inner) {
    loop {
        {
            let mut q = inner.queue.lock();
            loop {
                if !q.jobs.is_empty() {
                    break;
                }
                let due = sync_due(inner);
                if q.closed {
                    drop(q);
                    sync_if_unsynced(inner);
                    return;
                }
                match due {
                    Some(at) if at <= Instant::now() => break,
                    Some(at) => {
                        inner.queue_changed.wait_until(&mut q, at);
                    }
                    None => inner.queue_changed.wait(&mut q),
                }
            }
        }
        step(inner);
    }
}

/// When the periodic policy owes a sync.
fn sync_due(inner: &Inner) -> Option<Instant> {
    let SyncPolicy::Periodic(d) = inner.config.sync else {
        return None;
    };
    inner.writer.lock().unsynced_since.map(|t| t + d)
}

fn sync_if_unsynced(inner: &Inner) {
    let mut ws = inner.writer.lock();
    if ws.unsynced_since.is_some() && ws.failed.is_none() {
        if let Err(e) = sync(inner, &ws.active) {
            error!(dir = %inner.config.dir.display(), error = %e, "stream log sync failed");
            ws.failed = Some(e);
        }
        ws.unsynced_since = None;
    }
}

/// One batch: everything queued (up to the batch bound). `false` when
/// there was nothing to write (a periodic sync that fell due is still
/// made).
pub(crate) fn step(inner: &Inner) -> bool {
    let mut ws = inner.writer.lock();
    let (jobs, bytes) = take_batch(inner);
    if jobs.is_empty() {
        if sync_due(inner).is_some_and(|at| at <= Instant::now()) {
            drop(ws);
            sync_if_unsynced(inner);
        }
        return false;
    }
    write_batch(inner, &mut ws, jobs, bytes);
    true
}

/// The jobs of one batch and the bytes their frames take.
fn take_batch(inner: &Inner) -> (Vec<Job>, u64) {
    let mut q = inner.queue.lock();
    let mut jobs = Vec::new();
    let mut bytes = 0u64;
    while let Some(job) = q.jobs.front() {
        let b = job.bytes();
        if !jobs.is_empty() && bytes + b > LOG_BATCH_BYTES_MAX {
            break;
        }
        bytes += b;
        if let Some(job) = q.jobs.pop_front() {
            jobs.push(job);
        }
    }
    q.pending_bytes -= bytes;
    drop(q);
    inner.queue_changed.notify_all();
    (jobs, bytes)
}

/// What a batch adds to one segment, applied to the readers' view once
/// the batch is durable.
struct Piece {
    base: u64,
    len: u64,
    next: Option<u64>,
    last_ts: Option<u64>,
    index: Vec<IndexEntry>,
}

enum Done {
    Append(u64, Option<LogCompletion>),
    Sync(SyncCompletion),
}

/// The records of the batch's buffer, for the tail cache: the first's
/// offset and where each frame starts in the buffer. Only what follows the
/// last rollover (what went before was written out of the buffer then).
#[derive(Default)]
struct Framed {
    first: Option<u64>,
    starts: Vec<u32>,
}

fn write_batch(inner: &Inner, ws: &mut WriterState, jobs: Vec<Job>, bytes: u64) {
    let mut done = Vec::with_capacity(jobs.len());
    let mut result = match &ws.failed {
        Some(e) => Err(StoreError::Failed(Box::new(e.clone()))),
        None => Ok(()),
    };
    // Sized once: the frames' bytes are known, so the buffer never grows
    // (and copies itself) while the batch is encoded.
    let mut buf = Vec::with_capacity(usize::try_from(bytes).unwrap_or(0));
    let mut framed = Framed::default();
    let mut pieces = vec![piece_of(&ws.active)];
    let mut created = Vec::new();
    let mut records = 0u64;
    let mut syncs = 0u64;
    for job in jobs {
        match job {
            Job::Sync(d) => done.push(Done::Sync(d)),
            Job::Append {
                offset,
                timestamp_ms,
                body,
                done: d,
            } => {
                done.push(Done::Append(offset, d));
                if result.is_err() {
                    continue;
                }
                // At most this (a deferred body's hint is an upper bound).
                let frame = (RECORD_HEADER_BYTES + body.len_hint()) as u64;
                let at = ws.active.len + buf.len() as u64;
                if at + frame > inner.config.segment_bytes && at > SEGMENT_HEADER_BYTES as u64 {
                    result = roll_over(inner, ws, &mut buf, offset).map(|seg| {
                        syncs += 2;
                        pieces.push(piece_of(&ws.active));
                        created.push(seg);
                    });
                    framed = Framed::default();
                    if result.is_err() {
                        continue;
                    }
                }
                let pos = ws.active.len + buf.len() as u64;
                let Some(piece) = pieces.last_mut() else {
                    continue; // never: pieces starts with the active segment's
                };
                if ws
                    .active
                    .last_index_pos
                    .is_none_or(|p| pos - p >= LOG_INDEX_INTERVAL_BYTES)
                {
                    piece.index.push(IndexEntry {
                        offset,
                        timestamp_ms,
                        pos,
                    });
                    ws.active.last_index_pos = Some(pos);
                }
                let start = buf.len();
                if !format::encode_record_of(&mut buf, ws.active.salt, offset, timestamp_ms, &body)
                {
                    // A hint below what it encoded to: never written, and
                    // the offset it was given cannot stay empty, so the
                    // log fails closed as after a failed write.
                    result = Err(StoreError::TooLarge {
                        bytes: body.len_hint(),
                        max: super::LOG_RECORD_BODY_MAX_BYTES,
                    });
                    continue;
                }
                framed.first.get_or_insert(offset);
                framed.starts.push(u32::try_from(start).unwrap_or(u32::MAX));
                piece.len = pos + (buf.len() - start) as u64;
                piece.next = Some(offset + 1);
                piece.last_ts = Some(timestamp_ms);
                records += 1;
            }
        }
    }
    if result.is_ok() && !buf.is_empty() {
        result = write(&ws.active, &buf);
        ws.active.len += buf.len() as u64;
        if ws.unsynced_since.is_none() {
            ws.unsynced_since = Some(Instant::now());
        }
    }
    let must_sync = inner.config.sync == SyncPolicy::EveryCommit
        || done.iter().any(|d| matches!(d, Done::Sync(_)));
    if result.is_ok() && must_sync && ws.unsynced_since.is_some() {
        result = sync(inner, &ws.active);
        syncs += 1;
        ws.unsynced_since = None;
    }
    // Segments this batch sealed (rolled over from): their index files
    // are written once its completions ran.
    let sealed: Vec<u64> = match pieces.split_last() {
        Some((_, before)) if result.is_ok() => before.iter().map(|p| p.base).collect(),
        _ => Vec::new(),
    };
    let mut readable = None;
    match &result {
        Ok(()) => {
            readable = Some(apply(inner, pieces, created, records, syncs, framed, buf));
        }
        Err(e) => {
            if ws.failed.is_none() {
                error!(dir = %inner.config.dir.display(), error = %e,
                    "stream log write failed: refusing appends until restart");
                ws.failed = Some(e.clone());
            }
        }
    }
    for d in done {
        match (d, &result) {
            (Done::Append(offset, Some(f)), Ok(())) => f(Ok(offset)),
            (Done::Append(_, Some(f)), Err(e)) => f(Err(failed(e))),
            (Done::Append(_, None), _) => {}
            (Done::Sync(f), Ok(())) => f(Ok(())),
            (Done::Sync(f), Err(e)) => f(Err(failed(e))),
        }
    }
    // After the completions: a hook may send in one go what they gathered.
    if let (Some(next), Some(hook)) = (readable, &inner.config.on_durable) {
        (hook.0)(next);
    }
    for base in sealed {
        store_index(inner, base);
    }
}

/// Writes the index file of the sealed segment `base` (see `index_file`);
/// a failure only costs a scan of it at the next open.
fn store_index(inner: &Inner, base: u64) {
    let (path, index) = {
        let view = inner.view.lock();
        let Some(seg) = view.segments.get(&base) else {
            return; // already deleted by retention
        };
        (
            seg.path.clone(),
            SegmentIndex {
                base,
                salt: seg.salt,
                // The writer wrote it whole: its file is its readable length.
                file_size: seg.len,
                len: seg.len,
                next: seg.next,
                last_ts: seg.last_ts,
                records: seg.next - base,
                entries: seg.index.clone(),
                holes: seg.holes.clone(),
            },
        )
    };
    if let Err(e) = index_file::store(&*inner.config.storage, &path, &index) {
        warn!(segment = %path.display(), error = %e, "stream log: segment index not written");
    }
}

fn failed(e: &StoreError) -> StoreError {
    match e {
        StoreError::Failed(_) => e.clone(),
        e => StoreError::Failed(Box::new(e.clone())),
    }
}

fn piece_of(a: &Active) -> Piece {
    Piece {
        base: a.base,
        len: a.len,
        next: None,
        last_ts: None,
        index: Vec::new(),
    }
}

/// Makes a batch readable: readers see its records only now that they
/// are as durable as the policy promises. The buffer the batch was written
/// from goes to the tail cache. Returns the new readable end.
fn apply(
    inner: &Inner,
    pieces: Vec<Piece>,
    created: Vec<Segment>,
    records: u64,
    syncs: u64,
    framed: Framed,
    buf: Vec<u8>,
) -> u64 {
    let data = bytes::Bytes::from(buf);
    let mut view = inner.view.lock();
    for seg in created {
        view.segments.insert(seg.base, seg);
    }
    for p in pieces {
        if let Some(seg) = view.segments.get_mut(&p.base) {
            seg.len = seg.len.max(p.len);
            if let Some(n) = p.next {
                seg.next = n;
            }
            if p.last_ts.is_some() {
                seg.last_ts = p.last_ts;
            }
            seg.index.extend(p.index);
        }
    }
    view.stats.records += records;
    view.stats.batches += 1;
    view.stats.syncs += syncs;
    if let Some(first) = framed.first {
        // A rollover wrote and emptied the buffer: what it holds now are
        // the records of the active segment, from its start.
        assert_eq!(
            framed.starts.first(),
            Some(&0),
            "framed from the buffer's start"
        );
        view.tail.push(first, framed.starts, data);
    }
    view.bounds().next
}

fn write(a: &Active, buf: &[u8]) -> Result<(), StoreError> {
    a.file
        .write_at(buf, a.len)
        .map_err(|e| io_error("write", &a.path, e))
}

fn sync(inner: &Inner, a: &Active) -> Result<(), StoreError> {
    let _ = inner;
    a.file
        .sync_data()
        .map_err(|e| io_error("fdatasync", &a.path, e))
}

/// Writes and syncs what the batch put in the full segment, then creates
/// the next one at `base`, durably, and makes it the active one. Returns
/// the new segment for the readers' view.
fn roll_over(
    inner: &Inner,
    ws: &mut WriterState,
    buf: &mut Vec<u8>,
    base: u64,
) -> Result<Segment, StoreError> {
    if !buf.is_empty() {
        write(&ws.active, buf)?;
        ws.active.len += buf.len() as u64;
        buf.clear();
    }
    sync(inner, &ws.active)?;
    ws.unsynced_since = None;
    let (active, seg) = create_segment(&*inner.config.storage, &inner.config.dir, base)?;
    debug!(dir = %inner.config.dir.display(), base, "stream log segment rolled over");
    ws.active = active;
    Ok(seg)
}

/// Creates the segment starting at `base`: its header written and synced
/// and its directory synced before any record goes in, so a segment that
/// exists after a crash always has a valid header.
pub(crate) fn create_segment(
    storage: &dyn Storage,
    dir: &std::path::Path,
    base: u64,
) -> Result<(Active, Segment), StoreError> {
    let path = dir.join(format::segment_name(base));
    let file: Arc<dyn StorageFile> = Arc::from(
        storage
            .create(&path, true)
            .map_err(|e| io_error("create", &path, e))?,
    );
    let salt = storage.random_u32();
    let header = LogSegmentHeader {
        base_offset: base,
        created_ms: now_ms(),
        salt,
    };
    file.write_at(&header.encode(), 0)
        .map_err(|e| io_error("write", &path, e))?;
    file.sync_data()
        .map_err(|e| io_error("fdatasync", &path, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| io_error("fsync directory", dir, e))?;
    let len = SEGMENT_HEADER_BYTES as u64;
    Ok((
        Active {
            base,
            path: path.clone(),
            file: Arc::clone(&file),
            salt,
            len,
            last_index_pos: None,
        },
        Segment {
            base,
            path,
            file,
            salt,
            len,
            next: base,
            last_ts: None,
            index: Vec::new(),
            holes: Vec::new(),
        },
    ))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
