//! The writer thread: group commit, rollover, syncs, and the hook that runs
//! compaction between batches.
//!
//! Callers encode their records on their own thread and queue a [`Job`].
//! The writer loop:
//!
//! 1. waits until a job is queued (or a sync/compaction deadline passes);
//! 2. takes every queued job, up to [`BATCH_BYTES_MAX`] bytes: whatever
//!    piled up while the previous batch was on disk;
//! 3. frames each append as one entry, writes the batch with one `write`
//!    (one per segment when the batch crosses a rollover) and, under
//!    [`SyncPolicy::EveryCommit`], one `fdatasync`;
//! 4. applies the records to the index and hands the batch's completions
//!    to the completion thread;
//! 5. runs compaction when due.
//!
//! Nothing sleeps on a timer while work is queued, so a lone append is
//! written immediately and a busy journal batches by itself.
//!
//! Completions run on a second thread, in order, so that waking hundreds of
//! producers overlaps with the next batch's `write` + `fdatasync` instead of
//! delaying it: the writer goes straight from one sync to the next.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tracing::{debug, error};

use super::index::{Index, Loc};
use super::manifest::{self, Manifest, SegmentFacts};
use super::record::{self, Record};
use super::recovery;
use super::segment::{
    self, EntryHeader, ScanContext, SegmentHeader, SegmentId, ENTRY_HEADER_BYTES, FORMAT_VERSION,
    SEGMENT_HEADER_BYTES,
};
use super::storage::{Storage, StorageFile};
use super::{
    compaction, io_error, Completion, StoreConfig, StoreError, SyncPolicy, BATCH_BYTES_MAX,
};

/// Work for the writer thread.
pub(crate) enum Job {
    /// One atomic append (an empty body writes nothing but still completes
    /// in order).
    Append {
        body: Vec<u8>,
        records: Vec<Record>,
        sizes: Vec<u32>,
        done: Option<Completion>,
    },
    /// Sync everything before it, then complete.
    Sync(Completion),
    /// Run compaction after everything before it, then complete.
    Compact(Completion),
}

impl Job {
    fn bytes(&self) -> u64 {
        match self {
            Job::Append { body, .. } => (body.len() + ENTRY_HEADER_BYTES) as u64,
            Job::Sync(_) | Job::Compact(_) => 0,
        }
    }

    /// The job's completion, if any.
    fn into_completion(self) -> Option<Completion> {
        match self {
            Job::Append { done, .. } => done,
            Job::Sync(done) | Job::Compact(done) => Some(done),
        }
    }

    /// Completes the job with `e` without running it.
    pub(crate) fn fail(self, e: StoreError) {
        match self {
            Job::Append { done, .. } => {
                if let Some(done) = done {
                    done(Err(e));
                }
            }
            Job::Sync(done) | Job::Compact(done) => done(Err(e)),
        }
    }
}

enum Phase {
    Open,
    Closing,
    Failed(StoreError),
    Stopped,
}

struct Queue {
    jobs: VecDeque<Job>,
    bytes: u64,
    phase: Phase,
    close_result: Option<Result<(), StoreError>>,
}

/// Counters shared with [`super::Store::stats`].
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) segments: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) live_records: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) records_appended: AtomicU64,
    pub(crate) segments_deleted: AtomicU64,
    pub(crate) segments_rewritten: AtomicU64,
    pub(crate) records_rewritten: AtomicU64,
    pub(crate) active_segment: AtomicU64,
    pub(crate) sync_latency: super::latency::SyncLatency,
}

/// State shared between the [`super::Store`] handle and the writer thread.
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the writer: a job was queued or the store is closing.
    wake: Condvar,
    /// Wakes appenders blocked on `pending_bytes_max`.
    room: Condvar,
    pending_bytes_max: u64,
    writer: OnceLock<ThreadId>,
    completer: OnceLock<ThreadId>,
    /// No writer thread: the writer runs in [`super::Store::step`] (see
    /// [`StoreConfig::background_writer`]).
    manual: bool,
    /// The thread inside [`super::Store::step`] right now (manual mode).
    stepper: Mutex<Option<ThreadId>>,
    /// [`StoreConfig::compaction_enabled`]: only explicit compactions run
    /// when off.
    compaction_enabled: bool,
    /// The index (the writer's, shared with readers by seq).
    pub(crate) index: Arc<Mutex<Index>>,
    /// Completion batches handed to the completion thread and not yet run.
    completions_in_flight: AtomicUsize,
    /// Live [`CompactionPause`]s: while any exists, compaction deletes dead
    /// segments but rewrites none.
    compaction_pauses: AtomicUsize,
    pub(crate) stats: Counters,
}

