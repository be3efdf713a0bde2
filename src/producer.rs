//! Enqueues typed tasks (docs/design.md §1, §3).
//!
//! A task goes to partition `fnv1a64(key) % P` (see [`crate::partition`]),
//! where the key is the task id unless the producer gives one: tasks with
//! one key land in one partition, in enqueue order.

use std::fmt;
use std::marker::PhantomData;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::Pool;
use deadpool_redis::redis;
use serde::Serialize;
use tracing::warn;

use crate::codec::{Bincode, Codec, Json};
use crate::config::{self, ServiceName};
use crate::connection::SharedConnection;
use crate::error::{Error, Result, SettingDiff};
use crate::metrics as m;
use crate::partition::{DEFAULT_PARTITIONS, partition_of};
use crate::task::{Entry, TaskId};
use crate::{keys, meta};

/// Default largest encoded payload a producer accepts.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// How to enqueue one task.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct Options {
    key: Option<String>,
    idempotency_key: Option<String>,
    delay: Option<Duration>,
    at: Option<SystemTime>,
}

impl Options {
    /// The defaults: the task id is the partition key.
    pub fn new() -> Self {
        Options::default()
    }

    /// The partition key: tasks with one key go to one partition and are
    /// delivered in enqueue order.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Enqueue the task at most once per `key` while the producer's
    /// idempotency TTL lasts (default 24 h): a second enqueue with the
    /// same key, say a retry after an ambiguous error, enqueues nothing
    /// and returns the first task's id. Without a [`key`](Self::key), it
    /// is also the partition key.
    ///
    /// ```no_run
    /// # #[derive(serde::Serialize)]
    /// # struct Mail { to: String }
    /// # async fn demo(producer: peerq::Producer) -> peerq::Result<()> {
    /// use peerq::Options;
    /// // A task of the service's task type (its handler's `Task`).
    /// let mail = Mail { to: "a@example.com".into() };
    /// let once = Options::new().idempotency_key("order-1041-confirmation");
    /// let first = producer.enqueue_with(&mail, once.clone()).await?;
    /// let again = producer.enqueue_with(&mail, once).await?; // nothing enqueued
    /// assert_eq!(first, again);
    /// # Ok(()) }
    /// ```
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Run the task no earlier than `delay` from now, by Redis's clock. It
    /// waits in its partition's delayed set; the partition's owner moves it
    /// into the stream when due: within milliseconds for delays above a
    /// second, at most about a second late for shorter ones.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.at = None;
        self
    }

    /// Run the task no earlier than `at` (by this process's clock); see
    /// [`delay`](Self::delay). A time in the past enqueues it at once.
    pub fn at(mut self, at: SystemTime) -> Self {
        self.at = Some(at);
        self.delay = None;
        self
    }

    /// Whether the task goes through the enqueue script.
    fn scripted(&self) -> bool {
        self.idempotency_key.is_some() || self.delay.is_some() || self.at.is_some()
    }
}

/// Default time an idempotency key is remembered.
pub const DEFAULT_IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);

static ENQUEUE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/enqueue.lua")));

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
    conn: SharedConnection,
    partitions: u32,
    codec: C,
    max_payload: usize,
    idempotency_ttl: Duration,
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
    /// Connects a bincode producer to service `name` at `url`, with the
    /// service's partitions (read from `{name}:meta`; 64 for a new
    /// service). A service whose codec is JSON needs a JSON producer,
    /// which [`builder`](Self::builder) makes; see
    /// [`ProducerBuilder::connect`] for the errors.
    pub async fn connect(url: &str, name: &str) -> Result<Self> {
        Producer::builder().redis(url).name(name).connect().await
    }

    /// A builder with the defaults: bincode, the service's partitions.
    ///
    /// ```no_run
    /// # async fn demo() -> peerq::Result<()> {
    /// use peerq::Producer;
    /// use peerq::codec::Json;
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
        ProducerBuilder {
            name: None,
            url: None,
            pool: None,
            partitions: None,
            max_payload: DEFAULT_MAX_PAYLOAD,
            idempotency_ttl: DEFAULT_IDEMPOTENCY_TTL,
            codec: PhantomData,
        }
    }
}

