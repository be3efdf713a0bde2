//! The handover driver (docs/design.md §4): tells the per-partition state
//! machine ([`crate::transition`]) what happens — an assignment arrived, a
//! round failed, the lease ran out, marks were read, a drain finished, a
//! write was fenced, the instance leaves — and carries out its effects:
//! start a worker (which records the owner and claims), release a worker
//! (drain, then cancel), write a mark.
//!
//! It never blocks on Redis: reading marks, draining and marking run in
//! tasks whose results come back through [`Handover::next`]. The effects
//! themselves are in [`effects`].

use std::collections::BTreeMap;
use std::sync::Arc;

use metrics::Histogram;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tracing::{Instrument, error, info, warn};

use super::event::{PartitionChange, PartitionEvent};
use super::ownership::{Ownership, Report};
use super::parked;
use super::retire;
use super::shared::Shared;
use super::worker::Worker;
use crate::assignment::Assignment;
use crate::assignment::Standing;
use crate::error::Result;
use crate::lease::Lease;
use crate::marks::{self, Mark};
use crate::metrics as m;
use crate::reshard::Phase;
use crate::timing::Timing;
use crate::transition::Partitions;

mod effects;

/// What woke the driver.
#[derive(Debug)]
pub(super) enum Wake {
    /// A release finished draining.
    Drained(u32),
    /// Marks read for the pending acquires.
    Marks(Result<BTreeMap<u32, Mark>>),
    /// A worker's report.
    Report(Report),
    /// A deadline or the lease's end came, or it is time to read marks.
    Timer,
    /// A mark write ended (logged where it ran).
    Marked,
}

/// The partitions of one instance, as they move.
pub(super) struct Handover {
    shared: Arc<Shared>,
    machine: Partitions,
    timing: Timing,
    lease: Lease,
    /// Whether a lease was granted and has not been found over yet.
    leased: bool,
    workers: BTreeMap<u32, Worker>,
    /// Partitions draining, to cancel at once when leaving at once.
    draining: BTreeMap<u32, Arc<Ownership>>,
    drains: JoinSet<u32>,
    /// Which partition each drain task is for (to know it even if it fails).
    drain_ids: BTreeMap<Id, u32>,
    marks: JoinSet<()>,
    polls: JoinSet<Result<BTreeMap<u32, Mark>>>,
    /// The marks last read, to measure each start's handover pause.
    marks_read: BTreeMap<u32, Mark>,
    pause: Histogram,
    next_poll: Instant,
    assignment: Option<watch::Sender<Assignment>>,
    reports: mpsc::UnboundedReceiver<Report>,
    events: broadcast::Sender<PartitionEvent>,
    /// Whether the last assignment owned no partition (logged once).
    idle: bool,
    /// The look for a reshard's cut-over underway (index 1 only).
    opening: Option<tokio::task::JoinHandle<()>>,
    /// The send of batch entries parked by sealed homes underway (index 1
    /// only).
    unparking: Option<tokio::task::JoinHandle<()>>,
}

impl Handover {
    pub(super) fn new(
        shared: Arc<Shared>,
        timing: Timing,
        lease: Lease,
        reports: mpsc::UnboundedReceiver<Report>,
        events: broadcast::Sender<PartitionEvent>,
    ) -> Self {
        let partitions = shared.settings.streams();
        let levels = shared.settings.levels().count();
        let service = shared.name.to_string();
        let pause = metrics::histogram!(m::HANDOVER_PAUSE_SECONDS, "service" => service);
        Handover {
            shared,
            machine: Partitions::new(timing, partitions).with_levels(levels),
            timing,
            lease,
            leased: false,
            workers: BTreeMap::new(),
            draining: BTreeMap::new(),
            drains: JoinSet::new(),
            drain_ids: BTreeMap::new(),
            marks: JoinSet::new(),
            polls: JoinSet::new(),
            marks_read: BTreeMap::new(),
            pause,
            next_poll: Instant::now(),
            assignment: None,
            reports,
            events,
            idle: false,
            opening: None,
            unparking: None,
        }
    }

