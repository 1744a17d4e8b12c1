//! A peer's bytes against the HTTP port's WebSocket path
//! (`rosetta::server::fuzzing::websocket_session`: request head parsing,
//! routing, the answer or the upgrade, the frame layer (`ws_frames`) read
//! through the adapters' byte stream, one write back and a close), over an
//! in-memory peer that delivers its bytes in fuzzer-chosen chunks and now
//! and then makes the server wait.
//!
//! The first byte picks the mode and the knobs:
//! - raw: the rest is the whole connection (head and all). Oracles: no
//!   panic; a refusal is one of the documented statuses and is what went
//!   out on the wire; an upgrade answered 101 and yielded no more bytes
//!   than were sent.
//! - frames after a valid upgrade: the rest is raw frame bytes. Oracles as
//!   above.
//! - messages after a valid upgrade: the rest describes well-formed masked
//!   frames (data messages, possibly fragmented, with pings and pongs in
//!   between, an optional close, and a fuzzed message size limit). Oracle:
//!   the byte stream yields the payloads of the complete messages, in
//!   order, then at most the part of a message left unfinished (the frame
//!   layer hands a message's bytes on as they arrive, and checks its size
//!   at each frame's header); it ends cleanly after a close and fails when
//!   a message is over the limit.
#![no_main]

use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use libfuzzer_sys::fuzz_target;
use rosetta::config::WebSocketConfig;
use rosetta::server::fuzzing::{websocket_session, WebSocketOutcome};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What the server may write to one peer before writes fail: far above
/// what any input here makes it send (the demo script is ~400 KiB).
const WRITTEN_MAX_BYTES: usize = 4 * 1024 * 1024;
/// The statuses `ws.rs` documents for a refused request.
const REFUSAL_STATUSES: [u16; 6] = [400, 403, 404, 405, 426, 431];
/// RFC 6455, 1.3's sample key: a valid `Sec-WebSocket-Key`.
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// The largest control frame payload (RFC 6455, 5.5).
const CONTROL_PAYLOAD_MAX_BYTES: usize = 125;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime")
    })
}

/// The client side: hands out `input` in reads of at most `chunk` bytes,
/// answers `Pending` (and wakes at once) after every `pending_every` reads
/// (never when 0), and
/// keeps what the server writes.
struct ScriptedPeer {
    input: Vec<u8>,
    pos: usize,
    chunk: usize,
    pending_every: usize,
    reads: usize,
    written: Vec<u8>,
}

impl AsyncRead for ScriptedPeer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.reads += 1;
        if self.pending_every > 0 && self.reads % (self.pending_every + 1) == 0 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = self
            .chunk
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
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.written.len() + data.len() > WRITTEN_MAX_BYTES {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        self.written.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A valid upgrade request for the protocol numbered `which`.
fn upgrade_request(which: u8) -> Vec<u8> {
    let (path, subprotocol) = match which % 4 {
        0 => ("/mqtt", "mqtt"),
        1 => ("/stomp", "v12.stomp"),
        2 => ("/amqp", "amqp"),
        _ => ("/", "v11.stomp, mqtt"),
    };
    format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Protocol: {subprotocol}\r\n\r\n"
    )
    .into_bytes()
}

/// One masked client frame.
fn push_frame(out: &mut Vec<u8>, fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) {
    out.push(if fin { 0x80 } else { 0 } | opcode);
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
}

/// Reads the next `n` bytes of a description, fewer at its end.
fn take<'a>(desc: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, rest) = desc.split_at(n.min(desc.len()));
    *desc = rest;
    head
}

/// What the byte stream must yield for a frame sequence.
struct Expected {
    read: Vec<u8>,
    /// The payload of a message left unfinished (by the end of the input,
    /// a close or the size limit): some of it may have been yielded.
    open: Vec<u8>,
    /// A close frame was sent: the stream must end cleanly.
    closed: bool,
    /// A message went over the limit: reading must fail.
    too_large: bool,
}

