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
//! - `own_subs`: the persisted list of shared and `$queue/` subscriptions;
//! - [`error`]: typed errors and the single mapping to reason codes;
//! - [`config`]: limits, advertised in MQTT 5 CONNACK;
//! - [`scram`]: SCRAM-SHA-256 enhanced authentication (AUTH packets).
//!
//! ## Sessions
//! One core queue per client id (`$mqtt/<client id>`), durable when the
//! session outlives the connection; one binding per subscription; shared
//! subscriptions are a queue named `$share/group/filter`. QoS 1/2 in-flight
//! state is annotated on the core's deliveries; inbound QoS 2 state and the
//! list of shared and `$queue/` subscriptions (consumers, which end with
//! the connection) are saved with `Session::put_state`, so all of it
//! survives a broker restart and the consumers are re-attached on resume.
//!
//! ## What the adapter expects of the core
//! - `declare_queue` of an existing queue updates its `durable` and
//!   `lifetime` (MQTT 5 session expiry changes on reconnect and on
//!   DISCONNECT; there is no other call for it);
//! - `close` after `SessionEvent::Kicked` is harmless; we call it with
//!   `Abnormal` so a taken-over session's will follows the will delay;
//! - `Delivery::annotation` comes back on redelivery of a delivery we
//!   annotated (packet id + phase), also after a restart;
//! - a `Committed` ticket (alone, or one of a `CommittedRun`) is
//!   reported once.
//!
//! ## mqttbytes 0.6: what we use and what we work around
//! Used: `mqttbytes::v4::read` for 3.1.1 PUBLISH, acks, UNSUBSCRIBE,
//! PINGREQ and DISCONNECT; the `v4`/`v5` writers for every server packet.
//! Replaced or wrapped, with the reason:
//! - framing: `check` compares the remaining length, not the packet size,
//!   with the limit, checks no fixed-header flags, and rejects packet type
//!   15 (AUTH) -> [`codec::frame`];
//! - AUTH packet: missing -> ours in [`codec::v5`] (decoding) and
//!   [`codec::encode::auth`] (encoding);
//! - `v5::DisconnectReasonCode` lacks some codes (0x8C is not a DISCONNECT
//!   code anyway; unknown ones become 0x80) and a DISCONNECT with a reason
//!   code but no properties is written in the short form that mqttbytes'
//!   and rumqttc's readers reject -> we write that form ourselves with an
//!   empty property list;
//! - v5 properties: reads not bounded by the property length (a short
//!   length lets a property eat payload), subscription identifier length
//!   counted twice (a SUBSCRIBE with an identifier and a user property
//!   misparses its filters; the same miscount affects clients decoding our
//!   PUBLISH with several identifiers and a content type), duplicates and
//!   disallowed identifiers accepted, zero values not rejected ->
//!   [`codec::props`];
//! - CONNECT: password read as UTF-8 (MQTT passwords are binary), empty
//!   user name folded into "none", reserved flag ignored, 3.1.1 password
//!   without user name accepted, trailing bytes ignored -> [`codec::connect`];
//! - v5 UNSUBSCRIBE read has a leftover `dbg!` printing to stderr; v5
//!   decoding is ours for all client packets ([`codec::v5`]);
//! - DUP on QoS 0, U+0000 in strings, reserved SUBSCRIBE option bits, empty
//!   SUBSCRIBE/UNSUBSCRIBE are accepted -> checked in [`codec::v4`] and
//!   [`codec::v5`];
//! - `v5::ConnAck::write` omits the property length when `properties` is
//!   `None` (malformed CONNACK) -> we always pass a list
//!   ([`codec::encode`]); `v5::Disconnect::write` with an empty property
//!   list writes a malformed packet -> we only add non-empty reason strings;
//! - the writers cast string and binary lengths to `u16` without a check,
//!   so a value over 65,535 bytes (possible from AMQP/STOMP publishers)
//!   would corrupt the stream -> such properties are left out
//!   (`convert`) and such topics are not delivered;
//! - reason codes are enums without a raw fallback -> `u8` codes mapped in
//!   [`codec::encode`].
#![warn(missing_docs)]

pub mod codec;
pub mod config;
mod connection;
mod convert;
mod delayed;
pub mod error;
mod inflight;
mod own_subs;
pub mod scram;

pub use codec::Version;
pub use config::MqttConfig;
pub use connection::MqttConnection;
pub use error::MqttError;
