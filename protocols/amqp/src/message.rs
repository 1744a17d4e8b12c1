//! AMQP message sections <-> [`rosetta_neutral::Message`].
//!
//! Decoding reads only what the broker needs and keeps bodies raw:
//!
//! | AMQP                                   | neutral                                  |
//! |----------------------------------------|------------------------------------------|
//! | one `data` section                     | `BodyKind::Binary`, payload sliced (no copy) |
//! | `amqp-value` holding a string          | `BodyKind::Text`, the UTF-8 bytes (no copy) |
//! | other `amqp-value`                     | `BodyKind::AmqpValue`, raw section bytes |
//! | `amqp-sequence` section(s)             | `BodyKind::AmqpSequence`, raw bytes      |
//! | several `data` sections                | `BodyKind::AmqpData`, raw bytes          |
//! | header durable/priority/ttl            | `durable`/`priority`/`expiry` (now+ttl)  |
//! | message-annotations                    | `amqp_annotations`, raw section bytes    |
//! | annotation `x-opt-delivery-time` (epoch ms, long or timestamp) | `delivery_time` |
//! | annotation `x-opt-delivery-delay` (ms, long) | `delivery_time` = now + delay (when no `x-opt-delivery-time`) |
//! | properties                             | the matching neutral fields; `to` is returned for anonymous relay |
//! | application-properties                 | `properties`, typed [`Value`]s           |
//!
//! On the way out, an expiry is written as both the header `ttl` (time left)
//! and the properties' `absolute-expiry-time`, since the neutral message
//! keeps only the absolute time; `to` is the address the message was
//! published to. A message replayed from the retained store (to a receiver
//! that asked with the `rosetta:retained` filter) carries the message
//! annotation `x-opt-retain: true`, as Eclipse Hono marks retained
//! messages, next to any annotations the publisher sent.
//!
//! Neutral properties named `x-opt-*` are written as message annotations,
//! not application properties: that is how the broker's own facts reach
//! an AMQP consumer, such as a dead letter's `x-opt-dead-letter-reason`
//! and `x-opt-delivery-count` (the core's `dead_letter` module), which
//! STOMP and MQTT 5 consumers see as headers and user properties under the
//! same names. The specification reserves the `x-opt-` prefix for
//! annotations, and the neutral message keeps no annotations field (the
//! journaled message codec stays as it is), so the prefix is the marker.
//! They are merged into the publisher's section, the broker's value
//! winning a clash. An AMQP publisher's own annotations are not read into
//! properties on the way in: they stay in their section, seen by AMQP
//! consumers only, as before (lifting them would show every STOMP and MQTT
//! consumer the annotations AMQP clients add for themselves, such as Qpid
//! JMS's `x-opt-jms-msg-type`, and cost a map decode per publish). A
//! consequence: an application property an AMQP publisher names `x-opt-*`
//! reaches AMQP consumers as an annotation.
//!
//! Not carried: delivery-annotations and footer (hop-by-hop by the spec),
//! `reply-to-group-id` (no neutral field), and decimal application-property
//! values, which become [`Value::Binary`] of their IEEE 754 bytes (the
//! neutral [`Value`] has no decimal type). Application properties outside
//! the spec's (a list, map, array or described value, a key that is not a
//! string; some clients send them) are dropped with a debug log, and a
//! symbol key is read as its string, rather than refusing the message.
//!
//! Encoding writes every section but the body bytes into a reusable scratch
//! buffer; the body (`Bytes` shared with the core) is then copied once,
//! straight into the output frames.

use bytes::Bytes;
use fe2o3_amqp_types::messaging::annotations::OwnedKey;

use crate::section_writer;
use fe2o3_amqp_types::messaging::{
    ApplicationProperties, Header, MessageAnnotations, MessageId as AmqpMessageId,
    Properties as AmqpProperties,
};
use fe2o3_amqp_types::primitives::{
    Binary, OrderedMap, SimpleValue, Symbol, Timestamp, Uuid, Value as AmqpAny,
};
use rosetta_neutral::{Address, Body, BodyKind, Delivery, Message, MessageId, Properties, Value};

use crate::codec::{self, CodecError};
use crate::descriptor;

const SECTION_HEADER: u64 = 0x70;
const SECTION_DELIVERY_ANNOTATIONS: u64 = 0x71;
const SECTION_MESSAGE_ANNOTATIONS: u64 = 0x72;
const SECTION_PROPERTIES: u64 = 0x73;
const SECTION_APPLICATION_PROPERTIES: u64 = 0x74;
const SECTION_DATA: u64 = 0x75;
const SECTION_AMQP_SEQUENCE: u64 = 0x76;
const SECTION_AMQP_VALUE: u64 = 0x77;
const SECTION_FOOTER: u64 = 0x78;

