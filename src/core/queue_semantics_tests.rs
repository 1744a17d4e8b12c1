//! Queue semantics (issue 15) through the session API: message priority,
//! exclusive consumers, consumer priority, selectors, browsing and message
//! groups.

use super::*;

fn consume_with(
    s: &mut Box<dyn Session>,
    queue: &str,
    credit: CreditMode,
    options: ConsumerOptions,
) -> ConsumerId {
    s.consume(ConsumerSpec {
        queue: queue.into(),
        credit,
        auto_settle: false,
        options,
    })
    .expect("consume")
}

fn plain(s: &mut Box<dyn Session>, queue: &str, credit: CreditMode) -> ConsumerId {
    consume_with(s, queue, credit, ConsumerOptions::default())
}

fn send(s: &mut Box<dyn Session>, q: &str, body: &str, set: impl FnOnce(&mut Message)) {
    let mut m = Message::text(body);
    set(&mut m);
    s.publish(&queue(q), m, PublishOptions::default())
        .expect("publish");
}

fn with_priority(p: u8) -> impl FnOnce(&mut Message) {
    move |m| m.priority = p
}

fn in_group(g: &str) -> impl FnOnce(&mut Message) + '_ {
    move |m| m.group_id = Some(g.to_owned())
}

fn to(d: &[Delivery], c: ConsumerId) -> Vec<String> {
    d.iter().filter(|d| d.consumer == c).map(text).collect()
}

fn texts(d: &[Delivery]) -> Vec<String> {
    d.iter().map(text).collect()
}

fn accept_all(s: &mut Box<dyn Session>, d: &[Delivery]) {
    for d in d {
        s.settle(d.consumer, d.tag, Outcome::Accept, None, false)
            .expect("accept");
    }
}

#[test]
fn higher_priority_first_fifo_within_a_priority_and_a_release_returns_to_its_place() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    for (body, p) in [("a", 4), ("b", 9), ("c", 0), ("d", 9), ("e", 4)] {
        send(&mut s, "q", body, with_priority(p));
    }
    let c = plain(&mut s, "q", CreditMode::Explicit(2));
    let first = e.deliveries();
    assert_eq!(texts(&first), vec!["b", "d"]);
    // A newer message of the same priority arrives while "b" is out; "b"
    // comes back ahead of it, and ahead of every lower priority.
    send(&mut s, "q", "f", with_priority(9));
    s.settle(c, first[0].tag, Outcome::Release, None, false)
        .expect("release");
    s.settle(c, first[1].tag, Outcome::Accept, None, false)
        .expect("accept");
    s.set_credit(c, 100, false).expect("credit");
    assert_eq!(texts(&e.deliveries()), vec!["b", "f", "a", "e", "c"]);
}

#[test]
fn an_exclusive_consumer_receives_alone_and_standbys_take_over_in_attach_order() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let exclusive = ConsumerOptions {
        exclusive: true,
        ..Default::default()
    };
    let first = plain(&mut s, "q", CreditMode::Window(10));
    let active = consume_with(&mut s, "q", CreditMode::Window(10), exclusive.clone());
    let standby = consume_with(&mut s, "q", CreditMode::Window(10), exclusive);
    for i in 1..=3 {
        send(&mut s, "q", &format!("m{i}"), |_| {});
    }
    let d = e.deliveries();
    assert_eq!(to(&d, active), vec!["m1", "m2", "m3"]);
    assert!(to(&d, first).is_empty() && to(&d, standby).is_empty());
    s.settle(active, d[0].tag, Outcome::Accept, None, false)
        .expect("accept");
    // The active one goes with m2 and m3 unsettled: the next exclusive one
    // in attach order gets them first, in order, then what comes next.
    s.cancel(active).expect("cancel");
    send(&mut s, "q", "m4", |_| {});
    let d = e.deliveries();
    assert_eq!(to(&d, standby), vec!["m2", "m3", "m4"]);
    assert!(to(&d, first).is_empty());
    assert!(d[0].redelivered && d[1].redelivered && !d[2].redelivered);
    // No exclusive consumer left: the plain one receives again.
    s.cancel(standby).expect("cancel");
    let d = e.deliveries();
    assert_eq!(to(&d, first), vec!["m2", "m3", "m4"]);
}

