//! Rows a relay sent to Redis whose delete could not commit, because
//! Postgres went away right after the sends and stayed away longer than
//! the dedup records' window: once Postgres is back, the rows are sent
//! again, and each still runs once (docs/design.md §10: a row's record
//! lives until its delete is seen committed, and a grace after). And the
//! markers of committed deletes that a relay left are swept.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::Options;
use peerq::{DEFAULT_PARTITIONS, partition_of};
use sqlx::PgPool;

use super::{Record, World, each_ran_once, mail};
use support::{self, PostgresServer, ServerOptions, wait_until};

/// The records' grace after a committed delete, shortened from 15 min
/// (today's code: their lifetime); Postgres stays away three times as long.
const WINDOW: Duration = Duration::from_secs(1);
const ROWS: u64 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_sent_before_a_postgres_outage_longer_than_the_window_run_once() {
    if std::env::var_os(support::POSTGRES_URL_ENV).is_some() {
        // A given server is not ours to stop.
        return;
    }
    let mut server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap();
    let world = World::on("outbox-outage", ServerOptions::default(), server.database()).await;
    let record = Record::default();
    let consumer = world.consumer(&record, |b| b);
    let (mut ids, mut keys) = (Vec::new(), Vec::new());
    for seq in 0..ROWS {
        // Two keys: two lanes.
        let key = format!("user-{}", seq % 2);
        let options = Options::new().key(&key);
        ids.push(commit_durably(&world.pool, &world.name, seq, options).await);
        keys.push(key);
    }

    // The relay's first claim stops after its sends until Postgres is down:
    // its delete then fails.
    let (sent_tx, sent_rx) = mpsc::channel::<Vec<String>>();
    let (down_tx, down_rx) = mpsc::channel::<()>();
    let down_rx = Mutex::new(down_rx);
    let first = AtomicBool::new(true);
    let relay = world.relay(|r| {
        r.test_timing(Duration::from_secs(20), WINDOW)
            .after_send(move |sent| {
                if first.swap(false, Ordering::SeqCst) {
                    let sent = sent.iter().map(|id| id.to_string()).collect();
                    sent_tx.send(sent).unwrap();
                    down_rx.lock().unwrap().recv().unwrap();
                }
            })
    });
    let (mut server, sent) = tokio::task::spawn_blocking(move || {
        let sent = sent_rx.recv().unwrap();
        server.shut_down();
        down_tx.send(()).unwrap();
        (server, sent)
    })
    .await
    .unwrap();
    assert!(!sent.is_empty());
    wait_until(Duration::from_secs(30), "the sent rows to run", || {
        let counts = record.counts();
        sent.iter().all(|id| counts.contains_key(id))
    })
    .await;

    // Away for three windows. The records of the sent rows must outlive
    // it, since their rows are still in the outbox (checked below, after
    // what a user would see: each task ran once).
    tokio::time::sleep(3 * WINDOW).await;
    let mut ttls = Vec::new();
    for id in &sent {
        let key = &keys[ids.iter().position(|i| i == id).unwrap()];
        ttls.push((id.clone(), record_ttl(&world, key, id).await));
    }
    server = tokio::task::spawn_blocking(move || {
        server.start_again();
        server
    })
    .await
    .unwrap();

    // The relay sends the rows again: the sent ones are no-ops.
    each_ran_once(&world, &record, &ids).await;
    for (id, ttl) in ttls {
        assert_eq!(
            ttl, -1,
            "the record of {id} (sent, its delete not committed) lived on, without an expiry"
        );
    }
    // Once their deletes committed, the records go after the grace, and
    // nothing is left to clean up.
    for (id, key) in ids.iter().zip(&keys) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while record_ttl(&world, key, id).await != -2 {
            assert!(
                Instant::now() < deadline,
                "the record of {id} never expired"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM peerq_outbox_sent")
        .fetch_one(&world.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "no row's record is left to clean up");
    relay.stop().await;
    consumer.stop().await;
    drop(world);
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}

/// Writes row `seq` for service `name` in a transaction of its own that
/// is on disk when it commits (the test servers run with
/// `synchronous_commit=off`, and this one is shut down at once later).
async fn commit_durably(pool: &PgPool, name: &str, seq: u64, options: Options) -> String {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL synchronous_commit = on")
        .execute(&mut *tx)
        .await
        .unwrap();
    let id = peerq::postgres::Outbox::enqueue(&mut tx, name, &mail("k", seq), options)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    id.to_string()
}

/// The `PTTL` of the dedup record of task `id`, whose partition key is
/// `key`: -1 without an expiry, -2 gone.
pub(super) async fn record_ttl(world: &World, key: &str, id: &str) -> i64 {
    let mut conn = world.redis.pool().get().await.unwrap();
    redis::cmd("PTTL")
        .arg(record_key(world, key, id))
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// The dedup record `{N/p}:dedup:outbox:<id>` of task `id`, whose
/// partition key is `key` (its task id when it was written without one).
pub(super) fn record_key(world: &World, key: &str, id: &str) -> String {
    let p = partition_of(key.as_bytes(), DEFAULT_PARTITIONS);
    format!("{{{}/{p}}}:dedup:outbox:{id}", world.name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn markers_a_relay_left_after_its_commit_are_swept() {
    let world = World::new("outbox-sweep").await;
    // A relay committed the delete of row `left` and died before it gave
    // the row's record its expiry: the record has none, the marker stays.
    let id = "left-0000";
    let p = partition_of(id.as_bytes(), DEFAULT_PARTITIONS);
    let mut conn = world.redis.pool().get().await.unwrap();
    let () = redis::cmd("SET")
        .arg(record_key(&world, id, id))
        .arg(id)
        .query_async(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO peerq_outbox_sent (service, task_id, partition) VALUES ($1, $2, $3)")
        .bind(&world.name)
        .bind(id)
        .bind(p as i32)
        .execute(&world.pool)
        .await
        .unwrap();
    assert_eq!(record_ttl(&world, id, id).await, -1);

    // The next relay sweeps at its start: the record expires after the
    // grace, the marker goes.
    let relay = world.relay(|r| r.test_timing(Duration::from_secs(20), WINDOW));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let markers: i64 = sqlx::query_scalar("SELECT count(*) FROM peerq_outbox_sent")
            .fetch_one(&world.pool)
            .await
            .unwrap();
        if markers == 0 && record_ttl(&world, id, id).await == -2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sweep: {markers} markers left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.stop().await;
}
