//! Issue 13 item 3: large messages with bounded memory. Fifty producers
//! each send one persistent 16 MiB message at the same time while a slow
//! consumer takes them one by one; the broker process (a child, so its
//! memory is its own) stays within `memory_budget_bytes` plus the README's
//! stated cost of a message in flight (about twice its size) for each of
//! the fifty.
//!
//! Every protocol and transport carrying a 16 MiB payload with the default
//! limits is `transports.rs`'s `sixteen_mib_payloads_...` test.

mod common;

use std::time::{Duration, Instant};

use common::process::{frame, BrokerProcess, Stomp};

const MIB: u64 = 1024 * 1024;
const PRODUCERS: usize = 50;
const PAYLOAD_BYTES: usize = 16 * MIB as usize;
const BUDGET_BYTES: u64 = 64 * MIB;
/// The README's cost of a message in flight, as a multiple of its size.
const IN_FLIGHT_COST: u64 = 2;
const QUEUE: &str = "/queue/large";
const IO_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn fifty_concurrent_16_mib_publishes_and_a_slow_consumer_stay_within_the_stated_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = BrokerProcess::start(
        dir.path(),
        &["stomp"],
        &format!("[store]\nmemory_budget_bytes = {BUDGET_BYTES}\n"),
    );
    let addr = broker.addr("stomp");
    let baseline = broker.status_bytes("VmRSS");

    // The slow consumer: one message at a time, acknowledged after a pause.
    let consumer = std::thread::spawn(move || {
        let mut s = Stomp::connect(addr, IO_TIMEOUT).expect("consumer connects");
        s.write(&frame(
            "SUBSCRIBE",
            &[
                ("id", "slow"),
                ("destination", QUEUE),
                ("ack", "client-individual"),
                ("prefetch-count", "1"),
            ],
            b"",
        ))
        .expect("subscribe");
        let mut received = 0;
        while received < PRODUCERS {
            let f = s.read().expect("read").expect("consumer open");
            assert_eq!(
                f.command,
                "MESSAGE",
                "{:?}",
                String::from_utf8_lossy(&f.body)
            );
            assert_eq!(f.body.len(), PAYLOAD_BYTES);
            assert!(f.body.iter().all(|b| *b == f.body[0]), "body intact");
            std::thread::sleep(Duration::from_millis(20));
            let id = f.header("ack").expect("ack header").to_owned();
            s.write(&frame("ACK", &[("id", &id)], b"")).expect("ack");
            received += 1;
        }
        received
    });

    let started = Instant::now();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            std::thread::spawn(move || {
                let mut s = Stomp::connect(addr, IO_TIMEOUT).expect("producer connects");
                let body = vec![b'a' + (p % 26) as u8; PAYLOAD_BYTES];
                let receipt = format!("p{p}");
                s.write(&frame(
                    "SEND",
                    &[
                        ("destination", QUEUE),
                        ("persistent", "true"),
                        ("receipt", &receipt),
                    ],
                    &body,
                ))
                .expect("send");
                drop(body);
                let f = s.read().expect("read").expect("producer open");
                assert_eq!(
                    f.command,
                    "RECEIPT",
                    "{:?}",
                    String::from_utf8_lossy(&f.body)
                );
                assert_eq!(f.header("receipt-id"), Some(receipt.as_str()));
            })
        })
        .collect();
    for p in producers {
        p.join().expect("producer");
    }
    let sent_in = started.elapsed();
    assert_eq!(consumer.join().expect("consumer"), PRODUCERS);

    let peak = broker.status_bytes("VmHWM");
    let bound = BUDGET_BYTES + PRODUCERS as u64 * IN_FLIGHT_COST * PAYLOAD_BYTES as u64;
    println!(
        "{PRODUCERS} x {} MiB: sent in {sent_in:?}; broker RSS {} MiB at start, peak {} MiB \
         (+{} MiB; bound +{} MiB)",
        PAYLOAD_BYTES as u64 / MIB,
        baseline / MIB,
        peak / MIB,
        peak.saturating_sub(baseline) / MIB,
        bound / MIB,
    );
    assert!(
        peak.saturating_sub(baseline) <= bound,
        "peak RSS grew by {} MiB, over the budget plus {IN_FLIGHT_COST}x each message in flight ({} MiB)",
        peak.saturating_sub(baseline) / MIB,
        bound / MIB
    );
}
