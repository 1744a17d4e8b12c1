//! `mqtt-login-storm`: what a burst of password logins does to traffic
//! that is already flowing (issue 13, item 12).
//!
//! A paced QoS 1 stream runs between two connections (publisher →
//! subscriber, one topic). After `before`, `logins` connections are
//! opened at once, each sending a CONNECT with a user name and password
//! (which the broker checks against an argon2 hash) and disconnecting
//! once answered. The stream goes on for `after` past the last answer.
//! The report's p50/p99 are of the stream messages published while the
//! storm was under way; `baseline_p99_us` is of those published before
//! it. The storm's own figures: logins accepted, refused as busy (3.1.1
//! return code 3, server unavailable), refused otherwise, failed, and how
//! long a login took (p50/p99/max, CONNECT written to CONNACK read).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::{watch, Barrier};
use tokio::task::JoinSet;

use super::wire::{connect_options, subscriber, Sample};
use super::{Client, ClientArgs, PubSub};
use crate::mqtt_client::{ClientError, Connect, Connection, Inflight, Packet};
use crate::run::{supervise, unique, Meter, Tally, Target};
use crate::stats::{now_ns, percentile, stamped_payload, Report, STAMP_BYTES};

/// Unacknowledged QoS 1 publishes the stream may have: far more than a
/// paced stream needs, so a slow broker shows up as latency, not as
/// skipped messages (which are counted anyway).
const STREAM_INFLIGHT: u16 = 1000;
/// MQTT 3.1.1 CONNACK return code 3: server unavailable (what Rosetta
/// answers when its login queue is full).
const CONNACK_SERVER_UNAVAILABLE: u8 = 3;

/// Parameters of the scenario.
#[derive(Debug, Clone)]
pub(crate) struct Storm {
    /// The stream's clients (their CONNECT credentials, if any).
    pub(crate) client: ClientArgs,
    /// Logins opened at once.
    pub(crate) logins: usize,
    /// The storm's CONNECT user name and password.
    pub(crate) user: String,
    pub(crate) password: String,
    /// Stream messages per second.
    pub(crate) rate: u32,
    pub(crate) size: usize,
    /// Stream time before the storm and after its last answer.
    pub(crate) before: Duration,
    pub(crate) after: Duration,
}

/// How one login ended.
#[derive(Debug)]
enum Login {
    Accepted(Duration),
    Busy,
    Refused(u8),
    Failed(String),
}

/// One storm login: waits for every other one to be ready, connects,
/// logs in, and disconnects once answered.
async fn login(target: Target, id: String, storm: Arc<Storm>, go: Arc<Barrier>) -> Login {
    go.wait().await;
    let connect = Connect {
        client_id: &id,
        clean_session: true,
        keep_alive_s: 0,
        username: Some(&storm.user),
        password: Some(&storm.password),
    };
    let started = Instant::now();
    let r = Connection::open(&target, &connect).await;
    let took = started.elapsed();
    match r {
        Ok(conn) => {
            let _ = conn.disconnect().await;
            Login::Accepted(took)
        }
        Err(ClientError::Refused(CONNACK_SERVER_UNAVAILABLE)) => Login::Busy,
        Err(ClientError::Refused(code)) => Login::Refused(code),
        Err(e) => Login::Failed(e.to_string()),
    }
}

/// What the storm did, on the [`now_ns`] clock.
#[derive(Debug, Default)]
struct StormOutcome {
    started_ns: u64,
    ended_ns: u64,
    accepted: u64,
    busy: u64,
    refused: u64,
    failed: u64,
    /// Accepted logins' durations, sorted.
    login_ns: Vec<u64>,
    first_error: Option<String>,
}

