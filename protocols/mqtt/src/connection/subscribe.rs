//! SUBSCRIBE and UNSUBSCRIBE.
//!
//! Each filter becomes a binding of the session queue (the core copies a
//! message into the queue once however many bindings match, and reports
//! all matches in `Delivery::matched`). A shared subscription
//! `$share/group/filter` is a queue of that name bound to `filter`, with
//! one consumer per member. `$queue/<name>` consumes the queue `<name>`
//! itself. Both kinds are consumers, which end with the connection, so a
//! persistent session saves them (`own_subs`) and re-attaches them on
//! resume. A shared subscription of a stream, `$share/group/$stream/s`,
//! reads `s` as a member of the stream's consumer group `group` (see
//! [`Open::subscribe_stream`]).

use rosetta_neutral::address::MQTT_QUEUE_TOPIC_PREFIX;
use rosetta_neutral::{StreamOffset, StreamRead, STREAM_GROUP_BYTES_MAX};

/// MQTT topic prefix of streams: PUBLISH to `$stream/s` appends to the
/// stream `s`; SUBSCRIBE to `$stream/s` or `$stream/s/<spec>` reads it.
pub(crate) const STREAM_TOPIC_PREFIX: &str = "$stream/";
use rosetta_neutral::address::{is_wildcard, validate_topic_filter};
use rosetta_neutral::{
    Address, BindingOptions, ConsumerSpec, CreditMode, Guarantee, QueueLifetime, QueueSpec,
    RetainedOnBind, SHARED_SUBSCRIPTION_PREFIX,
};

use std::time::Duration;

use super::outbound::STREAM_OFFSET_PROPERTY;
use super::{Ctx, Open, SharedSub};
use crate::codec::encode;
use crate::codec::{SubscribePacket, SubscriptionRequest, UnsubscribePacket, Version};
use crate::config::MqttConfig;
use crate::error::{broker_reason, MqttError, ReasonContext};
use crate::own_subs::{self, OwnSub, OWN_SUBSCRIPTIONS_STATE_KEY};

/// A `$share/group/filter` split into its parts.
struct Shared<'a> {
    group: &'a str,
    filter: &'a str,
}

/// Splits a shared subscription; `Some(Err(code))` if it is malformed.
fn parse_shared(full: &str) -> Option<Result<Shared<'_>, u8>> {
    let rest = full.strip_prefix(SHARED_SUBSCRIPTION_PREFIX)?;
    let Some((group, filter)) = rest.split_once('/') else {
        return Some(Err(0x8F));
    };
    if group.is_empty() || group.contains(['+', '#']) || filter.is_empty() {
        return Some(Err(0x8F));
    }
    Some(Ok(Shared { group, filter }))
}

/// Whether `filter` reads a stream: `$stream/...`, or a shared
/// subscription of one, `$share/<group>/$stream/...`.
pub(super) fn is_stream_filter(filter: &str) -> bool {
    match parse_shared(filter) {
        Some(Ok(shared)) => shared.filter.starts_with(STREAM_TOPIC_PREFIX),
        Some(Err(_)) => false,
        None => filter.starts_with(STREAM_TOPIC_PREFIX),
    }
}

impl Open {
    pub(super) fn on_subscribe(
        &mut self,
        ctx: Ctx<'_>,
        s: SubscribePacket,
    ) -> Result<(), MqttError> {
        if s.props.subscription_id.is_some() && !ctx.config.subscription_identifiers_available {
            return Err(MqttError::SubscriptionIdsNotSupported);
        }
        let before = self.own_subs_snapshot();
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut refused = Vec::new();
        // Where `$stream/` filters of this SUBSCRIBE start (MQTT 5): its
        // first `x-stream-offset` user property, as STOMP's header.
        let stream_offset = s
            .props
            .user_properties
            .iter()
            .find(|(k, _)| k == STREAM_OFFSET_PROPERTY)
            .map(|(_, v)| v.as_str());
        for req in &s.filters {
            let code = match self.subscribe_one(
                ctx.config,
                req,
                s.props.subscription_id,
                stream_offset,
            )? {
                Ok(granted) => granted,
                Err(code) => {
                    tracing::debug!(conn_id = ctx.conn_id, filter = %req.filter, code, "subscription refused");
                    refused.push((req.filter.as_str(), code));
                    code
                }
            };
            codes.push(code);
        }
        if self.own_subs_snapshot() != before {
            self.persist_own_subs(ctx.conn_id);
        }
        let why = self.problem_info.then(|| refusal_text(&refused)).flatten();
        encode::suback(
            self.version,
            s.pkid,
            &codes,
            why,
            self.client_packet_max,
            ctx.out,
        )?;
        Ok(())
    }

