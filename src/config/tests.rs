//! Tests of loading, error locations and the defaults file.

use std::path::{Path, PathBuf};

use super::*;

const DEFAULTS_FILE: &str = include_str!("../../config/rosetta.toml");

fn defaults_file_path() -> PathBuf {
    // The crate is src/config; the file is the workspace's config/rosetta.toml.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/rosetta.toml")
}

#[test]
fn the_defaults_file_is_exactly_the_defaults() {
    let parsed = Config::parse(DEFAULTS_FILE, "rosetta.toml").expect("defaults file parses");
    assert_eq!(parsed, Config::default());

    let loaded = Config::load(&defaults_file_path()).expect("defaults file loads");
    let config_dir = defaults_file_path().parent().map(Path::to_owned);
    assert_eq!(loaded.config_dir, config_dir);
    assert_eq!(
        Config {
            config_dir: None,
            ..loaded
        },
        Config::default()
    );
}

#[test]
fn the_defaults_are_valid_and_documented_values() {
    let c = Config::default();
    c.validate().expect("defaults validate");
    assert_eq!(c.data_dir, PathBuf::from("./data"));
    let ports: Vec<_> = c
        .active_listeners()
        .iter()
        .map(|(k, a)| (*k, a.port))
        .collect();
    assert_eq!(
        ports,
        [
            (ListenerKind::Mqtt, 1883),
            (ListenerKind::Stomp, 61613),
            (ListenerKind::Amqp, 5672),
            (ListenerKind::WebSocket, 8080),
        ],
        "TLS listeners stay off without a certificate, `any` is off"
    );
    assert!(c.security.anonymous);
    assert_eq!(c.store.sync, SyncPolicy::EveryCommit);
    assert_eq!(
        c.broker.dead_letter_address,
        rosetta_neutral::Address::Queue("DLQ".into())
    );
    assert_eq!(c.broker.delivery_attempts_max, 10);
}

#[test]
fn an_empty_file_means_defaults() {
    assert_eq!(Config::parse("", "x").expect("empty"), Config::default());
    assert_eq!(
        Config::parse("[store]\n", "x").expect("empty section"),
        Config::default()
    );
}

#[test]
fn tls_listeners_run_with_a_certificate() {
    let text = "[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n[listeners]\nstomps = \"\"\nany = \"127.0.0.1:9000\"\n";
    let c = Config::parse(text, "x").expect("parses");
    let kinds: Vec<_> = c.active_listeners().iter().map(|(k, _)| *k).collect();
    assert_eq!(
        kinds,
        [
            ListenerKind::Mqtt,
            ListenerKind::Stomp,
            ListenerKind::Amqp,
            ListenerKind::WebSocket,
            ListenerKind::Mqtts,
            ListenerKind::Amqps,
            ListenerKind::Wss,
            ListenerKind::Any,
        ]
    );
    assert_eq!(c.listeners.any, Some(ListenAddr::new("127.0.0.1", 9000)));
}

#[test]
fn ports_alone_bind_the_bind_interface_and_a_host_overrides_it() {
    let text = "[listeners]\nbind = \"0.0.0.0\"\nmqtt = 1884\nstomp = \"61615\"\namqp = \"127.0.0.1:5673\"\nwebsocket = \"\"\nmetrics = \"[::1]:9090\"\n";
    let c = Config::parse(text, "x").expect("parses");
    let addrs: Vec<_> = c
        .active_listeners()
        .iter()
        .map(|(k, a)| (*k, a.to_string()))
        .collect();
    assert_eq!(
        addrs,
        [
            (ListenerKind::Mqtt, "0.0.0.0:1884".to_owned()),
            (ListenerKind::Stomp, "0.0.0.0:61615".to_owned()),
            (ListenerKind::Amqp, "127.0.0.1:5673".to_owned()),
            (ListenerKind::Metrics, "[::1]:9090".to_owned()),
        ]
    );
    // The same port twice, once through `bind` and once spelled out.
    let text = "[listeners]\nbind = \"0.0.0.0\"\nmqtt = 1883\nstomp = \"0.0.0.0:1883\"\n";
    let err = Config::parse(text, "x").expect_err("duplicate");
    assert!(
        err.to_string().contains("already used by `listeners.mqtt`"),
        "{err}"
    );
}

