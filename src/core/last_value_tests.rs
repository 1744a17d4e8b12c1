//! Last-value queues through the public session API (replacement, what is
//! in flight, messages without the key, paging, restart), the index's
//! sequence rule directly, and the dead-letter annotations.

use std::sync::Arc;

use rosetta_neutral::*;

use super::*;
use crate::tests::{open, text};
use crate::Clock;
use crate::{
    AllowAll, Core, CoreConfig, NoJournal, QueueMatch, QueueOverrides, QueueRule, QueueRules,
    QueueStats, DEAD_LETTER_REASON_PROPERTY, DELIVERY_COUNT_PROPERTY, ORIGINAL_QUEUE_PROPERTY,
};

const KEY: &str = "symbol";

fn lvq_rules(queue: &str) -> QueueRules {
    QueueRules::new([QueueRule {
        target: QueueMatch::Name(queue.into()),
        overrides: QueueOverrides {
            last_value_key: Some(KEY.into()),
            ..QueueOverrides::default()
        },
    }])
}

fn lvq_core(config: CoreConfig) -> Core {
    let config = CoreConfig {
        queue_rules: lvq_rules("prices"),
        ..config
    };
    Core::new(config, Arc::new(NoJournal), Arc::new(AllowAll), None)
}

fn priced(symbol: Option<&str>, body: &str) -> Message {
    let mut m = Message::text(body.to_owned());
    if let Some(symbol) = symbol {
        m.properties.push(KEY, symbol);
    }
    m.durable = true;
    m
}

fn send(s: &mut Box<dyn Session>, queue: &str, m: Message) {
    s.publish(&Address::Queue(queue.into()), m, PublishOptions::default())
        .expect("publish");
}

fn consume(s: &mut Box<dyn Session>, queue: &str, window: u32) -> ConsumerId {
    s.consume(ConsumerSpec {
        queue: queue.into(),
        credit: CreditMode::Window(window),
        auto_settle: false,
        options: Default::default(),
    })
    .expect("consume")
}

fn stats(core: &Core, queue: &str) -> QueueStats {
    core.queue_stats(queue).expect("queue")
}

#[test]
fn last_value_queue_keeps_the_newest_waiting_message_per_value() {
    let core = lvq_core(CoreConfig::default());
    let (mut p, _) = open(&core, "p");
    send(&mut p, "prices", priced(Some("ACME"), "acme 1"));
    send(&mut p, "prices", priced(Some("INIT"), "init 1"));
    send(&mut p, "prices", priced(None, "news"));
    send(&mut p, "prices", priced(Some("ACME"), "acme 2"));
    send(&mut p, "prices", priced(Some("ACME"), "acme 3"));
    // Not a last-value queue: everything stays.
    send(&mut p, "orders", priced(Some("ACME"), "order 1"));
    send(&mut p, "orders", priced(Some("ACME"), "order 2"));
    let s = stats(&core, "prices");
    assert_eq!((s.depth, s.replaced_total, s.enqueued_total), (3, 2, 5));
    assert_eq!(stats(&core, "orders").depth, 2);
    let (mut c, e) = open(&core, "c");
    consume(&mut c, "prices", 10);
    let got: Vec<String> = e.deliveries().iter().map(text).collect();
    // The replacement waits at the tail (see `last_value`).
    assert_eq!(got, vec!["init 1", "news", "acme 3"]);
}

