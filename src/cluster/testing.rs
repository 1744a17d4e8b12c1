//! A throwaway etcd for tests: Debian's `etcd` (package `etcd-server`)
//! on free loopback ports, in a temporary directory, killed on drop.
//!
//! Tests that need it call [`EtcdServer::start`]. Without the binary the
//! test is skipped with a loud message, unless `ROSETTA_REQUIRE_ETCD` is
//! set (`scripts/test.sh` sets it), in which case it fails: CI must not
//! pass by skipping.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long etcd gets to start answering.
const START_TIMEOUT_MS: u64 = 20_000;

/// A running etcd; killed (and its directory removed) on drop.
pub struct EtcdServer {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

fn etcd_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ETCD_BIN") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

impl EtcdServer {
    /// Starts etcd, or `None` (after saying so on stderr) when the binary
    /// is missing and `ROSETTA_REQUIRE_ETCD` is unset.
    pub fn start() -> Option<Self> {
        Self::start_on(free_port())
    }

    /// [`EtcdServer::start`] with the client port given (to bring an etcd
    /// back where nodes look for it).
    pub fn start_on(client: u16) -> Option<Self> {
        let Some(binary) = etcd_binary() else {
            if std::env::var_os("ROSETTA_REQUIRE_ETCD").is_some() {
                panic!("etcd not found (ROSETTA_REQUIRE_ETCD is set): apt-get install etcd-server");
            }
            eprintln!("\n*** SKIPPED: etcd not found on PATH (apt-get install etcd-server); set ROSETTA_REQUIRE_ETCD to make this a failure ***\n");
            return None;
        };
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let peer = free_port();
        let endpoint = format!("http://127.0.0.1:{client}");
        let log = std::fs::File::create(dir.path().join("etcd.log"))
            .unwrap_or_else(|e| panic!("etcd log: {e}"));
        let child = Command::new(&binary)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--name", "test"])
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args([
                "--initial-cluster",
                &format!("test=http://127.0.0.1:{peer}"),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let server = Self {
            child,
            endpoint,
            _dir: dir,
        };
        server.wait_ready();
        Some(server)
    }

    /// Waits until etcd answers a range on the gateway.
    fn wait_ready(&self) {
        let authority = self.endpoint.trim_start_matches("http://").to_owned();
        let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
        while Instant::now() < deadline {
            if gateway_answers(&authority) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd did not start answering on {}", self.endpoint);
    }
}

/// One blocking range request; whether it got a 200.
fn gateway_answers(authority: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(authority) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let body = r#"{"key":"AA=="}"#;
    let req = format!(
        "POST /v3/kv/range HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer.starts_with(b"HTTP/1.1 200")
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
