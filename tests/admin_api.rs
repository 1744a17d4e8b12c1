//! The admin HTTP API over real HTTP (hyper's client) against a real
//! broker on free loopback ports, with real protocol clients where a
//! route acts on them: every route, and the refusals (no credentials,
//! wrong password, missing role, malformed body, unknown resource,
//! duplicate, wrong method).

mod common;
#[path = "admin_api/contract.rs"]
mod contract;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use common::mqtt::{connected5, connected5_as, next5, opts5, publish5, subscribe_many5, v5};
use common::stomp::StompClient;
use common::TestBroker;
use rosetta::admin::AdminServer;
use rosetta::config::ListenAddr;
use rosetta::users::AdminRole;

const WAIT: Duration = Duration::from_secs(10);

fn basic(user: &str, password: &str) -> String {
    use base64ct::Encoding;
    let pair = format!("{user}:{password}");
    format!("Basic {}", base64ct::Base64::encode_string(pair.as_bytes()))
}

/// One HTTP/1.1 request to the admin API at `addr`: status, headers and
/// the JSON body (`null` when empty).
async fn request(
    addr: std::net::SocketAddr,
    method: Method,
    path: &str,
    who: Option<(&str, &str)>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (StatusCode, HeaderMap, Value) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method.clone())
        .uri(path)
        .header("host", addr.to_string());
    if let Some((user, password)) = who {
        req = req.header("authorization", basic(user, password));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default().to_owned())))
        .expect("request");
    let response = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("answer in time")
        .expect("response");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("JSON body ({e}): {}", String::from_utf8_lossy(&bytes)))
    };
    contract::check(&method, path, body, status, &value);
    (status, headers, value)
}

/// A broker with a users file (`admin` administrator, `manager`
/// management, `watcher` monitoring, `plain` no role) and its admin API.
struct Admin {
    broker: TestBroker,
    api: Option<AdminServer>,
    access: Arc<rosetta::access::UsersAccess>,
    users_file: PathBuf,
    _users_dir: tempfile::TempDir,
}

const ADMIN: (&str, &str) = ("admin", "admin-pw");
const MANAGER: (&str, &str) = ("manager", "manager-pw");
const WATCHER: (&str, &str) = ("watcher", "watcher-pw");
const PLAIN: (&str, &str) = ("plain", "plain-pw");

impl Admin {
    async fn start() -> Admin {
        Self::start_tweaked(|_| {}).await
    }

    /// As [`Admin::start`], after `tweak` adjusted the configuration.
    async fn start_tweaked(tweak: impl FnOnce(&mut rosetta::config::Config)) -> Admin {
        let users_dir = tempfile::tempdir().expect("tempdir");
        let users_file = users_dir.path().join("users.toml");
        for ((user, password), roles) in [
            (ADMIN, &[AdminRole::Administrator][..]),
            (MANAGER, &[AdminRole::Management]),
            (WATCHER, &[AdminRole::Monitoring]),
            (PLAIN, &[]),
        ] {
            rosetta::users::save_user(
                &users_file,
                user,
                password.as_bytes(),
                None,
                None,
                Some(roles),
            )
            .expect("save user");
        }
        let users = rosetta::users::Users::load(&users_file).expect("load users");
        let access = Arc::new(rosetta::access::UsersAccess::new(users, true).expect("access"));
        let file = users_file.clone();
        let broker = TestBroker::start_with(
            move |c| {
                c.security.users_file = Some(file);
                c.admin.listen = Some(ListenAddr::new("127.0.0.1", 0));
                tweak(c);
            },
            access.clone(),
        )
        .await;
        let view = broker.broker.as_ref().expect("running").view();
        let api = rosetta::admin::start(view, access.clone())
            .await
            .expect("admin API starts")
            .expect("admin API on");
        Admin {
            broker,
            api: Some(api),
            access,
            users_file,
            _users_dir: users_dir,
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        who: Option<(&str, &str)>,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> (StatusCode, HeaderMap, Value) {
        let addr = self
            .api
            .as_ref()
            .expect("api")
            .local_addr()
            .expect("admin listener");
        request(addr, method, path, who, headers, body).await
    }

    /// A request with credentials and no body.
    async fn act(
        &self,
        method: Method,
        path: &str,
        who: (&str, &str),
    ) -> (StatusCode, HeaderMap, Value) {
        self.call(method, path, Some(who), &[], None).await
    }

    /// A request with credentials and a body.
    async fn act_on(
        &self,
        method: Method,
        path: &str,
        who: (&str, &str),
        body: &str,
    ) -> (StatusCode, HeaderMap, Value) {
        self.call(method, path, Some(who), &[], Some(body)).await
    }

    async fn get(&self, path: &str, who: (&str, &str)) -> (StatusCode, Value) {
        let (status, _, body) = self.call(Method::GET, path, Some(who), &[], None).await;
        (status, body)
    }

    /// Stops the API and the broker, starts both again on the same data.
    async fn restart(&mut self) {
        if let Some(api) = self.api.take() {
            api.shutdown().await;
        }
        self.broker.restart().await;
        let view = self.broker.broker.as_ref().expect("running").view();
        self.api = rosetta::admin::start(view, self.access.clone())
            .await
            .expect("admin API starts");
    }

    async fn stop(mut self) {
        if let Some(api) = self.api.take() {
            api.shutdown().await;
        }
        self.broker.stop().await;
    }
}

/// An error answer has the JSON shape and the status.
fn assert_error(status: StatusCode, body: &Value, want: StatusCode) {
    assert_eq!(status, want, "{body}");
    assert!(body["error"].is_string(), "{body}");
    assert!(body["reason"].is_string(), "{body}");
}

/// A client that shuts down its sending side once its request is out
/// (`nc -N`, some scripts) still gets its answer (found by the admin_api
/// fuzz target: hyper closed at the end of input, answered or not).
#[tokio::test]
async fn a_client_that_half_closes_after_its_request_is_answered() {
    use base64ct::Encoding;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let admin = Admin::start().await;
    let addr = admin
        .api
        .as_ref()
        .expect("api")
        .local_addr()
        .expect("admin listener");
    // A wrong password: its answer waits for a password check (argon2,
    // milliseconds), while the end of input is already there.
    let request = format!(
        "GET /api/v1/overview HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {}\r\n\r\n",
        base64ct::Base64::encode_string(b"admin:wrong")
    );
    for _ in 0..5 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("write");
        stream.shutdown().await.expect("half-close");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .expect("closed in time")
            .expect("read");
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
            "{text:?}"
        );
        assert!(text.contains("\"reason\""), "{text:?}");
    }
    admin.stop().await;
}

/// Fuzzing finding 8: a request declaring a body over the limit got its
/// answer only once the client gave up sending (a 400 after the client's
/// half-close; none while it waited). It is refused with 413 at once,
/// with the connection still open and the body unsent; a chunked body
/// that grows past the limit is refused with 413 as well.
#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413_without_waiting_for_it() {
    use base64ct::Encoding;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let admin = Admin::start().await;
    let addr = admin
        .api
        .as_ref()
        .expect("api")
        .local_addr()
        .expect("admin listener");
    let auth = base64ct::Base64::encode_string(b"admin:admin-pw");
    let declared = format!(
        "PUT /api/v1/queues/big HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{",
        10 * 1024 * 1024
    );
    let chunk = vec![b' '; 16 * 1024];
    let mut chunked = format!(
        "PUT /api/v1/queues/big HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..5 {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(&chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    for request in [declared.into_bytes(), chunked] {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(&request).await.expect("write");
        // No half-close: the client waits, as one expecting 100 Continue.
        let mut answer = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
            .await
            .expect("answered without the rest of the body")
            .expect("read");
        let text = String::from_utf8_lossy(&answer[..n]);
        assert!(
            text.starts_with("HTTP/1.1 413 Payload Too Large\r\n"),
            "{text:?}"
        );
        assert!(text.contains("\"reason\""), "{text:?}");
    }
    let (status, _) = admin.get("/api/v1/queues/big", ADMIN).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created");
    admin.stop().await;
}

