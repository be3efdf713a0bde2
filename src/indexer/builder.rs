//! The peer indexer's builder: its settings, validated by
//! [`build`](IndexerBuilder::build) before anything touches Redis.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::schedule::Schedule;
use super::{Indexer, Liveness};
use crate::assignment::Assignor;
use crate::clock::{Clock, SystemClock};
use crate::config::{ServiceName, name_and_redis_setters};
use crate::connection::{self, Redis};
use crate::error::Result;
use crate::indexer::{IndexerSettings, Indexing};
use crate::instance::InstanceId;
use crate::meta::Kind;
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
    redis: Option<Redis>,
    instance_id: Option<InstanceId>,
    /// A consumer's live values, sent each round (`None`: a bare indexer).
    presence: Option<Arc<Presence>>,
    /// A consumer runtime's sign of life (`None`: a bare indexer).
    liveness: Option<Arc<Liveness>>,
    /// What runs under the name when it is not a consumer (default: an
    /// indexer).
    kind: Kind,
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
            redis: None,
            instance_id: None,
            presence: None,
            liveness: None,
            kind: Kind::Indexer,
        }
    }

    name_and_redis_setters! {
        name:
        /// The service name (required).
        redis:
        /// Where the service's Redis is (required): a URL, or a [`Redis`] for
        /// a Cluster (the service's keys are all on the master of `{name}`'s
        /// slot), a pool, TLS files or replicas to wait for (at most a tenth
        /// of the interval: a round they did not confirm is missed).
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

    /// Where the rounds keep the service's membership (default
    /// [`Membership::Redis`](crate::membership::Membership::Redis); `Membership::Etcd`
    /// with the `etcd` feature, docs/design.md §2.2). Service-wide.
    pub fn membership(mut self, membership: crate::membership::Membership) -> Self {
        self.settings.membership = membership;
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

    /// What runs under the name, when it is not a consumer: a standalone
    /// [`Singleton`](crate::singleton::Singleton) records itself as one.
    pub(crate) fn kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
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
        let given = connection::given(self.redis)?;
        self.settings.validate_wait(given.wait())?;
        // Errors name the URL; a pool's user (a consumer) names it itself.
        let redis = given.names_servers().then(|| given.to_string());
        let backend = given.backend()?;
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
            kind: self.kind,
        })
    }
}