impl<C: Codec> Producer<C> {
    /// Enqueues one task; returns its id.
    pub async fn enqueue<T: Serialize>(&self, task: T) -> Result<TaskId> {
        self.enqueue_with(task, Options::new()).await
    }

    /// Enqueues one task with options; returns its id (with an
    /// idempotency key already used, the earlier task's id).
    pub async fn enqueue_with<T: Serialize>(&self, task: T, options: Options) -> Result<TaskId> {
        let sent = self.send(task, options).await;
        match &sent {
            // A repeat of an idempotency key returns the earlier task's id
            // and enqueues nothing.
            Ok((_, true)) => self.enqueued.increment(1),
            Ok(_) => {}
            Err(_) => self.errors.increment(1),
        }
        sent.map(|(id, _)| id)
    }

    /// Enqueues one task; its id, and whether it is new (not a repeat of an
    /// idempotency key).
    async fn send<T: Serialize>(&self, task: T, options: Options) -> Result<(TaskId, bool)> {
        // Without a partition key, the idempotency key places the task, so
        // a repeat lands in the partition that holds the key's record.
        let key = options
            .key
            .clone()
            .or_else(|| options.idempotency_key.clone());
        let entry = self.entry(&task, key)?;
        let id = entry.id.clone();
        let p = self.partition_of(&entry);
        let stream = keys::stream(&self.name, p);
        if options.scripted() {
            // The dedup record and the delayed set live in the task's
            // partition, so one script checks, delays and adds.
            let dedup = options.idempotency_key.as_deref().unwrap_or_default();
            let ttl = match options.idempotency_key {
                Some(_) => self.idempotency_ttl.as_millis() as u64,
                None => 0,
            };
            let at = options
                .at
                .map(|at| {
                    at.duration_since(UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis()
                        .max(1) as u64
                })
                .unwrap_or(0);
            let delay = options.delay.map(|d| d.as_millis() as u64).unwrap_or(0);
            let mut script = ENQUEUE.key(&stream);
            script
                .key(keys::delayed(&self.name, p))
                .key(keys::dedup(&self.name, p, dedup))
                .arg(ttl)
                .arg(id.as_str())
                .arg(at)
                .arg(delay);
            for (k, v) in entry.fields() {
                script.arg(k).arg(v);
            }
            let (enqueued, due): (String, u64) = self.conn.invoke(&script).await?;
            if due > 0 {
                self.notice(p, due).await;
            }
            let new = enqueued == id.as_str();
            return Ok((TaskId::from(enqueued.as_str()), new));
        }
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream).arg("*").arg(entry.fields());
        self.conn.query::<()>(&cmd).await?;
        Ok((id, true))
    }

    /// Tells the owner of partition `p`, through the due index, that a task
    /// there is delayed until `due_ms`, so it moves the task when due
    /// rather than at its slow check of the delayed set (docs/design.md
    /// §6). The task is enqueued already: a failure here only delays it
    /// more, so it is logged, not returned (an error would have the caller
    /// enqueue the task twice).
    async fn notice(&self, p: u32, due_ms: u64) {
        let notice = crate::due::notice(&self.name, p, due_ms);
        if let Err(e) = self.conn.query::<()>(&notice).await {
            warn!(service = %self.name, partition = p, cause = %e, "a delayed task's notice to the due index failed; it runs up to 30 s late");
        }
    }

    /// Enqueues many tasks in one pipelined round trip; returns their ids
    /// in order. A task that does not encode, or is over the size limit,
    /// fails the whole batch before anything is sent. An error from Redis
    /// is ambiguous (a lost reply after Redis applied the batch looks the
    /// same as a lost request): retrying may enqueue tasks twice.
    pub async fn enqueue_batch<T: Serialize>(&self, tasks: &[T]) -> Result<Vec<TaskId>> {
        let sent = self.send_batch(tasks).await;
        match &sent {
            Ok(ids) => self.enqueued.increment(ids.len() as u64),
            Err(_) => self.errors.increment(1),
        }
        sent
    }

