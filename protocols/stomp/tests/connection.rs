//! The connection state machine driven directly: fake core, virtual clock.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns: a panic is a test failure

mod common;

use common::{delivery, last_consumer, Call, Harness};
use rosetta_neutral::*;
use rosetta_stomp::{Command, StompConfig};

fn send_calls(calls: &[Call]) -> Vec<(Address, Message, PublishOptions)> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Publish(a, m, o) => Some((a.clone(), m.clone(), *o)),
            _ => None,
        })
        .collect()
}

fn assert_error_and_closed(h: &mut Harness, message: &str) -> rosetta_stomp::Frame {
    let frames = h.frames();
    let f = frames.last().cloned().expect("an ERROR frame");
    assert_eq!(f.command, Command::Error, "{frames:?}");
    assert_eq!(f.header("message"), Some(message), "{f:?}");
    assert!(!f.body.is_empty(), "ERROR explains itself");
    let reason = h.conn.error().expect("the reason is kept").to_string();
    assert!(String::from_utf8_lossy(&f.body).starts_with(&reason));
    assert!(h.conn.is_closed());
    assert!(!h.conn.wants_input());
    f
}

// ---- CONNECT ----

#[test]
fn connect_negotiates_the_highest_common_version() {
    let mut h = Harness::new();
    let f = h.connect("1.0,1.1", "heart-beat:0,0\n");
    assert_eq!(f.header("version"), Some("1.1"));
    assert_eq!(f.header("heart-beat"), Some("0,0"));
    assert!(f.header("server").unwrap().starts_with("Rosetta/"));
    assert_eq!(f.header("session"), Some("rosetta-7"));
    assert_eq!(h.conn.version(), Some(rosetta_stomp::Version::V1_1));

    let mut h = Harness::new();
    h.input(b"STOMP\naccept-version:1.2,2.0\nhost:x\n\n\0");
    assert_eq!(h.frame().header("version"), Some("1.2"));
}

#[test]
fn connect_without_accept_version_is_stomp_1_0() {
    let mut h = Harness::new();
    h.input(b"CONNECT\nlogin:guest\npasscode:guest\n\n\0");
    let f = h.frame();
    assert_eq!(f.command, Command::Connected);
    assert_eq!(
        f.header("version"),
        None,
        "1.0 CONNECTED has no version header"
    );
    assert_eq!(h.conn.version(), Some(rosetta_stomp::Version::V1_0));
    match &h.calls()[0] {
        Call::Open(info) => {
            assert_eq!(info.protocol, Protocol::Stomp);
            assert_eq!(info.principal.user.as_deref(), Some("guest"));
            assert_eq!(info.conn_id, 7);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsupported_version_is_refused() {
    let mut h = Harness::new();
    h.input(b"CONNECT\naccept-version:2.0\n\n\0");
    let f = assert_error_and_closed(&mut h, "unsupported protocol version");
    assert_eq!(f.header("version"), Some("1.0,1.1,1.2"));
}

#[test]
fn bad_credentials_get_an_error_and_no_session() {
    let mut h = Harness::new();
    h.input(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:nope\nreceipt:r1\n\n\0");
    let f = assert_error_and_closed(&mut h, "authentication failed");
    assert_eq!(f.header("receipt-id"), Some("r1"));
    assert!(h.calls().is_empty(), "no session opened");
}

#[test]
fn client_id_is_passed_to_the_core() {
    let mut h = Harness::new();
    h.input(b"CONNECT\naccept-version:1.2\nclient-id:app-1\n\n\0");
    h.frame();
    match &h.calls()[0] {
        Call::Open(info) => {
            assert_eq!(info.client_id.as_deref(), Some("app-1"));
            assert!(info.take_over);
        }
        other => panic!("{other:?}"),
    }
}

// ---- SEND ----

#[test]
fn send_maps_headers_to_the_neutral_message() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(
        b"SEND\ndestination:/topic/a/b\ncontent-type:application/json\nreply-to:/queue/replies\n\
correlation-id:c-1\nexpires:1700000000000\npriority:7\npersistent:true\nx-b:2\nx-a:1\nx-b:3\n\
content-length:4\n\n{\0}\n\0",
    );
    let sends = send_calls(&h.take_calls());
    assert_eq!(sends.len(), 1);
    let (address, m, options) = &sends[0];
    assert_eq!(address, &Address::Topic("a/b".into()));
    assert_eq!(m.content_type.as_deref(), Some("application/json"));
    assert_eq!(m.reply_to.as_deref(), Some("/queue/replies"));
    assert_eq!(m.correlation_id, Some(MessageId::String("c-1".into())));
    assert_eq!(m.expiry, Some(1_700_000_000_000));
    assert_eq!(m.priority, 7);
    assert!(m.durable);
    assert!(options.confirm, "persistent sends wait for the journal");
    assert_eq!(options.txn, None);
    assert_eq!(&m.body.bytes[..], b"{\0}\n", "body bytes preserved exactly");
    assert_eq!(
        m.body.kind,
        BodyKind::Binary,
        "content-length and not text/*"
    );
    let props: Vec<(String, String)> = m
        .properties
        .iter()
        .map(|(n, v)| (n.to_owned(), v.to_text()))
        .collect();
    let expected: Vec<(String, String)> = [("x-b", "2"), ("x-a", "1"), ("x-b", "3")]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    assert_eq!(props, expected, "custom headers in order, repeats kept");
    assert!(matches!(m.properties.get("x-a"), Some(Value::String(s)) if s == "1"));
}

#[test]
fn body_kind_follows_content_type_and_length() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\ndestination:q\n\nhello\0");
    h.input(b"SEND\ndestination:q\ncontent-length:2\n\nhi\0");
    h.input(b"SEND\ndestination:q\ncontent-type:text/plain\ncontent-length:2\n\nhi\0");
    h.input(b"SEND\ndestination:q\n\n\xff\xfe\0");
    h.input(b"SEND\ndestination:q\ncontent-type:text/plain\ncontent-length:1\n\n\xff\0");
    let kinds: Vec<BodyKind> = send_calls(&h.take_calls())
        .into_iter()
        .map(|(a, m, _)| {
            assert_eq!(a, Address::Queue("q".into()), "bare name is a queue");
            m.body.kind
        })
        .collect();
    use BodyKind::*;
    assert_eq!(kinds, vec![Text, Binary, Text, Binary, Binary]);
}

#[test]
fn non_persistent_send_without_receipt_needs_no_confirm() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\ndestination:/queue/q\n\nx\0");
    let sends = send_calls(&h.take_calls());
    assert!(!sends[0].2.confirm);
    assert!(!sends[0].1.durable);
    assert!(h.frames().is_empty());
}

#[test]
fn receipt_waits_for_the_commit() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\ndestination:/queue/q\npersistent:true\nreceipt:77\n\nx\0");
    assert!(
        h.frames().is_empty(),
        "no RECEIPT before the journal commit"
    );
    let sends = send_calls(&h.take_calls());
    assert!(sends[0].2.confirm);
    let tickets = h.tickets();
    assert_eq!(tickets.len(), 1);
    h.commit(Ticket(999)); // someone else's ticket changes nothing
    assert!(h.frames().is_empty());
    h.commit(tickets[0]);
    let f = h.frame();
    assert_eq!(f.command, Command::Receipt);
    assert_eq!(f.header("receipt-id"), Some("77"));
}

