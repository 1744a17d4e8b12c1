//! MQTT 3.1.1 packets (OASIS spec, section 2 and 3): the fixed header with
//! its 1-4 byte remaining length, encoders for what a client sends, and an
//! incremental decoder for what a broker sends, bounds-checked at every
//! step.
//!
//! Ours rather than the broker's (`rosetta_mqtt`): the load tool checks the
//! broker, so it should not share the code it is checking.

use bytes::{Buf, Bytes, BytesMut};

/// Largest value a 4-byte remaining length holds (spec 2.2.3).
pub(crate) const REMAINING_MAX: usize = 268_435_455;

const CONNECT: u8 = 1;
const CONNACK: u8 = 2;
const PUBLISH: u8 = 3;
const PUBACK: u8 = 4;
const SUBSCRIBE: u8 = 8;
const SUBACK: u8 = 9;
const PINGREQ: u8 = 12;
const PINGRESP: u8 = 13;
const DISCONNECT: u8 = 14;

/// Why bytes from the broker are not a packet we accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error("remaining length longer than 4 bytes")]
    RemainingLengthTooLong,
    #[error("packet of {size} bytes exceeds our limit of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("packet type {0} is not one a broker sends a 3.1.1 client at QoS 0/1")]
    UnexpectedType(u8),
    #[error("packet type {kind} with reserved flags {flags:#x}")]
    BadFlags { kind: u8, flags: u8 },
    #[error("packet type {kind} with remaining length {len}, which is invalid for it")]
    BadLength { kind: u8, len: usize },
    #[error("PUBLISH with QoS {0}")]
    BadQos(u8),
    #[error("PUBLISH topic length {topic} exceeds the packet's {len} bytes")]
    TopicOverrun { topic: usize, len: usize },
    #[error("packet id 0 (reserved)")]
    ZeroPacketId,
}

/// Why a packet could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EncodeError {
    #[error("{0} longer than 65,535 bytes")]
    StringTooLong(&'static str),
    #[error("packet of {0} bytes exceeds the 4-byte remaining length")]
    TooLarge(usize),
}

/// A packet from the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Packet {
    ConnAck { session_present: bool, code: u8 },
    Publish(Publish),
    PubAck(u16),
    SubAck { packet_id: u16, codes: Vec<u8> },
    PingResp,
}

impl Packet {
    /// The packet's name, for errors (a PUBLISH's payload may be large).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::ConnAck { .. } => "CONNACK",
            Self::Publish(_) => "PUBLISH",
            Self::PubAck(_) => "PUBACK",
            Self::SubAck { .. } => "SUBACK",
            Self::PingResp => "PINGRESP",
        }
    }
}

/// A PUBLISH from the broker; `topic` and `payload` share the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Publish {
    pub(crate) qos: u8,
    pub(crate) dup: bool,
    pub(crate) retain: bool,
    /// Present at QoS 1.
    pub(crate) packet_id: Option<u16>,
    pub(crate) topic: Bytes,
    pub(crate) payload: Bytes,
}

/// Appends `len` as a remaining length (1-4 bytes, 7 bits each, least
/// significant first).
pub(crate) fn put_remaining(out: &mut Vec<u8>, len: usize) -> Result<(), EncodeError> {
    if len > REMAINING_MAX {
        return Err(EncodeError::TooLarge(len));
    }
    let mut x = len;
    loop {
        // Below 128 after the check, so the cast keeps every bit.
        let mut byte = (x % 128) as u8;
        x /= 128;
        if x > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if x == 0 {
            return Ok(());
        }
    }
}

/// Reads a remaining length from the start of `buf`: `Ok(None)` until
/// complete, else the value and the bytes it took.
pub(crate) fn get_remaining(buf: &[u8]) -> Result<Option<(usize, usize)>, DecodeError> {
    let mut value = 0usize;
    for (i, &b) in buf.iter().take(4).enumerate() {
        value += usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if buf.len() >= 4 {
        return Err(DecodeError::RemainingLengthTooLong);
    }
    Ok(None)
}

fn put_str(out: &mut Vec<u8>, what: &'static str, s: &[u8]) -> Result<(), EncodeError> {
    let len = u16::try_from(s.len()).map_err(|_| EncodeError::StringTooLong(what))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s);
    Ok(())
}

fn str_len(what: &'static str, s: &[u8]) -> Result<usize, EncodeError> {
    u16::try_from(s.len()).map_err(|_| EncodeError::StringTooLong(what))?;
    Ok(2 + s.len())
}

