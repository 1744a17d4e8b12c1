//! Lease delivery (visibility timeout, issue 16) through the session API on
//! a manual clock: no real sleeps. Time moves only by
//! `ManualClock::advance`; `Core::run_timers` then serves due leases, as
//! the housekeeping thread does on its own.

use super::*;
use crate::{ManualClock, QueueOverrides};

/// A core whose queue `q` leases deliveries for `lease_ms`, with
/// `overrides` on top.
fn leasing_core(lease_ms: u32, overrides: QueueOverrides) -> (Core, Arc<ManualClock>) {
    manual_core(config_for_queue(
        "q",
        QueueOverrides {
            visibility_timeout_ms: Some(lease_ms),
            ..overrides
        },
    ))
}

fn consume_with(
    s: &mut Box<dyn Session>,
    q: &str,
    window: u32,
    lease_ms: Option<u32>,
) -> ConsumerId {
    s.consume(ConsumerSpec {
        queue: q.into(),
        credit: CreditMode::Window(window),
        auto_settle: false,
        options: ConsumerOptions {
            visibility_timeout_ms: lease_ms,
            ..ConsumerOptions::default()
        },
    })
    .expect("consume")
}

fn send(s: &mut Box<dyn Session>, body: &str) {
    publish(s, queue("q"), body);
}

fn advance(core: &Core, clock: &ManualClock, ms: u64) {
    clock.advance(ms);
    core.run_timers();
}

/// Deliveries and expired leases, in the order the session got them.
fn split(events: Vec<SessionEvent>) -> (Vec<Delivery>, Vec<DeliveryTag>) {
    let mut deliveries = Vec::new();
    let mut expired = Vec::new();
    for e in events {
        match e {
            SessionEvent::Delivery(d) => deliveries.push(d),
            SessionEvent::LeaseExpired { tag, .. } => expired.push(tag),
            _ => {}
        }
    }
    (deliveries, expired)
}

fn stats(core: &Core) -> crate::QueueStats {
    core.queue_stats("q").expect("queue exists")
}

#[test]
fn a_lease_expires_while_the_consumer_stays_and_the_message_comes_back_counted() {
    let (core, clock) = leasing_core(1_000, QueueOverrides::default());
    let (mut s, e) = open(&core, "c");
    let _c = consume_with(&mut s, "q", 1, None);
    send(&mut s, "m");
    let (first, _) = split(e.take());
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].delivery_count, 0);

    advance(&core, &clock, 999);
    assert!(e.take().is_empty(), "nothing before the deadline");
    advance(&core, &clock, 1);
    let (again, expired) = split(e.take());
    assert_eq!(expired, vec![first[0].tag], "the consumer is told");
    assert_eq!(
        again.len(),
        1,
        "its window credit came back: redelivered to it"
    );
    assert_eq!(text(&again[0]), "m");
    assert_eq!(
        again[0].delivery_count, 1,
        "the expiry counts as an attempt"
    );
    assert!(again[0].redelivered);
    assert_ne!(again[0].tag, first[0].tag, "a new delivery, a new tag");
    assert_eq!(stats(&core).in_flight, 1);
}

#[test]
fn an_expired_lease_goes_to_another_consumer_when_its_own_is_full() {
    let (core, clock) = leasing_core(1_000, QueueOverrides::default());
    let (mut s1, e1) = open(&core, "c1");
    let (mut s2, e2) = open(&core, "c2");
    let _a = consume_with(&mut s1, "q", 1, None);
    send(&mut s1, "m1");
    let _b = consume_with(&mut s2, "q", 1, None);
    send(&mut s1, "m2");
    assert_eq!(split(e1.take()).0.len(), 1);
    let (to_b, _) = split(e2.take());
    assert_eq!(text(&to_b[0]), "m2");
    s2.settle(to_b[0].consumer, to_b[0].tag, Outcome::Accept, None, false)
        .expect("accept");
    // c2 settled and has room; c1's lease runs out: either may get it.
    advance(&core, &clock, 1_000);
    let (again1, expired1) = split(e1.take());
    let (again2, _) = split(e2.take());
    assert_eq!(expired1.len(), 1);
    let all: Vec<String> = again1.iter().chain(&again2).map(text).collect();
    assert_eq!(all, vec!["m1"], "offered again, once");
}

