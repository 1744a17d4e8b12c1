//! Just enough HTTP/1.1 for etcd's JSON gateway: one POST per connection
//! (`Connection: close`), a response body of either kind (length or
//! chunked), read whole or as a stream of newline-separated JSON
//! messages (how the gateway streams a watch).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::EtcdError;

/// Largest response head: the gateway's are a few hundred bytes.
const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Largest response body or streamed message: a range over the cluster
/// prefix holds one small record per node.
pub(crate) const BODY_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Most headers in a response head.
const HEADERS_MAX: usize = 32;
/// Read buffer growth step, and the most one read takes.
pub(crate) const READ_CHUNK_BYTES: usize = 8 * 1024;

/// An open response: its status and the body still to be read from
/// `stream` (a socket; an in-memory peer when fuzzed).
pub(crate) struct Response<S = TcpStream> {
    stream: S,
    /// Bytes read past the head, not yet decoded.
    raw: Vec<u8>,
    body: Body,
    /// Decoded body bytes not yet handed out.
    decoded: Vec<u8>,
    /// How many of the first bytes of `decoded` hold no newline: each
    /// byte of a streamed message is searched once, not once per read
    /// (a 4 MiB message read 8 KiB at a time took 512 searches of up to
    /// 4 MiB each).
    scanned: usize,
    /// Every byte `next_line` searched, for the test of finding 4.
    #[cfg(test)]
    searched: usize,
    finished: bool,
    /// A framing fault met after body bytes before it were decoded: it is
    /// returned once those bytes are handed out, so what came before the
    /// fault reads the same however the peer's bytes were split across
    /// reads (fuzzing finding 5).
    deferred: Option<EtcdError>,
    pub(crate) status: u16,
}

enum Body {
    Length(usize),
    Chunked(ChunkState),
    UntilClose,
}

#[derive(Clone, Copy)]
enum ChunkState {
    /// Expecting a size line.
    Size,
    /// In a chunk with this many bytes left.
    Data(usize),
    /// Expecting the CRLF after a chunk.
    DataEnd,
    /// After the last (zero-size) chunk: trailer lines, this many bytes of
    /// them so far, up to the empty line that ends the body.
    Trailer(usize),
}

/// Sends `POST path` with a JSON body to `host:port`, and reads the head
/// of the response, within `timeout`.
pub(crate) async fn post(
    authority: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<Response, EtcdError> {
    tokio::time::timeout(timeout, post_untimed(authority, path, body))
        .await
        .map_err(|_| EtcdError::Timeout)?
}

async fn post_untimed(authority: &str, path: &str, body: &[u8]) -> Result<Response, EtcdError> {
    let mut stream = TcpStream::connect(authority).await?;
    stream.set_nodelay(true)?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.flush().await?;
    read_head(stream).await
}

/// Reads a response head from `stream`; the response, with what was read
/// past the head kept for the body.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    mut stream: S,
) -> Result<Response<S>, EtcdError> {
    let mut raw = Vec::with_capacity(READ_CHUNK_BYTES);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&raw) {
            Ok(httparse::Status::Complete(len)) => {
                let status = response.code.unwrap_or(0);
                let body = body_kind(response.headers)?;
                let rest = raw.split_off(len);
                return Ok(Response {
                    stream,
                    raw: rest,
                    body,
                    decoded: Vec::new(),
                    scanned: 0,
                    #[cfg(test)]
                    searched: 0,
                    deferred: None,
                    finished: false,
                    status,
                });
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(EtcdError::Http(format!("bad response head: {e}"))),
        }
        if raw.len() > HEAD_BYTES_MAX {
            return Err(EtcdError::Http("response head too large".into()));
        }
        if read_more(&mut stream, &mut raw).await? == 0 {
            return Err(EtcdError::Http("closed before the response head".into()));
        }
    }
}

fn body_kind(headers: &[httparse::Header<'_>]) -> Result<Body, EtcdError> {
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding")
            && String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("chunked")
        {
            return Ok(Body::Chunked(ChunkState::Size));
        }
    }
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n: usize = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| EtcdError::Http("bad content-length".into()))?;
            if n > BODY_BYTES_MAX {
                return Err(EtcdError::Http("response body too large".into()));
            }
            return Ok(Body::Length(n));
        }
    }
    Ok(Body::UntilClose)
}

