//! Unit tests of the core against its public session API, with no journal.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rosetta_neutral::*;

use super::{Core, CoreConfig, NoJournal};

#[derive(Default)]
pub(crate) struct Events(Mutex<Vec<SessionEvent>>);

impl EventSink for Events {
    fn send(&self, event: SessionEvent) {
        self.0.lock().push(event);
    }
}

impl Events {
    fn take(&self) -> Vec<SessionEvent> {
        std::mem::take(&mut *self.0.lock())
    }

    /// Takes the journal commits out, leaving every other event in order.
    pub(crate) fn take_committed(&self) -> Vec<(Ticket, Result<(), BrokerError>)> {
        let mut out = Vec::new();
        self.0.lock().retain(|e| match e {
            SessionEvent::Committed { ticket, result } => {
                out.push((*ticket, result.clone()));
                false
            }
            SessionEvent::CommittedRun { tickets } => {
                out.extend(tickets.iter().map(|t| (*t, Ok(()))));
                false
            }
            _ => true,
        });
        out
    }

    pub(crate) fn deliveries(&self) -> Vec<Delivery> {
        self.take()
            .into_iter()
            .filter_map(|e| match e {
                SessionEvent::Delivery(d) => Some(d),
                _ => None,
            })
            .collect()
    }
}

pub(crate) fn info(client: &str) -> SessionInfo {
    SessionInfo {
        conn_id: 1,
        protocol: Protocol::Internal,
        principal: Principal::anonymous(),
        client_id: Some(client.into()),
        take_over: true,
    }
}

pub(crate) fn open(core: &Core, client: &str) -> (Box<dyn Session>, Arc<Events>) {
    let events = Arc::new(Events::default());
    let session = core.open_session(info(client), events.clone());
    (session, events)
}

/// The core's defaults, with `overrides` for the queue named `queue`.
pub(crate) fn config_for_queue(queue: &str, overrides: crate::QueueOverrides) -> CoreConfig {
    CoreConfig {
        queue_rules: crate::QueueRules::new([crate::QueueRule {
            target: crate::QueueMatch::Name(queue.into()),
            overrides,
        }]),
        ..CoreConfig::default()
    }
}

/// A core with `config` on a real store in `dir`, on `clock`: started
/// again on the same `dir` it recovers what the last one journaled.
pub(crate) fn core_on_store(
    dir: &std::path::Path,
    config: CoreConfig,
    clock: &Arc<crate::ManualClock>,
) -> (Core, Arc<rosetta_store::Store>) {
    core_on_store_with(dir, config, clock, Arc::new(super::AllowAll))
}

/// [`core_on_store`] with `access` in place of allowing everything.
pub(crate) fn core_on_store_with(
    dir: &std::path::Path,
    config: CoreConfig,
    clock: &Arc<crate::ManualClock>,
    access: Arc<dyn crate::AccessControl>,
) -> (Core, Arc<rosetta_store::Store>) {
    let (store, recovered) =
        rosetta_store::Store::open(rosetta_store::StoreConfig::new(dir)).expect("open store");
    let store = Arc::new(store);
    let core = Core::with_clock(
        config,
        store.clone(),
        access,
        Some(recovered),
        clock.clone(),
    );
    (core, store)
}

/// Where every manual clock in these tests starts: an arbitrary wall-clock
/// time (2023-11-14), far from zero so that "now minus something" never
/// underflows.
pub(crate) const T0_MS: u64 = 1_700_000_000_000;

/// A core with no journal on a manual clock that starts at [`T0_MS`]:
/// its timers run only when a test advances the clock and calls
/// [`Core::run_timers`].
pub(crate) fn manual_core(config: CoreConfig) -> (Core, Arc<crate::ManualClock>) {
    let clock = Arc::new(crate::ManualClock::new(T0_MS));
    let core = Core::with_clock(
        config,
        Arc::new(NoJournal),
        Arc::new(super::AllowAll),
        None,
        clock.clone(),
    );
    (core, clock)
}

pub(crate) fn text(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.message.body.bytes).into_owned()
}

