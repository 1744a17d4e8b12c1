//! Standard fields as named text properties, for the string-only protocols.
//!
//! AMQP 1.0 has a typed place for each of these fields; STOMP (headers) and
//! MQTT 5 (user properties) have none, so a STOMP or MQTT consumer sees
//! each field as a property with the name below, and a STOMP or MQTT
//! publisher that sets a property of that name sets the field. An
//! AMQP → STOMP → AMQP (or → MQTT → AMQP) round trip therefore keeps them;
//! typed message ids come back as strings (see `docs/conversion.md`).
//!
//! | field            | name               | text                                   | precedent                         |
//! |------------------|--------------------|----------------------------------------|-----------------------------------|
//! | message-id       | `amqp-message-id`  | [`MessageId::to_text`]                 | RabbitMQ STOMP                    |
//! | subject          | `type`             | as is                                  | ActiveMQ/Artemis STOMP (JMSType)  |
//! | user-id          | `user-id`          | UTF-8 as is, otherwise lowercase hex   | RabbitMQ STOMP                    |
//! | group-id         | `JMSXGroupID`      | as is                                  | ActiveMQ/Artemis STOMP            |
//! | group-sequence   | `JMSXGroupSeq`     | decimal                                | ActiveMQ/Artemis (JMS)            |
//! | content-encoding | `content-encoding` | as is                                  | RabbitMQ STOMP                    |
//! | creation-time    | `timestamp`        | ms since the epoch, decimal            | ActiveMQ/Artemis STOMP (JMSTimestamp) |
//! | priority         | `priority`         | decimal 0–9, only when not the default | STOMP (all three brokers)         |
//!
//! STOMP's own `message-id` on MESSAGE is the broker's ack id, so the AMQP
//! message id needs a name of its own.

use bytes::Bytes;

use crate::message::{Message, MessageId, PRIORITY_DEFAULT};
use crate::value::{Properties, Value};

/// Property name of the AMQP `message-id`.
pub const MESSAGE_ID: &str = "amqp-message-id";
/// Property name of the AMQP `subject` (JMSType).
pub const SUBJECT: &str = "type";
/// Property name of the AMQP `user-id`.
pub const USER_ID: &str = "user-id";
/// Property name of the AMQP `group-id` (JMSXGroupID).
pub const GROUP_ID: &str = "JMSXGroupID";
/// Property name of the AMQP `group-sequence` (JMSXGroupSeq).
pub const GROUP_SEQUENCE: &str = "JMSXGroupSeq";
/// Property name of the AMQP `content-encoding`.
pub const CONTENT_ENCODING: &str = "content-encoding";
/// Property name of the AMQP `creation-time` (JMSTimestamp), ms since epoch.
pub const CREATION_TIME: &str = "timestamp";
/// Property name of the priority.
pub const PRIORITY: &str = "priority";

/// Every name of the table, in the order [`field_properties`] writes them.
pub const NAMES: [&str; 8] = [
    MESSAGE_ID,
    SUBJECT,
    USER_ID,
    GROUP_ID,
    GROUP_SEQUENCE,
    CONTENT_ENCODING,
    CREATION_TIME,
    PRIORITY,
];

/// True if `name` is the property name of a standard field.
pub fn is_field_property(name: &str) -> bool {
    NAMES.contains(&name)
}

/// The standard fields `msg` sets, as (name, text) pairs in table order.
/// Unset fields are left out, and so is the default priority.
pub fn field_properties(msg: &Message) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(id) = &msg.message_id {
        out.push((MESSAGE_ID, id.to_text()));
    }
    if let Some(s) = &msg.subject {
        out.push((SUBJECT, s.clone()));
    }
    if let Some(u) = &msg.user_id {
        // The same text rule as a binary message id: UTF-8 reads as is.
        out.push((USER_ID, MessageId::Binary(u.clone()).to_text()));
    }
    if let Some(g) = &msg.group_id {
        out.push((GROUP_ID, g.clone()));
    }
    if let Some(n) = msg.group_sequence {
        out.push((GROUP_SEQUENCE, n.to_string()));
    }
    if let Some(e) = &msg.content_encoding {
        out.push((CONTENT_ENCODING, e.clone()));
    }
    if let Some(t) = msg.creation_time {
        out.push((CREATION_TIME, t.to_string()));
    }
    if msg.priority != PRIORITY_DEFAULT {
        out.push((PRIORITY, msg.priority.to_string()));
    }
    out
}

