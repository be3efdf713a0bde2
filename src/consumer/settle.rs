//! The last step of a task's path, fetch → run → settle: the entry leaves
//! the partition's pending list. It is acked (through the acker, in
//! batches), enqueued again (a retry, an interrupted run, a hand-back, a
//! take-over) or moved to the dead letters with its reason. Each of these
//! writes is fenced (docs/design.md §4 rule 8): once the partition has a
//! newer owner, Redis refuses it, the entry stays pending for that owner,
//! and this worker drops the partition's work.

use std::time::Duration;

use tracing::{error, warn};

use super::acker::{Ack, Ending, Replies, Tracked};
use super::ownership::Ownership;
use super::shared::Shared;
use super::store::{Fields, Moved, To, Track};
use crate::dead_letters;
use crate::entry::{Entry, TaskId};
use crate::handler::Disposition;

/// Settles the entries of one partition, as one worker owns it. Each
/// write says whether the entry is no longer pending (acked, or moved:
/// retried, dead-lettered, handed back); `false` leaves it pending.
#[derive(Clone, Copy)]
pub(crate) struct Settle<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) ownership: &'a Ownership,
}

/// How a fenced write left its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// Moved now.
    Now,
    /// Not pending any more: an earlier write landed, its reply lost.
    Before,
    /// Still pending (refused, or Redis failed).
    Not,
}

