//! `[cluster]`: membership on etcd and the broker balancer (issue 19).
//!
//! Absent (the default), the broker is one node: nothing here starts and
//! no etcd is needed. Present, the pool of targets is either the nodes
//! registered under `key_prefix` in the etcd cluster `etcd` names (this
//! node among them), or the fixed list `[[cluster.targets]]`; the
//! balancer of `[cluster.balancer]` decides at each connect whether the
//! client belongs here. See `docs/cluster.md`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{invalid, Config, Invalid};

/// A node that dies drops out of the others' pools after this long: a few
/// seconds, so its clients are sent elsewhere soon, yet long enough that a
/// keep-alive every third of it survives a busy second.
pub const LEASE_TTL_S_DEFAULT: u64 = 5;
/// Shortest lease accepted: etcd itself raises shorter TTLs to its minimum
/// (about 1.5 election timeouts, 1.5 s by default).
pub const LEASE_TTL_S_MIN: u64 = 2;
/// Longest lease accepted: beyond it a dead node is redirected to for
/// minutes.
pub const LEASE_TTL_S_MAX: u64 = 300;
/// Where the records live, so several clusters can share one etcd.
pub const KEY_PREFIX_DEFAULT: &str = "/rosetta/";
/// One etcd call's time limit: see `rosetta_cluster::etcd`.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 1500;
/// How often each remote target is connected to: once a second notices a
/// dead node well before its lease expires.
pub const HEALTH_CHECK_INTERVAL_MS_DEFAULT: u64 = 1000;
/// A check's connect time limit: a loaded node on a LAN answers in
/// milliseconds.
pub const HEALTH_CHECK_TIMEOUT_MS_DEFAULT: u64 = 500;
/// Most etcd endpoints: an etcd cluster has 3 to 7 members.
pub const ETCD_ENDPOINTS_MAX: usize = 16;
/// Most `[[cluster.targets]]`: a static pool is a handful of nodes; a
/// fleet larger than this wants etcd.
pub const STATIC_TARGETS_MAX: usize = 256;
/// Longest node name: it is part of an etcd key and every log line.
pub const NODE_NAME_LEN_MAX_BYTES: usize = 128;
/// Points per target on the consistent-hash ring (see
/// `rosetta_cluster::balancer::ring`).
pub const VIRTUAL_NODES_DEFAULT: u32 = 160;
/// The proxy's time limit to reach a target: a node on the same LAN
/// accepts in milliseconds; past it the client is served here instead.
pub const PROXY_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1000;
/// A proxied connection with no byte either way for this long is closed:
/// above any keep-alive or heart-beat a client is allowed (MQTT
/// `keep_alive_max_s`), so only a peer that vanished is cut.
pub const PROXY_IDLE_TIMEOUT_MS_DEFAULT: u64 = 3_600_000;

/// `[cluster]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd endpoints, `http://host:port`; empty: the pool is `targets`.
    #[serde(default)]
    pub etcd: Vec<String>,
    /// `[[cluster.targets]]`: a fixed pool, health-checked, instead of
    /// etcd. An entry named as this node is skipped, so one list serves
    /// every node.
    #[serde(default)]
    pub targets: Vec<StaticTarget>,
    /// This node's name, unique in the cluster.
    pub node_name: String,
    /// The registration lease's TTL.
    #[serde(default = "lease_ttl_s_default")]
    pub lease_ttl_s: u64,
    /// Prefix of this cluster's keys in etcd.
    #[serde(default = "key_prefix_default")]
    pub key_prefix: String,
    /// One etcd call's time limit.
    #[serde(default = "request_timeout_ms_default")]
    pub request_timeout_ms: u64,
    /// How often remote targets are health-checked.
    #[serde(default = "health_check_interval_ms_default")]
    pub health_check_interval_ms: u64,
    /// A health check's connect time limit.
    #[serde(default = "health_check_timeout_ms_default")]
    pub health_check_timeout_ms: u64,
    /// Client-facing addresses published, by listener key (`mqtt =
    /// "broker-a.example:1883"`); a listener not named here publishes the
    /// address it is bound to (its port on `advertise_host` when set).
    #[serde(default)]
    pub advertise: BTreeMap<String, String>,
    /// The host published for listeners not in `advertise`; unset: the
    /// bound address (loopback stays loopback; an unspecified address
    /// becomes 127.0.0.1, with a warning).
    #[serde(default)]
    pub advertise_host: Option<String>,
    /// `[cluster.balancer]`: the balancer of every listener no entry of
    /// `balancers` names.
    #[serde(default)]
    pub balancer: BalancerConfig,
    /// `[[cluster.balancers]]`: balancers of their own for the listeners
    /// each names (`listeners = ["mqtts", "wss"]`).
    #[serde(default)]
    pub balancers: Vec<BalancerConfig>,
}

