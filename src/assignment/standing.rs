//! Where an instance stands after each of its indexer's rounds: an
//! assignment, or why it holds none. The indexer publishes it; the
//! consumer's handover, its presence record and its health endpoint read
//! it.

use std::fmt;
use std::time::Duration;

use super::Assignment;

/// Where an instance stands after a round.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Standing {
    /// Started, not assigned yet: the first assignment comes one to two
    /// intervals after start.
    Joining,
    /// Assigned for an epoch: the instance may process the partitions its
    /// assignment owns, until the lease of the epoch ends.
    Assigned(Assignment),
    /// No assignment for `epoch`: the instance must not process.
    Fenced {
        /// The epoch the instance holds no assignment for.
        epoch: u64,
        /// Why.
        reason: FenceReason,
    },
    /// A graceful leave finished: the instance was not counted in the round
    /// before `epoch`, so the others have taken its place. The indexer has
    /// stopped.
    Left {
        /// The first epoch without this instance.
        epoch: u64,
    },
}

impl Standing {
    /// The assignment, if the instance holds one.
    pub fn assignment(&self) -> Option<Assignment> {
        match self {
            Standing::Assigned(a) => Some(a.clone()),
            _ => None,
        }
    }
}

/// Why an instance holds no assignment for an epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceReason {
    /// The round woke too far into its interval (the process was paused or
    /// starved) and skipped its write, so it counts as missed.
    LateRound {
        /// How far into the interval it woke.
        into: Duration,
    },
    /// The round's Redis commands failed or did not answer in time.
    RoundFailed {
        /// The error, as text.
        error: String,
    },
    /// The instance was not counted in the previous round (it missed it or
    /// was fenced), so it has no index for this epoch. It is counted again
    /// in this round and assigned from the next.
    NotCounted,
    /// The instance's clock is off Redis's clock by more than the tolerated
    /// skew; it writes no rounds until it is back within.
    ClockSkew {
        /// This instance's clock minus Redis's, in microseconds.
        offset_us: i64,
        /// The tolerated skew.
        tolerated: Duration,
    },
    /// Redis returned counts that break `1 <= index <= replicas` (a round key
    /// was changed or lost); the instance does not trust them.
    Inconsistent {
        /// The index the instance held.
        index: u64,
        /// The count it read.
        replicas: u64,
    },
}

impl fmt::Display for FenceReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceReason::LateRound { into } => {
                write!(
                    f,
                    "round woke {into:?} into its interval, too late to write"
                )
            }
            FenceReason::RoundFailed { error } => write!(f, "round failed: {error}"),
            FenceReason::NotCounted => f.write_str("not counted in the previous round"),
            FenceReason::ClockSkew {
                offset_us,
                tolerated,
            } => write!(
                f,
                "clock is {:.1} ms off redis TIME, beyond the tolerated skew of {tolerated:?}",
                *offset_us as f64 / 1000.0
            ),
            FenceReason::Inconsistent { index, replicas } => {
                write!(f, "inconsistent round: index {index} of {replicas}")
            }
        }
    }
}
