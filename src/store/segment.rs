//! Segment files: naming, the segment header, the entry header, and a
//! scanner that verifies entries one by one and re-synchronises after
//! damage.
//!
//! ```text
//! segment  = segment_header entry*
//! segment_header (48 bytes, little-endian):
//!   magic u32 "RSEG" | version u16 | reserved u16 | segment_id u64
//!   | first_entry_seq u64 | seq_floor u64 | queue_floor u64
//!   | salt u32 (version 2; 0 in version 1) | header_crc u32 (CRC32C of the 44 bytes before it)
//! entry = entry_header body
//! entry_header (32 bytes, little-endian):
//!   magic u32 "RENT" | version u16 | flags u16 | body_len u32 | body_crc u32
//!   | entry_seq u64 | reserved u32 | header_crc u32
//! ```
//!
//! `entry_seq` counts entries across the whole journal; inside one segment
//! the entries carry `first_entry_seq`, `first_entry_seq + 1`, ... so a stale
//! or misplaced entry is caught even when its checksums are fine, and a gap
//! says how many entries a damaged range held.
//! `seq_floor`/`queue_floor` are the next message seq and queue id at the
//! time the segment was created, so the numbering never goes backwards after
//! compaction has deleted every record that mentioned the highest ones.
//!
//! # Versions
//!
//! - Version 1: the entry header checksum is the CRC32C of its first 28
//!   bytes.
//! - Version 2 (written now): the same layout; the segment header carries
//!   the journal's *salt*, a random number chosen when the journal was
//!   created (also in every other segment header and in the manifest), and
//!   the entry header checksum is the CRC32C of the salt followed by the
//!   28 bytes. Recovery re-synchronises after damage by searching the
//!   bytes that follow for the next entry magic with a valid header
//!   checksum; without the salt a client could publish a payload holding
//!   a well-formed entry and have it replayed as a record if the entry
//!   around it were ever damaged. With it, such a payload cannot be made
//!   to pass. A version 2 segment holds only version 2 entries.
//!
//! Both versions are read; version 1 segments (journals written before)
//! stay as they are until compaction deletes or rewrites them.

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::manifest::SegmentFacts;
use super::storage::{self, Storage, StorageFile};

/// Id of a segment; also its file name.
pub type SegmentId = u64;

/// Segment header magic ("RSEG" little-endian).
pub const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"RSEG");
/// Entry header magic ("RENT" little-endian).
pub const ENTRY_MAGIC: u32 = u32::from_le_bytes(*b"RENT");
/// On-disk format version of segment and entry headers written now.
pub const FORMAT_VERSION: u16 = 2;
/// Oldest format version still read.
pub const FORMAT_VERSION_MIN: u16 = 1;
/// Size of the segment header.
pub const SEGMENT_HEADER_BYTES: usize = 48;
/// Size of an entry header.
pub const ENTRY_HEADER_BYTES: usize = 32;
/// Largest entry body: a bound on one append (and so on one message), and
/// what a reader will allocate at most for one entry.
pub const ENTRY_BODY_MAX_BYTES: usize = 256 * 1024 * 1024;
/// File name suffix of segments.
pub const SEGMENT_SUFFIX: &str = ".seg";

/// File name of segment `id`: 20 zero-padded digits, so names sort by id.
pub fn file_name(id: SegmentId) -> String {
    format!("{id:020}{SEGMENT_SUFFIX}")
}

/// Parses a segment file name; `None` for anything else in the directory.
pub fn parse_file_name(name: &str) -> Option<SegmentId> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The header at the start of every segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Must equal the id in the file name.
    pub id: SegmentId,
    /// Format version of the segment and of its entries.
    pub format: u16,
    /// `entry_seq` of the first entry in this segment.
    pub first_entry_seq: u64,
    /// Next message seq when the segment was created.
    pub seq_floor: u64,
    /// Next queue id when the segment was created.
    pub queue_floor: u64,
    /// The journal's salt (version 2; 0 in version 1).
    pub salt: u32,
}

