//! Ordered or concurrent partitions: the one place that knows how they
//! differ. The fetch loop and the run and settle steps ask [`Order`] what
//! to do, rather than testing a flag.
//!
//! Ordered partitions (docs/design.md §5.4) run one task at a time in
//! stream order, so tasks with one key run in enqueue order. A task stays
//! in its place until it is done: it is retried in place, and what is left
//! unfinished stays pending for the partition's next owner to run first.
//! Because the entry is never rewritten, its attempt number lives in Redis,
//! as the entry's delivery count, and its failure count in the partition's
//! `{N/p}:failures` hash.

/// How a partition's tasks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Up to the instance's concurrency at once, in any order.
    Concurrent,
    /// One at a time, in stream order.
    Ordered,
}

/// What becomes of an entry a worker does not finish: not started when its
/// partition was released, interrupted, or left without a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unfinished {
    /// Acked and added again at the end of the stream (with `attempt + 1`
    /// if it ran), so the partition's next owner runs it.
    EnqueueAgain,
    /// Left pending in place: the next owner (or this worker's next read
    /// of its pending list) runs it before anything after it.
    LeavePending,
}

impl Order {
    /// The service-wide `ordered` setting.
    pub(crate) fn of(ordered: bool) -> Order {
        if ordered {
            Order::Ordered
        } else {
            Order::Concurrent
        }
    }

    /// Whether the partition runs one task at a time: a read takes one
    /// entry, the next read waits until its task is done, claimed entries
    /// are run from this instance's pending list (in order, before anything
    /// new), and nothing new is read until the first claim went through
    /// (what others still hold comes first).
    pub(crate) fn one_at_a_time(self) -> bool {
        self == Order::Ordered
    }

    /// How many entries a read takes when the instance has room for `room`
    /// more tasks and reads at most `batch`.
    pub(crate) fn read_count(self, room: usize, batch: usize) -> usize {
        match self {
            Order::Concurrent => room.clamp(1, batch),
            Order::Ordered => 1,
        }
    }

    /// Whether an entry's attempt number is kept in Redis as its delivery
    /// count (and its failure count beside it): claims take ids only (they
    /// must not add to the count), a redelivered entry runs with the count
    /// if it is higher, each attempt after the first is recorded as it
    /// starts, each failure before its backoff, and an entry released
    /// before it started gives its read's delivery back.
    pub(crate) fn attempts_in_redis(self) -> bool {
        self == Order::Ordered
    }

    /// What becomes of an entry this worker does not finish.
    pub(crate) fn unfinished(self) -> Unfinished {
        match self {
            Order::Concurrent => Unfinished::EnqueueAgain,
            Order::Ordered => Unfinished::LeavePending,
        }
    }

    /// Whether a failed task waits out its backoff in place, blocking the
    /// partition (else it is enqueued again, delayed, and the partition
    /// moves on).
    pub(crate) fn retries_in_place(self) -> bool {
        self == Order::Ordered
    }
}
