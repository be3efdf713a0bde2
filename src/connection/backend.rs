//! Where a service's Redis is: one server, reached through a deadpool
//! pool, a master that Redis Sentinel watches, found through the
//! sentinels on every connect, or a Redis Cluster, reached through its
//! seed nodes; and the connection each gives.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;
use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::cluster::{ClusterClient, ClusterClientBuilder};
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::{
    Cmd, ConnectionAddr, FromRedisValue, IntoConnectionInfo, Pipeline, RedisFuture, RedisResult,
    Value,
};

use super::node::NodeSettings;
use super::pipeline::{self, Nodes};
use super::redact::not_a_url;
use super::sentinel::Sentinel;
use super::tls::{self, Tls};
use super::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT, Wait, redact};
use crate::error::{Error, Result};

/// How often the Cluster client sends a command again after a redirection
/// or a node that is failing over, and the bounds of its pauses (ms). Its
/// defaults wait at least 1.28 s before a retry, 16 times; peerq's loops
/// retry with backoff of their own, so a command gives up sooner.
const CLUSTER_RETRIES: u32 = 6;
const CLUSTER_MIN_RETRY_WAIT_MS: u64 = 20;
const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 1000;

/// Where a service's Redis is, and whether writes that a failover must not
/// lose wait for replicas. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Backend {
    pub(crate) servers: Servers,
    pub(crate) wait: Option<Wait>,
    /// How to open a pub/sub connection; `None` for a pool given by the
    /// caller (its URL is not known).
    pub(crate) pubsub: Option<super::subscriber::Source>,
}

/// The servers of a [`Backend`].
#[derive(Clone)]
pub(crate) enum Servers {
    /// One server, through a pool.
    Node(Pool),
    /// A master that Redis Sentinel watches: each connection is made to
    /// the master the sentinels name then (docs/design.md §8).
    Sentinel(Arc<Sentinel>),
    /// A Redis Cluster (docs/design.md §8).
    Cluster(Arc<Cluster>),
}

/// A Redis Cluster: its client, and its nodes as peerq's own connections
/// reach them (made with the first seed node's user, password and TLS).
pub(crate) struct Cluster {
    client: ClusterClient,
    /// The slot map and the connections pipelines go on.
    pub(super) nodes: Nodes,
}

impl fmt::Debug for Servers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Servers::Node(pool) => f.debug_tuple("Node").field(pool).finish(),
            Servers::Sentinel(sentinel) => f.debug_tuple("Sentinel").field(sentinel).finish(),
            Servers::Cluster(_) => f.write_str("Cluster"),
        }
    }
}

impl From<Pool> for Backend {
    fn from(pool: Pool) -> Self {
        Backend {
            servers: Servers::Node(pool),
            wait: None,
            pubsub: None,
        }
    }
}

impl Servers {
    /// The one server at `url`, through a pool made for it; with `tls`, a
    /// pool whose manager keeps the certificates (deadpool's `Config`
    /// drops them).
    pub(super) fn at_url(url: &str, tls: Option<&Tls>) -> Result<Servers> {
        let pool = match tls {
            Some(tls) => tls::pool(url, tls)?,
            None => deadpool_redis::Config::from_url(url)
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .map_err(|e| not_a_url("redis", url, e))?,
        };
        Ok(Servers::Node(pool))
    }
}

impl Cluster {
    /// The Cluster with these seed nodes, speaking TLS with `tls`; an
    /// invalid seed URL is an invalid `redis_cluster` setting.
    pub(super) fn new(seeds: &[String], tls: Option<Tls>) -> Result<Cluster> {
        #[cfg(not(feature = "tls"))]
        if tls.is_some() {
            return Err(super::tls::unavailable());
        }
        let mut infos = Vec::with_capacity(seeds.len());
        for url in seeds {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| not_a_url("redis_cluster", url, e))?;
            // With certificates, redis-rs's Cluster client speaks TLS to
            // every node whatever the seed URLs say, while `node` follows
            // the first seed: a `redis://` seed would give plain
            // connections beside TLS ones. Refused, as for one server.
            if tls.is_some() && !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
                return Err(Error::invalid(
                    "tls",
                    format!(
                        "TLS settings go with rediss:// seed URLs; `{}` is not one",
                        redact(url)
                    ),
                ));
            }
            infos.push(info);
        }
        let Some(seed) = infos.first().cloned() else {
            return Err(Error::invalid(
                "redis_cluster",
                "no seed nodes given; pass the URL of at least one node",
            ));
        };
        // No response timeout per node connection: redis-rs sends a command
        // that timed out again (a second `XADD`, say), while the overall
        // timeout bounds a command with its retries and then fails it.
        let builder = ClusterClientBuilder::new(infos);
        #[cfg(feature = "tls")]
        let builder = match &tls {
            Some(tls) => builder.certs(tls.certificates()?),
            None => builder,
        };
        let client = builder
            .connection_timeout(CONNECT_TIMEOUT)
            .overall_response_timeout(Some(RESPONSE_TIMEOUT))
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(CLUSTER_MIN_RETRY_WAIT_MS)
            .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS)
            .build()
            .map_err(|e| Error::invalid("redis_cluster", e.to_string()))?;
        Ok(Cluster {
            client,
            nodes: Nodes::new(NodeSettings { seed, tls }),
        })
    }

    /// The same Cluster, with no node connections for pipelines yet: for
    /// a runtime of its own, as its connections' I/O runs on the runtime
    /// that made them.
    fn apart(&self) -> Cluster {
        Cluster {
            client: self.client.clone(),
            nodes: Nodes::new(self.nodes.settings().clone()),
        }
    }

    /// A connection of its own to the node at `host:port`, with the seed
    /// node's user, password and TLS settings, whose replies may take up to
    /// `timeout`.
    pub(crate) async fn node(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<MultiplexedConnection> {
        self.nodes.settings().connect(host, port, timeout).await
    }
}

