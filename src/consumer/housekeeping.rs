//! A worker's housekeeping, apart from its fetch loop: keep the entries it
//! runs fresh, look at the partition's consumer group, trim what was
//! acknowledged, move due delayed entries into the stream, forget task
//! records that stopped changing, have batch members' ends forwarded to
//! their batches (`super::completions`), and keep the queue gauges.
//!
//! What an idle partition costs (issue 26): a look at its group
//! (`XINFO GROUPS`) every 10 s, the sizes of its dead letters and delayed
//! set every 30 s, and the care of its task records (`sweep.lua`) every 30
//! minutes; nothing is trimmed, promoted or claimed while nothing changes. A partition whose group changes is looked at every
//! second and trimmed after each change.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::due_watch::Watching;
use super::held::Held;
use super::ownership::Ownership;
use super::shared::Shared;
use super::store::{Group, Sizes};

/// How often the group of a partition that changes is looked at, at the
/// most (and at least once per round interval).
const LOOK_BUSY: Duration = Duration::from_secs(1);
/// How often the group of a partition that does not change is looked at
/// (and at least every `claim_idle`: the look tells whether to claim).
const LOOK_IDLE: Duration = Duration::from_secs(10);
/// How often the sizes of the dead letters and the delayed set are read:
/// what others change there (an operator's replays, purges and deletions,
/// a delayed task whose notice was lost) is seen within this.
const COUNT_EVERY: Duration = Duration::from_secs(30);
/// How soon a failed promotion is tried again.
const PROMOTE_AGAIN: Duration = Duration::from_secs(1);
/// Most delayed entries moved in one script call.
const PROMOTE_BATCH: usize = 500;
/// How often a slice of the partition's task records is swept for records
/// that stopped changing (sweep.lua) while a pass is underway, how long a
/// finished pass rests (and how often a partition without final records
/// looks again, at the most: never longer than the keep time, so a record
/// that ends after a look is seen by the next one before it is due), and
/// how many fields a slice looks at: a pass over 100,000 tracked tasks
/// takes about an hour, at about 1 ms of Redis per slice, and an idle
/// partition costs one call every 30 minutes (at the default keep).
const SWEEP_EVERY: Duration = Duration::from_secs(10);
const SWEEP_REST: Duration = Duration::from_secs(1800);
const SWEEP_SLICE: usize = 1000;
/// How late after its time a final record goes, at the least: its end's
/// script and this look may see different milliseconds.
const EVICT_SLACK: Duration = Duration::from_millis(50);
/// Most entry ids kept fresh in one script call (Lua's `unpack` has a limit
/// of about 8,000 values).
const KEEP_CHUNK: usize = 1000;

/// When each part of the housekeeping is due next.
struct Due {
    keep: Instant,
    look: Instant,
    count: Instant,
    /// The care of the task records (sweep.lua).
    records: Instant,
    /// `None`: no delayed entry is known to wait.
    promote: Option<Instant>,
}

impl Due {
    fn next(&self, stopped: bool) -> Instant {
        if stopped {
            return self.keep;
        }
        let next = self.keep.min(self.look).min(self.count).min(self.records);
        self.promote.map_or(next, |at| next.min(at))
    }

    /// Promote at `at`, unless earlier already.
    fn promote_by(&mut self, at: Instant) {
        self.promote = Some(self.promote.map_or(at, |p| p.min(at)));
    }
}

