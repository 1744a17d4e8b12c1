//! Deny rules in the users file, proved with real clients over real
//! sockets: a deny wins over an allow of everything, refuses a
//! subscription to what it denies, and grants a wildcard subscription that
//! reaches a denied topic without ever delivering that topic
//! (docs/admin.md, "Deny rules"). MQTT 5 and 3.1.1 (rumqttc), STOMP (raw frames over TCP),
//! AMQP 1.0 (fe2o3-amqp).

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::sync::Arc;

use common::mqtt::*;
use common::stomp::StompClient;
use common::{amqp, TestBroker};
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use rosetta::users::{PermissionSpec, Users};
use rumqttc::v5::mqttbytes::v5 as p5;

/// `dora` / `pw` may do everything except subscribe to
/// `test/nosubscribe`, publish to `test/nopublish`, and use the queue
/// `secret` at all; `alice` / `secret` may do everything.
async fn broker() -> (TestBroker, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.toml");
    let owned = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let dora = PermissionSpec {
        publish: None,
        subscribe: None,
        deny_publish: owned(&["/topic/test/nopublish", "/queue/secret"]),
        deny_subscribe: owned(&["/topic/test/nosubscribe", "/queue/secret"]),
    };
    rosetta::users::save_user_with(&path, "dora", b"pw", &dora, None).expect("save dora");
    rosetta::users::add_user(&path, "alice", b"secret", None, None).expect("add alice");
    let users = Users::load(&path).expect("load users");
    let access = Arc::new(rosetta::access::UsersAccess::new(users, false).expect("access"));
    (TestBroker::start_with(|_| {}, access).await, dir)
}

#[tokio::test]
async fn mqtt5_denied_filter_gets_0x87_and_wildcards_over_it_never_deliver_it() {
    let (broker, _dir) = broker().await;
    let (dora, mut dora_ev) = connected5_as(&broker, "dora", "dora", "pw").await;
    let refused = v5::SubscribeReasonCode::NotAuthorized;
    let granted = v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce);
    // One SUBSCRIBE, one reason code per filter: the denied topic is
    // refused; the wildcards over it are granted (without it), as
    // mosquitto grants them and the Paho suite expects.
    let codes = subscribe_many5(
        &dora,
        &mut dora_ev,
        &[
            "test/nosubscribe",
            "test/#",
            "test/+",
            "#",
            "test/other",
            "other/#",
        ],
    )
    .await;
    assert_eq!(
        codes,
        [refused, granted, granted, granted, granted, granted]
    );

    // alice publishes to both topics under test/: dora gets test/other
    // only (once: the session's filters share its queue), never
    // test/nosubscribe, which test/#, test/+ and # all match.
    let (alice, mut alice_ev) = connected5_as(&broker, "alice", "alice", "secret").await;
    for topic in ["test/nosubscribe", "test/other"] {
        alice
            .publish(topic, v5::QoS::AtLeastOnce, false, topic)
            .await
            .expect("publish");
        wait5(&mut alice_ev, |p| {
            matches!(p, v5::Packet::PubAck(_)).then_some(())
        })
        .await;
    }
    let got = publish5(&mut dora_ev).await;
    assert_eq!(&got.topic[..], b"test/other");
    alice
        .publish("other/x", v5::QoS::AtLeastOnce, false, "marker")
        .await
        .expect("publish");
    // rumqttc sends only while its event loop is polled.
    let drive = tokio::spawn(async move { while alice_ev.poll().await.is_ok() {} });
    let got = publish5(&mut dora_ev).await;
    assert_eq!(
        &got.topic[..],
        b"other/x",
        "nothing from test/nosubscribe in between"
    );
    drive.abort();
}

