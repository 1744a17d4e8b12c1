//! MQTT retained messages for STOMP and AMQP subscribers who ask for them
//! (docs/conversion.md, "Retained messages"): a STOMP topic SUBSCRIBE with
//! `activemq.retroactive:true`, an AMQP topic receiver with the source
//! filter `rosetta:retained`. Subscribers that do not ask get none.

mod common;

use std::time::Duration;

use common::stomp::StompClient;
use common::TestBroker;
use fe2o3_amqp::link::delivery::Delivery;
use fe2o3_amqp::types::messaging::annotations::OwnedKey;
use fe2o3_amqp::types::messaging::{Body, Source};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use fe2o3_amqp::{Connection, Receiver, Session};
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

/// How long a subscriber that did not ask waits to be sure nothing comes.
const QUIET: Duration = Duration::from_millis(500);

/// Publishes `(topic, payload, retain)` at QoS 1 with MQTT 5 and waits for
/// every PUBACK.
async fn mqtt_publish(broker: &TestBroker, id: &str, messages: &[(&str, &str, bool)]) {
    let addr = broker.mqtt();
    let mut opts = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut ev) = AsyncClient::new(opts, 64);
    for (topic, payload, retain) in messages {
        client
            .publish(
                *topic,
                QoS::AtLeastOnce,
                *retain,
                payload.as_bytes().to_vec(),
            )
            .await
            .expect("publish");
    }
    let mut acked = 0;
    tokio::time::timeout(Duration::from_secs(10), async {
        while acked < messages.len() {
            match ev.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(e) => panic!("mqtt: {e}"),
            }
        }
    })
    .await
    .expect("PUBACKs");
    client.disconnect().await.expect("disconnect");
}

#[tokio::test]
async fn stomp_subscription_gets_retained_messages_only_when_it_asks() {
    let broker = TestBroker::start().await;
    mqtt_publish(
        &broker,
        "ret-pub",
        &[
            ("st/a", "ret-a", true),
            ("st/b", "ret-b", true),
            ("st/c", "not-retained", false),
        ],
    )
    .await;
    let mut yes = StompClient::connect(broker.stomp(), &[]).await;
    yes.subscribe(
        "y",
        "/topic/st/+",
        "auto",
        &[("activemq.retroactive", "true")],
    )
    .await;
    let mut no = StompClient::connect(broker.stomp(), &[]).await;
    no.subscribe("n", "/topic/st/+", "auto", &[]).await;

    let got = yes.messages(2).await;
    let mut bodies: Vec<_> = got.iter().map(|m| m.text()).collect();
    bodies.sort();
    assert_eq!(bodies, ["ret-a", "ret-b"]);
    for m in &got {
        assert_eq!(m.header("retained"), Some("true"), "{m:?}");
        assert_eq!(m.header("persistent"), Some("true"), "QoS 1 retained");
    }
    assert_eq!(no.message_or_none().await, None, "did not ask: none");

    mqtt_publish(&broker, "ret-pub2", &[("st/a", "live", false)]).await;
    for c in [&mut yes, &mut no] {
        let m = c.message().await;
        assert_eq!(m.text(), "live");
        assert_eq!(m.header("retained"), None, "a live message is not marked");
    }
    assert_eq!(
        yes.message_or_none().await,
        None,
        "each retained message once"
    );
    broker.stop().await;
}

/// A topic receiver, with or without the `rosetta:retained` filter.
async fn receiver(
    session: &mut fe2o3_amqp::session::SessionHandle<()>,
    name: &str,
    retained: bool,
) -> Receiver {
    let mut source = Source::builder().address("/topic/at/#");
    if retained {
        source = source.add_to_filter_using_legacy_format("rosetta:retained", true);
    }
    Receiver::builder()
        .name(name)
        .source(source.build())
        .attach(session)
        .await
        .expect("attach receiver")
}

async fn recv_within(r: &mut Receiver, wait: Duration) -> Option<Delivery<Body<Value>>> {
    match tokio::time::timeout(wait, r.recv::<Body<Value>>()).await {
        Ok(d) => {
            let d = d.expect("recv");
            r.accept(&d).await.expect("accept");
            Some(d)
        }
        Err(_) => None,
    }
}

fn retain_annotation(d: &Delivery<Body<Value>>) -> Option<Value> {
    let key = OwnedKey::from(Symbol::from("x-opt-retain"));
    d.message()
        .message_annotations
        .as_ref()
        .and_then(|a| a.0.get(&key).cloned())
}

fn body_text(d: &Delivery<Body<Value>>) -> String {
    match d.body() {
        Body::Value(v) => match &v.0 {
            Value::String(s) => s.clone(),
            other => panic!("not a string: {other:?}"),
        },
        other => panic!("unexpected body {other:?}"),
    }
}

#[tokio::test]
async fn amqp_receiver_gets_retained_messages_only_with_the_filter() {
    let broker = TestBroker::start().await;
    mqtt_publish(&broker, "ret-pub", &[("at/x", "ret-x", true)]).await;
    // An MQTT 5 text payload would be an AMQP string; rumqttc sends none
    // here, so the retained message is one `data` section.
    let url = format!("amqp://{}", broker.amqp());
    let mut conn = Connection::open("retained", url.as_str())
        .await
        .expect("amqp open");
    let mut session = Session::begin(&mut conn).await.expect("begin");
    let mut yes = receiver(&mut session, "yes", true).await;
    let mut no = receiver(&mut session, "no", false).await;

    let d = recv_within(&mut yes, Duration::from_secs(10))
        .await
        .expect("the retained message");
    match d.body() {
        Body::Data(data) => assert_eq!(&data[0].0[..], b"ret-x"),
        other => panic!("unexpected body {other:?}"),
    }
    assert_eq!(retain_annotation(&d), Some(Value::Bool(true)));
    assert!(
        recv_within(&mut no, QUIET).await.is_none(),
        "did not ask: none"
    );

    let url_s = format!("amqp://{}", broker.amqp());
    let mut c2 = Connection::open("live-pub", url_s.as_str())
        .await
        .expect("amqp open");
    let mut s2 = Session::begin(&mut c2).await.expect("begin");
    let mut sender = fe2o3_amqp::Sender::attach(&mut s2, "s", "/topic/at/x")
        .await
        .expect("attach sender");
    sender
        .send("live")
        .await
        .expect("send")
        .accepted_or_else(|o| o)
        .expect("accepted");
    for r in [&mut yes, &mut no] {
        let d = recv_within(r, Duration::from_secs(10))
            .await
            .expect("the live message");
        assert_eq!(body_text(&d), "live");
        assert_eq!(retain_annotation(&d), None, "a live message is not marked");
    }
    assert!(recv_within(&mut yes, QUIET).await.is_none(), "once");

    sender.close().await.expect("close");
    s2.end().await.expect("end");
    c2.close().await.expect("close");
    yes.close().await.expect("close");
    no.close().await.expect("close");
    session.end().await.expect("end");
    conn.close().await.expect("close");
    broker.stop().await;
}
