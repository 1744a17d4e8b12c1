//! Journal record types and their versioned binary encoding.
//!
//! An entry body (one [`Store::append`](super::Store::append) call) is:
//!
//! ```text
//! record_count: u32
//! record*:      tag: u8 | version: u8 | payload_len: u32 | payload
//! ```
//!
//! The tag names the record kind, the version its payload layout, so a later
//! build can add kinds and evolve layouts while still reading old journals.
//! A reader that meets a tag or version it does not know stops with a typed
//! error rather than guessing.
//!
//! The store reads only what it needs to keep records live and compact
//! them: kinds and keys (queue id, seq, filter, topic, state key). What the
//! core says about a message, a binding or a delivery is opaque bytes at
//! the end of the payload, encoded and decoded by the core
//! (`rosetta_core::codec`). Version 1 journals were written when the store
//! still decoded queue lifetimes, binding options and delivery states; their
//! bytes sit where the opaque tails sit now and the core reads them in that
//! same layout, so those journals still open unchanged.
//!
//! | tag | kind           | payload (version 1)                                               |
//! |-----|----------------|-------------------------------------------------------------------|
//! | 1   | QueueDeclare   | id u64, name str, attributes (opaque, to the end)                 |
//! | 2   | QueueDelete    | queue u64                                                         |
//! | 3   | Bind           | queue u64, filter str, options (opaque, to the end)               |
//! | 4   | Unbind         | queue u64, filter str                                             |
//! | 5   | Message        | seq u64, queue count u32, queue u64*, body (opaque, to the end)   |
//! | 6   | Ack            | queue u64, seq u64                                                |
//! | 7   | DeliveryState  | queue u64, seq u64, state (opaque, to the end)                    |
//! | 8   | Retain         | topic str, present bool, [seq u64, body (opaque, to the end)]     |
//! | 9   | State          | key str, value opt bytes                                          |

use bytes::Bytes;

use super::opaque::Opaque;
use super::wire::{self, DecodeError, Reader};

/// Identifies a queue in the journal. Assigned by the core.
pub type QueueId = u64;
/// A globally unique, increasing message number. Assigned by the core.
pub type MessageSeq = u64;

/// A durable queue definition.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDef {
    /// Queue id.
    pub id: QueueId,
    /// Queue name (the store names queues in its recovery reports).
    pub name: String,
    /// What the core keeps about the queue (its lifetime), encoded by the
    /// core.
    pub attributes: Bytes,
}

/// A durable binding of a queue to a topic filter.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingDef {
    /// The bound queue.
    pub queue: QueueId,
    /// The topic filter.
    pub filter: String,
    /// The binding's options, encoded by the core.
    pub options: Bytes,
}

/// One journal record. See the module docs for the encoding and the crate
/// docs of [`super`] for what each kind means on replay.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// Declares (or re-declares, replacing) a queue.
    QueueDeclare(QueueDef),
    /// Deletes a queue with its bindings, its message placements and their
    /// delivery states.
    QueueDelete {
        /// The queue.
        queue: QueueId,
    },
    /// Binds a queue to a filter; key `(queue, filter)`, a later bind replaces.
    Bind(BindingDef),
    /// Removes the binding `(queue, filter)`.
    Unbind {
        /// The queue.
        queue: QueueId,
        /// The filter.
        filter: String,
    },
    /// A message placed on `queues`. Replaying a `seq` that is already
    /// present is a no-op.
    Message {
        /// Message number.
        seq: MessageSeq,
        /// Queues holding it.
        queues: Vec<QueueId>,
        /// The message, encoded by the core.
        body: Opaque,
    },
    /// Removes message `seq` from `queue`.
    Ack {
        /// The queue.
        queue: QueueId,
        /// The message.
        seq: MessageSeq,
    },
    /// Delivery bookkeeping of `seq` in `queue`; the latest wins.
    DeliveryState {
        /// The queue.
        queue: QueueId,
        /// The message.
        seq: MessageSeq,
        /// The delivery state (attempts, annotations), encoded by the core.
        state: Bytes,
    },
    /// Sets (`Some`) or clears (`None`) the retained message of a topic.
    Retain {
        /// The topic.
        topic: String,
        /// The retained message's number and body (encoded by the core).
        message: Option<(MessageSeq, Opaque)>,
    },
    /// Generic durable key/value state; `None` deletes the key.
    State {
        /// The key.
        key: String,
        /// The value.
        value: Option<Bytes>,
    },
}

