//! Every case of the recovery table (see `src/store/recovery.rs`), on real
//! files and on the simulated disk.
//!
//! Each test builds the same journal on both (two durable queues, one
//! message per entry, small segments so there are several), damages it
//! the same way through [`Disk`], reopens, and checks what came back and
//! what the report says was lost. The few cases only one of the two can
//! produce say so.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use bytes::Bytes;
use rosetta::core::codec;
use rosetta::store::segment::{self, SegmentHeader, SegmentScanner, SEGMENT_HEADER_BYTES};
use rosetta::store::sim::{SimDisk, SimOp};
use rosetta::store::{
    Damage, ManifestState, MessageSeq, Opaque, OsStorage, Record, RecoveryReport, Store,
    StoreConfig, StoreError,
};
use rosetta_neutral::QueueLifetime;

/// Each segment with its entries: (path, [(offset, len, entry seq)]).
type Layout = Vec<(PathBuf, Vec<(u64, u64, u64)>)>;

/// Messages written, one entry each.
const MESSAGES: u64 = 40;

/// A place to build, damage and reopen a journal.
trait Disk {
    fn name(&self) -> &'static str;
    fn dir(&self) -> PathBuf;
    fn storage(&self) -> Arc<dyn rosetta::store::Storage>;
    fn read(&self, path: &Path) -> Vec<u8>;
    /// Replaces the file's contents (durably).
    fn write(&self, path: &Path, bytes: &[u8]);
    fn remove(&self, path: &Path);
    fn exists(&self, path: &Path) -> bool;
    fn list(&self) -> Vec<PathBuf>;

    fn config(&self) -> StoreConfig {
        let mut c = StoreConfig::new(self.dir());
        c.storage = self.storage();
        c.segment_size_bytes = 2048;
        // The cases reason about raw positions: compaction would move them.
        c.compaction_enabled = false;
        c
    }
    fn flip(&self, path: &Path, offset: u64) {
        let mut d = self.read(path);
        d[offset as usize] ^= 0x5A;
        self.write(path, &d);
    }
    fn truncate(&self, path: &Path, len: u64) {
        let mut d = self.read(path);
        d.truncate(len as usize);
        self.write(path, &d);
    }
    fn segments(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .list()
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(segment::parse_file_name)
                    .is_some()
            })
            .collect();
        v.sort();
        v
    }
}

struct Real(tempfile::TempDir);

impl Disk for Real {
    fn name(&self) -> &'static str {
        "real files"
    }
    fn dir(&self) -> PathBuf {
        self.0.path().join("journal")
    }
    fn storage(&self) -> Arc<dyn rosetta::store::Storage> {
        Arc::new(OsStorage)
    }
    fn read(&self, path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap_or_default()
    }
    fn write(&self, path: &Path, bytes: &[u8]) {
        if let Err(e) = std::fs::write(path, bytes) {
            panic!("write {}: {e}", path.display());
        }
    }
    fn remove(&self, path: &Path) {
        if let Err(e) = std::fs::remove_file(path) {
            panic!("remove {}: {e}", path.display());
        }
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn list(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.dir())
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    }
}

struct Sim(SimDisk);

impl Disk for Sim {
    fn name(&self) -> &'static str {
        "simulated disk"
    }
    fn dir(&self) -> PathBuf {
        PathBuf::from("/sim/cases/journal")
    }
    fn storage(&self) -> Arc<dyn rosetta::store::Storage> {
        Arc::new(self.0.attach())
    }
    fn read(&self, path: &Path) -> Vec<u8> {
        self.0.contents(path).unwrap_or_default()
    }
    fn write(&self, path: &Path, bytes: &[u8]) {
        let s = self.0.attach();
        let r = (|| {
            use rosetta::store::Storage;
            let f = s.create(path, true)?;
            f.write_at(bytes, 0)?;
            f.sync_data()?;
            s.sync_dir(&self.dir())
        })();
        if let Err(e) = r {
            panic!("write {}: {e}", path.display());
        }
    }
    fn remove(&self, path: &Path) {
        if let Err(e) = self.0.lose_file(path) {
            panic!("lose {}: {e}", path.display());
        }
    }
    fn exists(&self, path: &Path) -> bool {
        self.0.contents(path).is_some()
    }
    fn list(&self) -> Vec<PathBuf> {
        self.0.files(&self.dir())
    }
}

