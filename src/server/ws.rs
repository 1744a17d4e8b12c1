//! WebSocket for all three protocols on one HTTP port, and the demo page.
//!
//! [`accept`] reads the HTTP request head itself (bounded in size, header
//! count and time) so that it can answer a plain GET with the demo page and
//! refuse a bad upgrade with a clear status and a text body, then frames
//! the upgraded connection itself ([`WsByteStream`]). Which protocol a
//! WebSocket speaks is chosen by [`route`]:
//!
//! | path               | offered `Sec-WebSocket-Protocol`                 | protocol |
//! | ------------------ | ------------------------------------------------ | -------- |
//! | `/mqtt`            | `mqtt`, `mqttv3.1`, or none                      | MQTT     |
//! | `/stomp`           | `v10.stomp`, `v11.stomp`, `v12.stomp`, `stomp`, or none | STOMP |
//! | `/amqp`            | `amqp`, or none                                  | AMQP 1.0 |
//! | any other path     | the first offered one of the above               | its protocol |
//!
//! The chosen subprotocol is echoed exactly as offered: browsers fail a
//! connection whose offered subprotocols were all ignored. Refusals: 400
//! for a malformed upgrade or no usable subprotocol, 403 for an Origin not
//! in `websocket.allowed_origins`, 426 for a WebSocket version other than
//! 13 (or a plain GET of a protocol path), 404 for an unknown plain path,
//! 405 for other methods, 431 for an oversized head.
//!
//! With `[admin] on_http_port`, plain (not upgrade) requests for the admin
//! API's paths (`/api/...`, `/healthz`, `/readyz`, `/console...`, see
//! [`is_admin_path`]) are handed whole to the admin API's own HTTP server
//! ([`AdminOnHttpPort`]), which authenticates and authorises them as on
//! its own listener; every other path is answered here as before.
//!
//! The protocol adapters are byte oriented, so [`WsByteStream`] (in
//! `ws_frames`, which does the framing itself) turns the message stream
//! into a byte stream: see its docs for the rules.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite;

use rosetta_config::WebSocketConfig as WsSettings;

use super::detect::Rewind;
use super::protocols::Wire;
pub(crate) use super::ws_frames::WsByteStream;
use super::Shared;

/// A byte stream handed to another HTTP server.
pub trait HttpStream: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> HttpStream for T {}

/// Serves the admin API on the HTTP port (`[admin] on_http_port`). The
/// admin crate implements it and hands it to the broker
/// ([`crate::BrokerView::serve_admin_on_http_port`]): the server does not
/// know that crate.
pub trait AdminOnHttpPort: Send + Sync {
    /// Serves HTTP on `io`, whose first request (already read here) it
    /// reads again from the start, for the client at `peer`.
    fn serve(
        &self,
        io: Box<dyn HttpStream>,
        peer: SocketAddr,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// Whether a plain request for `path` is the admin API's when it is served
/// on this port: its routes (`/api/...`, `/healthz`, `/readyz`) and the
/// console (`/console`, `/console/...`). `/`, the demo page and
/// `/metrics` stay this port's own.
pub(crate) fn is_admin_path(path: &str) -> bool {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    path == "/healthz" || path == "/readyz" || under("/api") || under("/console")
}

/// Time for the client to send its request head and read our answer: a
/// browser sends the head at once; this only bounds idle sockets.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest HTTP request head: browsers send 1-2 KiB; cookies for a shared
/// host name can add a few more.
const REQUEST_HEAD_MAX_BYTES: usize = 16 * 1024;
/// Most request headers parsed: browsers send about 15.
const REQUEST_HEADERS_MAX: usize = 64;
/// Which protocol a WebSocket connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WsWire {
    /// MQTT 3.1.1 / 5.0.
    Mqtt,
    /// STOMP 1.0-1.2.
    Stomp,
    /// AMQP 1.0 (OASIS AMQP WebSocket Binding).
    Amqp,
}

impl From<WsWire> for Wire {
    fn from(wire: WsWire) -> Self {
        match wire {
            WsWire::Mqtt => Wire::Mqtt,
            WsWire::Stomp => Wire::Stomp,
            WsWire::Amqp => Wire::Amqp,
        }
    }
}

impl WsWire {
    pub(crate) fn name(self) -> &'static str {
        match self {
            WsWire::Mqtt => "MQTT",
            WsWire::Stomp => "STOMP",
            WsWire::Amqp => "AMQP",
        }
    }

    /// The protocol served on a path, if the path names one.
    fn from_path(path: &str) -> Option<Self> {
        match path {
            "/mqtt" => Some(WsWire::Mqtt),
            "/stomp" => Some(WsWire::Stomp),
            "/amqp" => Some(WsWire::Amqp),
            _ => None,
        }
    }

    /// The protocol of a `Sec-WebSocket-Protocol` token (compared without
    /// case: some clients capitalise).
    fn from_subprotocol(token: &str) -> Option<Self> {
        SUBPROTOCOLS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(token))
            .map(|(_, wire)| *wire)
    }
}

/// The subprotocols we speak: MQTT's registered names (MQTT 5.0, 6.0;
/// `mqttv3.1` for MQTT 3.1 clients), STOMP's versioned names as used by
/// stomp.js, RabbitMQ and ActiveMQ, and AMQP's (AMQP WebSocket Binding 2.1).
const SUBPROTOCOLS: &[(&str, WsWire)] = &[
    ("mqtt", WsWire::Mqtt),
    ("mqttv3.1", WsWire::Mqtt),
    ("v12.stomp", WsWire::Stomp),
    ("v11.stomp", WsWire::Stomp),
    ("v10.stomp", WsWire::Stomp),
    ("stomp", WsWire::Stomp),
    ("amqp", WsWire::Amqp),
];

/// A static file of the demo page.
#[derive(Debug)]
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

/// Where Prometheus scrapes (`[websocket] metrics`).
const METRICS_PATH: &str = "/metrics";
/// The Prometheus text exposition format, version 0.0.4.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const INDEX_HTML: &[u8] = include_bytes!("static/index.html");