/// Reads what is there into `buf`. Cancel-safe (a watch is read inside
/// `select!`): the bytes land in `buf` only once the read completed.
async fn read_more<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Result<usize, EtcdError> {
    let mut chunk = [0u8; READ_CHUNK_BYTES];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

impl<S: AsyncRead + Unpin> Response<S> {
    /// The whole body.
    pub(crate) async fn body(mut self, timeout: Duration) -> Result<Vec<u8>, EtcdError> {
        tokio::time::timeout(timeout, async {
            while !self.finished {
                self.fill().await?;
            }
            Ok(std::mem::take(&mut self.decoded))
        })
        .await
        .map_err(|_| EtcdError::Timeout)?
    }

    /// The next newline-terminated message of a streamed body (without
    /// the newline); `None` when the body ended. No timeout: a watch waits
    /// as long as nothing happens.
    pub(crate) async fn next_line(&mut self) -> Result<Option<Vec<u8>>, EtcdError> {
        loop {
            let unsearched = self.decoded.get(self.scanned..).unwrap_or_default();
            #[cfg(test)]
            {
                self.searched += unsearched.len();
            }
            if let Some(found) = unsearched.iter().position(|b| *b == b'\n') {
                let at = self.scanned + found;
                self.scanned = 0;
                let mut line: Vec<u8> = self.decoded.drain(..=at).collect();
                line.pop();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            self.scanned = self.decoded.len();
            if self.finished {
                self.scanned = 0;
                let rest = std::mem::take(&mut self.decoded);
                return Ok((!rest.iter().all(u8::is_ascii_whitespace)).then_some(rest));
            }
            self.fill().await?;
        }
    }

    /// Decodes what has been read; reads more when that is not enough.
    async fn fill(&mut self) -> Result<(), EtcdError> {
        if let Some(fault) = self.deferred.take() {
            return Err(fault);
        }
        let progressed = self.decode()?;
        if self.decoded.len() > BODY_BYTES_MAX {
            return Err(EtcdError::Http("response body too large".into()));
        }
        if progressed || self.finished {
            return Ok(());
        }
        if read_more(&mut self.stream, &mut self.raw).await? == 0 {
            match self.body {
                Body::UntilClose => self.finished = true,
                _ => return Err(EtcdError::Http("closed inside the response body".into())),
            }
        }
        Ok(())
    }

    /// Moves body bytes from `raw` to `decoded`; whether anything moved
    /// or finished. A fault after some bytes moved is kept in `deferred`
    /// for the next `fill`.
    fn decode(&mut self) -> Result<bool, EtcdError> {
        let mut progressed = false;
        match self.decode_into(&mut progressed) {
            Err(fault) if progressed => {
                self.deferred = Some(fault);
                Ok(true)
            }
            other => other.map(|()| progressed),
        }
    }

    /// `decode`'s work; sets `progressed` when anything moved or finished.
    fn decode_into(&mut self, progressed: &mut bool) -> Result<(), EtcdError> {
        loop {
            match &mut self.body {
                Body::Length(left) => {
                    let n = (*left).min(self.raw.len());
                    self.decoded.extend(self.raw.drain(..n));
                    *left -= n;
                    *progressed |= n > 0;
                    if *left == 0 {
                        self.finished = true;
                        *progressed = true;
                        return Ok(());
                    }
                    return Ok(());
                }
                Body::UntilClose => {
                    *progressed |= !self.raw.is_empty();
                    self.decoded.append(&mut self.raw);
                    return Ok(());
                }
                Body::Chunked(state) => match *state {
                    ChunkState::Size => {
                        let Some(end) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                            if self.raw.len() > HEAD_BYTES_MAX {
                                return Err(EtcdError::Http("chunk size line too long".into()));
                            }
                            return Ok(());
                        };
                        let line = String::from_utf8_lossy(&self.raw[..end]).into_owned();
                        self.raw.drain(..end + 2);
                        let hex = line.split(';').next().unwrap_or("").trim();
                        let size = usize::from_str_radix(hex, 16)
                            .map_err(|_| EtcdError::Http(format!("bad chunk size {hex:?}")))?;
                        if size > BODY_BYTES_MAX {
                            return Err(EtcdError::Http("chunk too large".into()));
                        }
                        *state = if size == 0 {
                            ChunkState::Trailer(0)
                        } else {
                            ChunkState::Data(size)
                        };
                    }
                    ChunkState::Data(left) => {
                        let n = left.min(self.raw.len());
                        if n == 0 {
                            return Ok(());
                        }
                        self.decoded.extend(self.raw.drain(..n));
                        *progressed = true;
                        *state = if n == left {
                            ChunkState::DataEnd
                        } else {
                            ChunkState::Data(left - n)
                        };
                    }
                    ChunkState::DataEnd => {
                        if self.raw.len() < 2 {
                            return Ok(());
                        }
                        if &self.raw[..2] != b"\r\n" {
                            return Err(EtcdError::Http("chunk not followed by CRLF".into()));
                        }
                        self.raw.drain(..2);
                        *state = ChunkState::Size;
                    }
                    ChunkState::Trailer(seen) => {
                        // The body ends at the empty line after the last
                        // chunk's trailer fields (RFC 9112 7.1), not at
                        // the last chunk: a response cut before it is
                        // not complete.
                        let Some(end) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                            if seen + self.raw.len() > HEAD_BYTES_MAX {
                                return Err(EtcdError::Http("chunked trailer too long".into()));
                            }
                            return Ok(());
                        };
                        self.raw.drain(..end + 2);
                        if end == 0 {
                            self.finished = true;
                            *progressed = true;
                            return Ok(());
                        }
                        let seen = seen + end + 2;
                        if seen > HEAD_BYTES_MAX {
                            return Err(EtcdError::Http("chunked trailer too long".into()));
                        }
                        *state = ChunkState::Trailer(seen);
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, ReadBuf};

    use super::super::fuzzing::{read_response, Reading};

    /// A peer whose bytes arrive as the given reads, then the close.
    struct Reads(VecDeque<Vec<u8>>);

    impl AsyncRead for Reads {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if let Some(mut read) = self.0.pop_front() {
                let n = read.len().min(buf.remaining());
                buf.put_slice(&read[..n]);
                if n < read.len() {
                    self.0.push_front(read.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    /// Fuzzing finding 5: a watch whose second chunk is not followed by
    /// CRLF read its first message when the chunks came in two reads, and
    /// nothing but the error when they came in one. Fails without
    /// `Response::deferred`.
    #[tokio::test]
    async fn messages_before_a_framing_fault_read_the_same_however_split() {
        let head: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        let first: &[u8] = b"6\r\n{\"a\"}\n\r\n";
        let second: &[u8] = b"6\r\n{\"b\"}\nXX";
        let whole = [head, first, second].concat();
        let at_once = read_response(Reads([whole].into()), Reading::Watch).await;
        let split = read_response(
            Reads([[head, first].concat(), second.to_vec()].into()),
            Reading::Watch,
        )
        .await;
        assert_eq!(at_once, split);
        assert_eq!(at_once.messages, [b"{\"a\"}".to_vec(), b"{\"b\"}".to_vec()]);
        assert_eq!(
            at_once.end,
            Err("etcd HTTP: chunk not followed by CRLF".to_owned())
        );
    }

    /// Fuzzing finding 4: a watch message streamed in many reads was
    /// searched for its newline from the start after every read, so one
    /// message near the body limit cost hundreds of searches of megabytes
    /// (40 s under ASan). Counted, not timed: each byte is searched once
    /// (about 4 MiB for the 4 MiB message; 2 GiB without
    /// `Response::scanned`, checked).
    #[tokio::test]
    async fn a_streamed_message_is_searched_for_its_end_once() {
        let message = vec![b'x'; super::BODY_BYTES_MAX - 1024];
        let body = [message.as_slice(), b"\n"].concat();
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        let mut reads: VecDeque<Vec<u8>> = [head.into_bytes()].into();
        reads.extend(body.chunks(super::READ_CHUNK_BYTES).map(<[u8]>::to_vec));
        let mut response = super::read_head(Reads(reads)).await.expect("head");
        let line = response.next_line().await.expect("read").expect("a line");
        assert_eq!(line, message);
        assert!(
            response.searched <= 2 * body.len(),
            "searched {} bytes for a message of {}",
            response.searched,
            body.len()
        );
    }

    /// Fuzzing finding 6: a chunked body cut after its last chunk but
    /// before the empty line that ends it was read as complete. Fails
    /// before `ChunkState::Trailer`.
    #[tokio::test]
    async fn a_chunked_body_ends_at_the_empty_line_after_its_trailer() {
        let whole: &[u8] =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-T: 1\r\n\r\n";
        let read = read_response(Reads([whole.to_vec()].into()), Reading::Call).await;
        assert_eq!((read.messages, read.end), (vec![b"{}".to_vec()], Ok(())));
        for cut in [whole.len() - 1, whole.len() - 2, whole.len() - 8] {
            let read = read_response(Reads([whole[..cut].to_vec()].into()), Reading::Call).await;
            assert_eq!(
                read.end,
                Err("etcd HTTP: closed inside the response body".to_owned()),
                "cut at {cut}"
            );
        }
    }
}
