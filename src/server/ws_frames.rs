//! WebSocket framing (RFC 6455, server side, no extensions), read and
//! written as a byte stream: [`WsByteStream`].
//!
//! Written here rather than taken from tungstenite because of what an idle
//! connection holds (issue 20). tungstenite allocates its read buffer
//! (4 KiB here) when a connection opens and keeps it, beside its frame
//! codec, and it cannot say when a read would not wait, so the driver
//! also had to keep a read pending with a buffer lent to it: an idle MQTT
//! connection over WebSocket cost 11 KB. Here an idle WebSocket holds no
//! buffer: the driver waits for the socket's readiness, reads the frames'
//! bytes straight into the adapter's parse buffer, and [`WsByteStream`]
//! unmasks the payloads in place there and squeezes the frame headers
//! out. A frame header cut by a read waits in a buffer of at most 13
//! bytes, a control frame's payload (at most 125 bytes) in its own until
//! it is complete.
//!
//! The byte stream's rules are the ones documented on [`WsByteStream`].

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::driver::Transport;
use super::ws::WsWire;

/// Largest outgoing WebSocket message: output beyond this within one flush
/// goes out as several messages, so one burst of deliveries never needs a
/// client to buffer an unbounded message. The adapters' protocols are byte
/// streams over WebSocket, so a frame may span two messages.
pub(crate) const OUTGOING_MESSAGE_MAX_BYTES: usize = 1024 * 1024;
/// Socket reads one poll makes while they yield no data (only control
/// frames or empty messages): a flood of those must not hold the task,
/// which then yields and goes on when polled again (never a read of zero
/// bytes, which is the end of the stream).
const EMPTY_READS_PER_POLL_MAX: usize = 32;
/// Room before a message's payload for its header: a server's header is
/// at most 10 bytes (no mask).
const HEADER_ROOM: usize = 10;
/// Room a read buffer needs for the in-place path: whole frame headers
/// (at most 14 bytes) and some payload.
const IN_PLACE_ROOM_MIN: usize = 64;
/// What the slow path (a smaller read buffer) reads at once.
const STAGED_READ_BYTES: usize = 4096;
/// Largest control frame payload (RFC 6455 §5.5).
const CONTROL_PAYLOAD_MAX: usize = 125;
/// A sent output buffer at most this large is freed, so a quiet connection
/// holds none; a larger one is kept for the next message (a busy one).
const OUTPUT_FREED_BELOW_BYTES: usize = 1024;
/// A larger output buffer is freed anyway once sent.
const OUTPUT_KEPT_MAX_BYTES: usize = 64 * 1024;

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

const CLOSE_NORMAL: u16 = 1000;
const CLOSE_PROTOCOL: u16 = 1002;
const CLOSE_INVALID: u16 = 1007;
const CLOSE_SIZE: u16 = 1009;

/// A WebSocket seen as a byte stream, so the byte-oriented driver and
/// protocol adapters run over it unchanged.
///
/// - Reading: the payloads of binary and text messages, concatenated. A
///   protocol frame may span messages and a message may hold several
///   frames (MQTT over WebSocket requires both). One read gathers the
///   frames already received, up to the buffer's room. Pings are answered
///   as reading goes on; a close is answered, then the stream ends (EOF).
///   A message over the size limit, a text message that is not UTF-8, or
///   a protocol violation (an unmasked frame, reserved bits or opcodes, a
///   fragmented or oversized control frame, a continuation out of place)
///   fails the read, after a best-effort close frame with code 1009, 1007
///   or 1002; bytes read before the fault are returned first.
/// - Writing: bytes are buffered and sent as one message per flush (the
///   driver flushes once per loop turn), or earlier past
///   [`OUTGOING_MESSAGE_MAX_BYTES`]. MQTT and AMQP send binary messages.
///   STOMP answers in the type of the client's last data message, text
///   before the first one (stomp.js sends text); output that is not UTF-8
///   goes out binary, since a text message cannot carry it.
/// - Shutdown: sends a normal close (1000).
pub(crate) struct WsByteStream<S> {
    io: S,
    wire: WsWire,
    /// Largest incoming message, after reassembly.
    message_max: u64,
    /// Bytes read and not parsed yet: what followed the upgrade request,
    /// or the start of a frame header a read cut. Empty while idle.
    raw: Vec<u8>,
    /// `raw` is only an incomplete frame header: nothing to read until the
    /// socket has more.
    raw_partial: bool,
    reader: Reader,
    /// Wire bytes to send (control frames, a finished message), and how
    /// much of them is sent.
    out: BytesMut,
    sent: usize,
    /// The message being gathered: [`HEADER_ROOM`] bytes for its header,
    /// then its payload. Empty between messages.
    message: BytesMut,
    /// The peer's close was received (and answered), or the socket ended:
    /// reads end.
    read_done: bool,
    /// A read error met after some bytes were already returned: the next
    /// read reports it.
    read_error: Option<Box<io::Error>>,
    /// Our close frame is queued: nothing more is sent after it.
    close_sent: bool,
    /// Whether STOMP output goes in text messages.
    reply_text: bool,
}

/// What a WebSocket at rest keeps while its connection is parked
/// (`parking`): its settings and the kind of message STOMP answers in.
/// Everything else is empty at rest (see [`WsByteStream::is_at_rest`]).
pub(crate) struct WsAtRest {
    message_max: u64,
    wire: WsWire,
    reply_text: bool,
}

