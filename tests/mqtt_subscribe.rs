//! MQTT SUBSCRIBE/UNSUBSCRIBE over real sockets: wildcards and `$` topics,
//! granted QoS, overlapping subscriptions, v5 subscription options
//! (no-local, retain-as-published, retain-handling), subscription
//! identifiers and shared subscriptions.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use common::mqtt::*;
use common::TestBroker;
use rumqttc::v5::mqttbytes::QoS as Q5;
use rumqttc::QoS;

/// Topics received until nothing more comes.
async fn drain_topics4(ev: &mut rumqttc::EventLoop) -> Vec<String> {
    let mut topics = Vec::new();
    while let Ok(Ok(p)) = tokio::time::timeout(QUIET, next4(ev)).await {
        if let rumqttc::Packet::Publish(p) = p {
            topics.push(p.topic);
        }
    }
    topics.sort();
    topics
}

#[tokio::test]
async fn wildcards_plus_and_hash() {
    let broker = TestBroker::start().await;
    let (_a, mut plus) = subscriber4(&broker, "plus", true, "w/+/c", QoS::AtLeastOnce).await;
    let (_b, mut hash) = subscriber4(&broker, "hash", true, "w/#", QoS::AtLeastOnce).await;
    let (_c, mut mid) = subscriber4(&broker, "mid", true, "+/b/#", QoS::AtLeastOnce).await;
    for t in ["w/b/c", "w/b/d", "w/x/c", "w", "w/b/c/d", "x/b/c", "w/b"] {
        publish_once4(&broker, t, QoS::AtLeastOnce, false, b"m").await;
    }
    assert_eq!(drain_topics4(&mut plus).await, ["w/b/c", "w/x/c"]);
    assert_eq!(
        drain_topics4(&mut hash).await,
        ["w", "w/b", "w/b/c", "w/b/c/d", "w/b/d", "w/x/c"]
    );
    assert_eq!(
        drain_topics4(&mut mid).await,
        ["w/b", "w/b/c", "w/b/c/d", "w/b/d", "x/b/c"]
    );
    broker.stop().await;
}

#[tokio::test]
async fn dollar_topics_are_not_matched_by_leading_wildcards() {
    let broker = TestBroker::start().await;
    let (_a, mut all) = subscriber4(&broker, "all", true, "#", QoS::AtLeastOnce).await;
    let (_b, mut lvl) = subscriber4(&broker, "lvl", true, "+/status", QoS::AtLeastOnce).await;
    let (_c, mut dollar) = subscriber4(&broker, "dol", true, "$app/#", QoS::AtLeastOnce).await;
    publish_once4(&broker, "$app/status", QoS::AtLeastOnce, true, b"d").await;
    publish_once4(&broker, "dev/status", QoS::AtLeastOnce, false, b"n").await;
    assert_eq!(drain_topics4(&mut all).await, ["dev/status"]);
    assert_eq!(drain_topics4(&mut lvl).await, ["dev/status"]);
    assert_eq!(drain_topics4(&mut dollar).await, ["$app/status"]);
    // Retained `$` messages are not matched by leading wildcards either.
    let (_d, mut late_all) = subscriber4(&broker, "late-all", true, "#", QoS::AtLeastOnce).await;
    assert!(drain_topics4(&mut late_all).await.is_empty());
    let (_e, mut late_dollar) =
        subscriber4(&broker, "late-dol", true, "$app/+", QoS::AtLeastOnce).await;
    assert_eq!(drain_topics4(&mut late_dollar).await, ["$app/status"]);
    broker.stop().await;
}

#[tokio::test]
async fn granted_qos_is_the_minimum_of_subscription_and_publish() {
    let broker = TestBroker::start().await;
    let (_a, mut q0) = subscriber4(&broker, "g0", true, "g/t", QoS::AtMostOnce).await;
    let (_b, mut q1) = subscriber4(&broker, "g1", true, "g/t", QoS::AtLeastOnce).await;
    let (_c, mut q2) = subscriber4(&broker, "g2", true, "g/t", QoS::ExactlyOnce).await;
    publish_once4(&broker, "g/t", QoS::ExactlyOnce, false, b"2").await;
    publish_once4(&broker, "g/t", QoS::AtLeastOnce, false, b"1").await;
    publish_once4(&broker, "g/t", QoS::AtMostOnce, false, b"0").await;
    for (ev, want) in [
        (&mut q0, [QoS::AtMostOnce; 3]),
        (
            &mut q1,
            [QoS::AtLeastOnce, QoS::AtLeastOnce, QoS::AtMostOnce],
        ),
        (
            &mut q2,
            [QoS::ExactlyOnce, QoS::AtLeastOnce, QoS::AtMostOnce],
        ),
    ] {
        for w in want {
            assert_eq!(publish4(ev).await.qos, w);
        }
    }
    broker.stop().await;
}

