//! A user's cancel (docs/design.md §14). The caller holds no fencing token,
//! so it writes only the request into the task's record (and, for a task
//! that is not running, its end), in `cancel.lua`; the fenced scripts that
//! start, retry or finish a task read the request. Whichever of them and
//! the cancel Redis ran first decides, on every path. A running task's
//! owner is woken on `{N}:cancels`, wherever the task runs now.

use deadpool_redis::redis::{self, Value};

use super::handle::{TaskHandle, TaskState};
use super::{CANCEL, PartitionKeys, Tracking};
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::keys;

/// What a cancel did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// It was waiting, delayed or retrying: it is `cancelled` now and
    /// never starts.
    Cancelled,
    /// It is running: its owner stops it (its handler's `cancelled()`
    /// fires), and it ends `cancelled`, never retried nor dead-lettered,
    /// unless it finished first.
    Requested {
        /// The instance that ran it when cancelled.
        instance: Option<String>,
    },
    /// It had ended already, in this state; nothing changed.
    AlreadyFinal(TaskState),
    /// No record: tracking was off when it was enqueued, or no such task.
    /// The request is kept for a week, so such a task never starts.
    Unknown,
}

/// Cancels `handle` (naming its partition) of service `name`, under
/// `tracking` (its retention).
pub(crate) async fn cancel(
    conn: &SharedConnection,
    name: &ServiceName,
    handle: &TaskHandle,
    partition: u32,
    tracking: &Tracking,
) -> Result<CancelOutcome> {
    let (outcome, wake) = request(conn, name, handle, partition, tracking).await?;
    if wake {
        wake_all(conn, name, &[(partition, handle.id().as_str())]).await?;
    }
    Ok(outcome)
}

/// Writes the cancel of `handle` (naming its partition) of service
/// `name`, under `tracking`, without waking its owner: the outcome, and
/// whether the owner must be woken ([`wake_all`]). Many cancels at once
/// (a batch's) write every request before any owner hears of one: a
/// task woken early would free its permit for a task whose request is not
/// written yet, which would then start.
pub(crate) async fn request(
    conn: &SharedConnection,
    name: &ServiceName,
    handle: &TaskHandle,
    partition: u32,
    tracking: &Tracking,
) -> Result<(CancelOutcome, bool)> {
    let sharded = conn.backend().is_cluster();
    let records = PartitionKeys::new(name, partition, sharded);
    let id = handle.id().as_str();
    let mut script = CANCEL.key(records.tasks());
    script.arg(id);
    script.arg(records.block(Some(tracking)));
    let (what, state): (String, String) = conn.invoke(&script).await?;
    // `state` is the final state for 'final', the running value for 'running'.
    Ok(match what.as_str() {
        "final" => (
            CancelOutcome::AlreadyFinal(TaskState::parse(&state).unwrap_or(TaskState::Cancelled)),
            false,
        ),
        "cancelled" => (CancelOutcome::Cancelled, false),
        "running" => {
            // The script replied the task's running value,
            // `instance|token|attempt|started_at`.
            let instance = state.split('|').next().filter(|i| !i.is_empty());
            let instance = instance.map(str::to_owned);
            (CancelOutcome::Requested { instance }, true)
        }
        // It may be running untracked-at-enqueue: its start wrote no
        // record yet, or it runs on an instance that will read the request
        // when it ends. Wake the owners all the same.
        _ => (CancelOutcome::Unknown, true),
    })
}

/// Tells the service's instances that a user cancelled each of `tasks`
/// (partition and task id), in one pipeline.
pub(crate) async fn wake_all(
    conn: &SharedConnection,
    name: &ServiceName,
    tasks: &[(u32, &str)],
) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    let publish = if conn.backend().is_cluster() {
        "SPUBLISH"
    } else {
        "PUBLISH"
    };
    let mut pipe = redis::pipe();
    for (partition, id) in tasks {
        let mut cmd = redis::cmd(publish);
        cmd.arg(keys::cancels(name))
            .arg(format!("{partition}/{id}"));
        pipe.add_command(cmd);
    }
    conn.query_pipe_each::<Vec<Value>>(&mut pipe).await?;
    Ok(())
}
