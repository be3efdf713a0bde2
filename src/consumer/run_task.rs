//! Runs one fetched entry to its outcome: acked, enqueued again (a retry,
//! a cancellation, a hand-back) or moved to the dead letters. Each of these
//! writes is fenced: a partition that has a newer owner refuses it, and the
//! entry stays pending for that owner.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, streams::StreamId};
use futures_util::FutureExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{Instrument, Span, error, info_span, warn};

use super::acker::{Ack, Acked};
use super::held::Held;
use super::lease::Lease;
use super::ownership::Ownership;
use super::{Payload, Shared, TaskService};
use crate::assignment::Assignment;
use crate::codec::Codec;
use crate::dead_letters::added;
use crate::fencing::Moved;
use crate::handler::{Disposition, Standing, Task, TaskContext, disposition_of};
use crate::keys;
use crate::task::Entry;

/// How long a cancelled handler may take to notice its cancellation signal
/// and return before it is aborted. Kept within the 50 ms that docs/design.md §4
/// allows for cancellation latency.
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
pub(crate) struct RunTask<T, S, C> {
    pub(crate) shared: Arc<Shared<T, S, C>>,
    pub(crate) partition: u32,
    pub(crate) assignment: Assignment,
    pub(crate) lease: Lease,
    /// The partition as this worker owns it. Its `stop` is the partition's
    /// release: a task not started by then is handed back.
    pub(crate) ownership: Arc<Ownership>,
    /// Fires at the drain timeout, a lapsed lease or a fence.
    pub(crate) cancel: CancellationToken,
    pub(crate) held: Held,
    /// Whether the entry is no longer pending: acked, or moved (retried,
    /// dead-lettered, handed back).
    pub(crate) settled: AtomicBool,
    /// Read from the pending list rather than new: in ordered mode its
    /// attempt number comes from Redis's delivery count too.
    pub(crate) redelivered: bool,
}

