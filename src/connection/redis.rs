//! [`Redis`]: the one description of where a service's Redis is and how
//! to talk to it, which every builder and entry point takes, and the check
//! that turns it into a [`Backend`] when they build.
//!
//! What it describes is a private enum of targets (a URL, a master that
//! Sentinel watches, a Cluster, a pool), so that each kind is one variant
//! and constructor, not another setter on every builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;

use super::backend::{Cluster, Servers};
use super::sentinel::Sentinel;
use super::subscriber::Source;
use super::tls::Tls;
use super::{Backend, Wait, redact};
use crate::error::{Error, Result};

/// Where a service's Redis is and how to talk to it: one server by its URL,
/// a master that Redis Sentinel watches by its name and the sentinels'
/// URLs, a Redis Cluster by some of its nodes, or a deadpool-redis pool; with TLS
/// files and replica waiting as modifiers. Every part of peerq takes one
/// ([`ConsumerBuilder::redis`](crate::consumer::ConsumerBuilder::redis),
/// [`ProducerBuilder::redis`](crate::producer::ProducerBuilder::redis),
/// [`Admin::connect`](crate::admin::Admin::connect), …); a URL (`&str`,
/// `String`) converts into one.
///
/// Nothing is checked or connected here: the part that takes it checks it
/// when it builds or connects (an invalid value is an
/// [`Error::InvalidSetting`] naming `redis`, `redis_cluster`,
/// `redis_sentinel`, `master_auth`, `tls` or `wait_for_replicas`). Its `Debug` and `Display`, and every error that
/// names it, show URLs without their passwords. Cheap to clone.
///
/// ```no_run
/// # async fn f() -> peerq::Result<()> {
/// use std::time::Duration;
/// use peerq::{Producer, Redis, Tls};
///
/// // One server: a URL is enough.
/// let producer = Producer::connect("redis://127.0.0.1/", "mail-sender").await?;
///
/// // A Cluster over TLS whose writes wait for a replica.
/// let redis = Redis::cluster(["rediss://app:secret@node-a:6380/", "rediss://app:secret@node-b:6380/"])
///     .tls(Tls::new().ca_file("/etc/redis/ca.pem"))
///     .wait_for_replicas(1, Duration::from_millis(100));
/// let producer = Producer::builder().redis(redis).name("mail-sender").connect().await?;
///
/// // The master that Sentinel watches as `mymaster`, whatever server that is now.
/// let redis = Redis::sentinel("mymaster", ["redis://sentinel-a:26379/", "redis://sentinel-b:26379/"])
///     .master_auth("app", "secret")
///     .wait_for_replicas(2, Duration::from_millis(100));
/// let producer = Producer::builder().redis(redis).name("mail-sender").connect().await?;
/// # let _ = producer; Ok(()) }
/// ```
#[must_use]
#[derive(Clone)]
pub struct Redis {
    target: Target,
    /// With a Sentinel target: the user (empty: the default) and password
    /// on the master and its replicas.
    master_auth: Option<(String, String)>,
    tls: Option<Tls>,
    wait: Option<Wait>,
}

/// What a [`Redis`] points at.
#[derive(Clone)]
enum Target {
    /// One server, by its URL.
    Url(String),
    /// A Redis Cluster, by some of its nodes' URLs.
    Cluster(Vec<String>),
    /// A master that Sentinel watches: its name, the sentinels' URLs.
    Sentinel(String, Vec<String>),
    /// One server, through the caller's pool.
    Pool(Pool),
    /// What another part of peerq already built (a consumer's, for its
    /// indexer and relay; an admin's, for its producer), and how that
    /// part's errors name it.
    Built { backend: Backend, shown: String },
}

impl Redis {
    /// The one server at `url`: `redis://[user:password@]host[:port][/db]`,
    /// or `rediss://` for TLS (the `tls` feature). A pool is made for it.
    pub fn url(url: impl Into<String>) -> Redis {
        Redis::at(Target::Url(url.into()))
    }

