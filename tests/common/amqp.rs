//! AMQP 1.0 helpers: fe2o3-amqp connections against a [`TestBroker`], a
//! broker with a users file, and a raw socket client that writes crafted
//! frames where a well-behaved client cannot.

use std::net::SocketAddr;
use std::time::Duration;

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::delivery::{Delivery, Sendable};
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::{
    AmqpValue, Body, FromBody, Header, Message, SerializableBody, Source, TerminusDurability,
    TerminusExpiryPolicy,
};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Account, TestBroker};

/// Longest a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(5);
/// How long a test watches for something that should not happen.
pub const QUIET: Duration = Duration::from_millis(400);

pub fn url(broker: &TestBroker) -> String {
    format!("amqp://{}", broker.amqp())
}

/// A connection with SASL skipped (anonymous access must be on).
pub async fn connect(broker: &TestBroker, container: &str) -> ConnectionHandle<()> {
    Connection::builder()
        .container_id(container)
        .open(url(broker).as_str())
        .await
        .expect("open connection")
}

/// A connection and one session on it.
pub async fn connect_session(
    broker: &TestBroker,
    container: &str,
) -> (ConnectionHandle<()>, SessionHandle<()>) {
    let mut conn = connect(broker, container).await;
    let session = Session::begin(&mut conn).await.expect("begin session");
    (conn, session)
}

/// A delivery whose body may be any section (value, data, sequence).
pub type AnyDelivery = Delivery<Body<Value>>;

/// Attaches a sender link `name` to `address` with the default settings;
/// panics with fe2o3's attach error if the broker refuses or detaches it.
pub async fn sender(session: &mut SessionHandle<()>, name: &str, address: &str) -> Sender {
    Sender::attach(session, name, address)
        .await
        .unwrap_or_else(|e| panic!("attach sender {name} to {address}: {e:?}"))
}

/// Attaches a receiver link `name` from `address` with the default settings
/// (auto credit); panics with fe2o3's attach error if the broker refuses.
pub async fn receiver(session: &mut SessionHandle<()>, name: &str, address: &str) -> Receiver {
    Receiver::attach(session, name, address)
        .await
        .unwrap_or_else(|e| panic!("attach receiver {name} from {address}: {e:?}"))
}

/// Attaches a receiver link `name` from `source` in manual credit mode: it
/// grants no credit until the test calls `set_credit`, so nothing is
/// delivered before then. Panics with fe2o3's attach error if refused.
pub async fn manual_receiver(
    session: &mut SessionHandle<()>,
    name: &str,
    source: impl Into<Source>,
) -> Receiver {
    Receiver::builder()
        .name(name)
        .source(source)
        .credit_mode(CreditMode::Manual)
        .attach(session)
        .await
        .unwrap_or_else(|e| panic!("attach manual-credit receiver {name}: {e:?}"))
}

/// A message with `header.durable` set and `text` as its amqp-value body.
pub fn durable(text: &str) -> Message<AmqpValue<String>> {
    Message::builder()
        .header(Header {
            durable: true,
            ..Default::default()
        })
        .value(text.to_owned())
        .build()
}

/// A source for a durable subscription: terminus durability
/// `unsettled-state`, expiry `never` (what a client sends to have its
/// subscription kept across detach, disconnect and restart).
pub fn durable_source(address: &str) -> Source {
    Source::builder()
        .address(address)
        .durable(TerminusDurability::UnsettledState)
        .expiry_policy(TerminusExpiryPolicy::Never)
        .build()
}

/// Sends `message` and waits for the broker's outcome; panics unless the
/// send completed and the outcome is `accepted` (then the broker has taken
/// the message, durably if it was durable).
pub async fn send_accepted<T: SerializableBody>(s: &mut Sender, message: impl Into<Sendable<T>>) {
    s.send(message)
        .await
        .expect("send")
        .accepted_or_else(|o| o)
        .expect("accepted");
}

/// Connects as `container`, sends each of `texts` as a [`durable`] message
/// to `address` (each accepted), then closes the connection.
pub async fn publish_durable<S: AsRef<str>>(
    broker: &TestBroker,
    container: &str,
    address: &str,
    texts: &[S],
) {
    let (mut conn, mut session) = connect_session(broker, container).await;
    let mut s = sender(&mut session, "publisher", address).await;
    for text in texts {
        send_accepted(&mut s, durable(text.as_ref())).await;
    }
    conn.close().await.expect("close");
}

