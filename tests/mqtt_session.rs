//! MQTT CONNECT/CONNACK and sessions over real sockets: authentication,
//! client ids, keep-alive, take-over, clean and persistent sessions (also
//! across a broker restart), v5 session expiry, QoS 2 across a restart.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mqtt::*;
use common::TestBroker;
use rumqttc::v5::mqttbytes::v5 as p5;
use rumqttc::QoS;

// ---- CONNECT: authentication ---------------------------------------------

#[tokio::test]
async fn v311_connect_checks_the_users_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let access = users_access(dir.path(), false);
    let broker = TestBroker::start_with(|_| {}, access).await;

    let refused = |login: Option<(&str, &str)>| {
        let mut opts = opts4(&broker, &format!("c{}", rand_suffix()));
        if let Some((u, p)) = login {
            opts.set_credentials(u, p);
        }
        async move {
            let (_c, mut ev) = rumqttc::AsyncClient::new(opts, 8);
            next4(&mut ev).await
        }
    };
    match refused(Some(("alice", "wrong"))).await {
        Err(rumqttc::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, rumqttc::ConnectReturnCode::BadUserNamePassword)
        }
        other => panic!("bad password must be refused with 4, got {other:?}"),
    }
    match refused(Some(("mallory", "secret"))).await {
        Err(rumqttc::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, rumqttc::ConnectReturnCode::BadUserNamePassword)
        }
        other => panic!("unknown user must be refused with 4, got {other:?}"),
    }
    match refused(None).await {
        Err(rumqttc::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, rumqttc::ConnectReturnCode::NotAuthorized)
        }
        other => panic!("anonymous (disabled) must be refused with 5, got {other:?}"),
    }
    match refused(Some(("alice", "secret"))).await {
        Ok(rumqttc::Packet::ConnAck(ack)) => {
            assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success)
        }
        other => panic!("good credentials must connect, got {other:?}"),
    }
    broker.stop().await;
}

#[tokio::test]
async fn v5_connect_checks_the_users_file_and_permissions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let access = users_access(dir.path(), false);
    let broker = TestBroker::start_with(|_| {}, access).await;

    let mut opts = opts5(&broker, "v5-bad");
    opts.set_credentials("alice", "nope");
    let (_c, mut ev) = client5_with(opts);
    match next5(&mut ev).await {
        Err(v5::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, v5::ConnectReturnCode::BadUserNamePassword)
        }
        other => panic!("expected 0x86, got {other:?}"),
    }
    let (_c, mut ev) = client5_with(opts5(&broker, "v5-anon"));
    match next5(&mut ev).await {
        Err(v5::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, v5::ConnectReturnCode::NotAuthorized)
        }
        other => panic!("expected 0x87, got {other:?}"),
    }

    // bob may only use bob/#: SUBACK and PUBACK say "not authorized".
    let mut opts = opts5(&broker, "v5-bob");
    opts.set_credentials("bob", "pw");
    let (c, mut ev, ack) = connected5(opts).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    c.subscribe_many([
        v5::Filter::new("bob/in", v5::QoS::AtLeastOnce),
        v5::Filter::new("alice/in", v5::QoS::AtLeastOnce),
    ])
    .await
    .expect("subscribe");
    let sub = suback5(&mut ev).await;
    assert_eq!(
        sub.return_codes,
        vec![
            v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce),
            v5::SubscribeReasonCode::NotAuthorized
        ]
    );
    c.publish("alice/in", v5::QoS::AtLeastOnce, false, "x")
        .await
        .expect("publish");
    let ack = wait5(&mut ev, |p| match p {
        v5::Packet::PubAck(a) => Some(a.clone()),
        _ => None,
    })
    .await;
    assert_eq!(ack.reason, p5::PubAckReason::NotAuthorized);

    // A will bob may not publish is refused at CONNECT (0x87), so it can
    // never be published for him; one under bob/# is accepted.
    let mut opts = opts5(&broker, "v5-bob-will");
    opts.set_credentials("bob", "pw");
    opts.set_last_will(p5::LastWill::new(
        "alice/will",
        "gone",
        v5::QoS::AtLeastOnce,
        false,
        None,
    ));
    let (_c, mut ev) = client5_with(opts);
    match next5(&mut ev).await {
        Err(v5::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, v5::ConnectReturnCode::NotAuthorized)
        }
        other => panic!("expected 0x87 for a forbidden will, got {other:?}"),
    }
    let mut opts = opts5(&broker, "v5-bob-will-ok");
    opts.set_credentials("bob", "pw");
    opts.set_last_will(p5::LastWill::new(
        "bob/will",
        "gone",
        v5::QoS::AtLeastOnce,
        false,
        None,
    ));
    let (_c, _ev, ack) = connected5(opts).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    broker.stop().await;
}

