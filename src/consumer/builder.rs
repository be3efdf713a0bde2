//! The consumer's builder: settings, the handler service, its layers.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use deadpool_redis::Pool;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tower::{Layer, Service};
use tracing::Instrument;

use super::event::PartitionEvent;
use super::runner::Runner;
use super::runtime;
use super::settings::ConsumerSettings;
use crate::assignment::Assignor;
use crate::clock::{Clock, SystemClock};
use crate::codec::{Bincode, Codec};
use crate::config::{IndexerSettings, Indexing, ServiceName};
use crate::connection::{Given, Tls, Wait};
use crate::error::{Error, Result};
use crate::handler::{BoxError, Handler, HandlerService, Task};
use crate::indexer::Standing;
use crate::instance::InstanceId;
use crate::periodic::{Periodic, Registered};
use crate::retry::Backoff;

/// Partition events kept for a slow receiver before it misses some.
const EVENTS_CAPACITY: usize = 16_384;

/// Builds and runs a consumer; see [`Consumer`](super::Consumer).
///
/// `T` is the task type, `S` the handler service (`()` until one is given),
/// `C` the codec.
#[must_use]
pub struct ConsumerBuilder<T, S, C> {
    name: Option<String>,
    redis: Given,
    indexer: IndexerSettings,
    settings: ConsumerSettings,
    service: S,
    /// Where the runtime publishes the instance's standing.
    standing: watch::Sender<Standing>,
    /// Where the runtime publishes partition events.
    events: broadcast::Sender<PartitionEvent>,
    /// Periodic jobs whose task did not encode, for `validate`.
    periodic_errors: Vec<String>,
    clock: Arc<dyn Clock>,
    /// Where to serve the HTTP endpoint (set only with the `http` feature).
    http: Option<SocketAddr>,
    /// The outbox's database, for a relay in the instance.
    #[cfg(feature = "postgres")]
    outbox: Option<sqlx::PgPool>,
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
            redis: Given::default(),
            indexer: IndexerSettings::default(),
            settings: ConsumerSettings::default(),
            service: (),
            standing: watch::Sender::new(Standing::Joining),
            events: broadcast::Sender::new(EVENTS_CAPACITY),
            periodic_errors: Vec::new(),
            clock: Arc::new(SystemClock),
            http: None,
            #[cfg(feature = "postgres")]
            outbox: None,
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

