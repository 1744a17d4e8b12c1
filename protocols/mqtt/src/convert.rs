//! MQTT PUBLISH <-> neutral [`Message`].
//!
//! Mapping (see `docs/conversion.md` for the cross-protocol view):
//!
//! | MQTT 5                    | Message                                   |
//! |---------------------------|-------------------------------------------|
//! | payload, format indicator | `body` (`Text` when indicator 1)          |
//! | QoS                       | `guarantee`; `durable` when QoS > 0       |
//! | RETAIN                    | `retain`                                  |
//! | user properties           | `properties` as `Value::String`, in order |
//! | user properties `amqp-message-id`, `type`, `user-id`, `JMSXGroupID`, `JMSXGroupSeq`, `content-encoding`, `timestamp`, `priority` | the standard fields ([`rosetta_neutral::fields`]); written after the other user properties on delivery |
//! | content type              | `content_type`                            |
//! | response topic `t`        | `reply_to` = `/topic/t`                   |
//! | response topic `$queue/q` | `reply_to` = `/queue/q` (and back: a queue reply-to is delivered as `$queue/q`, which an MQTT PUBLISH sends to the queue) |
//! | correlation data          | `correlation_id` = `MessageId::Binary`    |
//! | message expiry interval   | `expiry` (absolute ms); remaining on send |

use bytes::Bytes;
use mqttbytes::v5::PublishProperties;
use rosetta_neutral::address::{validate_topic_name, QUEUE_PREFIX, TOPIC_PREFIX};
use rosetta_neutral::fields::{field_properties, take_field_properties};
use rosetta_neutral::{Address, Body, BodyKind, Guarantee, Message, MessageId, Properties, Value};

use crate::codec::Props;
use crate::error::MqttError;

/// Builds the neutral message for an inbound PUBLISH.
pub(crate) fn inbound_message(
    qos: u8,
    retain: bool,
    props: Props,
    payload: Bytes,
    now_ms: u64,
) -> Result<Message, MqttError> {
    let kind = if props.payload_format_indicator == Some(1) {
        if std::str::from_utf8(&payload).is_err() {
            return Err(MqttError::PayloadFormatInvalid);
        }
        BodyKind::Text
    } else {
        BodyKind::Binary
    };
    let reply_to = match props.response_topic {
        Some(t) => {
            if validate_topic_name(&t).is_err() {
                return Err(MqttError::Protocol("response topic is not a topic name"));
            }
            let address = Address::from_mqtt_topic(&t)
                .map_err(|_| MqttError::Protocol("response topic names a bad queue"))?;
            Some(address.to_destination())
        }
        None => None,
    };
    let properties: Properties = props
        .user_properties
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    let mut message = Message {
        body: Body {
            kind,
            bytes: payload,
        },
        correlation_id: props.correlation_data.map(MessageId::Binary),
        reply_to,
        content_type: props.content_type,
        durable: qos > 0,
        guarantee: Guarantee::from_qos(qos).unwrap_or(Guarantee::AtMostOnce),
        retain,
        expiry: props
            .message_expiry_interval_s
            .map(|s| now_ms.saturating_add(u64::from(s) * 1000)),
        properties,
        ..Message::default()
    };
    take_field_properties(&mut message);
    Ok(message)
}

/// MQTT strings and binary fields carry a 16-bit length; mqttbytes' writers
/// truncate the length of longer ones silently (a corrupt packet), so such
/// values (possible from AMQP or STOMP publishers) are left out.
fn fits(len: usize) -> bool {
    len <= usize::from(u16::MAX)
}

/// The Message Expiry Interval of a delivery: the time left, rounded to the
/// nearest second (at least 1, as an expired message is never sent).
/// Rounding up would turn the millisecond noise between the publisher's and
/// the subscriber's clock readings into a whole second, so a message
/// delivered at once could show more lifetime than it was published with.
fn remaining_lifetime_s(msg: &Message, now_ms: u64) -> Option<u32> {
    msg.expiry.map(|e| {
        let ms = e.saturating_sub(now_ms).saturating_add(500);
        u32::try_from(ms / 1000).unwrap_or(u32::MAX).max(1)
    })
}

