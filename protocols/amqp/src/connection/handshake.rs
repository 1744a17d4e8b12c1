//! The states before Open: protocol headers, the SASL exchange, and the
//! Open that turns `AwaitOpen` (with its principal) into [`Opened`].

use std::sync::Arc;
use std::time::Instant;

use fe2o3_amqp_types::performatives::{ChannelMax, MaxFrameSize, Open};
use fe2o3_amqp_types::primitives::{Array, Symbol};
use fe2o3_amqp_types::sasl::{SaslCode, SaslInit, SaslMechanisms, SaslOutcome, SaslResponse};
use rosetta_neutral::{Principal, Protocol, SessionInfo};
use tracing::debug;

use super::{AmqpConnection, Handshake, Opened, State, Step};
use crate::codec;
use crate::context::Shared;
use crate::descriptor;
use crate::error::{AmqpError, Fault};
use crate::frame::{
    self, write_frame, write_perf, Frame, ProtocolHeader, FRAME_TYPE_SASL, MIN_MAX_FRAME_SIZE,
    PROTOCOL_ID_AMQP, PROTOCOL_ID_SASL,
};
use crate::sasl::{self, SaslServer, SaslStep};

/// Capability offered in Open so Qpid JMS uses one anonymous-relay link for
/// all producers without a fixed destination.
const ANONYMOUS_RELAY: &str = "ANONYMOUS-RELAY";

/// SASL frame descriptor: sasl-init.
const SASL_INIT: u64 = 0x41;
/// SASL frame descriptor: sasl-response.
const SASL_RESPONSE: u64 = 0x43;

impl Handshake {
    /// Who a client that skips SASL is: its certificate's user, else
    /// anonymous when that is allowed, else nobody (it must use SASL).
    fn principal_without_sasl(&self) -> Option<Principal> {
        match self.certificate_user.as_deref() {
            Some(user) => self.broker.authenticate_certificate(user).ok(),
            None => None,
        }
        .or_else(|| self.broker.anonymous_allowed().then(Principal::anonymous))
    }
}

impl AmqpConnection {
    pub(super) fn on_protocol_header(&mut self, header: ProtocolHeader) {
        let State::Handshake(h) = &mut self.state else {
            return;
        };
        let id = header.protocol_id;
        let step = std::mem::replace(&mut h.step, Step::Header);
        match (step, id) {
            (Step::Header, PROTOCOL_ID_SASL) => {
                self.out
                    .extend_from_slice(&frame::protocol_header(PROTOCOL_ID_SASL));
                let mechs = SaslMechanisms {
                    sasl_server_mechanisms: Array(
                        sasl::mechanisms(&*h.broker, h.certificate_user.as_deref())
                            .into_iter()
                            .map(Symbol::from)
                            .collect(),
                    ),
                };
                write_frame(&mut self.out, FRAME_TYPE_SASL, 0, &mechs, &[]);
                h.step = Step::Sasl(SaslServer::default());
            }
            (Step::SaslDone(principal), PROTOCOL_ID_AMQP) => {
                self.out
                    .extend_from_slice(&frame::protocol_header(PROTOCOL_ID_AMQP));
                h.step = Step::AwaitOpen(principal);
            }
            (Step::Header, PROTOCOL_ID_AMQP) => match h.principal_without_sasl() {
                Some(principal) => {
                    self.out
                        .extend_from_slice(&frame::protocol_header(PROTOCOL_ID_AMQP));
                    h.step = Step::AwaitOpen(principal);
                }
                None => self.refuse_protocol_id(id),
            },
            (step, id) => {
                h.step = step;
                self.refuse_protocol_id(id);
            }
        }
    }

    fn refuse_protocol_id(&mut self, id: u8) {
        self.refuse_protocol_header(
            Some(id),
            AmqpError::NotAllowed(format!("protocol id {id} not accepted here")),
        );
    }