#[test]
fn a_late_settlement_is_refused_and_never_applied_to_the_redelivered_copy() {
    let (core, clock) = leasing_core(1_000, QueueOverrides::default());
    let (mut s, e) = open(&core, "c");
    let c = consume_with(&mut s, "q", 1, None);
    send(&mut s, "m");
    let (first, _) = split(e.take());
    advance(&core, &clock, 1_000);
    let (copy, _) = split(e.take());
    assert_eq!(copy.len(), 1);

    let late = s.settle(c, first[0].tag, Outcome::Accept, None, false);
    assert_eq!(late, Err(BrokerError::LeaseExpired));
    assert_eq!(stats(&core).in_flight, 1, "the copy is still in flight");
    assert_eq!(stats(&core).acked_total, 0);
    assert_eq!(
        s.renew_lease(c, first[0].tag),
        Err(BrokerError::Unknown("delivery")),
        "a late settlement is answered once"
    );
    s.settle(c, copy[0].tag, Outcome::Accept, None, false)
        .expect("the copy settles");
    assert_eq!(stats(&core).in_flight, 0);
    assert_eq!(stats(&core).acked_total, 1);
}

#[test]
fn a_late_settlement_in_a_transaction_is_refused() {
    let (core, clock) = leasing_core(1_000, QueueOverrides::default());
    let (mut s, e) = open(&core, "c");
    let c = consume_with(&mut s, "q", 1, None);
    send(&mut s, "m");
    let (first, _) = split(e.take());
    advance(&core, &clock, 1_000);
    let txn = s.begin();
    assert_eq!(
        s.settle(c, first[0].tag, Outcome::Accept, Some(txn), false),
        Err(BrokerError::LeaseExpired)
    );
}

#[test]
fn renewal_keeps_a_delivery_past_its_first_deadline() {
    let (core, clock) = leasing_core(1_000, QueueOverrides::default());
    let (mut s, e) = open(&core, "c");
    let c = consume_with(&mut s, "q", 1, None);
    send(&mut s, "m");
    let (first, _) = split(e.take());
    advance(&core, &clock, 900);
    s.renew_lease(c, first[0].tag).expect("renew");
    advance(&core, &clock, 900);
    assert!(e.take().is_empty(), "renewed: 1800 ms in, still leased");
    s.renew_lease(c, first[0].tag).expect("renew again");
    advance(&core, &clock, 999);
    assert!(e.take().is_empty());
    advance(&core, &clock, 1);
    let (_, expired) = split(e.take());
    assert_eq!(expired, vec![first[0].tag], "unrenewed, it runs out");
    assert_eq!(
        s.renew_lease(c, first[0].tag),
        Err(BrokerError::LeaseExpired)
    );
}

#[test]
fn a_consumers_own_timeout_overrides_the_queues_and_unleased_queues_hold() {
    let (core, clock) = leasing_core(10_000, QueueOverrides::default());
    let (mut s, e) = open(&core, "c");
    let _c = consume_with(&mut s, "q", 1, Some(100));
    send(&mut s, "m");
    split(e.take());
    advance(&core, &clock, 100);
    assert_eq!(split(e.take()).1.len(), 1, "the consumer's 100 ms won");

    // A queue without a lease holds a delivery as long as it likes.
    let (mut s2, e2) = open(&core, "c2");
    let _d = consume_with(&mut s2, "other", 1, None);
    publish(&mut s2, queue("other"), "x");
    assert_eq!(split(e2.take()).0.len(), 1);
    advance(&core, &clock, 24 * 60 * 60 * 1000);
    assert!(e2.take().is_empty());
    assert_eq!(core.queue_stats("other").expect("q").in_flight, 1);
}

#[test]
fn a_timeout_past_the_maximum_is_refused() {
    let (core, _clock) = leasing_core(1_000, QueueOverrides::default());
    let (mut s, _e) = open(&core, "c");
    for bad in [0, crate::VISIBILITY_TIMEOUT_MS_MAX + 1] {
        let err = s
            .consume(ConsumerSpec {
                queue: "q".into(),
                credit: CreditMode::Window(1),
                auto_settle: false,
                options: ConsumerOptions {
                    visibility_timeout_ms: Some(bad),
                    ..ConsumerOptions::default()
                },
            })
            .expect_err("out of range");
        assert!(matches!(err, BrokerError::ResourceLimit(_)), "{err}");
    }
}

