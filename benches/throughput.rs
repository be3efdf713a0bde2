//! Throughput and latency of peerq next to raw redis-rs baselines,
//! measured in the same run against the same private `redis-server`.
//!
//! Run with `cargo bench --bench throughput` (release build). It prints
//! markdown tables (copied into BENCHMARKS.md). `PEERQ_BENCH_TASKS` sets the
//! number of tasks (default 200,000). The latency run and the second consume
//! run have a metrics recorder installed; everything before has none.
//! `PEERQ_BENCH_CONCURRENCY` (default 256) and `PEERQ_BENCH_BATCH` (default
//! 100, the raw consumers' read count) set peerq's consumer's concurrency
//! and batch, to try other settings against the same baselines.
//!
//! Two raw baselines (issue 26), both in [`raw`]:
//!
//! - serial: one connection, each pipeline spread over the 64 streams, one
//!   pipeline after the other (the first baseline);
//! - per stream: a task and a connection per stream, each looping on its
//!   own stream; for the consumer also on 1, 2, 4 and 8 shared multiplexed
//!   connections, the designs a reader of many partitions could take.
//!
//! peerq's consume runs `REPEATS` times too, interleaved with the raw
//! ones (each on entries of its own, those of one enqueue run), and its
//! median run counts; it is timed from its first handler call to its last ack,
//! as the raw consumers ack theirs before they end; the time to its last
//! handler call (the measure before issue 26) is printed too, with how
//! many tasks were still unacked then.
//!
//! Each raw consumer runs `REPEATS` times, interleaved, and its median run
//! counts (they are quick, and vary by ±20 % from run to run). For the
//! consumers it also prints what 1,000 tasks cost: the commands Redis
//! counted (those run inside scripts too), Redis's CPU time and this
//! process's. `RUST_LOG` (say `peerq=info`) logs to stderr;
//! `PEERQ_BENCH_ONLY=latency` runs the latency measurement alone;
//! `PEERQ_BENCH_ONLY=consume` (or `enqueue`) runs peerq's consume (or
//! enqueue) next to the per-stream raw one alone (to try a change, or
//! under a profiler); `PEERQ_BENCH_ONLY=cluster` the Redis Cluster runs
//! ([`cluster`]) alone.

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

#[path = "throughput/cluster.rs"]
mod cluster;
#[path = "throughput/fleet.rs"]
mod fleet;
mod meter;
#[path = "throughput/raw.rs"]
mod raw;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use meter::Cost;
use peerq::DEFAULT_PARTITIONS;
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Consumer, HandlerError};
use raw::{BATCH, READ_COUNT};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

/// The streams every raw consumer reads, each with its own group.
const RAW: &str = "raw";
/// The streams the per-stream raw producer writes.
const RAW_PER_STREAM: &str = "raw-per-stream";
/// How often the bench asks whether peerq's last acks have landed.
const ACK_POLL: Duration = Duration::from_millis(10);
/// Runs of each raw consumer; the median counts.
const REPEATS: usize = 3;
/// The serial raw consumer's key among the designs (by connections).
const SERIAL: usize = 0;
/// Commands listed per consumer in the cost table.
const TOP_COMMANDS: usize = 12;
/// Connections the per-stream loops share, besides one each.
const SHARED: [usize; 4] = [1, 2, 4, 8];

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

/// A consume run's rate, and what it cost for how many tasks.
struct Consumed {
    rate: f64,
    cost: Cost,
    tasks: u64,
}

/// peerq's consume run: to the last ack (comparable with the raw ones),
/// and to the last handler call, with what was still unacked then.
struct PeerqConsumed {
    acked: Consumed,
    handled_rate: f64,
    /// Entries delivered and not acked when the last handler had run.
    unacked: u64,
    /// From the last handler call to the last ack.
    ack_lag: Duration,
}

