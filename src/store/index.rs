//! The live state of the journal and which records on disk still matter.
//!
//! The index is the replay function: recovery feeds it every record in
//! order, and the writer feeds it every record it has written, so both see
//! the same rules. For each key it remembers where its *live* record sits
//! (segment, entry offset, index in the entry), which lets compaction tell
//! live records from dead ones and count them per segment.
//!
//! Two kinds of records:
//!
//! - **State records** (`QueueDeclare`, `Bind`, `Message`, `DeliveryState`,
//!   `Retain` with a message, `State` with a value) carry the current value
//!   of a key. A state record is live while it is the newest record of a key
//!   that still exists. A `Message` is live while any queue holds its seq;
//!   when a seq is written twice (a compaction copy), the newest copy is the
//!   live one.
//! - **Tombstones** (`QueueDelete`, `Unbind`, `Ack`, `Retain`/`State` with
//!   `None`) remove a key. A tombstone is needed only while an *older*
//!   segment still holds a record it cancels: replaying that segment without
//!   the tombstone would resurrect the key. So each tombstone waits on the
//!   set of older segments that hold records of the keys it kills (their
//!   *history*), and dies when the last of them is deleted. A tombstone in
//!   the oldest segment is therefore always dead.
//!
//! Replay rules that make compaction copies harmless: a `Message` whose seq
//! is already present changes no placement; an `Ack` or `DeliveryState` for
//! a placement that does not exist is ignored; queue order is by seq.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use smallvec::SmallVec;

use super::opaque::Opaque;
use super::record::{BindingDef, MessageSeq, QueueDef, QueueId, Record};
use super::segment::SegmentId;

/// Where a record is on disk: segment, entry offset, position in the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Loc {
    /// Segment id.
    pub(crate) seg: SegmentId,
    /// Offset of the entry header in the segment file.
    pub(crate) entry: u64,
    /// Index of the record in the entry body.
    pub(crate) idx: u32,
}

/// A live record's location and encoded size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    loc: Loc,
    size: u32,
}

/// The segments that still hold any record (live or superseded) of a key,
/// oldest first. Usually one or two.
type History = SmallVec<[SegmentId; 2]>;

/// Per-segment liveness counters.
#[derive(Debug, Default, Clone)]
pub(crate) struct SegmentLive {
    /// Live records (state records and tombstones).
    pub(crate) live_records: u64,
    /// Encoded bytes of the live records.
    pub(crate) live_bytes: u64,
    /// Live tombstones among `live_records`.
    pub(crate) live_tombstones: u64,
    /// File size in bytes.
    pub(crate) file_bytes: u64,
    /// Tombstones in newer segments that wait for this one to go.
    waiting: Vec<u64>,
}

#[derive(Debug)]
struct Keyed<T> {
    value: T,
    slot: Slot,
    history: History,
}

/// Delivery bookkeeping of one message in one queue. There is one per
/// queued message and almost all are at their default (never delivered), so
/// the rare delivery state is boxed: 16 bytes instead of 80 per message.
#[derive(Debug, Clone, Default)]
pub(crate) struct Placement {
    /// The latest live `DeliveryState` record, when there is one.
    state: Option<Box<PlacementState>>,
}

#[derive(Debug, Clone)]
struct PlacementState {
    /// The state as the core encoded it.
    state: Bytes,
    ds: Slot,
}

impl Placement {
    /// The latest delivery state, as the core encoded it.
    pub(crate) fn state(&self) -> Option<&Bytes> {
        self.state.as_ref().map(|s| &s.state)
    }
}

/// The queues holding one message, by queue id. Almost always one queue,
/// and there is an entry per live message, so it is stored inline: a
/// `BTreeMap` here allocated a ~1 KiB node per queued message.
#[derive(Debug, Default)]
pub(crate) struct Placements(SmallVec<[(QueueId, Placement); 1]>);

impl Placements {
    fn position(&self, queue: QueueId) -> Result<usize, usize> {
        self.0.binary_search_by_key(&queue, |(q, _)| *q)
    }

    pub(crate) fn get(&self, queue: &QueueId) -> Option<&Placement> {
        let i = self.position(*queue).ok()?;
        self.0.get(i).map(|(_, p)| p)
    }

