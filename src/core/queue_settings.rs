//! A queue's own settings: what the `[[queues]]` configuration entries (by
//! name or pattern) say about it, over the `[broker]` defaults.
//!
//! Resolved once, when the queue is created (declared, or auto-created on
//! first use) or recovered at start, and kept with the queue; the dispatch
//! code reads them under the queue lock. The settings are not journaled:
//! they are durable *by configuration*, so a restart with the same
//! configuration gives every queue the same settings, and a changed
//! configuration applies at the next restart. Options a client asks for
//! when it attaches (a consumer's `exclusive`, say) belong to that consumer
//! and are never stored here.
//!
//! ## Matching
//! Entries match the core's queue name: what follows `/queue/` in a STOMP
//! or AMQP destination, or `$queue/` in an MQTT topic (`/queue/orders` and
//! `$queue/orders` are both the queue `orders`). Internal queues have
//! internal names (`$durable/<client-id>/<subscription>`, `$mqtt/<client-id>`,
//! `$share/<group>/<filter>`, `$temp/…`).
//!
//! A [`QueuePattern`] is dot-separated words, as in Artemis address
//! settings: `*` stands for exactly one word, `#` for any number of words
//! (none included), and both stand only for whole words. As with MQTT
//! topic filters, a pattern that starts with a wildcard does not match
//! names starting with `$`, so `#` configures the application's queues and
//! not the broker's internal ones; a pattern whose first word is literal
//! (`$durable/app/orders.*`) can.
//!
//! ## Precedence and merging
//! Every matching entry applies, key by key, from the least specific to the
//! most specific, so a more specific entry overrides only the keys it sets
//! (Artemis merges address settings the same way). An exact name is more
//! specific than any pattern. Patterns are ranked word by word from the
//! left: at the first position where they differ, a literal word beats `*`,
//! `*` beats the end of the pattern, and the end beats `#` (so `a.*` beats
//! `a.*.#`, which beats `a.#`). Patterns that rank equal (such as `#.a.#`
//! and `#.b.#`, which both match `a.b`) apply in file order, the later one
//! winning.

//!
//! ## Adding an option
//! An option (those of issue 16: `visibility_timeout_ms`,
//! `redelivery_delay_ms`, `dedup_window_s`, `last_value_key`, …) is a
//! field of [`QueueSettings`] with its default, an `Option` of the same
//! name in [`QueueOverrides`], and a key of `[[queues]]` in the
//! configuration crate. `QueueOverrides::apply` and the configuration's
//! conversion name every field, so one left out does not compile.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

/// Most message groups a queue remembers by default; past it, the group
/// idle the longest is forgotten (its next message is assigned afresh).
pub const GROUPS_MAX_DEFAULT: usize = 100_000;

/// Most dedup ids a queue with a dedup window remembers by default; past
/// it, the oldest is forgotten before its window has passed (counted in
/// `QueueStats::dedup_evicted_total`). About 100 bytes each between the
/// window and the journal's index, so 10 MB for a full window.
pub const DEDUP_IDS_MAX_DEFAULT: usize = 100_000;

/// Most words in a [`QueuePattern`]: deeper hierarchies are not seen in
/// practice, and it bounds matching one queue name to that many passes
/// over the name's words.
pub const QUEUE_PATTERN_WORDS_MAX: usize = 32;

/// Longest redelivery delay a queue may configure (`redelivery_delay_ms`
/// and `redelivery_delay_max_ms`): a day. A released message held longer
/// than that is better dead-lettered than forgotten in a timer.
pub const REDELIVERY_DELAY_MS_MAX: u64 = 24 * 60 * 60 * 1000;
/// Largest `redelivery_multiplier`: past it the delay reaches its cap after
/// one or two attempts anyway.
pub const REDELIVERY_MULTIPLIER_MAX: f64 = 100.0;
/// `redelivery_delay_max_ms` when a queue sets a delay and no cap: ten
/// times the delay, as Artemis (`max-redelivery-delay` defaults to
/// `redelivery-delay * 10`).
pub const REDELIVERY_DELAY_MAX_FACTOR_DEFAULT: u64 = 10;

