//! What a tracked task holds while it runs: its user-cancel signal (beside
//! the interruption signal every task has) and its progress, written at
//! most every 250 ms, the last value always (docs/design.md §14).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, debug, warn};

use super::store::PartitionStore;
use crate::config::ServiceName;
use crate::connection::channels::Channels;
use crate::connection::subscriber::{Event, Source};
use crate::entry::{self, TaskId};
use crate::handler::Tracker;
use crate::retry::Pauses;
use crate::tracking::packed;
use crate::tracking::watch::Watched;

/// How often a task's progress is written at most.
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// The tracked tasks that run on this instance, by task id: where a cancel
/// heard on `{N}:cancels` finds its task.
#[derive(Debug, Default)]
pub(crate) struct Running {
    tasks: Mutex<HashMap<TaskId, Signals>>,
}

/// A running task's two signals, and its partition's store (where its
/// cancel request is, and its progress goes).
#[derive(Debug, Clone)]
pub(crate) struct Signals {
    /// Fires on a user's cancel only.
    user: CancellationToken,
    /// Fires on a user's cancel or an interruption: what the handler
    /// waits on (a child of the partition's interruption signal).
    either: CancellationToken,
    store: Arc<PartitionStore>,
}

impl Signals {
    /// Fires both signals if task `id` has a cancel request in Redis (a
    /// message on `{N}:cancels` alone stops nothing: it would end the task
    /// `succeeded` with no result, as its ack finds no request). If Redis
    /// cannot say, they fire: a real cancel is not held back, and the
    /// task's end still reads the truth.
    async fn fire_if_requested(&self, id: &str) {
        match self.store.cancel_requested(id).await {
            Ok(false) => {
                warn!(
                    task = id,
                    "a cancel message without a cancel request; the task goes on"
                );
                return;
            }
            Ok(true) => debug!(task = id, "cancelled by a user"),
            Err(e) => {
                debug!(task = id, cause = %e, "cancel request not read; cancelled all the same")
            }
        }
        self.user.cancel();
        self.either.cancel();
    }
}

impl Running {
    /// Registers task `id`, run under the partition's `interrupt` signal as
    /// `run` says, until the returned handle is dropped.
    pub(crate) fn register(
        self: &Arc<Self>,
        id: &TaskId,
        run: Run,
        interrupt: &CancellationToken,
        store: Arc<PartitionStore>,
        codec: &'static str,
    ) -> Arc<RunningTask> {
        let signals = Signals {
            user: CancellationToken::new(),
            either: interrupt.child_token(),
            store,
        };
        self.tasks
            .lock()
            .expect("not poisoned")
            .insert(id.clone(), signals.clone());
        Arc::new(RunningTask {
            id: id.clone(),
            run: Mutex::new(run),
            signals,
            running: self.clone(),
            codec,
            progress: Mutex::default(),
            writing: tokio::sync::Mutex::new(()),
        })
    }

    /// The signals of task `id`, if it runs here.
    pub(crate) fn find(&self, id: &str) -> Option<Signals> {
        let tasks = self.tasks.lock().expect("not poisoned");
        tasks.get(&TaskId::from(id)).cloned()
    }
}

/// What a tracked task runs as, for its final record.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    /// `instance|token|attempt|started_at` (`PartitionStore::running`).
    pub(crate) ran: String,
    pub(crate) attempt: u32,
    /// As its entry says (Unix ms).
    pub(crate) enqueued_at: u64,
}

/// One tracked task while it runs (shared by its context's clones).
#[derive(Debug)]
pub(crate) struct RunningTask {
    id: TaskId,
    /// Its attempt's, which an ordered task's retry in place renews.
    run: Mutex<Run>,
    signals: Signals,
    running: Arc<Running>,
    codec: &'static str,
    progress: Mutex<Progress>,
    /// Held while a progress write is underway, so the last one is never
    /// overtaken by an earlier one, and the end waits for it.
    writing: tokio::sync::Mutex<()>,
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

impl Drop for RunningTask {
    fn drop(&mut self) {
        let mut tasks = self.running.tasks.lock().expect("not poisoned");
        // Only its own entry: the task may run again (a retry in place)
        // under a newer registration.
        if tasks
            .get(&self.id)
            .is_some_and(|s| s.either == self.signals.either)
        {
            tasks.remove(&self.id);
        }
    }
}

impl Tracker for RunningTask {
    fn either(&self) -> &CancellationToken {
        &self.signals.either
    }

    fn user_cancelled(&self) -> bool {
        self.signals.user.is_cancelled()
    }

    fn codec(&self) -> &'static str {
        self.codec
    }