    pub(crate) fn get_mut(&mut self, queue: &QueueId) -> Option<&mut Placement> {
        let i = self.position(*queue).ok()?;
        self.0.get_mut(i).map(|(_, p)| p)
    }

    pub(crate) fn remove(&mut self, queue: &QueueId) -> Option<Placement> {
        let i = self.position(*queue).ok()?;
        Some(self.0.remove(i).1)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Queue ids, ascending.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &QueueId> + '_ {
        self.0.iter().map(|(q, _)| q)
    }

    /// (queue, placement), by ascending queue id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&QueueId, &Placement)> + '_ {
        self.0.iter().map(|(q, p)| (q, p))
    }
}

impl FromIterator<(QueueId, Placement)> for Placements {
    fn from_iter<I: IntoIterator<Item = (QueueId, Placement)>>(iter: I) -> Self {
        let mut v: SmallVec<[(QueueId, Placement); 1]> = iter.into_iter().collect();
        v.sort_by_key(|(q, _)| *q);
        v.dedup_by_key(|(q, _)| *q);
        Self(v)
    }
}

/// A live message.
#[derive(Debug)]
pub(crate) struct MessageEntry {
    slot: Slot,
    history: History,
    /// Queues holding it, with their delivery state.
    pub(crate) placements: Placements,
}

impl MessageEntry {
    /// Where its live `Message` record is (recovery reads it back from
    /// there; the index never keeps message bodies: the core owns them).
    pub(crate) fn loc(&self) -> Loc {
        self.slot.loc
    }
}

/// A live retained message.
#[derive(Debug)]
pub(crate) struct RetainedEntry {
    /// Its seq.
    pub(crate) seq: MessageSeq,
    /// The message while recovering, `None` afterwards.
    pub(crate) message: Option<Opaque>,
}

#[derive(Debug)]
struct Tombstone {
    seg: SegmentId,
    size: u32,
    pending: usize,
}

/// Live journal state plus per-segment liveness. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Index {
    segments: BTreeMap<SegmentId, SegmentLive>,
    queues: BTreeMap<QueueId, Keyed<QueueDef>>,
    bindings: BTreeMap<(QueueId, String), Keyed<BindingDef>>,
    /// Boxed: a B-tree leaf holds 11 values inline and is about half full
    /// when keys arrive in order, so an inline 80-byte entry cost about 165
    /// bytes per queued message; boxed it costs about 110.
    messages: BTreeMap<MessageSeq, Box<MessageEntry>>,
    queue_messages: HashMap<QueueId, BTreeSet<MessageSeq>>,
    retained: BTreeMap<String, Keyed<RetainedEntry>>,
    state: BTreeMap<String, Keyed<Bytes>>,
    tombstones: HashMap<u64, Tombstone>,
    next_tombstone: u64,
    live_records: u64,
    /// One past the largest message seq seen in any record.
    pub(crate) next_seq: MessageSeq,
    /// One past the largest queue id seen in any record.
    pub(crate) next_queue_id: QueueId,
}

/// Adds one live record to its segment's counters.
fn live_add(
    segments: &mut BTreeMap<SegmentId, SegmentLive>,
    total: &mut u64,
    slot: Slot,
    tombstone: bool,
) {
    let s = segments.entry(slot.loc.seg).or_default();
    s.live_records += 1;
    s.live_bytes += u64::from(slot.size);
    if tombstone {
        s.live_tombstones += 1;
    }
    *total += 1;
}

/// Removes one live record from its segment's counters.
fn live_sub(
    segments: &mut BTreeMap<SegmentId, SegmentLive>,
    total: &mut u64,
    seg: SegmentId,
    size: u32,
    tombstone: bool,
) {
    // A record is only ever counted live in a segment that exists, and only
    // subtracted once: the counters never underflow.
    let s = segments.get_mut(&seg);
    assert!(s.is_some(), "live record in unknown segment {seg}");
    if let Some(s) = s {
        assert!(
            s.live_records > 0 && s.live_bytes >= u64::from(size),
            "segment {seg} liveness underflow"
        );
        s.live_records -= 1;
        s.live_bytes -= u64::from(size);
        if tombstone {
            assert!(s.live_tombstones > 0, "segment {seg} tombstone underflow");
            s.live_tombstones -= 1;
        }
    }
    assert!(*total > 0, "live record total underflow");
    *total -= 1;
}

