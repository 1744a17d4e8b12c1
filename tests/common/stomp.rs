//! A minimal STOMP client for the integration tests. No maintained Rust
//! STOMP client exists, so this speaks the wire format directly: it writes
//! frames as given and reads frames honouring `content-length`.
//!
//! Received header names and values are kept exactly as they were on the
//! wire (still escaped), so tests can check the server's escaping; use
//! [`unescape`] to decode them.

// Shared by several test crates, each using a subset through `mod common`.
#![allow(unreachable_pub)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One received frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub command: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Frame {
    /// The first header named `name` (the one STOMP says wins), raw.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `name`, in order, raw.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The 1.2 ack id of a MESSAGE (`ack`, else `message-id`).
    pub fn ack_id(&self) -> String {
        self.header("ack")
            .or_else(|| self.header("message-id"))
            .expect("MESSAGE has an ack id")
            .to_owned()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Decodes STOMP 1.2 header escapes (`\n`, `\r`, `\c`, `\\`).
pub fn unescape(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('c') => out.push(':'),
            Some('\\') => out.push('\\'),
            other => panic!("bad escape \\{other:?} from the server in {raw:?}"),
        }
    }
    out
}

pub struct StompClient {
    stream: super::ws::BoxedIo,
    buf: Vec<u8>,
    /// MESSAGEs that arrived while a RECEIPT was awaited (a redelivery may
    /// overtake the RECEIPT of the NACK that caused it).
    held: VecDeque<Frame>,
    /// Heart-beat EOLs received between frames so far.
    pub eols: usize,
}

pub const TIMEOUT: Duration = Duration::from_secs(10);
/// How long "nothing arrives" is waited for.
pub const QUIET: Duration = Duration::from_millis(300);

/// Encodes one frame: `command`, headers as given (no escaping is added),
/// `content-length` when there is a body and none was given, the body, NUL.
pub fn encode(command: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(command.as_bytes());
    out.push(b'\n');
    for (n, v) in headers {
        out.extend_from_slice(format!("{n}:{v}\n").as_bytes());
    }
    // Like most clients, always say how long the body is, so it may hold NULs.
    if !body.is_empty() && !headers.iter().any(|(n, _)| *n == "content-length") {
        out.extend_from_slice(format!("content-length:{}\n", body.len()).as_bytes());
    }
    out.push(b'\n');
    out.extend_from_slice(body);
    out.push(0);
    out
}

impl StompClient {
    pub async fn connect_raw(addr: SocketAddr) -> StompClient {
        Self::from_stream(TcpStream::connect(addr).await.expect("tcp connect"))
    }

    /// A client on a socket the test connected itself (nothing sent yet).
    pub fn from_stream(stream: TcpStream) -> StompClient {
        stream.set_nodelay(true).expect("nodelay");
        Self::from_io(stream)
    }

    /// A client on any byte stream (e.g. [`super::ws::carry`]'s, for STOMP
    /// over WebSocket); nothing sent yet.
    pub fn from_io(io: impl super::ws::ClientIo + 'static) -> StompClient {
        StompClient {
            stream: Box::new(io),
            buf: Vec::new(),
            held: VecDeque::new(),
            eols: 0,
        }
    }

    /// Connects and negotiates 1.2 with the given extra CONNECT headers.
    pub async fn connect(addr: SocketAddr, headers: &[(&str, &str)]) -> StompClient {
        Self::connect_version(addr, "1.2", headers).await.0
    }

    /// Connects offering `accept-version` (`""`: no header, i.e. 1.0),
    /// asserts CONNECTED and returns it.
    pub async fn connect_version(
        addr: SocketAddr,
        accept_version: &str,
        headers: &[(&str, &str)],
    ) -> (StompClient, Frame) {
        let mut c = Self::connect_raw(addr).await;
        let f = c.handshake(accept_version, headers).await;
        assert_eq!(f.command, "CONNECTED", "{f:?}");
        (c, f)
    }

