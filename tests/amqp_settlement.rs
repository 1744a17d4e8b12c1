//! AMQP 1.0 settlement over real sockets: pre-settled and unsettled both
//! ways, durable messages acknowledged after commit and kept across a
//! restart, receiver outcomes (accepted, released, modified, rejected to the
//! dead-letter queue), unsettled deliveries returned on link and connection
//! close, and message sections kept intact AMQP -> AMQP.

mod common;

use std::time::Duration;

use common::amqp::{self, durable, recv_any, send_accepted, text_of, AnyDelivery, WAIT};
use common::TestBroker;
use fe2o3_amqp::link::delivery::Delivery;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::definitions::SenderSettleMode;
use fe2o3_amqp::types::messaging::{
    AmqpSequence, ApplicationProperties, Body, Data, Header, Message, MessageAnnotations,
    MessageId, Modified, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, SimpleValue, Symbol, Timestamp, Uuid, Value};
use fe2o3_amqp::{Receiver, Sender};

#[tokio::test]
async fn presettled_and_unsettled_sends_and_deliveries() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "settle").await;
    let mut settled = Sender::builder()
        .name("settled")
        .target("/queue/ps")
        .sender_settle_mode(SenderSettleMode::Settled)
        .attach(&mut session)
        .await
        .expect("pre-settled sender");
    for i in 0..5 {
        settled
            .send(format!("p{i}"))
            .await
            .expect("send pre-settled");
    }
    let mut unsettled = amqp::sender(&mut session, "unsettled", "/queue/ps").await;
    send_accepted(&mut unsettled, durable("u0")).await;
    // Pre-settled sends have no acknowledgement: wait for the core to see them.
    let deadline = std::time::Instant::now() + WAIT;
    while broker.depth("ps").0 < 6 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(broker.depth("ps"), (6, 0));

    // A pre-settled receiver: deliveries are settled at once (nothing in flight).
    let mut r = Receiver::builder()
        .name("settled-r")
        .source("/queue/ps")
        .sender_settle_mode(SenderSettleMode::Settled)
        .credit_mode(CreditMode::Manual)
        .attach(&mut session)
        .await
        .expect("pre-settled receiver");
    r.set_credit(3).await.expect("credit");
    for i in 0..3 {
        assert_eq!(text_of(&recv_any(&mut r).await), format!("p{i}"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("ps"), (3, 0));
    r.close().await.expect("close");

    // An unsettled receiver: in flight until accepted.
    let mut r = amqp::manual_receiver(&mut session, "unsettled-r", "/queue/ps").await;
    r.set_credit(3).await.expect("credit");
    let ds: Vec<AnyDelivery> = vec![
        recv_any(&mut r).await,
        recv_any(&mut r).await,
        recv_any(&mut r).await,
    ];
    assert_eq!(
        ds.iter().map(text_of).collect::<Vec<_>>(),
        ["p3", "p4", "u0"]
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("ps"), (0, 3));
    for d in &ds {
        r.accept(d).await.expect("accept");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("ps"), (0, 0));
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn accepted_durable_messages_survive_a_restart() {
    let mut broker = TestBroker::start().await;
    {
        let (mut conn, mut session) = amqp::connect_session(&broker, "durable").await;
        let mut s = amqp::sender(&mut session, "s", "/queue/keep").await;
        for i in 0..20 {
            // The accepted disposition comes only once the journal holds it.
            send_accepted(&mut s, durable(&format!("k{i}"))).await;
        }
        conn.close().await.expect("close");
    }
    broker.restart().await;
    assert_eq!(broker.depth("keep"), (20, 0));
    let (mut conn, mut session) = amqp::connect_session(&broker, "durable").await;
    let mut r = amqp::receiver(&mut session, "r", "/queue/keep").await;
    for i in 0..20 {
        let d = recv_any(&mut r).await;
        assert_eq!(text_of(&d), format!("k{i}"));
        assert!(d.message().header.as_ref().is_some_and(|h| h.durable));
        r.accept(&d).await.expect("accept");
    }
    // fe2o3 sends dispositions from its session task and Close from its
    // connection task, so a Close written at once may overtake them (the
    // broker then rightly returns the deliveries). Wait until the broker
    // has them settled; what is checked is that a restart keeps that.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while broker.depth("keep") != (0, 0) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(broker.depth("keep"), (0, 0), "accepts applied before close");
    conn.close().await.expect("close");
    broker.restart().await;
    assert_eq!(broker.depth("keep"), (0, 0), "accepts were durable too");
    broker.stop().await;
}

fn delivery_count(d: &AnyDelivery) -> u32 {
    d.message().header.as_ref().map_or(0, |h| h.delivery_count)
}

#[tokio::test]
async fn release_modify_and_reject_outcomes() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "outcomes").await;
    let mut s = amqp::sender(&mut session, "s", "/queue/out").await;
    send_accepted(&mut s, durable("m")).await;
    let mut r = amqp::manual_receiver(&mut session, "r", "/queue/out").await;
    r.set_credit(1).await.expect("credit");

    // released: back to the queue, count unchanged.
    let d = recv_any(&mut r).await;
    assert_eq!(delivery_count(&d), 0);
    r.release(&d).await.expect("release");
    r.set_credit(1).await.expect("credit");
    let d = recv_any(&mut r).await;
    assert_eq!(text_of(&d), "m");
    assert_eq!(delivery_count(&d), 0, "release does not count");

    // modified delivery-failed: back with the count raised.
    let failed = Modified {
        delivery_failed: Some(true),
        undeliverable_here: None,
        message_annotations: None,
    };
    r.modify(&d, failed.clone()).await.expect("modify");
    r.set_credit(1).await.expect("credit");
    let d = recv_any(&mut r).await;
    assert_eq!(delivery_count(&d), 1, "delivery-failed counts");
    r.modify(&d, failed).await.expect("modify");
    r.set_credit(1).await.expect("credit");
    let d = recv_any(&mut r).await;
    assert_eq!(delivery_count(&d), 2);

    // modified undeliverable-here: not redelivered to this consumer while
    // another consumer can take it (with no other consumer the core gives
    // it back rather than block the queue).
    let here = Modified {
        delivery_failed: None,
        undeliverable_here: Some(true),
        message_annotations: None,
    };
    let mut other = amqp::receiver(&mut session, "other", "/queue/out").await;
    r.modify(&d, here).await.expect("modify undeliverable-here");
    r.set_credit(1).await.expect("credit");
    let d2 = recv_any(&mut other).await;
    assert_eq!(text_of(&d2), "m");
    // Not to the consumer that said undeliverable-here.
    amqp::recv_nothing(&mut r).await;

    // rejected: to the dead-letter queue.
    other.reject(&d2, None).await.expect("reject");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("out"), (0, 0));
    assert_eq!(broker.depth("DLQ").0, 1);
    let mut dlq = amqp::receiver(&mut session, "dlq", "/queue/DLQ").await;
    let dead = recv_any(&mut dlq).await;
    assert_eq!(text_of(&dead), "m");
    dlq.accept(&dead).await.expect("accept");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn unsettled_deliveries_return_on_link_and_connection_close() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "producer").await;
    let mut s = amqp::sender(&mut session, "s", "/queue/ret").await;
    for i in 0..4 {
        send_accepted(&mut s, durable(&format!("r{i}"))).await;
    }
    // Link close: two unsettled deliveries go back.
    let (mut c2, mut s2) = amqp::connect_session(&broker, "consumer").await;
    let mut r = amqp::manual_receiver(&mut s2, "r", "/queue/ret").await;
    r.set_credit(2).await.expect("credit");
    let _a = recv_any(&mut r).await;
    let _b = recv_any(&mut r).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("ret"), (2, 2));
    r.close().await.expect("close link");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("ret"), (4, 0));

    // Connection close (and a dropped socket): all unsettled go back.
    let mut r = amqp::receiver(&mut s2, "r2", "/queue/ret").await;
    let first = recv_any(&mut r).await;
    assert_eq!(text_of(&first), "r0", "returned in order");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("ret").1, 4);
    c2.close().await.expect("close connection");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(broker.depth("ret"), (4, 0));
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn message_sections_are_kept_intact() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "sections").await;
    let mut s = amqp::sender(&mut session, "s", "/queue/sec").await;
    let mut r = amqp::receiver(&mut session, "r", "/queue/sec").await;

    let ids = [
        MessageId::from(42u64),
        MessageId::from(Uuid::from([7u8; 16])),
        MessageId::from(Binary::from(vec![0u8, 1, 2, 255])),
        MessageId::from("string-id".to_owned()),
    ];
    for (i, id) in ids.iter().enumerate() {
        let header = Header {
            durable: true,
            priority: 7.into(),
            ttl: None,
            first_acquirer: false,
            delivery_count: 0,
        };
        let props = Properties {
            message_id: Some(id.clone()),
            user_id: None,
            to: Some("/queue/sec".into()),
            subject: Some("subj".into()),
            reply_to: Some("/queue/replies".into()),
            correlation_id: Some(ids[(i + 1) % ids.len()].clone()),
            content_type: Some(Symbol::from("application/x-test")),
            content_encoding: Some(Symbol::from("gzip")),
            absolute_expiry_time: Some(Timestamp::from_milliseconds(4_102_444_800_000)),
            creation_time: Some(Timestamp::from_milliseconds(1_700_000_000_000)),
            group_id: Some("g".into()),
            group_sequence: Some(9),
            // Not carried: the neutral message has no field for it (see the report).
            reply_to_group_id: None,
        };
        let app = ApplicationProperties::builder()
            .insert("s", SimpleValue::String("text".into()))
            .insert("i", SimpleValue::Int(-5))
            .insert("l", SimpleValue::Long(1 << 40))
            .insert("u", SimpleValue::Ubyte(200))
            .insert("b", SimpleValue::Bool(true))
            .insert("d", SimpleValue::Double(2.5.into()))
            .insert("bin", SimpleValue::Binary(Binary::from(vec![9u8, 8])))
            .insert("sym", SimpleValue::Symbol(Symbol::from("sy")))
            .insert(
                "ts",
                SimpleValue::Timestamp(Timestamp::from_milliseconds(5)),
            )
            .build();
        let ann = MessageAnnotations::builder()
            .insert(
                Symbol::from("x-opt-test"),
                Value::String("annotated".into()),
            )
            .insert(Symbol::from("x-opt-num"), Value::Long(77))
            .build();
        let m = Message::builder()
            .header(header.clone())
            .message_annotations(ann.clone())
            .properties(props.clone())
            .application_properties(app.clone())
            .data(Binary::from(format!("payload {i}").into_bytes()))
            .build();
        send_accepted(&mut s, m).await;
        let d: Delivery<Body<Value>> = recv_any(&mut r).await;
        r.accept(&d).await.expect("accept");
        let got = d.message();
        let h = got.header.as_ref().expect("header");
        assert!(h.durable);
        assert_eq!(h.priority, header.priority);
        assert_eq!(h.delivery_count, 0);
        let ma = got.message_annotations.as_ref().expect("annotations");
        for (k, v) in ann.0.iter() {
            assert_eq!(ma.0.get(k), Some(v), "annotation {k:?}");
        }
        let p = got.properties.as_ref().expect("properties");
        assert_eq!(p.message_id, props.message_id, "message-id #{i}");
        assert_eq!(p.correlation_id, props.correlation_id);
        assert_eq!(p.to, props.to);
        assert_eq!(p.subject, props.subject);
        assert_eq!(p.reply_to, props.reply_to);
        assert_eq!(p.content_type, props.content_type);
        assert_eq!(p.content_encoding, props.content_encoding);
        assert_eq!(p.absolute_expiry_time, props.absolute_expiry_time);
        assert_eq!(p.creation_time, props.creation_time);
        assert_eq!(p.group_id, props.group_id);
        assert_eq!(p.group_sequence, props.group_sequence);
        let ap = got.application_properties.as_ref().expect("app props");
        assert_eq!(ap.0, app.0, "application-properties typed and ordered");
        match &got.body {
            Body::Data(batch) => {
                assert_eq!(batch.len(), 1);
                assert_eq!(batch[0].0.as_slice(), format!("payload {i}").as_bytes());
            }
            other => panic!("body {other:?}"),
        }
    }

    // A ttl is kept (as what remains of it).
    let m = Message::builder()
        .header(Header {
            ttl: Some(3_600_000),
            ..Default::default()
        })
        .value("with ttl".to_owned())
        .build();
    send_accepted(&mut s, m).await;
    let d = recv_any(&mut r).await;
    r.accept(&d).await.expect("accept");
    let ttl = d
        .message()
        .header
        .as_ref()
        .and_then(|h| h.ttl)
        .expect("ttl kept");
    assert!(ttl <= 3_600_000 && ttl > 3_500_000, "ttl {ttl}");

    // amqp-value (a list) and amqp-sequence bodies.
    let map_value = Value::List(vec![
        Value::Int(1),
        Value::String("two".into()),
        Value::Null,
    ]);
    send_accepted(&mut s, Message::builder().value(map_value.clone()).build()).await;
    let d = recv_any(&mut r).await;
    r.accept(&d).await.expect("accept");
    match d.body() {
        Body::Value(v) => assert_eq!(v.0, map_value),
        other => panic!("body {other:?}"),
    }
    let seq = vec![Value::Uint(1), Value::Bool(false)];
    s.send(
        Message::builder()
            .sequence(AmqpSequence(seq.clone()))
            .build(),
    )
    .await
    .expect("send")
    .accepted_or_else(|o| o)
    .expect("accepted");
    let d = recv_any(&mut r).await;
    r.accept(&d).await.expect("accept");
    match d.body() {
        Body::Sequence(batch) => assert_eq!(batch[0].0, seq),
        other => panic!("body {other:?}"),
    }
    // Several data sections stay several.
    let two = Body::<Value>::Data(
        vec![
            Data(Binary::from(b"one".to_vec())),
            Data(Binary::from(b"two".to_vec())),
        ]
        .into(),
    );
    send_accepted(&mut s, Message::builder().body(two).build()).await;
    let d = recv_any(&mut r).await;
    r.accept(&d).await.expect("accept");
    match d.body() {
        Body::Data(batch) => {
            let parts: Vec<&[u8]> = batch.iter().map(|d| d.0.as_slice()).collect();
            assert_eq!(parts, [b"one".as_slice(), b"two".as_slice()]);
        }
        other => panic!("body {other:?}"),
    }
    conn.close().await.expect("close");
    broker.stop().await;
}
