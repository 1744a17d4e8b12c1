//! The PROXY protocol v2 header (HAProxy's `proxy-protocol.txt`, section
//! 2.2), sans-IO: what a node proxying a client to its target sends first,
//! so the target knows the client's real address and that the connection
//! was placed already (it must not be balanced a second time).
//!
//! Only what the proxy sends is supported: version 2, command PROXY, TCP
//! over IPv4 or IPv6. TLVs are skipped. The header is trusted only from
//! another node of the cluster; that check is the caller's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The 12 bytes every v2 header starts with.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// Fixed part: signature, version/command, family, length.
const FIXED_BYTES: usize = 16;
/// Version 2, command PROXY.
const V2_PROXY: u8 = 0x21;
/// Version 2, command LOCAL (health checks of a proxy: no address).
const V2_LOCAL: u8 = 0x20;
/// TCP over IPv4, TCP over IPv6.
const TCP4: u8 = 0x11;
const TCP6: u8 = 0x21;
/// Longest header accepted: the addresses plus room for a few TLVs. The
/// length field allows 64 KiB; nobody needs that before a CONNECT.
pub const HEADER_BYTES_MAX: usize = FIXED_BYTES + 512;

/// What a buffer that may start with a header holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// No header: the bytes are the client's own.
    Absent,
    /// Too few bytes to tell; read more.
    NeedMore,
    /// A header of `len` bytes naming the client's `source` (`None` for
    /// a LOCAL command, which carries no address).
    Header {
        /// Bytes the header takes at the start of the buffer.
        len: usize,
        /// The client's address as the proxy saw it.
        source: Option<SocketAddr>,
    },
}

/// A header that starts like PROXY v2 but is not one we accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Not version 2 with command PROXY or LOCAL.
    #[error("PROXY header: unsupported version/command byte {0:#04x}")]
    Command(u8),
    /// Not TCP over IPv4 or IPv6.
    #[error("PROXY header: unsupported address family {0:#04x}")]
    Family(u8),
    /// Longer than [`HEADER_BYTES_MAX`], or too short for its family.
    #[error("PROXY header: bad length {0}")]
    Length(usize),
}

