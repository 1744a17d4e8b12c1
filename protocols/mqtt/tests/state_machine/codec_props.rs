//! Property tests of the decoder: packets written by mqttbytes' encoders
//! (as a client would send them) decode to the same fields through our
//! decoder, whatever way the byte stream is split.

use bytes::{Bytes, BytesMut};
use mqttbytes::v5;
use proptest::prelude::*;
use rosetta_mqtt::codec::{Decoder, Inbound, Props};

use crate::harness::*;

fn decode_split(stream: &[u8], cuts: &[usize]) -> Vec<Inbound> {
    let mut d = Decoder::new(1 << 20);
    let mut packets = Vec::new();
    let mut start = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    points.sort_unstable();
    points.push(stream.len());
    for end in points {
        d.extend(&stream[start..end.max(start)]);
        start = end.max(start);
        while let Some(p) = d.next_packet().expect("valid stream") {
            packets.push(p);
        }
    }
    packets
}

fn topic() -> impl Strategy<Value = String> {
    "[a-z0-9]{1,8}(/[a-z0-9$ ]{0,6}){0,3}"
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 é€-]{0,12}"
}

proptest! {
    #[test]
    fn v5_publish_round_trips(
        topic in topic(),
        q in 0u8..3,
        pkid in 1u16..,
        retain in any::<bool>(),
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        users in proptest::collection::vec((text(), text()), 0..4),
        expiry in proptest::option::of(any::<u32>()),
        content_type in proptest::option::of(text()),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let mut p = v5::Publish::new(topic.clone(), qos(q), payload.clone());
        p.pkid = if q == 0 { 0 } else { pkid };
        p.retain = retain;
        let mut props = publish_props();
        props.user_properties = users.clone();
        props.message_expiry_interval = expiry;
        props.content_type = content_type.clone();
        p.properties = Some(props);
        let mut stream = connect_v5(v5::Connect::new("c"));
        stream.extend(publish_v5(p));
        let packets = decode_split(&stream, &cuts);
        prop_assert_eq!(packets.len(), 2);
        let Inbound::Publish(got) = &packets[1] else { panic!("{:?}", packets[1]) };
        prop_assert_eq!(&got.topic, &topic);
        prop_assert_eq!(got.qos, q);
        prop_assert_eq!(got.retain, retain);
        prop_assert_eq!(got.pkid, if q == 0 { 0 } else { pkid });
        prop_assert_eq!(&got.payload, &Bytes::from(payload));
        // No properties at all decode as none.
        let none = Props::default();
        let props = got.props.as_deref().unwrap_or(&none);
        prop_assert_eq!(&props.user_properties, &users);
        prop_assert_eq!(props.message_expiry_interval_s, expiry);
        prop_assert_eq!(&props.content_type, &content_type);
    }

    #[test]
    fn v311_publish_round_trips(
        topic in topic(),
        q in 0u8..3,
        pkid in 1u16..,
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let mut stream = connect_v4("c", true, 30, None);
        stream.extend(publish_v4(&topic, q, if q == 0 { 0 } else { pkid }, &payload));
        let packets = decode_split(&stream, &cuts);
        let Inbound::Publish(got) = &packets[1] else { panic!("{:?}", packets[1]) };
        prop_assert_eq!(&got.topic, &topic);
        prop_assert_eq!(got.qos, q);
        prop_assert_eq!(&got.payload[..], &payload[..]);
    }

    /// The case mqttbytes 0.6's own reader gets wrong: a subscription
    /// identifier followed by user properties.
    #[test]
    fn v5_subscribe_with_identifier_and_user_properties(
        filters in proptest::collection::vec((topic(), 0u8..3, 0u8..3, any::<bool>(), any::<bool>()), 1..5),
        id in 1usize..268_435_455,
        users in proptest::collection::vec((text(), text()), 1..3),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let mut s = v5::Subscribe::empty_subscribe();
        s.pkid = 3;
        for (f, q, rh, nl, rap) in &filters {
            let mut sf = v5::SubscribeFilter::new(f.clone(), qos(*q));
            sf.set_nolocal(*nl).set_preserve_retain(*rap).set_retain_forward_rule(match rh {
                0 => v5::RetainForwardRule::OnEverySubscribe,
                1 => v5::RetainForwardRule::OnNewSubscribe,
                _ => v5::RetainForwardRule::Never,
            });
            s.filters.push(sf);
        }
        s.properties = Some(v5::SubscribeProperties { id: Some(id), user_properties: users.clone() });
        let mut buf = BytesMut::new();
        s.write(&mut buf).expect("encode");
        let mut stream = connect_v5(v5::Connect::new("c"));
        stream.extend_from_slice(&buf);
        let packets = decode_split(&stream, &cuts);
        let Inbound::Subscribe(got) = &packets[1] else { panic!("{:?}", packets[1]) };
        prop_assert_eq!(got.props.subscription_id, Some(id as u32));
        prop_assert_eq!(&got.props.user_properties, &users);
        prop_assert_eq!(got.filters.len(), filters.len());
        for (g, (f, q, rh, nl, rap)) in got.filters.iter().zip(&filters) {
            prop_assert_eq!(&g.filter, f);
            prop_assert_eq!(g.qos, *q);
            prop_assert_eq!(g.retain_handling, *rh);
            prop_assert_eq!(g.no_local, *nl);
            prop_assert_eq!(g.retain_as_published, *rap);
        }
    }
}
