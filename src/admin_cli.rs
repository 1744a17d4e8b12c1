//! `rosetta queue ...`, `connection ...`, `user ...`, `role ...`: the CLI
//! side of the admin API. Each command is one or a few HTTP requests to a running
//! broker's API (`--url`, `--user`, `--password`), so the CLI can do
//! nothing the API cannot (issue 18).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context};
use base64ct::Encoding;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Where the API listens by default: `[admin] listen`'s default.
pub(crate) const URL_DEFAULT: &str = "http://127.0.0.1:8161";
/// Longest wait for one answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Page size of the listings the CLI walks (the API's maximum).
const PAGE_SIZE: usize = 1_000;

/// `user`'s password for the API, asked once without echo when standard
/// input is a terminal (a script without one gets an error naming the ways
/// to give it).
fn ask_password(user: &str) -> anyhow::Result<String> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        bail!("--user needs --password or ROSETTA_PASSWORD (or a terminal to ask on)");
    }
    let password = rpassword::prompt_password(format!("{user}'s password (admin API): "))?;
    anyhow::ensure!(!password.is_empty(), "empty password");
    Ok(password)
}

/// The API and who asks it.
pub(crate) struct Api {
    /// `host:port`.
    authority: String,
    authorization: Option<String>,
}

impl Api {
    /// `url` is `http://host:port`; with a user, the password is
    /// `password`, else `ROSETTA_PASSWORD`, else asked on the terminal;
    /// without one, the bearer token is `token`, else `ROSETTA_TOKEN`.
    pub(crate) fn new(
        url: &str,
        user: Option<&str>,
        password: Option<String>,
        token: Option<String>,
    ) -> anyhow::Result<Api> {
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("--url must start with http:// (the admin API has no TLS yet): {url}");
        };
        let authority = rest.trim_end_matches('/').to_owned();
        if authority.is_empty() || authority.contains('/') {
            bail!("--url must be http://host:port: {url}");
        }
        let authorization = match user {
            None => token
                .or_else(|| std::env::var("ROSETTA_TOKEN").ok())
                .map(|t| format!("Bearer {}", t.trim())),
            Some(user) => {
                let password = match password.or_else(|| std::env::var("ROSETTA_PASSWORD").ok()) {
                    Some(p) => p,
                    None => ask_password(user)?,
                };
                let pair = format!("{user}:{password}");
                Some(format!(
                    "Basic {}",
                    base64ct::Base64::encode_string(pair.as_bytes())
                ))
            }
        };
        Ok(Api {
            authority,
            authorization,
        })
    }

    /// One request without a body.
    async fn call(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Value> {
        self.send(method, path, headers, None).await
    }

    /// One request; an error answer becomes an error naming its reason.
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("connecting to the admin API at {}", self.authority))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.authority);
        if let Some(auth) = &self.authorization {
            req = req.header("authorization", auth);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let response = tokio::time::timeout(
            REQUEST_TIMEOUT,
            sender.send_request(req.body(Full::new(body))?),
        )
        .await
        .context("the admin API did not answer in time")??;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let value: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body)
                .context("the admin API answered something other than JSON")?
        };
        if !status.is_success() {
            let reason = value["reason"].as_str().unwrap_or_default();
            bail!("{status}: {reason}");
        }
        Ok(value)
    }

    /// Every item of a listing, page by page.
    async fn all(&self, path: &str, name: Option<&str>) -> anyhow::Result<Vec<Value>> {
        let mut items = Vec::new();
        for page in 1.. {
            let mut query = format!("{path}?page={page}&page_size={PAGE_SIZE}");
            if let Some(name) = name {
                query.push_str(&format!("&name={}", encode(name)));
            }
            let answer = self.call(Method::GET, &query, &[]).await?;
            let got = answer["items"].as_array().cloned().unwrap_or_default();
            let total = answer["total"].as_u64().unwrap_or(0) as usize;
            let empty = got.is_empty();
            items.extend(got);
            if empty || items.len() >= total {
                break;
            }
        }
        Ok(items)
    }
}