/// Message annotation marking a delivery replayed from the retained store.
pub(crate) const RETAIN_ANNOTATION: &str = "x-opt-retain";
/// Message annotation with a stream message's offset (RabbitMQ's name).
pub(crate) const STREAM_OFFSET_ANNOTATION: &str = "x-stream-offset";
/// Message annotation on a stream reader's first delivery after retention
/// deleted records it was owed: how many it missed (a long; Rosetta's,
/// the name STOMP's header has).
pub(crate) const STREAM_MISSED_ANNOTATION: &str = "x-stream-missed";
/// Message annotation: not to be delivered before this time (epoch ms, a
/// long or a timestamp), as Artemis and Azure Service Bus read it.
pub(crate) const DELIVERY_TIME_ANNOTATION: &str = "x-opt-delivery-time";
/// Message annotation: not to be delivered before this many ms from now
/// (a long), as Artemis reads it. `x-opt-delivery-time` wins when both
/// are set.
pub(crate) const DELIVERY_DELAY_ANNOTATION: &str = "x-opt-delivery-delay";
/// Neutral properties whose names start with this are message annotations
/// to an AMQP consumer.
const ANNOTATION_PREFIX: &str = "x-opt-";

/// Most sections one message may have: 6 non-body sections plus the body.
/// A body of thousands of tiny `data` sections is legal but pathological;
/// the bound keeps the scan short.
const SECTIONS_MAX: usize = 1024;

/// A decoded incoming message.
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The neutral message.
    pub(crate) message: Message,
    /// The properties' `to`, for anonymous-relay routing.
    pub(crate) to: Option<String>,
}

/// Decodes a complete message payload. `now_ms` turns a header ttl into an
/// absolute expiry.
pub(crate) fn decode(payload: &Bytes, now_ms: u64) -> Result<Decoded, CodecError> {
    let mut msg = Message::default();
    let mut to = None;
    let mut ttl_expiry = None;
    let mut body: Option<(u64, usize, usize, usize)> = None; // (code, start, end, count)
    let mut pos = 0usize;
    let mut sections = 0usize;
    while pos < payload.len() {
        sections += 1;
        if sections > SECTIONS_MAX {
            return Err(malformed("message", "too many sections"));
        }
        let rest = &payload[pos..];
        let len = codec::value_len(rest)?;
        let section = &rest[..len];
        let code = descriptor::descriptor_code(section)
            .ok_or_else(|| malformed("message", "section without a known descriptor"))?;
        match code {
            SECTION_HEADER => {
                let h: Header = codec::decode("header", section)?;
                msg.durable = h.durable;
                msg.priority = h.priority.0.min(9);
                ttl_expiry = h.ttl.map(|t| now_ms.saturating_add(u64::from(t)));
            }
            SECTION_DELIVERY_ANNOTATIONS | SECTION_FOOTER => {}
            SECTION_MESSAGE_ANNOTATIONS => {
                msg.amqp_annotations = Some(payload.slice(pos..pos + len));
                msg.delivery_time = scheduled_time(section, now_ms)?;
            }
            SECTION_PROPERTIES => {
                let p: AmqpProperties = codec::decode("properties", section)?;
                to = apply_properties(&mut msg, p);
            }
            SECTION_APPLICATION_PROPERTIES => {
                // The map itself, not `ApplicationProperties`: that one
                // refuses the whole message for one key or value outside
                // the spec's (string keys, simple values), which clients
                // such as python-qpid-proton and rhea send.
                let off = codec::described_value_offset(section)?;
                let map: OrderedMap<AmqpAny, AmqpAny> =
                    codec::decode("application-properties", &section[off..])?;
                msg.properties = from_application_properties(map);
            }
            SECTION_DATA | SECTION_AMQP_SEQUENCE | SECTION_AMQP_VALUE => match &mut body {
                None => body = Some((code, pos, pos + len, 1)),
                Some((first, _, end, count)) if *first == code && code != SECTION_AMQP_VALUE => {
                    *end = pos + len;
                    *count += 1;
                }
                Some(_) => return Err(malformed("message", "mixed body sections")),
            },
            _ => return Err(malformed("message", "unknown section")),
        }
        pos += len;
    }
    msg.expiry = match (msg.expiry, ttl_expiry) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    msg.body = match body {
        None => Body::binary(Bytes::new()),
        Some((SECTION_DATA, start, end, 1)) => {
            let off = codec::described_value_offset(&payload[start..end])?;
            let range = codec::variable_payload(&payload[start + off..end])
                .ok_or_else(|| malformed("data", "not a binary"))?;
            Body::binary(payload.slice(start + off + range.start..start + off + range.end))
        }
        Some((SECTION_DATA, start, end, _)) => raw(BodyKind::AmqpData, payload, start, end),
        Some((SECTION_AMQP_SEQUENCE, start, end, _)) => {
            raw(BodyKind::AmqpSequence, payload, start, end)
        }
        Some((_, start, end, _)) => {
            let off = codec::described_value_offset(&payload[start..end])?;
            let value = &payload[start + off..end];
            match value.first() {
                Some(0xa1 | 0xb1) => {
                    let range = codec::variable_payload(value)
                        .ok_or_else(|| malformed("amqp-value", "bad string"))?;
                    std::str::from_utf8(&value[range.clone()])
                        .map_err(|_| malformed("amqp-value", "string is not UTF-8"))?;
                    Body::text(payload.slice(start + off + range.start..start + off + range.end))
                }
                _ => raw(BodyKind::AmqpValue, payload, start, end),
            }
        }
    };
    Ok(Decoded { message: msg, to })
}

