//! A queue's own settings: what a `[[queues]]` configuration entry (by
//! name or pattern) says about it, over the `[broker]` defaults.
//!
//! Resolved once, when the queue is created or recovered, and kept with the
//! queue; the dispatch code reads them under the queue lock.

/// Most message groups a queue remembers by default; past it, the group
/// idle the longest is forgotten (its next message is assigned afresh).
pub const GROUPS_MAX_DEFAULT: usize = 100_000;

/// One queue's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// Only one consumer receives at a time; the others stand by in attach
    /// order (Artemis `exclusive`, RabbitMQ single active consumer).
    pub exclusive: bool,
    /// Where this queue's rejected and too-often-redelivered messages go;
    /// `None` uses the broker's.
    pub dead_letter_address: Option<String>,
    /// Failed delivery attempts before a message is dead-lettered; `None`
    /// uses the broker's.
    pub delivery_attempts_max: Option<u32>,
    /// Most message groups the queue keeps assignments for.
    pub groups_max: usize,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            exclusive: false,
            dead_letter_address: None,
            delivery_attempts_max: None,
            groups_max: GROUPS_MAX_DEFAULT,
        }
    }
}
