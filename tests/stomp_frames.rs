//! STOMP frame parsing over real sockets: escaping per version, bodies
//! with and without `content-length`, CRLF, repeated headers, heart-beat
//! EOLs between frames, and frames split across writes or packed together.

mod common;

use std::time::Duration;

use common::stomp::{encode, unescape, StompClient};
use common::TestBroker;

/// 1.2 escapes `\n`, `\c`, `\\` and `\r` both ways; the value round-trips
/// exactly, and a 1.0 consumer sees it unescaped.
#[tokio::test]
async fn header_escaping_in_1_2() {
    let broker = TestBroker::start().await;
    let mut consumer = StompClient::connect(broker.stomp(), &[]).await;
    consumer.subscribe("s", "/queue/esc12", "auto", &[]).await;
    let mut producer = StompClient::connect(broker.stomp(), &[]).await;
    producer
        .send_persistent(
            "/queue/esc12",
            &[(r"x-k\cey", r"line1\nline2\r\c\\end")],
            b"b",
        )
        .await;
    let m = consumer.message().await;
    // The raw wire value is escaped again by the server.
    assert_eq!(m.header(r"x-k\cey"), Some(r"line1\nline2\r\c\\end"));
    assert_eq!(
        unescape(m.header(r"x-k\cey").expect("header")),
        "line1\nline2\r:\\end"
    );
    broker.stop().await;
}

/// Receipt ids are header values like any other: escaped both ways.
#[tokio::test]
async fn receipt_ids_are_escaped() {
    let broker = TestBroker::start().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.send_frame(
        "BEGIN",
        &[("transaction", "t"), ("receipt", r"a\cb\\c")],
        b"",
    )
    .await;
    c.expect_receipt(r"a\cb\\c").await;
    broker.stop().await;
}

/// 1.1 knows `\n`, `\c`, `\\` but not `\r`, which is a fatal bad escape.
#[tokio::test]
async fn header_escaping_in_1_1() {
    let broker = TestBroker::start().await;
    let (mut consumer, connected) = StompClient::connect_version(broker.stomp(), "1.1", &[]).await;
    assert_eq!(connected.header("version"), Some("1.1"));
    consumer.subscribe("s", "/queue/esc11", "auto", &[]).await;
    let (mut producer, _) = StompClient::connect_version(broker.stomp(), "1.1", &[]).await;
    producer
        .send_persistent("/queue/esc11", &[("x-k", r"a\nb\cc\\d")], b"b")
        .await;
    let m = consumer.message().await;
    assert_eq!(m.header("x-k"), Some(r"a\nb\cc\\d"));
    // No `ack` header in 1.1 MESSAGEs.
    assert_eq!(m.header("ack"), None);

    producer
        .send_frame(
            "SEND",
            &[("destination", "/queue/esc11"), ("x-k", r"a\rb")],
            b"b",
        )
        .await;
    let err = producer.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("malformed frame"), "{err:?}");
    broker.stop().await;
}

/// 1.0 has no escapes: a backslash is just a byte, both ways. A 1.2
/// consumer of the same message sees it escaped.
#[tokio::test]
async fn no_header_escaping_in_1_0() {
    let broker = TestBroker::start().await;
    let (mut c10, connected) = StompClient::connect_version(broker.stomp(), "", &[]).await;
    // A 1.0 CONNECTED has no version header (or says 1.0).
    assert!(matches!(connected.header("version"), None | Some("1.0")));
    c10.request(
        "SUBSCRIBE",
        &[("destination", "/queue/esc10"), ("id", "s10")],
        b"",
    )
    .await;
    let mut c12 = StompClient::connect(broker.stomp(), &[]).await;
    c12.subscribe("s12", "/topic/esc10", "auto", &[]).await;
    let (mut producer, _) = StompClient::connect_version(broker.stomp(), "1.0", &[]).await;
    producer
        .send_persistent("/queue/esc10", &[("x-k", r"a\nb\q")], b"b")
        .await;
    let m = c10.message().await;
    assert_eq!(m.header("x-k"), Some(r"a\nb\q"));
    producer
        .request(
            "SEND",
            &[("destination", "/topic/esc10"), ("x-k", r"a\b:c")],
            b"b",
        )
        .await;
    let m = c12.message().await;
    assert_eq!(m.header("x-k"), Some(r"a\\b\cc"));
    broker.stop().await;
}

