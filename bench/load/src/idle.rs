//! N idle connections of one protocol, for the broker's memory per
//! connection: each connects (and, with `--subscribe`, subscribes to a
//! topic of its own, as a device waiting for commands does), then stays
//! silent while the broker's RSS is read.
//!
//! The handshakes are written by hand (MQTT, STOMP, WebSocket) or by the
//! AMQP wire client, which then gives its buffers back: the tool holds
//! 19,000 connections, so what each one keeps is a socket and little more.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::amqp_client;
use crate::mqtt;
use crate::run::{unique, Target};
use crate::stats::Report;

/// Connections opened at once: enough to open 19,000 in seconds, few
/// enough to stay under the broker's `unauthenticated_connections_max`.
const IDLE_CONNECT_CONCURRENCY: usize = 100;
/// Settling time before reading RSS, so the broker has finished allocating.
const IDLE_SETTLE: Duration = Duration::from_secs(3);
/// Longest a handshake answer (CONNACK, CONNECTED, the upgrade) may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest handshake answer read (an HTTP upgrade response, a STOMP
/// CONNECTED frame): anything longer is not what we asked for.
const ANSWER_MAX_BYTES: usize = 4096;

/// The protocol (and transport) the idle connections speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Protocol {
    /// MQTT 3.1.1 over TCP.
    Mqtt,
    /// MQTT 3.1.1 over WebSocket (path `/mqtt`, subprotocol `mqtt`).
    MqttWs,
    /// STOMP 1.2 over TCP.
    Stomp,
    /// AMQP 1.0 over TCP (SASL ANONYMOUS), one session.
    Amqp,
}

impl Protocol {
    fn scenario(self, subscribe: bool) -> String {
        let base = match self {
            Self::Mqtt => "mqtt-idle",
            Self::MqttWs => "mqtt-ws-idle",
            Self::Stomp => "stomp-idle",
            Self::Amqp => "amqp-idle",
        };
        if subscribe {
            format!("{base}-sub")
        } else {
            base.to_owned()
        }
    }
}

/// What an idle scenario opens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Idle {
    pub(crate) protocol: Protocol,
    pub(crate) connections: usize,
    pub(crate) subscribe: bool,
    /// MQTT keep-alive and STOMP/AMQP heart-beat asked for, in seconds
    /// (0: none). The run is far shorter than 1.5 times it, so nobody pings.
    pub(crate) keep_alive_s: u16,
    /// How long to keep the connections open after RSS is read.
    pub(crate) hold: Duration,
    /// Connections opened per second at most (0: unpaced).
    pub(crate) connect_rate: u32,
}

/// An open connection the tool holds and never reads.
enum Held {
    Tcp { _socket: TcpStream },
    Amqp { _connection: amqp_client::Idle },
}

/// Reads until `done` says the answer is complete; the answer.
async fn read_answer(
    s: &mut TcpStream,
    what: &'static str,
    done: impl Fn(&[u8]) -> bool,
) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while !done(&buf) {
        if buf.len() > ANSWER_MAX_BYTES {
            bail!("{what}: answer longer than {ANSWER_MAX_BYTES} bytes");
        }
        let n = tokio::time::timeout(HANDSHAKE_TIMEOUT, s.read(&mut chunk))
            .await
            .with_context(|| format!("{what}: no answer"))??;
        if n == 0 {
            bail!("{what}: connection closed");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(buf)
}

async fn mqtt_tcp(t: &Target, id: &str, idle: &Idle) -> anyhow::Result<Held> {
    let mut s = t.connect().await?;
    s.write_all(&mqtt::connect_packet(id, mqtt::V311, idle.keep_alive_s)?)
        .await?;
    let connack = read_answer(&mut s, "CONNACK", |b| b.len() >= 4).await?;
    mqtt::check_connack(&connack)?;
    if idle.subscribe {
        s.write_all(&mqtt::subscribe_packet(&format!("{id}/cmd"))?)
            .await?;
        let suback = read_answer(&mut s, "SUBACK", |b| b.len() >= 5).await?;
        mqtt::check_suback(&suback)?;
    }
    Ok(Held::Tcp { _socket: s })
}

/// Unpredictable bytes without a crate for it: std's `RandomState` seeds
/// each hasher from the OS. Good enough for a WebSocket key and masks,
/// which only must not be guessable by intermediaries.
fn random_bytes<const N: usize>() -> [u8; N] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; N];
    for chunk in out.chunks_mut(8) {
        let word = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
            .to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    out
}