/// What the CLI asks.
pub(crate) enum AdminCommand {
    QueueList {
        name: Option<String>,
    },
    QueueStat {
        name: Option<String>,
    },
    QueuePurge {
        name: String,
    },
    QueueDelete {
        name: String,
    },
    QueueMove {
        name: String,
        to: String,
        count: Option<u64>,
    },
    StreamStat {
        name: Option<String>,
    },
    Reload,
    ConnectionList,
    ConnectionClose {
        id: u64,
        reason: Option<String>,
    },
    TokenCreate {
        user: Option<String>,
        expires_in_s: Option<u64>,
    },
    TokenList,
    TokenRevoke {
        id: String,
    },
    UserList,
    UserAdd {
        name: String,
        password: String,
        roles: Vec<String>,
        permissions: rosetta::users::PermissionSpec,
    },
    UserRoles {
        name: String,
        roles: Vec<String>,
    },
    RoleList,
    RoleAdd {
        name: String,
        role: rosetta::users::RoleSpec,
    },
    RoleRemove {
        name: String,
    },
    UserDelete {
        name: String,
    },
    UserPasswd {
        name: String,
        password: String,
    },
    Status,
}

/// Runs one command and prints its answer on standard output.
pub(crate) fn run(api: &Api, request: AdminCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match request {
            AdminCommand::QueueList { name } => {
                for q in api.all("/api/v1/queues", name.as_deref()).await? {
                    println!("{}", q["name"].as_str().unwrap_or_default());
                }
            }
            AdminCommand::QueueStat { name } => {
                let queues = api.all("/api/v1/queues", name.as_deref()).await?;
                // Which topic filters each queue is bound to, for ADDRESS
                // and ROUTING_TYPE (the filter narrows it to those queues
                // and those whose filters match it, which are ignored).
                let mut bound: HashMap<String, Vec<String>> = HashMap::new();
                for b in api.all("/api/v1/subscriptions", name.as_deref()).await? {
                    bound
                        .entry(text(&b["queue"]).to_owned())
                        .or_default()
                        .push(text(&b["filter"]).to_owned());
                }
                print!("{}", stat_table(&queues, &bound));
            }
            AdminCommand::StreamStat { name } => {
                let logs = api.all("/api/v1/streams", name.as_deref()).await?;
                print!("{}", stream_table(&logs));
            }
            AdminCommand::QueuePurge { name } => {
                let path = format!("/api/v1/queues/{}/purge", encode(&name));
                let answer = api.call(Method::POST, &path, &[]).await?;
                println!("queue '{name}': {} messages removed", answer["removed"]);
            }
            AdminCommand::QueueDelete { name } => {
                api.call(
                    Method::DELETE,
                    &format!("/api/v1/queues/{}", encode(&name)),
                    &[],
                )
                .await?;
                println!("queue '{name}' deleted");
            }
            AdminCommand::QueueMove { name, to, count } => {
                let path = format!("/api/v1/queues/{}/move", encode(&name));
                let mut body = serde_json::json!({"to": to});
                if let Some(count) = count {
                    body["count"] = count.into();
                }
                let answer = api.send(Method::POST, &path, &[], Some(&body)).await?;
                // `left`: looked at and kept (the target refused them).
                println!(
                    "queue '{name}': {} messages moved to '{to}', {} refused by it",
                    answer["moved"], answer["left"]
                );
            }
            AdminCommand::Reload => {
                let answer = api.call(Method::POST, "/api/v1/reload", &[]).await?;
                println!(
                    "the broker reloaded its users ({} of them)",
                    answer["users"]
                );
            }
            AdminCommand::ConnectionList => {
                println!(
                    "{:<8} {:<6} {:<5} {:<22} {:<16} CLIENT ID",
                    "ID", "PROTO", "TRANS", "PEER", "USER"
                );
                for c in api.all("/api/v1/connections", None).await? {
                    println!(
                        "{:<8} {:<6} {:<5} {:<22} {:<16} {}",
                        c["id"],
                        text(&c["protocol"]),
                        text(&c["transport"]),
                        text(&c["peer"]),
                        text(&c["user"]),
                        text(&c["client_id"]),
                    );
                }
            }
            AdminCommand::ConnectionClose { id, reason } => {
                let headers: Vec<(&str, &str)> = reason
                    .as_deref()
                    .map(|r| ("x-reason", r))
                    .into_iter()
                    .collect();
                api.call(
                    Method::DELETE,
                    &format!("/api/v1/connections/{id}"),
                    &headers,
                )
                .await?;
                println!("connection {id} closed");
            }
            AdminCommand::TokenCreate { user, expires_in_s } => {
                let mut body = serde_json::json!({});
                if let Some(user) = user {
                    body["user"] = user.into();
                }
                if let Some(s) = expires_in_s {
                    body["expires_in_s"] = s.into();
                }
                let answer = api
                    .send(Method::POST, "/api/v1/tokens", &[], Some(&body))
                    .await?;
                // The token alone on standard output, for `$(...)`; what
                // it is on standard error.
                eprintln!(
                    "token {} for '{}', expires at {} ms (Unix); it is not shown again",
                    text(&answer["id"]),
                    text(&answer["user"]),
                    answer["expires_at_ms"]
                );
                println!("{}", text(&answer["token"]));
            }
            AdminCommand::TokenList => {
                println!("{:<18} {:<16} EXPIRES_AT_MS", "ID", "USER");
                for t in api.all("/api/v1/tokens", None).await? {
                    println!(
                        "{:<18} {:<16} {}",
                        text(&t["id"]),
                        text(&t["user"]),
                        t["expires_at_ms"]
                    );
                }
            }
            AdminCommand::UserList => {
                println!("{:<24} {:<28} PUBLISH / SUBSCRIBE", "NAME", "ROLES");
                for u in api.all("/api/v1/users", None).await? {
                    let roles = names(&u["roles"]);
                    println!(
                        "{:<24} {:<28} {} / {}",
                        text(&u["name"]),
                        if roles.is_empty() {
                            "-".to_owned()
                        } else {
                            roles.join(",")
                        },
                        u["publish"],
                        u["subscribe"]
                    );
                }
            }
            AdminCommand::UserAdd {
                name,
                password,
                roles,
                permissions,
            } => {
                let mut body = permissions_body(&permissions);
                body["name"] = name.as_str().into();
                body["password"] = password.into();
                body["roles"] = roles.into();
                api.send(Method::POST, "/api/v1/users", &[], Some(&body))
                    .await?;
                println!("user '{name}' added");
            }
            AdminCommand::UserRoles { name, roles } => {
                let path = format!("/api/v1/users/{}/roles", encode(&name));
                let body = serde_json::json!({"roles": roles});
                let answer = api.send(Method::PUT, &path, &[], Some(&body)).await?;
                println!(
                    "roles of '{name}' set to [{}]; admin right: {}",
                    names(&answer["roles"]).join(", "),
                    text(&answer["admin"])
                );
            }
            AdminCommand::RoleList => {
                println!(
                    "{:<24} {:<14} {:<30} {:<30} DENY PUBLISH / DENY SUBSCRIBE",
                    "NAME", "ADMIN", "PUBLISH", "SUBSCRIBE"
                );
                for r in api.all("/api/v1/roles", None).await? {
                    let builtin = r["builtin"].as_bool().unwrap_or(false);
                    let list = |key: &str| {
                        if builtin {
                            "(built-in)".to_owned()
                        } else {
                            list_text(&r[key])
                        }
                    };
                    println!(
                        "{:<24} {:<14} {:<30} {:<30} {} / {}",
                        text(&r["name"]),
                        text(&r["admin"]),
                        list("publish"),
                        list("subscribe"),
                        list_text(&r["deny_publish"]),
                        list_text(&r["deny_subscribe"]),
                    );
                }
            }
            AdminCommand::RoleAdd { name, role } => {
                let path = format!("/api/v1/roles/{}", encode(&name));
                let mut body = permissions_body(&role.permissions);
                if let Some(admin) = role.admin {
                    body["admin"] = admin.as_str().into();
                }
                api.send(Method::PUT, &path, &[], Some(&body)).await?;
                println!("role '{name}' saved");
            }
            AdminCommand::RoleRemove { name } => {
                let path = format!("/api/v1/roles/{}", encode(&name));
                api.call(Method::DELETE, &path, &[]).await?;
                println!("role '{name}' removed");
            }
            AdminCommand::UserDelete { name } => {
                let path = format!("/api/v1/users/{}", encode(&name));
                api.call(Method::DELETE, &path, &[]).await?;
                println!("user '{name}' deleted");
            }
            AdminCommand::UserPasswd { name, password } => {
                let path = format!("/api/v1/users/{}/password", encode(&name));
                let body = serde_json::json!({"password": password});
                api.send(Method::PUT, &path, &[], Some(&body)).await?;
                println!("password of '{name}' changed");
            }
            AdminCommand::Status => print!(
                "{}",
                status_text(&api.call(Method::GET, "/api/v1/overview", &[]).await?)
            ),
            AdminCommand::TokenRevoke { id } => {
                let path = format!("/api/v1/tokens/{}", encode(&id));
                api.call(Method::DELETE, &path, &[]).await?;
                println!("token {id} revoked");
            }
        }
        Ok(())
    })
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

