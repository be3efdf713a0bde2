//! [`Relay`]: moves a service's committed outbox rows to its Redis
//! (docs/design.md §10), alone or inside each consumer given a pool
//! (`ConsumerBuilder::outbox_relay`).
//!
//! Its loop: a pass over the lanes that hold rows (each lane's claim is
//! `lane`'s), again at once while a lane gave a full batch, then a wait for
//! a notification on `peerq_outbox` naming the service, or the poll
//! interval, whichever comes first. Any failure (Postgres or Redis away) is
//! logged and the pass tried again after a pause that doubles up to 30 s;
//! the relay stops only when told to.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use deadpool_redis::Pool;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tracing::{debug, info, warn};

use super::lane::{self, AfterSend, Claimed};
use crate::codec::{Bincode, Codec};
use crate::config::ServiceName;
use crate::connection::{Backend, Tls};
use crate::error::{Error, Result};
use crate::producer::{Producer, ProducerBuilder};
use crate::retry::Pauses;
use crate::task::TaskId;

/// The channel the outbox's trigger notifies, with the service as payload.
const CHANNEL: &str = "peerq_outbox";
/// Default rows per lane and transaction.
pub const DEFAULT_RELAY_BATCH: usize = 100;
/// Default wait between passes when no notification comes.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Pauses after a failed pass: 100 ms, doubling, at most 30 s.
const PAUSES: Pauses = Pauses::new(Duration::from_millis(100), Duration::from_secs(30));

/// Moves a service's committed outbox rows to its Redis.
///
/// ```no_run
/// # async fn demo() -> peerq::Result<()> {
/// use peerq::postgres::Relay;
///
/// let pool = sqlx::PgPool::connect("postgres://app@localhost/app").await?;
/// Relay::builder()
///     .postgres(pool)
///     .name("mail-sender")
///     .redis("redis://127.0.0.1/")
///     .build()?
///     .run() // until SIGTERM or ctrl-c
///     .await
/// # }
/// ```
///
/// Any number of relays of one service may run: each takes a lane at a
/// time under an advisory lock, so rows of one partition key are enqueued
/// in their order, with no leader.
#[derive(Debug)]
pub struct Relay<C: Codec = Bincode> {
    pool: PgPool,
    name: ServiceName,
    settings: Settings<C>,
}

/// Builds a [`Relay`].
#[must_use]
#[derive(Debug)]
pub struct RelayBuilder<C: Codec> {
    pool: Option<PgPool>,
    name: Option<String>,
    settings: Settings<C>,
}

/// A relay's settings besides its database and name.
struct Settings<C: Codec> {
    /// Its producer's: the Redis, the codec, the largest payload.
    producer: ProducerBuilder<C>,
    batch: usize,
    poll_interval: Duration,
    after_send: Option<AfterSend>,
}

impl<C: Codec> fmt::Debug for Settings<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("producer", &self.producer)
            .field("batch", &self.batch)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}

impl Relay<Bincode> {
    /// A builder with the defaults: bincode, batches of 100, a pass every
    /// second without notifications.
    pub fn builder() -> RelayBuilder<Bincode> {
        RelayBuilder {
            pool: None,
            name: None,
            settings: Settings {
                producer: Producer::builder(),
                batch: DEFAULT_RELAY_BATCH,
                poll_interval: DEFAULT_POLL_INTERVAL,
                after_send: None,
            },
        }
    }
}

impl<C: Codec> RelayBuilder<C> {
    /// The database of the outbox (required). The relay takes one of its
    /// connections for good (to listen for notifications) and one per
    /// lane's claim while it runs.
    pub fn postgres(mut self, pool: PgPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The service whose rows it relays (required).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The service's Redis at `url`.
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.settings.producer = self.settings.producer.redis(url);
        self
    }

    /// The service's Redis through this pool (takes precedence over
    /// [`redis`](Self::redis)).
    pub fn redis_pool(mut self, pool: Pool) -> Self {
        self.settings.producer = self.settings.producer.pool(pool);
        self
    }

