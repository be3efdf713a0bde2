//! A service's tracked tasks (docs/design.md §14): a task's record, a
//! user's cancel, waiting for a task's end, and switching tracking on a
//! running service.

use std::time::Duration;

use super::Service;
use crate::error::Result;
use crate::partition::partition_of;
use crate::tracking::{self, CancelOutcome, TaskHandle, TaskRecord, Tracking, Waited, read};

impl Service {
    /// Task `handle`'s record (one read in its partition; a bare id is
    /// looked up over every partition in one pipeline), with its headers
    /// read from its entry ([`TaskRecord::headers`]); `None` when it has
    /// none: tracking was off when it was enqueued and it has not started,
    /// it never existed, or its record expired.
    pub async fn task(&self, handle: &TaskHandle) -> Result<Option<TaskRecord>> {
        let found = read::find(&self.admin.conn, &self.name, self.units(), handle).await?;
        let Some(mut record) = found else {
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
        let partition = self.partition_of(handle).await?;
        let tracking = self.tracking().await?;
        tracking::cancel::cancel(&self.admin.conn, &self.name, handle, partition, &tracking).await
    }

    /// Waits until task `handle` is final, at most `timeout`; woken
    /// through Redis pub/sub when it ends, never by polling. Every wait of
    /// one [`Admin`](super::Admin) (and the services it gave) shares one
    /// pub/sub connection, made at the first wait. The record it ends
    /// with has its headers, as [`task`](Self::task)'s.
    pub async fn wait(&self, handle: &TaskHandle, timeout: Duration) -> Result<Waited> {
        let partition = self.partition_of(handle).await?;
        let id = handle.id().as_str();
        let (conn, channels) = (&self.admin.conn, &self.admin.channels);
        let mut waited = read::wait(conn, channels, &self.name, partition, id, timeout).await?;
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

    /// The partition of `handle`: named, else where its record is, else
    /// where a task enqueued without a key goes.
    async fn partition_of(&self, handle: &TaskHandle) -> Result<u32> {
        if let Some(p) = handle.partition() {
            return Ok(p);
        }
        let conn = &self.admin.conn;
        if let Some(record) = read::find(conn, &self.name, self.units(), handle).await? {
            return Ok(record.handle.partition().unwrap_or_default());
        }
        let id = handle.id().as_str();
        Ok(partition_of(id.as_bytes(), self.partitions().max(1)))
    }
}
