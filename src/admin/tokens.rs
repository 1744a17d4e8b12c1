//! Bearer tokens: `POST /api/v1/tokens` makes one for the caller (or, for
//! an administrator, for another user); `Authorization: Bearer <token>`
//! then stands for that user's password until it expires or is revoked
//! (`DELETE /api/v1/tokens/{id}`).
//!
//! A token is [`TOKEN_BYTES`] random bytes, shown once, at creation. The
//! broker keeps only its SHA-256 (a token has 256 bits of entropy, so a
//! fast hash suffices where a password needs argon2), with the user and
//! the expiry, in `<data_dir>/admin-tokens.json`, written atomically
//! (temporary file, sync, rename; mode 0600), so tokens survive a
//! restart. A token grants what its user's roles grant at each request,
//! so a role taken away counts at once, and a deleted user's tokens stop
//! working. A token cannot make tokens: that needs the password, so a
//! leaked token cannot outlive its expiry.

use std::path::{Path, PathBuf};

use base64ct::Encoding;
use parking_lot::Mutex;
use rosetta_server::users::AdminRole;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Digest;

use crate::api::{Api, Call, Reply};
use crate::error::ApiError;
use crate::listing::PageRequest;

/// Random bytes in a token: 256 bits, beyond guessing.
pub const TOKEN_BYTES: usize = 32;
/// What every token starts with, so a leaked one is recognisable (secret
/// scanners look for such prefixes).
pub const TOKEN_PREFIX: &str = "rosetta_";
/// Lifetime of a token when the request names none: a working day and
/// night of a console or a script.
pub const TOKEN_TTL_S_DEFAULT: u64 = 86_400;
/// Longest lifetime: a year, so no token is forever.
pub const TOKEN_TTL_S_MAX: u64 = 365 * 86_400;
/// Tokens kept at most (expired ones are dropped first): bounds the file
/// and the work of each change.
pub const TOKENS_MAX: usize = 1_000;
/// The file the tokens are kept in, in the data directory.
pub const TOKENS_FILE: &str = "admin-tokens.json";

/// One token as the broker keeps it: never the token itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Stored {
    /// Names it in listings and for revocation.
    id: String,
    user: String,
    /// SHA-256 of the token, hex.
    sha256: String,
    created_at_ms: u64,
    expires_at_ms: u64,
}

/// The tokens in force, and their file.
#[derive(Debug)]
pub struct Tokens {
    path: PathBuf,
    stored: Mutex<Vec<Stored>>,
}

fn now_ms() -> u64 {
    rosetta_neutral::message::now_ms()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn digest(token: &str) -> String {
    hex(&sha2::Sha256::digest(token.as_bytes()))
}

impl Tokens {
    /// The tokens of `<data_dir>/admin-tokens.json` (none if it does not
    /// exist yet); a file that does not parse is an error.
    pub fn load(data_dir: &Path) -> anyhow::Result<Tokens> {
        let path = data_dir.join(TOKENS_FILE);
        let stored = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(anyhow::anyhow!("{}: {e}", path.display())),
        };
        Ok(Tokens {
            path,
            stored: Mutex::new(stored),
        })
    }

    /// The user a token stands for, if it is one of ours and unexpired.
    pub fn user_of(&self, token: &str) -> Option<String> {
        let wanted = digest(token);
        let now = now_ms();
        self.stored
            .lock()
            .iter()
            .find(|t| t.sha256 == wanted && t.expires_at_ms > now)
            .map(|t| t.user.clone())
    }

    /// Makes a token for `user` living `ttl_s` seconds: the token (shown
    /// once) and what is kept of it.
    fn create(&self, user: &str, ttl_s: u64) -> Result<(String, Stored), ApiError> {
        let secret: [u8; TOKEN_BYTES] = rand::random();
        let id: [u8; 8] = rand::random();
        let token = format!(
            "{TOKEN_PREFIX}{}",
            base64ct::Base64UrlUnpadded::encode_string(&secret)
        );
        let now = now_ms();
        let kept = Stored {
            id: hex(&id),
            user: user.to_owned(),
            sha256: digest(&token),
            created_at_ms: now,
            expires_at_ms: now.saturating_add(ttl_s.saturating_mul(1_000)),
        };
        self.change(|all| {
            all.retain(|t| t.expires_at_ms > now);
            if all.len() >= TOKENS_MAX {
                return Err(ApiError::conflict(format!(
                    "{TOKENS_MAX} tokens exist already; revoke some"
                )));
            }
            all.push(kept.clone());
            Ok(())
        })?;
        Ok((token, kept))
    }

    /// Revokes token `id` if `may` allows it; whether there was one.
    fn revoke(&self, id: &str, may: impl Fn(&Stored) -> bool) -> Result<bool, ApiError> {
        let mut found = false;
        self.change(|all| {
            let before = all.len();
            all.retain(|t| !(t.id == id && may(t)));
            found = all.len() < before;
            Ok(())
        })?;
        Ok(found)
    }

    /// The unexpired tokens.
    fn list(&self) -> Vec<Stored> {
        let now = now_ms();
        self.stored
            .lock()
            .iter()
            .filter(|t| t.expires_at_ms > now)
            .cloned()
            .collect()
    }

    /// Applies `edit` and writes the file; in force only once written.
    fn change(
        &self,
        edit: impl FnOnce(&mut Vec<Stored>) -> Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        let mut stored = self.stored.lock();
        let mut next = stored.clone();
        edit(&mut next)?;
        let text = serde_json::to_vec_pretty(&next)
            .map_err(|e| ApiError::internal(format!("tokens: {e}")))?;
        // Small (at most TOKENS_MAX short entries), and one change at a
        // time under the lock: written in place of an async task.
        rosetta_server::users::write_atomic(&self.path, &text)
            .map_err(|e| ApiError::internal(format!("{}: {e}", self.path.display())))?;
        *stored = next;
        Ok(())
    }
}

