//! STOMP SEND/SUBSCRIBE/MESSAGE/ACK/NACK over real sockets: destinations
//! and header mapping, wildcards, the three ack modes, prefetch, durable
//! topic subscriptions across a restart, redelivery and dead-lettering.

mod common;

use std::sync::Arc;

use common::stomp::StompClient;
use common::TestBroker;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// Every mapped SEND header comes back on MESSAGE, the body exactly, and
/// the MESSAGE carries its own headers.
#[tokio::test]
async fn send_to_a_queue_maps_headers() {
    let broker = TestBroker::start().await;
    let mut consumer = StompClient::connect(broker.stomp(), &[]).await;
    consumer
        .subscribe("sub-1", "/queue/mapped", "client-individual", &[])
        .await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    let expires = (now_ms() + 3_600_000).to_string();
    p.request(
        "SEND",
        &[
            ("destination", "/queue/mapped"),
            ("content-type", "application/json;charset=utf-8"),
            ("reply-to", "/queue/replies"),
            ("correlation-id", "corr-42"),
            ("expires", &expires),
            ("priority", "7"),
            ("persistent", "true"),
            ("x-first", "1"),
            ("x-colon", r"a\cb"),
            ("x-first", "dup"),
        ],
        b"{\"k\":1}",
    )
    .await;
    let m = consumer.message().await;
    assert_eq!(m.body, b"{\"k\":1}");
    assert_eq!(m.header("subscription"), Some("sub-1"));
    assert_eq!(m.header("destination"), Some("/queue/mapped"));
    let id = m.header("message-id").expect("message-id");
    assert_eq!(
        m.header("ack"),
        Some(id),
        "1.2 ack id is the message id here"
    );
    assert_eq!(
        m.header("content-type"),
        Some("application/json;charset=utf-8")
    );
    assert_eq!(m.header("content-length"), Some("7"));
    assert_eq!(m.header("reply-to"), Some("/queue/replies"));
    assert_eq!(m.header("correlation-id"), Some("corr-42"));
    assert_eq!(m.header("expires"), Some(expires.as_str()));
    assert_eq!(m.header("priority"), Some("7"));
    assert_eq!(m.header("persistent"), Some("true"));
    assert_eq!(m.header("x-first"), Some("1"));
    assert_eq!(m.header("x-colon"), Some(r"a\cb"));
    assert_eq!(m.header("redelivered"), None);
    // Reserved SEND headers are not copied as properties.
    assert_eq!(m.header("receipt"), None);
    assert_eq!(m.all("destination").len(), 1);
    consumer.ack(&m).await;
    broker.stop().await;
}

/// Expired messages are not delivered; priority above 9 clamps to 9.
#[tokio::test]
async fn expired_messages_are_not_delivered() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    let past = (now_ms() - 1000).to_string();
    p.send_persistent("/queue/exp", &[("expires", &past)], b"stale")
        .await;
    p.send_persistent("/queue/exp", &[("priority", "200")], b"fresh")
        .await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/exp", "auto", &[]).await;
    let m = c.message().await;
    assert_eq!(m.text(), "fresh");
    assert_eq!(m.header("priority"), Some("9"));
    c.expect_nothing().await;
    broker.stop().await;
}

/// A topic copies every message to every subscriber; a queue gives each
/// message to one consumer.
#[tokio::test]
async fn topics_fan_out_and_queues_compete() {
    let broker = TestBroker::start().await;
    let mut t1 = StompClient::connect(broker.stomp(), &[]).await;
    let mut t2 = StompClient::connect(broker.stomp(), &[]).await;
    t1.subscribe("a", "/topic/news", "auto", &[]).await;
    t2.subscribe("b", "/topic/news", "client", &[]).await;
    let mut q1 = StompClient::connect(broker.stomp(), &[]).await;
    let mut q2 = StompClient::connect(broker.stomp(), &[]).await;
    q1.subscribe("a", "/queue/jobs", "auto", &[]).await;
    q2.subscribe("b", "/queue/jobs", "auto", &[]).await;

    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.request(
        "SEND",
        &[("destination", "/topic/news"), ("x-k", "v")],
        b"n1",
    )
    .await;
    for c in [&mut t1, &mut t2] {
        let m = c.message().await;
        assert_eq!(
            (m.text().as_str(), m.header("destination")),
            ("n1", Some("/topic/news"))
        );
        assert_eq!(m.header("x-k"), Some("v"));
    }
    assert_eq!(t1.message_or_none().await, None);
    for i in 0..4 {
        p.send_persistent("/queue/jobs", &[], format!("j{i}").as_bytes())
            .await;
    }
    let mut got = Vec::new();
    for c in [&mut q1, &mut q2] {
        while let Some(m) = c.message_or_none().await {
            got.push(m);
        }
    }
    let mut bodies: Vec<String> = got.iter().map(|m| m.text()).collect();
    bodies.sort();
    assert_eq!(bodies, ["j0", "j1", "j2", "j3"]);
    broker.stop().await;
}

