//! Operations: the shutdown grace period, connection admission (caps on
//! connections that have not authenticated yet) and the metrics listener,
//! over real sockets with real clients.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mqtt::{p4, Raw, WAIT};
use common::process::{BrokerProcess, MqttWire};
use common::stomp::StompClient;
use common::{http_get, TestBroker};
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::Connection;
use rosetta::core::AllowAll;
use rumqttc::v5::mqttbytes::v5 as p5;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

/// Payload of each message that fills a subscriber's socket.
const BIG_MESSAGE_BYTES: usize = 512 * 1024;
/// Messages published at a subscriber that does not read: far more than
/// the loopback socket buffers on both sides hold (a few MiB each).
const BIG_MESSAGES: usize = 64;
/// What `shutdown_grace_ms` was stuck at before it was honoured.
const OLD_GRACE_CONSTANT: Duration = Duration::from_secs(5);
/// Slack for the shutdown's own steps (accept loops, journal flush).
const SHUTDOWN_SLACK: Duration = Duration::from_millis(1500);

/// A subscriber that stops reading while a publisher fills its socket, so
/// the broker cannot write its goodbye: the shutdown must wait exactly the
/// configured grace, then cut it.
async fn shutdown_with_a_stuck_subscriber(grace_ms: u64) -> Duration {
    let broker = TestBroker::start_with(
        |c| c.broker.shutdown_grace_ms = grace_ms,
        Arc::new(AllowAll),
    )
    .await;
    let (mut stuck, ack) = Raw::connect4(broker.mqtt(), "stuck", true, 0).await;
    assert_eq!(ack.code, p4::ConnectReturnCode::Success);
    let mut subscribe = p4::Subscribe::new("fill/#", rumqttc::QoS::AtMostOnce);
    subscribe.pkid = 1;
    stuck.send4(p4::Packet::Subscribe(subscribe)).await;
    assert!(matches!(stuck.recv4().await, p4::Packet::SubAck(_)));

    let (mut publisher, ack) = Raw::connect4(broker.mqtt(), "filler", true, 0).await;
    assert_eq!(ack.code, p4::ConnectReturnCode::Success);
    let payload = vec![b'x'; BIG_MESSAGE_BYTES];
    for _ in 0..BIG_MESSAGES {
        let publish = p4::Publish::new("fill/it", rumqttc::QoS::AtMostOnce, payload.clone());
        publisher.send4(p4::Packet::Publish(publish)).await;
    }
    // The publisher's last bytes are routed once it is answered.
    publisher.send4(p4::Packet::PingReq).await;
    assert!(matches!(publisher.recv4().await, p4::Packet::PingResp));
    publisher.shutdown().await;

    let started = Instant::now();
    broker.stop().await;
    let took = started.elapsed();
    drop(stuck);
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_the_configured_grace_for_a_client_that_does_not_read() {
    for grace_ms in [300, 1200] {
        let grace = Duration::from_millis(grace_ms);
        let took = shutdown_with_a_stuck_subscriber(grace_ms).await;
        assert!(
            took >= grace,
            "grace {grace_ms} ms: shutdown took {took:?}, so the subscriber was not stuck"
        );
        assert!(
            took < grace + SHUTDOWN_SLACK && took < OLD_GRACE_CONSTANT,
            "grace {grace_ms} ms: shutdown took {took:?}"
        );
    }
}

// ---- admission -------------------------------------------------------------

/// The address idle sockets come from in these tests: another loopback
/// address than the real clients' 127.0.0.1, so the per-address cap of the
/// idle ones does not apply to the real clients.
const IDLE_SOURCE: [u8; 4] = [127, 0, 0, 2];

/// A TCP connection to `to` from [`IDLE_SOURCE`] that sends nothing.
async fn idle_socket(to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((IDLE_SOURCE, 0)))
        .expect("bind 127.0.0.2");
    socket.connect(to).await.expect("connect")
}

