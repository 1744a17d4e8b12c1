//! Who is asking: HTTP basic credentials checked against the users file,
//! then the route's role against the user's roles.
//!
//! A password check is argon2, slow on purpose (~14 ms of CPU), and a
//! script or console polling the API would pay it on every request. So a
//! successful check is remembered for [`AUTH_CACHE_TTL_MS`], keyed by a
//! SHA-256 of the user name and password (the password itself is never
//! kept): the same credentials within that time skip argon2. Roles are
//! read from the users in force on every request, so a role change counts
//! at once; a change of the users through the API empties the cache, and a
//! remembered check counts only against the users it was made with (not
//! after a SIGHUP reload of the file), so a changed password or a deleted
//! user stops working at once too. Failed
//! checks are not remembered (a guesser pays argon2 every time), and at
//! most [`AUTH_CHECKS_CONCURRENT_MAX`] checks run at once, off the async
//! workers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64ct::Encoding;
use parking_lot::Mutex;
use rosetta_server::access::UsersAccess;
use rosetta_server::users::{AdminRole, Users};
use sha2::Digest;
use tokio::sync::Semaphore;

use crate::error::ApiError;
use crate::tokens::Tokens;

/// How long a successful password check is remembered: long enough that a
/// console refreshing every few seconds pays argon2 about once a minute,
/// short enough that a password changed by hand in the file (no reload
/// yet) stops working within a minute.
pub const AUTH_CACHE_TTL_MS: u64 = 60_000;
/// Credentials remembered at most; past it the cache is emptied (a burst
/// of distinct users is rare on an admin API, and emptying is O(1) to
/// reason about).
pub const AUTH_CACHE_ENTRIES_MAX: usize = 1_024;
/// Password checks running at once: each is ~14 ms of one core, and the
/// broker's own logins must keep their cores.
pub const AUTH_CHECKS_CONCURRENT_MAX: usize = 2;
/// Longest `Authorization` header value, in bytes: a user name and a
/// password at their limits, base64-encoded, and room to spare.
pub const AUTHORIZATION_MAX_BYTES: usize = 4_096;

/// The realm of the `WWW-Authenticate` challenge.
pub const REALM: &str = "rosetta";

type CacheKey = [u8; 32];

/// A successful check: the user, when, and the users it was checked
/// against (a reload of the file makes it void).
type Remembered = (String, Instant, Arc<Users>);

/// Who a request is from, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    /// The user.
    pub user: String,
    /// It came with a bearer token, not a password.
    pub via_token: bool,
}

/// Checks credentials and roles.
pub struct Authenticator {
    users: Arc<UsersAccess>,
    tokens: Arc<Tokens>,
    cache: Mutex<HashMap<CacheKey, Remembered>>,
    checks: Semaphore,
}

impl Authenticator {
    /// Checks against the users `users` has in force, and the bearer
    /// tokens of `tokens`.
    pub fn new(users: Arc<UsersAccess>, tokens: Arc<Tokens>) -> Self {
        Self {
            users,
            tokens,
            cache: Mutex::new(HashMap::new()),
            checks: Semaphore::new(AUTH_CHECKS_CONCURRENT_MAX),
        }
    }

    /// The users' access control (for the users routes).
    pub fn users(&self) -> &Arc<UsersAccess> {
        &self.users
    }

    /// Forgets every remembered check (the users changed).
    pub fn forget_all(&self) {
        self.cache.lock().clear();
    }

    /// The user named by `authorization` (the header's value: basic
    /// credentials or a bearer token), if the credentials are right and
    /// the user holds `needed` (or a stronger role): 401 without or with
    /// wrong credentials, 403 without the role.
    pub async fn authorise(
        &self,
        authorization: Option<&[u8]>,
        needed: AdminRole,
    ) -> Result<Who, ApiError> {
        if let Some(token) = authorization.and_then(crate::tokens::bearer) {
            let user = self
                .tokens
                .user_of(token)
                .filter(|user| self.users.users().summary(user).is_some())
                .ok_or_else(|| {
                    tracing::info!("admin API: unknown, expired or revoked bearer token");
                    ApiError::unauthorized("unknown, expired or revoked token")
                })?;
            return self.role_check(user, needed).map(|user| Who {
                user,
                via_token: true,
            });
        }
        let (user, password) = parse_basic(authorization)?;
        let key = cache_key(&user, &password);
        let users = self.users.users();
        if !self.remembered(&key, &user, &users) {
            let snapshot = Arc::clone(&users);
            let permit = self
                .checks
                .acquire()
                .await
                .map_err(|_| ApiError::unavailable("shutting down"))?;
            let name = user.clone();
            let ok = tokio::task::spawn_blocking(move || snapshot.verify(&name, &password))
                .await
                .map_err(|_| ApiError::internal("the password check failed"))?;
            drop(permit);
            if !ok {
                tracing::info!(user = %user, "admin API: wrong user name or password");
                return Err(ApiError::unauthorized("wrong user name or password"));
            }
            self.remember(key, &user, users);
        }
        self.role_check(user, needed).map(|user| Who {
            user,
            via_token: false,
        })
    }

