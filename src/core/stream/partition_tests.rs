//! Partitioned streams in the core: routing by key, readers of all
//! partitions, a group's partitions spread over its members and moved
//! when one leaves, and a restart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rosetta_neutral::*;

use crate::tests::{open, text};
use crate::ManualClock;

use super::partition::murmur3_32;
use super::tests::{consume, deliveries, publish_messages, quiet, read, start};
use super::StreamRule;

const PARTITIONS: u32 = 3;

fn rule() -> StreamRule {
    StreamRule {
        pattern: "orders".into(),
        max_age_s: None,
        max_bytes: None,
        segment_bytes: rosetta_store::log::LOG_SEGMENT_DEFAULT_BYTES,
        partitions: PARTITIONS,
        partition_key: Some("customer".into()),
    }
}

/// `n` messages for each of `keys`, keyed by `JMSXGroupID` (AMQP
/// `group-id`) for even keys and the configured `customer` property for
/// odd ones; bodies `<key>:<i>`.
fn keyed(keys: &[&str], n: usize) -> Vec<Message> {
    let mut out = Vec::new();
    for i in 0..n {
        for (k, key) in keys.iter().enumerate() {
            let mut m = Message::text(format!("{key}:{i}"));
            if k % 2 == 0 {
                m.group_id = Some((*key).into());
            } else {
                m.properties.push("customer", Value::String((*key).into()));
                // The configured property wins over the group.
                m.group_id = Some("ignored".into());
            }
            out.push(m);
        }
    }
    out
}

fn partition_of(key: &str) -> u32 {
    murmur3_32(key.as_bytes(), 104_729) % PARTITIONS
}

fn partition(d: &Delivery) -> u32 {
    d.stream.and_then(|p| p.partition).unwrap_or(u32::MAX)
}

/// Bodies by key, in delivery order.
fn by_key(ds: &[Delivery]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in ds {
        let t = text(d);
        let key = t.split(':').next().unwrap_or_default().to_owned();
        out.entry(key).or_default().push(t);
    }
    out
}

/// Two keys in each of the 3 partitions (1, 2, 0, 1, 0, 2).
const KEYS: [&str; 6] = ["alice", "bob", "mallory", "niaj", "olivia", "carol"];

#[test]
fn a_publish_goes_to_its_keys_partition_and_a_reader_without_a_group_reads_all_in_order_per_key() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    let core = start(d.path(), vec![rule()], &clock);
    let (mut s, ev) = open(&core, "a");
    publish_messages(&mut s, &ev, "orders", keyed(&KEYS, 4));
    // Keyless: round-robin over the partitions.
    publish_messages(
        &mut s,
        &ev,
        "orders",
        (0..3).map(|i| Message::text(format!("none:{i}"))).collect(),
    );
    consume(&mut s, "orders", 100, read(Some(StreamOffset::First), None)).expect("all");
    let got = deliveries(&ev, 27);
    for (key, bodies) in by_key(&got) {
        let want: Vec<String> = (0..bodies.len()).map(|i| format!("{key}:{i}")).collect();
        assert_eq!(bodies, want, "order per key");
    }
    for d in got.iter().filter(|d| !text(d).starts_with("none")) {
        let key = text(d).split(':').next().unwrap_or_default().to_owned();
        assert_eq!(
            partition(d),
            partition_of(&key),
            "{key} in its hash's partition"
        );
    }
    let keyless: BTreeSet<u32> = got
        .iter()
        .filter(|d| text(d).starts_with("none"))
        .map(partition)
        .collect();
    assert_eq!(keyless.len(), 3, "round-robin: one in each partition");
    // A partition is a stream of its own, read directly.
    let (mut r, rev) = open(&core, "b");
    consume(
        &mut r,
        "orders-1",
        100,
        read(Some(StreamOffset::First), None),
    )
    .expect("one");
    let n = got.iter().filter(|d| partition(d) == 1).count();
    let one = deliveries(&rev, n);
    assert!(one
        .iter()
        .all(|d| d.stream.is_some_and(|p| p.partition.is_none())));
    let offsets: Vec<u64> = one
        .iter()
        .filter_map(|d| d.stream.map(|p| p.offset))
        .collect();
    assert_eq!(
        offsets,
        (0..n as u64).collect::<Vec<_>>(),
        "its own dense offsets"
    );
    assert!(quiet(&rev).is_empty());
}

/// The partitions `consumer`'s deliveries came from.
fn partitions_of(ds: &[Delivery]) -> BTreeSet<u32> {
    ds.iter().map(partition).collect()
}

