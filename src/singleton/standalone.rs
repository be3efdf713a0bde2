//! A singleton for a program that runs no consumer (docs/design.md §20):
//! its own peer indexer under a service name of its own (recorded as
//! `kind = singleton`, so that it never joins a consumer's or an
//! indexer's membership), and the singletons' driver.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, info, warn};

use super::{Declared, Setup, SingletonContext, Singletons};
use crate::clock::{Clock, SystemClock};
use crate::config::{ServiceName, fmt_duration, name_and_redis_setters};
use crate::connection::{self, Redis, SharedConnection};
use crate::error::{Error, Result};
use crate::gate;
use crate::handler::BoxError;
use crate::indexer::{Indexer, IndexerSettings, indexer_setters};
use crate::instance::InstanceId;
use crate::lease::Lease;
use crate::meta::{self, Kind};
use crate::retry::{self, Backoff};

/// A stop signal, as `crate::shutdown::signal` makes one.
type Signal = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// The default drain timeout, as a consumer's.
const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_millis(300);
/// Waits between starts while Redis cannot be reached.
const BACKOFF: Backoff = Backoff::exponential(Duration::from_millis(200), Duration::from_secs(10));

/// A singleton run by a program with no consumer: the job runs on exactly
/// one of the program's instances at a time. See [`Singleton::builder`].
#[derive(Debug)]
pub struct Singleton;

impl Singleton {
    /// A builder with the defaults.
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use peerq::singleton::{Singleton, SingletonContext};
    ///
    /// // On every instance of `feed-poller`; the job runs on one at a time,
    /// // as singleton `feed-poller`.
    /// Singleton::builder()
    ///     .name("feed-poller")
    ///     .redis("redis://127.0.0.1/")
    ///     .run(|cx: SingletonContext| async move {
    ///         while cx.still_owned() && !cx.is_cancelled() {
    ///             // poll the feed, write with cx.fencing_token() …
    ///             tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    ///         }
    ///         Ok::<_, std::io::Error>(())
    ///     })
    ///     .await
    /// # }
    /// ```
    pub fn builder() -> SingletonBuilder {
        SingletonBuilder {
            name: None,
            redis: None,
            indexer: IndexerSettings::default(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            clock: Arc::new(SystemClock),
            instance_id: None,
        }
    }
}

/// Builds and runs a standalone [`Singleton`].
#[must_use]
pub struct SingletonBuilder {
    name: Option<String>,
    redis: Option<Redis>,
    indexer: IndexerSettings,
    drain_timeout: Duration,
    clock: Arc<dyn Clock>,
    instance_id: Option<InstanceId>,
}

impl fmt::Debug for SingletonBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingletonBuilder")
            .field("name", &self.name)
            .field("redis", &self.redis)
            .field("indexer", &self.indexer)
            .field("drain_timeout", &self.drain_timeout)
            .finish_non_exhaustive()
    }
}

impl SingletonBuilder {
    name_and_redis_setters! {
        name:
        /// The service name (required), also the singleton's: a name of its
        /// own, not a consumer's or a standalone indexer's (refused by
        /// name at the start).
        redis:
        /// Where the service's Redis is (required), as for a consumer.
    }

    indexer_setters!();

    /// How long a job told to stop at a handover may still run before its
    /// future is dropped (default 300 ms; above 0, below `interval/2`).
    /// Service-wide.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// The wall clock (default [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// This instance's id (default [`InstanceId::generate`]).
    pub fn instance_id(mut self, id: InstanceId) -> Self {
        self.instance_id = Some(id);
        self
    }

    /// Runs `job` whenever this instance holds the singleton, until SIGTERM
    /// or ctrl-c; then leaves gracefully (the job is cancelled, and the
    /// next holder starts once its future has ended). A second signal, or
    /// `3 * interval + drain_timeout` after the first, leaves at once.
    pub async fn run<F, Fut, E>(self, job: F) -> Result<()>
    where
        F: Fn(SingletonContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.start(
            job,
            crate::shutdown::signal(),
            Some(crate::shutdown::signal),
        )
        .await
    }

    /// Like [`run`](Self::run), but leaves when `signal` resolves (and at
    /// once after the leave's time).
    pub async fn run_until<F, Fut, E>(
        self,
        job: F,
        signal: impl Future<Output = ()> + Send,
    ) -> Result<()>
    where
        F: Fn(SingletonContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.start(job, signal, None).await
    }

    async fn start<F, Fut, E>(
        self,
        job: F,
        signal: impl Future<Output = ()> + Send,
        again: Option<fn() -> Signal>,
    ) -> Result<()>
    where
        F: Fn(SingletonContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let name = ServiceName::given(self.name.as_deref())?;
        self.indexer.validate()?;
        if self.drain_timeout.is_zero() || self.drain_timeout >= self.indexer.interval / 2 {
            return Err(Error::invalid(
                "drain_timeout",
                format!(
                    "{} must be above 0 and below interval/2",
                    fmt_duration(self.drain_timeout)
                ),
            ));
        }
        let given = connection::given(self.redis)?;
        self.indexer.validate_wait(given.wait())?;
        let shown = given.to_string();
        let backend = given.backend()?;
        let id = self.instance_id.unwrap_or_else(InstanceId::generate);
        let span = tracing::info_span!("peerq", service = %name, instance = %id);
        let parts = Parts {
            declared: Declared::new(name.as_str(), job),
            name,
            id,
            shown,
            conn: Arc::new(SharedConnection::new(backend)),
            indexer: self.indexer,
            drain_timeout: self.drain_timeout,
            clock: self.clock,
        };
        Box::pin(parts.run(signal, again).instrument(span)).await
    }
}

