//! Rosetta
pub mod config;
pub mod core;
pub mod store;
pub mod users;