#[test]
fn expiries_count_attempts_and_dead_letter_at_the_maximum() {
    let (core, clock) = leasing_core(
        1_000,
        QueueOverrides {
            delivery_attempts_max: Some(2),
            ..QueueOverrides::default()
        },
    );
    let (mut s, e) = open(&core, "c");
    let _c = consume_with(&mut s, "q", 1, None);
    send(&mut s, "m");
    assert_eq!(split(e.take()).0.len(), 1);
    advance(&core, &clock, 1_000);
    let (again, _) = split(e.take());
    assert_eq!(again[0].delivery_count, 1);
    advance(&core, &clock, 1_000);
    let (none, expired) = split(e.take());
    assert_eq!(expired.len(), 1);
    assert!(
        none.is_empty(),
        "second expiry: dead-lettered, not redelivered"
    );
    let st = stats(&core);
    assert_eq!((st.in_flight, st.depth, st.dead_lettered_total), (0, 0, 1));
    let dead = core
        .queue_stats(crate::DEAD_LETTER_ADDRESS_DEFAULT)
        .expect("dead-letter queue");
    assert_eq!(dead.depth, 1);
}

#[test]
fn an_expired_lease_waits_the_redelivery_delay() {
    let (core, clock) = leasing_core(
        1_000,
        QueueOverrides {
            redelivery_delay_ms: Some(500),
            ..QueueOverrides::default()
        },
    );
    let (mut s, e) = open(&core, "c");
    let _c = consume_with(&mut s, "q", 1, None);
    send(&mut s, "m");
    split(e.take());
    advance(&core, &clock, 1_000);
    let (none, expired) = split(e.take());
    assert_eq!((none.len(), expired.len()), (0, 1));
    assert_eq!(stats(&core).scheduled, 1);
    advance(&core, &clock, 500);
    assert_eq!(split(e.take()).0.len(), 1, "after the delay");
}

#[test]
fn a_restart_brings_a_leased_message_back_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0_MS));
    let config = || {
        config_for_queue(
            "q",
            QueueOverrides {
                visibility_timeout_ms: Some(1_000),
                ..QueueOverrides::default()
            },
        )
    };
    let start = |clock: &Arc<ManualClock>| core_on_store(dir.path(), config(), clock);
    {
        let (core, store) = start(&clock);
        let (mut s, e) = open(&core, "c");
        let mut m = Message::text("m");
        m.durable = true;
        s.publish(&queue("q"), m, PublishOptions::default())
            .expect("publish");
        let _c = consume_with(&mut s, "q", 1, None);
        assert_eq!(split(e.take()).0.len(), 1, "leased, then the broker stops");
        store.flush().expect("flush");
        // The broker stops with the delivery leased (the session goes
        // with it); a lease does not outlive the process.
        drop(s);
        store.flush().expect("flush");
    }
    clock.advance(5_000);
    let (core, _store) = start(&clock);
    assert_eq!(stats(&core).depth, 1, "the in-flight message came back");
    let (mut s, e) = open(&core, "c");
    let _c = consume_with(&mut s, "q", 1, None);
    assert_eq!(split(e.take()).0.len(), 1);
}

fn send_in_group(s: &mut Box<dyn Session>, group: &str, body: &str) {
    let mut m = Message::text(body);
    m.group_id = Some(group.into());
    s.publish(&queue("q"), m, PublishOptions::default())
        .expect("publish");
}