/// CONNECT and CONNECTED are never escaped, whatever the version: a
/// backslash sequence that would be a bad escape elsewhere is accepted.
#[tokio::test]
async fn connect_headers_are_not_unescaped() {
    let broker = TestBroker::start().await;
    let (mut c, _) =
        StompClient::connect_version(broker.stomp(), "1.2", &[("x-any", r"bad\qescape")]).await;
    c.request("BEGIN", &[("transaction", "t")], b"").await;
    broker.stop().await;
}

/// A `content-length` body may hold NULs and any byte; it is delivered
/// exactly, with its length.
#[tokio::test]
async fn content_length_bodies_with_nuls() {
    let broker = TestBroker::start().await;
    let mut consumer = StompClient::connect(broker.stomp(), &[]).await;
    consumer.subscribe("s", "/queue/bin", "auto", &[]).await;
    let mut producer = StompClient::connect(broker.stomp(), &[]).await;
    let body: Vec<u8> = (0..=255u8).chain([0, 0, 0]).collect();
    producer.send_persistent("/queue/bin", &[], &body).await;
    producer.send_persistent("/queue/bin", &[], b"\0").await;
    let m = consumer.message().await;
    assert_eq!(m.body, body);
    assert_eq!(m.header("content-length"), Some("259"));
    let m = consumer.message().await;
    assert_eq!(m.body, b"\0");
    assert_eq!(m.header("content-length"), Some("1"));
    broker.stop().await;
}

/// Without `content-length` the body runs to the first NUL.
#[tokio::test]
async fn nul_terminated_bodies() {
    let broker = TestBroker::start().await;
    let mut consumer = StompClient::connect(broker.stomp(), &[]).await;
    consumer.subscribe("s", "/queue/nul", "auto", &[]).await;
    let mut producer = StompClient::connect(broker.stomp(), &[]).await;
    producer
        .send_raw(b"SEND\ndestination:/queue/nul\n\nno length here\nsecond line\0")
        .await;
    producer
        .send_raw(b"SEND\ndestination:/queue/nul\nreceipt:r\n\n\0")
        .await;
    producer.expect_receipt("r").await;
    let m = consumer.message().await;
    assert_eq!(m.body, b"no length here\nsecond line");
    assert_eq!(m.header("content-length"), Some("26"));
    let m = consumer.message().await;
    assert_eq!(m.body, b"");
    broker.stop().await;
}

/// 1.2 lines may end in CRLF, including CONNECT's; `\r` is not part of the
/// values.
#[tokio::test]
async fn crlf_line_endings_in_1_2() {
    let broker = TestBroker::start().await;
    let mut consumer = StompClient::connect(broker.stomp(), &[]).await;
    consumer.subscribe("s", "/queue/crlf", "auto", &[]).await;
    let mut p = StompClient::connect_raw(broker.stomp()).await;
    p.send_raw(b"CONNECT\r\naccept-version:1.2\r\nhost:localhost\r\n\r\n\0")
        .await;
    let connected = p.recv().await.expect("CONNECTED");
    assert_eq!(connected.command, "CONNECTED");
    assert_eq!(connected.header("version"), Some("1.2"));
    p.send_raw(
        b"SEND\r\ndestination:/queue/crlf\r\nx-k:v\r\ncontent-type:text/plain\r\nreceipt:r1\r\n\r\ncr\r\nlf\0",
    )
    .await;
    p.expect_receipt("r1").await;
    let m = consumer.message().await;
    assert_eq!(m.header("destination"), Some("/queue/crlf"));
    assert_eq!(m.header("x-k"), Some("v"));
    assert_eq!(m.header("content-type"), Some("text/plain"));
    // The body is bytes: its CRLF is kept.
    assert_eq!(m.body, b"cr\r\nlf");
    broker.stop().await;
}

