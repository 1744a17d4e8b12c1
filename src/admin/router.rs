//! The route table and the matching of a request to one of its routes.
//!
//! One table ([`ROUTES`]) says every method, path and the role it needs;
//! the dispatcher (`api.rs`) matches on [`Action`]. A path that exists
//! under another method is 405 with `Allow`, one that does not is 404.
//! Path parameters and query values are percent-decoded (a queue name may
//! hold `/`, sent as `%2F`).

use std::collections::HashMap;

use hyper::Method;
use rosetta_server::users::AdminRole;

use crate::error::ApiError;

/// What a route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `GET /healthz`.
    Healthz,
    /// `GET /readyz`.
    Readyz,
    /// `GET /api/v1/overview`.
    Overview,
    /// `GET /api/v1/queues`.
    ListQueues,
    /// `GET /api/v1/queues/{name}`.
    GetQueue,
    /// `PUT /api/v1/queues/{name}`.
    PutQueue,
    /// `DELETE /api/v1/queues/{name}`.
    DeleteQueue,
    /// `POST /api/v1/queues/{name}/purge`.
    PurgeQueue,
    /// `GET /api/v1/queues/{name}/messages`.
    PeekQueue,
    /// `POST /api/v1/queues/{name}/move`.
    MoveMessages,
    /// `POST /api/v1/queues/{name}/replay`.
    ReplayDeadLetters,
    /// `GET /api/v1/streams`.
    ListStreams,
    /// `GET /api/v1/streams/{name}`.
    GetStream,
    /// `GET /api/v1/sessions`.
    ListSessions,
    /// `GET /api/v1/sessions/{client_id}`.
    GetSession,
    /// `DELETE /api/v1/sessions/{client_id}`.
    DeleteSession,
    /// `GET /api/v1/topics`.
    ListRetained,
    /// `DELETE /api/v1/topics/{topic}`.
    DeleteRetained,
    /// `GET /api/v1/subscriptions`.
    ListSubscriptions,
    /// `GET /api/v1/roles`.
    ListRoles,
    /// `GET /api/v1/roles/{name}`.
    GetRole,
    /// `PUT /api/v1/roles/{name}`.
    PutRole,
    /// `DELETE /api/v1/roles/{name}`.
    DeleteRole,
    /// `POST /api/v1/reload`.
    Reload,
    /// `POST /api/v1/tokens`.
    CreateToken,
    /// `GET /api/v1/tokens`.
    ListTokens,
    /// `DELETE /api/v1/tokens/{id}`.
    RevokeToken,
    /// `GET /api/v1/connections`.
    ListConnections,
    /// `DELETE /api/v1/connections/{id}`.
    CloseConnection,
    /// `GET /api/v1/users`.
    ListUsers,
    /// `POST /api/v1/users`.
    CreateUser,
    /// `GET /api/v1/users/{name}`.
    GetUser,
    /// `DELETE /api/v1/users/{name}`.
    DeleteUser,
    /// `PUT /api/v1/users/{name}/password`.
    SetPassword,
    /// `PUT /api/v1/users/{name}/permissions`.
    SetPermissions,
    /// `PUT /api/v1/users/{name}/roles`.
    SetUserRoles,
    /// `GET /api/v1/balancer/target`.
    BalancerTarget,
}

/// One route.
#[derive(Debug, Clone)]
pub struct Route {
    /// The HTTP method.
    pub method: Method,
    /// The path, with `{param}` segments.
    pub path: &'static str,
    /// The role it needs; `None`: no authentication (health checks).
    pub role: Option<AdminRole>,
    /// What it does.
    pub action: Action,
}

const fn route(
    method: Method,
    path: &'static str,
    role: Option<AdminRole>,
    action: Action,
) -> Route {
    Route {
        method,
        path,
        role,
        action,
    }
}

const READ: Option<AdminRole> = Some(AdminRole::Monitoring);
const ACT: Option<AdminRole> = Some(AdminRole::Management);
const ADMIN: Option<AdminRole> = Some(AdminRole::Administrator);

