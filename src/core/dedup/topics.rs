//! Duplicate detection on topic addresses: a `[[topics]]` entry with a
//! dedup window drops a producer's send to a matching topic whose dedup id
//! the topic saw within the window, before it fans out, so no subscriber
//! (present or joining later) gets the retry. The producer hears success,
//! as with a queue's window.
//!
//! ## Which window
//! Entries are tried in the order written; the first whose topic filter
//! matches the topic holds the window (one window per entry, shared by the
//! topics it matches, bounded by the entry's `dedup_ids_max`). A key is a
//! hash of the topic and the message's dedup key ([`super::key_of`]), so
//! one id sent to two topics of one entry is two different sends.
//!
//! ## Durability
//! A key is journaled when its message is durable, whether or not a
//! durable subscriber took it: the window is the address's promise, and a
//! retry after a crash must not reach a subscriber that joined since. It
//! goes in the same atomic append as the message (or alone, when no
//! durable queue took the message), as a `State` record:
//!
//! | key                           | value                                        |
//! |-------------------------------|----------------------------------------------|
//! | `$topic-dedup/<32 hex digits>` | version `u8` (1), admitted at `u64` ms, topic `str` |
//!
//! Recovery finds each key's window again from its topic (the first entry
//! that matches it now) and tombstones keys whose window passed while the
//! broker was down or whose topic no entry matches any more. A producer
//! waits for the append that journaled the first copy, as a queue's
//! duplicate does.

use bytes::Bytes;
use parking_lot::Mutex;
use rosetta_neutral::address::topic_matches;
use rosetta_neutral::{BrokerError, Message};
use rosetta_store::wire::{self, DecodeError, Reader};
use rosetta_store::Record;

use super::window::{Admission, DedupKey, DedupWindow, DEDUP_KEY_BYTES};
use super::{decode_recovered, hash, key_from_hex, key_of, push_key_hex, DedupMode, FirstSend};
use crate::batch::Batch;

/// Prefix of the journal's `State` keys of topic dedup windows. Not under
/// [`super::DEDUP_STATE_PREFIX`], whose keys name a queue id.
pub(crate) const TOPIC_DEDUP_STATE_PREFIX: &str = "$topic-dedup/";

/// Version of the value layout of a topic dedup `State` record.
const TOPIC_DEDUP_STATE_VERSION: u8 = 1;

/// One `[[topics]]` entry's duplicate detection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDedupRule {
    /// The core's topic filter (MQTT syntax, `+` and `#`).
    pub filter: String,
    /// How long a dedup id is remembered, in seconds.
    pub window_s: u64,
    /// What the window compares.
    pub mode: DedupMode,
    /// Most ids remembered; past it the oldest is forgotten early.
    pub ids_max: usize,
}

/// One entry's figures, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDedupStats {
    /// The entry's topic filter.
    pub filter: String,
    /// Sends dropped (and acknowledged) as duplicates since start.
    pub duplicates_total: u64,
    /// Ids remembered now.
    pub ids: u64,
    /// Ids forgotten before their window passed, since start.
    pub evicted_total: u64,
}

struct TopicWindow {
    rule: TopicDedupRule,
    /// A leaf lock, never held while another is taken.
    window: Mutex<DedupWindow<FirstSend>>,
}

/// The windows of every `[[topics]]` entry with one.
#[derive(Default)]
pub(crate) struct TopicWindows(Vec<TopicWindow>);

/// What a topic's window says about a producer's send.
pub(crate) enum TopicScreen {
    /// No window for the topic, or no dedup id: route it.
    Pass,
    /// Admitted now (its records are in the batch): route it.
    Admitted,
    /// Seen within the window: drop it; its acknowledgement waits for the
    /// first copy's append (`wait`) when that is not durable yet.
    Duplicate {
        /// The first copy's append.
        wait: FirstSend,
    },
}

impl TopicWindows {
    pub(crate) fn new(rules: &[TopicDedupRule]) -> Self {
        Self(
            rules
                .iter()
                .map(|rule| TopicWindow {
                    window: Mutex::new(DedupWindow::new(
                        rule.window_s.saturating_mul(1_000),
                        rule.ids_max,
                    )),
                    rule: rule.clone(),
                })
                .collect(),
        )
    }

    fn for_topic(&self, topic: &str) -> Option<&TopicWindow> {
        self.0.iter().find(|w| topic_matches(&w.rule.filter, topic))
    }

