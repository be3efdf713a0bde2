//! The consumer runtime's sign of life, which the rounds' thread checks
//! before it claims an index.
//!
//! The rounds run on a thread of their own ([`super::thread`]) so that a
//! busy runtime cannot delay them. The other side of that: a runtime that
//! stopped (a process frozen but for that thread, a deadlock, a task that
//! never yields) would still be counted each round, and keep its
//! partitions while running none of them. So the consumer's runtime beats
//! a few times per interval, and a round whose runtime has not beaten for
//! a whole interval writes nothing: the instance drops out of the service
//! like a frozen process, and its partitions move on. A busy runtime beats
//! late by milliseconds, far inside an interval. (A Kafka consumer's
//! heartbeat thread has `max.poll.interval.ms` for the same reason.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When the consumer's runtime last showed it runs.
#[derive(Debug)]
pub(crate) struct Liveness {
    since: Instant,
    /// Nanoseconds from `since` to the last beat.
    last: AtomicU64,
}

impl Liveness {
    /// Beaten now.
    pub(crate) fn new() -> Arc<Liveness> {
        Arc::new(Liveness {
            since: Instant::now(),
            last: AtomicU64::new(0),
        })
    }

    /// The runtime runs.
    pub(crate) fn beat(&self) {
        let nanos = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(nanos, Ordering::Relaxed);
    }

    /// How long since the last beat.
    pub(crate) fn silent_for(&self) -> Duration {
        let last = Duration::from_nanos(self.last.load(Ordering::Relaxed));
        self.since.elapsed().saturating_sub(last)
    }

    /// Beats every `period`, on the runtime that runs this, until dropped.
    pub(crate) async fn beat_every(self: Arc<Self>, period: Duration) {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.beat();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn silence_grows_until_the_next_beat() {
        let liveness = Liveness::new();
        std::thread::sleep(Duration::from_millis(30));
        assert!(liveness.silent_for() >= Duration::from_millis(30));
        liveness.beat();
        assert!(liveness.silent_for() < Duration::from_millis(30));
        let beating = tokio::spawn(liveness.clone().beat_every(Duration::from_millis(5)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(liveness.silent_for() < Duration::from_millis(30));
        beating.abort();
    }
}
