//! A service that "sends mails": run several `consume` instances of one
//! name and a `produce`, and watch them split the work. Its flags reach
//! most of the framework's settings (partitions, indexing, assignors,
//! codecs, tracking, limits, priorities, singletons, TLS, Clusters), and
//! the tests run it as separate processes; for a worker to deploy, see
//! `examples/worker.rs`.
//!
//! Run two consumers and a producer against a Redis on localhost, each in
//! its own terminal:
//!
//! ```text
//! cargo run --example mail_sender -- consume --redis redis://127.0.0.1:6379/ --name mail-demo --print-tasks
//! cargo run --example mail_sender -- consume --redis redis://127.0.0.1:6379/ --name mail-demo --print-tasks
//! cargo run --example mail_sender -- produce --redis redis://127.0.0.1:6379/ --name mail-demo --count 1000
//! ```
//!
//! Every flag:
//!
//! ```text
//! mail_sender consume --redis URL [--cluster | --sentinel MASTER_NAME] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] [--wait-for-replicas N] --name NAME [--partitions N] [--indexing ranked|incr] [--assignor modulo|rendezvous] [--weight N] [--interval-ms N] [--drain-ms N] [--skew-ms N] [--work-ms N] [--print-tasks] [--print-events] [--http ADDR] [--codec json|bincode] [--track] [--rate-limit N] [--concurrency-per-key N] [--priorities LEVELS] [--ordered] [--singleton NAME]... [--membership redis|etcd --etcd URLS]
//! mail_sender produce --redis URL [--cluster | --sentinel MASTER_NAME] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] [--wait-for-replicas N] --name NAME [--partitions N] --count N [--batch N] [--rate N] [--print-enqueued] [--codec json|bincode] [--print-ids] [--keys K] [--first-seq N] [--priority high|normal|low] [--priorities LEVELS]
//! ```
//!
//! With `--cluster`, `--redis` is a comma-separated list of a Redis
//! Cluster's node URLs (some of them are enough). For a `rediss://` URL,
//! `--tls-ca FILE` trusts that CA, `--tls-cert FILE --tls-key FILE`
//! present a client certificate (build with `--features tls`).
//!
//! `--wait-for-replicas N` (on one server or a Cluster) has the writes a
//! failover must not lose wait until `N` replicas have them, at most
//! 100 ms (`Redis::wait_for_replicas(N, 100 ms)`): an enqueue or an ack not
//! confirmed in time fails, and is sent again.
//!
//! With `--print-tasks` a consumer prints, on stdout, a line when a task's
//! handler starts and one when it succeeded (before the task is acked):
//! `start seq=<seq> [key=<key>] partition=<p> generation=<g> epoch=<e> token=<t> attempt=<a> at=<µs>` and
//! `handled seq=<seq> [key=<key>] id=<task id> partition=<p> generation=<g> index=<i> replicas=<r> epoch=<e> token=<t> attempt=<a> checked_at=<µs> at=<µs>`
//! (`at`: microseconds since the Unix epoch; `checked_at`: right before the
//! `TaskContext::still_owned` check that passed, before the line is printed). With `--print-events` it prints
//! its partitions' changes, `event partition=<p> generation=<g> change=started|stopped|drained token=<t> at=<µs>`,
//! and its standing, `standing kind=assigned epoch=<e> index=<i> replicas=<r> at=<µs>`
//! or `standing kind=fenced|left epoch=<e> at=<µs>`. Without either, one
//! status line per second. Logs go to stderr.
//!
//! `--singleton NAME` (repeatable) also runs singleton job `NAME`, on one
//! instance of the service at a time (docs/design.md §20). It prints
//! `singleton start name=<NAME> token=<t> epoch=<e> at=<µs>` when it
//! starts, `singleton tick name=<NAME> token=<t> epoch=<e> checked_at=<µs> at=<µs>`
//! at once and then every 100 ms while `still_owned()` holds (`checked_at`
//! right before that check, which passed), and `singleton stop
//! name=<NAME> token=<t> at=<µs>` when it ends.
//!
//! `--membership etcd --etcd URLS` keeps the rounds on an etcd cluster (a
//! comma-separated list of its client URLs; service-wide, docs/design.md
//! §2.2; build with `--features etcd`); the tasks stay on Redis.
//!
//! `--indexing` picks the indexer's mode (service-wide: every instance of a
//! name must use the same one): `ranked` (default) keeps indices while the
//! membership is stable; `incr` is the seed's `INCR` per interval, whose
//! indices can swap between instances and move partitions. `--assignor`
//! picks who owns which partition (service-wide): `modulo` (default) or
//! `rendezvous`, which moves about P/N partitions per join or leave and
//! gives each instance a share in proportion to its `--weight` (1 to 1000).
//!
//! `--http ADDR` (built with the `http` feature, as `cargo run --features
//! http --example mail_sender`) serves `GET /metrics`, `GET /health/live`
//! and `GET /health/ready` at `ADDR`, such as `127.0.0.1:9090`.
//!
//! The producer retries a batch that failed (Redis restarting, say) until it
//! is enqueued; with `--print-enqueued` it prints `enqueued from=<seq> to=<seq>`
//! (exclusive) once a batch's enqueue returned success: with
//! `--wait-for-replicas`, once replicas confirmed it. (A batch sent again
//! after a failure that landed, a replica that did not confirm in time
//! included, is enqueued twice.) With `--print-ids` it prints, at the same
//! moment, `task seq=<seq> id=<handle>` for each task of the batch (the
//! handle, `<partition>/<task id>`, is what `peerq task show|wait|cancel` take).
//!
//! `--codec json|bincode` (default `bincode`) encodes the tasks, results
//! and progress; service-wide, so the consumers and producers of a name
//! must agree. `--track` switches the service's task tracking on (also
//! when it was switched off before): the handler then reports its progress
//! in four steps over `--work-ms` (25, 50, 75 and 100), returns the result
//! `{"seq": <seq>}`, and on a user's cancel stops at once and prints
//! `cancelled seq=<seq> reason=user at=<µs>`.
//!
//! `--rate-limit N` sets the service's rate limit to N starts a second
//! across every instance (also when another was set before), as
//! `peerq limit set --name NAME --rate N/1s` does; `--concurrency-per-key N`
//! lets at most N tasks of one key run at once across every instance.
//!
//! The service has three priority levels, `high,normal,low`, unless
//! `--priorities` (service-wide, on consumers and producers alike) names
//! others, such as `normal` for none; `produce --priority high` enqueues
//! its tasks at that level (default `normal`): the consumers start them
//! before the normal backlog they have read.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand, ValueEnum};
use peerq::admin::Admin;
use peerq::assignment::Standing;
use peerq::consumer::{PartitionChange, PartitionEvent};
use peerq::handler::{CancelReason, HandlerWithResult};
use peerq::limits::RateLimit;
use peerq::producer::{Options, Producer};
use peerq::singleton::SingletonContext;
use peerq::tracking::Tracking;
use peerq::{
    Assignor, Bincode, Codec, Consumer, HandlerError, Indexing, Json, Membership, Priority, Redis,
    TaskContext, Tls,
};
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
        #[command(flatten)]
        service: ServiceArgs,
        #[command(flatten)]
        settings: Settings,
    },
    /// Enqueue `count` mails with sequence numbers 0..count.
    Produce {
        #[command(flatten)]
        service: ServiceArgs,
        #[command(flatten)]
        plan: Plan,
    },
}