/// The delivery time the message annotations ask for, if any. Annotations
/// that do not decode as a map are carried raw as before and ask for
/// nothing; a scheduling annotation of the wrong type, or negative, is
/// malformed (the delivery is rejected with `amqp:decode-error`). A time
/// too far ahead is the core's to refuse (`amqp:resource-limit-exceeded`).
fn scheduled_time(section: &[u8], now_ms: u64) -> Result<Option<u64>, CodecError> {
    let Ok(annotations) = codec::decode::<MessageAnnotations>("message-annotations", section)
    else {
        return Ok(None);
    };
    let get = |name: &str| annotations.0.get(&OwnedKey::from(Symbol::from(name)));
    if let Some(at) = get(DELIVERY_TIME_ANNOTATION) {
        return annotation_ms(DELIVERY_TIME_ANNOTATION, at).map(Some);
    }
    match get(DELIVERY_DELAY_ANNOTATION) {
        Some(delay) => {
            let delay = annotation_ms(DELIVERY_DELAY_ANNOTATION, delay)?;
            Ok(Some(now_ms.saturating_add(delay)))
        }
        None => Ok(None),
    }
}

/// A scheduling annotation's milliseconds: a non-negative integer or a
/// timestamp.
fn annotation_ms(name: &str, value: &AmqpAny) -> Result<u64, CodecError> {
    let ms = match value {
        AmqpAny::Long(v) => u64::try_from(*v).ok(),
        AmqpAny::Int(v) => u64::try_from(*v).ok(),
        AmqpAny::Ulong(v) => Some(*v),
        AmqpAny::Uint(v) => Some(u64::from(*v)),
        AmqpAny::Timestamp(t) => u64::try_from(t.milliseconds()).ok(),
        _ => None,
    };
    ms.ok_or_else(|| CodecError::Malformed {
        what: "message-annotations",
        detail: format!("`{name}` must be a non-negative long or a timestamp (ms)"),
    })
}

fn raw(kind: BodyKind, payload: &Bytes, start: usize, end: usize) -> Body {
    Body {
        kind,
        bytes: payload.slice(start..end),
    }
}

fn malformed(what: &'static str, detail: &str) -> CodecError {
    CodecError::Malformed {
        what,
        detail: detail.to_owned(),
    }
}

fn apply_properties(msg: &mut Message, p: AmqpProperties) -> Option<String> {
    msg.message_id = p.message_id.map(from_amqp_id);
    msg.correlation_id = p.correlation_id.map(from_amqp_id);
    msg.user_id = p.user_id.map(|b| Bytes::from(b.into_vec()));
    msg.subject = p.subject;
    msg.reply_to = p.reply_to.map(|r| match Address::parse_destination(&r) {
        Ok(a) => a.to_destination(),
        Err(_) => r,
    });
    msg.content_type = p.content_type.map(Symbol::into_inner);
    msg.content_encoding = p.content_encoding.map(Symbol::into_inner);
    msg.expiry = p
        .absolute_expiry_time
        .and_then(|t| u64::try_from(t.milliseconds()).ok());
    msg.creation_time = p
        .creation_time
        .and_then(|t| u64::try_from(t.milliseconds()).ok());
    msg.group_id = p.group_id;
    msg.group_sequence = p.group_sequence;
    p.to
}

fn from_amqp_id(id: AmqpMessageId) -> MessageId {
    match id {
        AmqpMessageId::Ulong(v) => MessageId::Ulong(v),
        AmqpMessageId::Uuid(u) => MessageId::Uuid(u.into_inner()),
        AmqpMessageId::Binary(b) => MessageId::Binary(Bytes::from(b.into_vec())),
        AmqpMessageId::String(s) => MessageId::String(s),
    }
}

