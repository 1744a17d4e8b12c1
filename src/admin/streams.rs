//! `/api/v1/streams`: stream logs with their offsets, size, readers, and
//! each consumer group's committed offset and lag (docs/streams.md).
//!
//! A listing is of logs: a partitioned stream `orders` is listed as its
//! logs `orders-0`, `orders-1`..., each saying `partition_of`. `GET` of
//! `orders` itself answers with its partitions and their totals.

use rosetta_core::{StreamGroupStats, StreamStats};
use serde_json::{json, Value};

use crate::api::{Api, Call, Reply};
use crate::error::ApiError;
use crate::listing::PageRequest;

fn group_json(g: &StreamGroupStats) -> Value {
    json!({
        "name": g.name,
        "committed_offset": g.committed_offset,
        "lag": g.lag,
    })
}

/// A log's item in listings and `GET`.
fn item(s: &StreamStats) -> Value {
    json!({
        "name": s.name,
        "partition_of": s.partition_of,
        "first_offset": s.first_offset,
        "next_offset": s.next_offset,
        "messages": s.messages,
        "bytes": s.bytes,
        "segments": s.segments,
        "readers": s.readers,
        "appended_since_open": s.appended_since_open,
        "segments_deleted_since_open": s.segments_deleted_since_open,
        "groups": s.groups.iter().map(group_json).collect::<Vec<_>>(),
    })
}

pub(crate) fn list(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let page = PageRequest::from_query(&call.query)?;
    let found = api
        .broker
        .core()
        .stream_page(page.name.as_deref(), page.skip(), page.page_size)?;
    let items = found.items.iter().map(item).collect();
    Ok(Reply::ok(page.answer(items, found.total)))
}

pub(crate) fn get(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param();
    let core = api.broker.core();
    if let Some(stats) = core.stream_stats(name)? {
        return Ok(Reply::ok(item(&stats)));
    }
    let Some(parts) = core.stream_partitions(name)? else {
        return Err(ApiError::not_found(format!("no stream '{name}'")));
    };
    let used: Vec<&StreamStats> = parts.iter().flatten().collect();
    let sum = |f: fn(&StreamStats) -> u64| used.iter().map(|s| f(s)).sum::<u64>();
    Ok(Reply::ok(json!({
        "name": name,
        "partitions": parts.len(),
        "messages": sum(|s| s.messages),
        "bytes": sum(|s| s.bytes),
        "segments": sum(|s| s.segments),
        // A partition not used since it was configured has no log yet.
        "logs": parts
            .iter()
            .map(|p| p.as_ref().map_or(Value::Null, item))
            .collect::<Vec<_>>(),
    })))
}