#[test]
fn last_value_queue_does_not_recall_a_message_in_flight() {
    let core = lvq_core(CoreConfig::default());
    let (mut p, _) = open(&core, "p");
    let (mut c, e) = open(&core, "c");
    let id = consume(&mut c, "prices", 1);
    send(&mut p, "prices", priced(Some("ACME"), "acme 1"));
    let first = e.deliveries().remove(0);
    assert_eq!(text(&first), "acme 1");
    send(&mut p, "prices", priced(Some("ACME"), "acme 2"));
    let s = stats(&core, "prices");
    assert_eq!(
        (s.in_flight, s.depth, s.replaced_total),
        (1, 1, 0),
        "the one in flight stays, the new one waits beside it"
    );
    send(&mut p, "prices", priced(Some("ACME"), "acme 3"));
    assert_eq!(stats(&core, "prices").replaced_total, 1);
    c.settle(id, first.tag, Outcome::Accept, None, false)
        .expect("ack");
    let next = e.deliveries().remove(0);
    assert_eq!(text(&next), "acme 3");
    c.settle(id, next.tag, Outcome::Accept, None, false)
        .expect("ack");
    let s = stats(&core, "prices");
    assert_eq!((s.depth, s.in_flight, s.acked_total), (0, 0, 2));
    assert_eq!(
        core.memory_used(),
        0,
        "the replaced one's bytes are released"
    );
}

#[test]
fn last_value_queue_drops_a_released_message_when_a_newer_one_of_its_value_waits() {
    let core = lvq_core(CoreConfig::default());
    let (mut p, _) = open(&core, "p");
    let (mut c, e) = open(&core, "c");
    let id = consume(&mut c, "prices", 1);
    send(&mut p, "prices", priced(Some("ACME"), "acme 1"));
    let first = e.deliveries().remove(0);
    send(&mut p, "prices", priced(Some("ACME"), "acme 2"));
    c.settle(id, first.tag, Outcome::Release, None, false)
        .expect("release");
    let s = stats(&core, "prices");
    assert_eq!(
        (s.depth + s.in_flight, s.replaced_total),
        (1, 1),
        "the released older one is dropped, as Artemis drops it"
    );
    let next = e.deliveries().remove(0);
    assert_eq!(text(&next), "acme 2");
    c.settle(id, next.tag, Outcome::Accept, None, false)
        .expect("ack");
    assert!(e.deliveries().is_empty(), "acme 1 never comes again");
    assert_eq!(
        core.memory_used(),
        0,
        "the dropped one's bytes are released"
    );
}

#[test]
fn last_value_queue_compares_a_scheduled_message_when_it_becomes_due() {
    let (core, clock) = crate::tests::manual_core(CoreConfig {
        queue_rules: lvq_rules("prices"),
        ..CoreConfig::default()
    });
    let (mut p, _) = open(&core, "p");
    send(&mut p, "prices", priced(Some("ACME"), "acme now"));
    let mut later = priced(Some("ACME"), "acme later");
    later.delivery_time = Some(clock.now_ms() + 1_000);
    send(&mut p, "prices", later);
    let s = stats(&core, "prices");
    assert_eq!(
        (s.depth, s.scheduled, s.replaced_total),
        (1, 1, 0),
        "not waiting yet"
    );
    clock.advance(1_000);
    core.run_timers();
    let s = stats(&core, "prices");
    assert_eq!(
        (s.depth, s.scheduled, s.replaced_total),
        (1, 0, 1),
        "due, it replaces the older waiting one"
    );
    let (mut c, e) = open(&core, "c");
    consume(&mut c, "prices", 10);
    let d = e.deliveries();
    assert_eq!(d.iter().map(text).collect::<Vec<_>>(), vec!["acme later"]);
}

#[test]
fn last_value_values_compare_as_text_across_types() {
    let core = lvq_core(CoreConfig::default());
    let (mut p, _) = open(&core, "p");
    let mut typed = Message::text("int 5");
    typed.properties.push(KEY, Value::Int(5));
    send(&mut p, "prices", typed);
    send(&mut p, "prices", priced(Some("5"), "string 5"));
    let (mut c, e) = open(&core, "c");
    consume(&mut c, "prices", 10);
    let got: Vec<String> = e.deliveries().iter().map(text).collect();
    assert_eq!(got, vec!["string 5"]);
}

