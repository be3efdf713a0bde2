//! What a tracked task holds while it runs: its user-cancel signal (beside
//! the interruption signal every task has) and its progress, written at
//! most every 250 ms, the last value always (docs/design.md §14).
//!
//! A batch's tracked tasks are registered together, as one [`Tracks`]: one
//! allocation and one lock of the registry per batch, and a cancel heard
//! on `{N}:cancels` (rare) looks for its task among the batches. A task's
//! own signal, the child of its partition's interruption signal that a
//! handler waits on with `cx.cancelled()`, is made only when the handler
//! asks for it; the run waits on the partition's signal and the task's
//! user-cancel flag. A map entry and two signals per task, made and
//! dropped as each task started and ended, cost about a tenth of the
//! instance's CPU in a tracked consume (BENCHMARKS.md, "Task tracking").

use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::store::{PartitionStore, Succeeded};
use crate::entry::{self, TaskId};
use crate::handler::Tracker;

/// How often a task's progress is written at most.
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// The tracked tasks that run on this instance, a batch at a time: where a
/// cancel heard on `{N}:cancels` finds its task.
#[derive(Debug, Default)]
pub(crate) struct Running {
    batches: Mutex<Vec<Arc<Tracks>>>,
}

/// The tracked tasks of one batch, and their partition's store (where
/// their cancel requests are, and their progress goes).
#[derive(Debug)]
pub(crate) struct Tracks {
    store: Arc<PartitionStore>,
    /// The partition's interruption signal.
    interrupt: CancellationToken,
    codec: &'static str,
    tasks: Vec<Task>,
}

/// One tracked task while it runs.
#[derive(Debug)]
struct Task {
    id: TaskId,
    /// Its attempt's, which an ordered task's retry in place renews.
    run: Mutex<Run>,
    /// Its run here ended: a cancel no longer looks at it.
    ended: AtomicBool,
    /// A user cancelled it. Set before `either` is looked at, and read
    /// after `either` is made, each behind a fence, so that one of the two
    /// fires the signal (`RunningTask::cancel`, `Tracks::either`).
    user: AtomicBool,
    /// Wakes a run waiting for `user` ([`RunningTask::stopped`]).
    woken: Notify,
    /// The handler's signal (a user's cancel or the partition's
    /// interruption), made when first asked for.
    either: OnceLock<CancellationToken>,
    /// Made by the first progress it reports (most tasks report none, and
    /// a batch's tasks are one allocation: it stays small).
    progress: OnceLock<Box<Writes>>,
}

/// A task's progress and its writes.
#[derive(Debug, Default)]
struct Writes {
    progress: Mutex<Progress>,
    /// Held while a progress write is underway, so the last one is never
    /// overtaken by an earlier one, and the end waits for it.
    writing: tokio::sync::Mutex<()>,
}

/// What a tracked task runs as, for its final record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) attempt: u32,
    /// Unix ms, this instance's clock.
    pub(crate) started_at: u64,
    /// As its entry says (Unix ms).
    pub(crate) enqueued_at: u64,
}

/// A task's progress not yet written, the last written, and when that was.
#[derive(Debug, Default)]
struct Progress {
    pending: Option<Vec<u8>>,
    written: Option<Vec<u8>>,
    last: Option<Instant>,
    /// A writer task is underway.
    writer: bool,
}

/// One tracked task of a batch (a clone shares it).
#[derive(Debug, Clone)]
pub(crate) struct RunningTask {
    tracks: Arc<Tracks>,
    at: usize,
}

/// A batch's tracked tasks, registered until this is dropped.
#[derive(Debug)]
pub(crate) struct Registered {
    running: Arc<Running>,
    tracks: Arc<Tracks>,
}

impl Running {
    /// Registers `tasks` (their ids and runs), of one batch of the
    /// partition of `store`, run under its `interrupt` signal.
    pub(crate) fn register(
        self: &Arc<Self>,
        store: Arc<PartitionStore>,
        interrupt: &CancellationToken,
        codec: &'static str,
        tasks: impl IntoIterator<Item = (TaskId, Run)>,
    ) -> Registered {
        let tasks = tasks.into_iter().map(|(id, run)| Task {
            id,
            run: Mutex::new(run),
            ended: AtomicBool::new(false),
            user: AtomicBool::new(false),
            woken: Notify::new(),
            either: OnceLock::new(),
            progress: OnceLock::new(),
        });
        let tracks = Arc::new(Tracks {
            store,
            interrupt: interrupt.clone(),
            codec,
            tasks: tasks.collect(),
        });
        self.lock().push(tracks.clone());
        Registered {
            running: self.clone(),
            tracks,
        }
    }

