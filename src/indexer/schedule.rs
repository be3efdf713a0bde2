//! When rounds run and which number they use: the pure arithmetic of
//! docs/design.md §2, kept apart from I/O so it can be tested exhaustively.
//! Epochs and their starts are [`crate::timing`]'s, shared with the
//! handover rules.

use std::time::Duration;

use crate::timing;

/// The slack, beyond twice the skew, that a round keeps before the end of
/// its interval: timer lateness plus the round's own latency.
const LATE_SLACK: Duration = Duration::from_millis(50);

/// The share of the interval that a round keeps between its offset and its
/// late end, for the timer waking it late and the machine being busy.
const WAKE_ROOM: u32 = 10;

/// One instance's round schedule: round `n` runs at local time `I * n + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Schedule {
    interval: Duration,
    offset: Duration,
    late_end: Duration,
    skew: Duration,
}

/// What a round that wakes at some local time may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Write, and finish before `deadline` (local time), or count as missed.
    OnTime {
        /// The round number (the key it writes, the epoch it emits).
        number: u64,
        /// The local time by which the round's reply must be in.
        deadline: Duration,
    },
    /// Too far into the interval: the write could land after the others
    /// read the count. The round counts as missed.
    Late {
        /// The round number.
        number: u64,
        /// How far into its interval the round woke.
        into: Duration,
    },
}

impl Schedule {
    /// A schedule with interval `interval`, tolerated skew `skew` and this
    /// instance's constant `offset` (below `interval / 2`).
    pub(crate) fn new(interval: Duration, skew: Duration, offset: Duration) -> Self {
        debug_assert!(offset < interval / 2);
        Schedule {
            interval,
            offset,
            late_end: late_end(interval, skew),
            skew,
        }
    }

    /// A schedule whose offset is drawn at `draw` (in `[0, 1)`) of the way
    /// through the offsets this interval and skew allow: below `I/2`, and
    /// at least `I/10` before the late end. With late end `I/2` (short
    /// intervals, large skew), an offset just below `I/2` would wake a few
    /// milliseconds late every round, past the late end, and the instance
    /// would never be assigned at all.
    pub(crate) fn drawn(interval: Duration, skew: Duration, draw: f64) -> Self {
        let bound = (interval / 2).min(late_end(interval, skew) - interval / WAKE_ROOM);
        let offset = bound.mul_f64(draw.clamp(0.0, 1.0));
        Schedule::new(interval, skew, offset.min(bound - Duration::from_nanos(1)))
    }

    /// The local time at which round `n` runs: `offset` into the interval
    /// of epoch `n + 1`, `I * n + offset`.
    pub(crate) fn round_time(&self, n: u64) -> Duration {
        timing::epoch_start(self.interval, n.saturating_add(1)).saturating_add(self.offset)
    }

    /// The round number of round `n`, from its scheduled time, never from a
    /// fresh clock read: `floor((I * n + offset) / I) + 1`, which is `n + 1`.
    pub(crate) fn number(&self, n: u64) -> u64 {
        timing::epoch_at(self.interval, self.round_time(n))
    }

    /// The first round whose scheduled time is at or after `now`.
    pub(crate) fn first_round_from(&self, now: Duration) -> u64 {
        let i = self.interval.as_nanos();
        let since = now.saturating_sub(self.offset).as_nanos();
        u64::try_from(since.div_ceil(i)).unwrap_or(u64::MAX)
    }

    /// The round after round `n` finished at `now`: `n + 1`, or later when
    /// the process fell behind. Of the rounds it fell behind on, only the
    /// newest is still run, and only if it can still write in its window;
    /// the others are skipped, so no key is written twice and none late.
    pub(crate) fn next_round(&self, n: u64, now: Duration) -> u64 {
        let upcoming = self.first_round_from(now);
        let overdue = upcoming.saturating_sub(1);
        if overdue > n && matches!(self.plan(overdue, now), Plan::OnTime { .. }) {
            overdue
        } else {
            upcoming.max(n + 1)
        }
    }

