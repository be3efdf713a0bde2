//! The Postgres inbox (docs/design.md §10) against a real PostgreSQL: a
//! task's writes commit once however often it runs; a failed run writes
//! nothing; an owner behind a newer fencing token is stale and writes
//! nothing; a frozen owner's open transaction neither blocks its successor
//! for long nor lets both commit; and, in a running consumer, a stale
//! refusal drops the partition without spending an attempt, a fence held
//! by an older owner busy in a statement is waited for without spending
//! one, and old inbox rows are pruned.

mod consumer;
mod held;
mod reshard;

use std::sync::Arc;
use std::time::{Duration, Instant};

use peerq::handler::Disposition;
use peerq::postgres::{Inbox, Once};
use peerq::{HandlerError, TaskContext};
use sqlx::PgPool;
use support::{PostgresServer, unique_name};
use tokio::sync::Notify;

/// A fresh migrated database with an `effects` table (no unique index: a
/// write committed twice shows as two rows).
async fn database() -> PgPool {
    support::init_tracing();
    let db = tokio::task::spawn_blocking(|| PostgresServer::shared().database())
        .await
        .unwrap();
    let pool = PgPool::connect_with(db.options()).await.unwrap();
    peerq::postgres::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE effects (task text NOT NULL, token bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// A context for task `task` of service `service`, in partition 0, owned
/// with `token`.
fn context(service: &str, task: &str, token: u64) -> TaskContext {
    TaskContext::for_test(task, Default::default())
        .with_service(service)
        .with_partition(0, token)
}

/// Writes the task's effect through the inbox.
async fn write(pool: &PgPool, cx: &TaskContext) -> Result<Once<()>, HandlerError> {
    let (task, token) = (cx.task_id().to_string(), cx.fencing_token() as i64);
    Inbox::run_once(pool, cx, async |tx| {
        sqlx::query("INSERT INTO effects (task, token) VALUES ($1, $2)")
            .bind(task)
            .bind(token)
            .execute(&mut *tx)
            .await?;
        Ok(())
    })
    .await
}

/// The effects written, as `(task, token)`.
async fn effects(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT task, token FROM effects ORDER BY task, token")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn fence(pool: &PgPool, service: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT token FROM peerq_fences WHERE service = $1 AND partition = 0")
        .bind(service)
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_task_s_writes_commit_once_however_often_it_runs() {
    let pool = database().await;
    let service = unique_name("once");
    let cx = context(&service, "t1", 1);
    assert_eq!(write(&pool, &cx).await.unwrap(), Once::Ran(()));
    assert_eq!(write(&pool, &cx).await.unwrap(), Once::DoneBefore);
    // The same task id in another service is another task.
    let other = context(&unique_name("other"), "t1", 1);
    assert_eq!(write(&pool, &other).await.unwrap(), Once::Ran(()));
    assert_eq!(effects(&pool).await.len(), 2);
    let inbox: Vec<(String, String, i32, i64)> = sqlx::query_as(
        "SELECT service, task_id, partition, token FROM peerq_inbox WHERE service = $1",
    )
    .bind(&service)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(inbox, vec![(service.clone(), "t1".to_owned(), 0, 1)]);
    // The first run moved the missing fence to its token.
    assert_eq!(fence(&pool, &service).await, Some(1));
}

#[tokio::test]
async fn a_failed_run_writes_nothing_and_keeps_its_error() {
    let pool = database().await;
    let service = unique_name("failed");
    let cx = context(&service, "t1", 1);
    let failed = Inbox::run_once(&pool, &cx, async |tx| {
        sqlx::query("INSERT INTO effects (task, token) VALUES ('t1', 1)")
            .execute(&mut *tx)
            .await?;
        Err::<(), _>(HandlerError::msg("550 no such user").permanent())
    })
    .await
    .unwrap_err();
    assert_eq!(failed.disposition(), Disposition::Permanent);
    assert_eq!(failed.to_string(), "550 no such user");
    assert!(effects(&pool).await.is_empty(), "rolled back");
    // Not recorded as done: the next run writes.
    assert_eq!(write(&pool, &cx).await.unwrap(), Once::Ran(()));
    assert_eq!(effects(&pool).await, vec![("t1".to_owned(), 1)]);
}

#[tokio::test]
async fn an_owner_behind_a_newer_token_is_stale_and_writes_nothing() {
    let pool = database().await;
    let service = unique_name("stale");
    // The partition's new owner (token 7) wrote first.
    assert_eq!(
        write(&pool, &context(&service, "t1", 7)).await.unwrap(),
        Once::Ran(())
    );
    // Its old owner (token 3), resuming with another task of the partition.
    let stale = write(&pool, &context(&service, "t2", 3)).await.unwrap_err();
    assert_eq!(stale.disposition(), Disposition::Stale, "{stale}");
    assert!(stale.to_string().contains("token 7"), "{stale}");
    assert_eq!(effects(&pool).await, vec![("t1".to_owned(), 7)]);
    assert_eq!(fence(&pool, &service).await, Some(7), "never moved back");
    // A later owner moves it forward.
    assert_eq!(
        write(&pool, &context(&service, "t2", 9)).await.unwrap(),
        Once::Ran(())
    );
    assert_eq!(fence(&pool, &service).await, Some(9));
}

/// A run of task `task` with `token` that writes its effect and then
/// freezes (a stopped process) until `resume`; its result.
fn frozen_run(
    pool: &PgPool,
    service: &str,
    task: &str,
    token: u64,
    resume: Arc<Notify>,
    writing: Arc<Notify>,
) -> tokio::task::JoinHandle<Result<Once<()>, HandlerError>> {
    let (pool, cx) = (pool.clone(), context(service, task, token));
    tokio::spawn(async move {
        let task = cx.task_id().to_string();
        Inbox::run_once(&pool, &cx, async |tx| {
            sqlx::query("INSERT INTO effects (task, token) VALUES ($1, $2)")
                .bind(task)
                .bind(token as i64)
                .execute(&mut *tx)
                .await?;
            writing.notify_one();
            resume.notified().await;
            Ok(())
        })
        .await
    })
}

#[tokio::test]
async fn a_frozen_owner_s_transaction_is_ended_and_its_successor_writes_once() {
    let pool = database().await;
    let service = unique_name("frozen");
    let (resume, writing) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let old = frozen_run(&pool, &service, "t1", 1, resume.clone(), writing.clone());
    writing.notified().await;
    // The new owner runs the same task while the old one's transaction
    // holds the fence: it waits until Postgres ends that idle transaction
    // (the interval, 1 s for a test context), then writes.
    let started = Instant::now();
    let new = write(&pool, &context(&service, "t1", 2)).await.unwrap();
    let waited = started.elapsed();
    assert_eq!(new, Once::Ran(()));
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    // The old owner resumes: its transaction is gone, nothing of it commits.
    resume.notify_one();
    let old = old.await.unwrap();
    assert!(old.is_err(), "{old:?}");
    assert_eq!(effects(&pool).await, vec![("t1".to_owned(), 2)]);
    assert_eq!(fence(&pool, &service).await, Some(2));
}

#[tokio::test]
async fn a_frozen_owner_that_resumes_in_time_commits_and_its_successor_skips() {
    let pool = database().await;
    let service = unique_name("resumed");
    let (resume, writing) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let old = frozen_run(&pool, &service, "t1", 1, resume.clone(), writing.clone());
    writing.notified().await;
    let new = {
        let (pool, cx) = (pool.clone(), context(&service, "t1", 2));
        tokio::spawn(async move { write(&pool, &cx).await })
    };
    // Within the idle timeout: the old owner's run commits (its token was
    // the fence's when it checked), and the new owner finds the task done.
    tokio::time::sleep(Duration::from_millis(300)).await;
    resume.notify_one();
    assert_eq!(old.await.unwrap().unwrap(), Once::Ran(()));
    assert_eq!(new.await.unwrap().unwrap(), Once::DoneBefore);
    assert_eq!(effects(&pool).await, vec![("t1".to_owned(), 1)]);
    assert_eq!(fence(&pool, &service).await, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_of_one_new_owner_take_the_fence_at_once() {
    // The first tasks after a handover all find the fence behind: moving it
    // forward outside their transactions, none deadlocks or fails.
    let pool = database().await;
    let service = unique_name("many");
    let _ = write(&pool, &context(&service, "before", 1)).await.unwrap();
    let runs: Vec<_> = (0..16)
        .map(|i| {
            let (pool, cx) = (pool.clone(), context(&service, &format!("t{i:02}"), 2));
            tokio::spawn(async move { write(&pool, &cx).await })
        })
        .collect();
    for run in runs {
        assert_eq!(run.await.unwrap().unwrap(), Once::Ran(()));
    }
    assert_eq!(effects(&pool).await.len(), 17);
    assert_eq!(fence(&pool, &service).await, Some(2));
}
