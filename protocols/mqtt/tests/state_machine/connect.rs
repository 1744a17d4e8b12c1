use std::time::Duration;

use mqttbytes::{v4, v5};
use rosetta_mqtt::MqttConfig;
use rosetta_neutral::*;

use crate::fake::FakeBroker;
use crate::harness::*;

#[test]
fn v311_clean_session_connects_and_creates_its_queue_on_first_subscribe() {
    let mut h = Harness::new(false);
    h.input(&connect_v4("dev1", true, 30, None));
    let p = h.v4_packets();
    assert!(matches!(
        p.as_slice(),
        [v4::Packet::ConnAck(v4::ConnAck {
            session_present: false,
            code: v4::ConnectReturnCode::Success
        })]
    ));
    let s = h.broker.state();
    assert_eq!(s.sessions[0].client_id.as_deref(), Some("dev1"));
    assert!(s.sessions[0].take_over);
    assert_eq!(s.sessions[0].protocol, Protocol::Mqtt);
    assert!(
        !s.queues.contains_key("$mqtt/dev1") && s.consumers.is_empty(),
        "a clean session holds no queue before its first subscription"
    );
    drop(s);
    h.subscribe_ok("a/b");
    let s = h.broker.state();
    let q = &s.queues["$mqtt/dev1"];
    assert!(!q.durable);
    assert_eq!(q.lifetime, QueueLifetime::Session);
    let (_, spec) = &s.consumers[0];
    assert_eq!(spec.queue, "$mqtt/dev1");
    assert_eq!(spec.credit, CreditMode::Window(256));
    assert!(!spec.auto_settle);
    assert_eq!(
        s.deleted,
        vec!["$mqtt/dev1".to_owned()],
        "clean session deletes the old queue"
    );
}

#[test]
fn v311_persistent_session_is_durable_and_present_on_reconnect() {
    let mut h = Harness::new(false);
    assert!(!h.connect_ok("dev1", false));
    {
        let s = h.broker.state();
        let q = &s.queues["$mqtt/dev1"];
        assert!(q.durable);
        assert_eq!(q.lifetime, QueueLifetime::Permanent);
    }
    h.input(&[0xE0, 0]);
    assert!(h.conn.is_closed());
    assert_eq!(h.broker.state().closes, vec![CloseKind::Clean]);
    let mut h2 = h.reconnect(MqttConfig::default(), false);
    assert!(h2.connect_ok("dev1", false), "session present");
    let mut h3 = h.reconnect(MqttConfig::default(), false);
    assert!(!h3.connect_ok("dev1", true), "clean session: not present");
}

#[test]
fn bad_credentials_get_the_right_code_in_both_versions() {
    let mut h = Harness::new(false);
    h.input(&connect_v4("c", true, 30, Some(("alice", "wrong"))));
    assert!(matches!(
        h.v4_packets().as_slice(),
        [v4::Packet::ConnAck(v4::ConnAck {
            code: v4::ConnectReturnCode::BadUserNamePassword,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
    assert!(
        h.broker.state().sessions.is_empty(),
        "no session for a refused client"
    );

    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("c");
    c.set_login("alice", "wrong");
    h.input(&connect_v5(c));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::BadUserNamePassword,
            ..
        })]
    ));

    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("c");
    c.set_login("alice", "secret");
    h.input(&connect_v5(c));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::Success,
            ..
        })]
    ));
    assert_eq!(
        h.broker.state().sessions[0].principal.user.as_deref(),
        Some("alice")
    );
}

#[test]
fn anonymous_disabled_is_not_authorized() {
    let broker = FakeBroker::new();
    broker.state().anonymous = false;
    let mut h = Harness::with(MqttConfig::default(), broker.clone(), false);
    h.input(&connect_v4("c", true, 30, None));
    assert!(matches!(
        h.v4_packets().as_slice(),
        [v4::Packet::ConnAck(v4::ConnAck {
            code: v4::ConnectReturnCode::NotAuthorized,
            ..
        })]
    ));
    let mut h = Harness::with(MqttConfig::default(), broker, true);
    h.input(&connect_v5(v5::Connect::new("c")));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::NotAuthorized,
            ..
        })]
    ));
}

