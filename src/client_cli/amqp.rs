//! AMQP 1.0 with fe2o3-amqp, over TCP or TLS (our own TLS stream handed to
//! `open_with_stream`, so no TLS feature of fe2o3 is built). SASL PLAIN
//! when the URL has a user, else no SASL (anonymous).

use anyhow::{bail, Context};
use fe2o3_amqp::connection::{ConnectionHandle, OpenError};
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::{Body, Header, Message, Outcome};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};

use super::stream;
use super::{connecting, PublishPlan, Receiving, Target};

/// Credit granted to the broker: messages it may send ahead of `sub`.
const CREDIT_MAX: u32 = 100;

/// A connection and its one session.
async fn open(target: &Target) -> anyhow::Result<(ConnectionHandle<()>, SessionHandle<()>)> {
    connecting(&target.endpoint, async {
        let io = stream::open(target).await?;
        let e = &target.endpoint;
        let mut builder = Connection::builder()
            .container_id(target.client_id.clone())
            .hostname(e.host.as_str());
        if let Some(user) = &e.user {
            builder = builder.sasl_profile(SaslProfile::Plain {
                username: user.clone(),
                password: e.password.clone().unwrap_or_default(),
            });
        }
        let mut connection = builder.open_with_stream(io).await.map_err(explain)?;
        let session = Session::begin(&mut connection)
            .await
            .context("beginning a session")?;
        Ok((connection, session))
    })
    .await
}

fn explain(e: OpenError) -> anyhow::Error {
    match e {
        OpenError::SaslError { code, .. } => {
            anyhow::anyhow!("the broker refused the login: SASL outcome {code:?}")
        }
        other => anyhow::Error::new(other),
    }
}

/// Ends the session and closes the connection.
async fn close(
    mut connection: ConnectionHandle<()>,
    mut session: SessionHandle<()>,
) -> anyhow::Result<()> {
    session.end().await.context("ending the session")?;
    connection.close().await.context("closing the connection")?;
    Ok(())
}

pub(super) async fn publish(target: &Target, plan: &PublishPlan) -> anyhow::Result<()> {
    let (connection, mut session) = open(target).await?;
    let address = target.endpoint.address.canonical();
    let mut sender = Sender::attach(&mut session, "rosetta-pub", address.as_str())
        .await
        .with_context(|| format!("attaching a sender to {}", target.endpoint))?;
    let mut pacer = plan.pacer.clone();
    for n in 1..=plan.count {
        pacer.wait().await;
        let message = Message::builder()
            .header(Header {
                durable: target.qos > 0,
                ..Default::default()
            })
            .data(plan.payload(n))
            .build();
        // Unsettled: the broker's outcome comes back before the next send.
        match sender
            .send(message)
            .await
            .with_context(|| format!("sending message {n}"))?
        {
            Outcome::Accepted(_) => {}
            other => bail!("the broker did not accept message {n}: {other:?}"),
        }
    }
    sender.close().await.context("detaching the sender")?;
    close(connection, session).await
}

pub(super) async fn subscribe(target: &Target, receiving: &mut Receiving) -> anyhow::Result<()> {
    let (connection, mut session) = open(target).await?;
    let address = target.endpoint.address.canonical();
    let credit = receiving
        .wanted
        .map_or(CREDIT_MAX, |w| w.clamp(1, u64::from(CREDIT_MAX)) as u32);
    let mut receiver = Receiver::builder()
        .name("rosetta-sub")
        .source(address.as_str())
        .credit_mode(CreditMode::Auto(credit))
        .attach(&mut session)
        .await
        .with_context(|| format!("subscribing to {}: attaching a receiver", target.endpoint))?;
    receiving.subscribed(&target.endpoint);
    while receiving.wants_more() {
        let delivery = receiver.recv::<Body<Value>>().await.context("receiving")?;
        receiving.take(&payload(delivery.body()))?;
        receiver.accept(&delivery).await.context("accepting")?;
    }
    // Detaching releases what was sent ahead and not accepted.
    receiver.close().await.context("detaching the receiver")?;
    close(connection, session).await
}

/// The bytes of a body: data sections joined, a string or binary value as
/// is, anything else as fe2o3 prints it.
fn payload(body: &Body<Value>) -> Vec<u8> {
    match body {
        Body::Data(sections) => sections.iter().flat_map(|d| d.0.to_vec()).collect(),
        Body::Value(v) => match &v.0 {
            Value::String(s) => s.clone().into_bytes(),
            Value::Binary(b) => b.to_vec(),
            other => format!("{other:?}").into_bytes(),
        },
        Body::Sequence(s) => format!("{s:?}").into_bytes(),
        Body::Empty => Vec::new(),
    }
}
