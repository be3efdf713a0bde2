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
        let mut arg = out.writer_for_next_arg();
        self.0
            .write(&mut arg)
            .expect("a command's buffer takes every byte");
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
    ///
    /// Their stream ids are sent only for the tasks the first call found
    /// with a cancel request (it started the others, and wrote nothing for
    /// these), in a second call that ends them: a stream id per task in
    /// every start was a sixth of the start's bytes, and each argument
    /// costs Redis's Lua a string of its own.
    pub(crate) async fn start(
        &self,
        tracking: &Tracking,
        started_at: u64,
        tasks: &[Starting<'_>],
    ) -> Result<Option<Vec<String>>> {
        let again = match self.start_call(tracking, started_at, tasks, false).await? {
            None => return Ok(None),
            Some(asked) if asked.is_empty() => return Ok(Some(asked)),
            Some(asked) => asked,
        };
        let asked: Vec<Starting<'_>> = tasks
            .iter()
            .filter(|(_, task, _)| again.iter().any(|a| a == task))
            .copied()
            .collect();
        let ended = self.start_call(tracking, started_at, &asked, true).await;
        // Members among them ended `cancelled` (docs/design.md §19).
        self.note_completion();
        ended
    }

    /// One call of `fenced_start.lua`, with the tasks' stream ids or not
    /// (see [`start`](Self::start)): its reply's ids, `None` when fenced.
    async fn start_call(
        &self,
        tracking: &Tracking,
        started_at: u64,
        tasks: &[Starting<'_>],
        stream_ids: bool,
    ) -> Result<Option<Vec<String>>> {
        let (stream, owner) = (&self.stream, &self.owner);
        let block = self.records.block(Some(tracking));
        let bytes = tasks.iter().map(|(s, t, _)| s.len() + t.len() + 80);
        let bytes = stream.len() + owner.len() + self.record.len() + 200 + bytes.sum::<usize>();
        let mut cmd = evalsha(&FENCED_START, 2, 11 + 3 * tasks.len(), bytes);
        cmd.arg(stream)
            .arg(owner)
            .arg(&self.record)
            .arg(keys::GROUP);
        cmd.arg(block).arg(tasks.len());
        for (_, task, attempt) in tasks {
            cmd.arg(*task).arg(Running(self.ran(*attempt, started_at)));
        }
        if stream_ids {
            cmd.arg(tasks.len());
            for (stream_id, _, _) in tasks {
                cmd.arg(*stream_id);
            }
        } else {
            cmd.arg(0);
        }
        let reply: Value = self.conn.eval(&FENCED_START, &cmd).await?;
        if matches!(reply, Value::Int(_)) {
            return Ok(None);
        }
        let ids: Vec<String> = deadpool_redis::redis::from_redis_value(reply)
            .map_err(deadpool_redis::redis::RedisError::from)?;
        Ok(Some(ids))
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
mod tests;
