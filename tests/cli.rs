//! The `rosetta` binary as an operator runs it: `check-config` makes the
//! checks `run` makes, the start says who can connect, failed TLS
//! handshakes reach the log (rate-limited), and `user add` asks for the
//! password twice without echo.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rosetta");
/// Longest wait for the broker to say something.
const WAIT: Duration = Duration::from_secs(20);

/// Every listener off except those in `listeners` (TOML lines), data in
/// `dir`.
fn write_config(dir: &Path, listeners: &str, rest: &str) -> PathBuf {
    let path = dir.join("rosetta.toml");
    let given = |key: &str| {
        listeners
            .lines()
            .any(|l| l.split('=').next().map(str::trim) == Some(key))
    };
    let off: String = [
        "mqtt",
        "stomp",
        "amqp",
        "websocket",
        "mqtts",
        "stomps",
        "amqps",
        "wss",
    ]
    .into_iter()
    .filter(|key| !given(key))
    .map(|key| format!("{key} = \"\"\n"))
    .collect();
    // The admin API off unless `rest` sets it: its default port is one for
    // the whole machine.
    let admin_off = if rest.contains("[admin]") {
        ""
    } else {
        "[admin]\nlisten = \"\"\n"
    };
    let text = format!(
        "data_dir = {:?}\n[listeners]\n{off}{listeners}\n{rest}\n{admin_off}",
        dir.join("data")
    );
    std::fs::write(&path, text).expect("write config");
    path
}

fn rosetta(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("ROSETTA_LOG", "info")
        .env_remove("ROSETTA_PASSWORD")
        .stdin(Stdio::null())
        .output()
        .expect("run rosetta")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

// ---- check-config runs the checks of run -----------------------------------

#[test]
fn check_config_refuses_missing_tls_files_as_run_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        "mqtts = \"127.0.0.1:0\"",
        "[tls]\ncert_file = \"/nonexistent/cert.pem\"\nkey_file = \"/nonexistent/key.pem\"",
    );
    let config = config.to_str().expect("utf-8 path");
    let check = rosetta(&["--config", config, "check-config"]);
    assert!(
        !check.status.success(),
        "check-config passed: {}",
        stderr(&check)
    );
    assert!(
        stderr(&check).contains("/nonexistent/cert.pem"),
        "{}",
        stderr(&check)
    );
    let run = rosetta(&["--config", config, "run"]);
    assert!(!run.status.success());
    assert_eq!(
        stderr(&check).lines().last(),
        stderr(&run).lines().last(),
        "the same check, the same message"
    );
}

#[test]
fn check_config_refuses_a_data_dir_that_cannot_be_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "", "");
    // The data directory's place is taken by a file.
    std::fs::write(dir.path().join("data"), b"not a directory").expect("write");
    let check = rosetta(&["--config", config.to_str().expect("utf-8"), "check-config"]);
    assert!(
        !check.status.success(),
        "check-config passed: {}",
        stderr(&check)
    );
    assert!(stderr(&check).contains("data_dir"), "{}", stderr(&check));
    assert!(
        stderr(&check).contains("not a directory"),
        "{}",
        stderr(&check)
    );
}

#[test]
fn check_config_warns_when_no_one_can_log_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users.toml");
    let config = write_config(
        dir.path(),
        "",
        &format!("[security]\nanonymous = false\nusers_file = {users:?}"),
    );
    let config = config.to_str().expect("utf-8");
    let check = rosetta(&["--config", config, "check-config"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let warning = stderr(&check);
    assert!(
        warning.contains("warning:")
            && warning.contains("does not exist")
            && warning.contains("no client can log in"),
        "{warning}"
    );

    let add = rosetta(&[
        "--config",
        config,
        "user",
        "add",
        "alice",
        "--password",
        "wonderland",
    ]);
    assert!(add.status.success(), "{}", stderr(&add));
    let check = rosetta(&["--config", config, "check-config"]);
    assert!(check.status.success());
    assert!(!stderr(&check).contains("warning"), "{}", stderr(&check));
}

// ---- the broker binary's log -----------------------------------------------

/// The broker binary on a configuration, its log read line by line.
struct Broker {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Broker {
    fn start(config: &Path) -> Broker {
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(config)
            .env("ROSETTA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rosetta");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let all = Arc::clone(&seen);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                all.lock().expect("lines").push(line.clone());
                let _ = tx.send(line);
            }
        });
        Broker { child, lines, seen }
    }

    /// The next log line with `needle` in it.
    fn line_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no log line with {needle:?}; log:\n{}", self.log()),
            }
        }
    }

    /// A line logged once at start with `needle` in it, whether or not an
    /// earlier [`Self::line_with`] read past it (the admin API logs that it
    /// listens before the journal is recovered, the protocol listeners
    /// after).
    fn startup_line(&self, needle: &str) -> String {
        let seen = self
            .seen
            .lock()
            .expect("lines")
            .iter()
            .find(|l| l.contains(needle))
            .cloned();
        seen.unwrap_or_else(|| self.line_with(needle))
    }

    /// Where the listener `key` is bound, from its "listening" line.
    fn addr(&self, key: &str) -> SocketAddr {
        let line = self.startup_line(&format!("listener=\"{key}\""));
        let rest = &line[line.find("addr=").expect("addr=") + 5..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        rest[..end].parse().expect("address")
    }

    /// `http://` and the admin API's address, from its "listening" line.
    fn admin_url(&self) -> String {
        let line = self.startup_line("admin API listening");
        let rest = &line[line.find("addr=").expect("addr=") + 5..];
        let api: SocketAddr = rest[..rest.find(char::is_whitespace).unwrap_or(rest.len())]
            .parse()
            .expect("admin address");
        format!("http://{api}")
    }

    fn log(&self) -> String {
        self.seen.lock().expect("lines").join("\n")
    }

    /// SIGTERM, then the whole log once the process is gone.
    fn stop(mut self) -> String {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + WAIT;
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The reader thread has the last lines once the pipe closes.
        while self.lines.recv_timeout(Duration::from_millis(200)).is_ok() {}
        self.log()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn without_bind_the_broker_listens_on_loopback_and_says_how_to_open_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "mqtt = 0", "");
    let broker = Broker::start(&config);
    assert!(broker.addr("mqtt").ip().is_loopback());
    let line = broker.line_with("loopback only");
    assert!(line.contains("[listeners] bind"), "{line}");
    broker.stop();

    let config = write_config(dir.path(), "bind = \"0.0.0.0\"\nmqtt = 0", "");
    let broker = Broker::start(&config);
    assert!(broker.addr("mqtt").ip().is_unspecified());
    let line = broker.line_with("anonymous access is on");
    assert!(line.contains("WARN"), "{line}");
    broker.stop();
}

