//! The connected state: one frame handler per client command, each
//! checking its headers before it calls the core session. The header
//! conventions are documented on [`crate::connection`].

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use rosetta_neutral::address::{
    validate_topic_filter, validate_topic_name, TEMP_QUEUE_PREFIX, TOPIC_PREFIX,
};
use rosetta_neutral::small_map::SmallMap;
use rosetta_neutral::{
    durable_subscription_queue, Address, BrokerError, ConsumerId, ConsumerSpec, CreditMode,
    Delivery, DeliveryTag, LazyMap, Outcome, PublishOptions, QueueInfo, QueueLifetime, QueueSpec,
    Session, Ticket, TxnId,
};
use tracing::{debug, trace};

use crate::clock::Stamp;
use crate::config::StompConfig;
use crate::consumer_options::consumer_options;
use crate::convert::{
    message_from_send, write_end_of_browse, write_message, Outgoing, END_OF_BROWSE_MESSAGE_ID,
};
use crate::error::StompError;
use crate::frame::{Command, Frame, KnownHeader, Version};
use crate::heartbeat::Beats;
use crate::receipts::{Receipts, Tickets};
use crate::subscription::{parse_ack_id, AckMode, Subscription};

/// Waiting deliveries' room kept once all are written (a burst's larger
/// queue is given back).
const PENDING_KEPT: usize = 64;

/// An open transaction.
struct Txn {
    id: TxnId,
    /// Acks staged in it, to make them unacknowledged again on ABORT.
    acked: Vec<(ConsumerId, DeliveryTag)>,
}

/// State of an authenticated connection.
///
/// One per connection, idle ones included (issue 20): what only a busy
/// connection uses (deliveries waiting to be written, frames waiting for
/// their receipts) or only some clients use (a client key, transactions,
/// temporary queues) is boxed apart and made when first needed, so an
/// idle connection's `Open` is 96 B.
pub(crate) struct Open {
    conn_id: u64,
    pub(crate) session: Box<dyn Session>,
    /// Subscriptions by their consumer (what deliveries, ACKs and the
    /// core's events name them by); found by the client's id with a scan,
    /// which only SUBSCRIBE and UNSUBSCRIBE do. In a small map: a device
    /// has one, and a hash map's first table cost about 200 bytes for it.
    subs: SmallMap<ConsumerId, Subscription>,
    /// Deliveries taken from the core and not yet written as MESSAGE
    /// frames, oldest first: they are encoded as the transport takes
    /// output (see [`Open::encode_pending`]), so a reader's whole credit
    /// never sits in the output buffer as a second copy of itself. Each
    /// still holds its charge on the connection's delivery budget. Made
    /// by the first delivery and kept (a reader empties it after every
    /// write; freeing it then would allocate it again with the next
    /// message).
    #[allow(clippy::box_collection)] // the box is the point: 8 B until used
    pending: Option<Box<VecDeque<Outgoing>>>,
    pub(crate) receipts: Receipts,
    /// Made by the first transaction or temporary queue, or at CONNECT for
    /// a client with a key.
    rare: Option<Box<Rare>>,
    /// When the last byte came from the client.
    pub(crate) last_rx: Stamp,
    /// When the last frame went to it.
    pub(crate) last_tx: Stamp,
    pub(crate) beats: Beats,
    pub(crate) version: Version,
    /// DISCONNECT received: no more frames are read.
    pub(crate) disconnecting: bool,
}

/// What some connections use and most never do.
#[derive(Default)]
struct Rare {
    /// Key of durable subscriptions: `client-id`, else the login.
    client_key: Option<Box<str>>,
    txns: LazyMap<String, Txn>,
    /// `/temp-queue/x` name → the core's generated queue name.
    temp_queues: LazyMap<String, String>,
}

/// Out of line and cold, so that the delivery path inlines one branch and
/// no allocation (MQTT's flows box showed a copy of every delivery when the
/// allocation was inlined).
#[cold]
#[inline(never)]
#[allow(clippy::box_collection)] // see `Open::pending`
fn new_pending() -> Box<VecDeque<Outgoing>> {
    Box::default()
}

