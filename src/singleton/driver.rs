//! The singletons' handover driver (docs/design.md §20): the same state
//! machine as the partitions' ([`crate::transition`]), with one unit per
//! singleton name, told what happens (a standing, marks read, time, a drain
//! finished, a refused acquire) and carrying out its effects: start a
//! holder, release it (stop the job, wait for its future), write a mark in
//! `{N}:transition`.
//!
//! It follows the indexer's standing on its own, with a lease of its own
//! computed from the same assignments as the partitions' lease, so that a
//! consumer's partitions and its singletons never wait for each other.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, info, warn};

use super::Declared;
use super::context::Hold;
use super::holder::{Holder, Lost};
use crate::assignment::Standing;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::gate::Gate;
use crate::instance::InstanceId;
use crate::keys;
use crate::lease::Lease;
use crate::marks::{self, Mark};
use crate::timing::Timing;
use crate::transition::{Effect, Partitions, wake_at};

/// A read of the marks, with the units it read them for.
type MarksRead = (Vec<u32>, Result<Vec<Option<Mark>>>);

/// What the driver needs.
pub(crate) struct Setup {
    pub(crate) service: ServiceName,
    pub(crate) id: InstanceId,
    pub(crate) conn: Arc<SharedConnection>,
    pub(crate) timing: Timing,
    pub(crate) lease: Lease,
    pub(crate) gate: Gate,
    pub(crate) standing: watch::Receiver<Standing>,
    pub(crate) singletons: Vec<Declared>,
}

/// The running driver: ends by itself after a graceful leave's marks.
pub(crate) struct Singletons {
    at_once: CancellationToken,
    /// Aborted if the consumer's future is dropped rather than run to its
    /// end: the holders' handles go with the driver, and their runs.
    done: AbortOnDropHandle<()>,
    /// Whether `done` has been awaited to its end.
    ended: bool,
}

impl Singletons {
    /// Starts following the standing (nothing runs for no singletons).
    pub(crate) fn spawn(setup: Setup) -> Singletons {
        let at_once = CancellationToken::new();
        let done = AbortOnDropHandle::new(if setup.singletons.is_empty() {
            tokio::spawn(async {})
        } else {
            tokio::spawn(Driver::new(setup, at_once.clone()).run().in_current_span())
        });
        Singletons {
            at_once,
            done,
            ended: false,
        }
    }

    /// Resolves once the driver has ended by itself (its standing's
    /// `Left`, or the indexer stopped).
    pub(crate) async fn ended(&mut self) {
        if !self.ended {
            let _ = (&mut self.done).await;
            self.ended = true;
        }
    }

    /// Stops every job now (their runs dropped after the grace): held units
    /// are fenced (no marks; their next holders wait for the deadlines),
    /// drains underway end now and then write the marks they vouch for.
    pub(crate) fn leave_at_once(&self) {
        self.at_once.cancel();
    }

    /// Waits until the driver has ended (after the standing's `Left`, the
    /// jobs' ends and the marks), leaving at once at `by`.
    pub(crate) async fn finished(mut self, by: Instant) {
        if self.ended {
            return;
        }
        if tokio::time::timeout_at(by, &mut self.done).await.is_err() {
            self.at_once.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.done).await;
            // Dropping the driver drops its holders' handles, which abort
            // them and, with them, their runs.
            self.done.abort();
            let _ = (&mut self.done).await;
        }
    }
}

struct Driver {
    setup: Setup,
    machine: Partitions,
    names: Vec<Arc<str>>,
    jobs: Vec<super::Job>,
    leased: bool,
    holders: BTreeMap<u32, (Arc<Hold>, AbortOnDropHandle<()>)>,
    /// The holds draining, to end at once when leaving at once.
    draining: BTreeMap<u32, Arc<Hold>>,
    drains: JoinSet<u32>,
    /// Which unit each drain task is for (to know it even if it fails).
    drain_ids: BTreeMap<Id, u32>,
    marks: JoinSet<()>,
    /// Reads of the marks, each with the units it read them for.
    polls: JoinSet<MarksRead>,
    next_poll: Instant,
    epoch: Arc<AtomicU64>,
    lost_tx: mpsc::UnboundedSender<Lost>,
    lost: mpsc::UnboundedReceiver<Lost>,
    at_once: CancellationToken,
    left: bool,
    /// Whether the leave at once was carried out (once).
    left_at_once: bool,
}

/// What woke the driver.
enum Wake {
    Standing(Standing),
    /// The indexer's channel closed.
    IndexerGone,
    AtOnce,
    Drained(u32),
    Marks(std::result::Result<MarksRead, tokio::task::JoinError>),
    Lost(Lost),
    Marked,
    Timer,
}

