//! `[tls]` and `[websocket]`: the transports under the protocols.

use std::path::PathBuf;

use serde::Deserialize;

/// How long a TLS handshake may take: long enough for a slow mobile link,
/// short enough that half-open handshakes cannot pile up.
pub const TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// Client certificates are optional, so password clients can use the TLS
/// ports too.
pub const REQUIRE_CLIENT_CERT_DEFAULT: bool = false;

/// What a WebSocket message may hold beyond one maximal protocol frame when
/// its limit is derived: room for small packets a client batches with it.
pub const WEBSOCKET_BATCH_HEADROOM_BYTES: usize = 64 * 1024;
/// Smallest allowed `websocket.message_size_max_bytes`: below this not even
/// a CONNECT with credentials fits.
pub const WEBSOCKET_MESSAGE_SIZE_MIN_BYTES: usize = 1024;

/// `[tls]`: certificate and key for the TLS listeners (MQTTS, STOMP+TLS,
/// AMQPS, WSS, and TLS on the `any` port).
///
/// TLS is on when both `cert_file` and `key_file` are set; the TLS
/// listeners stay off otherwise. Paths are PEM files, relative to the
/// working directory. Only TLS 1.2 and 1.3 are offered.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Server certificate chain (PEM), leaf first.
    pub cert_file: Option<PathBuf>,
    /// Private key of the certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// CA certificates (PEM) that client certificates are verified against.
    /// When set, a client may present a certificate, and a verified one
    /// stands in for a password: the user is named by the certificate
    /// subject's common name.
    pub client_ca_file: Option<PathBuf>,
    /// Refuse TLS clients without a verified certificate (mutual TLS).
    pub require_client_cert: bool,
    /// Time allowed for the handshake, in milliseconds.
    pub handshake_timeout_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            require_client_cert: REQUIRE_CLIENT_CERT_DEFAULT,
            handshake_timeout_ms: TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT,
        }
    }
}

impl TlsConfig {
    /// True when a certificate and key are configured, so the TLS
    /// listeners run.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() && self.key_file.is_some()
    }
}

/// `[websocket]`: the HTTP listener's WebSocket settings (also used by
/// `wss`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebSocketConfig {
    /// Origins (`scheme://host[:port]`, compared exactly, case-insensitive)
    /// allowed to open a WebSocket. Empty = any origin, so the demo page
    /// works on a first run; set it for a broker reachable from the
    /// internet, since browsers let any site connect otherwise.
    pub allowed_origins: Vec<String>,
    /// Largest WebSocket message, in bytes (after reassembly of fragments).
    /// Unset (the default): the largest frame any protocol accepts, so a
    /// payload that fits over TCP fits over WebSocket.
    pub message_size_max_bytes: Option<usize>,
    /// Serve Prometheus metrics at `GET /metrics` on the HTTP port (queue
    /// names included, which name MQTT client ids: turn it off on a port
    /// reachable from the internet).
    pub metrics: bool,
}

impl Default for WebSocketConfig {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            message_size_max_bytes: None,
            metrics: true,
        }
    }
}

impl WebSocketConfig {
    /// Whether a browser `Origin` header value may connect. A request
    /// without an `Origin` (a non-browser client) is always allowed: the
    /// check exists to stop other web sites, not programs.
    pub fn origin_allowed(&self, origin: Option<&str>) -> bool {
        match origin {
            None => true,
            Some(_) if self.allowed_origins.is_empty() => true,
            Some(o) => self
                .allowed_origins
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(o)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        let mut ws = WebSocketConfig::default();
        assert!(ws.origin_allowed(Some("http://evil.example")));
        ws.allowed_origins = vec!["https://app.example.com".into()];
        assert!(ws.origin_allowed(Some("HTTPS://app.example.com")));
        assert!(!ws.origin_allowed(Some("https://app.example.com.evil")));
        assert!(ws.origin_allowed(None));
    }

    #[test]
    fn tls_needs_both_files() {
        let mut tls = TlsConfig::default();
        assert!(!tls.enabled());
        tls.cert_file = Some("c.pem".into());
        assert!(!tls.enabled());
        tls.key_file = Some("k.pem".into());
        assert!(tls.enabled());
    }
}
