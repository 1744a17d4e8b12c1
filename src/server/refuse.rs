//! Refusals in the protocol's own words: a connection turned away at accept
//! (see [`super::admission`]) is told why before it is closed, wherever
//! its protocol has a way to say so.
//!
//! | listener            | the client gets                                              |
//! | ------------------- | ------------------------------------------------------------ |
//! | `mqtt`              | CONNACK: 3.1.1 return code 3 (server unavailable); 5.0 reason 0x89 (server busy), or 0x9F (connection rate exceeded) for the per-address cap, with a Reason String |
//! | `stomp`             | an ERROR frame whose `message` says why                      |
//! | `amqp`              | open, then close with `amqp:resource-limit-exceeded`; a SASL client gets sasl-outcome `sys-temp` (temporary system error) |
//! | `websocket`, `metrics` | HTTP 503 Service Unavailable with `Retry-After`           |
//! | `any`               | as detected from the first bytes; TLS clients are closed     |
//! | TLS listeners       | closed: a TLS handshake is the very cost being shed          |
//!
//! MQTT's answer depends on the version in CONNECT and AMQP's on the
//! protocol header, so each refusal first reads the client's first bytes.
//! Everything is bounded: at most [`REFUSALS_IN_FLIGHT_MAX`] refusals run
//! at once (beyond, a socket is closed at once), each within
//! [`REFUSAL_TIMEOUT`], reading at most [`FIRST_BYTES_MAX`] bytes before
//! answering.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fe2o3_amqp_types::definitions::{AmqpError as Condition, Error as WireError};
use fe2o3_amqp_types::performatives::{ChannelMax, Close, MaxFrameSize, Open};
use fe2o3_amqp_types::primitives::{Array, Symbol};
use fe2o3_amqp_types::sasl::{SaslCode, SaslMechanisms, SaslOutcome};
use rosetta_amqp::frame::{
    begin_frame, finish_frame, protocol_header, FRAME_TYPE_AMQP, FRAME_TYPE_SASL,
    MIN_MAX_FRAME_SIZE, PROTOCOL_HEADER_LEN, PROTOCOL_ID_AMQP, PROTOCOL_ID_SASL,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use rosetta_config::ListenerKind;

use super::admission::Refused;
use super::detect::{self, Detected};

/// Refusals answered at the same time at most: each is a small task that
/// lives for [`REFUSAL_TIMEOUT`] at worst, so a flood of connections costs
/// a bounded amount of memory and the rest are closed without a word.
pub(crate) const REFUSALS_IN_FLIGHT_MAX: usize = 64;
/// How long one refusal may take (reading the first bytes, answering):
/// clients send those bytes at once; a silent one is not worth waiting for.
pub(crate) const REFUSAL_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes read before answering, at most: MQTT's version is within the
/// first 14, AMQP's sasl-init frame within the 512 every peer must accept.
pub(crate) const FIRST_BYTES_MAX: usize = MIN_MAX_FRAME_SIZE as usize;
/// How long the client gets to read the answer and close first. Closing
/// a socket with unread input resets it, and a reset can make the client's
/// system discard the answer before the client read it.
const LINGER: Duration = Duration::from_millis(500);
/// Seconds a refused HTTP client is told to wait (`Retry-After`).
const HTTP_RETRY_AFTER_S: u32 = 1;
/// Our container id in the Open of a refused AMQP connection.
const AMQP_CONTAINER_ID: &str = "rosetta";
/// Every mechanism the broker offers, so that any SASL client goes on to
/// sasl-init and learns the outcome.
const SASL_MECHANISMS: [&str; 4] = ["SCRAM-SHA-256", "PLAIN", "ANONYMOUS", "EXTERNAL"];

/// The count of refusals in flight.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    in_flight: AtomicUsize,
}

/// One refusal's place in [`Refusals`]; given back on drop.
struct RefusalSlot(Arc<Refusals>);

