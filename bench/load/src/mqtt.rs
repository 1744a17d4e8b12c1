//! MQTT scenarios with rumqttc (3.1.1): 1 → 1 at QoS 0 and QoS 1, QoS 1
//! fan-out 1 → N, and N idle connections for memory per connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, NetworkOptions, Packet, QoS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinSet;

use crate::run::{supervise, unique, Tally, Target};
use crate::stats::{latency_ns, stamped_payload, Report};

/// Requests rumqttc buffers between `publish()` and its event loop; the
/// in-flight window (`set_inflight`) is what bounds QoS 1.
const REQUEST_CHANNEL_CAP: usize = 64;
/// Connections opened at once in the idle scenario.
const IDLE_CONNECT_CONCURRENCY: usize = 100;
/// Settling time before reading RSS, so the broker has finished allocating.
const IDLE_SETTLE: Duration = Duration::from_secs(3);

/// Parameters of a publish/subscribe scenario.
#[derive(Debug, Clone)]
pub(crate) struct PubSub {
    pub(crate) scenario: String,
    pub(crate) qos: QoS,
    pub(crate) subscribers: usize,
    /// Messages published (each is delivered to every subscriber).
    pub(crate) count: u64,
    pub(crate) size: usize,
    /// Unacknowledged QoS 1 publishes the publisher keeps in flight.
    pub(crate) inflight: u16,
}

