//! Incremental STOMP frame decoder.
//!
//! Bytes go into [`Decoder::feed`], frames come out of [`Decoder::decode`].
//! The decoder works in two phases per frame:
//!
//! 1. **Head.** New bytes are scanned once (never rescanned) for line ends
//!    while the limits are checked byte by byte: the command line must spell
//!    a prefix of a STOMP command, no header line may exceed its limit, the
//!    header count is bounded and NUL may not appear. Once the blank line
//!    ending the head arrives, a `nom` parser reads the complete head,
//!    borrowing from the read buffer, and decodes escapes for the version.
//! 2. **Body.** With `content-length` the decoder waits for exactly that many
//!    bytes plus the NUL (the length was checked against the limit before a
//!    byte of the body was buffered); without it, the body runs to the first
//!    NUL, scanned incrementally and bounded by the body limit.
//!
//! The finished frame is split off the buffer and frozen: the body is a
//! [`bytes::Bytes`] view of the bytes that arrived from the socket, never copied.
//! [`Decoder::feed`] never buffers more than the frame size limit, so a peer
//! cannot make the decoder hold more than one frame's worth of memory.
//!
//! End-of-line bytes between frames are heart-beats and are skipped. CRLF
//! line endings are accepted in every version (1.2 requires it; in 1.0/1.1
//! it only means a header value cannot end with a carriage return).

use bytes::{Buf, BytesMut};
use nom::bytes::complete::take_till;
use nom::character::complete::char as byte;
use nom::sequence::{separated_pair, terminated};
use nom::{IResult, Parser};

use crate::escape::{unescape, unescape_str, Escaping};
use crate::frame::{Command, Frame, Headers, KnownHeader, Span, Version};

/// Size limits of the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest whole frame (head, body and NUL).
    pub frame_size_max_bytes: usize,
    /// Longest single header line (or command line), before unescaping.
    pub header_line_max_bytes: usize,
    /// Most header lines in one frame.
    pub headers_max: usize,
    /// Largest body.
    pub body_size_max_bytes: usize,
}

/// Why bytes could not be decoded into a frame. Every variant is fatal for
/// the connection: after a framing error the stream cannot be resynchronised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    // -- malformed input --
    /// Bytes that cannot start a STOMP command.
    #[error("garbage where a command was expected")]
    Garbage,
    /// A command line that names no STOMP command.
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
    /// A header line without a colon.
    #[error("header line without ':'")]
    MissingColon,
    /// A header with an empty name.
    #[error("header with an empty name")]
    EmptyHeaderName,
    /// A backslash sequence the version does not define.
    #[error("invalid escape sequence '\\{0}' in a header")]
    BadEscape(String),
    /// Header text that is not UTF-8.
    #[error("header is not valid UTF-8")]
    InvalidUtf8,
    /// A NUL byte in the command or header lines.
    #[error("NUL byte inside the frame's command or headers")]
    NulInHead,
    /// The byte after a `content-length` body is not NUL.
    #[error("frame body is not terminated by NUL after content-length bytes")]
    MissingNul,
    /// A `content-length` that is not a decimal number.
    #[error("invalid content-length {0:?}")]
    BadContentLength(String),
    // -- limits --
    /// The frame is larger than the limit.
    #[error("frame larger than {max} bytes")]
    FrameTooLarge {
        /// The limit.
        max: usize,
    },
    /// A header line is longer than the limit.
    #[error("header line longer than {max} bytes")]
    HeaderLineTooLong {
        /// The limit.
        max: usize,
    },
    /// More headers than the limit.
    #[error("more than {max} headers")]
    TooManyHeaders {
        /// The limit.
        max: usize,
    },
    /// The body is larger than the limit (also the symptom of a missing NUL).
    #[error("body larger than {max} bytes (or its terminating NUL is missing)")]
    BodyTooLarge {
        /// The limit.
        max: usize,
    },
}

/// Headers most frames have at most: the first allocation's size.
const HEADERS_EXPECTED: usize = 8;
/// Input smaller than this marks a quiet connection (see
/// [`Decoder::release_if_idle`]).
const IDLE_INPUT_BYTES: usize = 1024;

/// A command line longer than this is not a command, whatever it holds.
const COMMAND_LINE_MAX_BYTES: usize = 32;

