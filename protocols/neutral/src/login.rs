//! Logging a new connection in: the one identity rule every adapter
//! applies ([`plan`]), and the password check that may finish later
//! ([`Broker::start_login`], [`PasswordCheck`]).
//!
//! ## The identity rule
//!
//! A verified TLS client certificate names a user (its subject's common
//! name, taken by the TLS layer). What the client sends next to it can
//! add proof, never change who it is:
//!
//! | certificate | user name | password | outcome |
//! |---|---|---|---|
//! | none | none | none | anonymous, if anonymous access is on |
//! | none | any | any | the password is checked for that user name |
//! | alice | none or `alice` | none | alice, if alice is in the users file |
//! | alice | none or `alice` | given | alice, if the password is alice's: both must hold |
//! | alice | `bob` | any | refused ([`AuthError::CertificateMismatch`]); bob's password is never checked |
//!
//! An empty user name or password counts as none (stomp.js always sends
//! both headers). SCRAM names its user inside the exchange: adapters
//! check that name with [`check_certificate_user`], the same rule.
//!
//! ## Cost
//! Anonymous, certificate and refused logins cost nothing and are answered
//! at once. A password check (argon2, ~14 ms of CPU) may be run elsewhere
//! by the broker: [`Broker::start_login`] then answers
//! [`LoginStart::Pending`], and the result arrives later through the
//! connection's [`EventSink`] as [`SessionEvent::LoginChecked`]. The
//! adapter reads nothing further from its client meanwhile.

use std::sync::{Arc, Weak};

use crate::broker::{AuthError, Broker, EventSink, Principal, SessionEvent};

/// What a client presented to log in: one MQTT or STOMP CONNECT, one SASL
/// PLAIN or EXTERNAL.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// The user name sent, if any.
    pub user: Option<&'a str>,
    /// The password sent, if any.
    pub password: Option<&'a [u8]>,
    /// The user named by the connection's verified TLS client certificate.
    pub certificate_user: Option<&'a str>,
}

/// What the identity rule makes of some [`Credentials`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginPlan<'a> {
    /// Decided without checking a password.
    Cheap(CheapLogin<'a>),
    /// A password to check for `user` (`None`: a password without a user
    /// name, which matches nobody).
    Password {
        /// Whose password it is.
        user: Option<&'a str>,
        /// The password.
        password: &'a [u8],
    },
}

/// A login decided without a password check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheapLogin<'a> {
    /// No credentials and no certificate.
    Anonymous,
    /// The certificate's user, with nothing else to check.
    Certificate(&'a str),
    /// Refused by the rule itself.
    Refused(AuthError),
}

impl CheapLogin<'_> {
    /// The broker's answer for this login.
    pub fn answer<B: Broker + ?Sized>(self, broker: &B) -> Result<Principal, AuthError> {
        match self {
            CheapLogin::Anonymous => broker.authenticate(None, None),
            CheapLogin::Certificate(subject) => broker.authenticate_certificate(subject),
            CheapLogin::Refused(e) => Err(e),
        }
    }
}

/// The identity rule (see the module docs).
pub fn plan<'a>(c: &Credentials<'a>) -> LoginPlan<'a> {
    // Clients that always send the fields (stomp.js) send them empty.
    let user = c.user.filter(|u| !u.is_empty());
    let password = c.password.filter(|p| !p.is_empty());
    match (c.certificate_user, password) {
        (Some(subject), _) if check_certificate_user(Some(subject), user).is_err() => {
            LoginPlan::Cheap(CheapLogin::Refused(AuthError::CertificateMismatch))
        }
        (Some(subject), None) => LoginPlan::Cheap(CheapLogin::Certificate(subject)),
        (Some(subject), Some(password)) => LoginPlan::Password {
            user: Some(subject),
            password,
        },
        (None, None) if user.is_none() => LoginPlan::Cheap(CheapLogin::Anonymous),
        (None, password) => LoginPlan::Password {
            user,
            password: password.unwrap_or_default(),
        },
    }
}