#[test]
fn partial_sections_keep_other_defaults() {
    let text = "data_dir = \"/var/lib/rosetta\"\n[store]\nsync = \"periodic\"\nsync_interval_ms = 50\n[broker]\nexpiry_address = \"/topic/expired\"\ndead_letter_address = \"/queue/dead\"\n[[bindings]]\nqueue = \"/queue/orders\"\nfilter = \"shop/+/orders\"\n[[bindings]]\nqueue = \"all\"\nfilter = \"#\"\n";
    let c = Config::parse(text, "x").expect("parses");
    assert_eq!(c.data_dir, PathBuf::from("/var/lib/rosetta"));
    assert_eq!(c.store.sync, SyncPolicy::Periodic);
    assert_eq!(
        c.store.sync_interval(),
        std::time::Duration::from_millis(50)
    );
    assert_eq!(c.store.segment_size_bytes, SEGMENT_SIZE_BYTES_DEFAULT);
    assert_eq!(
        c.broker.expiry_address,
        Some(rosetta_neutral::Address::Topic("expired".into()))
    );
    assert_eq!(
        c.broker.dead_letter_address,
        rosetta_neutral::Address::Queue("dead".into())
    );
    assert_eq!(
        c.bindings,
        [
            Binding {
                queue: "orders".into(),
                filter: "shop/+/orders".into()
            },
            Binding {
                queue: "all".into(),
                filter: "#".into()
            },
        ]
    );
}

