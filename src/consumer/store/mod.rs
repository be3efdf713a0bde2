//! The partition store: every command the consumer sends on one
//! partition's keys (`{N/p}:stream`, `:owner`, `:delayed`, `:dead`,
//! `:failures`, `:unique`) and on the release marks, in one place. Nothing else in the consumer builds a
//! Redis command, so the key layout, the scripts and the reply formats are
//! read here alone, and a change to one (Redis Cluster, say) is made here.
//!
//! Every write to a partition's entries is fenced (docs/design.md §4 rule 8):
//! a script that acts only while this instance's `<token>:<id>` is the
//! partition's owner record, so a stale owner's writes are refused. Each
//! script's keys share one slot, so it is atomic under Redis Cluster.
//!
//! - here: the owner record, fenced moves and retries, claims, keeping
//!   entries fresh, promotion, trimming, group creation;
//! - [`sizes`]: what the store knows of the partition's sizes, from its
//!   looks at the group, its counts, and its own writes;
//! - [`acks`]: the fenced acks of many partitions in one pipeline;
//! - [`attempts`]: ordered mode's attempt records (delivery and failure
//!   counts);
//! - [`reader`]: the reads, parsed into [`Fetched`] entries;
//! - [`marks`]: the release marks of `{N}:transition`;
//! - and the service-wide commands of the start: every partition's group,
//!   Redis's eviction policy.

mod acks;
mod attempts;
mod completions;
mod moves;
mod reader;
mod records;
mod reply;
mod reshard;
mod sizes;
#[cfg(test)]
mod tests;

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use deadpool_redis::redis::{self, FromRedisValue, Script, Value};

pub(crate) use self::acks::{AckGroup, AckReply, ack};
pub(crate) use self::attempts::{Attempts, Deliveries, InPlace, Recorded};
pub(crate) use self::reader::{BlockingReads, Fetched, Unreadable, is_nogroup, unblock};
pub(crate) use self::records::{Starting, Succeeded, Track};
use self::reply::AutoClaim;
pub(crate) use self::reshard::Retire;
pub(crate) use self::sizes::{Group, Sizes};
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::entry::Entry;
use crate::error::Result;
use crate::instance::InstanceId;
use crate::keys;
use crate::tracking::{PartitionKeys, tracked_script};

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/acquire.lua")));
static FENCED_MOVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(tracked_script!("fenced_move.lua")));
static FENCED_CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/fenced_claim.lua")));
static FENCED_KEEP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/fenced_keep.lua")));
static FENCED_RETRY: LazyLock<Script> =
    LazyLock::new(|| Script::new(tracked_script!("fenced_retry.lua")));
static PROMOTE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../../scripts/unique.lua"),
        include_str!("../../scripts/sealed.lua"),
        include_str!("../../scripts/promote.lua")
    ))
});
static TRIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/trim.lua")));

/// An entry's fields, names and values, as written to a stream.
pub(crate) type Fields = Vec<(String, Vec<u8>)>;

/// The owner record of a partition: `<token>:<instance id>`.
fn owner_record(token: u64, id: &InstanceId) -> String {
    format!("{token}:{id}")
}

/// What a fenced move did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moved {
    /// Acked in the partition and added at the destination.
    Yes,
    /// The entry was not pending any more (an earlier call landed and its
    /// reply was lost): nothing was added.
    NotPending,
    /// Another instance owns the partition now: nothing changed.
    Fenced,
}

impl Moved {
    /// A fenced script's reply: 1, 0 or -1.
    fn from_reply(reply: i64) -> Moved {
        match reply {
            1 => Moved::Yes,
            0 => Moved::NotPending,
            _ => Moved::Fenced,
        }
    }
}

/// Where a fenced move adds the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum To {
    /// The end of the partition's stream (a hand-back, a take-over).
    Stream,
    /// The partition's dead letters.
    DeadLetters,
}

/// What a claim took over.
#[derive(Debug)]
pub(crate) struct Claimed {
    /// The entries (only their ids, `entry` unread, for a claim of ids).
    pub(crate) entries: Vec<Fetched>,
    /// Where the next claim starts; `0-0` when the scan is complete.
    pub(crate) next: String,
}

/// One partition as this instance owns it with one fencing token: the
/// partition's keys, and the commands on them.
#[derive(Debug)]
pub(crate) struct PartitionStore {
    conn: Arc<SharedConnection>,
    partition: u32,
    token: u64,
    stream: String,
    owner: String,
    delayed: String,
    dead: String,
    /// The unique keys' locks (docs/design.md §16).
    unique: String,
    /// The batch members' completion records (§19).
    completions: String,
    /// Told when this instance's script may have written one: the
    /// housekeeping forwards them (`completions`).
    completed: tokio::sync::Notify,
    /// Ordered mode: the failure counts of entries retried in place.
    failures: String,
    /// This instance's id: its consumer name in the group.
    consumer: String,
    /// What the owner record holds while this instance owns the partition.
    record: String,
    /// Larger entries are not parsed (`too_large`).
    max_entry_bytes: usize,
    /// The partition's task records (docs/design.md §14).
    records: PartitionKeys,
    /// What the store knows of the partition's sizes.
    known: Mutex<sizes::Known>,
    /// The service: a reshard's moves name another partition's keys.
    name: ServiceName,
}

