//! Store-level tests: group commit, rollover, recovery of torn and corrupt
//! tails, compaction.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use bytes::Bytes;

use super::segment::{self, SegmentScanner, SEGMENT_HEADER_BYTES};
use super::*;

fn tmp() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    }
}

fn config(dir: &Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.compaction_enabled = false;
    c
}

/// [`Recovered`] with its messages read back (what the tests look at).
#[derive(Debug)]
struct Rec {
    queues: Vec<QueueDef>,
    bindings: Vec<BindingDef>,
    messages: Vec<RecoveredMessage>,
    retained: Vec<(String, MessageSeq, Bytes)>,
    state: Vec<(String, Bytes)>,
    next_seq: MessageSeq,
    next_queue_id: QueueId,
    report: RecoveryReport,
}

fn open(c: StoreConfig) -> (Store, Rec) {
    let (store, r) = match Store::open(c) {
        Ok(x) => x,
        Err(e) => panic!("open: {e}"),
    };
    let rec = Rec {
        queues: r.queues,
        bindings: r.bindings,
        messages: ok(r.messages.read_all()),
        retained: r.retained,
        state: r.state,
        next_seq: r.next_seq,
        next_queue_id: r.next_queue_id,
        report: r.report,
    };
    (store, rec)
}

fn ok<T>(r: Result<T, StoreError>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("store error: {e}"),
    }
}

fn msg(seq: MessageSeq, queues: &[QueueId], body: &str) -> Record {
    Record::Message {
        seq,
        queues: queues.to_vec(),
        body: opaque(body),
    }
}

/// A message body as the store sees one: bytes it does not interpret.
fn opaque(body: &str) -> Opaque {
    Opaque::Bytes(Bytes::copy_from_slice(body.as_bytes()))
}

fn declare(id: QueueId, name: &str) -> Record {
    Record::QueueDeclare(QueueDef {
        id,
        name: name.into(),
        attributes: Bytes::from_static(b"permanent"),
    })
}

/// Appends and waits for the completion.
fn commit(store: &Store, records: Vec<Record>) {
    let (tx, rx) = mpsc::channel();
    store.append(
        records,
        Some(Box::new(move |r| {
            let _ = tx.send(r);
        })),
    );
    match rx.recv() {
        Ok(r) => ok(r),
        Err(e) => panic!("completion never ran: {e}"),
    }
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(segment::parse_file_name)
                    .is_some()
            })
            .collect(),
        Err(e) => panic!("read_dir: {e}"),
    };
    v.sort();
    v
}

/// (offset, len) of every entry in a segment file.
fn entries(path: &Path) -> Vec<(u64, u64)> {
    let id = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(segment::parse_file_name)
        .unwrap_or(0);
    let mut s = match SegmentScanner::open(&OsStorage, path, id) {
        Ok(s) => s,
        Err(e) => panic!("scan {}: {e:?}", path.display()),
    };
    let mut out = Vec::new();
    while let Ok(Some(e)) = s.next_entry() {
        out.push((e.offset, e.len));
    }
    out
}

fn seqs(r: &Rec) -> Vec<MessageSeq> {
    r.messages.iter().map(|m| m.seq).collect()
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn mutate(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) => panic!("read: {e}"),
    };
    f(&mut data);
    if let Err(e) = std::fs::write(path, data) {
        panic!("write: {e}");
    }
}