/// A user name sent next to a verified client certificate must be the
/// certificate's user: a client cannot present one identity's certificate
/// and act as another. No certificate, or no (or an empty) name: nothing
/// to check.
pub fn check_certificate_user(
    certificate_user: Option<&str>,
    user: Option<&str>,
) -> Result<(), AuthError> {
    match (certificate_user, user) {
        (Some(subject), Some(name)) if !name.is_empty() && name != subject => {
            Err(AuthError::CertificateMismatch)
        }
        _ => Ok(()),
    }
}

/// How [`Broker::start_login`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginStart {
    /// Decided now.
    Done(Result<Principal, AuthError>),
    /// A password check is under way; its result comes as
    /// [`SessionEvent::LoginChecked`] through the connection's sink.
    Pending,
}

/// A password check handed away from the connection: whose password, and
/// where the result goes. It holds the connection's sink weakly, so a
/// check whose connection is gone is seen as abandoned and can be
/// skipped, and its result then goes nowhere.
pub struct PasswordCheck {
    user: Option<String>,
    password: Vec<u8>,
    reply: Weak<dyn EventSink>,
}

impl std::fmt::Debug for PasswordCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("PasswordCheck")
            .field("user", &self.user)
            .field("abandoned", &self.is_abandoned())
            .finish_non_exhaustive()
    }
}

impl PasswordCheck {
    /// A check of `password` for `user`, answered through `reply`.
    pub fn new(user: Option<&str>, password: &[u8], reply: &Arc<dyn EventSink>) -> Self {
        Self {
            user: user.map(str::to_owned),
            password: password.to_vec(),
            reply: Arc::downgrade(reply),
        }
    }

    /// Whose password it is.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password.
    pub fn password(&self) -> &[u8] {
        &self.password
    }

    /// True once the connection that asked is gone: nobody waits for the
    /// result.
    pub fn is_abandoned(&self) -> bool {
        self.reply.strong_count() == 0
    }

    /// Sends the result to the connection, if it is still there.
    pub fn finish(self, result: Result<Principal, AuthError>) {
        if let Some(sink) = self.reply.upgrade() {
            sink.send(SessionEvent::LoginChecked { result });
        }
    }
}

/// The answer of the provided [`Broker::start_login`]: everything checked
/// at once, on the caller's thread.
pub fn answer_now<B: Broker + ?Sized>(broker: &B, c: &Credentials<'_>) -> LoginStart {
    LoginStart::Done(broker.authenticate_connection(c.user, c.password, c.certificate_user))
}

/// Scripted logins for the adapters' state-machine tests and fuzz targets:
/// a fake broker keeps one and answers [`Broker::start_login`] through
/// [`ScriptedLogins::start`], so a test can hold password checks the way a
/// broker's hashing pool does, and hand back their results itself.
#[derive(Debug, Default)]
pub struct ScriptedLogins {
    /// Password logins answer [`LoginStart::Pending`]; their checks wait in
    /// `pending`.
    pub defer_passwords: bool,
    /// Every login is refused at once with this.
    pub refuse_all: Option<AuthError>,
    /// The deferred checks, oldest first.
    pub pending: Vec<PasswordCheck>,
}

