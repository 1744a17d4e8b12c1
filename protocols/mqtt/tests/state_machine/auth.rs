//! MQTT 5 enhanced authentication: SCRAM-SHA-256 through AUTH packets at
//! CONNECT and as re-authentication, against the fake core's credentials.

use bytes::BytesMut;
use hmac::{Hmac, Mac};
use mqttbytes::v5;
use rosetta_mqtt::codec::encode;
use rosetta_mqtt::scram::{ScramClient, SCRAM_SHA_256};
use rosetta_neutral::*;
use sha2::{Digest, Sha256};

use crate::harness::*;

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// What a users file stores for `password`.
fn creds(password: &[u8]) -> ScramCredentials {
    let salt = b"0123456789abcdef".to_vec();
    let mut salted = [0u8; 32];
    pbkdf2::pbkdf2::<Hmac<Sha256>>(password, &salt, 4096, &mut salted).expect("pbkdf2");
    ScramCredentials {
        salt,
        iterations: 4096,
        stored_key: Sha256::digest(hmac(&salted, b"Client Key")).into(),
        server_key: hmac(&salted, b"Server Key").try_into().expect("32 bytes"),
    }
}

fn harness() -> Harness {
    let h = Harness::new(true);
    h.broker
        .state()
        .scram
        .insert("alice".into(), creds(b"secret"));
    h.broker.state().anonymous = false;
    h
}

fn auth_packet(reason: u8, method: &str, data: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode::auth(reason, method, data, &mut b);
    b.to_vec()
}

/// Parses a server AUTH: (reason, method, data).
fn parse_auth(raw: &[u8]) -> (u8, String, Vec<u8>) {
    assert_eq!(raw.first(), Some(&0xF0), "AUTH expected, got {raw:?}");
    // Remaining length < 128 in these tests: one byte.
    assert_eq!(usize::from(raw[1]), raw.len() - 2, "one whole packet");
    let reason = raw[2];
    let props = &raw[4..];
    assert_eq!(usize::from(raw[3]), props.len());
    assert_eq!(props[0], 0x15);
    let mlen = usize::from(u16::from_be_bytes([props[1], props[2]]));
    let method = String::from_utf8(props[3..3 + mlen].to_vec()).expect("utf-8");
    let rest = &props[3 + mlen..];
    assert_eq!(rest[0], 0x16);
    let dlen = usize::from(u16::from_be_bytes([rest[1], rest[2]]));
    (reason, method, rest[3..3 + dlen].to_vec())
}

fn connect_scram(h: &mut Harness, client: &ScramClient, user_name: Option<&str>) {
    let mut c = v5::Connect::new("sc");
    let mut props = connect_props();
    props.authentication_method = Some(SCRAM_SHA_256.into());
    props.authentication_data = Some(client.client_first().into());
    c.properties = Some(props);
    if let Some(u) = user_name {
        c.set_login(u, "");
    }
    h.input(&connect_v5(c));
}