    /// The service's Redis Cluster, by some of its nodes' URLs.
    pub fn redis_cluster<U: Into<String>>(mut self, urls: impl IntoIterator<Item = U>) -> Self {
        self.settings.producer = self.settings.producer.redis_cluster(urls);
        self
    }

    /// TLS settings for a `rediss://` Redis (feature `tls`).
    pub fn tls(mut self, tls: Tls) -> Self {
        self.settings.producer = self.settings.producer.tls(tls);
        self
    }

    /// The Redis another part of peerq connects to, with its partitions.
    pub(crate) fn backend(mut self, backend: Backend, partitions: u32) -> Self {
        self.settings.producer = self
            .settings
            .producer
            .backend(backend)
            .partitions(partitions);
        self
    }

    /// Rows claimed per lane and transaction (default 100; 1 to 10,000).
    pub fn batch(mut self, rows: usize) -> Self {
        self.settings.batch = rows;
        self
    }

    /// How long it waits for a notification before it looks at the
    /// outbox anyway (default 1 s; 10 ms to 1 h): a row inserted while
    /// the relay's listening connection was down is relayed within it.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.settings.poll_interval = interval;
        self
    }

    /// The largest payload it enqueues (default 1 MiB, as a producer's):
    /// larger rows go to the dead letters with reason `relay`.
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.settings.producer = self.settings.producer.max_payload(bytes);
        self
    }

    /// The service's codec (default [`Bincode`]): rows written with
    /// another go to the dead letters with reason `relay`.
    pub fn codec<D: Codec>(self, codec: D) -> RelayBuilder<D> {
        let Settings {
            producer,
            batch,
            poll_interval,
            after_send,
        } = self.settings;
        RelayBuilder {
            pool: self.pool,
            name: self.name,
            settings: Settings {
                producer: producer.codec(codec),
                batch,
                poll_interval,
                after_send,
            },
        }
    }

    /// Calls `hook` with the task ids of a claim's rows once they are in
    /// Redis, before they are deleted: for tests that kill a relay there.
    #[doc(hidden)]
    pub fn after_send(mut self, hook: impl Fn(&[TaskId]) + Send + Sync + 'static) -> Self {
        self.settings.after_send = Some(std::sync::Arc::new(hook));
        self
    }

    /// Validates the settings; connects nothing yet.
    pub fn build(self) -> Result<Relay<C>> {
        let name = ServiceName::given(self.name.as_deref())?;
        let pool = self.pool.ok_or_else(|| {
            Error::invalid(
                "postgres",
                "no pool given; call .postgres(pool) with the outbox's database",
            )
        })?;
        let mut settings = self.settings;
        if !(1..=10_000).contains(&settings.batch) {
            return Err(Error::invalid(
                "batch",
                format!("{} rows is out of range; use 1 to 10000", settings.batch),
            ));
        }
        let poll = Duration::from_millis(10)..=Duration::from_secs(3600);
        if !poll.contains(&settings.poll_interval) {
            return Err(Error::invalid(
                "poll_interval",
                format!(
                    "{:?} is out of range; use 10ms to 1h",
                    settings.poll_interval
                ),
            ));
        }
        settings.producer = settings.producer.name(name.as_str());
        Ok(Relay {
            pool,
            name,
            settings,
        })
    }
}

impl<C: Codec> Relay<C> {
    /// Runs until SIGTERM or ctrl-c.
    pub async fn run(self) -> Result<()> {
        self.run_until(crate::consumer::shutdown_signal()).await
    }

