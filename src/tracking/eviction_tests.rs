//! The retention's count against a real redis-server (docs/design.md §14):
//! an ended list never outgrows `keep_count` by more than one script's
//! ends, whatever the sizes of the runs at its head. Found after the
//! chaos run's hour (RELIABILITY.md): single ends at the head (cancels of
//! waiting tasks, one script each) let a later ack add 100 ids while its
//! eviction, which looked at 16 runs only, took 16.

use deadpool_redis::redis::{self, Script};
use peerq_test_support as support;

use super::tracked_script;

const KEEP: u32 = 20;

/// Ends `n` tasks named `<prefix><i>` in one script; the ended list's
/// length after it.
async fn end_tasks(conn: &mut deadpool_redis::Connection, name: &str, prefix: &str, n: u32) -> u32 {
    let script = Script::new(tracked_script!("testing/end_tasks.lua"));
    let p = format!("{{{name}/0}}");
    script
        .arg(format!("{p}:tasks"))
        .arg(7 * 86_400_000u64)
        .arg(86_400_000u64)
        .arg(KEEP)
        .arg(format!("{p}:ended"))
        .arg("PUBLISH")
        .arg(format!("{p}:final"))
        .arg(n)
        .arg(prefix)
        .invoke_async(&mut **conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_ended_list_keeps_its_count_behind_a_head_of_single_ends() {
    let server = support::RedisServer::start();
    let mut conn = server.pool().get().await.unwrap();
    let name = support::unique_name("eviction");
    // Forty cancels, one end each: the list holds the newest 20, each its
    // own run.
    for i in 0..40 {
        let len = end_tasks(&mut conn, &name, &format!("c{i}-"), 1).await;
        assert!(len <= KEEP, "after {i} single ends: {len}");
    }
    // An ack of 100: the list is back at its count at once.
    let len = end_tasks(&mut conn, &name, "a", 100).await;
    assert_eq!(len, KEEP, "after an ack of 100 behind 20 single ends");
    let records: u32 = redis::cmd("HLEN")
        .arg(format!("{{{name}/0}}:tasks"))
        .query_async(&mut *conn)
        .await
        .unwrap();
    assert_eq!(records, KEEP, "a record for each id kept, no more");
    let counted: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("{{{name}/0}}:ended_at"))
        .arg(0)
        .arg(-1)
        .query_async(&mut *conn)
        .await
        .unwrap();
    let ids: u32 = counted
        .iter()
        .map(|run| run.rsplit_once(' ').unwrap().1.parse::<u32>().unwrap())
        .sum();
    assert_eq!(ids, KEEP, "the runs count the ids kept: {counted:?}");
}