/// The MQTT 5 properties of a delivery; `None` when there are none.
pub(crate) fn outbound_properties(
    msg: &Message,
    subscription_ids: &[u32],
    now_ms: u64,
) -> Option<PublishProperties> {
    let fields = field_properties(msg);
    let props = PublishProperties {
        payload_format_indicator: (msg.body.kind == BodyKind::Text).then_some(1),
        message_expiry_interval: remaining_lifetime_s(msg, now_ms),
        topic_alias: None,
        response_topic: msg
            .reply_to
            .as_ref()
            .map(|r| response_topic(r))
            .filter(|t| fits(t.len())),
        correlation_data: msg
            .correlation_id
            .as_ref()
            .map(MessageId::to_bytes)
            .filter(|b| fits(b.len())),
        // A property named like a standard field the message sets would
        // read as that field on a republish: the field wins.
        user_properties: msg
            .properties
            .iter()
            .filter(|(k, _)| !fields.iter().any(|(f, _)| f == k))
            .map(|(k, v)| (k.to_owned(), v.to_text()))
            .chain(fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())))
            .filter(|(k, v)| fits(k.len()) && fits(v.len()))
            .chain(msg.body.kind.amqp_section_marker().map(|m| {
                (
                    rosetta_neutral::message::AMQP_BODY_PROPERTY.to_owned(),
                    m.to_owned(),
                )
            }))
            .collect(),
        subscription_identifiers: subscription_ids
            .iter()
            .filter_map(|&id| usize::try_from(id).ok())
            .collect(),
        content_type: msg
            .content_type
            .clone()
            .or_else(|| {
                msg.body
                    .kind
                    .amqp_section_marker()
                    .map(|_| rosetta_neutral::message::AMQP_BODY_CONTENT_TYPE.to_owned())
            })
            .filter(|c| fits(c.len())),
    };
    let empty = props.payload_format_indicator.is_none()
        && props.message_expiry_interval.is_none()
        && props.response_topic.is_none()
        && props.correlation_data.is_none()
        && props.user_properties.is_empty()
        && props.subscription_identifiers.is_empty()
        && props.content_type.is_none();
    (!empty).then_some(props)
}

/// `/topic/x` becomes `x`, `/queue/q` becomes `$queue/q` (an MQTT
/// responder's PUBLISH there reaches the queue); foreign names pass
/// through as written.
fn response_topic(reply_to: &str) -> String {
    if reply_to.starts_with(TOPIC_PREFIX) || reply_to.starts_with(QUEUE_PREFIX) {
        if let Ok(address) = Address::parse_destination(reply_to) {
            return address.to_mqtt_topic();
        }
    }
    reply_to.to_owned()
}

