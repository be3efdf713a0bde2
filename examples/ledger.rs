//! A ledger whose entries are written exactly once, however its consumers
//! crash or freeze: transfers requested through the Postgres outbox and
//! booked through the Postgres inbox (feature `postgres`).
//!
//! Run a consumer (or several) and a producer against a Redis and a
//! PostgreSQL database on localhost, each in its own terminal:
//!
//! ```text
//! cargo run --features postgres --example ledger -- consume --redis redis://127.0.0.1:6379/ --postgres postgres://app:secret@127.0.0.1/app --name ledger
//! cargo run --features postgres --example ledger -- produce --redis redis://127.0.0.1:6379/ --postgres postgres://app:secret@127.0.0.1/app --name ledger --count 1000
//! ```
//!
//! Every flag:
//!
//! ```text
//! ledger produce --redis URL --postgres URL --name NAME --count N [--rate R]
//! ledger consume --redis URL --postgres URL --name NAME [--work-ms N] [--interval-ms N] [--drain-ms N]
//! ```
//!
//! `produce` requests the transfers `seq` 0..N, each in a transaction of
//! its own that inserts its `ledger_requests` row and enqueues the transfer
//! with [`Outbox::enqueue`]: a request is enqueued if and only if it
//! committed. Run again (after a crash, say), it skips the `seq` values
//! already requested. `--rate` spreads the transfers over time (per
//! second; 0, the default, as fast as it can).
//!
//! `consume` runs one consumer instance until SIGTERM or ctrl-c; it relays
//! the service's outbox too ([`ConsumerBuilder::outbox_relay`]) and prunes
//! its inbox ([`ConsumerBuilder::inbox`]). Its handler books each transfer
//! with [`Inbox::run_once`]: one `ledger_entries` row, committed with the
//! task's inbox row. `--work-ms` is how long each transfer takes before it
//! is booked (a sleep, standing for work done before the writes).
//! A transfer has 20 runs before it goes to the dead letters, and is tried
//! again after 100 ms doubling to 2 s: the errors a booking meets are
//! short-lived.
//!
//! Both apply peerq's migrations and create the demo's tables when they
//! are missing (one demo per database: the tables do not name the service):
//!
//! | table | written by | what a row says |
//! |---|---|---|
//! | `ledger_requests(seq PRIMARY KEY, cents, at)` | `produce`, with the outbox row | transfer `seq` was requested |
//! | `ledger_entries(seq, cents, task_id, instance, token, at)` | the handler, through the inbox | transfer `seq` was booked |
//! | `ledger_runs(seq, task_id, instance, attempt, token, at)` | the handler, before the inbox, on its own | a handler run of `seq` started |
//! | `ledger_refusals(seq, why, instance, token, at)` | the handler, after the inbox said no | the run wrote nothing: `why` is `done before` (an earlier run committed) or `stale` (a newer owner's token was in the fence) |
//!
//! `ledger_entries` has no unique index on purpose: a transfer booked twice
//! would show as two rows. So after any crash, freeze or handover, this
//! holds when the queue is drained, although some `seq` have several
//! `ledger_runs` rows:
//!
//! ```text
//! SELECT seq FROM ledger_entries GROUP BY seq HAVING count(*) > 1;      -- none
//! SELECT seq FROM ledger_requests EXCEPT SELECT seq FROM ledger_entries; -- none
//! ```
//!
//! A consumer prints one status line per second on stdout; a refusal is
//! also logged on stderr.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use futures_util::{TryStreamExt, stream};
use peerq::handler::Disposition;
use peerq::postgres::{Inbox, Once, Outbox};
use peerq::{Backoff, Consumer, Handler, HandlerError, Options, TaskContext};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

#[derive(Parser)]
#[command(about = "peerq demo: a ledger booked exactly once through the Postgres inbox")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Request transfers 0..count, each with its outbox row, skipping those
    /// already requested.
    Produce {
        #[command(flatten)]
        at: Where,
        /// How many transfers.
        #[arg(long)]
        count: u64,
        /// Transfers per second (0: as fast as possible).
        #[arg(long, default_value_t = 0)]
        rate: u64,
    },
    /// Run one consumer instance, which books transfers and relays the
    /// outbox, until SIGTERM or ctrl-c.
    Consume {
        #[command(flatten)]
        at: Where,
        /// How long each transfer takes before it is booked.
        #[arg(long, default_value_t = 0)]
        work_ms: u64,
        /// The indexer's round interval.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// The drain timeout.
        #[arg(long, default_value_t = 300)]
        drain_ms: u64,
    },
}

