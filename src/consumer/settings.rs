//! The consumer's settings: their defaults, their ranges, and the ones
//! recorded service-wide in `{N}:meta`, in one place. The indexer's own
//! settings (interval, skew, lease margin, indexing) are
//! [`crate::config`]'s.

use std::time::Duration;

use crate::config::{self, fmt_duration};
use crate::error::{Error, Result};
use crate::indexer::IndexerSettings;
use crate::limits::Limits;
use crate::partition::DEFAULT_PARTITIONS;
use crate::periodic::Registered;
use crate::priority::{Levels, Priority};
use crate::retry::Backoff;
use crate::tracking::Tracking;

/// Default tasks in flight per instance.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Default most entries read in one `XREADGROUP`.
pub const DEFAULT_BATCH: usize = 64;
/// Default time a read blocks waiting for new entries.
pub const DEFAULT_BLOCK: Duration = Duration::from_secs(1);
/// Default drain timeout: how long released partitions' running tasks may
/// take to finish before they are interrupted.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_millis(300);
/// Default failed runs of a task before it goes to the dead letters.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// Default idle time after which an entry pending on another consumer is
/// claimed by the partition's owner.
pub const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(30);
/// Default largest stream entry a consumer runs: 4 MiB, room for the
/// producer's default `max_payload` (1 MiB) with any codec's overhead.
pub const DEFAULT_MAX_ENTRY_BYTES: usize = 4 * 1024 * 1024;

/// The consumer's settings; [`validate`](Self::validate) before use.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerSettings {
    pub(crate) partitions: u32,
    /// Whether the builder was given `partitions`; if not, the consumer
    /// takes the service's count from `{N}:meta` (64 for a new service).
    pub(crate) partitions_given: bool,
    pub(crate) concurrency: usize,
    pub(crate) batch: usize,
    pub(crate) block: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    /// One task at a time per partition, in stream order (service-wide).
    pub(crate) ordered: bool,
    /// Periodic jobs with their tasks' payloads.
    pub(crate) periodic: Vec<Registered>,
    pub(crate) claim_idle: Duration,
    /// `None`: `3 * interval + drain_timeout`.
    pub(crate) leave_timeout: Option<Duration>,
    pub(crate) allow_eviction: bool,
    /// Larger entries are dead-lettered (`too_large`) undecoded.
    pub(crate) max_entry_bytes: usize,
    /// Task tracking's first value for a service that has none yet.
    pub(crate) tracking: Tracking,
    /// The flow limits' first value for a service that has none yet.
    pub(crate) limits: Limits,
    /// A tracked task's largest encoded result.
    pub(crate) max_result_bytes: usize,
    /// How a task's span joins its producer's trace (feature `otel`).
    #[cfg(feature = "otel")]
    pub(crate) trace_join: crate::trace_context::TraceJoin,
    /// The priority levels (docs/design.md §17); normal alone by default.
    pub(crate) priorities: Vec<Priority>,
    /// Whether the limits per key count by a function of the task rather
    /// than by the partition key (service-wide).
    pub(crate) limit_key: bool,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        ConsumerSettings {
            partitions: DEFAULT_PARTITIONS,
            partitions_given: false,
            concurrency: DEFAULT_CONCURRENCY,
            batch: DEFAULT_BATCH,
            block: DEFAULT_BLOCK,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            ordered: false,
            periodic: Vec::new(),
            claim_idle: DEFAULT_CLAIM_IDLE,
            leave_timeout: None,
            allow_eviction: false,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            tracking: Tracking::off(),
            limits: Limits::none(),
            max_result_bytes: crate::tracking::DEFAULT_MAX_RESULT,
            #[cfg(feature = "otel")]
            trace_join: Default::default(),
            priorities: vec![Priority::Normal],
            limit_key: false,
        }
    }
}

