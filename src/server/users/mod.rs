//! Users: the users file, password checks, SCRAM credentials and address
//! permissions.
//!
//! ## The users file
//! A TOML file (by default `users.toml` next to the configuration file,
//! see [`rosetta_config::Config::users_file`]; a missing file means no
//! users). `config/users.toml.example` documents it:
//!
//! ```toml
//! [anonymous]                      # what clients without credentials may do
//! publish = ["#"]                  # (only if [security] anonymous = true)
//! subscribe = ["#"]
//!
//! [roles.sensors]                 # a role: permissions and an admin right
//! publish = ["/topic/sensors/#"]
//! deny_subscribe = ["/topic/sensors/secret"]
//! admin = "monitoring"             # absent: none; see `roles`
//!
//! [users.alice]
//! password_hash = "$argon2id$v=19$m=8192,t=2,p=1$…"      # see `password`
//! scram_sha_256 = "SCRAM-SHA-256$4096:<salt>$<StoredKey>:<ServerKey>"
//! publish = ["/topic/sensors/#", "/queue/orders"]         # see `permissions`
//! subscribe = ["#"]
//! deny_subscribe = ["/topic/test/nosubscribe"]            # a deny wins
//! roles = ["sensors", "monitoring"] # defined or built-in; absent: none
//! ```
//!
//! A user's permissions are its own lists and its roles' together
//! ([`roles::effective`]): the union of the allow lists present, the union
//! of the deny lists, a deny winning. Absent `publish`/`subscribe` lists
//! say nothing, and when neither the user nor any of its roles says
//! anything, everything is allowed (what an absent list always meant);
//! absent `deny_publish`/`deny_subscribe` lists mean no deny rules. Files
//! written before roles and deny rules existed load unchanged and mean
//! the same. A user naming a role that is neither defined nor built-in is
//! an error naming its line. [`add_user`] and the other writers change
//! entries (keeping the rest of the file, comments included), atomically
//! and with mode 0600, since the hashes must not be world-readable.
//!
//! ## Checks
//! - [`Users::verify`] checks a password (PLAIN, MQTT, STOMP);
//! - [`Users::scram`] gives SCRAM-SHA-256 credentials (AMQP SASL);
//! - [`Users::permissions`] gives what a user, or the anonymous user, may
//!   publish and subscribe to.

pub mod password;
pub mod permissions;
mod role_edits;
pub mod roles;
pub mod scram;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rosetta_neutral::ScramCredentials;
use serde::Deserialize;

pub use password::HashError;
pub use permissions::{Pattern, PatternError, Permissions};
pub use role_edits::{remove_role, save_role};
pub use roles::{
    AdminRole, DefinedRole, Lists, ADMIN_ROLES, ROLES_MAX, ROLES_PER_USER_MAX,
    ROLE_NAME_LEN_MAX_BYTES,
};
use rosetta_config::locate;
use rosetta_config::Location;
pub use scram::ScramFormatError;

/// Longest user name, in bytes: longer than any real name, short enough
/// that names cannot bloat logs or the file.
pub const USER_NAME_LEN_MAX_BYTES: usize = 256;
/// Longest password, in bytes: argon2 and PBKDF2 accept more, but nothing
/// legitimate needs it and it bounds the work per login.
pub const PASSWORD_LEN_MAX_BYTES: usize = 1024;
/// Mode of the users file: owner only, since it holds password hashes.
pub const USERS_FILE_MODE: u32 = 0o600;

