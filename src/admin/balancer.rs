//! `GET /api/v1/balancer/target?key=...&protocol=mqtt&transport=ws`:
//! where a client with this target key should connect, for clients that
//! cannot follow a redirect at connect (a browser choosing its WebSocket
//! URL). The same balancer as at connect answers (docs/cluster.md).

use rosetta_server::discovery::Discovery;
use serde_json::json;

use crate::api::{Api, Call, Reply};
use crate::error::ApiError;

/// Longest key accepted: client ids and user names are short; this only
/// bounds what a request makes the balancer hash.
pub const TARGET_KEY_MAX_BYTES: usize = 1024;

pub(crate) fn target(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let key = call
        .query
        .get("key")
        .filter(|k| !k.is_empty())
        .ok_or_else(|| ApiError::bad_request("the query needs key=..."))?;
    if key.len() > TARGET_KEY_MAX_BYTES {
        return Err(ApiError::bad_request(format!(
            "key longer than {TARGET_KEY_MAX_BYTES} bytes"
        )));
    }
    let protocol = call.query.get("protocol").unwrap_or("mqtt");
    let transport = call.query.get("transport").unwrap_or("tcp");
    match api.broker.balancer_target(key, protocol, transport) {
        Discovery::Off => Err(ApiError::not_found(
            "clustering is off on this node (no [cluster])",
        )),
        Discovery::Unknown(reason) => Err(ApiError::bad_request(reason)),
        Discovery::Unavailable => Err(ApiError::unavailable(
            "no node of the cluster is ready to take this client",
        )),
        Discovery::Target(t) => Ok(Reply::ok(json!({
            "node": t.node,
            "host": t.host,
            "port": t.port,
            "protocol": protocol,
            "transport": transport,
        }))),
    }
}
