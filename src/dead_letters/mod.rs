//! The dead letters (docs/design.md §6): tasks that failed their last attempt,
//! failed permanently, cannot be decoded or are too large, kept per
//! partition in `{N/p}:dead` with the reason, the last error, the attempt
//! count and the original payload. This module lists them across
//! partitions a page at a time (oldest or newest first, by reason: see
//! [`Query`]), finds one by id, replays them (back to their partition,
//! attempts reset) and purges them.
//!
//! Listing reads a page of each partition's dead letters (`XRANGE` /
//! `XREVRANGE … COUNT`) in one pipelined round trip, and nothing of the
//! partition streams the consumers read.

mod bulk;
mod letter;
mod page;
mod scan;

pub(crate) use bulk::Act;
pub use letter::DeadLetter;
pub(crate) use letter::letter;
pub use page::{Cursor, Order, Page, Query};
pub use scan::Scan;

use std::fmt;
use std::sync::{Arc, LazyLock};

use deadpool_redis::redis;

use crate::config::ServiceName;
use crate::connection::{self, Redis, SharedConnection};
use crate::entry::TaskId;
use crate::error::{Duplicate, Error, Result};
use crate::keys;
use crate::priority::Levels;

static REPLAY: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(crate::tracking::tracked_script!("replay.lua")));

/// A service's dead letters.
///
/// ```no_run
/// # async fn demo() -> peerq::Result<()> {
/// use peerq::dead_letters::DeadLetters;
///
/// let dead = DeadLetters::connect("redis://127.0.0.1/", "mail-sender").await?;
/// for letter in dead.list(100).await? {
///     println!("{} {:?}: {} ({})", letter.partition, letter.task_id, letter.reason, letter.error);
///     if letter.reason == "failed" {
///         dead.replay(&letter).await?; // runs again, from attempt 1
///     }
/// }
/// # Ok(()) }
/// ```
pub struct DeadLetters {
    name: ServiceName,
    conn: Arc<SharedConnection>,
    /// The partitions looked at, ascending: every level's, of the
    /// generation in use and, around a reshard, of the one it replaces
    /// (docs/design.md §21).
    units: Arc<[u32]>,
}

impl fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetters")
            .field("name", &self.name)
            .field("partitions", &self.units.len())
            .finish_non_exhaustive()
    }
}

impl DeadLetters {
    /// The dead letters of service `name` on `redis` (a URL, or a
    /// [`Redis`] for a Cluster, a pool or TLS files); its partitions are
    /// read from `{name}:meta`. A Redis that cannot be reached is an
    /// [`Error::Connect`] naming the URL without its password; a service
    /// that never recorded its partitions there, an
    /// [`Error::UnknownService`].
    pub async fn connect(redis: impl Into<Redis>, name: &str) -> Result<Self> {
        let name = ServiceName::new(name)?;
        let given: Redis = redis.into();
        let shown = given.to_string();
        let conn = SharedConnection::new(given.backend()?);
        let mut hmget = redis::cmd("HMGET");
        hmget
            .arg(keys::meta(&name))
            .arg("partitions")
            .arg(Levels::FIELD);
        let (partitions, levels): (Option<u32>, Option<String>) = conn
            .query(&hmget)
            .await
            .map_err(|e| connection::at(&shown, e))?;
        let partitions = partitions.ok_or_else(|| Error::UnknownService {
            name: name.to_string(),
            url: shown.clone(),
        })?;
        // Every level's partitions have dead letters of their own.
        let levels = Levels::parse(levels.as_deref())?;
        let units = crate::reshard::read_units(&conn, &name, partitions, levels.count())
            .await
            .map_err(|e| connection::at(&shown, e))?;
        Ok(DeadLetters::new(Arc::new(conn), name, units))
    }

    /// The dead letters of service `name` in partitions `units`, on a
    /// connection already open (the admin tools').
    pub(crate) fn new(conn: Arc<SharedConnection>, name: ServiceName, units: Arc<[u32]>) -> Self {
        DeadLetters { name, conn, units }
    }

    /// Up to `limit` dead letters over all partitions, oldest first.
    pub async fn list(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        Ok(self.page(&Query::new(limit)).await?.letters)
    }

    /// The dead letter at `cursor` (`<partition>/<id>`); `None` if there is
    /// none (any more). Any partition is read, not only those of the layout
    /// this value was made with: a reshard since may have moved the letter
    /// to a partition of the new one (docs/design.md §21).
    pub async fn get(&self, cursor: &Cursor) -> Result<Option<DeadLetter>> {
        let mut xrange = redis::cmd("XRANGE");
        xrange
            .arg(keys::dead(&self.name, cursor.partition))
            .arg(&cursor.id)
            .arg(&cursor.id);
        let reply: redis::streams::StreamRangeReply = self.conn.query(&xrange).await?;
        Ok(reply
            .ids
            .into_iter()
            .next()
            .map(|entry| DeadLetter::read(cursor.partition, entry)))
    }