/// One `[[cluster.targets]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticTarget {
    /// Its node name (`node_name` in its own `[cluster]`).
    pub name: String,
    /// Its client-facing addresses by listener key, `host:port`.
    pub addresses: BTreeMap<String, String>,
}

impl ClusterConfig {
    /// The balancer configured for the listener `listener` (its key:
    /// `mqtt`, `wss`, ...): the `[[cluster.balancers]]` entry naming it,
    /// else `[cluster.balancer]`.
    pub fn balancer_for(&self, listener: &str) -> &BalancerConfig {
        self.balancers
            .iter()
            .find(|b| b.listeners.iter().any(|l| l == listener))
            .unwrap_or(&self.balancer)
    }
}

/// Which fact of a connection is its target key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKey {
    /// The protocol's client id.
    ClientId,
    /// The authenticated user.
    UserName,
    /// The peer's IP address.
    SourceIp,
    /// The TLS SNI host name.
    SniHost,
    /// The authenticated user's role (users file `roles`): the first one
    /// `key_filter` matches.
    RoleName,
}

/// How a target is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalancerPolicy {
    /// The first ready target in name order.
    FirstElement,
    /// Each new key the next ready target.
    RoundRobin,
    /// A hash ring with virtual nodes.
    ConsistentHash,
    /// The target with the fewest connections.
    LeastConnections,
}

/// What MQTT 5 clients sent elsewhere are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MqttRedirect {
    /// CONNACK 0x9C, Use another server (for now).
    UseAnotherServer,
    /// CONNACK 0x9D, Server moved (for good).
    ServerMoved,
}

/// `[cluster.balancer]`, and each `[[cluster.balancers]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BalancerConfig {
    /// The listeners (keys of `[listeners]`) this balancer serves; only in
    /// `[[cluster.balancers]]` (the default balancer serves the rest).
    pub listeners: Vec<String>,
    /// The target key's source.
    pub key: TargetKey,
    /// A regex narrowing the key (its first group, or the whole match).
    pub key_filter: Option<String>,
    /// A regex: matching keys stay on this node.
    pub local_target_filter: Option<String>,
    /// The policy.
    pub policy: BalancerPolicy,
    /// Fewest ready targets (this node included when a target) for the
    /// balancer to place anyone; below it clients are refused as
    /// "server unavailable".
    pub quorum_size: u32,
    /// This node takes clients itself.
    pub local_target_enabled: bool,
    /// How long a key's target is remembered (0: not at all).
    pub cache_timeout_ms: u64,
    /// A key's target is remembered in etcd too, under a lease of the
    /// cache timeout, so that every node answers the same for it.
    pub cache_in_etcd: bool,
    /// Points per target on the consistent-hash ring.
    pub virtual_nodes: u32,
    /// The CONNACK reason MQTT 5 clients get with the Server Reference.
    pub mqtt_redirect: MqttRedirect,
    /// MQTT 3.1.1 and STOMP clients that belong on another node are
    /// proxied to it byte for byte (false: served here).
    pub proxy: bool,
    /// The proxy's time limit to reach the target.
    pub proxy_connect_timeout_ms: u64,
    /// A proxied connection silent both ways for this long is closed.
    pub proxy_idle_timeout_ms: u64,
}

