//! How much memory a deep queue costs: fills one durable queue with
//! persistent 1 KiB messages through the core and the journal (no
//! consumer), then prints the process's resident memory, with paging on
//! (the default) and, for comparison, off.
//!
//! ```sh
//! cargo run --release --example paging_rss              # 1,000,000 messages, paging on
//! cargo run --release --example paging_rss -- 1000000 off
//! # keep the journal in DIR, then measure a restart on it in a new process:
//! cargo run --release --example paging_rss -- 1000000 on DIR
//! cargo run --release --example paging_rss -- recover DIR
//! ```
//!
//! Issue 2 asks that a queue of a million 1 KiB messages not need a
//! gigabyte of RAM. Each run is its own process, so the peak (VmHWM) is
//! that run's alone.

use std::sync::Arc;
use std::time::Instant;

use rosetta::core::{AllowAll, Core, CoreConfig};
use rosetta::store::{Store, StoreConfig};
use rosetta_neutral::{
    Address, Broker, EventSink, Message, Principal, Protocol, PublishOptions, QueueLifetime,
    QueueSpec, SessionEvent, SessionInfo,
};

/// The allocator the `rosetta` binary uses.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const BODY_BYTES: usize = 1024;
const MEMORY_BUDGET_BYTES: u64 = 64 * 1024 * 1024;

struct Discard;

impl EventSink for Discard {
    fn send(&self, _event: SessionEvent) {}
}

/// A field of /proc/self/status in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Opens the journal in `dir` (recovery) with paging on, and reports what
/// the restart cost in memory.
fn recover(dir: &std::path::Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let (store, recovered) = Store::open(StoreConfig::new(dir))?;
    // Replay is done: the journal index and the recovered messages'
    // locations are in memory, no message body is.
    let replay_s = started.elapsed().as_secs_f64();
    let replay_rss_mib = status_kib("VmRSS:") >> 10;
    let config = CoreConfig {
        memory_budget_bytes: MEMORY_BUDGET_BYTES,
        paging_dir: Some(dir.join("paging")),
        ..CoreConfig::default()
    };
    let store = Arc::new(store);
    let core = Core::new(config, store.clone(), Arc::new(AllowAll), Some(recovered));
    let stats = core
        .queue_stats("deep")
        .ok_or_else(|| anyhow::anyhow!("queue 'deep' was not recovered"))?;
    println!(
        "recovery: depth {}, paged {} in {:.1} s (replay {replay_s:.1} s, RSS {replay_rss_mib} MiB \
         after it); process RSS {} MiB after, peak {} MiB during",
        stats.depth,
        stats.paged,
        started.elapsed().as_secs_f64(),
        status_kib("VmRSS:") >> 10,
        status_kib("VmHWM:") >> 10,
    );
    core.shutdown();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let first = args.next();
    if first.as_deref() == Some("recover") {
        let dir = args
            .next()
            .ok_or_else(|| anyhow::anyhow!("recover needs the journal directory"))?;
        return recover(std::path::Path::new(&dir));
    }
    let count: usize = first.map_or(Ok(1_000_000), |a| a.parse())?;
    let paging = args.next().as_deref() != Some("off");
    let kept = args.next().map(std::path::PathBuf::from);
    let temp = tempfile::tempdir()?;
    let dir = kept.as_deref().unwrap_or(temp.path());
    let (store, recovered) = Store::open(StoreConfig::new(dir))?;
    let config = CoreConfig {
        memory_budget_bytes: MEMORY_BUDGET_BYTES,
        paging_dir: paging.then(|| dir.join("paging")),
        ..CoreConfig::default()
    };
    let store = Arc::new(store);
    let core = Core::new(config, store.clone(), Arc::new(AllowAll), Some(recovered));
    let info = SessionInfo {
        conn_id: 1,
        protocol: Protocol::Internal,
        principal: Principal::anonymous(),
        client_id: Some("paging-rss".into()),
        take_over: false,
    };
    let mut session = core.open_session(info, Arc::new(Discard));
    session.declare_queue(QueueSpec {
        name: Some("deep".into()),
        durable: true,
        lifetime: QueueLifetime::Permanent,
        bindings_max: None,
    })?;
    let rss_before = status_kib("VmRSS:");
    let address = Address::Queue("deep".into());
    let started = Instant::now();
    for i in 0..count {
        let mut body = vec![(i % 251) as u8; BODY_BYTES];
        body[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let mut message = Message::binary(body);
        message.durable = true;
        session.publish(&address, message, PublishOptions::default())?;
    }
    store.flush()?;
    let elapsed = started.elapsed();
    let stats = core
        .queue_stats("deep")
        .ok_or_else(|| anyhow::anyhow!("queue 'deep' is gone"))?;
    let rss = status_kib("VmRSS:");
    println!(
        "paging {}: {count} x {BODY_BYTES} B persistent messages in {:.1} s; depth {}, paged {}, \
         core memory {} MiB (budget {} MiB); process RSS {} MiB (peak {} MiB, {} MiB before filling) \
         = {:.0} bytes per queued message",
        if paging { "on" } else { "off" },
        elapsed.as_secs_f64(),
        stats.depth,
        stats.paged,
        core.memory_used() >> 20,
        MEMORY_BUDGET_BYTES >> 20,
        rss >> 10,
        status_kib("VmHWM:") >> 10,
        rss_before >> 10,
        (rss.saturating_sub(rss_before) * 1024) as f64 / count as f64,
    );
    drop(session);
    core.shutdown();
    Ok(())
}