/// `/temp-queue/x` is private to its connection; a `reply-to` naming it is
/// rewritten to an address other clients can send to.
#[tokio::test]
async fn temp_queues_for_request_reply() {
    let broker = TestBroker::start().await;
    let mut requester = StompClient::connect(broker.stomp(), &[]).await;
    requester
        .subscribe("replies", "/temp-queue/replies", "auto", &[])
        .await;
    let mut server = StompClient::connect(broker.stomp(), &[]).await;
    server
        .subscribe("req", "/queue/requests", "auto", &[])
        .await;
    requester
        .request(
            "SEND",
            &[
                ("destination", "/queue/requests"),
                ("reply-to", "/temp-queue/replies"),
                ("correlation-id", "c1"),
            ],
            b"ping",
        )
        .await;
    let req = server.message().await;
    let reply_to = req.header("reply-to").expect("reply-to").to_owned();
    assert!(reply_to.starts_with("/queue/"), "{reply_to}");
    server
        .request(
            "SEND",
            &[("destination", &reply_to), ("correlation-id", "c1")],
            b"pong",
        )
        .await;
    let reply = requester.message().await;
    assert_eq!(reply.text(), "pong");
    assert_eq!(reply.header("subscription"), Some("replies"));
    assert_eq!(reply.header("correlation-id"), Some("c1"));
    // Sending to /temp-queue/replies itself reaches the owner's own queue.
    requester
        .request("SEND", &[("destination", "/temp-queue/replies")], b"self")
        .await;
    assert_eq!(requester.message().await.text(), "self");
    let name = reply_to.trim_start_matches("/queue/").to_owned();
    assert!(broker.queue(&name).is_some());
    drop(requester);
    // The temporary queue lives as long as its connection.
    let mut gone = false;
    for _ in 0..100 {
        if broker.queue(&name).is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(gone, "temporary queue {name} outlived its connection");
    broker.stop().await;
}

#[tokio::test]
async fn wildcard_subscriptions() {
    let broker = TestBroker::start().await;
    let mut plus = StompClient::connect(broker.stomp(), &[]).await;
    plus.subscribe("p", "/topic/a/+/c", "auto", &[]).await;
    let mut hash = StompClient::connect(broker.stomp(), &[]).await;
    hash.subscribe("h", "/topic/a/#", "auto", &[]).await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    for topic in ["a/b/c", "a/b/d", "a/b/c/d", "a", "x/b/c", "a/zz/c"] {
        p.request(
            "SEND",
            &[("destination", &format!("/topic/{topic}"))],
            topic.as_bytes(),
        )
        .await;
    }
    let mut got_plus = Vec::new();
    while let Some(m) = plus.message_or_none().await {
        assert_eq!(
            m.header("destination"),
            Some(format!("/topic/{}", m.text()).as_str())
        );
        got_plus.push(m.text());
    }
    assert_eq!(got_plus, ["a/b/c", "a/zz/c"]);
    let mut got_hash = Vec::new();
    while let Some(m) = hash.message_or_none().await {
        got_hash.push(m.text());
    }
    assert_eq!(got_hash, ["a/b/c", "a/b/d", "a/b/c/d", "a", "a/zz/c"]);
    broker.stop().await;
}

/// ack=auto: settled as sent, no `ack` header.
#[tokio::test]
async fn ack_auto() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_numbered("/queue/auto", 3).await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/auto", "auto", &[]).await;
    for i in 0..3 {
        let m = c.message().await;
        assert_eq!(m.text(), format!("m{i}"));
        assert_eq!(m.header("ack"), None);
    }
    c.request("UNSUBSCRIBE", &[("id", "s")], b"").await;
    assert_eq!(broker.queue("auto"), Some((0, 0)));
    broker.stop().await;
}

