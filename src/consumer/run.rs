//! The middle step of a task's path, fetch → run → settle: one fetched
//! entry waits for room and for the lease, is decoded, and runs through the
//! handler (a panic is a failed attempt, a cancellation gets a short grace
//! and is then dropped); its outcome goes to [`super::settle`]. What differs
//! for ordered partitions is asked of [`super::policy`].

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use futures_util::FutureExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, info_span, warn};

use super::acker::Acked;
use super::held::Held;
use super::lease::Lease;
use super::meters::Ended;
use super::ownership::Ownership;
use super::policy::Unfinished;
use super::runner::Call;
use super::settle::Settle;
use super::shared::Shared;
use super::store::Fetched;
use crate::assignment::Assignment;
use crate::handler::{BoxError, Disposition, Standing, TaskContext, disposition_of};
use crate::task::Entry;

/// How long a cancelled handler may take to notice its cancellation signal
/// and return before it is aborted. Kept within the 50 ms that
/// docs/design.md §4 allows for cancellation latency.
const CANCEL_GRACE: Duration = Duration::from_millis(20);

/// How a handler run ended.
enum Outcome {
    Succeeded,
    Failed(String, Disposition),
    /// Its cancellation fired before it returned (and it did not say it
    /// finished): runs again, whatever it returned.
    Cancelled,
}

/// One entry of one partition, and what running it needs.
pub(crate) struct RunTask {
    pub(crate) shared: Arc<Shared>,
    pub(crate) partition: u32,
    pub(crate) assignment: Assignment,
    pub(crate) lease: Lease,
    /// The partition as this worker owns it. Its `stop` is the partition's
    /// release: a task not started by then is handed back.
    pub(crate) ownership: Arc<Ownership>,
    /// Fires at the drain timeout, a lapsed lease or a fence.
    pub(crate) cancel: CancellationToken,
    pub(crate) held: Held,
    /// Where the entry goes when it is done.
    pub(crate) settle: Settle,
    /// Read from the pending list rather than new: with attempts kept in
    /// Redis, its attempt number comes from the delivery count too.
    pub(crate) redelivered: bool,
}

