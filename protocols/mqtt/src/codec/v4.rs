//! MQTT 3.1.1 client packets other than CONNECT, through `mqttbytes::v4`.
//!
//! We use mqttbytes for PUBLISH, the acks, UNSUBSCRIBE, PINGREQ and
//! DISCONNECT, and add what it leaves out: DUP on QoS 0, U+0000 in topics,
//! empty UNSUBSCRIBE. SUBSCRIBE is ours (shared with v5) because mqttbytes
//! ignores the reserved option bits, which 3.1.1 requires us to reject.

use bytes::BytesMut;
use mqttbytes::v4;

use super::frame::{FixedHeader, PacketKind};
use super::reader::Reader;
use super::{
    AckPacket, CodecError, Inbound, Props, PublishPacket, ReasonPacket, UnsubscribePacket,
};

fn map_err(e: mqttbytes::Error) -> CodecError {
    match e {
        mqttbytes::Error::TopicNotUtf8 => CodecError::InvalidUtf8,
        mqttbytes::Error::PayloadSizeLimitExceeded(size) => CodecError::PacketTooLarge {
            size,
            max: size.saturating_sub(1),
        },
        _ => CodecError::Malformed("rejected by the 3.1.1 decoder"),
    }
}

/// Decodes one complete v4 frame (fixed header included).
pub(crate) fn decode(header: FixedHeader, mut frame: BytesMut) -> Result<Inbound, CodecError> {
    match header.kind {
        PacketKind::Subscribe => {
            let body = frame.freeze().slice(header.header_len..);
            let mut r = Reader::new(body);
            return super::v5::subscribe(&mut r, false).map(|s| Inbound::Subscribe(Box::new(s)));
        }
        PacketKind::Auth => return Err(CodecError::Malformed("AUTH is not a 3.1.1 packet")),
        PacketKind::Disconnect | PacketKind::PingReq if header.remaining_len != 0 => {
            return Err(CodecError::Malformed("body on a packet that has none"))
        }
        PacketKind::PubAck | PacketKind::PubRec | PacketKind::PubRel | PacketKind::PubComp
            if header.remaining_len != 2 =>
        {
            return Err(CodecError::Malformed("ack length is not 2"))
        }
        _ => {}
    }
    if header.kind == PacketKind::Publish {
        super::v5::publish_flags(header.flags)?;
    }
    let max = header.frame_len();
    let packet = v4::read(&mut frame, max).map_err(map_err)?;
    let nonzero = |pkid: u16| {
        if pkid == 0 {
            Err(CodecError::Malformed("packet identifier 0"))
        } else {
            Ok(pkid)
        }
    };
    let ack = |pkid: u16| nonzero(pkid).map(|pkid| AckPacket { pkid, reason: 0 });
    Ok(match packet {
        v4::Packet::Publish(p) => {
            if p.topic.contains('\0') {
                return Err(CodecError::InvalidUtf8);
            }
            Inbound::Publish(PublishPacket {
                dup: p.dup,
                qos: p.qos as u8,
                retain: p.retain,
                topic: p.topic,
                pkid: p.pkid,
                props: None,
                payload: p.payload,
            })
        }
        v4::Packet::PubAck(a) => Inbound::PubAck(ack(a.pkid)?),
        v4::Packet::PubRec(a) => Inbound::PubRec(ack(a.pkid)?),
        v4::Packet::PubRel(a) => Inbound::PubRel(ack(a.pkid)?),
        v4::Packet::PubComp(a) => Inbound::PubComp(ack(a.pkid)?),
        v4::Packet::Unsubscribe(u) => {
            if u.topics.is_empty() {
                return Err(CodecError::Protocol("UNSUBSCRIBE without filters"));
            }
            if u.topics.len() > super::FILTERS_PER_PACKET_MAX {
                return Err(CodecError::Limit("too many filters in UNSUBSCRIBE"));
            }
            if u.topics.iter().any(|t| t.contains('\0')) {
                return Err(CodecError::InvalidUtf8);
            }
            Inbound::Unsubscribe(UnsubscribePacket {
                pkid: nonzero(u.pkid)?,
                filters: u.topics,
            })
        }
        v4::Packet::PingReq => Inbound::PingReq,
        v4::Packet::Disconnect => Inbound::Disconnect(Box::new(ReasonPacket {
            reason: 0,
            props: Props::default(),
        })),
        _ => return Err(CodecError::Protocol("unexpected packet type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::frame::parse_fixed_header;

    fn dec(bytes: &[u8]) -> Result<Inbound, CodecError> {
        let h = parse_fixed_header(bytes, 1 << 20)?.ok_or(CodecError::Malformed("short"))?;
        decode(h, BytesMut::from(&bytes[..h.frame_len()]))
    }

    #[test]
    fn decodes_through_mqttbytes() {
        let p = dec(&[0x32, 6, 0, 1, b't', 0, 9, b'x']).expect("valid");
        assert!(matches!(
            p,
            Inbound::Publish(PublishPacket {
                qos: 1,
                pkid: 9,
                ..
            })
        ));
        assert_eq!(
            dec(&[0x62, 2, 0, 5]),
            Ok(Inbound::PubRel(AckPacket { pkid: 5, reason: 0 }))
        );
        assert_eq!(
            dec(&[0xE0, 0]),
            Ok(Inbound::Disconnect(Box::new(ReasonPacket {
                reason: 0,
                props: Props::default()
            })))
        );
    }

    #[test]
    fn rejects_what_mqttbytes_accepts() {
        assert!(dec(&[0x38, 4, 0, 1, b't', b'x']).is_err(), "DUP on QoS 0");
        assert!(
            dec(&[0x82, 6, 0, 1, 0, 1, b'a', 0x04]).is_err(),
            "reserved bit"
        );
        assert!(dec(&[0x30, 4, 0, 1, 0, b'x']).is_err(), "NUL in topic");
        assert!(dec(&[0x36, 4, 0, 1, b't', b'x']).is_err(), "QoS 3");
        assert!(dec(&[0xF0, 0]).is_err(), "AUTH");
    }
}
