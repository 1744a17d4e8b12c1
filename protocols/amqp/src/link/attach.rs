//! Attaching a link (spec 2.6.3, 2.7.3): terminus resolution, the core
//! node and consumer behind it, and our reply. Each function returns the
//! new [`Link`] and the reply for the owning session to write and keep;
//! none sees the session itself.
//!
//! | client attaches as | terminus                     | core                                       |
//! |--------------------|------------------------------|--------------------------------------------|
//! | receiver           | `/queue/q`, bare `q`, RabbitMQ's `/amq/queue/q` and `/queues/q` | `consume(q, Explicit credit)` |
//! | receiver           | `/topic/f` (or cap. `topic`) | temp queue (lifetime Consumer) + bind + consume |
//! | receiver           | topic, durable terminus      | durable queue `$durable/<container>/<link>` + bind + consume |
//! | receiver           | `dynamic=true`               | temp queue (lifetime Session), address `/queue/<name>` |
//! | receiver           | topic + filter `rosetta:retained` | as above, the bind also enqueues the retained messages matching the filter (echoed in the reply's source filter) |
//! | receiver           | topic + capability `shared` (JMS 2) | one queue per subscription name, see `subscription_queue` |
//! | receiver           | null source, or no address   | lookup of an existing durable subscription (JMS unsubscribe); not-found if none |
//! | receiver           | queue + distribution-mode `copy` | `consume` with `browse` (a queue browser): pre-settled copies, the link's credit drained when it has seen everything |
//! | receiver           | source filter `apache.org:selector-filter:string`, link properties `exclusive`, `priority` | the consumer's options (see `consumer_options`); the selector echoed in the reply once applied |
//! | sender             | address                      | publish to it                              |
//! | sender             | null target/address          | anonymous relay: publish to each message's `to` |
//! | sender             | coordinator                  | transactions (see `coordinator`)           |

