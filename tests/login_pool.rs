//! Issue 13, item 12: password checks run on the users file's bounded
//! hashing pool, never on the threads that serve connections.
//!
//! The users file here holds `slow`, whose argon2 hash is calibrated to
//! cost about [`SLOW_CHECK`] per check: long enough that a check run on a
//! tokio worker (as before) visibly stalls everyone else on the broker.
//! Real clients over real sockets: raw MQTT, STOMP and AMQP clients (they
//! pipeline frames behind the login and read the exact answer codes),
//! rumqttc for the bystanders.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHasher, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use common::amqp::{enc, frame, protocol_header, RawAmqp};
use common::mqtt::{p4, Raw};
use common::TestBroker;
use rosetta::core::AccessControl;

/// What one check of `slow`'s password should cost.
const SLOW_CHECK: Duration = Duration::from_millis(1500);
/// Memory of `slow`'s hash, in KiB (its passes are calibrated).
const SLOW_MEMORY_KIB: u32 = 8 * 1024;
/// Longest a bystander's CONNECT may take while slow checks run: far
/// below [`SLOW_CHECK`].
const BYSTANDER_MAX: Duration = Duration::from_millis(700);
/// Longest a test waits for an answer.
const WAIT: Duration = Duration::from_secs(30);

/// An argon2id hash of `password` whose check costs about [`SLOW_CHECK`]
/// on this machine, now.
fn slow_hash(password: &[u8]) -> String {
    let hash_with = |passes: u32| {
        let params = Params::new(SLOW_MEMORY_KIB, passes, 1, None).expect("params");
        let salt = SaltString::encode_b64(b"0123456789abcdef").expect("salt");
        Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
            .hash_password(password, &salt)
            .expect("hash")
            .to_string()
    };
    let probe_passes = 8;
    let started = Instant::now();
    hash_with(probe_passes);
    let per_pass = started.elapsed() / probe_passes;
    let passes = (SLOW_CHECK.as_nanos() / per_pass.as_nanos().max(1)).clamp(2, 10_000);
    hash_with(u32::try_from(passes).unwrap_or(10_000))
}

/// A users file with `slow` (password `slow-pw`, the slow hash) and, as
/// `rosetta user add` writes them, `alice` (`secret`).
fn users_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("users.toml");
    rosetta::users::add_user(&path, "alice", b"secret", None, None).expect("add alice");
    let mut text = std::fs::read_to_string(&path).expect("read users");
    text.push_str(&format!(
        "\n[users.slow]\npassword_hash = \"{}\"\n",
        slow_hash(b"slow-pw")
    ));
    std::fs::write(&path, text).expect("write users");
    path
}

/// The access control over [`users_file`], anonymous access on, with
/// `threads` hashing threads and room for `queue_max` waiting checks.
fn access(dir: &Path, threads: usize, queue_max: usize) -> Arc<dyn AccessControl> {
    let users = rosetta::users::Users::load(&users_file(dir)).expect("load users");
    let access = rosetta::access::UsersAccess::with_pool(users, true, threads, queue_max)
        .expect("hashing threads start");
    Arc::new(access)
}

async fn broker(threads: usize, queue_max: usize) -> (TestBroker, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let access = access(dir.path(), threads, queue_max);
    // Room for every slow check of a test to finish in time.
    let broker = TestBroker::start_with(|c| c.broker.connect_timeout_ms = 60_000, access).await;
    (broker, dir)
}

fn mqtt_connect(id: &str, login: Option<(&str, &str)>) -> p4::Packet {
    let mut c = p4::Connect::new(id);
    if let Some((user, password)) = login {
        c.set_login(user, password);
    }
    p4::Packet::Connect(c)
}

fn mqtt_subscribe(filter: &str) -> p4::Packet {
    let mut s = p4::Subscribe::new(filter, rumqttc::QoS::AtLeastOnce);
    s.pkid = 1;
    p4::Packet::Subscribe(s)
}

