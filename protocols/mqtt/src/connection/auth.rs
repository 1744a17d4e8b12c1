//! MQTT 5 enhanced authentication (§4.12) with SCRAM-SHA-256 ([`scram`]):
//! the AUTH round trip between CONNECT and CONNACK, and re-authentication
//! of an open connection.
//!
//! A CONNECT naming `SCRAM-SHA-256` moves to [`Authenticating`] (only AUTH
//! and DISCONNECT are accepted there, within the same connect deadline);
//! its successful end yields the principal that [`MqttConnection`]'s
//! `establish` needs, so a session never opens before the proof checks.
//! Any other method gets CONNACK 0x8C.
//!
//! On a connection with a verified client certificate, the SCRAM user must
//! be the certificate's user ([`check_certificate_user`], the identity rule
//! of [`rosetta_neutral::login`]): CONNACK 0x87 otherwise.
//!
//! Failures: CONNACK 0x86 (bad user name or password, also for a malformed
//! SCRAM message, with the reason as Reason String) during CONNECT;
//! DISCONNECT 0x87 when re-authentication fails, 0x82 (protocol error) for
//! AUTH with another method or out of sequence: DISCONNECT has no 0x8C
//! (MQTT 5 §3.14.2.1), that code exists only in CONNACK.

use std::time::Instant;

use bytes::Bytes;
use rosetta_neutral::login::check_certificate_user;
use rosetta_neutral::Principal;

use super::handshake::Refusal;
use super::{Ctx, MqttConnection, Open, Opening, State};
use crate::codec::{encode, ConnectPacket, ReasonPacket};
use crate::error::{auth_reason, MqttError};
use crate::scram::{self, ScramPending, SCRAM_SHA_256};

/// AUTH reason code: success (re-authentication done).
const AUTH_SUCCESS: u8 = 0x00;
/// AUTH reason code: continue authentication.
const AUTH_CONTINUE: u8 = 0x18;
/// AUTH reason code: re-authenticate.
const AUTH_REAUTHENTICATE: u8 = 0x19;
/// CONNACK code for every failed SCRAM exchange.
const CONNACK_BAD_CREDENTIALS: u8 = 0x86;

/// Between CONNECT and CONNACK: server-first sent, client-final awaited.
pub(super) struct Authenticating {
    pub(super) deadline: Instant,
    connect: Box<ConnectPacket>,
    scram: Box<ScramPending>,
    opening: Opening,
}

impl Authenticating {
    /// The client's Maximum Packet Size from its CONNECT.
    pub(super) fn client_packet_max(&self) -> Option<u32> {
        self.connect.props.maximum_packet_size
    }
}

/// A finished enhanced authentication, for `establish` and CONNACK.
pub(super) struct EnhancedAuth {
    pub(super) method: String,
    /// Authentication Data of the CONNACK (SCRAM server-final).
    pub(super) data: Bytes,
}

impl MqttConnection {
    /// A v5 CONNECT naming SCRAM-SHA-256: answers client-first with AUTH
    /// 0x18 carrying server-first, or refuses.
    pub(super) fn start_enhanced_auth(
        &mut self,
        deadline: Instant,
        certificate_user: Option<&str>,
        c: ConnectPacket,
        opening: Opening,
    ) {
        let client_first = c.props.authentication_data.clone().unwrap_or_default();
        let lookup = |user: &str| opening.broker.scram_credentials(user);
        let refusal = match scram::server_first(&client_first, lookup) {
            Ok((pending, server_first)) => match c.username.as_deref() {
                // A user name next to SCRAM must name the same user.
                Some(name) if !name.is_empty() && name != pending.user() => Refusal::new(
                    CONNACK_BAD_CREDENTIALS,
                    "user name differs from the SCRAM user",
                ),
                _ if check_certificate_user(certificate_user, Some(pending.user())).is_err() => {
                    let e = rosetta_neutral::AuthError::CertificateMismatch;
                    Refusal::new(auth_reason(&e), e.to_string())
                }
                _ => {
                    encode::auth(AUTH_CONTINUE, SCRAM_SHA_256, &server_first, &mut self.out);
                    self.state = State::Authenticating(Box::new(Authenticating {
                        deadline,
                        connect: Box::new(c),
                        scram: Box::new(pending),
                        opening,
                    }));
                    return;
                }
            },
            Err(e) => Refusal::new(CONNACK_BAD_CREDENTIALS, e.to_string()),
        };
        self.refuse(c.version, &refusal, c.props.maximum_packet_size);
    }

