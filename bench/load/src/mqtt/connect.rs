//! Connection rate and connect latency: `mqtt-connect` opens connections,
//! `concurrency` at a time, each timed from the TCP connect to a successful
//! CONNACK, then sends DISCONNECT and closes.
//!
//! Two uses:
//! - the balancer benchmark (issue 19): an MQTT 5 client sent elsewhere
//!   (CONNACK 0x9C/0x9D with a Server Reference) follows it with
//!   `--follow-redirect`, and its time includes both connects, as a real
//!   client's would. Client ids are `{id_prefix}-{n}`: a balancer keyed by a
//!   filter on the prefix sends every one to the same node, so a run is all
//!   direct, all redirected or all proxied;
//! - connection churn (issue 20): `--count 0` cycles until the run's
//!   `--duration-s`, and with `--broker-pid` the report carries the broker's
//!   RSS before, at its peak during and `settle` after the run, and the
//!   slowest second's rate (a sustained rate is the slowest second, not the
//!   mean). With `--tls` every cycle is a full TLS handshake (no session
//!   resumption), so the rate is the broker's TLS handshake rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{connect_packet, V5};
use crate::run::Target;
use crate::stats::Report;
use crate::tls::TlsClient;

/// One connect's time limit (each hop of a redirect).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Redirects followed at most per connection: a loop is a broker bug.
const REDIRECTS_MAX: usize = 3;
/// MQTT 5 CONNACK reasons that name another server.
const USE_ANOTHER_SERVER: u8 = 0x9C;
const SERVER_MOVED: u8 = 0x9D;
/// The Server Reference property.
const SERVER_REFERENCE: u8 = 0x1C;
/// How often the churn sampler reads the broker's RSS and the cycles done.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What a connect run does.
#[derive(Debug, Clone)]
pub(crate) struct ConnectRun {
    /// Connections to make; 0: until the target's send duration is over.
    pub(crate) count: u64,
    pub(crate) concurrency: usize,
    /// 4 (3.1.1) or 5.
    pub(crate) version: u8,
    pub(crate) follow_redirect: bool,
    pub(crate) id_prefix: String,
    /// Connect over TLS (each connection a full handshake).
    pub(crate) tls: Option<Arc<TlsClient>>,
    /// How long after the last cycle the broker's RSS is read again.
    pub(crate) settle: Duration,
}

impl ConnectRun {
    /// Whether connection `n` is past the end of the run.
    fn done(&self, target: &Target, n: u64, started: Instant) -> bool {
        (self.count != 0 && n >= self.count) || target.send_time_over(started)
    }
}

/// The broker's RSS and the run's slowest second, read once a second.
#[derive(Debug, Default)]
struct Sampled {
    rss_peak: Option<u64>,
    slowest_second: Option<u64>,
}

pub(crate) async fn run(target: &Target, r: ConnectRun) -> anyhow::Result<Report> {
    if r.version != super::V311 && r.version != V5 {
        bail!("--version is 4 or 5");
    }
    if r.count == 0 && target.duration.is_none() {
        bail!("--count 0 runs until --duration-s, which must then be set");
    }
    let rss = || target.proc.as_ref().and_then(|p| p.rss_bytes().ok());
    let rss_before = rss();
    let next = Arc::new(AtomicU64::new(0));
    let made = Arc::new(AtomicU64::new(0));
    let redirected = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = JoinSet::new();
    for _ in 0..r.concurrency.max(1) {
        let (target, r, next, made, redirected) = (
            target.clone(),
            r.clone(),
            next.clone(),
            made.clone(),
            redirected.clone(),
        );
        workers.spawn(async move {
            let mut samples = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if r.done(&target, n, started) {
                    return Ok::<_, anyhow::Error>(samples);
                }
                let id = format!("{}-{n}", r.id_prefix);
                let t0 = Instant::now();
                let hops = connect_once(&target, &r, &id).await?;
                samples.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
                made.fetch_add(1, Ordering::Relaxed);
                if hops > 0 {
                    redirected.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    let (stop_sampler, stopped) = watch::channel(false);
    let sampler = tokio::spawn(sample(target.clone(), made.clone(), stopped));
    let mut latencies = Vec::new();
    let mut error = None;
    while let Some(done) = workers.join_next().await {
        match done.context("worker")? {
            Ok(s) => latencies.extend(s),
            Err(e) => error = Some(format!("{e:#}")),
        }
    }
    let elapsed = started.elapsed();
    let _ = stop_sampler.send(true);
    let sampled = sampler.await.unwrap_or_default();
    let made = latencies.len() as u64;
    let mut extra = vec![
        ("connections", made.into()),
        (
            "conn_per_s",
            (made as f64 / elapsed.as_secs_f64().max(1e-9)).into(),
        ),
        ("redirected", redirected.load(Ordering::Relaxed).into()),
        ("concurrency", r.concurrency.into()),
        ("tls", r.tls.is_some().into()),
        ("slowest_second_conn", sampled.slowest_second.into()),
    ];
    if rss_before.is_some() {
        tokio::time::sleep(r.settle).await;
        extra.extend([
            ("rss_before_bytes", rss_before.into()),
            ("rss_peak_bytes", sampled.rss_peak.into()),
            ("rss_after_bytes", rss().into()),
        ]);
    }
    let mode = if r.tls.is_some() { "-tls" } else { "" };
    Ok(Report {
        scenario: format!(
            "mqtt{}-connect{mode}",
            if r.version == V5 { "5" } else { "311" }
        ),
        broker: target.name.clone(),
        expected: if r.count == 0 { made } else { r.count },
        received: made,
        elapsed,
        latencies_ns: latencies,
        extra,
        error,
        ..Report::default()
    })
}

/// Once a second until `stop`: the broker's RSS (its peak) and the
/// cycles of the second just gone (the slowest full second; the partial
/// second at the end is not counted).
async fn sample(target: Target, made: Arc<AtomicU64>, mut stop: watch::Receiver<bool>) -> Sampled {
    let mut out = Sampled::default();
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    ticks.tick().await;
    let mut last = made.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.changed() => return out,
        }
        let now = made.load(Ordering::Relaxed);
        let second = now - last;
        last = now;
        out.slowest_second = Some(out.slowest_second.map_or(second, |s| s.min(second)));
        if let Some(rss) = target.proc.as_ref().and_then(|p| p.rss_bytes().ok()) {
            out.rss_peak = Some(out.rss_peak.map_or(rss, |p| p.max(rss)));
        }
    }
}

/// How the broker answered one CONNECT.
enum Answer {
    Accepted,
    /// Sent elsewhere (MQTT 5 Server Reference).
    Redirect(String),
}

/// Connects `id` (following redirects when asked) until accepted; returns
/// the redirects followed.
async fn connect_once(target: &Target, r: &ConnectRun, id: &str) -> anyhow::Result<usize> {
    let mut addr = format!("{}:{}", target.host, target.port);
    for hops in 0..=REDIRECTS_MAX {
        let s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addr))
            .await
            .context("connect timed out")?
            .with_context(|| format!("connect {addr}"))?;
        s.set_nodelay(true)?;
        let answer = match &r.tls {
            Some(tls) => {
                let s = tokio::time::timeout(CONNECT_TIMEOUT, tls.handshake(s))
                    .await
                    .context("TLS handshake timed out")?
                    .context("TLS handshake")?;
                exchange(s, r, id).await?
            }
            None => exchange(s, r, id).await?,
        };
        match answer {
            Answer::Accepted => return Ok(hops),
            Answer::Redirect(to) => addr = to,
        }
    }
    bail!("more than {REDIRECTS_MAX} redirects")
}

