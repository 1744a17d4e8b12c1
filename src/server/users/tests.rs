//! Tests of the users file: add, load, verify, SCRAM, permissions, errors.

use std::os::unix::fs::PermissionsExt;

use rosetta_neutral::Address;

use super::*;

const EXAMPLE_FILE: &str = include_str!("../../../config/users.toml.example");

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn a_missing_file_means_no_users_and_open_anonymous_access() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = Users::load(&dir.path().join("users.toml")).expect("missing is fine");
    assert!(users.is_empty());
    assert_eq!(users.permissions(None), &Permissions::everything());
    assert_eq!(users.permissions(Some("ghost")), &Permissions::nothing());
    assert!(!users.verify("ghost", b"x"));
    assert_eq!(users.scram("ghost"), None);
}

#[test]
fn added_users_verify_and_have_scram_credentials() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.toml");
    add_user(&path, "alice", b"wonderland", None, None).expect("add alice");
    add_user(
        &path,
        "bob",
        b"builder",
        Some(&strings(&["/topic/sensors/#", "/queue/orders"])),
        Some(&strings(&["/topic/sensors/+/temp"])),
    )
    .expect("add bob");

    let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "hashes are for the owner only");

    let users = Users::load(&path).expect("load");
    assert_eq!(users.len(), 2);
    assert!(users.verify("alice", b"wonderland"));
    assert!(!users.verify("alice", b"wonderland "));
    assert!(
        !users.verify("alice", b"builder"),
        "bob's password is not alice's"
    );
    assert!(!users.verify("alice", b""));
    assert!(users.verify("bob", b"builder"));
    assert!(!users.verify("carol", b"wonderland"));

    // The stored SCRAM keys are the ones derived from the password with the
    // stored salt and iteration count (derivation checked against RFC 7677
    // in `scram::tests`).
    let creds = users.scram("alice").expect("alice has SCRAM credentials");
    assert_eq!(creds.iterations, scram::ITERATIONS_DEFAULT);
    assert_eq!(
        scram::derive(b"wonderland", &creds.salt, creds.iterations),
        creds
    );
    assert_ne!(
        scram::derive(b"wonderland!", &creds.salt, creds.iterations),
        creds
    );
    let bob = users.scram("bob").expect("bob has SCRAM credentials");
    assert_ne!(bob.salt, creds.salt, "salts are per user");

    // Default permissions: everything.
    let alice = users.permissions(Some("alice"));
    assert_eq!(alice, &Permissions::everything());
    let bob = users.permissions(Some("bob"));
    assert!(bob.may_publish(&Address::Topic("sensors/hall/temp".into())));
    assert!(bob.may_publish(&Address::Queue("orders".into())));
    assert!(!bob.may_publish(&Address::Topic("actuators/door".into())));
    assert!(bob.may_subscribe(&Address::Topic("sensors/+/temp".into())));
    assert!(!bob.may_subscribe(&Address::Topic("sensors/#".into())));
    assert!(!bob.may_subscribe(&Address::Queue("orders".into())));
}

#[test]
fn updating_a_user_replaces_it_and_keeps_the_rest_of_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.toml");
    std::fs::write(
        &path,
        "# my comment\n[anonymous]\npublish = []\nsubscribe = [\"/topic/public/#\"]\n",
    )
    .expect("seed");
    add_user(&path, "alice", b"one", None, None).expect("add");
    add_user(&path, "bob", b"two", None, None).expect("add");
    add_user(&path, "alice", b"three", Some(&[]), None).expect("update");

    let text = std::fs::read_to_string(&path).expect("read");
    assert!(text.starts_with("# my comment\n"), "{text}");
    assert!(
        !text.contains("\n[users]\n"),
        "no empty [users] header: {text}"
    );
    let users = Users::load(&path).expect("load");
    assert!(!users.verify("alice", b"one"));
    assert!(users.verify("alice", b"three"));
    assert!(users.verify("bob", b"two"));
    assert!(!users
        .permissions(Some("alice"))
        .may_publish(&Address::Topic("a".into())));

    let anon = users.permissions(None);
    assert!(!anon.may_publish(&Address::Topic("public/x".into())));
    assert!(anon.may_subscribe(&Address::Topic("public/#".into())));
    assert!(!anon.may_subscribe(&Address::Topic("private".into())));

    assert!(remove_user(&path, "bob").expect("remove"));
    assert!(!remove_user(&path, "bob").expect("remove again"));
    let users = Users::load(&path).expect("load");
    assert!(!users.contains("bob"));
    assert!(users.contains("alice"));
}