#[test]
fn failed_tls_handshakes_are_logged_with_peer_and_reason_and_rate_limited() {
    /// Bad handshakes sent in one burst: far more than a window lets through.
    const STORM: usize = 60;
    /// `log_throttle::LOG_LINES_PER_WINDOW_MAX`.
    const LINES_PER_WINDOW: usize = 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = common::pki::Pki::generate(dir.path());
    let config = write_config(
        dir.path(),
        "mqtts = \"127.0.0.1:0\"",
        &format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}",
            pki.cert_file, pki.key_file
        ),
    );
    let broker = Broker::start(&config);
    let addr = broker.addr("mqtts");

    // Plaintext on a TLS port: an MQTT CONNECT.
    let plaintext = |addr| {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        let _ = s.write_all(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04test");
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest); // the broker closes
        s.local_addr().expect("local addr")
    };
    let first_peer = plaintext(addr);
    let line = broker.line_with("TLS handshake failed");
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&format!("peer={first_peer}")), "{line}");
    assert!(line.contains("reason="), "{line}");

    for _ in 1..STORM {
        plaintext(addr);
    }
    let log = broker.stop();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("TLS handshake failed"))
        .collect();
    // A burst this short fits in one or two windows.
    assert!(lines.len() <= 2 * LINES_PER_WINDOW, "{log}");
    // Nothing is lost without a trace: the lines logged, the counts they
    // carry and the count reported at shutdown add up to the storm.
    let carried: usize = lines.iter().map(|l| number_after(l, "suppressed=")).sum();
    let at_shutdown = log
        .lines()
        .find(|l| l.contains("failed TLS handshakes:"))
        .map_or(0, |l| number_after(l, "failed TLS handshakes: "));
    assert_eq!(lines.len() + carried + at_shutdown, STORM, "{log}");
    assert!(at_shutdown > 0, "{log}");
}

/// The number right after `key` in `line` (0 when absent).
fn number_after(line: &str, key: &str) -> usize {
    line.find(key)
        .map(|i| &line[i + key.len()..])
        .and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .unwrap_or(0)
}

// ---- user add: the password prompt ---------------------------------------------

/// A pseudo-terminal whose slave is the controlling terminal of a child
/// (`setsid -c`), as a shell in a terminal window would give it.
struct Terminal {
    master: std::fs::File,
    output: mpsc::Receiver<Vec<u8>>,
    screen: Vec<u8>,
    /// The program on the terminal; killed if the test fails first.
    child: Child,
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Terminal {
    fn spawn(args: &[&str]) -> Terminal {
        use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
        grantpt(&master).expect("grantpt");
        unlockpt(&master).expect("unlockpt");
        let name = ptsname(&master, Vec::new()).expect("ptsname");
        let slave_path = PathBuf::from(name.to_string_lossy().into_owned());
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&slave_path)
            .expect("open the pty slave");
        let child = Command::new("setsid")
            .arg("-c")
            .arg(BIN)
            .args(args)
            .env_remove("ROSETTA_PASSWORD")
            .stdin(slave.try_clone().expect("slave"))
            .stdout(slave.try_clone().expect("slave"))
            .stderr(slave)
            .spawn()
            .expect("spawn setsid rosetta");
        let master = std::fs::File::from(master);
        let mut reader = master.try_clone().expect("master");
        let (tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Terminal {
            master,
            output,
            screen: Vec::new(),
            child,
        }
    }

    /// Waits until the screen shows `text`.
    fn expect(&mut self, text: &str) {
        let deadline = Instant::now() + WAIT;
        while !String::from_utf8_lossy(&self.screen).contains(text) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(bytes) => self.screen.extend_from_slice(&bytes),
                Err(_) => panic!(
                    "{text:?} not shown; screen: {:?}",
                    String::from_utf8_lossy(&self.screen)
                ),
            }
        }
    }

    /// Waits until the terminal no longer echoes (the program turned echo
    /// off to read a secret), then types `line`.
    fn type_secret(&mut self, line: &str) {
        use rustix::termios::{tcgetattr, LocalModes};
        let deadline = Instant::now() + WAIT;
        while tcgetattr(&self.master)
            .expect("tcgetattr")
            .local_modes
            .contains(LocalModes::ECHO)
        {
            assert!(Instant::now() < deadline, "echo never turned off");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.master
            .write_all(format!("{line}\n").as_bytes())
            .expect("type");
    }

    /// Runs `args`, types `first` at the password prompt and `again` at the
    /// second one (each once echo is off); whether it succeeded, and the
    /// screen.
    fn password_twice(args: &[&str], first: &str, again: &str) -> (bool, String) {
        let mut terminal = Terminal::spawn(args);
        terminal.expect("password: ");
        terminal.type_secret(first);
        terminal.expect("again");
        terminal.type_secret(again);
        terminal.finish()
    }

    /// Everything shown until the child exits.
    fn finish(mut self) -> (bool, String) {
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "rosetta user add did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(bytes) = self.output.recv_timeout(Duration::from_millis(200)) {
            self.screen.extend_from_slice(&bytes);
        }
        (
            status.success(),
            String::from_utf8_lossy(&self.screen).into_owned(),
        )
    }
}