    /// The dead letters with stream id `id` in any partition (ids are per
    /// partition, so two partitions may hold one each), in one pipelined
    /// round trip.
    pub async fn find(&self, id: &str) -> Result<Vec<DeadLetter>> {
        let id = Cursor::valid_id(id)?;
        if self.units.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for &p in self.units.iter() {
            pipe.cmd("XRANGE")
                .arg(keys::dead(&self.name, p))
                .arg(id)
                .arg(id);
        }
        let replies: Vec<redis::streams::StreamRangeReply> = self.conn.query_pipe(&pipe).await?;
        Ok((self.units.iter().copied())
            .zip(replies)
            .flat_map(|(p, reply)| reply.ids.into_iter().map(move |e| DeadLetter::read(p, e)))
            .collect())
    }

    /// Enqueues `letter`'s task again in its partition with attempt 1 and
    /// removes the letter, in one step; false if it was gone already (a
    /// replay happens once). A task with a unique key takes its lock again;
    /// while another task holds the key, nothing is replayed and the letter
    /// stays: [`Error::Duplicate`] names that task.
    pub async fn replay(&self, letter: &DeadLetter) -> Result<bool> {
        let p = letter.partition;
        let task = letter.task_id.as_ref().map_or("", TaskId::as_str);
        let mut script = REPLAY.key(keys::dead(&self.name, p));
        script
            .key(keys::stream(&self.name, p))
            .key(keys::tasks(&self.name, p))
            .key(keys::ended(&self.name, p))
            .key(keys::ended_at(&self.name, p))
            .arg(&letter.id)
            .arg(task);
        for (k, v) in letter.replayed() {
            script.arg(k).arg(v);
        }
        let reply: (i64, String) = self.conn.invoke(&script).await?;
        match reply {
            (1, _) => Ok(true),
            (0, _) => Ok(false),
            (-2, holder) => Err(Error::Duplicate(Duplicate {
                unique: letter.unique.clone().unwrap_or_default(),
                existing: TaskId::from(holder.as_str()),
            })),
            (-3, _) => Err(Error::Runtime(format!(
                "partition {} is sealed by a reshard: its dead letters move to the new layout, \
                 replay them there once `peerq status` shows the reshard open",
                crate::partition::Shown(letter.partition)
            ))),
            _ => Err(Error::Runtime(format!(
                "dead letter {} of partition {} holds no task fields to replay; purge it",
                letter.id, letter.partition
            ))),
        }
    }

    /// Removes `letter` for good; false if it was gone already.
    pub async fn purge(&self, letter: &DeadLetter) -> Result<bool> {
        let mut del = redis::cmd("XDEL");
        del.arg(keys::dead(&self.name, letter.partition))
            .arg(&letter.id);
        let removed: u64 = self.conn.query(&del).await?;
        Ok(removed == 1)
    }

    /// Removes every dead letter of the service; returns how many.
    pub async fn purge_all(&self) -> Result<u64> {
        let mut total = 0;
        for &p in self.units.iter() {
            let key = keys::dead(&self.name, p);
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("XLEN")
                .arg(&key)
                .cmd("DEL")
                .arg(&key)
                .ignore();
            let (len,): (u64,) = self.conn.query_pipe(&pipe).await?;
            total += len;
        }
        Ok(total)
    }

    /// Replays every dead letter (with `reason`, if given) that was dead
    /// when the call began, partition after partition, each oldest first,
    /// 500 at a time; returns how many were replayed. A letter that dies
    /// meanwhile (a replayed task that fails for good at once) is left
    /// alone: the call ends at each partition's last letter as it began,
    /// by position in Redis, whatever the clocks say.
    pub async fn replay_all(&self, reason: Option<&str>) -> Result<u64> {
        let wanted = |letter: &DeadLetter| reason.is_none_or(|r| letter.reason == r);
        let (done, _) = self.act_on(wanted, Act::Replay, usize::MAX).await?;
        Ok(done)
    }

    /// Removes every dead letter with `reason` that was dead when the call
    /// began, 500 at a time, as [`replay_all`](Self::replay_all) goes;
    /// returns how many (without a reason, [`purge_all`](Self::purge_all)).
    pub async fn purge_reason(&self, reason: &str) -> Result<u64> {
        let wanted = |letter: &DeadLetter| letter.reason == reason;
        let (done, _) = self.act_on(wanted, Act::Purge, usize::MAX).await?;
        Ok(done)
    }
}
