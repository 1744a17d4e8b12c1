//! Server packets, written with the `mqttbytes::v4`/`v5` writers.
//!
//! mqttbytes models reason codes as enums; the adapter works with plain
//! `u8` codes (one mapping function, see `crate::error`), so this module
//! converts, falling back to "unspecified error" for a code an enum lacks.
//! Gap covered: `v5::ConnAck::write` omits the property length when
//! `properties` is `None` (a malformed CONNACK), so we always pass a list.

use bytes::{Bytes, BytesMut};
use mqttbytes::{v4, v5, QoS};

use super::Version;

/// Longest Reason String we send: a short sentence for a human, never a
/// burden on a constrained client.
pub const REASON_STRING_MAX_BYTES: usize = 200;

/// `text` cut to [`REASON_STRING_MAX_BYTES`] on a character boundary.
pub fn reason_string(text: &str) -> String {
    if text.len() <= REASON_STRING_MAX_BYTES {
        return text.to_owned();
    }
    let mut end = REASON_STRING_MAX_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Writes a packet with its optional properties (Reason String), unless
/// that would exceed the client's Maximum Packet Size: then writes it
/// again without them (MQTT 5 §3.1.2.11.4 lets the server drop the Reason
/// String and User Properties for that; a packet without them always fits
/// a limit a client can legally set). `write(with_props, out)`.
fn write_within<E>(
    max: Option<u32>,
    out: &mut BytesMut,
    mut write: impl FnMut(bool, &mut BytesMut) -> Result<(), E>,
) -> Result<(), E> {
    let start = out.len();
    write(true, out)?;
    let limit = max.map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
    if out.len() - start > limit {
        out.truncate(start);
        write(false, out)?;
    }
    Ok(())
}

/// Why a server packet could not be encoded (our bug or an oversize field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode packet: {0:?}")]
pub struct EncodeError(pub mqttbytes::Error);

fn qos(q: u8) -> QoS {
    match q {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

/// A PUBLISH to a client, borrowing what it carries from the delivery.
#[derive(Debug, Clone)]
pub struct OutPublish<'a> {
    /// Topic (empty when an established alias stands for it).
    pub topic: &'a str,
    /// QoS 0–2.
    pub qos: u8,
    /// DUP flag.
    pub dup: bool,
    /// RETAIN flag.
    pub retain: bool,
    /// Packet id (QoS > 0).
    pub pkid: u16,
    /// Payload.
    pub payload: &'a Bytes,
    /// v5 properties; ignored for 3.1.1.
    pub props: Option<v5::PublishProperties>,
}

/// Most bytes MQTT's variable-length Remaining Length can say.
const REMAINING_LENGTH_MAX: usize = 268_435_455;

/// Writes a PUBLISH; returns its size in bytes. A 3.1.1 PUBLISH (no
/// properties) is written here directly, with one reservation for the
/// whole packet: mqttbytes' writer wants the topic as an owned `String`,
/// one allocation per delivery, and grows the buffer field by field.
pub fn publish(
    version: Version,
    p: OutPublish<'_>,
    out: &mut BytesMut,
) -> Result<usize, EncodeError> {
    let before = out.len();
    match version {
        Version::V311 => publish_v4(&p, out)?,
        Version::V5 => {
            let mut w = v5::Publish::from_bytes(p.topic, qos(p.qos), p.payload.clone());
            w.dup = p.dup;
            w.retain = p.retain;
            w.pkid = p.pkid;
            w.properties = p.props;
            w.write(out).map_err(EncodeError)?;
        }
    }
    Ok(out.len() - before)
}

/// A 3.1.1 PUBLISH, byte for byte what `mqttbytes::v4::Publish::write`
/// writes (the test below compares them).
fn publish_v4(p: &OutPublish<'_>, out: &mut BytesMut) -> Result<(), EncodeError> {
    let with_pkid = p.qos > 0;
    if with_pkid && p.pkid == 0 {
        return Err(EncodeError(mqttbytes::Error::PacketIdZero));
    }
    let topic_len =
        u16::try_from(p.topic.len()).map_err(|_| EncodeError(mqttbytes::Error::PayloadTooLong))?;
    let len = 2 + p.topic.len() + if with_pkid { 2 } else { 0 } + p.payload.len();
    if len > REMAINING_LENGTH_MAX {
        return Err(EncodeError(mqttbytes::Error::PayloadTooLong));
    }
    let mut header = [0u8; 5];
    header[0] = 0b0011_0000 | u8::from(p.retain) | (p.qos.min(2) << 1) | (u8::from(p.dup) << 3);
    let mut n = 1;
    let mut x = len;
    loop {
        let byte = (x % 128) as u8;
        x /= 128;
        header[n] = if x > 0 { byte | 0x80 } else { byte };
        n += 1;
        if x == 0 {
            break;
        }
    }
    out.reserve(n + len);
    out.extend_from_slice(&header[..n]);
    out.extend_from_slice(&topic_len.to_be_bytes());
    out.extend_from_slice(p.topic.as_bytes());
    if with_pkid {
        out.extend_from_slice(&p.pkid.to_be_bytes());
    }
    out.extend_from_slice(p.payload);
    Ok(())
}

/// Which acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    /// PUBACK.
    PubAck,
    /// PUBREC.
    PubRec,
    /// PUBREL.
    PubRel,
    /// PUBCOMP.
    PubComp,
}

/// Writes PUBACK/PUBREC/PUBREL/PUBCOMP with a v5 reason code.
pub fn ack(version: Version, kind: AckKind, pkid: u16, reason: u8, out: &mut BytesMut) {
    ack_with_reason(version, kind, pkid, reason, None, None, out);
}

/// Writes a PUBACK or PUBREC with a v5 reason code and, for a failure, a
/// Reason String (`why`), which is left out when the packet would exceed
/// the client's maximum packet size (`max`). Other acks and 3.1.1 ignore
/// `why`.
pub fn ack_with_reason(
    version: Version,
    kind: AckKind,
    pkid: u16,
    reason: u8,
    why: Option<&str>,
    max: Option<u32>,
    out: &mut BytesMut,
) {
    let props = |with: bool| {
        why.filter(|_| with).map(|w| v5::PubAckProperties {
            reason_string: Some(reason_string(w)),
            user_properties: Vec::new(),
        })
    };
    let r = write_within(max, out, |with, out| match (version, kind) {
        (Version::V5, AckKind::PubAck) => {
            let mut a = v5::PubAck::new(pkid);
            a.reason = puback_reason(reason);
            a.properties = props(with);
            a.write(out).map(drop)
        }
        (Version::V5, AckKind::PubRec) => {
            let mut a = v5::PubRec::new(pkid);
            a.reason = pubrec_reason(reason);
            a.properties = props(with).map(|p| v5::PubRecProperties {
                reason_string: p.reason_string,
                user_properties: p.user_properties,
            });
            a.write(out).map(drop)
        }
        _ => plain_ack(version, kind, pkid, reason, out),
    });
    // Fixed-size packets and a bounded string: the writers cannot fail.
    debug_assert!(r.is_ok());
}

fn plain_ack(
    version: Version,
    kind: AckKind,
    pkid: u16,
    reason: u8,
    out: &mut BytesMut,
) -> Result<(), mqttbytes::Error> {
    let r = match version {
        Version::V311 => match kind {
            AckKind::PubAck => v4::PubAck::new(pkid).write(out),
            AckKind::PubRec => v4::PubRec::new(pkid).write(out),
            AckKind::PubRel => v4::PubRel::new(pkid).write(out),
            AckKind::PubComp => v4::PubComp::new(pkid).write(out),
        },
        Version::V5 => match kind {
            AckKind::PubAck => {
                let mut a = v5::PubAck::new(pkid);
                a.reason = puback_reason(reason);
                a.write(out)
            }
            AckKind::PubRec => {
                let mut a = v5::PubRec::new(pkid);
                a.reason = pubrec_reason(reason);
                a.write(out)
            }
            AckKind::PubRel => {
                let mut a = v5::PubRel::new(pkid);
                if reason == 0x92 {
                    a.reason = v5::PubRelReason::PacketIdentifierNotFound;
                }
                a.write(out)
            }
            AckKind::PubComp => {
                let mut a = v5::PubComp::new(pkid);
                if reason == 0x92 {
                    a.reason = v5::PubCompReason::PacketIdentifierNotFound;
                }
                a.write(out)
            }
        },
    };
    r.map(drop)
}

fn puback_reason(code: u8) -> v5::PubAckReason {
    use v5::PubAckReason::*;
    match code {
        0x00 => Success,
        0x10 => NoMatchingSubscribers,
        0x83 => ImplementationSpecificError,
        0x87 => NotAuthorized,
        0x90 => TopicNameInvalid,
        0x91 => PacketIdentifierInUse,
        0x97 => QuotaExceeded,
        0x99 => PayloadFormatInvalid,
        _ => UnspecifiedError,
    }
}

fn pubrec_reason(code: u8) -> v5::PubRecReason {
    use v5::PubRecReason::*;
    match code {
        0x00 => Success,
        0x10 => NoMatchingSubscribers,
        0x83 => ImplementationSpecificError,
        0x87 => NotAuthorized,
        0x90 => TopicNameInvalid,
        0x91 => PacketIdentifierInUse,
        0x97 => QuotaExceeded,
        0x99 => PayloadFormatInvalid,
        _ => UnspecifiedError,
    }
}

/// Writes a 3.1.1 CONNACK with return code 0–5.
pub fn connack_v4(session_present: bool, code: u8, out: &mut BytesMut) {
    use v4::ConnectReturnCode::*;
    let code = match code {
        0 => Success,
        1 => RefusedProtocolVersion,
        2 => BadClientId,
        4 => BadUserNamePassword,
        5 => NotAuthorized,
        _ => ServiceUnavailable,
    };
    let r = v4::ConnAck::new(code, session_present).write(out);
    debug_assert!(r.is_ok());
}

/// Writes a v5 CONNACK. Its Reason String and User Properties are left out
/// if the packet would exceed the client's maximum packet size `max`.
pub fn connack_v5(
    session_present: bool,
    code: u8,
    props: v5::ConnAckProperties,
    max: Option<u32>,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    use v5::ConnectReturnCode::*;
    let code = match code {
        0x00 => Success,
        0x81 => MalformedPacket,
        0x82 => ProtocolError,
        0x83 => ImplementationSpecificError,
        0x84 => UnsupportedProtocolVersion,
        0x85 => ClientIdentifierNotValid,
        0x86 => BadUserNamePassword,
        0x87 => NotAuthorized,
        0x88 => ServerUnavailable,
        0x89 => ServerBusy,
        0x8A => Banned,
        0x8C => BadAuthenticationMethod,
        0x90 => TopicNameInvalid,
        0x95 => PacketTooLarge,
        0x97 => QuotaExceeded,
        0x99 => PayloadFormatInvalid,
        0x9A => RetainNotSupported,
        0x9B => QoSNotSupported,
        0x9C => UseAnotherServer,
        0x9D => ServerMoved,
        0x9F => ConnectionRateExceeded,
        _ => UnspecifiedError,
    };
    let mut props = props;
    props.reason_string = props.reason_string.as_deref().map(reason_string);
    write_within(max, out, |with, out| {
        let mut ack = v5::ConnAck::new(code, session_present);
        let mut p = props.clone();
        if !with {
            p.reason_string = None;
            p.user_properties.clear();
        }
        ack.properties = Some(p);
        ack.write(out).map(drop).map_err(EncodeError)
    })
}

/// Writes a SUBACK; `codes` are v5 reason codes (granted QoS or failure).
/// `why` becomes the v5 Reason String unless the packet would then exceed
/// the client's maximum packet size `max`.
pub fn suback(
    version: Version,
    pkid: u16,
    codes: &[u8],
    why: Option<String>,
    max: Option<u32>,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    match version {
        Version::V311 => {
            let codes = codes
                .iter()
                .map(|&c| match c {
                    0..=2 => v4::SubscribeReasonCode::Success(qos(c)),
                    _ => v4::SubscribeReasonCode::Failure,
                })
                .collect();
            v4::SubAck::new(pkid, codes)
                .write(out)
                .map_err(EncodeError)?;
        }
        Version::V5 => {
            use v5::SubscribeReasonCode::*;
            let codes: Vec<v5::SubscribeReasonCode> = codes
                .iter()
                .map(|&c| match c {
                    0 => QoS0,
                    1 => QoS1,
                    2 => QoS2,
                    0x83 => ImplementationSpecific,
                    0x87 => NotAuthorized,
                    0x8F => TopicFilterInvalid,
                    0x91 => PkidInUse,
                    0x97 => QuotaExceeded,
                    0x9E => SharedSubscriptionsNotSupported,
                    0xA1 => SubscriptionIdNotSupported,
                    0xA2 => WildcardSubscriptionsNotSupported,
                    _ => Unspecified,
                })
                .collect();
            let properties = why.map(|w| v5::SubAckProperties {
                reason_string: Some(reason_string(&w)),
                user_properties: Vec::new(),
            });
            write_within(max, out, |with, out| {
                let mut ack = v5::SubAck::new(pkid, codes.clone());
                ack.properties = properties.clone().filter(|_| with);
                ack.write(out).map(drop).map_err(EncodeError)
            })?;
        }
    }
    Ok(())
}

/// Writes an UNSUBACK; `codes` (v5 only) are 0x00 or 0x11 or failures.
/// `why` becomes the v5 Reason String unless the packet would then exceed
/// the client's maximum packet size `max`.
pub fn unsuback(
    version: Version,
    pkid: u16,
    codes: &[u8],
    why: Option<String>,
    max: Option<u32>,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    match version {
        Version::V311 => {
            v4::UnsubAck::new(pkid).write(out).map_err(EncodeError)?;
        }
        Version::V5 => {
            use v5::UnsubAckReason::*;
            let mut ack = v5::UnsubAck::new(pkid);
            ack.reasons = codes
                .iter()
                .map(|&c| match c {
                    0x00 => Success,
                    0x11 => NoSubscriptionExisted,
                    0x83 => ImplementationSpecificError,
                    0x87 => NotAuthorized,
                    0x8F => TopicFilterInvalid,
                    0x91 => PacketIdentifierInUse,
                    _ => UnspecifiedError,
                })
                .collect();
            let properties = why.map(|w| v5::UnsubAckProperties {
                reason_string: Some(reason_string(&w)),
                user_properties: Vec::new(),
            });
            write_within(max, out, |with, out| {
                let mut ack = ack.clone();
                ack.properties = properties.clone().filter(|_| with);
                ack.write(out).map(drop).map_err(EncodeError)
            })?;
        }
    }
    Ok(())
}

/// Writes a PINGRESP.
pub fn pingresp(out: &mut BytesMut) {
    out.extend_from_slice(&[0xD0, 0x00]);
}

/// Writes a v5 DISCONNECT with a reason code and optional reason string,
/// which is left out if the packet would exceed the client's maximum
/// packet size `max`.
pub fn disconnect_v5(reason: u8, why: Option<&str>, max: Option<u32>, out: &mut BytesMut) {
    use v5::DisconnectReasonCode;
    let code =
        DisconnectReasonCode::try_from(reason).unwrap_or(DisconnectReasonCode::UnspecifiedError);
    // `v5::Disconnect::write` with an empty property list is malformed: only
    // a non-empty reason string makes a property list.
    let why = why.filter(|w| !w.is_empty()).map(reason_string);
    let r = write_within(max, out, |with, out| match why.clone().filter(|_| with) {
        Some(text) => {
            let mut d = v5::Disconnect::new();
            d.reason_code = code;
            d.properties = Some(v5::DisconnectProperties {
                session_expiry_interval: None,
                reason_string: Some(text),
                user_properties: Vec::new(),
                server_reference: None,
            });
            d.write(out).map(drop)
        }
        None => {
            // Reason code and an explicit empty property length. The
            // shorter form mqttbytes writes (reason code only) is valid,
            // but mqttbytes and rumqttc fail to read it.
            out.extend_from_slice(&[0xE0, 0x02, code as u8, 0x00]);
            Ok(())
        }
    });
    debug_assert!(r.is_ok());
}

/// Writes an AUTH packet (mqttbytes 0.6 has none) with the Authentication
/// Method and Data. Both are ours and short (a method name, a SCRAM
/// message), far below the 65,535 bytes a property can hold.
pub fn auth(reason: u8, method: &str, data: &[u8], out: &mut BytesMut) {
    let (Ok(method_len), Ok(data_len)) = (u16::try_from(method.len()), u16::try_from(data.len()))
    else {
        panic!("AUTH property over 65,535 bytes: our own data, a bug");
    };
    let props_len = 1 + 2 + method.len() + 1 + 2 + data.len();
    let mut props_len_bytes = BytesMut::new();
    write_varint(props_len, &mut props_len_bytes);
    let remaining = 1 + props_len_bytes.len() + props_len;
    out.extend_from_slice(&[0xF0]);
    write_varint(remaining, out);
    out.extend_from_slice(&[reason]);
    out.extend_from_slice(&props_len_bytes);
    out.extend_from_slice(&[0x15]);
    out.extend_from_slice(&method_len.to_be_bytes());
    out.extend_from_slice(method.as_bytes());
    out.extend_from_slice(&[0x16]);
    out.extend_from_slice(&data_len.to_be_bytes());
    out.extend_from_slice(data);
}

/// MQTT's variable byte integer (lengths here are far below its 268 MB cap).
fn write_varint(mut n: usize, out: &mut BytesMut) {
    loop {
        let mut byte = u8::try_from(n % 128).unwrap_or(0);
        n /= 128;
        if n > 0 {
            byte |= 0x80;
        }
        out.extend_from_slice(&[byte]);
        if n == 0 {
            return;
        }
    }
}

#[cfg(test)]
mod publish_tests {
    use super::*;

    /// The hand-written 3.1.1 PUBLISH is mqttbytes' byte for byte, across
    /// QoS, flags and the Remaining Length's one- to three-byte forms.
    #[test]
    fn a_v4_publish_is_written_as_mqttbytes_writes_it() {
        for (topic, qos, dup, retain, pkid, size) in [
            ("a", 0, false, false, 0, 0),
            ("a/b/c", 1, true, false, 7, 100),
            ("sensors/+x/temperature", 2, false, true, 65_535, 125),
            ("t", 1, false, true, 1, 126),
            ("t", 0, true, true, 0, 16_380),
            ("topic", 1, false, false, 300, 20_000),
        ] {
            let payload = Bytes::from(vec![0xa5; size]);
            let mut ours = BytesMut::new();
            let p = OutPublish {
                topic,
                qos,
                dup,
                retain,
                pkid,
                payload: &payload,
                props: None,
            };
            let n = publish(Version::V311, p, &mut ours).expect("encodes");
            let mut w = v4::Publish::from_bytes(topic, super::qos(qos), payload.clone());
            w.dup = dup;
            w.retain = retain;
            w.pkid = pkid;
            let mut theirs = BytesMut::new();
            w.write(&mut theirs).expect("mqttbytes encodes");
            assert_eq!(ours, theirs, "{topic} qos {qos} size {size}");
            assert_eq!(n, ours.len());
        }
    }

    #[test]
    fn a_v4_publish_refuses_what_it_cannot_write() {
        let payload = Bytes::new();
        let p = |topic, qos, pkid| OutPublish {
            topic,
            qos,
            dup: false,
            retain: false,
            pkid,
            payload: &payload,
            props: None,
        };
        let mut out = BytesMut::new();
        assert!(publish(Version::V311, p("a", 1, 0), &mut out).is_err());
        let long = "x".repeat(70_000);
        assert!(publish(Version::V311, p(&long, 0, 0), &mut out).is_err());
        assert!(out.is_empty(), "nothing written for a refused packet");
    }
}
