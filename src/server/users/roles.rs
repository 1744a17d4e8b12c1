//! Roles: the three built-in admin roles, and the roles the users file
//! defines (issue 18).
//!
//! ## Built-in admin roles
//! What a user may do through the admin API. Each includes the ones before
//! it, as RabbitMQ's tags do for its management API: `management` may read
//! what `monitoring` reads, and an `administrator` may do everything. A
//! user without an admin right may use the protocols but not the admin
//! API. They carry no address permissions.
//!
//! ## Defined roles
//! A `[roles.NAME]` table of the users file:
//!
//! ```toml
//! [roles.sensors]
//! publish = ["/topic/sensors/#"]          # absent: says nothing
//! subscribe = ["/topic/commands/#"]
//! deny_publish = ["/topic/sensors/admin"] # absent: none
//! deny_subscribe = []
//! admin = "monitoring"                    # absent: no admin right
//! ```
//!
//! A user lists roles by name (`roles = ["sensors", "monitoring"]`), defined
//! or built-in. Its effective permissions ([`effective`]): for each
//! direction the union of the allow lists that it and its roles *have*
//! (an absent list says nothing; when no one says anything, everything is
//! allowed, which is what a user without roles always meant), and the
//! union of every deny list; a deny wins. Its admin right is the strongest
//! of its built-in roles and its roles' `admin` rights.

use std::fmt;

use super::permissions::{Pattern, Permissions};

/// Longest role name, in bytes: a role name is a TOML key, a URL path
/// segment and a balancer key; 64 bytes names anything real.
pub const ROLE_NAME_LEN_MAX_BYTES: usize = 64;
/// Most roles one user may hold: each is a union at load time, and no
/// real user needs more.
pub const ROLES_PER_USER_MAX: usize = 32;
/// Most roles the users file may define: the API lists them whole.
pub const ROLES_MAX: usize = 1_000;

/// One admin role, from least to most power.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AdminRole {
    /// Reads the API: overview, queues, connections.
    Monitoring,
    /// Also acts on queues and connections: create, purge, delete, close.
    Management,
    /// Also manages users and roles.
    Administrator,
}

/// Every role, in order.
pub const ADMIN_ROLES: [AdminRole; 3] = [
    AdminRole::Monitoring,
    AdminRole::Management,
    AdminRole::Administrator,
];

impl AdminRole {
    /// The name in the users file and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminRole::Monitoring => "monitoring",
            AdminRole::Management => "management",
            AdminRole::Administrator => "administrator",
        }
    }

    /// The role of a name; `None` for an unknown one.
    pub fn parse(name: &str) -> Option<AdminRole> {
        ADMIN_ROLES.into_iter().find(|r| r.as_str() == name)
    }

    /// Whether holding `self` grants what `needed` allows.
    pub fn grants(self, needed: AdminRole) -> bool {
        self >= needed
    }
}

impl fmt::Display for AdminRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `name` may name a defined role: 1 to
/// [`ROLE_NAME_LEN_MAX_BYTES`] ASCII letters, digits, `-` and `_` (no `.`:
/// it would split the TOML key; nothing a URL must escape). Whether it
/// is a built-in role's name is checked apart.
pub fn valid_role_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= ROLE_NAME_LEN_MAX_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Checked permission lists of a user or a role, as written: `None` is an
/// absent allow list (it says nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lists {
    /// `publish`.
    pub publish: Option<Vec<Pattern>>,
    /// `subscribe`.
    pub subscribe: Option<Vec<Pattern>>,
    /// `deny_publish`.
    pub deny_publish: Vec<Pattern>,
    /// `deny_subscribe`.
    pub deny_subscribe: Vec<Pattern>,
}

/// A role the users file defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefinedRole {
    /// Its permission lists.
    pub lists: Lists,
    /// The admin right it grants, if any.
    pub admin: Option<AdminRole>,
}

/// The permissions of a user with `own` lists holding roles with `roles`
/// lists: per direction, the union of the allow lists present (everything
/// when none is), and the union of all deny lists.
pub fn effective<'a>(
    own: &'a Lists,
    roles: impl IntoIterator<Item = &'a Lists> + Clone,
) -> Permissions {
    let all = || std::iter::once(own).chain(roles.clone());
    Permissions {
        publish: allow_union(all().map(|l| l.publish.as_deref())),
        subscribe: allow_union(all().map(|l| l.subscribe.as_deref())),
        deny_publish: union(all().map(|l| l.deny_publish.as_slice())),
        deny_subscribe: union(all().map(|l| l.deny_subscribe.as_slice())),
    }
}

fn allow_union<'a>(lists: impl Iterator<Item = Option<&'a [Pattern]>>) -> Vec<Pattern> {
    let mut said = false;
    let out = union(lists.flatten().inspect(|_| said = true));
    if said {
        out
    } else {
        vec![Pattern::everything()]
    }
}

/// The patterns of `lists`, each once, in first-seen order.
fn union<'a>(lists: impl Iterator<Item = &'a [Pattern]>) -> Vec<Pattern> {
    let mut out: Vec<Pattern> = Vec::new();
    for p in lists.flatten() {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_include_the_lesser_ones_and_parse_by_name() {
        assert!(AdminRole::Administrator.grants(AdminRole::Monitoring));
        assert!(AdminRole::Management.grants(AdminRole::Management));
        assert!(!AdminRole::Monitoring.grants(AdminRole::Management));
        for role in ADMIN_ROLES {
            assert_eq!(AdminRole::parse(role.as_str()), Some(role));
        }
        assert_eq!(AdminRole::parse("root"), None);
    }

    fn patterns(list: &[&str]) -> Vec<Pattern> {
        list.iter()
            .map(|s| Pattern::parse(s).expect("pattern"))
            .collect()
    }

    #[test]
    fn effective_permissions_are_unions_and_absent_lists_say_nothing() {
        let none = Lists::default();
        assert_eq!(effective(&none, []), Permissions::everything());
        let sensors = Lists {
            publish: Some(patterns(&["/topic/sensors/#"])),
            deny_publish: patterns(&["/topic/sensors/admin"]),
            ..Lists::default()
        };
        let audit = Lists {
            publish: Some(patterns(&["/queue/audit", "/topic/sensors/#"])),
            deny_subscribe: patterns(&["/topic/test/#"]),
            ..Lists::default()
        };
        let p = effective(&none, [&sensors, &audit]);
        assert_eq!(p.publish, patterns(&["/topic/sensors/#", "/queue/audit"]));
        assert_eq!(p.subscribe, patterns(&["#"]), "no one said: everything");
        assert_eq!(p.deny_publish, patterns(&["/topic/sensors/admin"]));
        assert_eq!(p.deny_subscribe, patterns(&["/topic/test/#"]));
        // An empty list says "nothing": with it, the others decide.
        let own = Lists {
            subscribe: Some(Vec::new()),
            ..Lists::default()
        };
        assert!(effective(&own, [&sensors]).subscribe.is_empty());
    }

    #[test]
    fn role_names_are_plain() {
        for good in ["sensors", "line-7", "a_b", "X9"] {
            assert!(valid_role_name(good), "{good}");
        }
        let long = "r".repeat(ROLE_NAME_LEN_MAX_BYTES + 1);
        for bad in ["", "a.b", "a b", "a/b", "é", long.as_str()] {
            assert!(!valid_role_name(bad), "{bad}");
        }
    }
}