fn subscribe(s: &mut Box<dyn Session>, filter: &str, window: u32) -> (String, ConsumerId) {
    let q = s
        .declare_queue(QueueSpec {
            name: None,
            durable: false,
            lifetime: QueueLifetime::Consumer,
            bindings_max: None,
        })
        .expect("declare");
    s.bind(&q.name, filter, BindingOptions::default())
        .expect("bind");
    let c = s
        .consume(ConsumerSpec {
            queue: q.name.clone(),
            credit: CreditMode::Window(window),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume");
    (q.name, c)
}

fn publish(s: &mut Box<dyn Session>, address: Address, body: &str) -> PublishReceipt {
    s.publish(&address, Message::text(body), PublishOptions::default())
        .expect("publish")
}

fn topic(t: &str) -> Address {
    Address::Topic(t.into())
}

fn queue(q: &str) -> Address {
    Address::Queue(q.into())
}

#[test]
fn multicast_copies_to_every_matching_subscription() {
    let core = Core::in_memory();
    let (mut a, ea) = open(&core, "a");
    let (mut b, eb) = open(&core, "b");
    let (mut p, _) = open(&core, "p");
    subscribe(&mut a, "sensors/+/temp", 10);
    subscribe(&mut b, "sensors/#", 10);
    assert_eq!(publish(&mut p, topic("sensors/k1/temp"), "21").routed, 2);
    assert_eq!(publish(&mut p, topic("sensors/k1/hum"), "40").routed, 1);
    assert_eq!(publish(&mut p, topic("other"), "x").routed, 0);
    assert_eq!(
        ea.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["21"]
    );
    assert_eq!(
        eb.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["21", "40"]
    );
}

#[test]
fn dollar_topics_are_not_matched_by_leading_wildcards() {
    let core = Core::in_memory();
    let (mut a, ea) = open(&core, "a");
    let (mut p, _) = open(&core, "p");
    subscribe(&mut a, "#", 10);
    publish(&mut p, topic("$SYS/x"), "no");
    publish(&mut p, topic("x"), "yes");
    assert_eq!(
        ea.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["yes"]
    );
}

#[test]
fn overlapping_bindings_deliver_once_with_all_subscription_ids() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let q = s
        .declare_queue(QueueSpec {
            name: Some("$share/g/a/#".into()),
            durable: false,
            lifetime: QueueLifetime::Session,
            bindings_max: None,
        })
        .expect("declare");
    let opts = |qos, id| BindingOptions {
        max_guarantee: Guarantee::from_qos(qos).expect("qos"),
        subscription_id: Some(id),
        ..BindingOptions::default()
    };
    s.bind(&q.name, "a/+", opts(0, 1)).expect("bind");
    s.bind(&q.name, "a/#", opts(1, 2)).expect("bind");
    s.consume(ConsumerSpec {
        queue: q.name.clone(),
        credit: CreditMode::Window(10),
        auto_settle: true,
        options: Default::default(),
    })
    .expect("consume");
    let (mut p, _) = open(&core, "p");
    publish(&mut p, topic("a/b"), "m");
    let d = e.deliveries();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].matched.max_guarantee, Some(Guarantee::AtLeastOnce));
    assert_eq!(d[0].matched.subscription_ids, vec![1, 2]);
}

#[test]
fn anycast_round_robins_across_consumers_with_credit() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let c1 = s.consume(ConsumerSpec {
        queue: "work".into(),
        credit: CreditMode::Window(10),
        auto_settle: true,
        options: Default::default(),
    });
    let c2 = s.consume(ConsumerSpec {
        queue: "work".into(),
        credit: CreditMode::Window(10),
        auto_settle: true,
        options: Default::default(),
    });
    let (c1, c2) = (c1.expect("c1"), c2.expect("c2"));
    for i in 0..4 {
        publish(&mut s, queue("work"), &i.to_string());
    }
    let d = e.deliveries();
    let to = |c| {
        d.iter()
            .filter(|d| d.consumer == c)
            .map(text)
            .collect::<Vec<_>>()
    };
    assert_eq!(to(c1), vec!["0", "2"]);
    assert_eq!(to(c2), vec!["1", "3"]);
}

#[test]
fn credit_window_limits_unsettled_deliveries() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let c = s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(2),
        auto_settle: false,
        options: Default::default(),
    });
    let c = c.expect("consume");
    for i in 0..5 {
        publish(&mut s, queue("q"), &i.to_string());
    }
    let first = e.deliveries();
    assert_eq!(first.iter().map(text).collect::<Vec<_>>(), vec!["0", "1"]);
    s.settle(c, first[0].tag, Outcome::Accept, None, false)
        .expect("settle");
    assert_eq!(
        e.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["2"]
    );
    assert_eq!(
        core.queue_stats("q").map(|s| (s.depth, s.in_flight)),
        Some((2, 2))
    );
}

#[test]
fn settle_many_settles_runs_of_consumers_skips_unknowns_and_refills_windows() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let window = |q: &str| ConsumerSpec {
        queue: q.into(),
        credit: CreditMode::Window(2),
        auto_settle: false,
        options: Default::default(),
    };
    let a = s.consume(window("qa")).expect("consume a");
    let b = s.consume(window("qb")).expect("consume b");
    for i in 0..4 {
        publish(&mut s, queue("qa"), &format!("a{i}"));
        publish(&mut s, queue("qb"), &format!("b{i}"));
    }
    let first = e.deliveries();
    assert_eq!(first.len(), 4, "two each: the windows are full");
    let tag = |body: &str| first.iter().find(|d| text(d) == body).map(|d| d.tag);
    let (a0, a1, b0) = (tag("a0"), tag("a1"), tag("b0"));
    let (Some(a0), Some(a1), Some(b0)) = (a0, a1, b0) else {
        panic!(
            "deliveries {:?}",
            first.iter().map(text).collect::<Vec<_>>()
        );
    };
    // A run of a's, one b, an unknown tag, and a's tag given to b.
    let settled = s
        .settle_many(
            &[(a, a0), (a, a1), (b, b0), (b, DeliveryTag(9_999)), (b, a0)],
            Outcome::Accept,
        )
        .expect("settle_many");
    assert_eq!(settled, 3);
    let mut next: Vec<String> = e.deliveries().iter().map(text).collect();
    next.sort();
    assert_eq!(next, vec!["a2", "a3", "b2"], "freed window slots refilled");
    assert_eq!(
        core.queue_stats("qa")
            .map(|s| (s.depth, s.in_flight, s.acked_total)),
        Some((0, 2, 2))
    );
    assert_eq!(
        core.queue_stats("qb")
            .map(|s| (s.depth, s.in_flight, s.acked_total)),
        Some((1, 2, 1))
    );
}

