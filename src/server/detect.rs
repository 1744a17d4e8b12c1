//! Protocol detection for the optional `any` port: one listener that serves
//! MQTT, STOMP, AMQP, TLS and HTTP (WebSocket and the demo page), told
//! apart by the first bytes the client sends.
//!
//! Every protocol here has the client speak first, and each one's first
//! bytes are distinct (see [`SIGNATURES`]), so at most
//! [`PREFIX_MAX_BYTES`] bytes decide. On a plain TCP socket [`detect`]
//! peeks, so the bytes stay in the socket for the protocol's own parser;
//! on a stream that cannot peek (TLS) [`detect_read`] reads them and hands
//! back a [`Rewind`] stream that replays them first. A client that sends
//! nothing recognisable, or nothing at all within the timeout, gets an
//! error and the caller closes the connection.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use super::protocols::{run_wire, Peer, Stage, Wire};
use super::Shared;

/// How long a client on the `any` port may take to send its first bytes:
/// every protocol here has the client speak first, at once.
pub(crate) const DETECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes needed to decide at most: the longest entry of [`SIGNATURES`].
pub(crate) const PREFIX_MAX_BYTES: usize = 8;

/// Pause between two peeks that saw the same incomplete prefix: peek
/// returns at once while any byte is buffered, so without a pause a client
/// that sent half a signature would make the task spin.
const PEEK_RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// What a client on the `any` port speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detected {
    /// MQTT: a CONNECT packet.
    Mqtt,
    /// STOMP: a CONNECT or STOMP frame, or heart-beat EOLs before it.
    Stomp,
    /// AMQP 1.0: the protocol header (plain or SASL).
    Amqp,
    /// A TLS handshake record; the protocol inside is detected again.
    Tls,
    /// An HTTP GET: a WebSocket upgrade or the demo page.
    Http,
}

/// The first bytes of each protocol, and what they mean.
///
/// - MQTT: the fixed header of CONNECT, packet type 1 with flags 0
///   (MQTT 3.1.1 and 5.0, section 3.1.1).
/// - TLS: a handshake record (content type 22) of version 3.x.
/// - AMQP: the protocol header `AMQP` + id + version (AMQP 1.0, 2.2).
/// - HTTP: a GET request line; nothing else is served on this port.
/// - STOMP: the CONNECT or STOMP command, ended by its EOL so an HTTP
///   `CONNECT ` request is not taken for STOMP; or EOLs, which STOMP
///   allows before a frame (STOMP 1.2, "Heart-beating").
const SIGNATURES: &[(&[u8], Detected)] = &[
    (&[0x10], Detected::Mqtt),
    (&[0x16, 0x03], Detected::Tls),
    (b"AMQP", Detected::Amqp),
    (b"GET ", Detected::Http),
    (b"CONNECT\n", Detected::Stomp),
    (b"CONNECT\r", Detected::Stomp),
    (b"STOMP\n", Detected::Stomp),
    (b"STOMP\r", Detected::Stomp),
    (b"\n", Detected::Stomp),
    (b"\r\n", Detected::Stomp),
];

/// The verdict on a prefix of a connection's first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The protocol is known.
    Known(Detected),
    /// The bytes so far begin some signature: wait for more.
    NeedMore,
    /// No protocol starts like this.
    Unknown,
}

/// Classifies the first bytes of a connection (any number of them).
pub(crate) fn classify(prefix: &[u8]) -> Verdict {
    let mut need_more = false;
    for &(signature, detected) in SIGNATURES {
        if prefix.starts_with(signature) {
            return Verdict::Known(detected);
        }
        need_more |= signature.starts_with(prefix);
    }
    if need_more {
        Verdict::NeedMore
    } else {
        Verdict::Unknown
    }
}

/// Why no protocol was detected. The caller logs it and closes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DetectError {
    /// The client sent bytes no protocol starts with.
    #[error("unknown protocol (first bytes {0})")]
    Unknown(Hex),
    /// The client closed before sending enough bytes.
    #[error("closed before the protocol was known")]
    Closed,
    /// The client sent too little within [`DETECT_TIMEOUT`].
    #[error("no protocol detected within {}ms", .0.as_millis())]
    Timeout(Duration),
    /// Reading failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Bytes shown in hex in an error message.