#[tokio::main]
async fn main() {
    let tasks: u64 = std::env::var("PEERQ_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    // Logs on request (`RUST_LOG=peerq=info`), to see what the consumer did
    // in a run that measured oddly.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let server = RedisServer::start();
    // `PEERQ_BENCH_ONLY=latency`: the latency run alone, to try a change.
    if std::env::var("PEERQ_BENCH_ONLY").as_deref() == Ok("latency") {
        let (p50, p99, rate) = latency(&server).await;
        println!(
            "| latency enqueue → handler start at {rate:.0} tasks/s | p50 {:.2} ms, p99 {:.2} ms |",
            p50 * 1e3,
            p99 * 1e3
        );
        let (p50, p99) = raw_latency(&server).await;
        println!(
            "| raw floor: enqueue → read, one blocking XREADGROUP over 64 streams | p50 {:.2} ms, p99 {:.2} ms |",
            p50 * 1e3,
            p99 * 1e3
        );
        return;
    }
    if std::env::var("PEERQ_BENCH_ONLY").as_deref() == Ok("cluster") {
        cluster::run(&server, tasks).await;
        return;
    }
    if std::env::var("PEERQ_BENCH_ONLY").as_deref() == Ok("enqueue") {
        enqueue_only(&server, tasks).await;
        return;
    }
    if std::env::var("PEERQ_BENCH_ONLY").as_deref() == Ok("consume") {
        consume_only(&server, tasks).await;
        return;
    }
    let client = server.client();
    let mut conn = raw::connect(&client, 1).await.remove(0);
    // Same payload bytes as peerq's entries, so the baselines move as much data.
    let payload = peerq::Codec::encode(&peerq::Bincode, &job(0)).unwrap();

    let serial_enqueue = raw::enqueue_serial(&mut conn, RAW, tasks, &payload).await;
    let own = raw::connect(&client, 64).await;
    let name = unique_name("bench");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    // The per-stream producer and peerq's, interleaved, `REPEATS` times
    // each, medians: one caller waiting on each batch suffers more from
    // whatever else the machine does than 64 loops do, so single runs
    // gave ratios from 0.4 to 1.2. The raw producer's first run's entries
    // stay (the raw consumers read them) and its others are deleted;
    // every peerq run's stay, each consumed by one peerq consume below.
    let (mut raw_enqueues, mut peerq_enqueues) = (Vec::new(), Vec::new());
    let mut peerq_names = Vec::new();
    for run in 0..REPEATS {
        let (raw_name, peerq_name) = match run {
            0 => (RAW_PER_STREAM.to_owned(), name.clone()),
            _ => (
                format!("{RAW_PER_STREAM}-{run}"),
                unique_name("bench-enqueue"),
            ),
        };
        raw_enqueues.push(raw::enqueue_per_stream(&own, &raw_name, tasks, &payload).await);
        let rate = match run {
            0 => peerq_enqueue(&producer, tasks).await,
            _ => {
                let other = Producer::connect(&server.url(), &peerq_name).await.unwrap();
                peerq_enqueue(&other, tasks).await
            }
        };
        peerq_enqueues.push(rate);
        peerq_names.push(peerq_name);
        if run > 0 {
            raw::delete_streams(&mut conn, &raw_name).await;
        }
    }
    let per_stream_enqueue = median_of(&raw_enqueues);
    let peerq_enqueue = median_of(&peerq_enqueues);

    let rss_before = meter::peak_rss();
    let (raw_consumes, peerq_consumes) =
        consumes(&server, &mut conn, own, &peerq_names, tasks).await;
    let rss_after = meter::peak_rss();
    let serial_consume = median(&raw_consumes[&SERIAL]);
    let per_stream_consume = median(&raw_consumes[&64]);
    let peerq_consume = median_by(&peerq_consumes, |run| run.acked.rate);
    // The cost of metrics: the same again with a recorder installed (the
    // instance registers its handles at start, so only the second sees it).
    let metered = unique_name("bench-metered");
    let metered_producer = Producer::connect(&server.url(), &metered).await.unwrap();
    // (By path: the locals above shadow the functions' names.)
    crate::peerq_enqueue(&metered_producer, tasks).await;
    support::recorder::install();
    let metered_consume = crate::peerq_consume(&server, &mut conn, &metered, tasks).await;
    let (p50, p99, rate) = latency(&server).await;
    let (raw_p50, raw_p99) = raw_latency(&server).await;

    println!();
    println!(
        "| measurement | raw, one connection, 64 streams pipelined serially | raw, a task and a connection per stream | peerq | peerq / serial raw | peerq / per-stream raw |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| enqueue, batches of {BATCH} ({tasks} tasks; per stream and peerq: median of {REPEATS}, runs {} and {}) | {serial_enqueue:.0} tasks/s | {per_stream_enqueue:.0} tasks/s | {peerq_enqueue:.0} tasks/s | {:.2} | {:.2} |",
        rates(&raw_enqueues),
        rates(&peerq_enqueues),
        peerq_enqueue / serial_enqueue,
        peerq_enqueue / per_stream_enqueue,
    );
    let peerq = &peerq_consume.acked;
    println!(
        "| consume to the last ack, 1 instance, no-op handler, reads of {READ_COUNT} ({tasks} prefilled; each a median of {REPEATS}, interleaved; peerq's runs {}) | {:.0} tasks/s | {:.0} tasks/s | {:.0} tasks/s | {:.2} | {:.2} |",
        rates(
            &peerq_consumes
                .iter()
                .map(|c| c.acked.rate)
                .collect::<Vec<_>>()
        ),
        serial_consume.rate,
        per_stream_consume.rate,
        peerq.rate,
        peerq.rate / serial_consume.rate,
        peerq.rate / per_stream_consume.rate,
    );
    println!(
        "| consume to the last handler call (peerq's measure before issue 26) | | | {:.0} tasks/s | {:.2} | {:.2} |",
        peerq_consume.handled_rate,
        peerq_consume.handled_rate / serial_consume.rate,
        peerq_consume.handled_rate / per_stream_consume.rate,
    );
    println!();
    println!("| peerq, same run | |");
    println!("|---|---|");
    println!(
        "| not yet acked when the last handler had run | {} of {tasks}, acked {:.0} ms later |",
        peerq_consume.unacked,
        peerq_consume.ack_lag.as_secs_f64() * 1e3
    );
    println!(
        "| the bench process's peak memory (RSS) before / after the consume runs (raw and peerq, interleaved) | {:.0} / {:.0} MiB |",
        rss_before as f64 / (1 << 20) as f64,
        rss_after as f64 / (1 << 20) as f64
    );
    println!(
        "| consume with a metrics recorder installed / without (to the last ack) | {:.0} / {:.0} tasks/s = {:.2} |",
        metered_consume.acked.rate,
        peerq.rate,
        metered_consume.acked.rate / peerq.rate
    );
    println!(
        "| latency enqueue → handler start at {rate:.0} tasks/s | p50 {:.2} ms, p99 {:.2} ms |",
        p50 * 1e3,
        p99 * 1e3
    );
    println!(
        "| raw floor: enqueue → read, one blocking XREADGROUP over 64 streams | p50 {:.2} ms, p99 {:.2} ms |",
        raw_p50 * 1e3,
        raw_p99 * 1e3
    );
    println!();
    println!(
        "| raw per-stream consumer (64 loops of XACK + XREADGROUP COUNT {READ_COUNT}) on | tasks/s, median of {REPEATS} (min–max) | vs. a connection per stream |"
    );
    println!("|---|---|---|");
    for k in SHARED.into_iter().chain([64]) {
        let label = match k {
            1 => "1 shared multiplexed connection".to_owned(),
            64 => "64 connections, one per stream".to_owned(),
            k => format!("{k} shared multiplexed connections"),
        };
        println!(
            "| {label} | {} | {:.2} |",
            spread(&raw_consumes[&k]),
            median(&raw_consumes[&k]).rate / per_stream_consume.rate
        );
    }
    println!();
    print_costs(&[
        ("raw serial", serial_consume),
        ("raw per stream", per_stream_consume),
        ("peerq", peerq),
    ]);
    fleet::run(&server, tasks).await;
    cluster::run(&server, tasks).await;
}

/// peerq's enqueue and the per-stream raw producer's, interleaved,
/// `REPEATS` times each.
async fn enqueue_only(server: &RedisServer, tasks: u64) {
    let client = server.client();
    let mut conn = raw::connect(&client, 1).await.remove(0);
    let own = raw::connect(&client, 64).await;
    let payload = peerq::Codec::encode(&peerq::Bincode, &job(0)).unwrap();
    for _ in 0..REPEATS {
        let (raw_name, name) = (unique_name("raw-enqueue"), unique_name("bench-enqueue"));
        let per_stream = raw::enqueue_per_stream(&own, &raw_name, tasks, &payload).await;
        let producer = Producer::connect(&server.url(), &name).await.unwrap();
        let peerq = peerq_enqueue(&producer, tasks).await;
        println!(
            "| enqueue | per stream {per_stream:.0} tasks/s | peerq {peerq:.0} tasks/s | {:.2} |",
            peerq / per_stream
        );
        raw::delete_streams(&mut conn, &raw_name).await;
        raw::delete_streams(&mut conn, &name).await;
    }
}

/// peerq's consume and the per-stream raw consumer's on the same entries,
/// with what 1,000 tasks cost each.
async fn consume_only(server: &RedisServer, tasks: u64) {
    let client = server.client();
    let mut conn = raw::connect(&client, 1).await.remove(0);
    let name = unique_name("bench");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    peerq_enqueue(&producer, tasks).await;
    let payload = peerq::Codec::encode(&peerq::Bincode, &job(0)).unwrap();
    let own = raw::connect(&client, 64).await;
    raw::enqueue_per_stream(&own, RAW, tasks, &payload).await;
    raw::create_group(&mut conn, RAW, "raw-only").await;
    let before = meter::read(&mut conn).await;
    let rate = raw::consume_per_stream(&own, RAW, "raw-only", tasks).await;
    let cost = meter::read(&mut conn).await.since(&before);
    let per_stream = Consumed { rate, cost, tasks };
    let peerq = peerq_consume(server, &mut conn, &name, tasks).await;
    println!(
        "| consume to the last ack | per stream {:.0} tasks/s | peerq {:.0} tasks/s | {:.2} |",
        per_stream.rate,
        peerq.acked.rate,
        peerq.acked.rate / per_stream.rate
    );
    println!();
    print_costs(&[("raw per stream", &per_stream), ("peerq", &peerq.acked)]);
}

/// Every raw consumer `REPEATS` times (the serial one, then the
/// per-stream loops on a connection each and on each of `SHARED`), by its
/// connections (`SERIAL` for the serial one), and peerq's consume of each
/// of `peerq` (one per repeat), interleaved: a repeat runs each of them
/// once, so what the machine does meanwhile falls on all alike.
async fn consumes(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    own: Vec<MultiplexedConnection>,
    peerq: &[String],
    tasks: u64,
) -> (BTreeMap<usize, Vec<Consumed>>, Vec<PeerqConsumed>) {
    let client = &server.client();
    let mut designs = vec![(SERIAL, Vec::new()), (64, own)];
    for k in SHARED {
        designs.push((k, raw::connect(client, k).await));
    }
    let mut runs: BTreeMap<usize, Vec<Consumed>> = BTreeMap::new();
    let mut peerq_runs = Vec::new();
    for (repeat, name) in peerq.iter().enumerate() {
        for (k, conns) in &designs {
            // A group of its own: every run reads the very same entries.
            let group = format!("raw-{k}-{repeat}");
            raw::create_group(conn, RAW, &group).await;
            let before = meter::read(conn).await;
            let rate = if *k == SERIAL {
                raw::consume_serial(conn, RAW, &group, tasks).await
            } else {
                raw::consume_per_stream(conns, RAW, &group, tasks).await
            };
            let cost = meter::read(conn).await.since(&before);
            runs.entry(*k)
                .or_default()
                .push(Consumed { rate, cost, tasks });
        }
        peerq_runs.push(peerq_consume(server, conn, name, tasks).await);
    }
    (runs, peerq_runs)
}

/// The median of some rates.
fn median_of(rates: &[f64]) -> f64 {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Rates as `a / b / c` tasks/s, in run order.
fn rates(rates: &[f64]) -> String {
    let each: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
    each.join(" / ")
}

/// The run with the median rate.
fn median(runs: &[Consumed]) -> &Consumed {
    median_by(runs, |run| run.rate)
}

/// The run whose `rate` is the median.
fn median_by<T>(runs: &[T], rate: impl Fn(&T) -> f64) -> &T {
    let mut sorted: Vec<&T> = runs.iter().collect();
    sorted.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    sorted[sorted.len() / 2]
}

/// `median (min–max)` of the runs' rates.
fn spread(runs: &[Consumed]) -> String {
    let rates = runs.iter().map(|r| r.rate);
    let min = rates.clone().fold(f64::INFINITY, f64::min);
    let max = rates.fold(0.0, f64::max);
    format!("{:.0} ({min:.0}–{max:.0})", median(runs).rate)
}

/// What 1,000 tasks cost each consumer, and which commands they were.
fn print_costs(runs: &[(&str, &Consumed)]) {
    let per_1000 = |run: &Consumed, x: f64| x * 1000.0 / run.tasks as f64;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let header: Vec<&str> = runs.iter().map(|(label, _)| *label).collect();
    println!("| per 1,000 tasks consumed | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(runs.len()));
    let row = |what: &str, value: &dyn Fn(&Consumed) -> String| {
        let cells: Vec<String> = runs.iter().map(|(_, run)| value(run)).collect();
        println!("| {what} | {} |", cells.join(" | "));
    };
    row("Redis commands (inside scripts too)", &|r: &Consumed| {
        format!("{:.0}", per_1000(r, r.cost.calls() as f64))
    });
    row("XREADGROUP calls (entries per read)", &|r: &Consumed| {
        let reads = r.cost.calls_of("xreadgroup");
        format!(
            "{:.1} ({:.1})",
            per_1000(r, reads as f64),
            r.tasks as f64 / reads.max(1) as f64
        )
    });
    row("Redis CPU", &|r: &Consumed| {
        format!("{:.2} ms", per_1000(r, ms(r.cost.redis_cpu)))
    });
    row("bench process CPU", &|r: &Consumed| {
        format!("{:.2} ms", per_1000(r, ms(r.cost.process_cpu)))
    });
    row(
        "Redis time in commands (commandstats µs)",
        &|r: &Consumed| {
            let usec: u64 = r.cost.commands.values().map(|c| c.usec).sum();
            format!("{:.2} ms", per_1000(r, usec as f64 / 1e3))
        },
    );
    row("wall time", &|r: &Consumed| {
        format!("{:.2} ms", 1e6 / r.rate)
    });
    println!();
    // Each consumer's commands, in the order of the last one's (peerq's).
    let mut commands: Vec<&str> = Vec::new();
    for (_, run) in runs.iter().rev() {
        for (command, _) in run.cost.by_calls().into_iter().take(TOP_COMMANDS) {
            if !commands.contains(&command) {
                commands.push(command);
            }
        }
    }
    println!(
        "| command, per 1,000 tasks: calls (Redis µs) | {} |",
        header.join(" | ")
    );
    println!("|---|{}", "---|".repeat(runs.len()));
    for command in commands {
        row(
            command,
            &|r: &Consumed| match r.cost.commands.get(command) {
                Some(c) => format!(
                    "{:.1} ({:.0})",
                    per_1000(r, c.calls as f64),
                    per_1000(r, c.usec as f64)
                ),
                None => String::new(),
            },
        );
    }
}

async fn peerq_enqueue(producer: &Producer, tasks: u64) -> f64 {
    let jobs: Vec<Job> = (0..tasks).map(job).collect();
    let started = Instant::now();
    for chunk in jobs.chunks(BATCH) {
        producer.enqueue_batch(chunk).await.unwrap();
    }
    tasks as f64 / started.elapsed().as_secs_f64()
}

/// When the first task was handled.
type First = Arc<std::sync::Mutex<Option<Instant>>>;

/// A no-op handler that counts the tasks it ran and notes when it ran
/// the first.
fn counting() -> (
    Arc<AtomicU64>,
    First,
    impl tower::Service<
        Task<Job>,
        Response = (),
        Error = HandlerError,
        Future = impl Future<Output = Result<(), HandlerError>> + Send,
    > + Clone
    + Send
    + Sync
    + 'static,
) {
    let done = Arc::new(AtomicU64::new(0));
    let first: First = Arc::default();
    let (d, f) = (done.clone(), first.clone());
    let service = tower::service_fn(move |_task: Task<Job>| {
        let (d, f) = (d.clone(), f.clone());
        async move {
            f.lock().unwrap().get_or_insert_with(Instant::now);
            d.fetch_add(1, Ordering::Relaxed);
            Ok::<(), HandlerError>(())
        }
    });
    (done, first, service)
}

/// One consumer, a no-op handler, over the prefilled queue, from the first
/// task handled (the first assignment takes 1-2 intervals, which is not
/// throughput) to the last one handled, and on to the last one acked (as
/// the raw consumers ack theirs before they end). Its cost is read from
/// the first task to the last ack, on `conn`, for the tasks within.
async fn peerq_consume(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    name: &str,
    tasks: u64,
) -> PeerqConsumed {
    let (done, first, service) = counting();
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(name)
        .redis(server.url())
        .concurrency(
            std::env::var("PEERQ_BENCH_CONCURRENCY")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(256),
        )
        .batch(
            std::env::var("PEERQ_BENCH_BATCH")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(READ_COUNT),
        )
        .service(service);
    let signal = stop.clone();
    let run = tokio::spawn(async move { consumer.run_until(signal.cancelled_owned()).await });
    let until = |n: u64| {
        let done = done.clone();
        async move {
            while done.load(Ordering::Relaxed) < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    until(1).await;
    let handled_before = done.load(Ordering::Relaxed);
    let before = meter::read(conn).await;
    until(tasks).await;
    let started = first.lock().unwrap().unwrap();
    let handled = started.elapsed();
    let mut polls = 0;
    let mut unacked = None;
    loop {
        let pending = pending(conn, name).await;
        polls += 1;
        unacked.get_or_insert(pending);
        if pending == 0 {
            break;
        }
        tokio::time::sleep(ACK_POLL).await;
    }
    let acked = started.elapsed();
    let mut cost = meter::read(conn).await.since(&before);
    // The polls' own commands are the bench's, not the consumer's.
    cost.take_out("xpending", polls * u64::from(DEFAULT_PARTITIONS));
    stop.cancel();
    run.await.unwrap().unwrap();
    PeerqConsumed {
        acked: Consumed {
            rate: tasks as f64 / acked.as_secs_f64(),
            cost,
            tasks: tasks - handled_before,
        },
        handled_rate: tasks as f64 / handled.as_secs_f64(),
        unacked: unacked.unwrap_or_default(),
        ack_lag: acked - handled,
    }
}

/// How many entries of service `name` are delivered and not acked: one
/// `XPENDING` summary per partition, in one pipeline.
async fn pending(conn: &mut MultiplexedConnection, name: &str) -> u64 {
    let mut pipe = redis::pipe();
    for p in 0..DEFAULT_PARTITIONS {
        pipe.cmd("XPENDING").arg(raw::stream(name, p)).arg("peerq");
    }
    let summaries: Vec<(u64, redis::Value, redis::Value, redis::Value)> =
        pipe.query_async(conn).await.unwrap();
    summaries.iter().map(|s| s.0).sum()
}

/// The raw floor of [`latency`]: the same entries at the same rate, read
/// by one blocking multi-stream read (p50 and p99, in seconds).
async fn raw_latency(server: &RedisServer) -> (f64, f64) {
    let encode = |seq| peerq::Codec::encode(&peerq::Bincode, &job(seq)).unwrap();
    let sent = |bytes: &[u8]| {
        let job: Job = peerq::Codec::decode(&peerq::Bincode, bytes).unwrap();
        job.sent_ns
    };
    let name = unique_name("raw-latency");
    let mut delays = raw::latency(&server.client(), &name, 25_000, encode, sent, now_ns).await;
    delays.sort_unstable();
    let at =
        |q: f64| delays[((delays.len() as f64 * q) as usize).min(delays.len() - 1)] as f64 / 1e9;
    (at(0.50), at(0.99))
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
