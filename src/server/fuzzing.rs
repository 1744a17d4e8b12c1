//! Entry point for the cargo-fuzz target `fuzz/fuzz_targets/websocket.rs`;
//! not an API (hidden from the docs, kept to what the target needs).
//!
//! [`websocket_session`] is what a peer's bytes reach on the HTTP port:
//! the request head parser and router of [`super::ws`], the answer or the
//! upgrade, then the frame layer (`ws_frames`) read through the same
//! [`super::ws::WsByteStream`] the protocol adapters read, and one write
//! and close back. The target supplies the peer as an in-memory stream.
//!
//! [`websocket_frames`] and [`websocket_writes`] are the frame layer alone
//! (no handshake), for `fuzz/fuzz_targets/websocket_frames.rs`, which
//! checks it against tungstenite's frame parser and reader.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use rosetta_config::WebSocketConfig;

use super::ws::{self, NotWebSocket, WsByteStream, WsWire};

/// What the HTTP port made of a peer's bytes.
#[derive(Debug)]
pub enum WebSocketOutcome {
    /// The request upgraded to a WebSocket of `protocol`: `read` is every
    /// byte the byte stream yielded, `end` how reading stopped (Ok at EOF).
    Upgraded {
        /// `MQTT`, `STOMP` or `AMQP`.
        protocol: &'static str,
        /// The concatenated payloads of the data messages.
        read: Vec<u8>,
        /// Ok(()) at a clean end of stream, else the read error.
        end: io::Result<()>,
    },
    /// Refused with an HTTP status (400, 403, 404, 405, 426 or 431).
    Refused(u16),
    /// Served a file, or the peer closed, timed out or failed before a
    /// whole request head.
    Other,
}

/// Plays one connection of the HTTP port over `io`: handshake, then reads
/// of at most `read_chunk_bytes` (at least 1) until the stream ends or
/// `read_max_bytes` were read, then writes those bytes back (as the
/// adapters' answers would go) and shuts the stream down.
pub async fn websocket_session<S>(
    io: S,
    settings: &WebSocketConfig,
    read_chunk_bytes: usize,
    read_max_bytes: usize,
) -> WebSocketOutcome
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let metrics = String::new;
    let (wire, mut stream) =
        match ws::accept_serving(io, settings, ws::message_max_alone(settings), &metrics).await {
            Ok(accepted) => accepted,
            Err(NotWebSocket::Refused(refusal)) => {
                return WebSocketOutcome::Refused(refusal.status)
            }
            Err(_) => return WebSocketOutcome::Other,
        };
    let mut read = Vec::new();
    let mut chunk = vec![0u8; read_chunk_bytes.max(1)];
    let end = loop {
        if read.len() >= read_max_bytes {
            break Ok(());
        }
        match stream.read(&mut chunk).await {
            Ok(0) => break Ok(()),
            Ok(n) => read.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(e) => break Err(e),
        }
    };
    // Errors here only mean the peer is gone; the outcome is the read side.
    if stream.write_all(&read).await.is_ok() {
        let _ = stream.flush().await;
    }
    let _ = stream.shutdown().await;
    WebSocketOutcome::Upgraded {
        protocol: wire.name(),
        read,
        end,
    }
}

/// The protocol a WebSocket carries, as far as the frame layer cares:
/// STOMP answers in text messages while the client sends text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramesWire {
    /// MQTT: binary messages.
    Mqtt,
    /// STOMP: text or binary, as described on the frame layer.
    Stomp,
    /// AMQP: binary messages.
    Amqp,
}

impl From<FramesWire> for WsWire {
    fn from(wire: FramesWire) -> Self {
        match wire {
            FramesWire::Mqtt => WsWire::Mqtt,
            FramesWire::Stomp => WsWire::Stomp,
            FramesWire::Amqp => WsWire::Amqp,
        }
    }
}

/// The frame layer reading a client's frames from `io` after an upgrade
/// (`tail`: frame bytes that came with the request), with incoming
/// messages limited to `message_max` bytes, in reads of at most
/// `read_chunk_bytes` (at least 1) until the stream ends or fails. Returns
/// every byte read and how reading ended (Ok at a clean end). Nothing is
/// written but what the frame layer sends itself (pongs, a close).
pub async fn websocket_frames<S>(
    io: S,
    wire: FramesWire,
    tail: Vec<u8>,
    message_max: usize,
    read_chunk_bytes: usize,
) -> (Vec<u8>, io::Result<()>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut stream = WsByteStream::new(io, tail, wire.into(), message_max);
    let mut read = Vec::new();
    let mut chunk = vec![0u8; read_chunk_bytes.max(1)];
    let end = loop {
        match stream.read(&mut chunk).await {
            Ok(0) => break Ok(()),
            Ok(n) => read.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(e) => break Err(e),
        }
    };
    (read, end)
}

/// The frame layer writing to a client: each of `writes` is written
/// whole, followed by a flush when its flag says so; then the stream is
/// shut down (a normal close).
pub async fn websocket_writes<S>(
    io: S,
    wire: FramesWire,
    writes: &[(&[u8], bool)],
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut stream = WsByteStream::new(io, Vec::new(), wire.into(), 0);
    for &(bytes, flush) in writes {
        stream.write_all(bytes).await?;
        if flush {
            stream.flush().await?;
        }
    }
    stream.shutdown().await
}
