//! Recovery: replay every segment in order, verify every entry, skip what
//! is damaged and keep everything else, notice what is missing, rebuild
//! the live state, and say exactly what was lost.
//!
//! Recovery runs in two passes. The first ([`scan`]) only reads: it lists
//! the segments and the manifest, replays every valid entry through the
//! [`Index`] (the same code the writer uses, so a recovered store and a
//! running one agree on every rule), and collects what it found wrong and
//! what to do about it. If whole segments or the ends of sealed ones are
//! missing it stops there with [`StoreError::Incomplete`], having changed
//! nothing, unless the loss is accepted ([`StoreConfig::accept_data_loss`],
//! `[store] accept_data_loss`). The second pass ([`apply`]) cuts torn
//! tails, saves damaged ranges to side files, removes leftovers, and makes
//! the replayed newest segment durable. `rosetta store check` runs the
//! first pass alone.
//!
//! # Re-synchronising
//!
//! Where an entry fails its checks, the scanner searches the bytes after
//! it for the next entry magic with a valid header checksum (salted, so a
//! message payload cannot pose as an entry: see `segment`), a valid body
//! checksum, and an entry seq that can follow the last good one, and goes
//! on from there. Only the damaged entries are lost; the entry seqs around
//! the damage say how many. When the header of a damaged entry is intact
//! (only the body checksum failed), the next entry is looked for right
//! after it first, and its body is decoded for the report (unverified:
//! "probably held message 57 for queue orders"). A damaged range in the
//! newest segment that nothing valid follows is a *torn tail* (a crash
//! during a write): the file is cut there. Any other damaged range is
//! left in place (recovery never writes into an older segment), copied to
//! a side file, and the segment is rewritten by the next compaction run
//! (which copies its live records forward) so the damage stops being
//! reported.
//!
//! # Recovery cases
//!
//! | what is found | detected by | what is done |
//! |---|---|---|
//! | clean end of file at an entry boundary | offset == file length | next segment |
//! | newest segment shorter than its 48-byte header (crash right after creating it) | length check | file removed (bytes saved to `<seg>.0.dropped`), `warn!`, reported |
//! | segment header with bad magic / checksum / id / salt | magic, CRC32C, id vs. file name, salt vs. the journal's | header re-derived (id from the name; format, salt, first entry seq and floors from the manifest, the other segments or the first valid entry); every entry kept; `error!`, reported |
//! | fewer than 32 bytes left for an entry header at the end of the newest segment (torn) | length check | file cut there (bytes saved to `<seg>.<offset>.dropped`), `warn!`, reported; entries before kept |
//! | zeros or garbage at the end of the newest segment, nothing valid after | magic / checksums, no valid entry found after | cut there, as above |
//! | entry header with bad magic or checksum, body length over `ENTRY_BODY_MAX_BYTES`, or the file ending inside the body, at the end of the newest segment | header CRC32C, length checks | cut there, as above |
//! | body checksum mismatch | CRC32C of the body | that entry skipped (the next one is found right after it); its body decoded for the report; `error!`; cut instead if it is the torn tail of the newest segment |
//! | damaged entries with valid entries after them, in any segment | re-synchronisation finds the next valid entry | the damaged range skipped and left in place, saved to a side file; the lost entry seqs `[a, b)` and probable queues reported; `error!` (`warn!` in the newest segment: a torn write there can look the same); the segment is rewritten by the next compaction |
//! | damage at the end of a sealed segment, nothing valid after | as above, in a segment that is not the newest | skipped, not cut (the medium lost synced data); lost seqs up to the manifest's end or the next segment's first seq; `error!` |
//! | valid entry with an older entry sequence than expected (stale copy) | `entry_seq` continuity | skipped like damage |
//! | valid entries whose sequence jumps (entries between them missing) | `entry_seq` continuity | the gap reported as lost entries; scanning goes on |
//! | a segment the manifest lists is not there | manifest vs. directory | `open` fails with [`StoreError::Incomplete`] naming the segment, its entry seqs and size; with the loss accepted: started, `error!`, reported, the manifest rewritten |
//! | a sealed segment shorter than the manifest recorded, or ending before the next segment's first entry seq | manifest length, entry seq chain between consecutive segments | same as above (truncated older segment) |
//! | segments of this format exist but neither manifest copy is valid | both copies missing or failing their CRC32C | same as above: completeness cannot be checked |
//! | one manifest copy torn or damaged | its CRC32C | the other copy (one generation older, still right about every file) is used; reported |
//! | a segment not in the manifest, older than its newest entry (deleted by compaction, the removal not yet durable at a crash) | manifest vs. directory | removed without replaying it (it held nothing live); reported |
//! | a segment newer than the manifest (created just before a crash, before the manifest was rewritten) | manifest vs. directory | replayed like any other |
//! | segments of the old format and no manifest (a journal written before manifests) | no manifest, version 1 headers | replayed; the manifest is written from what was found |
//! | segment or entry header with a newer format version | version field (checksum valid) | `open` fails with [`StoreError::Unsupported`]: never skip data a newer build wrote |
//! | checksummed body that does not decode, unknown record kind or version | record decoder | `open` fails with [`StoreError::Corrupt`] / [`StoreError::Unsupported`] (a bug or a newer build, not a torn write) |
//! | a message body (opaque here) that the core's codec cannot decode, checksum valid | the core, at restore or when reading a paged message back | that message is logged and left in the journal, not queued; the others are restored |
//! | segments whose first entry sequence goes backwards | segment header vs. previous segment | `open` fails with [`StoreError::Corrupt`] (files mixed up by hand) |
//! | I/O error while reading | `read` | `open` fails with [`StoreError::Io`] |
//! | entries of the newest segment read back from the page cache after a failed `fdatasync` (or a kill -9 under the periodic policy) | cannot be told apart: always done | the replayed part of the newest segment is written again and synced before anything is built on it (see [`make_durable`]) |
//! | a manifest read back from the page cache after its sync failed | cannot be told apart: always done | the copy used is written again and synced before any segment is removed on its word |
//! | a live message's entry damaged or unreadable when it is read back after replay (see `reader`) | checksums again, expected seq | that item of [`super::RecoveredMessages`] is [`StoreError::Corrupt`] / [`StoreError::Io`]; the others are read; the core logs it and the message stays in the journal |
//!
//! # What the report says was lost
//!
//! [`RecoveryReport::lost`] adds up the entries lost (from the entry seqs
//! around each damaged range and of each missing segment), their byte
//! ranges, and the queues that lost messages as far as can be known: from
//! the decoded bodies of damaged entries whose header was intact, and
//! from surviving delivery states of messages whose record is gone (with
//! no later acknowledgement). An entry is one append: one message, or a
//! transaction, or a consumer's acknowledgements. A lost acknowledgement
//! means a message is delivered again; a lost message is gone.
//!
//! The dropped and skipped bytes are kept in side files (never read back)
//! so an operator can inspect them; they may be deleted at will.
//!
//! Recovery never appends to an old segment: the store then starts a new
//! one, so a cut file is never written to again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tracing::{error, info, warn};

