//! The STOMP frame model: commands, protocol versions and headers.
//!
//! A decoded [`Frame`] owns its headers (decoded, unescaped strings) and its
//! body as a [`Bytes`] split off the read buffer, so the body travels to the
//! core without a copy.

use std::fmt;

use bytes::Bytes;

/// A STOMP protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// STOMP 1.0: no header escaping, no heart-beats, no NACK.
    V1_0,
    /// STOMP 1.1: escaping of `\n`, `:` and `\`; heart-beats; NACK.
    V1_1,
    /// STOMP 1.2: adds `\r` escaping, CRLF line endings and the `ack` header.
    V1_2,
}

impl Version {
    /// The version as written in `accept-version` and `version` headers.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1_0 => "1.0",
            Version::V1_1 => "1.1",
            Version::V1_2 => "1.2",
        }
    }

    /// Parses `1.0`, `1.1` or `1.2`.
    pub fn parse(s: &str) -> Option<Version> {
        match s.trim() {
            "1.0" => Some(Version::V1_0),
            "1.1" => Some(Version::V1_1),
            "1.2" => Some(Version::V1_2),
            _ => None,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every command of STOMP 1.0–1.2, client and server frames alike (the
/// parser also reads server frames so that tests and tools can use it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Client: open a connection.
    Connect,
    /// Client: open a connection (1.2 name, same meaning as CONNECT).
    Stomp,
    /// Client: publish.
    Send,
    /// Client: start a subscription.
    Subscribe,
    /// Client: end a subscription.
    Unsubscribe,
    /// Client: acknowledge.
    Ack,
    /// Client: negatively acknowledge (1.1+).
    Nack,
    /// Client, Rosetta extension: restart the lease (visibility timeout) of
    /// an unacknowledged MESSAGE, named by its `id` as ACK names it.
    Renew,
    /// Client: start a transaction.
    Begin,
    /// Client: commit a transaction.
    Commit,
    /// Client: roll back a transaction.
    Abort,
    /// Client: say goodbye.
    Disconnect,
    /// Server: connection accepted.
    Connected,
    /// Server: a delivery.
    Message,
    /// Server: a frame's effect is done.
    Receipt,
    /// Server: something went wrong; the connection closes.
    Error,
}

/// All commands, for lookups and tests.
pub const COMMANDS: [Command; 16] = [
    Command::Connect,
    Command::Stomp,
    Command::Send,
    Command::Subscribe,
    Command::Unsubscribe,
    Command::Ack,
    Command::Nack,
    Command::Renew,
    Command::Begin,
    Command::Commit,
    Command::Abort,
    Command::Disconnect,
    Command::Connected,
    Command::Message,
    Command::Receipt,
    Command::Error,
];

impl Command {
    /// The command as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Connect => "CONNECT",
            Command::Stomp => "STOMP",
            Command::Send => "SEND",
            Command::Subscribe => "SUBSCRIBE",
            Command::Unsubscribe => "UNSUBSCRIBE",
            Command::Ack => "ACK",
            Command::Nack => "NACK",
            Command::Renew => "RENEW",
            Command::Begin => "BEGIN",
            Command::Commit => "COMMIT",
            Command::Abort => "ABORT",
            Command::Disconnect => "DISCONNECT",
            Command::Connected => "CONNECTED",
            Command::Message => "MESSAGE",
            Command::Receipt => "RECEIPT",
            Command::Error => "ERROR",
        }
    }

    /// Parses a command name (case-sensitive, as the spec requires).
    pub fn parse(name: &[u8]) -> Option<Command> {
        // A match rather than a search of [`COMMANDS`]: this runs for
        // every frame, SEND and ACK most.
        Some(match name {
            b"SEND" => Command::Send,
            b"ACK" => Command::Ack,
            b"NACK" => Command::Nack,
            b"SUBSCRIBE" => Command::Subscribe,
            b"UNSUBSCRIBE" => Command::Unsubscribe,
            b"CONNECT" => Command::Connect,
            b"STOMP" => Command::Stomp,
            b"RENEW" => Command::Renew,
            b"BEGIN" => Command::Begin,
            b"COMMIT" => Command::Commit,
            b"ABORT" => Command::Abort,
            b"DISCONNECT" => Command::Disconnect,
            b"CONNECTED" => Command::Connected,
            b"MESSAGE" => Command::Message,
            b"RECEIPT" => Command::Receipt,
            b"ERROR" => Command::Error,
            _ => return None,
        })
    }

    /// CONNECT, STOMP and CONNECTED frames never escape header values (so
    /// that a 1.0 peer can read them before a version is agreed).
    pub fn escapes_headers(self) -> bool {
        !matches!(self, Command::Connect | Command::Stomp | Command::Connected)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The headers Rosetta itself acts on, found once when a frame is parsed
/// (the parser classifies each name as it meets it) rather than by
/// comparing names at every lookup: a SEND asks for a dozen of them, and
/// this is per message. Any other name is looked up by its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum KnownHeader {
    Destination,
    ContentLength,
    ContentType,
    ReplyTo,
    CorrelationId,
    Expires,
    Priority,
    Persistent,
    Transaction,
    Receipt,
    /// ActiveMQ's scheduling header ([`crate::convert::SCHEDULED_DELAY_HEADER`]).
    ScheduledDelay,
    /// RabbitMQ's stream declaration ([`crate::consumer_options::QUEUE_TYPE_HEADER`]).
    QueueType,
    Id,
    MessageId,
    Subscription,
    Ack,
}

impl KnownHeader {
    /// Every known header, in discriminant order.
    #[cfg(test)]
    pub(crate) const ALL: [KnownHeader; 16] = [
        KnownHeader::Destination,
        KnownHeader::ContentLength,
        KnownHeader::ContentType,
        KnownHeader::ReplyTo,
        KnownHeader::CorrelationId,
        KnownHeader::Expires,
        KnownHeader::Priority,
        KnownHeader::Persistent,
        KnownHeader::Transaction,
        KnownHeader::Receipt,
        KnownHeader::ScheduledDelay,
        KnownHeader::QueueType,
        KnownHeader::Id,
        KnownHeader::MessageId,
        KnownHeader::Subscription,
        KnownHeader::Ack,
    ];

    /// The name as written on the wire.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            KnownHeader::Destination => "destination",
            KnownHeader::ContentLength => "content-length",
            KnownHeader::ContentType => "content-type",
            KnownHeader::ReplyTo => "reply-to",
            KnownHeader::CorrelationId => "correlation-id",
            KnownHeader::Expires => "expires",
            KnownHeader::Priority => "priority",
            KnownHeader::Persistent => "persistent",
            KnownHeader::Transaction => "transaction",
            KnownHeader::Receipt => "receipt",
            KnownHeader::ScheduledDelay => crate::convert::SCHEDULED_DELAY_HEADER,
            KnownHeader::QueueType => crate::consumer_options::QUEUE_TYPE_HEADER,
            KnownHeader::Id => "id",
            KnownHeader::MessageId => "message-id",
            KnownHeader::Subscription => "subscription",
            KnownHeader::Ack => "ack",
        }
    }

    /// Which known header `name` is (exactly, case-sensitive as STOMP
    /// names are). The length and one byte pick the only candidate, then
    /// one comparison confirms it: a few instructions for any name.
    #[inline]
    pub(crate) fn of(name: &[u8]) -> Option<KnownHeader> {
        use KnownHeader as K;
        let first = *name.first()?;
        // Each arm compares with a name of known length, which the
        // compiler turns into a load or two rather than a call.
        match (name.len(), first) {
            (2, _) => K::Id.is(name),
            (3, _) => K::Ack.is(name),
            (7, b'r') => K::Receipt.is(name),
            (7, _) => K::Expires.is(name),
            (8, b'r') => K::ReplyTo.is(name),
            (8, _) => K::Priority.is(name),
            (10, b'm') => K::MessageId.is(name),
            (10, _) => K::Persistent.is(name),
            (11, b'd') => K::Destination.is(name),
            (11, _) => K::Transaction.is(name),
            (12, b'c') => K::ContentType.is(name),
            (12, b's') => K::Subscription.is(name),
            (12, _) => K::QueueType.is(name),
            (14, b'c') if name.get(7) == Some(&b'-') => K::ContentLength.is(name),
            (14, _) => K::CorrelationId.is(name),
            (19, _) => K::ScheduledDelay.is(name),
            _ => None,
        }
    }

    /// This header, if `name` is its name.
    #[inline(always)]
    fn is(self, name: &[u8]) -> Option<KnownHeader> {
        (name == self.name().as_bytes()).then_some(self)
    }

    /// This header's bit in a set of them.
    pub(crate) const fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// Where one header's name and value are in [`Headers`]' text (offsets
