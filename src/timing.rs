//! Epoch arithmetic, written once: where an epoch's interval begins
//! (docs/design.md §2), which epoch a time falls in, and the times the
//! handover rules derive from them (docs/design.md §4). Used by the
//! indexer's round schedule and by the transition machine.
//!
//! All times are durations since the Unix epoch. Epoch `E` is the interval
//! `[(E - 1) * I, E * I)`. The products are taken in nanoseconds: epochs
//! count from the Unix epoch, so at a 100 ms interval they pass `u32::MAX`
//! and `Duration * u32` would not do.

use std::time::Duration;

/// Timer lateness and cancellation latency (docs/design.md §4 rule 3).
const LATENESS: Duration = Duration::from_millis(50);

/// `nanos` as a duration, saturating at `u64::MAX` seconds.
fn from_nanos(nanos: u128) -> Duration {
    Duration::new(
        u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX),
        (nanos % 1_000_000_000) as u32,
    )
}

/// Where epoch `e`'s interval begins: `(E - 1) * I`.
pub(crate) fn epoch_start(interval: Duration, e: u64) -> Duration {
    from_nanos(interval.as_nanos() * u128::from(e.saturating_sub(1)))
}

/// The epoch whose interval holds time `t`: `floor(t / I) + 1`.
pub(crate) fn epoch_at(interval: Duration, t: Duration) -> u64 {
    u64::try_from(t.as_nanos() / interval.as_nanos() + 1).unwrap_or(u64::MAX)
}

/// The service-wide times the handover rules are computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    pub(crate) interval: Duration,
    pub(crate) skew: Duration,
    pub(crate) lease_margin: Duration,
    pub(crate) drain_timeout: Duration,
}

impl Timing {
    /// Where epoch `e`'s interval begins: `(E - 1) * I`.
    fn epoch_start(&self, e: u64) -> Duration {
        epoch_start(self.interval, e)
    }

    /// Rule 3: `S_allow = 2S + lease margin + 50 ms`.
    pub(crate) fn s_allow(&self) -> Duration {
        2 * self.skew + self.lease_margin + LATENESS
    }

    /// Rule 3: the handover deadline of epoch `e`:
    /// `(E - 1) * I + I/2 + drain timeout + S_allow`.
    pub(crate) fn deadline(&self, e: u64) -> Duration {
        self.epoch_start(e) + self.interval / 2 + self.drain_timeout + self.s_allow()
    }

    /// Rule 1: when a release for epoch `e` whose assignment arrived at
    /// `arrival` must have drained: the drain counts from
    /// `min(arrival, (E - 1) * I + I/2)`, so a late assignment gets a shorter
    /// drain, never a later one.
    pub(crate) fn drain_end(&self, e: u64, arrival: Duration) -> Duration {
        arrival.min(self.epoch_start(e) + self.interval / 2) + self.drain_timeout
    }

    /// Rule 6: the lease of an assignment of epoch `e` ends at
    /// `(E - 1) * I + 1.5 I + lease margin`.
    pub(crate) fn lease_end(&self, e: u64) -> Duration {
        self.epoch_start(e) + self.interval + self.interval / 2 + self.lease_margin
    }

    /// Rule 6: the lease an assignment of epoch `e` that arrived at `now`
    /// grants — its end — or `None` when it arrived after its own lease
    /// and so vouches for nothing (treated like a lapsed lease).
    pub(crate) fn lease_for(&self, e: u64, now: Duration) -> Option<Duration> {
        Some(self.lease_end(e)).filter(|end| now < *end)
    }
}

/// The unit tests, and the times the transition machine's tests use too.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const E: u64 = 100;

    /// I = 1 s, S = 50 ms, lease margin 20 ms, drain timeout 300 ms.
    pub(crate) fn timing() -> Timing {
        Timing {
            interval: 1000 * MS,
            skew: 50 * MS,
            lease_margin: 20 * MS,
            drain_timeout: 300 * MS,
        }
    }

    /// Where epoch `e` begins under [`timing`]: `(e - 1)` seconds.
    pub(crate) fn start(e: u64) -> Duration {
        Duration::from_secs(e - 1)
    }

    #[test]
    fn timing_follows_the_design() {
        let t = timing();
        assert_eq!(t.s_allow(), 170 * MS); // 2S + margin + 50 ms
        assert_eq!(t.deadline(E), start(E) + 500 * MS + 300 * MS + 170 * MS);
        assert_eq!(t.lease_end(E), start(E) + 1520 * MS);
        assert_eq!(t.drain_end(E, start(E) + 100 * MS), start(E) + 400 * MS);
        assert_eq!(t.drain_end(E, start(E) + 900 * MS), start(E) + 800 * MS);
    }

    #[test]
    fn times_hold_at_todays_epochs_with_short_intervals() {
        // At 100 ms the epoch number is about 1.8e10, past u32::MAX.
        let t = Timing {
            interval: 100 * MS,
            skew: 5 * MS,
            lease_margin: 5 * MS,
            drain_timeout: 20 * MS,
        };
        let e = 17_953_000_000u64;
        let start = Duration::from_millis(100 * (e - 1));
        assert_eq!(t.deadline(e), start + 50 * MS + 20 * MS + 65 * MS);
        assert_eq!(t.lease_end(e), start + 155 * MS);
        assert_eq!(t.drain_end(e, start + 10 * MS), start + 30 * MS);
    }

    #[test]
    fn a_lease_is_granted_only_before_its_end() {
        let t = timing();
        let end = t.lease_end(E);
        assert_eq!(t.lease_for(E, start(E) + 100 * MS), Some(end));
        assert_eq!(t.lease_for(E, end - Duration::from_nanos(1)), Some(end));
        assert_eq!(t.lease_for(E, end), None, "arrived after its lease");
        assert_eq!(t.lease_for(E, end + 1000 * MS), None);
    }

    #[test]
    fn epochs_and_their_starts_agree() {
        let i = 1000 * MS;
        assert_eq!(epoch_start(i, 1), Duration::ZERO);
        assert_eq!(
            epoch_start(i, 0),
            Duration::ZERO,
            "no epoch before the first"
        );
        assert_eq!(epoch_start(i, 42), Duration::from_secs(41));
        assert_eq!(epoch_at(i, Duration::from_secs(41)), 42);
        assert_eq!(epoch_at(i, Duration::from_millis(41_999)), 42);
        let e = 17_953_000_000u64;
        let i = 100 * MS;
        assert_eq!(epoch_at(i, epoch_start(i, e)), e);
        assert_eq!(
            epoch_at(i, epoch_start(i, e) - Duration::from_nanos(1)),
            e - 1
        );
        assert_eq!(from_nanos(u128::MAX).as_secs(), u64::MAX, "saturates");
    }
}
