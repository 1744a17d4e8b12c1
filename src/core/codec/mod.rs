//! [`Message`] ⇄ bytes, losslessly: how the core keeps a message in the
//! journal and in page files. The store holds these bytes as an
//! [`Opaque`] record body and never looks inside; decoding them is ours.
//!
//! Every field of the neutral message is written, in a fixed order, after a
//! one-byte codec version ([`MESSAGE_CODEC_VERSION`]). A later version may
//! add fields at the end; the decoder dispatches on the version byte.
//!
//! | field              | encoding                                             |
//! |--------------------|------------------------------------------------------|
//! | version            | `u8` = 2                                             |
//! | body kind          | `u8` (0 binary, 1 text, 2 amqp-value, 3 amqp-sequence, 4 amqp-data) |
//! | body bytes         | `u32` length + bytes                                 |
//! | address            | `u8` (0 none, 1 topic, 2 queue) + string             |
//! | message id         | `u8` (0 none, 1 string, 2 ulong, 3 uuid, 4 binary) + value |
//! | correlation id     | as message id                                        |
//! | reply-to, content type, content encoding, subject | optional string      |
//! | user id            | optional bytes                                       |
//! | group id           | optional string                                      |
//! | group sequence     | optional `u32`                                       |
//! | priority           | `u8`                                                 |
//! | durable            | `u8` bool                                            |
//! | guarantee          | `u8` (0 at-most-once, 1 at-least-once, 2 exactly-once) |
//! | retain             | `u8` bool                                            |
//! | creation time, expiry | optional `u64`                                    |
//! | properties         | `u32` count, then per entry: name string, `u8` value tag, value |
//! | amqp annotations   | optional bytes                                       |
//! | delivery time      | optional `u64` (version 2 only)                      |
//!
//! Version 2 (scheduled delivery) added the delivery time at the end.
//! Version 1 encodings, in journals written before it, still decode, with
//! no delivery time.
//!
//! Optional items are a presence byte (0 or 1) followed by the value. Floats
//! are stored as their IEEE bit patterns, so NaN payloads survive too.
//!
//! [`tails`] encodes the core's part of the binding and delivery-state
//! records the same way.

use std::sync::Arc;

use bytes::Bytes;
use rosetta_neutral::{Address, Body, BodyKind, Guarantee, Message, MessageId, Properties, Value};

use rosetta_store::wire::{self, DecodeError, Reader};
use rosetta_store::{EncodeOpaque, Opaque};

mod tails;
pub use tails::{
    bind_record, decode_binding, decode_delivery_state, decode_queue, delivery_state_record,
    queue_declare_record, StoredBinding, StoredDelivery, StoredQueue,
};

/// Version byte written in front of every encoded message.
pub const MESSAGE_CODEC_VERSION: u8 = 2;

/// The version before scheduled delivery: no delivery time at the end.
const MESSAGE_CODEC_VERSION_1: u8 = 1;

/// Smallest possible encoding of one property (empty name + `Null` tag), used
/// to bound a decoded property count by the bytes that remain.
const PROPERTY_ENCODED_MIN_BYTES: usize = 5;

/// Appends the encoding of `m` to `out`.
pub fn encode_message(m: &Message, out: &mut Vec<u8>) {
    wire::put_u8(out, MESSAGE_CODEC_VERSION);
    wire::put_u8(out, body_kind_tag(m.body.kind));
    wire::put_bytes(out, &m.body.bytes);
    match &m.address {
        None => wire::put_u8(out, 0),
        Some(Address::Topic(t)) => {
            wire::put_u8(out, 1);
            wire::put_str(out, t);
        }
        Some(Address::Queue(q)) => {
            wire::put_u8(out, 2);
            wire::put_str(out, q);
        }
    }
    put_message_id(out, m.message_id.as_ref());
    put_message_id(out, m.correlation_id.as_ref());
    wire::put_opt_str(out, m.reply_to.as_deref());
    wire::put_opt_str(out, m.content_type.as_deref());
    wire::put_opt_str(out, m.content_encoding.as_deref());
    wire::put_opt_str(out, m.subject.as_deref());
    wire::put_opt_bytes(out, m.user_id.as_deref());
    wire::put_opt_str(out, m.group_id.as_deref());
    wire::put_opt_u32(out, m.group_sequence);
    wire::put_u8(out, m.priority);
    wire::put_bool(out, m.durable);
    wire::put_u8(out, guarantee_tag(m.guarantee));
    wire::put_bool(out, m.retain);
    wire::put_opt_u64(out, m.creation_time);
    wire::put_opt_u64(out, m.expiry);
    wire::put_len(out, m.properties.len());
    for (name, value) in m.properties.iter() {
        wire::put_str(out, name);
        put_value(out, value);
    }
    wire::put_opt_bytes(out, m.amqp_annotations.as_deref());
    wire::put_opt_u64(out, m.delivery_time);
}