    /// Written now if the last write is 250 ms old, else when it is; a
    /// newer value replaces one not yet written.
    fn progress(self: Arc<Self>, value: Vec<u8>) {
        let mut progress = self.progress.lock().expect("not poisoned");
        progress.pending = Some(value);
        if progress.writer {
            return;
        }
        progress.writer = true;
        drop(progress);
        tokio::spawn(self.write_progress());
    }
}

impl RunningTask {
    /// Writes pending progress until none is left, at most every 250 ms.
    async fn write_progress(self: Arc<Self>) {
        loop {
            let last = self.progress.lock().expect("not poisoned").last;
            if let Some(last) = last {
                tokio::time::sleep_until(last + PROGRESS_EVERY).await;
            }
            if !self.write_pending().await {
                let mut progress = self.progress.lock().expect("not poisoned");
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
        let _writing = self.writing.lock().await;
        let Some(value) = self.progress.lock().expect("not poisoned").pending.take() else {
            return false;
        };
        self.progress.lock().expect("not poisoned").last = Some(Instant::now());
        match self.signals.store.progress(self.id.as_str(), &value).await {
            Ok(true) => self.progress.lock().expect("not poisoned").written = Some(value),
            Ok(false) => {}
            Err(e) => debug!(task = %self.id, cause = %e, "progress not written"),
        }
        true
    }

    /// Its final record as its ack writes it, `succeeded` with `result`
    /// (encoded; empty for none), now: the ack script writes it whole, so
    /// it carries the record's other fields too (docs/design.md §14).
    pub(crate) fn succeeded(&self, result: &[u8]) -> Vec<u8> {
        let progress = self.progress.lock().expect("not poisoned");
        let run = self.run.lock().expect("not poisoned");
        packed::Finished {
            state: "succeeded",
            enqueued_at: run.enqueued_at,
            attempt: run.attempt,
            ran: &run.ran,
            finished_at: entry::now_ms(),
            progress: progress.written.as_deref(),
            result,
        }
        .encode()
    }

    /// An ordered task's next attempt starts in place, running as `ran`.
    pub(crate) fn restarted(&self, ran: &str, attempt: u32) {
        let mut run = self.run.lock().expect("not poisoned");
        run.ran = ran.to_owned();
        run.attempt = attempt;
    }

    /// Before the task's end is written: its last progress lands first.
    pub(crate) async fn flush(&self) {
        self.write_pending().await;
    }
}

/// Listens on service `name`'s `{N}:cancels` while tracking is on (a
/// pub/sub connection of its own then, `Channels`, which makes itself
/// again after a break; none while it is off), and fires the signals of
/// the cancelled tasks that run here.
pub(crate) fn listen(
    name: ServiceName,
    source: Option<Source>,
    mut tracking: Watched,
    running: Arc<Running>,
) -> AbortOnDropHandle<()> {
    let task = async move {
        let channel = crate::keys::cancels(&name);
        // The connection, and what it hears of the channel.
        let mut heard: Option<(Channels, broadcast::Receiver<Event>)> = None;
        let mut pauses = Pauses::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let on = tracking.on().is_some();
            if on && heard.is_none() {
                let channels = Channels::new(source.clone());
                let listened = tokio::select! {
                    listened = channels.listen(&channel) => listened,
                    _ = tracking.changed() => continue,
                };
                match listened {
                    Ok(receiver) => {
                        heard = Some((channels, receiver));
                        pauses.reset();
                    }
                    Err(e) => {
                        warn!(service = %name, cause = %e, "cannot listen for cancels; running tasks hear of a cancel only as they end");
                        tokio::select! {
                            _ = tokio::time::sleep(pauses.take()) => {}
                            _ = tracking.changed() => {}
                        }
                        continue;
                    }
                }
            } else if !on {
                heard = None;
            }
            tokio::select! {
                event = async { heard.as_mut().expect("checked").1.recv().await }, if heard.is_some() => {
                    match event {
                        Ok(Event::Message(handle)) => {
                            let handle = String::from_utf8_lossy(&handle);
                            let id = handle.split_once('/').map_or(&*handle, |(_, id)| id);
                            if let Some(signals) = running.find(id) {
                                // Checked apart, so that the next message
                                // is not held back by this one's read.
                                let id = id.to_owned();
                                tokio::spawn(
                                    async move { signals.fire_if_requested(&id).await }
                                        .in_current_span(),
                                );
                            }
                        }
                        // Messages may have been missed: such a task ends
                        // `cancelled` all the same, as its end reads the
                        // request.
                        Ok(Event::Again) | Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => heard = None,
                    }
                }
                _ = tracking.changed() => {}
            }
        }
    };
    AbortOnDropHandle::new(tokio::spawn(task.in_current_span()))
}