/// Longest lease a queue may configure (`visibility_timeout_ms`), the
/// same bound as a consumer's.
pub use rosetta_neutral::VISIBILITY_TIMEOUT_MS_MAX;

/// The factor a redelivery delay grows by with each failed attempt: finite
/// and from 1.0 (no growth) to [`REDELIVERY_MULTIPLIER_MAX`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RedeliveryMultiplier(f64);

// Equality by value; a multiplier is never NaN (see `new`).
impl Eq for RedeliveryMultiplier {}

impl RedeliveryMultiplier {
    /// No growth: every redelivery waits the same delay.
    pub const ONE: RedeliveryMultiplier = RedeliveryMultiplier(1.0);

    /// `factor`, when it is finite and within 1.0 to
    /// [`REDELIVERY_MULTIPLIER_MAX`].
    pub fn new(factor: f64) -> Option<RedeliveryMultiplier> {
        (factor.is_finite() && (1.0..=REDELIVERY_MULTIPLIER_MAX).contains(&factor))
            .then_some(RedeliveryMultiplier(factor))
    }

    /// The factor.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl Default for RedeliveryMultiplier {
    fn default() -> Self {
        RedeliveryMultiplier::ONE
    }
}

/// One queue's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// Only one consumer receives at a time; the others stand by in attach
    /// order (Artemis `exclusive`, RabbitMQ single active consumer).
    pub exclusive: bool,
    /// Where this queue's rejected and too-often-redelivered messages go;
    /// `None` uses the broker's.
    pub dead_letter_address: Option<String>,
    /// Failed delivery attempts before a message is dead-lettered; `None`
    /// uses the broker's.
    pub delivery_attempts_max: Option<u32>,
    /// Most message groups the queue keeps assignments for.
    pub groups_max: usize,
    /// How long a released, rejected-for-retry or abandoned delivery waits
    /// before it is offered again (0: at once). The messages behind it are
    /// not held up.
    pub redelivery_delay_ms: u64,
    /// The delay grows by this factor with each further failed attempt.
    pub redelivery_multiplier: RedeliveryMultiplier,
    /// The longest the delay grows to; `None`: ten times
    /// `redelivery_delay_ms` ([`REDELIVERY_DELAY_MAX_FACTOR_DEFAULT`]).
    pub redelivery_delay_max_ms: Option<u64>,
    /// Duplicate detection: a send whose dedup id the queue saw within
    /// this many seconds is dropped (and acknowledged); `None` is off.
    pub dedup_window_s: Option<u64>,
    /// What the dedup window compares: the dedup id or the body.
    pub dedup: crate::DedupMode,
    /// Most dedup ids remembered; past it the oldest is forgotten early.
    pub dedup_ids_max: usize,
    /// A last-value queue: of the waiting messages with the same value of
    /// this property, only the newest is kept (see `last_value`).
    pub last_value_key: Option<String>,
    /// How long a delivery may stay unsettled before it returns to the
    /// queue while its consumer stays connected (a lease, as the visibility
    /// timeout of SQS); `None`: held until settled or its consumer goes. At
    /// most [`VISIBILITY_TIMEOUT_MS_MAX`]; a consumer's own timeout wins.
    pub visibility_timeout_ms: Option<u32>,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            exclusive: false,
            dead_letter_address: None,
            delivery_attempts_max: None,
            groups_max: GROUPS_MAX_DEFAULT,
            redelivery_delay_ms: 0,
            redelivery_multiplier: RedeliveryMultiplier::ONE,
            redelivery_delay_max_ms: None,
            dedup_window_s: None,
            dedup: crate::DedupMode::Id,
            dedup_ids_max: DEDUP_IDS_MAX_DEFAULT,
            last_value_key: None,
            visibility_timeout_ms: None,
        }
    }
}

impl QueueSettings {
    /// The queue's dead-letter address, or `broker`'s when it has none.
    pub fn dead_letter_address_or<'a>(&'a self, broker: &'a str) -> &'a str {
        self.dead_letter_address.as_deref().unwrap_or(broker)
    }

