//! Partitioned streams over real sockets (`[[streams]]` with
//! `partitions = 3`, `partition_key = "customer"`): publishes keyed by a
//! STOMP header, an MQTT 5 user property and an AMQP `group-id`; a
//! consumer group of a STOMP member and an AMQP member (the same group:
//! STOMP `x-stream-group:billing/orders-reader` is the AMQP link
//! `orders-reader` of container `billing`) each reading a disjoint set of
//! partitions in order per key; an MQTT reader of all partitions; a
//! member leaving (its TCP connection dropped) and its partitions resumed
//! by the other at the committed offsets; an MQTT shared subscription
//! (`$share/billing/$stream/orders`) as a member of the group `billing`;
//! and a group across a `kill -9` of the broker process.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mqtt::{self, v5};
use common::stomp::{Frame, StompClient};
use common::{amqp, TestBroker};
use fe2o3_amqp::types::messaging::annotations::OwnedKey;
use fe2o3_amqp::types::messaging::{Body, Message, Properties};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use rosetta::config::StreamEntry;
use rosetta::core::AllowAll;

const DEST: &str = "/queue/orders";
/// Two keys in each of the three partitions (murmur3 with RabbitMQ's seed,
/// mod 3: 1, 2, 0, 1, 0, 2).
const KEYS: [&str; 6] = ["alice", "bob", "mallory", "niaj", "olivia", "carol"];
const PER_KEY: usize = 3;
const PARTITION: &str = "x-stream-partition";

async fn broker() -> TestBroker {
    TestBroker::start_with(
        |c| {
            c.streams.push(StreamEntry {
                name: Some("orders".into()),
                partitions: Some(3),
                partition_key: Some("customer".into()),
                ..StreamEntry::default()
            })
        },
        Arc::new(AllowAll),
    )
    .await
}

/// Body of message `i` of `key`.
fn body(key: &str, i: usize) -> String {
    format!("{key}:{i}")
}

/// Bodies by key, in arrival order.
fn by_key(bodies: impl IntoIterator<Item = String>) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for b in bodies {
        let key = b.split(':').next().unwrap_or_default().to_owned();
        out.entry(key).or_default().push(b);
    }
    out
}

fn assert_in_order(bodies: impl IntoIterator<Item = String>, from: usize) {
    for (key, got) in by_key(bodies) {
        let want: Vec<String> = (from..from + got.len()).map(|i| body(&key, i)).collect();
        assert_eq!(got, want, "order of {key}");
    }
}

fn partition_of(f: &Frame) -> u32 {
    f.header(PARTITION)
        .and_then(|p| p.parse().ok())
        .unwrap_or(u32::MAX)
}

/// Publishes `PER_KEY` messages of every key from `from`, each key by its
/// own protocol: STOMP header `customer`, MQTT 5 user property
/// `customer`, AMQP `group-id` (read as JMSXGroupID when the configured
/// property is absent). Each is acknowledged as durable before the next.
async fn publish_all(broker: &TestBroker, from: usize) {
    let mut stomp = StompClient::connect(broker.stomp(), &[]).await;
    let (mc, mut mev, _) = mqtt::connected5(mqtt::opts5(broker, "orders-writer")).await;
    let (_conn, mut session) = amqp::connect_session(broker, "orders-writer").await;
    let mut sender = amqp::sender(&mut session, "w", DEST).await;
    // Key after key (not interleaved), so that round-robin would split a
    // key's messages over the partitions.
    for (k, key) in KEYS.iter().enumerate() {
        for i in from..from + PER_KEY {
            let text = body(key, i);
            match k % 3 {
                0 => {
                    stomp
                        .send_persistent(DEST, &[("customer", key)], text.as_bytes())
                        .await
                }
                1 => {
                    let props = v5::PublishProperties {
                        user_properties: vec![("customer".into(), (*key).into())],
                        ..v5::PublishProperties::default()
                    };
                    mqtt::publish_and_ack5(
                        &mc,
                        &mut mev,
                        "$stream/orders",
                        v5::QoS::AtLeastOnce,
                        false,
                        text.as_bytes(),
                        Some(props),
                    )
                    .await
                }
                _ => {
                    let m = Message::builder()
                        .properties(Properties {
                            group_id: Some((*key).into()),
                            ..Properties::default()
                        })
                        .value(text)
                        .build();
                    amqp::send_accepted(&mut sender, m).await;
                }
            }
        }
    }
    stomp.disconnect().await;
}

