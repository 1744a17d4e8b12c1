//! Strict MQTT 5 property parsing (MQTT 5 §2.2.2).
//!
//! Ours rather than mqttbytes' because its property readers (0.6) do not
//! keep reads inside the declared property length (a short length lets a
//! property swallow payload bytes), count the subscription-identifier byte
//! twice (so a SUBSCRIBE with an identifier and a user property misparses
//! its filters), accept duplicates of single-valued properties, accept
//! identifiers not allowed in the packet, and never reject the zero values
//! the spec calls protocol errors.

use bytes::Bytes;

use super::reader::Reader;
use super::CodecError;

/// Most user properties accepted in one packet. Each costs two heap strings
/// plus bookkeeping, so a packet of 5-byte properties would otherwise grow
/// about 16-fold in memory.
pub const USER_PROPERTIES_MAX: usize = 256;

/// Where a property list appears; decides which identifiers are allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropContext {
    /// CONNECT variable header.
    Connect,
    /// CONNECT will properties.
    Will,
    /// PUBLISH from a client.
    Publish,
    /// PUBACK, PUBREC, PUBREL, PUBCOMP.
    Ack,
    /// SUBSCRIBE.
    Subscribe,
    /// UNSUBSCRIBE.
    Unsubscribe,
    /// DISCONNECT from a client.
    Disconnect,
    /// AUTH.
    Auth,
}

/// The union of the client-to-server properties, as parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Props {
    /// 0x01: 0 bytes, 1 UTF-8.
    pub payload_format_indicator: Option<u8>,
    /// 0x02.
    pub message_expiry_interval_s: Option<u32>,
    /// 0x03.
    pub content_type: Option<String>,
    /// 0x08.
    pub response_topic: Option<String>,
    /// 0x09.
    pub correlation_data: Option<Bytes>,
    /// 0x0B (one in SUBSCRIBE).
    pub subscription_id: Option<u32>,
    /// 0x11.
    pub session_expiry_interval_s: Option<u32>,
    /// 0x15.
    pub authentication_method: Option<String>,
    /// 0x16.
    pub authentication_data: Option<Bytes>,
    /// 0x17.
    pub request_problem_information: Option<u8>,
    /// 0x18.
    pub will_delay_interval_s: Option<u32>,
    /// 0x19.
    pub request_response_information: Option<u8>,
    /// 0x1C.
    pub server_reference: Option<String>,
    /// 0x1F.
    pub reason_string: Option<String>,
    /// 0x21.
    pub receive_maximum: Option<u16>,
    /// 0x22.
    pub topic_alias_maximum: Option<u16>,
    /// 0x23.
    pub topic_alias: Option<u16>,
    /// 0x26, in order, duplicates kept.
    pub user_properties: Vec<(String, String)>,
    /// 0x27.
    pub maximum_packet_size: Option<u32>,
}

fn allowed(ctx: PropContext, id: u8) -> bool {
    use PropContext::*;
    let list: &[u8] = match ctx {
        Connect => &[0x11, 0x21, 0x27, 0x22, 0x19, 0x17, 0x26, 0x15, 0x16],
        Will => &[0x18, 0x01, 0x02, 0x03, 0x08, 0x09, 0x26],
        // 0x0B (subscription identifier) from a client is a protocol error.
        Publish => &[0x01, 0x02, 0x23, 0x08, 0x09, 0x26, 0x03],
        Ack | Unsubscribe => &[0x1F, 0x26],
        Subscribe => &[0x0B, 0x26],
        Disconnect => &[0x11, 0x1F, 0x26, 0x1C],
        Auth => &[0x15, 0x16, 0x1F, 0x26],
    };
    list.contains(&id)
}

/// Stores a single-valued property, rejecting a second occurrence.
fn set_once<T>(slot: &mut Option<T>, value: T) -> Result<(), CodecError> {
    if slot.is_some() {
        return Err(CodecError::Protocol("property included twice"));
    }
    *slot = Some(value);
    Ok(())
}

fn flag(value: u8) -> Result<u8, CodecError> {
    if value > 1 {
        return Err(CodecError::Protocol("property flag not 0 or 1"));
    }
    Ok(value)
}

