//! A small STOMP 1.2 client: frame encoding, an incremental decoder with
//! size limits, and CONNECT. No good async Rust STOMP client exists, and the
//! benchmark needs exact control over receipts, prefetch and ACKs.

use std::borrow::Cow;

use bytes::{Buf, Bytes, BytesMut};
use memchr::memchr;
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

/// A decoded frame.
///
/// Cheap to make, since the load generator decodes every frame a broker
/// sends and must not be what limits a benchmark (it shares the machine's
/// cores with the broker): the commands a broker sends are not allocated,
/// and the header lines stay as received (a slice of the read buffer,
/// checked once) until one is asked for, unescaped (STOMP 1.2) then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) command: Cow<'static, str>,
    /// The header lines as received (UTF-8, each with a colon, escapes
    /// valid), every line ended by LF (a CR before it is not part of it).
    head: Bytes,
    pub(crate) body: Bytes,
}

/// Commands a broker sends, matched without allocating.
const SERVER_COMMANDS: [&str; 4] = ["MESSAGE", "RECEIPT", "ERROR", "CONNECTED"];

/// The lines of a header block, without their CR LF or LF.
fn lines(head: &str) -> impl Iterator<Item = &str> {
    head.split_terminator('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
}

impl Frame {
    /// The headers as received: (name, value), still escaped.
    fn raw_headers(&self) -> impl Iterator<Item = (&str, &str)> {
        // Checked by `decode`: UTF-8, and every line has a colon.
        lines(std::str::from_utf8(&self.head).unwrap_or_default()).filter_map(|l| l.split_once(':'))
    }

    /// First value of a header (STOMP: the first occurrence wins).
    pub(crate) fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        self.raw_headers()
            .find(|(n, _)| unescape(n).is_ok_and(|n| n == name))
            .and_then(|(_, v)| unescape(v).ok())
    }

    /// All headers, in order (for error messages).
    pub(crate) fn headers(&self) -> Vec<(String, String)> {
        self.raw_headers()
            .filter_map(|(n, v)| {
                Some((
                    unescape(n).ok()?.into_owned(),
                    unescape(v).ok()?.into_owned(),
                ))
            })
            .collect()
    }

    fn error_text(&self) -> String {
        let msg = self.header("message").unwrap_or_default();
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

/// `v` unescaped (borrowed when it holds no escape).
fn unescape(v: &str) -> Result<Cow<'_, str>, StompError> {
    if !v.contains('\\') {
        return Ok(Cow::Borrowed(v));
    }
    let mut out = String::with_capacity(v.len());
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
    Ok(Cow::Owned(out))
}

/// Appends `v` in decimal, without allocating.
fn push_decimal(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// The command line and header lines of a frame, escaped: a head
/// [`Writer::send_with_receipt`] sends again and again.
pub(crate) fn encode_head(command: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_headers(&mut out, command, headers);
    out
}

fn encode_headers(out: &mut Vec<u8>, command: &str, headers: &[(&str, &str)]) {
    out.extend_from_slice(command.as_bytes());
    out.push(b'\n');
    for (k, v) in headers {
        out.extend_from_slice(escape(k).as_bytes());
        out.push(b':');
        out.extend_from_slice(escape(v).as_bytes());
        out.push(b'\n');
    }
}

/// Appends a frame to `out`. A body always gets a content-length, so binary
/// payloads (which may contain NUL) are framed by length.
pub(crate) fn encode(out: &mut Vec<u8>, command: &str, headers: &[(&str, &str)], body: &[u8]) {
    encode_headers(out, command, headers);
    finish(out, body);
}

/// The content-length (for a body), the blank line, the body and the NUL.
fn finish(out: &mut Vec<u8>, body: &[u8]) {
    if !body.is_empty() {
        out.extend_from_slice(b"content-length:");
        push_decimal(out, body.len() as u64);
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(body);
    out.push(0);
}

fn utf8(l: &[u8]) -> Result<&str, StompError> {
    std::str::from_utf8(l).map_err(|_| StompError::Malformed("header not UTF-8"))
}

/// Where the header block that starts at `from` ends (just past its blank
/// line), if it is all in `buf`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut pos = from;
    loop {
        let nl = pos + memchr(b'\n', buf.get(pos..)?)?;
        let line = &buf[pos..nl];
        if line.is_empty() || line == b"\r" {
            return Some(nl + 1);
        }
        pos = nl + 1;
    }
}

/// The `content-length` of a header block, checking that every line has
/// a colon and every escape is valid.
fn check_escaped_head(head: &str) -> Result<Option<usize>, StompError> {
    let mut length = None;
    for l in lines(head) {
        if l.is_empty() {
            break;
        }
        let (k, v) = l
            .split_once(':')
            .ok_or(StompError::Malformed("header without ':'"))?;
        let k = unescape(k)?;
        let v = unescape(v)?;
        if length.is_none() && k == "content-length" {
            length = Some(content_length(&v)?);
        }
    }
    Ok(length)
}

/// [`check_escaped_head`] of a block without a backslash (every frame
/// the broker sends, nearly): nothing to unescape, so each line is
/// searched once for its end and its colon as bytes. The `str` line split
/// and a backslash search per name and value cost the load generator
/// more per MESSAGE (about 6,000 instructions) than the broker spent
/// sending it, and the load generator shares the broker's cores.
fn check_plain_head(head: &[u8]) -> Result<Option<usize>, StompError> {
    let mut length = None;
    let mut rest = head;
    while !rest.is_empty() {
        let nl = memchr(b'\n', rest).unwrap_or(rest.len());
        let line = &rest[..nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        rest = rest.get(nl + 1..).unwrap_or_default();
        if line.is_empty() {
            break;
        }
        let colon = memchr(b':', line).ok_or(StompError::Malformed("header without ':'"))?;
        if length.is_none() && &line[..colon] == b"content-length" {
            length = Some(content_length(utf8(&line[colon + 1..])?)?);
        }
    }
    Ok(length)
}

fn content_length(v: &str) -> Result<usize, StompError> {
    v.trim()
        .parse::<usize>()
        .map_err(|_| StompError::Malformed("content-length"))
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
    // The command line, then the header block up to its blank line.
    let Some(command_end) = memchr(b'\n', buf) else {
        return if buf.len() > FRAME_SIZE_MAX {
            Err(StompError::TooLarge)
        } else {
            Ok(None)
        };
    };
    let Some(body_start) = head_end(buf, command_end + 1) else {
        return if buf.len() > FRAME_SIZE_MAX {
            Err(StompError::TooLarge)
        } else {
            Ok(None)
        };
    };
    let first = &buf[..command_end];
    let first = utf8(first.strip_suffix(b"\r").unwrap_or(first))?;
    if first.is_empty() {
        return Err(StompError::Malformed("no command"));
    }
    let command = match SERVER_COMMANDS.iter().find(|c| **c == first) {
        Some(c) => Cow::Borrowed(*c),
        None => Cow::Owned(first.to_owned()),
    };
    // One check of the header block: UTF-8, a colon per line, escapes;
    // and the content-length, if any.
    let head = utf8(&buf[command_end + 1..body_start])?;
    let length = if head.as_bytes().contains(&b'\\') {
        check_escaped_head(head)?
    } else {
        check_plain_head(head.as_bytes())?
    };
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
    let mut head = frame_bytes.freeze();
    head.advance(command_end + 1);
    Ok(Some(Frame {
        command,
        head,
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

    /// Sends `head` (from [`encode_head`]) with a `receipt` header of
    /// `receipt` and `body`: what [`Writer::send`] would, without encoding
    /// the same headers again.
    pub(crate) async fn send_with_receipt(
        &mut self,
        head: &[u8],
        receipt: u64,
        body: &[u8],
    ) -> Result<(), StompError> {
        self.buf.extend_from_slice(head);
        self.buf.extend_from_slice(b"receipt:");
        push_decimal(&mut self.buf, receipt);
        self.buf.push(b'\n');
        finish(&mut self.buf, body);
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
    let version = f
        .header("version")
        .map_or_else(|| "1.0".to_owned(), Cow::into_owned);
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
        assert_eq!(
            frames[0].header("destination").as_deref(),
            Some("/queue/a:b")
        );
        assert_eq!(frames[0].header("content-length").as_deref(), Some("3"));
        assert_eq!(&frames[0].body[..], b"x\0y");
        assert_eq!(frames[1].command, "ACK");
        assert!(frames[1].body.is_empty());
        assert!(buf.is_empty());
    }

    #[test]
    fn a_prepared_head_encodes_as_the_whole_frame_does() {
        let mut whole = Vec::new();
        encode(
            &mut whole,
            "SEND",
            &[("destination", "/queue/a:b"), ("receipt", "42")],
            b"xy",
        );
        let mut prepared = encode_head("SEND", &[("destination", "/queue/a:b")]);
        prepared.extend_from_slice(b"receipt:");
        push_decimal(&mut prepared, 42);
        prepared.push(b'\n');
        finish(&mut prepared, b"xy");
        assert_eq!(prepared, whole);
    }

    #[test]
    fn frame_without_length_ends_at_nul_and_crlf_headers() {
        let mut buf = BytesMut::from(&b"MESSAGE\r\nack:ID\\c1\r\n\r\nhello\0"[..]);
        let f = decode(&mut buf).expect("valid").expect("complete");
        assert_eq!(f.header("ack").as_deref(), Some("ID:1"));
        assert_eq!(&f.body[..], b"hello");
    }

    #[test]
    fn the_plain_head_check_agrees_with_the_escaped_one() {
        for head in [
            "a:1\ncontent-length:5\n\n",
            "content-length: 7 \r\nx:y\r\n\r\n",
            "a:1\nb\n\n",
            "content-length:x\n\n",
            "a:b\ncontent-length:3\ncontent-length:4\n\n",
            ":v\n\n",
            "\n",
            "x:y\n\ncontent-length:9\n",
        ] {
            let plain = check_plain_head(head.as_bytes());
            let escaped = check_escaped_head(head);
            assert_eq!(format!("{plain:?}"), format!("{escaped:?}"), "{head:?}");
        }
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