use super::index::{Index, Loc};
use super::manifest::{self, ManifestState, SegmentFacts, OPEN_SEGMENT};
use super::reader::PendingMessage;
use super::record::{self, MessageSeq, QueueId, Record};
use super::segment::{
    self, Damage, ScanContext, ScanItem, ScanStop, SegmentHeader, SegmentId, SegmentScanner,
    FORMAT_VERSION, SEGMENT_HEADER_BYTES,
};
use super::storage::Storage;
use super::{
    io_error, DamagedRange, LostSummary, MissingSegment, RecoveredPlacement, RecoveryReport,
    StoreError, SuspectRecords,
};

/// Most message seqs listed in a report (and a log line) as probably lost.
pub(crate) const LOST_MESSAGES_LISTED_MAX: usize = 64;
/// Bytes rewritten at once by [`make_durable`].
const REWRITE_CHUNK_BYTES: usize = 1024 * 1024;

/// The outcome of replaying the data directory.
pub(crate) struct Replayed {
    pub(crate) index: Index,
    pub(crate) report: RecoveryReport,
    pub(crate) last_segment: Option<SegmentId>,
    pub(crate) next_entry_seq: u64,
    /// The journal's salt (`None`: no segment of the salted format yet).
    pub(crate) salt: Option<u32>,
    /// What the manifest should say about the segments kept.
    pub(crate) segments: BTreeMap<SegmentId, SegmentFacts>,
    /// Generation of the manifest read (0: none).
    pub(crate) manifest_generation: u64,
    /// Segments with damage left in place: compaction rewrites them.
    pub(crate) damaged_segments: BTreeSet<SegmentId>,
}

