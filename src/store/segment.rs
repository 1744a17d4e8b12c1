//! Segment files: naming, the segment header, the entry header, and a
//! scanner that verifies entries one by one.
//!
//! ```text
//! segment  = segment_header entry*
//! segment_header (48 bytes, little-endian):
//!   magic u32 "RSEG" | version u16 | reserved u16 | segment_id u64
//!   | first_entry_seq u64 | seq_floor u64 | queue_floor u64
//!   | reserved u32 | header_crc u32  (CRC32C of the 44 bytes before it)
//! entry = entry_header body
//! entry_header (32 bytes, little-endian):
//!   magic u32 "RENT" | version u16 | flags u16 | body_len u32 | body_crc u32
//!   | entry_seq u64 | reserved u32 | header_crc u32 (CRC32C of the 28 bytes before it)
//! ```
//!
//! `entry_seq` counts entries across the whole journal; inside one segment
//! the entries carry `first_entry_seq`, `first_entry_seq + 1`, ... so a stale
//! or misplaced entry is caught even when its checksums are fine.
//! `seq_floor`/`queue_floor` are the next message seq and queue id at the
//! time the segment was created, so the numbering never goes backwards after
//! compaction has deleted every record that mentioned the highest ones.

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::storage::{self, Storage, StorageFile};

/// Id of a segment; also its file name.
pub type SegmentId = u64;

/// Segment header magic ("RSEG" little-endian).
pub const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"RSEG");
/// Entry header magic ("RENT" little-endian).
pub const ENTRY_MAGIC: u32 = u32::from_le_bytes(*b"RENT");
/// On-disk format version of segment and entry headers.
pub const FORMAT_VERSION: u16 = 1;
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
    /// `entry_seq` of the first entry in this segment.
    pub first_entry_seq: u64,
    /// Next message seq when the segment was created.
    pub seq_floor: u64,
    /// Next queue id when the segment was created.
    pub queue_floor: u64,
}