impl Drop for RefusalSlot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Refusals {
    fn slot(self: &Arc<Self>) -> Option<RefusalSlot> {
        let taken = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let slot = RefusalSlot(Arc::clone(self));
        (taken < REFUSALS_IN_FLIGHT_MAX).then_some(slot)
    }
}

/// Answers `stream` with the refusal of its listener's protocol, in a task
/// of its own, then closes it; or closes it at once when
/// [`REFUSALS_IN_FLIGHT_MAX`] refusals are running.
pub(crate) fn spawn(kind: ListenerKind, stream: TcpStream, why: Refused, refusals: &Arc<Refusals>) {
    let Some(slot) = refusals.slot() else {
        return; // dropping the stream closes it
    };
    tokio::spawn(async move {
        let _slot = slot;
        let mut stream = stream;
        let answered = tokio::time::timeout(REFUSAL_TIMEOUT, answer(kind, &mut stream, why)).await;
        if let Ok(Ok(true)) = answered {
            linger(&mut stream).await;
        }
    });
}

/// Writes the refusal; `Ok(true)` when something was written.
async fn answer(kind: ListenerKind, stream: &mut TcpStream, why: Refused) -> io::Result<bool> {
    let wire = match kind {
        ListenerKind::Mqtt => Detected::Mqtt,
        ListenerKind::Stomp => Detected::Stomp,
        ListenerKind::Amqp => Detected::Amqp,
        ListenerKind::WebSocket | ListenerKind::Metrics => Detected::Http,
        ListenerKind::Any => match detect::detect(stream, REFUSAL_TIMEOUT).await {
            Ok(detected) => detected,
            Err(_) => return Ok(false),
        },
        ListenerKind::Mqtts | ListenerKind::Stomps | ListenerKind::Amqps | ListenerKind::Wss => {
            return Ok(false)
        }
    };
    match wire {
        Detected::Mqtt => mqtt(stream, why).await,
        Detected::Stomp => stomp(stream, why).await,
        Detected::Amqp => amqp(stream, why).await,
        Detected::Http => http(stream, why).await,
        Detected::Tls => Ok(false),
    }
}

/// What the client is told, in words.
fn explanation(why: Refused) -> &'static str {
    match why {
        Refused::Full(_) => {
            "server busy: the broker has as many clients as it takes; try again later"
        }
        Refused::TooManyConnecting(_) => {
            "server busy: too many connections are logging in; try again later"
        }
        Refused::TooManyFromAddress(_) => {
            "too many connections from your address are logging in; try again later"
        }
    }
}

/// Reads what has arrived (at least one byte, at most [`FIRST_BYTES_MAX`]
/// in all) onto `buf`; false at end of stream or when `buf` is full.
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<bool> {
    let room = FIRST_BYTES_MAX.saturating_sub(buf.len());
    if room == 0 {
        return Ok(false);
    }
    let mut chunk = [0u8; FIRST_BYTES_MAX];
    let n = stream
        .read(chunk.get_mut(..room).unwrap_or_default())
        .await?;
    buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    Ok(n > 0)
}

/// MQTT's protocol level, read from the start of a CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MqttLevel {
    /// 3 (MQTT 3.1), 4 (3.1.1), 5 (5.0), or another number.
    Known(u8),
    NeedMore,
    NotConnect,
}

/// The protocol level of the CONNECT that `prefix` begins: fixed header
/// (type 1, flags 0), remaining length (1-4 bytes), protocol name
/// (`MQTT`, or `MQIsdp` for 3.1) and the level byte (MQTT 5.0, 3.1.2).
fn mqtt_level(prefix: &[u8]) -> MqttLevel {
    /// Bytes of the remaining-length field at most.
    const LENGTH_BYTES_MAX: usize = 4;
    match prefix.first() {
        None => return MqttLevel::NeedMore,
        Some(0x10) => {}
        Some(_) => return MqttLevel::NotConnect,
    }
    let mut at = 1;
    loop {
        let Some(&b) = prefix.get(at) else {
            return MqttLevel::NeedMore;
        };
        at += 1;
        if b & 0x80 == 0 {
            break;
        }
        if at > LENGTH_BYTES_MAX {
            return MqttLevel::NotConnect;
        }
    }
    let (Some(&hi), Some(&lo)) = (prefix.get(at), prefix.get(at + 1)) else {
        return MqttLevel::NeedMore;
    };
    let name_len = usize::from(u16::from_be_bytes([hi, lo]));
    if name_len != 4 && name_len != 6 {
        return MqttLevel::NotConnect;
    }
    match prefix.get(at + 2 + name_len) {
        Some(&level) => MqttLevel::Known(level),
        None => MqttLevel::NeedMore,
    }
}

