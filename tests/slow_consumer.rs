//! Issue 13 item 2: a subscriber that stops reading no longer makes the
//! broker empty its backlog into the connection. A STOMP `ack:auto`
//! subscriber (its deliveries are settled as they are dispatched, so
//! credit never holds the core back) that never reads while MQTT clients
//! publish 1 GiB at QoS 0 to its topic: the broker
//! process's memory stays bounded (the subscriber's connection holds at
//! most its delivery buffer; the rest waits in its queue, paged to disk),
//! and a QoS 0 stream between two other clients on another topic keeps
//! flowing meanwhile. A second test closes such a subscriber after the
//! slow-consumer limit, and a third checks that a reader the buffer held
//! back is resumed once it has read.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::process::{frame, BrokerProcess, MqttWire, Stomp};

const MIB: u64 = 1024 * 1024;
const BUDGET_BYTES: u64 = 32 * MIB;
const MESSAGE_BYTES: usize = 64 * 1024;

fn broker(dir: &std::path::Path, slow_consumer_timeout_ms: u64) -> BrokerProcess {
    BrokerProcess::start(
        dir,
        &["mqtt", "stomp"],
        &format!(
            "[store]\nmemory_budget_bytes = {BUDGET_BYTES}\n\
             [broker]\nslow_consumer_timeout_ms = {slow_consumer_timeout_ms}\n"
        ),
    )
}

/// A subscriber that never reads, with a small socket buffer so the kernel
/// holds little for it.
fn stalled_subscriber(b: &BrokerProcess, topic: &str) -> MqttWire {
    let mut s = MqttWire::connect(b.addr("mqtt"), "stalled").expect("stalled connects");
    s.stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s.subscribe(topic, 0).expect("subscribe");
    s
}

#[test]
fn a_subscriber_that_never_reads_costs_bounded_memory_while_others_flow() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Never closed as slow here: the bound must hold however long it lasts.
    let b = broker(dir.path(), 0);
    let mut stalled =
        Stomp::connect(b.addr("stomp"), Duration::from_secs(30)).expect("stalled connects");
    stalled
        .write(&frame(
            "SUBSCRIBE",
            &[
                ("id", "0"),
                ("destination", "/topic/flood"),
                ("ack", "auto"),
                ("receipt", "subscribed"),
            ],
            b"",
        ))
        .expect("subscribe");
    let receipt = stalled.read().expect("read").expect("open");
    assert_eq!(receipt.command, "RECEIPT");

    // The other clients: a QoS 0 stream on its own topic, received by a
    // reader that keeps up, timed for its longest gap.
    let mut healthy = MqttWire::connect(b.addr("mqtt"), "healthy").expect("healthy connects");
    healthy.subscribe("steady", 0).expect("subscribe");
    let addr = b.addr("mqtt");
    let steady = std::thread::spawn(move || {
        let mut p = MqttWire::connect(addr, "steady-pub").expect("steady publisher");
        for i in 0..200u32 {
            p.stream
                .write_all(&MqttWire::publish_qos0("steady", &i.to_be_bytes()))
                .expect("publish steady");
            std::thread::sleep(Duration::from_millis(25));
        }
    });

    let baseline = b.status_bytes("VmRSS");
    let flood = std::thread::spawn(move || {
        let mut p = MqttWire::connect(addr, "flooder").expect("flood publisher");
        let packet = MqttWire::publish_qos0("flood", &vec![7u8; MESSAGE_BYTES]);
        let batch: Vec<u8> = packet.repeat(16);
        let started = Instant::now();
        // 1 GiB in 64 KiB messages, written 1 MiB at a time.
        for _ in 0..(1024 * MIB as usize / MESSAGE_BYTES / 16) {
            p.stream.write_all(&batch).expect("flood");
        }
        started.elapsed()
    });

    let mut received = 0u32;
    let mut longest_gap = Duration::ZERO;
    let mut last = Instant::now();
    while received < 200 {
        let (first, body) = healthy.read().expect("healthy subscriber reads");
        assert_eq!(first & 0xf0, 0x30, "PUBLISH");
        let payload = &body[2 + "steady".len()..];
        assert_eq!(payload, received.to_be_bytes(), "in order, none lost");
        received += 1;
        longest_gap = longest_gap.max(last.elapsed());
        last = Instant::now();
    }
    steady.join().expect("steady publisher");
    let flood_took = flood.join().expect("flood publisher");
    let peak = b.status_bytes("VmHWM");
    println!(
        "1 GiB to a subscriber that never reads in {flood_took:?}: broker RSS {} MiB at start, \
         peak {} MiB; steady stream's longest gap {longest_gap:?}",
        baseline / MIB,
        peak / MIB
    );
    // The budget (twice it before producers are held back), the stalled
    // connection's 4 MiB delivery buffer, the paging buffers and the
    // allocator's slack: well under the 1 GiB that used to pile up.
    assert!(
        peak.saturating_sub(baseline) < 4 * BUDGET_BYTES + 64 * MIB,
        "RSS grew by {} MiB",
        peak.saturating_sub(baseline) / MIB
    );
    assert!(
        longest_gap < Duration::from_secs(5),
        "the steady stream stalled for {longest_gap:?}"
    );
}