    /// Runs until `signal` resolves. A claim underway is then dropped: its
    /// transaction rolls back and its rows stay for the next relay, to
    /// which the rows it sent already are no-ops. (Waiting for it could
    /// hold a stopping consumer for as long as an unreachable database
    /// takes to time out.)
    ///
    /// Its Redis and Postgres need not be up: it connects, and claims,
    /// with a pause after each failure (100 ms doubling to 30 s), logging
    /// each failure. A producer's refusal (say, the service's codec is not
    /// the relay's) or a missing `peerq_outbox` (run the migrations) is
    /// logged as an error and tried again the same way, so it recovers
    /// once fixed. It returns `Ok` when stopped.
    pub async fn run_until(self, signal: impl Future<Output = ()> + Send) -> Result<()> {
        tokio::pin!(signal);
        let mut pauses = PAUSES;
        let producer = loop {
            let connected = tokio::select! {
                _ = &mut signal => return Ok(()),
                connected = self.settings.producer.clone().connect() => connected,
            };
            match connected {
                Ok(producer) => break producer,
                Err(e) => {
                    self.failed("connecting to redis", &e, pauses.upcoming());
                    tokio::select! {
                        _ = &mut signal => return Ok(()),
                        _ = pauses.wait() => {}
                    }
                }
            }
        };
        pauses.reset();
        info!(service = %self.name, "outbox relay started");
        let mut listener = None;
        loop {
            // A pass goes on while a lane gives full batches; a failure
            // pauses it.
            let passed = tokio::select! {
                _ = &mut signal => break,
                passed = self.pass(&producer) => passed,
            };
            let more = match passed {
                Ok(more) => {
                    pauses.reset();
                    more
                }
                Err(e) => {
                    self.failed("relaying", &e, pauses.upcoming());
                    tokio::select! {
                        _ = &mut signal => break,
                        _ = pauses.wait() => {}
                    }
                    continue;
                }
            };
            if more {
                continue;
            }
            tokio::select! {
                _ = &mut signal => break,
                _ = self.notified(&mut listener) => {}
                _ = tokio::time::sleep(self.settings.poll_interval) => {}
            }
        }
        info!(service = %self.name, "outbox relay stopped");
        Ok(())
    }

    /// One pass over the lanes that hold rows, from a random one on (so
    /// relays that start together spread over the lanes); whether any lane
    /// gave a full batch, so more may wait.
    async fn pass(&self, producer: &Producer<C>) -> Result<bool> {
        let mut lanes = lane::busy_lanes(&self.pool, self.name.as_str()).await?;
        if lanes.is_empty() {
            return Ok(false);
        }
        let start = rand::random_range(0..lanes.len());
        lanes.rotate_left(start);
        let mut more = false;
        for lane in lanes {
            let claimed = lane::claim(
                &self.pool,
                producer,
                self.name.as_str(),
                lane,
                self.settings.batch,
                self.settings.after_send.as_ref(),
            )
            .await?;
            more |= claimed == Claimed::Moved(self.settings.batch);
        }
        Ok(more)
    }

    /// Resolves on a notification for this service, or when the listening
    /// connection is lost (notifications may have been missed: a pass
    /// follows). Without a listener it makes one; while it cannot, it
    /// never resolves, and the poll interval takes over.
    async fn notified(&self, listener: &mut Option<PgListener>) {
        if listener.is_none() {
            match self.listen().await {
                Ok(made) => *listener = Some(made),
                Err(e) => {
                    // The passes say so when the database is away.
                    debug!(service = %self.name, cause = %e, "cannot listen for outbox notifications; polling");
                    return std::future::pending().await;
                }
            }
        }
        let Some(listening) = listener.as_mut() else {
            return;
        };
        loop {
            match listening.try_recv().await {
                Ok(Some(note)) if note.payload() == self.name.as_str() => return,
                Ok(Some(_)) => {}
                // Lost (a new connection is made on the next call), or
                // failed: either way, look at the outbox.
                Ok(None) => return,
                Err(e) => {
                    warn!(service = %self.name, cause = %e, "outbox notifications failed");
                    *listener = None;
                    return;
                }
            }
        }
    }

    /// A listener on [`CHANNEL`].
    async fn listen(&self) -> Result<PgListener> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        Ok(listener)
    }

    /// Logs a failure: a warning while it may pass, an error when it takes
    /// someone to fix it.
    fn failed(&self, what: &str, e: &Error, pause: Duration) {
        if e.is_transient() {
            warn!(service = %self.name, what, cause = %e, retry_in = ?pause, "outbox relay failed; trying again");
        } else {
            tracing::error!(service = %self.name, what, cause = %e, retry_in = ?pause, "outbox relay failed; trying again, but this needs fixing");
        }
    }
}