#[tokio::test]
async fn health_needs_no_credentials_and_the_api_refuses_properly() {
    let admin = Admin::start().await;
    let (status, _, body) = admin.call(Method::GET, "/healthz", None, &[], None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let (status, _, body) = admin.call(Method::GET, "/readyz", None, &[], None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ready"))
    );

    // No credentials, wrong password, unknown user: 401 with a challenge.
    for who in [None, Some(("admin", "wrong")), Some(("nobody", "x"))] {
        let (status, headers, body) = admin
            .call(Method::GET, "/api/v1/overview", who, &[], None)
            .await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED);
        assert_eq!(
            headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Basic realm=\"rosetta\""),
            "{who:?}"
        );
    }
    // A user without a role, and roles too weak for the route: 403.
    let (status, body) = admin.get("/api/v1/overview", PLAIN).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    let (status, _, body) = admin
        .act(Method::POST, "/api/v1/queues/q/purge", WATCHER)
        .await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    let (status, body) = admin.get("/api/v1/users", MANAGER).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);

    // Unknown paths 404, wrong methods 405 with Allow.
    let (status, body) = admin.get("/api/v1/nothing", ADMIN).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, headers, body) = admin.act(Method::POST, "/api/v1/overview", ADMIN).await;
    assert_error(status, &body, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        headers.get("allow").and_then(|v| v.to_str().ok()),
        Some("GET")
    );
    // Bad listing parameters: 400.
    for query in ["page=0", "page_size=0", "page_size=100000", "page=x"] {
        let (status, body) = admin.get(&format!("/api/v1/queues?{query}"), WATCHER).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST);
    }

    let (status, body) = admin.get("/api/v1/overview", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    assert!(body["uptime_s"].is_u64(), "{body}");
    assert!(body["node"].is_string(), "{body}");
    assert!(
        body["memory"]["budget_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{body}"
    );
    assert!(body["journal"]["bytes"].is_u64(), "{body}");
    admin.stop().await;
}

#[tokio::test]
async fn queues_are_listed_created_purged_and_deleted() {
    let admin = Admin::start().await;
    // Create: 201, again the same: 200, with other settings: 409.
    let (status, _, body) = admin
        .act(Method::PUT, "/api/v1/queues/orders", MANAGER)
        .await;
    assert_eq!(
        (status, &body["durable"]),
        (StatusCode::CREATED, &json!(true)),
        "{body}"
    );
    let (status, _, _) = admin
        .act_on(
            Method::PUT,
            "/api/v1/queues/orders",
            MANAGER,
            "{\"durable\": true}",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = admin
        .act_on(
            Method::PUT,
            "/api/v1/queues/orders",
            MANAGER,
            "{\"durable\": false}",
        )
        .await;
    assert_error(status, &body, StatusCode::CONFLICT);
    for bad in ["{\"durable\": ", "{\"durable\": 3}", "{\"colour\": 1}"] {
        let (status, _, body) = admin
            .act_on(Method::PUT, "/api/v1/queues/orders", MANAGER, bad)
            .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST);
    }
    let (status, body) = admin.get("/api/v1/queues/nosuch", WATCHER).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);

    // Three messages from a real client; another queue for the filter.
    let mut producer = StompClient::connect(admin.broker.stomp(), &[]).await;
    for i in 0..3 {
        producer
            .send_persistent("/queue/orders", &[], format!("m{i}").as_bytes())
            .await;
    }
    producer
        .send_persistent("/queue/invoices", &[], b"i0")
        .await;
    let (status, body) = admin.get("/api/v1/queues/orders", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["name"], &body["depth"], &body["durable"]),
        (&json!("orders"), &json!(3), &json!(true)),
        "{body}"
    );
    assert!(body["oldest_message_age_ms"].is_u64(), "{body}");

    let (status, body) = admin.get("/api/v1/queues?name=order", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["total"], &body["page"]),
        (&json!(1), &json!(1)),
        "{body}"
    );
    assert_eq!(body["items"][0]["name"], "orders", "{body}");
    let (_, body) = admin
        .get("/api/v1/queues?page_size=1&page=2", WATCHER)
        .await;
    assert_eq!(
        (&body["total"], &body["page_size"]),
        (&json!(2), &json!(1)),
        "{body}"
    );
    assert_eq!(
        body["items"][0]["name"], "orders",
        "name order: invoices, orders; {body}"
    );

    // One message in flight with a consumer that does not ack: a purge
    // removes the two ready ones and leaves it.
    let mut consumer = StompClient::connect(admin.broker.stomp(), &[]).await;
    consumer
        .subscribe(
            "s",
            "/queue/orders",
            "client-individual",
            &[("activemq.prefetchSize", "1")],
        )
        .await;
    let held = consumer.message().await;
    assert_eq!(held.text(), "m0");
    let (status, _, body) = admin
        .act(Method::POST, "/api/v1/queues/orders/purge", MANAGER)
        .await;
    assert_eq!(
        (status, &body["removed"]),
        (StatusCode::OK, &json!(2)),
        "{body}"
    );
    let (_, body) = admin.get("/api/v1/queues/orders", WATCHER).await;
    assert_eq!(
        (&body["depth"], &body["in_flight"]),
        (&json!(0), &json!(1)),
        "{body}"
    );
    // The consumer acks what it holds, and gets nothing more: the queue is empty.
    consumer.ack(&held).await;
    consumer.expect_nothing().await;
    consumer.disconnect().await;
    let mut late = StompClient::connect(admin.broker.stomp(), &[]).await;
    late.subscribe("s", "/queue/orders", "auto", &[]).await;
    late.expect_nothing().await;
    late.disconnect().await;

    let (status, _, body) = admin
        .act(Method::POST, "/api/v1/queues/nosuch/purge", MANAGER)
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, _, _) = admin
        .act(Method::DELETE, "/api/v1/queues/invoices", MANAGER)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = admin.get("/api/v1/queues/invoices", WATCHER).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, _, body) = admin
        .act(Method::DELETE, "/api/v1/queues/invoices", MANAGER)
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    producer.disconnect().await;
    admin.stop().await;
}

/// A queue name with a `/` travels percent-encoded.
#[tokio::test]
async fn queue_names_with_slashes_are_percent_encoded() {
    let admin = Admin::start().await;
    let (status, _, body) = admin
        .act(Method::PUT, "/api/v1/queues/app%2Faudit", ADMIN)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = admin.get("/api/v1/queues/app%2Faudit", WATCHER).await;
    assert_eq!(
        (status, &body["name"]),
        (StatusCode::OK, &json!("app/audit")),
        "{body}"
    );
    admin.stop().await;
}

async fn connection_id(admin: &Admin, client_id: &str) -> u64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, body) = admin
            .get(&format!("/api/v1/connections?name={client_id}"), WATCHER)
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let found = body["items"]
            .as_array()
            .and_then(|items| items.iter().find(|c| c["client_id"] == client_id))
            .and_then(|c| c["id"].as_u64());
        if let Some(id) = found {
            return id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{client_id} never listed: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Closes the connection of `client_id` with `reason`, as a manager.
async fn close_connection(admin: &Admin, client_id: &str, reason: &str) {
    let id = connection_id(admin, client_id).await;
    let (status, _, body) = admin
        .call(
            Method::DELETE,
            &format!("/api/v1/connections/{id}"),
            Some(MANAGER),
            &[("x-reason", reason)],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
}

#[tokio::test]
async fn closing_a_connection_tells_each_client_the_reason() {
    let admin = Admin::start().await;
    let reason = "maintenance at 02:00";

    // MQTT 5 (rumqttc): DISCONNECT 0x98 with the reason string.
    let (_client, mut ev, _) = connected5(opts5(&admin.broker, "kick-mqtt")).await;
    let id = connection_id(&admin, "kick-mqtt").await;
    let (_, body) = admin.get("/api/v1/connections", WATCHER).await;
    let row = body["items"]
        .as_array()
        .and_then(|items| items.iter().find(|c| c["id"] == id).cloned())
        .expect("listed");
    assert_eq!(
        (&row["protocol"], &row["transport"], &row["tls"]),
        (&json!("mqtt"), &json!("tcp"), &json!(false)),
        "{row}"
    );
    assert!(
        row["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{row}"
    );
    close_connection(&admin, "kick-mqtt", reason).await;
    let err = tokio::time::timeout(WAIT, async {
        loop {
            if let Err(e) = next5(&mut ev).await {
                break e;
            }
        }
    })
    .await
    .expect("disconnected in time");
    match err {
        v5::ConnectionError::MqttState(v5::StateError::ServerDisconnect {
            reason_code,
            reason_string,
        }) => {
            assert_eq!(reason_code, v5::DisconnectReasonCode::AdministrativeAction);
            assert_eq!(reason_string.as_deref(), Some(reason));
        }
        other => panic!("expected DISCONNECT 0x98, got {other:?}"),
    }

    // STOMP: an ERROR frame whose message is the reason, then the close.
    let mut stomp =
        StompClient::connect(admin.broker.stomp(), &[("client-id", "kick-stomp")]).await;
    close_connection(&admin, "kick-stomp", reason).await;
    let error = stomp.expect_error_then_close().await;
    // STOMP 1.2 escapes the colon in a header value (`\c`).
    let message = error.header("message").map(common::stomp::unescape);
    assert_eq!(message.as_deref(), Some(reason), "{error:?}");

    // AMQP (fe2o3-amqp): close with amqp:connection:forced, the reason
    // as its description.
    let mut amqp = common::amqp::connect(&admin.broker, "kick-amqp").await;
    close_connection(&admin, "kick-amqp", reason).await;
    let closed = tokio::time::timeout(WAIT, amqp.on_close())
        .await
        .expect("closed in time");
    match closed {
        Err(fe2o3_amqp::connection::Error::RemoteClosedWithError(e)) => {
            assert_eq!(
                e.condition,
                fe2o3_amqp::types::definitions::ErrorCondition::ConnectionError(
                    fe2o3_amqp::types::definitions::ConnectionError::ConnectionForced
                )
            );
            assert_eq!(e.description.as_deref(), Some(reason));
        }
        other => panic!("expected a close with an error, got {other:?}"),
    }

    // Refusals: unknown id 404, a reason with a control character 400, a
    // monitoring user 403.
    for (path, who, headers, want) in [
        (
            "/api/v1/connections/999999",
            MANAGER,
            vec![],
            StatusCode::NOT_FOUND,
        ),
        (
            "/api/v1/connections/abc",
            MANAGER,
            vec![],
            StatusCode::NOT_FOUND,
        ),
        (
            "/api/v1/connections/1",
            WATCHER,
            vec![],
            StatusCode::FORBIDDEN,
        ),
        (
            "/api/v1/connections/1",
            MANAGER,
            vec![("x-reason", "a\tb")],
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (status, _, body) = admin
            .call(Method::DELETE, path, Some(who), &headers, None)
            .await;
        assert_error(status, &body, want);
    }
    admin.stop().await;
}

#[tokio::test]
async fn users_are_managed_through_the_file_and_take_effect_at_the_next_login() {
    let admin = Admin::start().await;
    let (status, body) = admin.get("/api/v1/users", ADMIN).await;
    assert_eq!(
        (status, &body["total"]),
        (StatusCode::OK, &json!(4)),
        "{body}"
    );
    let text = body.to_string();
    assert!(
        !text.contains("argon2") && !text.contains("SCRAM"),
        "no hash: {text}"
    );

    let new = r#"{"name": "ops", "password": "ops-pw", "roles": ["monitoring"]}"#;
    let (status, _, body) = admin
        .act_on(Method::POST, "/api/v1/users", ADMIN, new)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["roles"], json!(["monitoring"]), "{body}");
    assert!(body.get("password_hash").is_none(), "{body}");
    let (status, _, body) = admin
        .act_on(Method::POST, "/api/v1/users", ADMIN, new)
        .await;
    assert_error(status, &body, StatusCode::CONFLICT);
    for bad in [
        "{\"name\": \"x\"",
        "{\"name\": \"x\"}",
        r#"{"name": "x", "password": "p", "roles": ["root"]}"#,
        r#"{"name": "x", "password": "", "roles": []}"#,
        r#"{"name": "x", "password": "p", "publish": ["no-slash"]}"#,
    ] {
        let (status, _, body) = admin
            .act_on(Method::POST, "/api/v1/users", ADMIN, bad)
            .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST);
    }
    let (status, _, body) = admin
        .act_on(Method::POST, "/api/v1/users", MANAGER, new)
        .await;
    assert_error(status, &body, StatusCode::FORBIDDEN);

    // In force at once: the new user reads the API and logs in over STOMP.
    let (status, _) = admin.get("/api/v1/overview", ("ops", "ops-pw")).await;
    assert_eq!(status, StatusCode::OK);
    let stomp = StompClient::connect(
        admin.broker.stomp(),
        &[("login", "ops"), ("passcode", "ops-pw")],
    )
    .await;
    stomp.disconnect().await;
    let file = std::fs::read_to_string(&admin.users_file).expect("users file");
    assert!(
        file.contains("[users.ops]") && file.contains("roles = [\"monitoring\"]"),
        "{file}"
    );

    let (status, body) = admin.get("/api/v1/users/ops", ADMIN).await;
    assert_eq!(
        (status, &body["name"]),
        (StatusCode::OK, &json!("ops")),
        "{body}"
    );
    let (status, _, _) = admin
        .act_on(
            Method::PUT,
            "/api/v1/users/ops/password",
            ADMIN,
            r#"{"password": "new-pw"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // The old password (remembered a moment ago) no longer works.
    let (status, body) = admin.get("/api/v1/overview", ("ops", "ops-pw")).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED);
    let (status, _) = admin.get("/api/v1/overview", ("ops", "new-pw")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = admin
        .act_on(
            Method::PUT,
            "/api/v1/users/nobody/password",
            ADMIN,
            r#"{"password": "p"}"#,
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);

    let (status, _, _) = admin.act(Method::DELETE, "/api/v1/users/ops", ADMIN).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = admin.get("/api/v1/users/ops", ADMIN).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, body) = admin.get("/api/v1/overview", ("ops", "new-pw")).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED);
    let (status, _, body) = admin.act(Method::DELETE, "/api/v1/users/ops", ADMIN).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    admin.stop().await;
}

/// A purge is journaled: the purged messages do not come back after a
/// restart.
#[tokio::test]
async fn purged_messages_stay_gone_after_a_restart() {
    let mut admin = Admin::start().await;
    let mut producer = StompClient::connect(admin.broker.stomp(), &[]).await;
    for i in 0..3 {
        producer
            .send_persistent("/queue/jobs", &[], format!("j{i}").as_bytes())
            .await;
    }
    producer.disconnect().await;
    let (status, _, body) = admin
        .act(Method::POST, "/api/v1/queues/jobs/purge", MANAGER)
        .await;
    assert_eq!(
        (status, &body["removed"]),
        (StatusCode::OK, &json!(3)),
        "{body}"
    );
    if let Some(api) = admin.api.take() {
        api.shutdown().await;
    }
    admin.broker.restart().await;
    assert_eq!(
        admin.broker.queue("jobs"),
        Some((0, 0)),
        "the queue stays, empty"
    );
    admin.broker.stop().await;
}

/// 100,000 queues: the overview does no per-queue work and a page of 100
/// costs its 100 queues plus a name selection, not 100,000 statistics
/// snapshots. Timed over real HTTP; the bounds are the issue's (50 ms,
/// 100 ms), measured on a debug build, so a release build has room.
#[tokio::test]
async fn a_hundred_thousand_queues_list_within_the_bounds() {
    const QUEUES: usize = 100_000;
    let admin = Admin::start().await;
    let core = admin.broker.core().clone();
    tokio::task::spawn_blocking(move || {
        for i in 0..QUEUES {
            core.create_queue(&format!("q{i:06}"), false, Box::new(|_| {}))
                .expect("create");
        }
    })
    .await
    .expect("created");
    let time = |path: &'static str| {
        let admin = &admin;
        async move {
            // The best of a few: the machine is shared with other builds.
            let mut best = Duration::MAX;
            let mut last = Value::Null;
            for _ in 0..5 {
                let started = std::time::Instant::now();
                let (status, body) = admin.get(path, WATCHER).await;
                best = best.min(started.elapsed());
                assert_eq!(status, StatusCode::OK, "{body}");
                last = body;
            }
            (best, last)
        }
    };
    let (overview, body) = time("/api/v1/overview").await;
    assert_eq!(body["queues"]["count"], json!(QUEUES), "{body}");
    let (page, body) = time("/api/v1/queues?page=500&page_size=100").await;
    assert_eq!(body["total"], json!(QUEUES), "{body}");
    assert_eq!(body["items"][0]["name"], "q049900", "{body}");
    let (filtered, body) = time("/api/v1/queues?name=q0999&page_size=100").await;
    assert_eq!(body["total"], json!(100), "{body}");
    eprintln!(
        "{QUEUES} queues: overview {overview:?}, page of 100 {page:?}, filtered page {filtered:?}"
    );
    assert!(
        overview < Duration::from_millis(50),
        "overview {overview:?}"
    );
    assert!(page < Duration::from_millis(100), "page {page:?}");
    // A filtered page walks every name (for its total): printed, not
    // bounded, since the issue bounds the plain page.
    admin.stop().await;
}