#[test]
fn empty_client_id_rules() {
    // 3.1.1: empty id only with clean session.
    let mut h = Harness::new(false);
    h.input(&connect_v4("", false, 30, None));
    assert!(matches!(
        h.v4_packets().as_slice(),
        [v4::Packet::ConnAck(v4::ConnAck {
            code: v4::ConnectReturnCode::BadClientId,
            ..
        })]
    ));
    let mut h = Harness::new(false);
    assert!(!h.connect_ok("", true));

    // 5.0: the server assigns one and says so.
    let mut h = Harness::new(true);
    h.input(&connect_v5(v5::Connect::new("")));
    let p = h.v5_packets();
    let [v5::Packet::ConnAck(a)] = p.as_slice() else {
        panic!("{p:?}")
    };
    let assigned = a
        .properties
        .as_ref()
        .and_then(|p| p.assigned_client_identifier.clone())
        .expect("assigned client id");
    assert_eq!(
        h.broker.state().sessions[0].client_id.as_deref(),
        Some(assigned.as_str())
    );
    h.subscribe_ok("a/b");
    assert!(h
        .broker
        .state()
        .queues
        .contains_key(&mqtt_session_queue(&assigned)));
    assert_eq!(h.conn.client_id(), Some(assigned.as_str()));
}

#[test]
fn v5_connack_advertises_limits() {
    let config = MqttConfig {
        qos_max: 1,
        retain_available: false,
        shared_subscriptions_available: false,
        topic_alias_max: 9,
        receive_maximum: 33,
        packet_size_max_bytes: 4096,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config, FakeBroker::new(), true);
    h.input(&connect_v5(v5::Connect::new("c")));
    let p = h.v5_packets();
    let [v5::Packet::ConnAck(a)] = p.as_slice() else {
        panic!("{p:?}")
    };
    let props = a.properties.as_ref().expect("props");
    assert_eq!(props.receive_max, Some(33));
    assert_eq!(props.max_qos, Some(1));
    assert_eq!(props.retain_available, Some(0));
    assert_eq!(props.max_packet_size, Some(4096));
    assert_eq!(props.topic_alias_max, Some(9));
    assert_eq!(props.wildcard_subscription_available, Some(1));
    assert_eq!(props.shared_subscription_available, Some(0));
    assert_eq!(props.subscription_identifiers_available, Some(1));
}

#[test]
fn v5_session_expiry_sets_queue_lifetime_and_is_capped() {
    let config = MqttConfig {
        session_expiry_max_s: 100,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config.clone(), FakeBroker::new(), true);
    let mut c = v5::Connect::new("s");
    let mut props = connect_props();
    props.session_expiry_interval = Some(60);
    c.properties = Some(props);
    h.input(&connect_v5(c.clone()));
    let p = h.v5_packets();
    let [v5::Packet::ConnAck(a)] = p.as_slice() else {
        panic!("{p:?}")
    };
    assert_eq!(
        a.properties
            .as_ref()
            .and_then(|p| p.session_expiry_interval),
        None
    );
    {
        let s = h.broker.state();
        let q = &s.queues["$mqtt/s"];
        assert!(q.durable);
        assert_eq!(q.lifetime, QueueLifetime::IdleFor(Duration::from_secs(60)));
    }
    // Asking for "never expire" gets the cap, and CONNACK says so; the
    // session is present because clean start is off.
    let mut h2 = h.reconnect(config, true);
    let mut props = connect_props();
    props.session_expiry_interval = Some(u32::MAX);
    c.properties = Some(props);
    c.clean_session = false;
    h2.input(&connect_v5(c));
    let p = h2.v5_packets();
    let [v5::Packet::ConnAck(a)] = p.as_slice() else {
        panic!("{p:?}")
    };
    assert!(a.session_present);
    assert_eq!(
        a.properties
            .as_ref()
            .and_then(|p| p.session_expiry_interval),
        Some(100)
    );
    assert_eq!(
        h2.broker.state().queues["$mqtt/s"].lifetime,
        QueueLifetime::IdleFor(Duration::from_secs(100))
    );
}

