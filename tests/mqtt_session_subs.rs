//! Shared (`$share/group/filter`) and `$queue/<name>` subscriptions of
//! persistent sessions, over real sockets with rumqttc 3.1.1 and 5.0:
//! kept across disconnects and a broker restart without a new SUBSCRIBE,
//! with the messages that arrived meanwhile; ended by UNSUBSCRIBE and by
//! a clean start.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::collections::BTreeSet;

use common::mqtt::*;
use common::TestBroker;
use rumqttc::QoS;

/// Publishes `tag` at QoS 1 to the shared subscription's topic and to the
/// queue, from a throw-away 3.1.1 client.
async fn publish_both(broker: &TestBroker, topic: &str, queue: &str, tag: &str) {
    publish_once4(
        broker,
        topic,
        QoS::AtLeastOnce,
        false,
        format!("t-{tag}").as_bytes(),
    )
    .await;
    publish_once4(
        broker,
        &format!("$queue/{queue}"),
        QoS::AtLeastOnce,
        false,
        format!("q-{tag}").as_bytes(),
    )
    .await;
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn v311_shared_and_queue_subscriptions_survive_reconnect_and_restart() {
    let mut broker = TestBroker::start().await;
    let (topic, queue) = ("ps4/t", "ps4-jobs");
    let (c, mut ev, ack) = connected4(&broker, "ps4", false).await;
    assert!(!ack.session_present);
    subscribe4(&c, &mut ev, format!("$share/grp/{topic}"), QoS::AtLeastOnce).await;
    subscribe4(&c, &mut ev, format!("$queue/{queue}"), QoS::AtLeastOnce).await;
    disconnect4(&c, &mut ev).await;
    drop(ev);

    // Offline, across a restart: the group queue (durable for a persistent
    // member) and the named queue keep what arrives.
    publish_both(&broker, topic, queue, "1").await;
    broker.restart().await;
    publish_both(&broker, topic, queue, "2").await;

    let (c, mut ev, ack) = connected4(&broker, "ps4", false).await;
    assert!(ack.session_present, "session recovered");
    let mut got = BTreeSet::new();
    for _ in 0..4 {
        let p = publish4(&mut ev).await;
        got.insert(String::from_utf8(p.payload.to_vec()).expect("utf-8"));
    }
    assert_eq!(got, set(&["t-1", "t-2", "q-1", "q-2"]));
    quiet4(&mut ev).await;

    // Still subscribed live, with no new SUBSCRIBE.
    publish_both(&broker, topic, queue, "3").await;
    let mut got = BTreeSet::new();
    for _ in 0..2 {
        let p = publish4(&mut ev).await;
        got.insert(String::from_utf8(p.payload.to_vec()).expect("utf-8"));
    }
    assert_eq!(got, set(&["t-3", "q-3"]));

    // UNSUBSCRIBE from the queue: a resumed session no longer consumes it.
    unsubscribe4(&c, &mut ev, format!("$queue/{queue}")).await;
    disconnect4(&c, &mut ev).await;
    drop(ev);
    broker.restart().await;
    let (c, mut ev, ack) = connected4(&broker, "ps4", false).await;
    assert!(ack.session_present);
    publish_both(&broker, topic, queue, "4").await;
    let p = publish4(&mut ev).await;
    assert_eq!(
        &p.payload[..],
        b"t-4",
        "only the shared subscription is left"
    );
    quiet4(&mut ev).await;
    disconnect4(&c, &mut ev).await;
    drop(ev);

    // A clean session ends the shared subscription too.
    let (c, mut ev, ack) = connected4(&broker, "ps4", true).await;
    assert!(!ack.session_present);
    publish_once4(&broker, topic, QoS::AtLeastOnce, false, b"t-5").await;
    quiet4(&mut ev).await;
    disconnect4(&c, &mut ev).await;
    broker.stop().await;
}

#[tokio::test]
async fn v5_shared_and_queue_subscriptions_survive_reconnect_and_restart() {
    let mut broker = TestBroker::start().await;
    let (topic, queue) = ("ps5/t", "ps5-jobs");
    let opts = |broker: &TestBroker, clean: bool| {
        let mut o = opts5(broker, "ps5");
        o.set_clean_start(clean);
        o.set_session_expiry_interval(Some(300));
        o
    };
    let (c, mut ev, ack) = connected5(opts(&broker, true)).await;
    assert!(!ack.session_present);
    let sub = subscribe5(
        &c,
        &mut ev,
        v5::Filter::new(format!("$share/grp/{topic}"), v5::QoS::AtLeastOnce),
        Some(v5::SubscribeProperties {
            id: Some(9),
            user_properties: Vec::new(),
        }),
    )
    .await;
    assert_eq!(
        sub.return_codes,
        [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
    );
    let sub = subscribe5(
        &c,
        &mut ev,
        v5::Filter::new(format!("$queue/{queue}"), v5::QoS::AtLeastOnce),
        None,
    )
    .await;
    assert_eq!(
        sub.return_codes,
        [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
    );
    disconnect5(&c, &mut ev).await;
    drop(ev);

    publish_both(&broker, topic, queue, "1").await;
    broker.restart().await;
    publish_both(&broker, topic, queue, "2").await;

    let (c, mut ev, ack) = connected5(opts(&broker, false)).await;
    assert!(ack.session_present, "session recovered");
    let mut got = BTreeSet::new();
    for _ in 0..4 {
        let p = publish5(&mut ev).await;
        let payload = String::from_utf8(p.payload.to_vec()).expect("utf-8");
        if payload.starts_with("t-") {
            // The subscription identifier was restored with the binding.
            let ids = p.properties.map(|p| p.subscription_identifiers);
            assert_eq!(ids, Some(vec![9]), "{payload}");
        }
        got.insert(payload);
    }
    assert_eq!(got, set(&["t-1", "t-2", "q-1", "q-2"]));
    quiet5(&mut ev).await;

    // UNSUBSCRIBE from the shared subscription, then a restart: only the
    // queue is consumed.
    unsubscribe5(&c, &mut ev, format!("$share/grp/{topic}")).await;
    disconnect5(&c, &mut ev).await;
    drop(ev);
    broker.restart().await;
    let (c, mut ev, ack) = connected5(opts(&broker, false)).await;
    assert!(ack.session_present);
    publish_both(&broker, topic, queue, "3").await;
    let p = publish5(&mut ev).await;
    assert_eq!(
        &p.payload[..],
        b"q-3",
        "only the queue subscription is left"
    );
    quiet5(&mut ev).await;
    disconnect5(&c, &mut ev).await;
    drop(ev);

    // Clean start: nothing is consumed any more.
    let (c, mut ev, ack) = connected5(opts(&broker, true)).await;
    assert!(!ack.session_present);
    publish_once4(
        &broker,
        &format!("$queue/{queue}"),
        QoS::AtLeastOnce,
        false,
        b"q-4",
    )
    .await;
    quiet5(&mut ev).await;
    disconnect5(&c, &mut ev).await;
    broker.stop().await;
}

/// Two persistent members of one group: messages are split between them;
/// while one is away the other gets everything, and a member's own
/// restored consumer competes again after it comes back.
#[tokio::test]
async fn restored_member_rejoins_its_group() {
    let broker = TestBroker::start().await;
    let filter = "$share/pair/pair/t";
    let (a, mut aev, _) = connected4(&broker, "pair-a", false).await;
    subscribe4(&a, &mut aev, filter, QoS::AtLeastOnce).await;
    let (b, mut bev) = subscriber4(&broker, "pair-b", false, filter, QoS::AtLeastOnce).await;
    disconnect4(&b, &mut bev).await;
    drop(bev);

    // b is away: a gets them all (nothing waits for b's return).
    for i in 0..4 {
        publish_once4(
            &broker,
            "pair/t",
            QoS::AtLeastOnce,
            false,
            format!("{i}").as_bytes(),
        )
        .await;
    }
    for _ in 0..4 {
        publish4(&mut aev).await;
    }

    // b resumes without SUBSCRIBE and takes a share again.
    let (_b, mut bev, ack) = connected4(&broker, "pair-b", false).await;
    assert!(ack.session_present);
    for i in 0..10 {
        publish_once4(
            &broker,
            "pair/t",
            QoS::AtLeastOnce,
            false,
            format!("x{i}").as_bytes(),
        )
        .await;
    }
    let (na, nb) = tokio::join!(count_publishes(&mut aev), count_publishes(&mut bev));
    assert_eq!(na + nb, 10, "each message once");
    assert!(nb > 0, "the resumed member gets a share ({na}/{nb})");
    broker.stop().await;
}

/// PUBLISH packets received until the connection has been quiet for
/// [`QUIET`].
async fn count_publishes(ev: &mut rumqttc::EventLoop) -> usize {
    let mut n = 0;
    loop {
        match tokio::time::timeout(QUIET, ev.poll()).await {
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(_)))) => n += 1,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("connection error: {e}"),
            Err(_) => return n,
        }
    }
}