/// The next delivery on `r`, not settled; panics if none comes within
/// [`WAIT`] or the link fails.
pub async fn recv<T>(r: &mut Receiver) -> Delivery<T>
where
    for<'de> T: FromBody<'de> + Send,
{
    tokio::time::timeout(WAIT, r.recv())
        .await
        .expect("delivery in time")
        .expect("recv")
}

/// The next `n` deliveries on `r`, in order and not settled; panics as
/// [`recv`] if one does not come.
pub async fn recv_n<T>(r: &mut Receiver, n: usize) -> Vec<Delivery<T>>
where
    for<'de> T: FromBody<'de> + Send,
{
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        got.push(recv(r).await);
    }
    got
}

/// [`recv`] for a delivery whose body may be any section.
pub async fn recv_any(r: &mut Receiver) -> AnyDelivery {
    recv(r).await
}

/// The next delivery's string body, after accepting it; panics as [`recv`].
pub async fn recv_text(r: &mut Receiver) -> String {
    let d: Delivery<String> = recv(r).await;
    r.accept(&d).await.expect("accept");
    d.body().clone()
}

/// Panics if a delivery arrives on `r` within [`QUIET`].
pub async fn recv_nothing(r: &mut Receiver) {
    let got = tokio::time::timeout(QUIET, r.recv::<Body<Value>>()).await;
    assert!(got.is_err(), "unexpected delivery");
}

/// The string in an amqp-value body; panics on any other body.
pub fn text_of(d: &AnyDelivery) -> String {
    match d.body() {
        Body::Value(v) => match &v.0 {
            Value::String(s) => s.clone(),
            other => panic!("not a string value: {other:?}"),
        },
        other => panic!("not an amqp-value: {other:?}"),
    }
}

/// A broker with a users file: `alice`/`s3cret` may do anything, `bob`/
/// `hunter2` may only publish and subscribe to `/queue/bob`.
pub async fn users_broker(anonymous: bool) -> TestBroker {
    let only_bob: &[&str] = &["/queue/bob"];
    TestBroker::with_users(
        anonymous,
        &[
            Account::unrestricted("alice", b"s3cret"),
            Account::limited("bob", b"hunter2", only_bob, only_bob),
        ],
    )
    .await
}

// ---------------------------------------------------------------- raw client

/// Performative descriptor codes (spec 2.7).
pub const OPEN: u8 = 0x10;
pub const BEGIN: u8 = 0x11;
pub const ATTACH: u8 = 0x12;
pub const FLOW: u8 = 0x13;
pub const TRANSFER: u8 = 0x14;
pub const DISPOSITION: u8 = 0x15;
pub const DETACH: u8 = 0x16;
pub const END: u8 = 0x17;
pub const CLOSE: u8 = 0x18;
pub const SASL_MECHANISMS: u8 = 0x40;
pub const SASL_OUTCOME: u8 = 0x44;

/// The AMQP (0) or SASL (3) protocol header.
pub fn protocol_header(id: u8) -> [u8; 8] {
    [b'A', b'M', b'Q', b'P', id, 1, 0, 0]
}