fn client(target: &Target, id: &str, inflight: u16) -> (AsyncClient, EventLoop) {
    let mut o = MqttOptions::new(id, target.host.clone(), target.port);
    o.set_keep_alive(Duration::from_secs(60));
    o.set_clean_session(true);
    o.set_inflight(inflight.max(1));
    o.set_max_packet_size(1 << 20, 1 << 20);
    let (c, mut el) = AsyncClient::new(o, REQUEST_CHANNEL_CAP);
    let mut net = NetworkOptions::new();
    net.set_tcp_nodelay(true);
    el.set_network_options(net);
    (c, el)
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

/// Publish/subscribe: `subscribers` clients subscribe to one topic, one
/// publisher sends `count` messages; throughput counts deliveries.
pub(crate) async fn pubsub(target: &Target, p: &PubSub) -> anyhow::Result<Report> {
    let topic = unique("bench/mqtt");
    let expected = p.count * p.subscribers as u64;
    let tally = Tally::new(expected);
    let mut subs = JoinSet::new();
    let mut subacks = Vec::new();
    for i in 0..p.subscribers {
        let (c, el) = client(target, &format!("{topic}-s{i}"), p.inflight);
        let (tx, rx) = oneshot::channel();
        subacks.push((c.clone(), rx));
        c.subscribe(topic.clone(), p.qos).await?;
        subs.spawn(subscriber(el, tally.clone(), Some(tx)));
    }
    for (_, rx) in subacks.iter_mut() {
        tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .context("SUBACK in time")?
            .context("subscriber ended before SUBACK")?;
    }

    let (pc, mut pel) = client(target, &format!("{topic}-p"), p.inflight);
    let done = tally.clone();
    let pub_loop = tokio::spawn(async move {
        loop {
            tokio::select! {
                ev = pel.poll() => { ev.context("publisher connection")?; }
                () = done.done() => return anyhow::Ok(()),
            }
        }
    });

    let load0 = crate::procfs::self_cpu_us();
    let cpu0 = target.cpu_us()?;
    let started = Instant::now();
    let (qos, size, count, t) = (p.qos, p.size, p.count, topic.clone());
    let producer = {
        let (pc, tally, target, subscribers) = (
            pc.clone(),
            tally.clone(),
            target.clone(),
            p.subscribers as u64,
        );
        tokio::spawn(async move {
            let mut sent = 0;
            while sent < count && !target.send_time_over(started) {
                pc.publish(t.as_str(), qos, false, stamped_payload(size))
                    .await?;
                sent += 1;
            }
            tally.set_expected(sent * subscribers);
            anyhow::Ok(())
        })
    };
    let mut error = supervise(&tally, target, started).await;
    let elapsed = started.elapsed();
    let cpu1 = target.cpu_us()?;
    let load1 = crate::procfs::self_cpu_us();

    let mut latencies = Vec::new();
    while let Some(r) = subs.join_next().await {
        match r? {
            Ok(mut l) => latencies.append(&mut l),
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
    Ok(Report {
        scenario: p.scenario.clone(),
        broker: target.name.clone(),
        expected: tally.expected(),
        received: tally.received(),
        elapsed,
        latencies_ns: latencies,
        broker_cpu_us: cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
        load_cpu_us: load0.zip(load1).map(|(a, b)| b.saturating_sub(a)),
        extra: vec![
            (
                "published",
                (tally.expected() / p.subscribers.max(1) as u64).into(),
            ),
            ("subscribers", p.subscribers.into()),
            ("size", p.size.into()),
        ],
        error,
    })
}

/// An MQTT 3.1.1 CONNECT, clean session, keep-alive 0 (the broker never
/// expects a ping, so idle means idle).
fn connect_packet(client_id: &str) -> anyhow::Result<Vec<u8>> {
    let id = client_id.as_bytes();
    let id_len = u16::try_from(id.len()).context("client id length")?;
    let remaining = 10 + 2 + id.len();
    if remaining > 127 {
        bail!("client id too long for a one-byte remaining length");
    }
    let mut p = vec![
        0x10,
        remaining as u8,
        0,
        4,
        b'M',
        b'Q',
        b'T',
        b'T',
        4,
        0x02,
        0,
        0,
    ];
    p.extend_from_slice(&id_len.to_be_bytes());
    p.extend_from_slice(id);
    Ok(p)
}

/// An MQTT 3.1.1 SUBSCRIBE of `topic` at QoS 1, packet id 1.
fn subscribe_packet(topic: &str) -> anyhow::Result<Vec<u8>> {
    let t = topic.as_bytes();
    let t_len = u16::try_from(t.len()).context("topic length")?;
    let remaining = 2 + 2 + t.len() + 1;
    if remaining > 127 {
        bail!("topic too long for a one-byte remaining length");
    }
    let mut p = vec![0x82, remaining as u8, 0, 1];
    p.extend_from_slice(&t_len.to_be_bytes());
    p.extend_from_slice(t);
    p.push(1);
    Ok(p)
}

async fn idle_connection(
    target: &Target,
    id: &str,
    subscribe: bool,
) -> anyhow::Result<tokio::net::TcpStream> {
    let mut s = target.connect().await?;
    s.write_all(&connect_packet(id)?).await?;
    let mut connack = [0u8; 4];
    s.read_exact(&mut connack).await.context("CONNACK")?;
    if connack[0] != 0x20 || connack[3] != 0 {
        bail!("CONNACK refused: {connack:02x?}");
    }
    if subscribe {
        s.write_all(&subscribe_packet(&format!("{id}/cmd"))?)
            .await?;
        let mut suback = [0u8; 5];
        s.read_exact(&mut suback).await.context("SUBACK")?;
        if suback[0] != 0x90 || suback[4] > 2 {
            bail!("SUBACK refused: {suback:02x?}");
        }
    }
    Ok(s)
}

/// Opens `n` MQTT connections (each with a subscription of its own when
/// `subscribe`) that then stay silent, and reports the broker's RSS growth
/// per connection.
pub(crate) async fn idle(target: &Target, n: usize, subscribe: bool) -> anyhow::Result<Report> {
    let proc = target
        .proc
        .clone()
        .context("the idle scenario needs --broker-pid to read RSS")?;
    let prefix = unique("idle");
    let scenario = if subscribe {
        "mqtt-idle-sub"
    } else {
        "mqtt-idle"
    };
    let rss0 = proc.rss_bytes()?;
    let load0 = crate::procfs::self_cpu_us();
    let cpu0 = target.cpu_us()?;
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(IDLE_CONNECT_CONCURRENCY));
    let mut set = JoinSet::new();
    for i in 0..n {
        let (t, id, gate) = (target.clone(), format!("{prefix}-{i}"), gate.clone());
        set.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            idle_connection(&t, &id, subscribe).await
        });
    }
    let mut conns = Vec::with_capacity(n);
    let mut error = None;
    while let Some(r) = set.join_next().await {
        match r? {
            Ok(s) => conns.push(s),
            Err(e) => error = error.or(Some(format!("{e:#}"))),
        }
    }
    let elapsed = started.elapsed();
    tokio::time::sleep(IDLE_SETTLE).await;
    let rss1 = proc.rss_bytes()?;
    let cpu1 = target.cpu_us()?;
    let load1 = crate::procfs::self_cpu_us();
    let open = conns.len() as u64;
    let per_conn = if open > 0 {
        rss1.saturating_sub(rss0) as f64 / open as f64
    } else {
        0.0
    };
    println!(
        "{scenario} on {}: {open}/{n} connections, RSS {} -> {} KiB, {:.0} B per connection",
        target.name,
        rss0 / 1024,
        rss1 / 1024,
        per_conn
    );
    drop(conns);
    Ok(Report {
        scenario: scenario.into(),
        broker: target.name.clone(),
        expected: n as u64,
        received: open,
        elapsed,
        latencies_ns: Vec::new(),
        broker_cpu_us: cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
        load_cpu_us: load0.zip(load1).map(|(a, b)| b.saturating_sub(a)),
        extra: vec![
            ("rss_before_bytes", rss0.into()),
            ("rss_after_bytes", rss1.into()),
            ("rss_per_conn_bytes", per_conn.into()),
        ],
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_packet_layout() {
        let p = connect_packet("ab").expect("packet");
        assert_eq!(
            p,
            [0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 0, 0, 2, b'a', b'b']
        );
        assert!(connect_packet(&"x".repeat(200)).is_err());
    }
}
