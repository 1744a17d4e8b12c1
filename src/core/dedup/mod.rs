//! Duplicate detection: a queue with a dedup window drops a send whose
//! dedup id it has seen within the window, and acknowledges it as a
//! success (a retried send is not an error).
//!
//! ## The dedup id
//! One neutral notion, [`Message::dedup_id`]: the property `dedup-id`
//! (STOMP SEND header, MQTT 5 user property, AMQP application property)
//! when there is one, else the message id (AMQP `properties.message-id`,
//! of any of its four types). With [`DedupMode::Content`] it is the body
//! instead (its kind and bytes). Either way the queue keeps a [`DedupKey`]:
//! 128 bits of SHA-256 over a type tag and the id's bytes, so an id costs
//! 16 bytes however long it is, and a string id matches the same string
//! sent from any protocol. Ids longer than [`DEDUP_ID_BYTES_MAX`] are
//! refused.
//!
//! ## Durability
//! An admitted key is journaled in the same atomic append as the message
//! it admitted, as a `State` record (no new record kind):
//!
//! | key                                   | value                              |
//! |---------------------------------------|------------------------------------|
//! | `$dedup/<queue id>/<32 hex digits>`    | version `u8` (1), admitted at `u64` ms since the epoch |
//!
//! so a send acknowledged as durable is never forgotten, and a crash
//! cannot fall between the message and its key. The key outlives the
//! message: a consumed and acknowledged message is still remembered for
//! the window. Once the window passes (or the key is forgotten early past
//! `dedup_ids_max`, or its queue is deleted), a `State` tombstone lets
//! compaction drop the record. Recovery rebuilds each queue's window from
//! these records, tombstoning the ones whose window passed while the
//! broker was down, whose queue is gone, or whose queue no longer has a
//! window. Client state keys are `<protocol>/…`, so `$dedup/` cannot clash.
//!
//! A key is journaled only when its message is (a durable message on a
//! durable queue): a non-durable message lost in a crash must not make its
//! retry a duplicate.
//!
//! ## Where the check happens
//! At routing, for producers' sends only (not for dead-lettered or expired
//! copies, which keep the original's id). A transactional send is checked
//! when the transaction commits, so a rolled-back send never enters the
//! window. A duplicate is acknowledged only once the append that journaled
//! its first copy has completed (at once when it has), and gets that
//! append's result: a retry racing its original is never acknowledged
//! before the original is durable.

mod topics;
mod window;

use bytes::Bytes;
use rosetta_neutral::{BrokerError, Message, MessageId};
use rosetta_store::wire::{self, DecodeError, Reader};
use rosetta_store::{QueueId, Record};
use sha2::{Digest, Sha256};

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;

use parking_lot::Mutex;
use rosetta_store::{Completion, StoreError};

use super::batch::Batch;
use super::queue::Queue;

pub use topics::{TopicDedupRule, TopicDedupStats};
pub(crate) use topics::{TopicScreen, TopicWindows, TOPIC_DEDUP_STATE_PREFIX};
pub(crate) use window::{Admission, DedupKey, DedupWindow, DEDUP_KEY_BYTES};

/// Longest dedup id accepted, in bytes: ids are hashed, so this is not
/// about memory but about refusing what no sane producer sends (a JMS id
/// or a UUID is under 64 bytes); a queue without a window takes any.
pub const DEDUP_ID_BYTES_MAX: usize = 1024;

/// Prefix of the journal's `State` keys of dedup windows.
pub(crate) const DEDUP_STATE_PREFIX: &str = "$dedup/";

/// Version of the value layout of a dedup `State` record.
const DEDUP_STATE_VERSION: u8 = 1;

/// What a queue's dedup window compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DedupMode {
    /// The dedup id ([`Message::dedup_id`]); sends without one pass.
    #[default]
    Id,
    /// A hash of the body, as content-based deduplication of FIFO queues.
    Content,
}

impl DedupMode {
    /// The configuration's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DedupMode::Id => "id",
            DedupMode::Content => "content",
        }
    }
}

fn hash(tag: u8, parts: &[&[u8]]) -> DedupKey {
    let mut h = Sha256::new();
    h.update([tag]);
    for p in parts {
        h.update(p);
    }
    let digest = h.finalize();
    let mut key = [0u8; DEDUP_KEY_BYTES];
    key.copy_from_slice(&digest[..DEDUP_KEY_BYTES]);
    key
}

