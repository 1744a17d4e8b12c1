//! The first frame of a connection, read far enough to know who the
//! client says it is (its balancer key), with the adapters' own decoders
//! so the proxy and the adapter read a CONNECT the same way.
//!
//! Nothing is authenticated here: the key is what the client claims. That
//! only decides which node checks the claim; the target authenticates as
//! for any client.

use rosetta_mqtt::codec::{Decoder as MqttDecoder, Inbound, Version as MqttVersion};
use rosetta_stomp::{Command, Decoder as StompDecoder, Limits, Version as StompVersion};

use crate::protocols::Wire;

/// Most bytes read before the first frame must be complete: a CONNECT is a
/// few hundred bytes, but an MQTT will payload may be large. A longer first
/// frame is served here, where the adapter's own limits apply.
pub(crate) const SNIFF_BYTES_MAX: usize = 64 * 1024;

/// Most header lines in a STOMP CONNECT the sniffer reads through.
const STOMP_CONNECT_HEADERS_MAX: usize = 256;

/// What the bytes read so far say.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// The first frame is not complete yet.
    NeedMore,
    /// A client that cannot be redirected in its protocol (MQTT 3.1.1,
    /// STOMP), with what it claims to be.
    Unredirectable {
        client_id: Option<String>,
        user: Option<String>,
    },
    /// Anything else (MQTT 5, a malformed or oversized frame): the adapter
    /// here deals with it as usual.
    ServeHere,
}

/// Reads the first frame of `wire` at the start of `buf`.
pub(crate) fn first_frame(wire: Wire, buf: &[u8]) -> Sniffed {
    match wire {
        Wire::Mqtt => mqtt(buf),
        Wire::Stomp => stomp(buf),
        Wire::Amqp => Sniffed::ServeHere,
    }
}

fn mqtt(buf: &[u8]) -> Sniffed {
    let mut decoder = MqttDecoder::new(SNIFF_BYTES_MAX);
    decoder.extend(buf);
    match decoder.next_packet() {
        Ok(None) => Sniffed::NeedMore,
        Ok(Some(Inbound::Connect(c))) if c.version == MqttVersion::V311 => {
            Sniffed::Unredirectable {
                // An empty id is assigned by the node that serves it.
                client_id: (!c.client_id.is_empty()).then(|| c.client_id.clone()),
                user: c.username.clone(),
            }
        }
        Ok(Some(_)) | Err(_) => Sniffed::ServeHere,
    }
}

fn stomp(buf: &[u8]) -> Sniffed {
    let limits = Limits {
        frame_size_max_bytes: SNIFF_BYTES_MAX,
        header_line_max_bytes: SNIFF_BYTES_MAX,
        headers_max: STOMP_CONNECT_HEADERS_MAX,
        body_size_max_bytes: SNIFF_BYTES_MAX,
    };
    // CONNECT headers are never escaped, whatever the version.
    let mut decoder = StompDecoder::new(limits, StompVersion::V1_0);
    decoder.feed(buf);
    match decoder.decode() {
        Ok(None) => Sniffed::NeedMore,
        Ok(Some(frame)) if matches!(frame.command, Command::Connect | Command::Stomp) => {
            Sniffed::Unredirectable {
                client_id: frame.header("client-id").map(str::to_owned),
                user: frame.header("login").map(str::to_owned),
            }
        }
        Ok(Some(_)) | Err(_) => Sniffed::ServeHere,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3.1.1 CONNECT with client id `dev` and user `u` (password `p`).
    const MQTT4: &[u8] = b"\x10\x15\x00\x04MQTT\x04\xc2\x00\x3c\x00\x03dev\x00\x01u\x00\x01p";

    #[test]
    fn an_mqtt_311_connect_gives_its_id_and_user_once_complete() {
        for cut in 0..MQTT4.len() {
            assert_eq!(first_frame(Wire::Mqtt, &MQTT4[..cut]), Sniffed::NeedMore);
        }
        assert_eq!(
            first_frame(Wire::Mqtt, MQTT4),
            Sniffed::Unredirectable {
                client_id: Some("dev".into()),
                user: Some("u".into())
            }
        );
    }

    #[test]
    fn mqtt_5_and_garbage_are_served_here() {
        let v5 = b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01x";
        assert_eq!(first_frame(Wire::Mqtt, v5), Sniffed::ServeHere);
        assert_eq!(first_frame(Wire::Mqtt, b"\x30\x00"), Sniffed::ServeHere);
    }

    #[test]
    fn a_stomp_connect_gives_its_client_id_and_login() {
        let frame = b"\nCONNECT\naccept-version:1.2\nclient-id:c1\nlogin:bob\n\n\0";
        assert_eq!(
            first_frame(Wire::Stomp, &frame[..frame.len() - 1]),
            Sniffed::NeedMore
        );
        assert_eq!(
            first_frame(Wire::Stomp, frame),
            Sniffed::Unredirectable {
                client_id: Some("c1".into()),
                user: Some("bob".into())
            }
        );
        assert_eq!(
            first_frame(Wire::Stomp, b"SEND\ndestination:/q\n\n\0"),
            Sniffed::ServeHere
        );
    }
}