/// A masked binary WebSocket frame (clients must mask, RFC 6455 5.3).
fn ws_binary_frame(payload: &[u8]) -> anyhow::Result<Vec<u8>> {
    let len = u8::try_from(payload.len())
        .ok()
        .filter(|&l| l < 126)
        .context("WebSocket payload over 125 bytes")?;
    let mask: [u8; 4] = random_bytes();
    let mut f = vec![0x82, 0x80 | len];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    Ok(f)
}

/// The payload of a server's unmasked binary frame at the start of `b`,
/// once `want` payload bytes are there.
fn ws_payload(b: &[u8], want: usize) -> Option<&[u8]> {
    match b {
        [0x82, len, rest @ ..] if usize::from(*len) >= want && rest.len() >= want => {
            rest.get(..want)
        }
        _ => None,
    }
}

/// Sends `packet` in one WebSocket frame and reads the answer's first
/// `want` payload bytes (the answer fits one frame: a CONNACK, a SUBACK).
/// `pending` holds bytes read past the previous answer.
async fn ws_exchange(
    s: &mut TcpStream,
    pending: &mut Vec<u8>,
    packet: &[u8],
    want: usize,
    what: &'static str,
) -> anyhow::Result<Vec<u8>> {
    s.write_all(&ws_binary_frame(packet)?).await?;
    let mut chunk = [0u8; 512];
    while ws_payload(pending, want).is_none() {
        if pending.len() > ANSWER_MAX_BYTES {
            bail!("{what}: answer too long");
        }
        let n = tokio::time::timeout(HANDSHAKE_TIMEOUT, s.read(&mut chunk))
            .await
            .with_context(|| format!("{what}: no answer"))??;
        if n == 0 {
            bail!("{what}: connection closed");
        }
        pending.extend_from_slice(&chunk[..n]);
    }
    let answer = ws_payload(pending, want).unwrap_or_default().to_vec();
    // The frame is header (2 bytes) + its payload length; drop it.
    let frame_len = 2 + usize::from(pending[1] & 0x7f);
    pending.drain(..frame_len.min(pending.len()));
    Ok(answer)
}

async fn mqtt_ws(t: &Target, id: &str, idle: &Idle) -> anyhow::Result<Held> {
    let mut s = t.connect().await?;
    let key: [u8; 16] = random_bytes();
    let key = base64_encode(&key);
    let request = format!(
        "GET /mqtt HTTP/1.1\r\nHost: {}:{}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n",
        t.host, t.port
    );
    s.write_all(request.as_bytes()).await?;
    let head = read_answer(&mut s, "upgrade", |b| {
        b.windows(4).any(|w| w == b"\r\n\r\n")
    })
    .await?;
    if !head.starts_with(b"HTTP/1.1 101") {
        bail!("upgrade refused: {}", String::from_utf8_lossy(&head));
    }
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(head.len(), |p| p + 4);
    // Frames may follow the head in the same read.
    let mut pending = head[end..].to_vec();
    let connect = mqtt::connect_packet(id, mqtt::V311, idle.keep_alive_s)?;
    let connack = ws_exchange(&mut s, &mut pending, &connect, 4, "CONNACK").await?;
    mqtt::check_connack(&connack)?;
    if idle.subscribe {
        let subscribe = mqtt::subscribe_packet(&format!("{id}/cmd"))?;
        let suback = ws_exchange(&mut s, &mut pending, &subscribe, 5, "SUBACK").await?;
        mqtt::check_suback(&suback)?;
    }
    Ok(Held::Tcp { _socket: s })
}

/// Standard base64 with padding (RFC 4648), for the WebSocket key.
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn stomp_frame(command: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut f = format!("{command}\n");
    for (k, v) in headers {
        f.push_str(&format!("{k}:{v}\n"));
    }
    f.push('\n');
    let mut f = f.into_bytes();
    f.push(0);
    f
}