#[test]
fn every_record_kind_survives_reopen() {
    let d = tmp();
    let (store, rec) = open(config(d.path()));
    assert!(rec.messages.is_empty());
    assert_eq!(rec.next_seq, 0);
    // The store keeps message bodies as they are; binary, with every byte value.
    let full = Opaque::Bytes((0..=255u8).cycle().take(1000).collect::<Vec<u8>>().into());
    commit(
        &store,
        vec![
            declare(1, "q1"),
            Record::QueueDeclare(QueueDef {
                id: 2,
                name: "q2".into(),
                attributes: Bytes::from_static(b"idle 500"),
            }),
            Record::Bind(BindingDef {
                queue: 1,
                filter: "a/#".into(),
                options: Bytes::from_static(b"opts-1"),
            }),
        ],
    );
    commit(
        &store,
        vec![Record::Message {
            seq: 5,
            queues: vec![1, 2],
            body: full.clone(),
        }],
    );
    commit(
        &store,
        vec![
            Record::DeliveryState {
                queue: 2,
                seq: 5,
                state: Bytes::from_static(b"ds-4-ann"),
            },
            Record::Retain {
                topic: "t".into(),
                message: Some((6, full.clone())),
            },
            Record::State {
                key: "k".into(),
                value: Some(Bytes::from_static(b"v")),
            },
        ],
    );
    ok(store.close());
    let (store, rec) = open(config(d.path()));
    assert_eq!(rec.queues.len(), 2);
    assert_eq!(rec.queues[1].attributes, Bytes::from_static(b"idle 500"));
    assert_eq!(rec.bindings.len(), 1);
    assert_eq!(rec.bindings[0].options, Bytes::from_static(b"opts-1"));
    assert_eq!(rec.messages.len(), 1);
    assert_eq!(
        rec.messages[0].body,
        full.to_bytes(),
        "message round-trips through disk"
    );
    assert_eq!(
        rec.messages[0].queues,
        vec![
            RecoveredPlacement {
                queue: 1,
                state: None,
            },
            RecoveredPlacement {
                queue: 2,
                state: Some(Bytes::from_static(b"ds-4-ann")),
            },
        ]
    );
    assert_eq!(rec.retained.len(), 1);
    assert_eq!(rec.retained[0].1, 6);
    assert_eq!(rec.state, vec![("k".to_owned(), Bytes::from_static(b"v"))]);
    assert_eq!(rec.next_seq, 7);
    assert_eq!(rec.next_queue_id, 3);
    assert!(rec.report.damaged.is_empty());
    assert_eq!(rec.report.entries_replayed, 3);
    drop(store);
}

#[test]
fn completions_run_in_call_order_after_the_write() {
    let d = tmp();
    let (store, _) = open(config(d.path()));
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    for i in 0..50u64 {
        let order = order.clone();
        store.append(
            vec![msg(i, &[1], "x")],
            Some(Box::new(move |r| {
                assert!(r.is_ok());
                order.lock().push(i);
            })),
        );
    }
    ok(store.flush());
    assert_eq!(*order.lock(), (0..50).collect::<Vec<_>>());
    let stats = store.stats();
    assert_eq!(stats.commits, 50);
    assert_eq!(stats.records_appended, 50);
    assert!(stats.syncs >= 1 && stats.syncs <= stats.batches + 1);
}

#[test]
fn concurrent_appends_share_syncs() {
    let d = tmp();
    let (store, _) = open(config(d.path()));
    let store = Arc::new(store);
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    commit(&store, vec![msg(t * 1000 + i, &[1], "payload")]);
                }
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().is_ok());
    }
    let stats = store.stats();
    assert_eq!(stats.commits, 800);
    assert!(
        stats.syncs < 800,
        "16 writers awaiting their commits must share syncs: {stats:?}"
    );
}

#[test]
fn appending_from_a_completion_does_not_deadlock() {
    let d = tmp();
    let mut c = config(d.path());
    c.pending_bytes_max = 1; // every append would block if it could
    let (store, _) = open(c);
    let store = Arc::new(store);
    let (tx, rx) = mpsc::channel();
    let inner = store.clone();
    store.append(
        vec![msg(1, &[1], "a")],
        Some(Box::new(move |r| {
            assert!(r.is_ok());
            assert!(matches!(inner.flush(), Err(StoreError::WouldDeadlock)));
            inner.append(
                vec![msg(2, &[1], "b")],
                Some(Box::new(move |r| {
                    let _ = tx.send(r);
                })),
            );
        })),
    );
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(r) => ok(r),
        Err(e) => panic!("nested append never completed: {e}"),
    }
}

#[test]
fn periodic_policy_completes_before_syncing_and_flush_syncs() {
    let d = tmp();
    let mut c = config(d.path());
    c.sync = SyncPolicy::Periodic(Duration::from_secs(3600));
    let (store, _) = open(c);
    let before = store.stats().syncs;
    commit(&store, vec![msg(1, &[1], "a")]);
    commit(&store, vec![msg(2, &[1], "b")]);
    assert_eq!(store.stats().syncs, before, "no sync per commit");
    ok(store.flush());
    assert_eq!(store.stats().syncs, before + 1);
    ok(store.close());
    let (_s, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![1, 2]);
}

