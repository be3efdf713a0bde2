//! The command line: every command, argument and help text (clap).

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "peerq",
    version,
    about = "Look at and steer the peerq services on a Redis",
    after_help = "Exit codes: 0 success, 1 failure, 2 usage error."
)]
pub(crate) struct Cli {
    /// The Redis: redis://[user:password@]host[:port][/db], or rediss://
    /// for TLS.
    #[arg(
        long,
        global = true,
        env = "PEERQ_REDIS_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) redis: Option<String>,
    /// `--redis` names nodes of a Redis Cluster: a comma-separated list of
    /// node URLs (some of them are enough).
    #[arg(
        long,
        global = true,
        env = "PEERQ_REDIS_CLUSTER",
        conflicts_with = "sentinel"
    )]
    pub(crate) cluster: bool,
    /// `--redis` names the sentinels that watch the master of this name: a
    /// comma-separated list of sentinel URLs (their user and password are
    /// the sentinels'; the master's are --master-user and
    /// PEERQ_MASTER_PASSWORD).
    #[arg(
        long,
        global = true,
        env = "PEERQ_REDIS_SENTINEL",
        value_name = "MASTER_NAME"
    )]
    pub(crate) sentinel: Option<String>,
    /// With --sentinel: the user on the master (default: the default user).
    #[arg(long, global = true, env = "PEERQ_MASTER_USER", value_name = "USER")]
    pub(crate) master_user: Option<String>,
    /// With --sentinel: the password on the master; from the environment
    /// only, so it shows in no process list.
    #[arg(skip = std::env::var("PEERQ_MASTER_PASSWORD").ok())]
    pub(crate) master_password: Option<String>,
    /// For a rediss:// URL: trust the CA certificates in this PEM file
    /// instead of the system's.
    #[arg(long, global = true, env = "PEERQ_TLS_CA", value_name = "FILE")]
    pub(crate) tls_ca: Option<std::path::PathBuf>,
    /// For a server that requires client certificates: this one (PEM),
    /// with --tls-key.
    #[arg(
        long,
        global = true,
        env = "PEERQ_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub(crate) tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(
        long,
        global = true,
        env = "PEERQ_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub(crate) tls_key: Option<std::path::PathBuf>,
    /// `status` of a service whose membership is on etcd, for a cluster
    /// that asks for TLS: trust the CA certificates in this PEM file.
    #[arg(long, global = true, env = "PEERQ_ETCD_CA", value_name = "FILE")]
    pub(crate) etcd_ca: Option<std::path::PathBuf>,
    /// ... and present this client certificate (PEM), with --etcd-key.
    #[arg(
        long,
        global = true,
        env = "PEERQ_ETCD_CERT",
        value_name = "FILE",
        requires = "etcd_key"
    )]
    pub(crate) etcd_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --etcd-cert.
    #[arg(
        long,
        global = true,
        env = "PEERQ_ETCD_KEY",
        value_name = "FILE",
        requires = "etcd_cert"
    )]
    pub(crate) etcd_key: Option<std::path::PathBuf>,
    /// ... for a cluster that asks for a user: this one, whose password is
    /// PEERQ_ETCD_PASSWORD (from the environment only, so it shows in no
    /// process list).
    #[arg(long, global = true, env = "PEERQ_ETCD_USER", value_name = "USER")]
    pub(crate) etcd_user: Option<String>,
    /// The password of --etcd-user.
    #[arg(skip = std::env::var("PEERQ_ETCD_PASSWORD").ok())]
    pub(crate) etcd_password: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// The services on this Redis: instances, backlog, delayed, dead, paused.
    Services(Output),
    /// One service: settings, members, partitions, totals, the last five
    /// minutes' rates.
    Status(Named),
    /// The dead letters: list, show, replay, purge.
    Dead {
        #[command(subcommand)]
        command: Dead,
    },
    /// The delayed tasks (delayed enqueues and retries waiting).
    Delayed {
        #[command(subcommand)]
        command: Delayed,
    },
    /// The periodic jobs.
    Periodic {
        #[command(subcommand)]
        command: Periodic,
    },
    /// Enqueues one JSON task (a service with the json codec); prints its id.
    Enqueue(Enqueue),
    /// Pauses a service: no handler starts on any instance until `resume`;
    /// tasks wait in Redis.
    Pause {
        #[command(flatten)]
        named: Named,
        /// Who pauses (shown in `status`); default user@host.
        #[arg(long, value_name = "WHO")]
        by: Option<String>,
    },
    /// Resumes a paused service.
    Resume(Named),
    /// Changes a running service's partition count: producers write the
    /// new layout at once, the old one drains, then the new one is live.
    Reshard {
        #[command(flatten)]
        named: Named,
        /// The new count of partitions (per priority level), 1 to 4096.
        #[arg(long, value_name = "P")]
        partitions: u32,
    },
    /// One tracked task: its state, result and progress; cancel it; wait
    /// for its end.
    Task {
        #[command(subcommand)]
        command: TaskCommand,
    },
    /// A batch (members and a callback): its counts and its callback.
    Batch {
        #[command(subcommand)]
        command: BatchCommand,
    },
    /// Task tracking on a running service: show it, switch it on or off
    /// (every instance follows within a second).
    Tracking {
        #[command(subcommand)]
        command: TrackingCommand,
    },
    /// Flow limits on a running service: show them, set or clear them
    /// (every instance follows within a second).
    Limit {
        #[command(subcommand)]
        command: LimitCommand,
    },
    /// Applies peerq's PostgreSQL migrations (the outbox's and inbox's
    /// tables) that the database lacks; needs no Redis. Safe to run twice,
    /// and from several places at once.
    Migrate(Migrate),
    /// Monotonic IDs over a majority of Redis servers (MajorityIds): each
    /// server's copy of a sequence, a repair, a new sequence. Needs no
    /// --redis: the servers are --servers.
    Ids {
        #[command(subcommand)]
        command: Ids,
    },
    /// Serves the web dashboard until ctrl-c or SIGTERM. Basic auth from
    /// PEERQ_DASHBOARD_BASIC_AUTH (`user:password`) or a bearer token from
    /// PEERQ_DASHBOARD_TOKEN; open without either.
    Dashboard {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
        listen: std::net::SocketAddr,
        /// No actions: pages only.
        #[arg(long)]
        read_only: bool,
    },
    /// Serves the services' queue figures as Prometheus gauges (GET
    /// /metrics), read from Redis at each scrape: a service with no
    /// instance running still shows its backlog, for an autoscaler that
    /// scales to zero. Until ctrl-c or SIGTERM.
    Exporter {
        /// Where to listen.
        #[arg(long, default_value = "0.0.0.0:9187", value_name = "ADDR")]
        listen: std::net::SocketAddr,
        /// Only this service, and no scan for others (repeat it for more);
        /// default: every service on the Redis.
        #[arg(long = "service", value_name = "NAME")]
        services: Vec<String>,
        /// How often to look for new services (a SCAN of the keyspace):
        /// 30s, 5m, ….
        #[arg(long, value_parser = delay, default_value = "60s", value_name = "DURATION")]
        rescan: Duration,
    },
}