fn disks() -> Vec<Box<dyn Disk>> {
    let real = match tempfile::tempdir() {
        Ok(d) => Real(d),
        Err(e) => panic!("tempdir: {e}"),
    };
    vec![Box::new(real), Box::new(Sim(SimDisk::new(42)))]
}

fn commit(store: &Store, records: Vec<Record>) {
    let (tx, rx) = mpsc::channel();
    store.append(
        records,
        Some(Box::new(move |r| {
            let _ = tx.send(r);
        })),
    );
    match rx.recv() {
        Ok(Ok(())) => {}
        other => panic!("append: {other:?}"),
    }
}

fn body(seq: MessageSeq) -> String {
    format!("message {seq} {}", "p".repeat(150))
}

fn queue_of(seq: MessageSeq) -> u64 {
    seq % 2 + 1
}

/// Two queues, then messages 0..MESSAGES, one entry each. Returns the
/// entries of each segment: (path, [(offset, len, entry seq)]).
fn build(disk: &dyn Disk) -> Layout {
    let (store, _) = open(disk);
    commit(
        &store,
        vec![
            codec::queue_declare_record(1, "orders", QueueLifetime::Permanent),
            codec::queue_declare_record(2, "billing", QueueLifetime::Permanent),
        ],
    );
    for seq in 0..MESSAGES {
        commit(
            &store,
            vec![Record::Message {
                seq,
                queues: vec![queue_of(seq)],
                body: Opaque::Bytes(Bytes::from(body(seq))),
            }],
        );
    }
    if let Err(e) = store.close() {
        panic!("close: {e}");
    }
    layout(disk)
}

fn layout(disk: &dyn Disk) -> Layout {
    let storage = disk.storage();
    disk.segments()
        .into_iter()
        .map(|p| {
            let id = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(segment::parse_file_name)
                .unwrap_or(0);
            let mut entries = Vec::new();
            if let Ok(mut s) = SegmentScanner::open(&*storage, &p, id) {
                while let Ok(Some(e)) = s.next_entry() {
                    entries.push((e.offset, e.len, e.header.entry_seq));
                }
            }
            (p, entries)
        })
        .collect()
}

fn open(disk: &dyn Disk) -> (Store, rosetta::store::Recovered) {
    match Store::open(disk.config()) {
        Ok(x) => x,
        Err(e) => panic!("{}: open: {e}", disk.name()),
    }
}

fn open_accepting(disk: &dyn Disk) -> (Store, rosetta::store::Recovered) {
    let mut c = disk.config();
    c.accept_data_loss = true;
    match Store::open(c) {
        Ok(x) => x,
        Err(e) => panic!("{}: open accepting loss: {e}", disk.name()),
    }
}

/// Opens, reads every message back (checking its bytes and queue), closes;
/// returns the seqs and the report.
fn reopen(disk: &dyn Disk) -> (Vec<MessageSeq>, RecoveryReport) {
    let (store, r) = open(disk);
    finish(disk, store, r)
}

fn finish(
    disk: &dyn Disk,
    store: Store,
    r: rosetta::store::Recovered,
) -> (Vec<MessageSeq>, RecoveryReport) {
    let report = r.report.clone();
    let messages = match r.messages.read_all() {
        Ok(m) => m,
        Err(e) => panic!("{}: read: {e}", disk.name()),
    };
    for m in &messages {
        assert_eq!(m.body, body(m.seq).as_bytes(), "{}", disk.name());
        assert_eq!(m.queues.len(), 1);
        assert_eq!(m.queues[0].queue, queue_of(m.seq));
    }
    if let Err(e) = store.close() {
        panic!("{}: close: {e}", disk.name());
    }
    (messages.iter().map(|m| m.seq).collect(), report)
}

fn all_but(lost: &[MessageSeq]) -> Vec<MessageSeq> {
    (0..MESSAGES).filter(|s| !lost.contains(s)).collect()
}