/// ack=client is cumulative: acking the third settles the first three.
#[tokio::test]
async fn ack_client_is_cumulative() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_numbered("/queue/cumul", 5).await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/cumul", "client", &[]).await;
    let msgs: Vec<_> = c.messages(5).await;
    c.ack(&msgs[2]).await;
    assert_eq!(broker.queue("cumul"), Some((0, 2)));
    // Acking an already covered message is an error (unknown id).
    c.send_frame("ACK", &[("id", &msgs[1].ack_id()), ("receipt", "r")], b"")
        .await;
    let err = c.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("unknown message id"));
    assert_eq!(err.header("receipt-id"), Some("r"));
    // m3 and m4 were unacknowledged at the close: redelivered.
    let mut c2 = StompClient::connect(broker.stomp(), &[]).await;
    c2.subscribe("s", "/queue/cumul", "client", &[]).await;
    let again = c2.messages(2).await;
    assert_eq!(
        again.iter().map(|m| m.text()).collect::<Vec<_>>(),
        ["m3", "m4"]
    );
    for m in &again {
        assert_eq!(m.header("redelivered"), Some("true"));
        assert_eq!(m.header("delivery-count"), Some("1"));
    }
    c2.ack(&again[1]).await;
    assert_eq!(broker.queue("cumul"), Some((0, 0)));
    broker.stop().await;
}

/// ack=client-individual settles only the acked message; the rest are
/// redelivered (count raised) after a disconnect.
#[tokio::test]
async fn ack_client_individual_and_unacked_at_disconnect() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_numbered("/queue/indiv", 3).await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/indiv", "client-individual", &[])
        .await;
    let msgs = c.messages(3).await;
    c.ack(&msgs[1]).await;
    assert_eq!(broker.queue("indiv"), Some((0, 2)));
    // A clean DISCONNECT with a receipt: RECEIPT, then the server closes.
    c.send_frame("DISCONNECT", &[("receipt", "bye")], b"").await;
    c.expect_receipt("bye").await;
    c.expect_closed().await;

    let mut c2 = StompClient::connect(broker.stomp(), &[]).await;
    c2.subscribe("s", "/queue/indiv", "client-individual", &[])
        .await;
    let again = c2.messages(2).await;
    assert_eq!(
        again.iter().map(|m| m.text()).collect::<Vec<_>>(),
        ["m0", "m2"]
    );
    for m in &again {
        assert_eq!(m.header("redelivered"), Some("true"));
        assert_eq!(m.header("delivery-count"), Some("1"));
    }
    // Dropping the TCP connection without DISCONNECT counts as well.
    drop(c2);
    let mut c3 = StompClient::connect(broker.stomp(), &[]).await;
    c3.subscribe("s", "/queue/indiv", "client-individual", &[])
        .await;
    let third = c3.messages(2).await;
    for m in &third {
        assert_eq!(m.header("delivery-count"), Some("2"), "{m:?}");
        c3.ack(m).await;
    }
    assert_eq!(broker.queue("indiv"), Some((0, 0)));
    broker.stop().await;
}

/// A prefetch header bounds the unacknowledged messages of a subscription.
#[tokio::test]
async fn prefetch_limits_unacknowledged_messages() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_numbered("/queue/pf", 6).await;
    for (header, n) in [("activemq.prefetchSize", "2"), ("prefetch-count", "3")] {
        let mut c = StompClient::connect(broker.stomp(), &[]).await;
        c.subscribe("s", "/queue/pf", "client-individual", &[(header, n)])
            .await;
        let n: usize = n.parse().expect("number");
        let msgs = c.messages(n).await;
        c.expect_nothing().await;
        c.ack(&msgs[0]).await;
        let next = c.message().await;
        c.expect_nothing().await;
        // Leave: everything goes back, one message consumed.
        drop((msgs, next));
        c.send_frame("DISCONNECT", &[("receipt", "x")], b"").await;
        c.expect_receipt("x").await;
    }
    assert_eq!(broker.core().queue_stats("pf").map(|s| s.depth), Some(4));
    broker.stop().await;
}

