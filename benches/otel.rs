//! What trace context through the queue costs (issue 39, docs/design.md
//! §18), in one run against one private `redis-server`: one instance
//! (concurrency 256, reads of 100, a no-op handler) consumes a prefilled
//! queue of `PEERQ_BENCH_TASKS` tasks (default 200,000), from the first
//! handler call to the last ack, in three kinds of run:
//!
//! - **plain**: no subscriber at all, the tasks enqueued outside any span
//!   (a service without tracing);
//! - **spans**: a `tracing-opentelemetry` layer exporting to the SDK's
//!   in-memory exporter (simple processor; `PEERQ_BENCH_EXPORT=batch` for
//!   the batch one) installed for the whole process, the tasks enqueued
//!   outside any span: every task's span exported, none joined to a trace
//!   (what peerq's `task` span costs under OpenTelemetry, feature or not);
//! - **traced**: the same, the tasks enqueued inside a span, so each
//!   carries a `traceparent` and its span is a child of that one (what the
//!   `otel` feature adds: the context written, read and joined).
//!
//! A process's subscriber cannot be taken back once installed, so each
//! run is a child process of this one (`PEERQ_BENCH_CHILD=<kind>`),
//! interleaved, `PEERQ_BENCH_REPEATS` times each (default 5). Run with
//! `cargo bench --bench otel --features otel`; it prints a markdown table
//! (copied into BENCHMARKS.md).

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

mod meter;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Consumer, DEFAULT_PARTITIONS, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

use crate::meter::ratio_row;

/// The throughput bench's task, so the payloads have the same bytes.
#[derive(Serialize, Deserialize, Clone)]
struct Job {
    seq: u64,
    sent_ns: u64,
    body: String,
}

fn main() {
    let tasks: u64 = std::env::var("PEERQ_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    if let Ok(mode) = std::env::var("PEERQ_BENCH_CHILD") {
        let url = std::env::var("PEERQ_BENCH_REDIS").expect("the parent's Redis");
        let rate = child(&mode, &url, tasks);
        println!("rate {rate}");
        return;
    }
    let repeats: usize = std::env::var("PEERQ_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let server = RedisServer::start();
    let kinds = ["plain", "spans", "traced"];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for _ in 0..repeats {
        for (kind, rates) in kinds.iter().zip(rates.iter_mut()) {
            let out = Command::new(std::env::current_exe().unwrap())
                .env("PEERQ_BENCH_CHILD", kind)
                .env("PEERQ_BENCH_REDIS", server.url())
                .env("PEERQ_BENCH_TASKS", tasks.to_string())
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let rate: f64 = stdout
                .lines()
                .find_map(|l| l.strip_prefix("rate "))
                .unwrap_or_else(|| panic!("no rate from the {kind} run: {stdout}"))
                .parse()
                .unwrap();
            rates.push(rate);
            // Each run on an empty Redis.
            let mut conn = server.client().get_connection().unwrap();
            let _: () = deadpool_redis::redis::cmd("FLUSHALL")
                .query(&mut conn)
                .unwrap();
        }
    }
    println!();
    println!(
        "| consume to the last ack, 1 instance, no-op handler ({tasks} prefilled; runs in order) | without, tasks/s | with, tasks/s | with / without, each run | medians | median of the runs' ratios |"
    );
    println!("|---|---|---|---|---|---|");
    let rows = [
        (
            "the `otel` feature's trace context: every task a child of its producer's span, against spans not joined (both exported)",
            1,
            2,
        ),
        (
            "OpenTelemetry's own cost: every task's span exported, against no subscriber",
            0,
            1,
        ),
        ("both: traced tasks, against no subscriber", 0, 2),
    ];
    for (label, without, with) in rows {
        println!("{}", ratio_row(label, &rates[without], &rates[with]));
    }
}

/// One run in this process: tasks a second.
fn child(kind: &str, url: &str, tasks: u64) -> f64 {
    let traced = kind == "traced";
    // Kept: dropping the provider would stop its exports.
    let _provider = (kind != "plain").then(|| {
        let exporter = InMemorySpanExporter::default();
        let builder = SdkTracerProvider::builder();
        let provider = match std::env::var("PEERQ_BENCH_EXPORT").as_deref() {
            Ok("batch") => builder.with_batch_exporter(exporter),
            _ => builder.with_simple_exporter(exporter),
        }
        .build();
        let tracked = std::env::var("PEERQ_BENCH_INACTIVITY").is_ok();
        let layer = tracing_opentelemetry::layer()
            .with_tracked_inactivity(tracked)
            .with_tracer(provider.tracer("bench"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .unwrap();
        provider
    });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(consume(url, tasks, traced))
}

async fn consume(url: &str, tasks: u64, traced: bool) -> f64 {
    let name = unique_name("otel");
    let producer = Producer::connect(url, &name).await.unwrap();
    let jobs: Vec<Job> = (0..tasks)
        .map(|seq| Job {
            seq,
            sent_ns: 0,
            body: "hello, this is a mail body of moderate size".into(),
        })
        .collect();
    let request = tracing::info_span!("request");
    for chunk in jobs.chunks(1000) {
        let sent = producer.enqueue_batch(chunk);
        if traced {
            sent.instrument(request.clone()).await.unwrap();
        } else {
            sent.await.unwrap();
        }
    }
    drop(request);
    let done = Arc::new(AtomicU64::new(0));
    let first: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let handler = {
        let (done, first) = (done.clone(), first.clone());
        tower::service_fn(move |_: Task<Job>| {
            let (done, first) = (done.clone(), first.clone());
            async move {
                if done.fetch_add(1, Ordering::Relaxed) == 0 {
                    *first.lock().unwrap() = Some(Instant::now());
                }
                Ok::<(), HandlerError>(())
            }
        })
    };
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        Consumer::builder()
            .name(&name)
            .redis(url)
            .concurrency(256)
            .batch(100)
            .service(handler)
            .run_until(stop.clone().cancelled_owned()),
    );
    let client = deadpool_redis::redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    while meter::pending(&mut conn, &name, DEFAULT_PARTITIONS).await > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = first.lock().unwrap().unwrap().elapsed();
    stop.cancel();
    run.await.unwrap().unwrap();
    tasks as f64 / elapsed.as_secs_f64()
}
