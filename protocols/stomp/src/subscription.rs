//! One SUBSCRIBE's state: its consumer, ack mode and unacknowledged
//! deliveries (bounded by the consumer's prefetch window, which the core
//! enforces).

use std::collections::VecDeque;

/// Most expired deliveries a subscription remembers, so that their late
/// ACK/NACK/RENEW gets a `lease-expired` RECEIPT rather than an ERROR: a
/// bound on what a client that never acknowledges can make it hold (the
/// oldest is forgotten first, and its late ACK is then an unknown id).
pub(crate) const EXPIRED_ACK_IDS_MAX: usize = 1024;

use rosetta_neutral::{BindingOptions, ConsumerId, DeliveryTag, RetainedOnBind};

use crate::frame::Frame;

/// SUBSCRIBE header by which a topic subscription asks for the retained
/// messages matching its filter (ActiveMQ's name for a "retroactive"
/// consumer). Without it a STOMP subscription gets none.
pub(crate) const RETAINED_SUBSCRIBE_HEADER: &str = "activemq.retroactive";

/// The `ack` header of SUBSCRIBE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckMode {
    /// Settled by the core as it is sent.
    Auto,
    /// An ACK settles the message and every earlier unacknowledged one.
    Client,
    /// An ACK settles only its message.
    ClientIndividual,
}

impl AckMode {
    pub(crate) fn parse(value: Option<&str>) -> Option<AckMode> {
        match value {
            None | Some("auto") => Some(AckMode::Auto),
            Some("client") => Some(AckMode::Client),
            Some("client-individual") => Some(AckMode::ClientIndividual),
            Some(_) => None,
        }
    }
}

/// One subscription, inline in the connection's map (keyed by its
/// consumer): 40 B and one allocation for its names, where it was four
/// allocations and about 260 B (issue 20).
#[derive(Debug)]
pub(crate) struct Subscription {
    /// The destination as subscribed (fallback for MESSAGE `destination`),
    /// the client's id (1.0 without `id`: the destination again) and the
    /// durable queue's name, if any: one allocation for all.
    names: Box<str>,
    /// Where the id starts in `names` (names are header values: far below
    /// 4 GiB).
    id_at: u32,
    /// Where the durable queue's name starts in `names` (its end when the
    /// subscription is not durable).
    queue_at: u32,
    pub(crate) ack: AckMode,
    /// The client gave an `id` header (1.0 may not): echo it in MESSAGE.
    pub(crate) id_given: bool,
    /// A queue browser (`browser:true`): its messages are copies that
    /// need no ACK, and it ends with an end-of-browse MESSAGE.
    pub(crate) browse: bool,
    /// It reads a stream (its deliveries carry an offset) and ACKs: an
    /// ACK of many settles them with one call (see `Open::ack`).
    pub(crate) stream: bool,
    /// A durable topic subscription: `names` ends with its queue's name.
    durable: bool,
    /// What an acknowledging subscription tracks, made by its first
    /// delivery: an `auto` one, or one that never got a message, has none.
    acks: Option<Box<Unacked>>,
}

/// A subscription's deliveries waiting for the client's ACK, and those
/// whose lease ran out.
#[derive(Debug, Default)]
struct Unacked {
    /// Unacknowledged deliveries in delivery order.
    unacked: VecDeque<DeliveryTag>,
    /// Deliveries whose lease ran out, oldest first (at most
    /// [`EXPIRED_ACK_IDS_MAX`]).
    expired: VecDeque<DeliveryTag>,
}

impl Subscription {
    pub(crate) fn new(
        id: &str,
        id_given: bool,
        destination: &str,
        ack: AckMode,
        durable_queue: Option<String>,
        browse: bool,
    ) -> Self {
        let queue = durable_queue.as_deref().unwrap_or_default();
        let mut names = String::with_capacity(destination.len() + id.len() + queue.len());
        names.push_str(destination);
        let id_at = names.len();
        names.push_str(id);
        let queue_at = names.len();
        names.push_str(queue);
        let at = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Self {
            names: names.into_boxed_str(),
            id_at: at(id_at),
            queue_at: at(queue_at),
            // A browser's copies are settled by the core as they are
            // sent, whatever `ack` the client asked for.
            ack: if browse { AckMode::Auto } else { ack },
            id_given,
            browse,
            stream: false,
            durable: durable_queue.is_some(),
            acks: None,
        }
    }