    /// A protocol header we do not accept: a wrong version (AMQP 0-9-1's
    /// `AMQP 0 0 9 1`), a protocol id we do not serve here, or bytes that
    /// are no protocol header at all. AMQP 1.0 §2.2: the server "MUST send
    /// a protocol header with a supported protocol version and then close
    /// the socket". `requested` is the protocol id the client asked for,
    /// if it sent an `AMQP` header.
    pub(super) fn refuse_protocol_header(&mut self, requested: Option<u8>, e: AmqpError) {
        let (sasl_optional, after_sasl) = match &self.state {
            State::Handshake(h) => (
                h.principal_without_sasl().is_some(),
                matches!(h.step, Step::SaslDone(_)),
            ),
            _ => (false, false),
        };
        let answer = refusal_protocol_id(after_sasl, requested, sasl_optional);
        debug!(conn = self.conn_id, ?requested, answer, error = %e, "protocol header refused");
        self.out.extend_from_slice(&frame::protocol_header(answer));
        self.error = Some(Box::new(e));
        self.state = State::Closed;
    }

    pub(super) fn on_sasl_frame(&mut self, f: Frame) -> Result<(), Fault> {
        if f.frame_type != FRAME_TYPE_SASL {
            return Err(Fault::Connection(AmqpError::IllegalState(
                "AMQP frame during SASL".into(),
            )));
        }
        let State::Handshake(h) = &mut self.state else {
            return Ok(());
        };
        let Handshake {
            broker,
            sink,
            certificate_user,
            step: Step::Sasl(server),
            ..
        } = &mut **h
        else {
            return Ok(());
        };
        let body = &f.body[..];
        let len = codec::value_len(body).map_err(|e| Fault::Connection(e.into()))?;
        let step = match descriptor::descriptor_code(body) {
            Some(SASL_INIT) => {
                let init: SaslInit = codec::decode("sasl-init", &body[..len])
                    .map_err(|e| Fault::Connection(e.into()))?;
                let resp = init.initial_response.as_ref().map(|b| b.as_slice());
                server.on_init(
                    &**broker,
                    certificate_user.as_deref(),
                    sink,
                    init.mechanism.as_str(),
                    resp,
                )
            }
            Some(SASL_RESPONSE) => {
                let resp: SaslResponse = codec::decode("sasl-response", &body[..len])
                    .map_err(|e| Fault::Connection(e.into()))?;
                server.on_response(resp.response.as_slice())
            }
            _ => {
                return Err(Fault::Connection(AmqpError::IllegalState(
                    "unexpected SASL frame".into(),
                )))
            }
        };
        self.apply_sasl_step(step);
        Ok(())
    }

    /// The result of the PLAIN password check the connection waited for:
    /// the outcome, then whatever the client pipelined behind sasl-init.
    pub(super) fn on_login_checked(
        &mut self,
        now: Instant,
        result: Result<Principal, rosetta_neutral::AuthError>,
    ) {
        let step = match &mut self.state {
            State::Handshake(h) => match &mut h.step {
                Step::Sasl(server) => server.on_login_checked(result),
                _ => None,
            },
            _ => None,
        };
        let Some(step) = step else {
            debug!(
                conn = self.conn_id,
                "login result with no SASL exchange waiting"
            );
            return;
        };
        self.apply_sasl_step(step);
        self.handle_buffered_input(now);
    }

    /// Answers one SASL step: a challenge, the outcome, or nothing yet.
    fn apply_sasl_step(&mut self, step: SaslStep) {
        match step {
            // The SASL server waits for the password check; so does input.
            SaslStep::Pending => {}
            SaslStep::Challenge(c) => {
                let ch = fe2o3_amqp_types::sasl::SaslChallenge {
                    challenge: c.into(),
                };
                write_frame(&mut self.out, FRAME_TYPE_SASL, 0, &ch, &[]);
            }
            SaslStep::Success {
                principal,
                additional_data,
            } => {
                debug!(conn = self.conn_id, user = ?principal.user, "SASL ok");
                let outcome = SaslOutcome {
                    code: SaslCode::Ok,
                    additional_data: additional_data.map(Into::into),
                };
                write_frame(&mut self.out, FRAME_TYPE_SASL, 0, &outcome, &[]);
                if let State::Handshake(h) = &mut self.state {
                    h.step = Step::SaslDone(principal);
                }
            }
            SaslStep::Failure(why) => self.refuse_sasl(SaslCode::Auth, why),
            SaslStep::Unavailable(why) => self.refuse_sasl(SaslCode::SysTemp, why),
        }
    }

