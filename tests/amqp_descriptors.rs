//! AMQP 1.0 described types with symbolic descriptors (`amqp:open:list`
//! rather than `0x10`, spec §1.5), over real sockets.
//!
//! A real fe2o3-amqp client talks to the broker through [`SymbolicProxy`],
//! which re-encodes every frame the client sends (SASL frames,
//! performatives, delivery states, source and target, message sections)
//! with symbolic descriptors, as python-qpid-proton writes transaction
//! control. Everything must work as it does with the numeric form.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::amqp::{self, recv_any, send_accepted, text_of, WAIT};
use common::TestBroker;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::transaction::{
    Controller, Transaction, TransactionAcquisition, TransactionDischarge, TransactionPosting,
};
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, DeliveryAnnotations, Footer, Header, Message, MessageAnnotations,
    Modified, Properties,
};
use fe2o3_amqp::{Connection, Session};
use rosetta_amqp::descriptor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy in front of the broker's AMQP port that rewrites, in the
/// client-to-broker direction, every descriptor of the spec's table into
/// its symbolic form (broker-to-client bytes pass unchanged). It records
/// which symbolic names it wrote, so a test can show what it covered.
struct SymbolicProxy {
    addr: SocketAddr,
    written: Arc<Mutex<BTreeSet<&'static str>>>,
}

impl SymbolicProxy {
    async fn start(broker: SocketAddr) -> SymbolicProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let written = Arc::new(Mutex::new(BTreeSet::new()));
        let seen = written.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(broker).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, seen.clone()));
            }
        });
        SymbolicProxy { addr, written }
    }

    fn url(&self) -> String {
        format!("amqp://{}", self.addr)
    }

    /// The symbolic descriptors sent so far.
    fn written(&self) -> BTreeSet<&'static str> {
        self.written.lock().expect("lock").clone()
    }

    /// Panics unless every name in `want` was sent symbolically.
    fn assert_wrote(&self, want: &[&str]) {
        let written = self.written();
        for name in want {
            assert!(written.contains(name), "{name} not sent; sent {written:?}");
        }
    }
}

async fn relay(client: TcpStream, server: TcpStream, seen: Arc<Mutex<BTreeSet<&'static str>>>) {
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_rd, &mut client_wr).await;
        let _ = client_wr.shutdown().await;
    });
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match client_rd.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let out = rewrite_complete_frames(&mut buf, &seen);
        if server_wr.write_all(&out).await.is_err() {
            break;
        }
    }
    let _ = server_wr.shutdown().await;
    let _ = down.await;
}

/// Takes the complete protocol headers and frames off the front of `buf`
/// and returns them rewritten.
fn rewrite_complete_frames(buf: &mut Vec<u8>, seen: &Mutex<BTreeSet<&'static str>>) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        if buf.starts_with(b"AMQP") {
            if buf.len() < 8 {
                break;
            }
            out.extend(buf.drain(..8));
            continue;
        }
        let Some(size) = buf.get(..4) else { break };
        let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]) as usize;
        if size < 8 || buf.len() < size {
            break;
        }
        let frame: Vec<u8> = buf.drain(..size).collect();
        let doff = usize::from(frame[4]) * 4;
        let body = &frame[doff.min(size)..];
        // A body that is not whole values (a transfer split across frames)
        // goes unchanged.
        let body = symbolic_body(body).unwrap_or_else(|| body.to_vec());
        for (_, name) in descriptor::DESCRIPTORS {
            if body.windows(name.len()).any(|w| w == name.as_bytes()) {
                seen.lock().expect("lock").insert(name);
            }
        }
        let new_size = u32::try_from(8 + body.len()).expect("frame size");
        out.extend_from_slice(&new_size.to_be_bytes());
        out.extend_from_slice(&[2, frame[5], frame[6], frame[7]]);
        out.extend_from_slice(&body);
    }
    out
}

/// A frame body (performative, then message sections) with symbolic
/// descriptors; `None` if it does not split into whole values.
fn symbolic_body(body: &[u8]) -> Option<Vec<u8>> {
    if body.is_empty() {
        return Some(Vec::new());
    }
    let (mut out, used) = descriptor::to_symbolic(body).ok()?;
    out.extend(descriptor::to_symbolic_all(body.get(used..)?).ok()?);
    Some(out)
}

/// A message with every section the spec defines (its body an amqp-value).
fn every_section(text: &str) -> Message<fe2o3_amqp::types::messaging::AmqpValue<String>> {
    Message::builder()
        .header(Header {
            durable: true,
            ..Header::default()
        })
        .delivery_annotations(
            DeliveryAnnotations::builder()
                .insert("x-opt-d", 1i32)
                .build(),
        )
        .message_annotations(
            MessageAnnotations::builder()
                .insert("x-opt-m", 2i32)
                .build(),
        )
        .properties(Properties::builder().subject("subj").build())
        .application_properties(ApplicationProperties::builder().insert("k", 3i32).build())
        .footer(Footer::builder().insert("x-opt-f", 4i32).build())
        .value(text.to_string())
        .build()
}

/// A connection through `proxy`, with SASL `profile` or, without one, no
/// SASL layer at all (anonymous access must be on).
async fn connect(
    proxy: &SymbolicProxy,
    container: &str,
    profile: Option<SaslProfile>,
) -> fe2o3_amqp::connection::ConnectionHandle<()> {
    let builder = Connection::builder().container_id(container);
    let opened = match profile {
        Some(profile) => {
            builder
                .sasl_profile(profile)
                .open(proxy.url().as_str())
                .await
        }
        None => builder.open(proxy.url().as_str()).await,
    };
    opened.expect("open through the symbolic proxy")
}

