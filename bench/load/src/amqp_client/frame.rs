//! AMQP 1.0 framing (spec part 2.3): the 8-byte protocol headers and frames
//! of `SIZE:4 DOFF:1 TYPE:1 CHANNEL:2 [extended header] body`, decoded
//! incrementally from the read buffer with a bounds check at every step.
//!
//! Ours rather than the broker's (`rosetta_amqp::frame`): the load tool
//! checks the broker, so it should not share the code it is checking.

use bytes::{Buf, Bytes, BytesMut};

/// Length of a protocol header and of the fixed frame header.
pub(crate) const HEADER_LEN: usize = 8;
/// The spec's floor for max-frame-size; a peer announcing less is treated
/// as announcing this.
pub(crate) const MIN_MAX_FRAME_SIZE: u32 = 512;

/// Protocol id of the plain AMQP protocol header.
pub(crate) const PROTOCOL_AMQP: u8 = 0;
/// Protocol id of the SASL protocol header.
pub(crate) const PROTOCOL_SASL: u8 = 3;

/// Frame type of open, begin, transfer, ...
pub(crate) const TYPE_AMQP: u8 = 0;
/// Frame type of the SASL exchange.
pub(crate) const TYPE_SASL: u8 = 1;

/// The bytes of an AMQP 1.0.0 protocol header for `protocol_id`.
pub(crate) fn protocol_header(protocol_id: u8) -> [u8; HEADER_LEN] {
    [b'A', b'M', b'Q', b'P', protocol_id, 1, 0, 0]
}

/// Why bytes from the broker could not be framed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("not an AMQP 1.0.0 protocol header: {0:02x?}")]
    BadProtocolHeader([u8; HEADER_LEN]),
    #[error("frame size {0} is below the 8-byte header")]
    SizeTooSmall(u32),
    #[error("frame size {size} exceeds our max-frame-size {max}")]
    SizeTooLarge { size: u32, max: u32 },
    #[error("data offset {doff} invalid for frame size {size}")]
    BadDataOffset { doff: u8, size: u32 },
    #[error("unknown frame type {0}")]
    UnknownType(u8),
}

/// One complete frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) frame_type: u8,
    pub(crate) channel: u16,
    /// The body after any extended header; empty for a heartbeat.
    pub(crate) body: Bytes,
}

/// Takes a protocol header off the front of `buf` and returns its protocol
/// id; `Ok(None)` until 8 bytes are there.
pub(crate) fn decode_protocol_header(buf: &mut BytesMut) -> Result<Option<u8>, FrameError> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let mut header = [0u8; HEADER_LEN];
    header.copy_from_slice(h);
    if &header[..4] != b"AMQP" || header[5..] != [1, 0, 0] {
        return Err(FrameError::BadProtocolHeader(header));
    }
    buf.advance(HEADER_LEN);
    Ok(Some(header[4]))
}

/// Takes one complete frame off the front of `buf`; `Ok(None)` means more
/// bytes are needed. A size above `max_size` is refused as soon as the
/// size field is there, before the body is buffered.
pub(crate) fn decode_frame(buf: &mut BytesMut, max_size: u32) -> Result<Option<Frame>, FrameError> {
    let Some(size) = buf.get(..4) else {
        return Ok(None);
    };
    let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]);
    if (size as usize) < HEADER_LEN {
        return Err(FrameError::SizeTooSmall(size));
    }
    if size > max_size {
        return Err(FrameError::SizeTooLarge {
            size,
            max: max_size,
        });
    }
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let (doff, frame_type) = (header[4], header[5]);
    let channel = u16::from_be_bytes([header[6], header[7]]);
    let body_offset = usize::from(doff) * 4;
    if doff < 2 || body_offset > size as usize {
        return Err(FrameError::BadDataOffset { doff, size });
    }
    if frame_type != TYPE_AMQP && frame_type != TYPE_SASL {
        return Err(FrameError::UnknownType(frame_type));
    }
    if buf.len() < size as usize {
        return Ok(None);
    }
    let mut frame = buf.split_to(size as usize);
    frame.advance(body_offset);
    Ok(Some(Frame {
        frame_type,
        channel,
        body: frame.freeze(),
    }))
}

/// Starts a frame in `out`; returns its start for [`finish_frame`].
pub(crate) fn begin_frame(out: &mut Vec<u8>, frame_type: u8, channel: u16) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, 2, frame_type]);
    out.extend_from_slice(&channel.to_be_bytes());
    start
}