/// The payloads of a peek, as text.
fn peeked_payloads(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| m["payload"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Peek shows the first messages (headers, UTF-8 or base64 payload) and
/// takes none; a move takes them to another queue durably: after a
/// restart each is on the target once and gone from the source.
#[tokio::test]
async fn queue_messages_are_peeked_and_moved_durably() {
    let mut admin = Admin::start().await;
    let mut producer = StompClient::connect(admin.broker.stomp(), &[]).await;
    producer
        .send_persistent("/queue/src", &[("colour", "blue")], b"m0")
        .await;
    producer.send_persistent("/queue/src", &[], b"m1").await;
    producer
        .send_persistent("/queue/src", &[], &[0xff, 0xfe, 0x00])
        .await;
    producer.disconnect().await;

    let (status, body) = admin
        .get("/api/v1/queues/src/messages?count=2", MANAGER)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(peeked_payloads(&body), ["m0", "m1"], "{body}");
    let first = &body["messages"][0];
    assert_eq!(
        (
            &first["size"],
            &first["payload_encoding"],
            &first["properties"]["colour"]
        ),
        (&json!(2), &json!("utf-8"), &json!("blue")),
        "{body}"
    );
    let (_, body) = admin
        .get("/api/v1/queues/src/messages?count=100", MANAGER)
        .await;
    let binary = &body["messages"][2];
    assert_eq!(
        (&binary["payload_encoding"], &binary["payload"]),
        (&json!("base64"), &json!("//4A")),
        "{body}"
    );
    assert_eq!(
        admin.broker.queue("src"),
        Some((3, 0)),
        "peek takes nothing"
    );
    let (status, body) = admin.get("/api/v1/queues/src/messages", WATCHER).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    for bad in ["count=0", "count=101", "count=x"] {
        let (status, body) = admin
            .get(&format!("/api/v1/queues/src/messages?{bad}"), MANAGER)
            .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST);
    }
    let (status, body) = admin.get("/api/v1/queues/nosuch/messages", MANAGER).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);

    // Move: to a queue that exists, not to itself, not to nowhere.
    let (status, _, _) = admin.act(Method::PUT, "/api/v1/queues/dst", MANAGER).await;
    assert_eq!(status, StatusCode::CREATED);
    for (bad, want) in [
        ("{\"to\": \"nosuch\"}", StatusCode::NOT_FOUND),
        ("{\"to\": \"src\"}", StatusCode::BAD_REQUEST),
        ("{}", StatusCode::BAD_REQUEST),
        ("{\"to\": \"dst\", \"count\": 0}", StatusCode::BAD_REQUEST),
    ] {
        let (status, _, body) = admin
            .act_on(Method::POST, "/api/v1/queues/src/move", MANAGER, bad)
            .await;
        assert_error(status, &body, want);
    }
    let (status, _, body) = admin
        .act_on(
            Method::POST,
            "/api/v1/queues/src/move",
            WATCHER,
            "{\"to\": \"dst\"}",
        )
        .await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    assert_eq!(
        admin.broker.queue("src"),
        Some((3, 0)),
        "refusals move nothing"
    );
    let (status, _, body) = admin
        .act_on(
            Method::POST,
            "/api/v1/queues/src/move",
            MANAGER,
            "{\"to\": \"dst\", \"count\": 2}",
        )
        .await;
    assert_eq!(
        (status, &body["moved"], &body["left"]),
        (StatusCode::OK, &json!(2), &json!(0)),
        "{body}"
    );

    admin.restart().await;
    assert_eq!(admin.broker.queue("src"), Some((1, 0)), "{body}");
    assert_eq!(admin.broker.queue("dst"), Some((2, 0)), "{body}");
    let mut consumer = StompClient::connect(admin.broker.stomp(), &[]).await;
    consumer.subscribe("d", "/queue/dst", "auto", &[]).await;
    let got: Vec<String> = consumer
        .messages(2)
        .await
        .iter()
        .map(|m| m.text())
        .collect();
    assert_eq!(got, ["m0", "m1"], "in order");
    consumer.expect_nothing().await;
    admin.stop().await;
}

/// A message NACKed past its attempts lands in the dead-letter queue with
/// `x-original-queue`; replay sends it back there, where the consumer
/// gets it again, and keeps a message that names no original queue.
#[tokio::test]
async fn a_replay_sends_dead_letters_back_to_their_queue() {
    let admin = Admin::start_tweaked(|c| c.broker.delivery_attempts_max = 1).await;
    let mut producer = StompClient::connect(admin.broker.stomp(), &[]).await;
    producer
        .send_persistent("/queue/orders", &[], b"poison")
        .await;
    producer.send_persistent("/queue/DLQ", &[], b"stray").await;
    let mut consumer = StompClient::connect(admin.broker.stomp(), &[]).await;
    consumer
        .subscribe("o", "/queue/orders", "client-individual", &[])
        .await;
    let m = consumer.message().await;
    consumer.request("NACK", &[("id", &m.ack_id())], b"").await;
    let (_, body) = admin.get("/api/v1/queues/DLQ/messages", MANAGER).await;
    assert_eq!(peeked_payloads(&body), ["stray", "poison"], "{body}");
    assert_eq!(
        body["messages"][1]["properties"]["x-original-queue"],
        json!("orders"),
        "{body}"
    );

    let (status, _, body) = admin
        .act_on(Method::POST, "/api/v1/queues/DLQ/replay", WATCHER, "")
        .await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    let (status, _, body) = admin
        .act_on(
            Method::POST,
            "/api/v1/queues/DLQ/replay",
            MANAGER,
            "{\"colour\": 1}",
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, _, body) = admin
        .act(Method::POST, "/api/v1/queues/DLQ/replay", MANAGER)
        .await;
    assert_eq!(
        (status, &body["moved"], &body["left"]),
        (StatusCode::OK, &json!(1), &json!(1)),
        "{body}"
    );
    let again = consumer.message().await;
    assert_eq!(again.text(), "poison");
    consumer.ack(&again).await;
    let (_, body) = admin.get("/api/v1/queues/DLQ/messages", MANAGER).await;
    assert_eq!(peeked_payloads(&body), ["stray"], "{body}");
    admin.stop().await;
}