/// Where the decoder is within the current frame. Kept small (16 B): it is
/// inline in every connection, idle ones included (issue 20).
#[derive(Debug)]
enum Phase {
    /// Looking for the blank line that ends the head. Offsets index `buf`,
    /// which holds at most the frame limit (at most [`FRAME_LIMIT_CAP`])
    /// and one read: they fit a `u32`.
    Head {
        /// Bytes already scanned.
        scanned: u32,
        /// Start of the line being scanned.
        line_start: u32,
        /// Complete lines seen (the command line included).
        lines: u32,
    },
    /// Head parsed; waiting for the body. Boxed (about 90 B): only a frame
    /// whose body spans reads waits here, one whose body came with it is
    /// returned at once.
    Body(Box<Body>),
}

/// A parsed head whose body is still to come.
#[derive(Debug)]
struct Body {
    command: Command,
    headers: Headers,
    head_len: usize,
    content_length: Option<usize>,
    /// Body bytes already searched for NUL.
    scanned: usize,
}

/// Frame limits above this (2 GiB) are taken as this, so that offsets
/// into the parse buffer (at most the frame limit and one read) fit a
/// `u32`.
const FRAME_LIMIT_CAP: usize = 1 << 31;

/// [`Limits`] as the decoder keeps them: `u32`s (16 B rather than 32 in
/// every connection, issue 20). No limit a configuration can usefully set
/// is above 2 GiB; larger ones are taken as [`FRAME_LIMIT_CAP`].
#[derive(Debug, Clone, Copy)]
struct Bounds {
    frame_size_max_bytes: u32,
    header_line_max_bytes: u32,
    headers_max: u32,
    body_size_max_bytes: u32,
}

impl Bounds {
    fn new(l: Limits) -> Self {
        let cap = |n: usize| u32::try_from(n.min(FRAME_LIMIT_CAP)).unwrap_or(u32::MAX);
        Self {
            frame_size_max_bytes: cap(l.frame_size_max_bytes),
            header_line_max_bytes: cap(l.header_line_max_bytes),
            headers_max: cap(l.headers_max),
            body_size_max_bytes: cap(l.body_size_max_bytes),
        }
    }

    fn frame(self) -> usize {
        self.frame_size_max_bytes as usize
    }

    fn header_line(self) -> usize {
        self.header_line_max_bytes as usize
    }

    fn headers(self) -> usize {
        self.headers_max as usize
    }

    fn body(self) -> usize {
        self.body_size_max_bytes as usize
    }
}

/// An offset into the parse buffer as [`Phase::Head`] keeps it (see there
/// why it fits).
fn offset(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Phase {
    fn start() -> Phase {
        Phase::Head {
            scanned: 0,
            line_start: 0,
            lines: 0,
        }
    }
}

/// The incremental decoder for one connection.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    limits: Bounds,
    version: Version,
    phase: Phase,
}

impl Decoder {
    /// A decoder that reads escapes by `version` until told otherwise (use
    /// 1.0 before CONNECT: CONNECT headers are never escaped anyway).
    pub fn new(limits: Limits, version: Version) -> Self {
        Self {
            buf: BytesMut::new(),
            limits: Bounds::new(limits),
            version,
            phase: Phase::start(),
        }
    }

    /// Sets the version whose escaping rules apply to later frames.
    pub fn set_version(&mut self, version: Version) {
        self.version = version;
    }

    /// Frees the buffer when nothing is in it and the input was small (a
    /// quiet connection): an idle connection holds no parse buffer, a busy
    /// one keeps its own.
    pub fn release_if_idle(&mut self, last_input_bytes: usize) {
        let between_frames = matches!(self.phase, Phase::Head { scanned: 0, .. });
        if self.buf.is_empty() && between_frames && last_input_bytes < IDLE_INPUT_BYTES {
            self.buf = BytesMut::new();
        }
    }

    /// The parse buffer, for a driver that reads straight into it (see
    /// `StompConnection::input_buffer`): the bytes go in once, and frame
    /// bodies become [`bytes::Bytes`] views of them. What is appended is
    /// bounded by the reads, not by [`Decoder::feed`]'s limit: a frame over
    /// the limits is still reported by [`Decoder::decode`] as soon as its
    /// head or length says so, so the buffer holds at most the frame limit
    /// and one read.
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Drops what is buffered (input that is ignored, after DISCONNECT).
    pub fn discard_buffered(&mut self) {
        self.buf.clear();
        self.phase = Phase::start();
    }

