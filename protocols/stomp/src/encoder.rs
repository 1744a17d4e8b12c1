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

    /// Ends the frame with `body`. MESSAGE and ERROR frames, and any frame
    /// with a body, carry `content-length` so that bodies may hold NUL.
    pub fn finish(&mut self, body: &[u8]) {
        if !body.is_empty() || matches!(self.command, Command::Message | Command::Error) {
            self.out.extend_from_slice(b"content-length:");
            self.out
                .extend_from_slice(body.len().to_string().as_bytes());
            self.out.push(b'\n');
        }
        self.out.push(b'\n');
        self.out.extend_from_slice(body);
        self.out.push(0);
    }
}