/// The demo page and what it loads (see `static/README.md`).
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: INDEX_HTML,
    },
    Asset {
        path: "/index.html",
        content_type: "text/html; charset=utf-8",
        body: INDEX_HTML,
    },
    Asset {
        path: "/mqtt.min.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("static/mqtt.min.js"),
    },
];

/// An HTTP request head, copied out of the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestHead {
    method: String,
    /// The path without the query string.
    path: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    minor_version: u8,
    /// Names as sent; compare without case.
    headers: Vec<(String, String)>,
}

impl RequestHead {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The comma-separated tokens of every header called `name`.
    fn tokens<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
    }

    fn has_token(&self, name: &str, token: &str) -> bool {
        self.tokens(name).any(|t| t.eq_ignore_ascii_case(token))
    }
}

/// What to do with a request.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// Serve a static file (without its body for HEAD).
    Asset {
        asset: &'static Asset,
        head_only: bool,
    },
    /// Prometheus metrics (without the body for HEAD), when enabled.
    Metrics { head_only: bool },
    /// Upgrade to a WebSocket speaking `wire`.
    Upgrade {
        wire: WsWire,
        /// The offered subprotocol to echo, exactly as offered.
        subprotocol: Option<String>,
        /// `Sec-WebSocket-Key`, for the accept hash.
        key: String,
    },
}

impl PartialEq for Asset {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl Eq for Asset {}

/// A refused request: the status and a one-line text body saying why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// HTTP status code.
    pub(crate) status: u16,
    /// Plain-text explanation sent as the body.
    pub(crate) message: String,
}

impl Refusal {
    fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status,
            reason(self.status),
            self.message
        )
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        426 => "Upgrade Required",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

fn supported_list(filter: Option<WsWire>) -> String {
    SUBPROTOCOLS
        .iter()
        .filter(|(_, w)| filter.is_none_or(|f| f == *w))
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Decides what a request gets: a file, a WebSocket of some protocol, or a
/// refusal. Pure, so every rule is unit tested without sockets.
fn route(head: &RequestHead, settings: &WsSettings) -> Result<Route, Refusal> {
    let is_upgrade = head.has_token("upgrade", "websocket");
    if !is_upgrade {
        let head_only = match head.method.as_str() {
            "GET" => false,
            "HEAD" => true,
            _ => return Err(Refusal::new(405, "only GET is served here")),
        };
        if let Some(asset) = ASSETS.iter().find(|a| a.path == head.path) {
            return Ok(Route::Asset { asset, head_only });
        }
        if head.path == METRICS_PATH && settings.metrics {
            return Ok(Route::Metrics { head_only });
        }
        if let Some(wire) = WsWire::from_path(&head.path) {
            return Err(Refusal::new(
                426,
                format!(
                    "this path speaks {} over WebSocket: connect with a WebSocket client",
                    wire.name()
                ),
            ));
        }
        return Err(Refusal::new(404, "not found: the demo page is at /"));
    }

    if head.method != "GET" {
        return Err(Refusal::new(405, "a WebSocket upgrade must use GET"));
    }
    if head.minor_version < 1 {
        return Err(Refusal::new(400, "a WebSocket upgrade needs HTTP/1.1"));
    }
    if !head.has_token("connection", "upgrade") {
        return Err(Refusal::new(
            400,
            "bad WebSocket upgrade: `Connection: Upgrade` is missing",
        ));
    }
    if head.header("sec-websocket-version").map(str::trim) != Some("13") {
        return Err(Refusal::new(
            426,
            "unsupported WebSocket version: only version 13 (RFC 6455) is spoken",
        ));
    }
    let key = head
        .header("sec-websocket-key")
        .map(str::trim)
        .filter(|k| valid_key(k))
        .ok_or_else(|| {
            Refusal::new(
                400,
                "bad WebSocket upgrade: `Sec-WebSocket-Key` is missing or not 16 bytes in base64",
            )
        })?
        .to_owned();
    if !settings.origin_allowed(head.header("origin").map(str::trim)) {
        return Err(Refusal::new(
            403,
            "origin not allowed: add it to websocket.allowed_origins",
        ));
    }

    let path_wire = WsWire::from_path(&head.path);
    let offered: Vec<&str> = head.tokens("sec-websocket-protocol").collect();
    let chosen = offered.iter().find_map(|token| {
        WsWire::from_subprotocol(token)
            .filter(|wire| path_wire.is_none_or(|p| p == *wire))
            .map(|wire| (wire, (*token).to_owned()))
    });
    match (chosen, path_wire) {
        (Some((wire, token)), _) => Ok(Route::Upgrade {
            wire,
            subprotocol: Some(token),
            key,
        }),
        (None, Some(wire)) if offered.is_empty() => Ok(Route::Upgrade {
            wire,
            subprotocol: None,
            key,
        }),
        (None, Some(wire)) => Err(Refusal::new(
            400,
            format!(
                "no usable WebSocket subprotocol for {} on {}: offer one of {}",
                wire.name(),
                head.path,
                supported_list(Some(wire))
            ),
        )),
        (None, None) => Err(Refusal::new(
            400,
            format!(
                "no usable WebSocket subprotocol: offer one of {}, or connect to /mqtt, /stomp or /amqp",
                supported_list(None)
            ),
        )),
    }
}

/// A `Sec-WebSocket-Key` is 16 random bytes in base64: 24 characters
/// ending in `==` (RFC 6455, 4.1).
fn valid_key(key: &str) -> bool {
    key.len() == 24
        && key.ends_with("==")
        && key
            .bytes()
            .take(22)
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// Why a connection on the HTTP port did not become a WebSocket. Every
/// case ends the connection; only some were answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotWebSocket {
    /// A plain GET was answered with a file.
    #[error("served {0}")]
    Served(&'static str),
    /// The request was refused with this answer.
    #[error("refused: {0}")]
    Refused(Refusal),
    /// The client closed before sending a whole request head.
    #[error("closed before a whole request head")]
    Closed,
    /// The request head did not arrive (or the answer not leave) within
    /// [`HANDSHAKE_TIMEOUT`].
    #[error("HTTP handshake timed out")]
    Timeout,
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Reads one HTTP request on `io` and either upgrades it to a WebSocket, or
/// answers it (demo page, refusal) and gives up the connection. (The
/// server uses [`accept_serving`], which also serves metrics.)
#[cfg(test)]
pub(crate) async fn accept<S>(
    io: S,
    settings: &WsSettings,
) -> Result<(WsWire, WsByteStream<S>), NotWebSocket>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    accept_serving(io, settings, message_max_alone(settings), &String::new).await
}

/// The message limit of `settings` on their own (tests, fuzzing): as set,
/// or derived from the default configuration's protocol limits.
pub(crate) fn message_max_alone(settings: &WsSettings) -> usize {
    settings
        .message_size_max_bytes
        .unwrap_or_else(|| rosetta_config::Config::default().websocket_message_size_max())
}

/// [`accept`], with `metrics` producing the body of `GET /metrics`, and no
/// message larger than `message_max` bytes (after reassembly).
pub(crate) async fn accept_serving<S>(
    io: S,
    settings: &WsSettings,
    message_max: usize,
    metrics: &(dyn Fn() -> String + Sync),
) -> Result<(WsWire, WsByteStream<S>), NotWebSocket>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match accept_routed(io, settings, message_max, metrics, false).await? {
        Accepted::WebSocket(wire, stream) => Ok((wire, stream)),
        // Not asked for: no admin path is handed off.
        Accepted::Admin(_) => Err(NotWebSocket::Closed),
    }
}

/// What a connection of the HTTP port turned out to be.
// Lives only from the accept to the `match` right after it: boxing the
// WebSocket to make the variants alike would cost every WebSocket an
// allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Accepted<S> {
    /// A WebSocket speaking a protocol.
    WebSocket(WsWire, WsByteStream<S>),
    /// A plain request for an admin path ([`is_admin_path`]): the stream,
    /// with what was read of it put back in front.
    Admin(Rewind<S>),
}

