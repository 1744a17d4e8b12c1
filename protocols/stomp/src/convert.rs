//! STOMP headers ↔ the neutral [`Message`].
//!
//! | STOMP header        | neutral field                                      |
//! |---------------------|----------------------------------------------------|
//! | `content-type`      | `content_type`                                     |
//! | `reply-to`          | `reply_to` (`/temp-queue/x` → `/queue/<core name>`)|
//! | `correlation-id`    | `correlation_id` (string)                          |
//! | `expires`           | `expiry` (ms since epoch; `0` = never)             |
//! | `priority`          | `priority` (0–9, larger values clamp to 9)         |
//! | `persistent:true`   | `durable`                                          |
//! | `AMQ_SCHEDULED_DELAY` | `delivery_time` = now + the delay (ms, as ActiveMQ; at most `DELIVERY_DELAY_MAX_MS`) |
//! | `amqp-message-id`, `type`, `user-id`, `JMSXGroupID`, `JMSXGroupSeq`, `content-encoding`, `timestamp` | the standard fields of [`rosetta_neutral::fields`] |
//! | body                | `body.bytes`, exactly; kind below                  |
//! | any other header    | `properties`, as `Value::String`, in order         |
//!
//! Body kind: `Text` when the body is valid UTF-8 and either the content
//! type is `text/*`, or no `content-length` and no content type were given
//! (a NUL-terminated body is text by construction in most clients);
//! otherwise `Binary`. A
//! `text/*` body that is not UTF-8 stays `Binary`, because `Text` promises
//! UTF-8 to other protocols.
//!
//! On MESSAGE the same headers are written back, plus `subscription`,
//! `message-id`, `destination`, `ack` (1.2), `content-length`, on
//! redelivery `redelivered:true` and `delivery-count` (failed delivery
//! attempts before this one, the AMQP meaning), and `retained:true` on a
//! message replayed from the retained store to a subscription that asked
//! for it. A text body without a content type is announced as
//! [`TEXT_CONTENT_TYPE`], so the consumer knows it is UTF-8 text.
//! Properties whose names collide with these headers are not written (they
//! would be ignored by the "first header wins" rule or confuse the client).

use rosetta_neutral::address::{QUEUE_PREFIX, TOPIC_PREFIX};
use rosetta_neutral::fields::{field_properties, take_field_properties};
use rosetta_neutral::message::{DELIVERY_DELAY_MAX_MS, PRIORITY_DEFAULT};
use std::sync::Arc;

use rosetta_neutral::{
    Address, Body, BodyKind, ConsumerId, Delivery, DeliveryCharge, DeliveryTag, Message, MessageId,
    StreamPosition, Value,
};

use crate::consumer_options::BROWSER_HEADER;
use crate::encoder::FrameWriter;
use crate::error::StompError;
use crate::frame::{Command, Frame, KnownHeader, Version};
use crate::subscription::{AckId, AckMode, Subscription};

/// SEND header scheduling the message this many ms from now (ActiveMQ's
/// name; its other scheduling headers, period, repeat and cron, are not
/// supported and are carried as plain properties).
pub(crate) const SCHEDULED_DELAY_HEADER: &str = "AMQ_SCHEDULED_DELAY";

/// SEND headers with a meaning of their own (not copied to properties),
/// as a set of [`KnownHeader::bit`]s: whether a header is reserved is a
/// bit test on what the parser found it to be, not a comparison of its
/// name (for every header of every SEND).
const SEND_RESERVED_BITS: u32 = KnownHeader::Destination.bit()
    | KnownHeader::ContentLength.bit()
    | KnownHeader::ContentType.bit()
    | KnownHeader::ReplyTo.bit()
    | KnownHeader::CorrelationId.bit()
    | KnownHeader::Expires.bit()
    | KnownHeader::Priority.bit()
    | KnownHeader::Persistent.bit()
    | KnownHeader::Transaction.bit()
    | KnownHeader::Receipt.bit()
    | KnownHeader::ScheduledDelay.bit()
    // Declares the destination a stream (RabbitMQ), not a property.
    | KnownHeader::QueueType.bit();

/// Headers the server writes on MESSAGE itself.
const MESSAGE_RESERVED: [&str; 12] = [
    "subscription",
    "message-id",
    "destination",
    "ack",
    "content-length",
    "content-type",
    "reply-to",
    "correlation-id",
    "expires",
    "priority",
    "persistent",
    "redelivered",
];

/// Header naming the failed delivery attempts of a redelivered message.
pub(crate) const DELIVERY_COUNT_HEADER: &str = "delivery-count";

