//! The SASL layer (spec part 5.3): ANONYMOUS, PLAIN, SCRAM-SHA-256
//! (RFC 5802, RFC 7677) and EXTERNAL (RFC 4422 appendix A: the identity of
//! a verified TLS client certificate), as a small state machine with no IO.
//!
//! PLAIN goes through [`Broker::start_login`], under the identity rule of
//! [`rosetta_neutral::login`]: on a connection with a client certificate,
//! its user name must be the certificate's user. Its password check may
//! finish later ([`SaslStep::Pending`], the [`SaslServer::CheckingPassword`]
//! state: the connection reads nothing meanwhile and hands the result to
//! [`SaslServer::on_login_checked`]). SCRAM
//! is [`rosetta_neutral::scram`] (shared with MQTT 5 enhanced
//! authentication): it verifies the client proof against
//! [`Broker::scram_credentials`], so the password never reaches us, and an
//! unknown user fails at the proof like a wrong password; its user too
//! must be the certificate's. Here it only rides in sasl-init,
//! sasl-challenge, sasl-response and the outcome's additional data.
//! ANONYMOUS, EXTERNAL and SCRAM are decided at once.
//!
//! Outcomes: `ok`; `auth` for every refusal; `sys-temp` (a temporary
//! failure) when the broker has no room for another password check.

use std::sync::Arc;

use rosetta_neutral::login::check_certificate_user;
use rosetta_neutral::scram::{self, ScramPending};
use rosetta_neutral::{AuthError, Broker, Credentials, EventSink, LoginStart, Principal};

/// SASL ANONYMOUS.
pub(crate) const ANONYMOUS: &str = "ANONYMOUS";
/// SASL PLAIN.
pub(crate) const PLAIN: &str = "PLAIN";
/// SASL SCRAM-SHA-256.
pub(crate) const SCRAM_SHA_256: &str = scram::SCRAM_SHA_256;
/// SASL EXTERNAL: the transport (here a TLS client certificate) authenticated.
pub(crate) const EXTERNAL: &str = "EXTERNAL";

/// What the server answers to one SASL frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SaslStep {
    /// Send a sasl-challenge with these bytes and wait for a response.
    Challenge(Vec<u8>),
    /// Authenticated: send sasl-outcome ok (with the additional data).
    Success {
        principal: Principal,
        additional_data: Option<Vec<u8>>,
    },
    /// Failed: send sasl-outcome auth and close.
    Failure(String),
    /// Failed for now (too many logins in progress): send sasl-outcome
    /// sys-temp and close.
    Unavailable(String),
    /// A password check is under way; its result comes as
    /// [`rosetta_neutral::SessionEvent::LoginChecked`].
    Pending,
}

/// Where the exchange is.
///
/// ```text
/// AwaitInit ──sasl-init SCRAM──▶ ScramFinal ──sasl-response──▶ Done
///     │└─ sasl-init PLAIN, check pending ─▶ CheckingPassword ──result──▶ Done
///     └─ sasl-init (decided at once) ─────────────────────────────────▶ Done
/// ```
#[derive(Debug, Default)]
pub(crate) enum SaslServer {
    /// Waiting for sasl-init.
    #[default]
    AwaitInit,
    /// SCRAM server-first sent; waiting for client-final.
    ScramFinal(Box<ScramPending>),
    /// A PLAIN password is being checked elsewhere; its result comes as
    /// [`rosetta_neutral::SessionEvent::LoginChecked`]. No frame is read
    /// meanwhile.
    CheckingPassword,
    /// An outcome was produced; further SASL frames are out of order.
    Done,
}

/// The mechanisms to offer. EXTERNAL comes first when the connection has
/// a verified client certificate, because clients pick the first one they
/// support and a certificate is what such a client meant to use.
pub(crate) fn mechanisms(broker: &dyn Broker, certificate_user: Option<&str>) -> Vec<&'static str> {
    let mut m = Vec::with_capacity(4);
    if certificate_user.is_some() {
        m.push(EXTERNAL);
    }
    m.extend([SCRAM_SHA_256, PLAIN]);
    if broker.anonymous_allowed() {
        m.push(ANONYMOUS);
    }
    m
}

impl SaslServer {
    /// Handles sasl-init. `sink` is where a password check that finishes
    /// later sends its result.
    pub(crate) fn on_init(
        &mut self,
        broker: &dyn Broker,
        certificate_user: Option<&str>,
        sink: &Arc<dyn EventSink>,
        mechanism: &str,
        initial_response: Option<&[u8]>,
    ) -> SaslStep {
        if !matches!(self, SaslServer::AwaitInit) {
            *self = SaslServer::Done;
            return SaslStep::Failure("sasl-init out of order".into());
        }
        *self = SaslServer::Done;
        match mechanism {
            ANONYMOUS => match broker.authenticate(None, None) {
                Ok(principal) if broker.anonymous_allowed() => SaslStep::Success {
                    principal,
                    additional_data: None,
                },
                Ok(_) => SaslStep::Failure(AuthError::AnonymousDisabled.to_string()),
                Err(e) => SaslStep::Failure(e.to_string()),
            },
            PLAIN => {
                let step = plain(
                    broker,
                    certificate_user,
                    sink,
                    initial_response.unwrap_or_default(),
                );
                if step == SaslStep::Pending {
                    *self = SaslServer::CheckingPassword;
                }
                step
            }
            EXTERNAL => external(
                broker,
                certificate_user,
                initial_response.unwrap_or_default(),
            ),
            SCRAM_SHA_256 => {
                let lookup = |user: &str| broker.scram_credentials(user);
                match scram::server_first(initial_response.unwrap_or_default(), lookup) {
                    Ok((pending, challenge)) => {
                        if let Err(e) =
                            check_certificate_user(certificate_user, Some(pending.user()))
                        {
                            return SaslStep::Failure(e.to_string());
                        }
                        *self = SaslServer::ScramFinal(Box::new(pending));
                        SaslStep::Challenge(challenge)
                    }
                    Err(e) => SaslStep::Failure(e.to_string()),
                }
            }
            other => SaslStep::Failure(format!("unsupported mechanism {other}")),
        }
    }