#[test]
fn last_value_queue_drops_replaced_messages_that_are_paged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = 16 * 1024;
    let core = lvq_core(CoreConfig {
        memory_budget_bytes: budget,
        paging_dir: Some(dir.path().to_owned()),
        ..CoreConfig::default()
    });
    let (mut p, _) = open(&core, "p");
    let symbols = 50;
    let rounds = 20;
    let pad = "x".repeat(1_000);
    for round in 0..rounds {
        for sym in 0..symbols {
            let body = format!("{sym:03} {round:03} {pad}");
            send(&mut p, "prices", priced(Some(&format!("S{sym}")), &body));
        }
    }
    let s = stats(&core, "prices");
    assert_eq!(s.depth, symbols as u64);
    assert_eq!(s.replaced_total, (symbols * (rounds - 1)) as u64);
    assert!(s.paged > 0, "some of the survivors are on disk");
    let (mut c, e) = open(&core, "c");
    let id = consume(&mut c, "prices", 1_000);
    let mut got = Vec::new();
    loop {
        let batch = e.deliveries();
        if batch.is_empty() {
            break;
        }
        for d in batch {
            got.push(text(&d)[..7].to_owned());
            c.settle(id, d.tag, Outcome::Accept, None, false)
                .expect("ack");
        }
    }
    got.sort();
    let want: Vec<String> = (0..symbols)
        .map(|sym| format!("{sym:03} {:03}", rounds - 1))
        .collect();
    assert_eq!(got, want, "only the newest of each, read back or not");
    assert_eq!(core.messages_paged(), 0);
    assert_eq!(core.memory_used(), 0);
}

#[test]
fn last_value_queue_replaces_a_message_reserved_for_its_groups_consumer() {
    let core = lvq_core(CoreConfig::default());
    let (mut p, _) = open(&core, "p");
    let (mut c, e) = open(&core, "c");
    let id = consume(&mut c, "prices", 1);
    let grouped = |symbol: &str, body: &str| {
        let mut m = priced(Some(symbol), body);
        m.group_id = Some("g".into());
        m
    };
    send(&mut p, "prices", grouped("FIRST", "first"));
    let first = e.deliveries().remove(0);
    // The group is the consumer's now, and it has no credit: the next
    // messages of the group wait reserved for it.
    send(&mut p, "prices", grouped("ACME", "acme 1"));
    send(&mut p, "prices", grouped("ACME", "acme 2"));
    let s = stats(&core, "prices");
    assert_eq!((s.depth, s.replaced_total, s.groups), (1, 1, 1));
    c.settle(id, first.tag, Outcome::Accept, None, false)
        .expect("ack");
    let next = e.deliveries().remove(0);
    assert_eq!(text(&next), "acme 2");
    c.settle(id, next.tag, Outcome::Accept, None, false)
        .expect("ack");
    assert_eq!(stats(&core, "prices").depth, 0);
    assert_eq!(core.memory_used(), 0);
}

#[test]
fn last_value_index_drops_an_older_message_that_arrives_second() {
    let gauge = MemoryGauge::new(u64::MAX, None);
    let mut backlog = Backlog::default();
    let mut index = LastValues::new(KEY);
    let entry = |seq| Entry::new(seq, Arc::new(priced(Some("ACME"), "x")), true, 0);
    let newer = entry(7);
    assert!(matches!(
        index.arrive(&newer, &mut backlog, &gauge),
        Arrival::Queue(None)
    ));
    backlog.push(newer, &gauge, 1);
    // Published before it, enqueued after it (two publishers racing).
    assert!(matches!(
        index.arrive(&entry(5), &mut backlog, &gauge),
        Arrival::Superseded
    ));
    match index.arrive(&entry(9), &mut backlog, &gauge) {
        Arrival::Queue(Some(replaced)) => assert_eq!(replaced.seq, 7),
        other => panic!("{other:?}"),
    }
    assert_eq!(backlog.len(), 0);
}

