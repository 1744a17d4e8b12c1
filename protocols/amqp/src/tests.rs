//! State-machine tests: a fake in-memory core and a scripted client, driven
//! with a virtual clock and no sockets.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fe2o3_amqp_types::definitions::{
    Error as WireError, ErrorCondition, Handle, ReceiverSettleMode, Role, SenderSettleMode,
};
use fe2o3_amqp_types::messaging::{
    Accepted, AmqpValue, Data, DeliveryState, Modified, Properties as AmqpProperties, Rejected,
    Released, Source, Target, TargetArchetype, TerminusDurability,
};
use fe2o3_amqp_types::performatives::{
    Attach, Begin, ChannelMax, Close, Detach, Disposition, End, Flow, MaxFrameSize, Open,
    Performative, Transfer,
};
use fe2o3_amqp_types::primitives::{Array, Binary, Symbol};
use fe2o3_amqp_types::sasl::{SaslChallenge, SaslCode, SaslInit, SaslOutcome, SaslResponse};
use fe2o3_amqp_types::transaction::{
    Coordinator, Declare, Declared, Discharge, TransactionalState,
};
use rosetta_neutral::*;
use serde::Serialize;

use crate::codec;
use crate::config::AmqpConfig;
use crate::connection::AmqpConnection;
use crate::descriptor;
use crate::frame::{self, FRAME_TYPE_SASL, PROTOCOL_ID_AMQP, PROTOCOL_ID_SASL};
use crate::frame::{write_frame, write_perf};
use crate::sasl::tests::{scram_client_final, scram_creds};

mod descriptor_forms;
mod queue_semantics;

// ---------------------------------------------------------------- fake core

#[derive(Default)]
struct Log {
    sessions: Vec<SessionInfo>,
    published: Vec<(Address, Message, PublishOptions)>,
    declared: Vec<QueueSpec>,
    bound: Vec<(String, String)>,
    consumers: Vec<ConsumerSpec>,
    credits: Vec<(ConsumerId, u32, bool)>,
    settled: Vec<(ConsumerId, DeliveryTag, Outcome, Option<TxnId>)>,
    cancelled: Vec<ConsumerId>,
    /// How many settlements the core had seen at each cancel.
    settled_at_cancel: Vec<usize>,
    deleted: Vec<String>,
    commits: Vec<TxnId>,
    rollbacks: Vec<TxnId>,
    closed: Option<CloseKind>,
    blocked: bool,
    next: u64,
    publish_error: Option<BrokerError>,
    /// How logins are answered (deferred, refused, or by the fake).
    logins: login::ScriptedLogins,
    bind_error: Option<BrokerError>,
}

