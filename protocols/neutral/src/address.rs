//! Addresses and the one naming scheme every adapter uses.
//!
//! | what                 | MQTT          | STOMP                 | AMQP 1.0                        | core                 |
//! |----------------------|---------------|-----------------------|---------------------------------|----------------------|
//! | topic `a/b`          | `a/b`         | `/topic/a/b`          | `/topic/a/b`                    | `Topic("a/b")`       |
//! | queue `q`            | (bindings)    | `/queue/q`            | `/queue/q` or bare `q`          | `Queue("q")`         |
//! | wildcard filter      | `a/+/c`, `a/#`| `/topic/a/+/c`        | `/topic/a/#`                    | `Topic("a/#")`       |
//! | temporary queue      | –             | `/temp-queue/x`       | dynamic node (generated name)   | `Queue("$temp/…")`   |
//! | publish to queue `q` | `$queue/q`    | `/queue/q`            | `/queue/q`                      | `Queue("q")`         |
//!
//! MQTT has no queues, so a reply-to that names a queue (a STOMP
//! `/temp-queue/…`, an AMQP dynamic node) reaches an MQTT responder as the
//! response topic `$queue/<name>`: an MQTT PUBLISH to a topic with the
//! reserved prefix [`MQTT_QUEUE_TOPIC_PREFIX`] goes to that queue (with the
//! publisher's permission on `/queue/<name>` checked), never to a topic.
//! `$`-topics are the server's by the MQTT specification, so no ordinary
//! MQTT topic is taken away.
//!
//! Topics are *multicast*: every subscription gets a copy. Queues are
//! *anycast*: consumers compete. Wildcards use MQTT syntax everywhere, and a
//! filter starting with a wildcard does not match topics that start with `$`.

use std::fmt;

/// How an address distributes messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoutingType {
    /// Every subscription gets a copy (topics).
    Multicast,
    /// Consumers compete for each message (queues).
    Anycast,
}

/// A destination in the core's terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Address {
    /// A multicast topic name (or, when subscribing, a topic filter).
    Topic(String),
    /// An anycast queue.
    Queue(String),
}

/// Destination prefix for topics (STOMP and AMQP).
pub const TOPIC_PREFIX: &str = "/topic/";
/// Destination prefix for queues (STOMP and AMQP).
pub const QUEUE_PREFIX: &str = "/queue/";
/// STOMP prefix for temporary queues.
pub const TEMP_QUEUE_PREFIX: &str = "/temp-queue/";
/// Prefix of the core's names for temporary queues.
pub const TEMP_QUEUE_NAME_PREFIX: &str = "$temp/";
/// MQTT topic prefix naming a queue: a PUBLISH to `$queue/q` goes to the
/// queue `q` (see the module docs).
pub const MQTT_QUEUE_TOPIC_PREFIX: &str = "$queue/";
/// Longest address name accepted, in bytes (MQTT's own topic limit).
pub const ADDRESS_LEN_MAX: usize = 65_535;

/// Why a name is not a valid address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Empty name.
    #[error("empty address")]
    Empty,
    /// Longer than [`ADDRESS_LEN_MAX`].
    #[error("address longer than {ADDRESS_LEN_MAX} bytes")]
    TooLong,
    /// Contains a NUL character.
    #[error("address contains NUL")]
    Nul,
    /// A wildcard in a name that must be concrete (a publish topic).
    #[error("wildcard in a topic name: {0}")]
    WildcardInName(String),
    /// A wildcard used wrongly (`a/b#`, `#/a`, `a+`).
    #[error("malformed topic filter: {0}")]
    MalformedFilter(String),
    /// A wildcard in a queue name.
    #[error("wildcards are not allowed in queue names: {0}")]
    WildcardInQueue(String),
}

impl Address {
    /// Parses a STOMP or AMQP destination: `/topic/x`, `/queue/x`, and a bare
    /// `x` meaning the queue `x`. `/temp-queue/…` is not handled here because
    /// its meaning depends on the connection; adapters resolve it.
    pub fn parse_destination(dest: &str) -> Result<Address, AddressError> {
        if let Some(topic) = dest.strip_prefix(TOPIC_PREFIX) {
            check_name(topic)?;
            Ok(Address::Topic(topic.to_owned()))
        } else if let Some(queue) = dest.strip_prefix(QUEUE_PREFIX) {
            check_queue_name(queue)?;
            Ok(Address::Queue(queue.to_owned()))
        } else {
            check_queue_name(dest)?;
            Ok(Address::Queue(dest.to_owned()))
        }
    }

