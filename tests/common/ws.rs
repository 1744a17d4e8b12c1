//! A client's protocol bytes over a transport: a `tokio::io::duplex`
//! stream the client reads and writes, carried by a pump task as they are
//! (`Wire::Raw`) or inside WebSocket messages (`Wire::Ws`), so one protocol
//! exchange runs over every transport.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// Any byte stream a test client speaks on (a socket, a TLS stream, the
/// duplex end of [`carry`]).
pub trait ClientIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> ClientIo for T {}

/// A client's stream, whatever carries it.
pub type BoxedIo = Box<dyn ClientIo>;

/// How the bytes of a protocol reach the broker.
#[derive(Clone, Copy, Debug)]
pub enum Wire {
    /// The protocol's own bytes on the (TLS) connection.
    Raw,
    /// Inside WebSocket messages: binary, or text (STOMP only).
    Ws {
        path: &'static str,
        subprotocol: &'static str,
        text: bool,
    },
}

/// The stream a client speaks its protocol on, carried over `io` as
/// `wire` says.
pub async fn carry<S>(io: S, wire: Wire) -> DuplexStream
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client, mut ours) = tokio::io::duplex(1 << 20);
    match wire {
        Wire::Raw => {
            tokio::spawn(async move {
                let mut io = io;
                let _ = tokio::io::copy_bidirectional(&mut ours, &mut io).await;
            });
        }
        Wire::Ws {
            path,
            subprotocol,
            text,
        } => {
            let mut request = format!("ws://localhost{path}")
                .into_client_request()
                .expect("request");
            request.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                subprotocol.parse().expect("header value"),
            );
            let (ws, response) = tokio_tungstenite::client_async(request, io)
                .await
                .expect("WebSocket handshake");
            // Browsers drop a connection whose subprotocol is not echoed.
            assert_eq!(
                response
                    .headers()
                    .get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok()),
                Some(subprotocol)
            );
            tokio::spawn(pump(ws, ours, text));
        }
    }
    client
}

/// Carries bytes between the client's duplex stream and WebSocket messages.
/// A reply in the other frame type than the client's ends the stream, so
/// the client's next read fails the test.
pub async fn pump<S>(ws: tokio_tungstenite::WebSocketStream<S>, duplex: DuplexStream, text: bool)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(duplex);
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = buf.get(..n).unwrap_or_default().to_vec();
            let message = if text {
                // The tests send ASCII, so any split is valid UTF-8.
                Message::text(String::from_utf8(chunk).expect("ASCII"))
            } else {
                Message::binary(chunk)
            };
            if sink.send(message).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    };
    let down = async move {
        while let Some(Ok(message)) = stream.next().await {
            let bytes = match message {
                Message::Text(t) if text => t.as_bytes().to_vec(),
                Message::Binary(b) if !text => b.to_vec(),
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
                other => {
                    eprintln!("reply in the wrong frame type: {other:?}");
                    break;
                }
            };
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    };
    tokio::join!(up, down);
}