impl Driver {
    fn new(mut setup: Setup, at_once: CancellationToken) -> Driver {
        let declared = std::mem::take(&mut setup.singletons);
        let names: Vec<Arc<str>> = declared.iter().map(|d| d.name.clone()).collect();
        // 0 on every instance until it holds one: a dashboard sums the
        // gauge over instances and finds each of them.
        for name in &names {
            metrics::gauge!(crate::metrics::SINGLETON_HELD, "service" => setup.service.to_string(), "name" => name.to_string())
                .set(0.0);
        }
        let jobs = declared.into_iter().map(|d| d.job).collect();
        let (lost_tx, lost) = mpsc::unbounded_channel();
        Driver {
            machine: Partitions::singletons(setup.timing, names.clone()),
            setup,
            names,
            jobs,
            leased: false,
            holders: BTreeMap::new(),
            draining: BTreeMap::new(),
            drains: JoinSet::new(),
            drain_ids: BTreeMap::new(),
            marks: JoinSet::new(),
            polls: JoinSet::new(),
            next_poll: Instant::now(),
            epoch: Arc::new(AtomicU64::new(0)),
            lost_tx,
            lost,
            at_once,
            left: false,
            left_at_once: false,
        }
    }

    async fn run(mut self) {
        loop {
            if self.left
                && self.machine.is_idle()
                && self.drains.is_empty()
                && self.marks.is_empty()
            {
                return;
            }
            let wake = self.next().await;
            // Rule 6, before anything else can start a unit.
            self.check_lease();
            self.handle(wake);
        }
    }

    /// Waits for what happens next.
    async fn next(&mut self) -> Wake {
        let wake_at = self.next_wake();
        tokio::select! {
            changed = self.setup.standing.changed(), if !self.left => match changed {
                Ok(()) => Wake::Standing(self.setup.standing.borrow_and_update().clone()),
                Err(_) => Wake::IndexerGone,
            },
            _ = self.at_once.cancelled(), if !self.left_at_once => Wake::AtOnce,
            Some(done) = self.drains.join_next_with_id() => {
                let id = match &done {
                    Ok((id, _)) => *id,
                    Err(e) => e.id(),
                };
                Wake::Drained(self.drain_ids.remove(&id).expect("every drain is recorded"))
            }
            Some(read) = self.polls.join_next() => Wake::Marks(read),
            Some(lost) = self.lost.recv() => Wake::Lost(lost),
            Some(_) = self.marks.join_next() => Wake::Marked,
            _ = tokio::time::sleep_until(wake_at) => Wake::Timer,
        }
    }

    fn handle(&mut self, wake: Wake) {
        let now = self.setup.lease.now();
        match wake {
            Wake::Standing(standing) => self.standing(&standing),
            Wake::IndexerGone => {
                // Nothing vouches for the holds any more.
                self.fence("the peer indexer stopped");
                self.left = true;
            }
            Wake::AtOnce => {
                self.fence("leaving at once");
                // Drains underway end now too (rule 7: every run stops).
                for hold in self.draining.values() {
                    hold.release(Instant::now());
                }
                self.left = true;
                self.left_at_once = true;
            }
            Wake::Drained(unit) => {
                self.draining.remove(&unit);
                let effects = self.machine.drained(unit, now);
                self.apply(effects);
            }
            Wake::Marks(read) => self.read_marks(read),
            Wake::Lost(lost) => {
                let effects = self.machine.lost(lost.unit, lost.token);
                self.apply(effects);
            }
            Wake::Marked => {}
            Wake::Timer => {
                // `apply` reads the marks when a read is due.
                let effects = self.machine.tick(now);
                self.apply(effects);
            }
        }
    }

    fn standing(&mut self, standing: &Standing) {
        let now = self.setup.lease.now();
        match standing {
            Standing::Assigned(a) => {
                let lease_end = self.setup.timing.lease_for(a.epoch, now);
                if lease_end.is_none() {
                    self.setup.lease.revoke();
                    self.leased = false;
                }
                self.epoch.store(a.epoch, Ordering::Relaxed);
                let effects = self.machine.assigned(a.clone(), now);
                self.apply(effects);
                // As the partitions' lease: granted only once what this
                // assignment stops is stopped (docs/design.md §4.2).
                if let Some(end) = lease_end {
                    self.setup.lease.grant(end);
                    self.leased = true;
                }
            }
            Standing::Fenced { epoch, reason } => {
                self.fence(&format!("no assignment for epoch {epoch}: {reason}"));
            }
            Standing::Left { epoch } => {
                let effects = self.machine.leave(*epoch, now);
                self.apply(effects);
                self.setup.lease.revoke();
                self.leased = false;
                self.left = true;
            }
            Standing::Joining => {}
        }
    }