/// An MQTT 5 persistent session is listed with its subscription, the
/// retained message it published under topics; a connected session is
/// not deleted (409), a disconnected one is, and the client's next
/// CONNECT finds no session; a cleared retained message is not sent to a
/// new subscriber.
#[tokio::test]
async fn mqtt_sessions_subscriptions_and_retained_messages_are_listed_and_deleted() {
    let admin = Admin::start().await;
    let persistent = |id: &str| {
        let mut opts = opts5(&admin.broker, id);
        opts.set_clean_start(false);
        opts.set_session_expiry_interval(Some(600));
        opts
    };
    let (client, mut ev, ack) = connected5(persistent("sess-1")).await;
    assert!(!ack.session_present);
    common::mqtt::subscribe5(
        &client,
        &mut ev,
        v5::Filter::new("sensors/+/t", v5::QoS::AtLeastOnce),
        None,
    )
    .await;
    client
        .publish("sensors/a/t", v5::QoS::AtLeastOnce, true, "21")
        .await
        .expect("publish");
    common::mqtt::publish5(&mut ev).await;

    let (status, body) = admin.get("/api/v1/sessions?name=sess", WATCHER).await;
    assert_eq!(
        (status, &body["total"]),
        (StatusCode::OK, &json!(1)),
        "{body}"
    );
    let session = &body["items"][0];
    assert_eq!(
        (
            &session["client_id"],
            &session["persistent"],
            &session["connected"],
            &session["subscriptions"][0]["filter"],
            &session["subscriptions"][0]["qos"],
        ),
        (
            &json!("sess-1"),
            &json!(true),
            &json!(true),
            &json!("sensors/+/t"),
            &json!(1)
        ),
        "{body}"
    );
    let (status, body) = admin
        .get("/api/v1/subscriptions?name=sensors", WATCHER)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["total"], &body["items"][0]["queue"]),
        (&json!(1), &json!("$mqtt/sess-1")),
        "{body}"
    );
    let (status, body) = admin.get("/api/v1/topics", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (
            &body["total"],
            &body["items"][0]["topic"],
            &body["items"][0]["size"]
        ),
        (&json!(1), &json!("sensors/a/t"), &json!(2)),
        "{body}"
    );

    let (status, _, body) = admin
        .act(Method::DELETE, "/api/v1/sessions/sess-1", MANAGER)
        .await;
    assert_error(status, &body, StatusCode::CONFLICT);
    common::mqtt::disconnect5(&client, &mut ev).await;
    // The DISCONNECT is on the wire; the broker detaches the session when
    // it has read it, which the next request may overtake.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, body) = admin.get("/api/v1/sessions/sess-1", WATCHER).await;
        if body["connected"] == json!(false) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session stayed connected after DISCONNECT: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _, body) = admin
        .act(Method::DELETE, "/api/v1/sessions/sess-1", WATCHER)
        .await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    let (status, _, _) = admin
        .act(Method::DELETE, "/api/v1/sessions/sess-1", MANAGER)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = admin.get("/api/v1/sessions/sess-1", WATCHER).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (client, mut ev, ack) = connected5(persistent("sess-1")).await;
    assert!(!ack.session_present, "the session was deleted");

    let (status, _, body) = admin
        .act(Method::DELETE, "/api/v1/topics/sensors%2Fa%2Ft", WATCHER)
        .await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    let (status, _, _) = admin
        .act(Method::DELETE, "/api/v1/topics/sensors%2Fa%2Ft", MANAGER)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, body) = admin
        .act(Method::DELETE, "/api/v1/topics/sensors%2Fa%2Ft", MANAGER)
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    common::mqtt::subscribe5(
        &client,
        &mut ev,
        v5::Filter::new("sensors/#", v5::QoS::AtLeastOnce),
        None,
    )
    .await;
    common::mqtt::quiet5(&mut ev).await;
    admin.stop().await;
}

/// The roles listing says what each role allows, from the route table.
#[tokio::test]
async fn roles_are_listed_with_what_each_allows() {
    let admin = Admin::start().await;
    let (status, body) = admin.get("/api/v1/roles", WATCHER).await;
    assert_eq!(
        (status, &body["total"]),
        (StatusCode::OK, &json!(3)),
        "{body}"
    );
    let role = |name: &str| {
        body["items"]
            .as_array()
            .and_then(|items| items.iter().find(|r| r["name"] == name).cloned())
            .unwrap_or_else(|| panic!("role {name}: {body}"))
    };
    let allows = |name: &str, route: &str| {
        role(name)["allows"]
            .as_array()
            .is_some_and(|a| a.iter().any(|r| r == route))
    };
    assert!(allows("monitoring", "GET /api/v1/queues"));
    assert!(!allows("monitoring", "POST /api/v1/queues/{name}/purge"));
    assert!(allows("management", "POST /api/v1/queues/{name}/purge"));
    assert!(!allows("management", "POST /api/v1/users"));
    assert!(allows("administrator", "POST /api/v1/users"));
    assert_eq!(
        role("administrator")["includes"],
        json!(["monitoring", "management"])
    );
    let (status, body) = admin.get("/api/v1/roles", PLAIN).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    admin.stop().await;
}

/// A request with a bearer token.
async fn with_token(admin: &Admin, method: Method, path: &str, token: &str) -> (StatusCode, Value) {
    let bearer = format!("Bearer {token}");
    let (status, _, body) = admin
        .call(method, path, None, &[("authorization", &bearer)], None)
        .await;
    (status, body)
}

/// A token made with the password stands for its user (with the user's
/// role, no more), survives a restart, is never shown again nor kept in
/// the clear, stops at its expiry and when revoked, and cannot make
/// tokens itself.
#[tokio::test]
async fn bearer_tokens_stand_for_their_user_until_revoked_or_expired() {
    let mut admin = Admin::start().await;
    let (status, _, body) = admin.act(Method::POST, "/api/v1/tokens", WATCHER).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let token = body["token"].as_str().expect("token").to_owned();
    let id = body["id"].as_str().expect("id").to_owned();
    assert_eq!(body["user"], json!("watcher"));

    let (status, body) = with_token(&admin, Method::GET, "/api/v1/overview", &token).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = with_token(&admin, Method::POST, "/api/v1/queues/x/purge", &token).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    let (status, body) = with_token(&admin, Method::POST, "/api/v1/tokens", &token).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    let (status, body) = with_token(&admin, Method::GET, "/api/v1/overview", "rosetta_wrong").await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED);

    // Only an administrator makes tokens for someone else.
    let (status, _, body) = admin
        .act_on(
            Method::POST,
            "/api/v1/tokens",
            MANAGER,
            "{\"user\": \"watcher\"}",
        )
        .await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    for bad in ["{\"expires_in_s\": 0}", "{\"colour\": 1}"] {
        let (status, _, body) = admin
            .act_on(Method::POST, "/api/v1/tokens", ADMIN, bad)
            .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST);
    }
    let (status, _, body) = admin
        .act_on(
            Method::POST,
            "/api/v1/tokens",
            ADMIN,
            "{\"user\": \"manager\", \"expires_in_s\": 1}",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let short = body["token"].as_str().expect("token").to_owned();

    // Listed without the token; the file holds no token either.
    let (_, body) = admin.get("/api/v1/tokens", WATCHER).await;
    assert_eq!(body["total"], json!(1), "a user sees its own: {body}");
    assert!(body["items"][0].get("token").is_none(), "{body}");
    let (_, body) = admin.get("/api/v1/tokens", ADMIN).await;
    assert_eq!(body["total"], json!(2), "{body}");
    let file = std::fs::read_to_string(admin.broker.data_dir().join("admin-tokens.json"))
        .expect("tokens file");
    assert!(!file.contains(&token["rosetta_".len()..]), "{file}");

    admin.restart().await;
    let (status, body) = with_token(&admin, Method::GET, "/api/v1/queues", &token).await;
    assert_eq!(status, StatusCode::OK, "after a restart: {body}");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (status, body) = with_token(&admin, Method::GET, "/api/v1/queues", &short).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED);

    // Another user's token is not found to a non-administrator.
    let (status, _, body) = admin
        .act(Method::DELETE, &format!("/api/v1/tokens/{id}"), MANAGER)
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, _, _) = admin
        .act(Method::DELETE, &format!("/api/v1/tokens/{id}"), WATCHER)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = with_token(&admin, Method::GET, "/api/v1/queues", &token).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED);
    admin.stop().await;
}

/// One raw HTTP/1.1 GET that asks the server to close; the whole answer
/// (status line and headers as sent, lowercase header names from hyper).
async fn raw_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

/// The console's files come from the admin listener itself, without
/// credentials, with a policy that allows only its own files; a request
/// from its script is refused with a Bearer challenge, which no browser
/// answers with a login dialog, and every other 401 with a Basic one.
#[tokio::test]
async fn the_console_is_served_by_the_admin_listener() {
    let admin = Admin::start().await;
    let addr = admin
        .api
        .as_ref()
        .expect("api")
        .local_addr()
        .expect("admin listener");
    let page = raw_get(addr, "/console/").await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.contains("content-security-policy: default-src 'self'"),
        "{page}"
    );
    assert!(page.contains("<script src=\"app.js\""), "{page}");
    for (path, kind) in [
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
    ] {
        let file = raw_get(addr, path).await;
        assert!(file.starts_with("HTTP/1.1 200"), "{path}: {file}");
        assert!(
            file.contains(&format!("content-type: {kind}")),
            "{path}: {file}"
        );
    }
    let root = raw_get(addr, "/").await;
    assert!(root.starts_with("HTTP/1.1 302"), "{root}");
    assert!(root.contains("location: /console/"), "{root}");
    let missing = raw_get(addr, "/console/nothing.js").await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");

    let (status, headers, _) = admin
        .call(Method::GET, "/api/v1/overview", None, &[], None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers["www-authenticate"], "Basic realm=\"rosetta\"");
    for who in [None, Some(("admin", "wrong"))] {
        let (status, headers, _) = admin
            .call(
                Method::GET,
                "/api/v1/overview",
                who,
                &[("x-requested-with", "XMLHttpRequest")],
                None,
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(headers["www-authenticate"], "Bearer realm=\"rosetta\"");
    }
    admin.stop().await;
}

/// The certificate a fresh TLS handshake on `addr` gets with `pki`'s
/// trust, or the handshake's error.
async fn served_certificate(
    addr: std::net::SocketAddr,
    pki: &common::pki::Pki,
) -> Result<Vec<u8>, std::io::Error> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio::time::timeout(WAIT, pki.connector().connect(common::pki::localhost(), tcp))
        .await
        .expect("handshake in time")?;
    let (_, session) = tls.get_ref();
    Ok(session
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default())
}

