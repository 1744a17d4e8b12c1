//! Journals written by earlier builds must keep opening, with exactly the
//! state they held.
//!
//! `tests/fixtures/journal-v1/` was written by the build before the storage
//! trait, the manifest and resynchronising recovery (commit 846872d, segment
//! and entry format version 1) with [`write_representative_journal`]: every
//! record kind, several segments, segments deleted and one rewritten by
//! compaction, delivery states, retained messages and state records. The
//! test opens a copy (opening starts a new segment, so never the fixture
//! itself) and checks every recovered item against [`expected`].
//!
//! To write a fixture of the current format (for a future `journal-vN`):
//! `JOURNAL_FIXTURE_OUT=tests/fixtures/journal-vN cargo test --test
//! journal_fixture a_journal_written_now` (the test writes it there and
//! checks it as it checks any journal written now).

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use bytes::Bytes;
use rosetta::core::codec;
use rosetta::store::{
    BindingDef, MessageSeq, QueueDef, QueueId, Record, RecoveredPlacement, Store, StoreConfig,
};
use rosetta_neutral::{
    Address, BindingOptions, Body, BodyKind, Guarantee, Message, MessageId, Properties,
    QueueLifetime, Value,
};

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A message with most fields set, different per `n`, so that a decoder
/// that drops or swaps a field is caught.
fn rich_message(n: u64, body_bytes: usize) -> Message {
    let mut properties = Properties::new();
    properties.push("n", Value::ULong(n));
    properties.push("name", Value::String(format!("item-{n}")));
    properties.push("flag", Value::Bool(n.is_multiple_of(2)));
    properties.push("name", Value::String("duplicate kept".into()));
    let mut body = format!("body-{n}-").into_bytes();
    body.resize(body_bytes.max(body.len()), b'a' + (n % 26) as u8);
    Message {
        body: Body {
            kind: match n % 3 {
                0 => BodyKind::Binary,
                1 => BodyKind::Text,
                _ => BodyKind::AmqpData,
            },
            bytes: Bytes::from(body),
        },
        address: Some(if n.is_multiple_of(2) {
            Address::Queue("orders".into())
        } else {
            Address::Topic(format!("sensors/{n}/temp"))
        }),
        message_id: Some(if n.is_multiple_of(2) {
            MessageId::String(format!("id-{n}"))
        } else {
            MessageId::Ulong(n)
        }),
        correlation_id: n
            .is_multiple_of(4)
            .then(|| MessageId::Binary(Bytes::from(vec![n as u8; 3]))),
        reply_to: n.is_multiple_of(5).then(|| "/queue/replies".to_owned()),
        content_type: Some("text/plain".into()),
        content_encoding: None,
        subject: (n % 3 == 1).then(|| format!("subject-{n}")),
        user_id: n.is_multiple_of(7).then(|| Bytes::from_static(b"alice")),
        group_id: n.is_multiple_of(6).then(|| "g1".to_owned()),
        group_sequence: n.is_multiple_of(6).then_some(n as u32),
        priority: (n % 10) as u8,
        durable: true,
        guarantee: if n.is_multiple_of(2) {
            Guarantee::AtLeastOnce
        } else {
            Guarantee::ExactlyOnce
        },
        retain: false,
        creation_time: Some(1_700_000_000_000 + n),
        expiry: n.is_multiple_of(8).then_some(4_000_000_000_000),
        properties,
        amqp_annotations: n
            .is_multiple_of(9)
            .then(|| Bytes::from_static(b"\x00\x53\x72\xc1\x01\x00")),
        // The v1 fixture's messages have none; codec v2 reads them as none.
        delivery_time: None,
    }
}

/// A queue declaration as the core journals it (the fixture's bytes were
/// written while the store still encoded the lifetime itself).
fn declare(id: QueueId, name: &str, lifetime: QueueLifetime) -> Record {
    codec::queue_declare_record(id, name, lifetime)
}

fn idle_for_ms(ms: u64) -> QueueLifetime {
    QueueLifetime::IdleFor(Duration::from_millis(ms))
}

