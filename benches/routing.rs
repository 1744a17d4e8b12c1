//! Topic routing with 100,000 subscriptions.
//!
//! 1,000 subscription queues each bind 100 filters (exact names, `+` and
//! `#` wildcards) over a topic space of `site/<s>/device/<d>/<metric>`, so
//! the core holds 100k bindings. Each iteration publishes one message to a
//! topic that matches a handful of them; the cost must stay near that of a
//! small routing table because matching walks the trie, not the list.
//!
//! Run: `cargo bench --bench routing`.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use rosetta::core::Core;
use rosetta_neutral::*;

const QUEUES: usize = 1_000;
const FILTERS_PER_QUEUE: usize = 100;

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

fn setup(core: &Core) -> Box<dyn Session> {
    let info = SessionInfo {
        conn_id: 1,
        protocol: Protocol::Internal,
        principal: Principal::anonymous(),
        client_id: Some("bench".into()),
        take_over: false,
    };
    let mut s = core.open_session(info, Arc::new(Discard));
    for q in 0..QUEUES {
        let name = format!("sub-{q}");
        s.declare_queue(QueueSpec {
            name: Some(name.clone()),
            durable: false,
            lifetime: QueueLifetime::Permanent,
        })
        .expect("declare");
        for f in 0..FILTERS_PER_QUEUE {
            s.bind(&name, &filter(q, f), BindingOptions::default())
                .expect("bind");
        }
        // Consume with auto-settle so queues stay empty and the bench measures routing.
        s.consume(ConsumerSpec {
            queue: name,
            credit: CreditMode::Window(1_000),
            auto_settle: true,
        })
        .expect("consume");
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

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = routing
}
criterion_main!(benches);
