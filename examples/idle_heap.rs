//! The broker (listeners, core, journal; no admin API) on the system
//! allocator, so a heap profiler sees every allocation (the `rosetta`
//! binary's mimalloc hides them from heaptrack and massif). For the
//! accounting of what an idle connection costs (`docs/scaling.md`):
//!
//! ```sh
//! cargo build --example idle_heap
//! heaptrack target/debug/examples/idle_heap CONFIG.toml &
//! rosetta-load --port PORT --broker-pid PID idle --connections 10000
//! kill -INT PID; heaptrack_print --print-peaks 1 heaptrack.idle_heap.*.zst
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