    /// The persisted form of the subscriptions with their own consumer.
    fn own_subs_snapshot(&self) -> Vec<OwnSub> {
        self.shared.values().map(|s| s.saved.clone()).collect()
    }

    /// Saves the list of shared and `$queue/` subscriptions, for a session
    /// that outlives the connection. Not awaited: like a binding made by
    /// SUBSCRIBE, the list is durable with the next journal write.
    pub(super) fn persist_own_subs(&mut self, conn_id: u64) {
        if self.session_expiry_s == 0 {
            return;
        }
        let value = (!self.shared.is_empty())
            .then(|| own_subs::encode(self.shared.values().map(|s| &s.saved)));
        if let Err(e) = self.session.put_state(OWN_SUBSCRIPTIONS_STATE_KEY, value) {
            tracing::warn!(conn_id, error = %e, "could not save the shared and $queue subscriptions");
        }
    }

    /// Re-attaches the shared and `$queue/` subscriptions of a resumed
    /// session. One that cannot be re-created (its queue is gone and cannot
    /// be auto-created, permissions changed) is dropped from the session.
    pub(super) fn restore_own_subs(&mut self, cfg: &MqttConfig, conn_id: u64) {
        let Some(saved) = self.session.get_state(OWN_SUBSCRIPTIONS_STATE_KEY) else {
            return;
        };
        let Some(subs) = own_subs::decode(&saved) else {
            tracing::warn!(conn_id, "unreadable saved subscriptions dropped");
            self.persist_own_subs(conn_id);
            return;
        };
        // More than the cap only if the cap was lowered since they were made.
        let mut dropped = subs.len() > cfg.own_subscriptions_max;
        for sub in subs.into_iter().take(cfg.own_subscriptions_max) {
            let filter = sub.filter.clone();
            let r = if filter.starts_with(MQTT_QUEUE_TOPIC_PREFIX) {
                self.subscribe_queue(sub)
            } else if is_stream_filter(&filter) {
                self.subscribe_stream(sub, true, None)
            } else {
                match parse_shared(&filter) {
                    Some(Ok(shared)) => {
                        let options = BindingOptions {
                            max_guarantee: Guarantee::from_qos(sub.qos)
                                .unwrap_or(Guarantee::AtMostOnce),
                            subscription_id: sub.subscription_id,
                            no_local: false,
                            retain_as_published: sub.retain_as_published,
                            retained: RetainedOnBind::None,
                            excluded: Default::default(),
                        };
                        let inner = shared.filter.to_owned();
                        self.subscribe_shared(cfg, sub, &inner, options)
                    }
                    _ => Err(0x8F),
                }
            };
            if let Err(code) = r {
                tracing::info!(conn_id, filter = %filter, code, "saved subscription not restored");
                dropped = true;
            }
        }
        tracing::debug!(
            conn_id,
            restored = self.shared.len(),
            "shared and $queue subscriptions resumed"
        );
        if dropped {
            self.persist_own_subs(conn_id);
        }
    }

