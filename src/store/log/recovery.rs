//! Opening a stream log: a sealed segment with a valid index file (see
//! `index_file`) is opened from it, without reading the segment; every
//! other segment is scanned and every record verified (header checksum
//! salted with the segment's salt, body checksum, offsets rising), its
//! sparse index is rebuilt from the scan (and, for a sealed segment,
//! written to its index file), and damage costs only the damaged bytes.
//!
//! | found | done |
//! |---|---|
//! | no segment | segment 0 is created (a new log) |
//! | a sealed segment whose index file verifies (checksum, version, base offset, salt, the segment's size) | opened from the index: its summary, sparse index and known holes; not read |
//! | a sealed segment whose index file is missing, torn, damaged or does not match | scanned as below, and its index file written again |
//! | damage in a sealed segment opened from its index, found by a read | that segment is scanned again: the damaged bytes become a hole readers step over (their offsets a gap), and its index file is written again |
//! | a bad record, and a valid one later in the segment | the bytes between are reported lost (their offsets become a gap readers step over); the scan goes on from the valid one |
//! | a bad record in the newest segment (a crash during a write) | the torn tail is cut there (`set_len` + `fdatasync`) and reported, with any valid-looking records after it; appends go on from the last valid record. A torn write keeps or drops each sector of the unsynced batch independently, so records after a torn sector were never acknowledged (their batch was not synced), and keeping them would leave a gap of offsets that their producers were told failed. The price: bit rot inside the newest segment costs the records after it in that segment too (Kafka makes the same choice for its unflushed tail) |
//! | bad bytes to the end of an older segment | reported lost, left as they are (the segment is sealed; retention deletes it in time) |
//! | the newest segment shorter than its header (a crash while it was created) | made again, empty: nothing was written in it before its header was synced |
//! | a segment header that does not verify, newest segment | its bytes are reported lost and the segment is made again, empty, at the base offset its name gives (a header is synced before any record goes in, so this is damage, not a crash) |
//! | a segment header that does not verify, older segment | the segment is reported unreadable and left out: its offsets are a gap |
//! | a segment file whose name is not a segment's | ignored |
//!
//! Recovery never panics and never deletes a file.

use std::path::PathBuf;
use std::sync::Arc;

use tracing::{info, warn};

use super::format::{
    self, LogSegmentHeader, RecordHeader, RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES,
};
use super::index_file::{self, SegmentIndex};
use super::tail::TailCache;
use super::writer::{self, Active, WriterState};
use super::{
    IndexEntry, LogConfig, LogStats, Segment, View, LOG_INDEX_INTERVAL_BYTES, LOG_READ_CHUNK_BYTES,
};
use crate::storage::{read_up_to, Storage, StorageFile};
use crate::{io_error, StoreError};

/// What recovery found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogRecovery {
    /// Segments in use.
    pub segments: usize,
    /// Valid records found.
    pub records: u64,
    /// The oldest offset kept.
    pub first_offset: u64,
    /// The offset the next append gets.
    pub next_offset: u64,
    /// Bytes cut from the end of the newest segment (a torn write).
    pub torn_tail_bytes: u64,
    /// Damaged byte ranges kept out of the log: (segment, from, to).
    pub lost: Vec<(PathBuf, u64, u64)>,
    /// Older segments whose header did not verify, left out.
    pub unreadable_segments: Vec<PathBuf>,
    /// Sealed segments opened from their index file, without a scan.
    pub indexes_used: usize,
}

/// Reads a file through a window of [`LOG_READ_CHUNK_BYTES`], so the scan
/// makes one read call per chunk rather than two per record.
struct Window<'a> {
    file: &'a dyn StorageFile,
    size: u64,
    start: u64,
    buf: Vec<u8>,
}

impl<'a> Window<'a> {
    /// `len` bytes at `pos`, or `None` when the file ends first.
    fn get(&mut self, pos: u64, len: usize) -> std::io::Result<Option<&[u8]>> {
        if pos + len as u64 > self.size {
            return Ok(None);
        }
        let end = pos + len as u64;
        if pos < self.start || end > self.start + self.buf.len() as u64 {
            self.start = pos;
            self.buf = read_up_to(self.file, pos, len.max(LOG_READ_CHUNK_BYTES))?;
        }
        let at = usize::try_from(pos - self.start).unwrap_or(usize::MAX);
        Ok(self.buf.get(at..at + len))
    }