/// A binding as the core journals it. The fixture was written while the
/// store still encoded these options itself: comparing its bytes with the
/// core's encoding proves the layout did not change.
fn binding(queue: QueueId, filter: &str, max_qos: u8, owner: Option<&str>) -> BindingDef {
    let options = BindingOptions {
        max_guarantee: Guarantee::from_qos(max_qos).unwrap_or(Guarantee::ExactlyOnce),
        subscription_id: (max_qos > 0).then_some(u32::from(max_qos) + 6),
        no_local: max_qos == 1,
        retain_as_published: max_qos == 2,
        ..BindingOptions::default()
    };
    match codec::bind_record(queue, filter, &options, owner) {
        Record::Bind(b) => b,
        other => panic!("bind_record made {other:?}"),
    }
}

fn message(seq: MessageSeq, queues: &[QueueId], body_bytes: usize) -> Record {
    Record::Message {
        seq,
        queues: queues.to_vec(),
        body: codec::opaque(&Arc::new(rich_message(seq, body_bytes))),
    }
}

/// A message body the store kept, decoded by the core's codec (which, like
/// the record layouts, must still read what today's build wrote).
fn decode(body: Bytes) -> Message {
    match codec::decode_message_exact(body) {
        Ok(m) => Message::clone(&m),
        Err(e) => panic!("a journaled message does not decode: {e}"),
    }
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
        Ok(Err(e)) => panic!("append failed: {e}"),
        Err(e) => panic!("completion never ran: {e}"),
    }
}

/// Small segments so that the journal spans several, compaction on (run
/// by each rollover and explicitly), rewrites allowed at once.
fn fixture_config(dir: &Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.segment_size_bytes = 4096;
    c.compaction_enabled = true;
    c.compaction_interval = Duration::from_secs(3600);
    c.rewrite_min_age = Duration::ZERO;
    c
}

/// The queues, bindings and messages [`expected`] lists, plus traffic that
/// dies (so compaction deletes and rewrites segments).
fn write_representative_journal(dir: &Path) {
    let (store, recovered) = match Store::open(fixture_config(dir)) {
        Ok(x) => x,
        Err(e) => panic!("open: {e}"),
    };
    assert!(recovered.queues.is_empty(), "write into an empty directory");
    drop(recovered);
    commit(
        &store,
        vec![
            declare(1, "orders", QueueLifetime::Permanent),
            declare(2, "$mqtt/client-a", idle_for_ms(60_000)),
            declare(3, "doomed", QueueLifetime::Permanent),
            declare(4, "$share/g/sensors/#", idle_for_ms(5_000)),
        ],
    );
    commit(
        &store,
        vec![
            Record::Bind(binding(2, "sensors/#", 1, Some("client-a"))),
            Record::Bind(binding(2, "alerts/+", 2, Some("client-a"))),
            Record::Bind(binding(4, "sensors/#", 0, None)),
            Record::Bind(binding(3, "doomed/#", 0, None)),
            Record::Bind(binding(1, "orders/+", 1, None)),
        ],
    );
    // Survivors in the first segment: compaction must copy them forward
    // (with their delivery states) when it rewrites it.
    commit(&store, vec![message(1, &[1], 100)]);
    commit(&store, vec![message(2, &[1, 2], 300)]);
    commit(
        &store,
        vec![codec::delivery_state_record(
            1,
            2,
            3,
            Some(&Bytes::from_static(b"\x00\x53\x70delivery-failed")),
            None,
        )],
    );
    commit(
        &store,
        vec![Record::State {
            key: "mqtt/session/client-a".into(),
            value: Some(Bytes::from_static(b"v1")),
        }],
    );
    commit(
        &store,
        vec![Record::Retain {
            topic: "sensors/1/temp".into(),
            message: Some((3, codec::opaque(&Arc::new(rich_message(3, 50))))),
        }],
    );
    // A multi-record unit (a transaction): two messages and an ack.
    commit(
        &store,
        vec![
            message(4, &[1, 4], 80),
            message(5, &[3], 80),
            Record::Ack { queue: 1, seq: 1 },
        ],
    );
    // Traffic that dies: fills segments so they roll, get deleted, and the
    // first one becomes mostly dead (and is rewritten).
    for round in 0..30u64 {
        let seq = 100 + round;
        commit(&store, vec![message(seq, &[1], 400)]);
        commit(&store, vec![Record::Ack { queue: 1, seq }]);
        if round == 10 {
            commit(
                &store,
                vec![Record::Unbind {
                    queue: 1,
                    filter: "orders/+".into(),
                }],
            );
            commit(
                &store,
                vec![Record::State {
                    key: "mqtt/session/client-a".into(),
                    value: Some(Bytes::from_static(b"v2, replacing v1")),
                }],
            );
        }
        if round == 20 {
            commit(&store, vec![Record::QueueDelete { queue: 3 }]);
            commit(
                &store,
                vec![Record::Retain {
                    topic: "sensors/2/temp".into(),
                    message: Some((6, codec::opaque(&Arc::new(rich_message(6, 60))))),
                }],
            );
        }
    }
    if let Err(e) = store.compact() {
        panic!("compact: {e}");
    }
    // Later state that stays in newer segments.
    commit(
        &store,
        vec![
            message(200, &[2], 1500),
            codec::delivery_state_record(2, 200, 1, None, None),
        ],
    );
    commit(
        &store,
        vec![Record::Retain {
            topic: "sensors/1/temp".into(),
            message: None,
        }],
    );
    commit(
        &store,
        vec![
            Record::State {
                key: "stomp/durable/x".into(),
                value: Some(Bytes::from_static(b"")),
            },
            Record::State {
                key: "gone".into(),
                value: Some(Bytes::from_static(b"soon deleted")),
            },
        ],
    );
    commit(
        &store,
        vec![Record::State {
            key: "gone".into(),
            value: None,
        }],
    );
    commit(&store, vec![message(201, &[4], 10), message(202, &[1], 10)]);
    commit(&store, vec![Record::Ack { queue: 4, seq: 4 }]);
    // A backlog that stays: live segments, left alone by compaction.
    for seq in 210..=215 {
        commit(&store, vec![message(seq, &[2], 1200)]);
    }
    let stats = store.stats();
    assert!(
        stats.segments_deleted >= 2,
        "dead segments deleted: {stats:?}"
    );
    assert!(
        stats.segments_rewritten >= 1,
        "a segment rewritten: {stats:?}"
    );
    assert!(stats.segments >= 3, "several segments left: {stats:?}");
    if let Err(e) = store.close() {
        panic!("close: {e}");
    }
    let _ = std::fs::remove_file(dir.join("LOCK"));
}

