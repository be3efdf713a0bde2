//! A user's cancel of a batch (docs/design.md §19): cancelling a flow's
//! parent cancels its children that are not final, its subflows all the
//! way down, and the parent itself.
//!
//! The batch's record says it is cancelled (`batch.lua cancel`): it takes
//! no member, and once every member is final it sends nothing (a flow's
//! parent that is a child of an outer flow ends `cancelled` there). The
//! members it remembers (a flow's children, a chain's step, a cancellable
//! batch's members) are cancelled one by one as a user cancels a task
//! (§14), which needs tracking on; subflows are cancelled as batches.
//! Nothing here needs a fencing token: the batch's script decides in one
//! step, and each task's cancel is `cancel.lua`'s, which every fenced
//! script that starts or ends the task reads.

use std::future::Future;
use std::pin::Pin;

use deadpool_redis::redis::{Value, from_redis_value};
use serde::Serialize;

use super::records;
use super::{BatchId, BatchKeys, as_str};
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::task_id::TaskId;
use crate::tracking::cancel::{request, wake_all};
use crate::tracking::{CancelOutcome, TaskHandle, Tracking};

/// What [`Service::cancel_batch`] did.
///
/// [`Service::cancel_batch`]: crate::admin::Service::cancel_batch
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BatchCancelled {
    /// The batch.
    #[serde(serialize_with = "as_str")]
    pub id: BatchId,
    /// Whether it existed (it may be gone after its retention).
    pub found: bool,
    /// It was done already: its callback (a flow's parent) was enqueued,
    /// and was cancelled as a task instead (see `tasks`).
    pub was_done: bool,
    /// Tasks now cancelled that had not started (they never will).
    pub cancelled: u64,
    /// Tasks running: their owners stop them (their handlers'
    /// `cancelled()` fires) and they end `cancelled` unless they finish
    /// first.
    pub requested: u64,
    /// Tasks already final, left as they were.
    pub already_final: u64,
    /// Tasks with no record (tracking off): the request is kept, so a
    /// tracked start never runs them; untracked, they run.
    pub unknown: u64,
    /// The subflows' batches, cancelled too (all the way down).
    #[serde(serialize_with = "ids")]
    pub subflows: Vec<BatchId>,
}

fn ids<S: serde::Serializer>(ids: &[BatchId], s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_seq(ids.iter().map(BatchId::as_str))
}

impl BatchCancelled {
    fn count(&mut self, outcome: &CancelOutcome) {
        match outcome {
            CancelOutcome::Cancelled => self.cancelled += 1,
            CancelOutcome::Requested { .. } => self.requested += 1,
            CancelOutcome::AlreadyFinal(_) => self.already_final += 1,
            _ => self.unknown += 1,
        }
    }

    fn add(&mut self, other: BatchCancelled) {
        self.cancelled += other.cancelled;
        self.requested += other.requested;
        self.already_final += other.already_final;
        self.unknown += other.unknown;
        self.subflows.extend(other.subflows);
    }
}

/// Cancels batch `id` of service `name` (with `tracking`, its
/// retention), and what it remembers, its subflows' all the way down;
/// every task's request is written before any owner is woken (see
/// `tracking::cancel::request`), then one pipeline wakes them.
pub(crate) async fn cancel(
    conn: &SharedConnection,
    name: &ServiceName,
    id: &BatchId,
    tracking: &Tracking,
) -> Result<BatchCancelled> {
    let mut woken = Vec::new();
    let done = cancel_in(conn, name, id, tracking, &mut woken).await?;
    let wakes: Vec<(u32, &str)> = woken
        .iter()
        .map(|h| (h.partition().unwrap_or_default(), h.id().as_str()))
        .collect();
    wake_all(conn, name, &wakes).await?;
    Ok(done)
}

/// Cancels batch `id` and what it remembers (its subflows recursively),
/// adding the tasks whose owners are to be woken to `woken`.
fn cancel_in<'a>(
    conn: &'a SharedConnection,
    name: &'a ServiceName,
    id: &'a BatchId,
    tracking: &'a Tracking,
    woken: &'a mut Vec<TaskHandle>,
) -> Pin<Box<dyn Future<Output = Result<BatchCancelled>> + Send + 'a>> {
    Box::pin(async move {
        let keys = BatchKeys::of(name, id);
        let script = keys.call("cancel", id);
        let reply: Vec<Value> = conn.write_script(&script).await?;
        let mut reply = reply.into_iter();
        let code: i64 = reply
            .next()
            .and_then(|v| from_redis_value(v).ok())
            .unwrap_or(0);
        let mut words = reply.map(|v| from_redis_value::<String>(v).unwrap_or_default());
        let task = words.next().filter(|t| !t.is_empty());
        let mut done = BatchCancelled {
            id: id.clone(),
            found: code != 0,
            was_done: code == 2,
            cancelled: 0,
            requested: 0,
            already_final: 0,
            unknown: 0,
            subflows: Vec::new(),
        };
        // The task the batch sent (its callback, a flow's parent) or a
        // chain's step running: both in the home partition.
        if let Some(task) = task {
            let handle = TaskHandle::new(id.home(), TaskId::from(task.as_str()));
            let (outcome, wake) = request(conn, name, &handle, id.home(), tracking).await?;
            done.count(&outcome);
            if wake {
                woken.push(handle);
            }
        }
        for member in words {
            if let Some(batch) = member.strip_prefix("b:") {
                let Ok(sub) = batch.parse::<BatchId>() else {
                    continue;
                };
                let below = cancel_in(conn, name, &sub, tracking, woken).await?;
                done.subflows.push(sub);
                done.add(below);
            } else if let Some(handle) = member.strip_prefix("t:") {
                let Ok(handle) = handle.parse::<TaskHandle>() else {
                    continue;
                };
                let partition = handle.partition().unwrap_or_default();
                let (outcome, wake) = request(conn, name, &handle, partition, tracking).await?;
                done.count(&outcome);
                if wake {
                    woken.push(handle);
                }
            }
        }
        // A cancelled flow's parent that is an outer flow's child ended
        // there (the cancel found every member final) as a completion
        // record of the home partition: forwarded now, so the outer flow
        // does not wait for the partition's owner to come by (forwarding
        // is safe beside the owner's: §19).
        if code == 3 {
            records::forward_partition(conn, name, id.home()).await?;
        }
        Ok(done)
    })
}
