//! `$SYS/broker/...`: the broker's figures as retained MQTT messages, the
//! topics and payloads Mosquitto publishes (plain decimal text; the uptime
//! as "N seconds"), refreshed every `[sys] interval_s` (0: none).
//!
//! Only values that changed since the last refresh are published, so an
//! idle broker writes one retained message (the uptime) per interval.
//! Reading them is a permission like any other: a subscription filter
//! starting with a wildcard does not match `$SYS` topics (MQTT), and a
//! permission reaches them only as the bare pattern `#` or one that names
//! `/topic/$SYS/...` (`users::permissions`).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::Shared;

/// The topics and what each holds, now.
fn figures(shared: &Shared) -> [(&'static str, String); 7] {
    let traffic = shared.core.traffic();
    [
        (
            "$SYS/broker/version",
            format!("rosetta version {}", env!("CARGO_PKG_VERSION")),
        ),
        (
            "$SYS/broker/uptime",
            format!("{} seconds", shared.started.elapsed().as_secs()),
        ),
        (
            "$SYS/broker/clients/connected",
            shared.admission.authenticated().to_string(),
        ),
        (
            "$SYS/broker/messages/received",
            traffic.published.to_string(),
        ),
        ("$SYS/broker/messages/sent", traffic.delivered.to_string()),
        (
            "$SYS/broker/retained messages/count",
            shared.core.retained_count().to_string(),
        ),
        (
            "$SYS/broker/store/messages/bytes",
            shared.core.memory_used().to_string(),
        ),
    ]
}

/// Publishes what changed since `last` (and remembers it).
fn refresh(shared: &Shared, last: &mut HashMap<&'static str, String>) {
    for (topic, value) in figures(shared) {
        if last.get(topic) == Some(&value) {
            continue;
        }
        match shared.core.publish_retained_as_broker(topic, value.clone()) {
            Ok(_) => {
                last.insert(topic, value);
            }
            // Refused only when the core stops or the store failed; the
            // next refresh tries again.
            Err(e) => tracing::debug!(topic, error = %e, "$SYS refresh skipped"),
        }
    }
}

/// Refreshes the topics now and every `[sys] interval_s` until the broker
/// stops accepting or is gone; nothing when the interval is 0.
pub(crate) fn spawn(shared: &Arc<Shared>, stopping: watch::Receiver<bool>) {
    let Some(every) = shared.config.sys.interval() else {
        return;
    };
    let mut last = HashMap::new();
    crate::periodic::spawn(shared, every, stopping, move |shared| {
        refresh(shared, &mut last);
    });
}
