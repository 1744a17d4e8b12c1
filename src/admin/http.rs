//! The listener: HTTP/1.1 over TCP with hyper, one task per connection,
//! each bounded (connections, header size, header time, body size), and
//! stopped gracefully with the broker.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::auth::REALM;
use crate::console::{self, ConsoleAnswer};
use crate::error::ApiError;
use crate::gate::Gate;
use crate::router;

/// Admin connections open at once: an operator, a console and a few
/// scripts need a handful; past this an accepted socket is closed at once.
pub const ADMIN_CONNECTIONS_MAX: usize = 64;
/// Largest request body: a user with its permissions is well under 1 KiB.
pub const REQUEST_BODY_MAX_BYTES: usize = 64 * 1024;
/// Largest request head (hyper's read buffer).
pub const REQUEST_HEAD_MAX_BYTES: usize = 16 * 1024;
/// Time for a request head to arrive: a socket that dribbles it is closed.
pub const REQUEST_HEAD_TIMEOUT_MS: u64 = 10_000;
/// Time a connection gets to finish its request at shutdown.
pub const SHUTDOWN_GRACE_MS: u64 = 2_000;

/// Accepts on `listener` until `stop` turns true.
pub(crate) async fn serve(listener: TcpListener, api: Arc<Gate>, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(ADMIN_CONNECTIONS_MAX));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "admin API: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(%peer, max = ADMIN_CONNECTIONS_MAX, "admin API: too many connections; closing");
            continue;
        };
        let (api, stop) = (Arc::clone(&api), stop.clone());
        tokio::spawn(async move {
            serve_connection(stream, peer, api, stop, KeepAlive::Yes).await;
            drop(slot);
        });
    }
}

/// Whether a connection may carry more than one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeepAlive {
    /// The admin listener's own connections.
    Yes,
    /// The HTTP port's: one request, then close, as that port answers
    /// everything else, so a browser's next request on the port (the demo
    /// page) comes on a new connection that the port routes again.
    No,
}

/// The admin API's paths on the broker's HTTP port (`[admin]
/// on_http_port`): the same gate (authentication, roles) and limits as the
/// admin listener, with a connection cap of its own.
pub(crate) struct OnHttpPort {
    pub(crate) gate: Arc<Gate>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) slots: Arc<Semaphore>,
}

impl OnHttpPort {
    pub(crate) fn new(gate: Arc<Gate>, stop: watch::Receiver<bool>) -> Self {
        Self {
            gate,
            stop,
            slots: Arc::new(Semaphore::new(ADMIN_CONNECTIONS_MAX)),
        }
    }
}

impl rosetta_server::AdminOnHttpPort for OnHttpPort {
    fn serve(
        &self,
        io: Box<dyn rosetta_server::HttpStream>,
        peer: SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let (api, stop) = (Arc::clone(&self.gate), self.stop.clone());
        let slot = Arc::clone(&self.slots).try_acquire_owned();
        Box::pin(async move {
            let Ok(slot) = slot else {
                tracing::warn!(%peer, max = ADMIN_CONNECTIONS_MAX, "admin API on the HTTP port: too many connections; closing");
                return;
            };
            serve_connection(io, peer, api, stop, KeepAlive::No).await;
            drop(slot);
        })
    }
}

