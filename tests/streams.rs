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
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
    write_stream(&broker, 5).await;
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
