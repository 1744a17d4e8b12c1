//! Duplicate detection (issue 16) through the session API: duplicates
//! dropped, counted and acknowledged, transactions, and the window across
//! a restart on the store.

use super::*;
use crate::{AllowAll, QueueMatch, QueueOverrides, QueueRule, QueueRules};

fn dedup_rules(mode: crate::DedupMode, ids_max: Option<usize>) -> QueueRules {
    QueueRules::new([QueueRule {
        target: QueueMatch::Name("orders".into()),
        overrides: QueueOverrides {
            dedup_window_s: Some(300),
            dedup: Some(mode),
            dedup_ids_max: ids_max,
            ..QueueOverrides::default()
        },
    }])
}

fn dedup_core(mode: crate::DedupMode, ids_max: Option<usize>) -> Core {
    Core::new(
        CoreConfig {
            queue_rules: dedup_rules(mode, ids_max),
            ..CoreConfig::default()
        },
        Arc::new(NoJournal),
        Arc::new(AllowAll),
        None,
    )
}

fn with_id(body: &str, id: MessageId) -> Message {
    Message {
        message_id: Some(id),
        durable: true,
        ..Message::text(body)
    }
}

fn with_dedup_property(body: &str, id: &str) -> Message {
    let mut m = Message::text(body);
    m.durable = true;
    m.properties.push(message::DEDUP_ID_PROPERTY, id);
    m
}

fn send(s: &mut Box<dyn Session>, address: &Address, m: Message) -> PublishReceipt {
    s.publish(
        address,
        m,
        PublishOptions {
            txn: None,
            confirm: true,
        },
    )
    .expect("publish")
}

fn drain(s: &mut Box<dyn Session>, e: &Events, name: &str) -> Vec<String> {
    let c = s
        .consume(ConsumerSpec {
            queue: name.into(),
            credit: CreditMode::Window(100),
            auto_settle: true,
            options: Default::default(),
        })
        .expect("consume");
    let got = e.deliveries().iter().map(text).collect();
    s.cancel(c).expect("cancel");
    got
}

fn duplicates(core: &Core, name: &str) -> u64 {
    core.queue_stats(name).map_or(0, |s| s.duplicates_total)
}

#[test]
fn a_duplicate_is_dropped_counted_and_acknowledged_as_routed() {
    let core = dedup_core(crate::DedupMode::Id, None);
    let (mut s, e) = open(&core, "p");
    let orders = queue("orders");
    let first = send(&mut s, &orders, with_id("a", MessageId::Ulong(1)));
    let again = send(&mut s, &orders, with_id("a again", MessageId::Ulong(1)));
    // The retry is a success for its producer: routed to the queue that
    // holds the first copy, with no error.
    assert_eq!((first.routed, again.routed), (1, 1));
    // A different id, and the same text through the property (one notion
    // for every protocol): "1" as a string is not the ulong 1.
    send(&mut s, &orders, with_id("b", MessageId::String("1".into())));
    send(&mut s, &orders, with_dedup_property("b again", "1"));
    // A send with no dedup id at all is never a duplicate.
    send(&mut s, &orders, Message::text("c"));
    send(&mut s, &orders, Message::text("c"));
    assert_eq!(drain(&mut s, &e, "orders"), vec!["a", "b", "c", "c"]);
    assert_eq!(duplicates(&core, "orders"), 2);
    assert_eq!(core.queue_stats("orders").map(|s| s.dedup_ids), Some(2));
    // A consumed message is still remembered for the window.
    send(&mut s, &orders, with_id("a late", MessageId::Ulong(1)));
    assert_eq!(drain(&mut s, &e, "orders"), Vec::<String>::new());
    assert_eq!(duplicates(&core, "orders"), 3);
    // Queues without a window take every copy.
    let other = queue("other");
    send(&mut s, &other, with_id("x", MessageId::Ulong(1)));
    send(&mut s, &other, with_id("x", MessageId::Ulong(1)));
    assert_eq!(drain(&mut s, &e, "other").len(), 2);
    assert_eq!(duplicates(&core, "other"), 0);
}