/// MESSAGE header marking a delivery replayed from the retained store.
pub(crate) const RETAINED_HEADER: &str = "retained";

/// Content type announced for a text body (MQTT payload-format-indicator 1,
/// an AMQP string, a STOMP text body) that came without one: the body is
/// valid UTF-8 by the neutral `Text` contract, and nothing more is known.
pub(crate) const TEXT_CONTENT_TYPE: &str = "text/plain;charset=utf-8";

/// Builds the neutral message of a SEND. `reply_to` is the already
/// resolved `reply-to` header; `now_ms` (epoch ms, read only for a SEND
/// that asks for a delay: not a clock read per message) turns a scheduled delay
/// into a delivery time.
pub(crate) fn message_from_send(
    frame: Frame,
    reply_to: Option<String>,
    now_ms: impl FnOnce() -> u64,
) -> Result<Message, StompError> {
    let delivery_time = match frame.known(KnownHeader::ScheduledDelay) {
        None => None,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(ms) if ms <= DELIVERY_DELAY_MAX_MS => Some(now_ms().saturating_add(ms)),
            _ => return Err(bad(SCHEDULED_DELAY_HEADER, v)),
        },
    };
    let content_type = frame.known(KnownHeader::ContentType).map(str::to_owned);
    let expiry = match frame.known(KnownHeader::Expires) {
        None => None,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(ms) => Some(ms),
            Err(_) => return Err(bad("expires", v)),
        },
    };
    let priority = match frame.known(KnownHeader::Priority) {
        None => PRIORITY_DEFAULT,
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(|p| u8::try_from(p.min(9)).unwrap_or(9))
            .map_err(|_| bad("priority", v))?,
    };
    let durable = frame
        .known(KnownHeader::Persistent)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let correlation_id = frame
        .known(KnownHeader::CorrelationId)
        .map(|v| MessageId::String(v.to_owned()));
    let properties = frame
        .headers
        .iter_except(SEND_RESERVED_BITS)
        .map(|(n, v)| (n.to_owned(), Value::String(v.to_owned())))
        .collect();
    let declared_text = content_type.as_deref().is_some_and(|ct| {
        ct.trim_start()
            .get(..5)
            .is_some_and(|p| p.eq_ignore_ascii_case("text/"))
    });
    // A declared non-text type (application/octet-stream, …) is the
    // publisher's word that the bytes are binary, even when they happen to
    // be UTF-8 and came without content-length.
    let declared_other = content_type.is_some() && !declared_text;
    // Only a body that may be text is checked for UTF-8 (a pass over it).
    let may_be_text = declared_text || (!frame.has_content_length && !declared_other);
    let kind = if may_be_text && std::str::from_utf8(&frame.body).is_ok() {
        BodyKind::Text
    } else {
        BodyKind::Binary
    };
    let mut message = Message {
        body: Body {
            kind,
            bytes: frame.body,
        },
        content_type,
        reply_to,
        correlation_id,
        expiry,
        priority,
        durable,
        properties,
        delivery_time,
        ..Message::default()
    };
    take_field_properties(&mut message);
    Ok(message)
}

fn bad(header: &'static str, value: &str) -> StompError {
    StompError::BadHeader {
        header,
        value: value.to_owned(),
    }
}

/// MESSAGE header with a stream message's offset (RabbitMQ's name).
pub(crate) const STREAM_OFFSET_HEADER: &str = crate::consumer_options::STREAM_OFFSET_HEADER;
/// MESSAGE header, on the first delivery after retention cut under the
/// reader, with how many records it missed (Rosetta).
pub(crate) const STREAM_MISSED_HEADER: &str = "x-stream-missed";

/// What a MESSAGE frame needs of a [`Delivery`]: kept (unencoded) while
/// a delivery waits for the transport, about half a `Delivery`'s size
/// (a reader may have its whole credit waiting).
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) consumer: ConsumerId,
    pub(crate) tag: DeliveryTag,
    pub(crate) message: Arc<Message>,
    pub(crate) delivery_count: u32,
    pub(crate) redelivered: bool,
    pub(crate) from_retained: bool,
    pub(crate) stream: Option<StreamPosition>,
    /// Held until the frame is written (the connection's budget).
    pub(crate) _charge: DeliveryCharge,
}

