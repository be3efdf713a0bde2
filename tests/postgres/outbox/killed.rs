//! A relay killed with SIGKILL after its `XADD`s, before its delete
//! committed: Postgres rolls its transaction back, the next relay sends the
//! rows again, and the dedup record `outbox:<task id>` keeps each task to
//! one run.

use std::time::Duration;

use deadpool_redis::redis;
use peerq::DEFAULT_PARTITIONS;
use peerq::Options;
use peerq::postgres::Relay;
use sqlx::PgPool;

use super::{Record, World, each_ran_once, mail};
use support::child_test;

/// Turns [`child_relay`] into the child process of the test: the database
/// URL, the Redis URL and the service name, separated by spaces.
const CHILD_ENV: &str = "PEERQ_OUTBOX_RELAY_CHILD";
const ROWS: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_between_its_xadd_and_its_delete_runs_each_task_once() {
    let world = World::new("outbox-killed").await;
    let mut ids = Vec::new();
    for seq in 0..ROWS {
        // Three keys: three lanes.
        let key = Options::new().key(format!("user-{}", seq % 3));
        ids.push(world.commit(&mail("k", seq), key).await);
    }
    let given = format!("{} {} {}", world.db_url, world.redis.url(), world.name);
    let (mut child, line) = tokio::task::spawn_blocking(move || {
        child_test("outbox::killed::child_relay", (CHILD_ENV, &given), "sent ")
    })
    .await
    .unwrap();
    let sent: Vec<&str> = line.split(',').collect();
    assert!(
        !sent.is_empty() && sent.iter().all(|id| ids.iter().any(|i| i == id)),
        "{line}"
    );
    // Killed between the `XADD`s and the delete.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert_eq!(
        world.outbox_rows().await,
        ROWS as i64,
        "nothing was deleted"
    );
    let in_redis = stream_entries(&world).await;
    assert_eq!(
        in_redis,
        sent.len(),
        "what the killed relay sent is in redis"
    );

    let record = Record::default();
    let consumer = world.consumer(&record, |b| b.outbox_relay(world.pool.clone()));
    each_ran_once(&world, &record, &ids).await;
    consumer.stop().await;
}

/// Entries in the service's partition streams, all of them.
async fn stream_entries(world: &World) -> usize {
    let mut conn = world.redis.pool().get().await.unwrap();
    let mut pipe = redis::pipe();
    for p in 0..DEFAULT_PARTITIONS {
        pipe.cmd("XLEN")
            .arg(format!("{{{}/{p}}}:stream", world.name));
    }
    let lens: Vec<usize> = pipe.query_async(&mut conn).await.unwrap();
    lens.into_iter().sum()
}

/// Not a test of its own: the child process of the test above, a relay
/// that prints the task ids of its first claim once they are in Redis, and
/// then hangs before its delete until it is killed. Without [`CHILD_ENV`]
/// it returns at once.
#[test]
fn child_relay() {
    let Ok(given) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut given = given.split(' ');
    let (db, redis, name) = (
        given.next().unwrap().to_owned(),
        given.next().unwrap().to_owned(),
        given.next().unwrap().to_owned(),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let pool = PgPool::connect(&db).await.unwrap();
        let relay = Relay::builder()
            .postgres(pool)
            .name(name)
            .redis(redis)
            .after_send(|ids| {
                let ids: Vec<&str> = ids.iter().map(|id| id.as_str()).collect();
                println!("sent {}", ids.join(","));
                std::thread::sleep(Duration::from_secs(600));
            })
            .build()
            .unwrap();
        relay.run_until(std::future::pending()).await.unwrap();
    });
}
