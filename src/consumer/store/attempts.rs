//! Ordered mode's attempt records (docs/design.md §6, ordered partitions):
//! an ordered entry is retried in place and never rewritten, so what its
//! next run must know lives in Redis, beside the entry: its delivery count
//! (the runs that may have started; each delivery adds one) and its
//! failure count (`{N/p}:failures`). Read together in one round trip,
//! written by one fenced script (`fenced_attempt.lua`).

use std::sync::LazyLock;

use deadpool_redis::redis::streams::StreamPendingCountReply;
use deadpool_redis::redis::{self, Script};

use super::PartitionStore;
use crate::error::Result;
use crate::keys;

static FENCED_ATTEMPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/fenced_attempt.lua")));

/// What Redis records of a pending entry's attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempts {
    /// How often it was delivered: the runs that may have started, plus
    /// one for the delivery that reads it; 0 when it is not pending.
    pub(crate) deliveries: u32,
    /// Its failed runs.
    pub(crate) failures: u32,
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
        let deliveries = pending
            .ids
            .first()
            .map_or(0, |p| u32::try_from(p.times_delivered).unwrap_or(u32::MAX));
        Ok(Attempts {
            deliveries,
            failures: failures.and_then(|f| f.parse().ok()).unwrap_or(0),
        })
    }

    /// Ordered mode: records what Redis must know of entry `id` (held by
    /// this instance) for its next run, here or on the next owner: its
    /// delivery count (see [`Deliveries`]; a later delivery adds one, the
    /// attempt it runs) and, after a failed attempt, its failure count.
    /// `Ok(None)` when fenced, `Ok(Some(false))` when the entry is not
    /// pending.
    pub(crate) async fn record_attempts(
        &self,
        id: &str,
        deliveries: Deliveries,
        failures: Option<u32>,
    ) -> Result<Option<bool>> {
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
        if let Some(failures) = failures {
            script.arg(failures);
        }
        let reply: i64 = self.conn.invoke(&script).await?;
        Ok((reply >= 0).then_some(reply > 0))
    }
}
