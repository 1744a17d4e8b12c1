//! Access control over the users file: the [`AccessControl`] the core uses
//! to authenticate clients and check their permissions.
//!
//! Password checks (argon2, ~14 ms of CPU each) run on a [`HashPool`] of
//! their own, never on the caller's thread when they come through
//! [`AccessControl::authenticate_later`] (every adapter's login does): the
//! async workers keep serving other connections during a login storm, and
//! past the pool's queue a login is refused with
//! [`AuthError::ServerBusy`]. A check whose connection has gone by the time
//! a thread takes it is skipped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use rosetta_neutral::{Address, AuthError, LoginStart, PasswordCheck, Principal, ScramCredentials};

use crate::hash_pool::{self, HashPool};
use crate::users::Users;
use rosetta_config::Config;
use rosetta_core::AccessControl;

/// Users-file access control.
pub struct UsersAccess {
    /// The users file as last loaded; replaced whole when the admin API
    /// writes the file, so a login or check after that sees the new one.
    users: parking_lot::RwLock<Arc<Users>>,
    anonymous: bool,
    pool: HashPool,
    /// Logins refused because the pool's queue was full, for the log.
    busy_refusals: AtomicU64,
}

/// A refusal for a full hashing queue is logged at warn level once per
/// this many (the first included), so a storm does not flood the log.
const BUSY_LOG_EVERY: u64 = 1024;

impl UsersAccess {
    /// Access control over `users`, with anonymous access on or off, and a
    /// hashing pool of the default size.
    pub fn new(users: Users, anonymous: bool) -> anyhow::Result<Self> {
        Self::with_pool(
            users,
            anonymous,
            hash_pool::threads_default(),
            rosetta_config::PASSWORD_CHECK_QUEUE_MAX_DEFAULT,
        )
    }

    /// The users as last loaded (a snapshot: a replacement does not change
    /// it).
    pub fn users(&self) -> Arc<Users> {
        Arc::clone(&self.users.read())
    }

    /// Puts `users` in force: every login and permission check from now
    /// on uses them (sessions already open keep their principal).
    pub fn replace_users(&self, users: Users) {
        *self.users.write() = Arc::new(users);
    }

    /// Whether clients without credentials may connect.
    pub fn anonymous(&self) -> bool {
        self.anonymous
    }

    /// Access control whose password checks run on `threads` threads with
    /// room for `queue_max` waiting checks.
    pub fn with_pool(
        users: Users,
        anonymous: bool,
        threads: usize,
        queue_max: usize,
    ) -> anyhow::Result<Self> {
        let pool = HashPool::new(threads, queue_max).context("starting the hashing threads")?;
        Ok(Self {
            users: parking_lot::RwLock::new(Arc::new(users)),
            anonymous,
            pool,
            busy_refusals: AtomicU64::new(0),
        })
    }
}

/// Builds the access control the configuration asks for: the users file
/// named by `[security] users_file` (none is fine: then only anonymous
/// clients exist), `[security] anonymous`, and the hashing pool's
/// `password_check_threads` and `password_check_queue_max`.
pub fn from_config(config: &Config) -> anyhow::Result<Arc<dyn AccessControl>> {
    let access: Arc<dyn AccessControl> = users_access(config)?;
    Ok(access)
}

/// [`from_config`] as its own type, for the admin API, which reads and
/// replaces the users (`UsersAccess::users`, `UsersAccess::replace_users`).
pub fn users_access(config: &Config) -> anyhow::Result<Arc<UsersAccess>> {
    let path = config.users_file();
    let users = Users::load(&path).with_context(|| format!("users file {}", path.display()))?;
    let s = &config.security;
    let threads = s
        .password_check_threads
        .unwrap_or_else(hash_pool::threads_default);
    let access = UsersAccess::with_pool(users, s.anonymous, threads, s.password_check_queue_max)?;
    Ok(Arc::new(access))
}

/// The one password rule, for the caller's thread and the pool's alike.
fn check_password(
    users: &Users,
    anonymous: bool,
    user: Option<&str>,
    password: Option<&[u8]>,
) -> Result<Principal, AuthError> {
    match user {
        None | Some("") if password.is_none_or(<[u8]>::is_empty) => {
            if anonymous {
                Ok(Principal::anonymous())
            } else {
                Err(AuthError::AnonymousDisabled)
            }
        }
        Some(name) if users.verify(name, password.unwrap_or_default()) => Ok(Principal {
            user: Some(name.into()),
        }),
        _ => Err(AuthError::BadCredentials),
    }
}

