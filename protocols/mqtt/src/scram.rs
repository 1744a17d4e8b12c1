//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as an MQTT 5 enhanced authentication
//! method (MQTT 5 §4.12). The exchange itself is
//! [`rosetta_neutral::scram`], shared with the AMQP adapter's SASL layer;
//! this crate only carries its messages in CONNECT, AUTH and CONNACK
//! (`connection/auth.rs`).
//!
//! The exchange, with Authentication Method `SCRAM-SHA-256` on every
//! packet:
//!
//! | client                                  | server                                     |
//! |-----------------------------------------|--------------------------------------------|
//! | CONNECT, data = client-first            |                                            |
//! |                                         | AUTH 0x18 (continue), data = server-first  |
//! | AUTH 0x18, data = client-final          |                                            |
//! |                                         | CONNACK 0x00, data = server-final (`v=…`)  |
//!
//! Re-authentication runs the same exchange after CONNACK, started by the
//! client with AUTH 0x19 and ended by the server with AUTH 0x00.
//!
//! [`ScramClient`] is the client side, re-exported so that Rust clients and
//! the integration tests can authenticate this way; the broker never uses
//! it.

pub use rosetta_neutral::scram::{ScramClient, ScramError, SCRAM_SHA_256};

pub(crate) use rosetta_neutral::scram::{server_first, ScramPending};
