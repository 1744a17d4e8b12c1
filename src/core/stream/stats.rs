//! Streams as an operator sees them (the admin API's `/api/v1/streams`
//! and `/metrics`): each log's offsets, size and readers, and every
//! consumer group's committed offset and lag.
//!
//! A group's lag is what it has not yet committed of what the log holds:
//! `next_offset - max(committed, first_offset)`. A group committed below
//! the first kept offset lost what retention cut; that is not lag, since
//! no reader can be sent it any more.

use std::sync::Arc;

use rosetta_neutral::BrokerError;

use super::{Stream, Streams};

/// One consumer group of one stream log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamGroupStats {
    /// The group's name (STOMP `x-stream-group`, AMQP
    /// `<container-id>/<link-name>`, MQTT `$share/<group>/...` or
    /// `mqtt/<client-id>/<filter>`).
    pub name: String,
    /// The offset its next reader starts from: everything below it was
    /// acknowledged.
    pub committed_offset: u64,
    /// Records in the log at or past the committed offset.
    pub lag: u64,
}

/// One stream log: a plain stream, or one partition of a partitioned one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStats {
    /// The log's name (a partition's is `<stream>-<n>`).
    pub name: String,
    /// The partitioned stream this log is a partition of.
    pub partition_of: Option<String>,
    /// The oldest offset kept.
    pub first_offset: u64,
    /// The offset the next append gets.
    pub next_offset: u64,
    /// Records kept: `next_offset - first_offset`.
    pub messages: u64,
    /// Bytes of its segment files.
    pub bytes: u64,
    /// Segment files.
    pub segments: u64,
    /// Readers attached now.
    pub readers: usize,
    /// Records appended since the broker opened the log.
    pub appended_since_open: u64,
    /// Segments retention deleted since the broker opened the log.
    pub segments_deleted_since_open: u64,
    /// Its consumer groups, by name.
    pub groups: Vec<StreamGroupStats>,
}

/// What the figures of a batch of logs share, taken once per batch (a
/// page, a scrape): with 10,000 streams, taking them per log would cost a
/// scrape 10,000 squared string comparisons.
struct Snapshot {
    /// Every log's name, sorted.
    names: Vec<String>,
    /// Every group's journal key (`$stream/<stream>/<group>`) and
    /// committed offset, sorted by key.
    groups: Vec<(String, u64)>,
}

/// The entries of sorted `items` whose key starts with `prefix`.
fn with_prefix<'a, T>(
    items: &'a [T],
    key: impl Fn(&T) -> &str + Copy + 'a,
    prefix: &'a str,
) -> impl Iterator<Item = &'a T> + 'a {
    let start = items.partition_point(|i| key(i) < prefix);
    items[start..]
        .iter()
        .take_while(move |i| key(i).starts_with(prefix))
}