#[tokio::test]
async fn v311_unauthorised_subscribe_gets_failure_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let access = users_access(dir.path(), false);
    let broker = TestBroker::start_with(|_| {}, access).await;
    let mut connect = p4::Connect::new("bob4");
    connect.set_login("bob", "pw");
    let (mut raw, ack) = Raw::connect4_with(broker.mqtt(), connect).await;
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
    let code = raw_subscribe4(&mut raw, 1, "alice/#", QoS::AtLeastOnce).await;
    assert_eq!(code, rumqttc::SubscribeReasonCode::Failure);
    let code = raw_subscribe4(&mut raw, 2, "bob/#", QoS::AtLeastOnce).await;
    assert_eq!(
        code,
        rumqttc::SubscribeReasonCode::Success(QoS::AtLeastOnce)
    );
    broker.stop().await;
}

// ---- CONNECT: client ids ---------------------------------------------------

#[tokio::test]
async fn client_id_rules() {
    let broker = TestBroker::start().await;
    let addr = broker.mqtt();

    // 3.1.1: an empty id is fine with a clean session...
    let (_raw, ack) = Raw::connect4(addr, "", true, 10).await;
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
    assert!(!ack.session_present);
    // ...and refused (identifier rejected) with a persistent one.
    let (_raw, ack) = Raw::connect4(addr, "", false, 10).await;
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::BadClientId);

    // 5.0: an empty id gets an assigned one, distinct per connection.
    let (_r1, a1) = Raw::connect5_clean(addr, "", None).await;
    let (_r2, a2) = Raw::connect5_clean(addr, "", None).await;
    assert_eq!(a1.code, p5::ConnectReturnCode::Success);
    let id1 = a1
        .properties
        .and_then(|p| p.assigned_client_identifier)
        .expect("assigned client id");
    let id2 = a2
        .properties
        .and_then(|p| p.assigned_client_identifier)
        .expect("assigned client id");
    assert!(!id1.is_empty());
    assert_ne!(id1, id2);

    // An over-long id is refused: 0x85 (v5), 2 (3.1.1).
    let long = "x".repeat(300);
    let (_r, ack) = Raw::connect5_clean(addr, &long, None).await;
    assert_eq!(ack.code, p5::ConnectReturnCode::ClientIdentifierNotValid);
    let (_r, ack) = Raw::connect4(addr, &long, true, 10).await;
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::BadClientId);
    broker.stop().await;
}

// ---- keep-alive ------------------------------------------------------------

#[tokio::test]
async fn silent_client_is_dropped_after_one_and_a_half_keep_alives() {
    let broker = TestBroker::start().await;
    // 3.1.1: closed without a word after 1.5 x 1 s.
    let (mut raw, _) = Raw::connect4(broker.mqtt(), "silent4", true, 1).await;
    let start = Instant::now();
    raw.expect_silent_close().await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_millis(3000),
        "closed after {took:?}"
    );

    // 5.0: DISCONNECT 0x8D, then the close.
    let mut connect = connect5_packet("silent5", true, None);
    connect.keep_alive = 1;
    let (mut raw, _) = Raw::connect5(broker.mqtt(), connect, None).await;
    let start = Instant::now();
    raw.expect_disconnect5(p5::DisconnectReasonCode::KeepAliveTimeout)
        .await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_millis(3000),
        "closed after {took:?}"
    );

    // A client that pings in time stays.
    let (mut raw, _) = Raw::connect4(broker.mqtt(), "pinger", true, 1).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        raw.send4(p4::Packet::PingReq).await;
        assert_eq!(raw.recv4().await, p4::Packet::PingResp);
    }
    broker.stop().await;
}

