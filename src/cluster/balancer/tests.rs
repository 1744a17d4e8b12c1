//! The balancer's decisions over a pool fed by hand, on a given clock.

use super::*;

fn addresses(mqtt_port: u16) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("mqtt".to_owned(), format!("127.0.0.1:{mqtt_port}")),
        ("amqp".to_owned(), format!("127.0.0.1:{}", mqtt_port + 1)),
    ])
}

fn settings(policy: Policy) -> BalancerSettings {
    BalancerSettings {
        name: "default".to_owned(),
        local_name: "a".to_owned(),
        local_addresses: addresses(1000),
        key: KeySource::ClientId,
        key_filter: None,
        local_target_filter: None,
        policy,
        quorum_size: 1,
        local_target_enabled: true,
        cache_timeout_ms: 0,
        cache_in_etcd: false,
        virtual_nodes: ring::VIRTUAL_NODES_DEFAULT,
    }
}

fn ready(name: &str, port: u16, connections: u64) -> Target {
    Target {
        ready: true,
        connections,
        ..Target::new(name, addresses(port))
    }
}

/// Every address of `name` answered its check.
fn up(b: &Balancer, name: &str) {
    b.set_down(name, BTreeSet::new());
}

/// No address of `name` answered its check.
fn down(b: &Balancer, name: &str) {
    let all = BTreeSet::from(["mqtt".to_owned(), "amqp".to_owned()]);
    b.set_down(name, all);
}

fn client(id: &str) -> ConnectionFacts {
    ConnectionFacts {
        client_id: Some(id.to_owned()),
        ..Default::default()
    }
}

/// `count` device keys.
fn keys(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("dev-{i}")).collect()
}

/// Where each of `keys` goes from `listener`, by node name.
fn owners(b: &Balancer, keys: &[String], listener: &str, now: Instant) -> Vec<String> {
    keys.iter()
        .map(|k| target_of(&b.decide(&client(k), listener, now)).to_owned())
        .collect()
}

fn target_of(d: &Decision) -> &str {
    match d {
        Decision::Local => "a",
        Decision::Redirect { node, .. } => node,
        Decision::Unavailable => "-",
    }
}

