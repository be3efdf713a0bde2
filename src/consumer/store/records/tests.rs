//! The partition store's task records against a real redis-server: the
//! owner's care, a record kept small, and a start that meets a cancel
//! request.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::AsyncCommands;
use peerq_test_support as support;

use super::PartitionStore;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::instance::InstanceId;
use crate::keys;
use crate::tracking::Tracking;

/// A private Redis and the store of partition 0 of a new service, under
/// fencing token 1.
fn setup() -> (support::RedisServer, PartitionStore, ServiceName) {
    let server = support::RedisServer::start();
    let conn = Arc::new(SharedConnection::new(server.pool()));
    let name = ServiceName::new(&support::unique_name("records")).unwrap();
    let store = PartitionStore::new(conn, &name, 0, 1, &InstanceId::generate(), 1 << 20);
    (server, store, name)
}

/// The owner's care forgets what the retention and the sweep time say,
/// and nothing else: a record that still changes, or whose task runs,
/// stays; a final one goes by its end, not by when it was written.
#[tokio::test]
async fn the_owners_care_forgets_stale_records_and_final_ones_past_retention() {
    let (server, store, name) = setup();
    let mut raw = server.pool().get().await.unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let days = |n: u64| now - n * 86_400_000;
    let tasks = keys::tasks(&name, 0);
    // Records as the scripts write them: `cmsgpack.pack(name, value,
    // …)`, written here by Redis's own packer.
    let records: [(&str, &str, u64, u64); 7] = [
        // Not final, untouched for 8 days: forgotten.
        ("old", "'s', 'waiting', 'q', ARGV[2]", days(8), 0),
        // A cancel request for a task that never came: forgotten.
        ("asked", "'c', ARGV[2]", days(8), 0),
        // Enqueued a day ago: kept.
        ("young", "'s', 'waiting', 'q', ARGV[2]", days(1), 0),
        // Enqueued long ago but retried an hour ago: kept.
        (
            "retried",
            "'s', 'waiting', 'q', ARGV[2]) .. cmsgpack.pack('s', 'retrying', 'd', ARGV[3]",
            days(8),
            now - 3_600_000,
        ),
        // Untouched for 8 days but running now: kept.
        ("runs", "'s', 'waiting', 'q', ARGV[2]", days(8), 0),
        // Final, ended 10 s ago, and just now.
        ("done", "'s', 'succeeded', 'f', ARGV[2]", now - 10_000, 0),
        ("fresh", "'s', 'succeeded', 'f', ARGV[2]", now, 0),
    ];
    for (id, fields, a, b) in records {
        let lua = format!("return redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack({fields}))");
        let _: i64 = deadpool_redis::redis::cmd("EVAL")
            .arg(lua)
            .arg(1)
            .arg(&tasks)
            .arg(id)
            .arg(a)
            .arg(b)
            .query_async(&mut *raw)
            .await
            .unwrap();
    }
    let () = raw
        .hset(keys::running(&name, 0), "runs", "i|1|1|0")
        .await
        .unwrap();
    let _: u64 = raw
        .rpush(keys::ended(&name, 0), &["done", "fresh"])
        .await
        .unwrap();
    let runs = [format!("{} 1", now - 10_000), format!("{now} 1")];
    let _: u64 = raw.rpush(keys::ended_at(&name, 0), &runs).await.unwrap();
    let tracking = Tracking::on().keep(Duration::from_secs(5));

    // Without a cursor, only the retention: `done` goes, `old` stays.
    let (next, forgotten, due) = store.sweep(&tracking, None, 1000).await.unwrap();
    assert_eq!((next.as_str(), forgotten), ("", 0));
    let due = due.expect("`fresh` is left");
    assert!(
        due > Duration::from_secs(3) && due <= Duration::from_secs(5),
        "{due:?}"
    );
    let ids = |fields: Vec<String>| -> BTreeSet<String> { fields.into_iter().collect() };
    let left = ids(raw.hkeys(&tasks).await.unwrap());
    let want = ["asked", "fresh", "old", "retried", "runs", "young"];
    assert_eq!(left, want.map(String::from).into());
    let list: Vec<String> = raw.lrange(keys::ended(&name, 0), 0, -1).await.unwrap();
    assert_eq!(list, ["fresh"]);
    let runs: Vec<String> = raw.lrange(keys::ended_at(&name, 0), 0, -1).await.unwrap();
    assert_eq!(runs, [format!("{now} 1")]);

    // A whole pass: the two stale ones go.
    let (mut cursor, mut forgotten) = ("0".to_owned(), 0);
    loop {
        let (next, n, _) = store.sweep(&tracking, Some(&cursor), 1000).await.unwrap();
        forgotten += n;
        cursor = next;
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(forgotten, 2);
    let left = ids(raw.hkeys(&tasks).await.unwrap());
    let want = ["fresh", "retried", "runs", "young"];
    assert_eq!(left, want.map(String::from).into());

    // A run a replay left empty, ended long ago, goes, and the next
    // care is due when `fresh` is (not at once, again and again).
    let _: u64 = raw
        .lpush(keys::ended_at(&name, 0), format!("{} 0", now - 60_000))
        .await
        .unwrap();
    let (_, _, due) = store.sweep(&tracking, None, 1000).await.unwrap();
    assert!(due.unwrap() > Duration::from_secs(3), "{due:?}");
    let runs: Vec<String> = raw.lrange(keys::ended_at(&name, 0), 0, -1).await.unwrap();
    assert_eq!(runs, [format!("{now} 1")]);
}

/// A record is appended to as its task changes, and written anew from
/// its decoded fields once over 512 bytes (track.lua, `append`): a task
/// that reports progress all day keeps one record of bounded size,
/// with its last progress and what it held before.
#[tokio::test]
async fn a_record_written_often_stays_small_and_keeps_its_last_values() {
    let (server, store, name) = setup();
    assert_eq!(store.acquire().await.unwrap(), None);
    let mut raw = server.pool().get().await.unwrap();
    let record = crate::tracking::packed::waiting(1_000);
    let () = raw.hset(keys::tasks(&name, 0), "t1", record).await.unwrap();
    let () = raw
        .hset(keys::running(&name, 0), "t1", store.running(1, 2_000))
        .await
        .unwrap();
    for step in 0..50u8 {
        assert!(store.progress("t1", &[step; 100]).await.unwrap());
    }
    let record: Vec<u8> = raw.hget(keys::tasks(&name, 0), "t1").await.unwrap();
    assert!(record.len() < 512 + 110, "{} bytes", record.len());
    let fields = crate::tracking::packed::decode(&record).unwrap();
    assert_eq!(fields["progress"], [49u8; 100]);
    assert_eq!(fields["state"], b"waiting");
    assert_eq!(fields["enqueued_at"], b"1000");
}

/// A batch's start that meets a cancel request: the requested task never
/// starts, its entry is acked and its record says `cancelled` (its stream
/// id sent in a second call, docs/design.md §14), and the others run.
#[tokio::test]
async fn a_start_ends_a_requested_task_cancelled_and_starts_the_others() {
    let (server, store, name) = setup();
    assert_eq!(store.acquire().await.unwrap(), None);
    let entries: Vec<[(&str, &str); 1]> = ["t1", "t2", "t3"].map(|t| [("id", t)]).into();
    let entries: Vec<&[(&str, &str)]> = entries.iter().map(|e| &e[..]).collect();
    let consumer = store.ran(1, 0).instance;
    let ids = super::super::tests::delivered_all(&server, &name, consumer, &entries).await;
    let mut raw = server.pool().get().await.unwrap();
    for task in ["t1", "t2", "t3"] {
        let record = crate::tracking::packed::waiting(1_000);
        let () = raw.hset(keys::tasks(&name, 0), task, record).await.unwrap();
    }
    let stream = keys::stream(&name, 0);
    let _: u64 = raw
        .zadd(keys::cancel_requests(&name, 0), "t2", 1_500)
        .await
        .unwrap();

    let starting = [
        (&*ids[0], "t1", 1),
        (&*ids[1], "t2", 1),
        (&*ids[2], "t3", 1),
    ];
    let skipped = store.start(&Tracking::on(), 2_000, &starting).await;
    assert_eq!(skipped.unwrap(), Some(vec![ids[1].clone()]));

    let running: Vec<String> = raw.hkeys(keys::running(&name, 0)).await.unwrap();
    let running: BTreeSet<String> = running.into_iter().filter(|f| !f.is_empty()).collect();
    assert_eq!(running, ["t1", "t3"].map(String::from).into());
    let record: Vec<u8> = raw.hget(keys::tasks(&name, 0), "t2").await.unwrap();
    let fields = crate::tracking::packed::decode(&record).unwrap();
    assert_eq!(fields["state"], b"cancelled");
    let pending: deadpool_redis::redis::streams::StreamPendingCountReply = raw
        .xpending_count(&stream, keys::GROUP, "-", "+", 10)
        .await
        .unwrap();
    let pending: Vec<&str> = pending.ids.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(pending, [&*ids[0], &*ids[2]], "its entry is acked");
    let requests: u64 = raw.zcard(keys::cancel_requests(&name, 0)).await.unwrap();
    assert_eq!(requests, 0, "the request did its work");
}