/// Entry seq of message `seq` (entry 0 declares the queues).
fn entry_of(seq: MessageSeq) -> u64 {
    seq + 1
}

/// (segment path, offset, len) of the entry holding message `seq`.
fn find(layout: &Layout, seq: MessageSeq) -> (PathBuf, u64, u64) {
    for (p, entries) in layout {
        for (off, len, e) in entries {
            if *e == entry_of(seq) {
                return (p.clone(), *off, *len);
            }
        }
    }
    panic!("message {seq} not found");
}

#[test]
fn clean_end_of_file() {
    for d in disks() {
        let layout = build(&*d);
        assert!(layout.len() >= 3, "{}: several segments", d.name());
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[]), "{}", d.name());
        assert!(
            report.is_clean() && report.damaged.is_empty(),
            "{}: {report}",
            d.name()
        );
    }
}

#[test]
fn newest_segment_shorter_than_its_header_is_removed() {
    for d in disks() {
        let layout = build(&*d);
        let last = layout.len() as u64;
        let torn = d.dir().join(segment::file_name(last + 5));
        d.write(&torn, &[1, 2, 3]);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[]), "{}", d.name());
        assert!(!d.exists(&torn), "{}", d.name());
        assert_eq!(report.damaged[0].damage, Damage::TornSegmentHeader);
        assert!(report.damaged[0].segment_removed && report.is_clean());
    }
}

#[test]
fn a_damaged_segment_header_keeps_every_entry() {
    for d in disks() {
        let layout = build(&*d);
        // An older segment and the newest one that has entries.
        let older = layout[1].0.clone();
        let newest = layout
            .iter()
            .rev()
            .find(|(_, e)| !e.is_empty())
            .map(|(p, _)| p.clone())
            .unwrap_or_default();
        d.flip(&older, 10);
        d.flip(&newest, 20);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[]), "{}: {report}", d.name());
        let headers: Vec<&PathBuf> = report
            .damaged
            .iter()
            .filter(|r| r.damage == Damage::BadSegmentHeader)
            .map(|r| &r.path)
            .collect();
        assert_eq!(headers, vec![&older, &newest], "{}: {report}", d.name());
        assert_eq!(report.lost.entries, 0, "{}", d.name());
    }
}

#[test]
fn a_torn_entry_header_at_the_end_is_cut() {
    for d in disks() {
        let layout = build(&*d);
        let (path, off, _) = find(&layout, MESSAGES - 1);
        d.truncate(&path, off + 10);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[MESSAGES - 1]), "{}", d.name());
        let r = &report.damaged[0];
        assert_eq!(
            (r.damage, r.offset, r.cut),
            (Damage::TornEntryHeader, off, true)
        );
        assert!(report.is_clean(), "a torn tail is a crash, not damage");
        assert_eq!(d.read(&path).len() as u64, off, "{}: cut there", d.name());
    }
}

#[test]
fn zeros_at_the_end_are_cut() {
    for d in disks() {
        build(&*d);
        let newest = d.segments().pop().unwrap_or_default();
        let mut data = d.read(&newest);
        let len = data.len() as u64;
        data.extend(std::iter::repeat_n(0u8, 4096));
        d.write(&newest, &data);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[]), "{}", d.name());
        assert_eq!(report.damaged[0].damage, Damage::BadEntryMagic);
        assert_eq!(d.read(&newest).len() as u64, len);
    }
}

#[test]
fn a_torn_body_at_the_end_is_cut() {
    for d in disks() {
        let layout = build(&*d);
        let (path, off, len) = find(&layout, MESSAGES - 1);
        d.truncate(&path, off + len - 5);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[MESSAGES - 1]), "{}", d.name());
        assert_eq!(report.damaged[0].damage, Damage::TornEntryBody);
    }
}