/// How long a test waits for what it expects, and polls each client.
const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// The MESSAGEs of two clients until there are `n` in all, then nothing
/// more on either.
async fn both(a: &mut StompClient, b: &mut StompClient, n: usize) -> (Vec<Frame>, Vec<Frame>) {
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + WAIT;
    while got_a.len() + got_b.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} + {}",
            got_a.len(),
            got_b.len()
        );
        got_a.extend(a.recv_within(POLL).await);
        got_b.extend(b.recv_within(POLL).await);
    }
    a.expect_nothing().await;
    b.expect_nothing().await;
    (got_a, got_b)
}

/// The text of an AMQP delivery of any of the three publishers (STOMP and
/// MQTT bodies arrive as data sections, AMQP's as a string value).
fn amqp_text(d: &amqp::AnyDelivery) -> String {
    match d.body() {
        Body::Data(batch) => batch
            .iter()
            .map(|data| String::from_utf8_lossy(&data.0).into_owned())
            .collect(),
        _ => amqp::text_of(d),
    }
}

fn amqp_partition(d: &amqp::AnyDelivery) -> u32 {
    let ann = d.message().message_annotations.as_ref();
    match ann.and_then(|a| a.0.get(&OwnedKey::from(Symbol::from(PARTITION)))) {
        Some(Value::Long(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
        _ => u32::MAX,
    }
}

#[tokio::test]
async fn a_groups_stomp_and_amqp_members_read_disjoint_partitions_in_order_per_key() {
    let broker = broker().await;
    let mut a = StompClient::connect(broker.stomp(), &[]).await;
    a.subscribe(
        "a",
        DEST,
        "client-individual",
        &[
            ("x-stream-group", "billing/orders-reader"),
            ("x-stream-offset", "first"),
            ("prefetch-count", "100"),
        ],
    )
    .await;
    let (_bconn, mut bsession) = amqp::connect_session(&broker, "billing").await;
    let mut b = amqp::receiver(&mut bsession, "orders-reader", DEST).await;
    publish_all(&broker, 0).await;

    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + WAIT;
    while got_a.len() + got_b.len() < KEYS.len() * PER_KEY {
        assert!(
            Instant::now() < deadline,
            "{} + {}",
            got_a.len(),
            got_b.len()
        );
        got_a.extend(a.recv_within(POLL).await);
        if let Ok(d) = tokio::time::timeout(POLL, amqp::recv_any(&mut b)).await {
            b.accept(&d).await.expect("accept");
            got_b.push(d);
        }
    }
    a.expect_nothing().await;
    amqp::recv_nothing(&mut b).await;
    let pa: BTreeSet<u32> = got_a.iter().map(partition_of).collect();
    let pb: BTreeSet<u32> = got_b.iter().map(amqp_partition).collect();
    assert!(pa.is_disjoint(&pb), "{pa:?} and {pb:?}");
    assert_eq!(
        pa.union(&pb).copied().collect::<Vec<_>>(),
        [0, 1, 2],
        "every partition read by one member"
    );
    assert_eq!(
        (pa.len(), pb.len()),
        (2, 1),
        "balanced; the first member keeps two"
    );
    assert_in_order(got_a.iter().map(Frame::text), 0);
    assert_in_order(got_b.iter().map(amqp_text), 0);
    // A key is in one partition, so one member gets all of it.
    let keys_a = by_key(got_a.iter().map(Frame::text));
    let keys_b = by_key(got_b.iter().map(amqp_text));
    assert!(
        keys_a
            .values()
            .chain(keys_b.values())
            .all(|v| v.len() == PER_KEY),
        "{keys_a:?} {keys_b:?}"
    );

    // A reader without a group reads every partition (MQTT 5, `first`),
    // each delivery with its partition's offset and its partition.
    let (c, mut ev, _) = mqtt::connected5(mqtt::opts5(&broker, "orders-all")).await;
    c.subscribe("$stream/orders/first", v5::QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    let mut all = Vec::new();
    while all.len() < KEYS.len() * PER_KEY {
        if let v5::Packet::Publish(p) = mqtt::next5(&mut ev).await.expect("connected") {
            all.push(p);
        }
    }
    let user = |p: &v5::Publish, k: &str| {
        p.properties.as_ref().and_then(|props| {
            props
                .user_properties
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        })
    };
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut partitions_of_key: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &all {
        let (part, offset) = (user(p, PARTITION), user(p, "x-stream-offset"));
        let part = part.unwrap_or_default();
        assert!(
            seen.insert((part.clone(), offset.unwrap_or_default())),
            "offsets are per partition: {part:?}"
        );
        let text = String::from_utf8_lossy(&p.payload).into_owned();
        let key = text.split(':').next().unwrap_or_default().to_owned();
        partitions_of_key.entry(key).or_default().insert(part);
    }
    assert_eq!(partitions_of_key.len(), KEYS.len());
    assert!(
        partitions_of_key.values().all(|ps| ps.len() == 1),
        "each key in one partition: {partitions_of_key:?}"
    );
    assert_in_order(
        all.iter()
            .map(|p| String::from_utf8_lossy(&p.payload).into_owned()),
        0,
    );
}

#[tokio::test]
async fn a_leaving_members_partitions_go_to_the_other_member_at_the_committed_offsets() {
    let broker = broker().await;
    let group = [("x-stream-group", "g"), ("prefetch-count", "100")];
    let mut a = StompClient::connect(broker.stomp(), &[]).await;
    a.subscribe("a", DEST, "client-individual", &group).await;
    let mut b = StompClient::connect(broker.stomp(), &[]).await;
    b.subscribe("b", DEST, "client-individual", &group).await;
    publish_all(&broker, 0).await;
    let (got_a, got_b) = both(&mut a, &mut b, KEYS.len() * PER_KEY).await;
    let pa: BTreeSet<u32> = got_a.iter().map(partition_of).collect();
    let pb: BTreeSet<u32> = got_b.iter().map(partition_of).collect();
    assert!(
        pa.is_disjoint(&pb) && pa.len() + pb.len() == 3,
        "{pa:?} {pb:?}"
    );
    // `a` acknowledges all but its last delivery of each partition (ACKs
    // with receipts: the group's offsets are durable), then its
    // connection drops without a DISCONNECT.
    let mut last: BTreeMap<u32, &Frame> = BTreeMap::new();
    for f in &got_a {
        last.insert(partition_of(f), f);
    }
    let unacked: BTreeSet<String> = last.values().map(|f| f.text()).collect();
    for f in got_a.iter().filter(|f| !unacked.contains(&f.text())) {
        a.ack(f).await;
    }
    drop(a);
    // `b` now reads `a`'s partitions from the committed offsets: exactly
    // what `a` never acknowledged, then whatever comes.
    let again = b.messages(unacked.len()).await;
    b.expect_nothing().await;
    assert_eq!(
        again.iter().map(Frame::text).collect::<BTreeSet<_>>(),
        unacked,
        "nothing acknowledged sent again, nothing unacknowledged lost"
    );
    assert_eq!(again.iter().map(partition_of).collect::<BTreeSet<_>>(), pa);
    publish_all(&broker, PER_KEY).await;
    let rest = b.messages(KEYS.len() * PER_KEY).await;
    b.expect_nothing().await;
    assert_eq!(
        rest.iter().map(partition_of).collect::<BTreeSet<_>>().len(),
        3
    );
    assert_in_order(rest.iter().map(Frame::text), PER_KEY);
}

/// The partition of an MQTT 5 delivery (its `x-stream-partition` user
/// property).
fn mqtt_partition(p: &v5::Publish) -> u32 {
    p.properties
        .as_ref()
        .and_then(|props| props.user_properties.iter().find(|(k, _)| k == PARTITION))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(u32::MAX)
}

fn mqtt_text(p: &v5::Publish) -> String {
    String::from_utf8_lossy(&p.payload).into_owned()
}

#[tokio::test]
async fn an_mqtt_shared_subscription_is_a_member_of_the_group_of_its_share_name() {
    let broker = broker().await;
    let mut a = StompClient::connect(broker.stomp(), &[]).await;
    a.subscribe(
        "a",
        DEST,
        "client-individual",
        &[
            ("x-stream-group", "billing"),
            ("x-stream-offset", "first"),
            ("prefetch-count", "100"),
        ],
    )
    .await;
    // rumqttc acknowledges each delivery as it arrives (PUBACK).
    let (m, mut min) = mqtt::driven5(&broker, "billing-mqtt");
    m.subscribe("$share/billing/$stream/orders/bogus", v5::QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    let refused = min.suback().await;
    assert_eq!(
        refused.return_codes,
        [v5::SubscribeReasonCode::TopicFilterInvalid],
        "a bad offset spec in a shared stream filter"
    );
    m.subscribe("$share/billing/$stream/orders", v5::QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    let granted = min.suback().await;
    assert_eq!(
        granted.return_codes,
        [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
    );
    publish_all(&broker, 0).await;

    let (mut got_a, mut got_m) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + WAIT;
    while got_a.len() + got_m.len() < KEYS.len() * PER_KEY {
        assert!(
            Instant::now() < deadline,
            "{} + {}",
            got_a.len(),
            got_m.len()
        );
        got_a.extend(a.recv_within(POLL).await);
        if let Ok(p) = tokio::time::timeout(POLL, min.publish()).await {
            got_m.push(p);
        }
    }
    a.expect_nothing().await;
    let pa: BTreeSet<u32> = got_a.iter().map(partition_of).collect();
    let pm: BTreeSet<u32> = got_m.iter().map(mqtt_partition).collect();
    assert!(pa.is_disjoint(&pm), "{pa:?} and {pm:?}");
    assert_eq!(pa.union(&pm).copied().collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!((pa.len(), pm.len()), (2, 1), "the first member keeps two");
    assert_in_order(got_a.iter().map(Frame::text), 0);
    assert_in_order(got_m.iter().map(mqtt_text), 0);

    // The MQTT member leaves; its partition goes to the STOMP member at
    // the group's committed offset, past everything the MQTT member
    // acknowledged, so the next round starts at message PER_KEY of every
    // key.
    let readers = || {
        broker
            .core()
            .stream_stats("orders-0")
            .expect("stats")
            .map_or(0, |s| s.readers)
    };
    assert_eq!(readers(), 2, "each member reads every partition log");
    m.disconnect().await.expect("disconnect");
    // Gone once its reader is: one reader of each partition log is left.
    let deadline = Instant::now() + WAIT;
    while readers() > 1 {
        assert!(Instant::now() < deadline, "the MQTT member never left");
        tokio::time::sleep(POLL).await;
    }
    publish_all(&broker, PER_KEY).await;
    let rest = a.messages(KEYS.len() * PER_KEY).await;
    a.expect_nothing().await;
    assert_eq!(
        rest.iter().map(partition_of).collect::<BTreeSet<_>>().len(),
        3
    );
    assert_in_order(rest.iter().map(Frame::text), PER_KEY);
}

mod kill_9 {
    //! A partitioned stream and its group across a `kill -9` of the broker
    //! process: every receipted ACK holds, nothing unacknowledged is lost.

    use std::collections::BTreeSet;
    use std::time::Duration;

    use super::common::process::{frame, BrokerProcess, Stomp};
    use super::{body, KEYS};

    const CONFIG: &str = "[store]\nsync = \"every-commit\"\n\n[[streams]]\nname = \"orders\"\npartitions = 3\npartition_key = \"customer\"\n";
    const MESSAGES: usize = 60;
    const ACKED: usize = 25;
    const IO_TIMEOUT: Duration = Duration::from_secs(20);

    fn expect_receipt(s: &mut Stomp, id: &str) {
        match s.read().expect("read") {
            Some(f) if f.command == "RECEIPT" && f.header("receipt-id") == Some(id) => {}
            other => panic!("expected RECEIPT {id}, got {other:?}"),
        }
    }

    fn subscribe(s: &mut Stomp) {
        let headers = [
            ("id", "g"),
            ("destination", super::DEST),
            ("ack", "client-individual"),
            ("prefetch-count", "100"),
            ("x-stream-group", "g"),
            ("receipt", "sub"),
        ];
        s.write(&frame("SUBSCRIBE", &headers, b""))
            .expect("subscribe");
    }

    #[test]
    fn a_group_of_a_partitioned_stream_resumes_at_its_receipted_acks_after_kill_9() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut broker = BrokerProcess::start(dir.path(), &["stomp"], CONFIG);
        let mut s = Stomp::connect(broker.addr("stomp"), IO_TIMEOUT).expect("connect");
        subscribe(&mut s);
        expect_receipt(&mut s, "sub");
        let mut p = Stomp::connect(broker.addr("stomp"), IO_TIMEOUT).expect("connect");
        for i in 0..MESSAGES {
            let key = KEYS[i % KEYS.len()];
            let text = body(key, i / KEYS.len());
            let receipt = format!("w{i}");
            let headers = [
                ("destination", super::DEST),
                ("persistent", "true"),
                ("customer", key),
                ("receipt", receipt.as_str()),
            ];
            p.write(&frame("SEND", &headers, text.as_bytes()))
                .expect("send");
            expect_receipt(&mut p, &receipt);
        }
        let mut got = Vec::new();
        while got.len() < MESSAGES {
            match s.read().expect("read") {
                Some(f) if f.command == "MESSAGE" => got.push(f),
                other => panic!("expected a MESSAGE, got {other:?}"),
            }
        }
        // The first ACKED deliveries are acknowledged, each receipted.
        for (n, f) in got.iter().take(ACKED).enumerate() {
            let id = f.ack_id();
            let receipt = format!("a{n}");
            s.write(&frame("ACK", &[("id", &id), ("receipt", &receipt)], b""))
                .expect("ack");
            expect_receipt(&mut s, &receipt);
        }
        broker.kill();
        let acked: BTreeSet<String> = got.iter().take(ACKED).map(|f| f.text()).collect();
        let everything: BTreeSet<String> = got.iter().map(|f| f.text()).collect();

        let broker = BrokerProcess::start(dir.path(), &["stomp"], CONFIG);
        let mut s = Stomp::connect(broker.addr("stomp"), IO_TIMEOUT).expect("reconnect");
        subscribe(&mut s);
        expect_receipt(&mut s, "sub");
        let mut resumed = BTreeSet::new();
        while resumed.len() < MESSAGES - ACKED {
            match s.read().expect("read") {
                Some(f) if f.command == "MESSAGE" => {
                    assert!(resumed.insert(f.text()), "sent twice: {}", f.text());
                }
                other => panic!("expected a MESSAGE, got {other:?}"),
            }
        }
        let want: BTreeSet<String> = everything.difference(&acked).cloned().collect();
        assert_eq!(
            resumed, want,
            "resumed past every receipted ACK, nothing lost"
        );
        s.stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
        assert!(
            s.read().is_err(),
            "nothing more: nothing acknowledged is sent again"
        );
    }
}