/// What both commands take: the Redis, the service and its codec.
#[derive(clap::Args)]
struct ServiceArgs {
    /// Redis URL, e.g. redis://127.0.0.1:6379/ (with --cluster, a
    /// comma-separated list of node URLs)
    #[arg(long)]
    redis: String,
    /// --redis names nodes of a Redis Cluster.
    #[arg(long, conflicts_with = "sentinel")]
    cluster: bool,
    /// --redis names the sentinels (a comma-separated list of their URLs)
    /// that watch the master of this name.
    #[arg(long, value_name = "MASTER_NAME")]
    sentinel: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    replicas: ReplicaArgs,
    /// The service name.
    #[arg(long)]
    name: String,
    /// How tasks, results and progress are encoded; service-wide.
    #[arg(long, value_enum, default_value_t = CodecArg::Bincode)]
    codec: CodecArg,
}

/// A consumer's partitions, indexing and timing settings, what it prints,
/// where it serves HTTP, and whether it switches tracking on.
#[derive(clap::Args)]
struct Settings {
    /// The number of partitions of a new service (default: the
    /// service's, 64 for a new one); service-wide.
    #[arg(long)]
    partitions: Option<u32>,
    /// The indexer's mode; service-wide.
    #[arg(long, value_enum, default_value_t = IndexingArg::Ranked)]
    indexing: IndexingArg,
    /// Who owns which partition: modulo or rendezvous; service-wide.
    #[arg(long, default_value_t = Assignor::Modulo)]
    assignor: Assignor,
    /// This instance's weight under the rendezvous assignor (1 to 1000).
    #[arg(long, default_value_t = 1)]
    weight: u32,
    /// The indexer's round interval.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// The drain timeout.
    #[arg(long, default_value_t = 300)]
    drain_ms: u64,
    /// The tolerated clock skew.
    #[arg(long, default_value_t = 50)]
    skew_ms: u64,
    /// How long each task takes.
    #[arg(long, default_value_t = 0)]
    work_ms: u64,
    /// Print a line when each task starts and when it succeeded.
    #[arg(long)]
    print_tasks: bool,
    /// Print the partitions' changes and the instance's standing.
    #[arg(long)]
    print_events: bool,
    /// Serve metrics and health checks over HTTP at this address (needs
    /// the `http` feature).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Switch the service's task tracking on (even if it was switched
    /// off): report progress, return results, stop on a user's cancel.
    #[arg(long)]
    track: bool,
    /// Start at most N tasks per second across the whole service (set in
    /// the service's limits, as `peerq limit set --rate N/1s` does).
    #[arg(long, value_name = "N")]
    rate_limit: Option<u32>,
    /// Run at most N tasks of one key at once across the whole service
    /// (set in the service's limits, as `peerq limit set
    /// --concurrency-per-key N` does).
    #[arg(long, value_name = "N")]
    concurrency_per_key: Option<u32>,
    /// Run each partition's tasks one at a time, in their order (the
    /// service's setting; with `--priorities normal`: ordered partitions
    /// have no levels).
    #[arg(long)]
    ordered: bool,
    #[command(flatten)]
    levels: LevelsArg,
    /// Where the rounds keep the service's membership; service-wide.
    #[arg(long, value_enum, default_value_t = MembershipArg::Redis)]
    membership: MembershipArg,
    /// etcd's client URLs, comma-separated (with `--membership etcd`).
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    etcd: Vec<String>,
    /// Also run singleton job NAME (repeatable): it prints `singleton
    /// start`, a `singleton tick` every 100 ms while it holds, and
    /// `singleton stop`.
    #[arg(long, value_name = "NAME")]
    singleton: Vec<String>,
}