/// (document, key at fault, line, words the message must contain)
const BAD: &[(&str, &str, usize, &str)] = &[
    ("bogus = 1\n", "bogus", 1, "unknown key `bogus`"),
    ("[store]\nsyncc = \"periodic\"\n", "store.syncc", 2, "unknown key `syncc`"),
    ("[nope]\n", "nope", 1, "unknown key"),
    ("[store]\nsync = \"sometimes\"\n", "store.sync", 2, "sometimes"),
    ("[listeners]\nmqtt = \"0.0.0.0:70000\"\n", "listeners.mqtt", 2, "port 70000 is out of range"),
    ("[listeners]\n\nstomp = \"localhost\"\n", "listeners.stomp", 3, "has no port"),
    ("[listeners]\namqp = 70000\n", "listeners.amqp", 2, "port 70000 is out of range"),
    ("[listeners]\namqp = true\n", "listeners.amqp", 2, "invalid type"),
    ("[listeners]\nbind = \"0.0.0.0:1883\"\n", "listeners.bind", 2, "without a port"),
    ("[store]\n\nsegment_size_bytes = 0\n", "store.segment_size_bytes", 3, "out of range"),
    ("[store]\nsegment_size_bytes = -5\n", "store.segment_size_bytes", 2, "invalid value"),
    ("[store]\nsync_interval_ms = 0\n", "store.sync_interval_ms", 2, "greater than 0"),
    ("[mqtt]\nqos_max = \"two\"\n", "mqtt.qos_max", 2, "invalid type"),
    ("[mqtt]\nqos_max = 3\n", "mqtt.qos_max", 2, "out of range (0-2)"),
    ("[mqtt]\nreceive_maximum = 70000\n", "mqtt.receive_maximum", 2, "70000"),
    ("[mqtt]\nreceive_maximum = 0\n", "mqtt.receive_maximum", 2, "greater than 0"),
    ("[mqtt]\npacket_size_max_bytes = 300000000\n", "mqtt.packet_size_max_bytes", 2, "out of range"),
    ("listeners = 5\n", "listeners", 1, "expected a table"),
    ("data_dir = \"\"\n", "data_dir", 1, "must not be empty"),
    ("[broker]\ndead_letter_address = \"/queue/\"\n", "broker.dead_letter_address", 2, "empty"),
    ("[broker]\ndelivery_attempts_max = 0\n", "broker.delivery_attempts_max", 2, "greater than 0"),
    ("[tls]\ncert_file = \"c.pem\"\n", "tls.key_file", 1, "key is needed"),
    ("[tls]\nkey_file = \"k.pem\"\n", "tls.cert_file", 1, "certificate is needed"),
    (
        "[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nrequire_client_cert = true\n",
        "tls.client_ca_file",
        1,
        "require_client_cert",
    ),
    ("[tls]\nclient_ca_file = \"ca.pem\"\n", "tls.client_ca_file", 2, "need TLS"),
    (
        "[listeners]\nmqtt = \"0.0.0.0:1883\"\nstomp = \"0.0.0.0:1883\"\n",
        "listeners.stomp",
        3,
        "already used by `listeners.mqtt`",
    ),
    ("[websocket]\nallowed_origins = [\n  \"https://ok.example\",\n  \"example.com\",\n]\n", "websocket.allowed_origins[1]", 4, "not an origin"),
    ("[websocket]\nmessage_size_max_bytes = 10\n", "websocket.message_size_max_bytes", 2, "minimum"),
    ("[stomp]\nheartbeat_send_ms = 10\n", "stomp.heartbeat_send_ms", 2, "heartbeat_min_ms"),
    ("[stomp]\nprefetch_default = 20000\n", "stomp.prefetch_default", 2, "out of range"),
    ("[stomp]\nframe_size_max_bytes = 4096\nheader_size_max_bytes = 8192\n", "stomp.header_size_max_bytes", 3, "frame_size_max_bytes"),
    ("[broker]\npayload_size_max_bytes = 300000000\n", "broker.payload_size_max_bytes", 2, "out of range"),
    ("[amqp]\nframe_size_max_bytes = 100\n", "amqp.frame_size_max_bytes", 2, "minimum of 512"),
    ("[amqp]\nidle_timeout_ms = 10\n", "amqp.idle_timeout_ms", 2, "0 for no idle timeout"),
    ("[[bindings]]\nqueue = \"/topic/x\"\nfilter = \"a\"\n", "bindings[0].queue", 2, "is a topic"),
    ("[[bindings]]\nqueue = \"q\"\nfilter = \"a/#/b\"\n", "bindings[0].filter", 3, "malformed topic filter"),
    ("[[bindings]]\nqueue = \"q\"\nfilter = \"a\"\nwhat = 1\n", "bindings[0].what", 4, "unknown key"),
    (
        "[[bindings]]\nqueue = \"q\"\nfilter = \"a\"\n[[bindings]]\nqueue = \"q\"\nfilter = \"a\"\n",
        "bindings[1]",
        4,
        "second time",
    ),
    ("[[queues]]\nname = \"a\"\npattern = \"a.*\"\n", "queues[0].pattern", 3, "not both"),
    ("[[queues]]\nexclusive = true\n", "queues[0]", 1, "needs `name`"),
    ("[[queues]]\npattern = \"orders*\"\n", "queues[0].pattern", 2, "whole words"),
    ("[[queues]]\npattern = \"orders\"\n", "queues[0].pattern", 2, "no wildcard"),
    ("[[queues]]\npattern = \"a..#\"\n", "queues[0].pattern", 2, "empty word"),
    ("[[queues]]\npattern = \"/topic/a.#\"\n", "queues[0].pattern", 2, "is a topic"),
    ("[[queues]]\nname = \"/topic/a\"\n", "queues[0].name", 2, "is a topic"),
    ("[[queues]]\nname = \"/queue/\"\n", "queues[0].name", 2, "empty"),
    (
        "[[queues]]\nname = \"a\"\n\n[[queues]]\nname = \"/queue/a\"\n",
        "queues[1].name",
        5,
        "already configured by `queues[0]`",
    ),
    (
        "[[queues]]\npattern = \"a.*\"\n[[queues]]\nname = \"a.b\"\n[[queues]]\npattern = \"a.*\"\n",
        "queues[2].pattern",
        6,
        "`a.*` is already configured by `queues[0]`",
    ),
    ("[[queues]]\nname = \"a\"\ncolour = \"red\"\n", "queues[0].colour", 3, "unknown key `colour`"),
    ("[[queues]]\nname = \"a\"\nexclusive = \"yes\"\n", "queues[0].exclusive", 3, "invalid type"),
    ("[[queues]]\nname = \"a\"\ndelivery_attempts_max = 0\n", "queues[0].delivery_attempts_max", 3, "greater than 0"),
    ("[[queues]]\nname = \"a\"\ngroups_max = 0\n", "queues[0].groups_max", 3, "out of range"),
    ("[[queues]]\nname = \"a\"\ngroups_max = 20000000\n", "queues[0].groups_max", 3, "out of range"),
    ("[[queues]]\nname = \"a\"\ndead_letter_address = \"/queue/\"\n", "queues[0].dead_letter_address", 3, "empty"),
    ("[[queues]]\nname = \"a\"\ndedup_window_s = 0\n", "queues[0].dedup_window_s", 3, "out of range"),
    ("[[queues]]\nname = \"a\"\ndedup_window_s = 604801\n", "queues[0].dedup_window_s", 3, "out of range"),
    ("[[queues]]\nname = \"a\"\ndedup_ids_max = 0\n", "queues[0].dedup_ids_max", 3, "out of range"),
    ("[[queues]]\nname = \"a\"\ndedup = \"body\"\n", "queues[0].dedup", 3, "unknown variant"),
    ("[[queues]]\nname = \"a\"\nlast_value_key = \"\"\n", "queues[0].last_value_key", 3, "empty"),
    ("[[queues]]\nname = \"a\"\nlast_value_key = \"a\\u0000b\"\n", "queues[0].last_value_key", 3, "NUL"),
];

