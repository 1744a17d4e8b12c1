//! The core's part of three journal records, kept by the store as opaque
//! bytes at the end of the record (see `rosetta_store::record`):
//!
//! | record        | opaque tail                                                                   |
//! |---------------|-------------------------------------------------------------------------------|
//! | QueueDeclare  | lifetime `u8` (0 permanent, 1 idle-for, then its milliseconds `u64`)           |
//! | Bind          | max qos `u8`, subscription id optional `u32`, no-local `u8` bool, retain-as-published `u8` bool, owner optional string, then (only when there are any) the excluded filters: count `u32`, each a string |
//! | DeliveryState | delivery count `u32`, annotation optional bytes, then (only when set) the redelivery time `u64` ms |
//!
//! These are the layouts the store itself wrote and read in version 1 of
//! those records, byte for byte, so journals written before the store
//! stopped decoding them still open. A new field goes at the end, read only
//! when bytes remain.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rosetta_neutral::{BindingOptions, Guarantee, QueueLifetime, RetainedOnBind};
use rosetta_store::wire::{self, DecodeError, Reader};
use rosetta_store::{BindingDef, MessageSeq, QueueDef, QueueId, Record};

/// A queue's attributes as the journal keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredQueue {
    /// How long it lives: `Permanent` or `IdleFor` (the other lifetimes
    /// end with the process, so such queues are never journaled).
    pub lifetime: QueueLifetime,
}

/// The QueueDeclare record of queue `id`, or its re-declaration with a new
/// lifetime.
pub fn queue_declare_record(id: QueueId, name: &str, lifetime: QueueLifetime) -> Record {
    let mut out = Vec::with_capacity(9);
    match lifetime {
        QueueLifetime::IdleFor(d) => {
            wire::put_u8(&mut out, 1);
            wire::put_u64(&mut out, u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        }
        _ => wire::put_u8(&mut out, 0),
    }
    Record::QueueDeclare(QueueDef {
        id,
        name: name.to_owned(),
        attributes: out.into(),
    })
}

/// The attributes of a recovered QueueDeclare record.
pub fn decode_queue(attributes: Bytes) -> Result<StoredQueue, DecodeError> {
    let mut r = Reader::new(&attributes);
    let lifetime = match r.u8("lifetime")? {
        0 => QueueLifetime::Permanent,
        1 => QueueLifetime::IdleFor(Duration::from_millis(r.u64("idle ms")?)),
        tag => {
            return Err(DecodeError::BadTag {
                what: "lifetime",
                tag,
            })
        }
    };
    Ok(StoredQueue { lifetime })
}

/// A binding's options as the journal keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBinding {
    /// The options (`retained` is not kept: it applies when binding).
    pub options: BindingOptions,
    /// The client that owns the binding, if any.
    pub owner: Option<Arc<str>>,
}

/// A delivered message's state as the journal keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredDelivery {
    /// Delivery attempts so far.
    pub delivery_count: u32,
    /// Annotations a consumer added (AMQP `modified` message-annotations).
    pub annotation: Option<Bytes>,
    /// Not to be offered again before this time (ms since the epoch): it
    /// came back with a redelivery delay. Written only when set, so a
    /// record without it has the version 1 bytes.
    pub redeliver_at_ms: Option<u64>,
}

/// The Bind record for `filter` on `queue`.
pub fn bind_record(
    queue: QueueId,
    filter: &str,
    options: &BindingOptions,
    owner: Option<&str>,
) -> Record {
    let mut out = Vec::with_capacity(16 + owner.map_or(0, str::len));
    wire::put_u8(&mut out, options.max_guarantee.qos());
    wire::put_opt_u32(&mut out, options.subscription_id);
    wire::put_bool(&mut out, options.no_local);
    wire::put_bool(&mut out, options.retain_as_published);
    wire::put_opt_str(&mut out, owner);
    if !options.excluded.is_empty() {
        wire::put_len(&mut out, options.excluded.len());
        for filter in &options.excluded {
            wire::put_str(&mut out, filter);
        }
    }
    Record::Bind(BindingDef {
        queue,
        filter: filter.to_owned(),
        options: out.into(),
    })
}

