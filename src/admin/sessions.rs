//! `/api/v1/sessions`: MQTT sessions (list, get, delete). An MQTT session
//! is the core queue `$mqtt/<client id>` (see `rosetta-mqtt`'s crate
//! docs), durable when the session outlives the connection (a persistent
//! session), with its subscriptions as the queue's bindings and its
//! packet-id state under the client's `put_state` keys.

use rosetta_neutral::Protocol;
use serde_json::{json, Value};

use crate::api::{Api, Call, Reply};
use crate::error::ApiError;
use crate::listing::PageRequest;
use crate::topics::subscription;

/// The prefix of an MQTT session's queue (`rosetta-mqtt` names them so).
pub const MQTT_SESSION_QUEUE_PREFIX: &str = "$mqtt/";

fn item(api: &Api, client_id: &str, stats: &rosetta_core::QueueStats, durable: bool) -> Value {
    let core = api.broker.core();
    let queue = format!("{MQTT_SESSION_QUEUE_PREFIX}{client_id}");
    let subscriptions: Vec<Value> = core
        .queue_bindings(&queue)
        .unwrap_or_default()
        .iter()
        .map(subscription)
        .collect();
    json!({
        "client_id": client_id,
        "protocol": "mqtt",
        "persistent": durable,
        "connected": core.client_connected(Protocol::Mqtt, client_id),
        "queue": queue,
        "depth": stats.depth,
        "in_flight": stats.in_flight,
        "subscriptions": subscriptions,
    })
}

pub(crate) fn list(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let page = PageRequest::from_query(&call.query)?;
    let core = api.broker.core();
    // Unfiltered, the core pages the session queues itself; filtered by
    // client id, every session queue is looked at for the total.
    let (skip, take) = match page.name {
        None => (page.skip(), page.page_size),
        Some(_) => (0, usize::MAX),
    };
    let found = core.queue_page(Some(MQTT_SESSION_QUEUE_PREFIX), skip, take);
    let sessions: Vec<(&str, &rosetta_core::QueueStats)> = found
        .items
        .iter()
        .filter_map(|(q, s)| Some((q.strip_prefix(MQTT_SESSION_QUEUE_PREFIX)?, s)))
        .collect();
    let body = match page.name {
        None => {
            let items = sessions
                .iter()
                .map(|(id, s)| item(api, id, s, durable(api, id)))
                .collect();
            page.answer(items, found.total)
        }
        Some(_) => page.answer_all(
            sessions,
            |(id, _)| id,
            |(id, s)| item(api, id, s, durable(api, id)),
        ),
    };
    Ok(Reply::ok(body))
}

fn durable(api: &Api, client_id: &str) -> bool {
    api.broker
        .core()
        .queue_durable(&format!("{MQTT_SESSION_QUEUE_PREFIX}{client_id}"))
        .unwrap_or(false)
}

pub(crate) fn get(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let client_id = call.matched.param();
    let queue = format!("{MQTT_SESSION_QUEUE_PREFIX}{client_id}");
    let core = api.broker.core();
    match (core.queue_stats(&queue), core.queue_durable(&queue)) {
        (Some(stats), Some(durable)) => Ok(Reply::ok(item(api, client_id, &stats, durable))),
        _ => Err(ApiError::not_found(format!(
            "no MQTT session of client '{client_id}'"
        ))),
    }
}

/// Deletes a session that has no connection: its queue (messages and
/// subscriptions) and its saved state; the client's next CONNECT starts a
/// new session (`session present` 0). A connected client's session is
/// 409: closing the connection first is the operator's explicit choice.
pub(crate) fn delete(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let client_id = call.matched.param();
    let core = api.broker.core();
    if core.client_connected(Protocol::Mqtt, client_id) {
        return Err(ApiError::conflict(format!(
            "client '{client_id}' is connected; close its connection first"
        )));
    }
    let queue = format!("{MQTT_SESSION_QUEUE_PREFIX}{client_id}");
    core.delete_queue(&queue)
        .map_err(|_| ApiError::not_found(format!("no MQTT session of client '{client_id}'")))?;
    let forgotten = core.forget_client_state(Protocol::Mqtt, client_id);
    tracing::info!(client_id = %client_id, state_keys = forgotten, user = ?call.user, "admin API: MQTT session deleted");
    Ok(Reply::no_content())
}
