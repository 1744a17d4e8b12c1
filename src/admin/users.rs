//! `/api/v1/users`: list, create, get, delete, change password,
//! permissions (allow and deny lists) or roles. The users file stays the
//! one source: every change is written to it atomically (temporary file,
//! sync, rename: `rosetta_server::users`), then read back and put in
//! force, so the next login, and the next publish or subscribe of a
//! connection already open, sees it. A hash is never returned.

use rosetta_server::users::{self, PermissionSpec, UserSummary, Users, UsersError};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{Api, Call, Reply};
use crate::error::ApiError;
use crate::listing::PageRequest;

/// A user: its roles, its admin right, what it may do (its own lists
/// and its roles' together) and its own lists as written (`own`; `null`
/// for an absent allow list).
fn item(u: &UserSummary) -> Value {
    json!({
        "name": u.name,
        "roles": u.roles,
        "admin": u.admin.map(|a| a.as_str()),
        "publish": u.publish,
        "subscribe": u.subscribe,
        "deny_publish": u.deny_publish,
        "deny_subscribe": u.deny_subscribe,
        "own": spec_json(&u.own),
    })
}

/// Permission lists as the API shows them (`null`: an absent allow list).
pub(crate) fn spec_json(p: &PermissionSpec) -> Value {
    json!({
        "publish": p.publish,
        "subscribe": p.subscribe,
        "deny_publish": p.deny_publish,
        "deny_subscribe": p.deny_subscribe,
    })
}

pub(crate) fn list(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let page = PageRequest::from_query(&call.query)?;
    let all = api.auth.users().users();
    let summaries: Vec<UserSummary> = all.names().iter().filter_map(|n| all.summary(n)).collect();
    Ok(Reply::ok(page.answer_all(summaries, |u| &u.name, item)))
}

pub(crate) fn get(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param();
    api.auth
        .users()
        .users()
        .summary(name)
        .map(|u| Reply::ok(item(&u)))
        .ok_or_else(|| ApiError::not_found(format!("no user '{name}'")))
}

/// The body of `POST /api/v1/users`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewUser {
    name: String,
    password: String,
    #[serde(default)]
    roles: Vec<String>,
    /// Absent: everything.
    publish: Option<Vec<String>>,
    /// Absent: everything.
    subscribe: Option<Vec<String>>,
    /// Absent: none. A deny wins over an allow.
    #[serde(default)]
    deny_publish: Vec<String>,
    /// Absent: none.
    #[serde(default)]
    deny_subscribe: Vec<String>,
}

pub(crate) async fn create(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let new: NewUser = call.json(None)?;
    let _writing = api.users_write.lock().await;
    if api.auth.users().users().contains(&new.name) {
        return Err(ApiError::conflict(format!("user '{}' exists", new.name)));
    }
    let path = api.users_file.clone();
    let name = new.name.clone();
    write(api, move || {
        let permissions = PermissionSpec {
            publish: new.publish,
            subscribe: new.subscribe,
            deny_publish: new.deny_publish,
            deny_subscribe: new.deny_subscribe,
        };
        users::save_user_with(
            &path,
            &new.name,
            new.password.as_bytes(),
            &permissions,
            Some(&new.roles),
        )
    })
    .await?;
    tracing::info!(user = %name, by = ?call.user, "admin API: user created");
    let summary = api.auth.users().users().summary(&name);
    Ok(Reply::created(
        summary.map_or(json!({"name": name}), |u| item(&u)),
    ))
}

pub(crate) async fn delete(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param().to_owned();
    let _writing = api.users_write.lock().await;
    let path = api.users_file.clone();
    let target = name.clone();
    let removed = write(api, move || users::remove_user(&path, &target)).await?;
    if !removed {
        return Err(ApiError::not_found(format!("no user '{name}'")));
    }
    tracing::info!(user = %name, by = ?call.user, "admin API: user deleted");
    Ok(Reply::no_content())
}

/// The body of `PUT /api/v1/users/{name}/password`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewPassword {
    password: String,
}