    /// Task `id`, if it runs here.
    pub(crate) fn find(&self, id: &str) -> Option<RunningTask> {
        let batches = self.lock();
        batches.iter().find_map(|tracks| {
            let at = tracks
                .tasks
                .iter()
                .position(|task| task.id.as_str() == id && !task.ended.load(Ordering::Relaxed))?;
            Some(RunningTask {
                tracks: tracks.clone(),
                at,
            })
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Tracks>>> {
        self.batches.lock().expect("not poisoned")
    }
}

impl Registered {
    /// Its task `at` (in the order they were registered).
    pub(crate) fn task(&self, at: usize) -> RunningTask {
        RunningTask {
            tracks: self.tracks.clone(),
            at,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut batches = self.running.lock();
        if let Some(i) = batches.iter().position(|t| Arc::ptr_eq(t, &self.tracks)) {
            batches.swap_remove(i);
        }
    }
}

impl Tracks {
    fn task(&self, at: usize) -> &Task {
        &self.tasks[at]
    }
}

impl Tracker for Tracks {
    fn either(&self, at: usize) -> &CancellationToken {
        let task = self.task(at);
        let signal = task.either.get_or_init(|| self.interrupt.child_token());
        fence(Ordering::SeqCst);
        if task.user.load(Ordering::Relaxed) {
            signal.cancel();
        }
        signal
    }

    fn is_cancelled(&self, at: usize) -> bool {
        self.interrupt.is_cancelled() || self.user_cancelled(at)
    }

    fn user_cancelled(&self, at: usize) -> bool {
        self.task(at).user.load(Ordering::SeqCst)
    }

    fn codec(&self) -> &'static str {
        self.codec
    }

    /// Written now if the last write is 250 ms old, else when it is; a
    /// newer value replaces one not yet written.
    fn progress(self: Arc<Self>, at: usize, value: Vec<u8>) {
        let writes = self.task(at).progress.get_or_init(Box::default);
        let mut progress = writes.progress.lock().expect("not poisoned");
        progress.pending = Some(value);
        if progress.writer {
            return;
        }
        progress.writer = true;
        drop(progress);
        let task = RunningTask { tracks: self, at };
        tokio::spawn(task.write_progress());
    }
}

impl RunningTask {
    fn task(&self) -> &Task {
        self.tracks.task(self.at)
    }

    /// Its progress and writes, once it reported any.
    fn writes(&self) -> Option<&Writes> {
        self.task().progress.get().map(|w| &**w)
    }

    /// Whether a user cancelled it.
    pub(crate) fn user_cancelled(&self) -> bool {
        self.tracks.user_cancelled(self.at)
    }

    /// Whether its run is to stop: a user's cancel or the partition's
    /// interruption.
    pub(crate) fn is_stopped(&self) -> bool {
        self.tracks.is_cancelled(self.at)
    }

    /// Resolves when its run is to stop: a user's cancel or the
    /// partition's interruption.
    pub(crate) async fn stopped(&self) {
        let task = self.task();
        let user = async {
            let woken = task.woken.notified();
            tokio::pin!(woken);
            // Listening before the flag is read: a cancel after the read
            // wakes it.
            woken.as_mut().enable();
            if !task.user.load(Ordering::SeqCst) {
                woken.await;
            }
        };
        tokio::select! {
            _ = self.tracks.interrupt.cancelled() => {}
            _ = user => {}
        }
    }

    /// A user's cancel: fires its signals.
    fn cancel(&self) {
        let task = self.task();
        task.user.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if let Some(signal) = task.either.get() {
            signal.cancel();
        }
        task.woken.notify_waiters();
    }

    /// Fires the signals of those of `tasks` that have a cancel request in
    /// Redis (a message on `{N}:cancels` alone stops nothing: it would end
    /// the task `succeeded` with no result, as its ack finds no request),
    /// all at once after every request was read. If Redis cannot say, they
    /// fire: a real cancel is not held back, and the task's end still
    /// reads the truth.
    pub(crate) async fn fire_all_if_requested(tasks: Vec<RunningTask>) {
        let reads = tasks
            .iter()
            .map(|task| task.tracks.store.cancel_requested(task.task().id.as_str()));
        let requested = futures_util::future::join_all(reads).await;
        for (task, requested) in tasks.iter().zip(requested) {
            let id = task.task().id.as_str();
            match requested {
                Ok(false) => {
                    warn!(
                        task = id,
                        "a cancel message without a cancel request; the task goes on"
                    );
                    continue;
                }
                Ok(true) => debug!(task = id, "cancelled by a user"),
                Err(e) => {
                    debug!(task = id, cause = %e, "cancel request not read; cancelled all the same")
                }
            }
            task.cancel();
        }
    }

    /// Its run here ended: a cancel heard from now on does not look at it.
    pub(crate) fn ended(&self) {
        self.task().ended.store(true, Ordering::Relaxed);
    }

    /// For its context: the batch's tasks and which one it is.
    pub(crate) fn tracked_at(&self) -> crate::handler::TrackedAt {
        crate::handler::TrackedAt {
            tasks: self.tracks.clone(),
            at: self.at,
        }
    }

    /// Writes pending progress until none is left, at most every 250 ms.
    async fn write_progress(self) {
        let Some(writes) = self.writes() else {
            return;
        };
        loop {
            let last = writes.progress.lock().expect("not poisoned").last;
            if let Some(last) = last {
                tokio::time::sleep_until(last + PROGRESS_EVERY).await;
            }
            if !self.write_pending().await {
                let mut progress = writes.progress.lock().expect("not poisoned");
                // Checked under the lock `progress` sets values under: a
                // value that came in meanwhile is written by this loop.
                if progress.pending.is_none() {
                    progress.writer = false;
                    return;
                }
            }
        }
    }

    /// Writes the pending value, if any; false when there was none.
    async fn write_pending(&self) -> bool {
        let (task, Some(writes)) = (self.task(), self.writes()) else {
            return false;
        };
        let _writing = writes.writing.lock().await;
        let Some(value) = writes.progress.lock().expect("not poisoned").pending.take() else {
            return false;
        };
        writes.progress.lock().expect("not poisoned").last = Some(Instant::now());
        match self.tracks.store.progress(task.id.as_str(), &value).await {
            Ok(true) => writes.progress.lock().expect("not poisoned").written = Some(value),
            Ok(false) => {}
            Err(e) => debug!(task = %task.id, cause = %e, "progress not written"),
        }
        true
    }

    /// How it ended, `succeeded` with `result` (encoded; empty for none),
    /// now, for its ack, which writes its whole final record (its other
    /// fields too, docs/design.md §14). Its last progress goes with it:
    /// nothing writes any after its end.
    pub(crate) fn succeeded(&self, result: Vec<u8>) -> Succeeded {
        let task = self.task();
        let written = self
            .writes()
            .map(|w| w.progress.lock().expect("not poisoned"));
        let progress = written.and_then(|mut p| p.written.take());
        let run = *task.run.lock().expect("not poisoned");
        Succeeded {
            task: task.id.clone(),
            attempt: run.attempt,
            started_at: run.started_at,
            enqueued_at: run.enqueued_at,
            finished_at: entry::now_ms(),
            progress,
            result,
        }
    }

    /// An ordered task's next attempt starts in place, at `started_at`.
    pub(crate) fn restarted(&self, attempt: u32, started_at: u64) {
        let mut run = self.task().run.lock().expect("not poisoned");
        run.attempt = attempt;
        run.started_at = started_at;
    }

    /// Whether a progress write is underway or waits: then its end must
    /// wait for it ([`flush`](Self::flush)).
    pub(crate) fn writes_progress(&self) -> bool {
        self.writes()
            .is_some_and(|w| w.progress.lock().expect("not poisoned").writer)
    }

    /// Before the task's end is written: its last progress lands first.
    pub(crate) async fn flush(&self) {
        self.write_pending().await;
    }
}

#[cfg(test)]
mod tests;
