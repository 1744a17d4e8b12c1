//! Stream log tests: append, read, seek by offset and by time, group
//! commit, retention, and a crash at every point of a write on the
//! simulated disk.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::*;
use crate::sim::SimDisk;

fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e:?}"),
    }
}

fn sim_config(disk: &SimDisk) -> LogConfig {
    let mut c = LogConfig::new("/sim/streams/s1");
    c.storage = Arc::new(disk.attach());
    c.background_writer = false;
    c.segment_bytes = LOG_SEGMENT_MIN_BYTES;
    c
}

fn body(i: u64) -> Bytes {
    Bytes::from(format!("message {i:05} {}", "x".repeat((i % 50) as usize)))
}

/// Appends `n` records (offsets from wherever the log is), timestamp
/// `ts(i)`, stepping a manual writer; returns the offsets in order.
fn append_all(log: &StreamLog, from: u64, n: u64, ts: impl Fn(u64) -> u64) -> Vec<u64> {
    let offsets: Vec<u64> = (from..from + n)
        .map(|i| ok(log.append(ts(i), body(i), None)))
        .collect();
    ok(log.flush());
    offsets
}

fn read_all(log: &StreamLog, from: u64) -> Vec<LogRecord> {
    let mut out = Vec::new();
    let mut at = from;
    loop {
        let r = ok(log.read(at, 7, 1 << 20));
        if r.records.is_empty() {
            return out;
        }
        at = r.next;
        out.extend(r.records);
    }
}