#[test]
fn explicit_credit_and_drain() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let c = s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Explicit(0),
        auto_settle: true,
        options: Default::default(),
    });
    let c = c.expect("consume");
    publish(&mut s, queue("q"), "a");
    assert!(e.take().is_empty(), "no credit, no delivery");
    s.set_credit(c, 5, true).expect("credit");
    let events = e.take();
    assert!(matches!(&events[0], SessionEvent::Delivery(d) if text(d) == "a"));
    assert!(matches!(events[1], SessionEvent::Drained { consumer } if consumer == c));
    publish(&mut s, queue("q"), "b");
    assert!(e.take().is_empty(), "drain left zero credit");
}

#[test]
fn release_keeps_count_modify_raises_it_and_order_is_kept() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let c = s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(1),
        auto_settle: false,
        options: Default::default(),
    });
    let c = c.expect("consume");
    publish(&mut s, queue("q"), "first");
    publish(&mut s, queue("q"), "second");
    let d = e.deliveries().remove(0);
    assert_eq!(
        (text(&d), d.delivery_count, d.redelivered),
        ("first".into(), 0, false)
    );
    s.settle(c, d.tag, Outcome::Release, None, false)
        .expect("release");
    let d = e.deliveries().remove(0);
    assert_eq!(
        (text(&d), d.delivery_count, d.redelivered),
        ("first".into(), 0, true)
    );
    s.settle(c, d.tag, Outcome::NACK, None, false)
        .expect("nack");
    let d = e.deliveries().remove(0);
    assert_eq!((text(&d), d.delivery_count), ("first".into(), 1));
    s.settle(c, d.tag, Outcome::Accept, None, false)
        .expect("ack");
    assert_eq!(text(&e.deliveries()[0]), "second");
}

#[test]
fn too_many_failures_and_reject_go_to_the_dead_letter_queue() {
    let config = CoreConfig {
        delivery_attempts_max: 2,
        ..CoreConfig::default()
    };
    let core = Core::new(config, Arc::new(NoJournal), Arc::new(super::AllowAll), None);
    let (mut s, e) = open(&core, "c");
    let c = s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(1),
        auto_settle: false,
        options: Default::default(),
    });
    let c = c.expect("consume");
    publish(&mut s, queue("q"), "poison");
    for _ in 0..2 {
        let d = e.deliveries().remove(0);
        s.settle(c, d.tag, Outcome::NACK, None, false)
            .expect("nack");
    }
    assert!(e.deliveries().is_empty());
    publish(&mut s, queue("q"), "bad");
    let d = e.deliveries().remove(0);
    s.settle(c, d.tag, Outcome::Reject, None, false)
        .expect("reject");
    assert_eq!(core.queue_stats("DLQ").map(|s| s.depth), Some(2));
    let dlq = s.consume(ConsumerSpec {
        queue: "DLQ".into(),
        credit: CreditMode::Window(10),
        auto_settle: true,
        options: Default::default(),
    });
    dlq.expect("consume dlq");
    let dead = e.deliveries();
    assert_eq!(
        dead.iter().map(text).collect::<Vec<_>>(),
        vec!["poison", "bad"]
    );
    assert_eq!(
        dead[0].message.properties.get("x-original-queue"),
        Some(&Value::from("q"))
    );
}

#[test]
fn unsettled_deliveries_return_when_the_consumer_goes() {
    let core = Core::in_memory();
    let (mut s1, e1) = open(&core, "c1");
    let (mut s2, e2) = open(&core, "c2");
    s1.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(5),
        auto_settle: false,
        options: Default::default(),
    })
    .expect("consume");
    publish(&mut s1, queue("q"), "m");
    assert_eq!(e1.deliveries().len(), 1);
    s2.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(5),
        auto_settle: false,
        options: Default::default(),
    })
    .expect("consume");
    assert!(e2.deliveries().is_empty());
    s1.close(CloseKind::Abnormal);
    let d = e2.deliveries();
    assert_eq!(
        (text(&d[0]), d[0].delivery_count, d[0].redelivered),
        ("m".into(), 1, true)
    );
}

#[test]
fn expired_messages_are_never_delivered() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let mut m = Message::text("old");
    m.expiry = Some(1);
    s.publish(&queue("q"), m, PublishOptions::default())
        .expect("publish");
    publish(&mut s, queue("q"), "fresh");
    s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(5),
        auto_settle: true,
        options: Default::default(),
    })
    .expect("consume");
    assert_eq!(
        e.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["fresh"]
    );
    assert_eq!(core.queue_stats("q").map(|s| s.expired_total), Some(1));
}

#[test]
fn expired_messages_move_to_the_expiry_address_when_configured() {
    let config = CoreConfig {
        expiry_address: Some("expired".into()),
        ..CoreConfig::default()
    };
    let core = Core::new(config, Arc::new(NoJournal), Arc::new(super::AllowAll), None);
    let (mut s, _e) = open(&core, "c");
    let mut m = Message::text("old");
    m.expiry = Some(1);
    s.publish(&queue("q"), m, PublishOptions::default())
        .expect("publish");
    s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(5),
        auto_settle: true,
        options: Default::default(),
    })
    .expect("consume");
    assert_eq!(core.queue_stats("expired").map(|s| s.depth), Some(1));
}