fn too_long(len: usize) -> BrokerError {
    BrokerError::ResourceLimit(format!(
        "dedup id of {len} bytes is longer than {DEDUP_ID_BYTES_MAX}"
    ))
}

/// The key of `message` in `mode`: `None` when it has no dedup id.
pub(crate) fn key_of(message: &Message, mode: DedupMode) -> Result<Option<DedupKey>, BrokerError> {
    match mode {
        DedupMode::Content => Ok(Some(hash(
            b'c',
            &[
                format!("{:?}", message.body.kind).as_bytes(),
                &[0],
                &message.body.bytes,
            ],
        ))),
        DedupMode::Id => {
            let Some(id) = message.dedup_id() else {
                return Ok(None);
            };
            let (tag, bytes): (u8, Bytes) = match id {
                MessageId::String(s) => (b's', s.into()),
                MessageId::Binary(b) => (b'b', b),
                MessageId::Ulong(v) => (b'u', Bytes::copy_from_slice(&v.to_be_bytes())),
                MessageId::Uuid(v) => (b'g', Bytes::copy_from_slice(&v)),
            };
            if bytes.len() > DEDUP_ID_BYTES_MAX {
                return Err(too_long(bytes.len()));
            }
            Ok(Some(hash(tag, &[&bytes])))
        }
    }
}

/// Appends `key` to `out` as the 32 hex digits that end a dedup `State` key.
fn push_key_hex(out: &mut String, key: &DedupKey) {
    use std::fmt::Write;
    for b in key {
        let _ = write!(out, "{b:02x}");
    }
}

/// The key written by [`push_key_hex`]; `None` for anything else.
fn key_from_hex(hex: &str) -> Option<DedupKey> {
    if hex.len() != 2 * DEDUP_KEY_BYTES || !hex.is_ascii() {
        return None;
    }
    let mut k = [0u8; DEDUP_KEY_BYTES];
    for (i, byte) in k.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(k)
}

/// Decodes the recovered dedup records `stored` (key and value of each)
/// with `decode`, sorted by `admitted_ms` so each window's order queue
/// comes back sorted. A record that does not decode is logged (as a
/// `what` record) and its tombstone pushed to `forget`.
fn decode_recovered<K, E: std::fmt::Display>(
    stored: Vec<(String, Bytes)>,
    decode: impl Fn(&str, Bytes) -> Result<K, E>,
    admitted_ms: impl Fn(&K) -> u64,
    what: &str,
    forget: &mut Vec<Record>,
) -> Vec<K> {
    let mut keys = Vec::with_capacity(stored.len());
    for (text, value) in stored {
        match decode(&text, value) {
            Ok(k) => keys.push(k),
            Err(e) => {
                tracing::warn!(key = %text, error = %e, "a recovered {what} record does not decode; it is dropped");
                forget.push(Record::State {
                    key: text,
                    value: None,
                });
            }
        }
    }
    keys.sort_by_key(|k| admitted_ms(k));
    keys
}

/// The `State` key of `key` in queue `queue`.
fn state_key(queue: QueueId, key: &DedupKey) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(DEDUP_STATE_PREFIX.len() + 21 + 2 * DEDUP_KEY_BYTES);
    s.push_str(DEDUP_STATE_PREFIX);
    let _ = write!(s, "{queue}/");
    push_key_hex(&mut s, key);
    s
}

/// The record that journals `key` of `queue`, admitted at `admitted_ms`.
pub(crate) fn admitted_record(queue: QueueId, key: &DedupKey, admitted_ms: u64) -> Record {
    let mut value = Vec::with_capacity(9);
    wire::put_u8(&mut value, DEDUP_STATE_VERSION);
    wire::put_u64(&mut value, admitted_ms);
    Record::State {
        key: state_key(queue, key),
        value: Some(value.into()),
    }
}

/// The tombstone that lets compaction drop `key` of `queue`.
pub(crate) fn forgotten_record(queue: QueueId, key: &DedupKey) -> Record {
    Record::State {
        key: state_key(queue, key),
        value: None,
    }
}

/// A dedup record read back from the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredKey {
    pub(crate) queue: QueueId,
    pub(crate) key: DedupKey,
    pub(crate) admitted_ms: u64,
}

