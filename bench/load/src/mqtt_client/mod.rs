//! A small MQTT 3.1.1 client for the load tool: one connection, driven by
//! the scenario's own loop.
//!
//! Why not rumqttc: at these rates it costs about a core on this 2-core
//! machine (a channel hop per publish, one write per packet), so the tool,
//! not the broker, set the pace, and the broker got its input in dribbles,
//! paying per-wakeup costs per message. This client batches instead:
//! packets are appended to one buffer and written once per loop turn (a
//! publisher writes up to [`WRITE_BATCH_BYTES`] of PUBLISH packets per
//! write), every complete packet of a read is handled before the next read,
//! and a subscriber's PUBACKs for a read go out in one write.
//!
//! Layout: [`codec`] (packets, bounds-checked), [`inflight`] (the QoS 1
//! window; no IO), and here the [`Connection`]: CONNECT/CONNACK,
//! SUBSCRIBE/SUBACK, a write/read pump with keep-alive, DISCONNECT.

mod codec;
mod inflight;

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;

pub(crate) use codec::{Connect, DecodeError, EncodeError, Packet};
pub(crate) use inflight::{Inflight, InflightError};

use crate::run::Target;

/// Largest packet accepted from the broker (as rumqttc's
/// `set_max_packet_size` in the rumqttc path).
pub(crate) const PACKET_SIZE_MAX: usize = 1 << 20;
/// Free space the read buffer gets before each read.
const READ_BUF_BYTES: usize = 64 * 1024;
/// A publisher stops adding packets to its write buffer past this and
/// writes: one write per loop turn, and never an unbounded buffer.
pub(crate) const WRITE_BATCH_BYTES: usize = 64 * 1024;
/// How long CONNECT, SUBSCRIBE and DISCONNECT may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("decoding: {0}")]
    Decode(#[from] DecodeError),
    #[error("encoding: {0}")]
    Encode(#[from] EncodeError),
    #[error("QoS 1 window: {0}")]
    Inflight(#[from] InflightError),
    #[error("CONNACK refused the connection with return code {0}")]
    Refused(u8),
    #[error("SUBACK granted {granted:#04x} for a subscription at QoS {asked}")]
    NotGranted { asked: u8, granted: u8 },
    #[error("the broker broke the protocol: {0}")]
    Protocol(String),
    #[error("connection closed by the broker")]
    Closed,
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
}

/// One MQTT connection.
#[derive(Debug)]
pub(crate) struct Connection {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    rbuf: BytesMut,
    /// Packets to write; `out[..written]` are written already.
    out: Vec<u8>,
    written: usize,
    last_write: Instant,
    /// Send a PINGREQ after this much silence (half the keep-alive).
    ping_every: Option<Duration>,
    /// Write calls so far: how well packets were batched.
    writes: u64,
}

impl Connection {
    /// Connects (TCP_NODELAY), sends CONNECT and checks the CONNACK.
    pub(crate) async fn open(target: &Target, c: &Connect<'_>) -> Result<Self, ClientError> {
        let (rd, wr) = target.connect().await?.into_split();
        let mut conn = Self {
            rd,
            wr,
            rbuf: BytesMut::with_capacity(READ_BUF_BYTES),
            out: Vec::with_capacity(WRITE_BATCH_BYTES * 2),
            written: 0,
            last_write: Instant::now(),
            ping_every: (c.keep_alive_s > 0)
                .then(|| Duration::from_secs(u64::from(c.keep_alive_s)) / 2),
            writes: 0,
        };
        codec::connect(&mut conn.out, c)?;
        match conn.handshake_step("CONNACK").await? {
            Packet::ConnAck { code: 0, .. } => Ok(conn),
            Packet::ConnAck { code, .. } => Err(ClientError::Refused(code)),
            other => Err(ClientError::Protocol(format!(
                "answered CONNECT with {}",
                other.name()
            ))),
        }
    }

    /// Subscribes to `filter` at `qos` (packet id 1) and checks that the
    /// SUBACK grants exactly that QoS: a downgrade would change what the
    /// scenario measures.
    pub(crate) async fn subscribe(&mut self, filter: &str, qos: u8) -> Result<(), ClientError> {
        codec::subscribe(&mut self.out, 1, filter, qos)?;
        match self.handshake_step("SUBACK").await? {
            Packet::SubAck {
                packet_id: 1,
                codes,
            } => match codes[..] {
                [granted] if granted == qos => Ok(()),
                [granted] => Err(ClientError::NotGranted {
                    asked: qos,
                    granted,
                }),
                _ => Err(ClientError::Protocol(format!(
                    "SUBACK with {} return codes for one filter",
                    codes.len()
                ))),
            },
            other => Err(ClientError::Protocol(format!(
                "answered SUBSCRIBE with {}",
                other.name()
            ))),
        }
    }

    /// Writes what is buffered, then reads until the next packet.
    async fn handshake_step(&mut self, what: &'static str) -> Result<Packet, ClientError> {
        tokio::time::timeout(HANDSHAKE_TIMEOUT, self.flush())
            .await
            .map_err(|_| ClientError::Timeout(what))??;
        loop {
            if let Some(p) = self.next_packet()? {
                return Ok(p);
            }
            let n = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.read())
                .await
                .map_err(|_| ClientError::Timeout(what))??;
            if n == 0 {
                return Err(ClientError::Closed);
            }
        }
    }

    async fn read(&mut self) -> std::io::Result<usize> {
        if self.rbuf.capacity() - self.rbuf.len() < READ_BUF_BYTES / 4 {
            self.rbuf.reserve(READ_BUF_BYTES);
        }
        self.rd.read_buf(&mut self.rbuf).await
    }

    /// The next complete packet already read, if any.
    pub(crate) fn next_packet(&mut self) -> Result<Option<Packet>, ClientError> {
        Ok(codec::decode(&mut self.rbuf, PACKET_SIZE_MAX)?)
    }

    /// Appends a PUBLISH (QoS 1 with `packet_id`, QoS 0 without).
    pub(crate) fn publish(
        &mut self,
        topic: &str,
        packet_id: Option<u16>,
        payload: &[u8],
    ) -> Result<(), ClientError> {
        let qos = u8::from(packet_id.is_some());
        Ok(codec::publish(
            &mut self.out,
            topic,
            qos,
            packet_id,
            payload,
        )?)
    }

    /// Appends a PUBACK.
    pub(crate) fn puback(&mut self, packet_id: u16) {
        codec::puback(&mut self.out, packet_id);
    }

    /// Write calls so far (a flush counts as one).
    pub(crate) fn writes(&self) -> u64 {
        self.writes
    }

    /// Bytes waiting in the write buffer.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.out.len() - self.written
    }

    /// Writes what is buffered and waits for input: returns once bytes were
    /// read, or once the write buffer is empty after writing. Writing comes
    /// first so a steady stream of input cannot starve our PUBACKs. Sends a
    /// PINGREQ when the keep-alive is half gone with nothing written.
    /// Cancel-safe: progress is recorded after each completed read or
    /// write.
    pub(crate) async fn pump(&mut self) -> Result<(), ClientError> {
        loop {
            let ping_at = self.ping_every.map(|p| self.last_write + p);
            // Checked here too, not only in the select: with input always
            // ready the timer branch would never win.
            if self.written == self.out.len() && ping_at.is_some_and(|t| t <= Instant::now()) {
                codec::pingreq(&mut self.out);
            }
            if self.rbuf.capacity() - self.rbuf.len() < READ_BUF_BYTES / 4 {
                self.rbuf.reserve(READ_BUF_BYTES);
            }
            let pending = self.written < self.out.len();
            tokio::select! {
                biased;
                n = self.wr.write(&self.out[self.written..]), if pending => {
                    self.written += n?;
                    self.writes += 1;
                    self.last_write = Instant::now();
                    if self.written == self.out.len() {
                        self.out.clear();
                        self.written = 0;
                        return Ok(());
                    }
                }
                n = self.rd.read_buf(&mut self.rbuf) => {
                    return match n? {
                        0 => Err(ClientError::Closed),
                        _ => Ok(()),
                    };
                }
                () = sleep_until(ping_at), if !pending => codec::pingreq(&mut self.out),
            }
        }
    }

    /// Writes everything buffered.
    pub(crate) async fn flush(&mut self) -> Result<(), ClientError> {
        if self.written < self.out.len() {
            self.wr.write_all(&self.out[self.written..]).await?;
            self.writes += 1;
            self.last_write = Instant::now();
        }
        self.out.clear();
        self.written = 0;
        Ok(())
    }

    /// Writes what is buffered and a DISCONNECT, then closes the socket.
    pub(crate) async fn disconnect(mut self) -> Result<(), ClientError> {
        codec::disconnect(&mut self.out);
        tokio::time::timeout(HANDSHAKE_TIMEOUT, self.flush())
            .await
            .map_err(|_| ClientError::Timeout("DISCONNECT to be written"))??;
        let _ = self.wr.shutdown().await;
        Ok(())
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A fake broker's side of a socket, for tests of the client and of the
/// scenario loops that drive it.
#[cfg(test)]
pub(crate) mod fake {
    use bytes::BytesMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::codec;
    use crate::run::Target;

    pub(crate) const CONNECT: u8 = 1;
    pub(crate) const PUBLISH: u8 = 3;
    pub(crate) const PUBACK: u8 = 4;
    pub(crate) const SUBSCRIBE: u8 = 8;
    pub(crate) const PINGREQ: u8 = 12;
    pub(crate) const DISCONNECT: u8 = 14;

    /// A listener on a free port and a target pointing at it.
    pub(crate) async fn listen() -> (TcpListener, Target) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let target = Target {
            host: "127.0.0.1".into(),
            port,
            name: "fake".into(),
            proc: None,
            stall: std::time::Duration::from_secs(5),
            timeout: std::time::Duration::from_secs(5),
            duration: None,
        };
        (listener, target)
    }

    /// The next packet from the client: its first byte and its body;
    /// `None` once the client hung up.
    pub(crate) async fn read_packet(
        s: &mut TcpStream,
        buf: &mut BytesMut,
    ) -> Option<(u8, BytesMut)> {
        loop {
            if buf.len() > 1 {
                if let Some((len, n)) = codec::get_remaining(&buf[1..]).expect("valid length") {
                    if buf.len() >= 1 + n + len {
                        let mut p = buf.split_to(1 + n + len);
                        let first = p[0];
                        let _ = p.split_to(1 + n);
                        return Some((first, p));
                    }
                }
            }
            if s.read_buf(buf).await.expect("read") == 0 {
                return None;
            }
        }
    }

    /// Accepts one client and answers its CONNECT with `connack_code`;
    /// returns the CONNECT's body too.
    pub(crate) async fn accept(
        listener: &TcpListener,
        connack_code: u8,
    ) -> (TcpStream, BytesMut, BytesMut) {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut buf = BytesMut::new();
        let (first, connect) = read_packet(&mut s, &mut buf).await.expect("CONNECT");
        assert_eq!(first >> 4, CONNECT);
        s.write_all(&[0x20, 2, 0, connack_code])
            .await
            .expect("CONNACK");
        (s, buf, connect)
    }

    /// Reads a SUBSCRIBE and grants `granted`.
    pub(crate) async fn grant(s: &mut TcpStream, buf: &mut BytesMut, granted: u8) {
        let (first, body) = read_packet(s, buf).await.expect("SUBSCRIBE");
        assert_eq!(first, SUBSCRIBE << 4 | 0x02);
        s.write_all(&[0x90, 3, body[0], body[1], granted])
            .await
            .expect("SUBACK");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(keep_alive_s: u16) -> Connect<'static> {
        Connect {
            client_id: "test",
            clean_session: true,
            keep_alive_s,
            username: None,
            password: None,
        }
    }

    /// Idle in `pump` with a 1 s keep-alive, the client pings every half
    /// second, and the broker's PINGRESPs are read as such.
    #[tokio::test]
    async fn keep_alive_is_honoured_with_pings() {
        let (listener, target) = fake::listen().await;
        let broker = tokio::spawn(async move {
            let (mut s, mut buf, connect) = fake::accept(&listener, 0).await;
            // Keep-alive is the two bytes after "MQTT", level and flags.
            assert_eq!(&connect[8..10], &[0, 1], "keep-alive 1 s");
            let mut pings = 0;
            let end = Instant::now() + Duration::from_millis(1300);
            while let Ok(Some((first, _))) =
                tokio::time::timeout_at(end, fake::read_packet(&mut s, &mut buf)).await
            {
                assert_eq!(first >> 4, fake::PINGREQ);
                pings += 1;
                s.write_all(&[0xd0, 0]).await.expect("PINGRESP");
            }
            pings
        });
        let mut c = Connection::open(&target, &options(1)).await.expect("open");
        let mut pongs = 0;
        // Until the fake broker hangs up after 1.3 s.
        let ended = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                if let Err(e) = c.pump().await {
                    return e;
                }
                while let Some(p) = c.next_packet().expect("valid") {
                    assert_eq!(p, Packet::PingResp);
                    pongs += 1;
                }
            }
        })
        .await;
        assert!(matches!(ended, Ok(ClientError::Closed)), "{ended:?}");
        let pings = broker.await.expect("fake broker");
        // At 0.5 s and 1.0 s; silence would be 0.
        assert!((1..=3).contains(&pings), "{pings} pings in 1.3 s");
        assert_eq!(pongs, pings);
    }

    #[tokio::test]
    async fn refused_connect_and_downgraded_subscription_are_errors() {
        let (listener, target) = fake::listen().await;
        let broker = tokio::spawn(async move {
            let _refused = fake::accept(&listener, 5).await;
            let (mut s, mut buf, _) = fake::accept(&listener, 0).await;
            fake::grant(&mut s, &mut buf, 0).await;
            let (mut s, mut buf, _) = fake::accept(&listener, 0).await;
            fake::grant(&mut s, &mut buf, 0x80).await;
        });
        let r = Connection::open(&target, &options(0)).await;
        assert!(matches!(r, Err(ClientError::Refused(5))), "{r:?}");
        let mut c = Connection::open(&target, &options(0)).await.expect("open");
        let r = c.subscribe("t", 1).await;
        assert!(
            matches!(
                r,
                Err(ClientError::NotGranted {
                    asked: 1,
                    granted: 0
                })
            ),
            "{r:?}"
        );
        let mut c = Connection::open(&target, &options(0)).await.expect("open");
        let r = c.subscribe("t", 1).await;
        assert!(
            matches!(r, Err(ClientError::NotGranted { granted: 0x80, .. })),
            "{r:?}"
        );
        broker.await.expect("fake broker");
    }
}
