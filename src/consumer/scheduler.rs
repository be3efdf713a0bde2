//! Triggers the consumer's periodic jobs ([`crate::periodic`]): at each due
//! time, an assigned instance claims it and enqueues the job's task; the
//! claim makes it once across the service.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use crate::assignment::Standing;
use crate::clock::Clock;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::periodic::{Registered, Triggered};
use crate::reshard::Generation;
use crate::retry::Pauses;
use crate::tracking::watch::Watched;

use super::shared::Shared;

/// The pauses between two tries of a trigger: 50 ms, doubling, at most 5 s.
const TRIGGER_PAUSES: Pauses = Pauses::new(Duration::from_millis(50), Duration::from_secs(5));

/// Runs the jobs' schedules until `stop`.
pub(super) fn spawn(
    shared: &Shared,
    clock: Arc<dyn Clock>,
    standing: watch::Receiver<Standing>,
    stop: CancellationToken,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for job in shared.settings.periodic.iter().cloned() {
        let schedule = Schedule {
            job,
            name: shared.name.clone(),
            partitions: shared.settings.partitions,
            conn: shared.conn.clone(),
            tracking: shared.tracking.clone(),
            clock: clock.clone(),
            standing: standing.clone(),
        };
        let stop = stop.clone();
        let run = async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = schedule.run() => {}
            }
        };
        set.spawn(run.in_current_span());
    }
    set
}

struct Schedule {
    job: Registered,
    name: ServiceName,
    partitions: u32,
    conn: Arc<SharedConnection>,
    /// Tracked: a triggered task's record says `waiting` from the start.
    tracking: Watched,
    clock: Arc<dyn Clock>,
    standing: watch::Receiver<Standing>,
}

impl Schedule {
    async fn run(mut self) {
        // Catch up once on a missed due time, when the job asks for it,
        // as soon as this instance is assigned.
        let mut catch_up = self.job.missed_due(self.now());
        let mut last = self.now();
        loop {
            if catch_up.is_some() && self.assigned() {
                let due = catch_up.take().expect("checked");
                self.trigger(due, "missed").await;
            }
            let Some(due) = self.job.job.next_after(last) else {
                return;
            };
            // By this instance's wall clock (all instances agree on the due
            // times; skew only moves who gets there first).
            let wait = due.duration_since(self.now()).unwrap_or(Duration::ZERO);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                // Not assigned yet: wait for it, then look again.
                changed = self.standing.changed(), if catch_up.is_some() => {
                    if changed.is_err() {
                        catch_up = None; // the indexer stopped: no more standings
                    }
                    continue;
                }
            }
            if self.now() < due {
                continue; // woke early (a clock step): sleep the rest
            }
            last = due;
            // A joining or fenced instance leaves it to the others.
            if self.assigned() {
                self.trigger(due, "due").await;
            }
        }
    }

    fn now(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + self.clock.now()
    }

    fn assigned(&self) -> bool {
        matches!(*self.standing.borrow(), Standing::Assigned(_))
    }

    /// The generation the job's due times go to and, around a reshard,
    /// the one it replaced, from the assignment's layout (docs/design.md
    /// §21).
    fn generations(&self) -> (Generation, Option<Generation>) {
        let first = Generation {
            number: 0,
            partitions: self.partitions,
        };
        match &*self.standing.borrow() {
            Standing::Assigned(a) => a.layout().map_or((first, None), |l| (l.current, l.from)),
            _ => (first, None),
        }
    }

    /// Claims `due`: in the replaced layout first, while there is one (its
    /// partition takes it until sealed), then in the current one, above
    /// the replaced one's frozen mark, so no due time fires in both.
    async fn claim(&self, due: SystemTime, tracked: bool) -> Result<Triggered> {
        let job = self.job.job.name().as_bytes();
        let (current, from) = self.generations();
        let mut floor = -1;
        if let Some(from) = from {
            let p = from.route(job, 0);
            match self
                .job
                .trigger(&self.conn, &self.name, p, due, tracked, -1)
                .await?
            {
                Triggered::Sealed { mark } => floor = mark,
                done => return Ok(done),
            }
        }
        let p = current.route(job, 0);
        self.job
            .trigger(&self.conn, &self.name, p, due, tracked, floor)
            .await
    }

    /// Triggers `due`, retrying while Redis fails (every instance calls at
    /// once, so one stall would otherwise skip the due time everywhere),
    /// until half a period after it: the claim makes retries safe.
    async fn trigger(&self, due: SystemTime, why: &str) {
        let job = self.job.job.name();
        let period = self
            .job
            .job
            .period_near(due)
            .unwrap_or(Duration::from_secs(1));
        let give_up = due + period / 2;
        let mut pauses = TRIGGER_PAUSES;
        loop {
            let tracked = self.tracking.on().is_some();
            match self.claim(due, tracked).await {
                Ok(Triggered::Now) => return debug!(job, ?due, why, "periodic job triggered"),
                Ok(Triggered::Before) => return,
                // Sealed again meanwhile (a reshard after a reshard): again.
                Ok(Triggered::Sealed { .. }) => pauses.wait().await,
                Err(e) if self.now() + pauses.upcoming() < give_up => {
                    debug!(job, ?due, cause = %e, "could not trigger the periodic job; retrying");
                    pauses.wait().await;
                }
                Err(e) => return warn!(job, ?due, cause = %e, "could not trigger the periodic job"),
            }
        }
    }
}