#[test]
fn failed_commit_is_an_error_with_the_receipt_id() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\ndestination:/queue/q\npersistent:true\nreceipt:r9\n\nx\0");
    h.event(SessionEvent::Committed {
        ticket: h.tickets()[0],
        result: Err(BrokerError::Storage("disk full".into())),
    });
    let f = assert_error_and_closed(&mut h, "storage failure: the operation is not durable");
    assert_eq!(f.header("receipt-id"), Some("r9"));
    assert!(matches!(
        h.calls().last(),
        Some(Call::Close(CloseKind::Abnormal))
    ));
}

#[test]
fn receipts_are_released_in_frame_order() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\ndestination:/queue/q\npersistent:true\n\nx\0");
    h.input(b"SUBSCRIBE\nid:s\ndestination:/queue/q\nreceipt:after-send\n\n\0");
    assert!(
        h.frames().is_empty(),
        "the earlier persistent SEND is not durable yet"
    );
    h.commit(h.tickets()[0]);
    assert_eq!(h.frame().header("receipt-id"), Some("after-send"));
}

#[test]
fn a_run_of_commits_releases_its_receipts_in_frame_order() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    for r in ["a", "b", "c"] {
        h.input(
            format!("SEND\ndestination:/queue/q\npersistent:true\nreceipt:{r}\n\nx\0").as_bytes(),
        );
    }
    let t = h.tickets();
    assert_eq!(t.len(), 3);
    // The later two first: nothing until the first frame's commit.
    h.event(SessionEvent::CommittedRun {
        tickets: vec![t[1], t[2]],
    });
    assert!(h.frames().is_empty(), "'a' is not durable yet");
    h.event(SessionEvent::CommittedRun {
        tickets: vec![t[0], Ticket(999)],
    });
    let ids: Vec<_> = h
        .frames()
        .iter()
        .map(|f| f.header("receipt-id").map(str::to_owned))
        .collect();
    assert_eq!(ids, [Some("a".into()), Some("b".into()), Some("c".into())]);
}

#[test]
fn temp_queues_are_declared_per_connection_and_reply_to_is_rewritten() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\ndestination:/queue/requests\nreply-to:/temp-queue/r\n\nping\0");
    h.input(b"SUBSCRIBE\nid:replies\ndestination:/temp-queue/r\n\n\0");
    h.input(b"SEND\ndestination:/temp-queue/r\n\nself\0");
    let calls = h.take_calls();
    let declares: Vec<&QueueSpec> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Declare(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(declares.len(), 1, "declared once, then reused");
    assert_eq!(declares[0].name, None);
    assert_eq!(declares[0].lifetime, QueueLifetime::Session);
    assert!(!declares[0].durable);
    let sends = send_calls(&calls);
    let generated = "$temp/gen-1";
    assert_eq!(sends[0].1.reply_to.as_deref(), Some("/queue/$temp/gen-1"));
    assert_eq!(sends[1].0, Address::Queue(generated.into()));
    assert_eq!(last_consumer(&calls).1.queue, generated);
}

#[test]
fn send_to_a_wildcard_topic_is_refused() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\ndestination:/topic/a/#\n\nx\0");
    assert_error_and_closed(&mut h, "invalid destination");
}

// ---- SUBSCRIBE and MESSAGE ----

