//! [`ProducerBuilder`]: a producer's settings, checked against the
//! service's `{N}:meta` when it connects.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use deadpool_redis::redis;

use super::{Producer, route};
use crate::codec::{Bincode, Codec, Json};
use crate::config::{self, ServiceName, name_and_redis_setters};
use crate::connection::{self, Redis, SharedConnection};
use crate::error::{Error, Result, SettingDiff};
use crate::metrics as m;
use crate::partition::DEFAULT_PARTITIONS;
use crate::priority::{Levels, Priority};
use crate::{keys, meta};

/// Builds a [`Producer`].
#[must_use]
#[derive(Clone)]
pub struct ProducerBuilder<C> {
    name: Option<String>,
    redis: Option<Redis>,
    /// `None`: the service's, or the default for a new service.
    partitions: Option<u32>,
    /// `None`: the service's.
    priorities: Option<Vec<Priority>>,
    max_payload: usize,
    idempotency_ttl: Duration,
    codec: PhantomData<C>,
}

impl<C> fmt::Debug for ProducerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProducerBuilder")
            .field("name", &self.name)
            .field("redis", &self.redis)
            .field("partitions", &self.partitions)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl ProducerBuilder<Bincode> {
    /// The defaults: bincode, the service's partitions.
    pub(super) fn new() -> Self {
        ProducerBuilder {
            name: None,
            redis: None,
            partitions: None,
            priorities: None,
            max_payload: super::DEFAULT_MAX_PAYLOAD,
            idempotency_ttl: super::DEFAULT_IDEMPOTENCY_TTL,
            codec: PhantomData,
        }
    }
}

impl<C: Codec> ProducerBuilder<C> {
    name_and_redis_setters! {
        name:
        /// The service name (required).
        redis:
        /// Where the service's Redis is (required): a URL (`redis://`,
        /// `rediss://`, with user and password), or a [`Redis`] for a Cluster
        /// (each task goes to the master of its partition's slot; a batch is
        /// sent as one pipeline per master), a pool, TLS files or replicas to
        /// wait for. With [`Redis::wait_for_replicas`], an enqueue (a batch:
        /// after its last part) the replicas did not all confirm returns
        /// [`Error::NotReplicated`].
    }

    /// The number of partitions `P` (1 to 4096) of a new service. Without
    /// it the producer uses the service's, or 64 for a new service; a value
    /// that differs from the service's is refused. Service-wide.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// The service's priority levels, recorded in `{N}:meta` if no
    /// consumer recorded them yet, so that tasks of a level can be
    /// enqueued before the service's first consumer starts (which must then
    /// give the same). Without it the producer uses the service's levels
    /// (none for a new service); levels that differ from the service's are
    /// refused. Must include [`Priority::Normal`].
    pub fn priorities(mut self, levels: impl IntoIterator<Item = Priority>) -> Self {
        self.priorities = Some(levels.into_iter().collect());
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
            redis: self.redis,
            partitions: self.partitions,
            priorities: self.priorities,
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
        let given = connection::given(self.redis)?;
        let redis = given.to_string();
        let conn = SharedConnection::new(given.backend()?);
        let asked = self.partitions.unwrap_or(DEFAULT_PARTITIONS);
        let mut fields = config::queue_meta_fields(asked, C::NAME);
        if let Some(levels) = &self.priorities {
            fields.push((Levels::FIELD, Levels::new(levels)?.to_string()));
        }
        // No waiting for Redis here, unlike a consumer: the caller holds the
        // tasks and decides whether to wait, retry or fail.
        let checked = async { meta::differences(&mut conn.get().await?, &name, &fields).await };
        let differ = checked.await.map_err(|e| connection::at(&redis, e))?;
        // A resharded service (docs/design.md §21): `{N}:meta` keeps the
        // first generation's count; a producer given one must give the
        // current generation's.
        let layout = route::current(&conn, &name, asked)
            .await
            .map_err(|e| connection::at(&redis, e))?;
        let resharded = layout.0.number > 0;
        let differ = match resharded {
            true => differ
                .into_iter()
                .filter(|d| d.setting != "partitions")
                .collect(),
            false => differ,
        };
        let partitions = settle(&name, self.partitions, asked, differ)?;
        let (partitions, current) = match resharded {
            true => {
                let first = meta::first_partitions(&conn, &name)
                    .await
                    .map_err(|e| connection::at(&redis, e))?;
                (first, layout)
            }
            false => (
                partitions,
                (
                    crate::reshard::Generation {
                        number: 0,
                        partitions,
                    },
                    None,
                ),
            ),
        };
        let (current, from) = current;
        if let Some(set) = self.partitions.filter(|&set| set != current.partitions) {
            return Err(Error::invalid(
                "partitions",
                format!(
                    "service `{name}` now has {} partitions (resharded to generation {}); leave \
                     `partitions` unset to follow the service, or give {}, not {set}",
                    current.partitions, current.number, current.partitions
                ),
            ));
        }
        let levels = read_levels(&conn, &name)
            .await
            .map_err(|e| connection::at(&redis, e))?;
        let service = name.to_string();
        Ok(Producer {
            enqueued: metrics::counter!(m::ENQUEUED_TOTAL, "service" => service.clone()),
            errors: metrics::counter!(m::ENQUEUE_ERRORS_TOTAL, "service" => service),
            route: std::sync::RwLock::new(std::sync::Arc::new(route::Route::new(
                &name,
                current,
                from.map(|(g, opened)| {
                    (
                        g,
                        opened.map(|o| route::asked_until(o, self.idempotency_ttl)),
                    )
                }),
            ))),
            levels: std::sync::RwLock::new(levels),
            name,
            conn,
            partitions,
            codec: C::default(),
            max_payload: self.max_payload,
            idempotency_ttl: self.idempotency_ttl,
            tracking: Default::default(),
            script_loaded: Default::default(),
        })
    }
}

/// The priority levels `{N}:meta` records for service `name` (normal
/// alone until its consumers record theirs).
pub(super) async fn read_levels(conn: &SharedConnection, name: &ServiceName) -> Result<Levels> {
    let mut hget = redis::cmd("HGET");
    hget.arg(keys::meta(name)).arg(Levels::FIELD);
    let recorded: Option<String> = conn.query(&hget).await?;
    Levels::parse(recorded.as_deref())
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
                partitions = meta::recorded_partitions(name, &diff.stored)?;
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
        n if n == Bincode::NAME => Some("peerq::Bincode"),
        n if n == Json::NAME => Some("peerq::Json"),
        _ => None,
    }
}