/// After `delay`, an anonymous MQTT 3.1.1 CONNECT over a blocking socket
/// on a thread of its own; how long its CONNACK took.
fn bystander_connect(
    addr: std::net::SocketAddr,
    delay: Duration,
) -> std::thread::JoinHandle<Duration> {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        let mut connect = bytes::BytesMut::new();
        mqtt_connect("bystander", None)
            .write(&mut connect, 1 << 20)
            .expect("encode");
        let started = Instant::now();
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("read timeout");
        s.write_all(&connect).expect("CONNECT");
        let mut connack = [0u8; 4];
        s.read_exact(&mut connack).expect("CONNACK");
        assert_eq!(connack, [0x20, 2, 0, 0], "accepted");
        started.elapsed()
    })
}

/// While slow password checks run, other clients connect and exchange
/// messages as if nothing were happening; the slow logins are answered
/// in the end, each followed by the answer to the SUBSCRIBE it pipelined.
///
/// Before the pool, each check ran on the tokio worker that read its
/// CONNECT: three checks held both workers of the test's runtime (the
/// broker's) for seconds, and the bystander's CONNACK waited for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_password_checks_stall_no_other_connection() {
    let (broker, _dir) = broker(1, 16).await;
    let mut slow = Vec::new();
    for i in 0..3 {
        let mut raw = Raw::open(broker.mqtt()).await;
        // CONNECT and SUBSCRIBE in one write: the SUBSCRIBE waits, unread,
        // behind the password check.
        let mut bytes = bytes::BytesMut::new();
        for p in [
            mqtt_connect(&format!("slow-{i}"), Some(("slow", "slow-pw"))),
            mqtt_subscribe("pool/slow"),
        ] {
            p.write(&mut bytes, 1 << 20).expect("encode");
        }
        raw.write(&bytes).await;
        slow.push(raw);
    }
    // An anonymous CONNECT while the checks run, timed from a thread of
    // its own: the broker's runtime is the test's, and a stall there would
    // stall the test's own clock too.
    let took = bystander_connect(broker.mqtt(), Duration::from_millis(300))
        .join()
        .expect("bystander thread");
    assert!(
        took < BYSTANDER_MAX,
        "an anonymous CONNECT took {took:?} while password checks ran"
    );
    // A QoS 1 round trip between two more clients, during the checks.
    let (sub, mut sub_ev) = common::mqtt::client4(&broker, "pool-sub", true);
    common::mqtt::connack4(&mut sub_ev).await;
    common::mqtt::subscribe4(&sub, &mut sub_ev, "pool/stream", rumqttc::QoS::AtLeastOnce).await;
    let (publisher, mut pub_ev) = common::mqtt::client4(&broker, "pool-pub", true);
    common::mqtt::connack4(&mut pub_ev).await;
    let started = Instant::now();
    publisher
        .publish("pool/stream", rumqttc::QoS::AtLeastOnce, false, "tick")
        .await
        .expect("publish");
    common::mqtt::puback4(&mut pub_ev).await;
    let delivered = common::mqtt::publish4(&mut sub_ev).await;
    assert_eq!(&delivered.payload[..], b"tick");
    assert!(
        started.elapsed() < BYSTANDER_MAX,
        "a QoS 1 round trip took {:?} while password checks ran",
        started.elapsed()
    );

    // The slow logins: CONNACK, then the pipelined SUBSCRIBE's SUBACK.
    for raw in &mut slow {
        let first = raw.recv4_opt(WAIT).await.expect("CONNACK in time");
        assert!(
            matches!(&first, p4::Packet::ConnAck(a) if a.code == p4::ConnectReturnCode::Success),
            "{first:?}"
        );
        let second = raw.recv4().await;
        assert!(matches!(second, p4::Packet::SubAck(_)), "{second:?}");
    }
    broker.stop().await;
}