/// `--redis`, `--postgres` and `--name`.
#[derive(clap::Args)]
struct Where {
    /// Redis URL, e.g. redis://127.0.0.1:6379/
    #[arg(long)]
    redis: String,
    /// PostgreSQL URL, e.g. postgres://app:secret@127.0.0.1/app
    #[arg(long)]
    postgres: String,
    /// The service name.
    #[arg(long)]
    name: String,
}

/// One transfer to book.
#[derive(Debug, Serialize, Deserialize)]
struct Transfer {
    seq: i64,
    cents: i64,
}

/// A transfer's failed runs before it goes to the dead letters (runs
/// interrupted by a handover's drain or a lapsed lease do not count):
/// while consumers crash and freeze, a booking meets short-lived errors
/// more often than the default of 5 allows for, and the next run books
/// it.
const MAX_ATTEMPTS: u32 = 20;
/// The errors a booking meets are short-lived (Postgres ended a session
/// that idled in its transaction, a lock on the fence was not granted in
/// time): try again soon, not after the default's minutes.
const BACKOFF: Backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(2));

/// Transactions a producer has open at once.
const IN_FLIGHT: usize = 8;

/// The demo's tables (see the module's doc).
const TABLES: &str = "
    CREATE TABLE IF NOT EXISTS ledger_requests (
        seq bigint PRIMARY KEY, cents bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE IF NOT EXISTS ledger_entries (
        seq bigint NOT NULL, cents bigint NOT NULL, task_id text NOT NULL,
        instance text NOT NULL, token bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE IF NOT EXISTS ledger_runs (
        seq bigint NOT NULL, task_id text NOT NULL, instance text NOT NULL,
        attempt int NOT NULL, token bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE IF NOT EXISTS ledger_refusals (
        seq bigint NOT NULL, why text NOT NULL, instance text NOT NULL,
        token bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
";

/// Books transfers through the inbox, and records every run and refusal
/// beside it.
struct Book {
    pool: PgPool,
    /// `<host>/<pid>`: which process ran what.
    instance: String,
    work: Duration,
    counts: Arc<Counts>,
}

/// What this instance's handler did, for the status line.
#[derive(Default)]
struct Counts {
    booked: AtomicU64,
    done_before: AtomicU64,
    stale: AtomicU64,
}

impl Handler for Book {
    type Task = Transfer;

    async fn handle(&self, t: Transfer, cx: TaskContext) -> Result<(), HandlerError> {
        let token = i64::try_from(cx.fencing_token()).unwrap_or(i64::MAX);
        // On its own, not in the inbox's transaction: a run that crashes or
        // is refused stays recorded, so a reader can count the runs.
        sqlx::query(
            "INSERT INTO ledger_runs (seq, task_id, instance, attempt, token) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(t.seq)
        .bind(cx.task_id().as_str())
        .bind(&self.instance)
        .bind(cx.attempt() as i32)
        .bind(token)
        .execute(&self.pool)
        .await?;
        // Not cut short when the run is interrupted, on purpose: a run
        // frozen past its lease reaches the database after its partition
        // moved, and the inbox, not the stop signal, keeps the entry single.
        tokio::time::sleep(self.work).await;
        let booked = Inbox::run_once(&self.pool, &cx, async |tx| {
            sqlx::query(
                "INSERT INTO ledger_entries (seq, cents, task_id, instance, token) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(t.seq)
            .bind(t.cents)
            .bind(cx.task_id().as_str())
            .bind(&self.instance)
            .bind(token)
            .execute(&mut *tx)
            .await?;
            Ok(())
        })
        .await;
        let why = match &booked {
            Ok(Once::Ran(())) => {
                self.counts.booked.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Ok(Once::DoneBefore) => {
                self.counts.done_before.fetch_add(1, Ordering::Relaxed);
                "done before"
            }
            Err(e) if e.disposition() == Disposition::Stale => {
                self.counts.stale.fetch_add(1, Ordering::Relaxed);
                "stale"
            }
            // Any other error: the task is tried again (its run recorded).
            Err(_) => return booked.map(|_| ()),
        };
        eprintln!("refused seq={} why={why} token={token}", t.seq);
        sqlx::query(
            "INSERT INTO ledger_refusals (seq, why, instance, token) VALUES ($1, $2, $3, $4)",
        )
        .bind(t.seq)
        .bind(why)
        .bind(&self.instance)
        .bind(token)
        .execute(&self.pool)
        .await?;
        // A stale run's error makes this instance drop the partition
        // without spending an attempt; its new owner books the transfer.
        booked.map(|_| ())
    }
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
        Command::Produce { at, count, rate } => produce(at, count, rate).await?,
        Command::Consume {
            at,
            work_ms,
            interval_ms,
            drain_ms,
        } => {
            let work = Duration::from_millis(work_ms);
            let interval = Duration::from_millis(interval_ms);
            consume(at, work, interval, Duration::from_millis(drain_ms)).await?
        }
    }
    Ok(())
}

/// A pool on `url`, with peerq's migrations and the demo's tables in place.
async fn connect(url: &str) -> peerq::Result<PgPool> {
    // The handlers' runs and transactions, the relay's listener and claim.
    let pool = PgPoolOptions::new()
        .max_connections(12)
        .connect(url)
        .await?;
    peerq::postgres::migrate(&pool).await?;
    let mut tx = pool.begin().await?;
    // Several processes starting at once would race on `IF NOT EXISTS`.
    sqlx::query("SELECT pg_advisory_xact_lock(7012026)")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(TABLES).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(pool)
}

async fn produce(at: Where, count: u64, rate: u64) -> peerq::Result<()> {
    let pool = connect(&at.postgres).await?;
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    let requested: Vec<i64> =
        sqlx::query_scalar("SELECT seq FROM ledger_requests WHERE seq < $1 ORDER BY seq")
            .bind(count)
            .fetch_all(&pool)
            .await?;
    let requested: std::collections::HashSet<i64> = requested.into_iter().collect();
    eprintln!("{} of {count} transfers requested before", requested.len());
    let todo: Vec<i64> = (0..count).filter(|seq| !requested.contains(seq)).collect();
    let started = Instant::now();
    // A few transactions at once: one at a time, each waits out its round
    // trips and the producer falls behind `--rate` on a busy machine.
    stream::iter(todo.iter().enumerate().map(Ok))
        .try_for_each_concurrent(IN_FLIGHT, |(i, &seq)| {
            let (pool, name) = (&pool, &at.name);
            async move {
                if rate > 0 {
                    // Transfer i is due at i/rate.
                    let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
                    tokio::time::sleep_until(due.into()).await;
                }
                request(pool, name, seq).await
            }
        })
        .await?;
    let sent = todo.len();
    eprintln!(
        "requested {sent} transfers in {:.2}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Requests transfer `seq` in a transaction of its own: its request row
/// and its outbox row commit together.
async fn request(pool: &PgPool, name: &str, seq: i64) -> peerq::Result<()> {
    let transfer = Transfer {
        seq,
        cents: 100 + seq % 900,
    };
    let mut tx = pool.begin().await?;
    // Another producer may have requested it since we looked: then this
    // one enqueues nothing.
    let new = sqlx::query(
        "INSERT INTO ledger_requests (seq, cents) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(transfer.seq)
    .bind(transfer.cents)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if new {
        Outbox::enqueue(&mut tx, name, &transfer, Options::new()).await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn consume(
    at: Where,
    work: Duration,
    interval: Duration,
    drain: Duration,
) -> peerq::Result<()> {
    let pool = connect(&at.postgres).await?;
    let host = gethostname::gethostname();
    let counts = Arc::new(Counts::default());
    let book = Book {
        pool: pool.clone(),
        instance: format!("{}/{}", host.to_string_lossy(), std::process::id()),
        work,
        counts: counts.clone(),
    };
    tokio::spawn(status(at.name.clone(), counts.clone()));
    Consumer::builder()
        .name(&at.name)
        .redis(&at.redis)
        .interval(interval)
        .drain_timeout(drain)
        .max_attempts(MAX_ATTEMPTS)
        .backoff(BACKOFF)
        .handler(book)
        .outbox_relay(pool.clone())
        .inbox(pool)
        .run()
        .await?;
    eprintln!("stopped: booked {}", counts.booked.load(Ordering::Relaxed));
    Ok(())
}

/// One line per second: what this instance's handler did.
async fn status(name: String, counts: Arc<Counts>) {
    let pid = std::process::id();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        println!(
            "{name} pid {pid:>7}  booked {:>7}  done before {:>4}  stale {:>4}",
            counts.booked.load(Ordering::Relaxed),
            counts.done_before.load(Ordering::Relaxed),
            counts.stale.load(Ordering::Relaxed),
        );
    }
}
