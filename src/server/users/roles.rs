//! Admin roles: what a user may do through the admin API (issue 18).
//!
//! Each role includes the ones before it, as RabbitMQ's tags do for its
//! management API: `management` may read what `monitoring` reads, and an
//! `administrator` may do everything. A user without roles may use the
//! protocols but not the admin API.

use std::fmt;

/// One admin role, from least to most power.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AdminRole {
    /// Reads the API: overview, queues, connections.
    Monitoring,
    /// Also acts on queues and connections: create, purge, delete, close.
    Management,
    /// Also manages users and their roles.
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
}