/// A change to the files that [`apply`] makes.
#[derive(Debug)]
enum Action {
    /// Cut a torn tail at `at`, saving the bytes after it.
    Cut { path: PathBuf, at: u64 },
    /// Save a damaged range that stays in place.
    Save { path: PathBuf, from: u64, to: u64 },
    /// Remove a segment shorter than its header, saving its bytes.
    RemoveTorn { path: PathBuf },
    /// Remove a segment compaction had retired.
    RemoveRetired { path: PathBuf },
    /// Write the newest segment's replayed bytes again and sync them.
    MakeDurable { path: PathBuf, end: u64 },
}

/// The read-only pass's findings.
struct Scan {
    replayed: Replayed,
    actions: Vec<Action>,
    /// The manifest copy used, to be made durable before acting on it.
    manifest: Option<manifest::Manifest>,
}

/// Side file of the bytes of `path` from `offset`.
fn side_path(path: &Path, offset: u64) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{offset}.dropped"));
    path.with_file_name(name)
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

/// Replays every segment in `dir` and repairs what recovery repairs (see
/// the module docs). Refuses with [`StoreError::Incomplete`] when
/// segments are missing, unless `accept_loss`.
pub(crate) fn replay(
    storage: &dyn Storage,
    dir: &Path,
    accept_loss: bool,
) -> Result<Replayed, StoreError> {
    let started = Instant::now();
    let Scan {
        mut replayed,
        actions,
        manifest,
    } = scan(storage, dir)?;
    if !replayed.report.missing.is_empty() || replayed.report.manifest == ManifestState::Lost {
        if !accept_loss {
            return Err(StoreError::Incomplete(replayed.report.loss_text()));
        }
        replayed.report.loss_accepted = true;
    }
    if let Some(m) = &manifest {
        // What was read may be in the page cache only (a failed sync of
        // the manifest before a restart): written again and synced before
        // anything is removed on its word, or a later power loss could
        // bring back the older copy, which still lists what was removed.
        manifest::write(storage, dir, m)
            .map_err(|e| io_error("write", &dir.join(manifest::MANIFEST_FILES[0]), e))?;
    }
    apply(storage, dir, &actions)?;
    replayed.report.duration = started.elapsed();
    log_report(&replayed.report);
    Ok(replayed)
}

/// Checks the journal in `dir` without changing anything: what recovery
/// would find.
pub(crate) fn check(storage: &dyn Storage, dir: &Path) -> Result<RecoveryReport, StoreError> {
    let started = Instant::now();
    let mut report = scan(storage, dir)?.replayed.report;
    // Nothing was saved: a check changes nothing.
    for d in &mut report.damaged {
        d.saved_to = None;
    }
    report.duration = started.elapsed();
    Ok(report)
}

