//! Hand-written decoding of the two performatives that come once per
//! message: `transfer` and `disposition`.
//!
//! Why: decoding them through `serde_amqp` was the largest single cost of
//! a message through the broker (about 15% of its CPU in the AMQP
//! benchmark: a visitor per field, a format-code conversion per byte
//! read). These decoders read the common shapes directly. Anything else
//! (a described outcome other than accepted/released, a delivery state on
//! a transfer, an unusual encoding) is answered with `None`, and the
//! caller decodes it with `serde_amqp` as before, errors included. A
//! `Some` is exactly what `serde_amqp` would have produced (a proptest
//! checks that). Descriptors are read in either form (§1.5: symbol or
//! ulong) by `descriptor`.

use fe2o3_amqp_types::definitions::{Handle, ReceiverSettleMode, Role};
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState, Released};
use fe2o3_amqp_types::performatives::{Disposition, Performative, Transfer};

const TRANSFER: u8 = 0x14;
const DISPOSITION: u8 = 0x15;
const ACCEPTED: u8 = 0x24;
const RELEASED: u8 = 0x26;

/// A transfer or disposition decoded without serde, or `None` to take the
/// general path. `buf` is exactly the performative's bytes.
pub(crate) fn performative(buf: &[u8]) -> Option<Performative> {
    let mut r = Reader { buf, pos: 0 };
    let code = r.descriptor()?;
    let (count, end) = r.list_header()?;
    if end != buf.len() {
        return None;
    }
    let perf = match code {
        TRANSFER => Performative::Transfer(transfer(&mut r, count)?),
        DISPOSITION => Performative::Disposition(disposition(&mut r, count)?),
        _ => return None,
    };
    // The whole performative, nothing more: anything else is for serde.
    (r.pos == buf.len()).then_some(perf)
}

fn transfer(r: &mut Reader<'_>, count: u32) -> Option<Transfer> {
    if count == 0 || count > 11 {
        return None;
    }
    let mut t = Transfer {
        // Required: a null handle is an error serde reports.
        handle: Handle(r.uint()??),
        delivery_id: None,
        delivery_tag: None,
        message_format: None,
        settled: None,
        more: false,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    };
    for field in 1..count {
        match field {
            1 => t.delivery_id = r.uint()?,
            2 => t.delivery_tag = r.binary()?.map(Into::into),
            3 => t.message_format = r.uint()?,
            4 => t.settled = r.boolean()?,
            5 => t.more = r.boolean()?.unwrap_or(false),
            6 => t.rcv_settle_mode = r.settle_mode()?,
            // A delivery state on a transfer is rare (resumption,
            // transactions): serde's.
            7 => {
                if !r.null() {
                    return None;
                }
            }
            8 => t.resume = r.boolean()?.unwrap_or(false),
            9 => t.aborted = r.boolean()?.unwrap_or(false),
            _ => t.batchable = r.boolean()?.unwrap_or(false),
        }
    }
    Some(t)
}

fn disposition(r: &mut Reader<'_>, count: u32) -> Option<Disposition> {
    if !(2..=6).contains(&count) {
        return None;
    }
    let role = match r.boolean()?? {
        false => Role::Sender,
        true => Role::Receiver,
    };
    let mut d = Disposition {
        role,
        first: r.uint()??,
        last: None,
        settled: false,
        state: None,
        batchable: false,
    };
    for field in 2..count {
        match field {
            2 => d.last = r.uint()?,
            3 => d.settled = r.boolean()?.unwrap_or(false),
            4 => d.state = r.outcome()?,
            _ => d.batchable = r.boolean()?.unwrap_or(false),
        }
    }
    Some(d)
}

