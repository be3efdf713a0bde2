//! What the Postgres inbox and outbox cost, against a private PostgreSQL
//! and a private `redis-server`, both started by the bench (the test
//! harness's: `fsync=off`, `synchronous_commit=off`, loopback).
//!
//! Run with `cargo bench --features postgres --bench postgres` (release
//! build). It prints markdown tables (copied into BENCHMARKS.md):
//!
//! - **inbox**: one consumer (concurrency 64, a pool of 16 connections)
//!   over a queue prefilled with `PEERQ_BENCH_PG_TASKS` tasks (default
//!   20,000), from the first handler call to the last handler return,
//!   with three handlers: a no-op; a plain insert (one autocommit
//!   `INSERT` of the task's row); and the same insert through
//!   `Inbox::run_once` (the fence, the inbox row and the insert, in one
//!   transaction).
//! - **outbox**: transactions per second of callers that each, in a loop,
//!   begin, insert an order, `Outbox::enqueue` a task and commit, for 1, 4
//!   and 16 concurrent callers, next to the same transaction without the
//!   outbox (the order alone). No relay runs: this is the writers' side.

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peerq::postgres::{Inbox, Outbox};
use peerq::producer::Producer;
use peerq::{Consumer, Handler, HandlerError, Options, TaskContext};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use support::{PostgresServer, RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

/// The consumer's handlers at once (peerq's default).
const CONCURRENCY: usize = 64;
/// The pool's connections, shared by the handlers.
const POOL: u32 = 16;
/// Concurrent outbox writers measured.
const CALLERS: [usize; 3] = [1, 4, 16];
/// Transactions per outbox measurement, split between the callers.
const TRANSACTIONS: u64 = 8_000;

#[derive(Serialize, Deserialize)]
struct Job {
    seq: i64,
    body: String,
}

/// What a handler does with a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing.
    NoOp,
    /// One autocommit insert.
    Plain,
    /// The same insert through `Inbox::run_once`.
    Inbox,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::NoOp => "no-op handler",
            Mode::Plain => "plain autocommit insert",
            Mode::Inbox => "insert through Inbox::run_once",
        }
    }
}

/// Counts the tasks it handled and when the first began.
#[derive(Clone)]
struct Bench {
    pool: PgPool,
    mode: Mode,
    done: Arc<AtomicU64>,
    first: Arc<Mutex<Option<Instant>>>,
}

impl Handler for Bench {
    type Task = Job;

