//! Streams over real sockets with the raw STOMP client: a stream written
//! with SENDs (declared by `x-queue-type:stream`), read from `first`,
//! `offset=N` and `timestamp=T`, without being consumed; a consumer group
//! resuming after a reconnect and after a broker restart; bad specs get
//! an ERROR and a close.

mod common;

use common::stomp::StompClient;
use common::TestBroker;

const STREAM: &str = "/queue/events";

fn now_s() -> u64 {
    now_ms() / 1000
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

async fn write_stream(broker: &TestBroker, n: usize) {
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    for i in 0..n {
        p.send_persistent(
            STREAM,
            &[("x-queue-type", "stream")],
            format!("e{i}").as_bytes(),
        )
        .await;
    }
    p.disconnect().await;
}

fn offsets(frames: &[common::stomp::Frame]) -> Vec<String> {
    frames
        .iter()
        .map(|f| f.header("x-stream-offset").unwrap_or("none").to_owned())
        .collect()
}

#[tokio::test]
async fn a_stream_is_read_from_first_from_an_offset_and_from_a_time_without_being_consumed() {
    let broker = TestBroker::start().await;
    let before_ms = now_ms();
    write_stream(&broker, 5).await;
    let after_ms = now_ms();
    assert_eq!(broker.queue("events"), None, "a stream, not a queue");
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe(
        "all",
        STREAM,
        "client",
        &[
            ("x-queue-type", "stream"),
            ("x-stream-offset", "first"),
            ("prefetch-count", "10"),
        ],
    )
    .await;
    let all = c.messages(5).await;
    assert_eq!(offsets(&all), ["0", "1", "2", "3", "4"]);
    assert_eq!(all[3].text(), "e3");
    // Each message's append time, in ms, never earlier than the one before.
    let times: Vec<u64> = all
        .iter()
        .map(|f| {
            f.header("x-stream-timestamp")
                .and_then(|t| t.parse().ok())
                .unwrap_or(0)
        })
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1])
            && times.iter().all(|t| (before_ms..=after_ms).contains(t)),
        "{times:?} within {before_ms}..={after_ms}"
    );
    assert_eq!(
        all[0].header("x-queue-type"),
        None,
        "the declaring header is no property"
    );
    c.subscribe(
        "from2",
        STREAM,
        "client",
        &[("x-stream-offset", "offset=2")],
    )
    .await;
    assert_eq!(
        offsets(&c.messages(3).await),
        ["2", "3", "4"],
        "reading deleted nothing"
    );
    let an_hour_ago = format!("timestamp={}", now_s() - 3600);
    c.subscribe(
        "since",
        STREAM,
        "auto",
        &[("x-stream-offset", &an_hour_ago)],
    )
    .await;
    assert_eq!(offsets(&c.messages(5).await), ["0", "1", "2", "3", "4"]);
    let later = format!("timestamp={}", now_s() + 3600);
    c.subscribe("later", STREAM, "auto", &[("x-stream-offset", &later)])
        .await;
    c.expect_nothing().await;
    // A `next` reader (the default) gets only what comes.
    c.subscribe("tail", STREAM, "auto", &[("x-queue-type", "stream")])
        .await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent(STREAM, &[], b"e5").await;
    // Every live subscription of this connection gets offset 5 once.
    let five = c.messages(5).await;
    assert!(
        five.iter()
            .all(|f| f.header("x-stream-offset") == Some("5")),
        "{five:?}"
    );
    let mut subs: Vec<&str> = five
        .iter()
        .filter_map(|f| f.header("subscription"))
        .collect();
    subs.sort_unstable();
    assert_eq!(subs, ["all", "from2", "later", "since", "tail"]);
    c.expect_nothing().await;
}

#[tokio::test]
async fn a_group_resumes_from_its_acknowledged_offset_after_a_reconnect_and_a_restart() {
    let mut broker = TestBroker::start().await;
    write_stream(&broker, 6).await;
    let group = [("x-stream-group", "billing"), ("x-stream-offset", "first")];
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("g", STREAM, "client", &group).await;
    let got = c.messages(6).await;
    // ack:client is cumulative: acknowledging offset 2 settles 0, 1, 2.
    c.ack(&got[2]).await;
    c.disconnect().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("g", STREAM, "client", &[("x-stream-group", "billing")])
        .await;
    let resumed = c.messages(3).await;
    assert_eq!(offsets(&resumed), ["3", "4", "5"], "after a reconnect");
    c.ack(&resumed[0]).await;
    c.disconnect().await;
    broker.restart().await;
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("g", STREAM, "client", &[("x-stream-group", "billing")])
        .await;
    assert_eq!(offsets(&c.messages(2).await), ["4", "5"], "after a restart");
    c.expect_nothing().await;
}

#[tokio::test]
async fn a_bad_offset_spec_or_an_offset_on_a_plain_queue_is_an_error_and_a_close() {
    let broker = TestBroker::start().await;
    write_stream(&broker, 2).await;
    for bad in ["yesterday", "offset=-1", "timestamp=soon", "offset=99"] {
        let mut c = StompClient::connect(broker.stomp(), &[]).await;
        c.send_frame(
            "SUBSCRIBE",
            &[
                ("id", "s"),
                ("destination", STREAM),
                ("ack", "auto"),
                ("x-stream-offset", bad),
            ],
            b"",
        )
        .await;
        let e = c.expect_error_then_close().await;
        assert!(
            e.header("message").is_some_and(|m| m.contains("invalid")),
            "{bad}: {e:?}"
        );
    }
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    p.send_persistent("/queue/plain", &[], b"q").await;
    p.send_frame(
        "SUBSCRIBE",
        &[
            ("id", "s"),
            ("destination", "/queue/plain"),
            ("ack", "auto"),
            ("x-stream-offset", "first"),
        ],
        b"",
    )
    .await;
    p.expect_error_then_close().await;
    assert_eq!(
        broker.depth("plain"),
        (1, 0),
        "the queue's message is untouched"
    );
    // Other clients of the stream are unaffected.
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("ok", STREAM, "auto", &[("x-stream-offset", "first")])
        .await;
    assert_eq!(offsets(&c.messages(2).await), ["0", "1"]);
}

mod amqp_readers {
    //! The same stream read over AMQP 1.0 with fe2o3-amqp: RabbitMQ's
    //! `/amq/queue/<name>` and `/queues/<name>` addresses, the
    //! `rabbitmq:stream-offset-spec`
    //! source filter, the `x-stream-offset` message annotation, a group
    //! named by container id and link name.