/// The strings of a JSON array.
fn names(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A permission list for a table cell: `-` when absent, `[]` when empty.
fn list_text(v: &Value) -> String {
    match v.as_array() {
        None => "-".to_owned(),
        Some(_) => format!("[{}]", names(v).join(",")),
    }
}

/// The API's body for permission lists: the allow lists only when given
/// (absent: they say nothing), the deny lists always.
fn permissions_body(p: &rosetta::users::PermissionSpec) -> Value {
    let mut body = serde_json::json!({
        "deny_publish": p.deny_publish,
        "deny_subscribe": p.deny_subscribe,
    });
    if let Some(list) = &p.publish {
        body["publish"] = list.clone().into();
    }
    if let Some(list) = &p.subscribe {
        body["subscribe"] = list.clone().into();
    }
    body
}

/// `status`: the overview, one figure a line.
fn status_text(o: &Value) -> String {
    let c = &o["connections"];
    let m = &o["memory"];
    [
        format!("version      {}", text(&o["version"])),
        format!("node         {}", text(&o["node"])),
        format!("uptime_s     {}", o["uptime_s"]),
        format!("ready        {}", o["ready"]),
        format!(
            "connections  {} open, {} authenticated; by protocol {}; by transport {}",
            c["open"], c["authenticated"], c["by_protocol"], c["by_transport"]
        ),
        format!("queues       {}", o["queues"]["count"]),
        format!(
            "memory       {} of {} bytes; {} messages paged; producers blocked: {}",
            m["used_bytes"], m["budget_bytes"], m["paged_messages"], m["producers_blocked"]
        ),
        format!("journal      {} bytes", o["journal"]["bytes"]),
    ]
    .iter()
    .map(|line| format!("{line}\n"))
    .collect()
}

/// `queue stat`: one row per queue, with the columns of Artemis' `artemis
/// queue stat` (its spellings, so scripts written for it find them) and
/// Rosetta's oldest message age; each column as wide as its widest cell.
/// MESSAGE_COUNT is, as in Artemis, every message the queue holds: ready,
/// being delivered and scheduled.
fn stat_table(queues: &[Value], bound: &HashMap<String, Vec<String>>) -> String {
    fn n(q: &Value, key: &str) -> u64 {
        q[key].as_u64().unwrap_or(0)
    }
    /// A column: its header and how a queue's cell is written (from the
    /// queue and the topic filters it is bound to).
    type Column = (&'static str, fn(&Value, &[String]) -> String);
    let columns: [Column; 10] = [
        ("NAME", |q, _| text(&q["name"]).to_owned()),
        // Artemis' address: a queue that takes a topic's messages (an MQTT
        // session, a STOMP or AMQP topic subscription, [[bindings]]) shows
        // its topic filters; a point-to-point queue its own name.
        ("ADDRESS", |q, filters| {
            if filters.is_empty() {
                text(&q["name"]).to_owned()
            } else {
                filters.join(",")
            }
        }),
        ("CONSUMER_COUNT", |q, _| n(q, "consumers").to_string()),
        ("MESSAGE_COUNT", |q, _| {
            (n(q, "depth") + n(q, "in_flight") + n(q, "scheduled")).to_string()
        }),
        ("MESSAGES_ADDED", |q, _| n(q, "enqueued_total").to_string()),
        ("DELIVERING_COUNT", |q, _| n(q, "in_flight").to_string()),
        ("MESSAGES_ACKED", |q, _| n(q, "acked_total").to_string()),
        ("SCHEDULED_COUNT", |q, _| n(q, "scheduled").to_string()),
        // Bound to a topic: each subscriber's queue gets a copy (Artemis'
        // MULTICAST); else its consumers share its messages (ANYCAST).
        ("ROUTING_TYPE", |_, filters| {
            if filters.is_empty() {
                "ANYCAST"
            } else {
                "MULTICAST"
            }
            .to_owned()
        }),
        ("OLDEST_MESSAGE_AGE_MS", |q, _| {
            q["oldest_message_age_ms"]
                .as_u64()
                .map_or("-".to_owned(), |a| a.to_string())
        }),
    ];
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            let filters = bound.get(text(&q["name"])).map_or(&[][..], Vec::as_slice);
            columns.iter().map(|(_, cell)| cell(q, filters)).collect()
        })
        .collect();
    let headers: Vec<&str> = columns.iter().map(|(h, _)| *h).collect();
    table(&headers, &rows)
}

