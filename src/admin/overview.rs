//! `GET /api/v1/overview`: the broker at a glance, from counters that
//! exist anyway (no per-queue work: 100,000 queues cost their count).
//! Rates and sync latencies are over the last seconds, from the server's
//! once-a-second samples (`BrokerView::recent_activity`).

use std::collections::BTreeMap;

use rosetta_server::BrokerView;
use serde_json::{json, Value};

/// This machine's name, read once (the cluster's node name when there is
/// one; for now the host's).
fn node_name() -> &'static str {
    static NODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NODE.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned())
    })
}

pub(crate) fn overview(broker: &BrokerView) -> Value {
    let figures = broker.figures();
    let core = broker.core();
    let mut by_protocol: BTreeMap<&str, u64> = BTreeMap::new();
    let mut by_transport: BTreeMap<&str, u64> = BTreeMap::new();
    for (protocol, transport) in broker.connections().kinds() {
        *by_protocol.entry(protocol).or_default() += 1;
        *by_transport.entry(transport).or_default() += 1;
    }
    let s = &figures.store;
    let traffic = core.traffic();
    let recent = broker.recent_activity();
    let listeners: BTreeMap<&str, String> = broker
        .listeners()
        .iter()
        .map(|(kind, addr)| (kind.key(), addr.to_string()))
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "node": node_name(),
        "uptime_s": broker.uptime().as_secs(),
        "ready": broker.ready(),
        "connections": {
            "open": figures.connections,
            "authenticated": figures.authenticated,
            "unauthenticated": figures.unauthenticated,
            "refused_total": figures.refused_total,
            "by_protocol": by_protocol,
            "by_transport": by_transport,
        },
        "listeners": listeners,
        "queues": {"count": core.queue_count()},
        "memory": {
            "budget_bytes": figures.memory_budget_bytes,
            "used_bytes": core.memory_used(),
            "paged_messages": core.messages_paged(),
            "producers_blocked": core.producers_blocked(),
        },
        "messages": {
            "published_total": traffic.published,
            "delivered_total": traffic.delivered,
            "acknowledged_total": traffic.acknowledged,
            "rates": {
                "window_s": recent.window_s,
                "published_per_s": recent.published_per_s,
                "delivered_per_s": recent.delivered_per_s,
                "acknowledged_per_s": recent.acknowledged_per_s,
            },
        },
        "disk_free_bytes": core.disk_free_bytes(),
        "journal": {
            "bytes": s.bytes,
            "segments": s.segments,
            "commits_total": s.commits,
            "batches_total": s.batches,
            "syncs_total": s.syncs,
            "pending_bytes": s.pending_bytes,
            "sync_latency": {
                "window_s": recent.window_s,
                "syncs": recent.syncs,
                "p50_us": recent.sync_p50_us,
                "p99_us": recent.sync_p99_us,
            },
        },
    })
}
