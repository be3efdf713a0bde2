//! What a consumer does in Redis before it serves: refuse an evicting Redis,
//! check and record the service's `{N}:meta`, create the partitions'
//! consumer groups, start the peer indexer.
//!
//! An instance may start before its Redis does (a pod scheduled first, a DNS
//! name not yet published), so while Redis cannot be reached the whole start
//! is tried again with backoff, and the stop signal ends the wait. What
//! retrying cannot fix (a wrong password, an ACL refusal, a `{N}:meta`
//! mismatch, an evicting Redis) ends the start with an error at once.
//!
//! It does not own the run loop (`runtime`) nor the indexer's rounds.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use super::store;
use crate::clock::Clock;
use crate::config::ServiceName;
use crate::connection::{self, SharedConnection};
use crate::error::{Error, Result};
use crate::indexer::IndexerSettings;
use crate::indexer::Liveness;
use crate::indexer::{Indexer, IndexerHandle};
use crate::instance::InstanceId;
use crate::meta;
use crate::periodic::{self, Registered};
use crate::presence::Presence;
use crate::reshard::Generation;
use crate::retry::{self, Backoff};

/// The wait between start attempts: soon after the first failures (Redis
/// is usually a moment away), then at most 10 s, one warning per wait.
const BACKOFF: Backoff = Backoff::exponential(Duration::from_millis(200), Duration::from_secs(10));

/// What the start needs.
pub(super) struct Startup<'a> {
    pub(super) name: &'a ServiceName,
    pub(super) id: &'a InstanceId,
    /// The Redis, as errors and logs name it (no password).
    pub(super) redis: &'a str,
    pub(super) conn: &'a SharedConnection,
    pub(super) indexer: &'a IndexerSettings,
    pub(super) clock: &'a Arc<dyn Clock>,
    /// The consumer's fields of `{N}:meta`.
    pub(super) meta: &'a [(&'static str, String)],
    /// The generation of partitions in use (docs/design.md §21), where
    /// periodic jobs' first marks go.
    pub(super) current: Generation,
    /// Every partition of every level (docs/design.md §17).
    pub(super) streams: u32,
    pub(super) allow_eviction: bool,
    /// The periodic jobs, whose schedules are recorded.
    pub(super) periodic: &'a [Registered],
    /// What the rounds tell the others about this instance.
    pub(super) presence: &'a Arc<Presence>,
    /// Beaten by the consumer's runtime, checked by the rounds.
    pub(super) liveness: &'a Arc<Liveness>,
}

impl Startup<'_> {
    /// Starts, waiting for Redis while it cannot be reached. `Ok(None)`:
    /// `stop` resolved during a wait. An attempt underway when it resolves
    /// finishes first (a connect gives up after about a second), so a
    /// consumer told to stop at once still reports a final error, such as
    /// a settings mismatch, that its first attempt found.
    pub(super) async fn run(
        &self,
        stop: impl Future<Output = ()>,
    ) -> Result<Option<IndexerHandle>> {
        retry::until_ok(
            BACKOFF,
            stop,
            || self.attempt(),
            |e, wait| {
                warn!(
                    service = %self.name,
                    redis = %self.redis,
                    cause = %e,
                    retry_in = ?wait,
                    "cannot reach redis; retrying"
                );
            },
        )
        .await
        .map_err(|e| connection::at(self.redis, e))
    }

    /// One attempt. Each step is idempotent, so a retry after a failure
    /// part way repeats the finished steps harmlessly.
    async fn attempt(&self) -> Result<IndexerHandle> {
        let started = async {
            check_eviction(self.conn, self.redis, self.allow_eviction).await?;
            meta::ensure(&mut self.conn.get().await?, self.name, self.meta).await?;
            store::create_groups(self.conn, self.name, self.streams).await?;
            periodic::record_schedules(
                self.conn,
                self.name,
                self.current,
                self.periodic,
                self.clock.now(),
            )
            .await?;
            Indexer::builder()
                .name(self.name.as_str())
                .redis(connection::Redis::built(
                    self.conn.backend().clone(),
                    self.redis,
                ))
                // All of them at once, so that none is left at its default.
                .settings(self.indexer.clone())
                .clock(self.clock.clone())
                .instance_id(self.id.clone())
                .presence(self.presence.clone())
                .liveness(self.liveness.clone())
                .build()?
                .start()
                .await
        };
        let result = started.await;
        if result.as_ref().is_err_and(Error::is_transient) {
            // A connection that failed half way may be broken (`meta` uses
            // it directly); the next attempt takes a fresh one.
            self.conn.reset();
        }
        result
    }
}

/// The partitions `{N}:meta` records for service `name` (`None`: a new
/// service) and the generation its layout makes current (`None`: never
/// resharded, docs/design.md §21), read while waiting for Redis as a start
/// does; `None`: `stop` resolved during a wait.
pub(super) async fn service_partitions(
    conn: &SharedConnection,
    name: &ServiceName,
    redis: &str,
    stop: impl Future<Output = ()>,
) -> Result<Option<(Option<u32>, Option<Generation>)>> {
    let read = || async {
        let mut hget = deadpool_redis::redis::cmd("HGET");
        hget.arg(crate::keys::meta(name)).arg("partitions");
        let recorded: Option<String> = conn.query(&hget).await?;
        let first = recorded
            .map(|p| meta::recorded_partitions(name, &p))
            .transpose()?;
        let current = crate::reshard::read_layout(conn, name)
            .await?
            .map(|l| l.current);
        Ok((first, current))
    };
    retry::until_ok(BACKOFF, stop, read, |e, wait| {
        warn!(service = %name, redis, cause = %e, retry_in = ?wait, "cannot reach redis; retrying");
    })
    .await
    .map_err(|e| connection::at(redis, e))
}

/// Refuses a Redis that may evict keys, unless the user allowed it.
async fn check_eviction(conn: &SharedConnection, redis: &str, allowed: bool) -> Result<()> {
    // On a Cluster, every master's: each holds some partitions.
    let policies = match store::eviction_policies(conn).await {
        Ok(policies) => policies,
        // An ACL user without INFO: the check cannot run.
        Err(Error::Redis(e)) if e.code() == Some("NOPERM") => {
            if allowed {
                return Ok(());
            }
            return Err(Error::invalid(
                "allow_eviction",
                format!(
                    "the redis user at {redis} may not run `info`, which peerq needs to check \
                     that redis does not evict keys (maxmemory-policy): grant it (ACL SETUSER \
                     <user> +info), or call .allow_eviction(true) if the policy is noeviction"
                ),
            ));
        }
        Err(e) => return Err(e),
    };
    let Some((node, policy)) = policies
        .into_iter()
        .find(|(_, policy)| policy != "noeviction" && !policy.is_empty())
    else {
        return Ok(());
    };
    let redis = if node.is_empty() {
        "redis".to_owned()
    } else {
        format!("redis node {node}")
    };
    if allowed {
        warn!(
            policy,
            node,
            "redis may evict keys (maxmemory-policy); tasks and coordination keys can be lost"
        );
        return Ok(());
    }
    Err(Error::invalid(
        "allow_eviction",
        format!(
            "{redis} has maxmemory-policy `{policy}`, which can silently evict tasks, owner records \
             and marks; set it to `noeviction` (CONFIG SET maxmemory-policy noeviction), or call \
             .allow_eviction(true) to run anyway"
        ),
    ))
}