impl<T: Payload, S: TaskService<T>, C: Codec> RunTask<T, S, C> {
    /// Runs `raw` to its outcome; true if the entry is no longer pending
    /// (false: left for this instance's or the next owner's pending list).
    pub(crate) async fn run(self, raw: StreamId) -> bool {
        let stream_id = raw.id.clone();
        // Wait for room, and for the lease (rule 6: nothing fetched runs
        // without one); a task that has not started when its partition is
        // released is handed back instead of making the drain wait for it.
        let stop = &self.ownership.stop;
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            permit = self.shared.permits.clone().acquire_owned() => Some(permit.expect("never closed")),
        };
        let permit = match permit {
            Some(permit) if !self.lease.valid() => tokio::select! {
                biased;
                _ = stop.cancelled() => None,
                _ = self.lease.held() => Some(permit),
            },
            permit => permit,
        };
        match permit {
            Some(permit) => {
                let acked = self.execute(raw).await;
                drop(permit);
                // Held until the ack has landed: re-reading the pending list
                // before that must not run the task again.
                if let Some(acked) = acked {
                    match acked.await {
                        Ok(Acked::Yes) => self.settled.store(true, Ordering::SeqCst),
                        Ok(Acked::Fenced) => self.ownership.fenced("acking"),
                        _ => {}
                    }
                }
            }
            // Ordered: left pending, so the next owner runs it first.
            None if self.ordered() => {}
            None => self.hand_back(raw).await,
        }
        let settled = self.settled.load(Ordering::SeqCst);
        self.held.release(&stream_id, settled);
        settled
    }

    /// Ordered mode keeps a task in place, so its entry's attempt number is
    /// not rewritten: Redis's delivery count of the entry holds it instead.
    /// The first read counts 1; each attempt after the first is recorded
    /// as it starts ([`Fence::record_attempt`]); every later delivery (a
    /// re-read of the pending list, here or on the next owner after a
    /// crash, a cancellation, a lost ack or a handover) counts one more,
    /// the attempt that may have run. Claims leave the count alone. 0 when
    /// the entry is not pending any more; `None` when Redis does not say.
    ///
    /// [`Fence::record_attempt`]: crate::fencing::Fence::record_attempt
    async fn deliveries(&self, id: &str) -> Option<u32> {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(self.ownership.fence.stream())
            .arg(keys::GROUP)
            .arg(id)
            .arg(id)
            .arg(1);
        match self
            .shared
            .conn
            .query::<redis::streams::StreamPendingCountReply>(&cmd)
            .await
        {
            Ok(reply) => Some(
                reply
                    .ids
                    .first()
                    .map_or(0, |p| u32::try_from(p.times_delivered).unwrap_or(u32::MAX)),
            ),
            Err(e) => {
                warn!(partition = self.partition, cause = %e, "cannot read the delivery count");
                None
            }
        }
    }

    /// Ordered: records in Redis that `attempt` of the entry starts now, so
    /// the partition's next owner continues the count. False when the task
    /// must not run now: the partition has a newer owner, the entry is not
    /// pending any more, or Redis did not answer (the entry stays pending
    /// and is read again, which counts one more, rather than run with an
    /// attempt Redis does not know).
    async fn record_attempt(&self, id: &str, attempt: u32) -> bool {
        let fence = &self.ownership.fence;
        let consumer = self.shared.id.as_str();
        match fence
            .record_attempt(&self.shared.conn, consumer, id, attempt)
            .await
        {
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

    /// Ordered partitions (docs/design.md §5.4): one task at a time, in stream
    /// order; nothing is enqueued again at the stream's end.
    fn ordered(&self) -> bool {
        self.shared.settings.ordered
    }

    /// An entry claimed from another consumer (a crashed or fenced
    /// instance, a lost ack): it may have run there, so it is enqueued
    /// again with `attempt + 1` (docs/design.md §5.3: a task that may run twice
    /// says so in its attempt number) and runs when fetched. One too large
    /// or that does not parse goes where `run` sends it (the dead letters).
    pub(crate) async fn take_over(self, raw: StreamId) {
        let Ok(entry) = Entry::read(&raw.map, self.shared.settings.max_entry_bytes) else {
            self.run(raw).await;
            return;
        };
        let next = Entry {
            attempt: entry.attempt + 1,
            ..entry
        };
        let stream = self.ownership.fence.stream();
        self.move_entry(
            stream,
            &raw.id,
            &next.fields(),
            "taking over a claimed entry",
        )
        .await;
        self.held
            .release(&raw.id, self.settled.load(Ordering::SeqCst));
    }

    /// Runs the entry; on success returns the ack's confirmation.
    async fn execute(&self, raw: StreamId) -> Option<oneshot::Receiver<Acked>> {
        // Rule 6, as late as possible: waiting for room may have outlived
        // the lease (a frozen process resumes here, say).
        if !self.lease.valid() {
            if !self.ordered() {
                self.hand_back(raw).await;
            }
            return None;
        }
        // Dead-lettered as it was: too large (never decoded) or malformed.
        let entry = match Entry::read(&raw.map, self.shared.settings.max_entry_bytes) {
            Ok(entry) => entry,
            Err(e) => {
                self.dead_letter(&raw, None, e.reason(), &e.to_string())
                    .await;
                return None;
            }
        };
        let mut entry = entry;
        // Ordered: the attempt Redis has counted for the entry (a new read
        // counts 1).
        let mut counted = 1;
        if self.ordered() && self.redelivered {
            // Unknown, it could be higher than the entry says: left pending
            // and read again (which counts one more) rather than run with
            // an attempt that goes back.
            counted = self.deliveries(&raw.id).await?;
            // Not pending any more: it finished meanwhile.
            if counted == 0 {
                return None;
            }
            entry.attempt = entry.attempt.max(counted);
        }
        loop {
            let payload: T = match entry.decode(&self.shared.codec) {
                Ok(payload) => payload,
                Err(e) => {
                    self.dead_letter(&raw, Some(&entry), e.reason(), &e.to_string())
                        .await;
                    return None;
                }
            };
            let span = info_span!(
                "task",
                task_id = %entry.id,
                partition = self.partition,
                attempt = entry.attempt,
                epoch = self.assignment.epoch
            );
            if self.ordered() && entry.attempt > counted {
                if !self.record_attempt(&raw.id, entry.attempt).await {
                    return None;
                }
                counted = entry.attempt;
            }
            match self.call(&entry, payload, span.clone()).await {
                Outcome::Succeeded => {
                    let (done, acked) = oneshot::channel();
                    let _ = self.shared.acks.send(Ack {
                        fence: self.ownership.fence.clone(),
                        id: raw.id.clone(),
                        done,
                    });
                    return Some(acked);
                }
                // Ordered: retried in place after its backoff, blocking the
                // partition, so tasks with one key keep their order.
                Outcome::Failed(error, disposition) if self.ordered() => {
                    let delay = match self.next_attempt(&entry, &error, disposition) {
                        Ok(delay) => delay,
                        Err(reason) => {
                            self.dead_letter(&raw, Some(&entry), reason, &error)
                                .instrument(span)
                                .await;
                            return None;
                        }
                    };
                    warn!(parent: &span, error, retry_in = ?delay, "task failed; retried in place");
                    // A release meanwhile leaves it pending: the next owner
                    // runs it first.
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
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
                    self.failed(&raw, &entry, &error, disposition)
                        .instrument(span)
                        .await;
                    return None;
                }
                // Ordered: left pending; it runs first on the next owner.
                Outcome::Cancelled if self.ordered() => return None,
                Outcome::Cancelled => {
                    // At once: it runs on the partition's next owner.
                    let why = "cancelled at the drain timeout";
                    self.retry(&raw.id, &entry, why, Duration::ZERO)
                        .instrument(span)
                        .await;
                    return None;
                }
            }
        }
    }

    /// Calls the handler service (a panic is a failed attempt), cancelling
    /// it at the drain timeout.
    async fn call(&self, entry: &Entry, payload: T, span: Span) -> Outcome {
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
            fencing_token: self.ownership.fence.token(),
            cancel: self.cancel.clone(),
            standing: Some(standing.clone()),
            finished: finished.clone(),
        };
        let mut service = self.shared.service.clone();
        // Run inline, a panic caught as a failed attempt; dropping the future
        // is the cancellation (it stops at its next `.await`).
        let handler = AssertUnwindSafe(
            async move {
                let service = service.ready().await.map_err(Into::into)?;
                service.call(Task { payload, cx }).await.map_err(Into::into)
            }
            .instrument(span),
        )
        .catch_unwind();
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

    /// A failed attempt: retried after its backoff (or the delay the error
    /// asked for), or moved to the dead letters after the last attempt or
    /// on a permanent error.
    async fn failed(&self, raw: &StreamId, entry: &Entry, error: &str, disposition: Disposition) {
        match self.next_attempt(entry, error, disposition) {
            Ok(delay) => self.retry(&raw.id, entry, error, delay).await,
            Err(reason) => self.dead_letter(raw, Some(entry), reason, error).await,
        }
    }

    /// After a failed attempt: the delay before the next one, or why there
    /// is none (the dead letters' reason).
    fn next_attempt(
        &self,
        entry: &Entry,
        error: &str,
        disposition: Disposition,
    ) -> Result<Duration, &'static str> {
        let settings = &self.shared.settings;
        match disposition {
            Disposition::Permanent => {
                warn!(error, "task failed permanently; moved to the dead letters");
                Err("permanent")
            }
            _ if entry.attempt >= settings.max_attempts => {
                warn!(
                    error,
                    "task failed its last attempt; moved to the dead letters"
                );
                Err("failed")
            }
            Disposition::RetryAfter(delay) => Ok(delay),
            _ => Ok(settings.backoff.delay(entry.attempt)),
        }
    }

    /// Acks this entry and enqueues the task again with `attempt + 1`
    /// after `delay` (in the partition's delayed set until due), in one
    /// fenced script.
    async fn retry(&self, stream_id: &str, entry: &Entry, why: &str, delay: Duration) {
        warn!(why, retry_in = ?delay, "task enqueued again");
        let next = Entry {
            attempt: entry.attempt + 1,
            ..entry.clone()
        };
        let fence = &self.ownership.fence;
        let retried = fence
            .retry(&self.shared.conn, stream_id, delay, &next.fields())
            .await;
        if matches!(retried, Ok(Moved::Yes)) && !delay.is_zero() {
            self.ownership.delayed.notify_one();
        }
        self.moved(retried, "enqueuing the task again");
    }

    /// Enqueues a fetched but never started entry again as it is, and acks
    /// this copy, so the partition's next owner runs it.
    async fn hand_back(&self, raw: StreamId) {
        let stream = self.ownership.fence.stream();
        self.move_entry(
            stream,
            &raw.id,
            &raw_fields(&raw),
            "handing back an unstarted task",
        )
        .await;
    }

    /// Moves the entry to the partition's dead letters with the reason, and
    /// acks it, in one fenced script.
    async fn dead_letter(&self, raw: &StreamId, entry: Option<&Entry>, reason: &str, error: &str) {
        error!(
            partition = self.partition,
            stream_id = raw.id,
            reason,
            error,
            "entry moved to the dead letters"
        );
        let mut fields: Vec<(String, Vec<u8>)> = match entry {
            Some(entry) => entry
                .fields()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            None => raw_fields(raw),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        fields.push((added::REASON.into(), reason.into()));
        fields.push((added::ERROR.into(), error.into()));
        fields.push((added::STREAM_ID.into(), raw.id.clone().into_bytes()));
        let dead_at = now.as_millis().to_string().into_bytes();
        fields.push((added::DEAD_AT.into(), dead_at));
        let dead = keys::dead(&self.shared.name, self.partition);
        self.move_entry(&dead, &raw.id, &fields, "moving to the dead letters")
            .await;
    }

    /// Acks `stream_id` and adds `fields` to `destination`, fenced. On an
    /// error the entry stays pending, and the partition's owner claims it.
    async fn move_entry<K: redis::ToRedisArgs, V: redis::ToRedisArgs>(
        &self,
        destination: &str,
        stream_id: &str,
        fields: &[(K, V)],
        what: &str,
    ) {
        let fence = &self.ownership.fence;
        let moved = fence
            .move_entry(&self.shared.conn, destination, stream_id, fields)
            .await;
        self.moved(moved, what);
    }

    /// What a fenced write's result means for this worker. On an error the
    /// entry stays pending, and the partition's owner claims it.
    fn moved(&self, moved: crate::Result<Moved>, what: &str) {
        match moved {
            Ok(Moved::Yes | Moved::NotPending) => self.settled.store(true, Ordering::SeqCst),
            Ok(Moved::Fenced) => self.ownership.fenced(what),
            Err(e) => error!(
                partition = self.partition,
                what,
                cause = %e,
                "failed; the entry stays pending and will be claimed"
            ),
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
fn outcome(result: Result<Result<(), crate::handler::BoxError>, Box<dyn Any + Send>>) -> Outcome {
    match result {
        Ok(Ok(())) => Outcome::Succeeded,
        Ok(Err(e)) => Outcome::Failed(e.to_string(), disposition_of(&e)),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let error = format!("handler panicked: {message}");
            Outcome::Failed(error, Disposition::Backoff)
        }
    }
}

/// An entry's fields as they are, whatever they hold.
fn raw_fields(raw: &StreamId) -> Vec<(String, Vec<u8>)> {
    raw.map
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                redis::from_redis_value_ref::<Vec<u8>>(v).unwrap_or_default(),
            )
        })
        .collect()
}