#[test]
fn periodic_timer_syncs_without_traffic() {
    let d = tmp();
    let mut c = config(d.path());
    c.sync = SyncPolicy::Periodic(Duration::from_millis(20));
    let (store, _) = open(c);
    let before = store.stats().syncs;
    commit(&store, vec![msg(1, &[1], "a")]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(store.stats().syncs, before + 1);
}

#[test]
fn segments_roll_at_the_configured_size() {
    let d = tmp();
    let mut c = config(d.path());
    c.segment_size_bytes = 2048;
    let (store, _) = open(c.clone());
    let body = "x".repeat(200);
    for i in 0..40 {
        commit(&store, vec![msg(i, &[1], &body)]);
    }
    // One entry larger than a segment gets a segment of its own.
    let big = "y".repeat(5000);
    commit(&store, vec![msg(100, &[1], &big)]);
    commit(&store, vec![msg(101, &[1], "after")]);
    let stats = store.stats();
    ok(store.close());
    let files = segments(d.path());
    assert!(files.len() >= 6, "expected rollovers, got {}", files.len());
    assert_eq!(stats.segments, files.len() as u64);
    let mut big_seen = false;
    for f in &files {
        let len = file_len(f);
        let n = entries(f).len();
        if len > 2048 {
            assert_eq!(n, 1, "only a lone oversized entry may pass the size");
            big_seen = true;
        }
    }
    assert!(big_seen);
    let (_s, rec) = open(c);
    let mut want: Vec<u64> = (0..40).collect();
    want.extend([100, 101]);
    assert_eq!(seqs(&rec), want);
}

/// Writes entries 0..n (one message each) and returns the dir and the path
/// and entry table of the segment that holds them.
fn three_entries() -> (tempfile::TempDir, PathBuf, Vec<(u64, u64)>) {
    let d = tmp();
    let (store, _) = open(config(d.path()));
    for i in 0..3 {
        commit(
            &store,
            vec![
                msg(i, &[1], "some payload"),
                Record::Ack { queue: 9, seq: i },
            ],
        );
    }
    ok(store.close());
    let files = segments(d.path());
    assert_eq!(files.len(), 1);
    let path = files[0].clone();
    let table = entries(&path);
    assert_eq!(table.len(), 3);
    (d, path, table)
}

#[test]
fn torn_entry_header_is_cut() {
    let (d, path, table) = three_entries();
    let (off, _) = table[2];
    mutate(&path, |data| data.truncate(off as usize + 10));
    let (store, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 1]);
    assert_eq!(rec.report.damaged.len(), 1);
    let dmg = &rec.report.damaged[0];
    assert_eq!(dmg.damage, Damage::TornEntryHeader);
    assert_eq!(dmg.offset, off);
    assert_eq!(dmg.end - dmg.offset, 10);
    assert!(dmg.cut);
    assert_eq!(
        file_len(&path),
        off,
        "file truncated at the last good entry"
    );
    assert_eq!(dmg.saved_to.as_deref().map(file_len), Some(10));
    // Writing goes on in a new segment, and the next open is clean.
    commit(&store, vec![msg(7, &[1], "later")]);
    ok(store.close());
    let (_s, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 1, 7]);
    assert!(rec.report.damaged.is_empty());
}

#[test]
fn torn_entry_body_is_cut() {
    let (d, path, table) = three_entries();
    let (off, len) = table[2];
    mutate(&path, |data| data.truncate((off + len - 1) as usize));
    let (_s, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 1]);
    assert_eq!(rec.report.damaged[0].damage, Damage::TornEntryBody);
    assert_eq!(file_len(&path), off);
}

