//! Throughput and latency of peerq next to a raw redis-rs baseline, measured
//! in the same run against the same private `redis-server`.
//!
//! Run with `cargo bench --bench throughput` (release build). It prints a
//! markdown table (copied into BENCHMARKS.md). `PEERQ_BENCH_TASKS` sets the
//! number of tasks (default 200,000). The latency run and the second consume
//! run have a metrics recorder installed; everything before has none.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use peerq::handler::Task;
use peerq::partition::DEFAULT_PARTITIONS;
use peerq::producer::Producer;
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

const BATCH: usize = 1000;
const READ_COUNT: usize = 100;

#[derive(Serialize, Deserialize, Clone)]
struct Job {
    seq: u64,
    /// When it was enqueued, in ns since the Unix epoch (latency runs).
    sent_ns: u64,
    body: String,
}

fn job(seq: u64) -> Job {
    Job {
        seq,
        sent_ns: now_ns(),
        body: "hello, this is a mail body of moderate size".into(),
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[tokio::main]
async fn main() {
    let tasks: u64 = std::env::var("PEERQ_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let server = RedisServer::start();
    let client = server.client();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // Same payload bytes as peerq's entries, so the baselines move as much data.
    let payload = peerq::codec::Codec::encode(&peerq::codec::Bincode, &job(0)).unwrap();

    let raw_enqueue = raw_enqueue(&mut conn, tasks, &payload).await;
    let raw_consume = raw_consume(&mut conn, tasks).await;

    let name = unique_name("bench");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let peerq_enqueue = peerq_enqueue(&producer, tasks).await;
    let peerq_consume = peerq_consume(&server, &name, tasks).await;
    // The cost of metrics: the same again with a recorder installed (the
    // instance registers its handles at start, so only the second sees it).
    let metered = unique_name("bench-metered");
    let metered_producer = Producer::connect(&server.url(), &metered).await.unwrap();
    // (By path: the locals above shadow the functions' names.)
    crate::peerq_enqueue(&metered_producer, tasks).await;
    support::recorder::install();
    let metered_consume = crate::peerq_consume(&server, &metered, tasks).await;
    let (p50, p99, rate) = latency(&server).await;

    println!();
    println!("| measurement | raw redis-rs | peerq | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| enqueue, batches of {BATCH} ({tasks} tasks) | {:.0} tasks/s | {:.0} tasks/s | {:.2} |",
        raw_enqueue,
        peerq_enqueue,
        peerq_enqueue / raw_enqueue
    );
    println!(
        "| consume, 1 instance, no-op handler ({tasks} prefilled) | {:.0} tasks/s | {:.0} tasks/s | {:.2} |",
        raw_consume,
        peerq_consume,
        peerq_consume / raw_consume
    );
    println!(
        "| consume with a metrics recorder installed (vs. none, same run) | {:.0} tasks/s | {:.0} tasks/s | {:.2} |",
        peerq_consume,
        metered_consume,
        metered_consume / peerq_consume
    );
    println!(
        "| latency enqueue → handler start at {rate:.0} tasks/s | | p50 {:.2} ms, p99 {:.2} ms | |",
        p50 * 1e3,
        p99 * 1e3
    );
}

fn stream(name: &str, p: u32) -> String {
    format!("{{{name}/{p}}}:stream")
}

/// Pipelined `XADD` batches of 1,000 over the 64 streams.
async fn raw_enqueue(conn: &mut MultiplexedConnection, tasks: u64, payload: &[u8]) -> f64 {
    let started = Instant::now();
    let mut seq = 0;
    while seq < tasks {
        let mut pipe = redis::pipe();
        for _ in 0..BATCH.min((tasks - seq) as usize) {
            let p = (seq % u64::from(DEFAULT_PARTITIONS)) as u32;
            pipe.cmd("XADD")
                .arg(stream("raw", p))
                .arg("*")
                .arg(&[
                    ("id", seq.to_string().as_bytes()),
                    ("attempt", b"1"),
                    ("enqueued_at", b"0"),
                    ("codec", b"bincode"),
                    ("payload", payload),
                ])
                .ignore();
            seq += 1;
        }
        let () = pipe.query_async(conn).await.unwrap();
    }
    tasks as f64 / started.elapsed().as_secs_f64()
}

/// Per-stream `XREADGROUP COUNT 100`, pipelined over all streams with the
/// `XACK` of each stream's previous batch, until everything is read.
async fn raw_consume(conn: &mut MultiplexedConnection, tasks: u64) -> f64 {
    for p in 0..DEFAULT_PARTITIONS {
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream("raw", p))
            .arg("g")
            .arg("0")
            .query_async(conn)
            .await
            .unwrap();
    }
    let mut previous: Vec<Vec<String>> = vec![Vec::new(); DEFAULT_PARTITIONS as usize];
    let mut read = 0u64;
    let started = Instant::now();
    loop {
        let mut pipe = redis::pipe();
        for p in 0..DEFAULT_PARTITIONS {
            if !previous[p as usize].is_empty() {
                pipe.cmd("XACK")
                    .arg(stream("raw", p))
                    .arg("g")
                    .arg(&previous[p as usize])
                    .ignore();
            }
            pipe.cmd("XREADGROUP")
                .arg("GROUP")
                .arg("g")
                .arg("c")
                .arg("COUNT")
                .arg(READ_COUNT)
                .arg("STREAMS")
                .arg(stream("raw", p))
                .arg(">");
        }
        let replies: Vec<Option<redis::streams::StreamReadReply>> =
            pipe.query_async(conn).await.unwrap();
        let mut got = 0;
        for (p, reply) in replies.into_iter().enumerate() {
            let ids: Vec<String> = reply
                .map(|r| {
                    r.keys
                        .into_iter()
                        .flat_map(|k| k.ids)
                        .map(|i| i.id)
                        .collect()
                })
                .unwrap_or_default();
            got += ids.len();
            previous[p] = ids;
        }
        read += got as u64;
        if got == 0 {
            break;
        }
    }
    let rate = read as f64 / started.elapsed().as_secs_f64();
    assert_eq!(read, tasks);
    rate
}

async fn peerq_enqueue(producer: &Producer, tasks: u64) -> f64 {
    let jobs: Vec<Job> = (0..tasks).map(job).collect();
    let started = Instant::now();
    for chunk in jobs.chunks(BATCH) {
        producer.enqueue_batch(chunk).await.unwrap();
    }
    tasks as f64 / started.elapsed().as_secs_f64()
}

/// One consumer, a no-op handler, over the prefilled queue: from the first
/// task handled to the last (the first assignment takes 1-2 intervals,
/// which is not throughput).
async fn peerq_consume(server: &RedisServer, name: &str, tasks: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let first = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let (d, f) = (done.clone(), first.clone());
    let service = tower::service_fn(move |_task: Task<Job>| {
        let (d, f) = (d.clone(), f.clone());
        async move {
            f.lock().unwrap().get_or_insert_with(Instant::now);
            d.fetch_add(1, Ordering::Relaxed);
            Ok::<(), HandlerError>(())
        }
    });
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(name)
        .redis(server.url())
        .concurrency(256)
        .batch(READ_COUNT)
        .service(service);
    let signal = stop.clone();
    let run = tokio::spawn(async move { consumer.run_until(signal.cancelled_owned()).await });
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = first.lock().unwrap().unwrap().elapsed();
    stop.cancel();
    run.await.unwrap().unwrap();
    tasks as f64 / elapsed.as_secs_f64()
}

/// Enqueue → handler start at a fixed 5,000 tasks/s (5 tasks every
/// millisecond) for 5 s, on a running consumer.
async fn latency(server: &RedisServer) -> (f64, f64, f64) {
    let name = unique_name("latency");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let samples = Arc::new(std::sync::Mutex::new(Vec::<u64>::with_capacity(30_000)));
    let s = samples.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let s = s.clone();
        async move {
            s.lock()
                .unwrap()
                .push(now_ns().saturating_sub(task.payload.sent_ns));
            Ok::<(), HandlerError>(())
        }
    });
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .service(service);
    let signal = stop.clone();
    let run = tokio::spawn(async move { consumer.run_until(signal.cancelled_owned()).await });
    // Let it be assigned and settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let total = 25_000u64;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut seq = 0;
    while seq < total {
        tick.tick().await;
        let jobs: Vec<Job> = (seq..seq + 5).map(job).collect();
        producer.enqueue_batch(&jobs).await.unwrap();
        seq += 5;
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    while (samples.lock().unwrap().len() as u64) < total {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    let mut v = samples.lock().unwrap().clone();
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)] as f64 / 1e9;
    (at(0.50), at(0.99), rate)
}
