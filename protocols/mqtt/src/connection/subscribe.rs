//! SUBSCRIBE and UNSUBSCRIBE.
//!
//! Each filter becomes a binding of the session queue (the core copies a
//! message into the queue once however many bindings match, and reports
//! all matches in `Delivery::matched`). A shared subscription
//! `$share/group/filter` is a queue of that name bound to `filter`, with
//! one consumer per member. `$queue/<name>` consumes the queue `<name>`
//! itself.

use rosetta_neutral::address::MQTT_QUEUE_TOPIC_PREFIX;
use rosetta_neutral::address::{is_wildcard, validate_topic_filter};
use rosetta_neutral::{
    Address, BindingOptions, ConsumerSpec, CreditMode, Guarantee, QueueLifetime, QueueSpec,
    RetainedOnBind, SHARED_SUBSCRIPTION_PREFIX,
};

use super::{Ctx, Open, SharedSub};
use crate::codec::encode;
use crate::codec::{SubscribePacket, SubscriptionRequest, UnsubscribePacket, Version};
use crate::config::MqttConfig;
use crate::error::{broker_reason, MqttError, ReasonContext};

/// A `$share/group/filter` split into its parts.
struct Shared<'a> {
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
    Some(Ok(Shared { filter }))
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
        let mut codes = Vec::with_capacity(s.filters.len());
        for req in &s.filters {
            let code = match self.subscribe_one(ctx.config, req, s.props.subscription_id)? {
                Ok(granted) => granted,
                Err(code) => {
                    tracing::debug!(conn_id = ctx.conn_id, filter = %req.filter, code, "subscription refused");
                    code
                }
            };
            codes.push(code);
        }
        encode::suback(self.version, s.pkid, &codes, ctx.out)?;
        Ok(())
    }

    /// `$queue/<name>`: consumes the queue itself, competing with its other
    /// consumers (STOMP, AMQP, other MQTT clients), the way a PUBLISH to
    /// `$queue/<name>` feeds it. Deliveries carry the topic `$queue/<name>`.
    fn subscribe_queue(&mut self, full: &str, granted: u8) -> Result<u8, u8> {
        let Ok(Address::Queue(queue)) = Address::from_mqtt_topic(full) else {
            return Err(0x8F);
        };
        self.consume_own(full, queue, Some(granted))
            .map(|()| granted)
            .map_err(|e| broker_reason(&e, ReasonContext::Subscribe))
    }

    /// Gives the subscription `key` a consumer of its own on `queue`
    /// (a shared subscription's queue, or the queue of `$queue/<name>`),
    /// unless it has one already.
    fn consume_own(
        &mut self,
        key: &str,
        queue: String,
        queue_qos: Option<u8>,
    ) -> Result<(), rosetta_neutral::BrokerError> {
        if self.shared.contains_key(key) {
            return Ok(());
        }
        let consumer = self.session.consume(ConsumerSpec {
            queue,
            credit: CreditMode::Window(self.window),
            auto_settle: false,
        })?;
        self.shared.insert(
            key.to_owned(),
            SharedSub {
                consumer,
                queue_qos,
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
    ) -> Result<Result<u8, u8>, MqttError> {
        let v5 = self.version == Version::V5;
        if req.filter.starts_with(MQTT_QUEUE_TOPIC_PREFIX) {
            return Ok(self.subscribe_queue(&req.filter, req.qos.min(cfg.qos_max)));
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
        let granted = req.qos.min(cfg.qos_max);
        let options = BindingOptions {
            max_guarantee: Guarantee::from_qos(granted).unwrap_or(Guarantee::AtMostOnce),
            subscription_id: if v5 { subscription_id } else { None },
            no_local: v5 && req.no_local,
            retain_as_published: v5 && req.retain_as_published,
            // Retained messages are not sent to shared subscriptions.
            retained: match (shared.is_some(), v5, req.retain_handling) {
                (true, _, _) => RetainedOnBind::None,
                (false, false, _) | (false, true, 0) => RetainedOnBind::Send,
                (false, true, 1) => RetainedOnBind::SendIfNew,
                _ => RetainedOnBind::None,
            },
        };
        let reason = |e: rosetta_neutral::BrokerError| broker_reason(&e, ReasonContext::Subscribe);
        if shared.is_none() {
            return Ok(self
                .session
                .bind(&self.session_queue, filter, options)
                .map(|_| granted)
                .map_err(reason));
        }
        // The queue is named by the whole `$share/group/filter`.
        let queue = req.filter.clone();
        let declared = self.session.declare_queue(QueueSpec {
            name: Some(queue.clone()),
            durable: false,
            lifetime: QueueLifetime::Consumer,
        });
        if let Err(e) = declared {
            return Ok(Err(reason(e)));
        }
        if let Err(e) = self.session.bind(&queue, filter, options) {
            return Ok(Err(reason(e)));
        }
        if let Err(e) = self.consume_own(&req.filter, queue, None) {
            return Ok(Err(reason(e)));
        }
        Ok(Ok(granted))
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
        let mut codes = Vec::with_capacity(u.filters.len());
        for full in &u.filters {
            let code = match parse_shared(full) {
                _ if full.starts_with(MQTT_QUEUE_TOPIC_PREFIX) => self.cancel_own_consumer(full),
                Some(Err(code)) => code,
                // The binding stays: other members still use the queue,
                // which goes away with its last consumer.
                Some(Ok(_)) => self.cancel_own_consumer(full),
                None if validate_topic_filter(full).is_err() => 0x8F,
                None => match self.session.unbind(&self.session_queue, full) {
                    Ok(true) => 0x00,
                    Ok(false) => 0x11,
                    Err(e) => broker_reason(&e, ReasonContext::Subscribe),
                },
            };
            codes.push(code);
        }
        encode::unsuback(self.version, u.pkid, &codes, ctx.out)?;
        Ok(())
    }
}