    /// The valid record at `pos` expected to have an offset of at least
    /// `min_offset`, if there is one.
    fn record(
        &mut self,
        salt: u32,
        pos: u64,
        min_offset: u64,
    ) -> std::io::Result<Option<RecordHeader>> {
        let Some(head) = self.get(pos, RECORD_HEADER_BYTES)? else {
            return Ok(None);
        };
        let Some(h) = RecordHeader::decode(salt, head) else {
            return Ok(None);
        };
        if h.offset < min_offset {
            return Ok(None);
        }
        let body = self.get(pos + RECORD_HEADER_BYTES as u64, h.body_len as usize)?;
        Ok(body.is_some_and(|b| h.body_matches(b)).then_some(h))
    }
}

/// A segment as the scan found it.
struct Scanned {
    segment: Segment,
    last_index_pos: Option<u64>,
    records: u64,
    /// Where valid data ends (the last valid record's end).
    valid_end: u64,
    size: u64,
    lost: Vec<(u64, u64)>,
}

fn scan(
    file: Arc<dyn StorageFile>,
    path: PathBuf,
    header: LogSegmentHeader,
    newest: bool,
) -> Result<Scanned, StoreError> {
    let size = file.size().map_err(|e| io_error("stat", &path, e))?;
    let io = |e| io_error("read", &path, e);
    let mut w = Window {
        file: &*file,
        size,
        start: 0,
        buf: Vec::new(),
    };
    let salt = header.salt;
    let mut pos = SEGMENT_HEADER_BYTES as u64;
    let mut next = header.base_offset;
    let mut last_ts = None;
    let mut index: Vec<IndexEntry> = Vec::new();
    let mut last_index_pos: Option<u64> = None;
    let mut records = 0u64;
    let mut valid_end = pos;
    let mut lost = Vec::new();
    while pos < size {
        let h = match w.record(salt, pos, next).map_err(io)? {
            Some(h) => h,
            None if newest => {
                // The torn tail: from the first damage on (see the table).
                lost.push((pos, size));
                break;
            }
            None => {
                // Damage: look for the next valid record after it.
                let mut q = pos + 1;
                let mut found = None;
                while q + RECORD_HEADER_BYTES as u64 <= size {
                    if let Some(h) = w.record(salt, q, next).map_err(io)? {
                        found = Some((q, h));
                        break;
                    }
                    q += 1;
                }
                match found {
                    Some((q, _)) => {
                        lost.push((pos, q));
                        pos = q;
                        continue;
                    }
                    None => {
                        lost.push((pos, size));
                        break;
                    }
                }
            }
        };
        if last_index_pos.is_none_or(|p| pos - p >= LOG_INDEX_INTERVAL_BYTES) {
            index.push(IndexEntry {
                offset: h.offset,
                timestamp_ms: h.timestamp_ms,
                pos,
            });
            last_index_pos = Some(pos);
        }
        next = h.offset + 1;
        last_ts = Some(h.timestamp_ms);
        records += 1;
        pos += h.frame_bytes();
        valid_end = pos;
    }
    Ok(Scanned {
        segment: Segment {
            base: header.base_offset,
            path,
            file,
            salt,
            len: valid_end,
            next,
            last_ts,
            index,
            holes: lost.clone(),
        },
        last_index_pos,
        records,
        valid_end,
        size,
        lost,
    })
}

/// The index file's summary of a scan.
fn index_of(s: &Scanned) -> SegmentIndex {
    SegmentIndex {
        base: s.segment.base,
        salt: s.segment.salt,
        file_size: s.size,
        len: s.valid_end,
        next: s.segment.next,
        last_ts: s.segment.last_ts,
        records: s.records,
        entries: s.segment.index.clone(),
        holes: s.segment.holes.clone(),
    }
}

/// A sealed segment as its index file describes it.
fn segment_of_index(idx: SegmentIndex, path: PathBuf, file: Arc<dyn StorageFile>) -> Segment {
    Segment {
        base: idx.base,
        path,
        file,
        salt: idx.salt,
        len: idx.len,
        next: idx.next,
        last_ts: idx.last_ts,
        index: idx.entries,
        holes: idx.holes,
    }
}

/// Scans the sealed segment `seg` again (a read found damage the index
/// file did not know of): its readable summary, indexes and holes as the
/// scan finds them now, and its index file written again. See
/// `StreamLog::read`.
pub(crate) fn rescan(storage: &dyn Storage, seg: &Segment) -> Result<Segment, StoreError> {
    let header = LogSegmentHeader {
        base_offset: seg.base,
        created_ms: 0,
        salt: seg.salt,
    };
    let s = scan(Arc::clone(&seg.file), seg.path.clone(), header, false)?;
    for &(from, to) in &s.lost {
        warn!(segment = %seg.path.display(), from, to, "stream log: damaged bytes found by a read; skipped");
    }
    if let Err(e) = index_file::store(storage, &seg.path, &index_of(&s)) {
        warn!(segment = %seg.path.display(), error = %e, "stream log: segment index not written");
    }
    Ok(s.segment)
}

