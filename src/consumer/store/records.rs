//! The partition store's part in task tracking (docs/design.md §14): the
//! arguments by which the fenced moves write a tracked task's record, the
//! start of a batch's tracked tasks, and a running task's progress. Each
//! is written by a script that checks the owner record first, so a stale
//! owner writes no record.

use std::sync::LazyLock;

use deadpool_redis::redis::{Script, ScriptInvocation, Value};

use super::PartitionStore;
use crate::error::Result;
use crate::keys;
use crate::tracking::{STALE, Tracking, tracked_script};

static FENCED_START: LazyLock<Script> =
    LazyLock::new(|| Script::new(tracked_script!("fenced_start.lua")));
static FENCED_PROGRESS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/fenced_progress.lua")));

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

/// How one task of a batch starts: its stream id, task id and attempt.
pub(crate) type Starting<'a> = (&'a str, &'a str, u32);

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
                    .arg(t.attempt);
                self.records.block(script, Some(&t.tracking));
            }
            None => {
                script.arg("").arg("").arg("").arg("").arg(0);
                self.records.block(script, None);
            }
        }
    }

    /// Writes that `tasks` start now on this instance (`{N/p}:running`); returns the stream ids of those that must not run (a
    /// cancel request came first: acked and `cancelled` in the same step),
    /// or `Ok(None)` when fenced.
    pub(crate) async fn start(
        &self,
        tracking: &Tracking,
        tasks: &[Starting<'_>],
    ) -> Result<Option<Vec<String>>> {
        let mut script = FENCED_START.key(&self.stream);
        script
            .key(&self.owner)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(&self.consumer)
            .arg(self.token);
        self.records.block(&mut script, Some(tracking));
        for (stream_id, task, attempt) in tasks {
            script.arg(*stream_id).arg(*task).arg(*attempt);
        }
        let reply: Value = self.conn.invoke(&script).await?;
        if matches!(reply, Value::Int(_)) {
            return Ok(None);
        }
        let skipped: Vec<String> = deadpool_redis::redis::from_redis_value(reply)
            .map_err(deadpool_redis::redis::RedisError::from)?;
        Ok(Some(skipped))
    }

    /// Writes a running task's progress (encoded), only while this
    /// instance owns the partition and the record says the task runs
    /// under this token. `Ok(false)` when not written.
    pub(crate) async fn progress(&self, task: &str, progress: &[u8]) -> Result<bool> {
        let mut script = FENCED_PROGRESS.key(&self.owner);
        script
            .key(self.records.record(task))
            .key(self.records.running())
            .arg(&self.record)
            .arg(self.token)
            .arg(progress)
            .arg(STALE.as_millis() as u64)
            .arg(task);
        let written: i64 = self.conn.invoke(&script).await?;
        Ok(written == 1)
    }

    /// The tracking block of this partition for `tracking`, for the acks.
    pub(super) fn block(&self, script: &mut ScriptInvocation<'_>, tracking: &Tracking) {
        self.records.block(script, Some(tracking));
    }
}
