//! MQTT 5 specifics over real sockets: server limits advertised in CONNACK
//! and enforced, properties carried end to end (user properties, content
//! type, payload format, request/response, message expiry), topic aliases
//! and maximum packet size in both directions.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::mqtt::*;
use common::TestBroker;
use rumqttc::v5::mqttbytes::v5 as p5;
use rumqttc::v5::mqttbytes::QoS as Q5;
use rumqttc::QoS;

fn allow_all() -> Arc<dyn rosetta::core::AccessControl> {
    Arc::new(rosetta::core::AllowAll)
}

#[tokio::test]
async fn connack_advertises_the_default_limits() {
    let broker = TestBroker::start().await;
    let mut connect = connect5_packet("limits-default", true, None);
    connect.keep_alive = 0; // "no keep-alive": the server imposes its maximum
    let (_raw, ack) = Raw::connect5(broker.mqtt(), connect, None).await;
    let p = ack.properties.expect("CONNACK properties");
    assert_eq!(p.server_keep_alive, Some(600));
    assert_eq!(p.receive_max, Some(1024));
    // Derived from the payload limit (16 MiB by default) plus room for the
    // headers, so that a default-sized payload fits.
    let packet_max = rosetta::config::Config::default().mqtt_packet_size_max();
    assert!(packet_max >= 16 * 1024 * 1024, "{packet_max}");
    assert_eq!(p.max_packet_size, Some(packet_max));
    assert_eq!(p.topic_alias_max, Some(64));
    // Absent means available; present must say 1.
    for flag in [
        p.retain_available,
        p.wildcard_subscription_available,
        p.shared_subscription_available,
        p.subscription_identifiers_available,
    ] {
        assert!(matches!(flag, None | Some(1)), "{p:?}");
    }
    assert!(matches!(p.max_qos, None | Some(2)), "{p:?}");
    broker.stop().await;
}

#[tokio::test]
async fn configured_limits_are_advertised_and_enforced() {
    let broker = TestBroker::start_with(
        |c| {
            c.mqtt.keep_alive_max_s = 5;
            c.mqtt.receive_maximum = 10;
            c.mqtt.packet_size_max_bytes = Some(2048);
            c.mqtt.qos_max = 1;
            c.mqtt.retain_available = false;
            c.mqtt.wildcard_available = false;
            c.mqtt.shared_available = false;
            c.mqtt.topic_alias_max = 3;
        },
        allow_all(),
    )
    .await;
    let mut connect = connect5_packet("limits", true, None);
    connect.keep_alive = 60;
    let (mut raw, ack) = Raw::connect5(broker.mqtt(), connect, None).await;
    let p = ack.properties.expect("CONNACK properties");
    assert_eq!(p.server_keep_alive, Some(5), "keep-alive above the maximum");
    assert_eq!(p.receive_max, Some(10));
    assert_eq!(p.max_packet_size, Some(2048));
    assert_eq!(p.max_qos, Some(1));
    assert_eq!(p.retain_available, Some(0));
    assert_eq!(p.wildcard_subscription_available, Some(0));
    assert_eq!(p.shared_subscription_available, Some(0));
    assert_eq!(p.topic_alias_max, Some(3));

    // A keep-alive within the maximum is not overridden.
    let mut connect = connect5_packet("limits-ok", true, None);
    connect.keep_alive = 4;
    let (_ok, ack) = Raw::connect5(broker.mqtt(), connect, None).await;
    assert_eq!(ack.properties.and_then(|p| p.server_keep_alive), None);

    // Unavailable features are refused per filter.
    let mut sub = p5::Subscribe::new_many(
        [
            p5::Filter::new("l/+", Q5::AtLeastOnce),
            p5::Filter::new("$share/g/l/t", Q5::AtLeastOnce),
            p5::Filter::new("l/t", Q5::ExactlyOnce),
        ],
        None,
    );
    sub.pkid = 1;
    raw.send5(p5::Packet::Subscribe(sub)).await;
    match raw.recv5().await {
        p5::Packet::SubAck(a) => assert_eq!(
            a.return_codes,
            [
                p5::SubscribeReasonCode::WildcardSubscriptionsNotSupported,
                p5::SubscribeReasonCode::SharedSubscriptionsNotSupported,
                p5::SubscribeReasonCode::Success(Q5::AtLeastOnce),
            ]
        ),
        other => panic!("expected SUBACK, got {other:?}"),
    }
    // QoS above the maximum: DISCONNECT 0x9B.
    let mut p = p5::Publish::new("l/t", Q5::ExactlyOnce, "x", None);
    p.pkid = 1;
    raw.send5(p5::Packet::Publish(p)).await;
    let d = raw
        .expect_disconnect5(p5::DisconnectReasonCode::QoSNotSupported)
        .await;
    // Problem information was not refused: the reason says why.
    let why = d.properties.and_then(|p| p.reason_string);
    assert!(why.is_some_and(|s| !s.is_empty()), "reason string expected");
    // Retain while unavailable: DISCONNECT 0x9A.
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "limits-r", None).await;
    let mut p = p5::Publish::new("l/t", Q5::AtMostOnce, "x", None);
    p.retain = true;
    raw.send5(p5::Packet::Publish(p)).await;
    raw.expect_disconnect5(p5::DisconnectReasonCode::RetainNotSupported)
        .await;
    // Packet above the maximum: DISCONNECT 0x95.
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "limits-s", None).await;
    let p = p5::Publish::new("l/t", Q5::AtMostOnce, vec![0u8; 4000], None);
    raw.send5(p5::Packet::Publish(p)).await;
    raw.expect_disconnect5(p5::DisconnectReasonCode::PacketTooLarge)
        .await;
    broker.stop().await;
}

