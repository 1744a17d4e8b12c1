//! Client PUBLISH (QoS 0/1/2) and PUBREL, and the ordered ack queue.
//!
//! Acks leave in the order their PUBLISH (or PUBREL) arrived (MQTT 4.6),
//! each only once every durable write it depends on has committed: the
//! publish itself (`confirm: true`) and, for QoS 2, the persisted set of
//! packet ids awaiting PUBREL.

use std::sync::Arc;

use super::subscribe::STREAM_TOPIC_PREFIX;
use rosetta_neutral::address::{validate_topic_name, MQTT_QUEUE_TOPIC_PREFIX};
use rosetta_neutral::{Address, BrokerError, PublishOptions, Ticket};

use super::{Ctx, Open};
use crate::codec::encode::{self, AckKind};
use crate::codec::{AckPacket, PublishPacket, Version};
use crate::convert::inbound_message;
use crate::delayed;
use crate::error::{broker_reason, MqttError, ReasonContext};
use crate::inflight::{encode_qos2_set, QOS2_INBOUND_STATE_KEY};

/// An ack waiting for its commits.
#[derive(Debug)]
pub(super) struct PendingAck {
    kind: AckKind,
    pkid: u16,
    reason: u8,
    /// Why it failed (a v5 Reason String, sent only when the client did
    /// not turn problem information off).
    why: Option<String>,
    /// Commits still outstanding; sent when empty and at the front.
    tickets: Vec<Ticket>,
}

impl Open {
    pub(super) fn on_publish(&mut self, ctx: Ctx<'_>, p: PublishPacket) -> Result<(), MqttError> {
        let cfg = ctx.config;
        if p.qos > cfg.qos_max {
            return Err(MqttError::QosNotSupported(p.qos));
        }
        if p.retain && !cfg.retain_available {
            return Err(MqttError::RetainNotSupported);
        }
        let alias = p.topic_alias();
        let topic = self.resolve_topic(cfg.topic_alias_max, p.topic, alias)?;
        if validate_topic_name(&topic).is_err() {
            return Err(MqttError::TopicNameInvalid(topic));
        }
        // `$delayed/<seconds>/<topic>` goes to `<topic>`, later.
        let (delay_ms, target) = match delayed::parse(&topic) {
            Ok(None) => (None, topic.as_str()),
            Ok(Some(d)) => (Some(d.delay_ms), d.topic),
            Err(()) => return Err(MqttError::TopicNameInvalid(topic)),
        };
        // `$queue/q` sends to the queue `q` (how an MQTT responder answers
        // a STOMP or AMQP requester whose reply-to is a queue); the core
        // checks the publish permission on `/queue/q`.
        // `$stream/s` appends to the stream `s`, declared at first use; a
        // refusal is the publish's, answered like a refused publish below.
        let plain = delay_ms.is_none()
            && !target.starts_with(STREAM_TOPIC_PREFIX)
            && !target.starts_with(MQTT_QUEUE_TOPIC_PREFIX);
        let address = if plain {
            // A topic name, checked above: the address takes it as it is,
            // without a copy.
            Ok(Address::Topic(topic))
        } else {
            match target.strip_prefix(STREAM_TOPIC_PREFIX) {
                Some(name) => self.stream_address(name),
                None => match Address::from_mqtt_topic(target) {
                    Ok(a) => Ok(a),
                    Err(_) => return Err(MqttError::TopicNameInvalid(topic)),
                },
            }
        };

        if p.qos == 2
            && self
                .flows
                .as_ref()
                .is_some_and(|f| f.awaiting_rel.contains(&p.pkid))
        {
            // A resend of a QoS 2 publish already routed: acknowledge again,
            // route nothing (exactly once, MQTT 4.3.3).
            self.push_ack(AckKind::PubRec, p.pkid, 0, Vec::new());
            self.flush_acks(ctx.out);
            return Ok(());
        }
        if p.qos > 0 && self.version == Version::V5 {
            let flows = self.flows();
            let in_flight = flows.qos1_pending + flows.awaiting_rel.len();
            if in_flight >= usize::from(cfg.receive_maximum) {
                return Err(MqttError::ReceiveMaximumExceeded(cfg.receive_maximum));
            }
        }

        let props = p.props.map(|props| *props).unwrap_or_default();
        let mut message = inbound_message(p.qos, p.retain, props, p.payload, ctx.now_ms)?;
        message.delivery_time = delay_ms
            .filter(|&ms| ms > 0)
            .map(|ms| ctx.now_ms.saturating_add(ms));
        let options = PublishOptions {
            txn: None,
            confirm: p.qos > 0,
        };
        // A match, not `and_then` with a closure: the closure took the
        // 424-byte message by value, one more copy of it per publish.
        let result = match address {
            Ok(address) => {
                // Handed over with the message: the core keeps both, the
                // message in this `Arc`, without another copy.
                message.address = Some(address);
                self.session.publish_addressed(Arc::new(message), options)
            }
            Err(e) => Err(e),
        };
        let receipt = match (result, p.qos, self.version) {
            (Ok(receipt), _, _) => receipt,
            (Err(e), 0, _) => {
                // No way to tell a QoS 0 publisher; drop it.
                tracing::debug!(conn_id = ctx.conn_id, error = %e, "QoS 0 publish refused");
                return Ok(());
            }
            (Err(e), _, Version::V311) => {
                // 3.1.1 has no negative ack: close (MQTT-3.3.5-2).
                return Err(MqttError::Broker(e));
            }
            (Err(e), qos, Version::V5) => {
                let kind = if qos == 1 {
                    AckKind::PubAck
                } else {
                    AckKind::PubRec
                };
                if qos == 1 {
                    self.flows().qos1_pending += 1;
                }
                let reason = broker_reason(&e, ReasonContext::Publish);
                self.push_ack(kind, p.pkid, reason, Vec::new());
                self.set_last_ack_reason(&e);
                self.flush_acks(ctx.out);
                return Ok(());
            }
        };
        let no_match = if receipt.routed == 0 && self.version == Version::V5 {
            0x10
        } else {
            0
        };
        let mut tickets: Vec<Ticket> = receipt.pending.into_iter().collect();
        match p.qos {
            0 => return Ok(()),
            1 => {
                self.flows().qos1_pending += 1;
                self.push_ack(AckKind::PubAck, p.pkid, no_match, tickets);
            }
            _ => {
                self.flows().awaiting_rel.insert(p.pkid);
                tickets.extend(self.persist_awaiting_rel()?);
                self.push_ack(AckKind::PubRec, p.pkid, no_match, tickets);
            }
        }
        self.flush_acks(ctx.out);
        Ok(())
    }

