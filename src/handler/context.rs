//! [`TaskContext`]: what a handler knows about the task it runs and the
//! instance running it, and how it asks whether it may still act (the
//! lease, the stop signal of an interrupted run, the fence), answered
//! from memory.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::assignment::{Assignment, Place};
use crate::entry::TaskId;
use crate::headers::Headers;
use crate::workflow::{BatchId, BatchLink, BatchSummary};

/// What a handler knows about the task it runs and the instance running it.
#[derive(Debug, Clone)]
pub struct TaskContext {
    pub(crate) task_id: TaskId,
    /// The partition key the producer gave, if any.
    pub(crate) key: Option<String>,
    pub(crate) attempt: u32,
    pub(crate) failures: u32,
    pub(crate) partition: u32,
    pub(crate) enqueued_at: SystemTime,
    pub(crate) place: Place,
    pub(crate) fencing_token: u64,
    /// The task's cancellation and whether the instance still holds the
    /// partition: one per partition, shared by its tasks (a clone per task
    /// is one reference count, not a token of its own).
    pub(crate) tenure: Arc<dyn Tenure>,
    /// Set by [`TaskContext::finished`].
    pub(crate) finished: Arc<AtomicBool>,
    /// With tracking on (docs/design.md §14): the task's user-cancel
    /// signal and its progress.
    pub(crate) tracked: Option<TrackedAt>,
    /// The task's headers (docs/design.md §18).
    pub(crate) headers: Headers,
    /// A batch member's batch, or a batch callback's summary (§19).
    pub(crate) batch: Option<Arc<BatchLink>>,
}

/// Why a task's [`cancelled`](TaskContext::cancelled) signal fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// A user cancelled the task (`peerq task cancel`, the dashboard,
    /// [`Service::cancel`](crate::admin::Service::cancel)): it ends
    /// `cancelled`, never retried nor dead-lettered.
    User,
    /// The run is interrupted (a drain timeout, a lapsed lease, a fence, a
    /// leave at once): the task runs again, on the partition's next owner.
    Interrupted,
}

/// A tracked task in its context: the tracked tasks of its batch (one
/// allocation for them all) and which one it is.
#[derive(Debug, Clone)]
pub(crate) struct TrackedAt {
    pub(crate) tasks: Arc<dyn Tracker>,
    pub(crate) at: usize,
}

/// What a tracked task's context asks of the instance running it, of the
/// task `at` of a batch: its user-cancel signal and where its progress
/// goes.
pub(crate) trait Tracker: fmt::Debug + Send + Sync {
    /// Fires on a user's cancel or on an interruption.
    fn either(&self, at: usize) -> &CancellationToken;
    /// Whether `either` fired (answered without making it).
    fn is_cancelled(&self, at: usize) -> bool;
    /// Whether a user cancelled the task.
    fn user_cancelled(&self, at: usize) -> bool;
    /// The service's codec's name (progress is encoded with it).
    fn codec(&self) -> &'static str;
    /// Records the task's progress, encoded.
    fn progress(self: Arc<Self>, at: usize, value: Vec<u8>);
}

/// What [`TaskContext::still_owned`] asks: the task's cancellation, the
/// instance's lease and whether Redis refused a write of the partition.
/// Answered from memory, never from Redis.
pub(crate) trait Tenure: fmt::Debug + Send + Sync {
    /// Fires when the task's run is being interrupted.
    fn cancel(&self) -> &CancellationToken;
    /// The lease holds now and the partition was not fenced.
    fn holds(&self) -> bool;
    /// The service's name.
    fn service(&self) -> &str;
    /// The indexer's round interval: a lease lasts about one and a half.
    fn interval(&self) -> Duration;
}

/// A task outside a consumer (a unit test of a handler): cancelled only
/// by its token, and always held otherwise.
#[derive(Debug)]
struct Alone {
    cancel: CancellationToken,
    service: String,
}

impl Tenure for Alone {
    fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    fn holds(&self) -> bool {
        true
    }

    fn service(&self) -> &str {
        &self.service
    }

    fn interval(&self) -> Duration {
        crate::indexer::DEFAULT_INTERVAL
    }
}

