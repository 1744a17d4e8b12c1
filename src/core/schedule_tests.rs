//! Scheduled delivery, redelivery delay and their composition with expiry
//! (issue 16), through the session API on a manual clock: no real sleeps.
//! Time moves only by `ManualClock::advance`; `Core::run_timers` then
//! serves what became due, as the housekeeping thread does on its own.

use super::*;
use crate::{Clock, ManualClock, QueueOverrides, RedeliveryMultiplier};

/// A core whose queue `q` redelivers after `delay_ms`, growing by
/// `multiplier` up to `max_ms`.
fn delaying_core(delay_ms: u64, multiplier: f64, max_ms: Option<u64>) -> (Core, Arc<ManualClock>) {
    let overrides = QueueOverrides {
        redelivery_delay_ms: Some(delay_ms),
        redelivery_multiplier: RedeliveryMultiplier::new(multiplier),
        redelivery_delay_max_ms: max_ms,
        ..QueueOverrides::default()
    };
    manual_core(config_for_queue("q", overrides))
}

fn send_at(s: &mut Box<dyn Session>, q: &str, body: &str, at: Option<u64>, expiry: Option<u64>) {
    let mut m = Message::text(body);
    m.delivery_time = at;
    m.expiry = expiry;
    s.publish(&queue(q), m, PublishOptions::default())
        .expect("publish");
}

fn consume(s: &mut Box<dyn Session>, q: &str, credit: CreditMode) -> ConsumerId {
    s.consume(ConsumerSpec {
        queue: q.into(),
        credit,
        auto_settle: false,
        options: Default::default(),
    })
    .expect("consume")
}

fn advance(core: &Core, clock: &ManualClock, ms: u64) {
    clock.advance(ms);
    core.run_timers();
}

fn bodies(d: &[Delivery]) -> Vec<String> {
    d.iter().map(text).collect()
}

fn stats(core: &Core, q: &str) -> crate::QueueStats {
    core.queue_stats(q).expect("queue exists")
}

fn fail(s: &mut Box<dyn Session>, d: &Delivery) {
    let failed = Outcome::Modify {
        delivery_failed: true,
        undeliverable_here: false,
    };
    s.settle(d.consumer, d.tag, failed, None, false)
        .expect("modify");
}

#[test]
fn scheduled_messages_become_visible_exactly_at_their_time_in_due_order() {
    let (core, clock) = manual_core(CoreConfig::default());
    let (mut s, e) = open(&core, "c");
    send_at(&mut s, "q", "c", Some(T0_MS + 300), None);
    send_at(&mut s, "q", "a", Some(T0_MS + 100), None);
    send_at(&mut s, "q", "b", Some(T0_MS + 200), None);
    send_at(&mut s, "q", "past", Some(T0_MS - 1), None);
    send_at(&mut s, "q", "now", None, None);
    let st = stats(&core, "q");
    assert_eq!((st.depth, st.scheduled), (2, 3), "scheduled are not ready");
    let _c = consume(&mut s, "q", CreditMode::Window(100));
    assert_eq!(bodies(&e.deliveries()), vec!["past", "now"]);

    advance(&core, &clock, 99);
    assert!(e.deliveries().is_empty(), "nothing before its time");
    assert_eq!(stats(&core, "q").scheduled, 3);
    advance(&core, &clock, 1);
    assert_eq!(bodies(&e.deliveries()), vec!["a"], "exactly at its time");
    let st = stats(&core, "q");
    assert_eq!((st.depth, st.scheduled, st.in_flight), (0, 2, 3));
    advance(&core, &clock, 500);
    assert_eq!(bodies(&e.deliveries()), vec!["b", "c"], "in due order");
    assert_eq!(stats(&core, "q").scheduled, 0);
}

#[test]
fn a_scheduled_message_is_counted_apart_until_due_then_waits_in_depth() {
    let (core, clock) = manual_core(CoreConfig::default());
    let (mut s, e) = open(&core, "c");
    send_at(&mut s, "q", "later", Some(T0_MS + 1_000), None);
    let st = stats(&core, "q");
    assert_eq!((st.depth, st.scheduled), (0, 1));
    advance(&core, &clock, 1_000);
    let st = stats(&core, "q");
    assert_eq!((st.depth, st.scheduled), (1, 0), "due: now ready, in depth");
    let _c = consume(&mut s, "q", CreditMode::Window(10));
    assert_eq!(bodies(&e.deliveries()), vec!["later"]);
}

