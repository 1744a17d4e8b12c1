//! What the admin API does with a queue's messages: look at the first ones
//! without taking them (peek), and move waiting ones to another queue, or
//! back to the queue each was dead-lettered from (replay).
//!
//! ## A move is one journal append
//! Each moved message gets a new sequence and a `Message` record on the
//! target; its original gets an `Ack` on the source. Both go into one
//! batch, which the journal appends as one atomic unit
//! ([`rosetta_store::Store::append`]): after a crash the journal holds
//! either both (moved) or neither (still on the source), never the message
//! twice or not at all. The copy becomes visible on the target only after
//! the append is handed to the journal (the batch's rule), and `done` runs
//! once it is durable. A message the target refuses (full, gone, an
//! internal name that is not auto-created) goes back to the source where
//! it was and is counted as `left`.
//!
//! ## What is looked at
//! Messages waiting in memory, in arrival (sequence) order, as a browser
//! sees them. Messages paged to disk are not read back (peek reports how
//! many there are), and messages reserved for a message group's consumer,
//! in flight or scheduled are not moved: they are with, or promised to, a
//! consumer.

use std::sync::Arc;

use rosetta_neutral::{Address, BrokerError, Message};
use rosetta_store::{Completion, MessageSeq};

use super::backlog::Place;
use super::queue::{Entry, Queue};
use super::routing::Duplicates;
use super::{Batch, Core, Inner, ORIGINAL_QUEUE_PROPERTY};

/// One message seen by a peek.
#[derive(Debug, Clone)]
pub struct PeekedMessage {
    /// Its sequence number in the journal (its id within the queue).
    pub seq: MessageSeq,
    /// The message.
    pub message: Arc<Message>,
    /// Failed delivery attempts so far.
    pub delivery_count: u32,
    /// It was delivered before and came back.
    pub redelivered: bool,
}

/// What a peek saw.
#[derive(Debug, Clone, Default)]
pub struct Peeked {
    /// The first waiting messages in memory, in arrival order.
    pub messages: Vec<PeekedMessage>,
    /// Messages waiting on disk, not looked at.
    pub paged: u64,
}

/// Where a move sends each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveTarget<'a> {
    /// Every message to this queue.
    Queue(&'a str),
    /// Each message to the queue it was dead-lettered from (its
    /// [`ORIGINAL_QUEUE_PROPERTY`]); messages without one stay.
    OriginalQueue,
}

/// What a move did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Moved {
    /// Messages now on their target (durably, once `done` ran).
    pub moved: u64,
    /// Messages looked at that stayed: no original queue to replay to, or
    /// the target refused them.
    pub left: u64,
}

impl Core {
    /// The first `max` messages waiting in memory on queue `name`, in
    /// arrival order, without taking them.
    pub fn peek_queue(&self, name: &str, max: usize) -> Result<Peeked, BrokerError> {
        let queue = self.inner.queue_named(name)?;
        let st = queue.state.lock();
        let mut messages = Vec::with_capacity(max.min(1024));
        let mut next = 0;
        while messages.len() < max {
            let Some(entry) = st.backlog.first_from(next) else {
                break;
            };
            next = entry.seq.saturating_add(1);
            messages.push(PeekedMessage {
                seq: entry.seq,
                message: Arc::clone(&entry.message),
                delivery_count: entry.delivery_count,
                redelivered: entry.redelivered,
            });
        }
        Ok(Peeked {
            messages,
            paged: st.backlog.paged_len() as u64,
        })
    }

    /// Moves up to `max` waiting messages of queue `from` to `to`, in
    /// arrival order (see the module docs for what waits and for the
    /// order of writes); `done` runs once the move is durable.
    pub fn move_messages(
        &self,
        from: &str,
        to: MoveTarget<'_>,
        max: usize,
        done: Completion,
    ) -> Result<Moved, BrokerError> {
        let source = self.inner.queue_named(from)?;
        if let MoveTarget::Queue(target) = to {
            if target == from {
                return Err(BrokerError::InvalidAddress(format!(
                    "cannot move queue '{from}' onto itself"
                )));
            }
            self.inner.queue_named(target)?;
        }
        let (taken, mut left) = take_waiting(&source, to, max);
        let mut batch = Batch::default();
        let mut refused = Vec::new();
        let mut moved = 0;
        for (entry, target) in taken {
            let mut message = (*entry.message).clone();
            message.address = None;
            let address = Address::Queue(target);
            match self
                .inner
                .route(&address, message, None, &mut batch, Duplicates::Ignore)
            {
                Ok(_) => {
                    batch.records.extend(source.ack_record(&entry));
                    source.release(&entry);
                    moved += 1;
                }
                Err(e) => {
                    tracing::warn!(queue = %from, to = %address, error = %e, seq = entry.seq, "a message cannot be moved; it stays");
                    refused.push(entry);
                }
            }
        }
        left += refused.len() as u64;
        batch.commit(&self.inner, Some(done));
        self.inner.return_waiting(&source, refused);
        tracing::info!(queue = %from, ?to, moved, left, "messages moved");
        Ok(Moved { moved, left })
    }
}

/// Takes up to `max` messages waiting in memory (not reserved) out of
/// `queue`, each with its target queue's name; returns them and how many
/// were looked at and stay (no original queue).
fn take_waiting(queue: &Queue, to: MoveTarget<'_>, max: usize) -> (Vec<(Entry, String)>, u64) {
    let mut st = queue.state.lock();
    let mut chosen = Vec::new();
    let mut left = 0u64;
    let mut next = 0;
    while chosen.len() < max {
        let Some(entry) = st.backlog.first_from(next) else {
            break;
        };
        next = entry.seq.saturating_add(1);
        let target = match to {
            MoveTarget::Queue(name) => Some(name.to_owned()),
            MoveTarget::OriginalQueue => entry
                .message
                .properties
                .get(ORIGINAL_QUEUE_PROPERTY)
                .and_then(|v| v.as_str())
                .map(str::to_owned),
        };
        match target {
            Some(target) => chosen.push((Place::of(entry), target)),
            None => left += 1,
        }
    }
    let mut taken = Vec::with_capacity(chosen.len());
    for (place, target) in chosen {
        // Reserved for a group's consumer: not in the shared part, stays.
        if let Some(entry) = st.backlog.remove(place) {
            st.forget_place(place);
            taken.push((entry, target));
        }
    }
    (taken, left)
}

