//! CONNECT/CONNACK: authentication, client id rules, keep-alive, the
//! session queue (clean start, expiry, session present), the will; and the
//! client's DISCONNECT.
//!
//! A CONNECT is checked (authentication method, client id) before any
//! login work starts, so a CONNECT that will be refused anyway costs no
//! password check. The login goes through [`Broker::start_login`]; a
//! password check that runs elsewhere parks the CONNECT in
//! [`CheckingLogin`] until [`MqttConnection::on_login_checked`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mqttbytes::v5::ConnAckProperties;
use rosetta_neutral::{
    mqtt_session_queue, Address, AuthError, BrokerError, CloseKind, ConsumerSpec, Credentials,
    CreditMode, LoginStart, Principal, Protocol, QueueLifetime, QueueSpec, SessionInfo, Will,
};

use super::auth::EnhancedAuth;
use super::{AwaitConnect, MqttConnection, Open, Opening, State};
use crate::codec::{encode, CodecError, ConnectPacket, ReasonPacket, Version};
use crate::config::MqttConfig;
use crate::convert::inbound_message;
use crate::error::{auth_reason, broker_reason, connack_v4_code, MqttError, ReasonContext};
use crate::inflight::{decode_qos2_set, QOS2_INBOUND_STATE_KEY};
use crate::own_subs::OWN_SUBSCRIPTIONS_STATE_KEY;
use crate::scram::SCRAM_SHA_256;
use rosetta_neutral::address::MQTT_QUEUE_TOPIC_PREFIX;

/// A refused CONNECT: the v5 reason code and the text for the log and the
/// v5 reason string.
pub(super) struct Refusal {
    code: u8,
    why: String,
    /// MQTT 5 Server Reference: where the client should go instead.
    server_reference: Option<String>,
}

impl Refusal {
    pub(super) fn new(code: u8, why: impl Into<String>) -> Self {
        Self {
            code,
            why: why.into(),
            server_reference: None,
        }
    }

    pub(super) fn with_server_reference(mut self, reference: String) -> Self {
        self.server_reference = Some(reference);
        self
    }
}

/// A CONNECT waiting for the broker's password check.
pub(super) struct CheckingLogin {
    /// The connect deadline still applies.
    pub(super) deadline: Instant,
    connect: Box<ConnectPacket>,
    opening: Opening,
}

/// What a v5 client gets told about session expiry.
struct Lifetime {
    durable: bool,
    lifetime: QueueLifetime,
    expiry_s: u32,
}

impl MqttConnection {
    /// A CONNECT, taken in state `waiting` (which the caller left for
    /// `Closed`: every path below sets the next state).
    pub(super) fn on_connect(&mut self, now: Instant, waiting: AwaitConnect, c: ConnectPacket) {
        let AwaitConnect {
            deadline,
            certificate_user,
            opening,
        } = waiting;
        if let Err(refusal) = check_connect(&c, &self.config) {
            return self.refuse(c.version, &refusal, c.props.maximum_packet_size);
        }
        if c.props.authentication_method.is_some() {
            // SCRAM-SHA-256 on v5 (`check_connect` refused anything else).
            return self.start_enhanced_auth(deadline, certificate_user.as_deref(), c, opening);
        }
        let credentials = Credentials {
            user: c.username.as_deref(),
            password: c.password.as_deref(),
            certificate_user: certificate_user.as_deref(),
        };
        match opening.broker.start_login(credentials, &opening.sink) {
            LoginStart::Done(result) => self.finish_login(now, c, result, opening),
            LoginStart::Pending => {
                tracing::trace!(conn_id = self.conn_id, "password check started");
                self.state = State::CheckingLogin(Box::new(CheckingLogin {
                    deadline,
                    connect: Box::new(c),
                    opening,
                }));
            }
        }
    }

