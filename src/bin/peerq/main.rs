//! `peerq`, the admin CLI: looks at and steers the peerq services on a
//! Redis, through the library's [`peerq::admin`] (which reads summaries
//! only, never the streams' contents but a page of dead letters or delayed
//! tasks).
//!
//! ```text
//! peerq [--redis URL] [--cluster | --sentinel MASTER_NAME] services [--json]
//! peerq status --name N [--json]
//! peerq dead list --name N [--reason R] [--order newest|oldest] [--limit 20] [--after REF] [--json]
//! peerq dead show|replay|purge --name N (--id ID | --all [--reason R]) [--json]
//! peerq delayed list --name N [--limit 20] [--json]
//! peerq periodic list --name N [--json]
//! peerq enqueue --name N --json '{…}' [--key K] [--delay 10s] [--idempotency-key K]
//! peerq pause --name N [--by WHO] [--json]
//! peerq resume --name N [--json]
//! peerq reshard --name N --partitions P [--json]
//! peerq task show|cancel --name N --id HANDLE [--json]
//! peerq task wait --name N --id HANDLE [--timeout 30s] [--json]
//! peerq tracking show|off --name N [--json]
//! peerq tracking on --name N [--keep 1d] [--keep-count 1000] [--json]
//! peerq limit show --name N [--json]
//! peerq limit set --name N [--rate N/PERIOD] [--rate-per-key N/PERIOD] [--concurrency-per-key N] [--json]
//! peerq limit clear --name N [--rate] [--rate-per-key] [--concurrency-per-key] [--json]
//! peerq dashboard [--listen 127.0.0.1:8080] [--read-only]
//! peerq exporter [--listen 0.0.0.0:9187] [--service N]… [--rescan 60s]
//! peerq migrate --postgres URL [--json]
//! peerq ids status|repair --servers URL,URL,URL --key K [--json]
//! peerq ids init --servers URL,URL,URL --key K [--first 1] [--json]
//! ```
//!
//! The Redis is `--redis URL` or the environment's `PEERQ_REDIS_URL`; with
//! `--cluster` (or `PEERQ_REDIS_CLUSTER=true`), a Redis Cluster whose
//! comma-separated node URLs `--redis` gives; with `--sentinel MASTER_NAME`
//! (or `PEERQ_REDIS_SENTINEL`), the master those sentinels watch, whose
//! comma-separated URLs `--redis` gives (the master's user is
//! `--master-user`, its password `PEERQ_MASTER_PASSWORD`). For a `rediss://` URL,
//! `--tls-ca FILE` trusts that CA instead of the system's, and
//! `--tls-cert FILE --tls-key FILE` present a client certificate.
//! `migrate` needs no Redis: its database is `--postgres URL` or the
//! environment's `PEERQ_POSTGRES_URL`; `ids` neither: its servers are
//! `--servers` or `PEERQ_IDS_SERVERS`. Tables go to stdout; with `--json`, JSON whose field names are stable
//! (the README lists them). `enqueue` prints the task's id. Exit codes: 0
//! on success, 1 on failure (one line on stderr naming what is wrong,
//! never a password), 2 on a usage error.

mod args;
mod batch;
mod exporter;
mod ids;
mod limit;
mod migrate;
mod reshard;
mod show;
mod table;
mod task;

use std::io::{Read, Write};
use std::process::ExitCode;