/// Current payload layout version of every record kind.
pub const RECORD_VERSION: u8 = 1;

/// Bytes of a record's frame in front of its payload (tag, version, length).
pub const RECORD_FRAME_BYTES: usize = 6;

/// Smallest encoded record (a `State` delete with an empty key: frame + 4-byte
/// length + presence byte), to bound a decoded record count.
const RECORD_ENCODED_MIN_BYTES: usize = RECORD_FRAME_BYTES + 5;

mod tag {
    pub(super) const QUEUE_DECLARE: u8 = 1;
    pub(super) const QUEUE_DELETE: u8 = 2;
    pub(super) const BIND: u8 = 3;
    pub(super) const UNBIND: u8 = 4;
    pub(super) const MESSAGE: u8 = 5;
    pub(super) const ACK: u8 = 6;
    pub(super) const DELIVERY_STATE: u8 = 7;
    pub(super) const RETAIN: u8 = 8;
    pub(super) const STATE: u8 = 9;
}

impl Record {
    fn tag(&self) -> u8 {
        match self {
            Record::QueueDeclare(_) => tag::QUEUE_DECLARE,
            Record::QueueDelete { .. } => tag::QUEUE_DELETE,
            Record::Bind(_) => tag::BIND,
            Record::Unbind { .. } => tag::UNBIND,
            Record::Message { .. } => tag::MESSAGE,
            Record::Ack { .. } => tag::ACK,
            Record::DeliveryState { .. } => tag::DELIVERY_STATE,
            Record::Retain { .. } => tag::RETAIN,
            Record::State { .. } => tag::STATE,
        }
    }

    fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Record::QueueDeclare(def) => {
                wire::put_u64(out, def.id);
                wire::put_str(out, &def.name);
                out.extend_from_slice(&def.attributes);
            }
            Record::QueueDelete { queue } => wire::put_u64(out, *queue),
            Record::Bind(b) => {
                wire::put_u64(out, b.queue);
                wire::put_str(out, &b.filter);
                out.extend_from_slice(&b.options);
            }
            Record::Unbind { queue, filter } => {
                wire::put_u64(out, *queue);
                wire::put_str(out, filter);
            }
            Record::Message { seq, queues, body } => {
                wire::put_u64(out, *seq);
                wire::put_len(out, queues.len());
                for q in queues {
                    wire::put_u64(out, *q);
                }
                body.write_to(out);
            }
            Record::Ack { queue, seq } => {
                wire::put_u64(out, *queue);
                wire::put_u64(out, *seq);
            }
            Record::DeliveryState { queue, seq, state } => {
                wire::put_u64(out, *queue);
                wire::put_u64(out, *seq);
                out.extend_from_slice(state);
            }
            Record::Retain { topic, message } => {
                wire::put_str(out, topic);
                match message {
                    None => wire::put_bool(out, false),
                    Some((seq, body)) => {
                        wire::put_bool(out, true);
                        wire::put_u64(out, *seq);
                        body.write_to(out);
                    }
                }
            }
            Record::State { key, value } => {
                wire::put_str(out, key);
                wire::put_opt_bytes(out, value.as_deref());
            }
        }
    }

    fn decode_payload(tag: u8, r: &mut Reader<'_>) -> Result<Record, DecodeError> {
        Ok(match tag {
            tag::QUEUE_DECLARE => {
                let id = r.u64("queue id")?;
                let name = r.string("queue name")?;
                let attributes = r.rest();
                Record::QueueDeclare(QueueDef {
                    id,
                    name,
                    attributes,
                })
            }
            tag::QUEUE_DELETE => Record::QueueDelete {
                queue: r.u64("queue id")?,
            },
            tag::BIND => Record::Bind(BindingDef {
                queue: r.u64("queue id")?,
                filter: r.string("filter")?,
                options: r.rest(),
            }),
            tag::UNBIND => Record::Unbind {
                queue: r.u64("queue id")?,
                filter: r.string("filter")?,
            },
            tag::MESSAGE => {
                let seq = r.u64("seq")?;
                let n = r.count(8, "queue count")?;
                let mut queues = Vec::with_capacity(n);
                for _ in 0..n {
                    queues.push(r.u64("queue id")?);
                }
                let body = Opaque::Bytes(r.rest());
                Record::Message { seq, queues, body }
            }
            tag::ACK => Record::Ack {
                queue: r.u64("queue id")?,
                seq: r.u64("seq")?,
            },
            tag::DELIVERY_STATE => Record::DeliveryState {
                queue: r.u64("queue id")?,
                seq: r.u64("seq")?,
                state: r.rest(),
            },
            tag::RETAIN => {
                let topic = r.string("topic")?;
                let message = if r.bool("retain present")? {
                    let seq = r.u64("seq")?;
                    Some((seq, Opaque::Bytes(r.rest())))
                } else {
                    None
                };
                Record::Retain { topic, message }
            }
            tag::STATE => Record::State {
                key: r.string("state key")?,
                value: r.opt_bytes("state value")?,
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "record",
                    tag,
                })
            }
        })
    }

    /// Every message sequence number this record mentions.
    pub(crate) fn seq(&self) -> Option<MessageSeq> {
        match self {
            Record::Message { seq, .. }
            | Record::Ack { seq, .. }
            | Record::DeliveryState { seq, .. } => Some(*seq),
            Record::Retain {
                message: Some((seq, _)),
                ..
            } => Some(*seq),
            _ => None,
        }
    }

    /// The largest queue id this record mentions.
    pub(crate) fn max_queue(&self) -> Option<QueueId> {
        match self {
            Record::QueueDeclare(d) => Some(d.id),
            Record::Bind(b) => Some(b.queue),
            Record::QueueDelete { queue }
            | Record::Unbind { queue, .. }
            | Record::Ack { queue, .. }
            | Record::DeliveryState { queue, .. } => Some(*queue),
            Record::Message { queues, .. } => queues.iter().copied().max(),
            Record::Retain { .. } | Record::State { .. } => None,
        }
    }
}