#[test]
fn higher_priority_consumers_get_messages_while_they_have_credit_round_robin_among_them() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let high = |s: &mut Box<dyn Session>| {
        consume_with(
            s,
            "q",
            CreditMode::Explicit(2),
            ConsumerOptions {
                priority: 5,
                ..Default::default()
            },
        )
    };
    let low = plain(&mut s, "q", CreditMode::Window(100));
    let h1 = high(&mut s);
    let h2 = high(&mut s);
    for i in 0..6 {
        send(&mut s, "q", &i.to_string(), |_| {});
    }
    let d = e.deliveries();
    assert_eq!(to(&d, h1), vec!["0", "2"]);
    assert_eq!(to(&d, h2), vec!["1", "3"]);
    // Both high ones are out of credit: only now does the low one get any.
    assert_eq!(to(&d, low), vec!["4", "5"]);
    s.set_credit(h2, 3, false).expect("credit");
    send(&mut s, "q", "6", |_| {});
    send(&mut s, "q", "7", |_| {});
    let d = e.deliveries();
    assert_eq!(to(&d, h2), vec!["6"]);
    assert_eq!(to(&d, low), vec!["7"]);
}

#[test]
fn selecting_consumers_get_exactly_their_matches_and_the_rest_waits_for_a_plain_one() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let colours = ["green", "red", "blue"];
    let coloured = |i: usize| move |m: &mut Message| m.properties.push("colour", colours[i % 3]);
    // Half the messages wait before the consumers attach (indexed when
    // they attach), half arrive after (indexed when they arrive).
    for i in 0..30 {
        send(&mut s, "q", &i.to_string(), coloured(i));
    }
    let selecting = |s: &mut Box<dyn Session>, selector: &str| {
        consume_with(
            s,
            "q",
            CreditMode::Window(1000),
            ConsumerOptions {
                selector: Some(selector.into()),
                ..Default::default()
            },
        )
    };
    let green = selecting(&mut s, "colour = 'green'");
    let red = selecting(&mut s, "colour IN ('red') AND colour <> 'green'");
    let rest = plain(&mut s, "q", CreditMode::Explicit(0));
    for i in 30..60 {
        send(&mut s, "q", &i.to_string(), coloured(i));
    }
    let d = e.deliveries();
    let expect = |k: usize| -> Vec<String> {
        (0..60)
            .filter(|i| i % 3 == k)
            .map(|i| i.to_string())
            .collect()
    };
    assert_eq!(to(&d, green), expect(0));
    assert_eq!(to(&d, red), expect(1));
    assert!(to(&d, rest).is_empty(), "no credit yet");
    s.set_credit(rest, 100, false).expect("credit");
    assert_eq!(to(&e.deliveries(), rest), expect(2));
    let stats = core.queue_stats("q").expect("stats");
    // Each message evaluated once per selecting consumer, none rescanned:
    // the first selecting consumer saw the 30 waiting ones as it attached
    // (and took its 10 at once), the second the 20 still waiting, and both
    // saw each of the 30 that came after.
    assert_eq!(stats.selector_evaluations_total, 30 + 20 + 2 * 30);
}

#[test]
fn a_malformed_selector_is_refused_and_no_consumer_is_attached() {
    let core = Core::in_memory();
    let (mut s, _e) = open(&core, "c");
    let r = s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(10),
        auto_settle: false,
        options: ConsumerOptions {
            selector: Some("colour = ".into()),
            ..Default::default()
        },
    });
    assert!(matches!(r, Err(BrokerError::InvalidSelector(_))), "{r:?}");
    assert_eq!(core.queue_stats("q").map(|s| s.consumers), Some(0));
}

