//! The handover's effects, as the state machine ([`crate::transition`])
//! gives them: start a worker (rule 3), release one (drain, then cancel:
//! rule 1), write a release mark (rule 2); and what each tells the
//! partition events and the metrics.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::{Instrument, debug};

use super::Handover;
use crate::consumer::event::{PartitionChange, PartitionEvent};
use crate::consumer::store::PartitionStore;
use crate::consumer::worker::Worker;
use crate::marks::{self, Mark};
use crate::metrics as m;
use crate::timing;
use crate::transition::Effect;

impl Handover {
    /// Carries out the state machine's effects, in order, and tells the
    /// gauges how many partitions the instance owns now.
    pub(super) fn apply(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Start { partition, token } => self.start(partition, token),
                Effect::Drain {
                    partition,
                    cancel_at,
                } => self.release(partition, cancel_at),
                Effect::Mark { partition, epoch } => self.mark(partition, epoch),
            }
        }
        metrics::gauge!(m::OWNED_PARTITIONS, "service" => self.shared.name.to_string())
            .set(self.workers.len() as f64);
        self.shared.metrics.owned(self.workers.len());
        self.poll_marks();
    }

    /// Rule 3: acquire `p` with `token` and start fetching it.
    fn start(&mut self, p: u32, token: u64) {
        let assignment = self
            .assignment
            .as_ref()
            .expect("partitions start only after an assignment")
            .subscribe();
        let shared = &self.shared;
        let store = PartitionStore::new(
            shared.conn.clone(),
            &shared.name,
            p,
            token,
            &shared.id,
            shared.settings.max_entry_bytes,
        );
        let worker = Worker::start(shared.clone(), store, assignment, self.lease.clone());
        self.measure_pause(p, token);
        debug!(partition = p, token, "partition started");
        self.workers.insert(p, worker);
        self.publish(p, PartitionChange::Started { token });
    }

    /// Records how long partition `p`, acquired in epoch `token`, paused:
    /// since its release mark was written, or, when the acquire waited for
    /// its deadline, since its epoch began.
    fn measure_pause(&self, p: u32, token: u64) {
        let since = match self.marks_read.get(&p) {
            Some(Mark {
                epoch,
                at_ms: Some(at),
            }) if *epoch >= token => Duration::from_millis(*at),
            _ => timing::epoch_start(self.timing.interval, token),
        };
        let paused = self.lease.now().saturating_sub(since);
        self.pause.record(paused.as_secs_f64());
    }

    /// Rule 1: stop fetching `p`, let its tasks run until `cancel_at` (the
    /// instance's wall clock), then cancel them; report when drained.
    fn release(&mut self, p: u32, cancel_at: Duration) {
        let left = cancel_at.saturating_sub(self.lease.now());
        let deadline = Instant::now() + left;
        let worker = self.workers.remove(&p);
        if let Some(worker) = &worker {
            // Now, not when the drain task first runs: tasks fetched from
            // here on are handed back, and none sees the next assignment.
            worker.ownership().release(deadline);
            self.draining.insert(p, worker.ownership().clone());
        }
        let drain = async move {
            if let Some(worker) = worker {
                worker.release(deadline).await;
            }
            p
        };
        let handle = self.drains.spawn(drain.in_current_span());
        self.drain_ids.insert(handle.id(), p);
        debug!(partition = p, cancel_in = ?left, "partition released; draining");
        self.publish(p, PartitionChange::Stopped);
    }

    /// Rule 2: mark(p) := max(mark(p), epoch), retried a few times.
    fn mark(&mut self, p: u32, epoch: u64) {
        let write = marks::mark_retried(
            self.shared.conn.clone(),
            self.shared.name.clone(),
            crate::partition::Shown(p).to_string(),
            epoch,
        );
        self.marks.spawn(write.in_current_span());
    }

    /// Counts a partition's change and tells the partition events' subscribers.
    pub(super) fn publish(&self, partition: u32, change: PartitionChange) {
        let name = match change {
            PartitionChange::Started { .. } => "started",
            PartitionChange::Stopped => "stopped",
            PartitionChange::Drained => "drained",
        };
        metrics::counter!(m::PARTITION_CHANGES_TOTAL, "service" => self.shared.name.to_string(), "change" => name)
            .increment(1);
        let _ = self.events.send(PartitionEvent {
            partition: crate::partition::index_of(partition),
            generation: crate::partition::generation_of(partition),
            at: SystemTime::now(),
            change,
        });
    }
}