impl From<Delivery> for Outgoing {
    fn from(d: Delivery) -> Self {
        Outgoing {
            consumer: d.consumer,
            tag: d.tag,
            message: d.message,
            delivery_count: d.delivery_count,
            redelivered: d.redelivered,
            from_retained: d.from_retained,
            stream: d.stream,
            _charge: d.charge,
        }
    }
}

/// Writes the MESSAGE frame for `delivery` on `sub`, straight into
/// `out` (nothing is allocated for the headers the broker itself writes).
pub(crate) fn write_message(
    out: &mut Vec<u8>,
    version: Version,
    sub: &Subscription,
    delivery: &Outgoing,
) {
    let m = &delivery.message;
    // Written once, copied into `message-id` and `ack`.
    let mut ack_id = [0u8; 48];
    let ack_id = AckId(delivery.consumer, delivery.tag).write_to(&mut ack_id);
    let mut w = FrameWriter::new(out, version, Command::Message);
    if sub.id_given {
        w.header_own("subscription", sub.id());
    }
    w.header_with("message-id", |o| o.extend_from_slice(ack_id));
    match &m.address {
        Some(Address::Topic(t)) => w.header_prefixed("destination", TOPIC_PREFIX, t),
        Some(Address::Queue(q)) => w.header_prefixed("destination", QUEUE_PREFIX, q),
        None => w.header_own("destination", sub.destination()),
    };
    if version == Version::V1_2 && sub.ack != AckMode::Auto {
        w.header_with("ack", |o| o.extend_from_slice(ack_id));
    }
    let section = m.body.kind.amqp_section_marker();
    match (&m.content_type, section) {
        (Some(ct), _) => {
            w.header_own("content-type", ct);
        }
        (None, Some(_)) => {
            w.header_own(
                "content-type",
                rosetta_neutral::message::AMQP_BODY_CONTENT_TYPE,
            );
        }
        (None, None) if m.body.kind == BodyKind::Text => {
            w.header_own("content-type", TEXT_CONTENT_TYPE);
        }
        (None, None) => {}
    }
    if let Some(marker) = section {
        w.header_own(rosetta_neutral::message::AMQP_BODY_PROPERTY, marker);
    }
    if let Some(r) = &m.reply_to {
        w.header_own("reply-to", r);
    }
    if let Some(c) = &m.correlation_id {
        w.header_own("correlation-id", &c.to_text());
    }
    if let Some(e) = m.expiry {
        w.header_u64("expires", e);
    }
    // `priority` (when not the default) is one of the standard fields.
    let fields = field_properties(m);
    for (name, value) in &fields {
        w.header_own(name, value);
    }
    if m.durable {
        w.header_const("persistent", "true");
    }
    if delivery.redelivered {
        w.header_const("redelivered", "true");
        w.header_u64(DELIVERY_COUNT_HEADER, u64::from(delivery.delivery_count));
    }
    if delivery.from_retained {
        w.header_const(RETAINED_HEADER, "true");
    }
    if let Some(p) = delivery.stream {
        w.header_u64(STREAM_OFFSET_HEADER, p.offset);
        w.header_u64(rosetta_neutral::STREAM_TIMESTAMP, p.timestamp_ms);
        if p.missed > 0 {
            w.header_u64(STREAM_MISSED_HEADER, p.missed);
        }
        if let Some(n) = p.partition {
            w.header_u64(rosetta_neutral::STREAM_PARTITION, u64::from(n));
        }
    }
    for (name, value) in m.properties.iter() {
        let written = MESSAGE_RESERVED.contains(&name)
            || name == DELIVERY_COUNT_HEADER
            || (name == RETAINED_HEADER && delivery.from_retained)
            || fields.iter().any(|(f, _)| *f == name);
        if !written {
            w.header(name, &value.to_text());
        }
    }
    w.finish(&m.body.bytes);
}

/// `message-id` of the end-of-browse MESSAGE, as ActiveMQ sends it: it
/// names no message and is never acknowledged.
pub(crate) const END_OF_BROWSE_MESSAGE_ID: &str = "0";

/// Writes the MESSAGE that ends a browse (ActiveMQ's form): `subscription`,
/// `browser:end`, the subscribed `destination`, `message-id:0`, no body.
pub(crate) fn write_end_of_browse(out: &mut Vec<u8>, version: Version, sub: &Subscription) {
    let mut w = FrameWriter::new(out, version, Command::Message);
    if sub.id_given {
        w.header("subscription", sub.id());
    }
    w.header(BROWSER_HEADER, "end");
    w.header("destination", sub.destination());
    w.header("message-id", END_OF_BROWSE_MESSAGE_ID);
    w.finish(b"");
}
