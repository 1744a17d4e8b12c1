//! TLS under every protocol: MQTTS, STOMP+TLS, AMQPS, WSS and TLS on the
//! `any` port.
//!
//! [`server_config`] builds one rustls configuration from `[tls]` at start
//! (a bad file stops the start with an error naming it); [`accept`] runs
//! one handshake per connection, bounded by `tls.handshake_timeout_ms`.
//!
//! Choices, and why:
//! - TLS 1.2 and 1.3 only: older versions have known attacks and no client
//!   we support needs them.
//! - The `ring` provider, passed explicitly rather than installed as the
//!   process default, so no other crate's provider choice can make the
//!   builder panic.
//! - Client certificates (mutual TLS) are verified against
//!   `tls.client_ca_file`; they are optional unless
//!   `tls.require_client_cert`. A verified certificate names its user by
//!   the subject's common name ([`client_identity`]); the protocol adapters
//!   may then skip the password.
//! - No ALPN: every TLS port serves one protocol, and the `any` port
//!   detects the protocol inside TLS from the first bytes.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use rosetta_config::TlsConfig;

use super::log_throttle::LogThrottle;

/// Certificates read from one PEM file at most: a chain or CA bundle is a
/// handful; thousands mean the wrong file was named.
const PEM_CERTIFICATES_MAX: usize = 1000;

/// Why the TLS configuration cannot be built. Each variant names the file
/// (and the `[tls]` key) so the operator knows what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// `tls.cert_file` or `tls.key_file` is not set.
    #[error("`tls.{key}` is not set")]
    NotConfigured {
        /// The missing key.
        key: &'static str,
    },
    /// A PEM file cannot be read or is not valid PEM.
    #[error("`tls.{key}` = {}: {source}", file.display())]
    Pem {
        /// The `[tls]` key naming the file.
        key: &'static str,
        /// The file.
        file: PathBuf,
        /// What went wrong.
        source: rustls::pki_types::pem::Error,
    },
    /// The file holds no item of the wanted kind.
    #[error("`tls.{key}` = {}: no {what} found in the file", file.display())]
    Empty {
        /// The `[tls]` key naming the file.
        key: &'static str,
        /// The file.
        file: PathBuf,
        /// What was expected ("CERTIFICATE", "PRIVATE KEY").
        what: &'static str,
    },
    /// More certificates than [`PEM_CERTIFICATES_MAX`].
    #[error("`tls.{key}` = {}: more than {PEM_CERTIFICATES_MAX} certificates", file.display())]
    TooManyCertificates {
        /// The `[tls]` key naming the file.
        key: &'static str,
        /// The file.
        file: PathBuf,
    },
    /// A CA certificate cannot be used as a trust anchor.
    #[error("`tls.client_ca_file` = {}: {source}", file.display())]
    BadCa {
        /// The file.
        file: PathBuf,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// The client certificate verifier cannot be built from the CAs.
    #[error("`tls.client_ca_file` = {}: {source}", file.display())]
    Verifier {
        /// The file.
        file: PathBuf,
        /// rustls' reason.
        source: rustls::server::VerifierBuilderError,
    },
    /// The certificate and key do not form a usable pair (e.g. the key
    /// does not match the certificate, or its algorithm is unsupported).
    #[error("`tls.cert_file` = {} with `tls.key_file` = {}: {source}", cert.display(), key.display())]
    CertifiedKey {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// The protocol versions are not supported by the provider (cannot
    /// happen with `ring`; kept typed rather than unwrapped).
    #[error("TLS protocol versions: {0}")]
    Versions(rustls::Error),
}

/// Builds the server configuration from `[tls]`: certificate chain and key,
/// TLS 1.2 and 1.3, and client-certificate verification when
/// `tls.client_ca_file` is set (the tests' entry; the broker uses
/// [`server_setup`]).
#[cfg(test)]
pub(crate) fn server_config(tls: &TlsConfig) -> Result<Arc<ServerConfig>, TlsSetupError> {
    server_setup(tls).map(|(config, _)| config)
}

/// [`server_config`], with the handle that reloads its certificate.
pub(crate) fn server_setup(
    tls: &TlsConfig,
) -> Result<(Arc<ServerConfig>, Arc<ServerCertificate>), TlsSetupError> {
    let cert_file = tls
        .cert_file
        .as_deref()
        .ok_or(TlsSetupError::NotConfigured { key: "cert_file" })?;
    let key_file = tls
        .key_file
        .as_deref()
        .ok_or(TlsSetupError::NotConfigured { key: "key_file" })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certificate = Arc::new(ServerCertificate {
        cert_file: cert_file.to_owned(),
        key_file: key_file.to_owned(),
        current: parking_lot::RwLock::new(Arc::new(certified_key(cert_file, key_file, &provider)?)),
        provider: Arc::clone(&provider),
    });
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsSetupError::Versions)?;
    let builder = match &tls.client_ca_file {
        Some(ca_file) => builder.with_client_cert_verifier(client_verifier(
            ca_file,
            tls.require_client_cert,
            provider,
        )?),
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_cert_resolver(Arc::clone(&certificate) as _);
    Ok((Arc::new(config), certificate))
}

/// The certificate chain and key of `[tls]`, checked to belong together.
fn certified_key(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsSetupError> {
    let chain = load_certificates("cert_file", cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|source| match source {
        rustls::pki_types::pem::Error::NoItemsFound => TlsSetupError::Empty {
            key: "key_file",
            file: key_file.to_owned(),
            what: "PRIVATE KEY (PKCS#8, PKCS#1 or SEC1)",
        },
        source => TlsSetupError::Pem {
            key: "key_file",
            file: key_file.to_owned(),
            source,
        },
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|source| TlsSetupError::CertifiedKey {
        cert: cert_file.to_owned(),
        key: key_file.to_owned(),
        source,
    })
}

/// The certificate the TLS listeners present: every handshake asks it,
/// so a [`ServerCertificate::reload`] counts for every new connection
/// from then on (open ones keep the one they were made with), on every
/// TLS listener at once, without a restart.
#[derive(Debug)]
pub struct ServerCertificate {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: parking_lot::RwLock<Arc<CertifiedKey>>,
}

impl ServerCertificate {
    /// Reads `tls.cert_file` and `tls.key_file` again and puts them in
    /// force; files that do not load, or do not belong together, are
    /// refused with the error and the certificate in force stays.
    pub fn reload(&self) -> Result<(), TlsSetupError> {
        let fresh = certified_key(&self.cert_file, &self.key_file, &self.provider)?;
        *self.current.write() = Arc::new(fresh);
        tracing::info!(cert_file = %self.cert_file.display(), "TLS certificate reloaded");
        Ok(())
    }
}

impl rustls::server::ResolvesServerCert for ServerCertificate {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.read()))
    }
}