impl PartitionStore {
    /// Partition `p` of `name`, owned by `id` with `token`; entries larger
    /// than `max_entry_bytes` are read as unreadable.
    pub(crate) fn new(
        conn: Arc<SharedConnection>,
        name: &ServiceName,
        p: u32,
        token: u64,
        id: &InstanceId,
        max_entry_bytes: usize,
    ) -> Self {
        PartitionStore {
            records: PartitionKeys::new(name, p, conn.backend().is_cluster()),
            conn,
            partition: p,
            token,
            stream: keys::stream(name, p),
            owner: keys::owner(name, p),
            delayed: keys::delayed(name, p),
            dead: keys::dead(name, p),
            unique: keys::unique(name, p),
            completions: keys::completions(name, p),
            completed: tokio::sync::Notify::new(),
            failures: keys::failures(name, p),
            consumer: id.as_str().to_owned(),
            record: owner_record(token, id),
            max_entry_bytes,
            known: Mutex::default(),
            name: name.clone(),
        }
    }

    /// The partition.
    pub(crate) fn partition(&self) -> u32 {
        self.partition
    }

    /// The Cluster slot of the partition's keys.
    pub(crate) fn slot(&self) -> u16 {
        crate::connection::cluster::slot(&self.stream)
    }

    /// The fencing token.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// Records this instance as owner (rule 3). `Ok(None)` when recorded;
    /// `Ok(Some(t))` when a token `t >= token` is recorded already (this
    /// instance is too late, and must not fetch).
    pub(crate) async fn acquire(&self) -> Result<Option<u64>> {
        // A unit of a later generation (docs/design.md §21) was never
        // given its group at a consumer's start.
        if crate::partition::generation_of(self.partition) > 0 {
            self.ensure_group().await?;
        }
        let mut script = ACQUIRE.key(&self.owner);
        script.arg(self.token).arg(&self.consumer);
        // With `wait_for_replicas`, confirmed by a replica: a record a
        // failover lost would admit the previous owner.
        let reply: i64 = self.conn.write_script(&script).await?;
        Ok((reply <= 0).then_some(reply.unsigned_abs()))
    }

    /// Acks entry `id` and adds `fields` as a new entry `to` the stream or
    /// the dead letters, atomically and only while this instance is the
    /// owner; a tracked task's record says where it went (`track`).
    pub(crate) async fn move_entry<K, V>(
        &self,
        to: To,
        id: &str,
        fields: &[(K, V)],
        track: Option<&Track<'_>>,
    ) -> Result<Moved>
    where
        K: redis::ToRedisArgs,
        V: redis::ToRedisArgs,
    {
        let destination = match to {
            To::Stream => &self.stream,
            To::DeadLetters => &self.dead,
        };
        let mut script = FENCED_MOVE.key(&self.stream);
        script
            .key(&self.owner)
            .key(destination)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(id);
        let state = match to {
            To::Stream => "waiting",
            To::DeadLetters => "dead",
        };
        self.track_args(&mut script, track, state);
        for (k, v) in fields {
            script.arg(k).arg(v);
        }
        let moved = Moved::from_reply(self.conn.invoke(&script).await?);
        if moved == Moved::Yes && to == To::DeadLetters {
            self.noted_dead_letter();
        }
        // A dead letter, or a tracked task a user's cancel ended, may be a
        // batch member's end (docs/design.md §19).
        if moved == Moved::Yes && (to == To::DeadLetters || track.is_some()) {
            self.note_completion();
        }
        Ok(moved)
    }

    /// Acks entry `id` (a failed attempt) and enqueues `next` (the next
    /// attempt) after `delay`, atomically and only while this instance is
    /// the owner; a tracked task's record says it waits (`track`).
    pub(crate) async fn retry(
        &self,
        id: &str,
        delay: Duration,
        next: &Entry,
        track: Option<&Track<'_>>,
    ) -> Result<Moved> {
        let mut script = FENCED_RETRY.key(&self.stream);
        script
            .key(&self.owner)
            .key(&self.delayed)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(id)
            .arg(delay.as_millis() as u64);
        // After an interrupted run (no delay, no failure) it waits as any
        // task not started.
        let state = if delay.is_zero() {
            "waiting"
        } else {
            "retrying"
        };
        self.track_args(&mut script, track, state);
        for (k, v) in next.fields() {
            script.arg(k).arg(v);
        }
        let moved = Moved::from_reply(self.conn.invoke(&script).await?);
        if moved == Moved::Yes {
            self.noted_retry(delay);
            // A member a user's cancel ended here (docs/design.md §19).
            if track.is_some() && next.member_of().is_some() {
                self.note_completion();
            }
        }
        Ok(moved)
    }