    /// Screens a producer's send of `message` to `topic` and admits it
    /// when it is new: its key's record (when `message` is durable) and the
    /// tombstone of a key evicted for room go into `batch`.
    pub(crate) fn screen(
        &self,
        topic: &str,
        message: &Message,
        now_ms: u64,
        batch: &mut Batch,
    ) -> Result<TopicScreen, BrokerError> {
        let Some(w) = self.for_topic(topic) else {
            return Ok(TopicScreen::Pass);
        };
        let Some(inner) = key_of(message, w.rule.mode)? else {
            return Ok(TopicScreen::Pass);
        };
        let key = topic_key(topic, &inner);
        let journaled = message.durable;
        let mut window = w.window.lock();
        if window.peek(&key, now_ms).is_some() {
            return Ok(match window.admit(key, now_ms, journaled, None) {
                Admission::Duplicate { first, .. } => TopicScreen::Duplicate {
                    wait: first.filter(|d| d.is_pending()),
                },
                Admission::New { .. } => TopicScreen::Admitted,
            });
        }
        let first = journaled.then(|| batch.admitting());
        match window.admit(key, now_ms, journaled, first) {
            Admission::New {
                admitted_ms,
                evicted,
            } => {
                if let Some(old) = evicted {
                    batch.records.push(forgotten_record(&old));
                }
                if journaled {
                    batch
                        .records
                        .push(admitted_record(&key, admitted_ms, topic));
                }
                Ok(TopicScreen::Admitted)
            }
            // Not reached: the peek above under the same lock said new.
            Admission::Duplicate { first, .. } => Ok(TopicScreen::Duplicate {
                wait: first.filter(|d| d.is_pending()),
            }),
        }
    }

    /// Forgets what every window has passed at `now_ms`; the tombstones of
    /// journaled keys go to `records`.
    pub(crate) fn expire(&self, now_ms: u64, records: &mut Vec<Record>) {
        let mut expired = Vec::new();
        for w in &self.0 {
            expired.clear();
            w.window.lock().expire(now_ms, &mut expired);
            records.extend(expired.iter().map(forgotten_record));
        }
    }

    /// Rebuilds the windows from the journal's topic dedup records; returns
    /// the tombstones of those no window keeps.
    pub(crate) fn restore(&self, stored: Vec<(String, Bytes)>, now_ms: u64) -> Vec<Record> {
        let mut forget = Vec::new();
        let keys = decode_recovered(
            stored,
            decode_stored,
            |k| k.admitted_ms,
            "topic dedup",
            &mut forget,
        );
        let mut evicted = Vec::new();
        let mut kept = 0u64;
        for k in keys {
            let restored = match self.for_topic(&k.topic) {
                Some(w) => {
                    evicted.clear();
                    let here = w
                        .window
                        .lock()
                        .restore(k.key, k.admitted_ms, now_ms, &mut evicted);
                    forget.extend(evicted.iter().map(forgotten_record));
                    here
                }
                None => false,
            };
            if restored {
                kept += 1;
            } else {
                forget.push(forgotten_record(&k.key));
            }
        }
        if kept > 0 || !forget.is_empty() {
            tracing::info!(
                kept,
                forgotten = forget.len(),
                "topic dedup windows recovered"
            );
        }
        forget
    }

    pub(crate) fn stats(&self) -> Vec<TopicDedupStats> {
        self.0
            .iter()
            .map(|w| {
                let window = w.window.lock();
                TopicDedupStats {
                    filter: w.rule.filter.clone(),
                    duplicates_total: window.duplicates_total(),
                    ids: window.len() as u64,
                    evicted_total: window.evicted_total(),
                }
            })
            .collect()
    }
}

/// The window's key of a send to `topic` whose dedup key is `inner`.
fn topic_key(topic: &str, inner: &DedupKey) -> DedupKey {
    hash(b't', &[topic.as_bytes(), &[0], inner])
}

fn state_key(key: &DedupKey) -> String {
    let mut s = String::with_capacity(TOPIC_DEDUP_STATE_PREFIX.len() + 2 * DEDUP_KEY_BYTES);
    s.push_str(TOPIC_DEDUP_STATE_PREFIX);
    push_key_hex(&mut s, key);
    s
}

fn admitted_record(key: &DedupKey, admitted_ms: u64, topic: &str) -> Record {
    let mut value = Vec::with_capacity(13 + topic.len());
    wire::put_u8(&mut value, TOPIC_DEDUP_STATE_VERSION);
    wire::put_u64(&mut value, admitted_ms);
    wire::put_str(&mut value, topic);
    Record::State {
        key: state_key(key),
        value: Some(value.into()),
    }
}

fn forgotten_record(key: &DedupKey) -> Record {
    Record::State {
        key: state_key(key),
        value: None,
    }
}

#[derive(Debug, PartialEq, Eq)]
struct StoredTopicKey {
    key: DedupKey,
    admitted_ms: u64,
    topic: String,
}