/// `stream stat`: one row per stream log and consumer group (a log
/// without a group has one row, its group `-`), with the columns Kafka's
/// `kafka-consumer-groups --describe` has for the same figures
/// (CURRENT-OFFSET is the group's committed offset, LOG-END-OFFSET the
/// offset the next append gets) and the log's size.
fn stream_table(logs: &[Value]) -> String {
    let n = |v: &Value| v.as_u64().unwrap_or(0).to_string();
    let mut rows = Vec::new();
    for log in logs {
        let cells = |group: &str, current: String, lag: String| {
            vec![
                text(&log["name"]).to_owned(),
                group.to_owned(),
                current,
                n(&log["next_offset"]),
                lag,
                n(&log["messages"]),
                n(&log["bytes"]),
                n(&log["readers"]),
            ]
        };
        let groups = log["groups"].as_array().map_or(&[][..], Vec::as_slice);
        if groups.is_empty() {
            rows.push(cells("-", "-".into(), "-".into()));
        }
        for g in groups {
            rows.push(cells(
                text(&g["name"]),
                n(&g["committed_offset"]),
                n(&g["lag"]),
            ));
        }
    }
    table(
        &[
            "STREAM",
            "GROUP",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "MESSAGES",
            "BYTES",
            "READERS",
        ],
        &rows,
    )
}