    /// The client's id (1.0 without `id`: the destination).
    #[inline]
    pub(crate) fn id(&self) -> &str {
        let (at, end) = (self.id_at as usize, self.queue_at as usize);
        self.names.get(at..end).unwrap_or_default()
    }

    /// Name of the durable queue behind a durable topic subscription.
    pub(crate) fn durable_queue(&self) -> Option<&str> {
        let queue = self.names.get(self.queue_at as usize..);
        queue.filter(|_| self.durable)
    }

    /// The destination as subscribed.
    #[inline]
    pub(crate) fn destination(&self) -> &str {
        self.names.get(..self.id_at as usize).unwrap_or_default()
    }

    /// The lease of `tag` ran out: the message went back to the queue, so
    /// it is no longer unacknowledged here (a cumulative ACK skips it), and
    /// its late ACK is recognised.
    pub(crate) fn lease_expired(&mut self, tag: DeliveryTag) {
        let Some(acks) = self.acks.as_deref_mut() else {
            return;
        };
        let Some(pos) = acks.unacked.iter().position(|t| *t == tag) else {
            return;
        };
        acks.unacked.remove(pos);
        if acks.expired.len() >= EXPIRED_ACK_IDS_MAX {
            acks.expired.pop_front();
        }
        acks.expired.push_back(tag);
    }

    /// Whether `tag` is a remembered expired delivery (`take`: forgotten
    /// then, as a late ACK is answered once).
    pub(crate) fn was_expired(&mut self, tag: DeliveryTag, take: bool) -> bool {
        let Some(acks) = self.acks.as_deref_mut() else {
            return false;
        };
        let Some(pos) = acks.expired.iter().position(|t| *t == tag) else {
            return false;
        };
        if take {
            acks.expired.remove(pos);
        }
        true
    }

    /// Records a delivery sent to the client.
    pub(crate) fn delivered(&mut self, tag: DeliveryTag) {
        if self.ack != AckMode::Auto {
            self.acks
                .get_or_insert_with(Box::default)
                .unacked
                .push_back(tag);
        }
    }

    /// The deliveries an ACK/NACK of `tag` covers, removed from the
    /// unacknowledged set; `None` if `tag` is not unacknowledged here.
    pub(crate) fn take_acked(&mut self, tag: DeliveryTag) -> Option<Vec<DeliveryTag>> {
        let unacked = &mut self.acks.as_deref_mut()?.unacked;
        let pos = unacked.iter().position(|t| *t == tag)?;
        match self.ack {
            AckMode::Auto => None,
            AckMode::Client => Some(unacked.drain(..=pos).collect()),
            AckMode::ClientIndividual => unacked.remove(pos).map(|t| vec![t]),
        }
    }

    /// Puts back deliveries whose staged ack was aborted, oldest first.
    pub(crate) fn restore(&mut self, tags: &[DeliveryTag]) {
        let unacked = &mut self.acks.get_or_insert_with(Box::default).unacked;
        for tag in tags.iter().rev() {
            unacked.push_front(*tag);
        }
    }
}

/// Whether a topic SUBSCRIBE asked for retained messages: `true` (any
/// case) does; any other value or no header does not. A binding that
/// already existed (a durable subscription resubscribing) gets none again.
pub(crate) fn retained_on_bind(value: Option<&str>) -> RetainedOnBind {
    match value {
        Some(v) if v.trim().eq_ignore_ascii_case("true") => RetainedOnBind::SendIfNew,
        _ => RetainedOnBind::None,
    }
}

/// The options of the binding behind a topic SUBSCRIBE.
pub(crate) fn binding_options(frame: &Frame) -> BindingOptions {
    BindingOptions {
        retained: retained_on_bind(frame.header(RETAINED_SUBSCRIBE_HEADER)),
        ..BindingOptions::default()
    }
}

/// The id a MESSAGE carries in `message-id` (and `ack` in 1.2): the
/// consumer and the delivery tag; a redelivery has a new tag, so a late
/// ACK of an expired lease never acknowledges the redelivered copy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AckId(pub(crate) ConsumerId, pub(crate) DeliveryTag);

