//! What the service-wide rate limit costs and how closely it holds
//! (issue 38, docs/design.md §15), in one run against one private
//! `redis-server`:
//!
//! - **cost**: one instance (concurrency 256, reads of 100, a no-op
//!   handler) consumes a prefilled queue of `PEERQ_BENCH_TASKS` tasks
//!   (default 200,000) with no limit and with a service-wide limit far
//!   above what it reaches (10,000,000 a second); and tasks spread over
//!   1,000 partition keys with no limit, a rate limit per key far above,
//!   and a concurrency per key far above (1,000); and the same two limits
//!   with the key a function of the task (counted in Redis, the tasks on
//!   every partition); from the first handler
//!   call to the last ack; `REPEATS` runs each, interleaved, medians
//!   compared;
//! - **accuracy**: the same instance under a limit of 5,000 a second over
//!   a backlog of 30,000: the starts a second it reached, against the
//!   limit, and its busiest second;
//! - **batch options** (issue 38 §0: a batch with options per task as fast
//!   as one without): the same `PEERQ_BENCH_TASKS` tasks enqueued in
//!   batches of 1,000 with `enqueue_batch`, and with `enqueue_batch_with`
//!   and `Options::new()` per task, each on a new service, `REPEATS` runs
//!   each, interleaved, medians compared.
//!
//! Run with `cargo bench --bench limits` (release build); it prints
//! markdown tables (copied into BENCHMARKS.md). `PEERQ_BENCH_ONLY=<i>`
//! runs the `i`-th kind of the cost table alone (to profile it; the others
//! print 1 task/s), `PEERQ_BENCH_ONLY=0,5,6` those kinds. Each run starts
//! on an empty Redis (`FLUSHALL` after the one before): the 200,000 acked
//! entries a run leaves would otherwise weigh on the runs after it (the
//! last kinds of a repeat ran with over a million entries in Redis).

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

mod meter;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::aio::MultiplexedConnection;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, DEFAULT_PARTITIONS, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

use crate::meter::ratio_row;

/// Runs of each kind; the median counts (`PEERQ_BENCH_REPEATS` for more).
const REPEATS: usize = 3;
/// The limit far above what one instance reaches.
const FAR_ABOVE: u32 = 10_000_000;
/// The accuracy run's limit, and its backlog (6 s at the limit).
const ACCURACY_LIMIT: u32 = 5_000;
const ACCURACY_TASKS: u64 = 30_000;

/// The throughput bench's task, so the payloads have the same bytes.
#[derive(Serialize, Deserialize, Clone)]
struct Job {
    seq: u64,
    sent_ns: u64,
    body: String,
}

/// The limits of one consume run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    None,
    /// A service-wide rate limit, a second.
    Rate(u32),
    /// A rate limit per key, a second.
    RatePerKey(u32),
    /// Concurrency per key.
    PerKey(u32),
    /// Concurrency per key, the key a function of the task
    /// (`limit_key`): counted in Redis.
    PerTaskKey(u32),
    /// A rate limit per key, a second, the key a function of the task:
    /// leased from Redis.
    RatePerTaskKey(u32),
}

/// Keys over which the keyed runs' tasks spread.
const KEYS: u64 = 1_000;

