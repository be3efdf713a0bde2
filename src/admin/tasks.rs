//! A service's tracked tasks (docs/design.md §14): a task's record, a
//! user's cancel, waiting for a task's end, and switching tracking on a
//! running service.

use std::time::Duration;

use std::sync::Arc;

use super::Service;
use crate::error::Result;
use crate::reshard::read_units;
use crate::tracking::{self, CancelOutcome, TaskHandle, TaskRecord, Tracking, Waited, read};

impl Service {
    /// Task `handle`'s record (one read in its partition; a bare id is
    /// looked up over every partition in one pipeline), with its headers
    /// read from its entry ([`TaskRecord::headers`]); `None` when it has
    /// none: tracking was off when it was enqueued and it has not started,
    /// it never existed, or its record expired. After a reshard, a handle
    /// of either layout finds the task where it is (docs/design.md §21).
    pub async fn task(&self, handle: &TaskHandle) -> Result<Option<TaskRecord>> {
        let Some(mut record) = self.locate(handle).await? else {
            return Ok(None);
        };
        record.headers = self.headers_of(&record).await?;
        Ok(Some(record))
    }

    /// Cancels task `handle`: a task not started never starts, a running
    /// one's `cx.cancelled()` fires wherever it runs, and it ends
    /// `cancelled`, never retried nor dead-lettered; a task already final
    /// is left as it is ([`CancelOutcome::AlreadyFinal`]). When a cancel
    /// and a task's end race, whichever Redis ran first wins.
    pub async fn cancel(&self, handle: &TaskHandle) -> Result<CancelOutcome> {
        let tracking = self.tracking().await?;
        let conn = &self.admin.conn;
        let id = handle.id().as_str();
        let mut partition = match self.locate(handle).await? {
            Some(record) => record.handle.partition().unwrap_or_default(),
            None => self.unknown_partition(handle),
        };
        for _ in 0..MOVES_FOLLOWED {
            let at = TaskHandle::new(partition, handle.id().clone());
            let outcome = tracking::cancel::cancel(conn, &self.name, &at, partition, &tracking);
            let outcome = outcome.await?;
            // Not there any more: a reshard moved it between the look and
            // the cancel (its record goes only once the new layout holds
            // it, docs/design.md §21), so it is cancelled where it is now.
            if outcome != CancelOutcome::Unknown {
                return Ok(outcome);
            }
            let units = self.fresh_units().await?;
            if !read::spans_other(&units, partition) {
                return Ok(outcome);
            }
            match read::lookup(conn, &self.name, &units, id, Some(partition)).await? {
                Some(found) => partition = found.handle.partition().unwrap_or_default(),
                None => return Ok(outcome),
            }
        }
        Ok(CancelOutcome::Unknown)
    }

    /// Waits until task `handle` is final, at most `timeout`; woken
    /// through Redis pub/sub when it ends, never by polling. Every wait of
    /// one [`Admin`](super::Admin) (and the services it gave) shares one
    /// pub/sub connection, made at the first wait. The record it ends
    /// with has its headers, as [`task`](Self::task)'s. A task a reshard
    /// moves is followed to its new partition.
    pub async fn wait(&self, handle: &TaskHandle, timeout: Duration) -> Result<Waited> {
        let partition = match self.locate(handle).await? {
            Some(record) => record.handle.partition().unwrap_or_default(),
            None => self.unknown_partition(handle),
        };
        let id = handle.id().as_str();
        let (conn, channels) = (&self.admin.conn, &self.admin.channels);
        let layout = (self.partitions(), self.settings.levels());
        let waited = read::wait(conn, channels, &self.name, layout, partition, id, timeout);
        let mut waited = waited.await?;
        if let Waited::Final(record) | Waited::TimedOut(record) = &mut waited {
            record.headers = self.headers_of(record).await?;
        }
        Ok(waited)
    }

    /// The service's tracking as `{N}:tracking` holds it (off, with the
    /// default retention, when never set).
    pub async fn tracking(&self) -> Result<Tracking> {
        Ok(tracking::read(&self.admin.conn, &self.name)
            .await?
            .unwrap_or_default())
    }

    /// Switches tracking (and its retention) on a running service: every
    /// instance and producer follows within about a second.
    pub async fn set_tracking(&self, tracking: Tracking) -> Result<()> {
        tracking::set(&self.admin.conn, &self.name, tracking).await
    }

    /// Task `handle`'s record where it is: in the partition the handle
    /// names, else (a bare id, or a handle of a layout the task is not in)
    /// in every partition of the layout as Redis holds it now, the newest
    /// generation's first. A reshard moves delayed tasks and dead letters,
    /// and a producer's handle may name the new layout's partition of a
    /// task that landed in the old one (docs/design.md §21).
    async fn locate(&self, handle: &TaskHandle) -> Result<Option<TaskRecord>> {
        let conn = &self.admin.conn;
        let id = handle.id().as_str();
        if let Some(p) = handle.partition() {
            if let Some(record) = read::read(conn, &self.name, p, id).await? {
                return Ok(Some(record));
            }
            let units = self.fresh_units().await?;
            if !read::spans_other(&units, p) {
                return Ok(None);
            }
            return read::lookup(conn, &self.name, &units, id, Some(p)).await;
        }
        let units = self.fresh_units().await?;
        read::lookup(conn, &self.name, &units, id, None).await
    }

    /// The partitions of the layout as Redis holds it now: a reshard may
    /// have started or ended since this service was looked up.
    async fn fresh_units(&self) -> Result<Arc<[u32]>> {
        let levels = self.settings.levels();
        read_units(&self.admin.conn, &self.name, self.partitions(), levels).await
    }

    /// Where a task with no record would be: the partition its handle
    /// names, else the one a task enqueued without a key goes to now.
    fn unknown_partition(&self, handle: &TaskHandle) -> u32 {
        handle
            .partition()
            .unwrap_or_else(|| self.generations.0.route(handle.id().as_str().as_bytes(), 0))
    }
}

/// How many times a cancel follows its task to another partition (a
/// reshard moves a task once).
const MOVES_FOLLOWED: usize = 4;
