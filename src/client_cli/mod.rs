//! `rosetta pub` and `rosetta sub`: clients that speak the protocols, so a
//! user can try any pair (publish over MQTT, receive over AMQP, ...)
//! without installing a client. The URL says the protocol, transport,
//! credentials and address (see [`url`]); each protocol has its module
//! with a `publish` and a `subscribe` of the same shape, over the client
//! the integration tests use (rumqttc, fe2o3-amqp) or, for STOMP, the
//! broker's own frame codec.
//!
//! `sub` prints each payload on its own line on standard output, a line
//! `subscribed to URL` on standard error once the broker confirmed the
//! subscription (a script may publish after it), and a summary (count,
//! elapsed time, rate) on standard error at the end.

mod amqp;
mod mqtt;
mod stomp;
mod stream;
mod tls;
mod url;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

use url::{Endpoint, Protocol};

/// `rosetta pub`.
#[derive(Args, Debug)]
pub(crate) struct PubArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// The payload; `{seq}` in it is replaced by the message's number (1, 2, ...).
    #[arg(long, short, default_value = "hello from rosetta pub")]
    message: String,
    /// How many messages.
    #[arg(long, short = 'n', default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Messages per second (default: as fast as the broker takes them).
    #[arg(long, value_name = "PER_SECOND")]
    rate: Option<f64>,
}

/// `rosetta sub`.
#[derive(Args, Debug)]
pub(crate) struct SubArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Exits after this many messages (default: runs until Ctrl-C).
    #[arg(long, short = 'n', value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
}

/// What `pub` and `sub` share.
#[derive(Args, Debug)]
struct CommonArgs {
    /// Where and how: `mqtt://user:pass@host:1883/topic/a/b`,
    /// `stomp://...:61613/queue/q`, `amqp://...:5672/queue/q`, `mqtts://`,
    /// `stomps://`, `amqps://`, or over WebSocket
    /// `ws://...:8080/mqtt/topic/a/b`, `ws://...:8080/stomp/queue/q`,
    /// `ws://...:8080/amqp/queue/q` (`wss://`). The path is the address:
    /// `/topic/<name>` or `/queue/<name>`.
    #[arg(long)]
    url: String,
    /// Delivery guarantee: 0 at most once, 1 at least once (MQTT QoS;
    /// STOMP `persistent`, AMQP durable), 2 exactly once (MQTT only).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=2))]
    qos: u8,
    /// The client id (MQTT client id, STOMP `client-id`, AMQP container id);
    /// default: `rosetta-pub-<pid>` or `rosetta-sub-<pid>`.
    #[arg(long)]
    client_id: Option<String>,
    /// CA certificates (PEM) that TLS URLs trust instead of the system's.
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
}

/// Longest wait for the broker to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Fastest `--rate`: beyond this the pacing is finer than the timer.
const RATE_MAX_PER_S: f64 = 1_000_000.0;
/// Slowest `--rate`: one message every quarter of an hour or so.
const RATE_MIN_PER_S: f64 = 0.001;

/// A parsed `pub` or `sub`: where, and with what TLS.
struct Target {
    endpoint: Endpoint,
    tls: Option<Arc<rustls::ClientConfig>>,
    qos: u8,
    client_id: String,
}

impl Target {
    fn new(common: CommonArgs, role: &str) -> anyhow::Result<Target> {
        let endpoint = Endpoint::parse(&common.url)?;
        if common.qos == 2 && endpoint.protocol != Protocol::Mqtt {
            bail!("--qos 2 is MQTT's exactly once; STOMP and AMQP take 0 or 1");
        }
        let tls = endpoint
            .uses_tls()
            .then(|| tls::client_config(common.ca.as_deref()))
            .transpose()?;
        let client_id = common
            .client_id
            .unwrap_or_else(|| format!("rosetta-{role}-{}", std::process::id()));
        Ok(Target {
            endpoint,
            tls,
            qos: common.qos,
            client_id,
        })
    }
}

/// What to publish.
#[derive(Clone)]
struct PublishPlan {
    message: String,
    count: u64,
    pacer: Pacer,
}

impl PublishPlan {
    /// The payload of message `n` (from 1).
    fn payload(&self, n: u64) -> Vec<u8> {
        self.message.replace("{seq}", &n.to_string()).into_bytes()
    }
}

/// Spaces the messages out to `--rate`.
#[derive(Clone)]
struct Pacer {
    per_s: Option<f64>,
    start: Option<tokio::time::Instant>,
    sent: u64,
}