/// Every route of the API.
pub const ROUTES: &[Route] = &[
    route(Method::GET, "/healthz", None, Action::Healthz),
    route(Method::GET, "/readyz", None, Action::Readyz),
    route(Method::GET, "/api/v1/overview", READ, Action::Overview),
    route(Method::GET, "/api/v1/queues", READ, Action::ListQueues),
    route(Method::GET, "/api/v1/queues/{name}", READ, Action::GetQueue),
    route(Method::PUT, "/api/v1/queues/{name}", ACT, Action::PutQueue),
    route(
        Method::DELETE,
        "/api/v1/queues/{name}",
        ACT,
        Action::DeleteQueue,
    ),
    route(
        Method::POST,
        "/api/v1/queues/{name}/purge",
        ACT,
        Action::PurgeQueue,
    ),
    // Messages, sessions, retained messages, subscriptions, roles.
    route(
        Method::GET,
        "/api/v1/queues/{name}/messages",
        ACT,
        Action::PeekQueue,
    ),
    route(
        Method::POST,
        "/api/v1/queues/{name}/move",
        ACT,
        Action::MoveMessages,
    ),
    route(
        Method::POST,
        "/api/v1/queues/{name}/replay",
        ACT,
        Action::ReplayDeadLetters,
    ),
    route(Method::GET, "/api/v1/streams", READ, Action::ListStreams),
    route(
        Method::GET,
        "/api/v1/streams/{name}",
        READ,
        Action::GetStream,
    ),
    route(Method::GET, "/api/v1/sessions", READ, Action::ListSessions),
    route(
        Method::GET,
        "/api/v1/sessions/{client_id}",
        READ,
        Action::GetSession,
    ),
    route(
        Method::DELETE,
        "/api/v1/sessions/{client_id}",
        ACT,
        Action::DeleteSession,
    ),
    route(Method::GET, "/api/v1/topics", READ, Action::ListRetained),
    route(
        Method::DELETE,
        "/api/v1/topics/{topic}",
        ACT,
        Action::DeleteRetained,
    ),
    route(
        Method::GET,
        "/api/v1/subscriptions",
        READ,
        Action::ListSubscriptions,
    ),
    // The listing is a monitor's too (the console shows it); one role,
    // with who holds it, and every change are the administrator's.
    route(Method::GET, "/api/v1/roles", READ, Action::ListRoles),
    route(Method::GET, "/api/v1/roles/{name}", ADMIN, Action::GetRole),
    route(Method::PUT, "/api/v1/roles/{name}", ADMIN, Action::PutRole),
    route(
        Method::DELETE,
        "/api/v1/roles/{name}",
        ADMIN,
        Action::DeleteRole,
    ),
    route(Method::POST, "/api/v1/reload", ADMIN, Action::Reload),
    // Bearer tokens: every user with a role has its own.
    route(Method::POST, "/api/v1/tokens", READ, Action::CreateToken),
    route(Method::GET, "/api/v1/tokens", READ, Action::ListTokens),
    route(
        Method::DELETE,
        "/api/v1/tokens/{id}",
        READ,
        Action::RevokeToken,
    ),
    route(
        Method::GET,
        "/api/v1/connections",
        READ,
        Action::ListConnections,
    ),
    route(
        Method::DELETE,
        "/api/v1/connections/{id}",
        ACT,
        Action::CloseConnection,
    ),
    route(Method::GET, "/api/v1/users", ADMIN, Action::ListUsers),
    route(Method::POST, "/api/v1/users", ADMIN, Action::CreateUser),
    route(Method::GET, "/api/v1/users/{name}", ADMIN, Action::GetUser),
    route(
        Method::DELETE,
        "/api/v1/users/{name}",
        ADMIN,
        Action::DeleteUser,
    ),
    route(
        Method::PUT,
        "/api/v1/users/{name}/password",
        ADMIN,
        Action::SetPassword,
    ),
    route(
        Method::PUT,
        "/api/v1/users/{name}/permissions",
        ADMIN,
        Action::SetPermissions,
    ),
    route(
        Method::PUT,
        "/api/v1/users/{name}/roles",
        ADMIN,
        Action::SetUserRoles,
    ),
    route(
        Method::GET,
        "/api/v1/balancer/target",
        READ,
        Action::BalancerTarget,
    ),
];

/// A matched request: its route and path parameters.
#[derive(Debug)]
pub struct Matched {
    /// The route.
    pub route: &'static Route,
    /// The `{param}` values, decoded, in path order.
    pub params: Vec<String>,
}

impl Matched {
    /// The first path parameter (every route has at most one).
    pub fn param(&self) -> &str {
        self.params.first().map_or("", String::as_str)
    }
}

/// The route for `method` and `path`: 404 if no route has the path, 405
/// (naming the allowed methods) if none has it with this method.
pub fn find(method: &Method, path: &str) -> Result<Matched, ApiError> {
    let mut allowed = Vec::new();
    for route in ROUTES {
        if let Some(params) = match_path(route.path, path)? {
            if route.method == *method || (*method == Method::HEAD && route.method == Method::GET) {
                return Ok(Matched { route, params });
            }
            allowed.push(route.method.as_str());
        }
    }
    if allowed.is_empty() {
        Err(ApiError::not_found(format!("no such resource: {path}")))
    } else {
        Err(ApiError::method_not_allowed(format!(
            "{method} is not allowed on {path}; allowed: {}",
            allowed.join(", ")
        )))
    }
}

