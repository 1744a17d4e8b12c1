//! The server: the only part of Rosetta that does IO.
//!
//! It opens the journal, builds the core, binds the listeners, runs one task
//! per connection (see [`driver`]), and shuts down in phases:
//!
//! 1. stop accepting;
//! 2. tell every client (MQTT 5 DISCONNECT 0x8B, STOMP ERROR, AMQP close)
//!    through [`Core::shutdown`];
//! 3. let connections drain for up to `[broker] shutdown_grace_ms`;
//! 4. flush and sync the journal;
//! 5. return, and the process exits 0.
//!
//! It also owns who may connect: the users file ([`users`]), the access
//! control the core asks ([`access`]) and the threads that check passwords
//! ([`hash_pool`]).

pub mod access;
mod admission;
mod cluster;
mod coarse_timer;
pub mod connections;
mod detect;
pub mod discovery;
mod driver;
mod fd_limit;
/// For the cargo-fuzz targets in `fuzz/` only.
#[doc(hidden)]
pub mod fuzzing;
pub mod hash_pool;
mod listener;
mod log_throttle;
mod metrics;
mod parking;
mod periodic;
mod preflight;
mod protocols;
mod proxy;
mod rates;
mod refuse;
mod slots;
mod sys_topics;
mod tls;
pub use tls::{ServerCertificate, TlsSetupError};
pub mod users;
mod view;
mod ws;
mod ws_frames;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{watch, Notify};

use rosetta_config::{Config, ListenerKind};
use rosetta_core::{AccessControl, Core, CoreConfig};
use rosetta_store::{Store, StoreConfig};

pub use metrics::BrokerFigures;
pub use preflight::{preflight, Preflight};
pub use rates::RecentActivity;
pub use view::BrokerView;
pub use ws::{AdminOnHttpPort, HttpStream};

/// State every connection task shares.
pub(crate) struct Shared {
    pub(crate) core: Core,
    pub(crate) config: Config,
    /// The protocol adapters' settings, from `config`.
    pub(crate) adapters: protocols::AdapterConfigs,
    next_conn_id: AtomicU64,
    /// Set when connections must stop now (end of the grace period).
    pub(crate) hard_stop: Arc<driver::HardStop>,
    /// Idle plain TCP and WebSocket connections, out of tokio
    /// (`parking`); `None` if its epoll set could not be made.
    pub(crate) parker: Option<Arc<parking::Parker>>,
    /// The TLS acceptor, when `[tls]` names a certificate and key.
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// The certificate `tls` presents, reloadable.
    pub(crate) certificate: Option<Arc<tls::ServerCertificate>>,
    /// The journal, for its counters.
    pub(crate) store: Arc<Store>,
    /// Who may connect: the authenticated and unauthenticated counts.
    pub(crate) admission: Arc<admission::Admission>,
    /// Refusals being answered.
    pub(crate) refusals: Arc<refuse::Refusals>,
    /// Failed TLS handshakes are logged through this.
    pub(crate) tls_log: log_throttle::LogThrottle,
    /// Live protocol connections, for the admin API.
    pub(crate) connections: Arc<connections::Registry>,
    /// When the broker started (the admin API's uptime).
    pub(crate) started: std::time::Instant,
    /// `[cluster]`'s balancer; `None` for a single node.
    pub(crate) cluster: Option<Arc<cluster::ClusterNode>>,
    /// Recent message rates and sync latencies, sampled by a timer.
    rates: rates::RateWindow,
    /// Each listener's kind and bound address, once all are bound (the
    /// overview lists them; the console links to the demo page with them).
    pub(crate) listeners: std::sync::OnceLock<Vec<(ListenerKind, SocketAddr)>>,
    /// The admin API's server for its paths on the HTTP port, once the
    /// admin API has the broker (`[admin] on_http_port`).
    pub(crate) admin_on_http_port: std::sync::OnceLock<Arc<dyn ws::AdminOnHttpPort>>,
    /// Connections this node's proxy relays to other nodes now: counted
    /// as authenticated here (they hold a socket), but left out of the
    /// count this node publishes, since the node serving them counts them.
    pub(crate) proxied_out: AtomicUsize,
    active: AtomicUsize,
    idle: Notify,
}

impl Shared {
    /// The Prometheus exposition of this broker, now.
    pub(crate) fn metrics(&self) -> String {
        metrics::render(&self.core, &self.figures())
    }