/// Turns a description into well-formed frames: per frame one control
/// byte (kind, FIN), one length byte, a mask and the payload. Text
/// payloads are made UTF-8 (each fragment on its own, so the message is).
fn messages(mut desc: &[u8], message_max_bytes: usize) -> (Vec<u8>, Expected) {
    let mut wire = Vec::new();
    let mut expected = Expected {
        read: Vec::new(),
        open: Vec::new(),
        closed: false,
        too_large: false,
    };
    // The data message being sent in fragments: (is text, bytes so far).
    let mut open: Option<(bool, Vec<u8>)> = None;
    while desc.len() >= 6 {
        let control = take(&mut desc, 1)[0];
        let len = usize::from(take(&mut desc, 1)[0]);
        let m = take(&mut desc, 4);
        let mask = [m[0], m[1], m[2], m[3]];
        let fin = control & 0x80 != 0;
        match control % 8 {
            kind @ 0..=3 => {
                let raw = take(&mut desc, len);
                let text = match (&open, kind) {
                    (Some((text, _)), _) => *text,
                    (None, k) => k % 2 == 1,
                };
                let payload = if text {
                    String::from_utf8_lossy(raw).into_owned().into_bytes()
                } else {
                    raw.to_vec()
                };
                let opcode = match open {
                    Some(_) => 0x0,
                    None if text => 0x1,
                    None => 0x2,
                };
                push_frame(&mut wire, fin, opcode, &payload, mask);
                let (_, so_far) = open.get_or_insert_with(|| (text, Vec::new()));
                so_far.extend_from_slice(&payload);
                if so_far.len() > message_max_bytes {
                    expected.too_large = true;
                    expected.open = std::mem::take(so_far);
                    return (wire, expected);
                }
                if fin {
                    if let Some((_, message)) = open.take() {
                        expected.read.extend_from_slice(&message);
                    }
                }
            }
            kind @ 4..=6 => {
                let payload = take(&mut desc, len.min(CONTROL_PAYLOAD_MAX_BYTES));
                let opcode = if kind == 4 { 0x9 } else { 0xA };
                // The message size limit is for data messages: a control
                // frame is at most 125 bytes whatever the limit.
                push_frame(&mut wire, true, opcode, payload, mask);
            }
            _ => {
                // Close: normal closure, then nothing more counts.
                push_frame(&mut wire, true, 0x8, &1000u16.to_be_bytes(), mask);
                expected.closed = true;
                expected.open = open.map(|(_, bytes)| bytes).unwrap_or_default();
                return (wire, expected);
            }
        }
    }
    expected.open = open.map(|(_, bytes)| bytes).unwrap_or_default();
    (wire, expected)
}

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, rest)) = data.split_first() else {
        return;
    };
    let Some((&more, rest)) = rest.split_first() else {
        return;
    };
    let mode = knobs % 3;
    let mut settings = WebSocketConfig::default();
    // A tiny limit, or one well above anything a fuzz input can reach.
    let message_max = if knobs & 0x80 != 0 {
        16 + usize::from(more) * 4
    } else {
        2 * 1024 * 1024
    };
    settings.message_size_max_bytes = Some(message_max);
    let (input, expected) = match mode {
        0 => (rest.to_vec(), None),
        1 => {
            let mut input = upgrade_request(more);
            input.extend_from_slice(rest);
            (input, None)
        }
        _ => {
            let mut input = upgrade_request(more);
            let (frames, expected) = messages(rest, message_max);
            input.extend_from_slice(&frames);
            (input, Some(expected))
        }
    };
    let sent = input.len();
    let mut peer = ScriptedPeer {
        input,
        pos: 0,
        chunk: 1 + usize::from(more >> 2) * 8,
        pending_every: usize::from((knobs >> 2) & 7),
        reads: 0,
        written: Vec::new(),
    };
    let read_chunk = 1 + usize::from(knobs >> 5) * 37;
    let outcome = runtime().block_on(websocket_session(
        &mut peer,
        &settings,
        read_chunk,
        sent + 1,
    ));

    match outcome {
        WebSocketOutcome::Refused(status) => {
            assert!(REFUSAL_STATUSES.contains(&status), "refused with {status}");
            let line = format!("HTTP/1.1 {status} ");
            assert!(
                peer.written.starts_with(line.as_bytes()),
                "answer is not {line}"
            );
            assert!(mode == 0, "a valid upgrade was refused with {status}");
        }
        WebSocketOutcome::Upgraded { read, end, .. } => {
            assert!(peer
                .written
                .starts_with(b"HTTP/1.1 101 Switching Protocols\r\n"));
            assert!(read.len() <= sent, "read more bytes than were sent");
            if let Some(expected) = expected {
                if expected.too_large {
                    assert!(end.is_err(), "an oversized message was accepted");
                }
                if expected.closed {
                    assert!(end.is_ok(), "close then a read error: {end:?}");
                }
                let mut most = expected.read.clone();
                most.extend_from_slice(&expected.open);
                assert!(
                    read.starts_with(&expected.read) && most.starts_with(&read),
                    "the byte stream is not the messages' payloads: read {} bytes, expected {} \
                     and at most {} of an unfinished message",
                    read.len(),
                    expected.read.len(),
                    expected.open.len()
                );
            }
        }
        WebSocketOutcome::Other => {
            assert!(mode == 0, "a valid upgrade was not upgraded");
        }
    }
});
