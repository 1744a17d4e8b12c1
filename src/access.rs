//! Access control over the users file: the [`AccessControl`] the core uses
//! to authenticate clients and check their permissions.

use std::sync::Arc;

use anyhow::Context;
use rosetta_neutral::{Address, AuthError, Principal, ScramCredentials};

use crate::config::Config;
use crate::core::AccessControl;
use crate::users::Users;

/// Users-file access control.
pub struct UsersAccess {
    users: Users,
    anonymous: bool,
}

impl UsersAccess {
    /// Access control over `users`, with anonymous access on or off.
    pub fn new(users: Users, anonymous: bool) -> Self {
        Self { users, anonymous }
    }
}

/// Builds the access control the configuration asks for: the users file
/// named by `[security] users_file` (none is fine: then only anonymous
/// clients exist), and `[security] anonymous`.
pub fn from_config(config: &Config) -> anyhow::Result<Arc<dyn AccessControl>> {
    let path = config.users_file();
    let users = Users::load(&path).with_context(|| format!("users file {}", path.display()))?;
    Ok(Arc::new(UsersAccess::new(users, config.security.anonymous)))
}

impl AccessControl for UsersAccess {
    fn authenticate(
        &self,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<Principal, AuthError> {
        match user {
            None | Some("") if password.is_none_or(<[u8]>::is_empty) => {
                if self.anonymous {
                    Ok(Principal::anonymous())
                } else {
                    Err(AuthError::AnonymousDisabled)
                }
            }
            Some(name) if self.users.verify(name, password.unwrap_or_default()) => Ok(Principal {
                user: Some(name.to_owned()),
            }),
            _ => Err(AuthError::BadCredentials),
        }
    }

    fn scram_credentials(&self, user: &str) -> Option<ScramCredentials> {
        self.users.scram(user)
    }

    fn anonymous_allowed(&self) -> bool {
        self.anonymous
    }

    fn authenticate_certificate(&self, subject: &str) -> Result<Principal, AuthError> {
        // A verified certificate stands in for the password of an existing user.
        if self.users.contains(subject) {
            Ok(Principal {
                user: Some(subject.to_owned()),
            })
        } else {
            Err(AuthError::BadCredentials)
        }
    }

    fn may_publish(&self, principal: &Principal, address: &Address) -> bool {
        self.users
            .permissions(principal.user.as_deref())
            .may_publish(address)
    }

    fn may_subscribe(&self, principal: &Principal, address: &Address) -> bool {
        self.users
            .permissions(principal.user.as_deref())
            .may_subscribe(address)
    }
}
