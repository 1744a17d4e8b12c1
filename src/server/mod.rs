//! The server: the only part of Rosetta that does IO.
//!
//! It opens the journal, builds the core, binds the listeners, runs one task
//! per connection (see [`driver`]), and shuts down in phases:
//!
//! 1. stop accepting;
//! 2. tell every client (MQTT 5 DISCONNECT 0x8B, STOMP ERROR, AMQP close)
//!    through [`Core::shutdown`];
//! 3. let connections drain for up to [`SHUTDOWN_GRACE`];
//! 4. flush and sync the journal;
//! 5. return, and the process exits 0.

mod detect;
mod driver;
/// For the cargo-fuzz targets in `fuzz/` only.
#[doc(hidden)]
pub mod fuzzing;
mod listener;
mod metrics;
mod protocols;
mod tls;
mod ws;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{watch, Notify};

use crate::config::{Config, ListenerKind};
use crate::core::{AccessControl, Core, CoreConfig};
use crate::store::{Store, StoreConfig};

/// How long connections get to say goodbye at shutdown before they are cut.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// State every connection task shares.
pub(crate) struct Shared {
    pub(crate) core: Core,
    pub(crate) config: Config,
    next_conn_id: AtomicU64,
    /// Becomes true when connections must stop now (end of the grace period).
    pub(crate) hard_stop: watch::Receiver<bool>,
    /// The TLS acceptor, when `[tls]` names a certificate and key.
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// The journal, for its counters.
    pub(crate) store: Arc<Store>,
    active: AtomicUsize,
    idle: Notify,
}

impl Shared {
    /// The Prometheus exposition of this broker, now.
    pub(crate) fn metrics(&self) -> String {
        let figures = metrics::BrokerFigures {
            connections: self.active.load(Ordering::Relaxed),
            memory_budget_bytes: self.config.store.memory_budget_bytes,
            store: self.store.stats(),
        };
        metrics::render(&self.core, &figures)
    }

    pub(crate) fn next_conn_id(&self) -> u64 {
        self.next_conn_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Connection tasks open now (those counted by [`Shared::track`]).
    pub(crate) fn active_connections(&self) -> usize {
        self.active.load(Ordering::SeqCst)
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
    hard_stop: watch::Sender<bool>,
    accept_tasks: Vec<tokio::task::JoinHandle<()>>,
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

    /// Shuts down in phases; see the module docs.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        tracing::info!("shutting down: no new connections");
        let _ = self.stop_accepting.send(true);
        for t in self.accept_tasks {
            let _ = t.await;
        }
        self.shared.core.shutdown();
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
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
                "grace period over; cutting remaining connections"
            );
        }
        let _ = self.hard_stop.send(true);
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
    config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let store_config = store_config(&config);
    let dir = config.data_dir.clone();
    let (store, recovered) = tokio::task::spawn_blocking(move || Store::open(store_config))
        .await?
        .with_context(|| format!("opening the journal in {}", dir.display()))?;
    let store = Arc::new(store);
    let core = Core::new(core_config(&config), store.clone(), access, Some(recovered));
    apply_bindings(&core, &config)?;
    let tls = if config.tls.enabled() {
        let server_config =
            tls::server_config(&config.tls).map_err(|e| anyhow::anyhow!("[tls]: {e}"))?;
        Some(tokio_rustls::TlsAcceptor::from(server_config))
    } else {
        None
    };
    let (stop_accepting, stop_rx) = watch::channel(false);
    let (hard_stop, hard_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        core,
        config: config.clone(),
        next_conn_id: AtomicU64::new(1),
        hard_stop: hard_rx,
        tls,
        store: Arc::clone(&store),
        active: AtomicUsize::new(0),
        idle: Notify::new(),
    });
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
    Ok(RunningBroker {
        addrs,
        shared,
        store,
        stop_accepting,
        hard_stop,
        accept_tasks,
    })
}

/// Runs until SIGINT or SIGTERM, then shuts down gracefully.
pub async fn run(config: Config, access: Arc<dyn AccessControl>) -> anyhow::Result<()> {
    let broker = start(config, access).await?;
    wait_for_signal().await?;
    broker.shutdown().await
}

async fn wait_for_signal() -> anyhow::Result<()> {
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
        crate::config::SyncPolicy::EveryCommit => crate::store::SyncPolicy::EveryCommit,
        crate::config::SyncPolicy::Periodic => {
            crate::store::SyncPolicy::Periodic(config.store.sync_interval())
        }
    };
    sc.segment_size_bytes = config.store.segment_size_bytes;
    sc.compaction_interval = config.store.compaction_interval();
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
        disk_free_min: (config.store.disk_free_min_bytes > 0).then(|| crate::core::DiskFreeMin {
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
    let (sink, _rx) = driver::event_channel();
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
