//! One entry of a [`Batch`]: once it has room, the pause gate is open, the
//! lease holds and it has a token of the rate limit (if any), it is decoded and runs through the handler (a panic is
//! a failed attempt; an interrupted run's handler sees its cancellation
//! signal, gets a short grace and is then dropped).
//!
//! Every entry of a batch is one future inside the batch's task, so its
//! size is copied and allocated per entry: the common path (a handler that
//! succeeds) is kept inline, and every rarer await (settling a failure, a
//! dead letter, a hand-back, the cancellation's grace, Redis's attempt
//! records) is boxed where it is awaited, so that its state costs only the
//! entries that need it.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use futures_util::FutureExt;
use tokio::sync::SemaphorePermit;
use tracing::{Instrument, Span, info_span, warn};

use super::in_place::Waited;
use super::{Batch, Ran, Source};
use crate::consumer::acker::Ends;
use crate::consumer::erased::{Call, HandlerResult};
use crate::consumer::key_slots::KeySlot;
use crate::consumer::meters::Ended;
use crate::consumer::policy::Unfinished;
use crate::consumer::running::RunningTask;
use crate::consumer::store::{Attempts, Deliveries, Fetched, Recorded, Unreadable};
use crate::entry::Entry;
use crate::handler::{Disposition, TaskContext, Tenure, disposition_of};
use crate::workflow::BatchLink;

/// How long an interrupted handler may take to notice its cancellation
/// signal and return before it is aborted. Kept within the 50 ms that
/// docs/design.md §4 allows for cancellation latency.
const CANCEL_GRACE: Duration = Duration::from_millis(20);

/// How a handler run ended.
enum Outcome {
    /// With its encoded result, when tracked and not `()`.
    Succeeded(Option<Vec<u8>>),
    /// A user cancelled it (tracked): acked, and its record says
    /// `cancelled` (the ack script reads the request), whatever the
    /// handler returned.
    Cancelled,
    Failed(String, Disposition),
    /// Interrupted (drain timeout, lapsed lease, fence, leave at once):
    /// its cancellation signal fired before it returned (and it did not
    /// say it finished). It runs again, whatever it returned, and spends
    /// none of `max_attempts`.
    Interrupted,
}

/// How an entry's execution ended.
enum Executed {
    /// The handler succeeded (or a user cancelled it): the entry is to be
    /// acked, with the result.
    Succeeded(Vec<u8>),
    /// Settled here (true), or left pending (false).
    Done(bool),
}

impl Batch {
    /// Runs `fetched` to its outcome, short of the ack, with the running
    /// `permit` it was given; without one it did not start (the partition
    /// was released first) and is handed back, or it is a claimed entry,
    /// taken over.
    /// `track` is a tracked task's registration (its start written).
    pub(super) async fn entry(
        &self,
        fetched: Fetched,
        permit: Option<SemaphorePermit<'_>>,
        tenure: &Arc<dyn Tenure>,
        track: Option<RunningTask>,
        slot: Option<KeySlot>,
    ) -> Ran {
        let Fetched { id, entry, .. } = fetched;
        let Some(permit) = permit else {
            let settled = match &entry {
                Ok(claimed) if self.source == Source::Claimed => {
                    Box::pin(self.settle().take_over(&id, claimed)).await
                }
                _ => Box::pin(self.unstarted(&id, entry)).await,
            };
            return Ran::Done(id, settled);
        };
        let task = match (&track, &entry) {
            (Some(track), Ok(_)) => Some(track.clone()),
            _ => None,
        };
        // Its unique key is freed by its ack (docs/design.md §16), which
        // tells its batch too (§19).
        let ends = match &entry {
            Ok(entry) => Ends::of(entry),
            Err(_) => Ends::default(),
        };
        let executed = self.execute(&id, entry, tenure, track).await;
        // The handler is done: its key's slot goes back, and a cancel no
        // longer finds it (its ack reads any request).
        drop(slot);
        if let Some(task) = &task {
            task.ended();
        }
        match executed {
            Executed::Succeeded(result) => {
                // The ack's slot before the handler's permit: while acks do
                // not land, handlers' permits are held, and so are reads.
                self.shared.room.ack_slot().await;
                drop(permit);
                // A batch that wants its result gets it with its end.
                let ends = ends.with_result(&result);
                // Tracked: its whole final record (a user's cancel is
                // written over it by the ack script, which finds the
                // request).
                let task = task.map(|task| task.succeeded(result));
                Ran::Succeeded(id, task, ends)
            }
            Executed::Done(settled) => Ran::Done(id, settled),
        }
    }

