//! Three Rosetta nodes (the broker binary, each with its own config on
//! free loopback ports) and one etcd: membership, MQTT 5 and AMQP
//! redirects to the node a key hashes to, a node killed with SIGKILL
//! leaving the pool with only its keys moving, and the quorum rule.
//!
//! Skipped loudly without etcd unless `ROSETTA_REQUIRE_ETCD` is set
//! (`scripts/test.sh` sets it).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::mqtt::Raw;
use common::process::BrokerProcess;
use fe2o3_amqp::types::definitions::{ConnectionError, ErrorCondition};
use rosetta_cluster::balancer::ring::Ring;
use rosetta_cluster::testing::EtcdServer;
use rumqttc::v5::mqttbytes::v5 as p5;

/// Lease TTL of the test nodes: short, so a killed node leaves soon.
const LEASE_TTL_S: u64 = 2;
/// Points per node on the ring, as the nodes are configured.
const VIRTUAL_NODES: u32 = 160;
/// How long the cluster gets to settle (nodes registering, first checks).
const SETTLE: Duration = Duration::from_secs(15);

struct Node {
    name: &'static str,
    process: BrokerProcess,
    _dir: tempfile::TempDir,
}

impl Node {
    fn start(name: &'static str, etcd: &str, balancer: &str, security: &str) -> Node {
        Self::start_with(name, etcd, balancer, security, &["mqtt", "amqp", "stomp"])
    }

    fn start_with(
        name: &'static str,
        etcd: &str,
        balancer: &str,
        security: &str,
        listeners: &[&str],
    ) -> Node {
        let dir = tempfile::tempdir().expect("dir");
        let extra = format!(
            "{security}\n[cluster]\netcd = [\"{etcd}\"]\nnode_name = \"{name}\"\nlease_ttl_s = {LEASE_TTL_S}\nhealth_check_interval_ms = 200\nhealth_check_timeout_ms = 300\n[cluster.balancer]\nvirtual_nodes = {VIRTUAL_NODES}\n{balancer}\n"
        );
        let process = BrokerProcess::start(dir.path(), listeners, &extra);
        Node {
            name,
            process,
            _dir: dir,
        }
    }

    fn mqtt(&self) -> SocketAddr {
        self.process.addr("mqtt")
    }

    fn amqp(&self) -> SocketAddr {
        self.process.addr("amqp")
    }
}

/// The CONNACK a clean v5 CONNECT with `id` gets from `addr`.
async fn connack5(addr: SocketAddr, id: &str) -> p5::ConnAck {
    connack5_as(addr, id, None).await
}

/// [`connack5`], logged in as `user` (password `pw`) when given.
async fn connack5_as(addr: SocketAddr, id: &str, user: Option<&str>) -> p5::ConnAck {
    clean_connack5(Raw::open(addr).await, id, user).await
}

/// The CONNACK a clean v5 CONNECT with `id` (as `user`, password `pw`,
/// when given) gets on `raw`, which is then closed.
async fn clean_connack5(mut raw: Raw, id: &str, user: Option<&str>) -> p5::ConnAck {
    let login = user.map(|u| p5::Login::new(u, "pw"));
    let connect = common::mqtt::connect5_packet(id, true, None);
    raw.send5(p5::Packet::Connect(connect, None, login)).await;
    let ack = match raw.recv5().await {
        p5::Packet::ConnAck(ack) => ack,
        other => panic!("expected CONNACK, got {other:?}"),
    };
    raw.shutdown().await;
    ack
}

fn server_reference(ack: &p5::ConnAck) -> Option<String> {
    ack.properties.as_ref()?.server_reference.clone()
}

/// Where `node` sends client `id`: its own name, or the node whose MQTT
/// address the Server Reference names.
async fn placed(node: &Node, nodes: &[&Node], id: &str) -> String {
    placed_as(node, nodes, id, None).await
}

/// [`placed`], logged in as `user` when given.
async fn placed_as(node: &Node, nodes: &[&Node], id: &str, user: Option<&str>) -> String {
    let ack = connack5_as(node.mqtt(), id, user).await;
    match ack.code {
        p5::ConnectReturnCode::Success => node.name.to_owned(),
        p5::ConnectReturnCode::UseAnotherServer => {
            let reference = server_reference(&ack).expect("a redirect names the server");
            nodes
                .iter()
                .find(|n| n.mqtt().to_string() == reference)
                .map(|n| n.name.to_owned())
                .unwrap_or_else(|| {
                    panic!(
                        "{reference} is no node's MQTT address: {:?}",
                        nodes
                            .iter()
                            .map(|n| (n.name, n.mqtt(), n.amqp()))
                            .collect::<Vec<_>>()
                    )
                })
        }
        other => format!("refused:{other:?}"),
    }
}

/// Waits until `ok` holds, or fails saying `what`.
async fn eventually<F, Fut>(what: &str, timeout: Duration, mut ok: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ok().await {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within {timeout:?}");
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("device-{i}")).collect()
}