    use super::common::amqp::{self, AnyDelivery};
    use super::common::stomp::StompClient;
    use super::common::TestBroker;
    use fe2o3_amqp::session::SessionHandle;
    use fe2o3_amqp::types::messaging::annotations::OwnedKey;
    use fe2o3_amqp::types::messaging::Source;
    use fe2o3_amqp::types::primitives::{Symbol, Timestamp, Value};
    use fe2o3_amqp::Receiver;
    use serde_amqp::described::Described;
    use serde_amqp::descriptor::Descriptor;

    const FILTER: &str = "rabbitmq:stream-offset-spec";

    pub(super) fn offset_source(address: &str, spec: Value) -> Source {
        Source::builder()
            .address(address)
            .add_to_filter(
                FILTER,
                Described {
                    descriptor: Descriptor::Name(Symbol::from(FILTER)),
                    value: spec,
                },
            )
            .build()
    }

    /// A receiving link `name` on `address`, starting where `spec` says.
    async fn attach_from(
        session: &mut SessionHandle<()>,
        name: &str,
        address: &str,
        spec: Value,
    ) -> Receiver {
        Receiver::builder()
            .name(name)
            .source(offset_source(address, spec))
            .attach(session)
            .await
            .unwrap_or_else(|e| panic!("attach {name} to {address}: {e:?}"))
    }

    fn offset_of(d: &AnyDelivery) -> Option<i64> {
        let ann = d.message().message_annotations.as_ref()?;
        match ann
            .0
            .get(&OwnedKey::from(Symbol::from("x-stream-offset")))?
        {
            Value::Long(n) => Some(*n),
            _ => None,
        }
    }

    async fn write(broker: &TestBroker, n: usize) {
        let mut p = StompClient::connect(broker.stomp(), &[]).await;
        for i in 0..n {
            p.send_persistent(
                "/queue/events",
                &[("x-queue-type", "stream"), ("content-type", "text/plain")],
                format!("e{i}").as_bytes(),
            )
            .await;
        }
        p.disconnect().await;
    }

    async fn read(r: &mut Receiver, n: usize) -> Vec<(Option<i64>, String)> {
        let mut out = Vec::new();
        for _ in 0..n {
            let d = amqp::recv_any(r).await;
            r.accept(&d).await.expect("accept");
            out.push((offset_of(&d), amqp::text_of(&d)));
        }
        out
    }

    #[tokio::test]
    async fn an_amqp_reader_starts_at_an_offset_first_or_a_time_and_sees_the_offset_annotation() {
        let broker = TestBroker::start().await;
        let before_ms = super::now_ms();
        write(&broker, 4).await;
        let after_ms = super::now_ms();
        let (_conn, mut session) = amqp::connect_session(&broker, "reader-1").await;
        let mut r = attach_from(&mut session, "from-2", "/amq/queue/events", Value::Ulong(2)).await;
        assert_eq!(
            read(&mut r, 2).await,
            [(Some(2), "e2".to_owned()), (Some(3), "e3".to_owned())]
        );
        let mut r = attach_from(
            &mut session,
            "from-first",
            "/queue/events",
            Value::String("first".into()),
        )
        .await;
        let d = amqp::recv_any(&mut r).await;
        r.accept(&d).await.expect("accept");
        let ann = d.message().message_annotations.as_ref();
        // The append time as an AMQP timestamp.
        let appended_ms =
            match ann.and_then(|a| a.0.get(&OwnedKey::from(Symbol::from("x-stream-timestamp")))) {
                Some(Value::Timestamp(t)) => u64::try_from(t.milliseconds()).ok(),
                _ => None,
            };
        assert!(
            appended_ms.is_some_and(|t| (before_ms..=after_ms).contains(&t)),
            "{appended_ms:?} within {before_ms}..={after_ms}"
        );
        let mut got = vec![(offset_of(&d), amqp::text_of(&d))];
        got.extend(read(&mut r, 3).await);
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            [Some(0), Some(1), Some(2), Some(3)]
        );
        let an_hour_ago = Timestamp::from_milliseconds(super::now_s() as i64 * 1000 - 3_600_000);
        let mut r = attach_from(
            &mut session,
            "since",
            "/amq/queue/events",
            Value::Timestamp(an_hour_ago),
        )
        .await;
        assert_eq!(read(&mut r, 4).await.len(), 4);
    }

    /// RabbitMQ 4's AMQP 1.0 clients address a queue or stream as
    /// `/queues/<percent-encoded name>` (its v2 addresses), in a link's
    /// terminus or in an anonymous relay message's `to`.
    #[tokio::test]
    async fn rabbitmq_4_queue_addresses_append_to_and_read_a_stream() {
        use fe2o3_amqp::types::messaging::{Message, Properties, Target};
        let broker = TestBroker::start().await;
        write(&broker, 1).await;
        let (_conn, mut session) = amqp::connect_session(&broker, "rabbitmq-4").await;
        let mut to_stream = amqp::sender(&mut session, "v2-target", "/queues/events").await;
        amqp::send_accepted(&mut to_stream, Message::builder().value("e1").build()).await;
        let mut relay = fe2o3_amqp::Sender::builder()
            .name("v2-relay")
            .target(Target::builder().build())
            .attach(&mut session)
            .await
            .expect("anonymous relay sender");
        let m = Message::builder()
            .properties(Properties::builder().to("/queues/%65vents").build())
            .value("e2")
            .build();
        amqp::send_accepted(&mut relay, m).await;
        let mut r = attach_from(
            &mut session,
            "v2-source",
            "/queues/events",
            Value::String("first".into()),
        )
        .await;
        assert_eq!(
            read(&mut r, 3).await,
            [
                (Some(0), "e0".to_owned()),
                (Some(1), "e1".to_owned()),
                (Some(2), "e2".to_owned())
            ]
        );
    }

    /// Unsettled AMQP transfers to a stream, many in flight: each is
    /// accepted once durable (a group commit's receipts reach the
    /// connection as one `CommittedRun` event), and all are in the log
    /// in the order sent.
    #[tokio::test]
    async fn pipelined_amqp_appends_are_each_accepted_and_kept_in_order() {
        let broker = TestBroker::start().await;
        write(&broker, 1).await; // declares `events` a stream
        let (mut conn, mut session) = amqp::connect_session(&broker, "writer-1").await;
        let mut s = amqp::sender(&mut session, "appender", "/queue/events").await;
        let mut outcomes = Vec::new();
        for i in 1..=200 {
            let fut = s
                .send_batchable(amqp::durable(&format!("e{i}")))
                .await
                .expect("send");
            outcomes.push(fut);
        }
        for (i, fut) in outcomes.into_iter().enumerate() {
            let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), fut)
                .await
                .unwrap_or_else(|_| panic!("no outcome for append {i}"))
                .expect("outcome");
            assert!(
                matches!(outcome, fe2o3_amqp::types::messaging::Outcome::Accepted(_)),
                "append {i}: {outcome:?}"
            );
        }
        s.close().await.expect("close sender");
        let mut r = attach_from(
            &mut session,
            "all",
            "/queue/events",
            Value::String("first".into()),
        )
        .await;
        let got = read(&mut r, 201).await;
        let want: Vec<(Option<i64>, String)> =
            (0..=200).map(|i| (Some(i), format!("e{i}"))).collect();
        assert_eq!(got, want);
        let _ = conn.close().await;
    }

    #[tokio::test]
    async fn a_bad_offset_spec_refuses_only_that_link() {
        let broker = TestBroker::start().await;
        write(&broker, 2).await;
        let (mut conn, mut session) = amqp::connect_session(&broker, "reader-2").await;
        for (name, spec) in [
            ("bad-word", Value::String("yesterday".into())),
            ("past-end", Value::Ulong(99)),
            ("negative", Value::Long(-1)),
        ] {
            let refused = Receiver::builder()
                .name(name)
                .source(offset_source("/amq/queue/events", spec))
                .attach(&mut session)
                .await;
            assert!(refused.is_err(), "{name}: attached");
            // A fresh session for the next link: fe2o3 reuses the refused
            // link's handle at once, racing the refusal's closing detach
            // (see the report; not stream-specific).
            session = fe2o3_amqp::Session::begin(&mut conn)
                .await
                .expect("the connection goes on");
        }
        // The connection goes on, and so does the stream.
        let mut r = attach_from(
            &mut session,
            "good",
            "/amq/queue/events",
            Value::String("first".into()),
        )
        .await;
        assert_eq!(read(&mut r, 2).await.len(), 2);
    }

    #[tokio::test]
    async fn a_link_resumes_where_the_same_container_and_link_name_left_off() {
        let mut broker = TestBroker::start().await;
        write(&broker, 5).await;
        {
            let (mut conn, mut session) = amqp::connect_session(&broker, "billing").await;
            let mut r = attach_from(
                &mut session,
                "invoices",
                "/amq/queue/events",
                Value::String("first".into()),
            )
            .await;
            read(&mut r, 3).await; // accepted: 0, 1, 2
            r.close().await.expect("detach");
            conn.close().await.expect("close");
        }
        broker.restart().await;
        let (_conn, mut session) = amqp::connect_session(&broker, "billing").await;
        let mut r = amqp::receiver(&mut session, "invoices", "/amq/queue/events").await;
        let got = read(&mut r, 2).await;
        assert_eq!(
            got,
            [(Some(3), "e3".to_owned()), (Some(4), "e4".to_owned())]
        );
    }
}