/// Reads the segment headers that are intact: the journal's salt and
/// whether any segment was written by a build that keeps a manifest.
fn read_headers(
    storage: &dyn Storage,
    dir: &Path,
    ids: &[SegmentId],
) -> Result<BTreeMap<SegmentId, SegmentHeader>, StoreError> {
    let mut headers = BTreeMap::new();
    for &id in ids {
        let path = dir.join(segment::file_name(id));
        let file = storage
            .open(&path)
            .map_err(|e| io_error("open", &path, e))?;
        let mut raw = [0u8; SEGMENT_HEADER_BYTES];
        if file.size().map_err(|e| io_error("stat", &path, e))? < SEGMENT_HEADER_BYTES as u64 {
            continue;
        }
        file.read_at(&mut raw, 0)
            .map_err(|e| io_error("read", &path, e))?;
        if let Ok(h) = SegmentHeader::decode(&raw) {
            if h.id == id {
                headers.insert(id, h);
            }
        }
    }
    Ok(headers)
}

/// Tracks delivery states of messages whose record is not there: a sign
/// of which queues lost messages.
#[derive(Default)]
struct Orphans(BTreeSet<(QueueId, MessageSeq)>);

impl Orphans {
    fn see(&mut self, index: &Index, rec: &Record) {
        match rec {
            Record::DeliveryState { queue, seq, .. } => {
                let known = index
                    .message(*seq)
                    .is_some_and(|m| m.placements.get(queue).is_some());
                if !known {
                    self.0.insert((*queue, *seq));
                }
            }
            Record::Ack { queue, seq } => {
                self.0.remove(&(*queue, *seq));
            }
            Record::QueueDelete { queue } => self.0.retain(|(q, _)| q != queue),
            Record::Message { seq, queues, .. } => {
                for q in queues {
                    self.0.remove(&(*q, *seq));
                }
            }
            _ => {}
        }
    }
}

