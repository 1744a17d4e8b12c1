//! The reader [`super::decode_message`] decodes with: the store's
//! [`rosetta_store::wire::Reader`] encoding, read from a plain slice.
//!
//! A stream reader decodes every record it sends (issue 17), and the
//! message has some twenty fields, most of them absent: each read through
//! the store's reader (a [`Bytes`] it dereferences on every call, and a
//! `Result` per presence byte) cost 20 to 50 instructions, about half of
//! a record's decode. Here a field is a bounds check and a load; only the
//! byte fields (the body, annotations, binary ids) are [`Bytes`] views of
//! the record, without a copy, and only strings are allocated. Errors are
//! the store's [`DecodeError`]s, as before.

use bytes::Bytes;
use rosetta_store::wire::DecodeError;

/// A bounds-checked position in one encoded message.
pub(super) struct Cursor<'a> {
    /// The whole buffer, for zero-copy slices of it.
    whole: &'a Bytes,
    /// The same bytes as a slice (`whole`'s dereference, done once).
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(whole: &'a Bytes) -> Self {
        Cursor {
            whole,
            buf: whole,
            pos: 0,
        }
    }

    /// Bytes not yet read.
    pub(super) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[cold]
    fn truncated(&self, what: &'static str, need: usize) -> DecodeError {
        DecodeError::Truncated {
            what,
            need,
            have: self.remaining(),
        }
    }

    /// The next `n` bytes.
    #[inline(always)]
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let buf: &'a [u8] = self.buf;
        match buf.get(self.pos..).and_then(|rest| rest.get(..n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(self.truncated(what, n)),
        }
    }

    #[inline(always)]
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    #[inline(always)]
    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.truncated(what, 1)),
        }
    }

    #[inline(always)]
    pub(super) fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::BadTag { what, tag }),
        }
    }

    #[inline(always)]
    pub(super) fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    #[inline(always)]
    pub(super) fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    #[inline(always)]
    pub(super) fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    #[inline(always)]
    pub(super) fn uuid(&mut self, what: &'static str) -> Result<[u8; 16], DecodeError> {
        self.array(what)
    }

    /// A length prefix, checked against what remains.
    #[inline(always)]
    fn length(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let n = usize::try_from(self.u32(what)?).unwrap_or(usize::MAX);
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        Ok(n)
    }

    /// A count of items at least `min_elem_bytes` each, checked against
    /// what remains before anything is allocated for them.
    pub(super) fn count(
        &mut self,
        min_elem_bytes: usize,
        what: &'static str,
    ) -> Result<usize, DecodeError> {
        let n = usize::try_from(self.u32(what)?).unwrap_or(usize::MAX);
        let need = n.saturating_mul(min_elem_bytes.max(1));
        if need > self.remaining() {
            return Err(self.truncated(what, need));
        }
        Ok(n)
    }

    /// Length-prefixed bytes, a view of the buffer.
    #[inline(always)]
    pub(super) fn bytes(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let n = self.length(what)?;
        let start = self.pos;
        self.pos += n;
        Ok(self.whole.slice(start..start + n))
    }

    /// A length-prefixed UTF-8 string, copied out.
    #[inline(always)]
    pub(super) fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let n = self.length(what)?;
        let raw = self.take(n, what)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| DecodeError::BadUtf8 { what })
    }

    #[inline(always)]
    pub(super) fn opt_string(&mut self, what: &'static str) -> Result<Option<String>, DecodeError> {
        if self.bool(what)? {
            self.string(what).map(Some)
        } else {
            Ok(None)
        }
    }

    #[inline(always)]
    pub(super) fn opt_bytes(&mut self, what: &'static str) -> Result<Option<Bytes>, DecodeError> {
        if self.bool(what)? {
            self.bytes(what).map(Some)
        } else {
            Ok(None)
        }
    }

    #[inline(always)]
    pub(super) fn opt_u32(&mut self, what: &'static str) -> Result<Option<u32>, DecodeError> {
        if self.bool(what)? {
            self.u32(what).map(Some)
        } else {
            Ok(None)
        }
    }

    #[inline(always)]
    pub(super) fn opt_u64(&mut self, what: &'static str) -> Result<Option<u64>, DecodeError> {
        if self.bool(what)? {
            self.u64(what).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Fails unless every byte was read.
    pub(super) fn finish(&self, what: &'static str) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::Trailing { what, extra }),
        }
    }
}