impl TaskContext {
    /// A context for unit tests of a handler: first attempt, no failures,
    /// partition 0, instance 1 of 1, never interrupted unless `cancel` is
    /// cancelled.
    ///
    /// ```
    /// let cx = peerq::TaskContext::for_test("task-1", tokio_util::sync::CancellationToken::new());
    /// assert_eq!(cx.attempt(), 1);
    /// ```
    pub fn for_test(task_id: &str, cancel: CancellationToken) -> Self {
        TaskContext {
            task_id: TaskId::from(task_id),
            key: None,
            attempt: 1,
            failures: 0,
            partition: 0,
            enqueued_at: SystemTime::now(),
            place: Assignment::modulo(1, 1, 1).place(),
            fencing_token: 1,
            tenure: Arc::new(Alone {
                cancel,
                service: "test".to_owned(),
            }),
            finished: Arc::default(),
            tracked: None,
            headers: Headers::new(),
            batch: None,
        }
    }

    /// For tests: this context with `headers`.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// For tests: this context in service `service` (a context made by
    /// [`for_test`](Self::for_test) is in service `"test"`).
    pub fn with_service(mut self, service: &str) -> Self {
        self.tenure = Arc::new(Alone {
            cancel: self.tenure.cancel().clone(),
            service: service.to_owned(),
        });
        self
    }

    /// For tests: this context in `partition`, owned with `fencing_token`
    /// (a context made by [`for_test`](Self::for_test) is in partition 0
    /// with token 1), as a handler sees it after a handover.
    ///
    /// ```
    /// let cx = peerq::TaskContext::for_test("t", Default::default()).with_partition(3, 42);
    /// assert_eq!((cx.partition(), cx.fencing_token()), (3, 42));
    /// ```
    pub fn with_partition(mut self, partition: u32, fencing_token: u64) -> Self {
        self.partition = partition;
        self.fencing_token = fencing_token;
        self
    }

    /// The task's id.
    pub fn task_id(&self) -> &TaskId {
        &self.task_id
    }

    /// The task's headers, as the producer set them
    /// ([`Options::header`](crate::Options::header)), through every retry,
    /// hand-back and replay.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The batch this task is a member of ([`OpenBatch::add`]), if any:
    /// its end counts there once, whatever runs it.
    ///
    /// [`OpenBatch::add`]: crate::producer::OpenBatch::add
    pub fn batch(&self) -> Option<&BatchId> {
        self.batch.as_deref()?.member_of.as_ref()
    }

    /// For a batch's callback (a flow's parent): how the batch's members
    /// ended. `None` for any other task.
    pub fn batch_summary(&self) -> Option<&BatchSummary> {
        self.batch.as_deref()?.summary.as_ref()
    }

    /// For a flow's parent: each child's task id and result (its handler's
    /// output, encoded with the service's codec: decode it with the same
    /// codec, `Bincode.decode(..)` or `Json.decode(..)`); children that
    /// returned nothing are not listed. Empty for any other task.
    pub fn batch_results(&self) -> &[(TaskId, Vec<u8>)] {
        self.batch.as_deref().map_or(&[], |b| b.results.as_slice())
    }

    /// For a chain's step after the first: the step before's result
    /// (encoded with the service's codec, as [`batch_results`] says);
    /// `None` for the first step and any other task.
    ///
    /// [`batch_results`]: Self::batch_results
    pub fn previous_result(&self) -> Option<&[u8]> {
        self.batch.as_deref()?.previous_result.as_deref()
    }

    /// The partition key the producer gave ([`Options::key`]), if any:
    /// tasks with one key run in its partition, in enqueue order.
    ///
    /// [`Options::key`]: crate::Options::key
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Which run of the task this is, from 1. Above 1, the task may have
    /// run before (failed, interrupted by a drain or a lapsed lease, or
    /// lost with a crashed instance), never that it did: a run that ended
    /// before it started counts nothing.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How many earlier runs of the task failed (returned an error or
    /// panicked). Only failures spend the consumer's `max_attempts`: a task
    /// is dead-lettered when its `max_attempts`-th run fails, however many
    /// runs were interrupted (`attempt() - 1 - failures()` at most, some of
    /// which may have finished their work). The backoff grows with it too.
    ///
    /// ```
    /// let cx = peerq::TaskContext::for_test("t", Default::default());
    /// assert_eq!((cx.attempt(), cx.failures()), (1, 0));
    /// ```
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The partition the task is in, within its generation
    /// ([`generation`](Self::generation)): with priority levels, every
    /// level's (docs/design.md §17).
    pub fn partition(&self) -> u32 {
        crate::partition::index_of(self.partition)
    }

