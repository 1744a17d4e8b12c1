//! `/api/v1/topics` (retained messages: list, clear one) and
//! `/api/v1/subscriptions` (the bindings of queues to topic filters).

use serde_json::{json, Value};

use crate::api::{durable, Api, Call, Reply};
use crate::error::ApiError;
use crate::listing::PageRequest;

pub(crate) fn list_retained(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let page = PageRequest::from_query(&call.query)?;
    let found = api
        .broker
        .core()
        .retained_page(page.name.as_deref(), page.skip(), page.page_size);
    let items: Vec<Value> = found
        .items
        .iter()
        .map(|(topic, m)| {
            json!({
                "topic": topic,
                "size": m.body.bytes.len(),
                "qos": m.guarantee.qos(),
                "content_type": m.content_type,
            })
        })
        .collect();
    Ok(Reply::ok(page.answer(items, found.total)))
}

pub(crate) async fn delete_retained(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let topic = call.matched.param();
    let core = api.broker.core();
    durable(|done| core.delete_retained(topic, done)).await?;
    tracing::info!(topic = %topic, user = ?call.user, "admin API: retained message cleared");
    Ok(Reply::no_content())
}

pub(crate) fn list_subscriptions(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let page = PageRequest::from_query(&call.query)?;
    let found =
        api.broker
            .core()
            .subscription_page(page.name.as_deref(), page.skip(), page.page_size);
    let items = found.items.iter().map(subscription).collect();
    Ok(Reply::ok(page.answer(items, found.total)))
}

/// A subscription's item (also in a session's).
pub(crate) fn subscription(s: &rosetta_core::Subscription) -> Value {
    json!({
        "queue": s.queue,
        "filter": s.filter,
        "qos": s.options.max_guarantee.qos(),
        "no_local": s.options.no_local,
        "retain_as_published": s.options.retain_as_published,
        "subscription_id": s.options.subscription_id,
    })
}