#[test]
fn keep_alive_is_enforced_at_one_and_a_half_times() {
    let mut h = Harness::new(false);
    h.input(&connect_v4("k", true, 10, None));
    h.packets();
    assert_eq!(h.conn.poll_timeout(), Some(h.now + Duration::from_secs(15)));
    h.advance(Duration::from_millis(14_900));
    assert!(!h.conn.is_closed());
    h.input(&[0xC0, 0]); // PINGREQ resets the timer
    assert!(matches!(h.v4_packets().as_slice(), [v4::Packet::PingResp]));
    h.advance(Duration::from_millis(14_900));
    assert!(!h.conn.is_closed());
    h.advance(Duration::from_millis(100));
    assert!(h.conn.is_closed());
    assert!(h.raw_output().is_empty(), "3.1.1 just closes");
    assert_eq!(h.broker.state().closes, vec![CloseKind::Abnormal]);
}

/// MQTT-3.1.2-24: only a complete control packet counts. A PUBLISH dribbled
/// one byte a second never completes within 1.5 × the keep-alive, so the
/// connection is closed, however busy the socket looks.
#[test]
fn keep_alive_counts_complete_packets_not_bytes() {
    let mut h = Harness::new(false);
    h.input(&connect_v4("k", true, 2, None));
    h.packets();
    let connected_at = h.now;
    let publish = publish_v4(
        "dribble/topic",
        0,
        0,
        b"a payload long enough to outlast the keep-alive",
    );
    let mut sent = 0;
    while !h.conn.is_closed() && sent < publish.len() {
        h.input(&publish[sent..=sent]);
        sent += 1;
        h.advance(Duration::from_secs(1));
    }
    assert!(h.conn.is_closed(), "a dribbled packet kept the connection");
    assert!(
        h.now - connected_at <= Duration::from_secs(3),
        "closed after {:?}, not within 1.5 × 2 s",
        h.now - connected_at
    );
    assert!(sent < publish.len(), "closed before the PUBLISH completed");
    assert_eq!(h.broker.state().closes, vec![CloseKind::Abnormal]);
}

/// A complete packet that arrived in pieces resets the timer when its last
/// byte arrives.
#[test]
fn keep_alive_restarts_when_a_split_packet_completes() {
    let mut h = Harness::new(false);
    h.input(&connect_v4("k", true, 10, None));
    h.packets();
    h.advance(Duration::from_secs(14));
    h.input(&[0xC0]); // first half of PINGREQ: not yet a packet
    h.advance(Duration::from_millis(999));
    assert!(!h.conn.is_closed());
    h.input(&[0]);
    assert!(matches!(h.v4_packets().as_slice(), [v4::Packet::PingResp]));
    assert_eq!(h.conn.poll_timeout(), Some(h.now + Duration::from_secs(15)));
}

/// While producers are held back the connection is not read, so the
/// client's PINGREQs wait in the socket: its silence is not its fault.
#[test]
fn keep_alive_is_not_enforced_while_input_is_held_back() {
    let mut h = Harness::new(false);
    h.input(&connect_v4("k", true, 10, None));
    h.packets();
    h.broker.state().producer_blocked = true;
    assert!(!h.conn.wants_input());
    h.advance(Duration::from_secs(15));
    h.advance(Duration::from_secs(15));
    assert!(!h.conn.is_closed(), "held back, not timed out");
    h.broker.state().producer_blocked = false;
    h.advance(Duration::from_millis(14_900));
    assert!(
        !h.conn.is_closed(),
        "the interval restarts from the last check"
    );
    h.advance(Duration::from_millis(200));
    assert!(h.conn.is_closed(), "enforced again once reading resumes");
}

