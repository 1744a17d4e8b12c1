//! MQTT over real sockets with rumqttc against a real broker.

mod common;

use std::time::Duration;

use common::TestBroker;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};

fn client(broker: &TestBroker, id: &str, clean: bool) -> (AsyncClient, EventLoop) {
    let addr = broker.mqtt();
    let mut opts = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(30));
    opts.set_clean_session(clean);
    AsyncClient::new(opts, 64)
}

/// Polls until a packet matching `want` arrives.
async fn wait_for<T>(ev: &mut EventLoop, mut want: impl FnMut(&Packet) -> Option<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match ev.poll().await {
                Ok(Event::Incoming(p)) => {
                    if let Some(t) = want(&p) {
                        return t;
                    }
                }
                Ok(_) => {}
                Err(e) => panic!("connection error: {e}"),
            }
        }
    })
    .await
    .expect("packet within timeout")
}

#[tokio::test]
async fn qos1_publish_reaches_a_wildcard_subscriber() {
    let broker = TestBroker::start().await;
    let (sub, mut sub_ev) = client(&broker, "sub", true);
    sub.subscribe("sensors/+/temp", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    wait_for(&mut sub_ev, |p| {
        matches!(p, Packet::SubAck(_)).then_some(())
    })
    .await;

    let (publ, mut pub_ev) = client(&broker, "pub", true);
    publ.publish("sensors/k1/temp", QoS::AtLeastOnce, false, "21.5")
        .await
        .expect("publish");
    wait_for(&mut pub_ev, |p| {
        matches!(p, Packet::PubAck(_)).then_some(())
    })
    .await;

    let got = wait_for(&mut sub_ev, |p| match p {
        Packet::Publish(p) => Some(p.clone()),
        _ => None,
    })
    .await;
    assert_eq!(got.topic, "sensors/k1/temp");
    assert_eq!(&got.payload[..], b"21.5");
    assert_eq!(got.qos, QoS::AtLeastOnce);
    broker.stop().await;
}