#[test]
fn bad_input_to_add_user_is_refused_before_writing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.toml");
    assert!(matches!(
        add_user(&path, "", b"x", None, None),
        Err(UsersError::InvalidName(_))
    ));
    assert!(matches!(
        add_user(&path, "a\nb", b"x", None, None),
        Err(UsersError::InvalidName(_))
    ));
    assert!(matches!(
        add_user(&path, "a", b"", None, None),
        Err(UsersError::InvalidPassword)
    ));
    let long = vec![b'x'; PASSWORD_LEN_MAX_BYTES + 1];
    assert!(matches!(
        add_user(&path, "a", &long, None, None),
        Err(UsersError::InvalidPassword)
    ));
    let bad = strings(&["sensors/#"]);
    assert!(matches!(
        add_user(&path, "a", b"x", Some(&bad), None),
        Err(UsersError::InvalidPattern(_))
    ));
    assert!(!path.exists(), "nothing written");

    // A broken file is left as it is.
    std::fs::write(&path, "[users.x]\npassword_hash = \"nope\"\n").expect("seed");
    let err = add_user(&path, "a", b"x", None, None).expect_err("broken file");
    assert_eq!(err.key(), Some("users.x.password_hash"), "{err}");
    let text = std::fs::read_to_string(&path).expect("read");
    assert_eq!(text, "[users.x]\npassword_hash = \"nope\"\n");
    let leftovers = std::fs::read_dir(dir.path()).expect("ls").count();
    assert_eq!(leftovers, 1, "no temporary files left behind");
}

#[test]
fn errors_in_the_file_name_the_key_and_the_line() {
    let hash = password::hash(b"pw").expect("hash");
    let cases: Vec<(String, &str, usize, &str)> = vec![
        ("[anonymous]\npublish = [\"#\", \"sensors/#\"]\n".into(), "anonymous.publish[1]", 2, "canonical"),
        ("[anonymous]\nsubscribe = [\"/topic/a#\"]\n".into(), "anonymous.subscribe[0]", 2, "whole level"),
        ("[anonymous]\npublsh = []\n".into(), "anonymous.publsh", 2, "unknown key"),
        ("admins = 1\n".into(), "admins", 1, "unknown key"),
        ("[users.a]\n\npassword_hash = \"plain\"\n".into(), "users.a.password_hash", 3, "PHC"),
        (
            format!("[users.a]\npassword_hash = \"{hash}\"\nscram_sha_256 = \"SCRAM-SHA-256$1:AA==$AA==:AA==\"\n"),
            "users.a.scram_sha_256",
            3,
            "iterations",
        ),
        (
            format!("[users.a]\npassword_hash = \"{hash}\"\nsubscribe = [\"/queue/ok\",\n  \"bad\"]\n"),
            "users.a.subscribe[1]",
            4,
            "canonical",
        ),
        (format!("[users.a]\npassword_hash = \"{hash}\"\nrole = \"x\"\n"), "users.a.role", 3, "unknown key"),
        ("[users.a]\npublish = []\n".into(), "users.a", 1, "password_hash"),
        ("[users.a]\npassword_hash = 5\n".into(), "users.a.password_hash", 2, "invalid type"),
        (
            format!("[users.a]\npassword_hash = \"{hash}\"\ndeny_subscribe = [\"test/x\"]\n"),
            "users.a.deny_subscribe[0]",
            3,
            "canonical",
        ),
        ("[anonymous]\ndeny_publish = [\"/topic/#/a\"]\n".into(), "anonymous.deny_publish[0]", 2, "whole level"),
    ];
    for (doc, key, line, words) in cases {
        let err = Users::parse(&doc, "users.toml").expect_err(&doc);
        let shown = err.to_string();
        assert_eq!(err.key(), Some(key), "{doc:?} -> {shown}");
        assert_eq!(err.line(), Some(line), "{doc:?} -> {shown}");
        assert!(
            shown.contains(words),
            "{doc:?} -> {shown} (wanted {words:?})"
        );
        assert!(shown.starts_with(&format!("users.toml:{line}")), "{shown}");
    }
    let err = Users::parse("[users\n", "users.toml").expect_err("syntax");
    assert!(matches!(err, UsersError::Syntax { .. }), "{err}");
    assert_eq!(err.line(), Some(1));
}

#[test]
fn a_hand_written_user_without_scram_still_logs_in() {
    let hash = password::hash(b"pw").expect("hash");
    let users =
        Users::parse(&format!("[users.x]\npassword_hash = \"{hash}\"\n"), "f").expect("parse");
    assert!(users.verify("x", b"pw"));
    assert_eq!(users.scram("x"), None);
    assert_eq!(users.permissions(Some("x")), &Permissions::everything());
}