#[test]
fn v5_server_keep_alive_caps_the_client_and_times_out_with_0x8d() {
    let config = MqttConfig {
        keep_alive_max_s: 20,
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config, FakeBroker::new(), true);
    let mut c = v5::Connect::new("k");
    c.keep_alive = 0; // "no keep-alive" is more than the maximum too
    h.input(&connect_v5(c));
    let p = h.v5_packets();
    let [v5::Packet::ConnAck(a)] = p.as_slice() else {
        panic!("{p:?}")
    };
    assert_eq!(
        a.properties.as_ref().and_then(|p| p.server_keep_alive),
        Some(20)
    );
    h.advance(Duration::from_secs(30));
    let p = h.v5_packets();
    assert!(matches!(
        p.as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::KeepAliveTimeout,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
}

#[test]
fn connect_timeout_closes_silent_connections() {
    let mut h = Harness::new(false);
    h.advance(Duration::from_secs(9));
    assert!(!h.conn.is_closed());
    h.advance(Duration::from_secs(1));
    assert!(h.conn.is_closed());
    assert_eq!(h.conn.poll_timeout(), None);
}

#[test]
fn take_over_sends_0x8e_and_closes() {
    let mut h = Harness::connected(true);
    h.event(SessionEvent::Kicked {
        reason: KickReason::TakenOver,
    });
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::SessionTakenOver,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
    let mut h = Harness::connected(true);
    h.event(SessionEvent::Kicked {
        reason: KickReason::ServerShutdown,
    });
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::ServerShuttingDown,
            ..
        })]
    ));
    // 3.1.1: closed without a packet.
    let mut h = Harness::connected(false);
    h.event(SessionEvent::Kicked {
        reason: KickReason::TakenOver,
    });
    assert!(h.conn.is_closed());
    assert!(h.raw_output().is_empty());
}

#[test]
fn unsupported_protocol_level_gets_return_code_1() {
    let mut h = Harness::new(false);
    // MQTT 3.1 "MQIsdp" level 3.
    let mut body = vec![0, 6];
    body.extend_from_slice(b"MQIsdp");
    body.extend_from_slice(&[3, 2, 0, 30, 0, 1, b'c']);
    let mut pkt = vec![0x10, body.len() as u8];
    pkt.extend_from_slice(&body);
    h.input(&pkt);
    assert!(matches!(
        h.v4_packets().as_slice(),
        [v4::Packet::ConnAck(v4::ConnAck {
            code: v4::ConnectReturnCode::RefusedProtocolVersion,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
}

#[test]
fn unknown_authentication_method_is_refused() {
    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("c");
    let mut props = connect_props();
    props.authentication_method = Some("SCRAM-SHA-1".into());
    c.properties = Some(props);
    h.input(&connect_v5(c));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::BadAuthenticationMethod,
            ..
        })]
    ));
}

#[test]
fn will_is_set_and_close_kind_follows_the_disconnect() {
    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("w");
    let mut will = v5::LastWill::new(
        "status/w",
        b"gone".to_vec(),
        mqttbytes::QoS::AtLeastOnce,
        true,
    );
    will.properties = Some(v5::WillProperties {
        delay_interval: Some(5),
        payload_format_indicator: Some(1),
        message_expiry_interval: None,
        content_type: Some("text/plain".into()),
        response_topic: None,
        correlation_data: None,
        user_properties: vec![("k".into(), "v".into())],
    });
    c.last_will = Some(will);
    // A session that outlives the will delay: the delay is kept.
    let mut props = connect_props();
    props.session_expiry_interval = Some(60);
    c.properties = Some(props);
    h.input(&connect_v5(c));
    h.packets();
    {
        let s = h.broker.state();
        let will = s.wills[0].as_ref().expect("will set");
        assert_eq!(will.address, Address::Topic("status/w".into()));
        assert_eq!(will.delay, Duration::from_secs(5));
        assert_eq!(&will.message.body.bytes[..], b"gone");
        assert_eq!(will.message.body.kind, BodyKind::Text);
        assert!(will.message.retain);
        assert_eq!(will.message.guarantee, Guarantee::AtLeastOnce);
        assert_eq!(will.message.content_type.as_deref(), Some("text/plain"));
        assert_eq!(will.message.properties.get("k"), Some(&Value::from("v")));
    }
    // DISCONNECT with reason 0x04: close, but publish the will.
    h.input(&[0xE0, 1, 0x04]);
    assert!(h.conn.is_closed());
    assert_eq!(h.broker.state().closes, vec![CloseKind::CleanWithWill]);

    let mut h = Harness::connected(true);
    h.input(&[0xE0, 0]);
    assert_eq!(h.broker.state().closes, vec![CloseKind::Clean]);

    let mut h = Harness::connected(false);
    h.conn.handle_transport_closed(h.now);
    assert!(h.conn.is_closed());
    assert_eq!(h.broker.state().closes, vec![CloseKind::Abnormal]);
}