#[test]
fn transactions_apply_sends_and_acks_atomically_or_not_at_all() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let c = s.consume(ConsumerSpec {
        queue: "in".into(),
        credit: CreditMode::Window(5),
        auto_settle: false,
        options: Default::default(),
    });
    let c = c.expect("consume");
    publish(&mut s, queue("in"), "job");
    let job = e.deliveries().remove(0);

    let tx = s.begin();
    s.publish(
        &queue("out1"),
        Message::text("r1"),
        PublishOptions {
            txn: Some(tx),
            confirm: true,
        },
    )
    .expect("p");
    s.publish(
        &queue("out2"),
        Message::text("r2"),
        PublishOptions {
            txn: Some(tx),
            confirm: true,
        },
    )
    .expect("p");
    s.settle(c, job.tag, Outcome::Accept, Some(tx), false)
        .expect("stage ack");
    assert_eq!(
        core.queue_stats("out1"),
        None,
        "nothing visible before commit"
    );
    s.rollback(tx).expect("rollback");
    assert_eq!(core.queue_stats("out1"), None, "nothing after rollback");
    assert_eq!(
        core.queue_stats("in").map(|s| s.in_flight),
        Some(1),
        "ack discarded"
    );

    let tx = s.begin();
    s.publish(
        &queue("out1"),
        Message::text("r1"),
        PublishOptions {
            txn: Some(tx),
            confirm: true,
        },
    )
    .expect("p");
    s.settle(c, job.tag, Outcome::Accept, Some(tx), false)
        .expect("stage ack");
    let ticket = s.commit(tx).expect("commit");
    assert!(e.take().iter().any(
        |ev| matches!(ev, SessionEvent::Committed { ticket: t, result: Ok(()) } if *t == ticket)
    ));
    assert_eq!(core.queue_stats("out1").map(|s| s.depth), Some(1));
    assert_eq!(
        core.queue_stats("in").map(|s| (s.depth, s.in_flight)),
        Some((0, 0))
    );
    assert_eq!(s.commit(tx), Err(BrokerError::Unknown("transaction")));
}

/// A session queue of `s` with an auto-settling consumer, not yet bound:
/// what retained messages sent at bind arrive on. Returns its name.
pub(crate) fn retained_consumer(s: &mut Box<dyn Session>) -> String {
    let q = s
        .declare_queue(QueueSpec {
            name: None,
            durable: false,
            lifetime: QueueLifetime::Session,
            bindings_max: None,
        })
        .expect("declare");
    s.consume(ConsumerSpec {
        queue: q.name.clone(),
        credit: CreditMode::Window(10),
        auto_settle: true,
        options: Default::default(),
    })
    .expect("consume");
    q.name
}

#[test]
fn retained_messages_are_sent_on_bind_and_cleared_by_empty_payload() {
    let core = Core::in_memory();
    let (mut p, _) = open(&core, "p");
    let mut m = Message::text("on");
    m.retain = true;
    p.publish(&topic("lamp/1"), m, PublishOptions::default())
        .expect("publish");
    let (mut s, e) = open(&core, "s");
    let q = retained_consumer(&mut s);
    let opts = BindingOptions {
        retained: RetainedOnBind::Send,
        ..BindingOptions::default()
    };
    assert_eq!(
        s.bind(&q, "lamp/+", opts.clone())
            .expect("bind")
            .retained_sent,
        1
    );
    let d = e.deliveries();
    assert!(d[0].from_retained);
    assert_eq!(text(&d[0]), "on");
    let mut clear = Message::binary(bytes::Bytes::new());
    clear.retain = true;
    p.publish(&topic("lamp/1"), clear, PublishOptions::default())
        .expect("publish");
    let (mut s2, _) = open(&core, "s2");
    let q2 = s2
        .declare_queue(QueueSpec {
            name: None,
            durable: false,
            lifetime: QueueLifetime::Session,
            bindings_max: None,
        })
        .expect("declare");
    assert_eq!(
        s2.bind(&q2.name, "lamp/#", opts)
            .expect("bind")
            .retained_sent,
        0
    );
}

#[test]
fn no_local_skips_the_publishers_own_bindings() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "me");
    let q = s
        .declare_queue(QueueSpec {
            name: None,
            durable: false,
            lifetime: QueueLifetime::Session,
            bindings_max: None,
        })
        .expect("declare");
    s.bind(
        &q.name,
        "chat",
        BindingOptions {
            no_local: true,
            ..BindingOptions::default()
        },
    )
    .expect("bind");
    s.consume(ConsumerSpec {
        queue: q.name.clone(),
        credit: CreditMode::Window(10),
        auto_settle: true,
        options: Default::default(),
    })
    .expect("consume");
    publish(&mut s, topic("chat"), "mine");
    let (mut other, _) = open(&core, "other");
    publish(&mut other, topic("chat"), "theirs");
    assert_eq!(
        e.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["theirs"]
    );
}

#[test]
fn take_over_closes_the_old_session_and_wills_follow_close_kind() {
    let core = Core::in_memory();
    let (mut watcher, ew) = open(&core, "w");
    subscribe(&mut watcher, "wills/#", 10);
    let (mut old, eo) = open(&core, "dev");
    old.set_will(Some(Will {
        address: topic("wills/dev"),
        message: Message::text("gone"),
        delay: Duration::ZERO,
        expiry_interval: None,
    }))
    .expect("will");
    let (mut new, _) = open(&core, "dev");
    assert!(eo.take().iter().any(|e| matches!(
        e,
        SessionEvent::Kicked {
            reason: KickReason::TakenOver
        }
    )));
    assert_eq!(
        old.publish(&topic("x"), Message::text("x"), PublishOptions::default()),
        Err(BrokerError::SessionClosed)
    );
    assert_eq!(
        ew.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["gone"]
    );
    new.set_will(Some(Will {
        address: topic("wills/dev"),
        message: Message::text("gone2"),
        delay: Duration::ZERO,
        expiry_interval: None,
    }))
    .expect("will");
    new.close(CloseKind::Clean);
    assert!(ew.deliveries().is_empty(), "clean close discards the will");
}

