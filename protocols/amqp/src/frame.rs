//! AMQP 1.0 framing (spec part 2.3): protocol headers and the 8-byte frame
//! header, parsed incrementally with a bounds check at every step.
//!
//! ```text
//! +--------+------+------+---------+----------------+---------+
//! | SIZE:4 | DOFF | TYPE | CHANNEL | extended header| body    |
//! +--------+------+------+---------+----------------+---------+
//!   SIZE >= 8, DOFF >= 2 (in 4-byte words), DOFF*4 <= SIZE
//! ```
//!
//! Input is copied once into a [`BytesMut`]; each complete frame is split off
//! and frozen, so a transfer's payload can be handed to the core as a
//! [`Bytes`] slice of the read buffer without another copy. The size field
//! is checked against the negotiated maximum *before* anything is buffered
//! past the header, and a frame whose header is truncated or inconsistent is
//! a [`FrameError`], never a panic.

use bytes::{Buf, Bytes, BytesMut};

/// Length of a protocol header (`AMQP` + id + version).
pub const PROTOCOL_HEADER_LEN: usize = 8;
/// Length of the fixed frame header.
pub const FRAME_HEADER_LEN: usize = 8;
/// The spec's floor for max-frame-size: every peer must accept frames this
/// large, and frames before Open may not exceed it on the sending side.
pub const MIN_MAX_FRAME_SIZE: u32 = 512;

/// Protocol id of the plain AMQP protocol header.
pub const PROTOCOL_ID_AMQP: u8 = 0;
/// Protocol id of the TLS protocol header (we do not negotiate TLS inline).
pub const PROTOCOL_ID_TLS: u8 = 2;
/// Protocol id of the SASL protocol header.
pub const PROTOCOL_ID_SASL: u8 = 3;

/// The AMQP frame type (open, transfer, ...).
pub const FRAME_TYPE_AMQP: u8 = 0;
/// The SASL frame type.
pub const FRAME_TYPE_SASL: u8 = 1;

/// The bytes of an AMQP 1.0.0 protocol header for `protocol_id`.
pub fn protocol_header(protocol_id: u8) -> [u8; PROTOCOL_HEADER_LEN] {
    [b'A', b'M', b'Q', b'P', protocol_id, 1, 0, 0]
}

/// Why bytes could not be framed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not an AMQP 1.0.0 protocol header.
    #[error("bad protocol header {0:02x?}")]
    BadProtocolHeader([u8; PROTOCOL_HEADER_LEN]),
    /// The size field is below the 8-byte minimum.
    #[error("frame size {0} is below the 8-byte header")]
    SizeTooSmall(u32),
    /// The size field exceeds our max-frame-size.
    #[error("frame size {size} exceeds max-frame-size {max}")]
    SizeTooLarge {
        /// Claimed size.
        size: u32,
        /// Our limit.
        max: u32,
    },
    /// The data offset is below 2 words or beyond the frame.
    #[error("data offset {doff} invalid for frame size {size}")]
    BadDataOffset {
        /// Data offset in 4-byte words.
        doff: u8,
        /// Frame size.
        size: u32,
    },
    /// Neither AMQP nor SASL.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// The connection ended inside a frame or header.
    #[error("connection ended inside a frame ({0} bytes pending)")]
    Truncated(usize),
}

/// A parsed protocol header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolHeader {
    /// 0 AMQP, 2 TLS, 3 SASL.
    pub protocol_id: u8,
}

/// One complete frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// [`FRAME_TYPE_AMQP`] or [`FRAME_TYPE_SASL`].
    pub frame_type: u8,
    /// The channel (AMQP frames) or 0 (SASL).
    pub channel: u16,
    /// The body after the extended header; empty for a heartbeat.
    pub body: Bytes,
}