/// The neutral properties of an application-properties map. The spec
/// allows string keys and simple values only; a symbol key is taken as its
/// string (it is one to every other protocol), and an entry with any other
/// key, or a list, map, array or described value, is dropped with a debug
/// log: the neutral [`Value`] has no such type, and refusing the whole
/// message for one property would lose it.
fn from_application_properties(map: OrderedMap<AmqpAny, AmqpAny>) -> Properties {
    map.into_inner()
        .into_iter()
        .filter_map(|(k, v)| {
            let key = match k {
                AmqpAny::String(s) => s,
                AmqpAny::Symbol(s) => s.into_inner(),
                other => {
                    tracing::debug!(key = ?other, "dropping application property with a non-string key");
                    return None;
                }
            };
            let value = match v {
                AmqpAny::Null => Value::Null,
                AmqpAny::Bool(b) => Value::Bool(b),
                AmqpAny::Ubyte(v) => Value::UByte(v),
                AmqpAny::Ushort(v) => Value::UShort(v),
                AmqpAny::Uint(v) => Value::UInt(v),
                AmqpAny::Ulong(v) => Value::ULong(v),
                AmqpAny::Byte(v) => Value::Byte(v),
                AmqpAny::Short(v) => Value::Short(v),
                AmqpAny::Int(v) => Value::Int(v),
                AmqpAny::Long(v) => Value::Long(v),
                AmqpAny::Float(v) => Value::Float(v.into_inner()),
                AmqpAny::Double(v) => Value::Double(v.into_inner()),
                AmqpAny::Decimal32(d) => Value::Binary(Bytes::copy_from_slice(d.as_inner())),
                AmqpAny::Decimal64(d) => Value::Binary(Bytes::copy_from_slice(d.as_inner())),
                AmqpAny::Decimal128(d) => Value::Binary(Bytes::copy_from_slice(d.as_inner())),
                AmqpAny::Char(c) => Value::Char(c),
                AmqpAny::Timestamp(t) => Value::Timestamp(t.milliseconds()),
                AmqpAny::Uuid(u) => Value::Uuid(u.into_inner()),
                AmqpAny::Binary(b) => Value::Binary(Bytes::from(b.into_vec())),
                AmqpAny::String(s) => Value::String(s),
                AmqpAny::Symbol(s) => Value::Symbol(s.into_inner()),
                AmqpAny::List(_) | AmqpAny::Map(_) | AmqpAny::Array(_) | AmqpAny::Described(_) => {
                    tracing::debug!(property = %key, "dropping application property that is not a simple value");
                    return None;
                }
            };
            Some((key, value))
        })
        .collect()
}

fn to_simple_value(v: &Value) -> SimpleValue {
    match v {
        Value::Null => SimpleValue::Null,
        Value::Bool(b) => SimpleValue::Bool(*b),
        Value::UByte(v) => SimpleValue::Ubyte(*v),
        Value::UShort(v) => SimpleValue::Ushort(*v),
        Value::UInt(v) => SimpleValue::Uint(*v),
        Value::ULong(v) => SimpleValue::Ulong(*v),
        Value::Byte(v) => SimpleValue::Byte(*v),
        Value::Short(v) => SimpleValue::Short(*v),
        Value::Int(v) => SimpleValue::Int(*v),
        Value::Long(v) => SimpleValue::Long(*v),
        Value::Float(v) => SimpleValue::Float((*v).into()),
        Value::Double(v) => SimpleValue::Double((*v).into()),
        Value::Char(c) => SimpleValue::Char(*c),
        Value::Timestamp(t) => SimpleValue::Timestamp(Timestamp::from_milliseconds(*t)),
        Value::Uuid(u) => SimpleValue::Uuid(Uuid::from(*u)),
        Value::String(s) => SimpleValue::String(s.clone()),
        Value::Symbol(s) => SimpleValue::Symbol(Symbol::from(s.as_str())),
        Value::Binary(b) => SimpleValue::Binary(Binary::from(b.to_vec())),
    }
}

/// Writes every section of `delivery`'s message except the body bytes into
/// `head` (cleared first) and returns the body bytes that follow it.
pub(crate) fn encode_head<'d>(
    head: &mut Vec<u8>,
    delivery: &'d Delivery,
    now_ms: u64,
) -> Result<&'d [u8], serde_amqp::Error> {
    head.clear();
    let m = &*delivery.message;
    let ttl = m
        .expiry
        .map(|e| u32::try_from(e.saturating_sub(now_ms).max(1)).unwrap_or(u32::MAX));
    section_writer::write_header(
        head,
        section_writer::HeaderFields {
            durable: m.durable,
            priority: m.priority,
            ttl,
            first_acquirer: !delivery.redelivered,
            delivery_count: delivery.delivery_count,
        },
    );
    let broker_annotations = m.properties.iter().any(|(k, _)| is_annotation(k));
    if delivery.from_retained || broker_annotations || delivery.stream.is_some() {
        write_merged_annotations(head, m, delivery.from_retained, delivery.stream)?;
    } else if let Some(ann) = &m.amqp_annotations {
        head.extend_from_slice(ann);
    }
    if section_writer::has_properties(m) {
        section_writer::write_properties(head, m);
    }
    if !m.properties.is_empty() {
        let mut map = OrderedMap::with_capacity(m.properties.len());
        for (k, v) in m.properties.iter().filter(|(k, _)| !is_annotation(k)) {
            // AMQP maps have unique keys: the first value wins, as for
            // `Properties::get`.
            if !map.contains_key(k) {
                map.insert(k.to_owned(), to_simple_value(v));
            }
        }
        codec::encode_into(head, &ApplicationProperties(map))?;
    }
    let body = &m.body.bytes[..];
    match m.body.kind {
        BodyKind::Binary => {
            head.extend_from_slice(&[0x00, 0x53, SECTION_DATA as u8]);
            codec::write_binary_header(head, body.len());
        }
        BodyKind::Text => {
            head.extend_from_slice(&[0x00, 0x53, SECTION_AMQP_VALUE as u8]);
            codec::write_string_header(head, body.len());
        }
        BodyKind::AmqpValue | BodyKind::AmqpSequence | BodyKind::AmqpData => {}
    }
    Ok(body)
}

