//! Sans-IO STOMP 1.0/1.1/1.2 server adapter for Rosetta.
//!
//! Layout:
//! - [`frame`]: commands, versions, headers, the decoded [`Frame`];
//! - [`escape`]: per-version header escaping;
//! - [`parser`]: the incremental `nom` [`Decoder`] with its limits;
//! - [`encoder`]: [`FrameWriter`] for server frames;
//! - [`connection`]: [`StompConnection`], the per-connection state machine
//!   driven by the server with bytes, core events and time, configured by
//!   [`StompConfig`]; its header conventions are documented there;
//! - private helpers: `open` (frame handlers of the connected state),
//!   `convert` (headers ↔ neutral message), `subscription` (ack tracking),
//!   `consumer_options` (SUBSCRIBE headers → selector, exclusivity,
//!   priority, browsing),
//!   `receipts` (ordered durable receipts), `heartbeat` (negotiation),
//!   `swar` (byte searches a word at a time for the parser and encoder);
//! - [`error`]: [`StompError`] and the one mapping to ERROR frames.
//!
//! The crate does no IO: the server reads the socket and calls
//! [`StompConnection::handle_input`], forwards core events to
//! [`StompConnection::handle_event`], and writes what
//! [`StompConnection::poll_transmit`] returns.
#![warn(missing_docs)]

pub mod config;
pub mod connection;
pub mod encoder;
pub mod error;
pub mod escape;
pub mod frame;
/// For the cargo-fuzz target `fuzz/fuzz_targets/swar.rs` only.
#[doc(hidden)]
pub mod fuzzing;
pub mod parser;

mod clock;
mod consumer_options;
mod convert;
mod heartbeat;
mod open;
mod receipts;
mod subscription;
mod swar;

pub use config::StompConfig;
pub use connection::StompConnection;
pub use encoder::FrameWriter;
pub use error::StompError;
pub use frame::{Command, Frame, Headers, Version};
pub use parser::{Decoder, FrameError, Limits};