impl Default for BalancerConfig {
    fn default() -> Self {
        Self {
            listeners: Vec::new(),
            key: TargetKey::ClientId,
            key_filter: None,
            local_target_filter: None,
            policy: BalancerPolicy::ConsistentHash,
            quorum_size: 1,
            local_target_enabled: true,
            cache_timeout_ms: 0,
            cache_in_etcd: false,
            virtual_nodes: VIRTUAL_NODES_DEFAULT,
            mqtt_redirect: MqttRedirect::UseAnotherServer,
            proxy: false,
            proxy_connect_timeout_ms: PROXY_CONNECT_TIMEOUT_MS_DEFAULT,
            proxy_idle_timeout_ms: PROXY_IDLE_TIMEOUT_MS_DEFAULT,
        }
    }
}

fn lease_ttl_s_default() -> u64 {
    LEASE_TTL_S_DEFAULT
}
fn key_prefix_default() -> String {
    KEY_PREFIX_DEFAULT.to_owned()
}
fn request_timeout_ms_default() -> u64 {
    REQUEST_TIMEOUT_MS_DEFAULT
}
fn health_check_interval_ms_default() -> u64 {
    HEALTH_CHECK_INTERVAL_MS_DEFAULT
}
fn health_check_timeout_ms_default() -> u64 {
    HEALTH_CHECK_TIMEOUT_MS_DEFAULT
}

impl Config {
    pub(crate) fn check_cluster(&self) -> Result<(), Invalid> {
        let Some(c) = &self.cluster else {
            return Ok(());
        };
        match (c.etcd.is_empty(), c.targets.is_empty()) {
            (true, true) => {
                return Err(invalid(
                    "cluster.etcd",
                    format!("needs 1 to {ETCD_ENDPOINTS_MAX} endpoints, or a static pool in [[cluster.targets]]"),
                ))
            }
            (false, false) => {
                return Err(invalid(
                    "cluster.targets",
                    "the pool is either the nodes in etcd or a static list, not both",
                ))
            }
            _ => {}
        }
        if c.etcd.len() > ETCD_ENDPOINTS_MAX {
            return Err(invalid(
                "cluster.etcd",
                format!("at most {ETCD_ENDPOINTS_MAX} endpoints"),
            ));
        }
        check_static_targets(&c.targets)?;
        for e in &c.etcd {
            let ok = e
                .strip_prefix("http://")
                .is_some_and(|rest| rest.trim_end_matches('/').contains(':'));
            if !ok {
                return Err(invalid(
                    "cluster.etcd",
                    format!("{e:?}: write http://host:port (TLS to etcd is not supported yet)"),
                ));
            }
        }
        if !is_node_name(&c.node_name) {
            return Err(invalid(
                "cluster.node_name",
                format!("1 to {NODE_NAME_LEN_MAX_BYTES} of A-Z a-z 0-9 - _ ."),
            ));
        }
        if !(LEASE_TTL_S_MIN..=LEASE_TTL_S_MAX).contains(&c.lease_ttl_s) {
            return Err(invalid(
                "cluster.lease_ttl_s",
                format!("must be {LEASE_TTL_S_MIN}-{LEASE_TTL_S_MAX}"),
            ));
        }
        if !c.key_prefix.starts_with('/') || !c.key_prefix.ends_with('/') {
            return Err(invalid("cluster.key_prefix", "must start and end with /"));
        }
        for (key, value) in [
            ("cluster.request_timeout_ms", c.request_timeout_ms),
            (
                "cluster.health_check_interval_ms",
                c.health_check_interval_ms,
            ),
            ("cluster.health_check_timeout_ms", c.health_check_timeout_ms),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be above 0"));
            }
        }
        check_addresses("cluster.advertise", &c.advertise)?;
        if !c.balancer.listeners.is_empty() {
            return Err(invalid(
                "cluster.balancer.listeners",
                "the default balancer serves every listener no [[cluster.balancers]] entry names; name listeners there",
            ));
        }
        let without_etcd = c.etcd.is_empty();
        check_balancer(&c.balancer, "cluster.balancer", without_etcd)?;
        if c.balancers.len() > BALANCERS_MAX {
            return Err(invalid(
                "cluster.balancers",
                format!("at most {BALANCERS_MAX} entries"),
            ));
        }
        let mut named = Vec::new();
        for (i, b) in c.balancers.iter().enumerate() {
            let section = format!("cluster.balancers[{i}]");
            check_balancer(b, &section, without_etcd)?;
            if b.listeners.is_empty() {
                return Err(invalid(
                    format!("{section}.listeners"),
                    "name the listeners this balancer serves",
                ));
            }
            for l in &b.listeners {
                if !ADVERTISED_LISTENERS.contains(&l.as_str()) {
                    return Err(invalid(
                        format!("{section}.listeners"),
                        format!("{l:?} is not a listener name"),
                    ));
                }
                if named.contains(&l) {
                    return Err(invalid(
                        format!("{section}.listeners"),
                        format!("{l:?} has a balancer already"),
                    ));
                }
                named.push(l);
            }
        }
        Ok(())
    }
}

