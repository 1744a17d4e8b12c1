//! STOMP transactions (BEGIN/COMMIT/ABORT over SENDs and ACKs) and
//! RECEIPTs (after durability, in order, DISCONNECT) over real sockets.

mod common;

use common::stomp::StompClient;
use common::TestBroker;

#[tokio::test]
async fn commit_publishes_transactional_sends_atomically() {
    let broker = TestBroker::start().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("a", "/queue/ta", "auto", &[]).await;
    c.subscribe("b", "/topic/tb", "auto", &[]).await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.request("BEGIN", &[("transaction", "tx1")], b"").await;
    p.request(
        "SEND",
        &[
            ("destination", "/queue/ta"),
            ("transaction", "tx1"),
            ("persistent", "true"),
        ],
        b"one",
    )
    .await;
    p.request(
        "SEND",
        &[("destination", "/topic/tb"), ("transaction", "tx1")],
        b"two",
    )
    .await;
    // Nothing is visible before COMMIT.
    c.expect_nothing().await;
    assert_eq!(broker.queue("ta"), Some((0, 0)));
    p.request("COMMIT", &[("transaction", "tx1")], b"").await;
    let got = c.messages(2).await;
    let mut bodies: Vec<String> = got.iter().map(|m| m.text()).collect();
    bodies.sort();
    assert_eq!(bodies, ["one", "two"]);
    // The transaction is over: its name can no longer be used.
    p.send_frame(
        "SEND",
        &[
            ("destination", "/queue/ta"),
            ("transaction", "tx1"),
            ("receipt", "late"),
        ],
        b"x",
    )
    .await;
    let err = p.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("invalid transaction"));
    assert_eq!(err.header("receipt-id"), Some("late"));
    broker.stop().await;
}

#[tokio::test]
async fn abort_discards_sends() {
    let broker = TestBroker::start().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("a", "/queue/ab", "auto", &[]).await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.request("BEGIN", &[("transaction", "t")], b"").await;
    for body in ["x", "y"] {
        p.request(
            "SEND",
            &[
                ("destination", "/queue/ab"),
                ("transaction", "t"),
                ("persistent", "true"),
            ],
            body.as_bytes(),
        )
        .await;
    }
    p.request("ABORT", &[("transaction", "t")], b"").await;
    // The same name can be begun again, and an open transaction left at
    // disconnect is aborted as well.
    p.request("BEGIN", &[("transaction", "t")], b"").await;
    p.request(
        "SEND",
        &[("destination", "/queue/ab"), ("transaction", "t")],
        b"z",
    )
    .await;
    p.send_frame("DISCONNECT", &[("receipt", "bye")], b"").await;
    p.expect_receipt("bye").await;
    c.expect_nothing().await;
    assert_eq!(broker.queue("ab"), Some((0, 0)));
    broker.stop().await;
}

/// ACKs in a transaction settle at COMMIT; ABORT makes them unacked again.
#[tokio::test]
async fn transactional_acks() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_numbered("/queue/tack", 3).await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/tack", "client-individual", &[])
        .await;
    let m = c.messages(3).await;
    c.request("BEGIN", &[("transaction", "t1")], b"").await;
    c.request("ACK", &[("id", &m[0].ack_id()), ("transaction", "t1")], b"")
        .await;
    c.request("ACK", &[("id", &m[1].ack_id()), ("transaction", "t1")], b"")
        .await;
    assert_eq!(broker.queue("tack"), Some((0, 3)));
    c.request("ABORT", &[("transaction", "t1")], b"").await;
    assert_eq!(broker.queue("tack"), Some((0, 3)));
    // After ABORT the same messages can be acked again.
    c.request("BEGIN", &[("transaction", "t2")], b"").await;
    c.request("ACK", &[("id", &m[0].ack_id()), ("transaction", "t2")], b"")
        .await;
    c.request("COMMIT", &[("transaction", "t2")], b"").await;
    assert_eq!(broker.queue("tack"), Some((0, 2)));
    // m1's aborted ack was not applied: it comes back after a disconnect.
    drop(c);
    let mut c2 = StompClient::connect(broker.stomp(), &[]).await;
    c2.subscribe("s", "/queue/tack", "client-individual", &[])
        .await;
    let again = c2.messages(2).await;
    assert_eq!(
        again.iter().map(|m| m.text()).collect::<Vec<_>>(),
        ["m1", "m2"]
    );
    broker.stop().await;
}

