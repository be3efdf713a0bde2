//! What the ledger test reads back: the user's checks on the tables, and
//! what became of transfers never booked when the test gives up.

use std::fs;
use std::path::Path;

use peerq::admin::{Admin, Totals};
use sqlx::PgPool;

use super::{COUNT, Done};

/// What became of the transfers never booked: their runs, refusals and
/// log lines, the outbox's rows and the service's queue in Redis.
pub(crate) async fn diagnose(pool: &PgPool, redis: &str, name: &str, logs: &Path) -> String {
    let missing = seqs(
        pool,
        "SELECT seq FROM ledger_requests EXCEPT SELECT seq FROM ledger_entries ORDER BY seq LIMIT 5",
    )
    .await;
    let mut said = format!("missing {missing:?}; logs in {}", logs.display());
    for seq in missing {
        let runs: Vec<(String, String, i32, i64)> = sqlx::query_as(
            "SELECT task_id, instance, attempt, token FROM ledger_runs WHERE seq = $1 ORDER BY at",
        )
        .bind(seq)
        .fetch_all(pool)
        .await
        .unwrap();
        let refusals: Vec<(String, i64)> =
            sqlx::query_as("SELECT why, token FROM ledger_refusals WHERE seq = $1 ORDER BY at")
                .bind(seq)
                .fetch_all(pool)
                .await
                .unwrap();
        said += &format!("\nseq {seq}: runs {runs:?}, refusals {refusals:?}");
        for (task_id, ..) in runs.iter().take(1) {
            said += &format!(", log lines naming its task: {}", logged(logs, task_id));
        }
    }
    let outbox = count(pool, "SELECT count(*) FROM peerq_outbox").await;
    said += &format!("\noutbox rows left {outbox}");
    said += &format!("\nqueue {:?}", queue(redis, name).await);
    said
}

/// The service's queue in Redis: pending, delayed, dead tasks.
async fn queue(redis: &str, name: &str) -> Totals {
    let admin = Admin::connect(redis).await.unwrap();
    let service = admin.service(name).await.unwrap();
    service.status().await.unwrap().totals
}

/// The lines of the processes' logs that contain `text`.
pub(crate) fn logged(logs: &Path, text: &str) -> usize {
    fs::read_dir(logs)
        .unwrap()
        .map(|entry| fs::read_to_string(entry.unwrap().path()).unwrap_or_default())
        .map(|log| log.lines().filter(|line| line.contains(text)).count())
        .sum()
}

pub(crate) async fn requests(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM ledger_requests").await
}

/// The one number `sql` returns.
pub(crate) async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// The `(what, how many)` rows `sql` returns.
async fn tally<T>(pool: &PgPool, sql: &str) -> Vec<(T, i64)>
where
    T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    sqlx::query_as(sql).fetch_all(pool).await.unwrap()
}

/// The seqs `sql` returns (it says how many), for a message.
async fn seqs(pool: &PgPool, sql: &str) -> Vec<i64> {
    sqlx::query_scalar(sql).fetch_all(pool).await.unwrap()
}

/// What the user would check: one entry per request, none twice, none
/// without a request; and that handlers did run twice.
pub(crate) async fn check(pool: &PgPool, redis: &str, name: &str, done: &Done, logs: &Path) {
    let requested = requests(pool).await;
    let (low, high): (i64, i64) = sqlx::query_as("SELECT min(seq), max(seq) FROM ledger_requests")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        (requested, low, high),
        (COUNT, 0, COUNT - 1),
        "the requests"
    );
    assert!(
        (1..COUNT).contains(&done.requested_at_kill),
        "the producer was killed with {} requests, not in the middle",
        done.requested_at_kill
    );
    let twice = seqs(
        pool,
        "SELECT seq FROM ledger_entries GROUP BY seq HAVING count(*) > 1 ORDER BY seq LIMIT 20",
    )
    .await;
    let orphans = seqs(
        pool,
        "SELECT seq FROM ledger_entries EXCEPT SELECT seq FROM ledger_requests ORDER BY seq LIMIT 20",
    )
    .await;
    let missing = seqs(
        pool,
        "SELECT seq FROM ledger_requests EXCEPT SELECT seq FROM ledger_entries ORDER BY seq LIMIT 20",
    )
    .await;
    let entries = count(pool, "SELECT count(*) FROM ledger_entries").await;
    let runs = count(pool, "SELECT count(*) FROM ledger_runs").await;
    let ran_twice = count(
        pool,
        "SELECT count(*) FROM (SELECT seq FROM ledger_runs GROUP BY seq HAVING count(*) > 1) s",
    )
    .await;
    let refusals: Vec<(String, i64)> = tally(
        pool,
        "SELECT why, count(*) FROM ledger_refusals GROUP BY why ORDER BY why",
    )
    .await;
    let attempts: Vec<(i32, i64)> = tally(
        pool,
        "SELECT attempt, count(*) FROM ledger_runs GROUP BY attempt ORDER BY attempt",
    )
    .await;
    let left = count(pool, "SELECT count(*) FROM peerq_outbox").await;
    println!(
        "{done:?}\nrequests {requested}, entries {entries}, handler runs {runs}, \
         transfers whose handler ran more than once {ran_twice}, refusals {refusals:?}, \
         runs by attempt {attempts:?}"
    );
    assert_eq!(twice, Vec::<i64>::new(), "transfers booked twice");
    assert_eq!(orphans, Vec::<i64>::new(), "entries without a request");
    assert_eq!(missing, Vec::<i64>::new(), "requests never booked");
    assert_eq!(entries, COUNT);
    assert_eq!(left, 0, "outbox rows never relayed");
    let queue = queue(redis, name).await;
    assert_eq!(queue.dead, 0, "transfers in the dead letters");
    // Runs again that wrote nothing: the inbox did the work, not luck.
    let refused: i64 = refusals.iter().map(|(_, n)| n).sum();
    assert!(
        ran_twice > 0 && refused > 0,
        "no handler ran twice, or none was refused: the chaos did not test the inbox \
         (logs in {})",
        logs.display()
    );
}
