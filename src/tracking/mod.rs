//! Task tracking (docs/design.md §14): a record per task, in the task's own
//! partition slot, that says where the task is (`waiting`, `delayed`,
//! `running`, `retrying`, and at the end `succeeded`, `dead` or
//! `cancelled`), with its result, progress and last error; and a user's
//! cancel.
//!
//! Tracking is switched on and off per service, on a running service, in
//! `{N}:tracking` (the consumers' builder gives the first value, operators
//! change it with `peerq tracking`); the instances and producers read it
//! every second. Off, nothing is written per task.
//!
//! - here: the settings and the key that holds them, and the arguments the
//!   scripts that write records take;
//! - [`handle`]: what names a task (`<partition>/<task id>`) and what a
//!   reader gets back;
//! - `watch`: the instances' and producers' view of the settings;
//! - `cancel`: a user's cancel, and how a running task hears it;
//! - `read`: reading a record, and waiting for a task to end, woken
//!   through Redis.
//!
//! The consumer's side (a running task's cancel signal and progress) is in
//! the consumer's `running` module.

pub(crate) mod cancel;
#[cfg(test)]
mod eviction_tests;
pub mod handle;
pub(crate) mod packed;
pub(crate) mod read;
mod view;
pub(crate) mod watch;

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::{self, RedisWrite, Script, ToRedisArgs};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::{Error, Result};
use crate::keys;

pub use cancel::CancelOutcome;
pub use handle::{TaskHandle, TaskRecord, TaskState};
pub use read::Waited;
pub use view::TaskView;

/// The functions every script that writes a record or ends a task
/// shares, prepended to it.
macro_rules! tracked_script {
    ($file:literal) => {
        concat!(
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/scripts/track.lua"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/scripts/unique.lua"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/scripts/members.lua"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/scripts/sealed.lua"
            )),
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts/", $file))
        )
    };
}
pub(crate) use tracked_script;

/// `cancel.lua`, a user's cancel.
pub(crate) static CANCEL: LazyLock<Script> =
    LazyLock::new(|| Script::new(tracked_script!("cancel.lua")));

/// How long a record that is not final is kept once nothing writes it: a
/// task whose record stopped changing this long ago (tracking switched
/// off, its entry deleted) is forgotten by its owner's sweep rather than
/// kept for ever.
pub(crate) const STALE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The default time a final task's record and result are kept.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(24 * 3600);

/// The default number of final records a partition keeps (the oldest go
/// first): with 64 partitions, about 256 bytes each (the record and its
/// place in the retention lists), about 16 MB.
pub const DEFAULT_KEEP_COUNT: u32 = 1_000;

/// The default largest encoded result a handler may return while tracked.
pub const DEFAULT_MAX_RESULT: usize = 64 * 1024;

/// Whether a service's tasks are tracked, and how long and how many final
/// records each partition keeps.
///
/// ```
/// use std::time::Duration;
/// use peerq::tracking::Tracking;
///
/// let tracking = Tracking::on().keep(Duration::from_secs(3600)).keep_count(500);
/// assert!(tracking.is_on());
/// assert!(!Tracking::off().is_on());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracking {
    on: bool,
    keep: Duration,
    keep_count: u32,
}

impl Default for Tracking {
    /// Off, with the default retention.
    fn default() -> Self {
        Tracking::off()
    }
}

impl Tracking {
    /// Tracked: every task has a record from its enqueue (or, if enqueued
    /// while tracking was off, from its start) to its end.
    pub fn on() -> Self {
        Tracking {
            on: true,
            ..Tracking::off()
        }
    }

    /// Not tracked: nothing is written per task.
    pub fn off() -> Self {
        Tracking {
            on: false,
            keep: DEFAULT_KEEP,
            keep_count: DEFAULT_KEEP_COUNT,
        }
    }

