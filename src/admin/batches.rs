//! A service's batches (docs/design.md §19): a batch's record.

use super::Service;
use crate::error::Result;
use crate::workflow::{self, BatchId, BatchView};

impl Service {
    /// Batch `id` as its record says now (one read in its home
    /// partition's slot); `None` when there is no such batch: never
    /// opened, or gone after its retention.
    pub async fn batch(&self, id: &BatchId) -> Result<Option<BatchView>> {
        workflow::view(&self.admin.conn, &self.name, id).await
    }
}