#[test]
fn user_add_asks_twice_without_echo_on_a_terminal() {
    const SECRET: &str = "s3cret-Kept-Off-Screen";
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users.toml");
    let users_arg = users.to_str().expect("utf-8");
    let (ok, screen) = Terminal::password_twice(
        &["user", "add", "alice", "--users-file", users_arg],
        SECRET,
        SECRET,
    );
    assert!(ok, "{screen}");
    assert!(screen.contains("saved"), "{screen}");
    assert!(
        !screen.contains(SECRET),
        "the password was echoed: {screen}"
    );
    let saved = rosetta::users::Users::load(&users).expect("users file");
    assert!(saved.verify("alice", SECRET.as_bytes()));

    // A typo in the confirmation saves nothing.
    let (ok, screen) = Terminal::password_twice(
        &["user", "add", "bob", "--users-file", users_arg],
        "one",
        "another",
    );
    assert!(!ok, "{screen}");
    assert!(screen.contains("do not match"), "{screen}");
    let saved = rosetta::users::Users::load(&users).expect("users file");
    assert!(!saved.contains("bob"));
}

#[test]
fn user_add_still_takes_the_password_from_scripts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users.toml");
    let users_arg = users.to_str().expect("utf-8");
    let flag = rosetta(&[
        "user",
        "add",
        "a",
        "--password",
        "pa",
        "--users-file",
        users_arg,
    ]);
    assert!(flag.status.success(), "{}", stderr(&flag));
    let env = Command::new(BIN)
        .args(["user", "add", "b", "--users-file", users_arg])
        .env("ROSETTA_PASSWORD", "pb")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(env.status.success(), "{}", stderr(&env));
    let mut piped = Command::new(BIN)
        .args(["user", "add", "c", "--users-file", users_arg])
        .env_remove("ROSETTA_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    piped
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"pc\n")
        .expect("pipe");
    assert!(piped.wait().expect("wait").success());
    let saved = rosetta::users::Users::load(&users).expect("users file");
    for (user, password) in [("a", "pa"), ("b", "pb"), ("c", "pc")] {
        assert!(saved.verify(user, password.as_bytes()), "{user}");
    }
}

/// A broker in `dir` with STOMP and the admin API, whose users file has
/// `ops` (password `ops-pw`) with `role`.
fn stomp_and_admin_api(dir: &std::path::Path, role: rosetta::users::AdminRole) -> Broker {
    rosetta::users::save_user(
        &dir.join("users.toml"),
        "ops",
        b"ops-pw",
        None,
        None,
        Some(&[role]),
    )
    .expect("user");
    let config = write_config(dir, "stomp = 0", "[admin]\nlisten = \"127.0.0.1:0\"");
    Broker::start(&config)
}

