//! Deliveries to the client and the client's PUBACK/PUBREC/PUBCOMP.
//!
//! Delivered QoS = min(publish QoS, highest granted QoS of the matching
//! subscriptions, our maximum). QoS 0 deliveries are settled once their
//! bytes are handed to the driver (`poll_transmit`), so a socket that does
//! not drain keeps the consumer's window full and the core stops sending. QoS 1/2 deliveries keep their consumer slot (the
//! window is the client's receive maximum) until the client completes the
//! flow; their packet id and phase are annotated in the core so a resumed
//! session resends them with DUP and the same id.

use std::collections::HashMap;

use rosetta_neutral::{settle_batch, ConsumerId, Delivery, DeliveryTag, Outcome};

use super::{Ctx, Open};
use crate::codec::encode::{self, AckKind, OutPublish};
use crate::codec::{AckPacket, Version};
use crate::convert::{delivery_topic, outbound_properties};
use crate::error::MqttError;
use crate::inflight::{decode_annotation, encode_annotation, OutFlight, Phase};

/// MQTT 5 user property with a stream delivery's offset.
pub(crate) const STREAM_OFFSET_PROPERTY: &str = "x-stream-offset";
/// MQTT 5 user property on a stream reader's first delivery after
/// retention deleted records it was owed: how many it missed.
const STREAM_MISSED_PROPERTY: &str = "x-stream-missed";

impl Open {
    fn settle(&mut self, conn_id: u64, consumer: ConsumerId, tag: DeliveryTag, outcome: Outcome) {
        if let Err(e) = self.session.settle(consumer, tag, outcome, None, false) {
            tracing::debug!(conn_id, error = %e, "settle failed");
        }
    }

    fn annotate(
        &mut self,
        conn_id: u64,
        consumer: ConsumerId,
        tag: DeliveryTag,
        pkid: u16,
        phase: Phase,
    ) {
        let r = self
            .session
            .annotate(consumer, tag, encode_annotation(pkid, phase));
        if let Err(e) = r {
            tracing::debug!(conn_id, error = %e, "annotate failed");
        }
    }

    /// Settles the QoS 1 deliveries whose PUBACKs came in the last read:
    /// one core call for all of them.
    pub(super) fn settle_acked(&mut self, conn_id: u64) {
        let Some(flows) = self.flows.as_deref_mut() else {
            return;
        };
        let r = settle_batch(self.session.as_mut(), &mut flows.acked, Outcome::Accept);
        if let Err(e) = r {
            tracing::debug!(conn_id, error = %e, "settle failed");
        }
    }

    /// Settles what the client acknowledged and what was written, before
    /// the session closes.
    pub(super) fn settle_before_close(&mut self, conn_id: u64) {
        self.settle_acked(conn_id);
        self.settle_sent_qos0(conn_id);
    }

    /// Settles the QoS 0 deliveries just handed to the driver.
    pub(super) fn settle_sent_qos0(&mut self, conn_id: u64) {
        let Some(flows) = self.flows.as_deref_mut() else {
            return;
        };
        let r = settle_batch(
            self.session.as_mut(),
            &mut flows.unsent_qos0,
            Outcome::Accept,
        );
        if let Err(e) = r {
            tracing::debug!(conn_id, error = %e, "settle failed");
        }
    }

    // Inlined into `handle_event`, so that the delivery is not copied on
    // its way to `send_delivery` (callgrind: 29 instructions a delivery).
    #[inline]
    pub(super) fn on_delivery(&mut self, ctx: Ctx<'_>, d: Delivery) -> Result<(), MqttError> {
        // Keep arrival order: once anything waits, everything waits.
        let window = self.window as usize;
        let hold = match self.flows.as_deref() {
            Some(f) => !f.held.is_empty() || f.outbound.len() >= window,
            None => window == 0,
        };
        if hold {
            self.hold(d);
            return Ok(());
        }
        self.send_delivery(ctx, d)
    }

    /// Keeps a delivery until an in-flight slot frees up.
    #[cold]
    #[inline(never)]
    fn hold(&mut self, d: Delivery) {
        self.flows().held.push_back(d);
    }

    /// Sends held deliveries while in-flight slots are free.
    fn release_held(&mut self, ctx: &mut Ctx<'_>) -> Result<(), MqttError> {
        let window = self.window as usize;
        loop {
            let flows = self.flows();
            if flows.outbound.len() >= window {
                break;
            }
            let Some(d) = flows.held.pop_front() else {
                break;
            };
            self.send_delivery(ctx.reborrow(), d)?;
        }
        Ok(())
    }

