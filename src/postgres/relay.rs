//! [`Relay`]: moves a service's committed outbox rows to its Redis
//! (docs/design.md §10), alone or inside each consumer given a pool
//! (`ConsumerBuilder::outbox_relay`).
//!
//! Its loop: a pass over the lanes that hold rows (each lane's claim is
//! `lane`'s), again at once while a lane gave a full batch, then a wait for
//! a notification on `peerq_outbox` naming the service, or the poll
//! interval, whichever comes first. Any failure (Postgres or Redis away) is
//! logged and the pass tried again after a pause that doubles up to 30 s;
//! the relay stops only when told to. At its start and then every minute, a
//! pass first sweeps the markers of relayed rows whose records were not yet
//! given their expiry (`lane::sweep`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::forget::Forgetting;
use super::lane::{self, Claimed, Claiming};
use crate::codec::{Bincode, Codec};
use crate::config::ServiceName;
use crate::connection::Redis;
use crate::entry::TaskId;
use crate::error::{Error, Result};
use crate::producer::{Producer, ProducerBuilder};
use crate::retry::Pauses;

/// The channel the outbox's trigger notifies, with the service as payload.
const CHANNEL: &str = "peerq_outbox";
/// Default rows per lane and transaction.
pub const DEFAULT_RELAY_BATCH: usize = 100;
/// Default wait between passes when no notification comes.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default time a relayed row's dedup record is kept once the row's delete
/// has committed.
pub const DEFAULT_RECORD_GRACE: Duration = lane::GRACE;
/// Pauses after a failed pass: 100 ms, doubling, at most 30 s.
const PAUSES: Pauses = Pauses::new(Duration::from_millis(100), Duration::from_secs(30));
/// How often a relay sweeps the markers a claim could not clear.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

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
    /// The timings came from [`test_timing`](Self::test_timing): not
    /// checked.
    test_timing: bool,
}

/// A relay's settings besides its database and name.
#[derive(Debug)]
struct Settings<C: Codec> {
    /// Its producer's: the Redis, the codec, the largest payload.
    producer: ProducerBuilder<C>,
    poll_interval: Duration,
    /// Its claims': the batch, the time to send, the records' grace.
    claiming: Claiming,
}