/// Every id of `ids` placed by `node` as `ring` says.
async fn all_placed_by_ring(node: &Node, nodes: &[&Node], ring: &Ring, ids: &[String]) -> bool {
    for id in ids {
        let owner = ring.owner(id).expect("ring");
        if placed(node, nodes, id).await != owner {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_clients_are_redirected_to_their_node_and_a_killed_node_moves_only_its_keys() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let a = Node::start("a", &etcd.endpoint, "", "");
    let b = Node::start("b", &etcd.endpoint, "", "");
    let mut c = Node::start("c", &etcd.endpoint, "", "");
    let ring = Ring::new(["a", "b", "c"], VIRTUAL_NODES);
    let sample = ids(30);
    {
        let nodes = [&a, &b, &c];
        // Every node answers as the ring of all three says.
        for node in nodes {
            eventually("the three nodes see each other", SETTLE, || {
                all_placed_by_ring(node, &nodes, &ring, &sample)
            })
            .await;
        }
    }

    // A client id that hashes to b, connecting to a: 0x9C with b's
    // address; following it, b takes the client.
    let to_b = sample
        .iter()
        .find(|id| ring.owner(id) == Some("b"))
        .expect("some id hashes to b");
    let ack = connack5(a.mqtt(), to_b).await;
    assert_eq!(ack.code, p5::ConnectReturnCode::UseAnotherServer);
    assert_eq!(server_reference(&ack), Some(b.mqtt().to_string()));
    let opts = rumqttc::v5::MqttOptions::new(to_b.as_str(), "127.0.0.1", b.mqtt().port());
    let (client, mut events) = rumqttc::v5::AsyncClient::new(opts, 10);
    let first = tokio::time::timeout(Duration::from_secs(5), events.poll())
        .await
        .expect("b answers")
        .expect("b accepts the client");
    assert!(
        matches!(
            first,
            rumqttc::v5::Event::Incoming(rumqttc::v5::Incoming::ConnAck(ref ack))
                if ack.code == p5::ConnectReturnCode::Success
        ),
        "{first:?}"
    );
    let _ = client.disconnect().await;

    // SIGKILL c: no revoke; it leaves the pool (health checks, then its
    // lease) and only its keys move, to a and b.
    let before: Vec<(String, &str)> = ids(200)
        .into_iter()
        .map(|id| {
            let owner = ring.owner(&id).expect("ring");
            (id, owner)
        })
        .collect();
    c.process.kill();
    let killed = Instant::now();
    let all = [&a, &b, &c];
    let c_key = before
        .iter()
        .find(|(_, o)| *o == "c")
        .map(|(id, _)| id.clone())
        .expect("some id on c");
    let gone = eventually("c leaves the pool", SETTLE, || async {
        let p = placed(&a, &all, &c_key).await;
        p == "a" || p == "b"
    })
    .await;
    assert!(
        killed.elapsed() <= Duration::from_secs(LEASE_TTL_S) + Duration::from_secs(2),
        "c left after {gone:?}, lease TTL {LEASE_TTL_S} s"
    );
    // Give its lease time to expire too, then check every key.
    tokio::time::sleep(Duration::from_millis(LEASE_TTL_S * 1000 + 500)).await;
    let mut moved = 0;
    for (id, owner) in &before {
        let now_on = placed(&a, &all, id).await;
        if *owner == "c" {
            assert!(now_on == "a" || now_on == "b", "{id} went to {now_on}");
            moved += 1;
        } else {
            assert_eq!(&now_on, owner, "{id} moved though its node lives");
        }
    }
    assert!(moved > 0, "c owned some keys");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_quorum_clients_are_told_the_server_is_unavailable() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let quorum = "quorum_size = 3";
    let a = Node::start("a", &etcd.endpoint, quorum, "");
    let b = Node::start("b", &etcd.endpoint, quorum, "");
    // Two of three: refused, v5 with 0x88, 3.1.1 with return code 3.
    let ack = connack5(a.mqtt(), "q1").await;
    assert_eq!(ack.code, p5::ConnectReturnCode::ServerUnavailable);
    let (raw, ack4) = Raw::connect4(a.mqtt(), "q1", true, 10).await;
    raw.shutdown().await;
    assert_eq!(ack4.code, rumqttc::ConnectReturnCode::ServiceUnavailable);
    // STOMP: an ERROR frame, then the connection closes.
    let answer = stomp_connect_answer(a.process.addr("stomp"), "q1");
    assert!(
        answer.starts_with("ERROR") && answer.contains("message:server unavailable"),
        "{answer}"
    );
    // A third node makes the quorum.
    let c = Node::start("c", &etcd.endpoint, quorum, "");
    let nodes = [&a, &b, &c];
    eventually("the quorum is reached", SETTLE, || async {
        !placed(&a, &nodes, "q1").await.starts_with("refused")
    })
    .await;
}

/// Everything a STOMP server answers to a CONNECT with `client-id`, up
/// to its closing the connection.
fn stomp_connect_answer(addr: SocketAddr, client_id: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let connect = common::process::frame(
        "CONNECT",
        &[
            ("accept-version", "1.2"),
            ("host", "h"),
            ("client-id", client_id),
        ],
        b"",
    );
    s.write_all(&connect).expect("write");
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A users file with `users` (password `pw` each), and the `[security]`
/// section that uses it.
fn users(dir: &Path, users: &[String]) -> String {
    let path = dir.join("users.toml");
    for u in users {
        rosetta::server::users::add_user(&path, u, b"pw", None, None).expect("add user");
    }
    format!("[security]\nanonymous = false\nusers_file = {path:?}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_clients_are_redirected_by_user_name() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let ring = Ring::new(["a", "b", "c"], VIRTUAL_NODES);
    let names: Vec<String> = (0..12).map(|i| format!("user{i}")).collect();
    let to_b = names
        .iter()
        .find(|u| ring.owner(u) == Some("b"))
        .expect("a user on b")
        .clone();
    let on_a = names
        .iter()
        .find(|u| ring.owner(u) == Some("a"))
        .expect("a user on a")
        .clone();
    let shared = tempfile::tempdir().expect("dir");
    let security = users(shared.path(), &[to_b.clone(), on_a.clone()]);
    let by_user = "key = \"user_name\"";
    let a = Node::start("a", &etcd.endpoint, by_user, &security);
    let b = Node::start("b", &etcd.endpoint, by_user, &security);
    let c = Node::start("c", &etcd.endpoint, by_user, &security);
    let _ = &c;
    let url = |addr: SocketAddr, user: &str| format!("amqp://{user}:pw@{addr}");
    let expected_port = u64::from(b.amqp().port());
    eventually("a redirects the user of b", SETTLE, || {
        let url = url(a.amqp(), &to_b);
        async move {
            match amqp_refusal(&url).await {
                Some(e) => redirect_port(e) == expected_port,
                // Not settled yet: served here.
                None => false,
            }
        }
    })
    .await;
    // Following the redirect works, and a's own user stays on a.
    let mut there = fe2o3_amqp::Connection::open("followed", url(b.amqp(), &to_b).as_str())
        .await
        .expect("b takes its user");
    there.close().await.expect("close");
    let mut here = fe2o3_amqp::Connection::open("local", url(a.amqp(), &on_a).as_str())
        .await
        .expect("a keeps its user");
    here.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_clients_are_redirected_by_the_role_of_their_user() {
    use rosetta::server::users::{save_user, AdminRole};
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let ring = Ring::new(["a", "b", "c"], VIRTUAL_NODES);
    let shared = tempfile::tempdir().expect("dir");
    let users_file = shared.path().join("users.toml");
    for (user, roles) in [
        ("watcher", &[AdminRole::Monitoring][..]),
        ("manager", &[AdminRole::Management][..]),
        ("nobody", &[][..]),
    ] {
        save_user(&users_file, user, b"pw", None, None, Some(roles)).expect("user");
    }
    // A user holding two roles is placed by the first its entry lists,
    // not by the weakest (as before roles kept their order): a stronger
    // built-in role listed before a weaker one whose owner differs, and a
    // defined role listed before a built-in one.
    let owner = |role: &str| ring.owner(role).expect("ring").to_owned();
    let (first, second) = [
        ("management", "monitoring"),
        ("administrator", "monitoring"),
        ("administrator", "management"),
    ]
    .into_iter()
    .find(|(a, b)| owner(a) != owner(b))
    .expect("three built-in names on three nodes: two differ");
    let defined = (1..100)
        .map(|i| format!("line-{i}"))
        .find(|r| owner(r) != owner("monitoring"))
        .expect("a name owned elsewhere");
    let spec = rosetta::server::users::RoleSpec::default();
    rosetta::server::users::save_role(&users_file, &defined, &spec).expect("role");
    for (user, roles) in [
        ("both", [first.to_owned(), second.to_owned()]),
        ("plant", [defined.clone(), "monitoring".to_owned()]),
    ] {
        let spec = rosetta::server::users::PermissionSpec::default();
        rosetta::server::users::save_user_with(&users_file, user, b"pw", &spec, Some(&roles[..]))
            .expect("user");
    }
    let security = format!("[security]\nanonymous = false\nusers_file = {users_file:?}\n");
    let by_role = "key = \"role_name\"";
    let a = Node::start("a", &etcd.endpoint, by_role, &security);
    let b = Node::start("b", &etcd.endpoint, by_role, &security);
    let c = Node::start("c", &etcd.endpoint, by_role, &security);
    let nodes = [&a, &b, &c];
    // Whatever the client id (each hashes elsewhere), a user is sent to
    // the node its (first) role hashes to, from every node.
    for node in nodes {
        eventually("each user is placed by its role", SETTLE, || async {
            for (user, role) in [
                ("watcher", "monitoring"),
                ("manager", "management"),
                ("both", first),
                ("plant", defined.as_str()),
            ] {
                for id in ["r-1", "r-2", "r-3", "r-4"] {
                    if placed_as(node, &nodes, id, Some(user)).await != owner(role) {
                        return false;
                    }
                }
            }
            true
        })
        .await;
        // A user without roles has no key: served where it connected.
        assert_eq!(
            placed_as(node, &nodes, "r-1", Some("nobody")).await,
            node.name
        );
    }
}

/// The error a connection to `url` is closed with at once, if it is: at
/// open, or (fe2o3-amqp returns from open on the server's Open, before the
/// Close behind it) right after.
async fn amqp_refusal(url: &str) -> Option<fe2o3_amqp::types::definitions::Error> {
    refusal_of(fe2o3_amqp::Connection::open("redirected", url).await).await
}

/// The error an opening connection is closed with at once, if it is (see
/// [`amqp_refusal`]).
async fn refusal_of(
    opened: Result<fe2o3_amqp::connection::ConnectionHandle<()>, fe2o3_amqp::connection::OpenError>,
) -> Option<fe2o3_amqp::types::definitions::Error> {
    match opened {
        Err(fe2o3_amqp::connection::OpenError::RemoteClosedWithError(e)) => Some(e),
        Err(e) => panic!("unexpected open error: {e:?}"),
        Ok(mut conn) => {
            match tokio::time::timeout(Duration::from_millis(500), conn.on_close()).await {
                Ok(Err(fe2o3_amqp::connection::Error::RemoteClosedWithError(e))) => Some(e),
                Ok(other) => panic!("closed without an error: {other:?}"),
                Err(_) => {
                    let _ = conn.close().await;
                    None
                }
            }
        }
    }
}

/// The port of an `amqp:connection:redirect` error, after checking its
/// condition and info fields (AMQP 1.0 §2.8.17).
fn redirect_port(e: fe2o3_amqp::types::definitions::Error) -> u64 {
    assert_eq!(
        e.condition,
        ErrorCondition::ConnectionError(ConnectionError::Redirect),
        "{:?}",
        e.description
    );
    let info = e.info.expect("redirect info");
    let field = |k: &str| {
        info.iter()
            .find(|(key, _)| key.as_str() == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        field("network-host"),
        Some(serde_amqp::Value::String("127.0.0.1".into()))
    );
    assert!(field("hostname").is_some(), "hostname");
    match field("port") {
        Some(serde_amqp::Value::Uint(p)) => u64::from(p),
        other => panic!("port: {other:?}"),
    }
}

/// Host names the test certificate is issued for, one per tenant.
fn tenant_names() -> Vec<String> {
    (0..12).map(|i| format!("t{i}.cluster.test")).collect()
}

/// A self-signed certificate for every tenant name, written into `dir`;
/// the `[tls]` section serving it, and a client configuration trusting it.
fn tenant_tls(dir: &Path) -> (String, std::sync::Arc<rustls::ClientConfig>) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(tenant_names())
        .expect("params")
        .self_signed(&key)
        .expect("self-signed");
    let (cert_file, key_file) = (dir.join("tenants.pem"), dir.join("tenants.key"));
    std::fs::write(&cert_file, cert.pem()).expect("cert");
    std::fs::write(&key_file, key.serialize_pem()).expect("key");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).expect("root");
    let client = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let section = format!("[tls]\ncert_file = {cert_file:?}\nkey_file = {key_file:?}\n");
    (section, std::sync::Arc::new(client))
}

/// The CONNACK a clean v5 CONNECT gets over TLS to `addr`, asking for
/// `sni` in the handshake.
async fn connack5_tls(
    addr: SocketAddr,
    sni: &str,
    client: &std::sync::Arc<rustls::ClientConfig>,
) -> p5::ConnAck {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("tcp");
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(client.clone())
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    let mut out = bytes::BytesMut::new();
    p5::Packet::Connect(
        common::mqtt::connect5_packet("tls-client", true, None),
        None,
        None,
    )
    .write(&mut out, None)
    .expect("encode");
    tls.write_all(&out).await.expect("write");
    let mut buf = bytes::BytesMut::new();
    loop {
        match p5::Packet::read(&mut buf, None) {
            Ok(p5::Packet::ConnAck(ack)) => return ack,
            Ok(other) => panic!("expected CONNACK, got {other:?}"),
            Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => {
                let mut chunk = [0u8; 4096];
                let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut chunk))
                    .await
                    .expect("an answer")
                    .expect("read");
                assert!(n > 0, "closed before CONNACK");
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(e) => panic!("undecodable: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_are_redirected_by_sni_host_to_the_same_listener_kind() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let shared = tempfile::tempdir().expect("dir");
    let (tls, client) = tenant_tls(shared.path());
    let by_sni = "key = \"sni_host\"";
    let listeners = ["mqtt", "mqtts", "amqp", "stomp"];
    let a = Node::start_with("a", &etcd.endpoint, by_sni, &tls, &listeners);
    let b = Node::start_with("b", &etcd.endpoint, by_sni, &tls, &listeners);
    let ring = Ring::new(["a", "b"], VIRTUAL_NODES);
    let names = tenant_names();
    let to_b = names
        .iter()
        .find(|n| ring.owner(n) == Some("b"))
        .expect("a tenant on b");
    let on_a = names
        .iter()
        .find(|n| ring.owner(n) == Some("a"))
        .expect("a tenant on a");
    let b_mqtts = b.process.addr("mqtts").to_string();
    eventually(
        "a sends b's tenant to b's mqtts listener",
        SETTLE,
        || async {
            let ack = connack5_tls(a.process.addr("mqtts"), to_b, &client).await;
            ack.code == p5::ConnectReturnCode::UseAnotherServer
                && server_reference(&ack).as_deref() == Some(b_mqtts.as_str())
        },
    )
    .await;
    let there = connack5_tls(b.process.addr("mqtts"), to_b, &client).await;
    assert_eq!(there.code, p5::ConnectReturnCode::Success);
    let here = connack5_tls(a.process.addr("mqtts"), on_a, &client).await;
    assert_eq!(here.code, p5::ConnectReturnCode::Success);
    // Without TLS there is no SNI, hence no key: served where it connects.
    assert_eq!(
        connack5(a.mqtt(), "plain").await.code,
        p5::ConnectReturnCode::Success
    );
}

/// Ids of `ids(40)` that the ring of a, b and c puts on `node`.
fn ids_on(ring: &Ring, node: &str, n: usize) -> Vec<String> {
    let on: Vec<String> = ids(40)
        .into_iter()
        .filter(|id| ring.owner(id) == Some(node))
        .take(n)
        .collect();
    assert_eq!(on.len(), n, "enough ids on {node}");
    on
}

/// Three nodes with the proxy on, settled: every node places by the ring.
async fn proxy_cluster(etcd: &EtcdServer, balancer: &str) -> (Node, Node, Node, Ring) {
    proxy_cluster_with(etcd, balancer, &["mqtt", "amqp", "stomp"]).await
}

/// [`proxy_cluster`] with these listeners (`mqtt` among them).
async fn proxy_cluster_with(
    etcd: &EtcdServer,
    balancer: &str,
    listeners: &[&str],
) -> (Node, Node, Node, Ring) {
    let balancer = format!("proxy = true\n{balancer}");
    let a = Node::start_with("a", &etcd.endpoint, &balancer, "", listeners);
    let b = Node::start_with("b", &etcd.endpoint, &balancer, "", listeners);
    let c = Node::start_with("c", &etcd.endpoint, &balancer, "", listeners);
    let ring = Ring::new(["a", "b", "c"], VIRTUAL_NODES);
    let sample = ids(40);
    {
        let nodes = [&a, &b, &c];
        for node in nodes {
            eventually("the three nodes see each other", SETTLE, || {
                all_placed_by_ring(node, &nodes, &ring, &sample)
            })
            .await;
        }
    }
    (a, b, c, ring)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stomp_client_that_belongs_elsewhere_is_proxied_to_its_node() {
    use common::stomp::StompClient;
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let (a, b, _c, ring) = proxy_cluster(&etcd, "").await;
    let to_b = ids_on(&ring, "b", 2);
    // Only b's queue holds this message (no client-id: no key, served
    // where it connects).
    let mut on_b = StompClient::connect(b.process.addr("stomp"), &[]).await;
    on_b.send_persistent("/queue/only-on-b", &[], b"held by b")
        .await;

    // A client whose id belongs on b, connecting to a, is served by b.
    let mut proxied =
        StompClient::connect(a.process.addr("stomp"), &[("client-id", &to_b[0])]).await;
    proxied
        .subscribe("s1", "/queue/only-on-b", "client-individual", &[])
        .await;
    let m = proxied.message().await;
    assert_eq!(m.text(), "held by b");
    // Publishing through the proxy reaches b.
    on_b.subscribe("s2", "/queue/from-proxied", "auto", &[])
        .await;
    proxied
        .send_persistent("/queue/from-proxied", &[], b"via a")
        .await;
    assert_eq!(on_b.message().await.text(), "via a");

    // The client's close closes its connection on b: the message it holds
    // unacknowledged goes back to b's queue, to b's own consumer.
    drop(proxied);
    on_b.subscribe("s3", "/queue/only-on-b", "auto", &[]).await;
    assert_eq!(on_b.message().await.text(), "held by b");

    // b's close reaches the client: a bad frame gets b's ERROR, then the
    // connection closes end to end.
    let mut proxied =
        StompClient::connect(a.process.addr("stomp"), &[("client-id", &to_b[1])]).await;
    proxied.send_raw(b"NOT-A-COMMAND\n\n\0").await;
    proxied.expect_error_then_close().await;

    // Only a member of the cluster may speak for a client: a PROXY header
    // from another address (127.0.0.2; the nodes publish 127.0.0.1) gets
    // the connection closed, CONNECT unanswered.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.2:0".parse().expect("addr"))
        .expect("bind 127.0.0.2");
    let stream = socket.connect(b.process.addr("stomp")).await.expect("tcp");
    let mut forged = StompClient::from_stream(stream);
    let header = rosetta_cluster::proxy_header::encode(
        "10.9.8.7:1234".parse().expect("addr"),
        b.process.addr("stomp"),
    );
    forged.send_raw(&header).await;
    let _ = forged
        .try_send_raw(&common::stomp::encode(
            "CONNECT",
            &[("accept-version", "1.2")],
            b"",
        ))
        .await;
    forged.expect_closed().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt_311_client_that_belongs_elsewhere_is_proxied_to_its_node() {
    use common::mqtt::{next4, wait4};
    use rumqttc::{AsyncClient, MqttOptions, Packet, QoS};
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let (a, b, _c, ring) = proxy_cluster(&etcd, "").await;
    let to_b = ids_on(&ring, "b", 4);
    let opts = |node: &Node, id: &str| {
        let mut o = MqttOptions::new(id, "127.0.0.1", node.mqtt().port());
        o.set_keep_alive(Duration::from_secs(10));
        o
    };
    // b's own client: a retained message only b holds, and a watcher of
    // what proxied clients publish and leave behind.
    let (watcher, mut watch) = AsyncClient::new(opts(&b, &to_b[0]), 16);
    watcher
        .publish("t/only-on-b", QoS::AtLeastOnce, true, "held by b")
        .await
        .expect("publish");
    for filter in ["t/back", "will/#"] {
        watcher
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        wait4(&mut watch, |p| matches!(p, Packet::SubAck(_)).then_some(())).await;
    }

    // A client whose id belongs on b, connecting to a, is served by b: it
    // gets b's retained message, and what it publishes reaches b.
    let (p1, mut p1_events) = AsyncClient::new(opts(&a, &to_b[1]), 16);
    p1.subscribe("t/only-on-b", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    let retained = wait4(&mut p1_events, |p| match p {
        Packet::Publish(p) => Some(p.payload.clone()),
        _ => None,
    })
    .await;
    assert_eq!(&retained[..], b"held by b");
    p1.publish("t/back", QoS::AtLeastOnce, false, "via a")
        .await
        .expect("publish");
    wait4(&mut p1_events, |p| {
        matches!(p, Packet::PubAck(_)).then_some(())
    })
    .await;
    let got = wait4(&mut watch, |p| match p {
        Packet::Publish(p) if p.topic == "t/back" => Some(p.payload.clone()),
        _ => None,
    })
    .await;
    assert_eq!(&got[..], b"via a");

    // A client's socket closes without DISCONNECT: b sees its connection
    // end and publishes the will.
    let mut with_will = rumqttc::mqttbytes::v4::Connect::new(to_b[2].as_str());
    with_will.keep_alive = 10;
    with_will.last_will = Some(rumqttc::mqttbytes::v4::LastWill::new(
        "will/p1",
        b"p1 gone".to_vec(),
        QoS::AtLeastOnce,
        false,
    ));
    let (raw, ack) = Raw::connect4_with(a.mqtt(), with_will).await;
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
    drop(raw);
    let will = wait4(&mut watch, |p| match p {
        Packet::Publish(p) if p.topic == "will/p1" => Some(p.payload.clone()),
        _ => None,
    })
    .await;
    assert_eq!(&will[..], b"p1 gone");

    // b closes a proxied client (taken over by the same id on b): the
    // client's connection through a ends too.
    let (_p2, mut p2_events) = AsyncClient::new(opts(&a, &to_b[3]), 16);
    let ack = common::mqtt::connack4(&mut p2_events).await;
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
    let (_taker, mut taker_events) = AsyncClient::new(opts(&b, &to_b[3]), 16);
    common::mqtt::connack4(&mut taker_events).await;
    // Any packet but a close would be a PINGRESP 10 s on; next4 gives 5.
    let closed = next4(&mut p2_events).await;
    assert!(
        closed.is_err(),
        "the proxied client was not closed: {closed:?}"
    );
}

/// `GET path` on an admin API as `user` (password `pw`): the status and
/// the JSON body.
fn admin_get(addr: SocketAddr, path: &str, user: &str) -> (u16, serde_json::Value) {
    use base64ct::Encoding;
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let credentials = base64ct::Base64::encode_string(format!("{user}:pw").as_bytes());
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Basic {credentials}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes()).expect("write");
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("JSON ({e}): {text}"));
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_discovery_route_answers_the_node_a_key_belongs_to() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let shared = tempfile::tempdir().expect("dir");
    let users_file = shared.path().join("users.toml");
    rosetta::server::users::save_user(
        &users_file,
        "watcher",
        b"pw",
        None,
        None,
        Some(&[rosetta::server::users::AdminRole::Monitoring]),
    )
    .expect("user");
    let security =
        format!("[security]\nusers_file = {users_file:?}\n[admin]\nlisten = \"127.0.0.1:0\"\n");
    let listeners = ["mqtt", "stomp", "websocket", "admin"];
    let quorum = "quorum_size = 3";
    let a = Node::start_with("a", &etcd.endpoint, quorum, &security, &listeners);
    let b = Node::start_with("b", &etcd.endpoint, quorum, &security, &listeners);
    let mut c = Node::start_with("c", &etcd.endpoint, quorum, &security, &listeners);
    let ring = Ring::new(["a", "b", "c"], VIRTUAL_NODES);
    let nodes = [&a, &b, &c];
    let api = a.process.addr("admin");
    let sample = ids(20);
    let path = |key: &str, query: &str| format!("/api/v1/balancer/target?key={key}{query}");
    // Every key is answered with its node's address, for the listener
    // the protocol and transport name.
    eventually("a answers every key as the ring says", SETTLE, || async {
        sample.iter().all(|id| {
            let (status, body) = admin_get(api, &path(id, ""), "watcher");
            status == 200 && body["node"] == ring.owner(id).expect("ring")
        })
    })
    .await;
    for id in &sample {
        let owner = nodes
            .iter()
            .find(|n| Some(n.name) == ring.owner(id))
            .expect("owner");
        let (status, body) = admin_get(api, &path(id, "&protocol=mqtt&transport=ws"), "watcher");
        assert_eq!(status, 200, "{body}");
        let ws = owner.process.addr("websocket");
        assert_eq!(
            (
                body["host"].as_str(),
                body["port"].as_u64(),
                body["protocol"].as_str(),
                body["transport"].as_str()
            ),
            (
                Some("127.0.0.1"),
                Some(u64::from(ws.port())),
                Some("mqtt"),
                Some("ws")
            ),
            "{id}: {body}"
        );
        let (_, body) = admin_get(api, &path(id, "&protocol=stomp"), "watcher");
        assert_eq!(
            body["port"].as_u64(),
            Some(u64::from(owner.process.addr("stomp").port())),
            "{body}"
        );
    }
    // A transport no listener serves: 400; no key: 400.
    let (status, body) = admin_get(api, &path("x", "&transport=udp"), "watcher");
    assert_eq!(status, 400, "{body}");
    let (status, _) = admin_get(api, "/api/v1/balancer/target", "watcher");
    assert_eq!(status, 400);
    // Below the quorum: 503 with the JSON error.
    c.process.kill();
    eventually("a drops below its quorum", SETTLE, || async {
        admin_get(api, &path("device-1", ""), "watcher").0 == 503
    })
    .await;
    let (_, body) = admin_get(api, &path("device-1", ""), "watcher");
    assert_eq!(body["error"], "unavailable", "{body}");

    // Without [cluster] there is no balancer: 404.
    let single_dir = tempfile::tempdir().expect("dir");
    let single = BrokerProcess::start(single_dir.path(), &["mqtt", "admin"], &security);
    let (status, body) = admin_get(single.addr("admin"), &path("x", ""), "watcher");
    assert_eq!(status, 404, "{body}");
}

/// MQTT over WebSocket, as browsers and mqtt.js speak it.
const MQTT_WS: common::ws::Wire = common::ws::Wire::Ws {
    path: "/mqtt",
    subprotocol: "mqtt",
    text: false,
};

/// A client's stream over a WebSocket to `node`'s `websocket` listener.
async fn websocket(node: &Node, wire: common::ws::Wire) -> tokio::io::DuplexStream {
    let tcp = tokio::net::TcpStream::connect(node.process.addr("websocket"))
        .await
        .expect("connect");
    common::ws::carry(tcp, wire).await
}

/// Nodes a, b and c on `etcd`, default balancer, each with `listeners`.
fn three_nodes(etcd: &EtcdServer, listeners: &[&str]) -> (Node, Node, Node) {
    let start = |name| Node::start_with(name, &etcd.endpoint, "", "", listeners);
    (start("a"), start("b"), start("c"))
}

/// The CONNACK a clean v5 CONNECT with `id` gets over a WebSocket to `node`.
async fn connack5_ws(node: &Node, id: &str) -> p5::ConnAck {
    clean_connack5(Raw::from_io(websocket(node, MQTT_WS).await), id, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_over_websocket_is_redirected_to_the_target_websocket_listener() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let (a, b, _c) = three_nodes(&etcd, &["mqtt", "websocket"]);
    let ring = Ring::new(["a", "b", "c"], VIRTUAL_NODES);
    let to_b = ids_on(&ring, "b", 1).remove(0);
    let on_a = ids_on(&ring, "a", 1).remove(0);
    let b_ws = b.process.addr("websocket").to_string();
    eventually(
        "a sends b's client to b's websocket listener",
        SETTLE,
        || async {
            let ack = connack5_ws(&a, &to_b).await;
            ack.code == p5::ConnectReturnCode::UseAnotherServer
                && server_reference(&ack).as_deref() == Some(b_ws.as_str())
        },
    )
    .await;
    // The reference followed, over WebSocket: b takes it; a keeps its own.
    assert_eq!(
        connack5_ws(&b, &to_b).await.code,
        p5::ConnectReturnCode::Success
    );
    assert_eq!(
        connack5_ws(&a, &on_a).await.code,
        p5::ConnectReturnCode::Success
    );
}

const AMQP_WS: common::ws::Wire = common::ws::Wire::Ws {
    path: "/amqp",
    subprotocol: "amqp",
    text: false,
};

/// The redirect an AMQP client with container id `id` gets over a
/// WebSocket to `node`, if any (as [`amqp_refusal`]).
async fn amqp_ws_refusal(node: &Node, id: &str) -> Option<fe2o3_amqp::types::definitions::Error> {
    let io = websocket(node, AMQP_WS).await;
    let opened = fe2o3_amqp::Connection::builder()
        .container_id(id)
        .open_with_stream(io)
        .await;
    refusal_of(opened).await
}

/// AMQP over WebSocket (fe2o3-amqp on the `amqp` subprotocol): a client
/// whose container id hashes to b gets `amqp:connection:redirect` naming
/// b's `websocket` port, and b serves it there; a's own client stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_over_websocket_is_redirected_to_the_target_websocket_listener() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let (a, b, _c) = three_nodes(&etcd, &["amqp", "websocket"]);
    let ring = Ring::new(["a", "b", "c"], VIRTUAL_NODES);
    let to_b = ids_on(&ring, "b", 1).remove(0);
    let on_a = ids_on(&ring, "a", 1).remove(0);
    let b_ws = u64::from(b.process.addr("websocket").port());
    eventually(
        "a sends b's AMQP client to b's websocket listener",
        SETTLE,
        || async {
            amqp_ws_refusal(&a, &to_b)
                .await
                .is_some_and(|e| redirect_port(e) == b_ws)
        },
    )
    .await;
    assert!(amqp_ws_refusal(&b, &to_b).await.is_none(), "b serves it");
    assert!(
        amqp_ws_refusal(&a, &on_a).await.is_none(),
        "a keeps its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stomp_and_mqtt_311_over_websocket_are_proxied_to_their_node() {
    use common::mqtt::{p4, raw_subscribe4};
    use common::stomp::StompClient;
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let listeners = ["mqtt", "stomp", "websocket"];
    let (a, b, _c, ring) = proxy_cluster_with(&etcd, "", &listeners).await;
    let to_b = ids_on(&ring, "b", 2);
    // Only b holds these: a queued message and a retained one (clients
    // without a client id have no key and stay where they connect).
    let mut on_b = StompClient::connect(b.process.addr("stomp"), &[]).await;
    on_b.send_persistent("/queue/ws-only-on-b", &[], b"queued on b")
        .await;
    let (mut retain, _) = Raw::connect4(b.mqtt(), "", true, 10).await;
    let mut publish = p4::Publish::new("t/ws-only-on-b", rumqttc::QoS::AtMostOnce, "retained on b");
    publish.retain = true;
    retain.send4(p4::Packet::Publish(publish)).await;
    retain.shutdown().await;

    // STOMP over WebSocket (text frames, as stomp.js), connecting to a
    // with an id of b: served by b.
    let stomp_ws = common::ws::Wire::Ws {
        path: "/stomp",
        subprotocol: "v12.stomp",
        text: true,
    };
    let mut stomp = StompClient::from_io(websocket(&a, stomp_ws).await);
    let connected = stomp
        .handshake("1.2", &[("client-id", to_b[0].as_str())])
        .await;
    assert_eq!(connected.command, "CONNECTED", "{connected:?}");
    stomp
        .subscribe("s1", "/queue/ws-only-on-b", "auto", &[])
        .await;
    assert_eq!(stomp.message().await.text(), "queued on b");

    // MQTT 3.1.1 over WebSocket, the same: b's retained message.
    let mut mqtt = Raw::from_io(websocket(&a, MQTT_WS).await);
    let mut connect = p4::Connect::new(to_b[1].as_str());
    connect.keep_alive = 10;
    mqtt.send4(p4::Packet::Connect(connect)).await;
    match mqtt.recv4().await {
        p4::Packet::ConnAck(ack) => assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    raw_subscribe4(&mut mqtt, 1, "t/ws-only-on-b", rumqttc::QoS::AtMostOnce).await;
    match mqtt.recv4().await {
        p4::Packet::Publish(p) => assert_eq!(&p.payload[..], b"retained on b"),
        other => panic!("expected the retained PUBLISH, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_with_a_balancer_of_its_own_places_by_its_policy() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    // MQTT over TCP: the default balancer (the ring by client id); over
    // WebSocket: its own, every client to the first node.
    let balancers =
        "[[cluster.balancers]]\nlisteners = [\"websocket\"]\npolicy = \"first_element\"";
    let listeners = ["mqtt", "websocket"];
    let a = Node::start_with("a", &etcd.endpoint, balancers, "", &listeners);
    let b = Node::start_with("b", &etcd.endpoint, balancers, "", &listeners);
    let c = Node::start_with("c", &etcd.endpoint, balancers, "", &listeners);
    let nodes = [&a, &b, &c];
    let ring = Ring::new(["a", "b", "c"], VIRTUAL_NODES);
    let sample = ids(12);
    let a_ws = a.process.addr("websocket").to_string();
    for node in [&b, &c] {
        eventually("TCP clients are placed by the ring", SETTLE, || {
            all_placed_by_ring(node, &nodes, &ring, &sample)
        })
        .await;
        // The same ids over WebSocket all go to a.
        for id in &sample {
            let ack = connack5_ws(node, id).await;
            assert_eq!(
                (ack.code, server_reference(&ack)),
                (p5::ConnectReturnCode::UseAnotherServer, Some(a_ws.clone())),
                "{id} over WebSocket to {}",
                node.name
            );
        }
    }
    for id in &sample {
        assert_eq!(
            connack5_ws(&a, id).await.code,
            p5::ConnectReturnCode::Success
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_cache_in_etcd_every_node_answers_the_same_for_a_key_while_it_lives() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    // No node takes clients itself and each picks the first other node by
    // name: left alone, a sends everyone to b, and c (and b) to a. The
    // shared cache makes c answer what a answered first, for as long as
    // the entry lives.
    // A quorum of 2 (the two other nodes) makes a node answer only once
    // it sees both: a settled c has b among its candidates, so the
    // choice it learns is one it can follow.
    let balancer = "policy = \"first_element\"\nlocal_target_enabled = false\nquorum_size = 2\ncache_timeout_ms = 6000\ncache_in_etcd = true";
    let a = Node::start_with("a", &etcd.endpoint, balancer, "", &["mqtt"]);
    let b = Node::start_with("b", &etcd.endpoint, balancer, "", &["mqtt"]);
    let c = Node::start_with("c", &etcd.endpoint, balancer, "", &["mqtt"]);
    let nodes = [&a, &b, &c];
    let mut fresh = 0;
    eventually("a places on b and c on a", SETTLE, || {
        fresh += 1;
        let id = format!("settle-{fresh}");
        let (a, c, nodes) = (&a, &c, &nodes);
        async move { placed(a, nodes, &id).await == "b" && placed(c, nodes, &id).await == "a" }
    })
    .await;
    assert_eq!(placed(&a, &nodes, "shared-key").await, "b");
    // a writes its choice after it answered; c asked before that would
    // choose by itself and race a for the entry (one of them wins).
    eventually("a's choice is in etcd", Duration::from_secs(5), || async {
        cache_entry(&etcd, "shared-key").await.as_deref() == Some("b")
    })
    .await;
    eventually("c answers as a did", Duration::from_secs(5), || async {
        placed(&c, &nodes, "shared-key").await == "b"
    })
    .await;
    for _ in 0..3 {
        assert_eq!(
            placed(&c, &nodes, "shared-key").await,
            "b",
            "while it lives"
        );
    }
    // Once the entry's lease expires, c chooses by itself again.
    eventually("the entry expires", SETTLE, || async {
        placed(&c, &nodes, "shared-key").await == "a"
    })
    .await;
}

/// The default balancer's entry for `key` in etcd (`cache_in_etcd`).
async fn cache_entry(etcd: &EtcdServer, key: &str) -> Option<String> {
    let (_, kvs) = etcd_client(etcd)
        .range_prefix(format!("/rosetta/cache/default/{key}").as_bytes())
        .await
        .expect("etcd range");
    kvs.first()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
}

fn etcd_client(etcd: &EtcdServer) -> rosetta_cluster::etcd::Client {
    rosetta_cluster::etcd::Client::new(std::slice::from_ref(&etcd.endpoint), Duration::from_secs(2))
        .expect("client")
}

/// The connection counts the nodes publish in etcd, by node name.
async fn published_counts(etcd: &EtcdServer) -> std::collections::BTreeMap<String, u64> {
    let (_, kvs) = etcd_client(etcd)
        .range_prefix(b"/rosetta/nodes/")
        .await
        .expect("etcd range");
    rosetta_cluster::membership::targets_of(&kvs)
        .into_iter()
        .map(|t| (t.name, t.connections))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_client_is_counted_once_and_not_under_the_proxys_address() {
    use common::stomp::StompClient;
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    // One unauthenticated connection per address at a time.
    let capped = "[broker]\nunauthenticated_per_address_max = 1\n";
    let start = |name| {
        Node::start_with(
            name,
            &etcd.endpoint,
            "proxy = true",
            capped,
            &["mqtt", "stomp"],
        )
    };
    let (a, b, c) = (start("a"), start("b"), start("c"));
    let ring = Ring::new(["a", "b", "c"], VIRTUAL_NODES);
    let nodes = [&a, &b, &c];
    let sample = ids(20);
    for node in nodes {
        eventually("the three nodes see each other", SETTLE, || {
            all_placed_by_ring(node, &nodes, &ring, &sample)
        })
        .await;
    }
    let to_b = ids_on(&ring, "b", 1).remove(0);
    let mut on_b = StompClient::connect(b.process.addr("stomp"), &[]).await;
    on_b.send_persistent("/queue/capped", &[], b"held by b")
        .await;
    // b's cap for a's address is full: a socket from 127.0.0.1 (the
    // address every node on loopback has) that never logs in.
    let _idle = tokio::net::TcpStream::connect(b.process.addr("stomp"))
        .await
        .expect("idle socket");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A client whose id belongs on b, through a: b takes a's connection
    // for it all the same.
    let mut proxied = StompClient::connect_raw(a.process.addr("stomp")).await;
    let answer = proxied.handshake("1.2", &[("client-id", &to_b)]).await;
    assert_eq!(answer.command, "CONNECTED", "{answer:?}");
    proxied.subscribe("s1", "/queue/capped", "auto", &[]).await;
    assert_eq!(proxied.message().await.text(), "held by b");
    // It counts on b, which serves it, and not on a, which relays it:
    // least_connections sees it once.
    eventually("a publishes no connection, b both", SETTLE, || async {
        let counts = published_counts(&etcd).await;
        counts.get("a") == Some(&0) && counts.get("b") == Some(&2)
    })
    .await;
}

/// A node on a static pool (`[[cluster.targets]]`, no etcd), its own
/// entry among them.
fn start_static(name: &'static str, targets: &str, balancer: &str) -> Node {
    let dir = tempfile::tempdir().expect("dir");
    let extra = format!(
        "[cluster]\nnode_name = \"{name}\"\nhealth_check_interval_ms = 200\nhealth_check_timeout_ms = 300\n[cluster.balancer]\nvirtual_nodes = {VIRTUAL_NODES}\n{balancer}\n{targets}"
    );
    let process = BrokerProcess::start(dir.path(), &["mqtt", "amqp"], &extra);
    Node {
        name,
        process,
        _dir: dir,
    }
}

/// A static pool without etcd: `a` lists `b` with a live MQTT address
/// and an AMQP address nothing listens on. MQTT 5 clients whose id hashes
/// to `b` are redirected there; `b`'s silent AMQP address makes it no
/// candidate for AMQP clients, who all stay on `a`; once `b` is killed its
/// MQTT keys come to `a` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pool_is_health_checked_per_address() {
    // b's own list names only b (skipped): it serves everyone itself.
    let b_only = "[[cluster.targets]]\nname = \"b\"\naddresses = { mqtt = \"127.0.0.1:1\" }\n";
    let mut b = start_static("b", b_only, "");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_amqp = silent.local_addr().expect("addr");
    drop(silent);
    let targets = format!(
        "[[cluster.targets]]\nname = \"a\"\naddresses = {{ mqtt = \"127.0.0.1:1\" }}\n[[cluster.targets]]\nname = \"b\"\naddresses = {{ mqtt = \"{}\", amqp = \"{silent_amqp}\" }}\n",
        b.mqtt()
    );
    let a = start_static("a", &targets, "");
    let ring = Ring::new(["a", "b"], VIRTUAL_NODES);
    let on_b = ids_on(&ring, "b", 3);
    let on_a = ids_on(&ring, "a", 3);
    let nodes = [&a, &b];
    eventually("a redirects b's MQTT keys to b", SETTLE, || async {
        all_placed_by_ring(&a, &nodes, &ring, &on_b).await
    })
    .await;
    for id in &on_a {
        assert_eq!(placed(&a, &nodes, id).await, "a", "{id} stays on a");
    }
    // AMQP: b's address does not answer, so nobody is sent there.
    for id in &on_b {
        let url = format!("amqp://{}", a.amqp());
        let opened = fe2o3_amqp::Connection::builder()
            .container_id(id.as_str())
            .open(url.as_str())
            .await;
        match opened {
            Ok(mut c) => c.close().await.expect("close"),
            Err(e) => panic!("{id}: a refused an AMQP client b cannot take: {e:?}"),
        }
    }
    // b dies: its MQTT keys come to a.
    b.process.kill();
    eventually("b's MQTT keys come to a", SETTLE, || async {
        for id in &on_b {
            if connack5(a.mqtt(), id).await.code != p5::ConnectReturnCode::Success {
                return false;
            }
        }
        true
    })
    .await;
}
