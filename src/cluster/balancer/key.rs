//! The target key of a connection: which fact of the connection it is
//! taken from, and the regex that narrows it.

use std::net::IpAddr;

use regex::Regex;

/// What a connection says about itself, as far as the adapter and the
/// transport know at the moment the balancer is asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionFacts {
    /// The protocol's client id (MQTT client id, STOMP `client-id`, AMQP
    /// container id).
    pub client_id: Option<String>,
    /// The authenticated user.
    pub user_name: Option<String>,
    /// The peer's IP address.
    pub source_ip: Option<IpAddr>,
    /// The host the client asked for in TLS SNI.
    pub sni_host: Option<String>,
    /// The authenticated user's roles (the users file's `roles`, defined
    /// and built-in alike), in the order the file lists them; empty for an
    /// anonymous user or one without roles.
    pub roles: Vec<String>,
}

/// Which fact the target key is taken from (`key = "..."`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// `client_id`.
    ClientId,
    /// `user_name`.
    UserName,
    /// `source_ip`.
    SourceIp,
    /// `sni_host`.
    SniHost,
    /// `role_name`: the user's first role, in the order of its `roles`
    /// list in the users file; with a key filter, the first role the
    /// filter matches, as ActiveMQ Artemis does.
    RoleName,
}

impl KeySource {
    /// From its configuration name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "client_id" => Self::ClientId,
            "user_name" => Self::UserName,
            "source_ip" => Self::SourceIp,
            "sni_host" => Self::SniHost,
            "role_name" => Self::RoleName,
            _ => return None,
        })
    }

    /// The target key of `facts`, narrowed by `filter` (see
    /// [`filtered_key`]); `None` when the connection has no such fact or
    /// the filter matches none. A user has several roles: the key is the
    /// first one the filter keeps.
    pub fn key(self, facts: &ConnectionFacts, filter: Option<&Regex>) -> Option<String> {
        let raw = match self {
            Self::ClientId => facts.client_id.clone(),
            Self::UserName => facts.user_name.clone(),
            Self::SourceIp => facts.source_ip.map(|ip| ip.to_canonical().to_string()),
            Self::SniHost => facts.sni_host.clone(),
            Self::RoleName => {
                return facts.roles.iter().find_map(|r| filtered_key(r, filter));
            }
        };
        filtered_key(&raw?, filter)
    }
}

/// The key of a connection after the optional filter: the whole key
/// without one; with one, its first match (its first capture group when
/// the pattern has one). A key the filter does not match has no key.
pub(crate) fn filtered_key(raw: &str, filter: Option<&Regex>) -> Option<String> {
    let Some(filter) = filter else {
        return Some(raw.to_owned());
    };
    let captures = filter.captures(raw)?;
    let m = captures.get(1).or_else(|| captures.get(0))?;
    Some(m.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_takes_the_first_group_or_the_whole_match() {
        let group = Regex::new(r"^([a-z]+)-\d+$").expect("regex");
        assert_eq!(
            filtered_key("plant-17", Some(&group)).as_deref(),
            Some("plant")
        );
        let whole = Regex::new(r"\d+").expect("regex");
        assert_eq!(
            filtered_key("plant-17", Some(&whole)).as_deref(),
            Some("17")
        );
        assert_eq!(filtered_key("plant", Some(&whole)), None);
        assert_eq!(filtered_key("plant", None).as_deref(), Some("plant"));
    }

    #[test]
    fn a_mapped_ipv6_source_is_the_ipv4_key() {
        let v4: IpAddr = "10.0.0.1".parse().expect("ip");
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
        let key = |ip| {
            KeySource::SourceIp.key(
                &ConnectionFacts {
                    source_ip: Some(ip),
                    ..Default::default()
                },
                None,
            )
        };
        assert_eq!(key(v4), key(mapped));
    }

    #[test]
    fn the_role_key_is_the_first_role_the_filter_keeps() {
        let facts = ConnectionFacts {
            roles: vec!["monitoring".into(), "management".into()],
            ..Default::default()
        };
        let role = |filter: Option<&str>| {
            let filter = filter.map(|f| Regex::new(f).expect("regex"));
            KeySource::RoleName.key(&facts, filter.as_ref())
        };
        assert_eq!(role(None).as_deref(), Some("monitoring"));
        assert_eq!(role(Some("^man")).as_deref(), Some("man"));
        assert_eq!(role(Some("^admin")), None, "no role matches: no key");
        assert_eq!(
            KeySource::RoleName.key(&ConnectionFacts::default(), None),
            None,
            "a user without roles has no key"
        );
    }
}