/// Decodes one message from `r`, leaving `r` just after it. Built in its
/// `Arc`: every caller keeps it in one, and the 400-odd bytes of a
/// `Message` are then written once, not moved twice on the way there.
fn decode_message(r: &mut Reader<'_>) -> Result<Arc<Message>, DecodeError> {
    let version = r.u8("message version")?;
    if version != MESSAGE_CODEC_VERSION && version != MESSAGE_CODEC_VERSION_1 {
        return Err(DecodeError::UnsupportedVersion {
            what: "message",
            version,
        });
    }
    let kind = body_kind_from_tag(r.u8("body kind")?)?;
    let bytes = r.bytes("body")?;
    let address = match r.u8("address")? {
        0 => None,
        1 => Some(Address::Topic(r.string("topic")?)),
        2 => Some(Address::Queue(r.string("queue")?)),
        tag => {
            return Err(DecodeError::BadTag {
                what: "address",
                tag,
            })
        }
    };
    let message_id = get_message_id(r)?;
    let correlation_id = get_message_id(r)?;
    let reply_to = r.opt_string("reply-to")?;
    let content_type = r.opt_string("content type")?;
    let content_encoding = r.opt_string("content encoding")?;
    let subject = r.opt_string("subject")?;
    let user_id = r.opt_bytes("user id")?;
    let group_id = r.opt_string("group id")?;
    let group_sequence = r.opt_u32("group sequence")?;
    let priority = r.u8("priority")?;
    let durable = r.bool("durable")?;
    let guarantee = guarantee_from_tag(r.u8("guarantee")?)?;
    let retain = r.bool("retain")?;
    let creation_time = r.opt_u64("creation time")?;
    let expiry = r.opt_u64("expiry")?;
    let count = r.count(PROPERTY_ENCODED_MIN_BYTES, "property count")?;
    let mut props = Vec::with_capacity(count);
    for _ in 0..count {
        let name = r.string("property name")?;
        let value = get_value(r)?;
        props.push((name, value));
    }
    let amqp_annotations = r.opt_bytes("amqp annotations")?;
    let delivery_time = if version >= MESSAGE_CODEC_VERSION {
        r.opt_u64("delivery time")?
    } else {
        None
    };
    Ok(Arc::new(Message {
        body: Body { kind, bytes },
        address,
        message_id,
        correlation_id,
        reply_to,
        content_type,
        content_encoding,
        subject,
        user_id,
        group_id,
        group_sequence,
        priority,
        durable,
        guarantee,
        retain,
        creation_time,
        expiry,
        properties: props.into_iter().collect::<Properties>(),
        amqp_annotations,
        delivery_time,
    }))
}

/// The record body of `message`, encoded only when the journal writer
/// writes it (straight into the entry: the payload is copied once).
pub fn opaque(message: &Arc<Message>) -> Opaque {
    Opaque::Deferred(Arc::new(Encoded(Arc::clone(message))))
}

/// A message on its way into a journal record.
struct Encoded(Arc<Message>);

impl EncodeOpaque for Encoded {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_message(&self.0, out);
    }

    fn encoded_len_hint(&self) -> usize {
        self.0.memory_size()
    }
}