use args::{Cli, Command, Dead, Delayed, OrderArg, Output, Periodic, Which};
use clap::{CommandFactory, Parser};
use peerq::Redis;
use peerq::admin::{Admin, Service};
use peerq::dead_letters::{Cursor, DeadLetter, Order, Query};
use peerq::producer::Options;
use serde::Serialize;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    if let Command::Migrate(args) = &cli.command {
        return finish(runtime.block_on(migrate::run(args)));
    }
    if let Command::Ids { command } = cli.command {
        let tls = tls(cli.tls_ca, cli.tls_cert.zip(cli.tls_key));
        return finish(runtime.block_on(ids::run(command, tls)));
    }
    let Some(url) = cli.redis else {
        Cli::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "no Redis given: pass --redis URL or set PEERQ_REDIS_URL",
            )
            .exit();
    };
    let tls = tls(cli.tls_ca, cli.tls_cert.zip(cli.tls_key));
    let mut redis = match &cli.sentinel {
        Some(master) => Redis::sentinel(master, url.split(',').map(str::trim)),
        None => redis(&url, cli.cluster),
    };
    if cli.sentinel.is_some() && (cli.master_user.is_some() || cli.master_password.is_some()) {
        let user = cli.master_user.unwrap_or_default();
        redis = redis.master_auth(user, cli.master_password.unwrap_or_default());
    }
    let redis = match tls {
        Some(tls) => redis.tls(tls),
        None => redis,
    };
    let etcd_tls = self::tls(cli.etcd_ca, cli.etcd_cert.zip(cli.etcd_key));
    let etcd = EtcdAccess {
        tls: etcd_tls,
        auth: cli.etcd_user.map(|user| peerq::EtcdAuth {
            user,
            password: cli.etcd_password.unwrap_or_default(),
        }),
    };
    finish(runtime.block_on(run(redis, etcd, cli.command)))
}

/// How `status` reaches an etcd membership's cluster: `--etcd-ca`,
/// `--etcd-cert`/`--etcd-key`, `--etcd-user` with `PEERQ_ETCD_PASSWORD`.
struct EtcdAccess {
    tls: Option<peerq::Tls>,
    auth: Option<peerq::EtcdAuth>,
}

/// The Redis the flags give: `--redis URL`, or with `--cluster` a Cluster
/// whose comma-separated node URLs `--redis` gives. (With `--sentinel`, the
/// master those sentinels watch; the `--tls-*` files apply to each.)
fn redis(url: &str, cluster: bool) -> Redis {
    match cluster {
        true => Redis::cluster(url.split(',').map(str::trim)),
        false => Redis::url(url),
    }
}

/// Prints a command's output, or its error as one line on stderr; the
/// exit code.
fn finish(result: Result<String, String>) -> ExitCode {
    let (out, code) = match result {
        Ok(text) => (text, ExitCode::SUCCESS),
        Err(message) => {
            // One line, whatever the error's sources said.
            let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
            eprintln!("peerq: {line}");
            (String::new(), ExitCode::FAILURE)
        }
    };
    // A closed stdout (`| head`) is not an error of the command.
    let _ = std::io::stdout().write_all(out.as_bytes());
    code
}

/// Serves the dashboard at `listen` until ctrl-c or SIGTERM.
async fn dashboard(
    admin: Admin,
    listen: std::net::SocketAddr,
    read_only: bool,
) -> Result<String, String> {
    use peerq::dashboard::{self, Access, Settings};
    let access = Access::from_env().map_err(failed)?;
    let mut settings = Settings::new().read_only(read_only).access(access.clone());
    if listen.ip().is_loopback() {
        // Only this machine's own names: no other site's page can reach
        // it through a name of its own pointed at 127.0.0.1.
        let port = listen.port();
        settings = settings.hosts([
            listen.to_string(),
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ]);
    } else if access == Access::Open {
        eprintln!(
            "peerq: warning: the dashboard listens on {listen} with no credentials and actions on; \
             set PEERQ_DASHBOARD_BASIC_AUTH or PEERQ_DASHBOARD_TOKEN, or --read-only"
        );
    }
    let app = dashboard::router(admin, settings);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen} (--listen): {e}"))?;
    let mode = if read_only { ", read-only" } else { "" };
    eprintln!("peerq: the dashboard is at http://{listen}/ ({access:?}{mode}); ctrl-c to stop");
    axum::serve(listener, app)
        .with_graceful_shutdown(stopped())
        .await
        .map_err(|e| format!("the dashboard stopped: {e}"))?;
    Ok(String::new())
}

/// Resolves on ctrl-c or SIGTERM.
async fn stopped() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The TLS settings the flags give, if any.
fn tls(
    ca: Option<std::path::PathBuf>,
    cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
) -> Option<peerq::Tls> {
    if ca.is_none() && cert.is_none() {
        return None;
    }
    let mut tls = peerq::Tls::new();
    if let Some(ca) = ca {
        tls = tls.ca_file(ca);
    }
    if let Some((cert, key)) = cert {
        tls = tls.client_cert(cert, key);
    }
    Some(tls)
}

