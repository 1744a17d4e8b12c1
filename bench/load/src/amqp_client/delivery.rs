//! Incoming deliveries: a message may span several transfer frames
//! (`more`), which are joined here, bounded by [`MESSAGE_SIZE_MAX`].

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::performatives::Transfer;

use super::{ClientError, MESSAGE_SIZE_MAX};

/// A whole message received on the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delivery {
    pub(crate) id: u32,
    /// The broker sent it settled: nothing to accept.
    pub(crate) settled: bool,
    /// The encoded sections.
    pub(crate) message: Bytes,
}

/// Joins the transfer frames of one delivery at a time (a link's
/// deliveries do not interleave).
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    partial: Option<(u32, bool, BytesMut)>,
}

impl Assembler {
    /// Takes one transfer frame; returns the delivery it completes. A
    /// single-frame message is returned without a copy.
    pub(crate) fn push(
        &mut self,
        t: &Transfer,
        payload: Bytes,
    ) -> Result<Option<Delivery>, ClientError> {
        if t.aborted {
            return Err(ClientError::Protocol(
                "the broker aborted a delivery".into(),
            ));
        }
        let Some((id, settled, mut buf)) = self.partial.take() else {
            let id = t.delivery_id.ok_or_else(|| {
                ClientError::Protocol("first transfer of a delivery without delivery-id".into())
            })?;
            let settled = t.settled.unwrap_or(false);
            if !t.more {
                return Ok(Some(Delivery {
                    id,
                    settled,
                    message: payload,
                }));
            }
            self.partial = Some((id, settled, BytesMut::from(&payload[..])));
            return Ok(None);
        };
        if t.delivery_id.is_some_and(|d| d != id) {
            return Err(ClientError::Protocol(format!(
                "transfer for delivery {:?} inside delivery {id}",
                t.delivery_id
            )));
        }
        if buf.len() + payload.len() > MESSAGE_SIZE_MAX {
            return Err(ClientError::Limit("message size"));
        }
        buf.extend_from_slice(&payload);
        let settled = settled || t.settled == Some(true);
        if t.more {
            self.partial = Some((id, settled, buf));
            return Ok(None);
        }
        Ok(Some(Delivery {
            id,
            settled,
            message: buf.freeze(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::definitions::Handle;

    fn transfer(id: Option<u32>, more: bool) -> Transfer {
        Transfer {
            handle: Handle(0),
            delivery_id: id,
            delivery_tag: None,
            message_format: None,
            settled: Some(false),
            more,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        }
    }

    fn push(a: &mut Assembler, t: &Transfer, p: &'static [u8]) -> Option<Delivery> {
        a.push(t, Bytes::from_static(p))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn frames_join_into_one_delivery() {
        let mut a = Assembler::default();
        let whole = push(&mut a, &transfer(Some(4), false), b"abc").expect("complete");
        assert_eq!((whole.id, &whole.message[..]), (4, &b"abc"[..]));
        assert_eq!(push(&mut a, &transfer(Some(5), true), b"ab"), None);
        assert_eq!(push(&mut a, &transfer(None, true), b"cd"), None);
        let d = push(&mut a, &transfer(None, false), b"e").expect("complete");
        assert_eq!((d.id, d.settled, &d.message[..]), (5, false, &b"abcde"[..]));
    }

    #[test]
    fn broken_sequences_are_errors() {
        let mut a = Assembler::default();
        assert!(a.push(&transfer(None, false), Bytes::new()).is_err());
        let mut a = Assembler::default();
        push(&mut a, &transfer(Some(1), true), b"x");
        assert!(a.push(&transfer(Some(2), false), Bytes::new()).is_err());
        let mut a = Assembler::default();
        let mut aborted = transfer(Some(1), false);
        aborted.aborted = true;
        assert!(a.push(&aborted, Bytes::new()).is_err());
        // Past the size limit.
        let mut a = Assembler::default();
        let big = Bytes::from(vec![0u8; MESSAGE_SIZE_MAX]);
        assert!(a
            .push(&transfer(Some(1), true), big)
            .expect("fits")
            .is_none());
        assert!(matches!(
            a.push(&transfer(None, false), Bytes::from_static(b"y")),
            Err(ClientError::Limit(_))
        ));
    }
}
