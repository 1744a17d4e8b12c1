//! MQTT 5 client packets other than CONNECT.
//!
//! Ours rather than `mqttbytes::v5::read` because, besides the property
//! gaps listed in [`super::props`], mqttbytes 0.6 prints every UNSUBSCRIBE
//! packet id to stderr (a leftover `dbg!`), has no AUTH packet, accepts
//! DUP on QoS 0, SUBSCRIBE option reserved bits, and empty SUBSCRIBE and
//! UNSUBSCRIBE packets, and does not check strings for U+0000.

use bytes::Bytes;

use super::frame::{FixedHeader, PacketKind};
use super::props::{read_props, PropContext, Props};
use super::reader::Reader;
use super::{
    AckPacket, CodecError, Inbound, PublishPacket, ReasonPacket, SubscribePacket,
    SubscriptionRequest, UnsubscribePacket, FILTERS_PER_PACKET_MAX,
};

/// Decodes one v5 packet body (after the fixed header).
pub(crate) fn decode(header: FixedHeader, body: Bytes) -> Result<Inbound, CodecError> {
    let mut r = Reader::new(body);
    let packet = match header.kind {
        PacketKind::Publish => Inbound::Publish(publish(header.flags, &mut r)?),
        PacketKind::PubAck => Inbound::PubAck(ack(&mut r)?),
        PacketKind::PubRec => Inbound::PubRec(ack(&mut r)?),
        PacketKind::PubRel => Inbound::PubRel(ack(&mut r)?),
        PacketKind::PubComp => Inbound::PubComp(ack(&mut r)?),
        PacketKind::Subscribe => Inbound::Subscribe(Box::new(subscribe(&mut r, true)?)),
        PacketKind::Unsubscribe => Inbound::Unsubscribe(unsubscribe(&mut r, true)?),
        PacketKind::PingReq => Inbound::PingReq,
        PacketKind::Disconnect => {
            Inbound::Disconnect(Box::new(reason_packet(&mut r, PropContext::Disconnect)?))
        }
        PacketKind::Auth => Inbound::Auth(Box::new(reason_packet(&mut r, PropContext::Auth)?)),
        PacketKind::Connect => return Err(CodecError::Protocol("second CONNECT")),
    };
    if !r.is_empty() {
        return Err(CodecError::Malformed("trailing bytes"));
    }
    Ok(packet)
}

/// The QoS, DUP and RETAIN bits of a PUBLISH fixed header.
pub(crate) fn publish_flags(flags: u8) -> Result<(bool, u8, bool), CodecError> {
    let qos = (flags >> 1) & 0x03;
    let dup = flags & 0x08 != 0;
    if qos == 3 {
        return Err(CodecError::Malformed("QoS 3"));
    }
    if dup && qos == 0 {
        return Err(CodecError::Malformed("DUP set on QoS 0"));
    }
    Ok((dup, qos, flags & 0x01 != 0))
}

fn publish(flags: u8, r: &mut Reader) -> Result<PublishPacket, CodecError> {
    let (dup, qos, retain) = publish_flags(flags)?;
    let topic = r.string()?;
    let pkid = if qos > 0 { nonzero_pkid(r)? } else { 0 };
    let props = read_props(r, PropContext::Publish)?;
    let props = (props != Props::default()).then(|| Box::new(props));
    Ok(PublishPacket {
        dup,
        qos,
        retain,
        topic,
        pkid,
        props,
        payload: r.rest(),
    })
}

fn nonzero_pkid(r: &mut Reader) -> Result<u16, CodecError> {
    let pkid = r.u16()?;
    if pkid == 0 {
        return Err(CodecError::Malformed("packet identifier 0"));
    }
    Ok(pkid)
}

fn ack(r: &mut Reader) -> Result<AckPacket, CodecError> {
    let pkid = nonzero_pkid(r)?;
    let reason = if r.is_empty() { 0 } else { r.u8()? };
    if !r.is_empty() {
        read_props(r, PropContext::Ack)?;
    }
    Ok(AckPacket { pkid, reason })
}