    /// The result of the password check a CONNECT waited for; then the
    /// packets that arrived behind the CONNECT, in order. A result with no
    /// CONNECT waiting (the connection closed meanwhile) is dropped.
    pub(super) fn on_login_checked(&mut self, now: Instant, result: Result<Principal, AuthError>) {
        let State::CheckingLogin(checking) = std::mem::replace(&mut self.state, State::Closed)
        else {
            tracing::debug!(
                conn_id = self.conn_id,
                "login result with no CONNECT waiting"
            );
            return;
        };
        let checking = *checking;
        self.finish_login(now, *checking.connect, result, checking.opening);
        self.handle_buffered_input(now);
    }

    /// Opens the session for a checked login, or refuses it.
    fn finish_login(
        &mut self,
        now: Instant,
        c: ConnectPacket,
        result: Result<Principal, AuthError>,
        opening: Opening,
    ) {
        match result {
            Ok(principal) => self.complete_connect(now, c, principal, None, opening),
            Err(e) => {
                let refusal = Refusal::new(auth_reason(&e), e.to_string());
                self.refuse(c.version, &refusal, c.props.maximum_packet_size);
            }
        }
    }

    /// Opens the session (CONNACK) for `principal` or refuses; `enhanced`
    /// is the result of an AUTH exchange when the CONNECT named a method.
    pub(super) fn complete_connect(
        &mut self,
        now: Instant,
        c: ConnectPacket,
        principal: Principal,
        enhanced: Option<EnhancedAuth>,
        opening: Opening,
    ) {
        let version = c.version;
        let client_packet_max = c.props.maximum_packet_size;
        if let Some(refusal) = self.placement_refusal(opening.broker.as_ref(), &c, &principal) {
            return self.refuse(version, &refusal, client_packet_max);
        }
        match self.establish(now, c, principal, enhanced, opening) {
            Ok(open) => self.state = State::Open(Box::new(open)),
            Err(refusal) => self.refuse(version, &refusal, client_packet_max),
        }
    }

    /// Refuses the CONNECT (CONNACK with the code) and closes.
    pub(super) fn refuse(&mut self, version: Version, refusal: &Refusal, client_max: Option<u32>) {
        tracing::info!(conn_id = self.conn_id, code = refusal.code, why = %refusal.why, "CONNECT refused");
        self.write_refusal(version, refusal, client_max);
        self.state = State::Closed;
    }

    /// Answers an error that happened before the session was open.
    pub(super) fn reject_connect(&mut self, err: &MqttError) {
        match (self.decoder.version(), err) {
            // A level we do not speak: 3.1.1 return code 1 (MQTT-3.1.2-2).
            (_, MqttError::Codec(CodecError::UnsupportedProtocolVersion(_))) => {
                encode::connack_v4(false, 1, &mut self.out)
            }
            // A bad CONNECT from a v5 client: CONNACK with the reason.
            // Its Maximum Packet Size is unknown (the CONNECT did not
            // parse); the reason string is short.
            (Some(Version::V5), MqttError::Codec(_)) => self.write_refusal(
                Version::V5,
                &Refusal::new(err.reason_code(), err.to_string()),
                None,
            ),
            // 3.1.1, timeouts, non-CONNECT first packets: just close.
            _ => {}
        }
    }

    /// A failed CONNACK. v5 gets a Reason String whatever Request Problem
    /// Information says (allowed on CONNACK, MQTT 5 §3.1.2.11.7), unless
    /// the packet would exceed the client's maximum packet size.
    pub(super) fn write_refusal(
        &mut self,
        version: Version,
        refusal: &Refusal,
        client_max: Option<u32>,
    ) {
        match version {
            Version::V311 => {
                encode::connack_v4(false, connack_v4_code(refusal.code), &mut self.out)
            }
            Version::V5 => {
                let mut props = ConnAckProperties::new();
                props.reason_string = Some(refusal.why.clone());
                props.server_reference = refusal.server_reference.clone();
                let r = encode::connack_v5(false, refusal.code, props, client_max, &mut self.out);
                if r.is_err() {
                    tracing::warn!(conn_id = self.conn_id, "could not encode CONNACK");
                }
            }
        }
    }

