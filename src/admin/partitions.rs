//! How much each partition holds and who owns it, from counters only: one
//! pipeline of six summary commands per partition, for any number of
//! services at once.

use std::sync::Arc;

use deadpool_redis::redis::streams::{StreamInfoGroupsReply, StreamPendingReply};
use deadpool_redis::redis::{self, FromRedisValue, Value};
use serde::Serialize;

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::{Error, Result};
use crate::{backlog, keys};

/// The commands sent per partition, in this order.
const READS: usize = 6;

/// One partition of a service. Its JSON: `partition`, `owner`, `token`,
/// `length`, `pending`, `backlog`, `oldest_pending_age_ms`, `delayed`,
/// `dead`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PartitionState {
    /// The partition.
    pub partition: u32,
    /// The instance that last acquired it (its fencing record,
    /// `{N/p}:owner`); it stays named after that instance left, until the
    /// next owner acquires. `None`: never owned.
    pub owner: Option<String>,
    /// The fencing token of that acquisition.
    pub token: Option<u64>,
    /// Entries in the stream (`XLEN`): waiting, in flight, and acked ones
    /// the owner has not trimmed yet (it trims every second).
    pub length: u64,
    /// Entries delivered and not yet acked (the consumer group's pending).
    pub pending: u64,
    /// Entries not yet delivered plus pending ones; the stream's length
    /// when Redis cannot tell what was delivered.
    pub backlog: u64,
    /// How long ago the oldest pending entry was written to the stream
    /// (by Redis's clock); `None` when nothing is pending.
    pub oldest_pending_age_ms: Option<u64>,
    /// Delayed tasks and retries waiting for their backoff.
    pub delayed: u64,
    /// Dead letters.
    pub dead: u64,
}

/// The partitions of each of `services` (name, partitions), read at Redis
/// time `now_ms`, in one pipelined round trip.
pub(crate) async fn read(
    conn: &SharedConnection,
    services: &[(ServiceName, Arc<[u32]>)],
    now_ms: u64,
) -> Result<Vec<Vec<PartitionState>>> {
    if services.iter().all(|(_, units)| units.is_empty()) {
        return Ok(services.iter().map(|_| Vec::new()).collect());
    }
    let mut pipe = redis::pipe();
    // A stream no one created yet makes `XINFO` and `XPENDING` fail; that
    // is an answer (nothing there), not an error of the whole read.
    for (name, units) in services {
        for &p in units.iter() {
            let stream = keys::stream(name, p);
            pipe.cmd("GET").arg(keys::owner(name, p));
            pipe.cmd("XLEN").arg(&stream);
            pipe.cmd("XINFO").arg("GROUPS").arg(&stream);
            pipe.cmd("XPENDING").arg(&stream).arg(keys::GROUP);
            pipe.cmd("ZCARD").arg(keys::delayed(name, p));
            pipe.cmd("XLEN").arg(keys::dead(name, p));
        }
    }
    let replies: Vec<Value> = conn.query_pipe_each(&mut pipe).await?;
    let mut replies = replies.into_iter();
    let mut read = Vec::with_capacity(services.len());
    for (_, units) in services {
        let mut states = Vec::with_capacity(units.len());
        for &partition in units.iter() {
            let reply: Vec<Value> = replies.by_ref().take(READS).collect();
            let reply = <[Value; READS]>::try_from(reply).map_err(|_| short_reply())?;
            states.push(state(partition, reply, now_ms)?);
        }
        read.push(states);
    }
    Ok(read)
}

/// A pipeline that answered fewer commands than it was sent.
fn short_reply() -> Error {
    Error::Runtime("redis answered fewer commands than the pipeline sent".to_owned())
}

/// One partition's state from its six replies.
fn state(partition: u32, replies: [Value; READS], now_ms: u64) -> Result<PartitionState> {
    let [owner, length, groups, pending, delayed, dead] = replies;
    let owner: Option<String> = parse(owner)?;
    let (token, owner) = match owner.as_deref().and_then(|o| o.split_once(':')) {
        Some((token, id)) => (token.parse().ok(), Some(id.to_owned())),
        None => (None, owner),
    };
    let length: u64 = parse(length)?;
    let group = parse_or_missing::<StreamInfoGroupsReply>(groups)?
        .and_then(|g| g.groups.into_iter().find(|g| g.name == keys::GROUP));
    let oldest_pending = match parse_or_missing::<StreamPendingReply>(pending)? {
        Some(StreamPendingReply::Data(data)) => Some(data.start_id),
        _ => None,
    };
    let pending = group.as_ref().map_or(0, |g| g.pending as u64);
    let backlog = match &group {
        Some(g) => match g.lag {
            Some(lag) => backlog::undelivered(lag as u64, length, pending) + pending,
            None => length,
        },
        // No group: nothing was ever delivered.
        None => length,
    };
    let oldest_pending_age_ms = oldest_pending
        .and_then(|id| id.split('-').next()?.parse::<u64>().ok())
        .map(|written| now_ms.saturating_sub(written));
    Ok(PartitionState {
        partition,
        owner,
        token,
        length,
        pending,
        backlog,
        oldest_pending_age_ms,
        delayed: parse(delayed)?,
        dead: parse(dead)?,
    })
}

/// A reply as `T`; an error reply is an error.
pub(super) fn parse<T: FromRedisValue>(value: Value) -> Result<T> {
    if let Value::ServerError(e) = value {
        return Err(Error::Redis(e.into()));
    }
    Ok(redis::from_redis_value(value).map_err(redis::RedisError::from)?)
}

/// A reply as `T`; `None` for the error replies of a stream or group that
/// does not exist (yet).
pub(super) fn parse_or_missing<T: FromRedisValue>(value: Value) -> Result<Option<T>> {
    match &value {
        Value::ServerError(e)
            if e.code() == "NOGROUP" || e.details().is_some_and(|d| d.contains("no such key")) =>
        {
            Ok(None)
        }
        _ => parse(value).map(Some),
    }
}
