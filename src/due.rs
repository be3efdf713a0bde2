//! The service's due index, `{N}:due` (docs/design.md §6): notices that
//! tell a partition's owner that someone else put a task into the
//! partition's delayed set.
//!
//! The owner of a partition knows when its own delayed entries are due: it
//! learns the next due time from each promotion, and of the retries it
//! delays itself. What it cannot see is a producer's delayed enqueue, or an
//! operator making a delayed task due now. Those writers add a notice after
//! their write: the partition, scored by the earliest due time noticed
//! (`ZADD LT`). Each consumer instance reads the notices due soon once a
//! second, in one command whatever its number of partitions, removes those
//! of the partitions it owns, and only then has each of them look at its
//! delayed set, which tells when its next entry is due.
//!
//! Removing a notice before the look loses no task: one delayed before the
//! look is in the set the look reads; one delayed after the removal adds a
//! notice of its own. A notice that never arrives (its writer failed
//! between its two writes, or an older peerq delayed the task) is covered
//! by the owner's slow check of the delayed set's size.
//!
//! The index is a key of its own slot under Redis Cluster: it is never in a
//! script with a partition's keys, so a writer sends its notice after its
//! script, as a command of its own.

use deadpool_redis::redis;

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::keys;
use crate::partition::{Shown, parse_unit};

/// The notice that partition `p` of service `name` holds a delayed task due
/// at `due_ms` (Unix ms, Redis's clock): an earlier notice of `p` stays.
pub(crate) fn notice(name: &ServiceName, p: u32, due_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("ZADD");
    cmd.arg(keys::due(name))
        .arg("LT")
        .arg(due_ms)
        .arg(Shown(p).to_string());
    cmd
}

/// The partitions with a notice due at or before `until_ms`; at most one
/// per partition, so the reply is bounded by the partitions.
pub(crate) async fn noticed(
    conn: &SharedConnection,
    name: &ServiceName,
    until_ms: u64,
) -> Result<Vec<u32>> {
    let mut cmd = redis::cmd("ZRANGE");
    cmd.arg(keys::due(name))
        .arg("-inf")
        .arg(until_ms)
        .arg("BYSCORE");
    let members: Vec<String> = conn.query(&cmd).await?;
    // Anything else in the key is not a partition's notice.
    Ok(members.iter().filter_map(|m| parse_unit(m)).collect())
}

/// Removes the notices of `partitions` (before their owner looks).
pub(crate) async fn clear(
    conn: &SharedConnection,
    name: &ServiceName,
    partitions: &[u32],
) -> Result<()> {
    if partitions.is_empty() {
        return Ok(());
    }
    let mut cmd = redis::cmd("ZREM");
    cmd.arg(keys::due(name));
    for p in partitions {
        cmd.arg(Shown(*p).to_string());
    }
    conn.query(&cmd).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use peerq_test_support as support;

    #[tokio::test]
    async fn a_notice_keeps_the_earliest_due_time_until_cleared() {
        let server = support::RedisServer::start();
        let conn = SharedConnection::new(server.pool());
        let name = ServiceName::new(&support::unique_name("due")).unwrap();
        for (p, due_ms) in [(3, 5_000), (3, 9_000), (7, 8_000), (7, 2_000), (9, 20_000)] {
            conn.query::<()>(&notice(&name, p, due_ms)).await.unwrap();
        }
        assert_eq!(
            noticed(&conn, &name, 1_000).await.unwrap(),
            Vec::<u32>::new()
        );
        assert_eq!(noticed(&conn, &name, 5_000).await.unwrap(), vec![7, 3]);
        clear(&conn, &name, &[3, 7]).await.unwrap();
        clear(&conn, &name, &[]).await.unwrap();
        assert_eq!(
            noticed(&conn, &name, 10_000).await.unwrap(),
            Vec::<u32>::new()
        );
        // A later notice after the clear is a notice again.
        conn.query::<()>(&notice(&name, 3, 9_000)).await.unwrap();
        assert_eq!(noticed(&conn, &name, 30_000).await.unwrap(), vec![3, 9]);
    }
}