/// Notes that `seg` holds a record of the key with `history`.
fn touch(history: &mut History, seg: SegmentId, segments: &BTreeMap<SegmentId, SegmentLive>) {
    history.retain(|s| segments.contains_key(s));
    if history.last() != Some(&seg) {
        history.push(seg);
    }
}

impl Index {
    /// An empty index.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Registers a new (or recovered) segment.
    pub(crate) fn add_segment(&mut self, seg: SegmentId, file_bytes: u64) {
        let s = self.segments.entry(seg).or_default();
        s.file_bytes = file_bytes;
    }

    /// Updates the file size of a segment.
    pub(crate) fn set_file_bytes(&mut self, seg: SegmentId, file_bytes: u64) {
        if let Some(s) = self.segments.get_mut(&seg) {
            s.file_bytes = file_bytes;
        }
    }

    /// The segments, oldest first, with their counters.
    pub(crate) fn segments(&self) -> impl Iterator<Item = (SegmentId, &SegmentLive)> {
        self.segments.iter().map(|(id, s)| (*id, s))
    }

    /// Counters of one segment.
    pub(crate) fn segment(&self, seg: SegmentId) -> Option<&SegmentLive> {
        self.segments.get(&seg)
    }

    /// Live records in all segments.
    pub(crate) fn live_records(&self) -> u64 {
        self.live_records
    }

    /// Forgets a deleted segment and releases the tombstones waiting on it.
    /// The segment must hold no live record.
    pub(crate) fn remove_segment(&mut self, seg: SegmentId) {
        let Some(info) = self.segments.remove(&seg) else {
            return;
        };
        assert_eq!(
            info.live_records, 0,
            "removing segment {seg} with live records"
        );
        for id in info.waiting {
            let done = match self.tombstones.get_mut(&id) {
                Some(t) => {
                    assert!(t.pending > 0, "tombstone {id} over-released");
                    t.pending -= 1;
                    t.pending == 0
                }
                None => false,
            };
            if done {
                if let Some(t) = self.tombstones.remove(&id) {
                    live_sub(
                        &mut self.segments,
                        &mut self.live_records,
                        t.seg,
                        t.size,
                        true,
                    );
                }
            }
        }
    }

    /// Records a tombstone at `slot` that cancels records in `deps`.
    fn tombstone(&mut self, slot: Slot, deps: impl IntoIterator<Item = SegmentId>) {
        let mut deps: Vec<SegmentId> = deps
            .into_iter()
            .filter(|s| *s < slot.loc.seg && self.segments.contains_key(s))
            .collect();
        deps.sort_unstable();
        deps.dedup();
        if deps.is_empty() {
            // Nothing older to cancel: dead from birth.
            return;
        }
        let id = self.next_tombstone;
        self.next_tombstone += 1;
        for d in &deps {
            if let Some(s) = self.segments.get_mut(d) {
                s.waiting.push(id);
            }
        }
        self.tombstones.insert(
            id,
            Tombstone {
                seg: slot.loc.seg,
                size: slot.size,
                pending: deps.len(),
            },
        );
        live_add(&mut self.segments, &mut self.live_records, slot, true);
    }