/// Runs `command` on `redis`; its output, or the message of what went
/// wrong.
async fn run(redis: Redis, etcd: EtcdAccess, command: Command) -> Result<String, String> {
    let admin = Admin::connect(redis).await.map_err(failed)?;
    let admin = admin.etcd_access(etcd.tls, etcd.auth);
    match command {
        Command::Services(output) => {
            let services = admin.services().await.map_err(failed)?;
            output.show(&services, || show::services(&services, admin.redis()))
        }
        Command::Status(named) => {
            let status = service(&admin, &named.name)
                .await?
                .status()
                .await
                .map_err(failed)?;
            named.output.show(&status, || show::status(&status))
        }
        Command::Dead { command } => dead(&admin, command).await,
        Command::Delayed {
            command: Delayed::List { named, limit },
        } => {
            let delayed = service(&admin, &named.name).await?.delayed(limit).await;
            let delayed = delayed.map_err(failed)?;
            named.output.show(&delayed, || show::delayed(&delayed))
        }
        Command::Periodic {
            command: Periodic::List(named),
        } => {
            let jobs = service(&admin, &named.name)
                .await?
                .periodic()
                .await
                .map_err(failed)?;
            named.output.show(&jobs, || show::periodic(&jobs))
        }
        Command::Enqueue(enqueue) => {
            let task = task(&enqueue.task)?;
            let mut options = Options::new();
            if let Some(key) = enqueue.key {
                options = options.key(key);
            }
            if let Some(delay) = enqueue.delay {
                options = options.delay(delay);
            }
            if let Some(key) = enqueue.idempotency_key {
                options = options.idempotency_key(key);
            }
            for (name, value) in enqueue.headers {
                options = options.header(name, value);
            }
            let service = service(&admin, &enqueue.name).await?;
            let id = service.enqueue_json(&task, options).await.map_err(failed)?;
            Ok(format!("{id}\n"))
        }
        Command::Pause { named, by } => {
            let service = service(&admin, &named.name).await?;
            let by = by.unwrap_or_else(user_at_host);
            let pause = service.pause(&by).await.map_err(failed)?;
            let paused = Paused {
                name: service.name(),
                paused: &pause,
            };
            named.output.show(&paused, || show::paused(&paused))
        }
        Command::Dashboard { listen, read_only } => dashboard(admin, listen, read_only).await,
        Command::Exporter {
            listen,
            services,
            rescan,
        } => exporter::serve(admin, listen, &services, rescan).await,
        Command::Migrate(_) | Command::Ids { .. } => {
            unreachable!("`main` runs it without a Redis")
        }
        Command::Task { command } => task::task(&admin, command).await,
        Command::Batch { command } => batch::batch(&admin, command).await,
        Command::Tracking { command } => task::tracking(&admin, command).await,
        Command::Limit { command } => limit::limit(&admin, command).await,
        Command::Reshard { named, partitions } => reshard::reshard(&admin, named, partitions).await,
        Command::Resume(named) => {
            let service = service(&admin, &named.name).await?;
            let resumed = Resumed {
                name: service.name(),
                resumed: service.resume().await.map_err(failed)?,
            };
            named.output.show(&resumed, || show::resumed(&resumed))
        }
    }
}

/// `peerq dead …`.
async fn dead(admin: &Admin, command: Dead) -> Result<String, String> {
    match command {
        Dead::List {
            named,
            reason,
            order,
            limit,
            after,
        } => {
            let dead = service(admin, &named.name).await?.dead_letters();
            let mut query = Query::new(limit).order(match order {
                OrderArg::Newest => Order::NewestFirst,
                OrderArg::Oldest => Order::OldestFirst,
            });
            if let Some(reason) = reason {
                query = query.reason(reason);
            }
            if let Some(after) = after {
                query = query.after(after.parse::<Cursor>().map_err(failed)?);
            }
            let page = dead.page(&query).await.map_err(failed)?;
            named.output.show(&page, || show::dead_page(&page))
        }
        Dead::Show { named, id } => {
            let service = service(admin, &named.name).await?;
            let letter = letter(&service, &id).await?;
            named.output.show(&letter, || show::dead_letter(&letter))
        }
        Dead::Replay(which) => act(service(admin, &which.named.name).await?, which, true).await,
        Dead::Purge(which) => act(service(admin, &which.named.name).await?, which, false).await,
    }
}

