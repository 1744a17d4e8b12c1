//! MQTT 5 enhanced authentication over a real socket: SCRAM-SHA-256 with
//! AUTH packets against the users file (CONNECT, re-authentication,
//! wrong passwords, the permissions of the authenticated user). rumqttc
//! cannot drive an AUTH exchange (nor read an AUTH packet), so a raw client
//! does: rumqttc's codec for the other packets, the project's encoder for
//! the client's AUTH, a small parser here for the server's, and
//! `rosetta_mqtt::scram::ScramClient` for the proofs.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use bytes::BytesMut;
use common::mqtt::*;
use common::TestBroker;
use rosetta_mqtt::codec::encode;
use rosetta_mqtt::scram::{ScramClient, SCRAM_SHA_256};
use rumqttc::v5::mqttbytes::v5 as p5;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn broker() -> (TestBroker, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    // Anonymous access off: only an authenticated client gets in.
    let broker = TestBroker::start_with(|_| {}, users_access(dir.path(), false)).await;
    (broker, dir)
}

/// A server packet: AUTH, parsed here (rumqttc's reader refuses packet
/// type 15), or anything else as rumqttc reads it.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // test-only, short-lived values
enum In {
    Auth {
        reason: u8,
        method: String,
        data: Vec<u8>,
    },
    Other(p5::Packet),
}

/// A raw MQTT 5 connection that also reads AUTH.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    async fn open(broker: &TestBroker) -> Conn {
        let stream = TcpStream::connect(broker.mqtt()).await.expect("connect");
        Conn {
            stream,
            buf: BytesMut::new(),
        }
    }

    async fn send(&mut self, p: p5::Packet) {
        let mut b = BytesMut::new();
        p.write(&mut b, None).expect("encode v5");
        self.stream.write_all(&b).await.expect("write");
    }

    async fn send_auth(&mut self, reason: u8, data: &[u8]) {
        let mut b = BytesMut::new();
        encode::auth(reason, SCRAM_SHA_256, data, &mut b);
        self.stream.write_all(&b).await.expect("write");
    }

    /// The next packet, or `None` once the server closed the connection.
    async fn recv(&mut self) -> Option<In> {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(p) = self.parse() {
                    return Some(p);
                }
                let mut chunk = [0u8; 4096];
                match self.stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await
        .expect("a packet or the close within the timeout")
    }

    fn parse(&mut self) -> Option<In> {
        // Fixed header: type, then a variable byte integer (all ours < 2 MiB).
        let (mut len, mut shift, mut i) = (0usize, 0, 1);
        loop {
            let b = *self.buf.get(i)?;
            len |= usize::from(b & 0x7F) << shift;
            i += 1;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        if self.buf.len() < i + len {
            return None;
        }
        if self.buf[0] != 0xF0 {
            let p = p5::Packet::read(&mut self.buf, None).expect("decodable packet");
            return Some(In::Other(p));
        }
        let packet = self.buf.split_to(i + len);
        let body = &packet[i..];
        // reason, property length (< 128 here), 0x15 method, 0x16 data.
        let reason = body[0];
        let props = &body[2..];
        assert_eq!(usize::from(body[1]), props.len(), "{body:?}");
        assert_eq!(props[0], 0x15);
        let m = usize::from(u16::from_be_bytes([props[1], props[2]]));
        let method = String::from_utf8(props[3..3 + m].to_vec()).expect("utf-8");
        let rest = &props[3 + m..];
        assert_eq!(rest[0], 0x16);
        let d = usize::from(u16::from_be_bytes([rest[1], rest[2]]));
        Some(In::Auth {
            reason,
            method,
            data: rest[3..3 + d].to_vec(),
        })
    }

    /// The next packet, which must be AUTH with `reason`; its data.
    async fn recv_auth(&mut self, want: u8) -> Vec<u8> {
        match self.recv().await {
            Some(In::Auth {
                reason,
                method,
                data,
            }) => {
                assert_eq!((reason, method.as_str()), (want, SCRAM_SHA_256));
                data
            }
            other => panic!("expected AUTH {want:#x}, got {other:?}"),
        }
    }

    async fn recv_other(&mut self) -> p5::Packet {
        match self.recv().await {
            Some(In::Other(p)) => p,
            other => panic!("expected a packet, got {other:?}"),
        }
    }
}