/// Incremental decoder of protocol headers and frames.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: BytesMut,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the socket.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The buffer itself, for a caller that reads straight into it.
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes buffered but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Decodes a protocol header, or `Ok(None)` if fewer than 8 bytes are
    /// buffered. The version must be 1.0.0; the protocol id is returned for
    /// the caller to judge.
    pub fn next_protocol_header(&mut self) -> Result<Option<ProtocolHeader>, FrameError> {
        // Reject garbage as soon as a byte disagrees, not after 8 bytes: a
        // HTTP request or TLS hello should not sit in our buffer.
        let n = self.buf.len().min(PROTOCOL_HEADER_LEN);
        let prefix_ok = self.buf[..n]
            .iter()
            .zip(b"AMQP")
            .all(|(got, want)| got == want);
        if !prefix_ok || self.buf.len() < PROTOCOL_HEADER_LEN {
            if prefix_ok {
                return Ok(None);
            }
            let mut bad = [0u8; PROTOCOL_HEADER_LEN];
            bad[..n].copy_from_slice(&self.buf[..n]);
            return Err(FrameError::BadProtocolHeader(bad));
        }
        let mut header = [0u8; PROTOCOL_HEADER_LEN];
        header.copy_from_slice(&self.buf[..PROTOCOL_HEADER_LEN]);
        if header[5..] != [1, 0, 0] {
            return Err(FrameError::BadProtocolHeader(header));
        }
        self.buf.advance(PROTOCOL_HEADER_LEN);
        Ok(Some(ProtocolHeader {
            protocol_id: header[4],
        }))
    }

    /// Decodes the next frame, or `Ok(None)` if it is not complete yet.
    /// `max_size` is our max-frame-size: a larger size field is an error
    /// before any of the body is buffered.
    pub fn next_frame(&mut self, max_size: u32) -> Result<Option<Frame>, FrameError> {
        let Some(size_bytes) = self.buf.get(..4) else {
            return Ok(None);
        };
        let size = u32::from_be_bytes([size_bytes[0], size_bytes[1], size_bytes[2], size_bytes[3]]);
        if (size as usize) < FRAME_HEADER_LEN {
            return Err(FrameError::SizeTooSmall(size));
        }
        if size > max_size {
            return Err(FrameError::SizeTooLarge {
                size,
                max: max_size,
            });
        }
        let Some(header) = self.buf.get(..FRAME_HEADER_LEN) else {
            return Ok(None);
        };
        let doff = header[4];
        let frame_type = header[5];
        let channel = u16::from_be_bytes([header[6], header[7]]);
        let body_offset = usize::from(doff) * 4;
        if doff < 2 || body_offset > size as usize {
            return Err(FrameError::BadDataOffset { doff, size });
        }
        if frame_type != FRAME_TYPE_AMQP && frame_type != FRAME_TYPE_SASL {
            return Err(FrameError::UnknownType(frame_type));
        }
        if self.buf.len() < size as usize {
            // Make room for the rest of the frame once, not per read.
            self.buf.reserve(size as usize - self.buf.len());
            return Ok(None);
        }
        let mut frame = self.buf.split_to(size as usize);
        frame.advance(body_offset);
        Ok(Some(Frame {
            frame_type,
            channel,
            body: frame.freeze(),
        }))
    }

    /// Called at end of input: a partial frame left behind is an error.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated(self.buf.len()))
        }
    }
}

/// Starts a frame in `out`; returns its start for [`finish_frame`].
pub fn begin_frame(out: &mut Vec<u8>, frame_type: u8, channel: u16) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, 2, frame_type]);
    out.extend_from_slice(&channel.to_be_bytes());
    start
}

/// Patches the size of the frame begun at `start`.
pub fn finish_frame(out: &mut [u8], start: usize) {
    let size = out.len() - start;
    // Our own invariant: we never build a frame over 4 GiB (the negotiated
    // max-frame-size is a u32 and the encoder splits at it).
    assert!(u32::try_from(size).is_ok(), "frame over 4 GiB");
    out[start..start + 4].copy_from_slice(&(size as u32).to_be_bytes());
}

/// Appends an empty AMQP frame (the idle-timeout heartbeat).
pub fn write_empty_frame(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0, 0, 0, 8, 2, FRAME_TYPE_AMQP, 0, 0]);
}

/// Appends one frame: header, `body` encoded, then `payload`.
pub(crate) fn write_frame<T: serde::Serialize>(
    out: &mut Vec<u8>,
    frame_type: u8,
    channel: u16,
    body: &T,
    payload: &[u8],
) {
    let start = begin_frame(out, frame_type, channel);
    if let Err(e) = crate::codec::encode_into(out, body) {
        // Our own values always encode; if one does not, drop the frame
        // rather than send garbage.
        tracing::error!(error = %e, "failed to encode a frame");
        out.truncate(start);
        return;
    }
    out.extend_from_slice(payload);
    finish_frame(out, start);
}

