//! AMQP 1.0 connections, sessions and links over real sockets: Open
//! negotiation (idle timeouts both ways, max-frame-size), several sessions
//! and links, the address naming scheme, terminus capabilities, topic
//! subscriptions (durable ones resumed across a restart), dynamic nodes as
//! reply-to for STOMP, anonymous relay, and credit (1, drain, sender side).

mod common;

use std::time::Duration;

use common::amqp::{
    self, durable, durable_source, enc, recv_nothing, recv_text, send_accepted, AnyDelivery,
    RawAmqp, WAIT,
};
use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::types::messaging::{Body, Message, Outcome, Properties, Source, Target};
use fe2o3_amqp::types::primitives::{Array, Symbol, Value};
use fe2o3_amqp::{Connection, Receiver, Sender, Session};

#[tokio::test]
async fn open_advertises_limits_and_our_idle_timeout_is_enforced() {
    let broker = TestBroker::start_with(
        |c| {
            c.amqp.idle_timeout_ms = 1000;
            c.amqp.frame_size_max_bytes = 4096;
        },
        std::sync::Arc::new(rosetta::core::AllowAll),
    )
    .await;
    // A silent peer: our Open carries max-frame-size 4096 and idle-time-out
    // 500, half the 1000 enforced (the configured minimum; AMQP 1.0
    // §2.4.5), then we close it with resource-limit-exceeded.
    let mut silent = RawAmqp::connect(broker.amqp()).await;
    let open = silent.open(65536, None).await;
    assert!(open.mentions("rosetta"), "our container id in {open:?}");
    let has = |needle: &[u8]| open.body.windows(needle.len()).any(|w| w == needle);
    assert!(has(&enc::uint(4096)), "max-frame-size 4096 in {open:?}");
    assert!(has(&enc::uint(500)), "idle-time-out 500 in {open:?}");
    // A peer that sends heartbeats stays open meanwhile.
    let mut chatty = RawAmqp::connect(broker.amqp()).await;
    chatty.open(65536, None).await;
    let chatty = tokio::spawn(async move {
        for _ in 0..20 {
            assert!(chatty.write(&amqp::empty_frame()).await, "chatty closed");
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        // Still open after 3 s: a Begin is answered.
        assert!(chatty.write(&amqp::frame(0, 0, &amqp::begin_body())).await);
        chatty.expect(amqp::BEGIN).await;
    });
    let started = std::time::Instant::now();
    silent
        .expect_close_with("amqp:resource-limit-exceeded")
        .await;
    assert!(started.elapsed() < Duration::from_secs(4));
    chatty.await.expect("heartbeating peer kept open");
    broker.stop().await;
}

/// Spec 2.4.5: the idle timeout counts frames. A Begin dribbled one byte
/// every 300 ms on a 1 s idle timeout never completes a frame, so the
/// broker closes with resource-limit-exceeded after about 1 s, not when the
/// bytes run out.
#[tokio::test]
async fn frame_dribbled_a_byte_at_a_time_does_not_reset_the_idle_timeout() {
    let broker = TestBroker::start_with(
        |c| c.amqp.idle_timeout_ms = 1000,
        std::sync::Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, None).await;
    let begin = amqp::frame(0, 0, &amqp::begin_body());
    let started = std::time::Instant::now();
    let mut close = None;
    for (i, byte) in begin.iter().enumerate() {
        assert!(
            raw.write(std::slice::from_ref(byte)).await,
            "closed without a Close"
        );
        match raw.read_frame_within(Duration::from_millis(300)).await {
            Ok(f) if f.code() == Some(amqp::CLOSE) => {
                close = Some((i + 1, f));
                break;
            }
            Ok(f) => panic!("unexpected frame {f:?}"),
            Err(amqp::RawEnd::Timeout) => {}
            Err(amqp::RawEnd::Eof) => panic!("closed without a Close"),
        }
    }
    let (written, close) = close.expect("a Close while the Begin dribbled");
    assert!(
        written < begin.len(),
        "closed only after the frame completed"
    );
    assert!(close.mentions("amqp:resource-limit-exceeded"), "{close:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_millis(2500),
        "closed after {took:?}"
    );
    broker.stop().await;
}

#[tokio::test]
async fn broker_keeps_a_client_idle_timeout_alive_with_empty_frames() {
    let broker = TestBroker::start().await;
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open(65536, Some(400)).await;
    // Within 1.5 s the broker must send several empty frames (well within
    // the peer's 400 ms idle timeout each).
    let mut empties = 0;
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < deadline {
        match raw.read_frame_within(Duration::from_millis(400)).await {
            Ok(f) if f.body.is_empty() => empties += 1,
            Ok(f) => panic!("unexpected frame {f:?}"),
            Err(e) => panic!("no heartbeat within the client's idle timeout: {e:?}"),
        }
    }
    assert!(empties >= 3, "only {empties} empty frames");

    // And the fe2o3 client with a short idle timeout stays usable over time.
    let mut conn = Connection::builder()
        .container_id("idle-client")
        .idle_time_out(500u32)
        .open(amqp::url(&broker).as_str())
        .await
        .expect("open");
    let mut session = Session::begin(&mut conn).await.expect("begin");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut s = amqp::sender(&mut session, "s", "/queue/idle").await;
    send_accepted(&mut s, "still here").await;
    let mut r = amqp::receiver(&mut session, "r", "/queue/idle").await;
    assert_eq!(recv_text(&mut r).await, "still here");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn small_max_frame_size_splits_large_messages_both_ways() {
    let broker = TestBroker::start_with(
        |c| c.amqp.frame_size_max_bytes = 1024,
        std::sync::Arc::new(rosetta::core::AllowAll),
    )
    .await;
    // The client allows only 512-byte frames: the broker must split its
    // deliveries; the broker allows 1024: the client splits its transfers.
    let mut conn = Connection::builder()
        .container_id("small-frames")
        .max_frame_size(512u32)
        .open(amqp::url(&broker).as_str())
        .await
        .expect("open");
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let mut s = amqp::sender(&mut session, "s", "/queue/big").await;
    let body: String = (0..20_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    send_accepted(&mut s, &body).await;
    let mut r = amqp::receiver(&mut session, "r", "/queue/big").await;
    assert_eq!(recv_text(&mut r).await, body);
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn several_sessions_and_links_per_connection() {
    let broker = TestBroker::start().await;
    let mut conn = amqp::connect(&broker, "multi").await;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(Session::begin(&mut conn).await.expect("begin"));
    }
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for (i, session) in sessions.iter_mut().enumerate() {
        for j in 0..3 {
            let q = format!("/queue/multi-{i}-{j}");
            senders.push(
                Sender::attach(session, format!("s-{i}-{j}"), q.as_str())
                    .await
                    .expect("sender"),
            );
            receivers.push(
                Receiver::attach(session, format!("r-{i}-{j}"), q.as_str())
                    .await
                    .expect("receiver"),
            );
        }
    }
    for (k, s) in senders.iter_mut().enumerate() {
        send_accepted(s, &format!("m{k}")).await;
    }
    for (k, r) in receivers.iter_mut().enumerate() {
        assert_eq!(recv_text(r).await, format!("m{k}"));
    }
    // Ending one session leaves the others working.
    let mut first = sessions.remove(0);
    for _ in 0..3 {
        senders.remove(0).close().await.expect("close sender");
        receivers.remove(0).close().await.expect("close receiver");
    }
    first.end().await.expect("end");
    send_accepted(&mut senders[0], "after end").await;
    assert_eq!(recv_text(&mut receivers[0]).await, "after end");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn addresses_follow_the_naming_scheme() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "addr").await;
    // `/queue/q` and bare `q` are the same queue.
    let mut s = amqp::sender(&mut session, "s-q", "/queue/same").await;
    let mut r = amqp::receiver(&mut session, "r-q", "same").await;
    send_accepted(&mut s, "to the queue").await;
    assert_eq!(recv_text(&mut r).await, "to the queue");
    assert!(broker.queue("same").is_some());

    // Topics and wildcards.
    let mut exact = amqp::receiver(&mut session, "t-exact", "/topic/a/b").await;
    let mut plus = amqp::receiver(&mut session, "t-plus", "/topic/a/+").await;
    let mut hash = amqp::receiver(&mut session, "t-hash", "/topic/#").await;
    let mut other = amqp::receiver(&mut session, "t-other", "/topic/x/+").await;
    let mut ts = amqp::sender(&mut session, "s-t", "/topic/a/b").await;
    send_accepted(&mut ts, "fan-out").await;
    for r in [&mut exact, &mut plus, &mut hash] {
        assert_eq!(recv_text(r).await, "fan-out");
    }
    recv_nothing(&mut other).await;
    // A topic publish is not a queue named after it.
    assert!(broker.queue("a/b").is_none());
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn terminus_capabilities_choose_the_routing_type_of_a_bare_address() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "caps").await;
    let topic = || Array::from(vec![Symbol::from("topic")]);
    let queue = || Array::from(vec![Symbol::from("queue")]);
    let mut sub = Receiver::builder()
        .name("sub")
        .source(
            Source::builder()
                .address("news")
                .capabilities(topic())
                .build(),
        )
        .attach(&mut session)
        .await
        .expect("topic receiver");
    let mut pubr = Sender::builder()
        .name("pub")
        .target(
            Target::builder()
                .address("news")
                .capabilities(topic())
                .build(),
        )
        .attach(&mut session)
        .await
        .expect("topic sender");
    send_accepted(&mut pubr, "headline").await;
    assert_eq!(recv_text(&mut sub).await, "headline");
    assert!(broker.queue("news").is_none(), "no queue `news`");
    // Same as `/topic/news` for everyone else.
    let mut plain = amqp::sender(&mut session, "pub2", "/topic/news").await;
    send_accepted(&mut plain, "second").await;
    assert_eq!(recv_text(&mut sub).await, "second");

    // `queue` capability: a queue.
    let mut qs = Sender::builder()
        .name("qs")
        .target(
            Target::builder()
                .address("jobs")
                .capabilities(queue())
                .build(),
        )
        .attach(&mut session)
        .await
        .expect("queue sender");
    send_accepted(&mut qs, "job").await;
    assert_eq!(broker.core().queue_stats("jobs").map(|s| s.depth), Some(1));
    let mut qr = Receiver::builder()
        .name("qr")
        .source(
            Source::builder()
                .address("jobs")
                .capabilities(queue())
                .build(),
        )
        .attach(&mut session)
        .await
        .expect("queue receiver");
    assert_eq!(recv_text(&mut qr).await, "job");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn topic_subscriptions_non_durable_and_durable_across_restart() {
    let mut broker = TestBroker::start().await;
    // Non-durable: messages published while detached are not kept.
    {
        let (mut conn, mut session) = amqp::connect_session(&broker, "nd-client").await;
        let mut r = amqp::receiver(&mut session, "nd", "/topic/nd/t").await;
        let mut s = amqp::sender(&mut session, "s", "/topic/nd/t").await;
        send_accepted(&mut s, "live").await;
        assert_eq!(recv_text(&mut r).await, "live");
        r.close().await.expect("close");
        send_accepted(&mut s, "missed").await;
        let mut r = amqp::receiver(&mut session, "nd", "/topic/nd/t").await;
        recv_nothing(&mut r).await;
        conn.close().await.expect("close");
    }
    // Durable: keyed by container id and link name, kept across a detach,
    // a disconnect and a broker restart.
    {
        let mut conn = amqp::connect(&broker, "durable-client").await;
        let mut session = Session::begin(&mut conn).await.expect("begin");
        let r = Receiver::builder()
            .name("my-sub")
            .source(durable_source("/topic/d/news"))
            .attach(&mut session)
            .await
            .expect("durable receiver");
        if let Err((_, e)) = r.detach().await {
            panic!("detach keeps it: {e:?}");
        }
        conn.close().await.expect("close");
    }
    assert!(broker.queue("$durable/durable-client/my-sub").is_some());
    {
        let (mut conn, mut session) = amqp::connect_session(&broker, "publisher").await;
        let mut s = amqp::sender(&mut session, "s", "/topic/d/news").await;
        for i in 0..3 {
            let m = durable(&format!("while away {i}"));
            send_accepted(&mut s, m).await;
        }
        conn.close().await.expect("close");
    }
    broker.restart().await;
    {
        let mut conn = amqp::connect(&broker, "durable-client").await;
        let mut session = Session::begin(&mut conn).await.expect("begin");
        let mut r = Receiver::builder()
            .name("my-sub")
            .source(durable_source("/topic/d/news"))
            .attach(&mut session)
            .await
            .expect("resume durable receiver");
        for i in 0..3 {
            assert_eq!(recv_text(&mut r).await, format!("while away {i}"));
        }
        // Closing (not detaching) the link ends the subscription.
        r.close().await.expect("close");
        conn.close().await.expect("close");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(broker.queue("$durable/durable-client/my-sub").is_none());
    broker.stop().await;
}

#[tokio::test]
async fn dynamic_node_is_a_reply_to_for_stomp() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "requester").await;
    let mut reply = Receiver::builder()
        .name("reply")
        .source(Source::builder().dynamic(true).build())
        .attach(&mut session)
        .await
        .expect("dynamic receiver");
    let address = reply
        .source()
        .as_ref()
        .and_then(|s| s.address.clone())
        .expect("generated address");
    assert!(address.starts_with("/queue/"), "address {address}");
    let queue = address.trim_start_matches("/queue/").to_owned();
    assert!(broker.queue(&queue).is_some());

    // A STOMP responder answers to the reply-to.
    let mut stomp = StompClient::connect(broker.stomp(), &[]).await;
    stomp.subscribe("1", "/queue/requests", "auto", &[]).await;
    let mut s = amqp::sender(&mut session, "req", "/queue/requests").await;
    let request = Message::builder()
        .properties(Properties::builder().reply_to(address.clone()).build())
        .value("question")
        .build();
    send_accepted(&mut s, request).await;
    let got = stomp.message().await;
    assert_eq!(got.header("reply-to"), Some(address.as_str()));
    stomp
        .send_persistent(&address, &[("content-type", "text/plain")], b"answer")
        .await;
    let d: AnyDelivery = tokio::time::timeout(WAIT, reply.recv())
        .await
        .expect("reply in time")
        .expect("recv");
    match d.body() {
        Body::Value(v) => assert_eq!(v.0, Value::String("answer".into())),
        Body::Data(batch) => {
            assert_eq!(batch.first().map(|d| d.0.as_slice()), Some(&b"answer"[..]))
        }
        other => panic!("unexpected body {other:?}"),
    }
    reply.accept(&d).await.expect("accept");
    // The temporary queue lives as long as its owner's connection.
    conn.close().await.expect("close");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(broker.queue(&queue).is_none(), "temp queue gone");
    broker.stop().await;
}

#[tokio::test]
async fn anonymous_relay_routes_by_to() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "relay").await;
    let mut qr = amqp::receiver(&mut session, "qr", "/queue/relayed").await;
    let mut tr = amqp::receiver(&mut session, "tr", "/topic/relay/+").await;
    let mut relay = Sender::builder()
        .name("relay")
        .target(Target::builder().build())
        .attach(&mut session)
        .await
        .expect("anonymous relay sender");
    for (to, text) in [
        ("/queue/relayed", "to queue"),
        ("/topic/relay/x", "to topic"),
    ] {
        let m = Message::builder()
            .properties(Properties::builder().to(to).build())
            .value(text)
            .build();
        send_accepted(&mut relay, m).await;
    }
    assert_eq!(recv_text(&mut qr).await, "to queue");
    assert_eq!(recv_text(&mut tr).await, "to topic");
    // Without `to` (or with a bad one) the message is rejected, the link stays.
    let outcome = relay.send("nowhere").await.expect("send");
    assert!(matches!(outcome, Outcome::Rejected(_)), "{outcome:?}");
    let m = Message::builder()
        .properties(Properties::builder().to("/queue/bad#name").build())
        .value("bad")
        .build();
    let outcome = relay.send(m).await.expect("send");
    assert!(matches!(outcome, Outcome::Rejected(_)), "{outcome:?}");
    let m = Message::builder()
        .properties(Properties::builder().to("relayed").build())
        .value("bare to")
        .build();
    send_accepted(&mut relay, m).await;
    assert_eq!(recv_text(&mut qr).await, "bare to");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn credit_of_one_and_drain() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "credit").await;
    let mut s = amqp::sender(&mut session, "s", "/queue/credit").await;
    for i in 0..3 {
        send_accepted(&mut s, &format!("c{i}")).await;
    }
    let mut r = amqp::manual_receiver(&mut session, "r", "/queue/credit").await;
    recv_nothing(&mut r).await; // no credit yet
    r.set_credit(1).await.expect("credit 1");
    assert_eq!(recv_text(&mut r).await, "c0");
    recv_nothing(&mut r).await;
    let stats = broker.core().queue_stats("credit").expect("queue");
    assert_eq!(stats.depth, 2);
    r.set_credit(1).await.expect("credit 1");
    assert_eq!(recv_text(&mut r).await, "c1");
    recv_nothing(&mut r).await;

    // Drain with more credit than messages: one arrives, the rest of the
    // credit is used up, so a later message stays queued.
    r.set_credit(5).await.expect("credit 5");
    r.drain().await.expect("drain");
    assert_eq!(recv_text(&mut r).await, "c2");
    tokio::time::sleep(Duration::from_millis(200)).await;
    send_accepted(&mut s, "after drain").await;
    recv_nothing(&mut r).await;
    assert_eq!(
        broker.core().queue_stats("credit").map(|s| s.depth),
        Some(1)
    );
    r.set_credit(1).await.expect("credit");
    assert_eq!(recv_text(&mut r).await, "after drain");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn sender_credit_window_is_refilled() {
    // A window of 2: 50 unsettled durable sends only finish if the broker
    // keeps granting credit as commits complete.
    let broker = TestBroker::start_with(
        |c| c.amqp.link_credit_window = 2,
        std::sync::Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "window").await;
    let mut s = amqp::sender(&mut session, "s", "/queue/window").await;
    for i in 0..50 {
        let m = durable(&format!("w{i}"));
        tokio::time::timeout(WAIT, s.send(m))
            .await
            .expect("credit refilled in time")
            .expect("send")
            .accepted_or_else(|o| o)
            .expect("accepted");
    }
    assert_eq!(
        broker.core().queue_stats("window").map(|s| s.depth),
        Some(50)
    );
    conn.close().await.expect("close");
    broker.stop().await;
}
