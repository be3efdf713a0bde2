//! Attempt records in Redis (docs/design.md §6). Ordered mode's (ordered
//! partitions): an ordered entry is retried in place and never rewritten,
//! so what its next run must know lives in Redis, beside the entry: its
//! delivery count (the runs that may have started; each delivery adds
//! one) and its failure count (`{N/p}:failures`). Read together in one
//! round trip, written by one fenced script (`fenced_attempt.lua`).
//! Concurrent mode reads the delivery counts of what it re-reads or
//! claims.

use std::sync::LazyLock;

use deadpool_redis::redis::streams::StreamPendingCountReply;
use deadpool_redis::redis::{self, Script};

use super::{PartitionStore, Track};
use crate::error::Result;
use crate::keys;
use crate::tracking::tracked_script;

static FENCED_ATTEMPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(tracked_script!("fenced_attempt.lua")));

/// What Redis records of a pending entry's attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempts {
    /// How often it was delivered: the runs that may have started, plus
    /// one for the delivery that reads it; 0 when it is not pending.
    pub(crate) deliveries: u32,
    /// Its failed runs.
    pub(crate) failures: u32,
}

/// What recording an ordered entry's attempts found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Recorded: the entry may run (or wait for its next attempt).
    Yes,
    /// The entry is not pending any more.
    NotPending,
    /// Recorded, but a user cancelled the tracked task: it must not run
    /// again; acked, it ends `cancelled`.
    Cancelled,
}

/// A tracked ordered task's record as its attempts are recorded
/// (docs/design.md §14): `retrying` after a failed attempt, until its next
/// one after `backoff`; `running` as that one starts.
#[derive(Debug, Clone)]
pub(crate) struct InPlace<'a> {
    pub(crate) track: Track<'a>,
    pub(crate) retrying: bool,
    /// What the next attempt runs as, as it starts (not `retrying`):
    /// [`PartitionStore::running`].
    pub(crate) running: String,
    pub(crate) backoff: std::time::Duration,
}

/// The delivery count an ordered entry's record sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deliveries {
    /// The runs that may have started: the attempt that starts now, or
    /// the one that just failed.
    Runs(u32),
    /// A fetched entry released before it started: one less than now, the
    /// read that delivered it started nothing.
    Unstarted,
}

impl PartitionStore {
    /// Concurrent mode: how often Redis has delivered each of `ids` (0:
    /// not pending any more), in one round trip. Each delivery may have
    /// been a run (docs/design.md §6, attempt counting).
    pub(crate) async fn deliveries(&self, ids: &[&str]) -> Result<Vec<u32>> {
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("XPENDING")
                .arg(&self.stream)
                .arg(keys::GROUP)
                .arg(*id)
                .arg(*id)
                .arg(1);
        }
        let pending: Vec<StreamPendingCountReply> = self.conn.query_pipe(&pipe).await?;
        Ok(pending.iter().map(times_delivered).collect())
    }

    /// Ordered mode: what Redis records of entry `id`'s attempts, its
    /// delivery count and its failure count (XPENDING and HGET in one
    /// round trip); a delivery count of 0 when the entry is not pending
    /// any more.
    pub(crate) async fn attempts(&self, id: &str) -> Result<Attempts> {
        let mut pipe = redis::pipe();
        pipe.cmd("XPENDING")
            .arg(&self.stream)
            .arg(keys::GROUP)
            .arg(id)
            .arg(id)
            .arg(1)
            .cmd("HGET")
            .arg(&self.failures)
            .arg(id);
        // Read as text: a value that is no number (nothing peerq writes)
        // counts as none rather than failing the read for good, which
        // would leave the entry, and its partition, waiting forever.
        let (pending, failures): (StreamPendingCountReply, Option<String>) =
            self.conn.query_pipe(&pipe).await?;
        Ok(Attempts {
            deliveries: times_delivered(&pending),
            failures: failures.and_then(|f| f.parse().ok()).unwrap_or(0),
        })
    }

    /// Ordered mode: records what Redis must know of entry `id` (held by
    /// this instance) for its next run, here or on the next owner: its
    /// delivery count (see [`Deliveries`]; a later delivery adds one, the
    /// attempt it runs) and, after a failed attempt, its failure count;
    /// tracked (`in_place`), its record too. `Ok(None)` when fenced.
    pub(crate) async fn record_attempts(
        &self,
        id: &str,
        deliveries: Deliveries,
        failures: Option<u32>,
        in_place: Option<&InPlace<'_>>,
    ) -> Result<Option<Recorded>> {
        let mut script = FENCED_ATTEMPT.key(&self.stream);
        script
            .key(&self.owner)
            .key(&self.failures)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(&self.consumer)
            .arg(id);
        match deliveries {
            Deliveries::Runs(runs) => script.arg(runs),
            Deliveries::Unstarted => script.arg("unstarted"),
        };
        match failures {
            Some(failures) => script.arg(failures),
            None => script.arg(""),
        };
        match in_place {
            Some(in_place) => {
                let track = &in_place.track;
                script
                    .arg(track.task)
                    .arg(if in_place.retrying {
                        "retrying"
                    } else {
                        "running"
                    })
                    .arg(track.error)
                    .arg(track.attempt)
                    .arg(in_place.backoff.as_millis() as u64)
                    .arg(&in_place.running);
                script.arg(self.block(&track.tracking));
            }
            None => {
                script.arg("");
            }
        }
        let reply: i64 = self.conn.invoke(&script).await?;
        Ok(match reply {
            -1 => None,
            0 => Some(Recorded::NotPending),
            2 => Some(Recorded::Cancelled),
            _ => Some(Recorded::Yes),
        })
    }
}

/// How often the one entry of an `XPENDING <id> <id> 1` reply was
/// delivered; 0 when it is not pending.
fn times_delivered(pending: &StreamPendingCountReply) -> u32 {
    pending
        .ids
        .first()
        .map_or(0, |p| u32::try_from(p.times_delivered).unwrap_or(u32::MAX))
}