/// Opens what is in the log directory; see the module docs.
pub(crate) fn recover(config: &LogConfig) -> Result<(View, WriterState, LogRecovery), StoreError> {
    let storage = &*config.storage;
    let dir = &config.dir;
    storage
        .create_dir_all(dir)
        .map_err(|e| io_error("create directory", dir, e))?;
    let mut bases: Vec<u64> = storage
        .list(dir)
        .map_err(|e| io_error("list", dir, e))?
        .iter()
        .filter_map(|n| format::parse_segment_name(n))
        .collect();
    bases.sort_unstable();
    let mut report = LogRecovery::default();
    let mut view = View {
        segments: std::collections::BTreeMap::new(),
        stats: LogStats::default(),
        tail: TailCache::new(
            config.tail_cache_bytes,
            Arc::clone(&config.tail_cache_budget),
        ),
    };
    let mut active = None;
    for (i, &base) in bases.iter().enumerate() {
        let newest = i + 1 == bases.len();
        let path = dir.join(format::segment_name(base));
        let file: Arc<dyn StorageFile> = Arc::from(
            storage
                .open(&path)
                .map_err(|e| io_error("open", &path, e))?,
        );
        let head =
            read_up_to(&*file, 0, SEGMENT_HEADER_BYTES).map_err(|e| io_error("read", &path, e))?;
        let header = LogSegmentHeader::decode(&head).filter(|h| h.base_offset == base);
        let Some(header) = header else {
            let size = file.size().map_err(|e| io_error("stat", &path, e))?;
            if newest {
                if size <= SEGMENT_HEADER_BYTES as u64 {
                    // A crash while it was being created: its header was
                    // not yet synced, so no record was written in it.
                    info!(segment = %path.display(), size, "stream log: segment creation cut short; made again");
                    report.torn_tail_bytes = size;
                } else {
                    warn!(segment = %path.display(), size, "stream log: newest segment header damaged; made again, empty");
                    report.lost.push((path.clone(), 0, size));
                }
                drop(file);
                let (a, seg) = writer::create_segment(storage, dir, base)?;
                view.segments.insert(base, seg);
                active = Some(a);
            } else {
                warn!(segment = %path.display(), "stream log: segment header damaged; segment left out");
                report.unreadable_segments.push(path);
            }
            continue;
        };
        if !newest {
            let size = file.size().map_err(|e| io_error("stat", &path, e))?;
            if let Some(idx) = index_file::load(storage, &path, base, header.salt, size) {
                // Its index stands for a scan (see `index_file`).
                for &(from, to) in &idx.holes {
                    warn!(segment = %path.display(), from, to, "stream log: damaged bytes skipped");
                    report.lost.push((path.clone(), from, to));
                }
                report.records += idx.records;
                report.indexes_used += 1;
                view.segments
                    .insert(base, segment_of_index(idx, path, file));
                continue;
            }
        }
        let mut s = scan(file, path.clone(), header, newest)?;
        if !newest {
            // Next time this segment's index is read instead.
            if let Err(e) = index_file::store(storage, &path, &index_of(&s)) {
                warn!(segment = %path.display(), error = %e, "stream log: segment index not written");
            }
        }
        for &(from, to) in &s.lost {
            if newest && to == s.size {
                continue; // the torn tail, cut below
            }
            warn!(segment = %path.display(), from, to, "stream log: damaged bytes skipped");
            report.lost.push((path.clone(), from, to));
        }
        if newest && s.valid_end < s.size {
            let cut = s.size - s.valid_end;
            info!(segment = %path.display(), bytes = cut, "stream log: torn tail cut");
            s.segment
                .file
                .set_len(s.valid_end)
                .and_then(|()| s.segment.file.sync_data())
                .map_err(|e| io_error("truncate", &path, e))?;
            report.torn_tail_bytes = cut;
            let size = s.size;
            s.segment.holes.retain(|&(_, to)| to != size);
        }
        report.records += s.records;
        if newest {
            active = Some(Active {
                base,
                path: path.clone(),
                file: Arc::clone(&s.segment.file),
                salt: s.segment.salt,
                len: s.valid_end,
                last_index_pos: s.last_index_pos,
            });
        }
        view.segments.insert(base, s.segment);
    }
    let active = match active {
        Some(a) => a,
        None => {
            // A new log (or only unreadable segments): start after them.
            let base = bases.last().map_or(0, |b| b + 1);
            let (a, seg) = writer::create_segment(storage, dir, base)?;
            view.segments.insert(base, seg);
            a
        }
    };
    let bounds = view.bounds();
    report.segments = view.segments.len();
    report.first_offset = bounds.first;
    report.next_offset = bounds.next;
    Ok((
        view,
        WriterState {
            active,
            unsynced_since: None,
            failed: None,
        },
        report,
    ))
}