#[test]
fn a_flipped_bit_in_a_middle_entry_loses_only_that_entry() {
    let (d, path, table) = three_entries();
    let (off, len) = table[1];
    let before = file_len(&path);
    mutate(&path, |data| data[(off + len / 2) as usize] ^= 0x04);
    let (store, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 2], "the entry after the damage is kept");
    let dmg = &rec.report.damaged[0];
    assert_eq!(dmg.damage, Damage::BadEntryBodyChecksum);
    assert_eq!((dmg.offset, dmg.end), (off, off + len));
    assert!(!dmg.cut);
    assert_eq!(dmg.lost_entries, Some((1, Some(2))));
    assert_eq!(file_len(&path), before, "left in place, not cut");
    assert_eq!(rec.report.truncated_bytes, 0);
    assert_eq!(rec.report.lost.entries, 1);
    assert_eq!(rec.report.lost.entry_ranges, vec![(1, Some(2))]);
    assert!(!rec.report.is_clean());
    ok(store.close());
    // Reported again until compaction rewrites the segment; nothing new.
    let (_s, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 2]);
    assert_eq!(
        rec.report.lost.entry_ranges,
        vec![(1, Some(2))],
        "{}",
        rec.report
    );
}

#[test]
fn compaction_rewrites_a_segment_with_damage_left_in_place() {
    let (d, path, table) = three_entries();
    let (off, len) = table[1];
    mutate(&path, |data| data[(off + len / 2) as usize] ^= 0x04);
    let mut c = small_compacting(d.path());
    c.segment_size_bytes = 1 << 20;
    let (store, rec) = open(c.clone());
    assert_eq!(rec.report.lost.entries, 1);
    // Mostly live, but damaged: rewritten, so the damage goes.
    ok(store.compact());
    assert!(
        !path.exists(),
        "the damaged segment was rewritten and deleted"
    );
    ok(store.close());
    let (_s, rec) = open(c);
    assert_eq!(seqs(&rec), vec![0, 2]);
    assert!(rec.report.is_clean(), "{}", rec.report);
    assert!(rec.report.damaged.is_empty());
}

#[test]
fn flipped_bit_in_a_header_cuts_there() {
    let (d, path, table) = three_entries();
    let (off, _) = table[2];
    mutate(&path, |data| data[off as usize + 9] ^= 0x80); // body length byte
    let (_s, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 1]);
    assert_eq!(rec.report.damaged[0].damage, Damage::BadEntryHeaderChecksum);
}

#[test]
fn zero_filled_tail_is_cut() {
    let (d, path, _) = three_entries();
    let len = file_len(&path);
    mutate(&path, |data| data.extend(std::iter::repeat_n(0u8, 4096)));
    let (_s, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 1, 2]);
    assert_eq!(rec.report.damaged[0].damage, Damage::BadEntryMagic);
    assert_eq!(file_len(&path), len);
}

#[test]
fn torn_segment_header_drops_the_segment() {
    let (d, path, _) = three_entries();
    // A crash right after creating the next segment file.
    let next = d.path().join(segment::file_name(99));
    if let Err(e) = std::fs::write(&next, [1u8, 2, 3]) {
        panic!("{e}");
    }
    let (store, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 1, 2]);
    assert_eq!(rec.report.damaged.len(), 1);
    assert_eq!(rec.report.damaged[0].damage, Damage::TornSegmentHeader);
    assert!(rec.report.damaged[0].segment_removed);
    assert!(!next.exists());
    assert!(path.exists());
    commit(&store, vec![msg(3, &[1], "x")]);
    ok(store.close());
    let (_s, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 1, 2, 3]);
}

#[test]
fn stale_entry_with_a_wrong_sequence_is_cut() {
    let (d, path, table) = three_entries();
    // Append a copy of entry 0: checksums fine, sequence wrong.
    let (off, len) = table[0];
    mutate(&path, |data| {
        let copy = data[off as usize..(off + len) as usize].to_vec();
        data.extend(copy);
    });
    let (_s, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), vec![0, 1, 2]);
    assert_eq!(rec.report.damaged[0].damage, Damage::EntrySeqMismatch);
}

#[test]
fn newer_format_is_refused_not_truncated() {
    let (d, path, table) = three_entries();
    let (off, _) = table[1];
    mutate(&path, |data| {
        let h = off as usize;
        data[h + 4] = 9; // version 9, then fix the header checksum
        let crc = crc32c::crc32c(&data[h..h + 28]);
        data[h + 28..h + 32].copy_from_slice(&crc.to_le_bytes());
    });
    let before = file_len(&path);
    match Store::open(config(d.path())) {
        Err(StoreError::Unsupported { offset, .. }) => assert_eq!(offset, off),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("opened a journal from a newer format"),
    }
    assert_eq!(file_len(&path), before, "nothing truncated");
}

