//! The metrics of one instance (names and meanings in [`crate::metrics`]):
//! its tasks, and the sizes of the partitions it owns. Their handles are
//! registered once, when the instance starts, so recording a task
//! allocates no labels; install the metrics recorder before `run()`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use metrics::{Counter, Gauge, Histogram};

use super::store::Sizes;
use crate::config::ServiceName;
use crate::metrics as m;
use crate::presence::{Count, Presence};

/// The handles of one instance's task metrics.
pub(crate) struct TaskMetrics {
    ok: Counter,
    failed: Counter,
    interrupted: Counter,
    cancelled: Counter,
    retried: Counter,
    dead: Counter,
    duration: Histogram,
    wait: Histogram,
    in_flight: Gauge,
    /// The members record's and per-minute counts' live values.
    presence: Arc<Presence>,
}

/// How a handler run ended, for [`TaskMetrics::ended`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    Ok,
    Failed,
    /// Cut off by a drain timeout, a lapsed lease, a fence or a leave at
    /// once (or refused by the handler's fence, `Stale`): no failure.
    Interrupted,
    /// Stopped by a user's cancel (tracked tasks).
    Cancelled,
}

impl TaskMetrics {
    /// The handles for `service`, from the recorder installed now; the
    /// confirmed outcomes and runs in flight also go to `presence`.
    pub(crate) fn new(service: &ServiceName, presence: Arc<Presence>) -> Self {
        let service = service.to_string();
        let outcome = |outcome: &'static str| metrics::counter!(m::TASKS_TOTAL, "service" => service.clone(), "outcome" => outcome);
        TaskMetrics {
            ok: outcome("ok"),
            failed: outcome("failed"),
            interrupted: outcome("interrupted"),
            cancelled: outcome("cancelled"),
            retried: outcome("retried"),
            dead: outcome("dead"),
            duration: metrics::histogram!(m::TASK_DURATION_SECONDS, "service" => service.clone()),
            wait: metrics::histogram!(m::TASK_WAIT_SECONDS, "service" => service.clone()),
            in_flight: metrics::gauge!(m::TASKS_IN_FLIGHT, "service" => service),
            presence,
        }
    }

    /// A handler run of a task enqueued at `enqueued_at` starts: its wait
    /// is recorded, and it is in flight until the returned guard is
    /// dropped (which records its duration, also when the run is aborted).
    pub(crate) fn start(&self, enqueued_at: SystemTime) -> Running<'_> {
        let waited = SystemTime::now()
            .duration_since(enqueued_at)
            .unwrap_or_default();
        self.wait.record(waited.as_secs_f64());
        self.in_flight.increment(1.0);
        self.presence.started();
        Running {
            metrics: self,
            started: Instant::now(),
        }
    }

    /// A handler run ended so.
    pub(crate) fn ended(&self, ended: Ended) {
        match ended {
            Ended::Ok => self.ok.increment(1),
            Ended::Failed => self.failed.increment(1),
            Ended::Interrupted => self.interrupted.increment(1),
            Ended::Cancelled => self.cancelled.increment(1),
        }
    }

    /// `n` succeeded tasks' acks landed.
    pub(crate) fn acked(&self, n: usize) {
        self.presence.count_many(Count::Ok, n as u64);
    }

    /// A failed task was enqueued for another attempt (or, ordered, will
    /// be retried in place, which Redis does not record).
    pub(crate) fn retried(&self) {
        self.retried.increment(1);
        self.presence.count(Count::Failed);
        self.presence.count(Count::Retried);
    }

    /// An entry was moved to the dead letters: a failed task
    /// (`failed`), or one that could not run.
    pub(crate) fn dead(&self, failed: bool) {
        self.dead.increment(1);
        if failed {
            self.presence.count(Count::Failed);
        }
        self.presence.count(Count::Dead);
    }

    /// The instance owns `n` partitions now.
    pub(crate) fn owned(&self, n: usize) {
        self.presence.set_owned(n);
    }
}

/// A handler run in progress.
pub(crate) struct Running<'a> {
    metrics: &'a TaskMetrics,
    started: Instant,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.decrement(1.0);
        self.metrics.presence.ended();
        let took = self.started.elapsed();
        self.metrics.duration.record(took.as_secs_f64());
    }
}

/// The queue gauges: the sums over the partitions this instance owns.
pub(crate) struct QueueGauges {
    backlog: Gauge,
    dead: Gauge,
    delayed: Gauge,
    /// The last sizes read of each owned partition.
    partitions: Mutex<BTreeMap<u32, Sizes>>,
    /// Told the backlog too: it records it per minute, for a chart of the
    /// last hour (the dashboard's).
    presence: Arc<Presence>,
}

impl QueueGauges {
    /// The gauges for `service`, from the recorder installed now; the
    /// backlog goes to `presence` as well.
    pub(crate) fn new(service: &ServiceName, presence: Arc<Presence>) -> Self {
        let service = service.to_string();
        QueueGauges {
            backlog: metrics::gauge!(m::BACKLOG_ENTRIES, "service" => service.clone()),
            dead: metrics::gauge!(m::DEAD_LETTERS, "service" => service.clone()),
            delayed: metrics::gauge!(m::DELAYED_TASKS, "service" => service),
            partitions: Mutex::new(BTreeMap::new()),
            presence,
        }
    }

    /// Partition `p`'s sizes as just read; `None`: the instance no longer
    /// owns it.
    pub(crate) fn set(&self, p: u32, sizes: Option<Sizes>) {
        let mut partitions = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        match sizes {
            Some(sizes) => partitions.insert(p, sizes),
            None => partitions.remove(&p),
        };
        let sum = |f: fn(&Sizes) -> u64| partitions.values().map(f).sum::<u64>() as f64;
        self.backlog.set(sum(|s| s.backlog));
        let backlog = partitions.values().map(|s| s.backlog).sum::<u64>();
        self.presence.set_backlog(backlog);
        self.dead.set(sum(|s| s.dead));
        self.delayed.set(sum(|s| s.delayed));
    }
}