#[test]
fn a_subscriber_that_never_reads_is_closed_after_the_slow_consumer_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = broker(dir.path(), 1_000);
    let mut stalled = stalled_subscriber(&b, "flood");
    let mut p = MqttWire::connect(b.addr("mqtt"), "flooder").expect("publisher");
    let packet = MqttWire::publish_qos0("flood", &vec![7u8; MESSAGE_BYTES]);
    // 64 MiB: far more than its buffer and the socket's hold.
    for _ in 0..1024 {
        p.stream.write_all(&packet).expect("publish");
    }
    // Not reading for well past the limit, then reading: what was buffered
    // arrives, then the connection ends (3.1.1 has no DISCONNECT from the
    // server: the close is the message).
    std::thread::sleep(Duration::from_secs(5));
    let started = Instant::now();
    let mut publishes = 0u64;
    let ended = loop {
        match stalled.read() {
            Ok((first, _)) => {
                assert_eq!(first & 0xf0, 0x30, "only PUBLISHes");
                publishes += 1;
            }
            Err(e) => break e,
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still open after {publishes} messages"
        );
    };
    assert!(
        matches!(
            ended.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        ),
        "closed, not timed out: {ended}"
    );
    assert!(publishes < 1024, "the whole backlog was sent: {publishes}");
    // The publisher is unharmed.
    p.stream
        .write_all(&MqttWire::publish_qos0("other", b"x"))
        .expect("publisher still connected");
}

/// The other side of the bound: an `ack:auto` reader whose backlog is many
/// times its delivery buffer gets all of it, in order, with nothing else
/// happening on the broker. Once the buffer is full the core waits; only
/// the connection's driver, having written, resumes it (through the
/// adapter's session); no publish or acknowledgement would.
#[test]
fn a_reader_held_back_by_its_delivery_buffer_is_resumed_once_it_reads() {
    const COUNT: usize = 200;
    const SIZE: usize = 4 * 1024;
    let dir = tempfile::tempdir().expect("tempdir");
    let b = BrokerProcess::start(
        dir.path(),
        &["stomp"],
        "[broker]\ndelivery_buffer_bytes_max = 16384\n",
    );
    let mut producer =
        Stomp::connect(b.addr("stomp"), Duration::from_secs(30)).expect("producer connects");
    for i in 0..COUNT {
        let body = format!("{i:08}").repeat(SIZE / 8);
        let receipt = (i == COUNT - 1).then_some(("receipt", "sent"));
        let headers: Vec<(&str, &str)> = [("destination", "/queue/backlog")]
            .into_iter()
            .chain(receipt)
            .collect();
        producer
            .write(&frame("SEND", &headers, body.as_bytes()))
            .expect("send");
    }
    let receipt = producer.read().expect("read").expect("open");
    assert_eq!(receipt.command, "RECEIPT");

    let mut reader =
        Stomp::connect(b.addr("stomp"), Duration::from_secs(10)).expect("reader connects");
    reader
        .write(&frame(
            "SUBSCRIBE",
            &[
                ("id", "0"),
                ("destination", "/queue/backlog"),
                ("ack", "auto"),
            ],
            b"",
        ))
        .expect("subscribe");
    for i in 0..COUNT {
        let message = match reader.read() {
            Ok(Some(f)) => f,
            other => panic!("message {i} of {COUNT} did not come: {other:?}"),
        };
        assert_eq!(message.command, "MESSAGE");
        assert!(
            message.body.starts_with(format!("{i:08}").as_bytes()),
            "message {i} in order"
        );
    }
}