/// `--priorities`: the service's levels, on consumers and producers.
#[derive(clap::Args)]
struct LevelsArg {
    /// The service's priority levels, comma-separated; service-wide.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "high,normal,low"
    )]
    priorities: Vec<PriorityArg>,
}

impl LevelsArg {
    fn levels(&self) -> Vec<Priority> {
        self.priorities.iter().map(|&p| p.into()).collect()
    }
}

/// A priority level, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PriorityArg {
    High,
    Normal,
    Low,
}

impl From<PriorityArg> for Priority {
    fn from(arg: PriorityArg) -> Self {
        match arg {
            PriorityArg::High => Priority::High,
            PriorityArg::Normal => Priority::Normal,
            PriorityArg::Low => Priority::Low,
        }
    }
}

/// What a producer enqueues, how fast, and what it prints.
#[derive(clap::Args)]
struct Plan {
    /// The number of partitions of a new service (default: the
    /// service's, 64 for a new one).
    #[arg(long)]
    partitions: Option<u32>,
    /// How many tasks.
    #[arg(long)]
    count: u64,
    /// Tasks per pipelined batch.
    #[arg(long, default_value_t = 100)]
    batch: u64,
    /// Tasks per second (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Print a line per batch once its enqueue returned success.
    #[arg(long)]
    print_enqueued: bool,
    /// Print each task's handle once its batch's enqueue returned success.
    #[arg(long)]
    print_ids: bool,
    /// Give task `seq` the partition key `k<seq % K>` (0: no key; the
    /// task's id places it).
    #[arg(long, default_value_t = 0, value_name = "K")]
    keys: u64,
    /// Number the tasks from this seq, so that two producer runs can be
    /// told apart.
    #[arg(long, default_value_t = 0, value_name = "N")]
    first_seq: u64,
    /// The tasks' priority level.
    #[arg(long, value_enum, default_value_t = PriorityArg::Normal)]
    priority: PriorityArg,
    #[command(flatten)]
    levels: LevelsArg,
}

