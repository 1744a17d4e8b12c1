//! `rosetta pub` and `rosetta sub` (src/client_cli/): the built binary
//! against a broker started by the test, over real sockets. Each test
//! publishes over one protocol and receives over another, since trying any
//! pair is what the commands are for; the refusals (wrong password, nothing
//! listening) must exit non-zero with a message that says why.

mod common;

use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::pki::Pki;
use common::{users_file_access, Account, TestBroker};
use rosetta::config::{ListenAddr, ListenerKind};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const USER: &str = "alice";
const PASSWORD: &str = "s3cret";
/// May only subscribe to `/queue/bob` (and publish there).
const LIMITED: &str = "bob";
const ONLY_BOB: &[&str] = &["/queue/bob"];
/// Longest a command may take: a hung one fails the test instead of
/// hanging it.
const COMMAND_WAIT: Duration = Duration::from_secs(30);

fn any_port() -> Option<ListenAddr> {
    Some(ListenAddr::new("127.0.0.1", 0))
}

/// A broker and the test PKI its TLS listeners use (in `_dir`).
struct Setup {
    broker: TestBroker,
    pki: Pki,
    _dir: tempfile::TempDir,
}

/// Logins required (no anonymous access); every listener a URL scheme can
/// name, TLS ones with certificates from a fresh test PKI.
async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(&pki, dir.path()).await;
    Setup {
        broker,
        pki,
        _dir: dir,
    }
}

async fn broker(pki: &Pki, dir: &std::path::Path) -> TestBroker {
    let access = users_file_access(
        dir,
        false,
        &[
            Account::unrestricted(USER, PASSWORD.as_bytes()),
            Account::limited(LIMITED, PASSWORD.as_bytes(), ONLY_BOB, ONLY_BOB),
        ],
    );
    let tls = pki.tls_config(false);
    TestBroker::start_with(
        move |c| {
            c.security.anonymous = false;
            c.listeners.websocket = any_port();
            c.listeners.wss = any_port();
            c.listeners.mqtts = any_port();
            c.listeners.stomps = any_port();
            c.listeners.amqps = any_port();
            c.tls = tls;
        },
        Arc::clone(&access),
    )
    .await
}

/// The URL of `scheme` on the broker's listener `kind`, logged in as
/// `password`, with `path` (for ws: `/mqtt` and the address).
fn url(
    broker: &TestBroker,
    scheme: &str,
    kind: ListenerKind,
    password: &str,
    path: &str,
) -> String {
    let port = broker.addr(kind).port();
    // TLS certificates of the test PKI name `localhost`.
    format!("{scheme}://{USER}:{password}@localhost:{port}{path}")
}