/// What a frame's handler hands back for the receipt queue.
pub(crate) struct Done {
    pub(crate) tickets: Tickets,
    pub(crate) disconnect: bool,
    /// The frame named a delivery whose lease had run out (a late ACK,
    /// NACK or RENEW): its RECEIPT says so (`lease-expired:true`), and
    /// nothing was settled.
    pub(crate) lease_expired: bool,
}

impl Done {
    pub(crate) fn now() -> Self {
        Done {
            tickets: Tickets::new(),
            disconnect: false,
            lease_expired: false,
        }
    }
}

fn required(frame: &Frame, header: KnownHeader) -> Result<&str, StompError> {
    frame.known(header).ok_or(StompError::MissingHeader {
        command: frame.command,
        header: header.name(),
    })
}

fn bad_destination(destination: &str, source: rosetta_neutral::AddressError) -> StompError {
    StompError::BadDestination {
        destination: destination.to_owned(),
        source,
    }
}

impl Open {
    pub(crate) fn new(
        conn_id: u64,
        session: Box<dyn Session>,
        version: Version,
        client_key: Option<String>,
        beats: Beats,
        now: Stamp,
    ) -> Self {
        Self {
            conn_id,
            session,
            subs: SmallMap::default(),
            pending: None,
            receipts: Receipts::default(),
            rare: client_key.map(|key| {
                Box::new(Rare {
                    client_key: Some(key.into_boxed_str()),
                    ..Rare::default()
                })
            }),
            last_rx: now,
            last_tx: now,
            beats,
            version,
            disconnecting: false,
        }
    }

    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    fn client_key(&self) -> Option<&str> {
        self.rare.as_ref()?.client_key.as_deref()
    }

    /// The client's id of the subscription of `consumer`.
    pub(crate) fn subscription_id(&self, consumer: ConsumerId) -> Option<&str> {
        self.subs.get(&consumer).map(Subscription::id)
    }

    /// The consumer of the subscription the client calls `id`.
    fn consumer_of(&self, id: &str) -> Option<ConsumerId> {
        self.subs
            .iter()
            .find(|(_, sub)| sub.id() == id)
            .map(|(consumer, _)| *consumer)
    }

    /// Acts on one frame of an open connection.
    pub(crate) fn handle_frame(
        &mut self,
        config: &StompConfig,
        frame: Frame,
    ) -> Result<Done, StompError> {
        match frame.command {
            Command::Send => self.send(config, frame),
            Command::Subscribe => self.subscribe(config, &frame),
            Command::Unsubscribe => self.unsubscribe(&frame),
            Command::Ack => self.ack(config, &frame, Outcome::Accept),
            Command::Nack if self.version == Version::V1_0 => {
                Err(StompError::UnsupportedCommand(Command::Nack, self.version))
            }
            Command::Nack => self.ack(config, &frame, Outcome::NACK),
            Command::Renew => self.renew(&frame),
            Command::Begin => self.begin(config, &frame),
            Command::Commit => self.commit(&frame),
            Command::Abort => self.abort(&frame),
            Command::Disconnect => Ok(Done {
                tickets: Tickets::new(),
                disconnect: true,
                lease_expired: false,
            }),
            other => Err(StompError::UnexpectedFrame(other)),
        }
    }

    /// Takes a delivery: recorded as sent on its subscription now (so the
    /// frames after it are ordered after it), written by
    /// [`Open::encode_pending`].
    pub(crate) fn deliver(&mut self, d: Delivery) {
        let Some(sub) = self.subs.get_mut(&d.consumer) else {
            // Raced with UNSUBSCRIBE: the cancel returns it to its queue.
            trace!(
                conn_id = self.conn_id,
                consumer = d.consumer.0,
                "delivery for a cancelled subscription"
            );
            return;
        };
        sub.delivered(d.tag);
        if sub.ack != AckMode::Auto && d.stream.is_some() {
            sub.stream = true;
        }
        self.pending
            .get_or_insert_with(new_pending)
            .push_back(Outgoing::from(d));
    }