fn certificate_der(file: &std::path::Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_file(file)
        .expect("certificate")
        .as_ref()
        .to_vec()
}

/// `POST /api/v1/reload` swaps the TLS certificate for new handshakes
/// (the files replaced under the broker), and refuses a broken one,
/// keeping the certificate in force.
#[tokio::test]
async fn reload_puts_a_new_tls_certificate_in_force_for_new_handshakes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = common::pki::Pki::generate(&subdir(dir.path(), "old"));
    let new = common::pki::Pki::generate(&subdir(dir.path(), "new"));
    let tls = old.tls_config(false);
    let admin = Admin::start_tweaked(move |c| {
        c.tls = tls;
        c.listeners.mqtts = Some(ListenAddr::new("127.0.0.1", 0));
    })
    .await;
    let mqtts = admin.broker.addr(rosetta::config::ListenerKind::Mqtts);
    let before = served_certificate(mqtts, &old)
        .await
        .expect("old handshake");
    assert_eq!(before, certificate_der(&old.cert_file));

    let (status, _, body) = admin.act(Method::POST, "/api/v1/reload", MANAGER).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    std::fs::copy(&new.cert_file, &old.cert_file).expect("swap cert");
    std::fs::copy(&new.key_file, &old.key_file).expect("swap key");
    let (status, _, body) = admin.act(Method::POST, "/api/v1/reload", ADMIN).await;
    assert_eq!(
        (status, &body["tls_reloaded"]),
        (StatusCode::OK, &json!(true)),
        "{body}"
    );
    let after = served_certificate(mqtts, &new)
        .await
        .expect("new handshake");
    assert_eq!(after, certificate_der(&new.cert_file));
    assert!(
        served_certificate(mqtts, &old).await.is_err(),
        "the old CA does not sign the new certificate"
    );

    // A broken certificate file: refused, the new one stays in force.
    std::fs::write(&old.cert_file, "not a certificate").expect("break");
    let (status, _, body) = admin.act(Method::POST, "/api/v1/reload", ADMIN).await;
    assert_error(status, &body, StatusCode::CONFLICT);
    assert!(
        body["reason"].as_str().is_some_and(|r| r.contains("TLS")),
        "{body}"
    );
    let still = served_certificate(mqtts, &new).await.expect("still served");
    assert_eq!(still, after);
    admin.stop().await;
}

/// `dir/name`, created.
fn subdir(dir: &std::path::Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(&path).expect("mkdir");
    path
}

/// Deny rules through the API: created with a user, shown by GET, replaced
/// by `PUT .../permissions`, and in force on a connection that is already
/// open at its next SUBSCRIBE (rumqttc, MQTT 5).
#[tokio::test]
async fn deny_rules_are_set_through_the_api_and_bind_live_connections() {
    let admin = Admin::start().await;
    let new = r#"{"name": "dora", "password": "dora-pw",
                  "deny_subscribe": ["/topic/test/nosubscribe"]}"#;
    let (status, _, body) = admin
        .act_on(Method::POST, "/api/v1/users", ADMIN, new)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["deny_subscribe"], json!(["/topic/test/nosubscribe"]));
    assert_eq!(body["deny_publish"], json!([]));
    assert_eq!(body["subscribe"], json!(["#"]));

    let mut opts = opts5(&admin.broker, "dora-live");
    opts.set_credentials("dora", "dora-pw");
    let (c, mut ev, ack) = connected5(opts).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    let refused = [v5::SubscribeReasonCode::NotAuthorized];
    let granted = [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)];
    assert_eq!(
        subscribe_many5(&c, &mut ev, &["test/nosubscribe"]).await,
        refused
    );
    assert_eq!(subscribe_many5(&c, &mut ev, &["other/a"]).await, granted);

    // The new lists replace the old: test/nosubscribe is allowed now,
    // other/# denied, for the connection already open.
    let change = r#"{"deny_subscribe": ["/topic/other/#"], "deny_publish": ["/queue/audit"]}"#;
    let (status, _, body) = admin
        .act_on(Method::PUT, "/api/v1/users/dora/permissions", ADMIN, change)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["deny_subscribe"], json!(["/topic/other/#"]), "{body}");
    assert_eq!(body["deny_publish"], json!(["/queue/audit"]), "{body}");
    let (_, body) = admin.get("/api/v1/users/dora", ADMIN).await;
    assert_eq!(body["deny_subscribe"], json!(["/topic/other/#"]), "{body}");
    assert_eq!(
        subscribe_many5(&c, &mut ev, &["test/nosubscribe"]).await,
        granted
    );
    assert_eq!(subscribe_many5(&c, &mut ev, &["other/b"]).await, refused);
    let file = std::fs::read_to_string(&admin.users_file).expect("users file");
    assert!(
        file.contains("deny_subscribe = [\"/topic/other/#\"]"),
        "{file}"
    );

    // Refusals: a bad pattern, an unknown key, an unknown user, no role.
    for (who, path, body, want) in [
        (
            ADMIN,
            "dora",
            r#"{"deny_publish": ["nope"]}"#,
            StatusCode::BAD_REQUEST,
        ),
        (ADMIN, "dora", r#"{"deny": []}"#, StatusCode::BAD_REQUEST),
        (ADMIN, "nobody", "{}", StatusCode::NOT_FOUND),
        (MANAGER, "dora", "{}", StatusCode::FORBIDDEN),
    ] {
        let path = format!("/api/v1/users/{path}/permissions");
        let (status, _, answer) = admin.act_on(Method::PUT, &path, who, body).await;
        assert_error(status, &answer, want);
    }
    admin.stop().await;
}