#[tokio::test]
async fn properties_are_carried_end_to_end() {
    let broker = TestBroker::start().await;
    let (s, mut sev, _) = connected5(opts5(&broker, "props-sub")).await;
    subscribe5(
        &s,
        &mut sev,
        v5::Filter::new("props/t", Q5::AtLeastOnce),
        None,
    )
    .await;
    let (p, mut pev, _) = connected5(opts5(&broker, "props-pub")).await;
    let user = vec![
        ("b".to_owned(), "1".to_owned()),
        ("a".to_owned(), "2".to_owned()),
        ("b".to_owned(), "3".to_owned()),
        ("b".to_owned(), "1".to_owned()),
    ];
    let props = v5::PublishProperties {
        payload_format_indicator: Some(1),
        content_type: Some("text/plain; charset=utf-8".into()),
        user_properties: user.clone(),
        ..Default::default()
    };
    publish_and_ack5(
        &p,
        &mut pev,
        "props/t",
        Q5::AtLeastOnce,
        false,
        "héllo".as_bytes(),
        Some(props),
    )
    .await;
    let got = publish5(&mut sev).await;
    assert_eq!(&got.payload[..], "héllo".as_bytes());
    let gp = got.properties.expect("properties");
    assert_eq!(gp.user_properties, user, "order and duplicates kept");
    assert_eq!(
        gp.content_type.as_deref(),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(gp.payload_format_indicator, Some(1));
    assert_eq!(gp.message_expiry_interval, None);

    // Binary payload: format indicator 0 (or absent) comes through as such.
    let props = v5::PublishProperties {
        payload_format_indicator: Some(0),
        ..Default::default()
    };
    publish_and_ack5(
        &p,
        &mut pev,
        "props/t",
        Q5::AtLeastOnce,
        false,
        &[0xff, 0x00],
        Some(props),
    )
    .await;
    let got = publish5(&mut sev).await;
    assert_eq!(&got.payload[..], &[0xff, 0x00]);
    assert!(matches!(
        got.properties.and_then(|p| p.payload_format_indicator),
        None | Some(0)
    ));
    broker.stop().await;
}

#[tokio::test]
async fn request_response_with_response_topic_and_correlation_data() {
    let broker = TestBroker::start().await;
    let (svc, mut svc_ev, _) = connected5(opts5(&broker, "service")).await;
    subscribe5(
        &svc,
        &mut svc_ev,
        v5::Filter::new("svc/req", Q5::AtLeastOnce),
        None,
    )
    .await;
    let (req, mut req_ev, _) = connected5(opts5(&broker, "requester")).await;
    subscribe5(
        &req,
        &mut req_ev,
        v5::Filter::new("reply/requester", Q5::AtLeastOnce),
        None,
    )
    .await;

    let props = v5::PublishProperties {
        response_topic: Some("reply/requester".into()),
        correlation_data: Some(Bytes::from_static(&[1, 2, 3, 0xff])),
        ..Default::default()
    };
    publish_and_ack5(
        &req,
        &mut req_ev,
        "svc/req",
        Q5::AtLeastOnce,
        false,
        b"ping?",
        Some(props),
    )
    .await;
    let request = publish5(&mut svc_ev).await;
    let rp = request.properties.expect("request properties");
    let reply_to = rp.response_topic.expect("response topic");
    let corr = rp.correlation_data.expect("correlation data");
    assert_eq!(reply_to, "reply/requester");
    assert_eq!(&corr[..], &[1, 2, 3, 0xff]);
    let props = v5::PublishProperties {
        correlation_data: Some(corr),
        ..Default::default()
    };
    publish_and_ack5(
        &svc,
        &mut svc_ev,
        &reply_to,
        Q5::AtLeastOnce,
        false,
        b"pong",
        Some(props),
    )
    .await;
    let response = publish5(&mut req_ev).await;
    assert_eq!(&response.payload[..], b"pong");
    assert_eq!(
        response
            .properties
            .and_then(|p| p.correlation_data)
            .as_deref(),
        Some(&[1u8, 2, 3, 0xff][..])
    );
    broker.stop().await;
}

#[tokio::test]
async fn message_expiry_sends_the_remaining_lifetime_and_drops_expired() {
    let broker = TestBroker::start().await;
    let (p, mut pev, _) = connected5(opts5(&broker, "exp-pub")).await;
    let expiring = |s| v5::PublishProperties {
        message_expiry_interval: Some(s),
        ..Default::default()
    };
    publish_and_ack5(
        &p,
        &mut pev,
        "mx/long",
        Q5::AtLeastOnce,
        true,
        b"10s",
        Some(expiring(10)),
    )
    .await;
    publish_and_ack5(
        &p,
        &mut pev,
        "mx/short",
        Q5::AtLeastOnce,
        true,
        b"1s",
        Some(expiring(1)),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2100)).await;

    let (s, mut sev, _) = connected5(opts5(&broker, "exp-sub")).await;
    subscribe5(&s, &mut sev, v5::Filter::new("mx/#", Q5::AtLeastOnce), None).await;
    let got = publish5(&mut sev).await;
    assert_eq!(got.topic, Bytes::from_static(b"mx/long"));
    let left = got
        .properties
        .and_then(|p| p.message_expiry_interval)
        .expect("remaining lifetime");
    assert!(
        (6..=8).contains(&left),
        "remaining {left} s of 10 after ~2 s"
    );
    quiet5(&mut sev).await; // mx/short expired

    // A live delivery carries the interval too.
    publish_and_ack5(
        &p,
        &mut pev,
        "mx/live",
        Q5::AtLeastOnce,
        false,
        b"x",
        Some(expiring(30)),
    )
    .await;
    let got = publish5(&mut sev).await;
    let left = got.properties.and_then(|p| p.message_expiry_interval);
    assert!(matches!(left, Some(29..=30)), "{left:?}");

    // Queued for an offline session: expired ones are never delivered.
    let mut opts = opts5(&broker, "exp-offline");
    opts.set_clean_start(true);
    opts.set_session_expiry_interval(Some(60));
    let (o, mut oev, _) = connected5(opts.clone()).await;
    subscribe5(&o, &mut oev, v5::Filter::new("mq/#", Q5::AtLeastOnce), None).await;
    disconnect5(&o, &mut oev).await;
    publish_and_ack5(
        &p,
        &mut pev,
        "mq/short",
        Q5::AtLeastOnce,
        false,
        b"s",
        Some(expiring(1)),
    )
    .await;
    publish_and_ack5(&p, &mut pev, "mq/none", Q5::AtLeastOnce, false, b"n", None).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    opts.set_clean_start(false);
    let (_o, mut oev, ack) = connected5(opts).await;
    assert!(ack.session_present);
    let got = publish5(&mut oev).await;
    assert_eq!(got.topic, Bytes::from_static(b"mq/none"));
    quiet5(&mut oev).await;
    broker.stop().await;
}