/// What the fixture holds.
struct Expected {
    queues: Vec<QueueDef>,
    bindings: Vec<BindingDef>,
    /// (seq, message, placements)
    messages: Vec<(MessageSeq, Message, Vec<RecoveredPlacement>)>,
    retained: Vec<(String, MessageSeq, Message)>,
    state: Vec<(String, Bytes)>,
    next_seq: MessageSeq,
    next_queue_id: QueueId,
}

/// A placement; one never delivered has no delivery state record.
fn placement(
    queue: QueueId,
    delivery_count: u32,
    annotation: Option<&'static [u8]>,
) -> RecoveredPlacement {
    let annotation = annotation.map(Bytes::from_static);
    let state = (delivery_count > 0 || annotation.is_some()).then(|| {
        match codec::delivery_state_record(queue, 0, delivery_count, annotation.as_ref(), None) {
            Record::DeliveryState { state, .. } => state,
            other => panic!("delivery_state_record made {other:?}"),
        }
    });
    RecoveredPlacement { queue, state }
}

fn expected() -> Expected {
    let q = |id, name: &str, lifetime| match declare(id, name, lifetime) {
        Record::QueueDeclare(def) => def,
        other => panic!("queue_declare_record made {other:?}"),
    };
    Expected {
        queues: vec![
            q(1, "orders", QueueLifetime::Permanent),
            q(2, "$mqtt/client-a", idle_for_ms(60_000)),
            q(4, "$share/g/sensors/#", idle_for_ms(5_000)),
        ],
        bindings: vec![
            binding(2, "alerts/+", 2, Some("client-a")),
            binding(2, "sensors/#", 1, Some("client-a")),
            binding(4, "sensors/#", 0, None),
        ],
        messages: vec![
            (
                2,
                rich_message(2, 300),
                vec![
                    placement(1, 3, Some(b"\x00\x53\x70delivery-failed")),
                    placement(2, 0, None),
                ],
            ),
            // On queues 1 and 4; acknowledged on 4 only.
            (4, rich_message(4, 80), vec![placement(1, 0, None)]),
            (200, rich_message(200, 1500), vec![placement(2, 1, None)]),
            (201, rich_message(201, 10), vec![placement(4, 0, None)]),
            (202, rich_message(202, 10), vec![placement(1, 0, None)]),
        ]
        .into_iter()
        .chain((210..=215).map(|seq| (seq, rich_message(seq, 1200), vec![placement(2, 0, None)])))
        .collect(),
        retained: vec![("sensors/2/temp".into(), 6, rich_message(6, 60))],
        state: vec![
            (
                "mqtt/session/client-a".into(),
                Bytes::from_static(b"v2, replacing v1"),
            ),
            ("stomp/durable/x".into(), Bytes::new()),
        ],
        next_seq: 216,
        next_queue_id: 5,
    }
}

