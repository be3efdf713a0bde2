//! The forwarding of completion records to their batches (docs/design.md
//! §19), one task per instance for all the partitions it owns.
//!
//! The fenced script that ends a batch member writes a completion record
//! in the member's partition; here the instance reads the records of the
//! partitions that may have some (their owner's scripts wrote some, or the
//! partition was just acquired, with what a crashed owner left), in one
//! round trip, gathers each batch's records from all of them, hands each
//! batch its members' ends in one call of the batch script (which counts
//! each member once, by the record's id, and adds the callback once the
//! batch is complete), and deletes them. Every step may be run twice (a
//! crash between the batch's call and the delete, a stale owner beside the
//! new one): the batch takes a member's state only from a newer record, so
//! nothing is counted twice.
//!
//! One task for the instance, not one per partition: a batch's members
//! spread over every partition, and a forward per partition carried a few
//! members each, most of what a member cost (BENCHMARKS.md, Batches).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis::{self, Value};
use tokio::sync::Notify;
use tracing::{debug, warn};

use super::store::PartitionStore;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::workflow::Completion;
use crate::workflow::records::{self, Forwarded};

/// Completion records read per partition and round.
const PAGE: usize = 512;
/// How soon forwarding is tried again after a failure.
const AGAIN: Duration = Duration::from_secs(1);
/// How long after a partition was noted its records are forwarded: the
/// records of that while, of every partition, go in one round.
const GATHER: Duration = Duration::from_millis(20);

/// The partitions whose records wait to be forwarded.
#[derive(Debug, Default)]
pub(crate) struct Completions {
    /// Partition → its store (the newest noted: its owner's).
    noted: Mutex<HashMap<u32, Arc<PartitionStore>>>,
    wake: Notify,
}

impl Completions {
    /// Partition `store` may have records to forward.
    pub(crate) fn note(&self, store: &Arc<PartitionStore>) {
        let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        noted.insert(store.partition(), store.clone());
        self.wake.notify_one();
    }

    /// Forwards what is noted, a round at a time, until dropped.
    pub(crate) async fn run(self: Arc<Self>, name: ServiceName, conn: Arc<SharedConnection>) {
        loop {
            self.wake.notified().await;
            tokio::time::sleep(GATHER).await;
            let stores: Vec<Arc<PartitionStore>> = {
                let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
                noted.drain().map(|(_, store)| store).collect()
            };
            if stores.is_empty() {
                continue;
            }
            let again = forward(&name, &conn, &stores).await;
            if !again.is_empty() {
                let failed = again.len() < stores.len() || again.iter().any(|(_, f)| *f);
                if failed {
                    tokio::time::sleep(AGAIN).await;
                }
                for (store, _) in again {
                    self.note(&store);
                }
            }
        }
    }
}

/// One round over `stores`: returns the stores to come back to (with a
/// full page, or after a failure: `true`).
async fn forward(
    name: &ServiceName,
    conn: &SharedConnection,
    stores: &[Arc<PartitionStore>],
) -> Vec<(Arc<PartitionStore>, bool)> {
    let pages = match read(conn, stores).await {
        Ok(pages) => pages,
        Err(e) => {
            debug!(cause = %e, "cannot read the completion records");
            return stores.iter().map(|s| (s.clone(), true)).collect();
        }
    };
    // Each batch's records from every partition, one call each.
    let Forwarded { failed, homes } =
        records::forward_each(conn, name, pages.iter().flatten()).await;
    for (batch, e) in &failed {
        warn!(batch, cause = %e, "cannot forward members' ends to their batch");
    }
    let failed: Vec<&str> = failed.iter().map(|(batch, _)| *batch).collect();
    // Homes of cancelled subflows that ended their parents in their outer
    // flows: those records are forwarded at once.
    for home in homes {
        if let Err(e) = records::forward_partition(conn, name, home).await {
            // Its owner forwards it when it next acks or acquires it.
            debug!(home, cause = %e, "cannot forward a cancelled subflow's end");
        }
    }
    let mut again = Vec::new();
    let mut delete = redis::pipe();
    let mut deleting = Vec::new();
    for (store, page) in stores.iter().zip(&pages) {
        let done: Vec<&str> = page
            .iter()
            .filter(|c| !failed.contains(&c.batch.as_str()))
            .map(|c| c.at.as_str())
            .collect();
        let kept = done.len() < page.len();
        if !done.is_empty() {
            delete.add_command(store.forget_completions(&done));
            deleting.push(store);
        }
        if kept || page.len() == PAGE {
            again.push((store.clone(), kept));
        }
    }
    if !deleting.is_empty()
        && let Err(e) = conn.query_pipe_each::<Vec<Value>>(&mut delete).await
    {
        // Forwarded again later: the batch counts none twice.
        debug!(cause = %e, "cannot delete forwarded completion records");
        for store in deleting {
            again.push((store.clone(), true));
        }
    }
    again
}

/// Each store's oldest [`PAGE`] records, in one round trip.
async fn read(
    conn: &SharedConnection,
    stores: &[Arc<PartitionStore>],
) -> crate::error::Result<Vec<Vec<Completion>>> {
    let mut pipe = redis::pipe();
    for store in stores {
        pipe.add_command(store.read_completions(PAGE));
    }
    let replies: Vec<Value> = conn.query_pipe_each(&mut pipe).await?;
    replies
        .into_iter()
        .zip(stores)
        .map(|(reply, store)| match reply {
            Value::ServerError(e) => Err(redis::RedisError::from(e).into()),
            reply => Ok(store.completions_of(reply)),
        })
        .collect()
}
