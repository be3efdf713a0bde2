//! What a reshard costs (issue 47, docs/design.md §21), in one run against
//! one private `redis-server`, with the default round interval (1 s):
//!
//! - **complete**: two instances, a backlog of `PEERQ_BENCH_TASKS` keyed
//!   tasks (default 50,000) in 16 partitions, 5 ms handlers (64 at once per
//!   instance, about 25,000 tasks a second in all); a reshard to
//!   64 at the first handler call. The time to run the whole backlog, with
//!   the reshard and, on a service of its own, without; and with the
//!   reshard, the time from its start to its open (every old partition
//!   retired, the new layout live). `REPEATS` runs of each, interleaved.
//! - **a key's pause**: 2,000 tasks a second over 20 keys, no backlog, a
//!   reshard 16 → 64: for each key, the time between its last start in
//!   the old layout and its first in the new, next to the time between a
//!   key's consecutive starts (what a key waits without a reshard).
//!
//! Run with `cargo bench --bench reshard` (release build); it prints
//! markdown tables (copied into BENCHMARKS.md).

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

mod meter;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peerq::admin::Admin;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

/// Runs of each kind; the median counts.
const REPEATS: usize = 3;
const KEYS: u64 = 20;
/// Each task's work: 64 at once per instance, 2 instances, about 25,000
/// tasks a second.
const WORK: Duration = Duration::from_millis(5);

/// One start: when, the task's key, its generation.
type Start = (Instant, u64, u32);

/// Two instances of `name` (16 partitions), recording every start.
fn consumers(
    server: &RedisServer,
    name: &str,
    starts: &Arc<Mutex<Vec<Start>>>,
) -> (
    CancellationToken,
    Vec<tokio::task::JoinHandle<peerq::Result<()>>>,
) {
    let stop = CancellationToken::new();
    let runs = (0..2)
        .map(|_| {
            let starts = starts.clone();
            let handler = tower::service_fn(move |task: Task<u64>| {
                let starts = starts.clone();
                async move {
                    let start = (Instant::now(), task.payload % KEYS, task.cx.generation());
                    starts.lock().unwrap().push(start);
                    tokio::time::sleep(WORK).await;
                    Ok::<(), HandlerError>(())
                }
            });
            tokio::spawn(
                Consumer::builder()
                    .name(name)
                    .redis(server.url())
                    .partitions(16)
                    .concurrency(64)
                    .service(handler)
                    .run_until(stop.clone().cancelled_owned()),
            )
        })
        .collect();
    (stop, runs)
}

async fn producer(server: &RedisServer, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(server.url())
        .partitions(16)
        .connect()
        .await
        .unwrap()
}

/// Enqueues seqs `from..to`, keyed, in batches of 1,000.
async fn fill(producer: &Producer, from: u64, to: u64) {
    let all: Vec<(u64, Options)> = (from..to)
        .map(|s| (s, Options::new().key(format!("k{}", s % KEYS))))
        .collect();
    for chunk in all.chunks(1000) {
        producer.enqueue_batch_with(chunk).await.unwrap();
    }
}

