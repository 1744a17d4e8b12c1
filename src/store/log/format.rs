//! The bytes of a stream log: segment names, the segment header and the
//! record frame, with their checksums.
//!
//! ```text
//! segment        = segment_header record*
//! segment_header = magic "RLOG" u32 | version u16 | reserved u16 | base_offset u64
//!                  | created_ms u64 | salt u32 | header_crc u32            (32 bytes)
//! record         = record_header body
//! record_header  = magic "RLRC" u32 | offset u64 | timestamp_ms u64 | body_len u32
//!                  | body_crc u32 | header_crc u32                          (32 bytes)
//! ```
//!
//! All integers little-endian, checksums CRC32C. The record header
//! checksum is salted with the segment's random salt, so that a client
//! payload holding a well-formed record header cannot pose as a record when
//! recovery searches damaged bytes for the next one.

use crate::segment::{le_u32, le_u64};
use crate::wire::{put_u16, put_u32, put_u64};

/// File name suffix of a log segment.
pub(crate) const SEGMENT_SUFFIX: &str = ".log";
/// Segment header size.
pub(crate) const SEGMENT_HEADER_BYTES: usize = 32;
/// Record header size.
pub(crate) const RECORD_HEADER_BYTES: usize = 32;
/// Format version written now.
pub(crate) const LOG_FORMAT_VERSION: u16 = 1;
/// Largest record body: a message of the largest size any adapter accepts
/// fits, and recovery never allocates more than this for one record.
pub const LOG_RECORD_BODY_MAX_BYTES: usize = 64 * 1024 * 1024;

const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"RLOG");
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RLRC");

/// The file name of the segment whose first offset is `base`: 20 digits,
/// so names sort by offset.
pub(crate) fn segment_name(base: u64) -> String {
    format!("{base:020}{SEGMENT_SUFFIX}")
}

/// The base offset a segment file name holds, if it is one.
pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The header at the start of every segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogSegmentHeader {
    pub(crate) base_offset: u64,
    pub(crate) created_ms: u64,
    pub(crate) salt: u32,
}

impl LogSegmentHeader {
    pub(crate) fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut b = Vec::with_capacity(SEGMENT_HEADER_BYTES);
        put_u32(&mut b, SEGMENT_MAGIC);
        put_u16(&mut b, LOG_FORMAT_VERSION);
        put_u16(&mut b, 0);
        put_u64(&mut b, self.base_offset);
        put_u64(&mut b, self.created_ms);
        put_u32(&mut b, self.salt);
        let crc = crc32c::crc32c(&b);
        put_u32(&mut b, crc);
        let mut out = [0u8; SEGMENT_HEADER_BYTES];
        out.copy_from_slice(&b);
        out
    }

    /// The header in `b`, or `None` when it is not a valid one of a
    /// version this build reads.
    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < SEGMENT_HEADER_BYTES || le_u32(b, 0) != SEGMENT_MAGIC {
            return None;
        }
        if le_u32(b, 28) != crc32c::crc32c(&b[..28]) {
            return None;
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != LOG_FORMAT_VERSION {
            return None;
        }
        Some(Self {
            base_offset: le_u64(b, 8),
            created_ms: le_u64(b, 16),
            salt: le_u32(b, 24),
        })
    }
}

/// A record header, decoded and checked against its own checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub(crate) offset: u64,
    pub(crate) timestamp_ms: u64,
    pub(crate) body_len: u32,
    pub(crate) body_crc: u32,
}

/// CRC32C of the segment's salt followed by the header's first 28 bytes
/// (`b`). One call over 32 bytes on the stack rather than one for the
/// salt and one more for the header: the value is the same, and each call
/// has its own set-up, twice per record written and per record read.
fn header_crc(salt: u32, b: &[u8]) -> u32 {
    let mut salted = [0u8; 32];
    salted[..4].copy_from_slice(&salt.to_le_bytes());
    if let (Some(to), Some(from)) = (salted.get_mut(4..32), b.get(..28)) {
        to.copy_from_slice(from);
        return crc32c::crc32c(&salted);
    }
    // Never: every caller passes the 28 bytes (kept exact if not).
    crc32c::crc32c_append(crc32c::crc32c(&salt.to_le_bytes()), b)
}

impl RecordHeader {
    /// Total bytes of the record this header starts.
    pub(crate) fn frame_bytes(&self) -> u64 {
        RECORD_HEADER_BYTES as u64 + u64::from(self.body_len)
    }