/// Where the reader is in the incoming frames.
#[derive(Default)]
struct Reader {
    /// Payload bytes left in the frame being read; 0 between frames.
    remaining: u64,
    mask: [u8; 4],
    /// Position in `mask` of the next payload byte.
    mask_at: usize,
    /// The frame being read is its message's last.
    fin: bool,
    /// The data message under way, between its first frame and its last.
    message: Option<Kind>,
    /// Payload bytes of that message so far.
    message_len: u64,
    /// A text message's incomplete last UTF-8 sequence.
    utf8: Utf8Tail,
    /// The frame being read is a control frame: its payload so far.
    control: Option<Box<Control>>,
    /// The peer's close frame arrived: nothing after it is read.
    closed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Binary,
}

struct Control {
    opcode: u8,
    payload: Vec<u8>,
}

/// Why reading failed: the close code and the reason sent with it.
#[derive(Debug, Clone, Copy)]
struct Fault {
    code: u16,
    reason: &'static str,
}

impl Fault {
    fn protocol(reason: &'static str) -> Self {
        Self {
            code: CLOSE_PROTOCOL,
            reason,
        }
    }
}

/// What parsing a run of raw bytes gave.
struct Parsed {
    /// Payload bytes moved to the front of the run.
    produced: usize,
    /// Raw bytes used up; the rest waits for the next read.
    consumed: usize,
    /// Parsing stopped for want of input (a frame header cut short), not
    /// for want of room for the payload.
    want_input: bool,
    fault: Option<Fault>,
}

/// A frame header (RFC 6455 §5.2).
struct Header {
    fin: bool,
    reserved: u8,
    opcode: u8,
    masked: bool,
    len: u64,
    mask: [u8; 4],
}

/// The header at the start of `bytes` and its length; `None` while it is
/// incomplete.
fn parse_header(bytes: &[u8]) -> Option<(Header, usize)> {
    let (&b0, &b1) = (bytes.first()?, bytes.get(1)?);
    let (len, mut at) = match b1 & 0x7F {
        126 => (
            u64::from(u16::from_be_bytes(bytes.get(2..4)?.try_into().ok()?)),
            4,
        ),
        127 => (u64::from_be_bytes(bytes.get(2..10)?.try_into().ok()?), 10),
        n => (u64::from(n), 2),
    };
    let masked = b1 & 0x80 != 0;
    let mut mask = [0u8; 4];
    if masked {
        mask = bytes.get(at..at + 4)?.try_into().ok()?;
        at += 4;
    }
    let header = Header {
        fin: b0 & 0x80 != 0,
        reserved: b0 & 0x70,
        opcode: b0 & 0x0F,
        masked,
        len,
        mask,
    };
    Some((header, at))
}

/// XORs `data` with `mask`, starting at position `at` of the mask, four
/// bytes at a time.
fn unmask(data: &mut [u8], mask: [u8; 4], at: usize) {
    let m: [u8; 4] = std::array::from_fn(|i| mask[(at + i) % 4]);
    let word = u32::from_ne_bytes(m);
    let mut chunks = data.chunks_exact_mut(4);
    for chunk in &mut chunks {
        if let Ok(bytes) = <[u8; 4]>::try_from(&*chunk) {
            chunk.copy_from_slice(&(u32::from_ne_bytes(bytes) ^ word).to_ne_bytes());
        }
    }
    for (b, m) in chunks.into_remainder().iter_mut().zip(m) {
        *b ^= m;
    }
}