impl SegmentHeader {
    /// The 48 header bytes.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut b = [0u8; SEGMENT_HEADER_BYTES];
        b[0..4].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.format.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_entry_seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq_floor.to_le_bytes());
        b[32..40].copy_from_slice(&self.queue_floor.to_le_bytes());
        b[40..44].copy_from_slice(&self.salt.to_le_bytes());
        let crc = crc32c::crc32c(&b[..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and verifies header bytes.
    pub fn decode(b: &[u8; SEGMENT_HEADER_BYTES]) -> Result<Self, HeaderFault> {
        if le_u32(b, 0) != SEGMENT_MAGIC {
            return Err(HeaderFault::BadMagic);
        }
        if le_u32(b, 44) != crc32c::crc32c(&b[..44]) {
            return Err(HeaderFault::BadChecksum);
        }
        let format = le_u16(b, 4);
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&format) {
            return Err(HeaderFault::UnsupportedVersion(format));
        }
        Ok(Self {
            id: le_u64(b, 8),
            format,
            first_entry_seq: le_u64(b, 16),
            seq_floor: le_u64(b, 24),
            queue_floor: le_u64(b, 32),
            salt: if format >= 2 { le_u32(b, 40) } else { 0 },
        })
    }
}

/// The header in front of every entry body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    /// Body length in bytes.
    pub body_len: u32,
    /// CRC32C of the body.
    pub body_crc: u32,
    /// Journal-wide entry number.
    pub entry_seq: u64,
}

/// The header checksum of format `format`: salted from version 2 on.
fn entry_header_crc(b: &[u8], format: u16, salt: u32) -> u32 {
    if format >= 2 {
        crc32c::crc32c_append(crc32c::crc32c(&salt.to_le_bytes()), &b[..28])
    } else {
        crc32c::crc32c(&b[..28])
    }
}

impl EntryHeader {
    /// The header for `body`.
    pub fn for_body(body: &[u8], entry_seq: u64) -> Self {
        // Paired with the `ENTRY_BODY_MAX_BYTES` check in the scanner: we
        // never write what we would refuse to read.
        assert!(
            body.len() <= ENTRY_BODY_MAX_BYTES,
            "entry body over the cap"
        );
        Self {
            body_len: u32::try_from(body.len()).unwrap_or(u32::MAX),
            body_crc: crc32c::crc32c(body),
            entry_seq,
        }
    }

    /// The 32 header bytes in format `format` (salted with `salt` from
    /// version 2 on).
    pub fn encode(&self, format: u16, salt: u32) -> [u8; ENTRY_HEADER_BYTES] {
        let mut b = [0u8; ENTRY_HEADER_BYTES];
        b[0..4].copy_from_slice(&ENTRY_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&format.to_le_bytes());
        b[8..12].copy_from_slice(&self.body_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.body_crc.to_le_bytes());
        b[16..24].copy_from_slice(&self.entry_seq.to_le_bytes());
        let crc = entry_header_crc(&b, format, salt);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and verifies header bytes (not the body) of an entry of a
    /// segment in format `format`: an entry of another version is not one
    /// of this segment's.
    pub fn decode(
        b: &[u8; ENTRY_HEADER_BYTES],
        format: u16,
        salt: u32,
    ) -> Result<Self, HeaderFault> {
        if le_u32(b, 0) != ENTRY_MAGIC {
            return Err(HeaderFault::BadMagic);
        }
        let version = le_u16(b, 4);
        let crc = le_u32(b, 28);
        if version > FORMAT_VERSION {
            // A layout we do not know, checksummed as one we do: written by
            // a newer build.
            let known = [1, FORMAT_VERSION]
                .iter()
                .any(|f| entry_header_crc(b, *f, salt) == crc);
            return Err(if known {
                HeaderFault::UnsupportedVersion(version)
            } else {
                HeaderFault::BadChecksum
            });
        }
        if version != format || crc != entry_header_crc(b, format, salt) {
            return Err(HeaderFault::BadChecksum);
        }
        Ok(Self::fields(b))
    }

    /// Like [`decode`](Self::decode), for an entry at a location recovery
    /// verified: its own version says how it is checksummed.
    pub fn decode_known(b: &[u8; ENTRY_HEADER_BYTES], salt: u32) -> Result<Self, HeaderFault> {
        let version = le_u16(b, 4);
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
            return Err(HeaderFault::UnsupportedVersion(version));
        }
        Self::decode(b, version, salt)
    }