    /// Sends CONNECT and returns the answer (CONNECTED or ERROR).
    pub async fn handshake(&mut self, accept_version: &str, headers: &[(&str, &str)]) -> Frame {
        let mut h = vec![("host", "localhost")];
        if !accept_version.is_empty() {
            h.push(("accept-version", accept_version));
        }
        h.extend_from_slice(headers);
        self.send_frame("CONNECT", &h, b"").await;
        self.recv().await.expect("answer to CONNECT")
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Like [`Self::send_raw`] but tolerates a server that already closed.
    pub async fn try_send_raw(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok()
    }

    /// A clean DISCONNECT (with its RECEIPT awaited), then the socket is dropped.
    pub async fn disconnect(mut self) {
        self.send_frame("DISCONNECT", &[("receipt", "close")], b"")
            .await;
        self.expect_receipt("close").await;
        self.expect_closed().await;
    }

    pub async fn send_frame(&mut self, command: &str, headers: &[(&str, &str)], body: &[u8]) {
        self.send_raw(&encode(command, headers, body)).await;
    }

    /// Sends `command` with a `receipt` header and waits for that RECEIPT.
    pub async fn request(&mut self, command: &str, headers: &[(&str, &str)], body: &[u8]) {
        let receipt = format!("rcpt-{}", rand_id());
        let mut h = headers.to_vec();
        h.push(("receipt", &receipt));
        self.send_frame(command, &h, body).await;
        self.expect_receipt(&receipt).await;
    }

    /// The next frame other than a MESSAGE must be the RECEIPT for `id`;
    /// MESSAGEs before it are kept for [`Self::recv`].
    pub async fn expect_receipt(&mut self, id: &str) {
        let f = loop {
            let f = tokio::time::timeout(TIMEOUT, self.recv_inner())
                .await
                .expect("frame within timeout")
                .expect("RECEIPT, not a close");
            if f.command != "MESSAGE" {
                break f;
            }
            self.held.push_back(f);
        };
        assert_eq!(
            (f.command.as_str(), f.header("receipt-id")),
            ("RECEIPT", Some(id)),
            "{f:?}"
        );
    }

    /// SUBSCRIBE (confirmed by a receipt).
    pub async fn subscribe(&mut self, id: &str, dest: &str, ack: &str, extra: &[(&str, &str)]) {
        let mut h = vec![("id", id), ("destination", dest), ("ack", ack)];
        h.extend_from_slice(extra);
        self.request("SUBSCRIBE", &h, b"").await;
    }

    /// A persistent SEND, confirmed by a receipt.
    pub async fn send_persistent(&mut self, dest: &str, extra: &[(&str, &str)], body: &[u8]) {
        let mut h = vec![("destination", dest), ("persistent", "true")];
        h.extend_from_slice(extra);
        self.request("SEND", &h, body).await;
    }

    /// Persistent SENDs of `m0` .. `m{n-1}` to `dest`, in order, each
    /// confirmed by its receipt before the next is sent.
    pub async fn send_numbered(&mut self, dest: &str, n: usize) {
        for i in 0..n {
            self.send_persistent(dest, &[], format!("m{i}").as_bytes())
                .await;
        }
    }

    /// The next frame, which must be a MESSAGE.
    pub async fn message(&mut self) -> Frame {
        let f = self.recv().await.expect("MESSAGE, not a close");
        assert_eq!(f.command, "MESSAGE", "{f:?}");
        f
    }

    /// The next `n` frames, which must all be MESSAGEs.
    pub async fn messages(&mut self, n: usize) -> Vec<Frame> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.message().await);
        }
        v
    }

    /// The next MESSAGE, or `None` when nothing arrives for a while.
    pub async fn message_or_none(&mut self) -> Option<Frame> {
        let f = self.recv_within(QUIET).await?;
        assert_eq!(f.command, "MESSAGE", "{f:?}");
        Some(f)
    }

    /// ACK (1.2 `id`) confirmed by a receipt.
    pub async fn ack(&mut self, msg: &Frame) {
        let id = msg.ack_id();
        self.request("ACK", &[("id", &id)], b"").await;
    }

    /// The next frame, skipping heart-beat EOLs; `None` when the server closed.
    pub async fn recv(&mut self) -> Option<Frame> {
        if let Some(f) = self.held.pop_front() {
            return Some(f);
        }
        tokio::time::timeout(TIMEOUT, self.recv_inner())
            .await
            .expect("frame within timeout")
    }

    /// The next frame within `wait`, or `None` if nothing arrives.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<Frame> {
        if let Some(f) = self.held.pop_front() {
            return Some(f);
        }
        tokio::time::timeout(wait, self.recv_inner())
            .await
            .ok()
            .flatten()
    }

    /// Asserts that no frame arrives for a while.
    pub async fn expect_nothing(&mut self) {
        if let Some(f) = self.recv_within(QUIET).await {
            panic!("expected no frame, got {f:?}");
        }
    }

    /// The next frame must be an ERROR, and then the server must close.
    pub async fn expect_error_then_close(&mut self) -> Frame {
        let f = self.recv().await.expect("ERROR, not a silent close");
        assert_eq!(f.command, "ERROR", "{f:?}");
        assert!(
            f.header("message").is_some_and(|m| !m.is_empty()),
            "ERROR needs a message header: {f:?}"
        );
        assert!(!f.body.is_empty(), "ERROR needs an explanatory body: {f:?}");
        self.expect_closed().await;
        f
    }

    /// The server closes the connection (EOF) without sending a frame.
    pub async fn expect_closed(&mut self) {
        assert!(self.held.is_empty(), "unread frames: {:?}", self.held);
        let next = tokio::time::timeout(TIMEOUT, self.recv_inner())
            .await
            .expect("close within timeout");
        assert!(next.is_none(), "expected a close, got {next:?}");
    }

    async fn recv_inner(&mut self) -> Option<Frame> {
        loop {
            let eols = self
                .buf
                .iter()
                .take_while(|b| matches!(b, b'\n' | b'\r'))
                .count();
            self.eols += self.buf[..eols].iter().filter(|b| **b == b'\n').count();
            self.buf.drain(..eols);
            if let Some(frame) = self.parse() {
                return Some(frame);
            }
            // Read straight into the buffer: a big array on the future's
            // stack overflows the test thread in debug builds.
            self.buf.reserve(64 * 1024);
            let n = match self.stream.read_buf(&mut self.buf).await {
                Ok(n) => n,
                // A reset after the server's close counts as a close.
                Err(_) => return None,
            };
            if n == 0 {
                return None;
            }
        }
    }

    fn parse(&mut self) -> Option<Frame> {
        parse_frame(&mut self.buf)
    }
}