#[test]
fn a_scheduled_topic_message_waits_in_every_subscriber_queue_and_is_not_retained() {
    let (core, clock) = manual_core(CoreConfig::default());
    let (mut s, e) = open(&core, "c");
    let (q1, _) = subscribe(&mut s, "t/#", 10);
    let (q2, _) = subscribe(&mut s, "t/x", 10);
    let mut m = Message::text("hello");
    m.delivery_time = Some(T0_MS + 50);
    m.retain = true;
    s.publish(&topic("t/x"), m, PublishOptions::default())
        .expect("publish");
    assert_eq!(stats(&core, &q1).scheduled, 1);
    assert_eq!(stats(&core, &q2).scheduled, 1);
    assert!(e.deliveries().is_empty());
    // A subscriber arriving before its time gets no retained copy early.
    let (mut late, late_events) = open(&core, "late");
    let (_q3, _) = {
        let q = late
            .declare_queue(QueueSpec {
                name: None,
                durable: false,
                lifetime: QueueLifetime::Consumer,
                bindings_max: None,
            })
            .expect("declare");
        let info = late
            .bind(
                &q.name,
                "t/x",
                BindingOptions {
                    retained: RetainedOnBind::Send,
                    ..BindingOptions::default()
                },
            )
            .expect("bind");
        (q.name, info)
    };
    advance(&core, &clock, 50);
    assert_eq!(bodies(&e.deliveries()), vec!["hello", "hello"]);
    assert!(late_events.deliveries().is_empty());
}

#[test]
fn a_delivery_time_past_the_maximum_delay_is_refused() {
    let (core, _clock) = manual_core(CoreConfig::default());
    let (mut s, _e) = open(&core, "c");
    let mut m = Message::text("too late");
    m.delivery_time = Some(T0_MS + rosetta_neutral::message::DELIVERY_DELAY_MAX_MS + 1);
    let err = s.publish(&queue("q"), m, PublishOptions::default());
    assert!(matches!(err, Err(BrokerError::ResourceLimit(_))), "{err:?}");
    let mut m = Message::text("just in time");
    m.delivery_time = Some(T0_MS + rosetta_neutral::message::DELIVERY_DELAY_MAX_MS);
    s.publish(&queue("q"), m, PublishOptions::default())
        .expect("at the maximum is fine");
}

#[test]
fn redelivery_waits_its_delay_growing_by_the_multiplier_up_to_the_cap() {
    let (core, clock) = delaying_core(100, 2.0, Some(300));
    let (mut s, e) = open(&core, "c");
    send_at(&mut s, "q", "m", None, None);
    let _c = consume(&mut s, "q", CreditMode::Window(10));
    // Each failed attempt: 100, 200, then 400 capped at 300.
    for (attempt, delay) in [(1u32, 100u64), (2, 200), (3, 300)] {
        let d = e.deliveries();
        assert_eq!(bodies(&d), vec!["m"], "attempt {attempt}");
        fail(&mut s, &d[0]);
        assert_eq!(stats(&core, "q").scheduled, 1);
        advance(&core, &clock, delay - 1);
        assert!(e.deliveries().is_empty(), "early at attempt {attempt}");
        advance(&core, &clock, 1);
    }
    let d = e.deliveries();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].delivery_count, 3);
    assert!(d[0].redelivered);
    s.settle(d[0].consumer, d[0].tag, Outcome::Accept, None, false)
        .expect("accept");
    // A release counts no attempt: a fresh message waits the first delay.
    send_at(&mut s, "q", "n", None, None);
    let d = e.deliveries();
    s.settle(d[0].consumer, d[0].tag, Outcome::Release, None, false)
        .expect("release");
    advance(&core, &clock, 99);
    assert!(e.deliveries().is_empty());
    advance(&core, &clock, 1);
    let d = e.deliveries();
    assert_eq!(bodies(&d), vec!["n"]);
    assert_eq!(d[0].delivery_count, 0);
}