    /// The queue's delivery attempts before dead-lettering, or `broker`'s.
    pub fn delivery_attempts_max_or(&self, broker: u32) -> u32 {
        self.delivery_attempts_max.unwrap_or(broker)
    }

    /// The cap on the redelivery delay in force.
    pub fn redelivery_delay_cap_ms(&self) -> u64 {
        self.redelivery_delay_max_ms.unwrap_or(
            self.redelivery_delay_ms
                .saturating_mul(REDELIVERY_DELAY_MAX_FACTOR_DEFAULT),
        )
    }

    /// How long a delivery that failed `delivery_count` times (0 for a
    /// release, which counts no attempt) waits before it is offered again:
    /// `redelivery_delay_ms * redelivery_multiplier^(delivery_count - 1)`,
    /// at most [`Self::redelivery_delay_cap_ms`].
    pub fn redelivery_delay_ms_for(&self, delivery_count: u32) -> u64 {
        if self.redelivery_delay_ms == 0 {
            return 0;
        }
        let cap = self.redelivery_delay_cap_ms();
        let exponent = i32::try_from(delivery_count.saturating_sub(1)).unwrap_or(i32::MAX);
        let delay =
            self.redelivery_delay_ms as f64 * self.redelivery_multiplier.get().powi(exponent);
        // `as` saturates: an infinite product is the cap.
        (delay as u64).min(cap)
    }
}

/// What one configuration entry sets. A key left `None` keeps what a less
/// specific entry, or the default, says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueOverrides {
    /// [`QueueSettings::exclusive`].
    pub exclusive: Option<bool>,
    /// [`QueueSettings::dead_letter_address`] (a queue name).
    pub dead_letter_address: Option<String>,
    /// [`QueueSettings::delivery_attempts_max`].
    pub delivery_attempts_max: Option<u32>,
    /// [`QueueSettings::groups_max`].
    pub groups_max: Option<usize>,
    /// [`QueueSettings::redelivery_delay_ms`].
    pub redelivery_delay_ms: Option<u64>,
    /// [`QueueSettings::redelivery_multiplier`].
    pub redelivery_multiplier: Option<RedeliveryMultiplier>,
    /// [`QueueSettings::redelivery_delay_max_ms`].
    pub redelivery_delay_max_ms: Option<u64>,
    /// [`QueueSettings::dedup_window_s`].
    pub dedup_window_s: Option<u64>,
    /// [`QueueSettings::dedup`].
    pub dedup: Option<crate::DedupMode>,
    /// [`QueueSettings::dedup_ids_max`].
    pub dedup_ids_max: Option<usize>,
    /// [`QueueSettings::last_value_key`].
    pub last_value_key: Option<String>,
    /// [`QueueSettings::visibility_timeout_ms`].
    pub visibility_timeout_ms: Option<u32>,
}

impl QueueOverrides {
    fn apply(&self, settings: &mut QueueSettings) {
        // Destructured, so a key added to both structs and not applied here
        // does not compile.
        let QueueOverrides {
            exclusive,
            dead_letter_address,
            delivery_attempts_max,
            groups_max,
            redelivery_delay_ms,
            redelivery_multiplier,
            redelivery_delay_max_ms,
            dedup_window_s,
            dedup,
            dedup_ids_max,
            last_value_key,
            visibility_timeout_ms,
        } = self;
        if let Some(exclusive) = exclusive {
            settings.exclusive = *exclusive;
        }
        if let Some(address) = dead_letter_address {
            settings.dead_letter_address = Some(address.clone());
        }
        if let Some(max) = delivery_attempts_max {
            settings.delivery_attempts_max = Some(*max);
        }
        if let Some(max) = groups_max {
            settings.groups_max = *max;
        }
        if let Some(delay) = redelivery_delay_ms {
            settings.redelivery_delay_ms = *delay;
        }
        if let Some(multiplier) = redelivery_multiplier {
            settings.redelivery_multiplier = *multiplier;
        }
        if let Some(max) = redelivery_delay_max_ms {
            settings.redelivery_delay_max_ms = Some(*max);
        }
        if let Some(window) = dedup_window_s {
            settings.dedup_window_s = Some(*window);
        }
        if let Some(mode) = dedup {
            settings.dedup = *mode;
        }
        if let Some(max) = dedup_ids_max {
            settings.dedup_ids_max = *max;
        }
        if let Some(key) = last_value_key {
            settings.last_value_key = Some(key.clone());
        }
        if let Some(timeout) = visibility_timeout_ms {
            settings.visibility_timeout_ms = Some(*timeout);
        }
    }
}