/// The bytes of a QoS 0 PUBLISH whose payload is long enough that dribbling
/// it one byte a second takes far longer than the tests wait.
fn long_publish4() -> Vec<u8> {
    let publish = p4::Publish::new("dribble/topic", QoS::AtMostOnce, vec![b'x'; 64]);
    let mut b = bytes::BytesMut::new();
    p4::Packet::Publish(publish)
        .write(&mut b, 1 << 28)
        .expect("encode");
    b.to_vec()
}

/// MQTT-3.1.2-24: only a complete control packet resets the keep-alive. A
/// PUBLISH dribbled one byte a second on a 2 s keep-alive is closed after
/// 1.5 × 2 s (3.1.1: silently; 5.0: DISCONNECT 0x8D first), not kept open
/// by its bytes.
#[tokio::test]
async fn publish_dribbled_a_byte_a_second_does_not_keep_the_connection_alive() {
    let broker = TestBroker::start().await;
    // At most 8 bytes (8 s) of a packet of about 80: a broker that counts
    // bytes keeps the connection throughout, and the test fails fast.
    let prefix = &long_publish4()[..8];
    let within = |d: Dribbled| {
        let took = d.closed_after.expect("closed while the PUBLISH dribbled");
        assert!(
            took >= Duration::from_millis(2500) && took < Duration::from_millis(4500),
            "closed after {took:?}, not about 3 s"
        );
        assert!(d.written < prefix.len(), "{d:?}");
    };

    let (mut raw, _) = Raw::connect4(broker.mqtt(), "dribble4", true, 2).await;
    within(raw.dribble(prefix, Duration::from_secs(1)).await);
    assert!(raw.recv4_opt(QUIET).await.is_none(), "3.1.1 just closes");

    let mut connect = connect5_packet("dribble5", true, None);
    connect.keep_alive = 2;
    let (mut raw, _) = Raw::connect5(broker.mqtt(), connect, None).await;
    within(raw.dribble(prefix, Duration::from_secs(1)).await);
    match raw.recv5_opt(QUIET).await {
        Some(p5::Packet::Disconnect(d)) => {
            assert_eq!(d.reason_code, p5::DisconnectReasonCode::KeepAliveTimeout)
        }
        other => panic!("expected DISCONNECT 0x8D, got {other:?}"),
    }
    broker.stop().await;
}

// ---- take-over -------------------------------------------------------------

#[tokio::test]
async fn second_connection_with_same_id_takes_over() {
    let broker = TestBroker::start().await;
    let addr = broker.mqtt();
    // v5: the old connection gets DISCONNECT 0x8E.
    let (mut old, _) = Raw::connect5_clean(addr, "dup5", None).await;
    let (mut new, ack) = Raw::connect5_clean(addr, "dup5", None).await;
    assert_eq!(ack.code, p5::ConnectReturnCode::Success);
    old.expect_disconnect5(p5::DisconnectReasonCode::SessionTakenOver)
        .await;
    new.send5(p5::Packet::PingReq(p5::PingReq)).await;
    assert!(matches!(new.recv5().await, p5::Packet::PingResp(_)));

    // 3.1.1: the old one is closed; the persistent session moves over,
    // with the old connection's unacknowledged delivery (DUP).
    let (mut old, _) = Raw::connect4(addr, "dup4", false, 10).await;
    raw_subscribe4(&mut old, 1, "dup4/t", QoS::AtLeastOnce).await;
    publish_once4(&broker, "dup4/t", QoS::AtLeastOnce, false, b"unacked").await;
    let first = old.recv4_publish().await;
    let (mut new, ack) = Raw::connect4(addr, "dup4", false, 10).await;
    assert!(ack.session_present);
    old.expect_silent_close().await;
    let again = new.recv4_publish().await;
    assert_eq!(
        (&again.payload[..], again.pkid, again.dup),
        (&b"unacked"[..], first.pkid, true)
    );
    new.send4(p4::Packet::PubAck(p4::PubAck::new(again.pkid)))
        .await;
    publish_once4(&broker, "dup4/t", QoS::AtLeastOnce, false, b"moved").await;
    let p = new.recv4_publish().await;
    assert_eq!(&p.payload[..], b"moved");
    broker.stop().await;
}

