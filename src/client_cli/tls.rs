//! TLS for `mqtts://`, `stomps://`, `amqps://` and `wss://`: rustls with
//! ring (the provider the broker uses), trusting `--ca FILE` (PEM) when
//! given, else the system's CA certificates.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};

/// The client configuration; `ca`: the only CA certificates trusted.
pub(crate) fn client_config(ca: Option<&Path>) -> anyhow::Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("reading --ca {}", path.display()))?
            {
                let cert = cert.with_context(|| format!("parsing --ca {}", path.display()))?;
                roots
                    .add(cert)
                    .with_context(|| format!("a certificate of --ca {}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // One unusable system certificate should not stop the rest.
                let _ = roots.add(cert);
            }
        }
    }
    if roots.is_empty() {
        bail!("no CA certificate to trust: pass --ca FILE (PEM)");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// `stream` wrapped in TLS to `host`, whose certificate must name it.
pub(crate) async fn connect<S>(
    config: Arc<ClientConfig>,
    host: &str,
    stream: S,
) -> anyhow::Result<tokio_rustls::client::TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = ServerName::try_from(host.to_owned())
        .with_context(|| format!("'{host}' is not a TLS server name"))?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await
        .with_context(|| format!("TLS handshake with {host}"))
}