    /// `$queue/<name>`: consumes the queue itself, competing with its other
    /// consumers (STOMP, AMQP, other MQTT clients), the way a PUBLISH to
    /// `$queue/<name>` feeds it. Deliveries carry the topic `$queue/<name>`.
    /// A stream subscription, `$stream/<name>` or `$stream/<name>/<spec>`
    /// (`first`, `last`, `next`, `offset=N`, `timestamp=T`): a consumer of
    /// ours reading the stream. A persistent session's subscription is a
    /// consumer group (`mqtt/<client id>/<filter>`), so a reconnect goes on
    /// from the last acknowledged offset; `resumed` (a restored
    /// subscription) starts there rather than at the spec again.
    /// `property_spec` (the MQTT 5 user property `x-stream-offset`) is the
    /// spec of a filter without one; the filter's own suffix wins. A bad
    /// spec is SUBACK 0x8F.
    ///
    /// `$share/<group>/$stream/<name>[/<spec>]` reads as a member of the
    /// consumer group `<group>`, the group STOMP names with
    /// `x-stream-group:<group>`: the members of a partitioned stream's
    /// group share its partitions, whatever their protocol or session, and
    /// a member that joins without a spec starts at the group's committed
    /// offset.
    fn subscribe_stream(
        &mut self,
        sub: OwnSub,
        resumed: bool,
        property_spec: Option<&str>,
    ) -> Result<u8, u8> {
        let (share_group, stream_filter) = match parse_shared(&sub.filter) {
            Some(Ok(shared)) => (Some(shared.group), shared.filter),
            Some(Err(code)) => return Err(code),
            None => (None, sub.filter.as_str()),
        };
        if share_group.is_some_and(|g| g.len() > STREAM_GROUP_BYTES_MAX) {
            return Err(0x8F);
        }
        let rest = stream_filter
            .strip_prefix(STREAM_TOPIC_PREFIX)
            .unwrap_or_default();
        let (name, spec) = match rest.split_once('/') {
            Some((n, s)) => (n, Some(s)),
            None => (rest, property_spec),
        };
        if name.is_empty() {
            return Err(0x8F);
        }
        let offset = match spec.map(StreamOffset::parse) {
            None => None,
            Some(Ok(o)) => Some(o),
            Some(Err(_)) => return Err(0x8F),
        };
        let group = match share_group {
            Some(g) => Some(g.to_owned()),
            None => (self.session_expiry_s > 0)
                .then(|| format!("mqtt/{}/{}", self.client_id, sub.filter)),
        };
        let read = StreamRead {
            offset: if resumed && group.is_some() {
                None
            } else {
                offset
            },
            group,
            declare: true,
        };
        let granted = sub.qos;
        self.consume_own_with(name.to_owned(), Some(granted), sub, Some(read))
            .map(|()| granted)
            .map_err(|e| broker_reason(&e, ReasonContext::Subscribe))
    }

    fn subscribe_queue(&mut self, sub: OwnSub) -> Result<u8, u8> {
        let Ok(Address::Queue(queue)) = Address::from_mqtt_topic(&sub.filter) else {
            return Err(0x8F);
        };
        let granted = sub.qos;
        self.consume_own(queue, Some(granted), sub)
            .map(|()| granted)
            .map_err(|e| broker_reason(&e, ReasonContext::Subscribe))
    }

    /// A shared subscription: the queue named by the whole `$share/g/f`,
    /// bound to `filter`, with a consumer of ours.
    ///
    /// The first member to subscribe decides how long the queue lasts (the
    /// core never changes a queue's durability): a clean session's is
    /// dropped with its last consumer; a persistent session's is durable and
    /// keeps collecting the group's messages while no member is connected,
    /// until it has been idle for the session expiry (at most the maximum
    /// session expiry, also for 3.1.1 sessions that never expire, so an
    /// abandoned group does not fill forever).
    fn subscribe_shared(
        &mut self,
        cfg: &MqttConfig,
        sub: OwnSub,
        filter: &str,
        options: BindingOptions,
    ) -> Result<u8, u8> {
        let reason = |e: rosetta_neutral::BrokerError| broker_reason(&e, ReasonContext::Subscribe);
        let queue = sub.filter.clone();
        let granted = sub.qos;
        self.session
            .declare_queue(self.shared_queue_spec(cfg, &queue))
            .map_err(reason)?;
        self.session.bind(&queue, filter, options).map_err(reason)?;
        self.consume_own(queue, None, sub).map_err(reason)?;
        Ok(granted)
    }

    /// How a shared subscription's queue is declared (see
    /// [`Self::subscribe_shared`]).
    pub(super) fn shared_queue_spec(&self, cfg: &MqttConfig, queue: &str) -> QueueSpec {
        let (durable, lifetime) = match self.session_expiry_s {
            0 => (false, QueueLifetime::Consumer),
            s => (
                true,
                QueueLifetime::IdleFor(Duration::from_secs(u64::from(
                    s.min(cfg.session_expiry_max_s).max(1),
                ))),
            ),
        };
        QueueSpec {
            name: Some(queue.to_owned()),
            durable,
            lifetime,
            bindings_max: None,
        }
    }

