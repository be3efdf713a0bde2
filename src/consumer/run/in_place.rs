//! Ordered partitions' in-place retries (docs/design.md §6): what Redis
//! records of an entry's attempts (its delivery and failure counts), the
//! backoff a failed attempt waits out in place, and, for a tracked task
//! (§14), its record along the way: `retrying` during the backoff,
//! `running` as the next attempt starts, and a user's cancel, which ends
//! the task rather than letting it run again.

use std::time::Duration;

use tracing::warn;

use super::Batch;
use crate::consumer::running::RunningTask;
use crate::consumer::store::{Attempts, Deliveries, InPlace, Recorded, Track};
use crate::entry::{Entry, now_ms};

/// How an in-place retry's wait ended.
pub(super) enum Waited {
    /// The next attempt may start.
    Go,
    /// Left pending: the partition was released (the next owner runs it
    /// first), the run interrupted, or the lease lapsed meanwhile.
    Leave,
    /// A user cancelled the tracked task: acked, it ends `cancelled`.
    Cancelled,
}

impl Batch {
    /// Waits out an in-place retry's backoff, and the pause gate; then the
    /// lease must still hold (rule 6 again). `track`: a tracked task, whose
    /// user's cancel ends the wait.
    pub(super) async fn wait_in_place(
        &self,
        delay: Duration,
        track: Option<&RunningTask>,
    ) -> Waited {
        let (stop, cancel) = (&self.ownership.stop, &self.ownership.cancel);
        let user = async {
            match track {
                Some(track) => track.stopped().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(user);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.cancelled() => return Waited::Leave,
            _ = cancel.cancelled() => return Waited::Leave,
            _ = &mut user => return self.cancelled_in_place(track),
        }
        // Paused meanwhile: the next attempt waits, in place.
        tokio::select! {
            _ = self.shared.gate.opened() => {}
            _ = stop.cancelled() => return Waited::Leave,
            _ = cancel.cancelled() => return Waited::Leave,
            _ = &mut user => return self.cancelled_in_place(track),
        }
        match self.lease.valid() {
            true => Waited::Go,
            false => Waited::Leave,
        }
    }

    /// The task's own signal fired during the wait: a user's cancel, or
    /// (its parent) the partition's interruption.
    fn cancelled_in_place(&self, track: Option<&RunningTask>) -> Waited {
        match track.is_some_and(|t| t.user_cancelled()) {
            true => Waited::Cancelled,
            false => Waited::Leave,
        }
    }

    /// A tracked task's record as its attempts are recorded: `retrying`
    /// after the failure `error`, for `backoff`; `running` when `error` is
    /// empty (the next attempt starts).
    pub(super) fn in_place<'a>(
        &self,
        entry: &'a Entry,
        track: &Option<RunningTask>,
        error: &'a str,
        backoff: Duration,
    ) -> Option<InPlace<'a>> {
        let track = track.as_ref()?;
        let tracking = self.shared.tracking.on()?;
        let attempt = if error.is_empty() {
            entry.attempt
        } else {
            entry.attempt + 1
        };
        // The next attempt starts now: its final record says so.
        let started_at = now_ms();
        let running = self.ownership.store.running(attempt, started_at);
        if error.is_empty() {
            track.restarted(attempt, started_at);
        }
        Some(InPlace {
            track: Track {
                tracking,
                task: entry.id.as_str(),
                reason: "",
                error,
                attempt,
            },
            retrying: !error.is_empty(),
            running,
            backoff,
        })
    }

    /// What Redis records of the entry's attempts: its delivery count
    /// and its failure count. The first read counts 1 delivery; each
    /// attempt after the first is recorded as it starts, each failure
    /// before its backoff, and a release before the entry started takes
    /// its read's delivery back ([`record_attempts`](Self::record_attempts));
    /// every later delivery (a re-read of the pending list, here or on the
    /// next owner after a crash, an interrupted run, a lost ack or a
    /// handover) counts one more, the attempt that may have run. Claims
    /// leave the count alone. `None` when Redis does not say.
    pub(super) async fn attempts(&self, id: &str) -> Option<Attempts> {
        match self.ownership.store.attempts(id).await {
            Ok(attempts) => Some(attempts),
            Err(e) => {
                warn!(partition = self.partition, cause = %e, "cannot read the delivery and failure counts");
                None
            }
        }
    }

    /// Records in Redis the entry's delivery count (`deliveries`) and, after
    /// a failed attempt, its failure count, so that the partition's next
    /// owner continues them; tracked, its record (`in_place`). `None` when
    /// the task must not run now: the partition has a newer owner, or
    /// Redis did not answer (the entry stays pending and is read again,
    /// which counts one more delivery, rather than run with counts Redis
    /// does not know).
    pub(super) async fn record_attempts(
        &self,
        id: &str,
        deliveries: Deliveries,
        failures: Option<u32>,
        in_place: Option<&InPlace<'_>>,
    ) -> Option<Recorded> {
        let store = &self.ownership.store;
        match store
            .record_attempts(id, deliveries, failures, in_place)
            .await
        {
            Ok(Some(recorded)) => Some(recorded),
            Ok(None) => {
                self.ownership.fenced("recording the attempt");
                None
            }
            Err(e) => {
                warn!(partition = self.partition, ?deliveries, failures, cause = %e, "cannot record the attempt");
                None
            }
        }
    }
}