impl Inner {
    /// Queue `name`, or `NotFound`.
    pub(crate) fn queue_named(&self, name: &str) -> Result<Arc<Queue>, BrokerError> {
        self.routing
            .read()
            .queue(name)
            .cloned()
            .ok_or_else(|| BrokerError::NotFound(format!("queue '{name}'")))
    }

    /// Puts messages taken out of `queue` (and still counted) back where
    /// they were, and dispatches them.
    fn return_waiting(&self, queue: &Queue, entries: Vec<Entry>) {
        if entries.is_empty() {
            return;
        }
        let mut st = queue.state.lock();
        for entry in entries {
            st.backlog.put_back(entry);
        }
        let out = queue.dispatch_locked(&mut st, self.now_ms());
        drop(st);
        self.after_dispatch(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rosetta_neutral::Message;

    /// Sends as a producer would, without a session.
    fn send(core: &Core, queue: &str, message: Message) {
        let mut batch = Batch::default();
        core.inner
            .route(
                &Address::Queue(queue.to_owned()),
                message,
                None,
                &mut batch,
                Duplicates::Detect,
            )
            .expect("send");
        batch.commit(&core.inner, None);
    }

    fn core_with(queue: &str, bodies: &[&str]) -> Core {
        let core = Core::in_memory();
        core.create_queue(queue, true, Box::new(|_| {}))
            .expect("create");
        for body in bodies {
            send(&core, queue, Message::text(*body));
        }
        core
    }

    fn texts(core: &Core, queue: &str) -> Vec<String> {
        core.peek_queue(queue, 100)
            .expect("peek")
            .messages
            .iter()
            .map(|m| String::from_utf8_lossy(&m.message.body.bytes).into_owned())
            .collect()
    }

    #[test]
    fn peek_sees_the_first_messages_and_takes_none() {
        let core = core_with("q", &["a", "b", "c"]);
        let peeked = core.peek_queue("q", 2).expect("peek");
        let bodies: Vec<String> = peeked
            .messages
            .iter()
            .map(|m| String::from_utf8_lossy(&m.message.body.bytes).into_owned())
            .collect();
        assert_eq!(bodies, ["a", "b"]);
        assert_eq!(core.queue_stats("q").expect("q").depth, 3);
        assert!(matches!(
            core.peek_queue("nosuch", 1),
            Err(BrokerError::NotFound(_))
        ));
    }

    #[test]
    fn a_move_takes_the_first_messages_to_the_target_in_order() {
        let core = core_with("a", &["1", "2", "3"]);
        core.create_queue("b", true, Box::new(|_| {}))
            .expect("create");
        let moved = core
            .move_messages("a", MoveTarget::Queue("b"), 2, Box::new(|_| {}))
            .expect("move");
        assert_eq!(moved, Moved { moved: 2, left: 0 });
        assert_eq!(texts(&core, "a"), ["3"]);
        assert_eq!(texts(&core, "b"), ["1", "2"]);
        assert!(matches!(
            core.move_messages("a", MoveTarget::Queue("a"), 1, Box::new(|_| {})),
            Err(BrokerError::InvalidAddress(_))
        ));
        assert!(matches!(
            core.move_messages("a", MoveTarget::Queue("nosuch"), 1, Box::new(|_| {})),
            Err(BrokerError::NotFound(_))
        ));
        assert_eq!(texts(&core, "a"), ["3"], "a refused move takes nothing");
    }

    #[test]
    fn a_replay_sends_each_message_to_its_original_queue_and_keeps_the_rest() {
        let core = Core::in_memory();
        for q in ["dlq", "orders", "invoices"] {
            core.create_queue(q, true, Box::new(|_| {}))
                .expect("create");
        }
        for (body, original) in [("o", Some("orders")), ("x", None), ("i", Some("invoices"))] {
            let mut m = Message::text(body);
            if let Some(original) = original {
                m.properties.set(ORIGINAL_QUEUE_PROPERTY, original);
            }
            send(&core, "dlq", m);
        }
        let moved = core
            .move_messages("dlq", MoveTarget::OriginalQueue, 10, Box::new(|_| {}))
            .expect("replay");
        assert_eq!(moved, Moved { moved: 2, left: 1 });
        assert_eq!(texts(&core, "dlq"), ["x"]);
        assert_eq!(texts(&core, "orders"), ["o"]);
        assert_eq!(texts(&core, "invoices"), ["i"]);
    }

    #[test]
    fn a_target_that_refuses_leaves_the_message_on_the_source() {
        let core = Core::in_memory();
        core.create_queue("dlq", true, Box::new(|_| {}))
            .expect("create");
        let mut m = Message::text("gone");
        // An internal name is never created on send, and this one is gone.
        m.properties.set(ORIGINAL_QUEUE_PROPERTY, "$mqtt/gone");
        send(&core, "dlq", m);
        let moved = core
            .move_messages("dlq", MoveTarget::OriginalQueue, 10, Box::new(|_| {}))
            .expect("replay");
        assert_eq!(moved, Moved { moved: 0, left: 1 });
        assert_eq!(texts(&core, "dlq"), ["gone"]);
    }
}