/// The token of a `Bearer` authorization value, if it is one.
pub(crate) fn bearer(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

fn item(t: &Stored) -> Value {
    json!({
        "id": t.id,
        "user": t.user,
        "created_at_ms": t.created_at_ms,
        "expires_at_ms": t.expires_at_ms,
    })
}

/// The body of `POST /api/v1/tokens` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewToken {
    /// For whom; default the caller (another user: administrators only).
    user: Option<String>,
    /// Lifetime in seconds, 1 to [`TOKEN_TTL_S_MAX`].
    expires_in_s: Option<u64>,
}

/// Whether the caller is an administrator (may act on others' tokens).
fn is_administrator(api: &Api, user: &str) -> bool {
    api.auth
        .users()
        .users()
        .highest_role(user)
        .is_some_and(|r| r.grants(AdminRole::Administrator))
}

fn caller<'a>(call: &'a Call<'_>) -> &'a str {
    call.user.as_deref().unwrap_or_default()
}

pub(crate) fn create(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    if call.via_token {
        return Err(ApiError::forbidden(
            "a token cannot make tokens: use the password",
        ));
    }
    let wanted: NewToken = call.json(Some(NewToken::default()))?;
    let me = caller(call);
    let user = wanted.user.as_deref().unwrap_or(me);
    if user != me && !is_administrator(api, me) {
        return Err(ApiError::forbidden(format!(
            "only an administrator makes tokens for another user than '{me}'"
        )));
    }
    if api.auth.users().users().summary(user).is_none() {
        return Err(ApiError::not_found(format!("no user '{user}'")));
    }
    let ttl_s = wanted.expires_in_s.unwrap_or(TOKEN_TTL_S_DEFAULT);
    if ttl_s == 0 || ttl_s > TOKEN_TTL_S_MAX {
        return Err(ApiError::bad_request(format!(
            "expires_in_s must be 1 to {TOKEN_TTL_S_MAX}"
        )));
    }
    let (token, kept) = api.tokens.create(user, ttl_s)?;
    tracing::info!(id = %kept.id, for_user = %user, user = %me, ttl_s, "admin API: token created");
    let mut body = item(&kept);
    body["token"] = json!(token);
    Ok(Reply::created(body))
}

pub(crate) fn list(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let page = PageRequest::from_query(&call.query)?;
    let me = caller(call);
    let all_of_them = is_administrator(api, me);
    let visible: Vec<Stored> = api
        .tokens
        .list()
        .into_iter()
        .filter(|t| all_of_them || t.user == me)
        .collect();
    Ok(Reply::ok(page.answer_all(visible, |t| &t.user, item)))
}

pub(crate) fn revoke(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let id = call.matched.param();
    let me = caller(call);
    let all_of_them = is_administrator(api, me);
    // Another user's token is "not found" to a non-administrator, so its
    // id says nothing.
    if !api.tokens.revoke(id, |t| all_of_them || t.user == me)? {
        return Err(ApiError::not_found(format!("no token '{id}'")));
    }
    tracing::info!(id = %id, user = %me, "admin API: token revoked");
    Ok(Reply::no_content())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_kept_hashed_and_survive_a_reload_until_revoked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tokens = Tokens::load(dir.path()).expect("no file yet");
        let (token, kept) = tokens.create("ops", 60).expect("create");
        assert!(token.starts_with(TOKEN_PREFIX));
        assert_eq!(tokens.user_of(&token).as_deref(), Some("ops"));
        assert_eq!(tokens.user_of("rosetta_nope"), None);
        let file = std::fs::read_to_string(dir.path().join(TOKENS_FILE)).expect("file");
        assert!(!file.contains(&token[TOKEN_PREFIX.len()..]), "{file}");
        let again = Tokens::load(dir.path()).expect("reload");
        assert_eq!(again.user_of(&token).as_deref(), Some("ops"));
        assert!(!again.revoke(&kept.id, |_| false).expect("refused"));
        assert!(again.revoke(&kept.id, |_| true).expect("revoke"));
        assert_eq!(again.user_of(&token), None);
        assert_eq!(
            bearer(format!("Bearer {token}").as_bytes()),
            Some(token.as_str())
        );
        assert_eq!(bearer(b"Basic abc"), None);
    }
}
