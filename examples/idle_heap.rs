//! The broker (listeners, core, journal; no admin API) on the system
//! allocator, so a heap profiler sees every allocation (the `rosetta`
//! binary's jemalloc hides them from heaptrack and massif). For the
//! accounting of what an idle connection costs (`docs/scaling.md`);
//! `bench/idle_heap.sh` runs it under heaptrack, opens the connections and
//! groups the peak heap by allocating site:
//!
//! ```sh
//! cargo build --release -p rosetta-load --example idle_heap
//! bench/idle_heap.sh target/release/examples/idle_heap target/release/rosetta-load 10000 mqtt
//! ```
//!
//! Runs until SIGINT or SIGTERM, then shuts down as the binary does.

use std::sync::Arc;

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).map(std::path::PathBuf::from);
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_target(false)
        .with_writer(std::io::stderr)
        .init();
    let config = rosetta::server::load_config(path.as_deref())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(rosetta::server::run(
        config,
        Arc::new(rosetta::core::AllowAll),
    ))
}
