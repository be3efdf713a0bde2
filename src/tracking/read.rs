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

/// Task `handle`'s record; a bare id is looked up in every one of the
/// `partitions` in one pipeline (one command per partition, in its own
/// slot on a Cluster).
pub(crate) async fn find(
    conn: &SharedConnection,
    name: &ServiceName,
    units: &[u32],
    handle: &TaskHandle,
) -> Result<Option<TaskRecord>> {
    let id = handle.id().as_str();
    if let Some(p) = handle.partition() {
        return read(conn, name, p, id).await;
    }
    let mut pipe = redis::pipe();
    for &p in units {
        ask(&mut pipe, name, p, id);
    }
    // Two replies per partition: its record, its running field.
    let replies: Vec<Value> = conn.query_pipe(&pipe).await?;
    let mut replies = replies.into_iter();
    for &p in units {
        let (Some(fields), Some(running)) = (replies.next(), replies.next()) else {
            break;
        };
        let fields: Option<Vec<u8>> =
            redis::from_redis_value(fields).map_err(redis::RedisError::from)?;
        let fields = named(fields);
        let running: Option<String> =
            redis::from_redis_value(running).map_err(redis::RedisError::from)?;
        let handle = TaskHandle::new(p, id.into());
        if let Some(record) = TaskRecord::from_fields(handle, fields, running) {
            return Ok(Some(record));
        }
    }
    Ok(None)
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

/// Waits until task `id` of partition `p` is final, at most `timeout`,
/// listening on `channels` (shared by every wait of an `Admin`).
pub(crate) async fn wait(
    conn: &SharedConnection,
    channels: &Channels,
    name: &ServiceName,
    p: u32,
    id: &str,
    timeout: Duration,
) -> Result<Waited> {
    let deadline = Instant::now() + timeout;
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