    /// The stream `name` of a `$stream/<name>` PUBLISH, declared at first
    /// use. A name with a `/` (or none) is no stream name; a name that is
    /// a plain queue, or past the streams limit, is refused by the core.
    fn stream_address(&mut self, name: &str) -> Result<Address, BrokerError> {
        if name.is_empty() || name.contains('/') {
            return Err(BrokerError::InvalidAddress(format!(
                "'{STREAM_TOPIC_PREFIX}{name}': a stream name is one topic level"
            )));
        }
        if let Err(e) = self.session.declare_stream(name) {
            tracing::debug!(stream = name, error = %e, "publish to a stream refused");
            return Err(e);
        }
        Ok(Address::Queue(name.to_owned()))
    }

    /// Applies a v5 topic alias: an alias with a topic defines it, an alias
    /// alone uses it (MQTT 5 §3.3.2.3.4).
    fn resolve_topic(
        &mut self,
        alias_max: u16,
        topic: String,
        alias: Option<u16>,
    ) -> Result<String, MqttError> {
        match alias {
            None if topic.is_empty() => Err(MqttError::TopicNameInvalid(topic)),
            None => Ok(topic),
            Some(a) if a == 0 || a > alias_max => Err(MqttError::TopicAliasInvalid(a)),
            Some(a) if topic.is_empty() => self
                .aliases
                .as_ref()
                .and_then(|aliases| aliases.incoming.get(&a))
                .cloned()
                .ok_or(MqttError::Protocol("unknown topic alias")),
            Some(a) => {
                self.aliases().incoming.insert(a, topic.clone());
                Ok(topic)
            }
        }
    }

