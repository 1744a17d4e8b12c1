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
        };
        codec::connect(&mut conn.out, c)?;
        match conn.handshake_step("CONNACK").await? {
            Packet::ConnAck { code: 0, .. } => Ok(conn),
            Packet::ConnAck { code, .. } => Err(ClientError::Refused(code)),
            other => Err(ClientError::Protocol(format!(
                "answered CONNECT with {other:?}"
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
                "answered SUBSCRIBE with {other:?}"
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