    /// What round `n` may do when it wakes at local time `now`.
    pub(crate) fn plan(&self, n: u64, now: Duration) -> Plan {
        let number = self.number(n);
        let start = self.interval_start(number);
        let into = now.saturating_sub(start);
        if into >= self.late_end {
            Plan::Late { number, into }
        } else {
            // The reply may come up to `skew` after the window: Redis itself
            // refuses a write that reaches it after `late_end + S` (its
            // clock), so a reply in time means the write landed in time.
            // Without this, an offset just below I/2 (when late_end is I/2)
            // would leave the round no time at all.
            Plan::OnTime {
                number,
                deadline: start + self.late_end + self.skew,
            }
        }
    }

    /// Where the interval of round `number` begins: `(number - 1) * I`.
    pub(crate) fn interval_start(&self, number: u64) -> Duration {
        timing::epoch_start(self.interval, number)
    }

    /// This instance's constant offset within each interval.
    pub(crate) fn offset(&self) -> Duration {
        self.offset
    }

    /// How long into its interval a round may still write.
    pub(crate) fn late_end(&self) -> Duration {
        self.late_end
    }
}

/// How far into its interval a round may still write (docs/design.md §2):
/// `max(I/2, I - 2S - 50 ms)`, always at least `I/2`.
fn late_end(interval: Duration, skew: Duration) -> Duration {
    (interval / 2).max(interval.saturating_sub(2 * skew + LATE_SLACK))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn late_end_is_the_larger_of_half_and_interval_minus_skew() {
        let s = Schedule::new(1000 * MS, 100 * MS, Duration::ZERO);
        assert_eq!(s.late_end(), 750 * MS); // 1000 - 200 - 50
        let s = Schedule::new(1000 * MS, 240 * MS, Duration::ZERO);
        assert_eq!(s.late_end(), 500 * MS); // max(500, 470)
    }

    #[test]
    fn example_round() {
        let s = Schedule::new(1000 * MS, 50 * MS, 300 * MS);
        let now = Duration::from_millis(41_100);
        let n = s.first_round_from(now);
        assert_eq!(n, 41);
        assert_eq!(s.round_time(n), Duration::from_millis(41_300));
        assert_eq!(s.number(n), 42);
        assert_eq!(s.interval_start(42), Duration::from_secs(41));
        assert_eq!(
            s.plan(n, Duration::from_millis(41_301)),
            Plan::OnTime {
                number: 42,
                deadline: Duration::from_millis(41_900)
            }
        );
        assert_eq!(
            s.plan(n, Duration::from_millis(41_900)),
            Plan::Late {
                number: 42,
                into: Duration::from_millis(900)
            }
        );
        // Woken 2.5 intervals late: the rounds in between are skipped, and
        // the newest overdue one is too late to write in its window.
        assert_eq!(s.next_round(n, Duration::from_millis(43_900)), 44);
        // Woken 2.4 intervals late: the newest overdue round (43, at
        // 43.3 s) can still write before 43.85 s, so it runs at once.
        assert_eq!(s.next_round(n, Duration::from_millis(43_400)), 43);
        assert_eq!(s.next_round(n, Duration::from_millis(41_400)), 42);
    }

    proptest! {
        /// `number` is the seed's `floor((I n + offset) / I) + 1 = n + 1` for
        /// every offset in `[0, I/2)`, including 0 where `ceil(now / I)`
        /// would name the previous interval's key.
        #[test]
        fn number_is_n_plus_one(i_ms in 100u64..10_000, off_frac in 0.0f64..0.5, n in 0u64..10_000_000_000) {
            let i = Duration::from_millis(i_ms);
            let off = i.mul_f64(off_frac).min(i / 2 - Duration::from_nanos(1));
            let s = Schedule::new(i, Duration::ZERO, off);
            prop_assert_eq!(s.number(n), n + 1);
        }

        /// The first round from `now` is the earliest one scheduled at or
        /// after `now`.
        #[test]
        fn first_round_is_the_next_scheduled(i_ms in 100u64..10_000, off_frac in 0.0f64..0.5, now_ms in 0u64..4_000_000_000_000) {
            let i = Duration::from_millis(i_ms);
            let off = i.mul_f64(off_frac).min(i / 2 - Duration::from_nanos(1));
            let s = Schedule::new(i, Duration::ZERO, off);
            let now = Duration::from_millis(now_ms);
            let n = s.first_round_from(now);
            prop_assert!(s.round_time(n) >= now);
            prop_assert!(n == 0 || s.round_time(n - 1) < now);
        }

        /// A round that wakes on time, or late by less than the slack the
        /// skew leaves, writes; one woken at or past the late end does not.
        #[test]
        fn rounds_on_time_are_never_skipped(i_ms in 100u64..10_000, s_frac in 0.0f64..0.25, off_frac in 0.0f64..0.5, n in 1u64..1_000_000_000, late_us in 0u64..20_000_000) {
            let i = Duration::from_millis(i_ms);
            let off = i.mul_f64(off_frac).min(i / 2 - Duration::from_nanos(1));
            let s = Schedule::new(i, i.mul_f64(s_frac), off);
            prop_assert!(s.late_end() >= i / 2 && s.late_end() < i);
            let on_time = matches!(s.plan(n, s.round_time(n)), Plan::OnTime { .. });
            prop_assert!(on_time);
            let woke = s.round_time(n) + Duration::from_micros(late_us);
            let into = woke - s.interval_start(s.number(n));
            match s.plan(n, woke) {
                Plan::OnTime { number, deadline } => {
                    prop_assert!(into < s.late_end());
                    prop_assert_eq!(deadline, s.interval_start(number) + s.late_end() + i.mul_f64(s_frac));
                }
                Plan::Late { into: got, .. } => {
                    prop_assert!(into >= s.late_end());
                    prop_assert_eq!(got, into);
                }
            }
            prop_assert!(s.next_round(n, woke) > n);
        }

        /// Whatever offset an instance draws, its round still writes when the
        /// timer wakes it up to `I/10` late: no instance is skipped every
        /// round for an offset too close to the late end.
        #[test]
        fn every_drawn_offset_survives_a_late_wake(i_ms in 100u64..10_000, s_frac in 0.0f64..0.25, draw in 0.0f64..1.0, n in 1u64..1_000_000_000, late_frac in 0.0f64..=0.0999) {
            let i = Duration::from_millis(i_ms);
            let s = Schedule::drawn(i, i.mul_f64(s_frac), draw);
            prop_assert!(s.offset() < i / 2);
            let woke = s.round_time(n) + i.mul_f64(late_frac);
            prop_assert!(matches!(s.plan(n, woke), Plan::OnTime { .. }), "offset {:?}, late end {:?}", s.offset(), s.late_end());
        }

        /// The next round is always later than the last, and it is either
        /// not due yet or due and still able to write; no round between is
        /// both skipped and still able to write.
        #[test]
        fn next_round_skips_only_what_cannot_write(i_ms in 100u64..10_000, s_frac in 0.0f64..0.25, off_frac in 0.0f64..0.5, n in 1u64..1_000_000_000, behind_us in 0u64..50_000_000) {
            let i = Duration::from_millis(i_ms);
            let off = i.mul_f64(off_frac).min(i / 2 - Duration::from_nanos(1));
            let s = Schedule::new(i, i.mul_f64(s_frac), off);
            let now = s.round_time(n) + Duration::from_micros(behind_us);
            let next = s.next_round(n, now);
            prop_assert!(next > n);
            let due = s.round_time(next) <= now;
            let writable = |round| matches!(s.plan(round, now), Plan::OnTime { .. });
            prop_assert!(!due || writable(next), "due round {} cannot write", next);
            for skipped in n + 1..next {
                prop_assert!(!writable(skipped), "round {} skipped while writable", skipped);
            }
        }
    }
}