/// Moves the properties named in the table into their fields: the first
/// property of each name whose text parses sets the field and leaves the
/// property list. A value that does not parse (`JMSXGroupSeq:abc`) stays
/// an ordinary property, and so do later duplicates. A field the adapter
/// already set from a header of its own (STOMP `priority`) is not
/// overwritten. Called by the STOMP and MQTT adapters on publish.
pub fn take_field_properties(msg: &mut Message) {
    if !msg.properties.iter().any(|(n, _)| is_field_property(n)) {
        return;
    }
    let mut taken = [false; NAMES.len()];
    let mut kept = Properties::new();
    for (name, value) in std::mem::take(&mut msg.properties) {
        let slot = NAMES.iter().position(|n| *n == name);
        let used = match slot {
            Some(i) if !taken[i] => {
                let ok = set_field(msg, NAMES[i], &value);
                taken[i] = ok;
                ok
            }
            _ => false,
        };
        if !used {
            kept.push(name, value);
        }
    }
    msg.properties = kept;
}

/// Sets the field of `name` from `value`; false when the text does not
/// parse or the field is already set.
fn set_field(msg: &mut Message, name: &str, value: &Value) -> bool {
    let text = value.to_text();
    match name {
        MESSAGE_ID if msg.message_id.is_none() => {
            msg.message_id = Some(MessageId::String(text));
        }
        SUBJECT if msg.subject.is_none() => msg.subject = Some(text),
        USER_ID if msg.user_id.is_none() => msg.user_id = Some(Bytes::from(text)),
        GROUP_ID if msg.group_id.is_none() => msg.group_id = Some(text),
        GROUP_SEQUENCE if msg.group_sequence.is_none() => match text.trim().parse() {
            Ok(n) => msg.group_sequence = Some(n),
            Err(_) => return false,
        },
        CONTENT_ENCODING if msg.content_encoding.is_none() => msg.content_encoding = Some(text),
        CREATION_TIME if msg.creation_time.is_none() => match text.trim().parse() {
            Ok(t) => msg.creation_time = Some(t),
            Err(_) => return false,
        },
        // Larger values clamp to 9, as STOMP's `priority` header does.
        PRIORITY if msg.priority == PRIORITY_DEFAULT => match text.trim().parse::<u64>() {
            Ok(p) => msg.priority = u8::try_from(p.min(9)).unwrap_or(9),
            Err(_) => return false,
        },
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_become_properties_and_back() {
        let mut m = Message::text("x");
        m.message_id = Some(MessageId::Ulong(42));
        m.subject = Some("subj".into());
        m.user_id = Some(Bytes::from_static(b"alice"));
        m.group_id = Some("g".into());
        m.group_sequence = Some(3);
        m.content_encoding = Some("gzip".into());
        m.creation_time = Some(1_700_000_000_123);
        m.priority = 8;
        let props = field_properties(&m);
        assert_eq!(
            props,
            vec![
                (MESSAGE_ID, "42".to_owned()),
                (SUBJECT, "subj".to_owned()),
                (USER_ID, "alice".to_owned()),
                (GROUP_ID, "g".to_owned()),
                (GROUP_SEQUENCE, "3".to_owned()),
                (CONTENT_ENCODING, "gzip".to_owned()),
                (CREATION_TIME, "1700000000123".to_owned()),
                (PRIORITY, "8".to_owned()),
            ]
        );
        let mut back = Message::text("x");
        back.properties.push("app", "1");
        for (n, v) in props {
            back.properties.push(n, v);
        }
        take_field_properties(&mut back);
        // Typed ids come back as strings; everything else is as it was.
        assert_eq!(back.message_id, Some(MessageId::String("42".into())));
        back.message_id = m.message_id.clone();
        back.properties = Properties::new();
        let mut expect = m.clone();
        expect.properties = Properties::new();
        assert_eq!(back, expect);
    }

    #[test]
    fn unparsable_and_duplicate_values_stay_properties() {
        let mut m = Message::text("x");
        m.properties.push(GROUP_SEQUENCE, "abc");
        m.properties.push(SUBJECT, "first");
        m.properties.push(SUBJECT, "second");
        m.properties.push(PRIORITY, "high");
        m.properties.push(CREATION_TIME, "12");
        take_field_properties(&mut m);
        assert_eq!(m.group_sequence, None);
        assert_eq!(m.subject.as_deref(), Some("first"));
        assert_eq!(m.priority, PRIORITY_DEFAULT);
        assert_eq!(m.creation_time, Some(12));
        let left: Vec<_> = m.properties.iter().map(|(n, v)| (n, v.to_text())).collect();
        assert_eq!(
            left,
            vec![
                (GROUP_SEQUENCE, "abc".to_owned()),
                (SUBJECT, "second".to_owned()),
                (PRIORITY, "high".to_owned()),
            ]
        );
    }

    #[test]
    fn default_priority_and_non_utf8_user_id() {
        let mut m = Message::text("x");
        assert!(field_properties(&m).is_empty());
        m.user_id = Some(Bytes::from_static(&[0xff, 0x00]));
        assert_eq!(field_properties(&m), vec![(USER_ID, "ff00".to_owned())]);
        let mut p = Message::text("x");
        p.properties.push(PRIORITY, "15");
        take_field_properties(&mut p);
        assert_eq!(p.priority, 9);
    }
}
