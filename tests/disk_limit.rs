//! The disk limit of producer flow control, over real sockets: while the
//! data directory's filesystem has less free space than
//! `[store] disk_free_min_bytes`, an AMQP sender gets no credit and an
//! MQTT publisher's packets are not read (so not acknowledged), and its
//! connection stays open. Here the limit
//! is `u64::MAX`, which no disk meets.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::mqtt::*;
use common::TestBroker;
use fe2o3_amqp::types::messaging::Message;

async fn disk_full_broker() -> TestBroker {
    TestBroker::start_with(
        |c| c.store.disk_free_min_bytes = u64::MAX,
        Arc::new(rosetta::core::AllowAll),
    )
    .await
}

#[tokio::test]
async fn amqp_sender_gets_no_credit_while_the_disk_is_short() {
    let broker = disk_full_broker().await;
    assert!(broker.core().producers_blocked());
    let (_conn, mut session) = common::amqp::connect_session(&broker, "disk").await;
    let mut sender = common::amqp::sender(&mut session, "s", "/queue/disk").await;
    let sent = tokio::time::timeout(
        Duration::from_secs(1),
        sender.send(Message::builder().value("waits").build()),
    )
    .await;
    assert!(
        sent.is_err(),
        "a transfer went out without credit: {sent:?}"
    );
    assert_eq!(broker.depth("disk").0, 0);
    broker.stop().await;
}

#[tokio::test]
async fn mqtt_publisher_is_not_read_and_not_dropped_while_the_disk_is_short() {
    let broker = disk_full_broker().await;
    // (rumqttc itself gives up on a broker that does not answer PINGREQ
    // within one keep-alive, so the default 10 s keeps it patient; the
    // broker's side of keep-alive under back-pressure has a state-machine
    // test in protocols/mqtt.)
    let (client, mut ev) = rumqttc::AsyncClient::new(opts4(&broker, "disk-pub"), 16);
    connack4(&mut ev).await;
    client
        .publish("disk/t", rumqttc::QoS::AtLeastOnce, false, "waits")
        .await
        .expect("queue publish");
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < until {
        match tokio::time::timeout_at(until, ev.poll()).await {
            Err(_) => break,
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(a)))) => {
                panic!("PUBACK {a:?} while producers are held back")
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("connection dropped while held back: {e:?}"),
        }
    }
    broker.stop().await;
}
