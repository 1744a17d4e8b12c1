//! A peer's bytes against the admin HTTP API (`src/admin`): hyper's
//! HTTP/1.1 framing, the router, authentication (basic and bearer), the
//! query and JSON body decoders and every handler, answered by a broker
//! running in this process, over a real loopback socket.
//!
//! The first byte picks the mode:
//! - raw: the rest is the whole connection (any number of requests).
//! - routed: the rest picks a route of `router::ROUTES`, credentials
//!   (none, right, wrong, malformed), a name for its `{param}` from a small
//!   set or from the input, a query, and a body, and is sent as one
//!   well-framed request, so that most inputs reach a handler.
//! - oversized: a routed request declaring a body over
//!   `REQUEST_BODY_MAX_BYTES`, of which only the input's bytes are sent.
//!
//! Oracles: no panic anywhere in the broker (libFuzzer aborts on any
//! thread's panic); the connection answers and closes within a deadline;
//! everything that comes back is a sequence of well-formed HTTP/1.1
//! responses with exact bodies; an API answer is JSON, and a refusal
//! carries `error` and `reason`; a bare answer without a JSON body is one
//! of hyper's own framing refusals (400, 431, 505); no 500; an oversized
//! body is refused with 413 without waiting for it.
//!
//! The authenticated user holds `management`: it reaches every queue,
//! connection and session route, but cannot change the users file, so no
//! input locks the next ones out. Names come mostly from a small set, so
//! a long run does not fill the broker with queues.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rosetta::admin::router::ROUTES;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const USER: &str = "fuzz";
const PASSWORD: &str = "fuzz-pw";
/// The API's request body limit (`src/admin/http.rs`).
const REQUEST_BODY_MAX_BYTES: usize = 64 * 1024;
/// How long one connection may take to answer and close: far above what
/// loopback and an idle broker need, so only a hang trips it.
const ANSWER_DEADLINE: Duration = Duration::from_secs(10);
/// Statuses hyper answers by itself, with no body, for bytes that are
/// not a request it can route.
const FRAMING_REFUSALS: [u16; 3] = [400, 431, 505];
/// Names a routed request puts in `{param}` (plus one from the input now
/// and then).
const NAMES: [&str; 6] = ["q", "orders", "%24durable%2Fq", "fuzz", "missing", "1"];

struct Harness {
    runtime: tokio::runtime::Runtime,
    addr: SocketAddr,
    /// Kept for the process's life: the broker and its API.
    _running: (rosetta::server::RunningBroker, rosetta::admin::AdminServer),
    _dir: tempfile::TempDir,
}

/// An argon2id hash of `PASSWORD` with the smallest parameters: a wrong
/// password costs microseconds instead of the default's milliseconds, and
/// verification reads the parameters from the hash.
fn cheap_hash() -> String {
    use argon2::password_hash::{PasswordHasher, SaltString};
    let params = argon2::Params::new(8, 1, 1, None).expect("argon2 params");
    let hasher = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let salt = SaltString::encode_b64(b"rosetta-fuzz-salt").expect("salt");
    hasher
        .hash_password(PASSWORD.as_bytes(), &salt)
        .expect("hash")
        .to_string()
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let users_file = dir.path().join("users.toml");
        std::fs::write(
            &users_file,
            format!(
                "[users.{USER}]\npassword_hash = \"{}\"\nroles = [\"management\"]\n",
                cheap_hash()
            ),
        )
        .expect("users file");
        let mut config = rosetta::config::Config {
            data_dir: dir.path().join("data"),
            ..rosetta::config::Config::default()
        };
        let loopback = || Some(rosetta::config::ListenAddr::new("127.0.0.1", 0));
        config.listeners.mqtt = loopback();
        config.listeners.stomp = None;
        config.listeners.amqp = None;
        config.listeners.websocket = None;
        config.listeners.mqtts = None;
        config.listeners.stomps = None;
        config.listeners.amqps = None;
        config.listeners.wss = None;
        config.listeners.any = None;
        config.sys.interval_s = 0;
        config.security.users_file = Some(users_file.clone());
        config.admin.listen = loopback();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (broker, admin) = runtime.block_on(async {
            let users = rosetta::users::Users::load(&users_file).expect("users load");
            let access = Arc::new(rosetta::access::UsersAccess::new(users, true).expect("access"));
            let broker = rosetta::server::start(config, access.clone())
                .await
                .expect("broker starts");
            let admin = rosetta::admin::start(broker.view(), access)
                .await
                .expect("admin API starts")
                .expect("admin API on");
            (broker, admin)
        });
        Harness {
            addr: admin.local_addr().expect("admin listener"),
            runtime,
            _running: (broker, admin),
            _dir: dir,
        }
    })
}

/// Sends `writes` in turn (each flushed: loopback with no delay sends
/// each as it is written), half-closes, and reads until the API closes.
async fn exchange(addr: SocketAddr, writes: &[&[u8]]) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut answer = Vec::new();
    for w in writes {
        // The API may close early (a refusal): later writes then fail,
        // and what it answered is still read below.
        if stream.write_all(w).await.is_err() {
            break;
        }
    }
    let _ = stream.shutdown().await;
    let _ = stream.read_to_end(&mut answer).await;
    answer
}

/// One response parsed off the front of `bytes`: status, whether it is
/// JSON, its body, and the bytes after it.
struct Parsed<'a> {
    status: u16,
    json: bool,
    body: &'a [u8],
    rest: &'a [u8],
}