#[test]
fn a_browser_sees_every_message_once_leaves_them_all_and_is_told_when_it_has_seen_all() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    for i in 0..5 {
        send(
            &mut s,
            "q",
            &i.to_string(),
            with_priority(if i == 3 { 9 } else { 4 }),
        );
    }
    let browser = consume_with(
        &mut s,
        "q",
        CreditMode::Explicit(2),
        ConsumerOptions {
            browse: true,
            ..Default::default()
        },
    );
    // Credit applies: two now, the rest when it asks.
    assert_eq!(texts(&e.deliveries()), vec!["0", "1"]);
    s.set_credit(browser, 10, false).expect("credit");
    let events = e.take();
    let seen: Vec<String> = events
        .iter()
        .filter_map(|ev| match ev {
            SessionEvent::Delivery(d) => Some(text(d)),
            _ => None,
        })
        .collect();
    assert_eq!(seen, vec!["2", "3", "4"], "arrival order, each once");
    let ended = events
        .iter()
        .filter(|ev| matches!(ev, SessionEvent::BrowseEnded { consumer } if *consumer == browser))
        .count();
    assert_eq!(ended, 1);
    assert!(matches!(
        events.last(),
        Some(SessionEvent::BrowseEnded { .. })
    ));
    send(&mut s, "q", "5", |_| {});
    assert!(e.take().is_empty(), "nothing more after the end");
    let stats = core.queue_stats("q").expect("stats");
    assert_eq!((stats.depth, stats.in_flight), (6, 0));
    // The real consumer gets everything in queue order, untouched.
    let c = plain(&mut s, "q", CreditMode::Window(10));
    let d = e.deliveries();
    assert_eq!(to(&d, c), vec!["3", "0", "1", "2", "4", "5"]);
    assert!(d.iter().all(|d| d.delivery_count == 0 && !d.redelivered));
}

#[test]
fn a_browser_never_holds_up_consumers_nor_sees_what_they_took() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let c = plain(&mut s, "q", CreditMode::Explicit(1));
    for i in 0..3 {
        send(&mut s, "q", &i.to_string(), |_| {});
    }
    let browser = consume_with(
        &mut s,
        "q",
        CreditMode::Window(10),
        ConsumerOptions {
            browse: true,
            ..Default::default()
        },
    );
    let d = e.deliveries();
    assert_eq!(to(&d, c), vec!["0"]);
    assert_eq!(to(&d, browser), vec!["1", "2"]);
    s.set_credit(c, 3, false).expect("credit");
    assert_eq!(to(&e.deliveries(), c), vec!["1", "2"]);
}

#[test]
fn groups_stick_to_one_consumer_in_order_and_spread_evenly() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let a = plain(&mut s, "q", CreditMode::Window(1000));
    let b = plain(&mut s, "q", CreditMode::Window(1000));
    let groups = ["g1", "g2", "g3", "g4"];
    for i in 0..40 {
        send(
            &mut s,
            "q",
            &format!("{}-{i}", groups[i % 4]),
            in_group(groups[i % 4]),
        );
        if i % 4 == 3 {
            // Ungrouped messages go to either; they do not move groups.
            send(&mut s, "q", "none", |_| {});
        }
    }
    let d = e.deliveries();
    let mut per_consumer = std::collections::HashMap::new();
    for g in groups {
        let owners: std::collections::BTreeSet<ConsumerId> = d
            .iter()
            .filter(|d| text(d).starts_with(g))
            .map(|d| d.consumer)
            .collect();
        assert_eq!(owners.len(), 1, "{g} went to {owners:?}");
        *per_consumer
            .entry(*owners.first().expect("owner"))
            .or_insert(0) += 1;
        let seen: Vec<String> = d.iter().map(text).filter(|t| t.starts_with(g)).collect();
        let sent: Vec<String> = (0..40)
            .filter(|i| groups[i % 4] == g)
            .map(|i| format!("{g}-{i}"))
            .collect();
        assert_eq!(seen, sent, "in order");
    }
    assert_eq!(per_consumer.get(&a), Some(&2));
    assert_eq!(per_consumer.get(&b), Some(&2));
    // A new consumer has the fewest groups: it takes the next new one.
    let c = plain(&mut s, "q", CreditMode::Window(1000));
    send(&mut s, "q", "g5-0", in_group("g5"));
    send(&mut s, "q", "g1-40", in_group("g1"));
    let d = e.deliveries();
    assert_eq!(to(&d, c), vec!["g5-0"]);
    assert_eq!(d.len(), 2);
    assert_ne!(d[1].consumer, c, "g1 stays where it was");
    // Nothing was settled, so every group is still held by its consumer.
    assert_eq!(core.queue_stats("q").map(|st| st.groups), Some(5));
}

