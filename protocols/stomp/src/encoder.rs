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

    /// Appends one header whose value `write` appends as is: for values
    /// the broker makes that can need no escape (numbers, ids).
    pub(crate) fn header_with(
        &mut self,
        name: &str,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> &mut Self {
        escape_into(self.out, name, self.escaping, true);
        self.out.push(b':');
        write(self.out);
        self.out.push(b'\n');
        self
    }

    /// Appends one header whose value is `parts` joined, escaped, without
    /// joining them first.
    pub(crate) fn header_with_escaped(&mut self, name: &str, parts: &[&str]) -> &mut Self {
        escape_into(self.out, name, self.escaping, true);
        self.out.push(b':');
        for p in parts {
            escape_into(self.out, p, self.escaping, false);
        }
        self.out.push(b'\n');
        self
    }

    /// Appends one header whose value is a number (no escape can be
    /// needed, and nothing is allocated).
    pub fn header_u64(&mut self, name: &str, value: u64) -> &mut Self {
        escape_into(self.out, name, self.escaping, true);
        self.out.push(b':');
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

/// Appends `v` in decimal.
pub(crate) fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_in_decimal() {
        for v in [0u64, 7, 10, 12_345, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }
}