// ---- clean vs persistent sessions -----------------------------------------

#[tokio::test]
async fn clean_session_discards_and_persistent_session_keeps_state() {
    let broker = TestBroker::start().await;
    let (c, mut ev, ack) = connected4(&broker, "keeper", false).await;
    assert!(!ack.session_present);
    subscribe4(&c, &mut ev, "keep/t", QoS::ExactlyOnce).await;
    disconnect4(&c, &mut ev).await;
    drop(ev);

    // Offline: QoS 1 and 2 messages are queued for the session.
    publish_once4(&broker, "keep/t", QoS::AtLeastOnce, false, b"one").await;
    publish_once4(&broker, "keep/t", QoS::ExactlyOnce, false, b"two").await;

    let (c, mut ev, ack) = connected4(&broker, "keeper", false).await;
    assert!(ack.session_present, "persistent session resumed");
    let p1 = publish4(&mut ev).await;
    let p2 = publish4(&mut ev).await;
    assert_eq!((&p1.payload[..], p1.qos), (&b"one"[..], QoS::AtLeastOnce));
    assert_eq!((&p2.payload[..], p2.qos), (&b"two"[..], QoS::ExactlyOnce));
    quiet4(&mut ev).await;
    disconnect4(&c, &mut ev).await;
    drop(ev);

    // A clean session throws the old one away: no session, no subscription.
    let (c, mut ev, ack) = connected4(&broker, "keeper", true).await;
    assert!(!ack.session_present);
    publish_once4(&broker, "keep/t", QoS::AtLeastOnce, false, b"lost").await;
    quiet4(&mut ev).await;
    disconnect4(&c, &mut ev).await;
    drop(ev);
    let (_c, mut ev, ack) = connected4(&broker, "keeper", false).await;
    assert!(!ack.session_present, "clean session ended the old session");
    quiet4(&mut ev).await;
    broker.stop().await;
}

#[tokio::test]
async fn persistent_session_survives_a_broker_restart() {
    let mut broker = TestBroker::start().await;
    let (c, mut ev) = subscriber4(&broker, "durable", false, "dur/+", QoS::ExactlyOnce).await;
    disconnect4(&c, &mut ev).await;
    drop(ev);
    for (i, qos) in [QoS::AtLeastOnce, QoS::ExactlyOnce, QoS::AtLeastOnce]
        .into_iter()
        .enumerate()
    {
        publish_once4(
            &broker,
            &format!("dur/{i}"),
            qos,
            false,
            format!("m{i}").as_bytes(),
        )
        .await;
    }
    broker.restart().await;

    let (c, mut ev, ack) = connected4(&broker, "durable", false).await;
    assert!(ack.session_present, "session recovered from the journal");
    for i in 0..3 {
        let p = publish4(&mut ev).await;
        assert_eq!(p.topic, format!("dur/{i}"));
        assert_eq!(p.payload, format!("m{i}").as_bytes());
    }
    quiet4(&mut ev).await;
    // The subscription itself survived too.
    publish_once4(&broker, "dur/new", QoS::AtLeastOnce, false, b"after").await;
    let p = publish4(&mut ev).await;
    assert_eq!(&p.payload[..], b"after");
    disconnect4(&c, &mut ev).await;
    broker.stop().await;
}

/// Reconnects `dupsub` to its session and checks that the two unacknowledged
/// deliveries `first` (`q1`) and `second` (`q2`) come again, in order, with
/// DUP set and their packet ids kept; returns the client and the re-sends.
async fn resent_with_dup(
    broker: &TestBroker,
    first: &p4::Publish,
    second: &p4::Publish,
) -> (Raw, p4::Publish, p4::Publish) {
    let (mut raw, ack) = Raw::connect4(broker.mqtt(), "dupsub", false, 10).await;
    assert!(ack.session_present);
    let again1 = raw.recv4_publish().await;
    let again2 = raw.recv4_publish().await;
    assert!(again1.dup && again2.dup, "{again1:?} {again2:?}");
    assert_eq!((again1.pkid, &again1.payload[..]), (first.pkid, &b"q1"[..]));
    assert_eq!(
        (again2.pkid, &again2.payload[..]),
        (second.pkid, &b"q2"[..])
    );
    (raw, again1, again2)
}