#[test]
fn a_damaged_entry_header_in_the_middle_loses_that_entry_only() {
    for d in disks() {
        let layout = build(&*d);
        // In the newest segment with entries: a crash would have cut it.
        let (path, entries) = layout
            .iter()
            .rev()
            .find(|(_, e)| e.len() >= 3)
            .cloned()
            .unwrap_or_default();
        let (off, _, entry) = entries[1];
        let seq = entry - 1;
        d.flip(&path, off + 9);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[seq]), "{}: {report}", d.name());
        let r = &report.damaged[0];
        assert_eq!(r.damage, Damage::BadEntryHeaderChecksum);
        assert!(!r.cut);
        assert_eq!(r.lost_entries, Some((entry, Some(entry + 1))));
        assert_eq!(report.lost.entries, 1);
    }
}

#[test]
fn a_body_checksum_mismatch_in_an_older_segment_loses_that_entry_and_names_its_queue() {
    for d in disks() {
        let layout = build(&*d);
        let (path, off, len) = find(&layout, 5);
        assert_ne!(Some(&path), d.segments().last(), "an older segment");
        // Inside the payload: the body still decodes, unverified.
        d.flip(&path, off + len / 2);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[5]), "{}", d.name());
        let r = &report.damaged[0];
        assert_eq!(r.damage, Damage::BadEntryBodyChecksum);
        assert_eq!((r.offset, r.end), (off, off + len));
        assert_eq!(
            r.suspect.as_ref().map(|s| s.messages.clone()),
            Some(vec![(5, vec![queue_of(5)])])
        );
        assert_eq!(report.lost.queues, vec![queue_of(5)]);
        assert_eq!(report.lost.messages, vec![5]);
        assert!(
            report.to_string().contains("billing (id 2)"),
            "the queue is named: {report}"
        );
        // Saved for inspection, and left in place.
        let saved = r.saved_to.clone().unwrap_or_default();
        assert_eq!(d.read(&saved).len() as u64, len);
    }
}

#[test]
fn damage_at_the_end_of_a_sealed_segment_is_skipped_not_cut() {
    for d in disks() {
        let layout = build(&*d);
        let (path, entries) = layout[0].clone();
        let (off, len, entry) = entries[entries.len() - 1];
        let before = d.read(&path).len();
        d.flip(&path, off + len - 3);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[entry - 1]), "{}", d.name());
        let r = &report.damaged[0];
        assert!(!r.cut, "{}: {report}", d.name());
        assert_eq!(
            r.lost_entries,
            Some((entry, Some(entry + 1))),
            "{}: {report}",
            d.name()
        );
        assert_eq!(d.read(&path).len(), before, "not cut");
    }
}

#[test]
fn a_stale_copy_of_an_entry_is_skipped() {
    for d in disks() {
        let layout = build(&*d);
        let (p0, off, len) = find(&layout, 0);
        let stale = d.read(&p0)[off as usize..(off + len) as usize].to_vec();
        // Appended to the newest segment: a torn tail, cut.
        let newest = d.segments().pop().unwrap_or_default();
        let mut data = d.read(&newest);
        data.extend(&stale);
        d.write(&newest, &data);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[]), "{}", d.name());
        assert_eq!(report.damaged[0].damage, Damage::EntrySeqMismatch);
    }
}

#[test]
fn entries_missing_between_valid_ones_are_reported_as_a_gap() {
    for d in disks() {
        let layout = build(&*d);
        let (path, entries) = layout
            .iter()
            .find(|(_, e)| e.len() >= 4)
            .cloned()
            .unwrap_or_default();
        // Splice two whole entries out.
        let (a, _, first) = entries[1];
        let (b, blen, _) = entries[2];
        let mut data = d.read(&path);
        data.drain(a as usize..(b + blen) as usize);
        d.write(&path, &data);
        let (seqs, report) = open_accepting_seqs(&*d);
        assert_eq!(seqs, all_but(&[first - 1, first]), "{}", d.name());
        assert!(
            report
                .damaged
                .iter()
                .any(|r| r.damage == Damage::EntrySeqGap
                    && r.lost_entries == Some((first, Some(first + 2)))),
            "{}: {report}",
            d.name()
        );
    }
}

fn open_accepting_seqs(d: &dyn Disk) -> (Vec<MessageSeq>, RecoveryReport) {
    let (store, r) = open_accepting(d);
    finish(d, store, r)
}

