//! `[[queues]]`: per-queue settings, for one queue by `name` or for every
//! queue whose name matches a `pattern`.
//!
//! Matching, precedence and merging are the core's
//! ([`rosetta_core::QueueRules`]): entries match the core's queue name
//! (`/queue/orders` and MQTT `$queue/orders` are the queue `orders`), a
//! pattern is dot-separated words with `*` for one word and `#` for any
//! number, every matching entry applies from the least to the most
//! specific (an exact name is the most specific), and each overrides only
//! the keys it sets. Settings take effect when a queue is created or
//! recovered, so a changed entry applies to existing queues at the next
//! restart.

use rosetta_core::VISIBILITY_TIMEOUT_MS_MAX;
use rosetta_core::{
    QueueMatch, QueueOverrides, QueuePattern, QueueRule, RedeliveryMultiplier,
    REDELIVERY_DELAY_MS_MAX, REDELIVERY_MULTIPLIER_MAX,
};
use rosetta_neutral::address::{ADDRESS_LEN_MAX, QUEUE_PREFIX, TOPIC_PREFIX};
use rosetta_neutral::Address;
use serde::{Deserialize, Deserializer};

use super::broker::deserialize_address_opt;
use super::{invalid, positive, within, Config, Invalid};

/// Most `[[queues]]` entries: creating a queue checks it against every
/// pattern, so this bounds that to about a thousand short matches.
pub const QUEUE_ENTRIES_MAX: usize = 1_000;
/// Highest `groups_max` accepted: each remembered group costs its key and
/// an assignment (about 100 bytes), so about 1 GiB for one queue at most.
pub const QUEUE_GROUPS_MAX_LIMIT: u64 = 10_000_000;
/// Longest `dedup_window_s` accepted: a week, past the longest retry a
/// producer makes in practice (SQS keeps 5 minutes, and Artemis's id cache
/// is bounded by count alone).
pub const QUEUE_DEDUP_WINDOW_S_LIMIT: u64 = 7 * 24 * 3600;
/// Highest `dedup_ids_max` accepted: each id costs about 100 bytes between
/// the queue's window and the journal's index, so about 1 GiB for one
/// queue at most.
pub const QUEUE_DEDUP_IDS_MAX_LIMIT: u64 = 10_000_000;

/// `dedup` as written: what a dedup window compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DedupSetting {
    /// The dedup id: AMQP `message-id`, STOMP header or MQTT 5 user
    /// property `dedup-id`.
    Id,
    /// A hash of the body.
    Content,
}

impl From<DedupSetting> for rosetta_core::DedupMode {
    fn from(setting: DedupSetting) -> Self {
        match setting {
            DedupSetting::Id => rosetta_core::DedupMode::Id,
            DedupSetting::Content => rosetta_core::DedupMode::Content,
        }
    }
}
/// Longest `last_value_key`: property names are short in practice (an MQTT
/// user property or STOMP header name), and the key is looked up in every
/// message the queue receives.
pub const LAST_VALUE_KEY_LEN_MAX: usize = 256;