#[test]
fn atomic_unit_is_all_or_nothing() {
    let d = tmp();
    let (store, _) = open(config(d.path()));
    commit(&store, vec![declare(1, "q")]);
    commit(
        &store,
        vec![
            msg(1, &[1], "a"),
            msg(2, &[1], "b"),
            Record::Ack { queue: 1, seq: 1 },
        ],
    );
    ok(store.close());
    let path = segments(d.path())[0].clone();
    let table = entries(&path);
    let (off, len) = table[1];
    mutate(&path, |data| data.truncate((off + len - 3) as usize));
    let (_s, rec) = open(config(d.path()));
    assert_eq!(rec.queues.len(), 1);
    assert!(rec.messages.is_empty(), "no part of the torn unit replayed");
}

fn small_compacting(dir: &Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.segment_size_bytes = 4096;
    c.compaction_enabled = true;
    c.compaction_interval = Duration::from_secs(3600);
    c.rewrite_min_age = Duration::ZERO;
    c
}

#[test]
fn recently_closed_segments_are_deleted_when_dead_but_not_rewritten() {
    let d = tmp();
    let mut c = small_compacting(d.path());
    c.rewrite_min_age = Duration::from_secs(3600);
    let (store, _) = open(c.clone());
    commit(&store, vec![declare(1, "q")]);
    commit(&store, vec![msg(0, &[1], "pins the first segment")]);
    let body = "z".repeat(300);
    for seq in 1..200u64 {
        commit(&store, vec![msg(seq, &[1], &body)]);
        commit(&store, vec![Record::Ack { queue: 1, seq }]);
    }
    ok(store.flush());
    ok(store.compact());
    let stats = store.stats();
    assert!(stats.segments_deleted > 10, "dead ones go: {stats:?}");
    assert_eq!(stats.segments_rewritten, 0, "too young to copy: {stats:?}");
    assert!(
        segments(d.path()).len() <= 3,
        "the pinned one, the active one, maybe one just closed"
    );
    ok(store.close());
    // After a restart the pinned segment counts as old.
    let (store, rec) = open(c);
    assert_eq!(seqs(&rec), vec![0]);
    ok(store.compact());
    assert!(store.stats().segments_rewritten >= 1, "{:?}", store.stats());
    ok(store.close());
}

#[test]
fn one_unacked_message_does_not_pin_old_segments() {
    let d = tmp();
    let (store, _) = open(small_compacting(d.path()));
    commit(&store, vec![declare(1, "q")]);
    commit(&store, vec![msg(0, &[1], "the one that stays")]);
    let body = "z".repeat(300);
    for seq in 1..400u64 {
        commit(&store, vec![msg(seq, &[1], &body)]);
        commit(&store, vec![Record::Ack { queue: 1, seq }]);
    }
    ok(store.flush());
    let written = store.stats();
    ok(store.compact());
    let stats = store.stats();
    assert!(
        written.segments_deleted > 20,
        "rollovers must have compacted along the way: {written:?}"
    );
    assert!(
        stats.segments <= 3,
        "one live message must not pin segments: {stats:?}"
    );
    assert!(stats.segments_rewritten >= 1, "{stats:?}");
    ok(store.close());
    let (_s, rec) = open(small_compacting(d.path()));
    assert_eq!(seqs(&rec), vec![0]);
    assert_eq!(rec.messages[0].body, Bytes::from("the one that stays"));
    assert_eq!(rec.messages[0].queues.len(), 1);
    assert_eq!(rec.queues.len(), 1);
    assert!(
        rec.next_seq >= 400,
        "numbering never goes back: {}",
        rec.next_seq
    );
    assert!(segments(d.path()).len() <= 4);
}