    /// Whether deliveries wait to be written.
    pub(crate) fn has_pending(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| !p.is_empty())
    }

    /// Writes waiting deliveries as MESSAGE frames until `out` holds at
    /// least `until_len` bytes (`usize::MAX`: all of them). A delivery
    /// whose subscription was cancelled meanwhile is dropped, as one that
    /// arrives after the cancel is.
    ///
    /// With a bound (`until_len` not `usize::MAX`), a frame that would take
    /// `out` past it (by [`frame_bytes_estimate`]) waits for the next call
    /// once `out` holds a frame, and an empty `out` is first given room for
    /// what will be written: so the buffer the transport keeps between
    /// writes (as large as the bound) is filled, never regrown by doubling,
    /// which copies what it holds.
    pub(crate) fn encode_pending(&mut self, out: &mut Vec<u8>, version: Version, until_len: usize) {
        let Some(pending) = self.pending.as_deref_mut() else {
            return;
        };
        let bounded = until_len != usize::MAX;
        if bounded && out.is_empty() {
            let mut want = 0;
            for d in pending.iter() {
                want += frame_bytes_estimate(d);
                if want >= until_len {
                    break;
                }
            }
            let want = want.min(until_len);
            if out.capacity() < want {
                // Empty: a new buffer, not a regrown one (nothing to copy).
                *out = Vec::with_capacity(want);
            }
        }
        // Deliveries come in runs of one consumer: one lookup per run.
        let mut last: Option<(ConsumerId, Option<&Subscription>)> = None;
        while out.len() < until_len {
            if bounded
                && !out.is_empty()
                && pending
                    .front()
                    .is_some_and(|d| out.len() + frame_bytes_estimate(d) > until_len)
            {
                return;
            }
            let Some(d) = pending.pop_front() else {
                // A burst's queue is not kept while idle.
                if pending.capacity() > PENDING_KEPT {
                    pending.shrink_to(PENDING_KEPT);
                }
                return;
            };
            let sub = match last {
                Some((c, sub)) if c == d.consumer => sub,
                _ => {
                    let sub = self.subs.get(&d.consumer);
                    last = Some((d.consumer, sub));
                    sub
                }
            };
            let Some(sub) = sub else {
                trace!(
                    conn_id = self.conn_id,
                    consumer = d.consumer.0,
                    "delivery for a cancelled subscription"
                );
                continue;
            };
            write_message(out, version, sub, &d);
        }
    }

    /// Writes the end-of-browse MESSAGE of a browser that has seen every
    /// message. The subscription stays until the client unsubscribes, as
    /// in ActiveMQ; it gets nothing more.
    pub(crate) fn browse_ended(
        &mut self,
        out: &mut Vec<u8>,
        version: Version,
        consumer: ConsumerId,
    ) {
        let Some(sub) = self.subs.get(&consumer) else {
            trace!(
                conn_id = self.conn_id,
                consumer = consumer.0,
                "browse end for a cancelled subscription"
            );
            return;
        };
        debug!(conn_id = self.conn_id, sub = %sub.id(), "browse ended");
        write_end_of_browse(out, version, sub);
    }

    fn txn_id(&self, frame: &Frame) -> Result<Option<TxnId>, StompError> {
        match frame.known(KnownHeader::Transaction) {
            None => Ok(None),
            Some(name) => self
                .rare
                .as_ref()
                .and_then(|r| r.txns.get(name))
                .map(|t| Some(t.id))
                .ok_or_else(|| StompError::UnknownTransaction(name.to_owned())),
        }
    }

    /// The core queue behind `/temp-queue/<local>`, declared on first use.
    fn temp_queue(&mut self, config: &StompConfig, local: &str) -> Result<String, StompError> {
        if let Some(name) = self.rare.as_ref().and_then(|r| r.temp_queues.get(local)) {
            return Ok(name.clone());
        }
        if local.is_empty() {
            return Err(bad_destination(
                &format!("{TEMP_QUEUE_PREFIX}{local}"),
                rosetta_neutral::AddressError::Empty,
            ));
        }
        let made = self.rare.as_ref().map_or(0, |r| r.temp_queues.len());
        if made >= config.temp_queues_max {
            return Err(StompError::LimitExceeded {
                what: "temporary queues",
                max: config.temp_queues_max,
            });
        }
        let info = self.session.declare_queue(QueueSpec {
            name: None,
            durable: false,
            lifetime: QueueLifetime::Session,
            bindings_max: None,
        })?;
        self.rare()
            .temp_queues
            .insert(local.to_owned(), info.name.clone());
        Ok(info.name)
    }

    /// Where a SEND goes.
    fn send_address(&mut self, config: &StompConfig, dest: &str) -> Result<Address, StompError> {
        if let Some(local) = dest.strip_prefix(TEMP_QUEUE_PREFIX) {
            return Ok(Address::Queue(self.temp_queue(config, local)?));
        }
        let address = Address::parse_destination(dest).map_err(|e| bad_destination(dest, e))?;
        if let Address::Topic(name) = &address {
            validate_topic_name(name).map_err(|e| bad_destination(dest, e))?;
        }
        Ok(address)
    }

    fn send(&mut self, config: &StompConfig, frame: Frame) -> Result<Done, StompError> {
        let dest = required(&frame, KnownHeader::Destination)?;
        let txn = self.txn_id(&frame)?;
        let address = self.send_address(config, dest)?;
        if let (true, Address::Queue(name)) =
            (crate::consumer_options::wants_stream(&frame)?, &address)
        {
            // RabbitMQ declares the stream a SEND names with
            // `x-queue-type:stream`.
            self.session.declare_stream(name)?;
        }
        let reply_to = match frame.known(KnownHeader::ReplyTo) {
            Some(r) => match r.strip_prefix(TEMP_QUEUE_PREFIX) {
                // Other protocols cannot resolve our local temp name.
                Some(local) => {
                    Some(Address::Queue(self.temp_queue(config, local)?).to_destination())
                }
                None => Some(r.to_owned()),
            },
            None => None,
        };
        let wants_receipt = frame.known(KnownHeader::Receipt).is_some();
        let mut message = message_from_send(frame, reply_to, rosetta_neutral::message::now_ms)?;
        let confirm = txn.is_none() && (message.durable || wants_receipt);
        // Handed over with the message: the core keeps it rather than a
        // copy (a stream append stores it as the message's address).
        message.address = Some(address);
        let published = self
            .session
            .publish_addressed(Arc::new(message), PublishOptions { txn, confirm })?;
        Ok(Done {
            tickets: published.pending.into_iter().collect(),
            disconnect: false,
            lease_expired: false,
        })
    }

    fn subscribe(&mut self, config: &StompConfig, frame: &Frame) -> Result<Done, StompError> {
        let dest = required(frame, KnownHeader::Destination)?;
        let (id, id_given) = match frame.header("id") {
            Some(id) => (id.to_owned(), true),
            None if self.version == Version::V1_0 => (dest.to_owned(), false),
            None => {
                return Err(StompError::MissingHeader {
                    command: frame.command,
                    header: "id",
                })
            }
        };
        if self.consumer_of(&id).is_some() {
            return Err(StompError::DuplicateSubscription(id));
        }
        if self.subs.len() >= config.subscriptions_max {
            return Err(StompError::LimitExceeded {
                what: "subscriptions",
                max: config.subscriptions_max,
            });
        }
        let ack_header = frame.header("ack");
        let ack = AckMode::parse(ack_header).ok_or_else(|| StompError::BadHeader {
            header: "ack",
            value: ack_header.unwrap_or_default().to_owned(),
        })?;
        let prefetch = prefetch(config, frame)?;
        let options = consumer_options(frame, !dest.starts_with(TOPIC_PREFIX))?;
        let browse = options.browse;
        let mut durable_queue = None;
        let mut tickets = Tickets::new();
        let queue = if let Some(filter) = dest.strip_prefix(TOPIC_PREFIX) {
            validate_topic_filter(filter).map_err(|e| bad_destination(dest, e))?;
            let spec = match durable_name(frame, &id) {
                Some(name) => {
                    let key = self
                        .client_key()
                        .ok_or(StompError::DurableWithoutClientId)?;
                    let q = durable_subscription_queue(key, name);
                    durable_queue = Some(q.clone());
                    QueueSpec {
                        name: Some(q),
                        durable: true,
                        lifetime: QueueLifetime::Permanent,
                        bindings_max: None,
                    }
                }
                None => QueueSpec {
                    name: None,
                    durable: false,
                    lifetime: QueueLifetime::Consumer,
                    bindings_max: None,
                },
            };
            let mut info = self.session.declare_queue(spec.clone())?;
            if durable_queue.is_some() {
                tickets = self
                    .keep_durable_filter(&mut info, spec, filter)?
                    .into_iter()
                    .collect();
            }
            if let Err(e) = self.session.bind(
                &info.name,
                filter,
                crate::subscription::binding_options(frame),
            ) {
                self.drop_unused_queue(&info.name, durable_queue.is_none());
                return Err(e.into());
            }
            info.name
        } else if let Some(local) = dest.strip_prefix(TEMP_QUEUE_PREFIX) {
            self.temp_queue(config, local)?
        } else {
            match Address::parse_destination(dest).map_err(|e| bad_destination(dest, e))? {
                Address::Queue(q) => q,
                Address::Topic(_) => unreachable_topic(dest)?,
            }
        };
        let consumer = match self.session.consume(ConsumerSpec {
            queue: queue.clone(),
            credit: CreditMode::Window(prefetch),
            auto_settle: browse || ack == AckMode::Auto,
            options,
        }) {
            Ok(c) => c,
            Err(e) => {
                if dest.starts_with(TOPIC_PREFIX) {
                    self.drop_unused_queue(&queue, durable_queue.is_none());
                }
                return Err(e.into());
            }
        };
        debug!(conn_id = self.conn_id, sub = %id, %dest, %queue, ?ack, prefetch, browse, "subscribed");
        self.subs.insert(
            consumer,
            Subscription::new(&id, id_given, dest, ack, durable_queue, browse),
        );
        Ok(Done {
            tickets,
            disconnect: false,
            lease_expired: false,
        })
    }

    /// A durable subscription is for one topic filter: SUBSCRIBE with the
    /// same name and another destination replaces it, dropping what it
    /// held (JMS semantics), instead of adding a second binding to the old
    /// queue. The filter is kept in the client state; returns the ticket
    /// of its save, for the RECEIPT to wait on.
    fn keep_durable_filter(
        &mut self,
        info: &mut QueueInfo,
        spec: QueueSpec,
        filter: &str,
    ) -> Result<Vec<Ticket>, StompError> {
        let key = durable_filter_key(&info.name);
        let old = self.session.get_state(&key);
        if old.as_deref() == Some(filter.as_bytes()) {
            return Ok(Vec::new());
        }
        if info.existed && old.is_some() {
            debug!(conn_id = self.conn_id, queue = %info.name, %filter, "durable subscription moved to another destination");
            self.session.delete_queue(&info.name)?;
            *info = self.session.declare_queue(spec)?;
        }
        let saved = self
            .session
            .put_state(&key, Some(Bytes::copy_from_slice(filter.as_bytes())))?;
        Ok(saved.into_iter().collect())
    }

    /// Deletes a subscription queue that never got its consumer.
    fn drop_unused_queue(&mut self, queue: &str, temporary: bool) {
        if temporary {
            if let Err(e) = self.session.delete_queue(queue) {
                debug!(conn_id = self.conn_id, %queue, error = %e, "could not delete unused subscription queue");
            }
        }
    }

    fn unsubscribe(&mut self, frame: &Frame) -> Result<Done, StompError> {
        let id = match frame.header("id") {
            Some(id) => id,
            None if self.version == Version::V1_0 => required(frame, KnownHeader::Destination)?,
            None => required(frame, KnownHeader::Id)?,
        };
        let remove = frame.header("activemq.subscriptionName").is_some()
            || is_true(frame.header("persistent"))
            || is_true(frame.header("durable"));
        let active = self
            .consumer_of(id)
            .and_then(|consumer| Some((consumer, self.subs.remove(&consumer)?)));
        let durable_queue = match active {
            Some((consumer, sub)) => {
                self.session.cancel(consumer)?;
                sub.durable_queue().map(str::to_owned)
            }
            // Not active here: ActiveMQ clients remove a durable
            // subscription offline by naming it.
            None => {
                debug!(conn_id = self.conn_id, sub = %id, "UNSUBSCRIBE of an inactive subscription");
                self.client_key()
                    .zip(durable_name(frame, id))
                    .map(|(key, name)| durable_subscription_queue(key, name))
            }
        };
        if remove {
            if let Some(q) = durable_queue {
                debug!(conn_id = self.conn_id, queue = %q, "durable subscription removed");
                match self.session.delete_queue(&q) {
                    Ok(()) | Err(rosetta_neutral::BrokerError::NotFound(_)) => {}
                    Err(e) => return Err(e.into()),
                }
                if self.session.get_state(&durable_filter_key(&q)).is_some() {
                    let cleared = self.session.put_state(&durable_filter_key(&q), None)?;
                    return Ok(Done {
                        tickets: cleared.into_iter().collect(),
                        disconnect: false,
                        lease_expired: false,
                    });
                }
            }
        }
        Ok(Done::now())
    }

    /// A late ACK, NACK or RENEW: answered, never applied (see
    /// [`Done::lease_expired`]).
    fn late(&self, id: &str) -> Done {
        debug!(conn_id = self.conn_id, %id, "acknowledgement after its lease expired: not applied");
        Done {
            tickets: Tickets::new(),
            disconnect: false,
            lease_expired: true,
        }
    }

    /// RENEW (Rosetta extension): the lease of the delivery named by `id`
    /// (as ACK names it) restarts from now.
    fn renew(&mut self, frame: &Frame) -> Result<Done, StompError> {
        let id = self.ack_id_of(frame)?;
        let unknown = || StompError::UnknownAckId(id.to_owned());
        let (consumer, tag) = parse_ack_id(id).ok_or_else(unknown)?;
        let sub = self.subs.get_mut(&consumer).ok_or_else(unknown)?;
        if sub.was_expired(tag, true) {
            return Ok(self.late(id));
        }
        match self.session.renew_lease(consumer, tag) {
            Ok(()) => Ok(Done::now()),
            Err(BrokerError::LeaseExpired) => Ok(self.late(id)),
            Err(BrokerError::Unknown(_)) => Err(unknown()),
            Err(e) => Err(e.into()),
        }
    }

    /// The `id` (1.2) or `message-id` (1.0, 1.1) an ACK, NACK or RENEW
    /// names its delivery by.
    fn ack_id_of<'f>(&self, frame: &'f Frame) -> Result<&'f str, StompError> {
        let id = if self.version == Version::V1_2 {
            frame
                .known(KnownHeader::Id)
                .or_else(|| frame.known(KnownHeader::MessageId))
        } else {
            frame
                .known(KnownHeader::MessageId)
                .or_else(|| frame.known(KnownHeader::Id))
        };
        match id {
            Some(id) => Ok(id),
            None if self.version == Version::V1_2 => required(frame, KnownHeader::Id),
            None => required(frame, KnownHeader::MessageId),
        }
    }

    /// The lease of a delivery ran out (the core took it back).
    pub(crate) fn lease_expired(&mut self, consumer: ConsumerId, tag: DeliveryTag) {
        if let Some(sub) = self.subs.get_mut(&consumer) {
            sub.lease_expired(tag);
        }
    }

    fn ack(
        &mut self,
        config: &StompConfig,
        frame: &Frame,
        outcome: Outcome,
    ) -> Result<Done, StompError> {
        let id = self.ack_id_of(frame)?;
        let unknown = || StompError::UnknownAckId(id.to_owned());
        if id == END_OF_BROWSE_MESSAGE_ID && self.subs.values().any(|s| s.browse) {
            trace!(
                conn_id = self.conn_id,
                "ACK/NACK of an end-of-browse MESSAGE ignored"
            );
            return Ok(Done::now());
        }
        let (consumer, tag) = parse_ack_id(id).ok_or_else(unknown)?;
        let sub_id = self.subscription_id(consumer).ok_or_else(unknown)?;
        if frame
            .known(KnownHeader::Subscription)
            .is_some_and(|s| s != sub_id)
        {
            return Err(unknown());
        }
        let txn_name = frame.known(KnownHeader::Transaction);
        let txn = self.txn_id(frame)?;
        let sub = self.subs.get_mut(&consumer).ok_or_else(unknown)?;
        if sub.browse {
            // A browser's copies were settled as they were sent (there is
            // nothing to take or give back); ActiveMQ clients ACK them all
            // the same, so the ACK (or NACK) is taken and does nothing.
            trace!(conn_id = self.conn_id, %id, "ACK/NACK of a browsed copy ignored");
            return Ok(Done::now());
        }
        if sub.was_expired(tag, true) {
            return Ok(self.late(id));
        }
        let tags = sub.take_acked(tag).ok_or_else(unknown)?;
        let txns = self.rare.as_deref().map(|r| &r.txns);
        if let Some(t) = txn_name.and_then(|n| txns?.get(n)) {
            if t.acked.len() + tags.len() > config.transaction_acks_max {
                return Err(StompError::LimitExceeded {
                    what: "acknowledgements in one transaction",
                    max: config.transaction_acks_max,
                });
            }
        }
        let confirm = txn.is_none() && frame.known(KnownHeader::Receipt).is_some();
        let mut tickets = Tickets::new();
        let mut lease_expired = false;
        let mut each: &[DeliveryTag] = &tags;
        if sub.stream && txn.is_none() {
            // A stream reader's cumulative ACK: one call settles all but
            // the last (and serves the reader once, not once per
            // delivery); the last, alone, carries the receipt's wait for
            // the group's offset, which covers the ones before it.
            if let Some((last, before)) = tags.split_last() {
                if !before.is_empty() {
                    let many: Vec<(ConsumerId, DeliveryTag)> =
                        before.iter().map(|t| (consumer, *t)).collect();
                    if self.session.settle_many(&many, outcome)? < many.len() {
                        return Err(unknown());
                    }
                }
                each = std::slice::from_ref(last);
            }
        }
        for t in each {
            match self.session.settle(consumer, *t, outcome, txn, confirm) {
                Ok(Some(ticket)) => tickets.push(ticket),
                Ok(None) => {}
                // Expired before this connection heard of it: not applied.
                Err(BrokerError::LeaseExpired) => lease_expired = true,
                Err(e) => return Err(e.into()),
            }
        }
        let txns = self.rare.as_deref_mut().map(|r| &mut r.txns);
        if let Some(t) = txn_name.and_then(|n| txns?.get_mut(n)) {
            t.acked.extend(tags.iter().map(|tag| (consumer, *tag)));
        }
        Ok(Done {
            tickets,
            disconnect: false,
            lease_expired,
        })
    }

    fn begin(&mut self, config: &StompConfig, frame: &Frame) -> Result<Done, StompError> {
        let name = required(frame, KnownHeader::Transaction)?;
        let txns = self.rare.as_deref().map(|r| &r.txns);
        if txns.is_some_and(|t| t.contains_key(name)) {
            return Err(StompError::DuplicateTransaction(name.to_owned()));
        }
        if txns.map_or(0, |t| t.len()) >= config.transactions_max {
            return Err(StompError::LimitExceeded {
                what: "open transactions",
                max: config.transactions_max,
            });
        }
        let id = self.session.begin();
        self.rare().txns.insert(
            name.to_owned(),
            Txn {
                id,
                acked: Vec::new(),
            },
        );
        Ok(Done::now())
    }

    fn take_txn(&mut self, frame: &Frame) -> Result<Txn, StompError> {
        let name = required(frame, KnownHeader::Transaction)?;
        self.rare
            .as_deref_mut()
            .and_then(|r| r.txns.remove(name))
            .ok_or_else(|| StompError::UnknownTransaction(name.to_owned()))
    }

    fn commit(&mut self, frame: &Frame) -> Result<Done, StompError> {
        let txn = self.take_txn(frame)?;
        let ticket = self.session.commit(txn.id)?;
        Ok(Done {
            tickets: [ticket].into_iter().collect(),
            disconnect: false,
            lease_expired: false,
        })
    }

    fn abort(&mut self, frame: &Frame) -> Result<Done, StompError> {
        let txn = self.take_txn(frame)?;
        self.session.rollback(txn.id)?;
        // The staged acks never happened: those messages are unacked again.
        let mut by_consumer: HashMap<ConsumerId, Vec<DeliveryTag>> = HashMap::new();
        for (c, t) in txn.acked {
            by_consumer.entry(c).or_default().push(t);
        }
        for (c, tags) in by_consumer {
            if let Some(sub) = self.subs.get_mut(&c) {
                sub.restore(&tags);
            }
        }
        Ok(Done::now())
    }
}