/// One `[[queues]]` entry. Exactly one of `name` and `pattern` is set;
/// every other key is optional and left to less specific entries (or the
/// defaults) when absent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueEntry {
    /// One queue: bare `orders` or `/queue/orders` (stored as the core
    /// name `orders`); internal names such as `$durable/app/sub` too.
    #[serde(default, deserialize_with = "deserialize_queue_name_opt")]
    pub name: Option<String>,
    /// Queues whose name matches, e.g. `orders.*` or `/queue/orders.#`.
    #[serde(default, deserialize_with = "deserialize_pattern_opt")]
    pub pattern: Option<QueuePattern>,
    /// One consumer at a time receives; the others stand by.
    pub exclusive: Option<bool>,
    /// Where this queue's dead letters go, as `[broker]
    /// dead_letter_address` is written.
    #[serde(default, deserialize_with = "deserialize_address_opt")]
    pub dead_letter_address: Option<Address>,
    /// Failed delivery attempts before a message is dead-lettered (> 0).
    pub delivery_attempts_max: Option<u32>,
    /// Most message groups the queue keeps assignments for (> 0).
    pub groups_max: Option<u64>,
    /// How long a released or failed delivery waits before it is offered
    /// again, in ms (0 to `REDELIVERY_DELAY_MS_MAX`).
    pub redelivery_delay_ms: Option<u64>,
    /// The delay's growth per further failed attempt (1.0 to
    /// `REDELIVERY_MULTIPLIER_MAX`).
    #[serde(default, deserialize_with = "deserialize_multiplier_opt")]
    pub redelivery_multiplier: Option<RedeliveryMultiplier>,
    /// The longest the delay grows to, in ms (0 to
    /// `REDELIVERY_DELAY_MS_MAX`; default ten times the delay).
    pub redelivery_delay_max_ms: Option<u64>,
    /// Duplicate detection window in seconds (1 s to a week); off when
    /// absent.
    pub dedup_window_s: Option<u64>,
    /// What the dedup window compares: `"id"` (the default) or
    /// `"content"`.
    pub dedup: Option<DedupSetting>,
    /// Most dedup ids remembered (> 0); past it the oldest is forgotten
    /// before its window passes.
    pub dedup_ids_max: Option<u64>,
    /// A last-value queue keyed by this property (AMQP application
    /// property, STOMP header, MQTT 5 user property).
    pub last_value_key: Option<String>,
    /// A delivery's lease, in ms (1 to `VISIBILITY_TIMEOUT_MS_MAX`):
    /// unsettled past it, it returns to the queue; absent: no lease.
    pub visibility_timeout_ms: Option<u32>,
}

impl QueueEntry {
    /// The entry in core terms. Call on a validated configuration.
    pub fn to_rule(&self) -> Option<QueueRule> {
        let target = match (&self.name, &self.pattern) {
            (Some(name), None) => QueueMatch::Name(name.clone()),
            (None, Some(pattern)) => QueueMatch::Pattern(pattern.clone()),
            _ => return None,
        };
        Some(QueueRule {
            target,
            overrides: QueueOverrides {
                exclusive: self.exclusive,
                dead_letter_address: self
                    .dead_letter_address
                    .as_ref()
                    .map(|a| a.name().to_owned()),
                delivery_attempts_max: self.delivery_attempts_max,
                groups_max: self
                    .groups_max
                    .map(|g| usize::try_from(g).unwrap_or(usize::MAX)),
                redelivery_delay_ms: self.redelivery_delay_ms,
                redelivery_multiplier: self.redelivery_multiplier,
                redelivery_delay_max_ms: self.redelivery_delay_max_ms,
                dedup_window_s: self.dedup_window_s,
                dedup: self.dedup.map(Into::into),
                dedup_ids_max: self
                    .dedup_ids_max
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                last_value_key: self.last_value_key.clone(),
                visibility_timeout_ms: self.visibility_timeout_ms,
            },
        })
    }
}

/// The core's name of a queue written as `q` or `/queue/q`. Any name a
/// queue can have is accepted, internal ones (which may hold `#`) too.
fn queue_name(text: &str) -> Result<String, String> {
    if text.starts_with(TOPIC_PREFIX) {
        return Err(format!(
            "`{text}` is a topic; `[[queues]]` configures queues (`q` or `/queue/q`)"
        ));
    }
    let name = text.strip_prefix(QUEUE_PREFIX).unwrap_or(text);
    if name.is_empty() {
        return Err("a queue name must not be empty".to_owned());
    }
    if name.len() > ADDRESS_LEN_MAX {
        return Err(format!("longer than {ADDRESS_LEN_MAX} bytes"));
    }
    if name.contains('\0') {
        return Err("a queue name must not contain NUL".to_owned());
    }
    Ok(name.to_owned())
}

fn deserialize_queue_name_opt<'de, D>(de: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    let text = String::deserialize(de)?;
    queue_name(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn deserialize_multiplier_opt<'de, D>(de: D) -> Result<Option<RedeliveryMultiplier>, D::Error>
where
    D: Deserializer<'de>,
{
    let factor = f64::deserialize(de)?;
    RedeliveryMultiplier::new(factor).map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "{factor} is out of range (1.0-{REDELIVERY_MULTIPLIER_MAX:.1})"
        ))
    })
}

