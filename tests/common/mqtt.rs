//! MQTT helpers of the integration tests: rumqttc clients (3.1.1 and 5.0)
//! with short timeouts, and a raw-socket client for flows rumqttc cannot
//! stop in the middle of (unacknowledged deliveries, half-done QoS 2,
//! malformed packets). The raw client encodes and decodes with the codecs
//! rumqttc exports.
#![allow(dead_code)] // each test file uses its own subset

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rumqttc::v5::mqttbytes::v5 as p5;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::TestBroker;

/// How long any single expected event may take.
pub const WAIT: Duration = Duration::from_secs(5);
/// How long we watch for something that must NOT arrive.
pub const QUIET: Duration = Duration::from_millis(300);

/// 3.1.1 packets as rumqttc encodes/decodes them.
pub use rumqttc::mqttbytes::v4 as p4;

// ---- rumqttc, MQTT 3.1.1 ------------------------------------------------

pub fn opts4(broker: &TestBroker, id: &str) -> rumqttc::MqttOptions {
    let addr = broker.mqtt();
    let mut opts = rumqttc::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(10));
    opts
}

pub fn client4(
    broker: &TestBroker,
    id: &str,
    clean: bool,
) -> (rumqttc::AsyncClient, rumqttc::EventLoop) {
    let mut opts = opts4(broker, id);
    opts.set_clean_session(clean);
    rumqttc::AsyncClient::new(opts, 256)
}