#[test]
fn topic_subscription_declares_binds_consumes_and_delivers() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:sub-1\ndestination:/topic/a/+/c\n\n\0");
    let calls = h.take_calls();
    match &calls[..] {
        [Call::Declare(spec), Call::Bind(q, filter), Call::Consume(c, _)] => {
            assert_eq!(spec.name, None);
            assert!(!spec.durable);
            assert_eq!(spec.lifetime, QueueLifetime::Consumer);
            assert_eq!(filter, "a/+/c");
            assert_eq!(&c.queue, q);
            assert!(c.auto_settle, "ack defaults to auto");
            assert_eq!(
                c.credit,
                CreditMode::Window(rosetta_stomp::config::PREFETCH_DEFAULT)
            );
        }
        other => panic!("{other:?}"),
    }
    let (consumer, _) = last_consumer(&calls);
    let mut m = Message::text("hello");
    m.address = Some(Address::Topic("a/b/c".into()));
    m.content_type = Some("text/plain".into());
    m.properties.push("we:ird", "li\nne");
    m.properties.push("n", Value::Int(5));
    h.deliver(consumer, 3, m);
    let f = h.frame();
    assert_eq!(f.command, Command::Message);
    assert_eq!(f.header("subscription"), Some("sub-1"));
    assert_eq!(f.header("destination"), Some("/topic/a/b/c"));
    assert_eq!(
        f.header("message-id"),
        Some(format!("{consumer}-3").as_str())
    );
    assert_eq!(f.header("ack"), None, "auto mode needs no ack header");
    assert_eq!(f.header("content-type"), Some("text/plain"));
    assert_eq!(f.header("content-length"), Some("5"));
    assert_eq!(f.header("we:ird"), Some("li\nne"), "user headers escaped");
    assert_eq!(f.header("n"), Some("5"));
    assert_eq!(f.header("redelivered"), None);
    assert_eq!(&f.body[..], b"hello");
    // The escaping is on the wire.
    h.deliver(consumer, 4, {
        let mut m = Message::binary(&b"\0"[..]);
        m.properties.push("k", "a:b");
        m
    });
    let raw = h.raw_output();
    assert!(
        raw.windows(6).any(|w| w == b"k:a\\cb"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
}

#[test]
fn queue_subscription_consumes_the_queue_with_prefetch() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:1\ndestination:/queue/work\nack:client-individual\nactivemq.prefetchSize:10\n\n\0");
    h.input(b"SUBSCRIBE\nid:2\ndestination:other\nack:client\nprefetch-count:99999999\n\n\0");
    let calls = h.take_calls();
    let specs: Vec<ConsumerSpec> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Consume(s, _) => Some(s.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(specs.len(), 2);
    assert_eq!(specs[0].queue, "work");
    assert_eq!(specs[0].credit, CreditMode::Window(10));
    assert!(!specs[0].auto_settle);
    assert_eq!(specs[1].queue, "other");
    assert_eq!(
        specs[1].credit,
        CreditMode::Window(rosetta_stomp::config::PREFETCH_MAX)
    );
    assert!(!calls.iter().any(|c| matches!(c, Call::Declare(_))));
}

#[test]
fn subscribe_errors() {
    for (frame, message) in [
        (
            &b"SUBSCRIBE\ndestination:/queue/q\n\n\0"[..],
            "missing header",
        ),
        (b"SUBSCRIBE\nid:1\n\n\0", "missing header"),
        (
            b"SUBSCRIBE\nid:1\ndestination:/queue/q\nack:sometimes\n\n\0",
            "invalid header",
        ),
        (
            b"SUBSCRIBE\nid:1\ndestination:/topic/a#\n\n\0",
            "invalid destination",
        ),
        (
            b"SUBSCRIBE\nid:1\ndestination:/queue/q\nprefetch-count:lots\n\n\0",
            "invalid header",
        ),
        (
            b"SUBSCRIBE\nid:1\ndestination:missing\n\n\0",
            "destination not found",
        ),
    ] {
        let mut h = Harness::new();
        h.connect("1.2", "");
        h.input(frame);
        assert_error_and_closed(&mut h, message);
    }
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:1\ndestination:/queue/q\n\n\0");
    h.input(b"SUBSCRIBE\nid:1\ndestination:/queue/r\n\n\0");
    assert_error_and_closed(&mut h, "duplicate subscription id");
}

fn subscribed(version: &str, ack: &str) -> (Harness, u64) {
    let mut h = Harness::new();
    h.connect(version, "");
    h.input(format!("SUBSCRIBE\nid:s\ndestination:/queue/q\nack:{ack}\n\n\0").as_bytes());
    let (consumer, _) = last_consumer(&h.take_calls());
    for tag in 1..=3 {
        h.deliver(consumer, tag, Message::text(format!("m{tag}")));
    }
    (h, consumer)
}

fn settles(calls: &[Call]) -> Vec<(u64, Outcome, Option<TxnId>)> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Settle(_, t, o, txn, _) => Some((t.0, *o, *txn)),
            _ => None,
        })
        .collect()
}

#[test]
fn client_ack_is_cumulative() {
    let (mut h, consumer) = subscribed("1.2", "client");
    let frames = h.frames();
    assert_eq!(frames.len(), 3);
    let ack2 = frames[1].header("ack").unwrap().to_owned();
    assert_eq!(ack2, format!("{consumer}-2"));
    h.input(format!("ACK\nid:{ack2}\n\n\0").as_bytes());
    assert_eq!(
        settles(&h.take_calls()),
        vec![(1, Outcome::Accept, None), (2, Outcome::Accept, None)]
    );
    // Already settled by the cumulative ACK.
    h.input(format!("ACK\nid:{consumer}-1\n\n\0").as_bytes());
    assert_error_and_closed(&mut h, "unknown message id");
}

/// A reader given a large credit at once (a stream reader's prefetch of
/// 1,000) costs one output chunk, not its credit again: the deliveries
/// wait unencoded and each poll_transmit encodes about
/// `OUTPUT_CHUNK_BYTES`, in order.
#[test]
fn a_large_credit_is_encoded_a_chunk_at_a_time_in_order() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:s\ndestination:/queue/q\nack:client\nprefetch-count:1000\n\n\0");
    let (consumer, _) = last_consumer(&h.take_calls());
    let body = "b".repeat(1024);
    for tag in 1..=1000 {
        h.deliver(consumer, tag, Message::text(body.clone()));
    }
    let frame_max = 1024 + 256;
    let mut chunks = 0;
    let mut tags = Vec::new();
    loop {
        let out = h.raw_output();
        if out.is_empty() {
            break;
        }
        assert!(
            out.len() <= rosetta_stomp::connection::OUTPUT_CHUNK_BYTES + frame_max,
            "one poll_transmit handed over {} bytes",
            out.len()
        );
        chunks += 1;
        let mut d = rosetta_stomp::Decoder::new(
            StompConfig::default().limits(),
            rosetta_stomp::Version::V1_2,
        );
        d.feed(&out);
        while let Some(f) = d.decode().unwrap() {
            let ack = f.header("ack").unwrap();
            tags.push(ack.rsplit('-').next().unwrap().parse::<u64>().unwrap());
        }
    }
    assert!(chunks > 10, "{chunks} chunks");
    assert_eq!(tags, (1..=1000).collect::<Vec<_>>());
}