impl Backend {
    /// Whether this is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.servers, Servers::Cluster(_))
    }

    /// A connection of its own: taken out of the pool for good (a
    /// connection left in the pool could be handed to a blocking reader,
    /// whose blocked read stalls every command on its clones), or made
    /// anew by the pool's manager when `made_here`: a multiplexed
    /// connection's I/O runs in a task on the runtime that made it, and one
    /// taken from the pool may have been made on another. On a Cluster, a
    /// new cluster connection; when `made_here`, with node connections for
    /// its pipelines of its own, not the ones the Cluster's other
    /// connections share.
    pub(crate) async fn connect(&self, made_here: bool) -> Result<Conn> {
        match &self.servers {
            Servers::Node(pool) => {
                let mut conn = if made_here {
                    use deadpool::managed::Manager as _;
                    pool.manager().create().await?
                } else {
                    deadpool_redis::Connection::take(pool.get().await?)
                };
                conn.set_response_timeout(RESPONSE_TIMEOUT);
                Ok(Conn::Node(conn))
            }
            // Made here always: asking the sentinels is the point.
            Servers::Sentinel(sentinel) => {
                Ok(Conn::Node(sentinel.connect(RESPONSE_TIMEOUT).await?))
            }
            Servers::Cluster(cluster) => {
                let conn = cluster.client.get_async_connection().await?;
                // Its pipelines too go on node connections made here (with
                // `wait_for_replicas`, the rounds' writes do).
                let cluster = match made_here {
                    true => Arc::new(cluster.apart()),
                    false => cluster.clone(),
                };
                Ok(Conn::Cluster(conn, cluster))
            }
        }
    }
}

/// A multiplexed connection to one server, or to every node of a Cluster
/// (commands go to the node of their keys' slot). Cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    /// To one server.
    Node(MultiplexedConnection),
    /// To a Cluster (and the Cluster, for pipelines).
    Cluster(ClusterConnection, Arc<Cluster>),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Conn::Node(_) => "Conn::Node",
            Conn::Cluster(..) => "Conn::Cluster",
        })
    }
}

impl Conn {
    /// Runs `pipe` (on a Cluster, one pipeline per slot: see
    /// [`cluster::query_pipe`]); the first error reply fails it all.
    pub(crate) async fn query_pipe<T: FromRedisValue>(
        &mut self,
        pipe: &Pipeline,
    ) -> RedisResult<T> {
        match self {
            Conn::Node(conn) => pipe.query_async(conn).await,
            Conn::Cluster(conn, cluster) => {
                let replies = pipeline::query_pipe(conn, &cluster.nodes, pipe)
                    .await?
                    .extract_error()?;
                Ok(T::from_redis_value(replies)?)
            }
        }
    }

    /// Runs `pipe` with each command's error reply in its place (as a
    /// `Value::ServerError`, or an `Err` in a `Vec<RedisResult<_>>`).
    pub(crate) async fn query_pipe_each<T: FromRedisValue>(
        &mut self,
        pipe: &mut Pipeline,
    ) -> RedisResult<T> {
        pipe.ignore_errors();
        match self {
            Conn::Node(conn) => pipe.query_async(conn).await,
            Conn::Cluster(conn, cluster) => Ok(T::from_redis_value(
                pipeline::query_pipe(conn, &cluster.nodes, pipe).await?,
            )?),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Node(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn, _) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Node(conn) => conn.req_packed_commands(pipe, offset, count),
            Conn::Cluster(conn, _) => conn.req_packed_commands(pipe, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(conn) => conn.get_db(),
            Conn::Cluster(conn, _) => conn.get_db(),
        }
    }
}
