//! Fenced acks of many partitions in one round trip: one `fenced_ack`
//! script per partition and token, sent in one pipeline. A script acks
//! only while its instance is the partition's recorded owner
//! (docs/design.md §4 rule 8).

use std::collections::HashMap;
use std::sync::LazyLock;

use deadpool_redis::redis::{self, Cmd, RedisError, Script, Value};

use super::{PartitionStore, Succeeded};
use crate::connection::{SharedConnection, Waited, evalsha};
use crate::entry::stream_id_order;
use crate::keys;
use crate::tracking::{Tracking, tracked_script};

/// The script's text: a pipeline does not load a script by itself, so
/// after a Redis restart the acks load it again.
const FENCED_ACK_LUA: &str = tracked_script!("fenced_ack.lua");

pub(super) static FENCED_ACK: LazyLock<Script> = LazyLock::new(|| Script::new(FENCED_ACK_LUA));

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
    /// Stream id and how it ended, of each.
    pub(crate) tracked: Vec<(&'a str, &'a Succeeded)>,
    /// Set when `tracked` is not empty.
    pub(crate) tracking: Option<Tracking>,
    /// Task id and unique key of each task that holds one (docs/design.md
    /// §16), among `ids` or `tracked`: the script frees their keys.
    pub(crate) unique: Vec<(&'a str, &'a str)>,
    /// Task id, batch id, result (empty: none wanted) and stream id of
    /// each batch member (§19) among `ids` or `tracked`: the script writes
    /// their completion records.
    pub(crate) members: Vec<(&'a str, &'a str, &'a [u8], &'a str)>,
}

impl PartitionStore {
    /// The fenced ack of `group`, for a pipeline; replies the number
    /// acked, or -1 when fenced. Built as one command, every argument in
    /// its one buffer (each tracked task's final record too).
    pub(super) fn ack_script(&self, group: &AckGroup<'_>) -> Cmd {
        let members = !group.members.is_empty();
        // The unique keys' place is named (and its tail sent, maybe empty)
        // when either tail follows.
        let unique = !group.unique.is_empty() || members;
        let ids = group.ids.iter().map(|id| id.len());
        let records = group.tracked.iter().map(|(id, task)| {
            let progress = task.progress.as_ref().map_or(0, Vec::len);
            id.len() + task.task.as_str().len() + 160 + progress + task.result.len()
        });
        let unique_bytes = group.unique.iter().map(|(t, k)| t.len() + k.len());
        let member_bytes = group
            .members
            .iter()
            .map(|(t, b, r, s)| t.len() + b.len() + r.len() + s.len());
        let bytes = 200
            + ids.sum::<usize>()
            + records.sum::<usize>()
            + unique_bytes.sum::<usize>()
            + member_bytes.sum::<usize>();
        let args = 13
            + group.ids.len()
            + 3 * group.tracked.len()
            + 2 * group.unique.len()
            + 3 * group.members.len()
            + 3;
        let keys = 2 + usize::from(unique) + usize::from(members);
        let mut cmd = evalsha(&FENCED_ACK, keys, args, bytes);
        cmd.arg(&self.stream).arg(&self.owner);
        if unique {
            // Only acks with unique tasks or batch members name the locks
            // and the completions: the others cost nothing more.
            cmd.arg(&self.unique);
        }
        if members {
            cmd.arg(&self.completions);
        }
        cmd.arg(&self.record)
            .arg(keys::GROUP)
            .arg(group.ids.len())
            .arg(&group.ids);
        if let (Some(tracking), false) = (&group.tracking, group.tracked.is_empty()) {
            cmd.arg(self.block(tracking)).arg(group.tracked.len());
            for (stream_id, _) in &group.tracked {
                cmd.arg(*stream_id);
            }
            for (_, task) in &group.tracked {
                cmd.arg(task.task.as_str()).arg(self.record(task));
            }
        } else if unique {
            // No tracking block: its place says so.
            cmd.arg("");
        }
        if unique {
            for (task, unique) in &group.unique {
                cmd.arg(*task).arg(*unique);
            }
            cmd.arg(group.unique.len());
        }
        if members {
            members_block(&mut cmd, &group.members);
        }
        cmd
    }
}

/// The ack's members' block (fenced_ack.lua): their first and last stream
/// id, then one group per batch (its id, its count, 1 if it wants results,
/// and each member's task id and stream id, and result if wanted), then
/// the block's length.
fn members_block(cmd: &mut Cmd, members: &[(&str, &str, &[u8], &str)]) {
    // The first and last stream id, each id read once: (its order, it).
    type At<'a> = (Option<(u64, u64)>, &'a str);
    let mut ends: Option<(At<'_>, At<'_>)> = None;
    for (_, _, _, id) in members {
        let at = (stream_id_order(id), *id);
        ends = Some(match ends {
            None => (at, at),
            Some((first, last)) => (first.min(at), last.max(at)),
        });
    }
    let (first, last) = ends.map_or(("0", "0"), |(first, last)| (first.1, last.1));
    // Each batch's members, in their first member's order.
    let mut batches: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for (i, (_, batch, _, _)) in members.iter().enumerate() {
        let group = *at.entry(batch).or_insert_with(|| {
            batches.push((batch, Vec::new()));
            batches.len() - 1
        });
        batches[group].1.push(i);
    }
    cmd.arg(first).arg(last);
    let mut length = 2;
    for (batch, of) in &batches {
        let wants = of.iter().any(|&i| !members[i].2.is_empty());
        cmd.arg(*batch).arg(of.len()).arg(u8::from(wants));
        for &i in of {
            let (task, _, result, stream_id) = members[i];
            cmd.arg(task).arg(stream_id);
            if wants {
                cmd.arg(result);
            }
        }
        length += 3 + of.len() * if wants { 3 } else { 2 };
    }
    cmd.arg(length);
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
        pipe.add_command(group.store.ack_script(group));
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