/// `--codec`: how tasks are encoded, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CodecArg {
    /// Compact, for producers and consumers in Rust.
    Bincode,
    /// Readable, and what producers in other languages write.
    Json,
}

/// `--indexing`: the indexer's mode, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum IndexingArg {
    /// The rank of the instance's offset: stable while the membership is.
    Ranked,
    /// The seed's `INCR` per interval: indices can swap between instances.
    Incr,
}

impl From<IndexingArg> for Indexing {
    fn from(arg: IndexingArg) -> Self {
        match arg {
            IndexingArg::Ranked => Indexing::Ranked,
            IndexingArg::Incr => Indexing::Incr,
        }
    }
}

/// `--membership`: where the rounds run, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MembershipArg {
    /// In the service's Redis.
    Redis,
    /// In an etcd cluster (`--etcd URLS`; the `etcd` feature).
    Etcd,
}

impl Settings {
    /// The membership the flags ask for.
    fn membership(&self) -> peerq::Result<Membership> {
        match self.membership {
            MembershipArg::Redis => Ok(Membership::Redis),
            #[cfg(feature = "etcd")]
            MembershipArg::Etcd => Ok(Membership::etcd(&self.etcd)),
            #[cfg(not(feature = "etcd"))]
            MembershipArg::Etcd => Err(peerq::Error::InvalidSetting {
                setting: "membership",
                message: "this example was built without the `etcd` feature; run it with \
                          `cargo run --features etcd --example mail_sender`"
                    .into(),
            }),
        }
    }
}

/// One mail to send.
#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    seq: u64,
    to: String,
}

/// "Sends" a mail: waits `work`, in four steps, then reports it.
struct SendMail {
    work: Duration,
    print: bool,
    handled: Arc<AtomicU64>,
}

/// What sending a mail returns: with tracking on, the task's result.
#[derive(Debug, Serialize)]
struct Sent {
    seq: u64,
}

impl HandlerWithResult for SendMail {
    type Task = Mail;
    type Output = Sent;

    async fn handle(&self, mail: Mail, cx: TaskContext) -> Result<Sent, HandlerError> {
        if self.print {
            say(&format!(
                "start seq={}{} partition={} generation={} epoch={} token={} attempt={} at={}",
                mail.seq,
                keyed(&cx),
                cx.partition(),
                cx.generation(),
                cx.epoch(),
                cx.fencing_token(),
                cx.attempt(),
                micros(SystemTime::now())
            ))?;
        }
        // Four steps, each reported as progress in percent (nothing is
        // written with tracking off). A real sender would stop between
        // steps; give up when a user cancels the task, or when the
        // partition's drain timeout (or a lapsed lease) interrupts us.
        for percent in [25u8, 50, 75, 100] {
            if !self.work.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(self.work / 4) => {}
                    _ = cx.cancelled() => return Err(stop(&mail, &cx, "interrupted")),
                }
            }
            cx.progress(&percent);
        }
        // Right before the effect (printing `handled`): may this instance
        // still act? After a freeze longer than the lease it may not, and
        // the partition's next owner runs the task. The time is taken just
        // before the check: a freeze that lands between a check that passed
        // and the clock read would otherwise date the check after it.
        let checked_at = micros(SystemTime::now());
        if !cx.still_owned() {
            return Err(stop(&mail, &cx, "no longer the partition's owner"));
        }
        if self.print {
            say(&format!(
                "handled seq={}{} id={} partition={} generation={} index={} replicas={} epoch={} token={} attempt={} checked_at={checked_at} at={}",
                mail.seq,
                keyed(&cx),
                cx.task_id(),
                cx.partition(),
                cx.generation(),
                cx.index(),
                cx.replicas(),
                cx.epoch(),
                cx.fencing_token(),
                cx.attempt(),
                micros(SystemTime::now())
            ))?;
        }
        // The effect is done: an interruption now must not run the task
        // again.
        cx.finished();
        self.handled.fetch_add(1, Ordering::Relaxed);
        Ok(Sent { seq: mail.seq })
    }
}

/// The error of a run that stops before its effect: on a user's cancel,
/// once `cancelled seq=<seq> reason=user at=<µs>` is printed (the task
/// ends `cancelled`, never retried); otherwise `why` (it runs again).
fn stop(mail: &Mail, cx: &TaskContext, why: &str) -> HandlerError {
    if cx.cancel_reason() != Some(CancelReason::User) {
        return HandlerError::msg(why);
    }
    let at = micros(SystemTime::now());
    match say(&format!("cancelled seq={} reason=user at={at}", mail.seq)) {
        Ok(()) => HandlerError::msg("cancelled by a user"),
        Err(e) => e.into(),
    }
}