/// Why a pattern is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueuePatternError {
    /// Nothing to match.
    #[error("a pattern must not be empty")]
    Empty,
    /// `a..b`, `.a` or `a.`.
    #[error("`{0}` has an empty word: words are separated by single dots")]
    EmptyWord(String),
    /// `ord*`: wildcards are words of their own.
    #[error("`{0}`: `*` and `#` stand for whole words (write `orders.*`, not `orders*`)")]
    PartialWildcard(String),
    /// No `*` and no `#`.
    #[error("`{0}` has no wildcard: use `name` for a single queue")]
    NoWildcard(String),
    /// Past [`QUEUE_PATTERN_WORDS_MAX`].
    #[error("more than {QUEUE_PATTERN_WORDS_MAX} words")]
    TooManyWords,
    /// A NUL byte, which no queue name has.
    #[error("a pattern must not contain NUL")]
    Nul,
}

/// One word of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Word {
    Literal(String),
    /// `*`: exactly one word.
    One,
    /// `#`: any number of words.
    Any,
}

impl Word {
    /// How specific a word is at its position; [`PATTERN_END_RANK`] sits
    /// between `*` and `#`.
    fn rank(word: Option<&Word>) -> u8 {
        match word {
            Some(Word::Literal(_)) => 3,
            Some(Word::One) => 2,
            None => PATTERN_END_RANK,
            Some(Word::Any) => 0,
        }
    }
}

/// Rank of a position past a pattern's last word: more specific than `#`
/// (which may match nothing there), less than a word that must be present.
const PATTERN_END_RANK: u8 = 1;

/// A queue-name pattern: dot-separated words, `*` for one word and `#` for
/// any number (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePattern {
    text: String,
    words: Vec<Word>,
}

