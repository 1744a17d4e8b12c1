//! An in-memory fake of the core for driving `StompConnection` in tests:
//! records every call, hands out tickets, and lets the test inject events.

// Shared by several test files (dead code), unwraps are test failures, and the
// record enum favours readability over size; `pub` is the test-module norm.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::large_enum_variant
)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rosetta_neutral::*;
use rosetta_stomp::{Decoder, Frame, StompConfig, StompConnection, Version};

/// One recorded call into the fake core.
#[derive(Debug, Clone)]
pub enum Call {
    Open(SessionInfo),
    Declare(QueueSpec),
    Delete(String),
    Bind(String, String),
    Publish(Address, Message, PublishOptions),
    Consume(ConsumerSpec, ConsumerId),
    Cancel(ConsumerId),
    Settle(ConsumerId, DeliveryTag, Outcome, Option<TxnId>, bool),
    SettleMany(Vec<(ConsumerId, DeliveryTag)>, Outcome),
    Begin(TxnId),
    Commit(TxnId),
    Rollback(TxnId),
    Close(CloseKind),
}

#[derive(Default)]
pub struct Inner {
    pub calls: Vec<Call>,
    next: u64,
    pub blocked: bool,
    /// Tickets handed out, in order.
    pub tickets: Vec<Ticket>,
    /// How logins are answered (deferred, refused, or by the fake).
    pub logins: login::ScriptedLogins,
}

