//! Enqueues typed tasks (docs/design.md §1, §3).
//!
//! A task goes to partition `fnv1a64(key) % P` (see [`crate::partition_of`]),
//! where the key is the task id unless the producer gives one: tasks with
//! one key land in one partition, in enqueue order.
//!
//! - [`Producer`] (here): what a caller holds, and the entry every path
//!   builds;
//! - `options`: how one task is enqueued ([`Options`]);
//! - `send`: one task, a plain `XADD` (tracked, its record just before) or
//!   the enqueue script;
//! - `batch`: many tasks, each with its options or none;
//! - `records`: a tracked batch's `waiting` records;
//! - `stored`: what the outbox relay sends: a stored task under its own
//!   id, or its dead letter (feature `postgres`);
//! - `workflow`: batches with a callback (docs/design.md §19): open, add
//!   members, seal;
//! - `builder`: the settings, checked against the service's `{N}:meta`.

mod across;
mod batch;
mod builder;
mod options;
mod records;
mod route;
mod send;
#[cfg(feature = "postgres")]
mod stored;
mod workflow;

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::codec::{Bincode, Codec};
use crate::config::ServiceName;
use crate::connection::{Redis, SharedConnection};
use crate::entry::{Entry, TaskId};
use crate::error::{BatchDuplicates, Error, Result};
use crate::priority::{Levels, Priority};
use crate::tracking::TaskHandle;
use crate::tracking::watch::Cached;

pub use builder::ProducerBuilder;
pub use options::Options;
#[cfg(feature = "postgres")]
pub(crate) use stored::{Sent, Stored};
pub use workflow::{
    BatchBuilder, ChainBuilder, DEFAULT_BATCH_EXPIRY, DEFAULT_BATCH_KEEP, Flow, OpenBatch,
};

/// Default largest encoded payload a producer accepts.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// Default time an idempotency key is remembered.
pub const DEFAULT_IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);

/// Enqueues tasks of any serde type into a service's partition streams.
///
/// ```no_run
/// # async fn demo() -> peerq::Result<()> {
/// use peerq::producer::{Options, Producer};
///
/// #[derive(serde::Serialize)]
/// struct Mail { to: String, body: String }
///
/// let producer = Producer::connect("redis://127.0.0.1/", "mail-sender").await?;
/// let id = producer.enqueue(&Mail { to: "a@example.com".into(), body: "hi".into() }).await?;
/// producer.enqueue_with(&Mail { to: "b@example.com".into(), body: "1".into() },
///                       Options::new().key("user-42")).await?;
/// let ids = producer.enqueue_batch(&[
///     Mail { to: "c@example.com".into(), body: "2".into() },
///     Mail { to: "d@example.com".into(), body: "3".into() },
/// ]).await?;
/// # Ok(()) }
/// ```
pub struct Producer<C: Codec = Bincode> {
    name: ServiceName,
    /// The one connection, for single tasks and batches alike.
    conn: SharedConnection,
    /// The generation it writes (docs/design.md §21), replaced when a
    /// reshard sealed a partition it wrote to.
    route: std::sync::RwLock<std::sync::Arc<route::Route>>,
    /// The service's first generation's partitions (`{N}:meta`'s), which
    /// also place batch records.
    partitions: u32,
    /// The service's priority levels, as last read from `{N}:meta` (read
    /// again when a task asks for a level not in them: the consumers may
    /// have recorded them since).
    levels: std::sync::RwLock<Levels>,
    codec: C,
    max_payload: usize,
    idempotency_ttl: Duration,
    /// Whether tasks are tracked, as last read.
    tracking: Cached,
    /// Whether this producer loaded the enqueue script into Redis: a
    /// batch's scripted tasks go as `EVALSHA` in its parts, which do not
    /// load it, and one sent again after a `NOSCRIPT` would land after the
    /// tasks behind it.
    script_loaded: std::sync::atomic::AtomicBool,
    /// Tasks enqueued, and failed calls.
    enqueued: metrics::Counter,
    errors: metrics::Counter,
}

impl<C: Codec> fmt::Debug for Producer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("name", &self.name)
            .field("partitions", &self.partitions)
            .field("codec", &C::NAME)
            .finish_non_exhaustive()
    }
}

impl Producer<Bincode> {
    /// Connects a bincode producer to service `name` on `redis` (a URL,
    /// or a [`Redis`]), with the service's partitions (read from
    /// `{name}:meta`; 64 for a new service). A service whose codec is JSON
    /// needs a JSON producer, which [`builder`](Self::builder) makes; see
    /// [`ProducerBuilder::connect`] for the errors.
    pub async fn connect(redis: impl Into<Redis>, name: &str) -> Result<Self> {
        Producer::builder().redis(redis).name(name).connect().await
    }

