//! Little-endian primitives of the record encoding, public so that what
//! the store keeps opaque (the core's message codec) is written the same way.
//!
//! Every integer has an explicit width. Variable-length items carry a `u32`
//! length prefix. The one decoder, [`Reader`], reads from a [`Bytes`] so
//! that byte fields (payloads, annotations) are zero-copy slices of the entry
//! they came from, and every read is bounds-checked: corrupt input yields a
//! [`DecodeError`], never a panic.

use bytes::Bytes;

/// Why bytes could not be decoded. Recovery treats these as corruption of a
/// checksummed entry (a bug or a newer format), never as a torn write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes left than the item needs.
    #[error("truncated: {what} needs {need} bytes, {have} left")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// A tag byte outside the known set.
    #[error("unknown {what} tag {tag}")]
    BadTag {
        /// Which enumeration.
        what: &'static str,
        /// The tag found.
        tag: u8,
    },
    /// A record or message version this build does not know.
    #[error("unsupported {what} version {version}")]
    UnsupportedVersion {
        /// Which item.
        what: &'static str,
        /// The version found.
        version: u8,
    },
    /// A string that is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    BadUtf8 {
        /// Which field.
        what: &'static str,
    },
    /// A `char` property that is not a Unicode scalar value.
    #[error("invalid char value {0:#x}")]
    BadChar(u32),
    /// Bytes left over after an item that must fill its frame exactly.
    #[error("{extra} trailing bytes after {what}")]
    Trailing {
        /// Which item.
        what: &'static str,
        /// Bytes left over.
        extra: usize,
    },
}

/// Appends a `u8`.
#[inline]
pub fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

/// Appends a `bool` as one byte (0 or 1).
#[inline]
pub fn put_bool(out: &mut Vec<u8>, v: bool) {
    out.push(u8::from(v));
}

/// Appends a little-endian `u16`.
#[inline]
pub fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a little-endian `u32`.
#[inline]
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a little-endian `u64`.
#[inline]
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a length prefix. Lengths above `u32::MAX` cannot occur: an entry
/// body is capped far below that before anything is encoded, and callers
/// check the final size against that cap.
#[inline]
pub fn put_len(out: &mut Vec<u8>, len: usize) {
    put_u32(out, u32::try_from(len).unwrap_or(u32::MAX));
}

/// Appends length-prefixed bytes.
#[inline]
pub fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    put_len(out, v.len());
    out.extend_from_slice(v);
}

/// Appends a length-prefixed UTF-8 string.
#[inline]
pub fn put_str(out: &mut Vec<u8>, v: &str) {
    put_bytes(out, v.as_bytes());
}

/// Appends an optional string: presence byte, then the string.
#[inline]
pub fn put_opt_str(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        None => put_u8(out, 0),
        Some(s) => {
            put_u8(out, 1);
            put_str(out, s);
        }
    }
}

/// Appends optional bytes: presence byte, then the bytes.
#[inline]
pub fn put_opt_bytes(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        None => put_u8(out, 0),
        Some(b) => {
            put_u8(out, 1);
            put_bytes(out, b);
        }
    }
}

/// Appends an optional `u32`.
#[inline]
pub fn put_opt_u32(out: &mut Vec<u8>, v: Option<u32>) {
    match v {
        None => put_u8(out, 0),
        Some(x) => {
            put_u8(out, 1);
            put_u32(out, x);
        }
    }
}

/// Appends an optional `u64`.
#[inline]
pub fn put_opt_u64(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => put_u8(out, 0),
        Some(x) => {
            put_u8(out, 1);
            put_u64(out, x);
        }
    }
}

