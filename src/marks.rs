//! The release marks of `{N}:transition` (docs/design.md §4 rule 2): one
//! field per partition, holding the newest epoch for which its owner
//! released it, and `<p>:at`, when that mark was written (§7); a
//! singleton's are `singleton:<name>` and `singleton:<name>:at` (§20). A
//! mark only moves forward.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::keys;

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
    let read = marks_of(conn, name, partitions).await?;
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
