//! STOMP CONNECT/STOMP over real sockets: version negotiation, the
//! CONNECTED headers, login against a users file, and heart-beating in
//! both directions.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::stomp::StompClient;
use common::{Account, TestBroker};

async fn negotiated(broker: &TestBroker, command: &str, accept: Option<&str>) -> Frame {
    let mut c = StompClient::connect_raw(broker.stomp()).await;
    let mut h = vec![("host", "localhost")];
    if let Some(a) = accept {
        h.push(("accept-version", a));
    }
    c.send_frame(command, &h, b"").await;
    c.recv().await.expect("answer")
}

use common::stomp::Frame;

#[tokio::test]
async fn version_negotiation() {
    let broker = TestBroker::start().await;
    for (command, accept, want) in [
        ("CONNECT", None, None),
        ("CONNECT", Some("1.0"), Some("1.0")),
        ("CONNECT", Some("1.0,1.1"), Some("1.1")),
        ("CONNECT", Some("1.1,1.2"), Some("1.2")),
        ("CONNECT", Some("1.2,1.0"), Some("1.2")),
        ("STOMP", Some("1.2"), Some("1.2")),
        ("STOMP", Some("1.1"), Some("1.1")),
        ("CONNECT", Some("1.1,9.9"), Some("1.1")),
    ] {
        let f = negotiated(&broker, command, accept).await;
        assert_eq!(f.command, "CONNECTED", "{command} {accept:?}: {f:?}");
        match want {
            // Without accept-version the server speaks 1.0, whose
            // CONNECTED has no version header (1.0 is also fine).
            None => assert!(matches!(f.header("version"), None | Some("1.0")), "{f:?}"),
            Some("1.0") => assert!(matches!(f.header("version"), None | Some("1.0")), "{f:?}"),
            Some(v) => assert_eq!(f.header("version"), Some(v), "{command} {accept:?}"),
        }
    }
    // No common version: ERROR naming the versions we speak, then close.
    let mut c = StompClient::connect_raw(broker.stomp()).await;
    let f = c.handshake("2.0,3.1", &[]).await;
    assert_eq!(f.command, "ERROR", "{f:?}");
    assert_eq!(f.header("message"), Some("unsupported protocol version"));
    assert_eq!(f.header("version"), Some("1.0,1.1,1.2"));
    c.expect_closed().await;
    broker.stop().await;
}

#[tokio::test]
async fn connected_headers_and_host() {
    let broker = TestBroker::start().await;
    let (_a, f) = StompClient::connect_version(
        broker.stomp(),
        "1.2",
        &[("host", "some-virtual-host"), ("heart-beat", "0,0")],
    )
    .await;
    assert_eq!(f.header("version"), Some("1.2"));
    assert!(
        f.header("server")
            .is_some_and(|s| s.starts_with("Rosetta/")),
        "{f:?}"
    );
    assert_eq!(f.header("heart-beat"), Some("0,0"));
    let session_a = f.header("session").expect("session").to_owned();
    let (_b, g) = StompClient::connect_version(broker.stomp(), "1.1", &[]).await;
    let session_b = g.header("session").expect("session").to_owned();
    assert!(!session_a.is_empty());
    assert_ne!(
        session_a, session_b,
        "each connection has its own session id"
    );
    assert!(g.header("heart-beat").is_some());
    broker.stop().await;
}

/// A broker whose users file holds alice (everything) and bob (may only
/// publish to /queue/bob), with anonymous access as given.
async fn broker_with_users(anonymous: bool) -> TestBroker {
    TestBroker::with_users(
        anonymous,
        &[
            Account::unrestricted("alice", b"s3cret"),
            Account::limited(
                "bob",
                b"hunter2",
                &["/queue/bob"],
                &["/queue/bob", "/topic/bob/#"],
            ),
        ],
    )
    .await
}