/// Shortest cache timeout with `cache_in_etcd`: the entries live under
/// etcd leases, whose TTL is whole seconds (and etcd raises short ones to
/// its own minimum, about 1.5 election timeouts).
pub const CACHE_IN_ETCD_TIMEOUT_MS_MIN: u64 = 1000;

/// Most `[[cluster.balancers]]` entries: one per listener at most.
pub const BALANCERS_MAX: usize = ADVERTISED_LISTENERS.len();

/// Whether `name` may name a node: it is part of an etcd key and of
/// every log line.
fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NODE_NAME_LEN_MAX_BYTES
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
}

/// Whether `address` is `host:port`.
fn is_authority(address: &str) -> bool {
    address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// Client-facing addresses by listener key (`advertise`, a static
/// target's `addresses`): each key a listener name, each value
/// `host:port`; errors name `table.<listener>`.
fn check_addresses(table: &str, addresses: &BTreeMap<String, String>) -> Result<(), Invalid> {
    for (listener, address) in addresses {
        if !ADVERTISED_LISTENERS.contains(&listener.as_str()) {
            return Err(invalid(
                format!("{table}.{listener}"),
                "not a listener name",
            ));
        }
        if !is_authority(address) {
            return Err(invalid(format!("{table}.{listener}"), "write host:port"));
        }
    }
    Ok(())
}

/// The checks of `[[cluster.targets]]`: at most [`STATIC_TARGETS_MAX`],
/// names unique and well formed, each with at least one listener address.
fn check_static_targets(targets: &[StaticTarget]) -> Result<(), Invalid> {
    if targets.len() > STATIC_TARGETS_MAX {
        return Err(invalid(
            "cluster.targets",
            format!("at most {STATIC_TARGETS_MAX} entries"),
        ));
    }
    for (i, t) in targets.iter().enumerate() {
        let section = format!("cluster.targets[{i}]");
        if !is_node_name(&t.name) {
            return Err(invalid(
                format!("{section}.name"),
                format!("1 to {NODE_NAME_LEN_MAX_BYTES} of A-Z a-z 0-9 - _ ."),
            ));
        }
        if targets[..i].iter().any(|o| o.name == t.name) {
            return Err(invalid(
                format!("{section}.name"),
                format!("{:?} is named twice", t.name),
            ));
        }
        if t.addresses.is_empty() {
            return Err(invalid(
                format!("{section}.addresses"),
                "name at least one listener's address (mqtt = \"host:port\")",
            ));
        }
        check_addresses(&format!("{section}.addresses"), &t.addresses)?;
    }
    Ok(())
}

/// The checks of one balancer's values; `section` names it in errors.
/// Without etcd nothing shares choices or publishes connection counts.
fn check_balancer(b: &BalancerConfig, section: &str, without_etcd: bool) -> Result<(), Invalid> {
    if without_etcd && b.cache_in_etcd {
        return Err(invalid(
            format!("{section}.cache_in_etcd"),
            "needs [cluster] etcd (a static pool has no etcd to share choices through)",
        ));
    }
    if without_etcd && b.policy == BalancerPolicy::LeastConnections {
        return Err(invalid(
            format!("{section}.policy"),
            "least_connections needs [cluster] etcd (the nodes publish their connection counts there)",
        ));
    }
    if b.virtual_nodes == 0 || b.virtual_nodes > 4096 {
        return Err(invalid(
            format!("{section}.virtual_nodes"),
            "must be 1-4096",
        ));
    }
    if b.cache_in_etcd && b.cache_timeout_ms < CACHE_IN_ETCD_TIMEOUT_MS_MIN {
        return Err(invalid(
            format!("{section}.cache_in_etcd"),
            format!("needs cache_timeout_ms of at least {CACHE_IN_ETCD_TIMEOUT_MS_MIN} (an etcd lease lives whole seconds)"),
        ));
    }
    for (key, value) in [
        ("proxy_connect_timeout_ms", b.proxy_connect_timeout_ms),
        ("proxy_idle_timeout_ms", b.proxy_idle_timeout_ms),
    ] {
        if value == 0 {
            return Err(invalid(format!("{section}.{key}"), "must be above 0"));
        }
    }
    Ok(())
}

/// The listeners whose address a node publishes (`[listeners]` keys;
/// `metrics` serves no client).
const ADVERTISED_LISTENERS: &[&str] = &[
    "mqtt",
    "stomp",
    "amqp",
    "websocket",
    "mqtts",
    "stomps",
    "amqps",
    "wss",
    "any",
];

#[cfg(test)]
mod tests {
    use crate::{BalancerPolicy, Config, TargetKey};

    #[test]
    fn a_cluster_section_parses_with_defaults_for_what_it_leaves_out() {
        let c = Config::parse(
            "[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nnode_name = \"a\"\n[cluster.balancer]\nkey = \"user_name\"\n",
            "x",
        )
        .expect("parses");
        let cluster = c.cluster.expect("cluster");
        assert_eq!(cluster.lease_ttl_s, super::LEASE_TTL_S_DEFAULT);
        assert_eq!(cluster.balancer.key, TargetKey::UserName);
        assert_eq!(cluster.balancer.policy, BalancerPolicy::ConsistentHash);
        assert!(Config::default().cluster.is_none(), "one node by default");
    }

    #[test]
    fn a_listener_named_by_a_balancer_entry_gets_that_balancer() {
        let c = Config::parse(
            "[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nnode_name = \"a\"\n[cluster.balancer]\nkey = \"user_name\"\n[[cluster.balancers]]\nlisteners = [\"mqtts\", \"wss\"]\nkey = \"sni_host\"\npolicy = \"first_element\"\n",
            "x",
        )
        .expect("parses");
        let cluster = c.cluster.expect("cluster");
        assert_eq!(cluster.balancer_for("wss").key, TargetKey::SniHost);
        assert_eq!(
            cluster.balancer_for("mqtts").policy,
            BalancerPolicy::FirstElement
        );
        assert_eq!(cluster.balancer_for("mqtt").key, TargetKey::UserName);
    }

    #[test]
    fn a_static_pool_parses_without_etcd() {
        let c = Config::parse(
            "[cluster]\nnode_name = \"a\"\n[[cluster.targets]]\nname = \"a\"\naddresses = { mqtt = \"10.0.0.1:1883\" }\n[[cluster.targets]]\nname = \"b\"\naddresses = { mqtt = \"10.0.0.2:1883\", amqp = \"10.0.0.2:5672\" }\n",
            "x",
        )
        .expect("parses");
        let cluster = c.cluster.expect("cluster");
        assert!(cluster.etcd.is_empty());
        assert_eq!(cluster.targets.len(), 2);
        assert_eq!(cluster.targets[1].addresses["amqp"], "10.0.0.2:5672");
    }

    #[test]
    fn bad_cluster_values_name_their_key() {
        for (doc, key) in [
            ("etcd = []\nnode_name = \"a\"", "cluster.etcd"),
            (
                "etcd = [\"https://e:2379\"]\nnode_name = \"a\"",
                "cluster.etcd",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a/b\"",
                "cluster.node_name",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\nlease_ttl_s = 1",
                "cluster.lease_ttl_s",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\nadvertise = { nope = \"h:1\" }",
                "cluster.advertise.nope",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\nbalancer = { policy = \"random\" }",
                "cluster.balancer.policy",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\nbalancer = { cache_in_etcd = true }",
                "cluster.balancer.cache_in_etcd",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\nbalancer = { listeners = [\"mqtt\"] }",
                "cluster.balancer.listeners",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\n[[cluster.balancers]]\nkey = \"user_name\"",
                "cluster.balancers[0].listeners",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\n[[cluster.balancers]]\nlisteners = [\"mqtt\", \"udp\"]",
                "cluster.balancers[0].listeners",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\n[[cluster.balancers]]\nlisteners = [\"mqtt\"]\n[[cluster.balancers]]\nlisteners = [\"wss\", \"mqtt\"]",
                "cluster.balancers[1].listeners",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\n[[cluster.balancers]]\nlisteners = [\"mqtt\"]\nvirtual_nodes = 0",
                "cluster.balancers[0].virtual_nodes",
            ),
            (
                "node_name = \"a\"",
                "cluster.etcd",
            ),
            (
                "etcd = [\"http://e:2379\"]\nnode_name = \"a\"\n[[cluster.targets]]\nname = \"b\"\naddresses = { mqtt = \"h:1\" }",
                "cluster.targets",
            ),
            (
                "node_name = \"a\"\n[[cluster.targets]]\nname = \"b c\"\naddresses = { mqtt = \"h:1\" }",
                "cluster.targets[0].name",
            ),
            (
                "node_name = \"a\"\n[[cluster.targets]]\nname = \"b\"\naddresses = { mqtt = \"h:1\" }\n[[cluster.targets]]\nname = \"b\"\naddresses = { mqtt = \"h:2\" }",
                "cluster.targets[1].name",
            ),
            (
                "node_name = \"a\"\n[[cluster.targets]]\nname = \"b\"\naddresses = {}",
                "cluster.targets[0].addresses",
            ),
            (
                "node_name = \"a\"\n[[cluster.targets]]\nname = \"b\"\naddresses = { mqtt = \"h\" }",
                "cluster.targets[0].addresses.mqtt",
            ),
            (
                "node_name = \"a\"\n[[cluster.targets]]\nname = \"b\"\naddresses = { smtp = \"h:25\" }",
                "cluster.targets[0].addresses.smtp",
            ),
            (
                "node_name = \"a\"\nbalancer = { policy = \"least_connections\" }\n[[cluster.targets]]\nname = \"b\"\naddresses = { mqtt = \"h:1\" }",
                "cluster.balancer.policy",
            ),
            (
                "node_name = \"a\"\nbalancer = { cache_in_etcd = true, cache_timeout_ms = 5000 }\n[[cluster.targets]]\nname = \"b\"\naddresses = { mqtt = \"h:1\" }",
                "cluster.balancer.cache_in_etcd",
            ),
        ] {
            let err = Config::parse(&format!("[cluster]\n{doc}\n"), "x").expect_err(doc);
            assert!(err.to_string().contains(key), "{doc}: {err}");
        }
    }
}
