//! The AMQP scenario driven by our own client ([`crate::amqp_client`]):
//! each side is one task owning one connection, looping "queue frames,
//! write once, handle every frame read".

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::Header;
use fe2o3_amqp_types::performatives::Performative;

use super::Params;
use crate::amqp_client::{
    check_outcome, data_payload, encode_into, write_data_section, Assembler, ClientError,
    Connection, Outstanding, Ranges, ReceiverCredit, SenderCredit, CREDIT_MAX, WRITE_BATCH_BYTES,
};
use crate::run::{supervise, Tally, Target};
use crate::run::{Measured, Meter};
use crate::stats::{latency_ns, stamped_payload};

/// Our link's handle on each connection (one link per connection).
const HANDLE: u32 = 0;
/// How long the sender gets, after the receiver saw every message, to
/// collect its last dispositions.
const JOIN_GRACE: Duration = Duration::from_secs(15);

/// Why a run failed on the wire client's side.
#[derive(Debug, thiserror::Error)]
enum WireError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("delivery {first}..={last} not accepted: {outcome}")]
    NotAccepted {
        first: u32,
        last: u32,
        outcome: String,
    },
    #[error("delivery {0} has no data section")]
    NoData(u32),
    #[error("the broker detached the link: {0}")]
    Detached(String),
    #[error("transfer on handle {0}, which is not ours")]
    UnknownHandle(u32),
}

fn detached(d: &fe2o3_amqp_types::performatives::Detach) -> WireError {
    WireError::Detached(
        d.error
            .as_ref()
            .map_or_else(|| "no error given".to_owned(), ToString::to_string),
    )
}

