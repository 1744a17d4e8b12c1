//! A small STOMP 1.2 client: frame encoding, an incremental decoder with
//! size limits, and CONNECT. No good async Rust STOMP client exists, and the
//! benchmark needs exact control over receipts, prefetch and ACKs.

use std::borrow::Cow;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::run::Target;

/// Largest frame accepted from a broker (headers and body).
const FRAME_SIZE_MAX: usize = 4 << 20;
/// Write buffer per connection; frames beyond it go out at once.
const WRITE_BUF_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub(crate) enum StompError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    #[error("frame larger than {FRAME_SIZE_MAX} bytes")]
    TooLarge,
    #[error("connection closed by the broker")]
    Closed,
    #[error("broker sent ERROR: {0}")]
    Broker(String),
    #[error("expected {expected}, got {got}")]
    Unexpected { expected: &'static str, got: String },
}

/// A decoded frame. Header values are unescaped (STOMP 1.2).
///
/// Cheap to make, since the load generator decodes every frame a broker
/// sends and must not be what limits a benchmark: the commands a broker
/// sends are not allocated, and all header text is in one string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) command: Cow<'static, str>,
    /// Every header's name and value, one after the other.
    text: String,
    /// Per header: name start, value start, value end in `text`.
    spans: Vec<[usize; 3]>,
    pub(crate) body: Bytes,
}

/// Commands a broker sends, matched without allocating.
const SERVER_COMMANDS: [&str; 4] = ["MESSAGE", "RECEIPT", "ERROR", "CONNECTED"];

impl Frame {
    /// First value of a header (STOMP: the first occurrence wins).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.spans
            .iter()
            .find(|[n, v, _]| self.text.get(*n..*v) == Some(name))
            .and_then(|[_, v, e]| self.text.get(*v..*e))
    }

    /// All headers, in order (for error messages).
    pub(crate) fn headers(&self) -> Vec<(&str, &str)> {
        self.spans
            .iter()
            .filter_map(|[n, v, e]| Some((self.text.get(*n..*v)?, self.text.get(*v..*e)?)))
            .collect()
    }

    fn error_text(&self) -> String {
        let msg = self.header("message").unwrap_or("");
        format!("{msg} {}", String::from_utf8_lossy(&self.body))
    }
}

fn escape(v: &str) -> Cow<'_, str> {
    if !v.bytes().any(|b| matches!(b, b'\\' | b'\n' | b'\r' | b':')) {
        return Cow::Borrowed(v);
    }
    let mut out = String::with_capacity(v.len() + 4);
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            ':' => out.push_str("\\c"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Appends `v` unescaped to `out`.
fn unescape_into(out: &mut String, v: &str) -> Result<(), StompError> {
    if !v.contains('\\') {
        out.push_str(v);
        return Ok(());
    }
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next() {
            Some('\\') => '\\',
            Some('n') => '\n',
            Some('r') => '\r',
            Some('c') => ':',
            _ => return Err(StompError::Malformed("bad escape in header")),
        });
    }
    Ok(())
}