fn copy_dir(from: &Path, to: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let entries = match std::fs::read_dir(from) {
        Ok(e) => e,
        Err(e) => panic!("fixture {} missing: {e}", from.display()),
    };
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => panic!("{e}"),
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Err(e) = std::fs::copy(entry.path(), to.join(&name)) {
            panic!("copy {name}: {e}");
        }
        names.push(name);
    }
    names.sort();
    names
}

/// Opens a copy of the journal in `source` and checks it holds [`expected`].
fn check_journal(name: &str, source: &Path) {
    let tmp = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    let files = copy_dir(source, tmp.path());
    let segments = files.iter().filter(|f| f.ends_with(".seg")).count();
    assert!(segments >= 3, "{name}: several segments: {files:?}");
    let want = expected();
    // Twice: the second open reads what the first (a newer build) left.
    for round in 0..2 {
        let (store, r) = match Store::open(fixture_config(tmp.path())) {
            Ok(x) => x,
            Err(e) => panic!("{name} round {round}: open: {e}"),
        };
        assert!(
            r.report.damaged.is_empty(),
            "{name}: a clean journal reports no damage: {:?}",
            r.report
        );
        assert_eq!(r.queues, want.queues, "{name}: queues");
        assert_eq!(r.bindings, want.bindings, "{name}: bindings");
        assert_eq!(r.state, want.state, "{name}: state");
        let retained: Vec<(String, MessageSeq, Message)> = r
            .retained
            .iter()
            .map(|(t, s, m)| (t.clone(), *s, decode(m.clone())))
            .collect();
        assert_eq!(retained, want.retained, "{name}: retained");
        assert_eq!(r.next_seq, want.next_seq, "{name}: next_seq");
        assert_eq!(r.next_queue_id, want.next_queue_id, "{name}: next_queue_id");
        let messages = match r.messages.read_all() {
            Ok(m) => m,
            Err(e) => panic!("{name}: reading messages: {e}"),
        };
        let got: Vec<(MessageSeq, Message, Vec<RecoveredPlacement>)> = messages
            .into_iter()
            .map(|m| (m.seq, decode(m.body), m.queues))
            .collect();
        let got_seqs: Vec<MessageSeq> = got.iter().map(|m| m.0).collect();
        let want_seqs: Vec<MessageSeq> = want.messages.iter().map(|m| m.0).collect();
        assert_eq!(got_seqs, want_seqs, "{name}: message seqs");
        for (g, w) in got.iter().zip(&want.messages) {
            assert_eq!(g, w, "{name}: message {}", w.0);
        }
        if let Err(e) = store.close() {
            panic!("{name}: close: {e}");
        }
    }
}

#[test]
fn the_v1_journal_fixture_opens_with_its_exact_state() {
    check_journal("journal-v1", &fixture_dir("journal-v1"));
}

/// A journal written by this build holds the same state, so [`expected`]
/// describes what the writer wrote, not a quirk of an old decoder. With
/// `JOURNAL_FIXTURE_OUT` set, the journal is written there (a new fixture,
/// see the module docs) and checked the same way.
#[test]
fn a_journal_written_now_opens_with_the_same_state() {
    let tmp = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    let dir = match std::env::var_os("JOURNAL_FIXTURE_OUT") {
        Some(out) => PathBuf::from(out),
        None => tmp.path().join("written-now"),
    };
    if dir.exists() {
        panic!("{} exists; remove it first", dir.display());
    }
    write_representative_journal(&dir);
    check_journal("written now", &dir);
}
