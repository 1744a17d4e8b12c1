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