#[test]
fn a_group_moves_with_its_unacknowledged_messages_first_when_its_consumer_goes() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let (mut s2, e2) = open(&core, "d");
    let a = plain(&mut s, "q", CreditMode::Window(3));
    for i in 0..6 {
        send(&mut s2, "q", &format!("g-{i}"), in_group("g"));
    }
    let d = e.deliveries();
    assert_eq!(to(&d, a), vec!["g-0", "g-1", "g-2"]);
    // The other consumer attaches while the group is a's: it gets nothing
    // of it, whatever its credit.
    let b = plain(&mut s2, "q", CreditMode::Window(100));
    assert!(e2.deliveries().is_empty());
    s.settle(a, d[0].tag, Outcome::Accept, None, false)
        .expect("accept");
    assert_eq!(to(&e.deliveries(), a), vec!["g-3"]);
    // a's session dies with g-1..g-3 unsettled and g-4, g-5 reserved for it.
    drop(s);
    let d = e2.deliveries();
    assert_eq!(to(&d, b), vec!["g-1", "g-2", "g-3", "g-4", "g-5"]);
    accept_all(&mut s2, &d);
    send(&mut s2, "q", "g-6", in_group("g"));
    assert_eq!(to(&e2.deliveries(), b), vec!["g-6"]);
    assert_eq!(core.queue_stats("q").map(|s| s.depth), Some(0));
}

#[test]
fn a_group_without_credit_holds_up_only_itself() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let a = plain(&mut s, "q", CreditMode::Explicit(1));
    let b = plain(&mut s, "q", CreditMode::Window(100));
    send(&mut s, "q", "x-0", in_group("x"));
    // a has x and no credit left: x's messages wait for a, the others flow.
    for i in 1..4 {
        send(&mut s, "q", &format!("x-{i}"), in_group("x"));
        send(&mut s, "q", &format!("y-{i}"), in_group("y"));
        send(&mut s, "q", &format!("n-{i}"), |_| {});
    }
    let d = e.deliveries();
    assert_eq!(to(&d, a), vec!["x-0"]);
    assert_eq!(to(&d, b), vec!["y-1", "n-1", "y-2", "n-2", "y-3", "n-3"]);
    s.set_credit(a, 10, false).expect("credit");
    assert_eq!(to(&e.deliveries(), a), vec!["x-1", "x-2", "x-3"]);
}

/// A queue with its own settings, as `[[queues]]` configuration gives it.
fn configured_queue(core: &Core, name: &str, settings: crate::QueueSettings) {
    let inner = &core.inner;
    let id = inner
        .next_queue_id
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let q = crate::queue::Queue::new(
        id,
        name,
        false,
        QueueLifetime::Permanent,
        None,
        settings,
        inner.queue_links(),
    );
    inner.routing.write().insert_queue(q);
}

#[test]
fn on_an_exclusive_queue_the_first_consumer_receives_and_the_next_takes_over() {
    let core = Core::in_memory();
    configured_queue(
        &core,
        "q",
        crate::QueueSettings {
            exclusive: true,
            ..Default::default()
        },
    );
    let (mut s, e) = open(&core, "c");
    let a = plain(&mut s, "q", CreditMode::Window(10));
    let b = plain(&mut s, "q", CreditMode::Window(10));
    let c = plain(&mut s, "q", CreditMode::Window(10));
    for i in 0..4 {
        send(&mut s, "q", &i.to_string(), |_| {});
    }
    let d = e.deliveries();
    assert_eq!(to(&d, a), vec!["0", "1", "2", "3"]);
    accept_all(&mut s, &d[..2]);
    s.cancel(a).expect("cancel");
    let d = e.deliveries();
    assert_eq!(
        to(&d, b),
        vec!["2", "3"],
        "the unsettled ones, first, in order"
    );
    assert!(to(&d, c).is_empty());
    assert!(d.iter().all(|d| d.delivery_count == 1));
}

