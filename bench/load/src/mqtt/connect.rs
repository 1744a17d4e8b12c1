//! Connection rate and connect latency (issue 19's balancer benchmark):
//! `count` connections, `concurrency` at a time, each timed from the TCP
//! connect to a successful CONNACK; an MQTT 5 client sent elsewhere (CONNACK
//! 0x9C/0x9D with a Server Reference) follows it with `--follow-redirect`,
//! and its time includes both connects, as a real client's would. Each
//! connection then sends DISCONNECT and closes.
//!
//! Client ids are `{id_prefix}-{n}`: a balancer keyed by a filter on the
//! prefix sends every one to the same node, so a run is all direct, all
//! redirected or all proxied.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::run::Target;
use crate::stats::Report;

/// One connect's time limit (each hop of a redirect).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Redirects followed at most per connection: a loop is a broker bug.
const REDIRECTS_MAX: usize = 3;
/// MQTT 5 CONNACK reasons that name another server.
const USE_ANOTHER_SERVER: u8 = 0x9C;
const SERVER_MOVED: u8 = 0x9D;
/// The Server Reference property.
const SERVER_REFERENCE: u8 = 0x1C;

/// What a connect run does.
#[derive(Debug, Clone)]
pub(crate) struct ConnectRun {
    pub(crate) count: u64,
    pub(crate) concurrency: usize,
    /// 4 (3.1.1) or 5.
    pub(crate) version: u8,
    pub(crate) follow_redirect: bool,
    pub(crate) id_prefix: String,
}

pub(crate) async fn run(target: &Target, r: ConnectRun) -> anyhow::Result<Report> {
    if r.version != 4 && r.version != 5 {
        bail!("--version is 4 or 5");
    }
    let next = Arc::new(AtomicU64::new(0));
    let redirected = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = JoinSet::new();
    for _ in 0..r.concurrency.max(1) {
        let (target, r, next, redirected) =
            (target.clone(), r.clone(), next.clone(), redirected.clone());
        workers.spawn(async move {
            let mut samples = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= r.count {
                    return Ok::<_, anyhow::Error>(samples);
                }
                let id = format!("{}-{n}", r.id_prefix);
                let t0 = Instant::now();
                let hops = connect_once(&target, &r, &id).await?;
                samples.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
                if hops > 0 {
                    redirected.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    let mut latencies = Vec::new();
    let mut error = None;
    while let Some(done) = workers.join_next().await {
        match done.context("worker")? {
            Ok(s) => latencies.extend(s),
            Err(e) => error = Some(format!("{e:#}")),
        }
    }
    let elapsed = started.elapsed();
    let made = latencies.len() as u64;
    Ok(Report {
        scenario: format!("mqtt{}-connect", if r.version == 5 { "5" } else { "311" }),
        broker: target.name.clone(),
        expected: r.count,
        received: made,
        elapsed,
        latencies_ns: latencies,
        extra: vec![
            ("connections", made.into()),
            (
                "conn_per_s",
                (made as f64 / elapsed.as_secs_f64().max(1e-9)).into(),
            ),
            ("redirected", redirected.load(Ordering::Relaxed).into()),
            ("concurrency", r.concurrency.into()),
        ],
        error,
        ..Report::default()
    })
}

/// Connects `id` (following redirects when asked) until accepted; returns
/// the redirects followed.
async fn connect_once(target: &Target, r: &ConnectRun, id: &str) -> anyhow::Result<usize> {
    let mut addr = format!("{}:{}", target.host, target.port);
    for hops in 0..=REDIRECTS_MAX {
        let mut s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addr))
            .await
            .context("connect timed out")?
            .with_context(|| format!("connect {addr}"))?;
        s.set_nodelay(true)?;
        s.write_all(&connect_packet(id, r.version)?).await?;
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
            return Ok(hops);
        }
        let reference = (r.version == 5 && (code == USE_ANOTHER_SERVER || code == SERVER_MOVED))
            .then(|| server_reference(&body[2..]))
            .flatten();
        match reference {
            Some(to) if r.follow_redirect => addr = to,
            _ => bail!("CONNACK refused the client with {code:#04x}"),
        }
    }
    bail!("more than {REDIRECTS_MAX} redirects")
}

/// A clean-start CONNECT with keep-alive 0 and no properties.
fn connect_packet(id: &str, version: u8) -> anyhow::Result<Vec<u8>> {
    let id = id.as_bytes();
    let props = usize::from(version == 5);
    let remaining = 10 + props + 2 + id.len();
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
        version,
        0x02,
        0,
        0,
    ];
    if version == 5 {
        p.push(0);
    }
    p.extend_from_slice(&u16::try_from(id.len())?.to_be_bytes());
    p.extend_from_slice(id);
    Ok(p)
}

/// One packet: its first byte and its body.
async fn read_packet(s: &mut TcpStream) -> anyhow::Result<(u8, Vec<u8>)> {
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
