//! The newest records of a stream, decoded once for all its readers.
//!
//! Readers at the tail read the same records at about the same time. Each
//! decoded its own [`Message`] from the record's bytes before: a hundred
//! readers, a hundred decodes and a hundred copies of every message's
//! headers in memory. Now the first reader to reach a record near the end
//! of the log decodes it and the others share that [`Arc`] (the body is a
//! slice of the log's tail cache, shared already).
//!
//! Only records near the log's end are kept ([`DECODED_MAX`] records and
//! [`DECODED_BYTES_MAX`] bytes), a contiguous run of offsets: a reader
//! deep in history decodes for itself and does not push the tail out.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use rosetta_neutral::Message;
use rosetta_store::wire::DecodeError;

/// Most records kept decoded per stream: a few readers' credit.
const DECODED_MAX: usize = 2048;
/// Most bytes of messages kept decoded per stream.
const DECODED_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Whether the record at `offset` is near enough to the log's readable
/// `end` to be kept decoded for every reader (see the module docs).
pub(crate) fn is_shared(offset: u64, end: u64) -> bool {
    end.saturating_sub(offset) <= DECODED_MAX as u64
}

/// See the module docs.
#[derive(Default)]
pub(crate) struct Decoded {
    /// Offset of `messages[0]`.
    first: u64,
    messages: VecDeque<Arc<Message>>,
    bytes: usize,
}

impl Decoded {
    /// The message of the record at `offset` with `body`, decoded now or
    /// by an earlier reader. `end` is the log's readable end: records
    /// within [`DECODED_MAX`] of it are kept for the next reader.
    pub(crate) fn get(
        &mut self,
        offset: u64,
        body: Bytes,
        end: u64,
    ) -> Result<Arc<Message>, DecodeError> {
        let next = self.first + self.messages.len() as u64;
        if offset >= self.first && offset < next {
            let i = usize::try_from(offset - self.first).unwrap_or(usize::MAX);
            if let Some(m) = self.messages.get(i) {
                return Ok(Arc::clone(m));
            }
        }
        let message = crate::codec::decode_message_exact(body)?;
        if !is_shared(offset, end) {
            return Ok(message); // history: not kept
        }
        if offset != next {
            // Not contiguous with what is kept: start again from here.
            self.messages.clear();
            self.bytes = 0;
            self.first = offset;
        }
        self.bytes += message.memory_size();
        self.messages.push_back(Arc::clone(&message));
        while self.messages.len() > DECODED_MAX || self.bytes > DECODED_BYTES_MAX {
            let Some(m) = self.messages.pop_front() else {
                break;
            };
            self.bytes -= m.memory_size();
            self.first += 1;
        }
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(text: &str) -> Bytes {
        let m = Message {
            body: rosetta_neutral::Body {
                kind: rosetta_neutral::BodyKind::Text,
                bytes: Bytes::copy_from_slice(text.as_bytes()),
            },
            ..Message::default()
        };
        let mut out = Vec::new();
        crate::codec::encode_message(&m, &mut out);
        Bytes::from(out)
    }

    #[test]
    fn readers_at_the_tail_share_one_decode_and_history_is_not_kept() {
        let mut d = Decoded::default();
        let a = d.get(100, record("a"), 102).expect("decodes");
        let b = d.get(101, record("b"), 102).expect("decodes");
        let a2 = d.get(100, record("ignored: cached"), 102).expect("cached");
        assert!(Arc::ptr_eq(&a, &a2), "the second reader shares the first's");
        assert!(Arc::ptr_eq(
            &b,
            &d.get(101, Bytes::new(), 102).expect("cached")
        ));
        // A record far behind the end is decoded but not kept.
        let old = d.get(5, record("old"), 100_000).expect("decodes");
        assert_eq!(&old.body.bytes[..], b"old");
        assert_eq!(d.messages.len(), 2);
        // A jump forward starts the run again.
        d.get(500, record("c"), 500).expect("decodes");
        assert_eq!((d.first, d.messages.len()), (500, 1));
        // A damaged record is an error, not a panic.
        assert!(d.get(501, Bytes::from_static(b"\xff"), 501).is_err());
    }
}