#[test]
fn a_missing_segment_stops_the_start_unless_the_loss_is_accepted() {
    for d in disks() {
        let layout = build(&*d);
        // Open once with this build so the journal has a manifest.
        reopen(&*d);
        let (path, entries) = layout[1].clone();
        d.remove(&path);
        let lost: Vec<MessageSeq> = entries.iter().map(|(_, _, e)| e - 1).collect();
        match Store::open(d.config()) {
            Err(StoreError::Incomplete(why)) => {
                let name = path.display().to_string();
                assert!(why.contains(&name) && why.contains("missing"), "{why}");
                let range = format!("{}..{}", entries[0].2, entries[entries.len() - 1].2 + 1);
                assert!(why.contains(&range), "names the entries {range}: {why}");
                assert!(why.contains("accept_data_loss"), "{why}");
            }
            Err(e) => panic!("{}: wrong error {e}", d.name()),
            Ok(_) => panic!("{}: started with a segment missing", d.name()),
        }
        // `store check` says the same, and changes nothing.
        let check = Store::check(&d.config());
        assert!(
            check
                .as_ref()
                .is_ok_and(|r| !r.is_clean() && r.missing.len() == 1),
            "{check:?}"
        );
        let (seqs, report) = open_accepting_seqs(&*d);
        assert_eq!(seqs, all_but(&lost), "{}", d.name());
        assert!(report.loss_accepted);
        assert_eq!(report.lost.entries, entries.len() as u64);
        // Accepted once: the manifest now says what is there.
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&lost));
        assert!(report.is_clean(), "{}: {report}", d.name());
    }
}

#[test]
fn a_sealed_segment_cut_short_stops_the_start() {
    for d in disks() {
        let layout = build(&*d);
        reopen(&*d);
        let (path, entries) = layout[1].clone();
        // At an entry boundary: the file looks clean by itself.
        let (off, _, entry) = entries[entries.len() - 2];
        d.truncate(&path, off);
        match Store::open(d.config()) {
            Err(StoreError::Incomplete(why)) => assert!(why.contains("cut short"), "{why}"),
            other => panic!("{}: {:?}", d.name(), other.map(|_| ())),
        }
        let (seqs, report) = open_accepting_seqs(&*d);
        assert_eq!(seqs, all_but(&[entry - 1, entry]), "{}: {report}", d.name());
    }
}

#[test]
fn without_a_manifest_a_cut_short_segment_shows_in_the_entry_seq_chain() {
    for d in disks() {
        let layout = build(&*d);
        reopen(&*d);
        for m in ["MANIFEST.0", "MANIFEST.1"] {
            let p = d.dir().join(m);
            if d.exists(&p) {
                d.remove(&p);
            }
        }
        match Store::open(d.config()) {
            Err(StoreError::Incomplete(why)) => assert!(why.contains("manifest"), "{why}"),
            other => panic!(
                "{}: a lost manifest must stop the start: {:?}",
                d.name(),
                other.map(|_| ())
            ),
        }
        let (path, entries) = layout[1].clone();
        d.truncate(&path, entries[entries.len() - 1].0);
        let (_, report) = open_accepting_seqs(&*d);
        assert_eq!(report.manifest, ManifestState::Lost);
        assert!(
            report.missing.iter().any(|m| m.path == path),
            "{}: the chain shows {} ends early: {report}",
            d.name(),
            path.display()
        );
    }
}

#[test]
fn one_torn_manifest_copy_is_survived() {
    for d in disks() {
        build(&*d);
        reopen(&*d);
        reopen(&*d);
        for m in ["MANIFEST.0", "MANIFEST.1"] {
            let p = d.dir().join(m);
            let data = d.read(&p);
            assert!(!data.is_empty(), "{}: both copies written", d.name());
        }
        let p = d.dir().join("MANIFEST.0");
        d.flip(&p, 30);
        let (seqs, report) = reopen(&*d);
        assert_eq!(seqs, all_but(&[]));
        assert!(
            matches!(
                report.manifest,
                ManifestState::Read {
                    other_copy_bad: true,
                    ..
                }
            ),
            "{:?}",
            report.manifest
        );
    }
}