/// `dead replay` (`replay`) or `dead purge`.
async fn act(service: Service, which: Which, replay: bool) -> Result<String, String> {
    let dead = service.dead_letters();
    let count = match (&which.letters.id, which.reason.as_deref()) {
        (Some(id), _) => {
            let letter = letter(&service, id).await?;
            let done = match replay {
                true => dead.replay(&letter).await,
                false => dead.purge(&letter).await,
            };
            u64::from(done.map_err(failed)?)
        }
        (None, reason) => match (replay, reason) {
            (true, reason) => dead.replay_all(reason).await,
            (false, Some(reason)) => dead.purge_reason(reason).await,
            (false, None) => dead.purge_all().await,
        }
        .map_err(failed)?,
    };
    let acted = Acted {
        name: service.name(),
        replayed: replay.then_some(count),
        purged: (!replay).then_some(count),
    };
    which.named.output.show(&acted, || show::acted(&acted))
}

/// Service `name` of `admin`'s Redis.
pub(crate) async fn service(admin: &Admin, name: &str) -> Result<Service, String> {
    admin.service(name).await.map_err(failed)
}

/// The dead letter `id` names: `<partition>/<id>`, or an id found in
/// exactly one partition.
async fn letter(service: &Service, id: &str) -> Result<DeadLetter, String> {
    let dead = service.dead_letters();
    let not_found = || format!("no dead letter `{id}` in service `{}`", service.name());
    if id.contains('/') {
        let cursor: Cursor = id.parse().map_err(failed)?;
        return dead
            .get(&cursor)
            .await
            .map_err(failed)?
            .ok_or_else(not_found);
    }
    let mut found = dead.find(id).await.map_err(failed)?;
    match found.len() {
        0 => Err(not_found()),
        1 => Ok(found.remove(0)),
        _ => {
            let refs: Vec<String> = found.iter().map(|l| l.cursor().to_string()).collect();
            Err(format!(
                "dead letter id `{id}` is in {} partitions; use one of {}",
                refs.len(),
                refs.join(", ")
            ))
        }
    }
}

/// The task of `enqueue --json`: the text, or stdin for `-`.
fn task(text: &str) -> Result<serde_json::Value, String> {
    let text = match text {
        "-" => {
            let mut read = String::new();
            std::io::stdin()
                .read_to_string(&mut read)
                .map_err(|e| format!("reading the task from stdin: {e}"))?;
            read
        }
        text => text.to_owned(),
    };
    serde_json::from_str(&text).map_err(|e| format!("--json: the task is not JSON ({e})"))
}

/// The default `pause --by`: `user@host`.
fn user_at_host() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{user}@{host}")
}

/// The message of a failed library call, with what to do where the
/// library cannot say it.
pub(crate) fn failed(e: peerq::Error) -> String {
    match e {
        peerq::Error::UnknownService { .. } => {
            format!("{e}; `peerq services` lists the services there")
        }
        e => e.to_string(),
    }
}

impl Output {
    /// `value` as JSON with `--json`, else as `table` writes it.
    fn show<T: Serialize>(
        &self,
        value: &T,
        table: impl FnOnce() -> String,
    ) -> Result<String, String> {
        if self.json {
            let json = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
            return Ok(json + "\n");
        }
        Ok(table())
    }
}

/// `pause`'s answer. JSON: `name`, `paused` (`at_ms`, `by`).
#[derive(Serialize)]
struct Paused<'a> {
    name: &'a str,
    paused: &'a peerq::Pause,
}

/// `resume`'s answer. JSON: `name`, `resumed` (false: it was not paused).
#[derive(Serialize)]
struct Resumed<'a> {
    name: &'a str,
    resumed: bool,
}

/// `dead replay` / `dead purge`'s answer. JSON: `name` and `replayed` or
/// `purged` (how many letters).
#[derive(Serialize)]
struct Acted<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    replayed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    purged: Option<u64>,
}
