//! The newest records of a log, kept in memory as the writer wrote them,
//! so that readers at the tail read them without a system call or a copy.
//!
//! The writer encodes each batch into one buffer, writes it, syncs it, and
//! then hands that same buffer to the cache (no copy): readers near the
//! tail get their records' bodies as slices of it, whatever their number,
//! so a hundred readers at the tail of one stream hold one copy of what
//! they read, not a hundred. Readers further back read the segment files
//! (the page cache), as before.
//!
//! # What it holds
//!
//! A contiguous run of the newest durable records, ending at the log's
//! readable end, or nothing: a batch that does not follow the cached ones
//! (one written after a rollover, or after a batch that was not cached)
//! first empties the cache, so a reader that finds its offset here can
//! read on to the end without looking at the files.
//!
//! # Memory
//!
//! Bounded twice: per log by [`LogConfig::tail_cache_bytes`] (the oldest
//! batches go first), and across every log sharing one
//! [`TailCacheBudget`] (the core shares one among all its streams). A batch
//! that fits neither is not cached (readers read it from the file). A
//! cache that nobody appended to between two retention runs is emptied, so
//! idle streams give their share back.
//!
//! A delivery made from the cache holds its batch's buffer until it is
//! written to its client, as a delivery read from a file holds its read
//! chunk: readers never pin more than the batches their credit spans.
//!
//! [`LogConfig::tail_cache_bytes`]: super::LogConfig::tail_cache_bytes

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::format::RECORD_HEADER_BYTES;
use super::LogRecord;
use crate::segment::{le_u32, le_u64};

/// Memory that the tail caches of several logs share.
#[derive(Debug)]
pub struct TailCacheBudget {
    max_bytes: u64,
    used_bytes: AtomicU64,
}