#[tokio::test]
async fn server_qos_maximum_caps_the_granted_qos() {
    let broker =
        TestBroker::start_with(|c| c.mqtt.qos_max = 1, Arc::new(rosetta::core::AllowAll)).await;
    let (c, mut ev, _) = connected4(&broker, "capped", true).await;
    let ack = subscribe4(&c, &mut ev, "cap/t", QoS::ExactlyOnce).await;
    assert_eq!(
        ack.return_codes,
        [rumqttc::SubscribeReasonCode::Success(QoS::AtLeastOnce)]
    );
    broker.stop().await;
}

#[tokio::test]
async fn unsubscribe_stops_delivery() {
    let broker = TestBroker::start().await;
    let (c, mut ev) = subscriber4(&broker, "unsub", true, "u/t", QoS::AtLeastOnce).await;
    publish_once4(&broker, "u/t", QoS::AtLeastOnce, false, b"before").await;
    assert_eq!(&publish4(&mut ev).await.payload[..], b"before");
    unsubscribe4(&c, &mut ev, "u/t").await;
    publish_once4(&broker, "u/t", QoS::AtLeastOnce, false, b"after").await;
    quiet4(&mut ev).await;
    broker.stop().await;
}

#[tokio::test]
async fn overlapping_subscriptions_deliver_once_at_highest_qos_with_all_ids() {
    let broker = TestBroker::start().await;
    // v5: two filters, two identifiers.
    let (c, mut ev, _) = connected5(opts5(&broker, "ov5")).await;
    for (filter, qos, id) in [("ov/+", Q5::AtMostOnce, 1), ("ov/#", Q5::ExactlyOnce, 2)] {
        let props = v5::SubscribeProperties {
            id: Some(id),
            user_properties: vec![],
        };
        subscribe5(&c, &mut ev, v5::Filter::new(filter, qos), Some(props)).await;
    }
    // v3.1.1: same overlap without identifiers.
    let (c4, mut ev4) = subscriber4(&broker, "ov4", true, "ov/+", QoS::AtMostOnce).await;
    subscribe4(&c4, &mut ev4, "ov/#", QoS::AtLeastOnce).await;

    publish_once4(&broker, "ov/x", QoS::ExactlyOnce, false, b"once").await;
    let p = publish5(&mut ev).await;
    assert_eq!(p.qos, Q5::ExactlyOnce);
    let mut ids = p.properties.expect("properties").subscription_identifiers;
    ids.sort_unstable();
    assert_eq!(ids, [1, 2]);
    quiet5(&mut ev).await;

    let p = publish4(&mut ev4).await;
    assert_eq!(p.qos, QoS::AtLeastOnce);
    quiet4(&mut ev4).await;

    // Only one filter matches: only its identifier.
    publish_once4(&broker, "ov/x/y", QoS::AtLeastOnce, false, b"deep").await;
    let p = publish5(&mut ev).await;
    assert_eq!(
        p.properties.expect("properties").subscription_identifiers,
        [2]
    );
    broker.stop().await;
}

#[tokio::test]
async fn v5_no_local() {
    let broker = TestBroker::start().await;
    let (me, mut my_ev, _) = connected5(opts5(&broker, "nl-me")).await;
    let mut f = v5::Filter::new("nl/t", Q5::AtLeastOnce);
    f.nolocal = true;
    subscribe5(&me, &mut my_ev, f, None).await;
    let (other, mut other_ev, _) = connected5(opts5(&broker, "nl-other")).await;
    subscribe5(
        &other,
        &mut other_ev,
        v5::Filter::new("nl/t", Q5::AtLeastOnce),
        None,
    )
    .await;

    publish_and_ack5(
        &me,
        &mut my_ev,
        "nl/t",
        Q5::AtLeastOnce,
        false,
        b"mine",
        None,
    )
    .await;
    assert_eq!(&publish5(&mut other_ev).await.payload[..], b"mine");
    quiet5(&mut my_ev).await;
    // Without no-local, own messages come back.
    publish_and_ack5(
        &other,
        &mut other_ev,
        "nl/t",
        Q5::AtLeastOnce,
        false,
        b"echo",
        None,
    )
    .await;
    assert_eq!(&publish5(&mut other_ev).await.payload[..], b"echo");
    assert_eq!(&publish5(&mut my_ev).await.payload[..], b"echo");
    broker.stop().await;
}