    /// The broker-wide figures, now.
    pub(crate) fn figures(&self) -> BrokerFigures {
        BrokerFigures {
            connections: self.active.load(Ordering::Relaxed),
            authenticated: self.admission.authenticated(),
            unauthenticated: self.admission.unauthenticated(),
            refused_total: self.admission.refused_total(),
            parked: self.parker.as_ref().map_or(0, |p| p.parked()),
            parked_resumes_total: self.parker.as_ref().map_or(0, |p| p.resumes()),
            memory_budget_bytes: self.config.store.memory_budget_bytes,
            store: self.store.stats(),
        }
    }

    /// Says how many rate-limited log lines were left out since the last
    /// one of their kind, so a storm that ended leaves a trace.
    fn report_suppressed_logs(&self) {
        for (what, throttle) in [
            ("refused or timed-out connections", &self.admission.log),
            ("failed TLS handshakes", &self.tls_log),
        ] {
            let suppressed = throttle.take_suppressed();
            if suppressed > 0 {
                tracing::warn!(suppressed, "{what}: {suppressed} more not logged");
            }
        }
    }

    pub(crate) fn next_conn_id(&self) -> u64 {
        self.next_conn_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Counts a connection task for the shutdown drain; the guard uncounts
    /// it when dropped.
    pub(crate) fn track(self: &Arc<Self>) -> ConnectionGuard {
        self.active.fetch_add(1, Ordering::SeqCst);
        ConnectionGuard(Arc::clone(self))
    }
}

pub(crate) struct ConnectionGuard(Arc<Shared>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A running broker: its bound addresses and its shutdown handle.
pub struct RunningBroker {
    addrs: Vec<(ListenerKind, SocketAddr)>,
    shared: Arc<Shared>,
    store: Arc<Store>,
    stop_accepting: watch::Sender<bool>,
    accept_tasks: Vec<tokio::task::JoinHandle<()>>,
    /// This node in etcd (`[cluster]`), left first on shutdown.
    membership: Option<rosetta_cluster::Membership>,
}

impl RunningBroker {
    /// The address a listener is bound to (useful with port 0).
    pub fn local_addr(&self, kind: ListenerKind) -> Option<SocketAddr> {
        self.addrs.iter().find(|(k, _)| *k == kind).map(|(_, a)| *a)
    }

    /// The broker core (statistics, tests).
    pub fn core(&self) -> &Core {
        &self.shared.core
    }

    /// How many idle connections are parked out of their tasks now (see
    /// docs/scaling.md, "Parked connections").
    pub fn parked_connections(&self) -> usize {
        self.shared.parker.as_ref().map_or(0, |p| p.parked())
    }

    /// How many times a parked connection was resumed since the start.
    pub fn parked_resumes(&self) -> u64 {
        self.shared.parker.as_ref().map_or(0, |p| p.resumes())
    }

    /// The Prometheus exposition of this broker now, as `GET /metrics`
    /// serves it.
    pub fn metrics(&self) -> String {
        self.shared.metrics()
    }

    /// What the admin API sees of this broker; it stops saying "ready"
    /// when the shutdown begins.
    pub fn view(&self) -> BrokerView {
        BrokerView::new(Arc::clone(&self.shared), self.stop_accepting.subscribe())
    }

    /// Shuts down in phases; see the module docs.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        // Leaving first: the other nodes stop sending clients here.
        if let Some(membership) = self.membership {
            membership.leave().await;
        }
        tracing::info!("shutting down: no new connections");
        let _ = self.stop_accepting.send(true);
        for t in self.accept_tasks {
            let _ = t.await;
        }
        self.shared.core.shutdown();
        // How long connections get to say goodbye before they are cut.
        let grace = Duration::from_millis(self.shared.config.broker.shutdown_grace_ms);
        let drained = tokio::time::timeout(grace, async {
            loop {
                let notified = self.shared.idle.notified();
                if self.shared.active.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                remaining = self.shared.active.load(Ordering::SeqCst),
                grace_ms = grace.as_millis(),
                "grace period over ([broker] shutdown_grace_ms); cutting remaining connections"
            );
        }
        self.shared.hard_stop.stop();
        self.shared.connections.wake_all();
        if let Some(parker) = &self.shared.parker {
            parker.wake();
        }
        self.shared.report_suppressed_logs();
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || store.flush())
            .await?
            .context("final journal flush")?;
        tracing::info!("journal flushed; bye");
        Ok(())
    }
}

/// Opens the store, recovers, builds the core and binds every listener.
pub async fn start(
    config: Config,
    access: Arc<dyn AccessControl>,
) -> anyhow::Result<RunningBroker> {
    let checked = preflight(&config)?;
    for warning in &checked.warnings {
        tracing::warn!("{warning}");
    }
    // Every connection is a file descriptor.
    fd_limit::raise_to_hard();
    let store_config = store_config(&config);
    let dir = config.data_dir.clone();
    let (store, recovered) = tokio::task::spawn_blocking(move || Store::open(store_config))
        .await?
        .with_context(|| format!("opening the journal in {}", dir.display()))?;
    let store = Arc::new(store);
    let cluster = config
        .cluster
        .as_ref()
        .map(|c| cluster::ClusterNode::new(c, Arc::clone(&access)))
        .transpose()?;
    let core = Core::new(core_config(&config), store.clone(), access, Some(recovered));
    apply_bindings(&core, &config)?;
    let tls = checked.tls.map(tokio_rustls::TlsAcceptor::from);
    let certificate = checked.certificate;
    let (stop_accepting, stop_rx) = watch::channel(false);
    let hard_stop: Arc<driver::HardStop> = Arc::default();
    let parker = parking::Parker::start(Arc::clone(&hard_stop))
        .inspect_err(|e| {
            tracing::warn!(error = %e, "cannot park idle connections out of tokio (epoll)");
        })
        .ok();
    let admission = admission::Admission::new(&config.broker, core.clone());
    let shared = Arc::new(Shared {
        core,
        config: config.clone(),
        adapters: protocols::AdapterConfigs::new(&config),
        next_conn_id: AtomicU64::new(1),
        hard_stop,
        parker,
        tls,
        certificate,
        store: Arc::clone(&store),
        admission,
        refusals: Arc::default(),
        tls_log: log_throttle::LogThrottle::default(),
        connections: Arc::default(),
        started: std::time::Instant::now(),
        cluster,
        rates: rates::RateWindow::default(),
        admin_on_http_port: std::sync::OnceLock::new(),
        listeners: std::sync::OnceLock::new(),
        proxied_out: AtomicUsize::new(0),
        active: AtomicUsize::new(0),
        idle: Notify::new(),
    });
    rates::spawn_sampler(&shared, stop_rx.clone());
    sys_topics::spawn(&shared, stop_rx.clone());
    let mut addrs = Vec::new();
    let mut accept_tasks = Vec::new();
    for (kind, addr) in config.active_listeners() {
        let (bound, task) = listener::spawn(
            kind,
            &addr.to_string(),
            Arc::clone(&shared),
            stop_rx.clone(),
        )
        .await
        .with_context(|| format!("listener '{}' on {addr}", kind.key()))?;
        tracing::info!(listener = kind.key(), addr = %bound, "listening");
        addrs.push((kind, bound));
        accept_tasks.push(task);
    }
    let _ = shared.listeners.set(addrs.clone());
    say_who_can_connect(&config);
    let membership = match (&shared.cluster, &config.cluster) {
        (Some(node), Some(cluster_config)) => {
            // The clients this node serves: least_connections must not see
            // a proxied client on both nodes.
            let counted = Arc::clone(&shared);
            let count = Arc::new(move || {
                let relayed = counted.proxied_out.load(Ordering::Relaxed);
                counted.admission.authenticated().saturating_sub(relayed) as u64
            });
            Some(node.join(cluster_config, &addrs, count)?)
        }
        _ => None,
    };
    Ok(RunningBroker {
        addrs,
        shared,
        store,
        stop_accepting,
        accept_tasks,
        membership,
    })
}

/// One line at start on who can reach the broker: loopback only (and the
/// setting that opens it), or, with anonymous access on, a warning that
/// anyone on the network may do everything.
fn say_who_can_connect(config: &Config) {
    let listeners = config.active_listeners();
    let open: Vec<String> = listeners
        .iter()
        .filter(|(_, addr)| !addr.is_loopback())
        .map(|(kind, addr)| format!("{}={addr}", kind.key()))
        .collect();
    if listeners.is_empty() {
        return;
    }
    if open.is_empty() {
        tracing::info!(
            "listening on loopback only: clients on other machines cannot connect; set [listeners] bind = \"0.0.0.0\" (or a listener's own \"host:port\") to accept them"
        );
    } else if config.security.anonymous {
        tracing::warn!(
            listeners = %open.join(" "),
            "anonymous access is on ([security] anonymous = true) and these listeners are reachable from the network: anyone who can connect may publish and subscribe as [anonymous] permits"
        );
    }
}

/// Runs until SIGINT or SIGTERM, then shuts down gracefully.
pub async fn run(config: Config, access: Arc<dyn AccessControl>) -> anyhow::Result<()> {
    let broker = start(config, access).await?;
    wait_for_signal().await?;
    broker.shutdown().await
}

/// Returns at SIGINT or SIGTERM.
pub async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}