fn deserialize_pattern_opt<'de, D>(de: D) -> Result<Option<QueuePattern>, D::Error>
where
    D: Deserializer<'de>,
{
    let text = String::deserialize(de)?;
    if text.starts_with(TOPIC_PREFIX) {
        return Err(serde::de::Error::custom(format!(
            "`{text}` is a topic; `[[queues]]` configures queues"
        )));
    }
    let text = text.strip_prefix(QUEUE_PREFIX).unwrap_or(&text);
    QueuePattern::parse(text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// A property name: not empty, no NUL, at most [`LAST_VALUE_KEY_LEN_MAX`]
/// bytes.
fn check_last_value_key(key_name: &str, key: &str) -> Result<(), Invalid> {
    if key.is_empty() {
        return Err(invalid(key_name, "must not be empty: name the property"));
    }
    if key.len() > LAST_VALUE_KEY_LEN_MAX {
        return Err(invalid(
            key_name,
            format!("longer than {LAST_VALUE_KEY_LEN_MAX} bytes"),
        ));
    }
    if key.contains('\0') {
        return Err(invalid(key_name, "must not contain NUL"));
    }
    Ok(())
}

impl Config {
    pub(crate) fn check_queues(&self) -> Result<(), Invalid> {
        if self.queues.len() > QUEUE_ENTRIES_MAX {
            return Err(invalid(
                format!("queues[{QUEUE_ENTRIES_MAX}]"),
                format!("at most {QUEUE_ENTRIES_MAX} `[[queues]]` entries"),
            ));
        }
        for (i, q) in self.queues.iter().enumerate() {
            let at = |key: &str| format!("queues[{i}].{key}");
            let (key, what) = match (&q.name, &q.pattern) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        at("pattern"),
                        "`name` is set too: an entry is for one queue (`name`) or for a pattern, not both",
                    ))
                }
                (None, None) => {
                    return Err(invalid(
                        format!("queues[{i}]"),
                        "needs `name` (one queue) or `pattern` (e.g. `orders.*`)",
                    ))
                }
                (Some(name), None) => ("name", name.clone()),
                (None, Some(pattern)) => ("pattern", pattern.to_string()),
            };
            let earlier = self.queues[..i].iter().position(|e| {
                (q.name.is_some() && e.name == q.name)
                    || (q.pattern.is_some() && e.pattern == q.pattern)
            });
            if let Some(j) = earlier {
                return Err(invalid(
                    at(key),
                    format!("`{what}` is already configured by `queues[{j}]`"),
                ));
            }
            if let Some(max) = q.delivery_attempts_max {
                positive(&at("delivery_attempts_max"), max.into())?;
            }
            if let Some(max) = q.groups_max {
                within(&at("groups_max"), max, 1, QUEUE_GROUPS_MAX_LIMIT)?;
            }
            for (key, ms) in [
                ("redelivery_delay_ms", q.redelivery_delay_ms),
                ("redelivery_delay_max_ms", q.redelivery_delay_max_ms),
            ] {
                if let Some(ms) = ms {
                    within(&at(key), ms, 0, REDELIVERY_DELAY_MS_MAX)?;
                }
            }
            if let Some(window) = q.dedup_window_s {
                within(&at("dedup_window_s"), window, 1, QUEUE_DEDUP_WINDOW_S_LIMIT)?;
            }
            if let Some(max) = q.dedup_ids_max {
                within(&at("dedup_ids_max"), max, 1, QUEUE_DEDUP_IDS_MAX_LIMIT)?;
            }
            if let Some(key) = &q.last_value_key {
                check_last_value_key(&at("last_value_key"), key)?;
            }
            if let Some(ms) = q.visibility_timeout_ms {
                within(
                    &at("visibility_timeout_ms"),
                    ms.into(),
                    1,
                    VISIBILITY_TIMEOUT_MS_MAX.into(),
                )?;
            }
        }
        Ok(())
    }

    /// The `[[queues]]` entries in core terms, in file order.
    pub fn queue_rules(&self) -> rosetta_core::QueueRules {
        rosetta_core::QueueRules::new(self.queues.iter().filter_map(QueueEntry::to_rule))
    }
}
