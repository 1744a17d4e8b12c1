//! Lease delivery at scale (issue 16): 50 consumers on one queue, each
//! with a prefetch window of 10; every 10th delivery is left unsettled
//! until its lease runs out (10 % of deliveries expire, and come back),
//! the rest are accepted. Throughput is compared, in the same run, with
//! an unleased queue where every delivery is accepted, and with a leased
//! queue where none expires (the cost of the lease bookkeeping alone).
//!
//! `cargo bench -p rosetta-core --bench leases`; scale it with
//! `LEASES_MESSAGES`. Time moves on a manual clock (a lease runs out when
//! the bench advances it), so the figures are the core's work, not timer
//! waits. Not run in CI: a measurement, not a test.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rosetta_core::{
    AllowAll, Core, CoreConfig, ManualClock, NoJournal, QueueMatch, QueueOverrides, QueueRule,
    QueueRules,
};
use rosetta_neutral::{
    Address, Broker, ConsumerId, ConsumerSpec, CreditMode, DeliveryTag, EventSink, Message,
    Outcome, Principal, Protocol, PublishOptions, Session, SessionEvent, SessionInfo,
};

const CONSUMERS: usize = 50;
const WINDOW: u32 = 10;
const LEASE_MS: u32 = 30_000;

/// The deliveries a consumer got and has not looked at yet.
#[derive(Default)]
struct Inbox(Mutex<Vec<(ConsumerId, DeliveryTag)>>);

impl EventSink for Inbox {
    fn send(&self, event: SessionEvent) {
        if let SessionEvent::Delivery(d) = event {
            self.0.lock().push((d.consumer, d.tag));
        }
    }
}

/// Runs `messages` through `CONSUMERS` consumers of queue `q`, leaving
/// every `abandon_every`-th delivery (0: none) to expire. Returns the
/// seconds it took and how many deliveries expired.
fn run(leased: bool, messages: u64, abandon_every: u64) -> (f64, u64) {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let overrides = QueueOverrides {
        visibility_timeout_ms: leased.then_some(LEASE_MS),
        delivery_attempts_max: Some(u32::MAX),
        ..QueueOverrides::default()
    };
    let config = CoreConfig {
        queue_rules: QueueRules::new([QueueRule {
            target: QueueMatch::Name("q".into()),
            overrides,
        }]),
        ..CoreConfig::default()
    };
    let core = Core::with_clock(
        config,
        Arc::new(NoJournal),
        Arc::new(AllowAll),
        None,
        clock.clone(),
    );
    let mut consumers: Vec<(Box<dyn Session>, Arc<Inbox>)> = (0..CONSUMERS)
        .map(|i| {
            let inbox = Arc::new(Inbox::default());
            let mut s = core.open_session(
                SessionInfo {
                    conn_id: i as u64,
                    protocol: Protocol::Internal,
                    principal: Principal::anonymous(),
                    client_id: Some(format!("c{i}").into()),
                    take_over: true,
                },
                Arc::clone(&inbox) as Arc<dyn EventSink>,
            );
            s.consume(ConsumerSpec {
                queue: "q".into(),
                credit: CreditMode::Window(WINDOW),
                auto_settle: false,
                options: Default::default(),
            })
            .expect("consume");
            (s, inbox)
        })
        .collect();
    let mut producer = core.open_session(
        SessionInfo {
            conn_id: 999,
            protocol: Protocol::Internal,
            principal: Principal::anonymous(),
            client_id: Some("p".into()),
            take_over: true,
        },
        Arc::new(Inbox::default()),
    );
    let address = Address::Queue("q".into());
    let started = Instant::now();
    for _ in 0..messages {
        producer
            .publish(
                &address,
                Message::binary(vec![b'x'; 100]),
                PublishOptions::default(),
            )
            .expect("publish");
    }
    let mut seen = 0u64;
    let mut expired = 0u64;
    loop {
        let mut progress = false;
        for (s, inbox) in &mut consumers {
            let got = std::mem::take(&mut *inbox.0.lock());
            for (consumer, tag) in got {
                progress = true;
                seen += 1;
                if abandon_every > 0 && seen.is_multiple_of(abandon_every) {
                    continue; // left to expire
                }
                s.settle(consumer, tag, Outcome::Accept, None, false)
                    .expect("accept");
            }
        }
        let stats = core.queue_stats("q").unwrap_or_default();
        if stats.depth == 0 && stats.in_flight == 0 && stats.scheduled == 0 {
            break;
        }
        if !progress {
            // Only abandoned deliveries are left in flight: their leases
            // run out and they come back.
            expired += stats.in_flight;
            clock.advance(u64::from(LEASE_MS));
            core.run_timers();
        }
    }
    (started.elapsed().as_secs_f64(), expired)
}

fn main() {
    let messages = std::env::var("LEASES_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000u64);
    println!("{messages} messages of 100 B, {CONSUMERS} consumers with a window of {WINDOW} each");
    for (name, leased, abandon) in [
        ("unleased, all accepted", false, 0),
        ("leased, none expires", true, 0),
        ("leased, 10% expire", true, 10),
    ] {
        let (secs, expired) = run(leased, messages, abandon);
        println!(
            "  {name:<24} {secs:>7.2} s  {:>9.0} msg/s  ({expired} leases expired)",
            messages as f64 / secs
        );
    }
}