/// The read-only pass: everything recovery learns, and what it would do.
fn scan(storage: &dyn Storage, dir: &Path) -> Result<Scan, StoreError> {
    let ids = list_segments(storage, dir)?;
    let headers = read_headers(storage, dir, &ids)?;
    let (manifest, other_copy_bad) =
        manifest::read(storage, dir).map_err(|e| io_error("read", &dir.join("MANIFEST"), e))?;
    let mut report = RecoveryReport::default();
    let salt = manifest
        .as_ref()
        .map(|m| m.salt)
        .or_else(|| headers.values().find(|h| h.format >= 2).map(|h| h.salt));
    report.manifest = match &manifest {
        Some(m) => ManifestState::Read {
            generation: m.generation,
            other_copy_bad,
        },
        None if salt.is_some() || other_copy_bad => ManifestState::Lost,
        None => ManifestState::Absent,
    };
    let listed = manifest.as_ref().map(|m| &m.segments);
    let listed_max = listed.and_then(|l| l.keys().next_back().copied());
    let mut actions = Vec::new();
    // Segments compaction retired before a crash made the removal
    // durable: not in the manifest, older than what it lists.
    let (retired, ids): (Vec<SegmentId>, Vec<SegmentId>) = ids.into_iter().partition(|id| {
        listed.is_some_and(|l| !l.contains_key(id)) && listed_max.is_some_and(|max| *id < max)
    });
    for id in retired {
        let path = dir.join(segment::file_name(id));
        report.retired_removed.push(path.clone());
        actions.push(Action::RemoveRetired { path });
    }
    if let Some(l) = listed {
        for (id, f) in l {
            if !ids.contains(id) {
                report.missing.push(MissingSegment {
                    path: dir.join(segment::file_name(*id)),
                    segment: *id,
                    present: false,
                    found_bytes: None,
                    expected_bytes: f.sealed().then_some(f.len),
                    lost_entries: Some((f.first_entry_seq, f.sealed().then_some(f.end_entry_seq))),
                });
            }
        }
    }

    let mut index = Index::new();
    let mut orphans = Orphans::default();
    let mut suspect_queues: BTreeSet<QueueId> = BTreeSet::new();
    let mut suspect_messages: BTreeSet<MessageSeq> = BTreeSet::new();
    let mut next_entry_seq = 0u64;
    let mut seq_floor = 0u64;
    let mut queue_floor = 0u64;
    let mut segments: BTreeMap<SegmentId, SegmentFacts> = BTreeMap::new();
    let mut damaged_segments = BTreeSet::new();
    // (segment, index in report.damaged) of a tail damage whose end seq
    // the next segment tells.
    let mut open_tail: Option<(SegmentId, usize)> = None;
    let newest = ids.last().copied();
    // (id, end entry seq, tail damaged) of the segment scanned before.
    let mut prev: Option<(SegmentId, u64, bool)> = None;

    for &id in &ids {
        let path = dir.join(segment::file_name(id));
        let facts = listed.and_then(|l| l.get(&id)).copied();
        let is_newest = Some(id) == newest;
        let sealed = facts.is_some_and(|f| f.sealed());
        let ctx = ScanContext { salt, facts };
        let mut scanner = match SegmentScanner::open_with(storage, &path, id, ctx) {
            Ok(s) => s,
            Err(ScanStop::TornHeader) => {
                let size = storage
                    .open(&path)
                    .and_then(|f| f.size())
                    .map_err(|e| io_error("stat", &path, e))?;
                if is_newest && !sealed {
                    // Created just before a crash: nothing was in it.
                    report.damaged.push(DamagedRange {
                        path: path.clone(),
                        segment: id,
                        offset: 0,
                        end: size,
                        damage: Damage::TornSegmentHeader,
                        cut: true,
                        segment_removed: true,
                        lost_entries: None,
                        saved_to: Some(side_path(&path, 0)),
                        suspect: None,
                    });
                    actions.push(Action::RemoveTorn { path });
                } else {
                    report.missing.push(MissingSegment {
                        path,
                        segment: id,
                        present: true,
                        found_bytes: Some(size),
                        expected_bytes: facts.filter(|f| f.sealed()).map(|f| f.len),
                        lost_entries: facts
                            .map(|f| (f.first_entry_seq, f.sealed().then_some(f.end_entry_seq))),
                    });
                }
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
        if let Some(damage) = scanner.header_damage {
            report.damaged.push(DamagedRange {
                path: path.clone(),
                segment: id,
                offset: 0,
                end: SEGMENT_HEADER_BYTES as u64,
                damage,
                cut: false,
                segment_removed: false,
                lost_entries: None,
                saved_to: None,
                suspect: None,
            });
            damaged_segments.insert(id);
        }
        let mut header = scanner.header;
        let mut first_seen = false;
        index.add_segment(id, scanner.file_len());
        report.segments_read += 1;
        let mut cut_at = None;
        let mut tail_damaged = false;
        // Only the newest segment can have been torn by a crash, and only
        // a scan that knows the segment's format may judge where it ends.
        let may_be_torn = is_newest && !sealed && scanner.header_damage.is_none();
        loop {
            let item = match scanner.next_item() {
                Ok(item) => item,
                Err(ScanStop::Unsupported { offset, version }) => {
                    return Err(StoreError::Unsupported {
                        path,
                        offset,
                        what: format!("entry format version {version}"),
                    })
                }
                Err(ScanStop::Io(e)) => return Err(io_error("read", &path, e)),
                Err(ScanStop::TornHeader) => break,
            };
            match item {
                ScanItem::End => break,
                ScanItem::Entry(entry) => {
                    if !first_seen {
                        first_seen = true;
                        if scanner.header_damage.is_some() && facts.is_none() {
                            header.first_entry_seq = entry.header.entry_seq;
                        }
                    }
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
                        orphans.see(&index, rec);
                        index.apply(rec, loc, *size, true);
                    }
                    report.entries_replayed += 1;
                    report.records_replayed += records.len() as u64;
                    report.bytes_replayed += entry.len;
                }
                ScanItem::Damaged(span) => {
                    let torn_tail = may_be_torn && !span.resumed;
                    tail_damaged |= !span.resumed && !torn_tail;
                    let suspect = span.suspect_body.and_then(|body| {
                        let records = record::decode_body(body).ok()?;
                        let mut messages = Vec::new();
                        for (r, _) in &records {
                            if let Record::Message { seq, queues, .. } = r {
                                messages.push((*seq, queues.clone()));
                                suspect_messages.insert(*seq);
                                suspect_queues.extend(queues.iter().copied());
                            }
                        }
                        Some(SuspectRecords {
                            records: records.len(),
                            messages,
                        })
                    });
                    let saved_to = (span.end > span.offset).then(|| side_path(&path, span.offset));
                    if torn_tail {
                        cut_at = Some(span.offset);
                        actions.push(Action::Cut {
                            path: path.clone(),
                            at: span.offset,
                        });
                    } else {
                        if span.end > span.offset {
                            actions.push(Action::Save {
                                path: path.clone(),
                                from: span.offset,
                                to: span.end,
                            });
                        }
                        damaged_segments.insert(id);
                    }
                    if !span.resumed
                        && !torn_tail
                        && span.lost_entries.is_some_and(|(_, to)| to.is_none())
                    {
                        open_tail = Some((id, report.damaged.len()));
                    }
                    report.damaged.push(DamagedRange {
                        path: path.clone(),
                        segment: id,
                        offset: span.offset,
                        end: span.end,
                        damage: span.damage,
                        cut: torn_tail,
                        segment_removed: false,
                        // A torn tail held nothing acknowledged under the
                        // default policy; what it held is not known.
                        lost_entries: if torn_tail { None } else { span.lost_entries },
                        saved_to,
                        suspect,
                    });
                }
            }
        }
        // After the scan: a re-derived header learns its first seq from
        // the first entry. (An error here aborts the open all the same.)
        {
            check_order(
                &path,
                header.first_entry_seq,
                next_entry_seq,
                prev,
                id,
                &mut report,
                &mut open_tail,
            )?;
        }
        let end_seq = scanner.next_entry_seq().max(header.first_entry_seq);
        let file_len = cut_at.unwrap_or(scanner.file_len());
        index.set_file_bytes(id, file_len);
        if let Some(f) = facts.filter(|f| f.sealed()) {
            if scanner.file_len() < f.len || (end_seq < f.end_entry_seq && !tail_damaged) {
                report.missing.push(MissingSegment {
                    path: path.clone(),
                    segment: id,
                    present: true,
                    found_bytes: Some(scanner.file_len()),
                    expected_bytes: Some(f.len),
                    lost_entries: Some((end_seq, Some(f.end_entry_seq))),
                });
            }
        }
        seq_floor = seq_floor.max(header.seq_floor);
        queue_floor = queue_floor.max(header.queue_floor);
        segments.insert(
            id,
            SegmentFacts {
                format: header.format,
                first_entry_seq: header.first_entry_seq,
                end_entry_seq: end_seq,
                len: file_len,
                seq_floor: header.seq_floor,
                queue_floor: header.queue_floor,
            },
        );
        next_entry_seq = end_seq;
        prev = Some((id, end_seq, tail_damaged));
        if is_newest {
            actions.push(Action::MakeDurable {
                path: path.clone(),
                end: file_len,
            });
        }
    }
    index.next_seq = index.next_seq.max(seq_floor);
    index.next_queue_id = index.next_queue_id.max(queue_floor);
    report.truncated_bytes = report
        .damaged
        .iter()
        .filter(|d| d.cut)
        .map(|d| d.end - d.offset)
        .sum();
    report.lost = lost_summary(&report, &orphans, suspect_queues, suspect_messages);
    report.queue_names = index.queues().map(|q| (q.id, q.name.clone())).collect();
    let last_segment = segments.keys().next_back().copied();
    let manifest_generation = manifest.as_ref().map_or(0, |m| m.generation);
    Ok(Scan {
        manifest,
        replayed: Replayed {
            index,
            report,
            last_segment,
            next_entry_seq,
            salt,
            segments,
            manifest_generation,
            damaged_segments,
        },
        actions,
    })
}

/// Checks a segment's first entry seq against where the previous one
/// ended: going backwards is an error; a gap after a consecutive segment
/// means the end of that segment was lost, which a damaged tail there
/// accounts for (its lost range then ends here) or else is a truncated
/// older segment.
fn check_order(
    path: &Path,
    first: u64,
    next_entry_seq: u64,
    prev: Option<(SegmentId, u64, bool)>,
    id: SegmentId,
    report: &mut RecoveryReport,
    open_tail: &mut Option<(SegmentId, usize)>,
) -> Result<(), StoreError> {
    if first < next_entry_seq {
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            offset: 0,
            reason: format!(
                "first entry sequence {first} is below {next_entry_seq} where the previous segment ended"
            ),
        });
    }
    let consecutive = prev.is_some_and(|(p, _, _)| p + 1 == id);
    if let Some((seg, i)) = open_tail.take() {
        // Only a consecutive segment says where the lost entries ended:
        // compaction may have deleted segments in between.
        let next_to_it = consecutive && prev.is_some_and(|(p, _, _)| p == seg);
        if let Some(d) = report.damaged.get_mut(i).filter(|_| next_to_it) {
            if let Some((from, None)) = d.lost_entries {
                d.lost_entries = Some((from, Some(first)));
            }
        }
    }
    if let Some((p, end, tail_damaged)) = prev {
        // Compaction deletes whole segments, never the end of one.
        if p + 1 == id && end < first && !tail_damaged {
            report.missing.push(MissingSegment {
                path: path.with_file_name(segment::file_name(p)),
                segment: p,
                present: true,
                found_bytes: None,
                expected_bytes: None,
                lost_entries: Some((end, Some(first))),
            });
        }
    }
    Ok(())
}

