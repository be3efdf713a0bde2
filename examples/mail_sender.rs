//! A service that "sends mails": run several `consume` instances of one
//! name and a `produce`, and watch them split the work.
//!
//! ```text
//! mail_sender consume --redis URL --name NAME [--interval-ms N] [--drain-ms N] [--work-ms N] [--print-tasks]
//! mail_sender produce --redis URL --name NAME --count N [--batch N] [--rate N]
//! ```
//!
//! With `--print-tasks` a consumer prints one line per task whose handler
//! succeeded, on stdout, before the task is acked:
//! `handled seq=<seq> id=<task id> partition=<p> index=<i> replicas=<r> epoch=<e> attempt=<a>`.
//! Without it, one status line per second. Logs go to stderr.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use peerq::indexer::Standing;
use peerq::producer::Producer;
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};

#[derive(Parser)]
#[command(about = "peerq demo: a mail-sending service")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one consumer instance until SIGTERM or ctrl-c.
    Consume {
        /// Redis URL, e.g. redis://127.0.0.1:6379/
        #[arg(long)]
        redis: String,
        /// The service name.
        #[arg(long)]
        name: String,
        /// The indexer's round interval.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// The drain timeout.
        #[arg(long, default_value_t = 300)]
        drain_ms: u64,
        /// How long each task takes.
        #[arg(long, default_value_t = 0)]
        work_ms: u64,
        /// Print one line per handled task instead of a status line per second.
        #[arg(long)]
        print_tasks: bool,
    },
    /// Enqueue `count` mails with sequence numbers 0..count.
    Produce {
        /// Redis URL, e.g. redis://127.0.0.1:6379/
        #[arg(long)]
        redis: String,
        /// The service name.
        #[arg(long)]
        name: String,
        /// How many tasks.
        #[arg(long)]
        count: u64,
        /// Tasks per pipelined batch.
        #[arg(long, default_value_t = 100)]
        batch: u64,
        /// Tasks per second (0: as fast as possible).
        #[arg(long, default_value_t = 0)]
        rate: u64,
    },
}

/// One mail to send.
#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    seq: u64,
    to: String,
}

/// "Sends" a mail: waits `work`, then reports it.
struct SendMail {
    work: Duration,
    print: bool,
    handled: Arc<AtomicU64>,
}

impl Handler for SendMail {
    type Task = Mail;

    async fn handle(&self, mail: Mail, cx: TaskContext) -> Result<(), HandlerError> {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        if self.print {
            let line = format!(
                "handled seq={} id={} partition={} index={} replicas={} epoch={} token={} attempt={}\n",
                mail.seq,
                cx.task_id(),
                cx.partition(),
                cx.index(),
                cx.replicas(),
                cx.epoch(),
                cx.fencing_token(),
                cx.attempt()
            );
            // One write per line, flushed, so concurrent lines never mix.
            let mut out = std::io::stdout().lock();
            out.write_all(line.as_bytes())?;
            out.flush()?;
        }
        self.handled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    match Cli::parse().command {
        Command::Consume {
            redis,
            name,
            interval_ms,
            drain_ms,
            work_ms,
            print_tasks,
        } => consume(redis, name, interval_ms, drain_ms, work_ms, print_tasks).await?,
        Command::Produce {
            redis,
            name,
            count,
            batch,
            rate,
        } => produce(redis, name, count, batch, rate).await?,
    }
    Ok(())
}

async fn consume(
    redis: String,
    name: String,
    interval_ms: u64,
    drain_ms: u64,
    work_ms: u64,
    print: bool,
) -> peerq::Result<()> {
    let handled = Arc::new(AtomicU64::new(0));
    let builder = Consumer::builder()
        .name(&name)
        .redis(redis)
        .interval(Duration::from_millis(interval_ms))
        .drain_timeout(Duration::from_millis(drain_ms))
        .handler(SendMail {
            work: Duration::from_millis(work_ms),
            print,
            handled: handled.clone(),
        });
    if !print {
        tokio::spawn(status(name, builder.standing(), handled.clone()));
    }
    builder.run().await?;
    eprintln!("stopped: handled {} tasks", handled.load(Ordering::Relaxed));
    Ok(())
}

/// One line per second: where this instance stands and what it did.
async fn status(
    name: String,
    standing: tokio::sync::watch::Receiver<Standing>,
    handled: Arc<AtomicU64>,
) {
    let pid = std::process::id();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = 0;
    loop {
        tick.tick().await;
        let total = handled.load(Ordering::Relaxed);
        let place = match &*standing.borrow() {
            Standing::Assigned(a) => {
                let owned = a
                    .owned_partitions(peerq::partition::DEFAULT_PARTITIONS)
                    .count();
                format!(
                    "instance {}/{}  owns {owned:>2} partitions",
                    a.index, a.replicas
                )
            }
            Standing::Joining => "joining                       ".to_owned(),
            Standing::Fenced { .. } => "between assignments           ".to_owned(),
            _ => "leaving                       ".to_owned(),
        };
        println!(
            "{name} pid {pid:>7}  {place}  handled {total:>7}  (+{}/s)",
            total - last
        );
        last = total;
    }
}

async fn produce(
    redis: String,
    name: String,
    count: u64,
    batch: u64,
    rate: u64,
) -> peerq::Result<()> {
    let producer = Producer::connect(&redis, &name).await?;
    let started = Instant::now();
    let batch = batch.max(1);
    let mut seq = 0;
    while seq < count {
        let end = (seq + batch).min(count);
        let mails: Vec<Mail> = (seq..end)
            .map(|s| Mail {
                seq: s,
                to: format!("user-{s}@example.com"),
            })
            .collect();
        producer.enqueue_batch(&mails).await?;
        seq = end;
        if rate > 0 {
            // Spread the tasks over time: batch k is due at k*batch/rate.
            let due = started + Duration::from_secs_f64(seq as f64 / rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
    }
    eprintln!(
        "enqueued {count} tasks in {:.2}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