#[derive(Debug, thiserror::Error)]
enum StoredTopicKeyError {
    #[error("malformed topic dedup key")]
    Key,
    #[error(transparent)]
    Value(#[from] DecodeError),
}

fn decode_stored(key: &str, value: Bytes) -> Result<StoredTopicKey, StoredTopicKeyError> {
    let hex = key
        .strip_prefix(TOPIC_DEDUP_STATE_PREFIX)
        .ok_or(StoredTopicKeyError::Key)?;
    let k = key_from_hex(hex).ok_or(StoredTopicKeyError::Key)?;
    let mut r = Reader::new(&value);
    match r.u8("topic dedup version")? {
        TOPIC_DEDUP_STATE_VERSION => {}
        tag => {
            return Err(DecodeError::BadTag {
                what: "topic dedup version",
                tag,
            }
            .into())
        }
    }
    let admitted_ms = r.u64("topic dedup admitted ms")?;
    let topic = r.string("topic dedup topic")?;
    Ok(StoredTopicKey {
        key: k,
        admitted_ms,
        topic,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(filter: &str) -> TopicDedupRule {
        TopicDedupRule {
            filter: filter.into(),
            window_s: 60,
            mode: DedupMode::Id,
            ids_max: 2,
        }
    }

    fn send(id: &str) -> Message {
        let mut m = Message::text("x");
        m.durable = true;
        m.properties.push("dedup-id", id);
        m
    }

    fn screen(w: &TopicWindows, topic: &str, m: &Message, now_ms: u64) -> (bool, Vec<Record>) {
        let mut batch = Batch::default();
        let dup = matches!(
            w.screen(topic, m, now_ms, &mut batch).expect("screens"),
            TopicScreen::Duplicate { .. }
        );
        (dup, batch.records)
    }

    #[test]
    fn the_first_matching_entry_holds_the_window_and_keys_are_per_topic() {
        let w = TopicWindows::new(&[rule("orders/#"), rule("#")]);
        assert!(!screen(&w, "orders/eu", &send("a"), 1_000).0);
        assert!(screen(&w, "orders/eu", &send("a"), 2_000).0);
        // Same id, another topic of the same entry: another send.
        assert!(!screen(&w, "orders/us", &send("a"), 2_000).0);
        // Another entry's topic.
        assert!(!screen(&w, "prices", &send("a"), 2_000).0);
        let stats = w.stats();
        assert_eq!(stats[0].duplicates_total, 1);
        assert_eq!(stats[0].ids, 2);
        assert_eq!(stats[1].ids, 1);
        // Past the window the id is new again.
        assert!(!screen(&w, "orders/eu", &send("a"), 62_000).0);
    }

    #[test]
    fn a_durable_send_journals_its_key_and_a_full_window_tombstones_the_oldest() {
        let w = TopicWindows::new(&[rule("#")]);
        let (_, records) = screen(&w, "t", &send("a"), 1);
        assert!(
            matches!(&records[..], [Record::State { key, value: Some(_) }] if key.starts_with(TOPIC_DEDUP_STATE_PREFIX))
        );
        let mut transient = send("b");
        transient.durable = false;
        assert!(screen(&w, "t", &transient, 2).1.is_empty());
        // ids_max is 2: a third id forgets "a", whose record is tombstoned.
        let (_, records) = screen(&w, "t", &send("c"), 3);
        assert_eq!(records.len(), 2);
        assert!(matches!(&records[0], Record::State { value: None, .. }));
        assert!(!screen(&w, "t", &send("a"), 4).0);
    }

    #[test]
    fn recovery_puts_keys_back_in_the_window_of_their_topic() {
        let before = TopicWindows::new(&[rule("orders/#")]);
        let (_, records) = screen(&before, "orders/eu", &send("a"), 10_000);
        let stored: Vec<(String, Bytes)> = records
            .into_iter()
            .filter_map(|r| match r {
                Record::State {
                    key,
                    value: Some(v),
                } => Some((key, v)),
                _ => None,
            })
            .collect();
        let after = TopicWindows::new(&[rule("orders/#")]);
        assert!(after.restore(stored.clone(), 20_000).is_empty());
        assert!(screen(&after, "orders/eu", &send("a"), 20_000).0);
        // Window passed while down, or no entry matches any more: tombstoned.
        let later = TopicWindows::new(&[rule("orders/#")]);
        assert_eq!(later.restore(stored.clone(), 80_000).len(), 1);
        let renamed = TopicWindows::new(&[rule("prices/#")]);
        assert_eq!(renamed.restore(stored, 20_000).len(), 1);
        assert_eq!(
            renamed
                .restore(vec![("$topic-dedup/zz".into(), Bytes::new())], 0)
                .len(),
            1
        );
    }
}
