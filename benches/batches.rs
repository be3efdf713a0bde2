//! What batches cost (issue 40, docs/design.md §19), in one run against one
//! private `redis-server`:
//!
//! - **throughput**: `PEERQ_BENCH_TASKS` tasks (default 200,000), as plain
//!   tasks (`enqueue_batch` in parts of 1,000) and as members of batches of
//!   1,000 (open, add, seal; a callback each): the enqueue's rate, and the
//!   consume's (one instance, concurrency 256, reads of 100, a no-op
//!   handler; from the first handler call until the last ack, and for
//!   batches until every callback ran), `REPEATS` runs each, interleaved,
//!   medians compared;
//! - **latency**: batches of 100 members one after the other on one
//!   instance: from the last member's handler returning (its ack follows)
//!   to its batch's callback starting, p50 and p99 over 200 batches.
//!
//! Run with `cargo bench --bench batches` (release build); it prints
//! markdown tables (copied into BENCHMARKS.md). `PEERQ_BENCH_ONLY=plain`
//! or `members` runs that one consume alone, for a profiler.

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

mod meter;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::aio::MultiplexedConnection;
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Consumer, DEFAULT_PARTITIONS, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

use crate::meter::ratio_row;

/// Runs of each kind; the median counts (`PEERQ_BENCH_REPEATS` for more).
const REPEATS: usize = 3;
/// Members per batch in the throughput runs.
const BATCH: usize = 1000;
/// The latency runs: batches, and members each.
const LATENCY_BATCHES: u64 = 200;
const LATENCY_SIZE: u64 = 100;

/// The throughput bench's task (its payload's bytes), or a callback.
#[derive(Serialize, Deserialize, Clone)]
enum Job {
    Task { seq: u64, body: String },
    Callback { b: u64 },
}

fn task(seq: u64) -> Job {
    Job::Task {
        seq,
        body: "hello, this is a mail body of moderate size".into(),
    }
}

