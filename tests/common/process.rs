//! The real `rosetta` binary as a child process, for tests that kill it or
//! measure its memory apart from the test's own, and a small blocking
//! STOMP 1.2 client to drive it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

// The blocking client speaks the same frames as the async one: one frame
// type, one encoder (`frame`, as these tests call it), one parser.
use rosetta::READY_LOG_LINE as READY_LINE;

use super::stomp::parse_frame;
pub use super::stomp::{encode as frame, Frame};

/// Every listener of `[listeners]`: the ones a test does not ask for are
/// switched off.
const LISTENERS: [&str; 9] = [
    "mqtt",
    "stomp",
    "amqp",
    "websocket",
    "mqtts",
    "stomps",
    "amqps",
    "wss",
    "any",
];

/// Log lines a [`BrokerProcess`] keeps for the test to look at; later ones
/// are only drained (a chatty broker must not grow the test's memory).
const LOG_LINES_KEPT_MAX: usize = 10_000;
/// A log line the start-up waits for.
enum StartLine {
    Listening(String, SocketAddr),
    Ready,
}

/// The broker binary on a data directory, with the asked-for listeners on
/// free loopback ports.
pub struct BrokerProcess {
    pub child: Child,
    addrs: HashMap<String, SocketAddr>,
    /// The first [`LOG_LINES_KEPT_MAX`] lines of the broker's log.
    log_lines: Arc<Mutex<Vec<String>>>,
    /// Keeps draining the broker's log so it never blocks on a full pipe.
    _log: std::thread::JoinHandle<()>,
}

impl BrokerProcess {
    /// Starts the binary with `dir/rosetta.toml` (data in `dir/data`),
    /// `listeners` on free ports and `extra` appended to the configuration
    /// (whole sections, e.g. `[store]`; not `[listeners]`).
    pub fn start(dir: &Path, listeners: &[&str], extra: &str) -> BrokerProcess {
        Self::start_with_fd_limit(dir, listeners, extra, None)
    }