    /// Whether a password check is under way (input waits for it).
    pub(crate) fn checking_password(&self) -> bool {
        matches!(self, SaslServer::CheckingPassword)
    }

    /// The result of the password check this exchange waits for, as the
    /// outcome to send; `None` when no check was waited for.
    pub(crate) fn on_login_checked(
        &mut self,
        result: Result<Principal, AuthError>,
    ) -> Option<SaslStep> {
        if !self.checking_password() {
            return None;
        }
        *self = SaslServer::Done;
        Some(outcome(result))
    }

    /// Handles sasl-response.
    pub(crate) fn on_response(&mut self, response: &[u8]) -> SaslStep {
        match std::mem::replace(self, SaslServer::Done) {
            SaslServer::ScramFinal(pending) => match pending.server_final(response) {
                Ok(server_final) => SaslStep::Success {
                    principal: Principal {
                        user: Some(pending.user().into()),
                    },
                    additional_data: Some(server_final),
                },
                Err(e) => SaslStep::Failure(e.to_string()),
            },
            _ => SaslStep::Failure("sasl-response out of order".into()),
        }
    }
}

/// The step for a one-round mechanism's authentication result.
fn outcome(result: Result<Principal, AuthError>) -> SaslStep {
    match result {
        Ok(principal) => SaslStep::Success {
            principal,
            additional_data: None,
        },
        Err(AuthError::ServerBusy) => SaslStep::Unavailable(AuthError::ServerBusy.to_string()),
        Err(e) => SaslStep::Failure(e.to_string()),
    }
}

/// EXTERNAL: the initial response is an optional authorization identity
/// (RFC 4422 appendix A); when given, it must name the certificate's user.
fn external(broker: &dyn Broker, certificate_user: Option<&str>, authzid: &[u8]) -> SaslStep {
    let Some(subject) = certificate_user else {
        return SaslStep::Failure("EXTERNAL needs a verified TLS client certificate".into());
    };
    let Ok(authzid) = std::str::from_utf8(authzid) else {
        return SaslStep::Failure("authorization identity is not UTF-8".into());
    };
    let requested = (!authzid.is_empty()).then_some(authzid);
    outcome(broker.authenticate_connection(requested, None, Some(subject)))
}

/// PLAIN: `[authzid] NUL authcid NUL passwd` (RFC 4616).
fn plain(
    broker: &dyn Broker,
    certificate_user: Option<&str>,
    sink: &Arc<dyn EventSink>,
    response: &[u8],
) -> SaslStep {
    let mut parts = response.split(|b| *b == 0);
    let (Some(_authzid), Some(user), Some(pass), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return SaslStep::Failure("malformed PLAIN response".into());
    };
    let Ok(user) = std::str::from_utf8(user) else {
        return SaslStep::Failure("user name is not UTF-8".into());
    };
    let credentials = Credentials {
        user: Some(user),
        password: Some(pass),
        certificate_user,
    };
    match broker.start_login(credentials, sink) {
        LoginStart::Done(result) => outcome(result),
        LoginStart::Pending => SaslStep::Pending,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use rosetta_neutral::scram::{derive_credentials, ScramClient};
    use rosetta_neutral::ScramCredentials;

    /// Stored SCRAM credentials for `password` (what a users file holds).
    pub(crate) fn scram_creds(password: &str, salt: &[u8], iterations: u32) -> ScramCredentials {
        derive_credentials(password.as_bytes(), salt, iterations)
    }

    /// The client side of SCRAM for a test's fixed client-first-bare
    /// (`n=<user>,r=<nonce>`): returns (client-final, expected server-final).
    pub(crate) fn scram_client_final(
        password: &str,
        client_first_bare: &str,
        server_first: &str,
    ) -> (String, String) {
        let (user, nonce) = client_first_bare
            .strip_prefix("n=")
            .and_then(|rest| rest.split_once(",r="))
            .expect("client-first-bare is n=<user>,r=<nonce>");
        let mut client =
            ScramClient::with_nonce(user, password.as_bytes(), nonce).expect("a valid nonce");
        let client_final = client
            .client_final(server_first.as_bytes())
            .expect("a well-formed server-first");
        let server_final = client.expected_server_final().expect("computed").to_owned();
        (
            String::from_utf8(client_final).expect("SCRAM text"),
            server_final,
        )
    }
}