/// The allowed methods of a 405, for its `Allow` header.
pub fn allowed_methods(path: &str) -> String {
    ROUTES
        .iter()
        .filter(|r| matches!(match_path(r.path, path), Ok(Some(_))))
        .map(|r| r.method.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn match_path(template: &str, path: &str) -> Result<Option<Vec<String>>, ApiError> {
    let mut params = Vec::new();
    let mut want = template.split('/');
    let mut have = path.split('/');
    loop {
        match (want.next(), have.next()) {
            (None, None) => return Ok(Some(params)),
            (Some(w), Some(h)) if w.starts_with('{') => {
                if h.is_empty() {
                    return Ok(None);
                }
                params.push(percent_decode(h, false)?);
            }
            (Some(w), Some(h)) if w == h => {}
            _ => return Ok(None),
        }
    }
}

/// The query string's values by key, decoded (`+` is a space); the last
/// of a repeated key wins.
#[derive(Debug, Default)]
pub struct Query(HashMap<String, String>);

impl Query {
    /// Parses `a=1&b=x%20y`.
    pub fn parse(query: Option<&str>) -> Result<Query, ApiError> {
        let mut map = HashMap::new();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            map.insert(percent_decode(k, true)?, percent_decode(v, true)?);
        }
        Ok(Query(map))
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

/// Decodes `%XX` escapes (and `+` as a space in a query); the result must
/// be UTF-8.
fn percent_decode(s: &str, plus_is_space: bool) -> Result<String, ApiError> {
    let bad = || ApiError::bad_request(format!("malformed percent-encoding in {s:?}"));
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
                let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_with_decoded_parameters_and_others_are_404_or_405() {
        let m = find(&Method::GET, "/api/v1/queues/%24durable%2Fapp").expect("queue");
        assert_eq!(
            (m.route.action, m.param()),
            (Action::GetQueue, "$durable/app")
        );
        let m = find(&Method::POST, "/api/v1/queues/orders/purge").expect("purge");
        assert_eq!(m.route.action, Action::PurgeQueue);
        assert_eq!(
            find(&Method::GET, "/api/v1/nothing")
                .expect_err("404")
                .status,
            hyper::StatusCode::NOT_FOUND
        );
        assert_eq!(
            find(&Method::GET, "/api/v1/queues/")
                .expect_err("empty name")
                .status,
            hyper::StatusCode::NOT_FOUND
        );
        let e = find(&Method::POST, "/api/v1/queues/orders").expect_err("405");
        assert_eq!(e.status, hyper::StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(allowed_methods("/api/v1/queues/orders"), "GET, PUT, DELETE");
        assert_eq!(
            find(&Method::GET, "/api/v1/queues/%zz")
                .expect_err("bad escape")
                .status,
            hyper::StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn queries_decode() {
        let q = Query::parse(Some("page=2&name=a+b%2Fc&flag")).expect("parse");
        assert_eq!(q.get("page"), Some("2"));
        assert_eq!(q.get("name"), Some("a b/c"));
        assert_eq!(q.get("flag"), Some(""));
        assert!(Query::parse(Some("name=%e2%28")).is_err(), "not UTF-8");
    }
}

/// The checked-in OpenAPI description and the route table say the same.
#[cfg(test)]
mod openapi_tests {
    use super::*;

    const OPENAPI: &str = include_str!("../../docs/admin-api.json");
    const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

    #[test]
    fn every_route_is_described_and_every_description_is_a_route() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).expect("docs/admin-api.json");
        let paths = doc["paths"].as_object().expect("paths");
        let mut described = Vec::new();
        for (path, ops) in paths {
            for method in METHODS {
                if let Some(op) = ops.get(method) {
                    described.push((method.to_uppercase(), path.clone()));
                    // Health checks are the only routes without credentials.
                    let open = op
                        .get("security")
                        .is_some_and(|s| s == &serde_json::json!([]));
                    let route = ROUTES
                        .iter()
                        .find(|r| r.path == path && r.method.as_str().eq_ignore_ascii_case(method));
                    if let Some(route) = route {
                        assert_eq!(open, route.role.is_none(), "{method} {path}: security");
                        if let Some(role) = route.role {
                            let text = op["description"].as_str().unwrap_or_default();
                            assert!(text.contains(&format!("`{role}`")), "{method} {path}: role");
                        }
                    }
                }
            }
        }
        let mut routed: Vec<(String, String)> = ROUTES
            .iter()
            .map(|r| (r.method.as_str().to_owned(), r.path.to_owned()))
            .collect();
        described.sort();
        routed.sort();
        assert_eq!(described, routed);
    }
}