    fn fields(b: &[u8; ENTRY_HEADER_BYTES]) -> Self {
        Self {
            body_len: le_u32(b, 8),
            body_crc: le_u32(b, 12),
            entry_seq: le_u64(b, 16),
        }
    }
}

/// What is wrong with a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderFault {
    /// Not our magic number (zeros, garbage, another file).
    BadMagic,
    /// Checksum mismatch.
    BadChecksum,
    /// Checksummed fine but written by a newer format.
    UnsupportedVersion(u16),
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    let mut x = [0u8; 2];
    x.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(x)
}

pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// What was wrong where a scan met damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// File shorter than a segment header.
    TornSegmentHeader,
    /// Segment header with a wrong magic, checksum or id.
    BadSegmentHeader,
    /// Fewer bytes left than an entry header.
    TornEntryHeader,
    /// Entry header with a wrong magic number.
    BadEntryMagic,
    /// Entry header checksum mismatch.
    BadEntryHeaderChecksum,
    /// Entry body longer than [`ENTRY_BODY_MAX_BYTES`].
    OversizedEntry,
    /// The file ends inside the entry body.
    TornEntryBody,
    /// Entry body checksum mismatch.
    BadEntryBodyChecksum,
    /// A well-formed entry with an older entry sequence than expected (a
    /// stale or misplaced copy).
    EntrySeqMismatch,
    /// Well-formed entries, but the sequence jumps: entries in between
    /// are missing.
    EntrySeqGap,
    /// The file is shorter than the manifest recorded when it was sealed.
    TruncatedSegment,
}

/// One verified entry.
#[derive(Debug, Clone)]
pub struct ScannedEntry {
    /// Offset of the entry header in the file.
    pub offset: u64,
    /// Total bytes (header + body).
    pub len: u64,
    /// Its header.
    pub header: EntryHeader,
    /// Its body (checksum verified).
    pub body: Bytes,
}

/// A range of a segment that holds no valid entry.
#[derive(Debug, Clone)]
pub struct DamagedSpan {
    /// Offset of the first byte that is not a valid entry.
    pub offset: u64,
    /// Offset of the next valid entry, or the end of the file.
    pub end: u64,
    /// What was wrong at `offset`.
    pub damage: Damage,
    /// Entry seqs the range held, `[from, to)`, when the entries around it
    /// (or the manifest) say; `to` is `None` when nothing after it says
    /// where the lost entries ended.
    pub lost_entries: Option<(u64, Option<u64>)>,
    /// A valid entry follows: damage in the middle, not a torn tail.
    pub resumed: bool,
    /// The body of the damaged entry when only its body checksum failed:
    /// decoded, it tells what was probably lost (unverified).
    pub suspect_body: Option<Bytes>,
}

/// One step of a scan.
#[derive(Debug)]
pub enum ScanItem {
    /// A verified entry.
    Entry(ScannedEntry),
    /// Damage; scanning goes on after it.
    Damaged(DamagedSpan),
    /// The end of the file.
    End,
}

/// Why a scan cannot go on.
#[derive(Debug)]
pub enum ScanStop {
    /// The segment header is torn (file shorter than a header): there is
    /// nothing in the file to scan.
    TornHeader,
    /// A header from a newer format, checksummed fine: refuse rather than
    /// skip data a newer build wrote.
    Unsupported {
        /// Offset of the header.
        offset: u64,
        /// Its version.
        version: u16,
    },
    /// Reading failed.
    Io(io::Error),
}

/// What a scan may know of a segment besides its own header.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ScanContext {
    /// The journal's salt, from the manifest or another segment header.
    pub(crate) salt: Option<u32>,
    /// The manifest's record of the segment.
    pub(crate) facts: Option<SegmentFacts>,
}

/// Bytes a scanner reads at once.
const SCAN_BUFFER_BYTES: usize = 256 * 1024;

/// Sequential reads of one file through [`StorageFile::read_at`], a buffer
/// at a time.
pub(crate) struct BufferedFile {
    file: Box<dyn StorageFile>,
    len: u64,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    start: u64,
}

impl BufferedFile {
    pub(crate) fn new(file: Box<dyn StorageFile>) -> io::Result<Self> {
        let len = file.size()?;
        Ok(Self {
            file,
            len,
            buf: Vec::new(),
            start: 0,
        })
    }