/// Encodes `records` as one entry body into `out` (cleared first) and
/// returns each record's encoded size in bytes, frame included.
pub(crate) fn encode_body(records: &[Record], out: &mut Vec<u8>) -> Vec<u32> {
    out.clear();
    wire::put_len(out, records.len());
    let mut sizes = Vec::with_capacity(records.len());
    for rec in records {
        let start = out.len();
        wire::put_u8(out, rec.tag());
        wire::put_u8(out, RECORD_VERSION);
        wire::put_u32(out, 0); // payload length, patched below
        rec.encode_payload(out);
        let payload = out.len() - start - RECORD_FRAME_BYTES;
        let len = u32::try_from(payload).unwrap_or(u32::MAX);
        out[start + 2..start + RECORD_FRAME_BYTES].copy_from_slice(&len.to_le_bytes());
        sizes.push(u32::try_from(out.len() - start).unwrap_or(u32::MAX));
    }
    // Paired with the checks in `decode_body`: the frame sizes add up to the
    // body, so a reader that walks the frames ends exactly at the end.
    assert_eq!(
        4 + sizes.iter().map(|s| *s as usize).sum::<usize>(),
        out.len(),
        "record frames must tile the entry body"
    );
    sizes
}

/// Decodes an entry body into its records, each with its encoded size.
pub(crate) fn decode_body(body: Bytes) -> Result<Vec<(Record, u32)>, DecodeError> {
    let mut r = Reader::new(&body);
    let n = r.count(RECORD_ENCODED_MIN_BYTES, "record count")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (tag, payload) = record_frame(&mut r)?;
        let len = payload.len();
        let mut payload = Reader::new(&payload);
        let rec = Record::decode_payload(tag, &mut payload)?;
        payload.finish("record payload")?;
        out.push((
            rec,
            u32::try_from(len + RECORD_FRAME_BYTES).unwrap_or(u32::MAX),
        ));
    }
    r.finish("entry body")?;
    Ok(out)
}

/// Reads one record's frame (tag, version, length) and returns its tag and
/// payload, undecoded.
fn record_frame(r: &mut Reader<'_>) -> Result<(u8, Bytes), DecodeError> {
    let tag = r.u8("record tag")?;
    let version = r.u8("record version")?;
    if version != RECORD_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            what: "record",
            version,
        });
    }
    let len = r.length("record payload")?;
    Ok((tag, r.take(len, "record payload")?))
}