#[test]
fn rewritten_message_keeps_only_live_queues_and_its_delivery_state() {
    let d = tmp();
    let mut c = small_compacting(d.path());
    c.compaction_enabled = false;
    let (store, _) = open(c.clone());
    commit(
        &store,
        vec![declare(1, "a"), declare(2, "b"), declare(3, "c")],
    );
    commit(&store, vec![msg(10, &[1, 2, 3], "fanout")]);
    commit(
        &store,
        vec![Record::DeliveryState {
            queue: 2,
            seq: 10,
            state: Bytes::from_static(b"ds-3-ann"),
        }],
    );
    commit(&store, vec![Record::Ack { queue: 1, seq: 10 }]);
    // Fill segments with garbage that dies.
    let body = "g".repeat(500);
    for seq in 100..140u64 {
        commit(
            &store,
            vec![msg(seq, &[3], &body), Record::Ack { queue: 3, seq }],
        );
    }
    ok(store.close());
    let first = segments(d.path())[0].clone();
    let saved = match std::fs::read(&first) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let mut c2 = c.clone();
    c2.compaction_enabled = true;
    let (store, rec) = open(c2.clone());
    ok(store.compact());
    assert!(!first.exists(), "first segment rewritten and deleted");
    ok(store.close());
    let check = |rec: &Rec| {
        assert_eq!(seqs(rec), vec![10]);
        assert_eq!(
            rec.messages[0].queues,
            vec![
                RecoveredPlacement {
                    queue: 2,
                    state: Some(Bytes::from_static(b"ds-3-ann")),
                },
                RecoveredPlacement {
                    queue: 3,
                    state: None,
                },
            ]
        );
        assert_eq!(rec.queues.len(), 3);
    };
    check(&rec);
    let (store, rec) = open(c.clone());
    check(&rec);
    ok(store.close());
    // A crash between the rewrite and the delete: the old segment is back.
    if let Err(e) = std::fs::write(&first, &saved) {
        panic!("{e}");
    }
    let (store, rec) = open(c);
    check(&rec);
    ok(store.close());
    // And compaction copes with the duplicate.
    let (store, rec) = open(c2.clone());
    check(&rec);
    ok(store.compact());
    ok(store.close());
    let (_s, rec) = open(c2);
    check(&rec);
}

#[test]
fn deletes_and_replacements_survive_compaction() {
    let d = tmp();
    let (store, _) = open(small_compacting(d.path()));
    let filler = "f".repeat(400);
    commit(&store, vec![declare(1, "keep"), declare(2, "gone")]);
    commit(
        &store,
        vec![Record::State {
            key: "k".into(),
            value: Some(Bytes::from_static(b"old")),
        }],
    );
    commit(&store, vec![msg(1, &[2], "in deleted queue")]);
    for seq in 10..30u64 {
        commit(
            &store,
            vec![msg(seq, &[1], &filler), Record::Ack { queue: 1, seq }],
        );
    }
    commit(&store, vec![Record::QueueDelete { queue: 2 }]);
    commit(
        &store,
        vec![Record::State {
            key: "k".into(),
            value: Some(Bytes::from_static(b"new")),
        }],
    );
    commit(
        &store,
        vec![Record::Retain {
            topic: "t".into(),
            message: Some((50, opaque("r"))),
        }],
    );
    commit(
        &store,
        vec![Record::Retain {
            topic: "t".into(),
            message: None,
        }],
    );
    for seq in 30..60u64 {
        commit(
            &store,
            vec![msg(seq, &[1], &filler), Record::Ack { queue: 1, seq }],
        );
    }
    ok(store.compact());
    let stats = store.stats();
    ok(store.close());
    assert!(stats.segments <= 4, "{stats:?}");
    let (_s, rec) = open(small_compacting(d.path()));
    assert_eq!(rec.queues.iter().map(|q| q.id).collect::<Vec<_>>(), vec![1]);
    assert!(rec.messages.is_empty());
    assert!(rec.retained.is_empty());
    assert_eq!(
        rec.state,
        vec![("k".to_owned(), Bytes::from_static(b"new"))]
    );
    assert!(rec.next_seq >= 60);
}

#[test]
fn close_writes_everything_and_reports_ok() {
    let d = tmp();
    let (store, _) = open(config(d.path()));
    let done = Arc::new(AtomicUsize::new(0));
    for i in 0..100 {
        let done = done.clone();
        store.append(
            vec![msg(i, &[1], "x")],
            Some(Box::new(move |r| {
                assert!(r.is_ok());
                done.fetch_add(1, Ordering::SeqCst);
            })),
        );
    }
    ok(store.close());
    assert_eq!(done.load(Ordering::SeqCst), 100);
    let (_s, rec) = open(config(d.path()));
    assert_eq!(rec.messages.len(), 100);
}