/// Holds off compaction rewrites while recovered messages are still being
/// read back from their recorded locations (see `reader`). A rewrite copies
/// a segment's live records forward and deletes the file, which would pull
/// a not-yet-read message out from under its location. Deleting dead
/// segments stays allowed: a segment holding an unread recovered message
/// has that live record, so it is never dead. The pause lasts as long as
/// the core's restore (seconds), when there is nothing to reclaim anyway;
/// dropping it asks for a compaction run at once.
pub(crate) struct CompactionPause(Arc<Shared>);

impl CompactionPause {
    /// Takes over the pause [`start`] was asked to begin with: it must hold
    /// before the writer's first compaction run, which is at once.
    pub(crate) fn adopt(shared: Arc<Shared>) -> Self {
        Self(shared)
    }
}

impl Drop for CompactionPause {
    fn drop(&mut self) {
        let before = self.0.compaction_pauses.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "compaction pause released twice");
        if before == 1 && self.0.compaction_enabled {
            // The rewrites skipped meanwhile are due now; a closed store
            // refuses the job, which is fine.
            let _ = self.0.submit(Job::Compact(Box::new(|_| {})));
        }
    }
}

impl Shared {
    /// True while compaction must not rewrite segments.
    pub(crate) fn compaction_paused(&self) -> bool {
        self.compaction_pauses.load(Ordering::Acquire) > 0
    }

    /// True on the writer or the completion thread (inside a completion):
    /// such callers must never wait for the writer.
    pub(crate) fn on_writer_thread(&self) -> bool {
        let me = std::thread::current().id();
        self.writer.get() == Some(&me)
            || self.completer.get() == Some(&me)
            || (self.manual && *self.stepper.lock() == Some(me))
    }

    /// True when the writer runs only inside [`super::Store::step`].
    pub(crate) fn manual(&self) -> bool {
        self.manual
    }

    /// Marks the calling thread as the one running the writer (manual
    /// mode), or clears it.
    pub(crate) fn set_stepper(&self, stepping: bool) {
        *self.stepper.lock() = stepping.then(|| std::thread::current().id());
    }

    /// Queues a job. Blocks while the pending bytes are over the bound,
    /// except on the writer thread. Gives the job back on refusal.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Box<(StoreError, Job)>> {
        let on_writer = self.on_writer_thread();
        let bytes = job.bytes();
        let mut q = self.queue.lock();
        loop {
            match &q.phase {
                Phase::Open => {}
                Phase::Failed(e) => {
                    return Err(Box::new((StoreError::Failed(Box::new(e.clone())), job)))
                }
                Phase::Closing | Phase::Stopped => return Err(Box::new((StoreError::Closed, job))),
            }
            // A job without bytes (sync, compaction) adds nothing to what
            // the bound limits, so it never waits (a compaction pause ends
            // from wherever the last recovered message was read).
            // Nobody but the caller runs a manual writer: waiting would
            // wait forever.
            if on_writer
                || self.manual
                || bytes == 0
                || q.bytes == 0
                || q.bytes + bytes <= self.pending_bytes_max
            {
                break;
            }
            self.room.wait(&mut q);
        }
        q.bytes += bytes;
        q.jobs.push_back(job);
        drop(q);
        self.wake.notify_one();
        Ok(())
    }

    /// Bytes queued for the writer.
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.queue.lock().bytes
    }

    /// Asks the writer to finish the queued jobs and stop.
    pub(crate) fn begin_close(&self) {
        let mut q = self.queue.lock();
        if matches!(q.phase, Phase::Open) {
            q.phase = Phase::Closing;
        }
        drop(q);
        self.wake.notify_one();
        self.room.notify_all();
    }

    /// What the writer reported when it stopped.
    pub(crate) fn close_result(&self) -> Result<(), StoreError> {
        let q = self.queue.lock();
        match (&q.close_result, &q.phase) {
            (Some(r), _) => r.clone(),
            (None, Phase::Failed(e)) => Err(StoreError::Failed(Box::new(e.clone()))),
            (None, _) => Ok(()),
        }
    }
}

