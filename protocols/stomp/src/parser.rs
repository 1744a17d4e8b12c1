//! Incremental STOMP frame decoder.
//!
//! Bytes go into [`Decoder::feed`], frames come out of [`Decoder::decode`].
//! The decoder works in two phases per frame:
//!
//! 1. **Head.** A head that is whole in the buffer when its scan starts
//!    (almost every one) and plain (no escape, every line `name:value`,
//!    within the limits, UTF-8) is parsed in one pass: per line, a search
//!    a word at a time for its colon and one for its end, the name
//!    classified as a [`crate::frame`] known header as it is met, the
//!    header lines copied once. Any other head is scanned as its bytes
//!    come, once (never rescanned), for line ends while the limits are
//!    checked in the order a byte-by-byte scan meets them: the command
//!    line must spell a prefix of a STOMP command, no header line may
//!    exceed its limit, the header count is bounded and NUL may not
//!    appear. Once the blank line ending it arrives, the head is parsed
//!    whole (the one pass, or, for one it declines, a line-by-line parse
//!    that decodes escapes for the version and reports what is wrong in
//!    line order).
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
    /// A head that is whole in the buffer when its scan starts is parsed
    /// in one pass ([`parse_whole_head`]). Any other (one that arrives in
    /// pieces, or that pass declines) is scanned for its line ends as its
    /// bytes come, checking the limits in the order a byte-by-byte scan
    /// meets them and never rescanning, then parsed whole.
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
            // Almost every head is whole in the buffer when its scan
            // starts: one pass parses it (see `parse_whole_head`).
            if let Some((command, headers, head_len)) = parse_whole_head(&self.buf, self.limits) {
                self.phase = Phase::start();
                return head_done(command, headers, head_len, self.limits).map(Some);
            }
        }
        let limits = self.limits;
        let mut head_len = None;
        let found_head = loop {
            if scanned_at >= self.buf.len() {
                break Ok(());
            }
            if *lines == 0 {
                // The command line, byte by byte (it is short): garbage is
                // refused at its first byte.
                let Some(&b) = self.buf.get(scanned_at) else {
                    break Ok(());
                };
                let i = scanned_at;
                scanned_at += 1;
                if b == b'\n' {
                    let line = strip_cr(self.buf.get(line_at..i).unwrap_or_default());
                    if Command::parse(line).is_none() {
                        break Err(FrameError::UnknownCommand(
                            String::from_utf8_lossy(line).into_owned(),
                        ));
                    }
                    *lines += 1;
                    line_at = i + 1;
                    continue;
                }
                if b == 0 {
                    break Err(FrameError::NulInHead);
                }
                if !(b.is_ascii_alphanumeric() || b == b'\r') {
                    break Err(FrameError::Garbage);
                }
                if i + 1 - line_at > COMMAND_LINE_MAX_BYTES {
                    let line = self.buf.get(line_at..=i).unwrap_or_default();
                    break Err(FrameError::UnknownCommand(
                        String::from_utf8_lossy(line).into_owned(),
                    ));
                }
                continue;
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
        // A head that came in pieces: the one pass over it now that it is
        // whole, or the full parse for one it cannot take.
        let head = self.buf.get(..head_len).unwrap_or_default();
        let (command, headers) = match parse_whole_head(head, limits) {
            Some((command, headers, _)) => (command, headers),
            None => parse_head(head, self.version)?,
        };
        self.phase = Phase::start();
        head_done(command, headers, head_len, limits).map(Some)
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

/// The [`Body`] of a parsed head: its `content-length` checked against
/// the limits before a byte of the body is waited for.
fn head_done(
    command: Command,
    headers: Headers,
    head_len: usize,
    limits: Bounds,
) -> Result<Body, FrameError> {
    let content_length = match headers.known(KnownHeader::ContentLength) {
        None => None,
        Some(text) => {
            let n = content_length_of(text)
                .ok_or_else(|| FrameError::BadContentLength(text.to_owned()))?;
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
    Ok(Body {
        command,
        headers,
        head_len,
        content_length,
        scanned: head_len,
    })
}

/// [`parse_whole_head`] under `limits`, for the fuzz target.
pub(crate) fn whole_head(b: &[u8], limits: Limits) -> Option<(Command, Headers, usize)> {
    parse_whole_head(b, Bounds::new(limits))
}

/// A `content-length` value as `str::trim` and `str::parse` read it; plain
/// digits (what clients send) without either.
fn content_length_of(text: &str) -> Option<usize> {
    let digits = text.as_bytes();
    if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
        let n = digits.iter().try_fold(0usize, |n, d| {
            n.checked_mul(10)?.checked_add(usize::from(d - b'0'))
        });
        if n.is_some() {
            return n;
        }
    }
    text.trim().parse::<usize>().ok()
}

/// A whole, plain head at the start of `b`, parsed in one pass: its
/// command, its headers and its length (the blank line included). Each
/// header line is read once, a search a word at a time for its colon and
/// one for its end; each name is classified ([`KnownHeader::of`]) as it
/// is met, and the header lines are copied once.
///
/// `None` for anything else: a head not all in `b`, one over a limit or
/// with a NUL, an escape (a backslash, in any version), a line that is
/// not `name:value` with a name, a control byte (a TAB) other than the
/// line ends, bytes that are not UTF-8. The scan line
/// by line then decides, and meets the limits and errors in the order it
/// always did; for a head without any of these both give the same.
fn parse_whole_head(b: &[u8], limits: Bounds) -> Option<(Command, Headers, usize)> {
    // Offsets are kept as u32: a buffer holds at most the frame limit
    // (at most 2 GiB) and one read.
    u32::try_from(b.len()).ok()?;
    let command_window = b.get(..b.len().min(COMMAND_LINE_MAX_BYTES + 1))?;
    let nl = crate::swar::find_any(command_window, [b'\n'])?;
    let command = Command::parse(strip_cr(b.get(..nl)?))?;
    let block = b.get(nl + 1..)?;
    let mut at = 0;
    let mut spans: Vec<Span> = Vec::with_capacity(HEADERS_EXPECTED);
    let mut present = 0;
    let block_len = loop {
        let rest = block.get(at..)?;
        match rest {
            [b'\n', ..] => break at + 1,
            // (A CR counts against the line limit, as in the scan.)
            [b'\r', b'\n', ..] if limits.header_line() >= 1 => break at + 2,
            _ => {}
        }
        // The colon, or the first byte that makes this head not plain.
        let colon = crate::swar::find_control_or(rest, [b':', b'\\'])?;
        let value = rest.get(colon + 1..)?;
        if colon == 0 || rest.get(colon) != Some(&b':') {
            return None;
        }
        let value_len = crate::swar::find_control_or(value, [b'\\'])?;
        let nl = colon + 1 + value_len;
        // Within the line limit (its LF not counted), and within the
        // header count (the command line counts as a line).
        if value.get(value_len) != Some(&b'\n')
            || nl > limits.header_line()
            || spans.len() >= limits.headers()
        {
            return None;
        }
        let end = if value_len > 0 && value.get(value_len - 1) == Some(&b'\r') {
            nl - 1
        } else {
            nl
        };
        let known = KnownHeader::of(rest.get(..colon)?);
        present |= known.map_or(0, KnownHeader::bit);
        spans.push(Span::parsed(at, at + colon, at + end, known));
        at += nl + 1;
    };
    // Up to the end of the last value: the blank line is not kept.
    let text_end = spans.last().map_or(0, Span::value_end);
    let text = std::str::from_utf8(block.get(..text_end)?).ok()?;
    Some((
        command,
        Headers::from_parsed(text.to_owned(), spans, present),
        nl + 1 + block_len,
    ))
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

    #[test]
    fn content_lengths_read_as_trim_and_parse_read_them() {
        for text in [
            "0",
            "1024",
            "007",
            " 12 ",
            "\t5",
            "+5",
            "-1",
            "",
            " ",
            "1 2",
            "x",
            "1e3",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999",
            "\u{a0}7\u{2003}",
        ] {
            assert_eq!(
                content_length_of(text),
                text.trim().parse::<usize>().ok(),
                "{text:?}"
            );
        }
    }

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