/// The overview's message rates and journal sync latency: zero-shaped on
/// an idle broker, moving once a STOMP producer and consumer exchange
/// persistent messages (the rates come from once-a-second samples, so the
/// test keeps traffic flowing until two samples have seen it); `/metrics`
/// carries the same counters and the sync-time histogram.
#[tokio::test]
async fn overview_rates_and_sync_latency_move_when_messages_flow() {
    let admin = Admin::start().await;
    let (status, body) = admin.get("/api/v1/overview", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let rates = &body["messages"]["rates"];
    for key in [
        "published_per_s",
        "delivered_per_s",
        "acknowledged_per_s",
        "window_s",
    ] {
        assert!(rates[key].is_f64() || rates[key].is_u64(), "{key}: {body}");
    }
    assert_eq!(body["messages"]["published_total"], json!(0), "{body}");
    let sync = &body["journal"]["sync_latency"];
    assert!(sync["syncs"].is_u64(), "{body}");
    assert!(
        sync.get("p50_us").is_some() && sync.get("p99_us").is_some(),
        "{body}"
    );

    let creds = [("login", ADMIN.0), ("passcode", ADMIN.1)];
    let mut producer = StompClient::connect(admin.broker.stomp(), &creds).await;
    let mut consumer = StompClient::connect(admin.broker.stomp(), &creds).await;
    consumer.subscribe("s", "/queue/rates", "auto", &[]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    // Every SEND is receipted before the overview is read and every
    // MESSAGE taken, so the totals must match these counts exactly: a
    // counter bumped twice, or not at all, on some path fails here.
    let mut sent = 0u64;
    let body = loop {
        producer.send_numbered("/queue/rates", 5).await;
        consumer.messages(5).await;
        sent += 5;
        let (_, body) = admin.get("/api/v1/overview", WATCHER).await;
        let rate = |key: &str| body["messages"]["rates"][key].as_f64().unwrap_or(0.0);
        let moving = ["published_per_s", "delivered_per_s", "acknowledged_per_s"]
            .iter()
            .all(|k| rate(k) > 0.0);
        if moving && body["journal"]["sync_latency"]["p50_us"].is_u64() {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rates never moved: {body}"
        );
    };
    let m = &body["messages"];
    // This broker has had no other client: nothing else publishes, and the
    // broker's own messages ($SYS, dead letters) are not counted.
    assert_eq!(m["published_total"], json!(sent), "{body}");
    assert_eq!(m["delivered_total"], json!(sent), "{body}");
    // `ack:auto` settles each delivery as it is sent.
    assert_eq!(m["acknowledged_total"], json!(sent), "{body}");
    let sync = &body["journal"]["sync_latency"];
    let (p50, p99) = (sync["p50_us"].as_u64(), sync["p99_us"].as_u64());
    assert!(
        p50.is_some_and(|p50| p99.is_some_and(|p99| p50 <= p99)),
        "{body}"
    );

    let text = admin.broker.broker.as_ref().expect("running").metrics();
    for series in [
        "\nrosetta_messages_published_total ",
        "\nrosetta_messages_delivered_total ",
        "\nrosetta_messages_acknowledged_total ",
        "\n# TYPE rosetta_journal_sync_seconds histogram\n",
        "\nrosetta_journal_sync_seconds_bucket{le=\"+Inf\"} ",
        "\nrosetta_journal_sync_seconds_count ",
    ] {
        assert!(text.contains(series), "{series}: {text}");
    }
    producer.disconnect().await;
    consumer.disconnect().await;
    admin.stop().await;
}

/// A GET to the admin API at `addr`: the status and the JSON body.
async fn probe(
    addr: std::net::SocketAddr,
    path: &str,
    who: Option<(&str, &str)>,
) -> (StatusCode, Value) {
    let (status, _, body) = request(addr, Method::GET, path, who, &[], None).await;
    (status, body)
}

/// Started before the broker (as `rosetta serve` does, ahead of the
/// journal's recovery), the admin listener answers: `/healthz` 200,
/// `/readyz` and the API 503 with a JSON error, unknown paths 404; once the
/// broker is attached, ready and served.
#[tokio::test]
async fn before_the_broker_is_up_health_answers_and_ready_is_503() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users_file = dir.path().join("users.toml");
    rosetta::users::save_user(
        &users_file,
        ADMIN.0,
        ADMIN.1.as_bytes(),
        None,
        None,
        Some(&[AdminRole::Administrator]),
    )
    .expect("save user");
    let users = rosetta::users::Users::load(&users_file).expect("load users");
    let access = Arc::new(rosetta::access::UsersAccess::new(users, false).expect("access"));
    let mut config = common::test_config(dir.path());
    config.security.users_file = Some(users_file);
    config.admin.listen = Some(ListenAddr::new("127.0.0.1", 0));
    let admin = rosetta::admin::start_early(&config, access.clone())
        .await
        .expect("admin API starts")
        .expect("admin API on");
    let addr = admin.local_addr().expect("admin listener");

    let (status, body) = probe(addr, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = probe(addr, "/readyz", None).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("recover")),
        "{body}"
    );
    let (status, body) = probe(addr, "/api/v1/overview", Some(ADMIN)).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE);
    let (status, body) = probe(addr, "/api/v1/nothing", Some(ADMIN)).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);

    let tweaked = config.clone();
    let broker = TestBroker::start_with(move |c| *c = tweaked, access).await;
    admin.attach(broker.broker.as_ref().expect("running").view());
    let (status, body) = probe(addr, "/readyz", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = probe(addr, "/api/v1/overview", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    admin.shutdown().await;
    broker.stop().await;
}

/// Whether one QoS 1 publish to `topic` is accepted (PUBACK success, or
/// 0x10 no matching subscribers) or refused (0x87 not authorised), by
/// rumqttc over MQTT 5.
async fn publish_accepted(
    c: &v5::AsyncClient,
    ev: &mut rumqttc::v5::EventLoop,
    topic: &str,
) -> bool {
    use rumqttc::v5::mqttbytes::v5::PubAckReason;
    c.publish(
        topic,
        v5::QoS::AtLeastOnce,
        false,
        topic.as_bytes().to_vec(),
    )
    .await
    .expect("publish");
    loop {
        if let Ok(v5::Packet::PubAck(a)) = next5(ev).await {
            return match a.reason {
                PubAckReason::Success | PubAckReason::NoMatchingSubscribers => true,
                PubAckReason::NotAuthorized => false,
                other => panic!("{topic}: PUBACK {other:?}"),
            };
        }
    }
}

/// A defined role through the API: created, listed, given to a user, and
/// changed while the user's MQTT 5 connection stays open; its next publish
/// and subscribe see the change (allowed before, refused after), and so
/// do the user's API requests (the role's admin right). A role users hold
/// cannot be removed.
#[tokio::test]
async fn roles_are_defined_through_the_api_and_bind_live_connections() {
    let admin = Admin::start().await;
    let sensors = r#"{"publish": ["/topic/sensors/#"], "subscribe": ["/topic/sensors/#"],
                      "admin": "monitoring"}"#;
    let (status, _, body) = admin
        .act_on(Method::PUT, "/api/v1/roles/sensors", ADMIN, sensors)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        (&body["builtin"], &body["admin"], &body["publish"]),
        (
            &json!(false),
            &json!("monitoring"),
            &json!(["/topic/sensors/#"])
        ),
        "{body}"
    );
    let (status, _, _) = admin
        .act_on(Method::PUT, "/api/v1/roles/sensors", ADMIN, sensors)
        .await;
    assert_eq!(status, StatusCode::OK, "the second PUT replaces");
    let (status, body) = admin.get("/api/v1/roles?name=sens", WATCHER).await;
    assert_eq!(
        (status, &body["total"]),
        (StatusCode::OK, &json!(1)),
        "{body}"
    );
    assert_eq!(body["items"][0]["name"], "sensors", "{body}");
    let (_, body) = admin.get("/api/v1/roles", WATCHER).await;
    assert_eq!(body["total"], 4, "three built-in, one defined: {body}");

    let new = r#"{"name": "sam", "password": "sam-pw", "roles": ["sensors"]}"#;
    let (status, _, body) = admin
        .act_on(Method::POST, "/api/v1/users", ADMIN, new)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["publish"], json!(["/topic/sensors/#"]), "{body}");
    assert_eq!(body["own"]["publish"], Value::Null, "{body}");
    assert_eq!(body["admin"], "monitoring", "{body}");
    let (status, body) = admin.get("/api/v1/roles/sensors", ADMIN).await;
    assert_eq!((status, &body["users"]), (StatusCode::OK, &json!(["sam"])));
    // The listing names every role's holders as well.
    let (_, body) = admin.get("/api/v1/roles", WATCHER).await;
    let held: Vec<(&Value, &Value)> = body["items"]
        .as_array()
        .map(|items| items.iter().map(|i| (&i["name"], &i["users"])).collect())
        .unwrap_or_default();
    assert!(
        held.contains(&(&json!("sensors"), &json!(["sam"]))),
        "{body}"
    );
    // The role's admin right counts.
    let sam = ("sam", "sam-pw");
    assert_eq!(admin.get("/api/v1/overview", sam).await.0, StatusCode::OK);

    let mut opts = opts5(&admin.broker, "sam-live");
    opts.set_credentials("sam", "sam-pw");
    let (c, mut ev, ack) = connected5(opts).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    let refused = [v5::SubscribeReasonCode::NotAuthorized];
    let granted = [v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)];
    assert!(publish_accepted(&c, &mut ev, "sensors/1").await);
    assert!(!publish_accepted(&c, &mut ev, "other/1").await);
    assert_eq!(subscribe_many5(&c, &mut ev, &["sensors/a"]).await, granted);

    // The role changes: on the same connection, sensors/# is refused now
    // and other/# allowed; the admin right is gone.
    let changed = r#"{"publish": ["/topic/other/#"], "deny_subscribe": ["/topic/sensors/#"]}"#;
    let (status, _, body) = admin
        .act_on(Method::PUT, "/api/v1/roles/sensors", ADMIN, changed)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!publish_accepted(&c, &mut ev, "sensors/1").await);
    assert!(publish_accepted(&c, &mut ev, "other/1").await);
    assert_eq!(subscribe_many5(&c, &mut ev, &["sensors/b"]).await, refused);
    let (status, body) = admin.get("/api/v1/overview", sam).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    let file = std::fs::read_to_string(&admin.users_file).expect("users file");
    assert!(file.contains("[roles.sensors]"), "{file}");
    assert!(file.contains("publish = [\"/topic/other/#\"]"), "{file}");

    // A role held cannot go; once taken from sam (who may then do
    // everything: neither it nor a role says otherwise) it can.
    let (status, _, body) = admin
        .act(Method::DELETE, "/api/v1/roles/sensors", ADMIN)
        .await;
    assert_error(status, &body, StatusCode::CONFLICT);
    assert!(
        body["reason"].as_str().unwrap_or_default().contains("sam"),
        "{body}"
    );
    let (status, _, body) = admin
        .act_on(
            Method::PUT,
            "/api/v1/users/sam/roles",
            ADMIN,
            r#"{"roles": []}"#,
        )
        .await;
    assert_eq!(
        (status, &body["roles"]),
        (StatusCode::OK, &json!([])),
        "{body}"
    );
    assert!(publish_accepted(&c, &mut ev, "sensors/1").await);
    let (status, _, _) = admin
        .act(Method::DELETE, "/api/v1/roles/sensors", ADMIN)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = admin.get("/api/v1/roles/sensors", ADMIN).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, _, body) = admin
        .act(Method::DELETE, "/api/v1/roles/sensors", ADMIN)
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    admin.stop().await;
}

/// What the roles routes refuse: wrong password, a missing admin right,
/// malformed bodies, built-in and unknown roles, unknown users.
#[tokio::test]
async fn the_roles_routes_refuse_what_they_must() {
    let admin = Admin::start().await;
    let ok = r#"{"publish": ["/topic/a/#"]}"#;
    for (who, method, path, body, want) in [
        (
            ("admin", "wrong"),
            Method::PUT,
            "/api/v1/roles/a",
            ok,
            StatusCode::UNAUTHORIZED,
        ),
        (
            MANAGER,
            Method::PUT,
            "/api/v1/roles/a",
            ok,
            StatusCode::FORBIDDEN,
        ),
        (
            WATCHER,
            Method::GET,
            "/api/v1/roles/monitoring",
            "",
            StatusCode::FORBIDDEN,
        ),
        (
            MANAGER,
            Method::DELETE,
            "/api/v1/roles/a",
            "",
            StatusCode::FORBIDDEN,
        ),
        (
            MANAGER,
            Method::PUT,
            "/api/v1/users/plain/roles",
            r#"{"roles": []}"#,
            StatusCode::FORBIDDEN,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/roles/a",
            "{\"publish\": [",
            StatusCode::BAD_REQUEST,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/roles/a",
            "",
            StatusCode::BAD_REQUEST,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/roles/a",
            r#"{"allow": []}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/roles/a",
            r#"{"publish": ["no-slash"]}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/roles/a",
            r#"{"admin": "root"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/roles/a%2Eb",
            ok,
            StatusCode::BAD_REQUEST,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/roles/monitoring",
            ok,
            StatusCode::CONFLICT,
        ),
        (
            ADMIN,
            Method::DELETE,
            "/api/v1/roles/administrator",
            "",
            StatusCode::CONFLICT,
        ),
        (
            ADMIN,
            Method::GET,
            "/api/v1/roles/ghost",
            "",
            StatusCode::NOT_FOUND,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/users/plain/roles",
            r#"{"roles": ["ghost"]}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/users/plain/roles",
            r#"{"role": []}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            ADMIN,
            Method::PUT,
            "/api/v1/users/nobody/roles",
            r#"{"roles": []}"#,
            StatusCode::NOT_FOUND,
        ),
    ] {
        let body = (!body.is_empty()).then_some(body);
        let (status, _, answer) = admin.call(method.clone(), path, Some(who), &[], body).await;
        assert_error(status, &answer, want);
        assert_eq!(status, want, "{method} {path}: {answer}");
    }
    // None of it reached the file.
    let file = std::fs::read_to_string(&admin.users_file).expect("users file");
    assert!(!file.contains("[roles"), "{file}");
    // A built-in role is shown, and its holders with it.
    let (status, body) = admin.get("/api/v1/roles/monitoring", ADMIN).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["builtin"], &body["users"]),
        (&json!(true), &json!(["watcher"]))
    );
    admin.stop().await;
}

/// `rate * window_s`: what flowed in the window, back from a rate (both
/// are rounded to three decimals, so within a hundredth).
fn flowed(rates: &Value, key: &str) -> f64 {
    let window = rates["window_s"].as_f64().unwrap_or_default();
    rates[key].as_f64().unwrap_or(f64::NAN) * window
}