/// `rosetta queue list|stat|purge|delete` and `rosetta connection
/// list|close` against a running broker's admin API.
#[test]
fn queue_and_connection_commands_speak_to_the_admin_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = stomp_and_admin_api(dir.path(), rosetta::users::AdminRole::Management);
    let stomp = broker.addr("stomp");
    let url = broker.admin_url();
    let ops_with = |args: &[&str], password: &str| {
        let mut all = args.to_vec();
        all.extend(["--url", &url, "--user", "ops", "--password", password]);
        rosetta(&all)
    };
    let ops = |args: &[&str]| {
        let out = ops_with(args, "ops-pw");
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut client = runtime.block_on(async {
        let mut c = common::stomp::StompClient::connect(stomp, &[("client-id", "cli-probe")]).await;
        c.send_persistent("/queue/orders", &[], b"one").await;
        c.send_persistent("/queue/orders", &[], b"two").await;
        c
    });
    assert_eq!(ops(&["queue", "list"]).trim(), "orders");
    let table = ops(&["queue", "stat", "--name", "ord"]);
    assert_eq!(stat_cell(&table, "orders", "MESSAGE_COUNT"), "2", "{table}");
    assert_eq!(
        stat_cell(&table, "orders", "MESSAGES_ADDED"),
        "2",
        "{table}"
    );
    assert_eq!(
        stat_cell(&table, "orders", "CONSUMER_COUNT"),
        "0",
        "{table}"
    );
    assert_eq!(stat_cell(&table, "orders", "ADDRESS"), "orders", "{table}");
    assert_eq!(
        stat_cell(&table, "orders", "ROUTING_TYPE"),
        "ANYCAST",
        "{table}"
    );

    // move: to a queue that exists, all of them or --count of them.
    runtime.block_on(client.send_persistent("/queue/orders-held", &[], b"three"));
    let moved = ops(&[
        "queue",
        "move",
        "orders",
        "--to",
        "orders-held",
        "--count",
        "1",
    ]);
    assert!(
        moved.contains("1 messages moved to 'orders-held', 0 refused"),
        "{moved}"
    );
    let table = ops(&["queue", "stat"]);
    assert_eq!(stat_cell(&table, "orders", "MESSAGE_COUNT"), "1", "{table}");
    assert_eq!(
        stat_cell(&table, "orders-held", "MESSAGE_COUNT"),
        "2",
        "{table}"
    );
    let moved = ops(&["queue", "move", "orders-held", "--to", "orders"]);
    assert!(
        moved.contains("2 messages moved to 'orders', 0 refused"),
        "{moved}"
    );
    let out = ops_with(&["queue", "move", "orders", "--to", "nowhere"], "ops-pw");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("404"), "{}", stderr(&out));
    assert!(ops(&["queue", "purge", "orders"]).contains("3 messages removed"));

    let listed = ops(&["connection", "list"]);
    let id = listed
        .lines()
        .find(|l| l.ends_with("cli-probe"))
        .and_then(|l| l.split_whitespace().next())
        .expect("the STOMP client is listed")
        .to_owned();
    ops(&["connection", "close", &id, "--reason", "bye now"]);
    let error = runtime.block_on(client.expect_error_then_close());
    assert_eq!(error.header("message"), Some("bye now"), "{error:?}");
    assert!(ops(&["queue", "delete", "orders"]).contains("deleted"));

    // A refusal is an error exit with the API's reason.
    let out = ops_with(&["queue", "list"], "wrong");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("401"), "{}", stderr(&out));

    // A token made with the password stands in for it, by flag or by
    // ROSETTA_TOKEN, until revoked.
    let token = ops(&["token", "create"]).trim().to_owned();
    assert!(token.starts_with("rosetta_"), "{token}");
    let by_flag = rosetta(&["queue", "list", "--url", &url, "--token", &token]);
    assert!(by_flag.status.success(), "{}", stderr(&by_flag));
    let by_env = Command::new(BIN)
        .args(["connection", "list", "--url", &url])
        .env("ROSETTA_TOKEN", &token)
        .output()
        .expect("run rosetta");
    assert!(by_env.status.success(), "{}", stderr(&by_env));
    let listed = ops(&["token", "list"]);
    let id = listed
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .expect("the token is listed")
        .to_owned();
    assert!(!listed.contains(&token), "{listed}");
    ops(&["token", "revoke", &id]);
    let revoked = rosetta(&["queue", "list", "--url", &url, "--token", &token]);
    assert!(!revoked.status.success());
    assert!(stderr(&revoked).contains("401"), "{}", stderr(&revoked));
    broker.stop();
}

/// The cell of `queue stat`'s `table` in the row of `queue`, under `column`.
/// `rosetta stream stat` against a running broker's admin API: a stream's
/// row for its consumer group, with the group's committed offset, the
/// log's end and the lag.
#[test]
fn stream_stat_prints_each_groups_committed_offset_and_lag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = stomp_and_admin_api(dir.path(), rosetta::users::AdminRole::Monitoring);
    let stomp = broker.addr("stomp");
    let url = broker.admin_url();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _reader = runtime.block_on(async {
        let mut w = common::stomp::StompClient::connect(stomp, &[]).await;
        for body in ["e0", "e1", "e2"] {
            w.send_persistent(
                "/queue/audit",
                &[("x-queue-type", "stream")],
                body.as_bytes(),
            )
            .await;
        }
        let mut r = common::stomp::StompClient::connect(stomp, &[]).await;
        r.subscribe(
            "g",
            "/queue/audit",
            "client-individual",
            &[("x-stream-group", "billing"), ("x-stream-offset", "first")],
        )
        .await;
        let got = r.messages(3).await;
        r.ack(&got[0]).await;
        r
    });
    let out = rosetta(&[
        "stream",
        "stat",
        "--url",
        &url,
        "--user",
        "ops",
        "--password",
        "ops-pw",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    for (column, want) in [
        ("GROUP", "billing"),
        ("CURRENT-OFFSET", "1"),
        ("LOG-END-OFFSET", "3"),
        ("LAG", "2"),
        ("READERS", "1"),
    ] {
        assert_eq!(
            stat_cell(&table, "audit", column),
            want,
            "{column}: {table}"
        );
    }
}

fn stat_cell(table: &str, queue: &str, column: &str) -> String {
    let cells =
        |line: &str| -> Vec<String> { line.split('|').map(|c| c.trim().to_owned()).collect() };
    let mut lines = table.lines();
    let header = cells(lines.next().expect("a header"));
    let at = header
        .iter()
        .position(|h| h == column)
        .unwrap_or_else(|| panic!("no column {column}: {table}"));
    let row = lines
        .map(cells)
        .find(|r| r.get(1).map(String::as_str) == Some(queue))
        .unwrap_or_else(|| panic!("no row {queue}: {table}"));
    row[at].clone()
}

/// `user list|add|passwd|delete` and `status` over the admin API: an
/// added user logs in over STOMP with its password, then with the new
/// one, and not at all once deleted; a user without the role is refused.
/// A broker in `dir` with STOMP, the admin API, logins required and the
/// users file `users.toml` (returned) holding the administrator `root`
/// (password `root-pw`) and `others` (name, password) without roles.
fn broker_with_root(dir: &Path, others: &[(&str, &str)]) -> (Broker, PathBuf) {
    let users = dir.join("users.toml");
    rosetta::users::save_user(
        &users,
        "root",
        b"root-pw",
        None,
        None,
        Some(&[rosetta::users::AdminRole::Administrator]),
    )
    .expect("user");
    for (name, password) in others {
        rosetta::users::add_user(&users, name, password.as_bytes(), None, None).expect("user");
    }
    let config = write_config(
        dir,
        "stomp = 0",
        &format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n[security]\nanonymous = false\nusers_file = {users:?}"
        ),
    );
    (Broker::start(&config), users)
}

