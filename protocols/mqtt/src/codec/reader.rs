//! A bounds-checked cursor over one frame's bytes.
//!
//! Every read returns [`CodecError::Malformed`] when the frame is too short,
//! so no peer input can make the decoder index out of bounds. Binary fields
//! are sliced out of the frame's [`Bytes`] without copying.

use bytes::Bytes;

use super::CodecError;

/// A read cursor over one complete frame (fixed header already consumed).
pub(crate) struct Reader {
    bytes: Bytes,
}

impl Reader {
    pub(crate) fn new(bytes: Bytes) -> Self {
        Self { bytes }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub(crate) fn u8(&mut self) -> Result<u8, CodecError> {
        let b = self.take(1)?;
        b.first()
            .copied()
            .ok_or(CodecError::Malformed("short field"))
    }

    pub(crate) fn u16(&mut self) -> Result<u16, CodecError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, CodecError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A variable byte integer (at most four bytes, 268,435,455).
    pub(crate) fn varint(&mut self) -> Result<u32, CodecError> {
        let mut value: u32 = 0;
        for i in 0..4 {
            let byte = self.u8()?;
            value |= u32::from(byte & 0x7F) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(CodecError::Malformed(
            "variable byte integer longer than 4 bytes",
        ))
    }

    /// Two-byte length followed by that many bytes (zero-copy).
    pub(crate) fn binary(&mut self) -> Result<Bytes, CodecError> {
        let len = usize::from(self.u16()?);
        self.take(len)
    }

    /// A UTF-8 string: length-prefixed, well-formed UTF-8 and no U+0000
    /// (MQTT 1.5.4: both are malformed packets).
    pub(crate) fn string(&mut self) -> Result<String, CodecError> {
        let raw = self.binary()?;
        let s = std::str::from_utf8(&raw).map_err(|_| CodecError::InvalidUtf8)?;
        if s.contains('\0') {
            return Err(CodecError::InvalidUtf8);
        }
        Ok(s.to_owned())
    }

    /// The next `len` bytes (zero-copy).
    pub(crate) fn take(&mut self, len: usize) -> Result<Bytes, CodecError> {
        if len > self.bytes.len() {
            return Err(CodecError::Malformed("field crosses the end of the packet"));
        }
        Ok(self.bytes.split_to(len))
    }

    /// Everything left (zero-copy).
    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.bytes)
    }
}
