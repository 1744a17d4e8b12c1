//! Recovery: replay every segment in order, verify every entry, cut a
//! damaged tail, rebuild the live state.
//!
//! Segments are read oldest first. Each entry is verified (magic, header
//! checksum, length, body checksum, entry sequence) before its records are
//! replayed through the [`Index`], the same code the writer uses, so a
//! recovered store and a running one agree on every rule.
//!
//! # Recovery cases
//!
//! | what is found                                           | detected by                               | what is done |
//! |---------------------------------------------------------|-------------------------------------------|--------------|
//! | clean end of file at an entry boundary                  | offset == file length                     | next segment |
//! | file shorter than the 48-byte segment header            | length check                              | segment dropped: bytes saved to `<seg>.0.dropped`, file removed, `warn!`, reported |
//! | segment header with bad magic / checksum / id           | magic, CRC32C, id vs. file name           | same as above |
//! | fewer than 32 bytes left for an entry header (torn)     | length check                              | file truncated at the entry, dropped bytes saved to `<seg>.<offset>.dropped`, `warn!`, reported; entries before it kept |
//! | entry header with bad magic (zeros, garbage)            | magic                                     | truncated there, as above |
//! | entry header checksum mismatch (torn or flipped bits)   | CRC32C of the header                      | truncated there, as above |
//! | body length above `ENTRY_BODY_MAX_BYTES`                | length check (after the header CRC)       | truncated there, as above |
//! | file ends inside the body (torn write)                  | body length vs. bytes left                | truncated there, as above |
//! | body checksum mismatch (torn or flipped bits)           | CRC32C of the body                        | truncated there, as above |
//! | valid entry with an unexpected entry sequence (stale)   | `entry_seq` continuity inside the segment | truncated there, as above |
//! | segment or entry header with a newer format version     | version field (checksum valid)            | `open` fails with [`StoreError::Unsupported`]: never truncate data a newer build wrote |
//! | checksummed body that does not decode, unknown record kind or version | record decoder            | `open` fails with [`StoreError::Corrupt`] / [`StoreError::Unsupported`] (a bug or a newer build, not a torn write) |
//! | segments whose first entry sequence goes backwards      | segment header vs. previous segment       | `open` fails with [`StoreError::Corrupt`] (files mixed up by hand) |
//! | I/O error while reading                                 | `read`                                    | `open` fails with [`StoreError::Io`] |
//! | a live message's entry damaged or unreadable when it is read back after replay (see `reader`) | checksums again, expected seq | that item of [`super::RecoveredMessages`] is [`StoreError::Corrupt`] / [`StoreError::Io`]; the others are read; the core logs it and the message stays in the journal |
//!
//! A crash can only tear the newest segment: the writer syncs a segment
//! before it creates the next one, so damage in an older segment means the
//! medium lost synced data. Recovery handles it the same way (truncate, keep
//! what is before, go on with the next segments), logs it at `error!`
//! instead of `warn!`, and reports it; the records after the damage in that
//! segment are lost.
//!
//! The dropped bytes are kept in side files (never read back) so an
//! operator can inspect them; they may be deleted at will.
//!
//! Recovery never appends to an old segment: the store then starts a new
//! one, so a truncated file is never written to again.

use std::path::{Path, PathBuf};
use std::time::Instant;

use tracing::{error, info, warn};

use super::index::{Index, Loc};
use super::reader::PendingMessage;
use super::record::{self};
use super::segment::{self, Damage, ScanStop, SegmentId, SegmentScanner};
use super::storage::Storage;
use super::{io_error, DamagedTail, RecoveredPlacement, RecoveryReport, StoreError};

/// The outcome of replaying the data directory.
pub(crate) struct Replayed {
    pub(crate) index: Index,
    pub(crate) report: RecoveryReport,
    pub(crate) last_segment: Option<SegmentId>,
    pub(crate) next_entry_seq: u64,
}

