//! What the admin API asks of the core: queue listings that cost per queue
//! only for the page asked for, a purge, and who is behind each
//! connection's session.
//!
//! A listing walks the routing table's ordered names under its read lock
//! (up to the page's end when unfiltered; every name when filtered, for
//! the total) and takes each queue's own lock only for the queues on the
//! page: 100,000 queues never cost 100,000 statistics snapshots.

use rosetta_neutral::BrokerError;
use rosetta_store::{Completion, Record};
use std::collections::HashMap;

use super::{Core, QueueStats};

/// One page of queues, by name.
#[derive(Debug, Clone, Default)]
pub struct QueuePage {
    /// Queues whose name matched, on every page.
    pub total: usize,
    /// The page's queues, in name order, with their statistics.
    pub items: Vec<(String, QueueStats)>,
}

/// Who a connection's session is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionIdentity {
    /// The authenticated user; `None` for an anonymous client.
    pub user: Option<String>,
    /// The protocol client id, when the client gave one.
    pub client_id: Option<String>,
}

/// What a purge removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Purged {
    /// Messages removed: ready ones, paged and scheduled ones included.
    pub removed: u64,
}

impl Core {
    /// Number of queues (no per-queue work).
    pub fn queue_count(&self) -> usize {
        self.inner.routing.read().queue_count()
    }

    /// Queues whose name contains `name_contains` (all when `None`), in
    /// name order, skipping `skip` and taking at most `take`.
    pub fn queue_page(&self, name_contains: Option<&str>, skip: usize, take: usize) -> QueuePage {
        let mut total = 0;
        let mut page = Vec::with_capacity(take.min(1024));
        {
            let routing = self.inner.routing.read();
            for name in routing.names_in_order() {
                if name_contains.is_some_and(|part| !name.contains(part)) {
                    continue;
                }
                if total >= skip && page.len() < take {
                    page.extend(routing.queue(name).cloned());
                } else if name_contains.is_none() && page.len() == take {
                    // Unfiltered, the total is the count: no need to walk on.
                    total = routing.queue_count();
                    break;
                }
                total += 1;
            }
        }
        let now_ms = self.inner.now_ms();
        QueuePage {
            total,
            items: page
                .into_iter()
                .map(|q| (q.name.to_string(), q.stats(now_ms)))
                .collect(),
        }
    }

    /// Creates a permanent queue `name` (an operator's, owned by no
    /// session); `done` runs once its declaration is durable. Returns
    /// whether it existed already (then nothing changes; compare
    /// [`Core::queue_durable`] for its settings).
    pub fn create_queue(
        &self,
        name: &str,
        durable: bool,
        done: Completion,
    ) -> Result<bool, BrokerError> {
        let spec = rosetta_neutral::QueueSpec {
            name: Some(name.to_owned()),
            durable,
            lifetime: rosetta_neutral::QueueLifetime::Permanent,
            bindings_max: None,
        };
        let mut batch = super::Batch::default();
        let (_, existed) = self.inner.declare(spec, None, &mut batch)?;
        batch.commit(&self.inner, Some(done));
        Ok(existed)
    }

    /// Deletes queue `name` with its messages, in flight ones included;
    /// its consumers are told the queue is gone.
    pub fn delete_queue(&self, name: &str) -> Result<(), BrokerError> {
        self.inner.delete_queue(name)
    }

    /// Whether queue `name` is durable; `None` if there is no such queue.
    pub fn queue_durable(&self, name: &str) -> Option<bool> {
        self.inner.routing.read().queue(name).map(|q| q.durable)
    }

    /// Removes every waiting message of queue `name` (ready, paged,
    /// reserved for a message group's consumer, scheduled), acknowledging
    /// the journaled ones in one append; `done` runs once that append is
    /// durable (at once when there was nothing to acknowledge). Messages in
    /// flight stay with their consumers: they are settled, or come back
    /// to the queue, as usual.
    pub fn purge_queue(&self, name: &str, done: Completion) -> Result<Purged, BrokerError> {
        let queue = self
            .inner
            .routing
            .read()
            .queue(name)
            .cloned()
            .ok_or_else(|| BrokerError::NotFound(format!("queue '{name}'")))?;
        let mut records = Vec::new();
        let mut removed = 0u64;
        let mut st = queue.state.lock();
        let (entries, paged) = st.backlog.take_waiting(queue.memory());
        crate::queue::end_group_delays(&mut st);
        let (scheduled, scheduled_on_disk) = st.schedule.take_all(queue.memory());
        drop(st);
        let paged = paged
            .into_iter()
            .map(|gone| (gone.seq, gone.journaled))
            .chain(scheduled_on_disk);
        for entry in entries.iter().chain(&scheduled) {
            records.extend(queue.ack_record(entry));
            queue.release(entry);
            removed += 1;
        }
        for (seq, journaled) in paged {
            if journaled {
                records.push(Record::Ack {
                    queue: queue.id,
                    seq,
                });
            }
            removed += 1;
        }
        tracing::info!(queue = %name, removed, "queue purged");
        if records.is_empty() {
            done(Ok(()));
        } else {
            self.inner.journal.append(records, Some(done));
        }
        Ok(Purged { removed })
    }

    /// The user and client id of each open session, by connection id.
    pub fn session_identities(&self) -> HashMap<u64, SessionIdentity> {
        let sessions: Vec<_> = self.inner.sessions.lock().iter().cloned().collect();
        sessions
            .into_iter()
            .map(|s| {
                (
                    s.info.conn_id,
                    SessionIdentity {
                        user: s.info.principal.user.as_deref().map(str::to_owned),
                        client_id: s.info.client_id.as_deref().map(str::to_owned),
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_the_slice_of_the_names_in_order() {
        let core = Core::in_memory();
        let mut names: Vec<String> = (0..257)
            .map(|i| format!("q{:03}", (i * 37) % 257))
            .collect();
        for n in &names {
            core.create_queue(n, false, Box::new(|_| {}))
                .expect("create");
        }
        core.delete_queue("q100").expect("delete");
        names.retain(|n| n != "q100");
        names.sort();
        for (filter, skip, take) in [
            (None, 0, 10),
            (None, 10, 10),
            (None, 250, 10),
            (None, 256, 5),
            (None, 0, 1000),
            (None, 3, 0),
            (Some("q1"), 5, 20),
            (Some("q25"), 0, 3),
            (Some("none"), 0, 3),
        ] {
            let want: Vec<&String> = names
                .iter()
                .filter(|n| filter.is_none_or(|f| n.contains(f)))
                .collect();
            let page = core.queue_page(filter, skip, take);
            let got: Vec<&str> = page.items.iter().map(|(n, _)| n.as_str()).collect();
            let expected: Vec<&str> = want
                .iter()
                .skip(skip)
                .take(take)
                .map(|s| s.as_str())
                .collect();
            assert_eq!(got, expected, "{filter:?} skip {skip} take {take}");
            assert_eq!(page.total, want.len(), "{filter:?} skip {skip} take {take}");
        }
    }
}
