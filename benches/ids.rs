//! The cost of `MajorityIds` (docs/design.md §13): IDs per second from 1
//! and from 8 concurrent callers against three local redis-servers with
//! AOF and `appendfsync always`, and what contention costs at 8: attempts
//! per issued ID, and IDs burned (values a minority took and no caller
//! got). Next to it, the floor: an `INCR` on one of those servers, which
//! survives no loss of it.
//!
//! Run with `cargo bench --bench ids` (release build). It prints a
//! markdown table (copied into BENCHMARKS.md), one row per run.
//! `PEERQ_BENCH_SECONDS` (default 3) sets how long each run draws IDs;
//! `PEERQ_BENCH_RUNS` (default 3) how many runs of each.

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::ids::{MajorityIds, ServerState};
use peerq::metrics::IDS_ATTEMPTS_TOTAL;
use support::{RedisServer, ServerOptions, unique_name};

/// The concurrent callers of each measurement.
const CALLERS: [usize; 2] = [1, 8];

/// One run's figures.
struct Run {
    rate: f64,
    attempts_per_id: f64,
    /// IDs issued.
    issued: u64,
    /// Values skipped: taken by a minority of servers and never issued.
    burned: u64,
}

#[tokio::main]
async fn main() {
    let seconds: u64 = env("PEERQ_BENCH_SECONDS", 3);
    let runs: usize = env("PEERQ_BENCH_RUNS", 3);
    let readings = support::recorder::install();
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::start_with(ServerOptions {
                aof: true,
                ..ServerOptions::default()
            })
        })
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let during = Duration::from_secs(seconds);
    println!(
        "| callers | run | MajorityIds IDs/s | attempts per ID | IDs issued, burned | INCR on one server /s |"
    );
    println!("|---|---|---|---|---|---|");
    for callers in CALLERS {
        for run in 1..=runs {
            let ids = MajorityIds::builder()
                .servers(urls.clone())
                .key(unique_name("bench"))
                .build()
                .await
                .expect("build");
            ids.init(1).await.expect("init");
            let majority = draw(&ids, callers, during, readings).await;
            let floor = incr(&servers[0], callers, during).await;
            println!(
                "| {callers} | {run} | {:.0} | {:.2} | {}, {} | {floor:.0} |",
                majority.rate, majority.attempts_per_id, majority.issued, majority.burned
            );
        }
    }
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `callers` tasks drawing IDs for `during`.
async fn draw(
    ids: &MajorityIds,
    callers: usize,
    during: Duration,
    readings: &support::recorder::Readings,
) -> Run {
    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (ids, issued) = (ids.clone(), issued.clone());
            tokio::spawn(async move {
                while started.elapsed() < during {
                    ids.next().await.expect("an ID");
                    issued.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let issued = issued.load(Ordering::Relaxed);
    // The sequence began at 0: every value below the highest one a server
    // took was either issued or burned.
    let highest = ids
        .status()
        .await
        .into_iter()
        .filter_map(|s| match s.state {
            ServerState::Holds(value) => Some(value),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let name = ids.key().trim_start_matches("peerq:ids:");
    let attempts = readings.counter(IDS_ATTEMPTS_TOTAL, &[("key", name)]);
    Run {
        rate: issued as f64 / elapsed,
        attempts_per_id: attempts as f64 / issued as f64,
        issued,
        burned: highest.saturating_sub(issued),
    }
}

/// The floor: `callers` tasks sending `INCR` to one server (one
/// multiplexed connection, as `MajorityIds` keeps per server) for
/// `during`; per second.
async fn incr(server: &RedisServer, callers: usize, during: Duration) -> f64 {
    let conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = unique_name("bench-incr");
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (mut conn, key) = (conn.clone(), key.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while started.elapsed() < during {
                    let _: u64 = redis::cmd("INCR")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}
