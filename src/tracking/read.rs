//! Reading a task's record, and waiting for a task to end.
//!
//! `wait` listens on the partition's `{N/p}:final` channel first (on the
//! connection its `Admin` shares for every wait) and reads the record after, so an end written after the read is heard and
//! one written before is read; a message names the task that ended, and the
//! record is read again only for this one. After a broken subscription it
//! reads again (messages may have been lost meanwhile). No polling.

use std::collections::HashMap;
use std::time::Duration;

use deadpool_redis::redis::{self, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::handle::{TaskHandle, TaskRecord};
use super::packed;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::connection::channels::Channels;
use crate::connection::subscriber::Event;
use crate::error::{Error, Result};
use crate::keys;
use crate::partition::generation_of;
use crate::retry::Pauses;

/// How a wait ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waited {
    /// The task is final: its record, with its result or error.
    Final(TaskRecord),
    /// The timeout passed first: the record as it was then.
    TimedOut(TaskRecord),
    /// No such task has a record (tracking was off when it was enqueued
    /// and it has not started, or it never existed, or its record expired).
    Unknown,
}

/// Task `id`'s record in partition `p`; `None` when it has none.
pub(crate) async fn read(
    conn: &SharedConnection,
    name: &ServiceName,
    p: u32,
    id: &str,
) -> Result<Option<TaskRecord>> {
    let mut pipe = redis::pipe();
    ask(&mut pipe, name, p, id);
    let (fields, running): (Option<Vec<u8>>, Option<String>) = conn.query_pipe(&pipe).await?;
    let handle = TaskHandle::new(p, id.into());
    Ok(TaskRecord::from_fields(handle, named(fields), running))
}

/// Task `id`'s record in any of `units` but `except`, in one pipeline
/// (one command per partition, in its own slot on a Cluster). Found in
/// more than one, the newest generation's wins: a reshard's move writes
/// the record in the new layout before it leaves the old one
/// (docs/design.md §21).
pub(crate) async fn lookup(
    conn: &SharedConnection,
    name: &ServiceName,
    units: &[u32],
    id: &str,
    except: Option<u32>,
) -> Result<Option<TaskRecord>> {
    let units: Vec<u32> = units
        .iter()
        .copied()
        .filter(|u| Some(*u) != except)
        .collect();
    if units.is_empty() {
        return Ok(None);
    }
    let mut pipe = redis::pipe();
    for &p in &units {
        ask(&mut pipe, name, p, id);
    }
    // Two replies per partition: its record, its running field.
    let replies: Vec<Value> = conn.query_pipe(&pipe).await?;
    let mut replies = replies.into_iter();
    let mut found: Option<TaskRecord> = None;
    for &p in &units {
        let (Some(fields), Some(running)) = (replies.next(), replies.next()) else {
            break;
        };
        let fields: Option<Vec<u8>> =
            redis::from_redis_value(fields).map_err(redis::RedisError::from)?;
        let fields = named(fields);
        let running: Option<String> =
            redis::from_redis_value(running).map_err(redis::RedisError::from)?;
        let handle = TaskHandle::new(p, id.into());
        let Some(record) = TaskRecord::from_fields(handle, fields, running) else {
            continue;
        };
        let newer = |r: &TaskRecord| generation_of(r.handle.partition().unwrap_or_default());
        if found.as_ref().is_none_or(|f| newer(&record) > newer(f)) {
            found = Some(record);
        }
    }
    Ok(found)
}

/// Whether `units` hold a partition of a generation other than `p`'s:
/// only then can a record missing from `p` be elsewhere.
pub(crate) fn spans_other(units: &[u32], p: u32) -> bool {
    units.iter().any(|&u| generation_of(u) != generation_of(p))
}

