//! The AMQP scenario driven by fe2o3-amqp's client, kept to compare
//! against the `wire` client (`--client fe2o3`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::{Data, Header, Message, Source};
use fe2o3_amqp::types::primitives::Binary;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use std::collections::VecDeque;

use super::Params;
use crate::amqp_client::Sasl;
use crate::run::{supervise, Tally, Target};
use crate::run::{Measured, Meter};
use crate::stats::{latency_ns, stamped_payload};

async fn open(
    target: &Target,
    p: &Params,
    id: &str,
) -> anyhow::Result<(ConnectionHandle<()>, SessionHandle<()>)> {
    let stream = target.connect().await?;
    let mut b = Connection::builder()
        .container_id(id.to_owned())
        .hostname(target.host.as_str());
    match &p.sasl {
        Sasl::None => {}
        Sasl::Anonymous => b = b.sasl_profile(SaslProfile::Anonymous),
        Sasl::Plain { user, password } => {
            b = b.sasl_profile(SaslProfile::Plain {
                username: user.clone(),
                password: password.clone(),
            });
        }
    }
    let mut conn = b.open_with_stream(stream).await.context("AMQP open")?;
    let session = Session::begin(&mut conn).await.context("AMQP begin")?;
    Ok((conn, session))
}

async fn receive(
    mut receiver: Receiver,
    tally: Arc<Tally>,
) -> anyhow::Result<(Receiver, Vec<u64>)> {
    let mut lat = Vec::new();
    loop {
        tokio::select! {
            d = receiver.recv::<Data>() => {
                let d = d.context("receive")?;
                if let Some(l) = latency_ns(&d.body().0) {
                    lat.push(l);
                }
                receiver.accept(&d).await.context("accept")?;
                tally.add(1);
            }
            () = tally.done() => return Ok((receiver, lat)),
        }
    }
}

async fn send(
    mut sender: Sender,
    p: Params,
    target: Target,
    tally: Arc<Tally>,
    started: Instant,
) -> anyhow::Result<Sender> {
    let mut pending = VecDeque::with_capacity(p.window);
    let mut sent = 0;
    while sent < p.count && !target.send_time_over(started) {
        if pending.len() >= p.window.max(1) {
            settle(pending.pop_front()).await?;
        }
        let msg = Message::builder()
            .header(Header {
                durable: p.durable,
                ..Default::default()
            })
            .data(Binary::from(stamped_payload(p.size)))
            .build();
        pending.push_back(sender.send_batchable(msg).await.context("send")?);
        sent += 1;
    }
    tally.set_expected(sent);
    while let Some(fut) = pending.pop_front() {
        settle(Some(fut)).await?;
    }
    Ok(sender)
}

async fn settle<F, E>(fut: Option<F>) -> anyhow::Result<()>
where
    F: std::future::Future<Output = Result<fe2o3_amqp::types::messaging::Outcome, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let Some(fut) = fut else { return Ok(()) };
    match fut.await.context("disposition")? {
        fe2o3_amqp::types::messaging::Outcome::Accepted(_) => Ok(()),
        other => bail!("message not accepted: {other:?}"),
    }
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
    let (mut rconn, mut rsession) = open(target, p, &format!("{queue}-r")).await?;
    let receiver = Receiver::builder()
        .name(format!("{queue}-r"))
        .source(
            Source::builder()
                .address(addr.to_owned())
                .durable(p.durability())
                .build(),
        )
        .credit_mode(CreditMode::Auto(p.credit))
        .attach(&mut rsession)
        .await
        .context("attach receiver")?;
    let (mut sconn, mut ssession) = open(target, p, &format!("{queue}-s")).await?;
    let sender = Sender::builder()
        .name(format!("{queue}-s"))
        .target(
            fe2o3_amqp::types::messaging::Target::builder()
                .address(addr.to_owned())
                .durable(p.durability())
                .build(),
        )
        .attach(&mut ssession)
        .await
        .context("attach sender")?;

    let rx = tokio::spawn(receive(receiver, tally.clone()));
    let meter = Meter::start(target)?;
    let tx = tokio::spawn(send(
        sender,
        p.clone(),
        target.clone(),
        tally.clone(),
        meter.started,
    ));
    let mut error = supervise(&tally, target, meter.started).await;
    let mut m = meter.stop(target)?;

    match rx.await? {
        Ok((r, l)) => {
            m.latencies_ns = l;
            let _ = r.close().await;
        }
        Err(e) => error = error.or(Some(format!("receiver: {e:#}"))),
    }
    if error.is_some() {
        tx.abort();
    }
    match tokio::time::timeout(std::time::Duration::from_secs(15), tx).await {
        Ok(Ok(Ok(s))) => {
            let _ = s.close().await;
        }
        Ok(Ok(Err(e))) => error = error.or(Some(format!("sender: {e:#}"))),
        Ok(Err(_)) => {} // aborted after an error reported above
        Err(_) => error = error.or(Some("sender still waiting for dispositions".into())),
    }
    let _ = rsession.end().await;
    let _ = ssession.end().await;
    let _ = rconn.close().await;
    let _ = sconn.close().await;
    m.error = error;
    Ok(m)
}