    /// The generation of the service's partitions the task runs in: 0
    /// until the service is first resharded, then one more per reshard
    /// (docs/design.md §21). A partition number names a partition within
    /// its generation only.
    pub fn generation(&self) -> u32 {
        crate::partition::generation_of(self.partition)
    }

    /// The partition as its keys name it (the generation's unit): the
    /// Postgres inbox's fences are per unit.
    #[cfg(feature = "postgres")]
    pub(crate) fn unit(&self) -> u32 {
        self.partition
    }

    /// When the task was enqueued (millisecond precision).
    pub fn enqueued_at(&self) -> SystemTime {
        self.enqueued_at
    }

    /// This instance's index, from 1, under the assignment in force.
    pub fn index(&self) -> u32 {
        self.place.index
    }

    /// The number of instances, under the assignment in force.
    pub fn replicas(&self) -> u32 {
        self.place.replicas
    }

    /// The epoch of the assignment in force when the task was fetched.
    pub fn epoch(&self) -> u64 {
        self.place.epoch
    }

    /// The fencing token: the epoch in which this instance acquired the
    /// partition, as in its owner record (docs/design.md §4 rule 9); strictly
    /// increasing per partition.
    ///
    /// peerq fences its own writes (acks, retries, dead letters) with it. A
    /// handler whose process may freeze mid-task (a GC pause, a VM stall)
    /// for longer than its lease can resume while the partition's new owner
    /// already runs the partition; only a token checked where the handler
    /// writes makes that safe. Store it with the write and refuse writes
    /// carrying an older one:
    ///
    /// ```no_run
    /// use peerq::{Handler, HandlerError, TaskContext};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct SetBalance { account: String, cents: i64 }
    ///
    /// struct Ledger { db: Db }
    /// # struct Db;
    /// # impl Db { async fn execute(&self, _sql: &str, _args: (i64, u64, &str)) -> Result<u64, std::io::Error> { Ok(1) } }
    ///
    /// impl Handler for Ledger {
    ///     type Task = SetBalance;
    ///     async fn handle(&self, task: SetBalance, cx: TaskContext) -> Result<(), HandlerError> {
    ///         // Written only if no newer owner of this partition wrote first.
    ///         let written = self.db.execute(
    ///             "UPDATE accounts SET cents = $1, token = $2 WHERE id = $3 AND token <= $2",
    ///             (task.cents, cx.fencing_token(), &task.account),
    ///         ).await.map_err(HandlerError::msg)?;
    ///         if written == 0 {
    ///             return Err(HandlerError::msg("fenced: a newer owner of the partition wrote first"));
    ///         }
    ///         Ok(())
    ///     }
    /// }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The name of the service the task belongs to (`"test"` in a context
    /// made by [`for_test`](Self::for_test)).
    pub fn service(&self) -> &str {
        self.tenure.service()
    }

