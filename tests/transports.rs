//! MQTT, STOMP and AMQP 1.0 over WebSocket, over WebSocket with TLS (wss),
//! over TLS (MQTTS, STOMP+TLS, AMQPS) and on the any-protocol port, against a
//! real broker with a CA and certificates generated at test time; then the
//! bad input of issue 6 (bad upgrades, wrong subprotocol, oversized and
//! non-UTF-8 WebSocket frames, TLS garbage, plain text on a TLS port), each
//! refused or closed without harm to other connections.
//!
//! Every client talks its protocol over a byte stream (`tokio::io::duplex`)
//! that a pump task carries over the transport under test, so one protocol
//! exchange is checked over every transport.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::pki::{localhost, Pki};
use common::ws::{carry, Wire};
use common::TestBroker;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use rosetta::config::{ListenAddr, ListenerKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Longest a test waits for something that should happen.
const WAIT: Duration = Duration::from_secs(5);
/// The one web origin whose pages may open a WebSocket (clients that send
/// no Origin, i.e. not browsers, are always allowed).
const ALLOWED_ORIGIN: &str = "http://127.0.0.1:8000";
/// Longest a test waits for one packet or frame: a 16 MiB payload through
/// TLS and WebSocket in a debug build takes seconds.
const READ_WAIT: Duration = Duration::from_secs(60);
/// Largest WebSocket message the test broker accepts.
const WS_MESSAGE_MAX_BYTES: usize = 64 * 1024;
/// The payload every protocol must carry over every transport with the
/// broker's default limits.
const LARGE_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;

fn any_port() -> Option<ListenAddr> {
    Some(ListenAddr::new("127.0.0.1", 0))
}

/// A broker with every listener on a free loopback port and TLS from `pki`.
async fn broker(pki: &Pki, mutual: bool) -> TestBroker {
    let tls = pki.tls_config(mutual);
    TestBroker::start_with(
        move |c| {
            c.listeners.websocket = any_port();
            c.listeners.wss = any_port();
            c.listeners.mqtts = any_port();
            c.listeners.stomps = any_port();
            c.listeners.amqps = any_port();
            c.listeners.any = any_port();
            c.websocket.message_size_max_bytes = Some(WS_MESSAGE_MAX_BYTES);
            c.websocket.allowed_origins = vec![ALLOWED_ORIGIN.to_owned()];
            c.tls = tls;
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await
}

/// Opens `addr` (through TLS when `tls` is given) and returns the stream a
/// client reads and writes its protocol bytes on.
async fn open(
    addr: SocketAddr,
    tls: Option<&tokio_rustls::TlsConnector>,
    wire: Wire,
) -> DuplexStream {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    match tls {
        None => carry(tcp, wire).await,
        Some(connector) => {
            let tls = connector
                .connect(localhost(), tcp)
                .await
                .expect("TLS handshake");
            carry(tls, wire).await
        }
    }
}

// --- MQTT 3.1.1, hand-encoded so it runs over any byte stream ---------------

fn mqtt_packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut len = body.len();
    loop {
        let mut byte = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

fn mqtt_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Reads one MQTT packet: (first byte, body).
async fn mqtt_read(io: &mut DuplexStream) -> (u8, Vec<u8>) {
    tokio::time::timeout(READ_WAIT, async {
        let first = io.read_u8().await.expect("packet type");
        let mut len = 0usize;
        let mut shift = 0;
        loop {
            let b = io.read_u8().await.expect("remaining length");
            len |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        let mut body = vec![0u8; len];
        io.read_exact(&mut body).await.expect("packet body");
        (first, body)
    })
    .await
    .expect("MQTT packet in time")
}

/// CONNECT, SUBSCRIBE at QoS 1, PUBLISH at QoS 1 to the same topic: the
/// PUBACK and the client's own message come back.
async fn mqtt_round_trip(io: DuplexStream, label: &str) {
    let payload = format!("hello over {label}");
    mqtt_round_trip_with(io, label, payload.as_bytes()).await;
}

/// [`mqtt_round_trip`] with `payload`.
async fn mqtt_round_trip_with(mut io: DuplexStream, label: &str, payload: &[u8]) {
    let connack = mqtt_connack(&mut io, &format!("transports-{label}")).await;
    assert_eq!(connack, vec![0, 0], "CONNACK");

    let topic = format!("transports/{label}");
    let mut subscribe = vec![0, 1];
    mqtt_str(&mut subscribe, &topic);
    subscribe.push(1);
    io.write_all(&mqtt_packet(0x82, &subscribe))
        .await
        .expect("SUBSCRIBE");
    assert_eq!(mqtt_read(&mut io).await, (0x90, vec![0, 1, 1]), "SUBACK");

    let mut publish = Vec::new();
    mqtt_str(&mut publish, &topic);
    publish.extend_from_slice(&[0, 2]);
    publish.extend_from_slice(payload);
    io.write_all(&mqtt_packet(0x32, &publish))
        .await
        .expect("PUBLISH");
    let (mut acked, mut delivered) = (false, false);
    while !(acked && delivered) {
        let (first, body) = mqtt_read(&mut io).await;
        match first & 0xf0 {
            0x40 => {
                assert_eq!(body, vec![0, 2], "PUBACK of packet 2");
                acked = true;
            }
            0x30 => {
                let topic_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
                assert_eq!(&body[2..2 + topic_len], topic.as_bytes());
                let rest = &body[2 + topic_len..];
                let (id, got) = rest.split_at(if first & 0x06 != 0 { 2 } else { 0 });
                assert!(
                    got == payload,
                    "payload of {} bytes came back as {}",
                    payload.len(),
                    got.len()
                );
                if !id.is_empty() {
                    io.write_all(&mqtt_packet(0x40, id)).await.expect("PUBACK");
                }
                delivered = true;
            }
            other => panic!("unexpected MQTT packet type {other:#x}"),
        }
    }
    io.write_all(&[0xe0, 0]).await.expect("DISCONNECT");
}

// --- STOMP 1.2 ---------------------------------------------------------------

/// Reads one STOMP frame (heart-beat newlines skipped) as text.
async fn stomp_read(io: &mut DuplexStream, pending: &mut Vec<u8>) -> String {
    tokio::time::timeout(READ_WAIT, async {
        // Bytes of `pending` known to hold no NUL: each byte is looked at
        // once, however many reads a large frame takes.
        let mut scanned: usize = 0;
        loop {
            let beats = pending
                .iter()
                .take_while(|b| **b == b'\n' || **b == b'\r')
                .count();
            pending.drain(..beats);
            scanned = scanned.saturating_sub(beats);
            if let Some(end) = pending[scanned..].iter().position(|b| *b == 0) {
                let end = scanned + end;
                let frame: Vec<u8> = pending.drain(..=end).collect();
                return String::from_utf8_lossy(&frame[..end]).into_owned();
            }
            scanned = pending.len();
            let mut buf = [0u8; 64 * 1024];
            let n = io.read(&mut buf).await.expect("read STOMP");
            assert!(
                n > 0,
                "STOMP connection closed; got {} bytes",
                pending.len()
            );
            pending.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("STOMP frame in time")
}

/// CONNECT, SUBSCRIBE with a receipt, SEND to the same topic: the MESSAGE
/// comes back with the body.
async fn stomp_round_trip(io: DuplexStream, label: &str) {
    let body = format!("hello over {label}");
    stomp_round_trip_with(io, label, &body).await;
}

/// [`stomp_round_trip`] with `body` (ASCII: it may cross a text WebSocket
/// split anywhere).
async fn stomp_round_trip_with(mut io: DuplexStream, label: &str, body: &str) {
    let mut pending = Vec::new();
    io.write_all(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0")
        .await
        .expect("CONNECT");
    let connected = stomp_read(&mut io, &mut pending).await;
    assert!(connected.starts_with("CONNECTED\n"), "{connected}");
    let destination = format!("/topic/transports.{label}");
    io.write_all(
        format!("SUBSCRIBE\nid:0\ndestination:{destination}\nreceipt:r1\n\n\0").as_bytes(),
    )
    .await
    .expect("SUBSCRIBE");
    let receipt = stomp_read(&mut io, &mut pending).await;
    assert!(receipt.starts_with("RECEIPT\n"), "{receipt}");
    assert!(receipt.contains("receipt-id:r1"), "{receipt}");
    io.write_all(format!("SEND\ndestination:{destination}\n\n{body}\0").as_bytes())
        .await
        .expect("SEND");
    let message = stomp_read(&mut io, &mut pending).await;
    let head = message.get(..message.len().min(200)).unwrap_or_default();
    assert!(message.starts_with("MESSAGE\n"), "{head}");
    assert!(message.ends_with(&format!("\n\n{body}")), "{head}");
    io.write_all(b"DISCONNECT\n\n\0").await.expect("DISCONNECT");
}

// --- AMQP 1.0 (fe2o3-amqp over the stream) -----------------------------------

/// Opens a connection (no SASL: anonymous access is on), sends to a queue
/// and receives the message back.
async fn amqp_round_trip(io: DuplexStream, label: &str) {
    amqp_round_trip_with(io, label, format!("hello over {label}")).await;
}

/// [`amqp_round_trip`] with `body`.
async fn amqp_round_trip_with(io: DuplexStream, label: &str, body: String) {
    tokio::time::timeout(READ_WAIT * 2, async {
        let mut conn = Connection::builder()
            .container_id(format!("transports-{label}"))
            .open_with_stream(io)
            .await
            .expect("open");
        let mut session = Session::begin(&mut conn).await.expect("begin");
        let address = format!("/queue/transports.{label}");
        let mut sender = Sender::attach(&mut session, "sender", address.as_str())
            .await
            .expect("attach sender");
        sender
            .send(body.as_str())
            .await
            .expect("send")
            .accepted_or_else(|o| o)
            .expect("accepted");
        let mut receiver = Receiver::attach(&mut session, "receiver", address.as_str())
            .await
            .expect("attach receiver");
        let delivery: fe2o3_amqp::link::delivery::Delivery<String> =
            receiver.recv().await.expect("recv");
        assert!(
            delivery.body() == &body,
            "body of {} bytes came back as {}",
            body.len(),
            delivery.body().len()
        );
        receiver.accept(&delivery).await.expect("accept");
        receiver.close().await.expect("close receiver");
        sender.close().await.expect("close sender");
        session.end().await.expect("end");
        conn.close().await.expect("close");
    })
    .await
    .expect("AMQP exchange in time");
}

const MQTT_WS: Wire = Wire::Ws {
    path: "/mqtt",
    subprotocol: "mqtt",
    text: false,
};
const STOMP_WS_TEXT: Wire = Wire::Ws {
    path: "/stomp",
    subprotocol: "v12.stomp",
    text: true,
};
const STOMP_WS_BINARY: Wire = Wire::Ws {
    path: "/",
    subprotocol: "v11.stomp",
    text: false,
};
const AMQP_WS: Wire = Wire::Ws {
    path: "/amqp",
    subprotocol: "amqp",
    text: false,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_over_ws_wss_and_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(&pki, false).await;
    let tls = pki.connector();
    mqtt_round_trip(
        open(broker.addr(ListenerKind::WebSocket), None, MQTT_WS).await,
        "ws",
    )
    .await;
    // `mqttv3.1` on any path routes to MQTT too.
    let legacy = Wire::Ws {
        path: "/",
        subprotocol: "mqttv3.1",
        text: false,
    };
    mqtt_round_trip(
        open(broker.addr(ListenerKind::WebSocket), None, legacy).await,
        "ws-legacy",
    )
    .await;
    mqtt_round_trip(
        open(broker.addr(ListenerKind::Wss), Some(&tls), MQTT_WS).await,
        "wss",
    )
    .await;
    mqtt_round_trip(
        open(broker.addr(ListenerKind::Mqtts), Some(&tls), Wire::Raw).await,
        "tls",
    )
    .await;
    let any = broker.addr(ListenerKind::Any);
    mqtt_round_trip(open(any, None, Wire::Raw).await, "any-tcp").await;
    mqtt_round_trip(open(any, Some(&tls), MQTT_WS).await, "any-wss").await;

    // A stock client: rumqttc over TLS (ring provider) on the MQTTS port.
    let mqtts = broker.addr(ListenerKind::Mqtts);
    let mut opts = rumqttc::MqttOptions::new("transports-rumqttc", "localhost", mqtts.port());
    opts.set_transport(rumqttc::Transport::tls_with_config(
        rumqttc::TlsConfiguration::Rustls(pki.client_config()),
    ));
    let (client, mut events) = rumqttc::AsyncClient::new(opts, 10);
    client
        .subscribe("transports/rumqttc", rumqttc::QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    client
        .publish(
            "transports/rumqttc",
            rumqttc::QoS::AtLeastOnce,
            false,
            "tls",
        )
        .await
        .expect("publish");
    let publish = tokio::time::timeout(WAIT, async {
        loop {
            match events.poll().await.expect("MQTTS event loop") {
                rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) => break p,
                _ => continue,
            }
        }
    })
    .await
    .expect("own message over MQTTS");
    assert_eq!(&publish.payload[..], b"tls");
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stomp_over_ws_wss_and_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(&pki, false).await;
    let tls = pki.connector();
    let ws = broker.addr(ListenerKind::WebSocket);
    stomp_round_trip(open(ws, None, STOMP_WS_TEXT).await, "ws-text").await;
    stomp_round_trip(open(ws, None, STOMP_WS_BINARY).await, "ws-binary").await;
    let wss = broker.addr(ListenerKind::Wss);
    stomp_round_trip(open(wss, Some(&tls), STOMP_WS_TEXT).await, "wss").await;
    let stomps = broker.addr(ListenerKind::Stomps);
    stomp_round_trip(open(stomps, Some(&tls), Wire::Raw).await, "tls").await;
    let any = broker.addr(ListenerKind::Any);
    stomp_round_trip(open(any, Some(&tls), Wire::Raw).await, "any-tls").await;
    stomp_round_trip(open(any, None, STOMP_WS_TEXT).await, "any-ws").await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_over_ws_wss_and_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(&pki, false).await;
    let tls = pki.connector();
    let ws = broker.addr(ListenerKind::WebSocket);
    amqp_round_trip(open(ws, None, AMQP_WS).await, "ws").await;
    let wss = broker.addr(ListenerKind::Wss);
    amqp_round_trip(open(wss, Some(&tls), AMQP_WS).await, "wss").await;
    let amqps = broker.addr(ListenerKind::Amqps);
    amqp_round_trip(open(amqps, Some(&tls), Wire::Raw).await, "tls").await;
    let any = broker.addr(ListenerKind::Any);
    amqp_round_trip(open(any, None, Wire::Raw).await, "any-tcp").await;
    amqp_round_trip(open(any, Some(&tls), AMQP_WS).await, "any-wss").await;
    broker.stop().await;
}

/// Issue 13 item 3: with the default limits, a 16 MiB payload passes every
/// protocol over plain TCP, TLS, WebSocket and WebSocket over TLS (the
/// defaults used to count headers into a 1 MiB limit and refuse it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_mib_payloads_pass_every_protocol_and_transport_by_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let tls = pki.tls_config(false);
    let broker = TestBroker::start_with(
        move |c| {
            c.listeners.websocket = any_port();
            c.listeners.wss = any_port();
            c.listeners.mqtts = any_port();
            c.listeners.stomps = any_port();
            c.listeners.amqps = any_port();
            c.tls = tls;
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let connector = pki.connector();
    let payload: String = (0..LARGE_PAYLOAD_BYTES)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let ws = broker.addr(ListenerKind::WebSocket);
    let wss = broker.addr(ListenerKind::Wss);
    for (addr, tls, wire, label) in [
        (broker.mqtt(), None, Wire::Raw, "large-tcp"),
        (
            broker.addr(ListenerKind::Mqtts),
            Some(&connector),
            Wire::Raw,
            "large-tls",
        ),
        (ws, None, MQTT_WS, "large-ws"),
        (wss, Some(&connector), MQTT_WS, "large-wss"),
    ] {
        mqtt_round_trip_with(open(addr, tls, wire).await, label, payload.as_bytes()).await;
    }
    for (addr, tls, wire, label) in [
        (broker.stomp(), None, Wire::Raw, "large-tcp"),
        (
            broker.addr(ListenerKind::Stomps),
            Some(&connector),
            Wire::Raw,
            "large-tls",
        ),
        (ws, None, STOMP_WS_TEXT, "large-ws"),
        (wss, Some(&connector), STOMP_WS_BINARY, "large-wss"),
    ] {
        stomp_round_trip_with(open(addr, tls, wire).await, label, &payload).await;
    }
    for (addr, tls, wire, label) in [
        (broker.amqp(), None, Wire::Raw, "large-tcp"),
        (
            broker.addr(ListenerKind::Amqps),
            Some(&connector),
            Wire::Raw,
            "large-tls",
        ),
        (ws, None, AMQP_WS, "large-ws"),
        (wss, Some(&connector), AMQP_WS, "large-wss"),
    ] {
        amqp_round_trip_with(open(addr, tls, wire).await, label, payload.clone()).await;
    }
    broker.stop().await;
}

/// AMQP 1.0 §2.2: a protocol header the broker does not accept is
/// answered with one it supports, then the connection closes; on every
/// transport AMQP runs over. Anonymous access is on here, so SASL is
/// optional and a plain AMQP header of the wrong version gets the plain
/// one back; anything else gets the SASL header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_refused_protocol_headers_are_answered_on_every_transport() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(&pki, false).await;
    let tls = pki.connector();
    let (plain, sasl) = (*b"AMQP\x00\x01\x00\x00", *b"AMQP\x03\x01\x00\x00");
    let cases: [(&[u8], [u8; 8]); 5] = [
        (b"AMQP\x00\x00\x09\x01", plain), // AMQP 0-9-1
        (b"AMQP\x00\x01\x00\x01", plain), // AMQP 1.0.1
        (b"AMQP\x03\x01\x00\x01", sasl),  // SASL 1.0.1
        (b"AMQP\x02\x01\x00\x00", sasl),  // TLS in-band
        (b"AMQP\x07\x01\x00\x00", sasl),  // no such protocol id
    ];
    let any = broker.addr(ListenerKind::Any);
    let transports = [
        ("tcp", broker.amqp(), false, Wire::Raw),
        ("tls", broker.addr(ListenerKind::Amqps), true, Wire::Raw),
        ("ws", broker.addr(ListenerKind::WebSocket), false, AMQP_WS),
        ("wss", broker.addr(ListenerKind::Wss), true, AMQP_WS),
        ("any-tcp", any, false, Wire::Raw),
        ("any-tls", any, true, Wire::Raw),
        ("any-wss", any, true, AMQP_WS),
    ];
    for (label, addr, secure, wire) in transports {
        for (header, answer) in cases {
            let mut io = open(addr, secure.then_some(&tls), wire).await;
            io.write_all(header).await.expect("write header");
            assert_eq!(
                drain(&mut io).await,
                answer,
                "{label}: {header:?} answered, then closed"
            );
        }
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_required_refuses_a_client_without_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let tls = pki.tls_config(true);
    let broker = TestBroker::start_with(
        move |c| {
            c.listeners.mqtts = any_port();
            c.tls = tls;
            c.tls.require_client_cert = true;
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let mqtts = broker.addr(ListenerKind::Mqtts);
    // Without a certificate: the handshake fails, or (TLS 1.3: the server
    // checks after the client finished) the first read does.
    let refused = async {
        let tcp = TcpStream::connect(mqtts).await.expect("connect");
        let mut t = pki.connector().connect(localhost(), tcp).await?;
        t.write_all(&mqtt_packet(0x10, b"\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x"))
            .await?;
        let mut buf = [0u8; 16];
        match t.read(&mut buf).await? {
            0 => Err(std::io::Error::other("closed")),
            _ => Ok(()),
        }
    };
    assert!(
        tokio::time::timeout(WAIT, refused)
            .await
            .expect("refused in time")
            .is_err(),
        "a client without certificate was served"
    );
    let with_cert = tokio_rustls::TlsConnector::from(pki.client_config_as("alice"));
    mqtt_round_trip(open(mqtts, Some(&with_cert), Wire::Raw).await, "mtls").await;
    broker.stop().await;
}

/// Sends an MQTT 3.1.1 clean-session CONNECT with no user name and no
/// password and returns the CONNACK body (session present, return code).
async fn mqtt_connack(io: &mut DuplexStream, client_id: &str) -> Vec<u8> {
    let mut connect = Vec::new();
    mqtt_str(&mut connect, "MQTT");
    connect.extend_from_slice(&[4, 0x02, 0, 60]);
    mqtt_str(&mut connect, client_id);
    io.write_all(&mqtt_packet(0x10, &connect))
        .await
        .expect("CONNECT");
    let (first, body) = mqtt_read(io).await;
    assert_eq!(first, 0x20, "CONNACK");
    body
}

/// A hand-encoded AMQP SASL exchange choosing EXTERNAL: returns the
/// mechanisms offered and the sasl-outcome code (0 = ok).
async fn amqp_sasl_external(io: &mut DuplexStream) -> (Vec<u8>, u8) {
    io.write_all(b"AMQP\x03\x01\x00\x00").await.expect("header");
    let mut header = [0u8; 8];
    io.read_exact(&mut header).await.expect("SASL header back");
    assert_eq!(&header, b"AMQP\x03\x01\x00\x00");
    let mechanisms = amqp_read_frame(io).await;
    // sasl-init (0x41): list of one field, the symbol `EXTERNAL`.
    let mut body = vec![0x00, 0x53, 0x41, 0xc0, 11, 1, 0xa3, 8];
    body.extend_from_slice(b"EXTERNAL");
    let mut frame = ((8 + body.len()) as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&[2, 1, 0, 0]);
    frame.extend_from_slice(&body);
    io.write_all(&frame).await.expect("sasl-init");
    let outcome = amqp_read_frame(io).await;
    // sasl-outcome (0x44), a list whose first field is the ubyte code.
    let at = outcome
        .windows(2)
        .position(|w| w == [0x53, 0x44])
        .expect("sasl-outcome descriptor");
    let code_at = outcome[at + 2..]
        .iter()
        .position(|b| *b == 0x50)
        .expect("ubyte code");
    (mechanisms, outcome[at + 2 + code_at + 1])
}

/// Reads one AMQP frame and returns its body.
async fn amqp_read_frame(io: &mut DuplexStream) -> Vec<u8> {
    tokio::time::timeout(WAIT, async {
        let size = io.read_u32().await.expect("frame size") as usize;
        let mut rest = vec![0u8; size - 4];
        io.read_exact(&mut rest).await.expect("frame");
        let doff = usize::from(rest[0]) * 4;
        rest.split_off(doff - 4)
    })
    .await
    .expect("AMQP frame in time")
}

/// With mutual TLS on and anonymous access off, a verified client
/// certificate names the user on every protocol: a client that sends no
/// password is the certificate's user, with that user's permissions; a
/// certificate naming nobody in the users file is refused like a wrong
/// password, and so is a client with no certificate and no credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_names_the_user_on_every_protocol() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let tls = pki.tls_config(true);
    // alice may do anything; bob only publish and subscribe under bob/#.
    let access = common::mqtt::users_access(dir.path(), false);
    let broker = TestBroker::start_with(
        move |c| {
            c.listeners.mqtts = any_port();
            c.listeners.stomps = any_port();
            c.listeners.amqps = any_port();
            c.listeners.wss = any_port();
            c.security.anonymous = false;
            c.tls = tls;
        },
        access,
    )
    .await;
    let alice = tokio_rustls::TlsConnector::from(pki.client_config_as("alice"));
    let bob = tokio_rustls::TlsConnector::from(pki.client_config_as("bob"));
    let mallory = tokio_rustls::TlsConnector::from(pki.client_config_as("mallory"));
    let nobody = pki.connector();
    let mqtts = broker.addr(ListenerKind::Mqtts);

    // MQTT: alice works without credentials, over TLS and over wss.
    mqtt_round_trip(open(mqtts, Some(&alice), Wire::Raw).await, "cert-alice").await;
    let wss = broker.addr(ListenerKind::Wss);
    mqtt_round_trip(open(wss, Some(&alice), MQTT_WS).await, "cert-alice-wss").await;
    // bob is bob: connected, but refused a topic outside bob/#.
    let mut io = open(mqtts, Some(&bob), Wire::Raw).await;
    assert_eq!(
        mqtt_connack(&mut io, "cert-bob").await,
        vec![0, 0],
        "bob CONNACK"
    );
    let mut subscribe = vec![0, 1];
    mqtt_str(&mut subscribe, "transports/not-bob");
    subscribe.push(1);
    io.write_all(&mqtt_packet(0x82, &subscribe))
        .await
        .expect("SUBSCRIBE");
    assert_eq!(
        mqtt_read(&mut io).await,
        (0x90, vec![0, 1, 0x80]),
        "bob SUBACK"
    );
    // Not in the users file: like a bad password (3.1.1 code 4); no
    // certificate and no credentials: not authorized (5).
    let mut io = open(mqtts, Some(&mallory), Wire::Raw).await;
    assert_eq!(mqtt_connack(&mut io, "cert-mallory").await, vec![0, 4]);
    let mut io = open(mqtts, Some(&nobody), Wire::Raw).await;
    assert_eq!(mqtt_connack(&mut io, "cert-none").await, vec![0, 5]);

    // STOMP: alice without login; mallory gets an ERROR frame.
    let stomps = broker.addr(ListenerKind::Stomps);
    stomp_round_trip(open(stomps, Some(&alice), Wire::Raw).await, "cert-alice").await;
    let mut io = open(stomps, Some(&mallory), Wire::Raw).await;
    io.write_all(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0")
        .await
        .expect("CONNECT");
    let error = stomp_read(&mut io, &mut Vec::new()).await;
    assert!(error.starts_with("ERROR\n"), "{error}");

    // AMQP: alice skips SASL (fe2o3 without a SASL profile) and is served;
    // SASL EXTERNAL is offered first and succeeds for alice, fails for mallory.
    let amqps = broker.addr(ListenerKind::Amqps);
    amqp_round_trip(open(amqps, Some(&alice), Wire::Raw).await, "cert-alice").await;
    let mut io = open(amqps, Some(&alice), Wire::Raw).await;
    let (mechanisms, code) = amqp_sasl_external(&mut io).await;
    let external = mechanisms
        .windows(8)
        .position(|w| w == b"EXTERNAL")
        .expect("EXTERNAL offered");
    let plain = mechanisms
        .windows(5)
        .position(|w| w == b"PLAIN")
        .expect("PLAIN offered");
    assert!(external < plain, "EXTERNAL is offered first");
    assert_eq!(code, 0, "alice's EXTERNAL outcome is ok");
    let mut io = open(amqps, Some(&mallory), Wire::Raw).await;
    assert_eq!(
        amqp_sasl_external(&mut io).await.1,
        1,
        "mallory: auth failure"
    );
    broker.stop().await;
}

/// `GET /metrics` on the HTTP port: the Prometheus exposition, with the
/// depth of a queue a STOMP client just filled; off when configured off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_on_the_http_port() {
    let broker = TestBroker::start_with(
        |c| c.listeners.websocket = any_port(),
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let mut stomp = common::stomp::StompClient::connect(broker.stomp(), &[]).await;
    for body in [&b"one"[..], b"two"] {
        stomp.send_persistent("/queue/metered", &[], body).await;
    }
    let http = broker.addr(ListenerKind::WebSocket);
    let response = send_and_drain(http, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let text = String::from_utf8_lossy(&response);
    assert_eq!(status_line(&response), "HTTP/1.1 200 OK", "{text}");
    assert!(
        text.contains("Content-Type: text/plain; version=0.0.4"),
        "{text}"
    );
    assert!(
        text.contains("\nrosetta_queue_depth{queue=\"metered\"} 2\n"),
        "{text}"
    );
    assert!(text.contains("\nrosetta_connections "), "{text}");
    assert!(text.contains("\nrosetta_journal_syncs_total "), "{text}");
    stomp.disconnect().await;
    broker.stop().await;

    let broker = TestBroker::start_with(
        |c| {
            c.listeners.websocket = any_port();
            c.websocket.metrics = false;
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let http = broker.addr(ListenerKind::WebSocket);
    let response = send_and_drain(http, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status_line(&response), "HTTP/1.1 404 Not Found");
    broker.stop().await;
}

// --- bad input ---------------------------------------------------------------

/// Sends `request` and returns everything the broker writes until it closes.
async fn send_and_drain(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let _ = tcp.write_all(request).await;
    drain(&mut tcp).await
}

async fn drain<S: AsyncRead + Unpin>(io: &mut S) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        loop {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the broker closes the connection");
    got
}

fn status_line(response: &[u8]) -> String {
    let text = String::from_utf8_lossy(response);
    text.lines().next().unwrap_or_default().to_owned()
}

const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// A raw upgrade to MQTT over WebSocket; returns the socket after the 101.
async fn raw_upgrade(addr: SocketAddr) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).await.expect("upgrade");
    let mut head = Vec::new();
    tokio::time::timeout(WAIT, async {
        while !head.ends_with(b"\r\n\r\n") {
            head.push(tcp.read_u8().await.expect("response head"));
        }
    })
    .await
    .expect("101 in time");
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", status_line(&head));
    tcp
}

/// A masked client frame header for a payload of `len` bytes.
fn frame_head(opcode: u8, len: u64) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    if len < 126 {
        out.push(0x80 | len as u8);
    } else if len <= u64::from(u16::MAX) {
        out.push(0x80 | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&len.to_be_bytes());
    }
    out.extend_from_slice(&[0, 0, 0, 0]); // mask key 0: payload unchanged
    out
}

/// The status code of the close frame the broker sent, if any.
fn close_code(bytes: &[u8]) -> Option<u16> {
    match bytes {
        [0x88, len, hi, lo, ..] if *len >= 2 => Some(u16::from_be_bytes([*hi, *lo])),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_harms_no_one_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(&pki, false).await;
    let tls = pki.connector();
    let ws = broker.addr(ListenerKind::WebSocket);
    let mqtts = broker.addr(ListenerKind::Mqtts);

    // A connection that stays open through all of it.
    let mut survivor = open(ws, None, MQTT_WS).await;
    let mut connect = Vec::new();
    mqtt_str(&mut connect, "MQTT");
    connect.extend_from_slice(&[4, 0x02, 0, 60]);
    mqtt_str(&mut connect, "survivor");
    survivor
        .write_all(&mqtt_packet(0x10, &connect))
        .await
        .expect("CONNECT");
    assert_eq!(mqtt_read(&mut survivor).await, (0x20, vec![0, 0]));

    // Bad upgrade: no Sec-WebSocket-Key.
    let response = send_and_drain(
        ws,
        b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n",
    )
    .await;
    assert_eq!(status_line(&response), "HTTP/1.1 400 Bad Request");
    // Not HTTP at all.
    let response = send_and_drain(ws, b"HELLO?\r\n\r\n").await;
    assert!(
        status_line(&response).starts_with("HTTP/1.1 400"),
        "{response:?}"
    );
    // Wrong subprotocol on a path that does not choose one.
    let response = send_and_drain(
        ws,
        format!("GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: chat\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(status_line(&response), "HTTP/1.1 400 Bad Request");
    let mut request = format!("ws://{ws}/")
        .into_client_request()
        .expect("request");
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "xmpp".parse().expect("value"));
    let tcp = TcpStream::connect(ws).await.expect("connect");
    match tokio_tungstenite::client_async(request, tcp).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 400),
        other => panic!("wrong subprotocol accepted: {:?}", other.map(|(_, r)| r)),
    }

    // An Origin outside the allow-list is refused; the listed one is served.
    let upgrade_from = |origin: &str| {
        format!("GET /mqtt HTTP/1.1\r\nHost: localhost\r\nOrigin: {origin}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")
    };
    let response = send_and_drain(ws, upgrade_from("http://evil.example").as_bytes()).await;
    assert_eq!(status_line(&response), "HTTP/1.1 403 Forbidden");
    let mut tcp = TcpStream::connect(ws).await.expect("connect");
    tcp.write_all(upgrade_from(ALLOWED_ORIGIN).as_bytes())
        .await
        .expect("upgrade");
    let mut head = [0u8; 12];
    tokio::time::timeout(WAIT, tcp.read_exact(&mut head))
        .await
        .expect("answer in time")
        .expect("status line");
    assert_eq!(&head, b"HTTP/1.1 101");
    drop(tcp);

    // Oversized frame: the header alone says too much; close 1009.
    let mut tcp = raw_upgrade(ws).await;
    let mut frame = frame_head(2, WS_MESSAGE_MAX_BYTES as u64 + 1);
    frame.extend(std::iter::repeat_n(0u8, 1024));
    let _ = tcp.write_all(&frame).await;
    let reply = drain(&mut tcp).await;
    assert_eq!(close_code(&reply), Some(1009), "{reply:?}");

    // A text frame that is not UTF-8: close 1007.
    let mut tcp = raw_upgrade(ws).await;
    let mut frame = frame_head(1, 2);
    frame.extend_from_slice(&[0xff, 0xfe]);
    tcp.write_all(&frame).await.expect("frame");
    let reply = drain(&mut tcp).await;
    assert_eq!(close_code(&reply), Some(1007), "{reply:?}");

    // Ping is answered with the same payload.
    let mut tcp = raw_upgrade(ws).await;
    let mut frame = frame_head(9, 4);
    frame.extend_from_slice(b"ping");
    tcp.write_all(&frame).await.expect("ping");
    let mut pong = [0u8; 6];
    tokio::time::timeout(WAIT, tcp.read_exact(&mut pong))
        .await
        .expect("pong in time")
        .expect("pong");
    assert_eq!(&pong, b"\x8a\x04ping");

    // A TLS ClientHello record full of garbage, on MQTTS and on WSS.
    let garbage = b"\x16\x03\x01\x00\x20this is not a TLS ClientHello...";
    for addr in [mqtts, broker.addr(ListenerKind::Wss)] {
        let reply = send_and_drain(addr, garbage).await;
        // Nothing, or a TLS alert record (content type 21).
        assert!(reply.is_empty() || reply[0] == 0x15, "{reply:?}");
    }
    // A plain-text client on TLS ports: MQTT CONNECT, STOMP CONNECT, HTTP.
    let plain_mqtt = mqtt_packet(0x10, &connect);
    for (addr, bytes) in [
        (mqtts, plain_mqtt.as_slice()),
        (
            broker.addr(ListenerKind::Stomps),
            b"CONNECT\naccept-version:1.2\n\n\0".as_slice(),
        ),
        (
            broker.addr(ListenerKind::Wss),
            b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n".as_slice(),
        ),
    ] {
        let reply = send_and_drain(addr, bytes).await;
        assert!(
            reply.is_empty() || reply[0] == 0x15,
            "plain text answered on a TLS port: {reply:?}"
        );
    }

    // New connections over every transport still work ...
    mqtt_round_trip(open(ws, None, MQTT_WS).await, "after-ws").await;
    mqtt_round_trip(open(mqtts, Some(&tls), Wire::Raw).await, "after-tls").await;
    // ... and so does the one that was open all along.
    survivor.write_all(&[0xc0, 0]).await.expect("PINGREQ");
    assert_eq!(mqtt_read(&mut survivor).await, (0xd0, vec![]), "PINGRESP");
    broker.stop().await;
}

/// Reads the broker's frames until a data frame and returns its payload,
/// skipping pongs; `None` when the broker closes instead (a close frame or
/// the end of the stream).
async fn next_data_payload(tcp: &mut TcpStream) -> Option<Vec<u8>> {
    tokio::time::timeout(WAIT, async {
        loop {
            let mut head = [0u8; 2];
            tcp.read_exact(&mut head).await.ok()?;
            let len = match head[1] & 0x7f {
                126 => usize::from(tcp.read_u16().await.ok()?),
                127 => usize::try_from(tcp.read_u64().await.ok()?).ok()?,
                n => usize::from(n),
            };
            let mut payload = vec![0u8; len];
            tcp.read_exact(&mut payload).await.ok()?;
            match head[0] & 0x0f {
                0x8 => return None,
                0x9 | 0xa => continue,
                _ => return Some(payload),
            }
        }
    })
    .await
    .expect("a frame or the close in time")
}

/// Control frames may come at any time, in any number (RFC 6455, 5.4/5.5):
/// a burst of pings before the first packet is answered and the packet
/// after it still arrives. (Finding 3 of protocols/FUZZING.md: a read that
/// met 256 control frames and no data returned zero bytes, which the
/// adapters took for the end of the stream, and the broker closed the
/// connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_pings_before_a_packet_keeps_the_connection() {
    /// Well past the 256 messages one read of the byte stream gathers.
    const PINGS: usize = 1_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(&pki, false).await;
    let mut tcp = raw_upgrade(broker.addr(ListenerKind::WebSocket)).await;
    let mut connect = Vec::new();
    mqtt_str(&mut connect, "MQTT");
    connect.extend_from_slice(&[4, 0x02, 0, 60]);
    mqtt_str(&mut connect, "after-pings");
    let packet = mqtt_packet(0x10, &connect);
    // One write, so the broker finds every ping already there.
    let mut bytes = Vec::new();
    for _ in 0..PINGS {
        bytes.extend_from_slice(&frame_head(0x9, 0));
    }
    bytes.extend_from_slice(&frame_head(0x2, packet.len() as u64));
    bytes.extend_from_slice(&packet);
    tcp.write_all(&bytes).await.expect("pings and CONNECT");
    assert_eq!(
        next_data_payload(&mut tcp).await,
        Some(vec![0x20, 2, 0, 0]),
        "CONNACK after {PINGS} pings"
    );
    broker.stop().await;
}
