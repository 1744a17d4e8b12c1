//! `/api/v1/queues`: list, get, create, purge, delete.
//!
//! Each queue shown carries `rates` (messages added, delivered and
//! acknowledged per second) from its own counters, sampled by the request
//! that shows it (`rates`): only the queues on the page cost anything.

use std::time::Instant;

use rosetta_core::QueueStats;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{durable, Api, Call, Reply};
use crate::error::ApiError;
use crate::listing::PageRequest;
use crate::rates::{round, Rates};

/// The counters a queue's rates are computed from, in the order of
/// [`rates_json`]'s names.
fn rate_counters(s: &QueueStats) -> [u64; 3] {
    [s.enqueued_total, s.deliveries_total, s.acked_total]
}

fn rates_json(r: &Rates<3>) -> Value {
    json!({
        "window_s": round(r.window_s),
        "published_per_s": round(r.per_s[0]),
        "delivered_per_s": round(r.per_s[1]),
        "acknowledged_per_s": round(r.per_s[2]),
    })
}

/// A queue's item in listings and `GET`.
fn item(name: &str, s: &QueueStats, rates: &Rates<3>) -> Value {
    json!({
        "name": name,
        "depth": s.depth,
        "ready": s.depth,
        "in_flight": s.in_flight,
        "scheduled": s.scheduled,
        "paged": s.paged,
        "consumers": s.consumers,
        "oldest_message_age_ms": s.oldest_age.map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX)),
        "enqueued_total": s.enqueued_total,
        "deliveries_total": s.deliveries_total,
        "redeliveries_total": s.redeliveries_total,
        "acked_total": s.acked_total,
        "dead_lettered_total": s.dead_lettered_total,
        "expired_total": s.expired_total,
        "rates": rates_json(rates),
    })
}

pub(crate) fn list(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let page = PageRequest::from_query(&call.query)?;
    let found = api
        .broker
        .core()
        .queue_page(page.name.as_deref(), page.skip(), page.page_size);
    let since = api.counting_since();
    let rates = api.queue_rates.observe(
        Instant::now(),
        found
            .items
            .iter()
            .map(|(n, s)| (n, since, rate_counters(s))),
    );
    let items = found
        .items
        .iter()
        .zip(&rates)
        .map(|((n, s), r)| item(n, s, r))
        .collect();
    Ok(Reply::ok(page.answer(items, found.total)))
}

pub(crate) fn get(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param();
    let core = api.broker.core();
    let (Some(stats), Some(durable)) = (core.queue_stats(name), core.queue_durable(name)) else {
        return Err(ApiError::not_found(format!("no queue '{name}'")));
    };
    let rates = api.queue_rates.observe_one(
        Instant::now(),
        api.counting_since(),
        &name.to_owned(),
        rate_counters(&stats),
    );
    let mut body = item(name, &stats, &rates);
    body["durable"] = json!(durable);
    Ok(Reply::ok(body))
}

/// The body of `PUT /api/v1/queues/{name}` (optional).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueSettings {
    /// Kept in the journal with its messages; default true.
    #[serde(default = "durable_default")]
    durable: bool,
}

fn durable_default() -> bool {
    true
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            durable: durable_default(),
        }
    }
}

pub(crate) async fn put(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param().to_owned();
    let wanted: QueueSettings = call.json(Some(QueueSettings::default()))?;
    let core = api.broker.core();
    if let Some(durable) = core.queue_durable(&name) {
        return same_or_conflict(&name, durable, wanted.durable);
    }
    let existed = durable(|done| core.create_queue(&name, wanted.durable, done)).await?;
    if existed {
        // Created meanwhile by someone else: compare with that one.
        let durable = core.queue_durable(&name).unwrap_or(wanted.durable);
        return same_or_conflict(&name, durable, wanted.durable);
    }
    tracing::info!(queue = %name, durable = wanted.durable, user = ?call.user, "admin API: queue created");
    Ok(Reply::created(
        json!({"name": name, "durable": wanted.durable}),
    ))
}

fn same_or_conflict(name: &str, durable: bool, wanted: bool) -> Result<Reply, ApiError> {
    if durable == wanted {
        Ok(Reply::ok(json!({"name": name, "durable": durable})))
    } else {
        Err(ApiError::conflict(format!(
            "queue '{name}' exists with durable = {durable}"
        )))
    }
}

pub(crate) async fn purge(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param();
    let core = api.broker.core();
    let purged = durable(|done| core.purge_queue(name, done)).await?;
    tracing::info!(queue = %name, removed = purged.removed, user = ?call.user, "admin API: queue purged");
    Ok(Reply::ok(json!({"name": name, "removed": purged.removed})))
}

pub(crate) fn delete(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param();
    api.broker.core().delete_queue(name)?;
    tracing::info!(queue = %name, user = ?call.user, "admin API: queue deleted");
    Ok(Reply::no_content())
}
