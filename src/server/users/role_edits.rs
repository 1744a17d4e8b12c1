//! Defining and removing roles in the users file (`[roles.NAME]`), with
//! the same atomic, comment-keeping edit as users ([`super::edit_doc`]).

use std::path::Path;

use super::{doc_table, edit_doc, roles, AdminRole, RoleSpec, UsersError, ROLES_MAX};

/// Defines the role `name`, or replaces its lists and admin right (the
/// users holding it keep it, and hold the new definition at once).
/// Returns true if it is new. A built-in name is
/// [`UsersError::BuiltinRole`].
pub fn save_role(path: &Path, name: &str, spec: &RoleSpec) -> Result<bool, UsersError> {
    if AdminRole::parse(name).is_some() {
        return Err(UsersError::BuiltinRole(name.to_owned()));
    }
    if !roles::valid_role_name(name) {
        return Err(UsersError::InvalidRoleName(name.to_owned()));
    }
    spec.permissions.validate()?;
    let mut created = false;
    edit_doc(path, |loaded, doc| {
        created = loaded.role(name).is_none();
        if created && loaded.role_names().len() >= ROLES_MAX {
            return Err(UsersError::TooManyRoles);
        }
        let mut entry = toml_edit::Table::new();
        spec.permissions.write_to(&mut entry);
        if let Some(admin) = spec.admin {
            entry.insert("admin", toml_edit::value(admin.as_str()));
        }
        doc_table(doc, "roles")?.insert(name, toml_edit::Item::Table(entry));
        Ok(())
    })?;
    Ok(created)
}

/// Removes the defined role `name`. Returns whether it was there; a role
/// users still hold is [`UsersError::RoleInUse`] (naming them), a built-in
/// one [`UsersError::BuiltinRole`], and the file is left as it was.
pub fn remove_role(path: &Path, name: &str) -> Result<bool, UsersError> {
    if AdminRole::parse(name).is_some() {
        return Err(UsersError::BuiltinRole(name.to_owned()));
    }
    let mut removed = false;
    edit_doc(path, |loaded, doc| {
        if loaded.role(name).is_none() {
            return Ok(());
        }
        let holders = loaded.holders(name);
        if !holders.is_empty() {
            return Err(UsersError::RoleInUse {
                role: name.to_owned(),
                users: holders.into_iter().map(str::to_owned).collect(),
            });
        }
        removed = doc_table(doc, "roles")?.remove(name).is_some();
        Ok(())
    })?;
    Ok(removed)
}