/// Patches the size of the frame begun at `start`.
pub(crate) fn finish_frame(out: &mut [u8], start: usize) {
    let size = out.len() - start;
    // Our own invariant: callers split messages at the peer's
    // max-frame-size, a u32.
    assert!(u32::try_from(size).is_ok(), "frame over 4 GiB");
    out[start..start + 4].copy_from_slice(&(size as u32).to_be_bytes());
}

/// Appends an empty AMQP frame: the heartbeat for the peer's idle timeout.
pub(crate) fn write_empty_frame(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0, 0, 0, 8, 2, TYPE_AMQP, 0, 0]);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a panic here is a failed assertion
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
    fn byte_at_a_time_yields_each_frame_once_complete() {
        let mut input = protocol_header(PROTOCOL_SASL).to_vec();
        let bodies: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; usize::from(i) * 7]).collect();
        for (i, b) in bodies.iter().enumerate() {
            input.extend(frame_bytes(TYPE_AMQP, i as u16, b));
        }
        let mut buf = BytesMut::new();
        let mut header = None;
        let mut frames = Vec::new();
        for b in &input {
            buf.extend_from_slice(std::slice::from_ref(b));
            if header.is_none() {
                header = decode_protocol_header(&mut buf).expect("valid header");
                continue;
            }
            while let Some(f) = decode_frame(&mut buf, 1024).expect("valid frames") {
                frames.push(f);
            }
        }
        assert_eq!(header, Some(PROTOCOL_SASL));
        assert_eq!(frames.len(), bodies.len());
        for (i, (f, b)) in frames.iter().zip(&bodies).enumerate() {
            assert_eq!(usize::from(f.channel), i);
            assert_eq!(&f.body[..], &b[..]);
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn several_frames_in_one_read_and_a_partial_tail() {
        let mut input = frame_bytes(TYPE_AMQP, 1, b"one");
        input.extend(frame_bytes(TYPE_AMQP, 2, b"two"));
        let third = frame_bytes(TYPE_AMQP, 3, b"three");
        input.extend_from_slice(&third[..10]);
        let mut buf = BytesMut::from(&input[..]);
        assert_eq!(
            &decode_frame(&mut buf, 512).unwrap().unwrap().body[..],
            b"one"
        );
        assert_eq!(
            &decode_frame(&mut buf, 512).unwrap().unwrap().body[..],
            b"two"
        );
        assert_eq!(decode_frame(&mut buf, 512), Ok(None));
        assert_eq!(buf.len(), 10, "the partial frame stays buffered");
        buf.extend_from_slice(&third[10..]);
        assert_eq!(
            &decode_frame(&mut buf, 512).unwrap().unwrap().body[..],
            b"three"
        );
    }

    #[test]
    fn extended_header_is_skipped_and_empty_frame_is_a_heartbeat() {
        let mut buf = BytesMut::from(&[0, 0, 0, 14, 3, 0, 0, 1, 9, 9, 9, 9, b'x', b'y'][..]);
        let f = decode_frame(&mut buf, 512).unwrap().unwrap();
        assert_eq!((f.channel, &f.body[..]), (1, &b"xy"[..]));
        let mut out = Vec::new();
        write_empty_frame(&mut out);
        let mut buf = BytesMut::from(&out[..]);
        assert!(decode_frame(&mut buf, 512)
            .unwrap()
            .unwrap()
            .body
            .is_empty());
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let cases: Vec<(Vec<u8>, FrameError)> = vec![
            (vec![0, 0, 0, 4, 2, 0, 0, 0], FrameError::SizeTooSmall(4)),
            (
                vec![0, 0, 0, 13, 9, 0, 0, 0, 1, 2, 3, 4, 5],
                FrameError::BadDataOffset { doff: 9, size: 13 },
            ),
            (
                vec![0, 0, 0, 13, 1, 0, 0, 0],
                FrameError::BadDataOffset { doff: 1, size: 13 },
            ),
            (vec![0, 0, 0, 8, 2, 5, 0, 0], FrameError::UnknownType(5)),
            // Refused from the size field alone, before the body arrives.
            (
                vec![0x7f, 0xff, 0xff, 0xff],
                FrameError::SizeTooLarge {
                    size: 0x7fff_ffff,
                    max: 512,
                },
            ),
        ];
        for (input, want) in cases {
            let mut buf = BytesMut::from(&input[..]);
            assert_eq!(decode_frame(&mut buf, 512), Err(want), "{input:?}");
        }
        for bad in [&b"HTTP/1.1"[..], b"AMQP\x00\x02\x00\x00"] {
            let mut buf = BytesMut::from(bad);
            assert!(decode_protocol_header(&mut buf).is_err());
        }
        let mut buf = BytesMut::from(&b"AMQP"[..]);
        assert_eq!(decode_protocol_header(&mut buf), Ok(None));
    }
}
