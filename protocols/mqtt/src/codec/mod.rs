//! The MQTT wire format: incremental decoding of client packets into
//! version-independent [`Inbound`] values, and encoding of server packets.
//!
//! Decoding is split so that each layer has one job:
//! - [`frame`]: fixed header, flag checks, size limit before buffering;
//! - [`connect`]: CONNECT for both versions (it chooses the version);
//! - [`v4`]: the other 3.1.1 packets, through `mqttbytes::v4`;
//! - [`v5`]: the other 5.0 packets, with our strict [`props`] parser;
//! - [`encode`]: server packets, through `mqttbytes::v4`/`v5` writers.
//!
//! Where mqttbytes 0.6 falls short we wrap or replace it; each module says
//! which gap it covers.

pub mod connect;
pub mod encode;
pub mod frame;
pub mod props;
mod reader;
pub mod v4;
pub mod v5;

use bytes::{Bytes, BytesMut};

pub use frame::{FixedHeader, PacketKind};
pub use props::Props;

/// Most topic filters accepted in one SUBSCRIBE or UNSUBSCRIBE. Each one
/// costs a bind call and a SUBACK byte; real clients send a handful.
pub const FILTERS_PER_PACKET_MAX: usize = 1024;

/// The protocol version negotiated by CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// MQTT 3.1.1 (protocol level 4).
    V311,
    /// MQTT 5.0 (protocol level 5).
    V5,
}

/// Why bytes from a client could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Not a well-formed packet (MQTT 5 reason 0x81).
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// Well-formed but forbidden by the protocol (0x82).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A string that is not valid UTF-8 or contains U+0000 (0x81).
    #[error("invalid UTF-8 string")]
    InvalidUtf8,
    /// Larger than the server's maximum packet size (0x95).
    #[error("packet of {size} bytes exceeds the maximum of {max}")]
    PacketTooLarge {
        /// Announced size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A count limit inside a packet (0x97).
    #[error("limit exceeded: {0}")]
    Limit(&'static str),
    /// CONNECT with a protocol level we do not speak (3.1.1 return code 1,
    /// MQTT 5 reason 0x84).
    #[error("unsupported protocol level {0}")]
    UnsupportedProtocolVersion(u8),
}

impl CodecError {
    /// The MQTT 5 reason code for this error.
    pub fn reason_code(&self) -> u8 {
        match self {
            CodecError::Malformed(_) | CodecError::InvalidUtf8 => 0x81,
            CodecError::Protocol(_) => 0x82,
            CodecError::PacketTooLarge { .. } => 0x95,
            CodecError::Limit(_) => 0x97,
            CodecError::UnsupportedProtocolVersion(_) => 0x84,
        }
    }
}

/// A v5 will (or v3.1.1 will with empty properties).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WillPacket {
    /// Will topic.
    pub topic: String,
    /// Will payload.
    pub payload: Bytes,
    /// Will QoS (0–2).
    pub qos: u8,
    /// Will retain flag.
    pub retain: bool,
    /// Will properties (v5).
    pub props: Props,
}

/// CONNECT, both versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectPacket {
    /// Negotiated version.
    pub version: Version,
    /// Client identifier (may be empty).
    pub client_id: String,
    /// Clean session (3.1.1) / clean start (5.0).
    pub clean_start: bool,
    /// Keep-alive in seconds; 0 disables it.
    pub keep_alive_s: u16,
    /// User name, if the flag was set.
    pub username: Option<String>,
    /// Password, if the flag was set; binary in MQTT.
    pub password: Option<Bytes>,
    /// The will.
    pub will: Option<WillPacket>,
    /// CONNECT properties (v5).
    pub props: Props,
}

/// PUBLISH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishPacket {
    /// DUP flag.
    pub dup: bool,
    /// QoS 0–2.
    pub qos: u8,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic name; empty when a v5 topic alias stands for it.
    pub topic: String,
    /// Packet id (0 for QoS 0).
    pub pkid: u16,
    /// Properties (v5); `None` when there were none (every 3.1.1
    /// PUBLISH). Boxed: `Props` is 272 bytes, and a packet is moved several
    /// times on its way from the decoder to the core (issue 20).
    pub props: Option<Box<Props>>,
    /// Payload (a slice of the read buffer, not a copy).
    pub payload: Bytes,
}

impl PublishPacket {
    /// The topic alias property, if any.
    pub fn topic_alias(&self) -> Option<u16> {
        self.props.as_ref().and_then(|p| p.topic_alias)
    }
}

/// PUBACK, PUBREC, PUBREL or PUBCOMP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckPacket {
    /// Packet id.
    pub pkid: u16,
    /// Reason code (0 for 3.1.1 or when absent).
    pub reason: u8,
}

