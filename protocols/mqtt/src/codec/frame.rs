//! The MQTT fixed header: packet type, flags and remaining length.
//!
//! Framing is ours rather than `mqttbytes::check` because we need the total
//! packet size (not only the remaining length) against the limit, the
//! per-type flag checks of MQTT 2.1.3, and packet type 15 (AUTH), which
//! mqttbytes rejects as an invalid type.

use super::CodecError;

/// MQTT control packet types the server can receive or send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketKind {
    /// 1
    Connect,
    /// 3
    Publish,
    /// 4
    PubAck,
    /// 5
    PubRec,
    /// 6
    PubRel,
    /// 7
    PubComp,
    /// 8
    Subscribe,
    /// 10
    Unsubscribe,
    /// 12
    PingReq,
    /// 14
    Disconnect,
    /// 15 (MQTT 5 only)
    Auth,
}

/// A parsed fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedHeader {
    /// The packet type.
    pub kind: PacketKind,
    /// The low nibble of the first byte.
    pub flags: u8,
    /// Bytes of the fixed header itself (2–5).
    pub header_len: usize,
    /// The remaining length.
    pub remaining_len: usize,
}

impl FixedHeader {
    /// Header plus body.
    pub fn frame_len(&self) -> usize {
        self.header_len + self.remaining_len
    }
}

/// Parses a fixed header from the start of `buf`. `Ok(None)` means more
/// bytes are needed (not an error). The size limit applies as soon as the
/// length is known, before the body is buffered.
pub fn parse_fixed_header(
    buf: &[u8],
    packet_size_max_bytes: usize,
) -> Result<Option<FixedHeader>, CodecError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let flags = first & 0x0F;
    let kind = match first >> 4 {
        1 => PacketKind::Connect,
        3 => PacketKind::Publish,
        4 => PacketKind::PubAck,
        5 => PacketKind::PubRec,
        6 => PacketKind::PubRel,
        7 => PacketKind::PubComp,
        8 => PacketKind::Subscribe,
        10 => PacketKind::Unsubscribe,
        12 => PacketKind::PingReq,
        14 => PacketKind::Disconnect,
        15 => PacketKind::Auth,
        // CONNACK, SUBACK, UNSUBACK, PINGRESP flow server -> client only.
        2 | 9 | 11 | 13 => {
            return Err(CodecError::Protocol(
                "server-to-client packet type from a client",
            ))
        }
        _ => return Err(CodecError::Malformed("reserved packet type 0")),
    };
    // MQTT 2.1.3: fixed flags per type; PUBLISH flags are checked by its parser.
    let expected = match kind {
        PacketKind::Publish => flags,
        PacketKind::PubRel | PacketKind::Subscribe | PacketKind::Unsubscribe => 0b0010,
        _ => 0,
    };
    if flags != expected {
        return Err(CodecError::Malformed("invalid fixed header flags"));
    }

    let mut remaining_len: usize = 0;
    for i in 0..4 {
        let Some(&byte) = buf.get(1 + i) else {
            return Ok(None);
        };
        remaining_len |= usize::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            let header = FixedHeader {
                kind,
                flags,
                header_len: 2 + i,
                remaining_len,
            };
            if header.frame_len() > packet_size_max_bytes {
                return Err(CodecError::PacketTooLarge {
                    size: header.frame_len(),
                    max: packet_size_max_bytes,
                });
            }
            return Ok(Some(header));
        }
    }
    Err(CodecError::Malformed(
        "remaining length longer than 4 bytes",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_more_bytes_until_the_length_ends() {
        assert_eq!(parse_fixed_header(&[], 100), Ok(None));
        assert_eq!(parse_fixed_header(&[0x30], 100), Ok(None));
        assert_eq!(parse_fixed_header(&[0x30, 0x80], 1000), Ok(None));
        let h = parse_fixed_header(&[0x30, 0x80, 0x01], 1000).ok().flatten();
        assert_eq!(h.map(|h| (h.header_len, h.remaining_len)), Some((3, 128)));
    }

    #[test]
    fn rejects_bad_flags_types_and_sizes() {
        assert!(parse_fixed_header(&[0x62, 0x02], 100).is_ok());
        assert!(matches!(
            parse_fixed_header(&[0x60, 0x02], 100),
            Err(CodecError::Malformed(_))
        ));
        assert!(matches!(
            parse_fixed_header(&[0x80, 0x02], 100),
            Err(CodecError::Malformed(_))
        ));
        assert!(matches!(
            parse_fixed_header(&[0x20, 0x02], 100),
            Err(CodecError::Protocol(_))
        ));
        assert!(matches!(
            parse_fixed_header(&[0x00, 0x02], 100),
            Err(CodecError::Malformed(_))
        ));
        assert!(matches!(
            parse_fixed_header(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF], 100),
            Err(CodecError::Malformed(_))
        ));
        assert_eq!(
            parse_fixed_header(&[0x30, 0x64], 100),
            Err(CodecError::PacketTooLarge {
                size: 102,
                max: 100
            })
        );
    }
}