/// of a head, which is far below 4 GiB), and which known header it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    name_start: u32,
    name_end: u32,
    value_start: u32,
    value_end: u32,
    known: Option<KnownHeader>,
}

impl Span {
    /// A header whose name is `text[name.0..name.1]` and value
    /// `text[value.0..value.1]`; `known` is [`KnownHeader::of`] its name.
    #[inline]
    fn new(name: (usize, usize), value: (usize, usize), known: Option<KnownHeader>) -> Self {
        let at = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Span {
            name_start: at(name.0),
            name_end: at(name.1),
            value_start: at(value.0),
            value_end: at(value.1),
            known,
        }
    }

    /// A parsed `name:value` line's header: the name from `start` to
    /// `colon`, the value from after the colon to `end`; offsets that
    /// the caller knows fit a `u32`.
    #[inline]
    pub(crate) fn parsed(
        start: usize,
        colon: usize,
        end: usize,
        known: Option<KnownHeader>,
    ) -> Self {
        Span::new((start, colon), (colon + 1, end), known)
    }

    /// Where the value ends.
    pub(crate) fn value_end(&self) -> usize {
        self.value_end as usize
    }
}

/// Frame headers in wire order, repeats kept. Lookups return the first
/// entry, which is STOMP's "first one wins" rule.
///
/// All names and values live in one string (two allocations per frame,
/// not two per header: a SEND has several, and this is per message). A
/// head without escapes is that string as received, copied once, with
/// its separators between the spans (the parser builds it in the pass
/// that finds the head's end, see [`Headers::from_parsed`]). Each header
/// knows whether it is one of the [`KnownHeader`]s, and a bit set says
/// which of those are present: a lookup of an absent one (most of what a
/// SEND asks) is a bit test.
#[derive(Debug, Clone, Default)]
pub struct Headers {
    text: String,
    spans: Vec<Span>,
    /// [`KnownHeader::bit`] of each known header present.
    present: u32,
}

