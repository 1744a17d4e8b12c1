//! Drives an `MqttConnection` against the fake core with a virtual clock,
//! encoding client packets and decoding server packets with mqttbytes.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use mqttbytes::{v4, v5, QoS};
use rosetta_mqtt::{MqttConfig, MqttConnection};
use rosetta_neutral::*;

use crate::fake::{FakeBroker, NullSink};

pub struct Harness {
    pub conn: MqttConnection,
    pub broker: FakeBroker,
    pub now: Instant,
    pub v5: bool,
    pending: BytesMut,
}

/// A server packet, decoded in the connection's version.
#[allow(clippy::large_enum_variant)] // test-only, short-lived values
#[derive(Debug)]
pub enum Pkt {
    V4(v4::Packet),
    V5(v5::Packet),
}

impl Harness {
    pub fn new(v5: bool) -> Self {
        Self::with(MqttConfig::default(), FakeBroker::new(), v5)
    }

    pub fn with(config: MqttConfig, broker: FakeBroker, v5: bool) -> Self {
        let now = Instant::now();
        let conn =
            MqttConnection::new(config, Arc::new(broker.clone()), Arc::new(NullSink), 7, now);
        Self {
            conn,
            broker,
            now,
            v5,
            pending: BytesMut::new(),
        }
    }

    /// A second connection to the same fake core (a reconnect or restart).
    pub fn reconnect(&self, config: MqttConfig, v5: bool) -> Self {
        Self::with(config, self.broker.clone(), v5)
    }

    pub fn input(&mut self, bytes: &[u8]) {
        self.conn.handle_input(self.now, bytes);
    }

    pub fn input_bytewise(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.conn.handle_input(self.now, std::slice::from_ref(b));
        }
    }

    pub fn event(&mut self, e: SessionEvent) {
        self.conn.handle_event(self.now, e);
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.conn.handle_timeout(self.now);
    }

    pub fn raw_output(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.conn.poll_transmit(&mut out);
        out
    }

    /// Puts bytes taken with `raw_output` back, for `packets` to decode.
    pub fn unread(&mut self, out: &[u8]) {
        self.pending.extend_from_slice(out);
    }

    /// Every packet written since the last call.
    pub fn packets(&mut self) -> Vec<Pkt> {
        let out = self.raw_output();
        self.pending.extend_from_slice(&out);
        let mut pkts = Vec::new();
        while !self.pending.is_empty() {
            let p = if self.v5 {
                v5::read(&mut self.pending, 1 << 24).map(Pkt::V5)
            } else {
                v4::read(&mut self.pending, 1 << 24).map(Pkt::V4)
            };
            match p {
                Ok(p) => pkts.push(p),
                Err(e) => panic!("server wrote an undecodable packet: {e:?}"),
            }
        }
        pkts
    }

    pub fn v5_packets(&mut self) -> Vec<v5::Packet> {
        self.packets()
            .into_iter()
            .map(|p| match p {
                Pkt::V5(p) => p,
                Pkt::V4(p) => panic!("v4 packet on a v5 connection: {p:?}"),
            })
            .collect()
    }

    pub fn v4_packets(&mut self) -> Vec<v4::Packet> {
        self.packets()
            .into_iter()
            .map(|p| match p {
                Pkt::V4(p) => p,
                Pkt::V5(p) => panic!("v5 packet on a v4 connection: {p:?}"),
            })
            .collect()
    }

    /// Connects with a clean session and checks for a successful CONNACK.
    pub fn connected(v5: bool) -> Self {
        let mut h = Self::new(v5);
        h.connect_ok("c1", true);
        h
    }

    /// [`Harness::connected`], then one subscription, so that the session
    /// queue and its consumer (id 1) exist: a clean session creates them
    /// with its first subscription.
    pub fn subscribed(v5: bool) -> Self {
        let mut h = Self::connected(v5);
        h.subscribe_ok("harness/#");
        h
    }

    /// Subscribes to `filter` at QoS 2 and checks the SUBACK.
    pub fn subscribe_ok(&mut self, filter: &str) {
        if self.v5 {
            let mut s = v5::Subscribe::new(filter, QoS::ExactlyOnce);
            s.pkid = 1;
            self.input(&subscribe_v5(s));
            assert!(
                matches!(self.v5_packets().as_slice(), [v5::Packet::SubAck(a)] if a.return_codes.len() == 1),
                "expected one SUBACK"
            );
        } else {
            self.input(&subscribe_v4(1, &[(filter, 2)]));
            assert!(
                matches!(self.v4_packets().as_slice(), [v4::Packet::SubAck(a)] if a.return_codes.len() == 1),
                "expected one SUBACK"
            );
        }
    }

    pub fn connect_ok(&mut self, id: &str, clean: bool) -> bool {
        if self.v5 {
            let mut c = v5::Connect::new(id);
            c.clean_session = clean;
            c.keep_alive = 30;
            self.input(&connect_v5(c));
            match self.v5_packets().as_slice() {
                [v5::Packet::ConnAck(a)] => {
                    assert_eq!(a.code, v5::ConnectReturnCode::Success);
                    a.session_present
                }
                other => panic!("expected CONNACK, got {other:?}"),
            }
        } else {
            self.input(&connect_v4(id, clean, 30, None));
            match self.v4_packets().as_slice() {
                [v4::Packet::ConnAck(a)] => {
                    assert_eq!(a.code, v4::ConnectReturnCode::Success);
                    a.session_present
                }
                other => panic!("expected CONNACK, got {other:?}"),
            }
        }
    }
}

