//! The load tool's TLS client: trusts one CA file (the broker's test
//! certificate authority) and never resumes a session, so every connection
//! of a churn run costs the broker a full handshake and the rate it reports
//! is the broker's handshake rate.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// A connector and the name the broker's certificate must carry.
#[derive(Clone)]
pub(crate) struct TlsClient {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Trusts the certificates in the PEM file `ca` and checks that the
    /// broker's certificate names `server_name`.
    pub(crate) fn new(ca: &Path, server_name: &str) -> anyhow::Result<Self> {
        let server_name = ServerName::try_from(server_name.to_owned())
            .with_context(|| format!("server name {server_name:?}"))?;
        Ok(Self {
            connector: TlsConnector::from(client_config(ca)?),
            server_name,
        })
    }

    /// The client side of a handshake over `tcp`.
    pub(crate) async fn handshake(&self, tcp: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        self.connector.connect(self.server_name.clone(), tcp).await
    }
}

/// A client configuration trusting the certificates in the PEM file `ca`,
/// on the ring provider, that never resumes a session (also what rumqttc
/// is given for `--transport tls`).
pub(crate) fn client_config(ca: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))?
    {
        let cert = cert.with_context(|| format!("a certificate in {}", ca.display()))?;
        roots.add(cert).context("adding a CA certificate")?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // A full handshake per connection: that is what a churn run
    // measures.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}