/// Why a dedup record does not read back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoredKeyError {
    /// The `State` key is not `$dedup/<queue>/<32 hex>`.
    #[error("malformed dedup key")]
    Key,
    /// The value does not decode.
    #[error(transparent)]
    Value(#[from] DecodeError),
}

/// Decodes a recovered `State` record under [`DEDUP_STATE_PREFIX`].
pub(crate) fn decode_stored(key: &str, value: Bytes) -> Result<StoredKey, StoredKeyError> {
    let rest = key
        .strip_prefix(DEDUP_STATE_PREFIX)
        .ok_or(StoredKeyError::Key)?;
    let (queue, hex) = rest.split_once('/').ok_or(StoredKeyError::Key)?;
    let queue: QueueId = queue.parse().map_err(|_| StoredKeyError::Key)?;
    let k = key_from_hex(hex).ok_or(StoredKeyError::Key)?;
    let mut r = Reader::new(&value);
    match r.u8("dedup version")? {
        DEDUP_STATE_VERSION => {}
        tag => {
            return Err(DecodeError::BadTag {
                what: "dedup version",
                tag,
            }
            .into())
        }
    }
    let admitted_ms = r.u64("dedup admitted ms")?;
    Ok(StoredKey {
        queue,
        key: k,
        admitted_ms,
    })
}

/// What a duplicate waits for: the append that journaled its first copy,
/// so no duplicate is acknowledged before the send it repeats is durable.
/// `None` when there is nothing to wait for (a key recovered from the
/// journal, or a first copy that was not journaled).
pub(crate) type FirstSend = Option<Arc<Durability>>;

/// One journal append that admitted keys, until it completes.
pub(crate) struct Durability(Mutex<DurabilityState>);

enum DurabilityState {
    /// Duplicates' completions, run when the append completes.
    Pending(Vec<Completion>),
    Done(Result<(), StoreError>),
}

impl Durability {
    pub(crate) fn pending() -> Arc<Durability> {
        Arc::new(Durability(Mutex::new(DurabilityState::Pending(Vec::new()))))
    }

    /// The append completed: runs the waiting completions with its result.
    pub(crate) fn finish(&self, result: Result<(), StoreError>) {
        let waiting = {
            let mut st = self.0.lock();
            match std::mem::replace(&mut *st, DurabilityState::Done(result.clone())) {
                DurabilityState::Pending(waiting) => waiting,
                DurabilityState::Done(_) => Vec::new(),
            }
        };
        for done in waiting {
            done(result.clone());
        }
    }

    /// Whether the append is still under way.
    fn is_pending(&self) -> bool {
        matches!(*self.0.lock(), DurabilityState::Pending(_))
    }

    /// Runs `done` once the append completes (now, if it has).
    fn then(&self, done: Completion) {
        let mut st = self.0.lock();
        match &mut *st {
            DurabilityState::Pending(waiting) => waiting.push(done),
            DurabilityState::Done(result) => {
                let result = result.clone();
                drop(st);
                done(result);
            }
        }
    }
}

/// `done`, run only once every append in `waits` has completed too (with
/// the first error among them all).
pub(crate) fn after_all(
    done: Option<Completion>,
    waits: Vec<Arc<Durability>>,
) -> Option<Completion> {
    let done = done?;
    if waits.is_empty() {
        return Some(done);
    }
    struct Join {
        remaining: AtomicUsize,
        first_error: Mutex<Option<StoreError>>,
        done: Mutex<Option<Completion>>,
    }
    impl Join {
        fn arrive(&self, result: Result<(), StoreError>) {
            if let Err(e) = result {
                self.first_error.lock().get_or_insert(e);
            }
            if self.remaining.fetch_sub(1, AtomicOrdering::AcqRel) == 1 {
                let error = self.first_error.lock().take();
                if let Some(done) = self.done.lock().take() {
                    done(error.map_or(Ok(()), Err));
                }
            }
        }
    }
    // One arrival per wait, and one for the batch's own append.
    let join = Arc::new(Join {
        remaining: AtomicUsize::new(waits.len() + 1),
        first_error: Mutex::new(None),
        done: Mutex::new(Some(done)),
    });
    for wait in waits {
        let join = Arc::clone(&join);
        wait.then(Box::new(move |result| join.arrive(result)));
    }
    Some(Box::new(move |result| join.arrive(result)))
}

