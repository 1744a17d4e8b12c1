//! A receiver's attach → the neutral [`ConsumerOptions`], in the
//! conventions of ActiveMQ Artemis and Qpid:
//!
//! | attach                                              | option      |
//! |-----------------------------------------------------|-------------|
//! | source filter described `apache.org:selector-filter:string` (or code `0x0000468C00000004`), any key (Qpid: `jms-selector`, Proton: `selector`), a string | `selector` |
//! | link property `exclusive`, a boolean                | `exclusive` |
//! | link property `priority`, an integer in `i32`       | `priority`  |
//! | source `distribution-mode = copy` on a queue        | `browse`    |
//! | link property `visibility-timeout`, an unsigned int, ms (1 to `VISIBILITY_TIMEOUT_MS_MAX`) | `visibility_timeout_ms` (Rosetta) |
//! | source filter `rabbitmq:stream-offset-spec` (key or descriptor): `"first"`, `"last"`, `"next"`, an offset (ulong), or a timestamp (ms) | `stream.offset` (RabbitMQ); the stream is declared at first use |
//! | the container id and link name, `<container>/<link>` | `stream.group`, when the address is a stream |
//!
//! The selector entry is echoed in the reply's source filter only once
//! the core has accepted it (spec 3.5.3: the reply names the filters in
//! force); a selector the core cannot parse refuses the link with
//! `amqp:invalid-field`. A property of the wrong type is refused the same
//! way rather than ignored: the client asked for something it would not
//! get.

use fe2o3_amqp_types::definitions::Fields;
use fe2o3_amqp_types::messaging::FilterSet;
use fe2o3_amqp_types::primitives::{Symbol, Value};
use rosetta_neutral::{ConsumerOptions, StreamOffset, VISIBILITY_TIMEOUT_MS_MAX};
use serde_amqp::descriptor::Descriptor;

use crate::error::AmqpError;

/// Descriptor name of the JMS selector filter (AMQP JMS mapping, as
/// Qpid and Artemis use it).
pub(crate) const SELECTOR_FILTER_NAME: &str = "apache.org:selector-filter:string";
/// Its numeric descriptor.
pub(crate) const SELECTOR_FILTER_CODE: u64 = 0x0000_468C_0000_0004;
/// Link property asking for an exclusive consumer (Artemis).
pub(crate) const EXCLUSIVE_PROPERTY: &str = "exclusive";
/// Link property giving the consumer's priority (Artemis).
pub(crate) const PRIORITY_PROPERTY: &str = "priority";
/// Link property giving the consumer's lease (visibility timeout), in ms.
pub(crate) const VISIBILITY_TIMEOUT_PROPERTY: &str = "visibility-timeout";

/// Filter name and descriptor of RabbitMQ's stream offset filter: where a
/// stream reader starts. Its value is the string `first`, `last` or
/// `next`, an offset (ulong, or any unsigned or non-negative integer), or
/// an AMQP timestamp (ms since the epoch).
pub(crate) const STREAM_OFFSET_FILTER_NAME: &str = "rabbitmq:stream-offset-spec";

/// A source's stream offset filter.
#[derive(Debug)]
pub(crate) struct StreamOffsetFilter {
    /// The filter-set entry, echoed in the reply (the filter is in force).
    pub(crate) entry: (Symbol, Value),
    /// Where to start.
    pub(crate) offset: StreamOffset,
}

/// The stream offset filter of a source, found by its descriptor or its
/// key; a value of another shape refuses the link (`invalid-field`).
pub(crate) fn stream_offset_filter(
    filter: Option<&FilterSet>,
) -> Result<Option<StreamOffsetFilter>, AmqpError> {
    let is_offset = |k: &Symbol, v: &Value| {
        k.as_str() == STREAM_OFFSET_FILTER_NAME
            || matches!(v, Value::Described(d) if matches!(&d.descriptor, Descriptor::Name(n) if n.as_str() == STREAM_OFFSET_FILTER_NAME))
    };
    let Some((key, value)) = filter.and_then(|f| f.iter().find(|(k, v)| is_offset(k, v))) else {
        return Ok(None);
    };
    let inner = match value {
        Value::Described(d) => &d.value,
        v => v,
    };
    let bad = || {
        AmqpError::InvalidField(format!(
            "{STREAM_OFFSET_FILTER_NAME} must be \"first\", \"last\", \"next\", an offset or a timestamp: {inner:?}"
        ))
    };
    let offset = match inner {
        Value::String(s) | Value::Symbol(Symbol(s)) => match s.as_str() {
            "first" => StreamOffset::First,
            "last" => StreamOffset::Last,
            "next" => StreamOffset::Next,
            _ => return Err(bad()),
        },
        Value::Timestamp(t) => {
            StreamOffset::TimestampMs(u64::try_from(t.milliseconds()).map_err(|_| bad())?)
        }
        v => StreamOffset::Offset(unsigned_u64(v).ok_or_else(bad)?),
    };
    Ok(Some(StreamOffsetFilter {
        entry: (key.clone(), value.clone()),
        offset,
    }))
}