/// Appends a frame to `out`. A body always gets a content-length, so binary
/// payloads (which may contain NUL) are framed by length.
pub(crate) fn encode(out: &mut Vec<u8>, command: &str, headers: &[(&str, &str)], body: &[u8]) {
    out.extend_from_slice(command.as_bytes());
    out.push(b'\n');
    for (k, v) in headers {
        out.extend_from_slice(escape(k).as_bytes());
        out.push(b':');
        out.extend_from_slice(escape(v).as_bytes());
        out.push(b'\n');
    }
    if !body.is_empty() {
        out.extend_from_slice(b"content-length:");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(body);
    out.push(0);
}

fn utf8(l: &[u8]) -> Result<&str, StompError> {
    std::str::from_utf8(l).map_err(|_| StompError::Malformed("header not UTF-8"))
}

/// Takes one complete frame off the front of `buf`; `Ok(None)` means more
/// bytes are needed. Heart-beat EOLs before a frame are skipped.
pub(crate) fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, StompError> {
    let skip = buf
        .iter()
        .take_while(|&&b| b == b'\n' || b == b'\r')
        .count();
    buf.advance(skip);
    if buf.is_empty() {
        return Ok(None);
    }
    // Header block: lines up to the first empty line.
    let mut pos = 0;
    let mut lines: Vec<&[u8]> = Vec::new();
    let body_start = loop {
        let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') else {
            return if buf.len() > FRAME_SIZE_MAX {
                Err(StompError::TooLarge)
            } else {
                Ok(None)
            };
        };
        let mut line = &buf[pos..pos + nl];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        pos += nl + 1;
        if line.is_empty() {
            break pos;
        }
        lines.push(line);
    };
    let (first, rest) = lines
        .split_first()
        .ok_or(StompError::Malformed("no command"))?;
    let first = utf8(first)?;
    let command = match SERVER_COMMANDS.iter().find(|c| **c == first) {
        Some(c) => Cow::Borrowed(*c),
        None => Cow::Owned(first.to_owned()),
    };
    let mut text = String::with_capacity(body_start);
    let mut spans = Vec::with_capacity(rest.len());
    for l in rest {
        let l = utf8(l)?;
        let (k, v) = l
            .split_once(':')
            .ok_or(StompError::Malformed("header without ':'"))?;
        let n = text.len();
        unescape_into(&mut text, k)?;
        let vs = text.len();
        unescape_into(&mut text, v)?;
        spans.push([n, vs, text.len()]);
    }
    let length = spans
        .iter()
        .find(|[n, v, _]| text.get(*n..*v) == Some("content-length"))
        .and_then(|[_, v, e]| text.get(*v..*e))
        .map(|v| v.trim().parse::<usize>())
        .transpose()
        .map_err(|_| StompError::Malformed("content-length"))?;
    let body_end = match length {
        Some(n) => {
            if n > FRAME_SIZE_MAX {
                return Err(StompError::TooLarge);
            }
            if buf.len() < body_start + n + 1 {
                return Ok(None);
            }
            if buf[body_start + n] != 0 {
                return Err(StompError::Malformed("no NUL after content-length body"));
            }
            body_start + n
        }
        None => match buf[body_start..].iter().position(|&b| b == 0) {
            Some(i) => body_start + i,
            None if buf.len() > FRAME_SIZE_MAX => return Err(StompError::TooLarge),
            None => return Ok(None),
        },
    };
    let mut frame_bytes = buf.split_to(body_end + 1);
    frame_bytes.truncate(body_end);
    let body = frame_bytes.split_off(body_start).freeze();
    Ok(Some(Frame {
        command,
        text,
        spans,
        body,
    }))
}

/// The receiving half of a connection.
#[derive(Debug)]
pub(crate) struct Reader {
    rd: OwnedReadHalf,
    buf: BytesMut,
}

impl Reader {
    /// A frame already buffered, without reading the socket.
    pub(crate) fn buffered(&mut self) -> Result<Option<Frame>, StompError> {
        decode(&mut self.buf)
    }

    /// Reads more bytes into the buffer (cancel-safe).
    pub(crate) async fn fill(&mut self) -> Result<(), StompError> {
        self.buf.reserve(64 * 1024);
        if self.rd.read_buf(&mut self.buf).await? == 0 {
            return Err(StompError::Closed);
        }
        Ok(())
    }

    pub(crate) async fn frame(&mut self) -> Result<Frame, StompError> {
        loop {
            if let Some(f) = self.buffered()? {
                if f.command == "ERROR" {
                    return Err(StompError::Broker(f.error_text()));
                }
                return Ok(f);
            }
            self.fill().await?;
        }
    }
}

/// The sending half of a connection, buffered: call [`Writer::flush`].
/// Frames are encoded straight into the buffer (one copy), which is
/// written once it holds [`WRITE_BUF_BYTES`].
#[derive(Debug)]
pub(crate) struct Writer {
    wr: OwnedWriteHalf,
    buf: Vec<u8>,
}

impl Writer {
    pub(crate) async fn send(
        &mut self,
        command: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), StompError> {
        encode(&mut self.buf, command, headers, body);
        if self.buf.len() >= WRITE_BUF_BYTES {
            self.write_out().await?;
        }
        Ok(())
    }

    async fn write_out(&mut self) -> Result<(), StompError> {
        self.wr.write_all(&self.buf).await?;
        self.buf.clear();
        Ok(())
    }

