//! MQTT 3.1.1 scenarios: 1 → 1 at QoS 0 and QoS 1, QoS 1 fan-out 1 → N,
//! and a login storm next to a QoS 1 stream ([`login_storm`]); the
//! packets of the idle scenarios ([`crate::idle`]).
//!
//! Two clients run the publish/subscribe scenarios: `wire` (our own,
//! [`crate::mqtt_client`]; the default, cheap enough that the broker, not
//! the tool, bounds the run) and `rumqttc`, kept to compare against. The
//! idle scenario writes its few packets by hand.

pub(crate) mod connect;
pub(crate) mod login_storm;
mod rumqtt;
mod wire;

use std::time::Duration;

use anyhow::{bail, Context};

use crate::run::{unique, Tally, Target};
use crate::stats::Report;

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

/// How a client reaches the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Transport {
    /// Plain TCP.
    Tcp,
    /// TLS over TCP (`--tls-ca`).
    Tls,
    /// WebSocket (subprotocol `mqtt`, path `--ws-path`).
    Ws,
}

/// The client options every publish/subscribe scenario takes.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ClientArgs {
    /// `wire`: our own batching client; `rumqttc`: rumqttc's.
    #[arg(long, value_enum, default_value_t = Client::Wire)]
    pub(crate) client: Client,
    /// How the clients connect; `tls` and `ws` need `--client rumqttc`.
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub(crate) transport: Transport,
    /// With `--transport tls`: the CA certificates (PEM) to trust; the
    /// broker's certificate must name the host connected to.
    #[arg(long)]
    pub(crate) tls_ca: Option<std::path::PathBuf>,
    /// With `--transport ws`: the WebSocket path.
    #[arg(long, default_value = "/mqtt")]
    pub(crate) ws_path: String,
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
    /// Publishes per second, paced (0: as fast as the window allows).
    pub(crate) rate: u32,
}

/// Publish/subscribe: `subscribers` clients subscribe to one topic, one
/// publisher sends `count` messages; throughput counts deliveries.
pub(crate) async fn pubsub(target: &Target, p: &PubSub) -> anyhow::Result<Report> {
    let topic = unique("bench/mqtt");
    let tally = Tally::new(p.count * p.subscribers as u64);
    if p.client.client == Client::Wire && (p.client.transport != Transport::Tcp || p.rate > 0) {
        bail!("the wire client speaks plain TCP, unpaced: use --client rumqttc for --transport and --rate");
    }
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
            (
                "transport",
                format!("{:?}", p.client.transport).to_lowercase().into(),
            ),
            ("rate", p.rate.into()),
            ("published", published.into()),
            ("subscribers", p.subscribers.into()),
            ("size", p.size.into()),
        ],
    ))
}

/// MQTT 3.1.1's protocol level in CONNECT.
pub(crate) const V311: u8 = 4;
/// MQTT 5's.
pub(crate) const V5: u8 = 5;

/// A clean-session CONNECT of protocol level `version` ([`V311`] or [`V5`],
/// with no properties) with `keep_alive_s` (0: the broker never expects a
/// ping, so idle means idle).
pub(crate) fn connect_packet(
    client_id: &str,
    version: u8,
    keep_alive_s: u16,
) -> anyhow::Result<Vec<u8>> {
    let id = client_id.as_bytes();
    let id_len = u16::try_from(id.len()).context("client id length")?;
    let properties = usize::from(version == V5);
    let remaining = 10 + properties + 2 + id.len();
    if remaining > 127 {
        bail!("client id too long for a one-byte remaining length");
    }
    let [ka_hi, ka_lo] = keep_alive_s.to_be_bytes();
    let mut p = vec![
        0x10,
        remaining as u8,
        0,
        4,
        b'M',
        b'Q',
        b'T',
        b'T',
        version,
        0x02,
        ka_hi,
        ka_lo,
    ];
    if version == V5 {
        // Property length 0.
        p.push(0);
    }
    p.extend_from_slice(&id_len.to_be_bytes());
    p.extend_from_slice(id);
    Ok(p)
}

/// An MQTT 3.1.1 SUBSCRIBE of `topic` at QoS 1, packet id 1.
pub(crate) fn subscribe_packet(topic: &str) -> anyhow::Result<Vec<u8>> {
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

/// A CONNACK that accepted the connection (its first 4 bytes).
pub(crate) fn check_connack(connack: &[u8]) -> anyhow::Result<()> {
    match connack {
        [0x20, _, _, 0, ..] => Ok(()),
        _ => bail!("CONNACK refused: {connack:02x?}"),
    }
}

/// A SUBACK that granted a QoS (its first 5 bytes).
pub(crate) fn check_suback(suback: &[u8]) -> anyhow::Result<()> {
    match suback {
        [0x90, _, _, _, granted, ..] if *granted <= 2 => Ok(()),
        _ => bail!("SUBACK refused: {suback:02x?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_packet_layout() {
        let p = connect_packet("ab", V311, 0).expect("packet");
        assert_eq!(
            p,
            [0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 0, 0, 2, b'a', b'b']
        );
        assert!(connect_packet(&"x".repeat(200), V311, 0).is_err());
        assert_eq!(
            connect_packet("ab", V311, 60).expect("packet")[10..12],
            [0, 60]
        );
        // MQTT 5: level 5 and an empty property list before the client id.
        let p = connect_packet("ab", V5, 0).expect("packet");
        assert_eq!(
            p,
            [0x10, 15, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 0, 0, 0, 2, b'a', b'b']
        );
    }
}