/// Runs the CONNECT exchange with `password`; the CONNACK.
fn scram_connect(h: &mut Harness, password: &[u8]) -> (ScramClient, v5::ConnAck) {
    let mut client = ScramClient::new("alice", password);
    connect_scram(h, &client, None);
    let (reason, method, server_first) = parse_auth(&h.raw_output());
    assert_eq!((reason, method.as_str()), (0x18, SCRAM_SHA_256));
    assert!(
        h.broker.state().sessions.is_empty(),
        "no session before the proof"
    );
    let client_final = client.client_final(&server_first).expect("client-final");
    h.input(&auth_packet(0x18, SCRAM_SHA_256, &client_final));
    match h.v5_packets().as_slice() {
        [v5::Packet::ConnAck(a)] => (client, a.clone()),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

#[test]
fn scram_connect_authenticates_and_proves_the_server() {
    let mut h = harness();
    let (client, ack) = scram_connect(&mut h, b"secret");
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    let props = ack.properties.expect("CONNACK properties");
    assert_eq!(props.authentication_method.as_deref(), Some(SCRAM_SHA_256));
    let server_final = props.authentication_data.expect("server-final");
    assert!(client.verify_server_final(&server_final));
    let s = h.broker.state();
    assert_eq!(s.sessions[0].principal.user.as_deref(), Some("alice"));
}

#[test]
fn wrong_password_is_connack_0x86_and_no_session() {
    let mut h = harness();
    let (_, ack) = scram_connect(&mut h, b"wrong");
    assert_eq!(ack.code, v5::ConnectReturnCode::BadUserNamePassword);
    assert!(ack.properties.and_then(|p| p.reason_string).is_some());
    assert!(h.conn.is_closed());
    assert!(h.broker.state().sessions.is_empty());
}

#[test]
fn user_name_must_match_the_scram_user() {
    let mut h = harness();
    connect_scram(&mut h, &ScramClient::new("alice", b"secret"), Some("bob"));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::BadUserNamePassword,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
}

/// On a connection with a verified client certificate, the SCRAM user
/// must be the certificate's user (the identity rule of
/// `rosetta_neutral::login`): 0x87, before any exchange.
#[test]
fn the_scram_user_must_be_the_certificate_user() {
    let mut h = harness();
    let broker = h.broker.clone();
    h.conn = rosetta_mqtt::MqttConnection::new(
        rosetta_mqtt::MqttConfig::default(),
        std::sync::Arc::new(broker),
        std::sync::Arc::new(crate::fake::NullSink),
        8,
        h.now,
    )
    .with_certificate_user(Some("bob".into()));
    connect_scram(&mut h, &ScramClient::new("alice", b"secret"), None);
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::NotAuthorized,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
    assert!(h.broker.state().sessions.is_empty());
}

#[test]
fn only_auth_may_follow_a_scram_connect() {
    let mut h = harness();
    connect_scram(&mut h, &ScramClient::new("alice", b"secret"), None);
    h.raw_output();
    h.input(&pub_v5("t", 0, 0, b"x"));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::ProtocolError,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
    assert!(h.broker.state().sessions.is_empty());

    // AUTH with another method mid-exchange: protocol error too.
    let mut h = harness();
    connect_scram(&mut h, &ScramClient::new("alice", b"secret"), None);
    h.raw_output();
    h.input(&auth_packet(0x18, "PLAIN", b"x"));
    assert!(matches!(
        h.v5_packets().as_slice(),
        [v5::Packet::ConnAck(v5::ConnAck {
            code: v5::ConnectReturnCode::ProtocolError,
            ..
        })]
    ));
}

#[test]
fn the_connect_deadline_covers_the_exchange() {
    let mut h = harness();
    connect_scram(&mut h, &ScramClient::new("alice", b"secret"), None);
    h.raw_output();
    h.advance(std::time::Duration::from_secs(11));
    assert!(h.conn.is_closed());
    assert!(h.raw_output().is_empty());
    assert!(h.broker.state().sessions.is_empty());
}

/// Re-authentication: AUTH 0x19 → AUTH 0x18 → AUTH 0x18 → AUTH 0x00.
fn reauth(h: &mut Harness, user: &str, password: &[u8]) -> Option<ScramClient> {
    let mut client = ScramClient::new(user, password);
    h.input(&auth_packet(0x19, SCRAM_SHA_256, &client.client_first()));
    let out = h.raw_output();
    if out.first() != Some(&0xF0) {
        h.unread(&out);
        return None;
    }
    let (reason, _, server_first) = parse_auth(&out);
    assert_eq!(reason, 0x18);
    let client_final = client.client_final(&server_first).expect("client-final");
    h.input(&auth_packet(0x18, SCRAM_SHA_256, &client_final));
    let out = h.raw_output();
    if out.first() != Some(&0xF0) {
        h.unread(&out);
        return None;
    }
    let (reason, _, server_final) = parse_auth(&out);
    assert_eq!(reason, 0x00);
    assert!(client.verify_server_final(&server_final));
    Some(client)
}

fn disconnect_code(h: &mut Harness) -> v5::DisconnectReasonCode {
    match h.v5_packets().as_slice() {
        [v5::Packet::Disconnect(d)] => d.reason_code,
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
}

#[test]
fn reauthentication_succeeds_twice_and_fails_with_0x87() {
    let mut h = harness();
    scram_connect(&mut h, b"secret");
    assert!(reauth(&mut h, "alice", b"secret").is_some());
    assert!(reauth(&mut h, "alice", b"secret").is_some());
    assert!(!h.conn.is_closed());
    assert!(reauth(&mut h, "alice", b"wrong").is_none());
    assert_eq!(
        disconnect_code(&mut h),
        v5::DisconnectReasonCode::NotAuthorized
    );
    assert!(h.conn.is_closed());
}

#[test]
fn reauthentication_cannot_change_the_user() {
    let mut h = harness();
    h.broker.state().scram.insert("mallory".into(), creds(b"m"));
    scram_connect(&mut h, b"secret");
    assert!(reauth(&mut h, "mallory", b"m").is_none());
    assert_eq!(
        disconnect_code(&mut h),
        v5::DisconnectReasonCode::NotAuthorized
    );
}

#[test]
fn auth_with_another_method_or_out_of_sequence() {
    let mut h = harness();
    scram_connect(&mut h, b"secret");
    h.input(&auth_packet(0x19, "PLAIN", b"x"));
    assert_eq!(
        disconnect_code(&mut h),
        v5::DisconnectReasonCode::ProtocolError
    );

    let mut h = harness();
    scram_connect(&mut h, b"secret");
    h.input(&auth_packet(0x18, SCRAM_SHA_256, b"c=biws,r=x,p=AAAA"));
    assert_eq!(
        disconnect_code(&mut h),
        v5::DisconnectReasonCode::ProtocolError
    );
}