/// Decodes only record `idx` of an entry body (recovery reading one
/// message back by its location). The record's bytes are copied out first,
/// so what it decodes to (payloads are slices) pins only its own bytes, not
/// the entry or the read buffer around it.
pub(crate) fn decode_record_at(body: &Bytes, idx: u32) -> Result<Record, DecodeError> {
    let mut r = Reader::new(body);
    let n = r.count(RECORD_ENCODED_MIN_BYTES, "record count")?;
    let idx = usize::try_from(idx).unwrap_or(usize::MAX);
    if idx >= n {
        return Err(DecodeError::Truncated {
            what: "entry records (a location past its last record)",
            need: idx.saturating_add(1),
            have: n,
        });
    }
    for _ in 0..idx {
        record_frame(&mut r)?;
    }
    let (tag, payload) = record_frame(&mut r)?;
    let payload = Bytes::copy_from_slice(&payload);
    let mut payload = Reader::new(&payload);
    let rec = Record::decode_payload(tag, &mut payload)?;
    payload.finish("record payload")?;
    Ok(rec)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample_records() -> Vec<Record> {
        // What the core would have encoded; the store never looks inside.
        let m = Opaque::Bytes(Bytes::from_static(b"\x01an encoded message"));
        vec![
            Record::QueueDeclare(QueueDef {
                id: 1,
                name: "q".into(),
                attributes: Bytes::from_static(b"permanent"),
            }),
            Record::QueueDeclare(QueueDef {
                id: 2,
                name: "session/x".into(),
                attributes: Bytes::from_static(b"idle 3_600_000"),
            }),
            Record::QueueDelete { queue: 2 },
            Record::Bind(BindingDef {
                queue: 1,
                filter: "a/+/c".into(),
                options: Bytes::from_static(b"opts-2"),
            }),
            Record::Bind(BindingDef {
                queue: 1,
                filter: "#".into(),
                options: Bytes::from_static(b"opts-0"),
            }),
            Record::Unbind {
                queue: 1,
                filter: "#".into(),
            },
            Record::Message {
                seq: 10,
                queues: vec![1, 3],
                body: m.clone(),
            },
            Record::Ack { queue: 3, seq: 10 },
            Record::DeliveryState {
                queue: 1,
                seq: 10,
                state: Bytes::from_static(b"ds-2-ann"),
            },
            Record::DeliveryState {
                queue: 1,
                seq: 10,
                state: Bytes::from_static(b"ds-3-none"),
            },
            Record::Retain {
                topic: "a/b/c".into(),
                message: Some((11, m)),
            },
            Record::Retain {
                topic: "a/b/d".into(),
                message: None,
            },
            Record::State {
                key: "k".into(),
                value: Some(Bytes::from_static(b"v")),
            },
            Record::State {
                key: "k2".into(),
                value: None,
            },
        ]
    }

    #[test]
    fn every_record_kind_round_trips() {
        let records = sample_records();
        let mut body = Vec::new();
        let sizes = encode_body(&records, &mut body);
        let back = match decode_body(Bytes::from(body)) {
            Ok(b) => b,
            Err(e) => panic!("decode: {e}"),
        };
        assert_eq!(back.len(), records.len());
        for ((rec, size), (want, want_size)) in back.iter().zip(records.iter().zip(sizes)) {
            assert_eq!(rec, want);
            assert_eq!(*size, want_size);
        }
    }

    #[test]
    fn one_record_at_a_time_round_trips() {
        for rec in sample_records() {
            let mut body = Vec::new();
            encode_body(std::slice::from_ref(&rec), &mut body);
            let back = decode_body(Bytes::from(body));
            assert_eq!(
                back.map(|v| v.into_iter().map(|(r, _)| r).collect::<Vec<_>>()),
                Ok(vec![rec])
            );
        }
    }

    #[test]
    fn unknown_tag_and_version_are_typed_errors() {
        let mut body = Vec::new();
        encode_body(&[Record::QueueDelete { queue: 1 }], &mut body);
        let mut bad_tag = body.clone();
        bad_tag[4] = 200;
        assert_eq!(
            decode_body(Bytes::from(bad_tag)),
            Err(DecodeError::BadTag {
                what: "record",
                tag: 200
            })
        );
        let mut bad_version = body;
        bad_version[5] = 9;
        assert_eq!(
            decode_body(Bytes::from(bad_version)),
            Err(DecodeError::UnsupportedVersion {
                what: "record",
                version: 9
            })
        );
    }

    #[test]
    fn corrupt_bodies_never_panic() {
        let mut body = Vec::new();
        encode_body(&sample_records(), &mut body);
        for cut in 0..body.len() {
            assert!(decode_body(Bytes::copy_from_slice(&body[..cut])).is_err());
        }
        for i in 0..body.len() {
            let mut bad = body.clone();
            bad[i] = bad[i].wrapping_add(1);
            let _ = decode_body(Bytes::from(bad));
        }
    }
}