/// Lists the segment ids in `dir`, sorted.
pub(crate) fn list_segments(
    storage: &dyn Storage,
    dir: &Path,
) -> Result<Vec<SegmentId>, StoreError> {
    let names = storage.list(dir).map_err(|e| io_error("list", dir, e))?;
    let mut ids: Vec<SegmentId> = names
        .iter()
        .filter_map(|n| segment::parse_file_name(n))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Replays every segment in `dir`.
pub(crate) fn replay(storage: &dyn Storage, dir: &Path) -> Result<Replayed, StoreError> {
    let started = Instant::now();
    let ids = list_segments(storage, dir)?;
    let mut index = Index::new();
    let mut report = RecoveryReport::default();
    let mut next_entry_seq = 0u64;
    let mut seq_floor = 0u64;
    let mut queue_floor = 0u64;
    let mut removed_any = false;
    let newest = ids.last().copied();

    for &id in &ids {
        let path = dir.join(segment::file_name(id));
        let newest_segment = Some(id) == newest;
        let mut scanner = match SegmentScanner::open(storage, &path, id) {
            Ok(s) => s,
            Err(ScanStop::Damaged { offset, damage }) => {
                let tail = drop_tail(storage, &path, offset, damage, newest_segment, true)?;
                report.damaged.push(tail);
                removed_any = true;
                continue;
            }
            Err(ScanStop::Unsupported { offset, version }) => {
                return Err(StoreError::Unsupported {
                    path,
                    offset,
                    what: format!("segment format version {version}"),
                })
            }
            Err(ScanStop::Io(e)) => return Err(io_error("read", &path, e)),
        };
        let header = scanner.header;
        if header.first_entry_seq < next_entry_seq {
            return Err(StoreError::Corrupt {
                path,
                offset: 0,
                reason: format!(
                    "first entry sequence {} is below {} where the previous segment ended",
                    header.first_entry_seq, next_entry_seq
                ),
            });
        }
        seq_floor = seq_floor.max(header.seq_floor);
        queue_floor = queue_floor.max(header.queue_floor);
        index.add_segment(id, scanner.file_len());
        report.segments_read += 1;
        loop {
            match scanner.next_entry() {
                Ok(Some(entry)) => {
                    let records = record::decode_body(entry.body).map_err(|e| {
                        let offset = entry.offset;
                        match e {
                            super::wire::DecodeError::UnsupportedVersion { .. }
                            | super::wire::DecodeError::BadTag { what: "record", .. } => {
                                StoreError::Unsupported {
                                    path: path.clone(),
                                    offset,
                                    what: e.to_string(),
                                }
                            }
                            _ => StoreError::Corrupt {
                                path: path.clone(),
                                offset,
                                reason: format!("checksummed entry does not decode: {e}"),
                            },
                        }
                    })?;
                    for (i, (rec, size)) in records.iter().enumerate() {
                        let loc = Loc {
                            seg: id,
                            entry: entry.offset,
                            idx: u32::try_from(i).unwrap_or(u32::MAX),
                        };
                        index.apply(rec, loc, *size, true);
                    }
                    report.entries_replayed += 1;
                    report.records_replayed += records.len() as u64;
                    report.bytes_replayed += entry.len;
                }
                Ok(None) => break,
                Err(ScanStop::Damaged { offset, damage }) => {
                    let tail = drop_tail(storage, &path, offset, damage, newest_segment, false)?;
                    index.set_file_bytes(id, offset);
                    report.damaged.push(tail);
                    break;
                }
                Err(ScanStop::Unsupported { offset, version }) => {
                    return Err(StoreError::Unsupported {
                        path,
                        offset,
                        what: format!("entry format version {version}"),
                    })
                }
                Err(ScanStop::Io(e)) => return Err(io_error("read", &path, e)),
            }
        }
        next_entry_seq = scanner.next_entry_seq();
        if newest_segment {
            make_durable(storage, &path, scanner.offset())?;
        }
    }
    if removed_any {
        storage
            .sync_dir(dir)
            .map_err(|e| io_error("fsync", dir, e))?;
    }
    index.next_seq = index.next_seq.max(seq_floor);
    index.next_queue_id = index.next_queue_id.max(queue_floor);
    report.truncated_bytes = report.damaged.iter().map(|d| d.dropped_bytes).sum();
    report.duration = started.elapsed();
    info!(
        segments = report.segments_read,
        entries = report.entries_replayed,
        records = report.records_replayed,
        bytes = report.bytes_replayed,
        damaged = report.damaged.len(),
        ms = report.duration.as_millis() as u64,
        "journal replayed"
    );
    let last_segment = ids
        .iter()
        .rev()
        .copied()
        .find(|id| index.segment(*id).is_some());
    Ok(Replayed {
        index,
        report,
        last_segment,
        next_entry_seq,
    })
}

/// Makes the replayed part of the newest segment durable before anything
/// is built on it, by writing it again and syncing it.
///
/// Only the newest segment can hold bytes that were never synced: every
/// older one was synced before the next was created. Recovery reads them
/// from the page cache, which after a kill -9 under the periodic policy
/// holds writes not yet synced, and after a failed `fdatasync` holds
/// writes the kernel has marked clean and will never write (a later sync
/// is a no-op for them). Replaying such entries and then compacting on
/// their strength (deleting the segments their acknowledgements made dead)
/// would let a later power loss take the entries but not the deletions:
/// half of an atomic unit. Writing the bytes again dirties the pages, so
/// the sync that follows puts what was replayed on the disk. It costs one
/// write of at most a segment per start.
fn make_durable(storage: &dyn Storage, path: &Path, end: u64) -> Result<(), StoreError> {
    let header = segment::SEGMENT_HEADER_BYTES as u64;
    if end <= header {
        return Ok(());
    }
    let file = storage.open(path).map_err(|e| io_error("open", path, e))?;
    let mut at = header;
    while at < end {
        let n = usize::try_from(end - at)
            .unwrap_or(usize::MAX)
            .min(REWRITE_CHUNK_BYTES);
        let mut chunk = vec![0u8; n];
        file.read_at(&mut chunk, at)
            .map_err(|e| io_error("read", path, e))?;
        file.write_at(&chunk, at)
            .map_err(|e| io_error("write", path, e))?;
        at += n as u64;
    }
    file.sync_data().map_err(|e| io_error("fdatasync", path, e))
}

/// Bytes rewritten at once by [`make_durable`].
const REWRITE_CHUNK_BYTES: usize = 1024 * 1024;

/// Saves the bytes of `path` from `offset` on into a side file, then
/// truncates the segment there (or removes it when its header is bad).
fn drop_tail(
    storage: &dyn Storage,
    path: &Path,
    offset: u64,
    damage: Damage,
    newest_segment: bool,
    remove: bool,
) -> Result<DamagedTail, StoreError> {
    let side = side_path(path, offset);
    let dropped = segment::save_range(storage, path, offset, None, &side)
        .map_err(|e| io_error("save", &side, e))?;
    if remove {
        storage
            .remove(path)
            .map_err(|e| io_error("remove", path, e))?;
    } else {
        segment::truncate(storage, path, offset).map_err(|e| io_error("truncate", path, e))?;
    }
    let path_s = path.display().to_string();
    let side_s = side.display().to_string();
    if newest_segment {
        warn!(path = %path_s, offset, dropped, ?damage, saved_to = %side_s, removed = remove,
            "journal: torn or corrupt tail cut (crash during a write)");
    } else {
        error!(path = %path_s, offset, dropped, ?damage, saved_to = %side_s, removed = remove,
            "journal: damage inside an older segment cut (synced data was lost by the medium)");
    }
    Ok(DamagedTail {
        path: path.to_path_buf(),
        offset,
        dropped_bytes: dropped,
        damage,
        saved_to: side,
        segment_removed: remove,
    })
}

fn side_path(path: &Path, offset: u64) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{offset}.dropped"));
    path.with_file_name(name)
}

/// Moves the live state out of a freshly replayed index. Messages come out
/// as locations to read back (see `reader`), not bodies.
pub(crate) fn collect(index: &mut Index) -> super::RecoveredState {
    let queues = index.queues().cloned().collect();
    let bindings = index.bindings().cloned().collect();
    let messages = index
        .messages()
        .map(|(seq, m)| {
            let placements = m
                .placements
                .iter()
                .map(|(q, p)| RecoveredPlacement {
                    queue: *q,
                    delivery_count: p.delivery_count(),
                    annotation: p.annotation().cloned(),
                })
                .collect();
            PendingMessage::new(seq, m.loc(), placements)
        })
        .collect();
    let retained = index
        .retained()
        .filter_map(|(topic, r)| Some((topic.to_owned(), r.seq, r.message.clone()?)))
        .collect();
    let state = index
        .state()
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect();
    index.drop_messages();
    super::RecoveredState {
        queues,
        bindings,
        messages,
        retained,
        state,
    }
}
