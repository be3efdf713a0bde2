//! What task tracking costs (issue 37, docs/design.md §14), measured in one
//! run against one private `redis-server`:
//!
//! - **enqueue**, tracking off and on: `Producer::enqueue_batch` in batches
//!   of 1,000, `PEERQ_BENCH_TASKS` tasks (default 200,000) with the
//!   throughput bench's payload, a service of its own each time; and
//!   `Producer::enqueue`, one task at a time (`PEERQ_BENCH_SINGLE`, default
//!   20,000): an `XADD` off, the enqueue script on. Each service's
//!   `{N}:tracking` is set (through `Service::set_tracking`) before its
//!   producer's first enqueue, which reads it;
//! - **consume**, tracking off, on, and on with a handler that returns a
//!   small result: one instance, concurrency 256, reads of 100, over the
//!   queue one enqueue run left (so a tracked queue's tasks have their
//!   `waiting` records), timed from the first handler call to the last ack
//!   as the throughput bench times it;
//! - **cancel latency** ([`cancel`]) and **`wait` latency** ([`wait`]).
//!
//! Enqueue and consume ([`throughput`]) run 3 times, off and on
//! interleaved (what the machine does meanwhile falls on both alike), and
//! their medians count. Each also reads what it cost Redis per task: the
//! commands Redis counted (inside scripts too), the bytes it read and wrote
//! on the network, and, from `MEMORY USAGE`, the bytes of a record
//! ([`cost`]).
//!
//! Run with `cargo bench --bench tracking` (release build); it prints
//! markdown tables (copied into BENCHMARKS.md). `PEERQ_BENCH_CANCELS`
//! (default 2,000) and `PEERQ_BENCH_WAITS` (default 1,000) set the samples
//! of the latencies; `PEERQ_BENCH_ONLY=throughput`, `cancel` or `wait` runs
//! one part alone, and `PEERQ_BENCH_ONLY=consume` one tracked consume
//! alone (`consume-off` one untracked), for a profiler of Redis or of the
//! bench process ([`throughput::profiled`]); `RUST_LOG`
//! (say `peerq=info`) logs to stderr.

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

#[path = "tracking/cancel.rs"]
mod cancel;
#[path = "tracking/cost.rs"]
mod cost;
mod meter;
#[path = "tracking/throughput.rs"]
mod throughput;
#[path = "tracking/wait.rs"]
mod wait;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use peerq::DEFAULT_PARTITIONS;
use peerq::admin::{Admin, Service};
use serde::{Deserialize, Serialize};
use support::RedisServer;

/// How long instances may take to split the partitions, or a latency run's
/// tasks to end.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// The throughput bench's task, so the payloads have the same bytes.
#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct Job {
    pub(crate) seq: u64,
    sent_ns: u64,
    body: String,
}

pub(crate) fn job(seq: u64) -> Job {
    Job {
        seq,
        sent_ns: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
        body: "hello, this is a mail body of moderate size".into(),
    }
}

/// The small result a handler returns (a few bytes, bincode).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    pub(crate) seq: u64,
}

#[tokio::main]
async fn main() {
    let number = |var: &str, default: u64| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let tasks = number("PEERQ_BENCH_TASKS", 200_000);
    let single = number("PEERQ_BENCH_SINGLE", 20_000);
    let cancels = number("PEERQ_BENCH_CANCELS", 2_000);
    let waits = number("PEERQ_BENCH_WAITS", 1_000);
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let only = std::env::var("PEERQ_BENCH_ONLY").ok();
    let runs = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let server = RedisServer::start();
    let admin = Admin::connect(server.url()).await.unwrap();
    let mut conn = connect(&server).await;
    let load_before = cost::load_average();
    if let Some(on) = match only.as_deref() {
        Some("consume") => Some(true),
        Some("consume-off") => Some(false),
        _ => None,
    } {
        throughput::profiled(&server, &admin, &mut conn, tasks, on).await;
        return;
    }

    let mut repeats = Vec::new();
    if runs("throughput") {
        for repeat in 0..throughput::REPEATS {
            let sample = repeat == 0;
            repeats
                .push(throughput::repeat(&server, &admin, &mut conn, tasks, single, sample).await);
        }
    }
    let cancelled = match runs("cancel") {
        true => Some(cancel::run(&server, &admin, &mut conn, cancels).await),
        false => None,
    };
    let waited = match runs("wait") {
        true => Some(wait::run(&server, &admin, &mut conn, waits).await),
        false => None,
    };
    let load_after = cost::load_average();

    println!();
    println!("load average (1 min) before / after the run: {load_before} / {load_after}");
    if !repeats.is_empty() {
        throughput::print(&repeats, tasks, single);
        if let Some(records) = &repeats[0].records {
            records.print(tasks);
        }
    }
    if let Some(cancelled) = cancelled {
        cancelled.print();
    }
    if let Some(waited) = waited {
        waited.print();
    }
}

/// A connection of the bench's own, whose replies may take long (an
/// `INFO` while Redis runs a long pipeline).
pub(crate) async fn connect(server: &RedisServer) -> MultiplexedConnection {
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    server
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

/// How many entries of service `name` are delivered and not acked.
pub(crate) async fn pending(conn: &mut MultiplexedConnection, name: &str) -> u64 {
    meter::pending(conn, name, DEFAULT_PARTITIONS).await
}

/// Service `name` once a consumer of it recorded its settings.
pub(crate) async fn service_of(admin: &Admin, name: &str) -> Service {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match admin.service(name).await {
            Ok(service) => return service,
            Err(e) if Instant::now() > deadline => panic!("no service {name}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Waits until `instances` instances are assigned and own the partitions
/// in shares that differ by at most one, each fetching what it is named
/// for (as the throughput bench's fleet waits).
pub(crate) async fn wait_assigned(service: &Service, instances: usize) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = service.status().await.unwrap();
        let members: Vec<_> = status
            .members
            .iter()
            .filter(|m| m.live && m.standing == "assigned" && m.replicas == Some(instances as u32))
            .collect();
        let owned = |id: &str| {
            status
                .partitions
                .iter()
                .filter(|p| p.owner.as_deref() == Some(id))
                .count() as u64
        };
        let fair = u64::from(DEFAULT_PARTITIONS) / instances as u64;
        let split = members.len() == instances
            && members.iter().map(|m| owned(&m.id)).sum::<u64>() == u64::from(DEFAULT_PARTITIONS)
            && members.iter().all(|m| {
                let n = owned(&m.id);
                (fair..=fair + 1).contains(&n) && m.owned == n
            });
        if split {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{instances} instances did not split the partitions within {PATIENCE:?}: {:?}",
            status.members
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// p50, p99 and the largest of some durations.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Quantiles {
    pub(crate) n: usize,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
}

impl Quantiles {
    pub(crate) fn of(mut samples: Vec<Duration>) -> Quantiles {
        assert!(!samples.is_empty(), "no samples");
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
        Quantiles {
            n: samples.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: samples[samples.len() - 1],
        }
    }

    /// `p50 / p99 / max` in ms.
    pub(crate) fn ms(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        format!(
            "{:.2} / {:.2} / {:.2} ms",
            ms(self.p50),
            ms(self.p99),
            ms(self.max)
        )
    }
}