pub(crate) async fn set_password(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param().to_owned();
    let new: NewPassword = call.json(None)?;
    let _writing = api.users_write.lock().await;
    let path = api.users_file.clone();
    let target = name.clone();
    let found = write(api, move || {
        users::set_password(&path, &target, new.password.as_bytes())
    })
    .await?;
    if !found {
        return Err(ApiError::not_found(format!("no user '{name}'")));
    }
    tracing::info!(user = %name, by = ?call.user, "admin API: password changed");
    Ok(Reply::no_content())
}

/// `PUT /api/v1/users/{name}/permissions`: the body (a
/// [`PermissionSpec`]) replaces all four lists (an absent allow list is
/// everything, an absent deny list none). Connections already open see
/// them at their next publish or subscribe.
pub(crate) async fn set_permissions(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param().to_owned();
    let spec: PermissionSpec = call.json(None)?;
    let _writing = api.users_write.lock().await;
    let path = api.users_file.clone();
    let target = name.clone();
    let found = write(api, move || users::set_permissions(&path, &target, &spec)).await?;
    if !found {
        return Err(ApiError::not_found(format!("no user '{name}'")));
    }
    tracing::info!(user = %name, by = ?call.user, "admin API: permissions changed");
    let summary = api.auth.users().users().summary(&name);
    Ok(Reply::ok(
        summary.map_or(json!({"name": name}), |u| item(&u)),
    ))
}

/// The body of `PUT /api/v1/users/{name}/roles`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewRoles {
    /// Defined or built-in, in order (the first is the balancer's
    /// `role_name`); empty: none.
    roles: Vec<String>,
}

/// `PUT /api/v1/users/{name}/roles`: replaces the user's roles. Its
/// connections see the new roles' permissions at their next publish or
/// subscribe, its API requests the new admin right at once.
pub(crate) async fn set_roles(api: &Api, call: &Call<'_>) -> Result<Reply, ApiError> {
    let name = call.matched.param().to_owned();
    let new: NewRoles = call.json(None)?;
    let _writing = api.users_write.lock().await;
    let path = api.users_file.clone();
    let target = name.clone();
    let found = write(api, move || users::set_roles(&path, &target, &new.roles)).await?;
    if !found {
        return Err(ApiError::not_found(format!("no user '{name}'")));
    }
    tracing::info!(user = %name, by = ?call.user, "admin API: roles changed");
    let summary = api.auth.users().users().summary(&name);
    Ok(Reply::ok(
        summary.map_or(json!({"name": name}), |u| item(&u)),
    ))
}

/// Runs a users-file change off the async workers (it hashes passwords
/// and syncs files), then loads the file and puts it in force.
pub(crate) async fn write<T: Send + 'static>(
    api: &Api,
    change: impl FnOnce() -> Result<T, UsersError> + Send + 'static,
) -> Result<T, ApiError> {
    let path = api.users_file.clone();
    let (result, reloaded) = tokio::task::spawn_blocking(move || {
        let result = change();
        let reloaded = result.as_ref().ok().map(|_| Users::load(&path));
        (result, reloaded)
    })
    .await
    .map_err(|_| ApiError::internal("the users file change failed"))?;
    let value = result.map_err(users_error)?;
    match reloaded {
        Some(Ok(users)) => {
            api.auth.users().replace_users(users);
            api.auth.forget_all();
        }
        Some(Err(e)) => {
            return Err(ApiError::internal(format!(
                "written, but reading it back failed: {e}"
            )))
        }
        None => {}
    }
    Ok(value)
}

/// THE mapping from a users-file error to an HTTP one.
fn users_error(e: UsersError) -> ApiError {
    match e {
        UsersError::InvalidName(_)
        | UsersError::InvalidPassword
        | UsersError::InvalidPattern(_)
        | UsersError::UnknownRole(_)
        | UsersError::InvalidRoleName(_)
        | UsersError::TooManyRoles => ApiError::bad_request(e.to_string()),
        UsersError::BuiltinRole(_) | UsersError::RoleInUse { .. } => {
            ApiError::conflict(e.to_string())
        }
        other => ApiError::internal(other.to_string()),
    }
}