/// Frames other than deliveries keep their place after the deliveries
/// made before them: a RECEIPT that becomes ready while deliveries wait
/// unencoded follows them.
#[test]
fn a_receipt_follows_the_deliveries_that_wait_before_it() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:s\ndestination:/queue/q\nack:client\n\n\0");
    let (consumer, _) = last_consumer(&h.take_calls());
    let body = "b".repeat(1024);
    for tag in 1..=200 {
        h.deliver(consumer, tag, Message::text(body.clone()));
    }
    h.input(b"SEND\ndestination:/queue/x\npersistent:true\nreceipt:r1\n\nhi\0");
    let ticket = *h.tickets().last().unwrap();
    h.commit(ticket);
    let frames = h.frames();
    assert_eq!(frames.len(), 201);
    assert!(frames[..200]
        .iter()
        .all(|f| f.command == rosetta_stomp::Command::Message));
    assert_eq!(frames[200].command, rosetta_stomp::Command::Receipt);
}

/// A stream reader's cumulative ACK settles all but the last delivery with
/// one `settle_many` (one call into the core, which serves the reader
/// once) and the last alone, which carries the receipt's confirm.
#[test]
fn a_stream_readers_cumulative_ack_is_one_settle_many_and_the_last_settle() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:s\ndestination:/queue/st\nack:client\nx-queue-type:stream\n\n\0");
    let (consumer, _) = last_consumer(&h.take_calls());
    for tag in 1..=4u64 {
        let mut d = delivery(consumer, tag, Message::text("m"), 0, false);
        d.stream = Some(rosetta_neutral::StreamPosition {
            offset: tag - 1,
            timestamp_ms: 0,
            missed: 0,
            partition: None,
        });
        h.event(SessionEvent::Delivery(d));
    }
    assert_eq!(h.frames().len(), 4);
    h.input(format!("ACK\nid:{consumer}-3\nreceipt:a\n\n\0").as_bytes());
    let calls = h.take_calls();
    let c = ConsumerId(consumer);
    assert!(
        matches!(
            &calls[..],
            [Call::SettleMany(many, Outcome::Accept), Call::Settle(_, DeliveryTag(3), Outcome::Accept, None, true)]
                if many == &vec![(c, DeliveryTag(1)), (c, DeliveryTag(2))]
        ),
        "{calls:?}"
    );
}

#[test]
fn client_individual_ack_and_nack() {
    let (mut h, consumer) = subscribed("1.2", "client-individual");
    h.frames();
    h.input(format!("NACK\nid:{consumer}-2\n\n\0ACK\nid:{consumer}-3\nreceipt:r\n\n\0").as_bytes());
    let calls = h.take_calls();
    assert_eq!(
        settles(&calls),
        vec![(2, Outcome::NACK, None), (3, Outcome::Accept, None)]
    );
    // Only the ACK asked for a receipt, so only its settlement is confirmed.
    assert!(calls
        .iter()
        .any(|c| matches!(c, Call::Settle(_, DeliveryTag(3), _, _, true))));
    assert!(calls
        .iter()
        .any(|c| matches!(c, Call::Settle(_, DeliveryTag(2), _, _, false))));
    assert!(
        h.frames().is_empty(),
        "receipt waits for the settle's commit"
    );
    let tickets = h.tickets();
    assert_eq!(tickets.len(), 1);
    h.commit(tickets[0]);
    assert_eq!(h.frame().header("receipt-id"), Some("r"));
}

#[test]
fn stomp_1_1_acks_by_message_id_and_subscription() {
    let (mut h, consumer) = subscribed("1.1", "client-individual");
    let frames = h.frames();
    assert_eq!(frames[0].header("ack"), None, "1.1 has no ack header");
    assert_eq!(frames[0].header("subscription"), Some("s"));
    h.input(format!("ACK\nmessage-id:{consumer}-1\nsubscription:s\n\n\0").as_bytes());
    assert_eq!(settles(&h.take_calls()), vec![(1, Outcome::Accept, None)]);
    h.input(format!("ACK\nmessage-id:{consumer}-2\nsubscription:other\n\n\0").as_bytes());
    assert_error_and_closed(&mut h, "unknown message id");
}

#[test]
fn stomp_1_0_acks_by_message_id_and_has_no_nack() {
    let mut h = Harness::new();
    h.input(b"CONNECT\n\n\0");
    h.frames();
    h.input(b"SUBSCRIBE\ndestination:/queue/q\nack:client\n\n\0");
    let (consumer, _) = last_consumer(&h.take_calls());
    h.deliver(consumer, 1, Message::text("x"));
    let f = h.frame();
    assert_eq!(f.header("subscription"), None, "no id given in 1.0");
    h.input(format!("ACK\nmessage-id:{consumer}-1\n\n\0").as_bytes());
    assert_eq!(settles(&h.take_calls()), vec![(1, Outcome::Accept, None)]);
    h.input(b"NACK\nmessage-id:x\n\n\0");
    assert_error_and_closed(&mut h, "unsupported command");
}

#[test]
fn ack_errors() {
    for ack in ["ACK\nid:garbage\n\n\0", "ACK\nid:999-1\n\n\0", "ACK\n\n\0"] {
        let (mut h, _) = subscribed("1.2", "client");
        h.frames();
        h.input(ack.as_bytes());
        let f = h.frames().pop().unwrap();
        assert_eq!(f.command, Command::Error, "{ack}");
        assert!(h.conn.is_closed());
    }
    // ACK in auto mode: nothing is awaiting an ack.
    let (mut h, consumer) = subscribed("1.2", "auto");
    h.frames();
    h.input(format!("ACK\nid:{consumer}-1\n\n\0").as_bytes());
    assert_error_and_closed(&mut h, "unknown message id");
}