    /// Applies one record found (or written) at `loc` with encoded `size`.
    /// `keep_messages` keeps the bodies of retained messages (recovery hands
    /// them out; queued messages are read back by location instead).
    pub(crate) fn apply(&mut self, rec: &Record, loc: Loc, size: u32, keep_messages: bool) {
        let slot = Slot { loc, size };
        if let Some(seq) = rec.seq() {
            self.next_seq = self.next_seq.max(seq.saturating_add(1));
        }
        if let Some(q) = rec.max_queue() {
            self.next_queue_id = self.next_queue_id.max(q.saturating_add(1));
        }
        match rec {
            Record::QueueDeclare(def) => {
                let segments = &mut self.segments;
                let total = &mut self.live_records;
                match self.queues.get_mut(&def.id) {
                    Some(k) => {
                        live_sub(segments, total, k.slot.loc.seg, k.slot.size, false);
                        k.value = def.clone();
                        k.slot = slot;
                        touch(&mut k.history, loc.seg, segments);
                    }
                    None => {
                        self.queues.insert(
                            def.id,
                            Keyed {
                                value: def.clone(),
                                slot,
                                history: smallvec::smallvec![loc.seg],
                            },
                        );
                    }
                }
                live_add(segments, total, slot, false);
            }
            Record::QueueDelete { queue } => self.delete_queue(*queue, slot),
            Record::Bind(def) => {
                let segments = &mut self.segments;
                let total = &mut self.live_records;
                let key = (def.queue, def.filter.clone());
                match self.bindings.get_mut(&key) {
                    Some(k) => {
                        live_sub(segments, total, k.slot.loc.seg, k.slot.size, false);
                        k.value = def.clone();
                        k.slot = slot;
                        touch(&mut k.history, loc.seg, segments);
                    }
                    None => {
                        self.bindings.insert(
                            key,
                            Keyed {
                                value: def.clone(),
                                slot,
                                history: smallvec::smallvec![loc.seg],
                            },
                        );
                    }
                }
                live_add(segments, total, slot, false);
            }
            Record::Unbind { queue, filter } => {
                let deps = match self.bindings.remove(&(*queue, filter.clone())) {
                    Some(k) => {
                        live_sub(
                            &mut self.segments,
                            &mut self.live_records,
                            k.slot.loc.seg,
                            k.slot.size,
                            false,
                        );
                        k.history
                    }
                    None => History::new(),
                };
                self.tombstone(slot, deps);
            }
            Record::Message { seq, queues, .. } => {
                // The body is not kept, even while recovering: recovery
                // reads each live message back from its location when the
                // core takes it, so a deep journal never sits in memory.
                self.put_message(*seq, queues, slot);
            }
            Record::Ack { queue, seq } => {
                let deps = self.remove_placement(*queue, *seq);
                if let Some(deps) = deps {
                    self.tombstone(slot, deps);
                }
            }
            Record::DeliveryState { queue, seq, state } => {
                let segments = &mut self.segments;
                let total = &mut self.live_records;
                let placement = self
                    .messages
                    .get_mut(seq)
                    .and_then(|m| m.placements.get_mut(queue));
                if let Some(p) = placement {
                    if let Some(old) = p.state.take() {
                        live_sub(segments, total, old.ds.loc.seg, old.ds.size, false);
                    }
                    p.state = Some(Box::new(PlacementState {
                        state: state.clone(),
                        ds: slot,
                    }));
                    live_add(segments, total, slot, false);
                }
            }
            Record::Retain { topic, message } => match message {
                Some((seq, m)) => {
                    let entry = RetainedEntry {
                        seq: *seq,
                        message: keep_messages.then(|| m.clone()),
                    };
                    Self::put_keyed(
                        &mut self.retained,
                        &mut self.segments,
                        &mut self.live_records,
                        topic,
                        entry,
                        slot,
                    );
                }
                None => {
                    let deps = Self::remove_keyed(
                        &mut self.retained,
                        &mut self.segments,
                        &mut self.live_records,
                        topic,
                    );
                    self.tombstone(slot, deps);
                }
            },
            Record::State { key, value } => match value {
                Some(v) => Self::put_keyed(
                    &mut self.state,
                    &mut self.segments,
                    &mut self.live_records,
                    key,
                    v.clone(),
                    slot,
                ),
                None => {
                    let deps = Self::remove_keyed(
                        &mut self.state,
                        &mut self.segments,
                        &mut self.live_records,
                        key,
                    );
                    self.tombstone(slot, deps);
                }
            },
        }
    }

    fn put_keyed<T>(
        map: &mut BTreeMap<String, Keyed<T>>,
        segments: &mut BTreeMap<SegmentId, SegmentLive>,
        total: &mut u64,
        key: &str,
        value: T,
        slot: Slot,
    ) {
        match map.get_mut(key) {
            Some(k) => {
                live_sub(segments, total, k.slot.loc.seg, k.slot.size, false);
                k.value = value;
                k.slot = slot;
                touch(&mut k.history, slot.loc.seg, segments);
            }
            None => {
                map.insert(
                    key.to_owned(),
                    Keyed {
                        value,
                        slot,
                        history: smallvec::smallvec![slot.loc.seg],
                    },
                );
            }
        }
        live_add(segments, total, slot, false);
    }