#[test]
fn a_key_hashed_elsewhere_is_sent_to_that_nodes_address_for_the_same_listener() {
    let b = Balancer::new(settings(Policy::ConsistentHash)).expect("settings");
    b.set_remote_targets(vec![ready("b", 2000, 0), ready("c", 3000, 0)]);
    let now = Instant::now();
    let mut seen = BTreeMap::new();
    for i in 0..60 {
        let d = b.decide(&client(&format!("c{i}")), "amqp", now);
        if let Decision::Redirect { node, address } = &d {
            let port = if node == "b" { 2001 } else { 3001 };
            assert_eq!(address, &format!("127.0.0.1:{port}"));
        }
        *seen.entry(target_of(&d).to_owned()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 3, "all three nodes get keys: {seen:?}");
}

#[test]
fn below_quorum_the_pool_is_unavailable() {
    let mut s = settings(Policy::ConsistentHash);
    s.quorum_size = 3;
    let b = Balancer::new(s).expect("settings");
    let now = Instant::now();
    b.set_remote_targets(vec![ready("b", 2000, 0), Target::new("c", addresses(3000))]);
    assert_eq!(b.decide(&client("x"), "mqtt", now), Decision::Unavailable);
    up(&b, "c");
    assert_ne!(b.decide(&client("x"), "mqtt", now), Decision::Unavailable);
    b.drop_remote_targets();
    assert_eq!(b.decide(&client("x"), "mqtt", now), Decision::Unavailable);
}

#[test]
fn the_local_filter_and_a_missing_key_stay_here() {
    let mut s = settings(Policy::FirstElement);
    s.local_target_enabled = false;
    s.local_target_filter = Some("^local-".to_owned());
    let b = Balancer::new(s).expect("settings");
    b.set_remote_targets(vec![ready("b", 2000, 0)]);
    let now = Instant::now();
    assert_eq!(b.decide(&client("local-1"), "mqtt", now), Decision::Local);
    assert_eq!(
        b.decide(&ConnectionFacts::default(), "mqtt", now),
        Decision::Local
    );
    assert_eq!(target_of(&b.decide(&client("x"), "mqtt", now)), "b");
}

#[test]
fn the_key_filter_narrows_the_key() {
    let mut s = settings(Policy::ConsistentHash);
    s.key_filter = Some(r"^([^/]+)/".to_owned());
    let b = Balancer::new(s).expect("settings");
    b.set_remote_targets(vec![ready("b", 2000, 0), ready("c", 3000, 0)]);
    let now = Instant::now();
    // Every device of one site lands on the same node.
    let first = target_of(&b.decide(&client("site7/dev0"), "mqtt", now)).to_owned();
    for i in 1..20 {
        assert_eq!(
            target_of(&b.decide(&client(&format!("site7/dev{i}")), "mqtt", now)),
            first
        );
    }
}

#[test]
fn round_robin_and_first_element_walk_the_ready_targets_in_name_order() {
    let now = Instant::now();
    let rr = Balancer::new(settings(Policy::RoundRobin)).expect("settings");
    rr.set_remote_targets(vec![ready("c", 3000, 0), ready("b", 2000, 0)]);
    let picks: Vec<String> = (0..6)
        .map(|i| target_of(&rr.decide(&client(&format!("k{i}")), "mqtt", now)).to_owned())
        .collect();
    assert_eq!(picks, ["a", "b", "c", "a", "b", "c"]);

    let mut s = settings(Policy::FirstElement);
    s.local_target_enabled = false;
    let first = Balancer::new(s).expect("settings");
    first.set_remote_targets(vec![ready("c", 3000, 0), ready("b", 2000, 0)]);
    assert_eq!(target_of(&first.decide(&client("k"), "mqtt", now)), "b");
    down(&first, "b");
    assert_eq!(target_of(&first.decide(&client("k"), "mqtt", now)), "c");
}

#[test]
fn least_connections_follows_the_published_counts() {
    let b = Balancer::new(settings(Policy::LeastConnections)).expect("settings");
    let now = Instant::now();
    b.set_local_connections(10);
    b.set_remote_targets(vec![ready("b", 2000, 7), ready("c", 3000, 3)]);
    assert_eq!(target_of(&b.decide(&client("k1"), "mqtt", now)), "c");
    b.set_remote_targets(vec![ready("b", 2000, 7), ready("c", 3000, 30)]);
    assert_eq!(target_of(&b.decide(&client("k2"), "mqtt", now)), "b");
    b.set_local_connections(1);
    assert_eq!(target_of(&b.decide(&client("k3"), "mqtt", now)), "a");
}

#[test]
fn the_cache_keeps_a_key_on_its_target_until_it_expires_or_the_target_goes() {
    let mut s = settings(Policy::RoundRobin);
    s.cache_timeout_ms = 1000;
    let b = Balancer::new(s).expect("settings");
    b.set_remote_targets(vec![ready("b", 2000, 0), ready("c", 3000, 0)]);
    let t0 = Instant::now();
    let first = target_of(&b.decide(&client("k"), "mqtt", t0)).to_owned();
    for ms in [1, 500, 999] {
        let d = b.decide(&client("k"), "mqtt", t0 + Duration::from_millis(ms));
        assert_eq!(target_of(&d), first, "sticky at {ms} ms");
    }
    let later = b.decide(&client("k"), "mqtt", t0 + Duration::from_millis(1000));
    assert_ne!(
        target_of(&later),
        first,
        "round robin moved on after expiry"
    );
    // A cached target that is no longer ready is not used.
    let now = t0 + Duration::from_millis(1001);
    let cached = target_of(&b.decide(&client("k"), "mqtt", now)).to_owned();
    if cached != "a" {
        down(&b, &cached);
        assert_ne!(target_of(&b.decide(&client("k"), "mqtt", now)), cached);
    }
}

#[test]
fn a_target_without_the_listener_is_unavailable_for_it() {
    let mut s = settings(Policy::FirstElement);
    s.local_target_enabled = false;
    let b = Balancer::new(s).expect("settings");
    b.set_remote_targets(vec![ready("b", 2000, 0)]);
    assert_eq!(
        b.decide(&client("k"), "stomps", Instant::now()),
        Decision::Unavailable
    );
}

#[test]
fn consistent_hash_moves_only_the_keys_of_a_node_that_goes() {
    let b = Balancer::new(settings(Policy::ConsistentHash)).expect("settings");
    b.set_remote_targets(vec![ready("b", 2000, 0), ready("c", 3000, 0)]);
    let now = Instant::now();
    let keys = keys(500);
    let before = owners(&b, &keys, "mqtt", now);
    down(&b, "c");
    let after = owners(&b, &keys, "mqtt", now);
    for ((k, was), now_on) in keys.iter().zip(&before).zip(&after) {
        if was == "c" {
            assert_ne!(now_on, "c");
        } else {
            assert_eq!(now_on, was, "{k} moved though its node stayed");
        }
    }
}

#[test]
fn bad_settings_name_their_key() {
    let mut s = settings(Policy::ConsistentHash);
    s.key_filter = Some("(".to_owned());
    let e = Balancer::new(s).expect_err("bad regex");
    assert!(e.to_string().contains("cluster.balancer.key_filter"), "{e}");
    let mut s = settings(Policy::ConsistentHash);
    s.virtual_nodes = 0;
    assert!(Balancer::new(s).is_err());
}

#[test]
fn with_cache_in_etcd_new_choices_are_offered_and_other_nodes_choices_win() {
    let mut s = settings(Policy::FirstElement);
    s.cache_timeout_ms = 1000;
    s.cache_in_etcd = true;
    let b = Balancer::new(s).expect("settings");
    b.set_remote_targets(vec![ready("b", 2000, 0), ready("c", 3000, 0)]);
    let t0 = Instant::now();
    // A new choice is offered once; a cached one is not offered again.
    assert_eq!(target_of(&b.decide(&client("k"), "mqtt", t0)), "a");
    assert_eq!(target_of(&b.decide(&client("k"), "mqtt", t0)), "a");
    assert_eq!(
        b.take_placed(),
        vec![Placed {
            key: "k".into(),
            target: "a".into(),
            replacing: false
        }]
    );
    // Another node's choice is what this one answers while it lives.
    b.remember("j", "c", t0 + Duration::from_millis(500));
    assert_eq!(target_of(&b.decide(&client("j"), "mqtt", t0)), "c");
    assert!(
        b.take_placed().is_empty(),
        "a remembered choice is not offered"
    );
    // Its node gone, the key is chosen again and the entry replaced.
    down(&b, "c");
    assert_eq!(target_of(&b.decide(&client("j"), "mqtt", t0)), "a");
    assert_eq!(
        b.take_placed(),
        vec![Placed {
            key: "j".into(),
            target: "a".into(),
            replacing: true
        }]
    );
    // Forgotten (its etcd entry expired): chosen again as new.
    b.forget("k");
    b.decide(&client("k"), "mqtt", t0);
    assert_eq!(b.take_placed().len(), 1);
}

#[test]
fn without_cache_in_etcd_nothing_is_offered() {
    let mut s = settings(Policy::FirstElement);
    s.cache_timeout_ms = 1000;
    let b = Balancer::new(s).expect("settings");
    b.decide(&client("k"), "mqtt", Instant::now());
    assert!(b.take_placed().is_empty());
}

#[test]
fn a_target_whose_listener_is_down_gets_none_of_its_clients_and_keeps_the_others() {
    let b = Balancer::new(settings(Policy::ConsistentHash)).expect("settings");
    b.set_remote_targets(vec![ready("b", 2000, 0), ready("c", 3000, 0)]);
    let now = Instant::now();
    let keys = keys(500);
    let on = |listener: &str| owners(&b, &keys, listener, now);
    let mqtt_before = on("mqtt");
    let amqp_before = on("amqp");
    assert!(mqtt_before.iter().any(|t| t == "c"), "c takes a share");

    b.set_down("c", BTreeSet::from(["mqtt".to_owned()]));
    let mqtt_after = on("mqtt");
    for ((k, was), now_on) in keys.iter().zip(&mqtt_before).zip(&mqtt_after) {
        if was == "c" {
            assert_ne!(now_on, "c", "{k}: sent to a listener that is down");
        } else {
            assert_eq!(now_on, was, "{k} moved though its node stayed");
        }
    }
    assert_eq!(on("amqp"), amqp_before, "c's AMQP listener still answers");

    // Back up: the keys return to where they were.
    up(&b, "c");
    assert_eq!(on("mqtt"), mqtt_before);
}

#[test]
fn membership_updates_keep_a_targets_health_while_its_addresses_stay() {
    let mut s = settings(Policy::FirstElement);
    s.local_target_enabled = false;
    let b = Balancer::new(s).expect("settings");
    b.set_remote_targets(vec![Target::new("b", addresses(2000))]);
    assert_eq!(
        b.decide(&client("k"), "mqtt", Instant::now()),
        Decision::Unavailable,
        "not checked yet"
    );
    b.set_down("b", BTreeSet::from(["amqp".to_owned()]));
    // The same record again (a connection count changed): still checked.
    b.set_remote_targets(vec![Target::new("b", addresses(2000))]);
    assert_eq!(
        target_of(&b.decide(&client("k"), "mqtt", Instant::now())),
        "b"
    );
    assert_eq!(
        b.decide(&client("k"), "amqp", Instant::now()),
        Decision::Unavailable
    );
    // New addresses: the old check says nothing of them.
    b.set_remote_targets(vec![Target::new("b", addresses(4000))]);
    assert_eq!(
        b.decide(&client("k"), "mqtt", Instant::now()),
        Decision::Unavailable
    );
}
