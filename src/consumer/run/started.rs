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
        let entries_read = entries
            .iter()
            .filter_map(|f| Some((f, f.entry.as_ref().ok()?)));
        let mut starting: Vec<Starting<'_>> = Vec::with_capacity(entries.len());
        let mut at = Vec::with_capacity(entries.len());
        let mut runs = Vec::with_capacity(entries.len());
        for (fetched, entry) in entries_read {
            let run = Run {
                attempt: entry.attempt,
                started_at,
                enqueued_at: entry.enqueued_at.as_millis() as u64,
            };
            at.push((stream_key(&fetched.id), runs.len()));
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
        // Reads and pending lists come in the stream's order; sorted all
        // the same, for the lookups.
        at.sort_unstable_by_key(|(key, _)| *key);
        let started = Started {
            registered: Some(registered),
            at,
        };
        for id in &skipped {
            if let Some(task) = started.take(id) {
                task.ended();
            }
            self.held.release(id, true);
        }
        entries.retain(|f| !skipped.contains(&f.id));
        Some(started)
    }
}

/// A batch's tracked tasks once started: each one by its stream id.
#[derive(Debug, Default)]
pub(super) struct Started {
    registered: Option<Registered>,
    /// Each task's stream id (`stream_key`) and its place among them,
    /// sorted by the id: a lookup costs no allocation (a map by the
    /// stream id's text cost one per task).
    at: Vec<((u64, u64), usize)>,
}

impl Started {
    /// The task of the entry with stream id `id`, if it is tracked.
    pub(super) fn take(&self, id: &str) -> Option<RunningTask> {
        let registered = self.registered.as_ref()?;
        let key = stream_key(id);
        let i = self.at.binary_search_by_key(&key, |(key, _)| *key).ok()?;
        Some(registered.task(self.at[i].1))
    }
}

/// A stream id, `<ms>-<seq>` in decimal as Redis gives them, as its two
/// numbers. By hand: `split_once` and `str::parse` were a tenth of a
/// microsecond per task in a profile of the tracked consume.
fn stream_key(id: &str) -> (u64, u64) {
    let (mut ms, mut seq, mut dash) = (0u64, 0u64, false);
    for b in id.bytes() {
        match b {
            b'-' if !dash => dash = true,
            _ if dash => {
                seq = seq
                    .wrapping_mul(10)
                    .wrapping_add(u64::from(b.wrapping_sub(b'0')))
            }
            _ => {
                ms = ms
                    .wrapping_mul(10)
                    .wrapping_add(u64::from(b.wrapping_sub(b'0')))
            }
        }
    }
    (ms, seq)
}

#[cfg(test)]
mod tests {
    use super::stream_key;

    #[test]
    fn stream_ids_read_as_their_numbers_in_their_order() {
        assert_eq!(stream_key("1764262594123-0"), (1_764_262_594_123, 0));
        assert_eq!(stream_key("0-18446744073709551615"), (0, u64::MAX));
        let ids = ["9-9", "10-0", "10-1", "10-10", "11-2"];
        let keys: Vec<_> = ids.iter().map(|id| stream_key(id)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
    }
}
