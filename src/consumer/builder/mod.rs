//! The consumer's builder: settings, the handler service, its layers.
//! The settings shared with the peer indexer ([`indexing`]), the periodic jobs it is given ([`periodic`]) and the run
//! ([`run`]) have rooms of their own.

mod indexing;
mod limits;
mod periodic;
#[cfg(feature = "postgres")]
mod postgres;
mod run;
mod singleton;
#[cfg(feature = "otel")]
mod trace;
mod tracking;

use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use tokio::sync::{broadcast, watch};
use tower::{Layer, Service};

use super::event::PartitionEvent;
use super::settings::ConsumerSettings;
use crate::assignment::Standing;
use crate::clock::{Clock, SystemClock};
use crate::codec::{Bincode, Codec};
use crate::config::{ServiceName, name_and_redis_setters};
use crate::connection::Redis;
use crate::error::Result;
#[cfg(doc)]
use crate::handler::Handler;
use crate::handler::{HandlerService, HandlerWithResult, Task};
use crate::indexer::IndexerSettings;
use crate::periodic::Periodic;
use crate::retry::Backoff;
use periodic::GivenJob;

/// Partition events kept for a slow receiver before it misses some.
const EVENTS_CAPACITY: usize = 16_384;

/// Builds and runs a consumer; see [`Consumer`](super::Consumer).
///
/// `T` is the task type, `S` the handler service (`()` until one is given),
/// `C` the codec.
#[must_use]
pub struct ConsumerBuilder<T, S, C> {
    name: Option<String>,
    redis: Option<Redis>,
    indexer: IndexerSettings,
    settings: ConsumerSettings,
    service: S,
    /// Where the runtime publishes the instance's standing.
    standing: watch::Sender<Standing>,
    /// Where the runtime publishes partition events.
    events: broadcast::Sender<PartitionEvent>,
    /// Periodic jobs, their tasks encoded with every codec: the one the
    /// consumer runs with is known only when it starts (`.codec` may
    /// come after `.periodic`).
    periodic: Vec<GivenJob>,
    clock: Arc<dyn Clock>,
    /// Where to serve the HTTP endpoint (set only with the `http` feature).
    http: Option<SocketAddr>,
    /// The outbox's and the inbox's databases.
    #[cfg(feature = "postgres")]
    postgres: postgres::PostgresParts,
    /// The function of the task the limits per key count by: an
    /// `Arc<dyn Fn(&T) -> Option<String>>` of the task type it was given
    /// for (checked at the start, as the handler may change the type).
    limit_key: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// The singletons this instance may hold (docs/design.md §20).
    singletons: Vec<crate::singleton::Declared>,
    task: PhantomData<fn() -> (T, C)>,
}

impl<T, S, C: Codec> fmt::Debug for ConsumerBuilder<T, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("name", &self.name)
            .field("redis", &self.redis)
            .field("indexer", &self.indexer)
            .field("settings", &self.settings)
            .field("codec", &C::NAME)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl ConsumerBuilder<(), (), Bincode> {
    pub(super) fn new() -> Self {
        ConsumerBuilder {
            name: None,
            redis: None,
            indexer: IndexerSettings::default(),
            settings: ConsumerSettings::default(),
            service: (),
            standing: watch::Sender::new(Standing::Joining),
            events: broadcast::Sender::new(EVENTS_CAPACITY),
            periodic: Vec::new(),
            clock: Arc::new(SystemClock),
            http: None,
            #[cfg(feature = "postgres")]
            postgres: postgres::PostgresParts::default(),
            limit_key: None,
            singletons: Vec::new(),
            task: PhantomData,
        }
    }
}

impl<T, S, C: Codec> ConsumerBuilder<T, S, C> {
    /// A receiver of the instance's standing once it runs: its assignment
    /// (index, replicas, epoch) or why it has none. For status displays and
    /// health checks.
    pub fn standing(&self) -> watch::Receiver<Standing> {
        self.standing.subscribe()
    }

    /// A receiver of the instance's partition events once it runs: each
    /// partition acquired (with its fencing token), stopped and drained,
    /// with the time. For status displays and for measuring handover
    /// pauses. A receiver more than 16,384 events behind misses the oldest.
    pub fn partition_events(&self) -> broadcast::Receiver<PartitionEvent> {
        self.events.subscribe()
    }

