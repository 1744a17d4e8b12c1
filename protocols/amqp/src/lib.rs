//! AMQP 1.0 server engine (work in progress: codec layer only so far).
#![warn(missing_docs)]
// The connection engine that uses these helpers lands in the next commits.
#![allow(dead_code)]
// Tests unwrap freely: a panic there is a failed assertion, not peer input.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod codec;
pub mod frame;
mod message;

pub use codec::CodecError;
