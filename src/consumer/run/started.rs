//! A tracked batch's start (docs/design.md §14): its tasks are registered
//! for cancels and their `running` values written in one fenced call
//! before any of them starts; those a user cancelled first leave the
//! batch there.

use super::Batch;
use crate::consumer::running::{Registered, Run, RunningTask};
use crate::consumer::store::{Fetched, Starting};
use crate::entry::now_ms;
use crate::tracking::Tracking;
use tracing::warn;

impl Batch {
    /// Tracked: registers `entries`' tasks (so a user's cancel finds them
    /// from now on) and writes their start; those a user cancelled first
    /// were acked by that write and leave `entries`. `None` when none may
    /// run now: fenced, or Redis did not answer (they stay pending).
    pub(super) async fn start(
        &self,
        tracking: &Tracking,
        entries: &mut Vec<Fetched>,
    ) -> Option<Started> {
        let store = &self.ownership.store;
        let started_at = now_ms();
        for (place, fetched) in entries.iter_mut().enumerate() {
            fetched.place = place;
        }
        let entries_read = entries
            .iter()
            .filter_map(|f| Some((f, f.entry.as_ref().ok()?)));
        let mut starting: Vec<Starting<'_>> = Vec::with_capacity(entries.len());
        let mut at = vec![None; entries.len()];
        let mut runs = Vec::with_capacity(entries.len());
        for (fetched, entry) in entries_read {
            let run = Run {
                attempt: entry.attempt,
                started_at,
                enqueued_at: entry.enqueued_at.as_millis() as u64,
            };
            at[fetched.place] = Some(runs.len());
            runs.push((entry.id.clone(), run));
            starting.push((fetched.id.as_str(), entry.id.as_str(), entry.attempt));
        }
        if starting.is_empty() {
            return Some(Started::default());
        }
        let codec = self.shared.runner.codec();
        let interrupt = &self.ownership.cancel;
        let registered = self
            .shared
            .running
            .register(store.clone(), interrupt, codec, runs);
        let skipped = match store.start(tracking, started_at, &starting).await {
            Ok(Some(skipped)) => skipped,
            Ok(None) => {
                self.ownership.fenced("starting tracked tasks");
                self.held
                    .release_all(entries.iter().map(|f| (f.id.as_str(), false)));
                return None;
            }
            Err(e) => {
                warn!(partition = self.partition, cause = %e, "cannot write the tasks' start; they stay pending and are read again");
                self.held
                    .release_all(entries.iter().map(|f| (f.id.as_str(), false)));
                return None;
            }
        };
        drop(starting);
        let started = Started {
            registered: Some(registered),
            at,
        };
        for fetched in entries.iter().filter(|f| skipped.contains(&f.id)) {
            if let Some(task) = started.take(fetched) {
                task.ended();
            }
            self.held.release(&fetched.id, true);
        }
        entries.retain(|f| !skipped.contains(&f.id));
        Some(started)
    }
}

/// A batch's tracked tasks once started, each by its entry's place in the
/// batch (`Fetched::place`).
#[derive(Debug, Default)]
pub(super) struct Started {
    registered: Option<Registered>,
    /// Each entry's task, by its place (none for an entry that cannot be
    /// read).
    at: Vec<Option<usize>>,
}

impl Started {
    /// The task of entry `fetched`, if it is tracked.
    pub(super) fn take(&self, fetched: &Fetched) -> Option<RunningTask> {
        let registered = self.registered.as_ref()?;
        let at = (*self.at.get(fetched.place)?)?;
        Some(registered.task(at))
    }
}