#[test]
fn the_example_file_parses_and_its_sample_user_works() {
    let users = Users::parse(EXAMPLE_FILE, "users.toml.example").expect("example parses");
    assert!(users.is_empty(), "the sample user is commented out");
    assert_eq!(users.permissions(None), &Permissions::everything());

    // Uncomment the sample user block (lines starting with "# " between the
    // markers) and check it is a working entry for the documented password.
    let mut enabled = String::new();
    let mut inside = false;
    for line in EXAMPLE_FILE.lines() {
        if line.contains("BEGIN sample") {
            inside = true;
        } else if line.contains("END sample") {
            inside = false;
        } else if inside {
            enabled.push_str(line.strip_prefix("# ").unwrap_or(line));
            enabled.push('\n');
        }
    }
    let sample = Users::parse(&enabled, "sample").expect("sample parses");
    // The sample role is a working definition too.
    let role = sample.role("sensors").expect("the sample role");
    assert_eq!(role.admin, Some(AdminRole::Monitoring));
    assert_eq!(role.permissions.deny_publish, ["/topic/sensors/admin"]);
    assert!(sample.verify("sensor-42", b"change-me"));
    assert_eq!(sample.admin_rights("sensor-42"), [AdminRole::Monitoring]);
    let creds = sample.scram("sensor-42").expect("scram");
    assert_eq!(
        scram::derive(b"change-me", &creds.salt, creds.iterations),
        creds
    );
    let p = sample.permissions(Some("sensor-42"));
    assert!(p.may_publish(&Address::Topic("sensors/42/temp".into())));
    assert!(!p.may_publish(&Address::Topic("sensors/43/temp".into())));
}

#[test]
fn debug_output_hides_hashes() {
    let hash = password::hash(b"pw").expect("hash");
    let users =
        Users::parse(&format!("[users.x]\npassword_hash = \"{hash}\"\n"), "f").expect("parse");
    let shown = format!("{users:?}");
    assert!(shown.contains("\"x\""), "{shown}");
    assert!(!shown.contains("argon2"), "{shown}");
}

#[test]
fn load_reports_unreadable_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A directory where the file should be: exists, but cannot be read.
    let err = Users::load(dir.path()).expect_err("a directory");
    assert!(matches!(err, UsersError::Read { .. }), "{err}");
}

#[test]
fn roles_load_are_checked_and_survive_a_password_change_by_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.toml");
    save_user(
        &path,
        "ops",
        b"pw",
        None,
        None,
        Some(&[AdminRole::Management, AdminRole::Monitoring]),
    )
    .expect("save");
    let users = Users::load(&path).expect("load");
    assert_eq!(
        users.admin_rights("ops"),
        [AdminRole::Monitoring, AdminRole::Management]
    );
    assert_eq!(users.roles("ops"), ["management", "monitoring"], "as given");
    assert_eq!(users.highest_role("ops"), Some(AdminRole::Management));
    // `rosetta user add` again (no roles given) keeps them.
    add_user(&path, "ops", b"pw2", None, None).expect("add again");
    let users = Users::load(&path).expect("load");
    assert!(users.verify("ops", b"pw2"));
    assert_eq!(users.highest_role("ops"), Some(AdminRole::Management));
    // The API's password change keeps them too, and knows unknown users.
    assert!(set_password(&path, "ops", b"pw3").expect("set"));
    assert!(!set_password(&path, "nobody", b"pw").expect("set"));
    let users = Users::load(&path).expect("load");
    assert!(users.verify("ops", b"pw3"));
    assert_eq!(users.highest_role("ops"), Some(AdminRole::Management));
    let summary = users.summary("ops").expect("summary");
    assert_eq!(summary.publish, ["#"]);

    let file = std::fs::read_to_string(&path).expect("read");
    let hash = users_hash_line(&file);
    let bad = format!("[users.x]\n{hash}\nroles = [\"root\"]\n");
    let err = Users::parse(&bad, "f").expect_err("unknown role");
    assert_eq!(err.key(), Some("users.x.roles[0]"), "{err}");
    assert_eq!(err.line(), Some(3), "{err}");
}

fn users_hash_line(file: &str) -> &str {
    file.lines()
        .find(|l| l.starts_with("password_hash"))
        .expect("a hash line")
}

