//! The leaser's call of `task_keys.lua`: the operations on the limit keys
//! sent together, and their replies.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_redis::redis::Script;

use super::holding::Ask;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::keys;
use crate::limits::Limits;

static TASK_KEYS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/task_keys.lua")));

/// Most operations in one script call: a call's time stays short beside
/// the other commands Redis runs (about 4 µs an operation).
const MOST_AT_ONCE: usize = 1_000;

/// What an operation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Units of the key's concurrency (`{N}:units:<key>`).
    Units,
    /// A share of the key's rate (`{N}:rate:<key>`).
    Rate,
}

/// One operation on a limit key: this instance's count of it becomes
/// `want`, never less than the `usable` part its tasks may take of the
/// count it had.
pub(super) struct Op {
    pub(super) kind: Kind,
    pub(super) key: Arc<str>,
    pub(super) usable: u32,
    pub(super) want: u32,
}

impl Op {
    /// The ops of `key` among `asks` (each of a kind, if any).
    pub(super) fn all<const N: usize>(
        key: &Arc<str>,
        asks: [(Kind, Option<Ask>); N],
    ) -> impl Iterator<Item = Op> + '_ {
        asks.into_iter().filter_map(move |(kind, ask)| {
            let (usable, want) = ask?;
            Some(Op {
                kind,
                key: key.clone(),
                usable,
                want,
            })
        })
    }
}

/// Redis's answer to one [`Op`]: the count granted, and while another
/// instance is short of the key, the even share this one gives back down
/// to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reply {
    pub(super) granted: u32,
    pub(super) share: Option<u32>,
}

/// Sends `ops` for `instance` (counts living `ttl`) under `limits`, at
/// most [`MOST_AT_ONCE`] a call; a reply per op, in order.
pub(super) async fn send(
    conn: &SharedConnection,
    name: &ServiceName,
    instance: &str,
    ttl: Duration,
    limits: &Limits,
    ops: &[Op],
) -> Result<Vec<Reply>> {
    let units = limits.per_key().unwrap_or(u32::MAX);
    let rate = limits.rate_limit_per_key().map_or(u32::MAX, |r| r.count());
    let mut replies = Vec::with_capacity(ops.len());
    for part in ops.chunks(MOST_AT_ONCE) {
        let mut script = TASK_KEYS.prepare_invoke();
        script
            .arg(instance)
            .arg(ttl.as_millis() as u64)
            .arg(units)
            .arg(rate);
        for op in part {
            let (key, code) = match op.kind {
                Kind::Units => (keys::units(name, &op.key), "u"),
                Kind::Rate => (keys::key_rate(name, &op.key), "r"),
            };
            script.key(key).arg(code).arg(op.usable).arg(op.want);
        }
        let reply: Vec<(i64, i64)> = conn.invoke(&script).await?;
        let count = |n: i64| n.clamp(0, i64::from(u32::MAX)) as u32;
        replies.extend(reply.into_iter().map(|(granted, share)| Reply {
            granted: count(granted),
            share: (share > 0).then(|| count(share)),
        }));
    }
    Ok(replies)
}