    /// A builder with the defaults: bincode, the service's partitions.
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use peerq::Producer;
    /// use peerq::Json;
    ///
    /// // For a service whose consumers run with `.codec(Json)`.
    /// let producer = Producer::builder()
    ///     .redis("redis://127.0.0.1/")
    ///     .name("mail-sender")
    ///     .codec(Json)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder() -> ProducerBuilder<Bincode> {
        ProducerBuilder::new()
    }
}

impl<C: Codec> Producer<C> {
    /// Enqueues one task; returns its id.
    pub async fn enqueue<T: Serialize>(&self, task: T) -> Result<TaskId> {
        self.enqueue_with(task, Options::new()).await
    }

    /// Enqueues one task with options; returns its id (with an
    /// idempotency key already used, the earlier task's id). With a unique
    /// key another task holds, it enqueues nothing and returns
    /// [`Error::Duplicate`], which names that task; a unique key beside a
    /// different partition key is an [`Error::InvalidSetting`] naming
    /// `unique`.
    pub async fn enqueue_with<T: Serialize>(&self, task: T, options: Options) -> Result<TaskId> {
        let sent = self.send(task, options).await;
        match &sent {
            // A repeat of an idempotency key returns the earlier task's id
            // and enqueues nothing.
            Ok((_, true)) => self.enqueued.increment(1),
            Ok(_) => {}
            // A refusal for a unique key is an answer, not a failure.
            Err(Error::Duplicate(_)) => {}
            Err(_) => self.errors.increment(1),
        }
        sent.map(|(id, _)| id)
    }

    /// Enqueues many tasks, pipelined; returns their ids in the tasks'
    /// order. A task that does not encode, or is over the size limit,
    /// fails the whole batch before anything is sent.
    ///
    /// The tasks then go out in parts of 128, each sent while the next is
    /// built, so Redis adds the first ones while the rest are on their way.
    /// An error from Redis is therefore ambiguous: some parts, or some
    /// tasks within a part, may have been applied and others not (and a
    /// lost reply after Redis applied a part looks the same as a lost
    /// request), so retrying the batch may enqueue tasks twice. The call
    /// returns once every part is answered, with a failed part's error if
    /// any failed. A call dropped before it returns may likewise have
    /// enqueued some of its parts.
    pub async fn enqueue_batch<T: Serialize>(&self, tasks: &[T]) -> Result<Vec<TaskId>> {
        let sent = self.send_batch(tasks).await;
        match &sent {
            Ok(ids) => self.enqueued.increment(ids.len() as u64),
            Err(_) => self.errors.increment(1),
        }
        sent
    }

    /// Enqueues many tasks, each with its options (a partition key, an
    /// idempotency key, a unique key, a delay), pipelined as
    /// [`enqueue_batch`] does; returns their ids in the tasks' order (for a
    /// repeat of an idempotency key, the earlier task's id). Tasks refused
    /// for their unique keys (held by tasks not final yet) make it return
    /// [`Error::DuplicatesInBatch`], which holds every task's id (the
    /// holder's for a refused one) and names the refused; the other tasks
    /// were enqueued. Tasks without options, or
    /// with a partition key only, cost what they cost in
    /// [`enqueue_batch`]; the others go through the enqueue script, in the
    /// same parts, so tasks with one key land in the batch's order (unless
    /// Redis lost its scripts, a restart, since this producer loaded the
    /// enqueue script: those tasks are then sent again after the rest of
    /// the batch, with a warning).
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use std::time::Duration;
    /// use peerq::producer::{Options, Producer};
    ///
    /// let producer = Producer::connect("redis://127.0.0.1/", "mail-sender").await?;
    /// let ids = producer
    ///     .enqueue_batch_with(&[
    ///         ("welcome", Options::new().key("user-42")),
    ///         ("reminder", Options::new().key("user-42").delay(Duration::from_secs(3600))),
    ///         ("receipt", Options::new().idempotency_key("order-1041")),
    ///     ])
    ///     .await?;
    /// assert_eq!(ids.len(), 3);
    /// # Ok(()) }
    /// ```
    ///
    /// [`enqueue_batch`]: Self::enqueue_batch
    pub async fn enqueue_batch_with<T: Serialize>(
        &self,
        tasks: &[(T, Options)],
    ) -> Result<Vec<TaskId>> {
        let sent = self.send_batch_with(tasks).await;
        match &sent {
            Ok(sent) => self.enqueued.increment(sent.new as u64),
            Err(_) => self.errors.increment(1),
        }
        let sent = sent?;
        if sent.refused.is_empty() {
            return Ok(sent.ids);
        }
        Err(Error::DuplicatesInBatch(Box::new(BatchDuplicates {
            ids: sent.ids,
            refused: sent.refused,
        })))
    }