    async fn handle(&self, job: Job, cx: TaskContext) -> Result<(), HandlerError> {
        self.first.lock().unwrap().get_or_insert_with(Instant::now);
        let insert = "INSERT INTO bench_effects (seq, task_id, body) VALUES ($1, $2, $3)";
        match self.mode {
            Mode::NoOp => {}
            Mode::Plain => {
                sqlx::query(insert)
                    .bind(job.seq)
                    .bind(cx.task_id().as_str())
                    .bind(&job.body)
                    .execute(&self.pool)
                    .await?;
            }
            Mode::Inbox => {
                let _ = Inbox::run_once(&self.pool, &cx, async |tx| {
                    sqlx::query(insert)
                        .bind(job.seq)
                        .bind(cx.task_id().as_str())
                        .bind(&job.body)
                        .execute(&mut *tx)
                        .await?;
                    Ok(())
                })
                .await?;
            }
        }
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    support::init_tracing();
    let tasks: u64 = std::env::var("PEERQ_BENCH_PG_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let (redis, postgres) =
        tokio::task::spawn_blocking(|| (RedisServer::start(), PostgresServer::start()))
            .await
            .unwrap();
    let db = postgres.database();
    let pool = PgPoolOptions::new()
        .max_connections(POOL)
        .connect_with(db.options())
        .await
        .unwrap();
    peerq::postgres::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE bench_effects (seq bigint NOT NULL, task_id text NOT NULL, body text NOT NULL);
         CREATE TABLE bench_orders (id bigint NOT NULL, caller int NOT NULL);",
    )
    .execute(&pool)
    .await
    .unwrap();

    println!("| handler ({tasks} tasks prefilled, 1 consumer) | tasks/s | vs plain insert |");
    println!("|---|---|---|");
    let mut plain = 0.0;
    for mode in [Mode::NoOp, Mode::Plain, Mode::Inbox] {
        let rate = consume(&redis, &pool, mode, tasks).await;
        if mode == Mode::Plain {
            plain = rate;
        }
        let ratio = match mode {
            Mode::NoOp => String::new(),
            _ => format!("{:.2}", rate / plain),
        };
        println!("| {} | {rate:.0} | {ratio} |", mode.label());
    }

    println!();
    println!("| callers | order alone, tx/s | order + Outbox::enqueue, tx/s | ratio |");
    println!("|---|---|---|---|");
    for callers in CALLERS {
        let alone = transactions(&pool, callers, false).await;
        let outbox = transactions(&pool, callers, true).await;
        println!(
            "| {callers} | {alone:.0} | {outbox:.0} | {:.2} |",
            outbox / alone
        );
    }
    pool.close().await;
    drop(postgres);
}

/// One consumer with `mode`'s handler over `tasks` prefilled tasks: tasks
/// per second from the first handler call to the last handler return.
async fn consume(redis: &RedisServer, pool: &PgPool, mode: Mode, tasks: u64) -> f64 {
    let name = unique_name("pg-bench");
    let producer = Producer::connect(&redis.url(), &name).await.unwrap();
    let body = "hello, this is a transfer of moderate size".to_owned();
    for from in (0..tasks).step_by(1000) {
        let jobs: Vec<Job> = (from..(from + 1000).min(tasks))
            .map(|seq| Job {
                seq: seq as i64,
                body: body.clone(),
            })
            .collect();
        producer.enqueue_batch(&jobs).await.unwrap();
    }
    let bench = Bench {
        pool: pool.clone(),
        mode,
        done: Arc::default(),
        first: Arc::default(),
    };
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(redis.url())
        .concurrency(CONCURRENCY)
        .handler(bench.clone());
    let signal = stop.clone();
    let run = tokio::spawn(async move { consumer.run_until(signal.cancelled_owned()).await });
    while bench.done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = bench.first.lock().unwrap().unwrap().elapsed();
    stop.cancel();
    run.await.unwrap().unwrap();
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_effects")
        .fetch_one(pool)
        .await
        .unwrap();
    let expected = if mode == Mode::NoOp { 0 } else { tasks as i64 };
    assert_eq!(effects, expected, "{mode:?}: one effect per task");
    sqlx::query("TRUNCATE bench_effects, peerq_inbox")
        .execute(pool)
        .await
        .unwrap();
    tasks as f64 / took.as_secs_f64()
}

/// `callers` concurrent writers, [`TRANSACTIONS`] in all, each an order
/// and (with `outbox`) its task, committed: transactions per second.
async fn transactions(pool: &PgPool, callers: usize, outbox: bool) -> f64 {
    let name = unique_name("pg-outbox");
    let each = TRANSACTIONS / callers as u64;
    let started = Instant::now();
    let writers: Vec<_> = (0..callers)
        .map(|caller| {
            let (pool, name) = (pool.clone(), name.clone());
            tokio::spawn(async move {
                for i in 0..each {
                    let mut tx = pool.begin().await.unwrap();
                    sqlx::query("INSERT INTO bench_orders (id, caller) VALUES ($1, $2)")
                        .bind(i as i64)
                        .bind(caller as i32)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    if outbox {
                        let job = Job {
                            seq: i as i64,
                            body: "order confirmed".to_owned(),
                        };
                        Outbox::enqueue(&mut tx, &name, &job, Options::new())
                            .await
                            .unwrap();
                    }
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let rate = (each * callers as u64) as f64 / started.elapsed().as_secs_f64();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM peerq_outbox")
        .fetch_one(pool)
        .await
        .unwrap();
    let expected = if outbox { each * callers as u64 } else { 0 };
    assert_eq!(rows as u64, expected, "one outbox row per transaction");
    sqlx::query("TRUNCATE bench_orders, peerq_outbox")
        .execute(pool)
        .await
        .unwrap();
    rate
}
