//! The manifest: which segments the journal is made of, so that recovery
//! can tell a segment compaction deleted from one the disk lost.
//!
//! Segment ids are consecutive when segments are created, and compaction
//! deletes segments from anywhere, so a gap in the ids by itself says
//! nothing. The manifest lists every segment that should exist: for a
//! sealed segment its final length and entry-sequence range, for the
//! active one its first entry sequence. The writer rewrites it (synced)
//! after creating a segment and before deleting any, so at every moment
//! the files on disk are the manifest's list, plus at most a newer segment
//! created after it was written, plus at most retired segments whose
//! deletion was not yet done.
//!
//! # Format
//!
//! ```text
//! manifest = magic "RMAN" u32 | version u16 | reserved u16 | generation u64
//!            | salt u32 | count u32 | segment*count | crc u32
//! segment  = id u64 | format u16 | reserved u16 | reserved u32 | first_entry_seq u64
//!            | end_entry_seq u64 | len u64 | seq_floor u64 | queue_floor u64   (56 bytes)
//! ```
//!
//! `end_entry_seq` and `len` are [`OPEN_SEGMENT`] for the active segment.
//! The CRC32C covers everything before it. Two copies, `MANIFEST.0` and
//! `MANIFEST.1`, are written alternately (generation parity), each in
//! place and synced: a write torn by a crash leaves the other copy, one
//! generation older, intact; recovery takes the valid copy with the
//! highest generation. The older generation is still right about every
//! file that exists: a torn write happens before the creation or deletion
//! it announces completes.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use super::segment::SegmentId;
use super::storage::{self, Storage};

/// File names of the two copies.
pub(crate) const MANIFEST_FILES: [&str; 2] = ["MANIFEST.0", "MANIFEST.1"];
/// Manifest magic ("RMAN" little-endian).
const MAGIC: u32 = u32::from_le_bytes(*b"RMAN");
/// Manifest format version.
const VERSION: u16 = 1;
const HEADER_BYTES: usize = 24;
const SEGMENT_BYTES: usize = 56;
/// Most segments a manifest lists: a bound on what a reader allocates
/// (64 Ki segments of 64 MiB are 4 TiB of journal; 3.5 MiB of manifest).
pub(crate) const MANIFEST_SEGMENTS_MAX: usize = 64 * 1024;
/// `end_entry_seq` / `len` of the active segment: not known yet.
pub(crate) const OPEN_SEGMENT: u64 = u64::MAX;

/// What the manifest knows of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentFacts {
    /// Segment and entry header format version of the segment.
    pub(crate) format: u16,
    /// Entry seq of its first entry.
    pub(crate) first_entry_seq: u64,
    /// One past its last entry seq; [`OPEN_SEGMENT`] while active.
    pub(crate) end_entry_seq: u64,
    /// Its final length; [`OPEN_SEGMENT`] while active.
    pub(crate) len: u64,
    /// Next message seq when it was created.
    pub(crate) seq_floor: u64,
    /// Next queue id when it was created.
    pub(crate) queue_floor: u64,
}

impl SegmentFacts {
    /// True once the segment was sealed (a newer one exists).
    pub(crate) fn sealed(&self) -> bool {
        self.len != OPEN_SEGMENT
    }
}

/// One manifest copy's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub(crate) generation: u64,
    /// The journal's salt (see `segment`).
    pub(crate) salt: u32,
    pub(crate) segments: BTreeMap<SegmentId, SegmentFacts>,
}

impl Manifest {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_BYTES + SEGMENT_BYTES * self.segments.len() + 4);
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.salt.to_le_bytes());
        let count = u32::try_from(self.segments.len()).unwrap_or(u32::MAX);
        b.extend_from_slice(&count.to_le_bytes());
        for (id, f) in &self.segments {
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(&f.format.to_le_bytes());
            b.extend_from_slice(&0u16.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&f.first_entry_seq.to_le_bytes());
            b.extend_from_slice(&f.end_entry_seq.to_le_bytes());
            b.extend_from_slice(&f.len.to_le_bytes());
            b.extend_from_slice(&f.seq_floor.to_le_bytes());
            b.extend_from_slice(&f.queue_floor.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and verifies one copy; `None` if it is not a valid manifest.
    pub(crate) fn decode(b: &[u8]) -> Option<Manifest> {
        if b.len() < HEADER_BYTES + 4 {
            return None;
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
            return None;
        }
        let u16_at = |at: usize| -> Option<u16> {
            Some(u16::from_le_bytes(body.get(at..at + 2)?.try_into().ok()?))
        };
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(body.get(at..at + 4)?.try_into().ok()?))
        };
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?))
        };
        if u32_at(0)? != MAGIC || u16_at(4)? != VERSION {
            return None;
        }
        let generation = u64_at(8)?;
        let salt = u32_at(16)?;
        let count = usize::try_from(u32_at(20)?).ok()?;
        if count > MANIFEST_SEGMENTS_MAX || body.len() != HEADER_BYTES + count * SEGMENT_BYTES {
            return None;
        }
        let mut segments = BTreeMap::new();
        for i in 0..count {
            let at = HEADER_BYTES + i * SEGMENT_BYTES;
            segments.insert(
                u64_at(at)?,
                SegmentFacts {
                    format: u16_at(at + 8)?,
                    first_entry_seq: u64_at(at + 16)?,
                    end_entry_seq: u64_at(at + 24)?,
                    len: u64_at(at + 32)?,
                    seq_floor: u64_at(at + 40)?,
                    queue_floor: u64_at(at + 48)?,
                },
            );
        }
        Some(Manifest {
            generation,
            salt,
            segments,
        })
    }
}