#[test]
fn every_error_names_the_key_and_the_line() {
    for (doc, key, line, words) in BAD {
        let err = Config::parse(doc, "rosetta.toml").expect_err(doc);
        let shown = err.to_string();
        assert_eq!(err.key(), Some(*key), "{doc:?} -> {shown}");
        assert_eq!(err.line(), Some(*line), "{doc:?} -> {shown}");
        assert!(
            shown.contains(words),
            "{doc:?} -> {shown} (wanted {words:?})"
        );
        assert!(
            shown.starts_with(&format!("rosetta.toml:{line}:")),
            "{doc:?} -> {shown}"
        );
        assert!(shown.contains(&format!("`{key}`")), "{shown}");
        assert!(!shown.contains('\n'), "one line: {shown:?}");
    }
}

#[test]
fn a_missing_field_names_its_table() {
    let err = Config::parse("x = 0\n", "f").expect_err("unknown");
    assert_eq!(err.key(), Some("x"));
    let err = Config::parse("\n[[bindings]]\nqueue = \"q\"\n", "f").expect_err("missing filter");
    let shown = err.to_string();
    assert!(
        err.key().is_some_and(|k| k.starts_with("bindings")),
        "{shown}"
    );
    assert!(shown.contains("filter"), "{shown}");
    assert!(err.line().is_some(), "{shown}");
}

#[test]
fn syntax_errors_give_the_line() {
    let err = Config::parse("data_dir = \"x\"\n[store\nsync = 1\n", "f.toml").expect_err("syntax");
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
    assert_eq!(err.line(), Some(2), "{err}");
    assert!(err.to_string().starts_with("f.toml:2:"), "{err}");
    let err = Config::parse("a = \"unterminated\n", "f.toml").expect_err("syntax");
    assert_eq!(err.line(), Some(1), "{err}");
}

#[test]
fn a_missing_file_is_a_read_error() {
    let err = Config::load(Path::new("/nonexistent/rosetta.toml")).expect_err("missing");
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(
        err.to_string().contains("/nonexistent/rosetta.toml"),
        "{err}"
    );
}

#[test]
fn validate_names_keys_without_a_file() {
    let mut c = Config::default();
    c.store.segment_size_bytes = 0;
    let err = c.validate().expect_err("zero segment");
    assert_eq!(err.key(), Some("store.segment_size_bytes"));
    assert_eq!(err.line(), None);
}

#[test]
fn the_users_file_defaults_next_to_the_config() {
    assert_eq!(
        Config::default().users_file(),
        PathBuf::from("./users.toml")
    );
    let loaded = Config::load(&defaults_file_path()).expect("loads");
    assert_eq!(
        loaded.users_file(),
        defaults_file_path().with_file_name("users.toml")
    );
    let c = Config::parse(
        "[security]\nusers_file = \"/etc/rosetta/users.toml\"\n",
        "x",
    )
    .expect("parses");
    assert_eq!(c.users_file(), PathBuf::from("/etc/rosetta/users.toml"));
}

