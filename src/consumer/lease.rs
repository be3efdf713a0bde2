//! The instance's lease (docs/design.md §4 rule 6): an assignment of epoch `E`
//! vouches for the partitions it owns until `(E - 1) * I + 1.5 I + lease
//! margin` by the local clock, and for no longer than that much monotonic
//! time from its arrival, so a step of the wall clock never extends it.
//!
//! The runtime grants and revokes it; workers check it before each fetch
//! and before running what they fetched.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::Clock;

/// When a granted lease ends, by both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct End {
    wall: Duration,
    monotonic: Instant,
}

/// The lease of the assignment in force, shared by the runtime and the
/// workers.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    clock: Arc<dyn Clock>,
    end: Arc<watch::Sender<Option<End>>>,
}

impl Lease {
    /// No lease yet.
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Lease {
            clock,
            end: Arc::new(watch::Sender::new(None)),
        }
    }

    /// The instance's wall clock.
    pub(crate) fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Grants the lease until `wall_end` by the wall clock, and as long
    /// from now by the monotonic clock.
    pub(crate) fn grant(&self, wall_end: Duration) {
        let left = wall_end.saturating_sub(self.clock.now());
        self.end.send_replace(Some(End {
            wall: wall_end,
            monotonic: Instant::now() + left,
        }));
    }

    /// Ends the lease now (a fence, a failed round, a leave).
    pub(crate) fn revoke(&self) {
        self.end.send_replace(None);
    }

    /// Whether the lease holds now.
    pub(crate) fn valid(&self) -> bool {
        self.left().is_some()
    }

    /// How long the lease still holds, if it does.
    pub(crate) fn left(&self) -> Option<Duration> {
        let end = (*self.end.borrow())?;
        let wall = end.wall.checked_sub(self.clock.now())?;
        let monotonic = end.monotonic.checked_duration_since(Instant::now())?;
        Some(wall.min(monotonic)).filter(|d| !d.is_zero())
    }

    /// Resolves once the lease holds (at once if it does).
    pub(crate) async fn held(&self) {
        let mut end = self.end.subscribe();
        loop {
            if self.valid() {
                return;
            }
            if end.changed().await.is_err() {
                // The runtime is gone; nothing will grant it again.
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{OffsetClock, SystemClock};

    #[tokio::test]
    async fn a_lease_holds_until_its_end_by_either_clock() {
        let lease = Lease::new(Arc::new(SystemClock));
        assert!(!lease.valid(), "nothing granted yet");
        lease.grant(SystemClock.now() + Duration::from_millis(200));
        let left = lease.left().unwrap();
        assert!(left <= Duration::from_millis(200) && left > Duration::from_millis(150));
        lease.revoke();
        assert!(!lease.valid());
        lease.grant(SystemClock.now().saturating_sub(Duration::from_millis(1)));
        assert!(!lease.valid(), "an end in the past grants nothing");
    }

    #[tokio::test]
    async fn a_wall_clock_step_never_extends_a_lease() {
        // Granted by a clock that then "steps back" an hour: simulated by
        // checking with a clock an hour behind the one that granted it.
        let granting = Lease::new(Arc::new(SystemClock));
        let end = SystemClock.now() + Duration::from_millis(50);
        granting.grant(end);
        let stepped = Lease {
            clock: Arc::new(OffsetClock::behind(Duration::from_secs(3600))),
            end: granting.end.clone(),
        };
        assert!(stepped.left().unwrap() <= Duration::from_millis(50));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(
            !stepped.valid(),
            "the monotonic bound ended it although the wall clock says an hour is left"
        );
    }

    #[tokio::test]
    async fn held_waits_for_a_grant() {
        let lease = Lease::new(Arc::new(SystemClock));
        let waiter = tokio::spawn({
            let lease = lease.clone();
            async move { lease.held().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        lease.grant(SystemClock.now() + Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("resolves once granted")
            .unwrap();
    }
}