#[derive(Debug)]
pub(crate) struct Hex(Vec<u8>);

impl fmt::Display for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Detects the protocol of a plain TCP connection by peeking at its first
/// bytes, which stay in the socket. Gives up after `timeout`.
pub(crate) async fn detect(stream: &TcpStream, timeout: Duration) -> Result<Detected, DetectError> {
    let peeking = async {
        let mut buf = [0u8; PREFIX_MAX_BYTES];
        let mut seen = 0;
        loop {
            let n = stream.peek(&mut buf).await?;
            let prefix = buf.get(..n).unwrap_or_default();
            match classify(prefix) {
                Verdict::Known(d) => return Ok(d),
                Verdict::Unknown => return Err(DetectError::Unknown(Hex(prefix.to_vec()))),
                Verdict::NeedMore if n == 0 => return Err(DetectError::Closed),
                Verdict::NeedMore => {
                    if n == seen {
                        tokio::time::sleep(PEEK_RETRY_INTERVAL).await;
                    }
                    seen = n;
                }
            }
        }
    };
    tokio::time::timeout(timeout, peeking)
        .await
        .unwrap_or(Err(DetectError::Timeout(timeout)))
}

/// Detects the protocol of any byte stream (e.g. inside TLS) by reading its
/// first bytes; the returned [`Rewind`] replays them before the rest.
pub(crate) async fn detect_read<S>(
    mut io: S,
    timeout: Duration,
) -> Result<(Detected, Rewind<S>), DetectError>
where
    S: AsyncRead + Unpin,
{
    let reading = async {
        let mut prefix = Vec::with_capacity(PREFIX_MAX_BYTES);
        loop {
            match classify(&prefix) {
                Verdict::Known(d) => return Ok((d, prefix)),
                Verdict::Unknown => return Err(DetectError::Unknown(Hex(prefix))),
                Verdict::NeedMore => {
                    let mut buf = [0u8; PREFIX_MAX_BYTES];
                    let want = PREFIX_MAX_BYTES.saturating_sub(prefix.len()).max(1);
                    let n = io.read(buf.get_mut(..want).unwrap_or_default()).await?;
                    if n == 0 {
                        return Err(DetectError::Closed);
                    }
                    prefix.extend_from_slice(buf.get(..n).unwrap_or_default());
                }
            }
        }
    };
    let (detected, prefix) = tokio::time::timeout(timeout, reading)
        .await
        .unwrap_or(Err(DetectError::Timeout(timeout)))?;
    Ok((
        detected,
        Rewind {
            prefix,
            pos: 0,
            inner: io,
        },
    ))
}

/// Serves one connection of the `any` port: detects its protocol (over
/// TLS when the client starts a TLS handshake and `tls` is set; the
/// protocol inside TLS is detected the same way) and returns its stage. A
/// client that cannot be recognised is logged and closed.
pub(crate) async fn serve_any(
    stream: TcpStream,
    mut plain: Peer,
    conn_id: u64,
    shared: Arc<Shared>,
    tls: Option<TlsAcceptor>,
) -> Option<Stage> {
    let peer = plain.addr;
    let detected = match detect(&stream, DETECT_TIMEOUT).await {
        Ok(detected) => detected,
        Err(e) => {
            tracing::debug!(conn = conn_id, %peer, reason = %e, "any port: closing");
            return None;
        }
    };
    tracing::trace!(conn = conn_id, %peer, ?detected, "any port: detected");
    match detected {
        Detected::Mqtt => Some(run_wire(Wire::Mqtt, stream, plain, conn_id, shared)),
        Detected::Stomp => Some(run_wire(Wire::Stomp, stream, plain, conn_id, shared)),
        Detected::Amqp => Some(run_wire(Wire::Amqp, stream, plain, conn_id, shared)),
        Detected::Http => Some(Stage::new(super::ws::serve(stream, plain, conn_id, shared))),
        Detected::Tls => {
            let Some(acceptor) = tls else {
                tracing::debug!(conn = conn_id, %peer, "any port: TLS client, but no [tls] configured; closing");
                return None;
            };
            let timeout = super::tls::handshake_timeout(&shared.config.tls);
            // A failed handshake is logged by `accept`.
            let (stream, certificate_user) =
                super::tls::accept(&acceptor, stream, peer, timeout, &shared.tls_log)
                    .await
                    .ok()?;
            plain.certificate_user = certificate_user;
            plain.tls = true;
            plain.sni_host = super::tls::sni_host(&stream);
            let peer = plain;
            let (inner, stream) = match detect_read(stream, DETECT_TIMEOUT).await {
                Ok(found) => found,
                Err(e) => {
                    tracing::debug!(conn = conn_id, %peer, reason = %e, "any port, inside TLS: closing");
                    return None;
                }
            };
            match inner {
                Detected::Mqtt => Some(run_wire(Wire::Mqtt, stream, peer, conn_id, shared)),
                Detected::Stomp => Some(run_wire(Wire::Stomp, stream, peer, conn_id, shared)),
                Detected::Amqp => Some(run_wire(Wire::Amqp, stream, peer, conn_id, shared)),
                Detected::Http => Some(Stage::new(super::ws::serve(stream, peer, conn_id, shared))),
                Detected::Tls => {
                    tracing::debug!(conn = conn_id, %peer, "any port: TLS inside TLS; closing");
                    None
                }
            }
        }
    }
}