/// Each queue shown carries rates from its own counters, sampled by the
/// requests that show it: the first look measures from when the counters
/// started (the broker's start), later looks from earlier looks, and once
/// messages flowed the rates times the window are exactly what flowed
/// through that queue and no other.
#[tokio::test]
async fn queues_carry_their_own_rates() {
    let admin = Admin::start().await;
    let (status, _, _) = admin
        .act(Method::PUT, "/api/v1/queues/flow-idle", MANAGER)
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let creds = [("login", ADMIN.0), ("passcode", ADMIN.1)];
    let mut producer = StompClient::connect(admin.broker.stomp(), &creds).await;
    let mut consumer = StompClient::connect(admin.broker.stomp(), &creds).await;
    consumer.subscribe("s", "/queue/flow", "auto", &[]).await;
    let (status, body) = admin.get("/api/v1/queues/flow", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["rates"]["window_s"].as_f64().is_some_and(|w| w > 0.0),
        "the first look measures since the start: {body}"
    );
    for key in ["published_per_s", "delivered_per_s", "acknowledged_per_s"] {
        assert_eq!(body["rates"][key], json!(0.0), "the first look: {body}");
    }
    let (_, listing) = admin.get("/api/v1/queues?name=flow", WATCHER).await;
    assert_eq!(listing["total"], json!(2), "{listing}");

    producer.send_numbered("/queue/flow", 6).await;
    consumer.messages(6).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (_, listing) = admin.get("/api/v1/queues?name=flow", WATCHER).await;
    let items = listing["items"].as_array().expect("items");
    let (flow, idle) = (&items[0]["rates"], &items[1]["rates"]);
    assert_eq!(items[0]["name"], "flow", "{listing}");
    assert!(
        flow["window_s"].as_f64().is_some_and(|w| w >= 1.0),
        "{listing}"
    );
    for key in ["published_per_s", "delivered_per_s", "acknowledged_per_s"] {
        assert!((flowed(flow, key) - 6.0).abs() < 0.01, "{key}: {listing}");
        assert_eq!(idle[key], json!(0.0), "{key}: {listing}");
    }
    assert!(
        idle["window_s"].as_f64().is_some_and(|w| w >= 1.0),
        "{listing}"
    );
    // `GET` of one queue samples the same ring.
    let (_, body) = admin.get("/api/v1/queues/flow", WATCHER).await;
    assert!(
        (flowed(&body["rates"], "published_per_s") - 6.0).abs() < 0.01,
        "{body}"
    );
    producer.disconnect().await;
    consumer.disconnect().await;
    admin.stop().await;
}

/// A queue filled before anyone looked at it shows a rate at its first
/// look: its counters count from the broker's start, and the first look
/// measures from there (a script that publishes and then asks once sees
/// what flowed).
#[tokio::test]
async fn a_first_look_at_a_queue_shows_what_flowed_since_the_start() {
    let admin = Admin::start().await;
    let creds = [("login", ADMIN.0), ("passcode", ADMIN.1)];
    let mut producer = StompClient::connect(admin.broker.stomp(), &creds).await;
    producer.send_numbered("/queue/first-look", 8).await;
    let (status, body) = admin.get("/api/v1/queues/first-look", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["rates"]["published_per_s"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{body}"
    );
    // The window is rounded to the millisecond, and may be only a few
    // of them here: within half a message.
    assert!(
        (flowed(&body["rates"], "published_per_s") - 8.0).abs() < 0.5,
        "{body}"
    );
    assert_eq!(body["rates"]["delivered_per_s"], json!(0.0), "{body}");
    producer.disconnect().await;
    admin.stop().await;
}

/// The connection listed by `name` (its user here).
async fn connection_row(admin: &Admin, user: &str) -> Value {
    let (status, body) = admin
        .get(&format!("/api/v1/connections?name={user}"), WATCHER)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["total"], json!(1), "{body}");
    body["items"][0].clone()
}

/// Each connection shown carries its messages in (publishes accepted) and
/// out (deliveries) and their rates: a producer's are all in, a
/// consumer's all out, over MQTT and STOMP alike.
#[tokio::test]
async fn connections_carry_their_message_counts_and_rates() {
    let admin = Admin::start().await;
    let mut producer = StompClient::connect(
        admin.broker.stomp(),
        &[("login", MANAGER.0), ("passcode", MANAGER.1)],
    )
    .await;
    let (client, mut events) =
        connected5_as(&admin.broker, "rates-consumer", WATCHER.0, WATCHER.1).await;
    subscribe_many5(&client, &mut events, &["flow/t"]).await;
    for user in [MANAGER.0, WATCHER.0] {
        let row = connection_row(&admin, user).await;
        assert_eq!(
            (
                &row["messages_in"],
                &row["messages_out"],
                &row["rates"]["messages_in_per_s"],
                &row["rates"]["messages_out_per_s"]
            ),
            (&json!(0), &json!(0), &json!(0.0), &json!(0.0)),
            "{row}"
        );
    }
    for i in 0..5 {
        producer
            .send_persistent("/topic/flow/t", &[], format!("m{i}").as_bytes())
            .await;
    }
    for _ in 0..5 {
        publish5(&mut events).await;
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let row = connection_row(&admin, MANAGER.0).await;
    assert_eq!(
        (&row["protocol"], &row["messages_in"], &row["messages_out"]),
        (&json!("stomp"), &json!(5), &json!(0)),
        "{row}"
    );
    assert!(
        (flowed(&row["rates"], "messages_in_per_s") - 5.0).abs() < 0.01,
        "{row}"
    );
    assert_eq!(row["rates"]["messages_out_per_s"], json!(0.0), "{row}");
    let row = connection_row(&admin, WATCHER.0).await;
    assert_eq!(
        (&row["protocol"], &row["messages_in"], &row["messages_out"]),
        (&json!("mqtt"), &json!(0), &json!(5)),
        "{row}"
    );
    assert!(
        (flowed(&row["rates"], "messages_out_per_s") - 5.0).abs() < 0.01,
        "{row}"
    );
    producer.disconnect().await;
    admin.stop().await;
}

/// With `[admin] on_http_port`, the WebSocket (HTTP) port serves the API,
/// its health checks and the console too, through the same
/// authentication and roles, request bodies included; the port's own
/// paths (the demo page, WebSocket paths) stay its own. Without it, those
/// paths are the port's 404.
#[tokio::test]
async fn the_api_is_served_on_the_http_port_when_configured() {
    let admin = Admin::start_tweaked(|c| {
        c.listeners.websocket = Some(ListenAddr::new("127.0.0.1", 0));
        c.admin.on_http_port = true;
    })
    .await;
    let http = admin.broker.addr(rosetta::config::ListenerKind::WebSocket);
    for path in ["/healthz", "/readyz"] {
        let (status, body) = probe(http, path, None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let (status, body) = probe(http, "/api/v1/overview", Some(WATCHER)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["queues"]["count"].is_u64(), "{body}");
    let (status, headers, body) =
        request(http, Method::GET, "/api/v1/overview", None, &[], None).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED);
    assert_eq!(headers["www-authenticate"], "Basic realm=\"rosetta\"");
    let (status, body) = probe(http, "/api/v1/users", Some(WATCHER)).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    let (status, _, body) = request(
        http,
        Method::PUT,
        "/api/v1/queues/via-http-port",
        Some(MANAGER),
        &[],
        Some("{\"durable\": false}"),
    )
    .await;
    assert_eq!(
        (status, &body["durable"]),
        (StatusCode::CREATED, &json!(false)),
        "{body}"
    );
    let page = raw_get(http, "/console/").await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("content-security-policy"), "{page}");
    assert!(page.contains("<script src=\"app.js\""), "{page}");
    let demo = raw_get(http, "/").await;
    assert!(
        demo.starts_with("HTTP/1.1 200"),
        "the demo page stays: {demo}"
    );
    assert!(demo.contains("mqtt.min.js"), "{demo}");
    let ws_path = raw_get(http, "/mqtt").await;
    assert!(ws_path.starts_with("HTTP/1.1 426"), "{ws_path}");
    admin.stop().await;

    let plain = Admin::start_tweaked(|c| {
        c.listeners.websocket = Some(ListenAddr::new("127.0.0.1", 0));
    })
    .await;
    let http = plain.broker.addr(rosetta::config::ListenerKind::WebSocket);
    for path in ["/api/v1/overview", "/healthz", "/console/"] {
        let answer = raw_get(http, path).await;
        assert!(answer.starts_with("HTTP/1.1 404"), "{path}: {answer}");
    }
    plain.stop().await;
}

/// An MQTT 3.1.1 CONNECT of `client_id` with a user and password, clean
/// session, keep-alive 60 s.
fn mqtt311_connect(client_id: &str, user: &str, password: &str) -> Vec<u8> {
    let field = |s: &str| {
        let mut f = (s.len() as u16).to_be_bytes().to_vec();
        f.extend_from_slice(s.as_bytes());
        f
    };
    let mut rest = field("MQTT");
    rest.extend_from_slice(&[4, 0xC2, 0, 60]);
    for s in [client_id, user, password] {
        rest.extend(field(s));
    }
    assert!(rest.len() < 128, "one length byte");
    let mut packet = vec![0x10, rest.len() as u8];
    packet.extend(rest);
    packet
}

/// The overview counts open connections by protocol and by transport
/// (MQTT over TCP and over WebSocket, STOMP over TCP), and memory in use
/// once a queue holds a message.
#[tokio::test]
async fn the_overview_counts_connections_by_protocol_and_transport_and_memory_in_use() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let admin = Admin::start_tweaked(|c| {
        c.listeners.websocket = Some(ListenAddr::new("127.0.0.1", 0));
    })
    .await;
    let (_, body) = admin.get("/api/v1/overview", WATCHER).await;
    assert_eq!(body["connections"]["by_protocol"], json!({}), "{body}");
    assert_eq!(body["memory"]["used_bytes"], json!(0), "{body}");

    let (_mqtt_tcp, _ev) = connected5_as(&admin.broker, "by-tcp", ADMIN.0, ADMIN.1).await;
    let ws_port = admin.broker.addr(rosetta::config::ListenerKind::WebSocket);
    let tcp = tokio::net::TcpStream::connect(ws_port)
        .await
        .expect("connect");
    let wire = common::ws::Wire::Ws {
        path: "/mqtt",
        subprotocol: "mqtt",
        text: false,
    };
    let mut mqtt_ws = common::ws::carry(tcp, wire).await;
    mqtt_ws
        .write_all(&mqtt311_connect("by-ws", ADMIN.0, ADMIN.1))
        .await
        .expect("CONNECT");
    let mut connack = [0u8; 4];
    tokio::time::timeout(WAIT, mqtt_ws.read_exact(&mut connack))
        .await
        .expect("CONNACK in time")
        .expect("CONNACK");
    assert_eq!(connack, [0x20, 2, 0, 0], "accepted");
    let mut stomp = StompClient::connect(
        admin.broker.stomp(),
        &[("login", ADMIN.0), ("passcode", ADMIN.1)],
    )
    .await;
    stomp
        .send_persistent("/queue/held", &[], &[7u8; 4096])
        .await;

    let (status, body) = admin.get("/api/v1/overview", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let c = &body["connections"];
    assert_eq!(c["by_protocol"], json!({"mqtt": 2, "stomp": 1}), "{body}");
    assert_eq!(c["by_transport"], json!({"tcp": 2, "ws": 1}), "{body}");
    assert_eq!(
        (&c["open"], &c["authenticated"]),
        (&json!(3), &json!(3)),
        "{body}"
    );
    assert_eq!(
        body["listeners"]["websocket"],
        json!(ws_port.to_string()),
        "{body}"
    );
    assert_eq!(
        body["listeners"]["stomp"],
        json!(admin.broker.stomp().to_string()),
        "{body}"
    );
    let used = body["memory"]["used_bytes"].as_u64().unwrap_or_default();
    assert!(used >= 4096, "a 4 KiB message is held: {body}");
    stomp.disconnect().await;
    admin.stop().await;
}

/// A permission change through the API binds STOMP and AMQP connections
/// already open at their next operation, as it binds MQTT 5's (above):
/// what was allowed before the change is refused after it, on the same
/// connections, each in its protocol's way.
#[tokio::test]
async fn permission_changes_bind_live_stomp_and_amqp_connections() {
    use fe2o3_amqp::{Connection, Receiver, Sender, Session};
    let admin = Admin::start().await;
    let new = r#"{"name": "eve", "password": "eve-pw"}"#;
    let (status, _, body) = admin
        .act_on(Method::POST, "/api/v1/users", ADMIN, new)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // Before: everything allowed, on two STOMP connections and one AMQP.
    let creds = [("login", "eve"), ("passcode", "eve-pw")];
    let (mut sender, _) = StompClient::connect_version(admin.broker.stomp(), "1.2", &creds).await;
    let (mut reader, _) = StompClient::connect_version(admin.broker.stomp(), "1.2", &creds).await;
    sender.send_persistent("/queue/audit", &[], b"before").await;
    reader.subscribe("a", "/topic/other/a", "auto", &[]).await;
    let mut conn = Connection::builder()
        .container_id("eve-live")
        .sasl_profile(fe2o3_amqp::sasl_profile::SaslProfile::Plain {
            username: "eve".to_owned(),
            password: "eve-pw".to_owned(),
        })
        .open(common::amqp::url(&admin.broker).as_str())
        .await
        .expect("eve logs in over AMQP");
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let mut link = Sender::attach(&mut session, "s-audit", "/queue/audit")
        .await
        .expect("attach before the change");
    link.send("before")
        .await
        .expect("accepted before the change");
    link.close().await.expect("close");

    let change = r#"{"deny_publish": ["/queue/audit"], "deny_subscribe": ["/topic/other/#"]}"#;
    let (status, _, body) = admin
        .act_on(Method::PUT, "/api/v1/users/eve/permissions", ADMIN, change)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // STOMP: a SEND, and a SUBSCRIBE on the other connection, each an ERROR.
    sender
        .send_frame(
            "SEND",
            &[("destination", "/queue/audit"), ("receipt", "r-after")],
            b"after",
        )
        .await;
    let err = sender.expect_error_then_close().await;
    assert_eq!(err.header("receipt-id"), Some("r-after"), "{err:?}");
    reader
        .send_frame(
            "SUBSCRIBE",
            &[
                ("id", "b"),
                ("destination", "/topic/other/b"),
                ("receipt", "r-sub"),
            ],
            b"",
        )
        .await;
    let err = reader.expect_error_then_close().await;
    assert_eq!(err.header("message"), Some("not authorized"), "{err:?}");
    // AMQP, the same session: attaches to what is now denied are refused.
    let e = Sender::attach(&mut session, "s-audit-2", "/queue/audit")
        .await
        .expect_err("sender attach after the change");
    assert!(format!("{e:?}").contains("UnauthorizedAccess"), "{e:?}");
    // fe2o3 reuses the refused link's handle at once (tests/deny_rules.rs).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = Receiver::attach(&mut session, "r-other", "/topic/other/c")
        .await
        .expect_err("receiver attach after the change");
    assert!(format!("{e:?}").contains("UnauthorizedAccess"), "{e:?}");
    assert_eq!(
        admin.broker.depth("audit").0,
        2,
        "the two messages sent before the change, none after"
    );
    let _ = session.end().await;
    let _ = conn.close().await;
    admin.stop().await;
}

/// `POST /api/v1/reload` with a users file that does not load: 409 naming
/// the file's error, and the users in force stay: old logins still work,
/// over the protocols and the API.
#[tokio::test]
async fn a_reload_of_a_broken_users_file_is_refused_and_the_old_users_stay() {
    let admin = Admin::start().await;
    let good = std::fs::read_to_string(&admin.users_file).expect("users file");
    std::fs::write(&admin.users_file, format!("{good}\n[users.broken\n")).expect("break it");
    let (status, _, body) = admin.act(Method::POST, "/api/v1/reload", ADMIN).await;
    assert_error(status, &body, StatusCode::CONFLICT);
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("users file"), "{body}");
    assert!(reason.contains("users.toml"), "names the file: {body}");
    assert!(reason.contains("what was in force stays"), "{body}");

    let mut stomp = StompClient::connect(
        admin.broker.stomp(),
        &[("login", MANAGER.0), ("passcode", MANAGER.1)],
    )
    .await;
    stomp.send_persistent("/queue/still", &[], b"in").await;
    stomp.disconnect().await;
    let (_c, _ev) = connected5_as(&admin.broker, "still-mqtt", PLAIN.0, PLAIN.1).await;
    let (status, body) = admin.get("/api/v1/queues/still", WATCHER).await;
    assert_eq!(
        (status, &body["depth"]),
        (StatusCode::OK, &json!(1)),
        "{body}"
    );

    // Mended, the next reload takes it.
    std::fs::write(&admin.users_file, good).expect("mend it");
    let (status, _, body) = admin.act(Method::POST, "/api/v1/reload", ADMIN).await;
    assert_eq!(
        (status, &body["users"]),
        (StatusCode::OK, &json!(4)),
        "{body}"
    );
    admin.stop().await;
}

