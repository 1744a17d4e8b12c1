//! AMQP 1.0 scenario: one queue, 1 sender → 1 receiver, unsettled
//! (at-least-once). The sender keeps up to `window` deliveries waiting for
//! their `accepted` disposition; the receiver grants `credit` and accepts
//! every message. Durable or non-durable messages.
//!
//! Two clients run it: `wire` (our own, [`crate::amqp_client`]; the
//! default, cheap enough that the broker, not the tool, bounds the run) and
//! `fe2o3` (fe2o3-amqp, kept to compare against).

mod fe2o3;
mod wire;

use std::time::{Duration, Instant};

use fe2o3_amqp::types::messaging::TerminusDurability;

use crate::amqp_client::Sasl;
use crate::run::{unique, Tally, Target};
use crate::stats::Report;

/// Which AMQP client drives the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Client {
    /// Our own batching client (`amqp_client`).
    Wire,
    /// fe2o3-amqp's client.
    Fe2o3,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Self::Wire => "wire",
            Self::Fe2o3 => "fe2o3",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Params {
    pub(crate) client: Client,
    pub(crate) count: u64,
    pub(crate) size: usize,
    /// Deliveries the sender leaves unsettled before waiting.
    pub(crate) window: usize,
    pub(crate) credit: u32,
    pub(crate) durable: bool,
    /// Ask for durable source/target termini. RabbitMQ 3.x declares the
    /// queue behind `/queue/x` with the terminus durability, so this is
    /// what makes its queue durable.
    pub(crate) durable_terminus: bool,
    pub(crate) sasl: Sasl,
    /// Address prefix of a queue ("/queue/" for Rosetta and RabbitMQ).
    pub(crate) prefix: String,
}

impl Params {
    fn durability(&self) -> TerminusDurability {
        if self.durable_terminus {
            TerminusDurability::UnsettledState
        } else {
            TerminusDurability::None
        }
    }
}

/// What a client's run measured, between the first send and the end.
#[derive(Debug, Default)]
struct Measured {
    elapsed: Duration,
    latencies_ns: Vec<u64>,
    broker_cpu_us: Option<u64>,
    load_cpu_us: Option<u64>,
    error: Option<String>,
}

/// CPU counters and the clock at the first send.
struct Meter {
    started: Instant,
    cpu0: Option<u64>,
    load0: Option<u64>,
}

impl Meter {
    fn start(target: &Target) -> anyhow::Result<Self> {
        let load0 = crate::procfs::self_cpu_us();
        let cpu0 = target.cpu_us()?;
        Ok(Self {
            started: Instant::now(),
            cpu0,
            load0,
        })
    }

    /// Elapsed time and the broker's and our CPU time since `start`.
    fn stop(&self, target: &Target) -> anyhow::Result<Measured> {
        let elapsed = self.started.elapsed();
        let cpu1 = target.cpu_us()?;
        let load1 = crate::procfs::self_cpu_us();
        Ok(Measured {
            elapsed,
            broker_cpu_us: self.cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
            load_cpu_us: self.load0.zip(load1).map(|(a, b)| b.saturating_sub(a)),
            ..Measured::default()
        })
    }
}

pub(crate) async fn run(target: &Target, p: &Params) -> anyhow::Result<Report> {
    let queue = unique("bench-amqp");
    let addr = format!("{}{queue}", p.prefix);
    let scenario = if p.durable {
        "amqp-durable"
    } else {
        "amqp-nondurable"
    };
    let tally = Tally::new(p.count);
    let m = match p.client {
        Client::Wire => wire::run(target, p, &queue, &addr, tally.clone()).await?,
        Client::Fe2o3 => fe2o3::run(target, p, &queue, &addr, tally.clone()).await?,
    };
    Ok(Report {
        scenario: scenario.into(),
        broker: target.name.clone(),
        expected: tally.expected(),
        received: tally.received(),
        elapsed: m.elapsed,
        latencies_ns: m.latencies_ns,
        broker_cpu_us: m.broker_cpu_us,
        load_cpu_us: m.load_cpu_us,
        extra: vec![
            ("client", p.client.name().into()),
            ("size", p.size.into()),
            ("durable", p.durable.into()),
            ("window", p.window.into()),
            ("credit", p.credit.into()),
        ],
        error: m.error,
    })
}
