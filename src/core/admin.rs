//! What the admin API asks of the core: queue listings that cost per queue
//! only for the page asked for, a purge, and who is behind each
//! connection's session.
//!
//! A listing takes the routing table's read lock once to copy the names
//! (reference-counted, no allocation per name), and each queue's own lock
//! only for the queues on the page: 100,000 queues cost a name copy and
//! an O(n) selection each, never 100,000 statistics snapshots.

use std::collections::HashMap;
use std::sync::Arc;

use rosetta_neutral::BrokerError;
use rosetta_store::{Completion, Record};

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
        let mut names: Vec<Arc<str>> = {
            let routing = self.inner.routing.read();
            routing
                .queues()
                .map(|q| Arc::clone(&q.name))
                .filter(|n| name_contains.is_none_or(|part| n.contains(part)))
                .collect()
        };
        let total = names.len();
        let page = select_sorted(&mut names, skip, take);
        let routing = self.inner.routing.read();
        let queues: Vec<_> = page
            .iter()
            .filter_map(|n| routing.queue(n).cloned())
            .collect();
        drop(routing);
        QueuePage {
            total,
            items: queues
                .into_iter()
                .map(|q| (q.name.to_string(), q.stats()))
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
        let scheduled = st.schedule.take_all();
        drop(st);
        for entry in entries.iter().chain(&scheduled) {
            records.extend(queue.ack_record(entry));
            queue.release(entry);
            removed += 1;
        }
        for gone in paged {
            if gone.journaled {
                records.push(Record::Ack {
                    queue: queue.id,
                    seq: gone.seq,
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
        let sessions: Vec<_> = self
            .inner
            .sessions
            .lock()
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        sessions
            .into_iter()
            .map(|s| {
                (
                    s.info.conn_id,
                    SessionIdentity {
                        user: s.info.principal.user.clone(),
                        client_id: s.info.client_id.clone(),
                    },
                )
            })
            .collect()
    }
}

/// The elements `skip..skip + take` of `names` in sorted order, in O(n)
/// plus the page's sort: two selections instead of sorting everything.
fn select_sorted(names: &mut [Arc<str>], skip: usize, take: usize) -> Vec<Arc<str>> {
    if skip >= names.len() || take == 0 {
        return Vec::new();
    }
    let rest = if skip > 0 {
        names.select_nth_unstable(skip).2.len() + 1
    } else {
        names.len()
    };
    let start = names.len() - rest;
    let window = &mut names[start..];
    if take < window.len() {
        window.select_nth_unstable(take);
    }
    let end = take.min(window.len());
    let mut page = window[..end].to_vec();
    page.sort_unstable();
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<Arc<str>> {
        list.iter().map(|s| Arc::from(*s)).collect()
    }

    #[test]
    fn a_page_is_the_slice_of_the_sorted_names() {
        let all: Vec<String> = (0..257)
            .map(|i| format!("q{:03}", (i * 37) % 257))
            .collect();
        let mut sorted = all.clone();
        sorted.sort();
        for (skip, take) in [(0, 10), (10, 10), (250, 10), (257, 5), (0, 1000), (3, 0)] {
            let mut list: Vec<Arc<str>> = all.iter().map(|s| Arc::from(s.as_str())).collect();
            let page: Vec<String> = select_sorted(&mut list, skip, take)
                .iter()
                .map(|s| s.to_string())
                .collect();
            let want: Vec<String> = sorted.iter().skip(skip).take(take).cloned().collect();
            assert_eq!(page, want, "skip {skip} take {take}");
        }
        assert!(select_sorted(&mut names(&[]), 0, 10).is_empty());
        assert_eq!(select_sorted(&mut names(&["b", "a"]), 1, 10), names(&["b"]));
    }
}
