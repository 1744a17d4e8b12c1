//! `/api/v1/roles`: the three built-in admin roles, with what each allows
//! read from the route table itself (so the answer cannot drift from what
//! the API enforces), and the roles the users file defines: list, get,
//! define or replace (`PUT`), remove. A change is written to the users
//! file as a user change is (`users::write`), and the users holding the
//! role see it at their next publish, subscribe or API request.

use rosetta_server::users::{
    self, AdminRole, PermissionSpec, RoleSpec, RoleSummary, Users, ADMIN_ROLES,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{Api, Call, Reply};
use crate::error::ApiError;
use crate::listing::PageRequest;
use crate::router::ROUTES;
use crate::users::{spec_json, write};

/// A role as listed: built-in or defined.
enum Role {
    Builtin(AdminRole),
    Defined(RoleSummary),
}

impl Role {
    fn name(&self) -> &str {
        match self {
            Role::Builtin(r) => r.as_str(),
            Role::Defined(d) => &d.name,
        }
    }

    /// `name`, `builtin`, `admin` (the admin right it gives), `includes`
    /// (the built-in roles whose rights that takes in), `allows` (`METHOD
    /// /path` of each route it may call), and its permission lists
    /// (`null` allow lists for a built-in role: it says nothing).
    fn item(&self) -> Value {
        let (admin, spec, builtin) = match self {
            Role::Builtin(r) => (Some(*r), PermissionSpec::default(), true),
            Role::Defined(d) => (d.admin, d.permissions.clone(), false),
        };
        let allows: Vec<String> = ROUTES
            .iter()
            .filter(|r| {
                r.role
                    .is_some_and(|needed| admin.is_some_and(|a| a.grants(needed)))
            })
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        let includes: Vec<&str> = ADMIN_ROLES
            .iter()
            .filter(|other| admin.is_some_and(|a| a.grants(**other)))
            .filter(|other| other.as_str() != self.name())
            .map(|r| r.as_str())
            .collect();
        let mut item = spec_json(&spec);
        item["name"] = self.name().into();
        item["builtin"] = builtin.into();
        item["admin"] = admin.map(|a| a.as_str()).into();
        item["includes"] = includes.into();
        item["allows"] = allows.into();
        item
    }
}

/// Every role: the built-in ones first, then the defined ones by name.
fn all(users: &Users) -> Vec<Role> {
    ADMIN_ROLES
        .iter()
        .map(|r| Role::Builtin(*r))
        .chain(
            users
                .role_names()
                .into_iter()
                .filter_map(|n| users.role(n))
                .map(Role::Defined),
        )
        .collect()
}

fn find(users: &Users, name: &str) -> Result<Role, ApiError> {
    AdminRole::parse(name)
        .map(Role::Builtin)
        .or_else(|| users.role(name).map(Role::Defined))
        .ok_or_else(|| ApiError::not_found(format!("no role '{name}'")))
}

pub(crate) fn list(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let page = PageRequest::from_query(&call.query)?;
    let users = api.auth.users().users();
    let holders = users.holders_by_role();
    Ok(Reply::ok(page.answer_all(
        all(&users),
        Role::name,
        |role| {
            let mut item = role.item();
            item["users"] = holders.get(role.name()).cloned().unwrap_or_default().into();
            item
        },
    )))
}

/// One role, with the users holding it (`users`), as the listing shows it.
pub(crate) fn get(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param();
    let users = api.auth.users().users();
    let mut item = find(&users, name)?.item();
    item["users"] = users.holders(name).into();
    Ok(Reply::ok(item))
}

/// The body of `PUT /api/v1/roles/{name}`: the role's whole definition.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct NewRole {
    /// Absent: says nothing (its users' own lists and other roles decide).
    publish: Option<Vec<String>>,
    /// Absent: as `publish`.
    subscribe: Option<Vec<String>>,
    deny_publish: Vec<String>,
    deny_subscribe: Vec<String>,
    /// `monitoring`, `management`, `administrator`; absent or null: none.
    admin: Option<String>,
}

/// `PUT /api/v1/roles/{name}`: defines the role (201) or replaces its
/// definition (200). A built-in name is 409.
pub(crate) async fn put(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param().to_owned();
    let new: NewRole = call.json(None)?;
    let admin = new
        .admin
        .as_deref()
        .map(|a| {
            AdminRole::parse(a).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unknown admin right {a:?}: monitoring, management or administrator"
                ))
            })
        })
        .transpose()?;
    let spec = RoleSpec {
        permissions: PermissionSpec {
            publish: new.publish,
            subscribe: new.subscribe,
            deny_publish: new.deny_publish,
            deny_subscribe: new.deny_subscribe,
        },
        admin,
    };
    let _writing = api.users_write.lock().await;
    let path = api.users_file.clone();
    let target = name.clone();
    let created = write(api, move || users::save_role(&path, &target, &spec)).await?;
    tracing::info!(role = %name, by = ?call.user, created, "admin API: role saved");
    let users = api.auth.users().users();
    let item = users
        .role(&name)
        .map_or(json!({"name": name}), |r| Role::Defined(r).item());
    Ok(if created {
        Reply::created(item)
    } else {
        Reply::ok(item)
    })
}

/// `DELETE /api/v1/roles/{name}`: 404 for an undefined role, 409 for a
/// built-in one or one that users still hold (the reason names them).
pub(crate) async fn delete(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param().to_owned();
    let _writing = api.users_write.lock().await;
    let path = api.users_file.clone();
    let target = name.clone();
    let removed = write(api, move || users::remove_role(&path, &target)).await?;
    if !removed {
        return Err(ApiError::not_found(format!("no role '{name}'")));
    }
    tracing::info!(role = %name, by = ?call.user, "admin API: role removed");
    Ok(Reply::no_content())
}