#[tokio::main]
async fn main() {
    let tasks = std::env::var("PEERQ_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let server = RedisServer::start();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Unkeyed: none, the service's limit far above; keyed: none, a rate
    // per key far above, concurrency per key far above.
    let kinds: [(bool, Limit); 7] = [
        (false, Limit::None),
        (false, Limit::Rate(FAR_ABOVE)),
        (true, Limit::None),
        (true, Limit::RatePerKey(FAR_ABOVE)),
        (true, Limit::PerKey(1_000)),
        (false, Limit::PerTaskKey(1_000)),
        (false, Limit::RatePerTaskKey(FAR_ABOVE)),
    ];
    let repeats = std::env::var("PEERQ_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(REPEATS);
    // Batches without and with options, interleaved.
    let (mut plain, mut optioned) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        plain.push(enqueue(&server, &mut conn, tasks, false).await);
        optioned.push(enqueue(&server, &mut conn, tasks, true).await);
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for _ in 0..repeats {
        for (i, (keyed, limit)) in kinds.iter().enumerate() {
            // `PEERQ_BENCH_ONLY=5`: that kind alone (to profile it);
            // `0,5,6`: those, interleaved.
            let only = std::env::var("PEERQ_BENCH_ONLY").ok();
            if only.is_some_and(|o| !o.split(',').any(|k| k == i.to_string())) {
                rates[i].push(1.0);
                continue;
            }
            let run = consume(&server, &mut conn, tasks, *keyed, *limit).await;
            rates[i].push(run.rate);
        }
    }
    let accuracy = consume(
        &server,
        &mut conn,
        ACCURACY_TASKS,
        false,
        Limit::Rate(ACCURACY_LIMIT),
    )
    .await;

    println!();
    println!(
        "| consume to the last ack, 1 instance, no-op handler ({tasks} prefilled; runs in order) | without, tasks/s | with, tasks/s | with / without, each run | medians | median of the runs' ratios |"
    );
    println!("|---|---|---|---|---|---|");
    let rows = [
        (format!("service-wide rate limit {FAR_ABOVE}/s"), 0, 1),
        (
            format!("rate limit per key {FAR_ABOVE}/s, tasks over {KEYS} keys"),
            2,
            3,
        ),
        (
            format!("concurrency per key 1000, tasks over {KEYS} keys"),
            2,
            4,
        ),
        (
            format!(
                "concurrency per key 1000, the key a function of the task ({KEYS} keys, counted in Redis)"
            ),
            0,
            5,
        ),
        (
            format!(
                "rate limit per key {FAR_ABOVE}/s, the key a function of the task ({KEYS} keys, shares held in Redis)"
            ),
            0,
            6,
        ),
    ];
    for (label, without, with) in rows {
        println!("{}", ratio_row(&label, &rates[without], &rates[with]));
    }
    println!();
    println!(
        "| limit {ACCURACY_LIMIT}/s, {ACCURACY_TASKS} prefilled, 1 instance | starts/s | / limit | busiest second | / limit |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| | {:.0} | {:.3} | {} | {:.3} |",
        accuracy.rate,
        accuracy.rate / f64::from(ACCURACY_LIMIT),
        accuracy.busiest,
        accuracy.busiest as f64 / f64::from(ACCURACY_LIMIT)
    );
    println!();
    println!(
        "| enqueue, batches of {BATCH} ({tasks} tasks; runs in order) | enqueue_batch, tasks/s | enqueue_batch_with, Options::new() each, tasks/s | with / without, each run | medians | median of the runs' ratios |"
    );
    println!("|---|---|---|---|---|---|");
    let label = "the same tasks, no option set";
    println!("{}", ratio_row(label, &plain, &optioned));
}

/// Tasks per batch of the enqueue runs (and the prefills).
const BATCH: usize = 1000;

/// The same bench tasks for every run.
fn jobs(tasks: u64) -> Vec<Job> {
    (0..tasks)
        .map(|seq| Job {
            seq,
            sent_ns: 0,
            body: "hello, this is a mail body of moderate size".into(),
        })
        .collect()
}

/// Tasks a second of enqueueing `tasks` into a new service in batches of
/// [`BATCH`]: with `options`, through `enqueue_batch_with` with
/// `Options::new()` per task (made in the timed loop), else
/// `enqueue_batch`.
async fn enqueue(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    tasks: u64,
    options: bool,
) -> f64 {
    let (jobs, name) = (jobs(tasks), unique_name("batch"));
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let started = Instant::now();
    for chunk in jobs.chunks(BATCH) {
        if options {
            // Made as a caller makes them: timed too.
            let with: Vec<(&Job, Options)> = chunk.iter().map(|j| (j, Options::new())).collect();
            producer.enqueue_batch_with(&with).await.unwrap();
        } else {
            producer.enqueue_batch(chunk).await.unwrap();
        }
    }
    let elapsed = started.elapsed();
    flush(conn).await;
    tasks as f64 / elapsed.as_secs_f64()
}

/// Empties Redis: the entries a run leaves would weigh on the runs after.
async fn flush(conn: &mut MultiplexedConnection) {
    let _: () = deadpool_redis::redis::cmd("FLUSHALL")
        .query_async(conn)
        .await
        .unwrap();
}

/// A consume run: tasks a second from the first start to the last ack,
/// and the most starts in one second (after the first).
struct Run {
    rate: f64,
    busiest: usize,
}

/// One instance over a new service's prefilled queue of `tasks` (with
/// `keyed`, spread over [`KEYS`] partition keys), under `limit`.
async fn consume(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    tasks: u64,
    keyed: bool,
    limit: Limit,
) -> Run {
    let name = unique_name("limits");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let jobs = jobs(tasks);
    for chunk in jobs.chunks(BATCH) {
        if keyed {
            let with: Vec<(&Job, Options)> = chunk
                .iter()
                .map(|j| (j, Options::new().key(format!("k{}", j.seq % KEYS))))
                .collect();
            producer.enqueue_batch_with(&with).await.unwrap();
        } else {
            producer.enqueue_batch(chunk).await.unwrap();
        }
    }
    let done = Arc::new(AtomicU64::new(0));
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let record = matches!(limit, Limit::Rate(l) if l < FAR_ABOVE);
    let handler = {
        let (done, starts) = (done.clone(), starts.clone());
        tower::service_fn(move |_: Task<Job>| {
            let (done, starts) = (done.clone(), starts.clone());
            async move {
                if record || done.load(Ordering::Relaxed) == 0 {
                    starts.lock().unwrap().push(Instant::now());
                }
                done.fetch_add(1, Ordering::Relaxed);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let mut builder = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .concurrency(256)
        .batch(100);
    let second = Duration::from_secs(1);
    builder = match limit {
        Limit::None => builder,
        Limit::Rate(n) => builder.rate_limit(n, second),
        Limit::RatePerKey(n) | Limit::RatePerTaskKey(n) => builder.rate_limit_per_key(n, second),
        Limit::PerKey(n) | Limit::PerTaskKey(n) => builder.concurrency_per_key(n),
    };
    let stop = CancellationToken::new();
    let builder = builder.service(handler);
    let run = match limit {
        Limit::PerTaskKey(_) | Limit::RatePerTaskKey(_) => tokio::spawn(
            builder
                .limit_key(|job: &Job| Some(format!("k{}", job.seq % KEYS)))
                .run_until(stop.clone().cancelled_owned()),
        ),
        _ => tokio::spawn(builder.run_until(stop.clone().cancelled_owned())),
    };
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    while meter::pending(conn, &name, DEFAULT_PARTITIONS).await > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let starts = starts.lock().unwrap().clone();
    let elapsed = starts[0].elapsed();
    stop.cancel();
    run.await.unwrap().unwrap();
    flush(conn).await;
    Run {
        rate: tasks as f64 / elapsed.as_secs_f64(),
        busiest: busiest_second(&starts),
    }
}

/// The most starts in one second that begins at a start after the first
/// second.
fn busiest_second(starts: &[Instant]) -> usize {
    let Some(first) = starts.first() else {
        return 0;
    };
    let mut most = 0;
    for (i, at) in starts.iter().enumerate() {
        if *at < *first + Duration::from_secs(1) {
            continue;
        }
        let end = starts.partition_point(|s| *s < *at + Duration::from_secs(1));
        most = most.max(end - i);
    }
    most
}
