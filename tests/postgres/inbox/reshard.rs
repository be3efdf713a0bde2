//! The inbox through a reshard (docs/design.md §21): 4 partitions
//! resharded to 8 while tasks flow, each task's effect committed once, and
//! the new partitions' fences (rows of their own: a unit names its
//! generation) at tokens above every old partition's.

use std::time::Duration;

use peerq::admin::Admin;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use sqlx::PgPool;
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

use super::{database, write};

/// Writes each task's effect through the inbox.
#[derive(Clone)]
struct Effects {
    pool: PgPool,
}

impl Handler for Effects {
    type Task = u32;
    async fn handle(&self, _task: u32, cx: TaskContext) -> Result<(), HandlerError> {
        write(&self.pool, &cx).await.map(|_| ())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_effect_commits_once_through_a_reshard_and_fences_keep_growing() {
    const TASKS: u32 = 3_000;
    let pool = database().await;
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let name = unique_name("inbox-reshard");
    let stop = CancellationToken::new();
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let run = Consumer::builder()
                .name(&name)
                .redis(redis.url())
                .partitions(4)
                .interval(Duration::from_millis(300))
                .drain_timeout(Duration::from_millis(100))
                .handler(Effects { pool: pool.clone() })
                .run_until(stop.clone().cancelled_owned());
            tokio::spawn(run)
        })
        .collect();
    let admin = Admin::connect(redis.url().as_str()).await.unwrap();
    let began = tokio::time::Instant::now();
    let service = loop {
        if let Ok(service) = admin.service(&name).await
            && service.status().await.unwrap().members.len() == 2
        {
            break service;
        }
        assert!(began.elapsed() < Duration::from_secs(30), "no consumers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let producer = Producer::builder()
        .name(&name)
        .redis(redis.url())
        .connect()
        .await
        .unwrap();
    let mut resharded = false;
    for from in (0..TASKS).step_by(100) {
        let batch: Vec<(u32, Options)> = (from..from + 100)
            .map(|t| (t, Options::new().key(format!("k{}", t % 40))))
            .collect();
        producer.enqueue_batch_with(&batch).await.unwrap();
        if from == 1_000 && !resharded {
            service.reshard(8).await.unwrap();
            resharded = true;
        }
        // Two seconds of tasks after the reshard starts: the later ones
        // go to the new layout once the old one is sealed.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = || async {
        let n: i64 = sqlx::query_scalar("SELECT count(DISTINCT task) FROM effects")
            .fetch_one(&pool)
            .await
            .unwrap();
        n as u32
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while done().await < TASKS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every effect committed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, i64::from(TASKS), "an effect committed twice");
    let fences: Vec<(i32, i64)> =
        sqlx::query_as("SELECT partition, token FROM peerq_fences WHERE service = $1")
            .bind(&name)
            .fetch_all(&pool)
            .await
            .unwrap();
    let old = fences
        .iter()
        .filter(|(p, _)| *p < 1 << 16)
        .map(|(_, t)| *t)
        .max();
    let new = fences
        .iter()
        .filter(|(p, _)| *p >= 1 << 16)
        .map(|(_, t)| *t)
        .min();
    let (Some(old), Some(new)) = (old, new) else {
        panic!("fences of both layouts: {fences:?}");
    };
    assert!(
        new > old,
        "a new partition's token {new} not above an old one's {old}: {fences:?}"
    );
}
