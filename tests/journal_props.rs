//! Property tests of the journal: random sequences of operations, a crash
//! (truncated and/or corrupted tail), recovery, and a check that the
//! recovered state is exactly the committed prefix before the damage.
//!
//! The model below is written independently of the store's index: plain
//! maps and the replay rules from the `store` docs. proptest prints the
//! failing case (and persists its seed) when a property fails.

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use rosetta::store::{
    segment, BindingDef, MessageSeq, Opaque, QueueDef, QueueId, Record, Recovered,
    RecoveredMessage, Store, StoreConfig, StoreError,
};

use common::journal_model::JournalModel;

/// One generated record; seqs of new messages are assigned in order.
#[derive(Debug, Clone)]
enum Op {
    Declare(QueueId, bool),
    Delete(QueueId),
    Bind(QueueId, u8, u8),
    Unbind(QueueId, u8),
    /// A new message on a subset of queues (bit mask over 1..=4).
    Msg(u8),
    /// Ack of a recent seq (how far back) in a queue.
    Ack(QueueId, u8),
    Ds(QueueId, u8, u32, bool),
    Retain(u8, bool),
    State(u8, Option<u8>),
}

fn arb_op() -> impl Strategy<Value = Op> {
    let q = 1u64..=4;
    prop_oneof![
        2 => (q.clone(), any::<bool>()).prop_map(|(q, p)| Op::Declare(q, p)),
        1 => q.clone().prop_map(Op::Delete),
        2 => (q.clone(), 0u8..3, 0u8..3).prop_map(|(q, f, qos)| Op::Bind(q, f, qos)),
        1 => (q.clone(), 0u8..3).prop_map(|(q, f)| Op::Unbind(q, f)),
        5 => (0u8..16).prop_map(Op::Msg),
        4 => (q.clone(), 0u8..6).prop_map(|(q, b)| Op::Ack(q, b)),
        2 => (q.clone(), 0u8..6, 0u32..5, any::<bool>()).prop_map(|(q, b, c, a)| Op::Ds(q, b, c, a)),
        1 => (0u8..2, any::<bool>()).prop_map(|(t, s)| Op::Retain(t, s)),
        1 => (0u8..3, proptest::option::of(any::<u8>())).prop_map(|(k, v)| Op::State(k, v)),
    ]
}

const FILTERS: [&str; 3] = ["a/#", "a/+/c", "b"];

/// Turns ops into records, assigning message seqs from `next_seq`.
fn to_records(ops: &[Op], next_seq: &mut MessageSeq) -> Vec<Record> {
    ops.iter()
        .map(|op| match op {
            Op::Declare(q, permanent) => Record::QueueDeclare(QueueDef {
                id: *q,
                name: format!("q{q}"),
                // Opaque to the store.
                attributes: Bytes::from(if *permanent {
                    "permanent".to_owned()
                } else {
                    format!("idle for {}", *q * 1000)
                }),
            }),
            Op::Delete(q) => Record::QueueDelete { queue: *q },
            Op::Bind(q, f, qos) => Record::Bind(BindingDef {
                queue: *q,
                filter: FILTERS[*f as usize].into(),
                // Opaque to the store: any bytes, varied so that a
                // replaced binding is told from the one it replaced.
                options: Bytes::from(vec![*qos; usize::from(*qos) + 1]),
            }),
            Op::Unbind(q, f) => Record::Unbind {
                queue: *q,
                filter: FILTERS[*f as usize].into(),
            },
            Op::Msg(mask) => {
                let seq = *next_seq;
                *next_seq += 1;
                Record::Message {
                    seq,
                    queues: (1..=4u64).filter(|q| mask & (1 << (q - 1)) != 0).collect(),
                    body: Opaque::Bytes(Bytes::from(format!("message {seq}"))),
                }
            }
            Op::Ack(q, back) => Record::Ack {
                queue: *q,
                seq: next_seq.saturating_sub(1 + u64::from(*back)),
            },
            Op::Ds(q, back, count, ann) => Record::DeliveryState {
                queue: *q,
                seq: next_seq.saturating_sub(1 + u64::from(*back)),
                state: Bytes::from(format!("count {count}, annotated {ann}")),
            },
            Op::Retain(t, set) => {
                let topic = format!("t/{t}");
                if *set {
                    let seq = *next_seq;
                    *next_seq += 1;
                    Record::Retain {
                        topic,
                        message: Some((seq, Opaque::Bytes(Bytes::from(format!("retained {seq}"))))),
                    }
                } else {
                    Record::Retain {
                        topic,
                        message: None,
                    }
                }
            }
            Op::State(k, v) => Record::State {
                key: format!("k{k}"),
                value: v.map(|v| Bytes::from(vec![v; 3])),
            },
        })
        .collect()
}