#[test]
fn invalid_config_is_refused() {
    let d = tmp();
    let mut c = config(d.path());
    c.segment_size_bytes = 10;
    assert!(matches!(Store::open(c), Err(StoreError::Config(_))));
}

#[test]
fn first_segment_header_is_valid() {
    let d = tmp();
    let (store, _) = open(config(d.path()));
    ok(store.close());
    let files = segments(d.path());
    assert_eq!(files.len(), 1);
    assert_eq!(file_len(&files[0]), SEGMENT_HEADER_BYTES as u64);
}

#[test]
fn backpressure_blocks_producers_without_losing_or_deadlocking() {
    let d = tmp();
    let mut c = config(d.path());
    c.pending_bytes_max = 4096; // a few entries
    let (store, _) = open(c);
    let store = Arc::new(store);
    let done = Arc::new(AtomicUsize::new(0));
    let max_pending = Arc::new(AtomicUsize::new(0));
    let body = "p".repeat(1000);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let store = store.clone();
            let done = done.clone();
            let max_pending = max_pending.clone();
            let body = body.clone();
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    let done = done.clone();
                    store.append(
                        vec![msg(t * 1000 + i, &[1], &body)],
                        Some(Box::new(move |r| {
                            assert!(r.is_ok());
                            done.fetch_add(1, Ordering::SeqCst);
                        })),
                    );
                    let pending = store.stats().pending_bytes as usize;
                    max_pending.fetch_max(pending, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().is_ok());
    }
    ok(store.flush());
    assert_eq!(done.load(Ordering::SeqCst), 800);
    // One entry may be admitted over the bound when the queue was empty.
    assert!(
        max_pending.load(Ordering::SeqCst) <= 4096 + 1200,
        "pending bytes exceeded the bound: {}",
        max_pending.load(Ordering::SeqCst)
    );
}

#[test]
fn a_second_store_on_the_same_directory_is_refused_until_the_first_closes() {
    let dir = tmp();
    let (first, _) = open(config(dir.path()));
    match Store::open(config(dir.path())) {
        Err(StoreError::Locked(d)) => assert_eq!(d, dir.path()),
        Err(e) => panic!("expected Locked, got {e}"),
        Ok(_) => panic!("two stores opened one journal"),
    }
    ok(first.close());
    let (again, _) = open(config(dir.path()));
    ok(again.close());
}

fn open_lazy(c: StoreConfig) -> (Store, Recovered) {
    match Store::open(c) {
        Ok(x) => x,
        Err(e) => panic!("open: {e}"),
    }
}

fn body_of(m: &RecoveredMessage) -> String {
    String::from_utf8_lossy(&m.body).into_owned()
}

#[test]
fn compaction_rewrites_wait_until_the_recovered_messages_are_read() {
    let d = tmp();
    let mut c = small_compacting(d.path());
    c.compaction_enabled = false;
    let (store, _) = open(c.clone());
    commit(&store, vec![declare(1, "q")]);
    // Small live messages between big dead ones: mostly-dead segments that
    // compaction wants to rewrite (move) while their live messages are
    // still to be read back from where they are.
    let dead = "d".repeat(600);
    for seq in 0..60u64 {
        if seq % 2 == 0 {
            commit(&store, vec![msg(seq, &[1], &format!("live-{seq}"))]);
        } else {
            commit(&store, vec![msg(seq, &[1], &dead)]);
            commit(&store, vec![Record::Ack { queue: 1, seq }]);
        }
    }
    // One entry of several messages: read back by record index.
    commit(
        &store,
        (100..110u64)
            .map(|s| msg(s, &[1], &format!("live-{s}")))
            .collect(),
    );
    ok(store.close());

    c.compaction_enabled = true;
    let (store, r) = open_lazy(c);
    let mut messages = r.messages;
    assert_eq!(messages.len(), 40);
    ok(store.compact());
    assert_eq!(store.stats().segments_rewritten, 0, "rewrites wait");
    let mut got: Vec<RecoveredMessage> = ok(messages.by_ref().take(10).collect());
    ok(store.compact());
    assert_eq!(store.stats().segments_rewritten, 0, "still 30 to read");
    got.extend(ok(messages.collect::<Result<Vec<_>, _>>()));
    ok(store.compact());
    assert!(
        store.stats().segments_rewritten > 0,
        "rewrites go on once all are read: {:?}",
        store.stats()
    );
    let want: Vec<u64> = (0..60).step_by(2).chain(100..110).collect();
    assert_eq!(got.iter().map(|m| m.seq).collect::<Vec<_>>(), want);
    for m in &got {
        assert_eq!(body_of(m), format!("live-{}", m.seq));
    }
    ok(store.close());
    // And the rewritten journal recovers the same messages.
    let (_s, rec) = open(small_compacting(d.path()));
    assert_eq!(seqs(&rec), want);
}