impl ConsumerSettings {
    /// Refuses a setting out of its range, naming it; `indexer` is the
    /// service's (valid) round settings, which some ranges depend on.
    pub(crate) fn validate(&self, indexer: &IndexerSettings) -> Result<()> {
        config::validate_partitions(self.partitions)?;
        if !(1..=100_000).contains(&self.concurrency) {
            return Err(Error::invalid(
                "concurrency",
                format!(
                    "{} is out of range; use 1 to 100000 tasks in flight",
                    self.concurrency
                ),
            ));
        }
        if !(1..=10_000).contains(&self.batch) {
            return Err(Error::invalid(
                "batch",
                format!(
                    "{} is out of range; use 1 to 10000 entries per read",
                    self.batch
                ),
            ));
        }
        let (min_block, max_block) = (Duration::from_millis(10), Duration::from_secs(60));
        if !(min_block..=max_block).contains(&self.block) {
            return Err(Error::invalid(
                "block",
                format!(
                    "{} is out of range; use 10ms to 60s",
                    fmt_duration(self.block)
                ),
            ));
        }
        // A drain must end before the next epoch's rounds, or transitions
        // pile up behind each other.
        if self.drain_timeout.is_zero() || self.drain_timeout >= indexer.interval / 2 {
            return Err(Error::invalid(
                "drain_timeout",
                format!(
                    "{} is out of range; use more than 0 and less than interval/2 = {}",
                    fmt_duration(self.drain_timeout),
                    fmt_duration(indexer.interval / 2)
                ),
            ));
        }
        if !(1..=1000).contains(&self.max_attempts) {
            return Err(Error::invalid(
                "max_attempts",
                format!("{} is out of range; use 1 to 1000", self.max_attempts),
            ));
        }
        self.backoff.validate()?;
        crate::entry::validate_max_entry_bytes(self.max_entry_bytes)?;
        self.tracking.validate()?;
        self.limits.validate()?;
        let levels = Levels::new(&self.priorities)?;
        if levels.any() && self.ordered {
            return Err(Error::invalid(
                "priorities",
                "ordered partitions run their tasks one at a time in stream order, which a \
                 higher level would overtake; use levels or ordered, not both",
            ));
        }
        if !(1..=512 * 1024 * 1024).contains(&self.max_result_bytes) {
            return Err(Error::invalid(
                "max_result_bytes",
                format!(
                    "{} bytes is out of range; use 1 to 536870912 (512 MiB), and keep results small: \
                     each is kept in Redis with its task's record",
                    self.max_result_bytes
                ),
            ));
        }
        for registered in &self.periodic {
            registered.job.validate()?;
        }
        if self.leave_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::invalid(
                "leave_timeout",
                "must be more than 0; about 3 intervals lets a graceful leave finish",
            ));
        }
        if self.claim_idle < Duration::from_millis(100) {
            return Err(Error::invalid(
                "claim_idle",
                format!(
                    "{} is too short; use at least 100ms",
                    fmt_duration(self.claim_idle)
                ),
            ));
        }
        Ok(())
    }

    /// The priority levels; normal alone if they were not valid (they
    /// were, after [`validate`](Self::validate)).
    pub(crate) fn levels(&self) -> Levels {
        Levels::new(&self.priorities).unwrap_or_default()
    }

    /// Every partition of the service: `partitions` per level.
    pub(crate) fn streams(&self) -> u32 {
        self.levels().streams(self.partitions)
    }

    /// How long a graceful leave may take before the instance leaves at
    /// once: the setting, else `3 * interval + drain_timeout` (a leave
    /// waits for the first round without the instance, then drains).
    pub(crate) fn leave_timeout(&self, interval: Duration) -> Duration {
        self.leave_timeout
            .unwrap_or(3 * interval + self.drain_timeout)
    }

    /// The `{N}:meta` fields these settings are recorded as (every
    /// instance of a service must agree on them), with the codec's name.
    pub(crate) fn meta_fields(&self, codec: &str) -> Vec<(&'static str, String)> {
        let mut fields = config::queue_meta_fields(self.partitions, codec);
        fields.push(("drain_timeout", fmt_duration(self.drain_timeout)));
        fields.push(("ordered", self.ordered.to_string()));
        fields.push((Levels::FIELD, self.levels().to_string()));
        let limit_key = if self.limit_key { "task" } else { "partition" };
        fields.push(("limit_key", limit_key.to_owned()));
        fields.push(crate::meta::Kind::Consumer.field());
        fields
    }
}