    /// Keep a final task's record (and result) this long (at least 1 s).
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }

    /// Keep at most this many final records per partition (at least 1).
    pub fn keep_count(mut self, count: u32) -> Self {
        self.keep_count = count;
        self
    }

    /// Whether tasks are tracked.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// How long a final record is kept.
    pub fn kept_for(&self) -> Duration {
        self.keep
    }

    /// How many final records a partition keeps.
    pub fn kept_count(&self) -> u32 {
        self.keep_count
    }

    /// Refused by name when out of range.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.keep < Duration::from_secs(1) {
            return Err(Error::invalid(
                "tracking",
                format!(
                    "keep of {:?} is too short; keep final records at least 1s",
                    self.keep
                ),
            ));
        }
        if self.keep_count == 0 {
            return Err(Error::invalid(
                "tracking",
                "keep_count 0 would drop every record as it ends; keep at least 1",
            ));
        }
        Ok(())
    }

    /// As `{N}:tracking` holds it.
    fn fields(&self) -> [(&'static str, String); 3] {
        [
            ("on", if self.on { "1" } else { "0" }.to_owned()),
            ("keep_ms", (self.keep.as_millis() as u64).to_string()),
            ("keep_count", self.keep_count.to_string()),
        ]
    }

    /// From `{N}:tracking`'s fields: `None` when there is no such key.
    /// A field missing or unreadable (written by hand) has its default.
    fn parse(fields: &HashMap<String, String>) -> Option<Tracking> {
        if fields.is_empty() {
            return None;
        }
        let number = |k: &str| fields.get(k).and_then(|v| v.trim().parse::<u64>().ok());
        Some(Tracking {
            on: fields.get("on").is_some_and(|v| v.trim() == "1"),
            keep: number("keep_ms")
                .filter(|ms| *ms >= 1000)
                .map_or(DEFAULT_KEEP, Duration::from_millis),
            keep_count: number("keep_count")
                .filter(|n| *n >= 1)
                .map_or(DEFAULT_KEEP_COUNT, |n| n.min(u32::MAX as u64) as u32),
        })
    }
}

/// Service `name`'s tracking as `{N}:tracking` says; `None` when never set
/// (tracking is off).
pub(crate) async fn read(conn: &SharedConnection, name: &ServiceName) -> Result<Option<Tracking>> {
    let mut get = redis::cmd("HGETALL");
    get.arg(keys::tracking(name));
    let fields: HashMap<String, String> = conn.query(&get).await?;
    Ok(Tracking::parse(&fields))
}

/// Sets service `name`'s tracking (an operator's change, seen by every
/// instance within a second).
pub(crate) async fn set(
    conn: &SharedConnection,
    name: &ServiceName,
    tracking: Tracking,
) -> Result<()> {
    tracking.validate()?;
    let mut hset = redis::cmd("HSET");
    hset.arg(keys::tracking(name));
    for (k, v) in tracking.fields() {
        hset.arg(k).arg(v);
    }
    conn.query::<()>(&hset).await
}

/// Sets service `name`'s tracking to `tracking` unless it was set before
/// (a consumer's start: the builder gives the first value, an operator's
/// later change wins). Returns what holds now.
pub(crate) async fn ensure(
    conn: &SharedConnection,
    name: &ServiceName,
    tracking: Tracking,
) -> Result<Tracking> {
    tracking.validate()?;
    let mut hsetnx = redis::cmd("HSETNX");
    let [(on, value), ..] = tracking.fields();
    hsetnx.arg(keys::tracking(name)).arg(on).arg(value);
    let created: bool = conn.query(&hsetnx).await?;
    if created {
        set(conn, name, tracking).await?;
        return Ok(tracking);
    }
    Ok(read(conn, name).await?.unwrap_or(tracking))
}

/// The value of the field `''` of every `{N/p}:tasks` and `{N/p}:running`
/// (`track.lua`'s `PAD`, which a test holds equal): longer than Redis
/// keeps in a listpack, so that both are hash tables from their first
/// write. In a listpack each field a batch writes is found by scanning
/// the others, up to 512 in Redis 7.0 as packaged here: 28,800
/// instructions a write, three fifths of what a tracked batch enqueue
/// cost Redis (BENCHMARKS.md, "Task tracking").
pub(crate) const PAD: &str =
    "--------------------------------------------------------------------------------";