/// With one hashing thread and no queue, a login arriving while a check
/// runs is refused as busy, on every protocol: MQTT 3.1.1 CONNACK 3
/// (server unavailable), STOMP ERROR `server busy`, AMQP sasl-outcome
/// sys-temp (4). The login holding the thread still gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_a_login_is_refused_as_busy() {
    let (broker, _dir) = broker(1, 0).await;
    let mut holder = Raw::open(broker.mqtt()).await;
    holder
        .send4(mqtt_connect("holder", Some(("slow", "slow-pw"))))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut connect = p4::Connect::new("refused");
    connect.set_login("alice", "secret");
    let (_raw, ack) = Raw::connect4_with(broker.mqtt(), connect).await;
    assert_eq!(ack.code, p4::ConnectReturnCode::ServiceUnavailable);

    let mut stomp = common::stomp::StompClient::connect_raw(broker.stomp()).await;
    stomp
        .send_frame(
            "CONNECT",
            &[
                ("accept-version", "1.2"),
                ("host", "/"),
                ("login", "alice"),
                ("passcode", "secret"),
            ],
            b"",
        )
        .await;
    let error = stomp.expect_error_then_close().await;
    assert_eq!(error.header("message"), Some("server busy"));

    let mut amqp = RawAmqp::connect(broker.amqp()).await;
    assert!(amqp.write(&protocol_header(3)).await);
    assert_eq!(amqp.read_header().await, Ok(protocol_header(3)));
    amqp.expect(common::amqp::SASL_MECHANISMS).await;
    let init = enc::described(0x41, &[enc::sym8("PLAIN"), enc::binary(b"\0alice\0secret")]);
    assert!(amqp.write(&frame(1, 0, &init)).await);
    let outcome = amqp.expect(common::amqp::SASL_OUTCOME).await;
    assert_eq!(common::amqp::sasl_code(&outcome), Some(4), "sys-temp");

    let first = holder.recv4_opt(WAIT).await.expect("CONNACK in time");
    assert!(
        matches!(&first, p4::Packet::ConnAck(a) if a.code == p4::ConnectReturnCode::Success),
        "{first:?}"
    );
    broker.stop().await;
}

/// STOMP and AMQP clients that pipeline their first frames behind the
/// login (as stomp.js and Proton do) get them handled after the check, in
/// order: CONNECTED then the SEND's RECEIPT; sasl-outcome, then the AMQP
/// header and Open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_pipelined_behind_a_login_are_handled_after_it() {
    let (broker, _dir) = broker(1, 16).await;

    let mut stomp = common::stomp::StompClient::connect_raw(broker.stomp()).await;
    let mut bytes = common::stomp::encode(
        "CONNECT",
        &[
            ("accept-version", "1.2"),
            ("host", "/"),
            ("login", "slow"),
            ("passcode", "slow-pw"),
        ],
        b"",
    );
    bytes.extend(common::stomp::encode(
        "SEND",
        &[("destination", "/queue/pool.pipelined"), ("receipt", "r1")],
        b"after the login",
    ));
    stomp.send_raw(&bytes).await;
    let connected = tokio::time::timeout(WAIT, stomp.recv())
        .await
        .expect("CONNECTED in time")
        .expect("a frame");
    assert_eq!(connected.command, "CONNECTED", "{connected:?}");
    stomp.expect_receipt("r1").await;
    assert_eq!(broker.depth("pool.pipelined").0, 1, "the SEND ran");

    let mut amqp = RawAmqp::connect(broker.amqp()).await;
    let mut bytes = protocol_header(3).to_vec();
    let init = enc::described(0x41, &[enc::sym8("PLAIN"), enc::binary(b"\0slow\0slow-pw")]);
    bytes.extend(frame(1, 0, &init));
    bytes.extend(protocol_header(0));
    bytes.extend(frame(
        0,
        0,
        &common::amqp::open_body("pipelined", 65536, None),
    ));
    assert!(amqp.write(&bytes).await);
    assert_eq!(amqp.read_header().await, Ok(protocol_header(3)));
    amqp.expect(common::amqp::SASL_MECHANISMS).await;
    let outcome = tokio::time::timeout(WAIT, amqp.expect(common::amqp::SASL_OUTCOME))
        .await
        .expect("outcome in time");
    assert_eq!(common::amqp::sasl_code(&outcome), Some(0));
    assert_eq!(amqp.read_header().await, Ok(protocol_header(0)));
    amqp.expect(common::amqp::OPEN).await;
    broker.stop().await;
}
