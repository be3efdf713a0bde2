//! What the machine keeps per partition ([`State`]) and what it tells the
//! runtime to do ([`Effect`]).

use std::time::Duration;

/// Where one partition stands on this instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Not this instance's, nothing pending.
    Idle,
    /// Rule 3: owned from `epoch` on, waiting for mark(p) >= `epoch` or the
    /// `deadline` (local) before fetching.
    Acquiring { epoch: u64, deadline: Duration },
    /// Fetching. `token` is the epoch it was acquired in (the fencing
    /// token); `epoch` the newest assignment that owns it.
    Owned { token: u64, epoch: u64 },
    /// Rule 1: released for `epoch`; running tasks finish until `until`
    /// (then are cancelled); once drained, mark(p) := `epoch` if `mark`.
    /// `then`: an acquire that must wait for this drain (the partition came
    /// back before its drain ended).
    Draining {
        epoch: u64,
        until: Duration,
        mark: bool,
        then: Option<(u64, Duration)>,
    },
    /// Rule 4: an acquire for `epoch` made moot by the assignment of
    /// `new_epoch`; it keeps waiting for its own condition, then marks
    /// `new_epoch` (marking at once would let the next owner in while the
    /// real old owner still drains). `then`: an acquire that waits for it
    /// (the partition came back meanwhile).
    Moot {
        epoch: u64,
        deadline: Duration,
        new_epoch: u64,
        then: Option<(u64, Duration)>,
    },
}

impl State {
    /// The same drain or moot wait, with `then` as the acquire waiting for
    /// it; other states are returned as they are.
    pub(super) fn with_then(self, then: Option<(u64, Duration)>) -> State {
        match self {
            State::Draining {
                epoch, until, mark, ..
            } => State::Draining {
                epoch,
                until,
                mark,
                then,
            },
            State::Moot {
                epoch,
                deadline,
                new_epoch,
                ..
            } => State::Moot {
                epoch,
                deadline,
                new_epoch,
                then,
            },
            other => other,
        }
    }
}

/// What the runtime must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Record this instance as owner with `token`, claim the partition's
    /// pending entries, start fetching.
    Start { partition: u32, token: u64 },
    /// Stop fetching; let running tasks finish until `cancel_at`, then
    /// cancel them and wait; report [`Partitions::drained`].
    Drain { partition: u32, cancel_at: Duration },
    /// mark(p) := max(mark(p), `epoch`) in `{N}:transition`.
    Mark { partition: u32, epoch: u64 },
}
