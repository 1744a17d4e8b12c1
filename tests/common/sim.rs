//! What the seeded simulations of the core over the simulated disk
//! (`core_sim`, `timers_sim`) share: the event queue their sessions write
//! to, opening the store through a power loss or an injected fault, and
//! the seed runner (`SIM_SEED` replays one, `SIM_SECONDS` runs new ones).
//! Included with `#[path]`, not through `common`, so a simulation builds
//! only this.

use std::collections::VecDeque;

use parking_lot::Mutex;
use rosetta::store::sim::{SimDisk, SimOp, SimRng};
use rosetta::store::{Recovered, Store, StoreConfig, StoreError};
use rosetta_neutral::{EventSink, SessionEvent};

/// A session's events, in order, until taken.
#[derive(Default)]
pub(crate) struct EventQueue(Mutex<VecDeque<SessionEvent>>);

impl EventSink for EventQueue {
    fn send(&self, event: SessionEvent) {
        self.0.lock().push_back(event);
    }
}

impl EventQueue {
    /// Every event since the last call.
    pub(crate) fn take(&self) -> Vec<SessionEvent> {
        self.0.lock().drain(..).collect()
    }
}

/// Opens the store on `disk`: again after a power loss while opening, and
/// up to five times in all after an injected I/O fault. Other errors are
/// the caller's to report.
pub(crate) fn open_store(
    disk: &SimDisk,
    config: impl Fn() -> StoreConfig,
) -> Result<(Store, Recovered), StoreError> {
    let mut attempts = 0;
    loop {
        let before = disk.stats();
        attempts += 1;
        match Store::open(config()) {
            Ok(x) => return Ok(x),
            Err(_) if disk.stats().power_losses > before.power_losses => {}
            Err(StoreError::Io { .. }) if disk.stats().faults > before.faults && attempts < 5 => {}
            Err(e) => return Err(e),
        }
    }
}

/// The message id in a body made by `body`, if it is one.
pub(crate) fn id_in(text: &str, prefix: &str, body: impl Fn(u64) -> String) -> Option<u64> {
    let id: u64 = text.strip_prefix(prefix)?.split('-').next()?.parse().ok()?;
    (text == body(id)).then_some(id)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs the seeds the environment asks for: `SIM_SEED` (one, to replay;
/// `report` prints what it did) or `SIM_SECONDS` of new seeds from
/// `SIM_SEED_BASE`. Returns false when it asks for none (run CI's seeds).
pub(crate) fn run_seeds_from_env<T>(run_seed: impl Fn(u64) -> T, report: impl Fn(u64, T)) -> bool {
    if let Some(seed) = env_u64("SIM_SEED") {
        report(seed, run_seed(seed));
        return true;
    }
    let Some(secs) = env_u64("SIM_SECONDS") else {
        return false;
    };
    let start = std::time::Instant::now();
    let base = env_u64("SIM_SEED_BASE").unwrap_or(1);
    let mut n = 0u64;
    while start.elapsed().as_secs() < secs {
        run_seed(base.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        n += 1;
    }
    println!("{n} random seeds passed from base {base}");
    true
}

/// Plans a power loss within the next 30 mutating operations of `disk`.
pub(crate) fn plan_power_loss(disk: &SimDisk, rng: &mut SimRng) {
    let at = disk.stats().mutating_ops + 1 + rng.below(30);
    disk.power_fails_at_op(at);
}

/// Makes the next write or sync of `disk` (a coin decides) fail with `EIO`.
pub(crate) fn fail_next_write_or_sync(disk: &SimDisk, rng: &mut SimRng) {
    let op = if rng.coin() {
        SimOp::Sync
    } else {
        SimOp::Write
    };
    disk.fail_next(op, None);
}
