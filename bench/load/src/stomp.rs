//! STOMP scenario: a persistent queue, `producers` → `consumers`, 1 KiB
//! `persistent:true` messages, ack=client-individual. A producer counts a
//! message as sent only when its RECEIPT arrived; it keeps up to `window`
//! receipts outstanding so it is not one round trip per message.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::run::{supervise, unique, Tally, Target};
use crate::stats::{latency_ns, restamp, stamped_payload, Report};
use crate::stomp_client::{connect, Login, StompError};

/// A producer flushes its writes at least this often even when its receipt
/// window is not full, so buffered messages do not wait.
const FLUSH_EVERY_MSGS: u64 = 16;
/// How long producers get, after the consumers saw every message, to
/// collect their last receipts.
const JOIN_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

#[derive(Debug, Clone)]
pub(crate) struct Params {
    pub(crate) producers: usize,
    pub(crate) consumers: usize,
    pub(crate) count: u64,
    pub(crate) size: usize,
    /// Outstanding receipts per producer.
    pub(crate) window: usize,
    /// Unacknowledged messages per consumer (prefetch header).
    pub(crate) prefetch: u32,
    pub(crate) persistent: bool,
    pub(crate) login: Login,
}

/// Sends up to `count` messages (fewer if the run's duration ends first) and
/// returns (sent, confirmed by RECEIPT).
pub(crate) async fn producer(
    target: Target,
    p: Params,
    dest: String,
    count: u64,
    started: Instant,
) -> Result<(u64, u64), StompError> {
    let (sent_tx, sent_rx) = tokio::sync::watch::channel(count);
    let (mut rd, mut wr, _) = connect(&target, &p.login).await?;
    let window = Arc::new(Semaphore::new(p.window.max(1)));
    let receipts = {
        let window = window.clone();
        let mut sent_rx = sent_rx;
        tokio::spawn(async move {
            let mut confirmed = 0;
            loop {
                // Every RECEIPT already read is counted, and their permits
                // go back in one call (one wake of the writer, not one per
                // receipt: the load generator shares the broker's cores).
                let mut run = 0;
                let taken = loop {
                    match rd.buffered() {
                        Ok(Some(f)) if f.command == "RECEIPT" => run += 1,
                        Ok(Some(f)) if f.command == "ERROR" => {
                            break Err(StompError::Broker(format!("{:?}", f.headers())))
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                };
                confirmed += run;
                window.add_permits(run as usize);
                if let Err(e) = taken {
                    // Wakes the writer, which would wait for a permit
                    // forever.
                    window.close();
                    return Err(e);
                }
                if confirmed >= *sent_rx.borrow_and_update() {
                    return Ok(confirmed);
                }
                // Reader::fill is a cancel-safe read.
                tokio::select! {
                    f = rd.fill() => if let Err(e) = f {
                        window.close();
                        return Err(e);
                    },
                    changed = sent_rx.changed() => {
                        if changed.is_err() {
                            // The writer is gone; its error is reported.
                            return Ok(confirmed);
                        }
                    }
                }
            }
        })
    };
    let persistent = if p.persistent { "true" } else { "false" };
    // The SEND's headers but its receipt, encoded once: every SEND is this
    // and a number (the load generator shares the broker's cores).
    let send_head = crate::stomp_client::encode_head(
        "SEND",
        &[
            ("destination", dest.as_str()),
            ("persistent", persistent),
            ("content-type", "application/octet-stream"),
        ],
    );
    let mut payload = stamped_payload(p.size);
    let mut sent = 0;
    for i in 0..count {
        if target.send_time_over(started) {
            break;
        }
        match window.try_acquire() {
            Ok(permit) => permit.forget(),
            Err(_) => {
                wr.flush().await?;
                match window.acquire().await {
                    Ok(permit) => permit.forget(),
                    Err(_) => break, // the receipt reader failed; its error is returned below
                }
            }
        }
        restamp(&mut payload);
        wr.send_with_receipt(&send_head, i, &payload).await?;
        sent += 1;
        if i % FLUSH_EVERY_MSGS == FLUSH_EVERY_MSGS - 1 {
            wr.flush().await?;
        }
    }
    wr.flush().await?;
    // The receipt reader stops at what was really sent.
    sent_tx.send_replace(sent);
    let confirmed = receipts
        .await
        .map_err(|e| StompError::Io(std::io::Error::other(e)))??;
    let _ = wr.send("DISCONNECT", &[], b"").await;
    let _ = wr.flush().await;
    Ok((sent, confirmed))
}

/// Subscribes, then ACKs every MESSAGE individually, batching the ACK writes
/// of what one read returned. Returns latencies once the run is over.
async fn consumer(
    target: Target,
    p: Params,
    dest: String,
    tally: Arc<Tally>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Result<Vec<u64>, StompError> {
    let (mut rd, mut wr, version) = connect(&target, &p.login).await?;
    let prefetch = p.prefetch.to_string();
    wr.send(
        "SUBSCRIBE",
        &[
            ("id", "0"),
            ("destination", dest.as_str()),
            ("ack", "client-individual"),
            ("activemq.prefetchSize", prefetch.as_str()),
            ("prefetch-count", prefetch.as_str()),
            ("receipt", "subscribed"),
        ],
        b"",
    )
    .await?;
    wr.flush().await?;
    loop {
        let f = rd.frame().await?;
        if f.command == "RECEIPT" {
            break;
        }
    }
    let _ = ready.send(());
    let v12 = version == "1.2";
    let mut lat = Vec::new();
    loop {
        while let Some(f) = rd.buffered()? {
            match f.command.as_ref() {
                "MESSAGE" => {
                    if let Some(l) = latency_ns(&f.body) {
                        lat.push(l);
                    }
                    // 1.2 acknowledges by the `ack` header; 1.0/1.1 by
                    // message-id (+ subscription).
                    let id = if v12 { f.header("ack") } else { None }
                        .or_else(|| f.header("message-id"))
                        .ok_or(StompError::Malformed("MESSAGE without ack/message-id"))?
                        .into_owned();
                    if v12 {
                        wr.send("ACK", &[("id", &id)], b"").await?;
                    } else {
                        wr.send("ACK", &[("message-id", &id), ("subscription", "0")], b"")
                            .await?;
                    }
                    tally.add(1);
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
    Ok(lat)
}

pub(crate) async fn run(target: &Target, p: &Params) -> anyhow::Result<Report> {
    let dest = format!("/queue/{}", unique("bench-stomp"));
    let scenario = format!("stomp-{}to{}", p.producers, p.consumers);
    let tally = Tally::new(p.count);
    let mut consumers = JoinSet::new();
    let mut readies = Vec::new();
    for _ in 0..p.consumers {
        let (tx, rx) = tokio::sync::oneshot::channel();
        readies.push(rx);
        consumers.spawn(consumer(
            target.clone(),
            p.clone(),
            dest.clone(),
            tally.clone(),
            tx,
        ));
    }
    for rx in readies {
        if rx.await.is_err() {
            // The consumer failed before subscribing: report its error.
            if let Some(r) = consumers.join_next().await {
                r?.context("consumer")?;
            }
            anyhow::bail!("a consumer ended before subscribing");
        }
    }

    let load0 = crate::procfs::self_cpu_us();
    let cpu0 = target.cpu_us()?;
    let started = Instant::now();
    let mut producers = JoinSet::new();
    let producers_n = p.producers.max(1) as u64;
    for i in 0..producers_n {
        let share = p.count / producers_n + u64::from(i < p.count % producers_n);
        producers.spawn(producer(
            target.clone(),
            p.clone(),
            dest.clone(),
            share,
            started,
        ));
    }
    // Joins the producers as they finish and tells the tally how many
    // messages were really sent.
    let producing = {
        let tally = tally.clone();
        tokio::spawn(async move {
            let (mut sent, mut confirmed, mut error) = (0, 0, None);
            while let Some(r) = producers.join_next().await {
                match r {
                    Ok(Ok((s, c))) => {
                        sent += s;
                        confirmed += c;
                    }
                    Ok(Err(e)) => error = error.or(Some(format!("producer: {e}"))),
                    Err(e) => error = error.or(Some(format!("producer task: {e}"))),
                }
            }
            tally.set_expected(sent);
            (confirmed, error)
        })
    };
    let mut error = supervise(&tally, target, started).await;
    let elapsed = started.elapsed();
    let cpu1 = target.cpu_us()?;
    let load1 = crate::procfs::self_cpu_us();

    let confirmed = match tokio::time::timeout(JOIN_GRACE, producing).await {
        Ok(Ok((confirmed, e))) => {
            error = error.or(e);
            confirmed
        }
        Ok(Err(e)) => {
            error = error.or(Some(format!("producers: {e}")));
            0
        }
        Err(_) => {
            error = error.or(Some("producers still waiting for receipts".into()));
            0
        }
    };
    let mut latencies = Vec::new();
    while let Some(r) = consumers.join_next().await {
        match r? {
            Ok(mut l) => latencies.append(&mut l),
            Err(e) => error = error.or(Some(format!("consumer: {e}"))),
        }
    }
    Ok(Report {
        scenario,
        broker: target.name.clone(),
        expected: tally.expected(),
        received: tally.received(),
        elapsed,
        latencies_ns: latencies,
        broker_cpu_us: cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
        load_cpu_us: load0.zip(load1).map(|(a, b)| b.saturating_sub(a)),
        extra: vec![
            ("confirmed", confirmed.into()),
            ("size", p.size.into()),
            ("persistent", p.persistent.into()),
            ("window", p.window.into()),
            ("prefetch", p.prefetch.into()),
        ],
        error,
    })
}