/// `migrate`'s arguments.
#[derive(Args)]
pub(crate) struct Migrate {
    /// The database: postgres://[user[:password]@]host[:port]/database.
    #[arg(
        long,
        env = "PEERQ_POSTGRES_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) postgres: String,
    #[command(flatten)]
    pub(crate) output: Output,
}

#[derive(Subcommand)]
pub(crate) enum Ids {
    /// Each server's copy of the sequence: holds N, needs repair,
    /// unreachable, refused.
    Status(Sequence),
    /// Sets the servers that lost the sequence (key missing) to the highest
    /// value a majority of the servers hold; refused with fewer holders.
    Repair(Sequence),
    /// Creates a new sequence on every server: all must answer, none may
    /// hold it.
    Init {
        #[command(flatten)]
        sequence: Sequence,
        /// The first ID it gives.
        #[arg(long, default_value_t = 1)]
        first: u64,
    },
}

// The servers and the sequence of an `ids` command.
#[derive(Args)]
pub(crate) struct Sequence {
    /// The servers: comma-separated redis:// or rediss:// URLs, each of an
    /// independent Redis.
    #[arg(
        long,
        env = "PEERQ_IDS_SERVERS",
        hide_env_values = true,
        value_delimiter = ',',
        required = true,
        value_name = "URLS"
    )]
    pub(crate) servers: Vec<String>,
    /// The sequence's name (its key is peerq:ids:<key>).
    #[arg(long)]
    pub(crate) key: String,
    /// Use servers without appendonly yes and appendfsync always, or whose
    /// settings the user may not read.
    #[arg(long)]
    pub(crate) allow_unsafe_durability: bool,
    #[command(flatten)]
    pub(crate) output: Output,
}