async fn stomp(t: &Target, id: &str, idle: &Idle) -> anyhow::Result<Held> {
    let mut s = t.connect().await?;
    let beat = format!("{0},{0}", u32::from(idle.keep_alive_s).saturating_mul(1000));
    let connect = stomp_frame(
        "CONNECT",
        &[
            ("accept-version", "1.2"),
            ("host", "/"),
            ("heart-beat", &beat),
        ],
    );
    s.write_all(&connect).await?;
    let answer = read_answer(&mut s, "CONNECTED", |b| b.contains(&0)).await?;
    if !answer.starts_with(b"CONNECTED") {
        bail!("CONNECT refused: {}", String::from_utf8_lossy(&answer));
    }
    if idle.subscribe {
        let destination = format!("/topic/{id}/cmd");
        let subscribe = stomp_frame(
            "SUBSCRIBE",
            &[
                ("id", "0"),
                ("destination", &destination),
                ("ack", "client-individual"),
                ("receipt", "s"),
            ],
        );
        s.write_all(&subscribe).await?;
        let answer = read_answer(&mut s, "RECEIPT", |b| b.contains(&0)).await?;
        if !answer.starts_with(b"RECEIPT") {
            bail!("SUBSCRIBE refused: {}", String::from_utf8_lossy(&answer));
        }
    }
    Ok(Held::Tcp { _socket: s })
}

async fn amqp(t: &Target, id: &str, idle: &Idle) -> anyhow::Result<Held> {
    let mut c = amqp_client::Connection::open(t, &amqp_client::Sasl::Anonymous, id).await?;
    if idle.subscribe {
        let address = format!("/topic/{id}/cmd");
        c.attach_receiver(
            id,
            &address,
            fe2o3_amqp_types::messaging::TerminusDurability::None,
        )
        .await
        .context("attach receiver")?;
    }
    Ok(Held::Amqp {
        _connection: c.into_idle(),
    })
}

async fn open(t: &Target, id: &str, idle: &Idle) -> anyhow::Result<Held> {
    match idle.protocol {
        Protocol::Mqtt => mqtt_tcp(t, id, idle).await,
        Protocol::MqttWs => mqtt_ws(t, id, idle).await,
        Protocol::Stomp => stomp(t, id, idle).await,
        Protocol::Amqp => amqp(t, id, idle).await,
    }
}

/// Opens the connections, waits for the broker to settle, and reports its
/// RSS growth per connection open.
pub(crate) async fn run(target: &Target, idle: Idle) -> anyhow::Result<Report> {
    let proc = target
        .proc
        .clone()
        .context("the idle scenarios need --broker-pid to read RSS")?;
    let prefix = unique("idle");
    let scenario = idle.protocol.scenario(idle.subscribe);
    let n = idle.connections;
    let rss0 = proc.rss_bytes()?;
    let load0 = crate::procfs::self_cpu_us();
    let cpu0 = target.cpu_us()?;
    let started = Instant::now();
    let gate = std::sync::Arc::new(Semaphore::new(IDLE_CONNECT_CONCURRENCY));
    let mut set = JoinSet::new();
    for i in 0..n {
        if idle.connect_rate > 0 {
            // The i-th connection starts i/rate seconds in: a steady pace,
            // not bursts, whatever the handshakes take.
            let due = Duration::from_secs_f64(i as f64 / f64::from(idle.connect_rate));
            tokio::time::sleep_until((started + due).into()).await;
        }
        let (t, id, gate) = (target.clone(), format!("{prefix}-{i}"), gate.clone());
        set.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            open(&t, &id, &idle).await
        });
    }
    let mut conns = Vec::with_capacity(n);
    let mut error = None;
    while let Some(r) = set.join_next().await {
        match r? {
            Ok(held) => conns.push(held),
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
    let mut extra_rss = Vec::new();
    if !idle.hold.is_zero() {
        // The marker another process waits for before it starts its stream.
        use std::io::Write;
        println!("HOLDING {open} connections for {} s", idle.hold.as_secs());
        std::io::stdout().flush()?;
        tokio::time::sleep(idle.hold).await;
        extra_rss.push(("rss_after_hold_bytes", proc.rss_bytes()?.into()));
    }
    drop(conns);
    Ok(Report {
        scenario,
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
            ("keep_alive_s", idle.keep_alive_s.into()),
            ("connect_rate", idle.connect_rate.into()),
        ]
        .into_iter()
        .chain(extra_rss)
        .collect(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn a_server_frame_is_read_once_complete() {
        assert_eq!(ws_payload(&[0x82, 4, 0x20, 2, 0], 4), None);
        assert_eq!(
            ws_payload(&[0x82, 4, 0x20, 2, 0, 0], 4),
            Some(&[0x20, 2, 0, 0][..])
        );
        let f = ws_binary_frame(b"abc").expect("frame");
        assert_eq!(f[..2], [0x82, 0x83]);
        let mask = &f[2..6];
        let unmasked: Vec<u8> = f[6..]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        assert_eq!(unmasked, b"abc");
    }
}