    pub(crate) async fn flush(&mut self) -> Result<(), StompError> {
        if !self.buf.is_empty() {
            self.write_out().await?;
        }
        self.wr.flush().await?;
        Ok(())
    }
}

/// Credentials and virtual host for CONNECT.
#[derive(Debug, Clone, Default)]
pub(crate) struct Login {
    pub(crate) login: Option<String>,
    pub(crate) passcode: Option<String>,
    pub(crate) host: String,
    /// Each connection sends `client-id: {prefix}-{n}` (a balancer key).
    pub(crate) client_id_prefix: Option<String>,
}

/// The `n` of the next connection's `client-id`.
static NEXT_CLIENT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Opens a STOMP 1.2 connection; returns the halves and the negotiated
/// version.
pub(crate) async fn connect(
    target: &Target,
    login: &Login,
) -> Result<(Reader, Writer, String), StompError> {
    let (rd, wr) = target.connect().await?.into_split();
    let mut r = Reader {
        rd,
        buf: BytesMut::with_capacity(64 * 1024),
    };
    let mut w = Writer {
        wr,
        buf: Vec::with_capacity(WRITE_BUF_BYTES * 2),
    };
    let mut headers = vec![
        ("accept-version", "1.0,1.1,1.2"),
        ("host", login.host.as_str()),
        ("heart-beat", "0,0"),
    ];
    if let Some(l) = &login.login {
        headers.push(("login", l));
    }
    if let Some(p) = &login.passcode {
        headers.push(("passcode", p));
    }
    let client_id = login.client_id_prefix.as_ref().map(|prefix| {
        let n = NEXT_CLIENT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{prefix}-{n}")
    });
    if let Some(id) = &client_id {
        headers.push(("client-id", id));
    }
    w.send("CONNECT", &headers, b"").await?;
    w.flush().await?;
    let f = r.frame().await?;
    if f.command != "CONNECTED" {
        return Err(StompError::Unexpected {
            expected: "CONNECTED",
            got: f.command.into_owned(),
        });
    }
    let version = f.header("version").unwrap_or("1.0").to_owned();
    Ok((r, w, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_binary_body_and_escapes() {
        let mut out = Vec::new();
        encode(&mut out, "SEND", &[("destination", "/queue/a:b")], b"x\0y");
        encode(&mut out, "ACK", &[("id", "1")], b"");
        // heart-beat EOLs between frames are skipped
        out.extend_from_slice(b"\n\r\n");
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        // one byte at a time: every prefix is "need more", never an error
        for b in out {
            buf.extend_from_slice(&[b]);
            while let Some(f) = decode(&mut buf).expect("valid stream") {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].command, "SEND");
        assert_eq!(frames[0].header("destination"), Some("/queue/a:b"));
        assert_eq!(frames[0].header("content-length"), Some("3"));
        assert_eq!(&frames[0].body[..], b"x\0y");
        assert_eq!(frames[1].command, "ACK");
        assert!(frames[1].body.is_empty());
        assert!(buf.is_empty());
    }

    #[test]
    fn frame_without_length_ends_at_nul_and_crlf_headers() {
        let mut buf = BytesMut::from(&b"MESSAGE\r\nack:ID\\c1\r\n\r\nhello\0"[..]);
        let f = decode(&mut buf).expect("valid").expect("complete");
        assert_eq!(f.header("ack"), Some("ID:1"));
        assert_eq!(&f.body[..], b"hello");
    }

    #[test]
    fn malformed_and_oversized() {
        let mut buf = BytesMut::from(&b"SEND\nno-colon\n\n\0"[..]);
        assert!(matches!(decode(&mut buf), Err(StompError::Malformed(_))));
        let mut buf = BytesMut::from(&b"SEND\ncontent-length:2\n\nabc\0"[..]);
        assert!(matches!(decode(&mut buf), Err(StompError::Malformed(_))));
        let mut buf = BytesMut::from(&b"SEND\nx:\\t\n\n\0"[..]);
        assert!(matches!(decode(&mut buf), Err(StompError::Malformed(_))));
        let mut big = b"SEND\n\n".to_vec();
        big.resize(FRAME_SIZE_MAX + 2, b'a');
        let mut buf = BytesMut::from(&big[..]);
        assert!(matches!(decode(&mut buf), Err(StompError::TooLarge)));
    }
}
