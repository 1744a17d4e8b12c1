//! The byte stream under STOMP and AMQP: TCP, TLS over TCP, or a WebSocket
//! (over either) on the broker's path for the protocol.

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::url::{Protocol, Transport};
use super::Target;

/// A connected stream of either kind.
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> Io for T {}

/// Bytes in flight between the protocol client and the WebSocket pump, each
/// way: a few frames; the client waits when it is full.
const WS_PIPE_BYTES: usize = 64 * 1024;

/// Connects to the target's host and port, with TLS if its URL asks, and
/// upgrades to a WebSocket for `ws://` and `wss://`.
pub(super) async fn open(target: &Target) -> anyhow::Result<Box<dyn Io>> {
    let e = &target.endpoint;
    let tcp = TcpStream::connect((e.host.as_str(), e.port))
        .await
        .context("TCP connect")?;
    // Small frames (a receipt, an ACK) go out at once.
    tcp.set_nodelay(true)?;
    let io: Box<dyn Io> = match &target.tls {
        Some(config) => Box::new(super::tls::connect(config.clone(), &e.host, tcp).await?),
        None => Box::new(tcp),
    };
    match e.transport {
        Transport::WebSocket { secure } => websocket(io, target, secure).await,
        Transport::Tcp | Transport::Tls => Ok(io),
    }
}

/// The subprotocol offered for each protocol: STOMP 1.2's and AMQP's
/// registered names (the broker also routes by the path).
fn subprotocol(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Mqtt => "mqtt",
        Protocol::Stomp => "v12.stomp",
        Protocol::Amqp => "amqp",
    }
}

/// Upgrades `io` to a WebSocket on the protocol's path and gives back a
/// byte stream over it: the protocol clients here read and write bytes,
/// and a pump task carries them in binary messages each way.
async fn websocket(io: Box<dyn Io>, target: &Target, secure: bool) -> anyhow::Result<Box<dyn Io>> {
    let e = &target.endpoint;
    let scheme = if secure { "wss" } else { "ws" };
    let host = if e.host.contains(':') {
        format!("[{}]", e.host)
    } else {
        e.host.clone()
    };
    let offered = subprotocol(e.protocol);
    let mut request = format!("{scheme}://{host}:{}{}", e.port, e.ws_path())
        .into_client_request()
        .context("the WebSocket request")?;
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", offered.parse()?);
    let (ws, response) = tokio_tungstenite::client_async(request, io)
        .await
        .context("WebSocket upgrade")?;
    let echoed = response
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok());
    if echoed.is_some_and(|p| !p.eq_ignore_ascii_case(offered)) {
        bail!("the broker chose the WebSocket subprotocol {echoed:?}, not {offered}");
    }
    let (ours, theirs) = tokio::io::duplex(WS_PIPE_BYTES);
    tokio::spawn(pump(ws, theirs));
    Ok(Box::new(ours))
}

/// Carries bytes between the client's end of the pipe and WebSocket
/// messages until either side ends; then closes the other.
async fn pump(ws: WebSocketStream<Box<dyn Io>>, pipe: DuplexStream) {
    let (mut sink, mut stream) = ws.split();
    let (mut from_client, mut to_client) = tokio::io::split(pipe);
    let outgoing = async {
        let mut buf = vec![0u8; WS_PIPE_BYTES];
        loop {
            match from_client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data = buf.get(..n).unwrap_or_default().to_vec();
                    if sink.send(Message::binary(data)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = sink.close().await;
    };
    let incoming = async {
        while let Some(Ok(message)) = stream.next().await {
            let data = match message {
                Message::Binary(b) => b.to_vec(),
                Message::Text(t) => t.as_bytes().to_vec(),
                Message::Close(_) => break,
                // Pings are answered by tungstenite as reading goes on.
                _ => continue,
            };
            if to_client.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = to_client.shutdown().await;
    };
    // Either way ends the connection for the client: its reads see the end.
    tokio::select! {
        () = outgoing => {}
        () = incoming => {}
    }
}
