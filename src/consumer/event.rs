//! What an instance publishes about its partitions, for status displays,
//! tests and measurements of the handover pauses.

use std::time::SystemTime;

/// One change in the partitions an instance works on; see
/// [`ConsumerBuilder::partition_events`](super::ConsumerBuilder::partition_events).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionEvent {
    /// The partition, within its generation (docs/design.md §21).
    pub partition: u32,
    /// The generation of the service's partitions it belongs to: 0 until
    /// the service is first resharded.
    pub generation: u32,
    /// When it happened, by the system clock.
    pub at: SystemTime,
    /// What happened.
    pub change: PartitionChange,
}

/// What happened to a partition on an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionChange {
    /// Acquired: the owner record holds this instance with `token`, and
    /// fetching starts.
    Started {
        /// The fencing token (the epoch it was acquired in).
        token: u64,
    },
    /// Fetching stopped: released to a new owner, fenced, or leaving.
    /// Running tasks finish until the drain timeout.
    Stopped,
    /// The last task of the partition ended (finished or interrupted), and
    /// what finished is acked. The release mark, if any, follows.
    Drained,
}
