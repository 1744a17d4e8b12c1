//! Rosetta's MQTT 3.1.1 and 5.0 server adapter, sans IO.
//!
//! [`MqttConnection`] is a state machine: the server's driver feeds it the
//! bytes read from a socket ([`MqttConnection::handle_input`]), the events
//! the core sends the session ([`MqttConnection::handle_event`]) and the
//! time ([`MqttConnection::handle_timeout`]), and writes out what
//! [`MqttConnection::poll_transmit`] returns. Both versions share one port:
//! the protocol level in CONNECT picks the codec.
//!
//! ## Layout
//! - [`codec`]: incremental decoding and encoding (mqttbytes for the
//!   packets it handles well, our own code where it falls short; each
//!   module names the gaps it covers);
//! - `connection`: the state machine (handshake, inbound publishes,
//!   outbound deliveries, subscriptions);
//! - `convert`: PUBLISH <-> neutral `Message`;
//! - `inflight`: packet ids, annotations and persisted QoS 2 state;
//! - [`error`]: typed errors and the single mapping to reason codes;
//! - [`config`]: limits, advertised in MQTT 5 CONNACK.
//!
//! ## Sessions
//! One core queue per client id (`$mqtt/<client id>`), durable when the
//! session outlives the connection; one binding per subscription; shared
//! subscriptions are a queue named `$share/group/filter`. QoS 1/2 in-flight
//! state is annotated on the core's deliveries and inbound QoS 2 state is
//! saved with `Session::put_state`, so both survive a broker restart.
#![warn(missing_docs)]

pub mod codec;
pub mod config;
mod connection;
mod convert;
pub mod error;
mod inflight;

pub use codec::Version;
pub use config::MqttConfig;
pub use connection::MqttConnection;
pub use error::MqttError;
