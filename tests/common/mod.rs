//! Shared harness of the integration tests: a real broker on free loopback
//! ports with a temporary data directory, restartable on the same data.
#![allow(dead_code)]
// each test file uses its own subset
// Items here are `pub` for the sibling helper modules; the crate is a test.
#![allow(unreachable_pub)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rosetta::config::{Config, ListenAddr, ListenerKind};
use rosetta::core::{AccessControl, AllowAll};
use rosetta::server::{self, RunningBroker};

/// A broker under test.
pub struct TestBroker {
    pub broker: Option<RunningBroker>,
    pub dir: Arc<tempfile::TempDir>,
    pub config: Config,
    access: Arc<dyn AccessControl>,
}

fn loopback() -> Option<ListenAddr> {
    Some(ListenAddr::new("127.0.0.1", 0))
}

/// A configuration with the plain TCP listeners on free loopback ports and
/// the data directory in `dir`.
pub fn test_config(dir: &Path) -> Config {
    let mut config = Config {
        data_dir: dir.join("data"),
        ..Config::default()
    };
    config.listeners.mqtt = loopback();
    config.listeners.stomp = loopback();
    config.listeners.amqp = loopback();
    config.listeners.websocket = None;
    config.listeners.mqtts = None;
    config.listeners.stomps = None;
    config.listeners.amqps = None;
    config.listeners.wss = None;
    config.listeners.any = None;
    // No $SYS retained messages unless a test asks (tests/sys_topics.rs):
    // tests that list or count retained messages count their own.
    config.sys.interval_s = 0;
    config
}

/// One account of a test users file: its password and the address patterns
/// it may publish to and subscribe to (`None`: anything).
pub struct Account<'a> {
    pub user: &'a str,
    pub password: &'a [u8],
    pub publish: Option<&'a [&'a str]>,
    pub subscribe: Option<&'a [&'a str]>,
}

impl<'a> Account<'a> {
    /// An account that may publish and subscribe to anything.
    pub fn unrestricted(user: &'a str, password: &'a [u8]) -> Self {
        Account {
            user,
            password,
            publish: None,
            subscribe: None,
        }
    }

    /// An account limited to the `publish` and `subscribe` patterns.
    pub fn limited(
        user: &'a str,
        password: &'a [u8],
        publish: &'a [&'a str],
        subscribe: &'a [&'a str],
    ) -> Self {
        Account {
            user,
            password,
            publish: Some(publish),
            subscribe: Some(subscribe),
        }
    }
}

/// Access control from a users file written with `rosetta::users::add_user`
/// in `dir` (kept there only while it is loaded) with `accounts`;
/// `anonymous` says whether clients without credentials are let in.
pub fn users_file_access(
    dir: &Path,
    anonymous: bool,
    accounts: &[Account<'_>],
) -> Arc<dyn AccessControl> {
    let path = dir.join("users.toml");
    let owned =
        |list: Option<&[&str]>| list.map(|l| l.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>());
    for a in accounts {
        rosetta::users::add_user(
            &path,
            a.user,
            a.password,
            owned(a.publish).as_deref(),
            owned(a.subscribe).as_deref(),
        )
        .unwrap_or_else(|e| panic!("add user {}: {e}", a.user));
    }
    let users = rosetta::users::Users::load(&path).expect("load users");
    Arc::new(rosetta::access::UsersAccess::new(users, anonymous).expect("hashing threads start"))
}

impl TestBroker {
    /// Starts a broker with anonymous, unrestricted access.
    pub async fn start() -> TestBroker {
        Self::start_with(|_| {}, Arc::new(AllowAll)).await
    }

    /// Starts a broker whose access control is a users file with `accounts`
    /// (see [`users_file_access`]), `security.anonymous` set as given.
    pub async fn with_users(anonymous: bool, accounts: &[Account<'_>]) -> TestBroker {
        let dir = tempfile::tempdir().expect("tempdir");
        let access = users_file_access(dir.path(), anonymous, accounts);
        Self::start_with(|c| c.security.anonymous = anonymous, access).await
    }

    /// Starts a broker after `tweak` adjusted the test configuration.
    pub async fn start_with(
        tweak: impl FnOnce(&mut Config),
        access: Arc<dyn AccessControl>,
    ) -> TestBroker {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        let mut config = test_config(dir.path());
        tweak(&mut config);
        let broker = server::start(config.clone(), Arc::clone(&access))
            .await
            .expect("broker starts");
        TestBroker {
            broker: Some(broker),
            dir,
            config,
            access,
        }
    }

    fn running(&self) -> &RunningBroker {
        self.broker.as_ref().expect("broker running")
    }

    pub fn addr(&self, kind: ListenerKind) -> SocketAddr {
        self.running().local_addr(kind).expect("listener bound")
    }

    pub fn mqtt(&self) -> SocketAddr {
        self.addr(ListenerKind::Mqtt)
    }

    pub fn stomp(&self) -> SocketAddr {
        self.addr(ListenerKind::Stomp)
    }

    pub fn amqp(&self) -> SocketAddr {
        self.addr(ListenerKind::Amqp)
    }

    pub fn core(&self) -> &rosetta::core::Core {
        self.running().core()
    }

    /// The Prometheus exposition, as `GET /metrics` serves it.
    pub fn metrics(&self) -> String {
        self.running().metrics()
    }

    /// `(depth, in_flight)` of queue `q`, or `None` if it does not exist.
    pub fn queue(&self, q: &str) -> Option<(u64, u64)> {
        self.core().queue_stats(q).map(|s| (s.depth, s.in_flight))
    }

    /// `(depth, in_flight)` of queue `q`; `(0, 0)` if it does not exist.
    pub fn depth(&self, q: &str) -> (u64, u64) {
        self.queue(q).unwrap_or((0, 0))
    }

    pub fn data_dir(&self) -> PathBuf {
        self.config.data_dir.clone()
    }

    /// Graceful shutdown, then a new broker on the same data directory and
    /// (so clients can reconnect to the same address) the same ports.
    pub async fn restart(&mut self) {
        let old = self.broker.take().expect("broker running");
        for (kind, slot) in [
            (ListenerKind::Mqtt, &mut self.config.listeners.mqtt),
            (ListenerKind::Stomp, &mut self.config.listeners.stomp),
            (ListenerKind::Amqp, &mut self.config.listeners.amqp),
        ] {
            if let (Some(addr), Some(_)) = (old.local_addr(kind), slot.as_ref()) {
                *slot = Some(ListenAddr::new("127.0.0.1", addr.port()));
            }
        }
        old.shutdown().await.expect("clean shutdown");
        let broker = server::start(self.config.clone(), Arc::clone(&self.access))
            .await
            .expect("broker restarts");
        self.broker = Some(broker);
    }

    pub async fn stop(mut self) {
        if let Some(b) = self.broker.take() {
            b.shutdown().await.expect("clean shutdown");
        }
    }
}

/// One HTTP/1.1 request on a fresh connection; the whole answer.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(mqtt::WAIT, s.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

pub mod amqp;
pub mod journal_model;
pub mod mqtt;
pub mod pki;
pub mod process;
pub mod stomp;
pub mod ws;