fn store_config(config: &Config) -> StoreConfig {
    let mut sc = StoreConfig::new(config.data_dir.clone());
    sc.sync = match config.store.sync {
        rosetta_config::SyncPolicy::EveryCommit => rosetta_store::SyncPolicy::EveryCommit,
        rosetta_config::SyncPolicy::Periodic => {
            rosetta_store::SyncPolicy::Periodic(config.store.sync_interval())
        }
    };
    sc.segment_size_bytes = config.store.segment_size_bytes;
    sc.compaction_interval = config.store.compaction_interval();
    sc.accept_data_loss = config.store.accept_data_loss;
    sc
}

fn core_config(config: &Config) -> CoreConfig {
    CoreConfig {
        dead_letter_address: config.broker.dead_letter_address.name().to_owned(),
        delivery_attempts_max: config.broker.delivery_attempts_max,
        expiry_address: config
            .broker
            .expiry_address
            .as_ref()
            .map(|a| a.name().to_owned()),
        auto_create_queues: config.broker.auto_create_queues,
        memory_budget_bytes: config.store.memory_budget_bytes,
        paging_dir: Some(config.data_dir.join("paging")),
        queue_depth_max: config.broker.queue_depth_max,
        queues_max: usize::try_from(config.broker.queues_max).unwrap_or(usize::MAX),
        bindings_max: usize::try_from(config.broker.bindings_max).unwrap_or(usize::MAX),
        queue_rules: config.queue_rules(),
        topic_dedup: config.topic_dedup_rules(),
        streams: rosetta_core::stream::StreamsConfig {
            dir: Some(config.data_dir.join("streams")),
            sync: store_config(config).sync,
            rules: config.stream_rules(),
            ..rosetta_core::stream::StreamsConfig::default()
        },
        disk_free_min: (config.store.disk_free_min_bytes > 0).then(|| rosetta_core::DiskFreeMin {
            dir: config.data_dir.clone(),
            bytes: config.store.disk_free_min_bytes,
        }),
    }
}

