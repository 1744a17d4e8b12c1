//! A throw-away PKI for the TLS tests: a CA, a server certificate for
//! `localhost`/`127.0.0.1` and client certificates, all generated with rcgen
//! into a directory, plus rustls client configurations (ring provider) that
//! trust the CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The generated files and what a client needs to trust them.
pub struct Pki {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    /// Writes `ca.pem`, `server.pem` and `server.key` into `dir`.
    pub fn generate(dir: &Path) -> Pki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Rosetta test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key"))
            .expect("self-signed CA");
        let server_params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server params");
        let server_key = KeyPair::generate().expect("server key");
        let server = server_params
            .signed_by(&server_key, &ca)
            .expect("server certificate");
        let pki = Pki {
            cert_file: dir.join("server.pem"),
            key_file: dir.join("server.key"),
            ca_file: dir.join("ca.pem"),
            ca,
        };
        std::fs::write(&pki.cert_file, server.pem()).expect("write server.pem");
        std::fs::write(&pki.key_file, server_key.serialize_pem()).expect("write server.key");
        std::fs::write(&pki.ca_file, pki.ca.pem()).expect("write ca.pem");
        pki
    }

    /// The `[tls]` section serving these files (`client_ca` for mutual TLS).
    pub fn tls_config(&self, client_ca: bool) -> rosetta::config::TlsConfig {
        rosetta::config::TlsConfig {
            cert_file: Some(self.cert_file.clone()),
            key_file: Some(self.key_file.clone()),
            client_ca_file: client_ca.then(|| self.ca_file.clone()),
            ..rosetta::config::TlsConfig::default()
        }
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        let ca = CertificateDer::from_pem_slice(self.ca.pem().as_bytes()).expect("ca pem");
        roots.add(ca).expect("add CA");
        roots
    }

    fn builder() -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier> {
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
    }

    /// A client configuration trusting the CA, without a client certificate.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        Arc::new(
            Self::builder()
                .with_root_certificates(self.roots())
                .with_no_client_auth(),
        )
    }

    /// A client configuration presenting a certificate whose subject common
    /// name is `user`, signed by the CA.
    pub fn client_config_as(&self, user: &str) -> Arc<rustls::ClientConfig> {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, user);
        let key = KeyPair::generate().expect("client key");
        let cert = params
            .signed_by(&key, &self.ca)
            .expect("client certificate");
        let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key pem");
        Arc::new(
            Self::builder()
                .with_root_certificates(self.roots())
                .with_client_auth_cert(vec![cert.der().clone()], key)
                .expect("client auth"),
        )
    }

    /// A connector trusting the CA.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.client_config())
    }
}

/// The name the server certificate is issued for.
pub fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost").expect("server name")
}
