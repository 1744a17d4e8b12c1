//! Topic routing with 100,000 subscriptions, and fan-out to 10,000.
//!
//! 1,000 subscription queues each bind 100 filters (exact names, `+` and
//! `#` wildcards) over a topic space of `site/<s>/device/<d>/<metric>`, so
//! the core holds 100k bindings. Each iteration publishes one message to a
//! topic that matches a handful of them; the cost must stay near that of a
//! small routing table because matching walks the trie, not the list.
//!
//! The fan-out case binds 10,000 queues to one topic (half by its exact
//! name, half by `+` and `#` filters as well, so some queues match twice):
//! one publish matches every queue, and its cost must grow linearly with
//! the matches, not with their square (each match is folded into its
//! queue's entry once). On the 2-core development machine, back to back:
//! 1.15 s per publish with a linear search per match, 34 ms with the sort
//! (the rest is enqueueing and delivering 10,000 copies).
//!
//! Run: `cargo bench --bench routing`.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use rosetta::core::Core;
use rosetta_neutral::*;

const QUEUES: usize = 1_000;
const FILTERS_PER_QUEUE: usize = 100;
/// Subscribers of the one topic of the fan-out case.
const FAN_OUT_QUEUES: usize = 10_000;
const FAN_OUT_TOPIC: &str = "news/world/today";

struct Discard;

impl EventSink for Discard {
    fn send(&self, _event: SessionEvent) {}
}

fn filter(q: usize, f: usize) -> String {
    let site = (q * FILTERS_PER_QUEUE + f) % 5_000;
    match f % 4 {
        0 => format!("site/{site}/device/{f}/temp"),
        1 => format!("site/{site}/device/+/temp"),
        2 => format!("site/{site}/device/{f}/#"),
        _ => format!("site/{site}/+/{f}/hum"),
    }
}

fn session(core: &Core) -> Box<dyn Session> {
    let info = SessionInfo {
        conn_id: 1,
        protocol: Protocol::Internal,
        principal: Principal::anonymous(),
        client_id: Some("bench".into()),
        take_over: false,
    };
    core.open_session(info, Arc::new(Discard))
}

/// Declares the queue `name`, binds `filters` to it, and consumes it with
/// auto-settle, so it stays empty and the bench measures routing.
fn subscriber(s: &mut dyn Session, name: String, filters: impl IntoIterator<Item = String>) {
    s.declare_queue(QueueSpec {
        name: Some(name.clone()),
        durable: false,
        lifetime: QueueLifetime::Permanent,
        bindings_max: None,
    })
    .expect("declare");
    for f in filters {
        s.bind(&name, &f, BindingOptions::default()).expect("bind");
    }
    s.consume(ConsumerSpec {
        queue: name,
        credit: CreditMode::Window(1_000),
        auto_settle: true,
        options: Default::default(),
    })
    .expect("consume");
}

fn setup(core: &Core) -> Box<dyn Session> {
    let mut s = session(core);
    for q in 0..QUEUES {
        subscriber(
            s.as_mut(),
            format!("sub-{q}"),
            (0..FILTERS_PER_QUEUE).map(|f| filter(q, f)),
        );
    }
    s
}

fn setup_fan_out(core: &Core) -> Box<dyn Session> {
    let mut s = session(core);
    for q in 0..FAN_OUT_QUEUES {
        let mut filters = vec![FAN_OUT_TOPIC.to_owned()];
        if q % 2 == 1 {
            filters.push("news/+/today".to_owned());
            filters.push("news/#".to_owned());
        }
        subscriber(s.as_mut(), format!("fan-{q}"), filters);
    }
    s
}

fn routing(c: &mut Criterion) {
    let core = Core::in_memory();
    let mut s = setup(&core);
    let mut i = 0usize;
    c.bench_function("publish to 100k subscriptions (few match)", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let topic = Address::Topic(format!("site/{}/device/{}/temp", i % 5_000, i % 100));
            let receipt = s
                .publish(
                    &topic,
                    Message::binary(&b"21.5"[..]),
                    PublishOptions::default(),
                )
                .expect("publish");
            std::hint::black_box(receipt.routed)
        })
    });
    let mut j = 0usize;
    c.bench_function("publish to a topic nobody matches", |b| {
        b.iter(|| {
            j = j.wrapping_add(1);
            let topic = Address::Topic(format!("other/{}/x", j % 5_000));
            let receipt = s
                .publish(
                    &topic,
                    Message::binary(&b"x"[..]),
                    PublishOptions::default(),
                )
                .expect("publish");
            std::hint::black_box(receipt.routed)
        })
    });
}

fn fan_out(c: &mut Criterion) {
    let core = Core::in_memory();
    let mut s = setup_fan_out(&core);
    let topic = Address::Topic(FAN_OUT_TOPIC.to_owned());
    let mut group = c.benchmark_group("fan-out");
    // One publish enqueues and delivers 10,000 copies: fewer, longer samples.
    group.sample_size(10);
    group.bench_function("publish to one topic with 10k subscribers", |b| {
        b.iter(|| {
            let receipt = s
                .publish(
                    &topic,
                    Message::binary(&b"extra"[..]),
                    PublishOptions::default(),
                )
                .expect("publish");
            assert_eq!(receipt.routed, FAN_OUT_QUEUES);
            std::hint::black_box(receipt.routed)
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = routing, fan_out
}
criterion_main!(benches);