/// CONNECT, CONNACK and, when accepted, DISCONNECT and close.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    r: &ConnectRun,
    id: &str,
) -> anyhow::Result<Answer> {
    s.write_all(&connect_packet(id, r.version, 0)?).await?;
    let (first, body) = tokio::time::timeout(CONNECT_TIMEOUT, read_packet(&mut s))
        .await
        .context("CONNACK timed out")??;
    if first != 0x20 || body.len() < 2 {
        bail!("expected CONNACK, got packet {first:#04x}");
    }
    let code = body[1];
    if code == 0 {
        s.write_all(&[0xE0, 0x00]).await?;
        let _ = s.shutdown().await;
        return Ok(Answer::Accepted);
    }
    let reference = (r.version == V5 && (code == USE_ANOTHER_SERVER || code == SERVER_MOVED))
        .then(|| server_reference(&body[2..]))
        .flatten();
    match reference {
        Some(to) if r.follow_redirect => Ok(Answer::Redirect(to)),
        _ => bail!("CONNACK refused the client with {code:#04x}"),
    }
}

/// One packet: its first byte and its body.
async fn read_packet<S: AsyncRead + Unpin>(s: &mut S) -> anyhow::Result<(u8, Vec<u8>)> {
    let first = s.read_u8().await.context("closed before CONNACK")?;
    let mut len = 0usize;
    for shift in [0, 7, 14, 21] {
        let b = s.read_u8().await?;
        len |= usize::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            let mut body = vec![0; len];
            s.read_exact(&mut body).await?;
            return Ok((first, body));
        }
    }
    bail!("malformed remaining length")
}

/// The Server Reference among CONNACK properties (`props` starts at their
/// length).
fn server_reference(props: &[u8]) -> Option<String> {
    let (len, mut at) = varint(props)?;
    let end = at.checked_add(len)?.min(props.len());
    let u16_at = |i: usize| {
        Some(usize::from(u16::from_be_bytes([
            *props.get(i)?,
            *props.get(i + 1)?,
        ])))
    };
    while at < end {
        let id = *props.get(at)?;
        at += 1;
        match id {
            0x01 | 0x17 | 0x19 | 0x24 | 0x25 | 0x28 | 0x29 | 0x2A => at += 1,
            0x13 | 0x21 | 0x22 | 0x23 => at += 2,
            0x02 | 0x11 | 0x18 | 0x27 => at += 4,
            0x0B => at += varint(props.get(at..)?)?.1,
            0x03 | 0x08 | 0x09 | 0x12 | 0x15 | 0x16 | 0x1A | 0x1C | 0x1F => {
                let n = u16_at(at)?;
                let value = props.get(at + 2..at + 2 + n)?;
                if id == SERVER_REFERENCE {
                    return String::from_utf8(value.to_vec()).ok();
                }
                at += 2 + n;
            }
            0x26 => {
                let k = u16_at(at)?;
                let v = u16_at(at + 2 + k)?;
                at += 4 + k + v;
            }
            _ => return None,
        }
    }
    None
}

/// A variable byte integer: its value and its length in bytes.
fn varint(b: &[u8]) -> Option<(usize, usize)> {
    let mut v = 0usize;
    for (i, byte) in b.iter().take(4).enumerate() {
        v |= usize::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_reference_is_found_among_other_properties() {
        // Reason string "x", receive maximum 10, Server Reference "h:1".
        let props = [
            13, 0x1F, 0, 1, b'x', 0x21, 0, 10, 0x1C, 0, 3, b'h', b':', b'1',
        ];
        assert_eq!(server_reference(&props).as_deref(), Some("h:1"));
        assert_eq!(server_reference(&[0]), None);
    }
}