/// Writes one line to stdout, flushed, so concurrent lines never mix.
fn say(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Microseconds since the Unix epoch.
/// ` key=<key>` for a task with a partition key, else nothing: the `start`
/// and `handled` lines name it.
fn keyed(cx: &TaskContext) -> String {
    cx.key().map(|k| format!(" key={k}")).unwrap_or_default()
}

fn micros(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: not in a file or a pipe.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    // The codec is part of the consumer's and the producer's types: one
    // call for each.
    match Cli::parse().command {
        Command::Consume { service, settings } => {
            let redis = redis_from_flags(&service);
            match service.codec {
                CodecArg::Bincode => consume(Bincode, redis, service.name, settings).await?,
                CodecArg::Json => consume(Json, redis, service.name, settings).await?,
            }
        }
        Command::Produce { service, plan } => {
            let redis = redis_from_flags(&service);
            match service.codec {
                CodecArg::Bincode => produce(Bincode, redis, service.name, plan).await?,
                CodecArg::Json => produce(Json, redis, service.name, plan).await?,
            }
        }
    }
    Ok(())
}

/// `--tls-ca`, `--tls-cert` and `--tls-key`, for a `rediss://` URL.
#[derive(clap::Args)]
struct TlsArgs {
    /// Trust the CA certificates in this PEM file instead of the system's.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// Present this client certificate (PEM), with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

/// `--wait-for-replicas`.
#[derive(clap::Args)]
struct ReplicaArgs {
    /// Wait until this many replicas have each write a failover must not
    /// lose, at most 100 ms; one not confirmed in time fails (and is sent
    /// again).
    #[arg(long, value_name = "N")]
    wait_for_replicas: Option<u32>,
}

/// How long `--wait-for-replicas` waits.
const WAIT_TIMEOUT: Duration = Duration::from_millis(100);

/// The Redis that `--redis`, `--cluster`, `--sentinel`, the TLS flags and
/// `--wait-for-replicas` give: one server's URL, a Cluster's node URLs, or
/// the sentinels' URLs and the master's name,
/// with TLS settings if any were given, and the replicas writes wait for,
/// if any.
fn redis_from_flags(flags: &ServiceArgs) -> Redis {
    let urls = flags.redis.split(',').map(str::trim);
    let mut redis = match (&flags.sentinel, flags.cluster) {
        (Some(master), _) => Redis::sentinel(master, urls),
        (None, true) => Redis::cluster(urls),
        (None, false) => Redis::url(&flags.redis),
    };
    let files = &flags.tls;
    if files.tls_ca.is_some() || files.tls_cert.is_some() {
        let tls = files.tls_ca.iter().fold(Tls::new(), Tls::ca_file);
        redis = redis.tls(match files.tls_cert.as_ref().zip(files.tls_key.as_ref()) {
            Some((cert, key)) => tls.client_cert(cert, key),
            None => tls,
        });
    }
    match flags.replicas.wait_for_replicas {
        Some(n) => redis.wait_for_replicas(n, WAIT_TIMEOUT),
        None => redis,
    }
}

async fn consume<C: Codec>(
    codec: C,
    redis: Redis,
    name: String,
    settings: Settings,
) -> peerq::Result<()> {
    let handled = Arc::new(AtomicU64::new(0));
    let mut builder = Consumer::builder()
        .redis(redis.clone())
        .name(&name)
        .codec(codec)
        .priorities(settings.levels.levels())
        .indexing(settings.indexing.into())
        .assignor(settings.assignor)
        .weight(settings.weight)
        .membership(settings.membership()?)
        .interval(Duration::from_millis(settings.interval_ms))
        .drain_timeout(Duration::from_millis(settings.drain_ms))
        .skew(Duration::from_millis(settings.skew_ms))
        .handler(SendMail {
            work: Duration::from_millis(settings.work_ms),
            print: settings.print_tasks,
            handled: handled.clone(),
        });
    if let Some(partitions) = settings.partitions {
        builder = builder.partitions(partitions);
    }
    if settings.ordered {
        builder = builder.ordered(true);
    }
    for name in &settings.singleton {
        builder = builder.singleton(name, ticker);
    }
    if settings.track {
        builder = builder.tracking(Tracking::on());
        track(redis.clone(), &name).await?;
    }
    let rate = settings
        .rate_limit
        .map(|n| RateLimit::new(n, Duration::from_secs(1)));
    if let Some(rate) = rate {
        builder = builder.rate_limit(rate.count(), rate.per());
    }
    if let Some(n) = settings.concurrency_per_key {
        builder = builder.concurrency_per_key(n);
    }
    if rate.is_some() || settings.concurrency_per_key.is_some() {
        limit(redis, &name, rate, settings.concurrency_per_key).await?;
    }
    let builder = match settings.http {
        #[cfg(feature = "http")]
        Some(addr) => builder.http(addr),
        #[cfg(not(feature = "http"))]
        Some(_) => {
            return Err(peerq::Error::InvalidSetting {
                setting: "http",
                message: "this example was built without the `http` feature; run it with \
                          `cargo run --features http --example mail_sender`"
                    .into(),
            });
        }
        None => builder,
    };
    if settings.print_events {
        tokio::spawn(events(builder.partition_events(), builder.standing()));
    } else if !settings.print_tasks {
        let (events, standing) = (builder.partition_events(), builder.standing());
        tokio::spawn(status(name, events, standing, handled.clone()));
    }
    builder.run().await?;
    eprintln!("stopped: handled {} tasks", handled.load(Ordering::Relaxed));
    Ok(())
}

/// The singleton job of `--singleton`: a line when it starts, one every
/// 100 ms while `still_owned()` holds (the first at once), with the time
/// right before that check, and one when it ends (told to stop, no longer
/// the holder, or dropped after its drain's end: printed by a guard).
async fn ticker(cx: SingletonContext) -> std::io::Result<()> {
    let (name, token) = (cx.name().to_owned(), cx.fencing_token());
    let now = || micros(SystemTime::now());
    say(&format!(
        "singleton start name={name} token={token} epoch={} at={}",
        cx.epoch(),
        now()
    ))?;
    /// Prints the stop line however the job ends.
    struct Stopped(String, u64);
    impl Drop for Stopped {
        fn drop(&mut self) {
            let at = micros(SystemTime::now());
            let _ = say(&format!(
                "singleton stop name={} token={} at={at}",
                self.0, self.1
            ));
        }
    }
    let _stopped = Stopped(name.clone(), token);
    let mut every = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = cx.cancelled() => break,
            _ = every.tick() => {}
        }
        let checked_at = now();
        if !cx.still_owned() {
            break;
        }
        say(&format!(
            "singleton tick name={name} token={token} epoch={} checked_at={checked_at} at={}",
            cx.epoch(),
            now()
        ))?;
    }
    Ok(())
}