/// One frame: 8-byte header (doff 2) then `body`.
pub fn frame(frame_type: u8, channel: u16, body: &[u8]) -> Vec<u8> {
    let size = u32::try_from(8 + body.len()).expect("frame size");
    let mut out = size.to_be_bytes().to_vec();
    out.extend_from_slice(&[2, frame_type]);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// An empty (heartbeat) frame.
pub fn empty_frame() -> Vec<u8> {
    frame(0, 0, &[])
}

/// Encoders for the few AMQP values the crafted frames need.
pub mod enc {
    pub fn str8(s: &str) -> Vec<u8> {
        let mut v = vec![0xa1, u8::try_from(s.len()).expect("short string")];
        v.extend_from_slice(s.as_bytes());
        v
    }
    pub fn sym8(s: &str) -> Vec<u8> {
        let mut v = vec![0xa3, u8::try_from(s.len()).expect("short symbol")];
        v.extend_from_slice(s.as_bytes());
        v
    }
    pub fn uint(n: u32) -> Vec<u8> {
        let mut v = vec![0x70];
        v.extend_from_slice(&n.to_be_bytes());
        v
    }
    pub fn ushort(n: u16) -> Vec<u8> {
        let mut v = vec![0x60];
        v.extend_from_slice(&n.to_be_bytes());
        v
    }
    pub fn boolean(b: bool) -> Vec<u8> {
        vec![if b { 0x41 } else { 0x42 }]
    }
    pub fn ubyte(n: u8) -> Vec<u8> {
        vec![0x50, n]
    }
    pub fn null() -> Vec<u8> {
        vec![0x40]
    }
    /// A described list (list32) with descriptor `code`.
    pub fn described(code: u8, fields: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = fields.concat();
        let mut v = vec![0x00, 0x53, code, 0xd0];
        let size = u32::try_from(body.len() + 4).expect("list size");
        v.extend_from_slice(&size.to_be_bytes());
        v.extend_from_slice(&u32::try_from(fields.len()).expect("count").to_be_bytes());
        v.extend_from_slice(&body);
        v
    }
    pub fn binary(b: &[u8]) -> Vec<u8> {
        let mut v = vec![0xb0];
        v.extend_from_slice(&u32::try_from(b.len()).expect("binary").to_be_bytes());
        v.extend_from_slice(b);
        v
    }
}

/// Open: container-id, hostname, max-frame-size, channel-max, idle-time-out.
pub fn open_body(container: &str, max_frame: u32, idle_ms: Option<u32>) -> Vec<u8> {
    enc::described(
        OPEN,
        &[
            enc::str8(container),
            enc::null(),
            enc::uint(max_frame),
            enc::ushort(255),
            idle_ms.map_or_else(enc::null, enc::uint),
        ],
    )
}

/// Begin: remote-channel null, next-outgoing-id 0, windows 1000.
pub fn begin_body() -> Vec<u8> {
    enc::described(
        BEGIN,
        &[enc::null(), enc::uint(0), enc::uint(1000), enc::uint(1000)],
    )
}

/// Attach of a sender (role false) named `name` on `handle` to `address`.
pub fn attach_sender_body(name: &str, handle: u32, address: &str) -> Vec<u8> {
    let source = enc::described(0x28, &[]);
    let target = enc::described(0x29, &[enc::str8(address)]);
    enc::described(
        ATTACH,
        &[
            enc::str8(name),
            enc::uint(handle),
            enc::boolean(false),
            enc::ubyte(0), // snd-settle-mode unsettled
            enc::ubyte(0),
            source,
            target,
            enc::null(),
            enc::null(),
            enc::uint(0), // initial-delivery-count
        ],
    )
}

/// Transfer on `handle`: delivery-id, tag, format 0, settled, more.
pub fn transfer_body(handle: u32, delivery_id: u32, more: bool) -> Vec<u8> {
    enc::described(
        TRANSFER,
        &[
            enc::uint(handle),
            enc::uint(delivery_id),
            enc::binary(&delivery_id.to_be_bytes()),
            enc::uint(0),
            enc::boolean(false),
            enc::boolean(more),
        ],
    )
}

/// An amqp-value string body section.
pub fn value_section(text: &str) -> Vec<u8> {
    let mut v = vec![0x00, 0x53, 0x77, 0xb1];
    v.extend_from_slice(&u32::try_from(text.len()).expect("len").to_be_bytes());
    v.extend_from_slice(text.as_bytes());
    v
}

/// A received frame.
#[derive(Debug)]
pub struct RawFrame {
    pub frame_type: u8,
    pub channel: u16,
    pub body: Vec<u8>,
}

impl RawFrame {
    /// The performative's descriptor code (`None` for an empty frame).
    pub fn code(&self) -> Option<u8> {
        match self.body.get(..3) {
            Some([0x00, 0x53, code]) => Some(*code),
            _ => None,
        }
    }
    /// Whether the body mentions `text` (e.g. an error condition symbol).
    pub fn mentions(&self, text: &str) -> bool {
        self.body.windows(text.len()).any(|w| w == text.as_bytes())
    }
}

/// The code of a sasl-outcome (its first field, a ubyte).
pub fn sasl_code(f: &RawFrame) -> Option<u8> {
    let first = match f.body.get(3)? {
        0xc0 => 6,  // list8: size, count
        0xd0 => 12, // list32
        _ => return None,
    };
    match f.body.get(first..first + 2)? {
        [0x50, code] => Some(*code),
        _ => None,
    }
}

/// Why reading a frame stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum RawEnd {
    Eof,
    Timeout,
}