#[test]
fn past_groups_max_the_longest_idle_group_is_forgotten_and_assigned_afresh() {
    let core = Core::in_memory();
    configured_queue(
        &core,
        "q",
        crate::QueueSettings {
            groups_max: 2,
            ..Default::default()
        },
    );
    let (mut s, e) = open(&core, "c");
    let a = plain(&mut s, "q", CreditMode::Window(10));
    let b = plain(&mut s, "q", CreditMode::Window(10));
    send(&mut s, "q", "g1", in_group("g1"));
    send(&mut s, "q", "g2", in_group("g2"));
    let d = e.deliveries();
    assert_eq!(
        (to(&d, a), to(&d, b)),
        (vec!["g1".into()], vec!["g2".into()])
    );
    // g1 goes idle first, then g2.
    accept_all(&mut s, &d);
    // A third group: g1, idle the longest, is forgotten to make room.
    send(&mut s, "q", "g3", in_group("g3"));
    let d = e.deliveries();
    assert_eq!(texts(&d), vec!["g3"]);
    accept_all(&mut s, &d);
    // A new consumer has the fewest groups. g2 is still b's; g1,
    // forgotten, is assigned afresh: to the new consumer, not to a.
    let c = plain(&mut s, "q", CreditMode::Window(10));
    for _ in 0..3 {
        send(&mut s, "q", "g2 again", in_group("g2"));
    }
    send(&mut s, "q", "g1 again", in_group("g1"));
    let d = e.deliveries();
    assert_eq!(to(&d, b), vec!["g2 again"; 3]);
    assert_eq!(to(&d, c), vec!["g1 again"]);
    assert!(to(&d, a).is_empty());
}

/// One step of the interleaving property below.
#[derive(Debug, Clone)]
enum Step {
    Publish {
        priority: u8,
        group: Option<u8>,
        colour: u8,
    },
    Attach {
        kind: u8,
        credit: u8,
        explicit: bool,
    },
    Cancel(usize),
    Settle {
        consumer: usize,
        accept: bool,
    },
    Credit {
        consumer: usize,
        limit: u8,
    },
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u8..10, proptest::option::of(0u8..4), 0u8..3)
            .prop_map(|(priority, group, colour)| Step::Publish { priority, group, colour }),
        1 => (0u8..6, 0u8..4, any::<bool>())
            .prop_map(|(kind, credit, explicit)| Step::Attach { kind, credit, explicit }),
        1 => (0usize..8).prop_map(Step::Cancel),
        3 => (0usize..8, any::<bool>()).prop_map(|(consumer, accept)| Step::Settle { consumer, accept }),
        1 => (0usize..8, 0u8..6).prop_map(|(consumer, limit)| Step::Credit { consumer, limit }),
    ]
}

const COLOURS: [&str; 3] = ["green", "red", "blue"];

struct Attached {
    id: ConsumerId,
    browse: bool,
    colour: Option<&'static str>,
    /// Deliveries not settled yet: tag, message number and group.
    unsettled: Vec<(DeliveryTag, u64, Option<String>)>,
    browsed: std::collections::HashSet<u64>,
}

/// Checks and records what the core sent.
struct Model {
    attached: Vec<Attached>,
    /// An exclusive consumer attached at some point: groups were dropped,
    /// and a group's old consumer may still hold some of its messages.
    had_exclusive: bool,
    accepted: std::collections::HashSet<u64>,
    in_flight: std::collections::HashSet<u64>,
}

