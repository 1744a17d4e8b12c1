//! Issue 13, item 10: on a mutual-TLS connection the verified client
//! certificate says who the client is, on every protocol. A user name sent
//! next to it must be the certificate's user: alice's certificate with
//! bob's user name and password is refused (MQTT 3.1.1 CONNACK 5, MQTT 5
//! CONNACK 0x87, STOMP ERROR, AMQP sasl-outcome `auth`), whether or not
//! bob's password is right. The certificate with its own user's name and
//! password is accepted, and the password is checked: a wrong one is
//! refused like any wrong password. The certificate alone still works.
//!
//! Real clients over real mutual-TLS sockets: rumqttc (3.1.1 and 5),
//! fe2o3-amqp (SASL PLAIN and EXTERNAL-less opens), and a raw STOMP client.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::pki::{localhost, Pki};
use common::TestBroker;
use fe2o3_amqp::connection::OpenError;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::types::sasl::SaslCode;
use fe2o3_amqp::Connection;
use rosetta::config::{ListenAddr, ListenerKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use rumqttc::v5::mqttbytes::v5::ConnectReturnCode as Code5;

/// Longest a test waits for an answer.
const WAIT: Duration = Duration::from_secs(10);

/// A broker with MQTTS, STOMPS and AMQPS requiring nothing but verifying
/// client certificates against `pki`'s CA, anonymous access off, and the
/// users alice (password `secret`) and bob (password `pw`).
async fn broker(dir: &std::path::Path, pki: &Pki) -> TestBroker {
    let tls = pki.tls_config(true);
    let access = common::mqtt::users_access(dir, false);
    TestBroker::start_with(
        move |c| {
            c.listeners.mqtts = Some(ListenAddr::new("127.0.0.1", 0));
            c.listeners.stomps = Some(ListenAddr::new("127.0.0.1", 0));
            c.listeners.amqps = Some(ListenAddr::new("127.0.0.1", 0));
            c.security.anonymous = false;
            c.tls = tls;
        },
        access,
    )
    .await
}

/// A TLS connection to `addr` presenting a certificate for `cert_user`.
async fn tls(pki: &Pki, addr: SocketAddr, cert_user: &str) -> TlsStream<TcpStream> {
    let connector = tokio_rustls::TlsConnector::from(pki.client_config_as(cert_user));
    let tcp = TcpStream::connect(addr).await.expect("connect");
    connector
        .connect(localhost(), tcp)
        .await
        .expect("TLS handshake")
}

// ---- MQTT ------------------------------------------------------------------

/// The 3.1.1 CONNACK return code rumqttc gets over mutual TLS as
/// `cert_user`, sending `login` (0: accepted).
async fn mqtt4_code(
    pki: &Pki,
    addr: SocketAddr,
    cert_user: &str,
    login: Option<(&str, &str)>,
) -> u8 {
    let id = format!("mtls4-{cert_user}-{}", common::mqtt::rand_suffix());
    let mut opts = rumqttc::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_transport(rumqttc::Transport::tls_with_config(
        rumqttc::TlsConfiguration::Rustls(pki.client_config_as(cert_user)),
    ));
    if let Some((user, password)) = login {
        opts.set_credentials(user, password);
    }
    let (_client, mut ev) = rumqttc::AsyncClient::new(opts, 8);
    let code = tokio::time::timeout(WAIT, async {
        loop {
            match ev.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => return 0,
                Ok(_) => {}
                Err(rumqttc::ConnectionError::ConnectionRefused(code)) => return code as u8,
                Err(e) => panic!("MQTT 3.1.1 over mTLS: {e:?}"),
            }
        }
    })
    .await
    .expect("CONNACK in time");
    code
}