    /// The client's AUTH during CONNECT: verifies client-final and, if it
    /// holds, opens the session (CONNACK carries server-final).
    pub(super) fn continue_enhanced_auth(
        &mut self,
        now: Instant,
        auth: Authenticating,
        a: ReasonPacket,
    ) {
        let c = *auth.connect;
        let max = c.props.maximum_packet_size;
        if a.reason != AUTH_CONTINUE {
            let refusal = Refusal::new(0x82, "AUTH during CONNECT must continue (0x18)");
            return self.refuse(c.version, &refusal, max);
        }
        if a.props.authentication_method.as_deref() != Some(SCRAM_SHA_256) {
            let refusal = Refusal::new(0x82, "AUTH names another authentication method");
            return self.refuse(c.version, &refusal, max);
        }
        let client_final = a.props.authentication_data.unwrap_or_default();
        match auth.scram.server_final(&client_final) {
            Ok(server_final) => {
                let principal = Principal {
                    user: Some(auth.scram.user().into()),
                };
                let enhanced = EnhancedAuth {
                    method: SCRAM_SHA_256.to_owned(),
                    data: Bytes::from(server_final),
                };
                self.complete_connect(now, c, principal, Some(enhanced), auth.opening);
            }
            Err(e) => {
                let refusal = Refusal::new(CONNACK_BAD_CREDENTIALS, e.to_string());
                self.refuse(c.version, &refusal, max);
            }
        }
    }
}

impl Open {
    /// AUTH after CONNACK: re-authentication (MQTT 5 §4.12.1), with the
    /// method of the CONNECT and as the same user.
    pub(super) fn on_auth(&mut self, ctx: Ctx<'_>, a: ReasonPacket) -> Result<(), MqttError> {
        let Some(reauth) = self.reauth.as_deref_mut() else {
            // No method at CONNECT: no exchange can be in progress.
            return Err(MqttError::Protocol("AUTH without an authentication method"));
        };
        let method = reauth.method.clone();
        if a.props.authentication_method.as_deref() != Some(method.as_str()) {
            // A protocol error (MQTT 5 §4.12.1); DISCONNECT has no 0x8C.
            return Err(MqttError::Protocol(
                "AUTH names another authentication method",
            ));
        }
        let data = a.props.authentication_data.unwrap_or_default();
        let failed = |e: scram::ScramError| MqttError::ReauthenticationFailed(e.to_string());
        match (a.reason, reauth.pending.take()) {
            (AUTH_REAUTHENTICATE, None) => {
                let broker = &reauth.broker;
                let lookup = |user: &str| broker.scram_credentials(user);
                let (pending, server_first) = scram::server_first(&data, lookup).map_err(failed)?;
                if Some(pending.user()) != reauth.user.as_deref() {
                    return Err(MqttError::ReauthenticationFailed(
                        "a connection cannot change its user".into(),
                    ));
                }
                encode::auth(AUTH_CONTINUE, &method, &server_first, ctx.out);
                reauth.pending = Some(Box::new(pending));
                Ok(())
            }
            (AUTH_CONTINUE, Some(pending)) => {
                let server_final = pending.server_final(&data).map_err(failed)?;
                tracing::debug!(conn_id = ctx.conn_id, "re-authenticated");
                encode::auth(AUTH_SUCCESS, &method, &server_final, ctx.out);
                Ok(())
            }
            _ => Err(MqttError::Protocol("AUTH out of sequence")),
        }
    }
}
