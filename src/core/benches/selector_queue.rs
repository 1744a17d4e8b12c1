//! A queue with a selecting consumer: 100,000 queued messages, a selector
//! matching 1% of them, consume them all (issue 15). Reports the time and
//! the number of selector evaluations, which must stay near one per
//! message (100,000), not one per message per dispatch.
//!
//! `cargo bench -p rosetta-core --bench selector_queue`. Not run in CI:
//! a measurement, not a test.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rosetta_core::Core;
use rosetta_neutral::{
    Address, Broker, ConsumerOptions, ConsumerSpec, CreditMode, Delivery, EventSink, Message,
    Outcome, Principal, Protocol, PublishOptions, Session, SessionEvent, SessionInfo,
};

/// Messages queued before (or while) the consumer takes its share.
const MESSAGES: usize = 100_000;
/// One message in this many matches the selector.
const MATCH_ONE_IN: usize = 100;
/// The consumer's credit window (it settles each delivery).
const WINDOW: u32 = 100;

#[derive(Default)]
struct Inbox(Mutex<Vec<Delivery>>);

impl EventSink for Inbox {
    fn send(&self, event: SessionEvent) {
        if let SessionEvent::Delivery(d) = event {
            self.0.lock().push(d);
        }
    }
}

fn session(core: &Core, inbox: &Arc<Inbox>) -> Box<dyn Session> {
    core.open_session(
        SessionInfo {
            conn_id: 1,
            protocol: Protocol::Internal,
            principal: Principal::anonymous(),
            client_id: Some("bench".into()),
            take_over: true,
        },
        Arc::clone(inbox) as Arc<dyn EventSink>,
    )
}

fn fill(s: &mut Box<dyn Session>) {
    let address = Address::Queue("q".into());
    for i in 0..MESSAGES {
        let mut m = Message::text(format!("message {i}"));
        let colour = if i % MATCH_ONE_IN == 0 {
            "green"
        } else {
            "red"
        };
        m.properties.push("colour", colour);
        m.properties
            .push("n", rosetta_neutral::Value::Long(i as i64));
        s.publish(&address, m, PublishOptions::default())
            .expect("publish");
    }
}

fn attach(s: &mut Box<dyn Session>) -> rosetta_neutral::ConsumerId {
    s.consume(ConsumerSpec {
        queue: "q".into(),
        credit: CreditMode::Window(WINDOW),
        auto_settle: false,
        options: ConsumerOptions {
            selector: Some("colour = 'green' AND n >= 0".into()),
            ..Default::default()
        },
    })
    .expect("consume")
}

/// Settles what arrives until `count` messages have been taken.
fn consume_all(
    s: &mut Box<dyn Session>,
    inbox: &Inbox,
    consumer: rosetta_neutral::ConsumerId,
    count: usize,
) {
    let mut received = 0;
    while received < count {
        let batch = std::mem::take(&mut *inbox.0.lock());
        assert!(!batch.is_empty(), "stalled after {received} matches");
        for d in batch {
            received += 1;
            s.settle(consumer, d.tag, Outcome::Accept, None, false)
                .expect("settle");
        }
    }
}

fn run(label: &str, attach_first: bool) {
    let core = Core::in_memory();
    let inbox = Arc::new(Inbox::default());
    let mut s = session(&core, &inbox);
    let started;
    let consumer;
    if attach_first {
        started = Instant::now();
        consumer = attach(&mut s);
        fill(&mut s);
    } else {
        fill(&mut s);
        started = Instant::now();
        consumer = attach(&mut s);
    }
    consume_all(&mut s, &inbox, consumer, MESSAGES / MATCH_ONE_IN);
    let elapsed = started.elapsed();
    let stats = core.queue_stats("q").expect("queue");
    println!(
        "{label}: {MESSAGES} messages, {} matched and consumed in {:.1} ms; {} selector evaluations; {} left queued",
        MESSAGES / MATCH_ONE_IN,
        elapsed.as_secs_f64() * 1e3,
        stats.selector_evaluations_total,
        stats.depth,
    );
}

/// The publishing alone, for scale.
fn fill_only() {
    let core = Core::in_memory();
    let inbox = Arc::new(Inbox::default());
    let mut s = session(&core, &inbox);
    let started = Instant::now();
    fill(&mut s);
    println!(
        "publishing {MESSAGES} messages to a queue without consumers: {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
}

/// The same queue and consumer without a selector, consuming all: the
/// plain path, for comparison.
fn plain() {
    let core = Core::in_memory();
    let inbox = Arc::new(Inbox::default());
    let mut s = session(&core, &inbox);
    fill(&mut s);
    let started = Instant::now();
    let consumer = s
        .consume(ConsumerSpec {
            queue: "q".into(),
            credit: CreditMode::Window(WINDOW),
            auto_settle: false,
            options: ConsumerOptions::default(),
        })
        .expect("consume");
    consume_all(&mut s, &inbox, consumer, MESSAGES);
    println!(
        "no selector: {MESSAGES} messages queued, all consumed in {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
}

fn main() {
    fill_only();
    plain();
    run("queued first, then the consumer attaches", false);
    run(
        "consumer attached, then queued (includes the publishing)",
        true,
    );
}
