//! What Qpid JMS sends, reproduced over real sockets (fe2o3-amqp where it
//! can express it, a raw client where it cannot): JMS 2 shared
//! subscriptions (`SHARED-SUBS`, source capabilities `shared`/`global`,
//! link names `sub|global2`, `sub|volatile1`), `Session.unsubscribe` (an
//! attach with a null source), and `QueueBrowser` (distribution-mode copy),
//! which sees the queue's messages without taking them.

mod common;

use std::time::Duration;

use common::amqp::{self, enc, frame, RawAmqp, ATTACH, CLOSE, DETACH, OPEN, QUIET};
use common::TestBroker;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::SenderSettleMode;
use fe2o3_amqp::types::messaging::{
    DistributionMode, Source, TerminusDurability, TerminusExpiryPolicy,
};
use fe2o3_amqp::types::primitives::{Array, Symbol, Value};
use fe2o3_amqp::Receiver;
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;

fn caps(list: &[&str]) -> Array<Symbol> {
    Array(list.iter().map(|c| Symbol::from(*c)).collect())
}

/// The source Qpid JMS sends for a topic subscription.
fn jms_topic_source(address: &str, durable: bool, capabilities: &[&str]) -> Source {
    let b = Source::builder()
        .address(address)
        .capabilities(caps(capabilities));
    if durable {
        b.durable(TerminusDurability::UnsettledState)
            .expiry_policy(TerminusExpiryPolicy::Never)
            .distribution_mode(DistributionMode::Copy)
            .build()
    } else {
        b.durable(TerminusDurability::None)
            .expiry_policy(TerminusExpiryPolicy::LinkDetach)
            .build()
    }
}

/// A JMS consumer on `source` as Qpid JMS attaches it: link `name`, a
/// prefetch of 5 (auto credit). Panics if the broker refuses it.
async fn consumer(session: &mut SessionHandle<()>, name: &str, source: &Source) -> Receiver {
    Receiver::builder()
        .name(name)
        .source(source.clone())
        .credit_mode(CreditMode::Auto(5))
        .attach(session)
        .await
        .unwrap_or_else(|e| panic!("attach consumer {name}: {e:?}"))
}

/// Receives and accepts until nothing more comes; returns the bodies.
async fn drain(r: &mut Receiver) -> Vec<String> {
    let mut got = Vec::new();
    while let Ok(d) = tokio::time::timeout(QUIET, r.recv::<String>()).await {
        let d = d.expect("recv");
        r.accept(&d).await.expect("accept");
        got.push(d.body().clone());
    }
    got
}

/// A receiver attach with a null source and the given desired capabilities,
/// as Qpid JMS's unsubscribe sends it.
fn null_source_attach(name: &str, handle: u32, desired: &[&str]) -> Vec<u8> {
    let desired = if desired.is_empty() {
        enc::null()
    } else {
        // array8 of sym8
        let mut body = vec![u8::try_from(desired.len()).expect("count"), 0xa3];
        for d in desired {
            body.push(u8::try_from(d.len()).expect("len"));
            body.extend_from_slice(d.as_bytes());
        }
        let mut v = vec![0xe0, u8::try_from(body.len()).expect("size")];
        v.extend(body);
        v
    };
    enc::described(
        ATTACH,
        &[
            enc::str8(name),
            enc::uint(handle),
            enc::boolean(true), // receiver
            enc::ubyte(0),
            enc::ubyte(0),
            enc::null(), // source
            enc::described(0x29, &[]),
            enc::null(),
            enc::null(),
            enc::null(),
            enc::null(),
            enc::null(),
            desired,
        ],
    )
}

/// Qpid JMS `Session.unsubscribe`: look the subscription up with a null
/// source, then close the link. Returns whether the lookup found it.
async fn jms_unsubscribe(
    broker: &TestBroker,
    container: &str,
    link: &str,
    desired: &[&str],
) -> bool {
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    assert!(raw.write(&amqp::protocol_header(0)).await);
    assert_eq!(raw.read_header().await, Ok(amqp::protocol_header(0)));
    assert!(
        raw.write(&frame(0, 0, &amqp::open_body(container, 65536, None)))
            .await
    );
    raw.expect(OPEN).await;
    assert!(raw.write(&frame(0, 0, &amqp::begin_body())).await);
    raw.expect(amqp::BEGIN).await;
    assert!(
        raw.write(&frame(0, 0, &null_source_attach(link, 0, desired)))
            .await
    );
    let reply = raw.expect(ATTACH).await;
    // The reply's source is its sixth field: null means "not found" (a
    // detach with amqp:not-found follows).
    let found = !reply.mentions("amqp:not-found") && source_is_present(&reply.body);
    let close_link = enc::described(DETACH, &[enc::uint(0), enc::boolean(true)]);
    if found {
        assert!(raw.write(&frame(0, 0, &close_link)).await);
        let d = raw.expect(DETACH).await;
        assert!(!d.mentions("amqp:"), "clean unsubscribe: {:?}", d.body);
    } else {
        let d = raw.expect(DETACH).await;
        assert!(d.mentions("amqp:not-found"), "{:?}", d.body);
        assert!(raw.write(&frame(0, 0, &close_link)).await);
    }
    assert!(raw.write(&frame(0, 0, &enc::described(CLOSE, &[]))).await);
    raw.expect(CLOSE).await;
    found
}