    async fn send_batch<T: Serialize>(&self, tasks: &[T]) -> Result<Vec<TaskId>> {
        let mut pipe = redis::pipe();
        let mut ids = Vec::with_capacity(tasks.len());
        for task in tasks {
            let entry = self.entry(task, None)?;
            pipe.cmd("XADD")
                .arg(keys::stream(&self.name, self.partition_of(&entry)))
                .arg("*")
                .arg(entry.fields())
                .ignore();
            ids.push(entry.id);
        }
        if ids.is_empty() {
            return Ok(ids);
        }
        self.conn.query_pipe::<()>(&pipe).await?;
        Ok(ids)
    }

    /// The service's number of partitions.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    fn entry<T: Serialize>(&self, task: &T, key: Option<String>) -> Result<Entry> {
        let payload = self.codec.encode(task)?;
        if payload.len() > self.max_payload {
            return Err(Error::PayloadTooLarge {
                size: payload.len(),
                limit: self.max_payload,
            });
        }
        Ok(Entry::new(TaskId::generate(), key, C::NAME, payload))
    }

    fn partition_of(&self, entry: &Entry) -> u32 {
        partition_of(entry.partition_key().as_bytes(), self.partitions)
    }
}

/// Builds a [`Producer`].
#[must_use]
pub struct ProducerBuilder<C> {
    name: Option<String>,
    url: Option<String>,
    pool: Option<Pool>,
    /// `None`: the service's, or the default for a new service.
    partitions: Option<u32>,
    max_payload: usize,
    idempotency_ttl: Duration,
    codec: PhantomData<C>,
}

