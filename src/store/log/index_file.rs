//! A sealed segment's sparse index, kept in a file next to it, so that
//! opening a log reads each old segment's index instead of the whole
//! segment.
//!
//! ```text
//! index_file = magic "RLIX" u32 | version u16 | reserved u16 | base_offset u64
//!              | salt u32 | reserved u32 | file_size u64 | len u64 | next u64
//!              | last_ts u64 (u64::MAX: none) | records u64
//!              | entries u32 | holes u32                           (72 bytes)
//!              | entries x (offset u64 | timestamp_ms u64 | pos u64)
//!              | holes x (from u64 | to u64)
//!              | crc u32 (CRC32C of everything before)
//! ```
//!
//! It is a summary of what a scan of the segment found (see `recovery`):
//! written when the writer seals the segment (a rollover) or when
//! recovery scanned one, named `NNNNNNNNNNNNNNNNNNNN.idx` after its
//! segment. It is never synced: it can always be made again from the
//! segment, so a file that is missing, torn, damaged, of another version,
//! or that does not match its segment (base offset, salt, size) is
//! ignored and the segment scanned as before. Only sealed segments have
//! one that is used: the newest segment is always scanned (its tail may
//! be torn).

use std::path::{Path, PathBuf};

use super::format::SEGMENT_SUFFIX;
use super::IndexEntry;
use crate::segment::{le_u32, le_u64};
use crate::storage::{read_up_to, Storage};
use crate::wire::{put_u16, put_u32, put_u64};

/// File name suffix of a segment's index.
pub(crate) const INDEX_SUFFIX: &str = ".idx";
const INDEX_MAGIC: u32 = u32::from_le_bytes(*b"RLIX");
const INDEX_VERSION: u16 = 1;
const HEADER_BYTES: usize = 72;
const ENTRY_BYTES: usize = 24;
const HOLE_BYTES: usize = 16;
/// Most bytes an index file is read for: far more than any segment's
/// index needs (an entry per 4 KiB of the segment), so a huge file is
/// not read whole just to be refused.
fn bytes_max(segment_size: u64) -> u64 {
    segment_size / 64 + 64 * 1024
}

/// What a scan found in a sealed segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentIndex {
    pub(crate) base: u64,
    pub(crate) salt: u32,
    /// The segment file's size when indexed: a file of another size is
    /// not this one.
    pub(crate) file_size: u64,
    /// Readable bytes (the end of the last valid record).
    pub(crate) len: u64,
    /// One past the last record's offset.
    pub(crate) next: u64,
    pub(crate) last_ts: Option<u64>,
    /// Valid records in it.
    pub(crate) records: u64,
    pub(crate) entries: Vec<IndexEntry>,
    /// Damaged byte ranges the scan stepped over.
    pub(crate) holes: Vec<(u64, u64)>,
}

/// The index file of the segment at `segment`.
pub(crate) fn index_path(segment: &Path) -> PathBuf {
    let name = segment
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(SEGMENT_SUFFIX))
        .unwrap_or_default();
    segment.with_file_name(format!("{name}{INDEX_SUFFIX}"))
}

