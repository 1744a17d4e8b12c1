//! CONNECT for MQTT 3.1.1 and 5.0.
//!
//! Ours rather than `mqttbytes::v*::Connect::read` because 0.6 reads the
//! password as a UTF-8 string (MQTT passwords are binary, so clients using
//! binary tokens failed), folds "empty user name" into "no user name",
//! ignores the reserved connect flag, allows a password without a user name
//! in 3.1.1, ignores trailing bytes, and its property readers have the gaps
//! listed in [`super::props`]. We also need the protocol level before the
//! rest is parsed, to answer a bad CONNECT in the right version.

use bytes::Bytes;

use super::props::{read_props, PropContext, Props};
use super::reader::Reader;
use super::{CodecError, ConnectPacket, Version, WillPacket};

/// Parses a CONNECT body (after the fixed header). Sets `version` as soon
/// as the protocol level is known.
pub(crate) fn parse_connect(
    body: Bytes,
    version: &mut Option<Version>,
) -> Result<ConnectPacket, CodecError> {
    let mut r = Reader::new(body);
    let name = r.binary()?;
    let level = r.u8()?;
    let v = match (&name[..], level) {
        (b"MQTT", 4) => Version::V311,
        (b"MQTT", 5) => Version::V5,
        // MQTT 3.1 ("MQIsdp", level 3) and unknown levels: answered with
        // "unsupported protocol version" in 3.1.1 form.
        (b"MQTT", other) | (b"MQIsdp", other) => {
            return Err(CodecError::UnsupportedProtocolVersion(other))
        }
        _ => return Err(CodecError::Protocol("unknown protocol name")),
    };
    *version = Some(v);

    let flags = r.u8()?;
    if flags & 0x01 != 0 {
        return Err(CodecError::Malformed("reserved connect flag set"));
    }
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0x03;
    let will_retain = flags & 0x20 != 0;
    let password_flag = flags & 0x40 != 0;
    let username_flag = flags & 0x80 != 0;
    if !will_flag && (will_qos != 0 || will_retain) {
        return Err(CodecError::Malformed("will QoS or retain without a will"));
    }
    if will_qos == 3 {
        return Err(CodecError::Malformed("will QoS 3"));
    }
    if v == Version::V311 && password_flag && !username_flag {
        return Err(CodecError::Malformed("password without user name"));
    }

    let keep_alive_s = r.u16()?;
    let props = match v {
        Version::V5 => read_props(&mut r, PropContext::Connect)?,
        Version::V311 => Props::default(),
    };
    let client_id = r.string()?;
    let will = if will_flag {
        let props = match v {
            Version::V5 => read_props(&mut r, PropContext::Will)?,
            Version::V311 => Props::default(),
        };
        let topic = r.string()?;
        let payload = r.binary()?;
        Some(WillPacket {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            props,
        })
    } else {
        None
    };
    let username = if username_flag {
        Some(r.string()?)
    } else {
        None
    };
    let password = if password_flag {
        Some(r.binary()?)
    } else {
        None
    };
    if !r.is_empty() {
        return Err(CodecError::Malformed(
            "trailing bytes after CONNECT payload",
        ));
    }
    Ok(ConnectPacket {
        version: v,
        client_id,
        clean_start,
        keep_alive_s,
        username,
        password,
        will,
        props,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &[u8]) -> (Result<ConnectPacket, CodecError>, Option<Version>) {
        let mut v = None;
        let r = parse_connect(Bytes::copy_from_slice(body), &mut v);
        (r, v)
    }

    #[test]
    fn v311_with_binary_password() {
        let body = [
            0, 4, b'M', b'Q', b'T', b'T', 4, 0xC2, 0, 60, 0, 1, b'c', 0, 1, b'u', 0, 2, 0xFF, 0x00,
        ];
        let (r, v) = parse(&body);
        let c = r.expect("valid");
        assert_eq!(v, Some(Version::V311));
        assert_eq!(c.client_id, "c");
        assert!(c.clean_start);
        assert_eq!(c.keep_alive_s, 60);
        assert_eq!(c.username.as_deref(), Some("u"));
        assert_eq!(c.password.as_deref(), Some(&[0xFF, 0x00][..]));
    }

    #[test]
    fn v5_with_will_and_props() {
        let body = [
            0, 4, b'M', b'Q', b'T', b'T', 5, 0x2E, 0, 10, // flags: will qos1 retain clean
            5, 0x11, 0, 0, 0, 30, // session expiry 30
            0, 0, // empty client id
            5, 0x18, 0, 0, 0, 7, // will delay 7
            0, 1, b't', 0, 2, b'h', b'i',
        ];
        let (r, v) = parse(&body);
        let c = r.expect("valid");
        assert_eq!(v, Some(Version::V5));
        assert_eq!(c.props.session_expiry_interval_s, Some(30));
        let w = c.will.expect("will");
        assert_eq!((w.topic.as_str(), w.qos, w.retain), ("t", 1, true));
        assert_eq!(w.props.will_delay_interval_s, Some(7));
        assert_eq!(&w.payload[..], b"hi");
    }

    #[test]
    fn rejects_bad_connects() {
        let (r, v) = parse(&[0, 4, b'M', b'Q', b'T', b'T', 3, 0, 0, 0, 0, 0]);
        assert_eq!(r, Err(CodecError::UnsupportedProtocolVersion(3)));
        assert_eq!(v, None);
        let (r, v) = parse(&[0, 4, b'M', b'Q', b'T', b'T', 5, 1, 0, 0, 0, 0, 0]);
        assert!(matches!(r, Err(CodecError::Malformed(_))));
        assert_eq!(v, Some(Version::V5), "version known before the error");
        let (r, _) = parse(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0x18 | 0x04, 0, 0, 0, 0]);
        assert!(matches!(r, Err(CodecError::Malformed(_))), "will QoS 3");
        let (r, _) = parse(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0x40, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(r, Err(CodecError::Malformed(_))), "password only");
        let (r, _) = parse(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0, 0, 0, 0, 0, 9]);
        assert!(matches!(r, Err(CodecError::Malformed(_))), "trailing");
        let (r, _) = parse(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0, 0, 0, 0, 1, 0xC0]);
        assert_eq!(r, Err(CodecError::InvalidUtf8));
    }
}