#[tokio::test]
async fn login_and_passcode_against_the_users_file() {
    let broker = broker_with_users(false).await;
    let (mut alice, _) = StompClient::connect_version(
        broker.stomp(),
        "1.2",
        &[("login", "alice"), ("passcode", "s3cret")],
    )
    .await;
    alice.send_persistent("/queue/any", &[], b"ok").await;

    for creds in [
        vec![("login", "alice"), ("passcode", "wrong")],
        vec![("login", "mallory"), ("passcode", "s3cret")],
        vec![("login", "alice")],
        // Anonymous is switched off.
        vec![],
    ] {
        let mut c = StompClient::connect_raw(broker.stomp()).await;
        let f = c.handshake("1.2", &creds).await;
        assert_eq!(f.command, "ERROR", "{creds:?}: {f:?}");
        assert_eq!(f.header("message"), Some("authentication failed"));
        assert!(!f.body.is_empty());
        c.expect_closed().await;
    }
    // Same for 1.0 (no accept-version).
    let mut c = StompClient::connect_raw(broker.stomp()).await;
    let f = c
        .handshake("", &[("login", "alice"), ("passcode", "nope")])
        .await;
    assert_eq!(f.command, "ERROR", "{f:?}");
    c.expect_closed().await;

    // bob may publish to /queue/bob only: anything else is an ERROR.
    let (mut bob, _) = StompClient::connect_version(
        broker.stomp(),
        "1.2",
        &[("login", "bob"), ("passcode", "hunter2")],
    )
    .await;
    bob.send_persistent("/queue/bob", &[], b"mine").await;
    bob.send_frame(
        "SEND",
        &[("destination", "/queue/alice"), ("receipt", "r-denied")],
        b"x",
    )
    .await;
    let err = bob.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("not authorized"), "{err:?}");
    assert_eq!(err.header("receipt-id"), Some("r-denied"));
    assert_eq!(broker.core().queue_stats("bob").map(|s| s.depth), Some(1));
    // alice was not disturbed.
    alice.send_persistent("/queue/any", &[], b"still ok").await;

    // bob may consume /queue/bob and /topic/bob/#, nothing else.
    let (mut bob, _) = StompClient::connect_version(
        broker.stomp(),
        "1.2",
        &[("login", "bob"), ("passcode", "hunter2")],
    )
    .await;
    bob.subscribe("q", "/queue/bob", "client-individual", &[])
        .await;
    let m = bob.message().await;
    assert_eq!(m.text(), "mine");
    bob.ack(&m).await;
    // A durable subscription keyed by the login (no client-id).
    bob.subscribe(
        "t",
        "/topic/bob/news",
        "auto",
        &[("activemq.subscriptionName", "by-login")],
    )
    .await;
    bob.disconnect().await;
    alice
        .send_persistent("/topic/bob/news", &[], b"for bob")
        .await;
    let (mut bob, _) = StompClient::connect_version(
        broker.stomp(),
        "1.2",
        &[("login", "bob"), ("passcode", "hunter2")],
    )
    .await;
    bob.subscribe(
        "t",
        "/topic/bob/news",
        "auto",
        &[("activemq.subscriptionName", "by-login")],
    )
    .await;
    assert_eq!(bob.message().await.text(), "for bob");
    bob.send_frame(
        "SUBSCRIBE",
        &[
            ("id", "x"),
            ("destination", "/topic/#"),
            ("receipt", "r-sub"),
        ],
        b"",
    )
    .await;
    let err = bob.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("not authorized"), "{err:?}");
    assert_eq!(err.header("receipt-id"), Some("r-sub"));
    broker.stop().await;
}

/// Frames a client sends in the same write as a CONNECT whose passcode is
/// being checked wait, in the parse buffer the broker reads into, until
/// CONNECTED, and are then handled in order.
#[tokio::test]
async fn frames_behind_a_checked_connect_are_handled_after_connected() {
    let broker = broker_with_users(false).await;
    let mut c = StompClient::connect_raw(broker.stomp()).await;
    let mut bytes = common::stomp::encode(
        "CONNECT",
        &[
            ("host", "localhost"),
            ("accept-version", "1.2"),
            ("login", "alice"),
            ("passcode", "s3cret"),
        ],
        b"",
    );
    for i in 0..3 {
        let body = format!("m{i}");
        bytes.extend_from_slice(&common::stomp::encode(
            "SEND",
            &[
                ("destination", "/queue/behind"),
                ("persistent", "true"),
                ("receipt", &format!("r{i}")),
            ],
            body.as_bytes(),
        ));
    }
    c.send_raw(&bytes).await;
    let f = c.recv().await.expect("CONNECTED");
    assert_eq!(f.command, "CONNECTED", "{f:?}");
    for i in 0..3 {
        c.expect_receipt(&format!("r{i}")).await;
    }
    assert_eq!(
        broker.core().queue_stats("behind").map(|s| s.depth),
        Some(3)
    );
    broker.stop().await;
}

#[tokio::test]
async fn anonymous_clients_when_allowed() {
    let broker = broker_with_users(true).await;
    let (mut anon, _) = StompClient::connect_version(broker.stomp(), "1.2", &[]).await;
    anon.send_persistent("/queue/anon", &[], b"hi").await;
    // Credentials are still checked when given.
    let mut c = StompClient::connect_raw(broker.stomp()).await;
    let f = c
        .handshake("1.2", &[("login", "alice"), ("passcode", "bad")])
        .await;
    assert_eq!(f.command, "ERROR");
    c.expect_closed().await;
    broker.stop().await;
}

