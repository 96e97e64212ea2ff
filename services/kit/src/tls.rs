//! TLS between Plinth's services (rustls, through tonic): a process's own certificate and key,
//! served on its gRPC listener and presented when it calls others, and the CA that signs the
//! others' certificates, by which it verifies servers and, for mutual TLS, its callers.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// One process's TLS material, read once at start.
#[derive(Clone)]
pub struct TlsSettings {
    identity: Option<Identity>,
    ca: Option<Certificate>,
    require_client_cert: bool,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("certificate", &self.identity.is_some())
            .field("ca", &self.ca.is_some())
            .field("require_client_cert", &self.require_client_cert)
            .finish()
    }
}

/// TLS settings that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("reading {what} {path}: {source}")]
    Read {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no PEM block of the kind expected.
    #[error("{what} {path} holds no PEM `{label}` block")]
    NotPem {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The block looked for.
        label: &'static str,
    },
    /// A certificate without its key, or the other way round.
    #[error("`internal.tls.cert` and `internal.tls.key` are given together or not at all")]
    Half,
    /// Client certificates required with no CA to check them by.
    #[error(
        "`internal.tls.require_client_cert` needs `internal.tls.ca`, the CA that signs callers' certificates"
    )]
    ClientCertWithoutCa,
}

impl TlsSettings {
    /// Reads the PEM files: `cert` and `key` (this process's certificate chain and private
    /// key), `ca` (the CA bundle that signs the other services'). `None` when nothing is set.
    pub fn load(
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
        require_client_cert: bool,
    ) -> Result<Option<Self>, TlsError> {
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some(Identity::from_pem(
                read_pem("internal.tls.cert", cert, "CERTIFICATE")?,
                read_pem("internal.tls.key", key, "PRIVATE KEY")?,
            )),
            (None, None) => None,
            _ => return Err(TlsError::Half),
        };
        let ca = ca
            .map(|ca| read_pem("internal.tls.ca", ca, "CERTIFICATE"))
            .transpose()?
            .map(Certificate::from_pem);
        if require_client_cert && ca.is_none() {
            return Err(TlsError::ClientCertWithoutCa);
        }
        if identity.is_none() && ca.is_none() {
            return Ok(None);
        }
        Ok(Some(TlsSettings {
            identity,
            ca,
            require_client_cert,
        }))
    }

    /// The listener's TLS, when this process has a certificate: with `ca`, callers' client
    /// certificates are verified, and required when `require_client_cert`.
    pub fn server(&self) -> Option<ServerTlsConfig> {
        let identity = self.identity.clone()?;
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.ca {
            config = config
                .client_ca_root(ca.clone())
                .client_auth_optional(!self.require_client_cert);
        }
        Some(config)
    }

    /// A channel's TLS, when there is a CA to verify servers by: presenting this process's
    /// certificate, if it has one, for servers that require one.
    pub fn client(&self) -> Option<ClientTlsConfig> {
        let ca = self.ca.clone()?;
        let mut config = ClientTlsConfig::new().ca_certificate(ca);
        if let Some(identity) = &self.identity {
            config = config.identity(identity.clone());
        }
        Some(config)
    }

    /// Whether the listener serves TLS.
    pub fn serves_tls(&self) -> bool {
        self.identity.is_some()
    }
}

fn read_pem(what: &'static str, path: &Path, label: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    // "PRIVATE KEY" also matches "RSA PRIVATE KEY" and "EC PRIVATE KEY" headers.
    let text = String::from_utf8_lossy(&bytes);
    let found = text
        .lines()
        .any(|line| line.starts_with("-----BEGIN ") && line.contains(label));
    if !found {
        return Err(TlsError::NotPem {
            what,
            path: path.to_owned(),
            label,
        });
    }
    Ok(bytes)
}