/// [`accept_serving`]; with `admin_paths`, a plain request for an admin
/// path is not answered but handed back as [`Accepted::Admin`].
pub(crate) async fn accept_routed<S>(
    io: S,
    settings: &WsSettings,
    message_max: usize,
    metrics: &(dyn Fn() -> String + Sync),
    admin_paths: bool,
) -> Result<Accepted<S>, NotWebSocket>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        accept_inner(io, settings, message_max, metrics, admin_paths),
    )
    .await
    .unwrap_or(Err(NotWebSocket::Timeout))
}

async fn accept_inner<S>(
    mut io: S,
    settings: &WsSettings,
    message_max: usize,
    metrics: &(dyn Fn() -> String + Sync),
    admin_paths: bool,
) -> Result<Accepted<S>, NotWebSocket>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (head, mut read, used) = match read_head(&mut io).await {
        Ok(read) => read,
        Err(HeadError::Refused(refusal)) => return refuse(io, refusal).await,
        Err(HeadError::Closed) => return Err(NotWebSocket::Closed),
        Err(HeadError::Io(e)) => return Err(NotWebSocket::Io(e)),
    };
    if admin_paths && !head.has_token("upgrade", "websocket") && is_admin_path(&head.path) {
        return Ok(Accepted::Admin(Rewind::new(read, io)));
    }
    let tail = read.split_off(used.min(read.len()));
    match route(&head, settings) {
        Err(refusal) => refuse(io, refusal).await,
        Ok(Route::Asset { asset, head_only }) => {
            let body = if head_only { &[][..] } else { asset.body };
            let extra = format!("Content-Length: {}\r\n", asset.body.len());
            respond(&mut io, 200, asset.content_type, &extra, body).await?;
            Err(NotWebSocket::Served(asset.path))
        }
        Ok(Route::Metrics { head_only }) => {
            let text = metrics();
            let body = if head_only { &[][..] } else { text.as_bytes() };
            let extra = format!("Content-Length: {}\r\n", text.len());
            respond(&mut io, 200, METRICS_CONTENT_TYPE, &extra, body).await?;
            Err(NotWebSocket::Served(METRICS_PATH))
        }
        Ok(Route::Upgrade {
            wire,
            subprotocol,
            key,
        }) => {
            let mut response = format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n",
                tungstenite::handshake::derive_accept_key(key.as_bytes())
            );
            if let Some(p) = &subprotocol {
                response.push_str(&format!("Sec-WebSocket-Protocol: {p}\r\n"));
            }
            response.push_str("\r\n");
            io.write_all(response.as_bytes()).await?;
            io.flush().await?;
            Ok(Accepted::WebSocket(
                wire,
                WsByteStream::new(io, tail, wire, message_max),
            ))
        }
    }
}

async fn refuse<S, T>(mut io: S, refusal: Refusal) -> Result<T, NotWebSocket>
where
    S: AsyncWrite + Unpin,
{
    let mut body = refusal.message.clone();
    body.push('\n');
    let mut extra = format!("Content-Length: {}\r\n", body.len());
    if refusal.status == 426 {
        extra.push_str("Sec-WebSocket-Version: 13\r\n");
    }
    if refusal.status == 405 {
        extra.push_str("Allow: GET\r\n");
    }
    respond(
        &mut io,
        refusal.status,
        "text/plain; charset=utf-8",
        &extra,
        body.as_bytes(),
    )
    .await?;
    Err(NotWebSocket::Refused(refusal))
}

/// Writes a whole response and closes our side: one request per
/// connection keeps this listener simple, and browsers reconnect at once.
pub(crate) async fn respond<S>(
    io: &mut S,
    status: u16,
    content_type: &str,
    extra_headers: &str,
    body: &[u8],
) -> io::Result<()>
where
    S: AsyncWrite + Unpin,
{
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\n{extra_headers}Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
        reason(status)
    );
    io.write_all(head.as_bytes()).await?;
    io.write_all(body).await?;
    io.flush().await?;
    io.shutdown().await
}

