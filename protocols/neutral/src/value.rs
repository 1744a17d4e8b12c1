//! Typed property values.
//!
//! AMQP 1.0 application-properties are typed; MQTT 5 user properties and
//! STOMP headers are strings. The neutral [`Value`] keeps the AMQP type so an
//! AMQP → AMQP hop is lossless, and [`Value::to_text`] is the one place that
//! says what a string-only protocol sees for a typed value (see
//! `docs/conversion.md`).

use bytes::Bytes;

/// One typed property value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// AMQP `null`.
    Null,
    /// AMQP `boolean`.
    Bool(bool),
    /// AMQP `ubyte`.
    UByte(u8),
    /// AMQP `ushort`.
    UShort(u16),
    /// AMQP `uint`.
    UInt(u32),
    /// AMQP `ulong`.
    ULong(u64),
    /// AMQP `byte`.
    Byte(i8),
    /// AMQP `short`.
    Short(i16),
    /// AMQP `int`.
    Int(i32),
    /// AMQP `long`.
    Long(i64),
    /// AMQP `float`.
    Float(f32),
    /// AMQP `double`.
    Double(f64),
    /// AMQP `char`.
    Char(char),
    /// AMQP `timestamp`: milliseconds since the Unix epoch.
    Timestamp(i64),
    /// AMQP `uuid`.
    Uuid([u8; 16]),
    /// AMQP `string`, MQTT user property value, STOMP header value.
    String(String),
    /// AMQP `symbol`.
    Symbol(String),
    /// AMQP `binary`.
    Binary(Bytes),
}

impl Value {
    /// The text a string-only protocol (MQTT user property, STOMP header)
    /// sees for this value. Numbers and booleans print in their canonical
    /// decimal form, timestamps as milliseconds since the epoch, UUIDs in the
    /// 8-4-4-4-12 form, binary as lowercase hex, null as the empty string.
    pub fn to_text(&self) -> String {
        match self {
            Value::Null => String::new(),
            Value::Bool(v) => v.to_string(),
            Value::UByte(v) => v.to_string(),
            Value::UShort(v) => v.to_string(),
            Value::UInt(v) => v.to_string(),
            Value::ULong(v) => v.to_string(),
            Value::Byte(v) => v.to_string(),
            Value::Short(v) => v.to_string(),
            Value::Int(v) => v.to_string(),
            Value::Long(v) => v.to_string(),
            Value::Float(v) => v.to_string(),
            Value::Double(v) => v.to_string(),
            Value::Char(v) => v.to_string(),
            Value::Timestamp(v) => v.to_string(),
            Value::Uuid(v) => format_uuid(v),
            Value::String(v) | Value::Symbol(v) => v.clone(),
            Value::Binary(v) => {
                let mut out = String::with_capacity(v.len() * 2);
                for b in v.iter() {
                    out.push_str(&format!("{b:02x}"));
                }
                out
            }
        }
    }

    /// The string inside a `String` or `Symbol` value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(v) | Value::Symbol(v) => Some(v),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::String(v)
    }
}

/// Formats 16 bytes as a lowercase 8-4-4-4-12 UUID string.
pub fn format_uuid(v: &[u8; 16]) -> String {
    let hex: Vec<String> = v.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// An ordered list of named, typed properties.
///
/// Order is kept and duplicate names are allowed, because MQTT 5 user
/// properties require both. [`Properties::get`] returns the first value for a
/// name, which is also STOMP's "first header wins" rule.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties(Vec<(String, Value)>);

impl Properties {
    /// An empty list.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// Appends a property, keeping any earlier one of the same name.
    pub fn push(&mut self, name: impl Into<String>, value: impl Into<Value>) {
        self.0.push((name.into(), value.into()));
    }

    /// Sets `name` to `value` alone: any earlier values under that name
    /// are dropped and the new one goes last. For values the broker owns
    /// (a dead letter's reason), which must not pile up when a message
    /// passes through twice.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<Value>) {
        let name = name.into();
        self.0.retain(|(n, _)| *n != name);
        self.0.push((name, value.into()));
    }

    /// The first value stored under `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// All properties in insertion order, duplicates included.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// Number of entries, duplicates included.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no properties.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Approximate heap bytes held, for memory accounting.
    pub fn heap_size(&self) -> usize {
        self.0
            .iter()
            .map(|(n, v)| {
                n.len()
                    + 32
                    + match v {
                        Value::String(s) | Value::Symbol(s) => s.len(),
                        Value::Binary(b) => b.len(),
                        _ => 0,
                    }
            })
            .sum()
    }
}

impl FromIterator<(String, Value)> for Properties {
    fn from_iter<T: IntoIterator<Item = (String, Value)>>(iter: T) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl IntoIterator for Properties {
    type Item = (String, Value);
    type IntoIter = std::vec::IntoIter<(String, Value)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_keep_order_and_duplicates() {
        let mut p = Properties::new();
        p.push("a", "1");
        p.push("b", "2");
        p.push("a", "3");
        let names: Vec<_> = p.iter().map(|(n, v)| (n.to_owned(), v.to_text())).collect();
        assert_eq!(
            names,
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "2".into()),
                ("a".into(), "3".into())
            ]
        );
        assert_eq!(p.get("a"), Some(&Value::from("1")));
    }

    #[test]
    fn typed_values_render_as_text() {
        assert_eq!(Value::Int(-5).to_text(), "-5");
        assert_eq!(Value::Bool(true).to_text(), "true");
        assert_eq!(
            Value::Binary(Bytes::from_static(&[0, 255])).to_text(),
            "00ff"
        );
        assert_eq!(
            Value::Uuid([0x12; 16]).to_text(),
            "12121212-1212-1212-1212-121212121212"
        );
    }
}
