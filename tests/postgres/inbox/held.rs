//! A partition's fence held by an older owner's transaction that is busy
//! in a statement, not idle, so Postgres's idle-in-transaction timeout does
//! not end it: the new owner's task waits for the fence without spending
//! an attempt, is not dead-lettered, and runs once; a wait ends when its
//! run is interrupted (docs/design.md §10).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peerq::dead_letters::DeadLetters;
use peerq::postgres::{Inbox, Once};
use peerq::producer::Producer;
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use sqlx::PgPool;
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use super::{context, database, effects, write};

/// How long the older owner's statement runs: well past the 20 tries of
/// half an interval (0.3 s) each that ended the wait before.
const HELD: Duration = Duration::from_secs(8);

/// Writes each task's effect through the inbox; records each run.
#[derive(Clone)]
struct Runs {
    pool: PgPool,
    runs: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Handler for Runs {
    type Task = u32;
    async fn handle(&self, _task: u32, cx: TaskContext) -> Result<(), HandlerError> {
        let run = (cx.task_id().to_string(), cx.attempt());
        self.runs.lock().unwrap().push(run);
        write(&self.pool, &cx).await.map(|_| ())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_held_mid_statement_is_waited_for_without_spending_an_attempt() {
    let pool = database().await;
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let name = unique_name("held-fence");
    // The partition's older owner, frozen inside a statement of its inbox
    // transaction.
    let older = busy_older_owner(&pool, &name).await;

    let handler = Runs {
        pool: pool.clone(),
        runs: Arc::default(),
    };
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(redis.url())
        .partitions(1)
        .interval(Duration::from_millis(300))
        .skew(Duration::from_millis(20))
        .drain_timeout(Duration::from_millis(50))
        // One failed attempt would dead-letter the task.
        .max_attempts(1)
        .handler(handler.clone())
        .run_until(stop.clone().cancelled_owned());
    let consumer = tokio::spawn(consumer);
    let producer = Producer::builder()
        .name(&name)
        .redis(redis.url())
        .partitions(1)
        .connect()
        .await
        .unwrap();
    let task = producer.enqueue(&7_u32).await.unwrap().to_string();

    wait_until(Duration::from_secs(60), "the task's effect", || {
        assert!(!consumer.is_finished(), "the consumer stopped");
        !handler.runs.lock().unwrap().is_empty()
    })
    .await;
    // Its run waits until the older owner's statement ends and its
    // transaction commits; only then can the fence move.
    assert_eq!(older.await.unwrap().unwrap(), Once::Ran(()));
    let dead = DeadLetters::connect(&redis.url(), &name).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let written = loop {
        let letters = dead.list(10).await.unwrap();
        let why: Vec<_> = letters.iter().map(|l| (&l.reason, &l.error)).collect();
        assert!(letters.is_empty(), "dead-lettered: {why:?}");
        let written = effects(&pool).await;
        if !written.is_empty() {
            break written;
        }
        assert!(Instant::now() < deadline, "the task's effect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(written[0].0, task);
    assert!(written[0].1 > 0, "written under the new owner's token");
    // A second run would show by now (two intervals).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(*handler.runs.lock().unwrap(), [(task, 1)], "one run");
    assert!(dead.list(10).await.unwrap().is_empty(), "not dead-lettered");
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_wait_for_a_held_fence_ends_when_its_run_is_interrupted() {
    let pool = database().await;
    let name = unique_name("held-interrupted");
    let older = busy_older_owner(&pool, &name).await;
    // The new owner's run waits for the fence (a session of it waits for
    // the lock) until its cancellation fires, as at a drain.
    let cancel = CancellationToken::new();
    let cx = TaskContext::for_test("t1", cancel.clone())
        .with_service(&name)
        .with_partition(0, 1);
    let run = {
        let pool = pool.clone();
        tokio::spawn(async move { write(&pool, &cx).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !waiting_for_a_lock(&pool).await {
        assert!(
            Instant::now() < deadline,
            "the new owner's wait for the fence"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = Instant::now();
    cancel.cancel();
    let interrupted = run.await.unwrap().unwrap_err();
    assert!(
        interrupted
            .to_string()
            .contains("interrupted after waiting"),
        "{interrupted}"
    );
    // Within a try (half the test context's interval of 1 s), not when
    // the older owner's statement ends.
    assert!(cancelled.elapsed() < HELD / 4, "{:?}", cancelled.elapsed());
    assert_eq!(older.await.unwrap().unwrap(), Once::Ran(()));
    assert!(
        effects(&pool).await.is_empty(),
        "the interrupted run wrote nothing"
    );
}

/// Whether a session of this database waits for a lock.
async fn waiting_for_a_lock(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The older owner (token 0) of partition 0 of `service`, inside its inbox
/// transaction, busy in one statement for [`HELD`]: it holds the fence
/// `FOR SHARE` until the statement ends and it commits. Returns once the
/// statement runs.
async fn busy_older_owner(
    pool: &PgPool,
    service: &str,
) -> tokio::task::JoinHandle<Result<Once<()>, HandlerError>> {
    let older = {
        let (pool, cx) = (pool.clone(), context(service, "older", 0));
        tokio::spawn(async move {
            Inbox::run_once(&pool, &cx, async |tx| {
                sqlx::query("SELECT pg_sleep($1)")
                    .bind(HELD.as_secs_f64())
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            })
            .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sleeping(pool).await {
        assert!(Instant::now() < deadline, "the older owner's statement");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    older
}

/// Whether a session of this database is busy in `pg_sleep`.
async fn sleeping(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
         AND state = 'active' AND query LIKE 'SELECT pg_sleep%')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}
