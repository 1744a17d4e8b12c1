//! `[[streams]]`: queues kept as logs (see `docs/streams.md`), by `name`
//! or by a `pattern` ending in `*` (a name prefix), with their retention.
//!
//! ```toml
//! [[streams]]
//! pattern = "events.*"
//! max_age_s = 604800          # keep a week
//! max_bytes = 10737418240     # and at most 10 GiB
//! segment_bytes = 134217728   # in 128 MiB segments
//!
//! [[streams]]
//! name = "orders"
//! partitions = 4              # logs orders-0 … orders-3
//! partition_key = "customer"  # else JMSXGroupID / AMQP group-id
//! ```
//!
//! The first matching entry applies. A stream no entry names (declared at
//! first use by a client) has no retention limit and default segments,
//! and one partition: a partitioned stream is declared here only. Each
//! partition `<name>-<n>` has the entry's retention.

use rosetta_core::stream::{StreamRule, STREAM_PARTITIONS_MAX};
use rosetta_store::log::LOG_SEGMENT_MIN_BYTES;
use serde::Deserialize;

use super::{invalid, positive, within, Config, Invalid};

/// Most `[[streams]]` entries: opening a stream checks its name against
/// each, so this bounds that to about a thousand comparisons.
pub const STREAM_ENTRIES_MAX: usize = 1_000;
/// Largest `segment_bytes`: retention deletes whole segments, so a larger
/// one would make `max_bytes` too coarse to mean anything.
pub const STREAM_SEGMENT_BYTES_LIMIT: u64 = 4 * 1024 * 1024 * 1024;

/// One `[[streams]]` entry as written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamEntry {
    /// One stream by name.
    pub name: Option<String>,
    /// Every stream whose name starts with this, written `prefix*`.
    pub pattern: Option<String>,
    /// Retention by age, in seconds.
    pub max_age_s: Option<u64>,
    /// Retention by size, in bytes.
    pub max_bytes: Option<u64>,
    /// Segment size, in bytes.
    pub segment_bytes: Option<u64>,
    /// Partitions (default 1): more makes `<name>-0` … `<name>-<N-1>`.
    pub partitions: Option<u32>,
    /// The property holding a publish's partition key.
    pub partition_key: Option<String>,
}

/// Longest `partition_key` (a property name).
pub const PARTITION_KEY_BYTES_MAX: usize = 255;

impl Config {
    pub(crate) fn check_streams(&self) -> Result<(), Invalid> {
        if self.streams.len() > STREAM_ENTRIES_MAX {
            return Err(invalid(
                format!("streams[{STREAM_ENTRIES_MAX}]"),
                format!("at most {STREAM_ENTRIES_MAX} `[[streams]]` entries"),
            ));
        }
        for (i, s) in self.streams.iter().enumerate() {
            let at = |key: &str| format!("streams[{i}].{key}");
            match (&s.name, &s.pattern) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        at("pattern"),
                        "`name` is set too: one or the other",
                    ))
                }
                (None, None) => {
                    return Err(invalid(
                        format!("streams[{i}]"),
                        "needs `name` (one stream) or `pattern` (e.g. `events.*`)",
                    ))
                }
                (Some(n), None) if n.is_empty() || n.contains('*') => {
                    return Err(invalid(at("name"), "a stream name: not empty, no `*`"))
                }
                (None, Some(p)) if !p.ends_with('*') || p[..p.len() - 1].contains('*') => {
                    return Err(invalid(
                        at("pattern"),
                        "a name prefix followed by one `*` at the end (e.g. `events.*`)",
                    ))
                }
                _ => {}
            }
            if let Some(age) = s.max_age_s {
                positive(&at("max_age_s"), age)?;
            }
            if let Some(bytes) = s.max_bytes {
                positive(&at("max_bytes"), bytes)?;
            }
            if let Some(seg) = s.segment_bytes {
                within(
                    &at("segment_bytes"),
                    seg,
                    LOG_SEGMENT_MIN_BYTES,
                    STREAM_SEGMENT_BYTES_LIMIT,
                )?;
            }
            if let Some(p) = s.partitions {
                within(
                    &at("partitions"),
                    u64::from(p),
                    1,
                    u64::from(STREAM_PARTITIONS_MAX),
                )?;
            }
            if let Some(k) = &s.partition_key {
                if k.is_empty() || k.len() > PARTITION_KEY_BYTES_MAX {
                    return Err(invalid(
                        at("partition_key"),
                        format!("a property name of 1 to {PARTITION_KEY_BYTES_MAX} bytes"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The `[[streams]]` entries as the core's rules.
    pub fn stream_rules(&self) -> Vec<StreamRule> {
        self.streams
            .iter()
            .map(|s| StreamRule {
                pattern: s
                    .name
                    .clone()
                    .or_else(|| s.pattern.clone())
                    .unwrap_or_default(),
                max_age_s: s.max_age_s,
                max_bytes: s.max_bytes,
                segment_bytes: s
                    .segment_bytes
                    .unwrap_or(rosetta_store::log::LOG_SEGMENT_DEFAULT_BYTES),
                partitions: s.partitions.unwrap_or(1),
                partition_key: s.partition_key.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn parse(toml: &str) -> Result<Config, String> {
        let c: Config = toml::from_str(toml).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn entries_parse_into_rules_and_bad_ones_name_their_key() {
        let c = parse(
            "[[streams]]\npattern = \"events.*\"\nmax_age_s = 60\nmax_bytes = 4096\nsegment_bytes = 2048\npartitions = 1\n[[streams]]\nname = \"audit\"\npartitions = 4\npartition_key = \"customer\"\n",
        );
        let c = match c {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let rules = c.stream_rules();
        assert_eq!(rules[0].pattern, "events.*");
        assert_eq!(
            (
                rules[0].max_age_s,
                rules[0].max_bytes,
                rules[0].segment_bytes
            ),
            (Some(60), Some(4096), 2048)
        );
        assert_eq!(rules[1].pattern, "audit");
        assert_eq!(
            (rules[0].partitions, rules[1].partitions),
            (1, 4),
            "partitions default to 1"
        );
        assert_eq!(rules[1].partition_key.as_deref(), Some("customer"));
        for (bad, key) in [
            ("[[streams]]\nmax_age_s = 1\n", "streams[0]"),
            ("[[streams]]\npattern = \"ev*ents\"\n", "streams[0].pattern"),
            (
                "[[streams]]\nname = \"a\"\nsegment_bytes = 10\n",
                "streams[0].segment_bytes",
            ),
            (
                "[[streams]]\nname = \"a\"\npartitions = 0\n",
                "streams[0].partitions",
            ),
            (
                "[[streams]]\nname = \"a\"\npartitions = 257\n",
                "streams[0].partitions",
            ),
            (
                "[[streams]]\nname = \"a\"\npartition_key = \"\"\n",
                "streams[0].partition_key",
            ),
            (
                "[[streams]]\nname = \"a\"\nmax_age_s = 0\n",
                "streams[0].max_age_s",
            ),
        ] {
            let e = parse(bad).err().unwrap_or_default();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }
}