/// A stream whose first bytes were already read: it yields them again
/// before reading on. Writes go straight through.
#[derive(Debug)]
pub(crate) struct Rewind<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Rewind<S> {
    /// `inner`, whose first bytes `prefix` were already read from it.
    pub(crate) fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self {
            prefix,
            pos: 0,
            inner,
        }
    }
}

/// Cannot report readiness: the rewound prefix is readable without it.
impl<S: AsyncRead + AsyncWrite + Unpin + Send> super::driver::Transport for Rewind<S> {}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(rest) = this.prefix.get(this.pos..).filter(|r| !r.is_empty()) {
            let n = rest.len().min(buf.remaining());
            buf.put_slice(rest.get(..n).unwrap_or_default());
            this.pos += n;
            if this.pos == this.prefix.len() {
                this.prefix = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// First bytes as real clients send them.
    const MQTT_CONNECT: &[u8] = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04test";
    const STOMP_CONNECT: &[u8] = b"CONNECT\naccept-version:1.2\nhost:/\n\n\0";
    const STOMP_STOMP_CRLF: &[u8] = b"STOMP\r\naccept-version:1.2\r\n\r\n\0";
    const AMQP_HEADER: &[u8] = b"AMQP\x03\x01\x00\x00";
    const TLS_HELLO: &[u8] = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";
    const HTTP_GET: &[u8] = b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n";

    fn cases() -> Vec<(&'static [u8], Detected)> {
        vec![
            (MQTT_CONNECT, Detected::Mqtt),
            (STOMP_CONNECT, Detected::Stomp),
            (STOMP_STOMP_CRLF, Detected::Stomp),
            (b"\n\nCONNECT\n\n\0", Detected::Stomp),
            (b"\r\nCONNECT\n\n\0", Detected::Stomp),
            (AMQP_HEADER, Detected::Amqp),
            (TLS_HELLO, Detected::Tls),
            (HTTP_GET, Detected::Http),
        ]
    }

    #[test]
    fn each_protocol_is_known_and_needs_at_most_the_max_prefix() {
        for (bytes, expect) in cases() {
            let mut verdicts = Vec::new();
            for len in 0..=bytes.len() {
                verdicts.push(classify(&bytes[..len]));
            }
            // Byte at a time: "need more" until known, then known for good.
            let first_known = verdicts
                .iter()
                .position(|v| matches!(v, Verdict::Known(_)))
                .expect("known at some point");
            assert!(
                first_known <= PREFIX_MAX_BYTES,
                "{expect:?} needs {first_known} bytes"
            );
            assert!(verdicts[..first_known]
                .iter()
                .all(|v| *v == Verdict::NeedMore));
            assert!(verdicts[first_known..]
                .iter()
                .all(|v| *v == Verdict::Known(expect)));
        }
    }

    #[test]
    fn garbage_is_unknown() {
        for garbage in [
            &b"\x00\x00\x00\x00"[..],
            b"\x16\x02",     // SSL 2/old record version
            b"\x20\x02\x00", // MQTT CONNACK: a server packet
            b"POST / HTTP/1.1\r\n",
            b"CONNECT example.com:443 HTTP/1.1\r\n", // HTTP CONNECT, not STOMP
            b"SEND\ndestination:/q\n\n\0",           // STOMP frame before CONNECT
            b"AMQX",
            b"\r\r",
            b"hello",
        ] {
            assert_eq!(classify(garbage), Verdict::Unknown, "{garbage:?}");
        }
        assert!(SIGNATURES.iter().all(|(s, _)| s.len() <= PREFIX_MAX_BYTES));
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (client, server)
    }

    #[tokio::test]
    async fn peek_detects_each_protocol_and_consumes_nothing() {
        for (bytes, expect) in cases() {
            let (mut client, mut server) = pair().await;
            client.write_all(bytes).await.expect("write");
            let detected = detect(&server, Duration::from_secs(5))
                .await
                .expect("detect");
            assert_eq!(detected, expect);
            let mut got = vec![0u8; bytes.len()];
            server.read_exact(&mut got).await.expect("read");
            assert_eq!(got, bytes, "peeking consumed bytes");
        }
    }

    #[tokio::test]
    async fn peek_waits_for_a_split_signature() {
        let (mut client, server) = pair().await;
        client.write_all(b"AM").await.expect("write");
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            client
                .write_all(b"QP\x00\x01\x00\x00")
                .await
                .expect("write");
            client
        });
        let detected = detect(&server, Duration::from_secs(5))
            .await
            .expect("detect");
        assert_eq!(detected, Detected::Amqp);
        drop(writer.await);
    }

    #[tokio::test]
    async fn peek_refuses_garbage_silence_and_early_close() {
        let (mut client, server) = pair().await;
        client.write_all(b"\xde\xad\xbe\xef").await.expect("write");
        let err = detect(&server, Duration::from_secs(5)).await.err();
        assert!(matches!(err, Some(DetectError::Unknown(_))), "{err:?}");
        assert!(err.expect("error").to_string().contains("deadbeef"));

        let (_client, server) = pair().await;
        let err = detect(&server, Duration::from_millis(50)).await.err();
        assert!(matches!(err, Some(DetectError::Timeout(_))), "{err:?}");

        let (mut client, server) = pair().await;
        client.write_all(b"CONN").await.expect("write");
        client.shutdown().await.expect("shutdown");
        // EOF after a partial signature: peek keeps returning the 4 bytes,
        // so this ends by the timeout rather than as "closed"; either way
        // the connection is refused.
        let err = detect(&server, Duration::from_millis(100)).await.err();
        assert!(err.is_some());

        let (client, server) = pair().await;
        drop(client);
        let err = detect(&server, Duration::from_secs(5)).await.err();
        assert!(matches!(err, Some(DetectError::Closed)), "{err:?}");
    }

    #[tokio::test]
    async fn read_detection_replays_the_prefix() {
        for (bytes, expect) in cases() {
            let (mut client, server) = tokio::io::duplex(64);
            // One byte at a time, to exercise the partial reads.
            let writer = tokio::spawn(async move {
                for b in bytes {
                    client.write_all(&[*b]).await.expect("write");
                }
                client
            });
            let (detected, mut rewind) = detect_read(server, Duration::from_secs(5))
                .await
                .expect("detect");
            assert_eq!(detected, expect);
            let _client = writer.await.expect("writer");
            let mut got = vec![0u8; bytes.len()];
            rewind.read_exact(&mut got).await.expect("read");
            assert_eq!(got, bytes);
        }
    }

    #[tokio::test]
    async fn read_detection_refuses_garbage_and_close() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b"\x00garbage").await.expect("write");
        let err = detect_read(server, Duration::from_secs(5)).await.err();
        assert!(matches!(err, Some(DetectError::Unknown(_))), "{err:?}");

        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b"GE").await.expect("write");
        drop(client);
        let err = detect_read(server, Duration::from_secs(5)).await.err();
        assert!(matches!(err, Some(DetectError::Closed)), "{err:?}");
    }
}
