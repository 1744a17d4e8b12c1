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

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
struct Broker {
    child: Child,
    addr: SocketAddr,
    /// Keeps draining the broker's log so it never blocks on a full pipe.
    _log: std::thread::JoinHandle<()>,
}

fn start_broker(dir: &Path) -> Broker {
    let config = dir.join("rosetta.toml");
    let data = dir.join("data");
    std::fs::write(
        &config,
        format!(
            "data_dir = {data:?}\n\
             [listeners]\n\
             stomp = \"127.0.0.1:0\"\n\
             mqtt = \"\"\namqp = \"\"\nwebsocket = \"\"\nmqtts = \"\"\n\
             stomps = \"\"\namqps = \"\"\nwss = \"\"\nany = \"\"\n\
             [store]\nsync = \"every-commit\"\n"
        ),
    )
    .expect("write config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rosetta"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rosetta");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    let log = std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = listening_addr(&line) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(addr);
                }
            }
            if line.contains("ERROR") || line.contains("WARN") || line.contains("panick") {
                eprintln!("broker: {line}");
            }
        }
    });
    let addr = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(a) => a,
        Err(_) => {
            let _ = child.kill();
            panic!("the broker did not log its STOMP listener");
        }
    };
    Broker {
        child,
        addr,
        _log: log,
    }
}

/// The address of `listening listener="stomp" addr=127.0.0.1:N`.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("listening") || !line.contains("stomp") {
        return None;
    }
    let rest = &line[line.find("addr=")? + 5..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    rest[..end].trim_matches('"').parse().ok()
}

/// A blocking STOMP 1.2 connection, enough for this test.
struct Stomp {
    stream: TcpStream,
    buf: Vec<u8>,
}

struct Frame {
    command: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Frame {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Stomp {
    fn connect(addr: SocketAddr) -> std::io::Result<Stomp> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        let mut s = Stomp {
            stream,
            buf: Vec::new(),
        };
        s.write(&frame(
            "CONNECT",
            &[("accept-version", "1.2"), ("host", "h")],
            b"",
        ))?;
        match s.read()? {
            Some(f) if f.command == "CONNECTED" => Ok(s),
            _ => Err(std::io::Error::other("no CONNECTED")),
        }
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next frame; `None` at EOF.
    fn read(&mut self) -> std::io::Result<Option<Frame>> {
        loop {
            while matches!(self.buf.first(), Some(b'\n' | b'\r')) {
                self.buf.remove(0);
            }
            if let Some(f) = self.parse() {
                return Ok(Some(f));
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn parse(&mut self) -> Option<Frame> {
        let head_end = self.buf.windows(2).position(|w| w == b"\n\n")?;
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let mut lines = head.lines();
        let command = lines.next()?.to_owned();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':').map(|(n, v)| (n.to_owned(), v.to_owned())))
            .collect();
        let start = head_end + 2;
        let len = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse::<usize>().ok());
        let end = match len {
            Some(len) if self.buf.len() > start + len => start + len,
            Some(_) => return None,
            None => start + self.buf[start..].iter().position(|b| *b == 0)?,
        };
        let body = self.buf[start..end].to_vec();
        self.buf.drain(..=end);
        Some(Frame {
            command,
            headers,
            body,
        })
    }
}

fn frame(command: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(command.as_bytes());
    out.push(b'\n');
    for (n, v) in headers {
        out.extend_from_slice(format!("{n}:{v}\n").as_bytes());
    }
    if !body.is_empty() {
        out.extend_from_slice(format!("content-length:{}\n", body.len()).as_bytes());
    }
    out.push(b'\n');
    out.extend_from_slice(body);
    out.push(0);
    out
}

/// Sends persistent messages in pipelined batches until the broker dies,
/// recording each id whose RECEIPT came back.
fn produce(addr: SocketAddr, round: usize, p: usize, receipted: Arc<Mutex<Vec<String>>>) {
    let Ok(mut s) = Stomp::connect(addr) else {
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
    let mut s = Stomp::connect(addr).expect("consumer connects");
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
            let addr = broker.addr;
            std::thread::spawn(move || produce(addr, r, p, receipted))
        })
        .collect();
    std::thread::sleep(RUN_BEFORE_KILL);
    // Child::kill is SIGKILL on unix: no shutdown, no flush.
    broker.child.kill().expect("SIGKILL the broker");
    let _ = broker.child.wait();
    for p in producers {
        p.join().expect("producer thread");
    }
    let receipted = std::mem::take(&mut *receipted.lock().expect("lock"));

    let mut recovered = start_broker(dir);
    let seen = drain(recovered.addr);
    recovered.child.kill().expect("kill the recovered broker");
    let _ = recovered.child.wait();

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