#[test]
fn user_and_status_commands_speak_to_the_admin_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (broker, users) = broker_with_root(dir.path(), &[]);
    let stomp = broker.addr("stomp");
    let url = broker.admin_url();
    // `rosetta serve` binds the admin API before it recovers the journal,
    // so /readyz answers (503) during a long recovery.
    broker.startup_line("journal recovered");
    let log = broker.log();
    let at = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("{needle}: {log}"))
    };
    assert!(at("admin API listening") < at("journal replayed"), "{log}");
    let root = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--url", &url, "--user", "root", "--password", "root-pw"]);
        let out = rosetta(&all);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let status = root(&["status"]);
    assert!(status.contains("version"), "{status}");
    assert!(status.contains("queues       0"), "{status}");

    let token = root(&["token", "create"]).trim().to_owned();
    let out = rosetta(&[
        "user",
        "add",
        "app",
        "--password",
        "app-pw",
        "--role",
        "monitoring",
        "--url",
        &url,
        "--token",
        &token,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stomp_login(stomp, "app", "app-pw").starts_with("CONNECTED"));
    let listed = root(&["user", "list"]);
    let row = listed
        .lines()
        .find(|l| l.starts_with("app "))
        .expect("app listed");
    assert!(row.contains("monitoring"), "{listed}");
    assert!(!listed.contains("argon2"), "never a hash: {listed}");

    root(&["user", "passwd", "app", "--new-password", "app-pw-2"]);
    assert!(stomp_login(stomp, "app", "app-pw-2").starts_with("CONNECTED"));
    assert!(stomp_login(stomp, "app", "app-pw").starts_with("ERROR"));
    // A monitoring user may not manage users.
    let out = rosetta(&[
        "user",
        "delete",
        "root",
        "--url",
        &url,
        "--user",
        "app",
        "--password",
        "app-pw-2",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("403"), "{}", stderr(&out));
    // user role: the file changes, --reload puts it in force at once.
    let users_arg = users.to_str().expect("utf-8");
    root(&[
        "user",
        "role",
        "app",
        "--role",
        "management",
        "--users-file",
        users_arg,
        "--reload",
    ]);
    let row = |listed: &str| {
        listed
            .lines()
            .find(|l| l.starts_with("app "))
            .map(str::to_owned)
            .expect("app listed")
    };
    assert!(row(&root(&["user", "list"])).contains("management"));
    let app = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--url", &url, "--user", "app", "--password", "app-pw-2"]);
        rosetta(&all)
    };
    let purged = app(&["queue", "purge", "nothing-here"]);
    assert!(
        !stderr(&purged).contains("403"),
        "management may act: {}",
        stderr(&purged)
    );
    root(&["user", "role", "app", "--users-file", users_arg, "--reload"]);
    assert!(
        row(&root(&["user", "list"])).contains(" - "),
        "no roles left"
    );
    let refused = app(&["status"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("403"), "{}", stderr(&refused));
    let out = rosetta(&[
        "user",
        "role",
        "nobody",
        "--role",
        "monitoring",
        "--users-file",
        users_arg,
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no user 'nobody'"),
        "{}",
        stderr(&out)
    );

    // remove is delete's other name.
    root(&["user", "remove", "app"]);
    assert!(stomp_login(stomp, "app", "app-pw-2").starts_with("ERROR"));
    broker.stop();
}

/// `user passwd` without --new-password asks twice on the terminal without
/// echo, as `user add` does, and a mismatch changes nothing.
#[test]
fn user_passwd_asks_twice_without_echo_on_a_terminal() {
    const SECRET: &str = "n3w-Secret-Off-Screen";
    let dir = tempfile::tempdir().expect("tempdir");
    let (broker, _) = broker_with_root(dir.path(), &[("app", "old-pw")]);
    let stomp = broker.addr("stomp");
    let url = broker.admin_url();
    let passwd = [
        "user",
        "passwd",
        "app",
        "--url",
        &url,
        "--user",
        "root",
        "--password",
        "root-pw",
    ];

    let (ok, screen) = Terminal::password_twice(&passwd, SECRET, "a typo");
    assert!(!ok, "{screen}");
    assert!(screen.contains("do not match"), "{screen}");
    assert_eq!(stomp_login(stomp, "app", "old-pw"), "CONNECTED");

    let (ok, screen) = Terminal::password_twice(&passwd, SECRET, SECRET);
    assert!(ok, "{screen}");
    assert!(
        !screen.contains(SECRET),
        "the password was echoed: {screen}"
    );
    assert_eq!(stomp_login(stomp, "app", SECRET), "CONNECTED");
    assert_eq!(stomp_login(stomp, "app", "old-pw"), "ERROR");
    broker.stop();
}

/// `user add --user U --password P` goes through the API as U, as every
/// command of the API does: the new user's password is --new-password
/// (or ROSETTA_NEW_PASSWORD); a user without an admin right is refused;
/// no --user, no --password and no terminal is an error saying how to give
/// one.
#[test]
fn user_add_through_the_api_takes_the_administrators_user_and_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (broker, users) = broker_with_root(dir.path(), &[("plain", "plain-pw")]);
    let stomp = broker.addr("stomp");
    let url = broker.admin_url();
    let add = |name: &str, who: (&str, &str), extra: &[&str]| {
        let mut args = vec![
            "user",
            "add",
            name,
            "--role",
            "monitoring",
            "--url",
            &url,
            "--user",
            who.0,
            "--password",
            who.1,
        ];
        args.extend_from_slice(extra);
        rosetta(&args)
    };
    let out = add(
        "api-made",
        ("root", "root-pw"),
        &["--new-password", "made-pw"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stomp_login(stomp, "api-made", "made-pw"), "CONNECTED");
    let saved = rosetta::users::Users::load(&users).expect("users file");
    assert!(
        saved.verify("api-made", b"made-pw"),
        "written by the broker"
    );
    assert!(
        !saved.verify("api-made", b"root-pw"),
        "not the administrator's"
    );

    let mut env_new = Command::new(BIN);
    env_new
        .args([
            "user",
            "add",
            "from-env",
            "--url",
            &url,
            "--user",
            "root",
            "--password",
            "root-pw",
        ])
        .env("ROSETTA_NEW_PASSWORD", "env-pw")
        .env_remove("ROSETTA_PASSWORD")
        .stdin(Stdio::null());
    let out = env_new.output().expect("run");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stomp_login(stomp, "from-env", "env-pw"), "CONNECTED");

    let out = add(
        "refused",
        ("plain", "plain-pw"),
        &["--new-password", "x-pw"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("403"), "{}", stderr(&out));
    let out = rosetta(&[
        "user",
        "add",
        "nobody",
        "--url",
        &url,
        "--user",
        "root",
        "--new-password",
        "n-pw",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--password or ROSETTA_PASSWORD"),
        "{}",
        stderr(&out)
    );
    let out = rosetta(&["queue", "list", "--url", &url, "--user", "root"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--password or ROSETTA_PASSWORD"),
        "{}",
        stderr(&out)
    );
    broker.stop();
}

/// On a terminal, `--user` without `--password` asks for that user's
/// password once, without echo, for any command of the API; `user add`
/// then asks for the new user's twice.
#[test]
fn the_api_commands_ask_for_the_administrators_password_on_a_terminal() {
    const ROOT_PW: &str = "root-pw";
    const NEW_PW: &str = "N3w-User-Off-Screen";
    let dir = tempfile::tempdir().expect("tempdir");
    let (broker, _) = broker_with_root(dir.path(), &[]);
    let stomp = broker.addr("stomp");
    let url = broker.admin_url();

    let mut terminal = Terminal::spawn(&["status", "--url", &url, "--user", "root"]);
    terminal.expect("root's password (admin API): ");
    terminal.type_secret(ROOT_PW);
    let (ok, screen) = terminal.finish();
    assert!(ok, "{screen}");
    assert!(screen.contains("version"), "the overview: {screen}");
    assert!(!screen.contains(ROOT_PW), "echoed: {screen}");

    let mut terminal = Terminal::spawn(&[
        "user",
        "add",
        "typed",
        "--role",
        "monitoring",
        "--url",
        &url,
        "--user",
        "root",
    ]);
    terminal.expect("root's password (admin API): ");
    terminal.type_secret(ROOT_PW);
    terminal.expect("new password for typed: ");
    terminal.type_secret(NEW_PW);
    terminal.expect("new password for typed again: ");
    terminal.type_secret(NEW_PW);
    let (ok, screen) = terminal.finish();
    assert!(ok, "{screen}");
    assert!(
        !screen.contains(NEW_PW) && !screen.contains(ROOT_PW),
        "echoed: {screen}"
    );
    assert_eq!(stomp_login(stomp, "typed", NEW_PW), "CONNECTED");

    // A wrong password typed is the API's 401, said as such.
    let mut terminal = Terminal::spawn(&["status", "--url", &url, "--user", "root"]);
    terminal.expect("root's password (admin API): ");
    terminal.type_secret("wrong");
    let (ok, screen) = terminal.finish();
    assert!(!ok, "{screen}");
    assert!(screen.contains("401"), "{screen}");
    broker.stop();
}

// ---- --log-format json -----------------------------------------------------

#[test]
fn log_format_json_writes_one_json_object_per_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "mqtt = 0", "");
    let mut child = Command::new(BIN)
        .args(["--log-format", "json", "--config"])
        .arg(&config)
        .env("ROSETTA_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rosetta");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let listening = loop {
        let line = rx.recv_timeout(WAIT).expect("a log line");
        let object: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"));
        assert!(object["timestamp"].is_string(), "{line}");
        assert!(object["level"].is_string(), "{line}");
        let message = object["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        seen.push(message.clone());
        if message.contains("listening") {
            break object;
        }
        assert!(seen.len() < 100, "no listening line in {seen:?}");
    };
    // Structured fields stay fields, not text.
    assert_eq!(
        listening["fields"]["listener"].as_str(),
        Some("mqtt"),
        "{listening}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn user_add_sets_admin_roles_and_refuses_an_unknown_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users.toml");
    let users_arg = users.to_str().expect("utf-8");
    let add = |extra: &[&str]| {
        let mut args = vec![
            "user",
            "add",
            "ops",
            "--password",
            "pw",
            "--users-file",
            users_arg,
        ];
        args.extend_from_slice(extra);
        rosetta(&args)
    };
    let out = add(&["--role", "management"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let saved = rosetta::users::Users::load(&users).expect("users file");
    assert_eq!(saved.roles("ops"), ["management"]);
    // Without --role an existing user keeps its roles.
    let out = add(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let saved = rosetta::users::Users::load(&users).expect("users file");
    assert_eq!(saved.roles("ops"), ["management"]);
    let out = add(&["--role", "root"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown role 'root'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn user_add_writes_deny_rules_and_refuses_a_malformed_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users.toml");
    let users_arg = users.to_str().expect("utf-8");
    let base = [
        "user",
        "add",
        "dora",
        "--password",
        "pw",
        "--users-file",
        users_arg,
    ];
    let with = |extra: &[&str]| rosetta(&[&base[..], extra].concat());
    let out = with(&[
        "--deny-subscribe",
        "/topic/test/nosubscribe",
        "--deny-publish",
        "/queue/audit",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let saved = rosetta::users::Users::load(&users).expect("users file");
    let summary = saved.summary("dora").expect("dora");
    assert_eq!(summary.deny_subscribe, ["/topic/test/nosubscribe"]);
    assert_eq!(summary.deny_publish, ["/queue/audit"]);
    let dora = saved.permissions(Some("dora"));
    let topic = |t: &str| rosetta_neutral::Address::Topic(t.into());
    assert!(!dora.may_subscribe(&topic("test/nosubscribe")));
    assert_eq!(dora.excluded_topics("test/#"), ["test/nosubscribe"]);
    let out = with(&["--deny-subscribe", "test/nosubscribe"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("canonical"), "{}", stderr(&out));
}

// ---- SIGHUP reloads the users file ------------------------------------------

/// What a STOMP 1.2 CONNECT as `user` gets back: `CONNECTED` or `ERROR`.
fn stomp_login(addr: SocketAddr, user: &str, password: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let frame =
        format!("CONNECT\naccept-version:1.2\nhost:/\nlogin:{user}\npasscode:{password}\n\n\0");
    s.write_all(frame.as_bytes()).expect("send CONNECT");
    let mut reply = [0u8; 16];
    let n = s.read(&mut reply).expect("a reply");
    let text = String::from_utf8_lossy(&reply[..n]).into_owned();
    text.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn sighup_reloads_the_users_file_and_keeps_the_old_one_when_the_new_is_broken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users.toml");
    let users_arg = users.to_str().expect("utf-8");
    let add = |name: &str, password: &str| {
        let out = rosetta(&[
            "user",
            "add",
            name,
            "--password",
            password,
            "--users-file",
            users_arg,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    add("first", "p1");
    let config = write_config(
        dir.path(),
        "stomp = 0",
        &format!("[security]\nanonymous = false\nusers_file = {users:?}"),
    );
    let broker = Broker::start(&config);
    let stomp = broker.addr("stomp");
    let pid = broker.child.id().to_string();
    let hangup = || {
        let sent = Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .expect("kill");
        assert!(sent.success());
    };
    assert_eq!(stomp_login(stomp, "first", "p1"), "CONNECTED");
    // Added to the file while the broker runs: not known until SIGHUP.
    add("second", "p2");
    assert_eq!(stomp_login(stomp, "second", "p2"), "ERROR");
    hangup();
    broker.line_with("users file reloaded");
    assert_eq!(stomp_login(stomp, "second", "p2"), "CONNECTED");
    // A broken file is refused, and the users in force stay.
    std::fs::write(&users, "this is [not toml").expect("break the file");
    hangup();
    let refused = broker.line_with("does not load");
    assert!(refused.contains("ERROR"), "{refused}");
    assert_eq!(stomp_login(stomp, "first", "p1"), "CONNECTED");
    assert_eq!(stomp_login(stomp, "second", "p2"), "CONNECTED");
    broker.stop();
}

// ---- roles -----------------------------------------------------------------

/// A users file naming a role no one defined stops `check-config` and
/// `run` alike, with the file, line and key.
#[test]
fn check_config_names_the_line_of_an_unknown_role() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users.toml");
    let hash = rosetta::users::password::hash(b"pw").expect("hash");
    let text = format!(
        "[roles.sensors]\npublish = [\"/topic/sensors/#\"]\n\n[users.s1]\npassword_hash = \"{hash}\"\nroles = [\"sensors\", \"sensor\"]\n"
    );
    std::fs::write(&users, text).expect("write users");
    let config = write_config(
        dir.path(),
        "",
        &format!("[security]\nusers_file = {users:?}"),
    );
    let config = config.to_str().expect("utf-8");
    let check = rosetta(&["--config", config, "check-config"]);
    assert!(!check.status.success(), "{}", stderr(&check));
    let said = stderr(&check);
    assert!(
        said.contains("users.toml:6")
            && said.contains("users.s1.roles[1]")
            && said.contains("unknown role 'sensor'"),
        "{said}"
    );
    let run = rosetta(&["--config", config, "run"]);
    assert!(!run.status.success());
    assert_eq!(said.lines().last(), stderr(&run).lines().last());
}

/// `role add|list|remove`, `user role` and `user add --url` with roles and
/// deny lists, through the admin API of a running broker: what they write
/// is in the users file and in force (the role's admin right lets its
/// user read the API), and the refusals are error exits with the API's
/// status.
#[test]
fn role_commands_speak_to_the_admin_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (broker, users) = broker_with_root(dir.path(), &[("app", "app-pw")]);
    let url = broker.admin_url();
    let as_user = |user: &str, password: &str, args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--url", &url, "--user", user, "--password", password]);
        rosetta(&all)
    };
    // The API answers 503 until the broker is recovered and attached.
    let deadline = Instant::now() + WAIT;
    while !as_user("root", "root-pw", &["status"]).status.success() {
        assert!(Instant::now() < deadline, "the API never became ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let root = |args: &[&str]| {
        let out = as_user("root", "root-pw", args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = root(&[
        "role",
        "add",
        "sensors",
        "--publish",
        "/topic/sensors/#",
        "--deny-publish",
        "/topic/sensors/admin",
        "--admin",
        "monitoring",
    ]);
    assert!(said.contains("role 'sensors' saved"), "{said}");
    let listed = root(&["role", "list"]);
    let row = listed
        .lines()
        .find(|l| l.starts_with("sensors "))
        .unwrap_or_else(|| panic!("sensors listed: {listed}"));
    assert!(
        row.contains("monitoring") && row.contains("[/topic/sensors/#]"),
        "{row}"
    );
    assert!(
        listed.lines().any(|l| l.starts_with("administrator ")),
        "{listed}"
    );

    // user role: through the API, in force at once.
    let refused = as_user("app", "app-pw", &["status"]);
    assert!(stderr(&refused).contains("403"), "{}", stderr(&refused));
    let said = root(&["user", "role", "app", "--role", "sensors"]);
    assert!(
        said.contains("[sensors]") && said.contains("monitoring"),
        "{said}"
    );
    let allowed = as_user("app", "app-pw", &["status"]);
    assert!(allowed.status.success(), "{}", stderr(&allowed));
    let out = as_user(
        "root",
        "root-pw",
        &["user", "role", "app", "--role", "ghost"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("400") && stderr(&out).contains("unknown role 'ghost'"),
        "{}",
        stderr(&out)
    );

    // user add --url takes roles and deny lists.
    let token = root(&["token", "create"]).trim().to_owned();
    let out = rosetta(&[
        "user",
        "add",
        "dora",
        "--password",
        "dora-pw",
        "--role",
        "sensors",
        "--deny-subscribe",
        "/topic/test/nosubscribe",
        "--url",
        &url,
        "--token",
        &token,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let saved = rosetta::users::Users::load(&users).expect("users file");
    let dora = saved.summary("dora").expect("dora");
    assert_eq!(dora.roles, ["sensors"]);
    assert_eq!(dora.publish, ["/topic/sensors/#"], "the role's list");
    assert_eq!(dora.deny_subscribe, ["/topic/test/nosubscribe"]);
    assert_eq!(
        dora.deny_publish,
        ["/topic/sensors/admin"],
        "the role's deny"
    );

    // A role held cannot go; a built-in one never; a bad right is refused
    // before any request.
    let out = as_user("root", "root-pw", &["role", "remove", "sensors"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("409") && stderr(&out).contains("app, dora"),
        "{}",
        stderr(&out)
    );
    let out = as_user("root", "root-pw", &["role", "add", "monitoring"]);
    assert!(stderr(&out).contains("409"), "{}", stderr(&out));
    let out = as_user("root", "root-pw", &["role", "add", "x", "--admin", "root"]);
    assert!(
        stderr(&out).contains("unknown admin right 'root'"),
        "{}",
        stderr(&out)
    );
    let out = as_user("app", "app-pw", &["role", "add", "y"]);
    assert!(
        stderr(&out).contains("403"),
        "monitoring only: {}",
        stderr(&out)
    );
    root(&["user", "role", "app"]);
    root(&["user", "remove", "dora"]);
    let said = root(&["role", "remove", "sensors"]);
    assert!(said.contains("role 'sensors' removed"), "{said}");
    let saved = rosetta::users::Users::load(&users).expect("users file");
    assert!(saved.role_names().is_empty() && saved.roles("app").is_empty());
    broker.stop();
}