#[tokio::test]
async fn inbound_topic_aliases() {
    let broker = TestBroker::start().await;
    let (_s, mut sev) = subscriber4(&broker, "alias-sub", true, "alias/#", QoS::AtMostOnce).await;
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "alias-pub", None).await;
    let aliased = |topic: &str, alias: u16, payload: &'static str| {
        p5::Packet::Publish(p5::Publish::new(
            topic,
            Q5::AtMostOnce,
            payload,
            Some(v5::PublishProperties {
                topic_alias: Some(alias),
                ..Default::default()
            }),
        ))
    };
    raw.send5(aliased("alias/one", 1, "a")).await;
    raw.send5(aliased("", 1, "b")).await;
    raw.send5(aliased("alias/two", 1, "c")).await; // re-maps alias 1
    raw.send5(aliased("", 1, "d")).await;
    for (topic, payload) in [
        ("alias/one", "a"),
        ("alias/one", "b"),
        ("alias/two", "c"),
        ("alias/two", "d"),
    ] {
        let p = publish4(&mut sev).await;
        assert_eq!(
            (p.topic.as_str(), &p.payload[..]),
            (topic, payload.as_bytes())
        );
    }
    // An alias never defined with an empty topic: a protocol error (0x82,
    // MQTT 5 3.3.2.3.4); an alias above the maximum: 0x94.
    raw.send5(aliased("", 2, "e")).await;
    raw.expect_disconnect5(p5::DisconnectReasonCode::ProtocolError)
        .await;
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "alias-pub2", None).await;
    raw.send5(aliased("alias/x", 65, "f")).await;
    raw.expect_disconnect5(p5::DisconnectReasonCode::TopicAliasInvalid)
        .await;
    quiet4(&mut sev).await;
    broker.stop().await;
}