/// Appends a frame header for a server frame (unmasked) of `len` bytes.
fn put_header(out: &mut Vec<u8>, opcode: u8, len: usize) {
    out.push(0x80 | opcode);
    if len < 126 {
        out.push(len as u8);
    } else if let Ok(short) = u16::try_from(len) {
        out.push(126);
        out.extend_from_slice(&short.to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// The incomplete UTF-8 sequence a text frame ended with (a character may
/// span frames), to be checked with what follows.
#[derive(Default)]
struct Utf8Tail {
    bytes: [u8; 4],
    len: usize,
}

/// Whether `bytes`, a lead byte and fewer continuation bytes than it
/// needs, can still begin a UTF-8 character (RFC 3629 §4: no overlong
/// form, no surrogate, nothing above U+10FFFF). The lead byte was checked
/// when the sequence started.
fn begins_a_character(bytes: &[u8]) -> bool {
    let Some((&lead, rest)) = bytes.split_first() else {
        return true;
    };
    let second = match lead {
        0xE0 => 0xA0..=0xBF,
        0xED => 0x80..=0x9F,
        0xF0 => 0x90..=0xBF,
        0xF4 => 0x80..=0x8F,
        _ => 0x80..=0xBF,
    };
    rest.first().is_none_or(|b| second.contains(b)) && rest.iter().skip(1).all(|b| b & 0xC0 == 0x80)
}

impl Utf8Tail {
    /// Checks `chunk` as the continuation of what came before: false if
    /// it cannot be UTF-8.
    fn check(&mut self, mut chunk: &[u8]) -> bool {
        if self.len > 0 {
            let width = match self.bytes[0] {
                0xC2..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF4 => 4,
                _ => return false,
            };
            let need = (width - self.len).min(chunk.len());
            let (head, rest) = chunk.split_at(need);
            self.bytes[self.len..self.len + need].copy_from_slice(head);
            self.len += need;
            chunk = rest;
            if self.len < width {
                // Still incomplete: what it holds must still begin a
                // character. Continuation bytes are not enough: after E0,
                // ED, F0 and F4 the second byte has a narrower range.
                return begins_a_character(self.bytes.get(..self.len).unwrap_or_default());
            }
            if std::str::from_utf8(&self.bytes[..width]).is_err() {
                return false;
            }
            self.len = 0;
        }
        match std::str::from_utf8(chunk) {
            Ok(_) => true,
            // Cut inside a character: keep its start for the next chunk.
            Err(e) if e.error_len().is_none() => {
                let tail = chunk.get(e.valid_up_to()..).unwrap_or_default();
                self.len = tail.len();
                self.bytes[..tail.len()].copy_from_slice(tail);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether the text ended on a whole character.
    fn is_complete(&self) -> bool {
        self.len == 0
    }
}

impl<S> WsByteStream<S> {
    /// A WebSocket speaking `wire` over `io` after the upgrade: `tail` is
    /// what the client sent behind its request (its first frames, maybe),
    /// and no incoming message may exceed `message_max` bytes.
    pub(crate) fn new(io: S, tail: Vec<u8>, wire: WsWire, message_max: usize) -> Self {
        Self {
            io,
            wire,
            message_max: message_max as u64,
            raw: tail,
            raw_partial: false,
            reader: Reader::default(),
            out: BytesMut::new(),
            sent: 0,
            message: BytesMut::new(),
            read_done: false,
            read_error: None,
            close_sent: false,
            reply_text: wire == WsWire::Stomp,
        }
    }

    /// Whether the framing holds nothing but its settings: no bytes read
    /// and not parsed (not even a cut frame header), no frame or message
    /// under way in either direction, no pong or close owed, not closing.
    /// A WebSocket at rest is taken apart to be parked
    /// ([`Self::into_rest`]) and put together again around its socket
    /// ([`Self::from_rest`]).
    pub(crate) fn is_at_rest(&self) -> bool {
        self.raw.is_empty()
            && self.reader.remaining == 0
            && self.reader.message.is_none()
            && self.reader.control.is_none()
            && !self.reader.closed
            && self.out.is_empty()
            && self.message.is_empty()
            && !self.read_done
            && self.read_error.is_none()
            && !self.close_sent
    }

    /// The socket and what the framing keeps while parked, if it is at
    /// rest ([`Self::is_at_rest`]); `None` (the stream dropped) if not.
    pub(crate) fn into_rest(self) -> Option<(S, WsAtRest)> {
        if !self.is_at_rest() {
            return None;
        }
        let rest = WsAtRest {
            message_max: self.message_max,
            wire: self.wire,
            reply_text: self.reply_text,
        };
        Some((self.io, rest))
    }

    /// The stream again over `io`, as [`Self::into_rest`] left it.
    pub(crate) fn from_rest(io: S, rest: WsAtRest) -> Self {
        let mut stream = Self::new(io, Vec::new(), rest.wire, 0);
        stream.message_max = rest.message_max;
        stream.reply_text = rest.reply_text;
        stream
    }

    /// Parses the raw bytes `data` in place: the payloads of data frames
    /// are unmasked and moved to its front, at most `out_max` bytes of
    /// them, and control frames are handled.
    fn parse(&mut self, data: &mut [u8], out_max: usize) -> Parsed {
        let mut read = 0;
        let mut written = 0;
        let stop = |read, written, want_input, fault| Parsed {
            produced: written,
            consumed: read,
            want_input,
            fault,
        };
        while read < data.len() && !self.reader.closed {
            if self.reader.remaining == 0 {
                let Some((header, used)) = parse_header(data.get(read..).unwrap_or_default())
                else {
                    return stop(read, written, true, None);
                };
                read += used;
                if let Err(fault) = self.start_frame(&header) {
                    return stop(read, written, false, Some(fault));
                }
                if self.reader.remaining == 0 {
                    if let Err(fault) = self.end_frame() {
                        return stop(read, written, false, Some(fault));
                    }
                }
                continue;
            }
            let control = self.reader.control.is_some();
            let room = if control {
                usize::MAX
            } else {
                out_max - written
            };
            if room == 0 {
                return stop(read, written, false, None);
            }
            let left = usize::try_from(self.reader.remaining).unwrap_or(usize::MAX);
            let take = left.min(data.len() - read).min(room);
            let Some(payload) = data.get_mut(read..read + take) else {
                break;
            };
            unmask(payload, self.reader.mask, self.reader.mask_at);
            self.reader.mask_at = (self.reader.mask_at + take) % 4;
            self.reader.remaining -= take as u64;
            if let Some(control) = &mut self.reader.control {
                control.payload.extend_from_slice(payload);
            } else {
                data.copy_within(read..read + take, written);
                let text = self.reader.message == Some(Kind::Text);
                let moved = data.get(written..written + take).unwrap_or_default();
                if text && !self.reader.utf8.check(moved) {
                    return stop(read, written, false, Some(text_not_utf8()));
                }
                written += take;
            }
            read += take;
            if self.reader.remaining == 0 {
                if let Err(fault) = self.end_frame() {
                    return stop(read, written, false, Some(fault));
                }
            }
        }
        stop(read, written, true, None)
    }

    fn start_frame(&mut self, h: &Header) -> Result<(), Fault> {
        if h.reserved != 0 {
            return Err(Fault::protocol("reserved bits set (no extension agreed)"));
        }
        if !h.masked {
            return Err(Fault::protocol("client frame not masked"));
        }
        match h.opcode {
            OP_CLOSE | OP_PING | OP_PONG => {
                if !h.fin || h.len > CONTROL_PAYLOAD_MAX as u64 {
                    return Err(Fault::protocol("fragmented or oversized control frame"));
                }
                self.reader.control = Some(Box::new(Control {
                    opcode: h.opcode,
                    payload: Vec::with_capacity(h.len as usize),
                }));
            }
            OP_TEXT | OP_BINARY => {
                if self.reader.message.is_some() {
                    return Err(Fault::protocol("new message inside a fragmented one"));
                }
                let kind = if h.opcode == OP_TEXT {
                    Kind::Text
                } else {
                    Kind::Binary
                };
                self.reader.message = Some(kind);
                self.reader.message_len = 0;
                self.reader.utf8 = Utf8Tail::default();
                self.reply_text = kind == Kind::Text && self.wire == WsWire::Stomp;
            }
            OP_CONTINUATION => {
                if self.reader.message.is_none() {
                    return Err(Fault::protocol("continuation frame without a message"));
                }
            }
            _ => return Err(Fault::protocol("reserved opcode")),
        }
        if self.reader.control.is_none() {
            self.reader.message_len = self.reader.message_len.saturating_add(h.len);
            if self.reader.message_len > self.message_max {
                return Err(Fault {
                    code: CLOSE_SIZE,
                    reason: "message too large",
                });
            }
            self.reader.fin = h.fin;
        }
        self.reader.remaining = h.len;
        self.reader.mask = h.mask;
        self.reader.mask_at = 0;
        Ok(())
    }

    fn end_frame(&mut self) -> Result<(), Fault> {
        if let Some(control) = self.reader.control.take() {
            return self.on_control(&control);
        }
        if self.reader.fin {
            let text = self.reader.message.take() == Some(Kind::Text);
            if text && !self.reader.utf8.is_complete() {
                return Err(text_not_utf8());
            }
        }
        Ok(())
    }

    fn on_control(&mut self, control: &Control) -> Result<(), Fault> {
        match control.opcode {
            // No pong after our close.
            OP_PING if !self.close_sent => put_frame(&mut self.out, OP_PONG, &control.payload),
            OP_CLOSE => {
                tracing::trace!(len = control.payload.len(), "WebSocket close received");
                let code = match control.payload.get(..2) {
                    Some(code) => u16::from_be_bytes([code[0], code[1]]),
                    None if control.payload.is_empty() => CLOSE_NORMAL,
                    None => return Err(Fault::protocol("close frame of one byte")),
                };
                // The reason is UTF-8 (§5.5.1), and text that is not fails
                // the connection (§8.1), as in a text message.
                let reason = control.payload.get(2..).unwrap_or_default();
                if std::str::from_utf8(reason).is_err() {
                    return Err(Fault {
                        code: CLOSE_INVALID,
                        reason: "close reason is not UTF-8",
                    });
                }
                // The reply echoes the code, unless it is one no endpoint
                // may send (§7.4): that is answered 1002, as tungstenite
                // and browsers do. Then the stream ends.
                let reply = if close_code_may_be_sent(code) {
                    code
                } else {
                    CLOSE_PROTOCOL
                };
                self.queue_close(reply, "");
                self.reader.closed = true;
                self.read_done = true;
            }
            // Unsolicited pongs are allowed and mean nothing.
            _ => {}
        }
        Ok(())
    }

    /// Queues our close frame, once; nothing is sent after it.
    fn queue_close(&mut self, code: u16, reason: &str) {
        if self.close_sent {
            return;
        }
        self.close_sent = true;
        let mut payload = code.to_be_bytes().to_vec();
        payload.extend_from_slice(reason.as_bytes());
        payload.truncate(CONTROL_PAYLOAD_MAX);
        put_frame(&mut self.out, OP_CLOSE, &payload);
    }
}

/// Whether a close frame may carry `code` (RFC 6455 §7.4): the codes the
/// RFC and the IANA registry define for sending (1000-1003, 1007-1013;
/// not 1004 or the unassigned ones, not 1005, 1006 or 1015, which only
/// report what happened, never on the wire), and the ranges for
/// libraries and applications (3000-4999). The same set as tungstenite's
/// `CloseCode::is_allowed`.
fn close_code_may_be_sent(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1013 | 3000..=4999)
}

fn text_not_utf8() -> Fault {
    Fault {
        code: CLOSE_INVALID,
        reason: "text message is not UTF-8",
    }
}

/// Appends a whole server frame (unmasked) to `out`.
fn put_frame(out: &mut BytesMut, opcode: u8, payload: &[u8]) {
    let mut header = Vec::with_capacity(HEADER_ROOM);
    put_header(&mut header, opcode, payload.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsByteStream<S> {
    /// Writes `out` to the socket, then flushes it.
    fn poll_send_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(rest) = self.out.get(self.sent..).filter(|r| !r.is_empty()) {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        if !self.out.is_empty() {
            let len = self.out.len();
            self.out.clear();
            self.sent = 0;
            if len <= OUTPUT_FREED_BELOW_BYTES || self.out.capacity() > OUTPUT_KEPT_MAX_BYTES {
                self.out = BytesMut::new();
            } else if self.message.is_empty() {
                // A busy connection's next message reuses the buffer.
                std::mem::swap(&mut self.out, &mut self.message);
            }
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Sends what is queued, the gathered message last, then flushes.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.poll_send_out(cx))?;
            if self.message.len() <= HEADER_ROOM || self.close_sent {
                return Poll::Ready(Ok(()));
            }
            self.finish_message();
        }
    }

    /// Turns the gathered message into a frame in `out` (which is empty)
    /// without copying its payload: its header goes in the room before.
    fn finish_message(&mut self) {
        let payload = self.message.get(HEADER_ROOM..).unwrap_or_default();
        let text =
            self.wire == WsWire::Stomp && self.reply_text && std::str::from_utf8(payload).is_ok();
        let opcode = if text { OP_TEXT } else { OP_BINARY };
        let mut header = Vec::with_capacity(HEADER_ROOM);
        put_header(&mut header, opcode, payload.len());
        let start = HEADER_ROOM - header.len();
        if let Some(room) = self.message.get_mut(start..HEADER_ROOM) {
            room.copy_from_slice(&header);
        }
        self.message.advance(start);
        std::mem::swap(&mut self.out, &mut self.message);
        self.message.clear();
        self.sent = 0;
    }

    /// Tries to send the close frame of a fault; the read error is what
    /// matters, so a close that cannot go out now is dropped.
    fn fail(&mut self, cx: &mut Context<'_>, fault: Fault) -> io::Error {
        self.queue_close(fault.code, fault.reason);
        let _ = self.poll_send_out(cx);
        io::Error::new(io::ErrorKind::InvalidData, fault.reason)
    }
}

/// Ready when a read will not wait: bytes already read wait to be parsed,
/// or the stream has ended; else when the socket has bytes. An idle
/// WebSocket over TCP so waits without a read buffer.
impl<S: Transport> Transport for WsByteStream<S> {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let parse_now = !self.raw.is_empty() && !self.raw_partial;
        if parse_now || self.read_done || self.read_error.is_some() {
            return Poll::Ready(Ok(()));
        }
        self.io.poll_read_ready(cx)
    }

    fn reports_readiness(&self) -> bool {
        self.io.reports_readiness()
    }

    fn is_at_rest(&self) -> bool {
        WsByteStream::is_at_rest(self) && self.io.is_at_rest()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsByteStream<S> {
    /// Reads from the socket into `buf` after what it holds, and parses
    /// the run in place (the fast path: the caller's buffer has room for
    /// whole frame headers). `kept` bytes go first.
    fn read_in_place(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Step {
        let at = buf.filled().len();
        let kept = std::mem::take(&mut self.raw);
        buf.put_slice(&kept);
        let step = self.read_socket(cx, buf);
        let end = buf.filled().len();
        let parsed = match buf.filled_mut().get_mut(at..end) {
            Some(run) => self.parse(run, usize::MAX),
            None => return step,
        };
        // A header cut short waits for the next read.
        let cut = buf
            .filled()
            .get(at + parsed.consumed..end)
            .unwrap_or_default();
        self.raw = cut.to_vec();
        self.raw_partial = !self.raw.is_empty();
        buf.set_filled(at + parsed.produced);
        self.after_parse(cx, step, parsed.fault)
    }

    /// The slow path, for a small read buffer or bytes kept from before:
    /// reads into `raw` (when it holds no whole frame header) and parses
    /// it there, moving at most what `buf` has room for.
    fn read_staged(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Step {
        let mut step = Step::Read;
        let mut raw = std::mem::take(&mut self.raw);
        if raw.is_empty() || self.raw_partial {
            let len = raw.len();
            raw.resize(len + STAGED_READ_BYTES, 0);
            let mut staged = ReadBuf::new(raw.get_mut(len..).unwrap_or_default());
            step = self.read_socket_into(cx, &mut staged);
            let n = staged.filled().len();
            raw.truncate(len + n);
        }
        let parsed = self.parse(&mut raw, buf.remaining());
        buf.put_slice(raw.get(..parsed.produced).unwrap_or_default());
        raw.drain(..parsed.consumed.min(raw.len()));
        self.raw_partial = parsed.want_input && !raw.is_empty();
        if raw.is_empty() {
            raw = Vec::new();
        } else if self.raw_partial {
            raw.shrink_to_fit();
        }
        self.raw = raw;
        self.after_parse(cx, step, parsed.fault)
    }

    fn read_socket(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Step {
        if buf.remaining() == 0 {
            return Step::Read;
        }
        self.read_socket_into(cx, buf)
    }

    fn read_socket_into(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Step {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Pending => Step::Pending,
            Poll::Ready(Err(e)) => Step::Failed(e),
            Poll::Ready(Ok(())) if buf.filled().len() == before => {
                // The peer went without a close: the stream ends. Nothing
                // is sent once the end is returned; until then a fault in
                // the bytes read before the end still sends its close.
                self.read_done = true;
                Step::Read
            }
            Poll::Ready(Ok(())) => Step::Read,
        }
    }

    /// Sends the pongs parsing queued, and turns a fault into the error
    /// the read reports.
    fn after_parse(&mut self, cx: &mut Context<'_>, step: Step, fault: Option<Fault>) -> Step {
        if !self.out.is_empty() && !self.read_done {
            // Pongs go out now, as they can: a client that only pings gets
            // no other write.
            let _ = self.poll_send_out(cx);
        }
        match fault {
            Some(fault) => Step::Failed(self.fail(cx, fault)),
            None => step,
        }
    }
}

/// What one read attempt came to.
enum Step {
    /// The socket gave bytes (or the stream ended).
    Read,
    /// The socket has nothing now.
    Pending,
    Failed(io::Error),
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsByteStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let start = buf.filled().len();
        let mut empty_reads = 0;
        loop {
            let got_some = buf.filled().len() > start;
            if let Some(e) = this.read_error.take() {
                if got_some {
                    this.read_error = Some(e);
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(*e));
            }
            if this.read_done {
                if got_some {
                    return Poll::Ready(Ok(()));
                }
                // The close reply goes out before the stream ends; after
                // it (or after the peer's end) nothing more is sent.
                this.close_sent = true;
                if ready!(this.poll_send_out(cx)).is_err() {
                    this.out.clear();
                }
                return Poll::Ready(Ok(()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let in_place = this.raw.len() + IN_PLACE_ROOM_MIN <= buf.remaining();
            let step = if in_place {
                this.read_in_place(cx, buf)
            } else {
                this.read_staged(cx, buf)
            };
            let got_some = buf.filled().len() > start;
            match step {
                Step::Failed(e) => this.read_error = Some(Box::new(e)),
                Step::Pending if got_some => return Poll::Ready(Ok(())),
                Step::Pending => return Poll::Pending,
                Step::Read if got_some || this.read_done => {}
                Step::Read => {
                    empty_reads += 1;
                    if empty_reads >= EMPTY_READS_PER_POLL_MAX {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsByteStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.close_sent {
            // Closing: what comes after our close frame is not sent.
            return Poll::Ready(Ok(data.len()));
        }
        if this.message.len() >= HEADER_ROOM + OUTGOING_MESSAGE_MAX_BYTES {
            ready!(this.poll_send(cx))?;
        }
        if this.message.is_empty() {
            this.message.reserve(HEADER_ROOM + data.len());
            this.message.extend_from_slice(&[0; HEADER_ROOM]);
        }
        let room = HEADER_ROOM + OUTGOING_MESSAGE_MAX_BYTES - this.message.len();
        let n = data.len().min(room);
        this.message
            .extend_from_slice(data.get(..n).unwrap_or_default());
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        this.queue_close(CLOSE_NORMAL, "");
        ready!(this.poll_send_out(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_checked_across_chunks() {
        let text = "añ€😀 end".as_bytes();
        for cut in 0..text.len() {
            let mut tail = Utf8Tail::default();
            assert!(tail.check(&text[..cut]), "{cut}");
            assert!(tail.check(&text[cut..]), "{cut}");
            assert!(tail.is_complete(), "{cut}");
        }
        let mut tail = Utf8Tail::default();
        assert!(tail.check(&[0xE2, 0x82]));
        assert!(!tail.is_complete());
        assert!(!tail.check(&[0x28]), "a broken sequence");
        assert!(!Utf8Tail::default().check(&[0xFF]));
        // An encoded surrogate is not UTF-8, even cut in two.
        let mut tail = Utf8Tail::default();
        assert!(tail.check(&[0xED]));
        assert!(!tail.check(&[0xA0, 0x80]));
    }

    /// Found by the `websocket_frames` fuzz target against tungstenite
    /// (protocols/FUZZING.md, finding 11): a sequence cut after its second
    /// byte was only checked for continuation bytes, so E0 84 (overlong),
    /// ED A0 (a surrogate), F0 8F (overlong) and F4 90 (above U+10FFFF)
    /// passed until their last byte came, and a text frame ending there
    /// went through.
    #[test]
    fn a_sequence_cut_after_its_second_byte_is_checked_at_once() {
        for bad in [
            [0xE0, 0x84],
            [0xED, 0xA0],
            [0xF0, 0x8F],
            [0xF4, 0x90],
            [0xC3, 0x28],
        ] {
            let mut tail = Utf8Tail::default();
            assert!(tail.check(&bad[..1]), "{bad:02x?}: the lead byte alone");
            assert!(!tail.check(&bad[1..]), "{bad:02x?}");
        }
        // Their valid neighbours, cut the same way, complete.
        for good in [
            &[0xE0, 0xA0, 0x80][..],
            &[0xED, 0x9F, 0xBF],
            &[0xF0, 0x90, 0x80, 0x80],
            &[0xF4, 0x8F, 0xBF, 0xBF],
        ] {
            let mut tail = Utf8Tail::default();
            for byte in good {
                assert!(tail.check(std::slice::from_ref(byte)), "{good:02x?}");
            }
            assert!(tail.is_complete(), "{good:02x?}");
        }
    }

    #[test]
    fn unmasking_from_any_mask_position() {
        let mask = [1, 2, 3, 4];
        let plain: Vec<u8> = (0u8..23).collect();
        let masked: Vec<u8> = plain
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        for cut in 0..plain.len() {
            let mut data = masked.clone();
            let (a, b) = data.split_at_mut(cut);
            unmask(a, mask, 0);
            unmask(b, mask, cut % 4);
            assert_eq!(data, plain, "{cut}");
        }
    }

    #[test]
    fn headers_parse_only_when_whole() {
        let mut frame = vec![0x82, 0xFE, 0x01, 0x00, 9, 9, 9, 9];
        for len in 0..frame.len() {
            assert!(parse_header(&frame[..len]).is_none(), "{len}");
        }
        let (h, used) = parse_header(&frame).expect("whole");
        assert_eq!(
            (h.fin, h.opcode, h.len, h.masked, used),
            (true, OP_BINARY, 256, true, 8)
        );
        frame[1] = 0x7F;
        assert!(
            parse_header(&frame).is_none(),
            "64-bit length needs 10 bytes"
        );
        let mut out = Vec::new();
        put_header(&mut out, OP_TEXT, 70_000);
        let (h, used) = parse_header(&out).expect("whole");
        assert_eq!((h.len, h.masked, used), (70_000, false, 10));
    }

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    /// A client frame: FIN as given, masked with a fixed key.
    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xFA, 0x21, 0x3D];
        let mut out = Vec::new();
        put_header(&mut out, opcode, payload.len());
        out[0] = (out[0] & 0x7F) | if fin { 0x80 } else { 0 };
        out[1] |= 0x80;
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    /// What parking keeps (`parking`): only a stream at rest gives up its
    /// socket, and it comes back with its settings.
    #[tokio::test]
    async fn only_a_stream_at_rest_parks_and_it_keeps_its_settings() {
        let (mut client, mut server) = pair(WsWire::Stomp);
        assert!(server.is_at_rest(), "a new stream");
        // A binary message: STOMP answers in binary from now on.
        client
            .write_all(&frame(true, OP_BINARY, b"CONNECT"))
            .await
            .expect("write");
        let mut buf = [0u8; 64];
        let n = server.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"CONNECT");
        assert!(server.is_at_rest(), "after a whole message");

        // A cut frame header, then a message under way: not at rest.
        let whole = frame(true, OP_BINARY, b"SEND");
        client.write_all(&whole[..3]).await.expect("write");
        let read =
            tokio::time::timeout(std::time::Duration::from_millis(50), server.read(&mut buf)).await;
        assert!(read.is_err(), "nothing to read yet");
        assert!(!server.is_at_rest(), "a frame header cut");
        client.write_all(&whole[3..]).await.expect("write");
        let n = server.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"SEND");
        client
            .write_all(&frame(false, OP_BINARY, b"par"))
            .await
            .expect("write");
        let n = server.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"par");
        assert!(!server.is_at_rest(), "a fragmented message under way");
        client
            .write_all(&frame(true, OP_CONTINUATION, b"t"))
            .await
            .expect("write");
        let n = server.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"t");
        assert!(server.is_at_rest());

        let (io, rest) = server.into_rest().expect("at rest");
        let mut server = WsByteStream::from_rest(io, rest);
        assert!(server.is_at_rest());
        server.write_all(b"MESSAGE").await.expect("write");
        server.flush().await.expect("flush");
        let mut got = [0u8; 9];
        client.read_exact(&mut got).await.expect("read");
        assert_eq!(got[0], 0x80 | OP_BINARY, "binary, as before parking");
        assert_eq!(&got[2..], b"MESSAGE");
    }

    fn pair(wire: WsWire) -> (DuplexStream, WsByteStream<DuplexStream>) {
        let (client, server) = tokio::io::duplex(1 << 16);
        (client, WsByteStream::new(server, Vec::new(), wire, 1024))
    }

    /// Everything the server sent, as (opcode, payload) frames.
    /// The server sent one frame, a close with `code` (and perhaps a
    /// reason); `context` names the case in a failure.
    async fn only_a_close_was_sent(client: &mut DuplexStream, code: u16, context: &str) {
        let sent = frames_sent(client).await;
        assert_eq!(sent.len(), 1, "{context} {sent:?}");
        assert_eq!(sent[0].0, OP_CLOSE, "{context}");
        assert_eq!(sent[0].1[..2], code.to_be_bytes(), "{context}");
    }

    async fn frames_sent(client: &mut DuplexStream) -> Vec<(u8, Vec<u8>)> {
        let mut bytes = vec![0u8; 1 << 16];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), client.read(&mut bytes))
            .await
            .expect("in time")
            .expect("read");
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some((h, used)) = parse_header(&bytes[at..n]) {
            assert!(!h.masked, "server frames are not masked");
            let len = h.len as usize;
            frames.push((h.opcode, bytes[at + used..at + used + len].to_vec()));
            at += used + len;
        }
        assert_eq!(at, n, "whole frames");
        frames
    }

    #[tokio::test]
    async fn fragments_and_control_frames_between_them() {
        let (mut client, mut stream) = pair(WsWire::Stomp);
        let text = "héllo wörld".as_bytes();
        // A text message in three fragments, cut inside characters, with a
        // ping between the fragments.
        let mut bytes = frame(false, OP_TEXT, &text[..2]);
        bytes.extend(frame(true, OP_PING, b"p"));
        bytes.extend(frame(false, OP_CONTINUATION, &text[2..9]));
        bytes.extend(frame(true, OP_CONTINUATION, &text[9..]));
        bytes.extend(frame(true, OP_BINARY, b"!"));
        client.write_all(&bytes).await.expect("write");
        let mut got = vec![0u8; text.len() + 1];
        stream.read_exact(&mut got).await.expect("read");
        assert_eq!(&got[..text.len()], text);
        assert_eq!(got[text.len()], b'!');
        assert_eq!(frames_sent(&mut client).await, [(OP_PONG, b"p".to_vec())]);
        // The last message was binary: STOMP answers binary.
        stream.write_all(b"ok").await.expect("write");
        stream.flush().await.expect("flush");
        assert_eq!(
            frames_sent(&mut client).await,
            [(OP_BINARY, b"ok".to_vec())]
        );
    }

    #[tokio::test]
    async fn one_byte_reads_see_the_same_stream() {
        let (mut client, mut stream) = pair(WsWire::Mqtt);
        let mut bytes = frame(true, OP_BINARY, &[7u8; 300]);
        bytes.extend(frame(true, OP_PING, b"x"));
        bytes.extend(frame(true, OP_BINARY, b"end"));
        client.write_all(&bytes).await.expect("write");
        let mut got = Vec::new();
        let mut one = [0u8; 1];
        while got.len() < 303 {
            let n = stream.read(&mut one).await.expect("read");
            assert_eq!(n, 1, "never an end of stream");
            got.push(one[0]);
        }
        assert_eq!(&got[..300], &[7u8; 300][..]);
        assert_eq!(&got[300..], b"end");
        assert!(
            stream.raw.is_empty() && stream.raw.capacity() == 0,
            "nothing kept"
        );
    }

    #[tokio::test]
    async fn protocol_violations_close_with_1002() {
        let unmasked = {
            let mut f = Vec::new();
            put_header(&mut f, OP_BINARY, 1);
            f.push(0);
            f
        };
        let reserved_bits = {
            let mut f = frame(true, OP_BINARY, b"a");
            f[0] |= 0x40;
            f
        };
        for bad in [
            unmasked,
            reserved_bits,
            frame(true, 0x3, b"a"),
            frame(true, OP_CONTINUATION, b"a"),
            frame(false, OP_PING, b"a"),
            frame(true, OP_PING, &[0u8; 126]),
            [frame(false, OP_BINARY, b"a"), frame(true, OP_TEXT, b"b")].concat(),
            frame(true, OP_CLOSE, &[3]),
        ] {
            let (mut client, mut stream) = pair(WsWire::Mqtt);
            client.write_all(&bad).await.expect("write");
            let mut buf = [0u8; 64];
            // Bytes before the fault come first (here at most one).
            let err = match stream.read(&mut buf).await {
                Ok(1) => stream.read(&mut buf).await.expect_err("then the fault"),
                Ok(n) => panic!("{bad:02x?}: read {n}"),
                Err(e) => e,
            };
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{bad:02x?}");
            only_a_close_was_sent(&mut client, CLOSE_PROTOCOL, &format!("{bad:02x?}")).await;
        }
    }

    /// Found by the `websocket_frames` fuzz target against tungstenite
    /// (protocols/FUZZING.md, finding 10): a close whose reason was not
    /// UTF-8 was echoed and the stream ended cleanly.
    #[tokio::test]
    async fn a_close_reason_that_is_not_utf8_fails_with_1007() {
        let (mut client, mut stream) = pair(WsWire::Stomp);
        let mut close = CLOSE_NORMAL.to_be_bytes().to_vec();
        close.extend_from_slice(b"bye \xFE");
        client
            .write_all(&frame(true, OP_CLOSE, &close))
            .await
            .expect("write");
        let mut buf = [0u8; 16];
        let err = stream.read(&mut buf).await.expect_err("a fault");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        only_a_close_was_sent(&mut client, CLOSE_INVALID, "").await;
    }

    /// The same round (finding 10): a close code RFC 6455 7.4 lets no
    /// endpoint send (1005, 1006 and 1015 among them) was echoed, so we
    /// sent it; it is answered 1002, the codes a peer may send are echoed.
    #[tokio::test]
    async fn a_close_code_no_endpoint_may_send_is_answered_1002() {
        let forbidden = [
            0u16, 999, 1004, 1005, 1006, 1014, 1015, 1016, 2999, 5000, 65535,
        ];
        let allowed = [1000u16, 1001, 1002, 1003, 1007, 1011, 1013, 3000, 4999];
        for (code, answer) in forbidden
            .iter()
            .map(|&c| (c, CLOSE_PROTOCOL))
            .chain(allowed.iter().map(|&c| (c, c)))
        {
            let (mut client, mut stream) = pair(WsWire::Mqtt);
            client
                .write_all(&frame(true, OP_CLOSE, &code.to_be_bytes()))
                .await
                .expect("write");
            let mut rest = Vec::new();
            stream.read_to_end(&mut rest).await.expect("a clean end");
            assert_eq!(
                frames_sent(&mut client).await,
                [(OP_CLOSE, answer.to_be_bytes().to_vec())],
                "close {code}"
            );
        }
    }

    /// Found by the `websocket_frames` fuzz target (protocols/FUZZING.md,
    /// finding 12): a fault in bytes kept from an earlier read, parsed in
    /// the read that met the peer's end, failed the read without its close
    /// frame, because meeting the end had already marked the close sent.
    #[tokio::test]
    async fn a_fault_found_with_the_peers_end_still_sends_its_close() {
        let (mut client, mut stream) = pair(WsWire::Stomp);
        // A final text frame ending inside a character.
        let mut text = vec![b'a'; 99];
        text.push(0xC3);
        client
            .write_all(&frame(true, OP_TEXT, &text))
            .await
            .expect("write");
        client.shutdown().await.expect("the client's end");
        // A small read takes the staged path, which keeps the rest of the
        // frame; a large one then parses it in place, with the end.
        let mut small = [0u8; 10];
        assert_eq!(stream.read(&mut small).await.expect("read"), 10);
        let mut large = [0u8; 200];
        let mut got = 10;
        let err = loop {
            match stream.read(&mut large).await {
                Ok(0) => panic!("a clean end after a broken character"),
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert_eq!(got, 100, "the payload comes before the fault at its end");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        only_a_close_was_sent(&mut client, CLOSE_INVALID, "").await;
    }

    #[tokio::test]
    async fn a_close_is_echoed_and_nothing_follows_it() {
        let (mut client, mut stream) = pair(WsWire::Amqp);
        let mut close = frame(true, OP_CLOSE, &4000u16.to_be_bytes());
        close.extend(frame(true, OP_BINARY, b"after"));
        client.write_all(&close).await.expect("write");
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).await.expect("clean end");
        assert!(rest.is_empty(), "nothing after the close");
        assert_eq!(
            frames_sent(&mut client).await,
            [(OP_CLOSE, 4000u16.to_be_bytes().to_vec())]
        );
        // Output after our close reply is dropped, not sent.
        stream.write_all(b"late").await.expect("accepted");
        stream.flush().await.expect("flush");
        stream.shutdown().await.expect("shutdown");
        let mut after = Vec::new();
        client.read_to_end(&mut after).await.expect("read");
        assert!(after.is_empty(), "{after:?}");
    }
}