impl Model {
    fn absorb(&mut self, e: &Events) -> Result<(), proptest::test_runner::TestCaseError> {
        for d in e.deliveries() {
            let n: u64 = text(&d).parse().expect("number");
            let Some(c) = self.attached.iter_mut().find(|c| c.id == d.consumer) else {
                proptest::prop_assert!(false, "delivery to a cancelled consumer");
                unreachable!()
            };
            if c.browse {
                proptest::prop_assert!(c.browsed.insert(n), "browsed {} twice", n);
                continue;
            }
            proptest::prop_assert!(!self.accepted.contains(&n), "{} delivered after accept", n);
            proptest::prop_assert!(self.in_flight.insert(n), "{} delivered twice at once", n);
            if let (Some(colour), None) = (c.colour, &d.message.group_id) {
                let got = d.message.properties.get("colour").map(|v| v.to_text());
                proptest::prop_assert_eq!(got.as_deref(), Some(colour));
            }
            c.unsettled.push((d.tag, n, d.message.group_id.clone()));
            // A group's unsettled messages are all with one consumer.
            if let (Some(group), false) = (&d.message.group_id, self.had_exclusive) {
                let holders = self
                    .attached
                    .iter()
                    .filter(|c| c.unsettled.iter().any(|u| u.2.as_ref() == Some(group)))
                    .count();
                proptest::prop_assert!(holders <= 1, "{} held by {} consumers", group, holders);
            }
        }
        Ok(())
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(64))]
    #[test]
    fn random_interleavings_never_lose_or_duplicate_a_message(steps in proptest::collection::vec(step(), 1..120)) {
        let core = limited_core(CoreConfig {
            delivery_attempts_max: u32::MAX,
            ..Default::default()
        });
        let (mut s, e) = open(&core, "c");
        let mut model = Model {
            attached: Vec::new(),
            had_exclusive: false,
            accepted: Default::default(),
            in_flight: Default::default(),
        };
        let mut published = 0u64;
        for step in steps {
            match step {
                Step::Publish { priority, group, colour } => {
                    send(&mut s, "q", &published.to_string(), |m| {
                        m.priority = priority;
                        m.group_id = group.map(|g| format!("g{g}"));
                        m.properties.push("colour", COLOURS[usize::from(colour)]);
                    });
                    published += 1;
                }
                Step::Attach { kind, credit, explicit } => {
                    let colour = (kind == 1 || kind == 2).then(|| COLOURS[usize::from(kind - 1)]);
                    let options = ConsumerOptions {
                        selector: colour.map(|c| format!("colour = '{c}'")),
                        exclusive: kind == 3,
                        priority: if kind == 4 { 7 } else { 0 },
                        browse: kind == 5,
                        visibility_timeout_ms: None,
                        stream: None,
                    };
                    let credit = u32::from(credit);
                    let mode = if explicit { CreditMode::Explicit(credit) } else { CreditMode::Window(credit.max(1)) };
                    model.had_exclusive |= options.exclusive;
                    let id = consume_with(&mut s, "q", mode, options);
                    model.attached.push(Attached {
                        id,
                        browse: kind == 5,
                        colour,
                        unsettled: Vec::new(),
                        browsed: Default::default(),
                    });
                }
                Step::Cancel(i) => {
                    if i < model.attached.len() {
                        let c = model.attached.remove(i);
                        s.cancel(c.id).expect("cancel");
                        for (_, n, _) in c.unsettled {
                            model.in_flight.remove(&n);
                        }
                    }
                }
                Step::Settle { consumer, accept } => {
                    if let Some(c) = model.attached.get_mut(consumer) {
                        if !c.unsettled.is_empty() {
                            let (tag, n, _) = c.unsettled.remove(0);
                            let outcome = if accept { Outcome::Accept } else { Outcome::Release };
                            let id = c.id;
                            model.in_flight.remove(&n);
                            if accept {
                                proptest::prop_assert!(model.accepted.insert(n));
                            }
                            s.settle(id, tag, outcome, None, false).expect("settle");
                        }
                    }
                }
                Step::Credit { consumer, limit } => {
                    if let Some(c) = model.attached.get(consumer) {
                        s.set_credit(c.id, u32::from(limit), false).expect("credit");
                    }
                }
            }
            model.absorb(&e)?;
        }
        // Everyone goes; one plain consumer takes what is left.
        for c in std::mem::take(&mut model.attached) {
            s.cancel(c.id).expect("cancel");
            for (_, n, _) in c.unsettled {
                model.in_flight.remove(&n);
            }
        }
        e.take();
        let last = plain(&mut s, "q", CreditMode::Window(1000));
        model.attached.push(Attached {
            id: last,
            browse: false,
            colour: None,
            unsettled: Vec::new(),
            browsed: Default::default(),
        });
        loop {
            model.absorb(&e)?;
            let pending = std::mem::take(&mut model.attached[0].unsettled);
            if pending.is_empty() {
                break;
            }
            for (tag, n, _) in pending {
                proptest::prop_assert!(model.accepted.insert(n), "{} accepted twice", n);
                s.settle(last, tag, Outcome::Accept, None, false).expect("settle");
            }
        }
        proptest::prop_assert_eq!(model.accepted.len() as u64, published);
        let stats = core.queue_stats("q").expect("queue");
        proptest::prop_assert_eq!((stats.depth, stats.in_flight), (0, 0));
    }
}

