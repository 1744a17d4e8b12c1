//! `$SYS/broker/...` topics over real MQTT (rumqttc, MQTT 5): retained,
//! refreshed every `[sys] interval_s`, not matched by a `#` subscription,
//! readable only with a permission that reaches `$SYS`, and absent when
//! the interval is 0.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::mqtt::*;
use common::{users_file_access, Account, TestBroker};

/// The topics every refresh publishes (Mosquitto's names).
const TOPICS: [&str; 7] = [
    "$SYS/broker/version",
    "$SYS/broker/uptime",
    "$SYS/broker/clients/connected",
    "$SYS/broker/messages/received",
    "$SYS/broker/messages/sent",
    "$SYS/broker/retained messages/count",
    "$SYS/broker/store/messages/bytes",
];

const LONGEST_WAIT: Duration = Duration::from_secs(15);

/// `alice` may do everything (the bare pattern `#` reaches `$SYS`);
/// `carol` may subscribe to `/topic/#`, which does not.
async fn broker(interval_s: u64) -> (TestBroker, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let access = users_file_access(
        dir.path(),
        false,
        &[
            Account::unrestricted("alice", b"secret"),
            Account::limited("carol", b"pw", &["#"], &["/topic/#"]),
        ],
    );
    let broker = TestBroker::start_with(|c| c.sys.interval_s = interval_s, access).await;
    (broker, dir)
}

/// Reads deliveries into `seen` (topic → latest payload) until `done`.
async fn read_until(
    ev: &mut v5::EventLoop,
    seen: &mut HashMap<String, String>,
    done: impl Fn(&HashMap<String, String>) -> bool,
) {
    let deadline = Instant::now() + LONGEST_WAIT;
    while !done(seen) {
        assert!(Instant::now() < deadline, "gave up waiting; seen: {seen:?}");
        let p = publish5(ev).await;
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        seen.insert(topic, String::from_utf8_lossy(&p.payload).into_owned());
    }
}

#[tokio::test]
async fn sys_topics_are_retained_refreshed_and_need_permission() {
    let (broker, _dir) = broker(1).await;
    let (alice, mut alice_ev) = connected5_as(&broker, "alice-sys", "alice", "secret").await;
    let codes = subscribe_many5(&alice, &mut alice_ev, &["$SYS/broker/#"]).await;
    assert_eq!(
        codes,
        [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
    );
    let mut seen = HashMap::new();
    read_until(&mut alice_ev, &mut seen, |s| {
        TOPICS.iter().all(|t| s.contains_key(*t))
    })
    .await;
    assert!(
        seen["$SYS/broker/version"].starts_with("rosetta version "),
        "{seen:?}"
    );
    assert!(seen["$SYS/broker/uptime"].ends_with(" seconds"), "{seen:?}");
    for t in &TOPICS[2..] {
        seen[*t]
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("{t}: {seen:?}"));
    }

    // A `#` subscriber gets ordinary topics but never `$SYS` ones, though
    // they are refreshed every second meanwhile.
    let (all, mut all_ev) = connected5_as(&broker, "alice-all", "alice", "secret").await;
    subscribe_many5(&all, &mut all_ev, &["#"]).await;
    // (Published by the subscriber itself: rumqttc sends while its event
    // loop is polled, and this one is polled below.)
    all.publish("plain/topic", v5::QoS::AtLeastOnce, false, "hello")
        .await
        .expect("publish");
    let started = Instant::now();
    let mut plain = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        match tokio::time::timeout(Duration::from_millis(200), all_ev.poll()).await {
            Ok(Ok(v5::Event::Incoming(v5::Packet::Publish(p)))) => {
                assert!(!p.topic.starts_with(b"$"), "`#` matched {p:?}");
                plain += 1;
            }
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(e)) => panic!("connection error: {e}"),
        }
    }
    assert_eq!(plain, 1, "the plain publish arrived once");

    // The refreshes carry what changed: the publish, the uptime, the two
    // clients now connected (the first refresh ran before any).
    let uptime = seen["$SYS/broker/uptime"].clone();
    read_until(&mut alice_ev, &mut seen, |s| {
        s["$SYS/broker/messages/received"] != "0"
            && s["$SYS/broker/uptime"] != uptime
            && s["$SYS/broker/clients/connected"] == "2"
    })
    .await;

    // Without a permission reaching $SYS, subscribing is refused.
    let (carol, mut carol_ev) = connected5_as(&broker, "carol-sys", "carol", "pw").await;
    let codes = subscribe_many5(&carol, &mut carol_ev, &["$SYS/broker/uptime", "plain/#"]).await;
    assert_eq!(
        codes,
        [
            v5::SubscribeReasonCode::NotAuthorized,
            v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)
        ]
    );
    // The driving of alice's and all's event loops ends with the test.
    drop((alice, all));
}

#[tokio::test]
async fn an_interval_of_0_publishes_no_sys_topics() {
    let (broker, _dir) = broker(0).await;
    let (alice, mut ev) = connected5_as(&broker, "alice-none", "alice", "secret").await;
    settle().await;
    let codes = subscribe_many5(&alice, &mut ev, &["$SYS/#"]).await;
    assert_eq!(
        codes,
        [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
    );
    quiet5(&mut ev).await;
    assert_eq!(broker.core().retained_count(), 0);
}