#[tokio::test]
async fn v5_retain_as_published() {
    let broker = TestBroker::start().await;
    let (c, mut ev, _) = connected5(opts5(&broker, "rap")).await;
    let mut keep = v5::Filter::new("rap/keep", Q5::AtLeastOnce);
    keep.preserve_retain = true;
    subscribe5(&c, &mut ev, keep, None).await;
    subscribe5(
        &c,
        &mut ev,
        v5::Filter::new("rap/clear", Q5::AtLeastOnce),
        None,
    )
    .await;
    publish_once4(&broker, "rap/keep", QoS::AtLeastOnce, true, b"k").await;
    publish_once4(&broker, "rap/clear", QoS::AtLeastOnce, true, b"c").await;
    let a = publish5(&mut ev).await;
    let b = publish5(&mut ev).await;
    assert_eq!((a.topic.as_ref(), a.retain), (&b"rap/keep"[..], true));
    assert_eq!((b.topic.as_ref(), b.retain), (&b"rap/clear"[..], false));
    broker.stop().await;
}

#[tokio::test]
async fn v5_retain_handling() {
    let broker = TestBroker::start().await;
    publish_once4(&broker, "rh/t", QoS::AtLeastOnce, true, b"r").await;
    let (c, mut ev, _) = connected5(opts5(&broker, "rh")).await;
    let filter = |rule| {
        let mut f = v5::Filter::new("rh/t", Q5::AtLeastOnce);
        f.retain_forward_rule = rule;
        f
    };
    // 0: on every subscribe, also when the subscription already exists.
    for _ in 0..2 {
        subscribe5(
            &c,
            &mut ev,
            filter(v5::RetainForwardRule::OnEverySubscribe),
            None,
        )
        .await;
        let p = publish5(&mut ev).await;
        assert!(p.retain);
    }
    unsubscribe5(&c, &mut ev, "rh/t").await;
    // 1: only when the subscription is new.
    subscribe5(
        &c,
        &mut ev,
        filter(v5::RetainForwardRule::OnNewSubscribe),
        None,
    )
    .await;
    assert!(publish5(&mut ev).await.retain);
    subscribe5(
        &c,
        &mut ev,
        filter(v5::RetainForwardRule::OnNewSubscribe),
        None,
    )
    .await;
    quiet5(&mut ev).await;
    unsubscribe5(&c, &mut ev, "rh/t").await;
    // 2: never.
    subscribe5(&c, &mut ev, filter(v5::RetainForwardRule::Never), None).await;
    quiet5(&mut ev).await;
    // Live messages still flow.
    publish_once4(&broker, "rh/t", QoS::AtLeastOnce, false, b"live").await;
    assert_eq!(&publish5(&mut ev).await.payload[..], b"live");
    broker.stop().await;
}

#[tokio::test]
async fn v5_subscription_identifier_follows_the_latest_subscribe() {
    let broker = TestBroker::start().await;
    let (c, mut ev, _) = connected5(opts5(&broker, "sid")).await;
    let sub = |id| v5::SubscribeProperties {
        id: Some(id),
        user_properties: vec![],
    };
    subscribe5(
        &c,
        &mut ev,
        v5::Filter::new("sid/t", Q5::AtLeastOnce),
        Some(sub(7)),
    )
    .await;
    publish_once4(&broker, "sid/t", QoS::AtLeastOnce, false, b"a").await;
    let p = publish5(&mut ev).await;
    assert_eq!(p.properties.expect("props").subscription_identifiers, [7]);
    // Re-subscribing replaces the subscription and its identifier.
    subscribe5(
        &c,
        &mut ev,
        v5::Filter::new("sid/t", Q5::AtLeastOnce),
        Some(sub(268_435_455)),
    )
    .await;
    publish_once4(&broker, "sid/t", QoS::AtLeastOnce, false, b"b").await;
    let p = publish5(&mut ev).await;
    assert_eq!(
        p.properties.expect("props").subscription_identifiers,
        [268_435_455]
    );
    // Without identifier: none on delivery.
    subscribe5(&c, &mut ev, v5::Filter::new("sid/t", Q5::AtLeastOnce), None).await;
    publish_once4(&broker, "sid/t", QoS::AtLeastOnce, false, b"c").await;
    let p = publish5(&mut ev).await;
    assert!(p
        .properties
        .map(|p| p.subscription_identifiers.is_empty())
        .unwrap_or(true));
    broker.stop().await;
}

