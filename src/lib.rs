//! Rosetta: the broker's crates under one name.
//!
//! The broker is split into crates whose dependencies are the design (see
//! the README's "Layout"): `rosetta-store` (the journal), `rosetta-core`
//! (routing, queues, delivery; the store and the neutral API only),
//! `rosetta-config` (the configuration file) and `rosetta-server` (the only
//! network IO). This library re-exports them under the module paths they had
//! when they were one crate, for the `rosetta` binary, the integration
//! tests, benches, examples and fuzz targets.

pub use rosetta_admin as admin;
pub use rosetta_config as config;
pub use rosetta_core as core;
pub use rosetta_server as server;
pub use rosetta_server::{access, hash_pool, users};
pub use rosetta_store as store;

/// What the broker logs once its journal is recovered, its listeners are
/// bound and its admin API answers every route: the line to wait for
/// before using a broker just started (the integration tests' harness
/// does; the Python harnesses and bench scripts match it as text).
pub const READY_LOG_LINE: &str = "ready: journal recovered, listeners bound";
