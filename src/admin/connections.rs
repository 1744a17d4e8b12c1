//! `/api/v1/connections`: list, and close one with a reason the client is
//! shown (MQTT 5 DISCONNECT 0x98 with a reason string, STOMP ERROR,
//! AMQP close with `amqp:connection:forced`; MQTT 3.1.1 is just closed).
//!
//! Each connection shown carries its message counts and `rates` (messages
//! in and out per second), sampled by the request that shows it (`rates`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::api::{Api, Call, Reply};
use crate::error::ApiError;
use crate::listing::PageRequest;
use crate::rates::round;

/// The header naming why a connection is closed (RabbitMQ's).
pub const REASON_HEADER: &str = "x-reason";
/// Longest reason, in bytes: it must fit a DISCONNECT or ERROR frame of
/// any client, and a reason is a sentence.
pub const REASON_MAX_BYTES: usize = 256;
/// What the client is told without an `X-Reason`.
pub const REASON_DEFAULT: &str = "closed by an administrator";

pub(crate) fn list(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let page = PageRequest::from_query(&call.query)?;
    let identities = api.broker.core().session_identities();
    let listed = api.broker.connections().list_with_counts();
    let rows: Vec<Value> = listed
        .iter()
        .map(|(c, counts)| {
            let who = identities.get(&c.id);
            json!({
                "id": c.id,
                "protocol": c.protocol,
                "transport": c.transport,
                "tls": c.tls,
                "peer": c.peer.to_string(),
                "user": who.and_then(|w| w.user.clone()),
                "client_id": who.and_then(|w| w.client_id.clone()),
                "connected_at_ms": c.connected_at_ms,
                "messages_in": counts.messages_in,
                "messages_out": counts.messages_out,
            })
        })
        .collect();
    // `name` matches the client id, the user or the peer address.
    let text = |row: &Value, key: &str| row[key].as_str().unwrap_or_default().to_owned();
    let matching: Vec<&Value> = rows
        .iter()
        .filter(|row| {
            ["client_id", "user", "peer"]
                .iter()
                .any(|key| page.matches(&text(row, key)))
        })
        .collect();
    let mut items: Vec<Value> = matching
        .iter()
        .skip(page.skip())
        .take(page.page_size)
        .map(|row| (*row).clone())
        .collect();
    // Rates only for the page's connections.
    // A connection's counters were zero when it connected: a first look
    // measures from then.
    let now = Instant::now();
    let now_ms = rosetta_neutral::message::now_ms();
    let sampled: Vec<(u64, Instant, [u64; 2])> = items
        .iter()
        .map(|row| {
            let count = |key: &str| row[key].as_u64().unwrap_or_default();
            let age = Duration::from_millis(now_ms.saturating_sub(count("connected_at_ms")));
            let since = now.checked_sub(age).unwrap_or(now);
            (
                count("id"),
                since,
                [count("messages_in"), count("messages_out")],
            )
        })
        .collect();
    let rates = api
        .connection_rates
        .observe(now, sampled.iter().map(|(id, since, c)| (id, *since, *c)));
    for (row, r) in items.iter_mut().zip(rates) {
        row["rates"] = json!({
            "window_s": round(r.window_s),
            "messages_in_per_s": round(r.per_s[0]),
            "messages_out_per_s": round(r.per_s[1]),
        });
    }
    Ok(Reply::ok(page.answer(items, matching.len())))
}

pub(crate) fn close(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let id = call.matched.param();
    let id: u64 = id
        .parse()
        .map_err(|_| ApiError::not_found(format!("no connection '{id}'")))?;
    let reason = match call.header(REASON_HEADER)? {
        None => REASON_DEFAULT.to_owned(),
        Some(text) => checked_reason(text)?,
    };
    if !api.broker.connections().close(id, reason.clone()) {
        return Err(ApiError::not_found(format!("no connection {id}")));
    }
    tracing::info!(conn = id, reason = %reason, user = ?call.user, "admin API: connection closed");
    Ok(Reply::no_content())
}

/// A reason as the client may be shown it: trimmed, not empty, no control
/// characters (a STOMP 1.0 header cannot escape a newline), bounded.
fn checked_reason(text: String) -> Result<String, ApiError> {
    let text = text.trim().to_owned();
    if text.is_empty() {
        return Ok(REASON_DEFAULT.to_owned());
    }
    if text.len() > REASON_MAX_BYTES {
        return Err(ApiError::bad_request(format!(
            "X-Reason is longer than {REASON_MAX_BYTES} bytes"
        )));
    }
    if text.chars().any(char::is_control) {
        return Err(ApiError::bad_request("X-Reason has control characters"));
    }
    Ok(text)
}
