//! Entry point for the cargo-fuzz target `fuzz/fuzz_targets/websocket.rs`;
//! not an API (hidden from the docs, kept to what the target needs).
//!
//! [`websocket_session`] is what a peer's bytes reach on the HTTP port:
//! the request head parser and router of [`super::ws`], the answer or the
//! upgrade, then the frame layer (`ws_frames`) read through the same
//! [`super::ws::WsByteStream`] the protocol adapters read, and one write
//! and close back. The target supplies the peer as an in-memory stream.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use rosetta_config::WebSocketConfig;

use super::ws::{self, NotWebSocket};

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