/// The options of a recovered Bind record.
pub fn decode_binding(options: Bytes) -> Result<StoredBinding, DecodeError> {
    let mut r = Reader::new(&options);
    let qos = r.u8("max qos")?;
    let max_guarantee = Guarantee::from_qos(qos).ok_or(DecodeError::BadTag {
        what: "max qos",
        tag: qos,
    })?;
    let mut options = BindingOptions {
        max_guarantee,
        subscription_id: r.opt_u32("subscription id")?,
        no_local: r.bool("no local")?,
        retain_as_published: r.bool("retain as published")?,
        retained: RetainedOnBind::None,
        excluded: Default::default(),
    };
    let owner = r.opt_string("owner")?.map(Arc::from);
    if r.remaining() > 0 {
        // Each filter is at least its 4-byte length.
        let n = r.count(4, "excluded filters")?;
        options.excluded = (0..n)
            .map(|_| r.string("excluded filter"))
            .collect::<Result<Vec<String>, _>>()?
            .into();
    }
    Ok(StoredBinding { options, owner })
}

/// The DeliveryState record of message `seq` in `queue`.
pub fn delivery_state_record(
    queue: QueueId,
    seq: MessageSeq,
    delivery_count: u32,
    annotation: Option<&Bytes>,
    redeliver_at_ms: Option<u64>,
) -> Record {
    let mut out = Vec::with_capacity(17 + annotation.map_or(0, Bytes::len));
    wire::put_u32(&mut out, delivery_count);
    wire::put_opt_bytes(&mut out, annotation.map(|a| &a[..]));
    if let Some(at) = redeliver_at_ms {
        wire::put_u64(&mut out, at);
    }
    Record::DeliveryState {
        queue,
        seq,
        state: out.into(),
    }
}