/// The state a reopened store holds.
fn model_of(r: &Opened) -> JournalModel {
    JournalModel::from_recovered(&r.queues, &r.bindings, &r.messages, &r.retained, &r.state)
}

fn commit(store: &Store, records: Vec<Record>) -> Result<(), StoreError> {
    let (tx, rx) = mpsc::channel();
    store.append(
        records,
        Some(Box::new(move |r| {
            let _ = tx.send(r);
        })),
    );
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or(Err(StoreError::Closed))?;
    store.flush()
}

fn last_segment(dir: &Path) -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(segment::parse_file_name)
                .is_some()
        })
        .collect();
    v.sort();
    v.pop()
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// How the tail is damaged: positions are fractions of the last segment.
#[derive(Debug, Clone)]
struct Crash {
    truncate_at: Option<f64>,
    corrupt: Vec<(f64, u8)>,
}

fn arb_crash() -> impl Strategy<Value = Crash> {
    (
        proptest::option::of(0.0f64..1.0),
        proptest::collection::vec((0.0f64..1.0, 1u8..=255), 0..3),
    )
        .prop_map(|(truncate_at, corrupt)| Crash {
            truncate_at,
            corrupt,
        })
}

fn tmp() -> Result<tempfile::TempDir, TestCaseError> {
    tempfile::tempdir().map_err(|e| TestCaseError::fail(format!("tempdir: {e}")))
}

/// A reopened store's recovered state, with its messages read back from
/// the journal (recovery hands them out lazily).
struct Opened {
    r: Recovered,
    messages: Vec<RecoveredMessage>,
}

impl std::ops::Deref for Opened {
    type Target = Recovered;
    fn deref(&self) -> &Recovered {
        &self.r
    }
}

fn open(c: &StoreConfig) -> Result<(Store, Opened), TestCaseError> {
    let (store, mut r) =
        Store::open(c.clone()).map_err(|e| TestCaseError::fail(format!("open: {e}")))?;
    let messages = r
        .messages
        .by_ref()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TestCaseError::fail(format!("reading recovered messages: {e}")))?;
    Ok((store, Opened { r, messages }))
}

