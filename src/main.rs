//! The `rosetta` command: runs the broker, or manages its users file.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod admin_cli;
mod client_cli;

/// See Cargo.toml: glibc malloc fragments under the broker's cross-thread
/// allocation pattern. The `jemalloc` feature is on by default.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Rosetta: one broker for MQTT 3.1.1/5.0, STOMP 1.0-1.2 and AMQP 1.0
/// clients, over TCP, TLS and WebSocket.
///
/// With no arguments it starts with embedded defaults: data in ./data,
/// MQTT on 1883, STOMP on 61613, AMQP on 5672, WebSocket on 8080, anonymous
/// access on, and so on loopback only ([listeners] bind = "0.0.0.0" opens
/// it to the network).
#[derive(Parser, Debug)]
#[command(name = "rosetta", version, about, long_about)]
struct Cli {
    /// Configuration file (TOML). Without it, the embedded defaults are used.
    #[arg(short, long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,

    /// How log lines are written to standard error: `text` for people, or
    /// `json` (one object per line, with the span fields such as the
    /// connection id) for log collectors.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Option<Command>,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs the broker (the default).
    Run,
    /// Checks a configuration as `run` would (keys, TLS files, data
    /// directory, users file) and prints the effective listeners.
    CheckConfig,
    /// Manages the users file.
    User {
        #[command(subcommand)]
        action: UserAction,
    },
    /// Queues of a running broker, through its admin API.
    Queue {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: QueueAction,
    },
    /// Streams of a running broker and their consumer groups' lag,
    /// through its admin API.
    Stream {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: StreamAction,
    },
    /// Connections of a running broker, through its admin API.
    Connection {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: ConnectionAction,
    },
    /// Roles of the users file (permissions and an admin right that users
    /// take by name), through a running broker's admin API.
    Role {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: RoleAction,
    },
    /// Bearer tokens of the admin API, made with a password: pass one as
    /// --token (or ROSETTA_TOKEN) instead of --user and --password.
    Token {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: TokenAction,
    },
    /// A running broker at a glance (the API's overview).
    Status {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Publishes messages over MQTT, STOMP or AMQP (the URL says which):
    /// `rosetta pub --url mqtt://localhost:1883/queue/q --message hi`.
    Pub(client_cli::PubArgs),
    /// Receives messages over MQTT, STOMP or AMQP and prints each payload on
    /// its own line: `rosetta sub --url stomp://localhost:61613/queue/q`.
    Sub(client_cli::SubArgs),
    /// Works on the journal of a stopped broker.
    Store {
        #[command(subcommand)]
        action: StoreAction,
    },
}

/// Where the admin API is and who asks it.
#[derive(Args, Debug)]
struct ApiArgs {
    /// The admin API ([admin] listen).
    #[arg(long, default_value = admin_cli::URL_DEFAULT, global = true)]
    url: String,
    /// A user of the users file with an admin role.
    #[arg(long, global = true)]
    user: Option<String>,
    /// Its password (for scripts: it shows in the process list); default:
    /// the ROSETTA_PASSWORD environment variable.
    #[arg(long, global = true)]
    password: Option<String>,
    /// A bearer token (`rosetta token create`) instead of --user and
    /// --password; default: the ROSETTA_TOKEN environment variable.
    #[arg(long, global = true)]
    token: Option<String>,
}

#[derive(Subcommand, Debug)]
enum TokenAction {
    /// Makes a token and prints it (once) on standard output.
    Create {
        /// For another user than --user (administrators only).
        #[arg(long = "for", value_name = "USER")]
        for_user: Option<String>,
        /// Lifetime in seconds (default: a day).
        #[arg(long, value_name = "SECONDS")]
        expires_in: Option<u64>,
    },
    /// Prints the tokens (never the tokens themselves).
    List,
    /// Revokes a token.
    Revoke {
        /// The token's id (from `token list` or `token create`).
        id: String,
    },
}

/// The permission lists `user add` and `role add` take alike. A user's
/// lists and its roles' lists combine (docs/admin.md, "Defined roles").
#[derive(Args, Debug)]
struct PermissionFlags {
    /// Address patterns it may publish to (repeatable). None given: this
    /// list says nothing; a user's roles decide, and a user without roles
    /// may publish everywhere.
    #[arg(long = "publish", value_name = "PATTERN")]
    publish: Vec<String>,
    /// Address patterns it may subscribe to or consume from (repeatable;
    /// none given: as for --publish).
    #[arg(long = "subscribe", value_name = "PATTERN")]
    subscribe: Vec<String>,
    /// Address patterns it may not publish to, whatever else allows it
    /// (repeatable; default: none).
    #[arg(long = "deny-publish", value_name = "PATTERN")]
    deny_publish: Vec<String>,
    /// Address patterns it may not subscribe to, whatever else allows it
    /// (repeatable; default: none).
    #[arg(long = "deny-subscribe", value_name = "PATTERN")]
    deny_subscribe: Vec<String>,
}

impl PermissionFlags {
    /// The lists as the users file and the API take them: an allow list
    /// given no pattern is absent (says nothing), not empty (allows nothing).
    fn spec(self) -> rosetta::users::PermissionSpec {
        rosetta::users::PermissionSpec {
            publish: (!self.publish.is_empty()).then_some(self.publish),
            subscribe: (!self.subscribe.is_empty()).then_some(self.subscribe),
            deny_publish: self.deny_publish,
            deny_subscribe: self.deny_subscribe,
        }
    }
}

#[derive(Subcommand, Debug)]
enum RoleAction {
    /// Prints the roles: the three built-in admin roles and the defined ones.
    List,
    /// Defines a role, or replaces the definition of an existing one (its
    /// users keep it and see the new one at their next publish, subscribe
    /// or API request).
    Add {
        /// The role name: letters, digits, '-', '_'.
        name: String,
        #[command(flatten)]
        permissions: PermissionFlags,
        /// The admin API right it gives: monitoring, management or
        /// administrator (default: none).
        #[arg(long, value_name = "RIGHT", value_parser = parse_admin_right)]
        admin: Option<rosetta::users::AdminRole>,
    },
    /// Removes a role no user holds.
    #[command(visible_alias = "delete")]
    Remove {
        /// The role name.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum QueueAction {
    /// Prints the queues' names, one a line.
    List {
        /// Only queues whose name contains this.
        #[arg(long)]
        name: Option<String>,
    },
    /// Prints a table of the queues' depth, in flight, scheduled, consumers...
    Stat {
        /// Only queues whose name contains this.
        #[arg(long)]
        name: Option<String>,
    },
    /// Removes every waiting message of a queue (in-flight ones stay).
    Purge {
        /// The queue.
        name: String,
    },
    /// Deletes a queue and its messages.
    Delete {
        /// The queue.
        name: String,
    },
    /// Moves waiting messages, oldest first, to another (existing) queue.
    Move {
        /// The queue they leave.
        name: String,
        /// The queue they go to.
        #[arg(long)]
        to: String,
        /// At most this many (default: all the API moves in one request, 10000).
        #[arg(long)]
        count: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
enum StreamAction {
    /// Prints a table of the stream logs and each consumer group's
    /// committed offset and lag (one row per log and group).
    Stat {
        /// Only logs whose name contains this.
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum ConnectionAction {
    /// Prints the live connections.
    List,
    /// Closes a connection, telling the client why where its protocol can.
    Close {
        /// The connection id (from `connection list`).
        id: u64,
        /// What the client is shown.
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum StoreAction {
    /// Verifies the journal without changing it and prints what recovery
    /// would find: damaged ranges, missing or cut-short segments, what was
    /// lost. Exits non-zero when anything is damaged or missing.
    Check {
        /// The data directory; default: the one the configuration names.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum UserAction {
    /// Adds a user, or replaces an existing user's password and permissions:
    /// in the users file, or through a running broker's admin API with
    /// --url or --user.
    Add {
        /// The user name.
        name: String,
        /// Editing the file (and with --token): the new user's password
        /// (for scripts; it shows in the process list); without it the
        /// ROSETTA_PASSWORD environment variable, else asked twice on the
        /// terminal without echo, else one line of standard input. With
        /// --user: that administrator's password, as for every command
        /// that uses the API (else ROSETTA_PASSWORD, else asked once without
        /// echo on a terminal).
        #[arg(long)]
        password: Option<String>,
        /// Through the API: the new user's password (for scripts). Without
        /// it: ROSETTA_NEW_PASSWORD, else asked twice on the terminal without
        /// echo, else one line of standard input.
        #[arg(long, value_name = "PASSWORD", conflicts_with = "users_file")]
        new_password: Option<String>,
        #[command(flatten)]
        permissions: PermissionFlags,
        /// A role: one the users file defines (`rosetta role add`) or a
        /// built-in admin role (`monitoring`, `management`, `administrator`);
        /// repeatable, the first is the balancer's `role_name`. Without it
        /// a new user has none and an existing one keeps its own.
        #[arg(long = "role", value_name = "ROLE")]
        roles: Vec<String>,
        /// The users file; default: the one the configuration names.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["url", "user"])]
        users_file: Option<PathBuf>,
        /// Adds the user through a running broker's admin API at this URL
        /// (default with --user: http://127.0.0.1:8161) instead of editing
        /// the file, as an administrator: --user and --password, or the
        /// bearer token --token (or ROSETTA_TOKEN).
        #[arg(long)]
        url: Option<String>,
        /// The administrator the API is asked as (implies the API).
        #[arg(long)]
        user: Option<String>,
        /// The administrator's bearer token, with --url.
        #[arg(long, requires = "url", conflicts_with = "user")]
        token: Option<String>,
    },
    /// Prints the users of a running broker, through its admin API.
    List {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Deletes a user, through the admin API.
    #[command(visible_alias = "remove")]
    Delete {
        /// The user name.
        name: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Sets a user's roles through a running broker's admin API (in force
    /// at its connections' next publish or subscribe); with --users-file,
    /// in that file instead, and with --reload the broker then reads it
    /// again (`POST /api/v1/reload`, as SIGHUP does).
    Role {
        /// The user name.
        name: String,
        /// A defined or built-in role (repeatable, in order: the first is
        /// the balancer's `role_name`); none: the user holds no role.
        #[arg(long = "role", value_name = "ROLE")]
        roles: Vec<String>,
        /// Edits this users file instead of asking the API.
        #[arg(long, value_name = "FILE")]
        users_file: Option<PathBuf>,
        /// With --users-file: reloads the running broker's users through
        /// its admin API.
        #[arg(long, requires = "users_file")]
        reload: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Sets a user's password, through the admin API.
    Passwd {
        /// The user name.
        name: String,
        /// The new password (for scripts). Without it: the
        /// ROSETTA_NEW_PASSWORD environment variable, else asked twice on the
        /// terminal without echo, else one line of standard input.
        #[arg(long)]
        new_password: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
}

fn parse_admin_right(name: &str) -> Result<rosetta::users::AdminRole, String> {
    rosetta::users::AdminRole::parse(name).ok_or_else(|| {
        let known: Vec<&str> = rosetta::users::ADMIN_ROLES
            .iter()
            .map(|r| r.as_str())
            .collect();
        format!("unknown admin right '{name}' (known: {})", known.join(", "))
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // pub and sub say what matters themselves; their client libraries'
    // warnings (a refused SUBACK, ...) would only repeat it.
    let client = matches!(cli.command, Some(Command::Pub(_) | Command::Sub(_)));
    init_tracing(cli.log_format, if client { "error" } else { "info" });
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rosetta: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let config = rosetta::server::load_config(cli.config.as_deref())?;
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let access = rosetta::access::users_access(&config)?;
            runtime.block_on(serve(config, access))
        }
        Command::CheckConfig => {
            // The very checks `run` makes before it binds a port.
            let checked = rosetta::server::preflight(&config)?;
            for warning in &checked.warnings {
                eprintln!("warning: {warning}");
            }
            for (kind, addr) in config.active_listeners() {
                println!("{:<10} {addr}", kind.key());
            }
            println!("data_dir   {}", config.data_dir.display());
            Ok(())
        }
        Command::User {
            action:
                UserAction::Add {
                    name,
                    password,
                    new_password,
                    permissions,
                    roles,
                    users_file,
                    url,
                    user,
                    token,
                },
        } => {
            if url.is_some() || user.is_some() {
                let url = url.unwrap_or_else(|| admin_cli::URL_DEFAULT.to_owned());
                // With --user, --password is that administrator's, as for
                // every command of the API. With a token it is the new
                // user's, as it was before --user existed, and so is
                // ROSETTA_PASSWORD.
                let (operator_password, new_password) = match &user {
                    Some(_) => (password, new_password),
                    None => (
                        None,
                        new_password
                            .or(password)
                            .or_else(|| std::env::var("ROSETTA_PASSWORD").ok()),
                    ),
                };
                // The administrator's prompt (if any) before the new user's.
                let api = admin_cli::Api::new(&url, user.as_deref(), operator_password, token)?;
                let password =
                    match new_password.or_else(|| std::env::var("ROSETTA_NEW_PASSWORD").ok()) {
                        Some(p) => p,
                        None => read_password(&format!("new password for {name}"))?,
                    };
                let command = admin_cli::AdminCommand::UserAdd {
                    name,
                    password,
                    roles,
                    permissions: permissions.spec(),
                };
                return admin_cli::run(&api, command);
            }
            let password = match password.or_else(|| std::env::var("ROSETTA_PASSWORD").ok()) {
                Some(p) => p,
                None => read_password("password")?,
            };
            let path = users_file.unwrap_or_else(|| config.users_file());
            let permissions = permissions.spec();
            let roles = (!roles.is_empty()).then_some(roles.as_slice());
            let secret = password.as_bytes();
            rosetta::users::save_user_with(&path, &name, secret, &permissions, roles)?;
            println!("user '{name}' saved in {}", path.display());
            Ok(())
        }
        Command::User {
            action: UserAction::List { api },
        } => admin_cli::run(&api_of(api)?, admin_cli::AdminCommand::UserList),
        Command::User {
            action: UserAction::Delete { name, api },
        } => admin_cli::run(&api_of(api)?, admin_cli::AdminCommand::UserDelete { name }),
        Command::User {
            action:
                UserAction::Role {
                    name,
                    roles,
                    users_file,
                    reload,
                    api,
                },
        } => {
            let Some(path) = users_file else {
                let command = admin_cli::AdminCommand::UserRoles { name, roles };
                return admin_cli::run(&api_of(api)?, command);
            };
            anyhow::ensure!(
                rosetta::users::set_roles(&path, &name, &roles)?,
                "no user '{name}' in {}",
                path.display()
            );
            println!(
                "roles of '{name}' set to [{}] in {}",
                roles.join(", "),
                path.display()
            );
            if reload {
                return admin_cli::run(&api_of(api)?, admin_cli::AdminCommand::Reload);
            }
            Ok(())
        }
        Command::User {
            action:
                UserAction::Passwd {
                    name,
                    new_password,
                    api,
                },
        } => {
            // The administrator's prompt (if any) before the new password's.
            let api = api_of(api)?;
            let password = match new_password.or_else(|| std::env::var("ROSETTA_NEW_PASSWORD").ok())
            {
                Some(p) => p,
                None => read_password("password")?,
            };
            admin_cli::run(&api, admin_cli::AdminCommand::UserPasswd { name, password })
        }
        Command::Status { api } => admin_cli::run(&api_of(api)?, admin_cli::AdminCommand::Status),
        Command::Role { api, action } => {
            let command = match action {
                RoleAction::List => admin_cli::AdminCommand::RoleList,
                RoleAction::Add {
                    name,
                    permissions,
                    admin,
                } => admin_cli::AdminCommand::RoleAdd {
                    name,
                    role: rosetta::users::RoleSpec {
                        permissions: permissions.spec(),
                        admin,
                    },
                },
                RoleAction::Remove { name } => admin_cli::AdminCommand::RoleRemove { name },
            };
            admin_cli::run(&api_of(api)?, command)
        }
        Command::Queue { api, action } => {
            let command = match action {
                QueueAction::List { name } => admin_cli::AdminCommand::QueueList { name },
                QueueAction::Stat { name } => admin_cli::AdminCommand::QueueStat { name },
                QueueAction::Purge { name } => admin_cli::AdminCommand::QueuePurge { name },
                QueueAction::Delete { name } => admin_cli::AdminCommand::QueueDelete { name },
                QueueAction::Move { name, to, count } => {
                    admin_cli::AdminCommand::QueueMove { name, to, count }
                }
            };
            admin_cli::run(&api_of(api)?, command)
        }
        Command::Stream { api, action } => {
            let command = match action {
                StreamAction::Stat { name } => admin_cli::AdminCommand::StreamStat { name },
            };
            admin_cli::run(&api_of(api)?, command)
        }
        Command::Connection { api, action } => {
            let command = match action {
                ConnectionAction::List => admin_cli::AdminCommand::ConnectionList,
                ConnectionAction::Close { id, reason } => {
                    admin_cli::AdminCommand::ConnectionClose { id, reason }
                }
            };
            admin_cli::run(&api_of(api)?, command)
        }
        Command::Token { api, action } => {
            let command = match action {
                TokenAction::Create {
                    for_user,
                    expires_in,
                } => admin_cli::AdminCommand::TokenCreate {
                    user: for_user,
                    expires_in_s: expires_in,
                },
                TokenAction::List => admin_cli::AdminCommand::TokenList,
                TokenAction::Revoke { id } => admin_cli::AdminCommand::TokenRevoke { id },
            };
            admin_cli::run(&api_of(api)?, command)
        }
        Command::Pub(args) => client_cli::publish(args),
        Command::Sub(args) => client_cli::subscribe(args),
        Command::Store {
            action: StoreAction::Check { data_dir },
        } => store_check(data_dir.unwrap_or_else(|| config.data_dir.clone())),
    }
}

fn api_of(args: ApiArgs) -> anyhow::Result<admin_cli::Api> {
    admin_cli::Api::new(&args.url, args.user.as_deref(), args.password, args.token)
}

/// The broker and its admin API until SIGINT or SIGTERM. The admin API
/// starts first, so `/readyz` answers 503 while the journal is recovered,
/// and stops last, so it answers 503 while the broker drains.
async fn serve(
    config: rosetta::config::Config,
    access: std::sync::Arc<rosetta::access::UsersAccess>,
) -> anyhow::Result<()> {
    let admin = rosetta::admin::start_early(&config, access.clone()).await?;
    let broker = match rosetta::server::start(config, access.clone()).await {
        Ok(broker) => broker,
        Err(e) => {
            if let Some(admin) = admin {
                admin.shutdown().await;
            }
            return Err(e);
        }
    };
    if let Some(admin) = &admin {
        admin.attach(broker.view());
    }
    // After the admin API has the broker, so that whoever waits for this
    // line (an operator, the test harness) finds every route answering.
    tracing::info!("{}", rosetta::READY_LOG_LINE);
    let users_file = broker.view().config().users_file();
    let view = broker.view();
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let stop = rosetta::server::wait_for_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            r = &mut stop => {
                r?;
                break;
            }
            _ = hangup.recv() => {
                rosetta::admin::reload_all(&users_file, &access, &view, "SIGHUP");
            }
        }
    }
    let stopped = broker.shutdown().await;
    if let Some(admin) = admin {
        admin.shutdown().await;
    }
    stopped
}

/// `rosetta store check`: the report recovery would log, without starting.
fn store_check(dir: PathBuf) -> anyhow::Result<()> {
    let config = rosetta::store::StoreConfig::new(&dir);
    let report = rosetta::store::Store::check(&config)
        .map_err(|e| anyhow::anyhow!("checking the journal in {}: {e}", dir.display()))?;
    println!("journal {}", dir.display());
    print!("{report}");
    anyhow::ensure!(
        report.is_clean(),
        "the journal in {} is damaged or incomplete (see above)",
        dir.display()
    );
    Ok(())
}

/// Asks for a new password: on a terminal twice and without echo (a
/// typo would otherwise lock the user out), else one line of standard
/// input, for scripts that pipe it in.
/// A new password: asked twice without echo on a terminal (`what: `, then
/// `what again: `), else one line of standard input.
fn read_password(what: &str) -> anyhow::Result<String> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        let password = line.trim_end_matches(['\r', '\n']).to_owned();
        anyhow::ensure!(!password.is_empty(), "empty password");
        return Ok(password);
    }
    let password = rpassword::prompt_password(format!("{what}: "))?;
    anyhow::ensure!(!password.is_empty(), "empty password; nothing saved");
    let again = rpassword::prompt_password(format!("{what} again: "))?;
    anyhow::ensure!(
        password == again,
        "the passwords do not match; nothing saved"
    );
    Ok(password)
}

/// `default_level`: the filter when ROSETTA_LOG is not set.
fn init_tracing(format: LogFormat, default_level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("ROSETTA_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            builder.with_ansi(ansi).init();
        }
        // The current span's fields (conn_id, protocol, ...) are on every
        // line, so a collector can group a connection's lines.
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}