#[test]
fn a_segment_compaction_retired_before_a_crash_is_removed_unread() {
    for d in disks() {
        let (store, _) = open(&*d);
        commit(
            &store,
            vec![codec::queue_declare_record(
                1,
                "orders",
                QueueLifetime::Permanent,
            )],
        );
        for seq in 0..30u64 {
            commit(
                &store,
                vec![Record::Message {
                    seq,
                    queues: vec![1],
                    body: Opaque::Bytes(Bytes::from(body(seq))),
                }],
            );
            commit(&store, vec![Record::Ack { queue: 1, seq }]);
        }
        let first = d.segments()[0].clone();
        let saved = d.read(&first);
        let mut c = d.config();
        drop(store);
        c.compaction_enabled = true;
        c.rewrite_min_age = std::time::Duration::ZERO;
        let (store, _) = match Store::open(c.clone()) {
            Ok(x) => x,
            Err(e) => panic!("{e}"),
        };
        if let Err(e) = store.compact() {
            panic!("{e}");
        }
        let _ = store.close();
        assert!(!d.exists(&first), "{}: compaction deleted it", d.name());
        // The removal was not durable at a crash: the file is back.
        d.write(&first, &saved);
        let (store, r) = open(&*d);
        assert!(r.report.retired_removed.contains(&first), "{}", r.report);
        assert!(r.report.is_clean());
        assert!(!d.exists(&first));
        let _ = store.close();
    }
}

/// Writes a segment file `id` with a valid header and no entries.
fn empty_segment(d: &dyn Disk, id: u64, first_entry_seq: u64) -> PathBuf {
    let newest = d.segments().pop().unwrap_or_default();
    let raw = d.read(&newest);
    let mut h = [0u8; SEGMENT_HEADER_BYTES];
    h.copy_from_slice(&raw[..SEGMENT_HEADER_BYTES]);
    let mut header = match SegmentHeader::decode(&h) {
        Ok(h) => h,
        Err(e) => panic!("{e:?}"),
    };
    header.id = id;
    header.first_entry_seq = first_entry_seq;
    let path = d.dir().join(segment::file_name(id));
    d.write(&path, &header.encode());
    path
}

#[test]
fn a_segment_newer_than_the_manifest_is_replayed() {
    for d in disks() {
        build(&*d);
        let (seqs, _) = reopen(&*d);
        let newest = d.segments().pop().unwrap_or_default();
        let id =
            segment::parse_file_name(newest.file_name().and_then(|n| n.to_str()).unwrap_or(""))
                .unwrap_or(0);
        let storage = d.storage();
        let end = SegmentScanner::open(&*storage, &newest, id).map_or(0, |s| {
            let mut s = s;
            while let Ok(Some(_)) = s.next_entry() {}
            s.next_entry_seq()
        });
        let path = empty_segment(&*d, id + 1, end);
        let (again, report) = reopen(&*d);
        assert_eq!(again, seqs);
        assert!(report.is_clean(), "{}: {report}", d.name());
        assert!(d.exists(&path));
    }
}

#[test]
fn a_first_entry_seq_that_goes_backwards_is_refused() {
    for d in disks() {
        build(&*d);
        reopen(&*d);
        let newest = d.segments().pop().unwrap_or_default();
        let id =
            segment::parse_file_name(newest.file_name().and_then(|n| n.to_str()).unwrap_or(""))
                .unwrap_or(0);
        empty_segment(&*d, id + 1, 0);
        assert!(
            matches!(Store::open(d.config()), Err(StoreError::Corrupt { .. })),
            "{}",
            d.name()
        );
    }
}

#[test]
fn a_newer_format_is_refused_and_nothing_is_changed() {
    for d in disks() {
        let layout = build(&*d);
        let (path, off, _) = find(&layout, MESSAGES - 1);
        let mut data = d.read(&path);
        let h = off as usize;
        data[h + 4] = 9; // version 9, checksummed as version 1 would be
        let crc = crc32c::crc32c(&data[h..h + 28]);
        data[h + 28..h + 32].copy_from_slice(&crc.to_le_bytes());
        d.write(&path, &data);
        match Store::open(d.config()) {
            Err(StoreError::Unsupported { offset, .. }) => assert_eq!(offset, off),
            other => panic!("{}: {:?}", d.name(), other.map(|_| ())),
        }
        assert_eq!(d.read(&path), data, "{}: nothing cut", d.name());
    }
}