fn check<T>(r: Result<T, StoreError>) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("store: {e}")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Damage anywhere in the newest segment (a cut, flipped bytes):
    /// recovery yields exactly the state after the appends whose entries
    /// no damage touched, in order.
    #[test]
    fn recovery_keeps_every_undamaged_append(
        appends in proptest::collection::vec(proptest::collection::vec(arb_op(), 1..4), 1..30),
        segment_size in 1024u64..4096,
        crash in arb_crash(),
    ) {
        let dir = tmp()?;
        let mut config = StoreConfig::new(dir.path());
        config.segment_size_bytes = segment_size;
        config.compaction_enabled = false; // the test reasons about raw entry positions
        let (store, _) = open(&config)?;
        let mut next_seq = 0;
        // (segment file, entry start, entry end) of each append.
        let mut spans: Vec<(PathBuf, u64, u64)> = Vec::new();
        let mut last_end: Option<(PathBuf, u64)> = None;
        for ops in &appends {
            let records = to_records(ops, &mut next_seq);
            check(commit(&store, records))?;
            let seg = last_segment(dir.path()).ok_or_else(|| TestCaseError::fail("no segment"))?;
            let end = file_len(&seg);
            let start = match &last_end {
                Some((p, e)) if *p == seg => *e,
                _ => segment::SEGMENT_HEADER_BYTES as u64,
            };
            spans.push((seg.clone(), start, end));
            last_end = Some((seg, end));
        }
        check(store.close())?;

        // Damage the newest segment and work out what must survive: every
        // append whose entry no damage touches (recovery skips damaged
        // entries and keeps the ones after them), none after a cut.
        let seg = last_segment(dir.path()).ok_or_else(|| TestCaseError::fail("no segment"))?;
        let len = file_len(&seg);
        let mut data = std::fs::read(&seg).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let cut = crash.truncate_at.map_or(len, |frac| ((len as f64) * frac) as u64);
        let mut flipped: Vec<u64> = Vec::new();
        for (frac, xor) in &crash.corrupt {
            let at = ((len as f64) * frac) as u64;
            if at < cut {
                data[at as usize] ^= xor;
                flipped.push(at);
            }
        }
        data.truncate(cut as usize);
        std::fs::write(&seg, &data).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let header = segment::SEGMENT_HEADER_BYTES as u64;
        let survives = |(p, start, end): &(PathBuf, u64, u64)| {
            *p != seg
                || (cut >= header
                    && *end <= cut
                    && !flipped.iter().any(|at| (*start..*end).contains(at)))
        };
        let mut expected = JournalModel::default();
        let mut seq = 0;
        let mut kept = 0;
        for (ops, span) in appends.iter().zip(&spans) {
            let records = to_records(ops, &mut seq);
            if survives(span) {
                kept += 1;
                for r in &records {
                    expected.apply(r);
                }
            }
        }
        let expected = &expected;

        let (store, recovered) = open(&config)?;
        let got = model_of(&recovered);
        prop_assert_eq!(&got, expected, "appends kept: {} of {}, cut at {} of {}, flipped {:?}\n{}",
            kept, appends.len(), cut, len, flipped, recovered.report);
        // Damage is reported iff some byte of the file changed or a cut
        // fell inside an entry (a cut exactly at an entry boundary leaves
        // a clean file).
        let boundary = cut == header || spans.iter().any(|(p, _, end)| *p == seg && *end == cut)
            || (cut == len);
        let damaged = !flipped.is_empty() || cut < header || !boundary;
        prop_assert_eq!(!recovered.report.damaged.is_empty(), damaged, "{}", recovered.report);
        for m in &recovered.messages {
            prop_assert!(m.seq < recovered.next_seq);
        }
        for (_, s, _) in &recovered.retained {
            prop_assert!(*s < recovered.next_seq);
        }

        // Writing goes on after recovery, and the result survives a reopen.
        let mut seq = recovered.next_seq;
        let extra = to_records(&[Op::Msg(1), Op::Declare(1, true)], &mut seq);
        let mut after = expected.clone();
        for r in &extra {
            after.apply(r);
        }
        check(commit(&store, extra))?;
        check(store.close())?;
        let (_store, recovered) = open(&config)?;
        // Damage left in place is reported again (until compaction
        // rewrites the segment); nothing is cut a second time.
        prop_assert!(recovered.report.damaged.iter().all(|d| !d.cut), "{}", recovered.report);
        prop_assert_eq!(&model_of(&recovered), &after);
    }

    /// With compaction deleting and rewriting segments along the way, the
    /// recovered state equals the model; a torn final append loses exactly
    /// that append.
    #[test]
    fn compaction_preserves_the_committed_state(
        appends in proptest::collection::vec(proptest::collection::vec(arb_op(), 1..4), 1..40),
        tear in proptest::option::of(0.0f64..1.0),
    ) {
        let dir = tmp()?;
        let mut config = StoreConfig::new(dir.path());
        config.segment_size_bytes = 1024;
        let (store, _) = open(&config)?;
        let mut next_seq = 0;
        let mut model = JournalModel::default();
        for ops in &appends {
            let records = to_records(ops, &mut next_seq);
            for r in &records {
                model.apply(r);
            }
            check(commit(&store, records))?;
        }
        check(store.compact())?;
        // One last append, alone at the end of the newest segment.
        let seg_before = last_segment(dir.path()).ok_or_else(|| TestCaseError::fail("no segment"))?;
        let start = file_len(&seg_before);
        let last = to_records(&[Op::Msg(3), Op::Ack(1, 3)], &mut next_seq);
        let mut full = model.clone();
        for r in &last {
            full.apply(r);
        }
        check(commit(&store, last))?;
        check(store.close())?;
        let seg = last_segment(dir.path()).ok_or_else(|| TestCaseError::fail("no segment"))?;
        // Find the final append's entry. A rollover may have started a new
        // segment and run compaction after it, appending (synced) copies
        // behind it; a crash cannot tear those, so tear only a final entry
        // that is the last thing in the file.
        let id = seg.file_name().and_then(|n| n.to_str()).and_then(segment::parse_file_name).unwrap_or(0);
        let mut scanner = segment::SegmentScanner::open(&rosetta::store::OsStorage, &seg, id)
            .map_err(|e| TestCaseError::fail(format!("scan: {e:?}")))?;
        let mut entries = Vec::new();
        while let Ok(Some(e)) = scanner.next_entry() {
            entries.push((e.offset, e.len));
        }
        let from = if seg == seg_before { start } else { 0 };
        let ours = entries.iter().position(|(off, _)| *off >= from);
        let expected = match (tear, ours) {
            (Some(frac), Some(i)) if i + 1 == entries.len() => {
                let (off, len) = entries[i];
                let at = off + ((len as f64) * frac) as u64;
                let f = std::fs::OpenOptions::new().write(true).open(&seg)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                f.set_len(at).map_err(|e| TestCaseError::fail(e.to_string()))?;
                &model
            }
            _ => &full,
        };
        let (_store, recovered) = open(&config)?;
        prop_assert_eq!(&model_of(&recovered), expected);
    }
}