use fe2o3_amqp_types::definitions::{ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{
    DistributionMode, FilterSet, Source, TargetArchetype, TerminusDurability, TerminusExpiryPolicy,
};
use fe2o3_amqp_types::performatives::{Attach, Detach};
use fe2o3_amqp_types::primitives::{Array, Symbol, Value};
use rosetta_neutral::address::{validate_topic_filter, validate_topic_name};
use rosetta_neutral::{
    address::TEMP_QUEUE_NAME_PREFIX, durable_subscription_queue, Address, BindingOptions,
    BrokerError, ConsumerOptions, ConsumerSpec, CreditMode, QueueLifetime, QueueSpec,
    RetainedOnBind, SHARED_SUBSCRIPTION_PREFIX,
};
use serde_amqp::descriptor::Descriptor;
use tracing::debug;

use super::consumer_options::{consumer_options, selector_filter};
use super::{IncomingLink, Link, LinkKind, OutgoingLink, OutgoingRare};
use crate::context::Ctx;
use crate::error::AmqpError;

/// Source capability of a JMS 2 shared subscription (Qpid JMS).
const CAP_SHARED: &str = "shared";
/// Source (or link) capability of a shared subscription made without a JMS
/// client id: its name is global, not scoped to the container.
const CAP_GLOBAL: &str = "global";
/// Connection and link capability: shared subscriptions are supported.
pub(crate) const SHARED_SUBS: &str = "SHARED-SUBS";
/// Group segment of a global shared durable subscription's queue name
/// (`$share/$jms/<name>`; an MQTT share name is its own, so an MQTT client
/// would have to ask for the group `$jms` to meet it).
const JMS_GLOBAL_GROUP: &str = "$jms";
/// The same for a global shared non-durable subscription.
const JMS_GLOBAL_VOLATILE_GROUP: &str = "$jms-volatile";
/// Between a subscription name and the suffix Qpid JMS adds to link names
/// (JMS subscription names may not contain it).
const SUB_NAME_DELIMITER: char = '|';

/// Whether the attach's desired capabilities ask for shared subscriptions.
fn desires_shared_subs(a: &Attach) -> bool {
    a.desired_capabilities
        .as_ref()
        .is_some_and(|c| c.0.iter().any(|s| s.as_str() == SHARED_SUBS))
}

/// Terminus capability Qpid JMS sends for a queue.
const CAP_QUEUE: &str = "queue";
/// Terminus capability Qpid JMS sends for a topic.
const CAP_TOPIC: &str = "topic";
/// Dynamic-target capability Qpid JMS sends for a temporary topic.
const CAP_TEMP_TOPIC: &str = "temporary-topic";

/// Source filter (key and descriptor) by which a topic receiver asks for
/// the retained messages matching its address, in the vendor-prefixed
/// style of RabbitMQ's `rabbitmq:stream-offset-spec`. Its value is
/// `true`, described by this same symbol (a bare `true` is accepted too).
/// A receiver that does not send it gets no retained messages.
pub(crate) const RETAINED_FILTER: &str = "rosetta:retained";

/// Whether `filter` asks for retained messages, and the entry to echo in
/// the reply's source (spec 3.5.3: the reply lists the filters in force).
fn retained_filter(filter: Option<&FilterSet>) -> Option<(Symbol, Value)> {
    let (key, value) = filter?
        .iter()
        .find(|(k, _)| k.as_str() == RETAINED_FILTER)?;
    let wanted = match value {
        Value::Bool(b) => *b,
        Value::Described(d) => {
            let named = match &d.descriptor {
                Descriptor::Name(n) => n.as_str() == RETAINED_FILTER,
                Descriptor::Code(_) => false,
            };
            named && d.value == Value::Bool(true)
        }
        _ => false,
    };
    wanted.then(|| (key.clone(), value.clone()))
}

/// The JMS no-local filter (Qpid JMS `AmqpJmsNoLocalType`, as ActiveMQ and
/// Artemis define it): a topic subscriber with it does not receive what
/// its own connection publishes. Recognised by its descriptor, name or
/// code, whatever its key (Qpid JMS uses `no-local`), as those brokers do.
const NO_LOCAL_FILTER_NAME: &str = "apache.org:no-local-filter:list";
const NO_LOCAL_FILTER_CODE: u64 = 0x0000_468C_0000_0003;

/// The no-local entry of a source's filter set, to echo back.
fn no_local_filter(filter: Option<&FilterSet>) -> Option<(Symbol, Value)> {
    let (key, value) = filter?.iter().find(|(_, v)| match v {
        Value::Described(d) => match &d.descriptor {
            Descriptor::Name(n) => n.as_str() == NO_LOCAL_FILTER_NAME,
            Descriptor::Code(c) => *c == NO_LOCAL_FILTER_CODE,
        },
        _ => false,
    })?;
    Some((key.clone(), value.clone()))
}

/// RabbitMQ's address prefix for a queue (its v1 addresses):
/// `/amq/queue/<name>` is the queue (or stream) `<name>`, as
/// `/queue/<name>` is.
pub(crate) const RABBITMQ_QUEUE_PREFIX: &str = "/amq/queue/";
/// RabbitMQ 4's address prefix for a queue (its v2 addresses, which its
/// current AMQP 1.0 clients use): `/queues/<name>`, the name
/// percent-encoded.
pub(crate) const RABBITMQ_V2_QUEUE_PREFIX: &str = "/queues/";

/// The queue a RabbitMQ address names (`/amq/queue/<name>`,
/// `/queues/<percent-encoded name>`); `None` for any other address.
/// Serves link termini and an anonymous relay message's `to` alike, so
/// that a client written for RabbitMQ works unchanged either way.
pub(crate) fn rabbitmq_queue_address(addr: &str) -> Option<Result<Address, AmqpError>> {
    let name = if let Some(q) = addr.strip_prefix(RABBITMQ_QUEUE_PREFIX) {
        std::borrow::Cow::Borrowed(q)
    } else {
        let q = addr.strip_prefix(RABBITMQ_V2_QUEUE_PREFIX)?;
        match percent_encoding::percent_decode_str(q).decode_utf8() {
            Ok(name) => name,
            Err(_) => {
                return Some(Err(AmqpError::InvalidField(format!(
                    "address {addr:?}: the queue name is not UTF-8"
                ))))
            }
        }
    };
    Some(
        Address::parse_destination(&format!("/queue/{name}"))
            .map_err(|e| AmqpError::InvalidField(format!("address {addr:?}: {e}"))),
    )
}

/// Resolves a terminus address. Bare names are queues unless the terminus
/// says `topic`.
pub(crate) fn resolve_address(
    addr: &str,
    capabilities: Option<&Array<Symbol>>,
) -> Result<Address, AmqpError> {
    let has = |cap: &str| capabilities.is_some_and(|c| c.0.iter().any(|s| s.as_str() == cap));
    if let Some(queue) = rabbitmq_queue_address(addr) {
        return queue;
    }
    let address = if !addr.starts_with('/') && has(CAP_TOPIC) && !has(CAP_QUEUE) {
        Address::Topic(addr.to_owned())
    } else {
        Address::parse_destination(addr)
            .map_err(|e| AmqpError::InvalidField(format!("address {addr:?}: {e}")))?
    };
    Ok(address)
}

/// An attach we accept: the link to keep under its handle, and our reply.
pub(crate) struct Attached {
    pub(crate) link: Link,
    pub(crate) reply: Attach,
}

/// The frames that refuse an attach we cannot honour: an attach with a
/// null terminus on our side, then a closing detach with the error (spec
/// 2.6.3).
pub(crate) fn refusal(a: &Attach, e: &AmqpError) -> (Attach, Detach) {
    let (role, source, target) = match a.role {
        Role::Sender => (Role::Receiver, a.source.clone(), None),
        Role::Receiver => (Role::Sender, None, a.target.clone()),
    };
    let we_send = role == Role::Sender;
    let reply = Attach {
        name: a.name.clone(),
        handle: a.handle.clone(),
        role,
        snd_settle_mode: a.snd_settle_mode.clone(),
        rcv_settle_mode: ReceiverSettleMode::First,
        source,
        target,
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: we_send.then_some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    let detach = Detach {
        handle: a.handle.clone(),
        closed: true,
        error: Some(e.to_wire()),
    };
    (reply, detach)
}

/// Client sends, we receive.
pub(crate) fn attach_incoming(ctx: &mut Ctx<'_>, a: &Attach) -> Result<Attached, AmqpError> {
    let mut reply_target = a.target.clone();
    let (target, coordinator) = match a.target.as_deref() {
        Some(TargetArchetype::Coordinator(_)) => (None, true),
        Some(TargetArchetype::Target(t)) => match &t.address {
            _ if t.dynamic => {
                // Qpid JMS creates temporary destinations this way.
                let address = dynamic_target(ctx, t.capabilities.as_ref())?;
                let mut replied = t.clone();
                replied.address = Some(address.to_destination());
                reply_target = Some(Box::new(TargetArchetype::Target(replied)));
                (Some(address), false)
            }
            Some(addr) => {
                let address = resolve_address(addr, t.capabilities.as_ref())?;
                if let Address::Topic(name) = &address {
                    validate_topic_name(name)
                        .map_err(|e| AmqpError::InvalidField(e.to_string()))?;
                }
                // Refused at attach, as clients expect (the link never
                // opens), not message by message.
                if !ctx.conn.core.may_publish(&address) {
                    return Err(AmqpError::Broker(BrokerError::Unauthorized(format!(
                        "publish to '{address}'"
                    ))));
                }
                (Some(address), false)
            }
            None => (None, false),
        },
        None => (None, false),
    };
    let serial = ctx.conn.next_serial();
    let presettled = a.snd_settle_mode == SenderSettleMode::Settled;
    // Both modes are implemented, so the mode the sender asks for is the
    // mode in use (at the receiver this field states the actual mode).
    // A coordinator always settles first: its outcomes are final.
    let settle_second = !coordinator && a.rcv_settle_mode == ReceiverSettleMode::Second;
    let reply = Attach {
        name: a.name.clone(),
        handle: a.handle.clone(),
        role: Role::Receiver,
        snd_settle_mode: a.snd_settle_mode.clone(),
        rcv_settle_mode: if settle_second {
            ReceiverSettleMode::Second
        } else {
            ReceiverSettleMode::First
        },
        source: a.source.clone(),
        target: reply_target,
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: None,
        max_message_size: Some(ctx.cfg.message_size_max_bytes),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    let dc = a.initial_delivery_count.unwrap_or(0);
    let link = Link {
        name: a.name.as_str().into(),
        serial,
        kind: LinkKind::Incoming(IncomingLink {
            target: target.map(Box::new),
            coordinator,
            presettled,
            delivery_count: dc,
            credit_limit: dc,
            in_flight: 0,
            settle_second,
            withheld: false,
            partial: None,
        }),
    };
    debug!(conn = ctx.conn_id, link = %a.name, coordinator, "attached incoming link");
    Ok(Attached { link, reply })
}

/// A node for a dynamic target: a session-lifetime queue, or with the
/// `temporary-topic` capability a topic name unique to this connection.
fn dynamic_target(ctx: &mut Ctx<'_>, caps: Option<&Array<Symbol>>) -> Result<Address, AmqpError> {
    let is_topic = caps.is_some_and(|c| c.0.iter().any(|s| s.as_str() == CAP_TEMP_TOPIC));
    if is_topic {
        let n = ctx.conn.next_serial();
        return Ok(Address::Topic(format!(
            "{TEMP_QUEUE_NAME_PREFIX}{}/{}/{n}",
            ctx.conn_id, ctx.conn.container_id
        )));
    }
    Ok(Address::Queue(declare_temporary_queue(ctx)?))
}

/// A queue named by the core that lives as long as this connection's core
/// session (a dynamic terminus).
fn declare_temporary_queue(ctx: &mut Ctx<'_>) -> Result<String, BrokerError> {
    let info = ctx.conn.core.declare_queue(QueueSpec {
        name: None,
        durable: false,
        lifetime: QueueLifetime::Session,
        bindings_max: None,
    })?;
    Ok(info.name)
}

/// Client receives, we send.
pub(crate) fn attach_outgoing(ctx: &mut Ctx<'_>, a: &Attach) -> Result<Attached, AmqpError> {
    let Some(src) = a.source.as_deref() else {
        // No source: Qpid JMS looks up an existing durable subscription
        // this way, to unsubscribe it (JMS `Session.unsubscribe`).
        return attach_subscription_lookup(ctx, a);
    };
    if src.address.is_none() && !src.dynamic {
        // The same lookup, with an empty source.
        return attach_subscription_lookup(ctx, a);
    }
    let has = |cap: &str| {
        src.capabilities
            .as_ref()
            .is_some_and(|c| c.0.iter().any(|s| s.as_str() == cap))
    };
    let (shared, global) = (has(CAP_SHARED), has(CAP_GLOBAL));
    let durable_name = subscription_queue(&ctx.conn.container_id, &a.name, true, shared, global);
    let volatile_name = subscription_queue(&ctx.conn.container_id, &a.name, false, shared, global);
    let mut reply_source: Source = src.clone();
    // The filters we implement are `rosetta:retained` and the JMS
    // no-local filter (topics only, set below) and the JMS selector (added
    // by `open_outgoing` once the core took it); others are left out of
    // the reply, as the spec asks, and the client decides whether to go on.
    reply_source.filter = None;
    let retained = retained_filter(src.filter.as_ref());
    let no_local = no_local_filter(src.filter.as_ref());
    // Checked before anything is declared, so a bad option leaves nothing.
    let selector = selector_filter(src.filter.as_ref())?;
    let mut options = consumer_options(
        a.properties.as_ref(),
        selector.as_ref().map(|s| s.text.clone()),
        false,
    )?;
    let stream_offset = super::consumer_options::stream_offset_filter(src.filter.as_ref())?;
    options.stream = Some(rosetta_neutral::StreamRead {
        offset: stream_offset.as_ref().map(|f| f.offset),
        // A stream read by this link resumes where the same link of the
        // same container left off.
        group: Some(format!("{}/{}", ctx.conn.container_id, a.name)),
        declare: stream_offset.is_some(),
    });
    if let Some(f) = &stream_offset {
        reply_source
            .filter
            .get_or_insert_with(FilterSet::new)
            .insert(f.entry.0.clone(), f.entry.1.clone());
    }
    let mut fresh_queue = false;
    let core = &mut *ctx.conn.core;
    let (queue, durable_queue) = if src.dynamic {
        // A temporary queue; its generated name is the reply-to.
        let name = declare_temporary_queue(ctx)?;
        reply_source.address = Some(Address::Queue(name.clone()).to_destination());
        (name, None)
    } else if let Some(addr) = src.address.as_deref() {
        match resolve_address(addr, src.capabilities.as_ref())? {
            Address::Queue(q) => {
                // A queue browser (the Proton queue-browser example; Qpid
                // JMS `QueueBrowser` attaches pre-settled with copy). The
                // reply keeps distribution-mode copy.
                options.browse = src.distribution_mode == Some(DistributionMode::Copy);
                (q, None)
            }
            Address::Topic(filter) => {
                validate_topic_filter(&filter)
                    .map_err(|e| AmqpError::InvalidField(e.to_string()))?;
                let durable = src.durable != TerminusDurability::None
                    || src.expiry_policy == TerminusExpiryPolicy::Never;
                let spec = if durable {
                    QueueSpec {
                        name: Some(durable_name),
                        durable: true,
                        lifetime: QueueLifetime::Permanent,
                        bindings_max: None,
                    }
                } else if shared {
                    // JMS 2 shared non-durable subscription: one queue
                    // for all its consumers, gone with the last one.
                    QueueSpec {
                        name: Some(volatile_name),
                        durable: false,
                        lifetime: QueueLifetime::Consumer,
                        bindings_max: None,
                    }
                } else {
                    QueueSpec {
                        name: None,
                        durable: false,
                        lifetime: QueueLifetime::Consumer,
                        bindings_max: None,
                    }
                };
                let info = core.declare_queue(spec)?;
                let mut options = BindingOptions::default();
                let mut echo = FilterSet::new();
                if let Some((key, value)) = retained.clone() {
                    // A durable subscription re-attaching already had them.
                    options.retained = RetainedOnBind::SendIfNew;
                    echo.insert(key, value);
                }
                if let Some((key, value)) = no_local.clone() {
                    // Messages this connection (its container id)
                    // publishes skip this subscription.
                    options.no_local = true;
                    echo.insert(key, value);
                }
                if !echo.is_empty() {
                    reply_source.filter = Some(echo);
                }
                if let Err(e) = core.bind(&info.name, &filter, options) {
                    // A queue made for this link alone must not outlive
                    // the refusal: no consumer would ever come to take
                    // it away (an existing durable one stays).
                    if !info.existed {
                        if let Err(e) = core.delete_queue(&info.name) {
                            debug!(queue = %info.name, error = %e, "cannot drop the unused subscription queue");
                        }
                    }
                    return Err(e.into());
                }
                let dq = durable.then(|| info.name.clone());
                fresh_queue = !info.existed;
                (info.name, dq)
            }
        }
    } else {
        return Err(AmqpError::InvalidField("source without an address".into()));
    };
    let consumer = OutgoingConsumer {
        queue,
        durable_queue,
        options,
        selector_echo: selector.map(|s| s.entry),
        fresh_queue,
    };
    open_outgoing(ctx, a, reply_source, consumer)
}

/// What an outgoing link consumes, and how.
struct OutgoingConsumer {
    queue: String,
    /// The durable subscription queue behind the link, if any.
    durable_queue: Option<String>,
    options: ConsumerOptions,
    /// The selector filter entry to echo in the reply once it is applied.
    selector_echo: Option<(Symbol, Value)>,
    /// The queue was declared by this attach: a refused consume deletes
    /// it, since no consumer would ever come to take it away.
    fresh_queue: bool,
}

/// The queue behind a topic subscription link, by Qpid JMS's naming
/// (`AmqpSubscriptionTracker`): an exclusive durable subscription's link
/// is named after it; a shared one's link name is the subscription name,
/// then `|` and a suffix (`2`, `global`, `global2`, `volatile1`,
/// `global-volatile1`) that tells the client's links apart. Shared
/// subscriptions share the queue of the name before `|`.
///
/// | link | durable | non-durable |
/// |---|---|---|
/// | exclusive `s` | `$durable/<container>/s` | one per link, unnamed |
/// | shared `s`, `s\|2` | `$durable/<container>/s` | `$durable/<container>/s\|volatile` |
/// | shared, `global` | `$share/$jms/s` | `$share/$jms-volatile/s` |
///
/// A container-scoped name uses the durable-subscription scheme, whose
/// queues only that container may consume (JMS puts shared and
/// exclusive durable subscriptions in one namespace per client id; `|`
/// cannot occur in a JMS subscription name, so the non-durable ones stay
/// apart). A `global` one (JMS without a client id) is consumed from
/// many containers: it lives under the shared-subscription prefix, which
/// the core lets any client consume once the bind was authorised.
fn subscription_queue(
    container_id: &str,
    link: &str,
    durable: bool,
    shared: bool,
    global: bool,
) -> String {
    let name = if shared || global {
        link.split(SUB_NAME_DELIMITER).next().unwrap_or(link)
    } else {
        link
    };
    match (durable, global) {
        (true, false) => durable_subscription_queue(container_id, name),
        (false, false) => {
            durable_subscription_queue(container_id, &format!("{name}{SUB_NAME_DELIMITER}volatile"))
        }
        (true, true) => format!("{SHARED_SUBSCRIPTION_PREFIX}{JMS_GLOBAL_GROUP}/{name}"),
        (false, true) => {
            format!("{SHARED_SUBSCRIPTION_PREFIX}{JMS_GLOBAL_VOLATILE_GROUP}/{name}")
        }
    }
}

/// A receiver without a source address: the lookup of an existing
/// durable subscription by link name. A found one is attached (the
/// reply's source names its queue, which Qpid JMS requires to be
/// non-null); a missing one gets not-found. A `global` hint (in the
/// link's desired capabilities, or the `|global` link-name suffix)
/// looks up the subscription outside the container's scope.
fn attach_subscription_lookup(ctx: &mut Ctx<'_>, a: &Attach) -> Result<Attached, AmqpError> {
    let desired = |cap: &str| {
        a.desired_capabilities
            .as_ref()
            .is_some_and(|c| c.0.iter().any(|s| s.as_str() == cap))
    };
    let suffix = a.name.split_once(SUB_NAME_DELIMITER).map(|(_, s)| s);
    let global = desired(CAP_GLOBAL) || suffix.is_some_and(|s| s.starts_with(CAP_GLOBAL));
    let name = subscription_queue(
        &ctx.conn.container_id,
        &a.name,
        true,
        suffix.is_some(),
        global,
    );
    let core = &mut *ctx.conn.core;
    // The declare finds it; if it did not exist we undo the declare and
    // answer not-found.
    let info = core.declare_queue(QueueSpec {
        name: Some(name.clone()),
        durable: true,
        lifetime: QueueLifetime::Permanent,
        bindings_max: None,
    })?;
    if !info.existed {
        // Best effort: the error we report matters more.
        let _ = core.delete_queue(&name);
        return Err(AmqpError::Broker(rosetta_neutral::BrokerError::NotFound(
            format!("no durable subscription {:?}", a.name),
        )));
    }
    let mut source = a.source.as_deref().cloned().unwrap_or_default();
    let selector = selector_filter(source.filter.as_ref())?;
    let options = consumer_options(
        a.properties.as_ref(),
        selector.as_ref().map(|s| s.text.clone()),
        false,
    )?;
    source.filter = None;
    source.address = Some(Address::Queue(name.clone()).to_destination());
    source.durable = TerminusDurability::UnsettledState;
    source.expiry_policy = TerminusExpiryPolicy::Never;
    let consumer = OutgoingConsumer {
        queue: info.name,
        durable_queue: Some(name),
        options,
        selector_echo: selector.map(|s| s.entry),
        fresh_queue: false,
    };
    open_outgoing(ctx, a, source, consumer)
}

/// Starts the consumer of an outgoing link and answers its attach.
fn open_outgoing(
    ctx: &mut Ctx<'_>,
    a: &Attach,
    mut reply_source: Source,
    c: OutgoingConsumer,
) -> Result<Attached, AmqpError> {
    let core = &mut *ctx.conn.core;
    let browse = c.options.browse;
    // A browser's copies need no settlement: they go out pre-settled.
    let auto_settle = browse || a.snd_settle_mode == SenderSettleMode::Settled;
    let consumer = match core.consume(ConsumerSpec {
        queue: c.queue.clone(),
        credit: CreditMode::Explicit(0),
        auto_settle,
        options: c.options,
    }) {
        Ok(consumer) => consumer,
        Err(e) => {
            if c.fresh_queue {
                if let Err(e) = core.delete_queue(&c.queue) {
                    debug!(queue = %c.queue, error = %e, "cannot drop the unused subscription queue");
                }
            }
            return Err(e.into());
        }
    };
    if let Some((key, value)) = c.selector_echo {
        reply_source
            .filter
            .get_or_insert_with(FilterSet::new)
            .insert(key, value);
    }
    let durable_queue = c.durable_queue;
    let serial = ctx.conn.next_serial();
    let reply = Attach {
        name: a.name.clone(),
        handle: a.handle.clone(),
        role: Role::Sender,
        // A browser states that it settles everything itself.
        snd_settle_mode: if browse {
            SenderSettleMode::Settled
        } else {
            a.snd_settle_mode.clone()
        },
        // At the sender this is only the mode we desire; the receiver's
        // own choice governs, and we follow either (`on_disposition`
        // settles an outcome the receiver leaves unsettled).
        rcv_settle_mode: a.rcv_settle_mode.clone(),
        source: Some(Box::new(reply_source)),
        target: a.target.clone(),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(0),
        max_message_size: None,
        // Qpid JMS asks for shared subscriptions here when the Open did
        // not offer them; we offer them in both places.
        offered_capabilities: desires_shared_subs(a)
            .then(|| Array(vec![Symbol::from(SHARED_SUBS)])),
        desired_capabilities: None,
        properties: None,
    };
    let link = Link {
        name: a.name.as_str().into(),
        serial,
        kind: LinkKind::Outgoing(OutgoingLink {
            consumer,
            delivery_count: 0,
            credit: 0,
            queued: 0,
            core_seen: 0,
            unsettled: 0,
            auto_settle,
            max_message_size: a.max_message_size.unwrap_or(0),
            rare: durable_queue.map(|q| {
                Box::new(OutgoingRare {
                    durable_queue: Some(q.into_boxed_str()),
                    acquire_txn: None,
                })
            }),
            browse_ended: false,
        }),
    };
    debug!(conn = ctx.conn_id, link = %a.name, ?consumer, browse, "attached outgoing link");
    Ok(Attached { link, reply })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_naming_scheme() {
        let topic_cap = Array(vec![Symbol::from("topic")]);
        let queue_cap = Array(vec![Symbol::from("queue")]);
        assert_eq!(
            resolve_address("/queue/q", None),
            Ok(Address::Queue("q".into()))
        );
        assert_eq!(resolve_address("q", None), Ok(Address::Queue("q".into())));
        assert_eq!(
            resolve_address("a/b", Some(&topic_cap)),
            Ok(Address::Topic("a/b".into()))
        );
        assert_eq!(
            resolve_address("a", Some(&queue_cap)),
            Ok(Address::Queue("a".into()))
        );
        assert_eq!(
            resolve_address("/topic/a/#", Some(&queue_cap)),
            Ok(Address::Topic("a/#".into()))
        );
        assert!(resolve_address("/queue/a#", None).is_err());
        assert!(resolve_address("", None).is_err());
    }

    #[test]
    fn rabbitmq_queue_addresses_name_the_queue() {
        assert_eq!(
            resolve_address("/amq/queue/events", None),
            Ok(Address::Queue("events".into()))
        );
        assert_eq!(
            resolve_address("/queues/events", None),
            Ok(Address::Queue("events".into()))
        );
        assert_eq!(
            resolve_address("/queues/caf%C3%A9%20eu", None),
            Ok(Address::Queue("café eu".into())),
            "a v2 name is percent-decoded"
        );
        assert!(
            resolve_address("/queues/%FF", None).is_err(),
            "not UTF-8 once decoded"
        );
        assert!(resolve_address("/queues/", None).is_err(), "no name");
        assert_eq!(
            rabbitmq_queue_address("/queue/q"),
            None,
            "not a RabbitMQ address"
        );
    }

    #[test]
    fn no_local_filter_is_recognised_by_descriptor_name_or_code() {
        use serde_amqp::described::Described;
        let with = |key: &str, descriptor: Descriptor| {
            let mut f = FilterSet::new();
            f.insert(Symbol::from("selector"), Value::String("x > 1".into()));
            f.insert(
                Symbol::from(key),
                Value::Described(Box::new(Described {
                    descriptor,
                    value: Value::List(Vec::new()),
                })),
            );
            f
        };
        let by_name = with(
            "no-local",
            Descriptor::Name(Symbol::from(NO_LOCAL_FILTER_NAME)),
        );
        assert_eq!(
            no_local_filter(Some(&by_name)).map(|(k, _)| k),
            Some(Symbol::from("no-local"))
        );
        let by_code = with("any-key", Descriptor::Code(NO_LOCAL_FILTER_CODE));
        assert!(no_local_filter(Some(&by_code)).is_some());
        let other = with("no-local", Descriptor::Code(0x77));
        assert!(
            no_local_filter(Some(&other)).is_none(),
            "the key alone is not enough"
        );
        assert!(no_local_filter(None).is_none());
    }

    #[test]
    fn retained_filter_is_recognised_only_when_true() {
        use serde_amqp::described::Described;
        let described = |v: Value| {
            Value::Described(Box::new(Described {
                descriptor: Descriptor::Name(Symbol::from(RETAINED_FILTER)),
                value: v,
            }))
        };
        let set = |v: Value| {
            let mut f = FilterSet::new();
            f.insert(Symbol::from("selector"), Value::String("x > 1".into()));
            f.insert(Symbol::from(RETAINED_FILTER), v);
            f
        };
        assert!(retained_filter(Some(&set(described(Value::Bool(true))))).is_some());
        assert!(retained_filter(Some(&set(Value::Bool(true)))).is_some());
        assert!(retained_filter(Some(&set(described(Value::Bool(false))))).is_none());
        assert!(retained_filter(Some(&set(Value::Bool(false)))).is_none());
        assert!(retained_filter(Some(&set(Value::Null))).is_none());
        assert!(retained_filter(None).is_none());
        let other = Value::Described(Box::new(Described {
            descriptor: Descriptor::Code(0x77),
            value: Value::Bool(true),
        }));
        assert!(retained_filter(Some(&set(other))).is_none());
    }
}