/// Durable topic subscriptions (ActiveMQ `activemq.subscriptionName`, and
/// RabbitMQ `durable:true` keyed by id) keep what was published while the
/// client was away, across a broker restart.
#[tokio::test]
async fn durable_topic_subscription_across_restart() {
    let mut broker = TestBroker::start().await;
    let mut c = StompClient::connect(broker.stomp(), &[("client-id", "dur-client")]).await;
    c.subscribe(
        "s1",
        "/topic/events/#",
        "client-individual",
        &[("activemq.subscriptionName", "amq-sub")],
    )
    .await;
    c.subscribe(
        "rabbit-sub",
        "/topic/events/b",
        "client",
        &[("durable", "true")],
    )
    .await;
    c.send_frame("DISCONNECT", &[("receipt", "bye")], b"").await;
    c.expect_receipt("bye").await;

    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/topic/events/a", &[("x-k", "1")], b"while away a")
        .await;
    p.send_persistent("/topic/events/b", &[], b"while away b")
        .await;
    drop(p);
    broker.restart().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/topic/events/a", &[], b"after restart")
        .await;

    let mut c = StompClient::connect(broker.stomp(), &[("client-id", "dur-client")]).await;
    c.subscribe(
        "s1",
        "/topic/events/#",
        "client-individual",
        &[("activemq.subscriptionName", "amq-sub")],
    )
    .await;
    let got = c.messages(3).await;
    assert_eq!(
        got.iter().map(|m| m.text()).collect::<Vec<_>>(),
        ["while away a", "while away b", "after restart"]
    );
    assert_eq!(got[0].header("x-k"), Some("1"));
    assert_eq!(got[0].header("destination"), Some("/topic/events/a"));
    for m in &got {
        c.ack(m).await;
    }
    c.subscribe(
        "rabbit-sub",
        "/topic/events/b",
        "client",
        &[("durable", "true")],
    )
    .await;
    let m = c.message().await;
    assert_eq!(m.text(), "while away b");
    c.ack(&m).await;
    c.expect_nothing().await;
    // A non-durable subscription gets nothing from before it existed.
    let mut other = StompClient::connect(broker.stomp(), &[]).await;
    other.subscribe("x", "/topic/events/#", "auto", &[]).await;
    other.expect_nothing().await;
    // UNSUBSCRIBE with the durable header removes the subscription.
    c.request(
        "UNSUBSCRIBE",
        &[("id", "s1"), ("activemq.subscriptionName", "amq-sub")],
        b"",
    )
    .await;
    p.send_persistent("/topic/events/a", &[], b"after unsubscribe")
        .await;
    c.subscribe(
        "s1",
        "/topic/events/#",
        "client-individual",
        &[("activemq.subscriptionName", "amq-sub")],
    )
    .await;
    c.expect_nothing().await;
    broker.stop().await;
}

/// NACK redelivers with the count raised, and after
/// `broker.delivery_attempts_max` attempts the message is dead-lettered.
#[tokio::test]
async fn nack_redelivery_and_dead_letter() {
    let broker = TestBroker::start_with(
        |c| c.broker.delivery_attempts_max = 3,
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let dlq = broker.config.broker.dead_letter_address.to_destination();
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/queue/poison", &[("x-k", "v")], b"poison")
        .await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/poison", "client-individual", &[])
        .await;
    let m = c.message().await;
    assert_eq!(m.header("redelivered"), None);
    c.request("NACK", &[("id", &m.ack_id())], b"").await;
    let m = c.message().await;
    assert_eq!(m.header("redelivered"), Some("true"));
    assert_eq!(m.header("delivery-count"), Some("1"));
    c.request("NACK", &[("id", &m.ack_id())], b"").await;
    let m = c.message().await;
    assert_eq!(m.header("delivery-count"), Some("2"));
    c.request("NACK", &[("id", &m.ack_id())], b"").await;
    // Third failed attempt: gone to the dead-letter queue.
    c.expect_nothing().await;
    assert_eq!(broker.queue("poison"), Some((0, 0)));
    let mut d = StompClient::connect(broker.stomp(), &[]).await;
    d.subscribe("d", &dlq, "client-individual", &[]).await;
    let dead = d.message().await;
    assert_eq!(dead.text(), "poison");
    assert_eq!(dead.header("x-k"), Some("v"));
    d.ack(&dead).await;

    c.send_frame("DISCONNECT", &[("receipt", "bye")], b"").await;
    c.expect_receipt("bye").await;

    // Unacknowledged at disconnect counts as a failed attempt too.
    p.send_persistent("/queue/poison", &[], b"abandoned").await;
    for attempt in 0..3 {
        let mut c = StompClient::connect(broker.stomp(), &[]).await;
        c.subscribe("s", "/queue/poison", "client", &[]).await;
        let m = c.message().await;
        assert_eq!(m.text(), "abandoned");
        if attempt > 0 {
            assert_eq!(
                m.header("delivery-count"),
                Some(attempt.to_string().as_str())
            );
        }
    }
    let dead = d.message().await;
    assert_eq!(dead.text(), "abandoned");
    // NACK is not part of STOMP 1.0.
    let (mut old, _) = StompClient::connect_version(broker.stomp(), "1.0", &[]).await;
    old.send_frame("NACK", &[("message-id", "1-1")], b"").await;
    let err = old.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("unsupported command"));
    broker.stop().await;
}

