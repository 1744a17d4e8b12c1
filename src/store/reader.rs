//! Recovered messages, read back from the journal one at a time.
//!
//! Replay keeps no message body: for each live message it keeps only where
//! its record is (segment, entry offset, record index) and which queues hold
//! it. [`RecoveredMessages`] then reads each message back, in seq order,
//! when the core takes it, and the core's queues keep it in memory or page
//! it as they would a new one. So a restart never holds more than the
//! queues' memory budget of message bodies, however deep the journal is:
//! what it holds per message is the index entry and a [`PendingMessage`]
//! (48 bytes, until the core has taken it).
//!
//! # Reading
//!
//! Messages are read in seq order, which is file order except for what
//! compaction copied forward, so reads go through a window of
//! [`READ_WINDOW_BYTES`] read with one `pread` and are mostly sequential.
//! Every entry read is verified again (header and body checksums, entry
//! fits its file) and the record found must be the `Message` with the
//! expected seq: the pair of the checks made before the write.
//!
//! # Locations stay valid
//!
//! Segments are immutable once written; only compaction deletes them, and a
//! rewrite deletes a segment that still holds live messages (after copying
//! them forward). While any message is unread, the store holds a
//! [`CompactionPause`]: rewrites wait (dead segments may still go, and they
//! never hold a live message). The pause ends when the last message is
//! read or the reader is dropped.
//!
//! After that, the core's queues may still refer to messages they paged
//! during the restore (by seq, not by location): [`super::Store::read_messages`]
//! looks each seq up in the index, which compaction updates when it copies
//! a record forward, and reads it with the same [`MessageReader`].
//!
//! # Limits
//!
//! An entry larger than the window is read whole on its own; an entry is
//! checksummed once for all of its records read in a row. Seqs of two large
//! entries interleaved (two big transactions committed concurrently) would
//! re-read each entry per message: correct, but slow; not seen in practice.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use super::index::Loc;
use super::record::{self, MessageSeq, QueueId, Record};
use super::segment::{self, EntryHeader, SegmentId, ENTRY_BODY_MAX_BYTES, ENTRY_HEADER_BYTES};
use super::storage::{Storage, StorageFile};
use super::writer::CompactionPause;
use super::{io_error, RecoveredMessage, RecoveredPlacement, StoreError};

/// Bytes read from a segment at once.
pub(crate) const READ_WINDOW_BYTES: usize = 1024 * 1024;

/// A live message waiting to be read back. 48 bytes: there is one per
/// recovered message until the core has taken it.
#[derive(Debug)]
pub(crate) struct PendingMessage {
    seq: MessageSeq,
    loc: Loc,
    /// The holder when it is the only one and was never delivered (almost
    /// always); otherwise `placements` lists every holder.
    queue: QueueId,
    // A thin pointer (8 bytes, where `Vec` or `Box<[_]>` take 24 or 16):
    // this field is `None` for almost every one of a million entries.
    #[allow(clippy::box_collection)]
    placements: Option<Box<Vec<RecoveredPlacement>>>,
}

impl PendingMessage {
    pub(crate) fn new(seq: MessageSeq, loc: Loc, mut placements: Vec<RecoveredPlacement>) -> Self {
        let usual = match placements.as_slice() {
            [p] => p.state.is_none(),
            _ => false,
        };
        if usual {
            let queue = placements.pop().map_or(0, |p| p.queue);
            return Self {
                seq,
                loc,
                queue,
                placements: None,
            };
        }
        Self {
            seq,
            loc,
            queue: 0,
            placements: Some(Box::new(placements)),
        }
    }

    fn placements(self) -> Vec<RecoveredPlacement> {
        match self.placements {
            Some(all) => *all,
            None => vec![RecoveredPlacement {
                queue: self.queue,
                state: None,
            }],
        }
    }
}

/// The live messages recovery found, read back from the journal on demand,
/// in seq order (which is also the order within each queue). An iterator:
/// each item is one message with the queues that hold it, or the error that
/// kept it from being read (the message stays in the journal). See the
/// module docs of `reader` for the memory this saves and how it stays safe
/// against compaction.
pub struct RecoveredMessages {
    reader: MessageReader,
    pending: std::vec::IntoIter<PendingMessage>,
    pause: Option<CompactionPause>,
}

impl std::fmt::Debug for RecoveredMessages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecoveredMessages")
            .field("dir", &self.reader.dir)
            .field("remaining", &self.pending.len())
            .finish()
    }
}

impl RecoveredMessages {
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        salt: u32,
        pending: Vec<PendingMessage>,
        pause: Option<CompactionPause>,
    ) -> Self {
        Self {
            reader: MessageReader::new(storage, dir, salt),
            pending: pending.into_iter(),
            pause,
        }
    }

    /// Messages not yet read.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// True when every message was read.
    pub fn is_empty(&self) -> bool {
        self.pending.len() == 0
    }

    /// Reads every remaining message into memory (tests and small
    /// journals; a deep journal is what this type exists to avoid loading).
    pub fn read_all(self) -> Result<Vec<RecoveredMessage>, StoreError> {
        self.collect()
    }
}

/// Reads `Message` records back from known locations, verifying each
/// entry again (the pair of the checks made before the write) and that the
/// record found is the message expected.
pub(crate) struct MessageReader {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    /// The journal's salt, to verify entry headers.
    salt: u32,
    window: Window,
}

impl MessageReader {
    pub(crate) fn new(storage: Arc<dyn Storage>, dir: PathBuf, salt: u32) -> Self {
        Self {
            storage,
            dir,
            salt,
            window: Window::default(),
        }
    }

