//! The admin HTTP API (issue 18): what an operator looks at and acts with,
//! as JSON over HTTP/1.1 on its own listener (`[admin] listen`, loopback
//! by default) and, with `[admin] on_http_port`, on the broker's HTTP
//! (WebSocket) port too, which hands those paths over
//! (`rosetta_server::AdminOnHttpPort`). The console and the CLI use it and
//! nothing else.
//!
//! ## Shape
//! - `GET /healthz` (live) and `GET /readyz` (recovered and listening; 503
//!   while the journal is recovered and once the shutdown begins) need no
//!   credentials, for orchestrators. The listener is up before recovery
//!   ([`start_early`], then [`AdminServer::attach`]; `gate`).
//! - Every `/api/v1/` request needs HTTP basic credentials of a user in the
//!   users file, or a bearer token made for one ([`tokens`]), ([`auth`])
//!   holding the route's role ([`router::ROUTES`]):
//!   `monitoring` reads, `management` also acts on queues and connections,
//!   `administrator` also manages users.
//! - Errors are `{"error": ..., "reason": ...}` with 400, 401 (with
//!   `WWW-Authenticate: Basic realm="rosetta"`), 403, 404, 405 (with
//!   `Allow`), 409, 413 or 500 ([`error`]).
//! - Listings are `{"items", "page", "page_size", "total"}`, `?page=`
//!   (from 1), `&page_size=` (at most [`listing::PAGE_SIZE_MAX`]),
//!   `&name=` (substring) ([`listing`]).
//!
//! - The web console (`console`): static files at `/console/`, built
//!   into the binary, using only this API.
//!
//! ## Layout
//! `http` (listener, limits) → `api` (route, authenticate, dispatch) →
//! `overview`, `queues`, `messages` (peek, move, replay), `connections`,
//! `sessions`, `topics` (retained messages, subscriptions), `users`,
//! `roles` (one resource each).
//!
//! It depends on the server (the server does not know it): the binary
//! starts this, then the broker, and hands this the broker's
//! [`BrokerView`].

mod api;
pub mod auth;
mod balancer;
mod connections;
mod console;
pub mod error;
mod gate;
mod http;
pub mod listing;
pub mod messages;
mod overview;
mod queues;
mod rates;
mod reload;
mod roles;
pub mod router;
mod sessions;
mod streams;
pub mod tokens;
mod topics;
mod users;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use rosetta_config::{Config, ListenerKind};
use rosetta_server::access::UsersAccess;
use rosetta_server::BrokerView;
use tokio::sync::watch;

pub use balancer::TARGET_KEY_MAX_BYTES;
pub use connections::{REASON_DEFAULT, REASON_HEADER, REASON_MAX_BYTES};
pub use http::{
    ADMIN_CONNECTIONS_MAX, REQUEST_BODY_MAX_BYTES, REQUEST_HEAD_MAX_BYTES, REQUEST_HEAD_TIMEOUT_MS,
    SHUTDOWN_GRACE_MS,
};
pub use reload::{reload_all, Reloaded};
pub use sessions::MQTT_SESSION_QUEUE_PREFIX;

/// A running admin API.
pub struct AdminServer {
    /// The admin listener's address; `None` when only the HTTP port
    /// serves the API (`listen = ""` with `on_http_port`).
    addr: Option<SocketAddr>,
    gate: Arc<gate::Gate>,
    /// Also on the broker's HTTP port(s) (`[admin] on_http_port`).
    on_http_port: bool,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl AdminServer {
    /// The admin listener's address (useful with port 0); `None` when the
    /// API is served on the HTTP port only.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Puts the broker, recovered and listening, behind the API: from now
    /// on `/readyz` says ready and the API answers, on the HTTP port too
    /// with `[admin] on_http_port`.
    pub fn attach(&self, broker: BrokerView) {
        if self.on_http_port {
            let served = http::OnHttpPort::new(Arc::clone(&self.gate), self.stop.subscribe());
            broker.serve_admin_on_http_port(Arc::new(served));
        }
        self.gate.attach(broker);
    }

    /// Stops accepting and lets open requests finish (bounded).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}

/// Binds `[admin] listen` of the broker's configuration and serves the
/// API over `broker`; `Ok(None)` when the API is off. `users` is the
/// access control the broker runs with: the API checks its credentials
/// against it and puts the users file back in force through it after each
/// change.
pub async fn start(
    broker: BrokerView,
    users: Arc<UsersAccess>,
) -> anyhow::Result<Option<AdminServer>> {
    let admin = start_early(broker.config(), users).await?;
    if let Some(admin) = &admin {
        admin.attach(broker);
    }
    Ok(admin)
}

/// [`start`] before there is a broker, so that health checks are answered
/// while the journal is recovered: `/healthz` 200, `/readyz` and the API
/// 503 until [`AdminServer::attach`]. (The HTTP port is bound only once
/// the journal is recovered, so this concerns the admin listener.)
pub async fn start_early(
    config: &Config,
    users: Arc<UsersAccess>,
) -> anyhow::Result<Option<AdminServer>> {
    if !config.admin.served() {
        tracing::info!("admin API off ([admin] listen = \"\" or enabled = false)");
        return Ok(None);
    }
    let tokens = Arc::new(tokens::Tokens::load(&config.data_dir).context("admin API tokens")?);
    let gate = Arc::new(gate::Gate::new(users, tokens, config.users_file()));
    let (stop, stop_rx) = watch::channel(false);
    let mut addr = None;
    let mut task = None;
    if let Some(listen) = config.admin.listen_addr() {
        let listener = tokio::net::TcpListener::bind(listen.to_string())
            .await
            .with_context(|| format!("admin API ([admin] listen) on {listen}"))?;
        let bound = listener.local_addr()?;
        task = Some(tokio::spawn(http::serve(
            listener,
            Arc::clone(&gate),
            stop_rx,
        )));
        tracing::info!(addr = %bound, "admin API listening");
        if !bound.ip().is_loopback() {
            tracing::warn!(addr = %bound, "the admin API is reachable from the network: it is HTTP without TLS, so basic credentials cross the network in the clear");
        }
        addr = Some(bound);
    }
    let on_http_port = config.admin.served_on_http_port();
    if on_http_port {
        say_where_on_http_port(config);
    }
    Ok(Some(AdminServer {
        addr,
        gate,
        on_http_port,
        stop,
        task,
    }))
}

/// Says which HTTP ports serve the API (`[admin] on_http_port`), and warns
/// when one is plain HTTP off loopback.
fn say_where_on_http_port(config: &Config) {
    let http_ports: Vec<_> = config
        .active_listeners()
        .into_iter()
        .filter(|(kind, _)| {
            matches!(
                kind,
                ListenerKind::WebSocket | ListenerKind::Wss | ListenerKind::Any
            )
        })
        .collect();
    if http_ports.is_empty() {
        tracing::warn!("[admin] on_http_port is set but no HTTP listener ([listeners] websocket, wss or any) is on");
    }
    for (kind, addr) in http_ports {
        tracing::info!(listener = kind.key(), %addr, "admin API and console also on this HTTP port");
        if kind != ListenerKind::Wss && !addr.is_loopback() {
            tracing::warn!(listener = kind.key(), %addr, "the admin API is served on an HTTP port open to the network: without TLS (wss), basic credentials cross the network in the clear");
        }
    }
}