    fn send_delivery(&mut self, ctx: Ctx<'_>, d: Delivery) -> Result<(), MqttError> {
        let own = self.shared.values().find(|s| s.consumer == d.consumer);
        // QoS granted to a `$queue/` subscription (its deliveries match no
        // binding, so `matched` carries none).
        let queue_qos = own.and_then(|s| s.queue_qos);
        if Some(d.consumer) != self.session_consumer && own.is_none() {
            tracing::debug!(
                conn_id = ctx.conn_id,
                consumer = d.consumer.0,
                "delivery for an unknown consumer"
            );
            return Ok(());
        }
        let msg: &rosetta_neutral::Message = &d.message;
        let Some(topic) = delivery_topic(msg).filter(|t| fits_u16(t.len())) else {
            // Not published to an address: nothing an MQTT client can receive.
            self.settle(ctx.conn_id, d.consumer, d.tag, Outcome::Reject);
            return Ok(());
        };
        if msg.is_expired(ctx.now_ms) {
            // Never delivered after its expiry (MQTT 5 §3.3.2.3.3).
            self.settle(ctx.conn_id, d.consumer, d.tag, Outcome::Accept);
            return Ok(());
        }
        let granted = d
            .matched
            .max_guarantee
            .map_or(queue_qos.unwrap_or(2), |g| g.qos());
        let qos = msg.guarantee.qos().min(granted).min(ctx.config.qos_max);
        let retain = d.from_retained
            || (self.version == Version::V5 && d.matched.retain_as_published && msg.retain);

        // Packet id and phase: resumed from the annotation if it is free.
        let resumed = d
            .annotation
            .as_deref()
            .and_then(decode_annotation)
            .filter(|(pkid, _)| {
                qos > 0
                    && !self
                        .flows
                        .as_ref()
                        .is_some_and(|f| f.outbound.in_use(*pkid))
            });
        let (pkid, phase, dup) = match (qos, resumed) {
            (0, _) => (0, Phase::Published, false),
            (_, Some((pkid, phase))) => (pkid, phase, true),
            (_, None) => match self.flows().outbound.allocate() {
                Some(pkid) => (pkid, Phase::Published, d.redelivered),
                None => {
                    tracing::warn!(conn_id = ctx.conn_id, "all packet ids in use");
                    self.settle(ctx.conn_id, d.consumer, d.tag, Outcome::Release);
                    return Ok(());
                }
            },
        };
        if qos == 2 && phase == Phase::Released {
            // The client already has the message: only PUBREL is resent.
            encode::ack(self.version, AckKind::PubRel, pkid, 0, ctx.out);
            self.flows().outbound.insert(
                pkid,
                OutFlight {
                    consumer: d.consumer,
                    tag: d.tag,
                    qos,
                    phase,
                },
            );
            return Ok(());
        }

        let (alias, new_alias) = self.outbound_alias(ctx.config.outbound_topic_alias_max, &topic);
        // An alias the client already knows stands for the topic.
        let wire_topic = if alias.is_some() && new_alias.is_none() {
            ""
        } else {
            &topic
        };
        let props = match self.version {
            Version::V5 => {
                let mut props = outbound_properties(msg, &d.matched.subscription_ids, ctx.now_ms);
                if let Some(p) = d.stream {
                    // The stream offset and timestamp (and what retention cut), as
                    // STOMP's headers and AMQP's annotations of the same
                    // names carry them.
                    let user = &mut props.get_or_insert_with(empty_props).user_properties;
                    user.push((STREAM_OFFSET_PROPERTY.to_owned(), p.offset.to_string()));
                    user.push((
                        rosetta_neutral::STREAM_TIMESTAMP.to_owned(),
                        p.timestamp_ms.to_string(),
                    ));
                    if p.missed > 0 {
                        user.push((STREAM_MISSED_PROPERTY.to_owned(), p.missed.to_string()));
                    }
                    if let Some(n) = p.partition {
                        user.push((rosetta_neutral::STREAM_PARTITION.to_owned(), n.to_string()));
                    }
                }
                if let Some(a) = alias {
                    props.get_or_insert_with(empty_props).topic_alias = Some(a);
                }
                props
            }
            Version::V311 => None,
        };
        let packet = OutPublish {
            topic: wire_topic,
            qos,
            dup,
            retain,
            pkid,
            payload: &msg.body.bytes,
            props,
        };
        let start = ctx.out.len();
        let size = match encode::publish(self.version, packet, ctx.out) {
            Ok(size) => size,
            Err(e) => {
                // Unencodable (e.g. a body over MQTT's 256 MiB): this one
                // message cannot be delivered, the connection is fine.
                ctx.out.truncate(start);
                tracing::warn!(conn_id = ctx.conn_id, error = %e, "delivery cannot be encoded");
                self.settle(ctx.conn_id, d.consumer, d.tag, Outcome::Reject);
                return Ok(());
            }
        };
        let limit = self.client_packet_max.map_or(usize::MAX, |m| m as usize);
        if size > limit {
            // MQTT 5 §3.1.2.11.4: discard as if sent, never exceed the
            // client's maximum.
            ctx.out.truncate(start);
            tracing::debug!(
                conn_id = ctx.conn_id,
                size,
                limit,
                "delivery larger than the client's maximum packet size dropped"
            );
            self.settle(ctx.conn_id, d.consumer, d.tag, Outcome::Accept);
            return Ok(());
        }
        if let Some((name, a)) = new_alias {
            self.aliases().outgoing.insert(name, a);
        }
        if qos == 0 {
            self.flows().unsent_qos0.push((d.consumer, d.tag));
            return Ok(());
        }
        // The packet id is saved for a redelivery after a reconnect. A
        // session that ends with its connection (expiry 0) has none to
        // come for its own queue, so it skips the core call; a shared
        // group's queue outlives any one member, so it always saves.
        let ends_with_connection =
            self.session_expiry_s == 0 && Some(d.consumer) == self.session_consumer;
        if resumed.is_none() && !ends_with_connection {
            self.annotate(ctx.conn_id, d.consumer, d.tag, pkid, Phase::Published);
        }
        self.flows().outbound.insert(
            pkid,
            OutFlight {
                consumer: d.consumer,
                tag: d.tag,
                qos,
                phase: Phase::Published,
            },
        );
        Ok(())
    }

