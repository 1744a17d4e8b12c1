//! The subscriptions of a persistent session that the core does not keep
//! for us: shared subscriptions (`$share/group/filter`) and `$queue/<name>`
//! subscriptions.
//!
//! An ordinary filter is a binding of the session queue, which the core
//! journals with the queue, so it survives disconnects and restarts by
//! itself. The other two kinds are consumers of a queue that is not the
//! session's (the group's queue, or the named queue), and consumers end
//! with their connection. So the session remembers them in its durable
//! key-value state ([`rosetta_neutral::Session::put_state`], the same
//! store as the inbound QoS 2 packet ids) and re-attaches them when a
//! client resumes the session.
//!
//! The value is rewritten whole on every change, so the number of such
//! subscriptions per session is capped (`MqttConfig::own_subscriptions_max`).
//!
//! Format (version 1): `0x01`, then per subscription: granted QoS (u8),
//! flags (u8: bit 0 retain-as-published, bit 1 has subscription id),
//! subscription id (u32, 0 when absent), filter length (u16), filter bytes.

use bytes::{BufMut, Bytes, BytesMut};

/// `put_state` key of the subscriptions listed above.
pub(crate) const OWN_SUBSCRIPTIONS_STATE_KEY: &str = "mqtt.own-subscriptions";

const FORMAT_VERSION: u8 = 1;
const FLAG_RETAIN_AS_PUBLISHED: u8 = 1;
const FLAG_SUBSCRIPTION_ID: u8 = 2;
const ENTRY_FIXED_BYTES: usize = 1 + 1 + 4 + 2;

/// What is needed to re-create one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnSub {
    /// The full filter as the client sent it: `$share/g/f` or `$queue/q`.
    pub(crate) filter: String,
    /// Granted QoS.
    pub(crate) qos: u8,
    /// v5 retain-as-published (shared subscriptions bind with it).
    pub(crate) retain_as_published: bool,
    /// v5 subscription identifier.
    pub(crate) subscription_id: Option<u32>,
}

/// Encodes the set; filters longer than 65,535 bytes cannot occur (they
/// arrive in MQTT strings) and are skipped if they ever do.
pub(crate) fn encode<'a>(subs: impl IntoIterator<Item = &'a OwnSub>) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(FORMAT_VERSION);
    for s in subs {
        let Ok(len) = u16::try_from(s.filter.len()) else {
            continue;
        };
        let mut flags = 0;
        if s.retain_as_published {
            flags |= FLAG_RETAIN_AS_PUBLISHED;
        }
        if s.subscription_id.is_some() {
            flags |= FLAG_SUBSCRIPTION_ID;
        }
        b.put_u8(s.qos);
        b.put_u8(flags);
        b.put_u32(s.subscription_id.unwrap_or(0));
        b.put_u16(len);
        b.put_slice(s.filter.as_bytes());
    }
    b.freeze()
}

/// Decodes [`encode`]. `None` for anything malformed or of another format
/// version: the subscriptions are then not restored (the state is ours,
/// so this only happens after a format change or a bug).
pub(crate) fn decode(b: &[u8]) -> Option<Vec<OwnSub>> {
    let (&version, mut rest) = b.split_first()?;
    if version != FORMAT_VERSION {
        return None;
    }
    let mut subs = Vec::new();
    while !rest.is_empty() {
        if rest.len() < ENTRY_FIXED_BYTES {
            return None;
        }
        let (fixed, tail) = rest.split_at(ENTRY_FIXED_BYTES);
        let qos = fixed[0];
        let flags = fixed[1];
        let id = u32::from_be_bytes([fixed[2], fixed[3], fixed[4], fixed[5]]);
        let len = usize::from(u16::from_be_bytes([fixed[6], fixed[7]]));
        if qos > 2 || tail.len() < len {
            return None;
        }
        let (filter, tail) = tail.split_at(len);
        subs.push(OwnSub {
            filter: std::str::from_utf8(filter).ok()?.to_owned(),
            qos,
            retain_as_published: flags & FLAG_RETAIN_AS_PUBLISHED != 0,
            subscription_id: (flags & FLAG_SUBSCRIPTION_ID != 0).then_some(id),
        });
        rest = tail;
    }
    Some(subs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let subs = vec![
            OwnSub {
                filter: "$share/g/a/#".into(),
                qos: 2,
                retain_as_published: true,
                subscription_id: Some(7),
            },
            OwnSub {
                filter: "$queue/orders".into(),
                qos: 1,
                retain_as_published: false,
                subscription_id: None,
            },
        ];
        let b = encode(&subs);
        assert_eq!(decode(&b), Some(subs));
        assert_eq!(decode(&encode(&[])), Some(Vec::new()));
        assert_eq!(decode(b""), None);
        assert_eq!(decode(&b[..b.len() - 1]), None, "truncated filter");
        let mut other = b.to_vec();
        other[0] = 9;
        assert_eq!(decode(&other), None, "unknown format version");
    }
}