#[test]
fn last_value_index_sweeps_entries_whose_message_left() {
    let gauge = MemoryGauge::new(u64::MAX, None);
    let mut backlog = Backlog::default();
    let mut index = LastValues::new(KEY);
    let total = 3 * STALE_ENTRIES_SWEEP_MIN as u64;
    for seq in 1..=total {
        let e = Entry::new(
            seq,
            Arc::new(priced(Some(&format!("S{seq}")), "x")),
            true,
            0,
        );
        assert!(matches!(
            index.arrive(&e, &mut backlog, &gauge),
            Arrival::Queue(None)
        ));
        backlog.push(e, &gauge, 1);
        // Delivered at once: nothing waits.
        backlog.pop_front(&gauge, 1);
    }
    assert!(
        index.len() <= STALE_ENTRIES_SWEEP_MIN + 2,
        "{} entries for nothing waiting",
        index.len()
    );
}

/// A durable core over the store in `dir`; `last_value` configures the
/// queue `prices` as a last-value queue.
fn durable_run(dir: &std::path::Path, last_value: bool, work: impl FnOnce(&Core)) -> Vec<String> {
    let (store, recovered) =
        rosetta_store::Store::open(rosetta_store::StoreConfig::new(dir)).expect("open");
    let store = Arc::new(store);
    let config = CoreConfig {
        queue_rules: if last_value {
            lvq_rules("prices")
        } else {
            QueueRules::default()
        },
        ..CoreConfig::default()
    };
    let core = Core::new(config, store.clone(), Arc::new(AllowAll), Some(recovered));
    let (mut s, _) = open(&core, "declare");
    s.declare_queue(QueueSpec {
        name: Some("prices".into()),
        durable: true,
        lifetime: QueueLifetime::Permanent,
        bindings_max: None,
    })
    .expect("declare");
    work(&core);
    let waiting = {
        // Browse: see what waits without taking it.
        let (mut b, e) = open(&core, "browser");
        b.consume(ConsumerSpec {
            queue: "prices".into(),
            credit: CreditMode::Window(100),
            auto_settle: false,
            options: ConsumerOptions {
                browse: true,
                ..Default::default()
            },
        })
        .expect("browse");
        let got: Vec<String> = e.deliveries().iter().map(text).collect();
        b.close(CloseKind::Clean);
        got
    };
    s.close(CloseKind::Clean);
    core.shutdown();
    drop(core);
    store.flush().expect("flush");
    waiting
}

#[test]
fn last_value_queue_delivers_only_the_newest_per_value_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let publish_all = |core: &Core| {
        let (mut p, _) = open(core, "p");
        send(&mut p, "prices", priced(Some("ACME"), "acme 1"));
        send(&mut p, "prices", priced(Some("INIT"), "init 1"));
        send(&mut p, "prices", priced(Some("ACME"), "acme 2"));
    };
    let before = durable_run(dir.path(), true, publish_all);
    assert_eq!(before, vec!["init 1", "acme 2"]);
    let after = durable_run(dir.path(), true, |_| {});
    assert_eq!(after, before, "the replaced one was acked in the journal");
}

#[test]
fn last_value_restore_keeps_the_newest_when_the_journal_holds_both() {
    // As if the broker crashed between a replacement's two appends: the
    // journal holds both messages of a value. Written by a plain queue,
    // then restored as a last-value queue.
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = durable_run(dir.path(), false, |core| {
        let (mut p, _) = open(core, "p");
        send(&mut p, "prices", priced(Some("ACME"), "acme 1"));
        send(&mut p, "prices", priced(None, "news"));
        send(&mut p, "prices", priced(Some("ACME"), "acme 2"));
    });
    assert_eq!(plain, vec!["acme 1", "news", "acme 2"]);
    let restored = durable_run(dir.path(), true, |core| {
        assert_eq!(stats(core, "prices").depth, 2);
    });
    assert_eq!(restored, vec!["news", "acme 2"]);
    // The restore acked the older one: even as a plain queue again, it is
    // gone for good.
    let again = durable_run(dir.path(), false, |_| {});
    assert_eq!(again, vec!["news", "acme 2"]);
}