/// Declares the queues of `[[bindings]]` and binds their filters, so MQTT
/// publishes feed them.
fn apply_bindings(core: &Core, config: &Config) -> anyhow::Result<()> {
    use rosetta_neutral::{Broker, Principal, Protocol, QueueLifetime, QueueSpec, SessionInfo};
    if config.bindings.is_empty() {
        return Ok(());
    }
    let (sink, _rx) = driver::event_channel(None);
    let info = SessionInfo {
        conn_id: 0,
        protocol: Protocol::Internal,
        principal: Principal::anonymous(),
        client_id: None,
        take_over: false,
    };
    let mut session = core.open_session(info, sink);
    for b in &config.bindings {
        let spec = QueueSpec {
            name: Some(b.queue.clone()),
            durable: true,
            lifetime: QueueLifetime::Permanent,
            bindings_max: None,
        };
        session
            .declare_queue(spec)
            .with_context(|| format!("[[bindings]] queue '{}'", b.queue))?;
        let options = rosetta_neutral::BindingOptions::default();
        session
            .bind(&b.queue, &b.filter, options)
            .with_context(|| format!("[[bindings]] filter '{}'", b.filter))?;
    }
    session.close(rosetta_neutral::CloseKind::Clean);
    Ok(())
}

/// Loads the configuration file, or the embedded defaults without one.
pub fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Config::load(p).map_err(|e| anyhow::anyhow!("{e}")),
        None => Ok(Config::default()),
    }
}
