//! Bad STOMP input over real sockets: each case gets a clear ERROR frame
//! (with `receipt-id` when the frame asked for a receipt), then the server
//! closes that connection; other connections go on, and stored messages
//! are intact.

mod common;

use std::sync::Arc;

use common::stomp::{encode, StompClient};
use common::TestBroker;

/// Small limits so oversize cases are cheap to produce.
const FRAME_MAX: u32 = 4096;
const HEADER_LINE_MAX: u32 = 1024;
const HEADERS_MAX: u32 = 16;

struct Case {
    name: &'static str,
    /// Sent before the bad bytes: a CONNECT, or nothing.
    connect: bool,
    bytes: Vec<u8>,
    message: &'static str,
    receipt: Option<&'static str>,
}

fn cases() -> Vec<Case> {
    let many: Vec<(String, String)> = (0..HEADERS_MAX + 4)
        .map(|i| (format!("h{i}"), "v".to_owned()))
        .collect();
    let many_refs: Vec<(&str, &str)> = std::iter::once(("destination", "/queue/bad"))
        .chain(many.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .collect();
    let long = "x".repeat(HEADER_LINE_MAX as usize + 10);
    vec![
        Case {
            name: "missing NUL after a content-length body",
            connect: true,
            bytes: b"SEND\ndestination:/queue/bad\ncontent-length:3\n\nabcX\n\n".to_vec(),
            message: "malformed frame",
            receipt: None,
        },
        Case {
            name: "unknown command",
            connect: true,
            bytes: encode("FROBNICATE", &[("receipt", "r-unknown")], b""),
            message: "unknown command",
            receipt: None,
        },
        Case {
            name: "oversized frame",
            connect: true,
            bytes: encode(
                "SEND",
                &[("destination", "/queue/bad")],
                &vec![b'z'; FRAME_MAX as usize + 100],
            ),
            message: "frame too large",
            receipt: None,
        },
        Case {
            name: "oversized frame without content-length",
            connect: true,
            bytes: {
                let mut b = b"SEND\ndestination:/queue/bad\n\n".to_vec();
                b.extend(vec![b'z'; FRAME_MAX as usize + 100]);
                b
            },
            message: "frame too large",
            receipt: None,
        },
        Case {
            name: "oversized header",
            connect: true,
            bytes: encode(
                "SEND",
                &[("destination", "/queue/bad"), ("x-long", &long)],
                b"",
            ),
            message: "header too long",
            receipt: None,
        },
        Case {
            name: "too many headers",
            connect: true,
            bytes: encode("SEND", &many_refs, b""),
            message: "too many headers",
            receipt: None,
        },
        Case {
            name: "bad escape",
            connect: true,
            bytes: encode(
                "SEND",
                &[("destination", "/queue/bad"), ("x-k", r"tab\there")],
                b"",
            ),
            message: "malformed frame",
            receipt: None,
        },
        Case {
            name: "ACK for an unknown id",
            connect: true,
            bytes: encode("ACK", &[("id", "999-999"), ("receipt", "r-ack")], b""),
            message: "unknown message id",
            receipt: Some("r-ack"),
        },
        Case {
            name: "ACK for a garbage id",
            connect: true,
            bytes: encode("ACK", &[("id", "not-an-id"), ("receipt", "r-ack2")], b""),
            message: "unknown message id",
            receipt: Some("r-ack2"),
        },
        Case {
            name: "SEND without destination",
            connect: true,
            bytes: encode(
                "SEND",
                &[("receipt", "r-send"), ("persistent", "true")],
                b"x",
            ),
            message: "missing header",
            receipt: Some("r-send"),
        },
        Case {
            name: "SEND to an invalid destination",
            connect: true,
            bytes: encode(
                "SEND",
                &[("destination", "/topic/a/#"), ("receipt", "r-dest")],
                b"x",
            ),
            message: "invalid destination",
            receipt: Some("r-dest"),
        },
        Case {
            name: "garbage bytes before CONNECT",
            connect: false,
            bytes: b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\n\n\0".to_vec(),
            // Not even text where a command belongs.
            message: "malformed frame",
            receipt: None,
        },
        Case {
            name: "HTTP request before CONNECT",
            connect: false,
            bytes: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            // A command line with spaces and slashes is not a command.
            message: "malformed frame",
            receipt: None,
        },
        Case {
            name: "SEND before CONNECT",
            connect: false,
            bytes: encode("SEND", &[("destination", "/queue/bad")], b"x"),
            message: "not connected",
            receipt: None,
        },
        Case {
            name: "server frame from a client",
            connect: true,
            bytes: encode("MESSAGE", &[("destination", "/queue/bad")], b"x"),
            message: "unexpected frame",
            receipt: None,
        },
        Case {
            name: "SUBSCRIBE without id in 1.2",
            connect: true,
            bytes: encode(
                "SUBSCRIBE",
                &[("destination", "/queue/bad"), ("receipt", "r-sub")],
                b"",
            ),
            message: "missing header",
            receipt: Some("r-sub"),
        },
        Case {
            name: "bad ack mode",
            connect: true,
            bytes: encode(
                "SUBSCRIBE",
                &[
                    ("id", "s"),
                    ("destination", "/queue/bad"),
                    ("ack", "sometimes"),
                ],
                b"",
            ),
            message: "invalid header",
            receipt: None,
        },
        Case {
            name: "bad content-length",
            connect: true,
            bytes: b"SEND\ndestination:/queue/bad\ncontent-length:-5\n\nx\0".to_vec(),
            message: "malformed frame",
            receipt: None,
        },
        Case {
            name: "header line without a colon",
            connect: true,
            bytes: b"SEND\ndestination:/queue/bad\nno-colon-here\n\nx\0".to_vec(),
            message: "malformed frame",
            receipt: None,
        },
        Case {
            name: "header value that is not UTF-8",
            connect: true,
            bytes: b"SEND\ndestination:/queue/bad\nx-k:\xff\xfe\n\nx\0".to_vec(),
            message: "malformed frame",
            receipt: None,
        },
        Case {
            name: "second CONNECT",
            connect: true,
            bytes: encode("CONNECT", &[("accept-version", "1.2")], b""),
            message: "unexpected frame",
            receipt: None,
        },
        Case {
            name: "bad heart-beat header",
            connect: false,
            bytes: encode(
                "CONNECT",
                &[("accept-version", "1.2"), ("heart-beat", "soon")],
                b"",
            ),
            message: "invalid header",
            receipt: None,
        },
        Case {
            name: "bad prefetch header",
            connect: true,
            bytes: encode(
                "SUBSCRIBE",
                &[
                    ("id", "s"),
                    ("destination", "/queue/bad"),
                    ("activemq.prefetchSize", "lots"),
                    ("receipt", "r-pf"),
                ],
                b"",
            ),
            message: "invalid header",
            receipt: Some("r-pf"),
        },
        Case {
            name: "duplicate subscription id",
            connect: true,
            bytes: [
                encode(
                    "SUBSCRIBE",
                    &[("id", "s"), ("destination", "/queue/bad")],
                    b"",
                ),
                encode(
                    "SUBSCRIBE",
                    &[("id", "s"), ("destination", "/queue/bad2")],
                    b"",
                ),
            ]
            .concat(),
            message: "duplicate subscription id",
            receipt: None,
        },
        Case {
            name: "duplicate transaction",
            connect: true,
            bytes: [
                encode("BEGIN", &[("transaction", "t")], b""),
                encode("BEGIN", &[("transaction", "t"), ("receipt", "r-dup")], b""),
            ]
            .concat(),
            message: "invalid transaction",
            receipt: Some("r-dup"),
        },
        Case {
            name: "too many transactions",
            connect: true,
            bytes: (0..17)
                .flat_map(|i| encode("BEGIN", &[("transaction", &format!("t{i}"))], b""))
                .collect(),
            message: "limit exceeded",
            receipt: None,
        },
        Case {
            name: "NACK for an unknown id",
            connect: true,
            bytes: encode("NACK", &[("id", "1-77")], b""),
            message: "unknown message id",
            receipt: None,
        },
        Case {
            name: "bad expires header",
            connect: true,
            bytes: encode(
                "SEND",
                &[("destination", "/queue/bad"), ("expires", "tomorrow")],
                b"x",
            ),
            message: "invalid header",
            receipt: None,
        },
        Case {
            name: "durable subscription without client-id or login",
            connect: true,
            bytes: encode(
                "SUBSCRIBE",
                &[
                    ("id", "s"),
                    ("destination", "/topic/bad"),
                    ("activemq.subscriptionName", "nameless"),
                    ("receipt", "r-dur"),
                ],
                b"",
            ),
            message: "missing client-id",
            receipt: Some("r-dur"),
        },
        Case {
            name: "COMMIT of an unknown transaction",
            connect: true,
            bytes: encode(
                "COMMIT",
                &[("transaction", "nope"), ("receipt", "r-tx")],
                b"",
            ),
            message: "invalid transaction",
            receipt: Some("r-tx"),
        },
    ]
}

/// A broker with the frame, header-line and header-count limits above.
async fn limits_broker() -> TestBroker {
    TestBroker::start_with(
        |c| {
            c.stomp.frame_size_max_bytes = Some(FRAME_MAX);
            c.stomp.header_size_max_bytes = HEADER_LINE_MAX;
            c.stomp.header_count_max = HEADERS_MAX;
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await
}

#[tokio::test]
async fn every_bad_input_gets_an_error_then_a_close_and_harms_no_one_else() {
    let mut broker = limits_broker().await;
    // Stored messages that must survive everything below.
    let mut producer = StompClient::connect(broker.stomp(), &[]).await;
    for i in 0..5 {
        producer
            .send_persistent("/queue/kept", &[], format!("kept-{i}").as_bytes())
            .await;
    }
    // A bystander with an open subscription.
    let mut bystander = StompClient::connect(broker.stomp(), &[]).await;
    bystander
        .subscribe("s", "/queue/live", "client-individual", &[])
        .await;

    for (n, case) in cases().into_iter().enumerate() {
        let mut c = if case.connect {
            StompClient::connect(broker.stomp(), &[]).await
        } else {
            StompClient::connect_raw(broker.stomp()).await
        };
        // The server may close before it read everything: a failed write is fine.
        c.try_send_raw(&case.bytes).await;
        let f = c
            .recv()
            .await
            .unwrap_or_else(|| panic!("{}: closed without ERROR", case.name));
        assert_eq!(f.command, "ERROR", "{}: {f:?}", case.name);
        assert_eq!(
            f.header("message"),
            Some(case.message),
            "{}: {f:?}",
            case.name
        );
        assert_eq!(f.header("receipt-id"), case.receipt, "{}: {f:?}", case.name);
        assert!(
            f.body.len() > 10 && f.text().contains("closed"),
            "{}: the body explains: {:?}",
            case.name,
            f.text()
        );
        c.expect_closed().await;

        // The bystander still works.
        let body = format!("live-{n}");
        producer
            .send_persistent("/queue/live", &[], body.as_bytes())
            .await;
        let m = bystander.message().await;
        assert_eq!(m.text(), body, "after {}", case.name);
        bystander.ack(&m).await;
    }
    assert_eq!(broker.queue("kept"), Some((5, 0)));
    // Still there after a restart: the journal took no harm either.
    drop((producer, bystander));
    broker.restart().await;
    assert_eq!(broker.queue("kept"), Some((5, 0)));
    // Nothing a bad frame carried was stored.
    assert_eq!(broker.depth("bad").0, 0);
    let mut reader = StompClient::connect(broker.stomp(), &[]).await;
    reader.subscribe("k", "/queue/kept", "auto", &[]).await;
    let got = reader.messages(5).await;
    assert_eq!(
        got.iter().map(|m| m.text()).collect::<Vec<_>>(),
        ["kept-0", "kept-1", "kept-2", "kept-3", "kept-4"]
    );
    broker.stop().await;
}

/// An ERROR for a frame inside a transaction discards the transaction.
#[tokio::test]
async fn error_aborts_open_transactions() {
    let broker = TestBroker::start().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.request("BEGIN", &[("transaction", "t")], b"").await;
    c.request(
        "SEND",
        &[
            ("destination", "/queue/txerr"),
            ("transaction", "t"),
            ("persistent", "true"),
        ],
        b"staged",
    )
    .await;
    c.send_frame("NOPE", &[], b"").await;
    c.expect_error_then_close().await;
    assert_eq!(broker.depth("txerr").0, 0);
    broker.stop().await;
}

/// A client that connects and never sends CONNECT is dropped after the
/// connect timeout (shortened here).
#[tokio::test]
async fn no_connect_in_time() {
    let broker = TestBroker::start_with(
        |c| c.broker.connect_timeout_ms = 300,
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let mut c = StompClient::connect_raw(broker.stomp()).await;
    let started = std::time::Instant::now();
    let err = c.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("connect timeout"), "{err:?}");
    // `[broker] connect_timeout_ms` applies (the adapter default is 10 s).
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(250)
            && waited < std::time::Duration::from_secs(3),
        "closed after {waited:?}"
    );
    broker.stop().await;
}

/// Frames within the limits pass: the limits are where they are said to be.
#[tokio::test]
async fn frames_at_the_limits_are_accepted() {
    let broker = limits_broker().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/limits", "auto", &[]).await;
    // Head: command, destination, content-length, receipt, about 80 bytes.
    let body = vec![b'b'; FRAME_MAX as usize - 200];
    c.send_persistent("/queue/limits", &[], &body).await;
    assert_eq!(c.message().await.body, body);
    // A header line just under the limit ("x-long:" + value + "\n").
    let long = "v".repeat(HEADER_LINE_MAX as usize - 20);
    c.send_persistent("/queue/limits", &[("x-long", &long)], b"l")
        .await;
    assert_eq!(c.message().await.header("x-long"), Some(long.as_str()));
    // destination + persistent + receipt + content-length + 12 = 16 headers.
    let names: Vec<String> = (0..HEADERS_MAX - 4).map(|i| format!("h{i}")).collect();
    let headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    c.send_persistent("/queue/limits", &headers, b"h").await;
    let m = c.message().await;
    assert_eq!(m.header("h0"), Some("v"));
    broker.stop().await;
}