    /// Length of the file when it was opened.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Fills `out` from `offset` (which must leave `out.len()` bytes in the
    /// file).
    pub(crate) fn read_exact_at(&mut self, out: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + out.len() as u64;
        let buffered = offset >= self.start && end <= self.start + self.buf.len() as u64;
        if !buffered {
            if out.len() >= SCAN_BUFFER_BYTES {
                // Large reads go straight into the caller's buffer.
                return self.file.read_at(out, offset);
            }
            let want = usize::try_from(self.len.saturating_sub(offset))
                .unwrap_or(usize::MAX)
                .min(SCAN_BUFFER_BYTES);
            self.buf.resize(want, 0);
            self.file.read_at(&mut self.buf, offset)?;
            self.start = offset;
            if end > self.start + self.buf.len() as u64 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "read past the end of a segment",
                ));
            }
        }
        let from = (offset - self.start) as usize;
        out.copy_from_slice(&self.buf[from..from + out.len()]);
        Ok(())
    }
}

/// Bytes searched at a time when re-synchronising.
const RESYNC_CHUNK_BYTES: usize = 1024 * 1024;

/// Why one entry could not be read at an offset.
enum EntryFault {
    /// Damage; with the body when only its checksum failed, and where the
    /// next entry should start when the header (so its length) is sound.
    Damaged(Damage, Option<Bytes>, Option<u64>),
    Stop(ScanStop),
}

/// Sequential, verifying reader of one segment file that re-synchronises
/// after damage: a damaged range is reported and scanning goes on at the
/// next valid entry (see the `recovery` docs).
pub struct SegmentScanner {
    file: BufferedFile,
    file_len: u64,
    offset: u64,
    /// The seq the next entry must carry (`None`: not known, the header
    /// was damaged and nothing else said).
    next_entry_seq: Option<u64>,
    /// One past the last seq this segment may hold (sealed segments).
    end_entry_seq: Option<u64>,
    /// The segment header, read or re-derived.
    pub header: SegmentHeader,
    /// What was wrong with the header, when it had to be re-derived.
    pub header_damage: Option<Damage>,
}

impl SegmentScanner {
    /// Opens `path` and verifies its segment header against `id`.
    pub fn open(storage: &dyn Storage, path: &Path, id: SegmentId) -> Result<Self, ScanStop> {
        Self::open_with(storage, path, id, ScanContext::default())
    }

    /// Opens `path`; a damaged header is re-derived from `ctx` and the
    /// entries (the scan then reports the header in `header_damage`).
    pub(crate) fn open_with(
        storage: &dyn Storage,
        path: &Path,
        id: SegmentId,
        ctx: ScanContext,
    ) -> Result<Self, ScanStop> {
        let file = storage.open(path).map_err(ScanStop::Io)?;
        let mut file = BufferedFile::new(file).map_err(ScanStop::Io)?;
        let file_len = file.len();
        if file_len < SEGMENT_HEADER_BYTES as u64 {
            return Err(ScanStop::TornHeader);
        }
        let mut raw = [0u8; SEGMENT_HEADER_BYTES];
        file.read_exact_at(&mut raw, 0).map_err(ScanStop::Io)?;
        let decoded = match SegmentHeader::decode(&raw) {
            Ok(h) if h.id == id && ctx.salt.is_none_or(|s| h.format < 2 || s == h.salt) => Ok(h),
            Ok(_) | Err(HeaderFault::BadMagic | HeaderFault::BadChecksum) => Err(()),
            Err(HeaderFault::UnsupportedVersion(version)) => {
                return Err(ScanStop::Unsupported { offset: 0, version })
            }
        };
        let end_entry_seq = ctx.facts.filter(|f| f.sealed()).map(|f| f.end_entry_seq);
        let (header, header_damage) = match decoded {
            Ok(h) => (h, None),
            Err(()) => {
                // The entries carry their own checksums: re-derive what
                // the header said from the manifest (or the entries).
                let format = ctx.facts.map_or(
                    if ctx.salt.is_some() {
                        FORMAT_VERSION
                    } else {
                        1
                    },
                    |f| f.format,
                );
                let h = SegmentHeader {
                    id,
                    format,
                    first_entry_seq: ctx.facts.map_or(0, |f| f.first_entry_seq),
                    seq_floor: ctx.facts.map_or(0, |f| f.seq_floor),
                    queue_floor: ctx.facts.map_or(0, |f| f.queue_floor),
                    salt: ctx.salt.unwrap_or(0),
                };
                (h, Some(Damage::BadSegmentHeader))
            }
        };
        let next_entry_seq = match (header_damage, ctx.facts) {
            (None, _) => Some(header.first_entry_seq),
            (Some(_), Some(f)) => Some(f.first_entry_seq),
            (Some(_), None) => None,
        };
        Ok(Self {
            file,
            file_len,
            offset: SEGMENT_HEADER_BYTES as u64,
            next_entry_seq,
            end_entry_seq,
            header,
            header_damage,
        })
    }