/// What a CONNECT says.
#[derive(Debug, Clone)]
pub(crate) struct Connect<'a> {
    pub(crate) client_id: &'a str,
    pub(crate) clean_session: bool,
    /// Seconds; 0 turns keep-alive off.
    pub(crate) keep_alive_s: u16,
    pub(crate) username: Option<&'a str>,
    pub(crate) password: Option<&'a str>,
}

/// Appends a CONNECT (protocol level 4, no will).
pub(crate) fn connect(out: &mut Vec<u8>, c: &Connect<'_>) -> Result<(), EncodeError> {
    let mut len = 10 + str_len("client id", c.client_id.as_bytes())?;
    let mut flags = 0u8;
    if c.clean_session {
        flags |= 0x02;
    }
    if let Some(u) = c.username {
        flags |= 0x80;
        len += str_len("username", u.as_bytes())?;
    }
    if let Some(p) = c.password {
        flags |= 0x40;
        len += str_len("password", p.as_bytes())?;
    }
    out.push(CONNECT << 4);
    put_remaining(out, len)?;
    put_str(out, "protocol name", b"MQTT")?;
    out.push(4);
    out.push(flags);
    out.extend_from_slice(&c.keep_alive_s.to_be_bytes());
    put_str(out, "client id", c.client_id.as_bytes())?;
    if let Some(u) = c.username {
        put_str(out, "username", u.as_bytes())?;
    }
    if let Some(p) = c.password {
        put_str(out, "password", p.as_bytes())?;
    }
    Ok(())
}

/// Appends a SUBSCRIBE of one topic filter at `qos`.
pub(crate) fn subscribe(
    out: &mut Vec<u8>,
    packet_id: u16,
    filter: &str,
    qos: u8,
) -> Result<(), EncodeError> {
    let len = 2 + str_len("topic filter", filter.as_bytes())? + 1;
    // The reserved flags of SUBSCRIBE are 0b0010 (spec 3.8.1).
    out.push(SUBSCRIBE << 4 | 0x02);
    put_remaining(out, len)?;
    out.extend_from_slice(&packet_id.to_be_bytes());
    put_str(out, "topic filter", filter.as_bytes())?;
    out.push(qos);
    Ok(())
}

/// Appends a PUBLISH (not dup, not retained); `packet_id` must be given
/// exactly when `qos` is 1.
pub(crate) fn publish(
    out: &mut Vec<u8>,
    topic: &str,
    qos: u8,
    packet_id: Option<u16>,
    payload: &[u8],
) -> Result<(), EncodeError> {
    assert_eq!(qos > 0, packet_id.is_some(), "a packet id exactly at QoS>0");
    let len = str_len("topic", topic.as_bytes())? + 2 * usize::from(qos > 0) + payload.len();
    out.push(PUBLISH << 4 | (qos << 1));
    put_remaining(out, len)?;
    put_str(out, "topic", topic.as_bytes())?;
    if let Some(id) = packet_id {
        out.extend_from_slice(&id.to_be_bytes());
    }
    out.extend_from_slice(payload);
    Ok(())
}

/// Appends a PUBACK.
pub(crate) fn puback(out: &mut Vec<u8>, packet_id: u16) {
    let id = packet_id.to_be_bytes();
    out.extend_from_slice(&[PUBACK << 4, 2, id[0], id[1]]);
}

/// Appends a PINGREQ.
pub(crate) fn pingreq(out: &mut Vec<u8>) {
    out.extend_from_slice(&[PINGREQ << 4, 0]);
}

/// Appends a DISCONNECT.
pub(crate) fn disconnect(out: &mut Vec<u8>) {
    out.extend_from_slice(&[DISCONNECT << 4, 0]);
}

fn packet_id(b: &[u8]) -> Result<u16, DecodeError> {
    match u16::from_be_bytes([b[0], b[1]]) {
        0 => Err(DecodeError::ZeroPacketId),
        id => Ok(id),
    }
}