    /// Moves up to `limit` due delayed entries into the stream; returns how
    /// many, and how long until the next one is due (`None`: none waits).
    pub(crate) async fn promote(&self, limit: usize) -> Result<(u64, Option<Duration>)> {
        let mut script = PROMOTE.key(&self.delayed);
        script.key(&self.stream).arg(limit);
        let (moved, next, left): (u64, i64, u64) = self.conn.invoke(&script).await?;
        self.noted_promotion(moved, left);
        let next = u64::try_from(next).ok().map(Duration::from_millis);
        Ok((moved, next))
    }

    /// Trims the stream's entries every consumer has acknowledged; returns
    /// how many. (Never `XTRIM` by length: it deletes pending entries.)
    /// The failure counts of entries no longer pending go first.
    pub(crate) async fn trim(&self) -> Result<u64> {
        let mut trim = TRIM.key(&self.stream);
        trim.key(&self.failures).arg(keys::GROUP);
        self.conn.invoke(&trim).await
    }

    /// Takes over, for this instance, the entries other consumers left
    /// pending for `min_idle` or longer, from `start`, at most `count`;
    /// `Ok(None)` when fenced. `just_ids`: only their ids, and their
    /// delivery counts left as they are (ordered mode, where the count is
    /// the attempt record, see [`record_attempts`](Self::record_attempts)).
    pub(crate) async fn claim(
        &self,
        min_idle: Duration,
        start: &str,
        count: usize,
        just_ids: bool,
    ) -> Result<Option<Claimed>> {
        let mut script = FENCED_CLAIM.key(&self.stream);
        script
            .key(&self.owner)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(&self.consumer)
            .arg(min_idle.as_millis() as u64)
            .arg(start)
            .arg(count);
        if just_ids {
            script.arg("JUSTID");
        }
        let reply: Value = self.conn.invoke(&script).await?;
        if matches!(reply, Value::Int(_)) {
            return Ok(None);
        }
        let reply = AutoClaim::from_redis_value(reply).map_err(redis::RedisError::from)?;
        let mut deliveries = reply.deliveries.into_iter();
        let entries = reply.entries.into_iter().map(|raw| {
            let mut fetched = Fetched::parse(raw, self.max_entry_bytes);
            // Each earlier delivery may have been a run (docs/design.md
            // §6, earlier deliveries): taken over with the attempt they
            // give, `attempt + 1` after one run.
            let earlier = deliveries.next().map_or(1, |d| d.saturating_sub(1).max(1));
            if let (false, Ok(entry)) = (just_ids, &mut fetched.entry) {
                entry.attempt = entry.attempt.saturating_add(earlier);
            }
            fetched
        });
        Ok(Some(Claimed {
            entries: entries.collect(),
            next: reply.next,
        }))
    }

    /// Resets the idle time of `ids` (held by this instance), so nobody
    /// claims them; `Ok(false)` when fenced.
    pub(crate) async fn keep(&self, ids: &[String]) -> Result<bool> {
        let mut script = FENCED_KEEP.key(&self.stream);
        script
            .key(&self.owner)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(&self.consumer)
            .arg(ids);
        let reply: i64 = self.conn.invoke(&script).await?;
        Ok(reply >= 0)
    }

    /// Creates the consumer group again from the start of the stream, after
    /// Redis said it is gone (it lost its data, or someone deleted it), so
    /// nothing still in the stream is lost.
    pub(crate) async fn create_group(&self) -> Result<()> {
        self.conn.query(&create_group(&self.stream)).await
    }
}

/// `XGROUP CREATE <stream> <group> 0 MKSTREAM`: from the start, so tasks
/// enqueued before the group existed are delivered.
fn create_group(stream: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("XGROUP");
    cmd.arg("CREATE")
        .arg(stream)
        .arg(keys::GROUP)
        .arg("0")
        .arg("MKSTREAM");
    cmd
}

/// Creates every partition's stream and consumer group, in one pipeline;
/// `BUSYGROUP` (the group exists) is the common answer.
pub(crate) async fn create_groups(
    conn: &SharedConnection,
    name: &ServiceName,
    partitions: u32,
) -> Result<()> {
    let mut pipe = redis::pipe();
    for p in 0..partitions {
        pipe.add_command(create_group(&keys::stream(name, p)));
    }
    let replies: Vec<redis::RedisResult<Value>> = conn.query_pipe_each(&mut pipe).await?;
    for reply in replies {
        match reply {
            Ok(_) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Redis's `maxmemory-policy` (empty if it does not say), from `INFO
/// memory`, which managed services and ACL users allow more often than
/// `CONFIG GET`; on a Cluster, each master's, by its address (one server's
/// with an empty address).
pub(crate) async fn eviction_policies(conn: &SharedConnection) -> Result<Vec<(String, String)>> {
    let replies = conn.query_masters(redis::cmd("INFO").arg("memory")).await?;
    replies
        .into_iter()
        .map(|(node, info)| {
            let info: String = redis::from_redis_value(info).map_err(redis::RedisError::from)?;
            let policy = info
                .lines()
                .find_map(|l| l.strip_prefix("maxmemory_policy:"))
                .map(|p| p.trim().to_owned())
                .unwrap_or_default();
            Ok((node, policy))
        })
        .collect()
}