async fn mqtt(stream: &mut TcpStream, why: Refused) -> io::Result<bool> {
    use rosetta_mqtt::codec::encode::{connack_v4, connack_v5};
    /// 3.1.1 return code 3: "Server unavailable".
    const V4_SERVER_UNAVAILABLE: u8 = 3;
    const V5_SERVER_BUSY: u8 = 0x89;
    const V5_CONNECTION_RATE_EXCEEDED: u8 = 0x9F;
    let mut first = Vec::new();
    let level = loop {
        match mqtt_level(&first) {
            MqttLevel::Known(level) => break level,
            MqttLevel::NotConnect => return Ok(false),
            MqttLevel::NeedMore => {
                if !read_more(stream, &mut first).await? {
                    return Ok(false);
                }
            }
        }
    };
    let mut out = BytesMut::new();
    match level {
        5 => {
            let code = match why {
                Refused::TooManyFromAddress(_) => V5_CONNECTION_RATE_EXCEEDED,
                Refused::Full(_) | Refused::TooManyConnecting(_) => V5_SERVER_BUSY,
            };
            let mut props = mqttbytes::v5::ConnAckProperties::new();
            props.reason_string = Some(explanation(why).to_owned());
            connack_v5(false, code, props, None, &mut out)
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        3 | 4 => connack_v4(false, V4_SERVER_UNAVAILABLE, &mut out),
        _ => return Ok(false),
    }
    stream.write_all(&out).await?;
    Ok(true)
}

async fn stomp(stream: &mut TcpStream, why: Refused) -> io::Result<bool> {
    use rosetta_stomp::{Command, FrameWriter, Version};
    // The CONNECT first, so the answer comes where the client expects it.
    let mut first = Vec::new();
    if !read_more(stream, &mut first).await? {
        return Ok(false);
    }
    let mut out = Vec::new();
    FrameWriter::new(&mut out, Version::V1_2, Command::Error)
        .header("message", explanation(why))
        .header("content-type", "text/plain")
        .finish(explanation(why).as_bytes());
    stream.write_all(&out).await?;
    Ok(true)
}

/// Appends one AMQP or SASL frame holding `body` on channel 0.
fn amqp_frame<T: serde::Serialize>(out: &mut Vec<u8>, frame_type: u8, body: &T) -> io::Result<()> {
    let start = begin_frame(out, frame_type, 0);
    let mut ser = serde_amqp::ser::Serializer::new(&mut *out);
    body.serialize(&mut ser)
        .map_err(|e| io::Error::other(e.to_string()))?;
    finish_frame(out, start);
    Ok(())
}

async fn amqp(stream: &mut TcpStream, why: Refused) -> io::Result<bool> {
    let mut header = [0u8; PROTOCOL_HEADER_LEN];
    stream.read_exact(&mut header).await?;
    let mut out = Vec::new();
    if header == protocol_header(PROTOCOL_ID_SASL) {
        // SASL comes before AMQP: the refusal is its outcome.
        out.extend_from_slice(&header);
        let mechanisms = SaslMechanisms {
            sasl_server_mechanisms: Array(SASL_MECHANISMS.into_iter().map(Symbol::from).collect()),
        };
        amqp_frame(&mut out, FRAME_TYPE_SASL, &mechanisms)?;
        stream.write_all(&out).await?;
        if !read_sasl_init(stream).await? {
            return Ok(true);
        }
        out.clear();
        let outcome = SaslOutcome {
            code: SaslCode::SysTemp,
            additional_data: None,
        };
        amqp_frame(&mut out, FRAME_TYPE_SASL, &outcome)?;
    } else if header == protocol_header(PROTOCOL_ID_AMQP) {
        // An error before Open: Open, then Close (AMQP 1.0, 2.4.3).
        out.extend_from_slice(&header);
        let open = Open {
            container_id: AMQP_CONTAINER_ID.to_owned(),
            hostname: None,
            max_frame_size: MaxFrameSize(MIN_MAX_FRAME_SIZE),
            channel_max: ChannelMax(0),
            idle_time_out: None,
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        amqp_frame(&mut out, FRAME_TYPE_AMQP, &open)?;
        let close = Close {
            error: Some(WireError {
                condition: Condition::ResourceLimitExceeded.into(),
                description: Some(explanation(why).to_owned()),
                info: None,
            }),
        };
        amqp_frame(&mut out, FRAME_TYPE_AMQP, &close)?;
    } else {
        // Not AMQP 1.0: the header we speak, then close (AMQP 1.0, 2.2).
        out.extend_from_slice(&protocol_header(PROTOCOL_ID_AMQP));
    }
    stream.write_all(&out).await?;
    Ok(true)
}

/// Waits for the client's first SASL frame (sasl-init) to arrive whole;
/// false when it does not (closed, or larger than the spec lets it be).
async fn read_sasl_init(stream: &mut TcpStream) -> io::Result<bool> {
    let mut buf = Vec::new();
    loop {
        if let Some(size) = buf.get(..4) {
            let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]);
            if size > MIN_MAX_FRAME_SIZE {
                return Ok(false);
            }
            if buf.len() >= size as usize {
                return Ok(true);
            }
        }
        if !read_more(stream, &mut buf).await? {
            return Ok(false);
        }
    }
}