/// One transaction consumes from one queue and produces to another: both
/// happen at COMMIT, neither at ABORT.
#[tokio::test]
async fn sends_and_acks_commit_together() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/queue/in", &[], b"job-1").await;
    p.send_persistent("/queue/in", &[], b"job-2").await;
    let mut w = StompClient::connect(broker.stomp(), &[]).await;
    w.subscribe("s", "/queue/in", "client-individual", &[])
        .await;
    let jobs = w.messages(2).await;

    w.request("BEGIN", &[("transaction", "bad")], b"").await;
    w.request(
        "ACK",
        &[("id", &jobs[0].ack_id()), ("transaction", "bad")],
        b"",
    )
    .await;
    w.request(
        "SEND",
        &[
            ("destination", "/queue/out"),
            ("transaction", "bad"),
            ("persistent", "true"),
        ],
        b"result-1",
    )
    .await;
    w.request("ABORT", &[("transaction", "bad")], b"").await;
    assert_eq!(broker.queue("in"), Some((0, 2)));
    assert_eq!(broker.queue("out").map(|s| s.0).unwrap_or(0), 0);

    w.request("BEGIN", &[("transaction", "good")], b"").await;
    for (job, result) in jobs.iter().zip(["result-1", "result-2"]) {
        w.request(
            "ACK",
            &[("id", &job.ack_id()), ("transaction", "good")],
            b"",
        )
        .await;
        w.request(
            "SEND",
            &[
                ("destination", "/queue/out"),
                ("transaction", "good"),
                ("persistent", "true"),
            ],
            result.as_bytes(),
        )
        .await;
    }
    w.request("COMMIT", &[("transaction", "good")], b"").await;
    assert_eq!(broker.queue("in"), Some((0, 0)));
    assert_eq!(broker.queue("out"), Some((2, 0)));
    let mut r = StompClient::connect(broker.stomp(), &[]).await;
    r.subscribe("o", "/queue/out", "auto", &[]).await;
    assert_eq!(
        r.messages(2)
            .await
            .iter()
            .map(|m| m.text())
            .collect::<Vec<_>>(),
        ["result-1", "result-2"]
    );
    broker.stop().await;
}

/// A RECEIPT for a persistent SEND means the message is stored: it is in
/// the queue when the RECEIPT arrives and survives a restart. Receipts
/// come back in the order of the frames that asked.
#[tokio::test]
async fn receipts_after_durability_and_in_order() {
    let mut broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    let mut bytes = Vec::new();
    for i in 0..50 {
        let r = format!("r{i}");
        let (command, headers): (&str, Vec<(&str, &str)>) = match i % 5 {
            0 => ("BEGIN", vec![("transaction", "t")]),
            1 => (
                "SEND",
                vec![
                    ("destination", "/queue/rcpt"),
                    ("transaction", "t"),
                    ("persistent", "true"),
                ],
            ),
            2 => ("COMMIT", vec![("transaction", "t")]),
            3 => (
                "SEND",
                vec![("destination", "/queue/rcpt"), ("persistent", "true")],
            ),
            _ => ("SEND", vec![("destination", "/queue/rcpt")]),
        };
        let mut h = headers;
        h.push(("receipt", &r));
        bytes.extend(common::stomp::encode(
            command,
            &h,
            format!("m{i}").as_bytes(),
        ));
    }
    p.send_raw(&bytes).await;
    for i in 0..50 {
        p.expect_receipt(&format!("r{i}")).await;
    }
    // 10 transactional + 10 plain persistent + 10 non-persistent.
    assert_eq!(broker.queue("rcpt"), Some((30, 0)));
    drop(p);
    broker.restart().await;
    // Persistent ones survive (non-persistent ones may not).
    let depth = broker.queue("rcpt").expect("queue recovered").0;
    assert!(depth >= 20, "only {depth} messages recovered");
    broker.stop().await;
}

