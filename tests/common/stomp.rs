//! A minimal STOMP client for the integration tests. No maintained Rust
//! STOMP client exists, so this speaks the wire format directly: it writes
//! frames as given and reads frames honouring `content-length`.

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
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

pub struct StompClient {
    stream: TcpStream,
    buf: Vec<u8>,
}

pub const TIMEOUT: Duration = Duration::from_secs(10);

impl StompClient {
    pub async fn connect_raw(addr: SocketAddr) -> StompClient {
        let stream = TcpStream::connect(addr).await.expect("tcp connect");
        stream.set_nodelay(true).expect("nodelay");
        StompClient {
            stream,
            buf: Vec::new(),
        }
    }

    /// Connects and negotiates 1.2 with the given extra CONNECT headers.
    pub async fn connect(addr: SocketAddr, headers: &[(&str, &str)]) -> StompClient {
        let mut c = Self::connect_raw(addr).await;
        let mut h = vec![("accept-version", "1.2"), ("host", "localhost")];
        h.extend_from_slice(headers);
        c.send_frame("CONNECT", &h, b"").await;
        let f = c.recv().await.expect("CONNECTED");
        assert_eq!(f.command, "CONNECTED", "{f:?}");
        c
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    pub async fn send_frame(&mut self, command: &str, headers: &[(&str, &str)], body: &[u8]) {
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
        self.send_raw(&out).await;
    }

    /// The next frame, skipping heart-beat EOLs; `None` when the server closed.
    pub async fn recv(&mut self) -> Option<Frame> {
        tokio::time::timeout(TIMEOUT, self.recv_inner())
            .await
            .expect("frame within timeout")
    }

    /// The next frame within `wait`, or `None` if nothing arrives.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<Frame> {
        tokio::time::timeout(wait, self.recv_inner())
            .await
            .ok()
            .flatten()
    }

    async fn recv_inner(&mut self) -> Option<Frame> {
        loop {
            while matches!(self.buf.first(), Some(b'\n' | b'\r')) {
                self.buf.remove(0);
            }
            if let Some(frame) = self.parse() {
                return Some(frame);
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn parse(&mut self) -> Option<Frame> {
        let head_end = self.buf.windows(2).position(|w| w == b"\n\n")?;
        let head = String::from_utf8_lossy(&self.buf[..head_end]).replace('\r', "");
        let mut lines = head.lines();
        let command = lines.next()?.to_owned();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':').map(|(n, v)| (n.to_owned(), v.to_owned())))
            .collect();
        let body_start = head_end + 2;
        let len = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse::<usize>().ok());
        let body_end = match len {
            Some(len) => {
                if self.buf.len() < body_start + len + 1 {
                    return None;
                }
                body_start + len
            }
            None => body_start + self.buf[body_start..].iter().position(|b| *b == 0)?,
        };
        let body = self.buf[body_start..body_end].to_vec();
        self.buf.drain(..=body_end);
        Some(Frame {
            command,
            headers,
            body,
        })
    }
}
