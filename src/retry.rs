//! How long a failed task waits before its next attempt (DESIGN.md §6):
//! exponential backoff with jitter.
//!
//! Attempt `n` (from 1) that failed waits a random time in
//! `[d/2, d]` with `d = min(max, base * 2^(n-1))`: the delays grow, and
//! tasks that failed together (an outage of what they call) do not all
//! come back in the same instant. A handler error can override it
//! ([`HandlerError::retry_after`](crate::HandlerError::retry_after)).

use std::time::Duration;

use crate::error::{Error, Result};

/// Exponential backoff with jitter between a task's attempts.
///
/// ```
/// use std::time::Duration;
/// use peerq::retry::Backoff;
///
/// let backoff = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(300));
/// let third = backoff.delay(3);
/// assert!(third >= Duration::from_secs(2) && third <= Duration::from_secs(4));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

impl Default for Backoff {
    /// 1 s, doubling, at most 5 min.
    fn default() -> Self {
        Backoff::exponential(Duration::from_secs(1), Duration::from_secs(300))
    }
}

impl Backoff {
    /// `base` after the first failure, doubling after each, at most `max`.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        Backoff { base, max }
    }

    /// The delay after attempt `attempt` (from 1) failed.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, rand::random::<f64>())
    }

    /// The same, with `unit` in `[0, 1)` as the random draw.
    fn delay_with(&self, attempt: u32, unit: f64) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        let full = self
            .base
            .checked_mul(1u32 << doublings.min(31))
            .unwrap_or(self.max)
            .min(self.max);
        full.mul_f64(0.5 + unit.clamp(0.0, 1.0) / 2.0)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.base.is_zero() || self.base > self.max {
            return Err(Error::invalid(
                "backoff",
                format!(
                    "base {:?} and max {:?}: use a base above 0 and at most max",
                    self.base, self.max
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn delays_double_within_their_jitter_up_to_the_max() {
        let b = Backoff::exponential(100 * MS, 1000 * MS);
        assert_eq!(b.delay_with(1, 0.0), 50 * MS);
        assert_eq!(b.delay_with(1, 1.0), 100 * MS);
        assert_eq!(b.delay_with(3, 1.0), 400 * MS);
        assert_eq!(b.delay_with(10, 1.0), 1000 * MS, "capped");
        assert_eq!(b.delay_with(u32::MAX, 0.0), 500 * MS, "no overflow");
    }

    proptest! {
        #[test]
        fn below_the_cap_a_later_attempt_never_waits_less(
            attempt in 1u32..40, a in 0.0f64..1.0, b in 0.0f64..1.0,
        ) {
            let max = 60_000 * MS;
            let backoff = Backoff::exponential(10 * MS, max);
            let now = backoff.delay_with(attempt, a);
            let next = backoff.delay_with(attempt + 1, b);
            prop_assert!(now >= 5 * MS && now <= max);
            // [d, 2d] starts where [d/2, d] ends.
            if backoff.delay_with(attempt + 1, 1.0) < max {
                prop_assert!(next >= now, "{next:?} < {now:?}");
            }
        }
    }
}