    name_and_redis_setters! {
        name:
        /// The service name (required): instances with one name split one queue.
        redis:
        /// Where the service's Redis is (required): a URL (`redis://`,
        /// `rediss://`, with user and password), or a [`Redis`] for a Cluster,
        /// a pool, TLS files or replicas to wait for. With
        /// [`Redis::wait_for_replicas`], the writes a failover must not lose
        /// (owner records, release marks, round writes, acks) wait for the
        /// replicas, at most a tenth of the interval: a round they did not
        /// confirm is missed, acks are sent again until they do, and a drain's
        /// release mark waits for its acks. Blocking reads get connections of
        /// their own, to the same server (on a Cluster, each idle partition to
        /// the master of its slot).
    }

    /// The number of partitions `P` of a new service (default: the
    /// service's, recorded in `{N}:meta` by its first producer or
    /// consumer; 64 for a new one). Service-wide: given, it must be the
    /// service's.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.settings.partitions = partitions;
        self.settings.partitions_given = true;
        self
    }

    /// Handlers running at once per instance (default 64). Tasks whose
    /// handler has finished and whose ack is on its way do not count; they
    /// have a bound of their own (the larger of this and 16,384).
    pub fn concurrency(mut self, tasks: usize) -> Self {
        self.settings.concurrency = tasks;
        self
    }

    /// Most entries read in one round trip (default 64).
    pub fn batch(mut self, entries: usize) -> Self {
        self.settings.batch = entries;
        self
    }

    /// How long a read waits for new entries (default 1 s).
    pub fn block(mut self, block: Duration) -> Self {
        self.settings.block = block;
        self
    }

    /// How long released partitions' running tasks may take to finish
    /// before they are interrupted and enqueued again (default 300 ms).
    /// Service-wide.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.settings.drain_timeout = timeout;
        self
    }

    /// Failed runs of a task before it goes to the dead letters (default
    /// 5): its `max_attempts`-th failure dead-letters it. Runs interrupted
    /// by a drain timeout, a lapsed lease or a leave at once do not count
    /// (they count in [`TaskContext::attempt`](crate::TaskContext::attempt),
    /// not in [`failures`](crate::TaskContext::failures)).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.max_attempts = attempts;
        self
    }

    /// The wait between a task's failed attempt and the next (default:
    /// 1 s, doubling, at most 5 min, with jitter). A handler error can ask
    /// for another delay or for none ([`HandlerError::retry_after`],
    /// [`HandlerError::permanent`]).
    ///
    /// [`HandlerError::retry_after`]: crate::HandlerError::retry_after
    /// [`HandlerError::permanent`]: crate::HandlerError::permanent
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.settings.backoff = backoff;
        self
    }

    /// Ordered partitions (default false: concurrent): each partition's
    /// tasks run one at a time in stream order, so tasks with one key run
    /// in enqueue order. A failed task is retried in place after its
    /// backoff, blocking its partition; across a handover the next owner
    /// runs what was left pending first. Throughput per partition is one
    /// task at a time. Service-wide.
    pub fn ordered(mut self, ordered: bool) -> Self {
        self.settings.ordered = ordered;
        self
    }

    /// Registers a periodic job: at each of its due times, one instance of
    /// the service enqueues `task` (encoded with the service's codec, the
    /// one the consumer runs with, whether [`codec`](Self::codec) comes
    /// before or after this call; one it does not encode with is an
    /// [`Error::InvalidSetting`](crate::Error::InvalidSetting) naming
    /// `periodic` and the job) into the job's partition, once across the
    /// service. The handler gets it
    /// like any task, with the id `cron:<job>:<due ms>`.
    ///
    /// ```no_run
    /// # async fn demo(builder: peerq::consumer::ConsumerBuilder<String, (), peerq::Bincode>) -> peerq::Result<()> {
    /// use peerq::Periodic;
    /// builder
    ///     .periodic(Periodic::cron("nightly-report", "0 30 2 * * *")?, &"report".to_owned());
    /// # Ok(()) }
    /// ```
    pub fn periodic<P: serde::Serialize>(mut self, job: Periodic, task: &P) -> Self {
        self.periodic.push(GivenJob::new(job, task));
        self
    }

    /// Idle time after which an entry left pending on another consumer (a
    /// crashed instance) is claimed by the partition's owner (default 30 s).
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.settings.claim_idle = idle;
        self
    }

    /// How long a graceful leave may take before the instance leaves at
    /// once (default `3 * interval + drain_timeout`): a leave waits for the
    /// first round without this instance (one to two intervals), then
    /// drains and marks its partitions. A second SIGTERM also leaves at
    /// once.
    pub fn leave_timeout(mut self, timeout: Duration) -> Self {
        self.settings.leave_timeout = Some(timeout);
        self
    }

    /// The wall clock the instance's rounds, deadlines and leases follow
    /// (default [`SystemClock`]); tests give instances skewed clocks.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Run even though Redis's `maxmemory-policy` may evict keys (default
    /// false: eviction can silently drop tasks and coordination keys).
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.settings.allow_eviction = allow;
        self
    }

    /// The largest stream entry this instance runs, in bytes: its field
    /// names and values together (default 4 MiB; 1 KiB to 512 MiB). A
    /// larger entry, which anyone with `XADD` on the stream can add, goes
    /// to the dead letters with reason `too_large` as it is, without its
    /// payload being decoded; raise the limit and replay it to run it. Keep
    /// it above the producers' `max_payload` plus a few hundred bytes.
    pub fn max_entry_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_entry_bytes = bytes;
        self
    }

    /// Serves HTTP at `addr` while [`run`](Self::run) runs (feature `http`):
    /// `GET /metrics` (Prometheus text), `GET /health/live` (200 while rounds
    /// keep coming, at most 3 intervals and 2 s apart) and `GET
    /// /health/ready` (200 while assigned with a lease that holds; else 503
    /// with `{"ready":false,"reason":…}`). The first endpoint of the process
    /// installs a Prometheus recorder as the global `metrics` recorder, and
    /// later consumers share it. `run` fails with
    /// [`Error::InvalidSetting`](crate::Error::InvalidSetting) naming `http`
    /// when `addr` cannot be bound, or when the application
    /// installed another recorder first (serve that one: peerq records
    /// through `metrics`).
    #[cfg(feature = "http")]
    pub fn http(mut self, addr: SocketAddr) -> Self {
        self.http = Some(addr);
        self
    }

    /// The codec (default [`Bincode`]). Service-wide.
    pub fn codec<D: Codec>(self, _codec: D) -> ConsumerBuilder<T, S, D> {
        self.map_service(|service| service)
    }

    /// The same settings with the service mapped by `f` (and another task
    /// type or codec).
    fn map_service<T2, S2, C2>(self, f: impl FnOnce(S) -> S2) -> ConsumerBuilder<T2, S2, C2> {
        ConsumerBuilder {
            name: self.name,
            redis: self.redis,
            indexer: self.indexer,
            settings: self.settings,
            service: f(self.service),
            standing: self.standing,
            events: self.events,
            periodic: self.periodic,
            clock: self.clock,
            http: self.http,
            #[cfg(feature = "postgres")]
            postgres: self.postgres,
            limit_key: self.limit_key,
            singletons: self.singletons,
            task: PhantomData,
        }
    }

    /// The handler, adapted into a tower service: a [`Handler`], or a
    /// [`HandlerWithResult`] whose results tracking keeps.
    pub fn handler<H: HandlerWithResult>(
        self,
        handler: H,
    ) -> ConsumerBuilder<H::Task, HandlerService<H>, C> {
        self.service(HandlerService::new(handler))
    }

    /// Any tower service of [`Task<T>`] as the handler.
    ///
    /// It is cloned for each task (as tower's `ConcurrencyLimit` expects), so
    /// it must be `Clone + Send + Sync`; wrap a service that is not (such as
    /// `RateLimit`) in `tower::buffer::BufferLayer`.
    pub fn service<T2, S2>(self, service: S2) -> ConsumerBuilder<T2, S2, C>
    where
        S2: Service<Task<T2>>,
    {
        self.map_service(|_| service)
    }

    /// Wraps the handler service in a tower layer (timeouts, limits, …).
    /// Layers added later wrap the ones added before.
    ///
    /// Call it after [`handler`](Self::handler) or [`service`](Self::service):
    /// a layer needs the service it wraps.
    pub fn layer<L>(self, layer: L) -> ConsumerBuilder<T, L::Service, C>
    where
        L: Layer<S>,
        S: Service<Task<T>>,
    {
        self.map_service(|service| layer.layer(service))
    }

    /// Validates the settings, with the periodic jobs' tasks encoded by
    /// the codec the builder has now: the one the consumer runs with.
    fn validate(&mut self) -> Result<ServiceName> {
        let name = ServiceName::given(self.name.as_deref())?;
        self.indexer.validate()?;
        self.settings.periodic = self
            .periodic
            .iter()
            .map(GivenJob::registered::<C>)
            .collect::<Result<_>>()?;
        self.settings.validate(&self.indexer)?;
        crate::singleton::check(&self.singletons)?;
        #[cfg(feature = "postgres")]
        self.postgres.validate()?;
        self.indexer
            .validate_wait(self.redis.as_ref().and_then(Redis::wait))?;
        Ok(name)
    }
}
