//! The fenced writes of the handover (docs/design.md §4 rules 2, 3 and 8): release
//! marks that only move forward, owner records whose tokens only increase,
//! and acknowledgements that only the recorded owner may make.
//!
//! Each is one script whose keys share one slot (`{N}:transition` alone;
//! `{N/p}:owner` with `{N/p}:stream`), so it is atomic under Redis Cluster.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::streams::StreamAutoClaimReply;
use deadpool_redis::redis::{self, FromRedisValue, Script, ScriptInvocation, Value};

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
static FENCED_MOVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fenced_move.lua")));
static FENCED_CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fenced_claim.lua")));
static FENCED_KEEP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fenced_keep.lua")));
static FENCED_RETRY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fenced_retry.lua")));
static FENCED_ATTEMPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fenced_attempt.lua")));
static PROMOTE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/promote.lua")));

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

/// The marks of `partitions` (those with none are left out), in one `HMGET`.
pub(crate) async fn marks(
    conn: &SharedConnection,
    name: &ServiceName,
    partitions: &[u32],
) -> Result<BTreeMap<u32, u64>> {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(keys::transition(name)).arg(partitions);
    let values: Vec<Option<u64>> = conn.query(&cmd).await?;
    Ok(partitions
        .iter()
        .zip(values)
        .filter_map(|(p, m)| Some((*p, m?)))
        .collect())
}

/// What a fenced move did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moved {
    /// Acked in the partition and added at the destination.
    Yes,
    /// The entry was not pending any more (an earlier call landed and its
    /// reply was lost): nothing was added.
    NotPending,
    /// Another instance owns the partition now: nothing changed.
    Fenced,
}

impl Moved {
    /// A fenced script's reply: 1, 0 or -1.
    fn from_reply(reply: i64) -> Moved {
        match reply {
            1 => Moved::Yes,
            0 => Moved::NotPending,
            _ => Moved::Fenced,
        }
    }
}

/// This instance as the owner of one partition with one fencing token:
/// every write the framework makes to the partition's entries goes through
/// it, and Redis refuses them once another instance holds the partition.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    partition: u32,
    token: u64,
    stream: String,
    owner: String,
    delayed: String,
    instance: String,
    record: String,
}

impl Fence {
    /// Partition `p` of `name`, owned by `id` with `token`.
    pub(crate) fn new(name: &ServiceName, p: u32, token: u64, id: &InstanceId) -> Self {
        Fence {
            partition: p,
            token,
            stream: keys::stream(name, p),
            owner: keys::owner(name, p),
            delayed: keys::delayed(name, p),
            instance: id.as_str().to_owned(),
            record: owner_record(token, id),
        }
    }

    /// The partition.
    pub(crate) fn partition(&self) -> u32 {
        self.partition
    }

    /// The fencing token.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// The partition's stream.
    pub(crate) fn stream(&self) -> &str {
        &self.stream
    }

    /// Records this instance as owner (rule 3). `Ok(None)` when recorded;
    /// `Ok(Some(t))` when a token `t >= token` is recorded already (this
    /// instance is too late, and must not fetch).
    pub(crate) async fn acquire(&self, conn: &SharedConnection) -> Result<Option<u64>> {
        let mut script = ACQUIRE.key(&self.owner);
        script.arg(self.token).arg(&self.instance);
        let reply: i64 = conn.invoke(&script).await?;
        Ok((reply <= 0).then_some(reply.unsigned_abs()))
    }

