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
    Ok(m.into_report(
        scenario.into(),
        target,
        &tally,
        vec![
            ("client", p.client.name().into()),
            ("size", p.size.into()),
            ("durable", p.durable.into()),
            ("window", p.window.into()),
            ("credit", p.credit.into()),
        ],
    ))
}