    /// The service name (required): instances with one name split one queue.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

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
    /// marks, round writes, acks), wait until `replicas` replicas of
    /// their master have them (`WAIT`), at most `timeout` (at most a tenth
    /// of the interval): a write they did not confirm counts as failed
    /// (the round is missed, the acks are sent again). Without it (the
    /// default) a failover can lose such a write: a task may then run
    /// twice, or two instances read different counts for a round
    /// (docs/design.md §8).
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.redis.wait = Some(Wait { replicas, timeout });
        self
    }

    /// The indexer's round interval `I` (default 1 s). Service-wide.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.indexer.interval = interval;
        self
    }

    /// The tolerated clock skew `S` (default 50 ms). Service-wide.
    pub fn skew(mut self, skew: Duration) -> Self {
        self.indexer.skew = skew;
        self
    }

    /// The lease margin (default 20 ms). Service-wide.
    pub fn lease_margin(mut self, margin: Duration) -> Self {
        self.indexer.lease_margin = margin;
        self
    }

    /// The indexing mode (default [`Indexing::Ranked`]). Service-wide.
    pub fn indexing(mut self, indexing: Indexing) -> Self {
        self.indexer.indexing = indexing;
        self
    }

    /// Who owns which partition (default [`Assignor::Modulo`]). Service-wide:
    /// [`Assignor::Rendezvous`] moves about `P / N` partitions per join or
    /// leave instead of most of them, and needs [`Indexing::Ranked`].
    pub fn assignor(mut self, assignor: Assignor) -> Self {
        self.indexer.assignor = assignor;
        self
    }

    /// This instance's weight, 1 to 1000 (default 1): under
    /// [`Assignor::Rendezvous`] instances own partitions in proportion to
    /// their weights (give a machine with twice the cores weight 2). Each
    /// instance's own; the others read it from the round's member list.
    pub fn weight(mut self, weight: u32) -> Self {
        self.indexer.weight = weight;
        self
    }

    /// The number of partitions `P` (default 64). Service-wide.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.settings.partitions = partitions;
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
    /// before they are cancelled and enqueued again (default 300 ms).
    /// Service-wide.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.settings.drain_timeout = timeout;
        self
    }

    /// Attempts of a task before it goes to the dead letters (default 5).
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
    /// the service enqueues `task` (encoded with the service's codec) into
    /// the job's partition, once across the service. The handler gets it
    /// like any task, with the id `cron:<job>:<due ms>`.
    ///
    /// ```no_run
    /// # async fn demo(builder: peerq::consumer::ConsumerBuilder<String, (), peerq::codec::Bincode>) -> peerq::Result<()> {
    /// use peerq::periodic::Periodic;
    /// builder
    ///     .periodic(Periodic::cron("nightly-report", "0 30 2 * * *")?, &"report".to_owned());
    /// # Ok(()) }
    /// ```
    pub fn periodic<P: serde::Serialize>(mut self, job: Periodic, task: &P) -> Self {
        match C::default().encode(task) {
            Ok(payload) => self.settings.periodic.push(Registered {
                job,
                codec: C::NAME,
                payload,
            }),
            Err(e) => self.periodic_errors.push(format!(
                "job `{}`: its task does not encode: {e}",
                job.name()
            )),
        }
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
    /// later consumers share it. `run` fails with [`Error::InvalidSetting`]
    /// naming `http` when `addr` cannot be bound, or when the application
    /// installed another recorder first (serve that one: peerq records
    /// through `metrics`).
    #[cfg(feature = "http")]
    pub fn http(mut self, addr: SocketAddr) -> Self {
        self.http = Some(addr);
        self
    }

    /// Runs an outbox relay in the instance (feature `postgres`): it moves
    /// the rows that [`Outbox::enqueue`](crate::postgres::Outbox::enqueue)
    /// wrote for this service into `pool`'s `peerq_outbox` to the
    /// instance's Redis, with its codec and partitions, and stops with the
    /// instance. Every instance may run one: the relays share the lanes
    /// without a leader (see [`Relay`](crate::postgres::Relay), which also
    /// runs alone). It takes one of the pool's connections for good and
    /// another while it claims rows.
    #[cfg(feature = "postgres")]
    pub fn outbox_relay(mut self, pool: sqlx::PgPool) -> Self {
        self.outbox = Some(pool);
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
            periodic_errors: self.periodic_errors,
            clock: self.clock,
            http: self.http,
            #[cfg(feature = "postgres")]
            outbox: self.outbox,
            task: PhantomData,
        }
    }

    /// The handler, adapted into a tower service.
    pub fn handler<H: Handler>(self, handler: H) -> ConsumerBuilder<H::Task, HandlerService<H>, C> {
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

    fn validate(&self) -> Result<ServiceName> {
        let name = ServiceName::given(self.name.as_deref())?;
        self.indexer.validate()?;
        if let Some(e) = self.periodic_errors.first() {
            return Err(Error::invalid("periodic", e.clone()));
        }
        self.settings.validate(&self.indexer)?;
        if let Some(wait) = self.redis.wait
            && wait.timeout > self.indexer.interval / 10
        {
            // WAIT holds the rounds' connection: a round must still end in
            // its window.
            return Err(Error::invalid(
                "wait_for_replicas",
                format!(
                    "a timeout of {:?} is more than a tenth of the interval ({:?})",
                    wait.timeout, self.indexer.interval
                ),
            ));
        }
        Ok(name)
    }
}