/// Every key of every section is spelled out in the defaults file (set, or
/// commented out where the default is "unset"). The key lists come from
/// serde itself: an unknown key's error lists the known ones.
#[test]
fn the_defaults_file_mentions_every_key() {
    let sections = [
        "",
        "listeners",
        "tls",
        "websocket",
        "store",
        "broker",
        "security",
        "mqtt",
        "stomp",
        "amqp",
        "admin",
        "sys",
        "queues",
        "cluster",
        "cluster.balancer",
        "cluster.balancers",
        "streams",
    ];
    for section in sections {
        let probe = if section.is_empty() {
            "no_such_key = 1\n".to_owned()
        } else if ["queues", "streams", "cluster.balancers"].contains(&section) {
            format!("[[{section}]]\nno_such_key = 1\n")
        } else {
            format!("[{section}]\nno_such_key = 1\n")
        };
        let err = Config::parse(&probe, "probe")
            .expect_err("unknown key")
            .to_string();
        let (_, expected) = err.split_once("expected").expect("serde lists the keys");
        let keys: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert!(!keys.is_empty(), "{err}");
        for key in keys {
            let is_table = [
                "listeners",
                "tls",
                "websocket",
                "store",
                "broker",
                "security",
                "mqtt",
                "stomp",
                "amqp",
                "admin",
                "sys",
                "cluster",
            ]
            .contains(&key)
                && section.is_empty();
            let mentioned = if is_table {
                DEFAULTS_FILE.contains(&format!("[{key}]"))
            } else if section == "cluster" && key == "balancer" {
                DEFAULTS_FILE.contains("[cluster.balancer]")
            } else if section == "cluster" && ["balancers", "targets"].contains(&key) {
                DEFAULTS_FILE.contains(&format!("[[cluster.{key}]]"))
            } else if ["bindings", "queues", "streams", "topics"].contains(&key) {
                DEFAULTS_FILE.contains(&format!("[[{key}]]"))
            } else {
                DEFAULTS_FILE.lines().any(|l| {
                    l.trim_start_matches(['#', ' '])
                        .starts_with(&format!("{key} = "))
                })
            };
            assert!(mentioned, "`{section}.{key}` is not in config/rosetta.toml");
        }
    }
}

#[test]
fn queue_entries_become_core_rules() {
    let text = "[[queues]]\npattern = \"/queue/orders.*\"\nexclusive = true\ndead_letter_address = \"/queue/orders.dead\"\n\n[[queues]]\nname = \"/queue/orders.eu\"\ndelivery_attempts_max = 2\ngroups_max = 10\nlast_value_key = \"symbol\"\n\n[[queues]]\nname = \"$durable/app/audit\"\nexclusive = false\n";
    let c = Config::parse(text, "x").expect("parses");
    assert_eq!(c.queues.len(), 3);
    assert_eq!(
        c.queues[1].name.as_deref(),
        Some("orders.eu"),
        "the core name"
    );
    assert_eq!(
        c.queues[0].pattern.as_ref().map(|p| p.as_str()),
        Some("orders.*")
    );
    let rules = c.queue_rules();
    let eu = rules.resolve("orders.eu");
    assert_eq!(
        eu,
        rosetta_core::QueueSettings {
            exclusive: true,
            dead_letter_address: Some("orders.dead".into()),
            delivery_attempts_max: Some(2),
            groups_max: 10,
            last_value_key: Some("symbol".into()),
            ..rosetta_core::QueueSettings::default()
        },
        "the pattern's keys, and the name's over them"
    );
    assert_eq!(rules.resolve("orders.us").delivery_attempts_max, None);
    assert!(!rules.resolve("$durable/app/audit").exclusive);
    assert_eq!(
        Config::default().queue_rules().resolve("orders.eu"),
        rosetta_core::QueueSettings::default()
    );
}

#[test]
fn redelivery_delay_keys_become_queue_settings_and_are_bounded() {
    let text = "[[queues]]\nname = \"q\"\nredelivery_delay_ms = 250\nredelivery_multiplier = 1.5\nredelivery_delay_max_ms = 4000\n";
    let c = Config::parse(text, "x").expect("parses");
    let q = c.queue_rules().resolve("q");
    assert_eq!(q.redelivery_delay_ms, 250);
    assert_eq!(q.redelivery_multiplier.get(), 1.5);
    assert_eq!(q.redelivery_delay_max_ms, Some(4000));
    assert_eq!(q.redelivery_delay_ms_for(3), 562, "250 * 1.5^2");
    let default_cap = Config::parse("[[queues]]\nname = \"q\"\nredelivery_delay_ms = 250\n", "x")
        .expect("parses")
        .queue_rules()
        .resolve("q");
    assert_eq!(
        default_cap.redelivery_delay_cap_ms(),
        2500,
        "ten times, as Artemis"
    );
    for (bad, key) in [
        (
            "redelivery_delay_ms = 86400001",
            "queues[0].redelivery_delay_ms",
        ),
        (
            "redelivery_delay_max_ms = 86400001",
            "queues[0].redelivery_delay_max_ms",
        ),
    ] {
        let err = Config::parse(&format!("[[queues]]\nname = \"q\"\n{bad}\n"), "x").expect_err(bad);
        assert_eq!(err.key(), Some(key), "{err}");
    }
    for bad in ["0.5", "101.0", "nan", "inf"] {
        let text = format!("[[queues]]\nname = \"q\"\nredelivery_multiplier = {bad}\n");
        let err = Config::parse(&text, "x").expect_err(bad);
        assert!(err.to_string().contains("redelivery_multiplier"), "{err}");
    }
}

