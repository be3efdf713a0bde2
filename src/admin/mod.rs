//! Looking at and steering services from outside (docs/design.md §7): what
//! the `peerq` CLI prints and the dashboard shows. It prints nothing; every
//! answer is a plain struct whose JSON (serde) field names are stable and
//! listed in the guide (docs/guide/14-operating.md).
//!
//! Reading never slows the instances: it reads summaries only. `SCAN` (never
//! `KEYS`) for the services' `{N}:meta` keys; `HGETALL` of `{N}:meta`,
//! `{N}:members` and the per-minute counts; per partition `GET` of the owner
//! record, `XLEN`, `XINFO GROUPS` and the `XPENDING` summary of the stream,
//! `ZCARD` of the delayed set and `XLEN` of the dead letters. Stream contents
//! are read only for a page of dead letters, of delayed tasks or of a
//! partition's waiting entries, and for a tracked task's headers (its
//! entry, a page at a time). The
//! per-partition reads of one answer go in one pipeline, one command per key
//! and never a `MULTI` or a script across partitions (under Redis Cluster
//! the partitions live in different slots).
//!
//! ```no_run
//! # async fn demo() -> peerq::Result<()> {
//! use peerq::admin::Admin;
//!
//! let admin = Admin::connect("redis://127.0.0.1/").await?;
//! for service in admin.services().await? {
//!     println!("{}: {} instances, backlog {}", service.name, service.instances, service.backlog);
//! }
//! let mail = admin.service("mail-sender").await?;
//! let status = mail.status().await?;
//! println!("{} partitions, {} dead", status.partitions.len(), status.totals.dead);
//! mail.pause("alice@laptop").await?; // no handler starts until resume
//! # Ok(()) }
//! ```

mod batches;
mod delayed;
mod etcd;
mod exporter;
mod limits;
mod members;
mod partitions;
mod periodic;
mod reshard;
mod services;
mod status;
mod task_headers;
mod tasks;
// The dashboard's page of a partition's backlog, its only reader.
#[cfg(feature = "dashboard")]
pub(crate) mod waiting;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;
use serde::Serialize;

pub use delayed::{Delayed, DelayedAction, DelayedTask};
pub use etcd::{EtcdMember, EtcdRound, EtcdStatus};
pub use exporter::{Exporter, ServiceGauges};
pub use members::Member;
pub use partitions::PartitionState;
pub use periodic::PeriodicJob;
pub use reshard::{Resharded, ServiceLayout};
pub use services::ServiceSummary;
pub use status::{LimitsStatus, MinuteCounts, RateStatus, Rates, Status, Totals};

use crate::codec::Json;
use crate::config::ServiceName;
use crate::connection::channels::Channels;
use crate::connection::{self, Redis, SharedConnection};
use crate::dead_letters::DeadLetters;
use crate::entry::TaskId;
use crate::error::{Error, Result};
use crate::keys;
use crate::pause::{self, Pause};
use crate::producer::{Options, Producer};

/// How long [`Admin::connect`] waits for Redis to answer: an operator's
/// tool says what is wrong rather than hang on an unreachable host.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to one Redis, to look at the services on it. Cheap to
/// clone (the clones share the connection).
#[derive(Clone)]
pub struct Admin {
    conn: Arc<SharedConnection>,
    /// One pub/sub connection for every `wait` made through it.
    channels: Arc<Channels>,
    /// The URL without its password, for messages.
    redis: Arc<str>,
    /// How a status reaches an etcd membership's cluster ([`Admin::etcd_access`]).
    #[cfg(feature = "etcd")]
    etcd: Arc<etcd::Access>,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("redis", &self.redis)
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// Connects to `redis` (a URL, or a [`Redis`] for a Cluster, a pool
    /// or TLS files) and checks that it answers (within 5 s). An invalid
    /// value is an [`Error::InvalidSetting`] naming it (`redis`,
    /// `redis_cluster`, `tls`); an unreachable or refusing Redis (a wrong
    /// password) is an [`Error::Connect`]; neither message contains the
    /// password.
    pub async fn connect(redis: impl Into<Redis>) -> Result<Admin> {
        let given: Redis = redis.into();
        let shown: Arc<str> = given.to_string().into();
        let conn = SharedConnection::new(given.backend()?);
        let ping = redis::cmd("PING");
        let ping = conn.query::<String>(&ping);
        match tokio::time::timeout(CONNECT_TIMEOUT, ping).await {
            Ok(answer) => answer.map_err(|e| connection::at(&shown, e))?,
            Err(_) => return Err(connection::at(&shown, Error::Timeout(CONNECT_TIMEOUT))),
        };
        Ok(Admin {
            channels: Arc::new(Channels::new(conn.backend().pubsub.clone())),
            conn: Arc::new(conn),
            redis: shown,
            #[cfg(feature = "etcd")]
            etcd: Arc::default(),
        })
    }