impl<T, S, C> ConsumerBuilder<T, S, C>
where
    T: DeserializeOwned + Send + 'static,
    S: Service<Task<T>, Response = ()> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    C: Codec,
{
    /// Validates the settings and runs until SIGTERM or ctrl-c, then leaves
    /// gracefully (docs/design.md §4 rule 7): it stops writing rounds, serves
    /// until the first round without it, then releases its partitions with
    /// marks, so the others take them over without waiting for a deadline.
    /// A second signal, or the [`leave_timeout`](Self::leave_timeout),
    /// leaves at once: running tasks are cancelled and enqueued again.
    ///
    /// Redis need not be up yet: while it cannot be reached (connection
    /// refused, a timeout, a name that does not resolve yet, Redis loading
    /// its data), the start is tried again with backoff (200 ms doubling to
    /// 10 s), with one warning per try, and a signal during that wait ends
    /// the run with `Ok`. It returns an error only for what retrying cannot
    /// fix: an invalid setting ([`Error::InvalidSetting`]), settings that
    /// differ from the service's `{N}:meta` ([`Error::SettingsMismatch`]),
    /// a `maxmemory-policy` that may evict keys (see
    /// [`allow_eviction`](Self::allow_eviction)), or a Redis that refuses
    /// this client, such as a wrong password or an ACL ([`Error::Connect`],
    /// naming the URL without its password).
    pub async fn run(self) -> Result<()> {
        self.start(runtime::shutdown_signal(), runtime::shutdown_signal)
            .await
    }

    /// Like [`run`](Self::run), but leaves gracefully when `signal`
    /// resolves (and at once after the leave timeout).
    pub async fn run_until(self, signal: impl Future<Output = ()> + Send) -> Result<()> {
        self.start(signal, std::future::pending).await
    }

    async fn start<F: Future<Output = ()> + Send>(
        self,
        signal: impl Future<Output = ()> + Send,
        again: impl FnOnce() -> F + Send,
    ) -> Result<()> {
        crate::logs::hint_if_unseen();
        let name = self.validate()?;
        let redis = self.redis.target();
        let backend = self.redis.backend()?;
        #[cfg(feature = "http")]
        let http = super::endpoint::Endpoint::start(
            self.http,
            self.standing.subscribe(),
            self.clock.clone(),
            crate::timing::Timing::new(&self.indexer, self.settings.drain_timeout),
        )
        .await?;
        #[cfg(feature = "postgres")]
        let relay = self
            .outbox
            .map(|pool| {
                crate::postgres::Relay::builder()
                    .postgres(pool)
                    .name(name.as_str())
                    .codec(C::default())
                    .backend(backend.clone(), self.settings.partitions)
                    .build()
            })
            .transpose()?;
        let id = InstanceId::generate();
        // Everything the instance logs, in every task it spawns, is within
        // this span.
        let span = tracing::info_span!("peerq", service = %name, instance = %id);
        // The relay runs beside the instance, and stops with it.
        #[cfg(feature = "postgres")]
        let stop_relay = tokio_util::sync::CancellationToken::new();
        #[cfg(feature = "postgres")]
        let relaying = relay.map(|relay| {
            let stop = stop_relay.clone().cancelled_owned();
            tokio::spawn(relay.run_until(stop).instrument(span.clone()))
        });
        // Boxed: the runtime's future is deeply nested, and the compiler's
        // query depth limit (128) counts that nesting inside the caller's
        // own future: unboxed, a plain `async fn main` calling `run()` may
        // fail to compile ("queries overflow the depth limit").
        let result = Box::pin(
            runtime::run(
                runtime::Parts {
                    name,
                    id,
                    redis,
                    backend,
                    indexer: self.indexer,
                    settings: self.settings,
                    runner: Runner::new::<T, S, C>(self.service),
                    standing: self.standing,
                    events: self.events,
                    clock: self.clock,
                },
                signal,
                again,
            )
            .instrument(span),
        )
        .await;
        #[cfg(feature = "http")]
        http.stop().await;
        #[cfg(feature = "postgres")]
        {
            stop_relay.cancel();
            if let Some(relaying) = relaying {
                // It only ever returns `Ok` once stopped.
                let _ = relaying.await;
            }
        }
        result
    }
}