fn lost_summary(
    report: &RecoveryReport,
    orphans: &Orphans,
    mut queues: BTreeSet<QueueId>,
    mut messages: BTreeSet<MessageSeq>,
) -> LostSummary {
    let mut ranges: Vec<(u64, Option<u64>)> = Vec::new();
    let mut bytes = 0;
    for d in &report.damaged {
        if !d.cut {
            bytes += d.end - d.offset;
        }
        if let Some(r) = d.lost_entries {
            ranges.push(r);
        }
    }
    for m in &report.missing {
        bytes += m
            .expected_bytes
            .map_or(0, |e| e.saturating_sub(m.found_bytes.unwrap_or(0)));
        if let Some(r) = m.lost_entries {
            ranges.push(r);
        }
    }
    ranges.sort_unstable();
    ranges.dedup();
    let entries = ranges
        .iter()
        .filter_map(|(from, to)| to.map(|t| t.saturating_sub(*from)))
        .sum();
    let entries_unbounded = ranges.iter().any(|(_, to)| to.is_none());
    if !ranges.is_empty() || report.damaged.iter().any(|d| !d.cut && d.end > d.offset) {
        for (q, s) in &orphans.0 {
            queues.insert(*q);
            messages.insert(*s);
        }
    }
    LostSummary {
        entries,
        entries_unbounded,
        entry_ranges: ranges,
        bytes,
        queues: queues.into_iter().collect(),
        messages: messages
            .into_iter()
            .take(LOST_MESSAGES_LISTED_MAX)
            .collect(),
    }
}

