//! The journal's live state as the store's docs define replay, built from
//! the records appended: what the journal simulation and the journal
//! property tests compare a recovered store against.

use std::collections::BTreeMap;

use bytes::Bytes;
use rosetta::store::{BindingDef, MessageSeq, QueueDef, QueueId, Record, RecoveredMessage};

/// Who holds a message: queue -> its latest delivery state (opaque to the
/// store), if it has one.
pub type Placements = BTreeMap<QueueId, Option<Bytes>>;

/// The committed state, by the replay rules in the store docs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalModel {
    pub queues: BTreeMap<QueueId, QueueDef>,
    pub bindings: BTreeMap<(QueueId, String), BindingDef>,
    pub messages: BTreeMap<MessageSeq, (Bytes, Placements)>,
    pub retained: BTreeMap<String, (MessageSeq, Bytes)>,
    pub state: BTreeMap<String, Bytes>,
}

impl JournalModel {
    /// Replays one record.
    pub fn apply(&mut self, r: &Record) {
        match r {
            Record::QueueDeclare(d) => {
                self.queues.insert(d.id, d.clone());
            }
            Record::QueueDelete { queue } => {
                self.queues.remove(queue);
                self.bindings.retain(|(q, _), _| q != queue);
                for (_, placements) in self.messages.values_mut() {
                    placements.remove(queue);
                }
                self.messages.retain(|_, (_, p)| !p.is_empty());
            }
            Record::Bind(b) => {
                self.bindings.insert((b.queue, b.filter.clone()), b.clone());
            }
            Record::Unbind { queue, filter } => {
                self.bindings.remove(&(*queue, filter.clone()));
            }
            Record::Message { seq, queues, body } => {
                if self.messages.contains_key(seq) || queues.is_empty() {
                    return;
                }
                let placements = queues.iter().map(|q| (*q, None)).collect();
                self.messages.insert(*seq, (body.to_bytes(), placements));
            }
            Record::Ack { queue, seq } => {
                if let Some((_, p)) = self.messages.get_mut(seq) {
                    p.remove(queue);
                    if p.is_empty() {
                        self.messages.remove(seq);
                    }
                }
            }
            Record::DeliveryState { queue, seq, state } => {
                if let Some(p) = self
                    .messages
                    .get_mut(seq)
                    .and_then(|(_, p)| p.get_mut(queue))
                {
                    *p = Some(state.clone());
                }
            }
            Record::Retain { topic, message } => match message {
                Some((seq, body)) => {
                    self.retained.insert(topic.clone(), (*seq, body.to_bytes()));
                }
                None => {
                    self.retained.remove(topic);
                }
            },
            Record::State { key, value } => match value {
                Some(v) => {
                    self.state.insert(key.clone(), v.clone());
                }
                None => {
                    self.state.remove(key);
                }
            },
        }
    }

    /// Replays records in order.
    pub fn apply_all(&mut self, records: &[Record]) {
        for r in records {
            self.apply(r);
        }
    }

    /// The state a recovered store holds (its messages read back).
    pub fn from_recovered(
        queues: &[QueueDef],
        bindings: &[BindingDef],
        messages: &[RecoveredMessage],
        retained: &[(String, MessageSeq, Bytes)],
        state: &[(String, Bytes)],
    ) -> JournalModel {
        JournalModel {
            queues: queues.iter().map(|q| (q.id, q.clone())).collect(),
            bindings: bindings
                .iter()
                .map(|b| ((b.queue, b.filter.clone()), b.clone()))
                .collect(),
            messages: messages
                .iter()
                .map(|m| {
                    let p = m
                        .queues
                        .iter()
                        .map(|p| (p.queue, p.state.clone()))
                        .collect();
                    (m.seq, (m.body.clone(), p))
                })
                .collect(),
            retained: retained
                .iter()
                .map(|(t, s, m)| (t.clone(), (*s, m.clone())))
                .collect(),
            state: state.iter().cloned().collect(),
        }
    }
}