#[test]
fn a_groups_next_message_waits_while_one_is_leased_so_order_holds_across_expiry() {
    let (core, clock) = leasing_core(1_000, QueueOverrides::default());
    let (mut s, e) = open(&core, "c");
    let c = consume_with(&mut s, "q", 10, None);
    for body in ["a1", "a2", "a3"] {
        send_in_group(&mut s, "a", body);
    }
    send_in_group(&mut s, "b", "b1");
    let (first, _) = split(e.take());
    let got: Vec<String> = first.iter().map(text).collect();
    assert_eq!(
        got,
        vec!["a1", "b1"],
        "one leased message per group, other groups go on"
    );

    advance(&core, &clock, 1_000);
    let (again, expired) = split(e.take());
    assert_eq!(expired.len(), 2);
    let got: Vec<String> = again.iter().map(text).collect();
    assert_eq!(
        got,
        vec!["a1", "b1"],
        "a1 again before a2: order holds across the expiry"
    );
    for d in &again {
        s.settle(c, d.tag, Outcome::Accept, None, false)
            .expect("accept");
    }
    let (next, _) = split(e.take());
    assert_eq!(next.iter().map(text).collect::<Vec<_>>(), vec!["a2"]);
    s.settle(c, next[0].tag, Outcome::Accept, None, false)
        .expect("accept");
    let (last, _) = split(e.take());
    assert_eq!(last.iter().map(text).collect::<Vec<_>>(), vec!["a3"]);
}

#[test]
fn a_groups_order_holds_while_its_expired_message_waits_out_a_redelivery_delay() {
    let overrides = QueueOverrides {
        redelivery_delay_ms: Some(500),
        ..QueueOverrides::default()
    };
    let (core, clock) = leasing_core(1_000, overrides);
    let (mut s, e) = open(&core, "c");
    let c = consume_with(&mut s, "q", 10, None);
    for body in ["a1", "a2"] {
        send_in_group(&mut s, "a", body);
    }
    send_in_group(&mut s, "b", "b1");
    let (first, _) = split(e.take());
    assert_eq!(first.iter().map(text).collect::<Vec<_>>(), vec!["a1", "b1"]);
    let b1 = first[1].tag;

    // a1's lease runs out: it waits out the delay, and a2 waits for it;
    // group b is not held up.
    advance(&core, &clock, 1_000);
    let (during, expired) = split(e.take());
    assert_eq!(expired.len(), 2, "both leases ran out");
    assert!(
        during.is_empty(),
        "nothing of group a passes a1 while a1 waits out its delay: {:?}",
        during.iter().map(text).collect::<Vec<_>>()
    );
    assert!(
        s.settle(c, b1, Outcome::Accept, None, false).is_err(),
        "b1's lease ran out too"
    );
    advance(&core, &clock, 499);
    assert!(split(e.take()).0.is_empty(), "still within the delay");
    advance(&core, &clock, 1);
    let (back, _) = split(e.take());
    assert_eq!(
        back.iter().map(text).collect::<Vec<_>>(),
        vec!["a1", "b1"],
        "a1 first once its delay is over"
    );
    s.settle(c, back[0].tag, Outcome::Accept, None, false)
        .expect("accept a1");
    let (next, _) = split(e.take());
    assert_eq!(next.iter().map(text).collect::<Vec<_>>(), vec!["a2"]);
}

#[test]
fn a_released_group_message_with_a_delay_comes_back_before_the_groups_later_ones() {
    let overrides = QueueOverrides {
        redelivery_delay_ms: Some(500),
        ..QueueOverrides::default()
    };
    let (core, clock) = manual_core(config_for_queue("q", overrides));
    let (mut s, e) = open(&core, "c");
    // One at a time, so that the group's next message is not in flight.
    let c = consume_with(&mut s, "q", 1, None);
    for body in ["a1", "a2"] {
        send_in_group(&mut s, "a", body);
    }
    let (first, _) = split(e.take());
    assert_eq!(first.iter().map(text).collect::<Vec<_>>(), vec!["a1"]);
    s.settle(c, first[0].tag, Outcome::Release, None, false)
        .expect("release");
    assert!(
        split(e.take()).0.is_empty(),
        "a2 does not pass a1 while a1 waits out its delay"
    );
    advance(&core, &clock, 500);
    let (back, _) = split(e.take());
    assert_eq!(back.iter().map(text).collect::<Vec<_>>(), vec!["a1"]);
    s.settle(c, back[0].tag, Outcome::Accept, None, false)
        .expect("accept");
    let (next, _) = split(e.take());
    assert_eq!(next.iter().map(text).collect::<Vec<_>>(), vec!["a2"]);
}

/// Copies the directory tree `from` to `to`: the disk image a crash would
/// leave, once the store has flushed.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