impl Settle<'_> {
    fn partition(&self) -> u32 {
        self.ownership.store.partition()
    }

    /// Acks entries `ids` (their tasks succeeded, or a user cancelled
    /// them) in the acker's next batch, with their records when `tracked`,
    /// freeing the unique keys of `unique` (task id and key of those that
    /// hold one); the outcome comes back on `reply`, and goes to
    /// [`acks_ended`](Self::acks_ended).
    pub(crate) fn ack(
        &self,
        ids: Vec<String>,
        tracked: Option<Tracked>,
        ending: Ending,
        reply: &Replies,
    ) {
        let ack = Ack::new(
            self.ownership.store.clone(),
            self.ownership.stop.clone(),
            ids,
            tracked,
            reply.clone(),
        )
        .ending(ending);
        // Refused only once the acker has stopped: the ack, dropped, tells
        // `reply` it was given up.
        let _ = self.shared.acks.send(ack);
    }

    /// Acks ended so: `acked` landed, and if `fenced`, Redis refused one
    /// (the partition has a newer owner).
    pub(crate) fn acks_ended(&self, acked: usize, fenced: bool) {
        self.shared.metrics.acked(acked);
        if fenced {
            self.ownership.fenced("acking");
        }
    }

    /// After a failed attempt, `entry` counting it in its `failures`: the
    /// delay before the next attempt, or why there is none (the dead
    /// letters' reason). Only failures spend `max_attempts`, and the
    /// backoff grows with them: an interrupted run says nothing about the
    /// task or what it calls (docs/design.md §6).
    pub(crate) fn next_attempt(
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
            _ if entry.failures >= settings.max_attempts => {
                warn!(
                    error,
                    failures = entry.failures,
                    "task failed its last attempt; moved to the dead letters"
                );
                Err("failed")
            }
            Disposition::RetryAfter(delay) => Ok(delay),
            _ => Ok(settings.backoff.delay(entry.failures)),
        }
    }

    /// A failed attempt: retried after its backoff (or the delay the error
    /// asked for), or moved to the dead letters after the last attempt or
    /// on a permanent error. The next entry, or the dead letter, counts
    /// this failure.
    pub(crate) async fn failed(
        &self,
        id: &str,
        entry: &Entry,
        error: &str,
        disposition: Disposition,
    ) -> bool {
        let failed = Entry {
            failures: entry.failures.saturating_add(1),
            ..entry.clone()
        };
        match self.next_attempt(&failed, error, disposition) {
            Ok(delay) => {
                let written = self.write_retry(id, &failed, error, delay).await;
                if written == Written::Now {
                    self.shared.metrics.retried();
                }
                written != Written::Not
            }
            Err(reason) => {
                let task = Some((&failed.id, failed.attempt));
                self.dead_letter(id, failed.fields(), reason, error, task)
                    .await
            }
        }
    }

    /// An interrupted run (drain timeout, lapsed lease, fence, leave at
    /// once): acks entry `id` and enqueues the task again at once with
    /// `attempt + 1` (it may have run) and its failures as they were, in
    /// one fenced script.
    pub(crate) async fn interrupted(&self, id: &str, entry: &Entry) -> bool {
        let why = "the run was interrupted";
        self.write_retry(id, entry, why, Duration::ZERO).await != Written::Not
    }

    /// Acks entry `id` and enqueues `entry`'s next attempt (`attempt + 1`,
    /// its other fields as they are) after `delay` (in the partition's
    /// delayed set until due), in one fenced script.
    async fn write_retry(&self, id: &str, entry: &Entry, why: &str, delay: Duration) -> Written {
        warn!(why, retry_in = ?delay, "task enqueued again");
        let next = Entry {
            attempt: entry.attempt + 1,
            ..entry.clone()
        };
        let track = self.track(&next.id, next.attempt, "", why);
        let retried = self
            .ownership
            .store
            .retry(id, delay, &next, track.as_ref())
            .await;
        if matches!(retried, Ok(Moved::Yes)) && !delay.is_zero() {
            self.ownership.delayed.notify_one();
        }
        self.moved(retried, "enqueuing the task again")
    }

    /// A claimed entry (from a crashed or fenced instance, a lost ack) may
    /// have run there, so it is enqueued again with the attempt its
    /// deliveries gave it (`attempt + 1` after one run, docs/design.md §6;
    /// §5.3: a task that may run twice says so in its attempt number) and
    /// its failures as they were, and runs when fetched.
    pub(crate) async fn take_over(&self, id: &str, next: &Entry) -> bool {
        let track = self.track(&next.id, next.attempt, "", "");
        let moved = self
            .ownership
            .store
            .move_entry(To::Stream, id, &next.fields(), track.as_ref())
            .await;
        self.moved(moved, "taking over a claimed entry") != Written::Not
    }

    /// Enqueues a fetched but never started entry again as it is, and acks
    /// this copy, so the partition's next owner runs it; `task` (its id
    /// and attempt), if it could be read, has its record say `waiting`.
    pub(crate) async fn hand_back<K: Into<String>>(
        &self,
        id: &str,
        fields: Vec<(K, Vec<u8>)>,
        task: Option<(&TaskId, u32)>,
    ) -> bool {
        let fields: Fields = fields.into_iter().map(|(k, v)| (k.into(), v)).collect();
        let track = task.and_then(|(task, attempt)| self.track(task, attempt, "", ""));
        let moved = self
            .ownership
            .store
            .move_entry(To::Stream, id, &fields, track.as_ref())
            .await;
        self.moved(moved, "handing back an unstarted task") != Written::Not
    }

    /// Moves the entry (`fields`) to the partition's dead letters with the
    /// reason and the error, and acks it, in one fenced script; `task`
    /// (its id and attempt), if it could be read, has its record say
    /// `dead`.
    pub(crate) async fn dead_letter<K: Into<String>>(
        &self,
        id: &str,
        fields: Vec<(K, Vec<u8>)>,
        reason: &str,
        error: &str,
        task: Option<(&TaskId, u32)>,
    ) -> bool {
        error!(
            partition = self.partition(),
            stream_id = id,
            reason,
            error,
            "entry moved to the dead letters"
        );
        let fields: Fields = fields.into_iter().map(|(k, v)| (k.into(), v)).collect();
        let fields = dead_letters::letter(fields, reason, error, Some(id));
        let track = task.and_then(|(task, attempt)| self.track(task, attempt, reason, error));
        let moved = self
            .ownership
            .store
            .move_entry(To::DeadLetters, id, &fields, track.as_ref())
            .await;
        let written = self.moved(moved, "moving to the dead letters");
        if written == Written::Now {
            // After a failed attempt (the last, or a permanent error), not
            // an entry that could not run.
            let failed = matches!(reason, "failed" | "permanent");
            self.shared.metrics.dead(failed);
        }
        written != Written::Not
    }

    /// What a fenced move writes into task `task`'s record, if tracking is
    /// on (docs/design.md §14).
    fn track<'b>(
        &self,
        task: &'b TaskId,
        attempt: u32,
        reason: &'b str,
        error: &'b str,
    ) -> Option<Track<'b>> {
        let tracking = self.shared.tracking.on()?;
        Some(Track {
            tracking,
            task: task.as_str(),
            reason,
            error,
            attempt,
        })
    }

    /// What a fenced write's result means for this worker. On an error
    /// the entry stays pending, and the partition's owner claims it.
    fn moved(&self, moved: crate::error::Result<Moved>, what: &str) -> Written {
        match moved {
            Ok(Moved::Yes) => return Written::Now,
            Ok(Moved::NotPending) => return Written::Before,
            Ok(Moved::Fenced) => self.ownership.fenced(what),
            Err(e) => error!(
                partition = self.partition(),
                what,
                cause = %e,
                "failed; the entry stays pending and will be claimed"
            ),
        }
        Written::Not
    }
}