#[test]
fn redelivery_carries_the_marker_and_count() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:s\ndestination:/queue/q\nack:client\n\n\0");
    let (consumer, _) = last_consumer(&h.take_calls());
    let mut m = Message::text("again");
    m.address = Some(Address::Queue("q".into()));
    h.event(SessionEvent::Delivery(delivery(consumer, 9, m, 2, true)));
    let f = h.frame();
    assert_eq!(f.header("redelivered"), Some("true"));
    assert_eq!(f.header("delivery-count"), Some("2"));
    assert_eq!(f.header("destination"), Some("/queue/q"));
}

#[test]
fn unsubscribe_cancels_and_late_deliveries_are_dropped() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:s\ndestination:/queue/q\n\n\0UNSUBSCRIBE\nid:s\nreceipt:u\n\n\0");
    let calls = h.take_calls();
    let (consumer, _) = last_consumer(&calls);
    assert!(matches!(calls.last(), Some(Call::Cancel(c)) if c.0 == consumer));
    assert_eq!(h.frame().header("receipt-id"), Some("u"));
    h.deliver(consumer, 1, Message::text("late"));
    assert!(h.frames().is_empty());
    assert!(!h.conn.is_closed());
}

// ---- durable subscriptions ----

#[test]
fn durable_subscription_activemq_style() {
    let mut h = Harness::new();
    h.connect("1.2", "client-id:app\n");
    h.input(b"SUBSCRIBE\nid:1\ndestination:/topic/news/#\nactivemq.subscriptionName:feed\n\n\0");
    let calls = h.take_calls();
    match &calls[..] {
        [Call::Declare(spec), Call::Bind(q, f), Call::Consume(c, _)] => {
            assert_eq!(spec.name.as_deref(), Some("$durable/app/feed"));
            assert!(spec.durable);
            assert_eq!(spec.lifetime, QueueLifetime::Permanent);
            assert_eq!(q, "$durable/app/feed");
            assert_eq!(f, "news/#");
            assert_eq!(c.queue, "$durable/app/feed");
        }
        other => panic!("{other:?}"),
    }
    // A plain UNSUBSCRIBE keeps the queue (and what it collects).
    h.input(b"UNSUBSCRIBE\nid:1\n\n\0");
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|c| matches!(c, Call::Delete(_))),
        "{calls:?}"
    );
    // Naming it removes it.
    h.input(b"UNSUBSCRIBE\nid:1\nactivemq.subscriptionName:feed\n\n\0");
    let calls = h.take_calls();
    assert!(
        matches!(&calls[..], [Call::Delete(q)] if q == "$durable/app/feed"),
        "{calls:?}"
    );
}

#[test]
fn durable_subscription_rabbitmq_style_keyed_by_login() {
    let mut h = Harness::new();
    h.connect("1.2", "login:guest\npasscode:guest\n");
    h.input(b"SUBSCRIBE\nid:mine\ndestination:/topic/t\npersistent:true\nack:client\n\n\0");
    let calls = h.take_calls();
    assert!(
        matches!(&calls[0], Call::Declare(s) if s.name.as_deref() == Some("$durable/guest/mine"))
    );
    h.input(b"UNSUBSCRIBE\nid:mine\npersistent:true\n\n\0");
    let calls = h.take_calls();
    assert!(matches!(&calls[..], [Call::Cancel(_), Call::Delete(q)] if q == "$durable/guest/mine"));
}

#[test]
fn durable_subscription_needs_a_key() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:x\ndestination:/topic/t\npersistent:true\n\n\0");
    assert_error_and_closed(&mut h, "missing client-id");
}

// ---- transactions ----

#[test]
fn transactions_stage_sends_and_acks_and_commit_with_a_receipt() {
    let (mut h, consumer) = subscribed("1.2", "client-individual");
    h.frames();
    h.input(b"BEGIN\ntransaction:t1\n\n\0");
    h.input(b"SEND\ndestination:/queue/out\ntransaction:t1\npersistent:true\n\nx\0");
    h.input(format!("ACK\nid:{consumer}-1\ntransaction:t1\n\n\0").as_bytes());
    h.input(b"COMMIT\ntransaction:t1\nreceipt:c\n\n\0");
    let calls = h.take_calls();
    let txn = calls
        .iter()
        .find_map(|c| match c {
            Call::Begin(t) => Some(*t),
            _ => None,
        })
        .unwrap();
    let sends = send_calls(&calls);
    assert_eq!(sends[0].2.txn, Some(txn));
    assert!(
        !sends[0].2.confirm,
        "staged: the commit is what becomes durable"
    );
    assert_eq!(settles(&calls), vec![(1, Outcome::Accept, Some(txn))]);
    assert!(calls
        .iter()
        .any(|c| matches!(c, Call::Commit(t) if *t == txn)));
    assert!(h.frames().is_empty(), "no RECEIPT before Committed");
    let tickets = h.tickets();
    assert_eq!(tickets.len(), 1, "only the commit is waited for");
    h.commit(tickets[0]);
    assert_eq!(h.frame().header("receipt-id"), Some("c"));
    // The transaction is gone.
    h.input(b"COMMIT\ntransaction:t1\n\n\0");
    assert_error_and_closed(&mut h, "invalid transaction");
}

#[test]
fn abort_rolls_back_and_makes_acked_messages_ackable_again() {
    let (mut h, consumer) = subscribed("1.2", "client-individual");
    h.frames();
    h.input(b"BEGIN\ntransaction:t\n\n\0");
    h.input(format!("ACK\nid:{consumer}-2\ntransaction:t\n\n\0").as_bytes());
    h.input(b"ABORT\ntransaction:t\nreceipt:a\n\n\0");
    let calls = h.take_calls();
    assert!(calls.iter().any(|c| matches!(c, Call::Rollback(_))));
    assert_eq!(h.frame().header("receipt-id"), Some("a"));
    h.input(format!("ACK\nid:{consumer}-2\n\n\0").as_bytes());
    assert_eq!(settles(&h.take_calls()), vec![(2, Outcome::Accept, None)]);
    assert!(!h.conn.is_closed());
}