/// Takes the first whole frame off the front of `buf` (which must not
/// start with heart-beat EOLs), or `None` if it is not all there yet.
pub fn parse_frame(buf: &mut Vec<u8>) -> Option<Frame> {
    // The head ends at the first empty line (LF LF or CRLF CRLF): one
    // scan over the LFs, so big buffers of small frames stay cheap.
    let (head_end, body_start) = buf
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .find_map(|(i, _)| match buf.get(i + 1..) {
            Some([b'\n', ..]) => Some((i, i + 2)),
            Some([b'\r', b'\n', ..]) => Some((i, i + 3)),
            _ => None,
        })?;
    let head = String::from_utf8_lossy(&buf[..head_end]).replace('\r', "");
    let mut lines = head.lines();
    let command = lines.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':').map(|(n, v)| (n.to_owned(), v.to_owned())))
        .collect();
    let len = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let body_end = match len {
        Some(len) => {
            if buf.len() < body_start + len + 1 {
                return None;
            }
            assert_eq!(
                buf[body_start + len],
                0,
                "frame from the server must end with NUL after content-length bytes"
            );
            body_start + len
        }
        None => body_start + buf[body_start..].iter().position(|b| *b == 0)?,
    };
    let body = buf[body_start..body_end].to_vec();
    buf.drain(..=body_end);
    Some(Frame {
        command,
        headers,
        body,
    })
}

/// A process-unique id for receipts and names.
pub fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
