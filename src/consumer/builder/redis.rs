//! Where the consumer finds Redis: one server, a pool, or a Cluster's seed
//! nodes, with TLS and the replicas a write waits for.

use std::time::Duration;

use deadpool_redis::Pool;

use super::ConsumerBuilder;
use crate::codec::Codec;
use crate::connection::{Tls, Wait};

impl<T, S, C: Codec> ConsumerBuilder<T, S, C> {
    /// Connect to Redis at `url` (`redis://`, `rediss://`, with user and password).
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.redis.url = Some(url.into());
        self
    }

    /// Use this pool for the instance's non-blocking commands (takes
    /// precedence over [`redis`](Self::redis)). Blocking reads always get
    /// connections of their own, to the same server.
    pub fn pool(mut self, pool: Pool) -> Self {
        self.redis.pool = Some(pool);
        self
    }

    /// Connect to the Redis Cluster with these seed nodes (URLs of some of
    /// its nodes; the others are found from them). Each partition's keys
    /// are in a slot of their own, so the partitions spread over every
    /// master; the service's own keys are on the master of `{name}`'s
    /// slot. Each idle partition waits for new entries on a connection of
    /// its own to the master of its slot.
    pub fn redis_cluster<U: Into<String>>(mut self, urls: impl IntoIterator<Item = U>) -> Self {
        self.redis.cluster = Some(urls.into_iter().map(Into::into).collect());
        self
    }

    /// TLS settings for a `rediss://` URL (or a Cluster's): the CA to
    /// trust instead of the system's, a client certificate (see [`Tls`]).
    /// Needs peerq's `tls` feature.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.redis.tls = Some(tls);
        self
    }

    /// After the writes a failover must not lose (owner records, release
    /// marks, round writes, acks), wait until `replicas` replicas of their
    /// master have them (`WAIT`, on the connection that carried them), at
    /// most `timeout` (at most a tenth of the interval):
    /// a write they did not confirm counts as failed (the round is missed;
    /// the acks are sent again until replicas have them, and a drain's
    /// release mark waits for them). Without it (the default) a failover
    /// can lose such a write: a task may then run twice, or two instances
    /// read different counts for a round (docs/design.md §8).
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.redis.wait = Some(Wait { replicas, timeout });
        self
    }
}
