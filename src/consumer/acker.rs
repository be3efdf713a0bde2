//! Batched acknowledgements.
//!
//! Finished tasks are acked by one task per instance: it takes whatever has
//! finished since its last round trip and sends one `XACK` per partition in
//! one pipeline, so acks cost one round trip per batch, not per task, and
//! add no delay when the instance is idle.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{error, warn};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::keys;

/// Most acks sent in one pipeline.
const MAX_BATCH: usize = 1024;
/// How often a failed ack batch is tried before its entries are left
/// pending (the partition's owner then claims and re-runs them): with the
/// backoff below, about 10 s, so a short outage of Redis costs no re-runs.
const ATTEMPTS: u32 = 8;
/// Longest pause between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// One finished task to ack: its partition, its stream entry id, and who
/// to tell once the ack has landed (or was given up).
pub(crate) type Ack = (u32, String, oneshot::Sender<()>);

/// Sends acks in batches until every sender is dropped.
pub(crate) fn spawn(
    name: ServiceName,
    conn: Arc<SharedConnection>,
) -> (mpsc::UnboundedSender<Ack>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Ack>();
    let task = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
            send(&name, &conn, &batch).await;
            for (_, _, done) in batch.drain(..) {
                let _ = done.send(());
            }
        }
    });
    (tx, task)
}

async fn send(name: &ServiceName, conn: &SharedConnection, batch: &[Ack]) {
    let mut by_partition: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for (p, id, _) in batch {
        by_partition.entry(*p).or_default().push(id);
    }
    let mut pipe = redis::pipe();
    for (p, ids) in &by_partition {
        pipe.xack(keys::stream(name, *p), keys::GROUP, ids).ignore();
    }
    for attempt in 1..=ATTEMPTS {
        match conn.query_pipe::<()>(&pipe).await {
            Ok(()) => return,
            Err(e) => {
                warn!(service = %name, attempt, cause = %e, "ack failed; retrying");
                let backoff = Duration::from_millis(100) * 2u32.pow(attempt - 1);
                tokio::time::sleep(backoff.min(MAX_BACKOFF)).await;
            }
        }
    }
    error!(
        service = %name,
        count = batch.len(),
        "acks failed {ATTEMPTS} times; the tasks stay pending and will run again"
    );
}
