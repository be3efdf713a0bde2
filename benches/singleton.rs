//! What singletons cost a consumer (issue 41, docs/design.md §20), in one
//! run against one private `redis-server`:
//!
//! - **consume**: one instance (concurrency 256, reads of 100, a no-op
//!   handler) consumes a prefilled queue of `PEERQ_BENCH_TASKS` tasks
//!   (default 200,000), without singletons and with two whose jobs wake
//!   every 100 ms (as the example's); from the first handler call to the
//!   last ack; `REPEATS` runs each, interleaved, medians compared;
//! - **held**: Redis's command calls per second of an idle instance over
//!   10 s, without singletons and holding two: what keeping them costs.
//!
//! Run with `cargo bench --bench singleton` (release build); it prints
//! markdown tables (copied into BENCHMARKS.md).

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

mod meter;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::aio::MultiplexedConnection;
use peerq::consumer::ConsumerBuilder;
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::singleton::SingletonContext;
use peerq::{Bincode, Consumer, DEFAULT_PARTITIONS, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

use crate::meter::ratio_row;

/// Runs of each kind; the median counts.
const REPEATS: usize = 5;
/// How long the idle instances are measured.
const HELD_FOR: Duration = Duration::from_secs(10);

/// The throughput bench's task, so the payloads have the same bytes.
#[derive(Serialize, Deserialize, Clone)]
struct Job {
    seq: u64,
    body: String,
}

/// A job that wakes every 100 ms until told to stop.
async fn ticker(cx: SingletonContext) -> std::io::Result<()> {
    let mut every = tokio::time::interval(Duration::from_millis(100));
    while cx.still_owned() {
        tokio::select! {
            _ = cx.cancelled() => break,
            _ = every.tick() => {}
        }
    }
    Ok(())
}

/// A consumer of `name`, with two singletons if `singletons`.
fn builder(server: &RedisServer, name: &str, singletons: bool) -> ConsumerBuilder<(), (), Bincode> {
    let builder = Consumer::builder()
        .name(name)
        .redis(server.url())
        .partitions(DEFAULT_PARTITIONS)
        .concurrency(256)
        .batch(100);
    match singletons {
        true => builder
            .singleton("first", ticker)
            .singleton("second", ticker),
        false => builder,
    }
}

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
    let mut rates: [Vec<f64>; 2] = Default::default();
    for _ in 0..REPEATS {
        for (i, singletons) in [false, true].into_iter().enumerate() {
            rates[i].push(consume(&server, &mut conn, tasks, singletons).await);
        }
    }
    let idle = held(&server, &mut conn, false).await;
    let holding = held(&server, &mut conn, true).await;
    println!();
    println!(
        "| consume to the last ack, 1 instance, no-op handler ({tasks} prefilled; runs in order) | without singletons, tasks/s | with two, tasks/s | with / without, each run | medians | median of the runs' ratios |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "{}",
        ratio_row("two singletons waking every 100 ms", &rates[0], &rates[1])
    );
    println!();
    println!(
        "| an idle instance over {} s | Redis calls/s |",
        HELD_FOR.as_secs()
    );
    println!("|---|---|");
    println!("| without singletons | {idle:.1} |");
    println!("| holding two singletons | {holding:.1} |");
}

/// One instance over a new service's prefilled queue of `tasks`: tasks a
/// second from the first start to the last ack.
async fn consume(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    tasks: u64,
    singletons: bool,
) -> f64 {
    let name = unique_name("singleton-bench");
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(DEFAULT_PARTITIONS)
        .connect()
        .await
        .unwrap();
    let jobs: Vec<Job> = (0..tasks)
        .map(|seq| Job {
            seq,
            body: "hello, this is a mail body of moderate size".into(),
        })
        .collect();
    for chunk in jobs.chunks(1000) {
        producer.enqueue_batch(chunk).await.unwrap();
    }
    let done = Arc::new(AtomicU64::new(0));
    let first: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handler = {
        let (done, first) = (done.clone(), first.clone());
        tower::service_fn(move |_: Task<Job>| {
            let (done, first) = (done.clone(), first.clone());
            async move {
                first.lock().unwrap().get_or_insert_with(Instant::now);
                done.fetch_add(1, Ordering::Relaxed);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        builder(server, &name, singletons)
            .service(handler)
            .run_until(stop.clone().cancelled_owned()),
    );
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    while meter::pending(conn, &name, DEFAULT_PARTITIONS).await > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = first.lock().unwrap().expect("a start").elapsed();
    stop.cancel();
    run.await.unwrap().unwrap();
    tasks as f64 / elapsed.as_secs_f64()
}

/// Redis's calls per second while one idle instance runs, after it has
/// settled (its partitions and singletons acquired).
async fn held(server: &RedisServer, conn: &mut MultiplexedConnection, singletons: bool) -> f64 {
    let name = unique_name("singleton-held");
    let stop = CancellationToken::new();
    let handler = tower::service_fn(|_: Task<Job>| async { Ok::<(), HandlerError>(()) });
    let run = tokio::spawn(
        builder(server, &name, singletons)
            .service(handler)
            .run_until(stop.clone().cancelled_owned()),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = meter::read(conn).await;
    tokio::time::sleep(HELD_FOR).await;
    let cost = meter::read(conn).await.since(&before);
    stop.cancel();
    run.await.unwrap().unwrap();
    cost.calls() as f64 / HELD_FOR.as_secs_f64()
}
