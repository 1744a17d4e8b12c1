//! Rosetta's protocol-neutral API: the one crate every protocol adapter and
//! the broker core both depend on.
//!
//! - [`message`]: the [`Message`] every wire format converts to and from;
//! - [`value`]: typed, ordered properties;
//! - [`fields`]: standard fields as named text properties (STOMP headers,
//!   MQTT 5 user properties);
//! - [`address`]: the naming scheme shared by MQTT, STOMP and AMQP;
//! - [`broker`]: the [`Broker`]/[`Session`] handle adapters call, and the
//!   [`SessionEvent`]s the core sends back;
//! - [`id_hash`]: the hash of maps keyed by ids the broker allocates;
//! - [`budget`]: the per-connection byte budget for deliveries not yet
//!   written, the core's back-pressure from a slow reader;
//! - [`lazy_map`]: a hash map that costs a pointer until its first entry,
//!   for the per-connection state most connections never use;
//! - [`stream`]: where a stream reader starts, its group, and the
//!   position a stream delivery carries;
//! - [`login`]: the identity rule for a new connection (password, client
//!   certificate) and the password check that finishes later;
//! - [`scram`]: the SCRAM-SHA-256 exchange (RFC 5802/7677) that AMQP SASL
//!   and MQTT 5 enhanced authentication both run.
//!
//! The crate has no IO and no async runtime: adapters built on it stay
//! sans-IO state machines.
#![warn(missing_docs)]

pub mod address;
pub mod broker;
pub mod budget;
pub mod clock;
pub mod fields;
pub mod id_hash;
pub mod lazy_map;
pub mod login;
pub mod message;
pub mod placement;
pub mod scram;
pub mod small_map;
pub mod stream;
pub mod value;

pub use address::{Address, AddressError, RoutingType};
pub use broker::*;
pub use budget::{DeliveryBudget, DeliveryCharge};
pub use lazy_map::LazyMap;
pub use login::{Credentials, LoginStart, PasswordCheck};
pub use message::{Body, BodyKind, Guarantee, Message, MessageId};
pub use placement::{Placement, PlacementRequest, RedirectTarget};
pub use stream::{
    StreamOffset, StreamOffsetError, StreamPosition, StreamRead, STREAM_GROUP_BYTES_MAX,
    STREAM_OFFSET_SPEC_BYTES_MAX, STREAM_PARTITION, STREAM_TIMESTAMP,
};
pub use value::{Properties, Value};
