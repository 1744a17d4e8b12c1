//! What the broker checks before it binds a port, as one step: `run`
//! ([`super::start`]) and `rosetta check-config` both call [`preflight`],
//! so a configuration that passes the check starts, and one that would
//! not start fails the check with the same message.
//!
//! Checked: the configuration's own constraints ([`Config::validate`]);
//! the TLS files (read and built into a server configuration); that the
//! data directory is a directory we can write, or can be created; that
//! the users file parses. Not errors, but said: anonymous access off with
//! no user to log in as.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use crate::users::Users;
use rosetta_config::Config;

/// What the checks produced: the TLS configuration to serve with, and
/// warnings for the operator.
pub struct Preflight {
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// The certificate `tls` presents, for reloads.
    pub(crate) certificate: Option<Arc<super::tls::ServerCertificate>>,
    /// Problems that do not stop the start, one sentence each.
    pub warnings: Vec<String>,
}

/// Runs every check; the error names the key or file at fault.
pub fn preflight(config: &Config) -> anyhow::Result<Preflight> {
    config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    check_data_dir(&config.data_dir)
        .with_context(|| format!("`data_dir` = {}", config.data_dir.display()))?;
    let (tls, certificate) = if config.tls.enabled() {
        let (server_config, certificate) =
            super::tls::server_setup(&config.tls).map_err(|e| anyhow::anyhow!("[tls]: {e}"))?;
        (Some(server_config), Some(certificate))
    } else {
        (None, None)
    };
    if let Some(cluster) = &config.cluster {
        // The balancer's regexes are compiled only here: a bad one is a
        // bad configuration, named by its key, before anything starts.
        super::cluster::ClusterNode::new(cluster, Arc::new(rosetta_core::AllowAll))?;
    }
    let users_file = config.users_file();
    let users =
        Users::load(&users_file).with_context(|| format!("users file {}", users_file.display()))?;
    let mut warnings = Vec::new();
    if !config.security.anonymous && users.is_empty() {
        let state = if users_file.exists() {
            "has no users"
        } else {
            "does not exist"
        };
        warnings.push(format!(
            "[security] anonymous = false and the users file {} {state}: no client can log in; add a user with `rosetta user add NAME`",
            users_file.display()
        ));
    }
    for (key, value, need) in config.limits_below_payload() {
        warnings.push(format!(
            "`{key}` = {value} cannot carry a payload of `broker.payload_size_max_bytes` ({} bytes; \
             that needs {need}): such payloads are refused there",
            config.payload_size_max()
        ));
    }
    Ok(Preflight {
        tls,
        certificate,
        warnings,
    })
}

/// The data directory must be a directory we can create files in; when it
/// does not exist yet, its nearest existing ancestor must be one (the
/// journal creates the rest). Probed by creating and removing a file,
/// which is the only test that also holds for root and read-only mounts.
fn check_data_dir(dir: &Path) -> anyhow::Result<()> {
    let mut existing = dir;
    while !existing.exists() {
        match existing.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => existing = parent,
            _ => {
                existing = Path::new(".");
                break;
            }
        }
    }
    anyhow::ensure!(
        existing.is_dir(),
        "{} is not a directory",
        existing.display()
    );
    let probe = existing.join(format!(".rosetta-write-check-{}", std::process::id()));
    std::fs::File::create(&probe)
        .with_context(|| format!("cannot create files in {}", existing.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_must_be_a_writable_directory_or_creatable() {
        let tmp = tempfile::tempdir().expect("tempdir");
        check_data_dir(tmp.path()).expect("existing directory");
        check_data_dir(&tmp.path().join("new/deeper")).expect("creatable");
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        let err = check_data_dir(&file).expect_err("a file");
        assert!(err.to_string().contains("not a directory"), "{err}");
        let err = check_data_dir(&file.join("data")).expect_err("under a file");
        assert!(err.to_string().contains("not a directory"), "{err}");
        assert_eq!(
            std::fs::read_dir(tmp.path()).expect("list").count(),
            1,
            "the probe is removed and nothing is created"
        );
    }
}