    pub(super) fn on_pubrel(&mut self, ctx: Ctx<'_>, a: AckPacket) -> Result<(), MqttError> {
        if self.flows().awaiting_rel.remove(&a.pkid) {
            // PUBCOMP only once the id is durably forgotten, or a restart
            // would drop the client's next QoS 2 publish reusing the id.
            let tickets = self.persist_awaiting_rel()?.into_iter().collect();
            self.push_ack(AckKind::PubComp, a.pkid, 0, tickets);
        } else {
            // Already released (a resent PUBREL): still complete the flow.
            let reason = if self.version == Version::V5 { 0x92 } else { 0 };
            self.push_ack(AckKind::PubComp, a.pkid, reason, Vec::new());
        }
        self.flush_acks(ctx.out);
        Ok(())
    }

    fn persist_awaiting_rel(&mut self) -> Result<Option<Ticket>, MqttError> {
        let awaiting_rel = &self.flows().awaiting_rel;
        let value = (!awaiting_rel.is_empty()).then(|| encode_qos2_set(awaiting_rel));
        self.session
            .put_state(QOS2_INBOUND_STATE_KEY, value)
            .map_err(MqttError::Broker)
    }

    fn push_ack(&mut self, kind: AckKind, pkid: u16, reason: u8, tickets: Vec<Ticket>) {
        self.flows().acks.push_back(PendingAck {
            kind,
            pkid,
            reason,
            why: None,
            tickets,
        });
    }

    /// Explains the ack just queued with `err`.
    fn set_last_ack_reason(&mut self, err: &BrokerError) {
        if let Some(ack) = self.flows().acks.back_mut() {
            ack.why = Some(err.to_string());
        }
    }

    /// A durable write finished: release the acks that waited for it.
    pub(super) fn on_committed(
        &mut self,
        ctx: Ctx<'_>,
        ticket: Ticket,
        result: Result<(), BrokerError>,
    ) -> Result<(), MqttError> {
        let mut failed_rec = Vec::new();
        let version = self.version;
        let Some(flows) = self.flows.as_deref_mut() else {
            // No ack waits for it (the session's own writes at CONNECT):
            // an idle connection makes no flows for it.
            return Ok(());
        };
        for ack in flows.acks.iter_mut() {
            let before = ack.tickets.len();
            ack.tickets.retain(|t| *t != ticket);
            if ack.tickets.len() == before {
                continue;
            }
            if let Err(e) = &result {
                if version == Version::V311 {
                    // No negative ack in 3.1.1: the client must not believe
                    // the message is safe.
                    return Err(MqttError::Broker(e.clone()));
                }
                if ack.kind != AckKind::PubComp {
                    ack.reason = broker_reason(e, ReasonContext::Publish);
                    ack.why = Some(e.to_string());
                }
                if ack.kind == AckKind::PubRec {
                    failed_rec.push(ack.pkid);
                }
            }
        }
        // A failed PUBREC ends the QoS 2 flow (MQTT 5 §4.3.3).
        if !failed_rec.is_empty() {
            for pkid in failed_rec {
                self.flows().awaiting_rel.remove(&pkid);
            }
            // Forget them durably too, or a restart would drop the next
            // publish reusing the id as a duplicate.
            self.persist_awaiting_rel()?;
        }
        self.flush_acks(ctx.out);
        Ok(())
    }

    /// Sends acks from the front while their commits are done.
    pub(super) fn flush_acks(&mut self, out: &mut bytes::BytesMut) {
        let Some(flows) = self.flows.as_deref_mut() else {
            return;
        };
        while flows.acks.front().is_some_and(|a| a.tickets.is_empty()) {
            let Some(ack) = flows.acks.pop_front() else {
                break;
            };
            if ack.kind == AckKind::PubAck {
                flows.qos1_pending = flows.qos1_pending.saturating_sub(1);
            }
            // MQTT 5 §3.1.2.11.7: no Reason String on acks for a client
            // that asked for no problem information.
            let why = ack.why.as_deref().filter(|_| self.problem_info);
            encode::ack_with_reason(
                self.version,
                ack.kind,
                ack.pkid,
                ack.reason,
                why,
                self.client_packet_max,
                out,
            );
        }
    }
}