    /// `user` if it holds `needed` (or a stronger role), else 403.
    fn role_check(&self, user: String, needed: AdminRole) -> Result<String, ApiError> {
        match self.users.users().highest_role(&user) {
            Some(role) if role.grants(needed) => Ok(user),
            held => Err(ApiError::forbidden(format!(
                "user '{user}' needs the role '{needed}' (or stronger); it has {}",
                held.map_or("none".to_owned(), |r| format!("'{r}'"))
            ))),
        }
    }

    fn remembered(&self, key: &CacheKey, user: &str, users: &Arc<Users>) -> bool {
        let mut cache = self.cache.lock();
        match cache.get(key) {
            Some((name, at, checked_against))
                if name == user && at.elapsed() < ttl() && Arc::ptr_eq(checked_against, users) =>
            {
                true
            }
            Some(_) => {
                cache.remove(key);
                false
            }
            None => false,
        }
    }

    fn remember(&self, key: CacheKey, user: &str, users: Arc<Users>) {
        let mut cache = self.cache.lock();
        if cache.len() >= AUTH_CACHE_ENTRIES_MAX {
            cache.clear();
        }
        cache.insert(key, (user.to_owned(), Instant::now(), users));
    }
}

fn ttl() -> Duration {
    Duration::from_millis(AUTH_CACHE_TTL_MS)
}

fn cache_key(user: &str, password: &[u8]) -> CacheKey {
    let mut h = sha2::Sha256::new();
    // The length first, so that ("ab", "c") and ("a", "bc") differ.
    h.update((user.len() as u64).to_be_bytes());
    h.update(user.as_bytes());
    h.update(password);
    h.finalize().into()
}

/// The user name and password of a `Basic` authorization value.
fn parse_basic(value: Option<&[u8]>) -> Result<(String, Vec<u8>), ApiError> {
    let missing = || ApiError::unauthorized("HTTP basic credentials are required");
    let value = value.ok_or_else(missing)?;
    if value.len() > AUTHORIZATION_MAX_BYTES {
        return Err(ApiError::unauthorized(
            "the Authorization header is too long",
        ));
    }
    let value = std::str::from_utf8(value).map_err(|_| missing())?;
    let (scheme, encoded) = value.trim().split_once(' ').ok_or_else(missing)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(ApiError::unauthorized(format!(
            "unsupported authorization scheme {scheme:?}: use Basic or Bearer"
        )));
    }
    let decoded = base64ct::Base64::decode_vec(encoded.trim())
        .map_err(|_| ApiError::unauthorized("malformed basic credentials (not base64)"))?;
    let colon = decoded
        .iter()
        .position(|&b| b == b':')
        .ok_or_else(|| ApiError::unauthorized("malformed basic credentials (no ':')"))?;
    let user = String::from_utf8(decoded[..colon].to_vec())
        .map_err(|_| ApiError::unauthorized("the user name is not UTF-8"))?;
    Ok((user, decoded[colon + 1..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_parse_and_bad_ones_are_401() {
        let header = format!("Basic {}", base64ct::Base64::encode_string(b"al:ice:pw"));
        let (user, password) = parse_basic(Some(header.as_bytes())).expect("parses");
        assert_eq!((user.as_str(), password.as_slice()), ("al", &b"ice:pw"[..]));
        for bad in [
            None,
            Some(&b"Bearer x"[..]),
            Some(b"Basic !!!"),
            Some(b"Basic"),
        ] {
            let e = parse_basic(bad).expect_err("refused");
            assert_eq!(e.status, hyper::StatusCode::UNAUTHORIZED, "{bad:?}");
        }
        assert_ne!(cache_key("ab", b"c"), cache_key("a", b"bc"));
    }
}
