//! The partition store's part in task tracking (docs/design.md §14): the
//! arguments by which the fenced moves write a tracked task's record, the
//! start of a batch's tracked tasks, and a running task's progress. Each
//! is written by a script that checks the owner record first, so a stale
//! owner writes no record.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::{RedisWrite, Script, ScriptInvocation, ToRedisArgs, Value};

use super::PartitionStore;
use crate::connection::evalsha;
use crate::entry::TaskId;
use crate::error::Result;
use crate::keys;
use crate::tracking::packed::{Finished, Ran};
use crate::tracking::{Block, Tracking, tracked_script};

static FENCED_START: LazyLock<Script> =
    LazyLock::new(|| Script::new(tracked_script!("fenced_start.lua")));
static SWEEP: LazyLock<Script> = LazyLock::new(|| Script::new(tracked_script!("sweep.lua")));
static FENCED_PROGRESS: LazyLock<Script> =
    LazyLock::new(|| Script::new(tracked_script!("fenced_progress.lua")));

/// A tracked task's record, as a fenced move writes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Track<'a> {
    /// The service's tracking, as the instance last read it.
    pub(crate) tracking: Tracking,
    /// The task's id.
    pub(crate) task: &'a str,
    /// Why it is dead (`failed`, `permanent`, …); empty otherwise.
    pub(crate) reason: &'a str,
    /// The failed attempt's error; empty for none.
    pub(crate) error: &'a str,
    /// The attempt it runs next (or, dead, its last).
    pub(crate) attempt: u32,
}

/// How one task of a batch starts: its stream id, task id, and the
/// attempt it runs.
pub(crate) type Starting<'a> = (&'a str, &'a str, u32);

/// A tracked task that succeeded under this store's token, as its ack
/// writes its final record whole (`fenced_ack.lua`): the record is
/// written from these straight into the ack's command.
#[derive(Debug)]
pub(crate) struct Succeeded {
    pub(crate) task: TaskId,
    /// The attempt that ended it, and when it started (Unix ms, this
    /// instance's clock).
    pub(crate) attempt: u32,
    pub(crate) started_at: u64,
    /// As its entry says (Unix ms).
    pub(crate) enqueued_at: u64,
    /// Unix ms, this instance's clock.
    pub(crate) finished_at: u64,
    /// The last progress written, if any.
    pub(crate) progress: Option<Vec<u8>>,
    /// The encoded result; empty for none.
    pub(crate) result: Vec<u8>,
}

/// A final record as one argument, written into the command's buffer.
struct Record<'a>(Finished<'a>);

impl ToRedisArgs for Record<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        self.0
            .write(&mut arg)
            .expect("a command's buffer takes every byte");
    }
}

/// A running value as one argument (`Ran`'s text).
struct Running<'a>(Ran<'a>);

impl ToRedisArgs for Running<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(self.0);
    }
}

impl PartitionStore {
    /// Adds a fenced move's tracking arguments (task id, state, reason,
    /// error, attempt, the tracking block) to `script`: empty ones when
    /// `track` is `None`.
    pub(super) fn track_args(
        &self,
        script: &mut ScriptInvocation<'_>,
        track: Option<&Track<'_>>,
        state: &str,
    ) {
        match track {
            Some(t) => {
                script
                    .arg(t.task)
                    .arg(state)
                    .arg(t.reason)
                    .arg(t.error)
                    .arg(t.attempt)
                    .arg(self.records.block(Some(&t.tracking)));
            }
            None => {
                script
                    .arg("")
                    .arg("")
                    .arg("")
                    .arg("")
                    .arg(0)
                    .arg(self.records.block(None));
            }
        }
    }

