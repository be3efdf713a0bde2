//! The inbox in a running consumer: a stale refusal drops the partition
//! and spends no attempt; the consumer prunes inbox rows past their
//! retention, and refuses a retention too short to be safe.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use peerq::dead_letters::DeadLetters;
use peerq::postgres::Inbox;
use peerq::producer::Producer;
use peerq::{Consumer, Error, Handler, HandlerError, TaskContext};
use sqlx::PgPool;
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use super::{database, effects, write};

/// Writes each task's effect through the inbox; counts stale refusals.
#[derive(Clone)]
struct Effects {
    pool: PgPool,
    stale: Arc<AtomicUsize>,
}

impl Handler for Effects {
    type Task = u32;
    async fn handle(&self, _task: u32, cx: TaskContext) -> Result<(), HandlerError> {
        let ran = write(&self.pool, &cx).await;
        if let Err(e) = &ran
            && e.disposition() == peerq::handler::Disposition::Stale
        {
            self.stale.fetch_add(1, Ordering::SeqCst);
        }
        ran.map(|_| ())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_refusal_drops_the_partition_and_spends_no_attempt() {
    let pool = database().await;
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let name = unique_name("stale-consumer");
    // Every partition's fence at a token no owner of this test reaches: a
    // newer owner, as far as the inbox can tell.
    for p in 0..4 {
        sqlx::query("INSERT INTO peerq_fences (service, partition, token) VALUES ($1, $2, $3)")
            .bind(&name)
            .bind(p)
            .bind(i64::MAX)
            .execute(&pool)
            .await
            .unwrap();
    }
    let handler = Effects {
        pool: pool.clone(),
        stale: Arc::default(),
    };
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(redis.url())
        .partitions(4)
        .interval(Duration::from_millis(300))
        .skew(Duration::from_millis(20))
        .drain_timeout(Duration::from_millis(50))
        // A stale refusal spending an attempt would dead-letter the task.
        .max_attempts(1)
        .inbox(pool.clone())
        .handler(handler.clone())
        .run_until(stop.clone().cancelled_owned());
    let consumer = tokio::spawn(consumer);
    tokio::time::sleep(Duration::from_millis(500)).await;
    if consumer.is_finished() {
        panic!("the consumer stopped: {:?}", consumer.await);
    }
    let producer = Producer::builder()
        .name(&name)
        .redis(redis.url())
        .partitions(4)
        .connect()
        .await
        .unwrap();
    for i in 0..8_u32 {
        producer.enqueue(&i).await.unwrap();
    }
    // Refused again each time the instance takes the partitions anew.
    wait_until(Duration::from_secs(30), "stale refusals", || {
        assert!(!consumer.is_finished(), "the consumer stopped");
        handler.stale.load(Ordering::SeqCst) >= 8
    })
    .await;
    assert!(effects(&pool).await.is_empty());
    let dead = DeadLetters::connect(&redis.url(), &name).await.unwrap();
    assert!(dead.list(10).await.unwrap().is_empty());
    // The newer owner is gone: this instance runs every task, once.
    sqlx::query("DELETE FROM peerq_fences WHERE service = $1")
        .bind(&name)
        .execute(&pool)
        .await
        .unwrap();
    let mut written = Vec::new();
    for _ in 0..300 {
        written = effects(&pool).await;
        if written.len() >= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut tasks: Vec<_> = written.iter().map(|(task, _)| task.clone()).collect();
    tasks.sort();
    tasks.dedup();
    assert_eq!((written.len(), tasks.len()), (8, 8), "{written:?}");
    assert!(dead.list(10).await.unwrap().is_empty());
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_consumer_prunes_inbox_rows_past_their_retention() {
    let pool = database().await;
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let (name, other) = (unique_name("pruned"), unique_name("kept"));
    // 1,200 old rows (more than two batches), a recent one, and an old one
    // of another service.
    sqlx::query(
        "INSERT INTO peerq_inbox (service, task_id, partition, token, done_at) \
         SELECT $1, 'old-' || i, 0, 1, now() - interval '8 days' FROM generate_series(1, 1200) i",
    )
    .bind(&name)
    .execute(&pool)
    .await
    .unwrap();
    for (service, task, age) in [(&name, "recent", "1 day"), (&other, "old", "8 days")] {
        sqlx::query(
            "INSERT INTO peerq_inbox (service, task_id, partition, token, done_at) \
             VALUES ($1, $2, 0, 1, now() - $3::interval)",
        )
        .bind(service)
        .bind(task)
        .bind(age)
        .execute(&pool)
        .await
        .unwrap();
    }
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(redis.url())
        .inbox(pool.clone())
        .handler(Effects {
            pool: pool.clone(),
            stale: Arc::default(),
        })
        .run_until(stop.clone().cancelled_owned());
    let consumer = tokio::spawn(consumer);
    let rows = || async {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT service, task_id FROM peerq_inbox ORDER BY service, task_id")
                .fetch_all(&pool)
                .await
                .unwrap();
        rows
    };
    for _ in 0..100 {
        if rows().await.len() <= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut expected = vec![
        (name.clone(), "recent".to_owned()),
        (other.clone(), "old".to_owned()),
    ];
    expected.sort();
    assert_eq!(rows().await, expected);
    stop.cancel();
    consumer.await.unwrap().unwrap();
    // By hand, with a retention of a day: the recent row goes too.
    let retention = Duration::from_secs(12 * 3600);
    assert_eq!(Inbox::prune(&pool, &name, retention).await.unwrap(), 1);
}

#[tokio::test]
async fn a_retention_under_a_minute_is_refused_by_name() {
    let pool = database().await;
    let short = Duration::from_secs(30);
    let refused = Inbox::prune(&pool, "svc", short).await.unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidSetting { setting, .. } if *setting == "inbox_retention"),
        "{refused}"
    );
    let refused = Consumer::builder()
        .name(unique_name("short"))
        .redis("redis://127.0.0.1:1")
        .inbox(pool.clone())
        .inbox_retention(short)
        .handler(Effects {
            pool,
            stale: Arc::default(),
        })
        .run_until(async {})
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("inbox_retention"), "{refused}");
}