/// The second pass: cuts, saves, removes, makes durable.
fn apply(storage: &dyn Storage, dir: &Path, actions: &[Action]) -> Result<(), StoreError> {
    let mut removed_any = false;
    for action in actions {
        match action {
            Action::Cut { path, at } => {
                let side = side_path(path, *at);
                segment::save_range(storage, path, *at, None, &side)
                    .map_err(|e| io_error("save", &side, e))?;
                segment::truncate(storage, path, *at).map_err(|e| io_error("truncate", path, e))?;
            }
            Action::Save { path, from, to } => {
                let side = side_path(path, *from);
                let names = storage.list(dir).map_err(|e| io_error("list", dir, e))?;
                let exists = side
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| names.iter().any(|x| x == n));
                if !exists {
                    segment::save_range(storage, path, *from, Some(*to), &side)
                        .map_err(|e| io_error("save", &side, e))?;
                }
            }
            Action::RemoveTorn { path } => {
                let side = side_path(path, 0);
                segment::save_range(storage, path, 0, None, &side)
                    .map_err(|e| io_error("save", &side, e))?;
                storage
                    .remove(path)
                    .map_err(|e| io_error("remove", path, e))?;
                removed_any = true;
            }
            Action::RemoveRetired { path } => {
                storage
                    .remove(path)
                    .map_err(|e| io_error("remove", path, e))?;
                removed_any = true;
            }
            Action::MakeDurable { path, end } => make_durable(storage, path, *end)?,
        }
    }
    if removed_any {
        storage
            .sync_dir(dir)
            .map_err(|e| io_error("fsync", dir, e))?;
    }
    Ok(())
}