    /// Rule 6: a lapsed lease fences every singleton.
    fn check_lease(&mut self) {
        if self.leased && !self.setup.lease.valid() {
            self.fence("the lease expired before a new assignment arrived");
        }
    }

    /// Rules 5 and 6: every job stops now, pending acquires are dropped.
    fn fence(&mut self, why: &str) {
        self.setup.lease.revoke();
        self.leased = false;
        if self.machine.is_idle() {
            return;
        }
        warn!(service = %self.setup.service, why, "fencing every singleton");
        let effects = self.machine.fence();
        self.apply(effects);
    }

    fn apply(&mut self, effects: Vec<Effect>) {
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
        self.poll_marks();
    }

    fn start(&mut self, unit: u32, token: u64) {
        let hold = Arc::new(Hold::new(self.setup.lease.clone()));
        let name = self.names[unit as usize].clone();
        info!(singleton = %name, token, "singleton starting here");
        let handle = Holder {
            service: self.setup.service.clone(),
            name,
            unit,
            token,
            id: self.setup.id.clone(),
            conn: self.setup.conn.clone(),
            job: self.jobs[unit as usize].clone(),
            hold: hold.clone(),
            gate: self.setup.gate.clone(),
            drain_timeout: self.setup.timing.drain_timeout,
            epoch: self.epoch.clone(),
            lost: self.lost_tx.clone(),
        }
        .spawn();
        self.holders.insert(unit, (hold, handle));
    }

    /// Rule 1: the job is told to stop now, may act until `cancel_at`,
    /// then its future is dropped; drained once the holder has ended.
    fn release(&mut self, unit: u32, cancel_at: Duration) {
        let left = cancel_at.saturating_sub(self.setup.lease.now());
        let deadline = Instant::now() + left;
        let holder = self.holders.remove(&unit);
        if let Some((hold, _)) = &holder {
            hold.release(deadline);
            self.draining.insert(unit, hold.clone());
        }
        let drain = self.drains.spawn(
            async move {
                if let Some((_, handle)) = holder {
                    let _ = handle.await;
                }
                unit
            }
            .in_current_span(),
        );
        self.drain_ids.insert(drain.id(), unit);
    }

    /// Rule 2: mark := max(mark, epoch), retried a few times.
    fn mark(&mut self, unit: u32, epoch: u64) {
        let write = marks::mark_retried(
            self.setup.conn.clone(),
            self.setup.service.clone(),
            keys::singleton_mark(&self.names[unit as usize]),
            epoch,
        );
        self.marks.spawn(write.in_current_span());
    }

    fn read_marks(&mut self, read: std::result::Result<MarksRead, tokio::task::JoinError>) {
        match read {
            Ok((waiting, Ok(read))) => {
                self.next_poll = Instant::now() + marks::POLL_EVERY;
                let epochs = waiting
                    .iter()
                    .zip(read)
                    .filter_map(|(unit, mark)| Some((*unit, mark?.epoch)))
                    .collect();
                let effects = self.machine.marks(&epochs, self.setup.lease.now());
                self.apply(effects);
            }
            Ok((_, Err(e))) => {
                warn!(service = %self.setup.service, cause = %e, "cannot read the singletons' release marks");
                self.next_poll = Instant::now() + marks::POLL_BACKOFF;
            }
            Err(_) => self.next_poll = Instant::now() + marks::POLL_BACKOFF,
        }
    }

    fn next_wake(&self) -> Instant {
        let poll = (self.polls.is_empty() && self.machine.is_waiting()).then_some(self.next_poll);
        wake_at(&self.machine, &self.setup.lease, self.leased, poll)
    }

    fn poll_marks(&mut self) {
        if !self.machine.is_waiting() || !self.polls.is_empty() || Instant::now() < self.next_poll {
            return;
        }
        let waiting = self.machine.waiting();
        let fields: Vec<String> = waiting
            .iter()
            .map(|unit| keys::singleton_mark(&self.names[*unit as usize]))
            .collect();
        let conn = self.setup.conn.clone();
        let service = self.setup.service.clone();
        self.polls.spawn(
            async move { (waiting, marks::marks_of(&conn, &service, &fields).await) }
                .in_current_span(),
        );
    }
}
