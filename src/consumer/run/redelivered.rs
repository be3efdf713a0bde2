//! Concurrent mode's attempt of an entry re-read from this instance's own
//! pending list (docs/design.md §6, earlier deliveries).
//!
//! Each earlier delivery of such an entry may have been a run: an ack
//! lost, a claim that landed although its reply never arrived (the
//! re-read after the failure finds the entry here, with no take-over). So
//! it runs or is handed back with its attempt plus its earlier
//! deliveries, `attempt + deliveries - 1`, counting the re-read, as a
//! claimed entry is taken over (its claim reads the counts itself), and
//! an entry never runs twice with one attempt. Found by the chaos run,
//! which saw a claimed entry re-read and handed back with its first
//! attempt.

use tracing::warn;

use super::Batch;
use crate::consumer::store::Fetched;

impl Batch {
    /// Adds to the attempt of each of `entries` its earlier deliveries, as
    /// Redis counts them (one round trip). An entry no longer pending (its
    /// ack landed meanwhile) is dropped and let go of as settled. False
    /// when Redis did not answer: nothing may run or move, and every entry
    /// stays pending, to be claimed again.
    pub(super) async fn count_deliveries(&self, entries: &mut Vec<Fetched>) -> bool {
        let ids: Vec<&str> = entries
            .iter()
            .filter(|f| f.entry.is_ok())
            .map(|f| &*f.id)
            .collect();
        if ids.is_empty() {
            return true;
        }
        let deliveries = match self.ownership.store.deliveries(&ids).await {
            Ok(deliveries) => deliveries,
            Err(e) => {
                warn!(partition = self.partition, cause = %e, "cannot read the delivery counts; left pending");
                return false;
            }
        };
        let mut counts = deliveries.into_iter();
        let mut gone = Vec::new();
        for fetched in entries.iter_mut() {
            let Ok(entry) = &mut fetched.entry else {
                continue;
            };
            match counts.next().unwrap_or(0) {
                0 => gone.push(fetched.id.clone()),
                n => entry.attempt = entry.attempt.saturating_add(n - 1),
            }
        }
        if !gone.is_empty() {
            entries.retain(|f| !gone.contains(&f.id));
            self.held
                .release_all(gone.iter().map(|id| (id.as_str(), true)));
        }
        true
    }
}
