//! The publish/subscribe scenarios driven by our own client
//! ([`crate::mqtt_client`]): each side is one task owning one connection,
//! looping "handle every packet read, queue packets, write once".

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::task::JoinSet;

use super::{PubSub, KEEP_ALIVE_S};
use crate::mqtt_client::{ClientError, Connect, Connection, Inflight, Packet, WRITE_BATCH_BYTES};
use crate::run::{supervise, Tally, Target};
use crate::run::{Measured, Meter};
use crate::stats::{now_ns, stamp_ns, stamped_payload, STAMP_BYTES};

/// How long the publisher gets, after the subscribers saw every message,
/// to collect its last PUBACKs.
const JOIN_GRACE: Duration = Duration::from_secs(15);

pub(super) fn connect_options<'a>(p: &'a PubSub, client_id: &'a str) -> Connect<'a> {
    Connect {
        client_id,
        clean_session: true,
        keep_alive_s: KEEP_ALIVE_S,
        username: p.client.username.as_deref(),
        password: p.client.password.as_deref(),
    }
}

fn unexpected(p: &Packet) -> ClientError {
    ClientError::Protocol(format!("unexpected {}", p.name()))
}

/// One delivery's timing, on the [`now_ns`] clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    /// When the publisher stamped it.
    pub(super) sent_ns: u64,
    /// Receive time minus `sent_ns`.
    pub(super) latency_ns: u64,
}

/// What a subscriber saw.
#[derive(Debug, Default)]
pub(super) struct Received {
    pub(super) samples: Vec<Sample>,
    /// Write calls on the connection before the final DISCONNECT.
    pub(super) writes: u64,
}

