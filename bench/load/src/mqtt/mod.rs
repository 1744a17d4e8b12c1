//! MQTT 3.1.1 scenarios: 1 → 1 at QoS 0 and QoS 1, QoS 1 fan-out 1 → N,
//! N idle connections for memory per connection, and a login storm next
//! to a QoS 1 stream ([`login_storm`]).
//!
//! Two clients run the publish/subscribe scenarios: `wire` (our own,
//! [`crate::mqtt_client`]; the default, cheap enough that the broker, not
//! the tool, bounds the run) and `rumqttc`, kept to compare against. The
//! idle scenario writes its few packets by hand.

pub(crate) mod connect;
pub(crate) mod login_storm;
mod rumqtt;
mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::run::{unique, Tally, Target};
use crate::stats::Report;

/// Connections opened at once in the idle scenario.
const IDLE_CONNECT_CONCURRENCY: usize = 100;
/// Settling time before reading RSS, so the broker has finished allocating.
const IDLE_SETTLE: Duration = Duration::from_secs(3);
/// Keep-alive of publish/subscribe connections: long enough that a run
/// rarely pings, short enough that a broker notices a dead tool.
const KEEP_ALIVE_S: u16 = 60;
/// How long subscribers may take to be granted their subscriptions.
const SUBACK_TIMEOUT: Duration = Duration::from_secs(30);

/// Which MQTT client drives a publish/subscribe scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Client {
    /// Our own batching client (`mqtt_client`).
    Wire,
    /// rumqttc's client.
    Rumqttc,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Self::Wire => "wire",
            Self::Rumqttc => "rumqttc",
        }
    }
}

/// The client options every publish/subscribe scenario takes.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ClientArgs {
    /// `wire`: our own batching client; `rumqttc`: rumqttc's.
    #[arg(long, value_enum, default_value_t = Client::Wire)]
    pub(crate) client: Client,
    /// CONNECT user name (none: anonymous).
    #[arg(long)]
    pub(crate) username: Option<String>,
    /// CONNECT password (MQTT 3.1.1 sends one only with a user name).
    #[arg(long, requires = "username")]
    pub(crate) password: Option<String>,
}

/// Parameters of a publish/subscribe scenario.
#[derive(Debug, Clone)]
pub(crate) struct PubSub {
    pub(crate) scenario: String,
    pub(crate) client: ClientArgs,
    /// 0 or 1, for the publishes and the subscriptions alike.
    pub(crate) qos: u8,
    pub(crate) subscribers: usize,
    /// Messages published (each is delivered to every subscriber).
    pub(crate) count: u64,
    pub(crate) size: usize,
    /// Unacknowledged QoS 1 publishes the publisher keeps in flight.
    pub(crate) inflight: u16,
}

/// Publish/subscribe: `subscribers` clients subscribe to one topic, one
/// publisher sends `count` messages; throughput counts deliveries.
pub(crate) async fn pubsub(target: &Target, p: &PubSub) -> anyhow::Result<Report> {
    let topic = unique("bench/mqtt");
    let tally = Tally::new(p.count * p.subscribers as u64);
    let m = match p.client.client {
        Client::Wire => wire::run(target, p, &topic, tally.clone()).await?,
        Client::Rumqttc => rumqtt::run(target, p, &topic, tally.clone()).await?,
    };
    let published = tally.expected() / p.subscribers.max(1) as u64;
    Ok(m.into_report(
        p.scenario.clone(),
        target,
        &tally,
        vec![
            ("client", p.client.client.name().into()),
            ("published", published.into()),
            ("subscribers", p.subscribers.into()),
            ("size", p.size.into()),
        ],
    ))
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