impl Relay<Bincode> {
    /// A builder with the defaults: bincode, batches of 100, a pass every
    /// second without notifications.
    pub fn builder() -> RelayBuilder<Bincode> {
        RelayBuilder {
            pool: None,
            name: None,
            test_timing: false,
            settings: Settings {
                producer: Producer::builder(),
                poll_interval: DEFAULT_POLL_INTERVAL,
                claiming: Claiming {
                    batch: DEFAULT_RELAY_BATCH,
                    sending: lane::SENDING,
                    grace: lane::GRACE,
                    ..Claiming::default()
                },
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

    /// The service's Redis (required): a URL, or a [`Redis`] for a
    /// Cluster, a pool, TLS files or replicas to wait for (as a producer
    /// does; docs/design.md §10).
    pub fn redis(mut self, redis: impl Into<Redis>) -> Self {
        self.settings.producer = self.settings.producer.redis(redis);
        self
    }

    /// The service's partitions (those of the consumer it runs in).
    pub(crate) fn partitions(mut self, partitions: u32) -> Self {
        self.settings.producer = self.settings.producer.partitions(partitions);
        self
    }

    /// Rows claimed per lane and transaction (default 100; 1 to 10,000).
    pub fn batch(mut self, rows: usize) -> Self {
        self.settings.claiming.batch = rows;
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
            poll_interval,
            claiming,
        } = self.settings;
        RelayBuilder {
            pool: self.pool,
            name: self.name,
            test_timing: self.test_timing,
            settings: Settings {
                producer: producer.codec(codec),
                poll_interval,
                claiming,
            },
        }
    }

    /// How long a relayed row's dedup record `{N/p}:dedup:outbox:<task
    /// id>` is kept once the row's delete has committed (default 15 min;
    /// 1 min to 7 days). Until then the record has no expiry, however long
    /// Postgres is away. The grace covers a Postgres failover that loses
    /// the delete's commit (asynchronous replication): relays that send
    /// the row again within it enqueue it once. It costs Redis about 230
    /// bytes per row relayed within the grace (docs/design.md §10): at
    /// 1,000 rows a second, 15 minutes hold about 200 MB.
    pub fn record_grace(mut self, grace: Duration) -> Self {
        self.settings.claiming.grace = grace;
        self
    }

    /// Calls `hook` with the task ids of a claim's rows once they are in
    /// Redis, before they are deleted: for tests that kill a relay there.
    #[doc(hidden)]
    pub fn after_send(mut self, hook: impl Fn(&[TaskId]) + Send + Sync + 'static) -> Self {
        self.settings.claiming.after_send = Some(std::sync::Arc::new(hook));
        self
    }

    /// Calls `hook` with a row's task id right before it is sent: for
    /// tests that freeze a relay there.
    #[doc(hidden)]
    pub fn before_send(mut self, hook: impl Fn(&TaskId) + Send + Sync + 'static) -> Self {
        self.settings.claiming.before_send = Some(std::sync::Arc::new(hook));
        self
    }

    /// A claim's time to send (20 s) and the records' grace, unchecked:
    /// for tests that outlast them. A grace below the time to send lets a
    /// relay frozen mid-claim send a row again.
    #[doc(hidden)]
    pub fn test_timing(mut self, sending: Duration, grace: Duration) -> Self {
        self.settings.claiming.sending = sending;
        self.settings.claiming.grace = grace;
        self.test_timing = true;
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
        let batch = settings.claiming.batch;
        if !(1..=10_000).contains(&batch) {
            return Err(Error::invalid(
                "batch",
                format!("{batch} rows is out of range; use 1 to 10000"),
            ));
        }
        let grace = Duration::from_secs(60)..=Duration::from_secs(7 * 24 * 3600);
        if !self.test_timing && !grace.contains(&settings.claiming.grace) {
            return Err(Error::invalid(
                "record_grace",
                format!(
                    "{:?} is out of range; use 1 min to 7 days (default 15 min)",
                    settings.claiming.grace
                ),
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
        self.run_until(crate::shutdown::signal()).await
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
        let (name, grace) = (self.name.as_str(), self.settings.claiming.grace);
        let forgetting = Forgetting::new(self.pool.clone(), Arc::new(producer), name, grace);
        let mut next_sweep = Instant::now();
        loop {
            // A pass goes on while a lane gives full batches; a failure
            // pauses it.
            let passed = tokio::select! {
                _ = &mut signal => break,
                passed = self.pass(&forgetting, &mut next_sweep) => passed,
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
    /// relays that start together spread over the lanes), after a sweep if
    /// `next_sweep` has come; whether any lane gave a full batch, so more
    /// may wait. Each claim's records start to expire beside the claims
    /// after it (`forgetting`).
    async fn pass(&self, forgetting: &Forgetting<C>, next_sweep: &mut Instant) -> Result<bool> {
        if Instant::now() >= *next_sweep {
            *next_sweep = Instant::now() + SWEEP_EVERY;
            match forgetting.sweep().await {
                Ok(0) => {}
                Ok(swept) => {
                    debug!(service = %self.name, swept, "relayed rows' dedup records left by earlier claims now expire")
                }
                // The pass says so if the database or Redis is away.
                Err(e) => {
                    debug!(service = %self.name, cause = %e, "cannot sweep the relayed rows' markers; trying again in a minute")
                }
            }
        }
        let mut lanes = lane::busy_lanes(&self.pool, self.name.as_str()).await?;
        if lanes.is_empty() {
            return Ok(false);
        }
        let start = rand::random_range(0..lanes.len());
        lanes.rotate_left(start);
        let mut more = false;
        let claiming = &self.settings.claiming;
        for lane in lanes {
            let producer = forgetting.producer();
            let claimed =
                lane::claim(&self.pool, producer, self.name.as_str(), lane, claiming).await?;
            if let Claimed::Moved(sent) = claimed {
                more |= sent.len() == claiming.batch;
                forgetting.start(sent);
            }
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
