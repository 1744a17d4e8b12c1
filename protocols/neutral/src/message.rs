//! The protocol-neutral message.
//!
//! Every adapter turns what arrives on its wire into a [`Message`] before the
//! core sees it, and turns a [`Message`] back into its wire format on
//! delivery. The type carries the union of what MQTT 5, STOMP 1.2 and
//! AMQP 1.0 can express, so that no hop loses information it could keep.
//!
//! The payload is a [`bytes::Bytes`]: the core wraps each message in an
//! `Arc` once, so fan-out to many subscribers is a reference-count bump,
//! never a copy of the body.

use bytes::Bytes;

use crate::address::Address;
use crate::value::Properties;

/// What kind of body a message carries. Decides how a consumer of another
/// protocol sees the payload (see `docs/conversion.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BodyKind {
    /// Opaque bytes: an MQTT payload without the UTF-8 indicator, a STOMP
    /// body with a non-text content type, one AMQP `data` section.
    Binary,
    /// UTF-8 text: MQTT payload-format-indicator 1, a STOMP text body, an
    /// AMQP `amqp-value` holding a string. `bytes` is the UTF-8 encoding.
    Text,
    /// An AMQP `amqp-value` of a non-string type; `bytes` is the section's
    /// original AMQP encoding (descriptor included).
    AmqpValue,
    /// One or more AMQP `amqp-sequence` sections in their original encoding.
    AmqpSequence,
    /// Several AMQP `data` sections in their original encoding.
    AmqpData,
}

/// Property (MQTT user property, STOMP header) that tells an MQTT or STOMP
/// consumer its payload is a raw AMQP body section, and which kind. The
/// payload is then the section's AMQP encoding, unchanged.
pub const AMQP_BODY_PROPERTY: &str = "x-amqp-body";
/// Content type given to a raw AMQP body section when the publisher set
/// none, so generic consumers do not mistake it for plain bytes.
pub const AMQP_BODY_CONTENT_TYPE: &str = "application/vnd.amqp-section";

impl BodyKind {
    /// For consumers of protocols without AMQP body sections: the value of
    /// [`AMQP_BODY_PROPERTY`] for a structured AMQP body, `None` for binary
    /// and text bodies, which need no marker. This is the conversion
    /// contract's one rule for structured bodies (docs/conversion.md):
    /// they are delivered raw and marked, never silently reinterpreted.
    pub fn amqp_section_marker(self) -> Option<&'static str> {
        match self {
            BodyKind::Binary | BodyKind::Text => None,
            BodyKind::AmqpValue => Some("amqp-value"),
            BodyKind::AmqpSequence => Some("amqp-sequence"),
            BodyKind::AmqpData => Some("amqp-data"),
        }
    }
}

/// The body of a message: its kind and its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Body {
    /// How to interpret `bytes`.
    pub kind: BodyKind,
    /// The payload, or the raw AMQP section encoding for the `Amqp*` kinds.
    pub bytes: Bytes,
}

impl Body {
    /// An opaque binary body.
    pub fn binary(bytes: impl Into<Bytes>) -> Self {
        Self {
            kind: BodyKind::Binary,
            bytes: bytes.into(),
        }
    }

    /// A UTF-8 text body.
    pub fn text(text: impl Into<Bytes>) -> Self {
        Self {
            kind: BodyKind::Text,
            bytes: text.into(),
        }
    }
}

impl Default for Body {
    fn default() -> Self {
        Self::binary(Bytes::new())
    }
}

/// A message or correlation identifier. AMQP allows four types; MQTT and
/// STOMP only ever produce strings (MQTT correlation data is binary).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MessageId {
    /// AMQP `string`, STOMP `message-id`/`correlation-id`.
    String(String),
    /// AMQP `ulong`.
    Ulong(u64),
    /// AMQP `uuid`.
    Uuid([u8; 16]),
    /// AMQP `binary`, MQTT 5 correlation data.
    Binary(Bytes),
}