/// ACK/NACK in 1.1 name the message by `message-id` and `subscription`.
#[tokio::test]
async fn ack_and_nack_in_1_1() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/queue/v11", &[], b"a").await;
    let (mut c, _) = StompClient::connect_version(broker.stomp(), "1.1", &[]).await;
    c.subscribe("s", "/queue/v11", "client", &[]).await;
    let m = c.message().await;
    let id = m.header("message-id").expect("message-id").to_owned();
    c.request("NACK", &[("message-id", &id), ("subscription", "s")], b"")
        .await;
    let m = c.message().await;
    assert_eq!(m.header("delivery-count"), Some("1"));
    let id = m.header("message-id").expect("message-id").to_owned();
    c.request("ACK", &[("message-id", &id), ("subscription", "s")], b"")
        .await;
    assert_eq!(broker.queue("v11"), Some((0, 0)));
    broker.stop().await;
}

/// The README's naming scheme: a bare destination is a queue, a queue
/// bound to a topic filter in the configuration gets a copy of every
/// matching topic message, and a `$`-topic is not matched by a leading
/// wildcard.
#[tokio::test]
async fn naming_scheme_addresses() {
    let broker = TestBroker::start_with(
        |c| {
            c.bindings.push(rosetta::config::Binding {
                queue: "orders".into(),
                filter: "orders/#".into(),
            })
        },
        Arc::new(rosetta::core::AllowAll),
    )
    .await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("bare-q", &[], b"bare").await;
    p.send_persistent("/topic/orders/eu/1", &[], b"via binding")
        .await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("b", "/queue/bare-q", "auto", &[]).await;
    let m = c.message().await;
    assert_eq!(m.text(), "bare");
    assert_eq!(m.header("destination"), Some("/queue/bare-q"));
    c.subscribe("o", "/queue/orders", "auto", &[]).await;
    let m = c.message().await;
    assert_eq!(m.text(), "via binding");
    assert_eq!(m.header("subscription"), Some("o"));

    c.subscribe("all", "/topic/#", "auto", &[]).await;
    c.subscribe("sys", "/topic/$SYS/#", "auto", &[]).await;
    p.request("SEND", &[("destination", "/topic/$SYS/load")], b"sys")
        .await;
    let m = c.message().await;
    assert_eq!(m.header("subscription"), Some("sys"));
    c.expect_nothing().await;
    broker.stop().await;
}

/// UNSUBSCRIBE gives unacknowledged messages back to the queue (another
/// consumer gets them, marked redelivered); their ids are then unknown.
#[tokio::test]
async fn unsubscribe_returns_unacked_messages() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/queue/unsub", &[], b"u1").await;
    let mut a = StompClient::connect(broker.stomp(), &[]).await;
    a.subscribe("s", "/queue/unsub", "client", &[]).await;
    let m = a.message().await;
    a.request("UNSUBSCRIBE", &[("id", "s")], b"").await;
    let mut b = StompClient::connect(broker.stomp(), &[]).await;
    b.subscribe("s", "/queue/unsub", "client", &[]).await;
    let again = b.message().await;
    assert_eq!(again.text(), "u1");
    assert_eq!(again.header("redelivered"), Some("true"));
    b.ack(&again).await;
    a.send_frame("ACK", &[("id", &m.ack_id()), ("receipt", "late")], b"")
        .await;
    let err = a.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("unknown message id"));
    assert_eq!(err.header("receipt-id"), Some("late"));
    broker.stop().await;
}

