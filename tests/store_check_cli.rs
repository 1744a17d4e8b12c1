//! `rosetta store check --data-dir D`: the recovery report of a stopped
//! broker's journal, offline; non-zero exit on damage; nothing changed.

use std::path::Path;
use std::process::Command;
use std::sync::mpsc;

use rosetta::core::codec;
use rosetta::store::{Opaque, Record, Store, StoreConfig};
use rosetta_neutral::QueueLifetime;

fn commit(store: &Store, records: Vec<Record>) {
    let (tx, rx) = mpsc::channel();
    store.append(
        records,
        Some(Box::new(move |r| {
            let _ = tx.send(r);
        })),
    );
    assert!(matches!(rx.recv(), Ok(Ok(()))));
}

fn check(dir: &Path) -> (bool, String) {
    let out = match Command::new(env!("CARGO_BIN_EXE_rosetta"))
        .args(["store", "check", "--data-dir"])
        .arg(dir)
        .env("ROSETTA_LOG", "off")
        .output()
    {
        Ok(o) => o,
        Err(e) => panic!("run rosetta: {e}"),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn store_check_reports_damage_and_missing_segments_and_changes_nothing() {
    let tmp = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    let dir = tmp.path().join("data");
    let mut config = StoreConfig::new(&dir);
    config.segment_size_bytes = 2048;
    config.compaction_enabled = false;
    let (store, _) = match Store::open(config.clone()) {
        Ok(x) => x,
        Err(e) => panic!("{e}"),
    };
    commit(
        &store,
        vec![codec::queue_declare_record(
            1,
            "orders",
            QueueLifetime::Permanent,
        )],
    );
    for seq in 0..40 {
        commit(
            &store,
            vec![Record::Message {
                seq,
                queues: vec![1],
                body: Opaque::Bytes("x".repeat(200).into()),
            }],
        );
    }
    if let Err(e) = store.close() {
        panic!("{e}");
    }
    let (ok, text) = check(&dir);
    assert!(ok, "a clean journal: {text}");
    assert!(text.contains("clean"), "{text}");

    // Flip a byte in the middle of the first segment's first entry body.
    let first = dir.join("00000000000000000001.seg");
    let mut data = std::fs::read(&first).unwrap_or_default();
    let at = 48 + 32 + 60;
    data[at] ^= 0x10;
    if let Err(e) = std::fs::write(&first, &data) {
        panic!("{e}");
    }
    let (ok, text) = check(&dir);
    assert!(!ok, "damage exits non-zero: {text}");
    assert!(
        text.contains("damaged, skipped") && text.contains("lost"),
        "{text}"
    );
    assert_eq!(
        std::fs::read(&first).unwrap_or_default(),
        data,
        "nothing changed"
    );

    std::fs::remove_file(dir.join("00000000000000000002.seg")).unwrap_or_default();
    let (ok, text) = check(&dir);
    assert!(!ok);
    assert!(text.contains("00000000000000000002.seg: MISSING"), "{text}");
}
