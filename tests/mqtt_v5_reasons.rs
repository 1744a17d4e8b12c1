//! MQTT 5 over real sockets: Reason Strings on failed SUBACK, PUBACK,
//! CONNACK and on DISCONNECT (Request Problem Information and the client's
//! Maximum Packet Size respected), Response Information, and a CONNECT
//! with an authentication method we do not offer.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use common::mqtt::*;
use common::TestBroker;
use rumqttc::v5::mqttbytes::v5 as p5;

/// bob (allowed only `bob/#`) with the given Request Problem Information.
async fn bob(
    broker: &TestBroker,
    id: &str,
    problem_info: Option<u8>,
) -> (v5::AsyncClient, v5::EventLoop) {
    let mut opts = opts5(broker, id);
    opts.set_credentials("bob", "pw");
    opts.set_request_problem_info(problem_info);
    let (c, ev, ack) = connected5(opts).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    (c, ev)
}

/// Subscribes to a forbidden filter and publishes to a forbidden topic:
/// the Reason Strings of the SUBACK and the PUBACK.
async fn refusals(c: &v5::AsyncClient, ev: &mut v5::EventLoop) -> (Option<String>, Option<String>) {
    let sub = subscribe5(
        c,
        ev,
        v5::Filter::new("alice/in", v5::QoS::AtLeastOnce),
        None,
    )
    .await;
    assert_eq!(sub.return_codes, [v5::SubscribeReasonCode::NotAuthorized]);
    c.publish("alice/in", v5::QoS::AtLeastOnce, false, "x")
        .await
        .expect("publish");
    let ack = wait5(ev, |p| match p {
        v5::Packet::PubAck(a) => Some(a.clone()),
        _ => None,
    })
    .await;
    assert_eq!(ack.reason, p5::PubAckReason::NotAuthorized);
    (
        sub.properties.and_then(|p| p.reason_string),
        ack.properties.and_then(|p| p.reason_string),
    )
}

#[tokio::test]
async fn failed_acks_carry_reason_strings_unless_problem_information_is_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_with(|_| {}, users_access(dir.path(), false)).await;

    let (c, mut ev) = bob(&broker, "rs-on", None).await;
    let (sub, publish) = refusals(&c, &mut ev).await;
    let sub = sub.expect("SUBACK reason string");
    assert!(
        sub.contains("alice/in") && sub.contains("not authorized"),
        "{sub}"
    );
    let publish = publish.expect("PUBACK reason string");
    assert!(publish.contains("alice/in"), "{publish}");

    let (c, mut ev) = bob(&broker, "rs-off", Some(0)).await;
    assert_eq!(refusals(&c, &mut ev).await, (None, None));
    broker.stop().await;
}

/// A PUBLISH to a wildcard topic gets DISCONNECT 0x90 with a Reason
/// String, also with Request Problem Information 0; not when the client's
/// Maximum Packet Size is too small for it.
#[tokio::test]
async fn disconnect_reason_string_fits_the_clients_maximum_packet_size() {
    let broker = TestBroker::start().await;
    for (max, expect_text) in [(None, true), (Some(12), false)] {
        let props = p5::ConnectProperties {
            request_problem_info: Some(0),
            max_packet_size: max,
            ..p5::ConnectProperties::new()
        };
        let (mut raw, ack) = Raw::connect5_clean(broker.mqtt(), "dc", Some(props)).await;
        assert_eq!(ack.code, v5::ConnectReturnCode::Success);
        raw.send5(p5::Packet::Publish(p5::Publish::new(
            "bad/+",
            rumqttc::v5::mqttbytes::QoS::AtMostOnce,
            "x",
            None,
        )))
        .await;
        let d = raw
            .expect_disconnect5(v5::DisconnectReasonCode::TopicNameInvalid)
            .await;
        let why = d.properties.and_then(|p| p.reason_string);
        assert_eq!(why.is_some(), expect_text, "{why:?}");
        if let Some(why) = why {
            assert!(why.contains("bad/+"), "{why}");
        }
    }
    broker.stop().await;
}

#[tokio::test]
async fn refused_connack_explains_itself() {
    let broker = TestBroker::start().await;
    // An authentication method we do not offer: 0x8C and a reason.
    let props = p5::ConnectProperties {
        authentication_method: Some("KERBEROS".into()),
        ..p5::ConnectProperties::new()
    };
    let (mut raw, ack) = Raw::connect5_clean(broker.mqtt(), "am", Some(props)).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::BadAuthenticationMethod);
    let why = ack.properties.and_then(|p| p.reason_string);
    assert!(why.expect("reason string").contains("KERBEROS"));
    assert!(
        raw.recv5_opt(WAIT).await.is_none(),
        "closed after the refusal"
    );

    // rumqttc sees the same code.
    let mut opts = opts5(&broker, "am2");
    opts.set_authentication_method(Some("KERBEROS".into()));
    let (_c, mut ev) = client5_with(opts);
    match next5(&mut ev).await {
        Err(v5::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, v5::ConnectReturnCode::BadAuthenticationMethod)
        }
        other => panic!("expected 0x8C, got {other:?}"),
    }
    broker.stop().await;
}

/// Response Information: a topic prefix of the client's own, which it may
/// subscribe to under the default permissions and use as response topic.
#[tokio::test]
async fn response_information_is_a_usable_prefix() {
    let broker = TestBroker::start().await;
    let mut opts = opts5(&broker, "requester");
    opts.set_request_response_info(Some(1));
    let (req, mut req_ev, ack) = connected5(opts).await;
    let prefix = ack
        .properties
        .and_then(|p| p.response_information)
        .expect("Response Information");
    assert_eq!(prefix, "response/requester/");

    // Not asked: none.
    let (_c, _ev, ack) = connected5(opts5(&broker, "plain")).await;
    assert_eq!(ack.properties.and_then(|p| p.response_information), None);

    let sub = subscribe5(
        &req,
        &mut req_ev,
        v5::Filter::new(format!("{prefix}#"), v5::QoS::AtLeastOnce),
        None,
    )
    .await;
    assert_eq!(
        sub.return_codes,
        [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
    );
    let (resp, mut resp_ev, _) = connected5(opts5(&broker, "responder")).await;
    subscribe5(
        &resp,
        &mut resp_ev,
        v5::Filter::new("svc/echo", v5::QoS::AtLeastOnce),
        None,
    )
    .await;
    let props = v5::PublishProperties {
        response_topic: Some(format!("{prefix}r1")),
        correlation_data: Some(bytes::Bytes::from_static(b"c1")),
        ..Default::default()
    };
    publish_and_ack5(
        &req,
        &mut req_ev,
        "svc/echo",
        v5::QoS::AtLeastOnce,
        false,
        b"ping",
        Some(props),
    )
    .await;
    let request = publish5(&mut resp_ev).await;
    let rp = request.properties.expect("request properties");
    let topic = rp.response_topic.expect("response topic");
    let back = v5::PublishProperties {
        correlation_data: rp.correlation_data,
        ..Default::default()
    };
    publish_and_ack5(
        &resp,
        &mut resp_ev,
        &topic,
        v5::QoS::AtLeastOnce,
        false,
        b"pong",
        Some(back),
    )
    .await;
    let reply = publish5(&mut req_ev).await;
    assert_eq!(&reply.payload[..], b"pong");
    assert_eq!(&reply.topic[..], b"response/requester/r1");
    broker.stop().await;
}
