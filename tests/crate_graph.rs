//! The crate graph is the design (README "Layout"): each workspace crate may
//! depend only on the Rosetta crates its rule names. The compiler enforces
//! what a crate can see once its manifest is right; this test keeps the
//! manifests right, so that "the core needs one config value" becomes a
//! conversation rather than a one-line `Cargo.toml` edit.
//!
//! It reads every member's `[dependencies]` (normal edges only: a test may
//! use whatever it needs) and fails on a Rosetta crate not in the member's
//! rule, and on a member that has no rule yet.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each Rosetta crate and the Rosetta crates it may depend on.
const RULES: &[(&str, &[&str])] = &[
    // The journal: records with opaque bodies; no Rosetta crate at all (the
    // message codec is the core's).
    ("rosetta-store", &[]),
    // Routing and delivery over the journal: no wire format, no socket, no
    // configuration file.
    ("rosetta-core", &["rosetta-store", "rosetta-neutral"]),
    // The configuration file names the defaults of the crates it configures,
    // and no IO crate.
    (
        "rosetta-config",
        &[
            "rosetta-store",
            "rosetta-core",
            "rosetta-neutral",
            "rosetta-mqtt",
            "rosetta-stomp",
            "rosetta-amqp",
        ],
    ),
    // Scale-out: the sans-IO balancer over the neutral API, and the etcd
    // membership that feeds it (IO of its own, but no listener and no
    // other Rosetta crate).
    ("rosetta-cluster", &["rosetta-neutral"]),
    // The client-facing network IO, bringing the others together.
    (
        "rosetta-server",
        &[
            "rosetta-cluster",
            "rosetta-config",
            "rosetta-core",
            "rosetta-store",
            "rosetta-neutral",
            "rosetta-mqtt",
            "rosetta-stomp",
            "rosetta-amqp",
        ],
    ),
    // The admin HTTP API: over the server's view of a running broker; it
    // depends on the server (not the reverse), so the server knows no HTTP
    // framework and the binary starts both.
    (
        "rosetta-admin",
        &[
            "rosetta-config",
            "rosetta-core",
            "rosetta-store",
            "rosetta-server",
            "rosetta-neutral",
        ],
    ),
    // Sans-IO adapters: the neutral API only, never the core.
    ("rosetta-neutral", &[]),
    ("rosetta-mqtt", &["rosetta-neutral"]),
    ("rosetta-stomp", &["rosetta-neutral"]),
    ("rosetta-amqp", &["rosetta-neutral"]),
    // The binary and its re-exports; its `rosetta pub` and `rosetta sub`
    // (src/client_cli/) speak STOMP with the broker's own frame codec.
    (
        "rosetta",
        &[
            "rosetta-store",
            "rosetta-core",
            "rosetta-config",
            "rosetta-server",
            "rosetta-admin",
            "rosetta-stomp",
        ],
    ),
    // The load generator talks to brokers over sockets like any client.
    ("rosetta-load", &[]),
];

fn workspace_root() -> PathBuf {
    // The root package is the workspace root.
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_manifest(path: &Path) -> toml::Table {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// The workspace members' directories, from the root manifest.
fn members(root_manifest: &toml::Table) -> Vec<String> {
    root_manifest["workspace"]["members"]
        .as_array()
        .expect("[workspace] members is an array")
        .iter()
        .map(|m| m.as_str().expect("a member is a path").to_owned())
        .collect()
}

/// The Rosetta crates among a manifest's normal dependencies. A renamed
/// dependency (`x = { package = "rosetta-core" }`) counts by its package.
fn rosetta_dependencies(manifest: &toml::Table) -> BTreeSet<String> {
    let Some(deps) = manifest.get("dependencies").and_then(|d| d.as_table()) else {
        return BTreeSet::new();
    };
    deps.iter()
        .map(|(key, spec)| {
            spec.get("package")
                .and_then(|p| p.as_str())
                .unwrap_or(key)
                .to_owned()
        })
        .filter(|name| name == "rosetta" || name.starts_with("rosetta-"))
        .collect()
}

#[test]
fn every_crate_depends_only_on_the_rosetta_crates_its_rule_allows() {
    let root = workspace_root();
    let root_manifest = read_manifest(&root.join("Cargo.toml"));
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for member in members(&root_manifest) {
        let manifest = read_manifest(&root.join(&member).join("Cargo.toml"));
        let name = manifest["package"]["name"]
            .as_str()
            .expect("package name is a string")
            .to_owned();
        seen.insert(name.clone());
        let Some((_, allowed)) = RULES.iter().find(|(crate_name, _)| *crate_name == name) else {
            problems.push(format!(
                "{name} ({member}) has no rule in tests/crate_graph.rs: say what it may depend on"
            ));
            continue;
        };
        for dep in rosetta_dependencies(&manifest) {
            if !allowed.contains(&dep.as_str()) {
                problems.push(format!("{name} ({member}) must not depend on {dep}"));
            }
        }
    }
    // Guards the test itself: a crate renamed or removed leaves a rule that
    // checks nothing.
    for (name, _) in RULES {
        if !seen.contains(*name) {
            problems.push(format!("the rule for {name} names no workspace member"));
        }
    }
    assert!(problems.is_empty(), "crate graph: {problems:#?}");
}

#[test]
fn the_rule_check_sees_a_forbidden_edge() {
    // The check above passes on an empty reading too; this shows that it
    // reads dependencies as Cargo writes them, renamed ones included.
    let manifest: toml::Table = r#"
        [package]
        name = "rosetta-core"
        [dependencies]
        rosetta-store = { path = "../store" }
        settings = { package = "rosetta-config", path = "../config" }
        bytes = "1"
    "#
    .parse()
    .expect("parses");
    let deps = rosetta_dependencies(&manifest);
    assert_eq!(
        deps,
        BTreeSet::from(["rosetta-store".to_owned(), "rosetta-config".to_owned()])
    );
}