/// Equal when the headers are, in order: not how `text` holds them.
impl PartialEq for Headers {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Headers {}

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// No headers yet, room for `count` of `text_bytes` in all.
    pub fn with_capacity(count: usize, text_bytes: usize) -> Self {
        Self {
            text: String::with_capacity(text_bytes),
            spans: Vec::with_capacity(count),
            present: 0,
        }
    }

    /// Appends a header, keeping earlier ones of the same name.
    ///
    /// # Panics
    /// When the text of all headers would pass 4 GiB (a parsed head is
    /// held far below that by the frame limit).
    pub fn push(&mut self, name: impl AsRef<str>, value: impl AsRef<str>) {
        let (name, value) = (name.as_ref(), value.as_ref());
        let start = self.text.len();
        self.text.push_str(name);
        let value_start = self.text.len();
        self.text.push_str(value);
        assert!(
            u32::try_from(self.text.len()).is_ok(),
            "STOMP headers over 4 GiB"
        );
        let known = KnownHeader::of(name.as_bytes());
        if let Some(k) = known {
            self.present |= k.bit();
        }
        self.spans.push(Span::new(
            (start, value_start),
            (value_start, self.text.len()),
            known,
        ));
    }

    /// Headers found by the parser: `spans` index `text` (the head's
    /// header lines as received, when no escape needed undoing);
    /// `present` has the [`KnownHeader::bit`] of each known one among
    /// them.
    pub(crate) fn from_parsed(text: String, spans: Vec<Span>, present: u32) -> Self {
        debug_assert_eq!(
            present,
            spans
                .iter()
                .filter_map(|s| s.known)
                .fold(0, |acc, k| acc | k.bit())
        );
        Self {
            text,
            spans,
            present,
        }
    }

    fn name_of(&self, s: &Span) -> &str {
        self.text
            .get(s.name_start as usize..s.name_end as usize)
            .unwrap_or_default()
    }

    fn value_of(&self, s: &Span) -> &str {
        self.text
            .get(s.value_start as usize..s.value_end as usize)
            .unwrap_or_default()
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        if let Some(k) = KnownHeader::of(name.as_bytes()) {
            return self.known(k);
        }
        let span = self
            .spans
            .iter()
            .find(|s| s.known.is_none() && self.name_of(s) == name)?;
        Some(self.value_of(span))
    }

    /// The first value of the known header `k`.
    #[inline]
    pub(crate) fn known(&self, k: KnownHeader) -> Option<&str> {
        if self.present & k.bit() == 0 {
            return None;
        }
        let span = self.spans.iter().find(|s| s.known == Some(k))?;
        Some(self.value_of(span))
    }

