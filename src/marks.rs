//! The release marks of `{N}:transition` (docs/design.md §4 rule 2): one
//! field per partition, holding the newest epoch for which its owner
//! released it, and `<p>:at`, when that mark was written (§7); a
//! singleton's are `singleton:<name>` and `singleton:<name>:at` (§20). A
//! mark only moves forward.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::{self, Script};
use tracing::{debug, error, warn};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::keys;
use crate::partition::Shown;
use crate::retry::Pauses;

/// How often a driver's pending acquires read their marks (rule 3).
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(10);
/// After a failed read of the marks.
pub(crate) const POLL_BACKOFF: Duration = Duration::from_millis(100);
/// Tries of one mark write: a lost mark only makes the successor wait for
/// its deadline.
const MARK_ATTEMPTS: u32 = 5;
/// The pauses between two tries of a mark write: 50 ms, doubling.
const MARK_PAUSES: Pauses = Pauses::new(Duration::from_millis(50), Duration::MAX);

static MARK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/mark.lua")));

/// mark(p) := max(mark(p), `epoch`), for field `p` (a partition's number
/// or a singleton's field); returns the mark after the write.
pub(crate) async fn mark(
    conn: &SharedConnection,
    name: &ServiceName,
    p: impl std::fmt::Display,
    epoch: u64,
) -> Result<u64> {
    let transition = keys::transition(name);
    let mut script = MARK.key(&transition);
    script.arg(p.to_string()).arg(epoch);
    // With `wait_for_replicas`, a mark a failover could lose is not
    // written: the successor would wait for its deadline.
    conn.write_script(&script).await
}

/// Rule 2: mark := max(mark, `epoch`) for field `p` (a partition's number
/// or a singleton's field), tried [`MARK_ATTEMPTS`] times: the handover
/// drivers' mark writes, each in a task of its own.
pub(crate) async fn mark_retried(
    conn: Arc<SharedConnection>,
    name: ServiceName,
    p: String,
    epoch: u64,
) {
    let mut pauses = MARK_PAUSES;
    for attempt in 1..=MARK_ATTEMPTS {
        match mark(&conn, &name, &p, epoch).await {
            Ok(_) => {
                debug!(mark = %p, epoch, "marked released");
                return;
            }
            Err(e) => {
                warn!(mark = %p, epoch, attempt, cause = %e, "cannot write the release mark");
                pauses.wait().await;
            }
        }
    }
    error!(
        mark = %p,
        epoch, "release mark not written; the next owner waits for its deadline"
    );
}

/// A partition's release mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    /// The newest epoch the partition was released for.
    pub(crate) epoch: u64,
    /// When that mark was written (Redis time, ms since the Unix epoch);
    /// `None` for a mark written before peerq recorded it.
    pub(crate) at_ms: Option<u64>,
}

/// The marks of `partitions` (those with none are left out), in one `HMGET`.
pub(crate) async fn marks(
    conn: &SharedConnection,
    name: &ServiceName,
    partitions: &[u32],
) -> Result<BTreeMap<u32, Mark>> {
    let fields: Vec<Shown> = partitions.iter().map(|&p| Shown(p)).collect();
    let read = marks_of(conn, name, &fields).await?;
    Ok(partitions
        .iter()
        .zip(read)
        .filter_map(|(p, mark)| Some((*p, mark?)))
        .collect())
}

/// The marks of `fields` (partitions' numbers or singletons' fields), in
/// their order, in one `HMGET`.
pub(crate) async fn marks_of<F: std::fmt::Display>(
    conn: &SharedConnection,
    name: &ServiceName,
    fields: &[F],
) -> Result<Vec<Option<Mark>>> {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(keys::transition(name));
    for p in fields {
        cmd.arg(p.to_string()).arg(format!("{p}:at"));
    }
    let values: Vec<Option<u64>> = conn.query(&cmd).await?;
    Ok(values
        .chunks(2)
        .map(|pair| {
            let epoch = pair[0]?;
            let at_ms = pair.get(1).copied().flatten();
            Some(Mark { epoch, at_ms })
        })
        .collect())
}
