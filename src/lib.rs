//! Rosetta
pub mod access;
pub mod config;
pub mod core;
pub mod hash_pool;
pub mod server;
pub mod store;
pub mod users;