/// The MQTT topic a message is delivered under.
pub(crate) fn delivery_topic(msg: &Message) -> Option<std::borrow::Cow<'_, str>> {
    match msg.address.as_ref()? {
        Address::Topic(t) => Some(std::borrow::Cow::Borrowed(t)),
        // Sent to a queue and consumed through `$queue/<name>`.
        queue @ Address::Queue(_) => Some(std::borrow::Cow::Owned(queue.to_mqtt_topic())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v5_properties_round_trip() {
        let props = Props {
            payload_format_indicator: Some(1),
            message_expiry_interval_s: Some(10),
            content_type: Some("text/plain".into()),
            response_topic: Some("replies/1".into()),
            correlation_data: Some(Bytes::from_static(b"\x00\x01")),
            user_properties: vec![("a".into(), "1".into()), ("a".into(), "2".into())],
            ..Props::default()
        };
        let msg = inbound_message(1, true, props, Bytes::from_static(b"hi"), 1_000).expect("ok");
        assert_eq!(msg.body.kind, BodyKind::Text);
        assert_eq!(msg.reply_to.as_deref(), Some("/topic/replies/1"));
        assert_eq!(msg.expiry, Some(11_000));
        assert!(msg.durable && msg.retain);
        let out = outbound_properties(&msg, &[3, 7], 5_500).expect("props");
        assert_eq!(out.message_expiry_interval, Some(6));
        // Never more than published, never 0 while not expired.
        let early = outbound_properties(&msg, &[], 999).expect("props");
        assert_eq!(early.message_expiry_interval, Some(10));
        let late = outbound_properties(&msg, &[], 10_800).expect("props");
        assert_eq!(late.message_expiry_interval, Some(1));
        assert_eq!(out.response_topic.as_deref(), Some("replies/1"));
        assert_eq!(out.correlation_data.as_deref(), Some(&b"\x00\x01"[..]));
        assert_eq!(out.subscription_identifiers, vec![3, 7]);
        assert_eq!(
            out.user_properties,
            vec![("a".into(), "1".into()), ("a".into(), "2".into())]
        );
        assert_eq!(response_topic("/queue/q"), "$queue/q");
        assert_eq!(response_topic("/queue/$temp/3"), "$queue/$temp/3");
        assert_eq!(response_topic("amqp://elsewhere/x"), "amqp://elsewhere/x");
    }

    #[test]
    fn queue_response_topic_is_a_queue_reply_to() {
        let props = Props {
            response_topic: Some("$queue/$temp/9".into()),
            ..Props::default()
        };
        let msg = inbound_message(1, false, props, Bytes::new(), 0).expect("ok");
        assert_eq!(msg.reply_to.as_deref(), Some("/queue/$temp/9"));
        let bad = Props {
            response_topic: Some("$queue/".into()),
            ..Props::default()
        };
        assert!(inbound_message(1, false, bad, Bytes::new(), 0).is_err());
    }

    #[test]
    fn standard_fields_are_user_properties_both_ways() {
        let props = Props {
            user_properties: vec![
                ("a".into(), "1".into()),
                ("amqp-message-id".into(), "m-1".into()),
                ("type".into(), "subj".into()),
                ("JMSXGroupSeq".into(), "x".into()),
                ("priority".into(), "7".into()),
            ],
            ..Props::default()
        };
        let msg = inbound_message(1, false, props, Bytes::new(), 0).expect("ok");
        assert_eq!(msg.message_id, Some(MessageId::String("m-1".into())));
        assert_eq!(msg.subject.as_deref(), Some("subj"));
        assert_eq!(msg.priority, 7);
        assert_eq!(msg.group_sequence, None);
        let out = outbound_properties(&msg, &[], 0).expect("props");
        assert_eq!(
            out.user_properties,
            vec![
                ("a".into(), "1".into()),
                ("JMSXGroupSeq".into(), "x".into()),
                ("amqp-message-id".into(), "m-1".into()),
                ("type".into(), "subj".into()),
                ("priority".into(), "7".into()),
            ]
        );
    }

    /// Queue semantics read these fields: an MQTT 5 publisher's group and
    /// priority must reach them (and leave the user properties), so an
    /// AMQP or STOMP consumer of the queue is grouped and ordered by them.
    #[test]
    fn group_and_priority_user_properties_set_the_fields() {
        let props = Props {
            user_properties: vec![
                ("JMSXGroupID".into(), "order-17".into()),
                ("JMSXGroupSeq".into(), "3".into()),
                ("priority".into(), "9".into()),
                ("colour".into(), "green".into()),
            ],
            ..Props::default()
        };
        let msg = inbound_message(1, false, props, Bytes::new(), 0).expect("ok");
        assert_eq!(msg.group_id.as_deref(), Some("order-17"));
        assert_eq!(msg.group_sequence, Some(3));
        assert_eq!(msg.priority, 9);
        let left: Vec<_> = msg.properties.iter().map(|(n, _)| n.to_owned()).collect();
        assert_eq!(left, ["colour"]);
    }

    #[test]
    fn values_too_long_for_mqtt_are_left_out() {
        let mut msg = Message::text("x");
        msg.properties.push("k", "v".repeat(70_000));
        msg.properties.push("ok", "1");
        msg.content_type = Some("c".repeat(70_000));
        let out = outbound_properties(&msg, &[], 0).expect("props");
        assert_eq!(out.user_properties, vec![("ok".into(), "1".into())]);
        assert_eq!(out.content_type, None);
    }

    #[test]
    fn bad_utf8_with_text_indicator_is_rejected() {
        let props = Props {
            payload_format_indicator: Some(1),
            ..Props::default()
        };
        let r = inbound_message(0, false, props, Bytes::from_static(b"\xFF"), 0);
        assert_eq!(r, Err(MqttError::PayloadFormatInvalid));
    }
}