impl<C> fmt::Debug for ProducerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProducerBuilder")
            .field("name", &self.name)
            .field("url", &self.url.as_deref().map(crate::connection::redact))
            .field("partitions", &self.partitions)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl<C: Codec> ProducerBuilder<C> {
    /// The service name (required).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Connect to Redis at `url`.
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Use this pool (takes precedence over [`redis`](Self::redis)).
    pub fn pool(mut self, pool: Pool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The number of partitions `P` (1 to 4096) of a new service. Without
    /// it the producer uses the service's, or 64 for a new service; a value
    /// that differs from the service's is refused. Service-wide.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// The largest encoded payload accepted (default 1 MiB); larger tasks
    /// are refused with [`Error::PayloadTooLarge`]. Consumers dead-letter
    /// entries over their `max_entry_bytes` (default 4 MiB), so keep that
    /// above this plus a few hundred bytes for the other fields.
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// How long an idempotency key is remembered (default 24 h): a second
    /// enqueue with the key within it enqueues nothing.
    pub fn idempotency_ttl(mut self, ttl: Duration) -> Self {
        self.idempotency_ttl = ttl;
        self
    }

    /// The codec (default [`Bincode`]): the service's, as its consumers
    /// set it. Service-wide.
    pub fn codec<D: Codec>(self, _codec: D) -> ProducerBuilder<D> {
        ProducerBuilder {
            name: self.name,
            url: self.url,
            pool: self.pool,
            partitions: self.partitions,
            max_payload: self.max_payload,
            idempotency_ttl: self.idempotency_ttl,
            codec: PhantomData,
        }
    }

    /// Validates the settings, connects, and checks them against the
    /// service's `{N}:meta`: it takes the service's partitions unless
    /// [`partitions`](Self::partitions) was set, and records the partitions
    /// and the codec if the service is new.
    ///
    /// Unlike a consumer, it does not wait for Redis: an unreachable or
    /// refusing Redis is an [`Error::Connect`] naming the URL without its
    /// password. A codec other than the service's, or partitions set to
    /// another value than the service's, are an [`Error::SettingsMismatch`]
    /// that says how to build a matching producer.
    pub async fn connect(self) -> Result<Producer<C>> {
        let name = ServiceName::given(self.name.as_deref())?;
        if let Some(partitions) = self.partitions {
            config::validate_partitions(partitions)?;
        }
        if self.max_payload == 0 {
            return Err(Error::invalid(
                "max_payload",
                "0 bytes accepts no task; use at least 1",
            ));
        }
        if self.idempotency_ttl < Duration::from_millis(1) {
            return Err(Error::invalid(
                "idempotency_ttl",
                "must be at least 1ms; as long as a producer may retry an enqueue (hours)",
            ));
        }
        let redis = crate::connection::target(self.pool.as_ref(), self.url.as_deref());
        let pool = crate::connection::pool(self.pool, self.url)?;
        let conn = SharedConnection::new(pool);
        let asked = self.partitions.unwrap_or(DEFAULT_PARTITIONS);
        let fields = config::queue_meta_fields(asked, C::NAME);
        // No waiting for Redis here, unlike a consumer: the caller holds the
        // tasks and decides whether to wait, retry or fail.
        let checked = async { meta::differences(&mut conn.get().await?, &name, &fields).await };
        let differ = checked
            .await
            .map_err(|e| crate::connection::at(&redis, e))?;
        let partitions = settle(&name, self.partitions, asked, differ)?;
        let service = name.to_string();
        Ok(Producer {
            enqueued: metrics::counter!(m::ENQUEUED_TOTAL, "service" => service.clone()),
            errors: metrics::counter!(m::ENQUEUE_ERRORS_TOTAL, "service" => service),
            name,
            conn,
            partitions,
            codec: C::default(),
            max_payload: self.max_payload,
            idempotency_ttl: self.idempotency_ttl,
        })
    }
}

/// The partitions a producer uses, given what differs from
/// service `name`'s `{N}:meta` (`asked` was recorded where absent): the
/// service's partitions unless the builder `set` others; a codec other than
/// the service's is refused, since a producer's codec is its type and
/// cannot change at run time. Neither refusal suggests deleting the meta:
/// the service is likely running.
fn settle(
    name: &ServiceName,
    set: Option<u32>,
    asked: u32,
    differ: Vec<SettingDiff>,
) -> Result<u32> {
    let mut partitions = asked;
    let mut refused = Vec::new();
    for diff in differ {
        match diff.setting.as_str() {
            "partitions" if set.is_none() => {
                partitions = diff
                    .stored
                    .parse()
                    .ok()
                    .filter(|p| config::validate_partitions(*p).is_ok())
                    .ok_or_else(|| {
                        Error::invalid(
                            "partitions",
                            format!(
                                "`{}` records partitions = {:?}, which is not 1 to 4096",
                                crate::keys::meta(name),
                                diff.stored
                            ),
                        )
                    })?;
            }
            _ => refused.push(diff),
        }
    }
    if refused.is_empty() {
        return Ok(partitions);
    }
    let mut advice = Vec::new();
    if let Some(codec) = refused.iter().find(|d| d.setting == "codec") {
        advice.push(match codec_type(&codec.stored) {
            Some(path) => format!(
                "A producer encodes with the service's codec, which is its type: build one with \
                 `Producer::builder().codec({path}).redis(url).name(name).connect()` \
                 (`Producer::connect` makes a {} producer)",
                Bincode::NAME
            ),
            None => format!(
                "The service's codec `{}` is not one peerq has (bincode, json)",
                codec.stored
            ),
        });
    }
    if refused.iter().any(|d| d.setting == "partitions") {
        advice.push(
            "Leave `partitions` unset on a producer to use the service's (`Producer::connect` \
             does)"
                .to_owned(),
        );
    }
    Err(meta::mismatch(name, refused, advice.join(". ")))
}

/// The path of the codec type named `name` in `{N}:meta`.
fn codec_type(name: &str) -> Option<&'static str> {
    match name {
        n if n == Bincode::NAME => Some("peerq::codec::Bincode"),
        n if n == Json::NAME => Some("peerq::codec::Json"),
        _ => None,
    }
}