/// Delivered but unacknowledged QoS 1/2 messages are re-sent with DUP on
/// reconnect, after a plain disconnect and after a broker restart.
#[tokio::test]
async fn in_flight_messages_are_resent_with_dup() {
    let mut broker = TestBroker::start().await;
    let (mut raw, _) = Raw::connect4(broker.mqtt(), "dupsub", false, 10).await;
    raw_subscribe4(&mut raw, 1, "inflight/#", QoS::ExactlyOnce).await;
    publish_once4(&broker, "inflight/1", QoS::AtLeastOnce, false, b"q1").await;
    publish_once4(&broker, "inflight/2", QoS::ExactlyOnce, false, b"q2").await;
    let first = raw.recv4_publish().await;
    let second = raw.recv4_publish().await;
    assert!(!first.dup && !second.dup);
    assert_ne!(first.pkid, second.pkid);
    assert!(first.pkid != 0 && second.pkid != 0);
    drop(raw); // no acks

    drop(resent_with_dup(&broker, &first, &second).await);

    broker.restart().await;
    let (mut raw, again1, again2) = resent_with_dup(&broker, &first, &second).await;
    // Finish both flows; nothing comes back afterwards.
    raw.send4(p4::Packet::PubAck(p4::PubAck::new(again1.pkid)))
        .await;
    raw.send4(p4::Packet::PubRec(p4::PubRec::new(again2.pkid)))
        .await;
    assert_eq!(raw.recv4_pubrel().await, again2.pkid);
    raw.send4(p4::Packet::PubComp(p4::PubComp::new(again2.pkid)))
        .await;
    raw.quiet4().await;
    drop(raw);
    let (mut raw, _) = Raw::connect4(broker.mqtt(), "dupsub", false, 10).await;
    raw.quiet4().await;
    broker.stop().await;
}

// ---- v5 session expiry -----------------------------------------------------

fn expiring(broker: &TestBroker, id: &str, clean: bool, expiry: Option<u32>) -> v5::MqttOptions {
    let mut opts = opts5(broker, id);
    opts.set_clean_start(clean);
    opts.set_session_expiry_interval(expiry);
    opts
}

#[tokio::test]
async fn v5_session_expiry() {
    let broker = TestBroker::start().await;
    let f = || v5::Filter::new("exp/t", v5::QoS::AtLeastOnce);

    // Expiry 0 (the default): the session ends with the connection.
    let (c, mut ev, _) = connected5(expiring(&broker, "e0", true, None)).await;
    subscribe5(&c, &mut ev, f(), None).await;
    disconnect5(&c, &mut ev).await;
    let (_c, _ev, ack) = connected5(expiring(&broker, "e0", false, None)).await;
    assert!(!ack.session_present);

    // Expiry 1 s: gone after it elapsed.
    let (c, mut ev, _) = connected5(expiring(&broker, "e1", true, Some(1))).await;
    subscribe5(&c, &mut ev, f(), None).await;
    disconnect5(&c, &mut ev).await;
    // Expiry 60 s: still there, with its queued message.
    let (c, mut ev, _) = connected5(expiring(&broker, "e60", true, Some(60))).await;
    subscribe5(&c, &mut ev, f(), None).await;
    disconnect5(&c, &mut ev).await;
    publish_once4(&broker, "exp/t", QoS::AtLeastOnce, false, b"kept").await;
    tokio::time::sleep(Duration::from_millis(1600)).await;

    let (_c, mut ev, ack) = connected5(expiring(&broker, "e1", false, Some(1))).await;
    assert!(!ack.session_present, "expired session must be gone");
    quiet5(&mut ev).await;
    let (_c, mut ev, ack) = connected5(expiring(&broker, "e60", false, Some(60))).await;
    assert!(ack.session_present);
    let p = publish5(&mut ev).await;
    assert_eq!(&p.payload[..], b"kept");
    broker.stop().await;
}