    /// The indexer published a new standing.
    pub(super) fn standing(&mut self, standing: &Standing) {
        match standing {
            Standing::Assigned(a) => self.assigned(a.clone()),
            Standing::Fenced { epoch, reason } => {
                // Rule 6: a failed round stops fetching at once, without
                // waiting for the lease or a slow Redis error.
                self.fence(&format!("no assignment for epoch {epoch}: {reason}"));
            }
            Standing::Left { epoch } => {
                info!(service = %self.shared.name, epoch, "left the service; releasing every partition");
                // Nothing is fetched any more; the drains have their own
                // bounds (rule 1), so the lease's end must not fence them
                // (and drop the moot waits' marks). Revoked once the
                // releases have set those bounds: a running task's
                // `still_owned` never sees neither.
                let now = self.lease.now();
                let effects = self.machine.leave(*epoch, now);
                self.apply(effects);
                self.lease.revoke();
                self.leased = false;
            }
            Standing::Joining => {}
        }
    }

    fn assigned(&mut self, a: Assignment) {
        let now = self.lease.now();
        let lease_end = self.timing.lease_for(a.epoch, now);
        if lease_end.is_none() {
            warn!(service = %self.shared.name, epoch = a.epoch, "assignment arrived after its lease");
            self.lease.revoke();
            self.leased = false;
        }
        let partitions = self.shared.settings.streams();
        let idle = a.owned_partitions(partitions).is_empty();
        if idle && !self.idle {
            info!(service = %self.shared.name, index = a.index, replicas = a.replicas, partitions,
                  "more instances than partitions: this instance idles");
        }
        self.idle = idle;
        let first = self.assignment.is_none();
        let assignment = self
            .assignment
            .get_or_insert_with(|| watch::Sender::new(a.clone()))
            .clone();
        self.look_for_cut_over(&a);
        self.look_for_parked(&a);
        let effects = self.machine.assigned(a.clone(), now);
        self.apply(effects);
        // The lease only now, with the partitions this assignment stops
        // stopped (a fence after a skipped epoch stops them all): granted
        // first, a task their workers fetched before the stall and that
        // waited for a lease would start with the old token, beside the
        // partition's new owner (seen once in the stall scenario).
        if let Some(lease_end) = lease_end {
            self.lease.grant(lease_end);
            self.leased = true;
        }
        // Only now, with the released partitions stopped: a task their
        // workers fetched before runs under the assignment that owned its
        // partition (one started after the stop is handed back instead).
        if !first {
            assignment.send_replace(a);
        }
    }

    /// While a reshard drains, the instance with index 1 looks once per
    /// assignment whether every old partition is retired, and opens the
    /// new layout then (docs/design.md §21).
    fn look_for_cut_over(&mut self, a: &Assignment) {
        let Some(layout) = a.layout().filter(|l| l.phase == Phase::Draining) else {
            return;
        };
        if a.index != 1 || self.opening.as_ref().is_some_and(|o| !o.is_finished()) {
            return;
        }
        let (shared, layout, timing) = (self.shared.clone(), layout.clone(), self.timing);
        self.opening = Some(tokio::spawn(
            async move {
                if let Err(e) = retire::open_when_retired(shared, layout, timing).await {
                    warn!(cause = %e, "cannot look whether the reshard can open");
                }
            }
            .in_current_span(),
        ));
    }

    /// After a reshard, the instance with index 1 sends on, once per
    /// assignment, the batch entries that sealed home partitions parked
    /// (`parked.rs`, docs/design.md §21).
    fn look_for_parked(&mut self, a: &Assignment) {
        let Some(layout) = a.layout().filter(|l| !l.past.is_empty()) else {
            return;
        };
        if a.index != 1 || self.unparking.as_ref().is_some_and(|o| !o.is_finished()) {
            return;
        }
        let (shared, layout) = (self.shared.clone(), layout.clone());
        self.unparking = Some(tokio::spawn(
            async move {
                if let Err(e) = parked::send_parked(&shared, &layout).await {
                    warn!(cause = %e, "cannot send the batch entries sealed partitions parked");
                }
            }
            .in_current_span(),
        ));
    }