#[test]
fn transaction_errors() {
    for (frames, message) in [
        (
            "SEND\ndestination:q\ntransaction:nope\n\nx\0",
            "invalid transaction",
        ),
        (
            "BEGIN\ntransaction:t\n\n\0BEGIN\ntransaction:t\n\n\0",
            "invalid transaction",
        ),
        ("ABORT\ntransaction:t\n\n\0", "invalid transaction"),
        ("BEGIN\n\n\0", "missing header"),
    ] {
        let mut h = Harness::new();
        h.connect("1.2", "");
        h.input(frames.as_bytes());
        assert_error_and_closed(&mut h, message);
    }
}

// ---- DISCONNECT, heart-beats, timeouts ----

#[test]
fn disconnect_with_receipt_closes_cleanly_after_pending_commits() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\ndestination:q\npersistent:true\n\nx\0DISCONNECT\nreceipt:bye\n\n\0SEND\ndestination:q\n\nignored\0");
    assert!(h.frames().is_empty());
    assert!(!h.conn.is_closed());
    assert!(
        h.conn.wants_input(),
        "bytes after DISCONNECT are read and ignored"
    );
    assert_eq!(
        send_calls(&h.calls()).len(),
        1,
        "frames after DISCONNECT are ignored"
    );
    h.commit(h.tickets()[0]);
    assert_eq!(h.frame().header("receipt-id"), Some("bye"));
    assert!(h.conn.is_closed());
    assert!(matches!(
        h.calls().last(),
        Some(Call::Close(CloseKind::Clean))
    ));
}

#[test]
fn heart_beats_are_sent_and_a_silent_client_is_dropped() {
    let mut h = Harness::new();
    let f = h.connect("1.2", "heart-beat:1000,500\n");
    // Server sends at max(500, 1000 min) and expects max(1000, 1000).
    assert_eq!(f.header("heart-beat"), Some("1000,1000"));
    assert_eq!(
        h.conn.poll_timeout(),
        Some(h.now + std::time::Duration::from_millis(1000))
    );
    h.advance_ms(999);
    assert!(h.raw_output().is_empty());
    h.advance_ms(1);
    assert_eq!(h.raw_output(), b"\n", "EOL heart-beat");
    h.input(b"\n"); // the client's beat keeps it alive
    h.advance_ms(1500);
    assert!(!h.conn.is_closed());
    h.advance_ms(499); // 1999 ms of silence: within the 200 % grace
    assert!(!h.conn.is_closed());
    h.advance_ms(1); // 2000 ms: the grace period is over
    assert_error_and_closed(&mut h, "heart-beat timeout");
    assert!(matches!(
        h.calls().last(),
        Some(Call::Close(CloseKind::Abnormal))
    ));
    assert_eq!(h.conn.poll_timeout(), None);
}

#[test]
fn no_heart_beats_when_not_asked() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    assert_eq!(h.conn.poll_timeout(), None);
    h.advance_ms(3_600_000);
    assert!(!h.conn.is_closed());
}

#[test]
fn connect_must_arrive_in_time() {
    let mut h = Harness::new();
    assert!(h.conn.poll_timeout().is_some());
    h.advance_ms(rosetta_stomp::config::CONNECT_TIMEOUT_MS);
    assert_error_and_closed(&mut h, "connect timeout");
}

#[test]
fn input_one_byte_at_a_time() {
    let mut h = Harness::new();
    for b in
        b"CONNECT\naccept-version:1.2\n\n\0SEND\ndestination:/queue/q\ncontent-length:3\n\na\0b\0"
    {
        h.input(&[*b]);
    }
    assert_eq!(h.frame().command, Command::Connected);
    let sends = send_calls(&h.calls());
    assert_eq!(sends.len(), 1);
    assert_eq!(&sends[0].1.body.bytes[..], b"a\0b");
}

#[test]
fn back_pressure_when_commits_pile_up() {
    let config = StompConfig {
        pending_commits_max: 2,
        ..StompConfig::default()
    };
    let mut h = Harness::with_config(config);
    h.connect("1.2", "");
    for _ in 0..3 {
        assert!(h.conn.wants_input());
        h.input(b"SEND\ndestination:q\npersistent:true\n\nx\0");
    }
    assert!(!h.conn.wants_input(), "3 pending commits > 2");
    h.commit(h.tickets()[0]);
    assert!(h.conn.wants_input());
    h.broker.0.lock().unwrap().blocked = true;
    assert!(!h.conn.wants_input(), "the core holds producers back");
}

#[test]
fn a_client_is_not_dropped_for_silence_while_we_stopped_reading() {
    let config = StompConfig {
        pending_commits_max: 0,
        ..StompConfig::default()
    };
    let mut h = Harness::with_config(config);
    h.connect(
        "1.2",
        "heart-beat:1000,0
",
    );
    h.input(b"SEND\ndestination:q\npersistent:true\n\nx\0");
    assert!(!h.conn.wants_input());
    for _ in 0..10 {
        h.advance_ms(1000); // the driver is not reading: no heart-beats arrive
    }
    assert!(!h.conn.is_closed(), "paused by us, not silent");
    h.advance_ms(500);
    h.commit(h.tickets()[0]);
    assert!(h.conn.wants_input());
    h.advance_ms(1999);
    assert!(
        !h.conn.is_closed(),
        "the grace period restarts when reading resumes"
    );
    h.advance_ms(1);
    assert!(h.conn.is_closed());
}

#[test]
fn kicked_session_gets_an_error() {
    let mut h = Harness::new();
    h.connect("1.2", "client-id:x\n");
    h.event(SessionEvent::Kicked {
        reason: KickReason::TakenOver,
    });
    assert_error_and_closed(&mut h, "session closed");
    assert!(h.calls().is_empty(), "the core closed it already");
}