/// Next incoming packet or the connection error.
pub async fn next4(
    ev: &mut rumqttc::EventLoop,
) -> Result<rumqttc::Packet, rumqttc::ConnectionError> {
    tokio::time::timeout(WAIT, async {
        loop {
            match ev.poll().await {
                Ok(rumqttc::Event::Incoming(p)) => return Ok(p),
                Ok(rumqttc::Event::Outgoing(_)) => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("an MQTT 3.1.1 event within the timeout")
}

/// Polls until `want` picks a packet; panics on a connection error.
pub async fn wait4<T>(
    ev: &mut rumqttc::EventLoop,
    mut want: impl FnMut(&rumqttc::Packet) -> Option<T>,
) -> T {
    loop {
        let p = next4(ev).await.expect("connection stays up");
        if let Some(t) = want(&p) {
            return t;
        }
    }
}

pub async fn connack4(ev: &mut rumqttc::EventLoop) -> rumqttc::ConnAck {
    wait4(ev, |p| match p {
        rumqttc::Packet::ConnAck(c) => Some(c.clone()),
        _ => None,
    })
    .await
}

pub async fn suback4(ev: &mut rumqttc::EventLoop) -> rumqttc::SubAck {
    wait4(ev, |p| match p {
        rumqttc::Packet::SubAck(s) => Some(s.clone()),
        _ => None,
    })
    .await
}

pub async fn puback4(ev: &mut rumqttc::EventLoop) {
    wait4(ev, |p| {
        matches!(p, rumqttc::Packet::PubAck(_)).then_some(())
    })
    .await
}

pub async fn pubcomp4(ev: &mut rumqttc::EventLoop) {
    wait4(ev, |p| {
        matches!(p, rumqttc::Packet::PubComp(_)).then_some(())
    })
    .await
}

pub async fn publish4(ev: &mut rumqttc::EventLoop) -> rumqttc::Publish {
    wait4(ev, |p| match p {
        rumqttc::Packet::Publish(p) => Some(p.clone()),
        _ => None,
    })
    .await
}

/// Polls for [`QUIET`] and panics if a PUBLISH arrives.
pub async fn quiet4(ev: &mut rumqttc::EventLoop) {
    let watch = async {
        loop {
            match ev.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                    panic!("unexpected delivery: {p:?}")
                }
                Ok(_) => {}
                Err(e) => panic!("connection error: {e}"),
            }
        }
    };
    let _ = tokio::time::timeout(QUIET, watch).await;
}

/// A connected 3.1.1 client (CONNACK received).
pub async fn connected4(
    broker: &TestBroker,
    id: &str,
    clean: bool,
) -> (rumqttc::AsyncClient, rumqttc::EventLoop, rumqttc::ConnAck) {
    let (c, mut ev) = client4(broker, id, clean);
    let ack = connack4(&mut ev).await;
    (c, ev, ack)
}

/// Sends SUBSCRIBE of `filter` and waits for the SUBACK, which it returns
/// unchecked (the caller asserts the granted codes it cares about).
pub async fn subscribe4(
    c: &rumqttc::AsyncClient,
    ev: &mut rumqttc::EventLoop,
    filter: impl Into<String>,
    qos: rumqttc::QoS,
) -> rumqttc::SubAck {
    c.subscribe(filter, qos).await.expect("subscribe");
    suback4(ev).await
}

/// Sends UNSUBSCRIBE of `filter` and waits for the UNSUBACK.
pub async fn unsubscribe4(
    c: &rumqttc::AsyncClient,
    ev: &mut rumqttc::EventLoop,
    filter: impl Into<String>,
) {
    c.unsubscribe(filter).await.expect("unsubscribe");
    wait4(ev, |p| {
        matches!(p, rumqttc::Packet::UnsubAck(_)).then_some(())
    })
    .await;
}

/// A connected 3.1.1 client subscribed to `filter` (SUBACK received).
pub async fn subscriber4(
    broker: &TestBroker,
    id: &str,
    clean: bool,
    filter: &str,
    qos: rumqttc::QoS,
) -> (rumqttc::AsyncClient, rumqttc::EventLoop) {
    let (c, mut ev, _) = connected4(broker, id, clean).await;
    c.subscribe(filter, qos).await.expect("subscribe");
    let ack = suback4(&mut ev).await;
    assert!(
        matches!(
            ack.return_codes[0],
            rumqttc::SubscribeReasonCode::Success(_)
        ),
        "{ack:?}"
    );
    (c, ev)
}

/// Publishes with rumqttc and waits for the end of the QoS flow.
pub async fn publish_and_ack4(
    c: &rumqttc::AsyncClient,
    ev: &mut rumqttc::EventLoop,
    topic: &str,
    qos: rumqttc::QoS,
    retain: bool,
    payload: &[u8],
) {
    c.publish(topic, qos, retain, payload.to_vec())
        .await
        .expect("publish");
    match qos {
        rumqttc::QoS::AtMostOnce => {
            // Push it out: the next outgoing event is the PUBLISH itself.
            tokio::time::timeout(WAIT, async {
                loop {
                    if let rumqttc::Event::Outgoing(rumqttc::Outgoing::Publish(_)) =
                        ev.poll().await.expect("connection stays up")
                    {
                        return;
                    }
                }
            })
            .await
            .expect("QoS 0 publish sent");
        }
        rumqttc::QoS::AtLeastOnce => puback4(ev).await,
        rumqttc::QoS::ExactlyOnce => pubcomp4(ev).await,
    }
}

/// A one-shot publisher: connects, publishes, waits for the ack, disconnects.
pub async fn publish_once4(
    broker: &TestBroker,
    topic: &str,
    qos: rumqttc::QoS,
    retain: bool,
    payload: &[u8],
) {
    let id = format!("pub-{}", rand_suffix());
    let (c, mut ev, _) = connected4(broker, &id, true).await;
    publish_and_ack4(&c, &mut ev, topic, qos, retain, payload).await;
    disconnect4(&c, &mut ev).await;
}

/// Sends DISCONNECT and drives the event loop until it is written.
pub async fn disconnect4(c: &rumqttc::AsyncClient, ev: &mut rumqttc::EventLoop) {
    c.disconnect().await.expect("disconnect");
    let _ = tokio::time::timeout(WAIT, async {
        loop {
            match ev.poll().await {
                Ok(rumqttc::Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

pub fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

// ---- rumqttc, MQTT 5.0 --------------------------------------------------

#[allow(unused_imports)] // each test file uses its own subset
pub mod v5 {
    pub use rumqttc::v5::mqttbytes::v5::{
        ConnAck, ConnAckProperties, ConnectReturnCode, DisconnectReasonCode, Filter, LastWill,
        LastWillProperties, Packet, Publish, PublishProperties, RetainForwardRule, SubAck,
        SubscribeProperties, SubscribeReasonCode,
    };
    pub use rumqttc::v5::mqttbytes::QoS;
    pub use rumqttc::v5::{
        AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, StateError,
    };
}

pub fn opts5(broker: &TestBroker, id: &str) -> v5::MqttOptions {
    let addr = broker.mqtt();
    let mut opts = v5::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(10));
    opts
}

pub fn client5_with(opts: v5::MqttOptions) -> (v5::AsyncClient, v5::EventLoop) {
    v5::AsyncClient::new(opts, 256)
}

pub async fn next5(ev: &mut v5::EventLoop) -> Result<v5::Packet, v5::ConnectionError> {
    tokio::time::timeout(WAIT, async {
        loop {
            match ev.poll().await {
                Ok(v5::Event::Incoming(p)) => return Ok(p),
                Ok(v5::Event::Outgoing(_)) => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("an MQTT 5 event within the timeout")
}

pub async fn wait5<T>(ev: &mut v5::EventLoop, mut want: impl FnMut(&v5::Packet) -> Option<T>) -> T {
    loop {
        let p = next5(ev).await.expect("connection stays up");
        if let Some(t) = want(&p) {
            return t;
        }
    }
}

pub async fn connack5(ev: &mut v5::EventLoop) -> v5::ConnAck {
    wait5(ev, |p| match p {
        v5::Packet::ConnAck(c) => Some(c.clone()),
        _ => None,
    })
    .await
}

pub async fn suback5(ev: &mut v5::EventLoop) -> v5::SubAck {
    wait5(ev, |p| match p {
        v5::Packet::SubAck(s) => Some(s.clone()),
        _ => None,
    })
    .await
}

pub async fn publish5(ev: &mut v5::EventLoop) -> v5::Publish {
    wait5(ev, |p| match p {
        v5::Packet::Publish(p) => Some(p.clone()),
        _ => None,
    })
    .await
}

pub async fn quiet5(ev: &mut v5::EventLoop) {
    let watch = async {
        loop {
            match ev.poll().await {
                Ok(v5::Event::Incoming(v5::Packet::Publish(p))) => {
                    panic!("unexpected delivery: {p:?}")
                }
                Ok(_) => {}
                Err(e) => panic!("connection error: {e}"),
            }
        }
    };
    let _ = tokio::time::timeout(QUIET, watch).await;
}

pub async fn connected5(opts: v5::MqttOptions) -> (v5::AsyncClient, v5::EventLoop, v5::ConnAck) {
    let (c, mut ev) = client5_with(opts);
    let ack = connack5(&mut ev).await;
    (c, ev, ack)
}

/// A connected MQTT 5 client logged in as `user` (CONNACK success checked).
pub async fn connected5_as(
    broker: &TestBroker,
    id: &str,
    user: &str,
    pw: &str,
) -> (v5::AsyncClient, v5::EventLoop) {
    let mut opts = opts5(broker, id);
    opts.set_credentials(user, pw);
    let (c, ev, ack) = connected5(opts).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    (c, ev)
}

/// Subscribes to `filters` at QoS 1 in one SUBSCRIBE: the SUBACK's codes.
pub async fn subscribe_many5(
    c: &v5::AsyncClient,
    ev: &mut v5::EventLoop,
    filters: &[&str],
) -> Vec<v5::SubscribeReasonCode> {
    c.subscribe_many(
        filters
            .iter()
            .map(|f| v5::Filter::new((*f).to_owned(), v5::QoS::AtLeastOnce)),
    )
    .await
    .expect("subscribe");
    suback5(ev).await.return_codes
}

/// Subscribes with `filter` (and its options) and checks the SUBACK.
pub async fn subscribe5(
    c: &v5::AsyncClient,
    ev: &mut v5::EventLoop,
    filter: v5::Filter,
    props: Option<v5::SubscribeProperties>,
) -> v5::SubAck {
    match props {
        Some(p) => c.subscribe_many_with_properties([filter], p).await,
        None => c.subscribe_many([filter]).await,
    }
    .expect("subscribe");
    suback5(ev).await
}

/// Sends UNSUBSCRIBE of `filter` and waits for the UNSUBACK.
pub async fn unsubscribe5(c: &v5::AsyncClient, ev: &mut v5::EventLoop, filter: impl Into<String>) {
    c.unsubscribe(filter).await.expect("unsubscribe");
    wait5(ev, |p| matches!(p, v5::Packet::UnsubAck(_)).then_some(())).await;
}

pub async fn disconnect5(c: &v5::AsyncClient, ev: &mut v5::EventLoop) {
    c.disconnect().await.expect("disconnect");
    let _ = tokio::time::timeout(WAIT, async {
        loop {
            match ev.poll().await {
                Ok(v5::Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

/// Publishes with rumqttc v5 and waits for PUBACK/PUBCOMP (or the send for
/// QoS 0).
pub async fn publish_and_ack5(
    c: &v5::AsyncClient,
    ev: &mut v5::EventLoop,
    topic: &str,
    qos: v5::QoS,
    retain: bool,
    payload: &[u8],
    props: Option<v5::PublishProperties>,
) {
    match props {
        Some(p) => {
            c.publish_with_properties(topic, qos, retain, payload.to_vec(), p)
                .await
        }
        None => c.publish(topic, qos, retain, payload.to_vec()).await,
    }
    .expect("publish");
    match qos {
        v5::QoS::AtMostOnce => {
            tokio::time::timeout(WAIT, async {
                loop {
                    if let v5::Event::Outgoing(rumqttc::Outgoing::Publish(_)) =
                        ev.poll().await.expect("connection stays up")
                    {
                        return;
                    }
                }
            })
            .await
            .expect("QoS 0 publish sent");
        }
        v5::QoS::AtLeastOnce => {
            wait5(ev, |p| matches!(p, v5::Packet::PubAck(_)).then_some(())).await
        }
        v5::QoS::ExactlyOnce => {
            wait5(ev, |p| matches!(p, v5::Packet::PubComp(_)).then_some(())).await
        }
    }
}

/// How long a cross-protocol wait may take (a message crosses two
/// protocols, and some bodies are large).
pub const SLOW: Duration = Duration::from_secs(10);

/// An MQTT 5 event loop polled by a background task, so that its client's
/// requests go out while the test waits on another protocol; incoming
/// packets queue here in order. The task ends with the connection.
pub struct Incoming5 {
    rx: tokio::sync::mpsc::UnboundedReceiver<v5::Packet>,
}

/// Polls `ev` in the background from now on.
pub fn drive5(mut ev: v5::EventLoop) -> Incoming5 {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            match ev.poll().await {
                Ok(v5::Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    Incoming5 { rx }
}

/// A v5 client with [`opts5`] whose event loop runs in the background
/// (it connects as soon as the loop is first polled).
pub fn driven5(broker: &TestBroker, id: &str) -> (v5::AsyncClient, Incoming5) {
    driven5_with(opts5(broker, id))
}

/// [`driven5`] with the caller's options.
pub fn driven5_with(opts: v5::MqttOptions) -> (v5::AsyncClient, Incoming5) {
    let (c, ev) = client5_with(opts);
    (c, drive5(ev))
}

impl Incoming5 {
    /// The first incoming packet `want` picks, skipping the others; panics
    /// if none comes within [`SLOW`] or the connection ends first.
    pub async fn next<T>(&mut self, mut want: impl FnMut(v5::Packet) -> Option<T>) -> T {
        tokio::time::timeout(SLOW, async {
            loop {
                let p = self.rx.recv().await.expect("MQTT connection open");
                if let Some(t) = want(p) {
                    return t;
                }
            }
        })
        .await
        .expect("MQTT packet in time")
    }

    /// Waits for a SUBACK (any reason codes: the caller checks them if it
    /// cares).
    pub async fn suback(&mut self) -> v5::SubAck {
        self.next(|p| match p {
            v5::Packet::SubAck(s) => Some(s),
            _ => None,
        })
        .await
    }

    /// Waits for a PUBACK.
    pub async fn puback(&mut self) {
        self.next(|p| matches!(p, v5::Packet::PubAck(_)).then_some(()))
            .await
    }

    /// The next PUBLISH.
    pub async fn publish(&mut self) -> v5::Publish {
        self.next(|p| match p {
            v5::Packet::Publish(p) => Some(p),
            _ => None,
        })
        .await
    }
}

// ---- raw socket client --------------------------------------------------

/// An MQTT client on a bare socket: sends what the test says, when it says.
pub struct Raw {
    stream: super::ws::BoxedIo,
    buf: BytesMut,
}

impl Raw {
    pub async fn open(addr: SocketAddr) -> Raw {
        Self::from_stream(TcpStream::connect(addr).await.expect("tcp connect"))
    }

    /// A client on a socket the test connected itself.
    pub fn from_stream(stream: TcpStream) -> Raw {
        stream.set_nodelay(true).expect("nodelay");
        Self::from_io(stream)
    }

    /// A client on any byte stream (e.g. [`super::ws::carry`]'s, for MQTT
    /// over WebSocket).
    pub fn from_io(io: impl super::ws::ClientIo + 'static) -> Raw {
        Raw {
            stream: Box::new(io),
            buf: BytesMut::new(),
        }
    }

    pub async fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    pub async fn send4(&mut self, p: p4::Packet) {
        let mut b = BytesMut::new();
        p.write(&mut b, 1 << 28).expect("encode v4");
        self.write(&b).await;
    }

    pub async fn send5(&mut self, p: p5::Packet) {
        let mut b = BytesMut::new();
        p.write(&mut b, None).expect("encode v5");
        self.write(&b).await;
    }

    /// Reads more bytes; false on EOF or reset.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match self.stream.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Next 3.1.1 packet, or None if the server closed the connection.
    pub async fn recv4_opt(&mut self, wait: Duration) -> Option<p4::Packet> {
        tokio::time::timeout(wait, async {
            loop {
                match p4::Packet::read(&mut self.buf, 1 << 28) {
                    Ok(p) => return Some(p),
                    Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {
                        if !self.fill().await {
                            return None;
                        }
                    }
                    Err(e) => panic!("server sent an undecodable packet: {e:?}"),
                }
            }
        })
        .await
        .unwrap_or(None)
    }

    pub async fn recv4(&mut self) -> p4::Packet {
        tokio::time::timeout(WAIT, async {
            loop {
                match p4::Packet::read(&mut self.buf, 1 << 28) {
                    Ok(p) => return p,
                    Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {
                        assert!(self.fill().await, "server closed the connection");
                    }
                    Err(e) => panic!("server sent an undecodable packet: {e:?}"),
                }
            }
        })
        .await
        .expect("a packet within the timeout")
    }

    /// Next 3.1.1 packet that is not a PINGRESP.
    pub async fn recv4_publish(&mut self) -> p4::Publish {
        match self.recv4().await {
            p4::Packet::Publish(p) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// The next 3.1.1 packet, which must be a PUBREC; returns its packet id.
    pub async fn recv4_pubrec(&mut self) -> u16 {
        match self.recv4().await {
            p4::Packet::PubRec(r) => r.pkid,
            other => panic!("expected PUBREC, got {other:?}"),
        }
    }

    /// The next 3.1.1 packet, which must be a PUBREL; returns its packet id.
    pub async fn recv4_pubrel(&mut self) -> u16 {
        match self.recv4().await {
            p4::Packet::PubRel(r) => r.pkid,
            other => panic!("expected PUBREL, got {other:?}"),
        }
    }

    /// The next 3.1.1 packet, which must be a PUBCOMP; returns its packet id.
    pub async fn recv4_pubcomp(&mut self) -> u16 {
        match self.recv4().await {
            p4::Packet::PubComp(c) => c.pkid,
            other => panic!("expected PUBCOMP, got {other:?}"),
        }
    }

    /// Waits [`QUIET`] and fails on any packet.
    pub async fn quiet4(&mut self) {
        if let Some(p) = self.recv4_opt(QUIET).await {
            panic!("unexpected packet {p:?}");
        }
    }

    pub async fn recv5_opt(&mut self, wait: Duration) -> Option<p5::Packet> {
        tokio::time::timeout(wait, async {
            loop {
                match p5::Packet::read(&mut self.buf, None) {
                    Ok(p) => return Some(p),
                    Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => {
                        if !self.fill().await {
                            return None;
                        }
                    }
                    Err(e) => panic!("server sent an undecodable packet: {e:?}"),
                }
            }
        })
        .await
        .unwrap_or(None)
    }

    pub async fn recv5(&mut self) -> p5::Packet {
        tokio::time::timeout(WAIT, async {
            loop {
                match p5::Packet::read(&mut self.buf, None) {
                    Ok(p) => return p,
                    Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => {
                        assert!(self.fill().await, "server closed the connection");
                    }
                    Err(e) => panic!("server sent an undecodable packet: {e:?}"),
                }
            }
        })
        .await
        .expect("a packet within the timeout")
    }

    pub async fn recv5_publish(&mut self) -> p5::Publish {
        match self.recv5().await {
            p5::Packet::Publish(p) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    pub async fn quiet5(&mut self) {
        self.quiet5_for(QUIET).await;
    }

    pub async fn quiet5_for(&mut self, wait: Duration) {
        if let Some(p) = self.recv5_opt(wait).await {
            panic!("unexpected packet {p:?}");
        }
    }

    /// Asserts the server closes the connection without sending anything
    /// more (the 3.1.1 answer to bad input).
    pub async fn expect_silent_close(&mut self) {
        let closed = tokio::time::timeout(WAIT, async {
            loop {
                if !self.fill().await {
                    return;
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "server did not close the connection");
        assert!(
            self.buf.is_empty(),
            "3.1.1 bad input must get a bare close, got bytes {:?}",
            &self.buf[..]
        );
    }

    /// Asserts a v5 DISCONNECT with `reason` arrives, then the close;
    /// returns the DISCONNECT.
    pub async fn expect_disconnect5(&mut self, reason: p5::DisconnectReasonCode) -> p5::Disconnect {
        let d = match self.recv5().await {
            p5::Packet::Disconnect(d) => d,
            other => panic!("expected DISCONNECT {reason:?}, got {other:?}"),
        };
        assert_eq!(d.reason_code, reason, "{d:?}");
        let closed = tokio::time::timeout(WAIT, async {
            loop {
                if !self.fill().await {
                    return;
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "server did not close after DISCONNECT");
        assert!(
            self.buf.is_empty(),
            "bytes after DISCONNECT: {:?}",
            &self.buf[..]
        );
        d
    }

    /// Opens a socket and completes a 3.1.1 CONNECT.
    pub async fn connect4(
        addr: SocketAddr,
        id: &str,
        clean: bool,
        keep_alive_s: u16,
    ) -> (Raw, p4::ConnAck) {
        let mut connect = p4::Connect::new(id);
        connect.clean_session = clean;
        connect.keep_alive = keep_alive_s;
        Self::connect4_with(addr, connect).await
    }

    pub async fn connect4_with(addr: SocketAddr, connect: p4::Connect) -> (Raw, p4::ConnAck) {
        let mut raw = Raw::open(addr).await;
        raw.send4(p4::Packet::Connect(connect)).await;
        match raw.recv4().await {
            p4::Packet::ConnAck(ack) => (raw, ack),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    /// Opens a socket and completes a 5.0 CONNECT.
    pub async fn connect5(
        addr: SocketAddr,
        connect: p5::Connect,
        will: Option<p5::LastWill>,
    ) -> (Raw, p5::ConnAck) {
        let mut raw = Raw::open(addr).await;
        raw.send5(p5::Packet::Connect(connect, will, None)).await;
        match raw.recv5().await {
            p5::Packet::ConnAck(ack) => (raw, ack),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    /// [`Raw::connect5`] with a clean start, no will and `props` in the
    /// CONNECT; returns the CONNACK unchecked (it may be a refusal).
    pub async fn connect5_clean(
        addr: SocketAddr,
        id: &str,
        props: Option<p5::ConnectProperties>,
    ) -> (Raw, p5::ConnAck) {
        Raw::connect5(addr, connect5_packet(id, true, props), None).await
    }

    pub async fn shutdown(mut self) {
        let _ = self.stream.shutdown().await;
    }

    /// Writes `bytes` one at a time, `every` apart (a slow-loris peer),
    /// while reading what the server sends into the receive buffer, until
    /// the server closes the connection or every byte is written.
    pub async fn dribble(&mut self, bytes: &[u8], every: Duration) -> Dribbled {
        let start = tokio::time::Instant::now();
        let (mut rd, mut wr) = tokio::io::split(&mut self.stream);
        let mut chunk = [0u8; 4096];
        let mut written = 0;
        let mut next = start;
        let closed = |written| Dribbled {
            written,
            closed_after: Some(start.elapsed()),
        };
        loop {
            tokio::select! {
                read = rd.read(&mut chunk) => match read {
                    Ok(0) | Err(_) => return closed(written),
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                },
                () = tokio::time::sleep_until(next) => {
                    if written == bytes.len() {
                        return Dribbled { written, closed_after: None };
                    }
                    if wr.write_all(&bytes[written..=written]).await.is_err() {
                        return closed(written);
                    }
                    written += 1;
                    next += every;
                }
            }
        }
    }
}

/// How a [`Raw::dribble`] ended.
#[derive(Debug, Clone, Copy)]
pub struct Dribbled {
    /// Bytes written before the server closed (all of them if it did not).
    pub written: usize,
    /// When the server closed, from the first byte; `None` if it did not.
    pub closed_after: Option<Duration>,
}

/// A v5 CONNECT with the given id, clean start and properties.
pub fn connect5_packet(
    id: &str,
    clean_start: bool,
    props: Option<p5::ConnectProperties>,
) -> p5::Connect {
    p5::Connect {
        keep_alive: 10,
        client_id: id.to_owned(),
        clean_start,
        properties: props,
    }
}

/// Raw v5 SUBSCRIBE of one filter.
pub async fn raw_subscribe5(
    raw: &mut Raw,
    pkid: u16,
    filter: &str,
    qos: rumqttc::v5::mqttbytes::QoS,
) {
    let mut sub = p5::Subscribe::new(p5::Filter::new(filter, qos), None);
    sub.pkid = pkid;
    raw.send5(p5::Packet::Subscribe(sub)).await;
    match raw.recv5().await {
        p5::Packet::SubAck(a) => assert_eq!(a.pkid, pkid),
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

/// Raw v4 SUBSCRIBE of one filter; returns the granted code.
pub async fn raw_subscribe4(
    raw: &mut Raw,
    pkid: u16,
    filter: &str,
    qos: rumqttc::QoS,
) -> rumqttc::SubscribeReasonCode {
    let mut sub = p4::Subscribe::new(filter, qos);
    sub.pkid = pkid;
    raw.send4(p4::Packet::Subscribe(sub)).await;
    match raw.recv4().await {
        p4::Packet::SubAck(a) => {
            assert_eq!(a.pkid, pkid);
            a.return_codes[0]
        }
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

/// Access control from a users file written with `rosetta::users::add_user`
/// in `dir`: user `alice` / `secret` may do everything, `bob` / `pw` may
/// only publish and subscribe under `bob/#`.
pub fn users_access(
    dir: &std::path::Path,
    anonymous: bool,
) -> Arc<dyn rosetta::core::AccessControl> {
    let bob: &[&str] = &["/topic/bob/#"];
    super::users_file_access(
        dir,
        anonymous,
        &[
            super::Account::unrestricted("alice", b"secret"),
            super::Account::limited("bob", b"pw", bob, bob),
        ],
    )
}

/// Sleeps a short, bounded time (lets the broker finish asynchronous work
/// such as a binding being created before a publish from another client).
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}