/// Opens `n` idle sockets and waits until the broker counts them all as
/// unauthenticated.
async fn idle_sockets(broker: &TestBroker, to: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut sockets = Vec::with_capacity(n);
    for _ in 0..n {
        sockets.push(idle_socket(to).await);
    }
    let deadline = Instant::now() + WAIT;
    while unauthenticated(broker) < n {
        assert!(
            Instant::now() < deadline,
            "the broker did not count {n} idle sockets"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sockets
}

fn metric(broker: &TestBroker, name: &str) -> f64 {
    let text = broker.metrics();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in the metrics:\n{text}"))
}

fn unauthenticated(broker: &TestBroker) -> usize {
    metric(broker, "rosetta_connections_unauthenticated") as usize
}

/// A real MQTT 3.1.1 client (rumqttc) connects; returns the CONNACK code
/// and the client, which stays connected while it is kept.
async fn rumqttc_connects(
    broker: &TestBroker,
    id: &str,
) -> (rumqttc::ConnectReturnCode, rumqttc::EventLoop) {
    let (_client, mut ev) = common::mqtt::client4(broker, id, true);
    loop {
        match tokio::time::timeout(WAIT, ev.poll())
            .await
            .expect("rumqttc in time")
        {
            Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(ack))) => return (ack.code, ev),
            Ok(_) => {}
            Err(rumqttc::ConnectionError::ConnectionRefused(code)) => return (code, ev),
            Err(e) => panic!("rumqttc: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_unauthenticated_sockets_do_not_lock_out_clients_that_log_in() {
    // Three clients may be logged in; twenty idle sockets are no reason
    // to refuse any of them.
    let broker = TestBroker::start_with(
        |c| {
            c.broker.connections_max = 3;
            c.broker.unauthenticated_connections_max = 64;
            c.broker.unauthenticated_per_address_max = 32;
        },
        Arc::new(AllowAll),
    )
    .await;
    let _idle = idle_sockets(&broker, broker.mqtt(), 20).await;

    let (code, _mqtt) = rumqttc_connects(&broker, "real-mqtt").await;
    assert_eq!(code, rumqttc::ConnectReturnCode::Success);
    let _stomp = StompClient::connect(broker.stomp(), &[]).await;
    let amqp = common::amqp::connect(&broker, "real-amqp").await;
    assert_eq!(metric(&broker, "rosetta_connections_authenticated"), 3.0);
    assert_eq!(unauthenticated(&broker), 20);

    // The authenticated ones have their cap: a fourth is told the broker
    // is busy (MQTT 5: CONNACK 0x89 with a reason string).
    let (_raw, ack) = Raw::connect5_clean(broker.mqtt(), "fourth", None).await;
    assert_eq!(ack.code, p5::ConnectReturnCode::ServerBusy, "{ack:?}");
    let why = ack.properties.and_then(|p| p.reason_string);
    assert!(why.is_some_and(|w| w.contains("busy")), "reason string");
    drop(amqp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_address_cap_refuses_the_next_connection_with_the_protocols_reason() {
    const PER_ADDRESS: usize = 4;
    let broker = TestBroker::start_with(
        |c| c.broker.unauthenticated_per_address_max = PER_ADDRESS as u32,
        Arc::new(AllowAll),
    )
    .await;
    let _idle = idle_sockets(&broker, broker.stomp(), PER_ADDRESS).await;

    // MQTT 3.1.1: CONNACK 3, "server unavailable".
    let mut raw = Raw::from_stream(idle_socket(broker.mqtt()).await);
    raw.send4(p4::Packet::Connect(p4::Connect::new("over-4")))
        .await;
    match raw.recv4().await {
        p4::Packet::ConnAck(ack) => {
            assert_eq!(ack.code, p4::ConnectReturnCode::ServiceUnavailable)
        }
        other => panic!("expected CONNACK, got {other:?}"),
    }
    // MQTT 5: CONNACK 0x9F, "connection rate exceeded", saying why.
    let mut raw = Raw::from_stream(idle_socket(broker.mqtt()).await);
    raw.send5(p5::Packet::Connect(
        common::mqtt::connect5_packet("over-5", true, None),
        None,
        None,
    ))
    .await;
    match raw.recv5().await {
        p5::Packet::ConnAck(ack) => {
            assert_eq!(ack.code, p5::ConnectReturnCode::ConnectionRateExceeded);
            let why = ack.properties.and_then(|p| p.reason_string);
            assert!(why.is_some_and(|w| w.contains("your address")));
        }
        other => panic!("expected CONNACK, got {other:?}"),
    }
    // STOMP: an ERROR frame, then the close.
    let mut stomp = StompClient::from_stream(idle_socket(broker.stomp()).await);
    let error = stomp.handshake("1.2", &[]).await;
    assert_eq!(error.command, "ERROR", "{error:?}");
    assert!(error
        .header("message")
        .is_some_and(|m| m.contains("your address")));
    // AMQP, plain and over SASL: fe2o3-amqp sees the refusal.
    // The refusal is an Open followed by a Close: fe2o3-amqp returns the
    // connection, and the Close's error comes with the next step.
    let plain = match Connection::builder()
        .container_id("over-amqp")
        .open_with_stream(idle_socket(broker.amqp()).await)
        .await
    {
        Err(e) => Some(format!("{e:?}")),
        Ok(mut conn) => conn.close().await.err().map(|e| format!("{e:?}")),
    };
    assert!(
        plain
            .as_deref()
            .is_some_and(|e| e.contains("ResourceLimitExceeded") && e.contains("your address")),
        "{plain:?}"
    );
    let sasl = Connection::builder()
        .container_id("over-amqp-sasl")
        .sasl_profile(SaslProfile::Plain {
            username: "u".into(),
            password: "p".into(),
        })
        .open_with_stream(idle_socket(broker.amqp()).await)
        .await
        .err()
        .map(|e| format!("{e:?}"));
    assert!(
        sasl.as_deref().is_some_and(|e| e.contains("SysTemp")),
        "{sasl:?}"
    );

    // Another address is not affected: real clients log in.
    let (code, _mqtt) = rumqttc_connects(&broker, "other-address").await;
    assert_eq!(code, rumqttc::ConnectReturnCode::Success);
    let _amqp = common::amqp::connect(&broker, "other-address").await;
    assert!(metric(&broker, "rosetta_connections_refused_total") >= 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_still_unauthenticated_after_connect_timeout_ms_is_closed() {
    // The HTTP upgrade has a 10 s timeout of its own; the deadline counts
    // from accept and covers it.
    let broker = TestBroker::start_with(
        |c| {
            c.broker.connect_timeout_ms = 200;
            c.listeners.websocket = Some(rosetta::config::ListenAddr::new("127.0.0.1", 0));
        },
        Arc::new(AllowAll),
    )
    .await;
    let mut silent = TcpStream::connect(broker.addr(rosetta::config::ListenerKind::WebSocket))
        .await
        .expect("connect");
    let started = Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "still open after 5 s");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "closed after {took:?}, not at the deadline"
    );
    assert_eq!(unauthenticated(&broker), 0);
}

// ---- metrics listener ------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_have_a_listener_of_their_own() {
    let broker = TestBroker::start_with(
        |c| c.listeners.metrics = Some(rosetta::config::ListenAddr::new("127.0.0.1", 0)),
        Arc::new(AllowAll),
    )
    .await;
    let addr = broker.addr(rosetta::config::ListenerKind::Metrics);
    let metrics = http_get(addr, "/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200 "), "{metrics}");
    assert!(
        metrics.contains("\nrosetta_connections_authenticated 0\n"),
        "{metrics}"
    );
    for (path, status) in [("/", "404"), ("/mqtt", "404")] {
        let answer = http_get(addr, path).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{path}: {answer}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_client_over_a_cap_gets_503() {
    let broker = TestBroker::start_with(
        |c| {
            c.broker.unauthenticated_per_address_max = 1;
            c.listeners.websocket = Some(rosetta::config::ListenAddr::new("127.0.0.1", 0));
        },
        Arc::new(AllowAll),
    )
    .await;
    let ws = broker.addr(rosetta::config::ListenerKind::WebSocket);
    let _idle = idle_sockets(&broker, ws, 1).await;
    let mut over = idle_socket(ws).await;
    use tokio::io::AsyncWriteExt;
    over.write_all(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, over.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    assert!(answer.contains("Retry-After: 1\r\n"), "{answer}");
}

/// The soft file-descriptor limit the broker is started with in
/// [`the_broker_raises_its_soft_fd_limit_to_the_hard_one`]: a service
/// manager's or shell's usual default is 1,024; lower keeps the test short.
const LOW_SOFT_NOFILE: u64 = 512;
/// More connections than [`LOW_SOFT_NOFILE`] descriptors allow.
const CONNECTIONS_PAST_LOW_LIMIT: usize = 600;

/// `Max open files` of `/proc/<pid>/limits`: (soft, hard).
fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files line");
    let mut fields = line["Max open files".len()..].split_whitespace();
    let soft = fields.next().expect("soft").to_owned();
    let hard = fields.next().expect("hard").to_owned();
    (soft, hard)
}

/// Started with a soft `RLIMIT_NOFILE` of 512, the broker raises it to the
/// hard limit, says so in its log, and takes more than 512 connections.
#[test]
fn the_broker_raises_its_soft_fd_limit_to_the_hard_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker =
        BrokerProcess::start_with_fd_limit(dir.path(), &["mqtt"], "", Some(LOW_SOFT_NOFILE));
    let (soft, hard) = open_files_limits(broker.child.id());
    assert_eq!(soft, hard, "soft limit raised to the hard one");
    let logged = broker.log_lines_with("file descriptor limit");
    assert!(
        logged.iter().any(
            |l| l.contains(&format!("soft_before=Some({LOW_SOFT_NOFILE})"))
                && l.contains(&format!("hard=Some({hard})"))
        ),
        "log line with both limits: {logged:?}"
    );
    let addr = broker.addr("mqtt");
    let mut open = Vec::with_capacity(CONNECTIONS_PAST_LOW_LIMIT);
    for i in 0..CONNECTIONS_PAST_LOW_LIMIT {
        match MqttWire::connect(addr, &format!("fd-{i}")) {
            Ok(c) => open.push(c),
            Err(e) => panic!("connection {i} of {CONNECTIONS_PAST_LOW_LIMIT} failed: {e}"),
        }
    }
    assert_eq!(open.len(), CONNECTIONS_PAST_LOW_LIMIT);
}