/// Task `id`'s record, read again while Redis cannot be reached (a broken
/// connection is made again), until `deadline`: a wait outlives an outage
/// shorter than its timeout.
async fn read_until(
    conn: &SharedConnection,
    name: &ServiceName,
    p: u32,
    id: &str,
    deadline: Instant,
) -> Result<Option<TaskRecord>> {
    let mut pauses = Pauses::new(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        match read(conn, name, p, id).await {
            Err(Error::Redis(_) | Error::Pool(_) | Error::Timeout(_))
                if Instant::now() + pauses.upcoming() < deadline =>
            {
                tokio::time::sleep(pauses.take()).await;
            }
            read => return read,
        }
    }
}

/// Adds the reads of task `id`'s record and its running field to `pipe`.
fn ask(pipe: &mut redis::Pipeline, name: &ServiceName, p: u32, id: &str) {
    pipe.cmd("HGET").arg(keys::tasks(name, p)).arg(id);
    pipe.cmd("HGET").arg(keys::running(name, p)).arg(id);
}

/// A record's fields by name (none for no record, or bytes that are none).
fn named(record: Option<Vec<u8>>) -> HashMap<String, Vec<u8>> {
    record.and_then(|r| packed::decode(&r)).unwrap_or_default()
}

/// How many times one wait follows its task to another partition (a
/// reshard moves a task once).
const MOVES_FOLLOWED: usize = 8;

/// Waits until task `id` of partition `p` is final, at most `timeout`,
/// listening on `channels` (shared by every wait of an `Admin`). A task
/// that a reshard moves away (its record leaves `p`, announced on `p`'s
/// channel) is looked for in the service's layout as it is then (`first`:
/// its first generation's partitions, `levels`: its priority levels) and
/// waited for where it is.
pub(crate) async fn wait(
    conn: &SharedConnection,
    channels: &Channels,
    name: &ServiceName,
    (first, levels): (u32, u32),
    mut p: u32,
    id: &str,
    timeout: Duration,
) -> Result<Waited> {
    let deadline = Instant::now() + timeout;
    for _ in 0..MOVES_FOLLOWED {
        let waited = wait_in(conn, channels, name, p, id, deadline).await?;
        if waited != Waited::Unknown {
            return Ok(waited);
        }
        let units = crate::reshard::read_units(conn, name, first, levels).await?;
        if !spans_other(&units, p) {
            return Ok(waited);
        }
        match lookup(conn, name, &units, id, Some(p)).await? {
            Some(found) => p = found.handle.partition().unwrap_or(p),
            None => return Ok(Waited::Unknown),
        }
    }
    Ok(Waited::Unknown)
}

/// [`wait`] in partition `p` alone, until `deadline`: `Unknown` once `p`
/// holds no record of the task.
async fn wait_in(
    conn: &SharedConnection,
    channels: &Channels,
    name: &ServiceName,
    p: u32,
    id: &str,
    deadline: Instant,
) -> Result<Waited> {
    let channel = keys::final_channel(name, p);
    let heard = tokio::time::timeout_at(deadline, channels.listen(&channel)).await;
    let Ok(heard) = heard else {
        // Not subscribed in time (Redis unreachable): what the record says.
        return Ok(match read(conn, name, p, id).await? {
            None => Waited::Unknown,
            Some(record) if record.is_final() => Waited::Final(record),
            Some(record) => Waited::TimedOut(record),
        });
    };
    let mut heard = heard?;
    loop {
        let Some(record) = read_until(conn, name, p, id, deadline).await? else {
            return Ok(Waited::Unknown);
        };
        if record.is_final() {
            return Ok(Waited::Final(record));
        }
        loop {
            tokio::select! {
                event = heard.recv() => match event {
                    // A message names the tasks that ended in one script.
                    Ok(Event::Message(ended))
                        if ended.split(|b| *b == b' ').any(|one| one == id.as_bytes()) => break,
                    Ok(Event::Message(_)) => {}
                    // Subscribed again, or fell behind: messages may be lost.
                    Ok(Event::Again) | Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => {
                        return Err(Error::Runtime("the pub/sub connection's task ended".into()));
                    }
                },
                _ = tokio::time::sleep_until(deadline) => return Ok(Waited::TimedOut(record)),
            }
        }
    }
}