async fn serve_connection<I>(
    stream: I,
    peer: SocketAddr,
    api: Arc<Gate>,
    mut stop: watch::Receiver<bool>,
    keep_alive: KeepAlive,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let api = Arc::clone(&api);
        async move { Ok::<_, std::convert::Infallible>(respond(&api, req, peer).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // A client may shut down its sending side once its request is out
        // (`nc -N`, scripts that half-close): it still gets its answers.
        // Without this hyper closes at the end of input, answered or not
        // (found by the admin_api fuzz target). A half-closed connection
        // that never completes a request still meets the head timeout.
        .half_close(true)
        .header_read_timeout(Duration::from_millis(REQUEST_HEAD_TIMEOUT_MS))
        .keep_alive(keep_alive == KeepAlive::Yes)
        .max_buf_size(REQUEST_HEAD_MAX_BYTES);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(Duration::from_millis(SHUTDOWN_GRACE_MS), conn).await {
                Ok(r) => r,
                Err(_) => Ok(()),
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "admin API connection");
    }
}

/// One request's answer: every error is a JSON body with its status.
async fn respond(api: &Gate, req: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    if method == hyper::Method::GET || method == hyper::Method::HEAD {
        if let Some(answer) = console::answer(&path) {
            return console_response(answer);
        }
    }
    // A page's script (the console) asks not to be challenged with Basic:
    // a browser answers a Basic challenge with its own login dialog. It
    // gets a Bearer challenge instead, which every 401 must carry (RFC
    // 9110, 15.5.2) and which no browser answers with a dialog.
    let scheme = if req
        .headers()
        .get("x-requested-with")
        .is_some_and(|v| v.as_bytes() == b"XMLHttpRequest")
    {
        "Bearer"
    } else {
        "Basic"
    };
    let answer = match read(req).await {
        Ok(parts) => api.handle(parts).await,
        Err(e) => Err(e),
    };
    match answer {
        Ok(reply) => {
            tracing::debug!(%peer, %method, path, status = reply.status.as_u16(), "admin API");
            json_response(reply.status, reply.body.as_ref())
        }
        Err(e) => {
            tracing::debug!(%peer, %method, path, status = e.status.as_u16(), reason = %e.reason, "admin API refused");
            let mut response = json_response(e.status, Some(&e.body()));
            let headers = response.headers_mut();
            if e.status == StatusCode::UNAUTHORIZED {
                if let Ok(v) = HeaderValue::from_str(&format!("{scheme} realm=\"{REALM}\"")) {
                    headers.insert(WWW_AUTHENTICATE, v);
                }
            }
            if e.status == StatusCode::METHOD_NOT_ALLOWED {
                if let Ok(v) = HeaderValue::from_str(&router::allowed_methods(&path)) {
                    headers.insert(ALLOW, v);
                }
            }
            response
        }
    }
}

/// A request with its whole body, bounded.
pub(crate) struct RequestParts {
    pub(crate) head: hyper::http::request::Parts,
    pub(crate) body: Bytes,
}

async fn read(req: Request<Incoming>) -> Result<RequestParts, ApiError> {
    let (head, body) = req.into_parts();
    // A declared length over the limit is refused at once: reading up to
    // the limit first would wait on a client that sends the head and then
    // waits for a `100 Continue` or an answer (fuzzing finding 8).
    if body.size_hint().lower() > REQUEST_BODY_MAX_BYTES as u64 {
        return Err(too_large());
    }
    let body = Limited::new(body, REQUEST_BODY_MAX_BYTES)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                too_large()
            } else {
                ApiError::bad_request(format!("reading the request body: {e}"))
            }
        })?
        .to_bytes();
    Ok(RequestParts { head, body })
}

fn too_large() -> ApiError {
    ApiError::too_large(format!("request body over {REQUEST_BODY_MAX_BYTES} bytes"))
}

fn console_response(answer: ConsoleAnswer) -> Response<Full<Bytes>> {
    let mut response = match answer {
        ConsoleAnswer::File(asset) => {
            let mut r = Response::new(Full::new(Bytes::from_static(asset.bytes)));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
            r
        }
        ConsoleAnswer::Redirect(to) => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::FOUND;
            r.headers_mut()
                .insert(hyper::header::LOCATION, HeaderValue::from_static(to));
            r
        }
    };
    for (name, value) in console::SECURITY_HEADERS {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    response
}

fn json_response(status: StatusCode, body: Option<&serde_json::Value>) -> Response<Full<Bytes>> {
    let bytes = body.map_or_else(Bytes::new, |b| {
        let mut text = b.to_string();
        text.push('\n');
        Bytes::from(text)
    });
    let mut response = Response::new(Full::new(bytes));
    *response.status_mut() = status;
    if body.is_some() {
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    response
}