async fn storm(target: &Target, s: &Arc<Storm>) -> StormOutcome {
    let prefix = unique("storm");
    let go = Arc::new(Barrier::new(s.logins + 1));
    let mut set = JoinSet::new();
    for i in 0..s.logins {
        let id = format!("{prefix}-{i}");
        set.spawn(login(target.clone(), id, Arc::clone(s), Arc::clone(&go)));
    }
    go.wait().await;
    let mut out = StormOutcome {
        started_ns: now_ns(),
        ..StormOutcome::default()
    };
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Login::Accepted(took)) => {
                out.accepted += 1;
                out.login_ns
                    .push(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
            }
            Ok(Login::Busy) => out.busy += 1,
            Ok(Login::Refused(code)) => {
                out.refused += 1;
                out.first_error
                    .get_or_insert_with(|| format!("login refused with return code {code}"));
            }
            Ok(Login::Failed(e)) => {
                out.failed += 1;
                out.first_error.get_or_insert(e);
            }
            Err(e) => {
                out.failed += 1;
                out.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    out.ended_ns = now_ns();
    out.login_ns.sort_unstable();
    out
}

/// What the paced publisher did.
#[derive(Debug, Default)]
struct Published {
    sent: u64,
    /// Ticks at which the window was full, so nothing was sent.
    skipped: u64,
}

/// Publishes one QoS 1 message per tick of `rate` until `stop`, then waits
/// for the last PUBACKs.
async fn paced_publisher(
    mut conn: Connection,
    topic: String,
    rate: u32,
    size: usize,
    mut stop: watch::Receiver<bool>,
) -> Result<Published, ClientError> {
    let mut window = Inflight::new(usize::from(STREAM_INFLIGHT));
    let mut payload = stamped_payload(size);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    // A late tick is not made up with a burst: the stream stays a stream.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Published::default();
    loop {
        while let Some(p) = conn.next_packet()? {
            match p {
                Packet::PubAck(id) => window.ack(id)?,
                Packet::PingResp => {}
                other => {
                    return Err(ClientError::Protocol(format!(
                        "unexpected {}",
                        other.name()
                    )))
                }
            }
        }
        if *stop.borrow() {
            if window.open() == 0 && conn.pending_bytes() == 0 {
                return Ok(out);
            }
            conn.pump().await?;
            continue;
        }
        tokio::select! {
            _ = tick.tick() => {
                if window.has_room() {
                    let id = window.take()?;
                    payload[..STAMP_BYTES].copy_from_slice(&now_ns().to_le_bytes());
                    conn.publish(&topic, Some(id), &payload)?;
                    out.sent += 1;
                } else {
                    out.skipped += 1;
                }
            }
            r = conn.pump() => r?,
            _ = stop.changed() => {}
        }
    }
}

fn us(sorted: &[u64], p: f64) -> serde_json::Value {
    percentile(sorted, p).map_or(serde_json::Value::Null, |ns| (ns as f64 / 1000.0).into())
}

fn ms(sorted: &[u64], p: f64) -> serde_json::Value {
    percentile(sorted, p).map_or(serde_json::Value::Null, |ns| (ns as f64 / 1e6).into())
}

/// Runs the scenario.
pub(crate) async fn run(target: &Target, s: Storm) -> anyhow::Result<Report> {
    if s.client.transport != super::Transport::Tcp {
        anyhow::bail!("the login storm's stream runs over plain TCP only");
    }
    let s = Arc::new(s);
    let topic = unique("bench/storm");
    // The stream's clients, as the publish/subscribe scenarios make them.
    let stream = PubSub {
        scenario: "mqtt-login-storm".into(),
        client: ClientArgs {
            client: Client::Wire,
            ..s.client.clone()
        },
        qos: 1,
        subscribers: 1,
        count: 0,
        size: s.size,
        inflight: STREAM_INFLIGHT,
        rate: s.rate,
    };
    let tally = Tally::new(u64::MAX);
    let sub_id = format!("{topic}-s");
    let mut sub = Connection::open(target, &connect_options(&stream, &sub_id))
        .await
        .context("subscriber CONNECT")?;
    sub.subscribe(&topic, 1).await.context("SUBSCRIBE")?;
    let pub_id = format!("{topic}-p");
    let publisher = Connection::open(target, &connect_options(&stream, &pub_id))
        .await
        .context("publisher CONNECT")?;

    let meter = Meter::start(target)?;
    let rx = tokio::spawn({
        let tally = tally.clone();
        async move {
            let r = subscriber(sub, 1, tally.clone()).await;
            if r.is_err() {
                tally.finish();
            }
            r
        }
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let tx = tokio::spawn(paced_publisher(
        publisher,
        topic.clone(),
        s.rate,
        s.size,
        stop_rx,
    ));

    tokio::time::sleep(s.before).await;
    let outcome = storm(target, &s).await;
    tokio::time::sleep(s.after).await;
    stop_tx.send_replace(true);
    let mut error = None;
    let published = match tx.await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            error = Some(format!("publisher: {e}"));
            Published::default()
        }
        Err(e) => {
            error = Some(format!("publisher task: {e}"));
            Published::default()
        }
    };
    tally.set_expected(published.sent);
    if let Some(e) = supervise(&tally, target, meter.started).await {
        error.get_or_insert(e);
    }
    let mut m = meter.stop(target)?;
    let samples: Vec<Sample> = match rx.await {
        Ok(Ok(r)) => r.samples,
        Ok(Err(e)) => {
            error.get_or_insert(format!("subscriber: {e}"));
            Vec::new()
        }
        Err(e) => {
            error.get_or_insert(format!("subscriber task: {e}"));
            Vec::new()
        }
    };
    let during = |x: &Sample| (outcome.started_ns..=outcome.ended_ns).contains(&x.sent_ns);
    m.latencies_ns = samples
        .iter()
        .filter(|x| during(x))
        .map(|x| x.latency_ns)
        .collect();
    let mut baseline: Vec<u64> = samples
        .iter()
        .filter(|x| x.sent_ns < outcome.started_ns)
        .map(|x| x.latency_ns)
        .collect();
    baseline.sort_unstable();
    let mut after: Vec<u64> = samples
        .iter()
        .filter(|x| x.sent_ns > outcome.ended_ns)
        .map(|x| x.latency_ns)
        .collect();
    after.sort_unstable();
    let mut storm_sorted = m.latencies_ns.clone();
    storm_sorted.sort_unstable();
    let storm_s = outcome.ended_ns.saturating_sub(outcome.started_ns) as f64 / 1e9;
    let logins = &outcome.login_ns;
    let shown = |v: serde_json::Value| v.as_f64().map_or("-".to_owned(), |x| format!("{x:.1}"));
    println!(
        "mqtt-login-storm on {}: {} logins in {storm_s:.2} s ({} accepted, {} busy, {} refused, {} failed; \
         login p50 {} ms, p99 {} ms); stream p99 {} µs before, {} µs during, {} µs after",
        target.name,
        s.logins,
        outcome.accepted,
        outcome.busy,
        outcome.refused,
        outcome.failed,
        shown(ms(logins, 50.0)),
        shown(ms(logins, 99.0)),
        shown(us(&baseline, 99.0)),
        shown(us(&storm_sorted, 99.0)),
        shown(us(&after, 99.0)),
    );
    m.extra = vec![
        ("storm_s", storm_s.into()),
        ("stream_sent", published.sent.into()),
        ("stream_skipped_ticks", published.skipped.into()),
        ("storm_samples", storm_sorted.len().into()),
        ("storm_max_us", us(&storm_sorted, 100.0)),
        ("baseline_p50_us", us(&baseline, 50.0)),
        ("baseline_p99_us", us(&baseline, 99.0)),
        ("after_p99_us", us(&after, 99.0)),
        ("logins_accepted", outcome.accepted.into()),
        ("logins_busy", outcome.busy.into()),
        ("logins_refused", outcome.refused.into()),
        ("logins_failed", outcome.failed.into()),
        ("login_p50_ms", ms(logins, 50.0)),
        ("login_p99_ms", ms(logins, 99.0)),
        ("login_max_ms", ms(logins, 100.0)),
    ];
    if outcome.refused + outcome.failed > 0 {
        error = error.or(outcome.first_error);
    }
    m.error = error;
    Ok(m.into_report(
        stream.scenario,
        target,
        &tally,
        vec![
            ("logins", s.logins.into()),
            ("rate", s.rate.into()),
            ("size", s.size.into()),
        ],
    ))
}
