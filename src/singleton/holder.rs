//! One singleton held by this instance (docs/design.md §20): record the
//! holder with its token, then run the job, restarted with backoff while
//! the singleton stays here, stopped by a pause, a release or a fence.
//!
//! Runs are spawned, so a panic is one run's end (`panicked`), not the
//! holder's. At a stop the run is told at once (its `cancelled()`), may go
//! on until the drain's deadline, and is then aborted; the holder ends only
//! after the run's future is gone, and only then does the driver write the
//! release mark that lets the next holder start (rule 1).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, info, warn};

use super::Job;
use super::context::{Hold, SingletonContext};
use super::store;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::gate::Gate;
use crate::instance::InstanceId;
use crate::metrics as m;
use crate::retry::Pauses;

/// A run stopped by a pause or a release gets this long after its drain's
/// deadline (or a pause's) to return before its future is dropped, as a
/// task's handler does.
const GRACE: Duration = Duration::from_millis(20);
/// The restart policy: 100 ms after a run ends, doubling after each run
/// that ends within [`STEADY`], at most 30 s.
const RESTARTS: Pauses = Pauses::new(Duration::from_millis(100), Duration::from_secs(30));
/// A run that lasted this long resets the restart backoff.
const STEADY: Duration = Duration::from_secs(60);

/// What a holder tells the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lost {
    pub(super) unit: u32,
    pub(super) token: u64,
}

/// Everything one holder needs.
pub(super) struct Holder {
    pub(super) service: ServiceName,
    pub(super) name: Arc<str>,
    pub(super) unit: u32,
    pub(super) token: u64,
    pub(super) id: InstanceId,
    pub(super) conn: Arc<SharedConnection>,
    pub(super) job: Job,
    pub(super) hold: Arc<Hold>,
    /// Closed while the service is paused.
    pub(super) gate: Gate,
    /// How long a pause lets a run finish.
    pub(super) drain_timeout: Duration,
    pub(super) epoch: Arc<AtomicU64>,
    pub(super) lost: mpsc::UnboundedSender<Lost>,
}

/// How a run ended, as `peerq_singleton_runs_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Failed,
    Panicked,
    Interrupted,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Panicked => "panicked",
            Outcome::Interrupted => "interrupted",
        }
    }
}

impl Holder {
    /// Acquires, then runs the job until the hold stops; dropping the
    /// handle aborts the holder and, with it, the run.
    pub(super) fn spawn(self) -> AbortOnDropHandle<()> {
        AbortOnDropHandle::new(tokio::spawn(self.hold_it().in_current_span()))
    }