#[tokio::test]
async fn mqtt5_publish_to_a_denied_topic_gets_puback_0x87() {
    let (broker, _dir) = broker().await;
    let (alice, mut alice_ev) = connected5_as(&broker, "alice", "alice", "secret").await;
    let codes = subscribe_many5(&alice, &mut alice_ev, &["test/#"]).await;
    assert_eq!(
        codes,
        [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
    );
    let (dora, mut dora_ev) = connected5_as(&broker, "dora", "dora", "pw").await;
    let mut reasons = Vec::new();
    for topic in ["test/nopublish", "test/ok"] {
        dora.publish(topic, v5::QoS::AtLeastOnce, false, topic)
            .await
            .expect("publish");
        reasons.push(
            wait5(&mut dora_ev, |p| match p {
                v5::Packet::PubAck(a) => Some(a.reason),
                _ => None,
            })
            .await,
        );
    }
    assert_eq!(
        reasons,
        [p5::PubAckReason::NotAuthorized, p5::PubAckReason::Success]
    );
    let got = publish5(&mut alice_ev).await;
    assert_eq!(
        &got.topic[..],
        b"test/ok",
        "the denied publish went nowhere"
    );
}

#[tokio::test]
async fn mqtt311_denied_publish_is_dropped_and_denied_subscribe_gets_0x80() {
    let (broker, _dir) = broker().await;
    let connect = |id: &str, user: &str, pw: &str| {
        let mut opts = opts4(&broker, id);
        opts.set_credentials(user, pw);
        rumqttc::AsyncClient::new(opts, 64)
    };
    let (alice, mut alice_ev) = connect("alice4", "alice", "secret");
    connack4(&mut alice_ev).await;
    let ack = subscribe4(&alice, &mut alice_ev, "test/#", rumqttc::QoS::AtLeastOnce).await;
    assert_eq!(
        ack.return_codes,
        [rumqttc::SubscribeReasonCode::Success(
            rumqttc::QoS::AtLeastOnce
        )]
    );
    let (dora, mut dora_ev) = connect("dora4", "dora", "pw");
    connack4(&mut dora_ev).await;
    let ack = subscribe4(
        &dora,
        &mut dora_ev,
        "test/nosubscribe",
        rumqttc::QoS::AtLeastOnce,
    )
    .await;
    assert_eq!(ack.return_codes, [rumqttc::SubscribeReasonCode::Failure]);
    for topic in ["test/nopublish", "test/ok"] {
        dora.publish(topic, rumqttc::QoS::AtMostOnce, false, topic)
            .await
            .expect("publish");
    }
    // rumqttc sends only while its event loop is polled.
    let drive = tokio::spawn(async move { while dora_ev.poll().await.is_ok() {} });
    let got = publish4(&mut alice_ev).await;
    assert_eq!(got.topic, "test/ok", "the denied publish was dropped");
    drive.abort();
}

#[tokio::test]
async fn stomp_subscribe_to_a_denied_destination_gets_an_error() {
    let (broker, _dir) = broker().await;
    let creds = [("login", "dora"), ("passcode", "pw")];
    for dest in ["/topic/test/nosubscribe", "/queue/secret"] {
        let (mut dora, _) = StompClient::connect_version(broker.stomp(), "1.2", &creds).await;
        dora.subscribe("ok", "/topic/test/other", "auto", &[]).await;
        dora.send_frame(
            "SUBSCRIBE",
            &[("id", "denied"), ("destination", dest), ("receipt", "r1")],
            b"",
        )
        .await;
        let err = dora.expect_error_then_close().await;
        assert_eq!(
            err.header("message"),
            Some("not authorized"),
            "{dest}: {err:?}"
        );
    }
    // Sending to the queue is denied too; to another queue it is not.
    let (mut dora, _) = StompClient::connect_version(broker.stomp(), "1.2", &creds).await;
    dora.send_persistent("/queue/open", &[], b"fine").await;
    dora.send_frame(
        "SEND",
        &[("destination", "/queue/secret"), ("receipt", "r2")],
        b"x",
    )
    .await;
    let err = dora.expect_error_then_close().await;
    assert_eq!(err.header("receipt-id"), Some("r2"), "{err:?}");
    assert!(broker
        .core()
        .queue_stats("secret")
        .is_none_or(|s| s.depth == 0));
}

#[tokio::test]
async fn amqp_attach_to_a_denied_address_is_refused_with_unauthorized_access() {
    let (broker, _dir) = broker().await;
    let mut conn = Connection::builder()
        .container_id("deny-test")
        .sasl_profile(fe2o3_amqp::sasl_profile::SaslProfile::Plain {
            username: "dora".to_owned(),
            password: "pw".to_owned(),
        })
        .open(amqp::url(&broker).as_str())
        .await
        .expect("dora logs in");
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let e = Receiver::attach(&mut session, "r-denied", "/queue/secret")
        .await
        .expect_err("receiver attach to a denied queue");
    assert!(format!("{e:?}").contains("UnauthorizedAccess"), "{e:?}");
    // fe2o3 reuses the refused link's handle at once and can trip on its
    // own bookkeeping (see tests/amqp_sasl.rs); a pause avoids that.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let e = Sender::attach(&mut session, "s-denied", "/queue/secret")
        .await
        .expect_err("sender attach to a denied queue");
    assert!(format!("{e:?}").contains("UnauthorizedAccess"), "{e:?}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut sender = Sender::attach(&mut session, "s-open", "/queue/open")
        .await
        .expect("sender attach to an allowed queue");
    sender.send("fine").await.expect("accepted");
    sender.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
}
