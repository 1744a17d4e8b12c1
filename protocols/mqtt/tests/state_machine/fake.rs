//! An in-memory fake of the broker core: records every call so tests can
//! assert on what the adapter asked for, and keeps queues, state and
//! annotations across connections (a "restart" is a new connection on the
//! same fake). Shared with the fuzz target.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use rosetta_neutral::*;

/// A queue as declared.
#[derive(Debug, Clone)]
pub struct FakeQueue {
    pub durable: bool,
    pub lifetime: QueueLifetime,
    pub bindings: Vec<(String, BindingOptions)>,
    /// The binding cap of the last declare that gave one.
    pub bindings_max: Option<usize>,
}

/// Everything the fake knows and records.
#[derive(Default)]
pub struct FakeState {
    pub users: HashMap<String, Vec<u8>>,
    /// SCRAM-SHA-256 credentials by user.
    pub scram: HashMap<String, ScramCredentials>,
    pub anonymous: bool,
    pub sessions: Vec<SessionInfo>,
    pub queues: HashMap<String, FakeQueue>,
    pub deleted: Vec<String>,
    pub published: Vec<(Address, Message, PublishOptions)>,
    /// `routed` returned by publish.
    pub routed: usize,
    /// Publishes with `confirm` return a pending ticket.
    pub confirm_pending: bool,
    /// `put_state` returns a pending ticket.
    pub state_pending: bool,
    pub next_ticket: u64,
    pub tickets: Vec<Ticket>,
    pub consumers: Vec<(ConsumerId, ConsumerSpec)>,
    pub next_consumer: u64,
    pub cancelled: Vec<ConsumerId>,
    pub settled: Vec<(ConsumerId, DeliveryTag, Outcome)>,
    pub annotations: Vec<(ConsumerId, DeliveryTag, Bytes)>,
    pub kv: HashMap<String, Bytes>,
    pub wills: Vec<Option<Will>>,
    pub closes: Vec<CloseKind>,
    pub fail_publish: Option<BrokerError>,
    pub fail_bind: Option<BrokerError>,
    pub producer_blocked: bool,
    /// How logins are answered (deferred, refused, or by the fake).
    pub logins: login::ScriptedLogins,
    /// What `place_connection` answers (`None`: Local), and what it was asked.
    pub placement: Option<Placement>,
    pub placement_asked: Vec<(Option<String>, Option<String>)>,
}

impl FakeState {
    fn ticket(&mut self) -> Ticket {
        self.next_ticket += 1;
        let t = Ticket(self.next_ticket);
        self.tickets.push(t);
        t
    }
}

/// The fake broker handle.
#[derive(Clone, Default)]
pub struct FakeBroker(pub Arc<Mutex<FakeState>>);