impl ScriptedLogins {
    /// The scripted answer, or `None` when the script leaves the login to
    /// the broker (which then answers with [`answer_now`]).
    pub fn start(&mut self, c: &Credentials<'_>, sink: &Arc<dyn EventSink>) -> Option<LoginStart> {
        if let Some(e) = &self.refuse_all {
            return Some(LoginStart::Done(Err(e.clone())));
        }
        match plan(c) {
            LoginPlan::Password { user, password } if self.defer_passwords => {
                self.pending.push(PasswordCheck::new(user, password, sink));
                Some(LoginStart::Pending)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds<'a>(
        user: Option<&'a str>,
        password: Option<&'a [u8]>,
        certificate_user: Option<&'a str>,
    ) -> Credentials<'a> {
        Credentials {
            user,
            password,
            certificate_user,
        }
    }

    #[test]
    fn the_identity_rule() {
        let pw: &[u8] = b"pw";
        let cases: [(Credentials<'_>, LoginPlan<'_>); 10] = [
            (
                creds(None, None, None),
                LoginPlan::Cheap(CheapLogin::Anonymous),
            ),
            (
                creds(Some(""), Some(b""), None),
                LoginPlan::Cheap(CheapLogin::Anonymous),
            ),
            (
                creds(Some("bob"), Some(pw), None),
                LoginPlan::Password {
                    user: Some("bob"),
                    password: pw,
                },
            ),
            (
                creds(Some("bob"), None, None),
                LoginPlan::Password {
                    user: Some("bob"),
                    password: b"",
                },
            ),
            (
                creds(None, Some(pw), None),
                LoginPlan::Password {
                    user: None,
                    password: pw,
                },
            ),
            (
                creds(None, None, Some("alice")),
                LoginPlan::Cheap(CheapLogin::Certificate("alice")),
            ),
            (
                creds(Some("alice"), Some(b""), Some("alice")),
                LoginPlan::Cheap(CheapLogin::Certificate("alice")),
            ),
            // Certificate and the same user's password: both are checked.
            (
                creds(Some("alice"), Some(pw), Some("alice")),
                LoginPlan::Password {
                    user: Some("alice"),
                    password: pw,
                },
            ),
            (
                creds(None, Some(pw), Some("alice")),
                LoginPlan::Password {
                    user: Some("alice"),
                    password: pw,
                },
            ),
            // alice's certificate with bob's name: refused, whatever the
            // password, without checking it.
            (
                creds(Some("bob"), Some(pw), Some("alice")),
                LoginPlan::Cheap(CheapLogin::Refused(AuthError::CertificateMismatch)),
            ),
        ];
        for (c, want) in cases {
            assert_eq!(plan(&c), want, "{c:?}");
        }
        assert_eq!(
            plan(&creds(Some("bob"), None, Some("alice"))),
            LoginPlan::Cheap(CheapLogin::Refused(AuthError::CertificateMismatch))
        );
    }

    #[test]
    fn certificate_user_check() {
        assert!(check_certificate_user(None, Some("bob")).is_ok());
        assert!(check_certificate_user(Some("alice"), None).is_ok());
        assert!(check_certificate_user(Some("alice"), Some("")).is_ok());
        assert!(check_certificate_user(Some("alice"), Some("alice")).is_ok());
        assert_eq!(
            check_certificate_user(Some("alice"), Some("bob")),
            Err(AuthError::CertificateMismatch)
        );
    }

    struct Collect(std::sync::Mutex<Vec<SessionEvent>>);

    impl EventSink for Collect {
        fn send(&self, event: SessionEvent) {
            if let Ok(mut v) = self.0.lock() {
                v.push(event);
            }
        }
    }

    #[test]
    fn a_check_answers_its_connection_while_it_is_there() {
        let collect = Arc::new(Collect(std::sync::Mutex::new(Vec::new())));
        let sink: Arc<dyn EventSink> = collect.clone();
        let check = PasswordCheck::new(Some("bob"), b"pw", &sink);
        assert!(
            !format!("{check:?}").contains("pw\""),
            "no password in logs"
        );
        assert!(!check.is_abandoned());
        check.finish(Ok(Principal::anonymous()));
        let events = collect.0.lock().map(|v| v.len()).unwrap_or(0);
        assert_eq!(events, 1);

        let check = PasswordCheck::new(Some("bob"), b"pw", &sink);
        drop(sink);
        drop(collect);
        assert!(check.is_abandoned(), "the connection is gone");
        check.finish(Err(AuthError::BadCredentials));
    }
}