#[derive(Subcommand)]
pub(crate) enum Dead {
    /// A page of dead letters.
    List {
        #[command(flatten)]
        named: Named,
        /// Only letters with this reason: failed, permanent, decode,
        /// malformed, too_large, relay.
        #[arg(long)]
        reason: Option<String>,
        /// Which first.
        #[arg(long, value_enum, default_value_t = OrderArg::Newest)]
        order: OrderArg,
        /// Letters per page.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Start after this letter (the `next` of the page before).
        #[arg(long, value_name = "REF")]
        after: Option<String>,
    },
    /// One dead letter, with its payload.
    Show {
        #[command(flatten)]
        named: Named,
        /// The letter: its REF (`<partition>/<id>`) or its id.
        #[arg(long)]
        id: String,
    },
    /// Enqueues dead letters again, from attempt 1, and removes them.
    Replay(Which),
    /// Removes dead letters for good.
    Purge(Which),
}

#[derive(Subcommand)]
pub(crate) enum Delayed {
    /// The soonest due delayed tasks.
    List {
        #[command(flatten)]
        named: Named,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

#[derive(Subcommand)]
pub(crate) enum Periodic {
    /// The periodic jobs: schedule, last and next due time.
    List(Named),
}

// `--json`: JSON instead of tables. (Plain comments on these structs:
// clap would take doc comments for the commands' help.)
#[derive(Args)]
pub(crate) struct Output {
    /// Print JSON (stable field names, listed in the README) instead of a
    /// table.
    #[arg(long)]
    pub(crate) json: bool,
}

// A command on one service.
#[derive(Args)]
pub(crate) struct Named {
    /// The service's name.
    #[arg(long)]
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) output: Output,
}

// Which dead letters a replay or purge takes.
#[derive(Args)]
pub(crate) struct Which {
    #[command(flatten)]
    pub(crate) named: Named,
    #[command(flatten)]
    pub(crate) letters: Letters,
    /// With --all: only letters with this reason.
    #[arg(long, conflicts_with = "id")]
    pub(crate) reason: Option<String>,
}

#[derive(Args)]
#[group(required = true, multiple = false)]
pub(crate) struct Letters {
    /// One letter: its REF (`<partition>/<id>`) or its id.
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// Every letter (with --reason: every letter of that reason).
    #[arg(long)]
    pub(crate) all: bool,
}

#[derive(Args)]
pub(crate) struct Enqueue {
    /// The service's name.
    #[arg(long)]
    pub(crate) name: String,
    /// The task, as JSON (`-`: read it from stdin).
    #[arg(long = "json", value_name = "TASK")]
    pub(crate) task: String,
    /// The partition key: tasks with one key run in enqueue order.
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// Run it no earlier than this from now: 500ms, 10s, 5m, 2h, 1d.
    #[arg(long, value_parser = delay)]
    pub(crate) delay: Option<Duration>,
    /// Enqueue it at most once per key (while the key is remembered, 24 h
    /// by default).
    #[arg(long, value_name = "KEY")]
    pub(crate) idempotency_key: Option<String>,
    /// A header of the task, `NAME=VALUE` (repeat it for more).
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = header)]
    pub(crate) headers: Vec<(String, String)>,
}