/// At least as many bytes as [`encode_message`] appends for `m` (exact
/// but for a few bytes): the bound a stream log needs to take the message
/// still unencoded ([`rosetta_store::log::StreamLog::append`]). One pass
/// over the properties, none over any bytes.
pub fn encoded_len_max(m: &Message) -> usize {
    /// A length prefix and a presence or tag byte.
    const PREFIXED: usize = 5;
    let opt_str = |s: Option<&str>| PREFIXED + s.map_or(0, str::len);
    let id = |id: Option<&MessageId>| match id {
        None => 1,
        Some(MessageId::String(s)) => PREFIXED + s.len(),
        Some(MessageId::Ulong(_)) => 9,
        Some(MessageId::Uuid(_)) => 17,
        Some(MessageId::Binary(b)) => PREFIXED + b.len(),
    };
    let address = match &m.address {
        None => 1,
        Some(Address::Topic(t) | Address::Queue(t)) => PREFIXED + t.len(),
    };
    let properties: usize = m
        .properties
        .iter()
        .map(|(name, value)| {
            4 + name.len()
                + match value {
                    Value::String(s) | Value::Symbol(s) => PREFIXED + s.len(),
                    Value::Binary(b) => PREFIXED + b.len(),
                    // A tag and at most 16 bytes (a UUID).
                    _ => 17,
                }
        })
        .sum();
    // version, kind, body; address; ids; four optional strings; user id;
    // group id and sequence; priority, durable, guarantee, retain; creation
    // time, expiry; property count and properties; annotations; delivery
    // time.
    2 + 4
        + m.body.bytes.len()
        + address
        + id(m.message_id.as_ref())
        + id(m.correlation_id.as_ref())
        + opt_str(m.reply_to.as_deref())
        + opt_str(m.content_type.as_deref())
        + opt_str(m.content_encoding.as_deref())
        + opt_str(m.subject.as_deref())
        + PREFIXED
        + m.user_id.as_ref().map_or(0, |u| u.len())
        + opt_str(m.group_id.as_deref())
        + 5
        + 4
        + 9
        + 9
        + 4
        + properties
        + PREFIXED
        + m.amqp_annotations.as_ref().map_or(0, Bytes::len)
        + 9
}

/// The record body of `message` for a stream log, encoded only when the
/// log's writer writes its batch (straight into it: the payload is
/// copied once); its hint is [`encoded_len_max`], the upper bound the log
/// asks for.
pub fn stream_opaque(message: Arc<Message>) -> Opaque {
    let bound = encoded_len_max(&message);
    Opaque::Deferred(Arc::new(StreamEncoded { message, bound }))
}

/// A message on its way into a stream log's batch: the message as the
/// publisher's adapter allocated it, not a copy.
struct StreamEncoded {
    message: Arc<Message>,
    bound: usize,
}

impl EncodeOpaque for StreamEncoded {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_message(&self.message, out);
    }

    fn encoded_len_hint(&self) -> usize {
        self.bound
    }
}

/// Decodes a buffer that holds exactly one message.
pub fn decode_message_exact(buf: Bytes) -> Result<Arc<Message>, DecodeError> {
    let mut r = Reader::new(&buf);
    let m = decode_message(&mut r)?;
    r.finish("message")?;
    Ok(m)
}

fn body_kind_tag(k: BodyKind) -> u8 {
    match k {
        BodyKind::Binary => 0,
        BodyKind::Text => 1,
        BodyKind::AmqpValue => 2,
        BodyKind::AmqpSequence => 3,
        BodyKind::AmqpData => 4,
    }
}

fn body_kind_from_tag(tag: u8) -> Result<BodyKind, DecodeError> {
    Ok(match tag {
        0 => BodyKind::Binary,
        1 => BodyKind::Text,
        2 => BodyKind::AmqpValue,
        3 => BodyKind::AmqpSequence,
        4 => BodyKind::AmqpData,
        tag => {
            return Err(DecodeError::BadTag {
                what: "body kind",
                tag,
            })
        }
    })
}

fn guarantee_tag(g: Guarantee) -> u8 {
    match g {
        Guarantee::AtMostOnce => 0,
        Guarantee::AtLeastOnce => 1,
        Guarantee::ExactlyOnce => 2,
    }
}

fn guarantee_from_tag(tag: u8) -> Result<Guarantee, DecodeError> {
    Ok(match tag {
        0 => Guarantee::AtMostOnce,
        1 => Guarantee::AtLeastOnce,
        2 => Guarantee::ExactlyOnce,
        tag => {
            return Err(DecodeError::BadTag {
                what: "guarantee",
                tag,
            })
        }
    })
}

