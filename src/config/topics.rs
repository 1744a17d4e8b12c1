//! `[[topics]]`: settings of topic addresses, by MQTT topic filter in core
//! terms (`orders/#`, `sensors/+/alerts`; `/topic/orders/#` in STOMP and
//! AMQP is the same filter). For now a topic's only setting is duplicate
//! detection, so `dedup_window_s` is required:
//!
//! ```toml
//! [[topics]]
//! filter = "orders/#"
//! dedup_window_s = 300     # drop a retried send within 5 minutes
//! dedup = "id"             # or "content": a hash of the body
//! dedup_ids_max = 100000   # ids remembered; past it the oldest goes
//! ```
//!
//! A send to a matching topic whose dedup id the topic saw within the
//! window reaches no subscriber and is acknowledged as a success. Entries
//! are tried in file order and the first whose filter matches applies
//! (unlike `[[queues]]`, they do not merge): put narrow filters first.

use std::collections::HashMap;

use rosetta_core::{TopicDedupRule, DEDUP_IDS_MAX_DEFAULT};
use serde::Deserialize;

use super::broker::deserialize_filter;
use super::{invalid, within, Config, DedupSetting, Invalid};
use super::{QUEUE_DEDUP_IDS_MAX_LIMIT, QUEUE_DEDUP_WINDOW_S_LIMIT};

/// Most `[[topics]]` entries: a producer's send to a topic is matched
/// against each in turn, so this bounds that to about a thousand short
/// filter comparisons.
pub const TOPIC_ENTRIES_MAX: usize = 1_000;

/// One `[[topics]]` entry as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicEntry {
    /// The topics it applies to: an MQTT topic filter in core terms.
    #[serde(deserialize_with = "deserialize_filter")]
    pub filter: String,
    /// Duplicate detection window in seconds (1 s to a week).
    pub dedup_window_s: Option<u64>,
    /// What the window compares: `"id"` (the default) or `"content"`.
    pub dedup: Option<DedupSetting>,
    /// Most dedup ids remembered (> 0); past it the oldest is forgotten
    /// before its window passes.
    pub dedup_ids_max: Option<u64>,
}

impl TopicEntry {
    /// The entry's duplicate detection in core terms, when it has a
    /// window. Call on a validated configuration.
    pub fn to_dedup_rule(&self) -> Option<TopicDedupRule> {
        Some(TopicDedupRule {
            filter: self.filter.clone(),
            window_s: self.dedup_window_s?,
            mode: self.dedup.map(Into::into).unwrap_or_default(),
            ids_max: self.dedup_ids_max.map_or(DEDUP_IDS_MAX_DEFAULT, |max| {
                usize::try_from(max).unwrap_or(usize::MAX)
            }),
        })
    }
}

impl Config {
    pub(crate) fn check_topics(&self) -> Result<(), Invalid> {
        if self.topics.len() > TOPIC_ENTRIES_MAX {
            return Err(invalid(
                format!("topics[{TOPIC_ENTRIES_MAX}]"),
                format!("at most {TOPIC_ENTRIES_MAX} `[[topics]]` entries"),
            ));
        }
        let mut seen: HashMap<&str, usize> = HashMap::with_capacity(self.topics.len());
        for (i, t) in self.topics.iter().enumerate() {
            let at = |key: &str| format!("topics[{i}].{key}");
            if let Some(j) = seen.insert(&t.filter, i) {
                return Err(invalid(
                    at("filter"),
                    format!("`{}` is already configured by `topics[{j}]`", t.filter),
                ));
            }
            let Some(window) = t.dedup_window_s else {
                return Err(invalid(
                    at("dedup_window_s"),
                    "is required: duplicate detection is a topic's only setting so far",
                ));
            };
            within(&at("dedup_window_s"), window, 1, QUEUE_DEDUP_WINDOW_S_LIMIT)?;
            if let Some(max) = t.dedup_ids_max {
                within(&at("dedup_ids_max"), max, 1, QUEUE_DEDUP_IDS_MAX_LIMIT)?;
            }
        }
        Ok(())
    }

    /// The `[[topics]]` dedup windows in core terms, in file order.
    pub fn topic_dedup_rules(&self) -> Vec<TopicDedupRule> {
        self.topics
            .iter()
            .filter_map(TopicEntry::to_dedup_rule)
            .collect()
    }
}
