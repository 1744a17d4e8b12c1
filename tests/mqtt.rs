//! MQTT over real sockets with rumqttc against a real broker.

mod common;

use common::mqtt::{client4, publish4, publish_and_ack4, subscriber4};
use common::TestBroker;
use rumqttc::QoS;

#[tokio::test]
async fn qos1_publish_reaches_a_wildcard_subscriber() {
    let broker = TestBroker::start().await;
    let (_sub, mut sub_ev) =
        subscriber4(&broker, "sub", true, "sensors/+/temp", QoS::AtLeastOnce).await;

    let (publ, mut pub_ev) = client4(&broker, "pub", true);
    publish_and_ack4(
        &publ,
        &mut pub_ev,
        "sensors/k1/temp",
        QoS::AtLeastOnce,
        false,
        b"21.5",
    )
    .await;

    let got = publish4(&mut sub_ev).await;
    assert_eq!(got.topic, "sensors/k1/temp");
    assert_eq!(&got.payload[..], b"21.5");
    assert_eq!(got.qos, QoS::AtLeastOnce);
    broker.stop().await;
}

/// Keep-alive of [`an_idle_connection_still_pings_and_gets_deliveries`]:
/// short, so the test waits past a few quiet turns without the broker
/// closing the connection (it allows 1.5 times this without a packet).
const IDLE_KEEP_ALIVE_S: u16 = 2;

/// An idle connection gives its read and write buffers back between
/// packets (see the server's connection driver); once quiet it must still
/// answer a PINGREQ, take a delivery, and be kept open by its pings.
#[tokio::test]
async fn an_idle_connection_still_pings_and_gets_deliveries() {
    use common::mqtt::{p4, raw_subscribe4, Raw};
    let broker = TestBroker::start().await;
    let (mut idle, ack) = Raw::connect4(broker.mqtt(), "idle-dev", true, IDLE_KEEP_ALIVE_S).await;
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
    raw_subscribe4(&mut idle, 1, "idle-dev/cmd", QoS::AtLeastOnce).await;
    // Quiet for longer than the keep-alive, pinging at half of it: every
    // ping arrives on a connection whose buffers were released.
    let half = std::time::Duration::from_millis(u64::from(IDLE_KEEP_ALIVE_S) * 500);
    for _ in 0..3 {
        tokio::time::sleep(half).await;
        idle.send4(p4::Packet::PingReq).await;
        match idle.recv4().await {
            p4::Packet::PingResp => {}
            other => panic!("expected PINGRESP, got {other:?}"),
        }
    }
    tokio::time::sleep(half).await;
    let (publ, mut pub_ev) = client4(&broker, "idle-pub", true);
    publish_and_ack4(
        &publ,
        &mut pub_ev,
        "idle-dev/cmd",
        QoS::AtLeastOnce,
        false,
        b"reboot",
    )
    .await;
    let got = idle.recv4_publish().await;
    assert_eq!(&got.payload[..], b"reboot");
    assert_eq!(got.qos, QoS::AtLeastOnce);
    idle.send4(p4::Packet::PubAck(p4::PubAck::new(got.pkid)))
        .await;
    broker.stop().await;
}
