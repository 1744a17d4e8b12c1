//! Crash test through a real protocol: the `rosetta` binary is killed with
//! SIGKILL while STOMP producers send persistent messages with receipts.
//!
//! Each round starts the real broker binary on a data directory kept
//! across rounds, has several producer connections pipeline persistent
//! SENDs (each asking for a RECEIPT) as fast as the broker answers, and
//! records every message whose RECEIPT arrived. Mid-stream the broker is
//! killed with SIGKILL; it is then started again on the same data, and a
//! STOMP consumer drains the queue. Every receipted message must be there
//! exactly once (and no message at all may be there twice). The consumer
//! acknowledges everything, so the next round starts from an empty queue
//! over a journal full of acknowledgements that recovery must honour.
//!
//! `harness = false` (see Cargo.toml): this file has its own `main`.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::process::{frame, BrokerProcess, Stomp};

const QUEUE: &str = "/queue/crash-stomp";
const PRODUCERS: usize = 4;
/// SENDs a producer writes before it waits for their RECEIPTs: enough to
/// keep group commits full without a huge backlog.
const PIPELINE: usize = 32;
/// How long the producers run before the kill.
const RUN_BEFORE_KILL: Duration = Duration::from_millis(1000);
const ROUNDS: usize = 3;
/// Fewest receipted messages per round for the round to mean anything.
const RECEIPTED_MIN: usize = 50;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The broker binary on `dir`, with only a STOMP listener on a free port.
fn start_broker(dir: &Path) -> BrokerProcess {
    BrokerProcess::start(dir, &["stomp"], "[store]\nsync = \"every-commit\"\n")
}

/// Sends persistent messages in pipelined batches until the broker dies,
/// recording each id whose RECEIPT came back.
fn produce(addr: SocketAddr, round: usize, p: usize, receipted: Arc<Mutex<Vec<String>>>) {
    let Ok(mut s) = Stomp::connect(addr, IO_TIMEOUT) else {
        return;
    };
    let mut next = 0u64;
    loop {
        let mut batch = Vec::new();
        let mut ids = Vec::with_capacity(PIPELINE);
        for _ in 0..PIPELINE {
            let id = format!("r{round}-p{p}-{next}");
            next += 1;
            batch.extend(frame(
                "SEND",
                &[
                    ("destination", QUEUE),
                    ("persistent", "true"),
                    ("receipt", &id),
                ],
                id.as_bytes(),
            ));
            ids.push(id);
        }
        if s.write(&batch).is_err() {
            return;
        }
        for id in ids {
            match s.read() {
                Ok(Some(f)) if f.command == "RECEIPT" => {
                    // Receipts come in the order of the frames that asked.
                    assert_eq!(f.header("receipt-id"), Some(id.as_str()), "receipt order");
                    receipted.lock().expect("lock").push(id);
                }
                Ok(Some(f)) => panic!(
                    "producer {p}: unexpected {} {:?}",
                    f.command,
                    String::from_utf8_lossy(&f.body)
                ),
                // The broker was killed.
                Ok(None) | Err(_) => return,
            }
        }
    }
}

/// Drains the queue, acknowledging everything, and counts each body.
fn drain(addr: SocketAddr) -> HashMap<String, usize> {
    let mut s = Stomp::connect(addr, IO_TIMEOUT).expect("consumer connects");
    s.write(&frame(
        "SUBSCRIBE",
        &[
            ("id", "drain"),
            ("destination", QUEUE),
            ("ack", "client"),
            ("prefetch-count", "10000"),
        ],
        b"",
    ))
    .expect("subscribe");
    // The drain ends after this much silence. Generous: a recovered broker
    // on a loaded two-core machine (builds, fuzzers) can pause longer than
    // half a second, and ending early would report receipted messages as
    // lost when they were only late.
    s.stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut last_ack = None;
    let mut unacked = 0;
    loop {
        match s.read() {
            Ok(Some(f)) if f.command == "MESSAGE" => {
                *seen
                    .entry(String::from_utf8_lossy(&f.body).into_owned())
                    .or_default() += 1;
                last_ack = f.header("ack").map(str::to_owned);
                unacked += 1;
                // Cumulative ACKs now and then keep the prefetch window open.
                if unacked >= 1000 {
                    let id = last_ack.take().expect("ack id");
                    s.write(&frame("ACK", &[("id", &id)], b"")).expect("ack");
                    unacked = 0;
                }
            }
            Ok(Some(f)) => panic!(
                "consumer: unexpected {} {:?}",
                f.command,
                String::from_utf8_lossy(&f.body)
            ),
            Ok(None) => panic!("the recovered broker closed the consumer"),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => panic!("consumer: {e}"),
        }
    }
    s.stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .expect("timeout");
    if let Some(id) = last_ack {
        s.write(&frame("ACK", &[("id", &id), ("receipt", "acked")], b""))
            .expect("ack");
        match s.read() {
            Ok(Some(f)) if f.command == "RECEIPT" => {}
            _ => panic!("no RECEIPT for the final ACK"),
        }
    }
    seen
}

fn round(dir: &Path, r: usize) -> usize {
    let mut broker = start_broker(dir);
    let receipted = Arc::new(Mutex::new(Vec::new()));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let receipted = Arc::clone(&receipted);
            let addr = broker.addr("stomp");
            std::thread::spawn(move || produce(addr, r, p, receipted))
        })
        .collect();
    std::thread::sleep(RUN_BEFORE_KILL);
    broker.kill();
    for p in producers {
        p.join().expect("producer thread");
    }
    let receipted = std::mem::take(&mut *receipted.lock().expect("lock"));

    let mut recovered = start_broker(dir);
    let seen = drain(recovered.addr("stomp"));
    recovered.kill();

    for id in &receipted {
        assert_eq!(
            seen.get(id).copied(),
            Some(1),
            "round {r}: receipted message {id} must be recovered exactly once"
        );
    }
    for (id, n) in &seen {
        assert_eq!(*n, 1, "round {r}: message {id} recovered {n} times");
        assert!(
            id.starts_with(&format!("r{r}-")),
            "round {r}: message {id} of an earlier round came back after its ACK"
        );
    }
    assert!(
        receipted.len() >= RECEIPTED_MIN,
        "round {r}: only {} messages were receipted",
        receipted.len()
    );
    println!(
        "crash_stomp round {r}: {} receipted messages recovered exactly once ({} recovered in all)",
        receipted.len(),
        seen.len()
    );
    receipted.len()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test -- <filter>` passes its own args; a filter that does not
    // name this test skips it, like the libtest harness would.
    if args
        .iter()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"crash_stomp".contains(a.as_str()))
    {
        println!("0 passed, 0 failed, 1 skipped");
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut total = 0;
    for r in 0..ROUNDS {
        total += round(dir.path(), r);
    }
    println!(
        "crash_stomp: {total} receipted messages checked over {ROUNDS} kill -9 rounds in {:?}",
        started.elapsed()
    );
    println!("1 passed, 0 failed");
}