/// The MQTT 5 CONNACK reason rumqttc gets over mutual TLS.
async fn mqtt5_code(
    pki: &Pki,
    addr: SocketAddr,
    cert_user: &str,
    login: Option<(&str, &str)>,
) -> Code5 {
    use rumqttc::v5;
    let id = format!("mtls5-{cert_user}-{}", common::mqtt::rand_suffix());
    let mut opts = v5::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_transport(rumqttc::Transport::tls_with_config(
        rumqttc::TlsConfiguration::Rustls(pki.client_config_as(cert_user)),
    ));
    if let Some((user, password)) = login {
        opts.set_credentials(user, password);
    }
    let (_client, mut ev) = v5::AsyncClient::new(opts, 8);
    let code = tokio::time::timeout(WAIT, async {
        loop {
            match ev.poll().await {
                Ok(v5::Event::Incoming(v5::Incoming::ConnAck(_))) => return Code5::Success,
                Ok(_) => {}
                Err(v5::ConnectionError::ConnectionRefused(code)) => return code,
                Err(e) => panic!("MQTT 5 over mTLS: {e:?}"),
            }
        }
    })
    .await
    .expect("CONNACK in time");
    code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_a_user_name_next_to_a_certificate_must_be_its_user() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(dir.path(), &pki).await;
    let mqtts = broker.addr(ListenerKind::Mqtts);

    // alice's certificate with bob's name: refused, with bob's right
    // password as with a wrong one.
    assert_eq!(
        mqtt4_code(&pki, mqtts, "alice", Some(("bob", "pw"))).await,
        5
    );
    assert_eq!(
        mqtt4_code(&pki, mqtts, "alice", Some(("bob", "nope"))).await,
        5
    );
    assert_eq!(
        mqtt5_code(&pki, mqtts, "alice", Some(("bob", "pw"))).await,
        Code5::NotAuthorized
    );
    // The certificate's own user and password: accepted; the password is
    // checked all the same.
    assert_eq!(
        mqtt4_code(&pki, mqtts, "alice", Some(("alice", "secret"))).await,
        0
    );
    assert_eq!(
        mqtt4_code(&pki, mqtts, "alice", Some(("alice", "wrong"))).await,
        4
    );
    assert_eq!(
        mqtt5_code(&pki, mqtts, "alice", Some(("alice", "secret"))).await,
        Code5::Success
    );
    assert_eq!(
        mqtt5_code(&pki, mqtts, "alice", Some(("alice", "wrong"))).await,
        Code5::BadUserNamePassword
    );
    // The certificate alone, and with its user's name only.
    assert_eq!(mqtt4_code(&pki, mqtts, "alice", None).await, 0);
    assert_eq!(mqtt5_code(&pki, mqtts, "alice", None).await, Code5::Success);
    assert_eq!(
        mqtt5_code(&pki, mqtts, "bob", Some(("bob", ""))).await,
        Code5::Success
    );
    broker.stop().await;
}