    /// Opens the session of a CONNECT that [`check_connect`] passed, for
    /// an authenticated `principal`.
    fn establish(
        &mut self,
        now: Instant,
        c: ConnectPacket,
        principal: Principal,
        enhanced: Option<EnhancedAuth>,
        opening: Opening,
    ) -> Result<Open, Refusal> {
        let Opening { broker, sink } = opening;
        let v5 = c.version == Version::V5;
        let cfg = &self.config;

        let mut assigned = None;
        let client_id: Arc<str> = if c.client_id.is_empty() {
            let id = format!("rosetta-{}-{}", self.conn_id, super::epoch_ms(now));
            if v5 {
                assigned = Some(id.clone());
            }
            id.into()
        } else {
            c.client_id.as_str().into()
        };
        // Re-authentication (AUTH) proves the same user again.
        let reauth = enhanced.as_ref().map(|e| {
            Box::new(super::Reauth {
                broker: Arc::clone(&broker),
                method: e.method.clone(),
                user: principal.user.as_deref().map(str::to_owned),
                pending: None,
            })
        });

        let life = lifetime(&c, cfg.session_expiry_max_s, cfg.v311_session_expiry_s);
        // The will is checked before anything is created.
        let will = match &c.will {
            Some(w) => {
                // `$queue/<name>` sends the will to a queue, like a PUBLISH.
                let address = Address::from_mqtt_topic(&w.topic)
                    .map_err(|e| Refusal::new(0x90, format!("will topic: {e}")))?;
                if w.qos > cfg.qos_max {
                    return Err(Refusal::new(0x9B, "will QoS above the maximum"));
                }
                if w.retain && !cfg.retain_available {
                    return Err(Refusal::new(0x9A, "retained will not supported"));
                }
                let now_ms = super::epoch_ms(now);
                let mut message =
                    inbound_message(w.qos, w.retain, w.props.clone(), w.payload.clone(), now_ms)
                        .map_err(|e| Refusal::new(e.reason_code(), e.to_string()))?;
                // The will's expiry interval counts from when it is
                // published, which only the core knows: pass it relative.
                message.expiry = None;
                Some(Will {
                    address,
                    message,
                    // Published when the delay has passed or the session
                    // ends, whichever comes first (MQTT 5 §3.1.3.2.2).
                    delay: Duration::from_secs(u64::from(
                        w.props
                            .will_delay_interval_s
                            .unwrap_or(0)
                            .min(life.expiry_s),
                    )),
                    expiry_interval: w
                        .props
                        .message_expiry_interval_s
                        .map(|s| Duration::from_secs(u64::from(s))),
                })
            }
            None => None,
        };

        let mut session = broker.open_session(
            SessionInfo {
                conn_id: self.conn_id,
                protocol: Protocol::Mqtt,
                principal,
                client_id: Some(Arc::clone(&client_id)),
                take_over: true,
            },
            sink,
        );
        let queue = mqtt_session_queue(&client_id);
        // A clean, non-lasting session starts without a queue: it gets one
        // with its first subscription (`Open::session_queue_consumer`), so
        // the many connections that only publish hold none.
        let queue_on_first_subscribe = c.clean_start && !life.durable;
        let setup = (|| -> Result<(bool, u32), BrokerError> {
            if c.clean_start {
                match session.delete_queue(&queue) {
                    Ok(()) | Err(BrokerError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
                session.put_state(QOS2_INBOUND_STATE_KEY, None)?;
            }
            let existed = if queue_on_first_subscribe {
                false
            } else {
                session
                    .declare_queue(QueueSpec {
                        name: Some(queue.clone()),
                        durable: life.durable,
                        lifetime: life.lifetime,
                        // Plain subscriptions are the queue's bindings.
                        bindings_max: Some(cfg.subscriptions_max),
                    })?
                    .existed
            };
            let window = u32::from(
                c.props
                    .receive_maximum
                    .unwrap_or(u16::MAX)
                    .min(cfg.outbound_inflight_max),
            );
            Ok((existed && !c.clean_start, window))
        })();
        let (session_present, window) = match setup {
            Ok(v) => v,
            Err(e) => {
                session.close(CloseKind::Clean);
                return Err(Refusal::new(
                    broker_reason(&e, ReasonContext::Connect),
                    e.to_string(),
                ));
            }
        };
        if !session_present && session.get_state(OWN_SUBSCRIPTIONS_STATE_KEY).is_some() {
            // A clean start, or a session that expired while the client was
            // away: its shared and `$queue/` subscriptions ended with it.
            if let Err(e) = session.put_state(OWN_SUBSCRIPTIONS_STATE_KEY, None) {
                tracing::warn!(conn_id = self.conn_id, error = %e, "could not forget the old session's subscriptions");
            }
        }
        let consumer = if queue_on_first_subscribe {
            Ok(None)
        } else {
            session
                .consume(ConsumerSpec {
                    queue: queue.clone(),
                    credit: CreditMode::Window(window),
                    auto_settle: false,
                    options: Default::default(),
                })
                .map(Some)
        };
        let consumer = match consumer {
            Ok(id) => id,
            Err(e) => {
                session.close(CloseKind::Clean);
                return Err(Refusal::new(
                    broker_reason(&e, ReasonContext::Connect),
                    e.to_string(),
                ));
            }
        };
        if let Err(e) = session.set_will(will) {
            session.close(CloseKind::Clean);
            return Err(Refusal::new(
                broker_reason(&e, ReasonContext::Connect),
                e.to_string(),
            ));
        }
        let awaiting_rel = if session_present {
            session
                .get_state(QOS2_INBOUND_STATE_KEY)
                .map(|b| decode_qos2_set(&b))
                .unwrap_or_default()
        } else {
            BTreeSet::new()
        };

        // Keep-alive: 3.1.1 clients cannot be told another value, so theirs
        // is enforced as asked; v5 clients asking more than the maximum (or
        // 0) get the maximum as Server Keep Alive.
        let mut server_keep_alive = None;
        let keep_alive_s = if v5
            && cfg.keep_alive_max_s > 0
            && (c.keep_alive_s == 0 || c.keep_alive_s > cfg.keep_alive_max_s)
        {
            server_keep_alive = Some(cfg.keep_alive_max_s);
            cfg.keep_alive_max_s
        } else {
            c.keep_alive_s
        };
        // At most 65,535 s × 1,500: fits.
        let keep_alive_timeout_ms = u32::from(keep_alive_s) * 1500;

        match c.version {
            Version::V311 => encode::connack_v4(session_present, 0, &mut self.out),
            Version::V5 => {
                let mut props = ConnAckProperties::new();
                let requested = c.props.session_expiry_interval_s.unwrap_or(0);
                if requested != life.expiry_s {
                    props.session_expiry_interval = Some(life.expiry_s);
                }
                props.receive_max = Some(cfg.receive_maximum);
                if cfg.qos_max < 2 {
                    props.max_qos = Some(cfg.qos_max);
                }
                props.retain_available = Some(u8::from(cfg.retain_available));
                props.max_packet_size = Some(cfg.packet_size_max_bytes);
                props.assigned_client_identifier = assigned;
                props.topic_alias_max = Some(cfg.topic_alias_max);
                props.wildcard_subscription_available =
                    Some(u8::from(cfg.wildcard_subscriptions_available));
                props.subscription_identifiers_available =
                    Some(u8::from(cfg.subscription_identifiers_available));
                props.shared_subscription_available =
                    Some(u8::from(cfg.shared_subscriptions_available));
                props.server_keep_alive = server_keep_alive;
                if c.props.request_response_information == Some(1) {
                    props.response_information = Some(response_information(&client_id));
                }
                if let Some(e) = enhanced {
                    props.authentication_method = Some(e.method);
                    props.authentication_data = Some(e.data);
                }
                let max = c.props.maximum_packet_size;
                if let Err(e) = encode::connack_v5(session_present, 0, props, max, &mut self.out) {
                    session.close(CloseKind::Abnormal);
                    return Err(Refusal::new(0x83, e.to_string()));
                }
            }
        }
        tracing::debug!(conn_id = self.conn_id, client_id = %client_id, ?c.version, session_present, "connected");

        let mut open = Open {
            version: c.version,
            session,
            client_id,
            session_consumer: consumer,
            session_expiry_s: life.expiry_s,
            window,
            shared: super::OwnSubs::default(),
            keep_alive_timeout_ms,
            last_input: now,
            client_packet_max: c.props.maximum_packet_size,
            client_alias_max: c.props.topic_alias_maximum.unwrap_or(0),
            problem_info: c.props.request_problem_information != Some(0),
            // A resumed session mid-QoS 2 flow has its inbound ids back.
            flows: (!awaiting_rel.is_empty()).then(|| {
                Box::new(super::Flows {
                    awaiting_rel,
                    ..Default::default()
                })
            }),
            aliases: None,
            reauth,
        };
        if session_present {
            open.restore_own_subs(&self.config, self.conn_id);
        }
        Ok(open)
    }
}

/// What a CONNECT is refused for before any login work: an authentication
/// method other than SCRAM-SHA-256, and the client id rules (MQTT-3.1.3-7/8,
/// MQTT 5 §3.1.3.1). An empty id is given one in `establish`.
fn check_connect(c: &ConnectPacket, cfg: &MqttConfig) -> Result<(), Refusal> {
    if let Some(method) = &c.props.authentication_method {
        // Only SCRAM-SHA-256 is offered (MQTT 5 §4.12).
        if c.version != Version::V5 || method != SCRAM_SHA_256 {
            return Err(Refusal::new(
                0x8C,
                format!("authentication method {method} not supported"),
            ));
        }
    }
    if c.client_id.is_empty() && c.version != Version::V5 && !c.clean_start {
        return Err(Refusal::new(0x85, "empty client id needs clean session"));
    }
    if c.client_id.len() > cfg.client_id_len_max_bytes {
        return Err(Refusal::new(0x85, "client id too long"));
    }
    // The id becomes part of a queue name, where wildcards are invalid.
    if c.client_id.contains(['+', '#']) {
        return Err(Refusal::new(0x85, "client id contains + or #"));
    }
    Ok(())
}

/// The Response Information returned to a v5 client that asks for it
/// (MQTT 5 §3.1.2.11.6): a topic prefix of its own for responses. It lies
/// under `response/`, which the default permissions (everything) allow; a
/// restricted user needs `/topic/response/<client id>/#` to subscribe
/// there (see the README's MQTT section).
pub(super) fn response_information(client_id: &str) -> String {
    format!("{RESPONSE_TOPIC_PREFIX}{client_id}/")
}

/// First level of the response topics handed out as Response Information.
const RESPONSE_TOPIC_PREFIX: &str = "response/";

/// The session queue's durability and lifetime for a CONNECT.
fn lifetime(c: &ConnectPacket, expiry_max_s: u32, v311_expiry_s: Option<u32>) -> Lifetime {
    match c.version {
        Version::V311 if c.clean_start => Lifetime {
            durable: false,
            lifetime: QueueLifetime::Session,
            expiry_s: 0,
        },
        Version::V311 => match v311_expiry_s {
            Some(s) if s < u32::MAX => Lifetime {
                durable: true,
                lifetime: QueueLifetime::IdleFor(Duration::from_secs(u64::from(s))),
                expiry_s: s,
            },
            _ => Lifetime {
                durable: true,
                lifetime: QueueLifetime::Permanent,
                expiry_s: u32::MAX,
            },
        },
        Version::V5 => {
            let expiry_s = c
                .props
                .session_expiry_interval_s
                .unwrap_or(0)
                .min(expiry_max_s);
            let lifetime = match expiry_s {
                0 => QueueLifetime::Session,
                u32::MAX => QueueLifetime::Permanent,
                s => QueueLifetime::IdleFor(Duration::from_secs(u64::from(s))),
            };
            Lifetime {
                durable: expiry_s > 0,
                lifetime,
                expiry_s,
            }
        }
    }
}

impl Open {
    /// A client DISCONNECT: how to close the session.
    pub(super) fn on_disconnect(
        &mut self,
        cfg: &MqttConfig,
        d: &ReasonPacket,
    ) -> Result<CloseKind, MqttError> {
        if let Some(expiry) = d.props.session_expiry_interval_s {
            // MQTT 5 §3.14.2.2.2: 0 at CONNECT cannot become non-zero.
            if self.session_expiry_s == 0 && expiry != 0 {
                return Err(MqttError::Protocol(
                    "session expiry set on DISCONNECT after 0",
                ));
            }
            if expiry != self.session_expiry_s {
                self.set_session_expiry(cfg, expiry);
            }
        }
        // Only reason 0x00 discards the will (MQTT 5 §3.1.2.5).
        Ok(if d.reason == 0 {
            CloseKind::Clean
        } else {
            CloseKind::CleanWithWill
        })
    }

    /// Re-declares the session queue with a new lifetime. The neutral API
    /// has no "change lifetime" call; we rely on a re-declare updating it.
    fn set_session_expiry(&mut self, cfg: &MqttConfig, expiry_s: u32) {
        if expiry_s == 0 {
            // The session ends with this connection, which is closing (only
            // DISCONNECT gets here). A re-declare cannot turn a lasting
            // queue into a connection-scoped one, so end the session now,
            // as a clean start would: a reconnect must not find it.
            match self.session.delete_queue(&self.session_queue()) {
                Ok(()) | Err(BrokerError::NotFound(_)) => {}
                Err(e) => tracing::warn!(error = %e, "could not end the session"),
            }
            if let Err(e) = self.session.put_state(QOS2_INBOUND_STATE_KEY, None) {
                tracing::warn!(error = %e, "could not clear the QoS 2 state");
            }
            if !self.shared.is_empty() {
                if let Err(e) = self.session.put_state(OWN_SUBSCRIPTIONS_STATE_KEY, None) {
                    tracing::warn!(error = %e, "could not forget the subscriptions");
                }
            }
            self.session_expiry_s = 0;
            return;
        }
        let lifetime = match expiry_s {
            0 => QueueLifetime::Session,
            u32::MAX => QueueLifetime::Permanent,
            s => QueueLifetime::IdleFor(Duration::from_secs(u64::from(s))),
        };
        let r = self.session.declare_queue(QueueSpec {
            name: Some(self.session_queue()),
            durable: expiry_s > 0,
            lifetime,
            // Keeps the subscription cap set at CONNECT.
            bindings_max: None,
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "could not change the session expiry");
        }
        self.session_expiry_s = expiry_s;
        // Shared-subscription queues this session keeps alive follow the new
        // expiry (a re-declare changes a lasting queue's idle lifetime).
        let groups: Vec<String> = self
            .shared
            .keys()
            .filter(|f| {
                !f.starts_with(MQTT_QUEUE_TOPIC_PREFIX) && !super::subscribe::is_stream_filter(f)
            })
            .cloned()
            .collect();
        for queue in groups {
            let spec = self.shared_queue_spec(cfg, &queue);
            if let Err(e) = self.session.declare_queue(spec) {
                tracing::debug!(error = %e, queue = %queue, "could not change a group queue's lifetime");
            }
        }
    }
}