#[test]
fn a_groups_members_share_the_partitions_and_a_leaving_members_partitions_resume_at_the_committed_offsets(
) {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    let core = start(d.path(), vec![rule()], &clock);
    let (mut p, pev) = open(&core, "producer");
    let (mut a, aev) = open(&core, "a");
    let (mut b, bev) = open(&core, "b");
    let ca = consume(
        &mut a,
        "orders",
        100,
        read(Some(StreamOffset::First), Some("g")),
    )
    .expect("a");
    consume(&mut b, "orders", 100, read(None, Some("g"))).expect("b");
    publish_messages(&mut p, &pev, "orders", keyed(&KEYS, 3));
    let (pa, pb) = {
        let all = deliveries(&aev, 1);
        let mut got_a = all;
        let mut got_b = Vec::new();
        // 18 deliveries in all, split between the two.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while got_a.len() + got_b.len() < 18 {
            assert!(
                std::time::Instant::now() < deadline,
                "{} + {}",
                got_a.len(),
                got_b.len()
            );
            got_a.extend(aev.deliveries());
            got_b.extend(bev.deliveries());
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        (got_a, got_b)
    };
    let (sa, sb) = (partitions_of(&pa), partitions_of(&pb));
    assert!(sa.is_disjoint(&sb), "{sa:?} and {sb:?}");
    assert_eq!(
        sa.len() + sb.len(),
        3,
        "every partition read: {sa:?} {sb:?}"
    );
    assert!(sa.len().abs_diff(sb.len()) <= 1, "balanced: {sa:?} {sb:?}");
    for (key, bodies) in by_key(&pa).into_iter().chain(by_key(&pb)) {
        assert_eq!(
            bodies,
            (0..3).map(|i| format!("{key}:{i}")).collect::<Vec<_>>()
        );
    }
    assert!(quiet(&aev).is_empty() && quiet(&bev).is_empty());
    // `a` acknowledges all but its last delivery of each partition, then
    // leaves: `b` takes its partitions at the group's committed offsets,
    // so it is sent exactly those unacknowledged ones again.
    let mut last: BTreeMap<u32, &Delivery> = BTreeMap::new();
    for d in &pa {
        last.insert(partition(d), d);
    }
    for d in &pa {
        if !last.values().any(|l| l.tag == d.tag) {
            a.settle(ca, d.tag, Outcome::Accept, None, false)
                .expect("ack");
        }
    }
    a.close(CloseKind::Clean);
    let again = deliveries(&bev, last.len());
    let mut again_texts: Vec<String> = again.iter().map(text).collect();
    let mut want: Vec<String> = last.values().map(|d| text(d)).collect();
    again_texts.sort();
    want.sort();
    assert_eq!(again_texts, want, "only what `a` never acknowledged");
    assert_eq!(partitions_of(&again), sa);
    assert!(quiet(&bev).is_empty());
    // From now on `b` reads every partition.
    publish_messages(&mut p, &pev, "orders", keyed(&KEYS, 1));
    let rest = deliveries(&bev, KEYS.len());
    assert_eq!(partitions_of(&rest).len(), 3);
}

#[test]
fn a_partitioned_stream_and_its_groups_offsets_survive_a_restart() {
    let d = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000));
    {
        let core = start(d.path(), vec![rule()], &clock);
        let (mut s, ev) = open(&core, "a");
        publish_messages(&mut s, &ev, "orders", keyed(&KEYS, 2));
        let c = consume(
            &mut s,
            "orders",
            100,
            read(Some(StreamOffset::First), Some("g")),
        )
        .expect("member");
        let got = deliveries(&ev, 12);
        let mut tickets = 0;
        for d in &got {
            let t = s
                .settle(c, d.tag, Outcome::Accept, None, true)
                .expect("ack");
            tickets += usize::from(t.is_some());
        }
        assert_eq!(
            tickets, 12,
            "each in-order ack moves its partition's offset"
        );
        // Wait for the journaled commits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut done = 0;
        while done < tickets {
            assert!(std::time::Instant::now() < deadline, "commits");
            done += ev.take_committed().len();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        s.close(CloseKind::Clean);
    }
    let core = start(d.path(), vec![rule()], &clock);
    let (mut s, ev) = open(&core, "b");
    publish_messages(&mut s, &ev, "orders", keyed(&KEYS, 3).split_off(12));
    consume(&mut s, "orders", 100, read(None, Some("g"))).expect("resume");
    let got = deliveries(&ev, 6);
    let mut texts: Vec<String> = got.iter().map(text).collect();
    texts.sort();
    let mut want: Vec<String> = KEYS.iter().map(|k| format!("{k}:2")).collect();
    want.sort();
    assert_eq!(
        texts, want,
        "resumed past everything acknowledged, in every partition"
    );
    assert!(quiet(&ev).is_empty());
}