mod mqtt_clients {
    //! Streams from MQTT with rumqttc: PUBLISH to `$stream/<name>`,
    //! SUBSCRIBE to `$stream/<name>/<spec>`, the MQTT 5 user property
    //! `x-stream-offset`, SUBACK failure on a bad spec; the same stream
    //! read over STOMP from offset 0; and a shared subscription
    //! `$share/<group>/$stream/<name>` as the consumer group `<group>`.

    use super::common::mqtt::{self, v5};
    use super::common::stomp::StompClient;
    use super::common::TestBroker;
    use rumqttc::QoS;

    /// QoS 1 publishes to a stream, many in flight: each gets its PUBACK
    /// once durable (a group commit's receipts come to the connection as
    /// one `CommittedRun` event), and all are in the log in order.
    #[tokio::test]
    async fn pipelined_qos1_publishes_are_each_acknowledged_and_kept_in_order() {
        let broker = TestBroker::start().await;
        let (c, mut ev, _) = mqtt::connected4(&broker, "pipelined", true).await;
        for i in 0..100 {
            c.publish("$stream/mqp", QoS::AtLeastOnce, false, format!("p{i}"))
                .await
                .expect("publish");
        }
        for _ in 0..100 {
            mqtt::puback4(&mut ev).await;
        }
        let mut s = StompClient::connect(broker.stomp(), &[]).await;
        s.subscribe("all", "/queue/mqp", "auto", &[("x-stream-offset", "first")])
            .await;
        let got = s.messages(100).await;
        let want: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        assert_eq!(super::offsets(&got), want);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, m)| m.text() == format!("p{i}")));
    }

    #[tokio::test]
    async fn mqtt_writes_a_stream_that_stomp_and_mqtt_read_from_an_offset() {
        let broker = TestBroker::start().await;
        let (c, mut ev, _) = mqtt::connected4(&broker, "writer", true).await;
        for i in 0..4 {
            mqtt::publish_and_ack4(
                &c,
                &mut ev,
                "$stream/mq",
                QoS::AtLeastOnce,
                false,
                format!("p{i}").as_bytes(),
            )
            .await;
        }
        let mut s = StompClient::connect(broker.stomp(), &[]).await;
        s.subscribe(
            "all",
            "/queue/mq",
            "auto",
            &[("x-stream-offset", "offset=0")],
        )
        .await;
        let got = s.messages(4).await;
        assert_eq!(super::offsets(&got), ["0", "1", "2", "3"]);
        assert_eq!(got[2].text(), "p2");

        let (r, mut rev, _) = mqtt::connected4(&broker, "reader", true).await;
        r.subscribe("$stream/mq/offset=2", QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        // The history may come before the SUBACK is read: collect both.
        let (mut suback, mut payloads) = (None, Vec::new());
        while suback.is_none() || payloads.len() < 2 {
            match mqtt::next4(&mut rev).await.expect("connection stays up") {
                rumqttc::Packet::SubAck(a) => suback = Some(a),
                rumqttc::Packet::Publish(p) => payloads.push(p.payload.to_vec()),
                _ => {}
            }
        }
        assert_eq!(
            suback.map(|a| a.return_codes),
            Some(vec![rumqttc::SubscribeReasonCode::Success(
                QoS::AtLeastOnce
            )])
        );
        assert_eq!(payloads, [b"p2".to_vec(), b"p3".to_vec()]);
        let bad = mqtt::subscribe4(&r, &mut rev, "$stream/mq/yesterday", QoS::AtLeastOnce).await;
        assert_eq!(bad.return_codes, [rumqttc::SubscribeReasonCode::Failure]);
    }

    /// Appends `s<i>` for each `i` to the stream `sh`, each acknowledged.
    async fn append(broker: &TestBroker, range: std::ops::Range<u32>) {
        for i in range {
            let body = format!("s{i}");
            mqtt::publish_once4(
                broker,
                "$stream/sh",
                QoS::AtLeastOnce,
                false,
                body.as_bytes(),
            )
            .await;
        }
    }

    /// `$share/<group>/$stream/<name>` reads as the consumer group
    /// `<group>`: a persistent session's shared stream subscription is
    /// restored on reconnect at the group's committed offset, and a STOMP
    /// reader naming the same group with `x-stream-group` goes on from
    /// there too.
    #[tokio::test]
    async fn a_shared_stream_subscription_reads_as_the_group_of_its_share_name() {
        let broker = TestBroker::start().await;
        append(&broker, 0..2).await;
        let filter = "$share/audit/$stream/sh/first";
        let (r, mut rev) =
            mqtt::subscriber4(&broker, "sharer", false, filter, QoS::AtLeastOnce).await;
        let first: Vec<_> = [
            mqtt::publish4(&mut rev).await,
            mqtt::publish4(&mut rev).await,
        ]
        .map(|p| p.payload.to_vec())
        .into();
        assert_eq!(first, [b"s0".to_vec(), b"s1".to_vec()]);
        // rumqttc's PUBACKs go out before the DISCONNECT.
        mqtt::disconnect4(&r, &mut rev).await;
        append(&broker, 2..4).await;
        // The session resumes its subscription without a SUBSCRIBE, at the
        // group's committed offset, not at the filter's `first` again.
        let (r, mut rev, ack) = mqtt::connected4(&broker, "sharer", false).await;
        assert!(ack.session_present);
        let resumed: Vec<_> = [
            mqtt::publish4(&mut rev).await,
            mqtt::publish4(&mut rev).await,
        ]
        .map(|p| p.payload.to_vec())
        .into();
        assert_eq!(resumed, [b"s2".to_vec(), b"s3".to_vec()]);
        mqtt::quiet4(&mut rev).await;
        mqtt::unsubscribe4(&r, &mut rev, filter).await;
        mqtt::disconnect4(&r, &mut rev).await;

        append(&broker, 4..5).await;
        let mut s = StompClient::connect(broker.stomp(), &[]).await;
        s.subscribe("g", "/queue/sh", "client", &[("x-stream-group", "audit")])
            .await;
        let got = s.messages(1).await;
        assert_eq!(got[0].text(), "s4");
        s.expect_nothing().await;
    }

    #[tokio::test]
    async fn an_mqtt_5_reader_sees_the_offset_user_property_and_a_bad_spec_gets_0x8f() {
        let broker = TestBroker::start().await;
        let before_ms = super::now_ms();
        mqtt::publish_once4(&broker, "$stream/m5", QoS::AtLeastOnce, false, b"x0").await;
        let after_ms = super::now_ms();
        mqtt::publish_once4(&broker, "$stream/m5", QoS::AtLeastOnce, false, b"x1").await;
        let (c, mut ev, _) = mqtt::connected5(mqtt::opts5(&broker, "r5")).await;
        let ack = mqtt::subscribe5(
            &c,
            &mut ev,
            v5::Filter::new("$stream/m5/first", v5::QoS::AtLeastOnce),
            None,
        )
        .await;
        assert_eq!(
            ack.return_codes,
            [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
        );
        let p = mqtt::publish5(&mut ev).await;
        let props = p.properties.expect("properties");
        assert!(
            props
                .user_properties
                .contains(&("x-stream-offset".into(), "0".into())),
            "{:?}",
            props.user_properties
        );
        let appended_ms = props
            .user_properties
            .iter()
            .find(|(k, _)| k == "x-stream-timestamp")
            .and_then(|(_, v)| v.parse::<u64>().ok());
        assert!(
            appended_ms.is_some_and(|t| (before_ms..=after_ms).contains(&t)),
            "{appended_ms:?} within {before_ms}..={after_ms}"
        );
        let bad = mqtt::subscribe5(
            &c,
            &mut ev,
            v5::Filter::new("$stream/m5/offset=x", v5::QoS::AtLeastOnce),
            None,
        )
        .await;
        assert_eq!(
            bad.return_codes,
            [v5::SubscribeReasonCode::TopicFilterInvalid]
        );
    }
}

mod mqtt_5 {
    //! MQTT 5 stream spellings with rumqttc: the SUBSCRIBE user property
    //! `x-stream-offset` on `$stream/<name>` (the same values as STOMP's
    //! header), and a refused `$stream/` PUBLISH answered with a PUBACK or
    //! PUBREC reason code, the connection going on.

    use super::common::mqtt::{self, v5};
    use super::common::stomp::StompClient;
    use super::common::TestBroker;
    use rumqttc::v5::mqttbytes::v5 as p5;
    use rumqttc::QoS;

    fn offset_property(spec: &str) -> v5::SubscribeProperties {
        v5::SubscribeProperties {
            id: None,
            user_properties: vec![("x-stream-offset".into(), spec.into())],
        }
    }

    fn offset_of(p: &v5::Publish) -> Option<String> {
        let props = p.properties.as_ref()?;
        props
            .user_properties
            .iter()
            .find(|(k, _)| k == "x-stream-offset")
            .map(|(_, v)| v.clone())
    }

    /// Sends SUBSCRIBE and collects the SUBACK and `n` PUBLISHes in
    /// whatever order they come (the history may come first).
    async fn subscribe_and_read(
        c: &v5::AsyncClient,
        ev: &mut v5::EventLoop,
        filter: &str,
        props: v5::SubscribeProperties,
        n: usize,
    ) -> (v5::SubAck, Vec<v5::Publish>) {
        c.subscribe_with_properties(filter, v5::QoS::AtLeastOnce, props)
            .await
            .expect("subscribe");
        let (mut suback, mut got) = (None, Vec::new());
        while suback.is_none() || got.len() < n {
            match mqtt::next5(ev).await.expect("connection stays up") {
                v5::Packet::SubAck(a) => suback = Some(a),
                v5::Packet::Publish(p) => got.push(p),
                _ => {}
            }
        }
        (suback.expect("suback"), got)
    }

    #[tokio::test]
    async fn the_subscribe_user_property_says_where_a_reader_starts() {
        let broker = TestBroker::start().await;
        for i in 0..4 {
            let body = format!("u{i}");
            mqtt::publish_once4(
                &broker,
                "$stream/up",
                QoS::AtLeastOnce,
                false,
                body.as_bytes(),
            )
            .await;
        }
        let (c, mut ev, _) = mqtt::connected5(mqtt::opts5(&broker, "up-reader")).await;
        let (ack, got) =
            subscribe_and_read(&c, &mut ev, "$stream/up", offset_property("offset=2"), 2).await;
        assert_eq!(
            ack.return_codes,
            [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
        );
        let seen: Vec<_> = got
            .iter()
            .map(|p| (offset_of(p), p.payload.to_vec()))
            .collect();
        assert_eq!(
            seen,
            [
                (Some("2".into()), b"u2".to_vec()),
                (Some("3".into()), b"u3".to_vec())
            ]
        );
        mqtt::quiet5(&mut ev).await;
        // `first` by property on a second connection reads it all again.
        let (c2, mut ev2, _) = mqtt::connected5(mqtt::opts5(&broker, "up-first")).await;
        let (_, all) =
            subscribe_and_read(&c2, &mut ev2, "$stream/up", offset_property("first"), 4).await;
        assert_eq!(
            all.iter().map(offset_of).collect::<Vec<_>>(),
            ["0", "1", "2", "3"].map(|o| Some(o.to_owned()))
        );
        // A bad value is refused for that filter only; the connection goes on.
        let bad = mqtt::subscribe5(
            &c2,
            &mut ev2,
            v5::Filter::new("$stream/up", v5::QoS::AtLeastOnce),
            Some(offset_property("yesterday")),
        )
        .await;
        assert_eq!(
            bad.return_codes,
            [v5::SubscribeReasonCode::TopicFilterInvalid]
        );
        let ok = mqtt::subscribe5(
            &c2,
            &mut ev2,
            v5::Filter::new("other/topic", v5::QoS::AtLeastOnce),
            Some(offset_property("yesterday")),
        )
        .await;
        assert_eq!(
            ok.return_codes,
            [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)],
            "the property means nothing to a filter that is no stream"
        );
    }

    #[tokio::test]
    async fn a_refused_stream_publish_gets_a_reason_code_and_the_connection_goes_on() {
        let broker = TestBroker::start().await;
        // `plain` is a queue: it cannot be a stream too.
        let mut s = StompClient::connect(broker.stomp(), &[]).await;
        s.send_persistent("/queue/plain", &[], b"q").await;
        let (c, mut ev, _) = mqtt::connected5(mqtt::opts5(&broker, "refused")).await;
        let puback = |p: &v5::Packet| match p {
            v5::Packet::PubAck(a) => Some(a.reason),
            _ => None,
        };
        let pubrec = |p: &v5::Packet| match p {
            v5::Packet::PubRec(a) => Some(a.reason),
            _ => None,
        };
        c.publish("$stream/plain", v5::QoS::AtLeastOnce, false, "x")
            .await
            .expect("publish");
        assert_eq!(
            mqtt::wait5(&mut ev, puback).await,
            p5::PubAckReason::ImplementationSpecificError
        );
        c.publish("$stream/a/b", v5::QoS::AtLeastOnce, false, "x")
            .await
            .expect("publish");
        assert_eq!(
            mqtt::wait5(&mut ev, puback).await,
            p5::PubAckReason::TopicNameInvalid,
            "a stream name has no `/`"
        );
        c.publish("$stream/plain", v5::QoS::ExactlyOnce, false, "x")
            .await
            .expect("publish");
        assert_eq!(
            mqtt::wait5(&mut ev, pubrec).await,
            p5::PubRecReason::ImplementationSpecificError
        );
        // Still connected: a good publish goes through.
        c.publish("$stream/fine", v5::QoS::AtLeastOnce, false, "ok")
            .await
            .expect("publish");
        assert_eq!(
            mqtt::wait5(&mut ev, puback).await,
            p5::PubAckReason::Success
        );
        assert_eq!(broker.depth("plain"), (1, 0), "the queue is untouched");
    }
}

mod retention {
    //! Retention cutting under live readers of every protocol, over real
    //! sockets: each reader holds one delivery and no credit while the
    //! stream grows past `max_bytes`; retention deletes the segments at its
    //! position; given credit again, it skips to the first kept offset and
    //! its first delivery says how many it missed (STOMP header, AMQP
    //! message annotation, MQTT 5 user property, all `x-stream-missed`).

    use std::time::{Duration, Instant};

    use super::common::mqtt::{self, v5};
    use super::common::stomp::StompClient;
    use super::common::{amqp, TestBroker};
    use fe2o3_amqp::types::messaging::annotations::OwnedKey;
    use fe2o3_amqp::types::primitives::{Symbol, Value};
    use rosetta::config::StreamEntry;
    use rosetta::core::AllowAll;

    const STREAM: &str = "cut";
    /// Records of about 300 bytes in 1 KiB segments (the least allowed):
    /// 200 of them are some 60 segments, of which `max_bytes` keeps ~5.
    const MESSAGES: usize = 200;
    const SEGMENT_BYTES: u64 = 1024;
    const MAX_BYTES: u64 = 4096;
    /// Retention runs every 10 s.
    const RETENTION_WAIT: Duration = Duration::from_secs(30);

    fn annotation(d: &amqp::AnyDelivery, key: &str) -> Option<i64> {
        let ann = d.message().message_annotations.as_ref()?;
        match ann.0.get(&OwnedKey::from(Symbol::from(key)))? {
            Value::Long(n) => Some(*n),
            _ => None,
        }
    }

    fn user_property(p: &v5::Publish, key: &str) -> Option<u64> {
        let props = p.properties.as_ref()?;
        let (_, v) = props.user_properties.iter().find(|(k, _)| k == key)?;
        v.parse().ok()
    }

    /// The stream's first kept offset, as a new `first` reader sees it.
    async fn first_kept(broker: &TestBroker) -> u64 {
        let mut c = StompClient::connect(broker.stomp(), &[]).await;
        c.subscribe(
            "probe",
            "/queue/cut",
            "client",
            &[("x-stream-offset", "first"), ("prefetch-count", "1")],
        )
        .await;
        let f = c.message().await;
        c.disconnect().await;
        f.header("x-stream-offset")
            .and_then(|o| o.parse().ok())
            .expect("an offset")
    }

    #[tokio::test]
    async fn readers_paused_by_credit_skip_what_retention_cut_and_are_told_how_many() {
        let broker = TestBroker::start_with(
            |c| {
                c.streams.push(StreamEntry {
                    name: Some(STREAM.into()),
                    segment_bytes: Some(SEGMENT_BYTES),
                    max_bytes: Some(MAX_BYTES),
                    ..StreamEntry::default()
                })
            },
            std::sync::Arc::new(AllowAll),
        )
        .await;
        let mut w = StompClient::connect(broker.stomp(), &[]).await;
        w.send_persistent("/queue/cut", &[], b"m0").await;

        // Three readers, each holding offset 0 with no credit left.
        let mut st = StompClient::connect(broker.stomp(), &[]).await;
        st.subscribe(
            "held",
            "/queue/cut",
            "client",
            &[("x-stream-offset", "first"), ("prefetch-count", "1")],
        )
        .await;
        let held = st.message().await;
        assert_eq!(held.header("x-stream-offset"), Some("0"));

        let (_conn, mut session) = amqp::connect_session(&broker, "cut-reader").await;
        let source =
            super::amqp_readers::offset_source("/amq/queue/cut", Value::String("first".into()));
        let mut ar = amqp::manual_receiver(&mut session, "held", source).await;
        ar.set_credit(1).await.expect("credit");
        let d = amqp::recv_any(&mut ar).await;
        assert_eq!(annotation(&d, "x-stream-offset"), Some(0));
        ar.accept(&d).await.expect("accept");

        let mut opts = mqtt::opts5(&broker, "cut-mqtt");
        opts.set_receive_maximum(Some(1)).set_manual_acks(true);
        let (mc, mut mev, _) = mqtt::connected5(opts).await;
        mc.subscribe("$stream/cut/first", v5::QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        let mp = mqtt::publish5(&mut mev).await;
        assert_eq!(user_property(&mp, "x-stream-offset"), Some(0));

        // The stream grows far past max_bytes; retention cuts under them.
        let body = vec![b'x'; 256];
        for _ in 1..MESSAGES {
            w.send_persistent("/queue/cut", &[], &body).await;
        }
        let deadline = Instant::now() + RETENTION_WAIT;
        let first = loop {
            let f = first_kept(&broker).await;
            if f > 1 {
                break f;
            }
            assert!(Instant::now() < deadline, "retention never cut the stream");
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let missed = first - 1;

        st.ack(&held).await;
        let next = st.message().await;
        assert_eq!(
            (
                next.header("x-stream-offset"),
                next.header("x-stream-missed")
            ),
            (
                Some(first.to_string().as_str()),
                Some(missed.to_string().as_str())
            ),
            "STOMP: {next:?}"
        );

        ar.set_credit(1).await.expect("credit");
        let d = amqp::recv_any(&mut ar).await;
        assert_eq!(
            (
                annotation(&d, "x-stream-offset"),
                annotation(&d, "x-stream-missed")
            ),
            (Some(first as i64), Some(missed as i64)),
            "AMQP"
        );
        ar.accept(&d).await.expect("accept");

        mc.ack(&mp).await.expect("ack");
        let p = mqtt::publish5(&mut mev).await;
        assert_eq!(
            (
                user_property(&p, "x-stream-offset"),
                user_property(&p, "x-stream-missed")
            ),
            (Some(first), Some(missed)),
            "MQTT 5"
        );
        // Only the first delivery after the cut says so.
        mc.ack(&p).await.expect("ack");
        let after = mqtt::publish5(&mut mev).await;
        assert_eq!(user_property(&after, "x-stream-offset"), Some(first + 1));
        assert_eq!(user_property(&after, "x-stream-missed"), None);
    }
}

mod kill_9 {
    //! A consumer group across `kill -9`s of the broker process: a reader
    //! acknowledges every message with a receipt while the broker is
    //! killed under it, then the group resumes on the same data directory.
    //! It must resume past every acknowledgement whose RECEIPT came back
    //! (a receipt promises durability, as for a queue) and at or before
    //! the first offset never acknowledged (nothing skipped).

    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::common::process::{frame, BrokerProcess, Stomp};

    const STREAM: &str = "/queue/kill9";
    /// Messages written before the first round: several times what the
    /// rounds' readers acknowledge before their kills, so each kill lands
    /// mid-read however fast the machine reads.
    const MESSAGES: u64 = 30_000;
    const ROUNDS: usize = 5;
    /// Acknowledgements a round's reader writes before the broker is
    /// killed. Counted rather than timed: a fixed run time let a fast
    /// reader (about 20,000 a second) exhaust the stream by round 4.
    const ACKED_BEFORE_KILL: u64 = 1_000;
    const IO_TIMEOUT: Duration = Duration::from_secs(20);
    const PIPELINE: u64 = 500;

    fn start(dir: &std::path::Path) -> BrokerProcess {
        BrokerProcess::start(dir, &["stomp"], "[store]\nsync = \"every-commit\"\n")
    }

    fn write_stream(addr: SocketAddr) {
        let mut s = Stomp::connect(addr, IO_TIMEOUT).expect("connect");
        let mut i = 0;
        while i < MESSAGES {
            let end = (i + PIPELINE).min(MESSAGES);
            let mut batch = Vec::new();
            for j in i..end {
                let receipt = format!("w{j}");
                let mut headers = vec![("destination", STREAM), ("persistent", "true")];
                headers.push(("x-queue-type", "stream"));
                if j + 1 == end {
                    headers.push(("receipt", &receipt));
                }
                batch.extend(frame("SEND", &headers, format!("m{j}").as_bytes()));
            }
            s.write(&batch).expect("send");
            match s.read().expect("read") {
                Some(f) if f.command == "RECEIPT" => {}
                other => panic!("expected the batch's RECEIPT, got {other:?}"),
            }
            i = end;
        }
    }

    /// What one round's reader saw.
    #[derive(Debug, Default)]
    struct Round {
        first: Option<u64>,
        /// Highest offset an ACK was written for.
        acked: Option<u64>,
        /// Highest offset whose ACK's RECEIPT came back.
        receipted: Option<u64>,
        /// Offsets arrived in order, one after another.
        dense: bool,
    }

    /// Reads the group, acknowledging each message (cumulative `ack:client`,
    /// receipt named by its offset) until the connection dies.
    fn ack_until_killed(
        addr: SocketAddr,
        group: &str,
        from_first: bool,
        acks: &AtomicU64,
    ) -> Round {
        let mut s = Stomp::connect(addr, IO_TIMEOUT).expect("connect");
        let mut headers = vec![
            ("id", "g"),
            ("destination", STREAM),
            ("ack", "client"),
            ("x-queue-type", "stream"),
            ("prefetch-count", "64"),
            ("x-stream-group", group),
        ];
        if from_first {
            headers.push(("x-stream-offset", "first"));
        }
        s.write(&frame("SUBSCRIBE", &headers, b""))
            .expect("subscribe");
        let mut r = Round {
            dense: true,
            ..Round::default()
        };
        let mut last: Option<u64> = None;
        loop {
            let f = match s.read() {
                Ok(Some(f)) => f,
                Ok(None) | Err(_) => return r,
            };
            match f.command.as_str() {
                "MESSAGE" => {
                    let offset: u64 = f
                        .header("x-stream-offset")
                        .and_then(|o| o.parse().ok())
                        .expect("an offset on every stream message");
                    r.first.get_or_insert(offset);
                    if last.is_some_and(|l| l + 1 != offset) {
                        r.dense = false;
                    }
                    last = Some(offset);
                    let receipt = offset.to_string();
                    let ack = frame("ACK", &[("id", &f.ack_id()), ("receipt", &receipt)], b"");
                    if s.write(&ack).is_err() {
                        return r;
                    }
                    r.acked = Some(offset);
                    acks.fetch_add(1, Ordering::Relaxed);
                }
                "RECEIPT" => {
                    let n: u64 = f
                        .header("receipt-id")
                        .and_then(|o| o.parse().ok())
                        .expect("our receipt ids are offsets");
                    r.receipted = r.receipted.max(Some(n));
                }
                other => panic!("unexpected {other}: {f:?}"),
            }
        }
    }

    #[test]
    fn a_group_resumes_after_kill_9_past_every_receipted_ack_and_skips_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut broker = start(dir.path());
        write_stream(broker.addr("stomp"));
        let mut before: Option<Round> = None;
        for round in 0..ROUNDS {
            let addr = broker.addr("stomp");
            let acks = Arc::new(AtomicU64::new(0));
            let counted = Arc::clone(&acks);
            let reader =
                std::thread::spawn(move || ack_until_killed(addr, "billing", round == 0, &counted));
            let deadline = Instant::now() + IO_TIMEOUT;
            while acks.load(Ordering::Relaxed) < ACKED_BEFORE_KILL {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: the reader acknowledged only {} in {IO_TIMEOUT:?}",
                    acks.load(Ordering::Relaxed)
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            broker.kill();
            let r = reader.join().expect("reader thread");
            let first = r.first.expect("the group was sent something");
            assert!(r.dense, "round {round}: offsets out of order or skipped");
            match &before {
                None => assert_eq!(first, 0, "round 0 starts at first"),
                Some(b) => {
                    // A slow disk may not have answered any ACK of a round.
                    if let Some(receipted) = b.receipted {
                        assert!(
                            first > receipted,
                            "round {round}: resumed at {first}, re-reading acknowledgements receipted up to {receipted}"
                        );
                    }
                    let acked = b.acked.expect("acks were sent");
                    assert!(
                        first <= acked + 1,
                        "round {round}: resumed at {first}, skipping past the last acknowledged {acked}"
                    );
                }
            }
            assert!(
                r.acked.is_some_and(|a| a + 1 < MESSAGES),
                "round {round}: the reader reached the end before the kill: {r:?}"
            );
            eprintln!("round {round}: {r:?}");
            before = Some(r);
            broker = start(dir.path());
        }
    }
}

mod history_memory {
    //! A reader of a stream's history costs the broker about its credit:
    //! a STOMP reader with `prefetch-count` 1,000 that ACKs cumulatively
    //! every 500 messages (each ACK settles 500 deliveries one by one, and
    //! each settlement lets the reader be sent one more) reads 6,000 1 KiB
    //! messages while the broker process's RSS is sampled.

    use std::time::Duration;

    use super::common::process::{frame, BrokerProcess, Stomp};

    const STREAM: &str = "/queue/history";
    const MESSAGES: usize = 6_000;
    const PREFETCH: usize = 1_000;
    /// The reader's credit is about 1 MiB of bodies; allow for the
    /// allocator, the connection buffers and the page of index entries.
    const RSS_GROWTH_MAX_BYTES: u64 = 48 * 1024 * 1024;
    const IO_TIMEOUT: Duration = Duration::from_secs(30);

    #[test]
    fn reading_history_costs_the_broker_about_the_readers_credit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let broker = BrokerProcess::start(dir.path(), &["stomp"], "");
        let mut w = Stomp::connect(broker.addr("stomp"), IO_TIMEOUT).expect("connect");
        let body = vec![b'h'; 1024];
        let mut batch = Vec::new();
        for i in 0..MESSAGES {
            let mut headers = vec![("destination", STREAM), ("x-queue-type", "stream")];
            if i + 1 == MESSAGES {
                headers.push(("receipt", "all"));
            }
            batch.extend(frame("SEND", &headers, &body));
        }
        w.write(&batch).expect("send");
        match w.read().expect("read") {
            Some(f) if f.command == "RECEIPT" => {}
            other => panic!("expected the RECEIPT, got {other:?}"),
        }
        let before = broker.status_bytes("VmRSS");
        let mut r = Stomp::connect(broker.addr("stomp"), IO_TIMEOUT).expect("connect");
        let prefetch = PREFETCH.to_string();
        r.write(&frame(
            "SUBSCRIBE",
            &[
                ("id", "h"),
                ("destination", STREAM),
                ("ack", "client"),
                ("x-stream-offset", "first"),
                ("prefetch-count", &prefetch),
            ],
            b"",
        ))
        .expect("subscribe");
        let mut peak = before;
        for i in 0..MESSAGES {
            let f = r.read().expect("read").expect("a MESSAGE");
            assert_eq!(f.command, "MESSAGE", "{f:?}");
            if i % (PREFETCH / 2) == PREFETCH / 2 - 1 {
                peak = peak.max(broker.status_bytes("VmRSS"));
                r.write(&frame("ACK", &[("id", &f.ack_id())], b""))
                    .expect("ack");
            }
        }
        peak = peak.max(broker.status_bytes("VmRSS"));
        let growth = peak.saturating_sub(before);
        assert!(
            growth < RSS_GROWTH_MAX_BYTES,
            "the broker's RSS grew {} KiB reading history with a credit of {PREFETCH} x 1 KiB",
            growth / 1024
        );
    }
}

mod tail_memory {
    //! Readers at the tail cost the broker less than their credit each:
    //! 100 STOMP readers at `next` with `prefetch-count` 1,000 (each on its
    //! own thread, ACKing cumulatively every 500, as the benchmark's do)
    //! read 5,000 1 KiB messages as they are appended, while the broker
    //! process's RSS is sampled: its growth divided by the readers stays
    //! below seven eighths of a reader's credit in bytes (570-680 KiB
    //! alone on a debug build; 777 KiB once beside other test binaries,
    //! which slow the readers, so more waits for them).
    //!
    //! Before the shared tail (the log's cached batches, one decoded
    //! message per record for all readers) and the deferred MESSAGE
    //! encoding, each reader cost about its whole credit here (990 KiB,
    //! failing this bound), and twice it in the release benchmark: its own
    //! copy of every chunk it read from the log, its own decoded messages,
    //! and up to its whole credit encoded in its output buffer at once.

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::common::process::{frame, BrokerProcess, Stomp};

    const STREAM: &str = "/queue/tail";
    const READERS: usize = 100;
    /// The bound, in eighths of a reader's credit: under the 990 KiB a
    /// reader cost before, with room for a loaded machine.
    const EIGHTHS_OF_CREDIT: u64 = 7;
    const PREFETCH: usize = 1_000;
    const MESSAGES: usize = 5_000;
    const BODY_BYTES: usize = 1024;
    /// Messages a producer batch holds (one write, the last with a
    /// receipt waited for).
    const BATCH: usize = 250;
    const IO_TIMEOUT: Duration = Duration::from_secs(60);

    fn subscribed(broker: &BrokerProcess) -> Stomp {
        let mut r = Stomp::connect(broker.addr("stomp"), IO_TIMEOUT).expect("connect");
        r.write(&frame(
            "SUBSCRIBE",
            &[
                ("id", "t"),
                ("destination", STREAM),
                ("ack", "client"),
                ("x-stream-offset", "next"),
                ("prefetch-count", &PREFETCH.to_string()),
                ("receipt", "subscribed"),
            ],
            b"",
        ))
        .expect("subscribe");
        assert!(matches!(r.read(), Ok(Some(f)) if f.command == "RECEIPT"));
        r
    }

    /// The process's resident set (`VmRSS`), in bytes.
    fn rss_bytes(pid: u32) -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// Reads every message, in order, ACKing every half credit.
    fn read_all(mut r: Stomp) {
        for i in 0..MESSAGES {
            let f = r.read().expect("read").expect("a MESSAGE");
            assert_eq!(f.command, "MESSAGE", "{f:?}");
            let offset = (i + 1).to_string();
            assert_eq!(f.header("x-stream-offset"), Some(offset.as_str()));
            if i % (PREFETCH / 2) == PREFETCH / 2 - 1 {
                r.write(&frame("ACK", &[("id", &f.ack_id())], b""))
                    .expect("ack");
            }
        }
    }

    #[test]
    fn readers_at_the_tail_cost_at_most_their_credit_each() {
        let dir = tempfile::tempdir().expect("tempdir");
        let broker = BrokerProcess::start(dir.path(), &["stomp"], "");
        let mut w = Stomp::connect(broker.addr("stomp"), IO_TIMEOUT).expect("connect");
        // Declared by one message before the readers come (offset 0).
        w.write(&frame(
            "SEND",
            &[
                ("destination", STREAM),
                ("x-queue-type", "stream"),
                ("receipt", "declared"),
            ],
            b"first",
        ))
        .expect("send");
        assert!(matches!(w.read(), Ok(Some(f)) if f.command == "RECEIPT"));
        let readers: Vec<Stomp> = (0..READERS).map(|_| subscribed(&broker)).collect();
        let before = broker.status_bytes("VmRSS");
        let reading: Vec<_> = readers
            .into_iter()
            .map(|r| std::thread::spawn(move || read_all(r)))
            .collect();
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let done = Arc::clone(&done);
            let pid = broker.child.id();
            std::thread::spawn(move || {
                let mut peak = 0;
                while !done.load(Ordering::Relaxed) {
                    peak = peak.max(rss_bytes(pid));
                    std::thread::sleep(Duration::from_millis(20));
                }
                peak
            })
        };
        let body = vec![b't'; BODY_BYTES];
        for b in 0..MESSAGES / BATCH {
            let mut batch = Vec::new();
            for i in 0..BATCH {
                let mut headers = vec![("destination", STREAM)];
                let receipt = format!("b{b}");
                if i + 1 == BATCH {
                    headers.push(("receipt", &receipt));
                }
                batch.extend(frame("SEND", &headers, &body));
            }
            w.write(&batch).expect("send");
            assert!(matches!(w.read(), Ok(Some(f)) if f.command == "RECEIPT"));
        }
        for r in reading {
            r.join().expect("a reader read everything in order");
        }
        done.store(true, Ordering::Relaxed);
        let peak = sampler.join().expect("sampler");
        let per_reader = peak.saturating_sub(before) / READERS as u64;
        let credit = (PREFETCH * BODY_BYTES) as u64;
        eprintln!(
            "RSS {} -> {} KiB at its peak: {} KiB per tail reader, credit {} KiB",
            before / 1024,
            peak / 1024,
            per_reader / 1024,
            credit / 1024
        );
        assert!(
            per_reader < credit * EIGHTHS_OF_CREDIT / 8,
            "each tail reader cost {} KiB, more than {EIGHTHS_OF_CREDIT}/8 of its credit of {} KiB",
            per_reader / 1024,
            credit / 1024
        );
    }
}
