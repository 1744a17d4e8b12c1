//! What the admin API asks of the core about topics: retained messages
//! (list, clear one), the bindings that are subscriptions (list), and a
//! client's durable state (is it connected, forget it).
//!
//! Retained messages and client state are one map each behind a mutex; a
//! listing sorts the matching keys of the map, so it costs the map's size
//! (bounded by the topics and clients there are), not the queues'. The
//! subscription listing walks the queues in name order and takes each
//! queue's lock to read its bindings: it costs every queue once per
//! request, as the listing of bindings RabbitMQ serves does.

use std::sync::Arc;

use rosetta_neutral::{BindingOptions, BrokerError, Message, Protocol};
use rosetta_store::{Completion, Record};

use super::Core;

/// One page of a listing: the matching total and the page's items.
#[derive(Debug, Clone)]
pub struct Page<T> {
    /// Items that matched, on every page.
    pub total: usize,
    /// The page, in name order.
    pub items: Vec<T>,
}

/// A binding of a queue to a topic filter.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// The queue messages published to a matching topic go to.
    pub queue: String,
    /// The topic filter.
    pub filter: String,
    /// How it was made (maximum guarantee, no-local...).
    pub options: BindingOptions,
}

/// The page `skip..skip + take` of `names` (sorted here) with the total.
fn page_of<T>(mut items: Vec<(String, T)>, skip: usize, take: usize) -> Page<(String, T)> {
    items.sort_by(|a, b| a.0.cmp(&b.0));
    Page {
        total: items.len(),
        items: items.into_iter().skip(skip).take(take).collect(),
    }
}

impl Core {
    /// Retained messages whose topic contains `name_contains` (all when
    /// `None`), by topic, skipping `skip` and taking at most `take`.
    pub fn retained_page(
        &self,
        name_contains: Option<&str>,
        skip: usize,
        take: usize,
    ) -> Page<(String, Arc<Message>)> {
        let matching: Vec<(String, Arc<Message>)> = self
            .inner
            .retained
            .lock()
            .iter()
            .filter(|(topic, _)| name_contains.is_none_or(|part| topic.contains(part)))
            .map(|(topic, (_, message))| (topic.clone(), Arc::clone(message)))
            .collect();
        page_of(matching, skip, take)
    }

    /// Clears the retained message of `topic`, as an empty retained
    /// publish would; `done` runs once that is durable.
    pub fn delete_retained(&self, topic: &str, done: Completion) -> Result<(), BrokerError> {
        if self.inner.retained.lock().remove(topic).is_none() {
            return Err(BrokerError::NotFound(format!(
                "no retained message on '{topic}'"
            )));
        }
        let record = Record::Retain {
            topic: topic.to_owned(),
            message: None,
        };
        self.inner.journal.append(vec![record], Some(done));
        tracing::info!(topic, "retained message cleared");
        Ok(())
    }

    /// Subscriptions whose queue or filter contains `name_contains`, by
    /// queue and then filter, skipping `skip` and taking at most `take`.
    pub fn subscription_page(
        &self,
        name_contains: Option<&str>,
        skip: usize,
        take: usize,
    ) -> Page<Subscription> {
        let matches = |s: &str| name_contains.is_none_or(|part| s.contains(part));
        let mut total = 0;
        let mut items = Vec::with_capacity(take.min(1024));
        let routing = self.inner.routing.read();
        for name in routing.names_in_order() {
            let Some(queue) = routing.queue(name) else {
                continue;
            };
            let mut bindings: Vec<Subscription> = queue
                .state
                .lock()
                .bindings
                .iter()
                .filter(|b| matches(name) || matches(&b.filter))
                .map(|b| Subscription {
                    queue: name.to_string(),
                    filter: b.filter.clone(),
                    options: b.options.clone(),
                })
                .collect();
            bindings.sort_by(|a, b| a.filter.cmp(&b.filter));
            for binding in bindings {
                if total >= skip && items.len() < take {
                    items.push(binding);
                }
                total += 1;
            }
        }
        Page { total, items }
    }

    /// The topic filters bound to queue `name`; `None` if there is no such
    /// queue.
    pub fn queue_bindings(&self, name: &str) -> Option<Vec<Subscription>> {
        let routing = self.inner.routing.read();
        let queue = routing.queue(name)?;
        let st = queue.state.lock();
        Some(
            st.bindings
                .iter()
                .map(|b| Subscription {
                    queue: name.to_owned(),
                    filter: b.filter.clone(),
                    options: b.options.clone(),
                })
                .collect(),
        )
    }

    /// Whether a client of `protocol` with this client id is connected.
    pub fn client_connected(&self, protocol: Protocol, client_id: &str) -> bool {
        self.inner.clients.lock().get(protocol, client_id).is_some()
    }

    /// Forgets the durable state (`Session::put_state`) of the client of
    /// `protocol` with this client id, journaling its removal; returns how
    /// many keys it had. The client must not be connected (its session
    /// would write them again).
    pub fn forget_client_state(&self, protocol: Protocol, client_id: &str) -> usize {
        let prefix = format!("{}/{client_id}/", protocol.as_str());
        let records: Vec<Record> = {
            let mut state = self.inner.client_state.lock();
            let keys: Vec<String> = state
                .keys()
                .filter(|k| k.starts_with(&prefix))
                .cloned()
                .collect();
            keys.into_iter()
                .map(|key| {
                    state.remove(&key);
                    Record::State { key, value: None }
                })
                .collect()
        };
        let forgotten = records.len();
        if forgotten > 0 {
            self.inner.journal.append(records, None);
        }
        forgotten
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::Duplicates;
    use crate::Batch;
    use rosetta_neutral::Address;

    fn retain(core: &Core, topic: &str, body: &str) {
        let mut message = Message::text(body);
        message.retain = true;
        let mut batch = Batch::default();
        core.inner
            .route(
                &Address::Topic(topic.to_owned()),
                message,
                None,
                &mut batch,
                Duplicates::Ignore,
            )
            .expect("publish");
        batch.commit(&core.inner, None);
    }

    #[test]
    fn retained_messages_are_paged_by_topic_and_cleared_one_at_a_time() {
        let core = Core::in_memory();
        for t in ["b/2", "a/1", "c/3", "a/2"] {
            retain(&core, t, t);
        }
        let page = core.retained_page(None, 1, 2);
        let topics: Vec<&str> = page.items.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!((page.total, topics), (4, vec!["a/2", "b/2"]));
        assert_eq!(core.retained_page(Some("a/"), 0, 10).total, 2);
        core.delete_retained("a/1", Box::new(|_| {}))
            .expect("delete");
        assert!(matches!(
            core.delete_retained("a/1", Box::new(|_| {})),
            Err(BrokerError::NotFound(_))
        ));
        assert_eq!(core.retained_page(Some("a/"), 0, 10).total, 1);
    }

    #[test]
    fn client_state_is_forgotten_by_protocol_and_client_id() {
        let core = Core::in_memory();
        {
            let mut state = core.inner.client_state.lock();
            for key in [
                "mqtt/c1/subs",
                "mqtt/c1/qos2",
                "mqtt/c10/subs",
                "stomp/c1/x",
            ] {
                state.insert(key.to_owned(), bytes::Bytes::from_static(b"v"));
            }
        }
        assert_eq!(core.forget_client_state(Protocol::Mqtt, "c1"), 2);
        let mut left: Vec<String> = core.inner.client_state.lock().keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["mqtt/c10/subs", "stomp/c1/x"]);
        assert!(!core.client_connected(Protocol::Mqtt, "c1"));
    }
}
