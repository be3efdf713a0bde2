//! The peer indexer's builder: its settings, validated by
//! [`build`](IndexerBuilder::build) before anything touches Redis.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;

use super::schedule::Schedule;
use super::{Indexer, Liveness};
use crate::assignment::Assignor;
use crate::clock::{Clock, SystemClock};
use crate::config::ServiceName;
use crate::connection::{Backend, Given, Tls};
use crate::error::Result;
use crate::indexer::{IndexerSettings, Indexing};
use crate::instance::InstanceId;
use crate::presence::Presence;

/// Builds an [`Indexer`].
///
/// ```no_run
/// # async fn demo() -> peerq::Result<()> {
/// use std::time::Duration;
/// use peerq::indexer::Indexer;
///
/// let handle = Indexer::builder()
///     .name("mail-sender")
///     .redis("redis://127.0.0.1/")
///     .interval(Duration::from_secs(1))
///     .build()?
///     .start()
///     .await?;
/// let mut standing = handle.standing();
/// while standing.changed().await.is_ok() {
///     println!("{:?}", *standing.borrow());
/// }
/// # Ok(()) }
/// ```
#[must_use]
pub struct IndexerBuilder {
    name: Option<String>,
    settings: IndexerSettings,
    clock: Arc<dyn Clock>,
    redis: Given,
    instance_id: Option<InstanceId>,
    /// A consumer's live values, sent each round (`None`: a bare indexer).
    presence: Option<Arc<Presence>>,
    /// A consumer runtime's sign of life (`None`: a bare indexer).
    liveness: Option<Arc<Liveness>>,
}

impl fmt::Debug for IndexerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IndexerBuilder")
            .field("name", &self.name)
            .field("settings", &self.settings)
            .field("clock", &self.clock)
            .field("redis", &self.redis)
            .finish_non_exhaustive()
    }
}

impl IndexerBuilder {
    /// A builder with the defaults.
    pub(super) fn new() -> Self {
        IndexerBuilder {
            name: None,
            settings: IndexerSettings::default(),
            clock: Arc::new(SystemClock),
            redis: Given::default(),
            instance_id: None,
            presence: None,
            liveness: None,
        }
    }

    /// The service name (required).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Connect to Redis at `url` (a pool is created for it).
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.redis.url = Some(url.into());
        self
    }

    /// Use this connection pool (takes precedence over [`redis`](Self::redis)).
    pub fn pool(mut self, pool: Pool) -> Self {
        self.redis.pool = Some(pool);
        self
    }

    /// Connect to the Redis Cluster with these seed nodes; the service's
    /// keys are all on the master of `{name}`'s slot.
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

    /// Use the Redis of the consumer it belongs to.
    pub(crate) fn backend(mut self, backend: Backend) -> Self {
        self.redis.backend = Some(backend);
        self
    }

    /// The round interval `I` (default 1 s; 100 ms to 1 h). Service-wide.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.settings.interval = interval;
        self
    }

    /// The tolerated clock skew `S` (default 50 ms; below `I/4 - lease_margin`).
    /// Service-wide.
    pub fn skew(mut self, skew: Duration) -> Self {
        self.settings.skew = skew;
        self
    }

    /// The lease margin (default 20 ms; below `I/4`). Service-wide.
    pub fn lease_margin(mut self, margin: Duration) -> Self {
        self.settings.lease_margin = margin;
        self
    }

    /// The indexing mode (default [`Indexing::Ranked`]). Service-wide.
    pub fn indexing(mut self, indexing: Indexing) -> Self {
        self.settings.indexing = indexing;
        self
    }

    /// Who owns which partition (default [`Assignor::Modulo`]). Service-wide.
    pub fn assignor(mut self, assignor: Assignor) -> Self {
        self.settings.assignor = assignor;
        self
    }

    /// This instance's weight under [`Assignor::Rendezvous`], 1 to 1000
    /// (default 1).
    pub fn weight(mut self, weight: u32) -> Self {
        self.settings.weight = weight;
        self
    }

    /// Every setting at once (a consumer's own indexer).
    pub(crate) fn settings(mut self, settings: IndexerSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The wall clock to schedule rounds by (default [`SystemClock`]); tests
    /// give instances skewed clocks with it.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// A consumer's live values, for its members record and per-minute
    /// counts, sent with each round. Only a consumer sets it, so it also
    /// marks the consumer's own indexer, which shares the consumer's name
    /// (a standalone indexer may not, see [`Indexer::start`]).
    pub(crate) fn presence(mut self, presence: Arc<Presence>) -> Self {
        self.presence = Some(presence);
        self
    }

    /// A consumer's runtime beats here: a round while it is silent claims
    /// nothing ([`Liveness`]).
    pub(crate) fn liveness(mut self, liveness: Arc<Liveness>) -> Self {
        self.liveness = Some(liveness);
        self
    }

    /// This instance's id (default [`InstanceId::generate`]).
    pub fn instance_id(mut self, id: InstanceId) -> Self {
        self.instance_id = Some(id);
        self
    }

    /// Validates the settings. Nothing touches Redis yet.
    pub fn build(self) -> Result<Indexer> {
        let name = ServiceName::given(self.name.as_deref())?;
        self.settings.validate()?;
        // Errors name the URL; a pool's user (a consumer) names it itself.
        let redis = match &self.redis {
            Given {
                url: Some(_),
                pool: None,
                backend: None,
                ..
            }
            | Given {
                cluster: Some(_), ..
            } => Some(self.redis.target()),
            _ => None,
        };
        let backend = self.redis.backend()?;
        // A constant offset, drawn once: it keeps the order in which
        // instances act stable from interval to interval.
        let schedule = Schedule::drawn(
            self.settings.interval,
            self.settings.skew,
            rand::random::<f64>(),
        );
        Ok(Indexer {
            name,
            id: self.instance_id.unwrap_or_else(InstanceId::generate),
            schedule,
            settings: self.settings,
            clock: self.clock,
            backend,
            redis,
            presence: self.presence,
            liveness: self.liveness,
        })
    }
}
