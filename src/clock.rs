//! The wall clock, behind a trait so tests can give instances skewed clocks.
//!
//! The peer indexer schedules its rounds by the wall clock of its instance
//! (docs/design.md §2): skew between instances is part of the protocol's model, so
//! the tests must be able to produce it. Waiting is still done with tokio's
//! timer, for the duration the clock says is left.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time as this instance sees it, since the Unix epoch.
    fn now(&self) -> Duration;
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
    }
}

/// The system clock shifted by a constant: a clock that runs ahead or behind,
/// as a misconfigured machine's would.
#[derive(Debug, Clone, Copy)]
pub struct OffsetClock {
    ahead: bool,
    by: Duration,
}

impl OffsetClock {
    /// A clock `by` ahead of the system clock.
    pub fn ahead(by: Duration) -> Self {
        OffsetClock { ahead: true, by }
    }

    /// A clock `by` behind the system clock.
    pub fn behind(by: Duration) -> Self {
        OffsetClock { ahead: false, by }
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> Duration {
        let now = SystemClock.now();
        if self.ahead {
            now + self.by
        } else {
            now.saturating_sub(self.by)
        }
    }
}

/// Signed difference `a - b` in seconds, for logs and metrics.
pub(crate) fn signed_secs(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() - b.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_clocks_are_shifted() {
        let d = Duration::from_secs(5);
        let base = SystemClock.now();
        let ahead = OffsetClock::ahead(d).now();
        let behind = OffsetClock::behind(d).now();
        assert!(ahead >= base + d && ahead < base + d + Duration::from_secs(1));
        assert!(behind + d >= base && behind + d < base + Duration::from_secs(1));
    }
}