/// The header announcing `source` (the client) connected to
/// `destination` (the address it reached on the proxying node).
pub fn encode(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(FIXED_BYTES + 36);
    out.extend_from_slice(&SIGNATURE);
    out.push(V2_PROXY);
    // Both addresses in one family: an IPv4 client reaching an IPv6
    // address is written in its mapped form.
    match (source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            out.push(TCP4);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.ip().octets());
            out.extend_from_slice(&d.ip().octets());
        }
        (s, d) => {
            out.push(TCP6);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(s.ip()).octets());
            out.extend_from_slice(&v6(d.ip()).octets());
        }
    }
    out.extend_from_slice(&source.port().to_be_bytes());
    out.extend_from_slice(&destination.port().to_be_bytes());
    out
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// Reads a header at the start of `buf`, if there is one.
pub fn parse(buf: &[u8]) -> Result<Parsed, HeaderError> {
    let shared = buf.len().min(SIGNATURE.len());
    if buf.get(..shared) != SIGNATURE.get(..shared) {
        return Ok(Parsed::Absent);
    }
    let (Some(&command), Some(&family), Some(len_bytes)) =
        (buf.get(12), buf.get(13), buf.get(14..16))
    else {
        return Ok(Parsed::NeedMore);
    };
    let body_len = usize::from(u16::from_be_bytes([len_bytes[0], len_bytes[1]]));
    let len = FIXED_BYTES + body_len;
    if len > HEADER_BYTES_MAX {
        return Err(HeaderError::Length(len));
    }
    if command != V2_PROXY && command != V2_LOCAL {
        return Err(HeaderError::Command(command));
    }
    let Some(body) = buf.get(FIXED_BYTES..len) else {
        return Ok(Parsed::NeedMore);
    };
    if command == V2_LOCAL {
        return Ok(Parsed::Header { len, source: None });
    }
    let source = match family {
        TCP4 => {
            let a: [u8; 12] = body
                .get(..12)
                .and_then(|b| b.try_into().ok())
                .ok_or(HeaderError::Length(len))?;
            let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
            SocketAddr::new(IpAddr::V4(ip), u16::from_be_bytes([a[8], a[9]]))
        }
        TCP6 => {
            let a: [u8; 36] = body
                .get(..36)
                .and_then(|b| b.try_into().ok())
                .ok_or(HeaderError::Length(len))?;
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&a[..16]);
            let ip = Ipv6Addr::from(octets);
            let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
            SocketAddr::new(ip, u16::from_be_bytes([a[32], a[33]]))
        }
        other => return Err(HeaderError::Family(other)),
    };
    Ok(Parsed::Header {
        len,
        source: Some(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_for_both_families() {
        let cases = [
            ("10.1.2.3:4000", "127.0.0.1:1883"),
            ("[2001:db8::1]:4000", "[::1]:1883"),
            ("10.1.2.3:4000", "[::1]:1883"),
        ];
        for (s, d) in cases {
            let (s, d): (SocketAddr, SocketAddr) = (s.parse().expect("s"), d.parse().expect("d"));
            let mut wire = encode(s, d);
            let header_len = wire.len();
            wire.extend_from_slice(b"\x10\x10rest");
            assert_eq!(
                parse(&wire),
                Ok(Parsed::Header {
                    len: header_len,
                    source: Some(s)
                })
            );
            // Every shorter prefix asks for more.
            for cut in 0..header_len {
                assert_eq!(parse(&wire[..cut]), Ok(Parsed::NeedMore), "{cut}");
            }
        }
    }

    #[test]
    fn client_bytes_are_not_a_header() {
        assert_eq!(parse(b"\x10\x10\x00\x04MQTT"), Ok(Parsed::Absent));
        assert_eq!(parse(b"CONNECT\n"), Ok(Parsed::Absent));
        // STOMP heart-beat EOLs share the signature's first bytes, then part.
        assert_eq!(parse(b"\r\n\r\nCONNECT"), Ok(Parsed::Absent));
        assert_eq!(parse(b"\r\n"), Ok(Parsed::NeedMore));
    }

    #[test]
    fn bad_headers_are_refused() {
        let mut wire = encode(
            "1.2.3.4:5".parse().expect("s"),
            "5.6.7.8:9".parse().expect("d"),
        );
        wire[12] = 0x11;
        assert_eq!(parse(&wire), Err(HeaderError::Command(0x11)));
        wire[12] = V2_PROXY;
        wire[13] = 0x31;
        assert_eq!(parse(&wire), Err(HeaderError::Family(0x31)));
        wire[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(parse(&wire), Err(HeaderError::Length(_))));
        wire[13] = TCP4;
        wire[14..16].copy_from_slice(&4u16.to_be_bytes());
        assert_eq!(parse(&wire), Err(HeaderError::Length(20)));
    }

    use proptest::prelude::*;

    fn socket() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port)),
            (any::<[u8; 16]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
        ]
    }

    proptest! {
        // A peer's bytes: never a panic, and a header found lies within
        // the buffer and the bound.
        #[test]
        fn any_bytes_parse_without_panic_within_bounds(
            tail in proptest::collection::vec(any::<u8>(), 0..700),
            signed in any::<bool>(),
        ) {
            let mut buf = if signed { SIGNATURE.to_vec() } else { Vec::new() };
            buf.extend_from_slice(&tail);
            if let Ok(Parsed::Header { len, .. }) = parse(&buf) {
                prop_assert!(len <= buf.len() && len <= HEADER_BYTES_MAX);
            }
        }

        // What the proxy writes reads back whatever the client sends after
        // it, and every strict prefix of it asks for more.
        #[test]
        fn an_encoded_header_reads_back_and_its_prefixes_need_more(
            source in socket(),
            destination in socket(),
            after in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let header = encode(source, destination);
            let mut buf = header.clone();
            buf.extend_from_slice(&after);
            let Ok(Parsed::Header { len, source: Some(read) }) = parse(&buf) else {
                return Err(TestCaseError::fail(format!("{:?}", parse(&buf))));
            };
            prop_assert_eq!(len, header.len());
            // An IPv4 address travels mapped when the other one is IPv6.
            let expected = match source.ip() {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(source, |v4| SocketAddr::new(IpAddr::V4(v4), source.port())),
                IpAddr::V4(_) => source,
            };
            prop_assert_eq!(read, expected);
            for cut in 1..header.len() {
                prop_assert_eq!(parse(&header[..cut]), Ok(Parsed::NeedMore));
            }
        }
    }
}