impl Log {
    fn next(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

struct FakeBroker {
    log: Arc<Mutex<Log>>,
    anonymous: bool,
}

const PASSWORD: &str = "secret";
const SCRAM_ITERATIONS: u32 = 64;

impl Broker for FakeBroker {
    fn authenticate(&self, user: Option<&str>, pw: Option<&[u8]>) -> Result<Principal, AuthError> {
        match (user, pw) {
            (None, _) if self.anonymous => Ok(Principal::anonymous()),
            (None, _) => Err(AuthError::AnonymousDisabled),
            (Some("alice"), Some(p)) if p == PASSWORD.as_bytes() => Ok(Principal {
                user: Some("alice".into()),
            }),
            _ => Err(AuthError::BadCredentials),
        }
    }
    fn scram_credentials(&self, user: &str) -> Option<ScramCredentials> {
        (user == "alice").then(|| scram_creds(PASSWORD, b"pepper", SCRAM_ITERATIONS))
    }
    fn anonymous_allowed(&self) -> bool {
        self.anonymous
    }
    fn authenticate_certificate(&self, _: &str) -> Result<Principal, AuthError> {
        Err(AuthError::BadCredentials)
    }
    fn start_login(&self, credentials: Credentials<'_>, sink: &Arc<dyn EventSink>) -> LoginStart {
        let scripted = self.log.lock().unwrap().logins.start(&credentials, sink);
        scripted.unwrap_or_else(|| login::answer_now(self, &credentials))
    }
    fn open_session(&self, info: SessionInfo, _sink: Arc<dyn EventSink>) -> Box<dyn Session> {
        self.log.lock().unwrap().sessions.push(info);
        Box::new(FakeSession {
            log: self.log.clone(),
        })
    }
}

struct FakeSession {
    log: Arc<Mutex<Log>>,
}

impl Session for FakeSession {
    fn declare_queue(&mut self, spec: QueueSpec) -> Result<QueueInfo, BrokerError> {
        let mut log = self.log.lock().unwrap();
        let name = match &spec.name {
            Some(n) => n.clone(),
            None => format!("$temp/{}", log.next()),
        };
        log.declared.push(spec);
        Ok(QueueInfo {
            name,
            existed: false,
            depth: 0,
        })
    }
    fn delete_queue(&mut self, name: &str) -> Result<(), BrokerError> {
        self.log.lock().unwrap().deleted.push(name.into());
        Ok(())
    }
    fn bind(&mut self, q: &str, f: &str, _: BindingOptions) -> Result<BindInfo, BrokerError> {
        let mut log = self.log.lock().unwrap();
        if let Some(e) = log.bind_error.clone() {
            return Err(e);
        }
        log.bound.push((q.into(), f.into()));
        Ok(BindInfo {
            existed: false,
            retained_sent: 0,
        })
    }
    fn unbind(&mut self, _: &str, _: &str) -> Result<bool, BrokerError> {
        Ok(true)
    }
    fn publish(
        &mut self,
        address: &Address,
        message: Message,
        options: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError> {
        let mut log = self.log.lock().unwrap();
        if let Some(e) = log.publish_error.clone() {
            return Err(e);
        }
        let pending = options.confirm.then(|| Ticket(log.next()));
        log.published.push((address.clone(), message, options));
        Ok(PublishReceipt { routed: 1, pending })
    }
    fn consume(&mut self, spec: ConsumerSpec) -> Result<ConsumerId, BrokerError> {
        let mut log = self.log.lock().unwrap();
        if spec.queue == "missing" {
            return Err(BrokerError::NotFound("missing".into()));
        }
        if let Some(sel) = spec
            .options
            .selector
            .as_deref()
            .filter(|s| s.contains("(("))
        {
            // Stands in for the core's parser refusing a selector.
            return Err(BrokerError::InvalidSelector(format!(
                "unbalanced parenthesis in {sel:?}"
            )));
        }
        log.consumers.push(spec);
        Ok(ConsumerId(log.consumers.len() as u64))
    }
    fn cancel(&mut self, c: ConsumerId) -> Result<(), BrokerError> {
        let mut log = self.log.lock().unwrap();
        log.cancelled.push(c);
        let seen = log.settled.len();
        log.settled_at_cancel.push(seen);
        Ok(())
    }
    fn set_credit(&mut self, c: ConsumerId, credit: u32, drain: bool) -> Result<(), BrokerError> {
        self.log.lock().unwrap().credits.push((c, credit, drain));
        Ok(())
    }
    fn settle(
        &mut self,
        c: ConsumerId,
        tag: DeliveryTag,
        outcome: Outcome,
        txn: Option<TxnId>,
        _confirm: bool,
    ) -> Result<Option<Ticket>, BrokerError> {
        self.log
            .lock()
            .unwrap()
            .settled
            .push((c, tag, outcome, txn));
        Ok(None)
    }
    fn annotate(&mut self, _: ConsumerId, _: DeliveryTag, _: Bytes) -> Result<(), BrokerError> {
        Ok(())
    }
    fn begin(&mut self) -> TxnId {
        TxnId(self.log.lock().unwrap().next())
    }
    fn commit(&mut self, txn: TxnId) -> Result<Ticket, BrokerError> {
        let mut log = self.log.lock().unwrap();
        log.commits.push(txn);
        Ok(Ticket(log.next()))
    }
    fn rollback(&mut self, txn: TxnId) -> Result<(), BrokerError> {
        self.log.lock().unwrap().rollbacks.push(txn);
        Ok(())
    }
    fn get_state(&mut self, _: &str) -> Option<Bytes> {
        None
    }
    fn put_state(&mut self, _: &str, _: Option<Bytes>) -> Result<Option<Ticket>, BrokerError> {
        Ok(None)
    }
    fn set_will(&mut self, _: Option<Will>) -> Result<(), BrokerError> {
        Ok(())
    }
    fn producer_blocked(&self) -> bool {
        self.log.lock().unwrap().blocked
    }
    fn resume_deliveries(&mut self) {}

    fn close(&mut self, kind: CloseKind) {
        self.log.lock().unwrap().closed = Some(kind);
    }
}

struct NullSink;
impl EventSink for NullSink {
    fn send(&self, _: SessionEvent) {}
}

// ---------------------------------------------------------------- client

#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // test-only, short-lived values
enum Out {
    Header(u8),
    Sasl(Bytes),
    Perf(u16, Performative, Bytes),
    Empty,
}

struct Peer {
    conn: AmqpConnection,
    now: Instant,
    log: Arc<Mutex<Log>>,
    rx: Vec<u8>,
    /// Write every descriptor as a symbol (see [`with_symbolic_descriptors`]).
    symbolic: bool,
}

thread_local! {
    /// Set while a scenario runs under [`with_symbolic_descriptors`]: the
    /// peers it creates write symbolic descriptors.
    static SYMBOLIC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `scenario` with every frame its test client sends (SASL frames,
/// performatives, the message sections of transfers) re-encoded with
/// symbolic descriptors (`amqp:open:list` for `0x10`), as
/// python-qpid-proton writes some of them. The scenario's assertions must
/// hold unchanged.
fn with_symbolic_descriptors(scenario: fn()) {
    SYMBOLIC.with(|s| s.set(true));
    let result = std::panic::catch_unwind(scenario);
    SYMBOLIC.with(|s| s.set(false));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

impl Peer {
    fn with(anonymous: bool, cfg: AmqpConfig) -> Self {
        let log = Arc::new(Mutex::new(Log::default()));
        let broker = Arc::new(FakeBroker {
            log: log.clone(),
            anonymous,
        });
        let now = Instant::now();
        Self {
            conn: AmqpConnection::new(cfg, broker, Arc::new(NullSink), 7, now),
            now,
            log,
            rx: Vec::new(),
            symbolic: SYMBOLIC.with(|s| s.get()),
        }
    }

    fn new(anonymous: bool) -> Self {
        Self::with(anonymous, AmqpConfig::default())
    }

    /// An anonymous peer on a configuration `tweak` adjusted, past
    /// [`Peer::open`] (header, Open and Begin answered).
    fn opened(tweak: impl FnOnce(&mut AmqpConfig)) -> Self {
        let mut cfg = AmqpConfig::default();
        tweak(&mut cfg);
        let mut p = Self::with(true, cfg);
        p.open();
        p
    }

    fn input(&mut self, bytes: &[u8]) {
        self.conn.handle_input(self.now, bytes);
    }

    fn sasl<T: Serialize>(&mut self, body: &T) {
        let b = self.frame(FRAME_TYPE_SASL, 0, body, &[]);
        self.input(&b);
    }

    fn send<T: Serialize>(&mut self, ch: u16, perf: &T, payload: &[u8]) {
        let b = self.frame(frame::FRAME_TYPE_AMQP, ch, perf, payload);
        self.input(&b);
    }

    /// One frame as this peer writes it: `body` then `payload` (whole
    /// message sections), with symbolic descriptors if [`Peer::symbolic`].
    fn frame<T: Serialize>(&self, frame_type: u8, ch: u16, body: &T, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        if !self.symbolic {
            write_frame(&mut b, frame_type, ch, body, payload);
            return b;
        }
        let (body, _) = descriptor::to_symbolic(&serde_amqp::to_vec(body).unwrap()).unwrap();
        let start = frame::begin_frame(&mut b, frame_type, ch);
        b.extend_from_slice(&body);
        b.extend_from_slice(&descriptor::to_symbolic_all(payload).unwrap());
        frame::finish_frame(&mut b, start);
        b
    }

    fn event(&mut self, e: SessionEvent) {
        self.conn.handle_event(self.now, e);
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.conn.handle_timeout(self.now);
    }

    fn recv(&mut self) -> Vec<Out> {
        self.conn.poll_transmit(&mut self.rx);
        let mut outs = Vec::new();
        let buf = std::mem::take(&mut self.rx);
        let mut pos = 0;
        while pos < buf.len() {
            if buf[pos..].starts_with(b"AMQP") {
                outs.push(Out::Header(buf[pos + 4]));
                pos += 8;
                continue;
            }
            let size = u32::from_be_bytes(buf[pos..pos + 4].try_into().unwrap()) as usize;
            let doff = usize::from(buf[pos + 4]) * 4;
            let ftype = buf[pos + 5];
            let ch = u16::from_be_bytes([buf[pos + 6], buf[pos + 7]]);
            let body = Bytes::copy_from_slice(&buf[pos + doff..pos + size]);
            pos += size;
            if ftype == FRAME_TYPE_SASL {
                outs.push(Out::Sasl(body));
            } else if body.is_empty() {
                outs.push(Out::Empty);
            } else {
                let len = codec::value_len(&body).unwrap();
                let perf: Performative = codec::decode("perf", &body[..len]).unwrap();
                outs.push(Out::Perf(ch, perf, body.slice(len..)));
            }
        }
        outs
    }

    fn perfs(&mut self) -> Vec<Performative> {
        self.recv()
            .into_iter()
            .filter_map(|o| match o {
                Out::Perf(_, p, _) => Some(p),
                _ => None,
            })
            .collect()
    }

    /// Anonymous AMQP header (no SASL), Open and Begin on channel 0.
    fn open(&mut self) {
        self.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
        self.send(0, &open("client-1"), &[]);
        self.send(0, &begin(), &[]);
        let out = self.perfs();
        assert!(matches!(out[0], Performative::Open(_)), "{out:?}");
        assert!(matches!(out[1], Performative::Begin(_)), "{out:?}");
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap()
    }
}

fn open(container: &str) -> Open {
    Open {
        container_id: container.into(),
        hostname: None,
        max_frame_size: MaxFrameSize(65_536),
        channel_max: ChannelMax(10),
        idle_time_out: None,
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

fn begin() -> Begin {
    Begin {
        remote_channel: None,
        next_outgoing_id: 0,
        incoming_window: 1000,
        outgoing_window: 1000,
        handle_max: Handle(100),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

fn attach(name: &str, handle: u32, role: Role, address: Option<&str>) -> Attach {
    let source = Source {
        address: address.map(Into::into),
        ..Source::default()
    };
    let target = Target {
        address: address.map(Into::into),
        ..Target::default()
    };
    Attach {
        name: name.into(),
        handle: Handle(handle),
        role,
        snd_settle_mode: SenderSettleMode::Unsettled,
        rcv_settle_mode: ReceiverSettleMode::First,
        source: Some(Box::new(source)),
        target: Some(Box::new(TargetArchetype::Target(target))),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

fn flow(handle: u32, delivery_count: u32, credit: u32, drain: bool) -> Flow {
    Flow {
        next_incoming_id: Some(0),
        incoming_window: 1000,
        next_outgoing_id: 0,
        outgoing_window: 1000,
        handle: Some(Handle(handle)),
        delivery_count: Some(delivery_count),
        link_credit: Some(credit),
        available: None,
        drain,
        echo: false,
        properties: None,
    }
}

fn transfer(handle: u32, id: u32, settled: bool) -> Transfer {
    Transfer {
        handle: Handle(handle),
        delivery_id: Some(id),
        delivery_tag: Some(vec![id as u8].into()),
        message_format: Some(0),
        settled: Some(settled),
        more: false,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    }
}

fn data_payload(body: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    codec::encode_into(&mut p, &Data(Binary::from(body.to_vec()))).unwrap();
    p
}

fn delivery(consumer: u64, tag: u64, body: &'static [u8]) -> SessionEvent {
    SessionEvent::Delivery(Delivery {
        consumer: ConsumerId(consumer),
        tag: DeliveryTag(tag),
        message: Arc::new(Message::binary(Bytes::from_static(body))),
        delivery_count: 0,
        redelivered: false,
        from_retained: false,
        matched: MatchInfo::default(),
        annotation: None,
        charge: rosetta_neutral::DeliveryCharge::none(),
        stream: None,
    })
}

fn condition_symbol(e: &WireError) -> String {
    let bytes = serde_amqp::to_vec(&e.condition).unwrap();
    let sym: Symbol = serde_amqp::from_slice(&bytes).unwrap();
    sym.0
}

/// The performatives among `out`, in order.
fn performatives_of(out: &[Out]) -> Vec<&Performative> {
    out.iter()
        .filter_map(|o| match o {
            Out::Perf(_, p, _) => Some(p),
            _ => None,
        })
        .collect()
}

/// The condition of the Close that ends what the connection wrote.
fn closed_with(p: &mut Peer) -> String {
    let out = p.perfs();
    let Some(Performative::Close(c)) = out.last() else {
        panic!("expected a Close last: {out:?}")
    };
    condition_symbol(c.error.as_ref().expect("an error in the Close"))
}

fn sasl_outcome(out: &[Out]) -> SaslOutcome {
    out.iter()
        .find_map(|o| match o {
            Out::Sasl(b) if descriptor::descriptor_code(b) == Some(0x44) => {
                Some(codec::decode::<SaslOutcome>("outcome", b).unwrap())
            }
            _ => None,
        })
        .expect("a sasl-outcome")
}

fn plain(user: &str, pw: &str) -> SaslInit {
    SaslInit {
        mechanism: Symbol::from("PLAIN"),
        initial_response: Some(Binary::from(format!("\0{user}\0{pw}").into_bytes())),
        hostname: None,
    }
}

/// A client detach of `handle`, `closed` or not, without an error.
fn detach(handle: u32, closed: bool) -> Detach {
    Detach {
        handle: Handle(handle),
        closed,
        error: None,
    }
}

/// The error condition of a rejected outcome: `out` must start with a
/// disposition whose state is `rejected` (panics otherwise).
fn rejection(out: &[Performative]) -> String {
    let Some(Performative::Disposition(d)) = out.first() else {
        panic!("expected a disposition first: {out:?}")
    };
    let Some(DeliveryState::Rejected(r)) = &d.state else {
        panic!("expected rejected: {d:?}")
    };
    condition_symbol(r.error.as_ref().expect("rejected with an error"))
}

/// The receiver's settled disposition of delivery `first` as accepted
/// inside transaction `txn_id`.
fn txn_accept(first: u32, txn_id: &Binary) -> Disposition {
    Disposition {
        role: Role::Receiver,
        first,
        last: None,
        settled: true,
        state: Some(DeliveryState::TransactionalState(TransactionalState {
            txn_id: txn_id.clone(),
            outcome: Some(fe2o3_amqp_types::messaging::Outcome::Accepted(Accepted {})),
        })),
        batchable: false,
    }
}

/// Attaches a client sender on handle 0 and returns the credit granted.
fn attach_sender(p: &mut Peer, address: Option<&str>) -> u32 {
    p.send(0, &attach("snd", 0, Role::Sender, address), &[]);
    let out = p.perfs();
    assert!(
        matches!(&out[0], Performative::Attach(a) if a.role == Role::Receiver),
        "{out:?}"
    );
    match &out[1] {
        Performative::Flow(f) => f.link_credit.unwrap(),
        other => panic!("expected flow, got {other:?}"),
    }
}

// ---------------------------------------------------------------- SASL

#[test]
fn sasl_plain_ok_then_open() {
    let mut p = Peer::new(false);
    p.input(&frame::protocol_header(PROTOCOL_ID_SASL));
    let out = p.recv();
    assert!(matches!(out[0], Out::Header(3)));
    let Out::Sasl(mechs) = &out[1] else {
        panic!("{out:?}")
    };
    let text = String::from_utf8_lossy(mechs);
    assert!(text.contains("PLAIN") && text.contains("SCRAM-SHA-256"));
    assert!(!text.contains("ANONYMOUS"));
    p.sasl(&plain("alice", PASSWORD));
    assert_eq!(sasl_outcome(&p.recv()).code, SaslCode::Ok);
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    p.send(0, &open("jms-client"), &[]);
    let out = p.recv();
    assert!(matches!(out[0], Out::Header(0)));
    let Out::Perf(0, Performative::Open(o), _) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(o.container_id, "rosetta");
    assert_eq!(o.max_frame_size.0, crate::config::FRAME_SIZE_MAX_BYTES);
    let log = p.log();
    assert_eq!(log.sessions[0].principal.user.as_deref(), Some("alice"));
    assert_eq!(log.sessions[0].client_id.as_deref(), Some("jms-client"));
}

#[test]
fn sasl_plain_wrong_password_fails_with_auth() {
    let mut p = Peer::new(false);
    p.input(&frame::protocol_header(PROTOCOL_ID_SASL));
    p.recv();
    p.sasl(&plain("alice", "nope"));
    assert_eq!(sasl_outcome(&p.recv()).code, SaslCode::Auth);
    assert!(p.conn.is_closed());
    assert!(p.log().sessions.is_empty());
}

#[test]
fn sasl_anonymous_only_when_allowed() {
    for allowed in [true, false] {
        let mut p = Peer::new(allowed);
        // ANONYMOUS never waits for a password check.
        p.log().logins.defer_passwords = true;
        p.input(&frame::protocol_header(PROTOCOL_ID_SASL));
        p.recv();
        p.sasl(&SaslInit {
            mechanism: Symbol::from("ANONYMOUS"),
            initial_response: None,
            hostname: None,
        });
        let want = if allowed {
            SaslCode::Ok
        } else {
            SaslCode::Auth
        };
        assert_eq!(sasl_outcome(&p.recv()).code, want);
        assert_eq!(p.conn.is_closed(), !allowed);
        assert!(p.log().logins.pending.is_empty());
    }
}

#[test]
fn skipping_sasl_needs_anonymous_access() {
    let mut p = Peer::new(true);
    p.open();
    assert_eq!(p.log().sessions[0].principal, Principal::anonymous());

    let mut p = Peer::new(false);
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    let out = p.recv();
    assert!(
        matches!(out[..], [Out::Header(PROTOCOL_ID_SASL)]),
        "{out:?}"
    );
    assert!(p.conn.is_closed());
}

/// A protocol header we do not accept is answered with one we support,
/// then the connection closes (AMQP 1.0 §2.2); which one depends on where
/// the connection is and what the client asked for.
#[test]
fn refused_protocol_headers_are_answered_with_ours() {
    let (amqp, sasl) = (PROTOCOL_ID_AMQP, PROTOCOL_ID_SASL);
    // (anonymous allowed, SASL done first, client's bytes, answer)
    let cases: &[(bool, bool, &[u8], u8)] = &[
        (true, false, b"AMQP\x00\x00\x09\x01", amqp), // AMQP 0-9-1
        (false, false, b"AMQP\x00\x00\x09\x01", sasl),
        (true, false, b"AMQP\x00\x01\x00\x01", amqp), // 1.0.1
        (true, false, b"AMQP\x00\x02\x00\x00", amqp),
        (false, false, b"AMQP\x00\x01\x00\x00", sasl), // SASL required
        (true, false, b"AMQP\x03\x01\x00\x01", sasl),  // SASL 1.0.1
        (true, false, b"AMQP\x02\x01\x00\x00", sasl),  // TLS in-band
        (true, false, b"AMQP\x01\x01\x00\x00", sasl),  // unknown id
        (true, false, b"AMQP\x09\x09\x09\x09", sasl),
        (true, false, b"GET / HTTP/1.1\r\n", sasl), // not a header at all
        (true, false, b"\x10\x0c\x00\x04MQTT", sasl),
        (false, true, b"AMQP\x03\x01\x00\x00", amqp), // SASL again
        (false, true, b"AMQP\x02\x01\x00\x00", amqp),
        (false, true, b"AMQP\x00\x00\x09\x01", amqp),
    ];
    for &(anonymous, after_sasl, input, answer) in cases {
        let mut p = Peer::new(anonymous);
        if after_sasl {
            p.input(&frame::protocol_header(PROTOCOL_ID_SASL));
            p.sasl(&plain("alice", PASSWORD));
            assert_eq!(sasl_outcome(&p.recv()).code, SaslCode::Ok);
        }
        p.input(input);
        let mut out = Vec::new();
        p.conn.poll_transmit(&mut out);
        assert_eq!(
            out,
            frame::protocol_header(answer),
            "{input:?} (anonymous {anonymous}, after SASL {after_sasl})"
        );
        assert!(p.conn.is_closed(), "{input:?}");
    }
}

/// A SCRAM-SHA-256 exchange as `user` (client nonce `clientnonce123`) up
/// to the outcome. Checks on the way that the server's first message
/// echoes our nonce, as it must for any user, known or not.
fn scram_exchange(user: &str, password: &str) -> (SaslOutcome, String, Peer) {
    let mut p = Peer::new(false);
    p.input(&frame::protocol_header(PROTOCOL_ID_SASL));
    p.recv();
    let first_bare = format!("n={user},r=clientnonce123");
    p.sasl(&SaslInit {
        mechanism: Symbol::from("SCRAM-SHA-256"),
        initial_response: Some(Binary::from(format!("n,,{first_bare}").into_bytes())),
        hostname: None,
    });
    let out = p.recv();
    let Out::Sasl(b) = &out[0] else {
        panic!("{out:?}")
    };
    let ch: SaslChallenge = codec::decode("challenge", b).unwrap();
    let server_first = String::from_utf8(ch.challenge.into_vec()).unwrap();
    assert!(server_first.starts_with("r=clientnonce123"));
    let (client_final, server_final) = scram_client_final(password, &first_bare, &server_first);
    p.sasl(&SaslResponse {
        response: Binary::from(client_final.into_bytes()),
    });
    let outcome = sasl_outcome(&p.recv());
    (outcome, server_final, p)
}

#[test]
fn sasl_scram_sha_256_full_exchange() {
    let (outcome, server_final, mut p) = scram_exchange("alice", PASSWORD);
    assert_eq!(outcome.code, SaslCode::Ok);
    assert_eq!(
        outcome.additional_data.unwrap().into_vec(),
        server_final.into_bytes()
    );
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    p.send(0, &open("c"), &[]);
    p.recv();
    assert_eq!(p.log().sessions[0].principal.user.as_deref(), Some("alice"));
}

#[test]
fn sasl_scram_wrong_password_fails() {
    let (outcome, _, p) = scram_exchange("alice", "wrong");
    assert_eq!(outcome.code, SaslCode::Auth);
    assert!(p.conn.is_closed());
}

#[test]
fn sasl_scram_unknown_user_fails_like_a_wrong_password() {
    // A challenge like any other (the user name is not revealed), then
    // the same failure as a wrong password.
    let (outcome, _, _) = scram_exchange("mallory", PASSWORD);
    assert_eq!(outcome.code, SaslCode::Auth);
}

/// A peer whose connection has a verified client certificate naming `user`.
fn certified(user: &str) -> Peer {
    let mut p = Peer::new(false);
    let broker = Arc::new(FakeBroker {
        log: p.log.clone(),
        anonymous: false,
    });
    p.conn = AmqpConnection::new(AmqpConfig::default(), broker, Arc::new(NullSink), 7, p.now)
        .with_certificate_user(Some(user.into()));
    p.input(&frame::protocol_header(PROTOCOL_ID_SASL));
    p.recv();
    p
}

/// SCRAM client-first as alice.
fn scram_first_as_alice() -> SaslInit {
    SaslInit {
        mechanism: Symbol::from("SCRAM-SHA-256"),
        initial_response: Some(Binary::from(b"n,,n=alice,r=clientnonce123".to_vec())),
        hostname: None,
    }
}

/// With a client certificate, the user of PLAIN and of SCRAM must be the
/// certificate's user (the identity rule of `rosetta_neutral::login`); the
/// same user's PLAIN password is still checked.
#[test]
fn sasl_users_must_be_the_certificate_user() {
    let mut p = certified("bob");
    p.sasl(&plain("alice", PASSWORD));
    assert_eq!(
        sasl_outcome(&p.recv()).code,
        SaslCode::Auth,
        "PLAIN as alice"
    );
    assert!(p.conn.is_closed());

    let mut p = certified("bob");
    p.sasl(&scram_first_as_alice());
    assert_eq!(
        sasl_outcome(&p.recv()).code,
        SaslCode::Auth,
        "SCRAM as alice"
    );

    let mut p = certified("alice");
    p.sasl(&scram_first_as_alice());
    assert!(
        matches!(&p.recv()[..], [Out::Sasl(b)] if crate::descriptor::descriptor_code(b) == Some(0x42)),
        "SCRAM as the certificate's user gets its challenge"
    );

    let mut p = certified("alice");
    p.sasl(&plain("alice", "wrong"));
    assert_eq!(
        sasl_outcome(&p.recv()).code,
        SaslCode::Auth,
        "wrong password"
    );
    let mut p = certified("alice");
    p.sasl(&plain("alice", PASSWORD));
    assert_eq!(sasl_outcome(&p.recv()).code, SaslCode::Ok);
}

// ---------------------------------------------------------------- framing

#[test]
fn truncated_or_bad_frames_before_and_after_sasl_are_errors() {
    // 13 bytes whose data offset points past the frame, before auth.
    let mut p = Peer::new(false);
    p.input(&frame::protocol_header(PROTOCOL_ID_SASL));
    p.input(&[0, 0, 0, 13, 9, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert!(p.conn.is_closed());
    // A truncated frame header then EOF after SASL.
    let mut p = Peer::new(false);
    p.input(&frame::protocol_header(PROTOCOL_ID_SASL));
    p.sasl(&plain("alice", PASSWORD));
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    p.input(&[0, 0, 0]);
    assert!(!p.conn.is_closed());
    p.conn.handle_transport_closed(p.now);
    assert!(p.conn.is_closed());
    // A body that is not a performative after Open: decode-error close.
    let mut p = Peer::new(true);
    p.open();
    p.input(&[0, 0, 0, 10, 2, 0, 0, 0, 0xa1, 5]);
    let out = p.perfs();
    let Some(Performative::Close(c)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(c.error.as_ref().unwrap()),
        "amqp:decode-error"
    );
    assert_eq!(p.log().closed, Some(CloseKind::Abnormal));
}

#[test]
fn oversized_frame_closes_with_frame_size_too_large() {
    let mut p = Peer::new(true);
    p.open();
    let size = crate::config::FRAME_SIZE_MAX_BYTES + 1;
    p.input(&size.to_be_bytes());
    let out = p.perfs();
    let Some(Performative::Close(c)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(c.error.as_ref().unwrap()),
        "amqp:frame-size-too-large"
    );
    // The peer answers our close; the connection is done.
    p.send(0, &Close { error: None }, &[]);
    assert!(p.conn.is_closed());
}

/// Found by the `connection` fuzz target (out-of-memory): an Attach whose
/// source is described by a `sym32` claiming 0xd73ffb01 bytes (3.6 GB) in a
/// 40-byte frame. `serde_amqp` allocated the claimed size before reading,
/// which can abort the process; now `codec::decode` checks nested sizes
/// first, so the peer gets a decode-error naming the truncation.
#[test]
fn fuzz_attach_with_huge_nested_length_is_a_decode_error() {
    let mut p = Peer::new(true);
    p.open();
    #[rustfmt::skip]
    p.input(&[
        0x00, 0x00, 0x00, 0x28, 0x02, 0x00, 0x00, 0x00, // frame header
        0x00, 0x53, 0x12, 0xc0, 0x1b, 0x07, // attach, list8 of 7
        0xa1, 0x01, b'r', 0x52, 0x01, 0x41, 0x40, 0x40, // name, handle, role, modes
        0x00, 0xb3, 0xd7, 0x3f, 0xfb, 0x01, // source: described by a huge sym32
        0xa1, 0x01, b'q', 0x00, 0x53, 0x29, 0xc0, 0x04, 0x01, 0xa1, 0x01, b'q',
    ]);
    let out = p.perfs();
    let Some(Performative::Close(c)) = out.last() else {
        panic!("{out:?}")
    };
    let e = c.error.as_ref().unwrap();
    assert_eq!(condition_symbol(e), "amqp:decode-error");
    let text = e.description.as_deref().unwrap_or_default();
    assert!(text.contains("truncated AMQP value"), "{text}");
    assert!(p.conn.is_closed() || p.log().closed == Some(CloseKind::Abnormal));
}

#[test]
fn byte_at_a_time_handshake_and_publish() {
    let mut p = Peer::new(true);
    let mut wire = frame::protocol_header(PROTOCOL_ID_AMQP).to_vec();
    write_perf(&mut wire, 0, &open("c"), &[]);
    write_perf(&mut wire, 0, &begin(), &[]);
    write_perf(
        &mut wire,
        0,
        &attach("s", 0, Role::Sender, Some("/queue/q")),
        &[],
    );
    write_perf(&mut wire, 0, &transfer(0, 0, true), &data_payload(b"abc"));
    for b in &wire {
        p.input(std::slice::from_ref(b));
    }
    let log = p.log();
    assert_eq!(log.published.len(), 1);
    assert_eq!(log.published[0].0, Address::Queue("q".into()));
    assert_eq!(&log.published[0].1.body.bytes[..], b"abc");
}

#[test]
fn second_open_is_an_illegal_state() {
    let mut p = Peer::new(true);
    p.open();
    p.send(0, &open("again"), &[]);
    let out = p.perfs();
    let Some(Performative::Close(c)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(c.error.as_ref().unwrap()),
        "amqp:illegal-state"
    );
}

// ---------------------------------------------------------------- idle

#[test]
fn idle_timeouts_both_ways() {
    let mut p = Peer::new(true);
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    let mut o = open("c");
    o.idle_time_out = Some(10_000);
    p.send(0, &o, &[]);
    p.recv();
    // We send a heartbeat at half the peer's timeout.
    assert_eq!(p.conn.poll_timeout(), Some(p.now + Duration::from_secs(5)));
    p.advance(Duration::from_secs(5));
    assert!(matches!(p.recv()[..], [Out::Empty]));
    // The peer keeps talking with empty frames: we stay open.
    for _ in 0..20 {
        p.advance(Duration::from_secs(5));
        p.input(&[0, 0, 0, 8, 2, 0, 0, 0]);
        p.recv();
    }
    assert!(!p.conn.is_closed());
    // Silence past our 60 s: close with resource-limit-exceeded.
    for _ in 0..13 {
        p.advance(Duration::from_secs(5));
    }
    let out = p.perfs();
    let Some(Performative::Close(c)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(c.error.as_ref().unwrap()),
        "amqp:resource-limit-exceeded"
    );
    assert!(p.conn.is_closed());
}

/// We advertise half the idle timeout we enforce (AMQP 1.0 §2.4.5), so a
/// peer that sends its keep-alive once per advertised period (as
/// python-qpid-proton does) is never closed; a silent one is, after the
/// whole enforced timeout.
#[test]
fn advertised_idle_timeout_is_half_the_enforced_one() {
    let enforced = Duration::from_millis(crate::config::IDLE_TIMEOUT_MS.into());
    let mut p = Peer::new(true);
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    p.send(0, &open("c"), &[]);
    let out = p.perfs();
    let Some(Performative::Open(ours)) = out.first() else {
        panic!("{out:?}")
    };
    let advertised = Duration::from_millis(ours.idle_time_out.expect("advertised").into());
    assert_eq!(advertised, enforced / 2);
    for _ in 0..10 {
        p.advance(advertised);
        p.input(&[0, 0, 0, 8, 2, 0, 0, 0]);
        p.recv();
        assert!(!p.conn.is_closed(), "keep-alive at the advertised period");
    }
    p.advance(enforced - Duration::from_millis(1));
    assert!(!p.conn.is_closed());
    p.advance(Duration::from_millis(1));
    assert!(p.conn.is_closed(), "silent for the enforced timeout");
    // No idle timeout configured: none advertised, none enforced.
    let mut p = Peer::opened(|c| c.idle_timeout_ms = 0);
    p.advance(enforced * 10);
    assert!(!p.conn.is_closed());
    let mut p = Peer::with(
        true,
        AmqpConfig {
            idle_timeout_ms: 0,
            ..AmqpConfig::default()
        },
    );
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    p.send(0, &open("c"), &[]);
    let out = p.perfs();
    assert!(
        matches!(&out[0], Performative::Open(o) if o.idle_time_out.is_none()),
        "{out:?}"
    );
}

/// Spec 2.4.5: the idle timeout fires when no *frames* arrive. A frame
/// dribbled a byte at a time never completes, so its bytes must not keep
/// the connection open.
#[test]
fn idle_timeout_counts_frames_not_bytes() {
    let mut p = Peer::opened(|c| c.idle_timeout_ms = 2_000);
    p.recv();
    let mut b = Vec::new();
    write_perf(&mut b, 0, &begin(), &[]);
    let opened_at = p.now;
    let mut sent = 0;
    while !p.conn.is_closed() && sent < b.len() {
        p.input(&b[sent..=sent]);
        sent += 1;
        p.advance(Duration::from_millis(500));
    }
    assert!(p.conn.is_closed(), "a dribbled frame kept the connection");
    assert!(sent < b.len(), "closed before the frame completed");
    assert!(p.now - opened_at <= Duration::from_millis(2_000));
    assert_eq!(closed_with(&mut p), "amqp:resource-limit-exceeded");
}

/// A frame that arrived in pieces counts when its last byte arrives.
#[test]
fn idle_timeout_restarts_when_a_split_frame_completes() {
    let mut p = Peer::opened(|c| c.idle_timeout_ms = 2_000);
    p.recv();
    p.advance(Duration::from_millis(1_500));
    p.input(&[0, 0, 0, 8]);
    p.advance(Duration::from_millis(400));
    p.input(&[2, 0, 0, 0]); // the rest of an empty frame
    p.advance(Duration::from_millis(1_900));
    assert!(!p.conn.is_closed());
    p.advance(Duration::from_millis(100));
    assert!(p.conn.is_closed());
}

#[test]
fn handshake_must_finish_in_time() {
    let mut p = Peer::new(true);
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    p.advance(Duration::from_millis(crate::config::HANDSHAKE_TIMEOUT_MS));
    assert!(p.conn.is_closed());
}

// ---------------------------------------------------------------- publish

#[test]
fn unsettled_send_is_accepted_only_after_commit() {
    let mut p = Peer::new(true);
    p.open();
    let credit = attach_sender(&mut p, Some("/queue/q"));
    assert_eq!(credit, crate::config::SENDER_CREDIT_WINDOW);
    let payload = durable_data(b"hello");
    p.send(0, &transfer(0, 0, false), &payload);
    p.send(0, &transfer(0, 1, false), &payload);
    assert!(p.perfs().is_empty(), "no disposition before the commit");
    let (ticket0, ticket1) = {
        let log = p.log();
        assert_eq!(log.published.len(), 2);
        assert!(log.published[0].2.confirm);
        assert!(log.published[0].1.durable);
        assert_eq!(log.published[0].1.guarantee, Guarantee::AtLeastOnce);
        (Ticket(1), Ticket(2))
    };
    p.event(SessionEvent::Committed {
        ticket: ticket0,
        result: Ok(()),
    });
    p.event(SessionEvent::Committed {
        ticket: ticket1,
        result: Ok(()),
    });
    let out = p.perfs();
    // Both commits coalesce into one disposition range.
    assert_eq!(out.len(), 1, "{out:?}");
    let Performative::Disposition(d) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!((d.first, d.last, d.settled), (0, Some(1), true));
    assert!(matches!(d.state, Some(DeliveryState::Accepted(_))));
}

#[test]
fn failed_commit_rejects_the_delivery() {
    let mut p = Peer::new(true);
    p.open();
    attach_sender(&mut p, Some("q"));
    p.send(0, &transfer(0, 0, false), &data_payload(b"x"));
    p.event(SessionEvent::Committed {
        ticket: Ticket(1),
        result: Err(BrokerError::Storage("disk".into())),
    });
    assert_eq!(rejection(&p.perfs()), "amqp:internal-error");
}

#[test]
fn presettled_send_needs_no_confirm() {
    let mut p = Peer::new(true);
    p.open();
    attach_sender(&mut p, Some("/topic/a/b"));
    p.send(0, &transfer(0, 0, true), &data_payload(b"x"));
    assert!(p.perfs().is_empty());
    let log = p.log();
    assert_eq!(log.published[0].0, Address::Topic("a/b".into()));
    assert!(!log.published[0].2.confirm);
    assert_eq!(log.published[0].1.guarantee, Guarantee::AtMostOnce);
}

#[test]
fn anonymous_relay_routes_by_to() {
    let mut p = Peer::new(true);
    p.open();
    attach_sender(&mut p, None);
    let mut payload = Vec::new();
    codec::encode_into(
        &mut payload,
        &AmqpProperties {
            to: Some("/topic/x/y".into()),
            ..Default::default()
        },
    )
    .unwrap();
    codec::encode_into(&mut payload, &AmqpValue("hi".to_string())).unwrap();
    p.send(0, &transfer(0, 0, true), &payload);
    // No `to`: rejected with invalid-field, the link stays.
    p.send(0, &transfer(0, 1, false), &data_payload(b"x"));
    assert_eq!(rejection(&p.perfs()), "amqp:invalid-field");
    let log = p.log();
    assert_eq!(log.published.len(), 1);
    assert_eq!(log.published[0].0, Address::Topic("x/y".into()));
    assert_eq!(log.published[0].1.body, Body::text("hi"));
}

#[test]
fn credit_is_refilled_and_withheld_when_blocked() {
    let mut p = Peer::opened(|c| c.sender_credit_window = 4);
    assert_eq!(attach_sender(&mut p, Some("q")), 4);
    // Two pre-settled transfers use half the window: refilled to 4.
    p.send(0, &transfer(0, 0, true), &data_payload(b"x"));
    p.send(0, &transfer(0, 1, true), &data_payload(b"x"));
    let out = p.perfs();
    let Some(Performative::Flow(f)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!((f.delivery_count, f.link_credit), (Some(2), Some(4)));
    // Blocked producers get no refill until the block lifts.
    p.log().blocked = true;
    p.send(0, &transfer(0, 2, true), &data_payload(b"x"));
    p.send(0, &transfer(0, 3, true), &data_payload(b"x"));
    assert!(p.perfs().is_empty());
    // A fifth and sixth transfer within the old grant are fine, a seventh is not.
    p.send(0, &transfer(0, 4, true), &data_payload(b"x"));
    p.send(0, &transfer(0, 5, true), &data_payload(b"x"));
    p.send(0, &transfer(0, 6, true), &data_payload(b"x"));
    let out = p.perfs();
    let Some(Performative::Detach(d)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:link:transfer-limit-exceeded"
    );
}

#[test]
fn unsettled_credit_refills_as_commits_arrive() {
    let mut p = Peer::opened(|c| c.sender_credit_window = 4);
    attach_sender(&mut p, Some("q"));
    for id in 0..4 {
        p.send(0, &transfer(0, id, false), &data_payload(b"x"));
    }
    assert!(p.perfs().is_empty(), "all credit used, nothing committed");
    p.event(SessionEvent::Committed {
        ticket: Ticket(1),
        result: Ok(()),
    });
    let out = p.perfs();
    assert!(
        !out.iter().any(|f| matches!(f, Performative::Flow(_))),
        "3 of 4 still outstanding: {out:?}"
    );
    p.event(SessionEvent::Committed {
        ticket: Ticket(2),
        result: Ok(()),
    });
    let out = p.perfs();
    let Some(Performative::Flow(f)) = out.iter().find(|f| matches!(f, Performative::Flow(_)))
    else {
        panic!("{out:?}")
    };
    // Two still wait for their commit: two more credits.
    assert_eq!((f.delivery_count, f.link_credit), (Some(4), Some(2)));
}

#[test]
fn withheld_credit_is_granted_when_unblocked() {
    let mut p = Peer::opened(|c| c.sender_credit_window = 4);
    p.log().blocked = true;
    p.send(0, &attach("snd", 0, Role::Sender, Some("q")), &[]);
    let out = p.perfs();
    assert_eq!(out.len(), 1, "no flow while blocked: {out:?}");
    p.log().blocked = false;
    let t = p.conn.poll_timeout().unwrap();
    p.advance(t - p.now);
    let out = p.perfs();
    let Some(Performative::Flow(f)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(f.link_credit, Some(4));
}

#[test]
fn multi_frame_transfer_is_reassembled() {
    let mut p = Peer::new(true);
    p.open();
    attach_sender(&mut p, Some("q"));
    let payload = data_payload(&[7u8; 300]);
    let (a, b) = payload.split_at(100);
    let mut t = transfer(0, 0, true);
    t.more = true;
    p.send(0, &t, a);
    let mut t2 = transfer(0, 0, true);
    t2.delivery_id = None;
    t2.delivery_tag = None;
    p.send(0, &t2, b);
    let log = p.log();
    assert_eq!(log.published.len(), 1);
    assert_eq!(&log.published[0].1.body.bytes[..], &[7u8; 300][..]);
}

#[test]
fn links_per_connection_are_limited() {
    let mut p = Peer::opened(|c| c.links_per_connection_max = 1);
    attach_sender(&mut p, Some("q"));
    p.send(0, &attach("two", 1, Role::Sender, Some("q")), &[]);
    let out = p.perfs();
    let Performative::Detach(d) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:resource-limit-exceeded"
    );
}

/// Begin advertises handle-max = links per session - 1; a handle above it
/// breaks what we advertised: a framing error that closes the connection
/// (spec 2.7.2), not a refused link.
#[test]
fn handles_above_the_advertised_handle_max_close_the_connection() {
    let mut p = Peer::with(
        true,
        AmqpConfig {
            links_per_session_max: 2,
            ..AmqpConfig::default()
        },
    );
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    p.send(0, &open("client-1"), &[]);
    p.send(0, &begin(), &[]);
    let out = p.perfs();
    let Some(Performative::Begin(b)) = out.get(1) else {
        panic!("{out:?}")
    };
    assert_eq!(b.handle_max, Handle(1));
    p.send(0, &attach("one", 1, Role::Sender, Some("q")), &[]);
    assert!(matches!(
        p.perfs()[..],
        [Performative::Attach(_), Performative::Flow(_)]
    ));
    p.send(0, &attach("two", 2, Role::Sender, Some("q")), &[]);
    assert_eq!(closed_with(&mut p), "amqp:connection:framing-error");
}

#[test]
fn a_channel_above_channel_max_closes_the_connection() {
    let mut p = Peer::opened(|c| c.channel_max = 1);
    p.send(2, &begin(), &[]);
    assert_eq!(closed_with(&mut p), "amqp:connection:framing-error");
}

/// A topic receiver whose binding the core refuses (past its bindings
/// limit, say) gets its attach refused, and the queue made for it goes:
/// no consumer would ever come to take it away.
#[test]
fn a_refused_topic_binding_leaves_no_queue_behind() {
    let mut p = Peer::opened(|_| {});
    p.log().bind_error = Some(BrokerError::ResourceLimit("bindings".into()));
    p.send(0, &attach("sub", 0, Role::Receiver, Some("/topic/t")), &[]);
    let out = p.perfs();
    let Some(Performative::Detach(d)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:resource-limit-exceeded"
    );
    let log = p.log();
    let declared = log.declared.last().and_then(|s| s.name.clone());
    assert_eq!(log.deleted.len(), 1, "{:?}", log.deleted);
    assert!(
        log.declared.len() == 1 && declared.is_none(),
        "a temporary queue"
    );
    assert!(log.deleted[0].starts_with("$temp/"), "{:?}", log.deleted);
}

#[test]
fn dynamic_target_gets_a_temporary_queue() {
    let mut p = Peer::new(true);
    p.open();
    let mut a = attach("tmp", 0, Role::Sender, None);
    a.target = Some(Box::new(TargetArchetype::Target(Target {
        dynamic: true,
        capabilities: Some(Array(vec![Symbol::from("temporary-queue")])),
        ..Target::default()
    })));
    p.send(0, &a, &[]);
    let out = p.perfs();
    let Performative::Attach(reply) = &out[0] else {
        panic!("{out:?}")
    };
    let Some(TargetArchetype::Target(t)) = reply.target.as_deref() else {
        panic!("{reply:?}")
    };
    assert_eq!(t.address.as_deref(), Some("/queue/$temp/1"));
    assert_eq!(p.log().declared[0].lifetime, QueueLifetime::Session);
    p.send(0, &transfer(0, 0, true), &data_payload(b"x"));
    assert_eq!(p.log().published[0].0, Address::Queue("$temp/1".into()));
}

#[test]
fn publish_to_a_malformed_target_is_refused() {
    let mut p = Peer::new(true);
    p.open();
    p.send(0, &attach("snd", 0, Role::Sender, Some("/topic/a/#")), &[]);
    let out = p.perfs();
    let Performative::Attach(a) = &out[0] else {
        panic!("{out:?}")
    };
    assert!(a.target.is_none());
    let Performative::Detach(d) = &out[1] else {
        panic!("{out:?}")
    };
    assert!(d.closed);
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:invalid-field"
    );
    // The peer's answering detach is absorbed; the session lives on.
    p.send(0, &detach(0, true), &[]);
    assert!(p.perfs().is_empty());
    assert_eq!(
        attach_sender(&mut p, Some("q")),
        crate::config::SENDER_CREDIT_WINDOW
    );
}

#[test]
fn unauthorized_publish_detaches_only_that_link() {
    let mut p = Peer::new(true);
    p.open();
    attach_sender(&mut p, Some("q"));
    p.log().publish_error = Some(BrokerError::Unauthorized("q".into()));
    p.send(0, &transfer(0, 0, false), &data_payload(b"x"));
    let out = p.perfs();
    assert!(matches!(&out[0], Performative::Disposition(_)), "{out:?}");
    let Performative::Detach(d) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:unauthorized-access"
    );
    assert!(!p.conn.is_closed());
}

#[test]
fn transfer_on_unknown_handle_ends_the_session() {
    let mut p = Peer::new(true);
    p.open();
    p.send(0, &transfer(9, 0, true), &data_payload(b"x"));
    let out = p.perfs();
    let Some(Performative::End(e)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(e.error.as_ref().unwrap()),
        "amqp:session:unattached-handle"
    );
    // Frames on the ended session are dropped until the peer's End.
    p.send(0, &transfer(9, 1, true), &data_payload(b"x"));
    assert!(p.perfs().is_empty());
    p.send(0, &End { error: None }, &[]);
    p.send(0, &begin(), &[]);
    assert!(matches!(p.perfs()[..], [Performative::Begin(_)]));
}

#[test]
fn begin_on_a_channel_whose_end_we_await_closes_the_connection() {
    let mut p = Peer::new(true);
    p.open();
    p.send(0, &transfer(9, 0, true), &data_payload(b"x"));
    assert!(matches!(p.perfs().last(), Some(Performative::End(_))));
    // The session is gone, but its channel stays taken until the peer's End.
    p.send(0, &begin(), &[]);
    let out = p.perfs();
    let Some(Performative::Close(c)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(c.error.as_ref().unwrap()),
        "amqp:not-allowed"
    );
}

#[test]
fn session_window_reopens_and_violation_ends_the_session() {
    let mut p = Peer::opened(|c| c.session_window_frames = 4);
    attach_sender(&mut p, Some("q"));
    p.send(0, &transfer(0, 0, true), &data_payload(b"x"));
    assert!(p.perfs().is_empty());
    p.send(0, &transfer(0, 1, true), &data_payload(b"x"));
    let out = p.perfs();
    let Some(Performative::Flow(f)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        (f.next_incoming_id, f.incoming_window, f.handle.clone()),
        (Some(2), 4, None)
    );

    // A zero window: any transfer violates it.
    let mut p = Peer::opened(|c| c.session_window_frames = 0);
    attach_sender(&mut p, Some("q"));
    p.send(0, &transfer(0, 0, true), &data_payload(b"x"));
    let out = p.perfs();
    let Some(Performative::End(e)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(e.error.as_ref().unwrap()),
        "amqp:session:window-violation"
    );
    assert!(p.log().published.is_empty());
}

#[test]
fn several_sessions_and_unknown_channels() {
    let mut p = Peer::new(true);
    p.open();
    p.send(1, &begin(), &[]);
    let out = p.recv();
    assert!(matches!(out[..], [Out::Perf(1, Performative::Begin(_), _)]));
    p.send(1, &attach("a", 0, Role::Sender, Some("q")), &[]);
    p.send(0, &attach("b", 0, Role::Sender, Some("q")), &[]);
    assert_eq!(p.perfs().len(), 4);
    p.send(5, &attach("c", 0, Role::Sender, Some("q")), &[]);
    let out = p.perfs();
    let Some(Performative::Close(c)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(c.error.as_ref().unwrap()),
        "amqp:not-allowed"
    );
}

// ---------------------------------------------------------------- consume

/// Attaches a client receiver on handle `h` and returns the reply.
fn attach_receiver(p: &mut Peer, h: u32, a: Attach) -> Attach {
    assert_eq!(a.handle.0, h);
    p.send(0, &a, &[]);
    let out = p.perfs();
    match out.into_iter().next() {
        Some(Performative::Attach(a)) => a,
        other => panic!("{other:?}"),
    }
}

#[test]
fn queue_receiver_credit_delivery_and_accept() {
    let mut p = Peer::new(true);
    p.open();
    let reply = attach_receiver(
        &mut p,
        0,
        attach("rcv", 0, Role::Receiver, Some("/queue/q")),
    );
    assert_eq!(reply.role, Role::Sender);
    assert_eq!(reply.initial_delivery_count, Some(0));
    {
        let log = p.log();
        assert_eq!(log.consumers[0].queue, "q");
        assert_eq!(log.consumers[0].credit, CreditMode::Explicit(0));
        assert!(!log.consumers[0].auto_settle);
    }
    p.send(0, &flow(0, 0, 10, false), &[]);
    assert_eq!(p.log().credits, vec![(ConsumerId(1), 10, false)]);
    p.event(delivery(1, 42, b"body"));
    let out = p.recv();
    let Out::Perf(0, Performative::Transfer(t), payload) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(t.delivery_id, Some(0));
    assert_eq!(t.settled, Some(false));
    assert_eq!(
        t.delivery_tag.as_ref().unwrap().as_slice(),
        &42u64.to_be_bytes()
    );
    let m = crate::message::decode(payload, 0).unwrap();
    assert_eq!(&m.message.body.bytes[..], b"body");
    // The client accepts it.
    p.send(
        0,
        &Disposition {
            role: Role::Receiver,
            first: 0,
            last: None,
            settled: true,
            state: Some(DeliveryState::Accepted(Accepted {})),
            batchable: false,
        },
        &[],
    );
    assert_eq!(
        p.log().settled,
        vec![(ConsumerId(1), DeliveryTag(42), Outcome::Accept, None)]
    );
    // More credit: delivery-count 1 + credit 5 -> 5 left, given to the
    // core as a limit counted from the deliveries it has sent us (1 + 5).
    p.send(0, &flow(0, 1, 5, false), &[]);
    assert_eq!(p.log().credits.last(), Some(&(ConsumerId(1), 6, false)));
}

/// Issue 20: a device that opened, began, attached a receiver, granted
/// credit and then only exchanges heartbeats holds none of what traffic
/// uses (the connection's `Busy`, the session's `SessionBusy`); its first
/// delivery makes them, and they go when it parks with nothing in them.
#[test]
fn an_idle_receiver_holds_no_busy_state_but_while_it_has_traffic() {
    let mut p = Peer::new(true);
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    let mut o = open("c");
    o.idle_time_out = Some(10_000);
    p.send(0, &o, &[]);
    p.send(0, &begin(), &[]);
    p.recv();
    attach_receiver(&mut p, 0, attach("rcv", 0, Role::Receiver, Some("q")));
    p.send(0, &flow(0, 0, 10, false), &[]);
    p.recv();
    for _ in 0..3 {
        p.advance(Duration::from_secs(5));
        p.input(&[0, 0, 0, 8, 2, 0, 0, 0]);
        assert!(matches!(p.recv()[..], [Out::Empty]), "a heartbeat");
    }
    assert_eq!(p.conn.busy_made(), (false, false));
    p.event(delivery(1, 1, b"m"));
    assert!(matches!(p.perfs()[..], [Performative::Transfer(_)]));
    assert_eq!(p.conn.busy_made(), (true, true));
    // Unsettled, the delivery keeps the session's box through a park;
    // the connection's (only the encoding buffer) goes.
    p.conn.shrink_when_parked();
    assert_eq!(p.conn.busy_made(), (false, true));
    // Settled, the boxes go when the connection parks, and the next
    // delivery makes them again.
    let accepted = Disposition {
        role: Role::Receiver,
        first: 0,
        last: None,
        settled: true,
        state: Some(DeliveryState::Accepted(Accepted {})),
        batchable: false,
    };
    p.send(0, &accepted, &[]);
    p.recv();
    assert_eq!(
        p.log().settled,
        vec![(ConsumerId(1), DeliveryTag(1), Outcome::Accept, None)]
    );
    p.conn.shrink_when_parked();
    assert_eq!(p.conn.busy_made(), (false, false));
    p.event(delivery(1, 2, b"m"));
    assert!(matches!(p.perfs()[..], [Performative::Transfer(_)]));
    assert_eq!(p.conn.busy_made(), (true, true));
}

#[test]
fn deliveries_past_the_clients_link_credit_go_back_to_the_queue() {
    let mut p = Peer::new(true);
    p.open();
    attach_receiver(&mut p, 0, attach("rcv", 0, Role::Receiver, Some("q")));
    p.send(0, &flow(0, 0, 2, false), &[]);
    // Three arrive although the link has credit for two: the client
    // lowered its credit while they were on their way (the core counts
    // its limit from what it sent, so only a lowered credit gets here).
    // Only two may be sent.
    for tag in 1..=3 {
        p.event(delivery(1, tag, b"m"));
    }
    let transfers = p
        .perfs()
        .into_iter()
        .filter(|f| matches!(f, Performative::Transfer(_)))
        .count();
    assert_eq!(transfers, 2, "never more transfers than link credit");
    assert_eq!(
        p.log().settled,
        vec![(ConsumerId(1), DeliveryTag(3), Outcome::Release, None)],
        "the third goes back to the queue uncounted"
    );
    // New credit lets the next one through.
    p.send(0, &flow(0, 2, 1, false), &[]);
    p.event(delivery(1, 3, b"m"));
    assert!(matches!(p.perfs()[..], [Performative::Transfer(_)]));
}

#[test]
fn drain_answers_after_the_core_drained() {
    let mut p = Peer::new(true);
    p.open();
    attach_receiver(&mut p, 0, attach("rcv", 0, Role::Receiver, Some("q")));
    p.send(0, &flow(0, 0, 5, true), &[]);
    assert_eq!(p.log().credits, vec![(ConsumerId(1), 5, true)]);
    assert!(p.perfs().is_empty(), "nothing until the core drained");
    p.event(delivery(1, 1, b"a"));
    p.event(SessionEvent::Drained {
        consumer: ConsumerId(1),
    });
    let out = p.perfs();
    assert!(matches!(out[0], Performative::Transfer(_)));
    let Performative::Flow(f) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(f.delivery_count, Some(5));
    assert_eq!(f.link_credit, Some(0));
    assert!(f.drain);
}

#[test]
fn receiver_outcomes_map_to_the_core() {
    let mut p = Peer::new(true);
    p.open();
    attach_receiver(&mut p, 0, attach("rcv", 0, Role::Receiver, Some("q")));
    p.send(0, &flow(0, 0, 10, false), &[]);
    for tag in 0..4 {
        p.event(delivery(1, tag, b"m"));
    }
    p.recv();
    let states = [
        DeliveryState::Released(Released {}),
        DeliveryState::Modified(Modified {
            delivery_failed: Some(true),
            undeliverable_here: Some(true),
            message_annotations: None,
        }),
        DeliveryState::Rejected(Rejected { error: None }),
    ];
    for (i, state) in states.into_iter().enumerate() {
        p.send(
            0,
            &Disposition {
                role: Role::Receiver,
                first: i as u32,
                last: None,
                settled: true,
                state: Some(state),
                batchable: false,
            },
            &[],
        );
    }
    let outcomes: Vec<Outcome> = p.log().settled.iter().map(|s| s.2).collect();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Release,
            Outcome::Modify {
                delivery_failed: true,
                undeliverable_here: true
            },
            Outcome::Reject
        ]
    );
    // Detaching returns the last unsettled one via cancel.
    p.send(0, &detach(0, true), &[]);
    assert_eq!(p.log().cancelled, vec![ConsumerId(1)]);
    assert!(matches!(p.perfs()[..], [Performative::Detach(_)]));
}

/// Accepted-and-settled dispositions are settled in the core together at
/// the end of a read; a detach in the same read must still find them
/// settled, or the core would hand them out again.
#[test]
fn accepts_batched_in_one_read_are_settled_before_a_detach_in_it() {
    let mut p = Peer::new(true);
    p.open();
    attach_receiver(&mut p, 0, attach("rcv", 0, Role::Receiver, Some("q")));
    p.send(0, &flow(0, 0, 10, false), &[]);
    for tag in 0..4 {
        p.event(delivery(1, tag, b"m"));
    }
    p.recv();
    let accepted = |first: u32, last: u32| Disposition {
        role: Role::Receiver,
        first,
        last: Some(last),
        settled: true,
        state: Some(DeliveryState::Accepted(Accepted {})),
        batchable: false,
    };
    // One read: deliveries 0-1 accepted, then 2.
    let mut read = Vec::new();
    write_perf(&mut read, 0, &accepted(0, 1), &[]);
    write_perf(&mut read, 0, &accepted(2, 2), &[]);
    p.input(&read);
    let tags: Vec<(u64, Outcome)> = p.log().settled.iter().map(|s| (s.1 .0, s.2)).collect();
    assert_eq!(
        tags,
        vec![
            (0, Outcome::Accept),
            (1, Outcome::Accept),
            (2, Outcome::Accept)
        ],
        "settled by the end of the read"
    );
    // Another read: 3 accepted, then the detach.
    let mut read = Vec::new();
    write_perf(&mut read, 0, &accepted(3, 3), &[]);
    write_perf(&mut read, 0, &detach(0, true), &[]);
    p.input(&read);
    assert_eq!(p.log().cancelled, vec![ConsumerId(1)]);
    assert_eq!(
        p.log().settled_at_cancel,
        vec![4],
        "3 settled before the cancel"
    );
}

#[test]
fn presettled_receiver_gets_auto_settled_deliveries() {
    let mut p = Peer::new(true);
    p.open();
    let mut a = attach("rcv", 0, Role::Receiver, Some("q"));
    a.snd_settle_mode = SenderSettleMode::Settled;
    attach_receiver(&mut p, 0, a);
    assert!(p.log().consumers[0].auto_settle);
    p.send(0, &flow(0, 0, 1, false), &[]);
    p.event(delivery(1, 1, b"m"));
    let out = p.perfs();
    let Performative::Transfer(t) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(t.settled, Some(true));
}

#[test]
fn topic_subscriptions_plain_durable_and_dynamic() {
    let mut p = Peer::new(true);
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    p.send(0, &open("app"), &[]);
    p.send(0, &begin(), &[]);
    p.recv();
    // Bare address with the JMS `topic` capability.
    let mut a = attach("sub", 0, Role::Receiver, Some("a/+"));
    if let Some(src) = a.source.as_mut() {
        src.capabilities = Some(Array(vec![Symbol::from("topic")]));
    }
    attach_receiver(&mut p, 0, a);
    // Durable terminus.
    let mut a = attach("dur", 1, Role::Receiver, Some("/topic/b"));
    if let Some(src) = a.source.as_mut() {
        src.durable = TerminusDurability::UnsettledState;
    }
    attach_receiver(&mut p, 1, a);
    // Dynamic node.
    let mut a = attach("tmp", 2, Role::Receiver, None);
    if let Some(src) = a.source.as_mut() {
        src.dynamic = true;
    }
    let reply = attach_receiver(&mut p, 2, a);
    assert_eq!(
        reply.source.unwrap().address.as_deref(),
        Some("/queue/$temp/2")
    );
    {
        let log = p.log();
        assert_eq!(log.declared[0].name, None);
        assert_eq!(log.declared[0].lifetime, QueueLifetime::Consumer);
        assert_eq!(log.declared[1].name.as_deref(), Some("$durable/app/dur"));
        assert!(log.declared[1].durable);
        assert_eq!(log.declared[1].lifetime, QueueLifetime::Permanent);
        assert_eq!(log.declared[2].lifetime, QueueLifetime::Session);
        assert_eq!(
            log.bound,
            vec![
                ("$temp/1".to_string(), "a/+".to_string()),
                ("$durable/app/dur".to_string(), "b".to_string())
            ]
        );
    }
    // Closing the durable link (JMS unsubscribe) deletes its queue;
    // a plain detach would keep it.
    p.send(0, &detach(1, true), &[]);
    assert_eq!(p.log().deleted, vec!["$durable/app/dur".to_string()]);
}

#[test]
fn unsettled_deliveries_cap_the_credit() {
    let mut p = Peer::opened(|c| c.link_credit_max = 3);
    attach_receiver(&mut p, 0, attach("rcv", 0, Role::Receiver, Some("q")));
    p.send(0, &flow(0, 0, 100, false), &[]);
    assert_eq!(p.log().credits.last(), Some(&(ConsumerId(1), 3, false)));
    p.event(delivery(1, 1, b"a"));
    p.event(delivery(1, 2, b"b"));
    p.recv();
    // Two unsettled: a fresh grant of 100 is capped to 1, a limit of 2 + 1
    // in the core's count.
    p.send(0, &flow(0, 2, 100, false), &[]);
    assert_eq!(p.log().credits.last(), Some(&(ConsumerId(1), 3, false)));
}

#[test]
fn deliveries_over_the_receivers_max_message_size_go_back() {
    let mut p = Peer::new(true);
    p.open();
    let mut a = attach("rcv", 0, Role::Receiver, Some("q"));
    a.max_message_size = Some(64);
    attach_receiver(&mut p, 0, a);
    p.send(0, &flow(0, 0, 2, false), &[]);
    static BIG: [u8; 100] = [1u8; 100];
    p.event(delivery(1, 7, &BIG));
    p.event(delivery(1, 8, b"ok"));
    let out = p.perfs();
    assert_eq!(out.len(), 1, "{out:?}");
    let Performative::Transfer(t) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(t.delivery_id, Some(0));
    // The credit the skipped delivery used is handed back to the core: it
    // sent one, and the client's two are still there (limit 1 + 2).
    assert_eq!(p.log().credits.last(), Some(&(ConsumerId(1), 3, false)));
    assert_eq!(
        p.log().settled,
        vec![(
            ConsumerId(1),
            DeliveryTag(7),
            Outcome::Modify {
                delivery_failed: false,
                undeliverable_here: true
            },
            None
        )]
    );
}

#[test]
fn durable_subscription_lookup_without_address() {
    let mut p = Peer::new(true);
    p.open();
    p.send(0, &attach("sub1", 0, Role::Receiver, None), &[]);
    let out = p.perfs();
    // The fake core never has it: refused with not-found, declare undone.
    let Performative::Detach(d) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:not-found"
    );
    assert_eq!(p.log().deleted, vec!["$durable/client-1/sub1".to_string()]);
}

#[test]
fn receiver_on_missing_queue_is_refused_with_not_found() {
    let mut p = Peer::new(true);
    p.open();
    p.send(0, &attach("rcv", 0, Role::Receiver, Some("missing")), &[]);
    let out = p.perfs();
    let Performative::Attach(a) = &out[0] else {
        panic!("{out:?}")
    };
    assert!(a.source.is_none());
    let Performative::Detach(d) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:not-found"
    );
}

#[test]
fn large_delivery_is_split_at_the_peer_max_frame_size() {
    let mut p = Peer::new(true);
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    let mut o = open("c");
    o.max_frame_size = MaxFrameSize(512);
    p.send(0, &o, &[]);
    p.send(0, &begin(), &[]);
    p.recv();
    attach_receiver(&mut p, 0, attach("rcv", 0, Role::Receiver, Some("q")));
    p.send(0, &flow(0, 0, 1, false), &[]);
    static BIG: [u8; 2000] = [9u8; 2000];
    p.event(delivery(1, 1, &BIG));
    let mut rx = Vec::new();
    p.conn.poll_transmit(&mut rx);
    let mut pos = 0;
    let mut payload = Vec::new();
    let mut frames = 0;
    while pos < rx.len() {
        let size = u32::from_be_bytes(rx[pos..pos + 4].try_into().unwrap()) as usize;
        assert!(size <= 512);
        let body = &rx[pos + 8..pos + size];
        let len = codec::value_len(body).unwrap();
        let perf: Performative = codec::decode("p", &body[..len]).unwrap();
        let Performative::Transfer(t) = perf else {
            panic!()
        };
        payload.extend_from_slice(&body[len..]);
        frames += 1;
        pos += size;
        assert_eq!(t.more, pos < rx.len());
    }
    assert!(frames >= 4);
    let m = crate::message::decode(&Bytes::from(payload), 0).unwrap();
    assert_eq!(&m.message.body.bytes[..], &BIG[..]);
    // The next delivery's id follows by one, whatever the frame count.
    p.send(0, &flow(0, 1, 1, false), &[]);
    p.event(delivery(1, 2, b"small"));
    let out = p.perfs();
    let Performative::Transfer(t) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(t.delivery_id, Some(1));
}

#[test]
fn connection_close_returns_everything_to_the_core() {
    let mut p = Peer::new(true);
    p.open();
    attach_receiver(&mut p, 0, attach("rcv", 0, Role::Receiver, Some("q")));
    p.send(0, &Close { error: None }, &[]);
    assert!(matches!(p.perfs()[..], [Performative::Close(_)]));
    assert!(p.conn.is_closed());
    assert_eq!(p.log().closed, Some(CloseKind::Clean));

    let mut p = Peer::new(true);
    p.open();
    p.conn.handle_transport_closed(p.now);
    assert_eq!(p.log().closed, Some(CloseKind::Abnormal));
}

#[test]
fn kicked_session_closes_with_connection_forced() {
    let mut p = Peer::new(true);
    p.open();
    p.event(SessionEvent::Kicked {
        reason: KickReason::TakenOver,
    });
    let out = p.perfs();
    let Some(Performative::Close(c)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(c.error.as_ref().unwrap()),
        "amqp:connection:forced"
    );
}

// ---------------------------------------------------------------- transactions

fn control_payload<T: Serialize>(v: T) -> Vec<u8> {
    let mut p = Vec::new();
    codec::encode_into(&mut p, &AmqpValue(v)).unwrap();
    p
}

#[test]
fn transaction_declare_transfer_discharge() {
    let mut p = Peer::new(true);
    p.open();
    // Coordinator link on handle 0.
    let mut a = attach("txn", 0, Role::Sender, None);
    a.target = Some(Box::new(TargetArchetype::Coordinator(Coordinator::new(
        None,
    ))));
    p.send(0, &a, &[]);
    let out = p.perfs();
    assert!(
        matches!(&out[0], Performative::Attach(r) if matches!(r.target.as_deref(), Some(TargetArchetype::Coordinator(_))))
    );
    // Declare.
    p.send(
        0,
        &transfer(0, 0, false),
        &control_payload(Declare { global_id: None }),
    );
    let out = p.perfs();
    let Performative::Disposition(d) = &out[0] else {
        panic!("{out:?}")
    };
    let Some(DeliveryState::Declared(Declared { txn_id })) = &d.state else {
        panic!("{d:?}")
    };
    let txn_id = txn_id.clone();
    // A transactional send on another link.
    p.send(0, &attach("snd", 1, Role::Sender, Some("q")), &[]);
    p.perfs();
    let mut t = transfer(1, 1, false);
    t.state = Some(DeliveryState::TransactionalState(TransactionalState {
        txn_id: txn_id.clone(),
        outcome: None,
    }));
    p.send(0, &t, &data_payload(b"in txn"));
    let out = p.perfs();
    let Performative::Disposition(d) = &out[0] else {
        panic!("{out:?}")
    };
    assert!(
        matches!(&d.state, Some(DeliveryState::TransactionalState(ts)) if ts.outcome.is_some())
    );
    {
        let log = p.log();
        assert_eq!(log.published[0].2.txn, Some(TxnId(1)));
        assert!(!log.published[0].2.confirm);
    }
    // A transactional send that fails is rejected inside the transaction.
    p.log().publish_error = Some(BrokerError::ResourceLimit("full".into()));
    let mut t = transfer(1, 9, false);
    t.state = Some(DeliveryState::TransactionalState(TransactionalState {
        txn_id: txn_id.clone(),
        outcome: None,
    }));
    p.send(0, &t, &data_payload(b"too much"));
    let out = p.perfs();
    assert!(
        matches!(&out[0], Performative::Disposition(Disposition { state: Some(DeliveryState::TransactionalState(ts)), .. })
            if matches!(ts.outcome, Some(fe2o3_amqp_types::messaging::Outcome::Rejected(_)))),
        "{out:?}"
    );
    p.log().publish_error = None;
    // Discharge: nothing until the commit is durable.
    p.send(
        0,
        &transfer(0, 2, false),
        &control_payload(Discharge {
            txn_id: txn_id.clone(),
            fail: Some(false),
        }),
    );
    assert!(p.perfs().is_empty());
    assert_eq!(p.log().commits, vec![TxnId(1)]);
    p.event(SessionEvent::Committed {
        ticket: Ticket(2),
        result: Ok(()),
    });
    let out = p.perfs();
    let Performative::Disposition(d) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(d.first, 2);
    assert!(matches!(d.state, Some(DeliveryState::Accepted(_))));
    // The txn is gone: discharging it again is unknown-id.
    p.send(
        0,
        &transfer(0, 3, false),
        &control_payload(Discharge {
            txn_id,
            fail: Some(true),
        }),
    );
    assert_eq!(rejection(&p.perfs()), "amqp:transaction:unknown-id");
}

#[test]
fn transactional_acquisition_and_rollback() {
    let mut p = Peer::new(true);
    p.open();
    let txn_id = declare_txn(&mut p);
    attach_receiver(&mut p, 1, attach("rcv", 1, Role::Receiver, Some("q")));
    p.send(0, &flow(1, 0, 1, false), &[]);
    p.event(delivery(1, 5, b"m"));
    p.perfs();
    p.send(0, &txn_accept(0, &txn_id), &[]);
    assert_eq!(
        p.log().settled,
        vec![(
            ConsumerId(1),
            DeliveryTag(5),
            Outcome::Accept,
            Some(TxnId(1))
        )]
    );
    p.send(
        0,
        &transfer(0, 1, false),
        &control_payload(Discharge {
            txn_id,
            fail: Some(true),
        }),
    );
    let out = p.perfs();
    assert!(
        matches!(&out[0], Performative::Disposition(d) if matches!(d.state, Some(DeliveryState::Accepted(_))))
    );
    assert_eq!(p.log().rollbacks, vec![TxnId(1)]);
}

#[test]
fn wants_input_stops_at_the_pending_commit_limit() {
    let mut p = Peer::opened(|c| c.pending_commits_max = 2);
    attach_sender(&mut p, Some("q"));
    p.send(0, &transfer(0, 0, false), &data_payload(b"x"));
    assert!(p.conn.wants_input());
    p.send(0, &transfer(0, 1, false), &data_payload(b"x"));
    assert!(!p.conn.wants_input());
    p.event(SessionEvent::Committed {
        ticket: Ticket(1),
        result: Ok(()),
    });
    assert!(p.conn.wants_input());
}

#[test]
fn errors_in_rejected_carry_descriptions() {
    let e = crate::error::AmqpError::InvalidField("x".into()).to_wire();
    assert!(e.description.unwrap().contains("x"));
    assert!(matches!(e.condition, ErrorCondition::AmqpError(_)));
}

// ---------------------------------------------------------------- robustness

mod prop {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Arbitrary bytes after each handshake stage never panic, and the
        /// output stays well framed.
        #[test]
        fn arbitrary_input_never_panics(
            stage in 0u8..3,
            data in proptest::collection::vec(any::<u8>(), 0..600),
            chunk in 1usize..64,
        ) {
            let mut p = Peer::new(true);
            match stage {
                0 => {}
                1 => p.input(&frame::protocol_header(PROTOCOL_ID_SASL)),
                _ => p.open(),
            }
            for piece in data.chunks(chunk) {
                p.input(piece);
                p.event(delivery(1, 1, b"x"));
            }
            p.advance(Duration::from_secs(120));
            p.recv();
            p.conn.handle_transport_closed(p.now);
            prop_assert!(p.conn.is_closed());
        }

        /// Valid performatives with fuzzed payloads on an open session.
        #[test]
        fn fuzzed_transfer_payloads_never_panic(
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            settled in any::<bool>(),
        ) {
            let mut p = Peer::new(true);
            p.open();
            attach_sender(&mut p, None);
            p.send(0, &transfer(0, 0, settled), &payload);
            p.recv();
            prop_assert!(!p.conn.is_closed());
        }
    }
}

/// This thread's CPU time in ns (Linux schedstat), immune to other load on
/// the machine; falls back to 0 elsewhere.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Engine CPU per message without storage: run with
/// `cargo test --release -p rosetta-amqp engine_cost -- --ignored --nocapture`.
#[test]
#[ignore]
fn engine_cost_per_message() {
    const N: u32 = 100_000;
    let body = vec![0x5au8; 1024];
    let mut p = Peer::opened(|c| {
        c.sender_credit_window = N + 1;
        c.link_credit_max = N + 1;
    });
    attach_sender(&mut p, Some("q"));
    let payload = data_payload(&body);
    // 10 000 encoded transfers fed 10 times: delivery ids repeat, which the
    // engine does not mind, and the test's own memory stays small.
    let mut wire = Vec::new();
    for id in 0..N / 10 {
        write_perf(&mut wire, 0, &transfer(0, id, false), &payload);
    }
    let start = thread_cpu_ns();
    for _ in 0..10 {
        for chunk in wire.chunks(64 * 1024) {
            p.conn.handle_input(p.now, chunk);
            p.log().published.clear();
        }
    }
    let input_only = thread_cpu_ns() - start;
    for t in 1..=u64::from(N) {
        p.conn.handle_event(
            p.now,
            SessionEvent::Committed {
                ticket: Ticket(t),
                result: Ok(()),
            },
        );
    }
    let mut out = Vec::new();
    p.conn.poll_transmit(&mut out);
    let publish = thread_cpu_ns() - start;

    attach_receiver(&mut p, 1, attach("rcv", 1, Role::Receiver, Some("q")));
    p.send(0, &flow(1, 0, N, false), &[]);
    let msg = Arc::new(Message::binary(Bytes::from(body)));
    let mut acks = Vec::new();
    for id in 0..N {
        write_perf(
            &mut acks,
            0,
            &Disposition {
                role: Role::Receiver,
                first: id,
                last: None,
                settled: true,
                state: Some(DeliveryState::Accepted(Accepted {})),
                batchable: false,
            },
            &[],
        );
    }
    let start = thread_cpu_ns();
    let mut out = Vec::new();
    for tag in 0..u64::from(N) {
        p.conn.handle_event(
            p.now,
            SessionEvent::Delivery(Delivery {
                consumer: ConsumerId(1),
                tag: DeliveryTag(tag),
                message: msg.clone(),
                delivery_count: 0,
                redelivered: false,
                from_retained: false,
                matched: MatchInfo::default(),
                annotation: None,
                charge: rosetta_neutral::DeliveryCharge::none(),
                stream: None,
            }),
        );
        if tag % 100 == 99 {
            out.clear();
            p.conn.poll_transmit(&mut out);
        }
    }
    for chunk in acks.chunks(64 * 1024) {
        p.conn.handle_input(p.now, chunk);
        if p.log().settled.len() > 10_000 {
            p.log().settled.clear();
        }
    }
    let deliver = thread_cpu_ns() - start;
    println!(
        "CPU: publish (unsettled, 1 KiB, incl. commit+disposition): {:.2} us/msg ({:.2} of it input); deliver+accept: {:.2} us/msg",
        publish as f64 / 1e3 / f64::from(N),
        input_only as f64 / 1e3 / f64::from(N),
        deliver as f64 / 1e3 / f64::from(N)
    );
}

#[test]
fn connection_is_send_for_the_driver_task() {
    fn assert_send<T: Send>() {}
    assert_send::<AmqpConnection>();
}

#[test]
fn poll_transmit_appends_to_a_non_empty_buffer() {
    let mut p = Peer::new(true);
    p.input(&frame::protocol_header(PROTOCOL_ID_AMQP));
    let mut out = b"prefix".to_vec();
    p.conn.poll_transmit(&mut out);
    assert_eq!(&out[..6], b"prefix");
    assert_eq!(&out[6..], &frame::protocol_header(PROTOCOL_ID_AMQP));
    let mut again = Vec::new();
    p.conn.poll_transmit(&mut again);
    assert!(again.is_empty());
}

#[test]
fn pipelined_sasl_and_open_in_one_read() {
    // What Proton sends before reading anything back.
    let mut wire = frame::protocol_header(PROTOCOL_ID_SASL).to_vec();
    write_frame(
        &mut wire,
        FRAME_TYPE_SASL,
        0,
        &plain("alice", PASSWORD),
        &[],
    );
    wire.extend_from_slice(&frame::protocol_header(PROTOCOL_ID_AMQP));
    write_perf(&mut wire, 0, &open("c"), &[]);
    write_perf(&mut wire, 0, &begin(), &[]);
    write_perf(&mut wire, 0, &attach("s", 0, Role::Sender, Some("q")), &[]);
    let mut p = Peer::new(false);
    p.input(&wire);
    let out = p.recv();
    assert!(matches!(out[0], Out::Header(PROTOCOL_ID_SASL)));
    assert_eq!(sasl_outcome(&out).code, SaslCode::Ok);
    let perfs = performatives_of(&out);
    assert!(matches!(
        perfs[..],
        [
            Performative::Open(_),
            Performative::Begin(_),
            Performative::Attach(_),
            Performative::Flow(_)
        ]
    ));
}

// ---------------------------------------------------------------- SASL PLAIN waiting for its check

/// What Proton sends before reading anything back: SASL header, PLAIN,
/// AMQP header, Open, Begin.
fn pipelined_plain_open_begin(user: &str, password: &str) -> Vec<u8> {
    let mut wire = frame::protocol_header(PROTOCOL_ID_SASL).to_vec();
    write_frame(&mut wire, FRAME_TYPE_SASL, 0, &plain(user, password), &[]);
    wire.extend_from_slice(&frame::protocol_header(PROTOCOL_ID_AMQP));
    write_perf(&mut wire, 0, &open("c"), &[]);
    write_perf(&mut wire, 0, &begin(), &[]);
    wire
}

fn deferring() -> Peer {
    let p = Peer::new(false);
    p.log().logins.defer_passwords = true;
    p
}

fn alice() -> Principal {
    Principal {
        user: Some("alice".into()),
    }
}

#[test]
fn frames_pipelined_behind_plain_wait_for_the_password_check() {
    let mut p = deferring();
    p.input(&pipelined_plain_open_begin("alice", PASSWORD));
    let out = p.recv();
    // The SASL header and mechanisms go out; no outcome, nothing else.
    assert!(
        matches!(out[..], [Out::Header(PROTOCOL_ID_SASL), Out::Sasl(_)]),
        "{out:?}"
    );
    assert!(!p.conn.wants_input());
    assert!(p.log().sessions.is_empty());
    assert_eq!(p.log().logins.pending.len(), 1);
    assert_eq!(p.log().logins.pending[0].user(), Some("alice"));

    p.event(SessionEvent::LoginChecked {
        result: Ok(alice()),
    });
    let out = p.recv();
    assert_eq!(sasl_outcome(&out).code, SaslCode::Ok);
    assert!(out
        .iter()
        .any(|o| matches!(o, Out::Header(PROTOCOL_ID_AMQP))));
    let perfs = performatives_of(&out);
    assert!(
        matches!(perfs[..], [Performative::Open(_), Performative::Begin(_)]),
        "{perfs:?}"
    );
    assert!(p.conn.wants_input());
    assert_eq!(p.log().sessions[0].principal, alice());
}

#[test]
fn a_refused_password_check_is_outcome_auth_and_nothing_after_it_runs() {
    let mut p = deferring();
    p.input(&pipelined_plain_open_begin("alice", "nope"));
    p.recv();
    p.event(SessionEvent::LoginChecked {
        result: Err(AuthError::BadCredentials),
    });
    let out = p.recv();
    assert_eq!(sasl_outcome(&out).code, SaslCode::Auth);
    assert!(!out.iter().any(|o| matches!(o, Out::Perf(..))), "{out:?}");
    assert!(p.conn.is_closed());
    assert!(p.log().sessions.is_empty());
}

#[test]
fn a_full_check_queue_is_outcome_sys_temp() {
    let mut p = Peer::new(false);
    p.log().logins.refuse_all = Some(AuthError::ServerBusy);
    p.input(&pipelined_plain_open_begin("alice", PASSWORD));
    assert_eq!(sasl_outcome(&p.recv()).code, SaslCode::SysTemp);
    assert!(p.conn.is_closed());
}

#[test]
fn a_connection_closed_while_its_password_check_is_pending_does_no_harm() {
    let mut p = deferring();
    p.input(&pipelined_plain_open_begin("alice", PASSWORD));
    p.recv();
    p.conn.handle_transport_closed(p.now);
    p.event(SessionEvent::LoginChecked {
        result: Ok(alice()),
    });
    assert!(p.recv().is_empty());
    assert!(p.log().sessions.is_empty());
    let Peer { conn, log, .. } = p;
    drop(conn);
    let check = log.lock().unwrap().logins.pending.pop().unwrap();
    assert!(check.is_abandoned());
    check.finish(Ok(alice()));
}

#[test]
fn the_handshake_deadline_runs_while_the_password_check_is_pending() {
    let mut p = deferring();
    p.input(&pipelined_plain_open_begin("alice", PASSWORD));
    p.recv();
    let due = p
        .conn
        .poll_timeout()
        .expect("the handshake deadline is armed");
    p.advance(due - p.now + Duration::from_millis(1));
    assert!(p.conn.is_closed());
    p.event(SessionEvent::LoginChecked {
        result: Ok(alice()),
    });
    assert!(p.recv().is_empty());
    assert!(p.log().sessions.is_empty());
}

// ---------------------------------------------------------------- rcv-settle-mode second

/// A payload: header with `durable` set, then `body` as one data section.
fn durable_data(body: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    codec::encode_into(
        &mut payload,
        &fe2o3_amqp_types::messaging::Header {
            durable: true,
            ..Default::default()
        },
    )
    .unwrap();
    payload.extend(data_payload(body));
    payload
}

fn sender_settles(first: u32, last: Option<u32>) -> Disposition {
    Disposition {
        role: Role::Sender,
        first,
        last,
        settled: true,
        state: Some(DeliveryState::Accepted(Accepted {})),
        batchable: false,
    }
}

#[test]
fn receiver_settle_mode_second_for_a_client_sender() {
    let mut p = Peer::opened(|c| c.sender_credit_window = 4);
    let mut a = attach("snd", 0, Role::Sender, Some("/queue/q"));
    a.rcv_settle_mode = ReceiverSettleMode::Second;
    p.send(0, &a, &[]);
    let out = p.perfs();
    let Performative::Attach(reply) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(reply.rcv_settle_mode, ReceiverSettleMode::Second);
    assert!(matches!(&out[1], Performative::Flow(f) if f.link_credit == Some(4)));

    for id in 0..4 {
        p.send(0, &transfer(0, id, false), &durable_data(b"m"));
    }
    assert!(p.perfs().is_empty(), "nothing before the commits");
    for t in 1..=4 {
        p.event(SessionEvent::Committed {
            ticket: Ticket(t),
            result: Ok(()),
        });
    }
    // Accepted once durable, but not settled: the sender settles first.
    // Credit comes back with the commits, not with the sender's settlement
    // (a sender that never settles must not stall; see on_disposition).
    let out = p.perfs();
    let dispositions: Vec<&Disposition> = out
        .iter()
        .filter_map(|p| match p {
            Performative::Disposition(d) => Some(d),
            _ => None,
        })
        .collect();
    let [d] = dispositions[..] else {
        panic!("{out:?}")
    };
    assert_eq!((d.first, d.last, d.settled), (0, Some(3), false));
    assert!(matches!(d.state, Some(DeliveryState::Accepted(_))));
    let last_credit = out.iter().rev().find_map(|p| match p {
        Performative::Flow(f) => f.link_credit,
        _ => None,
    });
    assert_eq!(last_credit, Some(4), "{out:?}");

    // The sender's settlement needs no answer, even for ids we never knew.
    p.send(0, &sender_settles(0, Some(3)), &[]);
    p.send(0, &sender_settles(900, None), &[]);
    assert!(p.perfs().is_empty());

    // A refused message is answered unsettled as well.
    p.log().publish_error = Some(BrokerError::ResourceLimit("full".into()));
    p.send(0, &transfer(0, 4, false), &durable_data(b"m"));
    let out = p.perfs();
    assert!(
        out.iter().any(|p| matches!(p, Performative::Disposition(d)
            if d.first == 4 && !d.settled && matches!(d.state, Some(DeliveryState::Rejected(_))))),
        "{out:?}"
    );
}

#[test]
fn mode_first_sender_gets_settled_dispositions() {
    let mut p = Peer::new(true);
    p.open();
    let a = attach("snd", 0, Role::Sender, Some("/queue/q"));
    p.send(0, &a, &[]);
    let out = p.perfs();
    assert!(
        matches!(&out[0], Performative::Attach(r) if r.rcv_settle_mode == ReceiverSettleMode::First)
    );
    p.send(0, &transfer(0, 0, false), &durable_data(b"m"));
    p.event(SessionEvent::Committed {
        ticket: Ticket(1),
        result: Ok(()),
    });
    let out = p.perfs();
    assert!(
        matches!(&out[..], [Performative::Disposition(d)] if d.settled),
        "{out:?}"
    );
}

#[test]
fn unsettled_receiver_outcome_is_settled_by_the_broker() {
    let mut p = Peer::new(true);
    p.open();
    let mut a = attach("rcv", 0, Role::Receiver, Some("/queue/q"));
    a.rcv_settle_mode = ReceiverSettleMode::Second;
    let reply = attach_receiver(&mut p, 0, a);
    assert_eq!(reply.rcv_settle_mode, ReceiverSettleMode::Second);
    p.send(0, &flow(0, 0, 10, false), &[]);
    p.event(delivery(1, 42, b"a"));
    p.event(delivery(1, 43, b"b"));
    assert_eq!(p.perfs().len(), 2);
    // The receiver states its outcome but does not settle (mode second).
    for (id, state) in [
        (0, DeliveryState::Accepted(Accepted {})),
        (1, DeliveryState::Released(Released {})),
    ] {
        p.send(
            0,
            &Disposition {
                role: Role::Receiver,
                first: id,
                last: None,
                settled: false,
                state: Some(state),
                batchable: false,
            },
            &[],
        );
    }
    assert_eq!(
        p.log().settled,
        vec![
            (ConsumerId(1), DeliveryTag(42), Outcome::Accept, None),
            (ConsumerId(1), DeliveryTag(43), Outcome::Release, None)
        ]
    );
    // We settle each, repeating the outcome.
    let out = p.perfs();
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(matches!(&out[0], Performative::Disposition(d)
        if d.role == Role::Sender && d.settled && d.first == 0
            && matches!(d.state, Some(DeliveryState::Accepted(_)))));
    assert!(matches!(&out[1], Performative::Disposition(d)
        if d.role == Role::Sender && d.settled && d.first == 1
            && matches!(d.state, Some(DeliveryState::Released(_)))));
    // A settled outcome needs no answer; a non-terminal state is no outcome.
    p.event(delivery(1, 44, b"c"));
    p.perfs();
    p.send(
        0,
        &Disposition {
            role: Role::Receiver,
            first: 2,
            last: None,
            settled: false,
            state: Some(DeliveryState::Received(
                fe2o3_amqp_types::messaging::Received {
                    section_number: 0,
                    section_offset: 0,
                },
            )),
            batchable: false,
        },
        &[],
    );
    assert!(p.perfs().is_empty());
    assert_eq!(p.log().settled.len(), 2);
}

// ---------------------------------------------------------------- transactional acquisition

/// Attaches a coordinator on handle 0 and declares; returns the txn-id.
fn declare_txn(p: &mut Peer) -> Binary {
    let mut a = attach("txn", 0, Role::Sender, None);
    a.target = Some(Box::new(TargetArchetype::Coordinator(Coordinator::new(
        None,
    ))));
    p.send(0, &a, &[]);
    p.perfs();
    p.send(
        0,
        &transfer(0, 0, false),
        &control_payload(Declare { global_id: None }),
    );
    let out = p.perfs();
    let Performative::Disposition(Disposition {
        state: Some(DeliveryState::Declared(Declared { txn_id })),
        ..
    }) = &out[0]
    else {
        panic!("{out:?}")
    };
    txn_id.clone()
}

fn txn_flow(handle: u32, credit: u32, txn_id: Option<&Binary>) -> Flow {
    let mut f = flow(handle, 0, credit, false);
    let mut props = fe2o3_amqp_types::definitions::Fields::new();
    if let Some(id) = txn_id {
        props.insert(
            Symbol::from("txn-id"),
            fe2o3_amqp_types::primitives::Value::Binary(id.clone()),
        );
    }
    f.properties = Some(props);
    f
}

#[test]
fn flow_txn_id_acquires_and_rollback_returns_the_messages() {
    let mut p = Peer::new(true);
    p.open();
    let txn_id = declare_txn(&mut p);
    attach_receiver(&mut p, 1, attach("rcv", 1, Role::Receiver, Some("q")));
    p.send(0, &txn_flow(1, 2, Some(&txn_id)), &[]);
    p.event(delivery(1, 5, b"a"));
    p.event(delivery(1, 6, b"b"));
    let out = p.perfs();
    assert_eq!(out.len(), 2, "{out:?}");
    for perf in &out {
        let Performative::Transfer(t) = perf else {
            panic!("{out:?}")
        };
        let Some(DeliveryState::TransactionalState(ts)) = &t.state else {
            panic!("acquired under the transaction: {t:?}")
        };
        assert_eq!(ts.txn_id, txn_id);
        assert!(ts.outcome.is_none());
    }
    // A plain top-up (no properties) keeps the association.
    p.send(0, &flow(1, 2, 1, false), &[]);
    p.event(delivery(1, 7, b"c"));
    let out = p.perfs();
    assert!(
        matches!(&out[..], [Performative::Transfer(t)] if matches!(t.state, Some(DeliveryState::TransactionalState(_)))),
        "{out:?}"
    );
    // One accepted inside the transaction, then it rolls back.
    p.send(0, &txn_accept(0, &txn_id), &[]);
    p.send(
        0,
        &transfer(0, 1, false),
        &control_payload(Discharge {
            txn_id: txn_id.clone(),
            fail: Some(true),
        }),
    );
    let out = p.perfs();
    assert!(
        matches!(&out[0], Performative::Disposition(d) if matches!(d.state, Some(DeliveryState::Accepted(_)))),
        "{out:?}"
    );
    let failed = Outcome::Modify {
        delivery_failed: true,
        undeliverable_here: false,
    };
    let mut returned: Vec<u64> = p
        .log()
        .settled
        .iter()
        .filter(|s| s.2 == failed && s.3.is_none())
        .map(|s| s.1 .0)
        .collect();
    returned.sort_unstable();
    returned.dedup();
    assert_eq!(returned, vec![5, 6, 7], "every acquired message goes back");
    // The link forgot them: a late disposition settles nothing more.
    let before = p.log().settled.len();
    p.send(
        0,
        &Disposition {
            role: Role::Receiver,
            first: 1,
            last: Some(2),
            settled: true,
            state: Some(DeliveryState::Accepted(Accepted {})),
            batchable: false,
        },
        &[],
    );
    assert_eq!(p.log().settled.len(), before);
    // The transaction is gone: deliveries go out plain again.
    p.send(0, &flow(1, 3, 1, false), &[]);
    p.event(delivery(1, 8, b"d"));
    let out = p.perfs();
    assert!(
        matches!(&out[..], [Performative::Transfer(t)] if t.state.is_none()),
        "{out:?}"
    );
}

#[test]
fn flow_properties_without_txn_id_end_the_acquisition_and_unknown_ids_detach() {
    let mut p = Peer::new(true);
    p.open();
    let txn_id = declare_txn(&mut p);
    attach_receiver(&mut p, 1, attach("rcv", 1, Role::Receiver, Some("q")));
    p.send(0, &txn_flow(1, 1, Some(&txn_id)), &[]);
    p.send(0, &txn_flow(1, 1, None), &[]);
    p.event(delivery(1, 5, b"a"));
    let out = p.perfs();
    assert!(
        matches!(&out[..], [Performative::Transfer(t)] if t.state.is_none()),
        "{out:?}"
    );
    let unknown = Binary::from(vec![9u8; 8]);
    p.send(0, &txn_flow(1, 1, Some(&unknown)), &[]);
    let out = p.perfs();
    let Some(Performative::Detach(d)) = out.first() else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:transaction:unknown-id"
    );
}

#[test]
fn open_transactions_per_connection_are_limited() {
    let mut p = Peer::new(true);
    p.open();
    declare_txn(&mut p);
    for id in 1..crate::coordinator::TXNS_PER_CONNECTION_MAX as u32 {
        p.send(
            0,
            &transfer(0, id, false),
            &control_payload(Declare { global_id: None }),
        );
    }
    p.perfs();
    let id = crate::coordinator::TXNS_PER_CONNECTION_MAX as u32;
    p.send(
        0,
        &transfer(0, id, false),
        &control_payload(Declare { global_id: None }),
    );
    let out = p.perfs();
    assert!(
        out.iter()
            .any(|perf| matches!(perf, Performative::Disposition(d)
            if d.first == id && matches!(&d.state, Some(DeliveryState::Rejected(r))
                if condition_symbol(r.error.as_ref().unwrap()) == "amqp:resource-limit-exceeded"))),
        "{out:?}"
    );
}

#[test]
fn reattach_with_an_unsettled_map_resumes_nothing() {
    // Spec 2.6.13: we keep no delivery state across links, so the reply's
    // map is null and complete; what the old link left unsettled went back
    // to the queue when it detached and is delivered anew.
    let mut p = Peer::new(true);
    p.open();
    let mut a = attach("rcv", 0, Role::Receiver, Some("/queue/q"));
    let mut map = fe2o3_amqp_types::primitives::OrderedMap::new();
    map.insert(
        Binary::from(vec![1u8; 8]),
        Some(DeliveryState::Received(
            fe2o3_amqp_types::messaging::Received {
                section_number: 0,
                section_offset: 0,
            },
        )),
    );
    a.unsettled = Some(map);
    a.incomplete_unsettled = true;
    let reply = attach_receiver(&mut p, 0, a);
    assert_eq!(reply.unsettled, None);
    assert!(!reply.incomplete_unsettled);
    assert_eq!(p.log().consumers.len(), 1, "a plain consumer");
}

#[test]
fn jms_subscription_links_map_to_queues() {
    let mut p = Peer::new(true);
    p.open();
    let topic = |name: &str, h: u32, durable: bool, caps: &[&str]| {
        let mut a = attach(name, h, Role::Receiver, Some("/topic/t"));
        let src = a.source.as_mut().unwrap();
        src.capabilities = Some(Array(caps.iter().map(|c| Symbol::from(*c)).collect()));
        if durable {
            src.durable = TerminusDurability::UnsettledState;
        }
        a
    };
    let cases = [
        (topic("s", 0, true, &["topic"]), Some("$durable/client-1/s")),
        (
            topic("s|2", 1, true, &["topic", "shared"]),
            Some("$durable/client-1/s"),
        ),
        (
            topic("g|global2", 2, true, &["topic", "shared", "global"]),
            Some("$share/$jms/g"),
        ),
        (
            topic("v|volatile1", 3, false, &["topic", "shared"]),
            Some("$durable/client-1/v|volatile"),
        ),
        (
            topic(
                "w|global-volatile1",
                4,
                false,
                &["topic", "shared", "global"],
            ),
            Some("$share/$jms-volatile/w"),
        ),
        // Not shared: the link name is kept whole, '|' and all.
        (
            topic("x|y", 5, true, &["topic"]),
            Some("$durable/client-1/x|y"),
        ),
        (topic("plain", 6, false, &["topic"]), None),
    ];
    for (a, want) in cases {
        let before = p.log().declared.len();
        attach_receiver(&mut p, a.handle.0, a);
        let log = p.log();
        assert_eq!(log.declared.len(), before + 1);
        assert_eq!(log.declared[before].name.as_deref(), want);
    }
    // Shared links ask for SHARED-SUBS on the link too and get it offered.
    let mut a = topic("z|volatile1", 7, false, &["topic", "shared"]);
    a.desired_capabilities = Some(Array(vec![Symbol::from("SHARED-SUBS")]));
    let reply = attach_receiver(&mut p, 7, a);
    assert_eq!(
        reply.offered_capabilities,
        Some(Array(vec![Symbol::from("SHARED-SUBS")]))
    );
}

#[test]
fn null_source_lookup_of_a_missing_subscription() {
    let mut p = Peer::new(true);
    p.open();
    // Qpid JMS unsubscribe of a global shared subscription.
    let mut a = attach("g|global", 0, Role::Receiver, None);
    a.source = None;
    a.desired_capabilities = Some(Array(vec![Symbol::from("shared"), Symbol::from("global")]));
    p.send(0, &a, &[]);
    let out = p.perfs();
    assert!(
        matches!(&out[..], [Performative::Attach(r), Performative::Detach(d)]
            if r.source.is_none() && d.error.is_some()),
        "the fake core never has it: {out:?}"
    );
    assert_eq!(p.log().deleted, vec!["$share/$jms/g".to_string()]);
}

#[test]
fn consumer_closed_by_the_core_detaches_with_resource_deleted() {
    let mut p = Peer::new(true);
    p.open();
    attach_receiver(
        &mut p,
        0,
        attach("rcv", 0, Role::Receiver, Some("/queue/q")),
    );
    p.event(SessionEvent::ConsumerClosed {
        consumer: ConsumerId(1),
        reason: BrokerError::NotFound("queue 'q' was deleted".into()),
    });
    let out = p.perfs();
    let Some(Performative::Detach(d)) = out.first() else {
        panic!("{out:?}")
    };
    assert!(d.closed);
    let e = d.error.as_ref().unwrap();
    assert_eq!(condition_symbol(e), "amqp:resource-deleted");
    assert!(e.description.as_deref().unwrap().contains("was deleted"));
}

#[test]
fn attaching_a_link_name_again_steals_it() {
    let mut p = Peer::new(true);
    p.open();
    attach_receiver(
        &mut p,
        0,
        attach("sub", 0, Role::Receiver, Some("/queue/q")),
    );
    // A sender of the same name is another link (other direction).
    p.send(0, &attach("sub", 1, Role::Sender, Some("/queue/q")), &[]);
    assert!(!p
        .perfs()
        .iter()
        .any(|perf| matches!(perf, Performative::Detach(_))));
    // The same name and direction again, on another handle.
    p.send(0, &attach("sub", 2, Role::Receiver, Some("/queue/q")), &[]);
    let out = p.perfs();
    let Some(Performative::Detach(d)) = out.first() else {
        panic!("{out:?}")
    };
    assert_eq!(d.handle.0, 0);
    assert!(!d.closed, "detached, not closed: the terminus stays");
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:link:stolen"
    );
    assert!(matches!(&out[1], Performative::Attach(a) if a.handle.0 == 2));
    let log = p.log();
    assert_eq!(log.cancelled, vec![ConsumerId(1)]);
    assert!(log.deleted.is_empty());
    drop(log);
    // The client's answering detach is absorbed.
    p.send(0, &detach(0, false), &[]);
    assert!(p.perfs().is_empty());
}