    /// All headers in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.spans
            .iter()
            .map(|s| (self.name_of(s), self.value_of(s)))
    }

    /// The headers in wire order but those known ones whose
    /// [`KnownHeader::bit`] is in `skip`: the others are looked at by their
    /// tag, not their text.
    pub(crate) fn iter_except(&self, skip: u32) -> impl Iterator<Item = (&str, &str)> {
        self.spans
            .iter()
            .filter(move |s| s.known.is_none_or(|k| skip & k.bit() == 0))
            .map(|s| (self.name_of(s), self.value_of(s)))
    }

    /// Number of header lines, repeats included.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

impl<N: AsRef<str>, V: AsRef<str>> FromIterator<(N, V)> for Headers {
    fn from_iter<T: IntoIterator<Item = (N, V)>>(iter: T) -> Self {
        let mut h = Headers::new();
        for (n, v) in iter {
            h.push(n, v);
        }
        h
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The command.
    pub command: Command,
    /// Decoded (unescaped) headers in wire order.
    pub headers: Headers,
    /// The body: exactly `content-length` bytes when that header was given,
    /// else everything up to the first NUL.
    pub body: Bytes,
    /// The frame carried a valid `content-length` header (decides whether an
    /// unlabelled body may be treated as text).
    pub has_content_length: bool,
}

impl Frame {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }

    /// The first value of the known header `k` (see [`KnownHeader`]).
    #[inline]
    pub(crate) fn known(&self, k: KnownHeader) -> Option<&str> {
        self.headers.known(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_parses_from_its_name_and_nothing_else_does() {
        for c in COMMANDS {
            assert_eq!(Command::parse(c.as_str().as_bytes()), Some(c));
            let lower = c.as_str().to_ascii_lowercase();
            assert_eq!(Command::parse(lower.as_bytes()), None, "{lower}");
            let longer = format!("{}X", c.as_str());
            assert_eq!(Command::parse(longer.as_bytes()), None, "{longer}");
        }
        assert_eq!(Command::parse(b""), None);
    }

    #[test]
    fn known_headers_are_found_by_their_exact_name_only() {
        for k in KnownHeader::ALL {
            assert_eq!(k.bit(), 1 << (k as u32));
            let name = k.name();
            assert_eq!(KnownHeader::of(name.as_bytes()), Some(k), "{name}");
            // Every byte changed in turn, the case changed, one byte more
            // or less: not that header (nor, here, any other).
            for i in 0..name.len() {
                let mut near = name.as_bytes().to_vec();
                near[i] ^= 0x01;
                assert_eq!(KnownHeader::of(&near), None, "{name} byte {i}");
            }
            let upper = name.to_ascii_uppercase();
            if upper != name {
                assert_eq!(KnownHeader::of(upper.as_bytes()), None, "{upper}");
            }
            assert_eq!(KnownHeader::of(format!("{name}x").as_bytes()), None);
            assert_eq!(KnownHeader::of(&name.as_bytes()[1..]), None);
        }
        assert_eq!(KnownHeader::of(b""), None);
        assert_eq!(KnownHeader::of(b"x-stream-offset"), None);
    }

    #[test]
    fn lookups_take_the_first_of_repeated_headers_known_or_not() {
        let h: Headers = [
            ("receipt", "1"),
            ("custom", "a"),
            ("receipt", "2"),
            ("custom", "b"),
            ("destination", "/queue/q"),
        ]
        .into_iter()
        .collect();
        assert_eq!(h.get("receipt"), Some("1"));
        assert_eq!(h.known(KnownHeader::Receipt), Some("1"));
        assert_eq!(h.get("custom"), Some("a"));
        assert_eq!(h.get("destination"), Some("/queue/q"));
        assert_eq!(h.get("transaction"), None);
        assert_eq!(h.known(KnownHeader::Transaction), None);
        assert_eq!(h.get("Receipt"), None, "names are case-sensitive");
        assert_eq!(h.len(), 5);
        let skip = KnownHeader::Receipt.bit() | KnownHeader::Transaction.bit();
        let kept: Vec<_> = h.iter_except(skip).collect();
        assert_eq!(
            kept,
            [
                ("custom", "a"),
                ("custom", "b"),
                ("destination", "/queue/q")
            ]
        );
        assert_eq!(h.iter_except(0).count(), 5);
    }
}