impl SegmentIndex {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            HEADER_BYTES + self.entries.len() * ENTRY_BYTES + self.holes.len() * HOLE_BYTES + 4,
        );
        put_u32(&mut b, INDEX_MAGIC);
        put_u16(&mut b, INDEX_VERSION);
        put_u16(&mut b, 0);
        put_u64(&mut b, self.base);
        put_u32(&mut b, self.salt);
        put_u32(&mut b, 0);
        put_u64(&mut b, self.file_size);
        put_u64(&mut b, self.len);
        put_u64(&mut b, self.next);
        put_u64(&mut b, self.last_ts.unwrap_or(u64::MAX));
        put_u64(&mut b, self.records);
        put_u32(
            &mut b,
            u32::try_from(self.entries.len()).unwrap_or(u32::MAX),
        );
        put_u32(&mut b, u32::try_from(self.holes.len()).unwrap_or(u32::MAX));
        assert_eq!(b.len(), HEADER_BYTES, "index header layout");
        for e in &self.entries {
            put_u64(&mut b, e.offset);
            put_u64(&mut b, e.timestamp_ms);
            put_u64(&mut b, e.pos);
        }
        for &(from, to) in &self.holes {
            put_u64(&mut b, from);
            put_u64(&mut b, to);
        }
        let crc = crc32c::crc32c(&b);
        put_u32(&mut b, crc);
        b
    }

    /// The index in `b`, if it is a whole, valid one of this version.
    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < HEADER_BYTES + 4 || le_u32(b, 0) != INDEX_MAGIC {
            return None;
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != le_u32(crc, 0) {
            return None;
        }
        if u16::from_le_bytes([b[4], b[5]]) != INDEX_VERSION {
            return None;
        }
        let entries = le_u32(b, 64) as usize;
        let holes = le_u32(b, 68) as usize;
        let want = entries
            .checked_mul(ENTRY_BYTES)?
            .checked_add(holes.checked_mul(HOLE_BYTES)?)?
            .checked_add(HEADER_BYTES)?;
        if body.len() != want {
            return None;
        }
        let last_ts = le_u64(b, 48);
        let mut at = HEADER_BYTES;
        let mut list = Vec::with_capacity(entries);
        for _ in 0..entries {
            list.push(IndexEntry {
                offset: le_u64(b, at),
                timestamp_ms: le_u64(b, at + 8),
                pos: le_u64(b, at + 16),
            });
            at += ENTRY_BYTES;
        }
        let mut gaps = Vec::with_capacity(holes);
        for _ in 0..holes {
            gaps.push((le_u64(b, at), le_u64(b, at + 8)));
            at += HOLE_BYTES;
        }
        Some(Self {
            base: le_u64(b, 8),
            salt: le_u32(b, 16),
            file_size: le_u64(b, 24),
            len: le_u64(b, 32),
            next: le_u64(b, 40),
            last_ts: (last_ts != u64::MAX).then_some(last_ts),
            records: le_u64(b, 56),
            entries: list,
            holes: gaps,
        })
    }

    /// Whether it can stand for the segment `base` with header `salt`
    /// whose file is `file_size` bytes: the same segment, as indexed, and
    /// a summary that makes sense.
    fn fits(&self, base: u64, salt: u32, file_size: u64) -> bool {
        self.base == base
            && self.salt == salt
            && self.file_size == file_size
            && self.len <= file_size
            && self.next >= base
            && self
                .entries
                .iter()
                .all(|e| e.pos < self.len && e.offset >= base)
            && self.entries.windows(2).all(|w| w[0].offset < w[1].offset)
    }
}

/// The index of the segment at `segment` (base `base`, salt `salt`,
/// `file_size` bytes), if its file is there and fits; `None` means scan.
pub(crate) fn load(
    storage: &dyn Storage,
    segment: &Path,
    base: u64,
    salt: u32,
    file_size: u64,
) -> Option<SegmentIndex> {
    let path = index_path(segment);
    let file = storage.open(&path).ok()?;
    let size = file.size().ok()?;
    if size > bytes_max(file_size) {
        return None;
    }
    let bytes = read_up_to(&*file, 0, usize::try_from(size).ok()?).ok()?;
    SegmentIndex::decode(&bytes).filter(|i| i.fits(base, salt, file_size))
}

/// Writes the index of the segment at `segment` (replacing any). Not
/// synced: a lost or torn one is made again from the segment.
pub(crate) fn store(
    storage: &dyn Storage,
    segment: &Path,
    index: &SegmentIndex,
) -> std::io::Result<()> {
    let file = storage.create(&index_path(segment), true)?;
    file.write_at(&index.encode(), 0)
}

/// Removes the index of the segment at `segment`, if it has one.
pub(crate) fn remove(storage: &dyn Storage, segment: &Path) -> std::io::Result<()> {
    match storage.remove(&index_path(segment)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SegmentIndex {
        SegmentIndex {
            base: 100,
            salt: 7,
            file_size: 9000,
            len: 8000,
            next: 140,
            last_ts: Some(55),
            records: 39,
            entries: vec![
                IndexEntry {
                    offset: 100,
                    timestamp_ms: 50,
                    pos: 32,
                },
                IndexEntry {
                    offset: 120,
                    timestamp_ms: 53,
                    pos: 4200,
                },
            ],
            holes: vec![(6000, 6100), (8000, 9000)],
        }
    }

    #[test]
    fn an_index_round_trips_and_any_damage_or_mismatch_refuses_it() {
        let i = sample();
        let b = i.encode();
        assert_eq!(SegmentIndex::decode(&b), Some(i.clone()));
        assert!(i.fits(100, 7, 9000));
        assert!(!i.fits(100, 8, 9000), "another segment's salt");
        assert!(!i.fits(100, 7, 9001), "the segment changed size");
        assert!(!i.fits(101, 7, 9000));
        for at in 0..b.len() {
            let mut c = b.clone();
            c[at] ^= 0x04;
            assert_eq!(SegmentIndex::decode(&c), None, "byte {at}");
        }
        for cut in 0..b.len() {
            assert_eq!(SegmentIndex::decode(&b[..cut]), None, "cut at {cut}");
        }
        let none = SegmentIndex {
            last_ts: None,
            ..sample()
        };
        assert_eq!(SegmentIndex::decode(&none.encode()), Some(none));
    }

    #[test]
    fn the_index_file_is_named_after_its_segment() {
        assert_eq!(
            index_path(Path::new("/d/00000000000000000042.log")),
            Path::new("/d/00000000000000000042.idx")
        );
    }
}
