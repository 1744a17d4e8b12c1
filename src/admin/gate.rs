//! The API before the broker is up: the listener is bound before the
//! journal is recovered, so an orchestrator probing during a long recovery
//! gets answers instead of refused connections: `/healthz` 200 (the
//! process is alive), `/readyz` 503, and every other route 503 with the
//! usual JSON error (after routing, so an unknown path is still 404).
//! Once [`Gate::attach`] has the broker, requests go to the [`Api`].

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use rosetta_server::access::UsersAccess;
use rosetta_server::BrokerView;
use serde_json::json;

use crate::api::{Api, Reply};
use crate::auth::Authenticator;
use crate::error::ApiError;
use crate::http::RequestParts;
use crate::router::{self, Action};
use crate::tokens::Tokens;

/// What a request is answered with before and after the broker is up.
pub(crate) struct Gate {
    users: Arc<UsersAccess>,
    tokens: Arc<Tokens>,
    users_file: PathBuf,
    api: OnceLock<Arc<Api>>,
}

/// Why the API answers 503 before the broker is up.
const STARTING: &str = "starting: the journal is being recovered";

impl Gate {
    pub(crate) fn new(users: Arc<UsersAccess>, tokens: Arc<Tokens>, users_file: PathBuf) -> Self {
        Self {
            users,
            tokens,
            users_file,
            api: OnceLock::new(),
        }
    }

    /// Puts the recovered, listening broker behind the API. A second call
    /// changes nothing (there is one broker per process).
    pub(crate) fn attach(&self, broker: BrokerView) {
        let _ = self.api.set(Arc::new(Api {
            broker,
            auth: Authenticator::new(Arc::clone(&self.users), Arc::clone(&self.tokens)),
            tokens: Arc::clone(&self.tokens),
            users_file: self.users_file.clone(),
            users_write: tokio::sync::Mutex::new(()),
            queue_rates: Default::default(),
            connection_rates: Default::default(),
        }));
    }

    pub(crate) async fn handle(&self, parts: RequestParts) -> Result<Reply, ApiError> {
        if let Some(api) = self.api.get() {
            return api.handle(parts).await;
        }
        let matched = router::find(&parts.head.method, parts.head.uri.path())?;
        match matched.route.action {
            Action::Healthz => Ok(Reply::ok(json!({"status": "ok"}))),
            _ => Err(ApiError::unavailable(STARTING)),
        }
    }
}