#[test]
fn the_default_cap_is_ten_times_the_delay() {
    let (core, clock) = delaying_core(10, 100.0, None);
    let (mut s, e) = open(&core, "c");
    send_at(&mut s, "q", "m", None, None);
    let _c = consume(&mut s, "q", CreditMode::Window(10));
    let d = e.deliveries();
    fail(&mut s, &d[0]);
    advance(&core, &clock, 10);
    let d = e.deliveries();
    assert_eq!(d.len(), 1, "first: the delay itself");
    fail(&mut s, &d[0]);
    // 10 * 100 = 1000, capped at 10 * 10 = 100.
    advance(&core, &clock, 99);
    assert!(e.deliveries().is_empty());
    advance(&core, &clock, 1);
    assert_eq!(e.deliveries().len(), 1);
}

#[test]
fn messages_behind_a_delayed_redelivery_are_not_held_up() {
    let (core, clock) = delaying_core(1_000, 1.0, None);
    let (mut s, e) = open(&core, "c");
    for body in ["m1", "m2", "m3"] {
        send_at(&mut s, "q", body, None, None);
    }
    let _c = consume(&mut s, "q", CreditMode::Window(1));
    let d = e.deliveries();
    assert_eq!(bodies(&d), vec!["m1"]);
    fail(&mut s, &d[0]);
    let d = e.deliveries();
    assert_eq!(bodies(&d), vec!["m2"], "the next goes at once");
    s.settle(d[0].consumer, d[0].tag, Outcome::Accept, None, false)
        .expect("accept");
    let d = e.deliveries();
    assert_eq!(bodies(&d), vec!["m3"]);
    s.settle(d[0].consumer, d[0].tag, Outcome::Accept, None, false)
        .expect("accept");
    assert!(e.deliveries().is_empty());
    let st = stats(&core, "q");
    assert_eq!((st.depth, st.scheduled), (0, 1));
    advance(&core, &clock, 1_000);
    assert_eq!(bodies(&e.deliveries()), vec!["m1"]);
}

#[test]
fn a_consumer_that_goes_with_unsettled_deliveries_has_them_come_back_after_the_delay() {
    let (core, clock) = delaying_core(500, 1.0, None);
    let (mut s, e) = open(&core, "c");
    send_at(&mut s, "q", "m", None, None);
    let c = consume(&mut s, "q", CreditMode::Window(10));
    assert_eq!(e.deliveries().len(), 1);
    s.cancel(c).expect("cancel");
    let _other = consume(&mut s, "q", CreditMode::Window(10));
    assert!(e.deliveries().is_empty(), "not at once");
    advance(&core, &clock, 500);
    let d = e.deliveries();
    assert_eq!(bodies(&d), vec!["m"]);
    assert_eq!(d[0].delivery_count, 1);
}

#[test]
fn a_scheduled_message_expiring_before_its_time_goes_to_the_expiry_address_never_to_a_consumer() {
    let (core, clock) = manual_core(CoreConfig {
        expiry_address: Some("EXP".into()),
        ..CoreConfig::default()
    });
    let (mut s, e) = open(&core, "c");
    let c = consume(&mut s, "q", CreditMode::Window(10));
    let x = consume(&mut s, "EXP", CreditMode::Window(10));
    send_at(
        &mut s,
        "q",
        "doomed",
        Some(T0_MS + 1_000),
        Some(T0_MS + 500),
    );
    send_at(
        &mut s,
        "q",
        "fine",
        Some(T0_MS + 1_000),
        Some(T0_MS + 5_000),
    );
    advance(&core, &clock, 499);
    assert!(e.deliveries().is_empty());
    advance(&core, &clock, 1);
    let d = e.deliveries();
    assert_eq!(bodies(&d), vec!["doomed"]);
    assert_eq!(d[0].consumer, x, "to the expiry address, at its expiry");
    let st = stats(&core, "q");
    assert_eq!((st.scheduled, st.expired_total), (1, 1));
    advance(&core, &clock, 500);
    let d = e.deliveries();
    assert_eq!(bodies(&d), vec!["fine"]);
    assert_eq!(d[0].consumer, c);
}

