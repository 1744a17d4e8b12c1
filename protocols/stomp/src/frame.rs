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
        COMMANDS
            .iter()
            .copied()
            .find(|c| c.as_str().as_bytes() == name)
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

/// Frame headers in wire order, repeats kept. Lookups return the first
/// entry, which is STOMP's "first one wins" rule.
///
/// All names and values live in one string (two allocations per frame,
/// not two per header: a SEND has several, and this is per message). A
/// head without escapes is that string as received, copied once, with
/// its separators between the spans (see [`Headers::from_raw_lines`]).
#[derive(Debug, Clone, Default)]
pub struct Headers {
    text: String,
    /// Per header: where its name starts and ends and where its value
    /// starts and ends, in `text`.
    spans: Vec<[usize; 4]>,
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
        }
    }

    /// Appends a header, keeping earlier ones of the same name.
    pub fn push(&mut self, name: impl AsRef<str>, value: impl AsRef<str>) {
        let start = self.text.len();
        self.text.push_str(name.as_ref());
        let value_start = self.text.len();
        self.text.push_str(value.as_ref());
        self.spans
            .push([start, value_start, value_start, self.text.len()]);
    }

    /// Headers that are `lines` as they are: `name:value` lines, each
    /// ended by LF (a CR before it is not part of the value), with no
    /// escape to undo, up to an empty line or the end. One copy of the
    /// whole block rather than one per name and value (the parse of every
    /// SEND, per message). `Err` for a line without a colon, with an
    /// empty name or without its LF.
    pub(crate) fn from_raw_lines(
        lines: &str,
        count: usize,
    ) -> Result<Self, crate::parser::FrameError> {
        use crate::parser::FrameError;
        let mut spans = Vec::with_capacity(count);
        let b = lines.as_bytes();
        let mut at = 0;
        loop {
            let rest = b.get(at..).unwrap_or_default();
            let nl = at + crate::swar::find_any(rest, [b'\n']).ok_or(FrameError::Garbage)?;
            let end = if nl > at && b.get(nl - 1) == Some(&b'\r') {
                nl - 1
            } else {
                nl
            };
            if end == at {
                break;
            }
            let line = b.get(at..end).unwrap_or_default();
            let colon = crate::swar::find_any(line, [b':']).ok_or(FrameError::MissingColon)?;
            if colon == 0 {
                return Err(FrameError::EmptyHeaderName);
            }
            spans.push([at, at + colon, at + colon + 1, end]);
            at = nl + 1;
        }
        let text_end = spans.last().map_or(0, |s| s[3]);
        Ok(Self {
            text: lines.get(..text_end).unwrap_or_default().to_owned(),
            spans,
        })
    }

    fn entry(&self, span: &[usize; 4]) -> (&str, &str) {
        let [n, ne, v, e] = *span;
        (
            self.text.get(n..ne).unwrap_or_default(),
            self.text.get(v..e).unwrap_or_default(),
        )
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        // Lengths first: most names differ in length, and this runs for
        // every header a frame handler asks about.
        let text = self.text.as_bytes();
        let span = self.spans.iter().find(|[n, ne, _, _]| {
            ne - n == name.len() && text.get(*n..*ne) == Some(name.as_bytes())
        })?;
        Some(self.entry(span).1)
    }

    /// All headers in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.spans.iter().map(|s| self.entry(s))
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
}