/// Takes one complete packet off the front of `buf`; `Ok(None)` means more
/// bytes are needed. A packet larger than `max` bytes (fixed header
/// included) is refused as soon as its length is known, before its body is
/// buffered.
pub(crate) fn decode(buf: &mut BytesMut, max: usize) -> Result<Option<Packet>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let Some((len, len_bytes)) = get_remaining(&buf[1..])? else {
        return Ok(None);
    };
    let size = 1 + len_bytes + len;
    if size > max {
        return Err(DecodeError::TooLarge { size, max });
    }
    let (kind, flags) = (first >> 4, first & 0x0f);
    // Checked before the body arrives: a wrong header fails at once.
    match kind {
        PUBLISH => {
            let qos = (flags >> 1) & 0x03;
            if qos > 1 {
                return Err(DecodeError::BadQos(qos));
            }
            if len < 2 + 2 * usize::from(qos) {
                return Err(DecodeError::BadLength { kind, len });
            }
        }
        CONNACK | PUBACK | SUBACK | PINGRESP if flags != 0 => {
            return Err(DecodeError::BadFlags { kind, flags });
        }
        CONNACK | PUBACK if len != 2 => return Err(DecodeError::BadLength { kind, len }),
        SUBACK if len < 3 => return Err(DecodeError::BadLength { kind, len }),
        PINGRESP if len != 0 => return Err(DecodeError::BadLength { kind, len }),
        CONNACK | PUBACK | SUBACK | PINGRESP => {}
        other => return Err(DecodeError::UnexpectedType(other)),
    }
    if buf.len() < size {
        return Ok(None);
    }
    buf.advance(1 + len_bytes);
    let mut body = buf.split_to(len);
    Ok(Some(match kind {
        CONNACK => Packet::ConnAck {
            session_present: body[0] & 0x01 != 0,
            code: body[1],
        },
        PUBACK => Packet::PubAck(packet_id(&body)?),
        SUBACK => Packet::SubAck {
            packet_id: packet_id(&body)?,
            codes: body[2..].to_vec(),
        },
        PINGRESP => Packet::PingResp,
        _ => {
            let qos = (flags >> 1) & 0x03;
            let topic = usize::from(u16::from_be_bytes([body[0], body[1]]));
            let id_len = 2 * usize::from(qos);
            if 2 + topic + id_len > len {
                return Err(DecodeError::TopicOverrun { topic, len });
            }
            body.advance(2);
            let topic = body.split_to(topic).freeze();
            let packet_id = if qos > 0 {
                let id = packet_id(&body)?;
                body.advance(2);
                Some(id)
            } else {
                None
            };
            Packet::Publish(Publish {
                qos,
                dup: flags & 0x08 != 0,
                retain: flags & 0x01 != 0,
                packet_id,
                topic,
                payload: body.freeze(),
            })
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remaining(len: usize) -> Vec<u8> {
        let mut v = Vec::new();
        put_remaining(&mut v, len).expect("in range");
        v
    }

    #[test]
    fn remaining_length_boundaries() {
        // The spec's table 2.4: the edges of 1, 2, 3 and 4 bytes.
        for (len, bytes) in [
            (0, vec![0x00]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0x01]),
            (16_383, vec![0xff, 0x7f]),
            (16_384, vec![0x80, 0x80, 0x01]),
            (2_097_151, vec![0xff, 0xff, 0x7f]),
            (2_097_152, vec![0x80, 0x80, 0x80, 0x01]),
            (REMAINING_MAX, vec![0xff, 0xff, 0xff, 0x7f]),
        ] {
            assert_eq!(remaining(len), bytes, "{len}");
            assert_eq!(get_remaining(&bytes), Ok(Some((len, bytes.len()))), "{len}");
            // Every strict prefix is incomplete, not an error.
            for cut in 0..bytes.len() {
                assert_eq!(get_remaining(&bytes[..cut]), Ok(None), "{len} cut {cut}");
            }
        }
        let mut v = Vec::new();
        assert_eq!(
            put_remaining(&mut v, REMAINING_MAX + 1),
            Err(EncodeError::TooLarge(REMAINING_MAX + 1))
        );
        // A fourth byte that still says "more" is malformed.
        assert_eq!(
            get_remaining(&[0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(DecodeError::RemainingLengthTooLong)
        );
        assert_eq!(
            get_remaining(&[0x80, 0x80, 0x80, 0x80]),
            Err(DecodeError::RemainingLengthTooLong)
        );
    }

    #[test]
    fn publish_round_trips_through_the_decoder() {
        let payload = vec![7u8; 300]; // a 2-byte remaining length
        let mut out = Vec::new();
        publish(&mut out, "a/b", 1, Some(513), &payload).expect("encodes");
        publish(&mut out, "c", 0, None, b"hi").expect("encodes");
        let mut buf = BytesMut::from(&out[..]);
        let Some(Packet::Publish(p)) = decode(&mut buf, 1 << 20).expect("valid") else {
            panic!("not a publish");
        };
        assert_eq!((p.qos, p.packet_id), (1, Some(513)));
        assert_eq!((&p.topic[..], &p.payload[..]), (&b"a/b"[..], &payload[..]));
        let Some(Packet::Publish(p)) = decode(&mut buf, 1 << 20).expect("valid") else {
            panic!("not a publish");
        };
        assert_eq!((p.qos, p.packet_id, &p.payload[..]), (0, None, &b"hi"[..]));
        assert!(buf.is_empty());
        assert_eq!(decode(&mut buf, 1 << 20), Ok(None));
    }

    /// Packets fed one byte at a time: nothing before the last byte, each
    /// packet exactly once, nothing left over.
    #[test]
    fn packets_split_across_reads() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&[0x20, 2, 0, 0]); // CONNACK accepted
        wire.extend_from_slice(&[0x90, 3, 0, 1, 1]); // SUBACK id 1, QoS 1
        publish(&mut wire, "t", 1, Some(9), &[1u8; 200]).expect("encodes");
        puback(&mut wire, 9);
        wire.extend_from_slice(&[0xd0, 0]); // PINGRESP
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for &b in &wire {
            buf.extend_from_slice(&[b]);
            while let Some(p) = decode(&mut buf, 1 << 20).expect("valid") {
                got.push(p);
            }
        }
        assert!(buf.is_empty());
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(
            got[0],
            Packet::ConnAck {
                session_present: false,
                code: 0
            }
        );
        assert_eq!(
            got[1],
            Packet::SubAck {
                packet_id: 1,
                codes: vec![1]
            }
        );
        assert!(matches!(&got[2], Packet::Publish(p) if p.payload.len() == 200));
        assert_eq!(got[3], Packet::PubAck(9));
        assert_eq!(got[4], Packet::PingResp);
    }

    #[test]
    fn malformed_packets_are_refused() {
        let max = 1024;
        let cases: [(&[u8], DecodeError); 8] = [
            // Larger than the limit: refused from the header alone.
            (
                &[0x30, 0x80, 0x10],
                DecodeError::TooLarge { size: 2051, max },
            ),
            (&[0x62, 2, 0, 1], DecodeError::UnexpectedType(6)), // PUBREL
            (&[0x10, 0], DecodeError::UnexpectedType(1)),       // CONNECT
            (&[0x34, 5], DecodeError::BadQos(2)),
            (
                &[0x41, 2, 0, 1],
                DecodeError::BadFlags { kind: 4, flags: 1 },
            ),
            (
                &[0x40, 3, 0, 1, 0],
                DecodeError::BadLength { kind: 4, len: 3 },
            ),
            (&[0x40, 2, 0, 0], DecodeError::ZeroPacketId),
            // Topic length 10 in a 5-byte QoS 0 publish.
            (
                &[0x30, 5, 0, 10, b'a', b'b', b'c'],
                DecodeError::TopicOverrun { topic: 10, len: 5 },
            ),
        ];
        for (bytes, want) in cases {
            let mut buf = BytesMut::from(bytes);
            assert_eq!(decode(&mut buf, max), Err(want), "{bytes:02x?}");
        }
        // A QoS 1 publish too short for its packet id.
        let mut buf = BytesMut::from(&[0x32, 3, 0, 1, b'a'][..]);
        assert_eq!(
            decode(&mut buf, max),
            Err(DecodeError::BadLength { kind: 3, len: 3 })
        );
    }

    #[test]
    fn connect_and_subscribe_layout() {
        let mut out = Vec::new();
        connect(
            &mut out,
            &Connect {
                client_id: "ab",
                clean_session: true,
                keep_alive_s: 60,
                username: Some("u"),
                password: Some("pw"),
            },
        )
        .expect("encodes");
        assert_eq!(
            out,
            [
                0x10, 21, 0, 4, b'M', b'Q', b'T', b'T', 4, 0xc2, 0, 60, 0, 2, b'a', b'b', 0, 1,
                b'u', 0, 2, b'p', b'w'
            ]
        );
        out.clear();
        subscribe(&mut out, 1, "t/x", 1).expect("encodes");
        assert_eq!(out, [0x82, 8, 0, 1, 0, 3, b't', b'/', b'x', 1]);
    }
}