#[test]
fn a_timer_armed_in_time_order_arms_the_core_once_per_queue() {
    let (core, clock) = manual_core(CoreConfig::default());
    let (mut s, _e) = open(&core, "c");
    for i in 0..1_000 {
        send_at(&mut s, "q", "m", Some(T0_MS + 1 + i), None);
    }
    assert_eq!(core.inner.links.timers.armed(), 1);
    clock.advance(10_000);
    core.run_timers();
    assert_eq!(stats(&core, "q").depth, 1_000);
    assert_eq!(core.inner.links.timers.armed(), 0);
}

#[test]
fn a_restart_keeps_scheduled_messages_and_never_delivers_them_early() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0_MS));
    let start = |clock: &Arc<ManualClock>| core_on_store(dir.path(), CoreConfig::default(), clock);
    {
        let (core, store) = start(&clock);
        let (mut s, _e) = open(&core, "c");
        for (body, at) in [("b", 2_000), ("a", 1_000)] {
            let mut m = Message::text(body);
            m.durable = true;
            m.delivery_time = Some(T0_MS + at);
            s.publish(&queue("q"), m, PublishOptions::default())
                .expect("publish");
        }
        store.flush().expect("flush");
        s.close(CloseKind::Clean);
    }
    // Restarted half way to the first one's time.
    clock.set(T0_MS + 500);
    let (core, _store) = start(&clock);
    let st = stats(&core, "q");
    assert_eq!((st.depth, st.scheduled), (0, 2), "both kept, neither ready");
    let (mut s, e) = open(&core, "c");
    let _c = consume(&mut s, "q", CreditMode::Window(10));
    core.run_timers();
    assert!(
        e.deliveries().is_empty(),
        "not delivered early after a restart"
    );
    advance(&core, &clock, 499);
    assert!(e.deliveries().is_empty());
    advance(&core, &clock, 1);
    assert_eq!(bodies(&e.deliveries()), vec!["a"]);
    advance(&core, &clock, 1_000);
    assert_eq!(bodies(&e.deliveries()), vec!["b"]);
    assert_eq!(clock.now_ms(), T0_MS + 2_000);
}

#[test]
fn a_restart_during_a_redelivery_delay_does_not_deliver_the_message_early() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0_MS));
    let config = || {
        config_for_queue(
            "q",
            QueueOverrides {
                redelivery_delay_ms: Some(1_000),
                ..QueueOverrides::default()
            },
        )
    };
    let start = |clock: &Arc<ManualClock>| core_on_store(dir.path(), config(), clock);
    {
        let (core, store) = start(&clock);
        let (mut s, e) = open(&core, "c");
        for body in ["failed", "released"] {
            let mut m = Message::text(body);
            m.durable = true;
            s.publish(&queue("q"), m, PublishOptions::default())
                .expect("publish");
        }
        let _c = consume(&mut s, "q", CreditMode::Window(10));
        let d = e.deliveries();
        assert_eq!(bodies(&d), vec!["failed", "released"]);
        fail(&mut s, &d[0]);
        s.settle(d[1].consumer, d[1].tag, Outcome::Release, None, false)
            .expect("release");
        assert_eq!(stats(&core, "q").scheduled, 2, "both wait out the delay");
        store.flush().expect("flush");
        // Nothing is in flight: closing changes nothing, and only the
        // journal carries the delay across the restart.
        s.close(CloseKind::Clean);
    }
    clock.set(T0_MS + 400);
    let (core, _store) = start(&clock);
    let st = stats(&core, "q");
    assert_eq!(
        (st.depth, st.scheduled),
        (0, 2),
        "still waiting after the restart"
    );
    let (mut s, e) = open(&core, "c");
    let _c = consume(&mut s, "q", CreditMode::Window(10));
    core.run_timers();
    advance(&core, &clock, 599);
    assert!(e.deliveries().is_empty(), "not before the delay is over");
    advance(&core, &clock, 1);
    let d = e.deliveries();
    assert_eq!(bodies(&d), vec!["failed", "released"]);
    assert_eq!(
        d.iter().map(|d| d.delivery_count).collect::<Vec<_>>(),
        vec![1, 0],
        "the failed attempt is counted, the release is not"
    );
}
