//! What the server's `$SYS/broker/...` publisher asks of the core: to
//! publish a retained message as the broker itself (no principal, so no
//! permission check; not counted as a client's publish), and how many
//! retained messages there are.

use rosetta_neutral::{Address, BrokerError, Message};

use crate::routing::Duplicates;
use crate::{Batch, Core};

impl Core {
    /// Makes `text` the retained message of `topic` and delivers it to the
    /// matching subscriptions now. Returns how many queues it reached.
    pub fn publish_retained_as_broker(
        &self,
        topic: &str,
        text: impl Into<String>,
    ) -> Result<usize, BrokerError> {
        let mut message = Message::text(text);
        message.retain = true;
        let mut batch = Batch::default();
        let routed = self.inner.route(
            &Address::Topic(topic.to_owned()),
            message,
            None,
            &mut batch,
            Duplicates::Ignore,
        )?;
        batch.commit(&self.inner, None);
        Ok(routed)
    }

    /// Topics with a retained message.
    pub fn retained_count(&self) -> usize {
        self.inner.retained.lock().len()
    }
}
