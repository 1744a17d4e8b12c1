//! What the admin API and `/metrics` ask of the core about streams: a page
//! of stream logs with their figures, one log or one partitioned stream's
//! logs, and every open log for a scrape.
//!
//! A page opens the logs on it that exist on disk but were not opened
//! since the start (a restart opens a stream at its first use), so it
//! costs per log only for the page asked for; a scrape opens nothing.

use rosetta_neutral::BrokerError;

use super::admin_topics::Page;
use super::stream::StreamStats;
use super::Core;

impl Core {
    /// Stream logs whose name contains `name_contains` (all when `None`),
    /// in name order, skipping `skip` and taking at most `take`, each with
    /// its figures. A partitioned stream is its logs, `<name>-<n>`.
    pub fn stream_page(
        &self,
        name_contains: Option<&str>,
        skip: usize,
        take: usize,
    ) -> Result<Page<StreamStats>, BrokerError> {
        let (total, items) = self.inner.streams.log_page(name_contains, skip, take)?;
        Ok(Page { total, items })
    }

    /// The figures of the stream log `name` (`None`: no such log).
    pub fn stream_stats(&self, name: &str) -> Result<Option<StreamStats>, BrokerError> {
        self.inner.streams.log_stats(name)
    }

    /// The logs of the partitioned stream `name`, in partition order, each
    /// `None` until first used; `None` when `name` is not a partitioned
    /// stream.
    pub fn stream_partitions(
        &self,
        name: &str,
    ) -> Result<Option<Vec<Option<StreamStats>>>, BrokerError> {
        let Some(parts) = self.inner.streams.partition_names(name) else {
            return Ok(None);
        };
        self.inner.streams.logs_stats(&parts).map(Some)
    }

    /// The figures of every open stream log, by name (for `/metrics`: a
    /// log not used since the start is not opened for a scrape).
    pub fn open_stream_stats(&self) -> Vec<StreamStats> {
        self.inner.streams.open_log_stats()
    }
}
