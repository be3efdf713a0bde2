//! The forwarding of a partition's completion records to their batches
//! (docs/design.md §19), part of the partition owner's housekeeping.
//!
//! The fenced script that ends a batch member writes a completion record
//! in the member's partition; here the owner reads them in order, hands
//! each batch its members' ends in one call of the batch script (which
//! counts each member once, by the record's id, and adds the callback
//! once the batch is complete), and deletes them. Every step may be run
//! twice (a crash between the batch's call and the delete, a stale owner
//! beside the new one): the batch takes a member's state only from a
//! newer record, so nothing is counted twice. The owner forwards when it
//! acquires the partition (what a crashed owner left) and soon after its
//! own scripts wrote records.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::ownership::Ownership;
use super::shared::Shared;
use crate::workflow::{BatchId, Completion};

/// Completion records read and forwarded at once.
const PAGE: usize = 512;
/// How soon forwarding is tried again after a failure.
const AGAIN: Duration = Duration::from_secs(1);
/// How long after a script of this instance wrote records they are
/// forwarded: the records of the acks of that while go in one forward
/// (with a no-op handler, an ack lands about every millisecond, and a
/// forward each was most of what a member cost).
pub(super) const GATHER: Duration = Duration::from_millis(5);

/// Forwards the partition's completion records, a page of them; returns
/// when to come back: at once when a full page went, after a pause when
/// something failed, else `None` (until a script writes more).
pub(super) async fn forward(shared: &Shared, ownership: &Ownership) -> Option<Instant> {
    let store = &ownership.store;
    let partition = store.partition();
    let records = match store.completions(PAGE).await {
        Ok(records) => records,
        Err(e) => {
            debug!(partition, cause = %e, "cannot read the completion records");
            return Some(Instant::now() + AGAIN);
        }
    };
    if records.is_empty() {
        return None;
    }
    // Each batch's in their order, one call each.
    let mut by_batch: BTreeMap<&str, Vec<&Completion>> = BTreeMap::new();
    for record in &records {
        by_batch.entry(&record.batch).or_default().push(record);
    }
    let mut forwarded: Vec<&str> = Vec::with_capacity(records.len());
    let mut failed = false;
    for (batch, ends) in by_batch {
        let sent = match batch.parse::<BatchId>() {
            Ok(id) => store.forward(&shared.name, &id, &ends).await,
            // A record no batch can take (written by hand) is dropped.
            Err(e) => {
                warn!(partition, batch, cause = %e, "a completion record names no batch; dropped");
                Ok(())
            }
        };
        match sent {
            Ok(()) => forwarded.extend(ends.iter().map(|c| c.at.as_str())),
            Err(e) => {
                warn!(partition, batch, cause = %e, "cannot forward members' ends to their batch");
                failed = true;
            }
        }
    }
    if let Err(e) = store.forget_completions(&forwarded).await {
        // Forwarded again later: the batch counts none twice.
        debug!(partition, cause = %e, "cannot delete forwarded completion records");
        failed = true;
    }
    let now = Instant::now();
    match (failed, records.len() == PAGE) {
        (true, _) => Some(now + AGAIN),
        (false, true) => Some(now),
        (false, false) => None,
    }
}
