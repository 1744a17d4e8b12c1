//! What the admin API (`rosetta-admin`) sees of a running broker: the
//! core, the configuration, the broker-wide figures, the live connections
//! and whether it is ready. A handle, cheap to clone.

use std::sync::Arc;
use std::time::Duration;

use rosetta_config::Config;
use rosetta_core::Core;
use tokio::sync::watch;

use super::connections::Registry;
use super::{BrokerFigures, Shared};

/// A running broker, as the admin API sees it.
#[derive(Clone)]
pub struct BrokerView {
    shared: Arc<Shared>,
    /// Turns true when the shutdown begins (no more accepting).
    stopping: watch::Receiver<bool>,
}

impl BrokerView {
    pub(crate) fn new(shared: Arc<Shared>, stopping: watch::Receiver<bool>) -> Self {
        Self { shared, stopping }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The core: queues, sessions.
    pub fn core(&self) -> &Core {
        &self.shared.core
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The live protocol connections.
    pub fn connections(&self) -> &Registry {
        &self.shared.connections
    }

    /// Connection counts, memory budget and the journal's counters, now.
    pub fn figures(&self) -> BrokerFigures {
        self.shared.figures()
    }

    /// Message rates and journal sync latency over the last seconds.
    pub fn recent_activity(&self) -> super::RecentActivity {
        self.shared.rates.recent()
    }

    /// Hands the admin API's paths on the HTTP port to `admin` (`[admin]
    /// on_http_port`); until then such a request is answered 503. A second
    /// call changes nothing.
    pub fn serve_admin_on_http_port(&self, admin: Arc<dyn super::AdminOnHttpPort>) {
        let _ = self.shared.admin_on_http_port.set(admin);
    }

    /// Each protocol listener's kind and bound address.
    pub fn listeners(&self) -> &[(rosetta_config::ListenerKind, std::net::SocketAddr)] {
        self.shared.listeners.get().map_or(&[], Vec::as_slice)
    }

    /// Time since the broker started.
    pub fn uptime(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Reads the TLS certificate and key files again for every new TLS
    /// handshake from now on; `Ok(false)` when no TLS is configured. A
    /// file that does not load is refused and the certificate in force
    /// stays.
    pub fn reload_tls(&self) -> Result<bool, super::tls::TlsSetupError> {
        match &self.shared.certificate {
            None => Ok(false),
            Some(certificate) => certificate.reload().map(|()| true),
        }
    }

    /// Recovered and listening, and not shutting down: a view exists only
    /// once [`crate::start`] has recovered the journal and bound every
    /// listener, so this is false only once the shutdown has begun.
    pub fn ready(&self) -> bool {
        !*self.stopping.borrow()
    }
}
