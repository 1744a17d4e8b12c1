//! `GET /api/v1/roles`: the three admin roles and what each allows, read
//! from the route table itself, so the answer cannot drift from what the
//! API enforces.

use rosetta_server::users::ADMIN_ROLES;
use serde_json::{json, Value};

use crate::api::Reply;
use crate::router::ROUTES;

pub(crate) fn list() -> Reply {
    let items: Vec<Value> = ADMIN_ROLES
        .iter()
        .map(|role| {
            let allows: Vec<String> = ROUTES
                .iter()
                .filter(|r| r.role.is_some_and(|needed| role.grants(needed)))
                .map(|r| format!("{} {}", r.method, r.path))
                .collect();
            let includes: Vec<&str> = ADMIN_ROLES
                .iter()
                .filter(|other| *other != role && role.grants(**other))
                .map(|r| r.as_str())
                .collect();
            json!({"name": role.as_str(), "includes": includes, "allows": allows})
        })
        .collect();
    let total = items.len();
    Reply::ok(json!({"items": items, "page": 1, "page_size": total, "total": total}))
}