/// Appends one AMQP performative frame.
pub(crate) fn write_perf<T: serde::Serialize>(
    out: &mut Vec<u8>,
    channel: u16,
    perf: &T,
    payload: &[u8],
) {
    write_frame(out, FRAME_TYPE_AMQP, channel, perf, payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(frame_type: u8, channel: u16, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let start = begin_frame(&mut out, frame_type, channel);
        out.extend_from_slice(body);
        finish_frame(&mut out, start);
        out
    }

    #[test]
    fn decodes_header_then_frames() {
        let mut input = protocol_header(PROTOCOL_ID_SASL).to_vec();
        input.extend(frame_bytes(FRAME_TYPE_SASL, 0, b"abc"));
        input.extend(frame_bytes(FRAME_TYPE_AMQP, 7, b""));
        let mut d = FrameDecoder::new();
        d.push(&input);
        assert_eq!(
            d.next_protocol_header(),
            Ok(Some(ProtocolHeader { protocol_id: 3 }))
        );
        let f = d.next_frame(512).unwrap().unwrap();
        assert_eq!((f.frame_type, f.channel, &f.body[..]), (1, 0, &b"abc"[..]));
        let f = d.next_frame(512).unwrap().unwrap();
        assert_eq!((f.frame_type, f.channel, f.body.len()), (0, 7, 0));
        assert_eq!(d.next_frame(512), Ok(None));
        assert!(d.finish().is_ok());
    }

    #[test]
    fn byte_at_a_time_gives_the_same_frames() {
        let mut input = protocol_header(PROTOCOL_ID_AMQP).to_vec();
        for i in 0..5u16 {
            input.extend(frame_bytes(
                FRAME_TYPE_AMQP,
                i,
                &vec![i as u8; usize::from(i) * 3],
            ));
        }
        let mut d = FrameDecoder::new();
        let mut header = None;
        let mut frames = Vec::new();
        for b in &input {
            d.push(std::slice::from_ref(b));
            if header.is_none() {
                header = d.next_protocol_header().unwrap();
                continue;
            }
            while let Some(f) = d.next_frame(1024).unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(header, Some(ProtocolHeader { protocol_id: 0 }));
        assert_eq!(frames.len(), 5);
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(usize::from(f.channel), i);
            assert_eq!(f.body.len(), i * 3);
        }
    }

    #[test]
    fn extended_header_is_skipped() {
        // doff 3: one extra word of extended header before the body.
        let mut input = vec![0, 0, 0, 14, 3, 0, 0, 1, 9, 9, 9, 9, b'x', b'y'];
        let mut d = FrameDecoder::new();
        d.push(&input);
        let f = d.next_frame(512).unwrap().unwrap();
        assert_eq!(&f.body[..], b"xy");
        input.clear();
    }

    #[test]
    fn bad_headers_are_errors_not_panics() {
        let cases: Vec<(Vec<u8>, FrameError)> = vec![
            (vec![0, 0, 0, 4, 2, 0, 0, 0], FrameError::SizeTooSmall(4)),
            (
                vec![0, 0, 0, 13, 9, 0, 0, 0, 1, 2, 3, 4, 5],
                FrameError::BadDataOffset { doff: 9, size: 13 },
            ),
            (
                vec![0, 0, 0, 13, 1, 0, 0, 0, 1, 2, 3, 4, 5],
                FrameError::BadDataOffset { doff: 1, size: 13 },
            ),
            (vec![0, 0, 0, 8, 2, 5, 0, 0], FrameError::UnknownType(5)),
            (
                vec![0, 1, 0, 0, 2, 0, 0, 0],
                FrameError::SizeTooLarge {
                    size: 65536,
                    max: 512,
                },
            ),
        ];
        for (input, want) in cases {
            let mut d = FrameDecoder::new();
            d.push(&input);
            assert_eq!(d.next_frame(512), Err(want), "{input:?}");
        }
    }

    #[test]
    fn oversized_frame_is_refused_before_its_body_arrives() {
        let mut d = FrameDecoder::new();
        d.push(&[0x7f, 0xff, 0xff, 0xff]);
        assert!(matches!(
            d.next_frame(4096),
            Err(FrameError::SizeTooLarge { .. })
        ));
        assert!(d.buffered() <= 4);
    }

    #[test]
    fn truncated_header_is_pending_then_an_error_at_eof() {
        for len in 1..FRAME_HEADER_LEN {
            let mut d = FrameDecoder::new();
            d.push(&[0, 0, 0, 13, 2, 0, 0, 0][..len]);
            assert_eq!(d.next_frame(512), Ok(None));
            assert_eq!(d.finish(), Err(FrameError::Truncated(len)));
        }
    }

    #[test]
    fn bad_protocol_headers() {
        let mut d = FrameDecoder::new();
        d.push(b"GET / HTTP/1.1\r\n");
        assert!(d.next_protocol_header().is_err());
        let mut d = FrameDecoder::new();
        d.push(b"AMQP\x00\x00\x09\x01");
        assert!(d.next_protocol_header().is_err());
        let mut d = FrameDecoder::new();
        d.push(b"AM");
        assert_eq!(d.next_protocol_header(), Ok(None));
    }
}