/// Switches tracking on for service `name`, its retention kept, if it has
/// settings already: the builder's `tracking` is only a new service's
/// first value, and `{N}:tracking` (which `peerq tracking` sets) decides.
async fn track(redis: Redis, name: &str) -> peerq::Result<()> {
    let service = match Admin::connect(redis).await?.service(name).await {
        Ok(service) => service,
        Err(peerq::Error::UnknownService { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    let was = service.tracking().await?;
    let on = Tracking::on()
        .keep(was.kept_for())
        .keep_count(was.kept_count());
    service.set_tracking(on).await
}

/// `--rate-limit`, `--concurrency-per-key`: sets the limits given of a
/// service that exists (a new one takes the builder's).
async fn limit(
    redis: Redis,
    name: &str,
    rate: Option<RateLimit>,
    per_key: Option<u32>,
) -> peerq::Result<()> {
    let service = match Admin::connect(redis).await?.service(name).await {
        Ok(service) => service,
        Err(peerq::Error::UnknownService { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut limits = service.limits().await?;
    if let Some(rate) = rate {
        limits = limits.rate(rate);
    }
    if let Some(n) = per_key {
        limits = limits.concurrency_per_key(n);
    }
    service.set_limits(limits).await
}

/// Prints the partitions' changes and the instance's standing as they come.
async fn events(
    mut events: tokio::sync::broadcast::Receiver<PartitionEvent>,
    mut standing: tokio::sync::watch::Receiver<Standing>,
) {
    loop {
        let line = tokio::select! {
            event = events.recv() => match event {
                Ok(e) => {
                    let (change, token) = match e.change {
                        PartitionChange::Started { token } => ("started", token),
                        PartitionChange::Stopped => ("stopped", 0),
                        PartitionChange::Drained => ("drained", 0),
                        _ => ("other", 0),
                    };
                    format!(
                        "event partition={} generation={} change={change} token={token} at={}",
                        e.partition,
                        e.generation,
                        micros(e.at)
                    )
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => format!("lagged events={n}"),
                Err(_) => return,
            },
            changed = standing.changed() => {
                if changed.is_err() {
                    return;
                }
                // With the index and replicas, so a reader can tell which
                // partitions the assignment owns.
                let (kind, epoch, place) = match &*standing.borrow_and_update() {
                    Standing::Assigned(a) => (
                        "assigned",
                        a.epoch,
                        format!(" index={} replicas={}", a.index, a.replicas),
                    ),
                    Standing::Fenced { epoch, .. } => ("fenced", *epoch, String::new()),
                    Standing::Left { epoch } => ("left", *epoch, String::new()),
                    _ => ("joining", 0, String::new()),
                };
                format!("standing kind={kind} epoch={epoch}{place} at={}", micros(SystemTime::now()))
            }
        };
        if say(&line).is_err() {
            return;
        }
    }
}

/// One line per second: where this instance stands, how many partitions
/// it fetches (of every level, from its partition events), and what it did.
async fn status(
    name: String,
    mut events: tokio::sync::broadcast::Receiver<PartitionEvent>,
    standing: tokio::sync::watch::Receiver<Standing>,
    handled: Arc<AtomicU64>,
) {
    let pid = std::process::id();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut owned = std::collections::BTreeSet::new();
    let mut last = 0;
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(e) => match e.change {
                    PartitionChange::Started { .. } => {
                        owned.insert((e.generation, e.partition));
                    }
                    PartitionChange::Stopped => {
                        owned.remove(&(e.generation, e.partition));
                    }
                    _ => {}
                },
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            },
            _ = tick.tick() => {
                let total = handled.load(Ordering::Relaxed);
                let place = match &*standing.borrow() {
                    Standing::Assigned(a) => format!(
                        "instance {}/{}  owns {:>2} partitions",
                        a.index,
                        a.replicas,
                        owned.len()
                    ),
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
    }
}

async fn produce<C: Codec>(codec: C, redis: Redis, name: String, plan: Plan) -> peerq::Result<()> {
    let builder = Producer::builder()
        .codec(codec)
        .redis(redis)
        .name(&name)
        .priorities(plan.levels.levels());
    let producer = match plan.partitions {
        Some(partitions) => builder.partitions(partitions),
        None => builder,
    }
    .connect()
    .await?;
    let started = Instant::now();
    let (count, batch, rate) = (plan.count, plan.batch.max(1), plan.rate);
    let (first, last) = (plan.first_seq, plan.first_seq.saturating_add(count));
    let key = |seq: u64| (plan.keys > 0).then(|| format!("k{}", seq % plan.keys));
    let mut seq = first;
    while seq < last {
        let end = (seq + batch).min(last);
        // Each with its options (here a key, or none), through the batch
        // path.
        let mails: Vec<(Mail, Options)> = (seq..end)
            .map(|s| {
                let mail = Mail {
                    seq: s,
                    to: format!("user-{s}@example.com"),
                };
                let options = key(s).map_or_else(Options::new, |k| Options::new().key(k));
                (mail, options.priority(plan.priority.into()))
            })
            .collect();
        // Until it lands (with --wait-for-replicas, until replicas confirm
        // it): Redis may be restarting, a replica down. (An ambiguous
        // failure, where the batch landed but the reply was lost or no
        // replica confirmed it in time, enqueues it twice.)
        let mut backoff = Duration::from_millis(50);
        let ids = loop {
            match producer.enqueue_batch_with(&mails).await {
                Ok(ids) => break ids,
                Err(e) => eprintln!("enqueue failed ({e}); retrying in {backoff:?}"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        };
        if plan.print_enqueued {
            let _ = say(&format!("enqueued from={seq} to={end}"));
        }
        if plan.print_ids {
            // A mail's key places it, else its id.
            let lines: Vec<String> = (mails.iter().zip(&ids))
                .map(|((mail, options), id)| {
                    let handle = producer.handle_with(id, options);
                    format!("task seq={} id={handle}", mail.seq)
                })
                .collect();
            let _ = say(&lines.join("\n"));
        }
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