/// The worker's housekeeping, apart from the fetch loop (which may wait for
/// room or block in a read for long), once the partition is acquired:
///
/// - resets the idle time of every entry this instance holds in the
///   partition, so that claiming never takes one that is still here; until
///   the worker's last task is done, drain included;
/// - looks at the consumer group while it owns the partition: for the
///   backlog gauge, for the fetch loop's claims (none while nothing is
///   pending), and to trim after reads and acks;
/// - moves due delayed entries into the stream: at once, then when the
///   next one is due, after this worker's own delayed retries, on a notice
///   of the due index (a producer's delayed task), and when the delayed
///   set's size is not what the store knew;
/// - keeps the partition's queue gauges.
pub(super) async fn housekeeping(
    shared: Arc<Shared>,
    ownership: Arc<Ownership>,
    held: Held,
    acquired: CancellationToken,
    done: CancellationToken,
) {
    tokio::select! {
        _ = done.cancelled() => return,
        _ = acquired.cancelled() => {}
    }
    let stop = &ownership.stop;
    let store = &ownership.store;
    let partition = store.partition();
    // The gauges count only partitions this instance owns.
    let _forget = Forget(&shared, partition);
    let mut notices = Some(shared.due.watch(partition, store.token()));
    let look_busy = shared.interval.min(LOOK_BUSY);
    let look_idle = shared.settings.claim_idle.min(LOOK_IDLE);
    let keep_every = shared.settings.claim_idle / 3;
    let now = Instant::now();
    let mut due = Due {
        keep: now + keep_every,
        look: now,
        count: now,
        records: now,
        // At once: retries the previous owner delayed may be due.
        promote: Some(now),
    };
    // At once: members' ends the previous owner did not forward.
    shared.completions.note(store);
    // Partitions acquired together do not read together: the first idle
    // look and the second count come at a random point of their period.
    let (mut look_phase, mut count_phase) = (Some(rand::random::<f64>()), Some(rand::random()));
    // The last look at the group, and the group as it was when last trimmed.
    let mut looked: Option<Group> = None;
    let mut trimmed: Option<Group> = None;
    let mut published: Option<Sizes> = None;
    // A retention changed on the running service is applied at once.
    let mut tracking = shared.tracking.clone();
    let mut records = Records {
        cursor: "0".into(),
        // Partitions acquired together do not sweep together.
        sweep: now + SWEEP_REST.mul_f64(rand::random::<f64>()),
    };
    loop {
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep_until(due.next(stop.is_cancelled())) => {}
            _ = ownership.delayed.notified() => {
                if let Some(at) = store.take_retry_due() {
                    due.promote_by(at);
                }
            }
            _ = noticed(notices.as_ref()) => due.promote_by(Instant::now()),
            _ = tracking.changed() => due.records = Instant::now(),
            _ = store.completion_noted() => shared.completions.note(store),
        }
        let now = Instant::now();
        if now >= due.keep {
            keep_fresh(&ownership, &held).await;
            due.keep = now + keep_every;
        }
        if stop.is_cancelled() {
            // The next owner takes the notices.
            notices = None;
            shared.queue.set(partition, None);
            continue;
        }
        if now >= due.look {
            let group = look(&ownership).await;
            if let Some(group) = &group
                && trimmed.as_ref().is_none_or(|t| t.acked_by(group))
                && trim(&ownership).await
            {
                trimmed = Some(group.clone());
            }
            let changed = group.is_none() || group != looked;
            due.look = now
                + if changed {
                    look_busy
                } else {
                    look_phase
                        .take()
                        .map_or(look_idle, |f| look_idle.mul_f64(f))
                };
            looked = group;
        }
        if now >= due.count {
            due.count = match store.count().await {
                Ok(changed) => {
                    if changed {
                        due.promote_by(now);
                    }
                    now + COUNT_EVERY.mul_f64(count_phase.take().unwrap_or(1.0))
                }
                Err(e) => {
                    debug!(partition, cause = %e, "cannot count the dead letters and delayed tasks");
                    now + look_busy
                }
            };
        }
        if now >= due.records {
            due.records = records.tend(&shared, &ownership, now).await;
        }
        if due.promote.is_some_and(|at| now >= at) {
            let (moved, next) = promote(&ownership).await;
            due.promote = next;
            if moved {
                // The moved entries are read and acked soon: trim after.
                due.look = due.look.min(now + look_busy);
            }
        }
        let sizes = store.sizes();
        if sizes.is_some() && sizes != published {
            shared.queue.set(partition, sizes);
            published = sizes;
        }
    }
}

/// Resolves on a notice of the due index; never without a place in it.
async fn noticed(watching: Option<&Watching>) {
    match watching {
        Some(watching) => watching.noticed().await,
        None => std::future::pending().await,
    }
}

/// Looks at the partition's consumer group; `None` when it cannot be read.
async fn look(ownership: &Ownership) -> Option<Group> {
    let partition = ownership.store.partition();
    match ownership.store.look().await {
        Ok(Some(group)) => Some(group),
        Ok(None) => {
            debug!(partition, "the consumer group is gone");
            None
        }
        Err(e) => {
            debug!(partition, cause = %e, "cannot look at the consumer group");
            None
        }
    }
}