    /// What a task at `attempt` that starts at `started_at` (Unix ms, this
    /// instance's clock) runs as: its `{N/p}:running` value, and its final
    /// record's `ran`.
    pub(crate) fn ran(&self, attempt: u32, started_at: u64) -> Ran<'_> {
        Ran {
            instance: &self.consumer,
            token: self.token,
            attempt,
            started_at,
        }
    }

    /// [`ran`](Self::ran) as text.
    pub(crate) fn running(&self, attempt: u32, started_at: u64) -> String {
        self.ran(attempt, started_at).to_string()
    }

    /// Writes that `tasks` start now on this instance, at `started_at`
    /// (`{N/p}:running`); returns the stream ids of those that must not
    /// run (a cancel request came first: acked and `cancelled` in the same
    /// step), or `Ok(None)` when fenced.
    pub(crate) async fn start(
        &self,
        tracking: &Tracking,
        started_at: u64,
        tasks: &[Starting<'_>],
    ) -> Result<Option<Vec<String>>> {
        let (stream, owner) = (&self.stream, &self.owner);
        let block = self.records.block(Some(tracking));
        let bytes = tasks.iter().map(|(s, t, _)| s.len() + t.len() + 80);
        let bytes = stream.len() + owner.len() + self.record.len() + 200 + bytes.sum::<usize>();
        let mut cmd = evalsha(&FENCED_START, 2, 10 + 3 * tasks.len(), bytes);
        cmd.arg(stream)
            .arg(owner)
            .arg(&self.record)
            .arg(keys::GROUP);
        cmd.arg(block).arg(tasks.len());
        for (_, task, attempt) in tasks {
            cmd.arg(*task).arg(Running(self.ran(*attempt, started_at)));
        }
        for (stream_id, _, _) in tasks {
            cmd.arg(*stream_id);
        }
        let reply: Value = self.conn.eval(&FENCED_START, &cmd).await?;
        if matches!(reply, Value::Int(_)) {
            return Ok(None);
        }
        let skipped: Vec<String> = deadpool_redis::redis::from_redis_value(reply)
            .map_err(deadpool_redis::redis::RedisError::from)?;
        Ok(Some(skipped))
    }

    /// `task`'s final record as an argument of its ack.
    pub(super) fn record<'a>(&'a self, task: &'a Succeeded) -> impl ToRedisArgs + 'a {
        Record(Finished {
            state: "succeeded",
            enqueued_at: task.enqueued_at,
            attempt: task.attempt,
            ran: self.ran(task.attempt, task.started_at),
            finished_at: task.finished_at,
            progress: task.progress.as_deref(),
            result: &task.result,
        })
    }

    /// Writes a running task's progress (encoded), only while this
    /// instance owns the partition and the record says the task runs
    /// under this token. `Ok(false)` when not written.
    pub(crate) async fn progress(&self, task: &str, progress: &[u8]) -> Result<bool> {
        let mut script = FENCED_PROGRESS.key(&self.owner);
        script
            .key(self.records.tasks())
            .key(self.records.running())
            .arg(&self.record)
            .arg(self.token)
            .arg(progress)
            .arg(task);
        let written: i64 = self.conn.invoke(&script).await?;
        Ok(written == 1)
    }

    /// Whether task `id` has a cancel request: what a cancel heard on
    /// `{N}:cancels` must find before it stops the task (a message alone,
    /// which anyone who may publish there can send, stops nothing).
    pub(crate) async fn cancel_requested(&self, id: &str) -> Result<bool> {
        let mut zscore = deadpool_redis::redis::cmd("ZSCORE");
        zscore.arg(self.records.cancels()).arg(id);
        let score: Option<f64> = self.conn.query(&zscore).await?;
        Ok(score.is_some())
    }

    /// The owner's care of the partition's records (sweep.lua): the final
    /// ones past `tracking`'s retention go, and, from `cursor` (`None`:
    /// not now), about `slice` fields are swept of records that stopped
    /// changing. Returns the sweep's next cursor (`"0"`: a pass ended), how
    /// many it forgot, and how soon the oldest final record left is due
    /// to go (`None`: none is left).
    pub(crate) async fn sweep(
        &self,
        tracking: &Tracking,
        cursor: Option<&str>,
        slice: usize,
    ) -> Result<(String, u64, Option<Duration>)> {
        let mut script = SWEEP.key(self.records.tasks());
        script
            .arg(cursor.unwrap_or(""))
            .arg(slice)
            .arg(self.records.block(Some(tracking)));
        let (next, forgotten, due): (String, u64, i64) = self.conn.invoke(&script).await?;
        let due = u64::try_from(due).ok().map(Duration::from_millis);
        Ok((next, forgotten, due))
    }

    /// The tracking block of this partition for `tracking`, for the acks.
    pub(super) fn block<'a>(&'a self, tracking: &'a Tracking) -> Block<'a> {
        self.records.block(Some(tracking))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use deadpool_redis::redis::AsyncCommands;
    use peerq_test_support as support;

    use super::PartitionStore;
    use crate::config::ServiceName;
    use crate::connection::SharedConnection;
    use crate::instance::InstanceId;
    use crate::keys;
    use crate::tracking::Tracking;

    /// A private Redis and the store of partition 0 of a new service, under
    /// fencing token 1.
    fn setup() -> (support::RedisServer, PartitionStore, ServiceName) {
        let server = support::RedisServer::start();
        let conn = Arc::new(SharedConnection::new(server.pool()));
        let name = ServiceName::new(&support::unique_name("records")).unwrap();
        let store = PartitionStore::new(conn, &name, 0, 1, &InstanceId::generate(), 1 << 20);
        (server, store, name)
    }

    /// The owner's care forgets what the retention and the sweep time say,
    /// and nothing else: a record that still changes, or whose task runs,
    /// stays; a final one goes by its end, not by when it was written.
    #[tokio::test]
    async fn the_owners_care_forgets_stale_records_and_final_ones_past_retention() {
        let (server, store, name) = setup();
        let mut raw = server.pool().get().await.unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let days = |n: u64| now - n * 86_400_000;
        let tasks = keys::tasks(&name, 0);
        // Records as the scripts write them: `cmsgpack.pack(name, value,
        // …)`, written here by Redis's own packer.
        let records: [(&str, &str, u64, u64); 7] = [
            // Not final, untouched for 8 days: forgotten.
            ("old", "'s', 'waiting', 'q', ARGV[2]", days(8), 0),
            // A cancel request for a task that never came: forgotten.
            ("asked", "'c', ARGV[2]", days(8), 0),
            // Enqueued a day ago: kept.
            ("young", "'s', 'waiting', 'q', ARGV[2]", days(1), 0),
            // Enqueued long ago but retried an hour ago: kept.
            (
                "retried",
                "'s', 'waiting', 'q', ARGV[2]) .. cmsgpack.pack('s', 'retrying', 'd', ARGV[3]",
                days(8),
                now - 3_600_000,
            ),
            // Untouched for 8 days but running now: kept.
            ("runs", "'s', 'waiting', 'q', ARGV[2]", days(8), 0),
            // Final, ended 10 s ago, and just now.
            ("done", "'s', 'succeeded', 'f', ARGV[2]", now - 10_000, 0),
            ("fresh", "'s', 'succeeded', 'f', ARGV[2]", now, 0),
        ];
        for (id, fields, a, b) in records {
            let lua =
                format!("return redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack({fields}))");
            let _: i64 = deadpool_redis::redis::cmd("EVAL")
                .arg(lua)
                .arg(1)
                .arg(&tasks)
                .arg(id)
                .arg(a)
                .arg(b)
                .query_async(&mut *raw)
                .await
                .unwrap();
        }
        let () = raw
            .hset(keys::running(&name, 0), "runs", "i|1|1|0")
            .await
            .unwrap();
        let _: u64 = raw
            .rpush(keys::ended(&name, 0), &["done", "fresh"])
            .await
            .unwrap();
        let runs = [format!("{} 1", now - 10_000), format!("{now} 1")];
        let _: u64 = raw.rpush(keys::ended_at(&name, 0), &runs).await.unwrap();
        let tracking = Tracking::on().keep(Duration::from_secs(5));

        // Without a cursor, only the retention: `done` goes, `old` stays.
        let (next, forgotten, due) = store.sweep(&tracking, None, 1000).await.unwrap();
        assert_eq!((next.as_str(), forgotten), ("", 0));
        let due = due.expect("`fresh` is left");
        assert!(
            due > Duration::from_secs(3) && due <= Duration::from_secs(5),
            "{due:?}"
        );
        let ids = |fields: Vec<String>| -> BTreeSet<String> { fields.into_iter().collect() };
        let left = ids(raw.hkeys(&tasks).await.unwrap());
        let want = ["asked", "fresh", "old", "retried", "runs", "young"];
        assert_eq!(left, want.map(String::from).into());
        let list: Vec<String> = raw.lrange(keys::ended(&name, 0), 0, -1).await.unwrap();
        assert_eq!(list, ["fresh"]);
        let runs: Vec<String> = raw.lrange(keys::ended_at(&name, 0), 0, -1).await.unwrap();
        assert_eq!(runs, [format!("{now} 1")]);

        // A whole pass: the two stale ones go.
        let (mut cursor, mut forgotten) = ("0".to_owned(), 0);
        loop {
            let (next, n, _) = store.sweep(&tracking, Some(&cursor), 1000).await.unwrap();
            forgotten += n;
            cursor = next;
            if cursor == "0" {
                break;
            }
        }
        assert_eq!(forgotten, 2);
        let left = ids(raw.hkeys(&tasks).await.unwrap());
        let want = ["fresh", "retried", "runs", "young"];
        assert_eq!(left, want.map(String::from).into());

        // A run a replay left empty, ended long ago, goes, and the next
        // care is due when `fresh` is (not at once, again and again).
        let _: u64 = raw
            .lpush(keys::ended_at(&name, 0), format!("{} 0", now - 60_000))
            .await
            .unwrap();
        let (_, _, due) = store.sweep(&tracking, None, 1000).await.unwrap();
        assert!(due.unwrap() > Duration::from_secs(3), "{due:?}");
        let runs: Vec<String> = raw.lrange(keys::ended_at(&name, 0), 0, -1).await.unwrap();
        assert_eq!(runs, [format!("{now} 1")]);
    }

    /// A record is appended to as its task changes, and written anew from
    /// its decoded fields once over 512 bytes (track.lua, `append`): a task
    /// that reports progress all day keeps one record of bounded size,
    /// with its last progress and what it held before.
    #[tokio::test]
    async fn a_record_written_often_stays_small_and_keeps_its_last_values() {
        let (server, store, name) = setup();
        assert_eq!(store.acquire().await.unwrap(), None);
        let mut raw = server.pool().get().await.unwrap();
        let record = crate::tracking::packed::waiting(1_000);
        let () = raw.hset(keys::tasks(&name, 0), "t1", record).await.unwrap();
        let () = raw
            .hset(keys::running(&name, 0), "t1", store.running(1, 2_000))
            .await
            .unwrap();
        for step in 0..50u8 {
            assert!(store.progress("t1", &[step; 100]).await.unwrap());
        }
        let record: Vec<u8> = raw.hget(keys::tasks(&name, 0), "t1").await.unwrap();
        assert!(record.len() < 512 + 110, "{} bytes", record.len());
        let fields = crate::tracking::packed::decode(&record).unwrap();
        assert_eq!(fields["progress"], [49u8; 100]);
        assert_eq!(fields["state"], b"waiting");
        assert_eq!(fields["enqueued_at"], b"1000");
    }
}