    /// Bytes buffered and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Buffers as much of `data` as the frame size limit allows and returns
    /// how many bytes it took. Call [`Decoder::decode`] until it returns
    /// `Ok(None)`, then feed the rest: a frame over the limit is reported by
    /// `decode` before more than the limit is held.
    pub fn feed(&mut self, data: &[u8]) -> usize {
        let room = self.limits.frame().saturating_sub(self.buf.len());
        let take = room.min(data.len());
        self.buf
            .extend_from_slice(data.get(..take).unwrap_or_default());
        take
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn decode(&mut self) -> Result<Option<Frame>, FrameError> {
        let mut body = match std::mem::replace(&mut self.phase, Phase::start()) {
            Phase::Body(body) => *body,
            head @ Phase::Head { .. } => {
                self.phase = head;
                match self.scan_head()? {
                    Some(body) => body,
                    None => return Ok(None),
                }
            }
        };
        match self.body_end(&mut body)? {
            Some((body_len, frame_len)) => Ok(Some(self.split_frame(body, body_len, frame_len))),
            None => {
                self.phase = Phase::Body(Box::new(body));
                Ok(None)
            }
        }
    }

    /// Scans new head bytes. Returns the parsed head once the blank line
    /// ending it is in (the phase is then back at the start: the caller
    /// keeps the head while it waits for the body).
    ///
    /// A head that is whole in the buffer when its scan starts (almost
    /// every one: a client writes a frame at once) is parsed in the same
    /// pass that finds its line ends: each header line's colon is found
    /// and its name classified as the line is met, and the header lines
    /// are copied once. A head that arrives in pieces is scanned for its
    /// line ends as they come (never rescanned) and parsed whole at the
    /// end, as are the rare heads with escapes to undo, a line that is not
    /// `name:value`, or bytes that are not UTF-8 (the full parse, which
    /// reports those errors in the order of the lines).
    fn scan_head(&mut self) -> Result<Option<Body>, FrameError> {
        let Phase::Head {
            scanned,
            line_start,
            lines,
        } = &mut self.phase
        else {
            return Ok(None);
        };
        let (mut scanned_at, mut line_at) = (*scanned as usize, *line_start as usize);
        if scanned_at == 0 {
            // Heart-beats (EOLs) between frames.
            while let Some(&first) = self.buf.first() {
                match (first, self.buf.get(1)) {
                    (b'\n', _) => self.buf.advance(1),
                    (b'\r', Some(b'\n')) => self.buf.advance(2),
                    (b'\r', None) => return Ok(None),
                    _ => break,
                }
            }
        }
        // The whole head is scanned in this call: its headers are
        // collected on the way (`None` once a line needs the full parse).
        let mut collected: Option<Vec<Span>> = (scanned_at == 0).then(Vec::new);
        let mut command = None;
        let mut headers_at = 0;
        let limits = self.limits;
        let mut head_len = None;
        let found_head = loop {
            if scanned_at >= self.buf.len() {
                break Ok(());
            }
            if *lines == 0 {
                // The command line, byte by byte (it is short): garbage is
                // refused at its first byte.
                match scan_command_line(&self.buf, &mut scanned_at, line_at) {
                    Ok(Some(c)) => {
                        command = Some(c);
                        *lines += 1;
                        line_at = scanned_at;
                        headers_at = scanned_at;
                        continue;
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
            }
            // A header line: one search for its end (or a NUL), then the
            // limits, in the order a byte-by-byte scan would meet them.
            let rest = self.buf.get(scanned_at..).unwrap_or_default();
            let found = crate::swar::find_any(rest, [b'\n', 0]);
            let end = found.map_or(self.buf.len(), |p| scanned_at + p);
            // The first byte that would make the line too long (the
            // newline itself does not count).
            let too_long_at = line_at + limits.header_line();
            if too_long_at < end {
                break Err(FrameError::HeaderLineTooLong {
                    max: limits.header_line(),
                });
            }
            let Some(p) = found else {
                scanned_at = end;
                break Ok(());
            };
            let i = scanned_at + p;
            scanned_at = i + 1;
            if self.buf.get(i) == Some(&0) {
                break Err(FrameError::NulInHead);
            }
            let line = strip_cr(self.buf.get(line_at..i).unwrap_or_default());
            if line.is_empty() {
                head_len = Some(i + 1);
                break Ok(());
            }
            if *lines as usize > limits.headers() {
                break Err(FrameError::TooManyHeaders {
                    max: limits.headers(),
                });
            }
            if let Some(spans) = &mut collected {
                match crate::swar::find_any(line, [b':']) {
                    // `name:value`: offsets from the first header line.
                    Some(colon) if colon > 0 => {
                        let name = line.get(..colon).unwrap_or_default();
                        let at = line_at - headers_at;
                        if spans.capacity() == 0 {
                            spans.reserve_exact(HEADERS_EXPECTED);
                        }
                        spans.push(Span::new(
                            (at, at + colon),
                            (at + colon + 1, at + line.len()),
                            KnownHeader::of(name),
                        ));
                    }
                    // The full parse says what is wrong, in line order.
                    _ => collected = None,
                }
            }
            *lines += 1;
            line_at = i + 1;
        };
        *scanned = offset(scanned_at);
        *line_start = offset(line_at);
        found_head?;
        let Some(head_len) = head_len else {
            if self.buf.len() >= limits.frame() {
                return Err(FrameError::FrameTooLarge {
                    max: limits.frame(),
                });
            }
            return Ok(None);
        };
        let head = self.buf.get(..head_len).unwrap_or_default();
        let parsed = match (command, collected) {
            (Some(command), Some(spans)) => collected_head(
                command,
                head.get(headers_at..).unwrap_or_default(),
                spans,
                self.version,
            ),
            _ => None,
        };
        let (command, headers) = match parsed {
            Some(done) => done,
            None => parse_head(head, self.version)?,
        };
        let content_length = match headers.known(KnownHeader::ContentLength) {
            None => None,
            Some(text) => {
                let n = text
                    .trim()
                    .parse::<usize>()
                    .map_err(|_| FrameError::BadContentLength(text.to_owned()))?;
                if n > limits.body() {
                    return Err(FrameError::BodyTooLarge { max: limits.body() });
                }
                if head_len.saturating_add(n).saturating_add(1) > limits.frame() {
                    return Err(FrameError::FrameTooLarge {
                        max: limits.frame(),
                    });
                }
                Some(n)
            }
        };
        self.phase = Phase::start();
        Ok(Some(Body {
            command,
            headers,
            head_len,
            content_length,
            scanned: head_len,
        }))
    }

    /// Where the body of `body`'s frame ends, once it is all in the
    /// buffer: its length and the frame's (NUL included).
    fn body_end(&self, body: &mut Body) -> Result<Option<(usize, usize)>, FrameError> {
        let head_len = body.head_len;
        let body_max = self.limits.body();
        match body.content_length {
            Some(n) => {
                let nul_at = head_len + n;
                match self.buf.get(nul_at) {
                    None => Ok(None),
                    Some(0) => Ok(Some((n, nul_at + 1))),
                    Some(_) => Err(FrameError::MissingNul),
                }
            }
            None => {
                let from = body.scanned;
                let found = self
                    .buf
                    .get(from..)
                    .and_then(|rest| rest.iter().position(|&b| b == 0));
                match found {
                    // A body found whole in one search is held to the limit
                    // too: checking only while the NUL is missing let a body
                    // over it through when it arrived in one read (up to the
                    // frame limit, which also allows for the headers).
                    Some(p) if from + p - head_len > body_max => {
                        Err(FrameError::BodyTooLarge { max: body_max })
                    }
                    Some(p) => Ok(Some((from + p - head_len, from + p + 1))),
                    None => {
                        body.scanned = self.buf.len();
                        if self.buf.len() - head_len > body_max {
                            return Err(FrameError::BodyTooLarge { max: body_max });
                        }
                        if self.buf.len() >= self.limits.frame() {
                            return Err(FrameError::FrameTooLarge {
                                max: self.limits.frame(),
                            });
                        }
                        Ok(None)
                    }
                }
            }
        }
    }

    /// Splits the complete frame off the buffer.
    fn split_frame(&mut self, body: Body, body_len: usize, frame_len: usize) -> Frame {
        let Body {
            command,
            headers,
            head_len,
            content_length,
            ..
        } = body;
        let raw = self.buf.split_to(frame_len).freeze();
        Frame {
            command,
            headers,
            body: raw.slice(head_len..head_len + body_len),
            has_content_length: content_length.is_some(),
        }
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Scans the command line from `*scanned_at` (the line starts at
/// `line_at`), checking each byte as it comes: `Some` command once its
/// line end is in, `None` while more bytes are needed (`*scanned_at` is
/// then where to go on), an error at the first byte that cannot belong
/// to a command.
fn scan_command_line(
    buf: &[u8],
    scanned_at: &mut usize,
    line_at: usize,
) -> Result<Option<Command>, FrameError> {
    let from = *scanned_at;
    for (i, &b) in buf.iter().enumerate().skip(from) {
        if b == b'\n' {
            *scanned_at = i + 1;
            let line = strip_cr(buf.get(line_at..i).unwrap_or_default());
            return match Command::parse(line) {
                Some(c) => Ok(Some(c)),
                None => Err(FrameError::UnknownCommand(
                    String::from_utf8_lossy(line).into_owned(),
                )),
            };
        }
        if b == 0 {
            return Err(FrameError::NulInHead);
        }
        if !(b.is_ascii_alphanumeric() || b == b'\r') {
            return Err(FrameError::Garbage);
        }
        if i + 1 - line_at > COMMAND_LINE_MAX_BYTES {
            let line = buf.get(line_at..=i).unwrap_or_default();
            return Err(FrameError::UnknownCommand(
                String::from_utf8_lossy(line).into_owned(),
            ));
        }
    }
    *scanned_at = buf.len();
    Ok(None)
}

/// The headers of a head whose lines the scan split as it found them
/// (`spans` index `lines`, the header lines up to the blank line), when
/// the text is what the headers say: no escape to undo and UTF-8
/// throughout. `None` sends the head to the full parse.
fn collected_head(
    command: Command,
    lines: &[u8],
    spans: Vec<Span>,
    version: Version,
) -> Option<(Command, Headers)> {
    let escaping = Escaping::for_frame(version, command);
    if escaping != Escaping::None && crate::swar::find_any(lines, [b'\\']).is_some() {
        return None;
    }
    let text = std::str::from_utf8(lines).ok()?;
    // Up to the end of the last value: the blank line is not kept.
    let text_end = spans.last().map_or(0, Span::value_end);
    let text = text.get(..text_end)?.to_owned();
    Some((command, Headers::from_parsed(text, spans)))
}

/// One line up to LF, without the LF and a CR before it.
fn line(input: &[u8]) -> IResult<&[u8], &[u8]> {
    let (rest, l) = terminated(take_till(|b| b == b'\n'), byte('\n')).parse(input)?;
    Ok((rest, strip_cr(l)))
}

/// `name:value`, split at the first colon (an escaped colon is `\c`).
fn name_value(input: &[u8]) -> IResult<&[u8], (&[u8], &[u8])> {
    separated_pair(take_till(|b| b == b':'), byte(':'), take_till(|_| false)).parse(input)
}

/// Parses a complete head (command line, header lines, blank line).
fn parse_head(head: &[u8], version: Version) -> Result<(Command, Headers), FrameError> {
    match std::str::from_utf8(head) {
        // One UTF-8 check for the whole head (not one per name and
        // value); its lines and fields split at ASCII bytes stay UTF-8.
        Ok(text) => parse_head_text(text, version),
        // Not UTF-8 somewhere: the line by line parse reports what it
        // meets first, as it always did.
        Err(_) => parse_head_bytes(head, version),
    }
}

/// [`parse_head`] of a head known to be UTF-8: the same result as
/// [`parse_head_bytes`], without a check per field.
pub(crate) fn parse_head_text(
    head: &str,
    version: Version,
) -> Result<(Command, Headers), FrameError> {
    let b = head.as_bytes();
    let line_end = |from: usize| -> Result<(usize, usize), FrameError> {
        let rest = b.get(from..).unwrap_or_default();
        let nl = from + crate::swar::find_any(rest, [b'\n']).ok_or(FrameError::Garbage)?;
        let end = if nl > from && b.get(nl - 1) == Some(&b'\r') {
            nl - 1
        } else {
            nl
        };
        Ok((end, nl + 1))
    };
    let (end, mut at) = line_end(0)?;
    let command_line = b.get(..end).unwrap_or_default();
    let command = Command::parse(command_line).ok_or_else(|| {
        FrameError::UnknownCommand(String::from_utf8_lossy(command_line).into_owned())
    })?;
    let escaping = Escaping::for_frame(version, command);
    // (A head the decoder finds whole, without escapes, does not come
    // here: the scan that found its end made its headers.)
    let mut headers = Headers::with_capacity(HEADERS_EXPECTED, head.len());
    loop {
        let (end, next) = line_end(at)?;
        let line = head.get(at..end).unwrap_or_default();
        at = next;
        if line.is_empty() {
            break;
        }
        let colon =
            crate::swar::find_any(line.as_bytes(), [b':']).ok_or(FrameError::MissingColon)?;
        if colon == 0 {
            return Err(FrameError::EmptyHeaderName);
        }
        let (name, value) = (
            line.get(..colon).unwrap_or_default(),
            line.get(colon + 1..).unwrap_or_default(),
        );
        headers.push(
            unescape_str(name, escaping)?,
            unescape_str(value, escaping)?,
        );
    }
    Ok((command, headers))
}

/// [`parse_head`] a line at a time, checking each field's UTF-8.
pub(crate) fn parse_head_bytes(
    head: &[u8],
    version: Version,
) -> Result<(Command, Headers), FrameError> {
    let (mut rest, command_line) = line(head).map_err(|_| FrameError::Garbage)?;
    let command = Command::parse(command_line).ok_or_else(|| {
        FrameError::UnknownCommand(String::from_utf8_lossy(command_line).into_owned())
    })?;
    let escaping = Escaping::for_frame(version, command);
    let mut headers = Headers::with_capacity(HEADERS_EXPECTED, head.len());
    loop {
        let (next, text) = line(rest).map_err(|_| FrameError::Garbage)?;
        rest = next;
        if text.is_empty() {
            break;
        }
        let (_, (name, value)) = name_value(text).map_err(|_| FrameError::MissingColon)?;
        if name.is_empty() {
            return Err(FrameError::EmptyHeaderName);
        }
        headers.push(unescape(name, escaping)?, unescape(value, escaping)?);
    }
    Ok((command, headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The UTF-8 fast path parses every head as the field-by-field
        /// parse does: same command, headers and error.
        #[test]
        fn the_text_parse_agrees_with_the_byte_parse(
            lines in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec![
                        b'a', b':', b'\\', b'n', b'c', b'r', b't', b'\r', b' ', 0xc3, 0xa9,
                    ]),
                    0..10,
                ),
                0..6,
            ),
            command in proptest::sample::select(vec!["SEND", "CONNECT", "NOPE"]),
            version in proptest::sample::select(vec![Version::V1_0, Version::V1_1, Version::V1_2]),
        ) {
            let mut head = format!("{command}\n").into_bytes();
            for l in &lines {
                head.extend_from_slice(l);
                head.push(b'\n');
            }
            head.push(b'\n');
            if let Ok(text) = std::str::from_utf8(&head) {
                prop_assert_eq!(parse_head_text(text, version), parse_head_bytes(&head, version));
            }
        }

        /// A head the decoder gets whole (parsed in the pass that finds
        /// its end, names classified on the way) gives the command and
        /// headers, or the error, of the field-by-field parse; and every
        /// header is found by its name, known or not, first one winning.
        #[test]
        fn the_one_pass_parse_agrees_with_the_byte_parse(
            lines in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "", "destination", "receipt", "id", "ack", "x-queue-type",
                        "content-type", "persistent", "reply-to", "custom", "a\\c",
                    ]),
                    proptest::collection::vec(
                        proptest::sample::select(vec![
                            b'a', b':', b'\\', b'n', b'c', b'r', b'\r', b' ', 0xc3, 0xa9,
                        ]),
                        0..8,
                    ),
                ),
                0..7,
            ),
            command in proptest::sample::select(vec!["SEND", "CONNECT", "ACK"]),
            version in proptest::sample::select(vec![Version::V1_0, Version::V1_1, Version::V1_2]),
        ) {
            let mut head = format!("{command}\n").into_bytes();
            for (name, tail) in &lines {
                head.extend_from_slice(name.as_bytes());
                head.extend_from_slice(tail);
                head.push(b'\n');
            }
            head.push(b'\n');
            let want = parse_head_bytes(&head, version);
            let mut d = Decoder::new(
                Limits {
                    frame_size_max_bytes: 4096,
                    header_line_max_bytes: 256,
                    headers_max: 16,
                    body_size_max_bytes: 1024,
                },
                version,
            );
            d.feed(&head);
            d.feed(b"\0");
            let got = d.decode().map(|f| f.map(|f| (f.command, f.headers)));
            match want {
                Ok(want) => {
                    let got = got.ok().flatten();
                    prop_assert_eq!(got.as_ref(), Some(&want));
                    let Some((_, headers)) = got else { unreachable!() };
                    for (name, _) in want.1.iter() {
                        let first = want.1.iter().find(|(n, _)| *n == name).map(|(_, v)| v);
                        prop_assert_eq!(headers.get(name), first, "{}", name);
                    }
                }
                Err(e) => prop_assert_eq!(got, Err(e)),
            }
        }
    }
}