/// SUBSCRIBE; `v5` selects the options byte layout (3.1.1 allows only QoS).
pub(crate) fn subscribe(r: &mut Reader, v5: bool) -> Result<SubscribePacket, CodecError> {
    let pkid = nonzero_pkid(r)?;
    let props = if v5 {
        read_props(r, PropContext::Subscribe)?
    } else {
        Props::default()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        if filters.len() >= FILTERS_PER_PACKET_MAX {
            return Err(CodecError::Limit("too many filters in SUBSCRIBE"));
        }
        let filter = r.string()?;
        let options = r.u8()?;
        let reserved = if v5 { 0xC0 } else { 0xFC };
        if options & reserved != 0 {
            return Err(CodecError::Malformed("reserved subscription option bits"));
        }
        let qos = options & 0x03;
        let retain_handling = (options >> 4) & 0x03;
        if qos == 3 || retain_handling == 3 {
            return Err(CodecError::Malformed("QoS or retain handling 3"));
        }
        filters.push(SubscriptionRequest {
            filter,
            qos,
            no_local: options & 0x04 != 0,
            retain_as_published: options & 0x08 != 0,
            retain_handling,
        });
    }
    if filters.is_empty() {
        return Err(CodecError::Protocol("SUBSCRIBE without filters"));
    }
    Ok(SubscribePacket {
        pkid,
        filters,
        props,
    })
}

/// UNSUBSCRIBE; `v5` adds the property list.
pub(crate) fn unsubscribe(r: &mut Reader, v5: bool) -> Result<UnsubscribePacket, CodecError> {
    let pkid = nonzero_pkid(r)?;
    if v5 {
        read_props(r, PropContext::Unsubscribe)?;
    }
    let mut filters = Vec::new();
    while !r.is_empty() {
        if filters.len() >= FILTERS_PER_PACKET_MAX {
            return Err(CodecError::Limit("too many filters in UNSUBSCRIBE"));
        }
        filters.push(r.string()?);
    }
    if filters.is_empty() {
        return Err(CodecError::Protocol("UNSUBSCRIBE without filters"));
    }
    Ok(UnsubscribePacket { pkid, filters })
}

/// DISCONNECT and AUTH: optional reason, optional properties. This is our
/// AUTH packet (type 15), which mqttbytes 0.6 does not have.
fn reason_packet(r: &mut Reader, ctx: PropContext) -> Result<ReasonPacket, CodecError> {
    let reason = if r.is_empty() { 0 } else { r.u8()? };
    let props = if r.is_empty() {
        Props::default()
    } else {
        read_props(r, ctx)?
    };
    Ok(ReasonPacket { reason, props })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::frame::parse_fixed_header;

    fn dec(bytes: &[u8]) -> Result<Inbound, CodecError> {
        let h = parse_fixed_header(bytes, 1 << 20)?.ok_or(CodecError::Malformed("short"))?;
        decode(
            h,
            Bytes::copy_from_slice(&bytes[h.header_len..h.frame_len()]),
        )
    }

    #[test]
    fn publish_with_properties_is_zero_copy_payload() {
        let p = dec(&[0x33, 10, 0, 1, b't', 0, 7, 3, 0x23, 0, 1, b'x']).expect("valid");
        let Inbound::Publish(p) = p else {
            panic!("not a publish")
        };
        assert_eq!((p.qos, p.retain, p.pkid), (1, true, 7));
        assert_eq!(p.topic_alias(), Some(1));
        assert_eq!(&p.payload[..], b"x");
    }

    #[test]
    fn auth_packet_decodes() {
        let p = dec(&[0xF0, 8, 0x18, 6, 0x15, 0, 3, b'f', b'o', b'o']).expect("valid");
        let Inbound::Auth(a) = p else {
            panic!("not auth")
        };
        assert_eq!(a.reason, 0x18);
        assert_eq!(a.props.authentication_method.as_deref(), Some("foo"));
    }

    #[test]
    fn bad_packets() {
        assert!(matches!(
            dec(&[0x36, 5, 0, 1, b't', 0, 1]),
            Err(CodecError::Malformed(_))
        ));
        assert!(matches!(
            dec(&[0x38, 4, 0, 1, b't', 0]),
            Err(CodecError::Malformed(_))
        ));
        assert!(matches!(
            dec(&[0x82, 3, 0, 1, 0]),
            Err(CodecError::Protocol(_))
        ));
        assert!(matches!(
            dec(&[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x40]),
            Err(CodecError::Malformed(_))
        ));
        assert!(matches!(
            dec(&[0xA2, 3, 0, 1, 0]),
            Err(CodecError::Protocol(_))
        ));
        assert!(matches!(
            dec(&[0x40, 3, 0, 0, 0]),
            Err(CodecError::Malformed(_))
        ));
    }
}