#[test]
fn dedup_keys_become_core_settings() {
    let text = "[[queues]]\npattern = \"orders.*\"\ndedup_window_s = 300\n\n[[queues]]\nname = \"orders.eu\"\ndedup = \"content\"\ndedup_ids_max = 5000\n";
    let rules = Config::parse(text, "x").expect("parses").queue_rules();
    let eu = rules.resolve("orders.eu");
    assert_eq!(
        (eu.dedup_window_s, eu.dedup, eu.dedup_ids_max),
        (Some(300), rosetta_core::DedupMode::Content, 5000)
    );
    let us = rules.resolve("orders.us");
    assert_eq!(
        (us.dedup_window_s, us.dedup, us.dedup_ids_max),
        (
            Some(300),
            rosetta_core::DedupMode::Id,
            rosetta_core::DEDUP_IDS_MAX_DEFAULT
        )
    );
    assert_eq!(
        rules.resolve("other").dedup_window_s,
        None,
        "off by default"
    );
}

#[test]
fn queue_entries_are_capped() {
    let entry = |i: usize| format!("[[queues]]\nname = \"q{i}\"\n");
    let at_cap: String = (0..QUEUE_ENTRIES_MAX).map(entry).collect();
    Config::parse(&at_cap, "x").expect("the cap itself is fine");
    let past: String = (0..=QUEUE_ENTRIES_MAX).map(entry).collect();
    let err = Config::parse(&past, "x").expect_err("one too many");
    assert_eq!(
        err.key(),
        Some(format!("queues[{QUEUE_ENTRIES_MAX}]").as_str())
    );
    assert_eq!(err.line(), Some(2 * QUEUE_ENTRIES_MAX + 1), "{err}");
}

/// An item that counts how often it is compared.
struct Counted<'a> {
    value: usize,
    comparisons: &'a std::cell::Cell<usize>,
}

impl PartialEq for Counted<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.comparisons.set(self.comparisons.get() + 1);
        self.value == other.value
    }
}

impl Eq for Counted<'_> {}

impl std::hash::Hash for Counted<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}

#[test]
fn finding_a_repeated_binding_takes_linear_comparisons() {
    // Fuzzing finding 2: comparing each binding with every earlier one made
    // a file of many bindings cost quadratic time.
    let count = 2_000;
    let comparisons = std::cell::Cell::new(0);
    let items: Vec<_> = (0..count)
        .chain([7])
        .map(|value| Counted {
            value,
            comparisons: &comparisons,
        })
        .collect();
    assert_eq!(first_repeat(&items), Some(count));
    assert!(
        comparisons.get() <= 2 * items.len(),
        "{} comparisons for {} items",
        comparisons.get(),
        items.len()
    );
    assert_eq!(first_repeat(&items[..count]), None);
}

#[test]
fn a_repeated_binding_among_many_is_found_at_its_index() {
    let count = 5_000;
    let mut text: String = (0..count)
        .map(|i| format!("[[bindings]]\nqueue = \"q{i}\"\nfilter = \"s/{i}/#\"\n"))
        .collect();
    let config = Config::parse(&text, "f").expect("distinct bindings parse");
    assert_eq!(config.bindings.len(), count);

    text.push_str("[[bindings]]\nqueue = \"/queue/q17\"\nfilter = \"s/17/#\"\n");
    let err = Config::parse(&text, "f").expect_err("a repeated binding");
    assert_eq!(err.key(), Some(format!("bindings[{count}]").as_str()));
    assert_eq!(err.line(), Some(3 * count + 1));
}