impl MessageId {
    /// The identifier as text, for protocols whose ids are strings.
    /// Binary ids that are valid UTF-8 read as that text; other binary ids
    /// are hex-encoded.
    pub fn to_text(&self) -> String {
        match self {
            MessageId::String(s) => s.clone(),
            MessageId::Ulong(v) => v.to_string(),
            MessageId::Uuid(v) => crate::value::format_uuid(v),
            MessageId::Binary(b) => match std::str::from_utf8(b) {
                Ok(s) => s.to_owned(),
                Err(_) => crate::value::Value::Binary(b.clone()).to_text(),
            },
        }
    }

    /// The identifier as bytes, for MQTT 5 correlation data.
    pub fn to_bytes(&self) -> Bytes {
        match self {
            MessageId::Binary(b) => b.clone(),
            other => Bytes::from(other.to_text()),
        }
    }
}

/// How hard the publisher asked the broker to try. MQTT QoS maps one to one;
/// STOMP and unsettled AMQP sends are at-least-once; pre-settled AMQP sends
/// are at-most-once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Guarantee {
    /// Fire and forget (MQTT QoS 0, AMQP pre-settled).
    AtMostOnce,
    /// Acknowledged, may repeat (MQTT QoS 1, STOMP, AMQP unsettled).
    #[default]
    AtLeastOnce,
    /// MQTT QoS 2.
    ExactlyOnce,
}

impl Guarantee {
    /// The MQTT QoS level of this guarantee.
    pub fn qos(self) -> u8 {
        match self {
            Guarantee::AtMostOnce => 0,
            Guarantee::AtLeastOnce => 1,
            Guarantee::ExactlyOnce => 2,
        }
    }

    /// The guarantee for an MQTT QoS level; `None` for an invalid level.
    pub fn from_qos(qos: u8) -> Option<Self> {
        match qos {
            0 => Some(Guarantee::AtMostOnce),
            1 => Some(Guarantee::AtLeastOnce),
            2 => Some(Guarantee::ExactlyOnce),
            _ => None,
        }
    }
}

/// Property that carries a message's dedup id: the STOMP SEND header, the
/// MQTT 5 user property and the AMQP application property of that name.
/// See [`Message::dedup_id`].
pub const DEDUP_ID_PROPERTY: &str = "dedup-id";

/// Default priority (AMQP 1.0 and JMS both use 4).
pub const PRIORITY_DEFAULT: u8 = 4;

/// A protocol-neutral message.
///
/// Optional fields are `None` when the publisher did not set them; adapters
/// must not invent values for them. Times are milliseconds since the Unix
/// epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The body.
    pub body: Body,
    /// The address the publisher sent to. Set by the core at publish time.
    pub address: Option<Address>,
    /// Message id (AMQP `message-id`, STOMP `message-id` as sent).
    pub message_id: Option<MessageId>,
    /// Correlation id (AMQP `correlation-id`, STOMP `correlation-id`,
    /// MQTT 5 correlation data).
    pub correlation_id: Option<MessageId>,
    /// Where replies go, in the canonical destination form of
    /// [`Address::to_destination`] (`/topic/a/b`, `/queue/q`), or as the
    /// publisher wrote it when it is not a Rosetta address.
    pub reply_to: Option<String>,
    /// MIME content type.
    pub content_type: Option<String>,
    /// Content encoding (AMQP `content-encoding`).
    pub content_encoding: Option<String>,
    /// AMQP `subject`.
    pub subject: Option<String>,
    /// AMQP `user-id` as sent by the publisher.
    pub user_id: Option<Bytes>,
    /// AMQP `group-id` / JMSXGroupID.
    pub group_id: Option<String>,
    /// AMQP `group-sequence`.
    pub group_sequence: Option<u32>,
    /// Priority 0–9; [`PRIORITY_DEFAULT`] when unset.
    pub priority: u8,
    /// Persistent: kept in the journal by durable queues.
    pub durable: bool,
    /// How the publisher asked for delivery.
    pub guarantee: Guarantee,
    /// Published with the MQTT retain flag.
    pub retain: bool,
    /// Creation time (ms since epoch).
    pub creation_time: Option<u64>,
    /// Absolute expiry time (ms since epoch). Never delivered after it.
    pub expiry: Option<u64>,
    /// User properties in order, duplicates kept.
    pub properties: Properties,
    /// AMQP message-annotations section in its original encoding, carried
    /// through untouched for AMQP consumers.
    pub amqp_annotations: Option<Bytes>,
    /// Scheduled delivery (ms since epoch): the message is not delivered
    /// before this time (AMQP `x-opt-delivery-time`/`x-opt-delivery-delay`,
    /// STOMP `AMQ_SCHEDULED_DELAY`, MQTT `$delayed/<seconds>/`). `None`, or
    /// a time already past, delivers at once.
    pub delivery_time: Option<u64>,
}

