//! Against a real redis-server started by the integration tests' harness.

use super::*;
use crate::marks::mark;
use deadpool_redis::redis::AsyncCommands;
use peerq_test_support as support;

/// The largest entry read: far above what these tests write.
const LIMIT: usize = 1 << 20;

pub(super) async fn setup() -> (support::RedisServer, Arc<SharedConnection>, ServiceName) {
    let server = support::RedisServer::start();
    let conn = Arc::new(SharedConnection::new(server.pool()));
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
    let fence = |token, id| PartitionStore::new(conn.clone(), &name, 0, token, id, LIMIT);
    assert_eq!(fence(10, &a).acquire().await.unwrap(), None);
    assert_eq!(
        fence(10, &b).acquire().await.unwrap(),
        Some(10),
        "same token: refused"
    );
    assert_eq!(
        fence(9, &b).acquire().await.unwrap(),
        Some(10),
        "older token: refused"
    );
    assert_eq!(fence(12, &b).acquire().await.unwrap(), None);
    assert_eq!(
        fence(12, &b).acquire().await.unwrap(),
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
    let entries: [&[(&str, &str)]; 1] = [&[("k", "v")]];
    delivered_all(server, name, consumer.as_str(), &entries)
        .await
        .remove(0)
}

/// Partition 0's stream and group with an entry of each of `entries`'
/// fields, all delivered to `consumer`: their ids.
pub(super) async fn delivered_all(
    server: &support::RedisServer,
    name: &ServiceName,
    consumer: &str,
    entries: &[&[(&str, &str)]],
) -> Vec<String> {
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
    let mut ids = Vec::new();
    for fields in entries {
        let id: String = raw.xadd(&stream, "*", fields).await.unwrap();
        ids.push(id);
    }
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(keys::GROUP)
        .arg(consumer)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut *raw)
        .await
        .unwrap();
    ids
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
/// by a new one: (entry id, the stale owner's store, the owner's).
async fn moved_on(
    server: &support::RedisServer,
    conn: &Arc<SharedConnection>,
    name: &ServiceName,
) -> (String, PartitionStore, PartitionStore) {
    let (old, new) = (InstanceId::generate(), InstanceId::generate());
    let id = delivered(server, name, &old).await;
    let stale = PartitionStore::new(conn.clone(), name, 0, 5, &old, LIMIT);
    let owner = PartitionStore::new(conn.clone(), name, 0, 6, &new, LIMIT);
    stale.acquire().await.unwrap();
    // The partition moved on: the old owner may no longer write.
    owner.acquire().await.unwrap();
    (id, stale, owner)
}

async fn run_ack(conn: &SharedConnection, store: &PartitionStore, id: &str) -> i64 {
    let group = super::AckGroup {
        store,
        ids: vec![id],
        tracked: Vec::new(),
        unique: Vec::new(),
        tracking: None,
        members: Vec::new(),
    };
    conn.eval(&super::acks::FENCED_ACK, &store.ack_script(&group))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_stale_owners_ack_is_refused() {
    let (server, conn, name) = setup().await;
    let (id, stale, owner) = moved_on(&server, &conn, &name).await;
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
    let (id, stale, owner) = moved_on(&server, &conn, &name).await;
    let dead = keys::dead(&name, 0);
    let fields = [("k", "v2")];
    assert_eq!(
        stale
            .move_entry(To::DeadLetters, &id, &fields, None)
            .await
            .unwrap(),
        Moved::Fenced
    );
    assert!(
        stale
            .claim(Duration::ZERO, "0", 10, false)
            .await
            .unwrap()
            .is_none()
    );
    assert!(!stale.keep(std::slice::from_ref(&id)).await.unwrap());
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
        .claim(Duration::ZERO, "0", 10, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.entries.len(), 1);
    assert!(owner.keep(std::slice::from_ref(&id)).await.unwrap());
    assert_eq!(
        owner
            .move_entry(To::DeadLetters, &id, &fields, None)
            .await
            .unwrap(),
        Moved::Yes
    );
    assert_eq!(
        owner
            .move_entry(To::DeadLetters, &id, &fields, None)
            .await
            .unwrap(),
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
    let (id, stale, owner) = moved_on(&server, &conn, &name).await;
    let starts = |n| Deliveries::Runs(n);
    let recorded = stale.record_attempts(&id, starts(5), Some(1), None).await;
    assert_eq!(recorded.unwrap(), None, "fenced");
    let before = owner.attempts(&id).await.unwrap();
    assert_eq!((before.deliveries, before.failures), (1, 0));
    // Ordered take-over: claimed with its ids only, the count unchanged.
    let claimed = owner
        .claim(Duration::ZERO, "0", 10, true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.entries.len(), 1);
    assert_eq!(claimed.entries[0].id, id);
    assert_eq!(delivery_count(&server, &name, &id).await, 1);
    let recorded = owner.record_attempts(&id, starts(5), None, None).await;
    assert_eq!(recorded.unwrap(), Some(Recorded::Yes));
    assert_eq!(delivery_count(&server, &name, &id).await, 5);
    // Attempt 5 failed: its count stays, its failure is recorded.
    let recorded = owner.record_attempts(&id, starts(5), Some(2), None).await;
    assert_eq!(recorded.unwrap(), Some(Recorded::Yes));
    let failed = owner.attempts(&id).await.unwrap();
    assert_eq!((failed.deliveries, failed.failures), (5, 2));
    // Delivered again and released before it started: the delivery that
    // started nothing is taken back.
    let _ = owner.read(&conn, "0", 10).await.unwrap();
    assert_eq!(delivery_count(&server, &name, &id).await, 6);
    let released = owner
        .record_attempts(&id, Deliveries::Unstarted, None, None)
        .await;
    assert_eq!(released.unwrap(), Some(Recorded::Yes));
    let released = owner.attempts(&id).await.unwrap();
    assert_eq!((released.deliveries, released.failures), (5, 2));
    let failures = keys::failures(&name, 0);
    let mut raw = server.pool().get().await.unwrap();
    owner.trim().await.unwrap();
    let kept: bool = raw.hexists(&failures, &id).await.unwrap();
    assert!(kept, "a pending entry keeps its failure count");
    assert_eq!(run_ack(&conn, &owner, &id).await, 1);
    assert_eq!(
        owner
            .record_attempts(&id, starts(6), Some(3), None)
            .await
            .unwrap(),
        Some(Recorded::NotPending),
        "not pending any more"
    );
    let gone = owner.attempts(&id).await.unwrap();
    assert_eq!(gone.deliveries, 0);
    owner.trim().await.unwrap();
    let left: bool = raw.exists(&failures).await.unwrap();
    assert!(!left, "the trim forgets the failures of acked entries");
}

#[tokio::test]
async fn reads_parse_entries_keep_deleted_ones_and_say_when_the_group_is_gone() {
    let (server, conn, name) = setup().await;
    let me = InstanceId::generate();
    let store = PartitionStore::new(conn.clone(), &name, 0, 1, &me, LIMIT);
    // One entry delivered and then deleted while pending.
    let deleted = delivered(&server, &name, &me).await;
    let mut raw = server.pool().get().await.unwrap();
    let stream = keys::stream(&name, 0);
    let _: u64 = raw.xdel(&stream, &[&deleted]).await.unwrap();
    let entry = Entry::new(
        crate::entry::TaskId::from("t-1"),
        None,
        "json",
        b"[1]".to_vec(),
    );
    let _: String = raw.xadd(&stream, "*", &entry.fields()).await.unwrap();
    let fresh = store.read(&conn, ">", 10).await.unwrap();
    assert_eq!(fresh.len(), 1);
    assert_eq!(fresh[0].entry.as_ref().unwrap(), &entry);
    let pending = store.read(&conn, "0", 10).await.unwrap();
    let ids: Vec<&str> = pending.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids, [deleted.as_str(), fresh[0].id.as_str()]);
    let gone = pending[0].entry.as_ref().unwrap_err();
    assert_eq!((gone.why.reason(), gone.fields.len()), ("malformed", 0));
    let () = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(&stream)
        .arg(keys::GROUP)
        .query_async(&mut *raw)
        .await
        .map(|_: i64| ())
        .unwrap();
    let err = store.read(&conn, ">", 10).await.unwrap_err();
    assert!(is_nogroup(&err), "{err:?}");
}

/// Task `task`'s record field `field` in partition 0.
async fn record_field(
    server: &support::RedisServer,
    name: &ServiceName,
    task: &str,
    field: &str,
) -> Option<String> {
    let mut raw = server.pool().get().await.unwrap();
    let record: Option<Vec<u8>> = raw.hget(keys::tasks(name, 0), task).await.unwrap();
    let mut fields = crate::tracking::packed::decode(&record?).expect("a record");
    fields.remove(field).map(|v| String::from_utf8(v).unwrap())
}

#[tokio::test]
async fn a_stale_owner_writes_no_task_record_and_the_owner_does() {
    let (server, conn, name) = setup().await;
    let (id, stale, owner) = moved_on(&server, &conn, &name).await;
    let tracking = crate::tracking::Tracking::on();
    // How the task ended, as its run tells its ack (with the progress it
    // wrote and its result); each instance writes it as it ran it.
    let ended = super::Succeeded {
        task: "t1".into(),
        attempt: 1,
        started_at: 2,
        enqueued_at: 1,
        finished_at: 3,
        progress: Some(b"7".to_vec()),
        result: b"42".to_vec(),
    };
    let id = id.as_str();
    let ack = |store: &PartitionStore| {
        let group = super::AckGroup {
            store,
            ids: Vec::new(),
            tracked: vec![(id, &ended)],
            unique: Vec::new(),
            tracking: Some(tracking),
            members: Vec::new(),
        };
        let cmd = store.ack_script(&group);
        let conn = conn.clone();
        async move {
            let acked: i64 = conn.eval(&super::acks::FENCED_ACK, &cmd).await.unwrap();
            acked
        }
    };
    // The old owner: its start, progress and ack are refused, and write
    // nothing.
    assert_eq!(
        stale.start(&tracking, 2, &[(id, "t1", 1)]).await.unwrap(),
        None
    );
    assert!(!stale.progress("t1", b"7").await.unwrap());
    assert_eq!(ack(&stale).await, -1);
    assert_eq!(record_field(&server, &name, "t1", "state").await, None);
    // The owner: running under its token, its progress, then succeeded
    // with the result, as the ack acked the entry.
    assert_eq!(
        owner.start(&tracking, 2, &[(id, "t1", 1)]).await.unwrap(),
        Some(vec![])
    );
    let mut raw = server.pool().get().await.unwrap();
    let running: Option<String> = raw.hget(keys::running(&name, 0), "t1").await.unwrap();
    let running = running.expect("running here");
    assert!(
        running.contains(&format!("|{}|1|", owner.token())),
        "{running}"
    );
    assert!(owner.progress("t1", b"7").await.unwrap());
    assert!(!stale.progress("t1", b"8").await.unwrap(), "still refused");
    assert_eq!(ack(&owner).await, 1);
    assert_eq!(
        record_field(&server, &name, "t1", "state").await.as_deref(),
        Some("succeeded")
    );
    let ran = record_field(&server, &name, "t1", "ran")
        .await
        .expect("what it ran as");
    assert!(ran.contains(&format!("|{}|1|", owner.token())), "{ran}");
    let running: Option<String> = raw.hget(keys::running(&name, 0), "t1").await.unwrap();
    assert_eq!(running, None, "it runs no more");
    assert_eq!(
        record_field(&server, &name, "t1", "result")
            .await
            .as_deref(),
        Some("42")
    );
    assert_eq!(
        record_field(&server, &name, "t1", "progress")
            .await
            .as_deref(),
        Some("7")
    );
    // Not pending any more: an ack sent again acks nothing and leaves the
    // record as it is.
    assert_eq!(ack(&owner).await, 0);
}