impl RunTask {
    /// Runs `fetched` to its outcome; true if the entry is no longer
    /// pending (false: left for this instance's or the next owner's
    /// pending list).
    pub(crate) async fn run(self, fetched: Fetched) -> bool {
        let id = fetched.id.clone();
        // Wait for room, for the pause gate (holding the room, so a paused
        // instance reads no more than it has room for) and for the lease
        // (rule 6: nothing fetched runs without one); a task that has not
        // started when its partition is released is handed back instead of
        // making the drain wait for it.
        let stop = &self.ownership.stop;
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            permit = self.shared.permits.clone().acquire_owned() => Some(permit.expect("never closed")),
        };
        let gate = &self.shared.gate;
        let mut permit = permit;
        // Both at once: a pause that lands while the lease is awaited, or
        // a lease that lapses while paused, sends the task back to wait.
        while permit.is_some() && !(gate.is_open() && self.lease.valid()) {
            let ready = tokio::select! {
                biased;
                _ = stop.cancelled() => false,
                _ = gate.opened(), if !gate.is_open() => true,
                _ = self.lease.held(), if gate.is_open() => true,
            };
            if !ready {
                permit = None;
            }
        }
        match permit {
            Some(permit) => {
                let acked = self.execute(fetched).await;
                // Held until the ack has landed: re-reading the pending list
                // before that must not run the task again. The room is held
                // that long too: handlers faster than the acker would
                // otherwise pile up finished tasks without bound (measured:
                // 1.6 GiB at 200,000 tasks), and a Redis that stops
                // answering acks now stops the reads as well.
                if let Some(acked) = acked {
                    self.settle.confirm(acked).await;
                }
                drop(permit);
            }
            None => self.unstarted(fetched).await,
        }
        let settled = self.settle.is_settled();
        self.held.release(&id, settled);
        settled
    }

    /// A claimed entry that may have run elsewhere: enqueued again with
    /// `attempt + 1` ([`Settle::take_over`]). One too large or that does
    /// not parse goes where `run` sends it (the dead letters).
    pub(crate) async fn take_over(self, fetched: Fetched) {
        let Ok(entry) = &fetched.entry else {
            self.run(fetched).await;
            return;
        };
        self.settle.take_over(&fetched.id, entry).await;
        self.held.release(&fetched.id, self.settle.is_settled());
    }

    /// A fetched entry that did not start: handed back, or left pending in
    /// place (ordered).
    async fn unstarted(&self, fetched: Fetched) {
        if self.shared.order.unfinished() == Unfinished::LeavePending {
            return;
        }
        match fetched.entry {
            Ok(entry) => self.settle.hand_back(&fetched.id, entry.fields()).await,
            Err(unreadable) => self.settle.hand_back(&fetched.id, unreadable.fields).await,
        }
    }

    /// Runs the entry; on success returns the ack's confirmation.
    async fn execute(&self, fetched: Fetched) -> Option<oneshot::Receiver<Acked>> {
        // Rule 6, as late as possible: waiting for room may have outlived
        // the lease (a frozen process resumes here, say).
        if !self.lease.valid() {
            self.unstarted(fetched).await;
            return None;
        }
        let id = fetched.id;
        // Dead-lettered as it was: too large (never decoded) or malformed.
        let mut entry = match fetched.entry {
            Ok(entry) => entry,
            Err(unreadable) => {
                let why = unreadable.why;
                let (reason, error) = (why.reason(), why.to_string());
                self.settle
                    .dead_letter(&id, unreadable.fields, reason, &error)
                    .await;
                return None;
            }
        };
        let order = self.shared.order;
        // The attempt Redis has counted for the entry (a new read counts 1).
        let mut counted = 1;
        if order.attempts_in_redis() && self.redelivered {
            // Unknown, it could be higher than the entry says: left pending
            // and read again (which counts one more) rather than run with
            // an attempt that goes back.
            counted = self.deliveries(&id).await?;
            // Not pending any more: it finished meanwhile.
            if counted == 0 {
                return None;
            }
            entry.attempt = entry.attempt.max(counted);
        }
        loop {
            let call = match self.shared.runner.prepare(&entry) {
                Ok(call) => call,
                Err(e) => {
                    let (reason, error) = (e.reason(), e.to_string());
                    self.settle
                        .dead_letter(&id, entry.fields(), reason, &error)
                        .await;
                    return None;
                }
            };
            let span = info_span!(
                "task",
                task_id = %entry.id,
                partition = self.partition,
                attempt = entry.attempt,
                epoch = self.assignment.epoch,
                token = self.ownership.store.token()
            );
            if order.attempts_in_redis() && entry.attempt > counted {
                if !self.record_attempt(&id, entry.attempt).await {
                    return None;
                }
                counted = entry.attempt;
            }
            match self.call(&entry, call, span.clone()).await {
                Outcome::Succeeded => return Some(self.settle.ack(id)),
                // Retried in place after its backoff, blocking the
                // partition, so tasks with one key keep their order.
                Outcome::Failed(error, disposition) if order.retries_in_place() => {
                    let delay = match self.settle.next_attempt(&entry, &error, disposition) {
                        Ok(delay) => delay,
                        Err(reason) => {
                            self.settle
                                .dead_letter(&id, entry.fields(), reason, &error)
                                .instrument(span)
                                .await;
                            return None;
                        }
                    };
                    warn!(parent: &span, error, retry_in = ?delay, "task failed; retried in place");
                    self.shared.metrics.retried();
                    // A release meanwhile leaves it pending: the next owner
                    // runs it first.
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.ownership.stop.cancelled() => return None,
                        _ = self.cancel.cancelled() => return None,
                    }
                    // Paused meanwhile: the next attempt waits, in place.
                    tokio::select! {
                        _ = self.shared.gate.opened() => {}
                        _ = self.ownership.stop.cancelled() => return None,
                        _ = self.cancel.cancelled() => return None,
                    }
                    // Rule 6 again: the wait may have outlived the lease.
                    if !self.lease.valid() {
                        return None;
                    }
                    entry.attempt += 1;
                }
                Outcome::Failed(error, disposition) => {
                    self.settle
                        .failed(&id, &entry, &error, disposition)
                        .instrument(span)
                        .await;
                    return None;
                }
                Outcome::Cancelled => {
                    // Left pending (ordered: it runs first on the next
                    // owner), or enqueued again at once, to run on the
                    // partition's next owner.
                    if order.unfinished() == Unfinished::EnqueueAgain {
                        let why = "cancelled at the drain timeout";
                        self.settle
                            .retry(&id, &entry, why, Duration::ZERO)
                            .instrument(span)
                            .await;
                    }
                    return None;
                }
            }
        }
    }

    /// The entry's attempt record in Redis: its delivery count. The first
    /// read counts 1; each attempt after the first is recorded as it
    /// starts ([`record_attempt`](Self::record_attempt)); every later
    /// delivery (a re-read of the pending list, here or on the next owner
    /// after a crash, a cancellation, a lost ack or a handover) counts one
    /// more, the attempt that may have run. Claims leave the count alone.
    /// 0 when the entry is not pending any more; `None` when Redis does not
    /// say.
    async fn deliveries(&self, id: &str) -> Option<u32> {
        match self.ownership.store.deliveries(id).await {
            Ok(count) => Some(count),
            Err(e) => {
                warn!(partition = self.partition, cause = %e, "cannot read the delivery count");
                None
            }
        }
    }

    /// Records in Redis that `attempt` of the entry starts now, so the
    /// partition's next owner continues the count. False when the task
    /// must not run now: the partition has a newer owner, the entry is not
    /// pending any more, or Redis did not answer (the entry stays pending
    /// and is read again, which counts one more, rather than run with an
    /// attempt Redis does not know).
    async fn record_attempt(&self, id: &str, attempt: u32) -> bool {
        match self.ownership.store.record_attempt(id, attempt).await {
            Ok(Some(pending)) => pending,
            Ok(None) => {
                self.ownership.fenced("recording the attempt");
                false
            }
            Err(e) => {
                warn!(partition = self.partition, attempt, cause = %e, "cannot record the attempt");
                false
            }
        }
    }

    /// Calls the handler service, with its metrics.
    async fn call(&self, entry: &Entry, call: Call, span: Span) -> Outcome {
        let metrics = &self.shared.metrics;
        let running = metrics.start(UNIX_EPOCH + entry.enqueued_at);
        let outcome = self.call_handler(entry, call, span).await;
        drop(running);
        metrics.ended(match outcome {
            Outcome::Succeeded => Ended::Ok,
            Outcome::Failed(..) => Ended::Failed,
            Outcome::Cancelled => Ended::Cancelled,
        });
        outcome
    }

    /// Calls the handler service (a panic is a failed attempt), cancelling
    /// it at the drain timeout.
    async fn call_handler(&self, entry: &Entry, call: Call, span: Span) -> Outcome {
        let finished = Arc::new(AtomicBool::new(false));
        let standing = Arc::new(TaskStanding {
            lease: self.lease.clone(),
            ownership: self.ownership.clone(),
        });
        let cx = TaskContext {
            task_id: entry.id.clone(),
            attempt: entry.attempt,
            partition: self.partition,
            enqueued_at: UNIX_EPOCH + entry.enqueued_at,
            assignment: self.assignment,
            fencing_token: self.ownership.store.token(),
            cancel: self.cancel.clone(),
            standing: Some(standing.clone()),
            finished: finished.clone(),
        };
        // Run inline, a panic caught as a failed attempt; dropping the future
        // is the cancellation (it stops at its next `.await`).
        let handler = AssertUnwindSafe(call.call(cx).instrument(span)).catch_unwind();
        tokio::pin!(handler);
        let result = tokio::select! {
            biased;
            result = &mut handler => result,
            _ = self.cancel.cancelled() => {
                // The handler saw the signal (its context shares it): give it
                // a moment to return, then abort it.
                match tokio::time::timeout(CANCEL_GRACE, &mut handler).await {
                    Ok(result) => result,
                    // Dropped: done only if it said so before.
                    Err(_) if finished.load(Ordering::SeqCst) => return Outcome::Succeeded,
                    Err(_) => return Outcome::Cancelled,
                }
            }
        };
        // The instance may no longer act on the partition although the
        // cancellation has not fired yet (a lease that lapsed before the
        // driver woke, a drain deadline before its timer): a handler that
        // saw `still_owned()` false and gave up did not fail.
        if !self.cancel.is_cancelled() && standing.holds() {
            return outcome(result);
        }
        // Its cancellation fired before it returned: it runs again with
        // `attempt + 1` (never dead-lettered for it), whatever it returned,
        // unless the handler said its effect was done. A handler that gives
        // up on the signal may well return `Ok(())`. (The attempt number
        // still counts cancelled runs, so a task cancelled at many drains
        // has fewer real attempts left.)
        match outcome(result) {
            Outcome::Succeeded if finished.load(Ordering::SeqCst) => Outcome::Succeeded,
            _ => Outcome::Cancelled,
        }
    }
}

/// What a task's [`TaskContext::still_owned`] consults besides its
/// cancellation.
#[derive(Debug)]
struct TaskStanding {
    lease: Lease,
    ownership: Arc<Ownership>,
}

impl Standing for TaskStanding {
    fn holds(&self) -> bool {
        self.ownership.holds(&self.lease)
    }
}

/// How a handler run's result reads.
fn outcome(result: Result<Result<(), BoxError>, Box<dyn Any + Send>>) -> Outcome {
    match result {
        Ok(Ok(())) => Outcome::Succeeded,
        Ok(Err(e)) => Outcome::Failed(e.to_string(), disposition_of(&e)),
        Err(panic) => {
            let message = crate::error::panic_message(&*panic);
            let error = format!("handler panicked: {message}");
            Outcome::Failed(error, Disposition::Backoff)
        }
    }
}