/// One filter of a SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionRequest {
    /// The topic filter, possibly `$share/group/filter`.
    pub filter: String,
    /// Requested QoS.
    pub qos: u8,
    /// v5 no-local.
    pub no_local: bool,
    /// v5 retain-as-published.
    pub retain_as_published: bool,
    /// v5 retain handling 0–2.
    pub retain_handling: u8,
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribePacket {
    /// Packet id.
    pub pkid: u16,
    /// Filters, at least one.
    pub filters: Vec<SubscriptionRequest>,
    /// Properties (v5): subscription identifier, user properties.
    pub props: Props,
}

/// UNSUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubscribePacket {
    /// Packet id.
    pub pkid: u16,
    /// Filters, at least one.
    pub filters: Vec<String>,
}

/// DISCONNECT or AUTH: a reason and properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasonPacket {
    /// Reason code (0 when absent).
    pub reason: u8,
    /// Properties (v5).
    pub props: Props,
}

/// A decoded client packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// CONNECT.
    Connect(Box<ConnectPacket>),
    /// PUBLISH.
    Publish(PublishPacket),
    /// PUBACK.
    PubAck(AckPacket),
    /// PUBREC.
    PubRec(AckPacket),
    /// PUBREL.
    PubRel(AckPacket),
    /// PUBCOMP.
    PubComp(AckPacket),
    /// SUBSCRIBE. This and the other rare packets with properties are
    /// boxed, so that the enum stays as small as a PUBLISH (every PUBACK
    /// is one, too).
    Subscribe(Box<SubscribePacket>),
    /// UNSUBSCRIBE.
    Unsubscribe(UnsubscribePacket),
    /// PINGREQ.
    PingReq,
    /// DISCONNECT.
    Disconnect(Box<ReasonPacket>),
    /// AUTH (v5).
    Auth(Box<ReasonPacket>),
}

/// Incremental decoder: feed any split of the byte stream with
/// [`Decoder::extend`], take packets with [`Decoder::next_packet`].
///
/// The first packet must be CONNECT; its protocol level fixes the version
/// for the rest of the stream. Once an error is returned the stream is
/// unusable (the connection closes).
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    version: Option<Version>,
    /// MQTT's largest packet is 268,435,460 B: a `u32` holds any limit
    /// (8 B less per connection than a `usize`, issue 20).
    packet_size_max_bytes: u32,
}

impl Decoder {
    /// A decoder refusing packets larger than `packet_size_max_bytes`
    /// (fixed header included).
    pub fn new(packet_size_max_bytes: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            version: None,
            packet_size_max_bytes: u32::try_from(packet_size_max_bytes).unwrap_or(u32::MAX),
        }
    }

    /// The version, once a CONNECT's protocol level has been read (even if
    /// the rest of that CONNECT was bad, so the error can be answered in the
    /// right version).
    pub fn version(&self) -> Option<Version> {
        self.version
    }

    /// Appends received bytes.
    pub fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The buffer itself, for a caller that reads straight into it.
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Releases the read buffer when it is empty and larger than `keep`.
    pub fn shrink_if_idle(&mut self, keep: usize) {
        if self.buf.is_empty() && self.buf.capacity() > keep {
            self.buf = BytesMut::new();
        }
    }

    /// Bytes buffered but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete packet, `Ok(None)` if more bytes are needed.
    pub fn next_packet(&mut self) -> Result<Option<Inbound>, CodecError> {
        let Some(header) =
            frame::parse_fixed_header(&self.buf, self.packet_size_max_bytes as usize)?
        else {
            return Ok(None);
        };
        if self.buf.len() < header.frame_len() {
            // Reserve the whole frame once instead of growing per read.
            self.buf.reserve(header.frame_len() - self.buf.len());
            return Ok(None);
        }
        let frame = self.buf.split_to(header.frame_len());
        match self.version {
            None => {
                if header.kind != PacketKind::Connect {
                    return Err(CodecError::Protocol("first packet is not CONNECT"));
                }
                let body = frame.freeze().slice(header.header_len..);
                let connect = connect::parse_connect(body, &mut self.version)?;
                Ok(Some(Inbound::Connect(Box::new(connect))))
            }
            Some(_) if header.kind == PacketKind::Connect => {
                Err(CodecError::Protocol("second CONNECT"))
            }
            Some(Version::V5) => {
                let body = frame.freeze().slice(header.header_len..);
                v5::decode(header, body).map(Some)
            }
            Some(Version::V311) => v4::decode(header, frame).map(Some),
        }
    }
}