#[test]
fn content_mode_compares_bodies() {
    let core = dedup_core(crate::DedupMode::Content, None);
    let (mut s, e) = open(&core, "p");
    let orders = queue("orders");
    send(&mut s, &orders, with_id("same", MessageId::Ulong(1)));
    send(&mut s, &orders, with_id("same", MessageId::Ulong(2)));
    send(&mut s, &orders, Message::text("other"));
    assert_eq!(drain(&mut s, &e, "orders"), vec!["same", "other"]);
    assert_eq!(duplicates(&core, "orders"), 1);
}

#[test]
fn past_ids_max_the_oldest_id_is_forgotten_and_counted() {
    let core = dedup_core(crate::DedupMode::Id, Some(2));
    let (mut s, e) = open(&core, "p");
    let orders = queue("orders");
    for id in ["1", "2", "3", "1"] {
        send(&mut s, &orders, with_dedup_property(id, id));
    }
    // "1" was forgotten to make room for "3", so its retry was admitted.
    assert_eq!(drain(&mut s, &e, "orders"), vec!["1", "2", "3", "1"]);
    let stats = core.queue_stats("orders").expect("stats");
    assert_eq!(
        (
            stats.duplicates_total,
            stats.dedup_ids,
            stats.dedup_evicted_total
        ),
        (0, 2, 2)
    );
}

#[test]
fn a_duplicate_to_a_full_queue_is_still_a_success() {
    let core = Core::new(
        CoreConfig {
            queue_rules: dedup_rules(crate::DedupMode::Id, None),
            queue_depth_max: 1,
            ..CoreConfig::default()
        },
        Arc::new(NoJournal),
        Arc::new(AllowAll),
        None,
    );
    let (mut s, _e) = open(&core, "p");
    let orders = queue("orders");
    send(&mut s, &orders, with_dedup_property("a", "a"));
    assert_eq!(
        send(&mut s, &orders, with_dedup_property("a", "a")).routed,
        1
    );
    // A new id to the full queue is refused, and leaves no key behind.
    let full = s.publish(
        &orders,
        with_dedup_property("b", "b"),
        PublishOptions::default(),
    );
    assert!(matches!(full, Err(BrokerError::ResourceLimit(_))));
    assert_eq!(core.queue_stats("orders").map(|s| s.dedup_ids), Some(1));
}

#[test]
fn transactional_sends_are_checked_at_commit_and_a_rollback_leaves_no_id() {
    let core = dedup_core(crate::DedupMode::Id, None);
    let (mut s, e) = open(&core, "p");
    let orders = queue("orders");
    let staged = |s: &mut Box<dyn Session>, tx: TxnId, body: &str, id: &str| {
        s.publish(
            &orders,
            with_dedup_property(body, id),
            PublishOptions {
                txn: Some(tx),
                confirm: true,
            },
        )
        .expect("stage");
    };
    let tx = s.begin();
    staged(&mut s, tx, "rolled back", "r");
    s.rollback(tx).expect("rollback");
    let tx = s.begin();
    staged(&mut s, tx, "r", "r");
    // Two sends of one id in one transaction: the second is a duplicate.
    staged(&mut s, tx, "t", "t");
    staged(&mut s, tx, "t again", "t");
    s.commit(tx).expect("commit");
    assert_eq!(drain(&mut s, &e, "orders"), vec!["r", "t"]);
    assert_eq!(duplicates(&core, "orders"), 1);
}