impl FakeBroker {
    pub fn new() -> Self {
        let b = Self::default();
        {
            let mut s = b.state();
            s.anonymous = true;
            s.routed = 1;
            s.users.insert("alice".into(), b"secret".to_vec());
        }
        b
    }

    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl Broker for FakeBroker {
    fn authenticate(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<Principal, AuthError> {
        let s = self.state();
        match user {
            None if s.anonymous => Ok(Principal::anonymous()),
            None => Err(AuthError::AnonymousDisabled),
            Some(u) => match s.users.get(u) {
                Some(p) if Some(p.as_slice()) == password => Ok(Principal {
                    user: Some(u.into()),
                }),
                _ => Err(AuthError::BadCredentials),
            },
        }
    }

    fn scram_credentials(&self, user: &str) -> Option<ScramCredentials> {
        self.state().scram.get(user).cloned()
    }

    fn anonymous_allowed(&self) -> bool {
        self.state().anonymous
    }

    fn authenticate_certificate(&self, _subject: &str) -> Result<Principal, AuthError> {
        Err(AuthError::BadCredentials)
    }

    fn start_login(&self, credentials: Credentials<'_>, sink: &Arc<dyn EventSink>) -> LoginStart {
        let scripted = self.state().logins.start(&credentials, sink);
        scripted.unwrap_or_else(|| login::answer_now(self, &credentials))
    }

    fn open_session(&self, info: SessionInfo, _sink: Arc<dyn EventSink>) -> Box<dyn Session> {
        self.state().sessions.push(info);
        Box::new(FakeSession(self.clone()))
    }

    fn place_connection(&self, request: &PlacementRequest<'_>) -> Placement {
        let mut s = self.state();
        s.placement_asked.push((
            request.client_id.map(str::to_owned),
            request.user.map(str::to_owned),
        ));
        s.placement.clone().unwrap_or(Placement::Local)
    }
}

/// A session of the fake.
pub struct FakeSession(FakeBroker);

impl Session for FakeSession {
    fn declare_queue(&mut self, spec: QueueSpec) -> Result<QueueInfo, BrokerError> {
        let mut s = self.0.state();
        let name = spec.name.clone().unwrap_or_else(|| "$temp/1".into());
        let existed = s.queues.contains_key(&name);
        let q = s.queues.entry(name.clone()).or_insert(FakeQueue {
            durable: spec.durable,
            lifetime: spec.lifetime,
            bindings: Vec::new(),
            bindings_max: None,
        });
        q.durable = spec.durable;
        q.lifetime = spec.lifetime;
        if spec.bindings_max.is_some() {
            q.bindings_max = spec.bindings_max;
        }
        Ok(QueueInfo {
            name,
            existed,
            depth: 0,
        })
    }

    fn delete_queue(&mut self, name: &str) -> Result<(), BrokerError> {
        let mut s = self.0.state();
        s.deleted.push(name.to_owned());
        match s.queues.remove(name) {
            Some(_) => Ok(()),
            None => Err(BrokerError::NotFound(name.to_owned())),
        }
    }

    fn bind(
        &mut self,
        queue: &str,
        filter: &str,
        options: BindingOptions,
    ) -> Result<BindInfo, BrokerError> {
        let mut s = self.0.state();
        if let Some(e) = s.fail_bind.clone() {
            return Err(e);
        }
        let q = s
            .queues
            .get_mut(queue)
            .ok_or_else(|| BrokerError::NotFound(queue.to_owned()))?;
        let existed = q.bindings.iter().any(|(f, _)| f == filter);
        q.bindings.retain(|(f, _)| f != filter);
        q.bindings.push((filter.to_owned(), options));
        Ok(BindInfo {
            existed,
            retained_sent: 0,
        })
    }

    fn unbind(&mut self, queue: &str, filter: &str) -> Result<bool, BrokerError> {
        let mut s = self.0.state();
        let q = s
            .queues
            .get_mut(queue)
            .ok_or_else(|| BrokerError::NotFound(queue.to_owned()))?;
        let before = q.bindings.len();
        q.bindings.retain(|(f, _)| f != filter);
        Ok(q.bindings.len() != before)
    }

    fn publish(
        &mut self,
        address: &Address,
        message: Message,
        options: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError> {
        let mut s = self.0.state();
        if let Some(e) = s.fail_publish.clone() {
            return Err(e);
        }
        s.published.push((address.clone(), message, options));
        let pending = (options.confirm && s.confirm_pending).then(|| s.ticket());
        Ok(PublishReceipt {
            routed: s.routed,
            pending,
        })
    }

    fn consume(&mut self, spec: ConsumerSpec) -> Result<ConsumerId, BrokerError> {
        let mut s = self.0.state();
        s.next_consumer += 1;
        let id = ConsumerId(s.next_consumer);
        s.consumers.push((id, spec));
        Ok(id)
    }

    fn cancel(&mut self, consumer: ConsumerId) -> Result<(), BrokerError> {
        self.0.state().cancelled.push(consumer);
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
        _txn: Option<TxnId>,
        _confirm: bool,
    ) -> Result<Option<Ticket>, BrokerError> {
        self.0.state().settled.push((consumer, tag, outcome));
        Ok(None)
    }

    fn annotate(
        &mut self,
        consumer: ConsumerId,
        tag: DeliveryTag,
        annotation: Bytes,
    ) -> Result<(), BrokerError> {
        self.0.state().annotations.push((consumer, tag, annotation));
        Ok(())
    }

    fn begin(&mut self) -> TxnId {
        TxnId(1)
    }

    fn commit(&mut self, _txn: TxnId) -> Result<Ticket, BrokerError> {
        Ok(self.0.state().ticket())
    }

    fn rollback(&mut self, _txn: TxnId) -> Result<(), BrokerError> {
        Ok(())
    }

    fn get_state(&mut self, key: &str) -> Option<Bytes> {
        self.0.state().kv.get(key).cloned()
    }

    fn put_state(
        &mut self,
        key: &str,
        value: Option<Bytes>,
    ) -> Result<Option<Ticket>, BrokerError> {
        let mut s = self.0.state();
        match value {
            Some(v) => s.kv.insert(key.to_owned(), v),
            None => s.kv.remove(key),
        };
        Ok(s.state_pending.then(|| s.ticket()))
    }

    fn set_will(&mut self, will: Option<Will>) -> Result<(), BrokerError> {
        self.0.state().wills.push(will);
        Ok(())
    }

    fn producer_blocked(&self) -> bool {
        self.0.state().producer_blocked
    }

    fn resume_deliveries(&mut self) {}

    fn close(&mut self, kind: CloseKind) {
        self.0.state().closes.push(kind);
    }
}

/// A sink that drops events (tests inject events directly).
pub struct NullSink;

impl EventSink for NullSink {
    fn send(&self, _event: SessionEvent) {}
}
