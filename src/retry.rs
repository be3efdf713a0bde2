//! How long a failed task waits before its next attempt (docs/design.md §6):
//! exponential backoff with jitter; and `until_ok`, the loop that retries
//! a Redis call with it while Redis cannot be reached.
//!
//! Attempt `n` (from 1) that failed waits a random time in
//! `[d/2, d]` with `d = min(max, base * 2^(n-1))`: the delays grow, and
//! tasks that failed together (an outage of what they call) do not all
//! come back in the same instant. A handler error can override it
//! ([`HandlerError::retry_after`](crate::HandlerError::retry_after)).

use std::future::Future;
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
    pub const fn exponential(base: Duration, max: Duration) -> Self {
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

/// Runs `attempt` until it succeeds, fails with an error that retrying
/// cannot fix ([`Error::is_transient`]), or `stop` resolves while it waits.
/// After the `n`-th transient failure it waits `backoff.delay(n)`, and tells
/// `failed` the error and the wait first, to log it once per step.
///
/// `Ok(None)`: stopped. `stop` is only watched between attempts: an attempt
/// underway is never cut short, so its side effects are whole and its
/// error, if final, is the one returned.
pub(crate) async fn until_ok<T, Fut>(
    backoff: Backoff,
    stop: impl Future<Output = ()>,
    mut attempt: impl FnMut() -> Fut,
    mut failed: impl FnMut(&Error, Duration),
) -> Result<Option<T>>
where
    Fut: Future<Output = Result<T>>,
{
    tokio::pin!(stop);
    let mut failures = 0u32;
    loop {
        match attempt().await {
            Ok(value) => return Ok(Some(value)),
            Err(e) if e.is_transient() => {
                failures = failures.saturating_add(1);
                let wait = backoff.delay(failures);
                failed(&e, wait);
                tokio::select! {
                    biased;
                    _ = &mut stop => return Ok(None),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            Err(e) => return Err(e),
        }
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

    fn refused() -> Error {
        Error::Redis(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
    }

    #[tokio::test]
    async fn until_ok_retries_transient_failures_with_growing_waits() {
        let backoff = Backoff::exponential(2 * MS, 100 * MS);
        let mut calls = 0;
        let mut waits = Vec::new();
        let got = until_ok(
            backoff,
            std::future::pending(),
            || {
                calls += 1;
                let n = calls;
                async move { if n < 4 { Err(refused()) } else { Ok(n) } }
            },
            |e, wait| {
                assert!(e.is_transient());
                waits.push(wait);
            },
        )
        .await
        .unwrap();
        assert_eq!(got, Some(4));
        assert_eq!(waits.len(), 3, "one report per failure");
        for (n, wait) in waits.iter().enumerate() {
            let full = 2 * MS * (1 << n);
            assert!(*wait >= full / 2 && *wait <= full, "step {n}: {wait:?}");
        }
    }

    #[tokio::test]
    async fn until_ok_returns_a_final_error_at_once() {
        let mut calls = 0;
        let err = until_ok(
            Backoff::default(),
            std::future::pending(),
            || {
                calls += 1;
                async { Err::<(), _>(Error::invalid("allow_eviction", "refused")) }
            },
            |e, _| panic!("a final error was retried: {e}"),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::InvalidSetting { .. }), "{err}");
        assert_eq!(calls, 1);
    }

    #[tokio::test]
    async fn until_ok_stops_while_waiting_but_finishes_the_attempt_first() {
        let mut calls = 0;
        let started = std::time::Instant::now();
        // Already resolved: the first attempt still runs, the wait after
        // its failure does not.
        let got = until_ok(
            Backoff::exponential(Duration::from_secs(60), Duration::from_secs(60)),
            async {},
            || {
                calls += 1;
                async { Err::<(), _>(refused()) }
            },
            |_, _| {},
        )
        .await
        .unwrap();
        assert_eq!(got, None);
        assert_eq!(calls, 1);
        assert!(started.elapsed() < Duration::from_secs(5));
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
