//! `[cluster]` in the server: the balancers connections ask (each
//! listener its own, `[[cluster.balancers]]`, or the default one; through
//! its broker handle, [`Ticket::broker`](super::admission::Ticket::broker)), and the etcd
//! membership that feeds it, started once the listeners are bound (their
//! addresses are what the node publishes) and left first on shutdown.
//! Without `[cluster]` none of this exists.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rosetta_cluster::{
    Balancer, BalancerSettings, Balancers, ConnectionFacts, Decision, KeySource, Membership,
    MembershipSettings, Policy, Target,
};
use rosetta_config::{
    BalancerConfig, BalancerPolicy, ClusterConfig, ListenerKind, MqttRedirect, TargetKey,
};
use rosetta_core::AccessControl;
use rosetta_neutral::{Placement, PlacementRequest, RedirectTarget};

/// What the transport knows of a connection, for its target key and
/// where to redirect it.
pub(crate) struct Transport {
    /// The listener it came in on: a redirect names the same kind.
    pub(crate) listener: ListenerKind,
    /// The peer's address (`source_ip`).
    pub(crate) source: IpAddr,
    /// TLS SNI (`sni_host`).
    pub(crate) sni_host: Option<String>,
}

/// The balancers of this node, with what their answers need: the
/// default one (`[cluster.balancer]`) and one per `[[cluster.balancers]]`
/// entry, each serving the listeners it names.
pub(crate) struct ClusterNode {
    /// All of them, the default first, fed alike by membership.
    balancers: Balancers,
    /// The same, with their protocol settings, in the same order.
    routes: Vec<Route>,
    /// The route of each listener an entry names (by listener key);
    /// every other listener takes `routes[0]`.
    by_listener: BTreeMap<String, usize>,
    /// This node's published addresses by listener key, once it joined
    /// (the discovery route answers them for keys that belong here).
    published: std::sync::OnceLock<BTreeMap<String, String>>,
}

/// One balancer and how its answers are given.
struct Route {
    balancer: Arc<Balancer>,
    /// MQTT 5 clients sent elsewhere get 0x9D rather than 0x9C.
    permanent: bool,
    /// MQTT 3.1.1 and STOMP clients that belong elsewhere are proxied
    /// there (`proxy`), with these limits.
    proxy: Option<ProxyLimits>,
    /// The users' roles, for the `role_name` key; `None` when the key is
    /// another (no lookup at every connect for nothing).
    roles: Option<Arc<dyn AccessControl>>,
}

/// `[cluster.balancer]`'s proxy limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProxyLimits {
    pub(crate) connect_timeout: std::time::Duration,
    pub(crate) idle_timeout: std::time::Duration,
}

/// The name of the default balancer (its namespace in etcd).
const DEFAULT_BALANCER: &str = "default";

impl Route {
    /// The balancer of `b`, named `name`; its errors name `section`'s keys.
    fn new(
        name: String,
        local_name: &str,
        b: &BalancerConfig,
        section: &str,
        access: &Arc<dyn AccessControl>,
    ) -> anyhow::Result<Self> {
        let settings = BalancerSettings {
            name,
            local_name: local_name.to_owned(),
            // This node's own addresses are published by membership; the
            // balancer answers Local for it.
            local_addresses: BTreeMap::new(),
            key: match b.key {
                TargetKey::ClientId => KeySource::ClientId,
                TargetKey::UserName => KeySource::UserName,
                TargetKey::SourceIp => KeySource::SourceIp,
                TargetKey::SniHost => KeySource::SniHost,
                TargetKey::RoleName => KeySource::RoleName,
            },
            key_filter: b.key_filter.clone(),
            local_target_filter: b.local_target_filter.clone(),
            policy: match b.policy {
                BalancerPolicy::FirstElement => Policy::FirstElement,
                BalancerPolicy::RoundRobin => Policy::RoundRobin,
                BalancerPolicy::ConsistentHash => Policy::ConsistentHash,
                BalancerPolicy::LeastConnections => Policy::LeastConnections,
            },
            quorum_size: b.quorum_size as usize,
            local_target_enabled: b.local_target_enabled,
            cache_timeout_ms: b.cache_timeout_ms,
            cache_in_etcd: b.cache_in_etcd,
            virtual_nodes: b.virtual_nodes,
        };
        let balancer = Balancer::new(settings).with_context(|| format!("[{section}]"))?;
        Ok(Self {
            balancer: Arc::new(balancer),
            permanent: b.mqtt_redirect == MqttRedirect::ServerMoved,
            proxy: b.proxy.then(|| ProxyLimits {
                connect_timeout: std::time::Duration::from_millis(b.proxy_connect_timeout_ms),
                idle_timeout: std::time::Duration::from_millis(b.proxy_idle_timeout_ms),
            }),
            roles: (b.key == TargetKey::RoleName).then(|| Arc::clone(access)),
        })
    }
}