    /// The fenced ack of `ids`, to invoke alone or in a pipeline; replies
    /// the number acked, or -1 when fenced.
    pub(crate) fn ack<'a>(&'a self, ids: &[&str]) -> ScriptInvocation<'a> {
        let mut script = FENCED_ACK.key(&self.stream);
        script
            .key(&self.owner)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(ids);
        script
    }

    /// Acks entry `id` and adds `fields` as a new entry to `destination`
    /// (this partition's stream or dead letters), atomically and only while
    /// this instance is the owner.
    pub(crate) async fn move_entry<K: redis::ToRedisArgs, V: redis::ToRedisArgs>(
        &self,
        conn: &SharedConnection,
        destination: &str,
        id: &str,
        fields: &[(K, V)],
    ) -> Result<Moved> {
        let mut script = FENCED_MOVE.key(&self.stream);
        script
            .key(&self.owner)
            .key(destination)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(id);
        for (k, v) in fields {
            script.arg(k).arg(v);
        }
        Ok(Moved::from_reply(conn.invoke(&script).await?))
    }

    /// Acks entry `id` (a failed attempt) and enqueues `fields` (the next
    /// attempt) after `delay`, atomically and only while this instance is
    /// the owner.
    pub(crate) async fn retry<K: redis::ToRedisArgs, V: redis::ToRedisArgs>(
        &self,
        conn: &SharedConnection,
        id: &str,
        delay: Duration,
        fields: &[(K, V)],
    ) -> Result<Moved> {
        let mut script = FENCED_RETRY.key(&self.stream);
        script
            .key(&self.owner)
            .key(&self.delayed)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(id)
            .arg(delay.as_millis() as u64);
        for (k, v) in fields {
            script.arg(k).arg(v);
        }
        Ok(Moved::from_reply(conn.invoke(&script).await?))
    }

    /// Moves up to `limit` due delayed entries into the stream; returns how
    /// many, and how long until the next one is due (`None`: none waits).
    pub(crate) async fn promote(
        &self,
        conn: &SharedConnection,
        limit: usize,
    ) -> Result<(u64, Option<Duration>)> {
        let mut script = PROMOTE.key(&self.delayed);
        script.key(&self.stream).arg(limit);
        let (moved, next): (u64, i64) = conn.invoke(&script).await?;
        let next = u64::try_from(next).ok().map(Duration::from_millis);
        Ok((moved, next))
    }

    /// `XAUTOCLAIM` to `consumer` of entries idle at least `min_idle`, from
    /// `start`; `Ok(None)` when fenced. `just_ids`: return only the ids and
    /// leave the delivery counts as they are (ordered mode, where the count
    /// is the attempt record, see [`Fence::record_attempt`]).
    pub(crate) async fn claim(
        &self,
        conn: &SharedConnection,
        consumer: &str,
        min_idle: Duration,
        start: &str,
        count: usize,
        just_ids: bool,
    ) -> Result<Option<StreamAutoClaimReply>> {
        let mut script = FENCED_CLAIM.key(&self.stream);
        script
            .key(&self.owner)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(consumer)
            .arg(min_idle.as_millis() as u64)
            .arg(start)
            .arg(count);
        if just_ids {
            script.arg("JUSTID");
        }
        let reply: Value = conn.invoke(&script).await?;
        if matches!(reply, Value::Int(_)) {
            return Ok(None);
        }
        let reply =
            StreamAutoClaimReply::from_redis_value(reply).map_err(redis::RedisError::from)?;
        Ok(Some(reply))
    }

    /// Resets the idle time of `ids` (held by `consumer`), so nobody claims
    /// them; `Ok(false)` when fenced.
    pub(crate) async fn keep(
        &self,
        conn: &SharedConnection,
        consumer: &str,
        ids: &[String],
    ) -> Result<bool> {
        let mut script = FENCED_KEEP.key(&self.stream);
        script
            .key(&self.owner)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(consumer)
            .arg(ids);
        let reply: i64 = conn.invoke(&script).await?;
        Ok(reply >= 0)
    }

    /// Ordered mode: records that `attempt` of entry `id` (held by
    /// `consumer`) starts now, as the entry's delivery count, so that the
    /// next owner continues the count (a later delivery adds one: the
    /// attempt that may have run). `Ok(None)` when fenced, `Ok(Some(false))`
    /// when the entry is not pending.
    pub(crate) async fn record_attempt(
        &self,
        conn: &SharedConnection,
        consumer: &str,
        id: &str,
        attempt: u32,
    ) -> Result<Option<bool>> {
        let mut script = FENCED_ATTEMPT.key(&self.stream);
        script
            .key(&self.owner)
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(consumer)
            .arg(id)
            .arg(attempt);
        let reply: i64 = conn.invoke(&script).await?;
        Ok((reply >= 0).then_some(reply > 0))
    }
}