/// What recovery found of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestState {
    /// No manifest and no segment written by a build that keeps one (a
    /// new journal, or one written before manifests): nothing to check
    /// completeness against, and nothing is missing by this account.
    Absent,
    /// A valid copy of this generation was used.
    Read {
        /// Its generation.
        generation: u64,
        /// The other copy was torn or damaged.
        other_copy_bad: bool,
    },
    /// Segments of a build that keeps a manifest exist, but no copy is
    /// readable: completeness cannot be checked.
    Lost,
}

/// Reads both copies and returns the valid one with the highest
/// generation, and whether the other copy was present but bad.
pub(crate) fn read(storage: &dyn Storage, dir: &Path) -> io::Result<(Option<Manifest>, bool)> {
    let names = storage.list(dir)?;
    let mut best: Option<Manifest> = None;
    let mut bad = false;
    for name in MANIFEST_FILES {
        if !names.iter().any(|n| n == name) {
            continue;
        }
        let path = dir.join(name);
        let file = storage.open(&path)?;
        let len = usize::try_from(file.size()?).unwrap_or(usize::MAX);
        let max = HEADER_BYTES + 4 + MANIFEST_SEGMENTS_MAX * SEGMENT_BYTES;
        let bytes = storage::read_up_to(&*file, 0, len.min(max))?;
        match Manifest::decode(&bytes) {
            Some(m) if best.as_ref().is_none_or(|b| m.generation > b.generation) => {
                best = Some(m);
            }
            Some(_) => {}
            None => bad = true,
        }
    }
    Ok((best, bad))
}

/// Writes `m` over the copy its generation picks, in place, and syncs it
/// (and the directory, when the copy is new).
pub(crate) fn write(storage: &dyn Storage, dir: &Path, m: &Manifest) -> io::Result<PathBuf> {
    let name = MANIFEST_FILES[(m.generation % 2) as usize];
    let path = dir.join(name);
    let bytes = m.encode();
    let (file, created) = match storage.open(&path) {
        Ok(f) => (f, false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => (storage.create(&path, true)?, true),
        Err(e) => return Err(e),
    };
    file.write_at(&bytes, 0)?;
    file.set_len(bytes.len() as u64)?;
    file.sync_data()?;
    if created {
        storage.sync_dir(dir)?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let mut segments = BTreeMap::new();
        segments.insert(
            3,
            SegmentFacts {
                format: 2,
                first_entry_seq: 10,
                end_entry_seq: 20,
                len: 4096,
                seq_floor: 5,
                queue_floor: 2,
            },
        );
        segments.insert(
            4,
            SegmentFacts {
                format: 2,
                first_entry_seq: 20,
                end_entry_seq: OPEN_SEGMENT,
                len: OPEN_SEGMENT,
                seq_floor: 9,
                queue_floor: 2,
            },
        );
        Manifest {
            generation: 7,
            salt: 0xDEAD_BEEF,
            segments,
        }
    }

    #[test]
    fn round_trips_and_rejects_every_flipped_byte_and_cut() {
        let m = sample();
        let b = m.encode();
        assert_eq!(Manifest::decode(&b), Some(m));
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x20;
            assert_eq!(Manifest::decode(&bad), None, "byte {i}");
        }
        for cut in 0..b.len() {
            assert_eq!(Manifest::decode(&b[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn the_newest_valid_copy_wins_and_a_torn_one_is_noticed() {
        let disk = crate::sim::SimDisk::new(1);
        let dir = Path::new("/sim/m");
        assert!(disk.create_dir_all(dir).is_ok());
        let mut m = sample();
        for generation in [7, 8] {
            m.generation = generation;
            assert!(write(&disk, dir, &m).is_ok());
        }
        let (got, bad) = read(&disk, dir).unwrap_or((None, true));
        assert_eq!(got.map(|g| g.generation), Some(8));
        assert!(!bad);
        // Tear the newer copy (generation 8 is MANIFEST.0).
        assert!(disk.truncate_durably(&dir.join("MANIFEST.0"), 30).is_ok());
        let (got, bad) = read(&disk, dir).unwrap_or((None, false));
        assert_eq!(got.map(|g| g.generation), Some(7));
        assert!(bad);
    }
}
