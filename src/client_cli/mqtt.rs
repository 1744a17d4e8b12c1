//! MQTT 5 with rumqttc, over TCP, TLS or WebSocket. Version 5 rather than
//! 3.1.1 because its acknowledgements carry reason codes: a publish or a
//! subscription the broker refuses (not authorized, quota) is an error
//! here, where 3.1.1 would drop the message without a word.

use std::time::Duration;

use anyhow::{bail, Context};
use rumqttc::v5::mqttbytes::v5::{
    Packet, PubAck, PubAckReason, PubRec, PubRecReason, SubscribeReasonCode,
};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions};
use rumqttc::{Outgoing, TlsConfiguration, Transport};

use super::url::Transport as UrlTransport;
use super::{connecting, PublishPlan, Receiving, Target};

/// Largest packet accepted: the broker's default MQTT limit
/// (`[mqtt] max_packet_size_bytes`); the broker's CONNACK bounds what we send.
const PACKET_SIZE_MAX_BYTES: u32 = 8 * 1024 * 1024;
/// Requests rumqttc buffers between the caller and its event loop.
const REQUESTS_MAX: usize = 64;
const KEEP_ALIVE: Duration = Duration::from_secs(30);

fn qos(level: u8) -> QoS {
    match level {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

fn client(target: &Target) -> anyhow::Result<(AsyncClient, EventLoop)> {
    let e = &target.endpoint;
    // Over WebSocket rumqttc takes the whole URL as the host.
    let host = match e.transport {
        UrlTransport::WebSocket { secure } => {
            let scheme = if secure { "wss" } else { "ws" };
            format!("{scheme}://{}:{}{}", e.host, e.port, e.ws_path())
        }
        _ => e.host.clone(),
    };
    let mut options = MqttOptions::new(target.client_id.clone(), host, e.port);
    options
        .set_keep_alive(KEEP_ALIVE)
        .set_clean_start(true)
        // `sub` acknowledges only what it printed: a message past --count
        // stays with the broker.
        .set_manual_acks(true)
        .set_max_packet_size(Some(PACKET_SIZE_MAX_BYTES));
    if let Some(user) = &e.user {
        options.set_credentials(user.clone(), e.password.clone().unwrap_or_default());
    }
    let tls = || {
        let config = target
            .tls
            .clone()
            .context("a TLS URL without a TLS configuration")?;
        anyhow::Ok(TlsConfiguration::Rustls(config))
    };
    match e.transport {
        UrlTransport::Tcp => {}
        UrlTransport::Tls => {
            options.set_transport(Transport::Tls(tls()?));
        }
        UrlTransport::WebSocket { secure: false } => {
            options.set_transport(Transport::Ws);
        }
        UrlTransport::WebSocket { secure: true } => {
            options.set_transport(Transport::Wss(tls()?));
        }
    }
    Ok(AsyncClient::new(options, REQUESTS_MAX))
}

/// The first error of the event loop, said for people.
fn explain(e: ConnectionError) -> anyhow::Error {
    match e {
        ConnectionError::ConnectionRefused(code) => {
            anyhow::anyhow!("the broker refused the connection: {code:?} (CONNACK)")
        }
        other => anyhow::Error::new(other),
    }
}

/// Polls until CONNACK.
async fn connected(target: &Target, events: &mut EventLoop) -> anyhow::Result<()> {
    connecting(&target.endpoint, async {
        loop {
            if let Event::Incoming(Packet::ConnAck(_)) = events.poll().await.map_err(explain)? {
                return Ok(());
            }
        }
    })
    .await
}

/// Sends DISCONNECT after what is queued, and polls until it is written.
async fn disconnect(client: &AsyncClient, events: &mut EventLoop) -> anyhow::Result<()> {
    client.try_disconnect()?;
    loop {
        if let Event::Outgoing(Outgoing::Disconnect) = events.poll().await.map_err(explain)? {
            return Ok(());
        }
    }
}

/// A PUBACK or PUBREC that refuses the message.
fn refused_ack(packet: &Packet) -> Option<String> {
    let reason_string = |r: &Option<String>| r.clone().unwrap_or_default();
    match packet {
        Packet::PubAck(PubAck {
            reason, properties, ..
        }) if !matches!(
            reason,
            PubAckReason::Success | PubAckReason::NoMatchingSubscribers
        ) =>
        {
            let text = properties.as_ref().map(|p| reason_string(&p.reason_string));
            Some(format!("PUBACK {reason:?} {}", text.unwrap_or_default()))
        }
        Packet::PubRec(PubRec {
            reason, properties, ..
        }) if !matches!(
            reason,
            PubRecReason::Success | PubRecReason::NoMatchingSubscribers
        ) =>
        {
            let text = properties.as_ref().map(|p| reason_string(&p.reason_string));
            Some(format!("PUBREC {reason:?} {}", text.unwrap_or_default()))
        }
        _ => None,
    }
}

pub(super) async fn publish(target: &Target, plan: &PublishPlan) -> anyhow::Result<()> {
    let (client, mut events) = client(target)?;
    connected(target, &mut events).await?;
    let topic = target.endpoint.address.mqtt_topic();
    let level = qos(target.qos);
    // The publishing runs beside the event loop, which must be polled for
    // rumqttc to write anything.
    let publisher = {
        let client = client.clone();
        let mut plan = plan.clone();
        tokio::spawn(async move {
            for n in 1..=plan.count {
                plan.pacer.wait().await;
                client
                    .publish(topic.clone(), level, false, plan.payload(n))
                    .await?;
            }
            Ok::<_, rumqttc::v5::ClientError>(())
        })
    };
    // Done when the last message is acknowledged (QoS 1: PUBACK, 2:
    // PUBCOMP) or, at QoS 0, written.
    let mut done = 0;
    let outcome = async {
        while done < plan.count {
            let event = events.poll().await.map_err(explain)?;
            let finished = match &event {
                Event::Incoming(packet) => {
                    if let Some(refusal) = refused_ack(packet) {
                        bail!(
                            "the broker refused message {}: {}",
                            done + 1,
                            refusal.trim()
                        );
                    }
                    match packet {
                        Packet::PubAck(_) => level == QoS::AtLeastOnce,
                        Packet::PubComp(_) => level == QoS::ExactlyOnce,
                        _ => false,
                    }
                }
                Event::Outgoing(Outgoing::Publish(_)) => level == QoS::AtMostOnce,
                Event::Outgoing(_) => false,
            };
            done += u64::from(finished);
        }
        disconnect(&client, &mut events).await
    }
    .await;
    publisher.abort();
    outcome.with_context(|| format!("publishing to {} ({done} done)", target.endpoint))
}

pub(super) async fn subscribe(target: &Target, receiving: &mut Receiving) -> anyhow::Result<()> {
    let (client, mut events) = client(target)?;
    connected(target, &mut events).await?;
    let filter = target.endpoint.address.mqtt_topic();
    client.try_subscribe(filter.clone(), qos(target.qos))?;
    while receiving.wants_more() {
        match events.poll().await.map_err(explain)? {
            Event::Incoming(Packet::SubAck(ack)) => {
                if let Some(code) = ack
                    .return_codes
                    .iter()
                    .find(|c| !matches!(c, SubscribeReasonCode::Success(_)))
                {
                    bail!(
                        "subscribing to {}: the broker refused the subscription to '{filter}' \
                         (SUBACK {code:?})",
                        target.endpoint
                    );
                }
                receiving.subscribed(&target.endpoint);
            }
            Event::Incoming(Packet::Publish(p)) => {
                receiving.take(&p.payload)?;
                client.try_ack(&p)?;
            }
            _ => {}
        }
    }
    disconnect(&client, &mut events).await
}