/// Moves the partition's due delayed entries into its stream; returns
/// whether it moved any, and when to look again (`None`: none waits).
async fn promote(ownership: &Ownership) -> (bool, Option<Instant>) {
    let now = Instant::now();
    match ownership.store.promote(PROMOTE_BATCH).await {
        // More were due than one call moves.
        Ok((moved, _)) if moved as usize >= PROMOTE_BATCH => (true, Some(now)),
        Ok((moved, next)) => {
            if moved > 0 {
                debug!(
                    partition = ownership.store.partition(),
                    moved, "delayed entries due"
                );
            }
            (moved > 0, next.map(|next| now + next))
        }
        Err(e) => {
            warn!(partition = ownership.store.partition(), cause = %e, "cannot move due delayed entries");
            (false, Some(now + PROMOTE_AGAIN))
        }
    }
}

/// Resets the idle time of every entry this worker holds, so nobody claims
/// them.
async fn keep_fresh(ownership: &Ownership, held: &Held) {
    let ids = held.ids();
    for chunk in ids.chunks(KEEP_CHUNK) {
        match ownership.store.keep(chunk).await {
            Ok(true) => {}
            Ok(false) => return ownership.fenced("keeping held entries fresh"),
            Err(e) => {
                let partition = ownership.store.partition();
                return warn!(partition, cause = %e, "could not keep held entries fresh");
            }
        }
    }
}

/// Trims the partition's acknowledged entries; true if it went through.
async fn trim(ownership: &Ownership) -> bool {
    let partition = ownership.store.partition();
    match ownership.store.trim().await {
        Ok(0) => true,
        Ok(n) => {
            debug!(partition, trimmed = n, "trimmed acknowledged entries");
            true
        }
        Err(e) => {
            warn!(partition, cause = %e, "trim failed");
            false
        }
    }
}

/// Where the care of a partition's task records is.
struct Records {
    /// The sweep's HSCAN cursor.
    cursor: String,
    /// When the next slice is swept.
    sweep: Instant,
}

impl Records {
    /// Evicts the final records past the retention and, when due, sweeps
    /// the next slice; returns when to come back: when the oldest final
    /// record left is due to go, or the next slice, whichever first.
    async fn tend(&mut self, shared: &Shared, ownership: &Ownership, now: Instant) -> Instant {
        let partition = ownership.store.partition();
        let settings = shared.tracking.settings();
        let sweeping = now >= self.sweep;
        let cursor = sweeping.then_some(self.cursor.as_str());
        match ownership.store.sweep(&settings, cursor, SWEEP_SLICE).await {
            Ok((next, forgotten, evict)) => {
                if forgotten > 0 {
                    debug!(
                        partition,
                        forgotten, "forgot task records that stopped changing"
                    );
                }
                if sweeping {
                    let rest = if next == "0" { SWEEP_REST } else { SWEEP_EVERY };
                    self.cursor = next;
                    self.sweep = now + rest;
                }
                let evict = evict.map_or(settings.kept_for().min(SWEEP_REST), |d| d + EVICT_SLACK);
                self.sweep.min(now + evict)
            }
            Err(e) => {
                debug!(partition, cause = %e, "cannot tend the task records");
                now + SWEEP_EVERY
            }
        }
    }
}

/// Takes a partition out of the queue gauges when its housekeeping ends.
struct Forget<'a>(&'a Shared, u32);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.queue.set(self.1, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_housekeeping_only_keeps_entries_fresh() {
        let now = Instant::now();
        let s = Duration::from_secs(1);
        let mut due = Due {
            keep: now + 3 * s,
            look: now + s,
            count: now + 2 * s,
            records: now + 4 * s,
            promote: None,
        };
        assert_eq!(due.next(false), now + s);
        assert_eq!(due.next(true), now + 3 * s);
        due.promote_by(now);
        due.promote_by(now + s);
        assert_eq!(due.promote, Some(now), "the earlier promotion stays");
        assert_eq!(due.next(false), now);
    }
}
