//! Encoder for the frames a server sends (CONNECTED, MESSAGE, RECEIPT,
//! ERROR), writing straight into the connection's output buffer.
//!
//! ```
//! use rosetta_stomp::{Command, FrameWriter, Version};
//! let mut out = Vec::new();
//! FrameWriter::new(&mut out, Version::V1_2, Command::Receipt)
//!     .header("receipt-id", "77")
//!     .finish(b"");
//! assert_eq!(out, b"RECEIPT\nreceipt-id:77\n\n\0");
//! ```

use crate::escape::{escape_into, Escaping};
use crate::frame::{Command, Version};

/// Writes one frame: the command line on creation, then headers, then
/// [`FrameWriter::finish`] adds `content-length`, the blank line, the body
/// and the NUL.
#[derive(Debug)]
pub struct FrameWriter<'a> {
    out: &'a mut Vec<u8>,
    command: Command,
    escaping: Escaping,
}

impl<'a> FrameWriter<'a> {
    /// Starts a frame, escaping headers per `version` (none for CONNECTED).
    pub fn new(out: &'a mut Vec<u8>, version: Version, command: Command) -> Self {
        out.extend_from_slice(command.as_str().as_bytes());
        out.push(b'\n');
        Self {
            out,
            command,
            escaping: Escaping::for_frame(version, command),
        }
    }

    /// Appends one header, escaped.
    pub fn header(&mut self, name: &str, value: &str) -> &mut Self {
        escape_into(self.out, name, self.escaping, true);
        self.out.push(b':');
        escape_into(self.out, value, self.escaping, false);
        self.out.push(b'\n');
        self
    }

    /// Appends one of the broker's own headers: `name` is a constant
    /// that needs no escape (so it is copied, not checked byte by byte);
    /// `value` is escaped.
    #[inline]
    pub(crate) fn header_own(&mut self, name: &'static str, value: &str) -> &mut Self {
        self.own_name(name);
        escape_into(self.out, value, self.escaping, false);
        self.out.push(b'\n');
        self
    }

    /// [`Self::header_own`] with a value given as the bytes of a `str`.
    #[inline]
    pub(crate) fn header_own_bytes(&mut self, name: &'static str, value: &[u8]) -> &mut Self {
        self.own_name(name);
        crate::escape::escape_bytes_into(self.out, value, self.escaping, false);
        self.out.push(b'\n');
        self
    }

    /// Writes `name:` for one of the broker's own header names.
    #[inline]
    fn own_name(&mut self, name: &'static str) {
        debug_assert!(
            !name
                .bytes()
                .any(|b| matches!(b, b'\n' | b'\r' | b':' | b'\\')),
            "{name} needs escaping"
        );
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(b':');
    }

    /// Appends one of the broker's own headers (see [`Self::header_own`])
    /// whose value `write` appends as is: for values the broker makes that
    /// can need no escape (numbers, ids).
    #[inline]
    pub(crate) fn header_with(
        &mut self,
        name: &'static str,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> &mut Self {
        self.own_name(name);
        write(self.out);
        self.out.push(b'\n');
        self
    }

    /// Appends one of the broker's own headers (see [`Self::header_own`])
    /// whose value is `prefix` (a constant that needs no escape, so it is
    /// copied, not checked) followed by `value`, escaped, without joining
    /// them first: a destination's `/queue/` and its name.
    pub(crate) fn header_prefixed(
        &mut self,
        name: &'static str,
        prefix: &'static str,
        value: &str,
    ) -> &mut Self {
        debug_assert!(!crate::escape::may_need_escape(prefix.as_bytes()));
        self.own_name(name);
        self.out.extend_from_slice(prefix.as_bytes());
        escape_into(self.out, value, self.escaping, false);
        self.out.push(b'\n');
        self
    }

    /// Appends one of the broker's own headers whose name and value are
    /// constants that need no escape (`persistent:true`): copied, not
    /// checked.
    #[inline]
    pub(crate) fn header_const(&mut self, name: &'static str, value: &'static str) -> &mut Self {
        debug_assert!(!crate::escape::may_need_escape(value.as_bytes()));
        self.own_name(name);
        self.out.extend_from_slice(value.as_bytes());
        self.out.push(b'\n');
        self
    }

    /// Appends one of the broker's own headers (see [`Self::header_own`])
    /// whose value is a number (no escape can be needed, and nothing is
    /// allocated).
    pub fn header_u64(&mut self, name: &'static str, value: u64) -> &mut Self {
        self.own_name(name);
        push_u64(self.out, value);
        self.out.push(b'\n');
        self
    }

    /// Ends the frame with `body`. MESSAGE and ERROR frames, and any frame
    /// with a body, carry `content-length` so that bodies may hold NUL.
    pub fn finish(&mut self, body: &[u8]) {
        if !body.is_empty() || matches!(self.command, Command::Message | Command::Error) {
            self.out.extend_from_slice(b"content-length:");
            push_u64(self.out, body.len() as u64);
            self.out.push(b'\n');
        }
        self.out.push(b'\n');
        self.out.extend_from_slice(body);
        self.out.push(0);
    }
}

/// Appends `v` in decimal (numbers are written into every MESSAGE: its
/// ack id, offset and `content-length`). `itoa` writes two digits per
/// division, without going through `fmt`.
pub(crate) fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_in_decimal() {
        let around_powers = (0..20).flat_map(|e| {
            let p = 10u64.pow(e);
            [p - 1, p, p + 1, p.saturating_mul(7).saturating_add(3)]
        });
        for v in [0u64, 7, 10, 12_345, 99, 100, 101, u64::MAX]
            .into_iter()
            .chain(around_powers)
        {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }
}
