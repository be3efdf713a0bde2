//! When an entry of a [`Batch`] may start: it has a running permit, the
//! partition is not released, the pause gate is open, the lease holds
//! (rule 6), and it has a token of the service's rate limit, if one is set
//! (docs/design.md §7, §15).

use tokio::sync::SemaphorePermit;

use super::Batch;

impl Batch {
    /// A running permit, if the instance has one free, the partition is
    /// not released, the pause gate is open and the lease holds, all now.
    pub(super) fn ready_at_once(&self) -> Option<SemaphorePermit<'_>> {
        let permit = self.shared.room.try_run(self.level)?;
        // The token last: taken only when the task starts.
        let ready = !self.ownership.stop.is_cancelled()
            && self.shared.gate.is_open()
            && self.lease.valid()
            && self.token();
        ready.then_some(permit)
    }

    /// Takes a token of the service's rate limit for a start: one its
    /// read reserved, else one of the pool (at once when not limited).
    fn token(&self) -> bool {
        self.tokens.take() || self.shared.limiter.try_take()
    }

    /// Waits for room, for the pause gate (holding the room, so a paused
    /// instance reads no more than it has room for) and for the lease
    /// (rule 6: nothing fetched runs without one); `None` when the
    /// partition is released first: a task that has not started then is
    /// handed back instead of making the drain wait for it.
    pub(super) async fn ready(&self) -> Option<SemaphorePermit<'_>> {
        let stop = &self.ownership.stop;
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            permit = self.shared.room.run(self.level) => permit,
        };
        let gate = &self.shared.gate;
        loop {
            // Both at once: a pause that lands while the lease is awaited,
            // or a lease that lapses while paused, sends the task back to
            // wait.
            while !(gate.is_open() && self.lease.valid()) {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return None,
                    _ = gate.opened(), if !gate.is_open() => {}
                    _ = self.lease.held(), if gate.is_open() => {}
                }
            }
            // A wake by the gate may find the lease valid without passing
            // the select again: a partition released meanwhile (a fence
            // after a skipped epoch, then the next lease) must not start
            // the task.
            if stop.is_cancelled() {
                return None;
            }
            // Last, holding the room as the pause does: a limited instance
            // reads no more than it has room for. The gate and the lease
            // are asked again after a wait for tokens.
            if self.token() {
                return Some(permit);
            }
            tokio::select! {
                biased;
                _ = stop.cancelled() => return None,
                _ = self.shared.limiter.replenished() => {}
            }
        }
    }
}