#[tokio::test]
async fn outbound_topic_aliases_respect_the_client_maximum() {
    let broker = TestBroker::start().await;
    let props = p5::ConnectProperties {
        topic_alias_max: Some(1),
        ..p5::ConnectProperties::new()
    };
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "alias-out", Some(props)).await;
    raw_subscribe5(&mut raw, 1, "ao/#", Q5::AtMostOnce).await;
    for t in ["ao/a", "ao/a", "ao/b", "ao/a"] {
        publish_once4(&broker, t, QoS::AtMostOnce, false, t.as_bytes()).await;
    }
    let mut aliases: std::collections::HashMap<u16, Bytes> = Default::default();
    let mut used_alias = false;
    for want in ["ao/a", "ao/a", "ao/b", "ao/a"] {
        let p = raw.recv5_publish().await;
        let alias = p.properties.as_ref().and_then(|p| p.topic_alias);
        if let Some(a) = alias {
            assert_eq!(a, 1, "alias above the client's maximum");
            if p.topic.is_empty() {
                used_alias = true;
            } else {
                aliases.insert(a, p.topic.clone());
            }
        }
        let topic = if p.topic.is_empty() {
            aliases
                .get(&alias.expect("empty topic needs an alias"))
                .cloned()
                .expect("known alias")
        } else {
            p.topic.clone()
        };
        assert_eq!(topic, Bytes::from(want), "payload {:?}", p.payload);
        assert_eq!(&p.payload[..], want.as_bytes());
    }
    assert!(used_alias, "the repeated topic should travel as an alias");

    // A client with no alias maximum never gets one.
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "alias-none", None).await;
    raw_subscribe5(&mut raw, 1, "an/#", Q5::AtMostOnce).await;
    for _ in 0..3 {
        publish_once4(&broker, "an/t", QoS::AtMostOnce, false, b"x").await;
        let p = raw.recv5_publish().await;
        assert_eq!(p.topic, Bytes::from_static(b"an/t"));
        assert_eq!(p.properties.and_then(|p| p.topic_alias), None);
    }
    broker.stop().await;
}

#[tokio::test]
async fn client_maximum_packet_size_is_respected() {
    let broker = TestBroker::start().await;
    let props = p5::ConnectProperties {
        max_packet_size: Some(128),
        ..p5::ConnectProperties::new()
    };
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "small", Some(props)).await;
    raw_subscribe5(&mut raw, 1, "mps/t", Q5::AtLeastOnce).await;
    publish_once4(&broker, "mps/t", QoS::AtLeastOnce, false, &[7u8; 500]).await;
    publish_once4(&broker, "mps/t", QoS::AtLeastOnce, false, b"small").await;
    // The oversized message is skipped, the connection stays, the next one
    // arrives.
    let p = raw.recv5_publish().await;
    assert_eq!(&p.payload[..], b"small");
    raw.send5(p5::Packet::PubAck(p5::PubAck::new(p.pkid, None)))
        .await;
    raw.quiet5().await;
    raw.send5(p5::Packet::PingReq(p5::PingReq)).await;
    assert!(matches!(raw.recv5().await, p5::Packet::PingResp(_)));
    broker.stop().await;
}