impl Inner {
    fn next(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

#[derive(Default, Clone)]
pub struct FakeBroker(pub Arc<Mutex<Inner>>);

impl Broker for FakeBroker {
    fn authenticate(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<Principal, AuthError> {
        match (user, password) {
            (None, _) => Ok(Principal::anonymous()),
            (Some("guest"), Some(b"guest")) => Ok(Principal {
                user: Some("guest".into()),
            }),
            _ => Err(AuthError::BadCredentials),
        }
    }
    fn scram_credentials(&self, _user: &str) -> Option<ScramCredentials> {
        None
    }
    fn anonymous_allowed(&self) -> bool {
        true
    }
    fn authenticate_certificate(&self, _subject: &str) -> Result<Principal, AuthError> {
        Err(AuthError::BadCredentials)
    }
    fn start_login(&self, credentials: Credentials<'_>, sink: &Arc<dyn EventSink>) -> LoginStart {
        let scripted = self.0.lock().unwrap().logins.start(&credentials, sink);
        scripted.unwrap_or_else(|| login::answer_now(self, &credentials))
    }
    fn open_session(&self, info: SessionInfo, _sink: Arc<dyn EventSink>) -> Box<dyn Session> {
        self.0.lock().unwrap().calls.push(Call::Open(info));
        Box::new(FakeSession(Arc::clone(&self.0)))
    }
}

pub struct FakeSession(Arc<Mutex<Inner>>);

impl FakeSession {
    fn record(&self, call: Call) -> u64 {
        let mut inner = self.0.lock().unwrap();
        inner.calls.push(call);
        inner.next()
    }
}

impl Session for FakeSession {
    fn declare_queue(&mut self, spec: QueueSpec) -> Result<QueueInfo, BrokerError> {
        let n = self.record(Call::Declare(spec.clone()));
        Ok(QueueInfo {
            name: spec.name.unwrap_or_else(|| format!("$temp/gen-{n}")),
            existed: false,
            depth: 0,
        })
    }
    fn delete_queue(&mut self, name: &str) -> Result<(), BrokerError> {
        self.record(Call::Delete(name.into()));
        Ok(())
    }
    fn bind(
        &mut self,
        queue: &str,
        filter: &str,
        _o: BindingOptions,
    ) -> Result<BindInfo, BrokerError> {
        self.record(Call::Bind(queue.into(), filter.into()));
        Ok(BindInfo {
            existed: false,
            retained_sent: 0,
        })
    }
    fn unbind(&mut self, _queue: &str, _filter: &str) -> Result<bool, BrokerError> {
        Ok(true)
    }
    fn publish(
        &mut self,
        address: &Address,
        message: Message,
        options: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError> {
        let n = self.record(Call::Publish(address.clone(), message, options));
        let pending = options.confirm.then_some(Ticket(n));
        self.0.lock().unwrap().tickets.extend(pending);
        Ok(PublishReceipt { routed: 1, pending })
    }
    fn consume(&mut self, spec: ConsumerSpec) -> Result<ConsumerId, BrokerError> {
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
        let mut inner = self.0.lock().unwrap();
        let id = ConsumerId(inner.next());
        inner.calls.push(Call::Consume(spec, id));
        Ok(id)
    }
    fn cancel(&mut self, consumer: ConsumerId) -> Result<(), BrokerError> {
        self.record(Call::Cancel(consumer));
        Ok(())
    }
    fn set_credit(
        &mut self,
        _c: ConsumerId,
        _credit: u32,
        _drain: bool,
    ) -> Result<(), BrokerError> {
        Ok(())
    }
    fn settle(
        &mut self,
        consumer: ConsumerId,
        tag: DeliveryTag,
        outcome: Outcome,
        txn: Option<TxnId>,
        confirm: bool,
    ) -> Result<Option<Ticket>, BrokerError> {
        let n = self.record(Call::Settle(consumer, tag, outcome, txn, confirm));
        let pending = confirm.then_some(Ticket(n));
        self.0.lock().unwrap().tickets.extend(pending);
        Ok(pending)
    }

    fn settle_many(
        &mut self,
        deliveries: &[(ConsumerId, DeliveryTag)],
        outcome: Outcome,
    ) -> Result<usize, BrokerError> {
        self.record(Call::SettleMany(deliveries.to_vec(), outcome));
        Ok(deliveries.len())
    }
    fn annotate(&mut self, _c: ConsumerId, _t: DeliveryTag, _a: Bytes) -> Result<(), BrokerError> {
        Ok(())
    }
    fn begin(&mut self) -> TxnId {
        let mut inner = self.0.lock().unwrap();
        let id = TxnId(inner.next());
        inner.calls.push(Call::Begin(id));
        id
    }
    fn commit(&mut self, txn: TxnId) -> Result<Ticket, BrokerError> {
        let ticket = Ticket(self.record(Call::Commit(txn)));
        self.0.lock().unwrap().tickets.push(ticket);
        Ok(ticket)
    }
    fn rollback(&mut self, txn: TxnId) -> Result<(), BrokerError> {
        self.record(Call::Rollback(txn));
        Ok(())
    }
    fn get_state(&mut self, _key: &str) -> Option<Bytes> {
        None
    }
    fn put_state(
        &mut self,
        _key: &str,
        _value: Option<Bytes>,
    ) -> Result<Option<Ticket>, BrokerError> {
        Ok(None)
    }
    fn set_will(&mut self, _will: Option<Will>) -> Result<(), BrokerError> {
        Ok(())
    }
    fn producer_blocked(&self) -> bool {
        self.0.lock().unwrap().blocked
    }
    fn resume_deliveries(&mut self) {}

    fn close(&mut self, kind: CloseKind) {
        self.record(Call::Close(kind));
    }
}

#[derive(Default)]
pub struct NullSink;

impl EventSink for NullSink {
    fn send(&self, _event: SessionEvent) {}
}

/// A connection, the fake core behind it, a virtual clock and a client-side
/// decoder for what the server writes.
pub struct Harness {
    pub conn: StompConnection,
    pub broker: FakeBroker,
    pub now: Instant,
    client: Decoder,
}

impl Harness {
    pub fn new() -> Self {
        Self::with_config(StompConfig::default())
    }

    pub fn with_config(config: StompConfig) -> Self {
        let broker = FakeBroker::default();
        let now = Instant::now();
        let limits = config.limits();
        let conn =
            StompConnection::new(config, Arc::new(broker.clone()), Arc::new(NullSink), 7, now);
        Self {
            conn,
            broker,
            now,
            client: Decoder::new(limits, Version::V1_0),
        }
    }

    pub fn input(&mut self, bytes: &[u8]) {
        self.conn.handle_input(self.now, bytes);
    }

    pub fn event(&mut self, event: SessionEvent) {
        self.conn.handle_event(self.now, event);
    }

    pub fn advance_ms(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        self.conn.handle_timeout(self.now);
    }

    /// Raw bytes the server wrote since the last call.
    pub fn raw_output(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.conn.poll_transmit(&mut out);
        out
    }

    /// Frames the server wrote since the last call.
    pub fn frames(&mut self) -> Vec<Frame> {
        let out = self.raw_output();
        let mut rest = &out[..];
        let mut frames = Vec::new();
        loop {
            let n = self.client.feed(rest);
            rest = &rest[n..];
            while let Some(f) = self.client.decode().unwrap() {
                if f.command == rosetta_stomp::Command::Connected {
                    if let Some(v) = f.header("version").and_then(Version::parse) {
                        self.client.set_version(v);
                    }
                }
                frames.push(f);
            }
            if rest.is_empty() {
                return frames;
            }
        }
    }

    /// The single frame written since the last call.
    pub fn frame(&mut self) -> Frame {
        let mut frames = self.frames();
        assert_eq!(frames.len(), 1, "expected one frame, got {frames:?}");
        frames.remove(0)
    }

    /// Connects with `accept-version` (and extra header lines) and returns CONNECTED.
    pub fn connect(&mut self, versions: &str, extra: &str) -> Frame {
        self.input(format!("CONNECT\naccept-version:{versions}\nhost:h\n{extra}\n\0").as_bytes());
        let f = self.frame();
        assert_eq!(f.command, rosetta_stomp::Command::Connected, "{f:?}");
        self.take_calls();
        f
    }

    /// Tickets the fake core handed out so far.
    pub fn tickets(&self) -> Vec<Ticket> {
        self.broker.0.lock().unwrap().tickets.clone()
    }

    /// Reports `ticket` as durably committed.
    pub fn commit(&mut self, ticket: Ticket) {
        self.event(SessionEvent::Committed {
            ticket,
            result: Ok(()),
        });
    }

    pub fn calls(&self) -> Vec<Call> {
        self.broker.0.lock().unwrap().calls.clone()
    }

    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.broker.0.lock().unwrap().calls)
    }

    /// A delivery event for `consumer`.
    pub fn deliver(&mut self, consumer: u64, tag: u64, message: Message) {
        self.event(SessionEvent::Delivery(delivery(
            consumer, tag, message, 0, false,
        )));
    }
}

pub fn delivery(
    consumer: u64,
    tag: u64,
    message: Message,
    count: u32,
    redelivered: bool,
) -> Delivery {
    Delivery {
        consumer: ConsumerId(consumer),
        tag: DeliveryTag(tag),
        message: Arc::new(message),
        delivery_count: count,
        redelivered,
        from_retained: false,
        matched: MatchInfo::default(),
        annotation: None,
        charge: rosetta_neutral::DeliveryCharge::none(),
        stream: None,
    }
}

/// The consumer id and spec of the last Consume call.
pub fn last_consumer(calls: &[Call]) -> (u64, ConsumerSpec) {
    calls
        .iter()
        .rev()
        .find_map(|c| match c {
            Call::Consume(spec, id) => Some((id.0, spec.clone())),
            _ => None,
        })
        .expect("no consume call")
}