#[test]
fn consumer_lifetime_queues_vanish_with_their_consumer() {
    let core = Core::in_memory();
    let (mut s, _) = open(&core, "c");
    let (name, c) = subscribe(&mut s, "t", 10);
    assert!(core.queue_stats(&name).is_some());
    s.cancel(c).expect("cancel");
    assert!(core.queue_stats(&name).is_none());
    let (mut p, _) = open(&core, "p");
    assert_eq!(publish(&mut p, topic("t"), "x").routed, 0);
}

#[test]
fn session_lifetime_queues_vanish_with_their_session() {
    let core = Core::in_memory();
    let (mut s, _) = open(&core, "c");
    let q = s
        .declare_queue(QueueSpec {
            name: None,
            durable: false,
            lifetime: QueueLifetime::Session,
            bindings_max: None,
        })
        .expect("declare");
    assert!(q.name.starts_with("$temp/"));
    let (mut other, _) = open(&core, "o");
    assert!(matches!(
        other.consume(ConsumerSpec {
            queue: q.name.clone(),
            credit: CreditMode::Window(1),
            auto_settle: true,
            options: Default::default(),
        }),
        Err(BrokerError::Unauthorized(_))
    ));
    s.close(CloseKind::Clean);
    assert!(core.queue_stats(&q.name).is_none());
}

#[test]
fn unknown_deliveries_and_bad_addresses_are_errors() {
    let config = CoreConfig {
        auto_create_queues: false,
        ..CoreConfig::default()
    };
    let core = Core::new(config, Arc::new(NoJournal), Arc::new(super::AllowAll), None);
    let (mut s, _) = open(&core, "c");
    assert!(matches!(
        s.publish(
            &queue("nope"),
            Message::text("x"),
            PublishOptions::default()
        ),
        Err(BrokerError::NotFound(_))
    ));
    assert!(matches!(
        s.publish(&topic("a/+"), Message::text("x"), PublishOptions::default()),
        Err(BrokerError::InvalidAddress(_))
    ));
    assert_eq!(
        s.settle(ConsumerId(99), DeliveryTag(1), Outcome::Accept, None, false),
        Err(BrokerError::Unknown("consumer"))
    );
}

#[test]
fn redeclare_changes_a_lasting_queues_lifetime() {
    let core = Core::in_memory();
    let (mut s, _) = open(&core, "c");
    let spec = |lifetime| QueueSpec {
        name: Some("sess".into()),
        durable: true,
        lifetime,
        bindings_max: None,
    };
    assert!(
        !s.declare_queue(spec(QueueLifetime::Permanent))
            .expect("declare")
            .existed
    );
    let again = s
        .declare_queue(spec(QueueLifetime::IdleFor(Duration::from_millis(1))))
        .expect("redeclare");
    assert!(again.existed);
    // No consumer: the housekeeping thread now deletes it once idle.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while core.queue_stats("sess").is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        core.queue_stats("sess").is_none(),
        "idle queue expired after its new lifetime"
    );
}

#[test]
fn a_wills_expiry_counts_from_its_publication() {
    let core = Core::in_memory();
    let (mut watcher, ew) = open(&core, "w");
    subscribe(&mut watcher, "wills/#", 10);
    let (mut dev, _) = open(&core, "dev");
    dev.set_will(Some(Will {
        address: topic("wills/dev"),
        message: Message::text("bye"),
        delay: Duration::ZERO,
        expiry_interval: Some(Duration::from_secs(60)),
    }))
    .expect("will");
    let before = rosetta_neutral::message::now_ms();
    dev.close(CloseKind::Abnormal);
    let d = ew.deliveries();
    let expiry = d[0].message.expiry.expect("expiry set at publication");
    assert!(expiry >= before + 60_000 && expiry <= rosetta_neutral::message::now_ms() + 60_000);
}