/// CONNECT with SCRAM-SHA-256 as `user`/`password`, through the AUTH
/// round trip; the connection, the CONNACK and the client.
async fn scram_connect(
    broker: &TestBroker,
    id: &str,
    user: &str,
    password: &str,
) -> (Conn, p5::ConnAck, ScramClient) {
    let mut client = ScramClient::new(user, password.as_bytes());
    let props = p5::ConnectProperties {
        authentication_method: Some(SCRAM_SHA_256.into()),
        authentication_data: Some(client.client_first().into()),
        ..p5::ConnectProperties::new()
    };
    let mut conn = Conn::open(broker).await;
    conn.send(p5::Packet::Connect(
        connect5_packet(id, true, Some(props)),
        None,
        None,
    ))
    .await;
    let server_first = conn.recv_auth(0x18).await;
    let client_final = client.client_final(&server_first).expect("client-final");
    conn.send_auth(0x18, &client_final).await;
    match conn.recv_other().await {
        p5::Packet::ConnAck(ack) => (conn, ack, client),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

async fn subscribe_code(conn: &mut Conn, filter: &str) -> p5::SubscribeReasonCode {
    let mut sub = p5::Subscribe::new(
        p5::Filter::new(filter, rumqttc::v5::mqttbytes::QoS::AtLeastOnce),
        None,
    );
    sub.pkid = 1;
    conn.send(p5::Packet::Subscribe(sub)).await;
    match conn.recv_other().await {
        p5::Packet::SubAck(a) => a.return_codes[0],
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

#[tokio::test]
async fn scram_connect_and_reauthenticate() {
    let (broker, _dir) = broker().await;
    let (mut conn, ack, client) = scram_connect(&broker, "sc-alice", "alice", "secret").await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    let props = ack.properties.expect("CONNACK properties");
    assert_eq!(props.authentication_method.as_deref(), Some(SCRAM_SHA_256));
    let server_final = props.authentication_data.expect("server-final");
    assert!(
        client.verify_server_final(&server_final),
        "the server proved it knows alice"
    );
    assert_eq!(
        subscribe_code(&mut conn, "any/topic").await,
        p5::SubscribeReasonCode::Success(rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
    );

    // Re-authentication: AUTH 0x19 … AUTH 0x00, the connection stays.
    let mut again = ScramClient::new("alice", b"secret");
    conn.send_auth(0x19, &again.client_first()).await;
    let server_first = conn.recv_auth(0x18).await;
    let client_final = again.client_final(&server_first).expect("final");
    conn.send_auth(0x18, &client_final).await;
    let server_final = conn.recv_auth(0x00).await;
    assert!(again.verify_server_final(&server_final));
    conn.send(p5::Packet::PingReq(p5::PingReq)).await;
    assert!(matches!(conn.recv_other().await, p5::Packet::PingResp(_)));

    // A failed re-authentication ends the connection with 0x87.
    let mut wrong = ScramClient::new("alice", b"not-it");
    conn.send_auth(0x19, &wrong.client_first()).await;
    let server_first = conn.recv_auth(0x18).await;
    let client_final = wrong.client_final(&server_first).expect("final");
    conn.send_auth(0x18, &client_final).await;
    match conn.recv_other().await {
        p5::Packet::Disconnect(d) => {
            assert_eq!(d.reason_code, v5::DisconnectReasonCode::NotAuthorized)
        }
        other => panic!("expected DISCONNECT 0x87, got {other:?}"),
    }
    assert!(conn.recv().await.is_none(), "closed after DISCONNECT");
    broker.stop().await;
}

#[tokio::test]
async fn wrong_password_and_unknown_user_get_0x86() {
    let (broker, _dir) = broker().await;
    for (user, password) in [("alice", "wrong"), ("nobody", "secret")] {
        let (mut conn, ack, _) = scram_connect(&broker, "sc-bad", user, password).await;
        assert_eq!(
            ack.code,
            v5::ConnectReturnCode::BadUserNamePassword,
            "{user}"
        );
        assert!(conn.recv().await.is_none(), "closed after the refusal");
    }
    broker.stop().await;
}

/// The SCRAM user is the session's principal: bob's permissions apply.
#[tokio::test]
async fn scram_user_gets_its_own_permissions() {
    let (broker, _dir) = broker().await;
    let (mut conn, ack, _) = scram_connect(&broker, "sc-bob", "bob", "pw").await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    assert_eq!(
        subscribe_code(&mut conn, "alice/in").await,
        p5::SubscribeReasonCode::NotAuthorized
    );
    broker.stop().await;
}