#[tokio::test]
async fn shared_subscriptions_split_the_load() {
    let broker = TestBroker::start().await;
    let (a, mut aev, _) = connected5(opts5(&broker, "share-a")).await;
    subscribe5(
        &a,
        &mut aev,
        v5::Filter::new("$share/g/sh/t", Q5::AtLeastOnce),
        None,
    )
    .await;
    let (_b, mut bev) =
        subscriber4(&broker, "share-b", true, "$share/g/sh/t", QoS::AtLeastOnce).await;
    let (_n, mut nev) = subscriber4(&broker, "share-n", true, "sh/t", QoS::AtLeastOnce).await;

    let (p, mut pev, _) = connected4(&broker, "share-pub", true).await;
    for i in 0..20u8 {
        publish_and_ack4(&p, &mut pev, "sh/t", QoS::AtLeastOnce, false, &[i]).await;
    }
    let mut got_a = Vec::new();
    while let Ok(Ok(pkt)) = tokio::time::timeout(QUIET, next5(&mut aev)).await {
        if let v5::Packet::Publish(m) = pkt {
            assert_eq!(m.topic, Bytes::from_static(b"sh/t"));
            got_a.push(m.payload[0]);
        }
    }
    let mut got_b = Vec::new();
    while let Ok(Ok(pkt)) = tokio::time::timeout(QUIET, next4(&mut bev)).await {
        if let rumqttc::Packet::Publish(m) = pkt {
            got_b.push(m.payload[0]);
        }
    }
    assert!(
        !got_a.is_empty() && !got_b.is_empty(),
        "a {got_a:?} b {got_b:?}"
    );
    let all: HashSet<u8> = got_a.iter().chain(&got_b).copied().collect();
    assert_eq!(got_a.len() + got_b.len(), 20, "a {got_a:?} b {got_b:?}");
    assert_eq!(all, (0..20).collect());
    // The ordinary subscriber gets every message.
    let mut n = 0;
    while let Ok(Ok(pkt)) = tokio::time::timeout(QUIET, next4(&mut nev)).await {
        if let rumqttc::Packet::Publish(_) = pkt {
            n += 1;
        }
    }
    assert_eq!(n, 20);
    broker.stop().await;
}

/// Deliveries a shared-subscription member never acknowledged go to another
/// member when it disconnects.
#[tokio::test]
async fn shared_subscription_redelivers_a_gone_members_unacked_messages() {
    let broker = TestBroker::start().await;
    let (mut a, _) = Raw::connect4(broker.mqtt(), "sh-a", true, 10).await;
    raw_subscribe4(&mut a, 1, "$share/r/shr/t", QoS::AtLeastOnce).await;
    let (mut b, _) = Raw::connect4(broker.mqtt(), "sh-b", true, 10).await;
    raw_subscribe4(&mut b, 1, "$share/r/shr/t", QoS::AtLeastOnce).await;
    for i in 0..6u8 {
        publish_once4(&broker, "shr/t", QoS::AtLeastOnce, false, &[i]).await;
    }
    // Whatever each got; A acknowledges nothing and goes away.
    let mut got_a = Vec::new();
    while let Some(p4::Packet::Publish(p)) = a.recv4_opt(QUIET).await {
        got_a.push(p.payload[0]);
    }
    let mut got_b = Vec::new();
    while let Some(p4::Packet::Publish(p)) = b.recv4_opt(QUIET).await {
        b.send4(p4::Packet::PubAck(p4::PubAck::new(p.pkid))).await;
        got_b.push(p.payload[0]);
    }
    assert!(
        !got_a.is_empty(),
        "load split: a got {got_a:?}, b got {got_b:?}"
    );
    drop(a);
    let mut again = Vec::new();
    while again.len() < got_a.len() {
        let p = b.recv4_publish().await;
        b.send4(p4::Packet::PubAck(p4::PubAck::new(p.pkid))).await;
        again.push(p.payload[0]);
    }
    again.sort_unstable();
    got_a.sort_unstable();
    assert_eq!(again, got_a);
    b.quiet4().await;
    broker.stop().await;
}
