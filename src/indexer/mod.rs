//! The peer indexer (docs/design.md §2): each instance learns its
//! `(index, replicas)` once per interval from an atomic write to a
//! per-interval Redis key, with no coordinator.
//!
//! Round `n` runs at local time `I * n + offset` and writes key
//! `{N}:<n + 1>`. In the next round the instance reads what the service wrote
//! in that key and learns its assignment for epoch `n + 2`:
//!
//! - [`Indexing::Ranked`] (default): `ZADD` of the instance's offset; index =
//!   rank of the offset + 1, replicas = the set's size.
//! - [`Indexing::Incr`] (the seed): `INCR`; index = the value it returned,
//!   replicas = the counter's final value.
//!
//! The indexer owns the rounds and the instance's standing; it does not know
//! about partitions or handovers. Its output is a [`watch`] channel of
//! [`Standing`]: consumers always want the newest standing, and one that
//! falls behind sees an epoch gap and fences itself, which is the safe side.

mod builder;
mod listed;
mod liveness;
mod round;
mod schedule;
mod settings;
mod thread;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::assignment::Standing;
use crate::clock::Clock;
use crate::config::ServiceName;
use crate::connection::Backend;
use crate::error::Result;
use crate::instance::InstanceId;
use crate::meta::{self, Kind};
use crate::presence::Presence;

pub use self::builder::IndexerBuilder;
pub(crate) use self::liveness::Liveness;
use self::round::RoundLoop;
use self::schedule::Schedule;
pub use self::settings::Indexing;
pub(crate) use self::settings::{DEFAULT_INTERVAL, IndexerSettings, indexer_setters};
use self::thread::RoundThread;

/// A validated, not yet running peer indexer. [`start`](Indexer::start) it.
pub struct Indexer {
    name: ServiceName,
    id: InstanceId,
    settings: IndexerSettings,
    schedule: Schedule,
    clock: Arc<dyn Clock>,
    backend: Backend,
    /// The URL without its password, for errors (`None`: given a pool).
    redis: Option<String>,
    presence: Option<Arc<Presence>>,
    liveness: Option<Arc<Liveness>>,
    /// Recorded as `kind` unless this is a consumer's own indexer.
    kind: Kind,
}

impl fmt::Debug for Indexer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Indexer")
            .field("name", &self.name)
            .field("id", &self.id)
            .field("settings", &self.settings)
            .field("offset", &self.schedule.offset())
            .finish_non_exhaustive()
    }
}

impl Indexer {
    /// A builder with the defaults.
    pub fn builder() -> IndexerBuilder {
        IndexerBuilder::new()
    }

    /// Checks the settings against the service's `{N}:meta` (recording them
    /// if this is the first instance), then starts the rounds in a task.
    ///
    /// Fails with [`Error::SettingsMismatch`](crate::Error::SettingsMismatch)
    /// naming every setting that differs from the service's, and also when
    /// the name is a consumer service's (`kind` = `consumer`): a standalone
    /// indexer counts as an instance of the service it names, so beside
    /// consumers it would take a share of their partitions that no one then
    /// processes. A Redis that cannot be reached is an
    /// [`Error::Connect`](crate::Error::Connect) naming the URL without its
    /// password.
    pub async fn start(self) -> Result<IndexerHandle> {
        let redis = self.redis.clone();
        let at_redis = |e| match &redis {
            Some(url) => crate::connection::at(url, e),
            None => e,
        };
        let mut fields = self.settings.meta_fields();
        if self.presence.is_none() {
            fields.push(self.kind.field());
        }
        let checked = async {
            let mut conn = self.backend.connect(false).await?;
            meta::ensure(&mut conn, &self.name, &fields).await?;
            self.settings.membership.tell(&mut conn, &self.name).await
        };
        checked.await.map_err(at_redis)?;
        let (tx, rx) = watch::channel(Standing::Joining);
        let stop = CancellationToken::new();
        let leave = CancellationToken::new();
        let offset = self.schedule.offset();
        let rounds = RoundLoop::new(
            self.name,
            self.id.clone(),
            self.settings,
            self.schedule,
            self.clock,
            self.backend,
            tx,
        )
        .with_presence(self.presence)
        .with_liveness(self.liveness)
        .with_membership()?;
        let thread = RoundThread::start(rounds, stop.clone(), leave.clone())
            .await
            .map_err(at_redis)?;
        Ok(IndexerHandle {
            id: self.id,
            offset,
            standing: rx,
            stop,
            leave,
            thread,
        })
    }
}

/// A running peer indexer. Dropping it stops the rounds at once.
#[derive(Debug)]
pub struct IndexerHandle {
    id: InstanceId,
    offset: Duration,
    standing: watch::Receiver<Standing>,
    stop: CancellationToken,
    leave: CancellationToken,
    thread: RoundThread,
}

impl IndexerHandle {
    /// A receiver of this instance's standing, updated after every round.
    pub fn standing(&self) -> watch::Receiver<Standing> {
        self.standing.clone()
    }

    /// This instance's id.
    pub fn instance_id(&self) -> &InstanceId {
        &self.id
    }

    /// This instance's constant round offset, in `[0, I/2)`.
    pub fn offset(&self) -> Duration {
        self.offset
    }

    /// Begins a graceful leave (docs/design.md §4 rule 7): stop writing rounds,
    /// keep emitting the assignment already earned, then publish
    /// [`Standing::Left`] at the first round without an index and stop.
    pub fn leave(&self) {
        self.leave.cancel();
    }

    /// Stops the rounds at once (no graceful leave) and waits for their
    /// thread.
    pub async fn stop(mut self) {
        self.stop.cancel();
        self.thread.wait().await;
    }

    /// Waits until the indexer has stopped by itself (after a graceful leave).
    pub async fn finished(mut self) {
        self.thread.wait().await;
    }
}

impl Drop for IndexerHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