/// `parse_destination` only yields a topic for `/topic/…`, handled earlier.
fn unreachable_topic(dest: &str) -> Result<String, StompError> {
    Err(bad_destination(
        dest,
        rosetta_neutral::AddressError::MalformedFilter(dest.to_owned()),
    ))
}

/// Client-state key of the topic filter of durable subscription `queue`
/// (the queue name holds the client key, so it is unique without a
/// `client-id`).
fn durable_filter_key(queue: &str) -> String {
    format!("durable-filter/{queue}")
}

fn is_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The durable subscription name a SUBSCRIBE/UNSUBSCRIBE asks for, if any.
fn durable_name<'f>(frame: &'f Frame, id: &'f str) -> Option<&'f str> {
    frame.header("activemq.subscriptionName").or_else(|| {
        (is_true(frame.header("persistent")) || is_true(frame.header("durable"))).then_some(id)
    })
}

/// The prefetch window of a SUBSCRIBE.
fn prefetch(config: &StompConfig, frame: &Frame) -> Result<u32, StompError> {
    let (header, value) = match (
        frame.header("activemq.prefetchSize"),
        frame.header("prefetch-count"),
    ) {
        (Some(v), _) => ("activemq.prefetchSize", v),
        (None, Some(v)) => ("prefetch-count", v),
        (None, None) => return Ok(config.prefetch_default.clamp(1, config.prefetch_max.max(1))),
    };
    let n: u32 = value.trim().parse().map_err(|_| StompError::BadHeader {
        header,
        value: value.to_owned(),
    })?;
    // 0 would mean "pull" in ActiveMQ, which STOMP cannot express: use 1.
    Ok(n.clamp(1, config.prefetch_max.max(1)))
}

/// About the bytes of `d`'s MESSAGE frame, at least for the usual one: its
/// body, its properties and texts, and the broker's own headers
/// (`subscription`, `message-id`, `destination`, `ack`, `content-length`,
/// offsets), which the message's in-memory size (a few hundred bytes of
/// fields) covers.
fn frame_bytes_estimate(d: &Outgoing) -> usize {
    d.message.memory_size()
}
