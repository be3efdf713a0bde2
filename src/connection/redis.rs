//! [`Redis`]: the one description of where a service's Redis is and how
//! to talk to it, which every builder and entry point takes, and the check
//! that turns it into a [`Backend`] when they build.
//!
//! What it describes is a private enum of targets, so that a later kind
//! (a Sentinel-managed master) is one more variant and constructor, not
//! another setter on every builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;

use super::backend::{Cluster, Servers};
use super::subscriber::Source;
use super::tls::Tls;
use super::{Backend, Wait, redact};
use crate::error::{Error, Result};

/// Where a service's Redis is and how to talk to it: one server by its URL,
/// a Redis Cluster by some of its nodes, or a deadpool-redis pool; with TLS
/// files and replica waiting as modifiers. Every part of peerq takes one
/// ([`ConsumerBuilder::redis`](crate::consumer::ConsumerBuilder::redis),
/// [`ProducerBuilder::redis`](crate::producer::ProducerBuilder::redis),
/// [`Admin::connect`](crate::admin::Admin::connect), …); a URL (`&str`,
/// `String`) converts into one.
///
/// Nothing is checked or connected here: the part that takes it checks it
/// when it builds or connects (an invalid value is an
/// [`Error::InvalidSetting`] naming `redis`, `redis_cluster`, `tls` or
/// `wait_for_replicas`). Its `Debug` and `Display`, and every error that
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
/// # let _ = producer; Ok(()) }
/// ```
#[must_use]
#[derive(Clone)]
pub struct Redis {
    target: Target,
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
        matches!(self.target, Target::Url(_) | Target::Cluster(_))
    }

    /// Checks it and makes what it describes (a pool, a Cluster client);
    /// connects nothing yet. An invalid value is an
    /// [`Error::InvalidSetting`] naming the setting and what would work.
    pub(crate) fn backend(self) -> Result<Backend> {
        let tls = self.tls;
        let pubsub = match &self.target {
            Target::Url(url) => Some(Source::Node(url.clone(), tls.clone())),
            Target::Cluster(seeds) => Some(Source::Cluster(seeds.clone(), tls.clone())),
            _ => None,
        };
        let servers = match self.target {
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
            "no Redis given; call .redis(url), or .redis(Redis::cluster(urls)) or \
             .redis(Redis::pool(pool))",
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
mod tests {
    use super::*;

    #[test]
    fn a_url_converts_and_shows_without_its_password() {
        let redis = Redis::from("redis://app:s3cret@db:6379/2");
        assert!(matches!(&redis.target, Target::Url(url) if url == "redis://app:s3cret@db:6379/2"));
        assert_eq!(redis.to_string(), "redis://app:***@db:6379/2");
        let debug = format!("{redis:?}");
        assert_eq!(
            debug,
            "Redis { at: redis://app:***@db:6379/2, tls: None, wait_for_replicas: None }"
        );
        let owned = String::from("redis://:s3cret@db/");
        for redis in [Redis::from(&owned), Redis::from(owned.clone())] {
            assert_eq!(redis.to_string(), "redis://:***@db/");
        }
    }

    #[test]
    fn a_cluster_shows_every_seed_without_its_password() {
        let redis = Redis::cluster(["redis://:s3cret@a:7000/", "redis://app:s3cret@b:7001/"])
            .tls(Tls::new())
            .wait_for_replicas(1, Duration::from_millis(100));
        let shown = redis.to_string();
        assert_eq!(
            shown,
            "the Redis Cluster at redis://:***@a:7000/, redis://app:***@b:7001/"
        );
        let debug = format!("{redis:?}");
        assert!(debug.contains(&shown), "{debug}");
        assert!(debug.contains("replicas: 1"), "{debug}");
        assert!(!debug.contains("s3cret"), "{debug}");
    }

    #[test]
    fn a_pool_shows_nothing_of_its_url_and_refuses_tls_files() {
        let pool = deadpool_redis::Config::from_url("redis://app:s3cret@db/")
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        let redis = Redis::pool(pool).tls(Tls::new());
        assert_eq!(redis.to_string(), "the given pool");
        let debug = format!("{redis:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        let msg = redis.backend().unwrap_err().to_string();
        assert!(msg.contains("invalid setting `tls`"), "{msg}");
    }

    #[test]
    fn a_malformed_url_is_refused_without_its_password() {
        let err = Redis::url("redis//:s3cret@db").backend().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("invalid setting `redis`"), "{msg}");
        assert!(msg.contains(":***@db"), "{msg}");
        assert!(!msg.contains("s3cret"), "{msg}");
    }

    #[test]
    fn tls_settings_with_a_plain_seed_node_are_refused_without_its_password() {
        let redis = Redis::cluster([
            "rediss://:s3cret@127.0.0.1:7000/",
            "redis://:s3cret@127.0.0.1:7001/",
        ])
        .tls(Tls::new());
        let msg = redis.backend().unwrap_err().to_string();
        assert!(msg.contains("invalid setting `tls`"), "{msg}");
        #[cfg(feature = "tls")]
        assert!(
            msg.contains("rediss:// seed URLs; `redis://:***@127.0.0.1:7001/`"),
            "{msg}"
        );
        assert!(!msg.contains("s3cret"), "{msg}");
    }

    #[test]
    fn invalid_values_are_refused_naming_the_setting() {
        let no_seeds = Redis::cluster(Vec::<String>::new()).backend().unwrap_err();
        assert!(
            no_seeds
                .to_string()
                .contains("invalid setting `redis_cluster`"),
            "{no_seeds}"
        );
        let waits = [
            (0, Duration::from_millis(10)),
            (1, Duration::from_micros(500)),
        ];
        for (replicas, timeout) in waits {
            let err = Redis::url("redis://db/")
                .wait_for_replicas(replicas, timeout)
                .backend()
                .unwrap_err();
            assert!(
                err.to_string()
                    .contains("invalid setting `wait_for_replicas`"),
                "{err}"
            );
        }
        let err = given(None).unwrap_err();
        assert!(err.to_string().contains("invalid setting `redis`"), "{err}");
    }
}