    /// TLS settings and a user for reading the etcd cluster of a service
    /// whose membership is there ([`Service::status`]'s `etcd`), for a
    /// cluster that asks for them (feature `etcd`).
    #[cfg(feature = "etcd")]
    pub fn etcd_access(
        mut self,
        tls: Option<crate::connection::Tls>,
        auth: Option<crate::membership::EtcdAuth>,
    ) -> Admin {
        self.etcd = Arc::new(etcd::Access { tls, auth });
        self
    }

    /// Its Redis as messages name it: the URL without its password (a
    /// Cluster's seed nodes without theirs).
    pub fn redis(&self) -> &str {
        &self.redis
    }

    /// Service `name`, with its settings; [`Error::UnknownService`] if it
    /// never recorded any in this Redis.
    pub async fn service(&self, name: &str) -> Result<Service> {
        let name = ServiceName::new(name)?;
        // Both in the service's slot: one round trip.
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL").arg(keys::meta(&name));
        pipe.cmd("HGETALL").arg(keys::layout(&name));
        let (meta, layout): (HashMap<String, String>, HashMap<String, String>) =
            self.conn.query_pipe(&pipe).await?;
        if meta.is_empty() {
            return Err(Error::UnknownService {
                name: name.to_string(),
                url: self.redis.to_string(),
            });
        }
        let settings = Settings::from_meta(&meta);
        let layout = crate::reshard::Layout::from_fields(&layout).ok().flatten();
        let units = settings.units(layout.as_ref());
        let first = crate::reshard::Generation {
            number: 0,
            partitions: settings.partitions.unwrap_or(0),
        };
        Ok(Service {
            admin: self.clone(),
            settings,
            name,
            units,
            generations: layout.map_or((first, None), |l| (l.current, l.from)),
        })
    }

    /// Redis's clock now, in Unix milliseconds: ages are measured against
    /// it, as the instances' records are written by clocks kept close to it.
    async fn now_ms(&self) -> Result<u64> {
        let (secs, micros): (u64, u64) = self.conn.query(&redis::cmd("TIME")).await?;
        Ok(secs * 1000 + micros / 1000)
    }
}

/// A service's settings as recorded in `{N}:meta` (docs/design.md §3).
/// Each part records its own fields, so a field is `None` until a part
/// that has it ran: the partitions and codec come with the first producer
/// or consumer, the rest with the first consumer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Settings {
    /// What runs under the name: `consumer`, or `indexer` for a standalone
    /// indexer (which has no queue); `None` until a consumer or indexer ran.
    pub kind: Option<String>,
    /// The number of partitions.
    pub partitions: Option<u32>,
    /// The payload codec: `bincode` or `json`.
    pub codec: Option<String>,
    /// The indexer's round interval, as recorded (`1s`, `500ms`).
    pub interval: Option<String>,
    /// The tolerated clock skew.
    pub skew: Option<String>,
    /// The lease margin.
    pub lease_margin: Option<String>,
    /// The indexing mode: `ranked` or `incr`.
    pub indexing: Option<String>,
    /// The assignor: `modulo` or `rendezvous`.
    pub assignor: Option<String>,
    /// The drain timeout.
    pub drain_timeout: Option<String>,
    /// Whether partitions run one task at a time, in order.
    pub ordered: Option<bool>,
    /// The priority levels, highest first (`high,normal,low`; `normal`
    /// alone: none). Each level has `partitions` of its own.
    pub priorities: Option<String>,
    /// What the concurrency per key counts a task by: `partition` (its
    /// partition key) or `task` (a function of the task).
    pub limit_key: Option<String>,
    /// Where the rounds keep the membership: `redis` or `etcd`
    /// (docs/design.md §2.2); `None` for a service of a peerq before it.
    pub membership: Option<String>,
    /// The etcd key prefix of the rounds, with `etcd` membership.
    pub etcd_prefix: Option<String>,
}

impl Settings {
    fn from_meta(meta: &HashMap<String, String>) -> Settings {
        let text = |field: &str| meta.get(field).cloned();
        Settings {
            kind: text(crate::meta::KIND),
            partitions: meta.get("partitions").and_then(|p| p.parse().ok()),
            codec: text("codec"),
            interval: text("interval"),
            skew: text("skew"),
            lease_margin: text("lease_margin"),
            indexing: text("indexing"),
            assignor: text("assignor"),
            drain_timeout: text("drain_timeout"),
            ordered: meta.get("ordered").and_then(|o| o.parse().ok()),
            priorities: text(crate::priority::Levels::FIELD),
            limit_key: text("limit_key"),
            membership: text(crate::membership::FIELD),
            etcd_prefix: text("etcd_prefix"),
        }
    }