    /// A fetched entry that did not start: handed back, or left pending in
    /// place (ordered); true if it is no longer pending.
    async fn unstarted(&self, id: &str, entry: Result<Entry, Unreadable>) -> bool {
        if self.shared.order.unfinished() == Unfinished::LeavePending {
            // Its read counted a delivery: taken back, so that the next
            // owner runs it with the attempt it would have run here.
            self.record_attempts(id, Deliveries::Unstarted, None, None)
                .await;
            return false;
        }
        match entry {
            Ok(entry) => {
                let task = Some((&entry.id, entry.attempt));
                self.settle().hand_back(id, entry.fields(), task).await
            }
            Err(unreadable) => self.settle().hand_back(id, unreadable.fields, None).await,
        }
    }

    /// Runs the entry, which holds a running permit and was checked
    /// against the lease just now (rule 6, as late as possible).
    async fn execute(
        &self,
        id: &str,
        entry: Result<Entry, Unreadable>,
        tenure: &Arc<dyn Tenure>,
        track: Option<RunningTask>,
    ) -> Executed {
        let settle = self.settle();
        // Dead-lettered as it was: too large (never decoded) or malformed.
        let mut entry = match entry {
            Ok(entry) => entry,
            Err(unreadable) => {
                let why = unreadable.why;
                let (reason, error) = (why.reason(), why.to_string());
                let dead = settle.dead_letter(id, unreadable.fields, reason, &error, None);
                return Executed::Done(Box::pin(dead).await);
            }
        };
        let order = self.shared.order;
        // The attempt Redis has counted for the entry (a new read counts 1).
        let mut counted = 1;
        if order.attempts_in_redis() && self.source == Source::Redelivered {
            // Unknown, they could be higher than the entry says: left
            // pending and read again (which counts one more delivery)
            // rather than run with an attempt that goes back. No
            // deliveries: not pending any more, it finished meanwhile.
            match Box::pin(self.attempts(id)).await {
                None | Some(Attempts { deliveries: 0, .. }) => return Executed::Done(false),
                Some(attempts) => {
                    counted = attempts.deliveries;
                    entry.failures = entry.failures.max(attempts.failures);
                }
            }
            entry.attempt = entry.attempt.max(counted);
        }
        loop {
            let finished = Arc::new(AtomicBool::new(false));
            let cx = TaskContext {
                task_id: entry.id.clone(),
                key: entry.key.clone(),
                attempt: entry.attempt,
                failures: entry.failures,
                partition: self.partition,
                enqueued_at: UNIX_EPOCH + entry.enqueued_at,
                place: self.place,
                fencing_token: self.ownership.store.token(),
                tenure: tenure.clone(),
                finished: finished.clone(),
                tracked: track.as_ref().map(RunningTask::tracked_at),
                headers: entry.headers.clone(),
                batch: BatchLink::of(&entry.extra),
            };
            let call = match self.shared.runner.prepare(&entry, cx) {
                Ok(call) => call,
                Err(e) => {
                    let (reason, error) = (e.reason(), e.to_string());
                    let task = Some((&entry.id, entry.attempt));
                    let dead = settle.dead_letter(id, entry.fields(), reason, &error, task);
                    return Executed::Done(Box::pin(dead).await);
                }
            };
            // `waited_ms`: since the task's first enqueue (the producer's
            // clock), the time it spent in the queue and its earlier runs.
            let waited_ms =
                crate::entry::now_ms().saturating_sub(entry.enqueued_at.as_millis() as u64);
            let span = info_span!(
                "task",
                task_id = %entry.id,
                partition = self.partition,
                attempt = entry.attempt,
                epoch = self.place.epoch,
                token = self.ownership.store.token(),
                waited_ms
            );
            #[cfg(feature = "otel")]
            crate::trace_context::join(&span, &entry.headers, self.shared.settings.trace_join);
            if order.attempts_in_redis() && entry.attempt > counted {
                let starts = Deliveries::Runs(entry.attempt);
                let in_place = self.in_place(&entry, &track, "", Duration::ZERO);
                match Box::pin(self.record_attempts(id, starts, None, in_place.as_ref())).await {
                    Some(Recorded::Yes) => {}
                    Some(Recorded::Cancelled) => return Executed::Succeeded(Vec::new()),
                    Some(Recorded::NotPending) | None => return Executed::Done(false),
                }
                counted = entry.attempt;
            }
            let outcome = self
                .call(
                    &entry,
                    call,
                    &finished,
                    tenure,
                    track.as_ref(),
                    span.clone(),
                )
                .await;
            if let Some(track) = track.as_ref().filter(|t| t.writes_progress()) {
                // Its last progress lands before its end.
                Box::pin(track.flush()).await;
            }
            let (error, disposition) = match outcome {
                Outcome::Succeeded(Some(result))
                    if result.len() > self.shared.settings.max_result_bytes =>
                {
                    let limit = self.shared.settings.max_result_bytes;
                    let error = format!(
                        "the handler's result of {} bytes exceeds the limit of {limit} bytes (`max_result_bytes`)",
                        result.len()
                    );
                    (error, Disposition::Backoff)
                }
                Outcome::Succeeded(result) => {
                    return Executed::Succeeded(result.unwrap_or_default());
                }
                Outcome::Cancelled => return Executed::Succeeded(Vec::new()),
                Outcome::Failed(error, disposition) => (error, disposition),
                Outcome::Interrupted => {
                    // Left pending (ordered: it runs first on the next
                    // owner), or enqueued again at once, to run on the
                    // partition's next owner; no failure counted.
                    if order.unfinished() == Unfinished::LeavePending {
                        return Executed::Done(false);
                    }
                    let retry = settle.interrupted(id, &entry);
                    return Executed::Done(Box::pin(retry.instrument(span)).await);
                }
            };
            if disposition == Disposition::Stale {
                // A fence where the handler writes knows a newer owner:
                // as a refused ack, the partition's work is dropped here
                // and the entry stays pending for that owner, no attempt
                // spent.
                warn!(parent: &span, error, "the handler's fence refused this owner");
                self.ownership.fenced("the handler's fence");
                return Executed::Done(false);
            }
            if !order.retries_in_place() {
                let failed = settle.failed(id, &entry, &error, disposition);
                return Executed::Done(Box::pin(failed.instrument(span)).await);
            }
            // Retried in place after its backoff, blocking the partition,
            // so tasks with one key keep their order.
            entry.failures = entry.failures.saturating_add(1);
            let delay = match settle.next_attempt(&entry, &error, disposition) {
                Ok(delay) => delay,
                Err(reason) => {
                    let task = Some((&entry.id, entry.attempt));
                    let dead = settle.dead_letter(id, entry.fields(), reason, &error, task);
                    return Executed::Done(Box::pin(dead.instrument(span)).await);
                }
            };
            // The failure is recorded before the backoff: a release during
            // the backoff must not forget it.
            let (ran, failed) = (Deliveries::Runs(entry.attempt), Some(entry.failures));
            let in_place = self.in_place(&entry, &track, &error, delay);
            let recorded = self.record_attempts(id, ran, failed, in_place.as_ref());
            match Box::pin(recorded.instrument(span.clone())).await {
                Some(Recorded::Yes) => {}
                Some(Recorded::Cancelled) => return Executed::Succeeded(Vec::new()),
                Some(Recorded::NotPending) | None => return Executed::Done(false),
            }
            warn!(parent: &span, error, retry_in = ?delay, "task failed; retried in place");
            self.shared.metrics.retried();
            match Box::pin(self.wait_in_place(delay, track.as_ref())).await {
                Waited::Go => {}
                Waited::Leave => return Executed::Done(false),
                Waited::Cancelled => return Executed::Succeeded(Vec::new()),
            }
            entry.attempt += 1;
        }
    }