    /// Rules 5 and 6: stop every owned partition now (running tasks are
    /// cancelled), drop pending acquires, and acquire anew from the next
    /// assignment on, without marks.
    fn fence(&mut self, why: &str) {
        self.lease.revoke();
        self.leased = false;
        if self.machine.is_idle() {
            return;
        }
        warn!(service = %self.shared.name, why, "fencing every partition");
        let effects = self.machine.fence();
        self.apply(effects);
    }

    /// Leaves at once (a second signal, the leave timeout): everything
    /// stops now and running tasks are cancelled.
    pub(super) fn leave_at_once(&mut self) {
        self.fence("leaving at once");
        for ownership in self.draining.values() {
            ownership.cancel.cancel();
        }
    }

    /// Whether nothing is owned, pending, draining or being marked.
    pub(super) fn is_done(&self) -> bool {
        self.machine.is_idle()
            && self.workers.is_empty()
            && self.drains.is_empty()
            && self.marks.is_empty()
    }

    /// Waits for what happens next.
    pub(super) async fn next(&mut self) -> Wake {
        let wake_at = self.next_wake();
        tokio::select! {
            Some(done) = self.drains.join_next_with_id() => {
                let id = match &done {
                    Ok((id, _)) => *id,
                    Err(e) => e.id(),
                };
                if let Err(e) = done {
                    error!(cause = %e, "a drain failed");
                }
                Wake::Drained(self.drain_ids.remove(&id).expect("every drain is recorded"))
            }
            Some(read) = self.polls.join_next() => {
                Wake::Marks(read.unwrap_or_else(|e| Err(crate::error::Error::Runtime(e.to_string()))))
            }
            Some(report) = self.reports.recv() => Wake::Report(report),
            Some(_) = self.marks.join_next() => Wake::Marked,
            _ = tokio::time::sleep_until(wake_at) => Wake::Timer,
        }
    }

    /// Acts on what woke the driver.
    pub(super) fn handle(&mut self, wake: Wake) {
        // Rule 6, before anything else can start a partition: an expired
        // lease stops fetching and cancels in-flight tasks.
        if self.leased && !self.lease.valid() {
            self.fence("the lease expired before a new assignment arrived");
        }
        let now = self.lease.now();
        match wake {
            Wake::Drained(p) => {
                self.draining.remove(&p);
                self.publish(p, PartitionChange::Drained);
                let effects = self.machine.drained(p, now);
                self.apply(effects);
            }
            Wake::Marks(Ok(marks)) => {
                self.next_poll = Instant::now() + marks::POLL_EVERY;
                let epochs = marks.iter().map(|(p, mark)| (*p, mark.epoch)).collect();
                self.marks_read = marks;
                let effects = self.machine.marks(&epochs, now);
                self.apply(effects);
            }
            Wake::Marks(Err(e)) => {
                warn!(service = %self.shared.name, cause = %e, "cannot read the release marks");
                self.next_poll = Instant::now() + marks::POLL_BACKOFF;
            }
            Wake::Report(Report::Fenced { partition, token }) => {
                // Rule 8: that partition's work is dropped (the worker did
                // so already); the others run on.
                let effects = self.machine.lost(partition, token);
                self.apply(effects);
            }
            Wake::Timer => {
                let effects = self.machine.tick(now);
                self.apply(effects);
                self.poll_marks();
            }
            Wake::Marked => {}
        }
    }

    /// When the driver must wake up next.
    fn next_wake(&self) -> Instant {
        let poll = (self.polls.is_empty() && self.machine.is_waiting()).then_some(self.next_poll);
        crate::transition::wake_at(&self.machine, &self.lease, self.leased, poll)
    }

    /// Reads the marks of the pending acquires, unless a read is underway
    /// or it is not time yet.
    fn poll_marks(&mut self) {
        if !self.machine.is_waiting() || !self.polls.is_empty() || Instant::now() < self.next_poll {
            return;
        }
        let waiting = self.machine.waiting();
        let shared = self.shared.clone();
        self.polls.spawn(
            async move { marks::marks(&shared.conn, &shared.name, &waiting).await }
                .in_current_span(),
        );
    }
}
