//! Which missing task records the retention explains. Each partition of
//! the unordered service keeps its newest [`KEEP_RECORDS`] final records
//! (docs/design.md §14): a record read after the run may be gone, but only
//! if that many tasks of its partition ended after it. When the service
//! falls behind, the tasks enqueued before a cancel end minutes after it,
//! so a record the cancel made final is the first to go.
//!
//! The history times a task's end by its last effect (its ack comes
//! after), a poison task's by its last start at the last attempt (its dead
//! letter comes after) and a cancel by its answer, so the count of later
//! ends is a count of tasks that certainly ended later in Redis, give or
//! take those whose effect came just before the end being judged.

use std::collections::HashMap;

use super::History;
use crate::plan::{KEEP_RECORDS, Kind};
use crate::produce::CANCEL_AFTER;

const CANCEL_AFTER_US: u64 = CANCEL_AFTER.as_micros() as u64;

/// The ends of each partition's tasks, in time order.
pub(super) struct Ended {
    by_partition: HashMap<u32, Vec<u64>>,
    /// Each task with an end: its partition and when it ended.
    of_task: HashMap<u64, (u32, u64)>,
}

impl Ended {
    /// Every end the history shows on the unordered service.
    pub(super) fn of(h: &History) -> Ended {
        let mut of_task: HashMap<u64, (u32, u64)> = HashMap::new();
        let mut end = |n: u64, partition: u32, at: u64| {
            let e = of_task.entry(n).or_insert((partition, at));
            if at >= e.1 {
                *e = (partition, at);
            }
        };
        for (&n, effects) in &h.effects {
            for e in effects.iter().filter(|e| !e.run.ordered) {
                end(n, e.run.partition, e.run.at);
            }
        }
        for (&n, &(partition, at)) in &h.last_attempts {
            if h.enqueued.get(&n).is_some_and(|(_, k)| *k == Kind::Poison) {
                end(n, partition, at);
            }
        }
        for (&n, &at) in &h.cancelled_at {
            // A history without the cancels' times: the earliest a cancel
            // is sent, its enqueue and the producer's wait before it.
            let at = match at {
                0 => h.enqueued.get(&n).map(|(at, _)| at + CANCEL_AFTER_US),
                at => Some(at),
            };
            if let (Some(&partition), Some(at)) = (h.handles.get(&n), at) {
                end(n, partition, at);
            }
        }
        let mut by_partition: HashMap<u32, Vec<u64>> = HashMap::new();
        for &(partition, at) in of_task.values() {
            by_partition.entry(partition).or_default().push(at);
        }
        for ends in by_partition.values_mut() {
            ends.sort_unstable();
        }
        Ended {
            by_partition,
            of_task,
        }
    }

    /// Whether task `n`'s record may have been evicted: at least
    /// [`KEEP_RECORDS`] tasks of its partition ended after it.
    pub(super) fn evictable(&self, n: u64) -> bool {
        let Some(&(partition, at)) = self.of_task.get(&n) else {
            return false;
        };
        let ends = &self.by_partition[&partition];
        let later = ends.len() - ends.partition_point(|&e| e <= at);
        later >= KEEP_RECORDS as usize
    }
}
