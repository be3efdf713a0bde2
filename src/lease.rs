//! The instance's lease (docs/design.md §4 rule 6): an assignment of epoch `E`
//! vouches for the partitions it owns until `(E - 1) * I + 1.5 I + lease
//! margin` by the local clock, and for no longer than that much monotonic
//! time from its arrival, so a step of the wall clock never extends it.
//!
//! The runtime grants and revokes it; workers check it before each fetch
//! and before running what they fetched. The singletons' driver keeps a
//! lease of its own from the same assignments (docs/design.md §20), so it
//! lives beside both rather than in either.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};
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

/// The lease's end in atomics, so that checking it takes no lock: every
/// task checks it before it runs and again as it ends, and every call of
/// `still_owned()` does. A sequence number guards the pair (a seqlock):
/// odd while a grant or a revoke writes it, so a reader never combines one
/// grant's wall end with another's monotonic end.
#[derive(Debug)]
struct Ends {
    seq: AtomicU64,
    /// Nanoseconds since the Unix epoch.
    wall_ns: AtomicU64,
    /// Nanoseconds after `base`; [`NONE`]: no lease.
    monotonic_ns: AtomicU64,
    base: Instant,
}

/// `Ends::monotonic_ns` when no lease is granted.
const NONE: u64 = 0;

impl Ends {
    fn new() -> Self {
        Ends {
            seq: AtomicU64::new(0),
            wall_ns: AtomicU64::new(0),
            monotonic_ns: AtomicU64::new(NONE),
            base: Instant::now(),
        }
    }

    /// Writes `end`; callers are serialized (by the lease's watch).
    fn write(&self, end: Option<End>) {
        let (wall, monotonic) = match end {
            Some(end) => (
                nanos(end.wall),
                // Never `NONE`: an end at `base` has passed anyway.
                nanos(end.monotonic.saturating_duration_since(self.base)).max(1),
            ),
            None => (0, NONE),
        };
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.wall_ns.store(wall, Ordering::Relaxed);
        self.monotonic_ns.store(monotonic, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The end as last written, never half of one write and half of the
    /// next.
    fn read(&self) -> Option<End> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let wall = self.wall_ns.load(Ordering::Relaxed);
            let monotonic = self.monotonic_ns.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != before {
                continue;
            }
            return (monotonic != NONE).then(|| End {
                wall: Duration::from_nanos(wall),
                monotonic: self.base + Duration::from_nanos(monotonic),
            });
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The lease of the assignment in force, shared by the runtime and the
/// workers.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    clock: Arc<dyn Clock>,
    ends: Arc<Ends>,
    /// Tells waiters ([`held`](Self::held)) of each grant and revoke, and
    /// serializes the writes of `ends`.
    changed: Arc<watch::Sender<()>>,
}

impl Lease {
    /// No lease yet.
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Lease {
            clock,
            ends: Arc::new(Ends::new()),
            changed: Arc::new(watch::Sender::new(())),
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
        let end = End {
            wall: wall_end,
            monotonic: Instant::now() + left,
        };
        self.changed.send_modify(|()| self.ends.write(Some(end)));
    }

    /// Ends the lease now (a fence, a failed round, a leave).
    pub(crate) fn revoke(&self) {
        self.changed.send_modify(|()| self.ends.write(None));
    }

    /// Whether the lease holds now.
    pub(crate) fn valid(&self) -> bool {
        self.left().is_some()
    }

    /// How long the lease still holds, if it does.
    pub(crate) fn left(&self) -> Option<Duration> {
        let end = self.ends.read()?;
        let wall = end.wall.checked_sub(self.clock.now())?;
        let monotonic = end.monotonic.checked_duration_since(Instant::now())?;
        Some(wall.min(monotonic)).filter(|d| !d.is_zero())
    }

    /// Resolves once the lease holds (at once if it does).
    pub(crate) async fn held(&self) {
        let mut changed = self.changed.subscribe();
        loop {
            if self.valid() {
                return;
            }
            if changed.changed().await.is_err() {
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
            ..granting.clone()
        };
        assert!(stepped.left().unwrap() <= Duration::from_millis(50));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(
            !stepped.valid(),
            "the monotonic bound ended it although the wall clock says an hour is left"
        );
    }

    #[test]
    fn a_reader_never_mixes_two_grants() {
        // Two grants whose ends differ by both clocks; a reader that took
        // one's wall end with the other's monotonic end would see them
        // differ from each other.
        let ends = Arc::new(Ends::new());
        let end = |s: u64| End {
            wall: Duration::from_secs(s),
            monotonic: ends.base + Duration::from_secs(s),
        };
        let (one, two) = (end(1), end(2));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = std::thread::spawn({
            let (ends, stop) = (ends.clone(), stop.clone());
            move || {
                for i in 0u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    ends.write(match i % 3 {
                        0 => Some(one),
                        1 => Some(two),
                        _ => None,
                    });
                }
            }
        });
        let started = std::time::Instant::now();
        let mut seen = 0;
        while started.elapsed() < Duration::from_millis(200) {
            if let Some(read) = ends.read() {
                assert!(read == one || read == two, "a mixed end: {read:?}");
                seen += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(seen > 0);
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
