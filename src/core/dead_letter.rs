//! What a dead letter carries: why it was dead-lettered, after how many
//! attempts, and where from.
//!
//! The core writes these as ordinary message properties, under the names
//! the issue asks for on every protocol: `x-opt-dead-letter-reason` and
//! `x-opt-delivery-count`, beside `x-original-queue` (the queue it left).
//! STOMP consumers see them as headers and MQTT 5 consumers as user
//! properties, as any property. The AMQP adapter writes properties named
//! `x-opt-*` into the message-annotations section instead of
//! application-properties (see `rosetta-amqp`'s `message` module): the
//! AMQP specification reserves the `x-opt-` prefix for annotations, and
//! Artemis, Azure Service Bus and Qpid put broker-added facts there.
//!
//! The neutral message has no annotations field of its own: the journaled
//! message codec stays as it is, and a property is what the two
//! string-only protocols can show anyway. The values are set, not pushed,
//! so a message dead-lettered twice (out of a dead-letter queue with a
//! dead-letter address of its own) carries the latest reason once.
//!
//! Expired messages are not dead letters here: they go to `[broker]
//! expiry_address`, unannotated.

use std::sync::Arc;

use rosetta_neutral::{Message, Value};

use super::queue::{Entry, Queue};

/// Property (AMQP message annotation) naming why a message was
/// dead-lettered: a [`DeadLetterReason`].
pub const DEAD_LETTER_REASON_PROPERTY: &str = "x-opt-dead-letter-reason";
/// Property (AMQP message annotation, a `uint`) with the delivery attempts
/// the message had, the one that ended it included: `delivery_attempts_max`
/// after too many attempts, the failed attempts before it plus one after a
/// reject.
pub const DELIVERY_COUNT_PROPERTY: &str = "x-opt-delivery-count";
/// Property with the name of the queue the message was dead-lettered from.
pub const ORIGINAL_QUEUE_PROPERTY: &str = "x-original-queue";
/// The failed attempts, as text, under the name the broker used before the
/// `x-opt-` names (kept, with its old meaning, for consumers that read it).
const DELIVERY_COUNT_LEGACY_PROPERTY: &str = "x-delivery-count";

/// Why a message went to the dead-letter address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// It failed `delivery_attempts_max` delivery attempts (NACKs, AMQP
    /// modified with delivery-failed, consumers gone with it unsettled).
    DeliveryAttempts,
    /// A consumer refused it outright: AMQP `rejected`, an MQTT 5 PUBACK or
    /// PUBREC with an error reason code, or a delivery no MQTT client can
    /// receive.
    Rejected,
}

impl DeadLetterReason {
    /// The value of [`DEAD_LETTER_REASON_PROPERTY`].
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::DeliveryAttempts => "delivery-attempts",
            DeadLetterReason::Rejected => "rejected",
        }
    }
}

/// A message on its way to the dead-letter address, taken out of its
/// queue under the queue's lock and routed after it.
pub(crate) struct DeadLetter {
    pub(crate) entry: Entry,
    pub(crate) from: Arc<Queue>,
    pub(crate) reason: DeadLetterReason,
}

/// Marks `message` as dead-lettered from `queue` for `reason`, its entry
/// having counted `failed` failed attempts.
pub(crate) fn annotate(message: &mut Message, queue: &str, reason: DeadLetterReason, failed: u32) {
    // The attempt that ended in a reject was not counted as failed.
    let attempts = match reason {
        DeadLetterReason::DeliveryAttempts => failed,
        DeadLetterReason::Rejected => failed.saturating_add(1),
    };
    let props = &mut message.properties;
    props.set(ORIGINAL_QUEUE_PROPERTY, queue);
    props.set(DEAD_LETTER_REASON_PROPERTY, reason.as_str());
    props.set(DELIVERY_COUNT_PROPERTY, Value::UInt(attempts));
    props.set(DELIVERY_COUNT_LEGACY_PROPERTY, failed.to_string());
}