/// Heart-beats at 100 ms (the test config lowers the minimum).
async fn fast_heart_beat_broker() -> TestBroker {
    TestBroker::start_with(
        |c| {
            c.stomp.heartbeat_min_ms = 100;
            c.stomp.heartbeat_send_ms = 100;
            c.stomp.heartbeat_receive_ms = 100;
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await
}

#[tokio::test]
async fn server_sends_heart_beats() {
    let broker = fast_heart_beat_broker().await;
    // We cannot send, but want a beat every 100 ms.
    let (mut c, f) =
        StompClient::connect_version(broker.stomp(), "1.2", &[("heart-beat", "0,100")]).await;
    assert_eq!(f.header("heart-beat"), Some("100,0"));
    assert!(c.recv_within(Duration::from_millis(1000)).await.is_none());
    assert!(
        c.eols >= 5,
        "about 10 heart-beats expected in a second, got {}",
        c.eols
    );
    // We never beat, and the server did not ask us to: still connected.
    c.request("BEGIN", &[("transaction", "t")], b"").await;
    broker.stop().await;
}

#[tokio::test]
async fn client_heart_beats_keep_the_connection_and_silence_ends_it() {
    let broker = fast_heart_beat_broker().await;
    let (mut live, f) =
        StompClient::connect_version(broker.stomp(), "1.2", &[("heart-beat", "100,0")]).await;
    assert_eq!(f.header("heart-beat"), Some("0,100"));
    let (mut silent, _) =
        StompClient::connect_version(broker.stomp(), "1.2", &[("heart-beat", "100,0")]).await;

    // The live client beats every 50 ms for a second: well past the grace
    // period (2 x 100 ms), it is still served.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1000) {
        live.send_raw(b"\n").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    live.request("BEGIN", &[("transaction", "t")], b"").await;

    // The silent one got an ERROR and a close long ago.
    let err = silent.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("heart-beat timeout"), "{err:?}");

    // A client that beats and then stops is closed within the grace period.
    let started = Instant::now();
    let err = live.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("heart-beat timeout"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "closed after {:?}",
        started.elapsed()
    );
    broker.stop().await;
}

/// STOMP 1.0 has no heart-beats: the header is ignored, silence is fine.
#[tokio::test]
async fn no_heart_beats_in_1_0() {
    let broker = fast_heart_beat_broker().await;
    let (mut c, f) =
        StompClient::connect_version(broker.stomp(), "", &[("heart-beat", "100,100")]).await;
    assert_eq!(f.header("heart-beat"), None);
    assert!(c.recv_within(Duration::from_millis(500)).await.is_none());
    assert_eq!(c.eols, 0);
    c.request("BEGIN", &[("transaction", "t")], b"").await;
    broker.stop().await;
}

/// `[broker] connections_max`: a connection beyond it is told the broker
/// is busy (an ERROR frame) and closed; when one leaves, a new one is
/// served again.
#[tokio::test]
async fn connections_beyond_the_limit_are_refused() {
    let broker = TestBroker::start_with(
        |c| c.broker.connections_max = 2,
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let (mut a, _) = StompClient::connect_version(broker.stomp(), "1.2", &[]).await;
    let (b, _) = StompClient::connect_version(broker.stomp(), "1.2", &[]).await;
    let mut c = StompClient::connect_raw(broker.stomp()).await;
    let refused = c.handshake("1.2", &[]).await;
    assert_eq!(refused.command, "ERROR", "{refused:?}");
    assert!(
        refused
            .header("message")
            .is_some_and(|m| m.contains("busy")),
        "{refused:?}"
    );
    c.expect_closed().await;
    a.request("BEGIN", &[("transaction", "t")], b"").await;
    b.disconnect().await;
    // The slot frees once the server has seen the close.
    let mut served = false;
    for _ in 0..50 {
        let mut d = StompClient::connect_raw(broker.stomp()).await;
        if d.try_send_raw(&common::stomp::encode(
            "CONNECT",
            &[("accept-version", "1.2")],
            b"",
        ))
        .await
        {
            match d.recv_within(Duration::from_millis(500)).await {
                // Refused while the server has not yet seen b's close.
                Some(f) if f.command == "ERROR" => {}
                Some(f) => {
                    assert_eq!(f.command, "CONNECTED", "{f:?}");
                    served = true;
                    break;
                }
                None => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "a freed slot is reused");
    broker.stop().await;
}

/// Heart-beats both ways at once: the server beats, and expects beats.
#[tokio::test]
async fn heart_beats_both_ways() {
    let broker = fast_heart_beat_broker().await;
    // Asking for faster than the minimum gets the minimum.
    let (mut c, f) =
        StompClient::connect_version(broker.stomp(), "1.1", &[("heart-beat", "50,50")]).await;
    assert_eq!(f.header("heart-beat"), Some("100,100"));
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(800) {
        c.send_raw(b"\n").await;
        assert!(c.recv_within(Duration::from_millis(50)).await.is_none());
    }
    assert!(c.eols >= 4, "server heart-beats: {}", c.eols);
    c.request("BEGIN", &[("transaction", "t")], b"").await;
    let err = c.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("heart-beat timeout"));
    broker.stop().await;
}
