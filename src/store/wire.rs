//! Little-endian primitives of the record encoding, public so that what
//! the store keeps opaque (the core's message codec) is written the same way.
//!
//! Every integer has an explicit width. Variable-length items carry a `u32`
//! length prefix. The decoder reads from a [`Bytes`] so that byte fields
//! (payloads, annotations) are zero-copy slices of the entry they came from,
//! and every read is bounds-checked: corrupt input yields a [`DecodeError`],
//! never a panic.

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

/// A bounds-checked reader over a [`Bytes`] buffer.
pub struct Reader {
    buf: Bytes,
    pos: usize,
}

// Every method is `#[inline]`, as the `put_` functions are: the core's
// message codec, another crate, calls them once per field of every record
// it reads or writes, and without it each was a call of its own (a stream
// append's encoding, issue 17).
impl Reader {
    /// Reads `buf` from its start.
    #[inline]
    pub fn new(buf: Bytes) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes not yet read.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
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
        let out = self.buf.slice(self.pos.min(self.buf.len())..);
        self.pos = self.buf.len();
        out
    }

    /// The next `n` bytes as a zero-copy slice.
    #[inline]
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        let have = self.remaining();
        if n > have {
            return Err(DecodeError::Truncated {
                what,
                need: n,
                have,
            });
        }
        let out = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }

    #[inline]
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let have = self.remaining();
        let src = self
            .buf
            .get(self.pos..self.pos + N)
            .ok_or(DecodeError::Truncated {
                what,
                need: N,
                have,
            })?;
        let mut out = [0u8; N];
        out.copy_from_slice(src);
        self.pos += N;
        Ok(out)
    }

    /// Reads a `u8`.
    #[inline]
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// Reads a `bool`; any byte other than 0 or 1 is an error.
    #[inline]
    pub fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::BadTag { what, tag }),
        }
    }

    /// Reads a little-endian `u16`.
    #[inline]
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// Reads a little-endian `u32`.
    #[inline]
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// Reads a little-endian `u64`.
    #[inline]
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reads 16 raw bytes (UUIDs).
    #[inline]
    pub fn uuid(&mut self, what: &'static str) -> Result<[u8; 16], DecodeError> {
        self.array(what)
    }

    /// Reads a length prefix and checks that many bytes remain.
    #[inline]
    pub fn length(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let n = usize::try_from(self.u32(what)?).unwrap_or(usize::MAX);
        let have = self.remaining();
        if n > have {
            return Err(DecodeError::Truncated {
                what,
                need: n,
                have,
            });
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
        let have = self.remaining();
        if n.saturating_mul(min_elem_bytes.max(1)) > have {
            return Err(DecodeError::Truncated {
                what,
                need: n.saturating_mul(min_elem_bytes.max(1)),
                have,
            });
        }
        Ok(n)
    }

    /// Reads length-prefixed bytes (zero-copy).
    #[inline]
    pub fn bytes(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let n = self.length(what)?;
        self.take(n, what)
    }

    /// Reads a length-prefixed UTF-8 string.
    #[inline]
    pub fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        // Copied from the buffer without a `Bytes` view of it first (that
        // view's reference count, taken and dropped again, was a third of
        // a string's decode: every stream record read has several).
        let n = self.length(what)?;
        let text = self
            .buf
            .get(self.pos..self.pos + n)
            .map(std::str::from_utf8)
            .ok_or(DecodeError::Truncated {
                what,
                need: n,
                have: self.remaining(),
            })?
            .map_err(|_| DecodeError::BadUtf8 { what })?
            .to_owned();
        self.pos += n;
        Ok(text)
    }

    /// Reads a presence byte.
    #[inline]
    fn present(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        self.bool(what)
    }

    /// Reads an optional string.
    #[inline]
    pub fn opt_string(&mut self, what: &'static str) -> Result<Option<String>, DecodeError> {
        if self.present(what)? {
            self.string(what).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Reads optional bytes.
    #[inline]
    pub fn opt_bytes(&mut self, what: &'static str) -> Result<Option<Bytes>, DecodeError> {
        if self.present(what)? {
            self.bytes(what).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Reads an optional `u32`.
    #[inline]
    pub fn opt_u32(&mut self, what: &'static str) -> Result<Option<u32>, DecodeError> {
        if self.present(what)? {
            self.u32(what).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Reads an optional `u64`.
    #[inline]
    pub fn opt_u64(&mut self, what: &'static str) -> Result<Option<u64>, DecodeError> {
        if self.present(what)? {
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
        let mut r = Reader::new(Bytes::from(out.clone()));
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
            let mut r = Reader::new(Bytes::copy_from_slice(&out[..cut]));
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
        let mut r = Reader::new(Bytes::from(out.clone()));
        assert!(matches!(
            r.count(8, "n"),
            Err(DecodeError::Truncated { .. })
        ));
        let mut r = Reader::new(Bytes::from(out));
        assert!(matches!(r.bytes("b"), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn bool_rejects_other_bytes() {
        let mut r = Reader::new(Bytes::from_static(&[2]));
        assert_eq!(r.bool("x"), Err(DecodeError::BadTag { what: "x", tag: 2 }));
    }
}
