//! A peer's first bytes into `proxy_header::parse`, the decoder a node runs
//! on every connection it accepts from a proxying node. Oracles: no panic;
//! a header found lies within the buffer and within `HEADER_BYTES_MAX`;
//! the answer depends only on the header's own bytes (whatever follows a
//! header does not change what is read, and a strict prefix of a header
//! asks for more rather than failing or guessing); and a header that
//! `encode` writes for addresses taken from the input reads back as the
//! source it names, whatever bytes follow it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rosetta_cluster::proxy_header::{encode, parse, Parsed, HEADER_BYTES_MAX};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

fuzz_target!(|data: &[u8]| {
    check_parse(data);
    check_round_trip(data);
});

fn check_parse(data: &[u8]) {
    match parse(data) {
        Ok(Parsed::Header { len, .. }) => {
            assert!(
                len <= data.len(),
                "header of {len} bytes in a {}-byte buffer",
                data.len()
            );
            assert!(
                len <= HEADER_BYTES_MAX,
                "header of {len} bytes over the maximum"
            );
            let header = &data[..len];
            assert_eq!(
                parse(header),
                parse(data),
                "bytes after the header changed the reading"
            );
            for cut in 0..len {
                assert_eq!(
                    parse(&header[..cut]),
                    Ok(Parsed::NeedMore),
                    "a {cut}-byte prefix of a {len}-byte header did not ask for more"
                );
            }
        }
        Ok(Parsed::Absent) => {
            // Absent is decided by the signature alone: more bytes never
            // turn a non-header into one.
            let mut longer = data.to_vec();
            longer.extend_from_slice(&[0; 40]);
            assert_eq!(
                parse(&longer),
                Ok(Parsed::Absent),
                "more bytes turned Absent into a header"
            );
        }
        Ok(Parsed::NeedMore) | Err(_) => {}
    }
}

fn check_round_trip(data: &[u8]) {
    let Some((source, destination, rest)) = addresses(data) else {
        return;
    };
    let mut wire = encode(source, destination);
    let header_len = wire.len();
    wire.extend_from_slice(rest);
    let want = canonical(source);
    assert_eq!(
        parse(&wire),
        Ok(Parsed::Header {
            len: header_len,
            source: Some(want),
        }),
        "encode({source}, {destination}) did not read back"
    );
}

/// Two addresses from the input's first bytes: a family byte, then 16
/// address bytes and 2 port bytes for each side. The rest follows the header.
fn addresses(data: &[u8]) -> Option<(SocketAddr, SocketAddr, &[u8])> {
    let (&family, data) = data.split_first()?;
    let (a, data) = data.split_at_checked(18)?;
    let (b, rest) = data.split_at_checked(18)?;
    let side = |bytes: &[u8], v4: bool| {
        let port = u16::from_be_bytes([bytes[16], bytes[17]]);
        let ip = if v4 {
            IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
        } else {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&bytes[..16]);
            IpAddr::V6(Ipv6Addr::from(octets))
        };
        SocketAddr::new(ip, port)
    };
    Some((side(a, family & 1 == 0), side(b, family & 2 == 0), rest))
}

/// What the reader reports for `source`: with mixed families the header is
/// written in IPv6, and an IPv4-mapped address reads back as IPv4.
fn canonical(source: SocketAddr) -> SocketAddr {
    match source.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), source.port()),
            None => source,
        },
        IpAddr::V4(_) => source,
    }
}
