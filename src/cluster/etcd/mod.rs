//! A minimal etcd v3 client over etcd's JSON gateway (`/v3/...` on the
//! client port, served by etcd 3.4 and later).
//!
//! Why not the `etcd-client` crate: it is gRPC, which brings tonic, prost,
//! hyper, h2 and tower (about forty crates, minutes of build on a small
//! machine, and `protoc` at build time), for the six calls membership
//! makes: grant, keep alive and revoke a lease, put, range over a prefix,
//! watch a prefix. The gateway does each as one JSON POST; keys and values
//! travel base64-encoded and 64-bit numbers as strings.
//!
//! Every call opens its own connection and tries the endpoints in order
//! until one answers, so an etcd cluster member going away is survived
//! like a single one coming back.

#[doc(hidden)]
pub mod fuzzing;
mod http;

use std::time::Duration;

use base64ct::{Base64, Encoding};
use serde_json::{json, Value};

/// How long one call may take, connect to last byte, by default: well
/// under a lease's TTL, so a keep-alive that hangs is noticed in time.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 1500;

/// Why an etcd call failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint could be reached, or the connection broke.
    #[error("etcd unreachable: {0}")]
    Io(#[from] std::io::Error),
    /// The call took longer than the request timeout.
    #[error("etcd did not answer in time")]
    Timeout,
    /// An answer that is not HTTP as expected.
    #[error("etcd HTTP: {0}")]
    Http(String),
    /// etcd answered with an error.
    #[error("etcd answered {status}: {message}")]
    Status {
        /// HTTP status.
        status: u16,
        /// etcd's message.
        message: String,
    },
    /// An answer whose JSON is not what the gateway sends.
    #[error("etcd answer malformed: {0}")]
    Malformed(String),
    /// An endpoint that is not `http://host:port`.
    #[error("etcd endpoint {0:?}: only http://host:port is supported")]
    Endpoint(String),
}

/// One key and value under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
}

/// A client of one etcd cluster.
#[derive(Debug, Clone)]
pub struct Client {
    /// `host:port` of each endpoint, in the order given.
    authorities: Vec<String>,
    timeout: Duration,
}

