//! A small AMQP 1.0 client for the load tool: one connection, one session,
//! one link, driven by the scenario's own loop.
//!
//! Why not fe2o3-amqp's client: it costs about 27 µs of CPU per message
//! here (a task and a channel hop per delivery, one disposition frame per
//! accepted message), so on 2 cores the tool, not the broker, bounded the
//! AMQP runs. This client batches instead: frames are appended to one
//! buffer and written once per loop turn, every complete frame in a read is
//! handled before the next read, and the receiver accepts a read's worth of
//! deliveries with one `disposition` per run of consecutive delivery ids,
//! as qpid-proton and rhea do.
//!
//! Layout: [`frame`] (framing), [`codec`] (bounds-checked values,
//! performatives via `fe2o3-amqp-types`, message sections), [`flow`]
//! (credit, windows, settlement; no IO), and here the [`Connection`]:
//! handshake (SASL, open, begin), attach, a write/read pump, close.

mod codec;
mod delivery;
mod flow;
mod frame;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::{Handle, ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{
    Accepted, DeliveryState, Source, Target as TargetTerminus, TerminusDurability,
};
use fe2o3_amqp_types::performatives::{
    Attach, Begin, ChannelMax, Close, Detach, Disposition, End, Flow, MaxFrameSize, Open,
    Performative, Transfer,
};
use fe2o3_amqp_types::sasl::{SaslCode, SaslInit, SaslMechanisms, SaslOutcome};
use serde_amqp::primitives::{Binary, Symbol};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;

pub(crate) use codec::{data_payload, encode_into, write_data_section, CodecError};
pub(crate) use delivery::Assembler;
pub(crate) use flow::{FlowError, Outstanding, Ranges, ReceiverCredit, SenderCredit};

use crate::run::Target;

/// Our max-frame-size: larger frames from the broker are refused.
pub(crate) const FRAME_SIZE_MAX: u32 = 64 * 1024;
/// Free space the read buffer gets before each read.
const READ_BUF_BYTES: usize = 64 * 1024;
/// A sender stops adding transfers to its write buffer past this and
/// writes: one write per loop turn, and never an unbounded buffer.
pub(crate) const WRITE_BATCH_BYTES: usize = 64 * 1024;
/// Largest message accepted from the broker (all its transfer frames).
pub(crate) const MESSAGE_SIZE_MAX: usize = 16 << 20;
/// Our session's incoming window in transfer frames. Each credit top-up's
/// flow restates it, so it only has to exceed the credit in flight.
const INCOMING_WINDOW: u32 = 1 << 16;
/// Our session's outgoing window (informational for the peer).
const OUTGOING_WINDOW: u32 = 1 << 16;
/// Largest credit a receiver grants: half the incoming window, so the
/// session window never binds before the link credit.
pub(crate) const CREDIT_MAX: u32 = INCOMING_WINDOW / 2;
/// How long each step of the handshake, and the close, may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// Room kept for the transfer performative when a message is split into
/// frames (handle, delivery id, a 4-byte tag, flags: under 40 bytes).
const TRANSFER_OVERHEAD_MAX: usize = 64;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("framing: {0}")]
    Frame(#[from] frame::FrameError),
    #[error("decoding: {0}")]
    Codec(#[from] CodecError),
    #[error("flow: {0}")]
    Flow(#[from] FlowError),
    #[error("encoding: {0}")]
    Encode(#[from] serde_amqp::Error),
    #[error("the broker broke the protocol: {0}")]
    Protocol(String),
    #[error("SASL: {0}")]
    Sasl(String),
    #[error("the broker ended the {what}: {error}")]
    Remote { what: &'static str, error: String },
    #[error("{0} exceeds its limit")]
    Limit(&'static str),
    #[error("connection closed by the broker")]
    Closed,
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
}

/// How the client authenticates.
#[derive(Debug, Clone)]
pub(crate) enum Sasl {
    /// No SASL layer: the AMQP protocol header straight away.
    None,
    Anonymous,
    Plain {
        user: String,
        password: String,
    },
}

/// What the broker said in its open and begin.
#[derive(Debug, Clone, Copy)]
struct Peer {
    max_frame: u32,
    /// Send an empty frame after this much silence (half the broker's
    /// idle-time-out), if it has one.
    heartbeat: Option<Duration>,
}

/// One AMQP connection with one session on channel 0.
#[derive(Debug)]
pub(crate) struct Connection {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    rbuf: BytesMut,
    /// Frames to write; `out[..written]` are written already.
    out: Vec<u8>,
    written: usize,
    last_write: Instant,
    peer: Peer,
    window: flow::SessionWindow,
    /// Transfer id of the next frame from the broker.
    next_incoming_id: u32,
}

/// An open connection kept only to be held (the idle scenarios): its
/// socket halves, without the read and write buffers a busy one keeps.
#[derive(Debug)]
pub(crate) struct Idle {
    _rd: OwnedReadHalf,
    _wr: OwnedWriteHalf,
}

fn err_text(e: Option<&fe2o3_amqp_types::definitions::Error>) -> String {
    e.map_or_else(|| "no error given".to_owned(), ToString::to_string)
}

impl Connection {
    /// Connects (TCP_NODELAY), authenticates, opens the connection and
    /// begins the session.
    pub(crate) async fn open(
        target: &Target,
        sasl: &Sasl,
        container_id: &str,
    ) -> Result<Self, ClientError> {
        let (rd, wr) = target.connect().await?.into_split();
        let mut c = Self {
            rd,
            wr,
            rbuf: BytesMut::with_capacity(READ_BUF_BYTES),
            out: Vec::with_capacity(WRITE_BATCH_BYTES * 2),
            written: 0,
            last_write: Instant::now(),
            peer: Peer {
                max_frame: frame::MIN_MAX_FRAME_SIZE,
                heartbeat: None,
            },
            window: flow::SessionWindow::new(0, 0),
            next_incoming_id: 0,
        };
        c.authenticate(sasl, &target.host).await?;
        c.out
            .extend_from_slice(&frame::protocol_header(frame::PROTOCOL_AMQP));
        c.flush().await?;
        let id = c.protocol_header().await?;
        if id != frame::PROTOCOL_AMQP {
            return Err(ClientError::Protocol(format!(
                "answered the AMQP header with protocol id {id}"
            )));
        }
        c.send(&Performative::Open(Open {
            container_id: container_id.to_owned(),
            hostname: Some(target.host.clone()),
            max_frame_size: MaxFrameSize(FRAME_SIZE_MAX),
            channel_max: ChannelMax(0),
            idle_time_out: None,
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }))?;
        let Performative::Open(open) = c.handshake_step("open").await? else {
            return Err(ClientError::Protocol("first performative not open".into()));
        };
        c.peer = Peer {
            max_frame: open.max_frame_size.0.max(frame::MIN_MAX_FRAME_SIZE),
            heartbeat: open
                .idle_time_out
                .filter(|&ms| ms > 0)
                .map(|ms| Duration::from_millis(u64::from(ms) / 2)),
        };
        c.send(&Performative::Begin(Begin {
            remote_channel: None,
            next_outgoing_id: 0,
            incoming_window: INCOMING_WINDOW,
            outgoing_window: OUTGOING_WINDOW,
            handle_max: Handle(0),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }))?;
        let Performative::Begin(begin) = c.handshake_step("begin").await? else {
            return Err(ClientError::Protocol("answered open with no begin".into()));
        };
        c.window = flow::SessionWindow::new(0, begin.incoming_window);
        c.next_incoming_id = begin.next_outgoing_id;
        Ok(c)
    }

    /// Keeps the socket, gives the buffers back.
    pub(crate) fn into_idle(self) -> Idle {
        Idle {
            _rd: self.rd,
            _wr: self.wr,
        }
    }

    async fn authenticate(&mut self, sasl: &Sasl, host: &str) -> Result<(), ClientError> {
        let (mechanism, response) = match sasl {
            Sasl::None => return Ok(()),
            Sasl::Anonymous => ("ANONYMOUS", None),
            Sasl::Plain { user, password } => {
                let mut r = Vec::with_capacity(user.len() + password.len() + 2);
                r.push(0);
                r.extend_from_slice(user.as_bytes());
                r.push(0);
                r.extend_from_slice(password.as_bytes());
                ("PLAIN", Some(Binary::from(r)))
            }
        };
        self.out
            .extend_from_slice(&frame::protocol_header(frame::PROTOCOL_SASL));
        self.flush().await?;
        let id = self.protocol_header().await?;
        if id != frame::PROTOCOL_SASL {
            return Err(ClientError::Sasl(format!(
                "the broker answered the SASL header with protocol id {id}"
            )));
        }
        let mechanisms: SaslMechanisms = self.sasl_frame("sasl-mechanisms", 0x40).await?;
        if !mechanisms
            .sasl_server_mechanisms
            .0
            .iter()
            .any(|m| m.0 == mechanism)
        {
            let offered: Vec<&str> = mechanisms
                .sasl_server_mechanisms
                .0
                .iter()
                .map(|m| m.0.as_str())
                .collect();
            return Err(ClientError::Sasl(format!(
                "{mechanism} not offered (offered: {offered:?})"
            )));
        }
        let start = frame::begin_frame(&mut self.out, frame::TYPE_SASL, 0);
        codec::encode_into(
            &mut self.out,
            &SaslInit {
                mechanism: Symbol::from(mechanism),
                initial_response: response,
                hostname: Some(host.to_owned()),
            },
        )?;
        frame::finish_frame(&mut self.out, start);
        self.flush().await?;
        let outcome: SaslOutcome = self.sasl_frame("sasl-outcome", 0x44).await?;
        if outcome.code != SaslCode::Ok {
            return Err(ClientError::Sasl(format!(
                "{mechanism} refused: {:?}",
                outcome.code
            )));
        }
        Ok(())
    }

    /// Reads the next SASL frame, which must have descriptor `code`.
    async fn sasl_frame<T>(&mut self, what: &'static str, code: u64) -> Result<T, ClientError>
    where
        T: for<'de> serde_amqp::serde::Deserialize<'de>,
    {
        let f = loop {
            if let Some(f) = frame::decode_frame(&mut self.rbuf, FRAME_SIZE_MAX)? {
                break f;
            }
            self.fill(what).await?;
        };
        if f.frame_type != frame::TYPE_SASL {
            return Err(ClientError::Sasl(format!(
                "expected {what}, got an AMQP frame"
            )));
        }
        match codec::descriptor_code(&f.body) {
            Some(c) if c == code => Ok(codec::decode(what, &f.body)?),
            other => Err(ClientError::Sasl(format!(
                "expected {what}, got descriptor {other:?} (challenges are not supported)"
            ))),
        }
    }

    async fn protocol_header(&mut self) -> Result<u8, ClientError> {
        loop {
            if let Some(id) = frame::decode_protocol_header(&mut self.rbuf)? {
                return Ok(id);
            }
            self.fill("protocol header").await?;
        }
    }

    /// One read, bounded by [`HANDSHAKE_TIMEOUT`] (for the handshake and
    /// close, where no supervisor watches).
    async fn fill(&mut self, what: &'static str) -> Result<(), ClientError> {
        self.rbuf.reserve(READ_BUF_BYTES);
        let n = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.rd.read_buf(&mut self.rbuf))
            .await
            .map_err(|_| ClientError::Timeout(what))??;
        if n == 0 {
            return Err(ClientError::Closed);
        }
        Ok(())
    }

    /// Writes what is buffered, then reads until the next performative.
    async fn handshake_step(&mut self, what: &'static str) -> Result<Performative, ClientError> {
        self.flush().await?;
        loop {
            if let Some((p, _)) = self.next_performative()? {
                return Ok(p);
            }
            self.fill(what).await?;
        }
    }

    /// Appends a performative frame (channel 0) to the write buffer.
    pub(crate) fn send(&mut self, p: &Performative) -> Result<(), ClientError> {
        let start = frame::begin_frame(&mut self.out, frame::TYPE_AMQP, 0);
        codec::encode_into(&mut self.out, p)?;
        frame::finish_frame(&mut self.out, start);
        Ok(())
    }

    /// Bytes waiting in the write buffer.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.out.len() - self.written
    }

    /// Transfer frames a message of `len` bytes takes at the broker's
    /// max-frame-size.
    pub(crate) fn frames_for(&self, len: usize) -> u32 {
        let chunk = self.chunk_bytes();
        u32::try_from(len.div_ceil(chunk).max(1)).unwrap_or(u32::MAX)
    }

    fn chunk_bytes(&self) -> usize {
        // max-frame-size is at least 512, so the chunk is at least 440.
        self.peer.max_frame as usize - frame::HEADER_LEN - TRANSFER_OVERHEAD_MAX
    }

    /// Transfer frames the broker's session takes now.
    pub(crate) fn session_window(&self) -> u32 {
        self.window.available()
    }

    /// Appends an unsettled delivery of `message` (encoded sections) on
    /// link `handle`, split into frames at the broker's max-frame-size.
    pub(crate) fn transfer(
        &mut self,
        handle: u32,
        delivery_id: u32,
        message: &[u8],
    ) -> Result<(), ClientError> {
        let chunk = self.chunk_bytes();
        let mut chunks = message.chunks(chunk).peekable();
        let mut first = true;
        // An empty message is still one frame.
        let empty: &[u8] = &[];
        let mut next = chunks.next().unwrap_or(empty);
        loop {
            let more = chunks.peek().is_some();
            let t = if first {
                Transfer {
                    handle: Handle(handle),
                    delivery_id: Some(delivery_id),
                    delivery_tag: Some(Binary::from(delivery_id.to_be_bytes().to_vec())),
                    message_format: Some(0),
                    settled: Some(false),
                    more,
                    rcv_settle_mode: None,
                    state: None,
                    resume: false,
                    aborted: false,
                    batchable: false,
                }
            } else {
                Transfer {
                    handle: Handle(handle),
                    delivery_id: None,
                    delivery_tag: None,
                    message_format: None,
                    settled: None,
                    more,
                    rcv_settle_mode: None,
                    state: None,
                    resume: false,
                    aborted: false,
                    batchable: false,
                }
            };
            let start = frame::begin_frame(&mut self.out, frame::TYPE_AMQP, 0);
            codec::encode_into(&mut self.out, &Performative::Transfer(t))?;
            self.out.extend_from_slice(next);
            frame::finish_frame(&mut self.out, start);
            self.window.sent();
            first = false;
            match chunks.next() {
                Some(c) => next = c,
                None => return Ok(()),
            }
        }
    }

    /// Appends a flow for receiving link `handle` granting `credit` from
    /// `delivery_count`, restating our session window.
    pub(crate) fn grant(
        &mut self,
        handle: u32,
        delivery_count: u32,
        credit: u32,
    ) -> Result<(), ClientError> {
        self.send(&Performative::Flow(Flow {
            next_incoming_id: Some(self.next_incoming_id),
            incoming_window: INCOMING_WINDOW,
            next_outgoing_id: self.window.next_outgoing_id(),
            outgoing_window: OUTGOING_WINDOW,
            handle: Some(Handle(handle)),
            delivery_count: Some(delivery_count),
            link_credit: Some(credit),
            available: None,
            drain: false,
            echo: false,
            properties: None,
        }))
    }

    /// Appends a settled `accepted` disposition for `first..=last`.
    pub(crate) fn accept(&mut self, first: u32, last: u32) -> Result<(), ClientError> {
        self.send(&Performative::Disposition(Disposition {
            role: Role::Receiver,
            first,
            last: (last != first).then_some(last),
            settled: true,
            state: Some(DeliveryState::Accepted(Accepted {})),
            batchable: false,
        }))
    }

    /// The next performative already read, and the bytes after it (a
    /// transfer's message). Heartbeats are skipped; the session's counts
    /// and windows are kept here. End and close from the broker are
    /// errors: a run never expects them.
    pub(crate) fn next_performative(
        &mut self,
    ) -> Result<Option<(Performative, Bytes)>, ClientError> {
        let Some((p, rest)) = self.next_performative_raw()? else {
            return Ok(None);
        };
        match &p {
            Performative::End(e) => Err(ClientError::Remote {
                what: "session",
                error: err_text(e.error.as_ref()),
            }),
            Performative::Close(c) => Err(ClientError::Remote {
                what: "connection",
                error: err_text(c.error.as_ref()),
            }),
            _ => Ok(Some((p, rest))),
        }
    }

    fn next_performative_raw(&mut self) -> Result<Option<(Performative, Bytes)>, ClientError> {
        loop {
            let Some(f) = frame::decode_frame(&mut self.rbuf, FRAME_SIZE_MAX)? else {
                return Ok(None);
            };
            if f.frame_type != frame::TYPE_AMQP {
                return Err(ClientError::Protocol("SASL frame after SASL".into()));
            }
            if f.body.is_empty() {
                continue;
            }
            let (p, rest) = codec::split_performative(&f.body)?;
            match &p {
                Performative::Transfer(_) => {
                    self.next_incoming_id = self.next_incoming_id.wrapping_add(1);
                }
                Performative::Flow(fl) => {
                    self.window.on_flow(fl.next_incoming_id, fl.incoming_window);
                }
                _ => {}
            }
            return Ok(Some((p, rest)));
        }
    }

    /// Sends `attach` and waits for the broker's attach. A
    /// refused link (the broker's attach without our terminus, then a
    /// detach) is an error naming the broker's reason.
    async fn attach(&mut self, attach: Attach) -> Result<Attach, ClientError> {
        let role = attach.role.clone();
        self.send(&Performative::Attach(attach))?;
        let reply = match self.handshake_step("attach").await? {
            Performative::Attach(a) => a,
            Performative::Detach(d) => {
                return Err(ClientError::Remote {
                    what: "link",
                    error: err_text(d.error.as_ref()),
                })
            }
            other => {
                return Err(ClientError::Protocol(format!(
                    "answered attach with {other:?}"
                )))
            }
        };
        let refused = match role {
            Role::Sender => reply.target.is_none(),
            Role::Receiver => reply.source.is_none(),
        };
        if refused {
            let error = match self.handshake_step("detach").await? {
                Performative::Detach(d) => err_text(d.error.as_ref()),
                other => format!("attach without terminus, then {other:?}"),
            };
            return Err(ClientError::Remote {
                what: "link",
                error,
            });
        }
        Ok(reply)
    }

    /// Attaches a sending link to `address`: unsettled deliveries, the
    /// broker settles first, on handle 0. Returns the broker's attach.
    pub(crate) async fn attach_sender(
        &mut self,
        name: &str,
        address: &str,
        durability: TerminusDurability,
    ) -> Result<Attach, ClientError> {
        self.attach(Attach {
            name: name.to_owned(),
            handle: Handle(0),
            role: Role::Sender,
            snd_settle_mode: SenderSettleMode::Unsettled,
            rcv_settle_mode: ReceiverSettleMode::First,
            source: Some(Box::new(Source::default())),
            target: Some(Box::new(
                TargetTerminus::builder()
                    .address(address.to_owned())
                    .durable(durability)
                    .build()
                    .into(),
            )),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: Some(0),
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        })
        .await
    }

    /// Attaches a receiving link from `address`, asking for unsettled
    /// deliveries that we settle first, on handle 0. Returns the broker's
    /// attach (its initial-delivery-count starts our count).
    pub(crate) async fn attach_receiver(
        &mut self,
        name: &str,
        address: &str,
        durability: TerminusDurability,
    ) -> Result<Attach, ClientError> {
        self.attach(Attach {
            name: name.to_owned(),
            handle: Handle(0),
            role: Role::Receiver,
            snd_settle_mode: SenderSettleMode::Unsettled,
            rcv_settle_mode: ReceiverSettleMode::First,
            source: Some(Box::new(
                Source::builder()
                    .address(address.to_owned())
                    .durable(durability)
                    .build(),
            )),
            target: Some(Box::new(TargetTerminus::default().into())),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: None,
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        })
        .await
    }

    /// Writes what is buffered and waits for input: returns once bytes were
    /// read, or once the write buffer is empty after writing. Writing comes
    /// first so a steady stream of input cannot starve our dispositions and
    /// flows. Sends a heartbeat when the broker has an idle timeout and we
    /// were silent. Cancel-safe: progress is recorded after each completed
    /// read or write.
    pub(crate) async fn pump(&mut self) -> Result<(), ClientError> {
        loop {
            if self.rbuf.capacity() - self.rbuf.len() < READ_BUF_BYTES / 4 {
                self.rbuf.reserve(READ_BUF_BYTES);
            }
            let pending = self.written < self.out.len();
            let beat = self.peer.heartbeat.map(|h| self.last_write + h);
            tokio::select! {
                biased;
                n = self.wr.write(&self.out[self.written..]), if pending => {
                    self.written += n?;
                    self.last_write = Instant::now();
                    if self.written == self.out.len() {
                        self.out.clear();
                        self.written = 0;
                        return Ok(());
                    }
                }
                n = self.rd.read_buf(&mut self.rbuf) => {
                    return match n? {
                        0 => Err(ClientError::Closed),
                        _ => Ok(()),
                    };
                }
                () = sleep_until(beat), if !pending => frame::write_empty_frame(&mut self.out),
            }
        }
    }

    /// Writes everything buffered.
    pub(crate) async fn flush(&mut self) -> Result<(), ClientError> {
        if self.written < self.out.len() {
            self.wr.write_all(&self.out[self.written..]).await?;
            self.last_write = Instant::now();
        }
        self.out.clear();
        self.written = 0;
        Ok(())
    }

    /// Detaches link `handle` (closing it), ends the session and closes the
    /// connection, then waits for the broker's close (bounded). Deliveries
    /// still arriving are dropped unsettled; the broker releases them.
    pub(crate) async fn close(mut self, handle: u32) -> Result<(), ClientError> {
        self.send(&Performative::Detach(Detach {
            handle: Handle(handle),
            closed: true,
            error: None,
        }))?;
        self.send(&Performative::End(End { error: None }))?;
        self.send(&Performative::Close(Close { error: None }))?;
        tokio::time::timeout(HANDSHAKE_TIMEOUT, self.flush())
            .await
            .map_err(|_| ClientError::Timeout("close to be written"))??;
        loop {
            while let Some((p, _)) = self.next_performative_raw()? {
                if let Performative::Close(c) = p {
                    return match c.error {
                        None => Ok(()),
                        Some(e) => Err(ClientError::Remote {
                            what: "connection",
                            error: e.to_string(),
                        }),
                    };
                }
            }
            match self.fill("close").await {
                Err(ClientError::Closed) => return Ok(()),
                other => other?,
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Whether a disposition from the broker settles its deliveries as
/// `accepted`; otherwise what it said instead. rejected, released,
/// modified, no outcome, or an outcome left unsettled (we asked the broker
/// to settle first) all mean the run lost or doubted a message.
pub(crate) fn check_outcome(d: &Disposition) -> Result<(), String> {
    match (&d.state, d.settled) {
        (Some(DeliveryState::Accepted(_)), true) => Ok(()),
        (Some(DeliveryState::Accepted(_)), false) => Err("accepted but not settled".into()),
        (None, settled) => Err(format!("no outcome (settled: {settled})")),
        (Some(other), _) => Err(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// Reads one frame from a raw socket (the fake broker's side).
    async fn read_frame(s: &mut tokio::net::TcpStream, buf: &mut BytesMut) -> frame::Frame {
        loop {
            if let Some(f) = frame::decode_frame(buf, FRAME_SIZE_MAX).expect("valid frame") {
                return f;
            }
            assert!(s.read_buf(buf).await.expect("read") > 0, "client hung up");
        }
    }

    fn perf_frame(p: &Performative) -> Vec<u8> {
        let mut out = Vec::new();
        let start = frame::begin_frame(&mut out, frame::TYPE_AMQP, 0);
        codec::encode_into(&mut out, p).expect("encodes");
        frame::finish_frame(&mut out, start);
        out
    }

    /// A fake broker with a 200 ms idle-time-out: the client, idle in
    /// `pump`, must send empty frames at least that often.
    #[tokio::test]
    async fn heartbeats_honour_the_brokers_idle_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let broker = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = BytesMut::new();
            while buf.len() < frame::HEADER_LEN {
                s.read_buf(&mut buf).await.expect("read");
            }
            assert_eq!(frame::decode_protocol_header(&mut buf), Ok(Some(0)));
            s.write_all(&frame::protocol_header(frame::PROTOCOL_AMQP))
                .await
                .expect("write");
            let open = read_frame(&mut s, &mut buf).await;
            let (p, _) = codec::split_performative(&open.body).expect("performative");
            assert!(matches!(p, Performative::Open(_)), "{p:?}");
            let reply = perf_frame(&Performative::Open(Open {
                container_id: "fake".into(),
                hostname: None,
                max_frame_size: MaxFrameSize(4096),
                channel_max: ChannelMax(0),
                idle_time_out: Some(200),
                outgoing_locales: None,
                incoming_locales: None,
                offered_capabilities: None,
                desired_capabilities: None,
                properties: None,
            }));
            s.write_all(&reply).await.expect("write");
            let begin = read_frame(&mut s, &mut buf).await;
            let (p, _) = codec::split_performative(&begin.body).expect("performative");
            assert!(matches!(p, Performative::Begin(_)), "{p:?}");
            let reply = perf_frame(&Performative::Begin(Begin {
                remote_channel: Some(0),
                next_outgoing_id: 0,
                incoming_window: 10,
                outgoing_window: 10,
                handle_max: Handle(0),
                offered_capabilities: None,
                desired_capabilities: None,
                properties: None,
            }));
            s.write_all(&reply).await.expect("write");
            // Count heartbeats for one second.
            let mut beats = 0;
            let end = Instant::now() + Duration::from_secs(1);
            while let Ok(f) = tokio::time::timeout_at(end, read_frame(&mut s, &mut buf)).await {
                assert!(f.body.is_empty(), "only heartbeats expected");
                beats += 1;
            }
            beats
        });
        let target = Target {
            host: "127.0.0.1".into(),
            port,
            name: "fake".into(),
            proc: None,
            stall: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
            duration: None,
        };
        let mut c = Connection::open(&target, &Sasl::None, "test")
            .await
            .expect("handshake");
        assert_eq!(c.peer.max_frame, 4096);
        assert_eq!(c.session_window(), 10);
        // The fake broker sends nothing more: pump only writes heartbeats,
        // until the broker hangs up after its second.
        let pumped = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                if let Err(e) = c.pump().await {
                    return e;
                }
            }
        })
        .await;
        assert!(matches!(pumped, Ok(ClientError::Closed)), "{pumped:?}");
        let beats = broker.await.expect("fake broker");
        // One every 100 ms (half the timeout) for a second; allow for a
        // slow machine, but silence would be 0.
        assert!((5..=11).contains(&beats), "{beats} heartbeats in 1 s");
    }

    #[test]
    fn outcomes_other_than_settled_accepted_fail_the_run() {
        use fe2o3_amqp_types::messaging::{Modified, Rejected, Released};
        let d = |state, settled| Disposition {
            role: Role::Receiver,
            first: 0,
            last: None,
            settled,
            state,
            batchable: false,
        };
        assert!(check_outcome(&d(Some(DeliveryState::Accepted(Accepted {})), true)).is_ok());
        for (state, settled) in [
            (Some(DeliveryState::Accepted(Accepted {})), false),
            (None, true),
            (Some(DeliveryState::Released(Released {})), true),
            (
                Some(DeliveryState::Rejected(Rejected { error: None })),
                true,
            ),
            (
                Some(DeliveryState::Modified(Modified {
                    delivery_failed: Some(true),
                    undeliverable_here: None,
                    message_annotations: None,
                })),
                true,
            ),
        ] {
            assert!(
                check_outcome(&d(state.clone(), settled)).is_err(),
                "{state:?}"
            );
        }
    }
}