/// The segment being written.
pub(crate) struct Active {
    pub(crate) id: SegmentId,
    file: Box<dyn StorageFile>,
    path: PathBuf,
    pub(crate) len: u64,
}

/// The writer thread's state. Only the writer thread touches it.
pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) dir: PathBuf,
    sync: SyncPolicy,
    segment_size: u64,
    compaction_enabled: bool,
    compaction_interval: Duration,
    last_compaction: Instant,
    compaction_due: bool,
    rewrite_min_age: Duration,
    /// When each segment closed during this run (startup's count as old):
    /// too recent ones are not rewritten ([`StoreConfig::rewrite_min_age`]).
    closed_at: BTreeMap<SegmentId, Instant>,
    pub(crate) active: Active,
    next_entry_seq: u64,
    /// Floors for the next segment header: above every seq / queue id in
    /// any entry written so far (including ones not yet applied).
    seq_floor: u64,
    queue_floor: u64,
    /// The live state and per-segment liveness, shared with the store's
    /// readers: a paged message of a restored queue is read back by seq
    /// from wherever compaction has moved its record (see `reader`).
    pub(crate) index: Arc<Mutex<Index>>,
    /// The journal's salt, in every segment and entry header (see `segment`).
    salt: u32,
    /// The manifest as last written.
    manifest: Manifest,
    /// Segments with damage recovery left in place: rewritten by
    /// compaction whatever their live share, so the damage goes.
    pub(crate) damaged_segments: BTreeSet<SegmentId>,
    buf: Vec<u8>,
    unsynced_since: Option<Instant>,
    /// Hands completions to the completion thread (`None` once stopped).
    completions: Option<SyncSender<CompletionBatch>>,
    completer: Option<JoinHandle<()>>,
}

/// Completions of one batch with the batch's result.
type CompletionBatch = (Vec<Completion>, Result<(), StoreError>);

/// Batches of completions queued for the completion thread before the
/// writer waits for it: completions must not fall far behind the disk.
const COMPLETION_BATCHES_IN_FLIGHT_MAX: usize = 4;

/// Completions of a batch run on the writer thread itself when there are
/// at most this many and the completion thread is idle (low load: one
/// thread hop less per commit).
const INLINE_COMPLETIONS_MAX: usize = 4;

/// The writer: its thread, or (manual mode) the writer itself, run by
/// [`super::Store::step`].
pub(crate) enum WriterHandle {
    Thread(JoinHandle<()>),
    Manual(Box<Writer>),
}

/// What the writer starts from (recovery's findings).
pub(crate) struct Start {
    pub(crate) index: Index,
    pub(crate) first_segment: SegmentId,
    pub(crate) next_entry_seq: u64,
    /// Begin with compaction rewrites paused (see [`CompactionPause`]).
    pub(crate) paused: bool,
    pub(crate) salt: u32,
    /// The manifest's facts of the segments kept.
    pub(crate) segments: BTreeMap<SegmentId, SegmentFacts>,
    pub(crate) manifest_generation: u64,
    /// Segments with damage left in place: compaction rewrites them.
    pub(crate) damaged_segments: BTreeSet<SegmentId>,
}