impl AckId {
    /// Writes `<consumer>-<tag>` (digits and a dash: nothing to escape)
    /// into `buf` (room for two 20-digit numbers and the dash), without
    /// allocating: the bytes written.
    pub(crate) fn write_to(self, buf: &mut [u8; 48]) -> &[u8] {
        let mut text = itoa::Buffer::new();
        let mut at = 0;
        for (i, n) in [self.0 .0, self.1 .0].into_iter().enumerate() {
            if i == 1 {
                buf[at] = b'-';
                at += 1;
            }
            let digits = text.format(n).as_bytes();
            buf[at..at + digits.len()].copy_from_slice(digits);
            at += digits.len();
        }
        &buf[..at]
    }
}

/// Reverses [`AckId`]; `None` for anything we did not produce.
pub(crate) fn parse_ack_id(id: &str) -> Option<(ConsumerId, DeliveryTag)> {
    let (c, t) = id.split_once('-')?;
    Some((ConsumerId(c.parse().ok()?), DeliveryTag(t.parse().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(ack: AckMode) -> Subscription {
        let mut s = Subscription::new("s", true, "/queue/q", ack, None, false);
        for t in 1..=4 {
            s.delivered(DeliveryTag(t));
        }
        s
    }

    #[test]
    fn client_ack_is_cumulative_and_individual_is_not() {
        let mut c = sub(AckMode::Client);
        assert_eq!(
            c.take_acked(DeliveryTag(3)),
            Some(vec![DeliveryTag(1), DeliveryTag(2), DeliveryTag(3)])
        );
        assert_eq!(c.take_acked(DeliveryTag(2)), None);
        let mut i = sub(AckMode::ClientIndividual);
        assert_eq!(i.take_acked(DeliveryTag(3)), Some(vec![DeliveryTag(3)]));
        assert_eq!(i.take_acked(DeliveryTag(3)), None);
        i.restore(&[DeliveryTag(3)]);
        assert_eq!(i.take_acked(DeliveryTag(3)), Some(vec![DeliveryTag(3)]));
        let mut a = sub(AckMode::Auto);
        assert_eq!(a.take_acked(DeliveryTag(1)), None);
    }

    #[test]
    fn id_and_destination_share_one_string() {
        let s = Subscription::new("sub-1", true, "/topic/a", AckMode::Auto, None, false);
        assert_eq!((s.id(), s.destination()), ("sub-1", "/topic/a"));
        assert_eq!(s.durable_queue(), None);
        let queue = Some("durable-q".to_owned());
        let d = Subscription::new("d", true, "/topic/b", AckMode::Client, queue, false);
        assert_eq!((d.id(), d.destination()), ("d", "/topic/b"));
        assert_eq!(d.durable_queue(), Some("durable-q"));
    }

    /// A subscription sits inline in its connection's map: a field more
    /// costs every subscribed connection (issue 20, docs/scaling.md).
    #[test]
    fn a_subscription_stays_small() {
        let size = std::mem::size_of::<Subscription>();
        println!(
            "Subscription {size} B, Unacked (made at first delivery) {} B",
            std::mem::size_of::<Unacked>()
        );
        assert!(size <= 40, "Subscription: {size} B");
    }

    #[test]
    fn retained_only_when_asked() {
        assert_eq!(retained_on_bind(Some("true")), RetainedOnBind::SendIfNew);
        assert_eq!(retained_on_bind(Some("TRUE")), RetainedOnBind::SendIfNew);
        assert_eq!(retained_on_bind(Some("false")), RetainedOnBind::None);
        assert_eq!(retained_on_bind(Some("yes")), RetainedOnBind::None);
        assert_eq!(retained_on_bind(None), RetainedOnBind::None);
    }

    #[test]
    fn ack_ids_round_trip() {
        let mut buf = [0u8; 48];
        assert_eq!(
            AckId(ConsumerId(7), DeliveryTag(42)).write_to(&mut buf),
            b"7-42"
        );
        assert_eq!(
            AckId(ConsumerId(u64::MAX), DeliveryTag(u64::MAX)).write_to(&mut buf),
            format!("{}-{}", u64::MAX, u64::MAX).as_bytes()
        );
        assert_eq!(parse_ack_id("7-42"), Some((ConsumerId(7), DeliveryTag(42))));
        assert_eq!(parse_ack_id("x-42"), None);
        assert_eq!(parse_ack_id("742"), None);
    }
}
