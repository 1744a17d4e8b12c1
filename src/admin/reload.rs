//! `POST /api/v1/reload`: what SIGHUP does, over the API: the users file
//! and the TLS certificate and key are read again. Each is put in force
//! only if it loads (the users file parses; the certificate and key parse
//! and belong together); one that does not is refused with its error and
//! the one in force stays, while the other is still reloaded. New logins
//! and new TLS handshakes see the result; open connections keep theirs.

use rosetta_server::access::UsersAccess;
use rosetta_server::users::Users;
use rosetta_server::BrokerView;
use serde_json::json;

use crate::api::{Api, Call, Reply};
use crate::error::ApiError;

/// What one reload did, for the log and the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Users now in force, or why the file was refused.
    pub users: Result<usize, String>,
    /// Whether a TLS certificate was reloaded (`Ok(false)`: no TLS), or why
    /// it was refused.
    pub tls: Result<bool, String>,
}

/// Reloads the users file at `users_file` into `access` and the TLS
/// certificate of `broker`, logging each outcome (`trigger` names what
/// asked: "SIGHUP" or "admin API").
pub fn reload_all(
    users_file: &std::path::Path,
    access: &UsersAccess,
    broker: &BrokerView,
    trigger: &str,
) -> Reloaded {
    let users = match Users::load(users_file) {
        Ok(users) => {
            let count = users.len();
            access.replace_users(users);
            tracing::info!(file = %users_file.display(), users = count, trigger, "users file reloaded");
            Ok(count)
        }
        Err(e) => {
            tracing::error!(file = %users_file.display(), error = %e, trigger, "the users file does not load; the users in force stay");
            Err(e.to_string())
        }
    };
    let tls = broker.reload_tls().map_err(|e| {
        tracing::error!(error = %e, trigger, "the TLS certificate does not load; the one in force stays");
        e.to_string()
    });
    Reloaded { users, tls }
}

pub(crate) fn reload(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let done = reload_all(&api.users_file, api.auth.users(), &api.broker, "admin API");
    tracing::info!(user = ?call.user, "admin API: reload");
    let mut refused = Vec::new();
    if let Err(e) = &done.users {
        refused.push(format!("users file: {e}"));
    }
    if let Err(e) = &done.tls {
        refused.push(format!("TLS certificate: {e}"));
    }
    if !refused.is_empty() {
        return Err(ApiError::conflict(format!(
            "refused, what was in force stays: {}",
            refused.join("; ")
        )));
    }
    Ok(Reply::ok(json!({
        "users": done.users.unwrap_or_default(),
        "tls_reloaded": done.tls.unwrap_or_default(),
    })))
}