/// A second connection with the same `client-id` takes over: the first
/// gets an ERROR and is closed, the second keeps the durable subscription.
#[tokio::test]
async fn client_id_take_over() {
    let broker = TestBroker::start().await;
    let mut first = StompClient::connect(broker.stomp(), &[("client-id", "same")]).await;
    first
        .subscribe(
            "d",
            "/topic/take/over",
            "client-individual",
            &[("activemq.subscriptionName", "d")],
        )
        .await;
    let mut second = StompClient::connect(broker.stomp(), &[("client-id", "same")]).await;
    let err = first.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("session closed"), "{err:?}");
    second
        .subscribe(
            "d",
            "/topic/take/over",
            "client-individual",
            &[("activemq.subscriptionName", "d")],
        )
        .await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/topic/take/over", &[], b"to the new one")
        .await;
    let m = second.message().await;
    assert_eq!(m.text(), "to the new one");
    second.ack(&m).await;
    broker.stop().await;
}

/// Many 1 KiB persistent messages through one producer and two prefetch-
/// limited consumers acking as they go: each arrives exactly once.
#[tokio::test]
async fn volume_with_prefetch_and_acks() {
    const N: usize = 3000;
    let broker = TestBroker::start().await;
    let addr = broker.stomp();
    // Received by both consumers together: each stops once all arrived.
    let total = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let consumer = |name: &'static str| {
        let total = Arc::clone(&total);
        tokio::spawn(async move {
            use std::sync::atomic::Ordering;
            let mut c = StompClient::connect(addr, &[]).await;
            c.subscribe(
                "s",
                "/queue/volume",
                "client-individual",
                &[("activemq.prefetchSize", "20")],
            )
            .await;
            let mut got = Vec::new();
            let mut idle = std::time::Instant::now();
            while total.load(Ordering::SeqCst) < N {
                let Some(m) = c.recv_within(std::time::Duration::from_millis(50)).await else {
                    assert!(
                        idle.elapsed() < common::stomp::TIMEOUT,
                        "{name}: stalled at {} of {N}",
                        total.load(Ordering::SeqCst)
                    );
                    continue;
                };
                idle = std::time::Instant::now();
                assert_eq!(m.command, "MESSAGE", "{name}: {m:?}");
                assert_eq!(m.body.len(), 1024);
                let id = m.ack_id();
                c.send_frame("ACK", &[("id", &id)], b"").await;
                got.push(String::from_utf8_lossy(&m.body[..12]).into_owned());
                total.fetch_add(1, Ordering::SeqCst);
            }
            // ACKs are not receipted: let the last ones land before the check.
            c.request("BEGIN", &[("transaction", "sync")], b"").await;
            got
        })
    };
    let c1 = consumer("c1");
    let c2 = consumer("c2");
    let mut p = StompClient::connect(addr, &[]).await;
    let mut bytes = Vec::new();
    for i in 0..N {
        let mut body = format!("{i:012}").into_bytes();
        body.resize(1024, b'.');
        let mut h = vec![("destination", "/queue/volume"), ("persistent", "true")];
        let last = format!("{i}");
        if i + 1 == N {
            h.push(("receipt", &last));
        }
        bytes.extend(common::stomp::encode("SEND", &h, &body));
    }
    p.send_raw(&bytes).await;
    p.expect_receipt(&format!("{}", N - 1)).await;
    let mut all: Vec<String> = c1.await.expect("c1");
    let n1 = all.len();
    all.extend(c2.await.expect("c2"));
    assert!(n1 > 0 && n1 < N, "both consumers got work: {n1}");
    all.sort();
    all.dedup();
    assert_eq!(all.len(), N, "every message exactly once");
    assert_eq!(broker.queue("volume"), Some((0, 0)));
    broker.stop().await;
}