/// What a queue's window says about a send before its queue is checked
/// for room.
pub(crate) enum Screen {
    /// The queue has no window, or the send has no dedup id.
    Pass,
    /// Not seen yet: admit `key` once the queue is known to take it.
    Candidate(DedupKey),
    /// Seen within the window: drop it; its acknowledgement waits for the
    /// first copy's append (`wait`) when that is not durable yet.
    Duplicate {
        /// The first copy's append.
        wait: FirstSend,
    },
}

/// Screens `message` against `queue`'s window. Only a duplicate is
/// counted here; a candidate is admitted (or found a duplicate after all)
/// by [`admit`].
pub(crate) fn screen(queue: &Queue, message: &Message, now_ms: u64) -> Result<Screen, BrokerError> {
    let Some(dedup) = &queue.dedup else {
        return Ok(Screen::Pass);
    };
    let Some(key) = key_of(message, dedup.mode)? else {
        return Ok(Screen::Pass);
    };
    let mut window = dedup.window.lock();
    if window.peek(&key, now_ms).is_none() {
        return Ok(Screen::Candidate(key));
    }
    // Seen within the window, under the same lock: `admit` counts it.
    match window.admit(key, now_ms, false, None) {
        Admission::Duplicate { first, .. } => Ok(Screen::Duplicate {
            wait: first.filter(|d| d.is_pending()),
        }),
        Admission::New { .. } => Ok(Screen::Pass),
    }
}

/// Admits `key` to `queue`'s window once the queue takes the message, its
/// records (the key when `journaled`, the tombstone of a key evicted for
/// room) into `batch`. False when a concurrent send admitted it first:
/// this one is then a duplicate, and `batch` waits for the other's append.
pub(crate) fn admit(
    queue: &Queue,
    key: DedupKey,
    journaled: bool,
    now_ms: u64,
    batch: &mut Batch,
) -> bool {
    let Some(dedup) = &queue.dedup else {
        return true;
    };
    let first = journaled.then(|| batch.admitting());
    let mut window = dedup.window.lock();
    match window.admit(key, now_ms, journaled, first) {
        Admission::New {
            admitted_ms,
            evicted,
        } => {
            if let Some(old) = evicted.filter(|_| queue.durable) {
                batch.records.push(forgotten_record(queue.id, &old));
            }
            if journaled {
                batch
                    .records
                    .push(admitted_record(queue.id, &key, admitted_ms));
            }
            true
        }
        Admission::Duplicate { first, .. } => {
            batch.waits.extend(first.filter(|d| d.is_pending()));
            false
        }
    }
}

/// Forgets what `queue`'s window has passed at `now_ms`; the tombstones of
/// its journaled keys go to `records`.
pub(crate) fn expire(queue: &Queue, now_ms: u64, records: &mut Vec<Record>) {
    let Some(dedup) = &queue.dedup else { return };
    let mut expired = Vec::new();
    dedup.window.lock().expire(now_ms, &mut expired);
    if queue.durable {
        records.extend(expired.iter().map(|k| forgotten_record(queue.id, k)));
    }
}

/// Forgets every key of a deleted queue; their tombstones go to `records`.
pub(crate) fn forget_all(queue: &Queue, records: &mut Vec<Record>) {
    let Some(dedup) = &queue.dedup else { return };
    let keys = dedup.window.lock().drain_journaled();
    if queue.durable {
        records.extend(keys.iter().map(|k| forgotten_record(queue.id, k)));
    }
}

