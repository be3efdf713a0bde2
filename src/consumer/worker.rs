//! One owned partition: start its fetch loop and housekeeping, and release
//! it on demand (drain, cancel, leave the idle read). Fetching is
//! [`super::fetch`]'s job, running one entry [`super::run`]'s, and the
//! partition's fence and stop tokens are [`super::ownership`]'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, warn};

use super::fetch::Fetcher;
use super::held::Held;
use super::housekeeping::housekeeping;
use super::idle_reads::IdleReads;
use super::ownership::Ownership;
use super::retire;
use super::shared::Shared;
use super::store::PartitionStore;
use crate::assignment::Assignment;
use crate::lease::Lease;

/// How long a release waits for the idle read to let go of a partition
/// whose fetch loop it had to abort (the read ends by its block time).
const LEAVE_TIMEOUT: Duration = Duration::from_secs(1);

/// A running worker for one partition.
#[derive(Debug)]
pub(crate) struct Worker {
    partition: u32,
    ownership: Arc<Ownership>,
    /// Ends the housekeeping once every task is done, or when the worker
    /// is dropped (a release cut short).
    done: DropGuard,
    /// The instance's idle read, which the fetch loop may be in.
    idle: IdleReads,
    tracker: TaskTracker,
    fetch: JoinHandle<()>,
}

impl Worker {
    /// Acquires the partition of `store` (records the owner, claims what
    /// others hold) and works on it under `assignment` while `lease` holds.
    pub(crate) fn start(
        shared: Arc<Shared>,
        store: PartitionStore,
        assignment: watch::Receiver<Assignment>,
        lease: Lease,
    ) -> Worker {
        let partition = store.partition();
        let ownership = Arc::new(Ownership::new(store, shared.reports.clone()));
        let done = CancellationToken::new();
        let idle = shared.idle.clone();
        let tracker = TaskTracker::new();
        let held = Held::default();
        let acquired = CancellationToken::new();
        tokio::spawn(
            housekeeping(
                shared.clone(),
                ownership.clone(),
                held.clone(),
                acquired.clone(),
                done.clone(),
            )
            .in_current_span(),
        );
        tokio::spawn(
            retire::follow(
                ownership.clone(),
                assignment.clone(),
                acquired.clone(),
                shared.tracking.clone(),
            )
            .in_current_span(),
        );
        let fetcher = Fetcher {
            lane: shared.lanes.take(),
            shared,
            partition,
            assignment,
            lease,
            ownership: ownership.clone(),
            acquired,
            tracker: tracker.clone(),
            held,
        };
        let fetch = tokio::spawn(fetcher.run().in_current_span());
        Worker {
            partition,
            ownership,
            done: done.drop_guard(),
            idle,
            tracker,
            fetch,
        }
    }

    /// The partition as this worker owns it.
    pub(crate) fn ownership(&self) -> &Arc<Ownership> {
        &self.ownership
    }

    /// Stops fetching, lets running tasks finish until `deadline`, then
    /// interrupts the rest (their stop signal fires) and waits until they
    /// have stopped and everything that finished is acked (docs/design.md
    /// §4 rule 1). Interrupted tasks are enqueued again with `attempt + 1`;
    /// fetched ones that never started are handed back as they were.
    pub(crate) async fn release(mut self, deadline: Instant) {
        self.ownership.release(deadline);
        // The fetch loop watches `stop` at every wait; bound it anyway.
        let fetch = &mut self.fetch;
        let aborted = tokio::time::timeout_at(deadline, &mut *fetch)
            .await
            .is_err();
        if aborted {
            debug!(
                partition = self.partition,
                "fetch loop did not stop by the drain timeout"
            );
            fetch.abort();
            // Until it has stopped, it could still start a task.
            let _ = fetch.await;
        }
        self.tracker.close();
        if tokio::time::timeout_at(deadline, self.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                partition = self.partition,
                "drain timed out; interrupting running tasks"
            );
            self.ownership.cancel.cancel();
            self.tracker.wait().await;
        }
        // After the interruption (which must not wait for Redis).
        if aborted {
            self.leave_idle_read().await;
        }
        drop(self.done);
    }

    /// The fetch loop was aborted, maybe while in the idle read: take the
    /// partition out of it, so the read cannot deliver an entry into this
    /// instance's pending list after the drain is reported (the next owner
    /// would only claim it after `claim_idle`). What it delivered until
    /// then stays pending, claimed by the next owner on acquire.
    async fn leave_idle_read(&self) {
        let store = &self.ownership.store;
        let leave = self.idle.leave(store.partition(), store.token());
        if tokio::time::timeout(LEAVE_TIMEOUT, leave).await.is_err() {
            debug!(
                partition = self.partition,
                "the idle read did not let the partition go in time"
            );
        }
    }
}