    async fn hold_it(self) {
        if !self.acquire().await {
            return;
        }
        let held = metrics::gauge!(m::SINGLETON_HELD, "service" => self.service.to_string(), "name" => self.name.to_string());
        held.set(1.0);
        info!(singleton = %self.name, token = self.token, "singleton acquired");
        let mut restarts = RESTARTS;
        while !self.hold.stop.is_cancelled() {
            if !self.hold.holds() {
                // No lease now: either it lapsed (the driver's fence stops
                // this hold soon) or it is not granted yet (the driver
                // grants it right after the effects that started this
                // holder); run once it holds.
                tokio::select! {
                    biased;
                    _ = self.hold.stop.cancelled() => break,
                    _ = self.hold.leased() => continue,
                }
            }
            tokio::select! {
                biased;
                _ = self.hold.stop.cancelled() => break,
                _ = self.gate.opened() => {}
            }
            // Released while the gate opened: no new run.
            if self.hold.stop.is_cancelled() || !self.hold.holds() {
                break;
            }
            let started = Instant::now();
            let outcome = self.run_once().await;
            metrics::counter!(m::SINGLETON_RUNS_TOTAL, "service" => self.service.to_string(),
                "name" => self.name.to_string(), "outcome" => outcome.label())
            .increment(1);
            if self.hold.stop.is_cancelled() {
                break;
            }
            if outcome == Outcome::Interrupted {
                // Paused: it starts again once resumed, without a pause.
                continue;
            }
            if started.elapsed() >= STEADY {
                restarts.reset();
            }
            let wait = restarts.take();
            warn!(singleton = %self.name, outcome = outcome.label(), restart_in = ?wait, "singleton job ended; restarting");
            tokio::select! {
                biased;
                _ = self.hold.stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        self.hold.stop.cancelled().await;
        held.set(0.0);
        info!(singleton = %self.name, token = self.token, "singleton released");
    }

    /// Records this instance as the holder, trying again while Redis
    /// cannot be reached; false when refused or stopped first.
    async fn acquire(&self) -> bool {
        let mut pauses = Pauses::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            let tried = tokio::select! {
                tried = store::acquire(&self.conn, &self.service, &self.name, self.token, self.id.as_str()) => tried,
                _ = self.hold.stop.cancelled() => return false,
            };
            match tried {
                Ok(Ok(())) => return true,
                Ok(Err(recorded)) => {
                    warn!(singleton = %self.name, token = self.token, recorded,
                          "singleton acquired with a newer token elsewhere; not running it");
                    self.hold.lose();
                    let _ = self.lost.send(Lost {
                        unit: self.unit,
                        token: self.token,
                    });
                    return false;
                }
                Err(e) => {
                    warn!(singleton = %self.name, cause = %e, "cannot record the singleton's holder; trying again");
                    tokio::select! {
                        _ = pauses.wait() => {}
                        _ = self.hold.stop.cancelled() => return false,
                    }
                }
            }
        }
    }

    /// One run of the job, until it returns, panics, or is stopped.
    async fn run_once(&self) -> Outcome {
        let cancel = self.hold.stop.child_token();
        let cx = SingletonContext {
            name: self.name.clone(),
            token: self.token,
            instance: self.id.clone(),
            hold: self.hold.clone(),
            cancel: cancel.clone(),
            epoch: self.epoch.clone(),
        };
        info!(singleton = %self.name, token = self.token, "singleton job starting");
        // The user's function is called inside the spawned task, so a panic
        // before its future exists is this run's end too, not the holder's.
        let job = self.job.clone();
        let mut run =
            AbortOnDropHandle::new(tokio::spawn(async move { job(cx).await }.in_current_span()));
        let paused_until = tokio::select! {
            biased;
            _ = self.hold.stop.cancelled() => None,
            ended = &mut run => return ended_as(ended, &cancel),
            _ = self.gate.closed() => {
                info!(singleton = %self.name, "service paused; stopping the singleton job");
                cancel.cancel();
                Some(Instant::now() + self.drain_timeout)
            }
        };
        self.stop(run, paused_until).await;
        Outcome::Interrupted
    }

    /// Waits for a run told to stop until the earliest of `paused_until`
    /// and the hold's drain's end, which a release or a fence that comes
    /// meanwhile sets or brings forward; then drops its future (after the
    /// grace) and waits until it is gone.
    async fn stop<T>(&self, mut run: AbortOnDropHandle<T>, paused_until: Option<Instant>) {
        let mut changes = self.hold.drain_changes();
        loop {
            let until = match (paused_until, self.hold.drain_until()) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                // Stopped before its deadline was set: set at once after.
                (None, None) => Instant::now(),
            };
            tokio::select! {
                biased;
                _ = &mut run => return,
                changed = changes.changed() => {
                    if changed.is_ok() {
                        continue;
                    }
                }
                _ = tokio::time::sleep_until(until + GRACE) => {}
            }
            run.abort();
            let _ = (&mut run).await;
            return;
        }
    }
}

/// How a run that ended by itself ended.
fn ended_as(
    ended: Result<Result<(), crate::handler::BoxError>, JoinError>,
    cancel: &CancellationToken,
) -> Outcome {
    match ended {
        _ if cancel.is_cancelled() => Outcome::Interrupted,
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(e)) => {
            warn!(cause = %e, "singleton job failed");
            Outcome::Failed
        }
        Err(e) if e.is_panic() => {
            warn!("singleton job panicked");
            Outcome::Panicked
        }
        Err(_) => Outcome::Interrupted,
    }
}