/// A bounds-checked reader over one encoded item.
///
/// It borrows the buffer: both as the [`Bytes`] it is, so that byte fields
/// (payloads, annotations, binary ids) are views of it without a copy, and
/// as a plain slice dereferenced once, so that a fixed-width field is a
/// bounds check and a load. A stream reader decodes every record it sends
/// (issue 17), and a message has some twenty fields, most of them absent:
/// through an owning reader that dereferenced its `Bytes` on every call and
/// built its error inline, a field cost 20 to 50 instructions, about half
/// of a record's decode. The hot methods are `#[inline(always)]` because
/// their caller, the core's message codec, is another crate.
pub struct Reader<'a> {
    /// The whole buffer, for zero-copy slices of it.
    whole: &'a Bytes,
    /// The same bytes as a slice (`whole`'s dereference, done once).
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Reads `buf` from its start.
    #[inline]
    pub fn new(buf: &'a Bytes) -> Self {
        Self {
            whole: buf,
            buf,
            pos: 0,
        }
    }

    /// Bytes not yet read.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Fails unless every byte was read.
    #[inline]
    pub fn finish(&self, what: &'static str) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::Trailing { what, extra }),
        }
    }

    /// Everything not yet read, as a zero-copy slice; the reader is then at
    /// the end. For a last field that fills the rest of its frame.
    #[inline]
    pub fn rest(&mut self) -> Bytes {
        let out = self.whole.slice(self.pos..);
        self.pos = self.buf.len();
        out
    }

    // Out of line: an error is rare, and building it inline made every
    // field's read longer.
    #[cold]
    fn truncated(&self, what: &'static str, need: usize) -> DecodeError {
        DecodeError::Truncated {
            what,
            need,
            have: self.remaining(),
        }
    }

    /// The next `n` bytes, borrowed.
    #[inline(always)]
    fn slice(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let buf: &'a [u8] = self.buf;
        match buf.get(self.pos..).and_then(|rest| rest.get(..n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(self.truncated(what, n)),
        }
    }

    /// The next `n` bytes as a zero-copy slice of the buffer.
    #[inline(always)]
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        let start = self.pos;
        self.pos += n;
        Ok(self.whole.slice(start..start + n))
    }

    #[inline(always)]
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let s = self.slice(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    /// Reads a `u8`.
    #[inline(always)]
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.truncated(what, 1)),
        }
    }

    /// Reads a `bool`; any byte other than 0 or 1 is an error.
    #[inline(always)]
    pub fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::BadTag { what, tag }),
        }
    }

    /// Reads a little-endian `u16`.
    #[inline(always)]
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// Reads a little-endian `u32`.
    #[inline(always)]
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// Reads a little-endian `u64`.
    #[inline(always)]
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reads 16 raw bytes (UUIDs).
    #[inline(always)]
    pub fn uuid(&mut self, what: &'static str) -> Result<[u8; 16], DecodeError> {
        self.array(what)
    }

    /// Reads a length prefix and checks that many bytes remain.
    #[inline(always)]
    pub fn length(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let n = usize::try_from(self.u32(what)?).unwrap_or(usize::MAX);
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        Ok(n)
    }

    /// Reads an element count whose elements each need at least
    /// `min_elem_bytes`, so a corrupt count cannot make us reserve memory
    /// the input could never fill.
    #[inline]
    pub fn count(
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

    /// Reads length-prefixed bytes (zero-copy).
    #[inline(always)]
    pub fn bytes(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let n = self.length(what)?;
        self.take(n, what)
    }

    /// Reads a length-prefixed UTF-8 string, copied out of the buffer (no
    /// `Bytes` view of it first: that view's reference count, taken and
    /// dropped again, was a third of a string's decode).
    #[inline(always)]
    pub fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let n = self.length(what)?;
        let raw = self.slice(n, what)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| DecodeError::BadUtf8 { what })
    }

    /// Reads an optional string: a presence byte, then the string.
    #[inline(always)]
    pub fn opt_string(&mut self, what: &'static str) -> Result<Option<String>, DecodeError> {
        if self.bool(what)? {
            self.string(what).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Reads optional bytes.
    #[inline(always)]
    pub fn opt_bytes(&mut self, what: &'static str) -> Result<Option<Bytes>, DecodeError> {
        if self.bool(what)? {
            self.bytes(what).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Reads an optional `u32`.
    #[inline(always)]
    pub fn opt_u32(&mut self, what: &'static str) -> Result<Option<u32>, DecodeError> {
        if self.bool(what)? {
            self.u32(what).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Reads an optional `u64`.
    #[inline(always)]
    pub fn opt_u64(&mut self, what: &'static str) -> Result<Option<u64>, DecodeError> {
        if self.bool(what)? {
            self.u64(what).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitives_round_trip_and_reject_short_input() {
        let mut out = Vec::new();
        put_u8(&mut out, 7);
        put_u16(&mut out, 0xBEEF);
        put_u32(&mut out, 0xDEAD_BEEF);
        put_u64(&mut out, u64::MAX - 1);
        put_str(&mut out, "héllo");
        put_opt_str(&mut out, None);
        put_opt_u64(&mut out, Some(42));
        let all = Bytes::from(out.clone());
        let mut r = Reader::new(&all);
        assert_eq!(r.u8("a"), Ok(7));
        assert_eq!(r.u16("b"), Ok(0xBEEF));
        assert_eq!(r.u32("c"), Ok(0xDEAD_BEEF));
        assert_eq!(r.u64("d"), Ok(u64::MAX - 1));
        assert_eq!(r.string("e").as_deref(), Ok("héllo"));
        assert_eq!(r.opt_string("f"), Ok(None));
        assert_eq!(r.opt_u64("g"), Ok(Some(42)));
        assert_eq!(r.finish("all"), Ok(()));

        // Every strict prefix fails cleanly somewhere, never panics.
        for cut in 0..out.len() {
            let prefix = Bytes::copy_from_slice(&out[..cut]);
            let mut r = Reader::new(&prefix);
            let res = (|| -> Result<(), DecodeError> {
                r.u8("a")?;
                r.u16("b")?;
                r.u32("c")?;
                r.u64("d")?;
                r.string("e")?;
                r.opt_string("f")?;
                r.opt_u64("g")?;
                Ok(())
            })();
            assert!(res.is_err(), "prefix {cut} decoded");
        }
    }

    #[test]
    fn huge_counts_and_lengths_are_rejected_before_allocating() {
        let mut out = Vec::new();
        put_u32(&mut out, u32::MAX);
        let out = Bytes::from(out);
        let mut r = Reader::new(&out);
        assert!(matches!(
            r.count(8, "n"),
            Err(DecodeError::Truncated { .. })
        ));
        let mut r = Reader::new(&out);
        assert!(matches!(r.bytes("b"), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn bool_rejects_other_bytes() {
        let one = Bytes::from_static(&[2]);
        let mut r = Reader::new(&one);
        assert_eq!(r.bool("x"), Err(DecodeError::BadTag { what: "x", tag: 2 }));
    }
}