    /// Gives the subscription `sub.filter` a consumer of its own on `queue`
    /// (a shared subscription's queue, or the queue of `$queue/<name>`),
    /// unless it has one already; a repeated SUBSCRIBE updates its QoS and
    /// options.
    fn consume_own(
        &mut self,
        queue: String,
        queue_qos: Option<u8>,
        sub: OwnSub,
    ) -> Result<(), rosetta_neutral::BrokerError> {
        self.consume_own_with(queue, queue_qos, sub, None)
    }

    /// [`Self::consume_own`], reading a stream when `stream` says so.
    fn consume_own_with(
        &mut self,
        queue: String,
        queue_qos: Option<u8>,
        sub: OwnSub,
        stream: Option<StreamRead>,
    ) -> Result<(), rosetta_neutral::BrokerError> {
        if let Some(existing) = self.shared.get_mut(&sub.filter) {
            existing.queue_qos = queue_qos;
            existing.saved = sub;
            return Ok(());
        }
        let consumer = self.session.consume(ConsumerSpec {
            queue,
            credit: CreditMode::Window(self.window),
            auto_settle: false,
            options: rosetta_neutral::ConsumerOptions {
                stream,
                ..Default::default()
            },
        })?;
        self.shared.insert(
            sub.filter.clone(),
            SharedSub {
                consumer,
                queue_qos,
                saved: sub,
            },
        );
        Ok(())
    }

    /// `Ok(Ok(qos))` granted, `Ok(Err(code))` refused, `Err` fatal.
    fn subscribe_one(
        &mut self,
        cfg: &MqttConfig,
        req: &SubscriptionRequest,
        subscription_id: Option<u32>,
        stream_offset: Option<&str>,
    ) -> Result<Result<u8, u8>, MqttError> {
        let v5 = self.version == Version::V5;
        let granted = req.qos.min(cfg.qos_max);
        let own = OwnSub {
            filter: req.filter.clone(),
            qos: granted,
            retain_as_published: v5 && req.retain_as_published,
            subscription_id: if v5 { subscription_id } else { None },
        };
        let own_quota_full = !self.shared.contains_key(&req.filter)
            && self.shared.len() >= cfg.own_subscriptions_max;
        if req.filter.starts_with(MQTT_QUEUE_TOPIC_PREFIX) {
            if own_quota_full {
                return Ok(Err(0x97));
            }
            return Ok(self.subscribe_queue(own));
        }
        if req.filter.starts_with(STREAM_TOPIC_PREFIX) {
            if own_quota_full {
                return Ok(Err(0x97));
            }
            return Ok(self.subscribe_stream(own, false, stream_offset));
        }
        let shared = match parse_shared(&req.filter) {
            Some(Err(code)) => return Ok(Err(code)),
            Some(Ok(s)) => Some(s),
            None => None,
        };
        if shared.is_some() && v5 && req.no_local {
            // MQTT 5 §3.8.3.1.
            return Err(MqttError::Protocol("no-local on a shared subscription"));
        }
        if shared
            .as_ref()
            .is_some_and(|s| s.filter.starts_with(STREAM_TOPIC_PREFIX))
        {
            if !cfg.shared_subscriptions_available {
                return Ok(Err(0x9E));
            }
            if own_quota_full {
                return Ok(Err(0x97));
            }
            return Ok(self.subscribe_stream(own, false, stream_offset));
        }
        let filter = shared.as_ref().map_or(req.filter.as_str(), |s| s.filter);
        if validate_topic_filter(filter).is_err() {
            return Ok(Err(0x8F));
        }
        if shared.is_some() && !cfg.shared_subscriptions_available {
            return Ok(Err(0x9E));
        }
        if is_wildcard(filter) && !cfg.wildcard_subscriptions_available {
            return Ok(Err(0xA2));
        }
        let options = BindingOptions {
            max_guarantee: Guarantee::from_qos(granted).unwrap_or(Guarantee::AtMostOnce),
            subscription_id: own.subscription_id,
            no_local: v5 && req.no_local,
            retain_as_published: own.retain_as_published,
            // Retained messages are not sent to shared subscriptions.
            retained: match (shared.is_some(), v5, req.retain_handling) {
                (true, _, _) => RetainedOnBind::None,
                (false, false, _) | (false, true, 0) => RetainedOnBind::Send,
                (false, true, 1) => RetainedOnBind::SendIfNew,
                _ => RetainedOnBind::None,
            },
            excluded: Default::default(),
        };
        if shared.is_none() {
            let queue = self.session_queue();
            return Ok(self
                .session_queue_consumer(cfg, &queue)
                .and_then(|()| self.session.bind(&queue, filter, options))
                .map(|_| granted)
                .map_err(|e| broker_reason(&e, ReasonContext::Subscribe)));
        }
        if own_quota_full {
            return Ok(Err(0x97));
        }
        let filter = filter.to_owned();
        Ok(self.subscribe_shared(cfg, own, &filter, options))
    }