/// Receives until the run is over: every complete packet of a read is
/// handled, then the read's PUBACKs go out in one write.
pub(super) async fn subscriber(
    mut conn: Connection,
    qos: u8,
    tally: Arc<Tally>,
) -> Result<Received, ClientError> {
    let mut samples = Vec::new();
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
                    if let Some(sent_ns) = stamp_ns(&m.payload) {
                        samples.push(Sample {
                            sent_ns,
                            latency_ns: now_ns().saturating_sub(sent_ns),
                        });
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
    let writes = conn.writes();
    // Writes the last PUBACKs. A failing disconnect does not undo a
    // complete run.
    let _ = conn.disconnect().await;
    Ok(Received { samples, writes })
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
/// QoS 1, then waits for every PUBACK and for the end of the run. Returns
/// the write calls it took.
async fn publisher(
    mut conn: Connection,
    plan: Plan,
    target: Target,
    tally: Arc<Tally>,
    started: Instant,
) -> Result<u64, ClientError> {
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
    let writes = conn.writes();
    let _ = conn.disconnect().await;
    Ok(writes)
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
        let mut conn = Connection::open(target, &connect_options(p, &id))
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
    let conn = Connection::open(target, &connect_options(p, &id))
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
    let mut sub_writes = 0;
    while let Some(r) = subs.join_next().await {
        match r? {
            Ok(r) => {
                m.latencies_ns
                    .extend(r.samples.iter().map(|s| s.latency_ns));
                sub_writes += r.writes;
            }
            Err(e) => error = error.or(Some(format!("subscriber: {e}"))),
        }
    }
    // Write calls show the batching: subscriber writes are mostly PUBACKs.
    m.extra.push(("subscriber_writes", sub_writes.into()));
    if error.is_some() {
        tx.abort();
    }
    match tokio::time::timeout(JOIN_GRACE, tx).await {
        Ok(Ok(Ok(writes))) => m.extra.push(("publisher_writes", writes.into())),
        Ok(Ok(Err(e))) => error = error.or(Some(format!("publisher: {e}"))),
        Ok(Err(_)) => {} // aborted after an error reported above
        Err(_) => error = error.or(Some("publisher still waiting for PUBACKs".into())),
    }
    m.error = error;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mqtt_client::fake;
    use bytes::BytesMut;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    fn options(client_id: &str) -> Connect<'_> {
        Connect {
            client_id,
            clean_session: true,
            keep_alive_s: 0,
            username: None,
            password: None,
        }
    }

    /// `n` QoS 1 publishes of stamped payloads with ids from `first`.
    fn publishes(first: u16, n: u16) -> Vec<u8> {
        let mut out = Vec::new();
        for id in first..first + n {
            let payload = stamped_payload(16);
            let len = 2 + 1 + 2 + payload.len();
            out.extend_from_slice(&[0x32, len as u8, 0, 1, b't']);
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&payload);
        }
        out
    }

    /// Reads PUBACKs until `n` arrived; returns their ids.
    async fn pubacks(s: &mut TcpStream, buf: &mut BytesMut, n: usize) -> Vec<u16> {
        let mut ids = Vec::new();
        while ids.len() < n {
            let (first, body) = fake::read_packet(s, buf).await.expect("PUBACK");
            assert_eq!(first >> 4, fake::PUBACK, "only PUBACKs expected");
            ids.push(u16::from_be_bytes([body[0], body[1]]));
        }
        ids
    }

    /// Two reads of 50 publishes each: the subscriber answers each read's
    /// 50 PUBACKs with one write (the second with its DISCONNECT).
    #[tokio::test]
    async fn subscriber_acks_a_read_in_one_write() {
        let (listener, target) = fake::listen().await;
        let broker = tokio::spawn(async move {
            let (mut s, mut buf, _) = fake::accept(&listener, 0).await;
            fake::grant(&mut s, &mut buf, 1).await;
            s.write_all(&publishes(1, 50)).await.expect("write");
            assert_eq!(
                pubacks(&mut s, &mut buf, 50).await,
                (1..=50).collect::<Vec<_>>()
            );
            s.write_all(&publishes(51, 50)).await.expect("write");
            assert_eq!(
                pubacks(&mut s, &mut buf, 50).await,
                (51..=100).collect::<Vec<_>>()
            );
            let (first, _) = fake::read_packet(&mut s, &mut buf)
                .await
                .expect("DISCONNECT");
            assert_eq!(first >> 4, fake::DISCONNECT);
        });
        let mut conn = Connection::open(&target, &options("s"))
            .await
            .expect("open");
        conn.subscribe("t", 1).await.expect("granted");
        let tally = Tally::new(100);
        let r = tokio::time::timeout(Duration::from_secs(5), subscriber(conn, 1, tally.clone()))
            .await
            .expect("in time")
            .expect("subscriber");
        broker.await.expect("fake broker");
        assert_eq!(tally.received(), 100);
        assert_eq!(r.samples.len(), 100);
        // CONNECT, SUBSCRIBE, then one write for the first read's PUBACKs.
        assert_eq!(r.writes, 3);
    }

    /// A broker that withholds PUBACKs sees exactly the window in flight,
    /// and acks that come out of order still free their slots.
    #[tokio::test]
    async fn publisher_keeps_the_window_in_flight() {
        let (listener, target) = fake::listen().await;
        let tally = Tally::new(250);
        let broker = tokio::spawn({
            let tally = tally.clone();
            async move {
                let (mut s, mut buf, _) = fake::accept(&listener, 0).await;
                let mut ids = Vec::new();
                let mut batches = Vec::new();
                while ids.len() < 250 {
                    let mut batch = Vec::new();
                    // Read until the publisher stops: the window is full.
                    while let Ok(Some((first, body))) = tokio::time::timeout(
                        Duration::from_millis(200),
                        fake::read_packet(&mut s, &mut buf),
                    )
                    .await
                    {
                        assert_eq!(first, fake::PUBLISH << 4 | 0x02, "QoS 1 publish");
                        let topic = usize::from(u16::from_be_bytes([body[0], body[1]]));
                        batch.push(u16::from_be_bytes([body[2 + topic], body[3 + topic]]));
                    }
                    batches.push(batch.len());
                    // Ack in reverse order, all in one write.
                    let mut acks = Vec::new();
                    for &id in batch.iter().rev() {
                        acks.extend_from_slice(&[0x40, 2]);
                        acks.extend_from_slice(&id.to_be_bytes());
                    }
                    s.write_all(&acks).await.expect("write");
                    ids.extend(batch);
                }
                tally.add(250);
                let (first, _) = fake::read_packet(&mut s, &mut buf)
                    .await
                    .expect("DISCONNECT");
                assert_eq!(first >> 4, fake::DISCONNECT);
                (ids, batches)
            }
        });
        let conn = Connection::open(&target, &options("p"))
            .await
            .expect("open");
        let plan = Plan {
            topic: "t".into(),
            qos: 1,
            count: 250,
            size: 16,
            inflight: 100,
            subscribers: 1,
        };
        let writes = tokio::time::timeout(
            Duration::from_secs(10),
            publisher(conn, plan, target, tally.clone(), Instant::now()),
        )
        .await
        .expect("in time")
        .expect("publisher");
        let (ids, batches) = broker.await.expect("fake broker");
        assert_eq!(batches, [100, 100, 50]);
        assert_eq!(ids, (1..=250).collect::<Vec<u16>>());
        // CONNECT, then one write per window's worth of publishes.
        assert_eq!(writes, 4);
    }
}