/// Waits until both instances are members (a reshard needs them).
async fn members(admin: &Admin, name: &str) {
    let service = admin.service(name).await.unwrap();
    while service.status().await.unwrap().members.len() < 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A backlog of `tasks` run to its end, resharded at the first start or
/// not: seconds to the last start, and (resharded) from the start to the
/// open.
async fn backlog(
    server: &RedisServer,
    admin: &Admin,
    tasks: u64,
    reshard: bool,
) -> (f64, Option<f64>) {
    let name = unique_name("reshard-bench");
    let producer = producer(server, &name).await;
    fill(&producer, 0, tasks).await;
    let starts: Arc<Mutex<Vec<Start>>> = Arc::default();
    // The members first: with their records in, a reshard can start at
    // the first handler call.
    let (stop, runs) = consumers(server, &name, &starts);
    members(admin, &name).await;
    while starts.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let began = starts.lock().unwrap()[0].0;
    let mut opened = None;
    if reshard {
        let service = admin.service(&name).await.unwrap();
        service.reshard(64).await.unwrap();
        let asked = Instant::now();
        loop {
            let layout = service.layout().await.unwrap();
            if layout.state == "open" {
                let took = layout.opened_ms.unwrap() - layout.started_ms.unwrap();
                opened = Some(took as f64 / 1000.0 + (asked - began).as_secs_f64());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    while (starts.lock().unwrap().len() as u64) < tasks {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let last = starts.lock().unwrap().iter().map(|s| s.0).max().unwrap();
    stop.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    ((last - began).as_secs_f64(), opened)
}

/// Tasks flowing at 2,000 a second over the keys, a reshard 16 → 64 after
/// 3 s: each key's pause at the cut-over, and its usual gap, in ms.
async fn pause(server: &RedisServer, admin: &Admin) -> (Vec<f64>, Vec<f64>) {
    let name = unique_name("reshard-pause");
    let producer = producer(server, &name).await;
    let starts: Arc<Mutex<Vec<Start>>> = Arc::default();
    let (stop, runs) = consumers(server, &name, &starts);
    members(admin, &name).await;
    let flowing = CancellationToken::new();
    let flow = {
        let flowing = flowing.clone();
        tokio::spawn(async move {
            let mut seq = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while !flowing.is_cancelled() {
                tick.tick().await;
                fill(&producer, seq, seq + 20).await;
                seq += 20;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    admin
        .service(&name)
        .await
        .unwrap()
        .reshard(64)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    flowing.cancel();
    flow.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    let mut by_key: BTreeMap<u64, Vec<(Instant, u32)>> = BTreeMap::new();
    for (at, key, generation) in starts.lock().unwrap().iter() {
        by_key.entry(*key).or_default().push((*at, *generation));
    }
    let (mut pauses, mut gaps) = (Vec::new(), Vec::new());
    for starts in by_key.values_mut() {
        starts.sort();
        for pair in starts.windows(2) {
            let ms = (pair[1].0 - pair[0].0).as_secs_f64() * 1000.0;
            match (pair[0].1, pair[1].1) {
                (0, 1) => pauses.push(ms),
                (a, b) if a == b => gaps.push(ms),
                _ => {}
            }
        }
    }
    (pauses, gaps)
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let tasks = std::env::var("PEERQ_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let server = RedisServer::start();
    let admin = Admin::connect(server.url().as_str()).await.unwrap();
    let (mut plain, mut resharded, mut opens) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        plain.push(backlog(&server, &admin, tasks, false).await.0);
        let (took, opened) = backlog(&server, &admin, tasks, true).await;
        resharded.push(took);
        opens.push(opened.unwrap());
    }
    let (mut pauses, mut gaps) = pause(&server, &admin).await;
    let median = meter::median;
    println!();
    println!(
        "| {tasks} keyed tasks in 16 partitions, 2 instances, 5 ms handlers, I = 1 s | without a reshard | with a reshard to 64 at the first start | ratio | start → open |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| time to run the backlog, s (median of {REPEATS}; runs: {:?} / {:?}) | {:.2} | {:.2} | {:.2} | {:.2} s (runs: {:?}) |",
        plain.iter().map(|s| format!("{s:.2}")).collect::<Vec<_>>(),
        resharded
            .iter()
            .map(|s| format!("{s:.2}"))
            .collect::<Vec<_>>(),
        median(&plain),
        median(&resharded),
        median(&resharded) / median(&plain),
        median(&opens),
        opens.iter().map(|s| format!("{s:.2}")).collect::<Vec<_>>(),
    );
    println!();
    println!("| 2,000 tasks/s over {KEYS} keys, reshard 16 → 64 | p50 ms | max ms |");
    println!("|---|---|---|");
    println!(
        "| a key's pause at the cut-over (last start in the old layout → first in the new), {} keys | {:.0} | {:.0} |",
        pauses.len(),
        percentile(&mut pauses, 0.5),
        percentile(&mut pauses, 1.0)
    );
    println!(
        "| a key's gap between consecutive starts otherwise | {:.1} | {:.0} |",
        percentile(&mut gaps, 0.5),
        percentile(&mut gaps, 1.0)
    );
}
