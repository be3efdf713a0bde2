//! Completion records (docs/design.md §19): a batch member's end, written
//! in its partition's `{N/p}:completions` by the fenced script that ended
//! it, read by the partition's owner (or a batch's canceller), forwarded
//! to the batch, then deleted.

use std::collections::BTreeMap;

use deadpool_redis::redis::{self, Value};

use super::{BatchId, BatchKeys};
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::keys;
use tracing::warn;

/// Members' end, as a completion record says it: some members of one
/// batch, all in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Completion {
    /// The members' partition.
    pub(crate) partition: u32,
    /// The record's stream id there: the batch takes a partition's
    /// records in their order, each once.
    pub(crate) at: String,
    pub(crate) batch: String,
    /// How many members it ends.
    pub(crate) count: u32,
    /// Their task ids, space-separated; empty for a count of succeeded
    /// members (an ack's, without results).
    pub(crate) tasks: String,
    pub(crate) state: String,
    /// A lone member's result, when its batch wants it; else empty.
    pub(crate) result: Vec<u8>,
}

/// Forwards `completions`, all of batch `id`, to its record (which takes
/// them, or no longer exists: an expired batch's members end unheard), for
/// the caller to delete the records. `Ok(true)` when the batch, cancelled
/// and now done, wrote a record in its home partition (its parent ended in
/// its outer flow): the caller forwards that partition's records.
pub(crate) async fn forward(
    conn: &SharedConnection,
    name: &ServiceName,
    id: &BatchId,
    completions: &[&Completion],
) -> Result<bool> {
    let keys = BatchKeys::of(name, id);
    let mut script = keys.call("forward", id);
    for c in completions {
        script
            .arg(c.partition)
            .arg(&c.at)
            .arg(&c.state)
            .arg(c.count)
            .arg(&c.tasks)
            .arg(&c.result);
    }
    let reply: i64 = conn.invoke(&script).await?;
    Ok(reply == 2)
}

/// What [`forward_each`] did: the batches whose call failed (their
/// records are to be kept and forwarded again), and the homes of cancelled
/// subflows that wrote their parents' ends there (to be forwarded at once).
pub(crate) struct Forwarded<'a> {
    pub(crate) failed: Vec<(&'a str, crate::error::Error)>,
    pub(crate) homes: Vec<u32>,
}

/// Forwards `records` (of one partition or many, each partition's in
/// order), each batch's in one call of the batch script. A record naming no
/// batch (written by hand) is dropped.
pub(crate) async fn forward_each<'a>(
    conn: &SharedConnection,
    name: &ServiceName,
    records: impl IntoIterator<Item = &'a Completion>,
) -> Forwarded<'a> {
    // A member's records are all in its own partition, in order there.
    let mut by_batch: BTreeMap<&str, Vec<&Completion>> = BTreeMap::new();
    for record in records {
        by_batch.entry(&record.batch).or_default().push(record);
    }
    let mut done = Forwarded {
        failed: Vec::new(),
        homes: Vec::new(),
    };
    for (batch, ends) in by_batch {
        let id = match batch.parse::<BatchId>() {
            Ok(id) => id,
            Err(e) => {
                warn!(batch, cause = %e, "a completion record names no batch; dropped");
                continue;
            }
        };
        match forward(conn, name, &id, &ends).await {
            Ok(true) => done.homes.push(id.home()),
            Ok(false) => {}
            Err(e) => done.failed.push((batch, e)),
        }
    }
    done
}

/// Forwards the completion records of partition `p` to their batches
/// (the oldest 512), and deletes them: safe beside the partition's owner
/// doing the same (§19: a batch takes a partition's records in order, each
/// once).
pub(crate) async fn forward_partition(
    conn: &SharedConnection,
    name: &ServiceName,
    p: u32,
) -> Result<()> {
    let key = keys::completions(name, p);
    let reply: Value = conn.query(&read(&key, 512)).await?;
    let records = of(p, reply);
    let Forwarded { failed, homes } = forward_each(conn, name, &records).await;
    if let Some((_, e)) = failed.into_iter().next() {
        return Err(e);
    }
    // A cancelled subflow's parent ended in its outer flow: a record of
    // that batch's home, forwarded in turn.
    for home in homes {
        Box::pin(forward_partition(conn, name, home)).await?;
    }
    if !records.is_empty() {
        let ats: Vec<&str> = records.iter().map(|c| c.at.as_str()).collect();
        let _: Value = conn.query(&forget(&key, &ats)).await?;
    }
    Ok(())
}

/// The command that reads the oldest `count` records of completions stream
/// `key`, in order ([`of`] reads its reply).
pub(crate) fn read(key: &str, count: usize) -> redis::Cmd {
    let mut range = redis::cmd("XRANGE");
    range.arg(key).arg("-").arg("+").arg("COUNT").arg(count);
    range
}

/// The records of an `XRANGE` reply of partition `partition`'s; one not of
/// the form is skipped.
pub(crate) fn of(partition: u32, reply: Value) -> Vec<Completion> {
    // Bytes: a member's result (`r`) is the codec's, not text.
    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::from_redis_value(reply).unwrap_or_default();
    entries
        .into_iter()
        .filter_map(|(at, fields)| {
            let field = |name: &str| {
                let at = fields
                    .chunks(2)
                    .position(|pair| pair[0] == name.as_bytes())?;
                fields.get(2 * at + 1).cloned()
            };
            let text = |name: &str| String::from_utf8(field(name)?).ok();
            // A count (`n`: succeeded members of an ack), or the task
            // ids (`t`), as many as they are.
            let tasks = text("t").unwrap_or_default();
            let count = match text("n") {
                Some(n) => n.parse().ok()?,
                None if tasks.is_empty() => return None,
                None => u32::try_from(tasks.split(' ').count()).ok()?,
            };
            Some(Completion {
                partition,
                batch: text("b")?,
                count,
                tasks,
                state: text("s")?,
                result: field("r").unwrap_or_default(),
                at,
            })
        })
        .collect()
}

/// The command that deletes records `ids` of completions stream `key`:
/// their batches have them.
pub(crate) fn forget(key: &str, ids: &[&str]) -> redis::Cmd {
    let mut del = redis::cmd("XDEL");
    del.arg(key).arg(ids);
    del
}