/// Whether a neutral property is written as a message annotation rather
/// than an application property: its name has the `x-opt-` prefix the
/// specification reserves for annotations (the broker's dead-letter
/// reason and count are such properties; see the module docs).
fn is_annotation(name: &str) -> bool {
    name.starts_with(ANNOTATION_PREFIX)
}

/// Writes the publisher's message annotations (if any) with what the
/// broker adds: [`RETAIN_ANNOTATION`] for a retained replay, and every
/// `x-opt-*` property (its first value; over the publisher's annotation of
/// the same name, the broker's being the newer). Annotations that do not
/// decode (they were carried raw, never checked) are written as they came,
/// without the additions.
fn write_merged_annotations(
    head: &mut Vec<u8>,
    m: &Message,
    retained: bool,
    stream: Option<rosetta_neutral::StreamPosition>,
) -> Result<(), serde_amqp::Error> {
    let mut ann = match m.amqp_annotations.as_deref() {
        None => MessageAnnotations::default(),
        Some(raw) => match codec::decode::<MessageAnnotations>("message-annotations", raw) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "message annotations kept as they came, without the broker's");
                head.extend_from_slice(raw);
                return Ok(());
            }
        },
    };
    if retained {
        ann.0.insert(
            OwnedKey::from(Symbol::from(RETAIN_ANNOTATION)),
            AmqpAny::Bool(true),
        );
    }
    if let Some(p) = stream {
        // RabbitMQ's annotation of a stream message's offset (a long).
        ann.0.insert(
            OwnedKey::from(Symbol::from(STREAM_OFFSET_ANNOTATION)),
            AmqpAny::Long(i64::try_from(p.offset).unwrap_or(i64::MAX)),
        );
        ann.0.insert(
            OwnedKey::from(Symbol::from(rosetta_neutral::STREAM_TIMESTAMP)),
            AmqpAny::Timestamp(Timestamp::from_milliseconds(
                i64::try_from(p.timestamp_ms).unwrap_or(i64::MAX),
            )),
        );
        if p.missed > 0 {
            ann.0.insert(
                OwnedKey::from(Symbol::from(STREAM_MISSED_ANNOTATION)),
                AmqpAny::Long(i64::try_from(p.missed).unwrap_or(i64::MAX)),
            );
        }
        if let Some(n) = p.partition {
            ann.0.insert(
                OwnedKey::from(Symbol::from(rosetta_neutral::STREAM_PARTITION)),
                AmqpAny::Long(i64::from(n)),
            );
        }
    }
    let mut added: Vec<&str> = Vec::new();
    for (k, v) in m.properties.iter().filter(|(k, _)| is_annotation(k)) {
        if !added.contains(&k) {
            added.push(k);
            ann.0.insert(
                OwnedKey::from(Symbol::from(k)),
                AmqpAny::from(to_simple_value(v)),
            );
        }
    }
    codec::encode_into(head, &ann)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fe2o3_amqp_types::messaging::{AmqpSequence, AmqpValue, Data, MessageAnnotations};
    use fe2o3_amqp_types::primitives::Value as AmqpValueAny;
    use rosetta_neutral::{ConsumerId, DeliveryTag, MatchInfo};

    use super::*;

    fn enc<T: serde::Serialize>(out: &mut Vec<u8>, v: &T) {
        codec::encode_into(out, v).unwrap();
    }

    fn delivery(m: Message) -> Delivery {
        Delivery {
            consumer: ConsumerId(1),
            tag: DeliveryTag(1),
            message: Arc::new(m),
            delivery_count: 2,
            redelivered: true,
            from_retained: false,
            matched: MatchInfo::default(),
            annotation: None,
            charge: rosetta_neutral::DeliveryCharge::none(),
            stream: None,
        }
    }

    /// A payload of message annotations `(name, value)` and a data body.
    fn annotated(entries: Vec<(&str, AmqpValueAny)>) -> Bytes {
        let mut ann = OrderedMap::new();
        for (name, value) in entries {
            ann.insert(OwnedKey::from(Symbol::from(name)), value);
        }
        let mut p = Vec::new();
        enc(&mut p, &MessageAnnotations(ann));
        enc(&mut p, &Data(Binary::from(b"x".to_vec())));
        Bytes::from(p)
    }

    #[test]
    fn delivery_time_and_delay_annotations_schedule_the_message() {
        let now = 1_700_000_000_000u64;
        let at = |entries| decode(&annotated(entries), now).map(|d| d.message.delivery_time);
        let time = DELIVERY_TIME_ANNOTATION;
        let delay = DELIVERY_DELAY_ANNOTATION;
        assert_eq!(
            at(vec![(time, AmqpValueAny::Long(now as i64 + 5))]).ok(),
            Some(Some(now + 5))
        );
        assert_eq!(
            at(vec![(
                time,
                AmqpValueAny::Timestamp(Timestamp::from_milliseconds(now as i64 + 7))
            )])
            .ok(),
            Some(Some(now + 7))
        );
        assert_eq!(
            at(vec![(delay, AmqpValueAny::Long(1_500))]).ok(),
            Some(Some(now + 1_500))
        );
        assert_eq!(
            at(vec![
                (delay, AmqpValueAny::Long(9)),
                (time, AmqpValueAny::Long(now as i64 + 1))
            ])
            .ok(),
            Some(Some(now + 1)),
            "the time wins over the delay"
        );
        assert_eq!(
            at(vec![("x-opt-other", AmqpValueAny::Long(1))]).ok(),
            Some(None)
        );
        for bad in [
            (delay, AmqpValueAny::Long(-1)),
            (delay, AmqpValueAny::String("soon".into())),
            (time, AmqpValueAny::Bool(true)),
        ] {
            let shown = format!("{bad:?}");
            assert!(
                matches!(at(vec![bad]), Err(CodecError::Malformed { .. })),
                "{shown}"
            );
        }
    }

    #[test]
    fn python_qpid_protons_delivery_delay_schedules_the_message() {
        // `Message(body='x', annotations={symbol('x-opt-delivery-delay'): 1000})`
        // as python-qpid-proton encodes it: an empty header, the
        // annotations as a map32, an empty properties list.
        let hex = "00537045005372d10000002300000002a314782d6f70742d64656c69766572792d64656c61798100000000000003e800537345005377a10178";
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let d = decode(&Bytes::from(bytes), 5).unwrap();
        assert_eq!(d.message.delivery_time, Some(1_005));
    }

    fn full_payload() -> Vec<u8> {
        let mut p = Vec::new();
        enc(
            &mut p,
            &Header {
                durable: true,
                priority: fe2o3_amqp_types::messaging::Priority(7),
                ttl: Some(1000),
                first_acquirer: false,
                delivery_count: 0,
            },
        );
        let mut ann = OrderedMap::new();
        ann.insert(
            fe2o3_amqp_types::messaging::annotations::OwnedKey::from(Symbol::from("x-opt-a")),
            AmqpValueAny::Int(5),
        );
        enc(&mut p, &MessageAnnotations(ann));
        enc(
            &mut p,
            &AmqpProperties {
                message_id: Some(AmqpMessageId::Uuid(Uuid::from([7u8; 16]))),
                user_id: Some(Binary::from(b"u".to_vec())),
                to: Some("/topic/a/b".into()),
                subject: Some("s".into()),
                reply_to: Some("replies".into()),
                correlation_id: Some(AmqpMessageId::Ulong(9)),
                content_type: Some(Symbol::from("text/plain")),
                content_encoding: Some(Symbol::from("gzip")),
                absolute_expiry_time: Some(Timestamp::from_milliseconds(5_000)),
                creation_time: Some(Timestamp::from_milliseconds(100)),
                group_id: Some("g".into()),
                group_sequence: Some(3),
                reply_to_group_id: None,
            },
        );
        let mut ap = OrderedMap::new();
        ap.insert("k".to_string(), SimpleValue::Int(-1));
        ap.insert("s".to_string(), SimpleValue::String("v".into()));
        enc(&mut p, &ApplicationProperties(ap));
        p
    }

    /// Keys and values the spec does not allow in application-properties
    /// (python-qpid-proton and rhea send them when an application puts
    /// them there) cost only those entries, not the message.
    #[test]
    fn application_properties_outside_the_spec_are_dropped_not_refused() {
        use fe2o3_amqp_types::primitives::Array;
        let mut map = OrderedMap::new();
        map.insert(AmqpAny::String("ok".into()), AmqpAny::Int(1));
        map.insert(AmqpAny::Symbol(Symbol::from("sym")), AmqpAny::Bool(true));
        map.insert(
            AmqpAny::String("list".into()),
            AmqpAny::List(vec![AmqpAny::Int(1)]),
        );
        map.insert(
            AmqpAny::String("map".into()),
            AmqpAny::Map(OrderedMap::new()),
        );
        map.insert(
            AmqpAny::String("array".into()),
            AmqpAny::Array(Array(vec![AmqpAny::Int(2)])),
        );
        map.insert(AmqpAny::Int(7), AmqpAny::Int(3));
        let section = serde_amqp::described::Described {
            descriptor: serde_amqp::descriptor::Descriptor::Code(SECTION_APPLICATION_PROPERTIES),
            value: AmqpAny::Map(map),
        };
        let mut p = Vec::new();
        enc(&mut p, &section);
        enc(&mut p, &AmqpValue("body".to_string()));
        let d = decode(&Bytes::from(p), 0).expect("the message is taken");
        let props: Vec<(&str, &Value)> = d.message.properties.iter().collect();
        assert_eq!(
            props,
            vec![("ok", &Value::Int(1)), ("sym", &Value::Bool(true))]
        );
        assert_eq!(d.message.body, Body::text("body"));
    }

    #[test]
    fn decodes_all_sections_and_slices_one_data_section() {
        let mut p = full_payload();
        enc(&mut p, &Data(Binary::from(b"hello".to_vec())));
        let payload = Bytes::from(p);
        let d = decode(&payload, 1_000).unwrap();
        let m = &d.message;
        assert_eq!(d.to.as_deref(), Some("/topic/a/b"));
        assert!(m.durable);
        assert_eq!(m.priority, 7);
        // ttl 1000 at now 1000 -> 2000, earlier than the absolute 5000.
        assert_eq!(m.expiry, Some(2_000));
        assert_eq!(m.message_id, Some(MessageId::Uuid([7; 16])));
        assert_eq!(m.correlation_id, Some(MessageId::Ulong(9)));
        assert_eq!(m.reply_to.as_deref(), Some("/queue/replies"));
        assert_eq!(m.content_type.as_deref(), Some("text/plain"));
        assert_eq!(m.content_encoding.as_deref(), Some("gzip"));
        assert_eq!(m.group_id.as_deref(), Some("g"));
        assert_eq!(m.group_sequence, Some(3));
        assert_eq!(m.creation_time, Some(100));
        assert_eq!(m.user_id.as_deref(), Some(&b"u"[..]));
        assert_eq!(m.properties.get("k"), Some(&Value::Int(-1)));
        assert_eq!(m.properties.get("s"), Some(&Value::from("v")));
        assert!(m.amqp_annotations.is_some());
        assert_eq!(m.body.kind, BodyKind::Binary);
        assert_eq!(&m.body.bytes[..], b"hello");
        // Zero copy: the body points into the payload buffer.
        let base = payload.as_ptr() as usize;
        let body = m.body.bytes.as_ptr() as usize;
        assert!(body >= base && body < base + payload.len());
    }

    #[test]
    fn body_kinds() {
        let mut p = Vec::new();
        enc(&mut p, &AmqpValue("héllo".to_string()));
        let d = decode(&Bytes::from(p), 0).unwrap();
        assert_eq!(d.message.body, Body::text("héllo"));

        let mut p = Vec::new();
        enc(&mut p, &AmqpValue(42i32));
        let raw = p.clone();
        let d = decode(&Bytes::from(p), 0).unwrap();
        assert_eq!(d.message.body.kind, BodyKind::AmqpValue);
        assert_eq!(&d.message.body.bytes[..], &raw[..]);

        let mut p = Vec::new();
        enc(&mut p, &AmqpSequence(vec![1i32, 2]));
        enc(&mut p, &AmqpSequence(vec![3i32]));
        let raw = p.clone();
        let d = decode(&Bytes::from(p), 0).unwrap();
        assert_eq!(d.message.body.kind, BodyKind::AmqpSequence);
        assert_eq!(&d.message.body.bytes[..], &raw[..]);

        let mut p = Vec::new();
        enc(&mut p, &Data(Binary::from(b"a".to_vec())));
        enc(&mut p, &Data(Binary::from(b"b".to_vec())));
        let d = decode(&Bytes::from(p), 0).unwrap();
        assert_eq!(d.message.body.kind, BodyKind::AmqpData);
    }

    #[test]
    fn malformed_messages_are_errors() {
        let mut p = Vec::new();
        enc(&mut p, &AmqpValue(1i32));
        enc(&mut p, &Data(Binary::from(b"x".to_vec())));
        assert!(decode(&Bytes::from(p), 0).is_err());
        assert!(decode(&Bytes::from_static(&[0x00, 0x53, 0x75, 0xa0, 9]), 0).is_err());
        assert!(decode(&Bytes::from_static(&[0x40]), 0).is_err());
        assert!(decode(&Bytes::from_static(&[0x00, 0x53, 0x77, 0xa1, 1, 0xff]), 0).is_err());
    }

    #[test]
    fn round_trip_through_encode() {
        let mut p = full_payload();
        enc(&mut p, &Data(Binary::from(b"payload".to_vec())));
        let d = decode(&Bytes::from(p), 1_000).unwrap();
        let mut m = d.message;
        m.address = Some(Address::Topic("a/b".into()));
        let original = m.clone();
        let del = delivery(m);
        let mut head = Vec::new();
        let body = encode_head(&mut head, &del, 1_500).unwrap();
        let mut wire = head.clone();
        wire.extend_from_slice(body);
        let back = decode(&Bytes::from(wire.clone()), 1_500).unwrap();
        let mut got = back.message;
        got.address = Some(Address::Topic("a/b".into()));
        assert_eq!(back.to.as_deref(), Some("/topic/a/b"));
        assert_eq!(got, original);
        // The header carries the delivery's count and acquirer flag.
        let h: Header = codec::decode("header", &wire).unwrap();
        assert_eq!(h.delivery_count, 2);
        assert!(!h.first_acquirer);
        assert_eq!(h.ttl, Some(500));
    }

    #[test]
    fn retained_replays_are_annotated() {
        let key = OwnedKey::from(Symbol::from(RETAIN_ANNOTATION));
        let annotations = |wire: &[u8]| -> Option<MessageAnnotations> {
            let len = codec::value_len(wire).unwrap();
            codec::decode("message-annotations", &wire[len..]).ok()
        };
        // Without annotations of its own.
        let mut del = delivery(Message::text("r"));
        del.from_retained = true;
        let mut head = Vec::new();
        encode_head(&mut head, &del, 0).unwrap();
        let ann = annotations(&head).expect("annotations after the header");
        assert_eq!(ann.0.get(&key), Some(&AmqpAny::Bool(true)));
        // With the publisher's annotations: kept, marker added.
        let mut p = full_payload();
        enc(&mut p, &Data(Binary::from(b"x".to_vec())));
        let mut del = delivery(decode(&Bytes::from(p), 0).unwrap().message);
        del.from_retained = true;
        encode_head(&mut head, &del, 0).unwrap();
        let ann = annotations(&head).expect("annotations after the header");
        assert_eq!(ann.0.get(&key), Some(&AmqpAny::Bool(true)));
        let opt = OwnedKey::from(Symbol::from("x-opt-a"));
        assert_eq!(ann.0.get(&opt), Some(&AmqpAny::Int(5)));
        // A live delivery is not marked.
        del.from_retained = false;
        encode_head(&mut head, &del, 0).unwrap();
        let ann = annotations(&head).expect("annotations after the header");
        assert_eq!(ann.0.get(&key), None);
    }

    /// The broker's `x-opt-*` properties (a dead letter's reason and
    /// count) reach an AMQP consumer as message annotations, merged with
    /// the publisher's own (the broker's value winning a clash), and not as
    /// application properties.
    #[test]
    fn x_opt_properties_become_message_annotations() {
        let mut p = full_payload();
        enc(&mut p, &Data(Binary::from(b"x".to_vec())));
        let mut m = decode(&Bytes::from(p), 0).unwrap().message;
        m.properties.push("x-opt-dead-letter-reason", "rejected");
        m.properties.push("x-opt-delivery-count", Value::UInt(3));
        m.properties.push("x-opt-a", Value::Int(6));
        let mut head = Vec::new();
        let del = delivery(m);
        let body = encode_head(&mut head, &del, 0).unwrap();
        let mut wire = head.clone();
        wire.extend_from_slice(body);
        let len = codec::value_len(&wire).unwrap();
        let ann: MessageAnnotations =
            codec::decode("message-annotations", &wire[len..]).expect("annotations");
        let get = |k: &str| ann.0.get(&OwnedKey::from(Symbol::from(k))).cloned();
        assert_eq!(
            get("x-opt-dead-letter-reason"),
            Some(AmqpAny::String("rejected".into()))
        );
        assert_eq!(get("x-opt-delivery-count"), Some(AmqpAny::Uint(3)));
        assert_eq!(get("x-opt-a"), Some(AmqpAny::Int(6)), "the broker's wins");
        let back = decode(&Bytes::from(wire), 0).unwrap().message;
        let names: Vec<&str> = back.properties.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["k", "s"], "application properties without x-opt-*");
        // No broker annotations and no retained marker: the publisher's
        // section is written as it came.
        let mut plain = Vec::new();
        enc(&mut plain, &MessageAnnotations(OrderedMap::new()));
        let m = Message {
            amqp_annotations: Some(Bytes::from(plain.clone())),
            ..Message::text("t")
        };
        encode_head(&mut head, &delivery(m), 0).unwrap();
        let len = codec::value_len(&head).unwrap();
        assert_eq!(&head[len..len + plain.len()], &plain[..]);
    }

    #[test]
    fn text_and_raw_bodies_encode_back() {
        let del = delivery(Message::text("hi"));
        let mut head = Vec::new();
        let body = encode_head(&mut head, &del, 0).unwrap();
        let mut wire = head.clone();
        wire.extend_from_slice(body);
        let back = decode(&Bytes::from(wire), 0).unwrap();
        assert_eq!(back.message.body, Body::text("hi"));

        let mut raw = Vec::new();
        enc(&mut raw, &AmqpValue(42i64));
        let m = Message {
            body: Body {
                kind: BodyKind::AmqpValue,
                bytes: Bytes::from(raw.clone()),
            },
            ..Message::default()
        };
        let del = delivery(m);
        let body = encode_head(&mut head, &del, 0).unwrap();
        assert_eq!(body, &raw[..]);
    }
}
