//! What priority levels cost and how soon a high task starts (issue 38,
//! docs/design.md §17), in one run against one private `redis-server`:
//!
//! - **cost**: one instance (concurrency 256, reads of 100, a no-op
//!   handler) consumes a prefilled queue of `PEERQ_BENCH_TASKS` tasks
//!   (default 200,000) of a service without levels, of one with three
//!   levels whose tasks are all normal, and of one with three levels and
//!   the tasks spread over them; from the first handler call to the last
//!   ack; `REPEATS` runs each, interleaved, medians compared;
//! - **latency**: one instance at the default concurrency (64) over a
//!   backlog of normal 5 ms tasks; while at least 10,000 of them wait, a
//!   high task is enqueued every 20 ms: its enqueue → start latency
//!   (p50 / p99 / max), against the same high tasks on the idle instance.
//!
//! Run with `cargo bench --bench priority` (release build); it prints
//! markdown tables (copied into BENCHMARKS.md).

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

mod meter;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::aio::MultiplexedConnection;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, DEFAULT_PARTITIONS, HandlerError, Priority};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

use crate::meter::ratio_row;

/// Runs of each kind; the median counts.
const REPEATS: usize = 3;
const LEVELS: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];
/// The latency run: normal tasks' work, the backlog, high tasks' spacing.
const WORK: Duration = Duration::from_millis(5);
const BACKLOG: u64 = 10_000;
const EVERY: Duration = Duration::from_millis(20);
const SAMPLES: usize = 150;
/// From the instance's start to the first high task.
const WARM_UP: Duration = Duration::from_secs(2);

/// The throughput bench's task, so the payloads have the same bytes.
#[derive(Serialize, Deserialize, Clone)]
struct Job {
    seq: u64,
    sent_ns: u64,
    body: String,
}

/// The levels of one consume run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A service without levels.
    Plain,
    /// Three levels, every task normal.
    Normal,
    /// Three levels, the tasks spread over them.
    Spread,
    /// No levels, as many partitions as three levels have: what the
    /// partitions cost, apart from the order of starts.
    Wide,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64
}

