//! Batched, fenced acknowledgements.
//!
//! Finished tasks are acked by one task per instance: it takes whatever has
//! finished since its last round trip and sends one fenced ack script per
//! partition in one pipeline, so acks cost one round trip per batch, not
//! per task, and add no delay when the instance is idle. The script acks
//! only while this instance is the partition's recorded owner (docs/design.md §4
//! rule 8).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{error, warn};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::fencing::{self, Fence};

/// Most acks sent in one pipeline.
const MAX_BATCH: usize = 1024;
/// How often a failed ack batch is tried before its entries are left
/// pending (the partition's owner then claims and re-runs them): with the
/// backoff below, about 10 s, so a short outage of Redis costs no re-runs.
const ATTEMPTS: u32 = 8;
/// Longest pause between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// One finished task to ack.
#[derive(Debug)]
pub(crate) struct Ack {
    /// The partition and token it ran under.
    pub(crate) fence: Arc<Fence>,
    /// Its stream entry id.
    pub(crate) id: String,
    /// Told once the ack has landed, was refused, or was given up.
    pub(crate) done: oneshot::Sender<Acked>,
}

/// How an ack ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acked {
    /// Acked (or not pending any more).
    Yes,
    /// Refused: another instance owns the partition now.
    Fenced,
    /// Redis did not answer; the entry stays pending and will run again.
    GaveUp,
}

/// Sends acks in batches until every sender is dropped.
pub(crate) fn spawn(
    name: ServiceName,
    conn: Arc<SharedConnection>,
) -> (mpsc::UnboundedSender<Ack>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Ack>();
    let task = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
            send(&name, &conn, &mut batch).await;
        }
    });
    (tx, task)
}

/// Acks `batch` (emptying it) and tells each sender how it went.
async fn send(name: &ServiceName, conn: &SharedConnection, batch: &mut Vec<Ack>) {
    // One script per partition and token (a partition may be released and
    // acquired again, with a new token, while acks are underway).
    let mut groups: BTreeMap<(u32, u64), (Arc<Fence>, Vec<Ack>)> = BTreeMap::new();
    for ack in batch.drain(..) {
        let key = (ack.fence.partition(), ack.fence.token());
        groups
            .entry(key)
            .or_insert_with(|| (ack.fence.clone(), Vec::new()))
            .1
            .push(ack);
    }
    let groups: Vec<(Arc<Fence>, Vec<Ack>)> = groups.into_values().collect();
    let outcomes = ack_groups(name, conn, &groups).await;
    for ((_, acks), outcome) in groups.into_iter().zip(outcomes) {
        for ack in acks {
            let _ = ack.done.send(outcome);
        }
    }
}

/// One outcome per group, with retries.
async fn ack_groups(
    name: &ServiceName,
    conn: &SharedConnection,
    groups: &[(Arc<Fence>, Vec<Ack>)],
) -> Vec<Acked> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for (fence, acks) in groups {
        let ids: Vec<&str> = acks.iter().map(|a| a.id.as_str()).collect();
        pipe.invoke_script(&fence.ack(&ids));
    }
    for attempt in 1..=ATTEMPTS {
        let failure = match conn
            .query_pipe::<Vec<redis::RedisResult<Value>>>(&pipe)
            .await
        {
            Ok(replies) if replies.iter().any(is_noscript) => {
                // Redis restarted and forgot the script: pipelines do not
                // load scripts by themselves.
                match fencing::load_ack_script(conn).await {
                    Ok(()) => continue,
                    Err(e) => e.to_string(),
                }
            }
            // Redis is loading its data, failing over or busy: the acks
            // (idempotent) are sent again, like after a connection error.
            Ok(replies) if replies.iter().any(is_transient) => {
                let e = replies.into_iter().find(is_transient).expect("found");
                format!("{:?}", e.err())
            }
            Ok(replies) => return replies.iter().map(outcome).collect(),
            Err(e) => e.to_string(),
        };
        warn!(service = %name, attempt, cause = failure, "ack failed; retrying");
        let backoff = Duration::from_millis(100) * 2u32.pow(attempt - 1);
        tokio::time::sleep(backoff.min(MAX_BACKOFF)).await;
    }
    let count: usize = groups.iter().map(|(_, acks)| acks.len()).sum();
    error!(
        service = %name,
        count,
        "acks failed {ATTEMPTS} times; the tasks stay pending and will run again"
    );
    vec![Acked::GaveUp; groups.len()]
}

fn is_noscript(reply: &redis::RedisResult<Value>) -> bool {
    matches!(reply, Err(e) if e.code() == Some("NOSCRIPT"))
}

/// An error reply that says "not now" rather than "no".
fn is_transient(reply: &redis::RedisResult<Value>) -> bool {
    const TRANSIENT: [&str; 6] = [
        "LOADING",
        "BUSY",
        "READONLY",
        "MASTERDOWN",
        "TRYAGAIN",
        "CLUSTERDOWN",
    ];
    matches!(reply, Err(e) if e.code().is_some_and(|c| TRANSIENT.contains(&c)))
}

fn outcome(reply: &redis::RedisResult<Value>) -> Acked {
    match reply {
        Ok(Value::Int(n)) if *n >= 0 => Acked::Yes,
        Ok(Value::Int(_)) => Acked::Fenced,
        Ok(other) => {
            error!(reply = ?other, "unexpected reply to an ack");
            Acked::GaveUp
        }
        Err(e) => {
            error!(cause = %e, "ack refused by redis");
            Acked::GaveUp
        }
    }
}
