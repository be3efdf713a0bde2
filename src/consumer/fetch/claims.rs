//! A fetch loop's claims: taking over what other consumers left pending in
//! its partition (a crashed or fenced instance, a lost ack), all of it on
//! acquire and then what stayed idle for `claim_idle` (docs/design.md §4
//! rule 3).

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::{Fetcher, Position};
use crate::consumer::limiter::Reserved;
use crate::consumer::run::Source;

impl Fetcher {
    /// Claims what others left pending; false when nothing new may be read
    /// yet (the first claim of a partition run one task at a time failed:
    /// what others still hold comes before anything new in the stream).
    pub(super) async fn claim_due(&self, at: &mut Position) -> bool {
        let order = self.shared.order;
        // After the claim on acquire: when the housekeeping's last look at
        // the group (at least every `claim_idle`) saw nothing pending,
        // nobody holds anything to take. What is delivered after that look
        // is seen by the next one, long before it is `claim_idle` old.
        if !at.claim_idle.is_zero() && self.ownership.store.pending_seen() == Some(0) {
            at.next_claim = Instant::now() + self.shared.settings.claim_idle / 3;
            return true;
        }
        match self.claim(at.claim_idle).await {
            Ok(took_any) => {
                at.claim_idle = self.shared.settings.claim_idle;
                // One at a time: what was claimed is now in this instance's
                // pending list; read it from there, in stream order, before
                // anything new.
                if took_any && order.one_at_a_time() {
                    self.reread(at);
                }
            }
            Err(e) => {
                warn!(partition = self.partition, cause = %e, "claim failed");
                if order.one_at_a_time() && at.claim_idle.is_zero() {
                    return false;
                }
            }
        }
        at.next_claim = Instant::now() + self.shared.settings.claim_idle / 3;
        true
    }

    /// Claims entries other consumers left pending for `idle` or longer
    /// (a crashed or fenced instance, a failed ack) and runs them; true if
    /// it took any.
    pub(super) async fn claim(&self, idle: Duration) -> crate::error::Result<bool> {
        let mut took_any = false;
        let store = &self.ownership.store;
        let order = self.shared.order;
        let batch = self.shared.settings.batch;
        let mut start = "0-0".to_owned();
        loop {
            let claimed = store
                .claim(idle, &start, batch, order.attempts_in_redis())
                .await?;
            let Some(claimed) = claimed else {
                self.ownership.fenced("claiming");
                return Ok(took_any);
            };
            took_any |= !claimed.entries.is_empty();
            // One at a time: they run from this instance's pending list, in
            // order, not enqueued again at the end.
            if !order.one_at_a_time() {
                let mut entries = claimed.entries;
                self.held.take_all(&mut entries, |entry| &entry.id);
                for entry in &entries {
                    debug!(
                        partition = self.partition,
                        id = entry.id,
                        "claimed a pending entry"
                    );
                }
                if !entries.is_empty() {
                    self.spawn_batch(entries, Source::Claimed, Reserved::none());
                }
            }
            if claimed.next == "0-0" {
                return Ok(took_any);
            }
            start = claimed.next;
        }
    }
}
