//! A master that Redis Sentinel watches (docs/design.md §8, "Sentinel"):
//! every connection peerq makes to it (a shared connection after an error,
//! a blocking reader's, a pub/sub one) asks the sentinels which server is
//! the master now, and checks that it says so itself (`ROLE`), so that
//! after a failover each one finds the promoted replica by itself.
//!
//! redis-rs's `SentinelClient` does the asking. deadpool-redis's Sentinel
//! pool is not used: its `Config` keeps no TLS certificates (a private CA
//! could not be trusted), its `Pool` is a type of its own beside the
//! `Pool` every other part takes, and peerq takes no connection from a
//! pool for long anyway (see `Backend::connect`): what it needs is a
//! factory that resolves the master on every connect.

use std::fmt;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use deadpool_redis::redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion,
    TlsMode,
};

use super::CONNECT_TIMEOUT;
use super::redact::{not_a_url, redact};
use super::tls::Tls;
use crate::error::{Error, Result};

/// How long finding the master may take: the sentinels asked, the master
/// they name connected to and its `ROLE` read, then the connection made.
/// Bounded as a whole, so that a sentinel or a master that a network cut
/// swallows delays a reconnect, never blocks it.
const RESOLVE_TIMEOUT: std::time::Duration = CONNECT_TIMEOUT;

/// The master named `master` that the sentinels at `sentinels` watch, and
/// how to reach the sentinels and the servers.
#[derive(Clone)]
pub(crate) struct Sentinel {
    master: String,
    /// The sentinels' addresses (TLS or not, as their URLs say).
    sentinels: Vec<ConnectionAddr>,
    /// The first sentinel URL's user and password, for every sentinel.
    sentinel_auth: Auth,
    /// The user and password on the master (and its replicas).
    master_auth: Auth,
    /// The database on the master: the first sentinel URL's path.
    db: i64,
    /// The master speaks TLS: with these settings, or the system's roots
    /// when the sentinels' URLs are `rediss://` and no settings were given.
    // Without the `tls` feature, `new` refuses any.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: Option<Tls>,
    master_tls: bool,
    /// The URLs as errors and logs show them.
    shown: String,
}

#[derive(Clone, Default)]
struct Auth {
    user: Option<String>,
    password: Option<String>,
}

