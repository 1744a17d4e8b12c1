//! AMQP values on top of `serde_amqp`: a bounds-checked walk that says
//! where one encoded value ends (serde_amqp does not, yet a transfer frame
//! is a performative followed by raw message bytes), performative decoding
//! behind that check, and the message sections this tool sends and reads.

use std::ops::Range;

use bytes::Bytes;
use fe2o3_amqp_types::performatives::Performative;
use serde_amqp::serde::{Deserialize, Serialize};

/// Deepest nesting of compound and described values accepted. Performatives
/// and message sections nest 3 or 4 levels; the bound keeps a crafted value
/// from recursing deeply.
const NESTING_MAX: usize = 32;

/// Descriptor code of a `data` body section.
pub(crate) const SECTION_DATA: u64 = 0x75;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CodecError {
    #[error("truncated AMQP value")]
    Truncated,
    #[error("invalid AMQP format code {0:#04x}")]
    BadFormatCode(u8),
    #[error("AMQP values nested too deeply")]
    TooDeep,
    #[error("AMQP compound claims {count} elements in {size} bytes")]
    BadCount { count: usize, size: usize },
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
}

/// Checks the whole value at the start of `buf`, into compounds and arrays,
/// and returns its length.
///
/// Why before every `serde_amqp` decode: serde_amqp 0.18 allocates what a
/// size or count prefix claims before reading the bytes, so a few bytes
/// claiming gigabytes would make it ask for gigabytes. Every size checked
/// here fits in `buf` and every count is at most the bytes that follow it.
pub(crate) fn check_value(buf: &[u8]) -> Result<usize, CodecError> {
    check_at(buf, 0)
}

fn check_at(buf: &[u8], depth: usize) -> Result<usize, CodecError> {
    let (code, ctor_len) = constructor(buf, depth)?;
    let rest = buf.get(ctor_len..).ok_or(CodecError::Truncated)?;
    Ok(ctor_len + check_body(code, rest, depth)?)
}

/// The format code at the start of `buf` after any descriptor (which is
/// checked), and the length of the constructor.
fn constructor(buf: &[u8], depth: usize) -> Result<(u8, usize), CodecError> {
    if depth >= NESTING_MAX {
        return Err(CodecError::TooDeep);
    }
    match *buf.first().ok_or(CodecError::Truncated)? {
        0x00 => {
            let rest = buf.get(1..).ok_or(CodecError::Truncated)?;
            let d = check_at(rest, depth + 1)?;
            match *rest.get(d).ok_or(CodecError::Truncated)? {
                // A described value as the constructor of a described value
                // is not AMQP; refusing it keeps the walk linear.
                0x00 => Err(CodecError::BadFormatCode(0x00)),
                code => Ok((code, 2 + d)),
            }
        }
        code => Ok((code, 1)),
    }
}

/// Checks the encoding after format code `code` and returns its length.
fn check_body(code: u8, buf: &[u8], depth: usize) -> Result<usize, CodecError> {
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
    let size = read_width(buf, width)?;
    let end = width.checked_add(size).ok_or(CodecError::Truncated)?;
    let region = buf.get(width..end).ok_or(CodecError::Truncated)?;
    if !compound {
        return Ok(end);
    }
    let count = read_width(region, width)?;
    let mut items = region.get(width..).ok_or(CodecError::Truncated)?;
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
            let n = check_at(items, depth + 1)?;
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

/// A 1- or 4-byte big-endian size or count at the start of `buf`.
fn read_width(buf: &[u8], width: usize) -> Result<usize, CodecError> {
    let b = buf.get(..width).ok_or(CodecError::Truncated)?;
    let n = match *b {
        [n] => u32::from(n),
        [a, b, c, d] => u32::from_be_bytes([a, b, c, d]),
        _ => return Err(CodecError::Truncated),
    };
    usize::try_from(n).map_err(|_| CodecError::Truncated)
}

/// Decodes exactly one value, checked first, with `serde_amqp`.
pub(crate) fn decode<'a, T: Deserialize<'a>>(
    what: &'static str,
    buf: &'a [u8],
) -> Result<T, CodecError> {
    let len = check_value(buf)?;
    if len != buf.len() {
        return Err(CodecError::Malformed {
            what,
            detail: format!("{} bytes after the value", buf.len() - len),
        });
    }
    serde_amqp::from_slice(buf).map_err(|e| CodecError::Malformed {
        what,
        detail: e.to_string(),
    })
}

/// Splits an AMQP frame body into its performative and the bytes after it
/// (a transfer's message; empty for every other performative).
pub(crate) fn split_performative(body: &Bytes) -> Result<(Performative, Bytes), CodecError> {
    let len = check_value(body)?;
    let perf = decode("performative", &body[..len])?;
    Ok((perf, body.slice(len..)))
}

/// The numeric descriptor code of the described value at the start of
/// `buf` (`0x00 0x53 code` or `0x00 0x80 u64`), or `None`.
pub(crate) fn descriptor_code(buf: &[u8]) -> Option<u64> {
    match buf {
        [0x00, 0x53, code, ..] => Some(u64::from(*code)),
        [0x00, 0x80, rest @ ..] => {
            let b: [u8; 8] = rest.get(..8)?.try_into().ok()?;
            Some(u64::from_be_bytes(b))
        }
        _ => None,
    }
}

/// Appends the AMQP encoding of `value` to `out`.
pub(crate) fn encode_into<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
) -> Result<(), serde_amqp::Error> {
    let mut ser = serde_amqp::ser::Serializer::new(out);
    value.serialize(&mut ser)
}

