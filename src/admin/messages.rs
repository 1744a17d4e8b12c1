//! A queue's messages: `GET /api/v1/queues/{name}/messages` (peek at the
//! first ones without taking them), `POST .../move` (to another queue) and
//! `POST .../replay` (a dead-letter queue's messages back to the queue
//! each left, which the core records as `x-original-queue` when it
//! dead-letters). A move is durable before the answer: the copy and the
//! original's removal are one journal append (`rosetta_core`'s
//! `admin_messages` module says the order of writes).

use base64ct::Encoding;
use rosetta_core::{MoveTarget, PeekedMessage};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::{durable, Api, Call, Reply};
use crate::error::ApiError;

/// Messages a peek shows at most: a console page, and a bound on the
/// answer (with the preview cap, under a megabyte).
pub const PEEK_COUNT_MAX: usize = 100;
/// Messages a peek shows when `?count=` is absent.
pub const PEEK_COUNT_DEFAULT: usize = 10;
/// Payload bytes a peeked message shows at most: enough to recognise a
/// message, not a way to download large ones.
pub const PEEK_PAYLOAD_PREVIEW_MAX_BYTES: usize = 4_096;
/// Messages one move or replay takes at most: it holds the source queue's
/// lock while choosing them and writes them in one journal append. Repeat
/// the request for more.
pub const MOVE_COUNT_MAX: usize = 10_000;

fn peeked(m: &PeekedMessage) -> Value {
    let msg = &m.message;
    let bytes = &msg.body.bytes;
    let cut = &bytes[..bytes.len().min(PEEK_PAYLOAD_PREVIEW_MAX_BYTES)];
    // A cut in the middle of a character is still text up to it.
    let (encoding, payload) = match std::str::from_utf8(cut) {
        Ok(text) => ("utf-8", text.to_owned()),
        Err(e) if bytes.len() > cut.len() && e.error_len().is_none() => (
            "utf-8",
            String::from_utf8_lossy(&cut[..e.valid_up_to()]).into_owned(),
        ),
        Err(_) => ("base64", base64ct::Base64::encode_string(cut)),
    };
    let properties: Map<String, Value> = msg
        .properties
        .iter()
        .map(|(k, v)| (k.to_owned(), Value::String(v.to_text())))
        .collect();
    json!({
        "id": m.seq,
        "size": bytes.len(),
        "redelivered": m.redelivered,
        "delivery_count": m.delivery_count,
        "priority": msg.priority,
        "durable": msg.durable,
        "message_id": msg.message_id.as_ref().map(|i| i.to_text()),
        "correlation_id": msg.correlation_id.as_ref().map(|i| i.to_text()),
        "content_type": msg.content_type,
        "properties": properties,
        "payload_encoding": encoding,
        "payload": payload,
        "payload_truncated": bytes.len() > cut.len(),
    })
}

/// `?count=` or a body's `count`: 1 to `max`.
fn count(value: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    match value.unwrap_or(default) {
        n @ 1.. if n <= max => Ok(n),
        _ => Err(ApiError::bad_request(format!("count must be 1 to {max}"))),
    }
}

pub(crate) fn peek(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param();
    let asked = match call.query.get("count") {
        None => None,
        Some(v) => Some(
            v.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("count must be a number: {v:?}")))?,
        ),
    };
    let n = count(asked, PEEK_COUNT_DEFAULT, PEEK_COUNT_MAX)?;
    let found = api.broker.core().peek_queue(name, n)?;
    Ok(Reply::ok(json!({
        "name": name,
        "messages": found.messages.iter().map(peeked).collect::<Vec<_>>(),
        "paged": found.paged,
    })))
}

/// The body of `POST /api/v1/queues/{name}/move`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveRequest {
    /// The queue to move to.
    to: String,
    /// At most this many (default and cap [`MOVE_COUNT_MAX`]).
    count: Option<usize>,
}

/// The body of `POST /api/v1/queues/{name}/replay` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    count: Option<usize>,
}

pub(crate) async fn move_to(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let wanted: MoveRequest = call.json(None)?;
    let n = count(wanted.count, MOVE_COUNT_MAX, MOVE_COUNT_MAX)?;
    moved(api, call, MoveTarget::Queue(&wanted.to), n).await
}

pub(crate) async fn replay(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let wanted: ReplayRequest = call.json(Some(ReplayRequest::default()))?;
    let n = count(wanted.count, MOVE_COUNT_MAX, MOVE_COUNT_MAX)?;
    moved(api, call, MoveTarget::OriginalQueue, n).await
}

async fn moved(
    api: &Api,
    call: &Call<'_>,
    to: MoveTarget<'_>,
    n: usize,
) -> Result<Reply, ApiError> {
    let name = call.matched.param();
    let core = api.broker.core();
    let done = durable(|done| core.move_messages(name, to, n, done)).await?;
    tracing::info!(queue = %name, ?to, moved = done.moved, left = done.left, user = ?call.user, "admin API: messages moved");
    Ok(Reply::ok(
        json!({"name": name, "moved": done.moved, "left": done.left}),
    ))
}