impl AccessControl for UsersAccess {
    fn authenticate(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<Principal, AuthError> {
        check_password(&self.users(), self.anonymous, user, password)
    }

    fn authenticate_later(&self, check: PasswordCheck) -> LoginStart {
        let (users, anonymous) = (self.users(), self.anonymous);
        let job = move || {
            if check.is_abandoned() {
                // The client left (or its connect timeout passed) while
                // the check waited: nobody wants the answer.
                tracing::debug!(user = ?check.user(), "password check skipped: connection gone");
                return;
            }
            let result = check_password(&users, anonymous, check.user(), Some(check.password()));
            check.finish(result);
        };
        match self.pool.try_run(job) {
            Ok(()) => LoginStart::Pending,
            Err(e) => {
                let n = self.busy_refusals.fetch_add(1, Ordering::Relaxed);
                if n.is_multiple_of(BUSY_LOG_EVERY) {
                    tracing::warn!(error = %e, refused_so_far = n + 1, "login refused: password checks busy");
                } else {
                    tracing::debug!(error = %e, "login refused: password checks busy");
                }
                LoginStart::Done(Err(AuthError::ServerBusy))
            }
        }
    }

    fn scram_credentials(&self, user: &str) -> Option<ScramCredentials> {
        self.users.read().scram(user)
    }

    fn anonymous_allowed(&self) -> bool {
        self.anonymous
    }

    fn authenticate_certificate(&self, subject: &str) -> Result<Principal, AuthError> {
        // A verified certificate stands in for the password of an existing user.
        if self.users.read().contains(subject) {
            Ok(Principal {
                user: Some(subject.into()),
            })
        } else {
            Err(AuthError::BadCredentials)
        }
    }

    fn may_publish(&self, principal: &Principal, address: &Address) -> bool {
        self.users
            .read()
            .permissions(principal.user.as_deref())
            .may_publish(address)
    }

    fn may_subscribe(&self, principal: &Principal, address: &Address) -> bool {
        self.users
            .read()
            .permissions(principal.user.as_deref())
            .may_subscribe(address)
    }

    fn excluded_topics(&self, principal: &Principal, filter: &str) -> Vec<String> {
        self.users
            .read()
            .permissions(principal.user.as_deref())
            .excluded_topics(filter)
    }

    /// The user's roles as the users file lists them, defined and
    /// built-in alike: the balancer's `role_name` takes the first (the
    /// first its key filter keeps).
    fn roles(&self, user: &str) -> Vec<String> {
        self.users.read().roles(user).to_vec()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, Sender};
    use std::sync::Mutex;
    use std::time::Duration;

    use rosetta_neutral::{EventSink, SessionEvent};

    use super::*;

    /// Longest a test waits for a check's result.
    const WAIT: Duration = Duration::from_secs(20);

    struct ToChannel(Mutex<Sender<SessionEvent>>);

    impl EventSink for ToChannel {
        fn send(&self, event: SessionEvent) {
            if let Ok(tx) = self.0.lock() {
                let _ = tx.send(event);
            }
        }
    }

    fn access(threads: usize, queue_max: usize) -> (UsersAccess, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("users.toml");
        crate::users::add_user(&path, "alice", b"secret", None, None).expect("add alice");
        let users = Users::load(&path).expect("load");
        let access = UsersAccess::with_pool(users, false, threads, queue_max).expect("pool");
        (access, dir)
    }

    fn check(user: &str, password: &[u8], sink: &Arc<dyn EventSink>) -> PasswordCheck {
        PasswordCheck::new(Some(user), password, sink)
    }

    #[test]
    fn a_password_check_answers_through_the_connections_sink() {
        let (access, _dir) = access(1, 4);
        let (tx, rx) = channel();
        let sink: Arc<dyn EventSink> = Arc::new(ToChannel(Mutex::new(tx)));
        for (password, want) in [
            (&b"secret"[..], Ok(Some("alice".to_owned()))),
            (&b"wrong"[..], Err(AuthError::BadCredentials)),
        ] {
            let start = access.authenticate_later(check("alice", password, &sink));
            assert_eq!(start, LoginStart::Pending);
            match rx.recv_timeout(WAIT).expect("a result") {
                SessionEvent::LoginChecked { result } => {
                    assert_eq!(result.map(|p| p.user.map(String::from)), want);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// One thread, room for one waiting check: of many checks started at
    /// once, those past the queue are refused as busy at once, and every
    /// accepted one is answered exactly once.
    #[test]
    fn checks_past_the_queue_are_refused_as_busy() {
        let (access, _dir) = access(1, 1);
        let (tx, rx) = channel();
        let sink: Arc<dyn EventSink> = Arc::new(ToChannel(Mutex::new(tx)));
        let starts: Vec<LoginStart> = (0..10)
            .map(|_| access.authenticate_later(check("alice", b"secret", &sink)))
            .collect();
        let pending = starts.iter().filter(|s| **s == LoginStart::Pending).count();
        let busy = starts
            .iter()
            .filter(|s| **s == LoginStart::Done(Err(AuthError::ServerBusy)))
            .count();
        assert_eq!(pending + busy, 10, "{starts:?}");
        // ~14 ms per check: ten in a row cannot all have been taken.
        assert!(busy >= 1 && pending >= 1, "{starts:?}");
        for _ in 0..pending {
            assert!(matches!(
                rx.recv_timeout(WAIT),
                Ok(SessionEvent::LoginChecked { result: Ok(_) })
            ));
        }
        drop(access); // waits for the pool: nothing more can come
        assert!(rx.try_recv().is_err(), "one answer per accepted check");
    }
}
