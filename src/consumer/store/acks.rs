//! Fenced acks of many partitions in one round trip: one `fenced_ack`
//! script per partition and token, sent in one pipeline. A script acks
//! only while its instance is the partition's recorded owner
//! (docs/design.md §4 rule 8).

use std::sync::LazyLock;

use deadpool_redis::redis::{self, RedisError, Script, ScriptInvocation, Value};

use super::PartitionStore;
use crate::connection::{SharedConnection, Waited};
use crate::keys;
use crate::tracking::{Tracking, tracked_script};

/// The script's text: a pipeline does not load a script by itself, so
/// after a Redis restart the acks load it again.
const FENCED_ACK_LUA: &str = tracked_script!("fenced_ack.lua");

static FENCED_ACK: LazyLock<Script> = LazyLock::new(|| Script::new(FENCED_ACK_LUA));

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
    /// Acked (or not pending any more), and, with `wait_for_replicas`,
    /// confirmed by enough replicas.
    Acked,
    /// Acked on the master, but fewer replicas than `wait_for_replicas`
    /// asks for confirmed it (the cause): a failover could still lose it.
    /// Sending it again (it acks nothing more) waits for it again.
    Unconfirmed(String),
    /// Refused: another instance owns the partition now.
    Fenced,
    /// Redis answered something else; the entries stay pending.
    Refused(String),
}

/// One partition's acks in one script: its untracked entries' ids, and
/// its tracked tasks (docs/design.md §14) with the service's tracking.
#[derive(Debug)]
pub(crate) struct AckGroup<'a> {
    pub(crate) store: &'a PartitionStore,
    pub(crate) ids: Vec<&'a str>,
    /// Stream id, task id and final record (`packed::Finished`) of each.
    pub(crate) tracked: Vec<(&'a str, &'a str, &'a [u8])>,
    /// Set when `tracked` is not empty.
    pub(crate) tracking: Option<Tracking>,
    /// Task id and unique key of each task that holds one (docs/design.md
    /// §16), among `ids` or `tracked`: the script frees their keys.
    pub(crate) unique: Vec<(&'a str, &'a str)>,
}

impl PartitionStore {
    /// The fenced ack of `group`, for a pipeline; replies the number
    /// acked, or -1 when fenced.
    pub(super) fn ack_script<'a>(&'a self, group: &AckGroup<'_>) -> ScriptInvocation<'a> {
        let mut script = FENCED_ACK.key(&self.stream);
        script
            .key(&self.owner)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(group.ids.len())
            .arg(&group.ids);
        if let (Some(tracking), false) = (&group.tracking, group.tracked.is_empty()) {
            self.block(&mut script, tracking);
            script.arg(group.tracked.len());
            for (stream_id, _, _) in &group.tracked {
                script.arg(*stream_id);
            }
            for (_, task, record) in &group.tracked {
                script.arg(*task).arg(*record);
            }
        } else if !group.unique.is_empty() {
            // No tracking block: its place says so.
            script.arg("");
        }
        if !group.unique.is_empty() {
            // Only acks with unique tasks name the locks: the others cost
            // nothing more.
            script.key(&self.unique);
            for (task, unique) in &group.unique {
                script.arg(*task).arg(*unique);
            }
            script.arg(group.unique.len());
        }
        script
    }
}

/// Acks each group's entry ids in its partition, in one pipeline; one reply
/// per group. `Err` (with the cause) when the whole batch should be sent
/// again: the connection failed, or Redis said "not now". The acks are
/// idempotent, so sending them again is safe.
///
/// With `wait_for_replicas`, each node's part of the pipeline ends with a
/// `WAIT` on the connection that carried it, and a group whose `WAIT`
/// counted too few replicas is [`AckReply::Unconfirmed`]: a drain's acks go
/// before its mark, and a failover that lost them under a surviving mark
/// would run their tasks again.
pub(crate) async fn ack(
    conn: &SharedConnection,
    groups: &[AckGroup<'_>],
) -> Result<Vec<AckReply>, String> {
    let mut pipe = redis::pipe();
    for group in groups {
        pipe.invoke_script(&group.store.ack_script(group));
    }
    let mut sent = send(conn, &mut pipe).await?;
    if sent.replies().iter().any(is_noscript) {
        // Redis restarted and forgot the script: pipelines do not load
        // scripts by themselves.
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(FENCED_ACK_LUA);
        conn.query::<String>(&load)
            .await
            .map_err(|e| e.to_string())?;
        sent = send(conn, &mut pipe).await?;
    }
    if let Some(Value::ServerError(transient)) = sent.replies().iter().find(|r| is_transient(r)) {
        return Err(format!("{transient:?}"));
    }
    Ok((0..groups.len()).map(|i| reply(&sent, i)).collect())
}

async fn send(conn: &SharedConnection, pipe: &mut redis::Pipeline) -> Result<Waited, String> {
    conn.write_pipe(pipe).await.map_err(|e| e.to_string())
}

fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

fn is_transient(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if TRANSIENT.contains(&e.code()))
}

/// Group `i`'s outcome.
fn reply(sent: &Waited, i: usize) -> AckReply {
    match &sent.replies()[i] {
        Value::Int(n) if *n >= 0 => match sent.confirmed(i) {
            Ok(()) => AckReply::Acked,
            Err(e) => AckReply::Unconfirmed(e.to_string()),
        },
        Value::Int(_) => AckReply::Fenced,
        Value::ServerError(e) => AckReply::Refused(RedisError::from(e.clone()).to_string()),
        other => AckReply::Refused(format!("unexpected reply {other:?}")),
    }
}