#[test]
fn will_topic_with_wildcard_is_refused() {
    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("w");
    c.last_will = Some(v5::LastWill::new(
        "a/#",
        b"x".to_vec(),
        mqttbytes::QoS::AtMostOnce,
        false,
    ));
    h.input(&connect_v5(c));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::TopicNameInvalid,
            ..
        })]
    ));
}

#[test]
fn disconnect_may_not_set_expiry_after_zero() {
    let mut h = Harness::connected(true);
    // DISCONNECT 0x00 with session expiry 10 after CONNECT had 0.
    h.input(&[0xE0, 7, 0x00, 5, 0x11, 0, 0, 0, 10]);
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::ProtocolError,
            ..
        })]
    ));
    assert_eq!(h.broker.state().closes, vec![CloseKind::Abnormal]);
}

#[test]
fn v311_persistent_sessions_can_be_given_an_expiry() {
    let config = MqttConfig {
        v311_session_expiry_s: Some(3600),
        ..MqttConfig::default()
    };
    let mut h = Harness::with(config, FakeBroker::new(), false);
    h.connect_ok("p", false);
    let s = h.broker.state();
    assert_eq!(
        s.queues["$mqtt/p"].lifetime,
        QueueLifetime::IdleFor(Duration::from_secs(3600))
    );
    assert!(s.queues["$mqtt/p"].durable);
}

#[test]
fn client_ids_that_cannot_name_a_queue_are_refused() {
    let mut h = Harness::new(true);
    h.input(&connect_v5(v5::Connect::new("dev/+")));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::ClientIdentifierNotValid,
            ..
        })]
    ));
    let mut h = Harness::new(false);
    h.input(&connect_v4(&"x".repeat(300), true, 30, None));
    assert!(matches!(
        h.v4_packets().as_slice(),
        [v4::Packet::ConnAck(v4::ConnAck {
            code: v4::ConnectReturnCode::BadClientId,
            ..
        })]
    ));
}

#[test]
fn disconnect_can_change_a_non_zero_session_expiry() {
    let mut h = Harness::new(true);
    let mut c = v5::Connect::new("e");
    let mut props = connect_props();
    props.session_expiry_interval = Some(60);
    c.properties = Some(props);
    h.input(&connect_v5(c));
    h.packets();
    // DISCONNECT 0x00 with session expiry 0: the session ends with the
    // connection (a re-declare cannot make a lasting queue connection-scoped,
    // so the session queue is deleted as a clean start would).
    h.input(&[0xE0, 7, 0x00, 5, 0x11, 0, 0, 0, 0]);
    assert!(h.conn.is_closed());
    let s = h.broker.state();
    assert!(!s.queues.contains_key("$mqtt/e"), "session queue deleted");
    assert_eq!(s.closes, vec![CloseKind::Clean]);
}

#[test]
fn will_delay_is_capped_by_the_session_expiry() {
    // The will goes out when the delay passes or the session ends,
    // whichever is first: with session expiry 2 s a 30 s delay becomes 2 s,
    // with expiry 0 (session ends at close) it becomes 0.
    for (expiry, want) in [(Some(2), 2), (None, 0)] {
        let mut h = Harness::new(true);
        let mut c = v5::Connect::new("wd");
        let mut will = v5::LastWill::new("w/d", b"x".to_vec(), mqttbytes::QoS::AtMostOnce, false);
        will.properties = Some(v5::WillProperties {
            delay_interval: Some(30),
            payload_format_indicator: None,
            message_expiry_interval: None,
            content_type: None,
            response_topic: None,
            correlation_data: None,
            user_properties: vec![],
        });
        c.last_will = Some(will);
        let mut props = connect_props();
        props.session_expiry_interval = expiry;
        c.properties = Some(props);
        h.input(&connect_v5(c));
        h.packets();
        let s = h.broker.state();
        let will = s.wills[0].as_ref().expect("will set");
        assert_eq!(will.delay, Duration::from_secs(want), "expiry {expiry:?}");
    }
}
