//! Where the peer indexer's rounds keep the service's membership
//! (docs/design.md §2.2): in the service's Redis (the default), or in an
//! etcd cluster (`etcd` feature). Tasks, transitions, fencing and every
//! other key stay on Redis either way.

use std::fmt;

use crate::config::ServiceName;
#[cfg(feature = "etcd")]
use crate::connection::Tls;
#[cfg(feature = "etcd")]
use crate::error::Error;
use crate::error::Result;

/// The `{N}:meta` field that records the service's backend.
pub(crate) const FIELD: &str = "membership";

/// Where a service's rounds run ([`ConsumerBuilder::membership`](crate::consumer::ConsumerBuilder::membership)).
/// Service-wide: `{N}:meta` records it, and an instance with another
/// backend (or another etcd prefix) is refused naming the setting.
///
/// ```no_run
/// # #[cfg(feature = "etcd")]
/// # async fn f() -> peerq::Result<()> {
/// use peerq::Membership;
/// let membership = Membership::etcd(["http://etcd-1:2379", "http://etcd-2:2379"]);
/// # let _ = membership; Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Membership {
    /// Rounds in the service's Redis, `{N}:<round>` (docs/design.md §2).
    #[default]
    Redis,
    /// Rounds in an etcd cluster, under `{prefix}/{N}/` (docs/design.md
    /// §2.2). Needs peerq's `etcd` cargo feature.
    #[cfg(feature = "etcd")]
    Etcd {
        /// The cluster's client URLs, `http://host:2379` (`https://` with
        /// TLS). The rounds use one at a time and move to the next when it
        /// refuses or does not answer.
        endpoints: Vec<String>,
        /// The key prefix the service's rounds live under (default
        /// `/peerq`). Service-wide.
        prefix: String,
        /// TLS to etcd: the CA to trust and a client certificate, if the
        /// cluster asks for one (needs `https://` endpoints). `None`: plain
        /// TCP for `http://`, the system's CA certificates for `https://`.
        tls: Option<Tls>,
        /// A user and password, for a cluster with authentication on.
        auth: Option<EtcdAuth>,
    },
}

/// An etcd user and password ([`Membership::Etcd`]). Its `Debug` leaves the
/// password out.
#[cfg(feature = "etcd")]
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    /// The etcd user.
    pub user: String,
    /// Its password.
    pub password: String,
}

#[cfg(feature = "etcd")]
impl fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// The prefix of [`Membership::etcd`].
#[cfg(feature = "etcd")]
pub const DEFAULT_ETCD_PREFIX: &str = "/peerq";