    /// Offset just past the last verified entry (or damaged range).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The entry seq the next entry must carry; after a header that had
    /// to be re-derived, the header's first seq until an entry says.
    pub fn next_entry_seq(&self) -> u64 {
        self.next_entry_seq.unwrap_or(self.header.first_entry_seq)
    }

    /// Whether any entry seq is known yet (not after a damaged header
    /// before the first valid entry, without a manifest).
    pub fn entry_seq_known(&self) -> bool {
        self.next_entry_seq.is_some()
    }

    /// Length of the file when it was opened.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The next verified entry, skipping damage; `Ok(None)` at the end.
    pub fn next_entry(&mut self) -> Result<Option<ScannedEntry>, ScanStop> {
        loop {
            match self.next_item()? {
                ScanItem::Entry(e) => return Ok(Some(e)),
                ScanItem::Damaged(_) => continue,
                ScanItem::End => return Ok(None),
            }
        }
    }

    /// The next entry, damaged range, or the end.
    pub fn next_item(&mut self) -> Result<ScanItem, ScanStop> {
        let offset = self.offset;
        if offset >= self.file_len {
            return Ok(ScanItem::End);
        }
        let (damage, suspect, skip_to) = match self.entry_at(offset) {
            Ok(entry) => match self.next_entry_seq {
                None => return Ok(self.take(entry)),
                Some(want) if entry.header.entry_seq == want => return Ok(self.take(entry)),
                Some(want)
                    if entry.header.entry_seq > want && self.fits_end(entry.header.entry_seq) =>
                {
                    // Well-formed, but entries are missing before it.
                    let to = entry.header.entry_seq;
                    self.next_entry_seq = Some(to);
                    return Ok(ScanItem::Damaged(DamagedSpan {
                        offset,
                        end: offset,
                        damage: Damage::EntrySeqGap,
                        lost_entries: Some((want, Some(to))),
                        resumed: true,
                        suspect_body: None,
                    }));
                }
                Some(_) => (Damage::EntrySeqMismatch, None, Some(offset + entry.len)),
            },
            Err(EntryFault::Damaged(d, suspect, skip_to)) => (d, suspect, skip_to),
            Err(EntryFault::Stop(stop)) => return Err(stop),
        };
        let found = self.resync(offset + 1, skip_to)?;
        let from = self.next_entry_seq;
        let (end, resumed, to) = match found {
            Some((at, seq)) => {
                self.next_entry_seq = Some(seq);
                (at, true, Some(seq))
            }
            None => (self.file_len, false, self.end_entry_seq),
        };
        self.offset = end;
        Ok(ScanItem::Damaged(DamagedSpan {
            offset,
            end,
            damage,
            lost_entries: from.map(|f| (f, to)),
            resumed,
            suspect_body: suspect,
        }))
    }

    fn take(&mut self, entry: ScannedEntry) -> ScanItem {
        self.offset = entry.offset + entry.len;
        self.next_entry_seq = Some(entry.header.entry_seq + 1);
        ScanItem::Entry(entry)
    }

    /// Whether `seq` may be in this segment (below its sealed end).
    fn fits_end(&self, seq: u64) -> bool {
        self.end_entry_seq.is_none_or(|end| seq < end)
    }