/// `/api/v1/streams`: a stream's offsets, size and readers, a consumer
/// group's committed offset and lag (also in `/metrics`), a partitioned
/// stream as its logs, and the figures again after a restart (the log
/// opened by the listing, the group's offset from the journal).
#[tokio::test]
async fn streams_show_their_offsets_size_readers_and_each_groups_lag() {
    let mut admin = Admin::start_tweaked(|c| {
        c.streams.push(rosetta::config::StreamEntry {
            name: Some("orders".into()),
            partitions: Some(2),
            ..rosetta::config::StreamEntry::default()
        })
    })
    .await;
    let creds = [("login", ADMIN.0), ("passcode", ADMIN.1)];
    let mut producer = StompClient::connect(admin.broker.stomp(), &creds).await;
    for i in 0..5 {
        producer
            .send_persistent(
                "/queue/events",
                &[("x-queue-type", "stream")],
                format!("e{i}").as_bytes(),
            )
            .await;
    }
    // A group reads all five and acknowledges (with receipts) the first two.
    let mut reader = StompClient::connect(admin.broker.stomp(), &creds).await;
    reader
        .subscribe(
            "g",
            "/queue/events",
            "client-individual",
            &[("x-stream-group", "billing"), ("x-stream-offset", "first")],
        )
        .await;
    let got = reader.messages(5).await;
    for m in &got[..2] {
        reader.ack(m).await;
    }
    let (status, body) = admin.get("/api/v1/streams/events", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for (key, want) in [
        ("first_offset", json!(0)),
        ("next_offset", json!(5)),
        ("messages", json!(5)),
        ("readers", json!(1)),
        ("partition_of", Value::Null),
        (
            "groups",
            json!([{"name": "billing", "committed_offset": 2, "lag": 3}]),
        ),
    ] {
        assert_eq!(body[key], want, "{key}: {body}");
    }
    assert!(body["bytes"].as_u64().is_some_and(|b| b > 5 * 2), "{body}");
    let text = admin.broker.broker.as_ref().expect("running").metrics();
    for line in [
        "rosetta_stream_messages{stream=\"events\"} 5\n",
        "rosetta_stream_readers{stream=\"events\"} 1\n",
        "rosetta_stream_group_committed_offset{stream=\"events\",group=\"billing\"} 2\n",
        "rosetta_stream_group_lag{stream=\"events\",group=\"billing\"} 3\n",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }

    // A configured partitioned stream: no logs until used, then one each.
    let (_, body) = admin.get("/api/v1/streams/orders", WATCHER).await;
    assert_eq!(body["partitions"], json!(2), "{body}");
    assert_eq!(body["logs"], json!([null, null]), "{body}");
    producer.send_persistent("/queue/orders", &[], b"o0").await;
    let (_, body) = admin.get("/api/v1/streams/orders", WATCHER).await;
    assert_eq!(body["messages"], json!(1), "{body}");
    let logs = body["logs"].as_array().expect("logs");
    assert!(logs.iter().all(|l| l["partition_of"] == "orders"), "{body}");
    let (status, listing) = admin.get("/api/v1/streams", WATCHER).await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    let names: Vec<&str> = listing["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names, ["events", "orders-0", "orders-1"], "{listing}");
    assert_eq!(listing["total"], json!(3), "{listing}");
    let (status, body) = admin.get("/api/v1/streams/nothing", WATCHER).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, body) = admin.get("/api/v1/streams", PLAIN).await;
    assert_error(status, &body, StatusCode::FORBIDDEN);

    reader.disconnect().await;
    producer.disconnect().await;
    admin.restart().await;
    // After a restart no log is open until used; the listing opens its page's.
    let text = admin.broker.broker.as_ref().expect("running").metrics();
    assert!(
        !text.contains("rosetta_stream_messages{stream=\"events\"}"),
        "{text}"
    );
    let (_, listing) = admin.get("/api/v1/streams?name=events", WATCHER).await;
    let events = &listing["items"][0];
    assert_eq!(events["messages"], json!(5), "{listing}");
    assert_eq!(events["readers"], json!(0), "{listing}");
    assert_eq!(
        events["groups"],
        json!([{"name": "billing", "committed_offset": 2, "lag": 3}]),
        "{listing}"
    );
    admin.stop().await;
}
