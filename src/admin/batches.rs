//! A service's batches (docs/design.md §19): a batch's record, and a
//! user's cancel of one.

use super::Service;
use crate::error::Result;
use crate::workflow::{self, BatchCancelled, BatchId, BatchView};

impl Service {
    /// Batch `id` as its record says now (one read in its home
    /// partition's slot); `None` when there is no such batch: never
    /// opened, or gone after its retention.
    pub async fn batch(&self, id: &BatchId) -> Result<Option<BatchView>> {
        workflow::view(&self.admin.conn, &self.name, id).await
    }

    /// Cancels batch `id`: it takes no member any more and sends no
    /// callback; for a flow, its parent never runs (or, enqueued already,
    /// is cancelled as a task), its children not final are cancelled, and
    /// so are its subflows, all the way down; a chain stops at its step
    /// running, which is cancelled. The members of a batch built with
    /// [`cancellable`](crate::producer::BatchBuilder::cancellable) are
    /// cancelled too; a plain batch's run on (cancel them by id). A task is
    /// cancelled as [`cancel`](Self::cancel) does it: with tracking off,
    /// the request is kept but an untracked task still runs. Cancelling
    /// twice is harmless.
    pub async fn cancel_batch(&self, id: &BatchId) -> Result<BatchCancelled> {
        let tracking = self.tracking().await?;
        workflow::cancel(&self.admin.conn, &self.name, id, &tracking).await
    }
}