    /// The alias to use for `topic`; the second value is a new alias to
    /// record once the packet is actually sent (the topic is then written
    /// too; with an alias the client knows, only the alias is).
    fn outbound_alias(&self, our_max: u16, topic: &str) -> (Option<u16>, Option<(String, u16)>) {
        if self.version != Version::V5 {
            return (None, None);
        }
        let outgoing = self.aliases.as_ref().map(|a| &a.outgoing);
        if let Some(&a) = outgoing.and_then(|o| o.get(topic)) {
            return (Some(a), None);
        }
        let max = self.client_alias_max.min(our_max);
        match u16::try_from(outgoing.map_or(0, HashMap::len) + 1) {
            Ok(next) if next <= max => (Some(next), Some((topic.to_owned(), next))),
            _ => (None, None),
        }
    }

    pub(super) fn on_puback(&mut self, mut ctx: Ctx<'_>, a: AckPacket) -> Result<(), MqttError> {
        match self.flows().outbound.get_mut(a.pkid) {
            Some(f) if f.qos == 1 => {
                let f = *f;
                self.flows().outbound.remove(a.pkid);
                if a.reason >= 0x80 {
                    self.settle(ctx.conn_id, f.consumer, f.tag, Outcome::Reject);
                } else {
                    // Settled with the rest of this read's PUBACKs.
                    self.flows().acked.push((f.consumer, f.tag));
                }
            }
            _ => tracing::debug!(
                conn_id = ctx.conn_id,
                pkid = a.pkid,
                "PUBACK for no QoS 1 delivery"
            ),
        }
        self.release_held(&mut ctx)
    }

    pub(super) fn on_pubrec(&mut self, mut ctx: Ctx<'_>, a: AckPacket) -> Result<(), MqttError> {
        let Some(f) = self
            .flows()
            .outbound
            .get_mut(a.pkid)
            .filter(|f| f.qos == 2)
            .copied()
        else {
            if self.version == Version::V5 {
                encode::ack(self.version, AckKind::PubRel, a.pkid, 0x92, ctx.out);
            }
            return Ok(());
        };
        if a.reason >= 0x80 {
            // The client refused it: the flow ends here (MQTT 5 §4.3.3).
            self.flows().outbound.remove(a.pkid);
            self.settle(ctx.conn_id, f.consumer, f.tag, Outcome::Reject);
            return self.release_held(&mut ctx);
        }
        if f.phase == Phase::Published {
            self.annotate(ctx.conn_id, f.consumer, f.tag, a.pkid, Phase::Released);
            if let Some(f) = self.flows().outbound.get_mut(a.pkid) {
                f.phase = Phase::Released;
            }
        }
        encode::ack(self.version, AckKind::PubRel, a.pkid, 0, ctx.out);
        Ok(())
    }

    pub(super) fn on_pubcomp(&mut self, mut ctx: Ctx<'_>, a: AckPacket) -> Result<(), MqttError> {
        match self.flows().outbound.get_mut(a.pkid) {
            Some(f) if f.qos == 2 && f.phase == Phase::Released => {
                let f = *f;
                self.flows().outbound.remove(a.pkid);
                self.settle(ctx.conn_id, f.consumer, f.tag, Outcome::Accept);
            }
            _ => tracing::debug!(
                conn_id = ctx.conn_id,
                pkid = a.pkid,
                "PUBCOMP for no released delivery"
            ),
        }
        self.release_held(&mut ctx)
    }
}

fn fits_u16(len: usize) -> bool {
    u16::try_from(len).is_ok()
}

fn empty_props() -> mqttbytes::v5::PublishProperties {
    mqttbytes::v5::PublishProperties {
        payload_format_indicator: None,
        message_expiry_interval: None,
        topic_alias: None,
        response_topic: None,
        correlation_data: None,
        user_properties: Vec::new(),
        subscription_identifiers: Vec::new(),
        content_type: None,
    }
}