#[test]
fn appends_get_dense_offsets_and_read_back_from_any_offset_across_segments() {
    let disk = SimDisk::new(1);
    let (log, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert_eq!(rec.next_offset, 0);
    let offsets = append_all(&log, 0, 300, |i| 1000 + i);
    assert_eq!(offsets, (0..300).collect::<Vec<_>>());
    assert!(log.stats().segments > 5, "tiny segments roll over");
    assert_eq!(
        log.bounds(),
        LogBounds {
            first: 0,
            next: 300
        }
    );
    for from in [0u64, 1, 57, 123, 299] {
        let got = read_all(&log, from);
        assert_eq!(got.len() as u64, 300 - from, "from {from}");
        for (r, want) in got.iter().zip(from..) {
            assert_eq!(r.offset, want);
            assert_eq!(r.body, body(want));
            assert_eq!(r.timestamp_ms, 1000 + want);
        }
    }
    assert!(
        ok(log.read(300, 10, 1 << 20)).records.is_empty(),
        "at the tail"
    );
    // Reading does not consume: the same records again.
    assert_eq!(read_all(&log, 0).len(), 300);
    // A read bounded by bytes still returns one record.
    assert_eq!(ok(log.read(10, 100, 1)).records.len(), 1);
    ok(log.close());
    let (log, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert_eq!(
        (rec.first_offset, rec.next_offset, rec.records),
        (0, 300, 300)
    );
    assert_eq!(rec.torn_tail_bytes, 0);
    assert_eq!(read_all(&log, 250).len(), 50, "after reopen");
    assert_eq!(
        ok(log.append(5000, body(300), None)),
        300,
        "dense after reopen"
    );
}

#[test]
fn a_seek_by_timestamp_finds_the_first_record_at_or_after_it() {
    let disk = SimDisk::new(2);
    let (log, _) = ok(StreamLog::open(sim_config(&disk)));
    // Ten records per timestamp step of 100 ms.
    append_all(&log, 0, 200, |i| 10_000 + (i / 10) * 100);
    assert_eq!(ok(log.offset_at_timestamp(0)), 0);
    assert_eq!(ok(log.offset_at_timestamp(10_000)), 0);
    assert_eq!(ok(log.offset_at_timestamp(10_001)), 10);
    assert_eq!(ok(log.offset_at_timestamp(10_500)), 50);
    assert_eq!(ok(log.offset_at_timestamp(11_850)), 190);
    assert_eq!(ok(log.offset_at_timestamp(11_900)), 190);
    assert_eq!(
        ok(log.offset_at_timestamp(11_901)),
        200,
        "after the last: the end"
    );
    // A clock that goes back never makes timestamps decrease.
    let o = ok(log.append(5, body(200), None));
    ok(log.flush());
    let r = ok(log.read(o, 1, 1 << 20));
    assert_eq!(r.records[0].timestamp_ms, 11_900);
}

#[test]
fn one_batch_is_one_write_and_one_fdatasync_and_completions_run_after_it() {
    let disk = SimDisk::new(3);
    let mut c = sim_config(&disk);
    c.segment_bytes = 1 << 20;
    let (log, _) = ok(StreamLog::open(c));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let before = disk.stats();
    for i in 0..50 {
        let a = Arc::clone(&acked);
        ok(log.append(1, body(i), Some(Box::new(move |r| a.lock().push(ok(r))))));
    }
    assert!(
        acked.lock().is_empty(),
        "nothing acknowledged before the batch"
    );
    assert!(
        ok(log.read(0, 10, 1 << 20)).records.is_empty(),
        "nor readable"
    );
    assert!(log.step());
    let after = disk.stats();
    assert_eq!(
        after.syncs - before.syncs,
        1,
        "one fdatasync for 50 appends"
    );
    assert_eq!(after.writes - before.writes, 1, "one write");
    assert_eq!(*acked.lock(), (0..50).collect::<Vec<_>>());
    assert_eq!(log.stats().batches, 1);
    for i in 0..50 {
        assert!(disk.durably_contains(Path::new("/sim/streams/s1"), &body(i)));
    }
}

#[test]
fn retention_deletes_whole_old_segments_by_size_and_by_age_and_readers_learn_what_they_missed() {
    let disk = SimDisk::new(4);
    let mut c = sim_config(&disk);
    c.max_bytes = Some(4 * LOG_SEGMENT_MIN_BYTES);
    c.max_age_s = Some(60);
    let (log, _) = ok(StreamLog::open(c));
    append_all(&log, 0, 400, |i| 1_000_000 + i);
    let before = log.stats();
    assert!(before.bytes > 8 * LOG_SEGMENT_MIN_BYTES);
    // By size: nothing is older than a minute yet.
    let r = ok(log.apply_retention(1_000_400));
    assert!(r.segments > 0);
    let after = log.stats();
    assert!(after.bytes <= 4 * LOG_SEGMENT_MIN_BYTES, "{after:?}");
    assert!(
        after.bytes + LOG_SEGMENT_MIN_BYTES > 4 * LOG_SEGMENT_MIN_BYTES,
        "whole segments only"
    );
    let first = log.bounds().first;
    assert_eq!(first, r.first_offset);
    assert!(first > 0);
    let files = disk.files(Path::new("/sim/streams/s1"));
    let with = |ext: &str| {
        files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .count() as u64
    };
    assert_eq!(with("log"), after.segments);
    assert_eq!(
        with("idx"),
        after.segments - 1,
        "each sealed segment kept has its index file; the deleted ones' went with them"
    );
    // A reader still at 0 is moved to the first offset and told.
    let read = ok(log.read(0, 1, 1 << 20));
    assert_eq!(read.missed, first);
    assert_eq!(read.records[0].offset, first);
    // By age: everything sealed is old two minutes later; the segment
    // being written stays.
    let r = ok(log.apply_retention(1_000_400 + 120_000));
    assert!(r.segments > 0);
    assert_eq!(log.stats().segments, 1);
    let tail = read_all(&log, 0);
    assert_eq!(
        tail.last().map(|r| r.offset),
        Some(399),
        "the newest is kept"
    );
    // Retention survives a restart: deleted is deleted.
    let kept_first = log.bounds().first;
    ok(log.close());
    let (log, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert_eq!((rec.first_offset, rec.next_offset), (kept_first, 400));
    assert_eq!(read_all(&log, 0).len() as u64, 400 - kept_first);
}

#[test]
fn a_flipped_byte_in_an_old_segment_costs_that_record_and_recovery_goes_on() {
    let disk = SimDisk::new(5);
    let (log, _) = ok(StreamLog::open(sim_config(&disk)));
    append_all(&log, 0, 100, |i| i);
    ok(log.close());
    let first = Path::new("/sim/streams/s1").join(format::segment_name(0));
    // A byte inside the third record's body.
    let third = format::SEGMENT_HEADER_BYTES as u64
        + (0..2)
            .map(|i| (RECORD_HEADER_BYTES + body(i).len()) as u64)
            .sum::<u64>();
    ok(disk.flip_byte(&first, third + RECORD_HEADER_BYTES as u64 + 3, 0x40));
    let want: Vec<u64> = (0..100).filter(|&o| o != 2).collect();
    // Without its index file, recovery scans the segment and finds it.
    ok(disk.lose_file(&index_file::index_path(&first)));
    let (log, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert_eq!(rec.lost.len(), 1, "{rec:?}");
    assert_eq!(rec.records, 99);
    let offsets: Vec<u64> = read_all(&log, 0).iter().map(|r| r.offset).collect();
    assert_eq!(offsets, want, "only the damaged record is gone");
    ok(log.close());
    // The index file written by that scan knows the hole.
    let (log, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert_eq!((rec.lost.len(), rec.records), (1, 99), "{rec:?}");
    let offsets: Vec<u64> = read_all(&log, 0).iter().map(|r| r.offset).collect();
    assert_eq!(offsets, want);
}

/// Opening a log reads its sealed segments' index files, not their
/// records (a read made to fail across a sealed segment's records does not
/// disturb the open), and reads give what a scan would; a missing, torn
/// or damaged index file, or one of another segment, is refused and the
/// segment scanned and its index written again.
#[test]
fn sealed_segments_open_from_their_index_files_and_a_bad_one_is_rebuilt() {
    let disk = SimDisk::new(22);
    let dir = Path::new("/sim/streams/s1");
    let (log, _) = ok(StreamLog::open(sim_config(&disk)));
    append_all(&log, 0, 200, |i| 5_000 + i * 10);
    let expected = read_all(&log, 0);
    let at_ts = ok(log.offset_at_timestamp(5_000 + 1234));
    let segments = log.stats().segments;
    ok(log.close());
    let seg = |base: u64| dir.join(format::segment_name(base));
    let bases: Vec<u64> = disk
        .files(dir)
        .iter()
        .filter_map(|p| format::parse_segment_name(p.file_name()?.to_str()?))
        .collect();
    let sealed = &bases[..bases.len() - 1];
    for &b in sealed {
        assert!(
            disk.contents(&index_file::index_path(&seg(b))).is_some(),
            "sealed segment {b} has its index file"
        );
    }
    // Reads of a sealed segment's records fail from here on: an open that
    // read them would see damage.
    let middle = sealed[sealed.len() / 2];
    let body_from = format::SEGMENT_HEADER_BYTES as u64;
    disk.corrupt_reads(&seg(middle), body_from, 1 << 20);
    let (log, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert_eq!(rec.indexes_used, sealed.len(), "{rec:?}");
    assert!(rec.lost.is_empty(), "no sealed segment was read: {rec:?}");
    assert_eq!(rec.records, 200);
    assert_eq!(log.stats().segments, segments);
    drop(log);

    // A missing, a damaged and a torn index file, and one copied from
    // another segment: each is refused and rebuilt. (A fresh disk state:
    // the reads are not corrupted here.)
    let disk = SimDisk::new(23);
    let (log, _) = ok(StreamLog::open(sim_config(&disk)));
    append_all(&log, 0, 200, |i| 5_000 + i * 10);
    ok(log.close());
    let idx = |b: u64| index_file::index_path(&seg(b));
    ok(disk.lose_file(&idx(sealed[0])));
    ok(disk.flip_byte(&idx(sealed[1]), 20, 0x01));
    let whole = disk.contents(&idx(sealed[2])).expect("index");
    ok(disk.truncate_durably(&idx(sealed[2]), whole.len() as u64 / 2));
    let other = disk.contents(&idx(sealed[4])).expect("index");
    ok(disk.overwrite(&idx(sealed[3]), 0, &other));
    let (log, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert_eq!(rec.indexes_used, sealed.len() - 4, "{rec:?}");
    assert!(rec.lost.is_empty(), "{rec:?}");
    assert_eq!(read_all(&log, 0), expected);
    assert_eq!(ok(log.offset_at_timestamp(5_000 + 1234)), at_ts);
    ok(log.close());
    let (_, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert_eq!(rec.indexes_used, sealed.len(), "all rebuilt: {rec:?}");
}

/// Damage in a sealed segment that recovery did not read (it was opened
/// from its index file) is found by the read that meets it: the segment
/// is scanned again, the damaged record becomes a gap the read steps
/// over, and the index file learns the hole.
#[test]
fn damage_behind_an_index_file_is_found_by_the_read_and_stepped_over() {
    let disk = SimDisk::new(24);
    let dir = Path::new("/sim/streams/s1");
    let (log, _) = ok(StreamLog::open(sim_config(&disk)));
    append_all(&log, 0, 100, |i| i);
    ok(log.close());
    let first = dir.join(format::segment_name(0));
    let third = format::SEGMENT_HEADER_BYTES as u64
        + (0..2)
            .map(|i| (RECORD_HEADER_BYTES + body(i).len()) as u64)
            .sum::<u64>();
    ok(disk.flip_byte(&first, third + RECORD_HEADER_BYTES as u64 + 3, 0x40));
    let (log, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert!(rec.lost.is_empty(), "opened from the index: {rec:?}");
    let offsets: Vec<u64> = read_all(&log, 0).iter().map(|r| r.offset).collect();
    let want: Vec<u64> = (0..100).filter(|&o| o != 2).collect();
    assert_eq!(offsets, want, "only the damaged record is gone");
    ok(log.close());
    let (_, rec) = ok(StreamLog::open(sim_config(&disk)));
    assert_eq!(rec.lost.len(), 1, "the rewritten index knows: {rec:?}");
}

/// The simulated power fails at every mutating disk operation of a run
/// in turn. After each failure the log reopens, and every record whose
/// append was acknowledged is there with its offset and bytes; what was
/// torn is cut; the log takes appends again at the next offset.
#[test]
fn a_crash_at_every_point_of_a_write_loses_nothing_acknowledged() {
    let seeds = [11u64, 12, 13];
    for seed in seeds {
        let mut op = 1u64;
        loop {
            let disk = SimDisk::new(seed);
            let acked = Arc::new(Mutex::new(Vec::new()));
            let crashed = {
                let (log, _) = ok(StreamLog::open(sim_config(&disk)));
                let start = disk.stats().mutating_ops;
                disk.power_fails_at_op(start + op);
                for batch in 0..6u64 {
                    for i in batch * 7..batch * 7 + 7 {
                        let a = Arc::clone(&acked);
                        let _ = log.append(
                            i,
                            body(i),
                            Some(Box::new(move |r| {
                                if let Ok(o) = r {
                                    a.lock().push(o);
                                }
                            })),
                        );
                    }
                    log.step();
                }
                disk.stats().power_losses > 0
            };
            if !crashed {
                break; // every point of the run was tried
            }
            let (log, rec) = match StreamLog::open(sim_config(&disk)) {
                Ok(x) => x,
                Err(e) => panic!(
                    "seed {seed} op {op}: reopen failed: {e}\n{:#?}",
                    disk.trace()
                ),
            };
            let acked = acked.lock().clone();
            let got = read_all(&log, 0);
            for &o in &acked {
                let r = got.iter().find(|r| r.offset == o);
                assert_eq!(
                    r.map(|r| &r.body),
                    Some(&body(o)),
                    "seed {seed} op {op}: acknowledged offset {o} lost\n{rec:?}"
                );
            }
            let offsets: Vec<u64> = got.iter().map(|r| r.offset).collect();
            assert_eq!(
                offsets,
                (0..got.len() as u64).collect::<Vec<_>>(),
                "seed {seed} op {op}: dense, no garbage"
            );
            assert!(
                rec.lost.is_empty(),
                "seed {seed} op {op}: a crash is a torn tail, not damage: {rec:?}"
            );
            let next = ok(log.append(99, body(1000), None));
            ok(log.flush());
            assert_eq!(next, got.len() as u64, "seed {seed} op {op}");
            match log.read(next, 1, 1 << 20) {
                Ok(r) => assert_eq!(r.records[0].body, body(1000)),
                Err(e) => panic!("seed {seed} op {op}: {e}\n{rec:?}\n{:#?}", disk.trace()),
            }
            op += 1;
        }
        assert!(op > 20, "the run had {op} points to crash at");
    }
}

#[test]
fn a_failed_fdatasync_fails_the_batch_and_every_later_append() {
    let disk = SimDisk::new(6);
    let (log, _) = ok(StreamLog::open(sim_config(&disk)));
    let results = Arc::new(Mutex::new(Vec::new()));
    disk.fail_next(crate::sim::SimOp::Sync, None);
    for i in 0..3 {
        let r = Arc::clone(&results);
        ok(log.append(
            1,
            body(i),
            Some(Box::new(move |x| r.lock().push(x.is_ok()))),
        ));
    }
    log.step();
    let r = Arc::clone(&results);
    ok(log.append(
        1,
        body(9),
        Some(Box::new(move |x| r.lock().push(x.is_ok()))),
    ));
    log.step();
    assert_eq!(*results.lock(), vec![false; 4]);
    assert!(
        ok(log.read(0, 10, 1 << 20)).records.is_empty(),
        "nothing readable that may be lost"
    );
}

#[test]
fn a_background_writer_batches_concurrent_producers_on_a_real_disk() {
    let d = ok(tempfile::tempdir());
    let mut c = LogConfig::new(d.path().join("s"));
    c.segment_bytes = 64 * 1024;
    let (log, _) = ok(StreamLog::open(c.clone()));
    let log = Arc::new(log);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0..250u64 {
                    let (tx, rx) = std::sync::mpsc::channel();
                    ok(log.append(
                        1,
                        body(t * 1000 + i),
                        Some(Box::new(move |r| {
                            let _ = tx.send(r.is_ok());
                        })),
                    ));
                    assert_eq!(rx.recv().ok(), Some(true));
                }
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().is_ok());
    }
    let s = log.stats();
    assert_eq!(s.records, 1000);
    assert!(s.syncs < 1000, "group commit: {s:?}");
    drop(log);
    let (log, rec) = ok(StreamLog::open(c));
    assert_eq!(rec.next_offset, 1000);
    assert_eq!(read_all(&log, 0).len(), 1000);
}

/// Readers at the tail read the newest batches from memory (the tail
/// cache), older ones from the files, and both give the same records: a
/// log with the cache and one without, fed the same batches, read the
/// same from every offset; reads of the active segment's file made to
/// return damaged bytes do not touch records the cache holds.
#[test]
fn the_tail_cache_serves_the_newest_batches_without_reading_the_files() {
    let disk = SimDisk::new(21);
    let mut cached = sim_config(&disk);
    cached.segment_bytes = 64 * 1024;
    cached.tail_cache_bytes = 8 * 1024;
    cached.tail_cache_budget = TailCacheBudget::new(1 << 20);
    let mut plain = sim_config(&disk);
    plain.dir = "/sim/streams/s2".into();
    plain.segment_bytes = 64 * 1024;
    plain.tail_cache_bytes = 0;
    let (a, _) = ok(StreamLog::open(cached));
    let (b, _) = ok(StreamLog::open(plain));
    // Batches of 10: several segments, and more than the cache holds.
    for batch in 0..60u64 {
        append_all(&a, batch * 10, 10, |i| i);
        append_all(&b, batch * 10, 10, |i| i);
    }
    for from in (0..=600).step_by(7) {
        assert_eq!(read_all(&a, from), read_all(&b, from), "from {from}");
    }
    // Damage every read of the active segment: what the cache holds is
    // still read whole, what it does not is read from the file (and found
    // damaged).
    let bounds = a.bounds();
    let active_base = {
        let view = a.inner.view.lock();
        *view.segments.keys().next_back().expect("a segment")
    };
    let active = Path::new("/sim/streams/s1").join(format::segment_name(active_base));
    disk.corrupt_reads(&active, 0, 1 << 20);
    let tail = ok(a.read(bounds.next - 5, 100, 1 << 20));
    assert_eq!(tail.records.len(), 5);
    assert_eq!(tail.records[4].body, body(599));
    assert!(
        a.read(active_base, 1, 1 << 20).is_err(),
        "the start of the active segment is not cached here, and its read is damaged"
    );
    // An idle log's cache goes at its second retention run.
    ok(a.apply_retention(0));
    ok(a.apply_retention(0));
    assert!(a.read(bounds.next - 5, 100, 1 << 20).is_err());
}

/// A read asked for few bytes of many records fetches about those bytes
/// from the file, not a chunk sized by the record count: a stream reader
/// that keeps only a read-ahead waiting asks for that, and its deliveries
/// are slices of (and pin) the chunk.
#[test]
fn a_read_bounded_by_bytes_fetches_about_those_bytes_from_the_file() {
    let disk = SimDisk::new(22);
    let mut c = sim_config(&disk);
    c.segment_bytes = 4 * 1024 * 1024;
    c.tail_cache_bytes = 0;
    let (log, _) = ok(StreamLog::open(c));
    let record = Bytes::from(vec![b'x'; 1024]);
    for _ in 0..2000 {
        ok(log.append(1, record.clone(), None));
    }
    ok(log.flush());
    let read = ok(log.read(100, 1000, 8 * 1024));
    assert_eq!(read.records.first().map(|r| r.offset), Some(100));
    assert!(read.records.len() >= 8, "{} records", read.records.len());
    let fetched = disk.stats().largest_read;
    assert!(
        fetched <= 8 * 1024 + 2 * 1024 + LOG_INDEX_INTERVAL_BYTES,
        "one read of {fetched} bytes for 8 KiB of records"
    );
    // Asked for more bytes than the records, it still reads what they span.
    let read = ok(log.read(100, 100, 1 << 20));
    assert_eq!(read.records.len(), 100);
    assert_eq!(read.records[99].body, record);
}

/// `read_cached` reads what memory holds and stops, saying so, before a
/// file read the page cache would not serve; `read` reads it anyway.
#[test]
fn a_cached_only_read_stops_before_the_device_and_a_plain_read_does_not() {
    let disk = SimDisk::new(23);
    let mut c = sim_config(&disk);
    c.segment_bytes = 64 * 1024;
    c.tail_cache_bytes = 8 * 1024;
    c.tail_cache_budget = TailCacheBudget::new(1 << 20);
    let (log, _) = ok(StreamLog::open(c));
    for batch in 0..30u64 {
        append_all(&log, batch * 10, 10, |i| i);
    }
    disk.set_uncached(true);
    let r = ok(log.read_cached(0, 10, 1 << 20));
    assert!(r.uncached && r.records.is_empty(), "{r:?}");
    assert_eq!(ok(log.read(0, 10, 1 << 20)).records.len(), 10);
    // The newest records are in the tail cache: memory, read either way.
    let next = log.bounds().next;
    let tail = ok(log.read_cached(next - 3, 10, 1 << 20));
    assert_eq!((tail.records.len(), tail.uncached), (3, false));
    disk.set_uncached(false);
    let r = ok(log.read_cached(0, 10, 1 << 20));
    assert_eq!((r.records.len(), r.uncached), (10, false));
}

/// A record larger than a read chunk is read from the file apart from its
/// chunk: `read_cached` probes that read too, and stops before it when
/// the page cache does not hold the record's bytes.
#[test]
fn a_cached_only_read_stops_before_a_record_larger_than_its_chunk_that_is_not_cached() {
    let disk = SimDisk::new(29);
    let mut c = sim_config(&disk);
    c.segment_bytes = 4 * 1024 * 1024;
    c.tail_cache_bytes = 0;
    let (log, _) = ok(StreamLog::open(c));
    ok(log.append(1, Bytes::from_static(b"small"), None));
    let big = Bytes::from(vec![b'b'; LOG_READ_CHUNK_BYTES + 64 * 1024]);
    ok(log.append(1, big.clone(), None));
    ok(log.flush());
    // The page cache holds the segment's first chunk and not the rest of
    // the big record, which starts inside that chunk.
    disk.set_uncached_from((LOG_READ_CHUNK_BYTES + 4096) as u64);
    let r = ok(log.read_cached(0, 10, 1 << 24));
    assert_eq!(r.records.len(), 1, "the small record only: {r:?}");
    assert!(r.uncached, "{r:?}");
    let r = ok(log.read_cached(1, 10, 1 << 24));
    assert!(r.uncached && r.records.is_empty(), "{r:?}");
    // A plain read reads it from the device, whole.
    let r = ok(log.read(1, 10, 1 << 24));
    assert_eq!(r.records.len(), 1);
    assert_eq!(r.records[0].body, big);
    disk.set_uncached(false);
    let r = ok(log.read_cached(1, 10, 1 << 24));
    assert_eq!((r.records.len(), r.uncached), (1, false));
}