impl QueuePattern {
    /// Parses `text`; wildcards must be whole words and at least one word
    /// must be one.
    pub fn parse(text: &str) -> Result<QueuePattern, QueuePatternError> {
        if text.is_empty() {
            return Err(QueuePatternError::Empty);
        }
        if text.contains('\0') {
            return Err(QueuePatternError::Nul);
        }
        if text.split('.').count() > QUEUE_PATTERN_WORDS_MAX {
            return Err(QueuePatternError::TooManyWords);
        }
        let mut words = Vec::new();
        for word in text.split('.') {
            words.push(match word {
                "" => return Err(QueuePatternError::EmptyWord(text.to_owned())),
                "*" => Word::One,
                "#" => Word::Any,
                w if w.contains(['*', '#']) => {
                    return Err(QueuePatternError::PartialWildcard(w.to_owned()))
                }
                w => Word::Literal(w.to_owned()),
            });
        }
        if words.iter().all(|w| matches!(w, Word::Literal(_))) {
            return Err(QueuePatternError::NoWildcard(text.to_owned()));
        }
        Ok(QueuePattern {
            text: text.to_owned(),
            words,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the queue `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        if name.starts_with('$') && !matches!(self.words.first(), Some(Word::Literal(_))) {
            return false;
        }
        let parts: Vec<&str> = name.split('.').collect();
        // reachable[j]: the pattern words seen so far can match exactly the
        // first j words of the name. One pass per pattern word, so `#`
        // anywhere costs no backtracking.
        let mut reachable = vec![false; parts.len() + 1];
        reachable[0] = true;
        for word in &self.words {
            match word {
                Word::Any => {
                    let mut seen = false;
                    for r in reachable.iter_mut() {
                        seen |= *r;
                        *r = seen;
                    }
                }
                Word::One | Word::Literal(_) => {
                    for j in (1..reachable.len()).rev() {
                        let fits = match word {
                            Word::Literal(literal) => parts[j - 1] == literal,
                            _ => true,
                        };
                        reachable[j] = reachable[j - 1] && fits;
                    }
                    reachable[0] = false;
                }
            }
        }
        reachable[parts.len()]
    }

    /// Orders patterns from the least to the most specific (see the module
    /// docs): word by word from the left, literal > `*` > end > `#`.
    fn specificity(&self, other: &QueuePattern) -> Ordering {
        let len = self.words.len().max(other.words.len());
        (0..len)
            .map(|i| Word::rank(self.words.get(i)).cmp(&Word::rank(other.words.get(i))))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl std::fmt::Display for QueuePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Which queues a [`QueueRule`] is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueMatch {
    /// The queue of this core name.
    Name(String),
    /// Every queue whose name matches.
    Pattern(QueuePattern),
}

/// One `[[queues]]` entry in core terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRule {
    /// The queues it is for.
    pub target: QueueMatch,
    /// What it sets.
    pub overrides: QueueOverrides,
}

/// Every configured rule, ready to resolve a queue's settings.
#[derive(Debug, Clone, Default)]
pub struct QueueRules {
    by_name: HashMap<String, QueueOverrides>,
    /// Least specific first (file order among equals), so applying them in
    /// order lets the more specific override.
    patterns: Vec<(QueuePattern, QueueOverrides)>,
    /// The settings of a queue no rule names, shared by all such queues.
    default: Arc<QueueSettings>,
}

impl QueueRules {
    /// Rules from entries in file order. The configuration refuses two
    /// entries for one name; here, the later one would win.
    pub fn new(rules: impl IntoIterator<Item = QueueRule>) -> QueueRules {
        let mut by_name = HashMap::new();
        let mut patterns = Vec::new();
        for rule in rules {
            match rule.target {
                QueueMatch::Name(name) => {
                    by_name.insert(name, rule.overrides);
                }
                QueueMatch::Pattern(pattern) => patterns.push((pattern, rule.overrides)),
            }
        }
        // Stable, so equal patterns keep file order.
        patterns.sort_by(|(a, _), (b, _)| a.specificity(b));
        QueueRules {
            by_name,
            patterns,
            default: Arc::default(),
        }
    }

    /// The settings of the queue `name`: the defaults, then every matching
    /// pattern from the least specific, then its exact entry.
    pub fn resolve(&self, name: &str) -> QueueSettings {
        let mut settings = QueueSettings::default();
        for (pattern, overrides) in &self.patterns {
            if pattern.matches(name) {
                overrides.apply(&mut settings);
            }
        }
        if let Some(overrides) = self.by_name.get(name) {
            overrides.apply(&mut settings);
        }
        settings
    }

    /// [`Self::resolve`], shared: every queue no rule names gets the one
    /// default. A queue's settings are part of every queue's memory (136
    /// bytes), and most queues are sessions' and devices' (issue 20).
    pub fn resolve_shared(&self, name: &str) -> Arc<QueueSettings> {
        let named = self.by_name.contains_key(name)
            || self
                .patterns
                .iter()
                .any(|(pattern, _)| pattern.matches(name));
        if named {
            Arc::new(self.resolve(name))
        } else {
            Arc::clone(&self.default)
        }
    }

    /// Whether some rule names `queue` as its dead-letter address (such a
    /// queue is created even past `queues_max`, as the broker's is).
    pub fn is_dead_letter_address(&self, queue: &str) -> bool {
        self.by_name
            .values()
            .chain(self.patterns.iter().map(|(_, o)| o))
            .any(|o| o.dead_letter_address.as_deref() == Some(queue))
    }
}

#[cfg(test)]
#[path = "queue_settings_tests.rs"]
mod tests;