/// Receives until the run is over: every complete frame of a read is
/// handled, then one disposition per run of consecutive delivery ids and a
/// credit top-up go out in one write.
async fn receive(
    mut conn: Connection,
    mut credit: ReceiverCredit,
    tally: Arc<Tally>,
) -> Result<Vec<u64>, WireError> {
    let mut lat = Vec::with_capacity(usize::try_from(tally.expected()).unwrap_or(0));
    let mut ranges = Ranges::default();
    let mut assembler = Assembler::default();
    loop {
        let mut n = 0;
        while let Some((perf, payload)) = conn.next_performative()? {
            match perf {
                Performative::Transfer(t) => {
                    if t.handle.0 != HANDLE {
                        return Err(WireError::UnknownHandle(t.handle.0));
                    }
                    let Some(d) = assembler.push(&t, payload)? else {
                        continue;
                    };
                    credit.on_delivery().map_err(ClientError::from)?;
                    let body = data_payload(&d.message)
                        .map_err(ClientError::from)?
                        .ok_or(WireError::NoData(d.id))?;
                    if let Some(l) = latency_ns(&d.message[body]) {
                        lat.push(l);
                    }
                    if !d.settled {
                        ranges.push(d.id);
                    }
                    n += 1;
                }
                Performative::Detach(d) => return Err(detached(&d)),
                // Flows restate the broker's session window; dispositions
                // from a sender settle what we settled already.
                _ => {}
            }
        }
        for (first, last) in ranges.drain() {
            conn.accept(first, last)?;
        }
        if let Some((delivery_count, grant)) = credit.top_up() {
            conn.grant(HANDLE, delivery_count, grant)?;
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
    // Writes the last dispositions, then detaches and closes. A failing
    // close does not undo a complete run.
    let _ = conn.close(HANDLE).await;
    Ok(lat)
}

/// Sends `p.count` messages (fewer if the run's duration ends first), at
/// most `p.window` unsettled and never beyond the link credit or the
/// session window, and waits until every one is accepted.
async fn send(
    mut conn: Connection,
    p: Params,
    target: Target,
    tally: Arc<Tally>,
    started: Instant,
) -> Result<(), WireError> {
    let mut header = Vec::new();
    if p.durable {
        encode_into(
            &mut header,
            &Header {
                durable: true,
                ..Header::default()
            },
        )
        .map_err(ClientError::from)?;
    }
    // Header, data section descriptor and vbin32 prefix, stamped payload.
    let message_len = header.len() + 8 + p.size.max(crate::stats::STAMP_BYTES);
    let window = p.window.max(1);
    let mut outstanding = Outstanding::new(0);
    let mut credit = SenderCredit::new(0);
    let mut message = Vec::with_capacity(message_len);
    let mut sent = 0u64;
    let mut producing = true;
    // Frames first: the read that brought the attach may hold the first
    // flow already.
    loop {
        while let Some((perf, _)) = conn.next_performative()? {
            match perf {
                Performative::Flow(f) if f.handle.as_ref().is_some_and(|h| h.0 == HANDLE) => {
                    credit.on_flow(f.delivery_count, f.link_credit.unwrap_or(0));
                }
                Performative::Disposition(d) if d.role == Role::Receiver => {
                    let last = d.last.unwrap_or(d.first);
                    check_outcome(&d).map_err(|outcome| WireError::NotAccepted {
                        first: d.first,
                        last,
                        outcome,
                    })?;
                    outstanding
                        .settle(d.first, last)
                        .map_err(ClientError::from)?;
                }
                Performative::Detach(d) => return Err(detached(&d)),
                _ => {}
            }
        }
        while producing {
            if sent >= p.count || target.send_time_over(started) {
                producing = false;
                tally.set_expected(sent);
                break;
            }
            if outstanding.open() >= window
                || credit.available() == 0
                || conn.pending_bytes() >= WRITE_BATCH_BYTES
                || conn.frames_for(message_len) > conn.session_window()
            {
                break;
            }
            message.clear();
            message.extend_from_slice(&header);
            write_data_section(&mut message, &stamped_payload(p.size));
            let spent = credit.take();
            debug_assert!(spent, "credit checked above");
            conn.transfer(HANDLE, outstanding.push(), &message)?;
            sent += 1;
        }
        if !producing && outstanding.open() == 0 {
            break;
        }
        conn.pump().await?;
    }
    let _ = conn.close(HANDLE).await;
    Ok(())
}

pub(super) async fn run(
    target: &Target,
    p: &Params,
    queue: &str,
    addr: &str,
    tally: Arc<Tally>,
) -> anyhow::Result<Measured> {
    // Receiver first: RabbitMQ declares the queue on attach, and no message
    // may arrive before anyone listens.
    let name = format!("{queue}-r");
    let mut rconn = Connection::open(target, &p.sasl, &name)
        .await
        .context("AMQP open (receiver)")?;
    let attach = rconn
        .attach_receiver(&name, addr, p.durability())
        .await
        .context("attach receiver")?;
    let mut credit = ReceiverCredit::new(
        p.credit.min(CREDIT_MAX),
        attach.initial_delivery_count.unwrap_or(0),
    );
    if let Some((delivery_count, grant)) = credit.top_up() {
        rconn.grant(HANDLE, delivery_count, grant)?;
    }
    rconn.flush().await?;
    let name = format!("{queue}-s");
    let mut sconn = Connection::open(target, &p.sasl, &name)
        .await
        .context("AMQP open (sender)")?;
    sconn
        .attach_sender(&name, addr, p.durability())
        .await
        .context("attach sender")?;

    // A side that fails ends the run at once (its error is reported
    // below) rather than after the supervisor's stall timeout.
    let rx = tokio::spawn({
        let tally = tally.clone();
        async move {
            let r = receive(rconn, credit, tally.clone()).await;
            if r.is_err() {
                tally.finish();
            }
            r
        }
    });
    let meter = Meter::start(target)?;
    let tx = tokio::spawn({
        let (p, target, tally) = (p.clone(), target.clone(), tally.clone());
        async move {
            let r = send(sconn, p, target, tally.clone(), meter.started).await;
            if r.is_err() {
                tally.finish();
            }
            r
        }
    });
    let mut error = supervise(&tally, target, meter.started).await;
    let mut m = meter.stop(target)?;
    match rx.await? {
        Ok(l) => m.latencies_ns = l,
        Err(e) => error = error.or(Some(format!("receiver: {e}"))),
    }
    if error.is_some() {
        tx.abort();
    }
    match tokio::time::timeout(JOIN_GRACE, tx).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => error = error.or(Some(format!("sender: {e}"))),
        Ok(Err(_)) => {} // aborted after an error reported above
        Err(_) => error = error.or(Some("sender still waiting for dispositions".into())),
    }
    m.error = error;
    Ok(m)
}