#[derive(Subcommand)]
pub(crate) enum TaskCommand {
    /// A task's record: state, attempt, instance, progress, result, error.
    Show(TaskArgs),
    /// Cancels a task: one not started never starts, a running one is
    /// stopped; it ends `cancelled`. Exit 0 when cancelled (or already
    /// final), printing which.
    Cancel(TaskArgs),
    /// Waits until a task is final and prints its record; exit 1 on a
    /// timeout or an unknown task.
    Wait {
        #[command(flatten)]
        task: TaskArgs,
        /// How long to wait at most: 500ms, 10s, 5m, 2h, 1d.
        #[arg(long, value_parser = delay, default_value = "30s")]
        timeout: Duration,
    },
}

#[derive(Subcommand)]
pub(crate) enum BatchCommand {
    /// A batch's members by state, whether it is sealed, and its callback.
    Show(BatchArgs),
    /// Cancels a batch: no callback (a flow's parent never runs), and its
    /// remembered members not final (a flow's children and subflows, a
    /// chain's step, a cancellable batch's members) are cancelled.
    Cancel(BatchArgs),
}

// One batch of one service.
#[derive(Args)]
pub(crate) struct BatchArgs {
    #[command(flatten)]
    pub(crate) named: Named,
    /// The batch's id (`<partition>/<uuid>`), as its enqueue returned it.
    #[arg(long, value_name = "ID")]
    pub(crate) id: String,
}

// One task of one service.
#[derive(Args)]
pub(crate) struct TaskArgs {
    #[command(flatten)]
    pub(crate) named: Named,
    /// The task: its handle (`<partition>/<task id>`) or its id.
    #[arg(long, value_name = "HANDLE")]
    pub(crate) id: String,
}

#[derive(Subcommand)]
pub(crate) enum TrackingCommand {
    /// Whether tasks are tracked, and for how long final records are kept.
    Show(Named),
    /// Tracks every task from now on.
    On {
        #[command(flatten)]
        named: Named,
        /// Keep a final task's record this long: 1h, 1d, … (default 1d,
        /// or what is set).
        #[arg(long, value_parser = delay)]
        keep: Option<Duration>,
        /// Keep at most this many final records per partition (default
        /// 1000, or what is set).
        #[arg(long, value_name = "N")]
        keep_count: Option<u32>,
    },
    /// Stops tracking: nothing is written per task from now on.
    Off(Named),
}

#[derive(Subcommand)]
pub(crate) enum LimitCommand {
    /// The limits in force.
    Show(Named),
    /// Sets a limit; the others stay as they are.
    Set {
        #[command(flatten)]
        named: Named,
        /// At most this many handler starts per period across every
        /// instance: N/PERIOD (300/1s, 5/250ms, 1000/1m) or N (a second).
        #[arg(long, value_name = "N/PERIOD", value_parser = crate::limit::rate, required_unless_present_any = ["rate_per_key", "concurrency_per_key"])]
        rate: Option<peerq::limits::RateLimit>,
        /// At most this many starts per period of each partition key,
        /// across every instance: N/PERIOD or N (a second).
        #[arg(long, value_name = "N/PERIOD", value_parser = crate::limit::rate)]
        rate_per_key: Option<peerq::limits::RateLimit>,
        /// At most this many tasks of one partition key run at once,
        /// across every instance.
        #[arg(long, value_name = "N")]
        concurrency_per_key: Option<u32>,
    },
    /// Clears the limits named (all of them when none is named).
    Clear {
        #[command(flatten)]
        named: Named,
        /// Clears the rate limit.
        #[arg(long)]
        rate: bool,
        /// Clears the rate limit per key.
        #[arg(long)]
        rate_per_key: bool,
        /// Clears the limit per key.
        #[arg(long)]
        concurrency_per_key: bool,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum OrderArg {
    /// The newest letters first.
    Newest,
    /// The oldest letters first.
    Oldest,
}

fn header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not a header; use NAME=VALUE")),
    }
}

fn delay(text: &str) -> Result<Duration, String> {
    peerq::parse_duration(text)
        .ok_or_else(|| format!("`{text}` is not a duration; use 500ms, 10s, 5m, 2h or 1d"))
}