impl Membership {
    /// Rounds in etcd at `endpoints`, under the default prefix `/peerq`,
    /// without TLS or a user.
    #[cfg(feature = "etcd")]
    pub fn etcd<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Membership::Etcd {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: DEFAULT_ETCD_PREFIX.to_owned(),
            tls: None,
            auth: None,
        }
    }

    /// The backend's name as `{N}:meta` records it: `redis` or `etcd`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Membership::Redis => "redis",
            #[cfg(feature = "etcd")]
            Membership::Etcd { .. } => "etcd",
        }
    }

    /// The `{N}:meta` fields: the backend, and etcd's prefix (two prefixes
    /// would be two memberships of one service).
    pub(crate) fn meta_fields(&self) -> Vec<(&'static str, String)> {
        let backend = (FIELD, self.as_str().to_owned());
        match self {
            Membership::Redis => vec![backend],
            #[cfg(feature = "etcd")]
            Membership::Etcd { prefix, .. } => vec![backend, ("etcd_prefix", prefix.clone())],
        }
    }

    /// Records where the etcd cluster is, for `peerq status`
    /// (`{N}:etcd`); nothing on Redis.
    pub(crate) async fn tell<C>(&self, conn: &mut C, name: &ServiceName) -> Result<()>
    where
        C: deadpool_redis::redis::aio::ConnectionLike + Send,
    {
        #[cfg(feature = "etcd")]
        if let Membership::Etcd { endpoints, .. } = self {
            let shown = serde_json::to_string(endpoints).expect("strings encode");
            let mut set = deadpool_redis::redis::cmd("SET");
            set.arg(crate::keys::etcd(name)).arg(shown);
            set.query_async::<()>(conn).await?;
        }
        let _ = (conn, name);
        Ok(())
    }

    /// Refuses an etcd backend without endpoints, with a URL that is not
    /// `http://` or `https://`, or with a prefix that is empty or does not
    /// start with `/`.
    pub(crate) fn validate(&self) -> Result<()> {
        #[cfg(feature = "etcd")]
        if let Membership::Etcd {
            endpoints,
            prefix,
            tls,
            ..
        } = self
        {
            if endpoints.is_empty() {
                return Err(Error::invalid(
                    "membership",
                    "etcd needs at least one endpoint, such as http://127.0.0.1:2379".to_owned(),
                ));
            }
            if let Some(bad) = endpoints
                .iter()
                .find(|e| !(e.starts_with("http://") || e.starts_with("https://")))
            {
                return Err(Error::invalid(
                    "membership",
                    format!("etcd endpoint {bad:?} is not an http:// or https:// URL"),
                ));
            }
            let https = endpoints
                .iter()
                .filter(|e| e.starts_with("https://"))
                .count();
            if https != 0 && https != endpoints.len() {
                return Err(Error::invalid(
                    "membership",
                    "etcd endpoints mix http:// and https://; one cluster speaks one".to_owned(),
                ));
            }
            if tls.is_some() && https == 0 {
                return Err(Error::invalid(
                    "membership",
                    "etcd TLS settings need https:// endpoints".to_owned(),
                ));
            }
            if !prefix.starts_with('/') || prefix.len() < 2 || prefix.ends_with('/') {
                return Err(Error::invalid(
                    "membership",
                    format!(
                        "etcd prefix {prefix:?} must start with `/`, name something, and not \
                         end with `/` (such as /peerq)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// etcd-client's TLS settings for `tls`: the files read now. An error
/// names the file that cannot be read.
#[cfg(feature = "etcd")]
pub(crate) fn tls_options(tls: &Tls) -> std::result::Result<etcd_client::TlsOptions, String> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let read = |path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| format!("cannot read etcd TLS file {}: {e}", path.display()))
    };
    let mut config = TlsOptions::new();
    if let Some(ca) = tls.ca() {
        config = config.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    if let Some((cert, key)) = tls.client_cert_files() {
        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(config)
}

impl fmt::Debug for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Membership::Redis => f.write_str("Redis"),
            #[cfg(feature = "etcd")]
            Membership::Etcd {
                endpoints,
                prefix,
                tls,
                auth,
            } => f
                .debug_struct("Etcd")
                .field("endpoints", endpoints)
                .field("prefix", prefix)
                .field("tls", tls)
                .field("auth", auth)
                .finish(),
        }
    }
}

impl fmt::Display for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(all(test, feature = "etcd"))]
mod tests {
    use super::*;

    fn setting(m: Membership) -> String {
        match m.validate() {
            Err(Error::InvalidSetting { setting, message }) => format!("{setting}: {message}"),
            other => panic!("expected an invalid setting, got {other:?}"),
        }
    }

    #[test]
    fn an_etcd_backend_needs_urls_and_a_prefix() {
        Membership::etcd(["http://127.0.0.1:2379"])
            .validate()
            .unwrap();
        let none: [&str; 0] = [];
        assert!(setting(Membership::etcd(none)).starts_with("membership: etcd needs"));
        assert!(setting(Membership::etcd(["127.0.0.1:2379"])).contains("not an http://"));
        let mixed = Membership::etcd(["http://a:2379", "https://b:2379"]);
        assert!(setting(mixed).contains("mix http:// and https://"));
        let Membership::Etcd {
            endpoints,
            prefix,
            auth,
            ..
        } = Membership::etcd(["http://a:2379"])
        else {
            unreachable!()
        };
        let tls = Some(Tls::new());
        let plain = Membership::Etcd {
            endpoints,
            prefix,
            tls,
            auth,
        };
        assert!(setting(plain).contains("need https://"));
        for prefix in ["", "/", "peerq", "/peerq/"] {
            let Membership::Etcd {
                endpoints,
                tls,
                auth,
                ..
            } = Membership::etcd(["http://e:1"])
            else {
                unreachable!()
            };
            let m = Membership::Etcd {
                endpoints,
                prefix: prefix.to_owned(),
                tls,
                auth,
            };
            assert!(setting(m).contains("prefix"), "{prefix}");
        }
    }

    #[test]
    fn the_password_is_never_printed() {
        let Membership::Etcd {
            endpoints,
            prefix,
            tls,
            ..
        } = Membership::etcd(["http://e:1"])
        else {
            unreachable!()
        };
        let auth = Some(EtcdAuth {
            user: "app".into(),
            password: "hunter2".into(),
        });
        let m = Membership::Etcd {
            endpoints,
            prefix,
            tls,
            auth,
        };
        let shown = format!("{m:?}");
        assert!(
            shown.contains("app") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