    /// The Redis Cluster with these seed nodes: URLs of some of its nodes,
    /// the others found from them, the first's user and password used for
    /// every node. Each partition's keys are in a slot of their own, so
    /// the partitions spread over every master; the service's own keys are
    /// on the master of `{name}`'s slot (docs/design.md §8).
    pub fn cluster<U: Into<String>>(seed_urls: impl IntoIterator<Item = U>) -> Redis {
        Redis::at(Target::Cluster(
            seed_urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// The master that Redis Sentinel monitors as `master_name` (its
    /// `sentinel monitor` name), found through the sentinels at these URLs:
    /// `redis://[user:password@]host:port[/db]`, the first URL's user and
    /// password for every sentinel (their `requirepass`), its `/db` the
    /// database on the master; `rediss://` for sentinels (and then a
    /// master) that speak TLS. The master's own user and password are
    /// [`master_auth`](Self::master_auth); with [`tls`](Self::tls), the
    /// master speaks TLS with those settings (and `rediss://` sentinels
    /// too).
    ///
    /// Every connection peerq makes asks the sentinels for the master
    /// first, and checks it is one (`ROLE`); a connection whose server a
    /// failover demoted breaks, or answers `READONLY`, and is made again:
    /// an instance follows a failover with no restart. Writes a failover
    /// must not lose wait for [`wait_for_replicas`](Self::wait_for_replicas);
    /// what survives, and what does not, is in docs/design.md §8.
    pub fn sentinel<U: Into<String>>(
        master_name: impl Into<String>,
        sentinel_urls: impl IntoIterator<Item = U>,
    ) -> Redis {
        Redis::at(Target::Sentinel(
            master_name.into(),
            sentinel_urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// With [`Redis::sentinel`]: the user (empty for the default user)
    /// and password on the master and its replicas, which the sentinels'
    /// URLs do not give (theirs are the sentinels' own).
    pub fn master_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Redis {
        self.master_auth = Some((user.into(), password.into()));
        self
    }

    /// The one server this pool connects to; the pool's own settings
    /// (URL, TLS) apply, so it takes no [`tls`](Self::tls). Parts take
    /// their connections out of it for good, and blocking reads get
    /// connections of their own from its manager.
    pub fn pool(pool: Pool) -> Redis {
        Redis::at(Target::Pool(pool))
    }

    /// What another part of peerq already built, named `shown` in errors.
    pub(crate) fn built(backend: Backend, shown: impl Into<String>) -> Redis {
        Redis::at(Target::Built {
            backend,
            shown: shown.into(),
        })
    }

    fn at(target: Target) -> Redis {
        Redis {
            target,
            master_auth: None,
            tls: None,
            wait: None,
        }
    }

    /// TLS settings for `rediss://` URLs (every seed of a Cluster's): the
    /// CA to trust instead of the system's, a client certificate (see
    /// [`Tls`]). Needs peerq's `tls` feature; not with a pool.
    pub fn tls(mut self, tls: Tls) -> Redis {
        self.tls = Some(tls);
        self
    }

    /// After the writes a failover must not lose, wait until `replicas`
    /// replicas of their master have them (`WAIT`, on the connection that
    /// carried them), at most `timeout` (at least 1 ms; a consumer's and an
    /// indexer's at most a tenth of the interval): a write they did not
    /// confirm counts as failed. A producer's enqueue then returns
    /// [`Error::NotReplicated`] (the task is enqueued; sending it again
    /// with an idempotency key does not run it twice); a consumer misses
    /// the round, and sends the acks again until replicas have them.
    /// Without it (the default) a failover can lose an enqueue that
    /// returned success, or an ack, and a task then runs twice
    /// (docs/design.md §8).
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Redis {
        self.wait = Some(Wait { replicas, timeout });
        self
    }

    /// The replicas its writes wait for, if any.
    pub(crate) fn wait(&self) -> Option<Wait> {
        match &self.target {
            Target::Built { backend, .. } => backend.wait,
            _ => self.wait,
        }
    }

    /// Whether errors should name it: a URL or a Cluster, given by the
    /// user. A pool's errors are the pool's, and a part built from another
    /// (an indexer from its consumer) leaves the naming to that part.
    pub(crate) fn names_servers(&self) -> bool {
        matches!(
            self.target,
            Target::Url(_) | Target::Cluster(_) | Target::Sentinel(..)
        )
    }

    /// Checks it and makes what it describes (a pool, a Cluster client);
    /// connects nothing yet. An invalid value is an
    /// [`Error::InvalidSetting`] naming the setting and what would work.
    pub(crate) fn backend(self) -> Result<Backend> {
        let tls = self.tls;
        if self.master_auth.is_some() && !matches!(self.target, Target::Sentinel(..)) {
            return Err(Error::invalid(
                "master_auth",
                "the master's user and password go with Redis::sentinel; a URL carries its own",
            ));
        }
        let mut pubsub = match &self.target {
            Target::Url(url) => Some(Source::Node(url.clone(), tls.clone())),
            Target::Cluster(seeds) => Some(Source::Cluster(seeds.clone(), tls.clone())),
            _ => None,
        };
        let servers = match self.target {
            Target::Sentinel(master, urls) => {
                let sentinel = Arc::new(Sentinel::new(&master, &urls, self.master_auth, tls)?);
                pubsub = Some(Source::Sentinel(sentinel.clone()));
                Servers::Sentinel(sentinel)
            }
            Target::Built { backend, .. } => return Ok(backend),
            Target::Pool(_) if tls.is_some() => {
                return Err(Error::invalid(
                    "tls",
                    "TLS settings go with Redis::url or Redis::cluster; a pool brings its own",
                ));
            }
            Target::Pool(pool) => Servers::Node(pool),
            Target::Cluster(seeds) => Servers::Cluster(Arc::new(Cluster::new(&seeds, tls)?)),
            Target::Url(url) => Servers::at_url(&url, tls.as_ref())?,
        };
        if let Some(wait) = self.wait {
            if wait.replicas == 0 {
                return Err(Error::invalid(
                    "wait_for_replicas",
                    "0 replicas waits for nothing; use at least 1, or leave it unset",
                ));
            }
            if wait.timeout < Duration::from_millis(1) {
                return Err(Error::invalid(
                    "wait_for_replicas",
                    "the timeout must be at least 1ms (WAIT 0 would wait forever)",
                ));
            }
        }
        Ok(Backend {
            servers,
            wait: self.wait,
            pubsub,
        })
    }
}

/// The [`Redis`] a builder has, or the error for none.
pub(crate) fn given(redis: Option<Redis>) -> Result<Redis> {
    redis.ok_or_else(|| {
        Error::invalid(
            "redis",
            "no Redis given; call .redis(url), or .redis(Redis::cluster(urls)), \
             .redis(Redis::sentinel(master, urls)) or .redis(Redis::pool(pool))",
        )
    })
}

/// How errors and logs name it: the URL without its password, the
/// Cluster's seed nodes without theirs, or the pool.
impl fmt::Display for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::Url(url) => f.write_str(&redact(url)),
            Target::Cluster(seeds) => {
                f.write_str("the Redis Cluster at ")?;
                for (i, seed) in seeds.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(&redact(seed))?;
                }
                Ok(())
            }
            Target::Sentinel(master, urls) => {
                write!(f, "the Redis Sentinel master `{master}` at ")?;
                for (i, url) in urls.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(&redact(url))?;
                }
                Ok(())
            }
            Target::Pool(_) => f.write_str("the given pool"),
            Target::Built { shown, .. } => f.write_str(shown),
        }
    }
}

impl fmt::Debug for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redis")
            .field("at", &format_args!("{self}"))
            .field("tls", &self.tls)
            .field("wait_for_replicas", &self.wait())
            .finish()
    }
}

impl From<&str> for Redis {
    /// [`Redis::url`].
    fn from(url: &str) -> Redis {
        Redis::url(url)
    }
}

impl From<String> for Redis {
    /// [`Redis::url`].
    fn from(url: String) -> Redis {
        Redis::url(url)
    }
}

impl From<&String> for Redis {
    /// [`Redis::url`].
    fn from(url: &String) -> Redis {
        Redis::url(url.as_str())
    }
}

#[cfg(test)]
#[path = "redis_tests.rs"]
mod tests;