#[tokio::test]
async fn retained_v5_properties_survive_a_restart() {
    let mut broker = TestBroker::start().await;
    let (p, mut pev, _) = connected5(opts5(&broker, "ret5-pub")).await;
    let props = v5::PublishProperties {
        payload_format_indicator: Some(1),
        content_type: Some("application/json".into()),
        response_topic: Some("ret5/reply".into()),
        correlation_data: Some(Bytes::from_static(b"c")),
        user_properties: vec![("u".into(), "1".into()), ("u".into(), "1".into())],
        ..Default::default()
    };
    publish_and_ack5(
        &p,
        &mut pev,
        "ret5/t",
        Q5::AtLeastOnce,
        true,
        b"{}",
        Some(props.clone()),
    )
    .await;
    disconnect5(&p, &mut pev).await;
    broker.restart().await;
    let (s, mut sev, _) = connected5(opts5(&broker, "ret5-sub")).await;
    subscribe5(
        &s,
        &mut sev,
        v5::Filter::new("ret5/#", Q5::AtLeastOnce),
        None,
    )
    .await;
    let got = publish5(&mut sev).await;
    assert!(got.retain);
    assert_eq!(&got.payload[..], b"{}");
    let gp = got.properties.expect("properties");
    assert_eq!(gp.payload_format_indicator, Some(1));
    assert_eq!(gp.content_type, props.content_type);
    assert_eq!(gp.response_topic, props.response_topic);
    assert_eq!(gp.correlation_data, props.correlation_data);
    assert_eq!(gp.user_properties, props.user_properties);
    broker.stop().await;
}

/// The Server Keep Alive is what the server enforces: a client that asked
/// for 60 s, got 1 s and went silent is dropped after ~1.5 s with 0x8D.
#[tokio::test]
async fn server_keep_alive_is_enforced() {
    let broker = TestBroker::start_with(|c| c.mqtt.keep_alive_max_s = 1, allow_all()).await;
    let mut connect = connect5_packet("ska", true, None);
    connect.keep_alive = 60;
    let (mut raw, ack) = Raw::connect5(broker.mqtt(), connect, None).await;
    assert_eq!(ack.properties.and_then(|p| p.server_keep_alive), Some(1));
    let start = std::time::Instant::now();
    raw.expect_disconnect5(p5::DisconnectReasonCode::KeepAliveTimeout)
        .await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    broker.stop().await;
}

/// A payload marked UTF-8 that is not: 0x99 (here as DISCONNECT, which the
/// spec allows in place of a PUBACK code); a CONNECT with a Receive Maximum
/// of 0 is refused as a protocol error.
#[tokio::test]
async fn v5_property_violations() {
    let broker = TestBroker::start().await;
    let (mut raw, _) = Raw::connect5_clean(broker.mqtt(), "pfi", None).await;
    let mut p = p5::Publish::new(
        "pfi/t",
        Q5::AtLeastOnce,
        vec![0xff, 0xfe],
        Some(v5::PublishProperties {
            payload_format_indicator: Some(1),
            ..Default::default()
        }),
    );
    p.pkid = 1;
    raw.send5(p5::Packet::Publish(p)).await;
    match raw.recv5().await {
        p5::Packet::PubAck(a) => assert_eq!(a.reason, p5::PubAckReason::PayloadFormatInvalid),
        p5::Packet::Disconnect(d) => {
            assert_eq!(
                d.reason_code,
                p5::DisconnectReasonCode::PayloadFormatInvalid
            )
        }
        other => panic!("expected 0x99, got {other:?}"),
    }

    let props = p5::ConnectProperties {
        receive_maximum: Some(0),
        ..p5::ConnectProperties::new()
    };
    let mut raw = Raw::open(broker.mqtt()).await;
    raw.send5(p5::Packet::Connect(
        connect5_packet("rm0", true, Some(props)),
        None,
        None,
    ))
    .await;
    match raw.recv5_opt(WAIT).await {
        Some(p5::Packet::ConnAck(a)) => assert!(
            matches!(
                a.code,
                p5::ConnectReturnCode::ProtocolError | p5::ConnectReturnCode::MalformedPacket
            ),
            "{a:?}"
        ),
        other => panic!("expected a refusing CONNACK, got {other:?}"),
    }
    raw.expect_silent_close().await;
    broker.stop().await;
}