/// The state of a recovered DeliveryState record.
pub fn decode_delivery_state(state: Bytes) -> Result<StoredDelivery, DecodeError> {
    let mut r = Reader::new(&state);
    let delivery_count = r.u32("delivery count")?;
    let annotation = r.opt_bytes("annotation")?;
    let redeliver_at_ms = if r.remaining() > 0 {
        Some(r.u64("redelivery time")?)
    } else {
        None
    };
    Ok(StoredDelivery {
        delivery_count,
        annotation,
        redeliver_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(record: &Record) -> Bytes {
        match record {
            Record::QueueDeclare(q) => q.attributes.clone(),
            Record::Bind(b) => b.options.clone(),
            Record::DeliveryState { state, .. } => state.clone(),
            other => panic!("not a record with a tail: {other:?}"),
        }
    }

    #[test]
    fn binding_options_round_trip() {
        let options = BindingOptions {
            max_guarantee: Guarantee::AtLeastOnce,
            subscription_id: Some(7),
            no_local: true,
            retain_as_published: true,
            retained: RetainedOnBind::Send,
            excluded: vec!["a/secret".into(), "a/+/x".into()].into(),
        };
        let r = bind_record(3, "a/+", &options, Some("client-1"));
        let back = decode_binding(tail(&r)).expect("decodes");
        assert_eq!(back.options.max_guarantee, Guarantee::AtLeastOnce);
        assert_eq!(back.options.subscription_id, Some(7));
        assert!(back.options.no_local && back.options.retain_as_published);
        // Not kept: it only applies at bind time.
        assert_eq!(back.options.retained, RetainedOnBind::None);
        assert_eq!(back.owner.as_deref(), Some("client-1"));
        assert_eq!(back.options.excluded.as_slice(), ["a/secret", "a/+/x"]);
    }

    #[test]
    fn a_corrupt_count_of_excluded_filters_is_an_error() {
        let options = BindingOptions {
            excluded: vec!["x".into()].into(),
            ..BindingOptions::default()
        };
        let mut bytes = tail(&bind_record(1, "#", &options, None)).to_vec();
        // The count follows the owner's absent marker; claim a million.
        let at = bytes.len() - (4 + 4 + 1);
        bytes[at..at + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
        assert!(decode_binding(Bytes::from(bytes)).is_err());
    }

    #[test]
    fn binding_tail_is_the_version_1_layout() {
        // What the store wrote when it encoded the options itself: qos 1,
        // subscription id 3 (present), no-local, not retain-as-published,
        // owner "c".
        let v1: &[u8] = &[1, 1, 3, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0, b'c'];
        let options = BindingOptions {
            max_guarantee: Guarantee::AtLeastOnce,
            subscription_id: Some(3),
            no_local: true,
            ..BindingOptions::default()
        };
        assert_eq!(&tail(&bind_record(1, "a/#", &options, Some("c")))[..], v1);
        let back = decode_binding(Bytes::from_static(v1)).expect("decodes");
        assert_eq!(back.options, options);
    }

    #[test]
    fn delivery_state_round_trips_in_the_version_1_layout() {
        let ann = Bytes::from_static(b"ann");
        let r = delivery_state_record(2, 5, 4, Some(&ann), None);
        assert_eq!(
            &tail(&r)[..],
            &[4, 0, 0, 0, 1, 3, 0, 0, 0, b'a', b'n', b'n']
        );
        let back = decode_delivery_state(tail(&r)).expect("decodes");
        assert_eq!(back.delivery_count, 4);
        assert_eq!(back.annotation, Some(ann));
        assert_eq!(back.redeliver_at_ms, None);
        let none = decode_delivery_state(tail(&delivery_state_record(2, 5, 1, None, None)));
        assert_eq!(none.expect("decodes").annotation, None);
    }

    #[test]
    fn a_redelivery_time_follows_the_version_1_layout() {
        let r = delivery_state_record(2, 5, 3, None, Some(0x0102));
        assert_eq!(
            &tail(&r)[..],
            &[3, 0, 0, 0, 0, 0x02, 0x01, 0, 0, 0, 0, 0, 0],
            "the version 1 bytes, then the time"
        );
        let back = decode_delivery_state(tail(&r)).expect("decodes");
        assert_eq!(
            (back.delivery_count, back.redeliver_at_ms),
            (3, Some(0x0102))
        );
        assert!(
            decode_delivery_state(Bytes::from_static(&[3, 0, 0, 0, 0, 1, 2])).is_err(),
            "a cut time is an error, not a missing one"
        );
    }

    #[test]
    fn queue_lifetimes_round_trip_in_the_version_1_layout() {
        let idle = queue_declare_record(2, "q", QueueLifetime::IdleFor(Duration::from_secs(60)));
        assert_eq!(&tail(&idle)[..], &[1, 0x60, 0xea, 0, 0, 0, 0, 0, 0]);
        let back = decode_queue(tail(&idle)).expect("decodes");
        assert_eq!(
            back.lifetime,
            QueueLifetime::IdleFor(Duration::from_secs(60))
        );
        let permanent = queue_declare_record(1, "q", QueueLifetime::Permanent);
        assert_eq!(&tail(&permanent)[..], &[0]);
        assert_eq!(
            decode_queue(tail(&permanent)).expect("decodes").lifetime,
            QueueLifetime::Permanent
        );
        assert!(decode_queue(Bytes::from_static(&[2])).is_err());
    }

    #[test]
    fn a_short_tail_is_an_error_not_a_default() {
        assert!(decode_binding(Bytes::new()).is_err());
        assert!(decode_delivery_state(Bytes::from_static(&[1, 0])).is_err());
        // A qos that is no qos.
        assert!(decode_binding(Bytes::from_static(&[9, 0, 0, 0, 0])).is_err());
    }
}