#[test]
fn dead_letter_copies_are_not_taken_for_duplicates() {
    let core = Core::new(
        CoreConfig {
            queue_rules: QueueRules::new([QueueRule {
                target: QueueMatch::Name("DLQ".into()),
                overrides: QueueOverrides {
                    dedup_window_s: Some(300),
                    ..QueueOverrides::default()
                },
            }]),
            ..CoreConfig::default()
        },
        Arc::new(NoJournal),
        Arc::new(AllowAll),
        None,
    );
    let (mut s, e) = open(&core, "p");
    // Two messages with one id on a queue without a window, both rejected
    // into a dead-letter queue with one.
    for body in ["x", "y"] {
        send(&mut s, &queue("jobs"), with_dedup_property(body, "same"));
    }
    let c = s
        .consume(ConsumerSpec {
            queue: "jobs".into(),
            credit: CreditMode::Window(10),
            auto_settle: false,
            options: Default::default(),
        })
        .expect("consume");
    for d in e.deliveries() {
        s.settle(c, d.tag, Outcome::Reject, None, false)
            .expect("reject");
    }
    assert_eq!(core.queue_stats("DLQ").map(|s| s.depth), Some(2));
}

fn store_core(dir: &std::path::Path) -> (Core, Arc<rosetta_store::Store>) {
    let (store, recovered) =
        rosetta_store::Store::open(rosetta_store::StoreConfig::new(dir)).expect("open");
    let store = Arc::new(store);
    let config = CoreConfig {
        queue_rules: dedup_rules(crate::DedupMode::Id, None),
        ..CoreConfig::default()
    };
    let core = Core::new(config, store.clone(), Arc::new(AllowAll), Some(recovered));
    (core, store)
}

fn stop(core: Core, store: Arc<rosetta_store::Store>) {
    core.shutdown();
    drop(core);
    store.flush().expect("flush");
}

#[test]
fn the_window_survives_a_restart_even_for_consumed_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (core, store) = store_core(dir.path());
        let (mut s, e) = open(&core, "p");
        send(&mut s, &queue("orders"), with_dedup_property("a", "a"));
        send(
            &mut s,
            &queue("orders"),
            with_id("b", MessageId::Uuid([7; 16])),
        );
        // "a" is consumed and acknowledged before the restart; "b" waits.
        let c = s
            .consume(ConsumerSpec {
                queue: "orders".into(),
                credit: CreditMode::Explicit(1),
                auto_settle: true,
                options: Default::default(),
            })
            .expect("consume");
        assert_eq!(
            e.deliveries().iter().map(text).collect::<Vec<_>>(),
            vec!["a"]
        );
        s.cancel(c).expect("cancel");
        s.close(CloseKind::Clean);
        stop(core, store);
    }
    let (core, store) = store_core(dir.path());
    assert_eq!(core.queue_stats("orders").map(|s| s.dedup_ids), Some(2));
    let (mut s, e) = open(&core, "p");
    let again = send(
        &mut s,
        &queue("orders"),
        with_dedup_property("a again", "a"),
    );
    assert_eq!(again.routed, 1);
    send(
        &mut s,
        &queue("orders"),
        with_id("b again", MessageId::Uuid([7; 16])),
    );
    send(&mut s, &queue("orders"), with_dedup_property("c", "c"));
    assert_eq!(drain(&mut s, &e, "orders"), vec!["b", "c"]);
    assert_eq!(duplicates(&core, "orders"), 2);
    s.close(CloseKind::Clean);
    stop(core, store);
}

#[test]
fn a_restart_without_the_window_forgets_the_ids_for_good() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (core, store) = store_core(dir.path());
        let (mut s, _e) = open(&core, "p");
        send(&mut s, &queue("orders"), with_dedup_property("a", "a"));
        s.close(CloseKind::Clean);
        stop(core, store);
    }
    // Restarted once without the setting: the keys are tombstoned.
    {
        let (store, recovered) =
            rosetta_store::Store::open(rosetta_store::StoreConfig::new(dir.path())).expect("open");
        let store = Arc::new(store);
        let core = Core::new(
            CoreConfig::default(),
            store.clone(),
            Arc::new(AllowAll),
            Some(recovered),
        );
        stop(core, store);
    }
    let (store, recovered) =
        rosetta_store::Store::open(rosetta_store::StoreConfig::new(dir.path())).expect("open");
    assert!(
        recovered
            .state
            .iter()
            .all(|(k, _)| !k.starts_with(crate::dedup::DEDUP_STATE_PREFIX)),
        "{:?}",
        recovered.state
    );
    drop(store);
}