fn put_message_id(out: &mut Vec<u8>, id: Option<&MessageId>) {
    match id {
        None => wire::put_u8(out, 0),
        Some(MessageId::String(s)) => {
            wire::put_u8(out, 1);
            wire::put_str(out, s);
        }
        Some(MessageId::Ulong(v)) => {
            wire::put_u8(out, 2);
            wire::put_u64(out, *v);
        }
        Some(MessageId::Uuid(v)) => {
            wire::put_u8(out, 3);
            out.extend_from_slice(v);
        }
        Some(MessageId::Binary(b)) => {
            wire::put_u8(out, 4);
            wire::put_bytes(out, b);
        }
    }
}

#[inline]
fn get_message_id(r: &mut Reader<'_>) -> Result<Option<MessageId>, DecodeError> {
    Ok(match r.u8("message id")? {
        0 => None,
        1 => Some(MessageId::String(r.string("message id")?)),
        2 => Some(MessageId::Ulong(r.u64("message id")?)),
        3 => Some(MessageId::Uuid(r.uuid("message id")?)),
        4 => Some(MessageId::Binary(r.bytes("message id")?)),
        tag => {
            return Err(DecodeError::BadTag {
                what: "message id",
                tag,
            })
        }
    })
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => wire::put_u8(out, 0),
        Value::Bool(b) => {
            wire::put_u8(out, 1);
            wire::put_bool(out, *b);
        }
        Value::UByte(x) => {
            wire::put_u8(out, 2);
            wire::put_u8(out, *x);
        }
        Value::UShort(x) => {
            wire::put_u8(out, 3);
            wire::put_u16(out, *x);
        }
        Value::UInt(x) => {
            wire::put_u8(out, 4);
            wire::put_u32(out, *x);
        }
        Value::ULong(x) => {
            wire::put_u8(out, 5);
            wire::put_u64(out, *x);
        }
        Value::Byte(x) => {
            wire::put_u8(out, 6);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Short(x) => {
            wire::put_u8(out, 7);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Int(x) => {
            wire::put_u8(out, 8);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Long(x) => {
            wire::put_u8(out, 9);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Float(x) => {
            wire::put_u8(out, 10);
            wire::put_u32(out, x.to_bits());
        }
        Value::Double(x) => {
            wire::put_u8(out, 11);
            wire::put_u64(out, x.to_bits());
        }
        Value::Char(c) => {
            wire::put_u8(out, 12);
            wire::put_u32(out, u32::from(*c));
        }
        Value::Timestamp(t) => {
            wire::put_u8(out, 13);
            out.extend_from_slice(&t.to_le_bytes());
        }
        Value::Uuid(u) => {
            wire::put_u8(out, 14);
            out.extend_from_slice(u);
        }
        Value::String(s) => {
            wire::put_u8(out, 15);
            wire::put_str(out, s);
        }
        Value::Symbol(s) => {
            wire::put_u8(out, 16);
            wire::put_str(out, s);
        }
        Value::Binary(b) => {
            wire::put_u8(out, 17);
            wire::put_bytes(out, b);
        }
    }
}

fn get_value(r: &mut Reader<'_>) -> Result<Value, DecodeError> {
    const W: &str = "property value";
    Ok(match r.u8("property value tag")? {
        0 => Value::Null,
        1 => Value::Bool(r.bool(W)?),
        2 => Value::UByte(r.u8(W)?),
        3 => Value::UShort(r.u16(W)?),
        4 => Value::UInt(r.u32(W)?),
        5 => Value::ULong(r.u64(W)?),
        6 => Value::Byte(i8::from_le_bytes([r.u8(W)?])),
        7 => Value::Short(i16::from_le_bytes(r.u16(W)?.to_le_bytes())),
        8 => Value::Int(i32::from_le_bytes(r.u32(W)?.to_le_bytes())),
        9 => Value::Long(i64::from_le_bytes(r.u64(W)?.to_le_bytes())),
        10 => Value::Float(f32::from_bits(r.u32(W)?)),
        11 => Value::Double(f64::from_bits(r.u64(W)?)),
        12 => {
            let raw = r.u32(W)?;
            Value::Char(char::from_u32(raw).ok_or(DecodeError::BadChar(raw))?)
        }
        13 => Value::Timestamp(i64::from_le_bytes(r.u64(W)?.to_le_bytes())),
        14 => Value::Uuid(r.uuid(W)?),
        15 => Value::String(r.string(W)?),
        16 => Value::Symbol(r.string(W)?),
        17 => Value::Binary(r.bytes(W)?),
        tag => {
            return Err(DecodeError::BadTag {
                what: "property value",
                tag,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(m: &Message) -> Message {
        let mut out = Vec::new();
        encode_message(m, &mut out);
        match decode_message_exact(Bytes::from(out)) {
            Ok(back) => Message::clone(&back),
            Err(e) => panic!("decode failed: {e}"),
        }
    }

    /// A message with every field set to a non-default value.
    fn full_message() -> Message {
        let mut properties = Properties::new();
        for (i, v) in all_values().into_iter().enumerate() {
            properties.push(format!("p{}", i % 5), v);
        }
        properties.push("p0", "duplicate of an earlier name");
        Message {
            body: Body {
                kind: BodyKind::AmqpSequence,
                bytes: Bytes::from_static(b"\x00\x53\x76\xc0\x01\x00"),
            },
            address: Some(Address::Topic("a/b/c".into())),
            message_id: Some(MessageId::Uuid([7; 16])),
            correlation_id: Some(MessageId::Binary(Bytes::from_static(&[0, 1, 255]))),
            reply_to: Some("/queue/replies".into()),
            content_type: Some("application/json".into()),
            content_encoding: Some("gzip".into()),
            subject: Some("subj".into()),
            user_id: Some(Bytes::from_static(b"alice")),
            group_id: Some("g1".into()),
            group_sequence: Some(u32::MAX),
            priority: 9,
            durable: true,
            guarantee: Guarantee::ExactlyOnce,
            retain: true,
            creation_time: Some(1_700_000_000_000),
            expiry: Some(u64::MAX),
            properties,
            amqp_annotations: Some(Bytes::from_static(b"\x00\x53\x72\xc1\x01\x00")),
            delivery_time: Some(1_700_000_060_000),
        }
    }

    fn all_values() -> Vec<Value> {
        vec![
            Value::Null,
            Value::Bool(true),
            Value::Bool(false),
            Value::UByte(200),
            Value::UShort(60_000),
            Value::UInt(4_000_000_000),
            Value::ULong(u64::MAX),
            Value::Byte(-100),
            Value::Short(-30_000),
            Value::Int(i32::MIN),
            Value::Long(i64::MIN),
            Value::Float(-1.5),
            Value::Double(std::f64::consts::PI),
            Value::Char('é'),
            Value::Timestamp(-5),
            Value::Uuid([0xAB; 16]),
            Value::String("strïng".into()),
            Value::Symbol("sym".into()),
            Value::Binary(Bytes::from_static(&[0, 0, 1])),
        ]
    }

    #[test]
    fn the_length_bound_bounds_every_field() {
        for m in [full_message(), Message::default()] {
            let mut out = Vec::new();
            encode_message(&m, &mut out);
            assert!(encoded_len_max(&m) >= out.len());
            let mut deferred = Vec::new();
            stream_opaque(Arc::new(m)).write_to(&mut deferred);
            assert_eq!(deferred, out);
        }
    }

    #[test]
    fn default_message_round_trips() {
        let m = Message::default();
        assert_eq!(round_trip(&m), m);
    }

    #[test]
    fn every_field_round_trips() {
        let m = full_message();
        let back = round_trip(&m);
        // Field by field, so a failure names the field.
        assert_eq!(back.body, m.body);
        assert_eq!(back.address, m.address);
        assert_eq!(back.message_id, m.message_id);
        assert_eq!(back.correlation_id, m.correlation_id);
        assert_eq!(back.reply_to, m.reply_to);
        assert_eq!(back.content_type, m.content_type);
        assert_eq!(back.content_encoding, m.content_encoding);
        assert_eq!(back.subject, m.subject);
        assert_eq!(back.user_id, m.user_id);
        assert_eq!(back.group_id, m.group_id);
        assert_eq!(back.group_sequence, m.group_sequence);
        assert_eq!(back.priority, m.priority);
        assert_eq!(back.durable, m.durable);
        assert_eq!(back.guarantee, m.guarantee);
        assert_eq!(back.retain, m.retain);
        assert_eq!(back.creation_time, m.creation_time);
        assert_eq!(back.expiry, m.expiry);
        let names: Vec<_> = back.properties.iter().map(|(n, _)| n.to_owned()).collect();
        let want: Vec<_> = m.properties.iter().map(|(n, _)| n.to_owned()).collect();
        assert_eq!(names, want, "property order and duplicates");
        assert_eq!(back.properties, m.properties);
        assert_eq!(back.amqp_annotations, m.amqp_annotations);
        assert_eq!(back.delivery_time, m.delivery_time);
        assert_eq!(back, m);
    }

    /// A version 1 encoding (before scheduled delivery), byte for byte as
    /// that build wrote it: today's encoding of the same message without
    /// its delivery time and with version byte 1 is exactly that layout.
    #[test]
    fn a_version_1_encoding_decodes_with_no_delivery_time() {
        let mut m = full_message();
        m.delivery_time = None;
        let mut v2 = Vec::new();
        encode_message(&m, &mut v2);
        // v2 ends with the delivery time's absent presence byte.
        assert_eq!(v2.last(), Some(&0));
        let mut v1 = v2[..v2.len() - 1].to_vec();
        v1[0] = MESSAGE_CODEC_VERSION_1;
        assert_eq!(
            decode_message_exact(Bytes::from(v1.clone())),
            Ok(Arc::new(m))
        );
        // A v1 encoding followed by a delivery time is not a v1 encoding.
        v1.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert!(decode_message_exact(Bytes::from(v1)).is_err());
    }

    #[test]
    fn each_variant_round_trips() {
        for kind in [
            BodyKind::Binary,
            BodyKind::Text,
            BodyKind::AmqpValue,
            BodyKind::AmqpSequence,
            BodyKind::AmqpData,
        ] {
            let m = Message {
                body: Body {
                    kind,
                    bytes: Bytes::from_static(b"x"),
                },
                ..Message::default()
            };
            assert_eq!(round_trip(&m), m);
        }
        for id in [
            MessageId::String("id".into()),
            MessageId::Ulong(99),
            MessageId::Uuid([3; 16]),
            MessageId::Binary(Bytes::from_static(b"\xff")),
        ] {
            let m = Message {
                message_id: Some(id.clone()),
                correlation_id: Some(id),
                ..Message::default()
            };
            assert_eq!(round_trip(&m), m);
        }
        for g in [
            Guarantee::AtMostOnce,
            Guarantee::AtLeastOnce,
            Guarantee::ExactlyOnce,
        ] {
            let m = Message {
                guarantee: g,
                ..Message::default()
            };
            assert_eq!(round_trip(&m), m);
        }
        let m = Message {
            address: Some(Address::Queue("q".into())),
            ..Message::default()
        };
        assert_eq!(round_trip(&m), m);
        for v in all_values() {
            let mut properties = Properties::new();
            properties.push("k", v);
            let m = Message {
                properties,
                ..Message::default()
            };
            assert_eq!(round_trip(&m), m);
        }
    }

    #[test]
    fn nan_bits_survive() {
        let mut properties = Properties::new();
        properties.push("f", Value::Float(f32::from_bits(0x7fc0_0001)));
        let m = Message {
            properties,
            ..Message::default()
        };
        let back = round_trip(&m);
        match back.properties.get("f") {
            Some(Value::Float(f)) => assert_eq!(f.to_bits(), 0x7fc0_0001),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn truncated_and_mutated_encodings_never_panic() {
        let mut out = Vec::new();
        encode_message(&full_message(), &mut out);
        for cut in 0..out.len() {
            assert!(decode_message_exact(Bytes::copy_from_slice(&out[..cut])).is_err());
        }
        for i in 0..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0xFF;
            let _ = decode_message_exact(Bytes::from(bad));
        }
    }

    #[test]
    fn unknown_version_is_a_typed_error() {
        let mut out = Vec::new();
        encode_message(&Message::default(), &mut out);
        out[0] = 99;
        assert_eq!(
            decode_message_exact(Bytes::from(out)),
            Err(DecodeError::UnsupportedVersion {
                what: "message",
                version: 99
            })
        );
    }

    pub(crate) fn arb_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u8>().prop_map(Value::UByte),
            any::<u16>().prop_map(Value::UShort),
            any::<u32>().prop_map(Value::UInt),
            any::<u64>().prop_map(Value::ULong),
            any::<i8>().prop_map(Value::Byte),
            any::<i16>().prop_map(Value::Short),
            any::<i32>().prop_map(Value::Int),
            any::<i64>().prop_map(Value::Long),
            (-1.0e30f32..1.0e30f32).prop_map(Value::Float),
            (-1.0e300f64..1.0e300f64).prop_map(Value::Double),
            any::<char>().prop_map(Value::Char),
            any::<i64>().prop_map(Value::Timestamp),
            any::<[u8; 16]>().prop_map(Value::Uuid),
            ".{0,8}".prop_map(Value::String),
            "[a-z:]{0,8}".prop_map(Value::Symbol),
            proptest::collection::vec(any::<u8>(), 0..8).prop_map(|v| Value::Binary(v.into())),
        ]
    }

    fn arb_id() -> impl Strategy<Value = Option<MessageId>> {
        proptest::option::of(prop_oneof![
            ".{0,8}".prop_map(MessageId::String),
            any::<u64>().prop_map(MessageId::Ulong),
            any::<[u8; 16]>().prop_map(MessageId::Uuid),
            proptest::collection::vec(any::<u8>(), 0..8).prop_map(|v| MessageId::Binary(v.into())),
        ])
    }

    pub(crate) fn arb_message() -> impl Strategy<Value = Message> {
        let kind = prop_oneof![
            Just(BodyKind::Binary),
            Just(BodyKind::Text),
            Just(BodyKind::AmqpValue),
            Just(BodyKind::AmqpSequence),
            Just(BodyKind::AmqpData),
        ];
        let address = proptest::option::of(prop_oneof![
            "[a-z/]{1,8}".prop_map(Address::Topic),
            "[a-z]{1,8}".prop_map(Address::Queue),
        ]);
        let guarantee = prop_oneof![
            Just(Guarantee::AtMostOnce),
            Just(Guarantee::AtLeastOnce),
            Just(Guarantee::ExactlyOnce),
        ];
        let strings = proptest::collection::vec(proptest::option::of(".{0,6}"), 5);
        let props = proptest::collection::vec(("[ab]{0,2}", arb_value()), 0..6);
        (
            (
                kind,
                proptest::collection::vec(any::<u8>(), 0..64),
                address,
                arb_id(),
                arb_id(),
                strings,
            ),
            (
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
                proptest::option::of(any::<u32>()),
                any::<u8>(),
                any::<bool>(),
                guarantee,
                any::<bool>(),
                proptest::option::of(any::<u64>()),
                proptest::option::of(any::<u64>()),
                props,
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
                proptest::option::of(any::<u64>()),
            ),
        )
            .prop_map(
                |(
                    (kind, body, address, message_id, correlation_id, s),
                    (
                        user_id,
                        group_sequence,
                        priority,
                        durable,
                        guarantee,
                        retain,
                        creation_time,
                        expiry,
                        props,
                        ann,
                        delivery_time,
                    ),
                )| Message {
                    body: Body {
                        kind,
                        bytes: body.into(),
                    },
                    address,
                    message_id,
                    correlation_id,
                    reply_to: s[0].clone(),
                    content_type: s[1].clone(),
                    content_encoding: s[2].clone(),
                    subject: s[3].clone(),
                    user_id: user_id.map(Bytes::from),
                    group_id: s[4].clone(),
                    group_sequence,
                    priority,
                    durable,
                    guarantee,
                    retain,
                    creation_time,
                    expiry,
                    properties: props.into_iter().collect(),
                    amqp_annotations: ann.map(Bytes::from),
                    delivery_time,
                },
            )
    }

    proptest! {
        #[test]
        fn any_message_round_trips(m in arb_message()) {
            prop_assert_eq!(round_trip(&m), m);
        }

        /// A stream log takes a message unencoded only because this
        /// bound holds (`rosetta_store::log::StreamLog::append`).
        #[test]
        fn the_length_bound_bounds_the_encoding(m in arb_message()) {
            let mut out = Vec::new();
            encode_message(&m, &mut out);
            prop_assert!(encoded_len_max(&m) >= out.len());
            // Close, too: over by the optional fields' prefixes and at
            // most 16 bytes per fixed-size property value.
            prop_assert!(encoded_len_max(&m) <= out.len() + 64 + 16 * m.properties.len());
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_message_exact(Bytes::from(data));
        }
    }
}