#[test]
fn deny_rules_load_save_and_change_without_touching_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.toml");
    let spec = PermissionSpec {
        publish: None,
        subscribe: None,
        deny_publish: strings(&["/queue/audit"]),
        deny_subscribe: strings(&["/topic/test/nosubscribe"]),
    };
    let monitoring = strings(&["monitoring"]);
    save_user_with(&path, "dora", b"pw", &spec, Some(&monitoring)).expect("save");
    add_user(&path, "old", b"pw", None, None).expect("add");
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(
        text.contains("deny_subscribe = [\"/topic/test/nosubscribe\"]"),
        "{text}"
    );
    // An entry without deny rules is written as before deny rules existed.
    let old = text.split("[users.old]").nth(1).expect("old entry");
    assert!(!old.contains("deny_"), "{old}");

    let users = Users::load(&path).expect("load");
    let dora = users.permissions(Some("dora"));
    assert!(!dora.may_subscribe(&Address::Topic("test/nosubscribe".into())));
    assert!(dora.may_subscribe(&Address::Topic("test/#".into())));
    assert_eq!(dora.excluded_topics("test/#"), ["test/nosubscribe"]);
    assert!(dora.may_subscribe(&Address::Topic("test/other".into())));
    assert!(!dora.may_publish(&Address::Queue("audit".into())));
    let summary = users.summary("dora").expect("dora");
    assert_eq!(summary.deny_subscribe, ["/topic/test/nosubscribe"]);
    assert_eq!(summary.subscribe, ["#"]);

    // Changing the permissions keeps the password and the roles; dropping
    // the deny rules removes their keys.
    let open = PermissionSpec::allowing(Some(&strings(&["/topic/a/#"])), None);
    assert!(set_permissions(&path, "dora", &open).expect("set"));
    assert!(!set_permissions(&path, "nobody", &open).expect("set"));
    let users = Users::load(&path).expect("load");
    assert!(users.verify("dora", b"pw"));
    assert_eq!(users.admin_rights("dora"), [AdminRole::Monitoring]);
    let summary = users.summary("dora").expect("dora");
    assert_eq!(summary.publish, ["/topic/a/#"]);
    assert!(summary.deny_subscribe.is_empty() && summary.deny_publish.is_empty());
    assert!(!std::fs::read_to_string(&path)
        .expect("read")
        .contains("deny_"));

    // A malformed deny pattern is refused before anything is written.
    let before = std::fs::read_to_string(&path).expect("read");
    let bad = PermissionSpec {
        deny_publish: strings(&["nope"]),
        ..PermissionSpec::default()
    };
    assert!(matches!(
        set_permissions(&path, "dora", &bad),
        Err(UsersError::InvalidPattern(_))
    ));
    assert_eq!(std::fs::read_to_string(&path).expect("read"), before);
}

/// The file of `roles_are_defined_held_and_combined`: a role with lists
/// and an admin right, one with a deny rule only, and users holding them.
fn roles_file(hash: &str) -> String {
    format!(
        r#"[roles.sensors]
publish = ["/topic/sensors/#"]
subscribe = ["/topic/commands/#"]
deny_publish = ["/topic/sensors/admin"]
admin = "management"

[roles.no-test]
deny_subscribe = ["/topic/test/#"]

[users.s1]
{hash}
roles = ["sensors", "no-test"]

[users.s2]
{hash}
publish = ["/queue/orders"]
roles = ["monitoring", "sensors"]

[users.old]
{hash}
roles = ["monitoring"]
"#
    )
}

#[test]
fn roles_are_defined_held_and_combined() {
    let hash_line = format!(
        "password_hash = \"{}\"",
        password::hash(b"pw").expect("hash")
    );
    let users = Users::parse(&roles_file(&hash_line), "f").expect("parses");
    let topic = |t: &str| Address::Topic(t.into());

    // s1: only what its roles allow, every deny of theirs.
    let s1 = users.permissions(Some("s1"));
    assert!(s1.may_publish(&topic("sensors/1")));
    assert!(
        !s1.may_publish(&topic("sensors/admin")),
        "a role's deny wins"
    );
    assert!(
        !s1.may_publish(&topic("other")),
        "a role's list replaces 'everything'"
    );
    assert!(s1.may_subscribe(&topic("commands/1")));
    assert!(!s1.may_subscribe(&topic("test/x")));
    assert_eq!(users.roles("s1"), ["sensors", "no-test"]);
    assert_eq!(users.highest_role("s1"), Some(AdminRole::Management));

    // s2: its own list and its role's together; built-in and defined
    // admin rights both count.
    let s2 = users.permissions(Some("s2"));
    assert!(s2.may_publish(&Address::Queue("orders".into())));
    assert!(s2.may_publish(&topic("sensors/2")));
    assert!(!s2.may_publish(&topic("other")));
    assert_eq!(
        users.admin_rights("s2"),
        [AdminRole::Monitoring, AdminRole::Management]
    );
    assert_eq!(users.roles("s2"), ["monitoring", "sensors"]);

    // A user with built-in roles only means what it always meant.
    assert_eq!(users.permissions(Some("old")), &Permissions::everything());

    let summary = users.summary("s1").expect("s1");
    assert_eq!(summary.publish, ["/topic/sensors/#"]);
    assert_eq!(summary.own, PermissionSpec::default());
    assert_eq!(summary.admin, Some(AdminRole::Management));
    let role = users.role("sensors").expect("defined");
    assert_eq!(role.admin, Some(AdminRole::Management));
    assert_eq!(role.permissions.deny_publish, ["/topic/sensors/admin"]);
    assert_eq!(users.role_names(), ["no-test", "sensors"]);
    assert_eq!(users.holders("sensors"), ["s1", "s2"]);
    assert!(users.knows_role("monitoring") && users.knows_role("sensors"));
    assert!(!users.knows_role("ghost") && users.role("monitoring").is_none());
}