/// Whether an attach body's source (field 5) is present: walks the first
/// five fields (name, handle, role, and the two settle modes).
fn source_is_present(body: &[u8]) -> bool {
    // described list: 00 53 12, then list8 (c0 size count) or list32.
    let mut pos = match body[3] {
        0xc0 => 6,
        0xd0 => 12,
        other => panic!("attach not a list: {other:#x}"),
    };
    for _ in 0..5 {
        pos += match body[pos] {
            0x40..=0x45 => 1,
            0x50..=0x56 => 2,
            0x70 => 5,
            0xa1 | 0xa3 => 2 + usize::from(body[pos + 1]),
            0xb1 | 0xb3 => {
                5 + usize::try_from(u32::from_be_bytes([
                    body[pos + 1],
                    body[pos + 2],
                    body[pos + 3],
                    body[pos + 4],
                ]))
                .expect("len")
            }
            other => panic!("unexpected code {other:#x}"),
        };
    }
    body[pos] != 0x40
}

#[tokio::test]
async fn open_offers_shared_subscriptions() {
    let broker = TestBroker::start().await;
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    let open = raw.open(65536, None).await;
    assert!(open.mentions("SHARED-SUBS"), "{:?}", open.body);
    assert!(open.mentions("ANONYMOUS-RELAY"));
    broker.stop().await;
}

#[tokio::test]
async fn shared_durable_global_subscription_across_connections() {
    let broker = TestBroker::start().await;
    let queue = "$share/$jms/orders";
    // Two JMS connections without client ids (random container ids), one
    // consumer each on the shared durable subscription "orders".
    let (mut c1, mut s1) = amqp::connect_session(&broker, "ID:jms-a").await;
    let (mut c2, mut s2) = amqp::connect_session(&broker, "ID:jms-b").await;
    let source = jms_topic_source("orders/new", true, &["topic", "shared", "global"]);
    let mut r1 = consumer(&mut s1, "orders|global", &source).await;
    let mut r2 = consumer(&mut s2, "orders|global", &source).await;
    let texts: Vec<String> = (0..20).map(|i| format!("o{i}")).collect();
    amqp::publish_durable(&broker, "jms-publisher", "/topic/orders/new", &texts).await;
    let (a, b) = tokio::join!(drain(&mut r1), drain(&mut r2));
    assert!(
        !a.is_empty() && !b.is_empty(),
        "both share the work: {a:?} {b:?}"
    );
    let mut all: Vec<String> = a.into_iter().chain(b).collect();
    all.sort_by_key(|t| t[1..].parse::<u32>().unwrap_or(u32::MAX));
    assert_eq!(all, texts, "each message once, to one of them");

    // Consumers detach (JMS consumer.close on a durable sub); messages
    // published meanwhile wait in the subscription.
    for r in [r1, r2] {
        if let Err((_, e)) = r.detach().await {
            panic!("detach: {e:?}");
        }
    }
    amqp::publish_durable(
        &broker,
        "jms-publisher",
        "/topic/orders/new",
        &["late".to_owned()],
    )
    .await;
    assert_eq!(broker.queue(queue), Some((1, 0)));
    c1.close().await.expect("close");
    c2.close().await.expect("close");

    // A third client (another random container id) unsubscribes it.
    assert!(jms_unsubscribe(&broker, "ID:jms-c", "orders|global", &["shared", "global"]).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(queue), None, "unsubscribed");
    assert!(!jms_unsubscribe(&broker, "ID:jms-c", "orders|global", &["shared", "global"]).await);
    broker.stop().await;
}