impl ClusterNode {
    /// The balancers of `[cluster.balancer]` and `[[cluster.balancers]]`;
    /// their errors name the key.
    pub(crate) fn new(
        config: &ClusterConfig,
        access: Arc<dyn AccessControl>,
    ) -> anyhow::Result<Arc<Self>> {
        let mut routes = vec![Route::new(
            DEFAULT_BALANCER.to_owned(),
            &config.node_name,
            &config.balancer,
            "cluster.balancer",
            &access,
        )?];
        let mut by_listener = BTreeMap::new();
        for (i, b) in config.balancers.iter().enumerate() {
            let name = b.listeners.join("+");
            let section = format!("cluster.balancers[{i}]");
            routes.push(Route::new(name, &config.node_name, b, &section, &access)?);
            for l in &b.listeners {
                by_listener.insert(l.clone(), i + 1);
            }
        }
        let balancers = Balancers::new(routes.iter().map(|r| Arc::clone(&r.balancer)).collect());
        Ok(Arc::new(Self {
            balancers,
            routes,
            by_listener,
            published: std::sync::OnceLock::new(),
        }))
    }

    /// The route of the listener `listener` (its key).
    fn route(&self, listener: &str) -> &Route {
        let i = self.by_listener.get(listener).copied().unwrap_or(0);
        &self.routes[i]
    }

    /// Whether any balancer of this cluster proxies (then other nodes'
    /// connections come in, carrying clients).
    pub(crate) fn proxies(&self) -> bool {
        self.routes.iter().any(|r| r.proxy.is_some())
    }

    /// The proxy's limits on the listener `listener`, when its balancer
    /// proxies.
    pub(crate) fn proxy(&self, listener: ListenerKind) -> Option<ProxyLimits> {
        self.route(listener.key()).proxy
    }

    /// Registers this node in etcd with the addresses of `bound`, or,
    /// with a static pool (`[[cluster.targets]]`), starts checking it.
    pub(crate) fn join(
        &self,
        config: &ClusterConfig,
        bound: &[(ListenerKind, SocketAddr)],
        connections: rosetta_cluster::membership::ConnectionCount,
    ) -> anyhow::Result<Membership> {
        let settings = MembershipSettings {
            endpoints: config.etcd.clone(),
            node_name: config.node_name.clone(),
            lease_ttl_s: config.lease_ttl_s,
            key_prefix: config.key_prefix.clone(),
            addresses: advertised(config, bound),
            request_timeout_ms: config.request_timeout_ms,
            health_check_interval_ms: config.health_check_interval_ms,
            health_check_timeout_ms: config.health_check_timeout_ms,
        };
        let _ = self.published.set(settings.addresses.clone());
        if config.etcd.is_empty() {
            let targets: Vec<Target> = config
                .targets
                .iter()
                .map(|t| Target::new(t.name.clone(), t.addresses.clone()))
                .collect();
            tracing::info!(node = %settings.node_name, addresses = ?settings.addresses, targets = targets.len(), "cluster: static pool");
            return Ok(Membership::spawn_static(
                targets,
                self.balancers.clone(),
                Duration::from_millis(config.health_check_interval_ms),
                Duration::from_millis(config.health_check_timeout_ms),
            ));
        }
        tracing::info!(node = %settings.node_name, addresses = ?settings.addresses, "cluster: joining");
        Membership::spawn(settings, self.balancers.clone(), connections).context("[cluster] etcd")
    }

    /// Where a connection that came in over `transport` belongs.
    pub(crate) fn place(&self, request: &PlacementRequest<'_>, transport: &Transport) -> Placement {
        self.place_on(request, transport, transport.listener.key())
    }