#[derive(Debug)]
enum HeadError {
    Refused(Refusal),
    Closed,
    Io(io::Error),
}

/// Reads until a whole request head is buffered; returns it, every byte
/// read and the length of the head in them (a client may send its first
/// WebSocket frame, or a request body, right away).
async fn read_head<S>(io: &mut S) -> Result<(RequestHead, Vec<u8>, usize), HeadError>
where
    S: AsyncRead + Unpin,
{
    let mut buf = Vec::with_capacity(2048);
    loop {
        if buf.len() >= REQUEST_HEAD_MAX_BYTES {
            return Err(HeadError::Refused(Refusal::new(
                431,
                format!("request head larger than {REQUEST_HEAD_MAX_BYTES} bytes"),
            )));
        }
        let mut chunk = [0u8; 2048];
        let room = (REQUEST_HEAD_MAX_BYTES - buf.len()).min(chunk.len());
        let n = io
            .read(chunk.get_mut(..room).unwrap_or_default())
            .await
            .map_err(HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if let Some((head, used)) = parse_head(&buf)? {
            return Ok((head, buf, used));
        }
    }
}

/// Parses a request head; `None` while it is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; REQUEST_HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    let used = match req.parse(buf) {
        Ok(httparse::Status::Complete(used)) => used,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError::Refused(Refusal::new(
                431,
                format!("more than {REQUEST_HEADERS_MAX} request headers"),
            )))
        }
        Err(e) => {
            return Err(HeadError::Refused(Refusal::new(
                400,
                format!("malformed HTTP request: {e}"),
            )))
        }
    };
    let target = req.path.unwrap_or("/");
    let path = target.split(['?', '#']).next().unwrap_or("/").to_owned();
    let head = RequestHead {
        method: req.method.unwrap_or_default().to_owned(),
        path,
        minor_version: req.version.unwrap_or(1),
        headers: req
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_owned(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect(),
    };
    Ok(Some((head, used)))
}

/// Serves one connection of the HTTP port (or of `wss`, or an HTTP client
/// of the `any` port): the demo page, a refusal, or the upgrade to a
/// WebSocket, whose protocol is the stage that follows.
pub(crate) async fn serve<S>(
    io: S,
    peer: super::protocols::Peer,
    conn_id: u64,
    shared: Arc<Shared>,
) -> Option<super::protocols::Stage>
where
    S: super::driver::Transport + 'static,
{
    let up = upgrade(io, peer, conn_id, shared).await?;
    Some(super::protocols::run_wire(
        up.wire.into(),
        up.stream,
        up.peer,
        conn_id,
        up.shared,
    ))
}

/// A connection of the HTTP port upgraded to a WebSocket, its protocol
/// not started yet.
pub(crate) struct Upgraded<S> {
    pub(crate) wire: WsWire,
    pub(crate) stream: WsByteStream<S>,
    pub(crate) peer: super::protocols::Peer,
    pub(crate) shared: Arc<Shared>,
}

/// [`serve`] up to the upgrade: the demo page, a refusal or an admin
/// request are served here (`None`), an upgraded connection is returned.
pub(crate) async fn upgrade<S>(
    io: S,
    mut peer: super::protocols::Peer,
    conn_id: u64,
    shared: Arc<Shared>,
) -> Option<Upgraded<S>>
where
    S: super::driver::Transport + 'static,
{
    let metrics = || shared.metrics();
    let message_max = shared.config.websocket_message_size_max();
    let admin_paths = shared.config.admin.served_on_http_port();
    let settings = &shared.config.websocket;
    match accept_routed(io, settings, message_max, &metrics, admin_paths).await {
        Ok(Accepted::WebSocket(wire, stream)) => {
            tracing::debug!(conn = conn_id, %peer, protocol = wire.name(), "WebSocket accepted");
            peer.websocket = true;
            return Some(Upgraded {
                wire,
                stream,
                peer,
                shared,
            });
        }
        Ok(Accepted::Admin(io)) => match shared.admin_on_http_port.get() {
            Some(admin) => admin.serve(Box::new(io), peer.addr).await,
            // The listeners are bound before the admin API has the broker:
            // a request in between is told to come back.
            None => {
                let refusal = Refusal::new(503, "starting: the admin API is not attached yet");
                let _ = refuse::<_, ()>(io, refusal).await;
            }
        },
        Err(NotWebSocket::Served(path)) => {
            tracing::debug!(conn = conn_id, %peer, path, "served a file");
        }
        Err(e) => {
            tracing::debug!(conn = conn_id, %peer, reason = %e, "no WebSocket");
        }
    }
    None
}