/// A journal that completes nothing until told: appends wait in order.
#[derive(Default)]
struct HeldJournal {
    held: parking_lot::Mutex<Vec<Option<rosetta_store::Completion>>>,
}

impl HeldJournal {
    fn complete(&self, append: usize, result: Result<(), rosetta_store::StoreError>) {
        let done = self.held.lock()[append].take().expect("held completion");
        done(result);
    }

    fn appends(&self) -> usize {
        self.held.lock().len()
    }
}

impl crate::Journal for HeldJournal {
    fn append(
        &self,
        _records: Vec<rosetta_store::Record>,
        done: Option<rosetta_store::Completion>,
    ) {
        self.held.lock().push(done);
    }
}

fn committed(events: &[SessionEvent], ticket: Ticket) -> Option<Result<(), BrokerError>> {
    events.iter().find_map(|e| match e {
        SessionEvent::Committed { ticket: t, result } if *t == ticket => Some(result.clone()),
        _ => None,
    })
}

#[test]
fn a_duplicate_is_acknowledged_only_once_its_first_copy_is_durable() {
    let journal = Arc::new(HeldJournal::default());
    let core = Core::new(
        CoreConfig {
            queue_rules: dedup_rules(crate::DedupMode::Id, None),
            ..CoreConfig::default()
        },
        journal.clone(),
        Arc::new(AllowAll),
        None,
    );
    let (mut s, e) = open(&core, "p");
    let orders = queue("orders");
    let first = send(&mut s, &orders, with_dedup_property("a", "a"));
    let retry = send(&mut s, &orders, with_dedup_property("a", "a"));
    let (Some(first), Some(retry)) = (first.pending, retry.pending) else {
        panic!("both sends wait for the journal: {first:?} {retry:?}");
    };
    let appends = journal.appends();
    let events = e.take();
    assert_eq!(
        committed(&events, retry),
        None,
        "not before the first copy is durable"
    );
    // The first copy's append completes: both are acknowledged with its
    // result. The retry appended nothing of its own.
    journal.complete(appends - 1, Ok(()));
    let events = e.take();
    assert_eq!(committed(&events, first), Some(Ok(())));
    assert_eq!(committed(&events, retry), Some(Ok(())));

    // A first copy whose append fails fails its waiting retries too.
    let first = send(&mut s, &orders, with_dedup_property("b", "b")).pending;
    let retry = send(&mut s, &orders, with_dedup_property("b", "b")).pending;
    journal.complete(
        journal.appends() - 1,
        Err(rosetta_store::StoreError::Closed),
    );
    let events = e.take();
    assert!(matches!(
        committed(&events, first.expect("ticket")),
        Some(Err(_))
    ));
    assert!(matches!(
        committed(&events, retry.expect("ticket")),
        Some(Err(_))
    ));
    // Once durable, a retry is acknowledged at once: nothing to wait for.
    let late = send(&mut s, &orders, with_dedup_property("a", "a"));
    assert_eq!(late.pending, None);
}

#[test]
fn the_window_runs_on_the_cores_clock() {
    let (core, clock) = manual_core(CoreConfig {
        queue_rules: dedup_rules(crate::DedupMode::Id, None),
        ..CoreConfig::default()
    });
    let (mut s, e) = open(&core, "p");
    let orders = queue("orders");
    send(&mut s, &orders, with_id("first", MessageId::Ulong(7)));
    clock.advance(299_999);
    send(&mut s, &orders, with_id("within", MessageId::Ulong(7)));
    assert_eq!(duplicates(&core, "orders"), 1, "inside the 300 s window");
    clock.advance(1);
    send(&mut s, &orders, with_id("after", MessageId::Ulong(7)));
    assert_eq!(duplicates(&core, "orders"), 1, "the window has passed");
    assert_eq!(drain(&mut s, &e, "orders"), vec!["first", "after"]);
}

fn topic_dedup_config(filter: &str) -> CoreConfig {
    CoreConfig {
        topic_dedup: vec![crate::TopicDedupRule {
            filter: filter.into(),
            window_s: 300,
            mode: crate::DedupMode::Id,
            ids_max: 1_000,
        }],
        ..CoreConfig::default()
    }
}