#[tokio::test]
async fn v5_session_expiry_is_capped_and_returned() {
    let broker = TestBroker::start_with(
        |c| c.mqtt.session_expiry_max_s = 100,
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let (_c, _ev, ack) = connected5(expiring(&broker, "cap", true, Some(100_000))).await;
    let props = ack.properties.expect("CONNACK properties");
    assert_eq!(props.session_expiry_interval, Some(100));
    broker.stop().await;
}

// ---- QoS 2 across a restart --------------------------------------------------

/// Inbound QoS 2: PUBLISH, PUBREC, broker restart, the client re-sends the
/// PUBLISH (DUP) and then PUBREL: the subscriber gets exactly one copy.
#[tokio::test]
async fn inbound_qos2_is_exactly_once_across_a_restart() {
    let mut broker = TestBroker::start().await;
    let (mut sub, _) = Raw::connect4(broker.mqtt(), "q2in-sub", false, 10).await;
    raw_subscribe4(&mut sub, 1, "q2in", QoS::ExactlyOnce).await;

    let (mut publ, _) = Raw::connect4(broker.mqtt(), "q2in-pub", false, 10).await;
    let mut p = p4::Publish::new("q2in", QoS::ExactlyOnce, b"once".to_vec());
    p.pkid = 7;
    publ.send4(p4::Packet::Publish(p.clone())).await;
    assert_eq!(publ.recv4_pubrec().await, 7);
    drop(publ);
    drop(sub);
    broker.restart().await;

    let (mut publ, ack) = Raw::connect4(broker.mqtt(), "q2in-pub", false, 10).await;
    assert!(ack.session_present);
    p.dup = true;
    publ.send4(p4::Packet::Publish(p)).await;
    assert_eq!(publ.recv4_pubrec().await, 7);
    publ.send4(p4::Packet::PubRel(p4::PubRel::new(7))).await;
    assert_eq!(publ.recv4_pubcomp().await, 7);

    let (mut sub, ack) = Raw::connect4(broker.mqtt(), "q2in-sub", false, 10).await;
    assert!(ack.session_present);
    let got = sub.recv4_publish().await;
    assert_eq!(&got.payload[..], b"once");
    assert_eq!(got.qos, QoS::ExactlyOnce);
    sub.send4(p4::Packet::PubRec(p4::PubRec::new(got.pkid)))
        .await;
    assert_eq!(sub.recv4_pubrel().await, got.pkid);
    sub.send4(p4::Packet::PubComp(p4::PubComp::new(got.pkid)))
        .await;
    sub.quiet4().await;
    broker.stop().await;
}

/// Outbound QoS 2: the subscriber sent PUBREC, the broker restarts; on
/// reconnect the broker re-sends PUBREL (not the PUBLISH), and after PUBCOMP
/// nothing is delivered again.
#[tokio::test]
async fn outbound_qos2_resumes_at_pubrel_after_a_restart() {
    let mut broker = TestBroker::start().await;
    let (mut sub, _) = Raw::connect4(broker.mqtt(), "q2out", false, 10).await;
    raw_subscribe4(&mut sub, 1, "q2out", QoS::ExactlyOnce).await;
    publish_once4(&broker, "q2out", QoS::ExactlyOnce, false, b"x").await;
    let got = sub.recv4_publish().await;
    sub.send4(p4::Packet::PubRec(p4::PubRec::new(got.pkid)))
        .await;
    assert_eq!(sub.recv4_pubrel().await, got.pkid);
    drop(sub);
    broker.restart().await;

    let (mut sub, ack) = Raw::connect4(broker.mqtt(), "q2out", false, 10).await;
    assert!(ack.session_present);
    assert_eq!(sub.recv4_pubrel().await, got.pkid);
    sub.send4(p4::Packet::PubComp(p4::PubComp::new(got.pkid)))
        .await;
    sub.quiet4().await;
    drop(sub);
    let (mut sub, _) = Raw::connect4(broker.mqtt(), "q2out", false, 10).await;
    sub.quiet4().await;
    broker.stop().await;
}

/// MQTT 5 persistent session across a restart: subscription identifier,
/// queued QoS 1/2 messages with their properties, DUP on the re-sent
/// in-flight ones; a DISCONNECT that sets the session expiry to 0 ends it.
#[tokio::test]
async fn v5_persistent_session_across_a_restart() {
    let mut broker = TestBroker::start().await;
    let expiry = || {
        Some(p5::ConnectProperties {
            session_expiry_interval: Some(300),
            ..p5::ConnectProperties::new()
        })
    };
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "v5p", expiry()).await;
    let mut sub = p5::Subscribe::new(
        p5::Filter::new("v5p/#", rumqttc::v5::mqttbytes::QoS::ExactlyOnce),
        Some(p5::SubscribeProperties {
            id: Some(5),
            user_properties: vec![],
        }),
    );
    sub.pkid = 1;
    raw.send5(p5::Packet::Subscribe(sub)).await;
    assert!(matches!(raw.recv5().await, p5::Packet::SubAck(_)));
    drop(raw);

    let (p, mut pev, _) = connected5(opts5(&broker, "v5p-pub")).await;
    let user = vec![
        ("a".to_owned(), "1".to_owned()),
        ("a".to_owned(), "2".to_owned()),
    ];
    for (topic, qos) in [
        ("v5p/1", rumqttc::v5::mqttbytes::QoS::AtLeastOnce),
        ("v5p/2", rumqttc::v5::mqttbytes::QoS::ExactlyOnce),
    ] {
        let props = v5::PublishProperties {
            content_type: Some("text/plain".into()),
            user_properties: user.clone(),
            ..Default::default()
        };
        publish_and_ack5(
            &p,
            &mut pev,
            topic,
            qos,
            false,
            topic.as_bytes(),
            Some(props),
        )
        .await;
    }
    disconnect5(&p, &mut pev).await;
    broker.restart().await;

    let check = |p: &p5::Publish, topic: &str, dup: bool| {
        assert_eq!(p.topic, bytes::Bytes::copy_from_slice(topic.as_bytes()));
        assert_eq!(p.dup, dup, "{p:?}");
        let props = p.properties.as_ref().expect("properties");
        assert_eq!(props.subscription_identifiers, [5]);
        assert_eq!(props.user_properties, user);
        assert_eq!(props.content_type.as_deref(), Some("text/plain"));
    };
    let (mut raw, ack) =
        Raw::connect5(broker.mqtt(), connect5_packet("v5p", false, expiry()), None).await;
    assert!(ack.session_present);
    let first = raw.recv5_publish().await;
    let second = raw.recv5_publish().await;
    check(&first, "v5p/1", false);
    check(&second, "v5p/2", false);
    drop(raw); // unacknowledged

    let (mut raw, ack) =
        Raw::connect5(broker.mqtt(), connect5_packet("v5p", false, expiry()), None).await;
    assert!(ack.session_present);
    let again1 = raw.recv5_publish().await;
    let again2 = raw.recv5_publish().await;
    check(&again1, "v5p/1", true);
    check(&again2, "v5p/2", true);
    assert_eq!((again1.pkid, again2.pkid), (first.pkid, second.pkid));
    raw.send5(p5::Packet::PubAck(p5::PubAck::new(again1.pkid, None)))
        .await;
    raw.send5(p5::Packet::PubRec(p5::PubRec::new(again2.pkid, None)))
        .await;
    assert!(matches!(raw.recv5().await, p5::Packet::PubRel(r) if r.pkid == again2.pkid));
    raw.send5(p5::Packet::PubComp(p5::PubComp::new(again2.pkid, None)))
        .await;
    raw.quiet5().await;

    // DISCONNECT with Session Expiry 0: the session ends now.
    raw.send5(p5::Packet::Disconnect(p5::Disconnect {
        reason_code: p5::DisconnectReasonCode::NormalDisconnection,
        properties: Some(p5::DisconnectProperties {
            session_expiry_interval: Some(0),
            reason_string: None,
            user_properties: vec![],
            server_reference: None,
        }),
    }))
    .await;
    raw.expect_silent_close().await;
    let (_raw, ack) =
        Raw::connect5(broker.mqtt(), connect5_packet("v5p", false, expiry()), None).await;
    assert!(!ack.session_present);
    broker.stop().await;
}