impl Streams {
    /// Every stream log's name, sorted: the open ones and those whose
    /// directory was there at start.
    pub(crate) fn log_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.open.lock().keys().cloned().collect();
        names.extend(self.known.iter().cloned());
        names.sort_unstable();
        names.dedup();
        names
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            names: self.log_names(),
            groups: self.groups.all_sorted(),
        }
    }

    /// The figures of the log `name`, opening it if it exists on disk but
    /// is not open yet; `None` when there is no such log. A name a
    /// `[[streams]]` pattern matches but nobody has used is not created.
    pub(crate) fn log_stats(&self, name: &str) -> Result<Option<StreamStats>, BrokerError> {
        Ok(self
            .logs_stats(&[name.to_owned()])?
            .into_iter()
            .next()
            .flatten())
    }

    /// [`Self::log_stats`] of each of `names`, in order.
    pub(crate) fn logs_stats(
        &self,
        names: &[String],
    ) -> Result<Vec<Option<StreamStats>>, BrokerError> {
        let snap = self.snapshot();
        names
            .iter()
            .map(|name| Ok(self.existing_log(name)?.map(|s| self.stats_of(&s, &snap))))
            .collect()
    }

    /// The logs whose name contains `name_contains` (all when `None`), in
    /// name order: how many, and the figures of those from `skip`, at most
    /// `take` (each opened if it is on disk and was not yet).
    pub(crate) fn log_page(
        &self,
        name_contains: Option<&str>,
        skip: usize,
        take: usize,
    ) -> Result<(usize, Vec<StreamStats>), BrokerError> {
        let snap = self.snapshot();
        let matching: Vec<&String> = snap
            .names
            .iter()
            .filter(|n| name_contains.is_none_or(|part| n.contains(part)))
            .collect();
        let mut items = Vec::with_capacity(take.min(matching.len()));
        for name in matching.iter().skip(skip).take(take) {
            items.extend(self.existing_log(name)?.map(|s| self.stats_of(&s, &snap)));
        }
        Ok((matching.len(), items))
    }

    /// The log `name` if it exists: open, or on disk (then opened). Not
    /// one a `[[streams]]` rule would make at its first use.
    fn existing_log(&self, name: &str) -> Result<Option<Arc<Stream>>, BrokerError> {
        if self.known.contains(name) {
            self.get(name, false)
        } else {
            Ok(self.open.lock().get(name).cloned())
        }
    }

    /// The figures of every open log (a metrics scrape opens nothing).
    pub(crate) fn open_log_stats(&self) -> Vec<StreamStats> {
        let mut open: Vec<Arc<Stream>> = self.open.lock().values().cloned().collect();
        open.sort_by(|a, b| a.name.cmp(&b.name));
        let snap = self.snapshot();
        open.iter().map(|s| self.stats_of(s, &snap)).collect()
    }

    /// The names of the logs of the partitioned stream `name`, in
    /// partition order: one opened, one a rule names exactly, or one a
    /// pattern rule matches whose logs exist; `None` otherwise (a pattern
    /// matches names nobody used, which are no streams yet).
    pub(crate) fn partition_names(&self, name: &str) -> Option<Vec<String>> {
        if let Some(p) = self.partitioned.lock().get(name) {
            return Some(p.parts.iter().map(|s| s.name.to_string()).collect());
        }
        if self.partition_rule(name).is_some() {
            return None;
        }
        let rule = self.rule_for(name).filter(|r| r.partitions > 1)?;
        let names: Vec<String> = (0..rule.partitions)
            .map(|n| super::partition::partition_name(name, n))
            .collect();
        let named = rule.pattern == name;
        let used = || {
            let open = self.open.lock();
            names
                .iter()
                .any(|n| open.contains_key(n) || self.known.contains(n))
        };
        (named || used()).then_some(names)
    }

    fn stats_of(&self, stream: &Stream, snap: &Snapshot) -> StreamStats {
        let bounds = stream.log.bounds();
        let log = stream.log.stats();
        let readers = stream
            .readers
            .lock()
            .iter()
            .filter(|r| r.strong_count() > 0)
            .count();
        // A key is `$stream/<stream>/<group>` and both may hold `/`:
        // the groups of a longer stream name `<name>/<x>` share this one's
        // key prefix, and are not this log's.
        let nested_prefix = format!("{}/", stream.name);
        let nested: Vec<String> = with_prefix(&snap.names, String::as_str, &nested_prefix)
            .map(|other| format!("{}/", &other[nested_prefix.len()..]))
            .collect();
        let key_prefix = super::groups::key(&stream.name, "");
        let groups = with_prefix(&snap.groups, |(k, _)| k.as_str(), &key_prefix)
            .map(|(k, offset)| (&k[key_prefix.len()..], *offset))
            .filter(|(g, _)| !g.is_empty() && !nested.iter().any(|x| g.starts_with(x.as_str())))
            .map(|(name, committed_offset)| StreamGroupStats {
                name: name.to_owned(),
                committed_offset,
                lag: bounds
                    .next
                    .saturating_sub(committed_offset.max(bounds.first)),
            })
            .collect();
        StreamStats {
            name: stream.name.to_string(),
            partition_of: self
                .partition_rule(&stream.name)
                .and_then(|_| stream.name.rsplit_once('-'))
                .map(|(parent, _)| parent.to_owned()),
            first_offset: bounds.first,
            next_offset: bounds.next,
            messages: bounds.next.saturating_sub(bounds.first),
            bytes: log.bytes,
            segments: log.segments,
            readers,
            appended_since_open: log.records,
            segments_deleted_since_open: log.segments_deleted,
            groups,
        }
    }
}