impl TailCacheBudget {
    /// A budget of `max_bytes` (0: nothing is cached).
    pub fn new(max_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            max_bytes,
            used_bytes: AtomicU64::new(0),
        })
    }

    /// Bytes cached now under this budget.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    fn try_take(&self, bytes: u64) -> bool {
        let mut used = self.used_bytes.load(Ordering::Relaxed);
        loop {
            if used.saturating_add(bytes) > self.max_bytes {
                return false;
            }
            match self.used_bytes.compare_exchange_weak(
                used,
                used + bytes,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    fn give_back(&self, bytes: u64) {
        self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// One written batch: records `first..first + starts.len()`, record `i`'s
/// frame at `starts[i]` in `data`.
#[derive(Debug)]
struct CachedBatch {
    first: u64,
    starts: Vec<u32>,
    data: Bytes,
}

impl CachedBatch {
    fn next(&self) -> u64 {
        self.first + self.starts.len() as u64
    }

    fn cost(&self) -> u64 {
        (self.data.len() + self.starts.len() * 4) as u64
    }
}

/// A log's tail cache; see the module docs.
#[derive(Debug)]
pub(crate) struct TailCache {
    batches: VecDeque<CachedBatch>,
    bytes: u64,
    max_bytes: u64,
    budget: Arc<TailCacheBudget>,
    /// A batch came since the last [`TailCache::trim_if_idle`].
    appended: bool,
}

impl TailCache {
    pub(crate) fn new(max_bytes: u64, budget: Arc<TailCacheBudget>) -> Self {
        Self {
            batches: VecDeque::new(),
            bytes: 0,
            max_bytes,
            budget,
            appended: false,
        }
    }

    /// The first offset cached, if any is.
    fn first(&self) -> Option<u64> {
        self.batches.front().map(|b| b.first)
    }

    /// One past the newest offset cached, if any is.
    fn next(&self) -> Option<u64> {
        self.batches.back().map(CachedBatch::next)
    }

    /// Whether the record at `offset` is cached.
    pub(crate) fn holds(&self, offset: u64) -> bool {
        self.first().is_some_and(|first| offset >= first)
            && self.next().is_some_and(|next| offset < next)
    }

    /// Adds a durable batch: records `first..` framed at `starts` in
    /// `data`, the newest records of the log.
    pub(crate) fn push(&mut self, first: u64, starts: Vec<u32>, data: Bytes) {
        self.appended = true;
        if starts.is_empty() {
            return;
        }
        if self.next().is_some_and(|n| n != first) {
            self.clear();
        }
        let batch = CachedBatch {
            first,
            starts,
            data,
        };
        let cost = batch.cost();
        if cost > self.max_bytes {
            return self.clear();
        }
        while self.bytes + cost > self.max_bytes {
            self.pop_front();
        }
        // Others' caches may hold the shared budget: ours goes first.
        while !self.budget.try_take(cost) {
            if self.batches.is_empty() {
                return;
            }
            self.pop_front();
        }
        self.bytes += cost;
        self.batches.push_back(batch);
    }

    fn pop_front(&mut self) {
        if let Some(b) = self.batches.pop_front() {
            let cost = b.cost();
            self.bytes -= cost;
            self.budget.give_back(cost);
        }
    }

    /// Drops everything.
    pub(crate) fn clear(&mut self) {
        while !self.batches.is_empty() {
            self.pop_front();
        }
    }

    /// Drops what is below `first` (retention deleted it).
    pub(crate) fn drop_below(&mut self, first: u64) {
        while self.batches.front().is_some_and(|b| b.next() <= first) {
            self.pop_front();
        }
    }

    /// Empties the cache if nothing was appended since the last call.
    pub(crate) fn trim_if_idle(&mut self) {
        if !self.appended {
            self.clear();
        }
        self.appended = false;
    }

    /// Reads records from `from` into `out` (bodies are slices of the
    /// cached buffers) until `max_records` are there or `bytes` reaches
    /// `max_bytes`. `None` when `from` is not cached; else the offset to
    /// read next (the log's end when the cache ran out).
    pub(crate) fn read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        out: &mut Vec<LogRecord>,
        bytes: &mut usize,
    ) -> Option<u64> {
        if !self.holds(from) {
            return None;
        }
        let i = self.batches.partition_point(|b| b.next() <= from);
        let mut at = from;
        for b in self.batches.iter().skip(i) {
            let skip = usize::try_from(at - b.first).unwrap_or(usize::MAX);
            for &start in b.starts.iter().skip(skip) {
                if out.len() >= max_records || *bytes >= max_bytes {
                    return Some(at);
                }
                let record = record_at(&b.data, start as usize);
                // Our own invariant: the cache holds dense offsets.
                assert_eq!(record.offset, at, "tail cache out of order");
                *bytes += record.body.len();
                out.push(record);
                at += 1;
            }
        }
        Some(at)
    }

    /// Bytes held (for tests).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for TailCache {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The record framed at `start` of a buffer the writer encoded (so its
/// checksums are not checked again: these bytes never left memory).
fn record_at(data: &Bytes, start: usize) -> LogRecord {
    let head = &data[start..start + RECORD_HEADER_BYTES];
    let body_len = le_u32(head, 20) as usize;
    let body_at = start + RECORD_HEADER_BYTES;
    LogRecord {
        offset: le_u64(head, 4),
        timestamp_ms: le_u64(head, 12),
        body: data.slice(body_at..body_at + body_len),
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::encode_record;
    use super::*;

    fn batch(first: u64, n: u64, body: usize) -> (Vec<u32>, Bytes) {
        let mut buf = Vec::new();
        let mut starts = Vec::new();
        for o in first..first + n {
            starts.push(buf.len() as u32);
            encode_record(&mut buf, 1, o, o * 10, &vec![o as u8; body]);
        }
        (starts, Bytes::from(buf))
    }

    fn read(c: &TailCache, from: u64, max: usize) -> Option<(Vec<u64>, u64)> {
        let mut out = Vec::new();
        let mut bytes = 0;
        let next = c.read(from, max, usize::MAX, &mut out, &mut bytes)?;
        Some((out.iter().map(|r| r.offset).collect(), next))
    }

    #[test]
    fn reads_across_batches_to_the_end_and_misses_what_it_does_not_hold() {
        let budget = TailCacheBudget::new(1 << 20);
        let mut c = TailCache::new(1 << 20, Arc::clone(&budget));
        let (s, d) = batch(5, 3, 10);
        c.push(5, s, d);
        let (s, d) = batch(8, 2, 10);
        c.push(8, s, d);
        assert_eq!(read(&c, 6, 100), Some((vec![6, 7, 8, 9], 10)));
        assert_eq!(read(&c, 6, 2), Some((vec![6, 7], 8)));
        assert_eq!(read(&c, 4, 100), None, "below the cache");
        assert_eq!(read(&c, 10, 100), None, "at the end: nothing cached there");
        let mut out = Vec::new();
        let mut bytes = 0;
        c.read(5, 100, 1, &mut out, &mut bytes);
        assert_eq!(out.len(), 1, "at least one record, then the byte limit");
        assert_eq!(&out[0].body[..], &[5u8; 10][..]);
        assert_eq!(out[0].timestamp_ms, 50);
        assert_eq!(budget.used_bytes(), c.bytes());
    }

    #[test]
    fn a_gap_empties_it_and_both_bounds_evict_the_oldest_batches() {
        let budget = TailCacheBudget::new(1 << 20);
        let (s, d) = batch(0, 4, 100);
        let one = (d.len() + s.len() * 4) as u64;
        let mut c = TailCache::new(2 * one, Arc::clone(&budget));
        c.push(0, s, d);
        let (s, d) = batch(4, 4, 100);
        c.push(4, s, d);
        let (s, d) = batch(8, 4, 100);
        c.push(8, s, d);
        assert_eq!(read(&c, 3, 100), None, "the first batch was evicted");
        assert_eq!(read(&c, 4, 100).map(|r| r.1), Some(12));
        let (s, d) = batch(20, 1, 10);
        c.push(20, s, d);
        assert_eq!(read(&c, 8, 100), None, "a gap empties the cache");
        assert_eq!(read(&c, 20, 100), Some((vec![20], 21)));

        // A shared budget already spent by another log: nothing cached.
        let small = TailCacheBudget::new(one);
        let mut a = TailCache::new(1 << 20, Arc::clone(&small));
        let mut b = TailCache::new(1 << 20, Arc::clone(&small));
        let (s, d) = batch(0, 4, 100);
        a.push(0, s, d);
        let (s, d) = batch(0, 4, 100);
        b.push(0, s, d);
        assert_eq!(read(&b, 0, 100), None);
        assert_eq!(small.used_bytes(), one);
        drop(a);
        assert_eq!(
            small.used_bytes(),
            0,
            "a dropped cache gives its share back"
        );
    }

    #[test]
    fn an_idle_cache_is_emptied_at_the_second_trim() {
        let mut c = TailCache::new(1 << 20, TailCacheBudget::new(1 << 20));
        let (s, d) = batch(0, 2, 10);
        c.push(0, s, d);
        c.trim_if_idle();
        assert!(read(&c, 0, 10).is_some(), "appended since the last trim");
        c.trim_if_idle();
        assert_eq!(read(&c, 0, 10), None);
    }
}