/// A session's expiry keeps running across a restart: a 1 s session is gone
/// after the broker restarted and the time passed.
#[tokio::test]
async fn v5_session_expiry_runs_across_a_restart() {
    let mut broker = TestBroker::start().await;
    for (id, expiry) in [("short", 1), ("long", 120)] {
        let (c, mut ev, _) = connected5(expiring(&broker, id, true, Some(expiry))).await;
        subscribe5(
            &c,
            &mut ev,
            v5::Filter::new("xr/t", v5::QoS::AtLeastOnce),
            None,
        )
        .await;
        disconnect5(&c, &mut ev).await;
    }
    broker.restart().await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let (_c, _ev, ack) = connected5(expiring(&broker, "short", false, Some(1))).await;
    assert!(!ack.session_present, "1 s session must have expired");
    let (_c, _ev, ack) = connected5(expiring(&broker, "long", false, Some(120))).await;
    assert!(ack.session_present);
    broker.stop().await;
}

/// What a persistent session changed before the restart is what comes
/// back: an UNSUBSCRIBE stays done, a re-SUBSCRIBE keeps its new QoS.
#[tokio::test]
async fn subscription_changes_survive_a_restart() {
    let mut broker = TestBroker::start().await;
    let (c, mut ev) = subscriber4(&broker, "changer", false, "chg/gone", QoS::AtLeastOnce).await;
    subscribe4(&c, &mut ev, "chg/up", QoS::AtMostOnce).await;
    subscribe4(&c, &mut ev, "chg/up", QoS::AtLeastOnce).await;
    unsubscribe4(&c, &mut ev, "chg/gone").await;
    disconnect4(&c, &mut ev).await;
    drop(ev);
    broker.restart().await;

    let (_c, mut ev, ack) = connected4(&broker, "changer", false).await;
    assert!(ack.session_present);
    publish_once4(&broker, "chg/gone", QoS::AtLeastOnce, false, b"x").await;
    publish_once4(&broker, "chg/up", QoS::AtLeastOnce, false, b"y").await;
    let p = publish4(&mut ev).await;
    assert_eq!((p.topic.as_str(), p.qos), ("chg/up", QoS::AtLeastOnce));
    quiet4(&mut ev).await;
    broker.stop().await;
}

