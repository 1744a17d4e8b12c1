//! The broker's WebSocket frame layer (`src/server/ws_frames.rs`, through
//! `rosetta::server::fuzzing::websocket_frames` and `websocket_writes`)
//! against tungstenite 0.30's: a differential target.
//!
//! The first byte picks the mode:
//! - raw (1 in 4): the rest is the client's bytes after the upgrade;
//! - frames (2 in 4): the rest describes frames, mostly well formed, with
//!   fuzzer-chosen faults (reserved bits and opcodes, unmasked frames,
//!   non-minimal lengths, lengths that overrun the input, oversized and
//!   fragmented control frames, close codes and reasons of any bytes);
//! - writes (1 in 4): the rest describes what an adapter writes and when
//!   it flushes.
//!
//! Reading (raw and frames): the same bytes go to our frame layer (in
//! fuzzer-chosen socket chunks, read buffers, `Pending`s, and a part of
//! them as the bytes that came with the upgrade request) and to
//! tungstenite's server-role `WebSocket` with the same message limit. Our
//! layer is a byte stream, so message boundaries are not observable; what
//! is compared:
//! - accept or reject, and the kind of rejection: tungstenite's protocol
//!   error, UTF-8 error and capacity error are our close codes 1002, 1007
//!   and 1009;
//! - a close: we echo the code tungstenite answers with (its own, or 1002
//!   for a code RFC 6455 7.4 does not allow to be sent);
//! - the bytes: tungstenite's complete data messages, concatenated, are a
//!   prefix of what we yield, and what we yield is a prefix of the data
//!   frames' payloads up to where tungstenite stopped; exactly the
//!   messages when none was left incomplete;
//! - every ping before the stop is answered by a pong with its payload,
//!   in order, and nothing but pongs and at most one close is sent.
//!
//! Deliberate differences, encoded here rather than left to fail:
//! - we answer an empty close with 1000, tungstenite with an empty close;
//! - we yield a data message's bytes as they arrive and check its size
//!   and its frame headers before its payload arrives, tungstenite when
//!   the frame is whole. So when the input ends inside a frame
//!   (tungstenite: reset without a closing handshake) we may already
//!   have failed: that frame, completed with payload bytes that unmask to
//!   zero, must make tungstenite fail the same way;
//! - our limit applies to data messages, not control frames (at most 125
//!   bytes anyway): tungstenite's frame limit is set to at least 125.
//!
//! Writing: each write description is written through our layer (over a
//! peer that takes fuzzer-chosen partial writes and now and then answers
//! `Pending`), then the stream is shut down; tungstenite's client-role
//! reader must read one message per flush (split at 1 MiB), binary, or
//! text for STOMP when the message is UTF-8 (the client sent nothing, so
//! STOMP answers text), then a close 1000, and every frame is final and
//! unmasked.
#![no_main]

use std::io::{self, Cursor, Read, Write};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use libfuzzer_sys::fuzz_target;
use rosetta::server::fuzzing::{websocket_frames, websocket_writes, FramesWire};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tungstenite::error::{Error as WsError, ProtocolError};
use tungstenite::protocol::frame::coding::OpCode;
use tungstenite::protocol::frame::{FrameHeader, FrameSocket};
use tungstenite::protocol::{Role, WebSocket, WebSocketConfig};
use tungstenite::Message;

/// Our layer's largest outgoing message (`OUTGOING_MESSAGE_MAX_BYTES`).
const OUTGOING_MESSAGE_MAX_BYTES: usize = 1024 * 1024;
/// Most bytes one input of the writes mode writes.
const WRITES_MAX_BYTES: usize = 3 * 1024 * 1024;
/// The largest control frame payload (RFC 6455 5.5).
const CONTROL_PAYLOAD_MAX_BYTES: usize = 125;

const CLOSE_NORMAL: u16 = 1000;
const CLOSE_PROTOCOL: u16 = 1002;
const CLOSE_INVALID: u16 = 1007;
const CLOSE_SIZE: u16 = 1009;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    })
}

