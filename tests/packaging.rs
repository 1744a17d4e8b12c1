//! The files in `packaging/`: the container image's Dockerfile (checked for
//! syntax here, as its base images cannot be pulled on these machines), the
//! systemd unit, and the configuration both install, which must be one
//! the broker accepts and which must not leave the broker open to anyone.

use std::path::Path;

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The Dockerfile's instructions: continuation lines joined, comments and
/// blank lines dropped, each as (instruction, arguments).
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (word, rest) = current.split_once(' ').unwrap_or((&current, ""));
                out.push((word.to_owned(), rest.trim().to_owned()));
                current.clear();
            }
        }
    }
    assert!(
        current.is_empty(),
        "the Dockerfile ends inside a continued line"
    );
    out
}

#[test]
fn the_dockerfile_is_well_formed_and_runs_the_packaged_configuration() {
    const KNOWN: [&str; 18] = [
        "FROM",
        "RUN",
        "CMD",
        "LABEL",
        "EXPOSE",
        "ENV",
        "ADD",
        "COPY",
        "ENTRYPOINT",
        "VOLUME",
        "USER",
        "WORKDIR",
        "ARG",
        "ONBUILD",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "SHELL",
        "MAINTAINER",
    ];
    let all = instructions(&read("packaging/Dockerfile"));
    for (word, rest) in &all {
        assert!(KNOWN.contains(&word.as_str()), "unknown instruction {word}");
        assert_eq!(
            word.to_uppercase(),
            *word,
            "instruction {word} in upper case"
        );
        assert!(!rest.is_empty(), "{word} without arguments");
    }
    assert_eq!(all.first().map(|(w, _)| w.as_str()), Some("FROM"));
    // Every COPY --from names a stage defined before it.
    let mut stages = Vec::new();
    for (word, rest) in &all {
        if word == "FROM" {
            if let Some((_, name)) = rest.split_once(" AS ") {
                stages.push(name.trim().to_owned());
            }
        }
        if let Some(stage) = rest.strip_prefix("--from=") {
            let stage = stage.split_whitespace().next().unwrap_or_default();
            assert!(
                stages.iter().any(|s| s == stage),
                "COPY --from={stage}: no such stage"
            );
        }
    }
    // Exec form: JSON arrays.
    for (word, rest) in &all {
        if matches!(word.as_str(), "ENTRYPOINT" | "CMD" | "VOLUME") {
            let parsed: Vec<String> = serde_json::from_str(rest)
                .unwrap_or_else(|e| panic!("{word} {rest}: not a JSON array ({e})"));
            assert!(!parsed.is_empty());
        }
    }
    let entrypoint = &all
        .iter()
        .find(|(w, _)| w == "ENTRYPOINT")
        .expect("ENTRYPOINT")
        .1;
    assert!(
        entrypoint.contains("/etc/rosetta/rosetta.toml"),
        "{entrypoint}"
    );
    let copies: Vec<&String> = all
        .iter()
        .filter(|(w, _)| w == "COPY")
        .map(|(_, r)| r)
        .collect();
    assert!(
        copies
            .iter()
            .any(|c| c.starts_with("packaging/rosetta.toml /etc/rosetta/rosetta.toml")),
        "the image carries the packaged configuration: {copies:?}"
    );
    // The ports it exposes are the packaged configuration's listeners.
    let exposed: Vec<u16> = all
        .iter()
        .filter(|(w, _)| w == "EXPOSE")
        .flat_map(|(_, r)| {
            r.split_whitespace()
                .map(|p| p.parse().expect("a port number"))
        })
        .collect();
    let config = packaged_config();
    let mut ports: Vec<u16> = config
        .active_listeners()
        .into_iter()
        .map(|(_, a)| a.port)
        .collect();
    ports.extend(config.admin.listen_addr().map(|a| a.port));
    ports.sort_unstable();
    let mut exposed_sorted = exposed.clone();
    exposed_sorted.sort_unstable();
    assert_eq!(exposed_sorted, ports, "EXPOSE {exposed:?}");
}

fn packaged_config() -> rosetta::config::Config {
    let config =
        rosetta::config::Config::parse(&read("packaging/rosetta.toml"), "packaging/rosetta.toml")
            .unwrap_or_else(|e| panic!("{e}"));
    config.validate().unwrap_or_else(|e| panic!("{e}"));
    config
}

#[test]
fn the_packaged_configuration_opens_the_network_only_with_logins_required() {
    let config = packaged_config();
    assert!(
        !config.security.anonymous,
        "anonymous access off where every interface listens"
    );
    assert_eq!(config.data_dir, Path::new("/var/lib/rosetta"));
}

#[test]
fn the_systemd_unit_runs_the_packaged_configuration() {
    let unit = read("packaging/rosetta.service");
    let mut section = String::new();
    let mut sections = Vec::new();
    let mut exec_start = None;
    for line in unit.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            sections.push(section.clone());
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not key=value: {line}"));
        assert!(!key.is_empty() && !value.is_empty(), "{line}");
        if section == "Service" && key == "ExecStart" {
            exec_start = Some(value.to_owned());
        }
    }
    assert_eq!(sections, ["Unit", "Service", "Install"]);
    let exec_start = exec_start.expect("ExecStart");
    assert!(exec_start.starts_with("/usr/bin/rosetta "), "{exec_start}");
    assert!(
        exec_start.contains("--config /etc/rosetta/rosetta.toml"),
        "{exec_start}"
    );
}

/// LICENSE is the license Cargo.toml declares for every crate: the
/// Apache License 2.0's text for `license = "Apache-2.0"`.
#[test]
fn the_license_file_matches_cargo_toml() {
    let manifest: toml::Table = toml::from_str(&read("Cargo.toml")).expect("Cargo.toml");
    let declared = manifest["workspace"]["package"]["license"]
        .as_str()
        .expect("[workspace.package] license");
    let text = read("LICENSE");
    let title = text.lines().map(str::trim).find(|l| !l.is_empty());
    let (want_title, want_version) = match declared {
        "Apache-2.0" => ("Apache License", "Version 2.0, January 2004"),
        other => panic!("LICENSE is checked for Apache-2.0 only; Cargo.toml says {other}"),
    };
    assert_eq!(title, Some(want_title), "LICENSE's title");
    assert!(text.contains(want_version), "LICENSE's version");
    assert!(
        text.contains("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION")
            && text.contains("END OF TERMS AND CONDITIONS"),
        "LICENSE holds the whole text"
    );
    assert_eq!(
        env!("CARGO_PKG_LICENSE"),
        declared,
        "the root crate takes the workspace's license"
    );
}

/// The README opens, right after its title, with the five-line quick
/// start: start the broker, receive with one client, publish with
/// another, open the console (and, once, a console login).
#[test]
fn the_readme_starts_with_the_five_line_quick_start() {
    let readme = read("README.md");
    let mut lines = readme.lines().filter(|l| !l.trim().is_empty());
    assert_eq!(lines.next(), Some("# Rosetta"));
    assert_eq!(lines.next(), Some("```sh"), "the quick start comes first");
    let commands: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
    assert_eq!(commands.len(), 5, "{commands:#?}");
    let has = |what: &str| commands.iter().any(|c| c.contains(what));
    assert!(
        has("cargo run --release  "),
        "starts the broker: {commands:#?}"
    );
    assert!(has(" sub --url "), "receives: {commands:#?}");
    assert!(has(" pub --url "), "publishes: {commands:#?}");
    assert!(has("/console/"), "opens the console: {commands:#?}");
}