fn dead_letter_core() -> Core {
    let config = CoreConfig {
        delivery_attempts_max: 2,
        ..CoreConfig::default()
    };
    Core::new(config, Arc::new(NoJournal), Arc::new(AllowAll), None)
}

fn dead_letter_fields(d: &Delivery) -> (Option<String>, Option<Value>, Option<String>) {
    let p = &d.message.properties;
    (
        p.get(DEAD_LETTER_REASON_PROPERTY).map(Value::to_text),
        p.get(DELIVERY_COUNT_PROPERTY).cloned(),
        p.get(ORIGINAL_QUEUE_PROPERTY).map(Value::to_text),
    )
}

#[test]
fn dead_letters_carry_their_reason_and_delivery_count() {
    let core = dead_letter_core();
    let (mut s, e) = open(&core, "c");
    let c = consume(&mut s, "q", 1);
    send(&mut s, "q", priced(None, "poison"));
    for _ in 0..2 {
        let d = e.deliveries().remove(0);
        s.settle(c, d.tag, Outcome::NACK, None, false)
            .expect("nack");
    }
    send(&mut s, "q", priced(None, "bad"));
    let d = e.deliveries().remove(0);
    s.settle(c, d.tag, Outcome::Reject, None, false)
        .expect("reject");
    let dlq = consume(&mut s, "DLQ", 10);
    let dead = e.deliveries();
    assert_eq!(dead.iter().map(text).collect::<Vec<_>>(), ["poison", "bad"]);
    assert_eq!(
        dead_letter_fields(&dead[0]),
        (
            Some("delivery-attempts".into()),
            Some(Value::UInt(2)),
            Some("q".into())
        )
    );
    assert_eq!(
        dead_letter_fields(&dead[1]),
        (
            Some("rejected".into()),
            Some(Value::UInt(1)),
            Some("q".into())
        )
    );
    // Rejected again out of the DLQ (into itself): one reason, the latest.
    s.settle(dlq, dead[0].tag, Outcome::Reject, None, false)
        .expect("reject from the dlq");
    let again = e.deliveries().remove(0);
    assert_eq!(text(&again), "poison");
    let reasons = again
        .message
        .properties
        .iter()
        .filter(|(n, _)| *n == DEAD_LETTER_REASON_PROPERTY)
        .count();
    assert_eq!(reasons, 1);
    assert_eq!(
        dead_letter_fields(&again),
        (
            Some("rejected".into()),
            Some(Value::UInt(1)),
            Some("DLQ".into())
        )
    );
}

#[test]
fn a_consumer_that_goes_too_often_dead_letters_for_delivery_attempts() {
    let core = dead_letter_core();
    let (mut p, _) = open(&core, "p");
    send(&mut p, "q", priced(None, "unlucky"));
    for round in 0..2 {
        let (mut s, e) = open(&core, &format!("c{round}"));
        consume(&mut s, "q", 1);
        assert_eq!(e.deliveries().len(), 1);
        s.close(CloseKind::Abnormal);
    }
    let (mut s, e) = open(&core, "dlq");
    consume(&mut s, "DLQ", 1);
    let dead = e.deliveries();
    assert_eq!(
        dead_letter_fields(&dead[0]),
        (
            Some("delivery-attempts".into()),
            Some(Value::UInt(2)),
            Some("q".into())
        )
    );
}

mod model {
    //! Against a model: publishes with random keys (or none) and random
    //! consumer steps (grant one, ack or release what is in flight), with
    //! and without paging. The model keeps, per value, the message that
    //! waits for it. A message is dead when another of its value comes to
    //! wait while it waits (a publish, or a release of a newer one), or
    //! when it is released while a newer one of its value waits: dead
    //! messages are never delivered, and every other message is acked
    //! exactly once by the end.

    use std::collections::{BTreeSet, HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Step {
        Publish(Option<u8>),
        Grant,
        Ack,
        Release,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => proptest::option::weighted(0.8, 0u8..4).prop_map(Step::Publish),
            1 => Just(Step::Grant),
            1 => Just(Step::Ack),
            1 => Just(Step::Release),
        ]
    }