fn job(seq: u64) -> Job {
    Job {
        seq,
        sent_ns: now_ns(),
        body: "hello, this is a mail body of moderate size".into(),
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
    let kinds = [Kind::Plain, Kind::Normal, Kind::Spread, Kind::Wide];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for _ in 0..REPEATS {
        for (i, kind) in kinds.iter().enumerate() {
            rates[i].push(consume(&server, &mut conn, tasks, *kind).await);
        }
    }
    let idle = latency(&server, false).await;
    let busy = latency(&server, true).await;

    println!();
    println!(
        "| consume to the last ack, 1 instance, no-op handler ({tasks} prefilled; runs in order) | without levels, tasks/s | with, tasks/s | with / without, each run | medians | median of the runs' ratios |"
    );
    println!("|---|---|---|---|---|---|");
    for (label, without, with) in [
        ("three levels, every task normal", 0, 1),
        ("three levels, tasks spread over them", 0, 2),
        (
            "no levels, 192 partitions (what three levels' partitions cost)",
            0,
            3,
        ),
        (
            "three levels spread, against no levels on 192 partitions (what the order of starts costs)",
            3,
            2,
        ),
    ] {
        println!("{}", ratio_row(label, &rates[without], &rates[with]));
    }
    println!();
    println!(
        "| a high task every {} ms, 1 instance at concurrency 64 | samples | enqueue → start p50 | p99 | max |",
        EVERY.as_millis()
    );
    println!("|---|---|---|---|---|");
    for (label, ms) in [
        ("idle instance".to_owned(), &idle),
        (
            format!(
                "behind ≥ {BACKLOG} waiting normal tasks of {} ms",
                WORK.as_millis()
            ),
            &busy,
        ),
    ] {
        println!(
            "| {label} | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            ms.len(),
            quantile(ms, 0.5),
            quantile(ms, 0.99),
            quantile(ms, 1.0)
        );
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

/// One instance over a new service's prefilled queue of `tasks`, with
/// the levels of `kind`: tasks a second from the first start to the last
/// ack.
async fn consume(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    tasks: u64,
    kind: Kind,
) -> f64 {
    let name = unique_name("priority");
    let partitions = match kind {
        Kind::Wide => 3 * DEFAULT_PARTITIONS,
        _ => DEFAULT_PARTITIONS,
    };
    let levels = matches!(kind, Kind::Normal | Kind::Spread);
    let mut producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(partitions);
    if levels {
        producer = producer.priorities(LEVELS);
    }
    let producer = producer.connect().await.unwrap();
    let jobs: Vec<Job> = (0..tasks).map(job).collect();
    for chunk in jobs.chunks(1000) {
        if kind == Kind::Spread {
            let with: Vec<(&Job, Options)> = chunk
                .iter()
                .map(|j| (j, Options::new().priority(LEVELS[(j.seq % 3) as usize])))
                .collect();
            producer.enqueue_batch_with(&with).await.unwrap();
        } else {
            producer.enqueue_batch(chunk).await.unwrap();
        }
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
    let mut builder = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(partitions)
        .concurrency(256)
        .batch(100);
    if levels {
        builder = builder.priorities(LEVELS);
    }
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        builder
            .service(handler)
            .run_until(stop.clone().cancelled_owned()),
    );
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let streams = match kind {
        Kind::Plain => DEFAULT_PARTITIONS,
        _ => 3 * DEFAULT_PARTITIONS,
    };
    while meter::pending(conn, &name, streams).await > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = first.lock().unwrap().expect("a start").elapsed();
    stop.cancel();
    run.await.unwrap().unwrap();
    tasks as f64 / elapsed.as_secs_f64()
}

/// High tasks' enqueue → start latencies in ms, sorted: one every
/// [`EVERY`], [`SAMPLES`] of them, on an instance with (`busy`) a backlog
/// of normal tasks that keeps at least [`BACKLOG`] waiting throughout.
async fn latency(server: &RedisServer, busy: bool) -> Vec<f64> {
    let name = unique_name("priority-latency");
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .priorities(LEVELS)
        .connect()
        .await
        .unwrap();
    // The high tasks' latencies, and the normal tasks started.
    let seen: Arc<Mutex<Vec<f64>>> = Arc::default();
    let started = Arc::new(AtomicU64::new(0));
    let handler = {
        let (seen, started) = (seen.clone(), started.clone());
        tower::service_fn(move |task: Task<Job>| {
            let (seen, started) = (seen.clone(), started.clone());
            async move {
                let job = task.payload;
                if task.cx.partition() >= DEFAULT_PARTITIONS {
                    let ms = now_ns().saturating_sub(job.sent_ns) as f64 / 1e6;
                    seen.lock().unwrap().push(ms);
                } else {
                    started.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(WORK).await;
                }
                Ok::<(), HandlerError>(())
            }
        })
    };
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        Consumer::builder()
            .name(&name)
            .redis(server.url())
            .priorities(LEVELS)
            .service(handler)
            .run_until(stop.clone().cancelled_owned()),
    );
    // The normal backlog: enough for the warm-up and the sampling (64
    // tasks of 5 ms at once: about 12,800 a second) and 10,000 more.
    // (Up to 3 s before the instance owns its partitions.)
    let sampling = Duration::from_secs(3) + WARM_UP + EVERY * SAMPLES as u32;
    let total = if busy {
        (12_800.0 * sampling.as_secs_f64() * 1.2) as u64 + BACKLOG
    } else {
        0
    };
    let mut seq = 0;
    while seq < total {
        let end = (seq + 1000).min(total);
        let chunk: Vec<Job> = (seq..end).map(job).collect();
        producer.enqueue_batch(&chunk).await.unwrap();
        seq = end;
    }
    // Once the instance owns its partitions (a high probe started) and
    // runs the backlog.
    let probe = Options::new().priority(Priority::High);
    producer.enqueue_with(job(u64::MAX), probe).await.unwrap();
    while seen.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(WARM_UP).await;
    seen.lock().unwrap().clear();
    let mut tick = tokio::time::interval(EVERY);
    for i in 0..SAMPLES as u64 {
        tick.tick().await;
        let high = Options::new().priority(Priority::High);
        producer.enqueue_with(job(total + i), high).await.unwrap();
    }
    while seen.lock().unwrap().len() < SAMPLES {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiting = total.saturating_sub(started.load(Ordering::Relaxed));
    if busy {
        assert!(
            waiting >= BACKLOG,
            "only {waiting} normal tasks still waited at the end"
        );
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    let mut ms = seen.lock().unwrap().clone();
    ms.sort_by(f64::total_cmp);
    ms
}