impl Default for Message {
    fn default() -> Self {
        Self {
            body: Body::default(),
            address: None,
            message_id: None,
            correlation_id: None,
            reply_to: None,
            content_type: None,
            content_encoding: None,
            subject: None,
            user_id: None,
            group_id: None,
            group_sequence: None,
            priority: PRIORITY_DEFAULT,
            durable: false,
            guarantee: Guarantee::AtLeastOnce,
            retain: false,
            creation_time: None,
            expiry: None,
            properties: Properties::new(),
            amqp_annotations: None,
            delivery_time: None,
        }
    }
}

impl Message {
    /// A message with a binary body and defaults elsewhere.
    pub fn binary(bytes: impl Into<Bytes>) -> Self {
        Self {
            body: Body::binary(bytes),
            ..Self::default()
        }
    }

    /// A message with a text body and defaults elsewhere.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            body: Body::text(text.into()),
            ..Self::default()
        }
    }

    /// True if the message has expired at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expiry.is_some_and(|e| e <= now_ms)
    }

    /// True if the message is scheduled for later than `now_ms`: it waits
    /// and is not delivered yet.
    pub fn is_scheduled(&self, now_ms: u64) -> bool {
        self.delivery_time.is_some_and(|t| t > now_ms)
    }

    /// Remaining lifetime in whole seconds at `now_ms`, rounded up, for the
    /// MQTT 5 message expiry interval on delivery.
    pub fn remaining_lifetime_s(&self, now_ms: u64) -> Option<u32> {
        self.expiry.map(|e| {
            let ms = e.saturating_sub(now_ms);
            u32::try_from(ms.div_ceil(1000)).unwrap_or(u32::MAX)
        })
    }

    /// The id a queue with a dedup window compares: the property
    /// [`DEDUP_ID_PROPERTY`] when present (a typed AMQP value reads as its
    /// text, binary stays binary), else the message id (AMQP
    /// `properties.message-id`, any of its types). One notion for every
    /// protocol, so a string id matches itself whichever adapter it came
    /// through.
    pub fn dedup_id(&self) -> Option<MessageId> {
        match self.properties.get(DEDUP_ID_PROPERTY) {
            Some(crate::value::Value::Binary(b)) => Some(MessageId::Binary(b.clone())),
            Some(v) => Some(MessageId::String(v.to_text())),
            None => self.message_id.clone(),
        }
    }

    /// Approximate bytes of memory the message holds, for memory budgets.
    pub fn memory_size(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.body.bytes.len()
            + self.properties.heap_size()
            + self.reply_to.as_ref().map_or(0, String::len)
            + self.content_type.as_ref().map_or(0, String::len)
            + self.amqp_annotations.as_ref().map_or(0, Bytes::len)
    }
}

/// Longest delay a publisher may schedule a message for: one year, as a
/// bound on how long a message may sit in a queue's timer index before
/// anyone can see it (a mistyped delay in seconds-as-milliseconds would
/// otherwise hold a message for decades). Every adapter refuses a delay
/// past it with its protocol's error, and the core refuses it too.
pub const DELIVERY_DELAY_MAX_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// Milliseconds since the Unix epoch, from the system clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