    /// The indexer's round interval: a lease lasts about one and a half.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn interval(&self) -> Duration {
        self.tenure.interval()
    }

    /// Whether the handler's stop signal has fired: the run is being
    /// interrupted (a drain timeout, a lapsed lease, a fence, a leave at
    /// once). Finish or give up quickly: the run counts as interrupted
    /// (not as failed) unless the handler called [`finished`], and the task
    /// runs again.
    ///
    /// [`finished`]: TaskContext::finished
    ///
    /// With tracking on, it fires on a user's cancel too: see
    /// [`cancel_reason`](Self::cancel_reason).
    pub fn is_cancelled(&self) -> bool {
        match &self.tracked {
            Some(t) => t.tasks.is_cancelled(t.at),
            None => self.tenure.cancel().is_cancelled(),
        }
    }

    /// Resolves when the handler's stop signal fires: the run is being
    /// interrupted, or a user cancelled the task (see
    /// [`is_cancelled`](Self::is_cancelled)).
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.signal().cancelled()
    }

    /// Why the stop signal fired: a user's cancel or an interruption;
    /// `None` while it has not.
    ///
    /// ```
    /// use peerq::handler::CancelReason;
    /// let stop = tokio_util::sync::CancellationToken::new();
    /// let cx = peerq::TaskContext::for_test("t", stop.clone());
    /// assert_eq!(cx.cancel_reason(), None);
    /// stop.cancel();
    /// assert_eq!(cx.cancel_reason(), Some(CancelReason::Interrupted));
    /// ```
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        match &self.tracked {
            Some(t) if t.tasks.user_cancelled(t.at) => Some(CancelReason::User),
            _ if self.is_cancelled() => Some(CancelReason::Interrupted),
            _ => None,
        }
    }

    /// Reports the task's progress (any serde value: a percentage, a
    /// count, a step's name), readable with its state (`peerq task show`,
    /// [`Service::task`](crate::admin::Service::task)). Written at most
    /// every 250 ms per task, the last value always (before the task's
    /// end is written); it never waits for Redis. Without tracking, or
    /// for a value the service's codec cannot encode, it does nothing.
    ///
    /// ```
    /// let cx = peerq::TaskContext::for_test("t", Default::default());
    /// cx.progress(&50u8); // not tracked: nothing to write
    /// ```
    pub fn progress<P: serde::Serialize + ?Sized>(&self, value: &P) {
        let Some(tracked) = &self.tracked else {
            return;
        };
        let encoded = match tracked.tasks.codec() {
            "json" => crate::codec::Codec::encode(&crate::codec::Json, &value),
            _ => crate::codec::Codec::encode(&crate::codec::Bincode, &value),
        };
        match encoded {
            Ok(bytes) => tracked.tasks.clone().progress(tracked.at, bytes),
            Err(e) => tracing::warn!(task = %self.task_id, cause = %e, "progress not encoded"),
        }
    }

    /// The signal the handler waits on: with tracking, the task's own
    /// (user cancel or interruption), else the partition's.
    fn signal(&self) -> &CancellationToken {
        match &self.tracked {
            Some(t) => t.tasks.either(t.at),
            None => self.tenure.cancel(),
        }
    }

    /// Whether this instance may still act on the task: its lease holds,
    /// the run is not being interrupted, and Redis has not refused a write
    /// of the partition. It stays true while the partition drains (a
    /// release lets running tasks finish). Answered from memory (the
    /// lease's end by the monotonic and the wall clock), with no Redis
    /// round trip, so it is cheap enough to call right before every
    /// external effect: a process that resumes from a freeze longer than
    /// its lease sees `false` at once, even if its own timer fired in the
    /// same instant.
    ///
    /// It narrows the window for a stale effect to the instant between the
    /// check and the effect; a freeze can still land in between, and only
    /// the [fencing token](TaskContext::fencing_token) checked where the
    /// effect is written closes it.
    ///
    /// ```
    /// # use peerq::{HandlerError, TaskContext};
    /// # fn send(_to: &str) {}
    /// fn deliver(to: &str, cx: &TaskContext) -> Result<(), HandlerError> {
    ///     if !cx.still_owned() {
    ///         // The partition's next owner runs the task.
    ///         return Err(HandlerError::msg("no longer the partition's owner"));
    ///     }
    ///     send(to);
    ///     cx.finished();
    ///     Ok(())
    /// }
    /// # let cx = TaskContext::for_test("t", Default::default());
    /// # deliver("a@example.com", &cx).unwrap();
    /// ```
    pub fn still_owned(&self) -> bool {
        !self.is_cancelled() && self.tenure.holds()
    }

    /// Says that the task's effect is done, so the run counts as a success
    /// even if it is interrupted before the handler returns.
    ///
    /// A run that is interrupted (drain timeout, lapsed lease, fence: its
    /// [`cancelled`](Self::cancelled) signal fires) before it returned, or
    /// that returned while [`still_owned`] was false, runs again with
    /// `attempt + 1`, whatever it returns: returning `Ok(())` from an
    /// interrupted run does not mean the work was done. A handler whose
    /// effect completed anyway calls this right after the effect; that run
    /// is then acked (if Redis still accepts the partition's writes), also
    /// when the handler is dropped after the signal's grace of 20 ms.
    ///
    /// [`still_owned`]: TaskContext::still_owned
    pub fn finished(&self) {
        self.finished.store(true, Ordering::SeqCst);
    }
}