fn parse(bytes: &[u8]) -> Parsed<'_> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!(
            "not a complete HTTP response ({other:?}): {:?}",
            String::from_utf8_lossy(bytes)
        ),
    };
    // hyper answers an HTTP/1.0 request in HTTP/1.0.
    assert!(matches!(response.version, Some(0 | 1)), "not HTTP/1.x");
    let status = response.code.expect("a status");
    let header = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
    };
    assert!(
        header("transfer-encoding").is_none(),
        "the API sends whole bodies"
    );
    let length: usize =
        header("content-length").map_or(0, |v| v.trim().parse().expect("a numeric content-length"));
    let rest = &bytes[head..];
    assert!(
        rest.len() >= length,
        "a body shorter than its content-length"
    );
    Parsed {
        status,
        json: header("content-type").is_some_and(|t| t.starts_with("application/json")),
        body: &rest[..length],
        rest: &rest[length..],
    }
}

/// Checks every response in `answer`; their statuses.
fn check(answer: &[u8]) -> Vec<u16> {
    let mut statuses = Vec::new();
    let mut rest = answer;
    while !rest.is_empty() {
        let r = parse(rest);
        assert_ne!(
            r.status,
            500,
            "an internal error: {:?}",
            String::from_utf8_lossy(r.body)
        );
        if r.json {
            let value: serde_json::Value = serde_json::from_slice(r.body).expect("a JSON body");
            if r.status >= 400 {
                assert!(
                    value["error"].is_string() && value["reason"].is_string(),
                    "a refusal without error and reason: {value}"
                );
            }
        } else if r.status >= 400 {
            assert!(
                FRAMING_REFUSALS.contains(&r.status) && r.body.is_empty(),
                "a {} refusal that is not JSON: {:?}",
                r.status,
                String::from_utf8_lossy(r.body)
            );
        }
        statuses.push(r.status);
        rest = r.rest;
    }
    statuses
}

/// Percent-encodes what a path segment or query cannot hold as it is.
fn escape(bytes: &[u8]) -> String {
    let mut out = String::new();
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~=&%".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn basic(user: &str, password: &str) -> String {
    use base64ct::Encoding;
    format!(
        "Basic {}",
        base64ct::Base64::encode_string(format!("{user}:{password}").as_bytes())
    )
}

/// A well-framed request from `input`: `(head, body)`; `declared` is the
/// body length the head states when it is not the body's own.
fn routed(input: &[u8], declared: Option<usize>) -> (Vec<u8>, Vec<u8>) {
    let byte = |i: usize| input.get(i).copied().unwrap_or(0);
    let route = &ROUTES[usize::from(byte(0)) % ROUTES.len()];
    let credentials = byte(1);
    let name_len = usize::from(byte(2) % 16);
    let query_len = usize::from(byte(3) % 32);
    let rest = input.get(4..).unwrap_or_default();
    let (name_bytes, rest) = rest.split_at(name_len.min(rest.len()));
    let (query, body) = rest.split_at(query_len.min(rest.len()));
    let name = if byte(2) & 0x80 != 0 {
        escape(name_bytes)
    } else {
        NAMES[usize::from(byte(2)) % NAMES.len()].to_owned()
    };
    let mut path = String::new();
    for segment in route.path.split('/').skip(1) {
        path.push('/');
        if segment.starts_with('{') {
            path.push_str(&name);
        } else {
            path.push_str(segment);
        }
    }
    if !query.is_empty() {
        path.push('?');
        path.push_str(&escape(query));
    }
    let mut head = format!("{} {path} HTTP/1.1\r\nHost: fuzz\r\n", route.method);
    match credentials % 5 {
        0 => {}
        1 => head.push_str(&format!("Authorization: {}\r\n", basic(USER, PASSWORD))),
        2 => head.push_str(&format!("Authorization: {}\r\n", basic(USER, "wrong"))),
        3 => head.push_str("Authorization: Bearer not-a-token\r\n"),
        _ => head.push_str("Authorization: Basic !!!\r\n"),
    }
    if credentials & 0x80 != 0 {
        head.push_str("X-Requested-With: XMLHttpRequest\r\nX-Reason: fuzz\r\n");
    }
    if !body.is_empty() || declared.is_some() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!(
        "Content-Length: {}\r\n\r\n",
        declared.unwrap_or(body.len())
    ));
    (head.into_bytes(), body.to_vec())
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let h = harness();
    let run = |writes: &[&[u8]]| {
        h.runtime.block_on(async {
            tokio::time::timeout(ANSWER_DEADLINE, exchange(h.addr, writes))
                .await
                .expect("the API neither answered nor closed in time")
        })
    };
    match mode % 3 {
        0 => {
            // Split where the input says, to vary hyper's reads.
            let at = usize::from(mode >> 2) * rest.len() / 64;
            let (a, b) = rest.split_at(at.min(rest.len()));
            check(&run(&[a, b]));
        }
        1 => {
            let (head, body) = routed(rest, None);
            let statuses = check(&run(&[&head, &body]));
            assert_eq!(statuses.len(), 1, "one request, {statuses:?} answers");
        }
        _ => {
            let over = REQUEST_BODY_MAX_BYTES + 1 + usize::from(mode);
            let mut input = rest.to_vec();
            // Valid credentials and a route that takes a body, so that the
            // limit, not authentication, decides.
            if input.len() < 2 {
                input.resize(2, 0);
            }
            input[1] = 1;
            let (head, body) = routed(&input, Some(over));
            let statuses = check(&run(&[&head, &body]));
            // Every API request's body is read, bounded, before routing or
            // authentication looks at it (`src/admin/http.rs`): whatever
            // the route, the answer is 413, and it comes while most of the
            // declared body was never sent (the deadline above).
            assert_eq!(
                statuses.first(),
                Some(&413),
                "a body over the limit: {statuses:?} to {}",
                String::from_utf8_lossy(&head)
            );
        }
    }
});
