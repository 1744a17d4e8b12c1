//! Retention: a log keeps what its limits allow and drops the rest by
//! whole segments, oldest first, never the segment being written.
//!
//! - By age (`max_age_s`): a sealed segment goes once its newest record is
//!   older than the limit, so a record lives at least `max_age_s` and at
//!   most that plus the time its segment took to fill.
//! - By size (`max_bytes`): the oldest sealed segments go while the log is
//!   larger than the limit, so the log holds at most `max_bytes` plus one
//!   segment between runs.
//!
//! A run also gives back the memory of a tail cache nobody appended to
//! since the last run (see `tail`).
//!
//! A segment is first taken out of the readers' view, then its file is
//! removed and the directory synced. A read already in it finishes from
//! its open handle; a reader whose position is below the new first offset
//! learns on its next read how many records it missed
//! ([`super::LogRead::missed`]).

use tracing::info;

use super::Inner;
use crate::{io_error, StoreError};

/// What one retention run deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Segments deleted.
    pub segments: u64,
    /// Records they held.
    pub records: u64,
    /// Bytes freed.
    pub bytes: u64,
    /// The first offset after the run.
    pub first_offset: u64,
}

pub(crate) fn apply(inner: &Inner, now_ms: u64) -> Result<RetentionReport, StoreError> {
    let _one_at_a_time = inner.retention.lock();
    let config = &inner.config;
    let max_age_ms = config.max_age_s.map(|s| s.saturating_mul(1000));
    let mut report = RetentionReport::default();
    let mut doomed = Vec::new();
    {
        let mut view = inner.view.lock();
        let mut total: u64 = view.segments.values().map(|s| s.len).sum();
        while view.segments.len() > 1 {
            let Some((&base, seg)) = view.segments.iter().next() else {
                break;
            };
            let too_old = match (max_age_ms, seg.last_ts) {
                (Some(age), Some(ts)) => ts.saturating_add(age) <= now_ms,
                (Some(_), None) => true, // a sealed segment without records
                (None, _) => false,
            };
            let too_big = config.max_bytes.is_some_and(|max| total > max);
            if !too_old && !too_big {
                break;
            }
            let Some(seg) = view.segments.remove(&base) else {
                break;
            };
            total -= seg.len;
            let next_base = view.segments.keys().next().copied().unwrap_or(seg.next);
            report.segments += 1;
            report.records += next_base.saturating_sub(seg.base);
            report.bytes += seg.len;
            doomed.push(seg);
        }
        view.stats.segments_deleted += report.segments;
        report.first_offset = view.bounds().first;
        let first = report.first_offset;
        view.tail.drop_below(first);
        // Retention runs every few seconds: an idle log's cache goes.
        view.tail.trim_if_idle();
    }
    if doomed.is_empty() {
        return Ok(report);
    }
    for seg in &doomed {
        config
            .storage
            .remove(&seg.path)
            .map_err(|e| io_error("remove", &seg.path, e))?;
        super::index_file::remove(&*config.storage, &seg.path)
            .map_err(|e| io_error("remove the index of", &seg.path, e))?;
    }
    config
        .storage
        .sync_dir(&config.dir)
        .map_err(|e| io_error("fsync directory", &config.dir, e))?;
    info!(dir = %config.dir.display(), segments = report.segments, records = report.records,
        bytes = report.bytes, first_offset = report.first_offset, "stream log retention");
    Ok(report)
}