    /// The service's number of partitions (per level) in the layout this
    /// producer writes (docs/design.md §21).
    pub fn partitions(&self) -> u32 {
        self.route().current.partitions
    }

    /// The handle of task `id` enqueued with partition key `key` (`None`:
    /// without one), for [`Service::task`](crate::admin::Service::task),
    /// `wait` and `cancel`.
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use peerq::producer::{Options, Producer};
    ///
    /// let producer = Producer::connect("redis://127.0.0.1/", "mail-sender").await?;
    /// let id = producer.enqueue_with("hi", Options::new().key("user-42")).await?;
    /// println!("enqueued {}", producer.handle_of(&id, Some("user-42")));
    /// # Ok(()) }
    /// ```
    pub fn handle_of(&self, id: &TaskId, key: Option<&str>) -> TaskHandle {
        let key = key.unwrap_or(id.as_str());
        TaskHandle::new(self.route().current.route(key.as_bytes(), 0), id.clone())
    }

    /// The handle of task `id` enqueued with `options` (its partition key,
    /// unique or idempotency key, and priority level); see
    /// [`handle_of`](Self::handle_of). A level the service lacks gives the
    /// normal level's partition (such an enqueue was refused).
    pub fn handle_with(&self, id: &TaskId, options: &Options) -> TaskHandle {
        let key = options.partition_key().unwrap_or(id.as_str()).as_bytes();
        let p = self
            .place_at(key, options.priority)
            .unwrap_or_else(|_| self.route().current.route(key, 0));
        TaskHandle::new(p, id.clone())
    }

    /// A first attempt of `task` with a new id, or the error of
    /// [`payload`](Self::payload).
    fn entry<T: Serialize>(&self, task: &T, key: Option<String>) -> Result<Entry> {
        let payload = self.payload(task)?;
        Ok(Entry::new(TaskId::generate(), key, C::NAME, payload))
    }

    /// `task` encoded, or the error that fails its enqueue before anything
    /// is sent: it does not encode, or it is over `max_payload`.
    pub(super) fn payload<T: Serialize>(&self, task: &T) -> Result<Vec<u8>> {
        let payload = self.codec.encode(task)?;
        if payload.len() > self.max_payload {
            return Err(Error::PayloadTooLarge {
                size: payload.len(),
                limit: self.max_payload,
            });
        }
        Ok(payload)
    }

    /// The partition `entry` goes to at the normal level (the outbox
    /// relay's: its rows have no level).
    #[cfg(feature = "postgres")]
    fn partition_of(&self, entry: &Entry) -> u32 {
        self.route()
            .current
            .route(entry.partition_key().as_bytes(), 0)
    }

    /// The partition of a task placed by `key` at `level`; refused
    /// naming `priority` when the service has no such level.
    fn place_at(&self, key: &[u8], level: Priority) -> Result<u32> {
        self.place_in(&self.route(), key, level)
    }

    /// [`place_at`](Self::place_at) in `route`'s generation.
    fn place_in(&self, route: &route::Route, key: &[u8], level: Priority) -> Result<u32> {
        self.place_gen(route.current, key, level)
    }

    /// [`place_at`](Self::place_at) in generation `current`.
    fn place_gen(
        &self,
        current: crate::reshard::Generation,
        key: &[u8],
        level: Priority,
    ) -> Result<u32> {
        if level == Priority::Normal {
            return Ok(current.route(key, 0));
        }
        let index = self
            .levels
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .place(key, level, current.partitions)?;
        Ok(crate::partition::unit(current.number, index))
    }

    /// Makes sure the levels `wanted` are known: reads `{N}:meta`'s
    /// levels again when one is not (a producer may have connected before
    /// the service's first consumer recorded them).
    pub(super) async fn know_levels(
        &self,
        wanted: impl IntoIterator<Item = Priority>,
    ) -> Result<()> {
        // Normal is every service's: a batch of normal tasks (the common
        // case) takes no lock at all, and any other, one.
        let mut others = wanted
            .into_iter()
            .filter(|&l| l != Priority::Normal)
            .peekable();
        if others.peek().is_none() {
            return Ok(());
        }
        let missing = {
            let known = self.levels.read().unwrap_or_else(|e| e.into_inner());
            others.any(|level| !known.has(level))
        };
        if !missing {
            return Ok(());
        }
        let read = builder::read_levels(&self.conn, &self.name).await?;
        *self.levels.write().unwrap_or_else(|e| e.into_inner()) = read;
        Ok(())
    }
}