async fn http(stream: &mut TcpStream, why: Refused) -> io::Result<bool> {
    // The request (or its start) first, so the answer follows it.
    let mut first = Vec::new();
    if !read_more(stream, &mut first).await? {
        return Ok(false);
    }
    let mut body = explanation(why).to_owned();
    body.push('\n');
    let extra = format!(
        "Content-Length: {}\r\nRetry-After: {HTTP_RETRY_AFTER_S}\r\n",
        body.len()
    );
    super::ws::respond(
        stream,
        503,
        "text/plain; charset=utf-8",
        &extra,
        body.as_bytes(),
    )
    .await?;
    Ok(true)
}

/// Ends our side, then reads and discards until the client closes (or
/// [`LINGER`] passes), so the answer is not lost to a reset.
async fn linger(stream: &mut TcpStream) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_level_is_read_from_a_connect_byte_by_byte() {
        let v5: &[u8] = b"\x10\x10\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00\x01a";
        let v31: &[u8] = b"\x10\x12\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x01a";
        let long_length: &[u8] = b"\x10\x80\x81\x01\x00\x04MQTT\x04";
        for (bytes, level) in [(v5, 5), (v31, 3), (long_length, 4)] {
            let known_at = (0..=bytes.len())
                .find(|n| mqtt_level(&bytes[..*n]) != MqttLevel::NeedMore)
                .expect("decided");
            assert_eq!(mqtt_level(&bytes[..known_at]), MqttLevel::Known(level));
        }
        for not in [
            &b"\x20\x02"[..],
            b"\x10\x02\x00\x05",
            b"\x10\xff\xff\xff\xff",
        ] {
            assert_eq!(mqtt_level(not), MqttLevel::NotConnect, "{not:?}");
        }
    }

    #[test]
    fn refusals_in_flight_are_capped() {
        let refusals = Arc::new(Refusals::default());
        let held: Vec<_> = (0..REFUSALS_IN_FLIGHT_MAX)
            .map(|_| refusals.slot().expect("slot"))
            .collect();
        assert!(refusals.slot().is_none());
        drop(held);
        assert!(refusals.slot().is_some());
    }
}
