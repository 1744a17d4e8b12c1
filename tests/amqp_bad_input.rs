//! AMQP 1.0 bad input over real sockets, crafted with a raw TCP client where
//! fe2o3-amqp would not send it: corrupt and truncated frames (before and
//! after SASL), frames over max-frame-size, performatives out of order,
//! attaches to malformed addresses, oversized messages. Each gets the
//! matching error, only the broken thing closes, bystanders keep working and
//! stored messages are not lost (checked across a restart).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::amqp::{self, enc, frame, protocol_header, send_accepted, RawAmqp, WAIT};
use common::TestBroker;
use fe2o3_amqp::link::delivery::Delivery;
use fe2o3_amqp::{Receiver, Sender, Session};

const STORED: u64 = 5;

/// A broker with 4 KiB frames, 10 KB messages, and STORED durable messages
/// in `/queue/precious`.
async fn broker_with_stored() -> TestBroker {
    let broker = TestBroker::start_with(
        |c| {
            c.amqp.frame_size_max_bytes = 4096;
            c.amqp.message_size_max_bytes = Some(10_000);
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let texts: Vec<String> = (0..STORED).map(|i| format!("keep {i}")).collect();
    amqp::publish_durable(&broker, "seed", "/queue/precious", &texts).await;
    broker
}

/// A bystander connection that must keep working through the abuse.
struct Bystander {
    conn: fe2o3_amqp::connection::ConnectionHandle<()>,
    session: fe2o3_amqp::session::SessionHandle<()>,
    sender: Sender,
    receiver: Receiver,
    n: u32,
}

impl Bystander {
    async fn new(broker: &TestBroker) -> Bystander {
        let (conn, mut session) = amqp::connect_session(broker, "bystander").await;
        let sender = amqp::sender(&mut session, "bs", "/queue/bystander").await;
        let receiver = amqp::receiver(&mut session, "br", "/queue/bystander").await;
        Bystander {
            conn,
            session,
            sender,
            receiver,
            n: 0,
        }
    }

    async fn still_works(&mut self) {
        self.n += 1;
        let text = format!("alive {}", self.n);
        send_accepted(&mut self.sender, text.as_str()).await;
        assert_eq!(amqp::recv_text(&mut self.receiver).await, text);
    }

    async fn close(mut self) {
        self.sender.close().await.expect("close");
        self.receiver.close().await.expect("close");
        self.session.end().await.expect("end");
        self.conn.close().await.expect("close");
    }
}

/// After the abuse: the stored messages are all there, also after a restart.
async fn nothing_lost(mut broker: TestBroker) {
    let depth = |b: &TestBroker| b.core().queue_stats("precious").map(|s| s.depth);
    assert_eq!(depth(&broker), Some(STORED));
    broker.restart().await;
    assert_eq!(depth(&broker), Some(STORED));
    let (mut conn, mut session) = amqp::connect_session(&broker, "check").await;
    let mut r = amqp::receiver(&mut session, "r", "/queue/precious").await;
    for i in 0..STORED {
        let d: Delivery<String> = r.recv().await.expect("recv");
        assert_eq!(d.body(), &format!("keep {i}"));
        r.accept(&d).await.expect("accept");
    }
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn corrupt_and_truncated_frames_before_and_after_sasl() {
    let broker = broker_with_stored().await;
    let mut by = Bystander::new(&broker).await;

    // A 13-byte frame before authentication: framing error, no panic.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    assert!(raw.write(&protocol_header(3)).await);
    assert_eq!(raw.read_header().await, Ok(protocol_header(3)));
    raw.expect(amqp::SASL_MECHANISMS).await;
    raw.write(&[0, 0, 0, 13, 2, 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff])
        .await;
    raw.expect_eof().await;
    by.still_works().await;

    // Truncated frame header before SASL completes, then EOF.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.write(&protocol_header(3)).await;
    raw.write(&[0, 0, 0]).await;
    drop(raw);
    // Truncated after the AMQP header and Open.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, None).await;
    raw.write(&[0, 0, 0, 9, 2]).await;
    drop(raw);
    by.still_works().await;

    // A garbage protocol header: the broker answers with its header and closes.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.write(b"GET / HTTP/1.1\r\n\r\n").await;
    if let Ok(h) = raw.read_header().await {
        assert_eq!(&h[..4], b"AMQP");
    }
    raw.expect_eof().await;

    // A bad data offset (doff 1 < 2) after Open: framing error.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, None).await;
    raw.write(&[0, 0, 0, 8, 1, 0, 0, 0]).await;
    raw.expect_close_with("amqp:connection:framing-error").await;

    // A performative that does not decode: decode-error, connection closed.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, None).await;
    raw.write(&frame(
        0,
        0,
        &[0x00, 0x53, 0x11, 0xd0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 4],
    ))
    .await;
    raw.expect_close_with("amqp:decode-error").await;
    // An unknown descriptor.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, None).await;
    raw.write(&frame(0, 0, &enc::described(0x7f, &[enc::null()])))
        .await;
    raw.expect_close_with("amqp:decode-error").await;

    by.still_works().await;
    by.close().await;
    nothing_lost(broker).await;
}

#[tokio::test]
async fn frame_over_max_frame_size() {
    let broker = broker_with_stored().await;
    let mut by = Bystander::new(&broker).await;
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, None).await;
    // Our max-frame-size is 4096: a frame header announcing 100 000 bytes is
    // refused before its body arrives.
    let mut big = 100_000u32.to_be_bytes().to_vec();
    big.extend_from_slice(&[2, 0, 0, 0]);
    big.extend_from_slice(&[0x40; 1000]);
    raw.write(&big).await;
    raw.expect_close_with("amqp:frame-size-too-large").await;
    // Before Open too (handshake limit).
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.write(&protocol_header(0)).await;
    raw.read_header().await.expect("header");
    raw.write(&big).await;
    raw.expect_close_with("amqp:frame-size-too-large").await;
    by.still_works().await;
    by.close().await;
    nothing_lost(broker).await;
}

#[tokio::test]
async fn performatives_out_of_order() {
    let broker = broker_with_stored().await;
    let mut by = Bystander::new(&broker).await;

    // Begin before Open.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.write(&protocol_header(0)).await;
    raw.read_header().await.expect("header");
    raw.write(&frame(0, 0, &amqp::begin_body())).await;
    raw.expect_close_with("amqp:illegal-state").await;

    // A second Open.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, None).await;
    raw.write(&frame(0, 0, &amqp::open_body("again", 65536, None)))
        .await;
    raw.expect_close_with("amqp:illegal-state").await;

    // Attach on a channel that has no session.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, None).await;
    raw.write(&frame(0, 5, &amqp::attach_sender_body("l", 0, "/queue/x")))
        .await;
    raw.expect_close_with("amqp:not-allowed").await;

    // A transfer on an unattached handle ends only that session: the
    // connection and its other session keep working.
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open_and_begin().await;
    raw.write(&frame(0, 1, &amqp::begin_body())).await;
    let b1 = raw.expect(amqp::BEGIN).await;
    assert_eq!(b1.channel, 1);
    let mut t = amqp::transfer_body(9, 0, false);
    t.extend_from_slice(&amqp::value_section("stray"));
    raw.write(&frame(0, 0, &t)).await;
    let end = raw.expect(amqp::END).await;
    assert_eq!(end.channel, 0);
    assert!(end.mentions("amqp:session:unattached-handle"), "{end:?}");
    raw.write(&frame(0, 0, &enc::described(amqp::END, &[])))
        .await;
    // Session 1 still attaches.
    raw.write(&frame(
        0,
        1,
        &amqp::attach_sender_body("ok", 0, "/queue/raw-ok"),
    ))
    .await;
    let attach = raw.expect(amqp::ATTACH).await;
    assert_eq!(attach.channel, 1);
    raw.write(&frame(0, 0, &enc::described(amqp::CLOSE, &[])))
        .await;
    raw.expect(amqp::CLOSE).await;

    by.still_works().await;
    by.close().await;
    nothing_lost(broker).await;
}

#[tokio::test]
async fn attach_to_malformed_or_unknown_address_detaches_only_that_link() {
    let broker = broker_with_stored().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "bad-attach").await;
    let mut good = amqp::sender(&mut session, "good", "/queue/fine").await;
    for (i, addr) in ["/queue/a#b", "/topic/a/#/b", "/topic/a+/b", "/queue/"]
        .iter()
        .enumerate()
    {
        let Err(e) = Sender::attach(&mut session, format!("bad-s{i}"), *addr).await else {
            panic!("sender attach to {addr} succeeded");
        };
        let text = format!("{e:?}");
        assert!(
            text.contains("InvalidField") || text.contains("NotFound"),
            "{addr}: {text}"
        );
        // fe2o3 0.18 reuses the refused link's handle at once and may race
        // its own bookkeeping (a local IllegalState): give it a moment.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let e = Receiver::attach(&mut session, format!("bad-r{i}"), *addr)
            .await
            .expect_err("receiver attach to a malformed address");
        let text = format!("{e:?}");
        assert!(
            text.contains("InvalidField") || text.contains("NotFound"),
            "{addr}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The durable-subscription lookup of a missing one: not-found.
    let e = Receiver::builder()
        .name("no-such-sub")
        .source(fe2o3_amqp::types::messaging::Source::builder().build())
        .attach(&mut session)
        .await
        .expect_err("lookup of a missing durable subscription");
    assert!(format!("{e:?}").contains("NotFound"), "{e:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The session and the other link are unaffected.
    send_accepted(&mut good, "fine").await;
    let _other = Session::begin(&mut conn).await.expect("another session");
    conn.close().await.expect("close");
    nothing_lost(broker).await;
}

#[tokio::test]
async fn oversized_message_detaches_the_link_only() {
    let broker = broker_with_stored().await;
    let mut by = Bystander::new(&broker).await;
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open_and_begin().await;
    raw.write(&frame(
        0,
        0,
        &amqp::attach_sender_body("big", 0, "/queue/big"),
    ))
    .await;
    let attach = raw.expect(amqp::ATTACH).await;
    // Our Attach advertises max-message-size 10 000 (a ulong).
    let mut mms = vec![0x80];
    mms.extend_from_slice(&10_000u64.to_be_bytes());
    assert!(
        attach.body.windows(mms.len()).any(|w| w == mms.as_slice()),
        "max-message-size in {attach:?}"
    );
    raw.expect(amqp::FLOW).await;
    // Three 3 000-byte frames of one delivery exceed 10 000 bytes.
    for _ in 0..4 {
        let mut t = amqp::transfer_body(0, 0, true);
        t.extend_from_slice(&[0x40; 3000]);
        if !raw.write(&frame(0, 0, &t)).await {
            break;
        }
    }
    let detach = raw.expect(amqp::DETACH).await;
    assert!(
        detach.mentions("amqp:link:message-size-exceeded"),
        "{:?}",
        String::from_utf8_lossy(&detach.body)
    );
    // The session still works: another link attaches.
    raw.write(&frame(
        0,
        0,
        &amqp::attach_sender_body("small", 1, "/queue/big"),
    ))
    .await;
    raw.expect(amqp::ATTACH).await;
    raw.write(&frame(0, 0, &enc::described(amqp::CLOSE, &[])))
        .await;
    raw.expect(amqp::CLOSE).await;
    assert!(broker
        .core()
        .queue_stats("big")
        .is_none_or(|s| s.depth == 0));

    // fe2o3 over the same limit: not stored, the client's connection stays usable.
    let (mut conn, mut session) = amqp::connect_session(&broker, "big-client").await;
    let mut s = amqp::sender(&mut session, "s", "/queue/big2").await;
    let big = "x".repeat(50_000);
    let r = tokio::time::timeout(WAIT, s.send(big.as_str()))
        .await
        .expect("answered");
    assert!(
        !matches!(r, Ok(fe2o3_amqp::types::messaging::Outcome::Accepted(_))),
        "oversized accepted: {r:?}"
    );
    assert!(broker
        .core()
        .queue_stats("big2")
        .is_none_or(|s| s.depth == 0));
    let mut s2 = amqp::sender(&mut session, "s2", "/queue/big2").await;
    send_accepted(&mut s2, "small").await;
    conn.close().await.expect("close");

    tokio::time::sleep(Duration::from_millis(50)).await;
    by.still_works().await;
    by.close().await;
    nothing_lost(broker).await;
}
