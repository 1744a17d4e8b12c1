//! Entry point for the cargo-fuzz target
//! `src/cluster/fuzz/fuzz_targets/etcd_http.rs`; not an API (hidden from
//! the docs, kept to what the target needs).
//!
//! [`read_response`] is what an etcd endpoint's bytes reach in the client:
//! the response head, the body (length, chunked or until the close) read
//! whole as a call reads it or as a watch's stream of messages, and the
//! JSON decoders of every call's answer. The target supplies the endpoint
//! as an in-memory stream.

use std::time::Duration;

use tokio::io::AsyncRead;

use super::http;

/// The largest body, or message of a watch, the client takes.
pub const BODY_BYTES_MAX: usize = http::BODY_BYTES_MAX;
/// The most the client reads from the socket at once.
pub const READ_CHUNK_BYTES: usize = http::READ_CHUNK_BYTES;

/// How a response is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Whole, as a call's answer.
    Call,
    /// As a watch's stream of newline-separated messages.
    Watch,
}

/// What the client made of one response.
#[derive(Debug, PartialEq, Eq)]
pub struct ResponseReading {
    /// The status, or why the head was refused.
    pub status: Result<u16, String>,
    /// The whole body (a call), or each message (a watch), in order.
    pub messages: Vec<Vec<u8>>,
    /// `Ok` at the body's end, else why reading stopped.
    pub end: Result<(), String>,
    /// What the decoders made of it: for a call, the answer and each
    /// call's reading of it; for a watch, each message's reading.
    pub decoded: Vec<String>,
}

/// Reads one response from `io` as `reading` says. Never times out: the
/// target polls it by hand and stops when the stream stalls.
pub async fn read_response<S: AsyncRead + Unpin>(io: S, reading: Reading) -> ResponseReading {
    let mut out = ResponseReading {
        status: Err(String::new()),
        messages: Vec::new(),
        end: Ok(()),
        decoded: Vec::new(),
    };
    let mut response = match http::read_head(io).await {
        Ok(response) => response,
        Err(e) => {
            out.status = Err(e.to_string());
            return out;
        }
    };
    out.status = Ok(response.status);
    match reading {
        Reading::Call => match response.body(Duration::MAX).await {
            Ok(body) => {
                decode_call(response_status(&out), &body, &mut out.decoded);
                out.messages.push(body);
            }
            Err(e) => out.end = Err(e.to_string()),
        },
        Reading::Watch => loop {
            match response.next_line().await {
                Ok(Some(line)) => {
                    out.decoded
                        .push(format!("{:?}", super::watch_message(&line)));
                    out.messages.push(line);
                }
                Ok(None) => break,
                Err(e) => {
                    out.end = Err(e.to_string());
                    break;
                }
            }
        },
    }
    out
}

fn response_status(reading: &ResponseReading) -> u16 {
    reading.status.as_ref().copied().unwrap_or(0)
}

/// Every call's reading of one answer, as the client's methods make it.
fn decode_call(status: u16, body: &[u8], decoded: &mut Vec<String>) {
    let answer = super::answer("/v3/fuzz", status, body);
    decoded.push(format!("{answer:?}"));
    if let Ok(v) = answer {
        decoded.push(format!("grant {:?}", super::number(&v, "ID")));
        decoded.push(format!("keep_alive {:?}", super::keep_alive_ttl(&v)));
        decoded.push(format!("txn {:?}", super::put_if_absent_answer(&v)));
        decoded.push(format!("range {:?}", super::range_answer(&v)));
    }
}