/// DISCONNECT's RECEIPT comes after every earlier frame's effect, then the
/// server closes; frames after DISCONNECT are ignored.
#[tokio::test]
async fn disconnect_with_receipt() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    let mut bytes = common::stomp::encode(
        "SEND",
        &[("destination", "/queue/disc"), ("persistent", "true")],
        b"before",
    );
    bytes.extend(common::stomp::encode(
        "DISCONNECT",
        &[("receipt", "d")],
        b"",
    ));
    bytes.extend(common::stomp::encode(
        "SEND",
        &[("destination", "/queue/disc"), ("persistent", "true")],
        b"after",
    ));
    p.send_raw(&bytes).await;
    p.expect_receipt("d").await;
    p.expect_closed().await;
    assert_eq!(broker.queue("disc"), Some((1, 0)));
    // DISCONNECT without a receipt just closes.
    let mut q = StompClient::connect(broker.stomp(), &[]).await;
    q.send_frame("DISCONNECT", &[], b"").await;
    q.expect_closed().await;
    broker.stop().await;
}

/// What a RECEIPT confirmed survives a restart: a committed transaction's
/// sends and acks, a receipted ACK, and a NACK's raised delivery count;
/// an aborted transaction leaves nothing.
#[tokio::test]
async fn receipted_effects_survive_a_restart() {
    let mut broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    for i in 0..4 {
        p.send_persistent("/queue/dur-in", &[], format!("in-{i}").as_bytes())
            .await;
    }
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/dur-in", "client-individual", &[])
        .await;
    let m = c.messages(4).await;
    // in-0: acked outside a transaction.
    c.ack(&m[0]).await;
    // in-1: acked, with a send, in a committed transaction.
    c.request("BEGIN", &[("transaction", "ok")], b"").await;
    c.request("ACK", &[("id", &m[1].ack_id()), ("transaction", "ok")], b"")
        .await;
    c.request(
        "SEND",
        &[
            ("destination", "/queue/dur-out"),
            ("transaction", "ok"),
            ("persistent", "true"),
        ],
        b"committed",
    )
    .await;
    c.request("COMMIT", &[("transaction", "ok")], b"").await;
    // in-2: acked, with a send, in an aborted transaction.
    c.request("BEGIN", &[("transaction", "no")], b"").await;
    c.request("ACK", &[("id", &m[2].ack_id()), ("transaction", "no")], b"")
        .await;
    c.request(
        "SEND",
        &[
            ("destination", "/queue/dur-out"),
            ("transaction", "no"),
            ("persistent", "true"),
        ],
        b"aborted",
    )
    .await;
    c.request("ABORT", &[("transaction", "no")], b"").await;
    // in-3: NACKed once; it comes straight back, and stays unacked.
    c.request("NACK", &[("id", &m[3].ack_id())], b"").await;
    let back = c.message().await;
    assert_eq!(back.text(), "in-3");
    assert_eq!(back.header("delivery-count"), Some("1"));
    drop(c);
    drop(p);
    broker.restart().await;

    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/dur-in", "client-individual", &[])
        .await;
    let again = c.messages(2).await;
    assert_eq!(
        again.iter().map(|m| m.text()).collect::<Vec<_>>(),
        ["in-2", "in-3"]
    );
    // in-2 failed once (the disconnect); in-3 twice (NACK, disconnect).
    assert_eq!(again[0].header("delivery-count"), Some("1"));
    assert_eq!(again[1].header("delivery-count"), Some("2"));
    c.expect_nothing().await;
    c.subscribe("o", "/queue/dur-out", "auto", &[]).await;
    assert_eq!(c.message().await.text(), "committed");
    c.expect_nothing().await;
    broker.stop().await;
}