#[test]
fn a_recovered_message_damaged_after_replay_is_an_error_not_a_wrong_message() {
    let d = tmp();
    let (store, _) = open(config(d.path()));
    commit(&store, vec![declare(1, "q")]);
    for seq in 0..3u64 {
        commit(&store, vec![msg(seq, &[1], &format!("body-{seq}"))]);
    }
    ok(store.close());
    let (_store, r) = open_lazy(config(d.path()));
    // Damage the middle message's entry between replay and reading it.
    let path = segments(d.path())[0].clone();
    let (off, len) = entries(&path)[2];
    mutate(&path, |data| data[(off + len - 2) as usize] ^= 0xff);
    let got: Vec<Result<RecoveredMessage, StoreError>> = r.messages.collect();
    assert_eq!(got.len(), 3);
    assert!(matches!(&got[0], Ok(m) if body_of(m) == "body-0"));
    assert!(
        matches!(&got[1], Err(StoreError::Corrupt { .. })),
        "{:?}",
        got[1]
    );
    assert!(matches!(&got[2], Ok(m) if body_of(m) == "body-2"));
}

#[test]
fn messages_of_an_entry_larger_than_the_read_window_come_back() {
    let d = tmp();
    let (store, _) = open(config(d.path()));
    commit(&store, vec![declare(1, "q")]);
    commit(&store, vec![msg(0, &[1], "before")]);
    // One 3 MiB entry of 3000 messages, then a small one after it.
    let big: Vec<Record> = (1..=3000u64)
        .map(|s| msg(s, &[1], &format!("{s:04}{}", "b".repeat(1020))))
        .collect();
    commit(&store, big);
    commit(&store, vec![msg(3001, &[1], "after")]);
    ok(store.close());
    let (_s, rec) = open(config(d.path()));
    assert_eq!(seqs(&rec), (0..=3001).collect::<Vec<_>>());
    for m in &rec.messages[1..=3000] {
        assert_eq!(body_of(m)[..4], format!("{:04}", m.seq));
        assert_eq!(m.body.len(), 1024);
    }
    assert_eq!(body_of(&rec.messages[3001]), "after");
}

fn manual(disk: &sim::SimDisk) -> StoreConfig {
    let mut c = StoreConfig::new("/sim/journal");
    c.storage = Arc::new(disk.attach());
    c.background_writer = false;
    c.compaction_enabled = false;
    c
}

#[test]
fn a_manual_writer_writes_only_when_stepped_and_completes_on_the_stepping_thread() {
    let disk = sim::SimDisk::new(7);
    let (store, _) = open(manual(&disk));
    let done = Arc::new(parking_lot::Mutex::new(Vec::new()));
    for i in 0..3u64 {
        let done = done.clone();
        store.append(
            vec![msg(i, &[1], "x")],
            Some(Box::new(move |r| {
                done.lock()
                    .push((i, r.is_ok(), std::thread::current().id()));
            })),
        );
    }
    let before = disk.stats();
    assert!(done.lock().is_empty(), "nothing runs by itself");
    assert_eq!(disk.stats(), before, "nor touches the disk");
    assert!(store.step());
    let me = std::thread::current().id();
    assert_eq!(
        *done.lock(),
        vec![(0, true, me), (1, true, me), (2, true, me)]
    );
    assert_eq!(disk.stats().syncs, before.syncs + 1, "one batch, one sync");
    assert!(store.step(), "an idle step is harmless");
    ok(store.flush());
    ok(store.close());
    let (_s, rec) = open(manual(&disk));
    assert_eq!(seqs(&rec), vec![0, 1, 2]);
}