fn rosetta(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rosetta"));
    command
        .args(args)
        .env_remove("ROSETTA_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs a command to its end.
async fn run(args: &[&str]) -> Output {
    let child = rosetta(args).spawn().expect("the binary starts");
    finish(child).await
}

async fn finish(child: Child) -> Output {
    tokio::time::timeout(COMMAND_WAIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("rosetta did not finish within {COMMAND_WAIT:?}"))
        .expect("wait for rosetta")
}

/// A `sub` that has told (on standard error) that the broker confirmed its
/// subscription, so that what is published next reaches it; its stderr so
/// far is kept for the assertions.
async fn subscribed(args: &[&str]) -> (Child, String) {
    let mut child = rosetta(args).spawn().expect("the binary starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = String::new();
    let wait = tokio::time::timeout(COMMAND_WAIT, async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            seen.push_str(&line);
            seen.push('\n');
            if line.starts_with("subscribed to ") {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(wait, Ok(true)),
        "sub never said it was subscribed; stderr: {seen}"
    );
    // Keep draining stderr so that the summary cannot block on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, seen)
}

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}): stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_pub_to_a_queue_is_taken_by_stomp_and_amqp_subs_count_by_count() {
    let Setup { broker, _dir, .. } = setup().await;
    let mqtt = url(
        &broker,
        "mqtt",
        ListenerKind::Mqtt,
        PASSWORD,
        "/queue/cli-q",
    );
    let out = run(&["pub", "--url", &mqtt, "--message", "m{seq}", "--count", "5"]).await;
    assert_success(&out, "mqtt pub");
    assert!(
        stderr(&out).contains("published 5 messages in "),
        "{}",
        stderr(&out)
    );
    assert_eq!(broker.depth("cli-q"), (5, 0));

    // --count 2: two lines, then exit; the rest stays in the queue.
    let stomp = url(
        &broker,
        "stomp",
        ListenerKind::Stomp,
        PASSWORD,
        "/queue/cli-q",
    );
    let out = run(&["sub", "--url", &stomp, "--count", "2"]).await;
    assert_success(&out, "stomp sub");
    assert_eq!(stdout_lines(&out), ["m1", "m2"]);
    assert!(
        stderr(&out).contains("received 2 messages in "),
        "{}",
        stderr(&out)
    );

    let amqp = url(
        &broker,
        "amqp",
        ListenerKind::Amqp,
        PASSWORD,
        "/queue/cli-q",
    );
    let out = run(&["sub", "--url", &amqp, "--count", "3"]).await;
    assert_success(&out, "amqp sub");
    assert_eq!(stdout_lines(&out), ["m3", "m4", "m5"]);
    assert_eq!(broker.depth("cli-q"), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stomp_pub_to_a_topic_reaches_an_mqtt_subscriber_over_websocket() {
    let Setup { broker, _dir, .. } = setup().await;
    let ws = url(
        &broker,
        "ws",
        ListenerKind::WebSocket,
        PASSWORD,
        "/mqtt/topic/cli/+",
    );
    let (sub, _) = subscribed(&["sub", "--url", &ws, "--count", "3"]).await;
    let stomp = url(
        &broker,
        "stomp",
        ListenerKind::Stomp,
        PASSWORD,
        "/topic/cli/t",
    );
    let out = run(&[
        "pub",
        "--url",
        &stomp,
        "--message",
        "t{seq}",
        "--count",
        "3",
    ])
    .await;
    assert_success(&out, "stomp pub");
    let out = finish(sub).await;
    assert_success(&out, "ws sub");
    assert_eq!(stdout_lines(&out), ["t1", "t2", "t3"]);
}

/// STOMP and AMQP over WebSocket too: `ws://host/stomp/...` and
/// `ws://host/amqp/...` on the broker's paths, `wss://` over TLS. A
/// subscriber over AMQP/WebSocket (which the broker lists as such) takes
/// what STOMP and AMQP publish over ws and wss, and a STOMP/wss subscriber
/// what AMQP/ws publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stomp_and_amqp_speak_over_websocket_and_tls_websocket() {
    let Setup { broker, pki, _dir } = setup().await;
    let ca = pki.ca_file.to_str().expect("utf-8 path");
    let ws = |path: &str| url(&broker, "ws", ListenerKind::WebSocket, PASSWORD, path);
    let wss = |path: &str| url(&broker, "wss", ListenerKind::Wss, PASSWORD, path);
    let (sub, _) = subscribed(&["sub", "--url", &ws("/amqp/queue/cli-ws"), "--count", "4"]).await;
    let kinds: Vec<(&str, &str)> = broker
        .broker
        .as_ref()
        .expect("running")
        .view()
        .connections()
        .list()
        .iter()
        .map(|c| (c.protocol, c.transport))
        .collect();
    assert_eq!(kinds, [("amqp", "ws")], "the sub's connection");
    for (url, message, extra) in [
        (ws("/stomp/queue/cli-ws"), "s{seq}", &["--count", "2"][..]),
        (wss("/amqp/queue/cli-ws"), "a{seq}", &["--ca", ca][..]),
        (wss("/stomp/queue/cli-ws"), "w{seq}", &["--ca", ca][..]),
    ] {
        let mut args = vec!["pub", "--url", &url, "--message", message];
        args.extend_from_slice(extra);
        let out = run(&args).await;
        assert_success(&out, &url);
    }
    let out = finish(sub).await;
    assert_success(&out, "amqp ws sub");
    assert_eq!(stdout_lines(&out), ["s1", "s2", "a1", "w1"]);

    let out = run(&[
        "pub",
        "--url",
        &ws("/amqp/topic/cli/ws"),
        "--message",
        "late",
    ])
    .await;
    assert_success(&out, "amqp ws pub to a topic nobody reads");
    let out = run(&[
        "pub",
        "--url",
        &ws("/amqp/queue/cli-wss"),
        "--message",
        "x{seq}",
        "--count",
        "2",
    ])
    .await;
    assert_success(&out, "amqp ws pub");
    let out = run(&[
        "sub",
        "--url",
        &wss("/stomp/queue/cli-wss"),
        "--ca",
        ca,
        "--count",
        "2",
    ])
    .await;
    assert_success(&out, "stomp wss sub");
    assert_eq!(stdout_lines(&out), ["x1", "x2"]);
}

/// `--rate R` spaces the messages out: message k leaves at k / R seconds,
/// so 5 messages at 5 per second take at least 0.8 s, and all arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pub_paces_its_messages_to_the_rate_asked() {
    let Setup { broker, _dir, .. } = setup().await;
    let stomp = url(
        &broker,
        "stomp",
        ListenerKind::Stomp,
        PASSWORD,
        "/queue/cli-rate",
    );
    let started = std::time::Instant::now();
    let out = run(&[
        "pub",
        "--url",
        &stomp,
        "--message",
        "r{seq}",
        "--count",
        "5",
        "--rate",
        "5",
    ])
    .await;
    let took = started.elapsed();
    assert_success(&out, "paced pub");
    assert!(took >= Duration::from_millis(800), "5 at 5/s in {took:?}");
    assert!(took < Duration::from_secs(10), "5 at 5/s in {took:?}");
    let summary = stderr(&out);
    let seconds: f64 = summary
        .split(" in ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed time in {summary}"));
    assert!((0.8..10.0).contains(&seconds), "{summary}");
    assert_eq!(broker.depth("cli-rate"), (5, 0));
    let out = run(&["pub", "--url", &stomp, "--count", "2", "--rate", "0"]).await;
    assert!(!out.status.success(), "a rate of 0 is refused");
    assert!(stderr(&out).contains("--rate must be"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_pub_reaches_an_mqtt_subscriber_and_tls_urls_work() {
    let Setup { broker, pki, _dir } = setup().await;
    let ca = pki.ca_file.to_str().expect("utf-8 path");
    let mqtt = url(
        &broker,
        "mqtt",
        ListenerKind::Mqtt,
        PASSWORD,
        "/topic/cli/a",
    );
    let (sub, _) = subscribed(&["sub", "--url", &mqtt, "--count", "2", "--qos", "0"]).await;
    let amqp = url(
        &broker,
        "amqp",
        ListenerKind::Amqp,
        PASSWORD,
        "/topic/cli/a",
    );
    let out = run(&["pub", "--url", &amqp, "--message", "a{seq}", "--count", "2"]).await;
    assert_success(&out, "amqp pub");
    let out = finish(sub).await;
    assert_success(&out, "mqtt sub");
    assert_eq!(stdout_lines(&out), ["a1", "a2"]);

    // The same over TLS, trusting the test CA: one queue, three protocols.
    for (scheme, kind) in [
        ("mqtts", ListenerKind::Mqtts),
        ("stomps", ListenerKind::Stomps),
        ("amqps", ListenerKind::Amqps),
    ] {
        let tls = url(&broker, scheme, kind, PASSWORD, "/queue/cli-tls");
        let message = format!("over {scheme}");
        let out = run(&["pub", "--url", &tls, "--ca", ca, "--message", &message]).await;
        assert_success(&out, scheme);
    }
    let stomps = url(
        &broker,
        "stomps",
        ListenerKind::Stomps,
        PASSWORD,
        "/queue/cli-tls",
    );
    let out = run(&["sub", "--url", &stomps, "--ca", ca, "--count", "3"]).await;
    assert_success(&out, "stomps sub");
    assert_eq!(
        stdout_lines(&out),
        ["over mqtts", "over stomps", "over amqps"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_by_every_protocol() {
    let Setup { broker, _dir, .. } = setup().await;
    for (scheme, kind, path) in [
        ("mqtt", ListenerKind::Mqtt, "/queue/cli-refused"),
        ("stomp", ListenerKind::Stomp, "/queue/cli-refused"),
        ("amqp", ListenerKind::Amqp, "/queue/cli-refused"),
        ("ws", ListenerKind::WebSocket, "/mqtt/queue/cli-refused"),
    ] {
        let wrong = url(&broker, scheme, kind, "wrong", path);
        for verb in ["pub", "sub"] {
            let out = run(&[verb, "--url", &wrong, "--count", "1"]).await;
            let err = stderr(&out);
            assert!(
                !out.status.success(),
                "{verb} {scheme} with a wrong password succeeded"
            );
            assert!(
                err.contains("refused the connection")
                    || err.contains("refused the login")
                    || err.contains("the broker sent ERROR"),
                "{verb} {scheme}: {err}"
            );
            // The message names where it tried, never the password.
            assert!(
                err.contains(&format!("{scheme}://{USER}@localhost")),
                "{err}"
            );
            assert!(!err.contains("wrong"), "the password leaked: {err}");
        }
    }
    assert_eq!(
        broker.queue("cli-refused"),
        None,
        "a refused pub created the queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_or_subscription_the_user_may_not_make_is_refused_by_every_protocol() {
    let Setup { broker, _dir, .. } = setup().await;
    for (scheme, kind) in [
        ("mqtt", ListenerKind::Mqtt),
        ("stomp", ListenerKind::Stomp),
        ("amqp", ListenerKind::Amqp),
    ] {
        let port = broker.addr(kind).port();
        let to = |path: &str| format!("{scheme}://{LIMITED}:{PASSWORD}@localhost:{port}{path}");
        let out = run(&["sub", "--url", &to("/topic/not-bobs"), "--count", "1"]).await;
        let err = stderr(&out);
        assert!(
            !out.status.success(),
            "{scheme}: a denied subscription succeeded: {err}"
        );
        assert!(!err.contains("subscribed to"), "{scheme}: {err}");
        assert!(
            err.starts_with(&format!("rosetta: subscribing to {scheme}://{LIMITED}@")),
            "{scheme}: {err}"
        );
        assert!(
            err.contains("not authorized") || err.contains("NotAuthorized"),
            "{scheme}: {err}"
        );

        // MQTT 5's PUBACK says what 3.1.1 would have dropped in silence.
        let out = run(&["pub", "--url", &to("/queue/not-bobs"), "--message", "no"]).await;
        let err = stderr(&out);
        assert!(
            !out.status.success(),
            "{scheme}: a denied publish succeeded: {err}"
        );
        assert!(
            err.contains("not authorized") || err.contains("NotAuthorized"),
            "{scheme}: {err}"
        );
        // What bob may do, he can.
        let out = run(&["pub", "--url", &to("/queue/bob"), "--message", scheme]).await;
        assert_success(&out, scheme);
    }
    assert_eq!(
        broker.queue("not-bobs"),
        None,
        "a denied publish created the queue"
    );
    assert_eq!(broker.depth("bob"), (3, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_and_bad_arguments_exit_non_zero() {
    // A port that was just free: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    for scheme in ["mqtt", "stomp", "amqp", "ws"] {
        let path = if scheme == "ws" {
            "/mqtt/queue/q"
        } else {
            "/queue/q"
        };
        let url = format!("{scheme}://127.0.0.1:{port}{path}");
        let out = run(&["pub", "--url", &url]).await;
        assert!(!out.status.success(), "{scheme}: pub to nothing succeeded");
        assert!(
            stderr(&out).contains("connecting to"),
            "{scheme}: {}",
            stderr(&out)
        );
    }
    for bad in [
        vec!["pub", "--url", "http://localhost/queue/q"],
        vec!["pub", "--url", "mqtt://localhost/no-prefix"],
        vec!["pub", "--url", "stomp://localhost/queue/q", "--qos", "2"],
        vec!["pub", "--url", "mqtt://localhost/queue/q", "--rate", "0"],
        vec![
            "pub",
            "--url",
            "mqtt://localhost/queue/q",
            "--rate",
            "1e300",
        ],
        vec!["pub", "--url", "mqtt://localhost/queue/q", "--count", "0"],
        vec!["sub", "--url", "ws://localhost/stomp/queue/q"],
    ] {
        let out = run(&bad).await;
        assert!(!out.status.success(), "{bad:?} succeeded");
        // Ours, or clap's for a value out of range.
        let err = stderr(&out);
        assert!(
            err.starts_with("rosetta: ") || err.starts_with("error: "),
            "{bad:?}: {err}"
        );
    }
}