/// The keys and channel of one partition's records, and how its scripts
/// publish.
#[derive(Debug, Clone)]
pub(crate) struct PartitionKeys {
    tasks: String,
    running: String,
    cancels: String,
    ended: String,
    channel: String,
    publish: &'static str,
}

impl PartitionKeys {
    /// Partition `p` of `name`; on a Cluster (`sharded`), scripts publish
    /// with `SPUBLISH`, as the channel lives in the partition's slot.
    pub(crate) fn new(name: &ServiceName, p: u32, sharded: bool) -> Self {
        PartitionKeys {
            tasks: keys::tasks(name, p),
            running: keys::running(name, p),
            cancels: keys::cancel_requests(name, p),
            ended: keys::ended(name, p),
            channel: keys::final_channel(name, p),
            publish: if sharded { "SPUBLISH" } else { "PUBLISH" },
        }
    }

    /// The partition's records.
    pub(crate) fn tasks(&self) -> &str {
        &self.tasks
    }

    /// The partition's cancel requests.
    pub(crate) fn cancels(&self) -> &str {
        &self.cancels
    }

    /// The partition's running tracked tasks.
    pub(crate) fn running(&self) -> &str {
        &self.running
    }

    /// The partition's `{N/p}:final` channel.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// How its scripts publish there (`SPUBLISH` on a Cluster).
    pub(crate) fn publish(&self) -> &'static str {
        self.publish
    }

    /// The tracking block (`track.lua`) for `tracking`, as a script's
    /// arguments; an empty block (seven empty values) when `tracking` is
    /// `None`.
    pub(crate) fn block<'a>(&'a self, tracking: Option<&'a Tracking>) -> Block<'a> {
        Block {
            keys: self,
            tracking,
        }
    }
}

/// A partition's tracking block (`track.lua`): seven arguments of a
/// script, written where they go (a script's arguments or a command's
/// buffer).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block<'a> {
    keys: &'a PartitionKeys,
    tracking: Option<&'a Tracking>,
}

impl ToRedisArgs for Block<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let keys = self.keys;
        match self.tracking {
            Some(t) => {
                out.write_arg(keys.tasks.as_bytes());
                out.write_arg_fmt(STALE.as_millis());
                out.write_arg_fmt(t.keep.as_millis());
                out.write_arg_fmt(t.keep_count);
                out.write_arg(keys.ended.as_bytes());
                out.write_arg(keys.publish.as_bytes());
                out.write_arg(keys.channel.as_bytes());
            }
            None => {
                for _ in 0..7 {
                    out.write_arg(b"");
                }
            }
        }
    }

    fn num_of_args(&self) -> usize {
        7
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The producer writes the pad the scripts write.
    #[test]
    fn the_pad_is_the_scripts_pad_and_too_long_for_a_listpack() {
        let lua = include_str!("../scripts/track.lua");
        assert!(lua.contains(&format!("local PAD = '{PAD}'")));
        assert!(PAD.len() > 64, "hash-max-listpack-value is 64 by default");
    }

    #[test]
    fn settings_read_back_as_written_and_bad_fields_take_their_defaults() {
        let t = Tracking::on().keep(Duration::from_secs(60)).keep_count(7);
        let fields: HashMap<String, String> = t
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(Tracking::parse(&fields), Some(t));
        let odd: HashMap<String, String> = [("on", "yes"), ("keep_ms", "x"), ("keep_count", "0")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(Tracking::parse(&odd), Some(Tracking::off()));
        assert_eq!(Tracking::parse(&HashMap::new()), None);
    }

    #[test]
    fn out_of_range_settings_are_refused_by_name() {
        for bad in [
            Tracking::on().keep(Duration::ZERO),
            Tracking::on().keep_count(0),
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains("tracking"), "{e}");
        }
        Tracking::on().validate().unwrap();
    }
}
