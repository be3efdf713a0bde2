//! How long a failed task waits before its next attempt (docs/design.md §6):
//! exponential backoff with jitter; `until_ok`, the loop that retries
//! a Redis call with it while Redis cannot be reached; and `Pauses`, the
//! waits of the runtime's own retry loops (acks, marks, triggers, fetches).
//!
//! The task's `n`-th failure (from 1) waits a random time in
//! `[d/2, d]` with `d = min(max, base * 2^(n-1))`: the delays grow, and
//! tasks that failed together (an outage of what they call) do not all
//! come back in the same instant. A handler error can override it
//! ([`HandlerError::retry_after`](crate::handler::HandlerError::retry_after)).
//! Runs that were interrupted (a drain, a lapsed lease) are no failures
//! and do not lengthen it.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result, Transient};

/// Exponential backoff with jitter between a task's attempts.
///
/// ```
/// use std::time::Duration;
/// use peerq::Backoff;
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

    /// The delay after the task's `failures`-th failure (from 1; without
    /// interrupted runs, the attempt that failed).
    pub fn delay(&self, failures: u32) -> Duration {
        self.delay_with(failures, rand::random::<f64>())
    }

    /// The same, with `unit` in `[0, 1)` as the random draw.
    fn delay_with(&self, attempt: u32, unit: f64) -> Duration {
        self.full(attempt).mul_f64(0.5 + unit.clamp(0.0, 1.0) / 2.0)
    }

    /// The delay after attempt `attempt` failed, before jitter:
    /// `min(max, base * 2^(attempt - 1))`.
    fn full(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        self.base
            .checked_mul(1u32 << doublings.min(31))
            .unwrap_or(self.max)
            .min(self.max)
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

/// The waits between the tries of one of the runtime's retry loops: `first`,
/// doubling after each, at most `max`, without jitter (each loop is one
/// instance's own, so there is no herd to spread). [`reset`](Self::reset)
/// after a success starts again from `first`.
///
/// The loop keeps its own count of attempts, if it has a limit: what
/// counts as an attempt differs (an ack batch that only reloads its script
/// counts one, without a pause).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pauses {
    /// Its doubling, capped: a [`Backoff`]'s delays before jitter.
    backoff: Backoff,
    /// Pauses taken since the start or the last reset.
    taken: u32,
}

impl Pauses {
    /// `first`, doubling after each pause, at most `max` (`Duration::MAX`
    /// for no cap).
    pub(crate) const fn new(first: Duration, max: Duration) -> Self {
        Pauses {
            backoff: Backoff::exponential(first, max),
            taken: 0,
        }
    }

    /// The pause the next [`wait`](Self::wait) or [`take`](Self::take)
    /// takes.
    pub(crate) fn upcoming(&self) -> Duration {
        self.backoff.full(self.taken.saturating_add(1))
    }

    /// The next pause, counted as taken: for a loop that sleeps in its own
    /// way (say, until a stop signal, too).
    pub(crate) fn take(&mut self) -> Duration {
        let pause = self.upcoming();
        self.taken = self.taken.saturating_add(1);
        pause
    }

    /// Sleeps the next pause. It counts as taken once the future is first
    /// polled, so a wait cut short (by a stop signal) still counts.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.take()).await;
    }

    /// Back to `first`: the call succeeded, the next failure is a new one.
    pub(crate) fn reset(&mut self) {
        self.taken = 0;
    }
}

/// Runs `attempt` until it succeeds, fails with an error that retrying
/// cannot fix ([`Transient`]), or `stop` resolves while it waits.
/// After the `n`-th transient failure it waits `backoff.delay(n)`, and tells
/// `failed` the error and the wait first, to log it once per step.
///
/// `Ok(None)`: stopped. `stop` is only watched between attempts: an attempt
/// underway is never cut short, so its side effects are whole and its
/// error, if final, is the one returned.
pub(crate) async fn until_ok<T, E, Fut>(
    backoff: Backoff,
    stop: impl Future<Output = ()>,
    mut attempt: impl FnMut() -> Fut,
    mut failed: impl FnMut(&E, Duration),
) -> Result<Option<T>, E>
where
    E: Transient,
    Fut: Future<Output = Result<T, E>>,
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

    #[test]
    fn pauses_double_up_to_their_cap_and_start_again_after_a_reset() {
        let mut pauses = Pauses::new(50 * MS, 2000 * MS);
        let taken: Vec<Duration> = (0..8).map(|_| pauses.take()).collect();
        let want = [50, 100, 200, 400, 800, 1600, 2000, 2000];
        assert_eq!(taken, want.map(|ms| ms * MS));
        assert_eq!(pauses.upcoming(), 2000 * MS);
        pauses.reset();
        assert_eq!(pauses.upcoming(), 50 * MS);
        assert_eq!(pauses.take(), 50 * MS);
        assert_eq!(pauses.take(), 100 * MS);
    }

    #[test]
    fn pauses_without_a_cap_keep_doubling_and_never_overflow() {
        let mut pauses = Pauses::new(50 * MS, Duration::MAX);
        let taken: Vec<Duration> = (0..5).map(|_| pauses.take()).collect();
        assert_eq!(taken, [50, 100, 200, 400, 800].map(|ms| ms * MS));
        for _ in 0..100 {
            pauses.take();
        }
        assert!(pauses.upcoming() >= 50 * MS * (1 << 31));
    }

    #[tokio::test]
    async fn pauses_sleep_what_they_announce_and_count_a_cut_wait() {
        let mut pauses = Pauses::new(5 * MS, 10 * MS);
        let started = std::time::Instant::now();
        pauses.wait().await;
        pauses.wait().await;
        assert!(started.elapsed() >= 15 * MS, "{:?}", started.elapsed());
        assert_eq!(pauses.upcoming(), 10 * MS);
        // Cut short by a stop signal: still taken.
        let mut pauses = Pauses::new(Duration::from_secs(60), Duration::from_secs(120));
        tokio::select! {
            _ = tokio::time::sleep(MS) => {}
            _ = pauses.wait() => unreachable!("the stop comes first"),
        }
        assert_eq!(pauses.upcoming(), Duration::from_secs(120));
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