impl Sentinel {
    /// Checks the settings; connects nothing. An invalid value is an
    /// invalid `redis_sentinel` (or `tls`) setting, without passwords.
    pub(super) fn new(
        master: &str,
        urls: &[String],
        master_auth: Option<(String, String)>,
        tls: Option<Tls>,
    ) -> Result<Sentinel> {
        #[cfg(not(feature = "tls"))]
        if tls.is_some() {
            return Err(super::tls::unavailable());
        }
        if master.is_empty() {
            return Err(Error::invalid(
                "redis_sentinel",
                "no master name given; pass the name the sentinels monitor it by",
            ));
        }
        let mut infos: Vec<ConnectionInfo> = Vec::with_capacity(urls.len());
        for url in urls {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| not_a_url("redis_sentinel", url, e))?;
            if matches!(info.addr(), ConnectionAddr::Unix(_)) {
                return Err(Error::invalid(
                    "redis_sentinel",
                    format!("`{}`: sentinels are reached over TCP", redact(url)),
                ));
            }
            infos.push(info);
        }
        let Some(first) = infos.first() else {
            return Err(Error::invalid(
                "redis_sentinel",
                "no sentinels given; pass the URL of at least one",
            ));
        };
        let tls_sentinels = infos
            .iter()
            .filter(|info| matches!(info.addr(), ConnectionAddr::TcpTls { .. }))
            .count();
        if tls_sentinels != 0 && tls_sentinels != infos.len() {
            return Err(Error::invalid(
                "redis_sentinel",
                "the sentinels' URLs mix redis:// and rediss://; use one scheme for all",
            ));
        }
        let settings = first.redis_settings();
        let sentinel_auth = Auth {
            user: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
        };
        let master_auth = match master_auth {
            Some((user, password)) => Auth {
                user: (!user.is_empty()).then_some(user),
                password: Some(password),
            },
            None => Auth::default(),
        };
        Ok(Sentinel {
            master: master.to_owned(),
            db: settings.db(),
            sentinels: infos.iter().map(|info| info.addr().clone()).collect(),
            sentinel_auth,
            master_auth,
            master_tls: tls.is_some() || tls_sentinels != 0,
            tls,
            shown: shown(master, urls),
        })
    }

    /// A connection to the master as the sentinels name it now, whose
    /// replies may take up to `timeout`.
    pub(crate) async fn connect(
        &self,
        timeout: std::time::Duration,
    ) -> Result<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(timeout));
        self.connect_with(ProtocolVersion::RESP2, &config).await
    }

    /// A RESP3 connection to the master whose pushes (pub/sub messages) go
    /// to `config`'s push sender.
    pub(crate) async fn connect_resp3(
        &self,
        config: &AsyncConnectionConfig,
    ) -> Result<MultiplexedConnection> {
        self.connect_with(ProtocolVersion::RESP3, config).await
    }

    async fn connect_with(
        &self,
        protocol: ProtocolVersion,
        config: &AsyncConnectionConfig,
    ) -> Result<MultiplexedConnection> {
        // A client per connect: it caches its connections to the sentinels,
        // whose I/O runs on the runtime that made them (the indexer has a
        // runtime of its own), and connects are rare (at start, after an
        // error), so nothing is gained by keeping one.
        let mut client = self.builder(protocol)?.build().map_err(|e| {
            Error::invalid("redis_sentinel", format!("{e} (sentinels {})", self.shown))
        })?;
        let connect = client.get_async_connection_with_config(config);
        match tokio::time::timeout(RESOLVE_TIMEOUT, connect).await {
            Ok(conn) => Ok(conn?),
            Err(_) => Err(Error::Timeout(RESOLVE_TIMEOUT)),
        }
    }

    fn builder(&self, protocol: ProtocolVersion) -> Result<SentinelClientBuilder> {
        let mut builder = SentinelClientBuilder::new(
            self.sentinels.iter().cloned(),
            &self.master,
            SentinelServerType::Master,
        )?
        .set_client_to_redis_protocol(protocol)
        .set_client_to_redis_db(self.db);
        if let Some(user) = &self.sentinel_auth.user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = &self.sentinel_auth.password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(user) = &self.master_auth.user {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &self.master_auth.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if self.master_tls {
            builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            let certificates = tls.certificates()?;
            if matches!(self.sentinels.first(), Some(ConnectionAddr::TcpTls { .. })) {
                builder = builder.set_client_to_sentinel_certificates(certificates.clone());
            }
            builder = builder.set_client_to_redis_certificates(certificates);
        }
        Ok(builder)
    }
}

/// The master's name and the sentinels' URLs, without passwords.
fn shown(master: &str, urls: &[String]) -> String {
    let urls: Vec<String> = urls.iter().map(|url| redact(url)).collect();
    format!("master `{master}` of the sentinels {}", urls.join(", "))
}

/// Without passwords.
impl fmt::Display for Sentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sentinel")
            .field("at", &self.shown)
            .field("master_tls", &self.master_tls)
            .finish_non_exhaustive()
    }
}

/// Replies that say the connection goes to a server that is no longer the
/// master (demoted by a failover, or cut off from its replicas): a new
/// connection must ask the sentinels again.
pub(crate) fn not_the_master(error: &deadpool_redis::redis::RedisError) -> bool {
    use deadpool_redis::redis::{ErrorKind, ServerErrorKind};
    matches!(
        error.kind(),
        ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
    ) || error.code() == Some("NOREPLICAS")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(urls: &[&str]) -> Vec<String> {
        urls.iter().map(|url| url.to_string()).collect()
    }

    #[test]
    fn settings_show_without_passwords() {
        let sentinel = Sentinel::new(
            "mymaster",
            &urls(&["redis://:s3cret@s1:26379/", "redis://s2:26380/"]),
            Some(("app".into(), "m4ster".into())),
            None,
        )
        .unwrap();
        let shown = format!("{sentinel} {sentinel:?}");
        assert!(shown.contains("master `mymaster`"), "{shown}");
        assert!(shown.contains("redis://:***@s1:26379/"), "{shown}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("m4ster"),
            "{shown}"
        );
    }

    #[test]
    fn invalid_settings_are_refused_naming_the_setting() {
        let cases = [
            ("", urls(&["redis://s1:26379/"])),
            ("mymaster", urls(&[])),
            ("mymaster", urls(&["redis//:s3cret@s1"])),
        ];
        for (master, urls) in cases {
            let err = Sentinel::new(master, &urls, None, None).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("invalid setting `redis_sentinel`"), "{msg}");
            assert!(!msg.contains("s3cret"), "{msg}");
        }
    }
}