    /// Reads and verifies the entry at `offset` (not its seq).
    fn entry_at(&mut self, offset: u64) -> Result<ScannedEntry, EntryFault> {
        let left = self.file_len - offset;
        let damaged = |d| EntryFault::Damaged(d, None, None);
        if left < ENTRY_HEADER_BYTES as u64 {
            return Err(damaged(Damage::TornEntryHeader));
        }
        let mut raw = [0u8; ENTRY_HEADER_BYTES];
        self.file
            .read_exact_at(&mut raw, offset)
            .map_err(|e| EntryFault::Stop(ScanStop::Io(e)))?;
        let header = match EntryHeader::decode(&raw, self.header.format, self.header.salt) {
            Ok(h) => h,
            Err(HeaderFault::BadMagic) => return Err(damaged(Damage::BadEntryMagic)),
            Err(HeaderFault::BadChecksum) => return Err(damaged(Damage::BadEntryHeaderChecksum)),
            Err(HeaderFault::UnsupportedVersion(version)) => {
                return Err(EntryFault::Stop(ScanStop::Unsupported { offset, version }))
            }
        };
        let body_len = header.body_len as usize;
        if body_len > ENTRY_BODY_MAX_BYTES {
            return Err(damaged(Damage::OversizedEntry));
        }
        if (body_len as u64) > left - ENTRY_HEADER_BYTES as u64 {
            return Err(damaged(Damage::TornEntryBody));
        }
        let mut body = vec![0u8; body_len];
        self.file
            .read_exact_at(&mut body, offset + ENTRY_HEADER_BYTES as u64)
            .map_err(|e| EntryFault::Stop(ScanStop::Io(e)))?;
        let len = (ENTRY_HEADER_BYTES + body_len) as u64;
        if crc32c::crc32c(&body) != header.body_crc {
            // The header is sound, so its length is: the next entry
            // should start right after this one.
            return Err(EntryFault::Damaged(
                Damage::BadEntryBodyChecksum,
                Some(Bytes::from(body)),
                Some(offset + len),
            ));
        }
        Ok(ScannedEntry {
            offset,
            len,
            header,
            body: Bytes::from(body),
        })
    }

    /// The seq of a valid entry at `at` that may follow the ones scanned.
    fn valid_at(&mut self, at: u64) -> Result<Option<u64>, ScanStop> {
        match self.entry_at(at) {
            Ok(e) => {
                let seq = e.header.entry_seq;
                let after = self.next_entry_seq.is_none_or(|want| seq >= want);
                Ok((after && self.fits_end(seq)).then_some(seq))
            }
            Err(EntryFault::Damaged(..)) => Ok(None),
            Err(EntryFault::Stop(ScanStop::Unsupported { .. })) => Ok(None),
            Err(EntryFault::Stop(stop)) => Err(stop),
        }
    }

    /// The offset and seq of the first valid entry at or after `from`
    /// (trying `hint` first): the next entry magic with a valid header
    /// and body checksum and a seq that can follow the last entry.
    fn resync(&mut self, from: u64, hint: Option<u64>) -> Result<Option<(u64, u64)>, ScanStop> {
        if let Some(at) = hint.filter(|at| *at < self.file_len) {
            if let Some(seq) = self.valid_at(at)? {
                return Ok(Some((at, seq)));
            }
        }
        let magic = ENTRY_MAGIC.to_le_bytes();
        let mut at = from;
        while at + ENTRY_HEADER_BYTES as u64 <= self.file_len {
            let n = usize::try_from(self.file_len - at)
                .unwrap_or(usize::MAX)
                .min(RESYNC_CHUNK_BYTES);
            let chunk = storage::read_up_to(&*self.file.file, at, n).map_err(ScanStop::Io)?;
            let mut i = 0;
            while let Some(p) = chunk[i..].windows(4).position(|w| w == magic) {
                let candidate = at + (i + p) as u64;
                if let Some(seq) = self.valid_at(candidate)? {
                    return Ok(Some((candidate, seq)));
                }
                i += p + 1;
            }
            if chunk.len() < RESYNC_CHUNK_BYTES {
                break;
            }
            // The magic may straddle two chunks.
            at += (chunk.len() - 3) as u64;
        }
        Ok(None)
    }
}

/// Creates segment `header.id` in `dir` with its header written and synced.
/// The caller syncs the directory.
pub fn create(
    storage: &dyn Storage,
    dir: &Path,
    header: &SegmentHeader,
) -> io::Result<(Box<dyn StorageFile>, PathBuf)> {
    let path = dir.join(file_name(header.id));
    let file = storage.create(&path, false)?;
    file.write_at(&header.encode(), 0)?;
    file.sync_data()?;
    Ok((file, path))
}