#[tokio::test]
async fn sasl_sections_and_outcomes_with_symbolic_descriptors() {
    let broker = amqp::users_broker(false).await;
    let proxy = SymbolicProxy::start(broker.amqp()).await;
    let plain = SaslProfile::Plain {
        username: "alice".into(),
        password: "s3cret".into(),
    };
    let mut conn = connect(&proxy, "symbolic", Some(plain)).await;
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let mut s = amqp::sender(&mut session, "s", "/queue/sym").await;
    send_accepted(&mut s, every_section("m")).await;
    let mut r = amqp::manual_receiver(&mut session, "r", "/queue/sym").await;
    r.set_credit(1).await.expect("credit");
    let d = recv_any(&mut r).await;
    assert_eq!(text_of(&d), "m");
    let m = d.message();
    assert!(m.header.as_ref().is_some_and(|h| h.durable));
    assert_eq!(
        m.properties.as_ref().and_then(|p| p.subject.as_deref()),
        Some("subj")
    );
    assert!(m
        .application_properties
        .as_ref()
        .is_some_and(|a| a.0.contains_key("k")));
    assert!(m.message_annotations.is_some());

    // Each outcome, written symbolically: released comes back, modified
    // comes back counted, rejected goes to the dead-letter queue.
    r.release(&d).await.expect("release");
    r.set_credit(1).await.expect("credit");
    let d = recv_any(&mut r).await;
    let failed = Modified {
        delivery_failed: Some(true),
        undeliverable_here: None,
        message_annotations: None,
    };
    r.modify(&d, failed).await.expect("modify");
    r.set_credit(1).await.expect("credit");
    let d = recv_any(&mut r).await;
    assert_eq!(
        d.message().header.as_ref().map(|h| h.delivery_count),
        Some(1)
    );
    r.reject(&d, None).await.expect("reject");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("sym"), (0, 0));
    assert_eq!(broker.depth("DLQ").0, 1);
    let mut dlq = amqp::receiver(&mut session, "dlq", "/queue/DLQ").await;
    let dead = recv_any(&mut dlq).await;
    dlq.accept(&dead).await.expect("accept");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("DLQ"), (0, 0));
    r.close().await.expect("detach");
    session.end().await.expect("end");
    conn.close().await.expect("close");

    proxy.assert_wrote(&[
        "amqp:sasl-init:list",
        "amqp:open:list",
        "amqp:begin:list",
        "amqp:attach:list",
        "amqp:source:list",
        "amqp:target:list",
        "amqp:flow:list",
        "amqp:transfer:list",
        "amqp:disposition:list",
        "amqp:accepted:list",
        "amqp:released:list",
        "amqp:modified:list",
        "amqp:rejected:list",
        "amqp:detach:list",
        "amqp:end:list",
        "amqp:close:list",
        "amqp:header:list",
        "amqp:delivery-annotations:map",
        "amqp:message-annotations:map",
        "amqp:properties:list",
        "amqp:application-properties:map",
        "amqp:amqp-value:*",
        "amqp:footer:map",
    ]);
    broker.stop().await;
}

#[tokio::test]
async fn transactions_with_symbolic_descriptors() {
    let broker = TestBroker::start().await;
    let proxy = SymbolicProxy::start(broker.amqp()).await;
    // Without SASL, so that what this test shows is the coordinator.
    let mut conn = connect(&proxy, "symbolic-txn", None).await;
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let controller = Controller::attach(&mut session, "ctrl")
        .await
        .expect("coordinator");
    let mut s = amqp::sender(&mut session, "s", "/queue/symtx").await;

    // A transactional send committed, one rolled back.
    let txn = Transaction::declare(&controller, None)
        .await
        .expect("declare");
    txn.post(&mut s, amqp::durable("kept"))
        .await
        .expect("post")
        .accepted_or_else(|o| o)
        .expect("transactional accept");
    txn.commit().await.expect("commit");
    let txn = Transaction::declare(&controller, None)
        .await
        .expect("declare");
    txn.post(&mut s, amqp::durable("dropped"))
        .await
        .expect("post")
        .accepted_or_else(|o| o)
        .expect("transactional accept");
    txn.rollback().await.expect("rollback");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("symtx"), (1, 0));

    // A transactional receive: acquired and accepted in a transaction,
    // committed.
    let mut r = amqp::manual_receiver(&mut session, "r", "/queue/symtx").await;
    let txn = Transaction::declare(&controller, None)
        .await
        .expect("declare");
    let mut acq = txn.acquire(&mut r, 1).await.expect("acquire");
    let d = tokio::time::timeout(WAIT, acq.recv::<String>())
        .await
        .expect("acquired in time")
        .expect("recv");
    assert_eq!(d.body(), "kept");
    acq.accept(&d).await.expect("transactional accept");
    acq.commit().await.expect("commit");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("symtx"), (0, 0));
    controller.close().await.expect("close controller");
    conn.close().await.expect("close");

    proxy.assert_wrote(&[
        "amqp:coordinator:list",
        "amqp:declare:list",
        "amqp:discharge:list",
        "amqp:transactional-state:list",
        "amqp:accepted:list",
    ]);
    broker.stop().await;
}
