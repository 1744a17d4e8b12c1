//! Thin helpers around `serde_amqp`: a bounds-checked scanner that finds
//! where one encoded AMQP value ends, and encoding into a caller's buffer
//! (descriptors are read by `descriptor`).
//!
//! `serde_amqp::from_slice` decodes a value from a slice but does not say
//! how many bytes it consumed, and a transfer frame is a performative
//! followed by raw payload. [`value_len`] answers that by reading only the
//! format codes and size prefixes (never scanning bodies byte by byte), so
//! we can split a frame into performative and payload, and a message into
//! its sections, without decoding what the broker does not need.

use serde::Serialize;

/// Deepest nesting of described values the scanner follows. Legal AMQP
/// needs 2 (a described descriptor is not used in practice); the bound stops
/// a crafted frame from recursing deeply.
const DESCRIBED_DEPTH_MAX: usize = 8;

/// Deepest nesting of compound and described values [`decode`] accepts.
/// Performatives and message headers nest 3 or 4 levels; the bound keeps a
/// crafted frame from recursing deeply in `serde_amqp`.
const NESTING_MAX: usize = 32;

/// Why bytes could not be scanned or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The value claims more bytes than are present.
    #[error("truncated AMQP value")]
    Truncated,
    /// An unknown or reserved format code.
    #[error("invalid AMQP format code {0:#04x}")]
    BadFormatCode(u8),
    /// Described values nested deeper than we follow.
    #[error("described values nested too deeply")]
    TooDeep,
    /// A list, map or array claims more elements than its size can hold.
    #[error("AMQP compound claims {count} elements in {size} bytes")]
    BadCount {
        /// The claimed element count.
        count: usize,
        /// The bytes that follow the count.
        size: usize,
    },
    /// `serde_amqp` rejected the value.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// serde_amqp's message.
        detail: String,
    },
}

/// Length in bytes of the single AMQP value encoded at the start of `buf`.
pub(crate) fn value_len(buf: &[u8]) -> Result<usize, CodecError> {
    value_len_at(buf, 0)
}

fn value_len_at(buf: &[u8], depth: usize) -> Result<usize, CodecError> {
    let code = *buf.first().ok_or(CodecError::Truncated)?;
    let len = match code {
        0x00 => {
            if depth >= DESCRIBED_DEPTH_MAX {
                return Err(CodecError::TooDeep);
            }
            let rest = buf.get(1..).ok_or(CodecError::Truncated)?;
            let d = value_len_at(rest, depth + 1)?;
            let rest2 = rest.get(d..).ok_or(CodecError::Truncated)?;
            let v = value_len_at(rest2, depth + 1)?;
            1 + d + v
        }
        0x40..=0x45 => 1,
        0x50..=0x56 => 2,
        0x60 | 0x61 => 3,
        0x70..=0x74 => 5,
        0x80..=0x84 => 9,
        0x94 | 0x98 => 17,
        0xa0 | 0xa1 | 0xa3 | 0xc0 | 0xc1 | 0xe0 => {
            let n = *buf.get(1).ok_or(CodecError::Truncated)?;
            2 + usize::from(n)
        }
        0xb0 | 0xb1 | 0xb3 | 0xd0 | 0xd1 | 0xf0 => {
            let n = read_u32(buf, 1)?;
            5usize
                .checked_add(usize::try_from(n).map_err(|_| CodecError::Truncated)?)
                .ok_or(CodecError::Truncated)?
        }
        other => return Err(CodecError::BadFormatCode(other)),
    };
    if len > buf.len() {
        return Err(CodecError::Truncated);
    }
    Ok(len)
}