/// The client as our layer sees it: hands out `input` in reads of at most
/// `read_chunk` bytes, takes writes of at most `write_chunk` bytes, and
/// answers `Pending` (waking at once) every `pending_every`+1-th read, and
/// every such write when `write_pending`.
struct ScriptedPeer {
    input: Vec<u8>,
    pos: usize,
    read_chunk: usize,
    write_chunk: usize,
    pending_every: usize,
    write_pending: bool,
    reads: usize,
    writes: usize,
    written: Vec<u8>,
}

impl ScriptedPeer {
    fn pending(count: usize, every: usize, cx: &mut Context<'_>) -> bool {
        if every > 0 && count % (every + 1) == 0 {
            cx.waker().wake_by_ref();
            return true;
        }
        false
    }
}

impl AsyncRead for ScriptedPeer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.reads += 1;
        if Self::pending(self.reads, self.pending_every, cx) {
            return Poll::Pending;
        }
        let n = self
            .read_chunk
            .min(buf.remaining())
            .min(self.input.len() - self.pos);
        let start = self.pos;
        buf.put_slice(&self.input[start..start + n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ScriptedPeer {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.writes += 1;
        if self.write_pending && Self::pending(self.writes, self.pending_every, cx) {
            return Poll::Pending;
        }
        let n = data.len().min(self.write_chunk);
        self.written.extend_from_slice(&data[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Reads the next `n` bytes of a description, fewer at its end.
fn take<'a>(desc: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, rest) = desc.split_at(n.min(desc.len()));
    *desc = rest;
    head
}

fn take_byte(desc: &mut &[u8]) -> u8 {
    take(desc, 1).first().copied().unwrap_or(0)
}

/// `len` payload bytes: the description's next ones, repeated when it has
/// fewer (copied a block at a time: payloads of a MiB are common in the
/// writes mode, and a byte loop under coverage instrumentation is slow).
fn payload(desc: &mut &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(take(desc, len));
    if out.is_empty() && len > 0 {
        out.push(b'x');
    }
    while out.len() < len {
        let n = out.len().min(len - out.len());
        out.extend_from_within(..n);
    }
    out
}

/// One client frame with every header field chosen.
struct FrameSpec {
    fin: bool,
    reserved: u8,
    opcode: u8,
    mask: Option<[u8; 4]>,
    /// Length field form: 0 minimal, 1 16-bit, 2 64-bit.
    length_form: u8,
    /// Added to the true payload length in the header (the input then
    /// ends inside the frame or the next frame's bytes are its payload).
    length_lie: u64,
    payload: Vec<u8>,
}

fn push_frame(out: &mut Vec<u8>, f: &FrameSpec) {
    out.push(if f.fin { 0x80 } else { 0 } | (f.reserved & 0x70) | (f.opcode & 0x0F));
    let masked = if f.mask.is_some() { 0x80 } else { 0 };
    let len = f.payload.len() as u64 + f.length_lie;
    match (f.length_form, len) {
        (0, n) if n < 126 => out.push(masked | n as u8),
        (0 | 1, n) if n <= 0xFFFF => {
            out.push(masked | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        (_, n) => {
            out.push(masked | 127);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
    match f.mask {
        Some(mask) => {
            out.extend_from_slice(&mask);
            out.extend(f.payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
        }
        None => out.extend_from_slice(&f.payload),
    }
}

/// Turns a description into client frames. Per frame a kind byte
/// (low 3 bits: continuation, text, binary, close, ping, pong, any
/// opcode, continuation; bit 3: not final; bit 6: text made UTF-8;
/// bit 7: a fault byte follows), a length byte, a mask byte, the payload.
fn described_frames(mut desc: &[u8]) -> Vec<u8> {
    let mut wire = Vec::new();
    while desc.len() >= 3 {
        let kind = take_byte(&mut desc);
        let fault = if kind & 0x80 != 0 {
            take_byte(&mut desc)
        } else {
            0
        };
        let len_byte = take_byte(&mut desc);
        let m = take_byte(&mut desc);
        // Payloads up to 255 bytes, or up to a few KiB now and then (past
        // the 16-bit length form and the small limits).
        let len = match len_byte {
            0..=249 => usize::from(len_byte),
            n => usize::from(n - 249) * 700,
        };
        let opcode = match kind & 7 {
            0 | 7 => 0x0,
            1 => 0x1,
            2 => 0x2,
            3 => 0x8,
            4 => 0x9,
            5 => 0xA,
            _ => kind >> 3 & 0x0F,
        };
        let mut body = match opcode {
            // A close: a code from the description, then a reason.
            0x8 => {
                let code = payload(&mut desc, 2.min(len));
                let mut body = code;
                let reason = payload(&mut desc, len.saturating_sub(2).min(123));
                body.extend_from_slice(&reason);
                body
            }
            _ => payload(&mut desc, len),
        };
        if kind & 0x40 != 0 && opcode <= 0x2 {
            body = String::from_utf8_lossy(&body).into_owned().into_bytes();
        }
        let spec = FrameSpec {
            fin: kind & 0x08 == 0,
            reserved: if fault & 0x01 != 0 { fault & 0x70 } else { 0 },
            opcode,
            mask: if fault & 0x02 != 0 {
                None
            } else {
                Some([m, m ^ 0x5A, m.wrapping_add(1), !m])
            },
            length_form: (fault >> 2) & 3,
            length_lie: if fault & 0x08 != 0 {
                u64::from(fault >> 4)
            } else {
                0
            },
            payload: body,
        };
        push_frame(&mut wire, &spec);
    }
    wire
}

/// How a read ended, as the comparison sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The peer's close, answered with this code (none: an empty close).
    Close(Option<u16>),
    /// The input ended without a close (tungstenite: reset without a
    /// closing handshake; we: a clean end of stream).
    Truncated,
    /// Failed, with the close code that kind of failure is sent with.
    Fault(u16),
}

/// One frame of the input as tungstenite's header parser reads it.
struct Walked {
    start: usize,
    /// Where its bytes end in the input (its payload may be cut short).
    end: usize,
    /// Header and payload all present.
    complete: bool,
    /// `None` for a header the input cuts short.
    opcode: Option<u8>,
    fin: bool,
    /// Any reserved bit set.
    reserved: bool,
    masked: bool,
    /// The payload length the header declares.
    len: u64,
    /// The present part of the payload, unmasked.
    payload: Vec<u8>,
    /// For a frame cut inside its payload: the bytes that complete it
    /// with a payload that unmasks to zeros.
    padding: Vec<u8>,
}

fn opcode_byte(op: OpCode) -> u8 {
    u8::from(op)
}

/// Whether frame `i`'s header alone breaks RFC 6455: reserved bits, no
/// mask, a reserved opcode, a fragmented or oversized control frame, a
/// continuation with no message or a new message inside one. We check
/// these before a message's size; tungstenite checks a frame's size
/// first, so where both apply it fails with a capacity error and we with
/// 1002. (The frames before `i` were all read, so they are valid.)
fn header_protocol_fault(frames: &[Walked], i: usize) -> bool {
    let Some(f) = frames.get(i) else {
        return false;
    };
    let Some(op) = f.opcode else {
        return false;
    };
    let open = frames[..i]
        .iter()
        .rev()
        .find(|g| matches!(g.opcode, Some(0x0..=0x2)))
        .is_some_and(|g| !g.fin);
    f.reserved
        || !f.masked
        || matches!(op, 0x3..=0x7 | 0xB..=0xF)
        || (op >= 0x8 && (!f.fin || f.len > CONTROL_PAYLOAD_MAX_BYTES as u64))
        || (op == 0x0 && !open)
        || (matches!(op, 0x1 | 0x2) && open)
}

/// Whether our close code `ours` is the failure tungstenite reports as
/// `theirs` (a close code too) at frame `i`.
fn same_fault(theirs: u16, ours: u16, frames: &[Walked], i: usize) -> bool {
    theirs == ours
        || (theirs == CLOSE_SIZE && ours == CLOSE_PROTOCOL && header_protocol_fault(frames, i))
}

/// The input's frames. A reserved opcode makes tungstenite's header
/// parser fail; its frame's extent is read with the opcode replaced.
fn walk(input: &[u8]) -> Vec<Walked> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < input.len() {
        let rest = &input[at..];
        let raw_opcode = rest[0] & 0x0F;
        let parsed = FrameHeader::parse(&mut Cursor::new(rest)).or_else(|_| {
            let mut patched = rest[..rest.len().min(14)].to_vec();
            patched[0] = (patched[0] & 0xF0) | 0x2;
            FrameHeader::parse(&mut Cursor::new(patched))
        });
        let Ok(Some((header, len))) = parsed else {
            frames.push(Walked {
                start: at,
                end: input.len(),
                complete: false,
                opcode: None,
                fin: false,
                reserved: false,
                masked: false,
                len: 0,
                payload: Vec::new(),
                padding: Vec::new(),
            });
            break;
        };
        // The header's length as written (tungstenite's own form may be
        // shorter, for a length the input encodes in more bytes than needed).
        let header_len = match rest[1] & 0x7F {
            126 => 4,
            127 => 10,
            _ => 2,
        } + if header.mask.is_some() { 4 } else { 0 };
        let available = (rest.len() - header_len) as u64;
        let present = len.min(available) as usize;
        let mask = header.mask.unwrap_or([0; 4]);
        let payload: Vec<u8> = rest[header_len..header_len + present]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        let complete = present as u64 == len;
        // Padding only for frames our limits could let through.
        let padding = if complete || len > 2 * 1024 * 1024 {
            Vec::new()
        } else {
            (present..len as usize).map(|i| mask[i % 4]).collect()
        };
        frames.push(Walked {
            start: at,
            end: at + header_len + present,
            complete,
            opcode: Some(raw_opcode),
            fin: header.is_final,
            reserved: header.rsv1 || header.rsv2 || header.rsv3,
            masked: header.mask.is_some(),
            len,
            payload,
            padding,
        });
        if !complete {
            break;
        }
        at += header_len + present;
    }
    frames
}

/// tungstenite's side of the socket: hands out the input but never past
/// the end of a frame in one read, so that where it stopped tells which
/// frame it stopped at; keeps what it writes.
struct FramedReader<'a> {
    input: &'a [u8],
    pos: usize,
    ends: Vec<usize>,
}

impl Read for FramedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let next = self
            .ends
            .iter()
            .copied()
            .find(|&e| e > self.pos)
            .unwrap_or(self.input.len());
        let n = buf.len().min(next - self.pos);
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Write for FramedReader<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What tungstenite read: its complete data messages concatenated, how it
/// ended, and how many input bytes it took.
struct Reference {
    messages: Vec<u8>,
    end: End,
    consumed: usize,
}

fn read_with_tungstenite(input: &[u8], frames: &[Walked], message_max: usize) -> Reference {
    let reader = FramedReader {
        input,
        pos: 0,
        ends: frames.iter().map(|f| f.end).collect(),
    };
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .max_message_size(Some(message_max))
        .max_frame_size(Some(message_max.max(CONTROL_PAYLOAD_MAX_BYTES)));
    let mut ws = WebSocket::from_raw_socket(reader, Role::Server, Some(config));
    let mut messages = Vec::new();
    let end = loop {
        match ws.read() {
            Ok(Message::Text(text)) => messages.extend_from_slice(text.as_bytes()),
            Ok(Message::Binary(bytes)) => messages.extend_from_slice(&bytes),
            Ok(Message::Ping(_) | Message::Pong(_)) => {}
            Ok(Message::Close(close)) => break End::Close(close.map(|c| u16::from(c.code))),
            Ok(Message::Frame(_)) => unreachable!("raw frames are not read"),
            Err(WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake)) => {
                break End::Truncated
            }
            Err(WsError::Protocol(_)) => break End::Fault(CLOSE_PROTOCOL),
            Err(WsError::Utf8(_)) => break End::Fault(CLOSE_INVALID),
            Err(WsError::Capacity(_)) => break End::Fault(CLOSE_SIZE),
            Err(e) => panic!("tungstenite failed unexpectedly: {e}"),
        }
    };
    Reference {
        messages,
        end,
        consumed: ws.get_ref().pos,
    }
}

/// For input that ends inside a frame whose header is whole: how
/// tungstenite reads it with that frame completed by payload bytes that
/// unmask to zeros, and the completed input's frames.
fn read_completed(input: &[u8], frames: &[Walked], message_max: usize) -> Option<(End, Vec<Walked>)> {
    let last = frames.last().filter(|f| !f.complete && f.opcode.is_some())?;
    let mut padded = input.to_vec();
    padded.extend_from_slice(&last.padding);
    let completed = walk(&padded);
    let end = read_with_tungstenite(&padded, &completed, message_max).end;
    Some((end, completed))
}

/// The frames our layer sent: (opcode, payload), each checked to be
/// final and unmasked.
fn server_frames(written: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut socket = FrameSocket::new(Cursor::new(written));
    let mut frames = Vec::new();
    loop {
        match socket.read(None) {
            Ok(Some(frame)) => {
                let h = frame.header();
                assert!(h.is_final, "a server frame is not final");
                assert!(h.mask.is_none(), "a server frame is masked");
                assert!(!(h.rsv1 || h.rsv2 || h.rsv3), "reserved bits in a server frame");
                frames.push((opcode_byte(h.opcode), frame.payload().to_vec()));
            }
            Ok(None) => break,
            Err(e) => panic!("our frames do not parse: {e}"),
        }
    }
    let (_, rest) = socket.into_inner();
    assert!(rest.is_empty(), "we sent a partial frame");
    frames
}

fn wire_of(b: u8) -> FramesWire {
    match b % 3 {
        0 => FramesWire::Mqtt,
        1 => FramesWire::Stomp,
        _ => FramesWire::Amqp,
    }
}

fn check_reading(knobs: [u8; 4], input: Vec<u8>) {
    let [k0, k1, k2, k3] = knobs;
    let wire = wire_of(k1);
    // Small limits (either side of 125, the control frame limit), or one
    // no input here reaches.
    let message_max = match k1 >> 2 {
        n @ 0..=31 => usize::from(n) * 9,
        _ => 1024 * 1024,
    };
    let read_chunk = match k2 & 0x80 {
        0 => 1 + usize::from(k2 & 0x0F),
        _ => usize::from(k2 & 0x7F) * 64 + 1,
    };
    // Small read buffers take our staged path, large ones the in-place one.
    let our_chunk = match k3 % 4 {
        0 => 1 + usize::from(k3 >> 2) % 16,
        1 => 64 + usize::from(k3),
        _ => 4096 * (1 + usize::from(k3 >> 6)),
    };
    let tail_len = match k0 >> 5 {
        0..=4 => 0,
        n => input.len() * usize::from(n - 4) / 4,
    };
    let frames = walk(&input);
    let reference = read_with_tungstenite(&input, &frames, message_max);

    let mut peer = ScriptedPeer {
        input: input[tail_len..].to_vec(),
        pos: 0,
        read_chunk,
        write_chunk: 1 + usize::from(k2 >> 4) * 3,
        pending_every: usize::from((k0 >> 2) & 7),
        write_pending: false,
        reads: 0,
        writes: 0,
        written: Vec::new(),
    };
    let tail = input[..tail_len].to_vec();
    let (read, end) =
        runtime().block_on(websocket_frames(&mut peer, wire, tail, message_max, our_chunk));
    let sent = server_frames(&peer.written);

    // Which frame tungstenite stopped at: the one holding its last byte,
    // or none (all of them) when the input ran out.
    let stop = match reference.end {
        End::Truncated => frames.len(),
        _ => frames
            .iter()
            .position(|f| f.start < reference.consumed && reference.consumed <= f.end)
            .expect("tungstenite stopped inside a frame"),
    };

    // What we sent: a pong per ping before the stop, then at most a close.
    let mut pongs = Vec::new();
    let mut close = None;
    for (opcode, payload) in &sent {
        assert!(close.is_none(), "a frame after our close");
        match opcode {
            0xA => pongs.push(payload.clone()),
            0x8 => {
                assert!(payload.len() >= 2, "our close has no code");
                close = Some(u16::from_be_bytes([payload[0], payload[1]]));
            }
            _ => panic!("we sent opcode {opcode:#x} while only reading"),
        }
    }
    let pings: Vec<Vec<u8>> = frames[..stop]
        .iter()
        .filter(|f| f.complete && f.opcode == Some(0x9))
        .map(|f| f.payload.clone())
        .collect();
    assert_eq!(pongs, pings, "pongs are not the pings' payloads");

    // How each side ended.
    let ours = match &end {
        Ok(()) => match close {
            Some(code) => End::Close(Some(code)),
            None => End::Truncated,
        },
        Err(e) => {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            End::Fault(close.expect("a failed read sent no close"))
        }
    };
    match (reference.end, ours) {
        (End::Close(theirs), End::Close(Some(code))) => {
            assert_eq!(theirs.unwrap_or(CLOSE_NORMAL), code, "close answered differently")
        }
        (End::Truncated, End::Truncated) => {
            // A header that breaks a rule we check at the header fails at
            // once, whether its payload comes or not: a cut frame that
            // tungstenite, once whole, refuses for its size or for such a
            // rule must have failed us too.
            if let Some((theirs, completed)) = read_completed(&input, &frames, message_max) {
                let last = completed.len() - 1;
                let at_header = theirs == End::Fault(CLOSE_SIZE)
                    || (theirs == End::Fault(CLOSE_PROTOCOL)
                        && header_protocol_fault(&completed, last));
                assert!(
                    !at_header,
                    "we read a cut frame's header to a clean end; once whole, tungstenite ends {theirs:?}"
                );
            }
        }
        (End::Fault(theirs), End::Fault(code)) => assert!(
            same_fault(theirs, code, &frames, stop),
            "tungstenite failed as with {theirs}, we with {code}"
        ),
        (End::Truncated, End::Fault(code)) => {
            // We failed on the frame the input cuts short, before having
            // it whole: completed, it must fail tungstenite the same way.
            let last = frames.last().expect("a cut frame");
            assert!(
                last.opcode.is_some(),
                "failed ({code}) on a frame header that is not whole"
            );
            let agrees = match read_completed(&input, &frames, message_max) {
                Some((End::Fault(theirs), completed)) => {
                    same_fault(theirs, code, &completed, completed.len() - 1)
                }
                _ => false,
            };
            assert!(
                agrees,
                "we failed with {code} on a cut frame that tungstenite, once whole, reads otherwise"
            );
        }
        (theirs, ours) => panic!("tungstenite ended {theirs:?}, we ended {ours:?}"),
    }

    // The bytes: between tungstenite's complete messages and the data
    // frames' payloads up to the stop.
    let data_frames = || {
        frames[..(stop + 1).min(frames.len())]
            .iter()
            .filter(|f| matches!(f.opcode, Some(0x0..=0x2)))
    };
    let upper: Vec<u8> = data_frames().flat_map(|f| f.payload.clone()).collect();
    assert!(
        read.starts_with(&reference.messages),
        "we yielded {} bytes that do not start with tungstenite's {} of complete messages",
        read.len(),
        reference.messages.len()
    );
    assert!(
        upper.starts_with(&read),
        "we yielded {} bytes, not a prefix of the {} of data frame payloads",
        read.len(),
        upper.len()
    );
    let message_open = frames[..stop]
        .iter()
        .rev()
        .find(|f| matches!(f.opcode, Some(0x0..=0x2)))
        .is_some_and(|f| !f.fin || !f.complete);
    let stop_is_data = frames
        .get(stop)
        .is_some_and(|f| matches!(f.opcode, Some(0x0..=0x2)));
    let cut = frames.last().is_some_and(|f| !f.complete);
    if !message_open && !stop_is_data && !cut {
        assert_eq!(
            read.len(),
            reference.messages.len(),
            "no message was left incomplete, yet we yielded other bytes"
        );
    }
}

/// The writes mode: per write a control byte (bit 0: flush after it;
/// bits 1-2: a short write of the next length byte's bytes, a long one of
/// up to 1.5 MiB, a UTF-8 one, or none), then its bytes.
fn check_writing(knobs: [u8; 4], mut desc: &[u8]) {
    let [k0, k1, k2, _] = knobs;
    let wire = wire_of(k1);
    // A peer that takes a few bytes per write makes a MiB cost a hundred
    // thousand polls: long writes go to a peer that takes them whole.
    let write_chunk = match k2 & 3 {
        0 => 1 + usize::from(k2 >> 2),
        _ => usize::MAX,
    };
    let budget = match write_chunk {
        usize::MAX => WRITES_MAX_BYTES,
        _ => 64 * 1024,
    };
    let mut writes: Vec<(Vec<u8>, bool)> = Vec::new();
    let mut total = 0;
    while !desc.is_empty() && total < budget {
        let control = take_byte(&mut desc);
        let flush = control & 1 != 0;
        let bytes = match (control >> 1) & 3 {
            0 => {
                let len = usize::from(take_byte(&mut desc));
                payload(&mut desc, len)
            }
            1 => {
                let len = (usize::from(take_byte(&mut desc)) % 24) * 64 * 1024
                    + usize::from(take_byte(&mut desc));
                payload(&mut desc, len.min(budget - total))
            }
            2 => {
                let len = usize::from(take_byte(&mut desc));
                String::from_utf8_lossy(&payload(&mut desc, len))
                    .into_owned()
                    .into_bytes()
            }
            _ => Vec::new(),
        };
        total += bytes.len();
        writes.push((bytes, flush));
    }
    let mut peer = ScriptedPeer {
        input: Vec::new(),
        pos: 0,
        read_chunk: 1,
        write_chunk,
        pending_every: usize::from((k0 >> 2) & 7),
        write_pending: true,
        reads: 0,
        writes: 0,
        written: Vec::new(),
    };
    let borrowed: Vec<(&[u8], bool)> = writes.iter().map(|(b, f)| (b.as_slice(), *f)).collect();
    runtime()
        .block_on(websocket_writes(&mut peer, wire, &borrowed))
        .expect("writes to a peer that takes everything");

    // The messages we mean to send: one per flush (and one at the end),
    // split at the outgoing limit; empty ones are not sent.
    let mut expected: Vec<Message> = Vec::new();
    let mut pending = Vec::new();
    let mut finish = |pending: &mut Vec<u8>| {
        for piece in pending.chunks(OUTGOING_MESSAGE_MAX_BYTES) {
            let text = wire == FramesWire::Stomp && std::str::from_utf8(piece).is_ok();
            expected.push(match text {
                true => Message::text(String::from_utf8_lossy(piece).into_owned()),
                false => Message::binary(piece.to_vec()),
            });
        }
        pending.clear();
    };
    for (bytes, flush) in &writes {
        pending.extend_from_slice(bytes);
        if *flush {
            finish(&mut pending);
        }
    }
    finish(&mut pending);

    let frames = server_frames(&peer.written);
    assert_eq!(frames.len(), expected.len() + 1, "one frame per message, and a close");

    let client = Cursor::new(peer.written);
    let config = WebSocketConfig::default()
        .max_message_size(None)
        .max_frame_size(None);
    let mut ws = WebSocket::from_raw_socket(client, Role::Client, Some(config));
    for (i, want) in expected.iter().enumerate() {
        match ws.read() {
            Ok(got) => assert!(
                &got == want,
                "message {i}: tungstenite read {} bytes ({}), we wrote {} ({})",
                got.len(),
                if got.is_text() { "text" } else { "binary" },
                want.len(),
                if want.is_text() { "text" } else { "binary" },
            ),
            Err(e) => panic!("message {i}: tungstenite refused what we wrote: {e}"),
        }
    }
    match ws.read() {
        Ok(Message::Close(Some(close))) => assert_eq!(u16::from(close.code), CLOSE_NORMAL),
        other => panic!("expected our close 1000 after the messages, got {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let knobs = [data[0], data[1], data[2], data[3]];
    let rest = &data[4..];
    match data[0] % 4 {
        0 => check_reading(knobs, rest.to_vec()),
        1 | 2 => check_reading(knobs, described_frames(rest)),
        _ => check_writing(knobs, rest),
    }
});