    /// Where a connection belongs, by the balancer of the listener it came
    /// in on, sent to the target's `listener` (the proxy asks for the
    /// plain listener of the client's protocol).
    pub(crate) fn place_on(
        &self,
        request: &PlacementRequest<'_>,
        transport: &Transport,
        listener: &str,
    ) -> Placement {
        let route = self.route(transport.listener.key());
        let facts = ConnectionFacts {
            client_id: request.client_id.map(str::to_owned),
            user_name: request.user.map(str::to_owned),
            source_ip: Some(transport.source),
            sni_host: transport.sni_host.clone(),
            roles: match (&route.roles, request.user) {
                (Some(access), Some(user)) => access.roles(user),
                _ => Vec::new(),
            },
        };
        match route.balancer.decide(&facts, listener, Instant::now()) {
            Decision::Local => Placement::Local,
            Decision::Redirect { node, address } => {
                match RedirectTarget::parse(&address, route.permanent) {
                    Some(target) => {
                        tracing::debug!(%node, %address, "cluster: redirecting");
                        Placement::Redirect(target)
                    }
                    None => {
                        tracing::warn!(%node, %address, "cluster: a node published an address that is not host:port");
                        Placement::Unavailable
                    }
                }
            }
            Decision::Unavailable => Placement::Unavailable,
        }
    }
}

impl ClusterNode {
    /// Where a client with target key `key` belongs, as the node name and
    /// the `host:port` of its `listener`; `None` when no node is ready (or
    /// the one chosen has no such listener). The key stands for whichever
    /// fact the balancer is keyed by; `key_filter` applies as at connect.
    /// The balancer asked is the one of `listener`, as for a client
    /// connecting there.
    pub(crate) fn discover(&self, key: &str, listener: &str) -> Option<(String, String)> {
        let balancer = &self.route(listener).balancer;
        let facts = ConnectionFacts {
            client_id: Some(key.to_owned()),
            user_name: Some(key.to_owned()),
            source_ip: key.parse().ok(),
            sni_host: Some(key.to_owned()),
            roles: vec![key.to_owned()],
        };
        match balancer.decide(&facts, listener, Instant::now()) {
            Decision::Local => {
                let address = self.published.get()?.get(listener)?.clone();
                Some((balancer.local_name(), address))
            }
            Decision::Redirect { node, address } => Some((node, address)),
            Decision::Unavailable => None,
        }
    }

    /// Whether `ip` is the address of another node of the cluster, as it
    /// publishes its listeners: only such a peer may send a PROXY header.
    /// Host names are not resolved; a node known by name is not trusted.
    pub(crate) fn is_member_address(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.balancers.remote_targets().iter().any(|t| {
            t.addresses.values().any(|authority| {
                RedirectTarget::parse(authority, false)
                    .and_then(|a| a.host.parse::<IpAddr>().ok())
                    .is_some_and(|host| canonical(host) == ip)
            })
        })
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The addresses this node publishes: `advertise` where given, else each
/// client listener's bound address (its port on `advertise_host` when
/// set; an unspecified address becomes loopback, with a warning).
fn advertised(
    config: &ClusterConfig,
    bound: &[(ListenerKind, SocketAddr)],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (kind, addr) in bound {
        if *kind == ListenerKind::Metrics {
            continue;
        }
        let key = kind.key().to_owned();
        if let Some(given) = config.advertise.get(&key) {
            out.insert(key, given.clone());
            continue;
        }
        let host = match &config.advertise_host {
            Some(h) => h.clone(),
            None if addr.ip().is_unspecified() => {
                tracing::warn!(listener = %key, %addr, "cluster: listener bound to every interface; publishing 127.0.0.1 (set [cluster] advertise_host)");
                "127.0.0.1".to_owned()
            }
            None => addr.ip().to_string(),
        };
        let authority = if host.contains(':') {
            format!("[{host}]:{}", addr.port())
        } else {
            format!("{host}:{}", addr.port())
        };
        out.insert(key, authority);
    }
    out
}

#[cfg(test)]
mod tests {
    use rosetta_config::Config;

    #[test]
    fn a_bad_balancer_regex_stops_the_start_naming_its_key() {
        let dir = tempfile::tempdir().expect("dir");
        let text = format!(
            "data_dir = {:?}\n[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nnode_name = \"a\"\n[cluster.balancer]\nkey_filter = \"(unclosed\"\n",
            dir.path().join("data")
        );
        let config = Config::parse(&text, "x").expect("the file itself parses");
        let err = crate::preflight(&config).err().expect("refused");
        assert!(
            format!("{err:#}").contains("cluster.balancer.key_filter"),
            "{err:#}"
        );
    }
}