impl Client {
    /// A client of `endpoints` (`http://host:port`).
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<Self, EtcdError> {
        let authorities = endpoints
            .iter()
            .map(|e| {
                let rest = e
                    .strip_prefix("http://")
                    .ok_or_else(|| EtcdError::Endpoint(e.clone()))?;
                let authority = rest.trim_end_matches('/');
                if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
                    return Err(EtcdError::Endpoint(e.clone()));
                }
                Ok(authority.to_owned())
            })
            .collect::<Result<Vec<_>, _>>()?;
        if authorities.is_empty() {
            return Err(EtcdError::Endpoint(String::new()));
        }
        Ok(Self {
            authorities,
            timeout,
        })
    }

    /// Grants a lease of `ttl_s` seconds; its id.
    pub async fn grant(&self, ttl_s: u64) -> Result<i64, EtcdError> {
        let v = self
            .call("/v3/lease/grant", &json!({ "TTL": ttl_s.to_string() }))
            .await?;
        number(&v, "ID")
    }

    /// Refreshes a lease; the TTL it has now, 0 when it expired.
    pub async fn keep_alive(&self, lease: i64) -> Result<i64, EtcdError> {
        let v = self
            .call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))
            .await?;
        Ok(keep_alive_ttl(&v))
    }

    /// Revokes a lease, deleting its keys.
    pub async fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .await
            .map(drop)
    }

    /// Puts `key` = `value`, attached to `lease` (0: none).
    pub async fn put(&self, key: &[u8], value: &[u8], lease: i64) -> Result<(), EtcdError> {
        let mut body =
            json!({ "key": Base64::encode_string(key), "value": Base64::encode_string(value) });
        if lease != 0 {
            body["lease"] = Value::String(lease.to_string());
        }
        self.call("/v3/kv/put", &body).await.map(drop)
    }

    /// Puts `key` = `value` under `lease` unless the key exists: `None`
    /// when it was put, else the value already there (one transaction, so
    /// of several nodes putting the same key at once exactly one wins).
    pub async fn put_if_absent(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<Option<Vec<u8>>, EtcdError> {
        let key64 = Base64::encode_string(key);
        let mut put = json!({ "key": key64, "value": Base64::encode_string(value) });
        if lease != 0 {
            put["lease"] = Value::String(lease.to_string());
        }
        let body = json!({
            "compare": [{ "key": key64, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
            "success": [{ "request_put": put }],
            "failure": [{ "request_range": { "key": key64 } }],
        });
        let v = self.call("/v3/kv/txn", &body).await?;
        Ok(put_if_absent_answer(&v))
    }

    /// Every key under `prefix`, and the store revision they were read at.
    pub async fn range_prefix(&self, prefix: &[u8]) -> Result<(i64, Vec<KeyValue>), EtcdError> {
        let body = json!({
            "key": Base64::encode_string(prefix),
            "range_end": Base64::encode_string(&prefix_end(prefix)),
        });
        let v = self.call("/v3/kv/range", &body).await?;
        range_answer(&v)
    }

    /// Watches every key under `prefix` from `start_revision`.
    pub async fn watch_prefix(
        &self,
        prefix: &[u8],
        start_revision: i64,
    ) -> Result<Watch, EtcdError> {
        let body = json!({ "create_request": {
            "key": Base64::encode_string(prefix),
            "range_end": Base64::encode_string(&prefix_end(prefix)),
            "start_revision": start_revision.to_string(),
        }});
        let bytes = body.to_string().into_bytes();
        let mut last = None;
        for authority in &self.authorities {
            match http::post(authority, "/v3/watch", &bytes, self.timeout).await {
                Ok(r) if r.status == 200 => return Ok(Watch { response: r }),
                Ok(r) => {
                    last = Some(EtcdError::Status {
                        status: r.status,
                        message: "watch refused".into(),
                    })
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(EtcdError::Timeout))
    }

    /// One POST to the first endpoint that answers.
    async fn call(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let bytes = body.to_string().into_bytes();
        let mut last = None;
        for authority in &self.authorities {
            match self.call_one(authority, path, &bytes).await {
                Ok(v) => return Ok(v),
                // etcd said no: another member would say the same.
                Err(e @ EtcdError::Status { .. }) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(EtcdError::Timeout))
    }

    async fn call_one(&self, authority: &str, path: &str, body: &[u8]) -> Result<Value, EtcdError> {
        let response = http::post(authority, path, body, self.timeout).await?;
        let status = response.status;
        let bytes = response.body(self.timeout).await?;
        answer(path, status, &bytes)
    }
}

/// The JSON of a call's answer, or etcd's error when `status` is not 200.
fn answer(path: &str, status: u16, bytes: &[u8]) -> Result<Value, EtcdError> {
    // A streamed answer (keep-alive) is one JSON message and a newline.
    let v: Value = serde_json::from_slice(trim(bytes))
        .map_err(|e| EtcdError::Malformed(format!("{path}: {e}")))?;
    if status != 200 {
        let message = v
            .get("message")
            .or_else(|| v.get("error"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        return Err(EtcdError::Status { status, message });
    }
    Ok(v)
}

/// The TTL a keep-alive answer gives the lease, 0 when it expired.
fn keep_alive_ttl(v: &Value) -> i64 {
    // A stream of one: `{"result": {...}}`. An expired lease has no TTL.
    let result = v.get("result").unwrap_or(v);
    number(result, "TTL").unwrap_or(0)
}

/// What [`Client::put_if_absent`] answers for the transaction's answer.
fn put_if_absent_answer(v: &Value) -> Option<Vec<u8>> {
    // The gateway leaves out a false `succeeded`.
    if v.get("succeeded").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let kv = v
        .get("responses")
        .and_then(|r| r.get(0))
        .and_then(|r| r.get("response_range"))
        .and_then(|r| r.get("kvs"))
        .and_then(|kvs| kvs.get(0));
    match kv {
        Some(kv) => Some(bytes_field(kv, "value").unwrap_or_default()),
        // Gone between the compare and the range: nothing to adopt.
        None => Some(Vec::new()),
    }
}

/// The revision and the keys of a range's answer.
fn range_answer(v: &Value) -> Result<(i64, Vec<KeyValue>), EtcdError> {
    let revision = v
        .get("header")
        .map(|h| number(h, "revision"))
        .transpose()?
        .unwrap_or(0);
    let mut out = Vec::new();
    if let Some(kvs) = v.get("kvs").and_then(Value::as_array) {
        for kv in kvs {
            out.push(KeyValue {
                key: bytes_field(kv, "key")?,
                value: bytes_field(kv, "value").unwrap_or_default(),
            });
        }
    }
    Ok((revision, out))
}

/// An open watch: a stream of change notifications.
pub struct Watch {
    response: http::Response,
}

/// One change a watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// `key` was put with `value`.
    Put {
        /// The key.
        key: Vec<u8>,
        /// Its new value.
        value: Vec<u8>,
    },
    /// `key` was deleted (or its lease expired).
    Delete {
        /// The key.
        key: Vec<u8>,
    },
}

impl Watch {
    /// Waits for the next change notification; `Ok(false)` when etcd ended
    /// the watch (the caller starts over with a range).
    pub async fn changed(&mut self) -> Result<bool, EtcdError> {
        Ok(self.events().await?.is_some())
    }

    /// Waits for the next changes; `None` when etcd ended the watch (the
    /// caller starts over with a range).
    pub async fn events(&mut self) -> Result<Option<Vec<WatchEvent>>, EtcdError> {
        loop {
            let Some(line) = self.response.next_line().await? else {
                return Ok(None);
            };
            match watch_message(&line)? {
                WatchMessage::Ended => return Ok(None),
                WatchMessage::Confirmed => continue,
                WatchMessage::Events(events) => return Ok(Some(events)),
            }
        }
    }
}

/// What one message of a watch's stream says.
#[derive(Debug, PartialEq, Eq)]
enum WatchMessage {
    /// etcd canceled the watch or failed it.
    Ended,
    /// No events (the first message only confirms the watch was created).
    Confirmed,
    /// Changes.
    Events(Vec<WatchEvent>),
}

fn watch_message(line: &[u8]) -> Result<WatchMessage, EtcdError> {
    let v: Value =
        serde_json::from_slice(line).map_err(|e| EtcdError::Malformed(format!("watch: {e}")))?;
    let result = v.get("result").unwrap_or(&v);
    if result.get("canceled").and_then(Value::as_bool) == Some(true) || v.get("error").is_some() {
        return Ok(WatchMessage::Ended);
    }
    let Some(events) = result.get("events").and_then(Value::as_array) else {
        return Ok(WatchMessage::Confirmed);
    };
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        let Some(kv) = e.get("kv") else { continue };
        let key = bytes_field(kv, "key")?;
        // A put's type is left out (it is the enum's zero).
        out.push(match e.get("type").and_then(Value::as_str) {
            Some("DELETE") => WatchEvent::Delete { key },
            _ => WatchEvent::Put {
                key,
                value: bytes_field(kv, "value").unwrap_or_default(),
            },
        });
    }
    Ok(WatchMessage::Events(out))
}

/// The end of the range of keys starting with `prefix` (etcd's
/// convention: the prefix with its last byte below 0xff incremented).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): every key from the prefix on.
    vec![0]
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &bytes[start..end.max(start)]
}

/// A 64-bit number field, which the gateway sends as a string.
fn number(v: &Value, field: &str) -> Result<i64, EtcdError> {
    match v.get(field) {
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| EtcdError::Malformed(format!("{field}: {s:?}"))),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| EtcdError::Malformed(format!("{field}: {n}"))),
        _ => Err(EtcdError::Malformed(format!("no {field}"))),
    }
}

fn bytes_field(v: &Value, field: &str) -> Result<Vec<u8>, EtcdError> {
    let s = v
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| EtcdError::Malformed(format!("no {field}")))?;
    Base64::decode_vec(s).map_err(|e| EtcdError::Malformed(format!("{field}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_end_of_a_prefix() {
        assert_eq!(prefix_end(b"/r/"), b"/r0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn only_http_endpoints() {
        let t = Duration::from_secs(1);
        assert!(Client::new(&["http://127.0.0.1:2379".into()], t).is_ok());
        assert!(Client::new(&["https://127.0.0.1:2379".into()], t).is_err());
        assert!(Client::new(&["127.0.0.1:2379".into()], t).is_err());
        assert!(Client::new(&[], t).is_err());
    }
}
