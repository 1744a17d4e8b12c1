//! MQTT 5 Reason Strings (and Request Problem Information), the client's
//! Maximum Packet Size applied to them, and Response Information.

use mqttbytes::v5;
use rosetta_mqtt::MqttConfig;
use rosetta_neutral::*;

use crate::fake::FakeBroker;
use crate::harness::*;

/// A v5 connection with the given problem-information flag and maximum
/// packet size.
fn connected(problem_info: Option<u8>, max_packet: Option<u32>) -> Harness {
    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("r");
    c.keep_alive = 30;
    let mut props = connect_props();
    props.request_problem_info = problem_info;
    props.max_packet_size = max_packet;
    c.properties = Some(props);
    h.input(&connect_v5(c));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::Success,
            ..
        })]
    ));
    h
}

fn refused_subscribe(h: &mut Harness) -> Option<String> {
    h.broker.state().fail_bind = Some(BrokerError::Unauthorized("subscribe to 'secret'".into()));
    h.input(&subscribe_v5(v5::Subscribe {
        pkid: 1,
        filters: vec![v5::SubscribeFilter::new("secret".into(), qos(1))],
        properties: None,
    }));
    match h.v5_packets().as_slice() {
        [v5::Packet::SubAck(a)] => {
            assert_eq!(a.return_codes, vec![v5::SubscribeReasonCode::NotAuthorized]);
            a.properties.as_ref().and_then(|p| p.reason_string.clone())
        }
        other => panic!("{other:?}"),
    }
}

fn refused_publish(h: &mut Harness) -> Option<String> {
    h.broker.state().fail_publish = Some(BrokerError::Unauthorized("publish to 't'".into()));
    h.input(&pub_v5("t", 1, 5, b"x"));
    match h.v5_packets().as_slice() {
        [v5::Packet::PubAck(a)] => {
            assert_eq!(a.reason, v5::PubAckReason::NotAuthorized);
            a.properties.as_ref().and_then(|p| p.reason_string.clone())
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn failed_suback_and_puback_explain_themselves() {
    let mut h = connected(None, None);
    let why = refused_subscribe(&mut h).expect("SUBACK reason string");
    assert!(
        why.contains("secret") && why.contains("not authorized"),
        "{why}"
    );
    let why = refused_publish(&mut h).expect("PUBACK reason string");
    assert!(why.contains("not authorized"), "{why}");
    // Success carries none.
    h.broker.state().fail_publish = None;
    h.input(&pub_v5("t", 1, 6, b"x"));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::PubAck(v5::PubAck {
            properties: None,
            ..
        })]
    ));
}

#[test]
fn failed_pubrec_explains_itself() {
    let mut h = connected(None, None);
    h.broker.state().fail_publish = Some(BrokerError::ResourceLimit("disk full".into()));
    h.input(&pub_v5("t", 2, 5, b"x"));
    match h.v5_packets().as_slice() {
        [v5::Packet::PubRec(a)] => {
            assert_eq!(a.reason, v5::PubRecReason::QuotaExceeded);
            let why = a.properties.as_ref().and_then(|p| p.reason_string.clone());
            assert!(why.expect("reason string").contains("disk full"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_problem_information_means_no_reason_strings_on_acks() {
    let mut h = connected(Some(0), None);
    assert_eq!(refused_subscribe(&mut h), None);
    assert_eq!(refused_publish(&mut h), None);
    // DISCONNECT is still allowed one (MQTT 5 §3.1.2.11.7).
    h.input(&pub_v5("a/+", 0, 0, b"x"));
    match h.v5_packets().as_slice() {
        [v5::Packet::Disconnect(d)] => {
            assert_eq!(d.reason_code, v5::DisconnectReasonCode::TopicNameInvalid);
            let why = d.properties.as_ref().and_then(|p| p.reason_string.clone());
            assert!(why.expect("reason string").contains("a/+"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn reason_strings_are_dropped_to_fit_the_clients_maximum_packet_size() {
    // 16 bytes: a failed PUBACK (4 bytes) fits, with a reason string not.
    let mut h = connected(None, Some(16));
    assert_eq!(refused_publish(&mut h), None);
    assert_eq!(refused_subscribe(&mut h), None);
    h.input(&pub_v5("a/+", 0, 0, b"x"));
    match h.v5_packets().as_slice() {
        [v5::Packet::Disconnect(d)] => {
            assert_eq!(d.reason_code, v5::DisconnectReasonCode::TopicNameInvalid);
            assert_eq!(d.properties, None);
        }
        other => panic!("{other:?}"),
    }
    let out_max = h.raw_output().len();
    assert_eq!(out_max, 0);
}

#[test]
fn refused_connack_has_a_reason_string_that_fits() {
    for (max, expect_text) in [(None, true), (Some(20), false)] {
        let mut h = Harness::with(MqttConfig::default(), FakeBroker::new(), true);
        let mut c = v5::Connect::new("x");
        let mut props = connect_props();
        props.request_problem_info = Some(0);
        props.max_packet_size = max;
        c.properties = Some(props);
        c.set_login("alice", "wrong");
        h.input(&connect_v5(c));
        let raw = h.raw_output();
        if let Some(m) = max {
            assert!(raw.len() <= m as usize, "{} bytes", raw.len());
        }
        let mut buf = bytes::BytesMut::from(&raw[..]);
        match v5::read(&mut buf, 1 << 20) {
            Ok(v5::Packet::ConnAck(a)) => {
                assert_eq!(a.code, v5::ConnectReturnCode::BadUserNamePassword);
                let why = a.properties.and_then(|p| p.reason_string);
                assert_eq!(why.is_some(), expect_text, "{why:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn response_information_only_when_asked() {
    for (ask, expect) in [
        (Some(1), Some("response/ri/")),
        (Some(0), None),
        (None, None),
    ] {
        let mut h = Harness::new(true);
        let mut c = v5::Connect::new("ri");
        let mut props = connect_props();
        props.request_response_info = ask;
        c.properties = Some(props);
        h.input(&connect_v5(c));
        match h.v5_packets().as_slice() {
            [v5::Packet::ConnAck(a)] => {
                let info = a
                    .properties
                    .as_ref()
                    .and_then(|p| p.response_information.clone());
                assert_eq!(info.as_deref(), expect);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn failed_unsuback_explains_itself() {
    let mut h = connected(None, None);
    h.input(&unsubscribe(3, &["a/#/b", "fine"], true));
    match h.v5_packets().as_slice() {
        [v5::Packet::UnsubAck(a)] => {
            assert_eq!(
                a.reasons,
                vec![
                    v5::UnsubAckReason::TopicFilterInvalid,
                    v5::UnsubAckReason::NoSubscriptionExisted
                ]
            );
            let why = a.properties.as_ref().and_then(|p| p.reason_string.clone());
            assert!(why.expect("reason string").contains("a/#/b"));
        }
        other => panic!("{other:?}"),
    }
}
