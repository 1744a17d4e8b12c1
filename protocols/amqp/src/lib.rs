//! Rosetta's AMQP 1.0 server side: a sans-IO connection engine.
//!
//! `fe2o3-amqp-types` and `serde_amqp` are used as the codec only; the
//! engine (framing, SASL, sessions, links, credit, settlement, transactions)
//! is ours, so that it fits the broker core and batches its output.
//!
//! ## Layout
//! - [`frame`]: bounds-checked protocol-header and frame parsing/encoding;
//! - `codec`: value-length scanning, size checks, encode into a buffer;
//! - [`descriptor`]: the spec's descriptors, read in either form (symbol or
//!   ulong, §1.5);
//! - `sasl`: ANONYMOUS, PLAIN, SCRAM-SHA-256, EXTERNAL (a sub-machine of the
//!   connection's handshake);
//! - `connection`: the [`AmqpConnection`] state machine (headers, SASL,
//!   Open/Close, idle timeouts) and its opened state, which dispatches
//!   frames and core events to sessions and scopes errors;
//! - `session`: one session (Begin/End, windows, dispositions, transfers
//!   both ways), owned by the connection under its channel;
//! - `link`: one link (Attach/Detach, addresses, credit, partial
//!   transfers), owned by its session under its handle;
//! - `delivery`: helpers both directions share (hand-written transfer
//!   frames, dispositions, outcome mapping);
//! - `coordinator`: transactions, driven by the connection that owns them;
//! - `context`, `transactions`: what the connection lends its sessions and
//!   links for a call, and the declared transactions;
//! - `message`: AMQP sections <-> [`rosetta_neutral::Message`];
//! - [`error`]: [`AmqpError`] and the one mapping to AMQP conditions.
//!
//! The modules form a tree: `connection` → `session` → `link` →
//! `delivery`, with `coordinator` used by `connection` and using `session`;
//! only `connection` names [`AmqpConnection`], and the inner levels reach
//! the outer ones only through `context::Ctx`.
//!
//! ## Where `fe2o3-amqp-types` falls short, and what we wrap
//! - `serde_amqp::from_slice` does not say how many bytes it consumed, yet a
//!   transfer frame is a performative followed by raw payload, and a message
//!   is a run of sections: `codec::value_len` scans format codes and size
//!   prefixes (never bodies) to split them, bounds-checked.
//! - The frame header codec and the SASL frame-body enum live in the
//!   `fe2o3-amqp` engine crate (whose header read panics on short input):
//!   [`frame`] is ours, and SASL bodies are dispatched on the descriptor code.
//! - Decoding a whole `Message<Body>` decodes and later re-encodes bodies:
//!   we decode only header, properties and application-properties with the
//!   types crate and keep body sections (and message annotations) as
//!   `Bytes` slices of the frame.
//! - `amqp:frame-size-too-large` is not an `AmqpError` variant (the spec only
//!   names frame-size-too-small): sent as `ErrorCondition::Custom`.
//! - `serde_amqp` decodes symbolic descriptors (`amqp:declare:list`, as
//!   python-qpid-proton writes transaction control) for every type we
//!   decode with it; where we dispatch on a descriptor ourselves (SASL
//!   frames, message sections, declare/discharge, the fast path),
//!   [`descriptor`] reads both forms.
//! - Transaction types need the `transaction` feature, enabled in our
//!   manifest.
//! - `Transfer::delivery_tag` is a heap `ByteBuf`: one small allocation per
//!   outgoing delivery remains.
//!
//! ## Driving it
//! The driver feeds socket bytes to [`AmqpConnection::handle_input`], core
//! events to [`AmqpConnection::handle_event`], calls
//! [`AmqpConnection::handle_timeout`] at [`AmqpConnection::poll_timeout`],
//! and writes what [`AmqpConnection::poll_transmit`] appends, once per loop
//! turn. No call blocks and none does IO.
#![warn(missing_docs)]
// Tests unwrap freely: a panic there is a failed assertion, not peer input.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod codec;
mod config;
mod connection;
mod context;
mod coordinator;
mod delivery;
pub mod descriptor;
pub mod error;
mod fast_decode;
pub mod frame;
mod idmap;
mod link;
mod message;
mod sasl;
mod section_writer;
mod session;
mod transactions;

#[cfg(test)]
mod tests;

pub use codec::CodecError;
pub use config::*;
pub use connection::AmqpConnection;
pub use error::AmqpError;