#[tokio::test]
async fn shared_volatile_subscription_lives_while_it_has_consumers() {
    let broker = TestBroker::start().await;
    let queue = "$durable/client-x/ticks|volatile";
    let (mut conn, mut session) = amqp::connect_session(&broker, "client-x").await;
    let source = jms_topic_source("ticks", false, &["topic", "shared"]);
    let mut r1 = consumer(&mut session, "ticks|volatile1", &source).await;
    let mut r2 = consumer(&mut session, "ticks|volatile2", &source).await;
    let texts: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    amqp::publish_durable(&broker, "jms-publisher", "/topic/ticks", &texts).await;
    let (a, b) = tokio::join!(drain(&mut r1), drain(&mut r2));
    assert_eq!(a.len() + b.len(), 10, "one queue shared: {a:?} {b:?}");
    assert!(!a.is_empty() && !b.is_empty());
    r1.close().await.expect("close");
    assert!(broker.queue(queue).is_some(), "one consumer left");
    r2.close().await.expect("close");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(queue), None, "gone with its last consumer");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn exclusive_durable_subscription_unsubscribed_with_a_null_source() {
    let broker = TestBroker::start().await;
    let queue = "$durable/jms-client/audit";
    {
        let (mut conn, mut session) = amqp::connect_session(&broker, "jms-client").await;
        let r = Receiver::builder()
            .name("audit")
            .source(jms_topic_source("audit", true, &["topic"]))
            .attach(&mut session)
            .await
            .expect("durable subscriber");
        if let Err((_, e)) = r.detach().await {
            panic!("detach: {e:?}");
        }
        conn.close().await.expect("close");
    }
    assert!(broker.queue(queue).is_some());
    // Another container id does not see it (the name is the client's).
    assert!(!jms_unsubscribe(&broker, "other-client", "audit", &[]).await);
    assert!(broker.queue(queue).is_some());
    assert!(jms_unsubscribe(&broker, "jms-client", "audit", &[]).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.queue(queue), None);
    broker.stop().await;
}

#[tokio::test]
async fn queue_browser_sees_the_messages_and_leaves_them_queued() {
    let broker = TestBroker::start().await;
    let texts: Vec<String> = (0..3).map(|i| format!("b{i}")).collect();
    amqp::publish_durable(&broker, "jms-publisher", "/queue/browsed", &texts).await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "browser").await;
    // Qpid JMS QueueBrowser: pre-settled, distribution-mode copy.
    let mut browse = Receiver::builder()
        .name("browser")
        .source(
            Source::builder()
                .address("browsed")
                .capabilities(caps(&["queue"]))
                .distribution_mode(DistributionMode::Copy)
                .build(),
        )
        .sender_settle_mode(SenderSettleMode::Settled)
        .credit_mode(CreditMode::Auto(10))
        .attach(&mut session)
        .await
        .expect("a browser is attached");
    let mut seen = Vec::new();
    while let Ok(d) = tokio::time::timeout(QUIET, browse.recv::<String>()).await {
        seen.push(d.expect("recv").body().clone());
    }
    assert_eq!(seen, texts, "every message, in order, once");
    assert_eq!(broker.queue("browsed"), Some((3, 0)), "nothing taken");
    browse.close().await.expect("close browser");
    // An ordinary consumer still gets them all.
    let mut r = amqp::receiver(&mut session, "r", "/queue/browsed").await;
    assert_eq!(drain(&mut r).await, texts);
    conn.close().await.expect("close");
    broker.stop().await;
}

/// The JMS no-local filter as Qpid JMS sends it (`createConsumer(topic,
/// null, true)`): key `no-local`, described by
/// `apache.org:no-local-filter:list`.
fn no_local_source(address: &str) -> Source {
    let filter = Described {
        descriptor: Descriptor::Name(Symbol::from("apache.org:no-local-filter:list")),
        value: Value::List(Vec::new()),
    };
    Source::builder()
        .address(address)
        .capabilities(caps(&["topic"]))
        .add_to_filter("no-local", filter)
        .build()
}

#[tokio::test]
async fn no_local_subscriber_misses_its_own_connections_messages() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "no-local-client").await;
    let mut receiver = Receiver::builder()
        .name("quiet")
        .source(no_local_source("chat"))
        .credit_mode(CreditMode::Auto(5))
        .attach(&mut session)
        .await
        .expect("attach a no-local consumer");
    let echoed = receiver
        .source()
        .as_ref()
        .and_then(|s| s.filter.as_ref())
        .is_some_and(|f| f.contains_key(&Symbol::from("no-local")));
    assert!(echoed, "the reply lists the filter in force");
    // From the same connection: skipped. From another: delivered.
    let mut own = amqp::sender(&mut session, "own", "/topic/chat").await;
    amqp::send_accepted(&mut own, "mine").await;
    amqp::publish_durable(&broker, "someone-else", "/topic/chat", &["theirs"]).await;
    assert_eq!(drain(&mut receiver).await, vec!["theirs".to_owned()]);
    own.close().await.expect("close");
    receiver.close().await.expect("close");
    conn.close().await.expect("close");
    broker.stop().await;
}