/// Serves one connection of the `metrics` listener: `GET /metrics` (or
/// HEAD), and nothing else.
pub(crate) async fn serve_metrics<S>(
    mut io: S,
    peer: super::protocols::Peer,
    conn_id: u64,
    shared: Arc<Shared>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let served = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let head = match read_head(&mut io).await {
            Ok((head, _, _)) => head,
            Err(HeadError::Refused(refusal)) => return refuse::<_, ()>(io, refusal).await,
            Err(HeadError::Closed) => return Err(NotWebSocket::Closed),
            Err(HeadError::Io(e)) => return Err(NotWebSocket::Io(e)),
        };
        let head_only = match head.method.as_str() {
            "GET" => false,
            "HEAD" => true,
            _ => return refuse(io, Refusal::new(405, "only GET is served here")).await,
        };
        if head.path != METRICS_PATH {
            return refuse(io, Refusal::new(404, "not found: metrics are at /metrics")).await;
        }
        let text = shared.metrics();
        let body = if head_only { &[][..] } else { text.as_bytes() };
        let extra = format!("Content-Length: {}\r\n", text.len());
        respond(&mut io, 200, METRICS_CONTENT_TYPE, &extra, body).await?;
        Ok(())
    })
    .await
    .unwrap_or(Err(NotWebSocket::Timeout));
    if let Err(e) = served {
        tracing::debug!(conn = conn_id, %peer, reason = %e, "metrics listener");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::WebSocketStream;

    use super::super::ws_frames::OUTGOING_MESSAGE_MAX_BYTES;
    use tokio::net::{TcpListener, TcpStream};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;

    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
    const TEST_TIMEOUT: Duration = Duration::from_secs(5);

    fn upgrade(path: &str, extra: &[(&str, &str)]) -> RequestHead {
        let mut headers: Vec<(String, String)> = [
            ("Host", "127.0.0.1"),
            ("Upgrade", "websocket"),
            ("Connection", "keep-alive, Upgrade"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", KEY),
        ]
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
        for (n, v) in extra {
            headers.push(((*n).to_owned(), (*v).to_owned()));
        }
        RequestHead {
            method: "GET".into(),
            path: path.into(),
            minor_version: 1,
            headers,
        }
    }

    fn get(path: &str) -> RequestHead {
        RequestHead {
            method: "GET".into(),
            path: path.into(),
            minor_version: 1,
            headers: vec![("Host".into(), "127.0.0.1".into())],
        }
    }

    fn upgraded(route: Result<Route, Refusal>) -> (WsWire, Option<String>) {
        match route {
            Ok(Route::Upgrade {
                wire, subprotocol, ..
            }) => (wire, subprotocol),
            other => panic!("expected an upgrade, got {other:?}"),
        }
    }

    fn refused(route: Result<Route, Refusal>) -> Refusal {
        match route {
            Err(refusal) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn routes_by_path() {
        let s = WsSettings::default();
        for (path, wire) in [
            ("/mqtt", WsWire::Mqtt),
            ("/stomp", WsWire::Stomp),
            ("/amqp", WsWire::Amqp),
        ] {
            assert_eq!(upgraded(route(&upgrade(path, &[]), &s)), (wire, None));
        }
        // A path's own subprotocol is picked among others and echoed as sent.
        let head = upgrade("/stomp", &[("Sec-WebSocket-Protocol", "mqtt, V12.STOMP")]);
        assert_eq!(
            upgraded(route(&head, &s)),
            (WsWire::Stomp, Some("V12.STOMP".into()))
        );
    }

    #[test]
    fn routes_by_subprotocol_on_any_path() {
        let s = WsSettings::default();
        for (offer, wire) in [
            ("mqtt", WsWire::Mqtt),
            ("mqttv3.1", WsWire::Mqtt),
            ("v10.stomp", WsWire::Stomp),
            ("v11.stomp", WsWire::Stomp),
            ("v12.stomp", WsWire::Stomp),
            ("stomp", WsWire::Stomp),
            ("amqp", WsWire::Amqp),
        ] {
            for path in ["/", "/ws", "/mqtt-anything"] {
                let head = upgrade(path, &[("Sec-WebSocket-Protocol", offer)]);
                assert_eq!(upgraded(route(&head, &s)), (wire, Some(offer.into())));
            }
        }
        // The client's first usable choice wins, across repeated headers.
        let head = upgrade(
            "/",
            &[
                ("Sec-WebSocket-Protocol", "chat, v12.stomp"),
                ("Sec-WebSocket-Protocol", "mqtt"),
            ],
        );
        assert_eq!(
            upgraded(route(&head, &s)),
            (WsWire::Stomp, Some("v12.stomp".into()))
        );
    }

    #[test]
    fn refuses_upgrades_without_a_usable_subprotocol() {
        let s = WsSettings::default();
        let r = refused(route(&upgrade("/", &[]), &s));
        assert_eq!(r.status, 400);
        assert!(r.message.contains("mqtt, mqttv3.1"), "{r}");
        let r = refused(route(
            &upgrade("/", &[("Sec-WebSocket-Protocol", "chat, superchat")]),
            &s,
        ));
        assert_eq!(r.status, 400);
        // A subprotocol of another protocol than the path's.
        let r = refused(route(
            &upgrade("/mqtt", &[("Sec-WebSocket-Protocol", "v12.stomp")]),
            &s,
        ));
        assert_eq!(r.status, 400);
        assert!(r.message.contains("MQTT on /mqtt"), "{r}");
    }

    #[test]
    fn refuses_bad_upgrades() {
        let s = WsSettings::default();
        let mut head = upgrade("/mqtt", &[]);
        head.headers.retain(|(n, _)| n != "Sec-WebSocket-Version");
        assert_eq!(refused(route(&head, &s)).status, 426);
        let mut head = upgrade("/mqtt", &[]);
        head.headers.retain(|(n, _)| n != "Sec-WebSocket-Key");
        assert_eq!(refused(route(&head, &s)).status, 400);
        let mut head = upgrade("/mqtt", &[]);
        head.headers.retain(|(n, _)| n != "Sec-WebSocket-Key");
        head.headers
            .push(("Sec-WebSocket-Key".into(), "short==".into()));
        assert_eq!(refused(route(&head, &s)).status, 400);
        let mut head = upgrade("/mqtt", &[]);
        head.headers.retain(|(n, _)| n != "Connection");
        assert_eq!(refused(route(&head, &s)).status, 400);
        let mut head = upgrade("/mqtt", &[]);
        head.minor_version = 0;
        assert_eq!(refused(route(&head, &s)).status, 400);
        let mut head = upgrade("/mqtt", &[]);
        head.method = "POST".into();
        assert_eq!(refused(route(&head, &s)).status, 405);
    }

    #[test]
    fn origin_allow_list() {
        let s = WsSettings {
            allowed_origins: vec!["https://app.example.com".into()],
            ..WsSettings::default()
        };
        let ok = upgrade("/mqtt", &[("Origin", "https://app.example.com")]);
        assert_eq!(upgraded(route(&ok, &s)).0, WsWire::Mqtt);
        let evil = upgrade("/mqtt", &[("Origin", "https://evil.example")]);
        assert_eq!(refused(route(&evil, &s)).status, 403);
        // Programs send no Origin.
        assert_eq!(upgraded(route(&upgrade("/mqtt", &[]), &s)).0, WsWire::Mqtt);
    }

    #[test]
    fn plain_requests() {
        let s = WsSettings::default();
        for path in ["/", "/index.html", "/mqtt.min.js"] {
            match route(&get(path), &s) {
                Ok(Route::Asset { asset, head_only }) => {
                    assert_eq!(asset.path, path);
                    assert!(!head_only);
                }
                other => panic!("{path}: {other:?}"),
            }
        }
        assert_eq!(refused(route(&get("/nope"), &s)).status, 404);
        assert_eq!(refused(route(&get("/mqtt"), &s)).status, 426);
        let mut post = get("/");
        post.method = "POST".into();
        assert_eq!(refused(route(&post, &s)).status, 405);
        let mut head = get("/");
        head.method = "HEAD".into();
        assert!(matches!(
            route(&head, &s),
            Ok(Route::Asset {
                head_only: true,
                ..
            })
        ));
    }

    #[test]
    fn admin_paths_are_the_apis_and_the_consoles_only() {
        for path in [
            "/api",
            "/api/v1/overview",
            "/healthz",
            "/readyz",
            "/console",
            "/console/",
            "/console/app.js",
        ] {
            assert!(is_admin_path(path), "{path}");
        }
        for path in [
            "/",
            "/index.html",
            "/mqtt",
            "/metrics",
            "/apix",
            "/consoles",
            "/healthz/x",
        ] {
            assert!(!is_admin_path(path), "{path}");
        }
    }

    #[test]
    fn demo_page_loads_the_bundled_mqtt_js() {
        let page = std::str::from_utf8(INDEX_HTML).expect("utf-8");
        assert!(page.contains(r#"<script src="/mqtt.min.js">"#));
        assert!(page.contains("mqtt.connect("));
        let js = ASSETS
            .iter()
            .find(|a| a.path == "/mqtt.min.js")
            .expect("bundle");
        assert!(js.body.starts_with(b"/*! MQTT.js 5.16.0"));
        assert!(js.body.len() > 100_000);
    }

    #[test]
    fn head_parsing_limits() {
        let head = b"GET /mqtt?x=1 HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\nTAIL";
        let (parsed, used) = parse_head(head).expect("parse").expect("complete");
        assert_eq!(parsed.path, "/mqtt");
        assert_eq!(&head[used..], b"TAIL");
        // Byte at a time: incomplete until the blank line.
        let end = head.len() - 4;
        for len in 0..end {
            assert!(
                parse_head(&head[..len]).expect("partial").is_none(),
                "{len}"
            );
        }
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=REQUEST_HEADERS_MAX {
            many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(matches!(
            parse_head(&many),
            Err(HeadError::Refused(Refusal { status: 431, .. }))
        ));
        assert!(matches!(
            parse_head(b"GARBAGE\x01\r\n\r\n"),
            Err(HeadError::Refused(Refusal { status: 400, .. }))
        ));
    }

    type Client = WebSocketStream<TcpStream>;
    type Accepted = Result<(WsWire, WsByteStream<TcpStream>), NotWebSocket>;

    /// Accepts one connection on 127.0.0.1 with `settings`.
    async fn one_server(settings: WsSettings) -> (SocketAddr, tokio::task::JoinHandle<Accepted>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await?;
            accept(tcp, &settings).await
        });
        (addr, task)
    }

    /// Connects a tungstenite client to `path` offering `protocols`.
    async fn ws_pair(
        settings: WsSettings,
        path: &str,
        protocols: Option<&str>,
    ) -> (Client, Option<String>, WsWire, WsByteStream<TcpStream>) {
        let (addr, server) = one_server(settings).await;
        let mut request = format!("ws://{addr}{path}")
            .into_client_request()
            .expect("request");
        if let Some(p) = protocols {
            request
                .headers_mut()
                .insert("Sec-WebSocket-Protocol", p.parse().expect("header"));
        }
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (client, response) = tokio_tungstenite::client_async(request, tcp)
            .await
            .expect("client handshake");
        let echoed = response
            .headers()
            .get("Sec-WebSocket-Protocol")
            .map(|v| v.to_str().expect("ascii").to_owned());
        let (wire, stream) = server.await.expect("join").expect("accepted");
        (client, echoed, wire, stream)
    }

    /// Sends a raw request and returns the whole response text.
    async fn raw_exchange(settings: WsSettings, request: &str) -> (String, Accepted) {
        let (addr, server) = one_server(settings).await;
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(request.as_bytes()).await.expect("write");
        let mut response = Vec::new();
        tokio::time::timeout(TEST_TIMEOUT, tcp.read_to_end(&mut response))
            .await
            .expect("answered in time")
            .expect("read");
        let result = server.await.expect("join");
        (String::from_utf8_lossy(&response).into_owned(), result)
    }

    fn raw_upgrade(path: &str, extra: &str) -> String {
        format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n{extra}\r\n"
        )
    }

    #[tokio::test]
    async fn subprotocol_is_echoed_and_routes() {
        let (_c, echoed, wire, _s) = ws_pair(WsSettings::default(), "/", Some("mqtt")).await;
        assert_eq!((wire, echoed.as_deref()), (WsWire::Mqtt, Some("mqtt")));
        let (_c, echoed, wire, _s) =
            ws_pair(WsSettings::default(), "/ws", Some("foo, v12.stomp")).await;
        assert_eq!(
            (wire, echoed.as_deref()),
            (WsWire::Stomp, Some("v12.stomp"))
        );
        let (_c, echoed, wire, _s) = ws_pair(WsSettings::default(), "/amqp", None).await;
        assert_eq!((wire, echoed), (WsWire::Amqp, None));
    }

    #[tokio::test]
    async fn refusals_over_a_socket() {
        let (text, result) = raw_exchange(WsSettings::default(), &raw_upgrade("/", "")).await;
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
        assert!(text.contains("no usable WebSocket subprotocol"), "{text}");
        assert!(matches!(
            result,
            Err(NotWebSocket::Refused(Refusal { status: 400, .. }))
        ));

        let settings = WsSettings {
            allowed_origins: vec!["http://good.example".into()],
            ..WsSettings::default()
        };
        let (text, _) = raw_exchange(
            settings,
            &raw_upgrade("/mqtt", "Origin: http://evil.example\r\n"),
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{text}");
        assert!(text.contains("origin not allowed"), "{text}");

        let (text, _) = raw_exchange(
            WsSettings::default(),
            &raw_upgrade("/mqtt", "").replace("Version: 13", "Version: 8"),
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 426 "), "{text}");
        assert!(text.contains("Sec-WebSocket-Version: 13\r\n"), "{text}");

        let (text, _) = raw_exchange(
            WsSettings::default(),
            "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"), "{text}");

        let (text, _) = raw_exchange(WsSettings::default(), "\x16\x03\x01garbage\r\n\r\n").await;
        assert!(text.starts_with("HTTP/1.1 400 "), "{text}");

        let (text, _) = raw_exchange(
            WsSettings::default(),
            // Exactly the limit, unfinished: all of it is read before the
            // answer, so closing sends no reset.
            &format!(
                "GET / HTTP/1.1\r\nX-Big: {}",
                "a".repeat(REQUEST_HEAD_MAX_BYTES - 23)
            ),
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
    }

    #[tokio::test]
    async fn serves_the_demo_page_and_mqtt_js() {
        let (text, result) =
            raw_exchange(WsSettings::default(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Type: text/html"), "{text}");
        assert!(text.contains(&format!("Content-Length: {}\r\n", INDEX_HTML.len())));
        assert!(text.ends_with("</html>\n"), "whole page sent");
        assert!(matches!(result, Err(NotWebSocket::Served("/"))));

        let (text, _) = raw_exchange(
            WsSettings::default(),
            "GET /mqtt.min.js HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{}", &text[..200]);
        assert!(text.contains("Content-Type: text/javascript"));
    }

    type Read = (Vec<u8>, io::Result<()>, WsByteStream<TcpStream>);

    /// The server side reads while the test needs it to (pongs, closes)
    /// until EOF or an error. The stream is handed back, not dropped: a
    /// socket closed with unread input sends a reset, which could destroy
    /// the close frame before the client reads it.
    fn read_all_in_background(
        mut stream: WsByteStream<TcpStream>,
    ) -> tokio::task::JoinHandle<Read> {
        tokio::spawn(async move {
            let mut got = Vec::new();
            let result = stream.read_to_end(&mut got).await.map(|_| ());
            (got, result, stream)
        })
    }

    async fn next_message(client: &mut Client) -> Message {
        tokio::time::timeout(TEST_TIMEOUT, client.next())
            .await
            .expect("message in time")
            .expect("stream open")
            .expect("message")
    }

    #[tokio::test]
    async fn oversized_message_closes_with_1009() {
        let settings = WsSettings {
            message_size_max_bytes: Some(1024),
            ..WsSettings::default()
        };
        let (mut client, _, _, stream) = ws_pair(settings, "/mqtt", None).await;
        let reader = read_all_in_background(stream);
        client
            .send(Message::Binary(Bytes::from(vec![0u8; 2000])))
            .await
            .expect("send");
        let (_, result, _stream) = reader.await.expect("join");
        assert!(result.is_err(), "oversized message accepted");
        match next_message(&mut client).await {
            Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Size),
            other => panic!("expected close 1009, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn oversized_fragmented_message_closes() {
        let settings = WsSettings {
            message_size_max_bytes: Some(1024),
            ..WsSettings::default()
        };
        let (mut client, _, _, stream) = ws_pair(settings, "/mqtt", None).await;
        let reader = read_all_in_background(stream);
        // Two frames of 600 bytes: each fits, the message does not.
        let first = Frame::message(vec![1u8; 600], OpCode::Data(Data::Binary), false);
        let second = Frame::message(vec![2u8; 600], OpCode::Data(Data::Continue), true);
        client.send(Message::Frame(first)).await.expect("send");
        client.send(Message::Frame(second)).await.expect("send");
        let (_, result, _stream) = reader.await.expect("join");
        assert!(result.is_err(), "oversized message accepted");
    }

    #[tokio::test]
    async fn text_that_is_not_utf8_closes_with_1007() {
        let (mut client, _, _, stream) =
            ws_pair(WsSettings::default(), "/stomp", Some("v12.stomp")).await;
        let reader = read_all_in_background(stream);
        let frame = Frame::message(vec![0xC3, 0x28], OpCode::Data(Data::Text), true);
        client.send(Message::Frame(frame)).await.expect("send");
        let (_, result, _stream) = reader.await.expect("join");
        assert!(result.is_err(), "invalid UTF-8 accepted");
        match next_message(&mut client).await {
            Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Invalid),
            other => panic!("expected close 1007, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn ping_is_answered_and_close_ends_the_stream() {
        let (mut client, _, _, stream) = ws_pair(WsSettings::default(), "/mqtt", None).await;
        let reader = read_all_in_background(stream);
        client
            .send(Message::Ping(Bytes::from_static(b"are you there")))
            .await
            .expect("ping");
        assert_eq!(
            next_message(&mut client).await,
            Message::Pong(Bytes::from_static(b"are you there"))
        );
        client
            .send(Message::Binary(Bytes::from_static(b"\xc0\x00")))
            .await
            .expect("send");
        client.close(None).await.expect("close");
        // The server answers the close and its reads end in EOF.
        let (got, result, _stream) = reader.await.expect("join");
        result.expect("clean EOF");
        assert_eq!(got, b"\xc0\x00");
        match next_message(&mut client).await {
            Message::Close(_) => {}
            other => panic!("expected the close reply, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn messages_form_one_byte_stream() {
        let (mut client, _, _, mut stream) = ws_pair(WsSettings::default(), "/mqtt", None).await;
        // A PUBLISH split over two messages, then two PINGREQs in one.
        let publish = b"\x30\x0b\x00\x03a/bhello!";
        client
            .send(Message::Binary(Bytes::from_static(&publish[..4])))
            .await
            .expect("send");
        client
            .send(Message::Binary(Bytes::from_static(&publish[4..])))
            .await
            .expect("send");
        client
            .send(Message::Binary(Bytes::from_static(b"\xc0\x00\xc0\x00")))
            .await
            .expect("send");
        let mut got = vec![0u8; publish.len() + 4];
        tokio::time::timeout(TEST_TIMEOUT, stream.read_exact(&mut got))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(&got[..publish.len()], publish);
        assert_eq!(&got[publish.len()..], b"\xc0\x00\xc0\x00");
        // A text message is part of the stream too.
        client.send(Message::text("xyz")).await.expect("send");
        let mut text = [0u8; 3];
        stream.read_exact(&mut text).await.expect("read");
        assert_eq!(&text, b"xyz");

        // Two writes and one flush make one message; MQTT is always binary.
        stream.write_all(b"\xd0\x00").await.expect("write");
        stream.write_all(b"\xd0\x00").await.expect("write");
        stream.flush().await.expect("flush");
        assert_eq!(
            next_message(&mut client).await,
            Message::Binary(Bytes::from_static(b"\xd0\x00\xd0\x00"))
        );

        // Shutdown sends a normal close.
        stream.shutdown().await.expect("shutdown");
        match next_message(&mut client).await {
            Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Normal),
            Message::Close(None) => {}
            other => panic!("expected a close, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn one_read_gathers_waiting_messages_and_defers_an_error() {
        let (mut client, _, _, mut stream) =
            ws_pair(WsSettings::default(), "/stomp", Some("v12.stomp")).await;
        for _ in 0..10 {
            client
                .send(Message::Binary(Bytes::from_static(b"ab")))
                .await
                .expect("send");
        }
        let bad = Frame::message(vec![0xFF], OpCode::Data(Data::Text), true);
        client.send(Message::Frame(bad)).await.expect("send");
        // Let everything arrive before the first read.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.expect("first read");
        assert_eq!(&buf[..n], "ab".repeat(10).as_bytes());
        let err = stream.read(&mut buf).await.expect_err("deferred error");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        match next_message(&mut client).await {
            Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Invalid),
            other => panic!("expected close 1007, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn large_output_is_split_into_bounded_messages() {
        let (mut client, _, _, mut stream) = ws_pair(WsSettings::default(), "/amqp", None).await;
        let data = vec![7u8; OUTGOING_MESSAGE_MAX_BYTES + 10];
        let writer = tokio::spawn(async move {
            stream.write_all(&data).await.expect("write");
            stream.flush().await.expect("flush");
            stream
        });
        let first = next_message(&mut client).await;
        let second = next_message(&mut client).await;
        assert_eq!(first.len(), OUTGOING_MESSAGE_MAX_BYTES);
        assert_eq!(second.len(), 10);
        assert!(matches!(first, Message::Binary(_)));
        drop(writer.await.expect("join"));
    }

    #[tokio::test]
    async fn stomp_answers_in_the_clients_frame_type() {
        let (mut client, _, _, mut stream) =
            ws_pair(WsSettings::default(), "/stomp", Some("v12.stomp")).await;
        // Before any input: text, as stomp.js expects.
        stream.write_all(b"\n").await.expect("write");
        stream.flush().await.expect("flush");
        assert_eq!(next_message(&mut client).await, Message::text("\n"));

        client
            .send(Message::Binary(Bytes::from_static(b"\n")))
            .await
            .expect("send");
        let mut one = [0u8; 1];
        stream.read_exact(&mut one).await.expect("read");
        stream.write_all(b"MESSAGE\n\n\0").await.expect("write");
        stream.flush().await.expect("flush");
        assert_eq!(
            next_message(&mut client).await,
            Message::Binary(Bytes::from_static(b"MESSAGE\n\n\0"))
        );

        client.send(Message::text("\n")).await.expect("send");
        stream.read_exact(&mut one).await.expect("read");
        stream.write_all(b"MESSAGE\n\n\0").await.expect("write");
        stream.flush().await.expect("flush");
        assert_eq!(
            next_message(&mut client).await,
            Message::text("MESSAGE\n\n\0")
        );

        // Output that is not UTF-8 cannot go in a text message.
        stream.write_all(b"MESSAGE\n\n\xff\0").await.expect("write");
        stream.flush().await.expect("flush");
        assert_eq!(
            next_message(&mut client).await,
            Message::Binary(Bytes::from_static(b"MESSAGE\n\n\xff\0"))
        );
    }

    #[tokio::test]
    async fn mqtt_answers_binary_to_text() {
        let (mut client, _, _, mut stream) =
            ws_pair(WsSettings::default(), "/", Some("mqtt")).await;
        client.send(Message::text("ab")).await.expect("send");
        let mut two = [0u8; 2];
        stream.read_exact(&mut two).await.expect("read");
        stream.write_all(b"ok").await.expect("write");
        stream.flush().await.expect("flush");
        assert_eq!(
            next_message(&mut client).await,
            Message::Binary(Bytes::from_static(b"ok"))
        );
    }

    #[tokio::test]
    async fn first_frame_sent_with_the_request_is_kept() {
        let (addr, server) = one_server(WsSettings::default()).await;
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        // Request head and a masked binary frame "hi" in one write.
        let mut bytes = raw_upgrade("/mqtt", "").into_bytes();
        let mask = [1u8, 2, 3, 4];
        bytes.extend_from_slice(&[0x82, 0x82]);
        bytes.extend_from_slice(&mask);
        bytes.extend(b"hi".iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
        tcp.write_all(&bytes).await.expect("write");
        let (_, mut stream) = server.await.expect("join").expect("accepted");
        let mut two = [0u8; 2];
        tokio::time::timeout(TEST_TIMEOUT, stream.read_exact(&mut two))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(&two, b"hi");
    }
}