impl SegmentHeader {
    /// The 48 header bytes.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut b = [0u8; SEGMENT_HEADER_BYTES];
        b[0..4].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_entry_seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq_floor.to_le_bytes());
        b[32..40].copy_from_slice(&self.queue_floor.to_le_bytes());
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
        let version = le_u16(b, 4);
        if version != FORMAT_VERSION {
            return Err(HeaderFault::UnsupportedVersion(version));
        }
        Ok(Self {
            id: le_u64(b, 8),
            first_entry_seq: le_u64(b, 16),
            seq_floor: le_u64(b, 24),
            queue_floor: le_u64(b, 32),
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

    /// The 32 header bytes.
    pub fn encode(&self) -> [u8; ENTRY_HEADER_BYTES] {
        let mut b = [0u8; ENTRY_HEADER_BYTES];
        b[0..4].copy_from_slice(&ENTRY_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.body_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.body_crc.to_le_bytes());
        b[16..24].copy_from_slice(&self.entry_seq.to_le_bytes());
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and verifies header bytes (not the body).
    pub fn decode(b: &[u8; ENTRY_HEADER_BYTES]) -> Result<Self, HeaderFault> {
        if le_u32(b, 0) != ENTRY_MAGIC {
            return Err(HeaderFault::BadMagic);
        }
        if le_u32(b, 28) != crc32c::crc32c(&b[..28]) {
            return Err(HeaderFault::BadChecksum);
        }
        let version = le_u16(b, 4);
        if version != FORMAT_VERSION {
            return Err(HeaderFault::UnsupportedVersion(version));
        }
        Ok(Self {
            body_len: le_u32(b, 8),
            body_crc: le_u32(b, 12),
            entry_seq: le_u64(b, 16),
        })
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

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Where and why a scan stopped before the end of the file.
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
    /// A well-formed entry with an unexpected entry sequence number.
    EntrySeqMismatch,
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

/// Why a scan step could not produce an entry.
#[derive(Debug)]
pub enum ScanStop {
    /// Bytes at `offset` are not a valid entry; everything before is good.
    Damaged {
        /// Offset of the first bad byte range.
        offset: u64,
        /// What is wrong there.
        damage: Damage,
    },
    /// A header from a newer format, checksummed fine: refuse rather than
    /// truncate data a newer build wrote.
    Unsupported {
        /// Offset of the header.
        offset: u64,
        /// Its version.
        version: u16,
    },
    /// Reading failed.
    Io(io::Error),
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

/// Sequential, verifying reader of one segment file.
pub struct SegmentScanner {
    file: BufferedFile,
    file_len: u64,
    offset: u64,
    next_entry_seq: u64,
    /// The verified segment header.
    pub header: SegmentHeader,
}

impl SegmentScanner {
    /// Opens `path` and verifies its segment header against `id`.
    pub fn open(storage: &dyn Storage, path: &Path, id: SegmentId) -> Result<Self, ScanStop> {
        let file = storage.open(path).map_err(ScanStop::Io)?;
        let mut file = BufferedFile::new(file).map_err(ScanStop::Io)?;
        let file_len = file.len();
        let damaged = |damage| ScanStop::Damaged { offset: 0, damage };
        if file_len < SEGMENT_HEADER_BYTES as u64 {
            return Err(damaged(Damage::TornSegmentHeader));
        }
        let mut raw = [0u8; SEGMENT_HEADER_BYTES];
        file.read_exact_at(&mut raw, 0).map_err(ScanStop::Io)?;
        let header = match SegmentHeader::decode(&raw) {
            Ok(h) if h.id == id => h,
            Ok(_) | Err(HeaderFault::BadMagic | HeaderFault::BadChecksum) => {
                return Err(damaged(Damage::BadSegmentHeader))
            }
            Err(HeaderFault::UnsupportedVersion(version)) => {
                return Err(ScanStop::Unsupported { offset: 0, version })
            }
        };
        Ok(Self {
            file,
            file_len,
            offset: SEGMENT_HEADER_BYTES as u64,
            next_entry_seq: header.first_entry_seq,
            header,
        })
    }

    /// Offset just past the last verified entry.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The entry seq the next entry must carry.
    pub fn next_entry_seq(&self) -> u64 {
        self.next_entry_seq
    }

    /// Length of the file when it was opened.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The next verified entry; `Ok(None)` at a clean end of file.
    pub fn next_entry(&mut self) -> Result<Option<ScannedEntry>, ScanStop> {
        let offset = self.offset;
        let left = self.file_len - offset;
        if left == 0 {
            return Ok(None);
        }
        let damaged = |damage| ScanStop::Damaged { offset, damage };
        if left < ENTRY_HEADER_BYTES as u64 {
            return Err(damaged(Damage::TornEntryHeader));
        }
        let mut raw = [0u8; ENTRY_HEADER_BYTES];
        self.file
            .read_exact_at(&mut raw, offset)
            .map_err(ScanStop::Io)?;
        let header = match EntryHeader::decode(&raw) {
            Ok(h) => h,
            Err(HeaderFault::BadMagic) => return Err(damaged(Damage::BadEntryMagic)),
            Err(HeaderFault::BadChecksum) => return Err(damaged(Damage::BadEntryHeaderChecksum)),
            Err(HeaderFault::UnsupportedVersion(version)) => {
                return Err(ScanStop::Unsupported { offset, version })
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
            .map_err(ScanStop::Io)?;
        if crc32c::crc32c(&body) != header.body_crc {
            return Err(damaged(Damage::BadEntryBodyChecksum));
        }
        if header.entry_seq != self.next_entry_seq {
            return Err(damaged(Damage::EntrySeqMismatch));
        }
        let len = (ENTRY_HEADER_BYTES + body_len) as u64;
        self.offset += len;
        self.next_entry_seq += 1;
        Ok(Some(ScannedEntry {
            offset,
            len,
            header,
            body: Bytes::from(body),
        }))
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
            first_entry_seq: 100,
            seq_floor: 5,
            queue_floor: 6,
        };
        let raw = h.encode();
        assert_eq!(SegmentHeader::decode(&raw), Ok(h));
        for i in 0..SEGMENT_HEADER_BYTES {
            let mut bad = raw;
            bad[i] ^= 0x10;
            assert!(SegmentHeader::decode(&bad).is_err(), "byte {i}");
        }
        let e = EntryHeader::for_body(b"hello", 9);
        let raw = e.encode();
        assert_eq!(EntryHeader::decode(&raw), Ok(e));
        for i in 0..ENTRY_HEADER_BYTES {
            let mut bad = raw;
            bad[i] ^= 0x01;
            assert!(EntryHeader::decode(&bad).is_err(), "byte {i}");
        }
        assert_eq!(
            EntryHeader::decode(&[0u8; ENTRY_HEADER_BYTES]),
            Err(HeaderFault::BadMagic)
        );
    }
}