#[test]
fn transport_close_closes_the_session_abnormally() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.conn.handle_transport_closed(h.now);
    assert!(h.conn.is_closed());
    assert!(matches!(&h.calls()[..], [Call::Close(CloseKind::Abnormal)]));
}

// ---- bad input ----

#[test]
fn bad_input_gets_an_error_frame_then_close() {
    let connected = "CONNECT\naccept-version:1.2\n\n\0";
    let long_header = format!(
        "{connected}SEND\ndestination:q\nk:{}\n\n\0",
        "v".repeat(200_000)
    );
    let many_headers = format!("{connected}SEND\n{}\n\0", "h:v\n".repeat(300));
    let mut huge = format!("{connected}SEND\ndestination:q\n\n");
    huge.push_str(&"x".repeat(rosetta_stomp::config::BODY_SIZE_MAX_BYTES + 10));
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "garbage before CONNECT",
            "\x01\x02\x03".into(),
            "malformed frame",
        ),
        (
            "HTTP before CONNECT",
            "GET / HTTP/1.1\r\n".into(),
            "malformed frame",
        ),
        (
            "SEND before CONNECT",
            "SEND\ndestination:q\n\n\0".into(),
            "not connected",
        ),
        (
            "unknown command",
            format!("{connected}FROB\n\n\0"),
            "unknown command",
        ),
        ("header too long", long_header, "header too long"),
        ("too many headers", many_headers, "too many headers"),
        (
            "bad escape",
            format!("{connected}SEND\ndestination:q\nk:\\t\n\n\0"),
            "malformed frame",
        ),
        ("missing NUL", huge, "frame too large"),
        (
            "declared body too large",
            format!("{connected}SEND\ndestination:q\ncontent-length:999999999\n\n"),
            "frame too large",
        ),
        (
            "NUL missing after content-length",
            format!("{connected}SEND\ndestination:q\ncontent-length:1\n\nab"),
            "malformed frame",
        ),
        (
            "SEND without destination",
            format!("{connected}SEND\n\nx\0"),
            "missing header",
        ),
        (
            "second CONNECT",
            format!("{connected}{connected}"),
            "unexpected frame",
        ),
        (
            "server frame from client",
            format!("{connected}MESSAGE\n\n\0"),
            "unexpected frame",
        ),
        (
            "bad priority",
            format!("{connected}SEND\ndestination:q\npriority:high\n\n\0"),
            "invalid header",
        ),
        (
            "bad heart-beat",
            "CONNECT\naccept-version:1.2\nheart-beat:fast\n\n\0".into(),
            "invalid header",
        ),
    ];
    for (name, input, message) in cases {
        let mut h = Harness::new();
        h.input(input.as_bytes());
        let frames = h.frames();
        let f = frames.last().unwrap_or_else(|| panic!("{name}: no frame"));
        assert_eq!(f.command, Command::Error, "{name}");
        assert_eq!(f.header("message"), Some(message), "{name}: {f:?}");
        assert!(!f.body.is_empty(), "{name}");
        assert!(h.conn.is_closed(), "{name}");
        // Anything after the error is ignored.
        h.input(b"SEND\ndestination:q\n\nx\0");
        assert!(h.frames().is_empty(), "{name}");
        let publishes = send_calls(&h.calls()).len();
        assert_eq!(publishes, 0, "{name}");
        if h.calls().iter().any(|c| matches!(c, Call::Open(_))) {
            assert!(
                matches!(h.calls().last(), Some(Call::Close(CloseKind::Abnormal))),
                "{name}"
            );
        }
    }
}

#[test]
fn error_frame_carries_the_receipt_id() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\nreceipt:r-5\n\nx\0");
    let f = assert_error_and_closed(&mut h, "missing header");
    assert_eq!(f.header("receipt-id"), Some("r-5"));
    assert!(String::from_utf8_lossy(&f.body).contains("destination"));
}

#[test]
fn durable_subscription_removed_offline_and_queue_subs_never_delete() {
    let mut h = Harness::new();
    h.connect("1.2", "client-id:app\n");
    // Not subscribed on this connection: naming it still removes it.
    h.input(b"UNSUBSCRIBE\nid:1\nactivemq.subscriptionName:feed\n\n\0");
    let calls = h.take_calls();
    assert!(
        matches!(&calls[..], [Call::Delete(q)] if q == "$durable/app/feed"),
        "{calls:?}"
    );
    // A queue subscription is not durable: persistent:true on UNSUBSCRIBE
    // deletes nothing.
    h.input(b"SUBSCRIBE\nid:q\ndestination:/queue/work\npersistent:true\n\n\0");
    h.input(b"UNSUBSCRIBE\nid:q\npersistent:true\n\n\0");
    let calls = h.take_calls();
    assert!(
        !calls
            .iter()
            .any(|c| matches!(c, Call::Delete(_) | Call::Declare(_))),
        "{calls:?}"
    );
}

#[test]
fn client_mode_nack_is_cumulative_too() {
    let (mut h, consumer) = subscribed("1.2", "client");
    h.frames();
    h.input(format!("NACK\nid:{consumer}-2\n\n\0").as_bytes());
    assert_eq!(
        settles(&h.take_calls()),
        vec![(1, Outcome::NACK, None), (2, Outcome::NACK, None)]
    );
}

#[test]
fn transaction_ack_limit() {
    let config = StompConfig {
        transaction_acks_max: 2,
        ..StompConfig::default()
    };
    let mut h = Harness::with_config(config);
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:s\ndestination:/queue/q\nack:client\n\n\0");
    let (consumer, _) = last_consumer(&h.take_calls());
    for tag in 1..=3 {
        h.deliver(consumer, tag, Message::text("m"));
    }
    h.frames();
    h.input(b"BEGIN\ntransaction:t\n\n\0");
    h.input(format!("ACK\nid:{consumer}-3\ntransaction:t\n\n\0").as_bytes());
    assert_error_and_closed(&mut h, "limit exceeded");
}