    /// The address an MQTT PUBLISH topic name sends to: `$queue/q` is the
    /// queue `q`, any other name the topic of that name. The topic name
    /// must already be valid ([`validate_topic_name`]).
    pub fn from_mqtt_topic(topic: &str) -> Result<Address, AddressError> {
        match topic.strip_prefix(MQTT_QUEUE_TOPIC_PREFIX) {
            Some(queue) => {
                check_queue_name(queue)?;
                Ok(Address::Queue(queue.to_owned()))
            }
            None => {
                validate_topic_name(topic)?;
                Ok(Address::Topic(topic.to_owned()))
            }
        }
    }

    /// The MQTT topic name that reaches this address: the topic itself, or
    /// `$queue/q` for the queue `q` (an MQTT response topic).
    pub fn to_mqtt_topic(&self) -> String {
        match self {
            Address::Topic(t) => t.clone(),
            Address::Queue(q) => format!("{MQTT_QUEUE_TOPIC_PREFIX}{q}"),
        }
    }

    /// The canonical STOMP/AMQP destination string for this address.
    pub fn to_destination(&self) -> String {
        // Built by hand, not with `format!`: this runs for every message
        // an AMQP client receives, and the formatting machinery cost more
        // than the copy.
        let (prefix, name) = match self {
            Address::Topic(t) => (TOPIC_PREFIX, t),
            Address::Queue(q) => (QUEUE_PREFIX, q),
        };
        let mut destination = String::with_capacity(prefix.len() + name.len());
        destination.push_str(prefix);
        destination.push_str(name);
        destination
    }

    /// The core name (without prefix).
    pub fn name(&self) -> &str {
        match self {
            Address::Topic(n) | Address::Queue(n) => n,
        }
    }

    /// The routing type of the address.
    pub fn routing_type(&self) -> RoutingType {
        match self {
            Address::Topic(_) => RoutingType::Multicast,
            Address::Queue(_) => RoutingType::Anycast,
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_destination())
    }
}

fn check_name(name: &str) -> Result<(), AddressError> {
    if name.is_empty() {
        return Err(AddressError::Empty);
    }
    if name.len() > ADDRESS_LEN_MAX {
        return Err(AddressError::TooLong);
    }
    if name.contains('\0') {
        return Err(AddressError::Nul);
    }
    Ok(())
}

fn check_queue_name(name: &str) -> Result<(), AddressError> {
    check_name_without_wildcards(name, AddressError::WildcardInQueue)
}

/// Checks a topic *name* (what a publisher sends to): non-empty, bounded, no
/// NUL and no wildcard characters.
pub fn validate_topic_name(name: &str) -> Result<(), AddressError> {
    check_name_without_wildcards(name, AddressError::WildcardInName)
}

/// [`check_name`], and no `+` or `#` either (`wildcard` makes that error):
/// what every publish's topic or queue name is checked for, in one pass
/// over the bytes a word at a time when all is well, which it nearly
/// always is. A NUL anywhere is reported before a wildcard.
fn check_name_without_wildcards(
    name: &str,
    wildcard: impl FnOnce(String) -> AddressError,
) -> Result<(), AddressError> {
    if !name.is_empty() && name.len() <= ADDRESS_LEN_MAX && !has_nul_or_wildcard(name.as_bytes()) {
        return Ok(());
    }
    // Something to report: `check_name`'s errors first, else a wildcard.
    check_name(name)?;
    Err(wildcard(name.to_owned()))
}

/// Whether `bytes` hold a NUL, `+` or `#`: eight bytes per step (the
/// classic "has a zero byte" test on the word XORed with each byte sought),
/// since every publish's topic is checked (issue 20: a byte-wise loop was
/// 4% of an MQTT message's instructions).
fn has_nul_or_wildcard(bytes: &[u8]) -> bool {
    const LOW: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |v: u64| v.wrapping_sub(LOW) & !v & HIGH != 0;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        let v = u64::from_le_bytes(w);
        if has_zero(v)
            || has_zero(v ^ (LOW * u64::from(b'+')))
            || has_zero(v ^ (LOW * u64::from(b'#')))
        {
            return true;
        }
    }
    words
        .remainder()
        .iter()
        .any(|&b| matches!(b, 0 | b'+' | b'#'))
}

/// Checks a topic *filter*: `+` must fill a whole level, `#` must be the
/// whole last level.
pub fn validate_topic_filter(filter: &str) -> Result<(), AddressError> {
    check_name(filter)?;
    let levels: Vec<&str> = filter.split('/').collect();
    let last = levels.len() - 1;
    for (i, level) in levels.iter().enumerate() {
        let bad_hash = level.contains('#') && (*level != "#" || i != last);
        let bad_plus = level.contains('+') && *level != "+";
        if bad_hash || bad_plus {
            return Err(AddressError::MalformedFilter(filter.to_owned()));
        }
    }
    Ok(())
}