#[test]
fn after_a_crash_a_leased_message_waits_out_its_journaled_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (running, crashed) = (dir.path().join("running"), dir.path().join("crashed"));
    let clock = Arc::new(ManualClock::new(T0_MS));
    let config = || {
        config_for_queue(
            "q",
            QueueOverrides {
                visibility_timeout_ms: Some(10_000),
                ..QueueOverrides::default()
            },
        )
    };
    let (core, store) = core_on_store(&running, config(), &clock);
    let (mut s, e) = open(&core, "c");
    for body in ["held", "renewed", "given back"] {
        let mut m = Message::text(body);
        m.durable = true;
        s.publish(&queue("q"), m, PublishOptions::default())
            .expect("publish");
    }
    // Explicit credit (an AMQP link's): a message given back is not sent
    // again until the client grants more, so it waits in the queue.
    let c = s
        .consume(ConsumerSpec {
            queue: "q".into(),
            credit: CreditMode::Explicit(3),
            auto_settle: false,
            options: ConsumerOptions::default(),
        })
        .expect("consume");
    let (got, _) = split(e.take());
    assert_eq!(
        got.iter().map(text).collect::<Vec<_>>(),
        ["held", "renewed", "given back"]
    );
    clock.advance(4_000);
    s.renew_lease(c, got[1].tag).expect("renew");
    s.settle(c, got[2].tag, Outcome::Release, None, false)
        .expect("give back");
    assert_eq!(split(e.take()).0.len(), 0, "no credit: it waits");
    store.flush().expect("flush");
    // The process dies here: its sessions never close. What is on disk is
    // what a restart sees.
    copy_tree(&running, &crashed);

    clock.advance(1_000);
    let (core2, _store2) = core_on_store(&crashed, config(), &clock);
    let st = core2.queue_stats("q").expect("queue");
    assert_eq!(
        (st.depth, st.scheduled),
        (1, 2),
        "the one given back is ready, the leased ones wait out their leases"
    );
    let (mut s2, e2) = open(&core2, "c2");
    let _c2 = consume_with(&mut s2, "q", 10, None);
    let ready: Vec<String> = split(e2.take()).0.iter().map(text).collect();
    assert_eq!(ready, ["given back"]);
    advance(&core2, &clock, 4_999);
    assert!(
        split(e2.take()).0.is_empty(),
        "not before its lease ran out"
    );
    advance(&core2, &clock, 1);
    let held: Vec<String> = split(e2.take()).0.iter().map(text).collect();
    assert_eq!(held, ["held"], "at T0 + 10 s, its first deadline");
    advance(&core2, &clock, 3_999);
    assert!(
        split(e2.take()).0.is_empty(),
        "the renewed lease still runs"
    );
    advance(&core2, &clock, 1);
    let renewed: Vec<String> = split(e2.take()).0.iter().map(text).collect();
    assert_eq!(renewed, ["renewed"], "at T0 + 14 s, its renewed deadline");
    drop((s, core, s2, core2));
}

#[test]
fn a_message_whose_time_to_live_ends_on_its_lease_goes_to_the_expiry_address_at_the_expiry_of_the_lease(
) {
    let config = CoreConfig {
        expiry_address: Some("EXP".into()),
        ..config_for_queue(
            "q",
            QueueOverrides {
                visibility_timeout_ms: Some(1_000),
                ..QueueOverrides::default()
            },
        )
    };
    let (core, clock) = manual_core(config);
    let (mut s, e) = open(&core, "c");
    let c = consume_with(&mut s, "q", 10, None);
    let x = consume_with(&mut s, "EXP", 10, None);
    let mut m = Message::text("short-lived");
    m.expiry = Some(T0_MS + 500);
    s.publish(&queue("q"), m, PublishOptions::default())
        .expect("publish");
    let (first, _) = split(e.take());
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].consumer, c, "delivered while it lives");
    // Its time to live ends while it is out on the lease; the lease runs
    // out later and the message is not offered again: it expired.
    advance(&core, &clock, 1_000);
    let (after, expired) = split(e.take());
    assert_eq!(expired.len(), 1, "the lease ran out");
    assert_eq!(after.iter().map(text).collect::<Vec<_>>(), ["short-lived"]);
    assert_eq!(after[0].consumer, x, "to the expiry address, not to c");
    assert_eq!(stats(&core).expired_total, 1);
}
