//! Prometheus metrics: what an operator asks first (queue depth, age of the
//! oldest message, delivery attempts, time in queue), the memory budget and
//! paging, connections and the journal, in the text exposition format at
//! `GET /metrics` on the HTTP port, and each queue's settings in force
//! (`rosetta_queue_settings_info`); streams' sizes and consumer groups'
//! lag (`streams`).

mod streams;

use std::fmt::Write as _;

use rosetta_core::{Core, QueueStats, TopicDedupStats};
use rosetta_store::StoreStats;

/// One labelled series: name, type, help, and how to read it from the
/// figures of one queue (or one topic entry).
struct Series<S> {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&S) -> f64,
}

type QueueMetric = Series<QueueStats>;

const QUEUE_METRICS: &[QueueMetric] = &[
    QueueMetric {
        name: "rosetta_queue_depth",
        kind: "gauge",
        help: "Messages waiting in the queue, paged ones included.",
        value: |s| s.depth as f64,
    },
    QueueMetric {
        name: "rosetta_queue_paged",
        kind: "gauge",
        help: "Messages of the queue waiting on disk (over the memory budget).",
        value: |s| s.paged as f64,
    },
    QueueMetric {
        name: "rosetta_queue_scheduled",
        kind: "gauge",
        help:
            "Messages waiting for a time (scheduled delivery, redelivery delay), not part of depth.",
        value: |s| s.scheduled as f64,
    },
    QueueMetric {
        name: "rosetta_queue_in_flight",
        kind: "gauge",
        help: "Messages delivered and not yet settled.",
        value: |s| s.in_flight as f64,
    },
    QueueMetric {
        name: "rosetta_queue_consumers",
        kind: "gauge",
        help: "Consumers attached to the queue.",
        value: |s| s.consumers as f64,
    },
    QueueMetric {
        name: "rosetta_queue_oldest_message_age_seconds",
        kind: "gauge",
        help: "Age of the message at the head of the queue (0 when empty).",
        value: |s| s.oldest_age.map_or(0.0, |a| a.as_secs_f64()),
    },
    QueueMetric {
        name: "rosetta_queue_enqueued_total",
        kind: "counter",
        help: "Messages enqueued since start.",
        value: |s| s.enqueued_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_deliveries_total",
        kind: "counter",
        help: "Delivery attempts since start, redeliveries included.",
        value: |s| s.deliveries_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_redeliveries_total",
        kind: "counter",
        help: "Redeliveries since start.",
        value: |s| s.redeliveries_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_acked_total",
        kind: "counter",
        help: "Messages settled as accepted since start.",
        value: |s| s.acked_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_dead_lettered_total",
        kind: "counter",
        help: "Messages moved to the dead-letter address since start.",
        value: |s| s.dead_lettered_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_expired_total",
        kind: "counter",
        help: "Messages dropped or moved because they expired.",
        value: |s| s.expired_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_dropped_full_total",
        kind: "counter",
        help: "Topic messages the queue missed because it was full.",
        value: |s| s.dropped_full_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_groups",
        kind: "gauge",
        help: "Message groups with a consumer assigned.",
        value: |s| s.groups as f64,
    },
    QueueMetric {
        name: "rosetta_queue_selector_evaluations_total",
        kind: "counter",
        help: "Consumer selectors evaluated against a message since start.",
        value: |s| s.selector_evaluations_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_duplicates_total",
        kind: "counter",
        help: "Sends dropped (and acknowledged) as duplicates within the queue's dedup window.",
        value: |s| s.duplicates_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_dedup_ids",
        kind: "gauge",
        help: "Dedup ids the queue remembers now.",
        value: |s| s.dedup_ids as f64,
    },
    QueueMetric {
        name: "rosetta_queue_dedup_evicted_total",
        kind: "counter",
        help: "Dedup ids forgotten before their window passed, to stay within dedup_ids_max.",
        value: |s| s.dedup_evicted_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_last_value_replaced_total",
        kind: "counter",
        help: "Waiting messages a last-value queue dropped for a newer one of the same value.",
        value: |s| s.replaced_total as f64,
    },
    QueueMetric {
        name: "rosetta_queue_time_in_queue_seconds_total",
        kind: "counter",
        help: "Sum of enqueue-to-acknowledgement times of acknowledged messages.",
        value: |s| s.time_in_queue_ms_total as f64 / 1000.0,
    },
];