pub fn connect_v4(id: &str, clean: bool, keep_alive: u16, login: Option<(&str, &str)>) -> Vec<u8> {
    let mut c = v4::Connect::new(id);
    c.clean_session = clean;
    c.keep_alive = keep_alive;
    if let Some((u, p)) = login {
        c.set_login(u, p);
    }
    let mut b = BytesMut::new();
    c.write(&mut b).expect("encode");
    b.to_vec()
}

pub fn connect_v5(c: v5::Connect) -> Vec<u8> {
    let mut b = BytesMut::new();
    c.write(&mut b).expect("encode");
    b.to_vec()
}

pub fn connect_props() -> v5::ConnectProperties {
    v5::ConnectProperties {
        session_expiry_interval: None,
        receive_maximum: None,
        max_packet_size: None,
        topic_alias_max: None,
        request_response_info: None,
        request_problem_info: None,
        user_properties: Vec::new(),
        authentication_method: None,
        authentication_data: None,
    }
}

pub fn publish_props() -> v5::PublishProperties {
    v5::PublishProperties {
        payload_format_indicator: None,
        message_expiry_interval: None,
        topic_alias: None,
        response_topic: None,
        correlation_data: None,
        user_properties: Vec::new(),
        subscription_identifiers: Vec::new(),
        content_type: None,
    }
}

pub fn qos(q: u8) -> QoS {
    match q {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

pub fn publish_v4(topic: &str, q: u8, pkid: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = v4::Publish::new(topic, qos(q), payload.to_vec());
    p.pkid = pkid;
    let mut b = BytesMut::new();
    p.write(&mut b).expect("encode");
    b.to_vec()
}

pub fn publish_v5(p: v5::Publish) -> Vec<u8> {
    let mut b = BytesMut::new();
    p.write(&mut b).expect("encode");
    b.to_vec()
}

pub fn pub_v5(topic: &str, q: u8, pkid: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = v5::Publish::new(topic, qos(q), payload.to_vec());
    p.pkid = pkid;
    publish_v5(p)
}

/// Client acks as raw bytes (the same in both versions with reason 0).
pub fn puback(pkid: u16) -> Vec<u8> {
    ack(0x40, pkid)
}
pub fn pubrec(pkid: u16) -> Vec<u8> {
    ack(0x50, pkid)
}
pub fn pubrel(pkid: u16) -> Vec<u8> {
    ack(0x62, pkid)
}
pub fn pubcomp(pkid: u16) -> Vec<u8> {
    ack(0x70, pkid)
}
fn ack(first: u8, pkid: u16) -> Vec<u8> {
    let [hi, lo] = pkid.to_be_bytes();
    vec![first, 2, hi, lo]
}

pub fn subscribe_v4(pkid: u16, filters: &[(&str, u8)]) -> Vec<u8> {
    let mut s = v4::Subscribe::empty_subscribe();
    s.pkid = pkid;
    for (f, q) in filters {
        s.add((*f).to_owned(), qos(*q));
    }
    let mut b = BytesMut::new();
    s.write(&mut b).expect("encode");
    b.to_vec()
}

pub fn subscribe_v5(s: v5::Subscribe) -> Vec<u8> {
    let mut b = BytesMut::new();
    s.write(&mut b).expect("encode");
    b.to_vec()
}

pub fn unsubscribe(pkid: u16, filters: &[&str], v5: bool) -> Vec<u8> {
    let mut body = pkid.to_be_bytes().to_vec();
    if v5 {
        body.push(0);
    }
    for f in filters {
        body.extend_from_slice(&(f.len() as u16).to_be_bytes());
        body.extend_from_slice(f.as_bytes());
    }
    let mut out = vec![0xA2, body.len() as u8];
    out.extend_from_slice(&body);
    out
}

/// A message as the core would deliver it (address set, given QoS).
pub fn message(topic: &str, q: u8, payload: &'static [u8]) -> Message {
    Message {
        address: Some(Address::Topic(topic.into())),
        guarantee: Guarantee::from_qos(q).expect("qos"),
        ..Message::binary(Bytes::from_static(payload))
    }
}

pub fn delivery(consumer: u64, tag: u64, msg: Message, granted: u8) -> Delivery {
    Delivery {
        consumer: ConsumerId(consumer),
        tag: DeliveryTag(tag),
        message: Arc::new(msg),
        delivery_count: 0,
        redelivered: false,
        from_retained: false,
        matched: MatchInfo {
            max_guarantee: Guarantee::from_qos(granted),
            subscription_ids: Vec::new(),
            retain_as_published: false,
        },
        annotation: None,
        charge: rosetta_neutral::DeliveryCharge::none(),
        stream: None,
    }
}

pub const SECOND: Duration = Duration::from_secs(1);