    /// Message `seq`, whose record is at `loc`.
    pub(crate) fn read(&mut self, seq: MessageSeq, loc: Loc) -> Result<Bytes, StoreError> {
        let path = || self.dir.join(segment::file_name(loc.seg));
        let body = self
            .window
            .entry_body(&*self.storage, &self.dir, self.salt, loc)?;
        let rec = record::decode_record_at(&body, loc.idx).map_err(|e| StoreError::Corrupt {
            path: path(),
            offset: loc.entry,
            reason: format!("message {seq} does not decode: {e}"),
        })?;
        match rec {
            Record::Message {
                seq: found, body, ..
            } if found == seq => Ok(body.to_bytes()),
            other => Err(StoreError::Corrupt {
                path: path(),
                offset: loc.entry,
                reason: format!(
                    "expected message {seq} at record {}, found {:?} record",
                    loc.idx,
                    other.seq()
                ),
            }),
        }
    }

    /// Forgets the read buffer.
    fn release(&mut self) {
        self.window = Window::default();
    }
}

impl Iterator for RecoveredMessages {
    type Item = Result<RecoveredMessage, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let p = self.pending.next()?;
        let read = self.reader.read(p.seq, p.loc);
        if self.pending.len() == 0 {
            // Nothing refers to a location any more: compaction may go on,
            // and the read buffer can go.
            self.pause = None;
            self.reader.release();
        }
        let seq = p.seq;
        Some(read.map(|body| RecoveredMessage {
            seq,
            body,
            queues: p.placements(),
        }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.pending.size_hint()
    }
}

impl ExactSizeIterator for RecoveredMessages {}

/// A range of one segment file read into memory, and which entry in it was
/// last verified.
#[derive(Default)]
struct Window {
    seg: Option<(SegmentId, Box<dyn StorageFile>, u64)>,
    start: u64,
    bytes: Bytes,
    verified: Option<(SegmentId, u64)>,
}

impl Window {
    /// The verified body of the entry at `loc`.
    fn entry_body(
        &mut self,
        storage: &dyn Storage,
        dir: &std::path::Path,
        salt: u32,
        loc: Loc,
    ) -> Result<Bytes, StoreError> {
        let path = || dir.join(segment::file_name(loc.seg));
        let corrupt = |reason: String| StoreError::Corrupt {
            path: path(),
            offset: loc.entry,
            reason,
        };
        let raw = self.range(storage, dir, loc.seg, loc.entry, ENTRY_HEADER_BYTES)?;
        let mut h = [0u8; ENTRY_HEADER_BYTES];
        h.copy_from_slice(&raw);
        let header = EntryHeader::decode_known(&h, salt)
            .map_err(|f| corrupt(format!("entry header of a recovered message: {f:?}")))?;
        let body_len = header.body_len as usize;
        if body_len > ENTRY_BODY_MAX_BYTES {
            return Err(corrupt(format!("entry body of {body_len} bytes")));
        }
        // Header and body in one window, so the next records of the same
        // entry (a transaction, a compaction copy of many messages) are
        // served from it, checksummed once, however large the entry is.
        let whole = self.range(
            storage,
            dir,
            loc.seg,
            loc.entry,
            ENTRY_HEADER_BYTES + body_len,
        )?;
        let body = whole.slice(ENTRY_HEADER_BYTES..);
        if self.verified != Some((loc.seg, loc.entry)) {
            if crc32c::crc32c(&body) != header.body_crc {
                return Err(corrupt("entry body checksum mismatch".into()));
            }
            self.verified = Some((loc.seg, loc.entry));
        }
        Ok(body)
    }

    /// `len` bytes of segment `seg` at `offset`, from the window or read
    /// into a new one that starts there.
    fn range(
        &mut self,
        storage: &dyn Storage,
        dir: &std::path::Path,
        seg: SegmentId,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, StoreError> {
        let end = offset + len as u64;
        let in_window = matches!(&self.seg, Some((s, _, _)) if *s == seg)
            && offset >= self.start
            && end <= self.start + self.bytes.len() as u64;
        if !in_window {
            self.fill(storage, dir, seg, offset, len)?;
        }
        let from = (offset - self.start) as usize;
        Ok(self.bytes.slice(from..from + len))
    }

    fn fill(
        &mut self,
        storage: &dyn Storage,
        dir: &std::path::Path,
        seg: SegmentId,
        offset: u64,
        len: usize,
    ) -> Result<(), StoreError> {
        let path = dir.join(segment::file_name(seg));
        let (file, file_len) = match self.seg.take() {
            Some((s, file, file_len)) if s == seg => (file, file_len),
            _ => {
                let file = storage
                    .open(&path)
                    .map_err(|e| io_error("open", &path, e))?;
                let file_len = file.size().map_err(|e| io_error("stat", &path, e))?;
                (file, file_len)
            }
        };
        let left = file_len.saturating_sub(offset);
        if left < len as u64 {
            return Err(StoreError::Corrupt {
                path,
                offset,
                reason: format!(
                    "a recovered message's entry runs past the end of the file ({len} bytes wanted, {left} left)"
                ),
            });
        }
        let size = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(len.max(READ_WINDOW_BYTES));
        let mut buf = vec![0u8; size];
        file.read_at(&mut buf, offset)
            .map_err(|e| io_error("read", &path, e))?;
        self.seg = Some((seg, file, file_len));
        // Bytes read anew are checked anew.
        self.verified = None;
        self.start = offset;
        self.bytes = Bytes::from(buf);
        Ok(())
    }
}