/// A table with `|` between columns, each as wide as its widest cell.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, header)| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(String::len)
                .chain([header.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::from("|");
        for (cell, width) in cells.zip(&widths) {
            out.push_str(&format!("{cell:<width$}|"));
        }
        out.push('\n');
        out
    };
    let mut out = line(&mut headers.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// Percent-encodes a path segment or query value: all but unreserved bytes.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_table_has_artemis_columns_as_wide_as_their_cells() {
        let queues = [
            serde_json::json!({"name": "orders", "depth": 2, "in_flight": 1, "scheduled": 3,
                "consumers": 1, "enqueued_total": 9, "acked_total": 3, "oldest_message_age_ms": 42}),
            serde_json::json!({"name": "a-much-longer-queue-name", "depth": 0}),
        ];
        let bound = HashMap::from([(
            "a-much-longer-queue-name".to_owned(),
            vec!["sensors/#".to_owned(), "alerts".to_owned()],
        )]);
        let table = stat_table(&queues, &bound);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "|NAME                    |ADDRESS         |CONSUMER_COUNT|MESSAGE_COUNT|MESSAGES_ADDED|DELIVERING_COUNT|MESSAGES_ACKED|SCHEDULED_COUNT|ROUTING_TYPE|OLDEST_MESSAGE_AGE_MS|"
        );
        let cells: Vec<&str> = lines[1].split('|').map(str::trim).collect();
        assert_eq!(
            cells,
            ["", "orders", "orders", "1", "6", "9", "1", "3", "3", "ANYCAST", "42", ""]
        );
        let cells: Vec<&str> = lines[2].split('|').map(str::trim).collect();
        assert_eq!((cells[2], cells[9]), ("sensors/#,alerts", "MULTICAST"));
        assert!(lines[2].ends_with("|-                    |"), "{table}");
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{table}");
    }

    #[test]
    fn stream_table_has_a_row_per_log_and_group_with_kafkas_offset_columns() {
        let logs = [
            serde_json::json!({"name": "events", "next_offset": 5, "messages": 5, "bytes": 600,
                "readers": 1, "groups": [
                    {"name": "billing", "committed_offset": 2, "lag": 3},
                    {"name": "audit", "committed_offset": 5, "lag": 0}]}),
            serde_json::json!({"name": "orders-0", "next_offset": 0, "messages": 0, "bytes": 0,
                "readers": 0, "groups": []}),
        ];
        let table = stream_table(&logs);
        let rows: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split('|').map(str::trim).collect())
            .collect();
        assert_eq!(
            rows[0],
            [
                "",
                "STREAM",
                "GROUP",
                "CURRENT-OFFSET",
                "LOG-END-OFFSET",
                "LAG",
                "MESSAGES",
                "BYTES",
                "READERS",
                ""
            ]
        );
        assert_eq!(
            rows[1],
            ["", "events", "billing", "2", "5", "3", "5", "600", "1", ""]
        );
        assert_eq!(rows[2][2..6], ["audit", "5", "5", "0"]);
        assert_eq!(rows[3][1..6], ["orders-0", "-", "-", "0", "-"]);
        assert_eq!(rows.len(), 4, "{table}");
    }

    #[test]
    fn encodings() {
        assert_eq!(encode("app/audit x"), "app%2Faudit%20x");
    }
}