impl Pacer {
    fn new(rate: Option<f64>) -> anyhow::Result<Pacer> {
        if let Some(r) = rate {
            if !(RATE_MIN_PER_S..=RATE_MAX_PER_S).contains(&r) {
                bail!("--rate must be from {RATE_MIN_PER_S} to {RATE_MAX_PER_S} (got {r})");
            }
        }
        Ok(Pacer {
            per_s: rate,
            start: None,
            sent: 0,
        })
    }

    /// Waits until the next message is due: message k at start + k / rate,
    /// so a slow send is caught up rather than delaying all later ones.
    async fn wait(&mut self) {
        let Some(per_s) = self.per_s else {
            return;
        };
        let start = *self.start.get_or_insert_with(tokio::time::Instant::now);
        let offset = Duration::try_from_secs_f64(self.sent as f64 / per_s).unwrap_or(Duration::MAX);
        // Past what an Instant can hold (centuries away): no wait.
        if let Some(due) = start.checked_add(offset) {
            tokio::time::sleep_until(due).await;
        }
        self.sent += 1;
    }
}

/// What `sub` has received, and when to stop.
struct Receiving {
    wanted: Option<u64>,
    got: u64,
    started: Instant,
    out: std::io::Stdout,
}

impl Receiving {
    /// The broker confirmed the subscription.
    fn subscribed(&self, endpoint: &Endpoint) {
        eprintln!("subscribed to {endpoint}");
    }

    /// Prints one payload; whether more are wanted.
    fn take(&mut self, payload: &[u8]) -> anyhow::Result<bool> {
        let mut out = self.out.lock();
        out.write_all(payload)?;
        out.write_all(b"\n")?;
        // A line at a time: whoever reads the pipe sees each message as it comes.
        out.flush()?;
        self.got += 1;
        Ok(self.wants_more())
    }

    fn wants_more(&self) -> bool {
        self.wanted.is_none_or(|w| self.got < w)
    }
}

/// The summary line on standard error.
fn summary(verb: &str, count: u64, started: Instant) {
    let elapsed = started.elapsed().as_secs_f64();
    let rate = if elapsed > 0.0 {
        count as f64 / elapsed
    } else {
        0.0
    };
    let plural = if count == 1 { "" } else { "s" };
    eprintln!("{verb} {count} message{plural} in {elapsed:.3} s ({rate:.1} msg/s)");
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `rosetta pub`.
pub(crate) fn publish(args: PubArgs) -> anyhow::Result<()> {
    let target = Target::new(args.common, "pub")?;
    let plan = PublishPlan {
        message: args.message,
        count: args.count,
        pacer: Pacer::new(args.rate)?,
    };
    let started = Instant::now();
    runtime()?.block_on(async {
        match target.endpoint.protocol {
            Protocol::Mqtt => mqtt::publish(&target, &plan).await,
            Protocol::Stomp => stomp::publish(&target, &plan).await,
            Protocol::Amqp => amqp::publish(&target, &plan).await,
        }
    })?;
    summary("published", plan.count, started);
    Ok(())
}

/// `rosetta sub`.
pub(crate) fn subscribe(args: SubArgs) -> anyhow::Result<()> {
    let target = Target::new(args.common, "sub")?;
    let mut receiving = Receiving {
        wanted: args.count,
        got: 0,
        started: Instant::now(),
        out: std::io::stdout(),
    };
    let result = runtime()?.block_on(async {
        let run = async {
            match target.endpoint.protocol {
                Protocol::Mqtt => mqtt::subscribe(&target, &mut receiving).await,
                Protocol::Stomp => stomp::subscribe(&target, &mut receiving).await,
                Protocol::Amqp => amqp::subscribe(&target, &mut receiving).await,
            }
        };
        tokio::select! {
            r = run => r,
            // Without --count: until Ctrl-C, then the summary as usual.
            r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C"),
        }
    });
    // A connection that failed before anything came gets only its error.
    if result.is_ok() || receiving.got > 0 {
        summary("received", receiving.got, receiving.started);
    }
    result
}

/// `what` within [`CONNECT_TIMEOUT`], naming the endpoint on failure.
async fn connecting<T>(
    endpoint: &Endpoint,
    what: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(CONNECT_TIMEOUT, what)
        .await
        .with_context(|| format!("connecting to {endpoint}: no answer in {CONNECT_TIMEOUT:?}"))?
        .with_context(|| format!("connecting to {endpoint}"))
}
