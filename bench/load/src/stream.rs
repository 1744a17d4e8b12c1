//! Stream scenario (issue 17, `docs/streams.md`) over STOMP, in three
//! shapes `bench/streams.sh` runs:
//!
//! - append: one batching producer (up to `window` RECEIPTs outstanding,
//!   so the broker's group commit syncs them together), no readers; msg/s
//!   counts messages confirmed durable;
//! - history: no producer, `readers` readers from `first` of a stream an
//!   earlier append filled; msg/s counts deliveries;
//! - tail: the producer and `readers` readers from `next`; msg/s counts
//!   deliveries (every reader gets every message).
//!
//! Readers use RabbitMQ's spellings (`x-stream-offset`, `prefetch-count`,
//! `ack:client`) and ACK cumulatively every half prefetch. The broker's
//! RSS is sampled through the run (start, peak, end), to set against the
//! readers' credit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinSet;

use crate::run::{supervise, Tally, Target};
use crate::stats::Report;
use crate::stomp::{self, producer};
use crate::stomp_client::{connect, Login, StompError};

/// How often the broker's RSS is sampled for the peak.
const RSS_SAMPLE_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub(crate) struct Params {
    /// The stream's name (`/queue/<stream>`); the broker's `[[streams]]`
    /// must make it a stream.
    pub(crate) stream: String,
    /// Messages appended (append, tail) or read by each reader (history).
    pub(crate) count: u64,
    pub(crate) size: usize,
    /// Outstanding receipts of the producer.
    pub(crate) window: usize,
    pub(crate) readers: usize,
    /// Each reader's credit (`prefetch-count`).
    pub(crate) prefetch: u32,
    /// Where readers start: `first`, `next`, `offset=N`, ...
    pub(crate) from: String,
    /// Whether the producer runs (false: history).
    pub(crate) append: bool,
    pub(crate) login: Login,
}