/// True if `filter` contains a wildcard level.
pub fn is_wildcard(filter: &str) -> bool {
    filter.contains(['+', '#'])
}

/// Reference matcher: does `filter` match `topic` under MQTT rules? The
/// core's trie must agree with this function (it is its test oracle).
pub fn topic_matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_parse_to_the_naming_scheme() {
        assert_eq!(
            Address::parse_destination("/topic/a/b"),
            Ok(Address::Topic("a/b".into()))
        );
        assert_eq!(
            Address::parse_destination("/queue/q"),
            Ok(Address::Queue("q".into()))
        );
        assert_eq!(
            Address::parse_destination("q"),
            Ok(Address::Queue("q".into()))
        );
        assert!(Address::parse_destination("/queue/").is_err());
        assert!(Address::parse_destination("/queue/a#").is_err());
        assert_eq!(Address::Topic("a/b".into()).to_destination(), "/topic/a/b");
    }

    #[test]
    fn mqtt_topics_name_queues_with_the_reserved_prefix() {
        assert_eq!(
            Address::from_mqtt_topic("$queue/$temp/7"),
            Ok(Address::Queue("$temp/7".into()))
        );
        assert_eq!(
            Address::from_mqtt_topic("a/b"),
            Ok(Address::Topic("a/b".into()))
        );
        assert!(Address::from_mqtt_topic("$queue/").is_err());
        assert!(Address::from_mqtt_topic("$queue/a+").is_err());
        let q = Address::Queue("$temp/7".into());
        assert_eq!(q.to_mqtt_topic(), "$queue/$temp/7");
        assert_eq!(Address::from_mqtt_topic(&q.to_mqtt_topic()), Ok(q));
        assert_eq!(Address::Topic("t".into()).to_mqtt_topic(), "t");
    }

    #[test]
    fn filters_validate() {
        for ok in ["a", "a/b", "+", "#", "a/+/c", "a/#", "+/+", "/"] {
            assert_eq!(validate_topic_filter(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a#", "a/#/b", "a+", "a/b+/c", "#/a"] {
            assert!(validate_topic_filter(bad).is_err(), "{bad}");
        }
        assert!(validate_topic_name("a/+").is_err());
    }

    #[test]
    fn topic_names_validate_with_nul_reported_first() {
        for ok in ["a", "a/b", "/", "$SYS/x", "a b/é"] {
            assert_eq!(validate_topic_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(validate_topic_name(""), Err(AddressError::Empty));
        assert_eq!(
            validate_topic_name(&"a".repeat(ADDRESS_LEN_MAX + 1)),
            Err(AddressError::TooLong)
        );
        assert_eq!(
            validate_topic_name("a/#"),
            Err(AddressError::WildcardInName("a/#".into()))
        );
        assert_eq!(
            validate_topic_name("x+"),
            Err(AddressError::WildcardInName("x+".into()))
        );
        assert_eq!(validate_topic_name("a+/\0b"), Err(AddressError::Nul));
    }

    #[test]
    fn matching_follows_mqtt_rules() {
        assert!(topic_matches("a/+/c", "a/b/c"));
        assert!(!topic_matches("a/+/c", "a/b/d"));
        assert!(topic_matches("a/#", "a"));
        assert!(topic_matches("a/#", "a/b/c"));
        assert!(topic_matches("#", "x/y"));
        assert!(!topic_matches("#", "$SYS/x"));
        assert!(!topic_matches("+/x", "$SYS/x"));
        assert!(topic_matches("$SYS/#", "$SYS/x"));
        assert!(topic_matches("+", ""));
        assert!(!topic_matches("a", "a/b"));
        assert!(topic_matches("a//b", "a//b"));
    }

    proptest::proptest! {
        /// The word-at-a-time check finds exactly what a byte-wise scan
        /// finds, wherever the byte sits relative to the 8-byte steps.
        #[test]
        fn the_fast_scan_agrees_with_a_byte_wise_one(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::Just(0u8),
                    proptest::prelude::Just(b'+'),
                    proptest::prelude::Just(b'#'),
                    proptest::prelude::Just(b'*'),
                    proptest::prelude::Just(b'"'),
                    proptest::prelude::Just(0x80u8),
                    proptest::prelude::Just(0xffu8),
                    b'a'..=b'z',
                ],
                0..40,
            )
        ) {
            let slow = bytes.iter().any(|&b| matches!(b, 0 | b'+' | b'#'));
            proptest::prop_assert_eq!(has_nul_or_wildcard(&bytes), slow);
        }
    }
}
