//! Batches with a callback (docs/design.md §19), as a program: members
//! that succeed or fail for good, and each batch's callback once every
//! member ended.
//!
//! Run a consumer and a producer against a Redis on localhost, each in
//! its own terminal:
//!
//! ```text
//! cargo run --example flows -- consume --redis redis://127.0.0.1:6379/ --name flows-demo --fail-every 7
//! cargo run --example flows -- produce --redis redis://127.0.0.1:6379/ --name flows-demo --batches 10 --size 20
//! ```
//!
//! Every flag:
//!
//! ```text
//! flows produce --redis URL [--cluster] --name NAME [--partitions N] --batches B --size S [--rate R]
//! flows consume --redis URL [--cluster] --name NAME [--partitions N] [--fail-every K] [--work-ms N] [--interval-ms N] [--drain-ms N]
//! ```
//!
//! `produce` enqueues `B` batches of `S` members each, every batch with a
//! callback (at most `R` members a second, unlimited by default), and
//! prints `batch id=<batch id> seq=<b> size=<S>` once each batch is
//! sealed. A member's task carries its batch's seq `b`, its index `m` and
//! `S`.
//!
//! `consume` runs one instance (until SIGTERM or ctrl-c, a second one
//! leaves at once). Member `m` of batch `b` fails for good (the consumer's
//! `max_attempts` is 1) when `K > 0` and `(b * S + m) % K == 0`. It prints,
//! on stdout:
//!
//! - `member batch=<b> m=<m> attempt=<a> at=<µs>` when a member succeeds,
//! - `dead batch=<b> m=<m> at=<µs>` when one fails for good,
//! - `callback batch=<b> total=<t> ok=<k> dead=<d> at=<µs>` when a
//!   callback runs.
//!
//! With `--cluster`, `--redis` is a comma-separated list of a Redis
//! Cluster's node URLs.

use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use peerq::{Consumer, HandlerError, Producer, Redis, TaskContext};
use serde::{Deserialize, Serialize};

#[derive(Parser)]
#[command(about = "Batches with a callback on peerq: produce them, consume them")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Enqueue batches, each with a callback.
    Produce {
        #[command(flatten)]
        service: ServiceArgs,
        /// How many batches.
        #[arg(long)]
        batches: u64,
        /// Members per batch.
        #[arg(long)]
        size: u64,
        /// At most this many members a second (default: no limit).
        #[arg(long)]
        rate: Option<u64>,
    },
    /// Run one instance: members and callbacks.
    Consume {
        #[command(flatten)]
        service: ServiceArgs,
        /// Member `m` of batch `b` fails for good when `(b * S + m) % K == 0`.
        #[arg(long, value_name = "K", default_value_t = 0)]
        fail_every: u64,
        /// How long a member's work takes.
        #[arg(long, value_name = "N", default_value_t = 0)]
        work_ms: u64,
        /// The indexer's round interval.
        #[arg(long, value_name = "N", default_value_t = 1000)]
        interval_ms: u64,
        /// How long released partitions' tasks may finish.
        #[arg(long, value_name = "N", default_value_t = 300)]
        drain_ms: u64,
    },
}

#[derive(clap::Args)]
struct ServiceArgs {
    /// Redis URL (with --cluster, the node URLs, comma-separated).
    #[arg(long)]
    redis: String,
    /// `--redis` lists a Redis Cluster's nodes.
    #[arg(long)]
    cluster: bool,
    /// The service's name.
    #[arg(long)]
    name: String,
    /// The service's partitions (a new service's; an existing one's are
    /// read from Redis and must agree).
    #[arg(long, default_value_t = peerq::DEFAULT_PARTITIONS)]
    partitions: u32,
}

impl ServiceArgs {
    fn redis(&self) -> Redis {
        match self.cluster {
            true => Redis::cluster(self.redis.split(',').map(str::trim)),
            false => Redis::url(&self.redis),
        }
    }
}

/// The service's tasks: batch members and their batches' callbacks.
#[derive(Debug, Serialize, Deserialize)]
enum Job {
    /// Member `m` of batch `b`, of `size` members.
    Member { b: u64, m: u64, size: u64 },
    /// Batch `b`'s callback.
    Callback { b: u64 },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    match Cli::parse().command {
        Command::Produce {
            service,
            batches,
            size,
            rate,
        } => produce(&service, batches, size, rate).await?,
        Command::Consume {
            service,
            fail_every,
            work_ms,
            interval_ms,
            drain_ms,
        } => {
            let timing = (
                Duration::from_millis(interval_ms),
                Duration::from_millis(drain_ms),
            );
            consume(&service, fail_every, Duration::from_millis(work_ms), timing).await?
        }
    }
    Ok(())
}

async fn produce(
    service: &ServiceArgs,
    batches: u64,
    size: u64,
    rate: Option<u64>,
) -> peerq::Result<()> {
    let producer = Producer::builder()
        .redis(service.redis())
        .name(&service.name)
        .partitions(service.partitions)
        .connect()
        .await?;
    let started = tokio::time::Instant::now();
    let mut sent = 0u64;
    for b in 0..batches {
        let batch = producer
            .batch()
            .callback(&Job::Callback { b })
            .open()
            .await?;
        // Members in parts, so that a rate holds within a batch too.
        let part = rate.map_or(size, |r| r.clamp(1, 1000));
        let mut m = 0;
        while m < size {
            let end = (m + part).min(size);
            let members: Vec<Job> = (m..end).map(|m| Job::Member { b, m, size }).collect();
            batch.add(&members).await?;
            sent += end - m;
            m = end;
            if let Some(rate) = rate.filter(|r| *r > 0) {
                let due = started + Duration::from_secs_f64(sent as f64 / rate as f64);
                tokio::time::sleep_until(due).await;
            }
        }
        let id = batch.seal().await?;
        say(&format!("batch id={id} seq={b} size={size}"));
    }
    Ok(())
}

async fn consume(
    service: &ServiceArgs,
    fail_every: u64,
    work: Duration,
    (interval, drain): (Duration, Duration),
) -> peerq::Result<()> {
    let handler = tower::service_fn(move |task: peerq::handler::Task<Job>| async move {
        run(task.payload, &task.cx, fail_every, work).await
    });
    Consumer::builder()
        .redis(service.redis())
        .name(&service.name)
        .partitions(service.partitions)
        .interval(interval)
        .drain_timeout(drain)
        .max_attempts(1)
        .service(handler)
        .run()
        .await
}

async fn run(
    job: Job,
    cx: &TaskContext,
    fail_every: u64,
    work: Duration,
) -> Result<(), HandlerError> {
    match job {
        Job::Member { b, m, size } => {
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            if fail_every > 0 && (b * size + m) % fail_every == 0 {
                say(&format!("dead batch={b} m={m} at={}", now_us()));
                return Err(HandlerError::msg(
                    "this member fails for good (--fail-every)",
                ));
            }
            say(&format!(
                "member batch={b} m={m} attempt={} at={}",
                cx.attempt(),
                now_us()
            ));
        }
        Job::Callback { b } => {
            let summary = cx
                .batch_summary()
                .ok_or_else(|| HandlerError::msg("a callback without its summary"))?;
            say(&format!(
                "callback batch={b} total={} ok={} dead={} at={}",
                summary.total,
                summary.succeeded,
                summary.dead,
                now_us()
            ));
        }
    }
    Ok(())
}

/// Prints one line on stdout at once (a test reads it as it comes).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Microseconds since the Unix epoch.
fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}