/// STOMP 1.0: SUBSCRIBE without `id` (the destination names it), MESSAGE
/// without `subscription`, ACK by `message-id`, UNSUBSCRIBE by destination.
#[tokio::test]
async fn stomp_1_0_subscribe_ack_unsubscribe() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/queue/old", &[], b"o1").await;
    p.send_persistent("/queue/old", &[], b"o2").await;
    let (mut c, _) = StompClient::connect_version(broker.stomp(), "", &[]).await;
    c.request(
        "SUBSCRIBE",
        &[("destination", "/queue/old"), ("ack", "client")],
        b"",
    )
    .await;
    let m = c.messages(2).await;
    assert_eq!(m[0].header("subscription"), None, "{:?}", m[0]);
    assert_eq!(m[0].header("ack"), None);
    let id = m[1].header("message-id").expect("message-id").to_owned();
    c.request("ACK", &[("message-id", &id)], b"").await;
    assert_eq!(broker.queue("old"), Some((0, 0)));
    c.request("UNSUBSCRIBE", &[("destination", "/queue/old")], b"")
        .await;
    p.send_persistent("/queue/old", &[], b"o3").await;
    c.expect_nothing().await;
    broker.stop().await;
}

/// A message that expires while it waits in the queue is not delivered.
#[tokio::test]
async fn messages_expire_in_the_queue() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    let soon = (now_ms() + 300).to_string();
    p.send_persistent("/queue/ttl", &[("expires", &soon)], b"short-lived")
        .await;
    p.send_persistent("/queue/ttl", &[], b"long-lived").await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/ttl", "auto", &[]).await;
    assert_eq!(c.message().await.text(), "long-lived");
    c.expect_nothing().await;
    broker.stop().await;
}

/// A durable subscription belongs to one destination: SUBSCRIBE with the
/// same name and another destination replaces it (JMS semantics) instead
/// of adding a second topic to it, also after a restart. The same
/// destination again keeps what it holds.
#[tokio::test]
async fn durable_subscription_moved_to_another_destination() {
    let mut broker = TestBroker::start().await;
    let durable = [("activemq.subscriptionName", "moving")];
    let mut c = StompClient::connect(broker.stomp(), &[("client-id", "mover")]).await;
    c.subscribe("d", "/topic/old", "client-individual", &durable)
        .await;
    c.disconnect().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/topic/old", &[], b"old-1").await;

    // Same destination: kept, across a restart.
    drop(p);
    broker.restart().await;
    let mut c = StompClient::connect(broker.stomp(), &[("client-id", "mover")]).await;
    c.subscribe("d", "/topic/old", "client-individual", &durable)
        .await;
    let m = c.message().await;
    assert_eq!(m.text(), "old-1");
    c.ack(&m).await;
    c.disconnect().await;

    // Another destination: a new subscription, the old topic is left.
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/topic/old", &[], b"old-2").await;
    let mut c = StompClient::connect(broker.stomp(), &[("client-id", "mover")]).await;
    c.subscribe("d", "/topic/new", "client-individual", &durable)
        .await;
    p.send_persistent("/topic/old", &[], b"old-3").await;
    p.send_persistent("/topic/new", &[], b"new-1").await;
    let m = c.message().await;
    assert_eq!(m.text(), "new-1");
    assert_eq!(m.header("destination"), Some("/topic/new"));
    c.ack(&m).await;
    c.expect_nothing().await;
    broker.stop().await;
}

/// Two subscriptions of one connection to the same topic each get a copy;
/// the queues behind non-durable topic subscriptions go away with
/// UNSUBSCRIBE and with the connection.
#[tokio::test]
async fn topic_subscription_queues_do_not_leak() {
    let broker = TestBroker::start().await;
    let before = broker.core().queue_names().len();
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("one", "/topic/twice", "auto", &[]).await;
    c.subscribe("two", "/topic/twice", "client", &[]).await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.request("SEND", &[("destination", "/topic/twice")], b"x")
        .await;
    let got = c.messages(2).await;
    let mut subs: Vec<&str> = got
        .iter()
        .filter_map(|m| m.header("subscription"))
        .collect();
    subs.sort();
    assert_eq!(subs, ["one", "two"]);
    assert_eq!(broker.core().queue_names().len(), before + 2);
    c.request("UNSUBSCRIBE", &[("id", "one")], b"").await;
    assert_eq!(broker.core().queue_names().len(), before + 1);
    c.disconnect().await;
    let mut gone = false;
    for _ in 0..100 {
        if broker.core().queue_names().len() == before {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        gone,
        "subscription queues left: {:?}",
        broker.core().queue_names()
    );
    broker.stop().await;
}