    /// The header in `b` (at least [`RECORD_HEADER_BYTES`]), if its magic
    /// and salted checksum hold and its length is within bounds.
    pub(crate) fn decode(salt: u32, b: &[u8]) -> Option<Self> {
        if b.len() < RECORD_HEADER_BYTES || le_u32(b, 0) != RECORD_MAGIC {
            return None;
        }
        if le_u32(b, 28) != header_crc(salt, &b[..28]) {
            return None;
        }
        let h = Self {
            offset: le_u64(b, 4),
            timestamp_ms: le_u64(b, 12),
            body_len: le_u32(b, 20),
            body_crc: le_u32(b, 24),
        };
        (h.body_len as usize <= LOG_RECORD_BODY_MAX_BYTES).then_some(h)
    }

    /// Whether `body` is the body this header describes.
    pub(crate) fn body_matches(&self, body: &[u8]) -> bool {
        body.len() == self.body_len as usize && crc32c::crc32c(body) == self.body_crc
    }
}

/// Appends the frame of one record to `out`.
#[cfg(test)]
pub(crate) fn encode_record(
    out: &mut Vec<u8>,
    salt: u32,
    offset: u64,
    timestamp_ms: u64,
    body: &[u8],
) {
    let body = crate::Opaque::Bytes(bytes::Bytes::copy_from_slice(body));
    assert!(encode_record_of(out, salt, offset, timestamp_ms, &body));
}

/// Appends the frame of one record whose body `body` writes, straight
/// into `out` (the header goes first, its length and checksums filled
/// in once the body is there). `false`, with `out` as it was, when the
/// body came out larger than [`LOG_RECORD_BODY_MAX_BYTES`] (a deferred
/// body whose hint was not the bound it must be).
pub(crate) fn encode_record_of(
    out: &mut Vec<u8>,
    salt: u32,
    offset: u64,
    timestamp_ms: u64,
    body: &crate::Opaque,
) -> bool {
    let start = out.len();
    put_u32(out, RECORD_MAGIC);
    put_u64(out, offset);
    put_u64(out, timestamp_ms);
    // Length, body checksum and header checksum: written below.
    out.resize(start + RECORD_HEADER_BYTES, 0);
    body.write_to(out);
    let body_len = out.len() - start - RECORD_HEADER_BYTES;
    if body_len > LOG_RECORD_BODY_MAX_BYTES {
        out.truncate(start);
        return false;
    }
    let body_crc = crc32c::crc32c(&out[start + RECORD_HEADER_BYTES..]);
    out[start + 20..start + 24].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 24..start + 28].copy_from_slice(&body_crc.to_le_bytes());
    let crc = header_crc(salt, &out[start..start + 28]);
    out[start + 28..start + 32].copy_from_slice(&crc.to_le_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_checksum_is_the_salt_then_the_header() {
        let b: Vec<u8> = (0u8..28).collect();
        let two_calls = crc32c::crc32c_append(crc32c::crc32c(&7u32.to_le_bytes()), &b);
        assert_eq!(header_crc(7, &b), two_calls);
    }

    #[test]
    fn names_round_trip_and_sort_by_offset() {
        assert_eq!(parse_segment_name(&segment_name(42)), Some(42));
        assert!(segment_name(9) < segment_name(10));
        assert_eq!(parse_segment_name("00000000000000000042.seg"), None);
        assert_eq!(parse_segment_name("42.log"), None);
    }

    #[test]
    fn a_record_round_trips_and_a_flipped_bit_or_other_salt_is_refused() {
        let mut b = Vec::new();
        encode_record(&mut b, 7, 5, 1000, b"hello");
        let h = RecordHeader::decode(7, &b);
        assert_eq!(
            h,
            Some(RecordHeader {
                offset: 5,
                timestamp_ms: 1000,
                body_len: 5,
                body_crc: crc32c::crc32c(b"hello"),
            })
        );
        assert!(h.is_some_and(|h| h.body_matches(&b[RECORD_HEADER_BYTES..])));
        assert_eq!(RecordHeader::decode(8, &b), None, "another segment's salt");
        for i in 0..RECORD_HEADER_BYTES {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert_eq!(RecordHeader::decode(7, &c), None, "byte {i}");
        }
        let mut c = b.clone();
        c[RECORD_HEADER_BYTES] ^= 1;
        assert!(RecordHeader::decode(7, &c).is_some_and(|h| !h.body_matches(&c[32..])));
    }

    #[test]
    fn a_segment_header_round_trips() {
        let h = LogSegmentHeader {
            base_offset: 99,
            created_ms: 12,
            salt: 0xdead_beef,
        };
        let b = h.encode();
        assert_eq!(LogSegmentHeader::decode(&b), Some(h));
        let mut c = b;
        c[9] ^= 1;
        assert_eq!(LogSegmentHeader::decode(&c), None);
    }
}
