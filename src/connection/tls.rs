//! TLS beyond a `rediss://` URL: the CA a client trusts instead of the
//! system's, and a client certificate for servers that ask for one
//! (`tls-auth-clients yes`). peerq's `tls` cargo feature builds redis-rs
//! with rustls and its `ring` provider (no C toolchain beyond what `ring`
//! builds itself; about 10 s more to a clean build).

use std::path::PathBuf;

use deadpool_redis::Pool;

use crate::error::{Error, Result};

/// TLS settings for a `rediss://` Redis ([`Redis::tls`](super::Redis::tls)):
/// the CA to trust (default: the system's certificate store) and, for
/// servers that require one, a client certificate. Needs peerq's `tls`
/// cargo feature.
///
/// ```no_run
/// # async fn f() -> peerq::Result<()> {
/// let tls = peerq::Tls::new()
///     .ca_file("/etc/redis/ca.pem")
///     .client_cert("/etc/peerq/client.pem", "/etc/peerq/client.key");
/// let redis = peerq::Redis::url("rediss://app:secret@redis.internal:6380/").tls(tls);
/// let producer = peerq::Producer::connect(redis, "mail-sender").await?;
/// # let _ = producer; Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    ca_file: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
}

impl Tls {
    /// The system's certificate store, no client certificate.
    pub fn new() -> Self {
        Tls::default()
    }

    /// Trust the CA certificates in this PEM file (a bundle may hold
    /// several) instead of the system's store.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Present this certificate (PEM) with its private key (PEM: PKCS#8,
    /// PKCS#1 or SEC1) to servers that ask for one.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }
}

/// The files, for clients other than redis-rs (etcd's).
#[cfg(feature = "etcd")]
impl Tls {
    /// The CA file to trust, if not the system's store.
    pub(crate) fn ca(&self) -> Option<&std::path::Path> {
        self.ca_file.as_deref()
    }

    /// The client certificate and key files, if any.
    pub(crate) fn client_cert_files(&self) -> Option<(&std::path::Path, &std::path::Path)> {
        self.client_cert
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()))
    }
}

#[cfg(feature = "tls")]
mod enabled {
    use std::path::Path;

    use super::*;
    use deadpool_redis::redis::{self, ClientTlsConfig, IntoConnectionInfo, TlsCertificates};

    impl Tls {
        /// The files' contents, for redis-rs. A file that cannot be read
        /// is an invalid `tls` setting naming it.
        pub(crate) fn certificates(&self) -> Result<TlsCertificates> {
            let root_cert = self.ca_file.as_deref().map(read).transpose()?;
            let client_tls = match &self.client_cert {
                Some((cert, key)) => Some(ClientTlsConfig {
                    client_cert: read(cert)?,
                    client_key: read(key)?,
                }),
                None => None,
            };
            Ok(TlsCertificates {
                client_tls,
                root_cert,
            })
        }
    }

    /// A client for `info` that trusts and presents what `tls` says.
    pub(crate) fn client(info: impl IntoConnectionInfo, tls: &Tls) -> Result<redis::Client> {
        redis::Client::build_with_tls(info, tls.certificates()?)
            .map_err(|e| Error::invalid("tls", e.to_string()))
    }

    /// A pool for the server at `url` with `tls`: deadpool's `Config`
    /// drops the certificates, its `Manager` keeps them.
    pub(crate) fn pool(url: &str, tls: &Tls) -> Result<Pool> {
        let client = client(url, tls)?;
        let manager = deadpool_redis::Manager::new(client.get_connection_info().clone())
            .map_err(|e| Error::invalid("redis", e.to_string()))?;
        Pool::builder(manager)
            .runtime(deadpool_redis::Runtime::Tokio1)
            .build()
            .map_err(|e| Error::invalid("redis", e.to_string()))
    }

    fn read(path: &Path) -> Result<Vec<u8>> {
        std::fs::read(path)
            .map_err(|e| Error::invalid("tls", format!("cannot read `{}`: {e}", path.display())))
    }
}

#[cfg(feature = "tls")]
pub(crate) use enabled::{client, pool};

/// Without the `tls` feature: TLS settings are refused by name.
#[cfg(not(feature = "tls"))]
pub(crate) fn pool(_url: &str, _tls: &Tls) -> Result<Pool> {
    Err(unavailable())
}

/// Without the `tls` feature, the error for TLS settings.
#[cfg(not(feature = "tls"))]
pub(crate) fn unavailable() -> Error {
    Error::invalid(
        "tls",
        "peerq was built without its `tls` feature; add `features = [\"tls\"]` to its dependency",
    )
}