/// A non-persistent SEND with a receipt is answered too, and receipts for
/// frames with no durable effect (SUBSCRIBE, UNSUBSCRIBE, BEGIN, ABORT)
/// come at once.
#[tokio::test]
async fn receipts_for_every_command() {
    let broker = TestBroker::start().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.request(
        "SEND",
        &[("destination", "/queue/np"), ("persistent", "false")],
        b"x",
    )
    .await;
    c.request(
        "SUBSCRIBE",
        &[("id", "s"), ("destination", "/queue/np")],
        b"",
    )
    .await;
    assert_eq!(c.message().await.text(), "x");
    c.request("UNSUBSCRIBE", &[("id", "s")], b"").await;
    c.request("BEGIN", &[("transaction", "t")], b"").await;
    c.request("ABORT", &[("transaction", "t")], b"").await;
    broker.stop().await;
}

/// An ACK staged in a transaction for a subscription that is cancelled
/// before COMMIT: the message is neither lost nor delivered twice.
#[tokio::test]
async fn transactional_ack_then_unsubscribe_then_commit() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/queue/tx-unsub", &[], b"only").await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/tx-unsub", "client-individual", &[])
        .await;
    let m = c.message().await;
    c.request("BEGIN", &[("transaction", "t")], b"").await;
    c.request("ACK", &[("id", &m.ack_id()), ("transaction", "t")], b"")
        .await;
    c.request("UNSUBSCRIBE", &[("id", "s")], b"").await;
    c.send_frame("COMMIT", &[("transaction", "t"), ("receipt", "c")], b"")
        .await;
    let f = c.recv().await.expect("answer to COMMIT");
    let (depth, in_flight) = broker.queue("tx-unsub").expect("queue");
    match f.command.as_str() {
        // The ack held: the message is gone.
        "RECEIPT" => assert_eq!((depth, in_flight), (0, 0), "{f:?}"),
        // The ack failed: the message is still there to be consumed.
        "ERROR" => assert_eq!((depth, in_flight), (1, 0), "{f:?}"),
        other => panic!("unexpected {other}: {f:?}"),
    }
    broker.stop().await;
}

/// A producer far ahead of the journal (more receipts pending than the
/// adapter lets a connection have) is slowed down, not dropped, and every
/// RECEIPT arrives in order.
#[tokio::test]
async fn back_pressure_on_a_fast_producer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const N: usize = 6000;
    let broker = TestBroker::start().await;
    let mut stream = tokio::net::TcpStream::connect(broker.stomp())
        .await
        .expect("connect");
    stream
        .write_all(&common::stomp::encode(
            "CONNECT",
            &[("accept-version", "1.2"), ("host", "h")],
            b"",
        ))
        .await
        .expect("write");
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        let mut bytes = Vec::new();
        for i in 0..N {
            let r = i.to_string();
            bytes.extend(common::stomp::encode(
                "SEND",
                &[
                    ("destination", "/queue/fast"),
                    ("persistent", "true"),
                    ("receipt", &r),
                ],
                b"0123456789abcdef",
            ));
        }
        wr.write_all(&bytes).await.expect("write all");
        wr
    });
    // Count RECEIPTs in order on the raw stream.
    let mut buf = Vec::new();
    let mut next = 0usize;
    let mut connected = false;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while next < N {
        let mut chunk = vec![0u8; 65536];
        let n = tokio::time::timeout_at(deadline, rd.read(&mut chunk))
            .await
            .expect("receipts in time")
            .expect("read");
        assert!(n > 0, "closed after {next} receipts");
        buf.extend_from_slice(&chunk[..n]);
        while let Some(end) = buf.iter().position(|b| *b == 0) {
            let frame = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..=end);
            let frame = frame.trim_start_matches(['\n', '\r']);
            if !connected {
                assert!(frame.starts_with("CONNECTED"), "{frame}");
                connected = true;
                continue;
            }
            assert!(frame.starts_with("RECEIPT\n"), "{frame}");
            assert!(
                frame.contains(&format!("\nreceipt-id:{next}\n")),
                "receipt {next} expected: {frame}"
            );
            next += 1;
        }
    }
    let _wr = writer.await.expect("writer");
    assert_eq!(
        broker.core().queue_stats("fast").map(|s| s.depth),
        Some(N as u64)
    );
    broker.stop().await;
}