/// Reads a property length and the properties inside it.
pub(crate) fn read_props(r: &mut Reader, ctx: PropContext) -> Result<Props, CodecError> {
    let len = r.varint()?;
    let len = usize::try_from(len).map_err(|_| CodecError::Malformed("property length"))?;
    let mut section = Reader::new(r.take(len)?);
    let mut p = Props::default();
    while !section.is_empty() {
        let id = section.u8()?;
        if !allowed(ctx, id) {
            return Err(CodecError::Protocol("property not allowed in this packet"));
        }
        let s = &mut section;
        match id {
            0x01 => set_once(&mut p.payload_format_indicator, flag(s.u8()?)?)?,
            0x02 => set_once(&mut p.message_expiry_interval_s, s.u32()?)?,
            0x03 => set_once(&mut p.content_type, s.string()?)?,
            0x08 => set_once(&mut p.response_topic, s.string()?)?,
            0x09 => set_once(&mut p.correlation_data, s.binary()?)?,
            0x0B => {
                let v = s.varint()?;
                if v == 0 {
                    return Err(CodecError::Protocol("subscription identifier 0"));
                }
                set_once(&mut p.subscription_id, v)?
            }
            0x11 => set_once(&mut p.session_expiry_interval_s, s.u32()?)?,
            0x15 => set_once(&mut p.authentication_method, s.string()?)?,
            0x16 => set_once(&mut p.authentication_data, s.binary()?)?,
            0x17 => set_once(&mut p.request_problem_information, flag(s.u8()?)?)?,
            0x18 => set_once(&mut p.will_delay_interval_s, s.u32()?)?,
            0x19 => set_once(&mut p.request_response_information, flag(s.u8()?)?)?,
            0x1C => set_once(&mut p.server_reference, s.string()?)?,
            0x1F => set_once(&mut p.reason_string, s.string()?)?,
            0x21 => {
                let v = s.u16()?;
                if v == 0 {
                    return Err(CodecError::Protocol("receive maximum 0"));
                }
                set_once(&mut p.receive_maximum, v)?
            }
            0x22 => set_once(&mut p.topic_alias_maximum, s.u16()?)?,
            0x23 => set_once(&mut p.topic_alias, s.u16()?)?,
            0x26 => {
                if p.user_properties.len() >= USER_PROPERTIES_MAX {
                    return Err(CodecError::Limit("too many user properties"));
                }
                let k = s.string()?;
                let v = s.string()?;
                p.user_properties.push((k, v));
            }
            0x27 => {
                let v = s.u32()?;
                if v == 0 {
                    return Err(CodecError::Protocol("maximum packet size 0"));
                }
                set_once(&mut p.maximum_packet_size, v)?
            }
            _ => return Err(CodecError::Protocol("unknown property")),
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8], ctx: PropContext) -> Result<Props, CodecError> {
        read_props(&mut Reader::new(Bytes::copy_from_slice(bytes)), ctx)
    }

    #[test]
    fn subscription_id_then_user_property() {
        // The case mqttbytes 0.6 miscounts.
        let bytes = [10, 0x0B, 0x80, 0x01, 0x26, 0, 1, b'k', 0, 1, b'v'];
        let p = parse(&bytes, PropContext::Subscribe).expect("valid");
        assert_eq!(p.subscription_id, Some(128));
        assert_eq!(p.user_properties, vec![("k".into(), "v".into())]);
    }

    #[test]
    fn reads_stay_inside_the_declared_length() {
        // Length 2 but the u32 needs 4 bytes: must not read past it.
        assert!(matches!(
            parse(&[2, 0x02, 0, 0, 0, 5], PropContext::Publish),
            Err(CodecError::Malformed(_))
        ));
    }

    #[test]
    fn rejects_duplicates_disallowed_and_zero_values() {
        assert!(matches!(
            parse(&[4, 0x01, 1, 0x01, 0], PropContext::Publish),
            Err(CodecError::Protocol(_))
        ));
        assert!(matches!(
            parse(&[2, 0x0B, 1], PropContext::Publish),
            Err(CodecError::Protocol(_))
        ));
        assert!(matches!(
            parse(&[3, 0x21, 0, 0], PropContext::Connect),
            Err(CodecError::Protocol(_))
        ));
        assert!(matches!(
            parse(&[2, 0x01, 2], PropContext::Publish),
            Err(CodecError::Protocol(_))
        ));
        assert!(matches!(
            parse(&[4, 0x03, 0, 1, 0xFF], PropContext::Publish),
            Err(CodecError::InvalidUtf8)
        ));
    }

    #[test]
    fn user_properties_keep_order_and_duplicates() {
        let bytes = [
            19, 0x26, 0, 1, b'a', 0, 1, b'1', 0x26, 0, 1, b'a', 0, 1, b'2', 0x02, 0, 0, 0, 9,
        ];
        let p = parse(&bytes, PropContext::Publish).expect("valid");
        assert_eq!(
            p.user_properties,
            vec![("a".into(), "1".into()), ("a".into(), "2".into())]
        );
        assert_eq!(p.message_expiry_interval_s, Some(9));
        // The same list cut one byte short inside the last property.
        let mut short = bytes;
        short[0] = 18;
        assert!(parse(&short[..19], PropContext::Publish).is_err());
    }
}
