//! Tests of `[[queues]]` rules: the pattern matcher, precedence and
//! merging, and (through the public session API) that queues created,
//! auto-created and recovered get their settings and dead-letter by them.

use std::sync::Arc;

use rosetta_neutral::*;

use super::*;
use crate::tests::{open, text};
use crate::{AllowAll, Core, CoreConfig, NoJournal};

fn pattern(text: &str) -> QueuePattern {
    QueuePattern::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn by_pattern(text: &str, overrides: QueueOverrides) -> QueueRule {
    QueueRule {
        target: QueueMatch::Pattern(pattern(text)),
        overrides,
    }
}

fn by_name(name: &str, overrides: QueueOverrides) -> QueueRule {
    QueueRule {
        target: QueueMatch::Name(name.into()),
        overrides,
    }
}

fn attempts(max: u32) -> QueueOverrides {
    QueueOverrides {
        delivery_attempts_max: Some(max),
        ..QueueOverrides::default()
    }
}

#[test]
fn queue_patterns_match_whole_dot_separated_words() {
    // (pattern, name, matches)
    let table: &[(&str, &str, bool)] = &[
        ("orders.*", "orders.eu", true),
        ("orders.*", "orders", false),
        ("orders.*", "orders.eu.paris", false),
        ("orders.*", "ordersx.eu", false),
        ("orders.#", "orders", true),
        ("orders.#", "orders.eu", true),
        ("orders.#", "orders.eu.paris", true),
        ("orders.#", "order.eu", false),
        ("*.eu", "orders.eu", true),
        ("*.eu", "eu", false),
        ("#", "anything.at.all", true),
        ("#", "x", true),
        ("a.#.z", "a.z", true),
        ("a.#.z", "a.b.c.z", true),
        ("a.#.z", "a.b.c", false),
        ("#.z.#", "a.z.b", true),
        ("*.*", "a.b", true),
        ("*.*", "a", false),
        ("a.*.#", "a.b.c.d", true),
        ("a.*.#", "a", false),
        // Names are opaque past the dots: slashes are part of a word.
        ("*", "orders/eu", true),
        ("orders/eu.*", "orders/eu.x", true),
        ("orders.*", "orders/eu", false),
        // A leading wildcard leaves the broker's internal `$` queues alone.
        ("#", "$mqtt/client-1", false),
        ("*.x", "$share.x", false),
        ("$durable/app/orders.*", "$durable/app/orders.eu", true),
    ];
    for (p, name, want) in table {
        assert_eq!(pattern(p).matches(name), *want, "{p} ~ {name}");
    }
}

#[test]
fn queue_patterns_refuse_what_is_not_a_pattern() {
    let words = vec!["w"; QUEUE_PATTERN_WORDS_MAX + 1].join(".") + ".#";
    let table: &[(&str, QueuePatternError)] = &[
        ("", QueuePatternError::Empty),
        (
            "orders..#",
            QueuePatternError::EmptyWord("orders..#".into()),
        ),
        (".#", QueuePatternError::EmptyWord(".#".into())),
        ("orders.", QueuePatternError::EmptyWord("orders.".into())),
        ("ord*", QueuePatternError::PartialWildcard("ord*".into())),
        ("orders.#x", QueuePatternError::PartialWildcard("#x".into())),
        ("orders", QueuePatternError::NoWildcard("orders".into())),
        ("a\0.#", QueuePatternError::Nul),
        (&words, QueuePatternError::TooManyWords),
    ];
    for (text, want) in table {
        assert_eq!(QueuePattern::parse(text).as_ref(), Err(want), "{text:?}");
    }
    let longest = vec!["*"; QUEUE_PATTERN_WORDS_MAX].join(".");
    assert!(QueuePattern::parse(&longest).is_ok());
}

#[test]
fn queue_settings_merge_from_the_least_to_the_most_specific() {
    let entries = vec![
        by_name(
            "orders.eu",
            QueueOverrides {
                exclusive: Some(false),
                ..QueueOverrides::default()
            },
        ),
        by_pattern("orders.*", attempts(3)),
        by_pattern(
            "orders.#",
            QueueOverrides {
                exclusive: Some(true),
                dead_letter_address: Some("orders.dead".into()),
                groups_max: Some(7),
                ..QueueOverrides::default()
            },
        ),
        by_pattern("#", attempts(5)),
    ];
    let check = |rules: &QueueRules| {
        let eu = rules.resolve("orders.eu");
        assert_eq!(
            eu,
            QueueSettings {
                exclusive: false,
                dead_letter_address: Some("orders.dead".into()),
                delivery_attempts_max: Some(3),
                groups_max: 7,
                ..QueueSettings::default()
            },
            "the name overrides only `exclusive`; `orders.*` beats `orders.#` and `#`"
        );
        assert!(rules.resolve("orders.us").exclusive);
        assert_eq!(rules.resolve("orders.us").delivery_attempts_max, Some(3));
        assert_eq!(
            rules.resolve("orders.us.x").delivery_attempts_max,
            Some(5),
            "`orders.*` does not match; `orders.#` sets no attempts, `#` does"
        );
        assert_eq!(
            rules.resolve("other"),
            QueueSettings {
                delivery_attempts_max: Some(5),
                ..QueueSettings::default()
            }
        );
        assert_eq!(rules.resolve("$mqtt/c"), QueueSettings::default());
    };
    check(&QueueRules::new(entries.clone()));
    // Specificity, not file order, decides between different ranks.
    check(&QueueRules::new(entries.into_iter().rev()));
    assert_eq!(QueueRules::default().resolve("x"), QueueSettings::default());
}

#[test]
fn queue_patterns_rank_literal_over_star_over_end_over_hash() {
    // Most specific last; each matches `a.b`.
    let ranked = ["#", "#.b", "*.#", "*.b", "a.#", "a.*.#", "a.*"];
    for (i, p) in ranked.iter().enumerate() {
        assert!(pattern(p).matches("a.b"), "{p}");
        for q in &ranked[i + 1..] {
            assert_eq!(
                pattern(p).specificity(&pattern(q)),
                Ordering::Less,
                "{p} < {q}"
            );
        }
    }
    // Equal ranks: the later entry wins.
    let rules = |first: u32, second: u32| {
        QueueRules::new([
            by_pattern("#.a.#", attempts(first)),
            by_pattern("#.b.#", attempts(second)),
        ])
    };
    assert_eq!(rules(1, 2).resolve("a.b").delivery_attempts_max, Some(2));
    assert_eq!(rules(2, 1).resolve("a.b").delivery_attempts_max, Some(1));
}

fn dead_letter_core() -> Core {
    let config = CoreConfig {
        delivery_attempts_max: 10,
        queue_rules: QueueRules::new([by_name(
            "orders",
            QueueOverrides {
                dead_letter_address: Some("orders.dead".into()),
                delivery_attempts_max: Some(2),
                ..QueueOverrides::default()
            },
        )]),
        ..CoreConfig::default()
    };
    Core::new(config, Arc::new(NoJournal), Arc::new(AllowAll), None)
}

fn consume(s: &mut Box<dyn Session>, queue: &str) -> ConsumerId {
    s.consume(ConsumerSpec {
        queue: queue.into(),
        credit: CreditMode::Window(1),
        auto_settle: false,
        options: Default::default(),
    })
    .expect("consume")
}

fn depth(core: &Core, queue: &str) -> Option<u64> {
    core.queue_stats(queue).map(|s| s.depth)
}

#[test]
fn queue_settings_dead_letter_by_the_queues_own_address_and_attempts() {
    let core = dead_letter_core();
    let (mut s, e) = open(&core, "c");
    let orders = consume(&mut s, "orders");
    let other = consume(&mut s, "other");
    for q in ["orders", "other"] {
        s.publish(
            &Address::Queue(q.into()),
            Message::text(q),
            PublishOptions::default(),
        )
        .expect("publish");
    }
    // Two failed attempts each: `orders` gives up after its own 2, `other`
    // keeps the broker's 10.
    for _ in 0..2 {
        for d in e.deliveries() {
            s.settle(d.consumer, d.tag, Outcome::NACK, None, false)
                .expect("nack");
        }
    }
    assert_eq!(depth(&core, "orders.dead"), Some(1));
    let redelivered = e.deliveries();
    assert_eq!(redelivered.len(), 1);
    assert_eq!(
        (redelivered[0].consumer, text(&redelivered[0])),
        (other, "other".into())
    );
    assert_eq!(depth(&core, "DLQ"), None, "nothing went to the broker's");
    // A reject goes to the queue's own address at once, and `other`'s to
    // the broker's.
    s.settle(other, redelivered[0].tag, Outcome::Reject, None, false)
        .expect("reject");
    assert_eq!(depth(&core, "DLQ"), Some(1));
    s.publish(
        &Address::Queue("orders".into()),
        Message::text("rejected"),
        PublishOptions::default(),
    )
    .expect("publish");
    let d = e.deliveries().remove(0);
    assert_eq!(d.consumer, orders);
    s.settle(orders, d.tag, Outcome::Reject, None, false)
        .expect("reject");
    assert_eq!(depth(&core, "orders.dead"), Some(2));
    let dead = consume(&mut s, "orders.dead");
    let got = e.deliveries().remove(0);
    assert_eq!(got.consumer, dead);
    assert_eq!(text(&got), "orders");
    assert_eq!(
        got.message.properties.get("x-original-queue"),
        Some(&Value::from("orders"))
    );
    assert_eq!(
        got.message.properties.get("x-delivery-count"),
        Some(&Value::from("2"))
    );
}

#[test]
fn queue_settings_count_a_consumer_that_goes_as_a_failed_attempt() {
    let core = dead_letter_core();
    let (mut p, _) = open(&core, "p");
    p.publish(
        &Address::Queue("orders".into()),
        Message::text("abandoned"),
        PublishOptions::default(),
    )
    .expect("publish");
    for attempt in 0..2 {
        let (mut s, e) = open(&core, "c");
        consume(&mut s, "orders");
        let d = e.deliveries();
        assert_eq!(d.len(), 1, "attempt {attempt}");
        s.close(CloseKind::Abnormal);
    }
    assert_eq!(depth(&core, "orders"), Some(0));
    assert_eq!(depth(&core, "orders.dead"), Some(1));
}

#[test]
fn queue_settings_are_resolved_when_a_queue_is_declared_or_auto_created() {
    let config = CoreConfig {
        queues_max: 2,
        queue_rules: QueueRules::new([
            by_pattern(
                "jobs.*",
                QueueOverrides {
                    exclusive: Some(true),
                    dead_letter_address: Some("jobs.dead".into()),
                    ..QueueOverrides::default()
                },
            ),
            by_name("jobs.b", attempts(4)),
        ]),
        ..CoreConfig::default()
    };
    let core = Core::new(config, Arc::new(NoJournal), Arc::new(AllowAll), None);
    let (mut s, e) = open(&core, "c");
    s.declare_queue(QueueSpec {
        name: Some("jobs.a".into()),
        durable: true,
        lifetime: QueueLifetime::Permanent,
        bindings_max: None,
    })
    .expect("declare");
    s.publish(
        &Address::Queue("jobs.b".into()),
        Message::text("m"),
        PublishOptions::default(),
    )
    .expect("auto-created");
    let a = core.queue_settings("jobs.a").expect("jobs.a");
    assert!(a.exclusive);
    assert_eq!(a.dead_letter_address.as_deref(), Some("jobs.dead"));
    assert_eq!(
        a.delivery_attempts_max,
        Some(crate::DELIVERY_ATTEMPTS_MAX_DEFAULT),
        "the broker's, filled in"
    );
    let b = core.queue_settings("jobs.b").expect("jobs.b");
    assert_eq!((b.exclusive, b.delivery_attempts_max), (true, Some(4)));
    // Both queues are there (the cap): a queue's own dead-letter address
    // is still created, as the broker's is.
    let c = consume(&mut s, "jobs.b");
    let d = e.deliveries().remove(0);
    s.settle(c, d.tag, Outcome::Reject, None, false)
        .expect("reject");
    assert_eq!(depth(&core, "jobs.dead"), Some(1));
    let settings: Vec<String> = core
        .all_queue_settings()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(settings.len(), 3, "{settings:?}");
}

#[test]
fn queue_settings_are_resolved_again_when_queues_are_recovered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = |max: u32| {
        QueueRules::new([by_pattern(
            "kept.*",
            QueueOverrides {
                exclusive: Some(true),
                delivery_attempts_max: Some(max),
                ..QueueOverrides::default()
            },
        )])
    };
    let run = |max: u32, declare: bool| -> Option<QueueSettings> {
        let store_config = rosetta_store::StoreConfig::new(dir.path());
        let (store, recovered) = rosetta_store::Store::open(store_config).expect("open");
        let store = Arc::new(store);
        let config = CoreConfig {
            queue_rules: rules(max),
            ..CoreConfig::default()
        };
        let core = Core::new(config, store.clone(), Arc::new(AllowAll), Some(recovered));
        if declare {
            let (mut s, _) = open(&core, "c");
            s.declare_queue(QueueSpec {
                name: Some("kept.q".into()),
                durable: true,
                lifetime: QueueLifetime::Permanent,
                bindings_max: None,
            })
            .expect("declare");
            s.close(CloseKind::Clean);
        }
        let settings = core.queue_settings("kept.q");
        core.shutdown();
        drop(core);
        store.flush().expect("flush");
        settings
    };
    let declared = run(3, true).expect("declared");
    assert_eq!(
        run(3, false),
        Some(declared.clone()),
        "same configuration, same settings"
    );
    assert!(declared.exclusive);
    let changed = run(6, false).expect("recovered");
    assert_eq!(
        changed.delivery_attempts_max,
        Some(6),
        "a changed configuration applies at the restart"
    );
}