    fn number(d: &Delivery) -> usize {
        text(d)
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("numbered body")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn last_value_queue_matches_its_model(
            steps in proptest::collection::vec(step(), 1..120),
            paging in any::<bool>(),
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let core = lvq_core(CoreConfig {
                memory_budget_bytes: if paging { 2_048 } else { u64::MAX },
                paging_dir: paging.then(|| dir.path().to_owned()),
                ..CoreConfig::default()
            });
            let (mut p, _) = open(&core, "p");
            let (mut c, e) = open(&core, "c");
            let id = c
                .consume(ConsumerSpec {
                    queue: "prices".into(),
                    credit: CreditMode::Explicit(0),
                    auto_settle: false,
                    options: Default::default(),
                })
                .expect("consume");
            let mut limit = 0u32;
            let mut waiting: HashMap<u8, usize> = HashMap::new();
            let mut key_of: HashMap<usize, u8> = HashMap::new();
            let mut in_flight: Vec<Delivery> = Vec::new();
            let mut published: BTreeSet<usize> = BTreeSet::new();
            let mut dead: HashSet<usize> = HashSet::new();
            let mut acked: BTreeSet<usize> = BTreeSet::new();
            let pad = "x".repeat(300);
            for (i, s) in steps.iter().enumerate() {
                match s {
                    Step::Publish(key) => {
                        let sym = key.map(|k| k.to_string());
                        let body = format!("{i} {pad}");
                        send(&mut p, "prices", priced(sym.as_deref(), &body));
                        published.insert(i);
                        if let Some(k) = key {
                            key_of.insert(i, *k);
                            if let Some(j) = waiting.insert(*k, i) {
                                dead.insert(j);
                            }
                        }
                    }
                    Step::Grant => {
                        limit += 1;
                        c.set_credit(id, limit, false).expect("credit");
                    }
                    Step::Ack => {
                        if let Some(d) = in_flight.pop() {
                            prop_assert!(acked.insert(number(&d)), "acked twice");
                            c.settle(id, d.tag, Outcome::Accept, None, false).expect("ack");
                        }
                    }
                    Step::Release => {
                        if let Some(d) = in_flight.pop() {
                            let n = number(&d);
                            if let Some(&k) = key_of.get(&n) {
                                match waiting.get(&k).copied() {
                                    Some(j) if j > n => {
                                        dead.insert(n);
                                    }
                                    Some(j) => {
                                        dead.insert(j);
                                        waiting.insert(k, n);
                                    }
                                    None => {
                                        waiting.insert(k, n);
                                    }
                                }
                            }
                            c.settle(id, d.tag, Outcome::Release, None, false).expect("release");
                        }
                    }
                }
                for d in e.deliveries() {
                    let n = number(&d);
                    prop_assert!(!dead.contains(&n), "a replaced message was delivered");
                    if let Some(k) = key_of.get(&n) {
                        if waiting.get(k) == Some(&n) {
                            waiting.remove(k);
                        }
                    }
                    in_flight.push(d);
                }
            }
            limit += 1_000;
            c.set_credit(id, limit, false).expect("credit");
            loop {
                in_flight.extend(e.deliveries());
                let Some(d) = in_flight.pop() else { break };
                prop_assert!(!dead.contains(&number(&d)), "a replaced message was delivered");
                prop_assert!(acked.insert(number(&d)), "acked twice");
                c.settle(id, d.tag, Outcome::Accept, None, false).expect("ack");
            }
            let want: BTreeSet<usize> = published.iter().filter(|n| !dead.contains(n)).copied().collect();
            prop_assert_eq!(acked, want);
            let s = stats(&core, "prices");
            prop_assert_eq!((s.depth, s.in_flight), (0, 0));
            prop_assert_eq!(s.replaced_total, dead.len() as u64);
            prop_assert_eq!(core.memory_used(), 0);
            prop_assert_eq!(core.messages_paged(), 0);
        }
    }
}