/// A cursor over the performative. Every read is bounds-checked; `None`
/// means "not a shape decoded here".
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The code of a descriptor, written as an ulong or a symbol; `None`
    /// for a code none of ours fits in.
    fn descriptor(&mut self) -> Option<u8> {
        let (code, len) = crate::descriptor::described_code(self.buf.get(self.pos..)?)?;
        self.pos += len;
        u8::try_from(code).ok()
    }

    /// A list's element count and where the list ends, its size checked
    /// against the bytes there are.
    fn list_header(&mut self) -> Option<(u32, usize)> {
        let (size, count) = match self.byte()? {
            0x45 => return Some((0, self.pos)),
            0xc0 => (usize::from(self.byte()?), 1),
            0xd0 => (usize::try_from(self.u32()?).ok()?, 4),
            _ => return None,
        };
        let end = self.pos.checked_add(size)?;
        if end > self.buf.len() {
            return None;
        }
        let count = if count == 1 {
            u32::from(self.byte()?)
        } else {
            self.u32()?
        };
        Some((count, end))
    }

    /// Consumes a null if there is one.
    fn null(&mut self) -> bool {
        let is_null = self.buf.get(self.pos) == Some(&0x40);
        if is_null {
            self.pos += 1;
        }
        is_null
    }

    fn uint(&mut self) -> Option<Option<u32>> {
        Some(Some(match self.byte()? {
            0x40 => return Some(None),
            0x43 => 0,
            0x52 => u32::from(self.byte()?),
            0x70 => self.u32()?,
            _ => return None,
        }))
    }

    fn boolean(&mut self) -> Option<Option<bool>> {
        Some(Some(match self.byte()? {
            0x40 => return Some(None),
            0x41 => true,
            0x42 => false,
            0x56 => match self.byte()? {
                0 => false,
                1 => true,
                _ => return None,
            },
            _ => return None,
        }))
    }

    fn binary(&mut self) -> Option<Option<Vec<u8>>> {
        let len = match self.byte()? {
            0x40 => return Some(None),
            0xa0 => usize::from(self.byte()?),
            0xb0 => usize::try_from(self.u32()?).ok()?,
            _ => return None,
        };
        Some(Some(self.take(len)?.to_vec()))
    }

    fn settle_mode(&mut self) -> Option<Option<ReceiverSettleMode>> {
        Some(Some(match self.byte()? {
            0x40 => return Some(None),
            0x50 => match self.byte()? {
                0 => ReceiverSettleMode::First,
                1 => ReceiverSettleMode::Second,
                _ => return None,
            },
            _ => return None,
        }))
    }

    /// Null, accepted or released: the outcomes of a plain consumer.
    fn outcome(&mut self) -> Option<Option<DeliveryState>> {
        if self.null() {
            return Some(None);
        }
        let code = self.descriptor()?;
        let (count, end) = self.list_header()?;
        if count != 0 || self.pos != end {
            return None;
        }
        Some(Some(match code {
            ACCEPTED => DeliveryState::Accepted(Accepted {}),
            RELEASED => DeliveryState::Released(Released {}),
            _ => return None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::messaging::{Modified, Rejected};
    use proptest::prelude::*;

    const DESCRIBED: u8 = 0x00;
    const SMALL_ULONG: u8 = 0x53;

    fn serde_decode(buf: &[u8]) -> Performative {
        serde_amqp::from_slice(buf).expect("serde decodes its own encoding")
    }

    fn encode(p: &Performative) -> Vec<u8> {
        serde_amqp::to_vec(p).expect("encodes")
    }

    fn settle_mode() -> impl Strategy<Value = Option<ReceiverSettleMode>> {
        prop_oneof![
            Just(None),
            Just(Some(ReceiverSettleMode::First)),
            Just(Some(ReceiverSettleMode::Second))
        ]
    }

    prop_compose! {
        fn transfers()(
            handle in any::<u32>(),
            delivery_id in proptest::option::of(any::<u32>()),
            tag in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
            message_format in proptest::option::of(any::<u32>()),
            settled in proptest::option::of(any::<bool>()),
            flags in any::<[bool; 4]>(),
            rcv_settle_mode in settle_mode(),
        ) -> Transfer {
            Transfer {
                handle: Handle(handle),
                delivery_id,
                delivery_tag: tag.map(Into::into),
                message_format,
                settled,
                more: flags[0],
                rcv_settle_mode,
                state: None,
                resume: flags[1],
                aborted: flags[2],
                batchable: flags[3],
            }
        }
    }

    fn outcomes() -> impl Strategy<Value = Option<DeliveryState>> {
        prop_oneof![
            Just(None),
            Just(Some(DeliveryState::Accepted(Accepted {}))),
            Just(Some(DeliveryState::Released(Released {}))),
        ]
    }

    prop_compose! {
        fn dispositions()(
            receiver in any::<bool>(),
            first in any::<u32>(),
            last in proptest::option::of(any::<u32>()),
            settled in any::<bool>(),
            state in outcomes(),
            batchable in any::<bool>(),
        ) -> Disposition {
            Disposition {
                role: if receiver { Role::Receiver } else { Role::Sender },
                first,
                last,
                settled,
                state,
                batchable,
            }
        }
    }

    proptest! {
        #[test]
        fn transfers_decode_as_serde_does(t in transfers()) {
            let bytes = encode(&Performative::Transfer(t));
            prop_assert_eq!(performative(&bytes), Some(serde_decode(&bytes)));
        }

        #[test]
        fn dispositions_decode_as_serde_does(d in dispositions()) {
            let bytes = encode(&Performative::Disposition(d));
            prop_assert_eq!(performative(&bytes), Some(serde_decode(&bytes)));
        }

        /// The same with every descriptor written as a symbol (python-qpid-
        /// proton's form for some types), still on the fast path.
        #[test]
        fn symbolic_descriptors_decode_as_serde_does(t in transfers(), d in dispositions()) {
            for p in [Performative::Transfer(t), Performative::Disposition(d)] {
                let (bytes, _) = crate::descriptor::to_symbolic(&encode(&p)).unwrap();
                prop_assert_eq!(performative(&bytes), Some(serde_decode(&bytes)));
            }
        }

        /// Whatever the bytes, a `Some` agrees with serde, and nothing panics.
        #[test]
        fn arbitrary_bytes_never_disagree(tail in proptest::collection::vec(any::<u8>(), 0..64),
                                          code in prop_oneof![Just(TRANSFER), Just(DISPOSITION)]) {
            let mut bytes = vec![DESCRIBED, SMALL_ULONG, code];
            bytes.extend_from_slice(&tail);
            if let Some(p) = performative(&bytes) {
                let by_serde: Result<Performative, _> = serde_amqp::from_slice(&bytes);
                prop_assert_eq!(Some(p), by_serde.ok());
            }
        }
    }

    #[test]
    fn short_lists_and_wide_encodings_are_read() {
        // list8 with two fields: handle as uint (4 bytes), delivery-id as
        // smalluint; the rest defaulted.
        let bytes = [
            0x00, 0x53, 0x14, 0xc0, 0x08, 0x02, 0x70, 0, 0, 1, 0, 0x52, 7,
        ];
        let Some(Performative::Transfer(t)) = performative(&bytes) else {
            panic!("not decoded")
        };
        assert_eq!((t.handle.0, t.delivery_id, t.more), (256, Some(7), false));
        assert_eq!(Some(Performative::Transfer(t)), Some(serde_decode(&bytes)));
    }

    #[test]
    fn other_shapes_are_left_to_serde() {
        let modified = Disposition {
            role: Role::Receiver,
            first: 1,
            last: None,
            settled: true,
            state: Some(DeliveryState::Modified(Modified {
                delivery_failed: Some(true),
                undeliverable_here: None,
                message_annotations: None,
            })),
            batchable: false,
        };
        let rejected = Disposition {
            state: Some(DeliveryState::Rejected(Rejected { error: None })),
            ..modified.clone()
        };
        for d in [modified, rejected] {
            assert_eq!(performative(&encode(&Performative::Disposition(d))), None);
        }
        // Null handle: an error serde reports, not one invented here.
        assert_eq!(
            performative(&[0x00, 0x53, 0x14, 0xc0, 0x02, 0x01, 0x40]),
            None
        );
        // Trailing bytes after the list.
        let mut t = encode(&Performative::Transfer(Transfer {
            handle: Handle(1),
            delivery_id: Some(1),
            delivery_tag: None,
            message_format: None,
            settled: None,
            more: false,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        }));
        t.push(0x40);
        assert_eq!(performative(&t), None);
        // A size that disagrees with the bytes.
        assert_eq!(
            performative(&[0x00, 0x53, 0x14, 0xc0, 0x05, 0x01, 0x43]),
            None
        );
    }
}