    fn remove_keyed<T>(
        map: &mut BTreeMap<String, Keyed<T>>,
        segments: &mut BTreeMap<SegmentId, SegmentLive>,
        total: &mut u64,
        key: &str,
    ) -> History {
        match map.remove(key) {
            Some(k) => {
                live_sub(segments, total, k.slot.loc.seg, k.slot.size, false);
                k.history
            }
            None => History::new(),
        }
    }

    fn put_message(&mut self, seq: MessageSeq, queues: &[QueueId], slot: Slot) {
        let segments = &mut self.segments;
        let total = &mut self.live_records;
        if let Some(m) = self.messages.get_mut(&seq) {
            // A copy (compaction rewrite, or replay after a crash between
            // rewrite and delete): placements stay as they are, the newest
            // copy becomes the live record.
            live_sub(segments, total, m.slot.loc.seg, m.slot.size, false);
            m.slot = slot;
            touch(&mut m.history, slot.loc.seg, segments);
            live_add(segments, total, slot, false);
            return;
        }
        let placements: Placements = queues.iter().map(|q| (*q, Placement::default())).collect();
        if placements.is_empty() {
            return; // held by no queue: dead from birth
        }
        for q in placements.keys() {
            self.queue_messages.entry(*q).or_default().insert(seq);
        }
        self.messages.insert(
            seq,
            Box::new(MessageEntry {
                slot,
                history: smallvec::smallvec![slot.loc.seg],
                placements,
            }),
        );
        live_add(segments, total, slot, false);
    }

    /// Removes `seq` from `queue`. Returns the segments holding records of
    /// the message (what the cancelling record must wait for), or `None`
    /// when there was no such placement.
    fn remove_placement(&mut self, queue: QueueId, seq: MessageSeq) -> Option<History> {
        let m = self.messages.get_mut(&seq)?;
        let p = m.placements.remove(&queue)?;
        if let Some(ds) = p.state.map(|s| s.ds) {
            live_sub(
                &mut self.segments,
                &mut self.live_records,
                ds.loc.seg,
                ds.size,
                false,
            );
        }
        if let Some(set) = self.queue_messages.get_mut(&queue) {
            set.remove(&seq);
            if set.is_empty() {
                self.queue_messages.remove(&queue);
            }
        }
        let history = m.history.clone();
        if m.placements.is_empty() {
            let slot = m.slot;
            self.messages.remove(&seq);
            live_sub(
                &mut self.segments,
                &mut self.live_records,
                slot.loc.seg,
                slot.size,
                false,
            );
        }
        Some(history)
    }

