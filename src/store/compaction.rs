//! Compaction: delete dead segments, copy the live records of mostly-dead
//! segments forward.
//!
//! Runs on the writer thread between batches, so it never races an append;
//! each run is bounded ([`COMPACTION_STEPS_MAX`],
//! [`REWRITE_SEGMENTS_PER_RUN_MAX`]) so appends wait at most for a few
//! segment reads.
//!
//! A segment may be rewritten only if it holds no live tombstone: a
//! tombstone's meaning depends on its position (it must come after what it
//! cancels and before any re-creation of the key), so it cannot be moved.
//! The oldest segment never holds a live tombstone (there is nothing older
//! to cancel), so it can always be rewritten: one unconsumed message cannot
//! pin the segments behind it.

use std::collections::HashSet;

use tracing::{debug, error, warn};

use super::index::Loc;
use super::record::{self, Record, RECORD_FRAME_BYTES};
use super::segment::{self, ScanStop, SegmentId, SegmentScanner};
use super::writer::Writer;
use super::StoreError;

/// A segment whose live records take at most this share of its file (in
/// percent) is copied forward and deleted: rewriting costs at most as many
/// bytes as it frees.
pub(crate) const REWRITE_LIVE_PERCENT_MAX: u64 = 50;
/// Segments rewritten per run, so one run cannot stall appends for long.
pub(crate) const REWRITE_SEGMENTS_PER_RUN_MAX: usize = 4;
/// Delete/rewrite steps per run.
pub(crate) const COMPACTION_STEPS_MAX: usize = 64;
/// Bytes of copied records per entry written by a rewrite.
pub(crate) const REWRITE_ENTRY_BYTES_MAX: usize = 4 * 1024 * 1024;

/// What one run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompactionRun {
    pub(crate) segments_deleted: usize,
    pub(crate) segments_rewritten: usize,
    pub(crate) records_rewritten: usize,
}

/// One compaction run. Errors are write-path errors (the store fails
/// closed); problems reading an old segment are logged and skip it.
pub(crate) fn run(w: &mut Writer) -> Result<CompactionRun, StoreError> {
    let mut out = CompactionRun::default();
    let mut skip: HashSet<SegmentId> = HashSet::new();
    for _ in 0..COMPACTION_STEPS_MAX {
        let active = w.active.id;
        let dead: Vec<SegmentId> = w
            .index
            .lock()
            .segments()
            .filter(|(id, s)| *id != active && s.live_records == 0 && !skip.contains(id))
            .map(|(id, _)| id)
            .collect();
        if !dead.is_empty() {
            let n = w.delete_segments(&dead)?;
            if n < dead.len() {
                skip.extend(dead);
            }
            out.segments_deleted += n;
            continue;
        }
        if out.segments_rewritten >= REWRITE_SEGMENTS_PER_RUN_MAX || w.shared.compaction_paused() {
            break;
        }
        let index = w.index.lock();
        let candidate = index
            .segments()
            .find(|(id, s)| {
                *id != active
                    && !skip.contains(id)
                    && w.old_enough_to_rewrite(*id)
                    && s.live_tombstones == 0
                    && (s.live_bytes * 100 <= s.file_bytes * REWRITE_LIVE_PERCENT_MAX
                        || w.damaged_segments.contains(id))
            })
            .map(|(id, _)| id);
        drop(index);
        let Some(seg) = candidate else { break };
        match rewrite(w, seg)? {
            Some(n) => {
                out.segments_rewritten += 1;
                out.records_rewritten += n;
            }
            None => {
                skip.insert(seg);
            }
        }
    }
    if out != CompactionRun::default() {
        debug!(
            deleted = out.segments_deleted,
            rewritten = out.segments_rewritten,
            records = out.records_rewritten,
            "journal compaction"
        );
    }
    Ok(out)
}

/// Copies the live records of `seg` to the head, then deletes `seg`.
/// Returns the number of records copied, or `None` if the segment could
/// not be read (left in place).
fn rewrite(w: &mut Writer, seg: SegmentId) -> Result<Option<usize>, StoreError> {
    let path = w.dir.join(segment::file_name(seg));
    let ctx = w.scan_context(seg);
    let mut scanner = match SegmentScanner::open_with(&*w.storage, &path, seg, ctx) {
        Ok(s) => s,
        Err(e) => {
            warn!(path = %path.display(), error = ?stop_reason(&e), "journal compaction: cannot read segment; left in place");
            return Ok(None);
        }
    };
    let mut copies: Vec<Record> = Vec::new();
    let mut copy_bytes = 0usize;
    let mut copied = 0usize;
    loop {
        let entry = match scanner.next_entry() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => {
                // Damage is skipped (a live record in it keeps the file,
                // below); this is a read error or a newer format. Keep
                // what we have, never delete the file.
                error!(path = %path.display(), error = ?stop_reason(&e), "journal compaction: segment unreadable; left in place");
                w.append_internal(&copies)?;
                return Ok(None);
            }
        };
        let records = match record::decode_body(entry.body) {
            Ok(r) => r,
            Err(e) => {
                error!(path = %path.display(), offset = entry.offset, error = %e, "journal compaction: entry does not decode; left in place");
                w.append_internal(&copies)?;
                return Ok(None);
            }
        };
        for (i, (rec, size)) in records.into_iter().enumerate() {
            let loc = Loc {
                seg,
                entry: entry.offset,
                idx: u32::try_from(i).unwrap_or(u32::MAX),
            };
            let index = w.index.lock();
            if !index.is_live_state(&rec, loc) {
                continue;
            }
            copy_bytes += size as usize;
            match rec {
                Record::Message { seq, body, .. } => {
                    let Some(m) = index.message(seq) else {
                        continue;
                    };
                    // Only the queues that still hold it, so replay cannot
                    // resurrect acknowledged copies; then its delivery
                    // states, which would otherwise be replayed before the
                    // copy and ignored.
                    let queues = m.placements.keys().copied().collect();
                    let mut states = Vec::new();
                    for (q, p) in m.placements.iter() {
                        if let Some(state) = p.state() {
                            // Frame, queue and seq, then the state.
                            copy_bytes += RECORD_FRAME_BYTES + 16 + state.len();
                            states.push(Record::DeliveryState {
                                queue: *q,
                                seq,
                                state: state.clone(),
                            });
                        }
                    }
                    copies.push(Record::Message { seq, queues, body });
                    copies.extend(states);
                }
                other => copies.push(other),
            }
            drop(index);
            if copy_bytes >= REWRITE_ENTRY_BYTES_MAX {
                copied += copies.len();
                w.append_internal(&copies)?;
                copies.clear();
                copy_bytes = 0;
            }
        }
    }
    copied += copies.len();
    w.append_internal(&copies)?;
    let left = w.index.lock().segment(seg).map_or(0, |s| s.live_records);
    if left != 0 {
        // Our own invariant broke: keep the file rather than lose data.
        error!(
            segment = seg,
            live = left,
            "journal compaction: records still live after rewrite; segment kept"
        );
        debug_assert_eq!(left, 0, "rewrite left live records behind");
        return Ok(None);
    }
    w.delete_segments(&[seg])?;
    Ok(Some(copied))
}

fn stop_reason(e: &ScanStop) -> String {
    match e {
        ScanStop::TornHeader => "segment header torn".to_owned(),
        ScanStop::Unsupported { offset, version } => format!("version {version} at {offset}"),
        ScanStop::Io(e) => e.to_string(),
    }
}