/// Creates the first active segment, writes the manifest, and starts the
/// writer thread (unless the configuration asks for a manual writer).
pub(crate) fn start(
    config: &StoreConfig,
    start: Start,
) -> Result<(Arc<Shared>, WriterHandle), StoreError> {
    let Start {
        mut index,
        first_segment,
        next_entry_seq,
        paused,
        salt,
        mut segments,
        manifest_generation,
        damaged_segments,
    } = start;
    let header = SegmentHeader {
        id: first_segment,
        format: FORMAT_VERSION,
        first_entry_seq: next_entry_seq,
        seq_floor: index.next_seq,
        queue_floor: index.next_queue_id,
        salt,
    };
    let active = create_segment(&*config.storage, &config.dir, &header)?;
    index.add_segment(active.id, active.len);
    segments.insert(
        active.id,
        recovery::new_segment_facts(next_entry_seq, header.seq_floor, header.queue_floor),
    );
    let manifest = Manifest {
        generation: manifest_generation + 1,
        salt,
        segments,
    };
    manifest::write(&*config.storage, &config.dir, &manifest)
        .map_err(|e| io_error("write", &config.dir.join(manifest::MANIFEST_FILES[0]), e))?;
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            jobs: VecDeque::new(),
            bytes: 0,
            phase: Phase::Open,
            close_result: None,
        }),
        wake: Condvar::new(),
        room: Condvar::new(),
        pending_bytes_max: config.pending_bytes_max,
        writer: OnceLock::new(),
        completer: OnceLock::new(),
        manual: !config.background_writer,
        stepper: Mutex::new(None),
        compaction_enabled: config.compaction_enabled,
        index: Arc::new(Mutex::new(index)),
        completions_in_flight: AtomicUsize::new(0),
        compaction_pauses: AtomicUsize::new(usize::from(paused)),
        stats: Counters::default(),
    });
    let (completions, completer) = if config.background_writer {
        let (tx, rx) =
            std::sync::mpsc::sync_channel::<CompletionBatch>(COMPLETION_BATCHES_IN_FLIGHT_MAX);
        let completer_shared = shared.clone();
        let completer = std::thread::Builder::new()
            .name("rosetta-journal-done".into())
            .spawn(move || {
                let _ = completer_shared.completer.set(std::thread::current().id());
                for (done, result) in rx {
                    for d in done {
                        d(result.clone());
                    }
                    completer_shared
                        .completions_in_flight
                        .fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(|e| io_error("spawn completion thread", &config.dir, e))?;
        (Some(tx), Some(completer))
    } else {
        // Completions run inline, on the stepping thread, in order.
        (None, None)
    };
    let writer = Writer {
        completions,
        completer,
        shared: shared.clone(),
        storage: Arc::clone(&config.storage),
        dir: config.dir.clone(),
        sync: config.sync,
        segment_size: config.segment_size_bytes,
        compaction_enabled: config.compaction_enabled,
        compaction_interval: config.compaction_interval,
        rewrite_min_age: config.rewrite_min_age,
        closed_at: BTreeMap::new(),
        last_compaction: Instant::now(),
        compaction_due: config.compaction_enabled,
        seq_floor: header.seq_floor,
        queue_floor: header.queue_floor,
        active,
        next_entry_seq,
        index: Arc::clone(&shared.index),
        salt,
        manifest,
        damaged_segments,
        buf: Vec::new(),
        unsynced_since: None,
    };
    writer.publish_gauges();
    if !config.background_writer {
        return Ok((shared, WriterHandle::Manual(Box::new(writer))));
    }
    let thread_shared = shared.clone();
    let handle = std::thread::Builder::new()
        .name("rosetta-journal".into())
        .spawn(move || {
            let _ = thread_shared.writer.set(std::thread::current().id());
            writer.run();
        })
        .map_err(|e| io_error("spawn writer thread", &config.dir, e))?;
    Ok((shared, WriterHandle::Thread(handle)))
}

fn create_segment(
    storage: &dyn Storage,
    dir: &Path,
    header: &SegmentHeader,
) -> Result<Active, StoreError> {
    let (file, path) = segment::create(storage, dir, header)
        .map_err(|e| io_error("create", &dir.join(segment::file_name(header.id)), e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| io_error("fsync", dir, e))?;
    Ok(Active {
        id: header.id,
        file,
        path,
        len: SEGMENT_HEADER_BYTES as u64,
    })
}

impl Writer {
    fn run(mut self) {
        while self.step(true) {}
    }

    /// One turn: takes a batch (waiting for one if `wait`), writes and
    /// syncs it, runs its completions and the housekeeping that is due.
    /// `false` once the writer has stopped (closed, or failed).
    pub(crate) fn step(&mut self, wait: bool) -> bool {
        let (jobs, stop) = self.take_batch(wait);
        if let Err(e) = self.process(jobs) {
            self.fail(e);
            self.stop_completer();
            return false;
        }
        if let Err(e) = self.housekeeping() {
            self.fail(e);
            self.stop_completer();
            return false;
        }
        if stop {
            let result = self.sync();
            self.stop_completer();
            let mut q = self.shared.queue.lock();
            q.phase = Phase::Stopped;
            q.close_result = Some(result);
            return false;
        }
        true
    }

    /// Takes the next batch, waiting for work (or a deadline) if `wait`.
    /// `true` when the store is closing and nothing is left after it.
    fn take_batch(&mut self, wait: bool) -> (Vec<Job>, bool) {
        let mut q = self.shared.queue.lock();
        loop {
            if !q.jobs.is_empty() || !matches!(q.phase, Phase::Open) {
                break;
            }
            match self.next_deadline() {
                Some(d) if d <= Instant::now() => break,
                _ if !wait => break,
                Some(d) => {
                    self.shared.wake.wait_until(&mut q, d);
                }
                None => self.shared.wake.wait(&mut q),
            }
        }
        let mut jobs = Vec::new();
        let mut bytes = 0u64;
        while let Some(front) = q.jobs.front() {
            let b = front.bytes();
            if !jobs.is_empty() && bytes + b > BATCH_BYTES_MAX {
                break;
            }
            if let Some(job) = q.jobs.pop_front() {
                bytes += b;
                jobs.push(job);
            }
        }
        q.bytes -= bytes;
        let stop = q.jobs.is_empty() && !matches!(q.phase, Phase::Open);
        drop(q);
        if bytes > 0 {
            self.shared.room.notify_all();
        }
        (jobs, stop)
    }

    fn next_deadline(&self) -> Option<Instant> {
        let sync = match (self.sync, self.unsynced_since) {
            (SyncPolicy::Periodic(d), Some(since)) => Some(since + d),
            _ => None,
        };
        let compaction = if !self.compaction_enabled {
            None
        } else if self.compaction_due {
            Some(Instant::now())
        } else {
            Some(self.last_compaction + self.compaction_interval)
        };
        match (sync, compaction) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Writes one batch and runs its completions.
    fn process(&mut self, jobs: Vec<Job>) -> Result<(), StoreError> {
        if jobs.is_empty() {
            return Ok(());
        }
        let mut entries: Vec<(Vec<u8>, Vec<Record>, Vec<u32>)> = Vec::new();
        let mut completions: Vec<Completion> = Vec::new();
        let mut compact_waiters: Vec<Completion> = Vec::new();
        // Flushes complete after the index update, so stats read after a
        // flush are current.
        let mut sync_waiters: Vec<Completion> = Vec::new();
        let mut force_sync = false;
        let mut commits = 0u64;
        for job in jobs {
            match job {
                Job::Append {
                    body,
                    records,
                    sizes,
                    done,
                } => {
                    commits += 1;
                    if !body.is_empty() {
                        entries.push((body, records, sizes));
                    }
                    if let Some(done) = done {
                        completions.push(done);
                    }
                }
                Job::Sync(done) => {
                    force_sync = true;
                    sync_waiters.push(done);
                }
                Job::Compact(done) => compact_waiters.push(done),
            }
        }
        let written = self.write_and_sync(&entries, force_sync);
        let result = written.as_ref().map(|_| ()).map_err(Clone::clone);
        if result.is_ok() {
            // Counted before the completions run, so a producer that saw
            // its completion also sees it in the stats.
            let c = &self.shared.stats;
            c.commits.fetch_add(commits, Ordering::Relaxed);
            let records: usize = entries.iter().map(|(_, r, _)| r.len()).sum();
            c.records_appended
                .fetch_add(records as u64, Ordering::Relaxed);
        }
        // Producers first: the index is the writer's own bookkeeping, and
        // anything a completion appends is applied after this batch anyway.
        self.complete(completions, result.clone());
        if let Ok(locs) = written {
            self.apply(&entries, locs);
        }
        self.complete(sync_waiters, result.clone());
        drop(entries);
        if result.is_ok() && !compact_waiters.is_empty() {
            let r = self.compact_now();
            self.complete(compact_waiters, r.clone());
            return r;
        }
        self.complete(compact_waiters, result.clone());
        result
    }

    /// Writes `entries`, syncs per policy, applies them to the index.
    fn commit(
        &mut self,
        entries: &[(Vec<u8>, Vec<Record>, Vec<u32>)],
        force_sync: bool,
    ) -> Result<(), StoreError> {
        let locs = self.write_and_sync(entries, force_sync)?;
        self.apply(entries, locs);
        Ok(())
    }

    /// Writes `entries` and syncs them per policy (or if `force_sync`).
    fn write_and_sync(
        &mut self,
        entries: &[(Vec<u8>, Vec<Record>, Vec<u32>)],
        force_sync: bool,
    ) -> Result<Vec<(SegmentId, u64)>, StoreError> {
        let locs =
            self.write_entries(entries.iter().map(|(b, r, _)| (b.as_slice(), r.as_slice())))?;
        let wrote = !entries.is_empty();
        if self.sync == SyncPolicy::EveryCommit && wrote || force_sync {
            self.sync()?;
        } else if wrote && self.unsynced_since.is_none() {
            self.unsynced_since = Some(Instant::now());
        }
        Ok(locs)
    }

    /// Applies written entries to the index.
    fn apply(&mut self, entries: &[(Vec<u8>, Vec<Record>, Vec<u32>)], locs: Vec<(SegmentId, u64)>) {
        let mut index = self.index.lock();
        for ((seg, entry), (_, records, sizes)) in locs.into_iter().zip(entries) {
            // Paired with `encode_body`: one size per record.
            assert_eq!(records.len(), sizes.len(), "record sizes out of step");
            for (i, (rec, size)) in records.iter().zip(sizes).enumerate() {
                let loc = Loc {
                    seg,
                    entry,
                    idx: u32::try_from(i).unwrap_or(u32::MAX),
                };
                index.apply(rec, loc, *size, false);
            }
        }
        index.set_file_bytes(self.active.id, self.active.len);
        drop(index);
        self.publish_gauges();
    }

    /// Frames and writes entries, rolling segments as needed. Returns each
    /// entry's (segment, offset). Does not sync the last segment.
    pub(crate) fn write_entries<'a>(
        &mut self,
        entries: impl Iterator<Item = (&'a [u8], &'a [Record])>,
    ) -> Result<Vec<(SegmentId, u64)>, StoreError> {
        let mut locs = Vec::new();
        self.buf.clear();
        for (body, records) in entries {
            let entry_len = (ENTRY_HEADER_BYTES + body.len()) as u64;
            let used = self.active.len + self.buf.len() as u64;
            if used + entry_len > self.segment_size && used > SEGMENT_HEADER_BYTES as u64 {
                self.write_buf()?;
                self.roll()?;
            }
            for rec in records {
                if let Some(seq) = rec.seq() {
                    self.seq_floor = self.seq_floor.max(seq.saturating_add(1));
                }
                if let Some(q) = rec.max_queue() {
                    self.queue_floor = self.queue_floor.max(q.saturating_add(1));
                }
            }
            let offset = self.active.len + self.buf.len() as u64;
            let header = EntryHeader::for_body(body, self.next_entry_seq);
            self.next_entry_seq += 1;
            self.buf
                .extend_from_slice(&header.encode(FORMAT_VERSION, self.salt));
            self.buf.extend_from_slice(body);
            locs.push((self.active.id, offset));
        }
        self.write_buf()?;
        Ok(locs)
    }

    fn write_buf(&mut self) -> Result<(), StoreError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.active
            .file
            .write_at(&self.buf, self.active.len)
            .map_err(|e| io_error("write", &self.active.path, e))?;
        self.active.len += self.buf.len() as u64;
        self.buf.clear();
        self.shared.stats.batches.fetch_add(1, Ordering::Relaxed);
        if self.unsynced_since.is_none() {
            self.unsynced_since = Some(Instant::now());
        }
        Ok(())
    }

    /// `fdatasync`s the active segment if anything is unsynced.
    pub(crate) fn sync(&mut self) -> Result<(), StoreError> {
        if self.unsynced_since.is_none() {
            return Ok(());
        }
        let started = Instant::now();
        self.active
            .file
            .sync_data()
            .map_err(|e| io_error("fdatasync", &self.active.path, e))?;
        self.shared.stats.sync_latency.record(started.elapsed());
        self.unsynced_since = None;
        self.shared.stats.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Seals the active segment (synced, so a crash never leaves a newer
    /// segment after a torn older one) and starts the next.
    fn roll(&mut self) -> Result<(), StoreError> {
        self.sync()?;
        self.index
            .lock()
            .set_file_bytes(self.active.id, self.active.len);
        let header = SegmentHeader {
            id: self.active.id + 1,
            format: FORMAT_VERSION,
            first_entry_seq: self.next_entry_seq,
            seq_floor: self.seq_floor,
            queue_floor: self.queue_floor,
            salt: self.salt,
        };
        let next = create_segment(&*self.storage, &self.dir, &header)?;
        // The manifest seals the old segment (its length and entries are
        // final) and lists the new one; a crash before it is rewritten
        // leaves the new segment newer than the manifest, which recovery
        // replays like any other.
        if let Some(old) = self.manifest.segments.get_mut(&self.active.id) {
            old.end_entry_seq = self.next_entry_seq;
            old.len = self.active.len;
        }
        self.manifest.segments.insert(
            next.id,
            recovery::new_segment_facts(self.next_entry_seq, self.seq_floor, self.queue_floor),
        );
        self.write_manifest()?;
        debug!(segment = next.id, "journal: rolled to a new segment");
        self.closed_at.insert(self.active.id, Instant::now());
        self.index.lock().add_segment(next.id, next.len);
        self.active = next;
        self.compaction_due = self.compaction_enabled;
        self.publish_gauges();
        Ok(())
    }

    /// Rewrites the manifest (next generation, the other copy) and syncs it.
    fn write_manifest(&mut self) -> Result<(), StoreError> {
        self.manifest.generation += 1;
        manifest::write(&*self.storage, &self.dir, &self.manifest)
            .map(|_| ())
            .map_err(|e| io_error("write", &self.dir.join(manifest::MANIFEST_FILES[0]), e))
    }

    /// How a scan of segment `seg` (compaction) can verify and, after a
    /// damaged header, re-derive it.
    pub(crate) fn scan_context(&self, seg: SegmentId) -> ScanContext {
        ScanContext {
            salt: Some(self.salt),
            facts: self.manifest.segments.get(&seg).copied(),
        }
    }

    /// Whether `seg` closed long enough ago to be rewritten.
    pub(crate) fn old_enough_to_rewrite(&self, seg: SegmentId) -> bool {
        self.closed_at
            .get(&seg)
            .is_none_or(|t| t.elapsed() >= self.rewrite_min_age)
    }

    /// Deletes segment files (never the active one) and forgets them.
    /// Syncs the active segment first, so that everything that made them
    /// dead is durable before they go.
    pub(crate) fn delete_segments(&mut self, ids: &[SegmentId]) -> Result<usize, StoreError> {
        self.sync()?;
        // Retired in the manifest first: a segment missing from the disk
        // but listed there is a loss; one on disk but not listed (a crash
        // before the removal was durable) is a leftover recovery removes.
        for id in ids {
            assert_ne!(*id, self.active.id, "never delete the active segment");
            self.manifest.segments.remove(id);
        }
        self.write_manifest()?;
        let mut deleted = Vec::new();
        for &id in ids {
            let path = self.dir.join(segment::file_name(id));
            match self.storage.remove(&path) {
                Ok(()) => deleted.push(id),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => deleted.push(id),
                Err(e) => {
                    error!(path = %path.display(), error = %e, "journal: could not delete a dead segment");
                }
            }
        }
        if deleted.is_empty() {
            return Ok(0);
        }
        // The deletions must be durable before the index releases the
        // tombstones that waited on them (those may be deleted next).
        self.storage
            .sync_dir(&self.dir)
            .map_err(|e| io_error("fsync", &self.dir, e))?;
        for id in &deleted {
            self.index.lock().remove_segment(*id);
            self.closed_at.remove(id);
            self.damaged_segments.remove(id);
        }
        self.shared
            .stats
            .segments_deleted
            .fetch_add(deleted.len() as u64, Ordering::Relaxed);
        self.publish_gauges();
        Ok(deleted.len())
    }

    /// Appends records produced by the writer itself (compaction copies),
    /// as one synced entry.
    pub(crate) fn append_internal(&mut self, records: &[Record]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut body = Vec::new();
        let sizes = record::encode_body(records, &mut body);
        let entries = [(body, records.to_vec(), sizes)];
        self.commit(&entries, true)
    }

    fn housekeeping(&mut self) -> Result<(), StoreError> {
        if let (SyncPolicy::Periodic(d), Some(since)) = (self.sync, self.unsynced_since) {
            if since.elapsed() >= d {
                self.sync()?;
            }
        }
        if self.compaction_enabled
            && (self.compaction_due || self.last_compaction.elapsed() >= self.compaction_interval)
        {
            self.compact_now()?;
        }
        Ok(())
    }

    fn compact_now(&mut self) -> Result<(), StoreError> {
        self.compaction_due = false;
        self.last_compaction = Instant::now();
        let run = compaction::run(self)?;
        let c = &self.shared.stats;
        c.segments_rewritten
            .fetch_add(run.segments_rewritten as u64, Ordering::Relaxed);
        c.records_rewritten
            .fetch_add(run.records_rewritten as u64, Ordering::Relaxed);
        // A rollover during the run set the flag again; its segment was
        // already considered.
        self.compaction_due = false;
        self.publish_gauges();
        Ok(())
    }

    fn publish_gauges(&self) {
        let c = &self.shared.stats;
        let mut segments = 0u64;
        let mut bytes = 0u64;
        let index = self.index.lock();
        for (_, s) in index.segments() {
            segments += 1;
            bytes += s.file_bytes;
        }
        c.segments.store(segments, Ordering::Relaxed);
        c.bytes.store(bytes, Ordering::Relaxed);
        c.live_records
            .store(index.live_records(), Ordering::Relaxed);
        c.active_segment.store(self.active.id, Ordering::Relaxed);
    }

    /// Fails the store closed: every queued job and every later append gets
    /// the error. See the module docs of [`super`] for why there is no retry.
    fn fail(&mut self, e: StoreError) {
        error!(error = %e, "journal: write failed; refusing further appends");
        let jobs: Vec<Job> = {
            let mut q = self.shared.queue.lock();
            q.phase = Phase::Failed(e.clone());
            q.bytes = 0;
            q.jobs.drain(..).collect()
        };
        self.shared.room.notify_all();
        let done: Vec<Completion> = jobs.into_iter().filter_map(Job::into_completion).collect();
        self.complete(done, Err(StoreError::Failed(Box::new(e))));
    }

    /// Queues completions for the completion thread, in order.
    fn complete(&mut self, done: Vec<Completion>, result: Result<(), StoreError>) {
        if done.is_empty() {
            return;
        }
        // A small batch with nothing queued before it runs here: order is
        // kept, and a lone producer saves a thread hop.
        if done.len() <= INLINE_COMPLETIONS_MAX
            && self.shared.completions_in_flight.load(Ordering::Acquire) == 0
        {
            for d in done {
                d(result.clone());
            }
            return;
        }
        self.shared
            .completions_in_flight
            .fetch_add(1, Ordering::AcqRel);
        let unsent = match &self.completions {
            Some(tx) => match tx.send((done, result)) {
                Ok(()) => None,
                Err(std::sync::mpsc::SendError(batch)) => {
                    self.shared
                        .completions_in_flight
                        .fetch_sub(1, Ordering::AcqRel);
                    Some(batch)
                }
            },
            None => {
                self.shared
                    .completions_in_flight
                    .fetch_sub(1, Ordering::AcqRel);
                Some((done, result))
            }
        };
        // The completion thread is gone (it panicked in a completion): run
        // them here rather than never.
        if let Some((done, result)) = unsent {
            for d in done {
                d(result.clone());
            }
        }
    }

    /// Lets the completion thread drain and waits for it.
    fn stop_completer(&mut self) {
        self.completions = None;
        if let Some(h) = self.completer.take() {
            if h.join().is_err() {
                error!("journal: a completion panicked");
            }
        }
    }
}