#[test]
fn a_message_with_group_sequence_minus_one_closes_its_group() {
    let core = Core::in_memory();
    let (mut s, e) = open(&core, "c");
    let a = plain(&mut s, "q", CreditMode::Explicit(2));
    let b = plain(&mut s, "q", CreditMode::Window(10));
    send(&mut s, "q", "g-0", in_group("g"));
    send(&mut s, "q", "g-1 last", |m| {
        m.group_id = Some("g".into());
        // What the STOMP and MQTT adapters leave of `JMSXGroupSeq:-1`.
        m.properties.push("JMSXGroupSeq", "-1");
    });
    let d = e.deliveries();
    assert_eq!(to(&d, a), vec!["g-0", "g-1 last"]);
    // a has no credit left; the closed group starts afresh with b rather
    // than wait for a.
    send(&mut s, "q", "g-2", in_group("g"));
    send(&mut s, "q", "g-3", in_group("g"));
    assert_eq!(to(&e.deliveries(), b), vec!["g-2", "g-3"]);
}

#[test]
fn a_selecting_consumers_paged_matches_reach_it_as_they_are_read_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = 16 * 1024;
    let core = paging_core(budget, dir.path());
    let (mut s, e) = open(&core, "c");
    let body = |i: usize| format!("{i:04}-{}", "x".repeat(1_000));
    // 100 messages no selector matches, then 5 matches, most on disk.
    for i in 0..105 {
        let colour = if i < 100 { "red" } else { "green" };
        send(&mut s, "q", &body(i), |m| {
            m.properties.push("colour", colour)
        });
    }
    assert!(core.queue_stats("q").expect("queue").paged > 80);
    let green = consume_with(
        &mut s,
        "q",
        CreditMode::Window(10),
        ConsumerOptions {
            selector: Some("colour = 'green'".into()),
            ..Default::default()
        },
    );
    // Memory is full of messages it does not match: its matches wait on
    // disk (the documented limit) rather than memory overflowing.
    assert!(e.deliveries().is_empty());
    assert!(core.memory_used() <= budget + 2 * 1024);
    // A plain consumer takes the red ones; the green ones, read back and
    // evaluated once, go to the selecting consumer.
    let red = plain(&mut s, "q", CreditMode::Explicit(100));
    let mut reds = 0;
    let mut greens = Vec::new();
    loop {
        let d = e.deliveries();
        if d.is_empty() {
            break;
        }
        for d in d {
            if d.consumer == red {
                reds += 1;
                assert!(text(&d).as_str() < "0100", "{}", &text(&d)[..4]);
            } else {
                assert_eq!(d.consumer, green);
                greens.push(text(&d)[..4].to_owned());
            }
            s.settle(d.consumer, d.tag, Outcome::Accept, None, false)
                .expect("accept");
        }
    }
    assert_eq!(reds, 100);
    assert_eq!(greens, vec!["0100", "0101", "0102", "0103", "0104"]);
    let stats = core.queue_stats("q").expect("queue");
    assert_eq!((stats.depth, stats.paged), (0, 0));
    assert_eq!(stats.selector_evaluations_total, 105);
}