    fn delete_queue(&mut self, queue: QueueId, slot: Slot) {
        let mut deps: Vec<SegmentId> = Vec::new();
        if let Some(k) = self.queues.remove(&queue) {
            live_sub(
                &mut self.segments,
                &mut self.live_records,
                k.slot.loc.seg,
                k.slot.size,
                false,
            );
            deps.extend(k.history);
        }
        let keys: Vec<(QueueId, String)> = self
            .bindings
            .range((queue, String::new())..)
            .take_while(|((q, _), _)| *q == queue)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if let Some(k) = self.bindings.remove(&key) {
                live_sub(
                    &mut self.segments,
                    &mut self.live_records,
                    k.slot.loc.seg,
                    k.slot.size,
                    false,
                );
                deps.extend(k.history);
            }
        }
        let seqs: Vec<MessageSeq> = self
            .queue_messages
            .get(&queue)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for seq in seqs {
            if let Some(h) = self.remove_placement(queue, seq) {
                deps.extend(h);
            }
        }
        self.tombstone(slot, deps);
    }

    /// True if the record at `loc` (decoded as `rec`) is live: compaction
    /// copies exactly these forward. Tombstones are never copied (a segment
    /// with live tombstones is not rewritten).
    pub(crate) fn is_live_state(&self, rec: &Record, loc: Loc) -> bool {
        match rec {
            Record::QueueDeclare(def) => {
                self.queues.get(&def.id).is_some_and(|k| k.slot.loc == loc)
            }
            Record::Bind(def) => self
                .bindings
                .get(&(def.queue, def.filter.clone()))
                .is_some_and(|k| k.slot.loc == loc),
            Record::Message { seq, .. } => {
                self.messages.get(seq).is_some_and(|m| m.slot.loc == loc)
            }
            Record::DeliveryState { queue, seq, .. } => self
                .messages
                .get(seq)
                .and_then(|m| m.placements.get(queue))
                .is_some_and(|p| p.state.as_ref().is_some_and(|s| s.ds.loc == loc)),
            Record::Retain {
                topic,
                message: Some(_),
            } => self.retained.get(topic).is_some_and(|k| k.slot.loc == loc),
            Record::State {
                key,
                value: Some(_),
            } => self.state.get(key).is_some_and(|k| k.slot.loc == loc),
            Record::QueueDelete { .. }
            | Record::Unbind { .. }
            | Record::Ack { .. }
            | Record::Retain { message: None, .. }
            | Record::State { value: None, .. } => false,
        }
    }

    /// The live message `seq`.
    pub(crate) fn message(&self, seq: MessageSeq) -> Option<&MessageEntry> {
        self.messages.get(&seq).map(|m| &**m)
    }

    /// Live queue definitions, by id.
    pub(crate) fn queues(&self) -> impl Iterator<Item = &QueueDef> {
        self.queues.values().map(|k| &k.value)
    }

    /// Live bindings, by (queue, filter).
    pub(crate) fn bindings(&self) -> impl Iterator<Item = &BindingDef> {
        self.bindings.values().map(|k| &k.value)
    }

    /// Live messages, by seq.
    pub(crate) fn messages(&self) -> impl Iterator<Item = (MessageSeq, &MessageEntry)> {
        self.messages.iter().map(|(s, m)| (*s, &**m))
    }

    /// Live retained messages, by topic.
    pub(crate) fn retained(&self) -> impl Iterator<Item = (&str, &RetainedEntry)> {
        self.retained.iter().map(|(t, k)| (t.as_str(), &k.value))
    }

    /// Live state entries, by key.
    pub(crate) fn state(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.state.iter().map(|(k, v)| (k.as_str(), &v.value))
    }

    /// Drops the retained message bodies kept during recovery (the core
    /// owns them from now on).
    pub(crate) fn drop_messages(&mut self) {
        for r in self.retained.values_mut() {
            r.value.message = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(seq: MessageSeq, queues: &[QueueId]) -> Record {
        Record::Message {
            seq,
            queues: queues.to_vec(),
            body: Opaque::Bytes(bytes::Bytes::from_static(b"x")),
        }
    }

    fn at(seg: SegmentId, entry: u64) -> Loc {
        Loc { seg, entry, idx: 0 }
    }

    fn live(ix: &Index, seg: SegmentId) -> u64 {
        ix.segment(seg).map_or(0, |s| s.live_records)
    }

    #[test]
    fn ack_in_a_newer_segment_lives_until_the_message_segment_goes() {
        let mut ix = Index::new();
        ix.add_segment(1, 0);
        ix.add_segment(2, 0);
        ix.apply(&msg(1, &[7]), at(1, 0), 10, false);
        assert_eq!(live(&ix, 1), 1);
        ix.apply(&Record::Ack { queue: 7, seq: 1 }, at(2, 0), 5, false);
        assert_eq!(live(&ix, 1), 0, "message dead once acked");
        assert_eq!(live(&ix, 2), 1, "ack needed while segment 1 exists");
        ix.remove_segment(1);
        assert_eq!(live(&ix, 2), 0, "ack dead once segment 1 is gone");
        assert_eq!(ix.live_records(), 0);
    }

    #[test]
    fn ack_in_the_same_segment_is_dead_at_once() {
        let mut ix = Index::new();
        ix.add_segment(1, 0);
        ix.apply(&msg(1, &[7, 8]), at(1, 0), 10, false);
        ix.apply(&Record::Ack { queue: 7, seq: 1 }, at(1, 50), 5, false);
        assert_eq!(live(&ix, 1), 1, "message still held by 8");
        ix.apply(&Record::Ack { queue: 8, seq: 1 }, at(1, 60), 5, false);
        assert_eq!(live(&ix, 1), 0);
    }

    #[test]
    fn duplicate_message_is_a_noop_and_the_copy_becomes_live() {
        let mut ix = Index::new();
        for s in 1..=3 {
            ix.add_segment(s, 0);
        }
        ix.apply(&msg(1, &[7, 8]), at(1, 0), 10, false);
        ix.apply(&Record::Ack { queue: 7, seq: 1 }, at(2, 0), 5, false);
        // Compaction copy with only the queue that still holds it.
        ix.apply(&msg(1, &[8]), at(3, 0), 10, false);
        assert_eq!(live(&ix, 1), 0);
        assert_eq!(live(&ix, 3), 1);
        let placements: Vec<_> = ix
            .message(1)
            .map(|m| m.placements.keys().copied().collect())
            .unwrap_or_default();
        assert_eq!(placements, vec![8]);
        // Replaying the stale original again would also be a no-op.
        ix.apply(&msg(1, &[7, 8]), at(3, 100), 10, false);
        let placements: Vec<_> = ix
            .message(1)
            .map(|m| m.placements.keys().copied().collect())
            .unwrap_or_default();
        assert_eq!(placements, vec![8]);
    }

    #[test]
    fn queue_delete_kills_bindings_placements_and_waits_for_their_segments() {
        let mut ix = Index::new();
        for s in 1..=3 {
            ix.add_segment(s, 0);
        }
        ix.apply(
            &Record::QueueDeclare(QueueDef {
                id: 5,
                name: "q".into(),
                attributes: Bytes::from_static(b"permanent"),
            }),
            at(1, 0),
            10,
            false,
        );
        ix.apply(
            &Record::Bind(BindingDef {
                queue: 5,
                filter: "a/#".into(),
                options: Bytes::from_static(b"opts-1"),
            }),
            at(1, 1),
            10,
            false,
        );
        ix.apply(&msg(9, &[5]), at(2, 0), 10, false);
        ix.apply(
            &Record::DeliveryState {
                queue: 5,
                seq: 9,
                state: Bytes::from_static(b"ds-1-none"),
            },
            at(2, 1),
            10,
            false,
        );
        assert_eq!(live(&ix, 1), 2);
        assert_eq!(live(&ix, 2), 2);
        ix.apply(&Record::QueueDelete { queue: 5 }, at(3, 0), 8, false);
        assert_eq!(live(&ix, 1), 0);
        assert_eq!(live(&ix, 2), 0);
        assert_eq!(live(&ix, 3), 1);
        assert_eq!(ix.queues().count(), 0);
        assert_eq!(ix.bindings().count(), 0);
        assert_eq!(ix.messages().count(), 0);
        ix.remove_segment(2);
        assert_eq!(live(&ix, 3), 1, "still waits for segment 1");
        ix.remove_segment(1);
        assert_eq!(live(&ix, 3), 0);
        assert_eq!(ix.next_queue_id, 6);
        assert_eq!(ix.next_seq, 10);
    }

    #[test]
    fn state_delete_waits_for_every_older_version() {
        let mut ix = Index::new();
        for s in 1..=3 {
            ix.add_segment(s, 0);
        }
        let set = |v: &'static [u8]| Record::State {
            key: "k".into(),
            value: Some(Bytes::from_static(v)),
        };
        ix.apply(&set(b"1"), at(1, 0), 4, false);
        ix.apply(&set(b"2"), at(2, 0), 4, false);
        assert_eq!(live(&ix, 1), 0, "superseded");
        ix.apply(
            &Record::State {
                key: "k".into(),
                value: None,
            },
            at(3, 0),
            4,
            false,
        );
        ix.remove_segment(2);
        assert_eq!(live(&ix, 3), 1, "v1 in segment 1 would resurrect");
        ix.remove_segment(1);
        assert_eq!(live(&ix, 3), 0);
    }

    #[test]
    fn delivery_state_for_unknown_placement_is_ignored() {
        let mut ix = Index::new();
        ix.add_segment(1, 0);
        ix.apply(
            &Record::DeliveryState {
                queue: 1,
                seq: 1,
                state: Bytes::from_static(b"ds-3-none"),
            },
            at(1, 0),
            4,
            false,
        );
        assert_eq!(ix.live_records(), 0);
        ix.apply(&Record::Ack { queue: 1, seq: 1 }, at(1, 1), 4, false);
        assert_eq!(ix.live_records(), 0);
    }
}
