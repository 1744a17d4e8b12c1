//! The publish/subscribe scenarios driven by rumqttc (`--client rumqttc`),
//! kept to compare against the wire client.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, NetworkOptions, Packet, QoS};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::{PubSub, Transport, KEEP_ALIVE_S, SUBACK_TIMEOUT};
use crate::run::{supervise, Tally, Target};
use crate::run::{Measured, Meter};
use crate::stats::{latency_ns, stamped_payload};

/// Requests rumqttc buffers between `publish()` and its event loop; the
/// in-flight window (`set_inflight`) is what bounds QoS 1.
const REQUEST_CHANNEL_CAP: usize = 64;

fn client(target: &Target, p: &PubSub, id: &str) -> anyhow::Result<(AsyncClient, EventLoop)> {
    let host = match p.client.transport {
        // rumqttc takes the whole URL as the host for WebSocket.
        Transport::Ws => format!("ws://{}:{}{}", target.host, target.port, p.client.ws_path),
        Transport::Tcp | Transport::Tls => target.host.clone(),
    };
    let mut o = MqttOptions::new(id, host, target.port);
    match p.client.transport {
        Transport::Tcp => {}
        Transport::Tls => {
            let ca = p
                .client
                .tls_ca
                .as_deref()
                .context("--transport tls needs --tls-ca")?;
            o.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(crate::tls::client_config(ca)?),
            ));
        }
        Transport::Ws => {
            o.set_transport(rumqttc::Transport::Ws);
        }
    }
    if let Some(user) = &p.client.username {
        o.set_credentials(user, p.client.password.as_deref().unwrap_or_default());
    }
    let inflight = p.inflight;
    o.set_keep_alive(Duration::from_secs(u64::from(KEEP_ALIVE_S)));
    o.set_clean_session(true);
    o.set_inflight(inflight.max(1));
    o.set_max_packet_size(1 << 20, 1 << 20);
    let (c, mut el) = AsyncClient::new(o, REQUEST_CHANNEL_CAP);
    let mut net = NetworkOptions::new();
    net.set_tcp_nodelay(true);
    el.set_network_options(net);
    Ok((c, el))
}

/// Polls a subscriber's event loop: signals SUBACK, records the latency of
/// every publish, until the run is over.
async fn subscriber(
    mut el: EventLoop,
    tally: Arc<Tally>,
    mut suback: Option<oneshot::Sender<()>>,
) -> anyhow::Result<Vec<u64>> {
    let mut lat = Vec::new();
    loop {
        tokio::select! {
            ev = el.poll() => match ev.context("subscriber connection")? {
                Event::Incoming(Packet::SubAck(_)) => {
                    if let Some(tx) = suback.take() {
                        let _ = tx.send(());
                    }
                }
                Event::Incoming(Packet::Publish(p)) => {
                    if let Some(l) = latency_ns(&p.payload) {
                        lat.push(l);
                    }
                    tally.add(1);
                }
                _ => {}
            },
            () = tally.done() => return Ok(lat),
        }
    }
}

pub(super) async fn run(
    target: &Target,
    p: &PubSub,
    topic: &str,
    tally: Arc<Tally>,
) -> anyhow::Result<Measured> {
    let qos = if p.qos == 0 {
        QoS::AtMostOnce
    } else {
        QoS::AtLeastOnce
    };
    let mut subs = JoinSet::new();
    let mut subacks = Vec::new();
    for i in 0..p.subscribers {
        let (c, el) = client(target, p, &format!("{topic}-s{i}"))?;
        let (tx, rx) = oneshot::channel();
        subacks.push((c.clone(), rx));
        c.subscribe(topic, qos).await?;
        subs.spawn(subscriber(el, tally.clone(), Some(tx)));
    }
    for (_, rx) in subacks.iter_mut() {
        tokio::time::timeout(SUBACK_TIMEOUT, rx)
            .await
            .context("SUBACK in time")?
            .context("subscriber ended before SUBACK")?;
    }

    let (pc, mut pel) = client(target, p, &format!("{topic}-p"))?;
    let done = tally.clone();
    let pub_loop = tokio::spawn(async move {
        loop {
            tokio::select! {
                ev = pel.poll() => { ev.context("publisher connection")?; }
                () = done.done() => return anyhow::Ok(()),
            }
        }
    });

    let meter = Meter::start(target)?;
    let started = meter.started;
    let (size, count, rate, t) = (p.size, p.count, p.rate, topic.to_owned());
    let producer = {
        let (pc, tally, target, subscribers) = (
            pc.clone(),
            tally.clone(),
            target.clone(),
            p.subscribers as u64,
        );
        tokio::spawn(async move {
            let mut sent = 0;
            // Paced: one publish per tick, a late tick not made up with a
            // burst, so that latency is measured at a steady rate.
            let mut tick = (rate > 0).then(|| {
                let mut t = tokio::time::interval(Duration::from_secs(1) / rate);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                t
            });
            while sent < count && !target.send_time_over(started) {
                if let Some(t) = tick.as_mut() {
                    t.tick().await;
                }
                pc.publish(t.as_str(), qos, false, stamped_payload(size))
                    .await?;
                sent += 1;
            }
            tally.set_expected(sent * subscribers);
            anyhow::Ok(())
        })
    };
    let mut error = supervise(&tally, target, started).await;
    let mut m = meter.stop(target)?;

    while let Some(r) = subs.join_next().await {
        match r? {
            Ok(mut l) => m.latencies_ns.append(&mut l),
            Err(e) => error = error.or(Some(format!("{e:#}"))),
        }
    }
    if let Err(e) = pub_loop.await? {
        error = error.or(Some(format!("{e:#}")));
    }
    producer.abort();
    let _ = pc.disconnect().await;
    for (c, _) in subacks {
        let _ = c.disconnect().await;
    }
    m.error = error;
    Ok(m)
}