fn topic_duplicates(core: &Core) -> u64 {
    core.topic_dedup_stats()
        .iter()
        .map(|w| w.duplicates_total)
        .sum()
}

#[test]
fn a_topic_window_drops_a_retry_before_it_fans_out() {
    let core = Core::new(
        topic_dedup_config("orders/#"),
        Arc::new(NoJournal),
        Arc::new(AllowAll),
        None,
    );
    let (mut sub_a, events_a) = open(&core, "a");
    let (mut sub_b, events_b) = open(&core, "b");
    subscribe(&mut sub_a, "orders/#", 100);
    subscribe(&mut sub_b, "orders/eu", 100);
    let (mut p, _) = open(&core, "p");
    let eu = topic("orders/eu");
    let first = send(&mut p, &eu, with_dedup_property("one", "1"));
    let again = send(&mut p, &eu, with_dedup_property("one again", "1"));
    // The retry counts as routed to both subscribers, who hold the first.
    assert_eq!((first.routed, again.routed), (2, 2));
    // The same id on another topic of the entry is another send.
    send(&mut p, &topic("orders/us"), with_dedup_property("us", "1"));
    assert_eq!(
        events_a.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["one", "us"]
    );
    assert_eq!(
        events_b.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["one"]
    );
    // A subscriber that joins later does not get the retry either.
    let (mut late, events_late) = open(&core, "late");
    subscribe(&mut late, "orders/eu", 100);
    send(&mut p, &eu, with_dedup_property("one, later", "1"));
    assert!(events_late.deliveries().is_empty());
    assert_eq!(topic_duplicates(&core), 2);
    // Topics no entry matches take every copy.
    subscribe(&mut late, "prices", 100);
    send(&mut p, &topic("prices"), with_dedup_property("p", "1"));
    send(&mut p, &topic("prices"), with_dedup_property("p", "1"));
    assert_eq!(events_late.deliveries().len(), 2);
}

fn topic_store_core(dir: &std::path::Path) -> (Core, Arc<rosetta_store::Store>) {
    let (store, recovered) =
        rosetta_store::Store::open(rosetta_store::StoreConfig::new(dir)).expect("open");
    let store = Arc::new(store);
    let core = Core::new(
        topic_dedup_config("orders/#"),
        store.clone(),
        Arc::new(AllowAll),
        Some(recovered),
    );
    (core, store)
}

#[test]
fn a_topic_window_survives_a_restart_though_no_durable_queue_took_the_send() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (core, store) = topic_store_core(dir.path());
        let (mut p, _) = open(&core, "p");
        // No subscriber at all: the key alone is journaled.
        send(&mut p, &topic("orders/eu"), with_dedup_property("a", "a"));
        let mut transient = with_dedup_property("b", "b");
        transient.durable = false;
        send(&mut p, &topic("orders/eu"), transient);
        p.close(CloseKind::Clean);
        stop(core, store);
    }
    let (core, store) = topic_store_core(dir.path());
    let (mut sub, events) = open(&core, "s");
    subscribe(&mut sub, "orders/#", 100);
    let (mut p, _) = open(&core, "p");
    send(
        &mut p,
        &topic("orders/eu"),
        with_dedup_property("a again", "a"),
    );
    // A non-durable send's id is not journaled, so its retry passes.
    send(
        &mut p,
        &topic("orders/eu"),
        with_dedup_property("b again", "b"),
    );
    assert_eq!(
        events.deliveries().iter().map(text).collect::<Vec<_>>(),
        vec!["b again"]
    );
    assert_eq!(topic_duplicates(&core), 1);
    // Recovered keys stay out of the client state the adapters read.
    assert!(core
        .inner
        .client_state
        .lock()
        .keys()
        .all(|k| !k.starts_with(crate::dedup::TOPIC_DEDUP_STATE_PREFIX)));
    p.close(CloseKind::Clean);
    sub.close(CloseKind::Clean);
    stop(core, store);
}
