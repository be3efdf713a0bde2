//! Fenced acks of many partitions in one round trip: one `fenced_ack`
//! script per partition and token, sent in one pipeline. A script acks
//! only while its instance is the partition's recorded owner
//! (docs/design.md §4 rule 8).

use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script, ScriptInvocation, Value};

use super::PartitionStore;
use crate::connection::SharedConnection;
use crate::keys;

static FENCED_ACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/fenced_ack.lua")));

/// Error replies that say "not now" rather than "no": Redis is loading its
/// data, failing over or busy.
const TRANSIENT: [&str; 6] = [
    "LOADING",
    "BUSY",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
];

/// How one partition's acks ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AckReply {
    /// Acked (or not pending any more).
    Acked,
    /// Refused: another instance owns the partition now.
    Fenced,
    /// Redis answered something else; the entries stay pending.
    Refused(String),
}

impl PartitionStore {
    /// The fenced ack of `ids`, for a pipeline; replies the number acked,
    /// or -1 when fenced.
    pub(super) fn ack_script<'a>(&'a self, ids: &[&str]) -> ScriptInvocation<'a> {
        let mut script = FENCED_ACK.key(&self.stream);
        script
            .key(&self.owner)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(ids);
        script
    }
}

/// Acks each group's entry ids in its partition, in one pipeline; one reply
/// per group. `Err` (with the cause) when the whole batch should be sent
/// again: the connection failed, or Redis said "not now". The acks are
/// idempotent, so sending them again is safe.
pub(crate) async fn ack(
    conn: &SharedConnection,
    groups: &[(&PartitionStore, Vec<&str>)],
) -> Result<Vec<AckReply>, String> {
    let mut pipe = redis::pipe();
    for (store, ids) in groups {
        pipe.invoke_script(&store.ack_script(ids));
    }
    let mut replies = send(conn, &mut pipe).await?;
    if replies.iter().any(is_noscript) {
        // Redis restarted and forgot the script: pipelines do not load
        // scripts by themselves.
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD")
            .arg(include_str!("../../scripts/fenced_ack.lua"));
        conn.query::<String>(&load)
            .await
            .map_err(|e| e.to_string())?;
        replies = send(conn, &mut pipe).await?;
    }
    if let Some(transient) = replies.iter().find(|r| is_transient(r)) {
        return Err(format!("{:?}", transient.as_ref().err()));
    }
    // With `wait_for_replicas`, acks count as landed once replicas have
    // them: a drain's last acks go before its mark, and a failover that
    // lost them under a surviving mark would run their tasks again.
    let streams = groups.iter().map(|(store, _)| store.stream.as_str());
    conn.replicated(streams).await.map_err(|e| e.to_string())?;
    Ok(replies.iter().map(reply).collect())
}

async fn send(
    conn: &SharedConnection,
    pipe: &mut redis::Pipeline,
) -> Result<Vec<redis::RedisResult<Value>>, String> {
    conn.query_pipe_each(pipe).await.map_err(|e| e.to_string())
}

fn is_noscript(reply: &redis::RedisResult<Value>) -> bool {
    matches!(reply, Err(e) if e.code() == Some("NOSCRIPT"))
}

fn is_transient(reply: &redis::RedisResult<Value>) -> bool {
    matches!(reply, Err(e) if e.code().is_some_and(|c| TRANSIENT.contains(&c)))
}

fn reply(reply: &redis::RedisResult<Value>) -> AckReply {
    match reply {
        Ok(Value::Int(n)) if *n >= 0 => AckReply::Acked,
        Ok(Value::Int(_)) => AckReply::Fenced,
        Ok(other) => AckReply::Refused(format!("unexpected reply {other:?}")),
        Err(e) => AckReply::Refused(e.to_string()),
    }
}