fn client_verifier(
    ca_file: &Path,
    required: bool,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for ca in load_certificates("client_ca_file", ca_file)? {
        roots.add(ca).map_err(|source| TlsSetupError::BadCa {
            file: ca_file.to_owned(),
            source,
        })?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = if required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder.build().map_err(|source| TlsSetupError::Verifier {
        file: ca_file.to_owned(),
        source,
    })
}

fn load_certificates(
    key: &'static str,
    file: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let pem_error = |source| TlsSetupError::Pem {
        key,
        file: file.to_owned(),
        source,
    };
    let mut certs = Vec::new();
    for cert in CertificateDer::pem_file_iter(file).map_err(pem_error)? {
        if certs.len() == PEM_CERTIFICATES_MAX {
            return Err(TlsSetupError::TooManyCertificates {
                key,
                file: file.to_owned(),
            });
        }
        certs.push(cert.map_err(pem_error)?);
    }
    if certs.is_empty() {
        return Err(TlsSetupError::Empty {
            key,
            file: file.to_owned(),
            what: "CERTIFICATE",
        });
    }
    Ok(certs)
}

/// The handshake timeout of `[tls]`.
pub(crate) fn handshake_timeout(tls: &TlsConfig) -> Duration {
    Duration::from_millis(tls.handshake_timeout_ms)
}

/// Runs the server side of a TLS handshake on `io`, within `timeout`.
///
/// Returns the TLS stream and, when the client presented a certificate
/// (verified by rustls against `tls.client_ca_file`), the user it names
/// (see [`client_identity`]). A failed handshake (no client certificate
/// when one is required, an unknown CA, an old protocol version,
/// plaintext on a TLS port) is logged at warn, a timed-out one at info,
/// with the peer and the reason, through `log` so that a storm of them
/// cannot flood the log (each line says how many were left out before
/// it). The error is returned; the caller just drops the connection,
/// which affects no other.
pub(crate) async fn accept<S>(
    acceptor: &TlsAcceptor,
    io: S,
    peer: SocketAddr,
    timeout: Duration,
    log: &LogThrottle,
) -> io::Result<(TlsStream<S>, Option<String>)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let stream = match tokio::time::timeout(timeout, acceptor.accept(io)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            if let Some(suppressed) = log.admit(std::time::Instant::now()) {
                tracing::warn!(%peer, reason = %e, suppressed, "TLS handshake failed");
            }
            return Err(e);
        }
        Err(_) => {
            if let Some(suppressed) = log.admit(std::time::Instant::now()) {
                tracing::info!(%peer, timeout_ms = timeout.as_millis(), suppressed, "TLS handshake timed out");
            }
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            ));
        }
    };
    let identity = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(client_identity);
    tracing::debug!(%peer, identity = identity.as_deref(), "TLS handshake done");
    Ok((stream, identity))
}

