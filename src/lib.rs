//! Rosetta

pub mod config;
pub mod users;
