//! The publish/subscribe scenarios driven by our own client
//! ([`crate::mqtt_client`]): each side is one task owning one connection,
//! looping "handle every packet read, queue packets, write once".

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::task::JoinSet;

use super::{Measured, Meter, PubSub, KEEP_ALIVE_S};
use crate::mqtt_client::{ClientError, Connect, Connection, Inflight, Packet, WRITE_BATCH_BYTES};
use crate::run::{supervise, Tally, Target};
use crate::stats::{latency_ns, now_ns, stamped_payload, STAMP_BYTES};

/// How long the publisher gets, after the subscribers saw every message,
/// to collect its last PUBACKs.
const JOIN_GRACE: Duration = Duration::from_secs(15);

fn connect_options(client_id: &str) -> Connect<'_> {
    Connect {
        client_id,
        clean_session: true,
        keep_alive_s: KEEP_ALIVE_S,
        username: None,
        password: None,
    }
}

fn unexpected(p: &Packet) -> ClientError {
    ClientError::Protocol(format!("unexpected {p:?}"))
}

/// Receives until the run is over: every complete packet of a read is
/// handled, then the read's PUBACKs go out in one write.
async fn subscriber(
    mut conn: Connection,
    qos: u8,
    tally: Arc<Tally>,
) -> Result<Vec<u64>, ClientError> {
    let mut lat = Vec::new();
    loop {
        let mut n = 0;
        while let Some(p) = conn.next_packet()? {
            match p {
                Packet::Publish(m) => {
                    // The broker delivers at min(publish, subscription) QoS,
                    // both `qos` here; anything else changes the scenario.
                    if m.qos != qos {
                        return Err(ClientError::Protocol(format!(
                            "delivery at QoS {} on a QoS {qos} run",
                            m.qos
                        )));
                    }
                    if let Some(id) = m.packet_id {
                        conn.puback(id);
                    }
                    if let Some(l) = latency_ns(&m.payload) {
                        lat.push(l);
                    }
                    n += 1;
                }
                Packet::PingResp => {}
                other => return Err(unexpected(&other)),
            }
        }
        if n > 0 {
            tally.add(n);
        }
        if tally.is_done() {
            break;
        }
        tokio::select! {
            r = conn.pump() => r?,
            () = tally.done() => break,
        }
    }
    // Writes the last PUBACKs. A failing disconnect does not undo a
    // complete run.
    let _ = conn.disconnect().await;
    Ok(lat)
}

/// What the publisher sends.
struct Plan {
    topic: String,
    qos: u8,
    count: u64,
    size: usize,
    inflight: u16,
    subscribers: u64,
}

/// Publishes `plan.count` messages (fewer if the run's duration ends
/// first), unpaced at QoS 0, at most `plan.inflight` unacknowledged at
/// QoS 1, then waits for every PUBACK and for the end of the run.
async fn publisher(
    mut conn: Connection,
    plan: Plan,
    target: Target,
    tally: Arc<Tally>,
    started: Instant,
) -> Result<(), ClientError> {
    let mut window = Inflight::new(usize::from(plan.inflight));
    // One payload buffer, restamped per message.
    let mut payload = stamped_payload(plan.size);
    let mut sent = 0u64;
    let mut producing = true;
    loop {
        while let Some(p) = conn.next_packet()? {
            match p {
                Packet::PubAck(id) => window.ack(id)?,
                Packet::PingResp => {}
                other => return Err(unexpected(&other)),
            }
        }
        while producing {
            if sent >= plan.count || target.send_time_over(started) {
                producing = false;
                tally.set_expected(sent * plan.subscribers);
                break;
            }
            if conn.pending_bytes() >= WRITE_BATCH_BYTES || (plan.qos > 0 && !window.has_room()) {
                break;
            }
            let id = if plan.qos > 0 {
                Some(window.take()?)
            } else {
                None
            };
            payload[..STAMP_BYTES].copy_from_slice(&now_ns().to_le_bytes());
            conn.publish(&plan.topic, id, &payload)?;
            sent += 1;
        }
        if !producing && window.open() == 0 && conn.pending_bytes() == 0 {
            break;
        }
        conn.pump().await?;
    }
    // Stay connected (answering nothing, pinging if idle) until the
    // subscribers have everything, as the rumqttc path does.
    loop {
        tokio::select! {
            r = conn.pump() => r?,
            () = tally.done() => break,
        }
        while let Some(p) = conn.next_packet()? {
            match p {
                Packet::PingResp => {}
                other => return Err(unexpected(&other)),
            }
        }
    }
    let _ = conn.disconnect().await;
    Ok(())
}

pub(super) async fn run(
    target: &Target,
    p: &PubSub,
    topic: &str,
    tally: Arc<Tally>,
) -> anyhow::Result<Measured> {
    let mut subs = JoinSet::new();
    for i in 0..p.subscribers {
        let id = format!("{topic}-s{i}");
        let mut conn = Connection::open(target, &connect_options(&id))
            .await
            .with_context(|| format!("subscriber {i} CONNECT"))?;
        conn.subscribe(topic, p.qos)
            .await
            .with_context(|| format!("subscriber {i} SUBSCRIBE"))?;
        let tally = tally.clone();
        let qos = p.qos;
        // A side that fails ends the run at once (its error is reported
        // below) rather than after the supervisor's stall timeout.
        subs.spawn(async move {
            let r = subscriber(conn, qos, tally.clone()).await;
            if r.is_err() {
                tally.finish();
            }
            r
        });
    }
    let id = format!("{topic}-p");
    let conn = Connection::open(target, &connect_options(&id))
        .await
        .context("publisher CONNECT")?;

    let meter = Meter::start(target)?;
    let plan = Plan {
        topic: topic.to_owned(),
        qos: p.qos,
        count: p.count,
        size: p.size,
        inflight: p.inflight,
        subscribers: p.subscribers as u64,
    };
    let tx = tokio::spawn({
        let (target, tally, started) = (target.clone(), tally.clone(), meter.started);
        async move {
            let r = publisher(conn, plan, target, tally.clone(), started).await;
            if r.is_err() {
                tally.finish();
            }
            r
        }
    });
    let mut error = supervise(&tally, target, meter.started).await;
    let mut m = meter.stop(target)?;
    while let Some(r) = subs.join_next().await {
        match r? {
            Ok(mut l) => m.latencies_ns.append(&mut l),
            Err(e) => error = error.or(Some(format!("subscriber: {e}"))),
        }
    }
    if error.is_some() {
        tx.abort();
    }
    match tokio::time::timeout(JOIN_GRACE, tx).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => error = error.or(Some(format!("publisher: {e}"))),
        Ok(Err(_)) => {} // aborted after an error reported above
        Err(_) => error = error.or(Some("publisher still waiting for PUBACKs".into())),
    }
    m.error = error;
    Ok(m)
}