/// The host name a TLS client asked for (SNI), if it sent one.
pub(crate) fn sni_host<S>(stream: &TlsStream<S>) -> Option<String> {
    stream.get_ref().1.server_name().map(str::to_owned)
}

/// The user a (verified) client certificate names: the subject's first
/// common name, or the whole subject (RFC 4514 style) when it has no CN.
/// `None` when the certificate cannot be parsed, which rustls' verification
/// makes unlikely.
pub(crate) fn client_identity(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    if let Some(cn) = subject.iter_common_name().next() {
        if let Ok(cn) = cn.as_str() {
            return Some(cn.to_owned());
        }
    }
    let whole = subject.to_string();
    (!whole.is_empty()).then_some(whole)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio_rustls::TlsConnector;

    /// A CA, a server certificate for `localhost`/127.0.0.1 and a client
    /// certificate for `alice`, as PEM files in a temporary directory.
    pub(crate) struct TestPki {
        pub(crate) dir: tempfile::TempDir,
        pub(crate) ca_pem: String,
        pub(crate) client_cert_pem: String,
        pub(crate) client_key_pem: String,
    }

    impl TestPki {
        pub(crate) fn new() -> Self {
            let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
            ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            ca_params
                .distinguished_name
                .push(DnType::CommonName, "Rosetta test CA");
            ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key"))
                .expect("ca cert");

            let mut server_params =
                CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                    .expect("server params");
            server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            let server_key = KeyPair::generate().expect("server key");
            let server_cert = server_params
                .signed_by(&server_key, &ca)
                .expect("server cert");

            let mut client_params = CertificateParams::new(Vec::<String>::new()).expect("params");
            client_params
                .distinguished_name
                .push(DnType::CommonName, "alice");
            client_params
                .distinguished_name
                .push(DnType::OrganizationName, "Rosetta tests");
            client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let client_key = KeyPair::generate().expect("client key");
            let client_cert = client_params
                .signed_by(&client_key, &ca)
                .expect("client cert");

            let dir = tempfile::tempdir().expect("temp dir");
            let write = |name: &str, text: &str| {
                std::fs::write(dir.path().join(name), text).expect("write pem");
            };
            write("ca.pem", &ca.pem());
            write("server.pem", &server_cert.pem());
            write("server.key", &server_key.serialize_pem());
            Self {
                dir,
                ca_pem: ca.pem(),
                client_cert_pem: client_cert.pem(),
                client_key_pem: client_key.serialize_pem(),
            }
        }

        pub(crate) fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        /// `[tls]` with this PKI's server certificate; client CA when `mtls`.
        pub(crate) fn config(&self, mtls: Option<bool>) -> TlsConfig {
            TlsConfig {
                cert_file: Some(self.path("server.pem")),
                key_file: Some(self.path("server.key")),
                client_ca_file: mtls.map(|_| self.path("ca.pem")),
                require_client_cert: mtls.unwrap_or(false),
                ..TlsConfig::default()
            }
        }

        /// A client trusting the CA, with alice's certificate when
        /// `with_cert`, limited to `versions`.
        pub(crate) fn connector(
            &self,
            with_cert: bool,
            versions: &[&'static rustls::SupportedProtocolVersion],
        ) -> TlsConnector {
            let mut roots = RootCertStore::empty();
            let ca = CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).expect("ca der");
            roots.add(ca).expect("root");
            let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_protocol_versions(versions)
            .expect("versions")
            .with_root_certificates(roots);
            let config = if with_cert {
                let cert = CertificateDer::from_pem_slice(self.client_cert_pem.as_bytes())
                    .expect("client der");
                let key =
                    PrivateKeyDer::from_pem_slice(self.client_key_pem.as_bytes()).expect("key");
                builder
                    .with_client_auth_cert(vec![cert], key)
                    .expect("client auth")
            } else {
                builder.with_no_client_auth()
            };
            TlsConnector::from(Arc::new(config))
        }
    }

    const TEST_TIMEOUT: Duration = Duration::from_secs(5);

    type ServerResult = io::Result<(TlsStream<TcpStream>, Option<String>)>;

    /// Binds 127.0.0.1, accepts one connection with `config`, and hands the
    /// handshake result back.
    async fn one_server(
        config: Arc<ServerConfig>,
    ) -> (SocketAddr, tokio::task::JoinHandle<ServerResult>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let (tcp, peer) = listener.accept().await?;
            let log = LogThrottle::default();
            accept(&TlsAcceptor::from(config), tcp, peer, TEST_TIMEOUT, &log).await
        });
        (addr, task)
    }

    fn localhost() -> ServerName<'static> {
        ServerName::try_from("localhost").expect("name")
    }

    #[tokio::test]
    async fn handshake_tls13_and_tls12_and_data() {
        let pki = TestPki::new();
        let config = server_config(&pki.config(None)).expect("server config");
        for (version, expect) in [
            (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
            (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
        ] {
            let (addr, server) = one_server(Arc::clone(&config)).await;
            let tcp = TcpStream::connect(addr).await.expect("connect");
            let mut client = pki
                .connector(false, &[version])
                .connect(localhost(), tcp)
                .await
                .expect("client handshake");
            assert_eq!(client.get_ref().1.protocol_version(), Some(expect));
            let (mut server, identity) = server.await.expect("join").expect("server handshake");
            assert_eq!(identity, None);
            client.write_all(b"ping").await.expect("write");
            client.flush().await.expect("flush");
            let mut buf = [0u8; 4];
            server.read_exact(&mut buf).await.expect("read");
            assert_eq!(&buf, b"ping");
        }
    }

    #[tokio::test]
    async fn mutual_tls_names_the_user_by_common_name() {
        let pki = TestPki::new();
        let config = server_config(&pki.config(Some(true))).expect("server config");
        let (addr, server) = one_server(config).await;
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let _client = pki
            .connector(true, &[&rustls::version::TLS13])
            .connect(localhost(), tcp)
            .await
            .expect("client handshake");
        let (_server, identity) = server.await.expect("join").expect("server handshake");
        assert_eq!(identity.as_deref(), Some("alice"));
    }

    #[tokio::test]
    async fn required_client_cert_refuses_a_client_without_one() {
        let pki = TestPki::new();
        let config = server_config(&pki.config(Some(true))).expect("server config");
        let (addr, server) = one_server(config).await;
        let tcp = TcpStream::connect(addr).await.expect("connect");
        // TLS 1.3 clients finish before the server checks their (missing)
        // certificate; the server side must fail.
        let _ = pki
            .connector(false, &[&rustls::version::TLS13])
            .connect(localhost(), tcp)
            .await;
        let result = server.await.expect("join");
        assert!(
            result.is_err(),
            "server accepted a client without a certificate"
        );
    }

    #[tokio::test]
    async fn optional_client_cert_accepts_anonymous_and_certified() {
        let pki = TestPki::new();
        let config = server_config(&pki.config(Some(false))).expect("server config");
        for (with_cert, expect) in [(false, None), (true, Some("alice"))] {
            let (addr, server) = one_server(Arc::clone(&config)).await;
            let tcp = TcpStream::connect(addr).await.expect("connect");
            let _client = pki
                .connector(with_cert, &[&rustls::version::TLS12])
                .connect(localhost(), tcp)
                .await
                .expect("client handshake");
            let (_server, identity) = server.await.expect("join").expect("server handshake");
            assert_eq!(identity.as_deref(), expect);
        }
    }

    /// Sends `bytes` as a client, then expects the server handshake to fail
    /// and the connection to be closed (possibly after a TLS alert).
    async fn refused(bytes: &[u8]) {
        let pki = TestPki::new();
        let config = server_config(&pki.config(None)).expect("server config");
        let (addr, server) = one_server(config).await;
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(bytes).await.expect("write");
        let result = tokio::time::timeout(TEST_TIMEOUT, server)
            .await
            .expect("server gave up in time")
            .expect("join");
        assert!(result.is_err(), "handshake of garbage succeeded");
        let mut rest = Vec::new();
        let read = tokio::time::timeout(TEST_TIMEOUT, tcp.read_to_end(&mut rest))
            .await
            .expect("closed in time");
        // Either a clean EOF (maybe after an alert record) or a reset.
        if read.is_ok() && !rest.is_empty() {
            assert_eq!(rest.first(), Some(&0x15), "expected a TLS alert record");
        }
    }

    #[tokio::test]
    async fn garbage_client_hello_is_refused() {
        // A handshake record header followed by a body that is no ClientHello.
        let mut hello = vec![0x16, 0x03, 0x01, 0x00, 0x20];
        hello.extend_from_slice(&[0xAB; 32]);
        refused(&hello).await;
    }

    #[tokio::test]
    async fn plain_text_client_is_refused() {
        refused(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0").await;
    }

    #[tokio::test]
    async fn silent_client_times_out() {
        let pki = TestPki::new();
        let config = server_config(&pki.config(None)).expect("server config");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _client = TcpStream::connect(addr).await.expect("connect");
        let (tcp, peer) = listener.accept().await.expect("accept");
        let err = accept(
            &TlsAcceptor::from(config),
            tcp,
            peer,
            Duration::from_millis(50),
            &LogThrottle::default(),
        )
        .await
        .expect_err("timed out");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn setup_errors_name_the_file() {
        let pki = TestPki::new();
        let missing = pki.path("nope.pem");
        let mut config = pki.config(None);
        config.cert_file = Some(missing.clone());
        let err = server_config(&config).expect_err("missing cert file");
        assert!(matches!(
            err,
            TlsSetupError::Pem {
                key: "cert_file",
                ..
            }
        ));
        assert!(err.to_string().contains("nope.pem"), "{err}");

        // A key file that holds only a certificate.
        let mut config = pki.config(None);
        config.key_file = Some(pki.path("ca.pem"));
        let err = server_config(&config).expect_err("no key");
        assert!(
            matches!(
                err,
                TlsSetupError::Empty {
                    key: "key_file",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("ca.pem"), "{err}");

        // A certificate file without certificates.
        let mut config = pki.config(None);
        config.cert_file = Some(pki.path("server.key"));
        let err = server_config(&config).expect_err("no cert");
        assert!(
            matches!(
                err,
                TlsSetupError::Empty {
                    key: "cert_file",
                    ..
                }
            ),
            "{err}"
        );

        // A key that does not belong to the certificate.
        let other = KeyPair::generate().expect("key");
        std::fs::write(pki.path("other.key"), other.serialize_pem()).expect("write");
        let mut config = pki.config(None);
        config.key_file = Some(pki.path("other.key"));
        let err = server_config(&config).expect_err("mismatched key");
        assert!(matches!(err, TlsSetupError::CertifiedKey { .. }), "{err}");

        let config = TlsConfig::default();
        let err = server_config(&config).expect_err("not configured");
        assert!(matches!(
            err,
            TlsSetupError::NotConfigured { key: "cert_file" }
        ));
    }

    #[test]
    fn identity_falls_back_to_the_whole_subject() {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Acme");
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(client_identity(cert.der()).as_deref(), Some("O=Acme"));
    }
}