/// Rebuilds the windows of recovered queues from the journal's dedup
/// records (`stored`: key and value of each). Returns the tombstones of the
/// records no window keeps (expired, queue gone or without a window,
/// undecodable, or past the bound).
pub(crate) fn restore(
    stored: Vec<(String, Bytes)>,
    queues: &std::collections::HashMap<QueueId, std::sync::Arc<Queue>>,
    now_ms: u64,
) -> Vec<Record> {
    let mut forget = Vec::new();
    let keys = decode_recovered(
        stored,
        decode_stored,
        |k| k.admitted_ms,
        "dedup",
        &mut forget,
    );
    let mut evicted = Vec::new();
    let mut kept = 0u64;
    for k in keys {
        let window = queues
            .get(&k.queue)
            .and_then(|q| q.dedup.as_ref().map(|d| (q, d)));
        let restored = match window {
            Some((q, dedup)) => {
                evicted.clear();
                let kept_here =
                    dedup
                        .window
                        .lock()
                        .restore(k.key, k.admitted_ms, now_ms, &mut evicted);
                forget.extend(evicted.iter().map(|old| forgotten_record(q.id, old)));
                kept_here
            }
            None => false,
        };
        if restored {
            kept += 1;
        } else {
            forget.push(forgotten_record(k.queue, &k.key));
        }
    }
    tracing::info!(kept, forgotten = forget.len(), "dedup windows recovered");
    forget
}

#[cfg(test)]
mod tests {
    use super::*;
    use rosetta_neutral::Body;

    fn with_id(id: MessageId) -> Message {
        Message {
            message_id: Some(id),
            ..Message::text("x")
        }
    }

    #[test]
    fn the_dedup_id_property_wins_over_the_message_id() {
        let mut m = with_id(MessageId::String("amqp".into()));
        let by_id = key_of(&m, DedupMode::Id).expect("key");
        m.properties.push("dedup-id", "amqp");
        // The same string from a property and from a message-id is the
        // same id: one notion across protocols.
        assert_eq!(key_of(&m, DedupMode::Id).expect("key"), by_id);
        let mut other = with_id(MessageId::String("amqp".into()));
        other.properties.push("dedup-id", "stomp");
        assert_ne!(key_of(&other, DedupMode::Id).expect("key"), by_id);
    }

    #[test]
    fn id_types_do_not_collide_and_a_message_without_id_has_no_key() {
        let s = key_of(&with_id(MessageId::String("7".into())), DedupMode::Id).expect("key");
        let u = key_of(&with_id(MessageId::Ulong(7)), DedupMode::Id).expect("key");
        let b = key_of(
            &with_id(MessageId::Binary(Bytes::from_static(b"7"))),
            DedupMode::Id,
        )
        .expect("key");
        assert!(s.is_some() && u.is_some() && b.is_some());
        assert_ne!(s, u);
        assert_ne!(s, b);
        assert_eq!(
            key_of(&Message::text("x"), DedupMode::Id).expect("key"),
            None
        );
    }

    #[test]
    fn content_mode_hashes_the_body_and_ignores_the_id() {
        let a = with_id(MessageId::Ulong(1));
        let b = with_id(MessageId::Ulong(2));
        assert_eq!(
            key_of(&a, DedupMode::Content).expect("key"),
            key_of(&b, DedupMode::Content).expect("key")
        );
        let other_body = Message::text("y");
        assert_ne!(
            key_of(&a, DedupMode::Content).expect("key"),
            key_of(&other_body, DedupMode::Content).expect("key")
        );
        let binary = Message {
            body: Body::binary("x"),
            ..Message::default()
        };
        assert_ne!(
            key_of(&a, DedupMode::Content).expect("key"),
            key_of(&binary, DedupMode::Content).expect("key")
        );
    }

    #[test]
    fn an_overlong_id_is_refused() {
        let m = with_id(MessageId::String("x".repeat(DEDUP_ID_BYTES_MAX + 1)));
        assert!(matches!(
            key_of(&m, DedupMode::Id),
            Err(BrokerError::ResourceLimit(_))
        ));
        let ok = with_id(MessageId::String("x".repeat(DEDUP_ID_BYTES_MAX)));
        assert!(key_of(&ok, DedupMode::Id).expect("key").is_some());
    }

    #[test]
    fn a_journaled_key_reads_back() {
        let key = [0xab; DEDUP_KEY_BYTES];
        let Record::State {
            key: text,
            value: Some(value),
        } = admitted_record(42, &key, 1_700_000_000_000)
        else {
            panic!("a dedup key is a State record with a value");
        };
        assert_eq!(
            decode_stored(&text, value).expect("key"),
            StoredKey {
                queue: 42,
                key,
                admitted_ms: 1_700_000_000_000
            }
        );
        assert!(decode_stored("$dedup/42/zz", Bytes::new()).is_err());
        assert!(matches!(
            forgotten_record(42, &key),
            Record::State { value: None, .. }
        ));
    }
}