/// Appends a `data` section holding `payload`: the same bytes as
/// serde_amqp's encoding of `Data(payload)` (a test checks it), written
/// here so the payload is copied once, into `out`.
pub(crate) fn write_data_section(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&[0x00, 0x53, SECTION_DATA as u8]);
    // vbin8 up to 254 bytes, as serde_amqp does (either is valid AMQP).
    match u8::try_from(payload.len()) {
        Ok(n) if n < u8::MAX => out.extend_from_slice(&[0xa0, n]),
        _ => {
            // Our own invariant: --size is far below 4 GiB and messages are
            // bounded by MESSAGE_SIZE_MAX.
            let n = u32::try_from(payload.len()).expect("payload under 4 GiB");
            out.push(0xb0);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

/// Where the payload of the first `data` section of `message` (a run of
/// sections) lies; `None` if there is no data section. Every section is
/// checked, so a malformed one after the data is still an error.
pub(crate) fn data_payload(message: &[u8]) -> Result<Option<Range<usize>>, CodecError> {
    let mut at = 0;
    let mut found = None;
    while at < message.len() {
        let section = &message[at..];
        let len = check_value(section)?;
        if section.first() != Some(&0x00) {
            return Err(CodecError::Malformed {
                what: "message",
                detail: "a section is not a described value".into(),
            });
        }
        if found.is_none() && descriptor_code(section) == Some(SECTION_DATA) {
            // check_value vouched for the whole section: descriptor, then a
            // vbin8/vbin32 header, then the payload.
            let value = &section[3..len];
            let header = match value.first() {
                Some(0xa0) => 2,
                Some(0xb0) => 5,
                _ => {
                    return Err(CodecError::Malformed {
                        what: "data section",
                        detail: "not a binary".into(),
                    })
                }
            };
            found = Some(at + 3 + header..at + len);
        }
        at += len;
    }
    Ok(found)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a panic here is a failed assertion
mod tests {
    use super::*;
    use fe2o3_amqp_types::definitions::Handle;
    use fe2o3_amqp_types::messaging::{Data, Header, MessageAnnotations};
    use fe2o3_amqp_types::performatives::Transfer;
    use serde_amqp::primitives::Binary;

    #[test]
    fn data_section_matches_serde_amqp() {
        for size in [0, 8, 254, 255, 256, 70_000] {
            let payload = vec![7u8; size];
            let mut ours = Vec::new();
            write_data_section(&mut ours, &payload);
            let theirs = serde_amqp::to_vec(&Data(Binary::from(payload.clone()))).unwrap();
            assert_eq!(ours, theirs, "size {size}");
            assert_eq!(
                data_payload(&ours).unwrap(),
                Some(ours.len() - size..ours.len())
            );
        }
    }

    #[test]
    fn data_is_found_after_other_sections() {
        let mut msg = serde_amqp::to_vec(&Header {
            durable: true,
            ..Header::default()
        })
        .unwrap();
        msg.extend(serde_amqp::to_vec(&MessageAnnotations::default()).unwrap());
        let start = msg.len();
        write_data_section(&mut msg, b"payload");
        let r = data_payload(&msg).unwrap().unwrap();
        assert_eq!(&msg[r.clone()], b"payload");
        assert!(r.start > start);
        // No data section at all.
        assert_eq!(data_payload(&msg[..start]).unwrap(), None);
        // A truncated data section is an error, not a short payload.
        assert_eq!(
            data_payload(&msg[..msg.len() - 1]),
            Err(CodecError::Truncated)
        );
        // A section that is not described.
        assert!(data_payload(&[0x40]).is_err());
    }

    #[test]
    fn transfer_splits_into_performative_and_message() {
        let t = Performative::Transfer(Transfer {
            handle: Handle(3),
            delivery_id: Some(9),
            delivery_tag: Some(Binary::from(vec![1, 2])),
            message_format: Some(0),
            settled: Some(false),
            more: false,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        });
        let mut body = Vec::new();
        encode_into(&mut body, &t).unwrap();
        body.extend_from_slice(b"rest");
        let (p, rest) = split_performative(&Bytes::from(body)).unwrap();
        assert_eq!(p, t);
        assert_eq!(&rest[..], b"rest");
    }

    #[test]
    fn sizes_and_counts_are_checked_before_serde_sees_them() {
        assert_eq!(check_value(&[0xc0, 6, 2, 0x40, 0xa1, 2, b'h', b'i']), Ok(8));
        assert_eq!(check_value(&[0xe0, 4, 2, 0x50, 7, 8]), Ok(6));
        // A sym32 inside a list claiming 3.6 GB.
        let huge = [0xc0, 6, 1, 0xb3, 0xd7, 0x3f, 0xfb, 0x01];
        assert_eq!(check_value(&huge), Err(CodecError::Truncated));
        // A list32 claiming 2^32-1 elements in 4 bytes.
        let count = [0xd0, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            check_value(&count),
            Err(CodecError::BadCount { .. })
        ));
        assert_eq!(check_value(&[0x00; 64]), Err(CodecError::TooDeep));
        assert_eq!(check_value(&[0x33]), Err(CodecError::BadFormatCode(0x33)));
        assert_eq!(check_value(&[]), Err(CodecError::Truncated));
        // A value with trailing bytes is not "a performative".
        assert!(decode::<Performative>("performative", &[0x40, 0x40]).is_err());
    }

    #[test]
    fn descriptors_are_peeked() {
        assert_eq!(descriptor_code(&[0x00, 0x53, 0x75, 0xa0]), Some(0x75));
        let mut long = vec![0x00, 0x80];
        long.extend_from_slice(&0x44u64.to_be_bytes());
        assert_eq!(descriptor_code(&long), Some(0x44));
        assert_eq!(descriptor_code(&[0x00, 0x80, 1]), None);
        assert_eq!(descriptor_code(&[0x45]), None);
    }
}