/// What is wrong with a users file or a user to add.
#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    /// The file exists but cannot be read.
    #[error("cannot read users file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{location}: TOML syntax error: {message}")]
    Syntax {
        /// Where.
        location: Location,
        /// What the parser expected.
        message: String,
    },
    /// A key is unknown or a value is invalid.
    #[error("{location}: `{key}`: {message}")]
    Invalid {
        /// Where.
        location: Location,
        /// Dotted key path, e.g. `users.alice.publish[0]`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A user name to add is empty, too long or has control characters.
    #[error(
        "invalid user name {0:?}: 1 to {USER_NAME_LEN_MAX_BYTES} bytes, no control characters"
    )]
    InvalidName(String),
    /// A password to set is empty or too long.
    #[error("the password must be 1 to {PASSWORD_LEN_MAX_BYTES} bytes")]
    InvalidPassword,
    /// A permission pattern to set is malformed.
    #[error(transparent)]
    InvalidPattern(#[from] PatternError),
    /// A role name to give a user is neither defined nor built-in.
    #[error("unknown role '{0}': define it under [roles] or use monitoring, management or administrator")]
    UnknownRole(String),
    /// A role name to define is not 1 to 64 letters, digits, `-`, `_`.
    #[error(
        "invalid role name {0:?}: 1 to {ROLE_NAME_LEN_MAX_BYTES} ASCII letters, digits, '-' or '_'"
    )]
    InvalidRoleName(String),
    /// A built-in role cannot be defined, changed or removed.
    #[error("'{0}' is a built-in role: it cannot be defined, changed or removed")]
    BuiltinRole(String),
    /// A role to remove is still held by users.
    #[error("role '{role}' is held by {}: take it from them first", users.join(", "))]
    RoleInUse {
        /// The role.
        role: String,
        /// Who holds it.
        users: Vec<String>,
    },
    /// A user would hold more than [`ROLES_PER_USER_MAX`] roles, or the
    /// file define more than [`ROLES_MAX`].
    #[error("too many roles: at most {ROLES_PER_USER_MAX} per user and {ROLES_MAX} defined")]
    TooManyRoles,
    /// Hashing the password failed.
    #[error(transparent)]
    Hash(#[from] HashError),
    /// The file could not be written.
    #[error("cannot write users file {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

impl UsersError {
    /// The key at fault, for errors in the file.
    pub fn key(&self) -> Option<&str> {
        match self {
            UsersError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The 1-based line at fault, for errors in the file.
    pub fn line(&self) -> Option<usize> {
        match self {
            UsersError::Syntax { location, .. } | UsersError::Invalid { location, .. } => {
                location.line
            }
            _ => None,
        }
    }
}

// ---- file schema -----------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    anonymous: Option<PermissionSpec>,
    #[serde(default)]
    roles: BTreeMap<String, RoleDoc>,
    #[serde(default)]
    users: BTreeMap<String, UserDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleDoc {
    publish: Option<Vec<String>>,
    subscribe: Option<Vec<String>>,
    #[serde(default)]
    deny_publish: Vec<String>,
    #[serde(default)]
    deny_subscribe: Vec<String>,
    /// The admin right the role grants; absent: none.
    admin: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserDoc {
    password_hash: String,
    scram_sha_256: Option<String>,
    publish: Option<Vec<String>>,
    subscribe: Option<Vec<String>>,
    #[serde(default)]
    deny_publish: Vec<String>,
    #[serde(default)]
    deny_subscribe: Vec<String>,
    /// Roles, defined or built-in, in the order written; files written
    /// before roles existed have none.
    #[serde(default)]
    roles: Vec<String>,
}

// ---- the loaded users ----------------------------------------------------

struct User {
    password_hash: String,
    scram: Option<ScramCredentials>,
    /// Its own lists, as written.
    own: PermissionSpec,
    /// Its roles as written, each once.
    roles: Vec<String>,
    /// Its own and its roles' permissions together.
    permissions: Permissions,
    /// The admin rights its roles give, least power first.
    admin: Vec<AdminRole>,
}

/// Permission patterns as written in the users file and the API, before
/// they are checked: the four lists of a user, a role or `[anonymous]`
/// (the `[anonymous]` table and the API's permissions body read into it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PermissionSpec {
    /// What may be published to; `None` says nothing (everything, unless
    /// a role of the user says otherwise).
    pub publish: Option<Vec<String>>,
    /// What may be subscribed to or consumed from; `None` as `publish`.
    pub subscribe: Option<Vec<String>>,
    /// What may not be published to, whatever `publish` allows.
    pub deny_publish: Vec<String>,
    /// What may not be subscribed to, whatever `subscribe` allows.
    pub deny_subscribe: Vec<String>,
}

impl PermissionSpec {
    /// The allow lists only, no deny rules (`None`: everything).
    pub fn allowing(publish: Option<&[String]>, subscribe: Option<&[String]>) -> Self {
        Self {
            publish: publish.map(<[String]>::to_vec),
            subscribe: subscribe.map(<[String]>::to_vec),
            ..Self::default()
        }
    }

    /// Checks every pattern; errors name the key at fault under `key`
    /// (`users.alice` gives `users.alice.deny_publish[0]`).
    fn check(&self, key: &str) -> Result<Lists, (String, String)> {
        let list = |list: &[String], name: &str| {
            list.iter()
                .enumerate()
                .map(|(i, s)| {
                    Pattern::parse(s).map_err(|e| (format!("{key}.{name}[{i}]"), e.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let present =
            |l: &Option<Vec<String>>, name: &str| l.as_deref().map(|l| list(l, name)).transpose();
        Ok(Lists {
            publish: present(&self.publish, "publish")?,
            subscribe: present(&self.subscribe, "subscribe")?,
            deny_publish: list(&self.deny_publish, "deny_publish")?,
            deny_subscribe: list(&self.deny_subscribe, "deny_subscribe")?,
        })
    }

    /// Checks every pattern, for a change about to be written.
    pub fn validate(&self) -> Result<(), PatternError> {
        let lists = [
            self.publish.as_deref().unwrap_or_default(),
            self.subscribe.as_deref().unwrap_or_default(),
            &self.deny_publish,
            &self.deny_subscribe,
        ];
        for p in lists.into_iter().flatten() {
            Pattern::parse(p)?;
        }
        Ok(())
    }

    /// Writes the lists into a user's or a role's entry: the allow lists
    /// present (an absent one is left out: it says nothing, so that a role
    /// given to the user later decides; `#` would allow everything
    /// whatever the roles), deny lists only when there are some, so
    /// entries without deny rules look as they always did.
    fn write_to(&self, entry: &mut dyn toml_edit::TableLike) {
        for (key, list) in [("publish", &self.publish), ("subscribe", &self.subscribe)] {
            match list {
                Some(list) => entry.insert(key, string_array(list)),
                None => entry.remove(key),
            };
        }
        for (key, list) in [
            ("deny_publish", &self.deny_publish),
            ("deny_subscribe", &self.deny_subscribe),
        ] {
            if list.is_empty() {
                entry.remove(key);
            } else {
                entry.insert(key, string_array(list));
            }
        }
    }
}

impl From<&Lists> for PermissionSpec {
    fn from(lists: &Lists) -> Self {
        let strings = |l: &[Pattern]| l.iter().map(|p| p.as_str().to_owned()).collect();
        PermissionSpec {
            publish: lists.publish.as_deref().map(strings),
            subscribe: lists.subscribe.as_deref().map(strings),
            deny_publish: strings(&lists.deny_publish),
            deny_subscribe: strings(&lists.deny_subscribe),
        }
    }
}

/// What may be shown of a user: never its hash or SCRAM credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSummary {
    /// The user name.
    pub name: String,
    /// Its roles, defined or built-in, as the file lists them.
    pub roles: Vec<String>,
    /// The strongest admin right its roles give.
    pub admin: Option<AdminRole>,
    /// Its own lists, as written (without its roles').
    pub own: PermissionSpec,
    /// What it may publish to, its roles' lists included.
    pub publish: Vec<String>,
    /// What it may subscribe to.
    pub subscribe: Vec<String>,
    /// What it may not publish to.
    pub deny_publish: Vec<String>,
    /// What it may not subscribe to.
    pub deny_subscribe: Vec<String>,
}

/// What may be shown of a defined role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleSummary {
    /// The role name.
    pub name: String,
    /// Its lists, as written.
    pub permissions: PermissionSpec,
    /// The admin right it grants.
    pub admin: Option<AdminRole>,
}

/// A role to define: its lists and admin right (the API's and the CLI's
/// `role add`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleSpec {
    /// Its permission lists (`None`: says nothing).
    pub permissions: PermissionSpec,
    /// The admin right it grants.
    pub admin: Option<AdminRole>,
}

/// The users of the broker, loaded from the users file.
pub struct Users {
    users: HashMap<String, User>,
    roles: BTreeMap<String, DefinedRole>,
    anonymous: Permissions,
}

/// Permissions of a principal that is not in the file.
static NOTHING: Permissions = Permissions::nothing();

/// A hash of a random password, checked for unknown users so that a login
/// takes as long whether or not the user exists.
fn decoy_hash() -> &'static str {
    static DECOY: OnceLock<String> = OnceLock::new();
    DECOY.get_or_init(|| {
        let secret: [u8; 32] = rand::random();
        password::hash(&secret).unwrap_or_default()
    })
}

impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only: hashes stay out of logs.
        let mut names: Vec<&str> = self.users.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("Users")
            .field("users", &names)
            .field("anonymous", &self.anonymous)
            .finish()
    }
}

impl Default for Users {
    /// No users; anonymous clients may do everything.
    fn default() -> Self {
        Self {
            users: HashMap::new(),
            roles: BTreeMap::new(),
            anonymous: Permissions::everything(),
        }
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= USER_NAME_LEN_MAX_BYTES && !name.chars().any(char::is_control)
}

impl Users {
    /// Loads the users file. A missing file means no users (anonymous
    /// clients may do everything, if anonymous access is on).
    pub fn load(path: &Path) -> Result<Users, UsersError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Users::default()),
            Err(source) => Err(UsersError::Read {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Parses a users file held in a string; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Users, UsersError> {
        let location = |pos: Option<usize>| {
            let (line, column) = pos.map(|p| locate::line_col(text, p)).unzip();
            Location {
                origin: origin.to_owned(),
                line,
                column,
            }
        };
        if let Err(e) = toml::de::DeTable::parse(text) {
            return Err(UsersError::Syntax {
                location: location(e.span().map(|s| s.start)),
                message: e
                    .message()
                    .lines()
                    .map(str::trim)
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
        let doc: FileDoc = toml::from_str(text).map_err(|e| {
            let pos = e.span().map(|s| s.start);
            UsersError::Invalid {
                location: location(pos),
                key: pos
                    .and_then(|p| locate::key_at(text, p))
                    .unwrap_or_else(|| "(document)".to_owned()),
                message: e.message().replacen("unknown field", "unknown key", 1),
            }
        })?;
        Self::from_doc(doc).map_err(|(key, message)| UsersError::Invalid {
            location: location(locate::span_of(text, &key).map(|s| s.start)),
            key,
            message,
        })
    }

    fn from_doc(doc: FileDoc) -> Result<Users, (String, String)> {
        let anonymous = match doc.anonymous {
            None => Permissions::everything(),
            Some(p) => roles::effective(&p.check("anonymous")?, []),
        };
        if doc.roles.len() > ROLES_MAX {
            return Err(("roles".to_owned(), format!("more than {ROLES_MAX} roles")));
        }
        let mut defined = BTreeMap::new();
        for (name, r) in doc.roles {
            let key = format!("roles.{name}");
            if AdminRole::parse(&name).is_some() {
                return Err((
                    key,
                    format!("'{name}' is a built-in role: choose another name"),
                ));
            }
            if !roles::valid_role_name(&name) {
                return Err((
                    key,
                    format!("invalid role name {name:?}: 1 to {ROLE_NAME_LEN_MAX_BYTES} ASCII letters, digits, '-' or '_'"),
                ));
            }
            let admin = r
                .admin
                .as_deref()
                .map(|a| {
                    AdminRole::parse(a).ok_or_else(|| {
                        (
                            format!("{key}.admin"),
                            format!("unknown admin right {a:?}: monitoring, management or administrator"),
                        )
                    })
                })
                .transpose()?;
            let lists = PermissionSpec {
                publish: r.publish,
                subscribe: r.subscribe,
                deny_publish: r.deny_publish,
                deny_subscribe: r.deny_subscribe,
            }
            .check(&key)?;
            defined.insert(name, DefinedRole { lists, admin });
        }
        let mut users = HashMap::with_capacity(doc.users.len());
        for (name, u) in doc.users {
            let key = format!("users.{name}");
            if !valid_name(&name) {
                return Err((key, format!("invalid user name {name:?}")));
            }
            password::check_stored(&u.password_hash)
                .map_err(|e| (format!("{key}.password_hash"), e.to_string()))?;
            let scram = u
                .scram_sha_256
                .as_deref()
                .map(scram::decode)
                .transpose()
                .map_err(|e| (format!("{key}.scram_sha_256"), e.to_string()))?;
            let own = PermissionSpec {
                publish: u.publish,
                subscribe: u.subscribe,
                deny_publish: u.deny_publish,
                deny_subscribe: u.deny_subscribe,
            };
            let own_lists = own.check(&key)?;
            if u.roles.len() > ROLES_PER_USER_MAX {
                return Err((
                    format!("{key}.roles"),
                    format!("more than {ROLES_PER_USER_MAX} roles"),
                ));
            }
            let mut held: Vec<String> = Vec::with_capacity(u.roles.len());
            let mut admin = Vec::new();
            let mut role_lists = Vec::new();
            for (i, role) in u.roles.into_iter().enumerate() {
                if held.contains(&role) {
                    continue;
                }
                if let Some(builtin) = AdminRole::parse(&role) {
                    admin.push(builtin);
                } else if let Some(d) = defined.get(&role) {
                    admin.extend(d.admin);
                    role_lists.push(&d.lists);
                } else {
                    return Err((
                        format!("{key}.roles[{i}]"),
                        UsersError::UnknownRole(role).to_string(),
                    ));
                }
                held.push(role);
            }
            admin.sort_unstable();
            admin.dedup();
            let permissions = roles::effective(&own_lists, role_lists);
            users.insert(
                name,
                User {
                    password_hash: u.password_hash,
                    scram,
                    own,
                    roles: held,
                    permissions,
                    admin,
                },
            );
        }
        Ok(Users {
            users,
            roles: defined,
            anonymous,
        })
    }

    /// True if `user` has the password `password`. An unknown user is
    /// checked against a decoy hash, and the result combined without a
    /// branch, so timing does not tell unknown users from wrong passwords.
    /// Costs one argon2 check (~14 ms of CPU): run it off the async
    /// runtime's worker threads.
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        let entry = self.users.get(user);
        let hash: &str = match entry {
            Some(u) => &u.password_hash,
            None => decoy_hash(),
        };
        let matched = password::verify(hash, password);
        matched & entry.is_some()
    }

    /// SCRAM-SHA-256 credentials of `user`; `None` if the user is unknown
    /// or was added without them (a hand-written entry with only a
    /// password hash).
    pub fn scram(&self, user: &str) -> Option<ScramCredentials> {
        self.users.get(user).and_then(|u| u.scram.clone())
    }

    /// What a principal may do: `None` is the anonymous user (the file's
    /// `[anonymous]` section, everything by default); an unknown user may
    /// do nothing.
    pub fn permissions(&self, user: Option<&str>) -> &Permissions {
        match user {
            None => &self.anonymous,
            Some(name) => self.users.get(name).map_or(&NOTHING, |u| &u.permissions),
        }
    }

    /// The roles of `user`, defined or built-in, in the order the file
    /// lists them (none for an unknown user). The first is what the
    /// balancer's `role_name` key takes.
    pub fn roles(&self, user: &str) -> &[String] {
        self.users.get(user).map_or(&[], |u| &u.roles)
    }

    /// The admin rights of `user`: its built-in roles and those its
    /// defined roles grant, least power first (none for an unknown user).
    pub fn admin_rights(&self, user: &str) -> &[AdminRole] {
        self.users.get(user).map_or(&[], |u| &u.admin)
    }

    /// The strongest admin right of `user`, if it has any.
    pub fn highest_role(&self, user: &str) -> Option<AdminRole> {
        self.admin_rights(user).iter().max().copied()
    }

    /// Whether `role` is a role a user may hold: built-in or defined.
    pub fn knows_role(&self, role: &str) -> bool {
        AdminRole::parse(role).is_some() || self.roles.contains_key(role)
    }

    /// The defined role `name` (not a built-in one); `None` if undefined.
    pub fn role(&self, name: &str) -> Option<RoleSummary> {
        self.roles.get(name).map(|d| RoleSummary {
            name: name.to_owned(),
            permissions: PermissionSpec::from(&d.lists),
            admin: d.admin,
        })
    }

    /// Every defined role's name, sorted.
    pub fn role_names(&self) -> Vec<&str> {
        self.roles.keys().map(String::as_str).collect()
    }

    /// Every role held by some user, with its holders sorted: one pass
    /// over the users, for listings that show every role's holders.
    pub fn holders_by_role(&self) -> HashMap<&str, Vec<&str>> {
        let mut by_role: HashMap<&str, Vec<&str>> = HashMap::new();
        for (name, user) in &self.users {
            for role in &user.roles {
                by_role
                    .entry(role.as_str())
                    .or_default()
                    .push(name.as_str());
            }
        }
        for names in by_role.values_mut() {
            names.sort_unstable();
        }
        by_role
    }

    /// The users holding `role`, sorted.
    pub fn holders(&self, role: &str) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .users
            .iter()
            .filter(|(_, u)| u.roles.iter().any(|r| r == role))
            .map(|(n, _)| n.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// What may be shown of `user` (no hash); `None` if unknown.
    pub fn summary(&self, user: &str) -> Option<UserSummary> {
        let strings = |list: &[Pattern]| list.iter().map(|p| p.as_str().to_owned()).collect();
        self.users.get(user).map(|u| UserSummary {
            name: user.to_owned(),
            roles: u.roles.clone(),
            admin: u.admin.iter().max().copied(),
            own: u.own.clone(),
            publish: strings(&u.permissions.publish),
            subscribe: strings(&u.permissions.subscribe),
            deny_publish: strings(&u.permissions.deny_publish),
            deny_subscribe: strings(&u.permissions.deny_subscribe),
        })
    }

    /// Every user's name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.users.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// True if the file names `user`.
    pub fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    /// Number of users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// True if there are no users.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

// ---- writing ---------------------------------------------------------------

/// What a new users file starts with.
const NEW_FILE_HEADER: &str = "\
# Rosetta users: argon2id password hashes, SCRAM-SHA-256 credentials and
# address permissions per user. Entries are written by the rosetta CLI;
# comments and other entries are kept. See config/users.toml.example.
";

fn string_array<S: AsRef<str>>(list: &[S]) -> toml_edit::Item {
    let mut array = toml_edit::Array::new();
    for s in list {
        array.push(s.as_ref());
    }
    toml_edit::value(array)
}

/// Adds `name` to the users file at `path`, or replaces its password and
/// permissions (keeping its roles). `publish`/`subscribe` are permission
/// patterns (see [`permissions`]); `None` allows everything. Creates the
/// file if needed. The file is replaced atomically (written to a temporary
/// file, synced, renamed) with mode 0600. Not safe against two concurrent
/// writers: the last one wins.
pub fn add_user(
    path: &Path,
    name: &str,
    password: &[u8],
    publish: Option<&[String]>,
    subscribe: Option<&[String]>,
) -> Result<(), UsersError> {
    save_user(path, name, password, publish, subscribe, None)
}

/// [`add_user`] that also sets the user's admin roles; `roles: None`
/// keeps those of an existing entry (none for a new one).
pub fn save_user(
    path: &Path,
    name: &str,
    password: &[u8],
    publish: Option<&[String]>,
    subscribe: Option<&[String]>,
    roles: Option<&[AdminRole]>,
) -> Result<(), UsersError> {
    let spec = PermissionSpec::allowing(publish, subscribe);
    let roles: Option<Vec<String>> =
        roles.map(|r| r.iter().map(|r| r.as_str().to_owned()).collect());
    save_user_with(path, name, password, &spec, roles.as_deref())
}

/// [`save_user`] with every permission list, deny rules included, and
/// roles by name (defined or built-in; an unknown one is
/// [`UsersError::UnknownRole`]).
pub fn save_user_with(
    path: &Path,
    name: &str,
    password: &[u8],
    permissions: &PermissionSpec,
    roles: Option<&[String]>,
) -> Result<(), UsersError> {
    if !valid_name(name) {
        return Err(UsersError::InvalidName(name.to_owned()));
    }
    permissions.validate()?;
    let (hash, scram) = stored_credentials(password)?;

    let mut entry = toml_edit::Table::new();
    entry.insert("password_hash", toml_edit::value(hash));
    entry.insert("scram_sha_256", toml_edit::value(scram));
    permissions.write_to(&mut entry);

    edit_doc(path, |loaded, doc| {
        let users = users_table(doc)?;
        let roles = match roles {
            Some(roles) => Some(checked_roles(loaded, roles)?),
            None => None,
        };
        let kept = users
            .get(name)
            .and_then(|old| old.get("roles"))
            .filter(|_| roles.is_none())
            .cloned();
        match (&roles, kept) {
            (Some(roles), _) if !roles.is_empty() => {
                entry.insert("roles", string_array(roles));
            }
            (None, Some(kept)) => {
                entry.insert("roles", kept);
            }
            _ => {}
        }
        users.insert(name, toml_edit::Item::Table(entry));
        Ok(())
    })
}

/// `roles` each once, in order, if every one is known to `users` and
/// there are at most [`ROLES_PER_USER_MAX`].
fn checked_roles<'a>(users: &Users, roles: &'a [String]) -> Result<Vec<&'a str>, UsersError> {
    let mut out: Vec<&str> = Vec::with_capacity(roles.len());
    for role in roles {
        if !users.knows_role(role) {
            return Err(UsersError::UnknownRole(role.clone()));
        }
        if !out.contains(&role.as_str()) {
            out.push(role);
        }
    }
    if out.len() > ROLES_PER_USER_MAX {
        return Err(UsersError::TooManyRoles);
    }
    Ok(out)
}

/// The argon2 hash and SCRAM-SHA-256 credentials a users file stores for
/// `password`, once it is checked (1 to [`PASSWORD_LEN_MAX_BYTES`] bytes).
fn stored_credentials(password: &[u8]) -> Result<(String, String), UsersError> {
    if password.is_empty() || password.len() > PASSWORD_LEN_MAX_BYTES {
        return Err(UsersError::InvalidPassword);
    }
    let hash = password::hash(password)?;
    Ok((hash, scram::encode(&scram::derive_new(password))))
}

/// Changes the password (hash and SCRAM credentials) of an existing user,
/// keeping its permissions and roles. Returns false if there is no such
/// user (the file is then left as it was).
pub fn set_password(path: &Path, name: &str, password: &[u8]) -> Result<bool, UsersError> {
    let (hash, scram) = stored_credentials(password)?;
    let mut found = false;
    edit_file(path, |users| {
        if let Some(entry) = users.get_mut(name).and_then(|e| e.as_table_like_mut()) {
            entry.insert("password_hash", toml_edit::value(hash));
            entry.insert("scram_sha_256", toml_edit::value(scram));
            found = true;
        }
    })?;
    Ok(found)
}

/// Replaces the permission lists of an existing user, keeping its
/// password and roles. Returns false if there is no such user (the file is
/// then left as it was).
pub fn set_permissions(
    path: &Path,
    name: &str,
    permissions: &PermissionSpec,
) -> Result<bool, UsersError> {
    permissions.validate()?;
    let mut found = false;
    edit_file(path, |users| {
        if let Some(entry) = users.get_mut(name).and_then(|e| e.as_table_like_mut()) {
            permissions.write_to(entry);
            found = true;
        }
    })?;
    Ok(found)
}

/// Sets the roles of an existing user by name, defined or built-in, in
/// this order (the first is the balancer's `role_name`; none: an empty
/// list), keeping its password and permissions. Returns false if there is
/// no such user (the file is then left as it was); an unknown role is
/// [`UsersError::UnknownRole`].
pub fn set_roles(path: &Path, name: &str, roles: &[String]) -> Result<bool, UsersError> {
    let mut found = false;
    edit_doc(path, |loaded, doc| {
        let roles = checked_roles(loaded, roles)?;
        let users = users_table(doc)?;
        if let Some(entry) = users.get_mut(name).and_then(|e| e.as_table_like_mut()) {
            if roles.is_empty() {
                entry.remove("roles");
            } else {
                entry.insert("roles", string_array(&roles));
            }
            found = true;
        }
        Ok(())
    })?;
    Ok(found)
}

/// Removes `name` from the users file. Returns whether it was there.
pub fn remove_user(path: &Path, name: &str) -> Result<bool, UsersError> {
    let mut removed = false;
    edit_file(path, |users| removed = users.remove(name).is_some())?;
    Ok(removed)
}

/// [`edit_doc`] of the `[users]` table alone.
fn edit_file(path: &Path, change: impl FnOnce(&mut toml_edit::Table)) -> Result<(), UsersError> {
    edit_doc(path, |_, doc| {
        change(users_table(doc)?);
        Ok(())
    })
}

/// A table of the document (`users`, `roles`), made (implicit: only its
/// `[users.NAME]` headers are written) if absent.
fn doc_table<'d>(
    doc: &'d mut toml_edit::DocumentMut,
    name: &str,
) -> Result<&'d mut toml_edit::Table, UsersError> {
    doc.entry(name)
        .or_insert_with(|| {
            let mut t = toml_edit::Table::new();
            t.set_implicit(true);
            toml_edit::Item::Table(t)
        })
        .as_table_mut()
        .ok_or_else(|| UsersError::Invalid {
            location: Location {
                origin: "users file".to_owned(),
                line: None,
                column: None,
            },
            key: name.to_owned(),
            message: "must be a table".to_owned(),
        })
}

fn users_table(doc: &mut toml_edit::DocumentMut) -> Result<&mut toml_edit::Table, UsersError> {
    doc_table(doc, "users")
}

/// Loads the file (refusing one that does not load cleanly, so a broken
/// file is never made worse), lets `change` edit the document, knowing
/// the users it held, checks that the result loads, and replaces the file
/// atomically. An error of `change` leaves the file as it was.
fn edit_doc(
    path: &Path,
    change: impl FnOnce(&Users, &mut toml_edit::DocumentMut) -> Result<(), UsersError>,
) -> Result<(), UsersError> {
    let origin = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => NEW_FILE_HEADER.to_owned(),
        Err(source) => {
            return Err(UsersError::Read {
                path: path.to_owned(),
                source,
            })
        }
    };
    let loaded = Users::parse(&text, &origin)?;
    let mut doc: toml_edit::DocumentMut =
        text.parse()
            .map_err(|e: toml_edit::TomlError| UsersError::Syntax {
                location: Location {
                    origin: origin.clone(),
                    line: None,
                    column: None,
                },
                message: e.message().to_owned(),
            })?;
    change(&loaded, &mut doc)?;
    let new_text = doc.to_string();
    // Never write a file the broker would refuse.
    Users::parse(&new_text, &origin)?;
    write_atomic(path, new_text.as_bytes()).map_err(|source| UsersError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Writes `data` to a temporary file next to `path` with mode 0600, syncs
/// it, renames it over `path` and syncs the directory, so a crash leaves
/// either the old or the new file, never a torn one.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;

    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .map_or_else(|| "users.toml".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{file_name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(USERS_FILE_MODE)
            .open(&tmp)?;
        // `mode` applies only when the file is created; a stale temp file
        // from a crashed run may have other bits.
        std::fs::set_permissions(
            &tmp,
            std::os::unix::fs::PermissionsExt::from_mode(USERS_FILE_MODE),
        )?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        // Best effort: the temp file is garbage now.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