/// A broker shutting down tells MQTT 5 clients (DISCONNECT 0x8B) and
/// closes 3.1.1 connections; both reconnect to the restarted broker.
#[tokio::test]
async fn shutdown_disconnects_clients_with_0x8b() {
    let mut broker = TestBroker::start().await;
    let (mut r5, _) = Raw::connect5_clean(broker.mqtt(), "sd5", None).await;
    let (mut r4, _) = Raw::connect4(broker.mqtt(), "sd4", true, 10).await;
    let watch5 = tokio::spawn(async move {
        r5.expect_disconnect5(p5::DisconnectReasonCode::ServerShuttingDown)
            .await;
    });
    let watch4 = tokio::spawn(async move { r4.expect_silent_close().await });
    broker.restart().await;
    watch5.await.expect("v5 client told");
    watch4.await.expect("3.1.1 client closed");
    let (_r, ack) = Raw::connect4(broker.mqtt(), "sd4", true, 10).await;
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
    broker.stop().await;
}

/// rumqttc 5 sees the take-over as a server DISCONNECT with 0x8E.
#[tokio::test]
async fn rumqttc_v5_sees_session_taken_over() {
    let broker = TestBroker::start().await;
    let (_old, mut old_ev, _) = connected5(opts5(&broker, "taken")).await;
    let (_new, _new_ev, ack) = connected5(opts5(&broker, "taken")).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    let err = loop {
        match next5(&mut old_ev).await {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    match err {
        v5::ConnectionError::MqttState(v5::StateError::ServerDisconnect {
            reason_code, ..
        }) => {
            assert_eq!(reason_code, v5::DisconnectReasonCode::SessionTakenOver)
        }
        other => panic!("expected DISCONNECT 0x8E, got {other:?}"),
    }
    broker.stop().await;
}