fn log_report(report: &RecoveryReport) {
    for d in &report.damaged {
        let path = d.path.display().to_string();
        let saved = d.saved_to.as_ref().map(|p| p.display().to_string());
        if d.cut {
            warn!(path = %path, offset = d.offset, bytes = d.end - d.offset, damage = ?d.damage, saved_to = ?saved,
                removed = d.segment_removed, "journal: torn tail cut (a crash during a write)");
        } else {
            error!(path = %path, offset = d.offset, end = d.end, damage = ?d.damage, lost_entries = ?d.lost_entries,
                suspect = ?d.suspect, saved_to = ?saved,
                "journal: damaged range skipped; the entries after it were kept");
        }
    }
    for m in &report.missing {
        error!(path = %m.path.display(), found_bytes = ?m.found_bytes, expected_bytes = ?m.expected_bytes,
            lost_entries = ?m.lost_entries, accepted = report.loss_accepted,
            "journal: segment missing or cut short");
    }
    for p in &report.retired_removed {
        info!(path = %p.display(), "journal: removed a segment compaction had retired before a crash");
    }
    if report.lost.entries > 0 || report.lost.entries_unbounded || !report.lost.queues.is_empty() {
        error!(entries = report.lost.entries, more_unknown = report.lost.entries_unbounded,
            entry_ranges = ?report.lost.entry_ranges, bytes = report.lost.bytes,
            queues = ?report.lost.queues, messages = ?report.lost.messages,
            "journal: data lost to damage");
    }
    if matches!(
        report.manifest,
        ManifestState::Read {
            other_copy_bad: true,
            ..
        }
    ) {
        warn!("journal: one manifest copy was torn or damaged; the other was used");
    }
    if !report.is_clean() {
        // The whole account once, with queue names, for the operator.
        error!("journal recovery report:\n{report}");
    }
    info!(
        segments = report.segments_read,
        entries = report.entries_replayed,
        records = report.records_replayed,
        bytes = report.bytes_replayed,
        damaged = report.damaged.len(),
        missing = report.missing.len(),
        ms = report.duration.as_millis() as u64,
        "journal replayed"
    );
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
/// write of at most a segment per start. (The directory entry of a
/// segment created just before such a failure is made durable by the
/// directory sync that follows the next segment's creation.)
fn make_durable(storage: &dyn Storage, path: &Path, end: u64) -> Result<(), StoreError> {
    let file = storage.open(path).map_err(|e| io_error("open", path, e))?;
    // From the segment header on: it too may never have been synced (a
    // failed sync right after the segment was created).
    let mut at = 0;
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

/// The facts of a segment the writer creates now.
pub(crate) fn new_segment_facts(
    first_entry_seq: u64,
    seq_floor: u64,
    queue_floor: u64,
) -> SegmentFacts {
    SegmentFacts {
        format: FORMAT_VERSION,
        first_entry_seq,
        end_entry_seq: OPEN_SEGMENT,
        len: OPEN_SEGMENT,
        seq_floor,
        queue_floor,
    }
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
                    state: p.state().cloned(),
                })
                .collect();
            PendingMessage::new(seq, m.loc(), placements)
        })
        .collect();
    let retained = index
        .retained()
        .filter_map(|(topic, r)| Some((topic.to_owned(), r.seq, r.message.as_ref()?.to_bytes())))
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