/// Broker-wide figures besides the core's (for `/metrics` and the admin
/// API's overview).
#[derive(Debug, Clone)]
pub struct BrokerFigures {
    /// Open client connections (every socket being served).
    pub connections: usize,
    /// Connections that have authenticated.
    pub authenticated: usize,
    /// Connections not yet authenticated.
    pub unauthenticated: usize,
    /// Connections refused at accept because a cap was reached.
    pub refused_total: u64,
    /// Idle connections parked out of their tasks now (docs/scaling.md).
    pub parked: usize,
    /// Times a parked connection was resumed (its socket readable, an
    /// event for it, its deadline near).
    pub parked_resumes_total: u64,
    /// `[store] memory_budget_bytes`.
    pub memory_budget_bytes: u64,
    /// The journal's counters.
    pub store: StoreStats,
}

/// The whole exposition.
pub(crate) fn render(core: &Core, broker: &BrokerFigures) -> String {
    let mut out = String::with_capacity(4096);
    let mut queues = core.all_queue_stats();
    queues.sort_by(|a, b| a.0.cmp(&b.0));
    let labelled: Vec<(String, &QueueStats)> = queues
        .iter()
        .map(|(queue, stats)| (format!("queue=\"{}\"", escape_label(queue)), stats))
        .collect();
    render_series(&mut out, QUEUE_METRICS, &labelled);
    render_queue_settings(&mut out, core);
    render_topic_dedup(&mut out, core);
    streams::render(&mut out, core);
    let s = &broker.store;
    let plain: [(&str, &str, &str, f64); 16] = [
        (
            "rosetta_connections",
            "gauge",
            "Open client connections.",
            broker.connections as f64,
        ),
        (
            "rosetta_connections_authenticated",
            "gauge",
            "Open connections that have authenticated ([broker] connections_max caps them).",
            broker.authenticated as f64,
        ),
        (
            "rosetta_connections_unauthenticated",
            "gauge",
            "Open connections not yet authenticated ([broker] unauthenticated_connections_max caps them).",
            broker.unauthenticated as f64,
        ),
        (
            "rosetta_connections_refused_total",
            "counter",
            "Connections refused at accept because a connection cap was reached.",
            broker.refused_total as f64,
        ),
        (
            "rosetta_connections_parked",
            "gauge",
            "Idle plain TCP and WebSocket connections parked out of their tasks.",
            broker.parked as f64,
        ),
        (
            "rosetta_connections_parked_resumes_total",
            "counter",
            "Times a parked connection was resumed: its socket readable, an event for it, or its deadline near.",
            broker.parked_resumes_total as f64,
        ),
        (
            "rosetta_memory_used_bytes",
            "gauge",
            "Bytes of queued messages held in memory.",
            core.memory_used() as f64,
        ),
        (
            "rosetta_memory_budget_bytes",
            "gauge",
            "[store] memory_budget_bytes: past it, queues page to disk.",
            broker.memory_budget_bytes as f64,
        ),
        (
            "rosetta_messages_paged",
            "gauge",
            "Messages waiting on disk, all queues together.",
            core.messages_paged() as f64,
        ),
        (
            "rosetta_journal_commits_total",
            "counter",
            "Units appended to the journal.",
            s.commits as f64,
        ),
        (
            "rosetta_journal_batches_total",
            "counter",
            "Group-commit batches written.",
            s.batches as f64,
        ),
        (
            "rosetta_journal_syncs_total",
            "counter",
            "fdatasync calls.",
            s.syncs as f64,
        ),
        (
            "rosetta_journal_bytes",
            "gauge",
            "Bytes in journal segment files.",
            s.bytes as f64,
        ),
        (
            "rosetta_journal_segments",
            "gauge",
            "Journal segment files.",
            s.segments as f64,
        ),
        (
            "rosetta_journal_pending_bytes",
            "gauge",
            "Bytes waiting for the journal writer.",
            s.pending_bytes as f64,
        ),
        (
            "rosetta_producers_blocked",
            "gauge",
            "1 while producers are held back (memory budget or disk limit).",
            f64::from(u8::from(core.producers_blocked())),
        ),
    ];
    for (name, kind, help, value) in plain {
        header(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
    let traffic = core.traffic();
    for (name, help, value) in [
        (
            "rosetta_messages_published_total",
            "Publishes and sends accepted, once each however many queues they reached.",
            traffic.published,
        ),
        (
            "rosetta_messages_delivered_total",
            "Messages handed to consumers, redeliveries included.",
            traffic.delivered,
        ),
        (
            "rosetta_messages_acknowledged_total",
            "Deliveries settled as consumed.",
            traffic.acknowledged,
        ),
    ] {
        header(&mut out, name, "counter", help);
        let _ = writeln!(out, "{name} {value}");
    }
    render_sync_latency(&mut out, &s.sync_latency);
    if let Some(free) = core.disk_free_bytes() {
        let name = "rosetta_disk_free_bytes";
        header(
            &mut out,
            name,
            "gauge",
            "Free bytes on the data directory's filesystem ([store] disk_free_min_bytes holds producers back below it).",
        );
        let _ = writeln!(out, "{name} {free}");
    }
    out
}

/// `rosetta_journal_sync_seconds`: the writer's `fdatasync` times as a
/// Prometheus histogram (cumulative buckets, sum, count).
fn render_sync_latency(out: &mut String, h: &rosetta_store::LatencyHistogram) {
    let name = "rosetta_journal_sync_seconds";
    header(out, name, "histogram", "Time each journal fdatasync took.");
    let mut cumulative = 0;
    for (i, count) in h.counts.iter().enumerate() {
        cumulative += count;
        if i < rosetta_store::SYNC_LATENCY_BOUNDS {
            let le = rosetta_store::bucket_bound_us(i) as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum {}", h.sum_us as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {cumulative}");
}

/// One info-style series per queue: the settings in force (its own from
/// `[[queues]]`, else the broker's) as labels, value 1, so a query can
/// join them to the other per-queue series by `queue`.
fn render_queue_settings(out: &mut String, core: &Core) {
    let name = "rosetta_queue_settings_info";
    header(
        out,
        name,
        "gauge",
        "Settings of the queue in force ([[queues]] over [broker]), as labels; always 1.",
    );
    let mut queues = core.all_queue_settings();
    queues.sort_by(|a, b| a.0.cmp(&b.0));
    for (queue, settings) in &queues {
        // An unset option is an empty label, as Prometheus reads a
        // missing one.
        let or_empty = |v: Option<String>| v.unwrap_or_default();
        let _ = writeln!(
            out,
            "{name}{{queue=\"{}\",exclusive=\"{}\",dead_letter_address=\"{}\",delivery_attempts_max=\"{}\",groups_max=\"{}\",visibility_timeout_ms=\"{}\",redelivery_delay_ms=\"{}\",redelivery_multiplier=\"{}\",redelivery_delay_max_ms=\"{}\",dedup_window_s=\"{}\",dedup=\"{}\",dedup_ids_max=\"{}\",last_value_key=\"{}\"}} 1",
            escape_label(queue),
            settings.exclusive,
            escape_label(settings.dead_letter_address.as_deref().unwrap_or_default()),
            or_empty(settings.delivery_attempts_max.map(|m| m.to_string())),
            settings.groups_max,
            or_empty(settings.visibility_timeout_ms.map(|m| m.to_string())),
            settings.redelivery_delay_ms,
            settings.redelivery_multiplier.get(),
            settings.redelivery_delay_cap_ms(),
            or_empty(settings.dedup_window_s.map(|s| s.to_string())),
            settings.dedup.as_str(),
            settings.dedup_ids_max,
            escape_label(settings.last_value_key.as_deref().unwrap_or_default()),
        );
    }
}

const TOPIC_DEDUP_METRICS: &[Series<TopicDedupStats>] = &[
    Series {
        name: "rosetta_topic_duplicates_total",
        kind: "counter",
        help: "Sends to a topic dropped (and acknowledged) as duplicates within its [[topics]] dedup window.",
        value: |w| w.duplicates_total as f64,
    },
    Series {
        name: "rosetta_topic_dedup_ids",
        kind: "gauge",
        help: "Dedup ids the [[topics]] entry remembers now.",
        value: |w| w.ids as f64,
    },
    Series {
        name: "rosetta_topic_dedup_evicted_total",
        kind: "counter",
        help: "Topic dedup ids forgotten before their window passed, to stay within dedup_ids_max.",
        value: |w| w.evicted_total as f64,
    },
];

/// The dedup windows of `[[topics]]` entries, labelled by filter.
fn render_topic_dedup(out: &mut String, core: &Core) {
    let windows = core.topic_dedup_stats();
    if windows.is_empty() {
        return;
    }
    let labelled: Vec<(String, &TopicDedupStats)> = windows
        .iter()
        .map(|w| (format!("filter=\"{}\"", escape_label(&w.filter)), w))
        .collect();
    render_series(out, TOPIC_DEDUP_METRICS, &labelled);
}

/// Each of `series`, its header then one line per item: the item's
/// labels (`name="value"` pairs, escaped) and its value.
fn render_series<S>(out: &mut String, series: &[Series<S>], items: &[(String, &S)]) {
    for m in series {
        header(out, m.name, m.kind, m.help);
        for (labels, item) in items {
            let _ = writeln!(out, "{}{{{labels}}} {}", m.name, (m.value)(item));
        }
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Label values escape backslash, double quote and newline.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rosetta_neutral::{
        Address, Broker, EventSink, Message, Principal, Protocol, PublishOptions, SessionEvent,
        SessionInfo,
    };
    use std::sync::Arc;

    struct Discard;
    impl EventSink for Discard {
        fn send(&self, _: SessionEvent) {}
    }

    fn session(core: &Core) -> Box<dyn rosetta_neutral::Session> {
        let info = SessionInfo {
            conn_id: 1,
            protocol: Protocol::Internal,
            principal: Principal::anonymous(),
            client_id: None,
            take_over: false,
        };
        core.open_session(info, Arc::new(Discard))
    }

    /// 3 connections (2 authenticated, 1 not), 4 refused, a 1 MiB budget.
    fn figures() -> BrokerFigures {
        BrokerFigures {
            connections: 3,
            authenticated: 2,
            unauthenticated: 1,
            refused_total: 4,
            parked: 0,
            parked_resumes_total: 0,
            memory_budget_bytes: 1 << 20,
            store: StoreStats::default(),
        }
    }

    #[test]
    fn duplicates_are_counted_per_queue() {
        let rules = rosetta_core::QueueRules::new([rosetta_core::QueueRule {
            target: rosetta_core::QueueMatch::Name("orders".into()),
            overrides: rosetta_core::QueueOverrides {
                dedup_window_s: Some(60),
                ..Default::default()
            },
        }]);
        let core = Core::new(
            rosetta_core::CoreConfig {
                queue_rules: rules,
                ..Default::default()
            },
            Arc::new(rosetta_core::NoJournal),
            Arc::new(rosetta_core::AllowAll),
            None,
        );
        let mut s = session(&core);
        for _ in 0..3 {
            let mut m = Message::text("m");
            m.properties.push("dedup-id", "one");
            s.publish(
                &Address::Queue("orders".into()),
                m,
                PublishOptions::default(),
            )
            .expect("publish");
        }
        let text = render(&core, &figures());
        assert!(
            text.contains("# TYPE rosetta_queue_duplicates_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("rosetta_queue_duplicates_total{queue=\"orders\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("rosetta_queue_dedup_ids{queue=\"orders\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("rosetta_queue_depth{queue=\"orders\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn queues_and_broker_figures_are_exposed() {
        let core = Core::in_memory();
        let mut s = session(&core);
        for body in ["a", "b"] {
            s.publish(
                &Address::Queue("orders\"x".into()),
                Message::text(body),
                PublishOptions::default(),
            )
            .expect("publish");
        }
        let mut later = Message::text("later");
        later.delivery_time = Some(rosetta_neutral::message::now_ms() + 3_600_000);
        s.publish(
            &Address::Queue("later".into()),
            later,
            PublishOptions::default(),
        )
        .expect("publish");
        let text = render(&core, &figures());
        assert!(
            text.contains("# TYPE rosetta_queue_depth gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("rosetta_queue_depth{queue=\"orders\\\"x\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("rosetta_queue_enqueued_total{queue=\"orders\\\"x\"} 2\n"));
        assert!(
            text.contains("rosetta_queue_scheduled{queue=\"later\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("rosetta_queue_depth{queue=\"later\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("rosetta_connections 3\n"));
        assert!(text.contains("rosetta_connections_unauthenticated 1\n"));
        assert!(text.contains("rosetta_connections_refused_total 4\n"));
        assert!(text.contains("rosetta_memory_budget_bytes 1048576\n"));
        assert!(text.contains("rosetta_producers_blocked 0\n"), "{text}");
        assert!(
            !text.contains("rosetta_disk_free_bytes"),
            "no disk limit set"
        );
        // Every sample line is `name[{labels}] number`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().expect("value");
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }

    #[test]
    fn a_disk_short_of_its_limit_shows_as_blocked_producers() {
        let core = Core::new(
            rosetta_core::CoreConfig {
                disk_free_min: Some(rosetta_core::DiskFreeMin {
                    dir: std::env::temp_dir(),
                    bytes: u64::MAX,
                }),
                ..rosetta_core::CoreConfig::default()
            },
            Arc::new(rosetta_core::NoJournal),
            Arc::new(rosetta_core::AllowAll),
            None,
        );
        let figures = BrokerFigures {
            connections: 0,
            authenticated: 0,
            unauthenticated: 0,
            refused_total: 0,
            parked: 0,
            parked_resumes_total: 0,
            memory_budget_bytes: 1 << 20,
            store: StoreStats::default(),
        };
        let text = render(&core, &figures);
        assert!(text.contains("rosetta_producers_blocked 1\n"), "{text}");
        let free = text
            .lines()
            .find_map(|l| l.strip_prefix("rosetta_disk_free_bytes "))
            .and_then(|v| v.parse::<u64>().ok());
        assert!(free.is_some_and(|f| f > 0), "{text}");
    }
}