/// Copies the bytes of `path` from `offset` to `end` into `side` (synced,
/// with its directory), so that what recovery cuts or skips stays
/// available for inspection. Returns the bytes copied.
pub fn save_range(
    storage: &dyn Storage,
    path: &Path,
    offset: u64,
    end: Option<u64>,
    side: &Path,
) -> io::Result<u64> {
    let src = storage.open(path)?;
    let end = end.unwrap_or(src.size()?);
    let dst = storage.create(side, true)?;
    let mut at = offset;
    while at < end {
        let n = usize::try_from(end - at)
            .unwrap_or(usize::MAX)
            .min(SCAN_BUFFER_BYTES);
        let chunk = storage::read_up_to(&*src, at, n)?;
        if chunk.is_empty() {
            break;
        }
        dst.write_at(&chunk, at - offset)?;
        at += chunk.len() as u64;
    }
    dst.sync_data()?;
    if let Some(dir) = side.parent() {
        storage.sync_dir(dir)?;
    }
    Ok(at - offset)
}

/// Truncates `path` to `len` bytes and syncs it.
pub fn truncate(storage: &dyn Storage, path: &Path, len: u64) -> io::Result<()> {
    let f = storage.open(path)?;
    f.set_len(len)?;
    f.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_and_parse() {
        assert_eq!(file_name(42), "00000000000000000042.seg");
        assert_eq!(parse_file_name("00000000000000000042.seg"), Some(42));
        assert_eq!(parse_file_name("42.seg"), None);
        assert_eq!(parse_file_name("00000000000000000042.seg.1.dropped"), None);
        assert_eq!(parse_file_name("0000000000000000004x.seg"), None);
        assert!(file_name(9) < file_name(10));
    }

    #[test]
    fn headers_round_trip_and_detect_damage() {
        let h = SegmentHeader {
            id: 7,
            format: FORMAT_VERSION,
            first_entry_seq: 100,
            seq_floor: 5,
            queue_floor: 6,
            salt: 0x1234_5678,
        };
        let raw = h.encode();
        assert_eq!(SegmentHeader::decode(&raw), Ok(h));
        for i in 0..SEGMENT_HEADER_BYTES {
            let mut bad = raw;
            bad[i] ^= 0x10;
            assert!(SegmentHeader::decode(&bad).is_err(), "byte {i}");
        }
        let e = EntryHeader::for_body(b"hello", 9);
        let raw = e.encode(FORMAT_VERSION, 77);
        assert_eq!(EntryHeader::decode(&raw, FORMAT_VERSION, 77), Ok(e));
        assert_eq!(EntryHeader::decode_known(&raw, 77), Ok(e));
        for i in 0..ENTRY_HEADER_BYTES {
            let mut bad = raw;
            bad[i] ^= 0x01;
            assert!(
                EntryHeader::decode(&bad, FORMAT_VERSION, 77).is_err(),
                "byte {i}"
            );
        }
        assert_eq!(
            EntryHeader::decode(&[0u8; ENTRY_HEADER_BYTES], FORMAT_VERSION, 77),
            Err(HeaderFault::BadMagic)
        );
    }

    #[test]
    fn a_salted_header_does_not_verify_without_the_salt_or_in_another_version() {
        let e = EntryHeader::for_body(b"payload", 3);
        let v2 = e.encode(2, 0xABCD_EF01);
        assert_eq!(
            EntryHeader::decode(&v2, 2, 0xABCD_EF00),
            Err(HeaderFault::BadChecksum)
        );
        assert_eq!(
            EntryHeader::decode(&v2, 1, 0),
            Err(HeaderFault::BadChecksum)
        );
        // A version 1 entry (what anyone can compute) is not accepted in a
        // version 2 segment.
        let v1 = e.encode(1, 0);
        assert_eq!(EntryHeader::decode(&v1, 1, 0), Ok(e));
        assert_eq!(
            EntryHeader::decode(&v1, 2, 0xABCD_EF01),
            Err(HeaderFault::BadChecksum)
        );
    }
}