#[tokio::main]
async fn main() {
    let tasks: u64 = std::env::var("PEERQ_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let repeats = std::env::var("PEERQ_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(REPEATS);
    let server = RedisServer::start();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (mut enqueue, mut consume) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let mut costs: [Option<meter::Cost>; 2] = [None, None];
    // `PEERQ_BENCH_ONLY=plain` or `members`: that run alone, once, and
    // nothing printed (for a profiler: `perf`, callgrind).
    if let Ok(only) = std::env::var("PEERQ_BENCH_ONLY") {
        run(&server, &mut conn, tasks, only == "members").await;
        return;
    }
    for _ in 0..repeats {
        for batched in [false, true] {
            let (e, c, cost) = run(&server, &mut conn, tasks, batched).await;
            enqueue[usize::from(batched)].push(e);
            consume[usize::from(batched)].push(c);
            costs[usize::from(batched)].get_or_insert(cost);
        }
    }
    println!();
    println!(
        "| {tasks} tasks, plain or as members of batches of {BATCH} (1 instance, no-op handler) | plain, tasks/s | members, tasks/s | members / plain, each run | medians | median of the runs' ratios |"
    );
    println!("|---|---|---|---|---|---|");
    let enqueue_label = "enqueue (`enqueue_batch`; open, add, seal)";
    println!("{}", ratio_row(enqueue_label, &enqueue[0], &enqueue[1]));
    let consume_label = "consume, to the last ack (and the last callback)";
    println!("{}", ratio_row(consume_label, &consume[0], &consume[1]));
    println!();
    println!(
        "| the consume's cost per task (first repeat) | Redis CPU | bench process CPU | Redis commands | the most called |"
    );
    println!("|---|---|---|---|---|");
    for (label, cost) in ["plain", "members"].iter().zip(&costs) {
        let cost = cost.as_ref().expect("a run");
        let per = |d: Duration| d.as_secs_f64() * 1e6 / tasks as f64;
        let top: Vec<String> = cost
            .by_calls()
            .iter()
            .take(6)
            // Calls per task, and their Redis time per task (a script's
            // includes the commands it calls).
            .map(|(name, c)| {
                let per = |n: u64| n as f64 / tasks as f64;
                format!("{name} {:.3} ({:.2} µs)", per(c.calls), per(c.usec))
            })
            .collect();
        println!(
            "| {label} | {:.2} µs | {:.2} µs | {:.3} | {} |",
            per(cost.redis_cpu),
            per(cost.process_cpu),
            cost.calls() as f64 / tasks as f64,
            top.join(", ")
        );
    }
    let (p50, p99, max) = latency(&server).await;
    println!();
    println!(
        "| last member's handler returned → its batch's callback started, {LATENCY_BATCHES} batches of {LATENCY_SIZE} one at a time | p50 | p99 | max |"
    );
    println!("|---|---|---|---|");
    println!("| | {p50:.2} ms | {p99:.2} ms | {max:.2} ms |");
}

/// One run over a new service: the enqueue's and the consume's tasks a
/// second.
async fn run(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    tasks: u64,
    batched: bool,
) -> (f64, f64, meter::Cost) {
    let name = unique_name("batches");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let jobs: Vec<Job> = (0..tasks).map(task).collect();
    let started = Instant::now();
    let mut callbacks = 0;
    for (b, chunk) in jobs.chunks(BATCH).enumerate() {
        if batched {
            let batch = producer.batch().callback(&Job::Callback { b: b as u64 });
            batch.enqueue(chunk).await.unwrap();
            callbacks += 1;
        } else {
            producer.enqueue_batch(chunk).await.unwrap();
        }
    }
    let enqueue = tasks as f64 / started.elapsed().as_secs_f64();
    let (done, called) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let first: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handler = {
        let (done, called, first) = (done.clone(), called.clone(), first.clone());
        tower::service_fn(move |task: Task<Job>| {
            let (done, called, first) = (done.clone(), called.clone(), first.clone());
            async move {
                first.lock().unwrap().get_or_insert_with(Instant::now);
                match task.payload {
                    Job::Task { .. } => done.fetch_add(1, Ordering::Relaxed),
                    Job::Callback { .. } => called.fetch_add(1, Ordering::Relaxed),
                };
                Ok::<(), HandlerError>(())
            }
        })
    };
    let before = meter::read(conn).await;
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .concurrency(256)
        .batch(100)
        .service(handler)
        .run_until(stop.clone().cancelled_owned());
    let running = tokio::spawn(consumer);
    while done.load(Ordering::Relaxed) < tasks || called.load(Ordering::Relaxed) < callbacks {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    while meter::pending(conn, &name, DEFAULT_PARTITIONS).await > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = first.lock().unwrap().expect("a task ran").elapsed();
    let cost = meter::read(conn).await.since(&before);
    stop.cancel();
    running.await.unwrap().unwrap();
    let _: () = deadpool_redis::redis::cmd("FLUSHALL")
        .query_async(conn)
        .await
        .unwrap();
    (enqueue, tasks as f64 / elapsed.as_secs_f64(), cost)
}

/// Batches one at a time: from the last member's handler returning to the
/// callback's start, in ms: p50, p99, max.
async fn latency(server: &RedisServer) -> (f64, f64, f64) {
    let name = unique_name("batch-latency");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let last_return: Arc<Mutex<Option<Instant>>> = Arc::default();
    let (done, waits) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(Mutex::new(Vec::new())),
    );
    let handler = {
        let (last_return, done, waits) = (last_return.clone(), done.clone(), waits.clone());
        tower::service_fn(move |task: Task<Job>| {
            let (last_return, done, waits) = (last_return.clone(), done.clone(), waits.clone());
            async move {
                match task.payload {
                    Job::Task { .. } => {
                        *last_return.lock().unwrap() = Some(Instant::now());
                    }
                    Job::Callback { .. } => {
                        let returned = last_return.lock().unwrap().expect("members ran");
                        waits.lock().unwrap().push(returned.elapsed());
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok::<(), HandlerError>(())
            }
        })
    };
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .service(handler)
        .run_until(stop.clone().cancelled_owned());
    let running = tokio::spawn(consumer);
    for b in 0..LATENCY_BATCHES {
        let members: Vec<Job> = (0..LATENCY_SIZE).map(task).collect();
        let batch = producer.batch().callback(&Job::Callback { b });
        batch.enqueue(&members).await.unwrap();
        while done.load(Ordering::Relaxed) <= b {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    stop.cancel();
    running.await.unwrap().unwrap();
    let mut waits: Vec<f64> = waits
        .lock()
        .unwrap()
        .iter()
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    waits.sort_by(f64::total_cmp);
    let at = |q: f64| waits[((waits.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), *waits.last().unwrap())
}