/// Reads the stream until the run is over: counts each MESSAGE, ACKs
/// cumulatively every half prefetch.
async fn reader(
    target: Target,
    p: Params,
    tally: Arc<Tally>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Result<(), StompError> {
    let (mut rd, mut wr, _) = connect(&target, &p.login).await?;
    let dest = format!("/queue/{}", p.stream);
    let prefetch = p.prefetch.to_string();
    wr.send(
        "SUBSCRIBE",
        &[
            ("id", "0"),
            ("destination", dest.as_str()),
            ("ack", "client"),
            ("x-queue-type", "stream"),
            ("x-stream-offset", p.from.as_str()),
            ("prefetch-count", prefetch.as_str()),
            ("receipt", "subscribed"),
        ],
        b"",
    )
    .await?;
    wr.flush().await?;
    loop {
        if rd.frame().await?.command == "RECEIPT" {
            break;
        }
    }
    let _ = ready.send(());
    let ack_every = u64::from(p.prefetch / 2).max(1);
    let mut unacked = 0u64;
    loop {
        while let Some(f) = rd.buffered()? {
            match f.command.as_ref() {
                "MESSAGE" => {
                    tally.add(1);
                    unacked += 1;
                    if unacked >= ack_every {
                        let id = f
                            .header("ack")
                            .ok_or(StompError::Malformed("MESSAGE without ack"))?
                            .into_owned();
                        wr.send("ACK", &[("id", &id)], b"").await?;
                        unacked = 0;
                    }
                }
                "ERROR" => return Err(StompError::Broker(format!("{:?}", f.headers()))),
                _ => {}
            }
        }
        wr.flush().await?;
        if tally.is_done() {
            break;
        }
        tokio::select! {
            r = rd.fill() => r?,
            () = tally.done() => break,
        }
    }
    let _ = wr.send("DISCONNECT", &[], b"").await;
    let _ = wr.flush().await;
    Ok(())
}

/// The broker's RSS at the start, its peak and at the end, sampled every
/// [`RSS_SAMPLE_EVERY`] until `tally` is done.
fn sample_rss(target: &Target, tally: Arc<Tally>) -> (u64, Arc<AtomicU64>) {
    let rss = |t: &Target| {
        t.proc
            .as_ref()
            .and_then(|b| b.rss_bytes().ok())
            .unwrap_or(0)
    };
    let start = rss(target);
    let peak = Arc::new(AtomicU64::new(start));
    let (t, pk) = (target.clone(), peak.clone());
    tokio::spawn(async move {
        while !tally.is_done() {
            pk.fetch_max(rss(&t), Ordering::Relaxed);
            tokio::time::sleep(RSS_SAMPLE_EVERY).await;
        }
    });
    (start, peak)
}

pub(crate) async fn run(target: &Target, p: &Params) -> anyhow::Result<Report> {
    let shape = match (p.append, p.readers) {
        (true, 0) => "append",
        (true, _) => "tail",
        (false, _) => "history",
    };
    let scenario = format!("stream-{shape}-{}r", p.readers);
    let readers = p.readers as u64;
    // Without readers the producer's confirmations are the count.
    let tally = Tally::new(if readers == 0 {
        p.count
    } else {
        p.count * readers
    });
    let mut set = JoinSet::new();
    let mut readies = Vec::new();
    for _ in 0..p.readers {
        let (tx, rx) = tokio::sync::oneshot::channel();
        readies.push(rx);
        set.spawn(reader(target.clone(), p.clone(), tally.clone(), tx));
    }
    for rx in readies {
        if rx.await.is_err() {
            if let Some(r) = set.join_next().await {
                r?.context("reader")?;
            }
            anyhow::bail!("a reader ended before subscribing");
        }
    }
    let (rss_start, rss_peak) = sample_rss(target, tally.clone());
    let meter = crate::run::Meter::start(target)?;
    let producing = p.append.then(|| {
        let sp = stomp::Params {
            producers: 1,
            consumers: p.readers,
            count: p.count,
            size: p.size,
            window: p.window,
            prefetch: p.prefetch,
            persistent: true,
            login: p.login.clone(),
        };
        let dest = format!("/queue/{}", p.stream);
        tokio::spawn(producer(target.clone(), sp, dest, p.count, meter.started))
    });
    let mut error = None;
    let mut confirmed = 0;
    if readers == 0 {
        if let Some(h) = producing {
            match h.await? {
                Ok((sent, c)) => {
                    confirmed = c;
                    tally.set_expected(sent);
                    tally.add(c);
                }
                Err(e) => error = Some(format!("producer: {e}")),
            }
        }
        tally.finish();
    } else {
        error = supervise(&tally, target, meter.started).await;
        if let Some(h) = producing {
            match tokio::time::timeout(Duration::from_secs(15), h).await {
                Ok(Ok(Ok((_, c)))) => confirmed = c,
                Ok(Ok(Err(e))) => error = error.or(Some(format!("producer: {e}"))),
                Ok(Err(e)) => error = error.or(Some(format!("producer task: {e}"))),
                Err(_) => error = error.or(Some("producer still waiting for receipts".into())),
            }
        }
    }
    let mut measured = meter.stop(target)?;
    let rss_end = target
        .proc
        .as_ref()
        .and_then(|b| b.rss_bytes().ok())
        .unwrap_or(0);
    while let Some(r) = set.join_next().await {
        if let Err(e) = r? {
            error = error.or(Some(format!("reader: {e}")));
        }
    }
    measured.error = error;
    let bytes_per_s = tally.received() as f64 * p.size as f64 / measured.elapsed.as_secs_f64();
    measured.extra = vec![
        ("confirmed", confirmed.into()),
        ("payload_bytes_per_s", (bytes_per_s as u64).into()),
        ("rss_start_bytes", rss_start.into()),
        ("rss_peak_bytes", rss_peak.load(Ordering::Relaxed).into()),
        ("rss_end_bytes", rss_end.into()),
    ];
    let params = vec![
        ("stream", p.stream.clone().into()),
        ("size", p.size.into()),
        ("window", p.window.into()),
        ("readers", p.readers.into()),
        ("prefetch", p.prefetch.into()),
        ("from", p.from.clone().into()),
    ];
    Ok(measured.into_report(scenario, target, &tally, params))
}