/// Repeated headers: the first one wins (destination included).
#[tokio::test]
async fn repeated_headers_first_wins() {
    let broker = TestBroker::start().await;
    let mut consumer = StompClient::connect(broker.stomp(), &[]).await;
    consumer.subscribe("s1", "/queue/first", "auto", &[]).await;
    consumer.subscribe("s2", "/queue/second", "auto", &[]).await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.request(
        "SEND",
        &[
            ("destination", "/queue/first"),
            ("destination", "/queue/second"),
            ("x-k", "1"),
            ("x-k", "2"),
            ("content-type", "text/plain"),
            ("content-type", "application/json"),
        ],
        b"body",
    )
    .await;
    let m = consumer.message().await;
    assert_eq!(m.header("destination"), Some("/queue/first"));
    assert_eq!(m.header("subscription"), Some("s1"));
    assert_eq!(m.header("x-k"), Some("1"));
    assert_eq!(m.header("content-type"), Some("text/plain"));
    consumer.expect_nothing().await;
    assert_eq!(
        broker.core().queue_stats("second").map(|s| s.depth),
        Some(0)
    );
    broker.stop().await;
}

/// EOLs (heart-beats) are allowed before and between frames, LF or CRLF.
#[tokio::test]
async fn eol_heart_beats_between_frames() {
    let broker = TestBroker::start().await;
    let mut c = StompClient::connect_raw(broker.stomp()).await;
    c.send_raw(b"\n\r\n\nCONNECT\naccept-version:1.2\nhost:h\n\n\0\n\n")
        .await;
    assert_eq!(c.recv().await.expect("CONNECTED").command, "CONNECTED");
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"\n\n\r\n");
    bytes.extend(encode(
        "SUBSCRIBE",
        &[("id", "s"), ("destination", "/queue/eol")],
        b"",
    ));
    bytes.extend_from_slice(b"\r\n\n");
    bytes.extend(encode(
        "SEND",
        &[("destination", "/queue/eol"), ("receipt", "r")],
        b"x",
    ));
    bytes.extend_from_slice(b"\n");
    c.send_raw(&bytes).await;
    // Message and receipt in either order.
    let a = c.recv().await.expect("frame");
    let b = c.recv().await.expect("frame");
    let mut commands = [a.command.clone(), b.command.clone()];
    commands.sort();
    assert_eq!(commands, ["MESSAGE".to_owned(), "RECEIPT".to_owned()]);
    broker.stop().await;
}

/// Frames split across TCP writes at every byte, and many frames in one
/// write, are all decoded.
#[tokio::test]
async fn frames_split_across_writes_and_packed_together() {
    let broker = TestBroker::start().await;
    let mut consumer = StompClient::connect(broker.stomp(), &[]).await;
    consumer.subscribe("s", "/queue/split", "auto", &[]).await;

    // One byte per write, with a pause so each is its own TCP segment.
    let mut p = StompClient::connect_raw(broker.stomp()).await;
    let mut bytes = encode("CONNECT", &[("accept-version", "1.2")], b"");
    bytes.extend(encode(
        "SEND",
        &[
            ("destination", "/queue/split"),
            ("x-k", "v"),
            ("receipt", "r-split"),
        ],
        b"split\0body",
    ));
    for (i, b) in bytes.iter().enumerate() {
        p.send_raw(&[*b]).await;
        if i % 8 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    assert_eq!(p.recv().await.expect("CONNECTED").command, "CONNECTED");
    p.expect_receipt("r-split").await;
    let m = consumer.message().await;
    assert_eq!(m.body, b"split\0body");
    assert_eq!(m.header("x-k"), Some("v"));

    // 200 frames, with and without content-length, in one write.
    let mut packed = Vec::new();
    for i in 0..200 {
        let body = format!("m{i}");
        if i % 2 == 0 {
            packed.extend(encode(
                "SEND",
                &[("destination", "/queue/split")],
                body.as_bytes(),
            ));
        } else {
            packed.extend(format!("SEND\ndestination:/queue/split\n\n{body}\0").as_bytes());
        }
    }
    packed.extend(encode(
        "SEND",
        &[("destination", "/queue/split"), ("receipt", "r-all")],
        b"end",
    ));
    p.send_raw(&packed).await;
    p.expect_receipt("r-all").await;
    for i in 0..200 {
        assert_eq!(consumer.message().await.text(), format!("m{i}"));
    }
    assert_eq!(consumer.message().await.text(), "end");
    broker.stop().await;
}