/// A connection as bob (by certificate) really is bob: refused a topic
/// outside bob/#, which alice could use. Guards against a login that is
/// accepted under the wrong identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_the_certificate_user_gets_its_own_permissions() {
    use common::mqtt::p4;
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(dir.path(), &pki).await;
    let mqtts = broker.addr(ListenerKind::Mqtts);
    let mut io = tls(&pki, mqtts, "bob").await;
    let mut connect = p4::Connect::new("mtls-bob-perm");
    connect.set_login("bob", "pw");
    let mut subscribe = p4::Subscribe::new("elsewhere/x", rumqttc::QoS::AtLeastOnce);
    subscribe.pkid = 1;
    let mut buf = bytes::BytesMut::new();
    for p in [
        p4::Packet::Connect(connect),
        p4::Packet::Subscribe(subscribe),
    ] {
        p.write(&mut buf, 1 << 20).expect("encode");
    }
    io.write_all(&buf).await.expect("write");
    let mut got = bytes::BytesMut::new();
    let mut packets = Vec::new();
    tokio::time::timeout(WAIT, async {
        while packets.len() < 2 {
            match p4::Packet::read(&mut got, 1 << 20) {
                Ok(p) => packets.push(p),
                Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {
                    assert!(io.read_buf(&mut got).await.expect("read") > 0, "closed");
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    })
    .await
    .expect("CONNACK and SUBACK in time");
    assert!(
        matches!(&packets[0], p4::Packet::ConnAck(a) if a.code == p4::ConnectReturnCode::Success),
        "{packets:?}"
    );
    assert!(
        matches!(&packets[1], p4::Packet::SubAck(s) if s.return_codes == [rumqttc::SubscribeReasonCode::Failure]),
        "{packets:?}"
    );
    broker.stop().await;
}

// ---- STOMP -----------------------------------------------------------------

/// Sends a STOMP 1.2 CONNECT with `headers` over mutual TLS as
/// `cert_user` and returns the first frame's command and `message` header.
async fn stomp_answer(
    pki: &Pki,
    addr: SocketAddr,
    cert_user: &str,
    headers: &[(&str, &str)],
) -> (String, Option<String>) {
    let mut io = tls(pki, addr, cert_user).await;
    let mut all = vec![("accept-version", "1.2"), ("host", "/")];
    all.extend_from_slice(headers);
    io.write_all(&common::stomp::encode("CONNECT", &all, b""))
        .await
        .expect("CONNECT");
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, async {
        while !got.contains(&0) {
            let mut chunk = [0u8; 4096];
            let n = io.read(&mut chunk).await.expect("read");
            assert!(n > 0, "closed before answering");
            got.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("an answer in time");
    let text = String::from_utf8_lossy(&got).into_owned();
    let mut lines = text.lines();
    let command = lines.next().unwrap_or_default().to_owned();
    let message = lines
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("message:").map(str::to_owned));
    (command, message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stomp_a_login_next_to_a_certificate_must_be_its_user() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(dir.path(), &pki).await;
    let stomps = broker.addr(ListenerKind::Stomps);
    let refused = ("ERROR".to_owned(), Some("authentication failed".to_owned()));
    let bob = [("login", "bob"), ("passcode", "pw")];
    assert_eq!(stomp_answer(&pki, stomps, "alice", &bob).await, refused);
    let alice = [("login", "alice"), ("passcode", "secret")];
    assert_eq!(
        stomp_answer(&pki, stomps, "alice", &alice).await.0,
        "CONNECTED"
    );
    let wrong = [("login", "alice"), ("passcode", "wrong")];
    assert_eq!(stomp_answer(&pki, stomps, "alice", &wrong).await, refused);
    // stomp.js sends empty fields when it has none: the certificate alone.
    let empty = [("login", ""), ("passcode", "")];
    assert_eq!(
        stomp_answer(&pki, stomps, "alice", &empty).await.0,
        "CONNECTED"
    );
    broker.stop().await;
}

// ---- AMQP ------------------------------------------------------------------

async fn amqp_open(
    pki: &Pki,
    addr: SocketAddr,
    cert_user: &str,
    profile: Option<SaslProfile>,
) -> Result<fe2o3_amqp::connection::ConnectionHandle<()>, OpenError> {
    let io = tls(pki, addr, cert_user).await;
    let builder = Connection::builder().container_id(format!("mtls-{cert_user}"));
    let open = match profile {
        Some(p) => builder.sasl_profile(p).open_with_stream(io).await,
        None => builder.open_with_stream(io).await,
    };
    open
}

fn plain(user: &str, password: &str) -> Option<SaslProfile> {
    Some(SaslProfile::Plain {
        username: user.to_owned(),
        password: password.to_owned(),
    })
}

fn assert_sasl_auth(r: Result<fe2o3_amqp::connection::ConnectionHandle<()>, OpenError>) {
    match r {
        Err(OpenError::SaslError { code, .. }) => assert_eq!(code, SaslCode::Auth),
        Err(other) => panic!("expected sasl-outcome auth, got {other:?}"),
        Ok(_) => panic!("expected sasl-outcome auth, the connection opened"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_plain_user_next_to_a_certificate_must_be_its_user() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(dir.path(), &pki).await;
    let amqps = broker.addr(ListenerKind::Amqps);
    let in_time = |f| tokio::time::timeout(WAIT, f);

    assert_sasl_auth(
        in_time(amqp_open(&pki, amqps, "alice", plain("bob", "pw")))
            .await
            .expect("outcome in time"),
    );
    assert_sasl_auth(
        in_time(amqp_open(&pki, amqps, "alice", plain("alice", "wrong")))
            .await
            .expect("outcome in time"),
    );
    for profile in [plain("alice", "secret"), None] {
        let mut conn = in_time(amqp_open(&pki, amqps, "alice", profile))
            .await
            .expect("open in time")
            .expect("alice's certificate with alice's credentials, or none");
        conn.close().await.expect("close");
    }
    broker.stop().await;
}

/// The certificate of a user who is not in the users file, with a real
/// user's credentials: refused too (it is not that user's certificate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_certificate_cannot_borrow_a_users_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate(dir.path());
    let broker = broker(dir.path(), &pki).await;
    let mqtts = broker.addr(ListenerKind::Mqtts);
    assert_eq!(
        mqtt4_code(&pki, mqtts, "mallory", Some(("alice", "secret"))).await,
        5
    );
    let amqps = broker.addr(ListenerKind::Amqps);
    let r = tokio::time::timeout(
        WAIT,
        amqp_open(&pki, amqps, "mallory", plain("alice", "secret")),
    )
    .await
    .expect("outcome in time");
    assert_sasl_auth(r);
    broker.stop().await;
}
