//! Membership against a real etcd: nodes see each other, leave cleanly,
//! drop out when their lease expires, and survive etcd going away.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rosetta_cluster::testing::EtcdServer;
use rosetta_cluster::{
    Balancer, BalancerSettings, KeySource, Membership, MembershipSettings, Policy,
};

fn addresses(port: u16) -> BTreeMap<String, String> {
    BTreeMap::from([("mqtt".to_owned(), format!("127.0.0.1:{port}"))])
}

fn balancer(name: &str, port: u16) -> Arc<Balancer> {
    Arc::new(
        Balancer::new(BalancerSettings {
            name: "default".to_owned(),
            local_name: name.to_owned(),
            local_addresses: addresses(port),
            key: KeySource::ClientId,
            key_filter: None,
            local_target_filter: None,
            policy: Policy::ConsistentHash,
            quorum_size: 1,
            local_target_enabled: true,
            cache_timeout_ms: 0,
            cache_in_etcd: false,
            virtual_nodes: 64,
        })
        .expect("settings"),
    )
}

fn settings(etcd: &str, name: &str, port: u16, ttl_s: u64) -> MembershipSettings {
    MembershipSettings {
        endpoints: vec![etcd.to_owned()],
        node_name: name.to_owned(),
        lease_ttl_s: ttl_s,
        key_prefix: "/test/".to_owned(),
        addresses: addresses(port),
        request_timeout_ms: 1000,
        health_check_interval_ms: 200,
        health_check_timeout_ms: 300,
    }
}

/// A listener standing in for a node's MQTT port, so health checks pass.
fn port() -> (std::net::TcpListener, u16) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let p = l.local_addr().expect("addr").port();
    (l, p)
}

async fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ok() {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within {timeout:?}");
}

fn ready_remote(b: &Balancer) -> Vec<String> {
    b.remote_targets()
        .into_iter()
        .filter(|t| t.ready)
        .map(|t| t.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_see_each_other_and_leave_by_revoke_or_by_lease_expiry() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let ((_la, pa), (_lb, pb), (_lc, pc)) = (port(), port(), port());
    let (a, b, c) = (balancer("a", pa), balancer("b", pb), balancer("c", pc));
    let count = || -> rosetta_cluster::membership::ConnectionCount { Arc::new(|| 7) };
    let ma =
        Membership::spawn(settings(&etcd.endpoint, "a", pa, 2), a.clone(), count()).expect("a");
    let mb =
        Membership::spawn(settings(&etcd.endpoint, "b", pb, 2), b.clone(), count()).expect("b");
    let mc =
        Membership::spawn(settings(&etcd.endpoint, "c", pc, 2), c.clone(), count()).expect("c");
    let long = Duration::from_secs(10);
    wait_for("a sees b and c ready", long, || {
        ready_remote(&a) == ["b", "c"]
    })
    .await;
    wait_for("c sees a and b ready", long, || {
        ready_remote(&c) == ["a", "b"]
    })
    .await;
    assert!(
        a.remote_targets().iter().all(|t| t.connections == 7),
        "the published connection counts arrive"
    );

    // A clean leave is seen at once (the watch), well within the TTL.
    mb.leave().await;
    let took = wait_for("b's leave", long, || {
        a.remote_targets().iter().all(|t| t.name != "b")
    })
    .await;
    assert!(took < Duration::from_millis(1500), "left after {took:?}");

    // A node that stops without revoking (as if killed) drops out when its
    // lease expires: abort its tasks, no revoke.
    mc.abandon();
    let took = wait_for("c's lease expiry", long, || {
        a.remote_targets().iter().all(|t| t.name != "c")
    })
    .await;
    assert!(
        took <= Duration::from_millis(2000 + 1500),
        "expired after {took:?}"
    );
    ma.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_drops_the_remote_targets_and_the_node_rejoins() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let ((_la, pa), (_lb, pb)) = (port(), port());
    let (a, b) = (balancer("a", pa), balancer("b", pb));
    let zero = || -> rosetta_cluster::membership::ConnectionCount { Arc::new(|| 0) };
    let endpoint = etcd.endpoint.clone();
    let ma = Membership::spawn(settings(&endpoint, "a", pa, 2), a.clone(), zero()).expect("a");
    let mb = Membership::spawn(settings(&endpoint, "b", pb, 2), b.clone(), zero()).expect("b");
    let long = Duration::from_secs(10);
    wait_for("a sees b", long, || ready_remote(&a) == ["b"]).await;
    let client_port: u16 = endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    drop(etcd);
    wait_for("a forgets b without etcd", long, || {
        a.remote_targets().is_empty()
    })
    .await;
    // etcd back on the same port (empty: a new cluster), both rejoin.
    let again = EtcdServer::start_on(client_port).expect("etcd again");
    assert_eq!(again.endpoint, endpoint);
    wait_for("a sees b again", Duration::from_secs(15), || {
        ready_remote(&a) == ["b"]
    })
    .await;
    ma.leave().await;
    mb.leave().await;
}