/// A raw AMQP client over TCP.
pub struct RawAmqp {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl RawAmqp {
    pub async fn connect(addr: SocketAddr) -> RawAmqp {
        let stream = TcpStream::connect(addr).await.expect("tcp connect");
        stream.set_nodelay(true).expect("nodelay");
        RawAmqp {
            stream,
            buf: Vec::new(),
        }
    }

    /// Writes `bytes`; false if the peer already closed.
    pub async fn write(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok()
    }

    async fn fill(&mut self, n: usize, wait: Duration) -> Result<(), RawEnd> {
        let deadline = tokio::time::Instant::now() + wait;
        while self.buf.len() < n {
            // Into the heap buffer: a big array here would sit in every
            // future that awaits this one.
            self.buf.reserve(16 * 1024);
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Err(_) => return Err(RawEnd::Timeout),
                Ok(Ok(0)) | Ok(Err(_)) => return Err(RawEnd::Eof),
                Ok(Ok(_)) => {}
            }
        }
        Ok(())
    }

    /// Reads the 8-byte protocol header.
    pub async fn read_header(&mut self) -> Result<[u8; 8], RawEnd> {
        self.fill(8, WAIT).await?;
        let mut h = [0u8; 8];
        h.copy_from_slice(&self.buf[..8]);
        self.buf.drain(..8);
        Ok(h)
    }

    /// Reads one frame within `wait`.
    pub async fn read_frame_within(&mut self, wait: Duration) -> Result<RawFrame, RawEnd> {
        self.fill(8, wait).await?;
        let size = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        let size = usize::try_from(size).expect("size");
        assert!(size >= 8, "broker sent a frame of size {size}");
        self.fill(size, wait).await?;
        let doff = usize::from(self.buf[4]) * 4;
        let frame = RawFrame {
            frame_type: self.buf[5],
            channel: u16::from_be_bytes([self.buf[6], self.buf[7]]),
            body: self.buf[doff..size].to_vec(),
        };
        self.buf.drain(..size);
        Ok(frame)
    }

    pub async fn read_frame(&mut self) -> Result<RawFrame, RawEnd> {
        self.read_frame_within(WAIT).await
    }

    /// Reads frames until one with performative `code`, skipping heartbeats and others.
    pub async fn expect(&mut self, code: u8) -> RawFrame {
        loop {
            let f = self
                .read_frame()
                .await
                .unwrap_or_else(|e| panic!("waiting for performative {code:#x}: {e:?}"));
            if f.code() == Some(code) {
                return f;
            }
        }
    }

    /// AMQP header (no SASL) then Open; returns the broker's Open.
    pub async fn open(&mut self, max_frame: u32, idle_ms: Option<u32>) -> RawFrame {
        assert!(self.write(&protocol_header(0)).await);
        assert_eq!(self.read_header().await, Ok(protocol_header(0)));
        assert!(
            self.write(&frame(0, 0, &open_body("raw", max_frame, idle_ms)))
                .await
        );
        self.expect(OPEN).await
    }

    /// Open and Begin on channel 0.
    pub async fn open_and_begin(&mut self) {
        self.open(65536, None).await;
        assert!(self.write(&frame(0, 0, &begin_body())).await);
        self.expect(BEGIN).await;
    }

    /// Reads until a Close, asserts it carries `condition`, answers it with
    /// our Close (the broker waits for it), then expects EOF.
    pub async fn expect_close_with(&mut self, condition: &str) -> RawFrame {
        let close = self.expect(CLOSE).await;
        assert!(
            close.mentions(condition),
            "close without {condition}: {:?}",
            String::from_utf8_lossy(&close.body)
        );
        let _ = self.write(&frame(0, 0, &enc::described(CLOSE, &[]))).await;
        self.expect_eof().await;
        close
    }

    /// The broker closes the socket (frames before that are skipped).
    pub async fn expect_eof(&mut self) {
        loop {
            match self.read_frame().await {
                Ok(_) => continue,
                Err(RawEnd::Eof) => return,
                Err(RawEnd::Timeout) => panic!("socket not closed"),
            }
        }
    }
}
