//! The request dispatcher: route, authenticate and authorise, then the
//! resource's handler.

use std::path::PathBuf;
use std::sync::Arc;

use hyper::header::AUTHORIZATION;
use hyper::StatusCode;
use rosetta_server::BrokerView;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::auth::Authenticator;
use crate::error::ApiError;
use crate::http::RequestParts;
use crate::rates::Sampler;
use crate::router::{self, Action, Matched, Query};
use crate::tokens::{self, Tokens};
use crate::{
    balancer, connections, messages, overview, queues, reload, roles, sessions, streams, topics,
    users,
};
use std::time::Instant;

/// A successful answer.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) body: Option<Value>,
}

impl Reply {
    pub(crate) fn ok(body: Value) -> Self {
        Self {
            status: StatusCode::OK,
            body: Some(body),
        }
    }

    pub(crate) fn created(body: Value) -> Self {
        Self {
            status: StatusCode::CREATED,
            body: Some(body),
        }
    }

    pub(crate) fn no_content() -> Self {
        Self {
            status: StatusCode::NO_CONTENT,
            body: None,
        }
    }
}

/// Everything a request may need.
pub(crate) struct Api {
    pub(crate) broker: BrokerView,
    pub(crate) auth: Authenticator,
    pub(crate) tokens: Arc<Tokens>,
    pub(crate) users_file: PathBuf,
    /// One users-file change at a time: each reads, edits and renames the
    /// whole file.
    pub(crate) users_write: tokio::sync::Mutex<()>,
    /// Recent samples of the queues listings showed, for their rates:
    /// messages added, delivered, acknowledged.
    pub(crate) queue_rates: Sampler<String, 3>,
    /// The same for connections, by id: messages in, messages out.
    pub(crate) connection_rates: Sampler<u64, 2>,
}

impl Api {
    /// When the core's counters started counting: a queue's totals count
    /// from the broker's start (or from when it was made, and were zero
    /// before), which is what a first look at its rates measures from.
    pub(crate) fn counting_since(&self) -> Instant {
        let now = Instant::now();
        now.checked_sub(self.broker.uptime()).unwrap_or(now)
    }
}

/// One request, routed, with what the handlers read from it.
pub(crate) struct Call<'a> {
    pub(crate) matched: Matched,
    pub(crate) parts: &'a RequestParts,
    pub(crate) query: Query,
    /// The authenticated user (`None` on the health routes).
    pub(crate) user: Option<String>,
    /// The user came with a bearer token, not a password.
    pub(crate) via_token: bool,
}

impl Call<'_> {
    /// The body as JSON of type `T`; an empty body is `T`'s default when
    /// `empty` is given.
    pub(crate) fn json<T: DeserializeOwned>(&self, empty: Option<T>) -> Result<T, ApiError> {
        if self.parts.body.iter().all(u8::is_ascii_whitespace) {
            return empty.ok_or_else(|| ApiError::bad_request("a JSON body is required"));
        }
        serde_json::from_slice(&self.parts.body)
            .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))
    }

    /// A request header as UTF-8 text.
    pub(crate) fn header(&self, name: &str) -> Result<Option<String>, ApiError> {
        match self.parts.head.headers.get(name) {
            None => Ok(None),
            Some(v) => String::from_utf8(v.as_bytes().to_vec())
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("header {name} is not UTF-8"))),
        }
    }
}

impl Api {
    pub(crate) async fn handle(&self, parts: RequestParts) -> Result<Reply, ApiError> {
        let matched = router::find(&parts.head.method, parts.head.uri.path())?;
        let who = match matched.route.role {
            None => None,
            Some(needed) => {
                let authorization = parts.head.headers.get(AUTHORIZATION).map(|v| v.as_bytes());
                Some(self.auth.authorise(authorization, needed).await?)
            }
        };
        let via_token = who.as_ref().is_some_and(|w| w.via_token);
        let user = who.map(|w| w.user);
        let query = Query::parse(parts.head.uri.query())?;
        let call = Call {
            matched,
            parts: &parts,
            query,
            user,
            via_token,
        };
        match call.matched.route.action {
            // Before the broker is up, `gate` answers these two.
            Action::Healthz => Ok(Reply::ok(json!({"status": "ok"}))),
            Action::Readyz => {
                if self.broker.ready() {
                    Ok(Reply::ok(json!({"status": "ready"})))
                } else {
                    Err(ApiError::unavailable("shutting down"))
                }
            }
            Action::Overview => Ok(Reply::ok(overview::overview(&self.broker))),
            Action::ListQueues => queues::list(self, &call),
            Action::GetQueue => queues::get(self, &call),
            Action::PutQueue => queues::put(self, &call).await,
            Action::DeleteQueue => queues::delete(self, &call),
            Action::PurgeQueue => queues::purge(self, &call).await,
            Action::PeekQueue => messages::peek(self, &call),
            Action::MoveMessages => messages::move_to(self, &call).await,
            Action::ReplayDeadLetters => messages::replay(self, &call).await,
            Action::ListStreams => streams::list(self, &call),
            Action::GetStream => streams::get(self, &call),
            Action::ListSessions => sessions::list(self, &call),
            Action::GetSession => sessions::get(self, &call),
            Action::DeleteSession => sessions::delete(self, &call),
            Action::ListRetained => topics::list_retained(self, &call),
            Action::DeleteRetained => topics::delete_retained(self, &call).await,
            Action::ListSubscriptions => topics::list_subscriptions(self, &call),
            Action::ListRoles => roles::list(self, &call),
            Action::GetRole => roles::get(self, &call),
            Action::PutRole => roles::put(self, &call).await,
            Action::DeleteRole => roles::delete(self, &call).await,
            Action::Reload => reload::reload(self, &call),
            Action::CreateToken => tokens::create(self, &call),
            Action::ListTokens => tokens::list(self, &call),
            Action::RevokeToken => tokens::revoke(self, &call),
            Action::ListConnections => connections::list(self, &call),
            Action::CloseConnection => connections::close(self, &call),
            Action::ListUsers => users::list(self, &call),
            Action::CreateUser => users::create(self, &call).await,
            Action::GetUser => users::get(self, &call),
            Action::DeleteUser => users::delete(self, &call).await,
            Action::SetPassword => users::set_password(self, &call).await,
            Action::SetPermissions => users::set_permissions(self, &call).await,
            Action::SetUserRoles => users::set_roles(self, &call).await,
            Action::BalancerTarget => balancer::target(self, &call),
        }
    }
}

/// Waits for a core completion (a journal append) handed to a callback.
pub(crate) async fn durable<T>(
    start: impl FnOnce(rosetta_store::Completion) -> Result<T, rosetta_neutral::BrokerError>,
) -> Result<T, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let value = start(Box::new(move |result| {
        let _ = tx.send(result);
    }))?;
    match rx.await {
        Ok(Ok(())) => Ok(value),
        Ok(Err(e)) => Err(ApiError::internal(format!("the journal failed: {e}"))),
        Err(_) => Err(ApiError::internal("the journal dropped the write")),
    }
}