#[test]
fn producers_are_held_back_past_the_memory_budget_until_consumers_catch_up() {
    let config = CoreConfig {
        memory_budget_bytes: 10_000,
        ..CoreConfig::default()
    };
    let core = Core::new(config, Arc::new(NoJournal), Arc::new(super::AllowAll), None);
    let (mut p, _) = open(&core, "p");
    let body = "x".repeat(1_000);
    for _ in 0..5 {
        publish(&mut p, queue("q"), &body);
    }
    assert!(!p.producer_blocked(), "5 KB queued is under the budget");
    for _ in 0..10 {
        publish(&mut p, queue("q"), &body);
    }
    assert!(p.producer_blocked(), "15 KB queued is over the budget");
    let (mut c, e) = open(&core, "c");
    let id = c
        .consume(ConsumerSpec {
            queue: "q".into(),
            credit: CreditMode::Window(100),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume");
    for d in e.deliveries() {
        c.settle(id, d.tag, Outcome::Accept, None, false)
            .expect("ack");
    }
    assert!(!p.producer_blocked());
    assert_eq!(
        core.memory_used(),
        0,
        "every byte accounted for is released"
    );
}

/// A core that pages past `budget` bytes into `dir`.
fn paging_core(budget: u64, dir: &std::path::Path) -> Core {
    let config = CoreConfig {
        memory_budget_bytes: budget,
        paging_dir: Some(dir.to_owned()),
        ..CoreConfig::default()
    };
    Core::new(config, Arc::new(NoJournal), Arc::new(super::AllowAll), None)
}

#[test]
fn past_the_budget_messages_page_to_disk_and_come_back_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = 64 * 1024;
    let core = paging_core(budget, dir.path());
    let (mut p, _) = open(&core, "p");
    let count = 5_000;
    let body = |i: usize| format!("{i:06}-{}", "x".repeat(1_000));
    for i in 0..count {
        publish(&mut p, queue("q"), &body(i));
        // Paging keeps memory bounded, so producers are never held back.
        assert!(!p.producer_blocked(), "blocked at message {i}");
    }
    let one_message = 2 * 1024;
    assert!(
        core.memory_used() <= budget + one_message,
        "{} bytes held in memory for a {budget} byte budget",
        core.memory_used()
    );
    let stats = core.queue_stats("q").expect("queue");
    assert_eq!(stats.depth, count as u64);
    assert!(stats.paged > 4_900, "only {} paged", stats.paged);
    assert_eq!(core.messages_paged(), stats.paged);
    let page_file = std::fs::read_dir(dir.path())
        .expect("paging dir")
        .next()
        .expect("a page file")
        .expect("entry")
        .path();
    assert!(std::fs::metadata(&page_file).expect("page file").len() > 4_000_000);

    // A consumer with a window gets every message with its exact bytes, in
    // order; one release in the middle is redelivered (after what was
    // already in flight), never lost or doubled.
    let (mut c, e) = open(&core, "c");
    let id = c
        .consume(ConsumerSpec {
            queue: "q".into(),
            credit: CreditMode::Window(100),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume");
    let mut got: Vec<usize> = Vec::new();
    let mut released_once = false;
    while got.len() < count {
        let batch = e.deliveries();
        assert!(!batch.is_empty(), "stalled after {} messages", got.len());
        for d in batch {
            let n: usize = text(&d)[..6].parse().expect("numbered body");
            assert_eq!(text(&d), body(n), "message {n} bytes");
            if n == 2_500 && !released_once {
                released_once = true;
                c.settle(id, d.tag, Outcome::Release, None, false)
                    .expect("release");
                continue;
            }
            got.push(n);
            c.settle(id, d.tag, Outcome::Accept, None, false)
                .expect("ack");
        }
        assert!(core.memory_used() <= budget + 2 * 1024 * 1024);
    }
    let redelivered_at = got.iter().position(|n| *n == 2_500).expect("redelivered");
    assert!(
        redelivered_at > 2_500,
        "the released message came back later"
    );
    got.remove(redelivered_at);
    assert!(got.iter().copied().eq((0..count).filter(|n| *n != 2_500)));
    assert!(released_once);
    let stats = core.queue_stats("q").expect("queue");
    assert_eq!((stats.depth, stats.paged, stats.in_flight), (0, 0, 0));
    assert_eq!(core.messages_paged(), 0);
    assert_eq!(
        core.memory_used(),
        0,
        "every byte accounted for is released"
    );
    assert_eq!(
        std::fs::metadata(&page_file).expect("page file").len(),
        0,
        "an emptied page file gives its space back"
    );
}

#[test]
fn deleting_a_paging_queue_removes_its_page_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let core = paging_core(16 * 1024, dir.path());
    let (mut p, _) = open(&core, "p");
    for i in 0..200 {
        publish(&mut p, queue("q"), &format!("{i}{}", "y".repeat(500)));
    }
    assert!(core.messages_paged() > 100);
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    p.delete_queue("q").expect("delete");
    assert_eq!(core.messages_paged(), 0);
    assert_eq!(core.memory_used(), 0);
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
}

#[test]
fn a_full_queue_refuses_sends_and_misses_topic_messages_others_get() {
    let config = CoreConfig {
        queue_depth_max: 3,
        ..CoreConfig::default()
    };
    let core = Core::new(config, Arc::new(NoJournal), Arc::new(super::AllowAll), None);
    let (mut p, _) = open(&core, "p");
    for i in 0..3 {
        publish(&mut p, queue("q"), &format!("{i}"));
    }
    let refused = p.publish(&queue("q"), Message::text("3"), PublishOptions::default());
    assert!(
        matches!(refused, Err(BrokerError::ResourceLimit(_))),
        "{refused:?}"
    );
    // In flight counts too: a consumer taking one does not make room
    // until it settles.
    let (mut c, e) = open(&core, "c");
    let id = c
        .consume(ConsumerSpec {
            queue: "q".into(),
            credit: CreditMode::Window(1),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume");
    let d = e.deliveries();
    assert!(p
        .publish(&queue("q"), Message::text("3"), PublishOptions::default())
        .is_err());
    c.settle(id, d[0].tag, Outcome::Accept, None, false)
        .expect("ack");
    publish(&mut p, queue("q"), "3");

    // Topic fan-out: the full subscriber queue misses it, the other gets it.
    let (mut s1, e1) = open(&core, "s1");
    let (full, _) = subscribe(&mut s1, "t", 0);
    let (mut s2, e2) = open(&core, "s2");
    let (_, s2_consumer) = subscribe(&mut s2, "t", 100);
    for i in 0..5 {
        let r = publish(&mut p, Address::Topic("t".into()), &format!("t{i}"));
        assert_eq!(r.routed, if i < 3 { 2 } else { 1 });
        let got = e2.deliveries();
        assert_eq!(got.len(), 1, "the subscriber with room gets t{i}");
        s2.settle(s2_consumer, got[0].tag, Outcome::Accept, None, false)
            .expect("ack");
    }
    assert!(e1.deliveries().is_empty());
    let stats = core.queue_stats(&full).expect("subscriber queue");
    assert_eq!((stats.depth, stats.dropped_full_total), (3, 2));
}

/// The core numbers an explicit-credit consumer's deliveries and stops at
/// the limit it is given, so deliveries already sent but not yet seen by
/// the adapter (in its event queue) are inside the client's credit, not
/// on top of it. With an absolute credit, repeating a flow whose credit the
/// in-transit deliveries already used sent that credit again.
#[test]
fn explicit_credit_counts_deliveries_still_in_transit() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let c = s
        .consume(ConsumerSpec {
            queue: "q".into(),
            credit: CreditMode::Explicit(0),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume");
    for i in 0..20 {
        publish(&mut s, queue("q"), &i.to_string());
    }
    s.set_credit(c, 5, false).expect("credit");
    // The adapter has seen none of these five yet when the client repeats
    // its flow (same delivery-count, same credit): the limit is the same.
    s.set_credit(c, 5, false).expect("credit again");
    let first = e.deliveries();
    assert_eq!(first.len(), 5, "the client granted five");
    // Seen five; the client grants five more.
    s.set_credit(c, 10, false).expect("more credit");
    let second = e.deliveries();
    assert_eq!(
        second.iter().map(text).collect::<Vec<_>>(),
        ["5", "6", "7", "8", "9"]
    );
    assert!(
        second.iter().chain(&first).all(|d| !d.redelivered),
        "nothing went round twice"
    );
    // A limit behind what was sent (the client lowered its credit) grants
    // nothing rather than wrapping into a huge credit.
    s.set_credit(c, 3, false).expect("lower");
    assert!(e.deliveries().is_empty());
    assert_eq!(core.queue_stats("q").map(|q| q.redeliveries_total), Some(0));
}

/// A sink with a delivery budget, as a connection's driver makes one.
pub(crate) struct Budgeted {
    pub(crate) events: Events,
    pub(crate) budget: DeliveryBudget,
}

impl EventSink for Budgeted {
    fn send(&self, event: SessionEvent) {
        self.events.send(event);
    }

    fn budget(&self) -> Option<&DeliveryBudget> {
        Some(&self.budget)
    }
}

/// An auto-settled consumer's credit comes back at dispatch, so only the
/// connection's byte budget holds the core back from emptying a whole
/// backlog into a connection that does not read; once the connection
/// writes (drops) what it holds, the core is resumed.
#[test]
fn a_full_delivery_budget_holds_dispatch_until_the_connection_resumes_it() {
    let core = Core::in_memory();
    let body = "x".repeat(1000);
    let one = Message::text(body.clone()).memory_size() as u64;
    let sink = Arc::new(Budgeted {
        events: Events::default(),
        budget: DeliveryBudget::new(10 * one),
    });
    let mut s = core.open_session(info("slow"), sink.clone());
    s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(1000),
        auto_settle: true,
        options: Default::default(),
    })
    .expect("consume");
    let (mut producer, _pe) = open(&core, "producer");
    for _ in 0..100 {
        producer
            .publish(
                &queue("q"),
                Message::text(body.clone()),
                PublishOptions::default(),
            )
            .expect("publish");
    }
    let mut held = sink.events.deliveries();
    assert_eq!(held.len(), 10, "the budget holds ten");
    assert_eq!(core.queue_stats("q").map(|q| q.depth), Some(90));
    assert!(sink.budget.held_back_since().is_some());
    assert!(!sink.budget.take_resume(), "nothing written yet");
    // The connection writes (drops) six: 4 of 10 left, below half.
    drop(held.drain(..6).collect::<Vec<_>>());
    assert!(sink.budget.take_resume(), "room again");
    s.resume_deliveries();
    assert_eq!(sink.events.deliveries().len(), 6, "refilled to the budget");
    assert_eq!(core.queue_stats("q").map(|q| q.depth), Some(84));
    drop(held);
    // What waits holds the sink (its charges): dropped, as a driver does.
    drop(sink.events.deliveries());
}

fn limited_core(config: CoreConfig) -> Core {
    Core::new(config, Arc::new(NoJournal), Arc::new(super::AllowAll), None)
}

fn named(name: &str, bindings_max: Option<usize>) -> QueueSpec {
    QueueSpec {
        name: Some(name.into()),
        durable: false,
        lifetime: QueueLifetime::Permanent,
        bindings_max,
    }
}

fn is_limit<T: std::fmt::Debug>(r: &Result<T, BrokerError>) -> bool {
    matches!(r, Err(BrokerError::ResourceLimit(_)))
}

#[test]
fn queues_in_total_are_capped_but_dead_letters_still_find_their_queue() {
    let core = limited_core(CoreConfig {
        queues_max: 2,
        delivery_attempts_max: 1,
        ..CoreConfig::default()
    });
    let (mut s, e) = open(&core, "c");
    s.declare_queue(named("a", None)).expect("first");
    // Auto-created on first send: the second queue.
    publish(&mut s, queue("b"), "m");
    let third = s.declare_queue(named("c", None));
    assert!(is_limit(&third), "{third:?}");
    assert!(is_limit(&s.publish(
        &queue("c"),
        Message::text("x"),
        PublishOptions::default()
    )));
    let consume = s.consume(ConsumerSpec {
        queue: "c".into(),
        credit: CreditMode::Window(1),
        auto_settle: false,
        options: Default::default(),
    });
    assert!(is_limit(&consume), "{consume:?}");
    // Declaring an existing queue is no new queue.
    assert!(s.declare_queue(named("a", None)).expect("again").existed);
    // The dead-letter queue is created even at the cap: a rejected message
    // must not be dropped for want of a place to go.
    let c = s
        .consume(ConsumerSpec {
            queue: "b".into(),
            credit: CreditMode::Window(1),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume");
    let d = e.deliveries().remove(0);
    s.settle(c, d.tag, Outcome::Reject, None, false)
        .expect("reject");
    assert_eq!(core.queue_stats("DLQ").map(|s| s.depth), Some(1));
    // Deleting a queue frees a place.
    s.delete_queue("a").expect("delete");
    s.delete_queue("DLQ").expect("delete");
    s.declare_queue(named("c", None)).expect("room again");
}

#[test]
fn bindings_in_total_are_capped_and_rebinding_is_no_new_binding() {
    let core = limited_core(CoreConfig {
        bindings_max: 2,
        ..CoreConfig::default()
    });
    let (mut s, _) = open(&core, "c");
    s.declare_queue(named("q1", None)).expect("declare");
    s.declare_queue(named("q2", None)).expect("declare");
    s.bind("q1", "a/#", BindingOptions::default())
        .expect("bind");
    s.bind("q2", "a/#", BindingOptions::default())
        .expect("bind");
    let refused = s.bind("q1", "b", BindingOptions::default());
    assert!(is_limit(&refused), "{refused:?}");
    // Replacing a binding's options is no new binding.
    let again = s
        .bind("q1", "a/#", BindingOptions::default())
        .expect("rebind");
    assert!(again.existed);
    assert!(s.unbind("q2", "a/#").expect("unbind"));
    s.bind("q1", "b", BindingOptions::default())
        .expect("room again");
    // Deleting a queue frees its bindings too.
    s.delete_queue("q1").expect("delete");
    s.bind("q2", "c", BindingOptions::default()).expect("bind");
    s.bind("q2", "d", BindingOptions::default()).expect("bind");
}

#[test]
fn a_queue_declared_with_a_bindings_cap_keeps_it_until_declared_with_another() {
    let core = Core::in_memory();
    let (mut s, _) = open(&core, "c");
    s.declare_queue(named("session", Some(2))).expect("declare");
    s.bind("session", "a", BindingOptions::default())
        .expect("bind");
    s.bind("session", "b", BindingOptions::default())
        .expect("bind");
    let refused = s.bind("session", "c", BindingOptions::default());
    assert!(is_limit(&refused), "{refused:?}");
    assert!(
        s.bind("session", "b", BindingOptions::default())
            .expect("rebind")
            .existed
    );
    // Another queue is not limited by it.
    s.declare_queue(named("other", None)).expect("declare");
    for f in ["a", "b", "c"] {
        s.bind("other", f, BindingOptions::default()).expect("bind");
    }
    // A declare without a cap (a producer auto-creating it, say) keeps the
    // cap; one with a cap replaces it.
    s.declare_queue(named("session", None)).expect("declare");
    assert!(is_limit(&s.bind("session", "c", BindingOptions::default())));
    s.declare_queue(named("session", Some(3))).expect("declare");
    s.bind("session", "c", BindingOptions::default())
        .expect("raised");
    s.declare_queue(named("session", Some(1))).expect("declare");
    assert!(is_limit(&s.bind("session", "d", BindingOptions::default())));
    assert!(
        s.unbind("session", "a").expect("unbind"),
        "lowered: unbinding works"
    );
}

#[test]
fn one_queue_matched_by_many_bindings_gets_one_copy_among_many_queues() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let queues = 200;
    for i in 0..queues {
        let name = format!("q{i}");
        s.declare_queue(named(&name, None)).expect("declare");
        let at_most_once = BindingOptions {
            max_guarantee: Guarantee::AtMostOnce,
            ..BindingOptions::default()
        };
        s.bind(&name, "fan/out", at_most_once).expect("bind");
        if i % 3 == 0 {
            let opts = BindingOptions {
                subscription_id: Some(i),
                max_guarantee: Guarantee::AtLeastOnce,
                ..BindingOptions::default()
            };
            s.bind(&name, "fan/#", opts).expect("bind");
        }
        s.consume(ConsumerSpec {
            queue: name,
            credit: CreditMode::Window(10),
            auto_settle: true,
            options: Default::default(),
        })
        .expect("consume");
    }
    assert_eq!(
        publish(&mut s, topic("fan/out"), "m").routed,
        queues as usize
    );
    let d = e.deliveries();
    assert_eq!(d.len(), queues as usize, "one copy per queue");
    let mut ids: Vec<u32> = d
        .iter()
        .flat_map(|d| d.matched.subscription_ids.clone())
        .collect();
    ids.sort_unstable();
    let want: Vec<u32> = (0..queues).filter(|i| i % 3 == 0).collect();
    assert_eq!(ids, want, "each queue's matches folded into its copy");
    let upgraded = d
        .iter()
        .filter(|d| d.matched.max_guarantee == Some(Guarantee::AtLeastOnce))
        .count();
    assert_eq!(upgraded, want.len());
}

// Beside this file, not under `tests/`: Cargo would take that directory
// for integration tests of the crate.
#[path = "queue_semantics_tests.rs"]
mod queue_semantics;

#[path = "dedup_tests.rs"]
mod dedup;
#[path = "schedule_tests.rs"]
mod schedule;
#[path = "schedule_paging_tests.rs"]
mod schedule_paging;

#[path = "lease_tests.rs"]
mod lease;

#[path = "excluded_tests.rs"]
mod excluded;