fn read_u32(buf: &[u8], at: usize) -> Result<u32, CodecError> {
    let b = buf.get(at..at + 4).ok_or(CodecError::Truncated)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Where the value of the described value at the start of `buf` begins
/// (after the `0x00` and the descriptor).
pub(crate) fn described_value_offset(buf: &[u8]) -> Result<usize, CodecError> {
    if buf.first() != Some(&0x00) {
        return Err(CodecError::Malformed {
            what: "section",
            detail: "not a described value".into(),
        });
    }
    let rest = buf.get(1..).ok_or(CodecError::Truncated)?;
    Ok(1 + value_len(rest)?)
}

/// Decodes one value with `serde_amqp`, after [`check_value`] has checked
/// every nested size and count against the bytes present.
pub(crate) fn decode<'a, T: serde::Deserialize<'a>>(
    what: &'static str,
    buf: &'a [u8],
) -> Result<T, CodecError> {
    check_value(buf, 0)?;
    serde_amqp::from_slice(buf).map_err(|e| CodecError::Malformed {
        what,
        detail: e.to_string(),
    })
}

/// Walks the whole value at the start of `buf` (unlike [`value_len`], into
/// compounds and arrays) and returns its length.
///
/// Why: `serde_amqp` 0.18 allocates what a size or count prefix claims
/// before it reads the bytes (`vec![0; n]` in `Read::read_bytes`), so a
/// 10-byte `sym32` claiming 3.6 GB in an Attach's source made it ask for
/// 3.6 GB and could abort the whole broker (found by the `connection` fuzz
/// target). Every size checked here fits in `buf`, and every count is at
/// most the bytes that follow it, so no allocation exceeds the frame.
fn check_value(buf: &[u8], depth: usize) -> Result<usize, CodecError> {
    let (code, ctor_len) = constructor(buf, depth)?;
    let rest = buf.get(ctor_len..).ok_or(CodecError::Truncated)?;
    Ok(ctor_len + check_body(code, rest, depth)?)
}

/// The format code of the constructor at the start of `buf` (after any
/// descriptor, which is checked) and the constructor's length.
fn constructor(buf: &[u8], depth: usize) -> Result<(u8, usize), CodecError> {
    if depth >= NESTING_MAX {
        return Err(CodecError::TooDeep);
    }
    match *buf.first().ok_or(CodecError::Truncated)? {
        0x00 => {
            let rest = buf.get(1..).ok_or(CodecError::Truncated)?;
            let d = check_value(rest, depth + 1)?;
            let code = *rest.get(d).ok_or(CodecError::Truncated)?;
            if code == 0x00 {
                // A described constructor inside a descriptor's value is not
                // AMQP; refusing it keeps the walk linear.
                return Err(CodecError::BadFormatCode(code));
            }
            Ok((code, 2 + d))
        }
        code => Ok((code, 1)),
    }
}

/// Checks the encoding that follows format code `code` at the start of
/// `buf` and returns its length.
pub(crate) fn check_body(code: u8, buf: &[u8], depth: usize) -> Result<usize, CodecError> {
    let (width, compound) = match code {
        0x40..=0x45 => return Ok(0),
        0x50..=0x56 => return fixed(buf, 1),
        0x60 | 0x61 => return fixed(buf, 2),
        0x70..=0x74 => return fixed(buf, 4),
        0x80..=0x84 => return fixed(buf, 8),
        0x94 | 0x98 => return fixed(buf, 16),
        0xa0 | 0xa1 | 0xa3 => (1, false),
        0xb0 | 0xb1 | 0xb3 => (4, false),
        0xc0 | 0xc1 | 0xe0 => (1, true),
        0xd0 | 0xd1 | 0xf0 => (4, true),
        other => return Err(CodecError::BadFormatCode(other)),
    };
    let size = read_width(buf, 0, width)?;
    let end = width.checked_add(size).ok_or(CodecError::Truncated)?;
    let region = buf.get(width..end).ok_or(CodecError::Truncated)?;
    if !compound {
        return Ok(end);
    }
    let count = read_width(region, 0, width)?;
    let mut items = &region[width..];
    if count > items.len() {
        return Err(CodecError::BadCount {
            count,
            size: items.len(),
        });
    }
    if code == 0xe0 || code == 0xf0 {
        // An array: one constructor, then `count` bodies of its type.
        let (elem, ctor_len) = constructor(items, depth + 1)?;
        items = &items[ctor_len..];
        for _ in 0..count {
            let n = check_body(elem, items, depth + 1)?;
            items = &items[n..];
        }
    } else {
        for _ in 0..count {
            let n = check_value(items, depth + 1)?;
            items = &items[n..];
        }
    }
    Ok(end)
}

fn fixed(buf: &[u8], width: usize) -> Result<usize, CodecError> {
    if buf.len() < width {
        return Err(CodecError::Truncated);
    }
    Ok(width)
}

/// A 1- or 4-byte big-endian size or count at `at`.
pub(crate) fn read_width(buf: &[u8], at: usize, width: usize) -> Result<usize, CodecError> {
    let n = if width == 1 {
        u32::from(*buf.get(at).ok_or(CodecError::Truncated)?)
    } else {
        read_u32(buf, at)?
    };
    usize::try_from(n).map_err(|_| CodecError::Truncated)
}

/// Appends the AMQP encoding of `value` to `out` (no intermediate buffer).
pub(crate) fn encode_into<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
) -> Result<(), serde_amqp::Error> {
    let mut ser = serde_amqp::ser::Serializer::new(out);
    value.serialize(&mut ser)
}