#[test]
fn a_checksummed_body_that_does_not_decode_is_refused() {
    for d in disks() {
        let layout = build(&*d);
        let (path, off, len) = find(&layout, MESSAGES - 1);
        let mut data = d.read(&path);
        let b = (off as usize) + 32;
        let e = (off + len) as usize;
        // A record tag nobody knows, then fix the body checksum.
        data[b + 4] = 200;
        let crc = crc32c::crc32c(&data[b..e]);
        let h = off as usize;
        data[h + 12..h + 16].copy_from_slice(&crc.to_le_bytes());
        // The header checksum covers the body checksum (salted).
        let mut hh = [0u8; SEGMENT_HEADER_BYTES];
        hh.copy_from_slice(&data[..SEGMENT_HEADER_BYTES]);
        let salt = SegmentHeader::decode(&hh).map_or(0, |h| h.salt);
        let hcrc = crc32c::crc32c_append(crc32c::crc32c(&salt.to_le_bytes()), &data[h..h + 28]);
        data[h + 28..h + 32].copy_from_slice(&hcrc.to_le_bytes());
        d.write(&path, &data);
        assert!(
            matches!(
                Store::open(d.config()),
                Err(StoreError::Unsupported { .. } | StoreError::Corrupt { .. })
            ),
            "{}",
            d.name()
        );
    }
}

/// Only the simulated disk can fail a read on request.
#[test]
fn an_io_error_while_reading_fails_the_open() {
    let sim = Sim(SimDisk::new(7));
    build(&sim);
    let seg = sim.segments()[0].clone();
    sim.0.fail_next(SimOp::Read, Some(&seg));
    assert!(matches!(
        Store::open(sim.config()),
        Err(StoreError::Io { .. })
    ));
    let (seqs, _) = reopen(&sim);
    assert_eq!(seqs, all_but(&[]));
}

/// Only the simulated disk drops pages a failed `fdatasync` left clean:
/// recovery must make what it replays durable before building on it.
#[test]
fn entries_replayed_from_the_page_cache_after_a_failed_sync_are_made_durable() {
    let sim = Sim(SimDisk::new(9));
    build(&sim);
    let (store, _) = open(&sim);
    sim.0.fail_next(SimOp::Sync, None);
    let (tx, rx) = mpsc::channel();
    store.append(
        vec![Record::Message {
            seq: 1000,
            queues: vec![1],
            body: Opaque::Bytes(Bytes::from("unsynced")),
        }],
        Some(Box::new(move |r| {
            let _ = tx.send(r);
        })),
    );
    assert!(matches!(rx.recv(), Ok(Err(_))), "the sync failed");
    drop(store);
    // Restart without a power loss: recovery reads the entry back from
    // what reads still show.
    let (store, r) = open(&sim);
    let seen: Vec<u64> = r
        .messages
        .read_all()
        .map(|m| m.iter().map(|m| m.seq).collect())
        .unwrap_or_default();
    assert!(seen.contains(&1000));
    let _ = store.close();
    sim.0.power_loss();
    let (store, r) = open(&sim);
    let after: Vec<u64> = r
        .messages
        .read_all()
        .map(|m| m.iter().map(|m| m.seq).collect())
        .unwrap_or_default();
    assert_eq!(after, seen, "what recovery replayed once stays");
    let _ = store.close();
}

#[test]
fn a_recovered_message_unreadable_after_replay_is_an_error_item() {
    for d in disks() {
        let layout = build(&*d);
        let (store, r) = open(&*d);
        let (path, off, len) = find(&layout, 3);
        d.flip(&path, off + len - 2);
        let got: Vec<_> = r.messages.collect();
        assert_eq!(got.len(), MESSAGES as usize);
        assert!(
            matches!(&got[3], Err(StoreError::Corrupt { .. })),
            "{}",
            d.name()
        );
        assert!(got.iter().enumerate().all(|(i, m)| i == 3 || m.is_ok()));
        let _ = store.close();
    }
}