    /// The priority levels' count (docs/design.md §17).
    pub(crate) fn levels(&self) -> u32 {
        let levels = crate::priority::Levels::parse(self.priorities.as_deref());
        levels.map(|l| l.count()).unwrap_or(1)
    }

    /// The partitions to look at, every level's, ascending, given the
    /// service's layout (docs/design.md §21; `None`: never resharded, or a
    /// layout that does not read, which shows the first generation); none
    /// when nothing recorded the partitions.
    pub(crate) fn units(&self, layout: Option<&crate::reshard::Layout>) -> Arc<[u32]> {
        let Some(first) = self.partitions else {
            return Arc::from([]);
        };
        crate::reshard::units_of(layout, first, self.levels())
    }

    /// The round interval, or the default when no consumer recorded one.
    fn interval(&self) -> Duration {
        self.interval
            .as_deref()
            .and_then(crate::config::parse_duration)
            .unwrap_or(crate::indexer::DEFAULT_INTERVAL)
    }
}

/// One service on a Redis, found by [`Admin::service`].
#[derive(Debug, Clone)]
pub struct Service {
    admin: Admin,
    name: ServiceName,
    settings: Settings,
    /// The partitions to look at, ascending: every level's, of the
    /// generation in use and of the one a reshard replaces (docs/design.md
    /// §21), as read when the service was looked up.
    units: Arc<[u32]>,
    /// The generation in use and the one a reshard replaced, as read then.
    generations: (
        crate::reshard::Generation,
        Option<crate::reshard::Generation>,
    ),
}

impl Service {
    /// The service's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// Its settings, as read when it was looked up.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Its partitions per level (0 when nothing recorded them).
    fn partitions(&self) -> u32 {
        self.settings.partitions.unwrap_or(0)
    }

    /// Its partitions of every level, ascending, of the generation in use
    /// and of the one a reshard replaces.
    fn units(&self) -> &Arc<[u32]> {
        &self.units
    }

    /// Its dead letters, on this connection.
    pub fn dead_letters(&self) -> DeadLetters {
        DeadLetters::new(
            self.admin.conn.clone(),
            self.name.clone(),
            self.units.clone(),
        )
    }

    /// Pauses the service: no handler starts on any instance until
    /// [`resume`](Self::resume) (docs/design.md §7). Returns the pause in
    /// force: this one, or an earlier one still in place, which is kept.
    pub async fn pause(&self, by: &str) -> Result<Pause> {
        pause::pause(&self.admin.conn, &self.name, by).await?;
        let current = pause::read(&self.admin.conn, &self.name).await?;
        // Resumed by someone else in between: report this pause as made.
        Ok(current.unwrap_or_else(|| Pause {
            at_ms: 0,
            by: by.to_owned(),
        }))
    }

    /// Resumes the service; true if it was paused.
    pub async fn resume(&self) -> Result<bool> {
        pause::resume(&self.admin.conn, &self.name).await
    }

    /// Whether the service is paused, and by whom.
    pub async fn paused(&self) -> Result<Option<Pause>> {
        pause::read(&self.admin.conn, &self.name).await
    }

    /// Enqueues `task`, a JSON value, with `options`, for a service whose
    /// codec is `json` (its handlers decode the value into their task
    /// type); returns the task's id. A service with another codec is
    /// refused with an [`Error::InvalidSetting`] naming `codec`: its tasks
    /// must be encoded by a producer with the task's Rust type.
    pub async fn enqueue_json(&self, task: &serde_json::Value, options: Options) -> Result<TaskId> {
        match self.settings.codec.as_deref() {
            Some("json") => {}
            Some(other) => {
                return Err(Error::invalid(
                    "codec",
                    format!(
                        "service `{}` uses the {other} codec (`{}` field `codec`), and only a \
                         service with the json codec takes a JSON task; enqueue with a producer \
                         that has the service's task type",
                        self.name,
                        keys::meta(&self.name)
                    ),
                ));
            }
            None => {
                return Err(Error::invalid(
                    "codec",
                    format!(
                        "service `{}` has recorded no codec (`{}` field `codec`): no producer or \
                         consumer of it ever ran",
                        self.name,
                        keys::meta(&self.name)
                    ),
                ));
            }
        }
        let producer = Producer::builder()
            .codec(Json)
            .redis(Redis::built(
                self.admin.conn.backend().clone(),
                self.admin.redis(),
            ))
            .name(self.name.as_str())
            .connect()
            .await?;
        producer.enqueue_with(task, options).await
    }
}