fn unsigned_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Ulong(n) => Some(*n),
        Value::Uint(n) => Some(u64::from(*n)),
        Value::Ushort(n) => Some(u64::from(*n)),
        Value::Ubyte(n) => Some(u64::from(*n)),
        Value::Long(n) => u64::try_from(*n).ok(),
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// A source's selector filter.
#[derive(Debug)]
pub(crate) struct SelectorFilter {
    /// The filter-set entry, to echo once the selector is applied.
    pub(crate) entry: (Symbol, Value),
    /// The selector text.
    pub(crate) text: String,
}

/// The selector filter of a source, if it has one.
pub(crate) fn selector_filter(
    filter: Option<&FilterSet>,
) -> Result<Option<SelectorFilter>, AmqpError> {
    let Some((key, value)) = filter.and_then(|f| f.iter().find(|(_, v)| is_selector(v))) else {
        return Ok(None);
    };
    let Value::Described(d) = value else {
        return Ok(None);
    };
    match &d.value {
        Value::String(text) => Ok(Some(SelectorFilter {
            entry: (key.clone(), value.clone()),
            text: text.clone(),
        })),
        other => Err(AmqpError::InvalidField(format!(
            "selector filter {key:?} is not a string: {other:?}"
        ))),
    }
}

fn is_selector(value: &Value) -> bool {
    match value {
        Value::Described(d) => match &d.descriptor {
            Descriptor::Name(n) => n.as_str() == SELECTOR_FILTER_NAME,
            Descriptor::Code(c) => *c == SELECTOR_FILTER_CODE,
        },
        _ => false,
    }
}

/// The options of a receiver: `selector` from [`selector_filter`],
/// `browse` from the source's distribution mode, exclusivity and priority
/// from the link properties.
pub(crate) fn consumer_options(
    properties: Option<&Fields>,
    selector: Option<String>,
    browse: bool,
) -> Result<ConsumerOptions, AmqpError> {
    let property = |name: &str| properties.and_then(|p| p.get(&Symbol::from(name)));
    let exclusive = match property(EXCLUSIVE_PROPERTY) {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(AmqpError::InvalidField(format!(
                "link property {EXCLUSIVE_PROPERTY:?} is not a boolean: {other:?}"
            )))
        }
    };
    let priority = match property(PRIORITY_PROPERTY) {
        None => 0,
        Some(v) => integer(v).ok_or_else(|| {
            AmqpError::InvalidField(format!(
                "link property {PRIORITY_PROPERTY:?} is not an int: {v:?}"
            ))
        })?,
    };
    let visibility_timeout_ms = match property(VISIBILITY_TIMEOUT_PROPERTY) {
        None => None,
        Some(v) => Some(
            unsigned(v)
                .filter(|ms| (1..=VISIBILITY_TIMEOUT_MS_MAX).contains(ms))
                .ok_or_else(|| {
                    AmqpError::InvalidField(format!(
                        "link property {VISIBILITY_TIMEOUT_PROPERTY:?} is not an unsigned int of 1 to {VISIBILITY_TIMEOUT_MS_MAX} ms: {v:?}"
                    ))
                })?,
        ),
    };
    Ok(ConsumerOptions {
        selector,
        exclusive,
        priority,
        browse,
        visibility_timeout_ms,
        stream: None,
    })
}

/// An AMQP unsigned integer of any width that fits a `u32` (the spec type
/// is `uint`; clients encode small ones as `ubyte` or `ushort` too, and
/// some only have signed longs).
fn unsigned(v: &Value) -> Option<u32> {
    match v {
        Value::Ubyte(n) => Some(u32::from(*n)),
        Value::Ushort(n) => Some(u32::from(*n)),
        Value::Uint(n) => Some(*n),
        Value::Ulong(n) => u32::try_from(*n).ok(),
        Value::Int(n) => u32::try_from(*n).ok(),
        Value::Long(n) => u32::try_from(*n).ok(),
        _ => None,
    }
}