#[test]
fn visibility_timeout_key_becomes_a_queue_setting_and_is_bounded() {
    let c = Config::parse(
        "[[queues]]\nname = \"q\"\nvisibility_timeout_ms = 30000\n",
        "x",
    )
    .expect("parses");
    assert_eq!(
        c.queue_rules().resolve("q").visibility_timeout_ms,
        Some(30_000)
    );
    assert_eq!(c.queue_rules().resolve("other").visibility_timeout_ms, None);
    for bad in [
        "visibility_timeout_ms = 0",
        "visibility_timeout_ms = 43200001",
    ] {
        let err = Config::parse(&format!("[[queues]]\nname = \"q\"\n{bad}\n"), "x").expect_err(bad);
        assert!(
            err.to_string().contains("queues[0].visibility_timeout_ms"),
            "{err}"
        );
    }
}

#[test]
fn admin_listener_defaults_to_loopback_and_can_be_turned_off() {
    let default = Config::default();
    assert_eq!(
        default.admin.listen_addr().map(|a| a.to_string()),
        Some("127.0.0.1:8161".to_owned())
    );
    let bare = Config::parse("[admin]\nlisten = 9000\n", "t").expect("bare port");
    assert_eq!(
        bare.admin.listen_addr().map(|a| a.to_string()),
        Some("127.0.0.1:9000".to_owned()),
        "a bare port binds loopback, not [listeners] bind"
    );
    let empty = Config::parse("[admin]\nlisten = \"\"\n", "t").expect("empty");
    assert_eq!(empty.admin.listen_addr(), None);
    let off = Config::parse("[admin]\nenabled = false\n", "t").expect("off");
    assert_eq!(off.admin.listen_addr(), None);
    let err = Config::parse("[admin]\nlisten = \"nope\"\n", "t").expect_err("bad");
    assert_eq!(err.key(), Some("admin.listen"), "{err}");
}

#[test]
fn topic_entries_become_dedup_windows_in_file_order_and_are_checked() {
    let text = "[[topics]]\nfilter = \"orders/eu\"\ndedup_window_s = 60\ndedup = \"content\"\ndedup_ids_max = 10\n\n[[topics]]\nfilter = \"orders/#\"\ndedup_window_s = 300\n";
    let rules = Config::parse(text, "x")
        .expect("parses")
        .topic_dedup_rules();
    assert_eq!(
        rules,
        vec![
            rosetta_core::TopicDedupRule {
                filter: "orders/eu".into(),
                window_s: 60,
                mode: rosetta_core::DedupMode::Content,
                ids_max: 10,
            },
            rosetta_core::TopicDedupRule {
                filter: "orders/#".into(),
                window_s: 300,
                mode: rosetta_core::DedupMode::Id,
                ids_max: rosetta_core::DEDUP_IDS_MAX_DEFAULT,
            },
        ]
    );
    for (doc, key) in [
        ("[[topics]]\nfilter = \"a\"\n", "topics[0].dedup_window_s"),
        (
            "[[topics]]\nfilter = \"a\"\ndedup_window_s = 0\n",
            "topics[0].dedup_window_s",
        ),
        (
            "[[topics]]\nfilter = \"a\"\ndedup_window_s = 1\ndedup_ids_max = 0\n",
            "topics[0].dedup_ids_max",
        ),
        (
            "[[topics]]\nfilter = \"a\"\ndedup_window_s = 1\n[[topics]]\nfilter = \"a\"\ndedup_window_s = 2\n",
            "topics[1].filter",
        ),
    ] {
        let err = Config::parse(doc, "rosetta.toml").expect_err(doc);
        assert!(err.to_string().contains(key), "{doc}: {err}");
    }
    // A malformed filter is refused as it is read.
    assert!(Config::parse("[[topics]]\nfilter = \"a/#/b\"\ndedup_window_s = 1\n", "x").is_err());
}

#[test]
fn sys_interval_defaults_to_10_and_0_turns_it_off() {
    let c = Config::parse("", "x").expect("parses");
    assert_eq!(c.sys.interval(), Some(std::time::Duration::from_secs(10)));
    let c = Config::parse("[sys]\ninterval_s = 0\n", "x").expect("parses");
    assert_eq!(c.sys.interval(), None);
    let err = Config::parse("[sys]\ninterval_s = 86401\n", "x").expect_err("too long");
    assert!(err.to_string().contains("sys.interval_s"), "{err}");
}