    /// Sends a failed sasl-outcome and closes.
    fn refuse_sasl(&mut self, code: SaslCode, why: String) {
        debug!(conn = self.conn_id, %why, ?code, "SASL failed");
        let outcome = SaslOutcome {
            code,
            additional_data: None,
        };
        write_frame(&mut self.out, FRAME_TYPE_SASL, 0, &outcome, &[]);
        self.error = Some(Box::new(AmqpError::Broker(
            rosetta_neutral::BrokerError::Unauthorized(why),
        )));
        self.state = State::Closed;
    }

    /// The peer's Open (in `AwaitOpen`, as its principal): the core
    /// session opens and the connection is [`Opened`]; the handshake's
    /// state goes.
    pub(super) fn on_open(&mut self, now: Instant, handshake: Handshake, open: Open) {
        let Handshake {
            broker, sink, step, ..
        } = handshake;
        let Step::AwaitOpen(principal) = step else {
            return;
        };
        if let Some(error) = self.placement_error(&*broker, &principal, &open) {
            return self.refuse_open(error);
        }
        let peer_max_frame = open.max_frame_size.0.max(MIN_MAX_FRAME_SIZE);
        let channel_max = self.cfg.channel_max.min(open.channel_max.0);
        // 0: the peer has no idle timeout.
        let peer_idle_ms = open.idle_time_out.unwrap_or(0);
        // One allocation for the container id, shared with the core
        // session (its client id) and kept for subscription queue names.
        let container_id: Arc<str> = open.container_id.into();
        let info = SessionInfo {
            conn_id: self.conn_id,
            protocol: Protocol::Amqp,
            principal,
            client_id: Some(Arc::clone(&container_id)),
            take_over: false,
        };
        let core = broker.open_session(info, sink);
        let ours = Open {
            container_id: self.cfg.container_id.clone(),
            hostname: None,
            max_frame_size: MaxFrameSize(self.cfg.frame_size_max_bytes),
            channel_max: ChannelMax(self.cfg.channel_max),
            idle_time_out: advertised_idle_timeout_ms(self.cfg.idle_timeout_ms),
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: Some(Array(vec![
                Symbol::from(ANONYMOUS_RELAY),
                Symbol::from(crate::link::SHARED_SUBS),
            ])),
            desired_capabilities: None,
            properties: None,
        };
        write_perf(&mut self.out, 0, &ours, &[]);
        debug!(conn = self.conn_id, container = %container_id, "open");
        let shared = Shared::new(core, container_id, peer_max_frame);
        self.state = State::Opened(Box::new(Opened::new(
            shared,
            channel_max,
            peer_idle_ms,
            now,
        )));
    }
}

/// The protocol id of the header that answers one we refuse, before we
/// close (AMQP 1.0 §2.2). We support version 1.0.0 only, the highest
/// version not above any the client may ask for, so the version is always
/// that; the protocol id is the layer the client should start with here:
///
/// | where                  | client asked for                  | answer |
/// |------------------------|-----------------------------------|--------|
/// | after SASL             | anything                          | AMQP (0): only it may follow SASL (§5.3.2) |
/// | first header           | AMQP (0), SASL optional           | AMQP (0) |
/// | first header           | AMQP (0), SASL required           | SASL (3) |
/// | first header           | SASL (3), TLS (2), other, garbage | SASL (3) |
///
/// TLS is not negotiated inside an AMQP connection (§5.2): it is the
/// `amqps` port's, and the `any` port's detection takes it before AMQP
/// starts, so a TLS header is answered with the security layer we do
/// offer here, SASL, which every client may use.
fn refusal_protocol_id(after_sasl: bool, requested: Option<u8>, sasl_optional: bool) -> u8 {
    match (after_sasl, requested) {
        (true, _) => PROTOCOL_ID_AMQP,
        (false, Some(PROTOCOL_ID_AMQP)) if sasl_optional => PROTOCOL_ID_AMQP,
        _ => PROTOCOL_ID_SASL,
    }
}

/// The idle-time-out to advertise in our Open for the timeout we enforce
/// (`None`: no idle check). AMQP 1.0 §2.4.5: "To avoid spurious timeouts,
/// the value in idle-time-out SHOULD be half the peer's actual timeout
/// threshold." A peer that sends its keep-alives at the advertised period
/// (python-qpid-proton does) then still has a whole half period of slack
/// before we close.
fn advertised_idle_timeout_ms(enforced_ms: u32) -> Option<u32> {
    (enforced_ms > 0).then(|| (enforced_ms / 2).max(1))
}