    /// Creates the queue of a clean, non-lasting session and its consumer,
    /// on its first subscription (see `establish`); nothing for a session
    /// that has them.
    fn session_queue_consumer(
        &mut self,
        cfg: &MqttConfig,
        queue: &str,
    ) -> Result<(), rosetta_neutral::BrokerError> {
        if self.session_consumer.is_some() {
            return Ok(());
        }
        self.session.declare_queue(QueueSpec {
            name: Some(queue.to_owned()),
            durable: false,
            lifetime: QueueLifetime::Session,
            bindings_max: Some(cfg.subscriptions_max),
        })?;
        let consumer = self.session.consume(ConsumerSpec {
            queue: queue.to_owned(),
            credit: CreditMode::Window(self.window),
            auto_settle: false,
            options: Default::default(),
        })?;
        self.session_consumer = Some(consumer);
        Ok(())
    }

    /// Ends a subscription with a consumer of its own (shared, `$queue/`):
    /// the UNSUBACK code.
    fn cancel_own_consumer(&mut self, full: &str) -> u8 {
        match self.shared.remove(full) {
            Some(sub) => match self.session.cancel(sub.consumer) {
                Ok(()) => 0x00,
                Err(e) => broker_reason(&e, ReasonContext::Subscribe),
            },
            None => 0x11,
        }
    }

    pub(super) fn on_unsubscribe(
        &mut self,
        ctx: Ctx<'_>,
        u: UnsubscribePacket,
    ) -> Result<(), MqttError> {
        let own_before = self.shared.len();
        let mut codes = Vec::with_capacity(u.filters.len());
        let mut refused = Vec::new();
        for full in &u.filters {
            let code = match parse_shared(full) {
                _ if full.starts_with(MQTT_QUEUE_TOPIC_PREFIX)
                    || full.starts_with(STREAM_TOPIC_PREFIX) =>
                {
                    self.cancel_own_consumer(full)
                }
                Some(Err(code)) => code,
                // The binding stays: other members still use the queue,
                // which goes away with its last consumer (or, durable,
                // once idle for its lifetime).
                Some(Ok(_)) => self.cancel_own_consumer(full),
                None if validate_topic_filter(full).is_err() => 0x8F,
                // No session queue yet: nothing was ever subscribed.
                None if self.session_consumer.is_none() => 0x11,
                None => match self.session.unbind(&self.session_queue(), full) {
                    Ok(true) => 0x00,
                    Ok(false) => 0x11,
                    Err(e) => broker_reason(&e, ReasonContext::Subscribe),
                },
            };
            if code >= 0x80 {
                refused.push((full.as_str(), code));
            }
            codes.push(code);
        }
        if self.shared.len() != own_before {
            self.persist_own_subs(ctx.conn_id);
        }
        let why = self.problem_info.then(|| refusal_text(&refused)).flatten();
        encode::unsuback(
            self.version,
            u.pkid,
            &codes,
            why,
            self.client_packet_max,
            ctx.out,
        )?;
        Ok(())
    }
}

/// The SUBACK/UNSUBACK reason string: which filter was refused and why,
/// short.
fn refusal_text(refused: &[(&str, u8)]) -> Option<String> {
    let (filter, code) = refused.first()?;
    let why = match code {
        0x87 => "not authorized",
        0x8F => "invalid topic filter",
        0x97 => "quota exceeded",
        0x9E => "shared subscriptions not supported",
        0xA1 => "subscription identifiers not supported",
        0xA2 => "wildcard subscriptions not supported",
        _ => "refused",
    };
    let mut text = format!("{filter}: {why}");
    if refused.len() > 1 {
        text.push_str(&format!(" (and {} more refused)", refused.len() - 1));
    }
    Some(text)
}
