//! `[admin]`: the admin HTTP API's listener (issue 18).

use serde::Deserialize;

use crate::ListenAddr;

/// Where the admin API listens by default: loopback, so only operators on
/// this machine reach it until they open it; port 8161, ActiveMQ's (and
/// Artemis') web console port, which operators of a JMS broker already
/// expect and which none of the protocol listeners uses.
pub const ADMIN_LISTEN_DEFAULT: &str = "127.0.0.1:8161";
/// The API is on by default: it authenticates every `/api/v1/` request,
/// and it listens on loopback only.
pub const ADMIN_ENABLED_DEFAULT: bool = true;
/// Host a bare port (`listen = 8161`) binds: loopback, not `[listeners]
/// bind`, so opening the protocol listeners to the network does not open
/// the admin API with them.
pub const ADMIN_BIND_DEFAULT: &str = "127.0.0.1";

/// The API is not served on the HTTP (WebSocket) port by default: that
/// port is usually open to the network, the API's own listener is not.
pub const ADMIN_ON_HTTP_PORT_DEFAULT: bool = false;

/// `[admin]`: the admin HTTP API (`/healthz`, `/readyz`, `/api/v1/...`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// `false` turns the API off, as `listen = ""` does.
    pub enabled: bool,
    /// `host:port` or a port (on loopback); `""`: off.
    #[serde(deserialize_with = "crate::listeners::deserialize_listen_opt")]
    pub listen: Option<ListenAddr>,
    /// Also serve the API, its health checks and the console on the HTTP
    /// port(s): `[listeners] websocket`, `wss` and the `any` port's HTTP.
    pub on_http_port: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            enabled: ADMIN_ENABLED_DEFAULT,
            listen: ADMIN_LISTEN_DEFAULT.parse().ok(),
            on_http_port: ADMIN_ON_HTTP_PORT_DEFAULT,
        }
    }
}

impl AdminConfig {
    /// The address to bind, or `None` when the API is off.
    pub fn listen_addr(&self) -> Option<ListenAddr> {
        if !self.enabled {
            return None;
        }
        self.listen.as_ref().map(|a| a.on(ADMIN_BIND_DEFAULT))
    }

    /// Whether the HTTP port(s) serve the API too (`on_http_port`, unless
    /// the API is off).
    pub fn served_on_http_port(&self) -> bool {
        self.enabled && self.on_http_port
    }

    /// Whether the API is served anywhere.
    pub fn served(&self) -> bool {
        self.listen_addr().is_some() || self.served_on_http_port()
    }
}