/// Loads the fenced ack script, for pipelines (which do not load scripts
/// by themselves) after Redis answered `NOSCRIPT` (it restarted).
pub(crate) async fn load_ack_script(conn: &SharedConnection) -> Result<()> {
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(include_str!("scripts/fenced_ack.lua"));
    conn.query::<String>(&load).await.map(drop)
}

#[cfg(test)]
mod tests {
    //! Against a real redis-server started by the integration tests' harness.

    use super::*;
    use crate::test_support as support;
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
        let fence = |token, id| Fence::new(&name, 0, token, id);
        assert_eq!(fence(10, &a).acquire(&conn).await.unwrap(), None);
        assert_eq!(
            fence(10, &b).acquire(&conn).await.unwrap(),
            Some(10),
            "same token: refused"
        );
        assert_eq!(
            fence(9, &b).acquire(&conn).await.unwrap(),
            Some(10),
            "older token: refused"
        );
        assert_eq!(fence(12, &b).acquire(&conn).await.unwrap(), None);
        assert_eq!(
            fence(12, &b).acquire(&conn).await.unwrap(),
            None,
            "the same acquire again (a retry after a lost reply) is not refused"
        );
        let mut raw = server.pool().get().await.unwrap();
        let record: String = raw.get(keys::owner(&name, 0)).await.unwrap();
        assert_eq!(record, owner_record(12, &b));
    }

    /// A partition stream with one entry delivered to `consumer`.
    async fn delivered(
        server: &support::RedisServer,
        name: &ServiceName,
        consumer: &InstanceId,
    ) -> String {
        let mut raw = server.pool().get().await.unwrap();
        let stream = keys::stream(name, 0);
        let () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg(keys::GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut *raw)
            .await
            .unwrap();
        let id: String = raw.xadd(&stream, "*", &[("k", "v")]).await.unwrap();
        let _: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(keys::GROUP)
            .arg(consumer.as_str())
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query_async(&mut *raw)
            .await
            .unwrap();
        id
    }

    async fn pending(server: &support::RedisServer, name: &ServiceName) -> usize {
        let mut raw = server.pool().get().await.unwrap();
        let pending: redis::streams::StreamPendingReply = raw
            .xpending(keys::stream(name, 0), keys::GROUP)
            .await
            .unwrap();
        pending.count()
    }

    /// Partition 0 with an entry delivered to its old owner, then acquired
    /// by a new one: (entry id, stale fence, owner fence, old id, new id).
    async fn moved_on(
        server: &support::RedisServer,
        conn: &SharedConnection,
        name: &ServiceName,
    ) -> (String, Fence, Fence, InstanceId, InstanceId) {
        let (old, new) = (InstanceId::generate(), InstanceId::generate());
        let id = delivered(server, name, &old).await;
        let (stale, owner) = (Fence::new(name, 0, 5, &old), Fence::new(name, 0, 6, &new));
        stale.acquire(conn).await.unwrap();
        // The partition moved on: the old owner may no longer write.
        owner.acquire(conn).await.unwrap();
        (id, stale, owner, old, new)
    }

    async fn run_ack(conn: &SharedConnection, fence: &Fence, id: &str) -> i64 {
        conn.invoke(&fence.ack(&[id])).await.unwrap()
    }

    #[tokio::test]
    async fn a_stale_owners_ack_is_refused() {
        let (server, conn, name) = setup().await;
        let (id, stale, owner, _, _) = moved_on(&server, &conn, &name).await;
        assert_eq!(run_ack(&conn, &stale, &id).await, -1);
        assert_eq!(
            pending(&server, &name).await,
            1,
            "the refused ack left the entry pending"
        );
        assert_eq!(run_ack(&conn, &owner, &id).await, 1);
    }

    #[tokio::test]
    async fn a_stale_owner_can_neither_move_nor_claim_nor_keep() {
        let (server, conn, name) = setup().await;
        let (id, stale, owner, old, new) = moved_on(&server, &conn, &name).await;
        let dead = keys::dead(&name, 0);
        let fields = [("k", "v2")];
        assert_eq!(
            stale.move_entry(&conn, &dead, &id, &fields).await.unwrap(),
            Moved::Fenced
        );
        assert!(
            stale
                .claim(&conn, old.as_str(), Duration::ZERO, "0", 10, false)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            !stale
                .keep(&conn, old.as_str(), std::slice::from_ref(&id))
                .await
                .unwrap()
        );
        let mut raw = server.pool().get().await.unwrap();
        let dead_len: usize = raw.xlen(&dead).await.unwrap();
        assert_eq!(
            (dead_len, pending(&server, &name).await),
            (0, 1),
            "nothing moved"
        );

        // The owner claims it (the stale owner still holds it), keeps it,
        // and moves it once even when the move is repeated.
        let claimed = owner
            .claim(&conn, new.as_str(), Duration::ZERO, "0", 10, false)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claimed.claimed.len(), 1);
        assert!(
            owner
                .keep(&conn, new.as_str(), std::slice::from_ref(&id))
                .await
                .unwrap()
        );
        assert_eq!(
            owner.move_entry(&conn, &dead, &id, &fields).await.unwrap(),
            Moved::Yes
        );
        assert_eq!(
            owner.move_entry(&conn, &dead, &id, &fields).await.unwrap(),
            Moved::NotPending
        );
        let dead_len: usize = raw.xlen(&dead).await.unwrap();
        assert_eq!((dead_len, pending(&server, &name).await), (1, 0));
    }

    async fn delivery_count(server: &support::RedisServer, name: &ServiceName, id: &str) -> usize {
        let mut raw = server.pool().get().await.unwrap();
        let reply: redis::streams::StreamPendingCountReply = raw
            .xpending_count(keys::stream(name, 0), keys::GROUP, id, id, 1)
            .await
            .unwrap();
        reply.ids[0].times_delivered
    }

    #[tokio::test]
    async fn an_attempt_record_is_the_owners_alone_and_a_just_ids_claim_keeps_it() {
        let (server, conn, name) = setup().await;
        let (id, stale, owner, old, new) = moved_on(&server, &conn, &name).await;
        assert_eq!(
            stale
                .record_attempt(&conn, old.as_str(), &id, 5)
                .await
                .unwrap(),
            None,
            "fenced"
        );
        assert_eq!(delivery_count(&server, &name, &id).await, 1);
        // Ordered take-over: claimed with its ids only, the count unchanged.
        let claimed = owner
            .claim(&conn, new.as_str(), Duration::ZERO, "0", 10, true)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claimed.claimed.len(), 1);
        assert_eq!(claimed.claimed[0].id, id);
        assert_eq!(delivery_count(&server, &name, &id).await, 1);
        assert_eq!(
            owner
                .record_attempt(&conn, new.as_str(), &id, 5)
                .await
                .unwrap(),
            Some(true)
        );
        assert_eq!(delivery_count(&server, &name, &id).await, 5);
        assert_eq!(run_ack(&conn, &owner, &id).await, 1);
        assert_eq!(
            owner
                .record_attempt(&conn, new.as_str(), &id, 6)
                .await
                .unwrap(),
            Some(false),
            "not pending any more"
        );
    }
}