#[test]
fn consumer_closed_by_the_core_is_reported() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:s\ndestination:/queue/q\n\n\0");
    let (consumer, _) = last_consumer(&h.take_calls());
    h.event(SessionEvent::ConsumerClosed {
        consumer: ConsumerId(consumer),
        reason: BrokerError::NotFound("q".into()),
    });
    let f = assert_error_and_closed(&mut h, "destination not found");
    assert!(String::from_utf8_lossy(&f.body).contains("\"s\""));
}

#[test]
fn heart_beats_while_waiting_for_the_disconnect_receipt_keep_the_client() {
    let mut h = Harness::new();
    h.connect("1.2", "heart-beat:1000,0\n");
    h.input(b"SEND\ndestination:q\npersistent:true\n\nx\0DISCONNECT\nreceipt:bye\n\n\0");
    for _ in 0..5 {
        h.advance_ms(1500);
        h.input(b"\n");
    }
    assert!(!h.conn.is_closed());
    h.commit(h.tickets()[0]);
    assert_eq!(h.frame().header("receipt-id"), Some("bye"));
}

proptest::proptest! {
    #[test]
    fn arbitrary_input_never_panics_and_close_is_final(
        connect in proptest::bool::ANY,
        input in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
    ) {
        let mut h = Harness::new();
        if connect {
            h.connect("1.2", "heart-beat:1000,1000\n");
        }
        for chunk in input.chunks(5) {
            h.input(chunk);
            h.advance_ms(100);
            h.frames();
        }
        if h.conn.is_closed() {
            h.input(b"SEND\ndestination:q\n\nx\0");
            h.advance_ms(60_000);
            proptest::prop_assert!(h.raw_output().is_empty());
        }
    }
}

/// One step of a random session: a plausible frame, a core event or time.
#[derive(Debug, Clone)]
enum Op {
    Frame(usize, u8),
    Deliver(u8, u8),
    Commit(u8),
    AdvanceMs(u16),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0usize..14, 0u8..3).prop_map(|(t, n)| Op::Frame(t, n)),
        2 => (1u8..12, 1u8..6).prop_map(|(c, t)| Op::Deliver(c, t)),
        1 => (1u8..40).prop_map(Op::Commit),
        1 => (0u16..3000).prop_map(Op::AdvanceMs),
    ]
}

fn template(t: usize, n: u8, consumer_hint: u64) -> String {
    match t {
        0 => format!("SUBSCRIBE\nid:{n}\ndestination:/queue/q{n}\nack:client\n\n\0"),
        1 => format!("SUBSCRIBE\nid:{n}\ndestination:/topic/a/+\nack:client-individual\npersistent:true\n\n\0"),
        2 => format!("UNSUBSCRIBE\nid:{n}\npersistent:true\nreceipt:u{n}\n\n\0"),
        3 => format!("SEND\ndestination:/queue/q\npersistent:true\nreceipt:s{n}\n\nx\0"),
        4 => format!("SEND\ndestination:/temp-queue/t{n}\nreply-to:/temp-queue/r\ntransaction:t{n}\n\nx\0"),
        5 => format!("BEGIN\ntransaction:t{n}\n\n\0"),
        6 => format!("COMMIT\ntransaction:t{n}\nreceipt:c{n}\n\n\0"),
        7 => format!("ABORT\ntransaction:t{n}\n\n\0"),
        8 => format!("ACK\nid:{consumer_hint}-{n}\n\n\0"),
        9 => format!("NACK\nid:{consumer_hint}-{n}\ntransaction:t{n}\n\n\0"),
        10 => format!("ACK\nid:{consumer_hint}-{n}\nreceipt:a{n}\n\n\0"),
        11 => "\n".to_owned(),
        12 => format!("DISCONNECT\nreceipt:d{n}\n\n\0"),
        _ => "SEND\ndestination:/topic/a/b\n\nhello\0".to_owned(),
    }
}

proptest::proptest! {
    #[test]
    fn random_sessions_keep_the_invariants(
        version in proptest::sample::select(vec!["1.0", "1.1", "1.2"]),
        ops in proptest::collection::vec(op(), 0..60),
    ) {
        let mut h = Harness::new();
        h.connect(version, "client-id:c\nheart-beat:1000,1000\n");
        let mut consumer = 1;
        for op in ops {
            match op {
                Op::Frame(t, n) => h.input(template(t, n, consumer).as_bytes()),
                Op::Deliver(c, tag) => {
                    consumer = u64::from(c);
                    h.deliver(consumer, u64::from(tag), Message::text("m"));
                }
                Op::Commit(t) => h.commit(Ticket(u64::from(t))),
                Op::AdvanceMs(ms) => h.advance_ms(u64::from(ms)),
            }
            let frames = h.frames();
            if let Some(pos) = frames.iter().position(|f| f.command == Command::Error) {
                proptest::prop_assert_eq!(pos, frames.len() - 1, "ERROR is the last frame");
                proptest::prop_assert!(h.conn.is_closed());
            }
            if h.conn.is_closed() {
                h.input(b"SEND\ndestination:q\n\nx\0");
                h.commit(Ticket(1));
                proptest::prop_assert!(h.raw_output().is_empty());
                proptest::prop_assert_eq!(h.conn.poll_timeout(), None);
                break;
            }
        }
    }
}

#[test]
fn absurd_heart_beat_intervals_do_not_overflow_the_clock() {
    for hb in [
        "18446744073709551615,18446744073709551615",
        "0,18446744073709551615",
    ] {
        let mut h = Harness::new();
        h.connect("1.2", &format!("heart-beat:{hb}\n"));
        let _ = h.conn.poll_timeout();
        h.advance_ms(10_000);
        assert!(!h.conn.is_closed(), "{hb}");
    }
}

#[test]
fn connect_takes_no_receipt() {
    let mut h = Harness::new();
    h.input(b"CONNECT\naccept-version:1.2\nreceipt:x\n\n\0");
    assert_eq!(h.frame().command, Command::Connected);
}