/// An AMQP integer of any width that fits an `i32` (clients differ in
/// the type they encode a small number with).
fn integer(v: &Value) -> Option<i32> {
    match v {
        Value::Byte(n) => Some(i32::from(*n)),
        Value::Short(n) => Some(i32::from(*n)),
        Value::Int(n) => Some(*n),
        Value::Long(n) => i32::try_from(*n).ok(),
        Value::Ubyte(n) => Some(i32::from(*n)),
        Value::Ushort(n) => Some(i32::from(*n)),
        Value::Uint(n) => i32::try_from(*n).ok(),
        Value::Ulong(n) => i32::try_from(*n).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_amqp::described::Described;

    fn described(descriptor: Descriptor, value: Value) -> Value {
        Value::Described(Box::new(Described { descriptor, value }))
    }

    fn filters(entries: Vec<(&str, Value)>) -> FilterSet {
        let mut f = FilterSet::new();
        for (k, v) in entries {
            f.insert(Symbol::from(k), v);
        }
        f
    }

    #[test]
    fn selector_is_found_by_descriptor_name_or_code_under_any_key() {
        let text = || Value::String("colour = 'green'".into());
        let by_name = filters(vec![
            ("other", Value::Bool(true)),
            (
                "selector",
                described(Descriptor::Name(Symbol::from(SELECTOR_FILTER_NAME)), text()),
            ),
        ]);
        let found = selector_filter(Some(&by_name)).unwrap().unwrap();
        assert_eq!(found.entry.0, Symbol::from("selector"));
        assert_eq!(found.text, "colour = 'green'");
        let by_code = filters(vec![(
            "jms-selector",
            described(Descriptor::Code(SELECTOR_FILTER_CODE), text()),
        )]);
        let (key, echoed) = selector_filter(Some(&by_code)).unwrap().unwrap().entry;
        assert_eq!(key, Symbol::from("jms-selector"));
        assert_eq!(echoed, by_code.get(&key).cloned().unwrap());
        // The key alone, or another descriptor, is not a selector.
        let bare = filters(vec![("selector", text())]);
        assert!(selector_filter(Some(&bare)).unwrap().is_none());
        let other = filters(vec![(
            "selector",
            described(Descriptor::Code(0x77), text()),
        )]);
        assert!(selector_filter(Some(&other)).unwrap().is_none());
        assert!(selector_filter(None).unwrap().is_none());
    }

    #[test]
    fn a_selector_that_is_not_a_string_is_an_invalid_field() {
        let f = filters(vec![(
            "selector",
            described(Descriptor::Code(SELECTOR_FILTER_CODE), Value::Int(3)),
        )]);
        assert!(matches!(
            selector_filter(Some(&f)),
            Err(AmqpError::InvalidField(_))
        ));
    }

    #[test]
    fn link_properties_give_exclusivity_and_priority() {
        let mut p = Fields::new();
        p.insert(Symbol::from(EXCLUSIVE_PROPERTY), Value::Bool(true));
        p.insert(Symbol::from(PRIORITY_PROPERTY), Value::Int(5));
        let o = consumer_options(Some(&p), Some("a > 1".into()), true).unwrap();
        assert_eq!(
            o,
            ConsumerOptions {
                selector: Some("a > 1".into()),
                exclusive: true,
                priority: 5,
                browse: true,
                visibility_timeout_ms: None,
                stream: None,
            }
        );
        assert_eq!(
            consumer_options(None, None, false).unwrap(),
            ConsumerOptions::default()
        );
        let mut small = Fields::new();
        small.insert(Symbol::from(PRIORITY_PROPERTY), Value::Ubyte(9));
        assert_eq!(
            consumer_options(Some(&small), None, false)
                .unwrap()
                .priority,
            9
        );
        let mut negative = Fields::new();
        negative.insert(Symbol::from(PRIORITY_PROPERTY), Value::Long(-2));
        assert_eq!(
            consumer_options(Some(&negative), None, false)
                .unwrap()
                .priority,
            -2
        );
    }

    #[test]
    fn link_properties_of_the_wrong_type_are_invalid_fields() {
        for (name, value) in [
            (EXCLUSIVE_PROPERTY, Value::String("true".into())),
            (PRIORITY_PROPERTY, Value::String("5".into())),
            (PRIORITY_PROPERTY, Value::Long(i64::from(i32::MAX) + 1)),
            (VISIBILITY_TIMEOUT_PROPERTY, Value::Uint(0)),
            (
                VISIBILITY_TIMEOUT_PROPERTY,
                Value::Uint(VISIBILITY_TIMEOUT_MS_MAX + 1),
            ),
            (VISIBILITY_TIMEOUT_PROPERTY, Value::String("30000".into())),
        ] {
            let mut p = Fields::new();
            p.insert(Symbol::from(name), value);
            assert!(
                matches!(
                    consumer_options(Some(&p), None, false),
                    Err(AmqpError::InvalidField(_))
                ),
                "{name}"
            );
        }
    }
}