struct Parts {
    name: ServiceName,
    id: InstanceId,
    shown: String,
    conn: Arc<SharedConnection>,
    indexer: IndexerSettings,
    drain_timeout: Duration,
    clock: Arc<dyn Clock>,
    declared: Declared,
}

impl Parts {
    async fn run(
        self,
        signal: impl Future<Output = ()> + Send,
        again: Option<fn() -> Signal>,
    ) -> Result<()> {
        tokio::pin!(signal);
        let started = retry::until_ok(
            BACKOFF,
            &mut signal,
            || self.start(),
            |e, wait| warn!(redis = %self.shown, cause = %e, retry_in = ?wait, "cannot reach redis; retrying"),
        )
        .await
        .map_err(|e| connection::at(&self.shown, e))?;
        let Some(indexer) = started else {
            return Ok(());
        };
        let timing = self.indexer.timing(self.drain_timeout);
        let (gate, _watcher) = gate::watch(
            self.name.clone(),
            self.conn.clone(),
            timing.interval.min(Duration::from_secs(1)),
        );
        let mut singletons = Singletons::spawn(Setup {
            service: self.name.clone(),
            id: self.id.clone(),
            conn: self.conn.clone(),
            timing,
            lease: Lease::new(self.clock.clone()),
            gate,
            standing: indexer.standing(),
            singletons: vec![self.declared.clone()],
        });
        info!("singleton instance started");
        let ended = tokio::select! {
            _ = &mut signal => false,
            _ = singletons.ended() => true,
        };
        if ended {
            indexer.stop().await;
            return Err(Error::Runtime(format!(
                "the peer indexer of `{}` stopped unexpectedly",
                self.name
            )));
        }
        info!("leaving: cancelling the job once this instance is out of the rounds");
        indexer.leave();
        let leave_by = Instant::now() + 3 * timing.interval + timing.drain_timeout;
        let again = async move {
            match again {
                Some(make) => make().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = singletons.ended() => {}
            _ = tokio::time::sleep_until(leave_by) => {
                warn!("graceful leave timed out; leaving at once");
                singletons.leave_at_once();
            }
            _ = again => {
                warn!("second signal: leaving at once");
                singletons.leave_at_once();
            }
        }
        singletons
            .finished(Instant::now() + Duration::from_secs(1))
            .await;
        indexer.stop().await;
        info!("stopped");
        Ok(())
    }

    /// One start: the service's settings checked (and recorded if first),
    /// then the rounds.
    async fn start(&self) -> Result<crate::indexer::IndexerHandle> {
        let started = self.attempt().await;
        if started.as_ref().is_err_and(Error::is_transient) {
            // A connection that failed half way may be broken: the next
            // attempt takes a fresh one (as a consumer's start does).
            self.conn.reset();
        }
        started
    }

    async fn attempt(&self) -> Result<crate::indexer::IndexerHandle> {
        let mut conn = self.conn.get().await?;
        // A queue's name that only producers used (they record partitions
        // and no `kind`) is refused before anything is written there (the
        // script records every absent field); a consumer's or an indexer's
        // is refused on its `kind` below, also before any write.
        let mut read = deadpool_redis::redis::cmd("HMGET");
        read.arg(crate::keys::meta(&self.name))
            .arg(meta::KIND)
            .arg("partitions");
        let (kind, partitions): (Option<String>, Option<String>) =
            read.query_async(&mut conn).await?;
        if kind.is_none() && partitions.is_some() {
            return Err(Error::invalid(
                "name",
                format!(
                    "`{}` is a queue's name (its producers recorded partitions in `{}`): a \
                     standalone singleton needs a name of its own, or runs in the consumers \
                     with `ConsumerBuilder::singleton`",
                    self.name,
                    crate::keys::meta(&self.name)
                ),
            ));
        }
        // The kind first and alone: a standalone indexer's name is refused
        // before the drain timeout is written there.
        meta::ensure(&mut conn, &self.name, &[Kind::Singleton.field()]).await?;
        let fields = [("drain_timeout", fmt_duration(self.drain_timeout))];
        meta::ensure(&mut conn, &self.name, &fields).await?;
        drop(conn);
        Indexer::builder()
            .name(self.name.as_str())
            .redis(Redis::built(self.conn.backend().clone(), &self.shown))
            .settings(self.indexer.clone())
            .clock(self.clock.clone())
            .instance_id(self.id.clone())
            .kind(Kind::Singleton)
            .build()?
            .start()
            .await
    }
}