/// Appends a binary (`vbin8`/`vbin32`) header for `len` bytes.
pub(crate) fn write_binary_header(out: &mut Vec<u8>, len: usize) {
    write_var_header(out, 0xa0, 0xb0, len);
}

/// Appends a string (`str8`/`str32`) header for `len` bytes.
pub(crate) fn write_string_header(out: &mut Vec<u8>, len: usize) {
    write_var_header(out, 0xa1, 0xb1, len);
}

/// Appends the header of a variable-width value of `len` bytes: the
/// `short` constructor with a one-byte length when it fits, else `long`
/// with four (`vbin`, `str`, `sym`).
pub(crate) fn write_var_header(out: &mut Vec<u8>, short: u8, long: u8, len: usize) {
    match u8::try_from(len) {
        Ok(n) => {
            out.push(short);
            out.push(n);
        }
        Err(_) => {
            // Our own invariant: the journal and frames bound messages far
            // below 4 GiB.
            let n = u32::try_from(len).unwrap_or(u32::MAX);
            out.push(long);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

/// The payload of a `vbin`/`str`/`sym` value at the start of `buf`: the
/// range of the raw bytes within `buf`.
pub(crate) fn variable_payload(buf: &[u8]) -> Option<std::ops::Range<usize>> {
    match *buf.first()? {
        0xa0 | 0xa1 | 0xa3 => {
            let n = usize::from(*buf.get(1)?);
            (2 + n <= buf.len()).then_some(2..2 + n)
        }
        0xb0 | 0xb1 | 0xb3 => {
            let n = usize::try_from(read_u32(buf, 1).ok()?).ok()?;
            let end = 5usize.checked_add(n)?;
            (end <= buf.len()).then_some(5..end)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_fixed_and_variable_widths() {
        assert_eq!(value_len(&[0x40]), Ok(1));
        assert_eq!(value_len(&[0x53, 7]), Ok(2));
        assert_eq!(value_len(&[0xa1, 2, b'h', b'i', 0xff]), Ok(4));
        assert_eq!(value_len(&[0xb0, 0, 0, 0, 1, 9]), Ok(6));
        assert_eq!(value_len(&[0x00, 0x53, 0x75, 0xa0, 1, 5]), Ok(6));
        assert_eq!(value_len(&[0xc0, 1, 0x40]), Ok(3));
    }

    #[test]
    fn truncation_and_bad_codes_are_errors() {
        assert_eq!(value_len(&[]), Err(CodecError::Truncated));
        assert_eq!(value_len(&[0xa1, 5, b'h']), Err(CodecError::Truncated));
        assert_eq!(
            value_len(&[0xb0, 0xff, 0xff, 0xff, 0xff]),
            Err(CodecError::Truncated)
        );
        assert_eq!(value_len(&[0x00]), Err(CodecError::Truncated));
        assert_eq!(value_len(&[0x33]), Err(CodecError::BadFormatCode(0x33)));
        let deep = [0x00; 64];
        assert!(value_len(&deep).is_err());
    }

    #[test]
    fn nested_sizes_and_counts_are_checked_before_decoding() {
        // list8 [null, str8 "hi"], and an array8 of two ubytes.
        assert_eq!(
            check_value(&[0xc0, 6, 2, 0x40, 0xa1, 2, b'h', b'i'], 0),
            Ok(8)
        );
        assert_eq!(check_value(&[0xe0, 4, 2, 0x50, 7, 8], 0), Ok(6));
        // A sym32 inside a list claiming 3.6 GB.
        let huge = [0xc0, 6, 1, 0xb3, 0xd7, 0x3f, 0xfb, 0x01];
        assert_eq!(
            value_len(&huge),
            Ok(8),
            "the shallow scan does not look inside"
        );
        assert_eq!(check_value(&huge, 0), Err(CodecError::Truncated));
        // A list32 claiming 2^32-1 elements in 4 bytes.
        let count = [0xd0, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            check_value(&count, 0),
            Err(CodecError::BadCount { .. })
        ));
        let mut deep = vec![0x40];
        for _ in 0..40 {
            let size = u8::try_from(deep.len() + 1).unwrap();
            deep.splice(0..0, [0xc0, size, 1]);
        }
        assert_eq!(check_value(&deep, 0), Err(CodecError::TooDeep));
        assert_eq!(check_value(&[0x00; 64], 0), Err(CodecError::TooDeep));
    }
}