    /// Calls the handler service, with its metrics.
    async fn call(
        &self,
        entry: &Entry,
        call: Call,
        finished: &AtomicBool,
        tenure: &Arc<dyn Tenure>,
        track: Option<&RunningTask>,
        span: Span,
    ) -> Outcome {
        let metrics = &self.shared.metrics;
        let running = metrics.start(UNIX_EPOCH + entry.enqueued_at);
        let outcome = call_handler(call, finished, &**tenure, track, span).await;
        drop(running);
        metrics.ended(match outcome {
            Outcome::Succeeded(_) => Ended::Ok,
            Outcome::Cancelled => Ended::Cancelled,
            // Not a failure of the task: it runs again on the new owner.
            Outcome::Failed(_, Disposition::Stale) => Ended::Interrupted,
            Outcome::Failed(..) => Ended::Failed,
            Outcome::Interrupted => Ended::Interrupted,
        });
        outcome
    }
}

/// Calls the handler service (a panic is a failed attempt), interrupting
/// it when `tenure`'s cancellation fires; `finished` is the flag its
/// context sets with [`TaskContext::finished`].
async fn call_handler(
    call: Call,
    finished: &AtomicBool,
    tenure: &dyn Tenure,
    track: Option<&RunningTask>,
    span: Span,
) -> Outcome {
    // A user's cancel heard while it waited for its turn (read, so
    // counted running, but not started): it never starts.
    if track.is_some_and(RunningTask::user_cancelled) {
        return Outcome::Cancelled;
    }
    // Tracked, the task's own signal too: a user's cancel, beside the
    // partition's interruption.
    let cancel = tenure.cancel();
    let stopped = async {
        match track {
            Some(track) => track.stopped().await,
            None => cancel.cancelled().await,
        }
    };
    let is_stopped = || track.map_or_else(|| cancel.is_cancelled(), RunningTask::is_stopped);
    // Run inline, a panic caught as a failed attempt; dropping the future
    // is the cancellation (it stops at its next `.await`).
    let handler = AssertUnwindSafe(call.instrument(span)).catch_unwind();
    tokio::pin!(handler);
    let result = tokio::select! {
        biased;
        result = &mut handler => result,
        _ = stopped => {
            // The handler saw the signal (its context shares it): give it
            // a moment to return, then abort it.
            match Box::pin(tokio::time::timeout(CANCEL_GRACE, &mut handler)).await {
                Ok(result) => result,
                // Dropped: done only if it said so before.
                Err(_) if track.is_some_and(|t| t.user_cancelled()) => return Outcome::Cancelled,
                Err(_) if finished.load(Ordering::SeqCst) => return Outcome::Succeeded(None),
                Err(_) => return Outcome::Interrupted,
            }
        }
    };
    // The instance may no longer act on the partition although the
    // cancellation has not fired yet (a lease that lapsed before the
    // driver woke, a drain deadline before its timer): a handler that saw
    // `still_owned()` false and gave up did not fail.
    if !is_stopped() && tenure.holds() {
        return outcome(result);
    }
    // A user's cancel: the task ends `cancelled`, whatever it returned.
    if track.is_some_and(|t| t.user_cancelled()) {
        return Outcome::Cancelled;
    }
    // Interrupted: its cancellation fired before it returned. It runs
    // again with `attempt + 1` (never dead-lettered for it), whatever it
    // returned, unless the handler said its effect was done. A handler
    // that gives up on the signal may well return `Ok(())`. The attempt
    // number counts the run (it may have had effects); the failure count,
    // which `max_attempts` bounds, does not.
    match outcome(result) {
        Outcome::Succeeded(result) if finished.load(Ordering::SeqCst) => Outcome::Succeeded(result),
        _ => Outcome::Interrupted,
    }
}

/// How a handler run's result reads.
fn outcome(result: Result<HandlerResult, Box<dyn Any + Send>>) -> Outcome {
    match result {
        Ok(Ok(result)) => Outcome::Succeeded(result),
        Ok(Err(e)) => Outcome::Failed(e.to_string(), disposition_of(&e)),
        Err(panic) => {
            let message = crate::error::panic_message(&*panic);
            let error = format!("handler panicked: {message}");
            Outcome::Failed(error, Disposition::Backoff)
        }
    }
}