    /// [`Self::start`], with the soft file-descriptor limit lowered to
    /// `soft_nofile` before the broker runs (`ulimit -S -n` in a shell that
    /// then execs it), as a service manager's default would.
    pub fn start_with_fd_limit(
        dir: &Path,
        listeners: &[&str],
        extra: &str,
        soft_nofile: Option<u64>,
    ) -> BrokerProcess {
        let config = dir.join("rosetta.toml");
        let data = dir.join("data");
        let mut text = format!("data_dir = {data:?}\n[listeners]\n");
        for l in LISTENERS {
            let addr = if listeners.contains(&l) {
                "127.0.0.1:0"
            } else {
                ""
            };
            text.push_str(&format!("{l} = \"{addr}\"\n"));
        }
        text.push_str(extra);
        if !extra.contains("[admin]") {
            // The admin API's default port is one for the whole machine:
            // brokers started side by side (cluster nodes, parallel tests)
            // would fight over it.
            text.push_str("\n[admin]\nlisten = \"\"\n");
        }
        std::fs::write(&config, text).expect("write config");
        let mut command = match soft_nofile {
            None => Command::new(env!("CARGO_BIN_EXE_rosetta")),
            Some(soft) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("ulimit -S -n {soft} && exec \"$0\" \"$@\""))
                    .arg(env!("CARGO_BIN_EXE_rosetta"));
                sh
            }
        };
        let mut child = command
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
        let log_lines = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&log_lines);
        let log = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some((name, addr)) = listening(&line) {
                    let _ = tx.send(StartLine::Listening(name, addr));
                } else if line.contains(READY_LINE) {
                    let _ = tx.send(StartLine::Ready);
                }
                if line.contains("ERROR") || line.contains("WARN") || line.contains("panick") {
                    eprintln!("broker: {line}");
                }
                if let Ok(mut kept) = kept.lock() {
                    if kept.len() < LOG_LINES_KEPT_MAX {
                        kept.push(line);
                    }
                }
            }
        });
        // Every listener's address, then the ready line: the listeners
        // log as they bind, before the admin API is given the broker.
        let mut addrs = HashMap::new();
        let mut ready = false;
        while addrs.len() < listeners.len() || !ready {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(StartLine::Listening(name, addr)) => {
                    addrs.insert(name, addr);
                }
                Ok(StartLine::Ready) => ready = true,
                Err(_) => {
                    let _ = child.kill();
                    panic!("the broker did not log its listeners {listeners:?} and {READY_LINE:?}");
                }
            }
        }
        BrokerProcess {
            child,
            addrs,
            log_lines,
            _log: log,
        }
    }

    /// The broker's log lines so far that contain `needle`.
    pub fn log_lines_with(&self, needle: &str) -> Vec<String> {
        self.log_lines
            .lock()
            .map(|lines| {
                lines
                    .iter()
                    .filter(|l| l.contains(needle))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The address of a listener asked for at start.
    pub fn addr(&self, listener: &str) -> SocketAddr {
        self.addrs[listener]
    }

    /// A field of `/proc/<pid>/status` in bytes (`VmRSS`, `VmHWM`).
    pub fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the broker");
        let _ = self.child.wait();
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `listening listener="stomp" addr=127.0.0.1:N` as (listener, address).
fn listening(line: &str) -> Option<(String, SocketAddr)> {
    if !line.contains("listening") {
        return None;
    }
    // The admin API is not a `[listeners]` entry: ask for "admin" with
    // `[admin] listen = "127.0.0.1:0"` in `extra`.
    let name = if line.contains("admin API listening") {
        "admin"
    } else {
        LISTENERS.into_iter().find(|l| {
            line.contains(&format!("listener=\"{l}\"")) || line.contains(&format!("listener={l} "))
        })?
    };
    let rest = &line[line.find("addr=")? + 5..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    let addr = rest[..end].trim_matches('"').parse().ok()?;
    Some((name.to_owned(), addr))
}

/// A blocking STOMP 1.2 connection, enough for these tests.
pub struct Stomp {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Stomp {
    /// Connects (CONNECT, CONNECTED) with reads timing out after `timeout`.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Stomp> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
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

    /// Writes raw bytes (one or more frames).
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next frame; `None` at EOF.
    pub fn read(&mut self) -> std::io::Result<Option<Frame>> {
        loop {
            let skip = self
                .buf
                .iter()
                .take_while(|b| matches!(b, b'\n' | b'\r'))
                .count();
            self.buf.drain(..skip);
            if let Some(f) = parse_frame(&mut self.buf) {
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
}

/// An MQTT 3.1.1 packet: `first` byte, remaining length, `body`.
pub fn mqtt_packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut len = body.len();
    loop {
        let mut byte = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// A blocking MQTT 3.1.1 connection that only writes and reads packets
/// whole: enough to publish, subscribe, and stop reading on purpose.
pub struct MqttWire {
    pub stream: TcpStream,
}

impl MqttWire {
    /// Connects with a clean session and keep-alive 0 (no pings needed
    /// while the test is not reading), and reads the CONNACK.
    pub fn connect(addr: SocketAddr, client_id: &str) -> std::io::Result<MqttWire> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut m = MqttWire { stream };
        let mut connect = Vec::new();
        put_str(&mut connect, "MQTT");
        connect.extend_from_slice(&[4, 0x02, 0, 0]);
        put_str(&mut connect, client_id);
        m.stream.write_all(&mqtt_packet(0x10, &connect))?;
        let (first, body) = m.read()?;
        if first != 0x20 || body.get(1) != Some(&0) {
            return Err(std::io::Error::other(format!(
                "CONNACK {first:#x} {body:?}"
            )));
        }
        Ok(m)
    }

    /// SUBSCRIBE `filter` at `qos` and wait for the SUBACK.
    pub fn subscribe(&mut self, filter: &str, qos: u8) -> std::io::Result<()> {
        let mut body = vec![0, 1];
        put_str(&mut body, filter);
        body.push(qos);
        self.stream.write_all(&mqtt_packet(0x82, &body))?;
        match self.read()? {
            (0x90, _) => Ok(()),
            (other, _) => Err(std::io::Error::other(format!(
                "expected SUBACK, got {other:#x}"
            ))),
        }
    }

    /// The bytes of a QoS 0 PUBLISH.
    pub fn publish_qos0(topic: &str, payload: &[u8]) -> Vec<u8> {
        let mut body = Vec::with_capacity(topic.len() + 2 + payload.len());
        put_str(&mut body, topic);
        body.extend_from_slice(payload);
        mqtt_packet(0x30, &body)
    }

    /// Reads one packet: (first byte, body).
    pub fn read(&mut self) -> std::io::Result<(u8, Vec<u8>)> {
        let mut first = [0u8; 1];
        self.stream.read_exact(&mut first)?;
        let mut len = 0usize;
        let mut shift = 0;
        loop {
            let mut b = [0u8; 1];
            self.stream.read_exact(&mut b)?;
            len |= usize::from(b[0] & 0x7f) << shift;
            shift += 7;
            if b[0] & 0x80 == 0 {
                break;
            }
        }
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body)?;
        Ok((first[0], body))
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}
