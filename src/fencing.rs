//! The fenced writes of the handover (DESIGN.md §4 rules 2, 3 and 8): release
//! marks that only move forward, owner records whose tokens only increase,
//! and acknowledgements that only the recorded owner may make.
//!
//! Each is one script whose keys share one slot (`{N}:transition` alone;
//! `{N/p}:owner` with `{N/p}:stream`), so it is atomic under Redis Cluster.

use std::sync::LazyLock;

use deadpool_redis::redis::Script;

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::Result;
use crate::instance::InstanceId;
use crate::keys;

static MARK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/mark.lua")));
static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
static FENCED_ACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fenced_ack.lua")));

/// The owner record of a partition: `<token>:<instance id>`.
pub(crate) fn owner_record(token: u64, id: &InstanceId) -> String {
    format!("{token}:{id}")
}

/// mark(p) := max(mark(p), `epoch`); returns the mark after the write.
pub(crate) async fn mark(
    conn: &SharedConnection,
    name: &ServiceName,
    p: u32,
    epoch: u64,
) -> Result<u64> {
    let mut script = MARK.key(keys::transition(name));
    script.arg(p).arg(epoch);
    conn.invoke(&script).await
}

/// Records this instance as owner of `p` with `token`. `Ok(None)` when
/// recorded; `Ok(Some(t))` when a token `t >= token` is recorded already
/// (this instance is too late, and must not fetch).
pub(crate) async fn acquire(
    conn: &SharedConnection,
    name: &ServiceName,
    p: u32,
    token: u64,
    id: &InstanceId,
) -> Result<Option<u64>> {
    let mut script = ACQUIRE.key(keys::owner(name, p));
    script.arg(token).arg(id.as_str());
    let reply: i64 = conn.invoke(&script).await?;
    Ok((reply <= 0).then_some(reply.unsigned_abs()))
}

/// Acks `ids` of partition `p` if this instance is still its recorded owner
/// with `token`. `Ok(None)` when fenced: another instance owns it now.
pub(crate) async fn ack(
    conn: &SharedConnection,
    name: &ServiceName,
    p: u32,
    token: u64,
    id: &InstanceId,
    ids: &[&str],
) -> Result<Option<u64>> {
    let mut script = FENCED_ACK.key(keys::stream(name, p));
    script
        .key(keys::owner(name, p))
        .arg(owner_record(token, id))
        .arg(keys::GROUP)
        .arg(ids);
    let reply: i64 = conn.invoke(&script).await?;
    Ok(u64::try_from(reply).ok())
}

/// The integration tests' harness: real redis-server processes.
#[cfg(test)]
#[path = "../tests/support/mod.rs"]
mod support;

#[cfg(test)]
mod tests {
    //! Against a real redis-server started by the integration tests' harness.

    use super::support;
    use super::*;
    use deadpool_redis::redis::AsyncCommands;

    async fn setup() -> (support::RedisServer, SharedConnection, ServiceName) {
        let server = support::RedisServer::start();
        let conn = SharedConnection::new(server.pool());
        let name = ServiceName::new(&support::unique_name("fencing")).unwrap();
        (server, conn, name)
    }

    #[tokio::test]
    async fn marks_only_move_forward() {
        let (_server, conn, name) = setup().await;
        assert_eq!(mark(&conn, &name, 3, 10).await.unwrap(), 10);
        assert_eq!(
            mark(&conn, &name, 3, 9).await.unwrap(),
            10,
            "an older mark never lowers it"
        );
        assert_eq!(mark(&conn, &name, 3, 11).await.unwrap(), 11);
        assert_eq!(mark(&conn, &name, 4, 1).await.unwrap(), 1, "per partition");
    }

    #[tokio::test]
    async fn fencing_tokens_only_increase() {
        let (server, conn, name) = setup().await;
        let (a, b) = (InstanceId::generate(), InstanceId::generate());
        assert_eq!(acquire(&conn, &name, 0, 10, &a).await.unwrap(), None);
        assert_eq!(
            acquire(&conn, &name, 0, 10, &b).await.unwrap(),
            Some(10),
            "same token: refused"
        );
        assert_eq!(
            acquire(&conn, &name, 0, 9, &b).await.unwrap(),
            Some(10),
            "older token: refused"
        );
        assert_eq!(acquire(&conn, &name, 0, 12, &b).await.unwrap(), None);
        let mut raw = server.pool().get().await.unwrap();
        let record: String = raw.get(keys::owner(&name, 0)).await.unwrap();
        assert_eq!(record, owner_record(12, &b));
    }

    #[tokio::test]
    async fn a_stale_owners_ack_is_refused() {
        let (server, conn, name) = setup().await;
        let (old, new) = (InstanceId::generate(), InstanceId::generate());
        let mut raw = server.pool().get().await.unwrap();
        let stream = keys::stream(&name, 0);
        let () = deadpool_redis::redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg(keys::GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut *raw)
            .await
            .unwrap();
        let id: String = raw.xadd(&stream, "*", &[("k", "v")]).await.unwrap();
        let _: deadpool_redis::redis::Value = deadpool_redis::redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(keys::GROUP)
            .arg(old.as_str())
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query_async(&mut *raw)
            .await
            .unwrap();
        acquire(&conn, &name, 0, 5, &old).await.unwrap();
        // The partition moved on: the old owner may no longer ack.
        acquire(&conn, &name, 0, 6, &new).await.unwrap();
        assert_eq!(ack(&conn, &name, 0, 5, &old, &[&id]).await.unwrap(), None);
        let pending: deadpool_redis::redis::streams::StreamPendingReply =
            raw.xpending(&stream, keys::GROUP).await.unwrap();
        assert_eq!(pending.count(), 1, "the refused ack left the entry pending");
        assert_eq!(
            ack(&conn, &name, 0, 6, &new, &[&id]).await.unwrap(),
            Some(1)
        );
    }
}