#[test]
fn bad_roles_are_refused_with_their_line() {
    let hash_line = format!(
        "password_hash = \"{}\"",
        password::hash(b"pw").expect("hash")
    );
    for (text, key, line) in [
        // A user naming a role that no one defined.
        (
            format!("[roles.a]\n\n[users.x]\n{hash_line}\nroles = [\"a\", \"b\"]\n"),
            "users.x.roles[1]",
            5,
        ),
        // A role redefining a built-in one.
        (
            "[roles.monitoring]\npublish = []\n".to_owned(),
            "roles.monitoring",
            1,
        ),
        // A bad admin right, a bad pattern, an unknown key.
        (
            "[roles.a]\nadmin = \"root\"\n".to_owned(),
            "roles.a.admin",
            2,
        ),
        (
            "[roles.a]\npublish = [\"x\"]\n".to_owned(),
            "roles.a.publish[0]",
            2,
        ),
        ("[roles.a]\nallow = []\n".to_owned(), "roles.a.allow", 2),
    ] {
        let err = Users::parse(&text, "f").expect_err(key);
        assert_eq!((err.key(), err.line()), (Some(key), Some(line)), "{err}");
    }
}

#[test]
fn roles_are_saved_given_and_removed_through_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.toml");
    add_user(&path, "alice", b"pw", None, None).expect("add");
    let sensors = RoleSpec {
        permissions: PermissionSpec::allowing(Some(&strings(&["/topic/sensors/#"])), None),
        admin: Some(AdminRole::Monitoring),
    };
    assert!(save_role(&path, "sensors", &sensors).expect("new"));
    assert!(!save_role(&path, "sensors", &sensors).expect("replaced"));
    for (name, want) in [("monitoring", "built-in"), ("a.b", "invalid role name")] {
        let err = save_role(&path, name, &sensors).expect_err(name);
        assert!(err.to_string().contains(want), "{err}");
    }
    // An absent allow list is not written as "#": alice's roles decide.
    let text = std::fs::read_to_string(&path).expect("read");
    let alice = text
        .split("[users.alice]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("alice");
    assert!(!alice.contains("publish"), "{alice}");

    let roles = strings(&["sensors", "monitoring"]);
    assert!(set_roles(&path, "alice", &roles).expect("set"));
    let users = Users::load(&path).expect("load");
    assert!(!users
        .permissions(Some("alice"))
        .may_publish(&Address::Topic("other".into())));
    assert!(matches!(
        set_roles(&path, "alice", &strings(&["ghost"])),
        Err(UsersError::UnknownRole(r)) if r == "ghost"
    ));
    let before = std::fs::read_to_string(&path).expect("read");
    match remove_role(&path, "sensors") {
        Err(UsersError::RoleInUse { role, users }) => {
            assert_eq!((role.as_str(), users), ("sensors", strings(&["alice"])));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read_to_string(&path).expect("read"), before);
    assert!(set_roles(&path, "alice", &[]).expect("set"));
    assert!(remove_role(&path, "sensors").expect("removed"));
    assert!(!remove_role(&path, "sensors").expect("gone"));
    assert!(matches!(
        remove_role(&path, "administrator"),
        Err(UsersError::BuiltinRole(_))
    ));
    let users = Users::load(&path).expect("load");
    assert!(users.role_names().is_empty());
    assert_eq!(users.permissions(Some("alice")), &Permissions::everything());
}
